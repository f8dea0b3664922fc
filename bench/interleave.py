#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Time shell commands in interleaved rounds and print a markdown table.

    interleave.py RUNS PREPARE NAME=COMMAND...

Each round runs PREPARE and then one command, for every command in turn,
so background load that comes and goes hits all of them alike (hyperfine
runs all runs of one command before the next). Each round runs the
commands in a new (seeded) random order, so that no command always follows
the same one: what a run leaves behind can slow the next (on the project
VM, memory freed by the previous run costs host faults; bench/prepare.sh
is the PREPARE that evens that out). One warm-up round is not counted.
Columns: mean ± standard deviation, median, min, max, and the median
relative to the fastest median. A command that fails stops the benchmark
with its exit status.
"""
import random
import statistics
import subprocess
import sys
import time


def run(cmd):
    subprocess.run(["sh", "-c", cmd], check=True, stdout=subprocess.DEVNULL)


def main():
    if len(sys.argv) < 4:
        sys.exit("usage: interleave.py RUNS PREPARE NAME=COMMAND...")
    runs, prepare = int(sys.argv[1]), sys.argv[2]
    cmds = [arg.split("=", 1) for arg in sys.argv[3:]]
    times = {name: [] for name, _ in cmds}
    try:
        order = random.Random(1)
        for rnd in range(runs + 1):
            for name, cmd in order.sample(cmds, len(cmds)):
                run(prepare)
                t0 = time.perf_counter()
                run(cmd)
                if rnd:
                    times[name].append(time.perf_counter() - t0)
    except subprocess.CalledProcessError as e:
        sys.exit("interleave.py: %s failed (%d)" % (e.cmd[-1], e.returncode))
    best = min(statistics.median(t) for t in times.values())
    print("| Command | Mean [ms] | Median [ms] | Min [ms] | Max [ms] | Relative (median) |")
    print("|:---|---:|---:|---:|---:|---:|")
    for name, _ in cmds:
        t = [x * 1000 for x in times[name]]
        sd = statistics.stdev(t) if len(t) > 1 else 0.0
        print("| `%s` | %.1f ± %.1f | %.1f | %.1f | %.1f | %.2f |" %
              (name, statistics.mean(t), sd, statistics.median(t), min(t), max(t),
               statistics.median(t) / 1000 / best))


main()
