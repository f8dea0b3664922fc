#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The node fault matrix (issue 44), FUSE mounts: every cell of
# tests/e2e/node_lib.sh (the list, the four assertions of every cell and
# the bounds are there and in docs/TESTING.md).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/oci_lib.sh"
. "$(dirname "$0")/registry_lib.sh"
. "$(dirname "$0")/lazy_lib.sh"
. "$(dirname "$0")/node_lib.sh"

node_setup
cell_cache_full_tmpfs
cell_cache_full_ext4 fuse
cell_cache_eio fuse
cell_registry_mount fuse
cell_registry_read fuse
cell_registry_successor fuse
cell_big_chunks
for order in ferryd keeper ferryd-keeper keeper-ferryd together; do
	cell_kill fuse "$order"
done

e2e_done
