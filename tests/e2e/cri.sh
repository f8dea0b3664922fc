#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A Kubernetes node without kubelet (docs/containerd.md, issue 43):
# containerd 1.6 with its CRI plugin on, from a scratch config (host
# network, no CNI, a pause image of static busybox imported with ctr,
# registry config_path a hosts directory of the test's), ferry-snapshotter
# as its snapshotter and as the CRI proxy in front of it, and
# tests/tools/cri/criclient.py asking the proxy what kubelet asks:
#  - PullImage of a ferry image on a registry that wants a password (its
#    proxy logs every Authorization header): without an AuthConfig and
#    with a wrong one it is refused (no node-wide credentials); with the
#    credentials only in the request's AuthConfig, no data-blob GET
#    during the pull, and every
#    request that carried credentials carried the ones given, ferryd's
#    too; RunPodSandbox, CreateContainer, StartContainer of a container
#    hashing files of both layers of the image (as umoci unpacks them),
#    then StopContainer, RemoveContainer, StopPodSandbox, RemovePodSandbox.
#  - PullImage of the same image unconverted (gzip layers) with a ferry
#    index attached, from the same private registry, its repository in
#    the snapshotter's "indexes": ferryd mounts it through the index, a
#    container reads files of both layers right, no whole layer is
#    downloaded, and only the credentials given are sent.
#  - PullImage of a multi-arch ferry index named on an origin that does
#    not answer, through the mirror its hosts.toml names (pull, resolve,
#    a header): containerd and ferryd both ask the mirror, with the
#    header; the snapshotter mounts the host platform's member, and a
#    container of it sees that platform's files; the first registry's
#    credentials never reach the mirror.
#  - PullImage of a Docker Hub name without a host ("hub:1"): the CRI
#    plugin names it docker.io/library/hub:1, and containerd and ferryd
#    both reach it through the mirror certs.d/docker.io/hosts.toml names
#    (there is no internet here); a container of it reads the image's
#    files.
E2E_TIMEOUT=${E2E_TIMEOUT:-600}
. "$(dirname "$0")/../lib/common.sh"
. "$(dirname "$0")/../lib/oci.sh"
. "$(dirname "$0")/../lib/registry.sh"
. "$(dirname "$0")/../lib/lazy.sh"
. "$(dirname "$0")/../lib/containerd.sh"
need_ferryd
need_cmds containerd ctr runc go htpasswd protoc umoci skopeo busybox
if ! python3 -c 'import grpc, google.protobuf' 2>"$LOG"; then
	notok "$E2E_NAME: python3-grpcio and python3-protobuf (make deps)"
	diag "$LOG"
	exit 1
fi
oci_fixtures
lazy_use cri

GO=$TOP/contrib/containerd/go.sh
SNAP=$SCRATCH/ferry-snapshotter
CTD=$SCRATCH/ctd
SNROOT=$CTD/snapshotter
HOSTS=$CTD/certs.d       # containerd's config_path and the snapshotter's hostsDir (ctd_configs)
CRI_SOCK=$CTD/cri.sock   # the proxy: kubelet's --image-service-endpoint
LOGS=$CTD/pods           # the sandboxes' log directory
PAUSE=ferry.test/pause:1 # the sandbox image, imported
CTD_NAMESPACES=(k8s.io)  # CRI's
CTD_RUNC_ROOT=1
mkdir -p "$CTD" "$HOSTS" "$LOGS"
CTD_CRI="[plugins.\"io.containerd.grpc.v1.cri\"]
  sandbox_image = \"$PAUSE\"
  # Not below containerd's own: this machine may not lower it.
  restrict_oom_score_adj = true
  [plugins.\"io.containerd.grpc.v1.cri\".containerd]
    snapshotter = \"ferry\"
    disable_snapshot_annotations = false
    [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]
      runtime_type = \"io.containerd.runc.v2\"
      [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]
        Root = \"$CTD/runc\"
  [plugins.\"io.containerd.grpc.v1.cri\".cni]
    bin_dir = \"$CTD/cni/bin\"
    conf_dir = \"$CTD/cni/conf\"
  [plugins.\"io.containerd.grpc.v1.cri\".registry]
    config_path = \"$HOSTS\""
SN_JSON="\"criAddress\": \"$CRI_SOCK\", \"containerdAddress\": \"$CTD/containerd.sock\""

criclient() {
	timeout -k 5 200 python3 "$TOP/tests/tools/cri/criclient.py" -socket "$CRI_SOCK" "$@" </dev/null
}

# containerd makes a cgroup per namespace for the containers (cgroupfs
# driver) and leaves it: removed at exit unless it was there before.
CGROUPS_BEFORE=$(ls -d /sys/fs/cgroup/*/k8s.io /sys/fs/cgroup/k8s.io 2>/dev/null)
cgroups_clean() {
	local d
	[ -z "$CGROUPS_BEFORE" ] || return 0
	for d in /sys/fs/cgroup/*/k8s.io /sys/fs/cgroup/k8s.io; do
		[ -d "$d" ] && rmdir "$d"
	done
}
eval "_ctd_prev_exit=$(trap -p EXIT | sed -e 's/^trap -- //' -e 's/ EXIT$//')"
trap 'ctd_stop_all; cgroups_clean; '"$_ctd_prev_exit" EXIT

check "build ferry-snapshotter (offline, GOPATH mode)" "$GO" build -o "$SNAP" || { e2e_done; exit 1; }

# P: private (htpasswd), behind a proxy that logs every Authorization
# header. A: anonymous, reached only as the mirror of ORIGIN, where
# nothing answers.
P_PASS=cri-$$-$RANDOM
REG_TEST_PASS=$P_PASS reg_start basic || { notok "docker-registry (basic auth)"; e2e_done; exit 1; }
P=$REG P_USER=$REG_USER
fp_start || { notok "faultproxy before P"; e2e_done; exit 1; }
P_PROXY=$PROXY
check "convert the two-layer Debian image" "$FERRY" convert -q "oci:$FIX:pkgs" "oci:$SCRATCH/lay:pkgs"
REG_USER=$P_USER REG_PASS=$P_PASS check "push it to P" reg_push_oci "$SCRATCH/lay:pkgs" "$P/private/app:1"
# data_blobs LAYOUT:TAG: every layer of the image but the last, the bootstrap.
data_blobs() {
	skopeo inspect --raw "oci:$1" |
		python3 -c 'import json,sys; print(" ".join(l["digest"] for l in json.load(sys.stdin)["layers"][:-1]))'
}
DATA_BLOBS=$(data_blobs "$SCRATCH/lay:pkgs")
expect "the image has data blobs" [ -n "$DATA_BLOBS" ]
# The same image unconverted, with a ferry index attached; its repository
# is in the snapshotter's "indexes" (the allow-list of trusted indexes).
REG_USER=$P_USER REG_PASS=$P_PASS check "push the gzip Debian image as is to P" \
	reg_push_oci "$FIX:pkgs" "$P/private/plain:1"
index_p() { printf '%s\n' "$P_PASS" | "$FERRY" index -q --username "$P_USER" --password-stdin "$@"; }
check "ferry index attaches an index to it" index_p "docker://$P/private/plain:1"
PLAIN_LAYERS=$(skopeo inspect --raw --tls-verify=false --creds "$P_USER:$P_PASS" "docker://$P/private/plain:1" |
	python3 -c 'import json,sys; print(" ".join(l["digest"] for l in json.load(sys.stdin)["layers"]))')
expect "... an image of two layers" [ "$(wc -w <<<"$PLAIN_LAYERS")" -eq 2 ]
SN_JSON="$SN_JSON, \"indexes\": [\"$P_PROXY/private/plain\"]"
reg_start anon || { notok "docker-registry"; e2e_done; exit 1; }
A=$REG
fp_start || { notok "faultproxy before A"; e2e_done; exit 1; }
A_PROXY=$PROXY
check "convert the multi-arch fixture into an index on A" \
	"$FERRY" convert -q "oci:$FIX:multi" "docker://$A/multi:1"
host=$(host_platform)
HOST_MEMBER=$(skopeo inspect --raw --tls-verify=false "docker://$A/multi:1" | python3 -c '
import json, sys
os_, arch, *var = sys.argv[1].split("/")
for m in json.load(sys.stdin)["manifests"]:
    p = m["platform"]
    if (p["os"], p["architecture"], p.get("variant")) == (os_, arch, var[0] if var else None):
        print(m["digest"])' "$host")
expect "the index has a member for this host ($host)" [ -n "$HOST_MEMBER" ]
# mirror_on_a DIR SERVER TAG: HOSTS/DIR/hosts.toml for SERVER, A's proxy
# its mirror (pull, resolve), sending the header X-Ferry-Mirror: TAG.
mirror_on_a() {
	mkdir -p "$HOSTS/$1" && cat >"$HOSTS/$1/hosts.toml" <<EOF
server = "$2"

[host."http://$A_PROXY"]
  capabilities = ["pull", "resolve"]
  header = {X-Ferry-Mirror = "$3"}
EOF
}
ORIGIN=127.0.0.1:$(reg_free_port)
mirror_on_a "${ORIGIN/:/_}_" "http://$ORIGIN" cri-e2e
# Docker Hub, as a node's certs.d names a pull-through cache for it. The
# same files in other chunks: snapshots of their own, not P's image's.
check "convert the Debian image again, 512K chunks" \
	"$FERRY" convert -q --chunk-size 512K "oci:$FIX:pkgs" "oci:$SCRATCH/hub:pkgs"
check "push it to A as library/hub:1" reg_push_oci "$SCRATCH/hub:pkgs" "$A/library/hub:1"
HUB_BLOBS=$(data_blobs "$SCRATCH/hub:pkgs")
expect "... its data blobs are not P's image's" [ "${HUB_BLOBS:-$DATA_BLOBS}" != "$DATA_BLOBS" ]
mirror_on_a docker.io https://registry-1.docker.io hub-e2e

# Reference hashes: a file of the first layer, one only the second adds.
REF=$(umoci_ref "$FIX:pkgs" "$SCRATCH/bundle") || { notok "umoci unpack"; e2e_done; exit 1; }
FILES="usr/bin/bash usr/bin/less"
# shellcheck disable=SC2086
WANT=$(cd "$REF" && sha256sum $FILES)

# The pause image: static busybox sleeping, as an OCI archive for ctr.
pause_image() {
	mkdir -p "$SCRATCH/pause-root/bin" &&
		cp "$(command -v busybox)" "$SCRATCH/pause-root/bin/busybox" &&
		umoci init --layout "$SCRATCH/pause" && umoci new --image "$SCRATCH/pause:1" &&
		umoci insert --image "$SCRATCH/pause:1" "$SCRATCH/pause-root/bin" /bin &&
		umoci config --image "$SCRATCH/pause:1" --config.entrypoint /bin/busybox \
			--config.entrypoint sleep --config.cmd 2147483647 &&
		tar -C "$SCRATCH/pause" -cf "$SCRATCH/pause.tar" .
}
check "build the pause image" pause_image

check "ferryd starts" ctd_start_ferryd
check "ferry-snapshotter starts (fuse), its CRI proxy on" ctd_start_snapshotter fuse || { e2e_done; exit 1; }
check "containerd 1.6 starts with its CRI plugin" ctd_start_containerd || { e2e_done; exit 1; }
check "import the pause image (ctr, k8s.io)" ctr_ns k8s.io images import --snapshotter ferry \
	--base-name "${PAUSE%:*}" "$SCRATCH/pause.tar"
out=$(criclient version 2>&1)
expect "CRI Version through the proxy: containerd's" grep -q "^containerd 1\.6" <<<"$out"
grep -q "^containerd 1\.6" <<<"$out" || echo "$out" | tail -3 | sed 's/^/    /'

# The requests a proxy logged since its last reset, one per line:
# agent<TAB>method<TAB>path<TAB>Authorization<TAB>X-* headers.
proxy_log() { # PROXY
	PROXY=$1 fp_ctl /__stats | python3 -c '
import json, sys
for e in json.load(sys.stdin)["log"]:
    print("\t".join(str(e.get(k)) for k in ("agent", "method", "path", "authorization", "x")))'
}
# pull_log_ok PROXY AUTH BLOBS: the proxy's log of a pull: none of the
# data BLOBS asked for, every Authorization sent AUTH ("None": none),
# ferryd's requests (user agent ferry/) among them.
pull_log_ok() {
	proxy_log "$1" >"$SCRATCH/pull.log" || return 1
	# shellcheck disable=SC2086 # one argument per blob
	python3 - "$SCRATCH/pull.log" "$2" $3 <<'EOF'
import sys
log, given, blobs = sys.argv[1], sys.argv[2], sys.argv[3:]
rows = [l.rstrip("\n").split("\t") for l in open(log)]
bad = []
for agent, method, path, auth, _ in rows:
    if method == "GET" and any("/blobs/" + b in path for b in blobs):
        bad.append("data blob fetched during the pull: %s %s" % (agent, path))
    if auth not in ("None", given):
        bad.append("other credentials sent: %s %s %s" % (agent, method, path))
if not any("/manifests/" in r[2] for r in rows):
    bad.append("no manifest request: not the pull's log")
if not any(r[0].startswith("ferry/") and r[3] == given for r in rows):
    bad.append("ferryd sent no request (with %s)" % given)
for b in bad:
    print("    " + b)
sys.exit(1 if bad else 0)
EOF
}

# --- pull secrets ---------------------------------------------------------
IMG=$P_PROXY/private/app:1
P_AUTH="Basic $(printf '%s:%s' "$P_USER" "$P_PASS" | base64 -w0)"
# pull_refused ERRFILE [ARGS...]: P refuses the pull, not anything on the
# way (containerd says so).
pull_refused() {
	local err=$1
	shift
	! criclient pull "$IMG" "$@" 2>"$err" && grep -qi "unauthorized\|401" "$err"
}
expect "PullImage without an AuthConfig is refused (no node-wide credentials)" \
	pull_refused "$SCRATCH/noauth.err"
expect "PullImage with a wrong secret in its AuthConfig is refused" \
	pull_refused "$SCRATCH/wrong.err" -user "$P_USER:wrong-$P_PASS"
PROXY=$P_PROXY fp_reset
check "PullImage of the private ferry image, credentials only in its AuthConfig" \
	criclient pull "$IMG" -user "$P_USER:$P_PASS"
check "... no data-blob GET, only the credential given, ferryd's requests included" \
	pull_log_ok "$P_PROXY" "$P_AUTH" "$DATA_BLOBS"
expect "... the bootstrap is mounted by ferryd" [ -n "$(ctd_ferry_mounts)" ]
out=$(criclient run "$IMG" -logs "$LOGS" -name app -- sh -c "cd / && sha256sum $FILES" 2>&1)
expect "RunPodSandbox, CreateContainer, StartContainer: its files have the image's hashes" \
	[ "$(grep -E '^[0-9a-f]{64} ' <<<"$out")" = "$WANT" ]
[ "$(grep -E '^[0-9a-f]{64} ' <<<"$out")" = "$WANT" ] || echo "$out" | tail -5 | sed 's/^/    /'

# --- an unconverted image with a ferry index ---------------------------------
# As kubelet pulls it: the secret only in PullImage's AuthConfig, which the
# snapshotter's probe of the index needs too.
PIDX=$P_PROXY/private/plain:1
PROXY=$P_PROXY fp_reset
check "PullImage of the indexed gzip image, credentials only in its AuthConfig" \
	criclient pull "$PIDX" -user "$P_USER:$P_PASS"
expect "... ferryd mounts it through its index" \
	grep -qF "mounting docker://$P_PROXY/private/plain@" "$CTD/snapshotter.log"
out=$(criclient run "$PIDX" -logs "$LOGS" -name plain -- sh -c "cd / && sha256sum $FILES" 2>&1)
expect "... a container of it has both layers' files, with the image's hashes" \
	[ "$(grep -E '^[0-9a-f]{64} ' <<<"$out")" = "$WANT" ]
[ "$(grep -E '^[0-9a-f]{64} ' <<<"$out")" = "$WANT" ] || echo "$out" | tail -5 | sed 's/^/    /'
# layer_gets full|ranged: P's GETs of the plain image's layers since the reset.
layer_gets() {
	local d want=None
	[ "$1" = ranged ] && want='bytes=[0-9]'
	PROXY=$P_PROXY fp_log >"$SCRATCH/plain.log" || return 1
	for d in $PLAIN_LAYERS; do
		grep -E "^GET .*/blobs/$d range=$want" "$SCRATCH/plain.log"
	done
	return 0
}
full=$(layer_gets full)
expect "... pull and run: no GET of a whole layer blob" [ -z "$full" ]
echo "$full" | sed '/^$/d; s/^/    full GET: /'
expect "... the files were read through ranged GETs of the layers" [ -n "$(layer_gets ranged)" ]
proxy_log "$P_PROXY" | cut -f4 | sort -u >"$SCRATCH/plain-auth.log"
# shellcheck disable=SC2016 # for eval
expect "... every request with credentials carried the ones given" \
	eval '! grep -qvxF -e None -e "$P_AUTH" "$SCRATCH/plain-auth.log"'

# --- hosts.toml and a multi-arch index ---------------------------------------
PROXY=$A_PROXY fp_reset
check "PullImage of a multi-arch ferry index named on an origin that does not answer" \
	criclient pull "$ORIGIN/multi:1"
proxy_log "$A_PROXY" >"$SCRATCH/a.log"
# shellcheck disable=SC2016 # for eval
expect "... containerd and ferryd asked the mirror hosts.toml names, with its header" \
	eval 'grep -q "^containerd/.*X-Ferry-Mirror=cri-e2e" "$SCRATCH/a.log" &&
		grep -q "^ferry/.*X-Ferry-Mirror=cri-e2e" "$SCRATCH/a.log" &&
		! grep -v "X-Ferry-Mirror=cri-e2e" "$SCRATCH/a.log" | grep -q .'
expect "... ferryd mounted the member for $host ($HOST_MEMBER)" \
	grep -qF "mounting docker://$ORIGIN/multi@$HOST_MEMBER " "$CTD/snapshotter.log"
if [ "$host" = linux/amd64 ]; then # the fixture's amd64 image has no /platform
	probe='test ! -e /platform && cat /etc/debian_version && echo host-platform'
else
	probe="test \"\$(cat /platform)\" = $host && echo host-platform"
fi
out=$(criclient run "$ORIGIN/multi:1" -logs "$LOGS" -name multi -- sh -c "$probe" 2>&1)
expect "... a container of it sees the host platform's files" grep -qx host-platform <<<"$out"
grep -qx host-platform <<<"$out" || echo "$out" | tail -5 | sed 's/^/    /'
proxy_log "$A_PROXY" | cut -f4 >"$SCRATCH/a-auth.log"
# shellcheck disable=SC2016 # for eval
expect "... and P's credentials never reached it" eval '! grep -qvx None "$SCRATCH/a-auth.log"'

# --- a Docker Hub name -------------------------------------------------------
PROXY=$A_PROXY fp_reset
check "PullImage of hub:1, a Docker Hub name without a host" criclient pull hub:1
out=$(criclient status hub:1 2>&1)
expect "... the CRI plugin names it docker.io/library/hub:1" grep -qx "docker.io/library/hub:1" <<<"$out"
grep -qx "docker.io/library/hub:1" <<<"$out" || echo "$out" | tail -3 | sed 's/^/    /'
check "... no data-blob GET on the mirror docker.io's hosts.toml names, ferryd's requests included" \
	pull_log_ok "$A_PROXY" None "$HUB_BLOBS"
proxy_log "$A_PROXY" >"$SCRATCH/hub.log"
# shellcheck disable=SC2016 # for eval
expect "... containerd and ferryd asked it for library/hub, with its header" \
	eval 'grep -q "^containerd/.*/v2/library/hub/manifests/1.*X-Ferry-Mirror=hub-e2e" "$SCRATCH/hub.log" &&
		grep -q "^ferry/.*/v2/library/hub/.*X-Ferry-Mirror=hub-e2e" "$SCRATCH/hub.log"'
expect "... ferryd mounted docker.io/library/hub" \
	grep -qF "mounting docker://docker.io/library/hub@" "$CTD/snapshotter.log"
out=$(criclient run hub:1 -logs "$LOGS" -name hub -- sh -c "cd / && sha256sum $FILES" 2>&1)
expect "... a container of it has the image's files" \
	[ "$(grep -E '^[0-9a-f]{64} ' <<<"$out")" = "$WANT" ]
[ "$(grep -E '^[0-9a-f]{64} ' <<<"$out")" = "$WANT" ] || echo "$out" | tail -5 | sed 's/^/    /'
e2e_done
