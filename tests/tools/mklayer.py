#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""mklayer: synthetic layer tars and hand-made OCI image layouts for tests.

  mklayer.py tar OUT.tar SPEC.json [--lower DIR] [--format pax|gnu|ustar]
                                    [--no-eof]
      Writes a tar from a JSON list of entries ("-" reads stdin). Names are
      written exactly as given (no normalisation, "/" is appended to
      directory names only when "dir_slash" is true), in list order. Entry
      fields:
        name      (required) the tar name, verbatim
        type      file (default) | dir | symlink | hardlink | fifo | char |
                  block | whiteout | opaque
                  whiteout: NAME is the path to delete, the entry written is
                  dirname(NAME)/.wh.basename(NAME); opaque: NAME is the
                  directory, the entry written is NAME/.wh..wh..opq
        data      file content (string, UTF-8)
        data_from path of a file under --lower whose content is used
        random    {"size": N, "seed": S}: N pseudo-random bytes from seed S
        repeat    {"size": N, "text": T}: T repeated to N bytes
        mode uid gid mtime   (defaults 0644/0755 dir, 0, 0, 1700000000)
        link      symlink / hardlink target, verbatim
        major minor          device numbers
        xattrs    {"user.x": "value"} as SCHILY.xattr PAX records
      --no-eof leaves out the two zero blocks (and the record padding) that
      end an archive.

  mklayer.py add-layer LAYOUT FROM_TAG TO_TAG LAYER.tar [--compress
                  none|gzip|zstd] [--media-type TYPE] [--docker]
                  [--platform OS/ARCH[/VARIANT]] [--created-by TEXT]
      Appends LAYER.tar (uncompressed) to image FROM_TAG of the OCI layout
      LAYOUT ("-" starts a new image: empty config for --platform, default
      linux/amd64; the layout is created when missing) and tags the result
      TO_TAG (an entry with that tag is replaced): writes the (compressed)
      layer blob, a new config (rootfs.diff_ids and history appended), a new
      manifest and index.json. --media-type overrides the layer's media type
      (to label one compression as another); --docker writes Docker schema 2
      media types. Prints the layer blob digest.

  mklayer.py index LAYOUT TAG SRC_TAG...
      Writes an image index whose manifests are those tagged SRC_TAG, each
      with the platform of its config, and tags it TAG in index.json.

  mklayer.py resolve LAYOUT TAG [--platform OS/ARCH[/VARIANT]]
      Prints the manifest of TAG as JSON (following an index to the
      manifest for --platform), with "_digest" set to its digest.

Output is deterministic: fixed timestamps, gzip without a name or mtime.
"""
import argparse
import gzip
import hashlib
import io
import json
import os
import random
import subprocess
import sys
import tarfile

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
DOCKER_LAYER = "application/vnd.docker.image.rootfs.diff.tar"
REF_NAME = "org.opencontainers.image.ref.name"
CREATED = "2024-01-01T00:00:00Z"
MTIME = 1700000000


def die(msg):
    print("mklayer: " + msg, file=sys.stderr)
    sys.exit(1)


# ---- tar -------------------------------------------------------------------

def entry_data(e, lower):
    if "data" in e:
        return e["data"].encode()
    if "data_from" in e:
        if not lower:
            die("%s: data_from needs --lower" % e["name"])
        with open(os.path.join(lower, e["data_from"].lstrip("/")), "rb") as f:
            return f.read()
    if "random" in e:
        return random.Random(e["random"]["seed"]).randbytes(e["random"]["size"])
    if "repeat" in e:
        t = e["repeat"]["text"].encode()
        n = e["repeat"]["size"]
        return (t * (n // len(t) + 1))[:n]
    return b""


TYPES = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE,
         "symlink": tarfile.SYMTYPE, "hardlink": tarfile.LNKTYPE,
         "fifo": tarfile.FIFOTYPE, "char": tarfile.CHRTYPE,
         "block": tarfile.BLKTYPE, "whiteout": tarfile.REGTYPE,
         "opaque": tarfile.REGTYPE}


class VerbatimInfo(tarfile.TarInfo):
    """A TarInfo whose directory names get no "/" appended."""

    def get_info(self):
        info = super().get_info()
        info["name"] = self.name
        return info


def make_tar(spec, lower, fmt, eof):
    formats = {"pax": tarfile.PAX_FORMAT, "gnu": tarfile.GNU_FORMAT,
               "ustar": tarfile.USTAR_FORMAT}
    buf = io.BytesIO()
    tf = tarfile.open(fileobj=buf, mode="w", format=formats[fmt])
    for e in spec:
        typ = e.get("type", "file")
        if typ not in TYPES:
            die("%s: unknown type %s" % (e["name"], typ))
        name = e["name"]
        if typ == "whiteout":
            d, b = os.path.split(name.rstrip("/"))
            name = (d + "/" if d else "") + ".wh." + b
        elif typ == "opaque":
            name = name.rstrip("/") + "/.wh..wh..opq"
        if typ == "dir" and e.get("dir_slash") and not name.endswith("/"):
            name += "/"
        ti = VerbatimInfo(name)
        ti.type = TYPES[typ]
        ti.mode = e.get("mode", 0o755 if typ == "dir" else 0o644)
        ti.uid, ti.gid = e.get("uid", 0), e.get("gid", 0)
        ti.uname = ti.gname = ""
        ti.mtime = e.get("mtime", MTIME)
        ti.linkname = e.get("link", "")
        ti.devmajor, ti.devminor = e.get("major", 0), e.get("minor", 0)
        if e.get("xattrs"):
            ti.pax_headers = {"SCHILY.xattr." + k: v
                              for k, v in e["xattrs"].items()}
        data = entry_data(e, lower) if ti.type == tarfile.REGTYPE else b""
        ti.size = len(data)
        tf.addfile(ti, io.BytesIO(data) if data else None)
    end = tf.offset
    tf.close()
    out = buf.getvalue()
    return out if eof else out[:end]


def cmd_tar(a):
    src = sys.stdin if a.spec == "-" else open(a.spec)
    spec = json.load(src)
    with open(a.out, "wb") as f:
        f.write(make_tar(spec, a.lower, a.format, not a.no_eof))


# ---- OCI layout ------------------------------------------------------------

def sha256(b):
    return "sha256:" + hashlib.sha256(b).hexdigest()


def blob_path(layout, digest):
    alg, hexd = digest.split(":", 1)
    return os.path.join(layout, "blobs", alg, hexd)


def read_blob(layout, digest):
    with open(blob_path(layout, digest), "rb") as f:
        data = f.read()
    if sha256(data) != digest:
        die("blob %s does not match its digest" % digest)
    return data


def write_blob(layout, data):
    digest = sha256(data)
    p = blob_path(layout, digest)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    if not os.path.exists(p):
        with open(p + ".tmp", "wb") as f:
            f.write(data)
        os.rename(p + ".tmp", p)
    return digest


def canon(obj):
    return json.dumps(obj, indent=2, sort_keys=True).encode() + b"\n"


def load_index(layout):
    p = os.path.join(layout, "index.json")
    if not os.path.exists(p):
        os.makedirs(os.path.join(layout, "blobs", "sha256"), exist_ok=True)
        with open(os.path.join(layout, "oci-layout"), "w") as f:
            json.dump({"imageLayoutVersion": "1.0.0"}, f)
        return {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": []}
    with open(p) as f:
        return json.load(f)


def save_index(layout, index):
    p = os.path.join(layout, "index.json")
    with open(p + ".tmp", "wb") as f:
        f.write(canon(index))
    os.rename(p + ".tmp", p)


def find_tag(index, tag):
    hits = [d for d in index["manifests"]
            if d.get("annotations", {}).get(REF_NAME) == tag]
    if len(hits) != 1:
        die("tag %s: %d entries in index.json" % (tag, len(hits)))
    return hits[0]


def set_tag(layout, tag, desc):
    index = load_index(layout)
    desc = dict(desc)
    desc["annotations"] = dict(desc.get("annotations", {}), **{REF_NAME: tag})
    index["manifests"] = [d for d in index["manifests"]
                          if d.get("annotations", {}).get(REF_NAME) != tag]
    index["manifests"].append(desc)
    save_index(layout, index)


def parse_platform(s):
    parts = s.split("/")
    if len(parts) not in (2, 3):
        die("bad platform %s" % s)
    p = {"os": parts[0], "architecture": parts[1]}
    if len(parts) == 3:
        p["variant"] = parts[2]
    return p


def resolve(layout, tag, platform=None):
    """Manifest descriptor and manifest of TAG (through an index)."""
    desc = find_tag(load_index(layout), tag)
    while desc["mediaType"] == OCI_INDEX:
        idx = json.loads(read_blob(layout, desc["digest"]))
        want = parse_platform(platform or "linux/amd64")
        hits = [d for d in idx["manifests"]
                if all(d.get("platform", {}).get(k) == v
                       for k, v in want.items())]
        if not hits:
            die("%s: no manifest for %s" % (tag, want))
        desc = hits[0]
    return desc, json.loads(read_blob(layout, desc["digest"]))


def compress(data, how):
    if how == "none":
        return data, ""
    if how == "gzip":
        return gzip.compress(data, compresslevel=6, mtime=0), "+gzip"
    if how == "zstd":
        z = subprocess.run(["zstd", "-q", "-3", "-c"], input=data,
                           stdout=subprocess.PIPE, check=True).stdout
        return z, "+zstd"
    die("unknown compression " + how)


def cmd_add_layer(a):
    layout = a.layout
    if a.from_tag == "-":
        config = dict(parse_platform(a.platform or "linux/amd64"),
                      created=CREATED, config={},
                      rootfs={"type": "layers", "diff_ids": []}, history=[])
        manifest = {"schemaVersion": 2, "layers": []}
        load_index(layout)
    else:
        _, manifest = resolve(layout, a.from_tag)
        config = json.loads(read_blob(layout, manifest["config"]["digest"]))
    with open(a.layer, "rb") as f:
        tar = f.read()
    blob, suffix = compress(tar, a.compress)
    if a.docker:
        mtype = DOCKER_LAYER + (".gzip" if suffix == "+gzip" else "")
        if suffix == "+zstd":
            mtype = DOCKER_LAYER + ".zstd"
    else:
        mtype = OCI_LAYER + suffix
    layer = {"mediaType": a.media_type or mtype,
             "digest": write_blob(layout, blob), "size": len(blob)}
    config["rootfs"]["diff_ids"].append(sha256(tar))
    config.setdefault("history", []).append(
        {"created": CREATED, "created_by": a.created_by or "mklayer"})
    cfg = canon(config)
    manifest = dict(manifest)
    manifest["mediaType"] = DOCKER_MANIFEST if a.docker else OCI_MANIFEST
    manifest["config"] = {"mediaType": DOCKER_CONFIG if a.docker else OCI_CONFIG,
                          "digest": write_blob(layout, cfg), "size": len(cfg)}
    manifest["layers"] = manifest["layers"] + [layer]
    m = canon(manifest)
    set_tag(layout, a.to_tag, {"mediaType": manifest["mediaType"],
                               "digest": write_blob(layout, m), "size": len(m)})
    print(layer["digest"])


def cmd_index(a):
    index = load_index(a.layout)
    manifests = []
    for t in a.src_tags:
        desc = find_tag(index, t)
        if desc["mediaType"] == OCI_INDEX:
            die("%s is an index" % t)
        m = json.loads(read_blob(a.layout, desc["digest"]))
        cfg = json.loads(read_blob(a.layout, m["config"]["digest"]))
        plat = {"os": cfg["os"], "architecture": cfg["architecture"]}
        if cfg.get("variant"):
            plat["variant"] = cfg["variant"]
        manifests.append({"mediaType": desc["mediaType"],
                          "digest": desc["digest"], "size": desc["size"],
                          "platform": plat})
    b = canon({"schemaVersion": 2, "mediaType": OCI_INDEX,
               "manifests": manifests})
    set_tag(a.layout, a.tag, {"mediaType": OCI_INDEX,
                              "digest": write_blob(a.layout, b), "size": len(b)})


def cmd_resolve(a):
    desc, m = resolve(a.layout, a.tag, a.platform)
    m["_digest"] = desc["digest"]
    m["_config"] = json.loads(read_blob(a.layout, m["config"]["digest"]))
    json.dump(m, sys.stdout, indent=2)
    print()


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("tar")
    p.add_argument("out")
    p.add_argument("spec")
    p.add_argument("--lower")
    p.add_argument("--format", default="pax", choices=("pax", "gnu", "ustar"))
    p.add_argument("--no-eof", action="store_true")
    p.set_defaults(fn=cmd_tar)
    p = sub.add_parser("add-layer")
    p.add_argument("layout")
    p.add_argument("from_tag")
    p.add_argument("to_tag")
    p.add_argument("layer")
    p.add_argument("--compress", default="gzip", choices=("none", "gzip", "zstd"))
    p.add_argument("--media-type")
    p.add_argument("--docker", action="store_true")
    p.add_argument("--platform")
    p.add_argument("--created-by")
    p.set_defaults(fn=cmd_add_layer)
    p = sub.add_parser("index")
    p.add_argument("layout")
    p.add_argument("tag")
    p.add_argument("src_tags", nargs="+")
    p.set_defaults(fn=cmd_index)
    p = sub.add_parser("resolve")
    p.add_argument("layout")
    p.add_argument("tag")
    p.add_argument("--platform")
    p.set_defaults(fn=cmd_resolve)
    a = ap.parse_args()
    a.fn(a)


if __name__ == "__main__":
    main()
