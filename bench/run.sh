#!/usr/bin/env bash
# ferry benchmarks (`make bench`). Ratios compare commands measured in the
# same hyperfine run, since the machine is noisy. Prints markdown; the
# numbers in docs/PERFORMANCE.md come from this script.
#
# Data: Debian bookworm rootfs tars built once with mmdebstrap and cached in
# $FERRY_BENCH_DIR (default /var/tmp/ferry-bench): "minbase" and "big"
# (minbase + python3, perl, gcc). Env: FERRY_BENCH_RUNS (default 5),
# FERRY_BENCH_SETS (default "minbase big"), MKFS_EROFS (an erofs-utils >= 1.8
# mkfs.erofs to also time `--tar=f --ungzip`). The zlib row shows what the
# gzip inflater (`ferry --version`) is worth.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
sets=${FERRY_BENCH_SETS:-minbase big}
. "$top/bench/lib.sh"
mkdir -p "$data"
work=$(mktemp -d "$data/run.XXXXXX")
trap 'rm -rf "$work"' EXIT

for set in $sets; do
	dataset "$set"
	tar=$data/$set.tar gz=$data/$set.tar.gz ref=$data/$set.ref
	echo "## $set: $(stat -c %s "$gz") bytes tar.gz, $(stat -c %s "$tar") bytes tar, $(nproc) CPUs"
	echo
	extra=()
	if [ -n "${MKFS_EROFS:-}" ]; then
		extra=(-n "mkfs.erofs --tar=f --ungzip ($MKFS_EROFS)"
		       "$MKFS_EROFS -b4096 --quiet --tar=f --ungzip $work/t.img $gz")
	fi
	hyperfine --runs "$runs" --warmup 1 --export-markdown "$work/convert.md" \
		--prepare "rm -rf $work/out $work/m.img $work/m.blob $work/t.img" \
		-n "gzip -dc (floor)" "gzip -dc $gz > /dev/null" \
		-n "ferry convert tar: (zstd)" "$ferry convert -q tar:$gz dir:$work/out" \
		-n "ferry convert tar: (zstd, --jobs 1)" "$ferry convert -q --jobs 1 tar:$gz dir:$work/out" \
		-n "ferry convert tar: (zstd, FERRY_INFLATE=zlib)" \
		   "FERRY_INFLATE=zlib $ferry convert -q tar:$gz dir:$work/out" \
		-n "ferry convert tar: (zstd:3)" "$ferry convert -q --compress zstd:3 tar:$gz dir:$work/out" \
		-n "ferry convert tar: (lz4)" "$ferry convert -q --compress lz4 tar:$gz dir:$work/out" \
		-n "ferry convert dir: (zstd)" "$ferry convert -q dir:$ref dir:$work/out" \
		-n "mkfs.erofs 1.5 dir, 1M chunks + blobdev" \
		   "mkfs.erofs --quiet --chunksize=1048576 --blobdev=$work/m.blob $work/m.img $ref" \
		"${extra[@]}" >/dev/null 2>&1
	cat "$work/convert.md"
	echo

	echo "| peak RSS of | KiB |"
	echo "|---|---|"
	for spec in zstd lz4; do
		rm -rf "$work/out"
		rss=$(/usr/bin/time -f %M "$ferry" convert -q --compress $spec "tar:$gz" "dir:$work/out" 2>&1 >/dev/null | tail -1)
		echo "| ferry convert tar: ($spec) | $rss |"
	done
	rm -f "$work/m.img" "$work/m.blob"
	rss=$(/usr/bin/time -f %M mkfs.erofs --quiet --chunksize=1048576 --blobdev="$work/m.blob" "$work/m.img" "$ref" 2>&1 >/dev/null | tail -1)
	echo "| mkfs.erofs 1.5 dir, 1M chunks | $rss |"
	echo

	# What a registry stores: the oci: layout's layers (the bootstrap as a
	# zstd frame there).
	rm -rf "$work/oci"
	"$ferry" convert -q --json "tar:$gz" "oci:$work/oci:b" > "$work/s.json"
	python3 - "$work" "$(stat -c %s "$gz")" <<'PY'
import json, sys
work, gz = sys.argv[1], int(sys.argv[2])
s = json.load(open(work + "/s.json"))
m = json.load(open(work + "/oci/blobs/sha256/" + s["manifestDigest"][7:]))
sizes = [l["size"] for l in m["layers"]]
print("oci: layout, default options: data blobs %d + bootstrap (zstd) %d bytes = %.3f x tar.gz\n"
      % (sum(sizes[:-1]), sizes[-1], sum(sizes) / gz))
PY
	echo "| compress | inline-max | bootstrap | blobs | chunks | (bootstrap + blobs) / tar.gz |"
	echo "|---|---|---|---|---|---|"
	gzsize=$(stat -c %s "$gz")
	for spec in zstd zstd:3 lz4 lzma none; do
		for inl in 0 256 1024 3072; do
			[ "$spec" != zstd ] && [ "$inl" != 256 ] && continue
			rm -rf "$work/out"
			"$ferry" convert --json --compress $spec --inline-max $inl "tar:$gz" \
				"dir:$work/out" > "$work/s.json"
			python3 - "$work/s.json" "$gzsize" "$spec" "$inl" <<'PY'
import json, sys
s = json.load(open(sys.argv[1])); gz = int(sys.argv[2])
blob = sum(b["size"] for b in s["blobs"])
print("| %s | %s | %d | %d | %d | %.3f |" % (sys.argv[3], sys.argv[4], s["bootstrapSize"],
      blob, s["chunksUnique"], (s["bootstrapSize"] + blob) / gz))
PY
		done
	done
	echo
done

# The peak-RSS goal (<= 256 MiB for a 1 GiB layer), on gib.tar.gz (lib.sh).
gib_layer
rm -rf "$work/out"
read -r rss secs < <(/usr/bin/time -f "%M %e" "$ferry" convert -q "tar:$data/gib.tar.gz" \
	"dir:$work/out" 2>&1 >/dev/null | tail -1)
# gzip -l reads the size from the trailer (modulo 4 GiB: this one is 1 GiB).
read -r gzbytes tarbytes < <(gzip -l "$data/gib.tar.gz" | awk 'NR == 2 { print $1, $2 }')
echo "1 GiB layer ($tarbytes bytes tar, $gzbytes bytes tar.gz): ferry convert tar: (default) peak RSS $rss KiB, $secs s"
echo
