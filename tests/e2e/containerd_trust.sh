#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# ferry-snapshotter on a shared node (issue 42; docs/SECURITY.md,
# containerd): containerd 1.6 from a scratch config, FUSE mode, a CRI
# namespace (tests/tools/cripull) and an rpull one (ctr-remote).
#  - Images that claim other images' chain IDs are refused, each at the
#    layer that lies, and nothing they claim is committed: a ferry image
#    whose config lists a gzip victim's diff_ids; one whose data blobs are
#    the victim's own layer tars; one with the ferry victim's blobs and a
#    bootstrap of its own. The victims pulled afterwards run their own
#    files (sha256 inside `ctr run`).
#  - An image whose layers name another image (the CRI labels, pulled with
#    rpull; ctr-remote's, pulled by CRI) is refused; pulled by CRI with its
#    CRI labels overwritten, it runs its own files.
#  - Credentials per host: a private registry's reach it, and a registry
#    that asks for credentials gets no other host's (its proxy logs every
#    Authorization header); the global fetch.creds form is refused.
#  - The snapshotter alone restarted under a running container keeps its
#    mount. A tag moved, then ferryd and the snapshotter restarted: the
#    rpull'ed image keeps its files. The registry down (its proxy resets every
#    connection), both restarted: the snapshotter serves, a container
#    whose files are cached runs, one whose data left the cache fails
#    reading it, one whose manifest is not cached fails to start saying why, and
#    runs once the registry is back. Removing an image releases its record
#    in ferryd's cache.
. "$(dirname "$0")/../lib/common.sh"
. "$(dirname "$0")/../lib/oci.sh"
. "$(dirname "$0")/../lib/registry.sh"
. "$(dirname "$0")/../lib/lazy.sh"
. "$(dirname "$0")/../lib/containerd.sh"
need_ferryd
need_cmds containerd ctr runc ctr-remote go htpasswd
oci_fixtures
lazy_use ctdt

GO=$TOP/contrib/containerd/go.sh
MKLAYER=(python3 "$TOP/tests/tools/mklayer.py")
SNAP=$SCRATCH/ferry-snapshotter
CRIPULL=$SCRATCH/cripull
CTD=$SCRATCH/ctd
NS=ferry-trust-$$    # the CRI namespace
NSR=ferry-trust-r-$$ # the rpull one
SNROOT=$CTD/snapshotter
CTD_NAMESPACES=("$NS" "$NSR")
EVIL=$SCRATCH/evil   # the attackers' OCI layout
mkdir -p "$CTD"

ctd_e2e_begin

# craft CMD LAYOUT ARGS: attacker images in the OCI layout LAYOUT.
#   claims TAG VLAYOUT VTAG OUT   TAG with VTAG's diff_ids
#   tars TAG VLAYOUT VTAG OUT     VTAG's layer tars as data blobs, then
#                                 TAG's bootstrap; VTAG's diff_ids
#   annotate TAG OUT K=V...       every layer of TAG annotated
#   digest TAG                    its manifest digest
craft() {
	python3 - "$@" <<'EOF'
import gzip, hashlib, json, os, sys
cmd, lay, args = sys.argv[1], sys.argv[2], sys.argv[3:]
REF = "org.opencontainers.image.ref.name"
def path(l, d): return os.path.join(l, "blobs", *d.split(":"))
def get(l, d): return open(path(l, d), "rb").read()
def put(data):
    d = "sha256:" + hashlib.sha256(data).hexdigest()
    open(path(lay, d), "wb").write(data)
    return d
def desc(l, tag):
    idx = json.load(open(os.path.join(l, "index.json")))
    return [d for d in idx["manifests"] if d.get("annotations", {}).get(REF) == tag][0]
def manifest(l, tag): return json.loads(get(l, desc(l, tag)["digest"]))
def config(l, m): return json.loads(get(l, m["config"]["digest"]))
def save(m, cfg, tag):
    raw = json.dumps(cfg).encode()
    m["config"].update(digest=put(raw), size=len(raw))
    raw = json.dumps(m).encode()
    idx = json.load(open(os.path.join(lay, "index.json")))
    idx["manifests"] = [d for d in idx["manifests"] if d.get("annotations", {}).get(REF) != tag]
    idx["manifests"].append({"mediaType": m["mediaType"], "digest": put(raw), "size": len(raw),
                             "annotations": {REF: tag}})
    json.dump(idx, open(os.path.join(lay, "index.json"), "w"))
if cmd == "digest":
    print(desc(lay, args[0])["digest"])
elif cmd in ("claims", "tars"):
    tag, vlay, vtag, out = args
    m, vm = manifest(lay, tag), manifest(vlay, vtag)
    cfg, vids = config(lay, m), config(vlay, vm)["rootfs"]["diff_ids"]
    if cmd == "tars":
        blobs = []
        for l in vm["layers"][:-1]:
            data = gzip.decompress(get(vlay, l["digest"]))
            blobs.append({"mediaType": "application/vnd.oci.image.layer.ferry.blob.v1",
                          "digest": put(data), "size": len(data),
                          "annotations": {"containerd.io/snapshot/ferry.blob": "true"}})
        m["layers"] = blobs + m["layers"][-1:]
    if len(vids) != len(m["layers"]):
        sys.exit("%s has %d layers, %s %d diff_ids" % (tag, len(m["layers"]), vtag, len(vids)))
    cfg["rootfs"]["diff_ids"] = vids
    save(m, cfg, out)
elif cmd == "annotate":
    tag, out, kvs = args[0], args[1], args[2:]
    m = manifest(lay, tag)
    for l in m["layers"]:
        l.setdefault("annotations", {}).update(kv.split("=", 1) for kv in kvs)
    save(m, config(lay, m), out)
EOF
}

# An attacker's own image: /usr/bin/less says so, /evil/data is 256 KiB
# of random bytes, and busybox (static) runs cat, sha256sum and sleep;
# "other" and "first" are other such images.
evil_image() { # TAG SEED [LESS]
	local less=${3:-"attacker's less"}
	cat >"$SCRATCH/$1.json" <<JSON
[{"name": "bin/", "type": "dir"},
 {"name": "bin/busybox", "data_from": "bin/busybox", "mode": 493},
 {"name": "bin/cat", "type": "symlink", "link": "busybox"},
 {"name": "bin/sha256sum", "type": "symlink", "link": "busybox"},
 {"name": "bin/sleep", "type": "symlink", "link": "busybox"},
 {"name": "usr/", "type": "dir"}, {"name": "usr/bin/", "type": "dir"},
 {"name": "usr/bin/less", "data": "$less\n", "mode": 493},
 {"name": "evil/", "type": "dir"},
 {"name": "evil/data", "random": {"size": 262144, "seed": $2}}]
JSON
	"${MKLAYER[@]}" tar "$SCRATCH/$1.tar" "$SCRATCH/$1.json" --lower / &&
		"$FERRY" convert -q "tar:$SCRATCH/$1.tar" "oci:$EVIL:$1"
}

# Registries: R (anonymous, behind the proxy the pulls go through), P
# (private: the node's credentials in the snapshotter's auths), E (an
# attacker's, asking for credentials, behind a proxy that logs them).
reg_start anon || { notok "docker-registry"; e2e_done; exit 1; }
fp_start || { notok "faultproxy"; e2e_done; exit 1; }
R=$REG R_PROXY=$PROXY R_FP_PID=$FP_PID
P_PASS=private-$$-$RANDOM
REG_TEST_PASS=$P_PASS reg_start basic || { notok "private registry"; e2e_done; exit 1; }
P=$REG P_USER=$REG_USER
REG_PUSH_USER=$REG_USER
E_PASS=attacker-$$-$RANDOM
REG_TEST_PASS=$E_PASS reg_start basic || { notok "attacker's registry"; e2e_done; exit 1; }
E=$REG
fp_start || { notok "faultproxy (attacker)"; e2e_done; exit 1; }
E_PROXY=$PROXY
PROXY=$R_PROXY

check "convert the Debian fixture (the ferry victim)" "$FERRY" convert -q "oci:$FIX:pkgs" "oci:$EVIL:pkgs"
check "the attacker's image" evil_image own 1
check "another image" evil_image other 2
check "a third one, first under a tag that moves" evil_image first 3 "the first image"
# Swapped copies of the victim's files: no chunk of its own, so the
# victim's data blobs and a bootstrap of its own.
REF=$(umoci_ref "$FIX:pkgs" "$SCRATCH/bundle") || { notok "umoci unpack"; e2e_done; exit 1; }
FILES="usr/bin/bash usr/bin/less"
# shellcheck disable=SC2086
WANT=$(cd "$REF" && sha256sum $FILES)
mkdir -p "$SCRATCH/swap/usr/bin"
cp "$REF/usr/bin/bash" "$SCRATCH/swap/usr/bin/less"
cp "$REF/usr/bin/less" "$SCRATCH/swap/usr/bin/bash"
check "the swapped image, over the victim's blobs (--chunk-dict)" \
	"$FERRY" convert -q --chunk-dict "oci:$EVIL:pkgs" "dir:$SCRATCH/swap" "oci:$EVIL:swap-own"
check "(1) a ferry image claiming the gzip victim's diff_ids" craft claims "$EVIL" own "$FIX" pkgs claims
check "(1') one whose data blobs are the gzip victim's layer tars" craft tars "$EVIL" own "$FIX" pkgs tars
check "(1'') the victim's blobs, a bootstrap of its own, the ferry victim's diff_ids" \
	craft claims "$EVIL" swap-own "$EVIL" pkgs swap
check "push the gzip victim" reg_push_oci "$FIX:pkgs" "$R/deb:gzip"
for t in pkgs own other first claims tars swap; do
	check "push $t" reg_push_oci "$EVIL:$t" "$R/evil:$t"
done
REG_USER=$REG_PUSH_USER REG_PASS=$P_PASS check "push the private image to P" \
	reg_push_oci "$EVIL:pkgs" "$P/private/app:1"
PRIVATE_DIGEST=$(craft digest "$EVIL" pkgs)
check "(2) an image whose layers name the private one (CRI's labels)" craft annotate "$EVIL" own names \
	"containerd.io/snapshot/cri.image-ref=$P/private/app:1" \
	"containerd.io/snapshot/cri.manifest-digest=$PRIVATE_DIGEST"
check "(2') one that names it with ctr-remote's labels" craft annotate "$EVIL" own names-stargz \
	"containerd.io/snapshot/remote/stargz.reference=$P/private/app:1"
for t in names names-stargz; do
	check "push $t" reg_push_oci "$EVIL:$t" "$R/evil:$t"
done
REG_USER=$REG_PUSH_USER REG_PASS=$E_PASS check "push an image to E" \
	reg_push_oci "$EVIL:other" "$E/hostile/app:1"

cripull() { # REF [cripull args]
	local ref=$1
	shift
	timeout -k 5 180 "$CRIPULL" -address "$CTD/containerd.sock" -namespace "$NS" \
		-snapshotter ferry -plain-http "$@" "$ref" >"$SCRATCH/pull.out" 2>&1
}
rpull() { # REF [rpull args]
	local ref=$1
	shift
	timeout -k 5 180 ctr-remote --address "$CTD/containerd.sock" -n "$NSR" image rpull \
		--plain-http --snapshotter ferry "$@" "$ref" >"$SCRATCH/pull.out" 2>&1
}
# The pull failed, saying WHAT.
refused() { # WHAT
	local rc=0
	grep -q -- "$1" "$SCRATCH/pull.out" || rc=1
	[ "$rc" = 0 ] || tail -3 "$SCRATCH/pull.out" | sed 's/^/    /'
	return $rc
}
# sha256 of FILES inside a container of IMAGE, as the reference has them.
hashes() { # NS IMAGE
	ctr_ns "$1" run --rm --snapshotter ferry "$2" c$RANDOM sh -c "cd / && sha256sum $FILES" 2>&1
}
# /usr/bin/less of IMAGE, inside a container.
less_of() { # NS IMAGE
	ctr_ns "$1" run --rm --snapshotter ferry "$2" c$RANDOM cat /usr/bin/less 2>&1
}
runs_victim() { # NS IMAGE
	local out
	out=$(hashes "$@")
	[ "$out" = "$WANT" ] || { echo "$out" | head -5 | sed 's/^/    /'; return 1; }
}
no_snapshot() { # CHAIN...
	local c
	for c in "$@"; do
		! ctr_ns "$NS" snapshots --snapshotter ferry info "$c" >/dev/null 2>&1 || return 1
	done
}
# Chain IDs of an image's diff_ids (identity.ChainIDs).
chains() { # LAYOUT TAG
	python3 - "$@" <<'EOF'
import hashlib, json, os, sys
lay, tag = sys.argv[1:]
def get(d): return open(os.path.join(lay, "blobs", *d.split(":")), "rb").read()
idx = json.load(open(os.path.join(lay, "index.json")))
d = [d for d in idx["manifests"] if d.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag][0]
m = json.loads(get(d["digest"]))
c = None
for i in json.loads(get(m["config"]["digest"]))["rootfs"]["diff_ids"]:
    c = i if c is None else "sha256:" + hashlib.sha256((c + " " + i).encode()).hexdigest()
    print(c)
EOF
}

# --- the global credential form is refused -------------------------------
ctd_configs "$CTD" "$SNROOT" "$FSOCK" "$FCACHE" fuse "\"fetch\": {\"creds\": \"$P_USER:$P_PASS\"}"
timeout -k 2 10 "$SNAP" -config "$CTD/snapshotter.json" >"$SCRATCH/creds.out" 2>&1
rc=$?
expect "a snapshotter config with fetch.creds is refused (exit 2)" [ "$rc" = 2 ]
expect "... pointing to the per-host auths" grep -q '"auths"' "$SCRATCH/creds.out"

AUTH=$(printf '%s:%s' "$P_USER" "$P_PASS" | base64 -w0)
SN_JSON="\"pullers\": {\"$NS\": \"cri\", \"$NSR\": \"rpull\"},
 \"auths\": {\"$P\": {\"auth\": \"$AUTH\"}}"
check "ferryd starts" ctd_start_ferryd
check "ferry-snapshotter starts (fuse)" ctd_start_snapshotter fuse || { e2e_done; exit 1; }
check "containerd 1.6 starts from a scratch config" ctd_start_containerd || { e2e_done; exit 1; }

# --- 1: chain IDs ----------------------------------------------------------
cripull "$PROXY/evil:claims"
expect "(1) the image claiming the gzip victim's diff_ids is refused at its data blob" \
	refused "not that of data blob"
cripull "$PROXY/evil:tars"
expect "(1') the one made of the victim's layer tars too" refused "not that of data blob"
cripull "$PROXY/evil:swap"
expect "(1'') the one with the ferry victim's blobs and its own bootstrap, at the bootstrap" \
	refused "containerd asked for"
VCHAINS=$(chains "$FIX" pkgs) FCHAINS=$(chains "$EVIL" pkgs)
# shellcheck disable=SC2086
expect "... no snapshot under the gzip victim's chain IDs" no_snapshot $VCHAINS
expect "... nor under the ferry victim's bootstrap chain" no_snapshot "$(echo "$FCHAINS" | tail -1)"
check "the gzip victim, pulled afterwards (ctr pull, fallback)" \
	ctr_ns "$NS" images pull --plain-http --snapshotter ferry "$PROXY/deb:gzip" >/dev/null
expect "... runs its own files" runs_victim "$NS" "$PROXY/deb:gzip"
check "the ferry victim, pulled afterwards with the CRI labels" cripull "$PROXY/evil:pkgs"
expect "... runs its own files" runs_victim "$NS" "$PROXY/evil:pkgs"

# --- credentials per host ---------------------------------------------------
check "the private image, pulled with the CRI labels (P's credentials)" \
	cripull "$P/private/app:1" -user "$P_USER:$P_PASS"
expect "... runs" runs_victim "$NS" "$P/private/app:1"
rpull "$E_PROXY/hostile/app:1" --user "$REG_PUSH_USER:$E_PASS"
expect "an image on a registry that asks for credentials: not mounted" refused "ferry layer"
# E's requests: user agent, method, path, Authorization header.
auth_log() {
	python3 - "$E_PROXY" <<'EOF'
import json, sys, urllib.request
for e in json.load(urllib.request.urlopen("http://%s/__stats" % sys.argv[1], timeout=10))["log"]:
    print(e.get("agent"), e["method"], e["path"], e.get("authorization"))
EOF
}
auth_log >"$SCRATCH/e.log"
expect "... ferryd asked it for the image" grep -q "^ferry/" "$SCRATCH/e.log"
expect "... and never sent it P's credentials" eval '! grep -qF "$AUTH" "$SCRATCH/e.log"'

# --- 2: the image does not choose what is mounted ---------------------------
rpull "$PROXY/evil:names"
expect "(2) rpull of an image whose layers carry CRI labels naming another image: refused" \
	refused "is rpull's, which sets no such label"
cripull "$PROXY/evil:names-stargz"
expect "(2') CRI pull of one carrying ctr-remote's labels: refused" refused "is cri's, which sets no such label"
check "a CRI pull of the first (CRI overwrites its labels)" cripull "$PROXY/evil:names"
out=$(less_of "$NS" "$PROXY/evil:names")
expect "... runs its own files" [ "$out" = "attacker's less" ]
[ "$out" = "attacker's less" ] || echo "$out" | tail -3 | sed 's/^/    /'
expect "... and the private image is not mounted" eval '! timeout -k 2 20 "$FERRY" mount --list \
	"${FERRYD_SOCK_OPT[@]}" </dev/null | grep -q private'

# --- restarts ---------------------------------------------------------------
restart_both() { # [CMD...] run while both are stopped
	ctd_stop "$SN_PID"
	ferryd_stop $(daemon_pids "$FSOCK")
	"${@:-true}"
	ctd_start_ferryd && ctd_start_snapshotter fuse
}
# The attacker's data blob leaves the chunk cache (its manifest and
# bootstrap stay).
evict_own_blob() {
	local d
	d=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["layers"][0]["digest"][7:])' \
		"$EVIL/blobs/sha256/$(craft digest "$EVIL" own | cut -d: -f2)")
	rm -f "$FCACHE/blobs/sha256/$d".*
}
check "push the third image as moving:1" reg_push_oci "$EVIL:first" "$R/moving:1"
check "rpull of moving:1" rpull "$PROXY/moving:1"
expect "... runs its files" [ "$(less_of "$NSR" "$PROXY/moving:1")" = "the first image" ]
# The snapshotter alone restarts under a running container: ferryd's
# mount is kept, not mounted again.
check "a container of moving:1 runs in the background" \
	ctr_ns "$NSR" run -d --snapshotter ferry "$PROXY/moving:1" bg sleep 600
sn_log() { grep -c "$1" "$CTD/snapshotter.log"; }
restored=$(sn_log "ferry: restored docker://$PROXY/moving@")
ctd_stop "$SN_PID"
check "the snapshotter alone restarts" ctd_start_snapshotter fuse
expect "... finds the image's mount live" \
	poll 30 eval '[ "$(sn_log "ferry: restored docker://$PROXY/moving@")" -gt "$restored" ]'
expect "... and keeps it (no mount again)" [ "$(sn_log "mounting docker://$PROXY/moving@.* again")" = 0 ]
out=$(ctr_ns "$NSR" tasks exec --exec-id e1 bg cat /usr/bin/less 2>&1)
expect "... the running container reads its files" [ "$out" = "the first image" ]
ctr_ns "$NSR" tasks kill -s KILL bg >/dev/null 2>&1
poll 10 eval '! ctr_ns "$NSR" tasks ls -q | grep -qx bg'
check "(remove it)" ctr_ns "$NSR" containers rm bg
check "the tag moves to the attacker's image" reg_push_oci "$EVIL:own" "$R/moving:1"
check "ferryd and the snapshotter restart" restart_both
expect "... the snapshot keeps its image's files" \
	[ "$(less_of "$NSR" "$PROXY/moving:1")" = "the first image" ]

check "a CRI pull of the other image" cripull "$PROXY/evil:other"
OTHER=$(craft digest "$EVIL" other)
rm -f "$FCACHE/meta/${OTHER#sha256:}"
fp_set reset count=-1
check "the registry is down; ferryd and the snapshotter restart" restart_both evict_own_blob
expect "... the snapshotter keeps running" kill -0 "$SN_PID"
expect "... the victim, whose files were read, runs from the cache" runs_victim "$NS" "$PROXY/evil:pkgs"
out=$(ctr_ns "$NS" run --rm --snapshotter ferry "$PROXY/evil:names" c$RANDOM sha256sum /evil/data 2>&1)
expect "... the attacker's image, whose data left the cache, mounts and fails reading it" \
	grep -qi "input/output error" <<<"$out"
grep -qi "input/output error" <<<"$out" || echo "$out" | tail -3 | sed 's/^/    /'
out=$(ctr_ns "$NS" run --rm --snapshotter ferry "$PROXY/evil:other" c$RANDOM true 2>&1)
expect "... the image whose manifest is not cached fails to start, saying why" \
	grep -q "unavailable: ferry image .* cannot be mounted: .*Connection reset" <<<"$out"
grep -q "cannot be mounted" <<<"$out" || echo "$out" | tail -2 | sed 's/^/    /'
expect "... and the snapshotter still runs" kill -0 "$SN_PID"
fp_set none
sleep 11 # the snapshotter's remount backoff
out=$(less_of "$NS" "$PROXY/evil:other")
expect "the registry is back: it runs" [ "$out" = "attacker's less" ]
[ "$out" = "attacker's less" ] || echo "$out" | tail -3 | sed 's/^/    /'

expect "the other image has a record in ferryd's cache" [ -e "$FCACHE/images/${OTHER#sha256:}.json" ]
check "ctr image rm --sync of it" ctr_ns "$NS" images rm --sync "$PROXY/evil:other"
expect "... releases the record (gc may reclaim it)" [ ! -e "$FCACHE/images/${OTHER#sha256:}.json" ]
e2e_done
