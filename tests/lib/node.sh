# shellcheck shell=bash disable=SC2016,SC2034,SC2154 # expect_sh evaluates its quoted condition
# SPDX-License-Identifier: MIT
# The node fault matrix (issue 44): faults of the node under lazy mounts,
# one cell per fault and mode, for tests/e2e/node_faults_fuse.sh and
# node_faults_fanotify.sh; sourced after lib/common.sh, lib/oci.sh,
# lib/registry.sh and lib/lazy.sh (run directly it does nothing).
#
# Every cell asserts the same four things:
#   - no wrong byte: every read gives the reference bytes or an error
#     (EIO; ENOTCONN from a FUSE mount whose daemon and keeper are gone,
#     ECONNABORTED for a read in flight when they went),
#     never other bytes or zeros;
#   - no hang: every operation ends within its bound (NF_* below);
#   - ferryd still answers ferry mount --list (where a ferryd is meant to
#     serve: not once its keeper and it were both killed);
#   - after the fault clears, reads succeed and ferry cache verify is
#     clean.
# The cells and the bounds are listed in docs/TESTING.md ("The node fault
# matrix"). The image is small and synthetic (node_setup), so that a cell
# costs seconds.
#
#   node_setup                  requirements, the image (IMG, PIMG through
#                               the fault proxy), its source SRC
#   cell_cache_full_tmpfs       (FUSE: fanotify needs pre-content events,
#                               which tmpfs lacks)
#   cell_cache_full_ext4 MODE   a 64 MB loop-mounted ext4, a filler file
#   cell_cache_eio MODE         ext4 on a loop device over eiofs, failing
#                               reads on demand
#   cell_registry_mount MODE    registry down while mounting
#   cell_registry_read MODE     registry down, then slow, under reads
#   cell_registry_successor MODE  registry down when ferryd's successor
#                               starts
#   cell_big_chunks             (FUSE) 8 reads of 64 MiB chunks at once:
#                               ferryd's memory stays bounded
#   cell_kill MODE ORDER        kill -9 of ferryd and the keeper: ferryd,
#                               keeper, ferryd-keeper, keeper-ferryd,
#                               together
#   node_matrix MODE            node_setup, then every cell of MODE

[ "${BASH_SOURCE[0]}" = "$0" ] && exit 0

# Bounds (seconds): a read that meets a fault ends (EIO), a mount and an
# umount return, ferryd answers --list, ferryd exits on SIGTERM, a
# successor or a new keeper serves after a kill -9.
NF_READ=30
NF_MOUNT=30
NF_UMOUNT=5
NF_LIST=5
NF_TERM=10
NF_TAKEOVER=10
# Fetch options of every mount: a fault is met within NF_READ.
NF_OPTS=(--retries 2 --stall-timeout 5)
EIOFS=$TOOLS/eiofs

# ------------------------------------------------------------- the image

# SRC: big.bin (24 MiB, more than the small caches hold), mid.bin (3 MiB)
# and 64 small files; converted to docker://REG (IMG) and reached through
# the fault proxy (PIMG); their digests in $SCRATCH/ref.sums.
SRC=$SCRATCH/src
node_image() {
	mkdir -p "$SRC/small"
	head -c $((24 << 20)) /dev/urandom >"$SRC/big.bin"
	head -c $((3 << 20)) /dev/urandom >"$SRC/mid.bin"
	for i in $(seq 64); do
		head -c $((i * 997)) /dev/urandom >"$SRC/small/f$i"
	done
	hashtree "$SRC" sorted 0 >"$SCRATCH/ref.sums" || return 1
	reg_start anon && fp_start || return 1
	IMG=docker://$REG/ferry/node:1
	PIMG=docker://$PROXY/ferry/node:1
	"$FERRY" convert -q "dir:$SRC" "$IMG"
}
node_setup() {
	need_ferryd
	need_tool "$EIOFS"
	need_cmds docker-registry mkfs.ext4 losetup fusermount3
	export -f read_check
	check "the test image in a registry behind the fault proxy" node_image || e2e_done
	ref=$SRC
}

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
# One check: ferry mount --mode MODE (through the proxy, NF_OPTS) at MNT
# succeeds within NF_MOUNT.
mount_in_time() { # DESC MODE MNT [ARGS]
	local d=$1 mode=$2 mnt=$3
	shift 3
	check "$d: mount (< $NF_MOUNT s)" \
		bounded "$NF_MOUNT" mount_lazy "$mode" "$PIMG" "$mnt" "${NF_OPTS[@]}" "$@"
}
# One check: ferryd answers ferry mount --list within NF_LIST.
lists() { # DESC
	check "$1: ferryd answers ferry mount --list (< $NF_LIST s)" \
		timeout -k 1 "$NF_LIST" "$FERRY" mount --list "${FERRYD_SOCK_OPT[@]}"
}
# One check: ferry umount of MNT returns within NF_UMOUNT and leaves no
# mount; a fanotify mount a ferryd serves (lists) leaves no journal of
# pending reads next to its socket either (they were never removed). A
# ferryd that does not list it (one a keeper started as it was killed
# together with the old ferryd) has no journal of it to remove.
umount_in_time() { # DESC MNT
	local t0 ms fan='' left
	[ "$(fstype "$2")" = erofs ] && [ -n "$(daemon_pids)" ] &&
		mount_field "$2" mode >/dev/null 2>&1 && fan=1
	t0=$(now_ms)
	timeout -k 1 "$NF_UMOUNT" "$FERRY" umount "${FERRYD_SOCK_OPT[@]}" "$2" >"$LOG" 2>&1
	ms=$(($(now_ms) - t0))
	if ! expect_sh "$1: ferry umount took $ms ms (< $NF_UMOUNT s) and left no mount" \
		'[ "$ms" -lt $((NF_UMOUNT * 1000)) ] && ! is_mounted "$2"'; then
		diag "$LOG" 5
		is_mounted "$2" && umount -l "$2"
	fi
	if [ -n "$fan" ]; then
		poll 2 no_journal
		left=$(cd "$FDIR" && compgen -G "fanotify-*.journal" | tr "\n" " ")
		expect_sh "$1: no fanotify journal left (${left:-none})" no_journal
	fi
}
no_journal() { ! compgen -G "$FDIR/fanotify-*.journal" >/dev/null; }
# One check: every file of MNT reads as the reference (within NF_READ
# each), its pages dropped first.
reads_right() { # DESC MNT
	local f bad='' first=''
	for f in big.bin mid.bin $(cd "$SRC" && echo small/*); do
		drop_pages "$2/$f" 2>/dev/null
		timeout -k 1 "$NF_READ" bash -c 'read_check "$@"' _ "$2/$f" "$SRC/$f" \
			>"$SCRATCH/read.out" 2>&1 && continue
		bad="$bad $f"
		[ -n "$first" ] || first="$f: $(cat "$SCRATCH/read.out")"
	done
	expect_sh "$1: every file reads right${bad:+ (not:$bad)}" '[ -z "$bad" ]' ||
		echo "    $first"
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
# One check: reading FILE of MNT ends within NF_READ with the reference
# bytes, or with EIO and no wrong byte before it.
read_bounded() { # DESC MNT FILE
	local out
	drop_pages "$2/$3" 2>/dev/null
	out=$(timeout -k 1 "$NF_READ" bash -c 'read_check "$@"' _ "$2/$3" "$SRC/$3" 2>&1)
	if [[ $out == "ok "*" match" || $out == "error EIO after "*" match" ]]; then
		ok "$1: /$3 reads right or fails with EIO within $NF_READ s ($out)"
	else
		notok "$1: /$3 reads right or fails with EIO within $NF_READ s"
		echo "    read_check: ${out:-no answer (timed out)}"
	fi
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
# A FUSE mount answers a read of a chunk whose fetch failed less than
# 0.5 s ago with EIO at once (FS_FAIL_MEMO_NS): a fault has cleared only
# once that has passed.
fail_memo() { sleep 0.6; }
# The page cache's copies of the cache's data files go: the next reads of
# a fanotify mount (the kernel reads them) or of a FUSE mount (ferryd
# splices from them) reach the file system below.
drop_cache_pages() {
	local f
	for f in "$FCACHE"/blobs/sha256/*.data; do
		[ -f "$f" ] && drop_pages "$f"
	done
}

# ------------------------------------------------- cache file systems

# A fresh ext4 of MB MiB, loop-mounted at DIR (from FILE: a regular file,
# or eiofs's disk). mount(8) sets the loop device to go with the mount.
ext4_at() { # FILE DIR MB
	mkdir -p "$2"
	[ -e "$1" ] || truncate -s "$3M" "$1"
	mkfs.ext4 -q -F -m 0 -O ^has_journal "$1" &&
		mount -o loop,errors=continue "$1" "$2"
}

# eiofs over a BACKING file of MB MiB at SHIM (its pid: EIO_PID), an ext4
# on it at DIR. Paths are chosen so that lib/common.sh's cleanup, which unmounts
# deepest and last in sort order first, takes DIR before SHIM.
eio_ext4_at() { # BACKING SHIM DIR MB
	mkdir -p "$2"
	truncate -s "$4M" "$1"
	"$EIOFS" "$1" "$2" -s 2>"$SCRATCH/eiofs.err" &
	EIO_PID=$!
	poll 5 test -f "$2/disk" && ext4_at "$2/disk" "$3" "$4"
}
eio_stop() { # SHIM
	fusermount3 -u "$1" 2>/dev/null
	wait_gone 5 "$EIO_PID" || kill -KILL "$EIO_PID" 2>/dev/null
	wait "$EIO_PID" 2>/dev/null
}

# ------------------------------------------ cache file system full: tmpfs
# Issue 44 item 1: an 8 MB tmpfs as the cache of a FUSE mount. The 24 MiB
# file cannot be cached: its read fails with EIO; then ferry umount
# returns, and once there is room again a new mount reads everything and
# SIGTERM stops ferryd. Before 262d9f8 the failed fetches left the readers
# lock unbalanced and eviction waited for it for ever, holding the cache's
# registry lock: the next mount hung.
cell_cache_full_tmpfs() {
	local c="cache full (8 MB tmpfs), fuse" t=$SCRATCH/tmpfs M=$SCRATCH/m-tmpfs
	lazy_use tmpfs
	mkdir -p "$t"
	mount -t tmpfs -o size=8m,mode=0700 tmpfs "$t" || { notok "$c: mount a tmpfs"; return; }
	FCACHE=$t/cache
	mount_in_time "$c" fuse "$M" || return
	read_eio "$c" "$M" big.bin
	# An operator's pause: eviction (of frames idle for 100 ms; ferryd
	# looks at least every second) runs before the umount.
	sleep 2
	lists "$c"
	umount_in_time "$c" "$M"
	# The fault clears: room for the whole image.
	mount -o remount,size=64m "$t"
	if mount_in_time "$c, room again" fuse "$M"; then
		reads_right "$c, room again" "$M"
		verify_clean "$c, room again"
		umount_in_time "$c, room again" "$M"
	fi
	term_in_time "$c"
	umount "$t"
}

# ------------------------------------------- cache file system full: ext4
# A 64 MB ext4 (loop), the cache on it, a filler file taking all but
# 2 MiB once the mount is up: the 24 MiB file fails with EIO, small files
# read right or fail with EIO, ferryd answers; the filler removed (the
# fault clears), the same mount reads everything right. (With the whole
# image about the file system's size, a read needing room right when it
# is full fails while eviction is behind: TESTING.md.)
cell_cache_full_ext4() { # MODE
	local mode=$1 c="cache full (64 MB ext4), $1" d=$SCRATCH/full-$1 M=$SCRATCH/m-full-$1
	local free f
	lazy_use "full-$mode"
	ext4_at "$SCRATCH/full-$mode.img" "$d" 64 || { notok "$c: make the ext4"; return; }
	FCACHE=$d/cache
	if mount_in_time "$c" "$mode" "$M"; then
		free=$(stat -f -c '%a * %S' "$d")
		fallocate -l $((free - (2 << 20))) "$d/filler"
		read_eio "$c" "$M" big.bin
		for f in small/f1 small/f64; do
			read_bounded "$c" "$M" "$f"
		done
		lists "$c"
		rm -f "$d/filler"
		fail_memo
		reads_right "$c, room again" "$M"
		verify_clean "$c, room again"
		umount_in_time "$c" "$M"
	fi
	ferryd_stop $(daemon_pids)
	umount "$d"
}

# ------------------------------------------- cache file system read errors
# The cache on an ext4 whose block device fails reads on demand (eiofs
# under a loop device; this kernel has no device-mapper). Everything read
# once (cached), the device's reads fail, the page cache's copies dropped:
# every read ends within the bound with the right bytes or EIO; the
# device mended, everything reads right and the cache verifies.
cell_cache_eio() { # MODE
	local mode=$1 c="cache read errors (ext4 on a failing device), $1"
	local d=$SCRATCH/eio-$1 M=$SCRATCH/m-eio-$1 f n
	lazy_use "eio-$mode"
	if ! eio_ext4_at "$SCRATCH/eio-$mode.img" "$d/a-shim" "$d/b-fs" 64; then
		notok "$c: eiofs and an ext4 on it"
		diag "$SCRATCH/eiofs.err" 5
		return
	fi
	FCACHE=$d/b-fs/cache
	if mount_in_time "$c" "$mode" "$M"; then
		reads_right "$c, before" "$M"
		drop_cache_pages
		kill -USR1 "$EIO_PID"
		for f in big.bin mid.bin small/f1 small/f33; do
			read_bounded "$c" "$M" "$f"
		done
		lists "$c"
		kill -USR2 "$EIO_PID"
		reads_right "$c, device mended" "$M"
		verify_clean "$c, device mended"
		umount_in_time "$c" "$M"
	fi
	ferryd_stop $(daemon_pids)
	umount "$d/b-fs"
	eio_stop "$d/a-shim"
	n=$(sed -n 's/^eiofs: failed \([0-9]*\) reads$/\1/p' "$SCRATCH/eiofs.err")
	expect_sh "$c: the device failed reads (${n:-?})" '[ "$n" -gt 0 ]'
}

# ------------------------------------------------------------ the registry
# Down while mounting (every request 503, a fresh cache): the mount fails
# within the bound naming the registry's answer and leaves nothing
# mounted, ferryd answers; back, the mount works and reads right.
cell_registry_mount() { # MODE
	local mode=$1 c="registry down at mount, $1" M=$SCRATCH/m-regmount-$1
	lazy_use "regmount-$mode"
	fp_set 503 count=-1
	bounded "$NF_MOUNT" mount_lazy "$mode" "$PIMG" "$M" "${NF_OPTS[@]}" >"$LOG" 2>&1
	rc=$?
	expect_sh "$c: the mount fails (exit $rc, < $NF_MOUNT s), naming the 503, nothing mounted" \
		'[ "$rc" -eq 1 ] && grep -q 503 "$LOG" && ! is_mounted "$M"' || diag "$LOG" 5
	lists "$c"
	fp_set none
	if mount_in_time "$c, registry back" "$mode" "$M"; then
		reads_right "$c, registry back" "$M"
		verify_clean "$c, registry back"
		umount_in_time "$c, registry back" "$M"
	fi
}

# Down under reads (blob requests 503): a cached file reads right, an
# uncached one fails with EIO, ferryd answers; then slow (every blob
# request waits 2 s, under the stall timeout): reads are right; back:
# everything reads right and the cache verifies.
cell_registry_read() { # MODE
	local mode=$1 c="registry down mid-read, $1" M=$SCRATCH/m-regread-$1
	lazy_use "regread-$mode"
	mount_in_time "$c" "$mode" "$M" || return
	check "$c: a file read while the registry is up" read_check "$M/small/f1" "$SRC/small/f1"
	fp_set 503 count=-1 path=/blobs/
	read_eio "$c" "$M" big.bin
	read_bounded "$c, a cached file" "$M" small/f1
	lists "$c"
	fp_set slow count=-1 path=/blobs/ delay=2
	read_bounded "registry slow (2 s a blob request), $mode" "$M" mid.bin
	fp_set none
	fail_memo
	reads_right "$c, registry back" "$M"
	verify_clean "$c, registry back"
	umount_in_time "$c" "$M"
}

# Down when ferryd's successor starts (kill -9 of ferryd, every request
# 503): the keeper's successor takes the mount over from the cache alone,
# answers, cached files read right, uncached ones fail with EIO; back:
# everything reads right.
cell_registry_successor() { # MODE
	local mode=$1 c="registry down at a successor's start, $1" M=$SCRATCH/m-regsucc-$1 old
	lazy_use "regsucc-$mode"
	mount_in_time "$c" "$mode" "$M" || return
	check "$c: a file read before the kill" read_check "$M/small/f1" "$SRC/small/f1"
	old=$(daemon_pids | head -n 1)
	fp_set 503 count=-1
	kill -KILL "$old"
	check "$c: a new ferryd serves the mount within $NF_TAKEOVER s" \
		poll "$NF_TAKEOVER" successor_serves "$old" "$M"
	lists "$c"
	read_bounded "$c, a cached file" "$M" small/f1
	read_eio "$c" "$M" big.bin
	fp_set none
	fail_memo
	reads_right "$c, registry back" "$M"
	verify_clean "$c, registry back"
	umount_in_time "$c" "$M"
}
# A ferryd other than OLD lists MNT.
successor_serves() { # OLD MNT
	local p
	p=$(daemon_pids | head -n 1)
	[ -n "$p" ] && [ "$p" != "$1" ] && mount_field "$2" mountpoint >/dev/null 2>&1
}

# ------------------------------------------------------------ big chunks
# An image with 64 MiB chunks (convert's largest): 8 one-byte reads of 8
# chunks at once. Each fill decodes a whole chunk; ferryd's fill buffers
# share one budget (128 MiB), so its peak memory grows by less than
# 200 MiB (the reads took it up by 531 MB before). Under ASan its
# quarantine is kept small: freed buffers would count as resident.
cell_big_chunks() {
	local c="64 MiB chunks, 8 reads at once" d=$SCRATCH/bigsrc M=$SCRATCH/m-big
	local p before after out
	lazy_use big
	mkdir -p "$d"
	python3 -c '
import os, sys
with open(sys.argv[1], "wb") as f:
    for k in range(8):
        f.write(os.urandom(1 << 20) + bytes([65 + k]) * (63 << 20))' "$d/chunks.bin" &&
		"$FERRY" convert -q --chunk-size 64M "dir:$d" "docker://$REG/ferry/big:1" ||
		{ notok "$c: the image"; return; }
	ASAN_OPTIONS="$ASAN_OPTIONS:quarantine_size_mb=1" check "$c: mount (< $NF_MOUNT s)" \
		bounded "$NF_MOUNT" mount_lazy fuse "docker://$PROXY/ferry/big:1" "$M" "${NF_OPTS[@]}" ||
		return
	p=$(daemon_pids | head -n 1)
	before=$(awk '/^VmHWM:/ { print $2 }' "/proc/$p/status")
	out=$(timeout -k 1 "$NF_READ" python3 -c '
import os, sys, threading
src, mnt = sys.argv[1], sys.argv[2]
bad = []
def one(k):
    off = (k << 26) + 5
    with open(mnt, "rb") as f, open(src, "rb") as r:
        if os.pread(f.fileno(), 1, off) != os.pread(r.fileno(), 1, off):
            bad.append(k)
ts = [threading.Thread(target=one, args=(k,)) for k in range(8)]
[t.start() for t in ts]
[t.join() for t in ts]
print("wrong at chunks %s" % bad if bad else "right")' "$d/chunks.bin" "$M/chunks.bin" 2>&1)
	after=$(awk '/^VmHWM:/ { print $2 }' "/proc/$p/status")
	expect_sh "$c: the bytes are right ($out)" '[ "$out" = right ]'
	expect_sh "$c: ferryd's peak memory grew by $(((after - before) / 1024)) MiB (< 200 MiB)" \
		'[ $((after - before)) -lt $((200 << 10)) ]'
	umount_in_time "$c" "$M"
	rm -rf "$d"
}

# ------------------------------------------------------------- kill -9
# kill -9 of ferryd and the mount's keeper in ORDER (ferryd, keeper,
# ferryd-keeper and keeper-ferryd with 0.5 s between, together: one kill)
# while 2 readers read the tree through a slow registry (blob requests
# held 0.3 s: reads are in flight). The readers end within the bound with
# the right bytes or an error (EIO; ENOTCONN once a FUSE mount has lost
# both, ECONNABORTED for the requests in flight then), never other bytes.
# Where a process lives on it replaces the other (a new keeper, a
# successor) and ferryd answers; where none does, ferry
# umount removes the mount without a daemon. Then the registry is fast
# again and a mount (the one left, or a new one) reads everything right.
cell_kill() { # MODE ORDER
	local mode=$1 order=$2 c="kill -9 $2, $1" M=$SCRATCH/m-kill-$1-$2
	local dpid kpid served='' errnos=5
	lazy_use "kill-$mode-$order"
	mount_in_time "$c" "$mode" "$M" || return
	dpid=$(daemon_pids | head -n 1)
	kpid=$(keeper_pid "$M" 2>/dev/null)
	if [ -z "$dpid" ] || ! is_keeper "${kpid:-none}"; then
		notok "$c: find ferryd (${dpid:-none}) and the keeper (${kpid:-none})"
		return
	fi
	fp_set slow count=-1 "method=^GET$" path=/blobs/ delay=0.3
	readers_start "kill-$mode-$order" "$M" "$((NF_READ + 30))" sorted shuffle
	sleep 1
	case $order in
	ferryd) kill -KILL "$dpid" ;;
	keeper) kill -KILL "$kpid" ;;
	ferryd-keeper) kill -KILL "$dpid" && sleep 0.5 && kill -KILL "$kpid" ;;
	keeper-ferryd) kill -KILL "$kpid" && sleep 0.5 && kill -KILL "$dpid" ;;
	together) kill -KILL "$dpid" "$kpid" ;;
	esac
	readers_wait
	fp_set none
	[ "$mode" = fuse ] && errnos="5 103 107"
	if [ "$mode" = fanotify ] && [ "$order" = together ]; then
		# The kernel's fail-open (docs/ARCHITECTURE.md, "fanotify"): with
		# the group's last descriptor gone, holes read as zeros. Nothing
		# of ferry's is left to answer; reported, not asserted.
		expect_sh "$c: the readers end by themselves (exits ${RD_RC[*]})" \
			'[ "${RD_RC[0]}" -le 1 ] && [ "${RD_RC[1]}" -le 1 ]'
		readers_no_wrong_bytes "$c: the readers (KNOWN: fail-open, not counted)" \
			"$SCRATCH/ref.sums" "$errnos" | sed 's/^\(not \)\?ok - /    # /'
	else
		readers_no_wrong_bytes "$c: the readers end, right bytes or an error, never wrong bytes" \
			"$SCRATCH/ref.sums" "$errnos"
	fi
	# Who serves now: a ferryd listing the mount, and its keeper.
	if poll "$NF_TAKEOVER" successor_keeper "$M"; then
		served=1
		lists "$c"
	else
		echo "    # no ferryd and keeper serve $M after $c"
	fi
	case $order in
	ferryd | keeper) expect_sh "$c: a ferryd and a keeper serve the mount again" '[ -n "$served" ]' ;;
	esac
	if [ -z "$served" ]; then
		umount_in_time "$c, nothing serves" "$M"
		mount_in_time "$c, mounted again" "$mode" "$M" || return
	fi
	reads_right "$c, after" "$M"
	verify_clean "$c, after"
	umount_in_time "$c" "$M"
}
# A ferryd lists MNT with a live keeper.
successor_keeper() { # MNT
	local k
	k=$(keeper_pid "$1" 2>/dev/null) && is_keeper "$k" && [ -n "$(daemon_pids)" ]
}

# ------------------------------------------------------------ the matrix

# Every cell of MODE in order, after node_setup: the two suites run the
# same list.
node_matrix() { # MODE
	local mode=$1 order
	node_setup
	[ "$mode" = fuse ] && cell_cache_full_tmpfs
	cell_cache_full_ext4 "$mode"
	cell_cache_eio "$mode"
	cell_registry_mount "$mode"
	cell_registry_read "$mode"
	cell_registry_successor "$mode"
	[ "$mode" = fuse ] && cell_big_chunks
	for order in ferryd keeper ferryd-keeper keeper-ferryd together; do
		cell_kill "$mode" "$order"
	done
}
