#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Time shell commands in interleaved rounds and print a markdown table.

    interleave.py [--base NAME] [--cpu] RUNS PREPARE NAME=COMMAND...

Each round runs PREPARE and then one command, for every command in turn,
so background load that comes and goes hits all of them alike (hyperfine
runs all runs of one command before the next). Each round runs the
commands in a new (seeded) random order, so that no command always follows
the same one: what a run leaves behind can slow the next (on the project
VM, memory freed by the previous run costs host faults; bench/prepare.sh
is the PREPARE that evens that out). One warm-up round is not counted.
Columns: mean ± standard deviation, median, min, max, and the median
relative to the fastest median. With --base NAME, a last column gives each
command's time divided by NAME's in the same round: the median of those
ratios and their range, which holds up better under changing load than a
ratio of medians. With --cpu, two more: each command's CPU time (user +
sys of it and its children, the median), and that against NAME's in the
same round: what load on a shared machine distorts least. A command
that fails stops the benchmark with its exit status.
"""
import random
import resource
import statistics
import subprocess
import sys
import time


def run(cmd):
    subprocess.run(["sh", "-c", cmd], check=True, stdout=subprocess.DEVNULL)


def main():
    args, base, cpu = sys.argv[1:], None, False
    if args[:1] == ["--base"] and len(args) > 1:
        base, args = args[1], args[2:]
    if args[:1] == ["--cpu"]:
        cpu, args = True, args[1:]
    if len(args) < 3:
        sys.exit("usage: interleave.py [--base NAME] [--cpu] RUNS PREPARE NAME=COMMAND...")
    runs, prepare = int(args[0]), args[1]
    cmds = [arg.split("=", 1) for arg in args[2:]]
    if base is not None and base not in [name for name, _ in cmds]:
        sys.exit("interleave.py: --base %s names no command" % base)
    times = {name: [] for name, _ in cmds}
    cpus = {name: [] for name, _ in cmds}
    try:
        order = random.Random(1)
        for rnd in range(runs + 1):
            for name, cmd in order.sample(cmds, len(cmds)):
                run(prepare)
                r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                t0 = time.perf_counter()
                run(cmd)
                t1 = time.perf_counter()
                r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                if rnd:
                    times[name].append(t1 - t0)
                    cpus[name].append(r1.ru_utime + r1.ru_stime -
                                      r0.ru_utime - r0.ru_stime)
    except subprocess.CalledProcessError as e:
        sys.exit("interleave.py: %s failed (%d)" % (e.cmd[-1], e.returncode))
    best = min(statistics.median(t) for t in times.values())
    head = "| Command | Mean [ms] | Median [ms] | Min [ms] | Max [ms] | Relative (median) |"
    rule = "|:---|---:|---:|---:|---:|---:|"
    if base is not None:
        head += " vs `%s`, same round: median [min, max] |" % base
        rule += "---:|"
    if cpu:
        head += " CPU [ms] |"
        rule += "---:|"
        if base is not None:
            head += " CPU vs `%s`, same round |" % base
            rule += "---:|"
    print(head)
    print(rule)
    for name, _ in cmds:
        t = [x * 1000 for x in times[name]]
        sd = statistics.stdev(t) if len(t) > 1 else 0.0
        row = "| `%s` | %.1f ± %.1f | %.1f | %.1f | %.1f | %.2f |" % (
            name, statistics.mean(t), sd, statistics.median(t), min(t), max(t),
            statistics.median(t) / 1000 / best)
        if base is not None:
            r = [a / b for a, b in zip(times[name], times[base])]
            row += " %.2f [%.2f, %.2f] |" % (statistics.median(r), min(r), max(r))
        if cpu:
            row += " %.0f |" % (statistics.median(cpus[name]) * 1000)
            if base is not None:
                r = [a / b for a, b in zip(cpus[name], cpus[base])]
                row += " %.2f [%.2f, %.2f] |" % (statistics.median(r), min(r), max(r))
        print(row)


main()
