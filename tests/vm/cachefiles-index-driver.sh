#!/bin/sh
# SPDX-License-Identifier: MIT
# Guest test driver of tests/e2e/vm_cachefiles_index.sh (busybox sh, run
# by the VM's /init): ferry mount --mode cachefiles of an ordinary gzip
# image through the ferry index attached to it (ferry index, issue 45),
# served by docker-registry on the guest's 127.0.0.1, where the index is
# listed under the referrers tag. Payload /payload/idx, made on the host:
#   idx.env         LAYERS_BYTES (src:edit's layer bytes)
#   edit.list       treelist -n of the reference tree (umoci unpack)
#   usrbin.sha256   sha256sum of its usr/bin files
# shellcheck disable=SC2016 # sh -c scripts expand in the guest's sh
# shellcheck source=tests/vm/lib.sh
. "$VM_LIB"
P=$VM_PAYLOAD/idx
# shellcheck source=/dev/null
. "$P/idx.env"
C=/cf/cache
LOG=/run/ferry/ferryd.log

diagnose() {
	vm_diag "-- ferryd's log ($LOG), last 60 lines:"
	tail -n 60 "$LOG" 2>/dev/null | vm_diag_stdin
	vm_diag "-- kernel messages about erofs, cachefiles, fscache:"
	dmesg | grep -iE "erofs|cachefiles|fscache|blocked|hung" | tail -n 20 | vm_diag_stdin
}

vm_check "a fresh ext4 (extents) for the caches" vm_mkext4 /tmp/cf.ext4 /cf 900 || exit 1
vm_check "docker-registry answers on the guest's 127.0.0.1" vm_registry_start 5000 || exit 1
vm_check "ferryd -v starts on the default socket" ferryd -v

E=/mnt/edit
if ! vm_check "ferry mount --mode cachefiles src:edit (an ordinary gzip image, through its index)" \
	vm_cfmount "$C" src:edit $E; then
	diagnose
	exit 1
fi
vm_check "ferry mount --list says mode cachefiles" [ "$(vm_field $E mode)" = cachefiles ]
f=$(vm_field $E bytesFetched)
vm_check "the mount fetched little of the layers (${f:-?} of $LAYERS_BYTES B)" \
	sh -c '[ "${1:-0}" -lt $(($2 / 4)) ]' sh "$f" "$LAYERS_BYTES"
vm_check "every entry's type, mode, owner, size, mtime, target, xattrs equals umoci's unpack" \
	sh -c 'treelist -n /mnt/edit | cut -d"|" -f1-9,12 >/tmp/edit.list &&
		diff "$1/edit.list" /tmp/edit.list' sh "$P" || diagnose
sort -k 2 "$P/usrbin.sha256" >/tmp/usrbin.expect
sed 's/^[0-9a-f]*  //' /tmp/usrbin.expect >/tmp/usrbin.files
vm_readers "$E" /tmp/usrbin.files /tmp/rd 300 sort "sort -r" shuf
# shellcheck disable=SC2086
wait $VM_READERS
vm_check "3 concurrent readers of usr/bin all read the reference bytes" sh -c '
	for i in 0 1 2; do cmp /tmp/usrbin.expect /tmp/rd.$i || exit 1; done' || diagnose
vm_check "ferry umount" timeout 60 ferry umount $E
