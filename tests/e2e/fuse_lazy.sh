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
#   - Basic and Bearer auth: credentials reach ferryd, never its log
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
if ! reg_start anon 2>"$LOG"; then
	notok "start docker-registry"
	diag "$LOG"
	e2e_done
fi
check "convert oci:edit -> docker:// (ferry image in the registry)" "$FERRY" convert -q \
	"oci:$FIX:edit" "docker://$REG/ferry/debian:edit" || e2e_done
check "convert oci:base -> docker://" "$FERRY" convert -q \
	"oci:$FIX:base" "docker://$REG/ferry/debian:base"
if ! fp_start 2>"$LOG"; then
	notok "start the counting proxy (faultproxy.py)"
	diag "$LOG"
	e2e_done
fi
IMG=docker://$REG/ferry/debian:edit
PIMG=docker://$PROXY/ferry/debian:edit
BASE=docker://$REG/ferry/debian:base
if ! ref=$(umoci_ref "$FIX:edit" "$SCRATCH/bundle" 2>"$LOG") ||
	! refbase=$(umoci_ref "$FIX:base" "$SCRATCH/bundle-base" 2>>"$LOG"); then
	notok "umoci unpack (reference trees)"
	diag "$LOG"
	e2e_done
fi
if ! image_blobs "$IMG" 2>"$LOG"; then
	notok "ferry inspect --json of the pushed image"
	diag "$LOG"
	e2e_done
fi
echo "# image: data blobs $DATA_C bytes compressed, $DATA_U uncompressed, $DATA_CHUNKS chunks"
hashtree "$ref" sorted 0 >"$SCRATCH/ref.sums" 2>"$LOG" || { notok "hash the reference tree"; diag "$LOG"; }

# --- startup workload on a fresh cache ----------------------------------------
fuse_use startup
M=$SCRATCH/m-startup
t0=$(now_ms)
fp_mark
if check "mount --mode fuse docker:// (through the proxy)" fmount "$PIMG" "$M"; then
	echo "# mount returned after $(($(now_ms) - t0)) ms"
	expect "the mount point is a FUSE mount ($(fstype "$M"))" is_fuse "$M"
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
	if [ -n "$stats" ]; then
		read -r s_read s_fetched s_present s_total s_pf <<<"$stats"
		echo "# startup: read $s_read B through the mount; fetched $s_fetched B (ferryd), $fetched B (proxy) = $((fetched * 100 / DATA_U))% of $DATA_U B uncompressed, $((fetched * 100 / DATA_C))% of $DATA_C B compressed; chunks $s_present/$s_total present"
		expect_sh "ferry's stats: bytes fetched match the registry traffic ($s_fetched vs $fetched)" \
			'[ "$s_fetched" -le $((fetched + 65536)) ] && [ "$s_fetched" -ge $((fetched * 9 / 10)) ]'
		expect_sh "ferry's stats: some bytes read through the mount ($s_read)" '[ "$s_read" -gt 0 ]'
	else
		notok "ferry mount statistics of $M"
		diag "$SCRATCH/stats.err" 5
		echo "# startup: fetched $fetched B (proxy) = $((fetched * 100 / DATA_U))% of $DATA_U B uncompressed"
	fi
	expect_sh "startup fetched < 25% of the image ($fetched of $DATA_U B)" \
		'[ "$fetched" -gt 0 ] && [ "$fetched" -lt $((DATA_U / 4)) ]'
	expect_sh "startup left most chunks absent (${present:-?} of ${chunks:-?} present, ${disk:-?} B on disk)" \
		'[ "$present" -gt 0 ] && [ "$present" -lt $((chunks / 2)) ]'
	dpid=$(fuse_daemon_pids | head -n 1)
	expect_sh "ferryd runs (pid ${dpid:-none}) and is not a child of the test" \
		'[ -n "$dpid" ] && [ "$(ps -o ppid= -p "$dpid" | tr -d " ")" != "$$" ]'
	check "ferry umount (startup)" fumount "$M"
fi

# --- the whole tree, lazily from the registry ----------------------------------
fuse_use tree
M=$SCRATCH/m-tree
if check "mount --mode fuse docker:// (fresh cache)" fmount "$IMG" "$M"; then
	t0=$(now_ms)
	check "treecmp umoci unpack == lazy FUSE mount" timeout 180 python3 "$TREECMP" "$ref" "$M"
	echo "# treecmp over the lazy mount took $(($(now_ms) - t0)) ms"
	read -r present chunks disk < <(fcache_sum)
	# Chunks of lower-layer files that an upper layer deleted are never
	# read; they are few in this image.
	expect_sh "after a full read (nearly) every chunk is present ($present of $chunks)" \
		'[ "$chunks" = "$DATA_CHUNKS" ] && [ "$present" -ge $((chunks * 95 / 100)) ]'
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
	check "ferry umount (tree)" fumount "$M"
fi

# --- 16 concurrent readers on a fresh cache -------------------------------------
fuse_use conc
M=$SCRATCH/m-conc
if check "mount --mode fuse (fresh cache, 16 readers)" fmount "$PIMG" "$M"; then
	fp_mark
	t0=$(now_ms)
	pids=()
	modes=(sorted reverse shuffle pread)
	for i in $(seq 0 15); do
		timeout -k 5 170 python3 -c "$FUSE_HASHTREE" "$M" "${modes[$((i % 4))]}" "$i" \
			>"$SCRATCH/r$i.sums" 2>"$SCRATCH/r$i.err" &
		pids+=($!)
	done
	bad=()
	for i in $(seq 0 15); do
		wait "${pids[$i]}" || bad+=("reader $i (${modes[$((i % 4))]}): exit $?")
		cmp -s "$SCRATCH/ref.sums" "$SCRATCH/r$i.sums" || bad+=("reader $i: digests differ")
	done
	echo "# 16 readers took $(($(now_ms) - t0)) ms, $(wc -l <"$SCRATCH/ref.sums") files each"
	if [ ${#bad[@]} -eq 0 ]; then
		ok "16 concurrent readers: no errors, every digest equals the reference"
	else
		notok "16 concurrent readers: no errors, every digest equals the reference"
		printf '    %s\n' "${bad[@]}" | head -n 20
		for i in $(seq 0 15); do
			[ -s "$SCRATCH/r$i.err" ] && diag "$SCRATCH/r$i.err" 5 && break
		done
		for i in $(seq 0 15); do
			cmp -s "$SCRATCH/ref.sums" "$SCRATCH/r$i.sums" ||
				{ diff "$SCRATCH/ref.sums" "$SCRATCH/r$i.sums" | head -n 10 | sed 's/^/    /'; break; }
		done
	fi
	fetched=$(fp_data_bytes)
	echo "# 16 readers fetched $fetched B from the registry (data blobs: $DATA_C B)"
	expect_sh "16 readers fetched each chunk about once ($fetched B, blobs $DATA_C B)" \
		'[ "$fetched" -ge $((DATA_C * 9 / 10)) ] && [ "$fetched" -le $((DATA_C * 11 / 10)) ]'

	# --- umount, mount again with the same cache: nothing fetched
	read -r present chunks disk_before < <(fcache_sum)
	check "ferry umount (16 readers)" fumount "$M"
	if check "mount again with the same cache" fmount "$PIMG" "$M"; then
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
			expect_sh "remount: ferry's stats say 0 bytes fetched, $s_read read, $s_present/$s_total chunks" \
				'[ "$s_fetched" -eq 0 ] && [ "$s_read" -gt 0 ] && [ "$s_present" = "$s_total" ]'
		else
			notok "remount: ferry's stats of $M"
		fi
		check "ferry umount (remount)" fumount "$M"
	fi
fi

# --- several mounts in one ferryd ----------------------------------------------
fuse_use multi
MA=$SCRATCH/m-a
MB=$SCRATCH/m-b
MC=$SCRATCH/m-c
if check "mount edit (A)" fmount "$IMG" "$MA" &&
	check "mount base (B) through the same daemon" fmount "$BASE" "$MB" &&
	check "mount edit again (C) through the same daemon" fmount "$IMG" "$MC"; then
	n=$(fuse_daemon_pids | wc -l)
	expect_sh "one ferryd serves the three mounts ($n running)" '[ "$n" -eq 1 ]'
	files=(usr/bin/bash opt/c/big.bin etc/passwd usr/lib/file/magic.mgc)
	check "A reads the reference bytes" same_files "$ref" "$MA" "${files[@]}"
	check "C (the same image again) reads the reference bytes" same_files "$ref" "$MC" "${files[@]}"
	check "treecmp base == B while A and C are mounted" timeout 180 python3 "$TREECMP" "$refbase" "$MB"
	check "ferry umount A" fumount "$MA"
	check "B still serves after A is gone (treecmp)" timeout 180 python3 "$TREECMP" "$refbase" "$MB"
	check "C still serves after A is gone" same_files "$ref" "$MC" usr/bin/perl "${files[@]}"
	check "ferry umount B" fumount "$MB"
	check "ferry umount C" fumount "$MC"
fi
for m in "$MA" "$MB" "$MC"; do is_mounted "$m" && fumount "$m"; done

# --- dir: and oci: images -------------------------------------------------------
fuse_use local
if check "convert to dir:" "$FERRY" convert -q "oci:$FIX:edit" "dir:$SCRATCH/out" &&
	check "mount --mode fuse dir:" fmount "dir:$SCRATCH/out" "$SCRATCH/m-dir"; then
	check "treecmp umoci unpack == dir: FUSE mount" timeout 180 python3 "$TREECMP" "$ref" "$SCRATCH/m-dir"
	check "ferry umount (dir:)" fumount "$SCRATCH/m-dir"
fi
if check "convert to oci:" "$FERRY" convert -q "oci:$FIX:edit" "oci:$SCRATCH/layout:edit" &&
	check "mount --mode fuse oci:" fmount "oci:$SCRATCH/layout:edit" "$SCRATCH/m-oci"; then
	check "treecmp umoci unpack == oci: FUSE mount" timeout 180 python3 "$TREECMP" "$ref" "$SCRATCH/m-oci"
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
if check "mount --prefetch-all" fmount "$PIMG" "$M" --prefetch-all; then
	t0=$SECONDS
	if poll 60 all_present; then
		ok "--prefetch-all: every chunk present without reads (after $((SECONDS - t0)) s)"
	else
		notok "--prefetch-all: every chunk present without reads (waited 60 s)"
		echo "    cache: $(fcache_sum) (present chunks, total, disk bytes)"
	fi
	fp_mark
	check "--prefetch-all: reading files afterwards gives the reference bytes" \
		same_files "$ref" "$M" usr/bin/bash usr/bin/perl opt/c/big.bin
	f=$(fp_data_bytes)
	expect_sh "--prefetch-all: those reads fetched nothing ($f B)" '[ "$f" -eq 0 ]'
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
elif check "mount --prefetch-files LIST" fmount "$PIMG" "$M" --prefetch-files "$SCRATCH/prefetch.list"; then
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

fuse_use pfbw
M=$SCRATCH/m-pfbw
prefetched() { read -r s_read s_fetched s_present s_total s_pf < <(fuse_stats "$M") && [ "$s_pf" -gt 0 ]; }
t0=$(now_ms)
fp_mark
if check "mount --prefetch-all --prefetch-bwlimit 1M" fmount "$PIMG" "$M" --prefetch-all \
	--prefetch-bwlimit 1M; then
	expect_sh "--prefetch-bwlimit 1M: the prefetch makes progress" 'poll 15 prefetched'
	while [ $(($(now_ms) - t0)) -lt 6000 ]; do sleep 0.2; done
	f=$(fp_data_bytes)
	read -r s_read s_fetched s_present s_total s_pf < <(fuse_stats "$M")
	ms=$(($(now_ms) - t0))
	# The limit is on uncompressed bytes (the stats' bytesPrefetched);
	# compressed ones (the proxy's) are fewer. One 4 MiB step may be
	# ahead of the rate.
	lim=$(((ms + 999) / 1000 * 1048576 + 4194304))
	expect_sh "--prefetch-bwlimit 1M: ${s_pf:-?} B prefetched ($f B fetched) in $ms ms (limit $lim)" \
		'[ "$s_pf" -le "$lim" ] && [ "$f" -le "$lim" ]'
	check "ferry umount during a throttled prefetch" fumount "$M"
fi
# A slow limit: a 4 MiB step is due only after a minute; umount (the
# prefetch told to stop) must not wait for it.
fuse_use pfslow
M=$SCRATCH/m-pfslow
if check "mount --prefetch-all --prefetch-bwlimit 64K" fmount "$PIMG" "$M" --prefetch-all \
	--prefetch-bwlimit 64K; then
	sleep 1
	t0=$(now_ms)
	check "ferry umount during a prefetch throttled to 64K/s" fumount "$M"
	ms=$(($(now_ms) - t0))
	expect_sh "that umount was prompt ($ms ms, < 3 s)" '[ "$ms" -lt 3000 ]'
	is_mounted "$M" && umount "$M"
	# Nothing of that prefetch may linger: the daemon stops promptly.
	dpid=$(fuse_daemon_pids | head -n 1)
	t0=$(now_ms)
	[ -n "$dpid" ] && kill -TERM "$dpid" && wait_gone 30 "$dpid"
	ms=$(($(now_ms) - t0))
	expect_sh "then ferryd ${dpid:-?} exits within 5 s of SIGTERM ($ms ms)" \
		'[ -n "$dpid" ] && [ "$ms" -lt 5000 ]'
fi

# --- registries with authentication ------------------------------------------
# The credentials travel to ferryd with the mount; lazy reads long after
# the mount still authenticate. They never show in the list or the log.
fuse_use auth
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
		"$REG" fmount "$AIMG" "$M"
	is_mounted "$M" && fumount "$M"
	if check "mount --mode fuse with --creds ($mode)" fmount "$AIMG" "$M" --creds "$REG_USER:$REG_PASS"; then
		check "lazy reads authenticate ($mode)" same_files "$refbase" "$M" usr/bin/bash usr/bin/dpkg
		"$FERRY" mount --list --json "${FUSE_SOCK_OPT[@]}" >"$SCRATCH/list.json" 2>&1
		expect_sh "the password shows neither in ferry mount --list nor in ferryd's log ($mode)" \
			'[ -s "$SCRATCH/list.json" ] && ! grep -qF -- "$REG_PASS" "$SCRATCH/list.json" "$FLOG"'
		check "ferry umount ($mode)" fumount "$M"
	fi
done

e2e_done
