#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# shellcheck disable=SC2016 # expect_sh evaluates its quoted condition
# Lazy mounts across a slow network: docker-registry on 127.0.0.1 behind
# tests/tools/wanproxy.py (5 ms each way, 200 Mbit/s), for --mode fuse and
# --mode fanotify, each on a fresh cache:
#   - 8 concurrent readers in different orders agree with the reference
#     digests, and the proxy saw more than one request in flight at once
#     (ferryd's fetches overlap instead of queueing behind each other)
#   - the whole tree then equals umoci unpack (treecmp)
#   - one reader alone, reading files one after another, still has more
#     than one request in flight (readahead fetches ahead of it), most of
#     them readahead's (fetchesAhead), and reads the reference bytes
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/oci_lib.sh"
. "$(dirname "$0")/registry_lib.sh"
. "$(dirname "$0")/lazy_lib.sh"

lazy_setup "(ferry image in the registry)"
if ! wp_start 5 200 2>"$LOG"; then
	notok "start the WAN proxy (wanproxy.py)"
	diag "$LOG"
	e2e_done
fi
WIMG=docker://$WAN/ferry/debian:edit

wan_checks() { # MODE
	local mode=$1 m=$SCRATCH/m-wan-$1 t0 reqs inflight conns
	lazy_use "wan-$mode"
	check "mount --mode $mode through the WAN proxy (fresh cache)" \
		ferryd_mount "$mode" "$WIMG" "$m" || return 1
	wp_stat requests reset >/dev/null
	t0=$(now_ms)
	readers_start "wan-$mode" "$m" 170 sorted reverse shuffle pread sorted reverse shuffle pread
	readers_wait
	echo "# $mode: 8 readers took $(($(now_ms) - t0)) ms"
	readers_agree "$mode: 8 concurrent readers through the WAN proxy: every digest equals the reference" \
		"$SCRATCH/ref.sums"
	reqs=$(wp_stat requests)
	inflight=$(wp_stat max_inflight)
	conns=$(wp_stat max_open)
	echo "# $mode: $reqs requests, at most $inflight in flight, $conns connections open at once"
	expect_sh "$mode: fetches overlap (at most $inflight requests in flight at once, > 1)" \
		'[ "$inflight" -gt 1 ] && [ "$conns" -gt 1 ]'
	check "$mode: treecmp umoci unpack == the mount read through the WAN proxy" \
		timeout 180 python3 "$TREECMP" "$ref" "$m"
	check "ferry umount ($mode)" fumount "$m"
}

# One sequential reader of /usr/lib's files (sorted) on a fresh cache.
one_reader() { # MODE
	local mode=$1 m=$SCRATCH/m-wan1-$1 inflight fetches ahead
	lazy_use "wan1-$mode"
	check "mount --mode $mode through the WAN proxy (fresh cache, one reader)" \
		ferryd_mount "$mode" "$WIMG" "$m" || return 1
	wp_stat requests reset >/dev/null
	check "$mode: one reader: every file of /usr/lib has the reference bytes" bash -c \
		'diff <(cd "$1/usr/lib" && find . -type f | sort | head -400 | xargs -d "\n" sha256sum) \
		      <(cd "$2/usr/lib" && find . -type f | sort | head -400 | xargs -d "\n" sha256sum)' \
		_ "$ref" "$m"
	inflight=$(wp_stat max_inflight)
	fetches=$(mount_field "$m" fetches)
	ahead=$(mount_field "$m" fetchesAhead)
	echo "# $mode, one reader: $(wp_stat requests) requests ($fetches by ferryd, $ahead readahead), at most $inflight in flight"
	expect_sh "$mode: one reader, yet requests overlap (at most $inflight in flight, > 1)" \
		'[ "$inflight" -gt 1 ]'
	expect_sh "$mode: readahead made most of the requests ($ahead of $fetches)" \
		'[ "$ahead" -gt 0 ] && [ $((ahead * 2)) -gt "$fetches" ]'
	check "ferry umount ($mode, one reader)" fumount "$m"
}

wan_checks fuse
wan_checks fanotify
one_reader fuse
one_reader fanotify
e2e_done
