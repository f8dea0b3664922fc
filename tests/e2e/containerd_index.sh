#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# containerd and indexed images (docs/containerd.md, "Indexed images"):
# containerd 1.6 from a scratch config with ferry-snapshotter (FUSE mode)
# and a ferryd. The two-layer Debian fixture (pkgs), pushed as is with
# skopeo to three repositories of the loopback registry:
#   - plain/deb: no index; a CRI pull unpacks it as usual (full layer GETs,
#     no ferry mount) and it runs;
#   - bad/deb: a ferry index whose recorded diff_ids are not the image's
#     (the two swapped): refused, with the reason in the snapshotter's log,
#     and the image unpacked as usual;
#   - deb: `ferry index` attaches one; pulled with the CRI labels
#     (tests/tools/cripull) the registry sees no full GET of a layer blob
#     (only ranged reads) before and while `ctr run` reads files of both
#     layers (hashes as umoci unpacks them); ctr-remote rpull into a second
#     namespace the same; with the registry down, ferryd and the
#     snapshotter restart and the container runs again from the cache,
#     without resolving the tag; `ctr image rm --sync` leaves no mount.
# The images are pulled one after the other (removed in between): they
# share their chain IDs. Every process is stopped by PID.
. "$(dirname "$0")/../lib/common.sh"
. "$(dirname "$0")/../lib/oci.sh"
. "$(dirname "$0")/../lib/registry.sh"
. "$(dirname "$0")/../lib/lazy.sh"
. "$(dirname "$0")/../lib/containerd.sh"
need_ferryd
need_cmds containerd ctr runc ctr-remote go skopeo
oci_fixtures
lazy_use ctdi

GO=$TOP/contrib/containerd/go.sh
SNAP=$SCRATCH/ferry-snapshotter
CRIPULL=$SCRATCH/cripull
CTD=$SCRATCH/ctd
NS=ferry-index-$$     # CRI's labels (cripull)
NSR=ferry-index-r-$$  # ctr-remote image rpull
SNROOT=$CTD/snapshotter
CTD_NAMESPACES=("$NS" "$NSR")
mkdir -p "$CTD"

ctd_e2e_begin

reg_start anon || { notok "docker-registry"; e2e_done; exit 1; }
fp_start || { notok "faultproxy"; e2e_done; exit 1; }
for repo in deb plain/deb bad/deb; do
	check "push the gzip Debian image to $repo" reg_push_oci "$FIX:pkgs" "$REG/$repo:1"
done
check "ferry index attaches an index to deb" "$FERRY" index -q "docker://$REG/deb:1"
check "ferry index attaches an index to bad/deb" "$FERRY" index -q "docker://$REG/bad/deb:1"
MANIFEST=$(skopeo inspect --raw --tls-verify=false "docker://$REG/deb:1" | sha256sum | cut -d' ' -f1)
# The layers, "DIGEST SIZE" a line (fp_data_bytes counts their bytes).
skopeo inspect --raw --tls-verify=false "docker://$REG/deb:1" |
	python3 -c 'import json,sys; [print(l["digest"], l["size"]) for l in json.load(sys.stdin)["layers"]]' \
	>"$SCRATCH/blobs.txt"
LAYERS=$(cut -d' ' -f1 "$SCRATCH/blobs.txt")
LAYER_BYTES=$(awk '{ n += $2 } END { print n }' "$SCRATCH/blobs.txt")
expect "the image has two layers" [ "$(wc -w <<<"$LAYERS")" -eq 2 ]

# bad/deb's index, its diff_ids swapped, pushed by digest and put in the
# referrers tag in place of the right one.
swap_diff_ids() { # REPO
	python3 - "$REG" "$1" "sha256-$MANIFEST" <<'EOF'
import hashlib, json, sys, urllib.request
reg, repo, tag = sys.argv[1:]
IDX, MAN = "application/vnd.oci.image.index.v1+json", "application/vnd.oci.image.manifest.v1+json"
def url(ref): return "http://%s/v2/%s/manifests/%s" % (reg, repo, ref)
def get(ref, t):
    return urllib.request.urlopen(urllib.request.Request(url(ref), headers={"Accept": t})).read()
def put(ref, body, t):
    urllib.request.urlopen(urllib.request.Request(url(ref), data=body, method="PUT",
                                                  headers={"Content-Type": t}))
idx = json.loads(get(tag, IDX))
entry = idx["manifests"][-1]
m = json.loads(get(entry["digest"], MAN))
key = "dev.ferry.index.diff-ids"
ids = m["annotations"][key].split(",")
m["annotations"][key] = ",".join(reversed(ids))
body = json.dumps(m).encode()
entry["digest"], entry["size"] = "sha256:" + hashlib.sha256(body).hexdigest(), len(body)
put(entry["digest"], body, MAN)
put(tag, json.dumps(idx).encode(), IDX)
EOF
}
check "bad/deb's index records the diff_ids in the wrong order" swap_diff_ids bad/deb

REF=$(umoci_ref "$FIX:pkgs" "$SCRATCH/bundle") || { notok "umoci unpack"; e2e_done; exit 1; }
FILES="usr/bin/bash usr/bin/less"
# shellcheck disable=SC2086
WANT=$(cd "$REF" && sha256sum $FILES)
expect "the reference has a file of each layer" [ "$(echo "$WANT" | wc -l)" -eq 2 ]

SN_JSON="\"pullers\": {\"$NS\": \"cri\", \"$NSR\": \"rpull\"},
 \"indexes\": [\"$PROXY/deb\", \"$PROXY/plain\", \"$PROXY/bad\"]"
check "ferryd starts" ctd_start_ferryd
check "ferry-snapshotter starts" ctd_start_snapshotter fuse
check "containerd 1.6 starts from a scratch config" ctd_start_containerd || { e2e_done; exit 1; }

# Layer blob GETs since the last fp_reset: "full" (no Range) or "ranged".
layer_gets() { # full|ranged
	local d
	fp_log >"$SCRATCH/fp.log" || return 1
	for d in $LAYERS; do
		if [ "$1" = full ]; then
			grep -E "^GET .*/blobs/$d range=None" "$SCRATCH/fp.log"
		else
			grep -E "^GET .*/blobs/$d range=bytes" "$SCRATCH/fp.log"
		fi
	done
	return 0
}
no_full_get() {
	local full
	full=$(layer_gets full) || return 1
	[ -z "$full" ] || { echo "$full" | sed 's/^/    full GET: /'; return 1; }
}
both_full() { [ "$(layer_gets full | wc -l)" -ge 2 ]; }
cripull() { # REF
	timeout -k 5 180 "$CRIPULL" -address "$CTD/containerd.sock" -namespace "$NS" \
		-snapshotter ferry -plain-http "$1" >"$SCRATCH/pull.out" 2>&1 ||
		{ tail -3 "$SCRATCH/pull.out"; ctd_diagnose; return 1; }
}
hashes() { # NS IMAGE
	ctr_ns "$1" run --rm --snapshotter ferry "$2" c$RANDOM sh -c "cd / && sha256sum $FILES" 2>&1
}
# Under load ctr 1.6 can lose the tail of a short task's output (see
# containerd.sh): a lost tail is run again once, a wrong hash is not.
runs_right() { # NOTE NS IMAGE
	local out
	out=$(hashes "$2" "$3")
	if [ "$out" != "$WANT" ] && [[ "$WANT" == "$out"* ]]; then
		echo "    ctr run printed only: ${out:-nothing}; once more"
		out=$(hashes "$2" "$3")
	fi
	expect "$1" [ "$out" = "$WANT" ]
	[ "$out" = "$WANT" ] || { echo "$out" | tail -5; ctd_diagnose; } | sed 's/^/    /'
}
sn_log() { grep -c -- "$1" "$CTD/snapshotter.log"; }

# Without an index: unpacked by containerd.
fp_reset
fp_mark
check "CRI pull of plain/deb (no index)" cripull "$PROXY/plain/deb:1"
expect "... containerd downloads both layers" both_full
expect "... and nothing is mounted by ferryd" [ -z "$(ctd_ferry_mounts)" ]
expect "... the snapshotter says why" [ "$(sn_log "plain/deb@sha256:$MANIFEST has no ferry index")" -ge 1 ]
runs_right "ctr run of plain/deb: right hashes" "$NS" "$PROXY/plain/deb:1"
echo "# plain/deb, pull and run: $(fp_data_bytes) bytes of layers fetched ($LAYER_BYTES in the image)"
check "ctr image rm --sync (plain/deb)" ctr_ns "$NS" images rm --sync "$PROXY/plain/deb:1"

# An index whose diff_ids are not the image's: refused, unpacked.
fp_reset
check "CRI pull of bad/deb (an index with other diff_ids)" cripull "$PROXY/bad/deb:1"
expect "... the index is refused, saying why" \
	[ "$(sn_log "records diff_ids .* that are not its config's rootfs.diff_ids")" -ge 1 ]
expect "... containerd downloads both layers" both_full
expect "... and nothing is mounted by ferryd" [ -z "$(ctd_ferry_mounts)" ]
runs_right "ctr run of bad/deb: right hashes" "$NS" "$PROXY/bad/deb:1"
check "ctr image rm --sync (bad/deb)" ctr_ns "$NS" images rm --sync "$PROXY/bad/deb:1"

# With its index: lazy.
fp_reset
fp_mark
check "CRI pull of deb (indexed)" cripull "$PROXY/deb:1"
expect "... no full GET of a layer blob" no_full_get
expect "... ferryd mounts the index" [ "$(ctd_ferry_mounts | wc -l)" -eq 1 ]
runs_right "ctr run of deb: both layers' files have the right hashes" "$NS" "$PROXY/deb:1"
expect "... read through ranged GETs of the layers" [ -n "$(layer_gets ranged)" ]
echo "# deb (indexed), pull and run: $(fp_data_bytes) bytes of layers fetched ($LAYER_BYTES in the image)"
expect "... and still no full GET" no_full_get
fp_reset
check "ctr-remote image rpull of deb" timeout -k 5 180 ctr-remote --address "$CTD/containerd.sock" \
	-n "$NSR" image rpull --plain-http --snapshotter ferry "$PROXY/deb:1"
runs_right "ctr run of the rpulled deb: right hashes" "$NSR" "$PROXY/deb:1"
expect "... no full GET of a layer blob" no_full_get

# The registry down: both daemons restart, the snapshot is mounted again
# by manifest and index digest from the cache.
fp_reset
fp_set reset count=-1
ctd_stop "$SN_PID"
ferryd_stop $(daemon_pids "$FSOCK")
check "the registry is down; ferryd restarts" ctd_start_ferryd
check "... the snapshotter restarts" ctd_start_snapshotter fuse
expect "... and mounts the index again (in the background)" \
	poll 30 eval '[ "$(sn_log "ferry: restored docker://$PROXY/deb@sha256:$MANIFEST")" -ge 1 ]'
runs_right "ctr run of deb after the restart, the registry down: right hashes" "$NS" "$PROXY/deb:1"
expect "... no tag was resolved" [ -z "$(fp_log | grep -E '/manifests/(1|sha256-)')" ]
fp_set none

check "ctr image rm --sync (deb, both namespaces)" eval \
	'ctr_ns "$NS" images rm --sync "$PROXY/deb:1" && ctr_ns "$NSR" images rm --sync "$PROXY/deb:1"'
expect "... leaves no ferry mount" [ -z "$(ctd_ferry_mounts)" ]
ctd_ferry_mounts | sed 's/^/    left: /'
e2e_done
