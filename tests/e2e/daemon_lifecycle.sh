#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# ferry-test: alone (times the idle exit)
# ferryd's lifecycle and what an operator sees of it: the idle exit (and
# --persistent), systemd socket activation (systemd-socket-activate hands
# the socket over as systemd does, LISTEN_FDS), the units in
# contrib/systemd (systemd-analyze verify), 'ferry daemon status|stop',
# and the metrics ('ferry metrics', --metrics-listen over a unix socket
# and TCP), parsed with the Prometheus text-format parser of Debian's
# python3-prometheus-client, whose counters must move as reads happen;
# the keepers' own program (ferryd-keeper): small (no libcurl, OpenSSL,
# libfuse or codec library; a FUSE mount's keeper under 4 MiB resident),
# its usage, and a ferryd installed without it (mounts work and say that
# they have no failover; ferry daemon upgrade refuses).
. "$(dirname "$0")/../lib/common.sh"
. "$(dirname "$0")/../lib/oci.sh"
. "$(dirname "$0")/../lib/registry.sh"
. "$(dirname "$0")/../lib/lazy.sh"
need_cmds systemd-socket-activate systemd-analyze curl
lazy_setup
PY=/usr/bin/python3
if ! $PY -c 'import prometheus_client.parser' 2>"$LOG"; then
	notok "python3-prometheus-client (make deps)"
	diag "$LOG"
	e2e_done
fi
F=etc/os-release
# Big enough to live in a data blob (small files are inline in the bootstrap).
B=usr/bin/bash

# A free TCP port on 127.0.0.1.
free_port() {
	$PY -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# The samples of Prometheus text on stdin as "NAME MOUNTPOINT VALUE" lines
# (MOUNTPOINT "-" for samples without one); exits non-zero if the
# official parser rejects the text or a family has a wrong type.
prom_samples() {
	$PY -c '
import sys
from prometheus_client.parser import text_string_to_metric_families
want = {"ferryd_read_bytes": "counter", "ferryd_cache_misses": "counter",
        "ferryd_miss_duration_seconds": "histogram", "ferryd_mounts": "gauge",
        "process_resident_memory_bytes": "gauge"}
seen = {}
for fam in text_string_to_metric_families(sys.stdin.read()):
    seen[fam.name] = fam.type
    for s in fam.samples:
        name = s.name + ("" if "le" not in s.labels else "{le=%s}" % s.labels["le"])
        print(name, s.labels.get("mountpoint", "-"), repr(float(s.value)))
for n, t in want.items():
    if seen.get(n) != t:
        sys.exit("family %s: type %s, expected %s" % (n, seen.get(n), t))
'
}
# Parse Prometheus text file IN into samples file OUT.
parse_to() { prom_samples <"$1" >"$2"; } # IN OUT
# VALUE of sample NAME for mount point MNT ("-": none) in samples file FILE.
sample() { awk -v n="$2" -v m="$3" '$1 == n && $2 == m { print $3; f = 1 } END { exit !f }' "$1"; }
# Whether sample NAME of MNT grew from file OLD to file NEW.
grew() { # OLD NEW NAME MNT
	local a b
	a=$(sample "$1" "$3" "$4") && b=$(sample "$2" "$3" "$4") &&
		$PY -c 'import sys; sys.exit(not float(sys.argv[2]) > float(sys.argv[1]))' "$a" "$b"
}

# ---- descriptor numbers ------------------------------------------------
# A daemon numbers its own descriptors alike whatever it inherited: a
# successor keeps the numbers of the fanotify reads a dead ferryd had
# taken (ARCHITECTURE.md "Fanotify takeover"), and its own startup must
# not hold one of them. What 3-8 are, by kind.
fd_kinds() { # PID
	local n t
	for n in 3 4 5 6 7 8; do
		t=$(readlink "/proc/$1/fd/$n" 2>/dev/null) || t=-
		case $t in
		*.lock) t=lock ;;
		socket:*) t=socket ;;
		anon_inode:*) t=${t#anon_inode:} ;;
		esac
		printf '%s ' "$n=$t"
	done
}
mkdir -p "$SCRATCH/fd-clean" "$SCRATCH/fd-inherit"
check "ferryd starts (nothing inherited)" "$FERRYD" --socket "$SCRATCH/fd-clean/s.sock" --persistent
check "ferryd starts with descriptors 3-7 inherited" bash -c \
	'exec 3</dev/null 4</dev/null 5</dev/null 7</dev/null; exec "$@"' _ \
	"$FERRYD" --socket "$SCRATCH/fd-inherit/s.sock" --persistent
a=$(fd_kinds "$(daemon_pids "$SCRATCH/fd-clean/s.sock")")
b=$(fd_kinds "$(daemon_pids "$SCRATCH/fd-inherit/s.sock")")
expect "both number their descriptors alike ($a)" test "$a" = "$b" ||
	echo "#   with descriptors inherited: $b"
for s in fd-clean fd-inherit; do
	check "ferry daemon stop ($s)" "$FERRY" daemon stop --socket "$SCRATCH/$s/s.sock"
done

# ---- idle exit -------------------------------------------------------
lazy_use idle
check "ferryd --idle-timeout 2 starts" "$FERRYD" --socket "$FSOCK" --idle-timeout 2
pid=$(daemon_pids)
check "ferry daemon status: 0 while one runs" "$FERRY" daemon status --socket "$FSOCK"
cp "$LOG" "$SCRATCH/status"
expect "status names the pid" grep -q "pid $pid," "$SCRATCH/status"
expect "status names the idle timeout" grep -q "idle exit: *2 s" "$SCRATCH/status"
expect "status: 0 mounts" grep -q "mounts: *0$" "$SCRATCH/status"
M=$SCRATCH/m-idle
check "fuse mount on the idle-timeout ferryd" mount_lazy fuse "$IMG" "$M"
sleep 3.5
expect "a ferryd with a mount outlives its idle timeout" kill -0 "$pid"
expect "status counts the mount by mode" \
	bash -c '"$0" daemon status --socket "$1" | grep -q "mounts: *1 (1 fuse)"' "$FERRY" "$FSOCK"
check "read a file" cmp "$M/$F" "$ref/$F"
check "umount" umount_lazy "$M"
t0=$(now_ms)
expect "ferryd exits within its idle timeout (+4 s) of the last umount" wait_gone 6 "$pid"
echo "# idle exit $(($(now_ms) - t0)) ms after the umount (timeout 2 s)"
expect "the exiting ferryd removed its socket" [ ! -e "$FSOCK" ]
expect "its log says why it exited" grep -q "idle for 2 s without mounts: exiting" "$FLOG"
check_exit "ferry daemon status: 3 when none runs" 3 "$FERRY" daemon status --socket "$FSOCK"
expect "status says no ferryd" grep -q "no ferryd on $FSOCK" "$LOG"
expect "status --json: running false" \
	bash -c '"$0" daemon status --json --socket "$1" | grep -q "\"running\":false"' "$FERRY" "$FSOCK"
check "the next ferry mount starts a new ferryd" mount_lazy fuse "$IMG" "$M"
check "and reads through it" cmp "$M/$F" "$ref/$F"
expect "a ferryd started by ferry mount is not persistent (idle timeout 300 s)" \
	bash -c '"$0" daemon status --json --socket "$1" | grep -q "\"idleTimeout\":300"' "$FERRY" "$FSOCK"
check "umount" umount_lazy "$M"
check "ferry daemon stop (no mounts)" "$FERRY" daemon stop --socket "$FSOCK"
expect "no ferryd left on the socket" [ -z "$(daemon_pids)" ]

lazy_use persistent
check "ferryd --persistent starts" "$FERRYD" --socket "$FSOCK" --idle-timeout 1 --persistent
pid=$(daemon_pids)
sleep 2.5
expect "--persistent: still running past any idle timeout" kill -0 "$pid"
expect "status says persistent" \
	bash -c '"$0" daemon status --socket "$1" | grep -q "never (persistent)"' "$FERRY" "$FSOCK"

# ---- ferry daemon stop ------------------------------------------------
M=$SCRATCH/m-stop
check "fuse mount on the persistent ferryd" mount_lazy fuse "$IMG" "$M"
check_exit "ferry daemon stop refuses while a mount is served" 1 "$FERRY" daemon stop --socket "$FSOCK"
expect "the refusal names the mount and --force" grep -q "$(realpath "$M").*--force" "$LOG"
expect "ferryd still runs, the mount still reads" cmp "$M/$F" "$ref/$F"
check "ferry daemon stop --force" "$FERRY" daemon stop --force --socket "$FSOCK"
expect "ferryd is gone" bash -c '! kill -0 "$0" 2>/dev/null' "$pid"
expect "its mount is gone" bash -c '! mountpoint -q "$0"' "$M"
check "ferry daemon stop with none running: 0" "$FERRY" daemon stop --socket "$FSOCK"
check_exit "ferry daemon with no action: usage error" 2 "$FERRY" daemon --socket "$FSOCK"

# ---- socket activation -------------------------------------------------
lazy_use sd
systemd-socket-activate -l "$FSOCK" "$FERRYD" -f --socket "$FSOCK" --idle-timeout 2 \
	>/dev/null 2>"$SCRATCH/sd.err" &
sdpid=$!
poll 10 test -S "$FSOCK"
M=$SCRATCH/m-sd
# The first connection makes systemd-socket-activate exec ferryd with the
# socket as descriptor 3; the mount request waits in its queue meanwhile.
check "fuse mount through a socket-activated ferryd" mount_lazy fuse "$IMG" "$M"
expect "it is the activated ferryd (the activator's pid) that serves" \
	bash -c '"$0" daemon status --json --socket "$1" | grep -q "\"pid\":$2,"' "$FERRY" "$FSOCK" "$sdpid"
expect "status says socket-activated" \
	bash -c '"$0" daemon status --socket "$1" | grep -q "(socket-activated)"' "$FERRY" "$FSOCK"
check "read through it" cmp "$M/$F" "$ref/$F"
check "umount" umount_lazy "$M"
expect "the activated ferryd exits when idle" wait_gone 6 "$sdpid"
expect "and leaves systemd's socket file in place" [ -S "$FSOCK" ]
expect "its log says it took the socket from systemd" grep -q "socket from systemd" "$SCRATCH/sd.err"

lazy_use sdwrong
systemd-socket-activate -l "$FDIR/other.sock" "$FERRYD" -f --socket "$FSOCK" \
	>/dev/null 2>"$SCRATCH/sdwrong.err" &
sdpid=$!
poll 10 test -S "$FDIR/other.sock"
"$FERRY" daemon status --socket "$FDIR/other.sock" >/dev/null 2>&1
expect "a socket on another path than --socket: ferryd refuses to start" wait_gone 10 "$sdpid"
expect "and names both paths" grep -q "listens on $FDIR/other.sock, not on $FSOCK" "$SCRATCH/sdwrong.err"

lazy_use notours
check "LISTEN_PID of another process: ferryd listens on its own socket" \
	env LISTEN_PID=1 LISTEN_FDS=1 "$FERRYD" --socket "$FSOCK" --idle-timeout 1
expect "and answers there" bash -c '"$0" daemon status --socket "$1" >/dev/null' "$FERRY" "$FSOCK"

# Under systemd, stderr is the journal (JOURNAL_STREAM=DEV:INO names it):
# each line then carries its syslog priority.
lazy_use journal
J=$FDIR/journal.log
: >"$J"
(
	exec 2>>"$J"
	JOURNAL_STREAM=$(stat -c %d:%i "$J") exec "$FERRYD" -f --socket "$FSOCK" --idle-timeout 2
) &
jpid=$!
poll 10 test -S "$FSOCK"
mkdir -p "$SCRATCH/m-j"
check_exit "a mount of a missing image fails" 1 "$FERRY" mount --mode fuse --socket "$FSOCK" \
	--cache-dir "$FCACHE" "docker://$REG/ferry/nosuch:1" "$SCRATCH/m-j"
expect "journal: info lines carry <6>" grep -q '^<6>ferry: info: ferryd .* listening on' "$J"
expect "journal: error lines carry <3>" grep -q '^<3>ferry: error: ' "$J"
expect "journal: every line starts with a priority" bash -c '! grep -qv "^<[0-7]>" "$0"' "$J"
expect "the journal-logging ferryd exits when idle" wait_gone 8 "$jpid"
expect "without JOURNAL_STREAM no priorities (the -f log of the socket-activated ferryd)" \
	bash -c '! grep -q "^<[0-7]>" "$0"' "$SCRATCH/sd.err"

D=$SCRATCH/units
mkdir -p "$D"
cp "$TOP/contrib/systemd/ferryd.socket" "$D/"
sed "s|@BINDIR@|$(dirname "$FERRYD")|" "$TOP/contrib/systemd/ferryd.service.in" >"$D/ferryd.service"
check "systemd-analyze verify contrib/systemd's units" \
	systemd-analyze verify --man=no "$D/ferryd.socket" "$D/ferryd.service"
expect "the service's --socket is the socket unit's ListenStream" \
	grep -q -- "--socket $(sed -n 's/^ListenStream=//p' "$D/ferryd.socket")" "$D/ferryd.service"

# ---- metrics ----------------------------------------------------------
lazy_use metrics
port=$(free_port)
check "ferryd --metrics-listen (TCP and unix) starts" "$FERRYD" --socket "$FSOCK" \
	--metrics-listen "127.0.0.1:$port" --metrics-listen "unix:$FDIR/metrics.sock"
M=$SCRATCH/m-fuse
N=$SCRATCH/m-fan
check "fuse mount" mount_lazy fuse "$IMG" "$M"
check "fanotify mount" mount_lazy fanotify "$IMG" "$N"
Mr=$(realpath "$M")
Nr=$(realpath "$N")
check "ferry metrics" "$FERRY" metrics --socket "$FSOCK"
cp "$LOG" "$SCRATCH/m0.txt"
check "the Prometheus parser accepts ferry metrics' text" parse_to "$SCRATCH/m0.txt" "$SCRATCH/m0"
expect "ferryd_mounts counts one fuse and one fanotify mount" \
	grep -q '^ferryd_mounts{mode="fuse"} 1$' "$SCRATCH/m0.txt"
expect "  ... and one fanotify" grep -q '^ferryd_mounts{mode="fanotify"} 1$' "$SCRATCH/m0.txt"
# The two mounts share a chunk cache: the fanotify mount reads first.
check "read a file through the fanotify mount" cmp "$N/$B" "$ref/$B"
check "read the tree through the FUSE mount" bash -c 'cd "$0" && find . -type f -size -2M -print0 | head -z -n 300 | xargs -0 cat >/dev/null' "$M"
check "read a blob-backed file through the FUSE mount" cmp "$M/$B" "$ref/$B"
check "the FUSE mount's fetch-ahead settles" fetch_settle "$M"
"$FERRY" metrics --socket "$FSOCK" >"$SCRATCH/m1.txt"
check "metrics again, parsed" parse_to "$SCRATCH/m1.txt" "$SCRATCH/m1"
expect "fuse: bytes read grew" grew "$SCRATCH/m0" "$SCRATCH/m1" ferryd_read_bytes_total "$Mr"
expect "fuse: bytes fetched grew" grew "$SCRATCH/m0" "$SCRATCH/m1" ferryd_fetched_bytes_total "$Mr"
expect "fuse: cache misses grew" grew "$SCRATCH/m0" "$SCRATCH/m1" ferryd_cache_misses_total "$Mr"
expect "fuse: registry requests grew" grew "$SCRATCH/m0" "$SCRATCH/m1" ferryd_registry_requests_total "$Mr"
expect "fanotify: bytes fetched grew" grew "$SCRATCH/m0" "$SCRATCH/m1" ferryd_fetched_bytes_total "$Nr"
expect "miss histogram: count equals the misses counter" \
	[ "$(sample "$SCRATCH/m1" ferryd_miss_duration_seconds_count "$Mr")" = \
	"$(sample "$SCRATCH/m1" ferryd_cache_misses_total "$Mr")" ]
expect "miss histogram: the +Inf bucket equals the count" \
	[ "$(sample "$SCRATCH/m1" "ferryd_miss_duration_seconds_bucket{le=+Inf}" "$Mr")" = \
	"$(sample "$SCRATCH/m1" ferryd_miss_duration_seconds_count "$Mr")" ]
expect "the resident memory is reported" \
	$PY -c 'import sys; sys.exit(not float(sys.argv[1]) > 1e6)' \
	"$(sample "$SCRATCH/m1" process_resident_memory_bytes -)"
drop_pages "$M/$B"
check "re-read a cached file (pages dropped)" cmp "$M/$B" "$ref/$B"
"$FERRY" metrics --socket "$FSOCK" >"$SCRATCH/m2.txt"
check "metrics after the re-read, parsed" parse_to "$SCRATCH/m2.txt" "$SCRATCH/m2"
expect "fuse: a re-read of present chunks is a cache hit" \
	grew "$SCRATCH/m1" "$SCRATCH/m2" ferryd_cache_hits_total "$Mr"
expect "and fetches nothing" [ "$(sample "$SCRATCH/m1" ferryd_fetched_bytes_total "$Mr")" = \
	"$(sample "$SCRATCH/m2" ferryd_fetched_bytes_total "$Mr")" ]
expect "the counters agree with ferry mount --list" \
	[ "$(mount_field "$M" cacheHits)" = "$(sample "$SCRATCH/m2" ferryd_cache_hits_total "$Mr" | cut -d. -f1)" ]

curl -sf -o "$SCRATCH/tcp.txt" "http://127.0.0.1:$port/metrics"
check "GET /metrics over TCP parses" parse_to "$SCRATCH/tcp.txt" "$SCRATCH/tcp"
curl -sf -o "$SCRATCH/unix.txt" --unix-socket "$FDIR/metrics.sock" http://ferryd/metrics
check "GET /metrics over the unix socket parses" parse_to "$SCRATCH/unix.txt" "$SCRATCH/unix"
expect "both endpoints show the same series" \
	[ "$(cut -d' ' -f1,2 "$SCRATCH/tcp" | sort)" = "$(cut -d' ' -f1,2 "$SCRATCH/unix" | sort)" ]
expect "the unix metrics socket is 0600" [ "$(stat -c %a "$FDIR/metrics.sock")" = 600 ]
expect "another path: 404" [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/")" = 404 ]
expect "another method: 405" \
	[ "$(curl -s -o /dev/null -w '%{http_code}' -X POST "http://127.0.0.1:$port/metrics")" = 405 ]
# A client that connects and says nothing holds the endpoint for at most
# its deadline (5 s), never the control socket.
$PY -c 'import socket, sys, time; s = socket.create_connection(("127.0.0.1", int(sys.argv[1]))); time.sleep(8)' "$port" &
silent=$!
sleep 0.3
t0=$(now_ms)
check "the control socket answers while a metrics client stalls" "$FERRY" daemon status --socket "$FSOCK"
expect "  ... at once" [ $(($(now_ms) - t0)) -lt 2000 ]
expect "a scrape behind the stalled client is served within its deadline" \
	curl -sf -m 8 -o /dev/null "http://127.0.0.1:$port/metrics"
kill "$silent" 2>/dev/null
wait "$silent" 2>/dev/null
check_exit "--metrics-listen with a malformed address fails at start" 1 \
	"$FERRYD" --socket "$SCRATCH/bad.sock" --metrics-listen nohost
expect "  ... naming the address and the expected forms" grep -q "nohost.*unix:/PATH or HOST:PORT" "$LOG"
check "umount fuse" umount_lazy "$M"
check "umount fanotify" umount_lazy "$N"
# An unmount ends the FUSE keeper's connection: that is no keeper dying
# (it said so), so nothing restarts it and the counter stays 0.
sleep 0.5
"$FERRY" metrics --socket "$FSOCK" >"$SCRATCH/m3.txt"
expect "no keeper restarts counted after the umounts" \
	grep -q '^ferryd_keeper_restarts_total 0$' "$SCRATCH/m3.txt"

# ---- the keepers' program ---------------------------------------------
KEEPER=$(dirname "$FERRYD")/ferryd-keeper
check "ferryd-keeper --help" "$KEEPER" --help
expect "  ... says ferryd starts it" grep -q "started by ferryd only" "$LOG"
check_exit "ferryd-keeper without a kind: usage error" 2 "$KEEPER"
check_exit "ferryd-keeper fuse with bad arguments: usage error" 2 "$KEEPER" fuse x y
expect "  ... naming the kind" grep -q "ferryd-keeper fuse: started by ferryd only" "$LOG"
# What makes it cheap to start on each mount's path: none of ferryd's
# heavier libraries (sanitizer builds add their runtimes only).
ldd "$KEEPER" >"$SCRATCH/keeper.ldd" 2>&1
expect "ferryd-keeper links no libcurl, OpenSSL, libfuse or codec library" \
	bash -c '! grep -E "libcurl|libssl|libcrypto|libfuse|liblz4|libzstd|liblzma|libisal|libz\\." "$0"' \
	"$SCRATCH/keeper.ldd" || diag "$SCRATCH/keeper.ldd"
lazy_use keeper
M=$SCRATCH/m-keeper
check "ferryd starts" "$FERRYD" --socket "$FSOCK" --persistent
check "fuse mount" mount_lazy fuse "$IMG" "$M"
kpid=$(mount_field "$M" keeperPid)
expect "the mount's keeper (pid ${kpid:-none}) runs ferryd-keeper fuse" is_keeper "${kpid:-none}"
if grep -q libasan "$SCRATCH/keeper.ldd"; then
	echo "# keeper RSS bound skipped: a sanitizer build"
else
	rss=$(awk '/^VmRSS:/ { print $2 }' "/proc/$kpid/status" 2>/dev/null)
	expect "its resident memory is under 4 MiB (${rss:-?} KiB)" [ "${rss:-99999}" -lt 4096 ]
fi
# Started by posix_spawn, then forked by itself (keeper.c): it holds the
# connection and its socket to ferryd and nothing else of ferryd's, and is
# not ferryd's child.
kfds=$(ls "/proc/$kpid/fd" 2>/dev/null | sort -n | tr '\n' ' ')
expect "the keeper holds descriptors 0-4 only (${kfds:-none})" [ "$kfds" = "0 1 2 3 4 " ]
expect "  ... /dev/fuse at 3" [ "$(readlink "/proc/$kpid/fd/3")" = /dev/fuse ]
kppid=$(awk '/^PPid:/ { print $2 }' "/proc/$kpid/status" 2>/dev/null)
expect "  ... and its parent (${kppid:-none}) is no ferryd" \
	bash -c '[ -n "$0" ] && ! grep -qx "$0" <<<"$1"' "$kppid" "$(ferryd_pids daemon "$FSOCK")"
check "umount" umount_lazy "$M"
check "ferry daemon stop" "$FERRY" daemon stop --socket "$FSOCK"
# ferry and ferryd copied without ferryd-keeper next to them.
mkdir -p "$SCRATCH/nokeeper"
cp "$FERRY" "$FERRYD" "$SCRATCH/nokeeper/"
lazy_use nokeeper
check "a ferryd without ferryd-keeper starts" "$SCRATCH/nokeeper/ferryd" --socket "$FSOCK" --persistent
FERRY=$SCRATCH/nokeeper/ferry check "a FUSE mount through it works" mount_lazy fuse "$IMG" "$M"
expect "  ... and reads" cmp "$M/$F" "$ref/$F"
expect "ferryd's log names the missing keeper program" grep -q "nokeeper/ferryd-keeper: No such file" "$FLOG"
expect "  ... and says the mount has no failover" grep -q "no keeper yet.*if ferryd dies the mount is not taken over" "$FLOG"
check_exit "ferry daemon upgrade refuses while a mount has no keeper" 1 \
	"$SCRATCH/nokeeper/ferry" daemon upgrade --socket "$FSOCK"
check "umount" umount_lazy "$M"
check "ferry daemon stop" "$SCRATCH/nokeeper/ferry" daemon stop --socket "$FSOCK"

e2e_done
