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
mode=${FERRY_FERRYD_MODE:-fuse}
bench_workdir containerd
ctd=$work/ctd
ns=ferry-bench
ctd_pid= sn_pid= fd_sock=$work/ferryd.sock had_run=0
[ -d /run/containerd ] && had_run=1
mkdir -p "$ctd"

ctr_() { ctr --address "$ctd/containerd.sock" -n "$ns" "$@" </dev/null; }
wait_sock() { # SOCKET PID
	for _ in $(seq 300); do
		[ -S "$1" ] && return 0
		kill -0 "$2" 2>/dev/null || return 1
		sleep 0.1
	done
	return 1
}
stop_pid() {
	[ -n "$1" ] || return 0
	kill -TERM "$1" 2>/dev/null || return 0
	for _ in $(seq 100); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done
	kill -KILL "$1" 2>/dev/null || true
}
ferryd_pid() { "$ferry" mount --list --json --socket "$fd_sock" | python3 -c 'import json,sys; print(json.load(sys.stdin)["pid"])'; }
cleanup() {
	stop_pid "$ctd_pid"
	stop_pid "$sn_pid"
	[ -S "$fd_sock" ] && stop_pid "$(ferryd_pid)"
	rm -rf "/run/containerd/runc/$ns"
	[ "$had_run" = 1 ] || rmdir /run/containerd/runc /run/containerd/s \
		/run/containerd/fifo /run/containerd 2>/dev/null || true
	bench_cleanup
}
trap cleanup EXIT

dataset big
bench_image big
"$top/contrib/containerd/go.sh" build -o "$work/ferry-snapshotter"
"$top/contrib/containerd/go.sh" --pkg tests/tools/cripull build -o "$work/cripull"

cat >"$ctd/config.toml" <<TOML
version = 2
root = "$ctd/root"
state = "$ctd/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$ctd/containerd.sock"
[ttrpc]
  address = "$ctd/containerd.sock.ttrpc"
[proxy_plugins.ferry]
  type = "snapshot"
  address = "$ctd/snapshotter.sock"
TOML
cat >"$ctd/snapshotter.json" <<JSON
{"address": "$ctd/snapshotter.sock", "root": "$ctd/snapshotter", "ferrydSocket": "$fd_sock",
 "cacheDir": "$work/cache", "mode": "$mode"}
JSON
containerd --config "$ctd/config.toml" >"$ctd/containerd.log" 2>&1 &
ctd_pid=$!
wait_sock "$ctd/containerd.sock" "$ctd_pid"
"$work/ferry-snapshotter" -config "$ctd/snapshotter.json" >"$ctd/snapshotter.log" 2>&1 &
sn_pid=$!
wait_sock "$ctd/snapshotter.sock" "$sn_pid"

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
	stop_pid "$(ferryd_pid)"
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
