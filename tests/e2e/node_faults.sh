#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# shellcheck disable=SC2016,SC2034 # expect_sh evaluates its quoted condition
# The node fault matrix (issue 44): faults of the node under lazy mounts,
# FUSE and fanotify. Every cell asserts the same four things:
#   - no wrong byte: every read gives the reference bytes or an error
#     (EIO), never other bytes or zeros;
#   - no hang: every operation ends within its stated bound (NF_* below);
#   - ferryd still answers ferry mount --list (where a ferryd is meant to
#     serve: not after its keeper and it were both killed);
#   - after the fault clears, reads succeed and ferry cache verify is
#     clean.
# The bounds and the cells are listed in docs/TESTING.md ("The node fault
# matrix"). The image is small and synthetic (node_image), so that a cell
# costs seconds.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/oci_lib.sh"
. "$(dirname "$0")/registry_lib.sh"
. "$(dirname "$0")/lazy_lib.sh"

# Bounds (seconds): a read that meets a fault ends with EIO, a mount and
# an umount return, ferryd answers --list, ferryd exits on SIGTERM.
NF_READ=30
NF_MOUNT=30
NF_UMOUNT=5
NF_LIST=5
NF_TERM=10
# Fetch options of every mount: a fault is met within NF_READ.
NF_OPTS=(--retries 2 --stall-timeout 5)

need_ferryd
need_cmds docker-registry mkfs.ext4 losetup
export -f read_check

# ------------------------------------------------------------- the image

# SRC: big.bin (24 MiB, more than the small caches hold), mid.bin (3 MiB)
# and 64 small files; converted to docker://REG (IMG) and reached through
# the fault proxy (PIMG).
SRC=$SCRATCH/src
node_image() {
	mkdir -p "$SRC/small"
	head -c $((24 << 20)) /dev/urandom >"$SRC/big.bin"
	head -c $((3 << 20)) /dev/urandom >"$SRC/mid.bin"
	for i in $(seq 64); do
		head -c $((i * 997)) /dev/urandom >"$SRC/small/f$i"
	done
	reg_start anon && fp_start || return 1
	IMG=docker://$REG/ferry/node:1
	PIMG=docker://$PROXY/ferry/node:1
	"$FERRY" convert -q "dir:$SRC" "$IMG"
}
check "the test image in a registry behind the fault proxy" node_image || e2e_done
ref=$SRC

# ------------------------------------------------------------ the checks

# Run CMD (a shell function too) for at most SECS: its status, or 124
# when it had to be stopped (it and its children).
bounded() { # SECS CMD...
	local secs=$1 pid p
	shift
	"$@" &
	pid=$!
	if ! wait_gone "$secs" "$pid"; then
		for p in $(ps -o pid= --ppid "$pid"); do
			kill -KILL "$p" 2>/dev/null
		done
		kill -KILL "$pid" 2>/dev/null
		wait "$pid" 2>/dev/null
		return 124
	fi
	wait "$pid"
}
# One check: a mount (fmount or fnmount ARGS) succeeds within NF_MOUNT.
mount_in_time() { # DESC fmount|fnmount ARGS...
	local d=$1
	shift
	check "$d: mount (< $NF_MOUNT s)" bounded "$NF_MOUNT" "$@"
}
# One check: ferryd answers ferry mount --list within NF_LIST.
lists() { # DESC
	check "$1: ferryd answers ferry mount --list (< $NF_LIST s)" \
		timeout -k 1 "$NF_LIST" "$FERRY" mount --list "${FERRYD_SOCK_OPT[@]}"
}
# One check: ferry umount of MNT returns within NF_UMOUNT and leaves no
# mount.
umount_in_time() { # DESC MNT
	local t0 ms
	t0=$(now_ms)
	check "$1: ferry umount" timeout -k 1 "$NF_UMOUNT" "$FERRY" umount \
		"${FERRYD_SOCK_OPT[@]}" "$2"
	ms=$(($(now_ms) - t0))
	expect_sh "$1: the umount took $ms ms (< $NF_UMOUNT s) and left no mount" \
		'[ "$ms" -lt $((NF_UMOUNT * 1000)) ] && ! is_mounted "$2"'
	is_mounted "$2" && umount -l "$2"
}
# One check: every file of MNT reads as the reference (within NF_READ
# each), its pages dropped first.
reads_right() { # DESC MNT
	local f bad=
	for f in big.bin mid.bin $(cd "$SRC" && echo small/*); do
		drop_pages "$2/$f" 2>/dev/null
		timeout -k 1 "$NF_READ" bash -c 'read_check "$@"' _ "$2/$f" "$SRC/$f" \
			>/dev/null 2>&1 || bad="$bad $f"
	done
	expect_sh "$1: every file reads right${bad:+ (not:$bad)}" '[ -z "$bad" ]'
}
# One check: ferry cache verify of the instance's cache is clean.
verify_clean() { # DESC
	check "$1: ferry cache verify is clean" \
		timeout -k 1 60 "$FERRY" cache --cache-dir "$FCACHE" verify
}
# One check: reading FILE of MNT fails with EIO within NF_READ, every
# byte before the error the reference's.
read_eio() { # DESC MNT FILE
	read_expect_eio "$1: /$3 fails with EIO, no wrong byte" "$2/$3" "$SRC/$3" "$NF_READ"
}
# One check: reading FILE of MNT ends within NF_READ, with the reference
# bytes or EIO, no wrong byte before it.
read_bounded() { # DESC MNT FILE
	local out
	out=$(timeout -k 1 "$NF_READ" bash -c 'read_check "$@"' _ "$2/$3" "$SRC/$3" 2>&1)
	if [[ $out == "ok "* || $out == "error EIO after "*" match" ]]; then
		ok "$1: /$3 reads right or fails with EIO within $NF_READ s ($out)"
	else
		notok "$1: /$3 reads right or fails with EIO within $NF_READ s"
		echo "    read_check: ${out:-no answer (timed out)}"
	fi
}
# At least half of the file system at DIR is free.
half_free() { # DIR
	local size avail
	read -r size avail < <(stat -f -c "%b %a" "$1")
	[ "$avail" -ge $((size / 2)) ]
}
# One check: ferryd exits within NF_TERM of SIGTERM.
term_in_time() { # DESC
	local p t0 ms
	p=$(daemon_pids | head -n 1)
	t0=$(now_ms)
	[ -n "$p" ] && kill -TERM "$p"
	wait_gone "$NF_TERM" "$p"
	ms=$(($(now_ms) - t0))
	expect_sh "$1: ferryd ${p:-?} exits on SIGTERM ($ms ms, < $NF_TERM s)" \
		'[ -n "$p" ] && ! kill -0 "$p" 2>/dev/null'
}

# ------------------------------------------ cache file system full: tmpfs
# Issue 44 item 1: an 8 MB tmpfs as the cache of a FUSE mount (fanotify
# needs pre-content events, which tmpfs lacks). The 24 MiB file cannot be
# cached: its read fails with EIO; then ferry umount returns, a new mount
# reads, SIGTERM stops ferryd. Before 262d9f8 the failed fetch left the
# readers lock unbalanced and eviction waited for ever: the umount hung,
# the next mount too, and SIGTERM no longer stopped ferryd.
cell_tmpfs_full() {
	local c="cache full (8 MB tmpfs), fuse" t=$SCRATCH/tmpfs M=$SCRATCH/m-tmpfs
	lazy_use tmpfs
	mkdir -p "$t"
	mount -t tmpfs -o size=8m,mode=0700 tmpfs "$t" || { notok "$c: mount a tmpfs"; return; }
	FCACHE=$t/cache
	mount_in_time "$c" fmount "$PIMG" "$M" "${NF_OPTS[@]}" || return
	read_eio "$c" "$M" big.bin
	# An operator's pause: eviction (of frames idle for 100 ms; ferryd
	# looks at least every second) runs before the umount.
	sleep 2
	lists "$c"
	umount_in_time "$c" "$M"
	# The fault clears: room for the whole image.
	mount -o remount,size=64m "$t"
	if mount_in_time "$c, room again" fmount "$PIMG" "$M" "${NF_OPTS[@]}"; then
		reads_right "$c, room again" "$M"
		verify_clean "$c, room again"
		umount_in_time "$c, room again" "$M"
	fi
	term_in_time "$c"
	umount "$t"
}

cell_tmpfs_full

e2e_done
