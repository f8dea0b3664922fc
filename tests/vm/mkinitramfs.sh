#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# mkinitramfs.sh -o OUT.cpio.gz -d DRIVER [options]
#
# Packs the initramfs (newc cpio, gzip) of a ferry VM test:
#   /init                  tests/vm/init.sh
#   /vm/lib.sh             tests/vm/lib.sh (helpers for the driver)
#   /vm/driver.sh          DRIVER, the test driver (busybox sh script)
#   /vm/cache.ext4         an ext4 image made here with mkfs.ext4 (extents,
#                          4 KiB blocks), loop-mounted on /cache by /init
#   /bin, /sbin, /usr/...  busybox-static with every applet as a link
#   /usr/bin/ferry, ferryd, ferryd-keeper from $BIN (each finds the
#   others next to itself)
#   /usr/bin/docker-registry  unless --no-registry
#   /sbin/mke2fs, mkfs.ext4   for fresh cache file systems in the guest
#   /var/lib/registry      registry storage preloaded with -r
#   /payload/NAME          each -p SRC[:NAME] directory (NAME defaults to
#                          SRC's base name)
# plus every shared library those programs load (ldd, loader included), at
# the host's paths.
#
# Options:
#   -o FILE        output (required)
#   -d FILE        test driver script (required)
#   -p SRC[:NAME]  copy directory SRC to /payload/NAME (repeatable)
#   -r DIR         docker-registry storage root to preload (the directory
#                  holding docker/registry/v2: a host registry's
#                  rootdirectory after pushing into it)
#   -x PROGRAM     another host program (path or name in PATH) for
#                  /usr/bin, with its libraries (repeatable)
#   -c MB          size of the ext4 cache image (default 64; 0: none)
#   --no-registry  leave docker-registry out (saves ~20 MB)
# Env: BIN (directory of ferry, ferryd and ferryd-keeper; default the
# repository's bin/).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
BIN=${BIN:-$top/bin}
case $BIN in /*) ;; *) BIN=$top/$BIN ;; esac

die() {
	echo "mkinitramfs: $*" >&2
	exit 1
}

out='' driver='' registry_dir='' cache_mb=64 with_registry=1
payloads=() extras=()
while [ $# -gt 0 ]; do
	case $1 in
	-o) out=$2 && shift ;;
	-d) driver=$2 && shift ;;
	-p) payloads+=("$2") && shift ;;
	-r) registry_dir=$2 && shift ;;
	-x) extras+=("$2") && shift ;;
	-c) cache_mb=$2 && shift ;;
	--no-registry) with_registry=0 ;;
	-h | --help)
		sed -n '3,37p' "$0" | sed 's/^# \{0,1\}//'
		exit 0
		;;
	*) die "unknown argument: $1 (try --help)" ;;
	esac
	shift
done
[ -n "$out" ] || die "-o OUT is required"
if [ -z "$driver" ] || [ ! -r "$driver" ]; then
	die "-d DRIVER is required and must be readable"
fi
case $cache_mb in '' | *[!0-9]*) die "-c: expected a size in MiB" ;; esac
for f in "$BIN/ferry" "$BIN/ferryd" "$BIN/ferryd-keeper"; do
	[ -x "$f" ] || die "$f is missing (make all)"
done
busybox=/bin/busybox
case $(ldd "$busybox" 2>&1 || true) in
*"not a dynamic"*) ;;
*) die "$busybox is not busybox-static (apt-get install busybox-static)" ;;
esac

root=$(mktemp -d "${TMPDIR:-/tmp}/ferry-initramfs.XXXXXX")
trap 'rm -rf "$root"' EXIT
trap 'exit 130' INT TERM

mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,lib64,etc,proc,sys,dev,tmp,run,var/tmp,var/lib/registry,mnt,cache,root,vm,payload}
chmod 1777 "$root/tmp" "$root/var/tmp"

# busybox, with links for every applet (never over a program added below).
cp "$busybox" "$root/bin/busybox"
"$busybox" --list-full | while read -r applet; do
	[ "$applet" = bin/busybox ] && continue
	mkdir -p "$root/$(dirname "$applet")"
	ln -sf /bin/busybox "$root/$applet"
done

# A host program and its libraries at the same paths (the loader too).
add_libs() { # ELF
	local lib
	ldd "$1" 2>/dev/null | sed -n -e 's/.*=> \(\/[^ ]*\) (0x.*/\1/p' \
		-e 's/^[[:space:]]*\(\/[^ ]*\) (0x.*/\1/p' |
		while read -r lib; do
			[ -e "$root$lib" ] && continue
			mkdir -p "$root$(dirname "$lib")"
			cp -L "$lib" "$root$lib"
		done
}
add_prog() { # PATH DEST
	rm -f "$root$2"
	cp -L "$1" "$root$2"
	add_libs "$1"
}
add_prog "$BIN/ferry" /usr/bin/ferry
add_prog "$BIN/ferryd" /usr/bin/ferryd
add_prog "$BIN/ferryd-keeper" /usr/bin/ferryd-keeper
# glibc dlopens libgcc_s for pthread_cancel's unwinding (libfuse's
# multithreaded loop cancels its workers when a mount ends); ldd does not
# list it.
gcc_s=$(ldconfig -p | sed -n 's/^[[:space:]]*libgcc_s\.so\.1 (libc6,x86-64) => //p' | head -n 1)
[ -n "$gcc_s" ] || die "libgcc_s.so.1 not found (ldconfig -p)"
mkdir -p "$root$(dirname "$gcc_s")"
cp -L "$gcc_s" "$root$gcc_s"
if [ "$with_registry" = 1 ]; then
	reg=$(command -v docker-registry) || die "docker-registry is missing (apt-get install docker-registry)"
	add_prog "$reg" /usr/bin/docker-registry
fi
mke2fs=$(command -v mke2fs) || die "mke2fs is missing (apt-get install e2fsprogs)"
add_prog "$mke2fs" /sbin/mke2fs
ln -sf mke2fs "$root/sbin/mkfs.ext4"
[ -r /etc/mke2fs.conf ] && cp /etc/mke2fs.conf "$root/etc/"
for x in "${extras[@]}"; do
	p=$(command -v "$x") || die "-x $x: not found"
	add_prog "$p" "/usr/bin/$(basename "$p")"
done
# The loader's search path without relying on its built-in defaults.
printf '%s\n' /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu >"$root/etc/ld.so.conf"
ldconfig -r "$root" 2>/dev/null || true

cat >"$root/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
EOF
cat >"$root/etc/group" <<'EOF'
root:x:0:
nogroup:x:65534:
EOF
echo "127.0.0.1 localhost" >"$root/etc/hosts"
echo "hosts: files" >"$root/etc/nsswitch.conf"

install -m 0755 "$here/init.sh" "$root/init"
install -m 0644 "$here/lib.sh" "$root/vm/lib.sh"
install -m 0755 "$driver" "$root/vm/driver.sh"

for p in "${payloads[@]}"; do
	src=${p%%:*}
	name=$(basename "$src")
	[ "$src" != "$p" ] && name=${p#*:}
	[ -d "$src" ] || die "-p $src: not a directory"
	[ -e "$root/payload/$name" ] && die "-p $p: /payload/$name given twice"
	cp -a "$src" "$root/payload/$name"
done
if [ -n "$registry_dir" ]; then
	[ -d "$registry_dir/docker/registry/v2" ] ||
		die "-r $registry_dir: no docker/registry/v2 in it (not a registry storage root)"
	cp -a "$registry_dir/." "$root/var/lib/registry/"
fi

if [ "$cache_mb" -gt 0 ]; then
	# Extents on, 4 KiB blocks: cachefiles writes with O_DIRECT, and only an
	# extent-mapped file enforces the buffer alignment (block-mapped ext2
	# files fall back to buffered I/O and hide misaligned buffers).
	mkfs.ext4 -q -F -T default -b 4096 -O extent -E root_owner=0:0 -L ferry-cache \
		"$root/vm/cache.ext4" "${cache_mb}M" >/dev/null
	dumpe2fs -h "$root/vm/cache.ext4" 2>/dev/null | grep -q '^Filesystem features:.* extent' ||
		die "the cache image has no extents"
fi

mkdir -p "$(dirname "$out")"
(cd "$root" && find . -print0 | LC_ALL=C sort -z |
	cpio --quiet -o -0 -H newc -R 0:0 | gzip -1) >"$out.tmp"
mv "$out.tmp" "$out"
echo "mkinitramfs: $out ($(($(stat -c %s "$out") / 1024)) KiB)" >&2
