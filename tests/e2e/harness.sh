#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Checks the e2e tooling itself, without ferry: the fixture tree survives a
# round trip through erofs-utils' mkfs.erofs (chunked, with an extra blob
# device) and a kernel mount made by erofs_mount with device=, and treecmp
# finds no difference there but does find each kind of planted difference.
# If this fails, the other e2e results are not to be trusted.
. "$(dirname "$0")/../lib/common.sh"
need_root
need_tool "$EROFS_MOUNT"

FX=$SCRATCH/fixture
make_fixture "$FX"
ok "fixture tree built"

# mkfs.erofs 1.5 cannot take 255-byte names (fails with ENOENT); leave
# those three entries out of this round trip only.
LONG='[nds]{255}'
IMG=$SCRATCH/mkfs.img
BLOB=$SCRATCH/mkfs.blob
check "mkfs.erofs (chunked, --blobdev) of the fixture" \
	mkfs.erofs --quiet --exclude-regex="$LONG" --chunksize=1048576 \
	--blobdev="$BLOB" "$IMG" "$FX"
check "fsck.erofs accepts the mkfs.erofs image" fsck.erofs --device="$BLOB" "$IMG"

MNT=$SCRATCH/mnt
mkdir -p "$MNT"
if check "erofs_mount file-backed with device=" "$EROFS_MOUNT" "$IMG" "$MNT" "device=$BLOB"; then
	check "treecmp: fixture == mkfs.erofs mount" \
		python3 "$TREECMP" --exclude "$LONG" "$FX" "$MNT"
	mkdir -p "$SCRATCH/mnt2"
	check_exit "erofs_mount with the wrong device count fails" 1 \
		"$EROFS_MOUNT" "$IMG" "$SCRATCH/mnt2" "device=$BLOB,device=$BLOB"
	umount "$MNT"
fi
check_exit "erofs_mount usage error" 2 "$EROFS_MOUNT" "$IMG"

# Plant one difference of each kind in the fixture and expect treecmp to
# report every one of them (and nothing else).
python3 - "$FX" <<'EOF'
import os, sys
r = sys.argv[1]
p = lambda s: os.path.join(r, s)
st = os.stat(p("files/size_4096"))
with open(p("files/size_4096"), "r+b") as f:
    f.seek(2000); b = f.read(1); f.seek(2000); f.write(bytes([b[0] ^ 1]))
os.utime(p("files/size_4096"), ns=(st.st_atime_ns, st.st_mtime_ns))
os.chmod(p("attrs/suid"), 0o755)
os.chown(p("attrs/owner_big"), 70000, 80001)
os.utime(p("attrs/mtime_ns"), ns=(0, 1609556645123456788))
os.setxattr(p("xattr/small"), "user.small", b"hellO")
os.removexattr(p("xattr/symlink"), "trusted.on_symlink", follow_symlinks=False)
os.unlink(p("hard/pair_b")); open(p("hard/pair_b"), "wb").write(b"pair\n")
os.unlink(p("dev/block")); os.mknod(p("dev/block"), 0o60660, os.makedev(8, 1))
os.unlink(p("links/short")); os.symlink("b", p("links/short"))
open(p("files/extra"), "w").close()
os.unlink(p("files/size_1"))
EOF
check_exit "treecmp: usage error on a missing tree" 2 python3 "$TREECMP" "$SCRATCH/none" "$FX"
if "$EROFS_MOUNT" "$IMG" "$MNT" "device=$BLOB"; then
	python3 "$TREECMP" --exclude "$LONG" "$MNT" "$FX" >"$LOG" 2>&1
	rc=$?
	# Exactly these "path: field" differences (directories whose entries
	# changed and recreated entries differ in mtime as well).
	want='attrs/mtime_ns: mtime
attrs/owner_big: gid
attrs/suid: mode
dev: mtime
dev/block: mode
dev/block: mtime
dev/block: rdev
files: mtime
files/extra: extra
files/size_1: missing
files/size_4096: content
hard: mtime
hard/pair_a: links
hard/pair_a: nlink
hard/pair_b: links
hard/pair_b: mtime
hard/pair_b: nlink
links: mtime
links/short: mtime
links/short: target
xattr/small: xattr user.small
xattr/symlink: xattr trusted.on_symlink'
	want=$(echo "$want" | LC_ALL=C sort)
	got=$(sed -n 's/^DIFF \([^:]*: [^:]*\):.*/\1/p' "$LOG" | LC_ALL=C sort)
	if [ "$rc" -eq 1 ] && [ "$got" = "$want" ]; then
		ok "treecmp reports each planted difference, nothing else"
	else
		notok "treecmp reports each planted difference, nothing else"
		echo "    exit $rc; differences from the expected list (-want +got):"
		diff <(echo "$want") <(echo "$got") | grep '^[<>]' | sed 's/^/    /'
	fi
	umount "$MNT"
else
	notok "remount the mkfs.erofs image"
fi
e2e_done
