# shellcheck shell=bash disable=SC2034
# SPDX-License-Identifier: MIT
# Helpers for the registry client tests (tests/e2e/registry_*.sh), sourced
# after lib/common.sh (run directly it does nothing). Everything listens on
# 127.0.0.1 only, on free ports (never 5000).
#
#   reg_start anon|basic|token [TOKENSERVER ARGS]
#       A docker-registry (storage under $SCRATCH, delete enabled) with no
#       auth, htpasswd Basic auth, or token auth through
#       tests/tools/tokenserver.py (users alice (read/write) and bob
#       (pull only), anonymous pull of public/*, a preloaded refresh
#       token). Exports REG (127.0.0.1:PORT), REG_DIR, REG_USER/REG_PASS
#       (empty for anon), REG_TOKEN_LOG, REG_REFRESH, REG_RO_USER/PASS.
#       With REG_TLS_CERT and REG_TLS_KEY (PEM files) it serves https;
#       REG_REALM_HOST names the token server's host in its realm
#       (default 127.0.0.1; another name needs a --resolve to 127.0.0.1).
#       REG_TLS_CLIENT_CA: https clients must show a certificate it signed.
#       REG_PORT: that port instead of a free one (a test's own network
#       namespace: hub_names.sh); REG_ACCESS_LOG=1: every request logged
#       (level info) in $REG_DIR/registry.log.
#   tls_pki                           a test CA and server certificates
#   reg_push_oci LAYOUT[:TAG] REF     skopeo copy oci: -> docker://
#   reg_put_blob REPO FILE / reg_put_manifest REPO REF TYPE FILE
#       Plain uploads to an anonymous $REG (python, no regclient).
#   reg_stored_blob DIGEST            the registry's own file of a blob
#   fp_start / fp_set MODE [k=v..] / fp_redirect [k=v..] / fp_reset /
#   fp_stat COUNTER / fp_log          tests/tools/faultproxy.py in front of
#       $REG, at $PROXY.
#   wp_start DELAY RATE [UPSTREAM] / wp_stat KEY [reset]
#       tests/tools/wanproxy.py (a delay line: DELAY ms each way, RATE
#       Mbit/s) in front of $REG (or UPSTREAM), at $WAN; its counters.
#   rc NAME ARGS... / rc_expect DESC CMD... / rc_stat KEY
#       Run regclient, check its outcome, read its --stats line.
# Background servers are stopped on exit (chained before lib/common.sh's trap).

[ "${BASH_SOURCE[0]}" = "$0" ] && exit 0

REGCLIENT=${REGCLIENT:-$TOOLS/regclient}
TOKENSERVER=$TOP/tests/tools/tokenserver.py
FAULTPROXY=$TOP/tests/tools/faultproxy.py
WANPROXY=$TOP/tests/tools/wanproxy.py
OCI_MANIFEST=application/vnd.oci.image.manifest.v1+json
REG_TEST_USER=alice
REG_TEST_PASS=s3cret-Ferry-7q
REG_RO_USER=bob
REG_RO_PASS=bob-Pull-Only-3x
REG_REFRESH=ferry-refresh-9b1f2c
REG_PIDS=()
REG_N=0
REG_USER=
REG_PASS=
REG_TOKEN_LOG=

# No credentials or proxies of the machine's user may leak into a test.
export HOME=$SCRATCH/home
mkdir -p "$HOME"
unset DOCKER_CONFIG REGISTRY_AUTH_FILE XDG_RUNTIME_DIR
unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY all_proxy ALL_PROXY no_proxy NO_PROXY

reg_stop_all() {
	local p i
	[ ${#REG_PIDS[@]} -gt 0 ] || return 0
	kill -TERM "${REG_PIDS[@]}" 2>/dev/null
	for i in $(seq 30); do
		for p in "${REG_PIDS[@]}"; do
			kill -0 "$p" 2>/dev/null && break
			p=
		done
		[ -z "$p" ] && break
		sleep 0.1
	done
	kill -KILL "${REG_PIDS[@]}" 2>/dev/null
	wait "${REG_PIDS[@]}" 2>/dev/null
	REG_PIDS=()
}
# Stop our servers first, then run whatever lib/common.sh trapped on EXIT.
_reg_prev_exit=
eval "_reg_prev_exit=$(trap -p EXIT | sed -e 's/^trap -- //' -e 's/ EXIT$//')"
trap "trap '' INT TERM; reg_stop_all; $_reg_prev_exit" EXIT

reg_free_port() {
	python3 -c '
import socket
while True:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    if p != 5000:
        print(p)
        break'
}

# reg_spawn LOGFILE CMD...: CMD in the background; its pid in REG_PID.
reg_spawn() {
	local log=$1
	shift
	"$@" </dev/null >"$log" 2>&1 &
	REG_PID=$!
	REG_PIDS+=("$REG_PID")
}

# Wait (at most SECS) until URL answers any HTTP status, while PID lives.
reg_wait_http() { # URL PID SECS
	python3 - "$@" <<'EOF'
import os, sys, time, urllib.request, urllib.error
url, pid, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
end = time.monotonic() + secs
while time.monotonic() < end:
    try:
        os.kill(pid, 0)
    except OSError:
        sys.exit("process %d exited" % pid)
    try:
        urllib.request.urlopen(url, timeout=2).close()
        sys.exit(0)
    except urllib.error.HTTPError:
        sys.exit(0)
    except OSError:
        time.sleep(0.1)
sys.exit("%s: no answer after %s s" % (url, secs))
EOF
}

# Wait (at most SECS) for a port file written by a server.
reg_wait_file() { # FILE PID SECS
	local i
	for i in $(seq $(($3 * 10))); do
		[ -s "$1" ] && return 0
		kill -0 "$2" 2>/dev/null || return 1
		sleep 0.1
	done
	return 1
}

# tls_pki: in $PKI a CA (ca.pem) and, signed by it, server certificates
# (NAME.pem, NAME.key; SAN DNS entries) for registry.ferry.test and
# other.ferry.test.
tls_pki() {
	mkdir -p "$PKI" && (
		cd "$PKI" || exit 1
		openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key \
			-out ca.pem -days 2 -subj "/CN=ferry test CA" \
			-addext basicConstraints=critical,CA:TRUE \
			-addext keyUsage=critical,keyCertSign,cRLSign || exit 1
		for n in registry.ferry.test other.ferry.test; do
			printf '%s\n' "subjectAltName=DNS:$n" \
				basicConstraints=CA:FALSE \
				extendedKeyUsage=serverAuth >"$n.ext"
			openssl req -newkey rsa:2048 -nodes -keyout "$n.key" \
				-out "$n.csr" -subj "/CN=$n" &&
				openssl x509 -req -in "$n.csr" -CA ca.pem \
					-CAkey ca.key -CAcreateserial -days 2 \
					-extfile "$n.ext" -out "$n.pem" || exit 1
		done
	)
}

# The token issuer's key and certificate, made once per script.
reg_token_keys() {
	[ -s "$SCRATCH/tok.crt" ] && return 0
	openssl req -x509 -newkey rsa:2048 -nodes -keyout "$SCRATCH/tok.key" \
		-out "$SCRATCH/tok.crt" -days 3650 -subj /CN=ferry-test-issuer \
		>"$SCRATCH/openssl.log" 2>&1
}

reg_start() { # anon|basic|token [tokenserver args]
	local mode=$1 d auth='' port try tls='' log
	shift
	REG_N=$((REG_N + 1))
	d=$SCRATCH/reg$REG_N
	mkdir -p "$d/storage"
	REG_DIR=$d
	REG_USER=
	REG_PASS=
	REG_TOKEN_LOG=
	case $mode in
	anon) ;;
	basic)
		htpasswd -Bbn "$REG_TEST_USER" "$REG_TEST_PASS" >"$d/htpasswd" || return 1
		auth="auth: {htpasswd: {realm: ferry-basic, path: $d/htpasswd}}"
		;;
	token)
		reg_token_keys || { cat "$SCRATCH/openssl.log" >&2; return 1; }
		REG_TOKEN_LOG=$d/token.log
		: >"$REG_TOKEN_LOG"
		reg_spawn "$d/tokenserver.out" python3 "$TOKENSERVER" \
			--key "$SCRATCH/tok.key" --cert "$SCRATCH/tok.crt" \
			--port-file "$d/token.port" --log "$REG_TOKEN_LOG" \
			--user "$REG_TEST_USER:$REG_TEST_PASS" \
			--user "$REG_RO_USER:$REG_RO_PASS:ro" \
			--refresh-token "$REG_REFRESH=$REG_TEST_USER" \
			--anon-pull public/ "$@"
		if ! reg_wait_file "$d/token.port" "$REG_PID" 10; then
			echo "tokenserver did not start:" >&2
			cat "$d/tokenserver.out" >&2
			return 1
		fi
		REG_REALM=http://${REG_REALM_HOST:-127.0.0.1}:$(cat "$d/token.port")/token
		auth="auth: {token: {realm: \"$REG_REALM\", service: ferry-test-registry,
  issuer: ferry-test-issuer, rootcertbundle: $SCRATCH/tok.crt}}"
		;;
	*)
		echo "reg_start: unknown mode $mode" >&2
		return 2
		;;
	esac
	[ -n "${REG_TLS_CERT:-}" ] &&
		tls=", tls: {certificate: $REG_TLS_CERT, key: $REG_TLS_KEY${REG_TLS_CLIENT_CA:+, clientcas: [$REG_TLS_CLIENT_CA]}}"
	# A port found free may be taken before the registry binds it: retry.
	log="{level: warn, accesslog: {disabled: true}}"
	[ -n "${REG_ACCESS_LOG:-}" ] && log="{level: info, formatter: text}"
	for try in 1 2 3; do
		port=${REG_PORT:-$(reg_free_port)} || return 1
		cat >"$d/config.yml" <<EOF
version: 0.1
log: $log
storage:
  filesystem: {rootdirectory: $d/storage}
  delete: {enabled: true}
http: {addr: 127.0.0.1:$port, secret: ferry-test-secret$tls}
$auth
EOF
		reg_spawn "$d/registry.log" docker-registry serve "$d/config.yml"
		if reg_wait_http "http://127.0.0.1:$port/v2/" "$REG_PID" 10 2>>"$d/start.log"; then
			REG=127.0.0.1:$port
			REG_REGISTRY_PID=$REG_PID
			[ "$mode" != anon ] && REG_USER=$REG_TEST_USER REG_PASS=$REG_TEST_PASS
			export REG REG_DIR REG_USER REG_PASS REG_TOKEN_LOG
			return 0
		fi
		kill "$REG_PID" 2>/dev/null
	done
	echo "docker-registry did not start:" >&2
	tail -n 20 "$d/registry.log" "$d/start.log" >&2
	return 1
}

# The file where the registry keeps a blob (an oracle independent of any
# client).
reg_stored_blob() { # DIGEST
	local h=${1#sha256:}
	echo "$REG_DIR/storage/docker/registry/v2/blobs/sha256/${h:0:2}/$h/data"
}

reg_push_oci() { # LAYOUT[:TAG] REF
	local creds=()
	[ -n "$REG_USER" ] && creds=(--dest-creds "$REG_USER:$REG_PASS")
	skopeo copy --quiet --dest-tls-verify=false "${creds[@]}" "oci:$1" "docker://$2"
}

# Uploads to an anonymous $REG without regclient (test setup).
reg_put_blob() { # REPO FILE
	python3 - "$REG" "$@" <<'EOF'
import hashlib, sys, urllib.request
reg, repo, path = sys.argv[1:]
data = open(path, "rb").read()
dg = "sha256:" + hashlib.sha256(data).hexdigest()
r = urllib.request.urlopen(urllib.request.Request(
    "http://%s/v2/%s/blobs/uploads/" % (reg, repo), data=b"", method="POST"), timeout=30)
loc = r.headers["Location"]
if loc.startswith("/"):
    loc = "http://" + reg + loc
loc += ("&" if "?" in loc else "?") + "digest=" + dg
r = urllib.request.urlopen(urllib.request.Request(
    loc, data=data, method="PUT",
    headers={"Content-Type": "application/octet-stream"}), timeout=60)
sys.exit(0 if r.status == 201 else 1)
EOF
}

reg_put_manifest() { # REPO REF MEDIATYPE FILE
	python3 - "$REG" "$@" <<'EOF'
import sys, urllib.request
reg, repo, ref, mt, path = sys.argv[1:]
r = urllib.request.urlopen(urllib.request.Request(
    "http://%s/v2/%s/manifests/%s" % (reg, repo, ref), data=open(path, "rb").read(),
    method="PUT", headers={"Content-Type": mt}), timeout=30)
sys.exit(0 if r.status == 201 else 1)
EOF
}

# Test image files in DIR: config.json, layer1.tar (small files), big.tar
# (a tar around BIG_MB MiB of random data), manifest.json (an OCI image
# manifest of the three), and DIR/vars defining CFG_D CFG_S L1_D L1_S
# BIG_D BIG_S MAN_D MAN_S (digests and sizes).
reg_mkimage() { # DIR BIG_MB
	mkdir -p "$1"
	python3 - "$1" "$2" <<'EOF' || return 1
import hashlib, io, json, os, sys, tarfile
d, big_mb = sys.argv[1], int(sys.argv[2])

def tar(path, files):
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as t:
        for name, data in files:
            ti = tarfile.TarInfo(name)
            ti.size, ti.mode, ti.mtime = len(data), 0o644, 1700000000
            t.addfile(ti, io.BytesIO(data))

def desc(mt, path):
    data = open(path, "rb").read()
    return {"mediaType": mt, "digest": "sha256:" + hashlib.sha256(data).hexdigest(),
            "size": len(data)}

tar(d + "/layer1.tar", [("hello.txt", b"hello from ferry\n"),
                        ("data.bin", os.urandom(300 * 1024 + 17))])
tar(d + "/big.tar", [("big.bin", os.urandom(big_mb * 1024 * 1024 + 12345))])
LT = "application/vnd.oci.image.layer.v1.tar"
l1, big = desc(LT, d + "/layer1.tar"), desc(LT, d + "/big.tar")
cfg = {"architecture": "amd64", "os": "linux", "created": "2023-11-14T22:13:20Z",
       "config": {"Cmd": ["/bin/sh"]},
       "rootfs": {"type": "layers", "diff_ids": [l1["digest"], big["digest"]]}}
open(d + "/config.json", "w").write(json.dumps(cfg, indent=2) + "\n")
c = desc("application/vnd.oci.image.config.v1+json", d + "/config.json")
man = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
       "config": c, "layers": [l1, big],
       "annotations": {"org.opencontainers.image.title": "ferry registry test"}}
open(d + "/manifest.json", "w").write(json.dumps(man, indent=3) + "\n")
m = desc("", d + "/manifest.json")
with open(d + "/vars", "w") as f:
    for k, v in (("CFG", c), ("L1", l1), ("BIG", big), ("MAN", m)):
        f.write("%s_D=%s\n%s_S=%d\n" % (k, v["digest"], k, v["size"]))
EOF
	# shellcheck disable=SC1091
	. "$1/vars"
}

# LEN bytes of FILE at OFF, to stdout.
reg_slice() { # FILE OFF LEN
	python3 -c 'import sys
f = open(sys.argv[1], "rb"); f.seek(int(sys.argv[2]))
sys.stdout.buffer.write(f.read(int(sys.argv[3])))' "$@"
}

# An OCI layout made by umoci (one layer of a small tree), tag "t".
reg_umoci_layout() { # LAYOUT
	local src=$SCRATCH/umoci-src
	rm -rf "$src" "$1"
	mkdir -p "$src/etc" "$src/bin"
	echo "made by umoci for ferry" >"$src/etc/motd"
	head -c 200000 /dev/urandom >"$src/bin/blob"
	ln -s motd "$src/etc/link"
	umoci init --layout "$1" && umoci new --image "$1:t" &&
		umoci insert --image "$1:t" "$src" /data &&
		umoci config --image "$1:t" --config.cmd /bin/true
}

# ---------------------------------------------------------------- proxy

fp_start() { # [faultproxy args]
	local d=$SCRATCH/fp$REG_N.$RANDOM
	mkdir -p "$d"
	FP_LOG=$d/requests.log
	reg_spawn "$d/faultproxy.out" python3 "$FAULTPROXY" --upstream "$REG" \
		--port-file "$d/port" --log "$FP_LOG" "$@"
	if ! reg_wait_file "$d/port" "$REG_PID" 10; then
		echo "faultproxy did not start:" >&2
		cat "$d/faultproxy.out" >&2
		return 1
	fi
	PROXY=127.0.0.1:$(cat "$d/port")
	FP_PID=$REG_PID
	export PROXY
}

# The WAN proxy (tests/tools/wanproxy.py) in front of the registry (or of
# UPSTREAM, host:port): DELAY ms each way, RATE Mbit/s; sets WAN
# (host:port) and WAN_STATS (its statistics port).
wp_start() { # DELAY RATE [UPSTREAM]
	local d=$SCRATCH/wp$REG_N.$RANDOM
	mkdir -p "$d"
	reg_spawn "$d/wanproxy.out" python3 "$WANPROXY" --upstream "${3:-$REG}" \
		--port-file "$d/port" --stats-port-file "$d/stats" \
		--delay-ms "$1" --rate-mbit "$2"
	if ! reg_wait_file "$d/port" "$REG_PID" 10; then
		echo "wanproxy did not start:" >&2
		cat "$d/wanproxy.out" >&2
		return 1
	fi
	WAN=127.0.0.1:$(cat "$d/port")
	WAN_STATS=$(cat "$d/stats")
}

# One of the WAN proxy's counters (wanproxy.py); with reset, all of them
# are zeroed first.
wp_stat() { # KEY [reset]
	python3 "$WANPROXY" --query "$WAN_STATS" ${2:+--reset} "$1"
}

# GET a control path of the proxy with k=v query parameters; JSON to
# stdout. Fails on a non-200 answer.
fp_ctl() { # PATH [k=v]...
	python3 - "$PROXY" "$@" <<'EOF'
import sys, urllib.parse, urllib.request
proxy, path, kv = sys.argv[1], sys.argv[2], sys.argv[3:]
q = urllib.parse.urlencode([tuple(a.split("=", 1)) for a in kv])
with urllib.request.urlopen("http://%s%s?%s" % (proxy, path, q), timeout=10) as r:
    sys.stdout.write(r.read().decode())
EOF
}

fp_set() { # MODE [k=v]...   e.g. fp_set 500 count=2 method=GET path=/blobs/
	local m=$1
	shift
	fp_ctl /__fault "mode=$m" "$@" >/dev/null
}
fp_redirect() { fp_ctl /__redirect "$@" >/dev/null; } # on=1 uses=1 ttl=0
fp_reset() { fp_ctl /__reset >/dev/null; }
fp_stat() { # COUNTER: its value (0 when never counted)
	fp_ctl /__stats | python3 -c 'import json,sys; print(json.load(sys.stdin)["counters"].get(sys.argv[1], 0))' "$1"
}
# The proxy's request log since the last fp_reset, one line per request.
fp_log() {
	fp_ctl /__stats | python3 -c '
import json, sys
for e in json.load(sys.stdin)["log"]:
    print("%s %s range=%s fault=%s -> %s%s" % (e["method"], e["path"], e["range"], e["fault"],
          e.get("status"), " x=" + e["x"] if e.get("x") else ""))'
}
# The proxy's request log has a line matching an extended regex.
fp_log_has() { fp_log | grep -E -- "$1" >/dev/null; }

# -------------------------------------------------------------- regclient

# rc NAME ARGS...: run regclient; stdout in $RC_OUT, stderr in $RC_ERR
# ($SCRATCH/rc/NAME.{out,err}); exit status in RC_RC, wall time in RC_MS.
rc() {
	local name=$1 t0
	shift
	mkdir -p "$SCRATCH/rc"
	RC_OUT=$SCRATCH/rc/$name.out
	RC_ERR=$SCRATCH/rc/$name.err
	RC_CMD="regclient $*"
	t0=$(date +%s%N)
	"$REGCLIENT" "$@" >"$RC_OUT" 2>"$RC_ERR"
	RC_RC=$?
	RC_MS=$((($(date +%s%N) - t0) / 1000000))
	if sanitizer_report "$RC_ERR"; then
		RC_RC=86
	fi
	return 0
}

# rc_expect DESC CMD...: ok when CMD succeeds; otherwise not ok with the
# last regclient run (command, exit, time, stderr).
rc_expect() {
	local desc=$1
	shift
	if [ "$RC_RC" -ne 86 ] && "$@"; then
		ok "$desc"
		return 0
	fi
	notok "$desc"
	echo "    command: $RC_CMD (exit $RC_RC, ${RC_MS} ms)"
	diag "$RC_ERR" 12
	return 1
}

rc_ok() { [ "$RC_RC" -eq 0 ]; }
# regclient failed as an error (exit 1), not a crash or a usage error.
rc_failed() { [ "$RC_RC" -eq 1 ]; }
# Last run exited 0 and its stdout is FILE's bytes.
rc_out_is() { [ "$RC_RC" -eq 0 ] && cmp -s "$RC_OUT" "$1"; }
# A value of the "--stats" line of the last run (empty when absent).
rc_stat() { # requests|retries|bytes_down|bytes_up
	sed -n "s/.*\\b$1=\\([0-9][0-9]*\\).*/\\1/p" "$RC_ERR" | tail -n 1
}
# stderr of the last run matches an extended regex (any case).
rc_err_has() { grep -qiE -- "$1" "$RC_ERR"; }
