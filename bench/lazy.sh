#!/usr/bin/env bash
# Lazy-mount benchmarks (`make bench`), all against a docker-registry on
# 127.0.0.1. Prints markdown; docs/PERFORMANCE.md records the results.
#
# Cold start: from `ferry mount --mode fuse` and `--mode fanotify` (fresh
# cache, fresh ferryd) to the first byte of /etc/os-release and to the end
# of a startup workload (read os-release, list /usr, chroot `sh -c true` and
# `env true`), against a full pull (skopeo copy of the source image to an
# OCI layout + umoci unpack) followed by the same workload; bytes fetched
# against bytes read.
#
# Warm cache (every chunk present, the mounts' runs interleaved):
# sequential read, 500 random small files, a metadata walk and fio 4k random
# reads, through the FUSE mount (and one of a ferryd without directory
# readahead) and the fanotify mount against the kernel EROFS mount of the
# same image (--mode local), squashfuse of the same tree, and erofsfuse
# when $EROFSFUSE names one (it gets the local-mode bootstrap and device
# files). Every measured run (cold or warm) starts after bench/prepare.sh:
# page cache dropped, free memory host-backed. A complete blob has no
# fanotify mark, so those reads raise no events; "warm, blob incomplete"
# then reads the 500 small files and the largest file through a fanotify
# mount whose blob still has missing chunks (every read raises an event
# answered from memory).
# Then ferryd's peak RSS.
#
# Env: FERRY_BENCH_DIR (datasets, default /var/tmp/ferry-bench),
# FERRY_BENCH_RUNS (default 5), FERRY_LAZY_SET (default big), EROFSFUSE.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
set_name=${FERRY_LAZY_SET:-big}
. "$top/bench/lib.sh"
bench_workdir lazy
sock=$work/ferryd.sock
fsock=$work/ferryd-fanotify.sock # warm fanotify mounts: their own daemon and RSS
nsock=$work/ferryd-nora.sock     # a FUSE mount without directory readahead

drop_caches() { "$top/bench/prepare.sh"; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }
stop_ferryd() {
	local m
	for m in "$work"/mnt-*; do
		mountpoint -q "$m" && "$ferry" umount "$m"
	done
	ferryd_stop "$sock"
}
# mount_stat FIELD [MNT [SOCKET]]: the statistic from ferryd, summed over
# its mounts (or MNT's).
mount_stat() {
	"$ferry" mount --list --json --socket "${3:-$sock}" ${2:+"$2"} | python3 -c '
import json, sys
m = json.load(sys.stdin)["mounts"]
print(sum(x[sys.argv[1]] for x in m))' "$1"
}

dataset "$set_name"
tar=$data/$set_name.tar gz=$data/$set_name.tar.gz ref=$data/$set_name.ref

bench_image "$set_name"
total=$("$ferry" inspect --json "$image" | python3 -c '
import json, sys
print(sum(b["size"] for b in json.load(sys.stdin)["blobs"]))')

echo "## lazy mounts: $set_name ($(stat -c %s "$gz") bytes tar.gz; ferry blobs $total bytes), $(nproc) CPUs"
echo

# --- cold start --------------------------------------------------------------
workload() { # ROOT: the startup workload
	cat "$1/etc/os-release" >/dev/null
	find "$1/usr" >/dev/null
	chroot "$1" /bin/sh -c true
	chroot "$1" /usr/bin/env true
}
echo "| cold start (median of $runs) | first byte of /etc/os-release (s) | startup workload done (s) | bytes fetched | bytes read |"
echo "|---|---|---|---|---|"
cold_runs() { # MODE OUT: the cold start through a lazy mount
	local mode=$1 out=$2 i t0 t1 t2
	: >"$out"
	for i in $(seq "$runs"); do
		stop_ferryd
		rm -rf "$work/cache"
		mkdir -p "$work/mnt-cold"
		drop_caches
		t0=$(now)
		"$ferry" mount --mode "$mode" --socket "$sock" --cache-dir "$work/cache" "$image" "$work/mnt-cold"
		head -c 1 "$work/mnt-cold/etc/os-release" >/dev/null
		t1=$(now)
		workload "$work/mnt-cold"
		t2=$(now)
		echo "$(since "$t0" "$t1") $(since "$t0" "$t2") $(mount_stat bytesFetched) $(mount_stat bytesRead)" >>"$out"
		"$ferry" umount --socket "$sock" "$work/mnt-cold"
	done
}
cold_runs fuse "$work/cold.ferry"
cold_runs fanotify "$work/cold.fan"
: >"$work/cold.pull"
for i in $(seq "$runs"); do
	rm -rf "$work/pull" "$work/bundle"
	drop_caches
	t0=$(now)
	skopeo copy --quiet --src-tls-verify=false "docker://$reg/src/$set_name:1" "oci:$work/pull:1"
	umoci unpack --image "$work/pull:1" "$work/bundle" >/dev/null
	t1=$(now)
	workload "$work/bundle/rootfs"
	t2=$(now)
	echo "$(since "$t0" "$t1") $(since "$t0" "$t2") $(stat -c %s "$gz") $(stat -c %s "$gz")" >>"$work/cold.pull"
done
python3 - "$work/cold.ferry" "$work/cold.fan" "$work/cold.pull" "$total" <<'PY'
import statistics, sys
def med(path, col):
    return statistics.median(float(l.split()[col]) for l in open(path))
f, k, p, total = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
print("| ferry mount --mode fuse | %.3f | %.3f | %d (%.1f%% of the blobs) | %d |"
      % (med(f, 0), med(f, 1), med(f, 2), 100 * med(f, 2) / total, med(f, 3)))
# The kernel reads a fanotify mount's files itself: no bytes-read count.
print("| ferry mount --mode fanotify | %.3f | %.3f | %d (%.1f%% of the blobs) | - |"
      % (med(k, 0), med(k, 1), med(k, 2), 100 * med(k, 2) / total))
print("| skopeo copy + umoci unpack | %.3f | %.3f | %d | - |" % (med(p, 0), med(p, 1), med(p, 2)))
print()
print("ratios: workload done: fuse %.3f x full pull, fanotify %.3f x full pull, "
      "fanotify %.2f x fuse; bytes fetched %.2f x bytes read (fuse)" %
      (med(f, 1) / med(p, 1), med(k, 1) / med(p, 1), med(k, 1) / med(f, 1),
       med(f, 2) / max(1, med(f, 3))))
PY
echo
rm -rf "$work/pull" "$work/bundle"

# --- warm cache ---------------------------------------------------------------
stop_ferryd
mkdir -p "$work/mnt-fuse" "$work/mnt-kernel" "$work/mnt-fan" "$work/mnt-squash"
"$ferry" mount --mode fuse --prefetch-all --socket "$sock" --cache-dir "$work/cache" "$image" "$work/mnt-fuse"
for _ in $(seq 600); do
	[ "$(mount_stat chunksPresent)" = "$(mount_stat chunksTotal)" ] && break
	sleep 0.5
done
"$ferry" mount --mode local --cache-dir "$work/cache" "$image" "$work/mnt-kernel"
"$ferry" mount --mode fanotify --socket "$fsock" --cache-dir "$work/cache" "$image" "$work/mnt-fan"
"$BIN/ferryd" --socket "$nsock" --log-file "$work/ferryd-nora.log" --dir-readahead 0
mkdir -p "$work/mnt-fusenora"
"$ferry" mount --mode fuse --socket "$nsock" --cache-dir "$work/cache" "$image" "$work/mnt-fusenora"
mksquashfs "$ref" "$work/tree.sqfs" -quiet -comp zstd -no-progress >/dev/null
squashfuse "$work/tree.sqfs" "$work/mnt-squash"
mnts=(fuse fusenora fan kernel squash)
names=("ferry fuse" "ferry fuse, --dir-readahead 0" "ferry fanotify" "kernel EROFS (--mode local)" "squashfuse")
if [ -n "${EROFSFUSE:-}" ]; then
	boot=$(ls "$work/cache/bootstraps/"*)
	devs=()
	for d in "$work"/cache/blobs/sha256/*.data; do devs+=("--device=$d"); done
	mkdir -p "$work/mnt-erofsfuse"
	"$EROFSFUSE" "${devs[@]}" "$boot" "$work/mnt-erofsfuse"
	mnts+=(erofsfuse)
	names+=("erofsfuse ($EROFSFUSE)")
fi

# 500 random files of at most 64 KiB, and the largest file for fio.
(cd "$ref" && find . -type f -size -65k -printf '%P\n' | sort) |
	python3 -c 'import random, sys; l = sys.stdin.read().split("\n")[:-1]; random.Random(1).shuffle(l); print("\n".join(l[:500]))' \
	>"$work/small.list"
big=$(cd "$ref" && find . -type f -printf '%s %P\n' | sort -n | tail -1 | cut -d' ' -f2-)

# Interleaved rounds (bench/interleave.py): the mounts are compared under
# the same background load.
bench_one() { # TITLE COMMAND-TEMPLATE (MNT is replaced)
	local title=$1 tmpl=$2 args=() i
	for i in "${!mnts[@]}"; do
		args+=("${names[$i]}=${tmpl//MNT/$work/mnt-${mnts[$i]}}")
	done
	echo "### $title"
	echo
	python3 "$top/bench/interleave.py" "$runs" "$top/bench/prepare.sh" \
		"${args[@]}"
	echo
}
bench_one "sequential read (tar cf - . | cat)" "tar cf - -C MNT . | cat >/dev/null"
bench_one "500 random small files" "cd MNT && xargs -d '\n' -a $work/small.list cat >/dev/null"
bench_one "metadata walk (tar cf /dev/null .)" "tar cf /dev/null -C MNT ."

# Rounds in a new random order each, like interleave.py; the median.
fio_rounds=3
echo "### fio 4k random read of /$big ($(stat -c %s "$ref/$big") bytes), median of $fio_rounds rounds of 5 s"
echo
echo "| mount | IOPS |"
echo "|---|---|"
iops=()
for _ in $(seq "$fio_rounds"); do
	for i in $(shuf -e "${!mnts[@]}"); do
		drop_caches
		iops[$i]+=" $(fio --name=r --filename="$work/mnt-${mnts[$i]}/$big" --rw=randread \
			--bs=4k --ioengine=psync --runtime=5 --time_based --readonly \
			--output-format=json 2>/dev/null |
			python3 -c 'import json, sys; print(int(json.load(sys.stdin)["jobs"][0]["read"]["iops"]))')"
	done
done
for i in "${!mnts[@]}"; do
	med=$(python3 -c 'import statistics, sys; print(int(statistics.median(map(int, sys.argv[1:]))))' ${iops[$i]})
	echo "| ${names[$i]} | $med |"
done
echo

# --- warm, blob incomplete -----------------------------------------------------
# A fanotify mount over a fresh cache: the 500 small files and the largest
# file are read once (fetched), the rest of the blob stays missing, so its
# mark stays and every read below raises events answered from memory.
mkdir -p "$work/mnt-part"
"$ferry" mount --mode fanotify --socket "$fsock" --cache-dir "$work/cache-part" "$image" "$work/mnt-part"
(cd "$work/mnt-part" && xargs -d '\n' -a "$work/small.list" cat >/dev/null && cat "./$big" >/dev/null)
echo "warm, blob incomplete: $(mount_stat chunksPresent "$work/mnt-part" "$fsock") of $(mount_stat chunksTotal "$work/mnt-part" "$fsock") chunks present"
echo
mnts=(part kernel fuse)
names=("ferry fanotify, blob incomplete" "kernel EROFS (--mode local)" "ferry fuse")
bench_one "warm, blob incomplete: 500 random small files" "cd MNT && xargs -d '\n' -a $work/small.list cat >/dev/null"
bench_one "warm, blob incomplete: the largest file (/$big)" "cat MNT/$big >/dev/null"

hwm() { awk '/VmHWM/ { print $2 }' "/proc/$(ferryd_pid "$1")/status"; }
echo "ferryd peak RSS after all of the above (VmHWM): $(hwm "$sock") KiB serving the FUSE mount, $(hwm "$fsock") KiB serving the two fanotify mounts"
echo
