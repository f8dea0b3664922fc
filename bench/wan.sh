#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Cold start across a slow network: two builds of ferry (OLD_BIN, NEW_BIN)
# and a full pull, all through tests/tools/wanproxy.py in front of one
# docker-registry on 127.0.0.1, interleaved in each round so that the
# machine's background load hits them alike.
#
#   bench/wan.sh [OLD_BIN] NEW_BIN [ROUNDS]
#
# (With one build, `make bench`, only NEW_BIN runs.)
# Links: $FERRY_WAN_LINKS, "DELAY_MS:MBIT ..." with DELAY_MS one way
# (default "0:0 10:200 25:100": loopback through the proxy, 20 ms RTT at
# 200 Mbit/s, 50 ms RTT at 100 Mbit/s). The image is bench/lib.sh's "big"
# (FERRY_LAZY_SET), one gzip layer in the registry, converted by NEW_BIN's
# ferry. Per build and mode (fuse, fanotify), on a fresh cache and ferryd:
# from `ferry mount` to the end of the workload = the startup workload
# (read os-release, find /usr, chroot sh -c true and env true), then a
# Python import. Issue 21's rows import large standard packages (asyncio,
# email, unittest, http, xml, sqlite3, ctypes, multiprocessing...); issue
# 17's import json, email and http.client, without a prefetch list ("-py")
# and with one ("-list": a second conversion of the same image whose list
# NEW_BIN recorded, `ferry mount --record` of that workload on loopback,
# then `ferry convert --prefetch-files`). The full pull is skopeo copy +
# umoci unpack through the same proxy, then issue 17's workload ("pull-py")
# and then issue 21's ("pull": the unpack's time plus its own). Reports
# medians of time, requests (the proxy's count), ferry's bytes fetched and
# read, and for NEW the requests made by fetch-ahead (off the readers' path:
# fetchesAhead). "new-fanotify-native": the same image converted by NEW_BIN
# to native EROFS layers (--format erofs-layers), fanotify mode, issue 21's
# workload. "new-MODE-index": the source image itself, unconverted, through
# the ferry index NEW_BIN attached to it (issue 45), issue 21's workload;
# "old-MODE-index" the same through OLD_BIN (an A/B of the index's cold
# start in one run).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/bench/lib.sh"
bench_builds 3 "$@"
links=${FERRY_WAN_LINKS:-0:0 10:200 25:100}
set_name=${FERRY_LAZY_SET:-big}
ferry=$new/ferry
dataset "$set_name"
gz=$data/$set_name.tar.gz
bench_workdir wan
wp_pid=
trap '[ -z "$wp_pid" ] || kill "$wp_pid" 2>/dev/null; bench_cleanup' EXIT
now() { date +%s.%N; }
bench_image "$set_name"
# Each build serves what its own `ferry convert` makes of the image (builds
# before the loader dependencies section, FORMAT.md 2.6, refuse it).
[ -z "$old" ] || "$old/ferry" convert -q "docker://$reg/src/$set_name:1" \
	"docker://$reg/ferry/$set_name:old"

PYIMPORT21='import asyncio, email.mime.multipart, http.client, json, xml.etree.ElementTree, decimal, unittest, urllib.request, logging.handlers, multiprocessing, concurrent.futures, sqlite3, ctypes'
PYIMPORT17='import json, email, http.client'
workload() { # ROOT 17|21
	local py=$PYIMPORT21
	[ "$2" = 17 ] && py=$PYIMPORT17
	cat "$1/etc/os-release" >/dev/null
	find "$1/usr" >/dev/null
	chroot "$1" /bin/sh -c true
	chroot "$1" /usr/bin/env true
	chroot "$1" /usr/bin/python3 -c "$py"
}
wstat() { # KEY, or reset: a counter of the WAN proxy (reset zeroes them)
	if [ "$1" = reset ]; then
		python3 "$top/tests/tools/wanproxy.py" --query "$wstats" --reset requests
	else
		python3 "$top/tests/tools/wanproxy.py" --query "$wstats" "$1"
	fi
}
mstat() { # BIN SOCK KEY: a statistic of the one mount (0 when the build lacks it)
	"$1/ferry" mount --list --json --socket "$2" | python3 -c '
import json, sys
print(sum(x.get(sys.argv[1], 0) for x in json.load(sys.stdin)["mounts"]))' "$3"
}
cold() { # LINK BUILD BIN MODE [WORKLOAD [TAG]]: one cold start, a line into $work/results
	local link=$1 b=$2 bin=$3 mode=$4 wl=${5:-21} tag=${6:-1} sock=$work/$2-$4.sock cache=$work/cache-$2-$4
	local mnt=$work/mnt-$2-$4 t0 t1 what=$2-$4 ref=ferry/$set_name:$tag
	[ "$tag" = 1 ] || what=$what-$tag
	[ "$b" != old ] || [ "$tag" != 1 ] || ref=ferry/$set_name:old
	# "index": the source image itself, through its ferry index (issue 45).
	[ "$tag" != index ] || ref=src/$set_name:1
	[ "$wl" = 21 ] || [ "$tag" != 1 ] || what=$what-py
	rm -rf "$cache"
	mkdir -p "$mnt"
	"$top/bench/prepare.sh"
	wstat reset >/dev/null
	t0=$(now)
	"$bin/ferry" mount --mode "$mode" --socket "$sock" --cache-dir "$cache" \
		"docker://$wan/$ref" "$mnt"
	workload "$mnt" "$wl"
	t1=$(now)
	echo "$link $what $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }') $(wstat requests) $(mstat "$bin" "$sock" bytesFetched) $(mstat "$bin" "$sock" bytesRead) $(mstat "$bin" "$sock" fetchesAhead) $(wstat max_inflight)" >>"$work/results"
	"$bin/ferry" umount --socket "$sock" "$mnt"
	ferryd_stop "$sock" "$bin/ferry"
}
pull() { # LINK: the unpack, then issue 17's workload, then issue 21's
	local t0 t1 t2 t3 tail
	rm -rf "$work/pull" "$work/bundle"
	"$top/bench/prepare.sh"
	wstat reset >/dev/null
	t0=$(now)
	skopeo copy --quiet --src-tls-verify=false "docker://$wan/src/$set_name:1" "oci:$work/pull:1"
	umoci unpack --image "$work/pull:1" "$work/bundle" >/dev/null
	t1=$(now)
	workload "$work/bundle/rootfs" 17
	t2=$(now)
	workload "$work/bundle/rootfs" 21
	t3=$(now)
	tail="$(wstat requests) $(stat -c %s "$gz") 0 0 $(wstat max_inflight)"
	echo "$1 pull-py $(awk -v a="$t0" -v b="$t1" -v c="$t2" 'BEGIN { printf "%.3f", c - a }') $tail" >>"$work/results"
	echo "$1 pull $(awk -v a="$t0" -v b="$t1" -v c="$t2" -v d="$t3" 'BEGIN { printf "%.3f", b - a + d - c }') $tail" >>"$work/results"
}

# The recorded prefetch list: the workload once through a --record mount.
record_list() {
	local mnt=$work/mnt-record sock=$work/record.sock
	mkdir -p "$mnt"
	"$ferry" mount --record "$work/prefetch.list" --socket "$sock" \
		--cache-dir "$work/cache-record" "$image" "$mnt"
	workload "$mnt" 17
	"$ferry" umount --socket "$sock" "$mnt"
	ferryd_stop "$sock"
	"$ferry" convert -q --prefetch-files "$work/prefetch.list" \
		"docker://$reg/src/$set_name:1" "docker://$reg/ferry/$set_name:list"
	echo "bench: recorded prefetch list: $(wc -l <"$work/prefetch.list") files" >&2
}
record_list
# Native EROFS layers (FORMAT.md 1c, 1d), served lazily in fanotify mode.
"$ferry" convert -q --format erofs-layers "docker://$reg/src/$set_name:1" \
	"docker://$reg/ferry/$set_name:native"
# The source image itself, lazily through a ferry index (FORMAT.md 1e).
"$ferry" index -q "docker://$reg/src/$set_name:1"

: >"$work/results"
for link in $links; do
	python3 "$top/tests/tools/wanproxy.py" --upstream "$reg" --port-file "$work/wp.port" \
		--stats-port-file "$work/wp.stats" --delay-ms "${link%%:*}" --rate-mbit "${link##*:}" &
	wp_pid=$!
	for _ in $(seq 50); do [ -s "$work/wp.port" ] && break; sleep 0.1; done
	wan=127.0.0.1:$(cat "$work/wp.port")
	wstats=$(cat "$work/wp.stats")
	for r in $(seq "$rounds"); do
		for mode in fuse fanotify; do
			[ -z "$old" ] || cold "$link" old "$old" "$mode"
			cold "$link" new "$new" "$mode"
			cold "$link" new "$new" "$mode" 17
			cold "$link" new "$new" "$mode" 17 list
			cold "$link" new "$new" "$mode" 21 index
			[ -z "$old" ] || cold "$link" old "$old" "$mode" 21 index
		done
		cold "$link" new "$new" fanotify 21 native
		pull "$link"
	done
	kill "$wp_pid"
	wait "$wp_pid" 2>/dev/null || true
	wp_pid=
	rm -f "$work/wp.port" "$work/wp.stats"
done
cp "$work/results" "${FERRY_WAN_RESULTS:-/dev/null}"

echo "## cold start through wanproxy.py: $set_name, old $old, new $new, $rounds rounds, $(nproc) CPUs"
echo
python3 - "$work/results" <<'PY'
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    link, what, *v = line.split()
    rows[(link, what)].append([float(x) for x in v])
def med(link, what, col):
    return statistics.median(r[col] for r in rows[(link, what)])
links = list(dict.fromkeys(k[0] for k in rows))
print("| link (one-way delay ms : Mbit/s) | run | workload done (s) | x full pull | requests | fetch-ahead requests | critical-path requests | bytes fetched | bytes read | fetched/read | most requests in flight |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
def table(runs, pull_what):
    for link in links:
        pull = med(link, pull_what, 0)
        for what in runs:
            if (link, what) not in rows:
                continue
            t, req, fetched, read, ahead, infl = (med(link, what, c) for c in range(6))
            ratio = "%.2f" % (fetched / read) if read else "-"
            print("| %s | %s | %.2f | %.3f | %d | %d | %d | %d | %s | %s | %d |" % (
                link, what, t, t / pull, req, ahead, req - ahead, fetched,
                "%d" % read if read else "-", ratio, infl))
table(("old-fuse", "new-fuse", "old-fuse-index", "new-fuse-index", "old-fanotify",
       "new-fanotify", "old-fanotify-index", "new-fanotify-index",
       "new-fanotify-native", "pull"), "pull")
print()
print("Issue 45: the source image through its ferry index (-index) against its conversion")
print()
print("| link | build | mode | index / converted (workload time) | index / full pull |")
print("|---|---|---|---|---|")
for link in links:
    for b in ("old", "new"):
        for mode in ("fuse", "fanotify"):
            if (link, "%s-%s-index" % (b, mode)) in rows:
                t = med(link, "%s-%s-index" % (b, mode), 0)
                print("| %s | %s | %s | %.2f | %.3f |" % (
                    link, b, mode, t / med(link, "%s-%s" % (b, mode), 0),
                    t / med(link, "pull", 0)))
print()
print("Issue 17: startup workload + python3 -c 'import json, email, http.client', without and with the recorded list")
print()
print("| link | run | workload done (s) | x full pull | requests | fetch-ahead requests | critical-path requests | bytes fetched | bytes read | fetched/read | most requests in flight |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
table(("new-fuse-py", "new-fuse-list", "new-fanotify-py", "new-fanotify-list", "pull-py"), "pull-py")
PY
