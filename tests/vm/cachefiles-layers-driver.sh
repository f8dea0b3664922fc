#!/bin/sh
# SPDX-License-Identifier: MIT
# Guest test driver of tests/e2e/vm_cachefiles_layers.sh (busybox sh, run
# by the VM's /init): ferry mount --mode cachefiles of images of native
# EROFS layers (convert --format erofs-layers) served by docker-registry
# on the guest's 127.0.0.1: each layer an EROFS over fscache of its own,
# stacked with overlayfs. nat:base and nat:edit are uncompressed, nat:zedit
# is nat:edit zstd-compressed. Payload /payload/nat, made on the host:
#   nat.env       LAYERS_BYTES (nat:edit's layer bytes), BASE_FSID (the
#                 hex digest of the layer nat:base and nat:edit share),
#                 BASE_OSREL (sha256 of nat:base's etc/os-release),
#                 ZLAYERS_BYTES (nat:zedit's layer bytes)
#   base.list, edit.list  treelist -n of the reference trees (umoci
#                 unpack), NLINK and LINKS cut (overlayfs counts links
#                 per layer)
#   usrbin.sha256, fo.sha256  sha256sum of nat:edit's usr/bin files and
#                 of the 40 largest under usr/lib (the failover's readers)
# shellcheck disable=SC2016 # sh -c scripts expand in the guest's sh
# shellcheck source=tests/vm/lib.sh
. "$VM_LIB"
P=$VM_PAYLOAD/nat
# shellcheck source=/dev/null
. "$P/nat.env"
C=/cf/cache
LOG=/run/ferry/ferryd.log
T0=$(date +%s)

fstype() { awk -v m="$1" '$2 == m { t = $3 } END { print t }' /proc/mounts; }
elapsed() { echo "$(($(date +%s) - T0)) s"; }
diagnose() {
	vm_diag "-- ferryd's log ($LOG), last 60 lines:"
	tail -n 60 "$LOG" 2>/dev/null | vm_diag_stdin
	vm_diag "-- kernel messages about erofs, overlayfs, cachefiles, fscache:"
	dmesg | grep -iE "erofs|overlay|cachefiles|fscache|blocked|hung" | tail -n 20 | vm_diag_stdin
}

vm_check "a fresh ext4 (extents) for the caches" vm_mkext4 /tmp/cf.ext4 /cf 900 || exit 1
vm_check "docker-registry answers on the guest's 127.0.0.1" vm_registry_start 5000 || exit 1
vm_check "ferryd -v starts on the default socket" ferryd -v

# --- one layer: its EROFS over fscache, attached directly -------------------------
B=/mnt/base
if ! vm_check "ferry mount --mode cachefiles nat:base (one native layer)" vm_cfmount "$C" nat:base $B; then
	diagnose
	exit 1
fi
vm_check "the mount is an EROFS over fscache named after the layer (fsid=$BASE_FSID)" sh -c '
	grep " /mnt/base erofs " /proc/mounts | grep -q "fsid=$1"' sh "$BASE_FSID"
vm_check "ferry mount --list says mode cachefiles" [ "$(vm_field $B mode)" = cachefiles ]
f=$(vm_field $B bytesFetched)
vm_check "the mount fetched the layer's metadata only (${f:-?} of $LAYERS_BYTES B)" \
	sh -c '[ "${1:-0}" -gt 0 ] && [ "$1" -lt $(($2 / 4)) ]' sh "$f" "$LAYERS_BYTES"
vm_check "nat:base: every entry's type, mode, owner, size, mtime, target, xattrs" sh -c '
	treelist -n /mnt/base | cut -d"|" -f1-9,12 >/tmp/base.list && diff "$1/base.list" /tmp/base.list' sh "$P"

# --- several layers under overlayfs; the shared layer mounted a second time -------
E=/mnt/edit
if vm_check "ferry mount --mode cachefiles nat:edit (native layers, one shared with nat:base)" \
	vm_cfmount "$C" nat:edit $E; then
	vm_check "the mount is an overlay of the layers" [ "$(fstype $E)" = overlay ]
	vm_check "the shared layer is mounted a second time under the fsid of its copy 01" sh -c '
		ls /sys/fs/erofs | grep -q "^01-$(echo "$1" | cut -c1-33)"' sh "$BASE_FSID"
	f=$(vm_field $E bytesFetched)
	vm_check "nat:edit fetched its layers' metadata only (${f:-?} of $LAYERS_BYTES B)" \
		sh -c '[ "${1:-0}" -gt 0 ] && [ "$1" -lt $(($2 / 4)) ]' sh "$f" "$LAYERS_BYTES"
	vm_check "nat:edit: every entry's type, mode, owner, size, mtime, target, xattrs (whiteouts applied)" \
		sh -c 'treelist -n /mnt/edit | cut -d"|" -f1-9,12 >/tmp/edit.list &&
			diff "$1/edit.list" /tmp/edit.list' sh "$P"
	sort -k 2 "$P/usrbin.sha256" >/tmp/usrbin.expect
	sed 's/^[0-9a-f]*  //' /tmp/usrbin.expect >/tmp/usrbin.files
	vm_readers "$E" /tmp/usrbin.files /tmp/rd 150 sort "sort -r" shuf sort
	# shellcheck disable=SC2086
	wait $VM_READERS
	vm_check "4 concurrent readers of usr/bin all read the reference bytes" sh -c '
		for i in 0 1 2 3; do cmp /tmp/usrbin.expect /tmp/rd.$i || exit 1; done' || diagnose
	vm_check "nat:base still reads right beside it (etc/os-release)" sh -c \
		'[ "$(sha256sum </mnt/base/etc/os-release)" = "$1  -" ]' sh "$BASE_OSREL"
	vm_diag "nat:edit read at $(elapsed)"
fi

# --- refused with a reason --------------------------------------------------------
vm_check "--domain is refused for native layers, naming the reason" sh -c '
	mkdir -p /mnt/dom && ! timeout 60 ferry mount --mode cachefiles --domain d \
		--cache-dir "$1" "docker://$2/nat:base" /mnt/dom >/tmp/dom.out 2>&1 &&
	grep -q "device table" /tmp/dom.out && ! grep -q " /mnt/dom " /proc/mounts' sh "$C" "$VM_REGISTRY"

# --- compressed layers: each compressed file's pclusters fetched whole ---------------
Z=/mnt/z
if vm_check "ferry mount --mode cachefiles nat:zedit (zstd-compressed layers)" vm_cfmount "$C" nat:zedit $Z; then
	f=$(vm_field $Z bytesFetched)
	vm_check "nat:zedit fetched its layers' metadata only (${f:-?} B)" \
		sh -c '[ "${1:-0}" -gt 0 ] && [ "$1" -lt $(($2 / 8)) ]' sh "$f" "$LAYERS_BYTES"
	vm_check "nat:zedit: every entry as the reference's" sh -c '
		treelist -n /mnt/z | cut -d"|" -f1-9,12 >/tmp/z.list && diff "$1/edit.list" /tmp/z.list' sh "$P"
	vm_readers "$Z" /tmp/usrbin.files /tmp/zr 150 sort "sort -r" shuf sort
	# shellcheck disable=SC2086
	wait $VM_READERS
	vm_check "4 concurrent readers of its usr/bin all read the reference bytes" sh -c '
		for i in 0 1 2 3; do cmp /tmp/usrbin.expect /tmp/zr.$i || exit 1; done' || diagnose
	vm_check "no EROFS decompression error in the kernel log" sh -c \
		'! dmesg | grep -iE "decompress|read error"'
	vm_diag "nat:zedit: usr/bin read with $(vm_field $Z bytesFetched) B fetched (whole compressed files)"
fi

# --- failover: kill -9 of ferryd under readers of data not fetched yet --------------
pid=$(vm_field $E pid)
kpid=$(vm_field $E keeperPid)
if [ "$(fstype $E)" = overlay ] &&
	vm_check "nat:edit has a cachefiles keeper (pid ${kpid:-none})" \
		sh -c '[ -n "$1" ] && [ "$1" != "$2" ] && kill -0 "$1"' sh "$kpid" "$pid"; then
	sort -k 2 "$P/fo.sha256" >/tmp/fo.expect
	sed 's/^[0-9a-f]*  //' /tmp/fo.expect >/tmp/fo.files
	vm_readers "$E" /tmp/fo.files /tmp/fo 200 sort "sort -r" shuf sort
	readers=$VM_READERS
	vm_readers "$Z" /tmp/fo.files /tmp/zfo 200 sort "sort -r" shuf sort
	readers="$readers $VM_READERS"
	sleep 1
	vm_check "kill -9 ferryd (pid ${pid:-?}) while 8 readers read $(wc -l </tmp/fo.files) cold files of nat:edit and nat:zedit" \
		sh -c '[ "${1:-0}" -gt 1 ] && kill -9 "$1"' sh "$pid"
	t=$(date +%s)
	# shellcheck disable=SC2086
	wait $readers
	vm_diag "failover: readers done $(($(date +%s) - t)) s after the kill"
	vm_check "every reader got the reference bytes, none an error" sh -c '
		for i in 0 1 2 3; do cmp /tmp/fo.expect /tmp/fo.$i && cmp /tmp/fo.expect /tmp/zfo.$i || exit 1; done' ||
		diagnose
	npid=$(vm_field $E pid)
	vm_check "a new ferryd (pid ${npid:-none}) serves nat:edit and nat:base" sh -c '
		[ -n "$1" ] && [ "$1" != "$2" ] && [ "$3" = "$1" ]' sh "$npid" "$pid" "$(vm_field $B pid)"
	vm_check "the overlay never left the mount table" [ "$(fstype $E)" = overlay ]
	vm_check "after the takeover, files not read yet still read right (usr/bin again, cold cache dropped)" \
		sh -c 'echo 3 >/proc/sys/vm/drop_caches && cd /mnt/edit &&
			xargs sha256sum </tmp/usrbin.files | sort -k 2 | cmp - /tmp/usrbin.expect'
fi

# --- --mode auto where only FUSE is left: a local mount, staged on 6.12 -------------
# A second ferryd cannot have /dev/cachefiles (the first holds it), so its
# auto mode is FUSE, which refuses native layers: ferry mount then mounts
# the image fully fetched. Linux 6.12 stacks only attached mounts: the
# layers are staged for overlayfs.
if vm_check "a second ferryd: ferry mount nat:zedit there (auto: FUSE refuses it, so --mode local, saying so)" sh -c '
	mkdir -p /mnt/loc /run/ferry2 && ferryd --socket /run/ferry2/ferryd.sock \
		--log-file /run/ferry2/ferryd.log &&
	timeout 120 ferry mount --socket /run/ferry2/ferryd.sock --cache-dir /cf/loc \
		"docker://$1/nat:zedit" /mnt/loc >/tmp/auto.out 2>&1 &&
	grep -q "fully fetched instead (--mode local)" /tmp/auto.out' sh "$VM_REGISTRY"; then
	vm_check "local: an overlay, every entry as the reference's" sh -c '
		[ "$(awk "\$2 == \"/mnt/loc\" { print \$3 }" /proc/mounts)" = overlay ] &&
		treelist -n /mnt/loc | cut -d"|" -f1-9,12 >/tmp/loc.list && diff "$1/edit.list" /tmp/loc.list' sh "$P"
	vm_check "local: usr/bin reads the reference bytes" sh -c \
		'cd /mnt/loc && xargs sha256sum </tmp/usrbin.files | sort -k 2 | cmp - /tmp/usrbin.expect'
	vm_check "local: no staging mount or directory is left behind" sh -c \
		'! awk "\$2 ~ /ferry-layers/" /proc/mounts | grep -q . && ! ls -d /run/ferry-layers.* 2>/dev/null'
	vm_check "ferry umount of the local mount; the second ferryd stops" sh -c \
		'ferry umount /mnt/loc && timeout 60 ferry daemon stop --socket /run/ferry2/ferryd.sock'
fi

# --- unmount: the layers' superblocks go with the stack ------------------------------
vm_check "ferry umount of all three" sh -c 'ferry umount /mnt/z && ferry umount /mnt/edit && ferry umount /mnt/base'
vm_check "no layer superblock is left (/sys/fs/erofs empty)" vm_wait 20 sh -c \
	'[ -z "$(ls /sys/fs/erofs 2>/dev/null | grep -v "^features$")" ]'

# --- prefetch-all fills the kernel's cache files ---------------------------------
pf_done() { [ "$(vm_field "$1" prefetch)" = "done" ]; } # MNT
# Mount IMAGE --prefetch-all on /mnt/NAME over a fresh cache /cf/NAME, and
# wait for the prefetch to be done.
pfmount() { # IMAGE NAME
	vm_check "mount $1 --prefetch-all over a fresh cache" \
		vm_cfmount "/cf/$2" "$1" "/mnt/$2" --prefetch-all &&
		vm_check "the prefetch is done" vm_wait 120 pf_done "/mnt/$2"
}
if pfmount nat:edit pf; then
	f=$(vm_field /mnt/pf bytesFetched)
	vm_check "usr/bin reads the reference bytes after the prefetch" sh -c \
		'cd /mnt/pf && xargs sha256sum </tmp/usrbin.files | sort -k 2 | cmp - /tmp/usrbin.expect'
	f2=$(vm_field /mnt/pf bytesFetched)
	vm_check "the reads fetched nothing more (${f:-?} B, then ${f2:-?} B)" \
		sh -c '[ "${1:-0}" -gt 0 ] && [ "$1" = "$2" ]' sh "$f" "$f2"
	vm_check "ferry umount of the prefetched mount" ferry umount /mnt/pf
fi
# Compressed: prefetch fills what lies outside compressed files' units and
# fetches no range that holds units only; the units come on demand.
if pfmount nat:zedit pfz; then
	f=$(vm_field /mnt/pfz bytesFetched)
	vm_check "it fetched less than half of the layers (${f:-?} of $ZLAYERS_BYTES B)" \
		sh -c '[ "${1:-0}" -gt 0 ] && [ "$1" -lt $(($2 / 2)) ]' sh "$f" "$ZLAYERS_BYTES"
	vm_check "usr/bin reads the reference bytes after it" sh -c \
		'cd /mnt/pfz && xargs sha256sum </tmp/usrbin.files | sort -k 2 | cmp - /tmp/usrbin.expect'
	vm_check "ferry umount of the prefetched compressed mount" ferry umount /mnt/pfz
fi

vm_diag "guest driver done at $(elapsed)"
[ "$VM_FAIL" -gt 0 ] && diagnose
echo "# guest driver: $VM_PASS ok, $VM_FAIL not ok"
[ "$VM_FAIL" -eq 0 ]
