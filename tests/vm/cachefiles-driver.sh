#!/bin/sh
# SPDX-License-Identifier: MIT
# Guest test driver of tests/e2e/vm_cachefiles.sh (busybox sh, run by the
# VM's /init): ferry mount --mode cachefiles (EROFS over fscache, ferryd
# owning /dev/cachefiles) of images served by docker-registry on the
# guest's 127.0.0.1. Payload /payload/cf, made on the host:
#   cf.env        DATA_C (compressed bytes of deb:base's blobs), DMG_*
#                 (the chunk the corruption check damages: file, registry
#                 blob path, byte offset, original and damaged byte in
#                 octal, first chunk's length), SHARED (the blob digest
#                 deb:base and deb:pkgs share), USRBIN_BYTES (usr/bin's
#                 file bytes, each inode once), FX_BLOBS (fx:v1's blob
#                 digests, hex)
#   deb.list      treelist -n of deb:base's reference tree (umoci unpack)
#   fx.list       treelist of the edge-case fixture (mkfixture.sh)
#   usrbin.sha256 sha256sum of deb:base's usr/bin files
#   usr.find      find usr of deb:base, sorted
#   os-release, dmg.ref  reference bytes of etc/os-release and DMG_FILE
# The registry storage holds deb:base, deb:pkgs (base plus a layer: the
# base layer's blob is shared) and fx:v1 (the fixture).
# shellcheck disable=SC2016 # sh -c scripts expand in the guest's sh
# shellcheck source=tests/vm/lib.sh
. "$VM_LIB"
P=$VM_PAYLOAD/cf
# shellcheck source=/dev/null
. "$P/cf.env"
C=/cf/cache
# ferryd's log; the second ferryd (warm restart) logs to its own file, and
# so must the successor its keeper starts.
LOG=/run/ferry/ferryd.log
T0=$(date +%s)

# sha256sum of FILES under ROOT in ORDER (a command: sort, sort -r, shuf),
# listed by path.
hashfiles() { # ROOT ORDER LIST
	(cd "$1" && $2 "$3" | xargs sha256sum | sort -k 2)
}
elapsed() { echo "$(($(date +%s) - T0)) s"; }

# On a failure the guest shows what ferryd (debug log), the kernel and
# the processes were doing.
diagnose() {
	vm_diag "-- ferryd's log ($LOG), last 60 lines:"
	tail -n 60 "$LOG" 2>/dev/null | vm_diag_stdin
	vm_diag "-- kernel messages about erofs, cachefiles, fscache:"
	dmesg | grep -iE "erofs|cachefiles|fscache|netfs|blocked|hung" | tail -n 20 | vm_diag_stdin
	vm_diag "-- processes (state, wchan):"
	for d in /proc/[0-9]*; do
		echo "${d#/proc/} $(cut -d' ' -f3 "$d/stat" 2>/dev/null) $(cat "$d/wchan" 2>/dev/null) $(tr '\0' ' ' <"$d/cmdline" 2>/dev/null | cut -c1-80)"
	done | grep -v " S 0 \[" | vm_diag_stdin
}

vm_check "a fresh ext4 (extents) for the caches" vm_mkext4 /tmp/cf.ext4 /cf 900 || exit 1
vm_check "docker-registry answers on the guest's 127.0.0.1" vm_registry_start 5000 || exit 1
# Debug logging: every request and its answer, for the diagnosis.
vm_check "ferryd -v starts on the default socket" ferryd -v

# --- a lazy mount from the registry ------------------------------------------
M=/mnt/base
t=$(date +%s)
if ! vm_check "ferry mount --mode cachefiles docker://$VM_REGISTRY/deb:base" vm_cfmount "$C" deb:base $M; then
	tail -n 20 /run/ferry/ferryd.log 2>/dev/null | vm_diag_stdin
	exit 1
fi
vm_diag "mounted in $(($(date +%s) - t)) s (at $(elapsed))"
vm_check "the mount is the kernel's EROFS over fscache (fsid=, no backing file)" sh -c '
	set -- $(grep " /mnt/base " /proc/mounts) && echo "$*" && [ "$3" = erofs ] &&
	case "$4" in *fsid=*) ;; *) false ;; esac'
is_field() { [ "$(vm_field "$1" "$2")" = "$3" ]; } # MNT KEY VALUE
vm_check "ferry mount --list says mode cachefiles" is_field $M mode cachefiles
vm_check "the mount is nosuid,nodev (the default in every mode)" sh -c \
	'set -- $(grep " /mnt/base " /proc/mounts) && case ",$4," in *,nosuid,*) ;; *) exit 1 ;; esac &&
	case ",$4," in *,nodev,*) ;; *) exit 1 ;; esac'

f=$(vm_field $M bytesFetched)
vm_check "the mount fetched no file data, only the bootstrap (${f:-?} B)" [ "${f:-1}" -eq 0 ]

# --- startup workload: a small part of the image ------------------------------
vm_check "startup: etc/os-release reads as in the image" cmp "$P/os-release" $M/etc/os-release
vm_check "startup: find usr lists the reference's entries" sh -c \
	'cd /mnt/base && find usr | sort >/tmp/usr.find && cmp "$1/usr.find" /tmp/usr.find' sh "$P"
vm_check "startup: chroot MNT /bin/sh -c true" timeout 60 chroot $M /bin/sh -c true
vm_check "startup: chroot MNT /usr/bin/env true" timeout 60 chroot $M /usr/bin/env true
f=$(vm_field $M bytesFetched)
vm_diag "startup fetched ${f:-?} of $DATA_C compressed bytes (at $(elapsed))"
vm_check "startup fetched some, and < 25% of the image (${f:-?} of $DATA_C B)" \
	sh -c '[ "$1" -gt 0 ] && [ "$1" -lt $(($2 / 4)) ]' sh "${f:-0}" "$DATA_C"
vm_check "every entry's type, mode, owner, size, mtime, target, xattrs, links (treelist -n)" \
	sh -c 'treelist -n /mnt/base >/tmp/deb.list && diff "$1/deb.list" /tmp/deb.list' sh "$P"

# --- 8 concurrent readers of usr/bin, in different orders ----------------------
sort -k 2 "$P/usrbin.sha256" >/tmp/usrbin.expect
sed 's/^[0-9a-f]*  //' /tmp/usrbin.expect >/tmp/usrbin.files
t=$(date +%s)
vm_readers "$M" /tmp/usrbin.files /tmp/rd 150 sort "sort -r" shuf sort "sort -r" shuf sort shuf
# shellcheck disable=SC2086
wait $VM_READERS
vm_diag "8 readers of usr/bin ($(wc -l </tmp/usrbin.files) files) took $(($(date +%s) - t)) s"
vm_check "8 concurrent readers all read the reference bytes" sh -c '
	for i in 0 1 2 3 4 5 6 7; do cmp /tmp/usrbin.expect /tmp/rd.$i || exit 1; done' ||
	diagnose
# usr/bin of MNT read again equals the reference.
usrbin_right() { hashfiles "$1" sort /tmp/usrbin.files | cmp /tmp/usrbin.expect -; } # MNT

# --- a corrupted chunk: EIO, never wrong bytes ----------------------------------
# The registry's copy of the chunk's blob gets one byte flipped.
# shellcheck disable=SC2059 # the byte is an octal escape
damage() { printf "\\$1" | dd of="/var/lib/registry/$DMG_BLOB_PATH" bs=1 seek="$DMG_OFF" conv=notrunc 2>/dev/null; }
# Read FILE whole into /tmp/dmg: fails with EIO, and what came before the
# error is the reference's.
read_eio() { # FILE
	! dd if="$1" of=/tmp/dmg bs=65536 2>/tmp/dmg.err && grep -q "Input/output error" /tmp/dmg.err &&
		head -c "$(stat -c %s /tmp/dmg)" "$P/dmg.ref" | cmp - /tmp/dmg
}
if vm_check "damage one byte of $DMG_FILE's first chunk in the guest registry" damage "$DMG_BAD"; then
	vm_check "reading it fails with EIO, no wrong bytes before it" read_eio "$M/$DMG_FILE"
	vm_check "a second read fails again (nothing bad was cached)" read_eio "$M/$DMG_FILE"
	vm_check "its other chunks read right (from byte $DMG_LEN1)" sh -c '
		dd if="$1" of=/tmp/tail bs=4096 skip=$(($3 / 4096)) 2>/dev/null &&
		dd if="$2" of=/tmp/tailref bs=4096 skip=$(($3 / 4096)) 2>/dev/null &&
		[ -s /tmp/tail ] && cmp /tmp/tailref /tmp/tail' sh "$M/$DMG_FILE" "$P/dmg.ref" "$DMG_LEN1"
	vm_check "ferryd's log names the damaged chunk" grep -qi "chunk" "$LOG"
	damage "$DMG_GOOD"
fi

# --- the edge-case fixture, every attribute and byte ----------------------------
if vm_check "ferry mount --mode cachefiles docker://$VM_REGISTRY/fx:v1" vm_cfmount "$C" fx:v1 /mnt/fx; then
	t=$(date +%s)
	vm_check "fixture: every entry and byte equals the reference (treelist)" sh -c \
		'treelist /mnt/fx >/tmp/fx.list && diff "$1/fx.list" /tmp/fx.list' sh "$P"
	vm_diag "fixture read in $(($(date +%s) - t)) s"
	vm_check "ferry umount of the fixture" ferry umount /mnt/fx
fi

# --- ferry mount without --mode: auto picks cachefiles here -----------------------
# (6.12: no fanotify pre-content events; /dev/cachefiles is there)
if vm_check "ferry mount (mode auto) of fx:v1" sh -c \
	'mkdir -p /mnt/auto && timeout 120 ferry mount --cache-dir "$1" "docker://$2/fx:v1" /mnt/auto' \
	sh "$C" "$VM_REGISTRY"; then
	vm_check "auto chose cachefiles" is_field /mnt/auto mode cachefiles
	r=$(vm_field /mnt/auto modeReason)
	vm_diag "modeReason: $r"
	vm_check "--list says why: not fanotify, cachefiles" sh -c \
		'case "$1" in "not fanotify: "*"; cachefiles: "*) ;; *) exit 1 ;; esac' sh "$r"
	vm_check "ferry umount (auto)" ferry umount /mnt/auto
fi

# --- a warm restart: a new ferryd reads nothing from the registry ---------------
pid=$(vm_field $M pid)
vm_check "ferry umount of deb:base" ferry umount $M
vm_check "the kernel kept its cache files in $C/fscache/cache (bootstrap and blob)" sh -c \
	'find "$1/fscache/cache" -type f -name "D*" | grep -q "/D$2$"' sh "$C" "$SHARED"
# One copy: what the reads above needed (startup, usr/bin, the fixture) is
# in the kernel's cache files, whole frames; the chunk cache's data files
# stay sparse (du: allocated KiB). (While mounted, the kernel's files are
# unlinked temporary files: du sees them once it lets go.)
kib() { du -sk "$1" | cut -f1; }
ck=$(kib "$C/blobs") fk=$(kib "$C/fscache/cache")
vm_diag "after reading usr/bin ($((USRBIN_BYTES / 1024)) KiB), the startup files and the fixture: chunk cache $ck KiB, the kernel's cache files $fk KiB"
vm_check "one copy: the kernel's cache files hold what was read (>= $((USRBIN_BYTES / 1024)) KiB), the chunk cache < 1 MiB of it" \
	sh -c '[ "$1" -lt 1024 ] && [ "$2" -ge $(($3 / 1024)) ]' sh "$ck" "$fk" "$USRBIN_BYTES"
# ferry cache ls and gc: the kernel's cache is not bound now (the last
# cachefiles mount is gone); gc keeps the blobs the image records name.
vm_check "ferry cache ls shows the kernel's cache (fscache: files, bytes), not bound" sh -c '
	ferry cache --cache-dir "$1" ls | tee /tmp/ls.out | grep "^fscache" |
	grep -q "[1-9][0-9]* files, [1-9][0-9]* bytes on disk in $1/fscache$"' sh "$C"
vm_check "ferry cache gc: bootstraps go, every recorded blob's cache file stays" sh -c '
	ferry cache --cache-dir "$1" gc >/tmp/gc.out && cat /tmp/gc.out &&
	grep -q "^fscache: removed [1-9][0-9]* cache files" /tmp/gc.out &&
	find "$1/fscache/cache" -type f -name "D$2" | grep -q .' sh "$C" "$SHARED"
# fx:v1's record pruned: its blobs' kernel cache files go, base's stay.
not() { ! "$@"; }
has_fx() { for _b in $FX_BLOBS; do find "$C/fscache/cache" -type f -name "D$_b" | grep -q . && return 0; done; return 1; }
vm_check "fx:v1's blobs have kernel cache files (the record keeps them)" has_fx
vm_check "ferry cache prune docker://$VM_REGISTRY/fx:v1: its cache files go, deb:base's blob stays" sh -c '
	ferry cache --cache-dir "$1" prune "docker://$2/fx:v1" | tee /tmp/prune.out &&
	grep -q "^fscache: removed [1-9][0-9]* cache files" /tmp/prune.out &&
	find "$1/fscache/cache" -type f -name "D$3" | grep -q .' sh "$C" "$VM_REGISTRY" "$SHARED" &&
	vm_check "no cache file of fx:v1's blobs is left" not has_fx
vm_check "ferryd (pid ${pid:-?}) ends on SIGTERM" sh -c \
	'[ "$1" -gt 1 ] && kill "$1" && i=0 && while kill -0 "$1" 2>/dev/null; do
		i=$((i + 1)) && [ $i -lt 50 ] && sleep 0.2 || exit 1; done' sh "${pid:-0}"
LOG=/run/ferry/ferryd2.log
vm_check "a new ferryd -v --log-file $LOG starts" ferryd -v --log-file $LOG
if vm_check "mount deb:base again (new ferryd, same caches)" vm_cfmount "$C" deb:base $M; then
	vm_check "usr/bin reads the reference bytes again" usrbin_right $M
	f=$(vm_field $M bytesFetched)
	vm_check "the warm read fetched nothing (${f:-?} B)" [ "${f:-1}" -eq 0 ]
fi

# --- a domain: two images sharing a blob share one cache file -------------------
if vm_check "mount deb:base in domain shared" vm_cfmount "$C" deb:base /mnt/d1 --domain shared &&
	vm_check "mount deb:pkgs in domain shared" vm_cfmount "$C" deb:pkgs /mnt/d2 --domain shared; then
	vm_check "both read etc/os-release and usr/bin/ls as the reference" sh -c '
		cmp "$1/os-release" /mnt/d1/etc/os-release && cmp /mnt/d1/usr/bin/ls /mnt/d2/usr/bin/ls &&
		grep -q "usr/bin/ls$" /tmp/usrbin.expect &&
		[ "$(sha256sum </mnt/d2/usr/bin/ls | cut -d" " -f1)" = "$(grep " usr/bin/ls$" /tmp/usrbin.expect | cut -d" " -f1)" ]' sh "$P"
	vm_check "--list names the domain" is_field /mnt/d2 domain shared
	vm_check "ferry cache gc leaves the kernel's cache alone while /dev/cachefiles is held" sh -c '
		n=$(find "$1/fscache" -type f | wc -l) && ferry cache --cache-dir "$1" gc | tee /tmp/gc.out &&
		grep -q "^fscache: left alone: /dev/cachefiles is held by pid [0-9]* (ferryd)" /tmp/gc.out &&
		[ "$(find "$1/fscache" -type f | wc -l)" -eq "$n" ]' sh "$C"
	# ferryd's debug log has a line per OPEN: "OPEN VOLUME COOKIE: ...".
	vm_check "the kernel opened the shared blob once for the domain" sh -c '
		n=$(grep -c "cachefiles: OPEN erofs,shared $1:" "$2") &&
		echo "$n OPEN" && [ "$n" -eq 1 ]' sh "$SHARED" "$LOG"
	vm_check "ferry umount of both domain mounts" sh -c 'ferry umount /mnt/d2 && ferry umount /mnt/d1'
	# The kernel links its cache files into the directory when it lets go.
	vm_check "the shared blob has one cache file in the domain's volume" sh -c '
		n=$(find "$1/fscache/cache/Ierofs,shared" -name "D$2" | wc -l) && echo "$n" && [ "$n" -eq 1 ]' \
		sh "$C" "$SHARED"
fi

# --- failover: kill -9 of ferryd, its keeper starts a successor ---------------------
pid=$(vm_field $M pid)
kpid=$(vm_field $M keeperPid)
vm_check "the mount has a cachefiles keeper (pid ${kpid:-none}), not ferryd itself" \
	sh -c '[ -n "$1" ] && [ "$1" != "$2" ] && kill -0 "$1"' sh "$kpid" "$pid"
# A reader of data not cached yet, in flight while ferryd dies.
timeout 120 sh -c 'sha256sum "$1" >/tmp/fo.sum 2>&1' sh "$M/$FO_FILE" &
rpid=$!
t=$(date +%s)
# kill with an empty pid would be kill 0: this whole process group.
kill9() { for _p; do [ "${_p:-0}" -gt 1 ] && kill -9 "$_p" || return 1; done; }
vm_check "kill -9 ferryd (pid ${pid:-?}) during a read" kill9 "$pid"
wait "$rpid"
vm_check "the reader in flight got the right bytes ($FO_FILE)" grep -q "^$FO_SUM " /tmp/fo.sum
vm_check "a read after the kill of data not cached yet gets the right bytes" sh -c \
	'timeout 120 cat "$1" | cmp - "$2"' sh "$M/$DMG_FILE" "$P/dmg.ref"
vm_diag "failover: readers done $(($(date +%s) - t)) s after the kill"
npid=$(vm_field $M pid)
vm_check "a new ferryd (pid ${npid:-none}) serves the mount, in mode cachefiles" \
	sh -c '[ -n "$1" ] && [ "$1" != "$2" ] && [ "$3" = cachefiles ]' sh "$npid" "$pid" "$(vm_field $M mode)"
vm_check "the successor logs to the dead ferryd's --log-file, at its level (-v)" sh -c '
	grep -q "took over /dev/cachefiles" "$1" && grep -q "cachefiles: OPEN" "$1" &&
	! grep -q "took over" /run/ferry/ferryd.log' sh "$LOG"

# --- ferry daemon upgrade, 10 times while readers run ------------------------------
# The same image again in a domain of its own: new cache files, so the
# readers' data goes through ferryd's READ answers across the upgrades.
U=/mnt/up
if vm_check "mount deb:base again in its own domain (a cold kernel cache)" vm_cfmount "$C" deb:base $U --domain up; then
	t=$(date +%s)
	vm_readers "$U" /tmp/usrbin.files /tmp/up 300 sort "sort -r" shuf shuf sort "sort -r" \
		shuf shuf sort "sort -r" shuf shuf sort "sort -r" shuf shuf
	fails=0 seen=" $(vm_field $M pid)"
	for _ in 1 2 3 4 5 6 7 8 9 10; do
		timeout 120 ferry daemon upgrade >/tmp/up.log 2>&1 || { fails=$((fails + 1)); vm_diag_stdin </tmp/up.log; }
		seen="$seen $(vm_field $M pid)"
	done
	# shellcheck disable=SC2086
	wait $VM_READERS
	vm_diag "10 upgrades while 16 readers read usr/bin: $(($(date +%s) - t)) s; ferryds:$seen"
	vm_check "10 upgrades: each succeeded" [ "$fails" -eq 0 ]
	vm_check "each upgrade started a new ferryd" sh -c \
		'[ "$(echo $1 | tr " " "\n" | sort -u | wc -l)" -eq 11 ]' sh "$seen"
	vm_check "the 16 readers across the upgrades all read the reference bytes" sh -c '
		i=0; while [ $i -lt 16 ]; do cmp /tmp/usrbin.expect /tmp/up.$i || exit 1; i=$((i + 1)); done' || diagnose
	vm_check "both mounts are still served, in mode cachefiles" \
		[ "$(vm_field $M mode)/$(vm_field $U mode)" = cachefiles/cachefiles ]
	vm_check "ferry umount of the upgrade test's mount" ferry umount $U
	npid=$(vm_field $M pid)
fi

# --- kill -9 of the keeper alone, then of ferryd: a new keeper's successor -------
# ferryd starts another keeper when its keeper dies (without one, ferryd's
# death would leave the mounts failing reads); that one's successor then
# takes the mount over.
kpid=$(vm_field $M keeperPid)
new_keeper() { _k=$(vm_field $M keeperPid) && [ -n "$_k" ] && [ "$_k" != "$1" ] && kill -0 "$_k"; }
new_ferryd() { _p=$(vm_field $M pid) && [ -n "$_p" ] && [ "$_p" != "$1" ] && [ "$(vm_field $M mode)" = cachefiles ]; }
t=$(date +%s)
vm_check "kill -9 the cachefiles keeper (pid ${kpid:-?}) alone" kill9 "$kpid"
vm_check "ferryd (pid ${npid:-?}) starts a new keeper within 10 s" vm_wait 10 new_keeper "$kpid"
vm_check "then kill -9 ferryd (pid ${npid:-?})" kill9 "$npid"
vm_check "the new keeper's successor serves the mount within 10 s" vm_wait 10 new_ferryd "$npid"
echo 3 >/proc/sys/vm/drop_caches
vm_check "cached files read right after it (page cache dropped)" sh -c \
	'timeout 20 cat "$1" | cmp - "$2" && timeout 20 cat "$3" | cmp - "$4"' \
	sh "$M/$DMG_FILE" "$P/dmg.ref" "$M/etc/os-release" "$P/os-release" || diagnose
vm_diag "keeper, then ferryd: $(($(date +%s) - t)) s"
npid=$(vm_field $M pid)

# --- no successor: ferryd and its keeper killed: errors in bounded time ----------
kpid=$(vm_field $M keeperPid)
# The kernel withdraws the cache: what is not in the page cache fails, EIO
# for data (ENOBUFS where it needs an inode the cache must give). The file
# is opened before the kills, so the read is a data read.
t=$(date +%s)
vm_check "kill -9 the keeper (pid ${kpid:-?}) and ferryd (pid ${npid:-?}): a read of data not yet cached fails with EIO, no hang" sh -c '
	exec 4<"$1" && [ "${2:-0}" -gt 1 ] && [ "${3:-0}" -gt 1 ] && kill -9 "$2" "$3" || exit 1
	! timeout 30 dd of=/dev/null bs=65536 <&4 2>/tmp/gone.err; r=$?
	cat /tmp/gone.err
	[ $r -eq 0 ] && grep -qE "Input/output error|No buffer space available" /tmp/gone.err' \
	sh "$M/$GONE_FILE" "$kpid" "$npid"
vm_diag "errors after $(($(date +%s) - t)) s"
# Who keeps it busy, if it is.
busy() { # MNT
	for l in /proc/[0-9]*/cwd /proc/[0-9]*/fd/*; do
		case $(readlink "$l") in "$1"/* | "$1") echo "$l" ;; esac
	done
}
# (busybox timeout's watcher keeps the file open up to a second longer)
vm_check "ferry umount works without ferryd" vm_wait 10 ferry umount $M || busy $M | vm_diag_stdin

# --- prefetch fills the kernel's cache files ------------------------------------
# A fresh cache directory: the device is bound anew, its kernel cache empty.
PF=/cf/pf
pf_done() { [ "$(vm_field /mnt/pf prefetch)" = "done" ]; }
if vm_check "a new ferryd; mount fx:v1 --prefetch-all over a fresh cache" sh -c '
	ferryd -v --log-file /run/ferry/ferryd3.log && mkdir -p /mnt/pf &&
	timeout 120 ferry mount --mode cachefiles --prefetch-all --cache-dir "$1" "docker://$2/fx:v1" /mnt/pf' \
	sh "$PF" "$VM_REGISTRY"; then
	LOG=/run/ferry/ferryd3.log
	vm_check "the prefetch is done" vm_wait 60 pf_done
	f=$(vm_field /mnt/pf bytesFetched)
	vm_check "fixture: every entry and byte equals the reference after the prefetch" sh -c \
		'treelist /mnt/pf >/tmp/pf.list && diff "$1/fx.list" /tmp/pf.list' sh "$P"
	f2=$(vm_field /mnt/pf bytesFetched)
	vm_check "the reads fetched nothing more: the prefetch wrote the kernel's cache files (${f:-?} B, then ${f2:-?} B)" \
		sh -c '[ "${1:-0}" -gt 0 ] && [ "$1" = "$2" ]' sh "$f" "$f2"
	vm_check "and not the chunk cache (< 64 KiB allocated)" sh -c '[ "$(du -sk "$1/blobs" | cut -f1)" -lt 64 ]' sh "$PF"
	vm_check "ferry umount of the prefetched mount" ferry umount /mnt/pf
fi

# --- another mode's chunk cache: read, not fetched again ---------------------------
# A FUSE mount fills a chunk cache (--prefetch-all); a cachefiles mount of
# the same image over it (its kernel cache fresh) fetches nothing.
MX=/cf/mx
mx_full() { [ "$(vm_field /mnt/mxf chunksPresent)" = "$(vm_field /mnt/mxf chunksTotal)" ]; }
if vm_check "mount fx:v1 with FUSE --prefetch-all, and it completes" sh -c '
	mkdir -p /mnt/mxf /mnt/mxc &&
	timeout 120 ferry mount --mode fuse --prefetch-all --cache-dir "$1" "docker://$2/fx:v1" /mnt/mxf' \
	sh "$MX" "$VM_REGISTRY" && vm_wait 60 mx_full &&
	vm_check "then cachefiles over the same chunk cache" timeout 120 ferry mount --mode cachefiles \
		--cache-dir "$MX" "docker://$VM_REGISTRY/fx:v1" /mnt/mxc; then
	vm_check "fixture through cachefiles: every entry and byte (treelist)" sh -c \
		'treelist /mnt/mxc >/tmp/mx.list && diff "$1/fx.list" /tmp/mx.list' sh "$P"
	f=$(vm_field /mnt/mxc bytesFetched)
	vm_check "cachefiles fetched nothing: the frames came from FUSE's chunk cache (${f:-?} B)" [ "${f:-1}" -eq 0 ]
	vm_check "ferry umount of both" sh -c 'ferry umount /mnt/mxc && ferry umount /mnt/mxf'
fi

vm_diag "guest driver done at $(elapsed)"
[ "$VM_FAIL" -gt 0 ] && diagnose
echo "# guest driver: $VM_PASS ok, $VM_FAIL not ok"
[ "$VM_FAIL" -eq 0 ]
