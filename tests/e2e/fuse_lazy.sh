#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# shellcheck disable=SC2016,SC2034 # expect_sh evaluates its quoted condition
# Lazy FUSE mounts (ferry mount --mode fuse, served by ferryd) of the
# converted Debian fixture images, from docker-registry on 127.0.0.1
# (through tests/tools/faultproxy.py where the bytes fetched are counted
# independently of ferryd):
#   - the whole tree equals umoci unpack (every attribute, byte, xattr,
#     hardlink group) on a fresh cache
#   - a startup workload (os-release, find /usr, chroot sh and env) fetches
#     a small fraction of the image and leaves most chunks absent
#   - 16 concurrent readers in different orders on a fresh cache agree
#     with the reference digests, each chunk is fetched about once
#   - umount and mount again with the same cache: a full read fetches
#     nothing
#   - several mounts in one ferryd; umounting one leaves the others working
#   - dir: and oci: images
#   - --prefetch-all, --prefetch-files, --prefetch-bwlimit
#   - statfs, read-only (EROFS), the daemon is not the test's child
#   - the mount's kernel readahead (bdi read_ahead_kb) is 512 KiB
#   - Basic and Bearer auth: credentials reach ferryd, never its log
. "$(dirname "$0")/../lib/common.sh"
. "$(dirname "$0")/../lib/oci.sh"
. "$(dirname "$0")/../lib/registry.sh"
. "$(dirname "$0")/../lib/lazy.sh"

# --- images -----------------------------------------------------------------
lazy_setup base proxy "(ferry image in the registry)"

# --- startup workload on a fresh cache ----------------------------------------
lazy_use startup
M=$SCRATCH/m-startup
if mount_startup fuse "$M"; then
	expect "the mount point is a FUSE mount ($(fstype "$M"))" is_fuse "$M"
	# Not the 1 MiB it was: a fault in a mapped library read the window
	# around it into code nothing ran (performance-log, "FUSE readahead").
	ra=$(cat "/sys/class/bdi/$(mountpoint -d "$M")/read_ahead_kb" 2>&1)
	expect_sh "the mount's kernel readahead is 512 KiB, the largest READ ($ra)" '[ "$ra" = 512 ]'
	startup_workload fuse "$M"
	ferryd_detached
	check "ferry umount (startup)" umount_lazy "$M"
fi

# --- the whole tree, lazily from the registry ----------------------------------
lazy_use tree
M=$SCRATCH/m-tree
if tree_read fuse "$M"; then
	read -r bsize blocks files < <(stat -f -c '%S %b %c' "$M" 2>"$LOG")
	expect_sh "statfs: the size covers the image ($blocks blocks of $bsize B, $files inodes)" \
		'[ $((blocks * bsize)) -ge "$DATA_U" ] && [ "$files" -gt 0 ]'
	expect "the mount is read-only in its options" bash -c \
		'findmnt -n -o OPTIONS --mountpoint "$1" | tr , "\n" | grep -qx ro' _ "$M"
	check_fails "touch MNT/x fails with EROFS" "Read-only file system" touch "$M/x"
	check_fails "appending to a file fails with EROFS" "Read-only file system" \
		bash -c 'echo x >>"$1/etc/os-release"' _ "$M"
	check_fails "rm of a file fails with EROFS" "Read-only file system" rm -f "$M/etc/os-release"
	check_fails "mkdir fails with EROFS" "Read-only file system" mkdir "$M/newdir"
	check_fails "setfattr fails with EROFS" "Read-only file system" \
		python3 -c 'import os,sys; os.setxattr(sys.argv[1], "user.x", b"1")' "$M/opt/c/xattrs"
	check "ferry umount (tree)" umount_lazy "$M"
fi

# --- 16 concurrent readers on a fresh cache, then a remount ----------------------
conc_checks fuse

# --- directory readahead ------------------------------------------------------------
# Files read in directory order are stored in the page cache ahead of the
# reader, from chunks already cached only: the same sorted read of a fresh
# cache fetches exactly what it fetches with readahead off, gives the
# reference bytes, and a reverse read stores nothing.
dra_read() { # MNT ORDER: hashtree of the mount == the reference digests
	hashtree "$1" "$2" 0 >"$SCRATCH/dra.sums" 2>"$LOG" &&
		cmp -s "$SCRATCH/dra.sums" "$SCRATCH/ref.sums"
}
M=$SCRATCH/m-dra
lazy_use dra-off
if check "ferryd --dir-readahead 0" "$FERRYD" --socket "$FSOCK" --log-file "$FLOG" \
	--dir-readahead 0 && check "mount (fresh cache, no directory readahead)" mount_lazy fuse "$PIMG" "$M"; then
	fp_mark
	check "sorted read without directory readahead: the reference digests" dra_read "$M" sorted
	f_off=$(fp_data_bytes)
	n=$(mount_field "$M" readaheadFiles)
	expect_sh "--dir-readahead 0 stores nothing (readaheadFiles $n)" '[ "$n" -eq 0 ]'
	check "ferry umount (no directory readahead)" umount_lazy "$M"
fi
lazy_use dra-on
if check "mount (fresh cache, directory readahead)" mount_lazy fuse "$PIMG" "$M"; then
	fp_mark
	check "sorted read with directory readahead: the reference digests" dra_read "$M" sorted
	f_on=$(fp_data_bytes)
	n=$(mount_field "$M" readaheadFiles)
	b=$(mount_field "$M" readaheadBytes)
	expect_sh "the sorted read was served partly by readahead ($n files, $b B stored)" \
		'[ "$n" -gt 100 ] && [ "$b" -gt 0 ]'
	expect_sh "readahead fetched nothing of its own ($f_on B with it, ${f_off:-?} B without)" \
		'[ "$f_on" -eq "$f_off" ]'
	check "ferry umount (directory readahead)" umount_lazy "$M"
fi
if check "mount again (directory readahead, the cache now complete)" mount_lazy fuse "$PIMG" "$M"; then
	check "reverse read: the reference digests" dra_read "$M" reverse
	n=$(mount_field "$M" readaheadFiles)
	expect_sh "a reverse read stores nothing (readaheadFiles $n)" '[ "$n" -eq 0 ]'
	check "treecmp after the reverse read" timeout 180 python3 "$TREECMP" "$ref" "$M"
	check "ferry umount (directory readahead, reverse)" umount_lazy "$M"
fi

# --- several mounts in one ferryd ----------------------------------------------
lazy_use multi
MA=$SCRATCH/m-a
MB=$SCRATCH/m-b
MC=$SCRATCH/m-c
if check "mount edit (A)" mount_lazy fuse "$IMG" "$MA" &&
	check "mount base (B) through the same daemon" mount_lazy fuse "$BASE" "$MB" &&
	check "mount edit again (C) through the same daemon" mount_lazy fuse "$IMG" "$MC"; then
	n=$(daemon_pids | wc -l)
	expect_sh "one ferryd serves the three mounts ($n running)" '[ "$n" -eq 1 ]'
	files=(usr/bin/bash opt/c/big.bin etc/passwd usr/lib/file/magic.mgc)
	check "A reads the reference bytes" same_files "$ref" "$MA" "${files[@]}"
	check "C (the same image again) reads the reference bytes" same_files "$ref" "$MC" "${files[@]}"
	check "treecmp base == B while A and C are mounted" timeout 180 python3 "$TREECMP" "$refbase" "$MB"
	check "ferry umount A" umount_lazy "$MA"
	check "B still serves after A is gone (treecmp)" timeout 180 python3 "$TREECMP" "$refbase" "$MB"
	check "C still serves after A is gone" same_files "$ref" "$MC" usr/bin/perl "${files[@]}"
	check "ferry umount B" umount_lazy "$MB"
	check "ferry umount C" umount_lazy "$MC"
fi
for m in "$MA" "$MB" "$MC"; do is_mounted "$m" && umount_lazy "$m"; done

# --- dir: and oci: images -------------------------------------------------------
lazy_use local
if mount_converted fuse dir; then
	check "treecmp umoci unpack == dir: FUSE mount" timeout 180 python3 "$TREECMP" "$ref" "$SCRATCH/m-dir"
	check "ferry umount (dir:)" umount_lazy "$SCRATCH/m-dir"
fi
if mount_converted fuse oci; then
	check "treecmp umoci unpack == oci: FUSE mount" timeout 180 python3 "$TREECMP" "$ref" "$SCRATCH/m-oci"
	check "ferry umount (oci:)" umount_lazy "$SCRATCH/m-oci"
fi

# --- prefetch ---------------------------------------------------------------------
lazy_use pfall
M=$SCRATCH/m-pfall
if mount_prefetch_all fuse "$M" "mount --prefetch-all"; then
	check "--prefetch-all: reading files afterwards gives the reference bytes" \
		same_files "$ref" "$M" usr/bin/bash usr/bin/perl opt/c/big.bin
	f=$(fp_data_bytes)
	expect_sh "--prefetch-all: those reads fetched nothing ($f B)" '[ "$f" -eq 0 ]'
	check "ferry umount (prefetch-all)" umount_lazy "$M"
fi

prefetch_files_checks fuse "mount --prefetch-files LIST"

lazy_use pfbw
M=$SCRATCH/m-pfbw
prefetched() { read -r s_read s_fetched s_present s_total s_pf < <(mount_stats "$M") && [ "$s_pf" -gt 0 ]; }
t0=$(now_ms)
fp_mark
if check "mount --prefetch-all --prefetch-bwlimit 1M" mount_lazy fuse "$PIMG" "$M" --prefetch-all \
	--prefetch-bwlimit 1M; then
	expect_sh "--prefetch-bwlimit 1M: the prefetch makes progress" 'poll 15 prefetched'
	while [ $(($(now_ms) - t0)) -lt 6000 ]; do sleep 0.2; done
	f=$(fp_data_bytes)
	read -r s_read s_fetched s_present s_total s_pf < <(mount_stats "$M")
	ms=$(($(now_ms) - t0))
	# The limit is on uncompressed bytes (the stats' bytesPrefetched);
	# compressed ones (the proxy's) are fewer. One 4 MiB step may be
	# ahead of the rate.
	lim=$(((ms + 999) / 1000 * 1048576 + 4194304))
	expect_sh "--prefetch-bwlimit 1M: ${s_pf:-?} B prefetched ($f B fetched) in $ms ms (limit $lim)" \
		'[ "$s_pf" -le "$lim" ] && [ "$f" -le "$lim" ]'
	check "ferry umount during a throttled prefetch" umount_lazy "$M"
fi
# A slow limit: a 4 MiB step is due only after a minute; umount (the
# prefetch told to stop) must not wait for it.
lazy_use pfslow
M=$SCRATCH/m-pfslow
if check "mount --prefetch-all --prefetch-bwlimit 64K" mount_lazy fuse "$PIMG" "$M" --prefetch-all \
	--prefetch-bwlimit 64K; then
	sleep 1
	t0=$(now_ms)
	check "ferry umount during a prefetch throttled to 64K/s" umount_lazy "$M"
	ms=$(($(now_ms) - t0))
	expect_sh "that umount was prompt ($ms ms, < 3 s)" '[ "$ms" -lt 3000 ]'
	is_mounted "$M" && umount "$M"
	# Nothing of that prefetch may linger: the daemon stops promptly.
	dpid=$(daemon_pids | head -n 1)
	t0=$(now_ms)
	[ -n "$dpid" ] && kill -TERM "$dpid" && wait_gone 30 "$dpid"
	ms=$(($(now_ms) - t0))
	expect_sh "then ferryd ${dpid:-?} exits within 5 s of SIGTERM ($ms ms)" \
		'[ -n "$dpid" ] && [ "$ms" -lt 5000 ]'
fi

# --- registries with authentication ------------------------------------------
# The credentials travel to ferryd with the mount; lazy reads long after
# the mount still authenticate. They never show in the list or the log.
lazy_use auth
M=$SCRATCH/m-auth
for mode in basic token; do
	if ! reg_start "$mode" 2>"$LOG"; then
		notok "start docker-registry ($mode auth)"
		diag "$LOG"
		continue
	fi
	AIMG=docker://$REG/ferry/base:v1
	check "convert oci:base -> docker:// ($mode auth)" "$FERRY" convert -q \
		--creds "$REG_USER:$REG_PASS" "oci:$FIX:base" "$AIMG" || continue
	check_fails "mount --mode fuse without credentials fails naming the registry ($mode)" \
		"$REG" mount_lazy fuse "$AIMG" "$M"
	is_mounted "$M" && umount_lazy "$M"
	if check "mount --mode fuse with --creds ($mode)" mount_lazy fuse "$AIMG" "$M" --creds "$REG_USER:$REG_PASS"; then
		check "lazy reads authenticate ($mode)" same_files "$refbase" "$M" usr/bin/bash usr/bin/dpkg
		"$FERRY" mount --list --json "${FERRYD_SOCK_OPT[@]}" >"$SCRATCH/list.json" 2>&1
		expect_sh "the password shows neither in ferry mount --list nor in ferryd's log ($mode)" \
			'[ -s "$SCRATCH/list.json" ] && ! grep -qF -- "$REG_PASS" "$SCRATCH/list.json" "$FLOG"'
		check "ferry umount ($mode)" umount_lazy "$M"
	fi
done

e2e_done
