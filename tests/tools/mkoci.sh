#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# mkoci.sh CACHE_DIR: builds the OCI image fixtures of the oci_* e2e tests
# once, under CACHE_DIR/ferry-oci-$VERSION/ (bump VERSION when this script
# or what it builds changes; older versions are removed), and prints that
# path. A build is complete when its ".complete" stamp exists (written
# last); an incomplete one is thrown away and redone. Needs root, network
# access to a Debian mirror, mmdebstrap, umoci, skopeo, rsync, zstd.
#
# The layout "debian" holds these tags:
#   base       (a) Debian bookworm minbase, one layer (umoci repack)
#   pkgs       (b) base + a layer installing less, procps, file, bzip2,
#              xz-utils (the rsync of a second mmdebstrap rootfs over the
#              first, umoci repack: changed and new files, whiteouts)
#   edit       (c) pkgs + a layer crafted by mklayer.py (the list below):
#              whiteouts of files and directories, dir->file, file->dir,
#              symlink<->file, dir->symlink, opaque directories (marker
#              first and after same-layer entries), a whiteout after a
#              same-layer entry, changed modes/owners/xattrs on lower
#              files and directories, hardlinks to lower-layer paths, a
#              new file replacing one name of a lower hardlink pair, devices,
#              new data (random and copies of lower files)
#   multi      (e) an image index: linux/amd64 -> base, linux/arm64 and
#              linux/arm/v7 -> tiny images (tags arm64, armv7) whose file
#              /platform says which they are
# The layout "zstd" holds (d): tag pkgs, the same image with zstd layers
# (skopeo copy).
# Build time: about 1 min on an idle 2-CPU machine, 2.5 min under load
# (two mmdebstrap runs in parallel, then umoci repack and skopeo).
set -eu
VERSION=4
cache=${1:?usage: mkoci.sh CACHE_DIR}
here=$(cd "$(dirname "$0")" && pwd)
mklayer="python3 $here/mklayer.py"
dest=$cache/ferry-oci-$VERSION

mkdir -p "$cache"
exec 9>"$cache/ferry-oci.lock"
flock 9
# Only the result path goes to stdout (fd 3); tools' chatter to stderr.
exec 3>&1 1>&2
if [ -f "$dest/.complete" ]; then
	echo "$dest" >&3
	exit 0
fi
for old in "$cache"/ferry-oci-*; do
	[ -d "$old" ] && [ "$old" != "$dest" ] && rm -rf "$old"
done
rm -rf "$dest"
mkdir -p "$dest"
work=$dest/work
mkdir -p "$work"
L=$dest/debian
start=$SECONDS

# Two rootfs trees, (b) being (a) plus a few small packages. Timestamps
# differ between the runs, as they would between two real builds.
# One retry: a mirror hiccup should not fail the suite.
debstrap() { # DIR [mmdebstrap options]
	local dir=$1 try
	shift
	for try in 1 2; do
		rm -rf "$dir"
		mmdebstrap --mode=root --variant=minbase "$@" bookworm "$dir" \
			>"$dir.log" 2>&1 && return 0
		echo "mkoci: mmdebstrap $dir failed (try $try):" >&2
		tail -n 20 "$dir.log" >&2
	done
	return 1
}
debstrap "$work/a" &
pa=$!
debstrap "$work/b" --include=less,procps,file,bzip2,xz-utils &
pb=$!
fail=0
wait $pa || fail=1
wait $pb || fail=1
[ $fail -eq 0 ]

umoci init --layout "$L"
umoci new --image "$L:empty"
umoci unpack --image "$L:empty" "$work/bundle" >/dev/null
rsync -aHAX --numeric-ids --delete "$work/a/" "$work/bundle/rootfs/"
umoci repack --refresh-bundle --history.created_by "mmdebstrap minbase" \
	--image "$L:base" "$work/bundle"
rsync -aHAX --numeric-ids --delete "$work/b/" "$work/bundle/rootfs/"
umoci repack --history.created_by "mmdebstrap --include=less,procps,file,bzip2,xz-utils" \
	--image "$L:pkgs" "$work/bundle"
umoci rm --image "$L:empty"

# Layer (c); "_" fields are comments. Modes are decimal (JSON).
$mklayer tar "$work/edit.tar" - --lower "$work/b" <<'EOF'
[
 {"name": "etc/motd", "type": "whiteout"},
 {"name": "usr/share/doc/less", "type": "whiteout", "_": "dir of layer b"},
 {"name": "usr/share/common-licenses", "type": "whiteout", "_": "dir of layer a"},
 {"name": "etc/apt/apt.conf.d", "data": "a file where a directory was\n",
  "mode": 384, "_": "dir -> file, no whiteout"},
 {"name": "etc/debian_version", "type": "dir", "mode": 488, "_": "file -> dir"},
 {"name": "etc/debian_version/inside", "data": "12\n"},
 {"name": "etc/os-release", "data": "NAME=ferry-test\n", "_": "symlink -> file"},
 {"name": "etc/issue.net", "type": "symlink", "link": "issue", "_": "file -> symlink"},
 {"name": "usr/share/doc/bash", "type": "symlink", "link": "dash", "_": "dir -> symlink"},
 {"name": "etc/default", "type": "dir", "mode": 488, "uid": 7, "gid": 8},
 {"name": "etc/default", "type": "opaque", "_": "marker first"},
 {"name": "etc/default/new-in-c", "data": "only this one survives\n"},
 {"name": "var/lib/dpkg/alternatives/kept", "data": "same layer, before the marker\n"},
 {"name": "var/lib/dpkg/alternatives", "type": "opaque", "_": "marker after an entry"},
 {"name": "var/lib/dpkg/alternatives/after", "data": "after the marker\n"},
 {"name": "etc/apt/sources.list", "data": "deb http://example.invalid/ none main\n"},
 {"name": "etc/apt/sources.list", "type": "whiteout",
  "_": "after a same-layer entry: hides lower layers only"},
 {"name": "usr/share", "type": "dir", "mode": 457, "uid": 1234, "gid": 4321,
  "mtime": 1600000000, "xattrs": {"user.dir": "share"},
  "_": "metadata of a lower dir, children kept"},
 {"name": "etc/passwd", "data_from": "etc/passwd", "mode": 384, "uid": 42,
  "gid": 43, "mtime": 1600000001,
  "xattrs": {"user.checksum": "none"},
  "_": "no empty xattr value: umoci drops those, GNU tar keeps them"},
 {"name": "usr/bin/dpkg-hardlink", "type": "hardlink", "link": "usr/bin/dpkg",
  "_": "hardlink to a layer-a file"},
 {"name": "usr/lib/file/magic-link", "type": "hardlink",
  "link": "usr/lib/file/magic.mgc", "_": "hardlink to a layer-b file"},
 {"name": "usr/bin/perl5.36.0", "data": "#!/bin/sh\necho not perl\n",
  "mode": 493, "_": "replaces one name of the lower perl hardlink pair"},
 {"name": "opt", "type": "dir"},
 {"name": "opt/c", "type": "dir", "mode": 496, "uid": 1000, "gid": 1000,
  "xattrs": {"user.dir": "c"}},
 {"name": "opt/c/big.bin", "random": {"size": 3500000, "seed": 3}},
 {"name": "opt/c/big-link", "type": "hardlink", "link": "opt/c/big.bin"},
 {"name": "opt/c/magic-copy", "data_from": "usr/lib/file/magic.mgc",
  "_": "content already in layer b"},
 {"name": "opt/c/xattrs", "data": "x\n", "uid": 65534, "gid": 65534,
  "mode": 3565, "xattrs": {"user.a": "1", "user.b": "two"}},
 {"name": "opt/c/fifo", "type": "fifo", "mode": 416},
 {"name": "opt/c/null", "type": "char", "major": 1, "minor": 3, "mode": 438},
 {"name": "opt/c/sda", "type": "block", "major": 8, "minor": 0, "mode": 432}
]
EOF
$mklayer add-layer "$L" pkgs edit "$work/edit.tar" --created-by "mklayer edit" >/dev/null

# Into its own layout: skopeo reuses blobs the destination already has.
skopeo copy --quiet --dest-compress --dest-compress-format zstd \
	"oci:$L:pkgs" "oci:$dest/zstd:pkgs"

for p in arm64:linux/arm64 armv7:linux/arm/v7; do
	tag=${p%%:*}
	echo "[{\"name\": \"platform\", \"data\": \"${p#*:}\\n\"}]" |
		$mklayer tar "$work/$tag.tar" -
	$mklayer add-layer "$L" - "$tag" "$work/$tag.tar" --platform "${p#*:}" >/dev/null
done
$mklayer index "$L" multi base arm64 armv7

rm -rf "$work"
echo "built in $((SECONDS - start)) s" >"$dest/.complete"
echo "$dest" >&3
