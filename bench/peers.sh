#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Cold start under containerd, ferry against stargz-snapshotter (issue 48;
# `make bench`, docs/performance-log.md): `ctr run` of a one-layer Debian
# image with python3-numpy (bench/lib.sh's "numpy" set) until
# `python3 -c 'import numpy'` exits 0, from an image containerd does not
# have yet. Variants, interleaved in every round and link:
#   overlayfs         ctr image pull (pull + unpack of the gzip image), ctr run
#   estargz           ctr-remote image convert --estargz --oci, then
#                     ctr-remote image rpull + ctr run, containerd-stargz-grpc
#   estargz-opt       ctr-remote image optimize --oci with the workload
#   ferry-fuse, ferry-fanotify
#                     ferry convert; a lazy pull as CRI does it
#                     (tests/tools/cripull) + ctr run, ferry-snapshotter
#   ferry-list-fuse, ferry-list-fanotify
#                     ferry convert --prefetch-files with the list that
#                     `ferry mount --record` of the workload wrote
# Every run starts with a fresh snapshotter (empty root and cache, a new
# ferryd), the image and its content removed from containerd (ctr image rm
# --sync) and bench/prepare.sh (page cache dropped). All registry traffic
# goes through tests/tools/wanproxy.py, one proxy per link: "loopback"
# (no delay) and "wan" (10 ms each way, 200 Mbit/s); its counters give the
# bytes sent to the client and the requests of each run up to the moment
# the workload exited (stargz's background fetch goes on after it).
# containerd-stargz-grpc is built by bench/stargz-grpc.sh (see there).
#
#   bench/peers.sh [ROUNDS]        (default $FERRY_BENCH_RUNS, else 5)
#
# Prints a markdown table: median times per link, bytes and requests, the
# conversion times, and the median of the per-round ratios to estargz-opt.
# Env: FERRY_PEERS_LINKS ("NAME:DELAY_MS:MBIT ...", default
# "loopback:0:0 wan:10:200"), FERRY_PEERS_RESULTS (a copy of the raw rows).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/bench/lib.sh"
. "$top/tests/lib/containerd.sh"
runs=${1:-$runs}
links=${FERRY_PEERS_LINKS:-loopback:0:0 wan:10:200}
variants="overlayfs estargz estargz-opt ferry-fuse ferry-fanotify ferry-list-fuse ferry-list-fanotify"
wl=(/usr/bin/python3 -c 'import numpy')

stargz=$("$top/bench/stargz-grpc.sh")
dataset numpy
bench_workdir peers
ctd=$work/ctd ns=ferry-peers fd_sock=$work/ferryd.sock
ctd_pid="" sn_pid="" sz_pid="" wp_pids=()
mkdir -p "$ctd"

ctr_() { ctr --address "$ctd/containerd.sock" -n "$ns" "$@" </dev/null; }
# ctr-remote's conversions log every step to stderr: kept for a failure only.
ctrr() {
	ctr-remote --address "$ctd/containerd.sock" -n "$ns" "$@" </dev/null >/dev/null \
		2>>"$ctd/ctr-remote.log" || { tail -20 "$ctd/ctr-remote.log" >&2; return 1; }
}
stop_ferry() {
	ctd_stop "$sn_pid"
	sn_pid=
	[ -S "$fd_sock" ] && ctd_stop "$(ferryd_pid "$fd_sock")"
	rm -f "$fd_sock"
}
# SIGINT: containerd-stargz-grpc unmounts its layers and cleans up on it only
# (10 s for that, then ctd_stop's SIGTERM and SIGKILL).
stop_stargz() {
	[ -n "$sz_pid" ] || return 0
	kill -INT "$sz_pid" 2>/dev/null || true
	for _ in $(seq 100); do
		kill -0 "$sz_pid" 2>/dev/null || break
		sleep 0.1
	done
	ctd_stop "$sz_pid"
	sz_pid=
}
cleanup() {
	local p
	ctd_stop "$ctd_pid"
	stop_ferry
	stop_stargz
	for p in "${wp_pids[@]}"; do ctd_stop "$p"; done
	ctd_clean_run "$ns"
	bench_cleanup
}
trap cleanup EXIT

# A snapshotter answers containerd once a snapshot can be prepared through it
# (listing snapshots is answered from containerd's own records).
reachable() { # SNAPSHOTTER
	local i
	for i in $(seq 60); do
		if ctr_ snapshots --snapshotter "$1" prepare peers-probe >/dev/null 2>&1; then
			ctr_ snapshots --snapshotter "$1" rm peers-probe
			return
		fi
		sleep 0.5
	done
	echo "peers.sh: snapshotter $1 does not answer containerd; see $ctd/*.log" >&2
	return 1
}
start_ferry() { # MODE: ferry-snapshotter and ferryd with empty state
	rm -rf "$work/cache" "$ctd/snapshotter" "$ctd/snapshotter.sock"
	ctd_configs "$ctd" "$ctd/snapshotter" "$fd_sock" "$work/cache" "$1" "\"pullers\": {\"$ns\": \"cri\"}"
	"$work/ferry-snapshotter" -config "$ctd/snapshotter.json" >>"$ctd/snapshotter.log" 2>&1 &
	sn_pid=$!
	ctd_wait_sock "$ctd/snapshotter.sock" "$sn_pid" 30
	"$BIN/ferryd" --socket "$fd_sock" --persistent
	[ -z "$ctd_pid" ] || reachable ferry
}
start_stargz() { # containerd-stargz-grpc with an empty root (its caches)
	rm -rf "$ctd/stargz" "$ctd/stargz.sock"
	"$stargz" -address "$ctd/stargz.sock" -root "$ctd/stargz" -config "$ctd/stargz.toml" \
		>>"$ctd/stargz.log" 2>&1 &
	sz_pid=$!
	ctd_wait_sock "$ctd/stargz.sock" "$sz_pid" 30
	reachable stargz
}

# Images: the gzip source and ferry's conversions (bench_image), the
# recorded list, and stargz's two conversions made by ctr-remote.
bench_image numpy
"$top/contrib/containerd/go.sh" build -o "$work/ferry-snapshotter"
"$top/contrib/containerd/go.sh" --pkg tests/tools/cripull build -o "$work/cripull"
mkdir -p "$work/mnt-record"
"$ferry" mount --record "$work/prefetch.list" --socket "$work/record.sock" \
	--cache-dir "$work/cache-record" "$image" "$work/mnt-record"
chroot "$work/mnt-record" "${wl[@]}"
"$ferry" umount --socket "$work/record.sock" "$work/mnt-record"
ctd_stop "$(ferryd_pid "$work/record.sock")"
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
t0=$(now)
"$ferry" convert -q "docker://$reg/src/numpy:1" "docker://$reg/ferry/numpy:plain"
t1=$(now)
"$ferry" convert -q --prefetch-files "$work/prefetch.list" \
	"docker://$reg/src/numpy:1" "docker://$reg/ferry/numpy:list"
t2=$(now)
conv_ferry=$(secs "$t0" "$t1") conv_list=$(secs "$t1" "$t2")
echo "bench: recorded prefetch list: $(wc -l <"$work/prefetch.list") files" >&2

# containerd's own configuration: ctd_configs' (which start_ferry rewrites
# for each mode) and stargz's socket.
ctd_configs "$ctd" "$ctd/snapshotter" "$fd_sock" "$work/cache" fuse
{ cat "$ctd/config.toml"; cat <<TOML; } >"$ctd/containerd.toml"
[proxy_plugins.stargz]
  type = "snapshot"
  address = "$ctd/stargz.sock"
TOML
: >"$ctd/stargz.toml" # upstream's defaults: prefetch, background fetch, memory metadata
containerd --config "$ctd/containerd.toml" >"$ctd/containerd.log" 2>&1 &
ctd_pid=$!
ctd_wait_sock "$ctd/containerd.sock" "$ctd_pid" 30
start_stargz
src=$reg/src/numpy:1
ctr_ images pull --plain-http "$src" >/dev/null
t0=$(now)
ctrr image convert --estargz --oci "$src" "$reg/stargz/numpy:plain"
t1=$(now)
ctrr image optimize --oci --entrypoint '["/usr/bin/python3"]' --args '["-c", "import numpy"]' \
	"$src" "$reg/stargz/numpy:opt"
t2=$(now)
conv_esgz=$(secs "$t0" "$t1") conv_opt=$(secs "$t1" "$t2")
for tag in plain opt; do
	ctr_ images push --plain-http "$reg/stargz/numpy:$tag" >/dev/null
done
for i in "$src" "$reg/stargz/numpy:plain" "$reg/stargz/numpy:opt"; do
	ctr_ images rm --sync "$i" >/dev/null
done
stop_stargz

# wanproxy per link: NAME → $work/wp-NAME.{port,stats}
for link in $links; do
	IFS=: read -r name delay rate <<<"$link"
	bench_wanproxy "$name" "$delay" "$rate"
done

run() { # LINK VARIANT: one cold start, a line into $work/results
	local link=$1 v=$2 host snap img t0 t1 fail=0
	host=127.0.0.1:$(cat "$work/wp-$link.port")
	case $v in
	overlayfs) snap=overlayfs img=$host/src/numpy:1 ;;
	estargz) snap=stargz img=$host/stargz/numpy:plain; start_stargz ;;
	estargz-opt) snap=stargz img=$host/stargz/numpy:opt; start_stargz ;;
	ferry-fuse | ferry-fanotify) snap=ferry img=$host/ferry/numpy:plain; start_ferry "${v#ferry-}" ;;
	ferry-list-*) snap=ferry img=$host/ferry/numpy:list; start_ferry "${v#ferry-list-}" ;;
	esac
	"$top/bench/prepare.sh"
	wstat "$link" --reset requests >/dev/null
	t0=$(now)
	case $snap in
	overlayfs) ctr_ images pull --plain-http --snapshotter overlayfs "$img" >/dev/null ;;
	stargz) ctrr image rpull --plain-http --snapshotter stargz "$img" ;;
	ferry) "$work/cripull" -address "$ctd/containerd.sock" -namespace "$ns" \
		-snapshotter ferry -plain-http "$img" >/dev/null ;;
	esac
	ctr_ run --rm --snapshotter "$snap" "$img" peers-run "${wl[@]}" || fail=1
	t1=$(now)
	echo "$link $v $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }') $(wstat "$link" bytes_down) $(wstat "$link" requests)" >>"$work/results"
	ctr_ images rm --sync "$img" >/dev/null
	case $snap in
	stargz) stop_stargz ;;
	ferry) stop_ferry ;;
	esac
	[ "$fail" = 0 ] || { echo "peers.sh: $v on $link: the workload failed; see $ctd/*.log" >&2; return 1; }
}

start=$(now)
: >"$work/results"
for _ in $(seq "$runs"); do
	for link in $links; do
		for v in $variants; do
			run "${link%%:*}" "$v"
		done
	done
done
round=$(awk -v a="$start" -v b="$(now)" -v n="$runs" 'BEGIN { printf "%.0f", (b - a) / n }')
cp "$work/results" "${FERRY_PEERS_RESULTS:-/dev/null}"

echo "## containerd cold start against stargz-snapshotter: numpy ($(stat -c %s "$data/numpy.tar.gz") bytes tar.gz), rounds: $runs ($round s each), $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg) at the end"
echo
python3 - "$work/results" "$conv_esgz" "$conv_opt" "$conv_ferry" "$conv_list" <<'PY'
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    link, what, t, b, req = line.split()
    rows[(link, what)].append((float(t), int(b), int(req)))
links = list(dict.fromkeys(k[0] for k in rows))
conv = {"estargz": sys.argv[2] + " s", "estargz-opt": sys.argv[3] + " s + the workload run",
        "ferry-fuse": sys.argv[4] + " s", "ferry-fanotify": sys.argv[4] + " s",
        "ferry-list-fuse": sys.argv[5] + " s + a recorded run",
        "ferry-list-fanotify": sys.argv[5] + " s + a recorded run"}
print("`ctr run` until `python3 -c 'import numpy'` exits; medians; bytes and requests from the proxy, per run; x opt: median of the per-round ratios to estargz-opt")
print()
print("| variant | " + " | ".join("%s s | x opt | MB / requests" % l for l in links) + " | conversion |")
print("|---|" + "---|---|---|" * len(links) + "---|")
for what in dict.fromkeys(k[1] for k in rows):
    cells = []
    for link in links:
        r, o = rows[(link, what)], rows[(link, "estargz-opt")]
        ratio = statistics.median(a[0] / b[0] for a, b in zip(r, o))
        cells.append("%.2f | %.2f | %.1f / %d" % (statistics.median(x[0] for x in r), ratio,
                     statistics.median(x[1] for x in r) / 1e6, statistics.median(x[2] for x in r)))
    print("| %s | %s | %s |" % (what, " | ".join(cells), conv.get(what, "-")))
PY
