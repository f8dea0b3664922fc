#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# shellcheck disable=SC2016,SC2034 # expect_sh evaluates its quoted condition
# Faults under lazy FUSE mounts (ferry mount --mode fuse, ferryd), with
# docker-registry on 127.0.0.1:
#   - a chunk damaged in the registry's own copy of a blob: reads of the
#     file fail with EIO and never deliver wrong bytes, the rest of that
#     file and every other file read right, and once the registry is
#     repaired the file reads right (nothing bad was cached)
#   - the same under directory readahead: a directory read in order with
#     one file damaged fails the files of that frame only, and readahead
#     never stores them
#   - ferryd and its keeper killed with SIGKILL during reads (no successor:
#     daemon_failover.sh shows one): readers fail instead of
#     hanging, ferry umount removes the dead mount, a new mount (a new
#     daemon) over the same cache reads the whole tree right, and the
#     cache the dead daemon left is right as the kernel reads it
#   - the registry failing (503), not answering, stalling (before the
#     body, and after part of every answer), then gone (through
#     tests/tools/faultproxy.py): uncached reads fail with EIO within a
#     bound (--retries 2 --stall-timeout 5), cached files keep reading
#     right, other reads are not blocked by a waiting one, a file whose
#     fetches failed reads right once the registry is back; SIGTERM ends
#     ferryd promptly even while a fetch stalls
. "$(dirname "$0")/../lib/common.sh"
. "$(dirname "$0")/../lib/oci.sh"
. "$(dirname "$0")/../lib/registry.sh"
. "$(dirname "$0")/../lib/lazy.sh"

lazy_setup proxy
export -f read_check

# --- a damaged chunk inside the registry ------------------------------------
# One byte flipped in the middle of $BIG's first chunk's compressed range
# in the registry's copy of its blob.
lazy_use corrupt
M=$SCRATCH/m-corrupt
if mount_damaged fuse "$M"; then
	damaged_reads "$M"
	n=$(daemon_pids | wc -l)
	expect_sh "ferryd still runs after the errors" '[ "$n" -eq 1 ]'
	log_names_damage
	reg_repair_chunk
	check "after the registry is repaired the file reads right" reread "$BIG"
	check "ferry umount (damaged chunk)" umount_lazy "$M"
fi
[ -n "${DMG_STORED:-}" ] && reg_repair_chunk

# --- a damaged chunk under directory readahead --------------------------------
# /usr/bin read in directory order with one file's chunk damaged (a file
# small enough for readahead, in a frame it shares with its neighbours):
# readahead stores only verified chunks, so the files of that frame fail
# with EIO, the damaged one again when read once more, and every other
# file gives the reference bytes.
SMALL=usr/bin/mv
lazy_use corrupt-dra
M=$SCRATCH/m-corrupt-dra
DMG_STORED=
if ! reg_damage_chunk "$IMG" "$SMALL" 2>"$LOG"; then
	notok "damage the first chunk of /$SMALL in the registry"
	diag "$LOG"
elif check "mount --mode fuse with a damaged chunk of /$SMALL" mount_lazy fuse "$IMG" "$M"; then
	hashtree "$ref/usr/bin" sorted 0 >"$SCRATCH/bin.ref" 2>/dev/null
	hashtree "$M/usr/bin" sorted 0 >"$SCRATCH/bin.got" 2>"$SCRATCH/bin.err"
	errs=$(grep '^ERROR' "$SCRATCH/bin.err" | cut -d: -f1 | sed 's/^ERROR //' | tr '\n' ' ')
	nerr=$(grep -c '^ERROR' "$SCRATCH/bin.err")
	outside=
	for f in $errs; do
		in_damaged_frame "$IMG" "usr/bin/$f" || outside="$outside $f"
	done
	expect_sh "sorted read of /usr/bin: ${SMALL##*/} and only files sharing its frame fail, all with EIO (failed: ${errs:-none}; outside the frame:${outside:- none})" \
		'grep -q "^ERROR ${SMALL##*/}: .*Input/output error" "$SCRATCH/bin.err" &&
		 [ -z "$outside" ] &&
		 [ "$(grep "^ERROR" "$SCRATCH/bin.err" | grep -vc "Input/output error")" -eq 0 ]'
	wrong=$(grep -cvxFf "$SCRATCH/bin.ref" "$SCRATCH/bin.got")
	got=$(wc -l <"$SCRATCH/bin.got")
	expect_sh "the other $got files give the reference digests ($wrong wrong)" \
		'[ "$wrong" -eq 0 ] && [ "$got" -eq $(($(wc -l <"$SCRATCH/bin.ref") - nerr)) ]'
	n=$(mount_field "$M" readaheadFiles)
	expect_sh "readahead served part of that read ($n files stored)" '[ "$n" -gt 0 ]'
	read_expect_eio "the damaged file fails again (readahead never stored it)" \
		"$M/$SMALL" "$ref/$SMALL"
	check "ferry umount (damaged chunk, readahead)" umount_lazy "$M"
fi
[ -n "${DMG_STORED:-}" ] && reg_repair_chunk

# --- ferryd killed during reads ----------------------------------------------
lazy_use kill
M=$SCRATCH/m-kill
if check "mount --mode fuse (to be killed)" mount_lazy fuse "$IMG" "$M"; then
	timeout -k 5 90 python3 -c "$HASHTREE_PY" "$M/usr" sorted 0 \
		>/dev/null 2>"$SCRATCH/kill-reader.err" &
	rpid=$!
	sleep 1
	dpid=$(daemon_pids | head -n 1)
	if [ -z "$dpid" ]; then
		notok "find ferryd to kill"
	else
		kill -0 "$rpid" 2>/dev/null && busy=busy || busy="done already"
		# With its keeper: no successor (daemon_failover.sh shows one).
		kpid=$(keeper_pid "$M" 2>/dev/null)
		kill -KILL "$dpid" ${kpid:+"$kpid"}
		expect_sh "ferryd $dpid and its keeper ${kpid:-none} killed with SIGKILL during a read (reader $busy)" \
			'wait_gone 5 "$dpid" && [ -n "$kpid" ]'
		t0=$(now_ms)
		wait_gone 30 "$rpid"
		wait "$rpid"
		rrc=$?
		ms=$(($(now_ms) - t0))
		expect_sh "the reader ended (exit $rrc) $ms ms after the kill, not a hang" \
			'[ "$ms" -lt 20000 ] && [ "$rrc" -lt 124 ]'
		echo "    reader: $(tail -n 1 "$SCRATCH/kill-reader.err")"
		check "ferry umount of the dead mount" umount_lazy "$M"
		if check "mount again over the same cache (a new ferryd)" mount_lazy fuse "$IMG" "$M"; then
			npid=$(daemon_pids | head -n 1)
			expect_sh "a new ferryd serves it (${npid:-none}, was $dpid)" \
				'[ -n "$npid" ] && [ "$npid" != "$dpid" ]'
			check "treecmp after the crash and remount" \
				timeout 180 python3 "$TREECMP" "$ref" "$M"
			check "ferry umount (after the crash)" umount_lazy "$M"
		fi
		# The kernel reads the cache data files directly, trusting every
		# chunk marked present: nothing unverified may be marked.
		mkdir -p "$SCRATCH/m-local"
		if check "mount --mode local over the cache the killed daemon left" \
			timeout 120 "$FERRY" mount --mode local "$IMG" "$SCRATCH/m-local" --cache-dir "$FCACHE"; then
			check "treecmp of the kernel mount of that cache" \
				timeout 180 python3 "$TREECMP" "$ref" "$SCRATCH/m-local"
			check "ferry umount (local)" umount_lazy "$SCRATCH/m-local"
		fi
	fi
	kill "$rpid" 2>/dev/null
	wait "$rpid" 2>/dev/null
fi

# --- the registry failing, hanging, gone -----------------------------------------
CACHED=usr/bin/bash
T1=usr/bin/perl
T2=usr/lib/file/magic.mgc
# timed_read FILE REF [SECS]: read_check bounded by SECS (default 120);
# sets OUT, RC and MS.
timed_read() {
	local t0
	t0=$(now_ms)
	OUT=$(timeout -k 5 "${3:-120}" bash -c 'read_check "$@"' _ "$1" "$2" 2>&1)
	RC=$?
	MS=$(($(now_ms) - t0))
	[ -n "$OUT" ] || OUT="no answer (killed after ${3:-120} s)"
}
# A fault phase: the proxy's rule, then a pause, so that no short-lived
# memory of an earlier failure answers in the registry's place; asked
# says whether the registry met the fault since.
fault_phase() {
	fp_set "$@"
	sleep 1
	FAULTS0=$(fp_stat faults)
}
asked() { [ "$(fp_stat faults)" -gt "$FAULTS0" ]; }
eio_in_time() { [[ $OUT == "error EIO after "*" match" ]] && [ "$MS" -lt 60000 ]; }
eio_fast() { eio_in_time && asked; }
# A cached file read again through the daemon: sets RC, MS.
cached_read() {
	drop_pages "$M/$CACHED"
	timed_read "$M/$CACHED" "$ref/$CACHED" 30
}
lazy_use gone
M=$SCRATCH/m-gone
FETCH_OPTS=(--retries 2 --stall-timeout 5)
if check "mount through the proxy with ${FETCH_OPTS[*]}" mount_lazy fuse "$PIMG" "$M" "${FETCH_OPTS[@]}"; then
	check "a file read while the registry is up" read_check "$M/$CACHED" "$ref/$CACHED"

	fault_phase 503 count=-1 path=/blobs/
	timed_read "$M/$T1" "$ref/$T1"
	expect_sh "registry answers 503: an uncached file fails with EIO in $MS ms (< 60 s): $OUT" eio_fast
	cached_read
	expect_sh "registry answers 503: a cached file still reads right ($MS ms)" '[ "$RC" -eq 0 ]'

	# A registry that takes the request and never answers.
	fault_phase slow count=-1 path=/blobs/ delay=60
	t0=$(now_ms)
	timeout -k 5 120 bash -c 'read_check "$@"' _ "$M/$T1" "$ref/$T1" >"$SCRATCH/slow.out" 2>&1 &
	spid=$!
	sleep 1
	cached_read
	expect_sh "a cached file reads ($MS ms) while another read waits for the registry" \
		'[ "$RC" -eq 0 ] && [ "$MS" -lt 5000 ]'
	wait "$spid"
	OUT=$(cat "$SCRATCH/slow.out")
	MS=$(($(now_ms) - t0))
	expect_sh "registry never answers: the read fails with EIO in $MS ms (< 60 s): $OUT" eio_fast

	# Headers, then no body.
	fault_phase stall count=-1 path=/blobs/ frac=0 delay=60
	timed_read "$M/$T1" "$ref/$T1"
	expect_sh "registry stalls before the body: the read fails with EIO in $MS ms (< 60 s): $OUT" eio_fast

	fp_set none
	check "registry back: the file whose fetches failed reads right (within 10 s)" poll 10 reread "$T1"

	# A tenth of each answer, then a stall: every attempt makes a little
	# progress; the read must still end within the bound.
	fault_phase stall count=-1 path=/blobs/ frac=0.1 delay=60
	timed_read "$M/$T2" "$ref/$T2" 70
	expect_sh "registry stalls after part of each answer: the read fails with EIO in $MS ms (< 60 s): $OUT" eio_fast

	# SIGTERM while a read waits on a stalled fetch: ferryd unmounts and
	# exits, the reader gets an error instead of hanging.
	sleep 1
	timeout -k 5 120 bash -c 'read_check "$@"' _ "$M/$T2" "$ref/$T2" >"$SCRATCH/term.out" 2>&1 &
	spid=$!
	sleep 2
	dpid=$(daemon_pids | head -n 1)
	kill -0 "$spid" 2>/dev/null && busy="waiting" || busy="ended already: $(cat "$SCRATCH/term.out")"
	t0=$(now_ms)
	[ -n "$dpid" ] && kill -TERM "$dpid"
	wait_gone 60 "$dpid"
	ms=$(($(now_ms) - t0))
	expect_sh "ferryd ${dpid:-?} exits within 10 s of SIGTERM while a read waits ($ms ms; reader $busy)" \
		'[ -n "$dpid" ] && [ "$ms" -lt 10000 ]'
	[ -n "$dpid" ] && kill -KILL "$dpid" 2>/dev/null
	wait_gone 10 "$spid"
	expect_sh "the waiting reader got an error: $(cat "$SCRATCH/term.out")" \
		'! kill -0 "$spid" 2>/dev/null && grep -q "^error" "$SCRATCH/term.out"'
	kill "$spid" 2>/dev/null
	wait "$spid" 2>/dev/null
	expect_sh "SIGTERM removed its mount" '! is_mounted "$M"'
	is_mounted "$M" && umount_lazy "$M"
	fp_set none
fi
# The registry gone for good after the mount.
if check "mount again over the same cache (${FETCH_OPTS[*]})" mount_lazy fuse "$PIMG" "$M" "${FETCH_OPTS[@]}"; then
	kill -TERM "$FP_PID"
	wait_gone 5 "$FP_PID"
	timed_read "$M/$T2" "$ref/$T2"
	expect_sh "registry gone: an uncached file fails with EIO in $MS ms (< 60 s): $OUT" eio_in_time
	check "registry gone: cached files still read right" \
		same_files "$ref" "$M" "$CACHED" "$T1"
	check "registry gone: the tree still lists (find /usr)" bash -c \
		'diff <(cd "$1" && find usr | sort) <(cd "$2" && timeout 60 find usr | sort)' _ "$ref" "$M"
	t0=$(now_ms)
	check "ferry umount with the registry gone" umount_lazy "$M"
	ms=$(($(now_ms) - t0))
	expect_sh "that umount was prompt ($ms ms)" '[ "$ms" -lt 10000 ]'
fi

e2e_done
