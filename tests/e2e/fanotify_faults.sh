#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# shellcheck disable=SC2016,SC2034 # expect_sh evaluates its quoted condition
# Faults under lazy kernel mounts (ferry mount --mode fanotify: file-backed
# EROFS over sparse cache files filled by ferryd on FAN_PRE_ACCESS events,
# the fanotify group held open by a keeper process too), with
# docker-registry on 127.0.0.1:
#   - a cache dir on tmpfs (no pre-content events there): the mount fails
#     naming the cache dir, nothing stays mounted
#   - a chunk damaged in the registry's own copy of a blob: reads of the
#     file fail with EIO and never deliver wrong bytes or zeros, the rest
#     of that file and every other file read right, and once the registry
#     is repaired the file reads right (nothing bad was cached)
#   - ferryd killed with SIGKILL while readers go over the tree and the
#     registry refuses everything (through tests/tools/faultproxy.py), so
#     that no new ferryd can take the mount over (daemon_failover.sh shows
#     the takeover): the readers end (no hang) with EIO or right bytes,
#     never wrong ones or zeros; the mount stays, cached files read right,
#     uncached ones fail with EIO; ferry umount works without a daemon,
#     the keeper then exits, and a new mount over the same cache reads
#     the whole tree right
#   - the keeper killed with SIGKILL during reads: ferryd starts a new one
#     within ~2 s, the reads all succeed and are right; the new keeper
#     stands in for ferryd when that is killed in turn (the registry
#     refusing a successor again)
. "$(dirname "$0")/../lib/common.sh"
. "$(dirname "$0")/../lib/oci.sh"
. "$(dirname "$0")/../lib/registry.sh"
. "$(dirname "$0")/../lib/lazy.sh"

lazy_setup proxy
# The readers below go over /usr; /opt/c/big.bin has a blob of its own, so
# none of them makes it present.
if ! hashtree "$ref/usr" sorted 0 >"$SCRATCH/usr.sums" 2>"$LOG"; then
	notok "hash the reference tree's /usr"
	diag "$LOG"
	e2e_done
fi
CACHED=usr/bin/bash

# --- a cache dir on tmpfs ------------------------------------------------------
lazy_use tmpfs
M=$SCRATCH/m-tmpfs
if ! mount -t tmpfs -o size=64m ferry-e2e "$FCACHE" 2>"$LOG"; then
	notok "mount a tmpfs for the cache dir"
	diag "$LOG"
else
	check_fails "mount --mode fanotify with the cache dir on tmpfs fails naming it" \
		"$FCACHE" mount_lazy fanotify "$IMG" "$M"
	expect_sh "nothing is mounted at MNT after that" '! is_mounted "$M"'
	left=$(keeper_pids)
	expect_sh "no keeper process stays behind (${left:-none})" '[ -z "$left" ]'
	is_mounted "$M" && umount_lazy "$M"
	umount "$FCACHE"
fi

# --- a damaged chunk inside the registry ------------------------------------
lazy_use corrupt
M=$SCRATCH/m-corrupt
if mount_damaged fanotify "$M"; then
	damaged_reads "$M"
	n=$(daemon_pids | wc -l)
	kpid=$(keeper_pid "$M" 2>&1)
	expect_sh "ferryd ($n) and its keeper ($kpid) still run after the errors" \
		'[ "$n" -eq 1 ] && is_keeper "$kpid"'
	log_names_damage
	reg_repair_chunk
	check "after the registry is repaired the file reads right (within 3 s)" poll 3 reread "$BIG"
	check "ferry umount (damaged chunk)" umount_lazy "$M"
fi
[ -n "${DMG_STORED:-}" ] && reg_repair_chunk

# --- ferryd killed during reads ----------------------------------------------
# The moment to kill: a tenth of the chunks present, the readers busy.
mid_read() {
	local p c d
	read -r p c d < <(fcache_sum 2>/dev/null) || return 1
	[ "$p" -ge $((c / 10)) ]
}
lazy_use kill
M=$SCRATCH/m-kill
if check "mount --mode fanotify (to be killed)" mount_lazy fanotify "$PIMG" "$M"; then
	check "a file read before the kill reads right" read_check "$M/$CACHED" "$ref/$CACHED"
	dpid=$(daemon_pids | head -n 1)
	kpid=$(keeper_pid "$M" 2>&1)
	readers_start kill "$M/usr" 90 sorted reverse shuffle pread
	poll 30 mid_read
	if [ -z "$dpid" ] || ! is_keeper "$kpid"; then
		notok "find ferryd (${dpid:-none}) and its keeper ($kpid) to kill"
		kill "${RD_PIDS[@]}" 2>/dev/null
		readers_wait
	else
		busy=0
		for p in "${RD_PIDS[@]}"; do kill -0 "$p" 2>/dev/null && busy=$((busy + 1)); done
		# No successor can open the image (the registry answers 404 and
		# the cache lost the manifest and bootstrap ferryd keeps for
		# takeovers): the keeper serves alone.
		fp_set 404 count=-1
		rm -rf "$FCACHE/meta" "$FCACHE/bootstraps"
		kill -KILL "$dpid"
		t0=$(now_ms)
		expect_sh "ferryd $dpid killed with SIGKILL while $busy of 4 readers are busy" \
			'wait_gone 5 "$dpid" && [ "$busy" -gt 0 ]'
		readers_wait
		ms=$(($(now_ms) - t0))
		expect_sh "the readers ended $ms ms after the kill (exits ${RD_RC[*]}), not a hang" \
			'[ "$ms" -lt 30000 ]'
		readers_no_wrong_bytes "readers across the kill: right bytes or EIO, never wrong bytes or zeros" \
			"$SCRATCH/usr.sums"
		t=$(fstype "$M")
		expect_sh "the mount stays with ferryd dead (${t:-not mounted})" '[ "$t" = erofs ]'
		expect_sh "the keeper $kpid still runs" 'is_keeper "$kpid"'
		check "with ferryd dead a file read before reads right (its pages dropped)" \
			reread "$CACHED"
		read_expect_eio "with ferryd dead a file never read fails with EIO, no wrong bytes" \
			"$M/$BIG" "$ref/$BIG" 30
		t0=$(now_ms)
		check "ferry umount with no ferryd running" umount_lazy "$M"
		ms=$(($(now_ms) - t0))
		expect_sh "that umount was prompt ($ms ms)" '[ "$ms" -lt 10000 ]'
		t0=$(now_ms)
		wait_gone 10 "$kpid"
		ms=$(($(now_ms) - t0))
		expect_sh "the keeper $kpid exits by itself after the umount ($ms ms, < 5 s)" \
			'! kill -0 "$kpid" 2>/dev/null && [ "$ms" -lt 5000 ]'
		fp_set none
		if check "mount again over the same cache (a new ferryd)" mount_lazy fanotify "$IMG" "$M"; then
			npid=$(daemon_pids | head -n 1)
			nkpid=$(keeper_pid "$M" 2>&1)
			expect_sh "a new ferryd (${npid:-none}, was $dpid) and keeper ($nkpid, was $kpid) serve it" \
				'[ -n "$npid" ] && [ "$npid" != "$dpid" ] && is_keeper "$nkpid" && [ "$nkpid" != "$kpid" ]'
			check "treecmp after the crash and remount" \
				timeout 180 python3 "$TREECMP" "$ref" "$M"
			check "ferry umount (after the crash)" umount_lazy "$M"
		fi
	fi
fi

# --- the keeper killed during reads --------------------------------------------
lazy_use keeper
M=$SCRATCH/m-keeper
if check "mount --mode fanotify (its keeper to be killed)" mount_lazy fanotify "$PIMG" "$M"; then
	check "a file read before the kill reads right" read_check "$M/$CACHED" "$ref/$CACHED"
	dpid=$(daemon_pids | head -n 1)
	kpid=$(keeper_pid "$M" 2>&1)
	k2=
	readers_start keeper "$M/usr" 120 sorted reverse shuffle pread
	poll 30 mid_read
	if ! is_keeper "$kpid"; then
		notok "find the keeper to kill ($kpid)"
	else
		busy=0
		for p in "${RD_PIDS[@]}"; do kill -0 "$p" 2>/dev/null && busy=$((busy + 1)); done
		kill -KILL "$kpid"
		t0=$(now_ms)
		NEW_KEEPER=
		poll 10 keeper_replaced "$M" "$kpid"
		ms=$(($(now_ms) - t0))
		k2=$NEW_KEEPER
		expect_sh "ferryd started a new keeper (${k2:-none}, was $kpid) $ms ms after the kill (< 3 s; $busy of 4 readers busy)" \
			'[ -n "$k2" ] && [ "$k2" != "$kpid" ] && is_keeper "$k2" && [ "$ms" -lt 3000 ]'
		expect_sh "the killed keeper $kpid is gone (reaped)" 'wait_gone 5 "$kpid"'
	fi
	readers_wait
	readers_agree "readers across the keeper's death: no errors, every digest right" \
		"$SCRATCH/usr.sums"
	n=$(daemon_pids)
	expect_sh "the same ferryd still serves ($n, was $dpid)" '[ "$n" = "$dpid" ]'
	# The new keeper stands in for ferryd as the first one would.
	if [ -n "$dpid" ] && is_keeper "${k2:-none}"; then
		fp_set 404 count=-1
		kill -KILL "$dpid"
		expect_sh "then ferryd $dpid killed with SIGKILL" 'wait_gone 5 "$dpid"'
		check "with ferryd dead the new keeper lets a cached file read right" reread "$CACHED"
		read_expect_eio "with ferryd dead the new keeper fails a file never read with EIO" \
			"$M/$BIG" "$ref/$BIG" 30
		check "ferry umount with no ferryd running" umount_lazy "$M"
		expect_sh "the new keeper $k2 exits by itself after the umount (within 5 s)" \
			'wait_gone 5 "$k2"'
		fp_set none
	else
		check "ferry umount (keeper)" umount_lazy "$M"
	fi
fi

e2e_done
