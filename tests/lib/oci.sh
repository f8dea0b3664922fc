# shellcheck shell=bash disable=SC2034
# SPDX-License-Identifier: MIT
# Helpers shared by tests/e2e/oci_*.sh and hostile_tar.sh (sourced after
# lib/common.sh, not run: run directly it does nothing).
#
# Env: FERRY_FIXTURES, where tests/tools/mkoci.sh caches the OCI fixture
# images (default /var/tmp/ferry-fixtures; built on first use, ~1-2 min).

[ "${BASH_SOURCE[0]}" = "$0" ] && exit 0

MKLAYER=(python3 "$TOP/tests/tools/mklayer.py")
MKOCI=$TOP/tests/tools/mkoci.sh
FERRY_FIXTURES=${FERRY_FIXTURES:-/var/tmp/ferry-fixtures}

# Sets FIX (the "debian" layout) and FIXZ (the "zstd" layout), building
# the fixtures when they are not cached yet.
oci_fixtures() {
	local d t0=$SECONDS
	need_cmds mmdebstrap umoci skopeo rsync zstd flock
	if ! d=$(bash "$MKOCI" "$FERRY_FIXTURES" 2>"$LOG"); then
		notok "$E2E_NAME: build the OCI fixtures (tests/tools/mkoci.sh)"
		diag "$LOG" 40
		exit 1
	fi
	FIX=$d/debian
	FIXZ=$d/zstd
	echo "# OCI fixtures at $d (ready in $((SECONDS - t0)) s; $(cat "$d/.complete"))"
}

# The OCI platform of this machine, as ferry's --platform default.
host_platform() {
	case $(uname -m) in
	x86_64) echo linux/amd64 ;;
	aarch64) echo linux/arm64 ;;
	armv7l) echo linux/arm/v7 ;;
	*) echo "linux/$(uname -m)" ;;
	esac
}

# Reference tree of an OCI image: umoci unpack as root keeps owners,
# modes, xattrs and device nodes. Prints the rootfs path.
umoci_ref() { # LAYOUT:TAG BUNDLE
	umoci unpack --image "$1" "$2" >/dev/null && echo "$2/rootfs"
}

# The manifest digest that LAYOUT's index.json tags TAG.
tag_digest() { # LAYOUT TAG
	python3 - "$1" "$2" <<'EOF'
import json, sys
idx = json.load(open(sys.argv[1] + "/index.json"))
hits = [d["digest"] for d in idx["manifests"]
        if d.get("annotations", {}).get("org.opencontainers.image.ref.name") == sys.argv[2]]
print(hits[0] if len(hits) == 1 else "none(%d)" % len(hits))
EOF
}

# No name in the tree contains ".wh.".
no_whiteouts() { # DIR
	local hits
	hits=$(find "$1" -name '*.wh.*' | head -n 5)
	[ -z "$hits" ] && return 0
	echo "$hits" | sed 's/^/    whiteout visible: /'
	return 1
}

# A JSON list of entries on stdin describes the whole tree DIR must be
# (apart from the root): each {"path", "type": file|dir|symlink|fifo|char|
# block, "data", "link", "mode" (permission bits, decimal), "uid", "gid",
# "xattrs", "same_as": another path that must be the same inode}. Fields
# left out are not checked. Prints every difference.
tree_expect() { # DIR
	python3 -c '
import json, os, stat, sys
root, want = sys.argv[1], json.load(sys.stdin)
types = {"file": stat.S_ISREG, "dir": stat.S_ISDIR, "symlink": stat.S_ISLNK,
         "fifo": stat.S_ISFIFO, "char": stat.S_ISCHR, "block": stat.S_ISBLK}
bad = []
have = set()
for d, dirs, files in os.walk(root):
    for n in dirs + files:
        have.add(os.path.relpath(os.path.join(d, n), root))
names = set(e["path"] for e in want)
bad += ["unexpected entry %s" % p for p in sorted(have - names)]
bad += ["missing entry %s" % p for p in sorted(names - have)]
for e in want:
    p = os.path.join(root, e["path"])
    if e["path"] not in have:
        continue
    st = os.lstat(p)
    t = e.get("type", "file")
    if not types[t](st.st_mode):
        bad.append("%s: not a %s (mode 0%o)" % (e["path"], t, st.st_mode))
        continue
    if "data" in e and open(p, "rb").read() != e["data"].encode():
        bad.append("%s: content %r" % (e["path"], open(p, "rb").read()[:60]))
    if "link" in e and os.readlink(p) != e["link"]:
        bad.append("%s: target %r" % (e["path"], os.readlink(p)))
    for k, v in (("mode", stat.S_IMODE(st.st_mode)), ("uid", st.st_uid),
                 ("gid", st.st_gid)):
        if k in e and e[k] != v:
            bad.append("%s: %s %s, want %s" % (e["path"], k,
                       oct(v) if k == "mode" else v,
                       oct(e[k]) if k == "mode" else e[k]))
    if "xattrs" in e:
        got = {n: os.getxattr(p, n, follow_symlinks=False).decode()
               for n in os.listxattr(p, follow_symlinks=False)}
        if got != e["xattrs"]:
            bad.append("%s: xattrs %r" % (e["path"], got))
    if "same_as" in e:
        o = os.lstat(os.path.join(root, e["same_as"]))
        if (o.st_dev, o.st_ino) != (st.st_dev, st.st_ino):
            bad.append("%s: not a hardlink of %s" % (e["path"], e["same_as"]))
for b in bad:
    print("    " + b)
sys.exit(1 if bad else 0)
' "$1"
}

# check_fails DESC WANT_TEXT CMD...: CMD exits 1 (not a crash, not a usage
# error) and its output contains WANT_TEXT (fixed string, any case). Output
# in $LOG.
check_fails() {
	local desc=$1 want=$2 rc
	shift 2
	"$@" >"$LOG" 2>&1
	rc=$?
	if [ "$rc" -eq 1 ] && ! sanitizer_report "$LOG" && grep -qiF -- "$want" "$LOG"; then
		ok "$desc"
		return 0
	fi
	notok "$desc"
	echo "    command: $* (exit $rc, expected 1 and a message naming \"$want\")"
	diag "$LOG" 10
	return 1
}

# Checks a converted ferry image in an OCI layout against the contract:
# the tag's index.json entry, the manifest (the source's config, one
# application/vnd.oci.image.layer.ferry.blob.v1 layer per source layer
# that added chunks, in source order, with dev.ferry.blob.source-layer,
# dev.ferry.blob.uncompressed-size and the containerd snapshot label, the
# bootstrap last, the dev.ferry.* annotations of docs/FORMAT.md 1a; the
# config is the source's with one diff_id per layer), every referenced
# blob's size and
# sha256. With DIR_OUT (the same source converted to dir:) the bootstrap
# and the blob list must be the same as there. With --dict, data layers
# annotated dev.ferry.blob.chunk-dict may follow the written ones.
# SRC_MANIFEST is a file holding the source manifest (mklayer.py resolve).
oci_verify() { # [--dict] LAYOUT TAG SRC_MANIFEST [DIR_OUT]
	python3 - "$@" <<'EOF'
import hashlib, json, os, re, sys
args = sys.argv[1:]
dict_ok = args[0] == "--dict"
if dict_ok:
    args = args[1:]
layout, tag, srcm = args[:3]
dir_out = args[3] if len(args) > 3 else None
BLOB = "application/vnd.oci.image.layer.ferry.blob.v1"
BOOT = "application/vnd.oci.image.layer.ferry.bootstrap.v1.erofs+zstd"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
bad = []

def blob(desc, what):
    p = os.path.join(layout, "blobs", *desc["digest"].split(":", 1))
    try:
        data = open(p, "rb").read()
    except OSError as e:
        bad.append("%s %s: %s" % (what, desc["digest"], e))
        return None
    if len(data) != desc.get("size"):
        bad.append("%s %s: size %d, descriptor says %s" % (what, desc["digest"], len(data), desc.get("size")))
    if "sha256:" + hashlib.sha256(data).hexdigest() != desc["digest"]:
        bad.append("%s %s: content does not match the digest" % (what, desc["digest"]))
    return data

src = json.load(open(srcm))
src_layers = [l["digest"] for l in src["layers"]]
idx = json.load(open(os.path.join(layout, "index.json")))
hits = [d for d in idx.get("manifests", [])
        if d.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag]
if len(hits) != 1:
    print("    index.json: %d entries tagged %s" % (len(hits), tag))
    sys.exit(1)
d = hits[0]
if d.get("mediaType") != MANIFEST:
    bad.append("index.json entry mediaType %r" % d.get("mediaType"))
raw = blob(d, "manifest")
if raw is None:
    print("\n".join("    " + b for b in bad)); sys.exit(1)
m = json.loads(raw)
if m.get("schemaVersion") != 2:
    bad.append("schemaVersion %r" % m.get("schemaVersion"))
if m.get("mediaType", MANIFEST) != MANIFEST:
    bad.append("manifest mediaType %r" % m.get("mediaType"))
cfg = blob(m["config"], "config")
layers = m.get("layers", [])
if cfg is not None:
    # The source's config, but with one diff_id per manifest layer: the
    # sha256 of "dev.ferry.blob " + the data blob's digest, and of
    # "dev.ferry.bootstrap " + the raw bootstrap's.
    def ferry_id(prefix, d):
        return "sha256:" + hashlib.sha256((prefix + str(d)).encode()).hexdigest()
    cfg = json.loads(cfg)
    ids = cfg.get("rootfs", {}).pop("diff_ids", None)
    want_ids = [ferry_id("dev.ferry.blob ", l["digest"]) for l in layers[:-1]] + \
        [ferry_id("dev.ferry.bootstrap ", layers[-1].get("annotations", {}).get(
            "dev.ferry.bootstrap.uncompressed-digest"))] if layers else []
    if ids != want_ids:
        bad.append("config diff_ids %r, want %r" % (ids, want_ids))
    if "_config" in src:
        src["_config"].get("rootfs", {}).pop("diff_ids", None)
        if cfg != src["_config"]:
            bad.append("config differs from the source's beyond diff_ids")
if not layers or layers[-1].get("mediaType") != BOOT:
    bad.append("last layer is not a bootstrap: %r" % (layers[-1].get("mediaType") if layers else None))
data = layers[:-1]
boot = blob(layers[-1], "bootstrap") if layers else None
if boot is not None:
    # Stored as one zstd frame; the annotation names the raw bytes' digest.
    import subprocess
    boot = subprocess.run(["zstd", "-dc"], input=boot, capture_output=True, check=True).stdout
    want = layers[-1].get("annotations", {}).get("dev.ferry.bootstrap.uncompressed-digest")
    if want != "sha256:" + hashlib.sha256(boot).hexdigest():
        bad.append("bootstrap uncompressed-digest annotation %r does not match" % want)
last = -1
seen_dict = False
for l in data:
    if l.get("mediaType") != BLOB:
        bad.append("layer %s: mediaType %r" % (l["digest"], l.get("mediaType")))
    a = l.get("annotations", {})
    if a.get("containerd.io/snapshot/ferry.blob") != "true":
        bad.append("layer %s: no containerd.io/snapshot/ferry.blob label" % l["digest"])
    sl = a.get("dev.ferry.blob.source-layer")
    if dict_ok and a.get("dev.ferry.blob.chunk-dict") == "true" and sl is None:
        seen_dict = True
    elif sl in src_layers and not seen_dict:
        if src_layers.index(sl) <= last:
            bad.append("layer %s: source layer %s out of order or repeated" % (l["digest"], sl))
        last = src_layers.index(sl)
    else:
        bad.append("layer %s: annotations %r (after a chunk-dict blob: %s)" % (l["digest"], a, seen_dict))
    if not re.fullmatch(r"[0-9]+", a.get("dev.ferry.blob.uncompressed-size", "")):
        bad.append("layer %s: uncompressed-size annotation %r" % (l["digest"], a.get("dev.ferry.blob.uncompressed-size")))
    blob(l, "data blob")
ann = m.get("annotations", {})
if layers and (layers[-1].get("annotations", {}).get("dev.ferry.bootstrap") != "true" or
               layers[-1]["annotations"].get("containerd.io/snapshot/ferry.bootstrap") != "true"):
    bad.append("bootstrap annotations %r" % layers[-1].get("annotations"))
want = {"dev.ferry.version": "3", "dev.ferry.source-layers": ",".join(src_layers)}
if "_digest" in src:
    want["dev.ferry.source-manifest"] = src["_digest"]
for k, v in want.items():
    if ann.get(k) != v:
        bad.append("annotation %s = %r, want %r" % (k, ann.get(k), v))
for k in ("dev.ferry.chunk-size", "dev.ferry.compression"):
    if not ann.get(k):
        bad.append("annotation %s missing" % k)
if dir_out:
    j = json.load(open(os.path.join(dir_out, "ferry.json")))
    if boot is not None and boot != open(os.path.join(dir_out, "bootstrap"), "rb").read():
        bad.append("bootstrap differs from the dir: conversion's")
    got = [(l["digest"], l["size"], l.get("annotations", {}).get("dev.ferry.blob.uncompressed-size"),
            l.get("annotations", {}).get("dev.ferry.blob.source-layer")) for l in data]
    exp = [(b["digest"], b["size"], str(b["uncompressedSize"]), b.get("sourceLayer")) for b in j["blobs"]]
    if got != exp:
        bad.append("data layers %s differ from ferry.json blobs %s" % (got, exp))
    if ann.get("dev.ferry.chunk-size") != str(j["chunkSize"]):
        bad.append("chunk-size %r, ferry.json %r" % (ann.get("dev.ferry.chunk-size"), j["chunkSize"]))
    if ann.get("dev.ferry.compression") != j["compression"]:
        bad.append("compression %r, ferry.json %r" % (ann.get("dev.ferry.compression"), j["compression"]))
for b in bad:
    print("    " + b)
sys.exit(1 if bad else 0)
EOF
}

# Every file under LAYOUT/blobs is referenced from index.json (through
# indexes and manifests) and nothing referenced is missing.
oci_no_strays() { # LAYOUT
	python3 - "$1" <<'EOF'
import json, os, sys
L = sys.argv[1]
seen, todo = set(), list(json.load(open(L + "/index.json"))["manifests"])
while todo:
    d = todo.pop()
    if d["digest"] in seen:
        continue
    seen.add(d["digest"])
    if d["mediaType"].endswith("manifest.v1+json") or d["mediaType"].endswith("manifest.v2+json"):
        m = json.load(open(os.path.join(L, "blobs", *d["digest"].split(":"))))
        todo += [m["config"]] + m["layers"]
    elif d["mediaType"].endswith("index.v1+json"):
        todo += json.load(open(os.path.join(L, "blobs", *d["digest"].split(":"))))["manifests"]
files = set()
for alg in os.listdir(L + "/blobs"):
    files |= {alg + ":" + f for f in os.listdir(os.path.join(L, "blobs", alg))}
bad = ["stray file blobs/%s" % f.replace(":", "/") for f in sorted(files - seen)]
bad += ["missing blob %s" % f for f in sorted(seen - files)]
for b in bad[:20]:
    print("    " + b)
sys.exit(1 if bad else 0)
EOF
}

# A copy of LAYOUT at OUT whose tag "old" is the ferry image of TAG turned
# back into format 1 (docs/FORMAT.md 1a): the old layer types, no snapshot
# labels, version "1", and a config whose diff_ids are not one per layer;
# or into format 2 (VERSION 2): the current types and labels, version
# "2", the layers' own digests as diff_ids.
oci_downgrade() { # LAYOUT TAG OUT [VERSION]
	python3 - "$@" <<'EOF'
import hashlib, json, os, shutil, sys
src, tag, out = sys.argv[1:4]
version = sys.argv[4] if len(sys.argv) > 4 else "1"
def blob(l, d): return open(os.path.join(l, "blobs", *d.split(":")), "rb").read()
def put(data):
    d = "sha256:" + hashlib.sha256(data).hexdigest()
    open(os.path.join(out, "blobs", "sha256", d[7:]), "wb").write(data)
    return d
shutil.copytree(src, out)
idx = json.load(open(os.path.join(src, "index.json")))
desc = [d for d in idx["manifests"] if d["annotations"]["org.opencontainers.image.ref.name"] == tag][0]
m = json.loads(blob(src, desc["digest"]))
cfg = json.loads(blob(src, m["config"]["digest"]))
if version == "1":
    for l in m["layers"]:
        l["mediaType"] = l["mediaType"].replace("vnd.oci.image.layer.ferry.", "vnd.ferry.")
        for k in ("containerd.io/snapshot/ferry.blob", "containerd.io/snapshot/ferry.bootstrap"):
            l["annotations"].pop(k, None)
    cfg["rootfs"]["diff_ids"] = ["sha256:" + "0" * 64]  # the source's, not one per layer
else:
    cfg["rootfs"]["diff_ids"] = [l["digest"] for l in m["layers"][:-1]] + \
        [m["layers"][-1]["annotations"]["dev.ferry.bootstrap.uncompressed-digest"]]
m["annotations"]["dev.ferry.version"] = version
raw = json.dumps(cfg).encode()
m["config"].update(digest=put(raw), size=len(raw))
raw = json.dumps(m).encode()
idx["manifests"] = [{"mediaType": desc["mediaType"], "digest": put(raw), "size": len(raw),
                     "annotations": {"org.opencontainers.image.ref.name": "old"}}]
json.dump(idx, open(os.path.join(out, "index.json"), "w"))
EOF
}
