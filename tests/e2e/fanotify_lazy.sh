#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# shellcheck disable=SC2016,SC2034 # expect_sh evaluates its quoted condition
# Lazy kernel mounts (ferry mount --mode fanotify: a file-backed EROFS
# mount over sparse chunk cache files that ferryd fills on fanotify
# FAN_PRE_ACCESS events) of the converted Debian fixture images, from
# docker-registry on 127.0.0.1 (through tests/tools/faultproxy.py where the
# bytes fetched are counted independently of ferryd):
#   - the mount is the kernel's (erofs), listed as mode fanotify with a
#     running keeper process
#   - the whole tree equals umoci unpack (every attribute, byte, xattr,
#     hardlink group) on a fresh cache
#   - a startup workload (os-release, find /usr, chroot sh and env) fetches
#     a small fraction of the image and leaves most chunks absent
#   - 16 concurrent readers in different orders on a fresh cache agree
#     with the reference digests, each chunk is fetched about once
#   - umount and mount again with the same cache: a full read fetches
#     nothing
#   - dir: and oci: images
#   - --prefetch-all (then the blobs are complete), --prefetch-files
#   - a FUSE and a fanotify mount of images sharing a blob, in one ferryd
#     over one cache, read at the same time
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/oci_lib.sh"
. "$(dirname "$0")/registry_lib.sh"
. "$(dirname "$0")/fuse_lib.sh"
need_root
need_ferry
need_ferryd
need_cmds docker-registry skopeo umoci chroot findmnt
oci_fixtures

# --- images -----------------------------------------------------------------
lazy_images base
if ! fp_start 2>"$LOG"; then
	notok "start the counting proxy (faultproxy.py)"
	diag "$LOG"
	e2e_done
fi
PIMG=docker://$PROXY/ferry/debian:edit

# --- startup workload on a fresh cache ----------------------------------------
fuse_use startup
M=$SCRATCH/m-startup
t0=$(now_ms)
fp_mark
if check "mount --mode fanotify docker:// (through the proxy)" fnmount "$PIMG" "$M"; then
	echo "# mount returned after $(($(now_ms) - t0)) ms"
	t=$(fstype "$M")
	expect_sh "the mount point is a kernel EROFS mount (${t:-not mounted})" '[ "$t" = erofs ]'
	mode=$(mount_field "$M" mode 2>&1)
	expect_sh "ferry mount --list --json says mode fanotify ($mode)" '[ "$mode" = fanotify ]'
	dpid=$(fuse_daemon_pids | head -n 1)
	kpid=$(keeper_pid "$M" 2>&1)
	expect_sh "its keeperPid ($kpid) is a running ferryd --keeper, not ferryd ${dpid:-none} itself" \
		'is_keeper "$kpid" && [ "$kpid" != "$dpid" ]'
	expect_sh "ferryd runs (pid ${dpid:-none}) and is not a child of the test" \
		'[ -n "$dpid" ] && [ "$(ps -o ppid= -p "$dpid" | tr -d " ")" != "$$" ]'
	f=$(fp_data_bytes)
	expect_sh "the mount fetched no file data, only the bootstrap ($f B)" '[ "$f" -eq 0 ]'
	fp_mark
	check "startup: /etc/os-release reads as in the image" cmp "$ref/etc/os-release" "$M/etc/os-release"
	check "startup: find /usr lists the same entries as the reference" bash -c \
		'diff <(cd "$1" && find usr | sort) <(cd "$2" && timeout 60 find usr | sort)' _ "$ref" "$M"
	check "startup: chroot MNT /bin/sh -c true" timeout 60 chroot "$M" /bin/sh -c true
	check "startup: chroot MNT /usr/bin/env true" timeout 60 chroot "$M" /usr/bin/env true
	fetched=$(fp_data_bytes)
	stats=$(fuse_stats "$M" 2>"$SCRATCH/stats.err") || stats=
	read -r present chunks disk < <(fcache_sum) || present=
	echo "# startup: fetched $fetched B (proxy) = $((fetched * 100 / DATA_U))% of $DATA_U B uncompressed, $((fetched * 100 / DATA_C))% of $DATA_C B compressed; chunks ${present:-?}/${chunks:-?} present, ${disk:-?} B on disk"
	if [ -n "$stats" ]; then
		read -r s_read s_fetched s_present s_total s_pf <<<"$stats"
		echo "# startup: ferry's stats: read $s_read B, fetched $s_fetched B, chunks $s_present/$s_total"
		expect_sh "ferry's stats: bytes fetched match the registry traffic ($s_fetched vs $fetched)" \
			'[ "$s_fetched" -le $((fetched + 65536)) ] && [ "$s_fetched" -ge $((fetched * 9 / 10)) ]'
	else
		notok "ferry mount statistics of $M"
		diag "$SCRATCH/stats.err" 5
	fi
	expect_sh "startup fetched < 25% of the image ($fetched of $DATA_U B)" \
		'[ "$fetched" -gt 0 ] && [ "$fetched" -lt $((DATA_U / 4)) ]'
	expect_sh "startup left most chunks absent (${present:-?} of ${chunks:-?} present)" \
		'[ "$present" -gt 0 ] && [ "$present" -lt $((chunks / 2)) ]'
	check "ferry umount (startup)" fumount "$M"
	expect_sh "the keeper $kpid exits after the umount (within 5 s)" 'wait_gone 5 "$kpid"'
fi

# --- the whole tree, lazily from the registry ----------------------------------
fuse_use tree
M=$SCRATCH/m-tree
if check "mount --mode fanotify docker:// (fresh cache)" fnmount "$IMG" "$M"; then
	t0=$(now_ms)
	check "treecmp umoci unpack == lazy fanotify mount" timeout 180 python3 "$TREECMP" "$ref" "$M"
	echo "# treecmp over the lazy mount took $(($(now_ms) - t0)) ms"
	read -r present chunks disk < <(fcache_sum)
	# Chunks of lower-layer files that an upper layer deleted are never
	# read; they are few in this image.
	expect_sh "after a full read (nearly) every chunk is present ($present of $chunks)" \
		'[ "$chunks" = "$DATA_CHUNKS" ] && [ "$present" -ge $((chunks * 95 / 100)) ]'
	expect "the mount is read-only in its options" bash -c \
		'findmnt -n -o OPTIONS --mountpoint "$1" | tr , "\n" | grep -qx ro' _ "$M"
	check_fails "touch MNT/x fails with EROFS" "Read-only file system" touch "$M/x"
	check "ferry umount (tree)" fumount "$M"
fi

# --- 16 concurrent readers on a fresh cache -------------------------------------
fuse_use conc
M=$SCRATCH/m-conc
if check "mount --mode fanotify (fresh cache, 16 readers)" fnmount "$PIMG" "$M"; then
	fp_mark
	t0=$(now_ms)
	readers_start conc "$M" 170 sorted reverse shuffle pread sorted reverse shuffle pread \
		sorted reverse shuffle pread sorted reverse shuffle pread
	readers_wait
	echo "# 16 readers took $(($(now_ms) - t0)) ms, $(wc -l <"$SCRATCH/ref.sums") files each"
	readers_agree "16 concurrent readers: no errors, every digest equals the reference" \
		"$SCRATCH/ref.sums"
	fetched=$(fp_data_bytes)
	echo "# 16 readers fetched $fetched B from the registry (data blobs: $DATA_C B)"
	expect_sh "16 readers fetched each chunk about once ($fetched B, blobs $DATA_C B)" \
		'[ "$fetched" -ge $((DATA_C * 9 / 10)) ] && [ "$fetched" -le $((DATA_C * 11 / 10)) ]'

	# --- umount, mount again with the same cache: nothing fetched
	read -r present chunks disk_before < <(fcache_sum)
	check "ferry umount (16 readers)" fumount "$M"
	if check "mount again with the same cache" fnmount "$PIMG" "$M"; then
		fp_mark
		check "treecmp after the remount" timeout 180 python3 "$TREECMP" "$ref" "$M"
		fetched=$(fp_data_bytes)
		read -r present chunks disk_after < <(fcache_sum)
		expect_sh "remount: reading everything fetched nothing ($fetched B from the registry)" \
			'[ "$fetched" -eq 0 ]'
		expect_sh "remount: the cache's disk usage is unchanged ($disk_before -> $disk_after B)" \
			'[ "$disk_before" = "$disk_after" ]'
		if stats=$(fuse_stats "$M" 2>/dev/null); then
			read -r s_read s_fetched s_present s_total s_pf <<<"$stats"
			expect_sh "remount: ferry's stats say 0 bytes fetched, $s_present/$s_total chunks" \
				'[ "$s_fetched" -eq 0 ] && [ "$s_present" = "$s_total" ]'
		else
			notok "remount: ferry's stats of $M"
		fi
		check "ferry umount (remount)" fumount "$M"
	fi
fi

# --- dir: and oci: images -------------------------------------------------------
fuse_use local
if check "convert to dir:" "$FERRY" convert -q "oci:$FIX:edit" "dir:$SCRATCH/out" &&
	check "mount --mode fanotify dir:" fnmount "dir:$SCRATCH/out" "$SCRATCH/m-dir"; then
	check "treecmp umoci unpack == dir: fanotify mount" \
		timeout 180 python3 "$TREECMP" "$ref" "$SCRATCH/m-dir"
	check "ferry umount (dir:)" fumount "$SCRATCH/m-dir"
fi
# A cache of its own: the dir: mount above made every chunk present.
fuse_use oci
if check "convert to oci:" "$FERRY" convert -q "oci:$FIX:edit" "oci:$SCRATCH/layout:edit" &&
	check "mount --mode fanotify oci:" fnmount "oci:$SCRATCH/layout:edit" "$SCRATCH/m-oci"; then
	check "oci: fanotify mount: files read as the reference" same_files "$ref" "$SCRATCH/m-oci" \
		usr/bin/bash usr/bin/perl opt/c/big.bin etc/passwd usr/lib/file/magic.mgc
	check "oci: fanotify mount: find lists the same entries as the reference" bash -c \
		'diff <(cd "$1" && find . | sort) <(cd "$2" && timeout 60 find . | sort)' \
		_ "$ref" "$SCRATCH/m-oci"
	check "ferry umount (oci:)" fumount "$SCRATCH/m-oci"
fi

# --- prefetch ---------------------------------------------------------------------
all_present() {
	local p c d
	read -r p c d < <(fcache_sum 2>/dev/null) || return 1
	[ "$p" = "$c" ] && [ "$c" -gt 0 ]
}
fuse_use pfall
M=$SCRATCH/m-pfall
if check "mount --mode fanotify --prefetch-all" fnmount "$PIMG" "$M" --prefetch-all; then
	t0=$SECONDS
	if poll 60 all_present; then
		ok "--prefetch-all: every chunk present without reads (after $((SECONDS - t0)) s)"
	else
		notok "--prefetch-all: every chunk present without reads (waited 60 s)"
		echo "    cache: $(fcache_sum) (present chunks, total, disk bytes)"
	fi
	# Complete blobs: the kernel reads the whole tree from the cache
	# files as they are, and nothing more comes from the registry.
	fp_mark
	check "--prefetch-all: treecmp afterwards" timeout 180 python3 "$TREECMP" "$ref" "$M"
	f=$(fp_data_bytes)
	expect_sh "--prefetch-all: that full read fetched nothing ($f B)" '[ "$f" -eq 0 ]'
	check "ferry umount (prefetch-all)" fumount "$M"
fi

fuse_use pffiles
M=$SCRATCH/m-pffiles
PF=(/usr/bin/perl /usr/lib/file/magic.mgc /opt/c/big.bin)
printf '%s\n' "${PF[@]}" >"$SCRATCH/prefetch.list"
need=$(file_chunks "$IMG" "${PF[@]}" 2>"$LOG") || need=
enough_present() {
	local p c d
	read -r p c d < <(fcache_sum 2>/dev/null) || return 1
	[ "$p" -ge "$need" ]
}
if [ -z "$need" ]; then
	notok "ferry inspect --json of the prefetch list's files"
	diag "$LOG"
elif check "mount --mode fanotify --prefetch-files LIST" fnmount "$PIMG" "$M" \
	--prefetch-files "$SCRATCH/prefetch.list"; then
	t0=$SECONDS
	if poll 60 enough_present; then
		sleep 1 # let a step in flight finish
		ok "--prefetch-files: $need chunks of the listed files present without reads ($((SECONDS - t0)) s)"
	else
		notok "--prefetch-files: $need chunks of the listed files present without reads (waited 60 s)"
	fi
	read -r present chunks disk < <(fcache_sum)
	expect_sh "--prefetch-files: the other chunks stay absent ($present of $chunks present)" \
		'[ "$present" -lt $((chunks / 2)) ]'
	fp_mark
	check "--prefetch-files: the listed files read as the reference" \
		same_files "$ref" "$M" "${PF[@]#/}"
	f=$(fp_data_bytes)
	expect_sh "--prefetch-files: reading the listed files fetched nothing ($f B)" '[ "$f" -eq 0 ]'
	check "ferry umount (prefetch-files)" fumount "$M"
fi

# --- FUSE and fanotify side by side in one ferryd ---------------------------------
# edit (FUSE) and base (fanotify) share the base layer's blob, in one
# cache: ferryd fills it for FUSE reads and for fanotify events at once.
fuse_use side
MF=$SCRATCH/m-side-fuse
MK=$SCRATCH/m-side-fan
if check "mount edit --mode fuse" fmount "$IMG" "$MF" &&
	check "mount base --mode fanotify through the same daemon" fnmount "$BASE" "$MK"; then
	n=$(fuse_daemon_pids | wc -l)
	expect_sh "one ferryd serves both mounts ($n running)" '[ "$n" -eq 1 ]'
	modes="$(mount_field "$MF" mode 2>&1) $(fstype "$MF"), $(mount_field "$MK" mode 2>&1) $(fstype "$MK")"
	expect_sh "listed as fuse and fanotify, mounted as FUSE and erofs ($modes)" \
		'[[ $modes == "fuse fuse"*", fanotify erofs" ]]'
	# Files the two images share: FUSE reads make them present, then the
	# kernel reads them without a fetch.
	files=(usr/bin/bash etc/passwd usr/bin/dpkg)
	check "the FUSE mount reads the reference bytes" same_files "$ref" "$MF" "${files[@]}"
	fp=$(fuse_stats "$MK" 2>/dev/null | cut -d' ' -f2)
	check "the fanotify mount reads the same files (chunks present)" \
		same_files "$refbase" "$MK" "${files[@]}"
	f=$(fuse_stats "$MK" 2>/dev/null | cut -d' ' -f2)
	expect_sh "those reads fetched nothing for the fanotify mount (${fp:-?} -> ${f:-?} B)" \
		'[ "$fp" -eq 0 ] && [ "$f" -eq 0 ]'
	timeout 180 python3 "$TREECMP" "$ref" "$MF" >"$SCRATCH/side-fuse.log" 2>&1 &
	p1=$!
	timeout 180 python3 "$TREECMP" "$refbase" "$MK" >"$SCRATCH/side-fan.log" 2>&1 &
	p2=$!
	wait "$p1"
	r1=$?
	wait "$p2"
	r2=$?
	expect_sh "treecmp of both at the same time: FUSE exit $r1, fanotify exit $r2" \
		'[ "$r1" -eq 0 ] && [ "$r2" -eq 0 ]' ||
		{ diag "$SCRATCH/side-fuse.log" 5; diag "$SCRATCH/side-fan.log" 5; }
	check "ferry umount of the fanotify mount" fumount "$MK"
	check "the FUSE mount still serves after it" same_files "$ref" "$MF" usr/bin/perl "${files[@]}"
	check "ferry umount of the FUSE mount" fumount "$MF"
fi
for m in "$MF" "$MK"; do is_mounted "$m" && fumount "$m"; done

e2e_done
