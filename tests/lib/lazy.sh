# shellcheck shell=bash disable=SC2016,SC2034,SC2154 # expect_sh evaluates its quoted condition
# SPDX-License-Identifier: MIT
# Helpers for the lazy mount tests served by ferryd, in either mode
# (tests/e2e/fuse_*.sh, fanotify_*.sh, prefetch.sh, mount_acl.sh), sourced
# after lib/common.sh, lib/oci.sh and lib/registry.sh (run directly it does
# nothing).
#
# Every test instance talks to its own ferryd through a private control
# socket under $SCRATCH (never the system's /run/ferry/ferryd.sock):
#
#   lazy_use NAME           select instance NAME: FSOCK (its socket), FLOG
#                           (its log) and FCACHE (its chunk cache), all
#                           under $SCRATCH/fd-NAME
#   mount_lazy MODE IMAGE MNT [ARGS]  ferry mount --mode MODE through
#                           FSOCK/FCACHE (bounded)
#   umount_lazy MNT         ferry umount through FSOCK (bounded)
#   daemon_pids [SOCK]      ferryd processes serving SOCK (default FSOCK)
#   keeper_pids [SOCK]      their mounts' keepers (ferryd-keeper)
#   keeper_pid MNT          the keeperPid ferry mount --list gives for MNT
#   keeper_replaced MNT OLD MNT's keeper is alive and not OLD (NEW_KEEPER)
#   mount_field MNT KEY     a field of MNT's entry in ferry mount --list --json
#   mount_stats MNT         "READ FETCHED PRESENT TOTAL PREFETCHED" of a mount
#   fetch_settle MNT        wait until fetch-ahead stops fetching for MNT
#   fcache_sum              "PRESENT CHUNKS DISKBYTES" over FCACHE's blobs
#   fp_mark / fp_data_bytes data-blob bytes the fault proxy served since
#                           the mark (an oracle independent of ferryd)
#   hashtree ROOT MODE SEED sha256 of every regular file, in a chosen
#                           read order (sorted|reverse|shuffle|pread)
#   read_check FILE REF     read FILE fully; report errno and whether the
#                           bytes delivered before an error are REF's
#   reread PATH             read $M/PATH again (pages dropped), == $ref/PATH
#   read_expect_eio DESC FILE REF [SECS]  one check: EIO (in time), no
#                           wrong bytes before it
#   lazy_setup [base] [proxy] [NOTE]
#                           the requirements, then the Debian fixtures in a
#                           fresh registry: IMG (and BASE), ref (refbase),
#                           blobs.txt, ref.sums (and the proxy, PIMG)
#   reg_damage_chunk IMAGE PATH / reg_repair_chunk
#                           flip a byte of PATH's first chunk in the
#                           registry's copy of its blob, and undo it
#   mount_damaged / damaged_reads / log_names_damage
#                           the checks around a damaged chunk of $BIG
#   readers_start / readers_wait / readers_agree / readers_no_wrong_bytes
#                           hashtree readers in the background, judged
#   mount_startup / startup_workload / ferryd_detached / tree_read /
#   conc_checks / mount_converted / mount_prefetch_all / prefetch_files_checks
#                           the checks fuse_lazy.sh and fanotify_lazy.sh
#                           share, for a mode (fuse or fanotify)
#
# On exit every ferryd of our sockets and every fanotify keeper we met is
# stopped (TERM, then KILL), before
# lib/registry.sh's and lib/common.sh's traps run (the latter unmounts whatever
# is left under $SCRATCH).

[ "${BASH_SOURCE[0]}" = "$0" ] && exit 0

FERRYD=${FERRYD:-$(dirname "$FERRY")/ferryd}
FERRYD_SOCKS=()
FSOCK=
FCACHE=
# Never the system daemon: ferry and ferryd read $FERRYD_SOCKET when no
# socket option is given, so even a call without one stays in $SCRATCH.
export FERRYD_SOCKET=$SCRATCH/default.sock
FERRYD_SOCKS+=("$FERRYD_SOCKET")
FERRYD_SOCK_OPT=()

# Root, ferry, ferryd and /dev/fuse (which ferryd opens in every mode).
need_ferryd() {
	need_root
	need_ferry
	if [ ! -x "$FERRYD" ]; then
		notok "$E2E_NAME: ferryd binary at $FERRYD (make all)"
		exit 1
	fi
	if [ ! -c /dev/fuse ]; then
		notok "$E2E_NAME: needs /dev/fuse"
		exit 1
	fi
}

# Each instance has its own directory: ferryd keeps its log (ferryd.log)
# and lock next to its socket.
lazy_use() { # NAME
	FDIR=$SCRATCH/fd-$1
	FSOCK=$FDIR/ferryd.sock
	FLOG=$FDIR/ferryd.log
	FCACHE=$FDIR/cache
	mkdir -p "$FCACHE"
	FERRYD_SOCKS+=("$FSOCK")
	export FERRYD_SOCKET=$FSOCK
	FERRYD_SOCK_OPT=(--socket "$FSOCK")
}

# ferry mount --mode MODE (a lazy mode: hosted by the test's ferryd),
# bounded; the chunk cache $FCACHE.
mount_lazy() { # MODE IMAGE MNT [extra args]
	local mode=$1 img=$2 mnt=$3
	shift 3
	mkdir -p "$mnt"
	timeout -k 5 90 "$FERRY" mount --mode "$mode" "${FERRYD_SOCK_OPT[@]}" \
		"$img" "$mnt" --cache-dir "$FCACHE" "$@" </dev/null
}

# ferry umount through the test's ferryd, bounded; ok only when MNT is no
# longer a mount point.
umount_lazy() { # MNT
	timeout -k 5 60 "$FERRY" umount "${FERRYD_SOCK_OPT[@]}" "$1" </dev/null || return 1
	if is_mounted "$1"; then
		echo "ferry umount returned 0 but $1 is still mounted" >&2
		return 1
	fi
}

fstype() { findmnt -n -o FSTYPE --mountpoint "$1" 2>/dev/null; }
is_fuse() { case $(fstype "$1") in fuse*) return 0 ;; esac; return 1; }

# PID runs ferryd-keeper as a FUSE or fanotify mount's keeper
# (ferryd-keeper fuse|fanotify ...).
is_keeper() { # PID
	local exe
	exe=$(readlink "/proc/$1/exe" 2>/dev/null) || return 1
	exe=${exe% (deleted)}
	[ "${exe##*/}" = ferryd-keeper ] &&
		tr '\0' '\n' <"/proc/$1/cmdline" 2>/dev/null | sed -n 2p | grep -qxE 'fuse|fanotify'
}

# Processes of ferryd and ferryd-keeper whose command line or environment
# names the socket (how ferry tells the daemon it starts which socket to
# use); KIND daemon: the servers (ferryd), keeper: the mounts' keepers
# (ferryd-keeper, which inherit the daemon's environment).
ferryd_pids() { # KIND SOCK
	local kind=$1 sock=$2 p comm k
	for p in /proc/[0-9]*; do
		# comm, read without a fork: this runs in polling loops, over
		# every process of the machine.
		read -r comm 2>/dev/null <"$p/comm" || continue
		case $comm in
		ferryd) k=daemon ;;
		ferryd-keeper) k=keeper ;;
		*) continue ;;
		esac
		if tr '\0' '\n' 2>/dev/null <"$p/cmdline" |
			grep -qxF -e "$sock" -e "--socket=$sock" ||
			tr '\0' '\n' 2>/dev/null <"$p/environ" |
			grep -qxF -e "FERRYD_SOCKET=$sock"; then
			[ "$k" = "$kind" ] && echo "${p#/proc/}"
		fi
	done
}
daemon_pids() { ferryd_pids daemon "${1:-$FSOCK}"; } # [SOCK]
keeper_pids() { ferryd_pids keeper "${1:-$FSOCK}"; }      # [SOCK]

# A field of MNT's entry in ferry mount --list --json (JSON text unless a
# string or a number); fails when MNT is not listed or has no such field.
mount_field() { # MNT KEY
	timeout -k 2 20 "$FERRY" mount --list --json "${FERRYD_SOCK_OPT[@]}" "$1" </dev/null |
		python3 -c '
import json, os, sys
mnt = os.path.realpath(sys.argv[1])
for m in json.load(sys.stdin)["mounts"]:
    if m["mountpoint"] == mnt:
        if sys.argv[2] not in m:
            sys.exit("%s: no field %s in %s" % (mnt, sys.argv[2], m))
        v = m[sys.argv[2]]
        print(v if isinstance(v, (str, int)) and not isinstance(v, bool) else json.dumps(v))
        sys.exit(0)
sys.exit("no mount %s in the list" % mnt)' "$1" "$2"
}

# The keeper of fanotify mount MNT as listed, also remembered so that the
# exit trap stops it even when no socket names it.
keeper_pid() { # MNT
	local k
	k=$(mount_field "$1" keeperPid) || return 1
	echo "$k" >>"$SCRATCH/keepers.seen"
	echo "$k"
}

# MNT's keeper as listed is alive and not OLD (a dead keeper replaced);
# its pid in NEW_KEEPER ("" when none is listed).
keeper_replaced() { # MNT OLD
	NEW_KEEPER=$(keeper_pid "$1" 2>/dev/null) && [ "$NEW_KEEPER" != "$2" ] &&
		is_keeper "$NEW_KEEPER"
}

# Wait (at most SECS) until none of PIDS lives.
wait_gone() { # SECS PID...
	local secs=$1 i p
	shift
	for i in $(seq $((secs * 10))); do
		for p in "$@"; do
			kill -0 "$p" 2>/dev/null && break
			p=
		done
		[ -z "$p" ] && return 0
		sleep 0.1
	done
	return 1
}

# The daemons end their mounts when stopped; lib/common.sh's trap unmounts what
# is left (a dead FUSE mount included).
ferryd_stop_all() {
	local s pids=()
	# Bounded from here on; a second signal (e.g. timeout(1) signals the
	# script and then its whole process group) must not cut it short.
	trap '' INT TERM
	for s in "${FERRYD_SOCKS[@]}"; do
		# shellcheck disable=SC2207
		pids+=($(daemon_pids "$s"))
	done
	ferryd_stop "${pids[@]}"
	# Then the keepers (fanotify mounts) that outlived them.
	pids=()
	for s in "${FERRYD_SOCKS[@]}"; do
		# shellcheck disable=SC2207
		pids+=($(keeper_pids "$s"))
	done
	if [ -f "$SCRATCH/keepers.seen" ]; then
		for s in $(sort -u "$SCRATCH/keepers.seen"); do
			is_keeper "$s" && pids+=("$s")
		done
	fi
	ferryd_stop "${pids[@]}"
}
ferryd_stop() { # PID...
	local p
	[ $# -gt 0 ] || return 0
	kill -TERM "$@" 2>/dev/null
	wait_gone 5 "$@" && return 0
	for p in "$@"; do
		kill -0 "$p" 2>/dev/null || continue
		echo "# cleanup: ferryd $p still runs 5 s after SIGTERM, killing" >&2
		kill -KILL "$p"
	done
	wait_gone 5 "$@"
}
# Stop our daemons first, then run whatever was trapped on EXIT before.
eval "_lazy_prev_exit=$(trap -p EXIT | sed -e 's/^trap -- //' -e 's/ EXIT$//')"
trap 'ferryd_stop_all; '"$_lazy_prev_exit" EXIT

# Wait (at most 20 s) until the mount at MNT has fetched nothing for 0.5 s:
# fetch-ahead goes on fetching after the reads that started it.
fetch_settle() { # MNT
	local prev=-1 cur i
	for i in $(seq 40); do
		cur=$(mount_field "$1" bytesFetched) || return 1
		[ "$cur" = "$prev" ] && return 0
		prev=$cur
		sleep 0.5
	done
	echo "the mount at $1 was still fetching after 20 s" >&2
	return 1
}

# "READ FETCHED PRESENT TOTAL PREFETCHED" of the mount at MNT (bytes read
# through it, compressed bytes fetched from the registry, chunks present /
# total, uncompressed bytes made present by prefetch), from ferry mount
# --list --json.
mount_stats() { # MNT
	timeout -k 2 20 "$FERRY" mount --list --json "${FERRYD_SOCK_OPT[@]}" "$1" </dev/null |
		python3 -c '
import json, os, sys
mnt = os.path.realpath(sys.argv[1])
for m in json.load(sys.stdin)["mounts"]:
    if m["mountpoint"] == mnt:
        print(m["bytesRead"], m["bytesFetched"], m["chunksPresent"], m["chunksTotal"],
              m["bytesPrefetched"])
        sys.exit(0)
sys.exit("no mount %s in the list" % mnt)' "$1"
}

# "PRESENT CHUNKS DISKBYTES" summed over every blob of the chunk cache.
fcache_sum() {
	timeout -k 2 20 "$FERRY" cache --cache-dir "$FCACHE" --json ls </dev/null |
		python3 -c '
import json, sys
bl = json.load(sys.stdin)["blobs"]
print(sum(b["chunksPresent"] for b in bl), sum(b["chunks"] for b in bl),
      sum(b["diskBytes"] for b in bl))'
}

# Poll (at most SECS, every 0.5 s) until CMD succeeds.
poll() { # SECS CMD...
	local end=$((SECONDS + $1))
	shift
	while :; do
		"$@" && return 0
		[ "$SECONDS" -ge "$end" ] && return 1
		sleep 0.5
	done
}

# The data blobs of IMAGE ("DIGEST SIZE UNCOMPRESSED CHUNKS" lines, in
# device order) into $SCRATCH/blobs.txt; DATA_C / DATA_U / DATA_CHUNKS are
# the sums.
image_blobs() { # IMAGE
	"$FERRY" inspect --json "$1" </dev/null | python3 -c '
import json, sys
for b in json.load(sys.stdin)["blobs"]:
    print(b["digest"], b["size"], b["uncompressedSize"], b["chunks"])' \
		>"$SCRATCH/blobs.txt" || return 1
	read -r DATA_C DATA_U DATA_CHUNKS < <(awk '{ c += $2; u += $3; n += $4 }
		END { print c + 0, u + 0, n + 0 }' "$SCRATCH/blobs.txt")
	[ "$DATA_C" -gt 0 ]
}

# Number of distinct chunks (device, uncompressed offset) of image files.
file_chunks() { # IMAGE PATH...
	local img=$1 p
	shift
	for p in "$@"; do
		"$FERRY" inspect --json "$img" "$p" </dev/null || return 1
	done | python3 -c '
import json, sys
dec, seen, buf = json.JSONDecoder(), set(), sys.stdin.read()
i = 0
while True:
    while i < len(buf) and buf[i].isspace():
        i += 1
    if i >= len(buf):
        break
    j, i = dec.raw_decode(buf, i)
    for c in j.get("chunks", []):
        seen.add((c["deviceId"], c["uncompressedOffset"]))
print(len(seen))'
}

# ------------------------------------------------------------ proxy bytes

fp_mark() { FP_MARK=$(wc -l <"$FP_LOG"); }

# Bytes of data blobs ($SCRATCH/blobs.txt) the proxy answered with 2xx
# since fp_mark: the Range lengths (a whole blob without Range).
fp_data_bytes() {
	python3 - "$FP_LOG" "$FP_MARK" "$SCRATCH/blobs.txt" <<'EOF'
import json, re, sys
log, mark, blobs = sys.argv[1], int(sys.argv[2]), sys.argv[3]
size = {}
for line in open(blobs):
    d, s = line.split()[:2]
    size[d] = int(s)
total = 0
for n, line in enumerate(open(log)):
    if n < mark:
        continue
    e = json.loads(line)
    m = re.search(r"/blobs/(sha256:[0-9a-f]{64})$", e["path"].split("?")[0])
    if e["method"] != "GET" or not m or m.group(1) not in size:
        continue
    if not str(e.get("status")).startswith("2"):
        continue
    sz = size[m.group(1)]
    r = e.get("range")
    if not r:
        total += sz
        continue
    for part in r.split("=", 1)[1].split(","):
        a, b = part.strip().split("-")
        if a == "":
            total += min(int(b), sz)
        else:
            end = min(int(b), sz - 1) if b else sz - 1
            total += max(0, end - int(a) + 1)
print(total)
EOF
}

# --------------------------------------------------------------- readers

HASHTREE_PY='
import hashlib, os, random, stat, sys
root, mode, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng = random.Random(seed)
files, errs = [], []
for d, dirs, names in os.walk(root, onerror=lambda e: errs.append(str(e))):
    for n in names:
        p = os.path.join(d, n)
        st = os.lstat(p)
        if stat.S_ISREG(st.st_mode):
            files.append((os.path.relpath(p, root), st.st_size))
files.sort()
if mode == "reverse":
    files.reverse()
elif mode in ("shuffle", "pread"):
    rng.shuffle(files)
out = []
for rel, size in files:
    p = os.path.join(root, rel)
    try:
        fd = os.open(p, os.O_RDONLY)
        try:
            if mode == "pread" and size:
                bs = rng.choice([4096, 65536, 131072 + 123, 1 << 20, (3 << 20) + 7])
                offs = list(range(0, size, bs))
                rng.shuffle(offs)
                buf = bytearray(size)
                for o in offs:
                    want = min(bs, size - o)
                    got = 0
                    while got < want:
                        b = os.pread(fd, want - got, o + got)
                        if not b:
                            raise OSError(0, "short read at %d" % (o + got))
                        buf[o + got:o + got + len(b)] = b
                        got += len(b)
                h = hashlib.sha256(buf).hexdigest()
            else:
                h = hashlib.sha256()
                while True:
                    b = os.read(fd, 1 << 20)
                    if not b:
                        break
                    h.update(b)
                h = h.hexdigest()
        finally:
            os.close(fd)
    except OSError as e:
        errs.append("%s: %s" % (rel, e))
        continue
    out.append("%s  %s" % (h, rel))
for line in sorted(out, key=lambda l: l[66:]):
    print(line)
for e in errs[:20]:
    print("ERROR " + e, file=sys.stderr)
sys.exit(1 if errs else 0)
'
hashtree() { # ROOT MODE SEED
	python3 -c "$HASHTREE_PY" "$@"
}

# Read FILE in 64 KiB steps. Prints "ok BYTES" or "error ERRNO-NAME after
# BYTES" and, when REF is given, whether the delivered bytes are REF's
# ("match"/"MISMATCH"); exit 0 only for a complete read equal to REF.
read_check() { # FILE [REF]
	python3 - "$@" <<'EOF'
import errno, os, sys
path = sys.argv[1]
ref = open(sys.argv[2], "rb").read() if len(sys.argv) > 2 else None
got, err = bytearray(), None
try:
    fd = os.open(path, os.O_RDONLY)
    try:
        while True:
            b = os.read(fd, 65536)
            if not b:
                break
            got += b
    finally:
        os.close(fd)
except OSError as e:
    err = e.errno
same = "" if ref is None else (" match" if ref[:len(got)] == bytes(got) else " MISMATCH")
if err is None:
    if ref is not None and len(got) != len(ref):
        same = " MISMATCH(length %d, want %d)" % (len(got), len(ref))
    print("ok %d%s" % (len(got), same))
    sys.exit(0 if same in ("", " match") else 1)
print("error %s after %d%s" % (errno.errorcode.get(err, str(err)), len(got), same))
sys.exit(1)
EOF
}

# Drop FILE's pages from the page cache, so that the next read goes to the
# daemon (per file; nothing global like drop_caches).
drop_pages() { # FILE...
	python3 -c '
import os, sys
for p in sys.argv[1:]:
    fd = os.open(p, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)' "$@"
}

# Read every file ROOT/PATH listed in SUMS (sha256sum lines of a reference
# tree) and print "EIO WRONG OTHER GOOD": files failing with EIO, reading
# other bytes, failing otherwise, and reading right.
damaged_counts() { # ROOT SUMS
	(cd "$1" && timeout 300 /usr/bin/python3 - "$2" <<'PY'
import errno, hashlib, sys
want = {}
for line in open(sys.argv[1]):
    h, p = line.rstrip("\n").split("  ", 1)
    want[p] = h
eio = wrong = other = good = 0
for p, h in want.items():
    try:
        got = hashlib.sha256(open(p, "rb").read()).hexdigest()
    except OSError as e:
        if e.errno == errno.EIO:
            eio += 1
        else:
            other += 1
        continue
    if got == h:
        good += 1
    else:
        wrong += 1
print(eio, wrong, other, good)
PY
	)
}

# Milliseconds since the epoch.
now_ms() { echo $(($(date +%s%N) / 1000000)); }

# expect_sh DESC SHELL-CONDITION: one check on a condition over the
# script's variables, e.g. expect_sh "small" '[ "$a" -gt 0 ] && [ "$a" -lt 9 ]'.
# A condition that cannot be evaluated (an empty number) fails.
expect_sh() { # DESC CONDITION
	# A subshell: an unset variable under set -u ends it, not the script.
	if (eval "$2") 2>"$SCRATCH/expect.err"; then
		ok "$1"
	else
		notok "$1"
		echo "    condition: $2"
		diag "$SCRATCH/expect.err" 3
		return 1
	fi
}

# Files under REF and MNT (relative PATHs) have the same bytes, each read
# again through the daemon (its pages dropped first).
same_files() { # REF MNT PATH...
	local ref=$1 mnt=$2 f rc=0
	shift 2
	for f in "$@"; do
		drop_pages "$mnt/$f" 2>/dev/null
		cmp "$ref/$f" "$mnt/$f" || rc=1
	done
	return $rc
}

# PATH of the mount at $M reads as $ref/PATH, read again through the daemon
# (its pages dropped first).
reread() { drop_pages "$M/$1" && read_check "$M/$1" "$ref/$1"; } # PATH

# read_expect_eio DESC FILE REF [SECS]: reading FILE fails with EIO within
# SECS (default 120) and every byte delivered before the error is REF's.
read_expect_eio() {
	local out
	out=$(timeout -k 5 "${4:-120}" bash -c "$(declare -f read_check)"'; read_check "$1" "$2"' \
		_ "$2" "$3" 2>&1)
	if [[ $out == "error EIO after "*" match" ]]; then
		ok "$1 ($out)"
		return 0
	fi
	notok "$1"
	echo "    read_check $2: ${out:-no answer (timed out)}"
	return 1
}

# ---------------------------------------------------------------- images

# lazy_setup [base] [proxy] [NOTE]: what the lazy mount tests need (root,
# ferry, ferryd, /dev/fuse, the commands below), then the Debian fixture
# images (oci_fixtures) in a fresh anonymous docker-registry: IMG (the
# edit tag), with base also BASE; their umoci trees ref and refbase; IMG's
# data blobs (image_blobs) and the digests of ref's files in
# $SCRATCH/ref.sums; with proxy also the counting proxy (fp_start) and
# PIMG, IMG through it. NOTE ends the description of the edit tag's
# conversion check. Ends the script when any step fails.
lazy_setup() {
	local a base='' proxy='' note=''
	for a in "$@"; do
		case $a in
		base) base=1 ;;
		proxy) proxy=1 ;;
		*) note=" $a" ;;
		esac
	done
	need_ferryd
	need_cmds docker-registry skopeo umoci chroot findmnt
	oci_fixtures
	if ! reg_start anon 2>"$LOG"; then
		notok "start docker-registry"
		diag "$LOG"
		e2e_done
	fi
	IMG=docker://$REG/ferry/debian:edit
	BASE=docker://$REG/ferry/debian:base
	check "convert oci:edit -> docker://$note" "$FERRY" convert -q "oci:$FIX:edit" "$IMG" ||
		e2e_done
	if [ -n "$base" ]; then
		check "convert oci:base -> docker://" "$FERRY" convert -q "oci:$FIX:base" "$BASE" ||
			e2e_done
		if ! refbase=$(umoci_ref "$FIX:base" "$SCRATCH/bundle-base" 2>"$LOG"); then
			notok "umoci unpack (base reference tree)"
			diag "$LOG"
			e2e_done
		fi
	fi
	if [ -n "$proxy" ]; then
		if ! fp_start 2>"$LOG"; then
			notok "start the counting proxy (faultproxy.py)"
			diag "$LOG"
			e2e_done
		fi
		PIMG=docker://$PROXY/ferry/debian:edit
	fi
	if ! ref=$(umoci_ref "$FIX:edit" "$SCRATCH/bundle" 2>"$LOG"); then
		notok "umoci unpack (reference tree)"
		diag "$LOG"
		e2e_done
	fi
	if ! image_blobs "$IMG" 2>"$LOG"; then
		notok "ferry inspect --json of the pushed image"
		diag "$LOG"
		e2e_done
	fi
	echo "# image: data blobs $DATA_C bytes compressed, $DATA_U uncompressed, $DATA_CHUNKS chunks"
	if ! hashtree "$ref" sorted 0 >"$SCRATCH/ref.sums" 2>"$LOG"; then
		notok "hash the reference tree"
		diag "$LOG"
		e2e_done
	fi
}

# Flip one byte in the middle of the first chunk's compressed range of
# PATH (a file of IMAGE, which must be in $SCRATCH/blobs.txt's image) in
# the registry's own copy of its blob. Sets DMG_BLOB (the blob's digest),
# DMG_LEN1 (the chunk's uncompressed length); reg_repair_chunk undoes it.
reg_damage_chunk() { # IMAGE PATH
	local dev coff csz
	read -r dev coff csz DMG_LEN1 < <("$FERRY" inspect --json "$1" "/${2#/}" </dev/null |
		python3 -c '
import json, sys
c = json.load(sys.stdin)["chunks"]
print(c[0]["deviceId"], c[0]["compressedOffset"], c[0]["compressedSize"], c[0]["length"])')
	DMG_BLOB=$(sed -n "${dev:-0}p" "$SCRATCH/blobs.txt" 2>/dev/null | cut -d' ' -f1)
	DMG_STORED=$(reg_stored_blob "${DMG_BLOB:-none}")
	if [ -z "$DMG_BLOB" ] || [ ! -f "$DMG_STORED" ]; then
		echo "no registry copy of $2's first chunk (device ${dev:-?}, blob ${DMG_BLOB:-?})" >&2
		return 1
	fi
	cp "$DMG_STORED" "$SCRATCH/blob.orig" || return 1
	python3 - "$DMG_STORED" $((coff + csz / 2)) <<'PY' || return 1
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(int(sys.argv[2]))
    b = f.read(1)
    f.seek(int(sys.argv[2]))
    f.write(bytes([b[0] ^ 0x5a]))
PY
	echo "# damaged byte $((coff + csz / 2)) of $DMG_BLOB (chunk 0 of /${2#/}: [$coff, +$csz))"
	DMG_DEV=$dev DMG_COFF=$coff
}
# Whether PATH's first chunk is in the frame reg_damage_chunk damaged
# (small files share frames: a damaged frame fails all of them).
in_damaged_frame() { # IMAGE PATH
	"$FERRY" inspect --json "$1" "/${2#/}" </dev/null | python3 -c '
import json, sys
c = json.load(sys.stdin)["chunks"]
sys.exit(0 if c and (c[0]["deviceId"], c[0]["compressedOffset"]) == (int(sys.argv[1]), int(sys.argv[2])) else 1)' "$DMG_DEV" "$DMG_COFF"
}
reg_repair_chunk() { cp "$SCRATCH/blob.orig" "$DMG_STORED"; }

# The file both fault tests damage: 3.5 MB of random data in four chunks,
# hardlinked as opt/c/big-link, in a blob no other file of /usr shares.
BIG=opt/c/big.bin

# Damage $BIG's first chunk in the registry (reg_damage_chunk), then mount
# IMG (mode MODE) at MNT: a lazy mount does not read it yet. Fails with
# one not ok line unless both worked.
mount_damaged() { # MODE MNT
	if ! reg_damage_chunk "$IMG" "$BIG" 2>"$LOG"; then
		notok "damage the first chunk of /$BIG in the registry"
		diag "$LOG"
		return 1
	fi
	check "mount --mode $1 with a damaged chunk in the registry (lazy: mount works)" \
		mount_lazy "$1" "$IMG" "$2"
}

# Reads of $BIG at MNT (mount_damaged) fail with EIO, again (nothing bad
# was cached) and through its hardlink, never delivering wrong bytes; its
# other chunks and every other file read right: six checks.
damaged_reads() { # MNT
	local m=$1
	read_expect_eio "reading the damaged file fails with EIO, no wrong bytes" "$m/$BIG" "$ref/$BIG"
	check_fails "cat of the damaged file says Input/output error" "Input/output error" \
		cat "$m/$BIG"
	read_expect_eio "a second read fails again (no bad bytes were cached)" "$m/$BIG" "$ref/$BIG"
	read_expect_eio "its hardlink fails with EIO too" "$m/opt/c/big-link" "$ref/$BIG"
	check "the file's other chunks read right (from offset $DMG_LEN1)" \
		cmp -i "$DMG_LEN1" "$ref/$BIG" "$m/$BIG"
	check "every other file reads right (treecmp without the damaged file)" \
		timeout 180 python3 "$TREECMP" --exclude '^opt/c/big' "$ref" "$m"
}

# One check: ferryd's log names the damaged blob and the chunk.
log_names_damage() {
	if grep -i "${DMG_BLOB#sha256:}" "$FLOG" | grep -qi chunk; then
		ok "ferryd's log names the damaged blob and chunk"
		grep -i "${DMG_BLOB#sha256:}" "$FLOG" | head -n 1 | sed 's/^/    /'
	else
		notok "ferryd's log names the damaged blob and chunk"
		diag "$FLOG" 5
	fi
}

# ---------------------------------------------------------- reader groups

# readers_start TAG ROOT SECS MODE...: one hashtree reader per MODE (seed:
# its index) over ROOT in the background, each bounded by SECS; output in
# $SCRATCH/TAG-I.sums and .err.
readers_start() {
	local root=$2 secs=$3 m
	RD_TAG=$1
	shift 3
	RD_MODES=("$@")
	RD_PIDS=()
	RD_RC=()
	for m in "$@"; do
		timeout -k 5 "$secs" python3 -c "$HASHTREE_PY" "$root" "$m" ${#RD_PIDS[@]} \
			>"$SCRATCH/$RD_TAG-${#RD_PIDS[@]}.sums" 2>"$SCRATCH/$RD_TAG-${#RD_PIDS[@]}.err" &
		RD_PIDS+=($!)
	done
}

# Wait for every reader; their exit statuses in RD_RC.
readers_wait() {
	local i
	for i in "${!RD_PIDS[@]}"; do
		wait "${RD_PIDS[$i]}"
		RD_RC[i]=$?
	done
}

# readers_agree DESC REF: one check: every reader ended with 0 and printed
# exactly the digests REF holds.
readers_agree() {
	local i bad=()
	for i in "${!RD_PIDS[@]}"; do
		[ "${RD_RC[$i]}" -eq 0 ] || bad+=("reader $i (${RD_MODES[$i]}): exit ${RD_RC[$i]}")
		cmp -s "$2" "$SCRATCH/$RD_TAG-$i.sums" || bad+=("reader $i (${RD_MODES[$i]}): digests differ")
	done
	if [ ${#bad[@]} -eq 0 ]; then
		ok "$1"
		return 0
	fi
	notok "$1"
	printf '    %s\n' "${bad[@]}" | head -n 20
	for i in "${!RD_PIDS[@]}"; do
		[ -s "$SCRATCH/$RD_TAG-$i.err" ] && diag "$SCRATCH/$RD_TAG-$i.err" 5 && break
	done
	for i in "${!RD_PIDS[@]}"; do
		cmp -s "$2" "$SCRATCH/$RD_TAG-$i.sums" ||
			{ diff "$2" "$SCRATCH/$RD_TAG-$i.sums" | head -n 10 | sed 's/^/    /'; break; }
	done
	return 1
}

# readers_no_wrong_bytes DESC REF [ERRNOS]: one check: every reader ended
# by itself (not by its timeout), every digest it printed is REF's for that
# file (a file read whole but wrong, zeros included, fails) and every
# error it reported is EIO (or one of ERRNOS, numbers separated by
# spaces). Counts the files read and failed in RD_OK / RD_EIO.
readers_no_wrong_bytes() {
	local i out rc=0 lines=() errnos=${3:-5}
	RD_OK=0
	RD_EIO=0
	for i in "${!RD_PIDS[@]}"; do
		if [ "${RD_RC[$i]}" -gt 1 ]; then
			out="exit ${RD_RC[$i]} (killed or crashed)"
			rc=1
		elif ! out=$(python3 - "$2" "$SCRATCH/$RD_TAG-$i.sums" "$SCRATCH/$RD_TAG-$i.err" "$errnos" <<'PY'
import sys
ref = {l[66:].rstrip("\n"): l[:64] for l in open(sys.argv[1])}
ok_errs = ["[Errno %s]" % e for e in sys.argv[4].split()]
bad, n = [], 0
for l in open(sys.argv[2]):
    n += 1
    name, h = l[66:].rstrip("\n"), l[:64]
    if ref.get(name) != h:
        bad.append("WRONG BYTES: %s (digest %s, want %s)" % (name, h, ref.get(name)))
for l in open(sys.argv[3]):
    if l.startswith("ERROR ") and not any(e in l for e in ok_errs):
        bad.append("not errno %s: %s" % (sys.argv[4], l.strip()))
print("%d read right, %d failed" % (n, len(ref) - n) if not bad else "; ".join(bad[:10]))
sys.exit(1 if bad else 0)
PY
		); then
			rc=1
		fi
		lines+=("reader $i (${RD_MODES[$i]}): $out")
	done
	for i in "${!RD_PIDS[@]}"; do
		RD_OK=$((RD_OK + $(wc -l <"$SCRATCH/$RD_TAG-$i.sums")))
	done
	RD_EIO=$(($(wc -l <"$2") * ${#RD_PIDS[@]} - RD_OK))
	if [ "$rc" -eq 0 ]; then
		ok "$1 ($RD_OK file reads right, $RD_EIO failed)"
	else
		notok "$1"
	fi
	printf '    %s\n' "${lines[@]}"
	return $rc
}

# ------------------------------------------- checks of fuse_ and fanotify_lazy

# "FUSE" for fuse, the mode's own name otherwise (for descriptions).
mode_name() { # MODE
	if [ "$1" = fuse ]; then echo FUSE; else echo "$1"; fi
}

# Mount PIMG (mode MODE, through the proxy) at MNT, one check, saying how
# long the mount took; the proxy's mark is set just before it.
mount_startup() { # MODE MNT
	local t0
	t0=$(now_ms)
	fp_mark
	check "mount --mode $1 docker:// (through the proxy)" mount_lazy "$1" "$PIMG" "$2" ||
		return 1
	echo "# mount returned after $(($(now_ms) - t0)) ms"
}

# Fetch-ahead (ELF and directory prediction) may still be fetching when a
# workload ends: wait, at most ~10 s, until neither the proxy nor ferry
# counts more, so that the two are compared at rest.
settle_fetches() { # MNT
	local prev= cur i
	for i in $(seq 40); do
		cur="$(fp_data_bytes) $(mount_stats "$1" 2>/dev/null)"
		[ "$cur" = "$prev" ] && return 0
		prev=$cur
		sleep 0.2
	done
}

# The startup workload on MNT (mount_startup on a fresh cache) and its
# checks: the mount fetched no file data; os-release, find /usr, chroot sh
# and env work; ferry's stats agree with the proxy's count; the workload
# fetched < 25% of the image and left most chunks absent.
startup_workload() { # MODE MNT
	local mode=$1 m=$2 f fetched stats present chunks disk absent
	local s_read s_fetched s_present s_total s_pf
	f=$(fp_data_bytes)
	expect_sh "the mount fetched no file data, only the bootstrap ($f B)" '[ "$f" -eq 0 ]'
	fp_mark
	check "startup: /etc/os-release reads as in the image" cmp "$ref/etc/os-release" "$m/etc/os-release"
	check "startup: find /usr lists the same entries as the reference" bash -c \
		'diff <(cd "$1" && find usr | sort) <(cd "$2" && timeout 60 find usr | sort)' _ "$ref" "$m"
	check "startup: chroot MNT /bin/sh -c true" timeout 60 chroot "$m" /bin/sh -c true
	check "startup: chroot MNT /usr/bin/env true" timeout 60 chroot "$m" /usr/bin/env true
	settle_fetches "$m"
	fetched=$(fp_data_bytes)
	stats=$(mount_stats "$m" 2>"$SCRATCH/stats.err") || stats=
	read -r present chunks disk < <(fcache_sum) || present=
	echo "# startup: fetched $fetched B (proxy) = $((fetched * 100 / DATA_U))% of $DATA_U B uncompressed, $((fetched * 100 / DATA_C))% of $DATA_C B compressed; chunks ${present:-?}/${chunks:-?} present, ${disk:-?} B on disk"
	if [ -n "$stats" ]; then
		read -r s_read s_fetched s_present s_total s_pf <<<"$stats"
		echo "# startup: ferry's stats: read $s_read B, fetched $s_fetched B, chunks $s_present/$s_total"
		expect_sh "ferry's stats: bytes fetched match the registry traffic ($s_fetched vs $fetched)" \
			'[ "$s_fetched" -le $((fetched + 65536)) ] && [ "$s_fetched" -ge $((fetched * 9 / 10)) ]'
		# bytesRead counts what ferryd serves: the kernel reads a
		# fanotify mount itself.
		[ "$mode" = fuse ] &&
			expect_sh "ferry's stats: some bytes read through the mount ($s_read)" '[ "$s_read" -gt 0 ]'
	else
		notok "ferry mount statistics of $m"
		diag "$SCRATCH/stats.err" 5
	fi
	expect_sh "startup fetched < 25% of the image ($fetched of $DATA_U B)" \
		'[ "$fetched" -gt 0 ] && [ "$fetched" -lt $((DATA_U / 4)) ]'
	absent="${present:-?} of ${chunks:-?} present"
	[ "$mode" = fuse ] && absent+=", ${disk:-?} B on disk"
	expect_sh "startup left most chunks absent ($absent)" \
		'[ "$present" -gt 0 ] && [ "$present" -lt $((chunks / 2)) ]'
}

# One check: a ferryd serves the mounts of this instance, and it is not
# the test's child.
ferryd_detached() {
	local dpid
	dpid=$(daemon_pids | head -n 1)
	expect_sh "ferryd runs (pid ${dpid:-none}) and is not a child of the test" \
		'[ -n "$dpid" ] && [ "$(ps -o ppid= -p "$dpid" | tr -d " ")" != "$$" ]'
}

# Mount IMG (mode MODE, a fresh cache) at MNT and read it all: the tree
# equals the reference and (nearly) every chunk is then present. Fails
# (after one not ok line) only when the mount does.
tree_read() { # MODE MNT
	local m=$2 t0 present chunks disk
	check "mount --mode $1 docker:// (fresh cache)" mount_lazy "$1" "$IMG" "$m" || return 1
	t0=$(now_ms)
	check "treecmp umoci unpack == lazy $(mode_name "$1") mount" timeout 180 python3 "$TREECMP" "$ref" "$m"
	echo "# treecmp over the lazy mount took $(($(now_ms) - t0)) ms"
	read -r present chunks disk < <(fcache_sum)
	# Chunks of lower-layer files that an upper layer deleted are never
	# read; they are few in this image.
	expect_sh "after a full read (nearly) every chunk is present ($present of $chunks)" \
		'[ "$chunks" = "$DATA_CHUNKS" ] && [ "$present" -ge $((chunks * 95 / 100)) ]'
}

# 16 concurrent readers in different orders through the proxy on a fresh
# cache (instance conc, mode MODE): they agree with the reference and
# fetch each chunk about once. Then umount and mount again with the same
# cache: a full read fetches nothing and the cache does not grow.
conc_checks() { # MODE
	local mode=$1 m=$SCRATCH/m-conc t0 fetched present chunks disk_before disk_after stats
	local s_read s_fetched s_present s_total s_pf
	lazy_use conc
	check "mount --mode $mode (fresh cache, 16 readers)" mount_lazy "$mode" "$PIMG" "$m" ||
		return 1
	fp_mark
	t0=$(now_ms)
	readers_start conc "$m" 170 sorted reverse shuffle pread sorted reverse shuffle pread \
		sorted reverse shuffle pread sorted reverse shuffle pread
	readers_wait
	echo "# 16 readers took $(($(now_ms) - t0)) ms, $(wc -l <"$SCRATCH/ref.sums") files each"
	readers_agree "16 concurrent readers: no errors, every digest equals the reference" \
		"$SCRATCH/ref.sums"
	fetched=$(fp_data_bytes)
	echo "# 16 readers fetched $fetched B from the registry (data blobs: $DATA_C B)"
	expect_sh "16 readers fetched each chunk about once ($fetched B, blobs $DATA_C B)" \
		'[ "$fetched" -ge $((DATA_C * 9 / 10)) ] && [ "$fetched" -le $((DATA_C * 11 / 10)) ]'

	read -r present chunks disk_before < <(fcache_sum)
	check "ferry umount (16 readers)" umount_lazy "$m"
	check "mount again with the same cache" mount_lazy "$mode" "$PIMG" "$m" || return 1
	fp_mark
	check "treecmp after the remount" timeout 180 python3 "$TREECMP" "$ref" "$m"
	fetched=$(fp_data_bytes)
	read -r present chunks disk_after < <(fcache_sum)
	expect_sh "remount: reading everything fetched nothing ($fetched B from the registry)" \
		'[ "$fetched" -eq 0 ]'
	expect_sh "remount: the cache's disk usage is unchanged ($disk_before -> $disk_after B)" \
		'[ "$disk_before" = "$disk_after" ]'
	if stats=$(mount_stats "$m" 2>/dev/null); then
		read -r s_read s_fetched s_present s_total s_pf <<<"$stats"
		# Only FUSE reads count in bytesRead (see startup_workload).
		if [ "$mode" = fuse ]; then
			expect_sh "remount: ferry's stats say 0 bytes fetched, $s_read read, $s_present/$s_total chunks" \
				'[ "$s_fetched" -eq 0 ] && [ "$s_read" -gt 0 ] && [ "$s_present" = "$s_total" ]'
		else
			expect_sh "remount: ferry's stats say 0 bytes fetched, $s_present/$s_total chunks" \
				'[ "$s_fetched" -eq 0 ] && [ "$s_present" = "$s_total" ]'
		fi
	else
		notok "remount: ferry's stats of $m"
	fi
	check "ferry umount (remount)" umount_lazy "$m"
}

# Convert the edit fixture to a local image of KIND (dir: or oci:) and
# mount it (mode MODE) at $SCRATCH/m-KIND: two checks, ok when both are.
mount_converted() { # MODE dir|oci
	local img=dir:$SCRATCH/out
	[ "$2" = oci ] && img=oci:$SCRATCH/layout:edit
	check "convert to $2:" "$FERRY" convert -q "oci:$FIX:edit" "$img" &&
		check "mount --mode $1 $2:" mount_lazy "$1" "$img" "$SCRATCH/m-$2"
}

# Every chunk of the cache is present.
all_present() {
	local p c d
	read -r p c d < <(fcache_sum 2>/dev/null) || return 1
	[ "$p" = "$c" ] && [ "$c" -gt 0 ]
}
# At least N chunks of the cache are present.
enough_present() { # N
	local p c d
	read -r p c d < <(fcache_sum 2>/dev/null) || return 1
	[ "$p" -ge "$1" ]
}

# Mount PIMG (mode MODE) at MNT with --prefetch-all (MOUNT-DESC names that
# check); then one check: every chunk becomes present without reads.
# The proxy's mark is set after it. Fails only when the mount does.
mount_prefetch_all() { # MODE MNT MOUNT-DESC
	local t0
	check "$3" mount_lazy "$1" "$PIMG" "$2" --prefetch-all || return 1
	t0=$SECONDS
	if poll 60 all_present; then
		ok "--prefetch-all: every chunk present without reads (after $((SECONDS - t0)) s)"
	else
		notok "--prefetch-all: every chunk present without reads (waited 60 s)"
		echo "    cache: $(fcache_sum) (present chunks, total, disk bytes)"
	fi
	fp_mark
}

# Mount PIMG (mode MODE, instance pffiles, a fresh cache) with a
# --prefetch-files list of three files (MOUNT-DESC names that check):
# their chunks become present without reads, the others stay absent, and
# reading those files then fetches nothing.
prefetch_files_checks() { # MODE MOUNT-DESC
	local m=$SCRATCH/m-pffiles need t0 present chunks disk f
	local pf=(/usr/bin/perl /usr/lib/file/magic.mgc /opt/c/big.bin)
	lazy_use pffiles
	printf '%s\n' "${pf[@]}" >"$SCRATCH/prefetch.list"
	if ! need=$(file_chunks "$IMG" "${pf[@]}" 2>"$LOG"); then
		notok "ferry inspect --json of the prefetch list's files"
		diag "$LOG"
		return 1
	fi
	check "$2" mount_lazy "$1" "$PIMG" "$m" --prefetch-files "$SCRATCH/prefetch.list" ||
		return 1
	t0=$SECONDS
	if poll 60 enough_present "$need"; then
		sleep 1 # let a step in flight finish
		ok "--prefetch-files: $need chunks of the listed files present without reads ($((SECONDS - t0)) s)"
	else
		notok "--prefetch-files: $need chunks of the listed files present without reads (waited 60 s)"
	fi
	read -r present chunks disk < <(fcache_sum)
	expect_sh "--prefetch-files: the other chunks stay absent ($present of $chunks present)" \
		'[ "$present" -lt $((chunks / 2)) ]'
	fp_mark
	check "--prefetch-files: the listed files read as the reference" \
		same_files "$ref" "$m" "${pf[@]#/}"
	f=$(fp_data_bytes)
	expect_sh "--prefetch-files: reading the listed files fetched nothing ($f B)" '[ "$f" -eq 0 ]'
	check "ferry umount (prefetch-files)" umount_lazy "$m"
}
