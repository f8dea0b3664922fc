#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# containerd cold start (`make bench`, docs/PERFORMANCE.md): `ctr run` of the
# "big" Debian image (python3, perl, gcc) until its command
# (`python3 -c 'print(1)'`) has printed, from an image containerd does not
# have yet:
#   ferry:   a lazy pull as CRI does it (tests/tools/cripull: unpack with
#            the snapshotter "ferry", CRI labels), then ctr run --snapshotter
#            ferry; empty ferry cache, fresh ferryd;
#   overlay: ctr image pull (pull + unpack of the gzip source image from the
#            same loopback registry) with containerd's overlayfs snapshotter,
#            then ctr run.
# The two alternate within each round (interleaved, so load on the machine
# hits both alike); every run starts after bench/prepare.sh and with the
# image and its content removed (ctr image rm --sync). Prints a markdown
# table: median times and the median of the per-round ratios.
#
# Env: FERRY_BENCH_DIR, FERRY_BENCH_RUNS (default 5), FERRY_FERRYD_MODE
# (the snapshotter's mode, default fuse).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/bench/lib.sh"
. "$top/tests/lib/containerd.sh"
mode=${FERRY_FERRYD_MODE:-fuse}
bench_workdir containerd
ctd=$work/ctd
ns=ferry-bench
ctd_pid= sn_pid= fd_sock=$work/ferryd.sock
mkdir -p "$ctd"

ctr_() { ctr --address "$ctd/containerd.sock" -n "$ns" "$@" </dev/null; }
ferryd_pid() { "$ferry" mount --list --json --socket "$fd_sock" | python3 -c 'import json,sys; print(json.load(sys.stdin)["pid"])'; }
cleanup() {
	ctd_stop "$ctd_pid"
	ctd_stop "$sn_pid"
	[ -S "$fd_sock" ] && ctd_stop "$(ferryd_pid)"
	ctd_clean_run "$ns"
	bench_cleanup
}
trap cleanup EXIT

dataset big
bench_image big
"$top/contrib/containerd/go.sh" build -o "$work/ferry-snapshotter"
"$top/contrib/containerd/go.sh" --pkg tests/tools/cripull build -o "$work/cripull"

ctd_configs "$ctd" "$ctd/snapshotter" "$fd_sock" "$work/cache" "$mode" "\"pullers\": {\"$ns\": \"cri\"}"
containerd --config "$ctd/config.toml" >"$ctd/containerd.log" 2>&1 &
ctd_pid=$!
ctd_wait_sock "$ctd/containerd.sock" "$ctd_pid" 30
"$work/ferry-snapshotter" -config "$ctd/snapshotter.json" >"$ctd/snapshotter.log" 2>&1 &
sn_pid=$!
ctd_wait_sock "$ctd/snapshotter.sock" "$sn_pid" 30

src=$reg/src/big:1
fer=${image#docker://}
now() { date +%s.%N; }
run_ferry() {
	rm -rf "$work/cache"
	"$BIN/ferryd" --socket "$fd_sock" --persistent
	"$top/bench/prepare.sh"
	local t0 t1
	t0=$(now)
	"$work/cripull" -address "$ctd/containerd.sock" -namespace "$ns" -snapshotter ferry \
		-plain-http "$fer" >/dev/null
	ctr_ run --rm --snapshotter ferry "$fer" f1 /usr/bin/python3 -c 'print(1)' | grep -qx 1
	t1=$(now)
	ctr_ images rm --sync "$fer" >/dev/null
	ctd_stop "$(ferryd_pid)"
	awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }'
}
run_overlay() {
	"$top/bench/prepare.sh"
	local t0 t1
	t0=$(now)
	ctr_ images pull --plain-http --snapshotter overlayfs "$src" >/dev/null
	ctr_ run --rm --snapshotter overlayfs "$src" o1 /usr/bin/python3 -c 'print(1)' | grep -qx 1
	t1=$(now)
	ctr_ images rm --sync "$src" >/dev/null
	awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }'
}
: >"$work/times"
for i in $(seq "$runs"); do
	echo "$(run_ferry) $(run_overlay)" >>"$work/times"
done
echo "## containerd cold start: big ($(stat -c %s "$data/big.tar.gz") bytes tar.gz), $(nproc) CPUs, ferryd mode $mode"
echo
python3 - "$work/times" "$runs" <<'PY'
import statistics, sys
rows = [tuple(map(float, l.split())) for l in open(sys.argv[1])]
f = [r[0] for r in rows]; o = [r[1] for r in rows]
print("| ctr run until `python3 -c 'print(1)'` prints (median of %s, interleaved) | seconds |" % sys.argv[2])
print("|---|---|")
print("| ferry-snapshotter: lazy pull (CRI labels) + ctr run, cold cache | %.3f |" % statistics.median(f))
print("| overlayfs: ctr image pull (pull + unpack gzip) + ctr run | %.3f |" % statistics.median(o))
print()
print("ratio ferry / overlayfs: median of per-round ratios %.3f (rounds: %s)"
      % (statistics.median(a / b for a, b in rows), " ".join("%.3f" % (a / b) for a, b in rows)))
PY
