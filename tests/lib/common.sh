# SPDX-License-Identifier: MIT
# Shared helpers for tests/e2e/*.sh (sourced, not run).
#
# Env: FERRY (ferry binary), TOP (repo root), BUILD (build dir; test tools
# are $BUILD/tests/tools/*). Each check prints exactly one "ok - DESC" or
# "not ok - DESC" line; diagnostics go on other lines, indented. e2e_done
# exits non-zero when any check failed.
#
# Every script gets a scratch dir ($SCRATCH, on the root fs under /tmp) and
# a cache dir for ferry ($CACHE). On exit everything mounted under $SCRATCH
# is unmounted (lazily as a last resort) and $SCRATCH is removed.

# Run directly (tests/run.sh runs every tests/e2e/*.sh), it does nothing.
[ "${BASH_SOURCE[0]}" = "$0" ] && exit 0

set -u
set -o pipefail
# Debian's tools, not the caller's: a python3 early on PATH may be a
# pyenv shim (0.3 s of bash per start, measured: a fifth of a lazy test's
# CPU) without the python3-* modules `make deps` installs.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin

TOP=${TOP:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
BUILD=${BUILD:-$TOP/build}
case $BUILD in /*) ;; *) BUILD=$TOP/$BUILD ;; esac
FERRY=${FERRY:-$TOP/bin/ferry}
TOOLS=$BUILD/tests/tools
TREECMP=$TOP/tests/tools/treecmp.py
MKFIXTURE=$TOP/tests/tools/mkfixture.sh
EROFS_MOUNT=$TOOLS/erofs_mount

# Under a sanitizer build an error must not look like ferry's own exit 1.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}exitcode=86"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:+$UBSAN_OPTIONS:}exitcode=87:print_stacktrace=1"

E2E_NAME=$(basename "$0" .sh)
E2E_PASS=0
E2E_FAIL=0

SCRATCH=$(mktemp -d "/tmp/ferry-e2e-$E2E_NAME.XXXXXX") || exit 1
CACHE=$SCRATCH/cache
LOG=$SCRATCH/cmd.log
mkdir -p "$CACHE"

# Mount points under $SCRATCH, deepest first (mountinfo escapes spaces as
# \040; scratch paths have none).
e2e_mounts() {
	awk -v s="$SCRATCH/" 'index($5, s) == 1 { print $5 }' /proc/self/mountinfo |
		sort -r
}

e2e_cleanup() {
	local m left
	kill "$E2E_WATCHDOG" 2>/dev/null
	wait "$E2E_WATCHDOG" 2>/dev/null
	for m in $(e2e_mounts); do
		umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null ||
			echo "# cleanup: cannot unmount $m" >&2
	done
	left=$(e2e_mounts)
	if [ -n "$left" ]; then
		echo "# cleanup: still mounted, scratch kept: $left" >&2
		return
	fi
	rm -rf "$SCRATCH"
}
# Watchdog: a hung command (ferry or a read on a mount) must not stall the
# whole suite. After E2E_TIMEOUT seconds it reports, ends this script's
# child processes and the script, whose EXIT trap then unmounts. It waits
# in a builtin read on a fifo, so cancelling it leaves no process behind.
E2E_TIMEOUT=${E2E_TIMEOUT:-600}
e2e_watchdog() {
	local p
	read -r -t "$E2E_TIMEOUT" _ <>"$SCRATCH/.watchdog" && return
	echo "not ok - $E2E_NAME: timed out after ${E2E_TIMEOUT}s"
	for p in $(ps -o pid= --ppid $$); do
		[ "$p" -ne "$BASHPID" ] && kill -TERM "$p" 2>/dev/null
	done
	kill -TERM $$
}
mkfifo "$SCRATCH/.watchdog"
e2e_watchdog </dev/null 2>/dev/null &
E2E_WATCHDOG=$!
# Only now: the watchdog must not inherit these.
# A second signal (timeout(1) signals the whole process group) must not cut
# the cleanup short: it ignores INT and TERM.
trap "trap '' INT TERM; e2e_cleanup" EXIT
trap 'exit 130' INT TERM

ok() {
	echo "ok - $*"
	E2E_PASS=$((E2E_PASS + 1))
}

notok() {
	echo "not ok - $*"
	E2E_FAIL=$((E2E_FAIL + 1))
}

# Print a file's tail as indented diagnostics.
diag() { # file [lines]
	tail -n "${2:-30}" "$1" 2>/dev/null | sed 's/^/    /'
}

# True when FILE holds a sanitizer report.
sanitizer_report() {
	grep -qE 'ERROR: (Address|Leak)Sanitizer|runtime error:' "$1"
}

# check DESC CMD...: ok when CMD exits 0; otherwise not ok plus its output.
# CMD's stdout+stderr are kept in $LOG for the caller.
check() {
	local desc=$1 rc
	shift
	"$@" >"$LOG" 2>&1
	rc=$?
	if [ "$rc" -eq 0 ] && sanitizer_report "$LOG"; then
		rc=86
	fi
	if [ "$rc" -eq 0 ]; then
		ok "$desc"
	else
		notok "$desc"
		echo "    command: $* (exit $rc)"
		diag "$LOG"
	fi
	return "$rc"
}

# check_exit DESC RC CMD...: ok when CMD exits with exactly RC (a crash by
# signal, exit >= 128, never matches). Output in $LOG.
check_exit() {
	local desc=$1 want=$2 rc
	shift 2
	"$@" >"$LOG" 2>&1
	rc=$?
	if [ "$rc" -eq "$want" ] && ! sanitizer_report "$LOG"; then
		ok "$desc"
		return 0
	fi
	notok "$desc"
	echo "    command: $* (exit $rc, expected $want)"
	diag "$LOG"
	return 1
}

# expect DESC CONDITION-CMD...: like check but for a test whose output is
# already somewhere else; prints no command output.
expect() {
	local desc=$1
	shift
	if "$@"; then
		ok "$desc"
	else
		notok "$desc"
		return 1
	fi
}

# Mounts: mount_local/umount_local here (no daemon); mount_lazy/umount_lazy
# through the test's own ferryd in lib/lazy.sh.

# ferry mount --mode local IMAGE MNT: the chunk cache $CACHE, unless the
# extra args name a --cache-dir.
mount_local() { # IMAGE MNT [extra args]
	local img=$1 mnt=$2 cache=(--cache-dir "$CACHE") a
	shift 2
	for a; do
		[ "$a" = --cache-dir ] && cache=()
	done
	mkdir -p "$mnt"
	"$FERRY" mount --mode local "$img" "$mnt" "${cache[@]}" "$@"
}

is_mounted() { mountpoint -q "$1"; }

# Unmount MNT through ferry, falling back to umount(8) so that a ferry bug
# does not leave the mount behind (the check still fails).
umount_local() { # MNT
	local mnt=$1
	if "$FERRY" umount "$mnt"; then
		! is_mounted "$mnt" && return 0
		echo "ferry umount returned 0 but $mnt is still mounted" >&2
	fi
	umount "$mnt" 2>/dev/null || umount -l "$mnt"
	return 1
}

# Two dir: images OUT1 and OUT2 have identical bootstrap and blob bytes
# (and identical FILEs, e.g. ferry.json).
same_image() { # OUT1 OUT2 [FILE...]
	local a=$1 b=$2 f rc=0
	shift 2
	for f in bootstrap "$@"; do
		cmp "$a/$f" "$b/$f" || rc=1
	done
	diff <(cd "$a/blobs/sha256" && ls) <(cd "$b/blobs/sha256" && ls) || return 1
	for f in "$a"/blobs/sha256/*; do
		[ -e "$f" ] || continue
		cmp "$f" "$b/blobs/sha256/$(basename "$f")" || rc=1
	done
	return $rc
}

# The --device= options for erofs-utils, one per blob in ferry.json order,
# pointing at the complete cache data files in $CACHE.
erofs_devices() { # OUT
	python3 - "$1" "$CACHE" <<'EOF'
import json, sys
idx = json.load(open(sys.argv[1] + "/ferry.json"))
for b in idx["blobs"]:
    print("--device=%s/blobs/sha256/%s.data" % (sys.argv[2], b["digest"].split(":", 1)[1]))
EOF
}

# ferry.json field via a python expression on `j`, e.g. 'j["blobs"][0]["size"]'.
index_get() { # OUT EXPR
	python3 -c 'import json,sys; j=json.load(open(sys.argv[1]+"/ferry.json")); print(eval(sys.argv[2]))' "$1" "$2"
}

# Kernel log: remember where it ends now; later print EROFS complaints
# logged since: errors met while reading files. Mount notices and mount
# refusals are left out (a refused mount fails its own check; other work on
# the machine, e.g. unit tests, refuses mounts on purpose).
dmesg_mark() {
	E2E_DMESG_MARK=$(dmesg 2>/dev/null | tail -n 1 | sed -n 's/^\[ *\([0-9.]*\)\].*/\1/p')
	E2E_DMESG_MARK=${E2E_DMESG_MARK:-0}
}
dmesg_erofs_errors() {
	dmesg 2>/dev/null | awk -v m="$E2E_DMESG_MARK" '
		match($0, /^\[ *[0-9.]+\]/) {
			t = substr($0, 2, RLENGTH - 2) + 0
			if (t > m + 0 && /erofs/ && !/mounted with root inode|unmounted for|extra devices don.t match|cannot find valid erofs superblock|failed to read superblock|EXPERIMENTAL [A-Z]+ feature in use/)
				print
		}'
}

# One check: no unexpected EROFS messages since dmesg_mark.
check_kernel_log() {
	local errs
	errs=$(dmesg_erofs_errors)
	if [ -z "$errs" ]; then
		ok "no EROFS errors in the kernel log"
	else
		notok "no EROFS errors in the kernel log"
		echo "$errs" | head -n 20 | sed 's/^/    /'
	fi
}

# Every command named must be installed (tests/deps.sh installs them).
need_cmds() { # command...
	local c
	for c in "$@"; do
		if ! command -v "$c" >/dev/null; then
			notok "$E2E_NAME: needs $c (tests/deps.sh installs it)"
			exit 1
		fi
	done
}

# CMD as the unprivileged user nobody: the local attacker of the security
# tests (runuser; the script runs as root).
as_nobody() { runuser -u nobody -- "$@"; }

need_root() {
	if [ "$(id -u)" -ne 0 ]; then
		notok "$E2E_NAME: needs root (mounts, devices, trusted xattrs)"
		exit 1
	fi
}

need_ferry() {
	if [ ! -x "$FERRY" ]; then
		notok "$E2E_NAME: ferry binary at $FERRY"
		exit 1
	fi
}

need_tool() { # path
	if [ ! -x "$1" ]; then
		notok "$E2E_NAME: test tool $1 (build with: make tests)"
		exit 1
	fi
}

# Build the edge-case fixture tree at DIR (see tests/tools/mkfixture.sh).
make_fixture() { # DIR
	if ! bash "$MKFIXTURE" "$1" >"$LOG" 2>&1; then
		notok "$E2E_NAME: build fixture tree"
		diag "$LOG"
		exit 1
	fi
}

e2e_done() {
	echo "# $E2E_NAME: $E2E_PASS ok, $E2E_FAIL not ok"
	exit $((E2E_FAIL > 0))
}
