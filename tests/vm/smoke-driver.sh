#!/bin/sh
# SPDX-License-Identifier: MIT
# Guest test driver of tests/e2e/vm_smoke.sh (busybox sh, run by the VM's
# /init). Payload /payload/smoke (made on the host): img/ (a ferry dir:
# image), expected.sha256 (sha256sum lines relative to the image root),
# ferry.version (the host's `ferry --version`); the guest registry storage
# holds smoke:v1, the same tree pushed by the host's ferry convert.
# shellcheck disable=SC2016 # sh -c scripts expand in the guest's sh
# shellcheck source=tests/vm/lib.sh
. "$VM_LIB"
P=$VM_PAYLOAD/smoke

vm_check "/dev/cachefiles exists (CACHEFILES_ONDEMAND kernel)" test -c /dev/cachefiles

# One command per write(2): busybox echo writes its line at once.
vm_check "cachefiles: dir, tag, bind ondemand on the ext4 cache ($VM_CACHE)" sh -c '
	mkdir -p "$VM_CACHE/fscache" && exec 3<>/dev/cachefiles &&
	echo "dir $VM_CACHE/fscache" >&3 && echo "tag ferrysmoke" >&3 &&
	echo "bind ondemand" >&3 && dmesg | grep "Cache \"ferrysmoke\" added"'
mkdir -p /tmp/tcache && mount -t tmpfs tmpfs /tmp/tcache
vm_check "cachefiles: bind ondemand on tmpfs is refused (no sync_fs)" sh -c '
	exec 3<>/dev/cachefiles && echo "dir /tmp/tcache" >&3 && echo "tag ferrytmp" >&3 &&
	! echo "bind ondemand" >&3'
umount /tmp/tcache

vm_check "mkfs.ext4 and a loop mount give a fresh ext4 file system" sh -c '
	. "$VM_LIB" && vm_mkext4 /tmp/fresh.ext4 /tmp/fresh 16 &&
	grep " /tmp/fresh ext4 " /proc/mounts && umount /tmp/fresh && rm /tmp/fresh.ext4'

if vm_check "docker-registry answers /v2/ on the guest's 127.0.0.1" vm_registry_start 5000; then
	vm_check "the preloaded registry lists smoke:v1" sh -c \
		'timeout 10 wget -q -O - "http://$VM_REGISTRY/v2/smoke/tags/list" | grep "\"v1\""'
	vm_check "ferry check docker://$VM_REGISTRY/smoke:v1 (libcurl over the guest loopback)" \
		ferry check "docker://$VM_REGISTRY/smoke:v1"
fi

vm_check "ferry --version runs and matches the host's" sh -c \
	'v=$(ferry --version) && echo "$v" && [ "$v" = "$(cat "$1/ferry.version")" ]' sh "$P"
vm_check "ferry check dir:$P/img" ferry check "dir:$P/img"

# A file-backed EROFS mount needs the backing file's read_folio, which the
# initramfs' tmpfs lacks: the image goes on the ext4 cache first.
mkdir -p /mnt/smoke
if vm_check "ferry mount --mode local of a dir: image on the ext4 cache" sh -c "
	cp -a '$P/img' '$VM_CACHE/img' &&
	ferry mount --mode local 'dir:$VM_CACHE/img' /mnt/smoke --cache-dir '$VM_CACHE/ferry'"; then
	# The source is the verified descriptor ferry mounted (/proc/self/fd/N
	# of ferry's process), or a file path: never a block device.
	vm_check "the mount is file-backed EROFS (mount(2) of a regular file, no loop device)" sh -c '
		set -- $(grep " /mnt/smoke " /proc/mounts) && echo "$*" &&
		[ "$3" = erofs ] && [ "${1#/dev/}" = "$1" ] &&
		{ [ -f "$1" ] || [ "${1#/proc/self/fd/}" != "$1" ]; }'
	vm_check "sha256 of the mounted files match the host's" sh -c \
		'cd /mnt/smoke && sha256sum -c "$1/expected.sha256"' sh "$P"
	vm_check "ferry umount" ferry umount /mnt/smoke
fi

echo "# guest driver: $VM_PASS ok, $VM_FAIL not ok"
[ "$VM_FAIL" -eq 0 ]
