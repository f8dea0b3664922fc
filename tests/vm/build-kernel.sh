#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# build-kernel.sh [--check-config | --key]
#
# Builds the x86_64 kernel ferry's VM tests boot under QEMU/TCG (a kernel
# with EROFS over fscache, i.e. cachefiles on-demand, which the development
# host lacks) and prints the path of its bzImage on stdout.
#
# Source: Debian's linux-source-6.12 (/usr/src/linux-source-6.12.tar.xz),
# configured as `make tinyconfig` + tests/vm/kernel.config + `make
# olddefconfig`. Every line of the fragment must survive olddefconfig; the
# build fails naming those that did not.
#
# The result is cached in $FERRY_VM_CACHE/kernel-KEY/ (default
# /var/tmp/ferry-vm), KEY being a hash of the linux-source package version,
# kernel.config and this script: a second run prints the cached path at
# once. The first takes ~3-6 minutes (make -j2; progress on stderr every
# 30 s). Concurrent runs wait for one another (flock).
#
#   --check-config  unpack and configure only, run the check, build nothing
#   --key           print the cache key and exit
#
# The source is unpacked and built in a temporary directory (~1.6 GB) on
# /dev/shm when it has 4 GiB free, else under the cache root: on a disk
# shared with other builds, unpacking and removing the tree took ~4 min.
#
# Env: FERRY_VM_CACHE (cache root), FERRY_VM_JOBS (make -j, default 2),
#      FERRY_VM_BUILD_TIMEOUT (seconds for the compile, default 2400),
#      FERRY_VM_BUILD_DIR (where to unpack and build).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
fragment=$here/kernel.config
pkg=linux-source-6.12
tarball=/usr/src/$pkg.tar.xz
cache=${FERRY_VM_CACHE:-/var/tmp/ferry-vm}
jobs=${FERRY_VM_JOBS:-2}
build_timeout=${FERRY_VM_BUILD_TIMEOUT:-2400}

say() { echo "build-kernel: $*" >&2; }
die() {
	say "$*"
	exit 1
}

mode=build
case ${1:-} in
'') ;;
--check-config) mode=check ;;
--key) mode=key ;;
-h | --help)
	sed -n '3,31p' "$0" | sed 's/^# \{0,1\}//'
	exit 0
	;;
*) die "unknown argument: $1 (try --help)" ;;
esac

version=$(dpkg-query -W -f='${Version}' "$pkg" 2>/dev/null) ||
	die "package $pkg is not installed (run 'make deps' as root)"
[ -r "$tarball" ] || die "$tarball is missing (reinstall $pkg)"
key=$( {
	echo "$pkg $version"
	cat "$fragment" "$0"
} | sha256sum | cut -c1-16)
out=$cache/kernel-$key

if [ "$mode" = key ]; then
	echo "$key"
	exit 0
fi
if [ "$mode" = build ] && [ -s "$out/bzImage" ]; then
	echo "$out/bzImage"
	exit 0
fi

for tool in gcc make flex bison bc xz perl; do
	command -v "$tool" >/dev/null || die "$tool is missing (run 'make deps' as root)"
done
[ -e /usr/include/libelf.h ] || [ -e /usr/include/gelf.h ] ||
	die "libelf-dev is missing (run 'make deps' as root)"

mkdir -p "$cache"
# One build per key at a time; a second caller waits and then finds it cached.
exec 9>"$cache/kernel-$key.lock"
if ! flock -n 9; then
	say "another build of kernel-$key is running; waiting for it (at most 1 h)"
	flock -w 3600 9 || die "timed out waiting for $cache/kernel-$key.lock"
fi
if [ "$mode" = build ] && [ -s "$out/bzImage" ]; then
	echo "$out/bzImage"
	exit 0
fi

builddir=${FERRY_VM_BUILD_DIR:-}
if [ -z "$builddir" ]; then
	builddir=$cache
	shm_free=$(df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 { print $4 }')
	[ "${shm_free:-0}" -ge $((4 * 1024 * 1024)) ] && builddir=/dev/shm
fi
work=$(mktemp -d "$builddir/ferry-vm-build-$key.XXXXXX")
pid=''
# shellcheck disable=SC2317 # run by the trap
cleanup() {
	# Killed early (e.g. by a test's watchdog): stop the compile too;
	# timeout(1) passes TERM on to make.
	[ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start=$(date +%s)
elapsed() { echo $(($(date +%s) - start)); }

say "building kernel-$key ($pkg $version, make -j$jobs) in $work"
say "unpacking $tarball"
tar -xf "$tarball" -C "$work"
src=$work/$pkg
[ -d "$src" ] || die "unexpected tarball layout: no $pkg/ in it"
cd "$src"

kmake() { make ARCH=x86_64 "$@"; }
say "configuring: tinyconfig + $(basename "$fragment") + olddefconfig ($(elapsed) s)"
kmake -s tinyconfig >config.log 2>&1 || {
	cat config.log >&2
	die "make tinyconfig failed"
}
scripts/kconfig/merge_config.sh -m .config "$fragment" >>config.log 2>&1 || {
	cat config.log >&2
	die "merge_config.sh failed"
}
kmake -s olddefconfig >>config.log 2>&1 || {
	cat config.log >&2
	die "make olddefconfig failed"
}

# Every requested line must be in the final .config.
requested=0
missing=()
while IFS= read -r line; do
	case $line in
	CONFIG_*=*)
		requested=$((requested + 1))
		grep -qxF "$line" .config || missing+=("$line (got: $(grep -E "^(# )?${line%%=*}[= ]" .config || echo unset))")
		;;
	"# CONFIG_"*" is not set")
		requested=$((requested + 1))
		opt=${line#\# }
		opt=${opt%% *}
		grep -q "^$opt=" .config && missing+=("$line (got: $(grep "^$opt=" .config))")
		;;
	esac
done <"$fragment"
if [ ${#missing[@]} -gt 0 ]; then
	say "config check: ${#missing[@]} of $requested requested options did not survive olddefconfig:"
	printf '  %s\n' "${missing[@]}" >&2
	exit 1
fi
check="config check: all $requested requested options survived olddefconfig ($(grep -c '=y$' .config) options =y in .config)"
say "$check"
if [ "$mode" = check ]; then
	exit 0
fi

say "compiling bzImage ($(elapsed) s so far; log: $src/build.log)"
timeout "$build_timeout" make ARCH=x86_64 -j"$jobs" bzImage >build.log 2>&1 &
pid=$!
n=0
# Bounded: make runs under timeout(1).
while kill -0 "$pid" 2>/dev/null; do
	sleep 1
	n=$((n + 1))
	if [ $((n % 30)) -eq 0 ]; then
		say "still compiling: $(elapsed) s, $(grep -cE '^  (CC|AS|LD|AR)' build.log || true) steps done"
	fi
done
rc=0
wait "$pid" || rc=$?
pid=''
if [ "$rc" -ne 0 ]; then
	tail -n 40 build.log >&2
	die "make bzImage failed after $(elapsed) s (log tail above)"
fi

tmp=$(mktemp -d "$cache/kernel-$key.new.XXXXXX")
cp arch/x86/boot/bzImage "$tmp/bzImage"
cp .config "$tmp/config"
{
	echo "key: $key"
	echo "source: $pkg $version"
	echo "fragment: $fragment"
	echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) in $(elapsed) s with make -j$jobs"
	echo "$check"
} >"$tmp/build-info"
chmod 755 "$tmp"
rm -rf "$out"
mv "$tmp" "$out"
say "built $out/bzImage ($(stat -c %s "$out/bzImage") bytes) in $(elapsed) s"
echo "$out/bzImage"
