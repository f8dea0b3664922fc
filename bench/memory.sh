#!/usr/bin/env bash
# ferryd's memory (`make bench`): one ferryd serving three mounts of the
# same image (FUSE, fanotify, and a second FUSE mount with its own chunk
# cache) through a cold start, --prefetch-all of all three, and a warm read
# of every file through each; its resident memory after each phase and its
# peak (VmHWM), read from `ferry daemon status --json`. Goal: peak <= 32 MiB.
# Prints markdown; docs/PERFORMANCE.md records the results.
#
# Env: FERRY_BENCH_DIR (datasets, default /var/tmp/ferry-bench),
# FERRY_MEMORY_SET (default big), FERRY_MEMORY_MOUNTS (default 3: more are
# FUSE mounts with caches of their own; the goal is for three).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
set_name=${FERRY_MEMORY_SET:-big}
nr_mounts=${FERRY_MEMORY_MOUNTS:-3}
case $nr_mounts in
[3-9] | [1-9][0-9]) ;;
*) echo "bench: FERRY_MEMORY_MOUNTS=$nr_mounts: expected 3..99" >&2; exit 2 ;;
esac
. "$top/bench/lib.sh"
bench_workdir memory
sock=$work/ferryd.sock
dataset "$set_name"
bench_image "$set_name"

mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
field() { "$ferry" daemon status --json --socket "$sock" | python3 -c '
import json, sys
print(json.load(sys.stdin)[sys.argv[1]])' "$1"; }
row() { echo "| $1 | $(mib "$(field rssBytes)") | $(mib "$(field peakRssBytes)") |"; }
mounts=(fuse "$work/mnt-fuse" "$work/cache" fanotify "$work/mnt-fan" "$work/cache")
for ((i = 2; i <= nr_mounts - 1; i++)); do
	mounts+=(fuse "$work/mnt-fuse$i" "$work/cache$i")
done
each_mount() { # CMD: runs CMD MODE MNT CACHE for each mount
	local i
	for ((i = 0; i < ${#mounts[@]}; i += 3)); do
		"$@" "${mounts[i]}" "${mounts[i + 1]}" "${mounts[i + 2]}"
	done
}
do_mount() { # MODE MNT CACHE [ARGS]
	mkdir -p "$2"
	"$ferry" mount --mode "$1" --socket "$sock" --cache-dir "$3" "${@:4}" "$image" "$2"
}
do_umount() { "$ferry" umount --socket "$sock" "$2"; }
workload() { # MODE MNT
	cat "$2/etc/os-release" >/dev/null
	find "$2/usr" >/dev/null
	chroot "$2" /bin/sh -c true
	chroot "$2" /usr/bin/env true
}
read_all() { (cd "$2" && find . -type f -print0 | xargs -0 -n 256 cat >/dev/null); }
prefetched() { # MODE MNT: wait for prefetch to finish (at most 10 minutes)
	local i
	for i in $(seq 1200); do
		[ "$("$ferry" mount --list --json --socket "$sock" "$2" | python3 -c '
import json, sys
print(json.load(sys.stdin)["mounts"][0]["prefetch"])')" = done ] && return 0
		sleep 0.5
	done
	echo "bench: prefetch of $2 did not finish" >&2
	return 1
}

"$top/bench/prepare.sh"
${FERRYD_ENV:-} "$top/bin/ferryd" --socket "$sock" --persistent
echo "## ferryd memory: $nr_mounts mounts of $set_name (fuse, fanotify, fuse with its own cache$([ "$nr_mounts" -gt 3 ] && echo ', ...')), $(nproc) CPUs"
echo
echo "| phase | RSS (MiB) | peak RSS so far (MiB) |"
echo "|---|---|---|"
row "started, no mounts"
each_mount do_mount
row "$nr_mounts mounts live"
each_mount workload
row "cold-start workload through each"
each_mount do_umount
for ((i = 0; i < ${#mounts[@]}; i += 3)); do
	do_mount "${mounts[i]}" "${mounts[i + 1]}" "${mounts[i + 2]}" --prefetch-all
done
each_mount prefetched
row "--prefetch-all of all $nr_mounts done"
each_mount read_all
row "every file read through each (warm)"
peak=$(field peakRssBytes)
echo
if [ "$nr_mounts" -eq 3 ]; then
	echo "Peak: $(mib "$peak") MiB (goal <= 32 MiB: $([ "$peak" -le $((32 << 20)) ] && echo met || echo "NOT met"))."
else
	echo "Peak: $(mib "$peak") MiB (the goal is for three mounts)."
fi
