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
. "$(dirname "$0")/../lib/common.sh"
. "$(dirname "$0")/../lib/oci.sh"
. "$(dirname "$0")/../lib/registry.sh"
. "$(dirname "$0")/../lib/lazy.sh"

# --- images -----------------------------------------------------------------
lazy_setup base proxy

# --- startup workload on a fresh cache ----------------------------------------
lazy_use startup
M=$SCRATCH/m-startup
if mount_startup fanotify "$M"; then
	t=$(fstype "$M")
	expect_sh "the mount point is a kernel EROFS mount (${t:-not mounted})" '[ "$t" = erofs ]'
	mode=$(mount_field "$M" mode 2>&1)
	expect_sh "ferry mount --list --json says mode fanotify ($mode)" '[ "$mode" = fanotify ]'
	dpid=$(daemon_pids | head -n 1)
	kpid=$(keeper_pid "$M" 2>&1)
	expect_sh "its keeperPid ($kpid) is a running ferryd-keeper, not ferryd ${dpid:-none} itself" \
		'is_keeper "$kpid" && [ "$kpid" != "$dpid" ]'
	ferryd_detached
	startup_workload fanotify "$M"
	check "ferry umount (startup)" umount_lazy "$M"
	expect_sh "the keeper $kpid exits after the umount (within 5 s)" 'wait_gone 5 "$kpid"'
fi

# --- the whole tree, lazily from the registry ----------------------------------
lazy_use tree
M=$SCRATCH/m-tree
if tree_read fanotify "$M"; then
	expect "the mount is read-only in its options" bash -c \
		'findmnt -n -o OPTIONS --mountpoint "$1" | tr , "\n" | grep -qx ro' _ "$M"
	check_fails "touch MNT/x fails with EROFS" "Read-only file system" touch "$M/x"
	check "ferry umount (tree)" umount_lazy "$M"
fi

# --- 16 concurrent readers on a fresh cache, then a remount ----------------------
conc_checks fanotify

# --- dir: and oci: images -------------------------------------------------------
lazy_use local
if mount_converted fanotify dir; then
	check "treecmp umoci unpack == dir: fanotify mount" \
		timeout 180 python3 "$TREECMP" "$ref" "$SCRATCH/m-dir"
	check "ferry umount (dir:)" umount_lazy "$SCRATCH/m-dir"
fi
# A cache of its own: the dir: mount above made every chunk present.
lazy_use oci
if mount_converted fanotify oci; then
	check "oci: fanotify mount: files read as the reference" same_files "$ref" "$SCRATCH/m-oci" \
		usr/bin/bash usr/bin/perl opt/c/big.bin etc/passwd usr/lib/file/magic.mgc
	check "oci: fanotify mount: find lists the same entries as the reference" bash -c \
		'diff <(cd "$1" && find . | sort) <(cd "$2" && timeout 60 find . | sort)' \
		_ "$ref" "$SCRATCH/m-oci"
	check "ferry umount (oci:)" umount_lazy "$SCRATCH/m-oci"
fi

# --- prefetch ---------------------------------------------------------------------
lazy_use pfall
M=$SCRATCH/m-pfall
if mount_prefetch_all fanotify "$M" "mount --mode fanotify --prefetch-all"; then
	# Complete blobs: the kernel reads the whole tree from the cache
	# files as they are, and nothing more comes from the registry.
	check "--prefetch-all: treecmp afterwards" timeout 180 python3 "$TREECMP" "$ref" "$M"
	f=$(fp_data_bytes)
	expect_sh "--prefetch-all: that full read fetched nothing ($f B)" '[ "$f" -eq 0 ]'
	check "ferry umount (prefetch-all)" umount_lazy "$M"
fi

prefetch_files_checks fanotify "mount --mode fanotify --prefetch-files LIST"

# --- FUSE and fanotify side by side in one ferryd ---------------------------------
# edit (FUSE) and base (fanotify) share the base layer's blob, in one
# cache: ferryd fills it for FUSE reads and for fanotify events at once.
lazy_use side
MF=$SCRATCH/m-side-fuse
MK=$SCRATCH/m-side-fan
if check "mount edit --mode fuse" mount_lazy fuse "$IMG" "$MF" &&
	check "mount base --mode fanotify through the same daemon" mount_lazy fanotify "$BASE" "$MK"; then
	n=$(daemon_pids | wc -l)
	expect_sh "one ferryd serves both mounts ($n running)" '[ "$n" -eq 1 ]'
	modes="$(mount_field "$MF" mode 2>&1) $(fstype "$MF"), $(mount_field "$MK" mode 2>&1) $(fstype "$MK")"
	expect_sh "listed as fuse and fanotify, mounted as FUSE and erofs ($modes)" \
		'[[ $modes == "fuse fuse"*", fanotify erofs" ]]'
	# Files the two images share: FUSE reads make them present, then the
	# kernel reads them without a fetch.
	files=(usr/bin/bash etc/passwd usr/bin/dpkg)
	check "the FUSE mount reads the reference bytes" same_files "$ref" "$MF" "${files[@]}"
	fp=$(mount_stats "$MK" 2>/dev/null | cut -d' ' -f2)
	check "the fanotify mount reads the same files (chunks present)" \
		same_files "$refbase" "$MK" "${files[@]}"
	f=$(mount_stats "$MK" 2>/dev/null | cut -d' ' -f2)
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
	check "ferry umount of the fanotify mount" umount_lazy "$MK"
	check "the FUSE mount still serves after it" same_files "$ref" "$MF" usr/bin/perl "${files[@]}"
	check "ferry umount of the FUSE mount" umount_lazy "$MF"
fi
for m in "$MF" "$MK"; do is_mounted "$m" && umount_lazy "$m"; done

e2e_done
