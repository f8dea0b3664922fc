#!/usr/bin/env bash
# Runs every ferry test: unit test binaries, bounded fuzz runs, then the
# end-to-end scripts (real kernel mounts, fsck.erofs). Each test prints
# "ok - NAME" or "not ok - NAME"; this script counts them and ends with
# "N passed, N failed". Env: BUILD (build dir), BIN (where ferry is),
# FERRY_TESTS_SKIP (names of tests not to run, e.g. "e2e/wan_lazy").
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-build}
BIN=${BIN:-bin}
case $BUILD in /*) ;; *) BUILD=$top/$BUILD ;; esac
case $BIN in /*) ;; *) BIN=$top/$BIN ;; esac
export FERRY=$BIN/ferry BUILD TOP=$top
only=${1:-}

log=$(mktemp)
one=$(mktemp)
times=$(mktemp)
trap 'rm -f "$log" "$one" "$times"' EXIT
status=0

run_one() { # name, command...
	local name=$1; shift
	case $name in *"$only"*) ;; *) return 0 ;; esac
	case " ${FERRY_TESTS_SKIP:-} " in *" $name "*)
		echo "# $name skipped (FERRY_TESTS_SKIP)"
		return 0 ;;
	esac
	echo "== $name"
	local start=$SECONDS
	"$@" 2>&1 | tee "$one"
	local rc=${PIPESTATUS[0]}
	# Per-test wall time, so the CI budget can be watched test by test.
	echo "# $name took $((SECONDS - start)) s"
	echo "$((SECONDS - start)) $name" >> "$times"
	cat "$one" >> "$log"
	if [ "$rc" -ne 0 ]; then
		status=1
		# A runner that failed without reporting counts as one failure.
		grep -q "^not ok" "$one" || echo "not ok - $name (exit $rc)" | tee -a "$log"
	fi
}

for t in "$BUILD"/tests/*/test_*; do
	[ -x "$t" ] || continue
	run_one "unit/$(basename "$(dirname "$t")")/$(basename "$t")" "$t"
done
# The module table of docs/ARCHITECTURE.md against every #include.
run_one layers /usr/bin/python3 "$top/tests/tools/check_layers.py" "$top"
if ls "$BUILD"/fuzz/fuzz_* >/dev/null 2>&1; then
	run_one fuzz "$top/tests/fuzz/run.sh" "$BUILD"/fuzz/fuzz_*
fi
for t in "$top"/tests/e2e/*.sh; do
	case $(basename "$t") in *lib.sh) continue ;; esac # sourced helpers
	run_one "e2e/$(basename "$t" .sh)" bash "$t"
done

passed=$(grep -c '^ok ' "$log")
failed=$(grep -c '^not ok ' "$log")
echo
echo "# slowest: $(sort -rn "$times" | head -8 | awk '{printf "%s %ss, ", $2, $1}')"
grep '^not ok ' "$log" | sed 's/^/FAILED: /'
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ] && [ "$status" -eq 0 ] && [ "$passed" -gt 0 ]
