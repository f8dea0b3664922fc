#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# ferry-test: alone (drops the page cache; times the stall across each kill)
# shellcheck disable=SC2016,SC2034 # expect_sh evaluates its quoted condition
# ferryd failover and hot upgrade (issue 17) of lazy FUSE and fanotify
# mounts of the Debian fixture, served through a slow registry (the fault
# proxy delays every blob request, so reads are in flight at each kill):
#   - kill -9 of ferryd while 16 readers per mount read the whole tree: the
#     keepers hand the mounts to a new ferryd; every reader finishes with
#     the reference digests, no error, the mounts never leave
#     /proc/mounts, and a new ferryd's pid serves them
#   - the fanotify reads the dead ferryd had taken: the new one answers
#     them all, none denied (their descriptor numbers are kept for it);
#     killed in turn at once, the third answers them again
#   - ferry daemon upgrade, 10 times in a row while readers run: the same,
#     with a third mount (fanotify, an empty cache) so that fanotify reads
#     are in flight at each upgrade
#   - kill -9 of a keeper: ferryd starts another, and a kill -9 of ferryd
#     after that is survived too
#   - kill -9 with the registry down: the successor takes the mounts over
#     from the cache alone (image pinned by digest; manifest, config and
#     bootstrap kept in the cache) and serves the whole tree
#   - the stall: a probe per mount reads one cached file again and again
#     (its pages dropped each time, so each read reaches ferryd or the
#     kernel's fanotify check) and reports the longest wait across each
#     kill -9 and upgrade (printed; the issue's goal is 1 s, checked < 10 s
#     here, where other test suites share 2 cores)
. "$(dirname "$0")/../lib/common.sh"
. "$(dirname "$0")/../lib/oci.sh"
. "$(dirname "$0")/../lib/registry.sh"
. "$(dirname "$0")/../lib/lazy.sh"

lazy_setup proxy "(failover)"
lazy_use failover
F=$SCRATCH/m-fuse
N=$SCRATCH/m-fan
HAVE_FAN=
check "ferryd" "$FERRYD" --socket "$FSOCK" --persistent || e2e_done
check "FUSE mount" mount_lazy fuse "$PIMG" "$F" || e2e_done
if [ -z "${FAILOVER_FUSE_ONLY:-}" ] && mount_lazy fanotify "$PIMG" "$N" 2>"$LOG"; then
	HAVE_FAN=1
	ok "fanotify mount"
else
	echo "# no fanotify mount here (needs pre-content events): FUSE only"
	diag "$LOG" 3
fi
MNTS=("$F")
[ -n "$HAVE_FAN" ] && MNTS+=("$N")
NC=
# A mount's name in the checks: its type, and for the cold one that.
mname() { if [ "$1" = "$NC" ]; then echo "$(fstype "$1"), cold cache"; else fstype "$1"; fi; }

# Every blob request waits DELAY s at the proxy: reads stay in flight.
slow() { fp_set slow "delay=$1" count=-1 "method=^GET$" path=/blobs/; }

# Both mounts are in /proc/mounts (checked in a loop while readers run).
mounts_watch_start() {
	(
		while :; do
			for m in "${MNTS[@]}"; do
				grep -q " $m " /proc/mounts || echo "$m left /proc/mounts at $(date +%s.%N)"
			done
			sleep 0.05
		done
	) >"$SCRATCH/watch.out" 2>&1 &
	WATCH=$!
}
mounts_watch_stop() {
	kill "$WATCH" 2>/dev/null
	wait "$WATCH" 2>/dev/null
	expect "the mounts never left /proc/mounts" test ! -s "$SCRATCH/watch.out"
	[ -s "$SCRATCH/watch.out" ] && diag "$SCRATCH/watch.out" 3
}

# 16 readers per mount in different orders; pages dropped first so that
# the kernel asks ferryd again.
READER_MODES=(sorted reverse shuffle pread sorted reverse shuffle pread
	sorted reverse shuffle pread sorted reverse shuffle pread)
NR=${#READER_MODES[@]}
UPGRADES=10
readers_go() { # TAG
	local m
	sync
	echo 3 >/proc/sys/vm/drop_caches
	for m in "${MNTS[@]}"; do
		readers_start "$1-${m##*/}" "$m" 240 "${READER_MODES[@]}"
		ALL_PIDS+=("${RD_PIDS[@]}")
		ALL_TAGS+=("$1-${m##*/}")
	done
}
readers_judge() { # DESC
	local tag i=0 m
	for m in "${MNTS[@]}"; do
		RD_TAG=${ALL_TAGS[$i]}
		RD_PIDS=("${ALL_PIDS[@]:$((i * NR)):NR}")
		RD_MODES=("${READER_MODES[@]}")
		readers_wait
		readers_agree "$1 ($(mname "$m")): $NR readers, the reference digests, no error" \
			"$SCRATCH/ref.sums" ||
			grep -E "error|EIO|Input/output" "$FLOG" | tail -n 15 | sed 's/^/    /'
		i=$((i + 1))
	done
	ALL_PIDS=()
	ALL_TAGS=()
}

# The ferryd serving FSOCK now (its pid from a ping), waiting up to 20 s.
serving_pid() {
	local i pid
	for i in $(seq 100); do
		pid=$("$FERRY" daemon status --socket "$FSOCK" --json 2>/dev/null |
			python3 -c 'import json,sys; print(json.load(sys.stdin)["pid"])' 2>/dev/null) &&
			[ -n "$pid" ] && { echo "$pid"; return 0; }
		sleep 0.2
	done
	return 1
}
# Every mount is listed by the ferryd on FSOCK (taken over).
all_listed() {
	local m
	for m in "${MNTS[@]}"; do
		mount_field "$m" state >/dev/null 2>&1 || return 1
	done
}
wait_listed() { local i; for i in $(seq 100); do all_listed && return 0; sleep 0.2; done; return 1; }

# The stall probe: reads FILE (pages dropped each time) until stopped and
# prints the longest gap between two reads' ends, in ms.
PROBE_PY='
import os, sys, time
path, out = sys.argv[1], sys.argv[2]
last, worst, n = time.monotonic(), 0.0, 0
while not os.path.exists(out + ".stop"):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.pread(fd, 4096, 0)
    finally:
        os.close(fd)
    now = time.monotonic()
    worst, last, n = max(worst, now - last), now, n + 1
    time.sleep(0.005)
open(out, "w").write("%d %d\n" % (worst * 1000, n))
'
probes_start() { # TAG
	local m
	PROBES=()
	for m in "${MNTS[@]}"; do
		cat "$m/etc/os-release" >/dev/null
		rm -f "$SCRATCH/probe-$1-${m##*/}" "$SCRATCH/probe-$1-${m##*/}.stop"
		timeout -k 5 300 python3 -c "$PROBE_PY" "$m/etc/os-release" \
			"$SCRATCH/probe-$1-${m##*/}" 2>"$SCRATCH/probe-$1-${m##*/}.err" &
		PROBES+=($!)
	done
}
probes_stop() { # TAG WHAT
	local m worst n i=0
	for m in "${MNTS[@]}"; do
		touch "$SCRATCH/probe-$1-${m##*/}.stop"
		wait "${PROBES[$i]}"
		i=$((i + 1))
		# A probe that died early wrote nothing: say so, do not abort.
		worst='' n=''
		[ -s "$SCRATCH/probe-$1-${m##*/}" ] && read -r worst n <"$SCRATCH/probe-$1-${m##*/}"
		echo "# stall: $2, $(mname "$m"): longest wait ${worst:-?} ms over ${n:-?} reads"
		expect "$2 ($(mname "$m")): the probe never failed and never waited 10 s" \
			test -n "$worst" -a "${worst:-99999}" -lt 10000 -a ! -s "$SCRATCH/probe-$1-${m##*/}.err" ||
			{ diag "$SCRATCH/probe-$1-${m##*/}.err" 3
			  grep -E "error|EIO|Input/output" "$FLOG" | tail -n 15 | sed 's/^/    /'; }
	done
}

ALL_PIDS=()
ALL_TAGS=()

# --- kill -9 of ferryd during cold reads ---------------------------------------------
slow 0.3
old=$(serving_pid)
mounts_watch_start
probes_start kill
readers_go kill
# The kill must find reads in flight on every mount (bounded wait).
in_flight_all() {
	local m n
	for m in "${MNTS[@]}"; do
		n=$(mount_field "$m" inFlight 2>/dev/null) && [ "${n:-0}" -gt 0 ] || return 1
	done
}
sleep 1
# A read seen in flight under the 0.3 s delay may end in the instant
# before the kill: hold new blob requests for 10 s, let the held ones
# pass, and kill only once every mount has reads waiting on held requests.
slow 10
sleep 0.6
for i in $(seq 50); do in_flight_all && break; sleep 0.2; done
for m in "${MNTS[@]}"; do echo "# before the kill: $(mname "$m") reads in flight $(mount_field "$m" inFlight)"; done
kill -9 "$old"
check "a new ferryd serves the socket after kill -9" wait_listed
new=$(serving_pid)
expect "it is another process (pid $old -> $new)" test "$new" != "$old"
# Killed in turn at once, while the fills of the reads it took over still
# wait at the proxy: those reads stay in the journal until answered, so
# the third ferryd answers them.
from2=$(($(wc -l <"$FLOG") + 1))
kill -9 "$new"
slow 0.3
check "a third ferryd serves the socket after a second kill -9 at once" wait_listed
third=$(serving_pid)
expect "it is yet another process (pid $new -> $third)" test "$third" != "$new"
readers_judge "kill -9 during cold reads"
probes_stop kill "kill -9"
mounts_watch_stop
expect "the FUSE requests the dead ferryd had read were sent again (FUSE_NOTIFY_RESEND)" \
	grep -q "requests in flight are sent again" "$FLOG"
# The fanotify reads the successors said they answered in FLOG's lines
# FROM to TO ($: the end).
answered() { # FROM TO
	sed -n "$1,$2p" "$FLOG" | grep -o "answering [0-9]* reads the dead ferryd had taken" |
		awk '{ s += $2 } END { print s + 0 }'
}
# Its fanotify reads in flight: every one answered by the new ferryd
# (FLOG from line $1 on), none denied (their numbers held since its start).
fan_taken_over() { # FROM-LINE WHAT
	local n
	n=$(answered "$1" '$')
	expect "$2: the new ferryd answered the fanotify reads the dead one had taken ($n)" \
		test "${n:-0}" -gt 0 ||
		grep -E "journal|taken over|fanotify keeper|answering" "$FLOG" | head -n 20 | sed 's/^/    /'
	expect "$2: none of them was denied" \
		bash -c '! tail -n "+$1" "$2" | grep -E "answered EIO|some denied"' _ "$1" "$FLOG" ||
		tail -n "+$1" "$FLOG" | grep -E "answered EIO|some denied|descriptor numbers" | head -n 10 | sed 's/^/    /'
}
if [ -n "$HAVE_FAN" ]; then
	fan_taken_over 1 "two kill -9"
	n1=$(answered 1 $((from2 - 1)))
	n2=$(answered "$from2" '$')
	expect "the third ferryd answered what the second took over and had not answered ($n1 -> $n2)" \
		test "$n1" -gt 0 -a "$n2" -ge "$n1"
fi
m=$("$FERRY" metrics --socket "$FSOCK" 2>/dev/null | grep '^ferryd_takeovers_total{mode="fuse"}' | cut -d' ' -f2)
expect "metrics: the new ferryd counts its FUSE takeover (${m:-none})" test "${m:-0}" -eq 1
fp_set none

# --- ferry daemon upgrade, 10 times while readers run ---------------------------------
# Everything is cached by now: a fanotify mount over a cache of its own
# has reads in flight at the upgrades (its old ferryd stops reading
# events before the new one starts, which holds their numbers).
if [ -n "$HAVE_FAN" ]; then
	NC=$SCRATCH/m-fan-cold
	mkdir -p "$NC"
	check "a fanotify mount over an empty cache" \
		timeout -k 5 90 "$FERRY" mount --mode fanotify "${FERRYD_SOCK_OPT[@]}" "$PIMG" "$NC" \
		--cache-dir "$SCRATCH/cache-cold" </dev/null && MNTS+=("$NC")
fi
up_from=$(($(wc -l <"$FLOG") + 1))
slow 0.1
mounts_watch_start
probes_start upgrade
readers_go upgrade
fails=0
pids=("$(serving_pid)")
for i in $(seq $UPGRADES); do
	sleep 1
	"$FERRY" daemon upgrade --socket "$FSOCK" >"$LOG" 2>&1 || { fails=$((fails + 1)); diag "$LOG" 3; }
	wait_listed || fails=$((fails + 1))
	pids+=("$(serving_pid)")
done
expect "$UPGRADES upgrades: each succeeded and the mounts were listed again" test "$fails" -eq 0
expect "each upgrade started a new ferryd (${pids[*]})" \
	test "$(printf '%s\n' "${pids[@]}" | sort -u | wc -l)" -eq $((UPGRADES + 1))
n=$(grep -c "mounts stopped taking requests in" "$FLOG" || true)
expect "each old ferryd stopped taking FUSE requests before it exited ($n of $UPGRADES)" \
	test "${n:-0}" -ge "$UPGRADES"
readers_judge "$UPGRADES upgrades during reads"
probes_stop upgrade "$UPGRADES upgrades"
[ -n "$HAVE_FAN" ] && fan_taken_over "$up_from" "$UPGRADES upgrades"
mounts_watch_stop
fp_set none

# --- kill -9 of a keeper, then of ferryd ---------------------------------------------
kp=$(mount_field "$F" keeperPid)
expect "the FUSE mount has a keeper (pid $kp)" test "${kp:-0}" -gt 0
kill -9 "$kp" 2>/dev/null
ok_keeper() { local k; k=$(mount_field "$F" keeperPid) && [ "$k" -gt 0 ] && [ "$k" != "$kp" ] && kill -0 "$k"; }
expect_sh "ferryd starts another keeper when it dies" \
	'for i in $(seq 50); do ok_keeper && break; sleep 0.2; done; ok_keeper'
slow 0.3
mounts_watch_start
readers_go keeper
sleep 1
kill -9 "$(serving_pid)"
check "after a keeper's death, kill -9 of ferryd is survived" wait_listed
readers_judge "kill -9 after a keeper was replaced"
mounts_watch_stop
fp_set none

# --- kill -9 while the registry is down ---------------------------------------------
# Everything was read above, so the cache holds the whole tree: the
# successor must take the mounts over from the cache alone (the image
# pinned by digest, its manifest, config and bootstrap kept in the cache)
# and serve every file right, without one request reaching the registry.
fp_reset
fp_set 503 count=-1
mounts_watch_start
readers_go down
kill -9 "$(serving_pid)"
check "with the registry down, a new ferryd takes the mounts over" wait_listed
readers_judge "kill -9 with the registry down"
mounts_watch_stop
n=$(fp_log | grep -c . || true)
expect "no request reached the registry while it was down (${n:-?})" test "${n:-1}" -eq 0 ||
	fp_log | head -n 5 | sed 's/^/    /'
fp_set none

for m in "${MNTS[@]}"; do
	check "ferry umount $(mname "$m")" umount_lazy "$m"
done
# Failover must not hide a crash: the daemons' stderr is this log.
expect "no sanitizer report and no crash in the log of the ferryds" \
	bash -c '! grep -E "Sanitizer|runtime error|SIGSEGV|SIGABRT" "$1"' _ "$FLOG"
e2e_done
