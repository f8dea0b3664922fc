#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Fetch what is read (issue 48): how many registry bytes and requests a
# lazy cold start of `python3 -c 'import numpy'` costs, against the bytes
# its reads touch; one or two builds, interleaved. FERRY_FETCHREAD_SET and
# FERRY_FETCHREAD_PY change the image (a bench/lib.sh set) and the Python
# code (e.g. "big" and issue 21's imports, bench/wan.sh's PYIMPORT21). Counts, not times: the
# machine's load does not change them (the times are printed, not ranked).
#
#   bench/fetchread.sh [OLD_BIN] NEW_BIN [ROUNDS]      (default 3 rounds)
#
# The image is bench/lib.sh's "numpy" set (one gzip layer in a
# docker-registry on 127.0.0.1), converted by each build's own ferry with
# its defaults, so that a converter change is part of the A/B
# ($FERRY_FETCHREAD_CONVERT adds options to NEW_BIN's conversion,
# $FERRY_FETCHREAD_FERRYD to its cold starts' ferryd, e.g. "--readahead
# 256"). Touched bytes: NEW_BIN
# mounts it in FUSE mode with the kernel's readahead off (the mount's bdi
# read_ahead_kb 0) and ferryd's directory readahead off, so that every
# page the workload reads or faults in is one FUSE read: their sum
# (bytesRead) is the bytes the workload touches, 4 KiB pages. Cold starts:
# per link of $FERRY_FETCHREAD_LINKS ("DELAY_MS:MBIT ...", one-way delay,
# default "10:200 0:0") through tests/tools/wanproxy.py, per build and
# mode (fuse, fanotify), a fresh ferryd and cache, bench/prepare.sh, then
# `ferry mount` and the workload in a chroot. Per run: the proxy's bytes
# to the client and requests, ferry's fetches and fetchesAhead (the
# readers' own requests, the critical path, are fetches - fetchesAhead).
# Medians per row, and every run's MB / requests / critical path; "x read"
# is registry bytes / touched bytes.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/bench/lib.sh"
bench_builds 3 "$@"
links=${FERRY_FETCHREAD_LINKS:-10:200 0:0}
set_name=${FERRY_FETCHREAD_SET:-numpy}
py=${FERRY_FETCHREAD_PY:-import numpy}
ferry=$new/ferry
dataset "$set_name"
bench_workdir fetchread
wp_pids=()
cleanup() {
	local p
	for p in "${wp_pids[@]}"; do kill "$p" 2>/dev/null || true; done
	bench_cleanup
}
trap cleanup EXIT
bench_image "$set_name"
# shellcheck disable=SC2086 # options, split on purpose
[ -z "${FERRY_FETCHREAD_CONVERT:-}" ] ||
	"$ferry" convert -q $FERRY_FETCHREAD_CONVERT "docker://$reg/src/$set_name:1" "$image"
[ -z "$old" ] ||
	"$old/ferry" convert -q "docker://$reg/src/$set_name:1" "docker://$reg/ferry-old/$set_name:1"

workload() { chroot "$1" /usr/bin/python3 -c "$py"; }
mstat() { # BIN SOCK KEY: a statistic of the one mount
	"$1/ferry" mount --list --json --socket "$2" |
		python3 -c 'import json, sys; print(json.load(sys.stdin)["mounts"][0].get(sys.argv[1], 0))' "$3"
}
# --force: a fanotify mount may still be on ferryd's list for a moment
# after `ferry umount` returned.
stop() { # BIN SOCK MNT
	"$1/ferry" umount --socket "$2" "$3"
	"$1/ferry" daemon stop --force --socket "$2" >/dev/null
}

# The bytes the workload touches.
mkdir -p "$work/mnt-touch"
"$new/ferryd" --socket "$work/touch.sock" --dir-readahead 0
"$ferry" -q mount --mode fuse --socket "$work/touch.sock" --cache-dir "$work/cache-touch" \
	"$image" "$work/mnt-touch"
echo 0 >"/sys/class/bdi/$(mountpoint -d "$work/mnt-touch")/read_ahead_kb"
"$top/bench/prepare.sh"
workload "$work/mnt-touch"
touched=$(mstat "$new" "$work/touch.sock" bytesRead)
stop "$new" "$work/touch.sock" "$work/mnt-touch"

for link in $links; do
	IFS=: read -r delay rate <<<"$link"
	bench_wanproxy "$link" "$delay" "$rate"
done

cold() { # LINK BUILD BIN MODE: one cold start, a line into $work/results
	local link=$1 b=$2 bin=$3 mode=$4 sock=$work/$2-$4.sock mnt=$work/mnt-$2-$4 t0 t1
	local repo=ferry
	[ "$b" = new ] || repo='ferry-old'
	rm -rf "$work/cache-$b-$mode"
	mkdir -p "$mnt"
	# shellcheck disable=SC2086 # options, split on purpose
	if [ "$b" = new ]; then
		"$bin/ferryd" --socket "$sock" ${FERRY_FETCHREAD_FERRYD:-}
	else
		"$bin/ferryd" --socket "$sock"
	fi
	"$top/bench/prepare.sh"
	wstat "$link" --reset requests >/dev/null
	t0=$(date +%s.%N)
	"$bin/ferry" -q mount --mode "$mode" --socket "$sock" --cache-dir "$work/cache-$b-$mode" \
		"docker://127.0.0.1:$(cat "$work/wp-$link.port")/$repo/$set_name:1" "$mnt"
	workload "$mnt"
	t1=$(date +%s.%N)
	echo "$link $b-$mode $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }') $(wstat "$link" bytes_down) $(wstat "$link" requests) $(mstat "$bin" "$sock" fetches) $(mstat "$bin" "$sock" fetchesAhead)" >>"$work/results"
	stop "$bin" "$sock" "$mnt"
}

: >"$work/results"
for _ in $(seq "$rounds"); do
	for link in $links; do
		for mode in fuse fanotify; do
			[ -z "$old" ] || cold "$link" old "$old" "$mode"
			cold "$link" new "$new" "$mode"
		done
	done
done

echo "## Fetch what is read: $set_name, \`python3 -c '$py'\`, $rounds rounds, load average $(cut -d' ' -f1-3 /proc/loadavg) at the end"
echo
echo "Touched by the workload: $touched bytes (4 KiB pages; FUSE, no kernel readahead)."
echo
python3 - "$work/results" "$touched" <<'PY'
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    link, what, *v = line.split()
    rows[(link, what)].append([float(x) for x in v])
touched = int(sys.argv[2])
print("| link (delay ms : Mbit/s) | run | s | registry bytes | x read | requests | fetch-ahead requests | critical-path requests | per run: MB / requests / critical path |")
print("|---|---|---|---|---|---|---|---|---|")
for (link, what), r in rows.items():
    med = lambda i: statistics.median(x[i] for x in r)
    print("| %s | %s | %.2f | %d | %.2f | %d | %d | %d | %s |" % (
        link, what, med(0), med(1), med(1) / touched, med(2), med(4),
        statistics.median(x[3] - x[4] for x in r),
        ", ".join("%.1f/%d/%d" % (x[1] / 1e6, x[2], x[3] - x[4]) for x in r)))
PY
