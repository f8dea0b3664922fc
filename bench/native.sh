#!/usr/bin/env bash
# Native EROFS layers (`ferry convert --format erofs-layers`, issue 20),
# part of `make bench`. For each data set (lib.sh; FERRY_BENCH_SETS,
# default "minbase big"), in the same interleaved rounds as `gzip -dc`
# (bench/interleave.py, FERRY_BENCH_RUNS rounds): the conversion of the
# tar.gz into one native layer with the default codec (zstd, fragments)
# on 2 and 1 threads, lz4 and uncompressed; with MKFS_EROFS naming an
# erofs-utils >= 1.8 mkfs.erofs, its `--tar=f --ungzip` beside them
# (-zzstd, and -zzstd -C1048576 -Efragments, the closest to ferry's
# layout). Then each output's size against the tar.gz, and warm reads
# (page cache) of every file through the overlay stack (`ferry mount
# --mode local` of the native image) against a kernel mount of ferry's
# own format of the same tar (`--mode local` of a dir: image). Prints
# markdown for docs/PERFORMANCE.md.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
sets=${FERRY_BENCH_SETS:-minbase big}
. "$top/bench/lib.sh"
bench_workdir native
[ "$(id -u)" = 0 ] || { echo "bench/native.sh: the mounts need root" >&2; exit 1; }
[ -n "${MKFS_EROFS:-}" ] ||
	printf '(no mkfs.erofs rows: set MKFS_EROFS to an erofs-utils >= 1.8 mkfs.erofs)\n\n'
clean="rm -rf $work/n $work/m.img; sync"
layer_size() { # OCI layout -> bytes of its layers (one here)
	python3 - "$1" <<'PY'
import json, os, sys
lay = sys.argv[1]
blob = lambda d: os.path.join(lay, "blobs/sha256", d.split(":")[1])
m = json.load(open(blob(json.load(open(lay + "/index.json"))["manifests"][0]["digest"])))
print(sum(l["size"] for l in m["layers"]))
PY
}

for set in $sets; do
	dataset "$set"
	gz=$data/$set.tar.gz
	gzsize=$(stat -c %s "$gz")
	echo "## $set: $gzsize bytes tar.gz, $(stat -c %s "$data/$set.tar") bytes tar, $(nproc) CPUs"
	echo
	erofs=()
	if [ -n "${MKFS_EROFS:-}" ]; then
		erofs=("mkfs.erofs -zzstd=$MKFS_EROFS --quiet --tar=f --ungzip -zzstd $work/m.img $gz"
		       "mkfs.erofs -zzstd -C1M -Efragments=$MKFS_EROFS --quiet --tar=f --ungzip -zzstd -C1048576 -Efragments $work/m.img $gz")
	fi
	python3 "$top/bench/interleave.py" --base gzip "$runs" "$clean" \
		"gzip=gzip -dc $gz > /dev/null" \
		"ferry erofs-layers --jobs 2=$ferry convert -q --jobs 2 --format erofs-layers tar:$gz oci:$work/n:t" \
		"ferry erofs-layers --jobs 1=$ferry convert -q --jobs 1 --format erofs-layers tar:$gz oci:$work/n:t" \
		"ferry erofs-layers lz4=$ferry convert -q --jobs 2 --format erofs-layers --compress lz4 tar:$gz oci:$work/n:t" \
		"ferry erofs-layers none=$ferry convert -q --format erofs-layers --compress none tar:$gz oci:$work/n:t" \
		${erofs[@]+"${erofs[@]}"}
	echo

	echo "| output | bytes | vs tar.gz | peak RSS (KiB) |"
	echo "|---|---|---|---|"
	for spec in zstd lz4 none; do
		rm -rf "$work/n"
		rss=$(/usr/bin/time -f %M "$ferry" convert -q --jobs 2 --format erofs-layers \
			--compress $spec "tar:$gz" "oci:$work/n:t" 2>&1 >/dev/null | tail -1)
		size=$(layer_size "$work/n")
		echo "| ferry erofs-layers $spec | $size | $(python3 -c "print('%.3f' % ($size / $gzsize))") | $rss |"
	done
	for opts in "-zzstd" "-zzstd -C1048576" "-zzstd -C1048576 -Efragments"; do
		[ -n "${MKFS_EROFS:-}" ] || break
		rm -f "$work/m.img"
		# shellcheck disable=SC2086 # $opts are separate options
		rss=$(/usr/bin/time -f %M "$MKFS_EROFS" --quiet --tar=f --ungzip $opts \
			"$work/m.img" "$gz" 2>&1 >/dev/null | tail -1)
		size=$(stat -c %s "$work/m.img")
		echo "| mkfs.erofs $opts | $size | $(python3 -c "print('%.3f' % ($size / $gzsize))") | $rss |"
	done
	echo

	# Warm reads: every file of the native overlay stack and of ferry's
	# own format, mounted by the kernel; one read each first fills the
	# page cache.
	rm -rf "$work/n" "$work/f"
	"$ferry" convert -q --format erofs-layers "tar:$gz" "oci:$work/n:t"
	"$ferry" convert -q "tar:$gz" "dir:$work/f"
	mkdir -p "$work/mn" "$work/mf"
	"$ferry" mount --mode local "oci:$work/n:t" "$work/mn" --cache-dir "$work/cache"
	"$ferry" mount --mode local "dir:$work/f" "$work/mf" --cache-dir "$work/cache"
	read_all() { echo "cd $1 && find . -type f -print0 | xargs -0 cat > /dev/null"; }
	sh -c "$(read_all "$work/mn")"
	sh -c "$(read_all "$work/mf")"
	echo "Warm reads of every file (find | xargs cat), page cache filled:"
	echo
	python3 "$top/bench/interleave.py" --base "ferry format" "$runs" true \
		"ferry format=$(read_all "$work/mf")" \
		"native layers (overlay)=$(read_all "$work/mn")"
	"$ferry" umount "$work/mn"
	"$ferry" umount "$work/mf"
	echo
done
