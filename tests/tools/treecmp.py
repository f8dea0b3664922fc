#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""treecmp REF MNT: compare two directory trees attribute by attribute.

Walks both trees with lstat (symlinks are never followed) and compares, for
every relative path: the set of entries, file type, full st_mode, uid, gid,
st_mtime_ns, size (regular files and symlinks), sha256 of regular file
content, symlink target, every xattr of every namespace (name and value
bytes, read with follow_symlinks=False), rdev (character and block
devices), nlink (non-directories) and hardlink groups (the set of paths
sharing an inode must be the same in both trees). Directory sizes and
nlink, atime and ctime are not compared: they are properties of the
filesystem, not of the image.

Prints one line per difference, then a summary; exits 1 on any difference,
2 on usage or I/O errors on the trees.

Options (skip only what cannot be carried, and say why at the call site):
  --ignore-root-attrs  do not compare the root directory's own mode, owner,
                       mtime and xattrs (a tar without a "./" entry gives
                       the converter nothing to copy them from)
  --exclude REGEX      leave out relative paths matching REGEX (re.search;
                       repeatable), in both trees; e.g. sockets, which tar
                       cannot carry
  --ignore FIELDS      comma-separated fields not to compare, from:
                       mode,uid,gid,size,mtime,content,target,xattrs,rdev,
                       nlink,links (for oracles like mkfs.erofs that do not
                       keep everything)
  --max-print N        print at most N difference lines (default 200)
"""
import argparse
import collections
import hashlib
import os
import re
import stat
import sys

FIELDS = ("type", "mode", "uid", "gid", "size", "mtime", "content", "target",
          "xattrs", "rdev", "nlink", "links")


def file_sha256(path):
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while True:
            b = f.read(1 << 20)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def read_xattrs(path):
    out = {}
    for name in os.listxattr(path, follow_symlinks=False):
        out[name] = os.getxattr(path, name, follow_symlinks=False)
    return out


def type_name(mode):
    for test, name in ((stat.S_ISREG, "file"), (stat.S_ISDIR, "dir"),
                       (stat.S_ISLNK, "symlink"), (stat.S_ISCHR, "chardev"),
                       (stat.S_ISBLK, "blockdev"), (stat.S_ISFIFO, "fifo"),
                       (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "unknown(%o)" % stat.S_IFMT(mode)


class Tree:
    """Every entry of a tree: relpath -> dict of attributes."""

    def __init__(self, root, excludes, hash_content=True):
        self.root = root
        self.excludes = excludes
        self.hash_content = hash_content
        self.entries = {}
        self.inodes = collections.defaultdict(list)  # (dev, ino) -> paths
        self._walk(".")
        for paths in self.inodes.values():
            group = tuple(sorted(paths))
            for p in paths:
                self.entries[p]["links"] = group

    def _excluded(self, rel):
        return rel != "." and any(r.search(rel) for r in self.excludes)

    def _walk(self, rel):
        path = os.path.join(self.root, rel) if rel != "." else self.root
        st = os.lstat(path)
        e = {"type": type_name(st.st_mode), "mode": st.st_mode,
             "uid": st.st_uid, "gid": st.st_gid, "mtime": st.st_mtime_ns,
             "xattrs": read_xattrs(path)}
        if stat.S_ISREG(st.st_mode):
            e["size"] = st.st_size
            if self.hash_content:
                e["content"] = file_sha256(path)
        elif stat.S_ISLNK(st.st_mode):
            e["size"] = st.st_size
            e["target"] = os.fsencode(os.readlink(path))
        elif stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
            e["rdev"] = (os.major(st.st_rdev), os.minor(st.st_rdev))
        if not stat.S_ISDIR(st.st_mode):
            e["nlink"] = st.st_nlink
            self.inodes[(st.st_dev, st.st_ino)].append(rel)
        self.entries[rel] = e
        if stat.S_ISDIR(st.st_mode):
            for name in sorted(os.listdir(path)):
                child = name if rel == "." else rel + "/" + name
                if not self._excluded(child):
                    self._walk(child)


def show(field, v):
    if v is None:
        return "(none)"
    if field == "mode":
        return "0%o" % v
    if field == "mtime":
        return "%d.%09d" % divmod(v, 10**9)
    if isinstance(v, bytes):
        if len(v) > 64:
            return "%d bytes sha256:%s" % (len(v), hashlib.sha256(v).hexdigest()[:16])
        return repr(v)
    if isinstance(v, tuple) and field == "links":
        return "[" + ", ".join(v) + "]"
    return repr(v)


def compare_xattrs(path, a, b, report):
    for name in sorted(set(a) | set(b)):
        va, vb = a.get(name), b.get(name)
        if va != vb:
            report(path, "xattr " + name, show("xattr", va), show("xattr", vb))


def main():
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ref")
    ap.add_argument("mnt")
    ap.add_argument("--ignore-root-attrs", action="store_true")
    ap.add_argument("--exclude", action="append", default=[])
    ap.add_argument("--ignore", default="")
    ap.add_argument("--max-print", type=int, default=200)
    args = ap.parse_args()

    ignore = set(f for f in args.ignore.split(",") if f)
    bad = ignore - set(FIELDS)
    if bad:
        ap.error("unknown field(s) for --ignore: " + ",".join(sorted(bad)))
    excludes = [re.compile(r) for r in args.exclude]
    for d in (args.ref, args.mnt):
        if not os.path.isdir(d):
            ap.error("not a directory: " + d)

    try:
        hashing = "content" not in ignore
        ref = Tree(args.ref, excludes, hashing)
        mnt = Tree(args.mnt, excludes, hashing)
    except OSError as e:
        print("treecmp: error reading tree: %s" % e, file=sys.stderr)
        return 2

    counts = collections.Counter()
    printed = 0

    def report(path, field, a, b):
        nonlocal printed
        counts[field.split(" ")[0]] += 1
        if printed < args.max_print:
            print("DIFF %s: %s: ref=%s mnt=%s" % (path, field, a, b))
        printed += 1

    for p in sorted(set(ref.entries) - set(mnt.entries)):
        report(p, "missing", "present", "absent")
    for p in sorted(set(mnt.entries) - set(ref.entries)):
        report(p, "extra", "absent", "present")

    for p in sorted(set(ref.entries) & set(mnt.entries)):
        a, b = ref.entries[p], mnt.entries[p]
        if a["type"] != b["type"]:
            report(p, "type", a["type"], b["type"])
            continue
        skip = set(ignore)
        if p == "." and args.ignore_root_attrs:
            skip |= {"mode", "uid", "gid", "mtime", "xattrs"}
        for f in FIELDS[1:]:
            if f in skip or (f not in a and f not in b):
                continue
            if f == "xattrs":
                compare_xattrs(p, a[f], b[f], report)
            elif a.get(f) != b.get(f):
                report(p, f, show(f, a.get(f)), show(f, b.get(f)))

    if printed > args.max_print:
        print("... %d more differences not shown" % (printed - args.max_print))
    total = sum(counts.values())
    detail = ", ".join("%s=%d" % kv for kv in sorted(counts.items()))
    print("treecmp: %d entries in ref, %d in mnt, %d difference(s)%s" %
          (len(ref.entries), len(mnt.entries), total,
           " (" + detail + ")" if detail else ""))
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
