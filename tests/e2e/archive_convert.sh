#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# oci-archive: and docker-archive: sources. The Debian fixture images
# (tests/tools/mkoci.sh), copied by skopeo into an oci-archive: and a
# docker-archive: (docker save's layout; skopeo's layer names are symlinks
# to tars named by diff_id), convert to the same image as from the oci:
# layout: the same bootstrap and blobs as dir:, and mounted trees that
# treecmp finds equal; the config comes along, zstd layers too, and
# --format erofs-layers gives the same native layers. docker save's own
# layouts (before docker 25, and from 25 on) convert alike.
# Refused, each with a message naming the fix: skopeo's dir: layout and an
# OCI layout given as dir:, either archive given as tar:, an archive named
# through a symlink, a FIFO, a compressed archive, the wrong transport or
# tag, a member link climbing out, a docker archive of two images, a
# member twice, a tampered layer.
. "$(dirname "$0")/../lib/common.sh"
. "$(dirname "$0")/../lib/oci.sh"
need_root
need_ferry
oci_fixtures
need_cmds skopeo python3 gzip
CACHE=$SCRATCH/cache
OUTL=$SCRATCH/layout
A=$SCRATCH/archives
mkdir -p "$A"

# skopeo's archives of TAG from LAYOUT, each KIND: $A/TAG.KIND.tar.
make_archives() { # LAYOUT TAG KIND...
	local lay=$1 tag=$2 kind
	shift 2
	for kind in "$@"; do
		case $kind in
		oci) skopeo copy -q "oci:$lay:$tag" "oci-archive:$A/$tag.oci.tar:$tag" ;;
		docker) skopeo copy -q "oci:$lay:$tag" "docker-archive:$A/$tag.docker.tar:ferry/$tag:latest" ;;
		esac || return
	done
}

# The config of the oci: layout image tagged TAG in $OUTL, without the
# diff_ids (a docker-archive's layers are its uncompressed tars).
config_of() { # TAG
	python3 - "$OUTL" "$1" <<'EOF'
import json, sys
lay, tag = sys.argv[1:]
idx = json.load(open(lay + "/index.json"))
d = [m for m in idx["manifests"]
     if m["annotations"]["org.opencontainers.image.ref.name"] == tag][0]
blob = lambda d: open(lay + "/blobs/sha256/" + d["digest"][7:], "rb").read()
cfg = json.loads(blob(json.loads(blob(d))["config"]))
cfg["rootfs"].pop("diff_ids")
print(json.dumps(cfg, sort_keys=True))
EOF
}

# The manifest annotation KEY of the image tagged TAG in $OUTL ("" if none).
annotation_of() { # TAG KEY
	python3 - "$OUTL" "$1" "$2" <<'EOF'
import json, sys
lay, tag, key = sys.argv[1:]
idx = json.load(open(lay + "/index.json"))
d = [m for m in idx["manifests"]
     if m["annotations"]["org.opencontainers.image.ref.name"] == tag][0]
m = json.load(open(lay + "/blobs/sha256/" + d["digest"][7:]))
print(m.get("annotations", {}).get(key, ""))
EOF
}

# Each KIND of archive of TAG converts to the image the oci: layout gives.
same_as_layout() { # LAYOUT TAG KIND...
	local lay=$1 tag=$2 kind ref want mnt=$SCRATCH/mnt-$2
	shift 2
	check "skopeo writes the $* archives of $tag" make_archives "$lay" "$tag" "$@" || return
	check "convert oci:$tag dir:" "$FERRY" convert -q "oci:$lay:$tag" "dir:$SCRATCH/dir-$tag" || return
	check "convert oci:$tag oci:" "$FERRY" convert -q "oci:$lay:$tag" "oci:$OUTL:$tag" || return
	check "ferry mount --mode local oci: ($tag)" mount_local "oci:$OUTL:$tag" "$mnt" || return
	for kind in "$@"; do
		ref=$kind-archive:$A/$tag.$kind.tar
		[ $kind = oci ] && ref=$ref:$tag
		check "convert $kind-archive: ($tag) dir:" \
			"$FERRY" convert -q "$ref" "dir:$SCRATCH/dir-$tag-$kind" || continue
		check "$kind-archive: and oci: give the same bootstrap and blobs ($tag)" \
			same_image "$SCRATCH/dir-$tag" "$SCRATCH/dir-$tag-$kind"
		check "convert $kind-archive: ($tag) oci:" \
			"$FERRY" convert -q "$ref" "oci:$OUTL:$tag-$kind" || continue
		check "ferry check oci: from $kind-archive: ($tag)" "$FERRY" check "oci:$OUTL:$tag-$kind"
		expect "the config comes from the $kind-archive: ($tag)" \
			[ "$(config_of "$tag")" = "$(config_of "$tag-$kind")" ]
		# docker save has no manifest: none is named.
		want=$(annotation_of "$tag" dev.ferry.source-manifest)
		[ $kind = docker ] && want=
		expect "dev.ferry.source-manifest names the $kind-archive:'s manifest, if any ($tag)" \
			[ "$(annotation_of "$tag-$kind" dev.ferry.source-manifest)" = "$want" ]
		if check "ferry mount --mode local oci: from $kind-archive: ($tag)" \
			mount_local "oci:$OUTL:$tag-$kind" "$mnt-$kind"; then
			check "treecmp oci: == $kind-archive: ($tag)" python3 "$TREECMP" "$mnt" "$mnt-$kind"
			check "ferry umount ($tag, $kind-archive:)" umount_local "$mnt-$kind"
		fi
	done
	check "ferry umount ($tag)" umount_local "$mnt"
}

# edit: three layers full of whiteouts, type changes and hardlinks.
same_as_layout "$FIX" edit oci docker
# zstd layers (docker images cannot have them).
same_as_layout "$FIXZ" pkgs oci

# Native layers from an archive: the same layer images.
check "convert --format erofs-layers oci:base" \
	"$FERRY" convert -q --format erofs-layers "oci:$FIX:base" "oci:$SCRATCH/native:oci"
make_archives "$FIX" base oci docker >"$LOG" 2>&1
check "convert --format erofs-layers docker-archive:base" \
	"$FERRY" convert -q --format erofs-layers "docker-archive:$A/base.docker.tar" \
	"oci:$SCRATCH/native:docker"
native_layers() { # TAG: the layer digests of the native image
	python3 - "$SCRATCH/native" "$1" <<'EOF'
import json, sys
lay, tag = sys.argv[1:]
idx = json.load(open(lay + "/index.json"))
d = [m for m in idx["manifests"]
     if m["annotations"]["org.opencontainers.image.ref.name"] == tag][0]
m = json.load(open(lay + "/blobs/sha256/" + d["digest"][7:]))
print(" ".join(l["digest"] for l in m["layers"]))
EOF
}
expect "docker-archive: and oci: give the same native layers" \
	[ "$(native_layers oci)" = "$(native_layers docker)" ]

# --- refusals --------------------------------------------------------------
skopeo copy -q "oci:$FIX:base" "dir:$SCRATCH/skopeo-dir" >"$LOG" 2>&1
check_fails "skopeo's dir: layout as dir: names oci:" "skopeo copy dir:" \
	"$FERRY" convert "dir:$SCRATCH/skopeo-dir" "dir:$SCRATCH/never"
check_fails "an OCI layout as dir: names oci:" "convert oci:$FIX" \
	"$FERRY" convert "dir:$FIX" "dir:$SCRATCH/never"
ln -s "$A/base.docker.tar" "$SCRATCH/link.tar"
check_fails "an archive named through a symlink" "symbolic link" \
	"$FERRY" convert "docker-archive:$SCRATCH/link.tar" "dir:$SCRATCH/never"
mkfifo "$SCRATCH/fifo.tar"
check_fails "a FIFO" "not a regular file" \
	timeout 20 "$FERRY" convert "docker-archive:$SCRATCH/fifo.tar" "dir:$SCRATCH/never"
gzip -1 -c "$A/base.docker.tar" >"$SCRATCH/base.tar.gz"
check_fails "a compressed archive says how to decompress it" "gunzip it first" \
	"$FERRY" convert "docker-archive:$SCRATCH/base.tar.gz" "dir:$SCRATCH/never"
check_fails "docker save's archive as tar: names docker-archive:" "convert docker-archive:" \
	"$FERRY" convert "tar:$A/base.docker.tar" "dir:$SCRATCH/never"
check_fails "an oci-archive as tar: names oci-archive:" "convert oci-archive:" \
	"$FERRY" convert "tar:$A/base.oci.tar" "dir:$SCRATCH/never"
check_fails "an oci-archive: given as docker-archive:" "oci-archive:" \
	"$FERRY" convert "docker-archive:$A/base.oci.tar" "dir:$SCRATCH/never"
check_fails "an oci-archive: tag it does not have" "no image tagged" \
	"$FERRY" convert "oci-archive:$A/base.oci.tar:nosuch" "dir:$SCRATCH/never"

# docker save's own layouts, made from skopeo's docker-archive of base:
# before docker 25 (<id>/layer.tar, <config>.json), and from 25 on
# (blobs/sha256/<hex>, named by their digests, beside an OCI layout).
python3 - "$A/base.docker.tar" "$SCRATCH" <<'EOF'
import hashlib, io, json, sys, tarfile
src, out = sys.argv[1:]
t = tarfile.open(src)
data = {m.name: t.extractfile(m).read() for m in t.getmembers() if m.isfile()}
man = json.loads(data["manifest.json"])[0]
layer = t.extractfile(t.getmember(man["Layers"][0])).read()  # through its symlink
config = data[man["Config"]]
sha = lambda b: hashlib.sha256(b).hexdigest()

def write(name, files):
    with tarfile.open(out + "/" + name, "w") as w:
        for n, d in files:
            i = tarfile.TarInfo(n)
            i.size = len(d)
            w.addfile(i, io.BytesIO(d))

lid = "a" * 64
write("legacy.tar", [(lid + "/VERSION", b"1.0"), (lid + "/json", b"{}"),
                     (lid + "/layer.tar", layer), (sha(config) + ".json", config),
                     ("manifest.json", json.dumps([{"Config": sha(config) + ".json",
                      "RepoTags": ["x:1"], "Layers": [lid + "/layer.tar"]}]).encode()),
                     ("repositories", b"{}")])
oci = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                  "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                             "digest": "sha256:" + sha(config), "size": len(config)},
                  "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                              "digest": "sha256:" + sha(layer), "size": len(layer)}]}).encode()
index = json.dumps({"schemaVersion": 2, "manifests": [
    {"mediaType": "application/vnd.oci.image.manifest.v1+json",
     "digest": "sha256:" + sha(oci), "size": len(oci)}]}).encode()
write("docker25.tar", [("blobs/sha256/" + sha(layer), layer),
                       ("blobs/sha256/" + sha(config), config),
                       ("blobs/sha256/" + sha(oci), oci), ("index.json", index),
                       ("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'),
                       ("manifest.json", json.dumps([{"Config": "blobs/sha256/" + sha(config),
                        "RepoTags": ["x:1"], "Layers": ["blobs/sha256/" + sha(layer)]}]).encode()),
                       ("repositories", b"{}")])
EOF
check "convert oci:base dir:" "$FERRY" convert -q "oci:$FIX:base" "dir:$SCRATCH/dir-base"
for ref in docker-archive:legacy docker-archive:docker25 oci-archive:docker25; do
	check "convert $ref.tar (docker save's layout) dir:" \
		"$FERRY" convert -q "${ref%%:*}:$SCRATCH/${ref#*:}.tar" "dir:$SCRATCH/dir-${ref/:/-}" &&
		check "$ref.tar gives the image oci: gives" \
			same_image "$SCRATCH/dir-base" "$SCRATCH/dir-${ref/:/-}"
done

# Hostile archives, made from the docker-archive of base.
python3 - "$A/base.docker.tar" "$SCRATCH" <<'EOF'
import io, json, sys, tarfile
src, out = sys.argv[1:]
t = tarfile.open(src)
members = [(m, t.extractfile(m).read() if m.isfile() else None) for m in t.getmembers()]
manifest = json.loads(dict((m.name, d) for m, d in members)["manifest.json"])

def write(name, edit_manifest=None, extra=(), tamper=False):
    with tarfile.open(out + "/" + name, "w") as w:
        for m, d in members:
            if m.name == "manifest.json":
                continue
            if tamper and m.isfile() and m.size > 1 << 20:
                d = bytearray(d)
                d[m.size // 2] ^= 1
                d = bytes(d)
            w.addfile(m, io.BytesIO(d) if d is not None else None)
        for e in extra:
            w.addfile(e)
        man = edit_manifest(manifest) if edit_manifest else manifest
        data = json.dumps(man).encode()
        info = tarfile.TarInfo("manifest.json")
        info.size = len(data)
        w.addfile(info, io.BytesIO(data))

climb = tarfile.TarInfo("evil/layer.tar")
climb.type, climb.linkname = tarfile.SYMTYPE, "../../../etc/passwd"
write("climb.tar", lambda m: [dict(m[0], Layers=["evil/layer.tar"])], [climb])
write("two.tar", lambda m: m + m)
dup = tarfile.TarInfo("manifest.json")
dup.size = 2
with tarfile.open(out + "/dup.tar", "w") as w:
    w.addfile(dup, io.BytesIO(b"[]"))
    w.addfile(dup, io.BytesIO(b"[]"))
write("tampered.tar", tamper=True)
EOF
check_fails "a member link climbing out of the archive" "climbs out" \
	"$FERRY" convert "docker-archive:$SCRATCH/climb.tar" "dir:$SCRATCH/never"
check_fails "a docker archive of two images" "one image per archive" \
	"$FERRY" convert "docker-archive:$SCRATCH/two.tar" "dir:$SCRATCH/never"
check_fails "a member twice" "appears twice" \
	"$FERRY" convert "docker-archive:$SCRATCH/dup.tar" "dir:$SCRATCH/never"
check_fails "a tampered layer" "does not match its digest" \
	"$FERRY" convert "docker-archive:$SCRATCH/tampered.tar" "dir:$SCRATCH/never"
expect "no refused conversion left a destination" [ ! -e "$SCRATCH/never" ]
e2e_done
