#!/usr/bin/env bash
# ferry benchmarks (`make bench`). Ratios compare commands measured in the
# same run, since the machine is noisy. Results go to stdout as a markdown
# table; docs/PERFORMANCE.md records them with these exact commands.
#
# Data: a Debian bookworm minbase rootfs from mmdebstrap (cached in
# $FERRY_BENCH_DIR, default /var/tmp/ferry-bench; needs a Debian mirror
# the first time). Set FERRY_BENCH_TAR to use another tar instead.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-$top/bin}
case $BIN in /*) ;; *) BIN=$top/$BIN ;; esac
ferry=$BIN/ferry
data=${FERRY_BENCH_DIR:-/var/tmp/ferry-bench}
runs=${FERRY_BENCH_RUNS:-5}
mkdir -p "$data"

tar=${FERRY_BENCH_TAR:-$data/minbase.tar}
if [ ! -f "$tar" ]; then
	command -v mmdebstrap >/dev/null || apt-get install -y -qq mmdebstrap >/dev/null
	echo "bench: building $tar with mmdebstrap (once)" >&2
	mmdebstrap --variant=minbase --quiet bookworm "$tar.tmp" && mv "$tar.tmp" "$tar"
fi
[ -f "$tar.gz" ] || gzip -6 -c "$tar" > "$tar.gz"
ref=$data/$(basename "$tar" .tar).ref
if [ ! -d "$ref" ]; then
	mkdir -p "$ref.tmp"
	tar --numeric-owner --xattrs --xattrs-include='*' -xpf "$tar" -C "$ref.tmp"
	mv "$ref.tmp" "$ref"
fi
work=$(mktemp -d "$data/run.XXXXXX")
trap 'rm -rf "$work"' EXIT

echo "## conversion of $(basename "$tar").gz ($(stat -c %s "$tar.gz") bytes gz, $(stat -c %s "$tar") bytes tar)"
echo
hyperfine --runs "$runs" --warmup 1 --export-markdown "$work/convert.md" \
	--prepare "rm -rf $work/out $work/m.img $work/m.blob" \
	-n "gzip -dc (floor)" "gzip -dc $tar.gz > /dev/null" \
	-n "ferry convert tar: (zstd)" "$ferry convert -q tar:$tar.gz dir:$work/out" \
	-n "ferry convert tar: (lz4)" "$ferry convert -q --compress lz4 tar:$tar.gz dir:$work/out" \
	-n "ferry convert tar: (none)" "$ferry convert -q --compress none tar:$tar.gz dir:$work/out" \
	-n "ferry convert dir: (zstd)" "$ferry convert -q dir:$ref dir:$work/out" \
	-n "mkfs.erofs 1.5 dir, 1M chunks + blobdev" \
	   "mkfs.erofs -b4096 --chunksize=1048576 --blobdev=$work/m.blob $work/m.img $ref > /dev/null" \
	>/dev/null 2>&1
cat "$work/convert.md"
echo

echo "## peak RSS (KiB), one run each"
echo
echo "| command | max RSS KiB |"
echo "|---|---|"
for spec in "zstd" "lz4" "none"; do
	rm -rf "$work/out"
	rss=$(/usr/bin/time -f %M "$ferry" convert -q --compress $spec "tar:$tar.gz" "dir:$work/out" 2>&1 >/dev/null | tail -1)
	echo "| ferry convert tar: ($spec) | $rss |"
done
echo

echo "## sizes by codec and inline threshold (bootstrap + blob vs tar.gz)"
echo
echo "| compress | inline-max | bootstrap | blob | chunks | total / tar.gz |"
echo "|---|---|---|---|---|---|"
gz=$(stat -c %s "$tar.gz")
for spec in zstd lz4 lzma none; do
	for inl in 0 256 1024 3072; do
		[ "$spec" != zstd ] && [ "$inl" != 256 ] && continue
		rm -rf "$work/out"
		json=$("$ferry" convert --json --compress $spec --inline-max $inl "tar:$tar.gz" "dir:$work/out")
		python3 - "$json" "$gz" "$spec" "$inl" <<'PY'
import json, sys
s = json.loads(sys.argv[1]); gz = int(sys.argv[2])
blob = sum(b["size"] for b in s["blobs"])
print("| %s | %s | %d | %d | %d | %.3f |" % (sys.argv[3], sys.argv[4], s["bootstrapSize"],
      blob, s["chunksUnique"], (s["bootstrapSize"] + blob) / gz))
PY
	done
done
