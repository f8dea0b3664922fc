#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# mkfixture.sh DIR: build the edge-case tree that the e2e tests convert and
# compare (DIR must not exist, or be empty). Needs root (devices, chown,
# trusted.* xattrs). Content is deterministic (seeded PRNG), and so are all
# attributes: two runs give trees that treecmp finds identical.
#
# Covers: file sizes around the inline limit and 4 KiB blocks and chunk
# boundaries (1 MiB and 64 KiB chunks), multi-chunk files, an all-zero
# middle chunk stored as a real hole, an all-zero file, duplicate files and
# a chunk shared between different files (dedup), 5000 entries in one
# directory, 255-byte names, odd names, a 60-level deep path (> 256
# bytes, needs PAX/GNU long names in tar), a 4000-byte symlink target,
# dangling/absolute/relative symlinks, hardlink groups of 2 and 3,
# xattrs in the user/trusted/security/system namespaces (a value as large
# as this filesystem allows, empty and binary values, a 255-byte name,
# many xattrs on one file, the same xattrs on 100 files, xattrs on a
# symlink, a device and directories), POSIX ACLs (access + default, raw
# xattr values), uid/gid > 65535, nanosecond / pre-1970 / post-2038
# mtimes, setuid/setgid/sticky, mode 000, char and block devices (incl.
# large major/minor), a fifo and a socket. Directory attributes are set
# last, deepest first.
#
# Prints "large-xattr=N" (the size of the largest xattr value used; ext4
# without ea_inode caps values near one block).
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: mkfixture.sh DIR" >&2; exit 2; }
mkdir -p "$1"
if [ -n "$(ls -A "$1")" ]; then
	echo "mkfixture.sh: $1 is not empty" >&2
	exit 1
fi
exec python3 - "$1" <<'PYEOF'
import os, random, socket, stat, struct, sys

root = sys.argv[1]
rng = random.Random(20240611)
MiB = 1 << 20
dirs = []  # (path, mode, mtime_ns, uid, gid), applied deepest first at the end


def P(rel):
    return os.path.join(root, rel)


def ns(sec, nsec=0):
    return sec * 10**9 + nsec


T0 = ns(1609556645, 123456789)  # 2021-01-02 03:04:05.123456789 UTC
seq = [0]


def next_mtime():
    # Every entry a distinct, nanosecond-precise mtime.
    seq[0] += 1
    return T0 + seq[0] * 1000003


def mkdir(rel, mode=0o755, mtime=None, uid=0, gid=0):
    os.makedirs(P(rel), exist_ok=True)
    dirs.append((rel, mode, mtime if mtime is not None else next_mtime(), uid, gid))


def randbytes(n):
    return rng.randbytes(n)


def textbytes(n):
    # Compressible but not trivially repetitive.
    words = [b"ferry", b"erofs", b"chunk", b"blob", b"layer", b"image",
             b"kernel", b"mount", b"\n", b" ", b"0123456789"]
    out = bytearray()
    while len(out) < n:
        out += rng.choice(words) + b" "
    return bytes(out[:n])


def mkfile(rel, data, mode=0o644, mtime=None, uid=0, gid=0):
    with open(P(rel), "wb") as f:
        f.write(data)
    os.chown(P(rel), uid, gid)
    os.chmod(P(rel), mode)
    t = mtime if mtime is not None else next_mtime()
    os.utime(P(rel), ns=(t, t))


def mksparse(rel, pieces, mode=0o644):
    """pieces: list of bytes or int (a hole of that many zero bytes)."""
    with open(P(rel), "wb") as f:
        for p in pieces:
            if isinstance(p, int):
                f.seek(p, os.SEEK_CUR)
            else:
                f.write(p)
        f.truncate(f.tell())
    os.chmod(P(rel), mode)
    t = next_mtime()
    os.utime(P(rel), ns=(t, t))


def symlink(target, rel, mtime=None, uid=0, gid=0):
    os.symlink(target, P(rel))
    os.chown(P(rel), uid, gid, follow_symlinks=False)
    t = mtime if mtime is not None else next_mtime()
    os.utime(P(rel), ns=(t, t), follow_symlinks=False)


def special(rel, mode, dev=0, mtime=None):
    os.mknod(P(rel), mode, dev)
    os.chmod(P(rel), stat.S_IMODE(mode))
    t = mtime if mtime is not None else next_mtime()
    os.utime(P(rel), ns=(t, t))


def setx(rel, name, value):
    os.setxattr(P(rel), name, value, follow_symlinks=False)


def posix_acl(entries):
    # Raw system.posix_acl_* value: version 2, then (tag u16, perm u16, id u32).
    return struct.pack("<I", 2) + b"".join(
        struct.pack("<HHI", tag, perm, ident) for tag, perm, ident in entries)


ACL_USER_OBJ, ACL_USER, ACL_GROUP_OBJ, ACL_GROUP, ACL_MASK, ACL_OTHER = \
    0x01, 0x02, 0x04, 0x08, 0x10, 0x20
NOID = 0xFFFFFFFF

mkdir(".", 0o755)

# --- regular files: sizes --------------------------------------------------
mkdir("files")
mkfile("files/empty", b"")
for n in (1, 100, 255, 256, 257, 4095, 4096, 4097, 65535, 65536, 65537):
    mkfile("files/size_%d" % n, randbytes(n))
mkfile("files/text_8k", textbytes(8192))
mkfile("files/chunk_1m", randbytes(MiB))
mkfile("files/chunk_1m_plus1", randbytes(MiB + 1))
multi = randbytes(MiB) + textbytes(MiB) + randbytes(MiB)
mkfile("files/multi_3m", multi)
mkfile("files/multi_3m_tail", textbytes(3 * MiB + 12345))
# Middle chunk all zero and a real hole in the source file.
mksparse("files/hole_middle", [randbytes(MiB), MiB, randbytes(MiB)])
# Zeros written out (not sparse), and one sparse all-zero file.
mkfile("files/zero_2m", bytes(2 * MiB))
mksparse("files/sparse_3m", [3 * MiB])
# A zero 4 KiB block inside a chunk (not a whole zero chunk).
mkfile("files/zero_block_inside", randbytes(8192) + bytes(4096) + randbytes(8192))

# --- dedup -----------------------------------------------------------------
mkdir("dup")
mkdir("dup/sub")
dupdata = randbytes(MiB + MiB // 2)
for rel in ("dup/a", "dup/b", "dup/sub/c"):
    mkfile(rel, dupdata)
# First chunk equal to multi_3m's first chunk, rest different.
mkfile("dup/shared_first_chunk", multi[:MiB] + randbytes(MiB // 3))
small = randbytes(300)
mkfile("dup/small1", small)
mkfile("dup/small2", small)

# --- one big directory -----------------------------------------------------
mkdir("big", 0o755)
for i in range(5000):
    name = "e%05d" % i + "_" * (i % 37)
    mkfile("big/" + name, b"%d\n" % i if i % 3 else b"", mode=0o644)

# --- names -----------------------------------------------------------------
mkdir("names")
mkfile("names/" + "n" * 255, b"255-byte name\n")
mkdir("names/" + "d" * 255)
mkfile("names/" + "d" * 255 + "/" + "f" * 255, b"nested long names\n")
symlink("n" * 255, "names/" + "s" * 255)
for name in ("with space", "\u00fcn\u00efc\u00f6d\u00e9 \u65e5\u672c", "-dash",
             ".hidden", "#hash", "a=b,c", "back\\slash", "tab\there"):
    mkfile("names/" + name, name.encode() + b"\n")

# --- deep path (> 256 bytes) ------------------------------------------------
deep = "deep"
mkdir(deep)
for i in range(60):
    deep += "/level_%02d" % i
    mkdir(deep)
mkfile(deep + "/leaf", b"deep leaf\n")

# --- symlinks --------------------------------------------------------------
mkdir("links")
symlink("t" * 20 + "/" + "x" * 3979, "links/long")  # 4000-byte target
symlink("../nonexistent/target", "links/dangling")
symlink("/etc/passwd", "links/absolute")
symlink("../files/size_100", "links/relative")
symlink("../dup", "links/to_dir")
symlink("a", "links/short")
symlink("x" * 60, "links/sixty")

# --- hardlinks -------------------------------------------------------------
mkdir("hard")
mkdir("hard/sub")
mkfile("hard/pair_a", b"pair\n")
os.link(P("hard/pair_a"), P("hard/pair_b"))
mkfile("hard/tri_a", randbytes(5000))
os.link(P("hard/tri_a"), P("hard/tri_b"))
os.link(P("hard/tri_a"), P("hard/sub/tri_c"))
mkfile("hard/empty_a", b"")
os.link(P("hard/empty_a"), P("hard/sub/empty_b"))
mkfile("hard/big_a", randbytes(2 * MiB + 7))
os.link(P("hard/big_a"), P("files/big_b_link"))
special("hard/fifo_a", stat.S_IFIFO | 0o600)
os.link(P("hard/fifo_a"), P("hard/fifo_b"))

# --- xattrs ----------------------------------------------------------------
mkdir("xattr")
mkfile("xattr/small", b"x\n")
setx("xattr/small", "user.small", b"hello")
setx("xattr/small", "user.empty", b"")
setx("xattr/small", "user.binary", bytes(range(256))[:64] + b"\0\0")
mkfile("xattr/large", b"large xattr\n")
large = 0
for n in (65535, 60000, 32768, 16384, 8192, 4040, 4000, 3000, 2000):
    try:
        setx("xattr/large", "user.large", textbytes(n))
        large = n
        break
    except OSError:
        pass
assert large, "no large xattr value fits"
mkfile("xattr/longname", b"\n")
setx("xattr/longname", "user." + "k" * 250, b"v")
mkfile("xattr/many", b"many\n")
for i in range(50):
    setx("xattr/many", "user.m%02d" % i, b"value-%d" % i * (i % 5 + 1))
mkfile("xattr/trusted", b"t\n")
setx("xattr/trusted", "trusted.foo", b"bar")
setx("xattr/trusted", "trusted.overlay.origin", randbytes(40))
mkdir("xattr/opaque_dir")
setx("xattr/opaque_dir", "trusted.overlay.opaque", b"y")
setx("xattr/opaque_dir", "user.dir_attr", b"on a directory")
mkfile("xattr/cap", b"#!/bin/true\n", mode=0o755)
# VFS_CAP_REVISION_2 | effective, permitted = CAP_NET_RAW (13): setcap cap_net_raw+ep
setx("xattr/cap", "security.capability", struct.pack("<IIIII", 0x02000001, 1 << 13, 0, 0, 0))
mkfile("xattr/selinux_like", b"s\n")
setx("xattr/selinux_like", "security.test", b"system_u:object_r:test_t:s0\0")
mkfile("xattr/acl", b"acl\n", mode=0o640)
setx("xattr/acl", "system.posix_acl_access", posix_acl([
    (ACL_USER_OBJ, 6, NOID), (ACL_USER, 4, 1000), (ACL_USER, 6, 70000),
    (ACL_GROUP_OBJ, 4, NOID), (ACL_GROUP, 4, 80000), (ACL_MASK, 6, NOID),
    (ACL_OTHER, 0, NOID)]))
mkdir("xattr/acl_dir", 0o750)
acl_dir = [(ACL_USER_OBJ, 7, NOID), (ACL_USER, 5, 1000), (ACL_GROUP_OBJ, 5, NOID),
           (ACL_MASK, 5, NOID), (ACL_OTHER, 0, NOID)]
setx("xattr/acl_dir", "system.posix_acl_access", posix_acl(acl_dir))
setx("xattr/acl_dir", "system.posix_acl_default", posix_acl(acl_dir))
symlink("small", "xattr/symlink")
setx("xattr/symlink", "trusted.on_symlink", b"link xattr")
special("xattr/chardev", stat.S_IFCHR | 0o600, os.makedev(1, 3))
setx("xattr/chardev", "trusted.on_device", b"dev xattr")
mkdir("xattr/shared")
for i in range(100):
    rel = "xattr/shared/f%03d" % i
    mkfile(rel, b"%d\n" % i)
    setx(rel, "user.shared", b"the same value on many files")
    setx(rel, "trusted.shared", b"also shared")
    if i % 10 == 0:
        setx(rel, "user.own", b"own %d" % i)

# --- ownership, times, modes ----------------------------------------------
mkdir("attrs")
mkfile("attrs/owner_big", b"o\n", uid=70000, gid=80000)
mkdir("attrs/owner_big_dir", 0o755, uid=70001, gid=80001)
symlink("owner_big", "attrs/owner_big_link", uid=70002, gid=80002)
mkfile("attrs/owner_max", b"o\n", uid=4294967294, gid=4294967294)
mkfile("attrs/mtime_ns", b"m\n", mtime=ns(1609556645, 123456789))
mkfile("attrs/mtime_1960", b"m\n", mtime=-ns(315619200) + 5)  # 1960-01-01 + 5 ns
mkfile("attrs/mtime_epoch", b"m\n", mtime=0)
mkfile("attrs/mtime_2100", b"m\n", mtime=ns(4102444800, 999999999))
symlink("mtime_1960", "attrs/link_1960", mtime=-ns(315619200, 0) + 999)
mkfile("attrs/suid", b"s\n", mode=0o4755)
mkfile("attrs/sgid", b"s\n", mode=0o2755)
mkfile("attrs/suid_sgid_sticky", b"s\n", mode=0o7777)
mkfile("attrs/mode000", b"nobody\n", mode=0o000)
mkfile("attrs/mode_odd", b"o\n", mode=0o421)
mkdir("attrs/sticky_dir", 0o1777)
mkdir("attrs/sgid_dir", 0o2775)
mkdir("attrs/dir000", 0o000)
mkfile("attrs/dir000/inside", b"inside mode 000 dir\n")
mkdir("attrs/empty_dir", 0o700, mtime=ns(946684800, 1))

# --- special files ---------------------------------------------------------
mkdir("dev")
special("dev/null_like", stat.S_IFCHR | 0o666, os.makedev(1, 3))
special("dev/char_large", stat.S_IFCHR | 0o600, os.makedev(250, 300000))
special("dev/char_max", stat.S_IFCHR | 0o600, os.makedev(4095, 1048575))
special("dev/block", stat.S_IFBLK | 0o660, os.makedev(8, 0))
special("dev/block_large", stat.S_IFBLK | 0o640, os.makedev(259, 12345))
special("dev/fifo", stat.S_IFIFO | 0o644)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(P("dev/socket"))
s.close()
os.chmod(P("dev/socket"), 0o755)
t = next_mtime()
os.utime(P("dev/socket"), ns=(t, t))

# --- directory attributes last, deepest first -------------------------------
for rel, mode, mtime, uid, gid in sorted(dirs, key=lambda d: -d[0].count("/") - (d[0] != ".")):
    os.chown(P(rel), uid, gid)
    os.chmod(P(rel), mode)
    os.utime(P(rel), ns=(mtime, mtime))
print("large-xattr=%d" % large)
PYEOF
