#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# shellcheck disable=SC2016 # expect_sh conditions are single-quoted on purpose
# Every registry option of ferry mount --mode fuse and --mode fanotify
# reaches ferryd (over the control socket) and takes effect there, for the
# mount and for the lazy reads after it. Each positive mount reads a file
# back; each negative one drops one option and must fail for that reason:
#   - a TLS registry with Basic auth and a self-signed certificate for a
#     made-up name, reached only through --resolve NAME:PORT:127.0.0.1:
#     --ca-file (without it: a TLS error), --tls-verify=false, --creds
#     (without: access denied), --authfile
#   - an anonymous plain-http registry behind tests/tools/faultproxy.py:
#     --registry-mirror (the blob reads go to the mirror: the proxy's log),
#     --retries (one 503 on the manifest: --retries 1 fails, the default
#     retries), --stall-timeout (a 3 s stall fails with 1 s, a 2 s one
#     passes with 5 s), --request-timeout (a trickled read fails with EIO
#     well before the default 60 s deadline), --insecure-registry (the
#     registry by a made-up name: https without it, which the plain port
#     refuses)
E2E_TIMEOUT=${E2E_TIMEOUT:-240}
. "$(dirname "$0")/../lib/common.sh"
. "$(dirname "$0")/../lib/registry.sh"
. "$(dirname "$0")/../lib/lazy.sh"
need_ferryd
need_cmds docker-registry openssl htpasswd python3 cmp

NAME=ferry-test.invalid  # never resolvable: only --resolve reaches it
PLAIN=ferry-plain.invalid
export FERRY_CACHE_DIR=$CACHE
lazy_use regopts

# A docker-registry with Basic auth serving https with a certificate
# self-signed for $NAME. Sets TLS_PORT and CA.
tls_start() {
	CA=$SCRATCH/cert.pem
	openssl req -x509 -newkey rsa:2048 -nodes -keyout "$SCRATCH/key.pem" -out "$CA" \
		-days 2 -subj "/CN=$NAME" -addext "subjectAltName=DNS:$NAME" &&
		REG_TLS_CERT=$CA REG_TLS_KEY=$SCRATCH/key.pem reg_start basic &&
		TLS_PORT=${REG##*:}
}

# A small tree: the file read back through every mount.
TREE=$SCRATCH/tree
mkdir -p "$TREE/etc" "$TREE/data"
echo "ferry mount registry options" >"$TREE/etc/motd"
head -c 3000000 /dev/urandom >"$TREE/data/random.bin"

if ! tls_start >"$LOG" 2>&1; then
	notok "$E2E_NAME: start a TLS docker-registry with Basic auth"
	diag "$LOG"
	e2e_done
fi
T=$NAME:$TLS_PORT
TIMG=docker://$T/t/x:1
RES=(--resolve "$T:127.0.0.1")
CREDS=(--creds "$REG_TEST_USER:$REG_TEST_PASS")
check "convert to the TLS registry (--resolve --ca-file --creds)" \
	"$FERRY" convert -q "dir:$TREE" "$TIMG" "${RES[@]}" --ca-file "$CA" "${CREDS[@]}" ||
	e2e_done
python3 - "$SCRATCH/auth.json" "$T" "$REG_TEST_USER:$REG_TEST_PASS" <<'EOF'
import base64, json, sys
json.dump({"auths": {sys.argv[2]: {"auth": base64.b64encode(sys.argv[3].encode()).decode()}}},
          open(sys.argv[1], "w"))
EOF

if ! reg_start anon 2>"$LOG" || ! fp_start 2>>"$LOG"; then
	notok "$E2E_NAME: start docker-registry and the fault proxy"
	diag "$LOG"
	e2e_done
fi
check "convert to the plain registry" "$FERRY" convert -q "dir:$TREE" "docker://$REG/t/x:1" ||
	e2e_done
IMG=docker://$REG/t/x:1
PIMG=docker://$PROXY/t/x:1
P=$PLAIN:${REG##*:}
NIMG=docker://$P/t/x:1
echo "# TLS registry $T, plain registry $REG (also as $P), proxy $PROXY"

N=0
# rmount MODE IMAGE [ARGS]: ferry mount on a fresh mount point ($M) and
# cache, so that every mount goes to the registry.
rmount() {
	local mode=$1 img=$2
	shift 2
	N=$((N + 1))
	M=$SCRATCH/m$N
	FCACHE=$SCRATCH/cache$N
	mkdir -p "$FCACHE"
	mount_lazy "$mode" "$img" "$M" "$@"
}

# mount_ok MODE DESC IMAGE [ARGS]: the mount works, its file reads back
# (fetched lazily, with the same options) and it unmounts.
mount_ok() {
	local mode=$1 desc="$1: $2" img=$3
	shift 3
	check "$desc" rmount "$mode" "$img" "$@" || return 1
	check "$desc: the file reads back" cmp "$TREE/data/random.bin" "$M/data/random.bin"
	check "$desc: umount" umount_lazy "$M"
}

# mount_fails MODE DESC REGEX IMAGE [ARGS]: ferry mount exits 1 with a
# message matching REGEX (any case), nothing mounted.
mount_fails() {
	local mode=$1 desc="$1: $2" re=$3 img=$4
	shift 4
	check_exit "$desc: exit 1" 1 rmount "$mode" "$img" "$@"
	expect "$desc: the message says why" grep -qiE -- "$re" "$LOG" || diag "$LOG" 5
	if is_mounted "$M"; then
		notok "$desc: nothing mounted"
		umount_lazy "$M"
	fi
}

for mode in fuse fanotify; do
	# --- TLS, credentials, --resolve -----------------------------------------
	mount_ok $mode "--resolve --ca-file --creds" "$TIMG" "${RES[@]}" --ca-file "$CA" "${CREDS[@]}"
	mount_fails $mode "without --ca-file" 'tls|certificate' \
		"$TIMG" "${RES[@]}" "${CREDS[@]}"
	mount_ok $mode "--tls-verify=false (self-signed, no CA)" "$TIMG" "${RES[@]}" \
		--tls-verify=false "${CREDS[@]}"
	mount_fails $mode "without credentials" 'denied|401|unauthorized' \
		"$TIMG" "${RES[@]}" --ca-file "$CA"
	mount_ok $mode "--authfile" "$TIMG" "${RES[@]}" --ca-file "$CA" --authfile "$SCRATCH/auth.json"

	# --- --insecure-registry: the plain registry by a made-up name ----------------
	mount_fails $mode "a plain registry by name without --insecure-registry" \
		'tls handshake|wrong version' "$NIMG" --resolve "$P:127.0.0.1" --retries 1
	mount_ok $mode "--insecure-registry" "$NIMG" --resolve "$P:127.0.0.1" \
		--insecure-registry "$P"

	# --- --registry-mirror -----------------------------------------------------
	if check "$mode: --registry-mirror" rmount $mode "$IMG" --registry-mirror "$REG=http://$PROXY"; then
		fp_reset
		check "$mode: --registry-mirror: the file reads back" \
			cmp "$TREE/data/random.bin" "$M/data/random.bin"
		expect "$mode: --registry-mirror: the mirror served the blob reads" \
			fp_log_has '^GET /v2/t/x/blobs/sha256:[0-9a-f]{64}\?ns=[^ ]+ .*-> 20[06]'
		check "$mode: --registry-mirror: umount" umount_lazy "$M"
	fi

	# --- --retries: one 503 on the manifest ----------------------------------------
	fp_reset
	fp_set 503 count=1 "method=^GET$" path=/manifests/
	mount_fails $mode "--retries 1, one 503" '503' "$PIMG" --retries 1
	fp_reset
	fp_set 503 count=1 "method=^GET$" path=/manifests/
	mount_ok $mode "default retries, one 503" "$PIMG"
	expect_sh "$mode: default retries: the 503 was served ($(fp_stat faults))" \
		'[ "$(fp_stat faults)" -eq 1 ]'

	# --- what a cold mount asks before it is served ------------------------------
	fp_reset
	if check "$mode: a cold mount through the proxy" rmount $mode "$PIMG"; then
		# No /v2/ ping and no config: the manifest and the bootstrap only.
		expect_sh "$mode: a cold mount: the manifest and one blob, nothing else" \
			'[ "$(fp_log | grep -cE "^GET /v2/t/x/manifests/1 .*-> 200")" = 1 ] &&
			 [ "$(fp_log | grep -cE "^GET /v2/t/x/blobs/sha256:[0-9a-f]{64} .*-> 200")" = 1 ] &&
			 [ "$(fp_log | wc -l)" = 2 ]' || fp_log | sed 's/^/    /'
		check "$mode: a cold mount: umount" umount_lazy "$M"
	fi

	# --- --stall-timeout: every blob GET stalls mid-body ---------------------------
	fp_set stall count=-1 "method=^GET$" path=/blobs/ delay=3
	mount_fails $mode "--stall-timeout 1, 3 s stalls" 'timeout was reached|timed out|too slow' \
		"$PIMG" --stall-timeout 1 --retries 1
	fp_set stall count=-1 "method=^GET$" path=/blobs/ delay=2
	if check "$mode: --stall-timeout 5, 2 s stalls" \
		rmount $mode "$PIMG" --stall-timeout 5 --retries 1; then
		fp_set none
		check "$mode: --stall-timeout 5: the file reads back" \
			cmp "$TREE/data/random.bin" "$M/data/random.bin"
		check "$mode: --stall-timeout 5: umount" umount_lazy "$M"
	fi
	fp_set none

	# --- --request-timeout: every blob GET trickles after the mount --------------
	if check "$mode: --request-timeout 2" rmount $mode "$PIMG" --request-timeout 2; then
		fp_set trickle count=-1 rate=20000 "method=^GET$" path=/blobs/
		read_expect_eio "$mode: --request-timeout 2: a trickled read fails by it (not 60 s)" \
			"$M/data/random.bin" "$TREE/data/random.bin" 20
		fp_set none
		check "$mode: --request-timeout 2: umount" umount_lazy "$M"
	fi
done

# The control: without --registry-mirror the proxy sees nothing.
fp_reset
if check "fuse: without --registry-mirror" rmount fuse "$IMG"; then
	check "fuse: without --registry-mirror: the file reads back" \
		cmp "$TREE/data/random.bin" "$M/data/random.bin"
	expect "fuse: without --registry-mirror: the proxy saw no request" \
		eval '[ -z "$(fp_log)" ]'
	check "fuse: without --registry-mirror: umount" umount_lazy "$M"
fi

# ferryd parsed every request above: stopped, its log has no sanitizer
# report (leaks are checked at its exit).
# shellcheck disable=SC2046 # one pid per word
ferryd_stop $(daemon_pids)
expect "ferryd's log has no sanitizer report" eval '! sanitizer_report "$FLOG"' ||
	diag "$FLOG" 20

e2e_done
