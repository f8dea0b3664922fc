#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# shellcheck disable=SC2016,SC2034 # expect_sh evaluates its quoted condition
# Issue 44's hostile neighbours, each tried as the attacker would (a local
# user is `nobody`, through runuser), each failing on the code before the
# fix:
#   - ferry convert dir:SRC while nobody swaps a directory of SRC it owns
#     for a link to a root-only directory (renameat2 RENAME_EXCHANGE in a
#     loop): in FERRY_RACE_TRIES (1,000) conversions the root-only file
#     never reaches the image (the walk went by path and followed the link)
#   - nobody swaps its mount point for a link to a root-owned directory
#     while ferryd is still opening the image (the registry slowed): the
#     mount never lands on root's directory (it was mounted by path)
#   - --record LIST where nobody planted a FIFO (the mount hung in
#     "mounting" and the FIFO received the paths root read) or a file of
#     its own: refused at once, nothing written
#   - nobody takes ferryd's --metrics-listen port the moment a kill -9
#     frees it: the keeper's successor takes the mount over all the same
#     and binds the port later (the bind failure was fatal: no successor);
#     16 idle clients do not hold a scrape off (they did for 28-30 s)
#   - an OCI layout whose index.json links to /dev/zero (ferry convert grew
#     to 1.5 GB and ignored SIGTERM), or is a FIFO: refused within a
#     second, naming the reason
. "$(dirname "$0")/../lib/common.sh"
. "$(dirname "$0")/../lib/oci.sh"
. "$(dirname "$0")/../lib/registry.sh"
. "$(dirname "$0")/../lib/lazy.sh"

need_ferryd
need_cmds runuser python3 docker-registry umoci

# nobody reaches PUB (root's, 0755) and what it owns there, nothing else.
PUB=$SCRATCH/pub
mkdir -p "$PUB"
chmod 0755 "$SCRATCH" "$PUB"

# A root-only directory whose file has the name of one of nobody's.
SECRET=$SCRATCH/secret
mkdir -p "$SECRET"
chmod 0700 "$SECRET"
echo "TOP-SECRET-9f4c1e of root" >"$SECRET/pub.txt"
chmod 0600 "$SECRET/pub.txt"

# RENAME_EXCHANGE of two names, for ever, until STOP exists (as nobody).
SWAPPER='
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
a, b, stop = (s.encode() for s in sys.argv[1:4])
n = 0
while not os.path.exists(stop):
    if libc.renameat2(-100, a, -100, b, 2) == 0:
        n += 1
print(n)
'

# --- dir: with a directory swapped for a link -------------------------------
SRC=$PUB/src
mkdir -p "$SRC/u/sub"
echo "nobody's own" >"$SRC/u/sub/pub.txt"
chown -R nobody: "$SRC/u"
as_nobody ln -s "$SECRET" "$SRC/u/link"
TRIES=${FERRY_RACE_TRIES:-1000}
# The images go to a tmpfs: a conversion's fsyncs on disk took half its time.
OUTS=$SCRATCH/outs
mkdir -p "$OUTS"
mount -t tmpfs -o size=64m,mode=0700 tmpfs "$OUTS"
rm -f "$SCRATCH/stop"
as_nobody nice -n 19 python3 -c "$SWAPPER" "$SRC/u/sub" "$SRC/u/link" "$SCRATCH/stop" \
	>"$SCRATCH/swaps" 2>&1 &
swapper=$!
sleep 0.5 # swapping by now
leaks=0 fails=0 t0=$(now_ms)
for i in $(seq "$TRIES"); do
	rm -rf "$OUTS/out"
	# A conversion may fail (an entry changed under it); it must not leak.
	if ! "$FERRY" convert -q --compress none "dir:$SRC" "dir:$OUTS/out" 2>>"$SCRATCH/race.err"; then
		fails=$((fails + 1))
		continue
	fi
	grep -rqa TOP-SECRET-9f4c1e "$OUTS/out" && leaks=$((leaks + 1))
done
ms=$(($(now_ms) - t0))
touch "$SCRATCH/stop"
wait "$swapper"
umount "$OUTS"
expect_sh "dir: source swapped under ferry convert $TRIES times ($(cat "$SCRATCH/swaps") swaps by nobody, $fails conversions refused, $ms ms): the root-only file reached the image $leaks times" \
	'[ "$leaks" -eq 0 ] && [ "$(cat "$SCRATCH/swaps")" -gt 0 ]'
sort "$SCRATCH/race.err" | uniq -c | sort -rn | head -n 3 | sed 's/^/    # /'

# --- a mount point swapped for a link ----------------------------------------
# The registry holds the image's blob requests 2 s, so that ferryd is still
# opening it when nobody swaps the directory it checked for a link to
# ROOTDIR; by path, the mount landed on ROOTDIR.
ROOTDIR=$PUB/rootdir
mkdir -p "$ROOTDIR" "$PUB/u2"
echo "root's directory" >"$ROOTDIR/marker"
chown nobody: "$PUB/u2"
as_nobody mkdir "$PUB/u2/mnt"
IMGDIR=$SCRATCH/img
push_image() {
	"$FERRY" convert -q "dir:$SRC/u" "dir:$IMGDIR" && reg_start anon && fp_start &&
		"$FERRY" convert -q "dir:$SRC/u" "docker://$REG/ferry/mp:1"
}
check "an image, also in a registry behind the fault proxy" push_image || PROXY=
swap_mount() { # MODE: one try, the swap 1 s into the mount
	local m=$PUB/u2/mnt rc swap
	lazy_use "swap-$1"
	(sleep 1 && as_nobody mv "$m" "$m.away" && as_nobody ln -s "$ROOTDIR" "$m") &
	swap=$!
	if [ "$1" = local ]; then
		timeout -k 5 60 "$FERRY" mount --mode local "docker://$PROXY/ferry/mp:1" "$m" \
			--cache-dir "$FCACHE" </dev/null >"$LOG" 2>&1
	else
		mount_lazy "$1" "docker://$PROXY/ferry/mp:1" "$m" >"$LOG" 2>&1
	fi
	rc=$?
	wait "$swap"
	expect_sh "$1: mount point swapped for a link to root's directory mid-mount (exit $rc): nothing mounted on it" \
		'! is_mounted "$ROOTDIR"' || findmnt "$ROOTDIR" | sed 's/^/    /'
	if [ "$rc" -eq 0 ]; then
		echo "    # mounted at: $(findmnt -n -o TARGET -S "$(findmnt -n -o SOURCE "$ROOTDIR" 2>/dev/null)" 2>/dev/null)"
	else
		diag "$LOG" 3
	fi
	is_mounted "$ROOTDIR" && umount -l "$ROOTDIR"
	is_mounted "$m.away" && umount -l "$m.away"
	rm -f "$m"
	[ -d "$m.away" ] && as_nobody mv "$m.away" "$m"
}
if [ -n "${PROXY:-}" ]; then
	fp_set slow count=-1 path=/blobs/ delay=2
	for mode in fuse local; do
		swap_mount "$mode"
	done
	fp_set none
fi

# --- --record into a FIFO or another user's file --------------------------------
# nobody plants LIST in a directory it owns; root names it.
lazy_use record
if [ -d "$IMGDIR" ]; then
	for kind in fifo file; do
		list=$PUB/u2/list-$kind
		if [ "$kind" = fifo ]; then as_nobody mkfifo -m 0622 "$list"; else as_nobody touch "$list"; fi
		t0=$(now_ms)
		mount_lazy fuse "dir:$IMGDIR" "$SCRATCH/m-rec" --record "$list" >"$LOG" 2>&1
		rc=$?
		ms=$(($(now_ms) - t0))
		expect_sh "--record LIST, nobody's $kind: refused at once (exit $rc, $ms ms), naming it" \
			'[ "$rc" -eq 1 ] && [ "$ms" -lt 10000 ] && grep -q "record $list" "$LOG"' || diag "$LOG" 3
		is_mounted "$SCRATCH/m-rec" && umount_lazy "$SCRATCH/m-rec"
		if [ "$kind" = file ]; then
			expect_sh "--record LIST, nobody's file: nothing written into it" '[ ! -s "$list" ]'
		fi
	done
	check "--record LIST, a new file: the mount works" \
		mount_lazy fuse "dir:$IMGDIR" "$SCRATCH/m-rec" --record "$SCRATCH/list-new"
	is_mounted "$SCRATCH/m-rec" && umount_lazy "$SCRATCH/m-rec"
fi

# --- the metrics port: squatted, held by idle clients ---------------------------
# ferryd serves metrics on a TCP port; nobody grabs it the moment a
# kill -9 frees it. The keeper's successor (started with the same
# --metrics-listen) must take the mount over all the same (the failed
# bind was fatal: 32 mounts were left without a server) and bind the port
# once nobody lets it go. Then 16 clients connect and say nothing: a
# scrape is still answered at once (one client at a time held it off for
# 28-30 s).
SQUATTER='
import socket, sys, time, os
port, stop = int(sys.argv[1]), sys.argv[2]
while True:
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        s.listen(1)
        break
    except OSError:
        s.close()
        time.sleep(0.001)
print("bound", flush=True)
while not os.path.exists(stop):
    time.sleep(0.05)
'
scrape() { curl -sf -m 3 -o /dev/null "http://127.0.0.1:$port/metrics"; }
lazy_use metrics
port=$(reg_free_port)
M=$SCRATCH/m-metrics
if check "ferryd --metrics-listen 127.0.0.1:PORT and a FUSE mount" bash -c \
	'"$1" --socket "$2" --metrics-listen "127.0.0.1:$3" && "$4" mount --mode fuse --socket "$2" "dir:$5" "$6" --cache-dir "$7"' \
	_ "$FERRYD" "$FSOCK" "$port" "$FERRY" "$IMGDIR" "$(mkdir -p "$M" && echo "$M")" "$FCACHE"; then
	old=$(daemon_pids | head -n 1)
	rm -f "$SCRATCH/stop-squat"
	as_nobody python3 -c "$SQUATTER" "$port" "$SCRATCH/stop-squat" >"$SCRATCH/squat.out" 2>&1 &
	squatter=$!
	sleep 0.3
	kill -KILL "$old"
	new_serves() { local p; p=$(daemon_pids | head -n 1); [ -n "$p" ] && [ "$p" != "$old" ] && mount_field "$M" mountpoint >/dev/null 2>&1; }
	expect_sh "nobody holds the metrics port after kill -9 of ferryd ($(cat "$SCRATCH/squat.out"))" \
		'poll 5 grep -q bound "$SCRATCH/squat.out"'
	check "the keeper's successor takes the mount over all the same (within 10 s)" poll 10 new_serves
	check "the mount reads right" cmp "$SRC/u/sub/pub.txt" "$M/sub/pub.txt"
	expect "its log names the taken port once" \
		test "$(grep -c "metrics-listen 127.0.0.1:$port: Address already in use; trying again" "$FLOG")" -eq 1
	touch "$SCRATCH/stop-squat"
	wait "$squatter"
	check "once nobody lets the port go, the successor serves metrics on it (within 5 s)" poll 5 scrape
	python3 -c '
import socket, sys, time
conns = [socket.create_connection(("127.0.0.1", int(sys.argv[1]))) for _ in range(16)]
time.sleep(12)' "$port" &
	idle=$!
	sleep 0.5
	t0=$(now_ms)
	scrape
	rc=$?
	ms=$(($(now_ms) - t0))
	expect_sh "16 idle clients connected: a scrape is answered in $ms ms (< 2 s)" \
		'[ "$rc" -eq 0 ] && [ "$ms" -lt 2000 ]'
	kill "$idle" 2>/dev/null
	wait "$idle" 2>/dev/null
	# An upgrade lets the port go before the new ferryd binds it.
	before=$(daemon_pids | head -n 1)
	check "ferry daemon upgrade" timeout -k 1 60 "$FERRY" daemon upgrade --socket "$FSOCK"
	upgraded() { local p; p=$(daemon_pids | head -n 1); [ -n "$p" ] && [ "$p" != "$before" ] && scrape; }
	check "the new ferryd serves metrics on the port (within 3 s)" poll 3 upgraded
	expect "  ... and its log has no bind failure" \
		test "$(grep -c "metrics-listen 127.0.0.1:$port: Address already in use" "$FLOG")" -eq 1
	check "ferry umount" umount_lazy "$M"
fi

# --- an OCI layout's index.json that is not a small regular file ------------------
LAYOUT=$SCRATCH/layout
if check "an OCI image layout (umoci)" reg_umoci_layout "$LAYOUT"; then
	mv "$LAYOUT/index.json" "$SCRATCH/index.json.orig"
	for kind in zero fifo; do
		rm -f "$LAYOUT/index.json"
		if [ "$kind" = zero ]; then ln -s /dev/zero "$LAYOUT/index.json"; else mkfifo "$LAYOUT/index.json"; fi
		t0=$(now_ms)
		timeout -k 1 20 "$FERRY" convert -q "oci:$LAYOUT:t" "dir:$SCRATCH/out-$kind" >"$LOG" 2>&1
		rc=$?
		ms=$(($(now_ms) - t0))
		expect_sh "index.json $( [ "$kind" = zero ] && echo "links to /dev/zero" || echo "is a FIFO"): ferry convert fails in $ms ms (< 1 s, exit $rc), naming index.json" \
			'[ "$rc" -eq 1 ] && [ "$ms" -lt 1000 ] && grep -q "index.json is" "$LOG"' || diag "$LOG" 3
	done
	rm -f "$LAYOUT/index.json"
	mv "$SCRATCH/index.json.orig" "$LAYOUT/index.json"
	check "the layout mended converts" "$FERRY" convert -q "oci:$LAYOUT:t" "dir:$SCRATCH/out-ok"
fi

e2e_done
