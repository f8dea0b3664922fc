#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The failover stall (issue 17's goal: at most 1 s): the longest time a
# reader waits across a kill -9 of ferryd and across `ferry daemon
# upgrade`. tests/e2e/daemon_failover.sh is the harness: per mount (FUSE,
# fanotify) 16 cold readers through a registry whose blob requests the
# fault proxy delays, and a probe that re-reads one cached file with its
# pages dropped every 5 ms and reports the longest gap between two reads
# (one kill -9 with 0.3 s blob delay, 10 upgrades in a row with 0.1 s).
# Runs it ROUNDS times; prints, per switch and mount, every round's stall,
# the median and the worst.
#
#   bench/failover.sh [ROUNDS]      (BIN, BUILD as for tests/run.sh)
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
rounds=${1:-3}
export BIN=${BIN:-bin} BUILD=${BUILD:-build}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for r in $(seq "$rounds"); do
	echo "bench: failover round $r of $rounds" >&2
	if ! "$top/tests/run.sh" daemon_failover >"$out.log" 2>&1; then
		echo "bench: daemon_failover failed in round $r:" >&2
		grep -E "not ok|^    " "$out.log" | head -n 20 >&2
		rm -f "$out.log"
		exit 1
	fi
	# "# stall: kill -9, fuse.ferry: longest wait 95 ms over 2776 reads"
	# (the mount may read "erofs, cold cache": the switch has no comma)
	sed -n 's/^# stall: \([^,]*\), \([a-z., ]*\): longest wait \([0-9]*\) ms.*/\1|\2|\3/p' "$out.log" >>"$out"
	rm -f "$out.log"
done
echo "## failover stall: $rounds rounds, $(nproc) CPUs"
echo
/usr/bin/python3 - "$out" <<'PY'
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    switch, fs, ms = line.strip().split("|")
    rows[(switch, fs)].append(int(ms))
print("| switch | mount | stall per round (ms) | median (ms) | worst (ms) | goal <= 1000 ms |")
print("|---|---|---|---|---|---|")
for (switch, fs), v in rows.items():
    print("| %s | %s | %s | %d | %d | %s |" % (switch, fs, ", ".join(map(str, v)),
          statistics.median(v), max(v), "met" if max(v) <= 1000 else "not met"))
PY
