#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Where a WAN cold start's time goes, step by step: issue 21's workload
# (bench/wan.sh: cat os-release, find /usr, chroot sh -c true, env true,
# the large Python import) on the converted "big" image through
# tests/tools/wanproxy.py, FUSE and fanotify mode interleaved in each
# round, each on a fresh cache and ferryd after bench/prepare.sh.
#
#   bench/phases.sh BIN [ROUNDS]
#
# Prints per mode the median time of each step, and for FUSE the kernel's
# requests per step (tracefs events fuse:fuse_request_send/_end, Linux
# 6.14+, in a private trace instance): count and summed time from send to
# answer per opcode, medians over the rounds. Also: the median time from
# `ferry mount` to each blob frame fetched (ferryd -vv), which shows
# whether the fetches of the two modes follow one chain shifted by a step.
# Env: FERRY_WAN_LINK (default 10:200, one-way delay ms : Mbit/s),
# FERRY_BENCH_DIR.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/bench/lib.sh"
[ $# -ge 1 ] || { echo "usage: $0 BIN [ROUNDS]" >&2; exit 2; }
bin=$(cd "$1" && pwd) rounds=${2:-3} link=${FERRY_WAN_LINK:-10:200}
ferry=$bin/ferry
tr=/sys/kernel/tracing/instances/ferry-phases.$$
# The import of bench/wan.sh's issue 21 rows, taken from there.
PY=$(sed -n "s/^PYIMPORT21='\(.*\)'$/\1/p" "$top/bench/wan.sh")
[ -n "$PY" ] || { echo "$0: no PYIMPORT21 in bench/wan.sh" >&2; exit 1; }
[ -d /sys/kernel/tracing/events/fuse ] || {
	echo "$0: no fuse events in /sys/kernel/tracing (tracefs mounted? Linux 6.14+)" >&2
	exit 1
}
dataset big
bench_workdir phases
wp_pids=()
trap '[ ${#wp_pids[@]} -eq 0 ] || kill "${wp_pids[@]}" 2>/dev/null; [ ! -d "$tr" ] || rmdir "$tr"; bench_cleanup' EXIT
bench_image big
bench_wanproxy wan "${link%%:*}" "${link##*:}"
wan=127.0.0.1:$(cat "$work/wp-wan.port")
mkdir "$tr"
echo 16384 >"$tr/buffer_size_kb"
echo 1 >"$tr/events/fuse/fuse_request_send/enable"
echo 1 >"$tr/events/fuse/fuse_request_end/enable"

mark() { echo "$1" >"$tr/trace_marker"; }
one() { # MODE ROUND: one cold start; $work/MODE-ROUND.{trace,log,t0}
	local mode=$1 out=$work/$1-$2 sock=$work/sock mnt=$work/mnt pid
	rm -rf "$work/cache" && mkdir -p "$mnt"
	"$top/bench/prepare.sh"
	# Every line of ferryd's log with the time it was written.
	"$bin/ferryd" -f -vv --socket "$sock" 2> >(python3 -u -c '
import sys, time
for l in sys.stdin:
    sys.stdout.write("%.6f %s" % (time.time(), l))' >"$out.log") &
	pid=$!
	for _ in $(seq 50); do [ -S "$sock" ] && break; sleep 0.1; done
	echo >"$tr/trace"
	echo 1 >"$tr/tracing_on"
	date +%s.%N >"$out.t0"
	mark mount
	"$ferry" mount --mode "$mode" --socket "$sock" --cache-dir "$work/cache" \
		"docker://$wan/ferry/big:1" "$mnt"
	mark cat; cat "$mnt/etc/os-release" >/dev/null
	mark find; find "$mnt/usr" >/dev/null
	mark sh; chroot "$mnt" /bin/sh -c true
	mark env; chroot "$mnt" /usr/bin/env true
	mark py; chroot "$mnt" /usr/bin/python3 -c "$PY"
	mark end
	echo 0 >"$tr/tracing_on"
	cp "$tr/trace" "$out.trace"
	"$ferry" umount --socket "$sock" "$mnt"
	kill "$pid"
	wait "$pid" || true
}
for r in $(seq "$rounds"); do
	for mode in fuse fanotify; do one "$mode" "$r"; done
done

echo "## cold start by step through wanproxy.py at $link: big, $bin, $rounds rounds, $(nproc) CPUs"
python3 - "$work" "$rounds" <<'PY'
import collections, re, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
ev = re.compile(r'\s(\d+\.\d+): (\w+): (.*)')
steps = ("mount", "cat", "find", "sh", "env", "py")
def parse(path):
    """Step times (s) and per step and opcode [count, seconds in flight]."""
    marks, sent = [], {}
    ops = collections.defaultdict(lambda: collections.defaultdict(lambda: [0, 0.0]))
    for line in open(path):
        m = ev.search(line)
        if not m:
            continue
        t, kind, rest = float(m.group(1)), m.group(2), m.group(3)
        if kind == "tracing_mark_write":
            marks.append((rest.strip(), t))
        elif kind == "fuse_request_send":
            r = re.search(r"req (\d+) opcode \d+ \((\w+)\)", rest)
            sent[r.group(1)] = (t, r.group(2), marks[-1][0] if marks else "")
        elif kind == "fuse_request_end":
            s = sent.pop(re.search(r"req (\d+)", rest).group(1), None)
            if s:
                o = ops[s[2]][s[1]]
                o[0] += 1
                o[1] += t - s[0]
    times = {marks[i][0]: marks[i + 1][1] - marks[i][1] for i in range(len(marks) - 1)}
    return times, ops
def frames(work, mode, r):
    t0 = float(open("%s/%s-%d.t0" % (work, mode, r)).read())
    out = {}
    for line in open("%s/%s-%d.log" % (work, mode, r)):
        m = re.search(r"^(\d+\.\d+) .*fetched frames (\d+)\.\.(\d+)", line)
        if m:
            for f in range(int(m.group(2)), int(m.group(3)) + 1):
                out.setdefault(f, float(m.group(1)) - t0)
    return out
med = statistics.median
res = {m: [parse("%s/%s-%d.trace" % (work, m, r)) for r in range(1, rounds + 1)]
       for m in ("fuse", "fanotify")}
print("\n| step | FUSE (s) | fanotify (s) | FUSE - fanotify |")
print("|---|---|---|---|")
for s in steps + ("total",):
    f = [sum(t.values()) if s == "total" else t.get(s, 0) for t, _ in res["fuse"]]
    a = [sum(t.values()) if s == "total" else t.get(s, 0) for t, _ in res["fanotify"]]
    print("| %s | %.3f | %.3f | %+.3f |" % (s, med(f), med(a), med(f) - med(a)))
print("\nFUSE requests per step (medians over the rounds):\n")
print("| step | opcode | requests | summed send-to-answer (ms) |")
print("|---|---|---|---|")
for s in steps:
    names = sorted({o for _, ops in res["fuse"] for o in ops[s]})
    for o in sorted(names, key=lambda o: -med([ops[s][o][1] for _, ops in res["fuse"]])):
        print("| %s | %s | %d | %.1f |" % (
            s, o, med([ops[s][o][0] for _, ops in res["fuse"]]),
            1e3 * med([ops[s][o][1] for _, ops in res["fuse"]])))
fu = [frames(work, "fuse", r) for r in range(1, rounds + 1)]
fa = [frames(work, "fanotify", r) for r in range(1, rounds + 1)]
common = sorted(set.intersection(*(set(x) for x in fu + fa)),
                key=lambda f: med([x[f] for x in fa]))
print("\nFrames fetched in every run, in fanotify's order: median s after `ferry mount` (FUSE - fanotify)\n")
print(" ".join("%d:%.2f(%+.2f)" % (f, med([x[f] for x in fu]),
                                   med([x[f] for x in fu]) - med([x[f] for x in fa]))
               for f in common))
PY
