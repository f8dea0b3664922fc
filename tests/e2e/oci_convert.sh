#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# oci: conversion. The Debian fixture images (tests/tools/mkoci.sh: one
# layer; two layers; a third hand-made layer full of whiteouts, opaque
# directories, type changes, metadata changes and hardlinks into lower
# layers) convert to dir: and to oci:, pass ferry check, and mount as
# umoci unpacks them. The converted OCI manifest follows the contract
# (media types, annotations, one data blob per chunk-adding layer, the
# bootstrap last) and skopeo reads it. zstd, Docker, plain-tar and
# mislabelled layers give the same bytes as gzip ones; --platform picks
# from an image index; tags resolve as documented; a tampered, truncated
# or mislabelled blob is refused naming its digest.
. "$(dirname "$0")/../lib/common.sh"
. "$(dirname "$0")/../lib/oci.sh"
need_root
need_ferry
oci_fixtures
dmesg_mark

OUTL=$SCRATCH/out-layout
src_index=$(sha256sum <"$FIX/index.json")

# The converted image of TAG in $OUTL, byte-compared with the dir:
# conversion; mounted and compared with umoci's unpack; then EXTRA (a
# function) runs on the mount.
convert_image() { # TAG [EXTRA]
	local tag=$1 extra=${2:-} out=$SCRATCH/dir-$1 mnt=$SCRATCH/mnt-$1 ref
	"${MKLAYER[@]}" resolve "$FIX" "$tag" >"$SCRATCH/src-$tag.json" || return 1
	check "convert oci:debian:$tag dir:" "$FERRY" convert "oci:$FIX:$tag" "dir:$out" -q || return 1
	check "ferry check dir: ($tag)" "$FERRY" check "dir:$out"
	check "convert oci:debian:$tag oci:" "$FERRY" convert "oci:$FIX:$tag" "oci:$OUTL:$tag" -q || return 1
	check "converted manifest: media types, annotations, blobs, same bytes as dir: ($tag)" \
		oci_verify "$OUTL" "$tag" "$SCRATCH/src-$tag.json" "$out"
	check "skopeo inspect --raw reads the converted manifest ($tag)" skopeo_reads "$tag"
	check "ferry check oci: ($tag)" "$FERRY" check "oci:$OUTL:$tag"
	check "ferry inspect oci: ($tag)" "$FERRY" inspect "oci:$OUTL:$tag"
	if ! ref=$(umoci_ref "$FIX:$tag" "$SCRATCH/bundle-$tag" 2>"$LOG"); then
		notok "umoci unpack $tag (reference)"
		diag "$LOG"
		return 1
	fi
	if check "ferry mount --mode local oci: ($tag)" mount_local "oci:$OUTL:$tag" "$mnt"; then
		check "treecmp umoci unpack == mount ($tag)" python3 "$TREECMP" "$ref" "$mnt"
		check "no whiteout names in the mounted tree ($tag)" no_whiteouts "$mnt"
		[ -n "$extra" ] && "$extra" "$mnt"
		# shellcheck disable=SC2046
		check "fsck.erofs accepts the image ($tag)" \
			fsck.erofs $(erofs_devices "$out") "$out/bootstrap"
		check "ferry umount ($tag)" umount_local "$mnt"
	fi
	rm -rf "$SCRATCH/bundle-$tag"
}

skopeo_reads() { # TAG
	local want got
	want=$(tag_digest "$OUTL" "$1")
	got=sha256:$(skopeo inspect --raw "oci:$OUTL:$1" | sha256sum | cut -d' ' -f1)
	[ "$got" = "$want" ] || { echo "    skopeo read $got, index.json says $want"; return 1; }
}

# What layer (c) of the fixture means under the OCI rules, checked on the
# mount itself (independent of umoci being right).
edit_semantics() { # MNT
	check "layer (c): whiteouts, opaque dirs, type changes, metadata, hardlinks" \
		python3 - "$1" <<'EOF'
import os, stat, sys
r = sys.argv[1]
bad = []
def P(p): return os.path.join(r, p)
def st(p): return os.lstat(P(p))
def expect(cond, msg):
    if not cond: bad.append(msg)
for p in ("etc/motd", "usr/share/doc/less", "usr/share/common-licenses"):
    expect(not os.path.lexists(P(p)), p + " is whited out but present")
expect(stat.S_ISREG(st("etc/apt/apt.conf.d").st_mode), "etc/apt/apt.conf.d is not a file")
expect(stat.S_ISDIR(st("etc/debian_version").st_mode) and
       os.listdir(P("etc/debian_version")) == ["inside"], "etc/debian_version is not a dir with 'inside'")
expect(stat.S_ISREG(st("etc/os-release").st_mode), "etc/os-release is not a file")
expect(os.path.islink(P("etc/issue.net")) and os.readlink(P("etc/issue.net")) == "issue", "etc/issue.net")
expect(os.path.islink(P("usr/share/doc/bash")), "usr/share/doc/bash is not a symlink")
expect(sorted(os.listdir(P("etc/default"))) == ["new-in-c"],
       "opaque etc/default holds %s" % sorted(os.listdir(P("etc/default"))))
s = st("etc/default")
expect((stat.S_IMODE(s.st_mode), s.st_uid, s.st_gid) == (0o750, 7, 8), "etc/default metadata")
expect(sorted(os.listdir(P("var/lib/dpkg/alternatives"))) == ["after", "kept"],
       "opaque (marker after an entry) var/lib/dpkg/alternatives holds %s"
       % sorted(os.listdir(P("var/lib/dpkg/alternatives"))))
expect(open(P("etc/apt/sources.list")).read().startswith("deb http://example.invalid/"),
       "etc/apt/sources.list: the same-layer entry before its whiteout is gone")
s = st("usr/share")
expect((stat.S_IMODE(s.st_mode), s.st_uid, s.st_gid) == (0o711, 1234, 4321), "usr/share metadata")
expect(os.getxattr(P("usr/share"), "user.dir") == b"share", "usr/share xattr")
expect(os.path.isdir(P("usr/share/doc/dpkg")) and os.path.isdir(P("usr/share/file")),
       "usr/share lost lower children")
s = st("etc/passwd")
expect((stat.S_IMODE(s.st_mode), s.st_uid, s.st_gid) == (0o600, 42, 43), "etc/passwd metadata")
expect(os.getxattr(P("etc/passwd"), "user.checksum") == b"none", "etc/passwd xattr")
for a, b in (("usr/bin/dpkg-hardlink", "usr/bin/dpkg"),
             ("usr/lib/file/magic-link", "usr/lib/file/magic.mgc"),
             ("opt/c/big-link", "opt/c/big.bin")):
    expect(st(a).st_ino == st(b).st_ino and st(a).st_nlink == 2, "%s is not a hardlink of %s" % (a, b))
expect(open(P("usr/bin/perl5.36.0"), "rb").read().startswith(b"#!/bin/sh") and
       open(P("usr/bin/perl"), "rb").read(4) == b"\x7fELF" and
       st("usr/bin/perl").st_ino != st("usr/bin/perl5.36.0").st_ino,
       "replacing one name of a lower hardlink pair changed the other")
expect(open(P("opt/c/magic-copy"), "rb").read() == open(P("usr/lib/file/magic.mgc"), "rb").read(),
       "opt/c/magic-copy content")
expect(os.major(st("opt/c/null").st_rdev) == 1 and stat.S_ISCHR(st("opt/c/null").st_mode), "opt/c/null")
for b in bad:
    print("    " + b)
sys.exit(1 if bad else 0)
EOF
}

convert_image base
convert_image pkgs
convert_image edit edit_semantics
check "three data blobs in the edit image (each layer adds chunks)" \
	test "$(index_get "$SCRATCH/dir-edit" 'len(j["blobs"])')" = 3
check "no stray or missing blobs in the output layout" oci_no_strays "$OUTL"

# An image of format 1, before containerd's layer types (made from the pkgs
# conversion by oci_downgrade), still mounts, and converting it
# upgrades it to the current format with the same blobs.
oci_downgrade "$OUTL" pkgs "$SCRATCH/old"
check "an old-format ferry image still checks" "$FERRY" check "oci:$SCRATCH/old:old"
if check "... and mounts" mount_local "oci:$SCRATCH/old:old" "$SCRATCH/mnt-old"; then
	if check "(the current-format image mounts)" mount_local "oci:$OUTL:pkgs" "$SCRATCH/mnt-new"; then
		check "... with the same tree as the current-format image" \
			python3 "$TREECMP" "$SCRATCH/mnt-new" "$SCRATCH/mnt-old"
		check "(unmount the current-format image)" umount_local "$SCRATCH/mnt-new"
	fi
	check "... and unmounts" umount_local "$SCRATCH/mnt-old"
fi
check "convert of the old-format image upgrades it" \
	"$FERRY" convert -q "oci:$SCRATCH/old:old" "oci:$SCRATCH/old:new"
check "... to the current format, the same blobs as a fresh conversion" \
	oci_verify "$SCRATCH/old" new "$SCRATCH/src-pkgs.json" "$SCRATCH/dir-pkgs"
check "... which checks" "$FERRY" check "oci:$SCRATCH/old:new"
check_fails "a current-format ferry image is not converted again" "converted already" \
	"$FERRY" convert -q "oci:$SCRATCH/old:new" "oci:$SCRATCH/old:again"
# Format 2 (the layers' own digests as diff_ids, docs/FORMAT.md 1a) is
# upgraded too: only the config and the version change.
oci_downgrade "$OUTL" pkgs "$SCRATCH/old2" 2
check "convert of a format-2 image upgrades it" \
	"$FERRY" convert -q "oci:$SCRATCH/old2:old" "oci:$SCRATCH/old2:new"
check "... to the current format, the same blobs as a fresh conversion" \
	oci_verify "$SCRATCH/old2" new "$SCRATCH/src-pkgs.json" "$SCRATCH/dir-pkgs"

# (d) zstd layers: the same image bytes as gzip, only the source digests
# in the annotations differ.
"${MKLAYER[@]}" resolve "$FIXZ" pkgs >"$SCRATCH/src-zstd.json"
if check "convert oci: with zstd layers" "$FERRY" convert "oci:$FIXZ:pkgs" "dir:$SCRATCH/dir-zstd" -q; then
	check "zstd layers convert to the same bytes as gzip layers" \
		same_image "$SCRATCH/dir-pkgs" "$SCRATCH/dir-zstd"
	check "convert oci: with zstd layers to oci:" \
		"$FERRY" convert "oci:$FIXZ:pkgs" "oci:$OUTL:zstd" -q &&
		check "converted zstd image: manifest and annotations" \
			oci_verify "$OUTL" zstd "$SCRATCH/src-zstd.json" "$SCRATCH/dir-zstd"
fi
rm -rf "$SCRATCH/dir-zstd" "$SCRATCH/dir-pkgs"

# (e) --platform picks from an image index.
host=$(host_platform)
check "convert an image index, default platform" \
	"$FERRY" convert "oci:$FIX:multi" "dir:$SCRATCH/multi-host" -q &&
	check "convert an image index, --platform $host" \
		"$FERRY" convert --platform "$host" "oci:$FIX:multi" "dir:$SCRATCH/multi-explicit" -q &&
	check "the default platform is the host's ($host)" \
		same_image "$SCRATCH/multi-host" "$SCRATCH/multi-explicit"
check "convert --platform linux/amd64" "$FERRY" convert --platform linux/amd64 \
	"oci:$FIX:multi" "dir:$SCRATCH/multi-amd64" -q &&
	check "--platform linux/amd64 picks the amd64 manifest" \
		same_image "$SCRATCH/dir-base" "$SCRATCH/multi-amd64"
rm -rf "$SCRATCH"/multi-* "$SCRATCH/dir-base"
for p in linux/arm64 linux/arm/v7; do
	n=${p//\//-}
	if check "convert --platform $p to oci:" "$FERRY" convert --platform "$p" \
		"oci:$FIX:multi" "oci:$OUTL:$n" -q; then
		"${MKLAYER[@]}" resolve "$FIX" multi --platform "$p" >"$SCRATCH/src-$n.json"
		check "converted $p image: manifest and annotations" \
			oci_verify "$OUTL" "$n" "$SCRATCH/src-$n.json"
		if check "ferry mount --mode local ($p)" mount_local "oci:$OUTL:$n" "$SCRATCH/mnt-$n"; then
			check "--platform $p picks the $p manifest" tree_expect "$SCRATCH/mnt-$n" \
				<<<"[{\"path\": \"platform\", \"data\": \"$p\\n\"}]"
			check "ferry umount ($p)" umount_local "$SCRATCH/mnt-$n"
		fi
	fi
done
check_fails "--platform with no match in the index is refused" s390x \
	"$FERRY" convert --platform linux/s390x "oci:$FIX:multi" "dir:$SCRATCH/none" -q
check_fails "an unknown tag is refused" nosuchtag \
	"$FERRY" convert "oci:$FIX:nosuchtag" "dir:$SCRATCH/none" -q
check_exit "no tag in a layout with several manifests is refused" 1 \
	"$FERRY" convert "oci:$FIX" "dir:$SCRATCH/none" -q
check "nothing written by the refused conversions" test ! -e "$SCRATCH/none"
check "the source layout is unchanged" test "$(sha256sum <"$FIX/index.json")" = "$src_index"

# Synthetic images: one layer in every encoding ferry accepts.
S=$SCRATCH/syn
T=$SCRATCH/tars
mkdir -p "$T"
"${MKLAYER[@]}" tar "$T/one.tar" - <<'EOF'
[{"name": "./", "type": "dir", "mode": 493},
 {"name": "./bin", "type": "dir"},
 {"name": "./bin/big", "random": {"size": 1500000, "seed": 1}, "mode": 493},
 {"name": "./bin/small", "data": "small\n"},
 {"name": "./bin/link", "type": "symlink", "link": "big"}]
EOF
"${MKLAYER[@]}" tar "$T/two.tar" - <<'EOF'
[{"name": "etc", "type": "dir"},
 {"name": "etc/conf", "data": "from layer two\n"},
 {"name": "bin/small", "type": "whiteout"},
 {"name": "bin/big", "random": {"size": 1500000, "seed": 1}, "mode": 448, "uid": 5,
  "_": "same content, new metadata: no new chunks"}]
EOF
"${MKLAYER[@]}" tar "$T/three.tar" - <<'EOF'
[{"name": "copy-of-big", "random": {"size": 1500000, "seed": 1},
  "_": "only chunks already in layer one"}]
EOF
"${MKLAYER[@]}" add-layer "$S" - plain "$T/one.tar" --compress none >/dev/null
"${MKLAYER[@]}" add-layer "$S" - gzip "$T/one.tar" >/dev/null
"${MKLAYER[@]}" add-layer "$S" - zstd "$T/one.tar" --compress zstd >/dev/null
"${MKLAYER[@]}" add-layer "$S" - docker "$T/one.tar" --docker >/dev/null
"${MKLAYER[@]}" add-layer "$S" - mislabelled "$T/one.tar" --compress zstd \
	--media-type application/vnd.oci.image.layer.v1.tar+gzip >/dev/null
"${MKLAYER[@]}" add-layer "$S" gzip two "$T/two.tar" >/dev/null
"${MKLAYER[@]}" add-layer "$S" two three "$T/three.tar" >/dev/null
"${MKLAYER[@]}" add-layer "$SCRATCH/single" - only "$T/one.tar" >/dev/null

if check "convert a plain-tar layer" "$FERRY" convert "oci:$S:plain" "dir:$SCRATCH/s-plain" -q; then
	if check "ferry mount --mode local (plain-tar layer)" \
		mount_local "dir:$SCRATCH/s-plain" "$SCRATCH/mnt-plain"; then
		check "plain-tar layer: the tree" tree_expect "$SCRATCH/mnt-plain" <<'EOF'
[{"path": "bin", "type": "dir", "mode": 493},
 {"path": "bin/big", "mode": 493}, {"path": "bin/small", "data": "small\n"},
 {"path": "bin/link", "type": "symlink", "link": "big"}]
EOF
		check "ferry umount (plain-tar layer)" umount_local "$SCRATCH/mnt-plain"
	fi
	for t in gzip zstd docker mislabelled; do
		check "convert a $t layer" "$FERRY" convert "oci:$S:$t" "dir:$SCRATCH/s-$t" -q &&
			check "a $t layer gives the same bytes as a plain tar" \
				same_image "$SCRATCH/s-plain" "$SCRATCH/s-$t"
	done
fi
check "no tag, one manifest in the layout: that one" \
	"$FERRY" convert "oci:$SCRATCH/single" "dir:$SCRATCH/s-single" -q &&
	check "no tag: the same bytes" same_image "$SCRATCH/s-plain" "$SCRATCH/s-single"

# Layers that add no new chunk get no data blob.
"${MKLAYER[@]}" resolve "$S" three >"$SCRATCH/src-three.json"
if check "convert three layers, two without new chunks" \
	"$FERRY" convert "oci:$S:three" "oci:$OUTL:three" -q; then
	check "converted three-layer image: manifest and annotations" \
		oci_verify "$OUTL" three "$SCRATCH/src-three.json"
	check "one data blob: only the first layer adds chunks" python3 - "$OUTL" \
		"$(tag_digest "$OUTL" three)" "$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["layers"][0]["digest"])' "$SCRATCH/src-three.json")" <<'EOF'
import json, os, sys
m = json.load(open(os.path.join(sys.argv[1], "blobs", *sys.argv[2].split(":"))))
got = [l.get("annotations", {}).get("dev.ferry.blob.source-layer") for l in m["layers"][:-1]]
if got != [sys.argv[3]]:
    print("    data layers come from %s, want [%s]" % (got, sys.argv[3]))
    sys.exit(1)
EOF
fi

# DEST oci:PATH without a tag is "latest"; converting to a tag again
# needs --force and replaces that entry only.
check "convert to oci:PATH (no tag)" "$FERRY" convert "oci:$S:plain" "oci:$SCRATCH/dest" -q &&
	check "the default destination tag is latest" \
		test "$(tag_digest "$SCRATCH/dest" latest)" != "none(0)"
if check "convert to oci:PATH:other" "$FERRY" convert "oci:$S:plain" "oci:$SCRATCH/dest:other" -q &&
	check_exit "an existing tag is not moved without --force" 1 \
		"$FERRY" convert "oci:$S:zstd" "oci:$SCRATCH/dest:latest" -q &&
	check "convert to an existing tag again (a different source, --force)" \
		"$FERRY" convert "oci:$S:zstd" "oci:$SCRATCH/dest:latest" -q --force; then
	"${MKLAYER[@]}" resolve "$S" zstd >"$SCRATCH/src-zstd1.json"
	"${MKLAYER[@]}" resolve "$S" plain >"$SCRATCH/src-plain.json"
	check "the tag now names the new image, once" \
		oci_verify "$SCRATCH/dest" latest "$SCRATCH/src-zstd1.json"
	check "the other tag is untouched" \
		oci_verify "$SCRATCH/dest" other "$SCRATCH/src-plain.json"
	check "no stray or missing blobs after replacing a tag" oci_no_strays "$SCRATCH/dest"
fi

# Tampered copies of the synthetic layout. Each must be refused with exit
# 1, the message naming the bad blob's digest, and nothing written.
tamper() { # DESC TAG WHAT(layer|config|manifest) HOW(flip|truncate) DEST(dir|oci)
	local desc=$1 tag=$2 what=$3 how=$4 dest=$5 L=$SCRATCH/tampered digest f
	rm -rf "$L" "$SCRATCH/t-out"
	cp -a "$S" "$L"
	digest=$(python3 - "$L" "$tag" "$what" <<'EOF'
import json, sys
L, tag, what = sys.argv[1:]
idx = json.load(open(L + "/index.json"))
d = [d for d in idx["manifests"] if d["annotations"]["org.opencontainers.image.ref.name"] == tag][0]
if what == "manifest":
    print(d["digest"])
else:
    m = json.load(open(L + "/blobs/sha256/" + d["digest"][7:]))
    print(m["config"]["digest"] if what == "config" else m["layers"][-1]["digest"])
EOF
)
	f=$L/blobs/sha256/${digest#sha256:}
	case $how in
	flip) python3 - "$f" <<'EOF'
import sys
b = bytearray(open(sys.argv[1], "rb").read())
# A byte in the middle: file data in a tar, inside the deflate stream of a
# gzip, a JSON character of a config ('{' -> 'z' keeps nothing valid).
i = len(b) // 2
b[i] ^= 0x01
open(sys.argv[1], "wb").write(bytes(b))
EOF
		;;
	truncate) truncate -s -100 "$f" ;;
	esac
	check_fails "$desc: exit 1 naming the digest" "${digest#sha256:}" \
		"$FERRY" convert "oci:$L:$tag" "$dest:$SCRATCH/t-out" -q
	check "$desc: nothing written" test ! -e "$SCRATCH/t-out"
}
tamper "a flipped byte in a plain-tar layer" plain layer flip dir
tamper "a flipped byte in a gzip layer" gzip layer flip dir
tamper "a flipped byte in a zstd layer" zstd layer flip oci
tamper "a truncated gzip layer" gzip layer truncate dir
# The config is copied to an oci: destination: it must match its digest.
tamper "a flipped byte in the config, oci: destination" plain config flip oci
tamper "a flipped byte in the manifest" plain manifest flip dir

check_kernel_log
e2e_done
