#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Hostile and odd tars, converted with tar: and as the layer of an OCI
# image. ".." components (in names and hardlink targets), hardlinks to
# nothing or to a directory, GNU and PAX sparse entries and a tar cut
# inside an entry are refused (exit 1, a message naming the entry,
# nothing written). Absolute names, "//", "./", "/./" and trailing "/"
# are normalised inside the image root; repeated entries (last wins),
# type changes within one tar, symlinks pointing anywhere, a tar without
# its end-of-archive blocks are accepted and mount as expected. Whiteouts
# and opaque markers, alone or after same-layer entries, on one layer and
# over a lower layer, never show and hide only lower-layer entries. Every
# accepted image also converts to native EROFS layers (--format
# erofs-layers) whose overlayfs stack shows the same tree.
. "$(dirname "$0")/../lib/common.sh"
. "$(dirname "$0")/../lib/oci.sh"
need_root
need_ferry
need_cmds zstd
dmesg_mark
T=$SCRATCH/tars
mkdir -p "$T"

mktar() { # NAME [mklayer tar options], spec on stdin
	local name=$1
	shift
	"${MKLAYER[@]}" tar "$T/$name.tar" - "$@"
}

# An OCI layout $SCRATCH/oci-NAME whose tag t has the given layers.
mkimage() { # NAME TAR...
	local L=$SCRATCH/oci-$1 from=- to
	shift
	while [ $# -gt 0 ]; do
		to=l$#
		[ $# -eq 1 ] && to=t
		"${MKLAYER[@]}" add-layer "$L" "$from" "$to" "$1" >/dev/null || return 1
		from=$to
		shift
	done
}

# Refused as tar: and as an OCI layer: exit 1, WANT in the message, no
# output left behind.
refuse() { # DESC TARNAME WANT
	local desc=$1 name=$2 want=$3
	check_fails "tar: $desc is refused" "$want" \
		"$FERRY" convert "tar:$T/$name.tar" "dir:$SCRATCH/refused" -q
	check "tar: $desc: nothing written" test ! -e "$SCRATCH/refused"
	rm -rf "$SCRATCH/refused"
	mkimage "$name" "$T/$name.tar"
	check_fails "oci: $desc is refused" "$want" \
		"$FERRY" convert "oci:$SCRATCH/oci-$name:t" "oci:$SCRATCH/refused:t" -q
	check "oci: $desc: nothing written" test ! -e "$SCRATCH/refused"
	rm -rf "$SCRATCH/refused" "$SCRATCH/oci-$name"
}

# Convert IMAGE, check, mount, compare with the expected tree on stdin
# (tree_expect), look for whiteout names, umount.
accept() { # DESC IMAGE
	local desc=$1 img=$2 out=$SCRATCH/out mnt=$SCRATCH/mnt
	local spec
	spec=$(cat)
	rm -rf "$out"
	check "$desc: converts" "$FERRY" convert "$img" "dir:$out" -q || return 1
	check "$desc: ferry check" "$FERRY" check "dir:$out"
	check "$desc: mounts" mount_local "dir:$out" "$mnt" || return 1
	check "$desc: the tree" tree_expect "$mnt" <<<"$spec"
	check "$desc: no whiteout names" no_whiteouts "$mnt"
	check "$desc: umount" umount_local "$mnt"
	# The same as native EROFS layers stacked by overlayfs (erofs_layers.sh).
	rm -rf "$SCRATCH/native"
	check "$desc: converts to erofs-layers" "$FERRY" convert -q --format erofs-layers \
		"$img" "oci:$SCRATCH/native:t" || return 1
	check "$desc: erofs-layers mount" mount_local "oci:$SCRATCH/native:t" "$mnt" || return 1
	# Overlayfs cannot link across layers: a lower hardlink target is copied.
	check "$desc: erofs-layers tree (hardlinks across layers aside)" tree_expect "$mnt" \
		< <(python3 -c 'import json, sys; print(json.dumps([{k: v for k, v in e.items() if k != "same_as"} for e in json.load(sys.stdin)]))' <<<"$spec")
	check "$desc: erofs-layers: no whiteout names" no_whiteouts "$mnt"
	check "$desc: erofs-layers umount" umount_local "$mnt"
}

# --- refused ----------------------------------------------------------
mktar dotdot1 <<'EOF'
[{"name": "ok", "data": "fine\n"}, {"name": "../escape", "data": "out\n"}]
EOF
refuse '"../escape"' dotdot1 "../escape"
mktar dotdot2 <<'EOF'
[{"name": "a/", "type": "dir"}, {"name": "a/../../escape2", "data": "out\n"}]
EOF
refuse '"a/../../escape2"' dotdot2 "a/../../escape2"
mktar dotdot3 <<'EOF'
[{"name": "./sub/..", "type": "dir"}]
EOF
refuse '"./sub/.." (a dir entry)' dotdot3 "sub/.."
mktar dotdot4 <<'EOF'
[{"name": "target", "data": "x\n"}, {"name": "hl-escape", "type": "hardlink", "link": "../target"}]
EOF
refuse 'a hardlink to "../target"' dotdot4 "hl-escape"
mktar dangling <<'EOF'
[{"name": "present", "data": "x\n"}, {"name": "hl-dangling", "type": "hardlink", "link": "missing-target"}]
EOF
refuse "a hardlink to a missing target" dangling "hl-dangling"
mktar hl-dir <<'EOF'
[{"name": "adir/", "type": "dir"}, {"name": "hl-to-dir", "type": "hardlink", "link": "adir"}]
EOF
refuse "a hardlink to a directory" hl-dir "hl-to-dir"
mktar cut <<'EOF'
[{"name": "whole", "data": "x\n"}, {"name": "cut-short", "random": {"size": 20000, "seed": 9}}]
EOF
truncate -s 8192 "$T/cut.tar"
refuse "a tar cut inside an entry's data" cut "cut-short"

truncate -s 4M "$T/sparse-file"
printf 'data' | dd of="$T/sparse-file" bs=1 seek=1M conv=notrunc status=none
tar --format=gnu -S -C "$T" -cf "$T/gnu-sparse.tar" sparse-file
refuse "a GNU sparse entry (type S)" gnu-sparse "sparse"
tar --format=posix -S -C "$T" -cf "$T/pax-sparse.tar" sparse-file
refuse "a PAX sparse entry (GNU.sparse 1.0)" pax-sparse "sparse"

# --- normalised and accepted -----------------------------------------
# Every name form of one tree, repeated entries and type changes.
mktar names <<'EOF'
[{"name": "./", "type": "dir", "mode": 493},
 {"name": "/abs", "type": "dir", "mode": 448},
 {"name": "/abs/file", "data": "absolute\n"},
 {"name": "//dbl//file", "data": "double slashes\n"},
 {"name": "./dot/./file", "data": "dot components\n"},
 {"name": "trail/", "type": "dir", "mode": 456},
 {"name": "trail/x", "data": "under a trailing-slash dir\n"},
 {"name": "deep/er/still/file", "data": "no parent entries\n"},
 {"name": "up", "type": "symlink", "link": "../../../etc/passwd"},
 {"name": "abs-link", "type": "symlink", "link": "/etc/shadow"},
 {"name": "dup", "data": "first\n", "mode": 420},
 {"name": "./dup", "data": "second, longer, wins\n", "mode": 384, "uid": 3},
 {"name": "f2d", "data": "a file first\n"},
 {"name": "f2d/", "type": "dir", "mode": 457},
 {"name": "f2d/child", "data": "child of the dir that replaced a file\n"},
 {"name": "d2f/", "type": "dir"},
 {"name": "d2f/child", "data": "gone with its dir\n"},
 {"name": "d2f", "data": "a file replacing a dir\n"},
 {"name": "s2d", "type": "symlink", "link": "f2d"},
 {"name": "s2d/", "type": "dir", "mode": 461},
 {"name": "keep/", "type": "dir", "mode": 493},
 {"name": "keep/child", "data": "kept\n"},
 {"name": "keep", "type": "dir", "mode": 448, "uid": 9,
  "_": "a repeated dir updates attributes, keeps children"},
 {"name": "hl-abs", "type": "hardlink", "link": "/abs/file"},
 {"name": "hl-dot", "type": "hardlink", "link": "./dot/./file"},
 {"name": "big", "random": {"size": 300000, "seed": 4}},
 {"name": "/big-link", "type": "hardlink", "link": "//big"}]
EOF
NAMES='[{"path": "abs", "type": "dir", "mode": 448},
 {"path": "abs/file", "data": "absolute\n"},
 {"path": "dbl", "type": "dir"}, {"path": "dbl/file", "data": "double slashes\n"},
 {"path": "dot", "type": "dir"}, {"path": "dot/file", "data": "dot components\n"},
 {"path": "trail", "type": "dir", "mode": 456},
 {"path": "trail/x", "data": "under a trailing-slash dir\n"},
 {"path": "deep", "type": "dir"}, {"path": "deep/er", "type": "dir"},
 {"path": "deep/er/still", "type": "dir"},
 {"path": "deep/er/still/file", "data": "no parent entries\n"},
 {"path": "up", "type": "symlink", "link": "../../../etc/passwd"},
 {"path": "abs-link", "type": "symlink", "link": "/etc/shadow"},
 {"path": "dup", "data": "second, longer, wins\n", "mode": 384, "uid": 3},
 {"path": "f2d", "type": "dir", "mode": 457},
 {"path": "f2d/child", "data": "child of the dir that replaced a file\n"},
 {"path": "d2f", "data": "a file replacing a dir\n"},
 {"path": "s2d", "type": "dir", "mode": 461},
 {"path": "keep", "type": "dir", "mode": 448, "uid": 9},
 {"path": "keep/child", "data": "kept\n"},
 {"path": "hl-abs", "same_as": "abs/file"},
 {"path": "hl-dot", "same_as": "dot/file"},
 {"path": "big"}, {"path": "big-link", "same_as": "big"}]'
accept "tar: odd names, repeats, type changes" "tar:$T/names.tar" <<<"$NAMES"
mkimage names "$T/names.tar"
accept "oci: odd names, repeats, type changes" "oci:$SCRATCH/oci-names:t" <<<"$NAMES"

# No end-of-archive blocks (the archive simply ends after the last entry).
mktar noeof --no-eof <<'EOF'
[{"name": "a", "data": "first\n"}, {"name": "b", "random": {"size": 5000, "seed": 5}},
 {"name": "c", "data": "last entry, then nothing\n"}]
EOF
NOEOF='[{"path": "a", "data": "first\n"}, {"path": "b"},
 {"path": "c", "data": "last entry, then nothing\n"}]'
accept "tar: no end-of-archive blocks" "tar:$T/noeof.tar" <<<"$NOEOF"
mkimage noeof "$T/noeof.tar"
accept "oci: no end-of-archive blocks" "oci:$SCRATCH/oci-noeof:t" <<<"$NOEOF"

# A path through a symlink of the same tar: handled (either way), no crash.
mktar via-symlink <<'EOF'
[{"name": "etc-link", "type": "symlink", "link": "/etc"},
 {"name": "etc-link/passwd", "data": "root::0:0::/:/bin/sh\n"}]
EOF
"$FERRY" convert "tar:$T/via-symlink.tar" "dir:$SCRATCH/via" -q >"$LOG" 2>&1
rc=$?
if [ "$rc" -le 1 ] && ! sanitizer_report "$LOG"; then
	ok "tar: a name through a same-tar symlink: exit 0 or 1 (got $rc)"
else
	notok "tar: a name through a same-tar symlink: exit 0 or 1 (got $rc)"
	diag "$LOG" 5
fi
rm -rf "$SCRATCH/via"

# --- whiteouts ----------------------------------------------------------
# One layer, nothing below: markers are no-ops and never visible; entries
# of the layer itself survive wherever the markers are.
mktar wh1 <<'EOF'
[{"name": "keep", "data": "kept\n"},
 {"name": "gone", "type": "whiteout"},
 {"name": "d/", "type": "dir"},
 {"name": "d", "type": "opaque"},
 {"name": "d/x", "data": "after the marker\n"},
 {"name": "o/", "type": "dir"},
 {"name": "o/a", "data": "before the marker\n"},
 {"name": "o", "type": "opaque"},
 {"name": "o/b", "data": "after the marker\n"},
 {"name": "e/y", "data": "before its own whiteout\n"},
 {"name": "e/y", "type": "whiteout"},
 {"name": "e/z", "type": "whiteout"},
 {"name": "e/z", "data": "after its own whiteout\n"}]
EOF
mkimage wh1 "$T/wh1.tar"
accept "oci: whiteouts in a single layer" "oci:$SCRATCH/oci-wh1:t" <<'EOF'
[{"path": "keep", "data": "kept\n"},
 {"path": "d", "type": "dir"}, {"path": "d/x", "data": "after the marker\n"},
 {"path": "o", "type": "dir"}, {"path": "o/a", "data": "before the marker\n"},
 {"path": "o/b", "data": "after the marker\n"},
 {"path": "e", "type": "dir"}, {"path": "e/y", "data": "before its own whiteout\n"},
 {"path": "e/z", "data": "after its own whiteout\n"}]
EOF

# Two layers: markers hide lower entries only; replacements across layers;
# hardlinks to lower-layer paths.
mktar lower <<'EOF'
[{"name": "d/", "type": "dir"}, {"name": "d/lower1", "data": "l1\n"},
 {"name": "d/sub/", "type": "dir"}, {"name": "d/sub/deep", "data": "deep\n"},
 {"name": "w/", "type": "dir"}, {"name": "w/x", "data": "in w\n"},
 {"name": "f", "data": "file in lower\n"},
 {"name": "target", "random": {"size": 70000, "seed": 7}, "mode": 448, "uid": 5},
 {"name": "gone", "data": "whited out above\n"},
 {"name": "gonedir/", "type": "dir"}, {"name": "gonedir/y", "data": "y\n"},
 {"name": "meta/", "type": "dir", "mode": 493}, {"name": "meta/kid", "data": "kid\n"}]
EOF
mktar upper <<'EOF'
[{"name": "d/same", "data": "same layer, before the marker\n"},
 {"name": "d", "type": "opaque"},
 {"name": "d/after", "data": "after the marker\n"},
 {"name": "gone", "type": "whiteout"},
 {"name": "gonedir", "type": "whiteout"},
 {"name": "hl", "type": "hardlink", "link": "target"},
 {"name": "f/", "type": "dir"}, {"name": "f/inside", "data": "dir replacing a lower file\n"},
 {"name": "w", "data": "file replacing a lower dir\n"},
 {"name": "meta/", "type": "dir", "mode": 448, "uid": 11}]
EOF
mkimage two "$T/lower.tar" "$T/upper.tar"
accept "oci: two layers, whiteouts and opaque dirs over a lower layer" "oci:$SCRATCH/oci-two:t" <<'EOF'
[{"path": "d", "type": "dir"}, {"path": "d/same", "data": "same layer, before the marker\n"},
 {"path": "d/after", "data": "after the marker\n"},
 {"path": "f", "type": "dir"}, {"path": "f/inside", "data": "dir replacing a lower file\n"},
 {"path": "w", "data": "file replacing a lower dir\n"},
 {"path": "target", "mode": 448, "uid": 5}, {"path": "hl", "same_as": "target", "uid": 5},
 {"path": "meta", "type": "dir", "mode": 448, "uid": 11}, {"path": "meta/kid", "data": "kid\n"}]
EOF

# A hardlink in the upper layer to a lower path that the same layer has
# whited out: the target no longer exists.
mktar upper-hl-gone <<'EOF'
[{"name": "gone", "type": "whiteout"}, {"name": "hl-to-gone", "type": "hardlink", "link": "gone"}]
EOF
mkimage hlgone "$T/lower.tar" "$T/upper-hl-gone.tar"
check_fails "oci: a hardlink to a lower path whited out in its own layer is refused" "hl-to-gone" \
	"$FERRY" convert "oci:$SCRATCH/oci-hlgone:t" "dir:$SCRATCH/refused" -q
check_fails "oci: the same, to erofs-layers" "hl-to-gone" \
	"$FERRY" convert --format erofs-layers "oci:$SCRATCH/oci-hlgone:t" "oci:$SCRATCH/refused:t" -q

check_kernel_log
e2e_done
