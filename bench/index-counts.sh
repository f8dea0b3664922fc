#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Cold starts counted, not timed (issue 45): bench/wan.sh's issue-21
# workload (os-release, find /usr, chroot sh and env, a Python import of
# large standard packages) on a fresh cache and ferryd, straight to a
# docker-registry on 127.0.0.1, for the converted image and for the
# unconverted source image through its ferry index, in FUSE and fanotify
# mode. Per run: registry requests, fetches (of them made ahead of
# readers), bytes fetched, bytes read (FUSE) and bytes present in the
# cache after it. Counts hold up under load where times do not, but the
# readahead's decisions depend on timing: compare medians of a few rounds.
#
#   bench/index-counts.sh BIN [SPAN] [ROUNDS]
#
# SPAN is `ferry index --span` (default: ferry's). Image: bench/lib.sh's
# "big" (FERRY_LAZY_SET), one gzip layer.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
[ $# -ge 1 ] || { echo "usage: $0 BIN [SPAN] [ROUNDS]" >&2; exit 2; }
bin=$(cd "$1" && pwd) span=${2:-} rounds=${3:-1}
BIN=$bin
. "$top/bench/lib.sh"
set_name=${FERRY_LAZY_SET:-big}
dataset "$set_name"
bench_workdir index-counts
bench_image "$set_name"
"$ferry" index -q ${span:+--span "$span"} "docker://$reg/src/$set_name:1"
PY='import asyncio, email.mime.multipart, http.client, json, xml.etree.ElementTree, decimal, unittest, urllib.request, logging.handlers, multiprocessing, concurrent.futures, sqlite3, ctypes'
echo "## $set_name, span ${span:-default}, $rounds rounds"
echo
echo "| mode | image | requests | fetches | of them ahead | bytes fetched | bytes read | bytes present |"
echo "|---|---|---|---|---|---|---|---|"
for _ in $(seq "$rounds"); do
	for mode in fuse fanotify; do
		for what in converted index; do
			ref=ferry/$set_name:1
			[ "$what" = converted ] || ref=src/$set_name:1
			sock=$work/$mode-$what.sock mnt=$work/mnt-$mode-$what
			rm -rf "$work/cache-$mode-$what"
			mkdir -p "$mnt"
			"$top/bench/prepare.sh"
			"$ferry" mount --mode "$mode" --socket "$sock" \
				--cache-dir "$work/cache-$mode-$what" "docker://$reg/$ref" "$mnt"
			cat "$mnt/etc/os-release" >/dev/null
			find "$mnt/usr" >/dev/null
			chroot "$mnt" /bin/sh -c true
			chroot "$mnt" /usr/bin/env true
			chroot "$mnt" /usr/bin/python3 -c "$PY"
			"$ferry" mount --list --json --socket "$sock" | python3 -c '
import json, sys
m = json.load(sys.stdin)["mounts"][0]
print("| %s | %s | %d | %d | %d | %d | %s | %d |" % (sys.argv[1], sys.argv[2],
      m["registryRequests"], m["fetches"], m["fetchesAhead"], m["bytesFetched"],
      m["bytesRead"] or "-", m["bytesPresent"]))' "$mode" "$what"
			"$ferry" umount --socket "$sock" "$mnt"
			ferryd_stop "$sock"
		done
	done
done
