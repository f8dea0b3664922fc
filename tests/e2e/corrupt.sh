#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Damaged images must fail cleanly: exit 1 with a message naming what is
# wrong, no crash, nothing left mounted, no damaged chunk marked present in
# the cache. Damage: a byte flipped in a chunk's compressed bytes (check and
# mount name the chunk), a truncated or missing blob, a damaged chunk table,
# a truncated bootstrap, superblock fields changed with a valid checksum,
# random bootstrap bytes, and a broken ferry.json. Damage to a blob's own
# table or footer only fails check: mounts read chunks through the
# bootstrap's copy of the table and verify each one.
. "$(dirname "$0")/../lib/common.sh"
need_root
need_ferry

SRC=$SCRATCH/src
mkdir -p "$SRC/sub"
python3 - "$SRC" <<'EOF'
import os, random, sys
r = random.Random(7)
d = sys.argv[1]
open(d + "/three_chunks", "wb").write(r.randbytes(3 << 20))
open(d + "/text", "wb").write(b"corruption test line\n" * 2000)
open(d + "/small", "wb").write(b"s" * 300)
open(d + "/sub/inline", "wb").write(b"tiny\n")
os.symlink("three_chunks", d + "/link")
os.setxattr(d + "/text", "user.k", b"v")
EOF
P=$SCRATCH/pristine
if ! check "convert the test tree" "$FERRY" convert "dir:$SRC" "dir:$P" -q; then
	e2e_done
fi
check "ferry check passes on the intact image" "$FERRY" check "dir:$P"

BLOBHEX=$(index_get "$P" 'j["blobs"][0]["digest"].split(":")[1]')
NCHUNKS=$(index_get "$P" 'j["blobs"][0]["chunks"]')

# Copy of the pristine image to damage.
fresh() { # NAME -> path
	rm -rf "${SCRATCH:?}/${1:?}"
	cp -a "$P" "$SCRATCH/$1"
	echo "$SCRATCH/$1"
}

# Byte offset inside chunk IDX's compressed bytes. Blob layout (pkg-blob
# format.c / docs/FORMAT.md): [data][table: 64-byte entries][footer: 64
# bytes, magic "FERRYBL1", nr_chunks u32 at +12, table_offset u64 at +16];
# entry: coff u64 at +8, csize u32 at +20.
chunk_byte() { # BLOBFILE IDX -> "OFFSET (I|J|...)": a byte of its frame, its frame's chunks
	python3 - "$@" <<'EOF'
import struct, sys
path, idx = sys.argv[1], int(sys.argv[2])
data = open(path, "rb").read()
footer = data[-64:]
n = struct.unpack_from("<I", footer, 12)[0]
table = struct.unpack_from("<Q", footer, 16)[0]
if footer[:8] != b"FERRYBL1" or table + 64 * n + 64 != len(data) or idx >= n:
    sys.exit("unexpected footer: %r nr_chunks %d table %d" % (footer[:8], n, table))
coff = struct.unpack_from("<Q", data, table + 64 * idx + 8)[0]
csize = struct.unpack_from("<I", data, table + 64 * idx + 20)[0]
if not (0 < csize and coff + csize <= table):
    sys.exit("chunk %d: coff %d csize %d outside data (table at %d)" % (idx, coff, csize, table))
# Chunks batched into one frame share coff: damage there may surface in
# any of them, so print their indexes as a pattern after the offset.
frame = [str(i) for i in range(n)
         if struct.unpack_from("<Q", data, table + 64 * i + 8)[0] == coff]
print(coff + csize // 2, "(" + "|".join(frame) + ")")
EOF
}

flip() { # FILE OFFSET [XOR]
	python3 - "$1" "$2" "${3:-255}" <<'EOF'
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(int(sys.argv[2])); b = f.read(1)
    f.seek(int(sys.argv[2])); f.write(bytes([b[0] ^ int(sys.argv[3])]))
EOF
}

# Record the (damaged) bootstrap's digest and size in ferry.json, so the
# damage reaches ferry's metadata validation instead of the digest check.
reindex() { # OUT
	python3 - "$1" <<'EOF'
import hashlib, json, os, sys
out = sys.argv[1]
j = json.load(open(out + "/ferry.json"))
data = open(out + "/bootstrap", "rb").read()
j["bootstrap"]["digest"] = "sha256:" + hashlib.sha256(data).hexdigest()
j["bootstrap"]["size"] = len(data)
json.dump(j, open(out + "/ferry.json", "w"))
EOF
}

# fails_cleanly DESC CMD...: exit status exactly 1 and a message on stderr.
fails_cleanly() {
	local desc=$1 rc
	shift
	"$@" >"$SCRATCH/stdout" 2>"$LOG"
	rc=$?
	if [ "$rc" -eq 1 ] && [ -s "$LOG" ] && ! sanitizer_report "$LOG"; then
		ok "$desc"
		return 0
	fi
	notok "$desc"
	echo "    command: $* (exit $rc, expected 1 with a message)"
	diag "$LOG"
	return 1
}

# fails_naming DESC PATTERN CMD...: fails cleanly and stderr matches PATTERN.
fails_naming() {
	local desc=$1 pat=$2
	shift 2
	fails_cleanly "$desc" "$@" || return 1
	if ! grep -qiE -- "$pat" "$LOG"; then
		notok "$desc: message names /$pat/"
		diag "$LOG"
		return 1
	fi
	ok "$desc: message names /$pat/"
}

# mount_fails DESC OUT [PATTERN]: ferry mount fails cleanly (with a fresh
# cache), nothing is mounted and no device file is left in that cache.
MNT=$SCRATCH/mnt
mkdir -p "$MNT"
mount_fails() {
	local desc=$1 out=$2 pat=${3:-} cache=$SCRATCH/cache-fail left
	rm -rf "$cache"
	mkdir -p "$cache"
	if [ -n "$pat" ]; then
		fails_naming "$desc" "$pat" "$FERRY" mount --mode local "dir:$out" "$MNT" --cache-dir "$cache"
	else
		fails_cleanly "$desc" "$FERRY" mount --mode local "dir:$out" "$MNT" --cache-dir "$cache"
	fi
	if is_mounted "$MNT"; then
		notok "$desc: nothing left mounted"
		umount "$MNT" 2>/dev/null || umount -l "$MNT"
	else
		ok "$desc: nothing left mounted"
	fi
	if "$FERRY" cache --cache-dir "$cache" --json ls >"$SCRATCH/ls.json" 2>"$LOG" &&
		python3 - "$SCRATCH/ls.json" "$BLOBHEX" <<'EOF'
import json, sys
ls = json.load(open(sys.argv[1]))
for b in ls["blobs"]:
    if b["digest"] == "sha256:" + sys.argv[2] and b["chunksPresent"] >= b["chunks"]:
        sys.exit("blob complete in the cache despite the damage: %r" % b)
EOF
	then
		ok "$desc: the blob is not complete in the cache"
	else
		notok "$desc: the blob is not complete in the cache"
		diag "$LOG"
	fi
}

# mount_reads_ok DESC OUT: the mount succeeds and reads what the pristine
# image $P holds.
tree_digest() { (cd "$1" && tar --sort=name -cf - . | sha256sum); }
mount_reads_ok() {
	local desc=$1 out=$2 cache=$SCRATCH/cache-ok
	rm -rf "$cache"
	if check "$desc" "$FERRY" mount --mode local "dir:$out" "$MNT" --cache-dir "$cache"; then
		expect "$desc: same bytes as the pristine image" \
			[ "$(tree_digest "$MNT")" = "$PRISTINE_DIGEST" ]
		umount "$MNT"
	fi
}

# The commands that read a damaged part fail cleanly: check for damage
# anywhere in a blob, mount for damaged chunks (inspect reads only
# ferry.json and the bootstrap), all three for index or bootstrap damage.
blob_fail() { # WHAT OUT
	fails_cleanly "check: $1" "$FERRY" check "dir:$2"
	mount_fails "mount: $1" "$2"
}
blob_tail_fail() { # WHAT OUT
	fails_cleanly "check: $1" "$FERRY" check "dir:$2"
	mount_reads_ok "mount: $1" "$2"
}
all_fail() { # WHAT OUT
	fails_cleanly "inspect: $1" "$FERRY" inspect "dir:$2"
	blob_fail "$@"
}

# --- chunk data --------------------------------------------------------
for idx in 0 $((NCHUNKS - 1)); do
	C=$(fresh "chunk$idx")
	if loc=$(chunk_byte "$C/blobs/sha256/$BLOBHEX" $idx 2>"$LOG"); then
		off=${loc% *} frame=${loc#* }
		flip "$C/blobs/sha256/$BLOBHEX" "$off"
		fails_naming "check: flipped byte in chunk $idx" "chunk $frame([^0-9]|$)" \
			"$FERRY" check "dir:$C"
		if grep -q "${BLOBHEX:0:12}" "$LOG"; then
			ok "check: flipped byte in chunk $idx: message names the blob"
		else
			notok "check: flipped byte in chunk $idx: message names the blob (${BLOBHEX:0:12}...)"
		fi
		mount_fails "mount: flipped byte in chunk $idx" "$C" "chunk $frame([^0-9]|$)"
	else
		notok "blob layout: chunk $idx located through footer and table"
		diag "$LOG"
	fi
	rm -rf "$C"
done

# --- blob file ---------------------------------------------------------
if check "mount the pristine image" "$FERRY" mount --mode local "dir:$P" "$MNT" \
	--cache-dir "$SCRATCH/cache-pristine"; then
	PRISTINE_DIGEST=$(tree_digest "$MNT")
	umount "$MNT"
fi
C=$(fresh blob-truncated)
truncate -s -1 "$C/blobs/sha256/$BLOBHEX"
blob_tail_fail "blob truncated by one byte" "$C"
C=$(fresh blob-missing)
rm "$C/blobs/sha256/$BLOBHEX"
fails_naming "check: blob file missing" "${BLOBHEX:0:12}" "$FERRY" check "dir:$C"
mount_fails "mount: blob file missing" "$C" "${BLOBHEX:0:12}"
C=$(fresh blob-table)
size=$(stat -c %s "$C/blobs/sha256/$BLOBHEX")
flip "$C/blobs/sha256/$BLOBHEX" $((size - 64 - 64 * NCHUNKS + 40))
blob_tail_fail "byte flipped in the blob's chunk table" "$C"
C=$(fresh blob-footer)
# The footer's table_offset field (+16) moved by 64 bytes.
flip "$C/blobs/sha256/$BLOBHEX" $((size - 64 + 16)) 64
blob_tail_fail "blob footer's table offset changed" "$C"
rm -rf "$SCRATCH"/blob-*

# --- bootstrap ---------------------------------------------------------
BSIZE=$(stat -c %s "$P/bootstrap")
C=$(fresh bs-trunc)
truncate -s $((BSIZE / 2)) "$C/bootstrap"
all_fail "bootstrap truncated (ferry.json unchanged)" "$C"
for cut in 0 1100 4096 $((BSIZE / 2)) $((BSIZE - 1)); do
	[ "$cut" -lt "$BSIZE" ] || continue
	C=$(fresh bs-trunc-$cut)
	truncate -s "$cut" "$C/bootstrap"
	reindex "$C"
	all_fail "bootstrap truncated to $cut bytes (ferry.json updated)" "$C"
	rm -rf "$C"
done

# Superblock fields changed and the checksum recomputed, so only field
# validation can catch them: offset (from byte 1024), size, new value.
sb_set() { # OUT OFFSET SIZE VALUE
	python3 - "$@" "$TOP/tests/tools" <<'EOF'
import sys
path = sys.argv[1] + "/bootstrap"
off, size, val = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4], 0)
sys.path.insert(0, sys.argv[5])
from erofs_sb import fix_checksum
d = bytearray(open(path, "rb").read())
sb = 1024
d[sb + off:sb + off + size] = val.to_bytes(size, "little")
fix_checksum(d)
open(path, "wb").write(d)
EOF
}
C=$(fresh bs-magic)
flip "$C/bootstrap" 1024 1
all_fail "superblock magic flipped (ferry.json unchanged)" "$C"
reindex "$C"
all_fail "superblock magic flipped (ferry.json updated)" "$C"
rm -rf "$C"
C=$(fresh bs-csum)
flip "$C/bootstrap" $((1024 + 0x24)) 1
reindex "$C"
all_fail "superblock byte flipped, checksum not updated" "$C"
rm -rf "$C"
while read -r what off size val; do
	C=$(fresh "bs-$what")
	sb_set "$C" "$off" "$size" "$val"
	reindex "$C"
	all_fail "superblock $what=$val (valid checksum)" "$C"
	rm -rf "$C"
done <<'EOF'
blkszbits 12 1 13
blkszbits 12 1 9
root_nid 14 2 0xffff
meta_blkaddr 40 4 0x7fffffff
feature_incompat 80 4 0x8000000c
extra_devices 86 2 0
extra_devices 86 2 7
devt_slotoff 88 2 0xffff
EOF

# Random single-byte damage anywhere in the bootstrap (digest updated):
# check and inspect may accept bytes that do not matter, but must never
# crash or report anything but 0 or 1.
C=$(fresh bs-random)
bad=
for i in $(seq 1 40); do
	cp "$P/bootstrap" "$C/bootstrap"
	off=$(( (i * 2654435761) % BSIZE ))
	flip "$C/bootstrap" "$off" $(( (i * 37) % 255 + 1 ))
	reindex "$C"
	for cmd in check inspect; do
		timeout 60 "$FERRY" "$cmd" "dir:$C" >/dev/null 2>"$LOG"
		rc=$?
		if { [ "$rc" -ne 0 ] && [ "$rc" -ne 1 ]; } || sanitizer_report "$LOG"; then
			bad="$bad $cmd@$off:exit$rc"
			cp "$C/bootstrap" "$SCRATCH/../ferry-e2e-crash-$cmd-$off.bootstrap" 2>/dev/null
		fi
	done
done
if [ -z "$bad" ]; then
	ok "40 random bootstrap byte flips: check/inspect exit 0 or 1, no crash"
else
	notok "40 random bootstrap byte flips: check/inspect exit 0 or 1, no crash"
	echo "    failures (command@offset:exit):$bad"
	echo "    damaged bootstraps kept as /tmp/ferry-e2e-crash-*.bootstrap"
fi
rm -rf "$C"

# --- ferry.json --------------------------------------------------------
C=$(fresh idx-garbage)
echo '{"schemaVersion": 1, "bootstrap": ' >"$C/ferry.json"
all_fail "ferry.json truncated" "$C"
C=$(fresh idx-missing)
rm "$C/ferry.json"
all_fail "ferry.json missing" "$C"
C=$(fresh idx-bsdigest)
python3 - "$C" <<'EOF'
import json, sys
p = sys.argv[1] + "/ferry.json"
j = json.load(open(p))
j["bootstrap"]["digest"] = "sha256:" + "0" * 64
json.dump(j, open(p, "w"))
EOF
all_fail "ferry.json bootstrap digest wrong" "$C"
C=$(fresh bs-missing)
rm "$C/bootstrap"
all_fail "bootstrap missing" "$C"

check "intact image still passes ferry check" "$FERRY" check "dir:$P"
e2e_done
