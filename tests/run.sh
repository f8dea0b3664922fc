#!/usr/bin/env bash
# Runs every ferry test: unit test binaries, bounded fuzz runs, then the
# end-to-end scripts (real kernel mounts, fsck.erofs). Each test prints
# "ok - NAME" or "not ok - NAME"; this script counts them and ends with
# "N passed, N failed". `tests/run.sh FILTER` runs the tests whose name
# contains FILTER, or only e2e/NAME where FILTER is that test's exact
# name. Env: BUILD (build dir), BIN (where ferry is),
# FERRY_TESTS_SKIP (names of tests not to run, e.g. "e2e/wan_lazy"),
# FERRY_TEST_JOBS (end-to-end tests run at once; default 2),
# FERRY_UNIT_TIMEOUT (seconds a unit test or the fuzz runs may take; 600).
#
# Most e2e tests wait on their peers as much as they compute (registries,
# proxies with injected delays, timeouts; 30-80% of 2 CPUs each), so they
# run FERRY_TEST_JOBS at a time, each with its own TMPDIR, its output
# printed whole when it ends. A test whose file says "# ferry-test: alone"
# (it measures time or drops the page cache) runs with nothing beside it;
# one that says "# ferry-test: group NAME" (or checks the kernel log: group
# kernel-log) runs beside tests of its group only.
set -u
export PATH=/usr/sbin:/usr/bin:/sbin:/bin # Debian's tools (tests/lib/common.sh says why)
top=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-build}
BIN=${BIN:-bin}
case $BUILD in /*) ;; *) BUILD=$top/$BUILD ;; esac
case $BIN in /*) ;; *) BIN=$top/$BIN ;; esac
export FERRY=$BIN/ferry BUILD TOP=$top
only=${1:-}
max_jobs=${FERRY_TEST_JOBS:-2}
case $max_jobs in '' | *[!0-9]* | 0) echo "FERRY_TEST_JOBS must be a positive number, not '$max_jobs'" >&2; exit 2 ;; esac
unit_timeout=${FERRY_UNIT_TIMEOUT:-600}
case $unit_timeout in '' | *[!0-9]* | 0) echo "FERRY_UNIT_TIMEOUT must be a positive number of seconds, not '$unit_timeout'" >&2; exit 2 ;; esac

work=$(mktemp -d)
trap 'rm -rf --one-file-system "$work"' EXIT
log=$work/log
times=$work/times
: >"$log"
: >"$times"
status=0
declare -A job_name=() job_start=() # set -u: empty, not unset

# One e2e test named exactly runs alone: e2e/vm_cachefiles is not also
# e2e/vm_cachefiles_index and _layers.
exact=
case $only in e2e/?*) [ -f "$top/tests/${only}.sh" ] && exact=$only ;; esac
selected() { # NAME: passes the filter and is not skipped
	if [ -n "$exact" ]; then
		[ "$1" = "$exact" ] || return 1
	else
		case $1 in *"$only"*) ;; *) return 1 ;; esac
	fi
	case " ${FERRY_TESTS_SKIP:-} " in *" $1 "*)
		echo "# $1 skipped (FERRY_TESTS_SKIP)"
		return 1 ;;
	esac
}

# Starts NAME in the background, its output to a file of its own.
start_one() { # NAME command...
	local name=$1 id
	shift
	id=${name//\//_}
	mkdir -p "$work/$id.tmp"
	(TMPDIR=$work/$id.tmp exec "$@" >"$work/$id.out" 2>&1)&
	job_name[$!]=$name
	job_start[$!]=$SECONDS
}

# Waits for one started test (the given pid, or any) and reports it.
finish_one() { # [PID]
	local pid rc name id
	if [ -n "${1:-}" ]; then
		pid=$1
		wait "$pid"
	else
		wait -n -p pid
	fi
	rc=$?
	name=${job_name[$pid]}
	id=${name//\//_}
	echo "== $name"
	cat "$work/$id.out"
	# Per-test wall time, so the CI budget can be watched test by test.
	echo "# $name took $((SECONDS - job_start[$pid])) s"
	echo "$((SECONDS - job_start[$pid])) $name" >>"$times"
	cat "$work/$id.out" >>"$log"
	if [ "$rc" -ne 0 ]; then
		status=1
		# A runner that failed without reporting counts as one failure.
		grep -q "^not ok" "$work/$id.out" || echo "not ok - $name (exit $rc)" | tee -a "$log"
	fi
	# A test that failed may leave a mount in its TMPDIR: never cross it.
	rm -rf --one-file-system "$work/$id.tmp"
	unset "job_name[$pid]" "job_start[$pid]"
}

run_alone() { # NAME command...
	selected "$1" || return 0
	start_one "$@"
	finish_one $!
}

run_shared() { # NAME command...
	selected "$1" || return 0
	while [ "${#job_name[@]}" -ge "$max_jobs" ]; do finish_one; done
	echo "# $1 started"
	start_one "$@"
}

drain() { while [ "${#job_name[@]}" -gt 0 ]; do finish_one; done; }

# The e2e tests have watchdogs of their own (tests/lib/common.sh); these do
# not, and take seconds (the fuzz runs ~90 s): a hung one fails here, with
# the suite's log, instead of stalling it until CI's limit kills it all.
bounded=(timeout --kill-after=30 "$unit_timeout")
for t in "$BUILD"/tests/*/test_*; do
	[ -x "$t" ] || continue
	run_alone "unit/$(basename "$(dirname "$t")")/$(basename "$t")" "${bounded[@]}" "$t"
done
# The module table of docs/ARCHITECTURE.md against every #include.
run_alone layers "${bounded[@]}" /usr/bin/python3 "$top/tests/tools/check_layers.py" "$top"
if ls "$BUILD"/fuzz/fuzz_* >/dev/null 2>&1; then
	run_alone fuzz "${bounded[@]}" "$top/tests/fuzz/run.sh" "$BUILD"/fuzz/fuzz_*
fi
# Where each e2e test may run (docs/TESTING.md): beside any other test; in
# a group, beside tests of its group only; or alone. The kernel log is the
# machine's, and every file-backed EROFS mount logs as "device erofs": a
# test that checks it for EROFS errors cannot tell its own from those
# another test provokes on purpose, so the checkers form a group, and a
# checker that provokes errors says alone.
lane() { # FILE: alone, a group's name, or nothing
	local line
	line=$(grep -m1 '^# ferry-test: ' "$1")
	case $line in
	'# ferry-test: alone'*) echo alone ;;
	'# ferry-test: group '*) line=${line#'# ferry-test: group '}; echo "${line%% *}" ;;
	*) grep -q check_kernel_log "$1" && echo kernel-log ;;
	esac
}
alone=()
declare -A group=()
for t in "$top"/tests/e2e/*.sh; do
	l=$(lane "$t")
	case $l in
	'') run_shared "e2e/$(basename "$t" .sh)" bash "$t" ;;
	alone) alone+=("$t") ;;
	*) group[$l]+="$t " ;;
	esac
done
drain
for l in $(printf '%s\n' "${!group[@]}" | sort); do
	for t in ${group[$l]}; do run_shared "e2e/$(basename "$t" .sh)" bash "$t"; done
	drain
done
for t in "${alone[@]}"; do run_alone "e2e/$(basename "$t" .sh)" bash "$t"; done

passed=$(grep -c '^ok ' "$log")
failed=$(grep -c '^not ok ' "$log")
echo
echo "# slowest: $(sort -rn "$times" | head -8 | awk '{printf "%s %ss, ", $2, $1}')"
# Each failure with the first lines of what it printed under it (its
# condition, diagnostics): the end of the output is what CI shows.
awk '/^not ok / { print "FAILED: " $0; n = 4; next }
	n > 0 && /^[ \t]/ { print; n--; next }
	{ n = 0 }' "$log"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ] && [ "$status" -eq 0 ] && [ "$passed" -gt 0 ]
