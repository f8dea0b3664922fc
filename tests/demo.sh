#!/usr/bin/env bash
# `make demo`: builds a small sample tree, converts it to a ferry image,
# verifies it, mounts it with the kernel and reads files back.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-$top/bin}
case $BIN in /*) ;; *) BIN=$top/$BIN ;; esac
ferry=$BIN/ferry
work=$(mktemp -d /tmp/ferry-demo.XXXXXX)
mnt=$work/mnt
cleanup() {
	mountpoint -q "$mnt" 2>/dev/null && "$ferry" umount "$mnt"
	rm -rf "$work"
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

say "ferry convert dir:$src dir:$work/image"
"$ferry" convert "dir:$src" "dir:$work/image"
ls -l "$work/image" "$work/image/blobs/sha256"

say "ferry check dir:$work/image"
"$ferry" check "dir:$work/image"

say "ferry inspect dir:$work/image /usr/share/doc/ferry/big.txt"
"$ferry" inspect "dir:$work/image" /usr/share/doc/ferry/big.txt

say "ferry mount --mode local (kernel EROFS, file-backed, device= per blob)"
"$ferry" mount --mode local --cache-dir "$work/cache" "dir:$work/image" "$mnt"
grep erofs /proc/self/mounts | grep "$mnt"

say "reading through the mount"
cat "$mnt/etc/os-release"
getfattr -n user.demo "$mnt/etc/os-release"
readlink "$mnt/usr/bin/release-link"
sha256sum "$src/usr/share/doc/ferry/big.txt" "$mnt/usr/share/doc/ferry/big.txt" "$mnt/usr/share/doc/ferry/copy.txt"
diff -r "$src" "$mnt" && echo "trees are identical"

say "ferry umount"
"$ferry" umount "$mnt"
echo "demo finished"
