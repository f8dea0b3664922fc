#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Two builds of ferry side by side: warm FUSE reads of the same image in one
# interleaved run (bench/interleave.py), so that a change's effect is read
# against the build before it under the same background load; then cold
# starts (FERRY_AB_COLD=0 skips them).
#
#   bench/ab.sh OLD_BIN NEW_BIN [RUNS]
#
# OLD_BIN and NEW_BIN hold ferry and ferryd (e.g. a worktree of the base
# commit built with make, and bin/ of this one). The image is the "big"
# Debian tree of bench/lib.sh, converted to dir: by each build's own ferry
# (the format may differ between them); each build mounts its own with its
# own ferryd and cache, every file is read once
# (warm), then each round runs sequential read, 500 random small files and
# a metadata walk on both mounts. Prints the tables and NEW/OLD ratios of
# the medians. Cold start: from `ferry mount` (a fresh ferryd, an empty
# chunk cache) in fuse and in fanotify mode to the end of the startup
# workload of bench/lazy.sh (os-release, a walk of /usr, chroot `sh -c
# true`), the page cache dropped before each. The image's blobs are local
# files (dir:), so this measures ferryd's own start and fill path, not
# round trips (bench/wan.sh does those). Root; FERRY_BENCH_DIR as
# bench/lib.sh.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/bench/lib.sh"
[ $# -ge 2 ] || { echo "usage: $0 OLD_BIN NEW_BIN [RUNS]" >&2; exit 2; }
old=$(cd "$1" && pwd)
new=$(cd "$2" && pwd)
runs=${3:-15}

dataset big
ref=$data/big.ref
work=$(mktemp -d "$data/ab.XXXXXX")
cleanup() {
	mountpoint -q "$work/mnt-old" && umount -l "$work/mnt-old"
	mountpoint -q "$work/mnt-new" && umount -l "$work/mnt-new"
	ferryd_stop "$work/old.sock" "$old/ferry" || true
	ferryd_stop "$work/new.sock" "$new/ferry" || true
	rm -rf "$work"
}
trap cleanup EXIT

for b in old new; do
	bin=$old
	[ $b = new ] && bin=$new
	mkdir -p "$work/mnt-$b"
	"$bin/ferry" convert -q "dir:$ref" "dir:$work/img-$b"
	"$bin/ferry" mount --mode fuse --socket "$work/$b.sock" --cache-dir "$work/cache-$b" \
		"dir:$work/img-$b" "$work/mnt-$b" >/dev/null
	tar cf - -C "$work/mnt-$b" . | cat >/dev/null
done

(cd "$ref" && find . -type f -size -65k -printf '%P\n' | sort) |
	python3 -c 'import random, sys; l = sys.stdin.read().split("\n")[:-1]; random.Random(1).shuffle(l); print("\n".join(l[:500]))' \
	>"$work/small.list"

echo "## A/B, warm FUSE: old $old, new $new, $runs rounds"
echo
ratio() { # TABLE: new / old of its medians
	python3 - "$1" <<'EOF'
import sys
med = {}
for line in open(sys.argv[1]):
    cells = [c.strip(" `") for c in line.split("|")]
    if len(cells) > 3 and cells[1] in ("old", "new"):
        med[cells[1]] = float(cells[3])
print("\nnew / old (medians): %.2f\n" % (med["new"] / med["old"]))
EOF
}
ab_one() { # TITLE COMMAND-TEMPLATE (MNT is replaced)
	local title=$1 tmpl=$2
	echo "### $title"
	echo
	python3 "$top/bench/interleave.py" "$runs" "$top/bench/prepare.sh" \
		"old=${tmpl//MNT/$work/mnt-old}" "new=${tmpl//MNT/$work/mnt-new}" |
		tee "$work/table.md"
	ratio "$work/table.md"
}
ab_one "sequential read (tar cf - . | cat)" "tar cf - -C MNT . | cat >/dev/null"
ab_one "500 random small files" "cd MNT && xargs -d '\n' -a $work/small.list cat >/dev/null"
ab_one "metadata walk (tar cf /dev/null .)" "tar cf /dev/null -C MNT ."

[ "${FERRY_AB_COLD:-1}" = 0 ] && exit 0
for b in old new; do
	bin=$old
	[ $b = new ] && bin=$new
	umount "$work/mnt-$b"
	"$bin/ferry" daemon stop --socket "$work/$b.sock" >/dev/null
done
# Each cold run ends mounted: the next one's preparation unmounts, stops
# that build's ferryd and empties its cache.
cat >"$work/cold-prepare.sh" <<EOF
#!/bin/sh
for b in old new; do
	bin=$old
	[ \$b = new ] && bin=$new
	mountpoint -q "$work/mnt-\$b" && umount "$work/mnt-\$b"
	"\$bin/ferry" daemon stop --socket "$work/\$b.sock" >/dev/null 2>&1
	rm -rf "$work/cache-\$b"
done
exec "$top/bench/prepare.sh"
EOF
chmod +x "$work/cold-prepare.sh"
cold_one() { # MODE
	local mode=$1 b bin cmds=()
	for b in old new; do
		bin=$old
		[ $b = new ] && bin=$new
		cmds+=("$b=$bin/ferry mount --mode $mode --socket $work/$b.sock --cache-dir $work/cache-$b dir:$work/img-$b $work/mnt-$b && cat $work/mnt-$b/etc/os-release && find $work/mnt-$b/usr && chroot $work/mnt-$b /bin/sh -c true")
	done
	echo "### cold start, $mode (mount to the startup workload's end)"
	echo
	python3 "$top/bench/interleave.py" "$runs" "$work/cold-prepare.sh" "${cmds[@]}" |
		tee "$work/table.md"
	ratio "$work/table.md"
}
cold_one fuse
cold_one fanotify
"$work/cold-prepare.sh" >/dev/null
