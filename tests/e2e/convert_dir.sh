#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# dir: conversion of the edge-case fixture with several chunk sizes and
# codecs. Each image: ferry.json agrees with the files, `ferry check`
# passes, fsck.erofs and dump.erofs (erofs-utils) accept it, the kernel
# mounts it through `ferry mount --mode local`, and the mounted tree equals
# the fixture attribute by attribute. Plus: determinism, dedup, --json,
# device reuse on remount, and no EROFS complaints in the kernel log.
. "$(dirname "$0")/../lib/common.sh"
need_root
need_ferry

FX=$SCRATCH/fixture
make_fixture "$FX"
dmesg_mark

# ferry.json: schema, bootstrap and every blob present with the recorded
# size and sha256 (blob files named by it), nothing else under blobs/,
# chunkSize and compression as requested.
verify_index() { # OUT CHUNK_SIZE CODEC
	python3 - "$@" <<'EOF'
import hashlib, json, os, sys
out, chunk, codec = sys.argv[1], int(sys.argv[2]), sys.argv[3]
j = json.load(open(os.path.join(out, "ferry.json")))
err = []
def sha(p):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return "sha256:" + h.hexdigest()
if j.get("schemaVersion") != 1:
    err.append("schemaVersion %r" % j.get("schemaVersion"))
bs = j["bootstrap"]
p = os.path.join(out, bs["path"])
if sha(p) != bs["digest"] or os.path.getsize(p) != bs["size"]:
    err.append("bootstrap digest/size mismatch")
names = set()
for b in j["blobs"]:
    hexd = b["digest"].split(":", 1)[1]
    names.add(hexd)
    p = os.path.join(out, "blobs", "sha256", hexd)
    if not os.path.isfile(p):
        err.append("missing blob " + p); continue
    if sha(p) != b["digest"]:
        err.append("blob %s: content does not match its name" % hexd)
    if os.path.getsize(p) != b["size"]:
        err.append("blob %s: size %d != %d" % (hexd, os.path.getsize(p), b["size"]))
    if b["uncompressedSize"] % 4096 or b["chunks"] < 1:
        err.append("blob %s: uncompressedSize %d chunks %d" % (hexd, b["uncompressedSize"], b["chunks"]))
extra = set(os.listdir(os.path.join(out, "blobs", "sha256"))) - names
if extra:
    err.append("files under blobs/sha256 not in ferry.json: %s" % sorted(extra))
if j.get("chunkSize") != chunk:
    err.append("chunkSize %r != %d" % (j.get("chunkSize"), chunk))
if str(j.get("compression", "")).split(":")[0] != codec:
    err.append("compression %r != %s" % (j.get("compression"), codec))
for e in err:
    print(e)
sys.exit(1 if err else 0)
EOF
}

# Every blob has its data file in the cache, sized uncompressedSize.
verify_devices() { # OUT
	python3 - "$1" "$CACHE" <<'EOF'
import json, os, sys
j = json.load(open(sys.argv[1] + "/ferry.json"))
bad = 0
for b in j["blobs"]:
    p = os.path.join(sys.argv[2], "blobs", "sha256", b["digest"].split(":", 1)[1] + ".data")
    size = os.path.getsize(p) if os.path.isfile(p) else None
    if size != b["uncompressedSize"]:
        print("%s: size %r, want %d" % (p, size, b["uncompressedSize"])); bad = 1
sys.exit(bad)
EOF
}

mounted_erofs() { [ "$(findmnt -n -o FSTYPE --mountpoint "$1")" = erofs ]; }

# convert, index, check, mount, treecmp, fsck.erofs, dump.erofs, umount.
roundtrip() { # NAME CHUNK_SIZE CODEC [convert options]
	local name=$1 chunk=$2 codec=$3 out=$SCRATCH/out-$1 mnt=$SCRATCH/mnt-$1
	shift 3
	check "convert dir: -> dir: ($name)" \
		"$FERRY" convert "dir:$FX" "dir:$out" -q "$@" || return 1
	check "ferry.json agrees with bootstrap and blobs ($name)" \
		verify_index "$out" "$chunk" "$codec"
	check "ferry check ($name)" "$FERRY" check "dir:$out"
	if ! check "ferry mount --mode local ($name)" mount_local "dir:$out" "$mnt"; then
		return 1
	fi
	expect "kernel EROFS mount at the mount point ($name)" mounted_erofs "$mnt"
	check "treecmp fixture == mount ($name)" python3 "$TREECMP" "$FX" "$mnt"
	check "cache data files complete, uncompressed size ($name)" verify_devices "$out"
	# shellcheck disable=SC2046
	check "fsck.erofs accepts the image ($name)" \
		fsck.erofs $(erofs_devices "$out") "$out/bootstrap"
	# shellcheck disable=SC2046
	check "dump.erofs -s reads the superblock ($name)" \
		dump.erofs -s $(erofs_devices "$out") "$out/bootstrap"
	check "ferry umount ($name)" umount_local "$mnt"
	expect "nothing left mounted at the mount point ($name)" \
		eval '! is_mounted "$mnt"'
}

MiB=1048576
roundtrip default $MiB zstd
roundtrip c64k-lz4 65536 lz4 --chunk-size 65536 --compress lz4 --inline-max 0
roundtrip none $MiB none --compress none
roundtrip lzma $MiB lzma --compress lzma
# Smallest chunks: a 3 MiB file has 768 chunk indexes (6 KiB, several blocks).
roundtrip c4k 4096 zstd --chunk-size 4096
rm -rf "$SCRATCH"/out-c64k-lz4 "$SCRATCH"/out-none "$SCRATCH"/out-lzma "$SCRATCH"/out-c4k

OUT=$SCRATCH/out-default

# erofs-utils' own reader extracts every file through the chunk indexes and
# the device table. fsck.erofs 1.5 --extract keeps content, owner, mtime,
# rdev and symlinks but not xattrs, hardlinks or setuid/setgid bits, and it
# drops unmapped (hole) chunks instead of seeking over them (dump.erofs -e
# shows the right map), so neither those attributes nor the three files
# with all-zero chunks are compared here; the kernel mount above has them.
# shellcheck disable=SC2046
if check "fsck.erofs --extract (default)" \
	fsck.erofs $(erofs_devices "$OUT") --extract="$SCRATCH/extract" "$OUT/bootstrap"; then
	check "treecmp fixture == fsck.erofs extraction (content, owner, mtime)" \
		python3 "$TREECMP" --ignore mode,xattrs,links,nlink \
		--exclude '^files/(hole_middle|sparse_3m|zero_2m)$' "$FX" "$SCRATCH/extract"
fi
rm -rf "$SCRATCH/extract"

# Determinism: the same tree converted again, and a second copy of the
# tree built independently (other inode numbers, other creation order in
# time), give byte-identical images.
if check "convert again (default)" "$FERRY" convert "dir:$FX" "dir:$SCRATCH/again" -q; then
	check "determinism: converting twice gives identical bytes" \
		same_image "$OUT" "$SCRATCH/again" ferry.json
fi
rm -rf "$SCRATCH/again"
make_fixture "$SCRATCH/fixture2"
if check "convert an independently built copy of the fixture" \
	"$FERRY" convert "dir:$SCRATCH/fixture2" "dir:$SCRATCH/again2" -q; then
	check "determinism: identical tree built separately gives identical bytes" \
		same_image "$OUT" "$SCRATCH/again2" ferry.json
fi
rm -rf "$SCRATCH/again2" "$SCRATCH/fixture2"

# Dedup: identical files, identical chunks across files and all-zero chunks
# are stored once (or not at all). Upper bound: every distinct non-zero
# chunk of every file that may not be inline, in its own 4 KiB slot.
dedup_bound() { # FIXTURE OUT
	python3 - "$1" "$2" <<'EOF'
import hashlib, json, os, stat, sys
fx, out = sys.argv[1], sys.argv[2]
j = json.load(open(out + "/ferry.json"))
chunk = j["chunkSize"]
stored = sum(b["uncompressedSize"] for b in j["blobs"])
total = 0
seen = set()
bound = 0
for d, _, files in os.walk(fx):
    for n in files:
        p = os.path.join(d, n)
        st = os.lstat(p)
        if not stat.S_ISREG(st.st_mode):
            continue
        total += st.st_size
        if st.st_size < 256:  # inline in the bootstrap by default
            continue
        with open(p, "rb") as f:
            for c in iter(lambda: f.read(chunk), b""):
                if c.count(0) == len(c):
                    continue
                h = hashlib.sha256(c).digest()
                if h not in seen:
                    seen.add(h)
                    bound += -(-len(c) // 4096) * 4096
print("stored %d bytes uncompressed; file bytes %d; distinct non-zero chunk bound %d"
      % (stored, total, bound))
sys.exit(0 if stored <= bound and stored < total else 1)
EOF
}
check "dedup: blob smaller than the distinct non-zero chunks of the files" \
	dedup_bound "$FX" "$OUT" && diag "$LOG" 1

# --json: stdout is one JSON document describing the conversion.
if "$FERRY" convert "dir:$FX" "dir:$SCRATCH/json" --json >"$SCRATCH/summary.json" 2>"$LOG"; then
	check "convert --json prints a JSON summary on stdout" python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
assert isinstance(j, dict) and j, j
print(sorted(j))' "$SCRATCH/summary.json"
	diag "$LOG" 1
else
	notok "convert --json prints a JSON summary on stdout"
	diag "$LOG"
fi
rm -rf "$SCRATCH/json"

# A second mount reuses the cache data files.
dev_state() { # OUT
	python3 - "$1" "$CACHE" <<'EOF'
import json, os, sys
j = json.load(open(sys.argv[1] + "/ferry.json"))
for b in j["blobs"]:
    st = os.stat(os.path.join(sys.argv[2], "blobs", "sha256", b["digest"].split(":", 1)[1] + ".data"))
    print(st.st_ino, st.st_mtime_ns, st.st_size)
EOF
}
# A second mount, while another mount of the same image is up, reuses the
# cache data files.
before=$(dev_state "$OUT")
MNT=$SCRATCH/mnt-again
MNT2=$SCRATCH/mnt-again2
if check "mount the default image again" mount_local "dir:$OUT" "$MNT"; then
	if check "mount it a second time at once" mount_local "dir:$OUT" "$MNT2"; then
		check "both mounts read the 3-chunk file" bash -c \
			'cmp "$1" "$2" && cmp "$1" "$3"' _ "$FX/files/multi_3m" \
			"$MNT/files/multi_3m" "$MNT2/files/multi_3m"
		check "ferry umount (second mount)" umount_local "$MNT2"
	fi
	after=$(dev_state "$OUT")
	expect "remount reuses the cache data files" [ "$before" = "$after" ]
	check "ferry umount (again)" umount_local "$MNT"
fi

# A sparse file over 4 GiB: 64-bit size (extended inode) and 4097 chunk
# indexes (32 KiB of them), nearly all holes; data at both ends.
BIG=$SCRATCH/bigsparse
mkdir -p "$BIG"
python3 - "$BIG/file" <<'EOF'
import os, random, sys
r = random.Random(11)
with open(sys.argv[1], "wb") as f:
    f.write(r.randbytes(1 << 20))
    f.seek((4 << 30) + 12345 - 5000)
    f.write(r.randbytes(5000))
os.utime(sys.argv[1], ns=(1, 1))
os.utime(os.path.dirname(sys.argv[1]), ns=(2, 2))
EOF
OUT=$SCRATCH/out-bigsparse
MNT=$SCRATCH/mnt-bigsparse
if check "convert a sparse 4 GiB + 12345 file" "$FERRY" convert "dir:$BIG" "dir:$OUT" -q; then
	check "ferry check (4 GiB sparse)" "$FERRY" check "dir:$OUT"
	if check "ferry mount --mode local (4 GiB sparse)" mount_local "dir:$OUT" "$MNT"; then
		check "treecmp source == mount, attributes (4 GiB sparse)" \
			python3 "$TREECMP" --ignore content "$BIG" "$MNT"
		# Both data ends plus 1 MiB samples across the holes (reading all
		# 4 GiB of zeros through the mount takes ~10 s).
		check "content equal: data at both ends, sampled holes (4 GiB sparse)" \
			python3 - "$BIG/file" "$MNT/file" <<'EOF'
import os, random, sys
a, b = open(sys.argv[1], "rb"), open(sys.argv[2], "rb")
size = os.fstat(a.fileno()).st_size
offs = [0, 1 << 20, size - (2 << 20), size - 5000]
offs += [random.Random(5).randrange(0, size) for _ in range(32)]
for off in offs:
    a.seek(off); b.seek(off)
    if a.read(1 << 20) != b.read(1 << 20):
        sys.exit("differs in the MiB at offset %d" % off)
EOF
		check "ferry umount (4 GiB sparse)" umount_local "$MNT"
	fi
	check "blob holds only the two data chunks" \
		test "$(index_get "$OUT" 'sum(b["uncompressedSize"] for b in j["blobs"])')" -le $((2 * MiB))
fi
rm -rf "$BIG" "$OUT"

check_kernel_log
e2e_done
