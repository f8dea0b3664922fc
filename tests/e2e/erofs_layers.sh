#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# ferry-test: alone (its damaged images put EROFS errors in the kernel log)
# convert --format erofs-layers: the Debian fixture images (one and
# three layers; the third full of whiteouts, opaque dirs, type changes and
# hardlinks into lower layers) and a small hand-made image become one
# standalone EROFS image per layer (a hardlink to a lower file copies it
# up: both names one inode, link counts as umoci's). Each passes fsck.erofs and mounts with
# mount(2) (file-backed); the manifest names them as
# application/vnd.erofs.layer.v1 with diff_ids = their sha256 and "erofs"
# in os.features; ferry mount --mode local stacks them with overlayfs and
# the tree equals umoci's unpack. Whiteouts and opaque markers become
# overlayfs ones, archive trusted.overlay.* xattrs are escaped, a 0:0
# character device and a dir: destination are refused. With --compress
# lz4 --no-fragments (big pclusters) the layers are smaller, fsck.erofs
# --extract clean and the stack the same; with small files packed as
# fragments (the default when compressing) smaller again, with zstd
# smaller still (the kernel reads both; this box's fsck.erofs 1.5 knows
# neither fragments nor zstd); pushed to a loopback registry and mounted from it they are again;
# a corrupt pcluster fails to read (never other bytes) and ferry refuses
# the layer by its digest.
. "$(dirname "$0")/../lib/common.sh"
. "$(dirname "$0")/../lib/oci.sh"
. "$(dirname "$0")/../lib/registry.sh"
need_root
need_ferry
need_tool "$EROFS_MOUNT"
need_cmds docker-registry umoci dump.erofs
oci_fixtures
dmesg_mark
OUTL=$SCRATCH/layers

# Manifest, config and layer files agree; each layer passes fsck.erofs and
# mounts alone; with "nofsck" (fragments, zstd) the layers that hold a
# small file say FRAGMENTS in their superblock instead.
layers_ok() { # TAG NLAYERS [nofsck]
	python3 - "$OUTL" "$1" "$2" <<'PY' || return 1
import hashlib, json, os, sys
lay, tag, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
blob = lambda d: os.path.join(lay, "blobs/sha256", d.split(":")[1])
idx = json.load(open(os.path.join(lay, "index.json")))
m = [d for d in idx["manifests"] if d["annotations"]["org.opencontainers.image.ref.name"] == tag]
man = json.load(open(blob(m[0]["digest"])))
cfg = json.load(open(blob(man["config"]["digest"])))
bad = []
if len(man["layers"]) != n: bad.append("%d layers" % len(man["layers"]))
for l in man["layers"]:
    if l["mediaType"] != "application/vnd.erofs.layer.v1": bad.append(l["mediaType"])
    data = open(blob(l["digest"]), "rb").read()
    if "sha256:" + hashlib.sha256(data).hexdigest() != l["digest"] or len(data) != l["size"]:
        bad.append("layer %s digest/size" % l["digest"])
if cfg["rootfs"]["diff_ids"] != [l["digest"] for l in man["layers"]]: bad.append("diff_ids")
if "erofs" not in cfg.get("os.features", []): bad.append("os.features")
print("\n".join("    " + b for b in bad))
for l in man["layers"]: open(os.path.join(lay, "layers-" + tag), "a").write(blob(l["digest"]) + "\n")
# Layers with incompat FRAGMENTS (0x20), with zstd (COMPR_CFGS, u1 bit 3).
sbs = [open(blob(l["digest"]), "rb").read(1024 + 0x56)[1024:] for l in man["layers"]]
inc = [int.from_bytes(sb[0x50:0x54], "little") for sb in sbs]
frag = sum(1 for i in inc if i & 0x20)
zstd = sum(1 for i, sb in zip(inc, sbs) if i & 2 and int.from_bytes(sb[0x54:0x56], "little") & 8)
open(os.path.join(lay, "features-" + tag), "w").write("%d %d\n" % (frag, zstd))
sys.exit(1 if bad else 0)
PY
	local f rc=0
	mkdir -p "$SCRATCH/one"
	while read -r f; do
		# --extract: every file decompressed and checked, not only the
		# metadata (Debian's fsck.erofs 1.5 knows no zstd: "nofsck").
		[ "${3:-}" = nofsck ] ||
			fsck.erofs --extract "$f" >"$LOG" 2>&1 || { diag "$LOG"; rc=1; }
		"$EROFS_MOUNT" "$f" "$SCRATCH/one" || { rc=1; continue; }
		umount "$SCRATCH/one" || rc=1
	done <"$OUTL/layers-$1"
	return $rc
}

convert_tag() { # TAG NLAYERS [--compress CODEC [--no-fragments]] [treecmp args]
	local tag=$1 n=$2 ref mnt=$SCRATCH/mnt-$1 z=() fsck=
	shift 2
	[ "${1:-}" = --compress ] && { z=("$1" "$2"); shift 2; }
	[ "${1:-}" = --no-fragments ] && { z+=("$1"); shift; }
	# Debian's fsck.erofs 1.5 reads neither zstd (the default) nor
	# fragments (on by default when compressing).
	case "${z[*]}" in
	"--compress none"* | "--compress lz4 --no-fragments") ;;
	*) fsck=nofsck ;;
	esac
	check "convert --format erofs-layers ${z[*]} oci:debian:$tag" \
		"$FERRY" convert -q --format erofs-layers "${z[@]}" "oci:$FIX:${tag%-*}" "oci:$OUTL:$tag" || return 1
	check "$tag: manifest, config, digests; ${fsck:-fsck.erofs and }mount(2) of each layer" \
		layers_ok "$tag" "$n" $fsck
	ref=$SCRATCH/bundle-${tag%-*}/rootfs # one unpack per source image
	[ -d "$ref" ] || umoci_ref "$FIX:${tag%-*}" "$SCRATCH/bundle-${tag%-*}" >/dev/null ||
		{ notok "umoci unpack $tag"; return 1; }
	if check "$tag: ferry mount --mode local (overlayfs of the layers)" mount_local "oci:$OUTL:$tag" "$mnt"; then
		check "$tag: treecmp umoci unpack == overlay stack $*" python3 "$TREECMP" "$@" "$ref" "$mnt"
		check "$tag: ferry umount" umount_local "$mnt"
		check "$tag: nothing left mounted" test -z "$(findmnt -n "$mnt")"
	fi
}

convert_tag base-raw 1 --compress none
# A hardlink to a lower file copies it up, both names one inode (link
# groups as umoci's); but overlayfs shows a lower pair's nlink even when
# the edit replaced one of its names (usr/bin/perl: 2, umoci's 1).
convert_tag edit-raw 3 --compress none --ignore nlink
# Compressed: the same trees, fewer bytes. The edit layers' hardlinks to
# small lower files copy fragments from layer to layer.
convert_tag edit-lz4 3 --compress lz4 --no-fragments --ignore nlink
convert_tag edit-lz4f 3 --compress lz4 --ignore nlink
check "edit-lz4f: each layer packs its small files as fragments" \
	test "$(cat "$OUTL/features-edit-lz4f")" = "3 0"
check "edit-lz4: none does with --no-fragments" \
	test "$(cat "$OUTL/features-edit-lz4")" = "0 0"
check "edit-raw: nor uncompressed" test "$(cat "$OUTL/features-edit-raw")" = "0 0"
# The default: zstd, with fragments.
convert_tag edit-zstd 3 --ignore nlink
check "edit-zstd (the default): zstd and fragments in each layer" \
	test "$(cat "$OUTL/features-edit-zstd")" = "3 3"
# MicroLZMA and deflate (fast levels: the codecs, not the ratio), packed
# inodes included.
convert_tag base-lzma 1 --compress lzma:1
convert_tag edit-deflate 3 --compress deflate:1 --ignore nlink
# The threads compress, the caller lays out in order: the same bytes.
for j in 1 3; do
	check "convert --jobs $j" "$FERRY" convert -q --jobs $j --format erofs-layers \
		"oci:$FIX:edit" "oci:$SCRATCH/jobs$j:t"
done
check "--jobs 1 and --jobs 3 write the same blobs" \
	diff <(ls "$SCRATCH/jobs1/blobs/sha256") <(ls "$SCRATCH/jobs3/blobs/sha256")

# Through a registry: pushed, then mounted from it (layers downloaded
# whole into the cache, digest-checked).
if reg_start anon 2>"$LOG"; then
	IMG=docker://$REG/native/debian:edit
	check "convert --format erofs-layers --compress lz4 -> docker://" \
		"$FERRY" convert -q --format erofs-layers --compress lz4 "oci:$FIX:edit" "$IMG"
	if check "ferry mount --mode local docker:// (native layers)" \
		mount_local "$IMG" "$SCRATCH/mnt-reg"; then
		check "treecmp umoci unpack == overlay stack from the registry" \
			python3 "$TREECMP" --ignore nlink "$SCRATCH/bundle-edit/rootfs" "$SCRATCH/mnt-reg"
		check "umount" umount_local "$SCRATCH/mnt-reg"
	fi
	check "the three layers are in the cache" \
		test "$(find "$CACHE/erofs-layers" -type f | wc -l)" = 3
else
	notok "start docker-registry"
	diag "$LOG"
fi
rm -rf "$SCRATCH"/bundle-*
layer_bytes() { du -bc $(cat "$OUTL/layers-$1") | tail -n 1 | cut -f1; }
echo "# edit layers: $(layer_bytes edit-raw) bytes uncompressed, $(layer_bytes edit-lz4) with lz4 and no fragments, $(layer_bytes edit-lz4f) with fragments, $(layer_bytes edit-zstd) with zstd"
check "lz4 layers are at least a third smaller" \
	test "$(layer_bytes edit-lz4)" -lt "$(($(layer_bytes edit-raw) * 2 / 3))"
check "fragments save at least a tenth more" \
	test "$(layer_bytes edit-lz4f)" -lt "$(($(layer_bytes edit-lz4) * 9 / 10))"
check "zstd layers are smaller than lz4 ones" \
	test "$(layer_bytes edit-zstd)" -lt "$(layer_bytes edit-lz4f)"


# --- whiteouts, opaque dirs, escaped xattrs ----------------------------
L=$SCRATCH/oci-wh
"${MKLAYER[@]}" tar "$SCRATCH/l1.tar" - <<'J'
[{"name": "a/", "type": "dir", "mode": 448, "uid": 5, "mtime": 1000},
 {"name": "a/x", "data": "x\n"}, {"name": "a/y", "data": "y\n"},
 {"name": "d/", "type": "dir"}, {"name": "d/p", "data": "p\n"}, {"name": "d/sub/", "type": "dir"},
 {"name": "f", "data": "f\n", "xattrs": {"trusted.overlay.opaque": "y", "user.k": "v"}}]
J
"${MKLAYER[@]}" tar "$SCRATCH/l2.tar" - <<'J'
[{"name": "a/x", "type": "whiteout"}, {"name": "d", "type": "opaque"},
 {"name": "d/q", "data": "q\n"}, {"name": "new/deep/g", "data": "g\n"}]
J
"${MKLAYER[@]}" add-layer "$L" - l1 "$SCRATCH/l1.tar" >/dev/null
"${MKLAYER[@]}" add-layer "$L" l1 t "$SCRATCH/l2.tar" >/dev/null
check "whiteout image converts" "$FERRY" convert -q --format erofs-layers "oci:$L:t" "oci:$OUTL:wh"
if check "whiteout image mounts" mount_local "oci:$OUTL:wh" "$SCRATCH/mnt-wh"; then
	check "whiteouts hide, opaque d hides lower children, a/ keeps its lower attributes, escaped xattr reads back" \
		tree_expect "$SCRATCH/mnt-wh" <<'J'
[{"path": "a", "type": "dir", "mode": 448, "uid": 5}, {"path": "a/y", "data": "y\n"},
 {"path": "d", "type": "dir"}, {"path": "d/q", "data": "q\n"},
 {"path": "f", "data": "f\n", "xattrs": {"trusted.overlay.opaque": "y", "user.k": "v"}},
 {"path": "new", "type": "dir"}, {"path": "new/deep", "type": "dir"}, {"path": "new/deep/g", "data": "g\n"}]
J
	check "umount" umount_local "$SCRATCH/mnt-wh"
fi

# A hardlink to a lower file that an opaque directory in between hides:
# no such target, as in the merged view.
"${MKLAYER[@]}" tar "$SCRATCH/l3.tar" - <<'J'
[{"name": "hl", "type": "hardlink", "link": "d/p"}]
J
"${MKLAYER[@]}" add-layer "$L" t t3 "$SCRATCH/l3.tar" >/dev/null
check_fails "a hardlink to a lower file hidden by an opaque dir is refused" "does not exist" \
	"$FERRY" convert -q --format erofs-layers "oci:$L:t3" "oci:$OUTL:t3"

# A hardlink in an upper layer to a file of a lower one: the upper layer
# holds the file (copied up) under both names, one inode, as containerd's
# applier leaves it; the stack equals umoci's unpack, link counts
# included (ferry made the new name a separate copy: nlink 1 for both).
L=$SCRATCH/oci-hl
"${MKLAYER[@]}" tar "$SCRATCH/h1.tar" - <<'J'
[{"name": "./", "type": "dir"}, {"name": "a/", "type": "dir", "mode": 448, "uid": 5, "mtime": 1000},
 {"name": "a/x", "data": "linked across layers\n", "mode": 420, "uid": 7},
 {"name": "a/other", "data": "stays below\n"}]
J
"${MKLAYER[@]}" tar "$SCRATCH/h2.tar" - <<'J'
[{"name": "b/", "type": "dir"}, {"name": "b/y", "type": "hardlink", "link": "a/x"}]
J
"${MKLAYER[@]}" add-layer "$L" - h1 "$SCRATCH/h1.tar" >/dev/null
"${MKLAYER[@]}" add-layer "$L" h1 t "$SCRATCH/h2.tar" >/dev/null
check "cross-layer hardlink image converts" \
	"$FERRY" convert -q --format erofs-layers "oci:$L:t" "oci:$OUTL:hl"
if check "cross-layer hardlink image mounts (--mode local)" mount_local "oci:$OUTL:hl" "$SCRATCH/mnt-hl"; then
	if ref=$(umoci_ref "$L:t" "$SCRATCH/bundle-hl" 2>"$LOG"); then
		check "cross-layer hardlink: treecmp umoci unpack == overlay stack, link counts included" \
			python3 "$TREECMP" "$ref" "$SCRATCH/mnt-hl"
	else
		notok "umoci unpack of the cross-layer hardlink image"
		diag "$LOG"
	fi
	expect "  ... a/x and b/y are one inode, nlink 2" sh -c \
		'[ "$(stat -c "%i %h" "$1/a/x")" = "$(stat -c "%i %h" "$1/b/y")" ] && [ "$(stat -c %h "$1/a/x")" = 2 ]' \
		_ "$SCRATCH/mnt-hl"
	check "umount" umount_local "$SCRATCH/mnt-hl"
fi

"${MKLAYER[@]}" tar "$SCRATCH/c0.tar" - <<'J'
[{"name": "dev0", "type": "char", "major": 0, "minor": 0}]
J
check_fails "a 0:0 character device in a layer is refused" "whiteout" \
	"$FERRY" convert -q --format erofs-layers "tar:$SCRATCH/c0.tar" "oci:$SCRATCH/c0:t"
check_fails "a native-layer image as the source is refused" "converted already" \
	"$FERRY" convert -q --format erofs-layers "oci:$OUTL:base-raw" "oci:$SCRATCH/again:t"
check_exit "a dir: destination is a usage error" 2 \
	"$FERRY" convert -q --format erofs-layers "oci:$L:t" "dir:$SCRATCH/d"
expect "  naming what to give instead" grep -q "oci: or docker://" "$LOG"
check_kernel_log

# The file of the first layer of $OUTL:TAG.
first_layer() {
	python3 - "$OUTL" "$1" <<'PY'
import json, os, sys
lay, tag = sys.argv[1], sys.argv[2]
blob = lambda d: os.path.join(lay, "blobs/sha256", d.split(":")[1])
idx = json.load(open(os.path.join(lay, "index.json")))
m = [d for d in idx["manifests"] if d["annotations"]["org.opencontainers.image.ref.name"] == tag][0]
print(blob(json.load(open(blob(m["digest"])))["layers"][0]["digest"]))
PY
}

# A corrupt LZ4 pcluster here reads as EUCLEAN (other corruptions of other
# codecs need not: see below); ferry refuses the layer (digest) before the
# kernel sees it.
python3 -c 'import sys; sys.stdout.write("".join("line %d of a compressible text\n" % (i % 50) for i in range(20000)))' \
	>"$SCRATCH/text"
"${MKLAYER[@]}" tar "$SCRATCH/z.tar" - <<J
[{"name": "text", "data": $(python3 -c 'import json,sys; print(json.dumps(open(sys.argv[1]).read()))' "$SCRATCH/text")}]
J
check "a one-file layer converts with lz4" \
	"$FERRY" convert -q --format erofs-layers --compress lz4 "tar:$SCRATCH/z.tar" "oci:$OUTL:z"
zl=$(first_layer z)
cp "$zl" "$SCRATCH/z.erofs"
mkdir -p "$SCRATCH/zm"
if check "  it mounts with mount(2) and reads back" "$EROFS_MOUNT" "$SCRATCH/z.erofs" "$SCRATCH/zm"; then
	check "  same bytes" cmp "$SCRATCH/text" "$SCRATCH/zm/text"
	check "  stored compressed with compact indexes (layout 3)" \
		bash -c "dump.erofs --path=/text '$SCRATCH/z.erofs' | grep -q 'Layout: 3'"
	umount "$SCRATCH/zm"
fi
off=$(dump.erofs --path=/text -e "$SCRATCH/z.erofs" | awk '$1 == "0:" {print $7; exit}' | cut -d. -f1)
check "  its first pcluster found" test -n "$off"
python3 -c 'import sys; f = open(sys.argv[1], "r+b"); f.seek(int(sys.argv[2])); f.write(b"\xff" * 4096)' \
	"$SCRATCH/z.erofs" "${off:-0}"
if check "  the corrupted image still mounts" "$EROFS_MOUNT" "$SCRATCH/z.erofs" "$SCRATCH/zm"; then
	# The kernel reports a pcluster that does not decompress as EFSCORRUPTED.
	check_fails "  reading the corrupted extent fails (EUCLEAN), no bytes" "Structure needs cleaning" \
		cat "$SCRATCH/zm/text"
	umount "$SCRATCH/zm"
fi
cp "$SCRATCH/z.erofs" "$zl"
check_fails "  ferry mount refuses the corrupted layer (digest)" "digest" \
	"$FERRY" mount --mode local "oci:$OUTL:z" "$SCRATCH/zm" --cache-dir "$CACHE"

# Every codec the kernel decodes (MicroLZMA 5.16, deflate 6.6, zstd 6.10;
# lz4 above): the text reads back. EROFS keeps no checksum of file data,
# and a raw deflate stream has none either: corrupted, it can decode into
# other bytes without an error (seen on 6.18), so what keeps them out is the
# layer's digest, which ferry checks before the kernel mounts it.
for codec in lzma:1 deflate:1 zstd; do
	rm -rf "$SCRATCH/zc"
	check "$codec: the one-file layer converts" \
		"$FERRY" convert -q --format erofs-layers --compress $codec "tar:$SCRATCH/z.tar" "oci:$SCRATCH/zc:t"
	f=$(ls -S "$SCRATCH"/zc/blobs/sha256/* | head -n 1) # the layer
	alg=$(python3 -c 'import sys; d = open(sys.argv[1], "rb").read(1200); print(int.from_bytes(d[1024 + 0x54:1024 + 0x56], "little"))' "$f")
	check "  $codec: the superblock names it (u1 $alg)" \
		test "$alg" = "$(case $codec in lzma*) echo 2 ;; deflate*) echo 4 ;; zstd) echo 8 ;; esac)"
	cp "$f" "$SCRATCH/zc.erofs"
	if check "  $codec: mount(2)" "$EROFS_MOUNT" "$SCRATCH/zc.erofs" "$SCRATCH/zm"; then
		check "  $codec: same bytes, fewer blocks" \
			bash -c "cmp '$SCRATCH/text' '$SCRATCH/zm/text' && test \$(stat -c %s '$SCRATCH/zc.erofs') -lt \$(stat -c %s '$SCRATCH/text')"
		umount "$SCRATCH/zm"
	fi
	# The last block: the end of the right-aligned compressed bytes.
	python3 -c 'import os, sys; f = open(sys.argv[1], "r+b"); f.seek(os.path.getsize(sys.argv[1]) - 4096); f.write(b"\xa5" * 4096)' "$f"
	check_fails "  $codec: ferry mount refuses the corrupted layer (digest)" "digest" \
		"$FERRY" mount --mode local "oci:$SCRATCH/zc:t" "$SCRATCH/zm" --cache-dir "$CACHE"
done

# Small files share the packed inode's pcluster, the last blocks of a
# layer that has nothing else: corrupted, each of them fails to read.
python3 -c 'import json; print(json.dumps([{"name": "s%d" % i, "data": "small file %d\n" % i * 40} for i in range(64)]))' |
	"${MKLAYER[@]}" tar "$SCRATCH/s.tar" -
check "a layer of 64 small files converts with lz4" \
	"$FERRY" convert -q --format erofs-layers --compress lz4 "tar:$SCRATCH/s.tar" "oci:$OUTL:s"
sl=$(first_layer s)
cp "$sl" "$SCRATCH/s.erofs"
mkdir -p "$SCRATCH/sm"
if check "  it mounts with mount(2)" "$EROFS_MOUNT" "$SCRATCH/s.erofs" "$SCRATCH/sm"; then
	check "  every file reads back (from the packed inode)" \
		python3 -c 'import sys; sys.exit(any(open("%s/s%d" % (sys.argv[1], i)).read() != "small file %d\n" % i * 40 for i in range(64)))' "$SCRATCH/sm"
	check "  in one block of fragments, not 64" \
		test "$(stat -c %s "$SCRATCH/s.erofs")" -le $((8 * 4096))
	umount "$SCRATCH/sm"
fi
python3 -c 'import os, sys; f = open(sys.argv[1], "r+b"); f.seek(os.path.getsize(sys.argv[1]) - 4096); f.write(b"\xff" * 4096)' \
	"$SCRATCH/s.erofs"
if check "  the corrupted image still mounts" "$EROFS_MOUNT" "$SCRATCH/s.erofs" "$SCRATCH/sm"; then
	check_fails "  reading a fragment of the corrupted pcluster fails, no bytes" "Structure needs cleaning" \
		cat "$SCRATCH/sm/s7"
	umount "$SCRATCH/sm"
fi
e2e_done
