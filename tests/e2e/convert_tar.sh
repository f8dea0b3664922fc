#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# tar: conversion. The fixture packed by GNU tar (PAX, xattrs incl. ACLs
# and capabilities, numeric owners, "." entry) plain and gzip / zstd / xz
# compressed (files without extensions: detection is by content) must
# mount as the fixture itself. Archives with repeated entries, hardlink
# chains and unnormalised names, GNU-format long names, a tar without a
# "." entry and huge PAX xattrs must mount as GNU tar extracts them.
. "$(dirname "$0")/../lib/common.sh"
need_root
need_ferry

FX=$SCRATCH/fixture
make_fixture "$FX"
T=$SCRATCH/tars
mkdir -p "$T"
dmesg_mark

# GNU tar skips sockets ("socket ignored") and stores a hardlinked fifo as
# two separate fifos, so those fixture entries cannot come through a tar.
NOT_IN_TAR=(--exclude '^dev/socket$' --exclude '^hard/fifo_[ab]$')
GNUTAR_X=(--xattrs --xattrs-include='*' --numeric-owner --same-owner -p)

if ! tar --format=posix --xattrs --xattrs-include='*' --numeric-owner \
	-C "$FX" -cf "$T/layer-plain" . 2>"$LOG"; then
	notok "GNU tar packs the fixture"
	diag "$LOG"
	e2e_done
fi
gzip -1 -c "$T/layer-plain" >"$T/layer-gzip"
zstd -1 -q -c "$T/layer-plain" >"$T/layer-zstd"
xz -0 -T2 -c "$T/layer-plain" >"$T/layer-xz"
ok "GNU tar packs the fixture (plain, gzip, zstd, xz)"

# convert, check, mount, treecmp against REF, fsck.erofs, umount.
tar_roundtrip() { # NAME TARFILE REF [treecmp options]
	local name=$1 tarfile=$2 ref=$3 out=$SCRATCH/out-$1 mnt=$SCRATCH/mnt-$1
	shift 3
	check "convert tar: ($name)" "$FERRY" convert "tar:$tarfile" "dir:$out" -q || return 1
	check "ferry check ($name)" "$FERRY" check "dir:$out"
	check "ferry mount --mode local ($name)" mount_local "dir:$out" "$mnt" || return 1
	check "treecmp reference == mount ($name)" python3 "$TREECMP" "$@" "$ref" "$mnt"
	# shellcheck disable=SC2046
	check "fsck.erofs accepts the image ($name)" \
		fsck.erofs $(erofs_devices "$out") "$out/bootstrap"
	check "ferry umount ($name)" umount_local "$mnt"
}

tar_roundtrip plain "$T/layer-plain" "$FX" "${NOT_IN_TAR[@]}"
for z in gzip zstd xz; do
	tar_roundtrip "$z" "$T/layer-$z" "$FX" "${NOT_IN_TAR[@]}"
	[ -d "$SCRATCH/out-$z" ] && [ -d "$SCRATCH/out-plain" ] &&
		check "$z tar converts to the same bytes as the plain tar" \
			same_image "$SCRATCH/out-plain" "$SCRATCH/out-$z"
	rm -rf "$SCRATCH/out-$z"
done
rm -f "$T"/layer-*

# Repeated entries (the last one wins, a repeated directory keeps its
# children), type changes, hardlink chains (a link to a link), names with
# "./", "//" and "/./", and an entry whose parent has no entry of its own.
python3 - "$T/dups.tar" <<'EOF'
import io, sys, tarfile
tf = tarfile.open(sys.argv[1], "w", format=tarfile.PAX_FORMAT)
t = [1000000000]
def add(name, typ=tarfile.REGTYPE, data=b"", mode=0o644, link="", uid=0, gid=0,
        pax=None):
    ti = tarfile.TarInfo(name)
    ti.type, ti.mode, ti.uid, ti.gid, ti.linkname = typ, mode, uid, gid, link
    ti.mtime = t[0]; t[0] += 1
    if pax:
        ti.pax_headers = pax
    ti.size = len(data) if typ == tarfile.REGTYPE else 0
    tf.addfile(ti, io.BytesIO(data) if typ == tarfile.REGTYPE else None)
D, L, H = tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE
add("./", D, mode=0o755)
add("./a.txt", data=b"first version\n", pax={"SCHILY.xattr.user.first": "1"})
add("./d/", D, mode=0o755)
add("./d/f", data=b"in d\n")
add("./a.txt", data=b"second version, longer\n" * 100, mode=0o600, uid=1234, gid=5678)
add("./d//g", data=b"double slash\n")
add("./d/./h", data=b"dot component\n")
add("d/i", data=b"no ./ prefix\n")
add("./d/", D, mode=0o700)  # after every d/ child: GNU tar's reference
                            # would otherwise stamp d with the time of extraction
add("./s", L, link="target1")
add("./s", data=b"now a file\n")
add("./x", data=b"a file first\n")
add("./x", L, link="a.txt")
add("./h1", data=b"hard\n" * 1000, mode=0o640)
add("./h2", H, link="h1")
add("./h3", H, link="./h2")
tf.close()
EOF
mkdir -p "$SCRATCH/ref-dups"
if tar -xf "$T/dups.tar" -C "$SCRATCH/ref-dups" "${GNUTAR_X[@]}" 2>"$LOG"; then
	tar_roundtrip dups "$T/dups.tar" "$SCRATCH/ref-dups"
else
	notok "GNU tar extracts the repeated-entries tar (reference)"
	diag "$LOG"
fi

# GNU format: long names and link targets through ././@LongLink records,
# whole-second mtimes, no xattrs. Reference: GNU tar's own extraction.
mkdir -p "$SCRATCH/ref-gnu"
if tar --format=gnu --numeric-owner -C "$FX" -cf "$T/gnu.tar" . 2>"$LOG" &&
	tar -xf "$T/gnu.tar" -C "$SCRATCH/ref-gnu" --numeric-owner --same-owner -p 2>"$LOG"; then
	tar_roundtrip gnu-format "$T/gnu.tar" "$SCRATCH/ref-gnu" "${NOT_IN_TAR[@]}"
else
	notok "GNU tar packs and extracts the fixture in GNU format"
	diag "$LOG"
fi
rm -rf "$SCRATCH/ref-gnu" "$T/gnu.tar"

# No "." entry: the root directory's attributes are not in the archive.
mkdir -p "$SCRATCH/ref-noroot"
if tar --format=posix --xattrs --xattrs-include='*' --numeric-owner -C "$FX" \
	-cf "$T/noroot.tar" files links hard xattr 2>"$LOG" &&
	tar -xf "$T/noroot.tar" -C "$SCRATCH/ref-noroot" "${GNUTAR_X[@]}" 2>>"$LOG"; then
	tar_roundtrip noroot "$T/noroot.tar" "$SCRATCH/ref-noroot" --ignore-root-attrs \
		--exclude '^hard/fifo_[ab]$'
else
	notok "GNU tar packs and extracts a tar without a . entry"
	diag "$LOG"
fi
rm -rf "$SCRATCH/ref-noroot" "$T/noroot.tar"

# Nothing but a directory and an empty file: no chunk data at all.
mkdir -p "$SCRATCH/ref-tiny/empty_dir"
: >"$SCRATCH/ref-tiny/empty"
touch -d '2020-02-02 02:02:02.5' "$SCRATCH/ref-tiny/empty" "$SCRATCH/ref-tiny/empty_dir" "$SCRATCH/ref-tiny"
tar --format=posix --numeric-owner -C "$SCRATCH/ref-tiny" -cf "$T/tiny.tar" .
tar_roundtrip tiny "$T/tiny.tar" "$SCRATCH/ref-tiny"

# xattrs larger than any filesystem here can hold: values of 60000 and
# 65535 bytes (the EROFS and VFS maximum) on one file, a 255-byte name.
python3 - "$T/bigx.tar" <<'EOF'
import io, sys, tarfile
tf = tarfile.open(sys.argv[1], "w", format=tarfile.PAX_FORMAT)
ti = tarfile.TarInfo("./big")
ti.mtime, ti.size = 1700000000, 5
ti.pax_headers = {"SCHILY.xattr.user.big": "".join(chr(97 + i % 26) for i in range(60000)),
                  "SCHILY.xattr.user.max": "m" * 65535,
                  "SCHILY.xattr.user." + "n" * 250: "long name"}
tf.addfile(ti, io.BytesIO(b"data\n"))
tf.close()
EOF
OUT=$SCRATCH/out-bigx
MNT=$SCRATCH/mnt-bigx
if check "convert tar: with 60000- and 65535-byte xattr values" \
	"$FERRY" convert "tar:$T/bigx.tar" "dir:$OUT" -q; then
	check "ferry check (big xattrs)" "$FERRY" check "dir:$OUT"
	if check "ferry mount --mode local (big xattrs)" mount_local "dir:$OUT" "$MNT"; then
		check "big xattr values read back through the kernel" python3 - "$MNT/big" <<'EOF'
import os, sys
p = sys.argv[1]
want = {"user.big": "".join(chr(97 + i % 26) for i in range(60000)).encode(),
        "user.max": b"m" * 65535, "user." + "n" * 250: b"long name"}
got = {n: os.getxattr(p, n) for n in os.listxattr(p)}
for n in sorted(set(want) | set(got)):
    if want.get(n) != got.get(n):
        print("%s: want %s bytes, got %s" % (n[:40], len(want.get(n, b"")),
              None if n not in got else len(got[n])))
sys.exit(want != got)
EOF
		# shellcheck disable=SC2046
		check "fsck.erofs accepts the image (big xattrs)" \
			fsck.erofs $(erofs_devices "$OUT") "$OUT/bootstrap"
		check "ferry umount (big xattrs)" umount_local "$MNT"
	fi
fi

check_kernel_log
e2e_done
