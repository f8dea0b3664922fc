#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# oci: reproducibility and deduplication. Converting the same image twice
# and with --jobs 1, 2, 4 gives the same manifest (so the same bootstrap
# and blob bytes). Images sharing a base layer share its blob in one
# layout. With --chunk-dict, only chunks missing from the dictionary image
# are stored, the dictionary's blobs become devices (copied into an oci:
# destination), and the result still mounts as umoci unpacks the image.
. "$(dirname "$0")/../lib/common.sh"
. "$(dirname "$0")/../lib/oci.sh"
need_root
need_ferry
oci_fixtures
dmesg_mark

# The dev.ferry.blob.v1 layers of TAG: "digest size chunks" per line (the
# chunk count from the blob footer, docs/FORMAT.md 3.3).
data_layers() { # LAYOUT TAG
	python3 - "$1" "$(tag_digest "$1" "$2")" <<'EOF'
import json, os, struct, sys
L = sys.argv[1]
m = json.load(open(os.path.join(L, "blobs", *sys.argv[2].split(":"))))
for l in m["layers"]:
    if l["mediaType"] == "application/vnd.oci.image.layer.ferry.blob.v1":
        with open(os.path.join(L, "blobs", *l["digest"].split(":")), "rb") as f:
            f.seek(-64, 2)
            foot = f.read(64)
        print(l["digest"], l["size"], struct.unpack_from("<I", foot, 12)[0])
EOF
}

# Reproducibility: 3 layers, the same manifest digest every time.
for j in 1 2 4 2; do
	L=$SCRATCH/jobs$j
	[ -d "$L" ] && L=$SCRATCH/jobs${j}again
	check "convert edit --jobs $j" "$FERRY" convert --jobs "$j" "oci:$FIX:edit" "oci:$L:edit" -q
done
d1=$(tag_digest "$SCRATCH/jobs1" edit)
for L in jobs2 jobs4 jobs2again; do
	check "--jobs 1 and $L give the same manifest digest" \
		test "$d1" = "$(tag_digest "$SCRATCH/$L" edit)" ||
		echo "    jobs1 $d1, $L $(tag_digest "$SCRATCH/$L" edit)"
done
check "--jobs 1 and 4 write the same blob files" \
	diff <(cd "$SCRATCH/jobs1/blobs/sha256" && sha256sum -- *) \
	<(cd "$SCRATCH/jobs4/blobs/sha256" && sha256sum -- *)
rm -rf "$SCRATCH"/jobs*

# Two images in one layout: the shared base layer is one blob.
OUT=$SCRATCH/layout
"${MKLAYER[@]}" resolve "$FIX" pkgs >"$SCRATCH/src-pkgs.json"
check "convert base into a layout" "$FERRY" convert "oci:$FIX:base" "oci:$OUT:a" -q
check "convert pkgs into the same layout" "$FERRY" convert "oci:$FIX:pkgs" "oci:$OUT:b" -q
data_layers "$OUT" a >"$SCRATCH/a.layers"
data_layers "$OUT" b >"$SCRATCH/b.layers"
check "pkgs' base-layer blob is base's blob" \
	test "$(cut -d' ' -f1 "$SCRATCH/a.layers")" = "$(head -n 1 "$SCRATCH/b.layers" | cut -d' ' -f1)"
check "two data blobs for pkgs, one for base" \
	test "$(wc -l <"$SCRATCH/a.layers")/$(wc -l <"$SCRATCH/b.layers")" = 1/2
check "no stray or missing blobs in the shared layout" oci_no_strays "$OUT"

# --chunk-dict oci:: only pkgs' new chunks are stored.
D=$SCRATCH/dict-layout
if check "convert pkgs --chunk-dict oci:(base) --json" \
	sh -c '"$0" convert --chunk-dict "oci:$1:a" "oci:$2:pkgs" "oci:$3:b" --json >"$4"' \
	"$FERRY" "$OUT" "$FIX" "$D" "$SCRATCH/dict.json"; then
	check "chunk-dict image: manifest and annotations" \
		oci_verify --dict "$D" b "$SCRATCH/src-pkgs.json"
	check "chunk-dict image: no stray or missing blobs (dictionary blobs copied)" \
		oci_no_strays "$D"
	data_layers "$D" b >"$SCRATCH/d.layers"
	check "chunk-dict image: the --json summary, new blobs and chunk counts" \
		python3 - "$SCRATCH/dict.json" "$SCRATCH/a.layers" "$SCRATCH/b.layers" "$SCRATCH/d.layers" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
rows = lambda f: [(l.split()[0], int(l.split()[1]), int(l.split()[2])) for l in open(f)]
a, b, d = rows(sys.argv[2]), rows(sys.argv[3]), rows(sys.argv[4])
bad = []
types = {"entries": int, "bytesIn": int, "bytesUnique": int, "chunksUnique": int,
         "dedupRatio": (int, float), "blobs": list, "bootstrapSize": int,
         "seconds": (int, float)}
for k, t in types.items():
    if not isinstance(j.get(k), t):
        bad.append("--json %s = %r" % (k, j.get(k)))
for bl in j.get("blobs", []) if isinstance(j.get("blobs"), list) else []:
    for k in ("digest", "size", "uncompressedSize", "chunks"):
        if k not in bl:
            bad.append("--json blobs[]: no %s in %r" % (k, bl))
a_digests = {r[0] for r in a}
new = [r for r in d if r[0] not in a_digests]
if not a_digests <= {r[0] for r in d}:
    bad.append("the dictionary's blob is not a device of the new image: %s" % [r[0] for r in d])
if len(new) != 1:
    bad.append("%d new data blobs, want 1 (for the new layer): %s" % (len(new), new))
# Without the dictionary, pkgs' second blob holds exactly the chunks that
# its new layer adds to base.
want = b[1][2]
if j.get("chunksUnique") != want:
    bad.append("chunksUnique %r, want %d (the new layer's unique chunks)" % (j.get("chunksUnique"), want))
if sum(r[2] for r in new) != want:
    bad.append("new blobs hold %d chunks, want %d" % (sum(r[2] for r in new), want))
if sum(r[1] for r in new) >= sum(r[1] for r in b):
    bad.append("new blob bytes %d not below pkgs alone %d" % (sum(r[1] for r in new), sum(r[1] for r in b)))
print("    stored %d bytes in %d chunks; pkgs alone: %d bytes" %
      (sum(r[1] for r in new), sum(r[2] for r in new), sum(r[1] for r in b)))
for x in bad:
    print("    " + x)
sys.exit(1 if bad else 0)
EOF
	check "ferry check (chunk-dict image)" "$FERRY" check "oci:$D:b"
	if ref=$(umoci_ref "$FIX:pkgs" "$SCRATCH/bundle" 2>"$LOG"); then
		if check "ferry mount --mode local (chunk-dict image)" \
			mount_local "oci:$D:b" "$SCRATCH/mnt"; then
			check "treecmp umoci unpack == mount (chunk-dict image)" \
				python3 "$TREECMP" "$ref" "$SCRATCH/mnt"
			check "ferry umount (chunk-dict image)" umount_local "$SCRATCH/mnt"
		fi
	else
		notok "umoci unpack pkgs (reference)"
		diag "$LOG"
	fi
	rm -rf "$SCRATCH/bundle"
fi

# A dictionary holding every chunk: nothing new is stored.
if check "convert pkgs --chunk-dict oci:(pkgs itself)" \
	sh -c '"$0" convert --chunk-dict "oci:$1:b" "oci:$2:pkgs" "oci:$3:b" --json >"$4"' \
	"$FERRY" "$OUT" "$FIX" "$SCRATCH/self" "$SCRATCH/self.json"; then
	check "a dictionary with every chunk: chunksUnique 0, only its blobs" \
		python3 - "$SCRATCH/self.json" <(data_layers "$OUT" b) <(data_layers "$SCRATCH/self" b) <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
b = sorted(l.split()[0] for l in open(sys.argv[2]))
s = sorted(l.split()[0] for l in open(sys.argv[3]))
bad = []
if j.get("chunksUnique") != 0:
    bad.append("chunksUnique %r" % j.get("chunksUnique"))
if s != b:
    bad.append("data blobs %s, want the dictionary's %s" % (s, b))
for x in bad:
    print("    " + x)
sys.exit(1 if bad else 0)
EOF
	check "ferry check (self-dictionary image)" "$FERRY" check "oci:$SCRATCH/self:b"
fi
rm -rf "$SCRATCH/self"

# --chunk-dict dir: into dir:.
if check "convert base to dir:" "$FERRY" convert "oci:$FIX:base" "dir:$SCRATCH/dir-a" -q &&
	check "convert pkgs --chunk-dict dir:(base) to dir:" "$FERRY" convert \
		--chunk-dict "dir:$SCRATCH/dir-a" "oci:$FIX:pkgs" "dir:$SCRATCH/dir-b" -q; then
	check "dir: chunk-dict: the dictionary's blob and one new blob" python3 -c '
import json, sys
a = [b["digest"] for b in json.load(open(sys.argv[1]))["blobs"]]
b = [b["digest"] for b in json.load(open(sys.argv[2]))["blobs"]]
ok = set(a) <= set(b) and len(set(b) - set(a)) == 1
ok or print("    dictionary %s, image %s" % (a, b))
sys.exit(0 if ok else 1)' "$SCRATCH/dir-a/ferry.json" "$SCRATCH/dir-b/ferry.json"
	check "ferry check (dir: chunk-dict image)" "$FERRY" check "dir:$SCRATCH/dir-b"
	[ -d "$D" ] && check "dir: and oci: chunk-dict conversions give the same bootstrap" \
		cmp "$SCRATCH/dir-b/bootstrap" <(python3 - "$D" "$(tag_digest "$D" b)" <<'EOF' | zstd -dc
import json, os, sys
m = json.load(open(os.path.join(sys.argv[1], "blobs", *sys.argv[2].split(":"))))
sys.stdout.buffer.write(open(os.path.join(sys.argv[1], "blobs", *m["layers"][-1]["digest"].split(":")), "rb").read())
EOF
)
fi

check_kernel_log
e2e_done
