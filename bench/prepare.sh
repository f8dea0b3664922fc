#!/bin/sh
# SPDX-License-Identifier: MIT
# Before every measured run of bench/lazy.sh: drop the page cache, then
# touch and free $FERRY_BENCH_PREFAULT_MB MiB (default 2048) of memory.
#
# Why the second step: the project VM reports freed memory to its host
# (virtio-balloon free page reporting, /sys/module/page_reporting), and a
# page touched again after being reported costs a host fault. Without it a
# run's time depended on how much memory the runs before it had freed: a
# kernel-mount sequential read of the "big" tree took 0.55 s after another
# such read, 1.2 s after a FUSE one (which fills twice the page cache) and
# 1.7 s after a 5 s pause. Touching the memory first gives every run
# host-backed free pages, whatever ran before.
set -e
sync
echo 3 >/proc/sys/vm/drop_caches
python3 -c '
import mmap, sys
n = int(sys.argv[1])
m = mmap.mmap(-1, n << 20)
z = bytes(1 << 20)
for _ in range(n):
    m.write(z)' "${FERRY_BENCH_PREFAULT_MB:-2048}"
