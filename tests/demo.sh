#!/usr/bin/env bash
# `make demo`: builds a small sample tree, converts it to a ferry image
# pushed to a docker-registry on 127.0.0.1, verifies it there, mounts it
# lazily from the registry (FUSE, ferryd fetching chunks on first read),
# reads files back, mounts it lazily with the kernel (fanotify, ferryd
# filling the cache files on pre-content events), then mounts it with the
# kernel over the complete cache (--mode local).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-$top/bin}
case $BIN in /*) ;; *) BIN=$top/$BIN ;; esac
ferry=$BIN/ferry
work=$(mktemp -d /tmp/ferry-demo.XXXXXX)
mnt=$work/mnt
reg_pid=
sock=$work/ferryd.sock
cleanup() {
	local rc=$?
	set +e
	mountpoint -q "$mnt" 2>/dev/null && "$ferry" umount --socket "$sock" "$mnt"
	pkill -f "ferryd.*$sock" 2>/dev/null
	# The registry is not our child (started by start-registry.sh).
	[ -n "$reg_pid" ] && kill "$reg_pid" 2>/dev/null
	rm -rf "$work"
	exit "$rc"
}
trap cleanup EXIT

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "building a sample tree in $work/src"
src=$work/src
mkdir -p "$src/etc" "$src/usr/bin" "$src/usr/share/doc/ferry" "$mnt"
printf 'PRETTY_NAME="ferry demo"\nID=ferry\n' > "$src/etc/os-release"
# A 3 MiB file (three 1 MiB chunks) and an identical copy: stored once.
python3 -c 'import random; r=random.Random(7); print("\n".join("%08x %s" % (i, r.random()) for i in range(110000)))' \
	> "$src/usr/share/doc/ferry/big.txt"
cp "$src/usr/share/doc/ferry/big.txt" "$src/usr/share/doc/ferry/copy.txt"
ln "$src/etc/os-release" "$src/usr/share/doc/ferry/os-release.hardlink"
ln -s ../../etc/os-release "$src/usr/bin/release-link"
setfattr -n user.demo -v "hello from an xattr" "$src/etc/os-release"

say "starting docker-registry on 127.0.0.1"
read -r port reg_pid < <("$top/tests/tools/start-registry.sh" "$work/registry")
echo "listening on 127.0.0.1:$port"
image=docker://127.0.0.1:$port/demo/sample:latest

say "ferry convert dir:$src $image"
"$ferry" convert "dir:$src" "$image"

say "ferry check $image (every chunk read back from the registry)"
"$ferry" check "$image"

say "ferry inspect $image /usr/share/doc/ferry/big.txt"
"$ferry" inspect "$image" /usr/share/doc/ferry/big.txt

say "ferry mount --mode fuse $image (lazy: only the bootstrap is fetched now)"
"$ferry" mount --mode fuse --socket "$sock" --cache-dir "$work/cache" "$image" "$mnt"
grep "$mnt" /proc/self/mounts
"$ferry" mount --list --socket "$sock"

say "reading through the lazy mount"
cat "$mnt/etc/os-release"
getfattr -n user.demo "$mnt/etc/os-release"
readlink "$mnt/usr/bin/release-link"
"$ferry" mount --list --socket "$sock"
sha256sum "$src/usr/share/doc/ferry/big.txt" "$mnt/usr/share/doc/ferry/big.txt" "$mnt/usr/share/doc/ferry/copy.txt"
diff -r "$src" "$mnt" && echo "trees are identical"
"$ferry" mount --list --socket "$sock"
"$ferry" umount --socket "$sock" "$mnt"

say "ferry mount --mode fanotify $image (lazy kernel mount, a fresh cache)"
"$ferry" mount --mode fanotify --socket "$sock" --cache-dir "$work/cache-fan" "$image" "$mnt"
grep "$mnt" /proc/self/mounts
cat "$mnt/etc/os-release"
"$ferry" mount --list --socket "$sock"
diff -r "$src" "$mnt" && echo "trees are identical"
"$ferry" mount --list --socket "$sock"
"$ferry" umount --socket "$sock" "$mnt"

say "ferry mount --mode local $image (kernel EROFS over the chunk cache, no daemon)"
"$ferry" mount --mode local --cache-dir "$work/cache" "$image" "$mnt"
grep erofs /proc/self/mounts | grep "$mnt"
diff -r "$src" "$mnt" && echo "trees are identical"
"$ferry" cache --cache-dir "$work/cache" ls

say "ferry umount"
"$ferry" umount "$mnt"
echo "demo finished"
