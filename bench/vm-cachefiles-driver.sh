#!/bin/sh
# SPDX-License-Identifier: MIT
# Guest driver of bench/vm_cachefiles.sh (busybox sh, run by the VM's
# /init of tests/vm/): the cachefiles mode against FUSE, a full pull and a
# local kernel mount of the same image, all in this one guest and run.
# Payload /payload/bench/env: IMAGE (repository:tag in the guest's
# registry), RUNS (rounds). Each measurement is one result-channel line
#   "BENCH KIND NAME ROUND SECONDS [BYTES-FETCHED MOUNT-S FIRST-BYTE-S]"
# that the host turns into the table; the rounds interleave the mounts in a
# rotating order, the page cache dropped before every run.
# shellcheck disable=SC2016 # sh -c scripts expand in the guest's sh
# shellcheck source=tests/vm/lib.sh
. "$VM_LIB"
# shellcheck source=/dev/null
. "$VM_PAYLOAD/bench/env"
B=/b

# /proc/uptime: centiseconds, enough for runs of a second or more.
now() { cut -d' ' -f1 /proc/uptime; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }
drop() { sync && echo 3 >/proc/sys/vm/drop_caches; }
# The rounds' orders: 0 1 2, 1 2 0, 2 0 1, ...
rotate() { # ROUND NAMES...
	_r=$1
	shift
	_n=$#
	_i=0
	while [ $_i -lt $_n ]; do
		eval "echo \${$(((_r + _i) % _n + 1))}"
		_i=$((_i + 1))
	done
}
# Unmount MNT and end the ferryd serving it (a fresh ferryd per cold run).
stop() { # MNT
	_pid=$(vm_field "$1" pid)
	ferry umount "$1" || return 1
	[ -z "$_pid" ] && return 0
	kill "$_pid" 2>/dev/null
	_i=0
	while kill -0 "$_pid" 2>/dev/null && [ $_i -lt 100 ]; do
		sleep 0.1
		_i=$((_i + 1))
	done
}
workload() { # ROOT: the startup workload of bench/lazy.sh
	cat "$1/etc/os-release" >/dev/null &&
		find "$1/usr" >/dev/null &&
		chroot "$1" /bin/sh -c true &&
		chroot "$1" /usr/bin/env true
}
result() { vm_diag "BENCH $*"; }

vm_check "a fresh ext4 (extents) for the caches" vm_mkext4 /tmp/b.ext4 $B 1500 || exit 1
vm_check "docker-registry answers on the guest's 127.0.0.1" vm_registry_start 5000 || exit 1
REF=docker://$VM_REGISTRY/$IMAGE

# --- cold start: from ferry mount to the end of the startup workload -------------
# cachefiles and fuse: lazy mounts over an empty cache and a fresh ferryd;
# pull: ferry mount --mode local (every blob fetched and verified into the
# chunk cache, then the kernel mount), the "full pull" of this setup.
r=1
while [ $r -le "$RUNS" ]; do
	for mode in $(rotate "$r" cachefiles fuse local); do
		rm -rf "$B/cold" && mkdir -p /mnt/cold && drop
		t0=$(now)
		if ! timeout 300 ferry mount --mode "$mode" --cache-dir "$B/cold" "$REF" /mnt/cold; then
			vm_notok "cold start, $mode, round $r: mount"
			exit 1
		fi
		tm=$(since "$t0")
		head -c 1 /mnt/cold/etc/os-release >/dev/null
		t1=$(since "$t0")
		if ! workload /mnt/cold; then
			vm_notok "cold start, $mode, round $r"
			exit 1
		fi
		t=$(since "$t0")
		f=$(vm_field /mnt/cold bytesFetched)
		[ "$mode" = local ] && f=-
		stop /mnt/cold
		result "cold $mode $r $t ${f:-?} $tm $t1"
	done
	r=$((r + 1))
done
vm_ok "cold start: $RUNS rounds of cachefiles, fuse and a full pull"

# --- warm: every byte in the mode's cache --------------------------------------------
# Each mount its own cache directory; cachefiles' kernel cache files are
# filled by reading everything once (a prefetch fills the chunk cache,
# docs/ARCHITECTURE.md), FUSE's chunk cache by --prefetch-all.
mkdir -p /mnt/cf /mnt/local /mnt/fuse
vm_check "mount cachefiles, local and fuse (--prefetch-all)" sh -c '
	ferry mount --mode cachefiles --cache-dir "$1/cf" "$2" /mnt/cf &&
	ferry mount --mode local --cache-dir "$1/local" "$2" /mnt/local &&
	ferry mount --mode fuse --prefetch-all --cache-dir "$1/fuse" "$2" /mnt/fuse' sh "$B" "$REF" ||
	exit 1
vm_check "fill cachefiles' cache files (tar of the whole tree)" sh -c \
	'tar cf - -C /mnt/cf . | cat >/dev/null'
full() { [ "$(vm_field /mnt/fuse chunksPresent)" = "$(vm_field /mnt/fuse chunksTotal)" ]; }
vm_check "the FUSE mount's prefetch completes" vm_wait 300 full
find /mnt/local -type f -size -64k | shuf | head -n 300 | sed 's|^/mnt/local/||' >/tmp/small.list
vm_diag "small files: $(wc -l </tmp/small.list) of at most 64 KiB"
f0=$(vm_field /mnt/cf bytesFetched)

seq_read() { tar cf - -C "$1" . | cat >/dev/null; }
small() { (cd "$1" && xargs cat </tmp/small.list >/dev/null); }
walk() { ls -lR "$1" >/dev/null; }
for w in seq_read small walk; do
	r=1
	while [ $r -le "$RUNS" ]; do
		for m in $(rotate "$r" cf local fuse); do
			drop
			t0=$(now)
			if ! $w "/mnt/$m"; then
				vm_notok "warm $w on /mnt/$m, round $r"
				exit 1
			fi
			result "$w $m $r $(since "$t0")"
		done
		r=$((r + 1))
	done
done
f=$(vm_field /mnt/cf bytesFetched)
vm_check "the warm runs fetched nothing through cachefiles ($f0 B before, $f B after)" [ "$f0" = "$f" ]
vm_ok "warm: $RUNS rounds of sequential, small-file and metadata-walk reads"
for m in cf fuse local; do ferry umount /mnt/$m; done
# After the unmount: the kernel links its cache files in only then.
vm_diag "disk use after the warm runs: cachefiles: chunk cache $(du -sk "$B/cf/blobs" | cut -f1) KiB + the kernel's cache files $(du -sk "$B/cf/fscache" | cut -f1) KiB; local $(du -sk "$B/local/blobs" | cut -f1) KiB; fuse $(du -sk "$B/fuse/blobs" | cut -f1) KiB"
echo "# guest driver: $VM_PASS ok, $VM_FAIL not ok"
[ "$VM_FAIL" -eq 0 ]
