#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# convert --format erofs-layers: the Debian fixture images (one, two and
# three layers; the third full of whiteouts, opaque dirs, type changes and
# hardlinks into lower layers) and a small hand-made image become one
# standalone EROFS image per layer. Each passes fsck.erofs and mounts with
# mount(2) (file-backed); the manifest names them as
# application/vnd.erofs.layer.v1 with diff_ids = their sha256 and "erofs"
# in os.features; ferry mount --mode local stacks them with overlayfs and
# the tree equals umoci's unpack. Whiteouts and opaque markers become
# overlayfs ones, archive trusted.overlay.* xattrs are escaped, a 0:0
# character device and a dir: destination are refused.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/oci_lib.sh"
need_root
need_ferry
need_tool "$EROFS_MOUNT"
oci_fixtures
dmesg_mark
OUTL=$SCRATCH/layers

# Manifest, config and layer files agree; each layer passes fsck.erofs and
# mounts alone.
layers_ok() { # TAG NLAYERS
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
sys.exit(1 if bad else 0)
PY
	local f rc=0
	mkdir -p "$SCRATCH/one"
	while read -r f; do
		fsck.erofs "$f" >"$LOG" 2>&1 || { diag "$LOG"; rc=1; }
		"$EROFS_MOUNT" "$f" "$SCRATCH/one" || { rc=1; continue; }
		umount "$SCRATCH/one" || rc=1
	done <"$OUTL/layers-$1"
	return $rc
}

convert_tag() { # TAG NLAYERS [treecmp args]
	local tag=$1 n=$2 ref mnt=$SCRATCH/mnt-$1
	shift 2
	check "convert --format erofs-layers oci:debian:$tag" \
		"$FERRY" convert -q --format erofs-layers "oci:$FIX:$tag" "oci:$OUTL:$tag" || return 1
	check "$tag: manifest, config, digests; fsck.erofs and mount(2) of each layer" layers_ok "$tag" "$n"
	ref=$(umoci_ref "$FIX:$tag" "$SCRATCH/bundle-$tag") || { notok "umoci unpack $tag"; return 1; }
	if check "$tag: ferry mount --mode local (overlayfs of the layers)" mount_image "oci:$OUTL:$tag" "$mnt"; then
		check "$tag: treecmp umoci unpack == overlay stack $*" python3 "$TREECMP" "$@" "$ref" "$mnt"
		check "$tag: ferry umount" ferry_umount "$mnt"
		check "$tag: nothing left mounted" test -z "$(findmnt -n "$mnt")"
	fi
	rm -rf "$SCRATCH/bundle-$tag"
}

convert_tag base 1
convert_tag pkgs 2
# Overlayfs cannot link across layers: a hardlink to a lower file is a copy
# (and a lower pair keeps its nlink when the edit replaces one name).
convert_tag edit 3 --ignore nlink,links

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
if check "whiteout image mounts" mount_image "oci:$OUTL:wh" "$SCRATCH/mnt-wh"; then
	check "whiteouts hide, opaque d hides lower children, a/ keeps its lower attributes, escaped xattr reads back" \
		tree_expect "$SCRATCH/mnt-wh" <<'J'
[{"path": "a", "type": "dir", "mode": 448, "uid": 5}, {"path": "a/y", "data": "y\n"},
 {"path": "d", "type": "dir"}, {"path": "d/q", "data": "q\n"},
 {"path": "f", "data": "f\n", "xattrs": {"trusted.overlay.opaque": "y", "user.k": "v"}},
 {"path": "new", "type": "dir"}, {"path": "new/deep", "type": "dir"}, {"path": "new/deep/g", "data": "g\n"}]
J
	check "umount" ferry_umount "$SCRATCH/mnt-wh"
fi

"${MKLAYER[@]}" tar "$SCRATCH/c0.tar" - <<'J'
[{"name": "dev0", "type": "char", "major": 0, "minor": 0}]
J
check_fails "a 0:0 character device in a layer is refused" "whiteout" \
	"$FERRY" convert -q --format erofs-layers "tar:$SCRATCH/c0.tar" "oci:$SCRATCH/c0:t"
check_exit "a dir: destination is a usage error" 2 \
	"$FERRY" convert -q --format erofs-layers "oci:$L:t" "dir:$SCRATCH/d"
expect "  naming what to give instead" grep -q "oci: or docker://" "$LOG"
check_kernel_log
e2e_done
