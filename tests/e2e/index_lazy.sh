#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# shellcheck disable=SC2016 # expect_sh evaluates its quoted condition
# ferry index (issue 45): lazy mounts of ordinary gzip images, unconverted,
# through a ferry index attached to them (docs/FORMAT.md 1e, 2.8, 3.5):
#   - oci: the Debian fixture "edit" (three gzip layers: whiteouts, opaque
#     directories, hardlinks across layers, devices, xattrs): the index is
#     an untagged index.json entry, the image's tag and manifest stay;
#     ferry check verifies every range of the layers; FUSE, fanotify and
#     local mounts equal umoci's unpack; indexing again replaces the index;
#   - refused with a reason: mounting an image without an index, indexing
#     a layer of one zstd frame, mounting through an index whose diff_ids
#     are not the image config's (the same ones in another order);
#   - a byte flipped in a layer blob after indexing: the files it touches
#     fail with EIO, none reads wrong bytes, the others read right; ferry
#     check and a local mount (which fails) name the layer;
#   - docker://, through the counting proxy: ferry index uploads the index
#     alone (no layer), listed under the referrers tag sha256-<hex> as
#     docker-registry 2.8 has no referrers API; with the proxy acting as a
#     registry that has the API, the index is found through it and no tag
#     is written; both mount lazily and equal umoci's unpack; reading a
#     4.5 MB file of five chunks takes at most 2 requests to its layer
#     (fetch-ahead queues it whole as one fetch, not one per MiB).
E2E_TIMEOUT=${E2E_TIMEOUT:-900}
. "$(dirname "$0")/../lib/common.sh"
. "$(dirname "$0")/../lib/oci.sh"
. "$(dirname "$0")/../lib/registry.sh"
. "$(dirname "$0")/../lib/lazy.sh"

need_ferryd
need_cmds docker-registry skopeo umoci findmnt
oci_fixtures
L=$SCRATCH/layout
# A copy to attach indexes to (blobs hardlinked: ferry replaces, never edits).
check "copy the fixture layout" cp -al "$FIX" "$L" || e2e_done
if ! ref=$(umoci_ref "$FIX:edit" "$SCRATCH/bundle" 2>"$LOG"); then
	notok "umoci unpack (reference tree)"
	diag "$LOG"
	e2e_done
fi
edit=$(tag_digest "$L" edit)

# --- oci: -----------------------------------------------------------------------
check "ferry index oci:edit" "$FERRY" index -q "oci:$L:edit" || e2e_done
expect_sh "the image's tag still names the same manifest ($edit)" \
	'[ "$(tag_digest "$L" edit)" = "$edit" ]'
# The untagged index entries and the subjects their manifests name.
index_entries() { # LAYOUT
	python3 - "$1" <<'EOF'
import json, sys
lay = sys.argv[1]
for d in json.load(open(lay + "/index.json"))["manifests"]:
    if d.get("artifactType") != "application/vnd.ferry.index.v1":
        continue
    m = json.load(open(lay + "/blobs/sha256/" + d["digest"][7:]))
    assert "annotations" not in d or "org.opencontainers.image.ref.name" not in d["annotations"]
    assert m["artifactType"] == d["artifactType"]
    assert [l["mediaType"] for l in m["layers"]] == ["application/vnd.ferry.index.bootstrap.v1.erofs+zstd"]
    print(m["subject"]["digest"])
EOF
}
expect_sh "index.json lists one index, untagged, whose subject is the image" \
	'[ "$(index_entries "$L")" = "$edit" ]'
check "ferry check verifies the index and every range of the layers" \
	"$FERRY" check "oci:$L:edit"
check "ferry inspect shows the layers as devices, read in place" \
	bash -c '"$0" inspect --json "oci:$1:edit" | grep -q "\"compression\":\"layers\""' "$FERRY" "$L"
expect_sh "the resume points are a required section (FERRYRP1 v1, flags 1) that ferry reads" \
	'"$FERRY" inspect --json "oci:$L:edit" | python3 -c "import json, sys
s = [x for x in json.load(sys.stdin)[\"sections\"] if x[\"magic\"] == \"FERRYRP1\"]
assert len(s) == 1 and s[0][\"version\"] == 1 and s[0][\"flags\"] == 1 and s[0][\"known\"]"'
check "ferry index again: the new index replaces the first" "$FERRY" index -q "oci:$L:edit"
expect_sh "still one index entry for the image" '[ "$(index_entries "$L")" = "$edit" ]'

for mode in fuse fanotify local; do
	lazy_use "$mode"
	M=$SCRATCH/m-$mode
	if check "mount --mode $mode oci:edit (indexed, fresh cache)" \
		mount_lazy "$mode" "oci:$L:edit" "$M"; then
		check "treecmp umoci unpack == $mode mount through the index" \
			timeout 300 python3 "$TREECMP" "$ref" "$M"
		check "ferry umount ($mode)" umount_lazy "$M"
	fi
done
check "ferry cache verify: every present chunk matches its sha256" \
	"$FERRY" cache verify --cache-dir "$FCACHE"

lazy_use refused
check_fails "an image without an index: the mount says so" "no ferry index is attached" \
	mount_lazy fuse "oci:$L:base" "$SCRATCH/m-none"
check_fails "a zstd layer of one frame: ferry index refuses it" "convert the image instead" \
	"$FERRY" index -q "oci:$FIXZ:pkgs"
# An index recording the image's diff_ids in another order (rewritten in
# a copy of the layout; index.json replaced, not edited: it is hardlinked).
S=$SCRATCH/swapped
swap_diff_ids() {
	cp -al "$L" "$S" && python3 - "$S" "$edit" <<'EOF'
import hashlib, json, os, sys
lay, subject = sys.argv[1:]
def blob(d): return os.path.join(lay, "blobs", *d.split(":"))
idx = json.load(open(os.path.join(lay, "index.json")))
for e in idx["manifests"]:
    if e.get("artifactType") != "application/vnd.ferry.index.v1":
        continue
    m = json.load(open(blob(e["digest"])))
    if m["subject"]["digest"] != subject:
        continue
    ids = m["annotations"]["dev.ferry.index.diff-ids"].split(",")
    m["annotations"]["dev.ferry.index.diff-ids"] = ",".join(reversed(ids))
    raw = json.dumps(m).encode()
    e["digest"], e["size"] = "sha256:" + hashlib.sha256(raw).hexdigest(), len(raw)
    open(blob(e["digest"]), "wb").write(raw)
tmp = os.path.join(lay, "index.json.tmp")
json.dump(idx, open(tmp, "w"))
os.replace(tmp, os.path.join(lay, "index.json"))
EOF
}
check "an index with the diff_ids in another order" swap_diff_ids
check_fails "... is refused by the mount, saying so" "not its config's rootfs.diff_ids" \
	mount_lazy fuse "oci:$S:edit" "$SCRATCH/m-swapped"

# --- a flipped byte in a layer ---------------------------------------------------
D=$SCRATCH/damaged
{ cp -al "$FIX" "$D" && "$FERRY" index -q "oci:$D:edit"; } || e2e_done
top=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["layers"][-1]["digest"][7:])' \
	"$D/blobs/sha256/${edit#sha256:}")
blob=$D/blobs/sha256/$top
cp "$blob" "$blob.tmp" && mv "$blob.tmp" "$blob" # its own copy, not the fixture's
python3 -c '
import os, sys
p = sys.argv[1]
with open(p, "r+b") as f:
    at = os.path.getsize(p) // 2
    f.seek(at); b = f.read(1); f.seek(at); f.write(bytes([b[0] ^ 0x5a]))' "$blob"
check_fails "ferry check of the damaged layer names it" "$top" "$FERRY" check "oci:$D:edit"
hashtree "$ref" sorted 0 >"$SCRATCH/ref.sums"
for mode in fuse fanotify; do
	lazy_use "damaged-$mode"
	M=$SCRATCH/m-damaged-$mode
	check "mount --mode $mode of the damaged image" mount_lazy "$mode" "oci:$D:edit" "$M" || continue
	out=$(damaged_counts "$M" "$SCRATCH/ref.sums")
	read -r eio wrong other good <<<"$out"
	echo "# $mode, damaged layer: $eio files EIO, $wrong wrong, $other other errors, $good right"
	expect_sh "$mode: no file reads wrong bytes ($wrong), some fail with EIO ($eio), the rest read right ($good)" \
		'[ "$wrong" -eq 0 ] && [ "$other" -eq 0 ] && [ "$eio" -ge 1 ] && [ "$good" -gt 1000 ]'
	check "ferry umount (damaged, $mode)" umount_lazy "$M"
done
# local fetches every chunk first: one that does not verify fails the mount.
lazy_use damaged-local
check_fails "mount --mode local of the damaged image fails, naming the layer" "$top" \
	mount_lazy local "oci:$D:edit" "$SCRATCH/m-damaged-local"

# --- docker:// ---------------------------------------------------------------------
if ! reg_start anon 2>"$LOG" || ! fp_start 2>>"$LOG"; then
	notok "start docker-registry and the counting proxy"
	diag "$LOG"
	e2e_done
fi
check "skopeo copy oci:edit -> the registry" skopeo copy -q --dest-tls-verify=false \
	"oci:$FIX:edit" "docker://$REG/src/idx:edit" || e2e_done
# Requests since fp_mark that upload blob bytes or manifests: "METHOD PATH".
uploads() {
	python3 - "$FP_LOG" "$FP_MARK" <<'EOF'
import json, sys
for n, line in enumerate(open(sys.argv[1])):
    e = json.loads(line)
    if n >= int(sys.argv[2]) and e["method"] in ("POST", "PUT", "PATCH"):
        print(e["method"], e["path"].split("?")[0])
EOF
}
layer_digests() { skopeo inspect --raw --tls-verify=false "$1" |
	python3 -c 'import json,sys; print("\n".join(l["digest"] for l in json.load(sys.stdin)["layers"]))'; }
fp_mark
check "ferry index docker:// (registry without a referrers API)" \
	"$FERRY" index -q "docker://$PROXY/src/idx:edit"
uploads >"$SCRATCH/uploads.txt"
layer_digests "docker://$REG/src/idx:edit" >"$SCRATCH/layers.txt"
expect_sh "no layer was uploaded: two small blobs, the index manifest and the referrers tag" \
	'! grep -qFf "$SCRATCH/layers.txt" "$SCRATCH/uploads.txt" &&
	 [ "$(grep -c "^PUT .*/manifests/" "$SCRATCH/uploads.txt")" -eq 2 ] &&
	 grep -q "^PUT .*/manifests/sha256-${edit#sha256:}$" "$SCRATCH/uploads.txt"'
# The bootstrap an index names (its uncompressed digest), from the layout
# and from the registry's referrers tag.
boot_layout() {
	python3 - "$L" <<'EOF'
import json, sys
lay = sys.argv[1]
for d in json.load(open(lay + "/index.json"))["manifests"]:
    if d.get("artifactType") == "application/vnd.ferry.index.v1":
        m = json.load(open(lay + "/blobs/sha256/" + d["digest"][7:]))
        print(m["layers"][0]["annotations"]["dev.ferry.bootstrap.uncompressed-digest"])
EOF
}
boot_registry() { # REPO
	local d
	d=$(curl -sf -H "Accept: application/vnd.oci.image.index.v1+json" \
		"http://$REG/v2/$1/manifests/sha256-${edit#sha256:}" |
		python3 -c 'import json,sys; print(json.load(sys.stdin)["manifests"][-1]["digest"])') &&
		curl -sf -H "Accept: application/vnd.oci.image.manifest.v1+json" \
			"http://$REG/v2/$1/manifests/$d" |
		python3 -c 'import json,sys; print(json.load(sys.stdin)["layers"][0]["annotations"]["dev.ferry.bootstrap.uncompressed-digest"])'
}
expect_sh "the same index from the registry's stream as from the layout's file (deterministic)" \
	'[ -n "$(boot_layout)" ] && [ "$(boot_registry src/idx)" = "$(boot_layout)" ]'
lazy_use remote
M=$SCRATCH/m-remote
# GET requests since fp_mark for blob DIGEST (sha256:...).
layer_gets() { # DIGEST
	python3 - "$FP_LOG" "$FP_MARK" "$1" <<'EOF'
import json, sys
n = 0
for i, line in enumerate(open(sys.argv[1])):
    e = json.loads(line)
    if i >= int(sys.argv[2]) and e["method"] == "GET" and e["path"].endswith("/blobs/" + sys.argv[3]):
        n += 1
print(n)
EOF
}
big=usr/lib/x86_64-linux-gnu/perl/5.36.0/CORE/charclass_invlists.h
base_layer=$(sed -n 1p "$SCRATCH/layers.txt")
if check "mount --mode fuse docker://…:edit through the referrers tag" \
	mount_lazy fuse "docker://$PROXY/src/idx:edit" "$M"; then
	# A file of five 1 MiB chunks, not a program (no ELF prediction):
	# fetch-ahead queues it whole as one job that decodes on from one
	# resume point (AHEAD_STREAM_STEP); a job per MiB fetched each from
	# the point before it (5 requests, layer bytes fetched twice).
	fp_mark
	check "read $big (4.5 MB) through the index" cmp "$M/$big" "$ref/$big"
	sleep 1 # fetch-ahead's requests are logged as they end
	gets=$(layer_gets "$base_layer")
	expect_sh "the file took at most 2 requests to its layer (the reader's miss, one fetch-ahead): $gets" \
		'[ "$gets" -ge 1 ] && [ "$gets" -le 2 ]'
	check "treecmp umoci unpack == lazy mount of the registry image" \
		timeout 300 python3 "$TREECMP" "$ref" "$M"
	check "ferry umount (remote)" umount_lazy "$M"
fi

# The proxy as a registry with the referrers API: no tag is written.
check "skopeo copy oci:edit -> another repository" skopeo copy -q --dest-tls-verify=false \
	"oci:$FIX:edit" "docker://$REG/src/api:edit"
curl -sf "http://$PROXY/__referrers?on=1" >/dev/null
fp_mark
check "ferry index docker:// (registry with the referrers API)" \
	"$FERRY" index -q "docker://$PROXY/src/api:edit"
uploads >"$SCRATCH/uploads.txt"
expect_sh "with the API, only the index manifest is put (no referrers tag)" \
	'[ "$(grep -c "^PUT .*/manifests/" "$SCRATCH/uploads.txt")" -eq 1 ] &&
	 ! grep -q "/manifests/sha256-" "$SCRATCH/uploads.txt"'
lazy_use api
M=$SCRATCH/m-api
if check "mount --mode fanotify docker://…:edit found through the referrers API" \
	mount_lazy fanotify "docker://$PROXY/src/api:edit" "$M"; then
	check "treecmp umoci unpack == lazy mount found through the API" \
		timeout 300 python3 "$TREECMP" "$ref" "$M"
	check "ferry umount (api)" umount_lazy "$M"
fi
e2e_done
