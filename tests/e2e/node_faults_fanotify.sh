#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The node fault matrix (issue 44), fanotify mounts: every cell of
# tests/lib/node.sh (the list, the four assertions of every cell and
# the bounds are there and in docs/TESTING.md).
. "$(dirname "$0")/../lib/common.sh"
. "$(dirname "$0")/../lib/oci.sh"
. "$(dirname "$0")/../lib/registry.sh"
. "$(dirname "$0")/../lib/lazy.sh"
. "$(dirname "$0")/../lib/node.sh"

node_matrix fanotify

e2e_done
