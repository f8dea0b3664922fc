#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# run-vm.sh [options] KERNEL INITRD
#
# Boots KERNEL (tests/vm/build-kernel.sh) with INITRD (tests/vm/
# mkinitramfs.sh) under QEMU/TCG (no KVM needed: one vCPU, no network
# device, no disk; everything travels in the initramfs) and reports the
# guest's results as the host's tests do: each guest "ok - NAME" / "not ok -
# NAME" line becomes "ok - PREFIXNAME" / "not ok - PREFIXNAME", printed as
# it arrives; indented diagnostics pass through.
#
# The guest writes results to its second serial port (a file here), apart
# from the console (kernel messages can split console lines). The guest's
# /init ends with "== VM DONE rc=N" and `reboot -f`, which -no-reboot turns
# into QEMU's exit. No marker (timeout, panic, QEMU failure) is a failure:
# it is reported as such, with the tail of the console log; so is any "not
# ok" line.
#
# Options:
#   -t SECONDS   hard wall-clock limit for QEMU (default 240); the guest
#                kills its driver 20 s before (ferry.timeout=)
#   -m MB        guest memory (default 1024)
#   -l DIR       keep console.log, results.log and qemu.log in DIR (default:
#                a temporary directory, removed)
#   -p PREFIX    prefix for result names (default "vm: ")
#   -a ARGS      extra kernel command line arguments
# Exit status: 0 when the guest finished, reported no failure and at least
# one success.
set -euo pipefail

limit=240 mem=1024 logdir='' prefix='vm: ' extra=''
while getopts t:m:l:p:a:h o; do
	case $o in
	t) limit=$OPTARG ;;
	m) mem=$OPTARG ;;
	l) logdir=$OPTARG ;;
	p) prefix=$OPTARG ;;
	a) extra=$OPTARG ;;
	*)
		sed -n '3,30p' "$0" | sed 's/^# \{0,1\}//'
		exit 2
		;;
	esac
done
shift $((OPTIND - 1))
[ $# -eq 2 ] || {
	echo "usage: run-vm.sh [-t SECONDS] [-m MB] [-l DIR] [-p PREFIX] [-a ARGS] KERNEL INITRD" >&2
	exit 2
}
kernel=$1 initrd=$2
if [ ! -r "$kernel" ] || [ ! -r "$initrd" ]; then
	echo "run-vm.sh: cannot read $kernel or $initrd" >&2
	exit 2
fi
qemu=$(command -v qemu-system-x86_64) || {
	echo "run-vm.sh: qemu-system-x86_64 is missing (apt-get install qemu-system-x86)" >&2
	exit 2
}

tmpdir=''
if [ -z "$logdir" ]; then
	tmpdir=$(mktemp -d "${TMPDIR:-/tmp}/ferry-vm-run.XXXXXX")
	logdir=$tmpdir
fi
mkdir -p "$logdir"
console=$logdir/console.log results=$logdir/results.log
: >"$console"
: >"$results"
qpid=''
# shellcheck disable=SC2317 # run by the trap
cleanup() {
	# timeout(1) passes TERM on to QEMU.
	[ -n "$qpid" ] && kill -TERM "$qpid" 2>/dev/null
	[ -n "$tmpdir" ] && rm -rf "$tmpdir"
	return 0
}
trap cleanup EXIT
trap 'exit 130' INT TERM

guest_limit=$((limit > 60 ? limit - 20 : limit * 2 / 3))
# notsc: under TCG the guest calibrates the TSC against the emulated PIT;
# on a busy host that gave 401 MHz for a 2.6 GHz TSC (a guest clock 6x too
# fast, so guest timeouts 6x too short). Without the TSC the clock is
# tick-based (refined-jiffies), which QEMU drives from the host's clock.
start=$(date +%s)
timeout --kill-after=10 "$limit" "$qemu" -accel tcg -m "$mem" \
	-nodefaults -no-user-config -display none -no-reboot -nic none \
	-serial "file:$console" -serial "file:$results" \
	-kernel "$kernel" -initrd "$initrd" \
	-append "console=ttyS0 panic=-1 notsc ferry.epoch=$start ferry.timeout=$guest_limit $extra" \
	</dev/null >"$logdir/qemu.log" 2>&1 &
qpid=$!

shown=0 pass=0 fail=0 done_line=''
# Print the complete result lines not shown yet.
emit() {
	local n line
	n=$(wc -l <"$results")
	[ "$n" -gt "$shown" ] || return 0
	while IFS= read -r line; do
		line=${line%$'\r'}
		case $line in
		"ok - "*)
			pass=$((pass + 1))
			echo "ok - $prefix${line#ok - }"
			;;
		"not ok - "*)
			fail=$((fail + 1))
			echo "not ok - $prefix${line#not ok - }"
			;;
		"== VM DONE"*) done_line=$line ;;
		" "* | "	"*) echo "$line" ;;
		"") ;;
		*) echo "# $line" ;;
		esac
	done < <(sed -n "$((shown + 1)),${n}p" "$results")
	shown=$n
}

# Bounded: QEMU runs under timeout(1).
while kill -0 "$qpid" 2>/dev/null; do
	sleep 1
	emit
done
rc=0
wait "$qpid" || rc=$?
qpid=''
emit
secs=$(($(date +%s) - start))

why=''
if [ -z "$done_line" ]; then
	if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
		why="timed out after ${limit} s (no \"== VM DONE\" marker)"
	else
		why="QEMU exited (rc $rc) after $secs s without the \"== VM DONE\" marker"
	fi
elif [ "$fail" -eq 0 ] && [ "$pass" -eq 0 ]; then
	why="the guest reported no results ($done_line)"
elif [ "$fail" -eq 0 ] && [ "${done_line#== VM DONE rc=0 }" = "$done_line" ]; then
	why="the test driver failed without reporting a failure ($done_line)"
fi
if [ -n "$why" ]; then
	echo "not ok - ${prefix}guest run: $why"
	fail=$((fail + 1))
else
	echo "ok - ${prefix}guest ran to completion in $secs s (${done_line#== })"
fi
# The guest's uptime should not exceed the wall time QEMU ran.
up=$(echo "$done_line" | sed -n 's/.* uptime \([0-9]*\).*/\1/p')
if [ -n "$up" ] && [ "$up" -gt $((secs + secs / 5 + 2)) ]; then
	echo "# warning: the guest clock ran fast (uptime $up s in $secs s of wall time): guest timeouts were shorter"
fi
if [ "$fail" -gt 0 ]; then
	echo "    -- guest console, last 60 lines ($console):"
	tail -n 60 "$console" | tr -d '\r' | sed 's/^/    | /'
	[ -s "$logdir/qemu.log" ] && sed 's/^/    qemu: /' "$logdir/qemu.log"
	exit 1
fi
exit 0
