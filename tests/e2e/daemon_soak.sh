#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# ferry-test: alone (measures memory and latency under load)
# Soak: one ferryd serves a FUSE and a fanotify mount of the Debian image
# with a cold cache, through a flaky registry (tests/tools/faultproxy.py:
# bursts of 503s and 429s and connections cut mid-body, which the fetcher
# retries, and windows in which every blob request is reset, "registry
# down") behind a slow link (tests/tools/wanproxy.py, FERRY_SOAK_MBIT,
# default 8 Mbit/s: the cold fill takes about a minute, so the faults meet
# fetches all along),
# while 64 readers (32 per mount) read random files for FERRY_SOAK_SECS
# (default 60) seconds. Every file read whole must have the reference's
# bytes; the only errors allowed are EIO for reads that overlapped a down
# window; ferryd's peak RSS stays bounded. Then one ferryd hosts 50
# images at once.
. "$(dirname "$0")/../lib/common.sh"
. "$(dirname "$0")/../lib/oci.sh"
. "$(dirname "$0")/../lib/registry.sh"
. "$(dirname "$0")/../lib/lazy.sh"
SOAK_SECS=${FERRY_SOAK_SECS:-60}
lazy_setup proxy
lazy_use soak
PY=/usr/bin/python3
# A sanitizer build's memory (shadow, quarantine) says nothing about ferryd's.
RSS_MAX=$((64 << 20))
if ldd "$FERRYD" | grep -q libasan; then
	echo "# ferryd is an AddressSanitizer build: its RSS is not bounded here"
	RSS_MAX=
fi
# rss_ok DESC BYTES: one check that BYTES is under RSS_MAX (skipped without one).
rss_ok() {
	if [ -z "$RSS_MAX" ]; then
		echo "# skipped under a sanitizer build: $1"
	else
		expect "$1" [ "$2" -gt 0 -a "$2" -lt "$RSS_MAX" ]
	fi
}

# A slow link (8 Mbit/s) between ferryd and the flaky registry, so the
# cold fill lasts the whole soak and every fault cycle meets fetches.
if ! wp_start 1 "${FERRY_SOAK_MBIT:-8}" "$PROXY" 2>"$LOG"; then
	notok "start the WAN proxy (wanproxy.py) in front of the fault proxy"
	diag "$LOG"
	e2e_done
fi
SIMG=docker://$WAN/ferry/debian:edit
check "ferryd (persistent)" "$FERRYD" --socket "$FSOCK" --persistent
M=$SCRATCH/m-fuse
N=$SCRATCH/m-fan
# Attempts enough to ride out the 503 bursts and cut bodies, not the
# down windows: one request may meet every fault of a cycle (7, below),
# since the others wait on its chunks, so it gets 8 attempts.
check "fuse mount through the flaky proxy" mount_lazy fuse "$SIMG" "$M" --retries 8
check "fanotify mount through the flaky proxy" mount_lazy fanotify "$SIMG" "$N" --retries 8

# The readers: THREADS threads over ROOT until DEADLINE (unix time), each
# picking random files of the reference list, dropping their pages first
# (so reads reach the daemon or the kernel's fill again) and hashing them
# whole. One line per read: "ok|wrong|error START END ERRNO PATH".
SOAK_PY='
import hashlib, os, random, sys, threading, time
root, sums, threads, deadline, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
ref = [(l[66:].rstrip("\n"), l[:64]) for l in open(sums)]
lock = threading.Lock()
log = open(out, "w")
def reader(seed):
    rng = random.Random(seed)
    while time.time() < deadline:
        rel, want = rng.choice(ref)
        p = os.path.join(root, rel)
        t0 = time.time()
        try:
            fd = os.open(p, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                h = hashlib.sha256()
                while True:
                    b = os.read(fd, 1 << 20)
                    if not b:
                        break
                    h.update(b)
            finally:
                os.close(fd)
            res, err = ("ok" if h.hexdigest() == want else "wrong"), 0
        except OSError as e:
            res, err = "error", e.errno
        with lock:
            log.write("%s %.3f %.3f %d %s\n" % (res, t0, time.time(), err, rel))
ts = [threading.Thread(target=reader, args=(i,)) for i in range(threads)]
for t in ts:
    t.start()
for t in ts:
    t.join()
'
deadline=$(($(date +%s) + SOAK_SECS))
$PY -c "$SOAK_PY" "$M" "$SCRATCH/ref.sums" 32 "$deadline" "$SCRATCH/soak-fuse.log" &
r1=$!
$PY -c "$SOAK_PY" "$N" "$SCRATCH/ref.sums" 32 "$deadline" "$SCRATCH/soak-fan.log" &
r2=$!

# The flaky registry, cycling until the deadline: 503 bursts, cut
# bodies, and a 2 s down window every 12 s (logged as "START END").
: >"$SCRATCH/down.log"
peak_rss=0
cycle=0
while [ "$(date +%s)" -lt "$deadline" ]; do
	cycle=$((cycle + 1))
	fp_ctl /__fault mode=503 count=3 method=GET 'path=/blobs/' >/dev/null
	sleep 3
	fp_ctl /__fault mode=reset_mid count=2 method=GET 'path=/blobs/' frac=0.3 >/dev/null
	sleep 3
	fp_ctl /__fault mode=429 count=2 method=GET 'path=/blobs/' retry_after=1 >/dev/null
	sleep 3
	t0=$(date +%s.%N)
	fp_ctl /__fault mode=reset count=-1 method=GET 'path=/blobs/' >/dev/null
	sleep 2
	fp_ctl /__fault mode=none >/dev/null
	echo "$t0 $(date +%s.%N)" >>"$SCRATCH/down.log"
	rss=$("$FERRY" daemon status --json --socket "$FSOCK" |
		$PY -c 'import json, sys; print(json.load(sys.stdin)["peakRssBytes"])') || rss=0
	[ "$rss" -gt "$peak_rss" ] && peak_rss=$rss
	sleep 1
done
wait "$r1"
rc1=$?
wait "$r2"
rc2=$?
expect "the FUSE readers ran to the end" [ "$rc1" -eq 0 ]
expect "the fanotify readers ran to the end" [ "$rc2" -eq 0 ]
fp_ctl /__stats >"$SCRATCH/fp-stats.json"
echo "# $cycle fault cycles; fault proxy: $($PY -c '
import json, sys
c = json.load(open(sys.argv[1]))["counters"]
print(", ".join("%s %s" % kv for kv in sorted(c.items())))' "$SCRATCH/fp-stats.json")"
# Otherwise the verdicts below would say nothing about the faults.
expect "every kind of fault met a request (the fill outlasted the cycles' faults)" \
	$PY -c '
import json, sys
c = json.load(open(sys.argv[1]))["counters"]
sys.exit(0 if all(c.get("fault_" + k, 0) > 0 for k in ("503", "reset_mid", "429", "reset")) else 1)' \
	"$SCRATCH/fp-stats.json"

# judge LOG MODE: the reads' verdicts against the down windows (a read
# may fail only if it overlapped a window, widened by 10 s for the retry
# backoff and a fetch that began before it).
judge() {
	$PY - "$1" "$SCRATCH/down.log" "$2" <<'PY'
import errno, sys
log, down, mode = sys.argv[1], sys.argv[2], sys.argv[3]
wins = [tuple(map(float, l.split())) for l in open(down) if l.strip()]
n = {"ok": 0, "wrong": 0, "error": 0}
bad = []
for l in open(log):
    res, t0, t1, err, rel = l.rstrip("\n").split(" ", 4)
    t0, t1, err = float(t0), float(t1), int(err)
    n[res] += 1
    if res == "wrong":
        bad.append("WRONG BYTES: " + rel)
    elif res == "error":
        near = any(t0 <= b + 10 and t1 >= a for a, b in wins)
        if err != errno.EIO or not near:
            bad.append("%s outside a down window (%.1f-%.1f): %s" %
                       (errno.errorcode.get(err, err), t0, t1, rel))
print("# %s: %d reads right, %d wrong, %d EIO (all in down windows: %s)" %
      (mode, n["ok"], n["wrong"], n["error"], "no" if bad else "yes"))
for b in bad[:10]:
    print("#   " + b)
sys.exit(1 if bad or n["ok"] < 100 else 0)
PY
}
expect "fuse: 0 wrong bytes, EIO only around the registry's down windows, >= 100 reads" \
	judge "$SCRATCH/soak-fuse.log" fuse
expect "fanotify: the same" judge "$SCRATCH/soak-fan.log" fanotify
echo "# ferryd peak RSS during the soak: $((peak_rss >> 20)) MiB"
rss_ok "ferryd's peak RSS stayed under 64 MiB" "$peak_rss"
expect "the mounts still serve the whole tree right once the registry is back" \
	bash -c 'cmp "$0/usr/bin/bash" "$2/usr/bin/bash" && cmp "$1/usr/bin/bash" "$2/usr/bin/bash"' "$M" "$N" "$ref"
check "umount fuse" umount_lazy "$M"
check "umount fanotify" umount_lazy "$N"

# ---- 50 images in one ferryd -------------------------------------------
lazy_use many
check "ferryd for 50 images" "$FERRYD" --socket "$FSOCK" --persistent
ok_imgs=0
for i in $(seq 50); do
	d=$SCRATCH/many/src$i
	mkdir -p "$d"
	head -c $((200000 + i)) /dev/urandom >"$d/data"
	echo "image $i" >"$d/name"
	"$FERRY" convert -q "dir:$d" "dir:$SCRATCH/many/img$i" 2>>"$LOG" || break
	mkdir -p "$SCRATCH/many/m$i"
	mount_lazy fuse "dir:$SCRATCH/many/img$i" "$SCRATCH/many/m$i" 2>>"$LOG" || break
	ok_imgs=$i
done
expect "50 images converted and mounted by one ferryd" [ "$ok_imgs" -eq 50 ]
expect "ferry daemon status counts 50 FUSE mounts" \
	bash -c '"$0" daemon status --socket "$1" | grep -q "mounts: *50 (50 fuse)"' "$FERRY" "$FSOCK"
bad=0
for i in $(seq "$ok_imgs"); do
	cmp -s "$SCRATCH/many/m$i/data" "$SCRATCH/many/src$i/data" || bad=$((bad + 1))
	[ "$(cat "$SCRATCH/many/m$i/name")" = "image $i" ] || bad=$((bad + 1))
done
expect "every mount serves its own image's bytes" [ "$bad" -eq 0 ]
rss=$("$FERRY" daemon status --json --socket "$FSOCK" |
	$PY -c 'import json, sys; print(json.load(sys.stdin)["peakRssBytes"])')
echo "# ferryd peak RSS with 50 mounts: $((rss >> 20)) MiB"
rss_ok "ferryd's peak RSS with 50 mounts stays under 64 MiB" "$rss"
check "ferry daemon stop --force unmounts all 50" "$FERRY" daemon stop --force --socket "$FSOCK"
expect "none of them is left mounted" \
	bash -c 'for m in "$0"/m*; do mountpoint -q "$m" && exit 1; done; exit 0' "$SCRATCH/many"

e2e_done
