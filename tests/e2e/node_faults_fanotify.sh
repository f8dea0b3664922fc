#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The node fault matrix (issue 44), fanotify mounts: every cell of
# tests/e2e/node_lib.sh (the list, the four assertions of every cell and
# the bounds are there and in docs/TESTING.md).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/oci_lib.sh"
. "$(dirname "$0")/registry_lib.sh"
. "$(dirname "$0")/lazy_lib.sh"
. "$(dirname "$0")/node_lib.sh"

node_matrix fanotify

e2e_done
