#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Issue 14, findings 1, 3, 5 and 9 (temp-file race): the chunk cache is a
# trust store that root uses. Each attack is planted as `nobody` where a
# local user is the attacker, exactly as it worked before the fix, and
# must fail now:
#   - a cache directory nobody owns (or any group/world-writable one) is
#     refused, naming the directory and the fix; a .data symlink planted in
#     it to a root-only file leaves that file untouched;
#   - a different bootstrap of the same size in CACHE/bootstraps is never
#     mounted (refused, or replaced by the real one);
#   - cache files of an image with a 0600 file are not readable by nobody;
#   - ferry cache verify finds a chunk whose bytes were flipped, clears it,
#     and the next read fetches the right bytes;
#   - a bootstrap whose directories form a DAG is refused before mount by
#     every mode, with no EROFS kernel message;
#   - two concurrent local mounts of one image into one cache both work.
. "$(dirname "$0")/../lib/common.sh"
. "$(dirname "$0")/../lib/lazy.sh"

need_ferryd
need_cmds runuser python3 sha256sum

# nobody must reach what it attacks: a root-owned 0755 directory.
PUB=$SCRATCH/pub
mkdir -p "$PUB"
chmod 0755 "$SCRATCH" "$PUB"

# The image: a private file, a file big enough for several chunks, and a
# directory the DAG test points back at its ancestor.
SRC=$SCRATCH/src
mkdir -p "$SRC/a/loopme/sub"
echo "hello from the real image" >"$SRC/a/hello.txt"
echo "sub file" >"$SRC/a/loopme/sub/f.txt"
echo "top secret" >"$SRC/secret"
chmod 0600 "$SRC/secret"
head -c $((3 << 20)) /dev/urandom >"$SRC/big.bin"
OUT=$SCRATCH/img
LAYOUT=$SCRATCH/layout
check "convert the test image to dir:" "$FERRY" convert "dir:$SRC" "dir:$OUT" -q || e2e_done
check "convert the test image to oci:" "$FERRY" convert "dir:$SRC" "oci:$LAYOUT:t" -q || e2e_done
BLOBHEX=$(index_get "$OUT" 'j["blobs"][0]["digest"].split(":")[1]')

# A root-only file the planted symlink points at.
ROOTFILE=$SCRATCH/root-only
echo "root only, must stay as it is" >"$ROOTFILE"
chmod 0600 "$ROOTFILE"
ROOTSUM=$(sha256sum <"$ROOTFILE")

# The refusal names the directory and says what to fix.
refused_naming() { # DESC DIR
	if grep -qF "$2 is owned by" "$LOG" && grep -q "chown" "$LOG"; then
		ok "$1: message names $2 and the fix"
	else
		notok "$1: message names $2 and the fix"
		diag "$LOG"
	fi
}

# --- finding 1: a cache nobody owns, with a symlink planted in it --------
C=$PUB/cache-nobody
mkdir -p "$C"
chown nobody "$C"
as_nobody mkdir -p "$C/blobs/sha256"
as_nobody ln -s "$ROOTFILE" "$C/blobs/sha256/$BLOBHEX.data"
M=$SCRATCH/m-nobody
check_exit "nobody-owned cache with a .data symlink: local mount refused" 1 \
	mount_local "dir:$OUT" "$M" --cache-dir "$C"
refused_naming "nobody-owned cache" "$C"
expect "the root-only file is untouched (content and size)" \
	test "$(sha256sum <"$ROOTFILE")" = "$ROOTSUM"
expect "nothing mounted" sh -c "! mountpoint -q '$M'"

for mode in 0777 0775 0757; do
	C=$PUB/cache-$mode
	mkdir -p "$C"
	chmod "$mode" "$C"
	check_exit "root-owned cache with mode $mode: refused" 1 \
		mount_local "dir:$OUT" "$SCRATCH/m-$mode" --cache-dir "$C"
	refused_naming "cache mode $mode" "$C"
done
C=$PUB/cache-subdir
mkdir -p "$C/blobs"
chmod 0700 "$C"
chown nobody "$C/blobs"
check_exit "a nobody-owned directory inside a root cache: refused" 1 \
	mount_local "dir:$OUT" "$SCRATCH/m-subdir" --cache-dir "$C"
refused_naming "nobody-owned blobs/" "$C/blobs"

# Defense in depth: even root's own cache never follows a link it holds.
C=$PUB/cache-link
mkdir -p "$C/blobs/sha256"
ln -s "$ROOTFILE" "$C/blobs/sha256/$BLOBHEX.data"
check_exit "a .data symlink in a root cache: mount refused" 1 \
	mount_local "dir:$OUT" "$SCRATCH/m-link" --cache-dir "$C"
expect "the root-only file is still untouched" \
	test "$(sha256sum <"$ROOTFILE")" = "$ROOTSUM"

# --- finding 1: a planted bootstrap of the same size ---------------------
C=$PUB/cache-boot
M=$SCRATCH/m-boot
check "oci: image mounts (local) into a fresh cache" mount_local "oci:$LAYOUT:t" "$M" --cache-dir "$C"
umount_local "$M" >/dev/null 2>&1
BOOT=$(ls "$C/bootstraps/" 2>/dev/null | head -n 1)
expect "the bootstrap is cached as CACHE/bootstraps/<sha256>" test -n "$BOOT"
# Same size, attacker's bytes: the real file's text changed in place.
plant() { # FILE
	python3 - "$1" <<'EOF'
import sys
p = sys.argv[1]
d = open(p, "rb").read()
assert b"hello from the real image" in d
open(p, "wb").write(d.replace(b"hello from the real image", b"HACKED by an evil planter"))
EOF
}
# As it worked before: nobody owns the cache and plants the file.
chown -R nobody "$C"
chmod -R u+rwX "$C"
cp "$C/bootstraps/$BOOT" "$PUB/planted"
plant "$PUB/planted"
chmod 0644 "$PUB/planted"
as_nobody rm -f "$C/bootstraps/$BOOT"
as_nobody cp "$PUB/planted" "$C/bootstraps/$BOOT"
check_exit "planted bootstrap in a nobody-owned cache: mount refused" 1 \
	mount_local "oci:$LAYOUT:t" "$M" --cache-dir "$C"
expect "nothing mounted" sh -c "! mountpoint -q '$M'"
# Root's cache with a damaged copy of the same size: replaced, never used.
chown -R root "$C"
check "same-size different bootstrap in a root cache: mount works" \
	mount_local "oci:$LAYOUT:t" "$M" --cache-dir "$C"
if grep -q "does not hold the image's bootstrap" "$LOG"; then
	ok "the damaged bootstrap is reported and replaced"
else
	notok "the damaged bootstrap is reported and replaced"
	diag "$LOG"
fi
check "the mounted tree is the real image's" python3 "$TREECMP" "$SRC" "$M"
umount_local "$M" >/dev/null 2>&1
expect "the cached bootstrap is the real one again" \
	test "sha256:$(sha256sum <"$C/bootstraps/$BOOT" | cut -c1-64)" = "sha256:$BOOT"

# --- finding 5: cache contents not readable by nobody --------------------
C=$PUB/cache-private
mkdir -m 0755 "$C"
M=$SCRATCH/m-private
check "local mount of an image with a 0600 file" mount_local "oci:$LAYOUT:t" "$M" --cache-dir "$C"
umount_local "$M" >/dev/null 2>&1
expect "cache root narrowed to 0700" test "$(stat -c %a "$C")" = 700
LOOSE=$(find "$C" \( -type d -perm /077 \) -o \( -type f -perm /077 \) -print)
if [ -z "$LOOSE" ]; then
	ok "every cache directory is 0700 and every file 0600"
else
	notok "every cache directory is 0700 and every file 0600"
	echo "$LOOSE" | head -n 5 | sed 's/^/    /'
fi
DATA=$(ls "$C"/blobs/sha256/*.data | head -n 1)
expect "nobody cannot list the cache" sh -c "! runuser -u nobody -- ls '$C' >/dev/null 2>&1"
expect "nobody cannot read a cached data file" \
	sh -c "! runuser -u nobody -- cat '$DATA' >/dev/null 2>&1"
expect "nobody cannot read the cached bootstrap" \
	sh -c "! runuser -u nobody -- cat '$C'/bootstraps/* >/dev/null 2>&1"

# --- finding 9: two concurrent local mounts of one image, one cache ------
bad=
for round in 1 2 3; do
	C=$PUB/cache-conc-$round
	mount_local "oci:$LAYOUT:t" "$SCRATCH/c$round-a" --cache-dir "$C" >"$SCRATCH/conc-a.log" 2>&1 &
	pa=$!
	mount_local "oci:$LAYOUT:t" "$SCRATCH/c$round-b" --cache-dir "$C" >"$SCRATCH/conc-b.log" 2>&1 &
	pb=$!
	wait "$pa" || bad="$bad round$round-a"
	wait "$pb" || bad="$bad round$round-b"
	for s in a b; do
		python3 "$TREECMP" "$SRC" "$SCRATCH/c$round-$s" >"$LOG" 2>&1 ||
			bad="$bad round$round-$s-tree"
		umount_local "$SCRATCH/c$round-$s" >/dev/null 2>&1
	done
done
if [ -z "$bad" ]; then
	ok "3 rounds of two concurrent local mounts into one cache: both mount the right tree"
else
	notok "3 rounds of two concurrent local mounts into one cache: both mount the right tree"
	echo "    failed:$bad"
	diag "$SCRATCH/conc-a.log" 5
	diag "$SCRATCH/conc-b.log" 5
fi

# --- finding 1: ferry cache verify ---------------------------------------
lazy_use verify
M=$SCRATCH/m-verify
check "fuse mount of the image" mount_lazy fuse "dir:$OUT" "$M" || e2e_done
check "read the big file through FUSE" cmp "$SRC/big.bin" "$M/big.bin"
check "ferry cache verify: intact cache" "$FERRY" cache --cache-dir "$FCACHE" verify
umount_lazy "$M"
VDATA=$FCACHE/blobs/sha256/$BLOBHEX.data
# A byte of the big file's first chunk, whose bytes are random (never 0).
OFF=$(python3 - "$VDATA" "$SRC/big.bin" <<'EOF'
import sys
d = open(sys.argv[1], "rb").read()
print(d.find(open(sys.argv[2], "rb").read(64)) + 100)
EOF
)
python3 - "$VDATA" "$OFF" <<'EOF'
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(int(sys.argv[2])); b = f.read(1)
    f.seek(int(sys.argv[2])); f.write(bytes([b[0] ^ 0xff]))
EOF
check_exit "ferry cache verify: a flipped chunk is found (exit 1)" 1 \
	sh -c "'$FERRY' cache --cache-dir '$FCACHE' --json verify >'$SCRATCH/verify.json'"
NBAD=$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["badChunks"]))' \
	"$SCRATCH/verify.json" 2>/dev/null)
expect "verify --json lists exactly one bad chunk" test "${NBAD:-x}" = 1
check "ferry cache verify again: clean (the chunk was cleared)" \
	"$FERRY" cache --cache-dir "$FCACHE" verify
check "fuse mount again" mount_lazy fuse "dir:$OUT" "$M"
check "the next read fetches the right bytes again" cmp "$SRC/big.bin" "$M/big.bin"
umount_lazy "$M"
check "ferry cache verify after the refetch: clean" \
	"$FERRY" cache --cache-dir "$FCACHE" verify

# --- finding 3: a DAG bootstrap is refused before mount ------------------
M=$SCRATCH/m-dag
check "the DAG test image mounts before patching" mount_local "dir:$OUT" "$M" --cache-dir "$CACHE"
ROOTNID=$(stat -c %i "$M")
ANID=$(stat -c %i "$M/a")
umount_local "$M" >/dev/null 2>&1
DAG=$SCRATCH/dag
cp -a "$OUT" "$DAG"
# Point the entry "loopme" of /a at the root (an ancestor), then fix the
# superblock checksum and ferry.json's digest. Layout (pkg-meta/erofs_fs.h,
# docs/FORMAT.md 2.2): inode NID at meta_blkaddr * 4096 + NID * 32;
# i_format bit 0 extended (64-byte inode), bits 1-3 the data layout (0
# flat plain at raw_blkaddr, 2 flat inline after the inode and its
# xattrs); a directory block is 12-byte dirents (nid u64, nameoff u16,
# file_type u8, reserved u8), the first nameoff / 12 of them, then names.
if python3 - "$DAG" "$ANID" "$ROOTNID" "$TOP/tests/tools" <<'EOF'
import hashlib, json, struct, sys
out, anid, root = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
sys.path.insert(0, sys.argv[4])
from erofs_sb import fix_checksum
d = bytearray(open(out + "/bootstrap", "rb").read())
meta = struct.unpack_from("<I", d, 1024 + 40)[0] * 4096
ino = meta + anid * 32
fmt, icount = struct.unpack_from("<HH", d, ino)
ext = fmt & 1
layout = (fmt >> 1) & 7
size = struct.unpack_from("<Q" if ext else "<I", d, ino + 8)[0]
assert size < 4096 and layout in (0, 2), (size, layout)
if layout == 2:
    base = ino + (64 if ext else 32) + (12 + (icount - 1) * 4 if icount else 0)
else:
    base = struct.unpack_from("<I", d, ino + 16)[0] * 4096
count = struct.unpack_from("<H", d, base + 8)[0] // 12
offs = [struct.unpack_from("<H", d, base + 12 * i + 8)[0] for i in range(count)] + [size]
names = [bytes(d[base + offs[i]:base + offs[i + 1]]).rstrip(b"\0") for i in range(count)]
i = names.index(b"loopme")
assert d[base + 12 * i + 10] == 2  # a directory
struct.pack_into("<Q", d, base + 12 * i, root)
fix_checksum(d)
open(out + "/bootstrap", "wb").write(d)
j = json.load(open(out + "/ferry.json"))
j["bootstrap"]["digest"] = "sha256:" + hashlib.sha256(d).hexdigest()
json.dump(j, open(out + "/ferry.json", "w"))
EOF
then
	ok "DAG bootstrap built (a/loopme -> /)"
else
	notok "DAG bootstrap built (a/loopme -> /)"
fi
dag_refused() { # MODE
	if grep -q "reached twice" "$LOG" && grep -q "refusing to mount" "$LOG" &&
		grep -qF "$DAG" "$LOG"; then
		ok "DAG ($1): the error names the image, the inode path and the loop"
	else
		notok "DAG ($1): the error names the image, the inode path and the loop"
		diag "$LOG"
	fi
	expect "DAG ($1): nothing mounted" sh -c "! mountpoint -q '$M'"
}
dmesg_mark
check_exit "ferry check refuses the DAG image" 1 "$FERRY" check "dir:$DAG"
check_exit "DAG: --mode local refused" 1 mount_local "dir:$DAG" "$M" --cache-dir "$CACHE"
dag_refused local
lazy_use dag
check_exit "DAG: --mode fuse refused" 1 mount_lazy fuse "dir:$DAG" "$M"
dag_refused fuse
check_exit "DAG: --mode fanotify refused" 1 mount_lazy fanotify "dir:$DAG" "$M"
dag_refused fanotify
check_kernel_log

e2e_done
