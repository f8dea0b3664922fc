#!/usr/bin/env bash
# ferry benchmarks (`make bench`). Ratios compare commands measured in the
# same interleaved rounds (bench/interleave.py), since the machine is
# noisy. Prints markdown; the numbers in docs/PERFORMANCE.md come from
# this script.
#
# Data: Debian bookworm rootfs tars built once with mmdebstrap and cached in
# $FERRY_BENCH_DIR (default /var/tmp/ferry-bench): "minbase" and "big"
# (minbase + python3, perl, gcc). Env: FERRY_BENCH_RUNS (default 5),
# FERRY_BENCH_SETS (default "minbase big"; the 1 GiB layer always runs),
# MKFS_EROFS (an erofs-utils >= 1.8 mkfs.erofs to also time `--tar=f
# --ungzip`, chunked with a blobdev and with -zzstd). The zlib row shows
# what the gzip inflater (`ferry --version`) is worth.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
sets=${FERRY_BENCH_SETS:-minbase big}
. "$top/bench/lib.sh"
mkdir -p "$data"
work=$(mktemp -d "$data/run.XXXXXX")
trap 'rm -rf "$work"' EXIT

# mkfs.erofs >= 1.8 converts a tar.gz itself (Debian 12's 1.5 cannot):
# the rows for $1, when $MKFS_EROFS names one.
erofs_tar_rows() {
	[ -n "${MKFS_EROFS:-}" ] || return 0
	printf '%s\0' \
		"mkfs.erofs tar.gz, 1M chunks + blobdev=$MKFS_EROFS --quiet --tar=f --ungzip --chunksize=1048576 --blobdev=$work/t.blob $work/t.img $1" \
		"mkfs.erofs tar.gz -zzstd=$MKFS_EROFS --quiet --tar=f --ungzip -zzstd $work/t.img $1"
}
[ -n "${MKFS_EROFS:-}" ] ||
	printf '(no mkfs.erofs --tar rows: set MKFS_EROFS to an erofs-utils >= 1.8 mkfs.erofs)\n\n'
clean="rm -rf $work/out $work/m.img $work/m.blob $work/t.img $work/t.blob"

for set in $sets; do
	dataset "$set"
	tar=$data/$set.tar gz=$data/$set.tar.gz ref=$data/$set.ref
	echo "## $set: $(stat -c %s "$gz") bytes tar.gz, $(stat -c %s "$tar") bytes tar, $(nproc) CPUs"
	echo
	mapfile -d '' erofs < <(erofs_tar_rows "$gz")
	python3 "$top/bench/interleave.py" --base gzip "$runs" "$clean" \
		"gzip=gzip -dc $gz > /dev/null" \
		"ferry --jobs 2=$ferry convert -q --jobs 2 tar:$gz dir:$work/out" \
		"ferry --jobs 1=$ferry convert -q --jobs 1 tar:$gz dir:$work/out" \
		"ferry, zlib inflate=FERRY_INFLATE=zlib $ferry convert -q --jobs 2 tar:$gz dir:$work/out" \
		"ferry zstd:3=$ferry convert -q --compress zstd:3 tar:$gz dir:$work/out" \
		"ferry lz4=$ferry convert -q --compress lz4 tar:$gz dir:$work/out" \
		"ferry dir: (zstd)=$ferry convert -q dir:$ref dir:$work/out" \
		"mkfs.erofs 1.5 dir, 1M chunks + blobdev=mkfs.erofs --quiet --chunksize=1048576 --blobdev=$work/m.blob $work/m.img $ref" \
		${erofs[@]+"${erofs[@]}"}
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

	# Issue 18 asks for both <= 0.85x gzip -dc with 2 jobs and <= 0.90x
	# the tar.gz: per zstd level (zstd: the default), what a registry
	# stores (the oci: layout's layers, the bootstrap as a zstd frame
	# there) and the CPU time, whose half is the least wall time 2 CPUs
	# allow (load-independent).
	echo "| compress | data blobs | bootstrap (zstd) | oci: layout / tar.gz | CPU s (user + sys) | CPU / $(nproc) / gzip -dc CPU |"
	echo "|---|---|---|---|---|---|"
	gzcpu=$(/usr/bin/time -f "%U %S" gzip -dc "$gz" 2>&1 >/dev/null | tail -1 | awk '{ print $1 + $2 }')
	for spec in zstd:3 zstd zstd:7 zstd:9 zstd:12; do
		rm -rf "$work/oci"
		cpu=$(/usr/bin/time -f "%U %S" "$ferry" convert -q --compress $spec "tar:$gz" \
			"oci:$work/oci:b" 2>&1 >/dev/null | tail -1 | awk '{ print $1 + $2 }')
		python3 - "$work/oci" "$gzsize" "$spec" "$cpu" "$gzcpu" "$(nproc)" <<'PY'
import json, os, sys
oci, gz, spec, cpu, gzcpu, ncpu = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6])
idx = json.load(open(oci + "/index.json"))
m = json.load(open(oci + "/blobs/sha256/" + idx["manifests"][0]["digest"][7:]))
sizes = [l["size"] for l in m["layers"]]
print("| %s | %d | %d | %.3f | %.2f | %.2f |" % (spec, sum(sizes[:-1]), sizes[-1],
      sum(sizes) / gz, cpu, cpu / ncpu / gzcpu))
PY
	done
	echo "(gzip -dc: $gzcpu CPU s)"
	echo
done

# The 1 GiB layer (gib.tar.gz, lib.sh): time against gzip -dc, and the
# peak-RSS goal (<= 64 MiB).
gib_layer
gz=$data/gib.tar.gz
# gzip -l reads the size from the trailer (modulo 4 GiB: this one is 1 GiB).
read -r gzbytes tarbytes < <(gzip -l "$gz" | awk 'NR == 2 { print $1, $2 }')
echo "## gib: $gzbytes bytes tar.gz, $tarbytes bytes tar"
echo
mapfile -d '' erofs < <(erofs_tar_rows "$gz")
python3 "$top/bench/interleave.py" --base gzip "$runs" "$clean" \
	"gzip=gzip -dc $gz > /dev/null" \
	"ferry --jobs 2=$ferry convert -q --jobs 2 tar:$gz dir:$work/out" \
	"ferry --jobs 1=$ferry convert -q --jobs 1 tar:$gz dir:$work/out" \
	${erofs[@]+"${erofs[@]}"}
echo
rm -rf "$work/out"
read -r rss secs < <(/usr/bin/time -f "%M %e" "$ferry" convert -q "tar:$gz" \
	"dir:$work/out" 2>&1 >/dev/null | tail -1)
echo "1 GiB layer: ferry convert tar: (default) peak RSS $rss KiB, $secs s"
echo
