# shellcheck shell=bash disable=SC2034,SC2154
# SPDX-License-Identifier: MIT
# Helpers for the lazy FUSE mount tests (tests/e2e/fuse_*.sh), sourced
# after lib.sh, oci_lib.sh and registry_lib.sh (run directly it does
# nothing).
#
# Every test instance talks to its own ferryd through a private control
# socket under $SCRATCH (never the system's /run/ferry/ferryd.sock):
#
#   fuse_use NAME           select instance NAME: FSOCK (its socket), FLOG
#                           (its log) and FCACHE (its chunk cache), all
#                           under $SCRATCH/fd-NAME
#   fmount IMAGE MNT [ARGS] ferry mount --mode fuse through FSOCK/FCACHE
#   fumount MNT             ferry umount (bounded)
#   fuse_daemon_pids [SOCK] ferryd processes serving SOCK (default FSOCK)
#   fuse_stats MNT          "READ FETCHED PRESENT TOTAL PREFETCHED" of a mount
#   fcache_sum [CACHE]      "PRESENT CHUNKS DISKBYTES" over the cache's blobs
#   fp_mark / fp_data_bytes data-blob bytes the fault proxy served since
#                           the mark (an oracle independent of ferryd)
#   hashtree ROOT MODE SEED sha256 of every regular file, in a chosen
#                           read order (sorted|reverse|shuffle|pread)
#   read_check FILE REF     read FILE fully; report errno and whether the
#                           bytes delivered before an error are REF's
#
# On exit every ferryd of our sockets is stopped (TERM, then KILL), before
# registry_lib.sh's and lib.sh's traps run (the latter unmounts whatever
# is left under $SCRATCH).

[ "${BASH_SOURCE[0]}" = "$0" ] && exit 0

FERRYD=${FERRYD:-$(dirname "$FERRY")/ferryd}
FUSE_SOCKS=()
FSOCK=
FCACHE=
# Never the system daemon: ferry and ferryd read $FERRYD_SOCKET when no
# socket option is given, so even a call without one stays in $SCRATCH.
export FERRYD_SOCKET=$SCRATCH/default.sock
FUSE_SOCKS+=("$FERRYD_SOCKET")
FUSE_SOCK_OPT=()

need_ferryd() {
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
fuse_use() { # NAME
	FDIR=$SCRATCH/fd-$1
	FSOCK=$FDIR/ferryd.sock
	FLOG=$FDIR/ferryd.log
	FCACHE=$FDIR/cache
	mkdir -p "$FCACHE"
	FUSE_SOCKS+=("$FSOCK")
	export FERRYD_SOCKET=$FSOCK
	FUSE_SOCK_OPT=(--socket "$FSOCK")
}

fmount() { # IMAGE MNT [extra args]
	local img=$1 mnt=$2
	shift 2
	mkdir -p "$mnt"
	timeout -k 5 90 "$FERRY" mount --mode fuse "${FUSE_SOCK_OPT[@]}" \
		"$img" "$mnt" --cache-dir "$FCACHE" "$@" </dev/null
}

# ferry umount, bounded; ok only when MNT is no longer a mount point.
fumount() { # MNT
	timeout -k 5 60 "$FERRY" umount "${FUSE_SOCK_OPT[@]}" "$1" </dev/null || return 1
	if is_mounted "$1"; then
		echo "ferry umount returned 0 but $1 is still mounted" >&2
		return 1
	fi
}

fstype() { findmnt -n -o FSTYPE --mountpoint "$1" 2>/dev/null; }
is_fuse() { case $(fstype "$1") in fuse*) return 0 ;; esac; return 1; }

# Processes of the ferryd binary whose command line or environment names
# the socket (how ferry tells the daemon it starts which socket to use).
fuse_daemon_pids() { # [SOCK]
	local sock=${1:-$FSOCK} p exe
	for p in /proc/[0-9]*; do
		exe=$(readlink "$p/exe" 2>/dev/null) || continue
		exe=${exe% (deleted)}
		[ "${exe##*/}" = ferryd ] || continue
		if tr '\0' '\n' <"$p/cmdline" 2>/dev/null |
			grep -qxF -e "$sock" -e "--socket=$sock" ||
			tr '\0' '\n' <"$p/environ" 2>/dev/null |
			grep -qxF -e "FERRYD_SOCKET=$sock"; then
			echo "${p#/proc/}"
		fi
	done
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

# The daemons end their mounts when stopped; lib.sh's trap unmounts what
# is left (a dead FUSE mount included).
fuse_stop_all() {
	local s pids=()
	# Bounded from here on; a second signal (e.g. timeout(1) signals the
	# script and then its whole process group) must not cut it short.
	trap '' INT TERM
	for s in "${FUSE_SOCKS[@]}"; do
		# shellcheck disable=SC2207
		pids+=($(fuse_daemon_pids "$s"))
	done
	[ ${#pids[@]} -gt 0 ] || return 0
	kill -TERM "${pids[@]}" 2>/dev/null
	wait_gone 5 "${pids[@]}" && return 0
	for s in "${pids[@]}"; do
		kill -0 "$s" 2>/dev/null || continue
		echo "# cleanup: ferryd $s still runs 5 s after SIGTERM, killing" >&2
		kill -KILL "$s"
	done
	wait_gone 5 "${pids[@]}"
}
# Stop our daemons first, then run whatever was trapped on EXIT before.
eval "_fuse_prev_exit=$(trap -p EXIT | sed -e 's/^trap -- //' -e 's/ EXIT$//')"
trap 'fuse_stop_all; '"$_fuse_prev_exit" EXIT

# "READ FETCHED PRESENT TOTAL PREFETCHED" of the mount at MNT (bytes read
# through it, compressed bytes fetched from the registry, chunks present /
# total, uncompressed bytes made present by prefetch), from ferry mount
# --list --json.
fuse_stats() { # MNT
	timeout -k 2 20 "$FERRY" mount --list --json "${FUSE_SOCK_OPT[@]}" "$1" </dev/null |
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
fcache_sum() { # [CACHE]
	timeout -k 2 20 "$FERRY" cache --cache-dir "${1:-$FCACHE}" --json ls </dev/null |
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

FUSE_HASHTREE='
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
	python3 -c "$FUSE_HASHTREE" "$@"
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
