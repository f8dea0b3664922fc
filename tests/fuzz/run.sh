#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# tests/fuzz/run.sh FUZZBIN...: a short bounded libFuzzer run of each
# target (e.g. $BUILD/fuzz/fuzz_meta) on a scratch copy of its seed corpus
# tests/fuzz/seeds/NAME/ (the repository is never written). Prints
# "ok - fuzz NAME" or "not ok - fuzz NAME" per target; on a failure, the
# tail of the fuzzer's log and the crash artifact, which is kept under
# $BUILD/fuzz/artifacts/NAME/ (reproduce: FUZZBIN ARTIFACT).
#
# Env: BUILD (default build), FUZZ_TIME seconds per target (default 20),
# FUZZ_JOBS targets run at once (default: number of CPUs, at most 4).
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BUILD:-build}
case $BUILD in /*) ;; *) BUILD=$top/$BUILD ;; esac
FUZZ_TIME=${FUZZ_TIME:-20}
jobs=${FUZZ_JOBS:-$(nproc 2>/dev/null || echo 1)}
[ "$jobs" -gt 4 ] && jobs=4

if [ $# -eq 0 ]; then
	echo "usage: tests/fuzz/run.sh FUZZBIN..." >&2
	exit 2
fi

work=$(mktemp -d /tmp/ferry-fuzz.XXXXXX) || exit 1
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; rm -rf "$work"' EXIT

# UBSan findings must stop the run like ASan ones do.
export UBSAN_OPTIONS="${UBSAN_OPTIONS:+$UBSAN_OPTIONS:}halt_on_error=1:print_stacktrace=1"

run_one() { # BIN NAME
	local bin=$1 name=$2 corpus=$work/$2/corpus art=$BUILD/fuzz/artifacts/$2
	rm -rf "$art"
	mkdir -p "$corpus" "$art"
	if [ -d "$top/tests/fuzz/seeds/$name" ]; then
		cp -r "$top/tests/fuzz/seeds/$name/." "$corpus/"
	fi
	"$bin" -max_total_time="$FUZZ_TIME" -timeout=10 -rss_limit_mb=2048 \
		-print_final_stats=1 -artifact_prefix="$art/" "$corpus" \
		>"$work/$name/log" 2>&1
	echo $? >"$work/$name/rc"
}

names=()
for bin in "$@"; do
	name=$(basename "$bin")
	name=${name#fuzz_}
	names+=("$name")
	mkdir -p "$work/$name"
	if [ ! -x "$bin" ]; then
		echo "not found: $bin" >"$work/$name/log"
		echo 127 >"$work/$name/rc"
		continue
	fi
	while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do
		wait -n
	done
	run_one "$bin" "$name" &
	pids+=($!)
done
wait

failed=0
for i in "${!names[@]}"; do
	name=${names[$i]}
	rc=$(cat "$work/$name/rc" 2>/dev/null || echo 255)
	execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/$name/log" | tail -n 1)
	if [ "$rc" -eq 0 ]; then
		echo "ok - fuzz $name (${execs:-?} runs in ${FUZZ_TIME}s)"
		continue
	fi
	failed=1
	echo "not ok - fuzz $name (exit $rc)"
	grep -E 'ERROR:|SUMMARY:|runtime error|Test unit written|artifact_prefix' \
		"$work/$name/log" | head -n 20 | sed 's/^/    /'
	# The report's first lines (with the stack), or the log's tail.
	if grep -qE 'ERROR:|runtime error' "$work/$name/log"; then
		echo "    --- report:"
		sed -n '/ERROR:\|runtime error/,$p' "$work/$name/log" | head -n 30 | sed 's/^/    /'
	else
		echo "    --- log tail:"
		tail -n 30 "$work/$name/log" | sed 's/^/    /'
	fi
	ls "$BUILD/fuzz/artifacts/$name/" 2>/dev/null | sed "s|^|    artifact: $BUILD/fuzz/artifacts/$name/|"
	echo "    reproduce: ${*:$((i + 1)):1} <artifact>"
done
exit $failed
