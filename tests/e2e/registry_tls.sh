#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The registry client over TLS: docker-registry serving https on
# 127.0.0.1 with a certificate for registry.ferry.test from a test CA made
# here by openssl; clients reach it by name through --resolve
# registry.ferry.test:PORT:127.0.0.1 (the URL, Host header and certificate
# check keep the name). Checked with regclient and with ferry (convert to
# docker://, inspect, check): verification is on by default and fails
# clearly (exit 1, naming the registry) without the CA; --ca-file makes it
# work, and so does --tls-verify=false without it; a certificate for
# another name fails even with the CA; --insecure-registry against a
# TLS-only registry fails clearly (plain http is refused; there is no
# fallback to https); Basic auth over TLS; malformed --resolve entries are
# usage errors. Last, the levels of retry messages (plain http through
# tests/tools/faultproxy.py): a failure that a retry overcomes is a
# warning, never "error:", and only a final failure is an error.
# shellcheck disable=SC2016 # conditions for eval are single-quoted on purpose
E2E_TIMEOUT=${E2E_TIMEOUT:-120}
. "$(dirname "$0")/../lib/common.sh"
. "$(dirname "$0")/../lib/registry.sh"
need_cmds docker-registry openssl htpasswd python3
need_tool "$REGCLIENT"
need_ferry

NAME=registry.ferry.test
PKI=$SCRATCH/pki
export FERRY_CACHE_DIR=$CACHE

# tls_start anon|basic CERTNAME: reg_start's docker-registry serving https
# with CERTNAME's certificate; sets TLS_PORT, TLS_DIR; the access log is
# on (it shows the Host).
tls_start() {
	REG_ACCESS_LOG=1 REG_TLS_CERT=$PKI/$2.pem REG_TLS_KEY=$PKI/$2.key reg_start "$1" &&
		TLS_PORT=${REG##*:} TLS_DIR=$REG_DIR
}

if ! tls_pki >"$LOG" 2>&1; then
	notok "$E2E_NAME: make the test CA and certificates"
	diag "$LOG"
	e2e_done
fi
if ! tls_start anon "$NAME" 2>"$LOG"; then
	notok "$E2E_NAME: start a TLS docker-registry"
	diag "$LOG"
	e2e_done
fi
A=$NAME:$TLS_PORT
# shellcheck disable=SC2034 # used in an eval
A_LOG=$TLS_DIR/registry.log
RA=(--resolve "$A:127.0.0.1")
echo "# TLS registry $A at 127.0.0.1"

# Test data: a blob for regclient, a small tree for ferry.
head -c 300000 /dev/urandom >"$SCRATCH/blob.bin"
BLOB_D=sha256:$(sha256sum <"$SCRATCH/blob.bin" | cut -d' ' -f1)
BLOB_S=$(stat -c %s "$SCRATCH/blob.bin")
TREE=$SCRATCH/tree
mkdir -p "$TREE/etc" "$TREE/data"
echo "served over TLS" >"$TREE/etc/motd"
head -c 700000 /dev/urandom >"$TREE/data/random.bin"
ln -s motd "$TREE/etc/link"

# The last run failed with a TLS verification message naming the registry.
tls_refused() { # FILE REGISTRY
	grep -qiE 'tls|certificate' "$1" && grep -qF "$2" "$1"
}

# --- regclient -----------------------------------------------------------------
rc push-noca "${RA[@]}" push-blob "$A/t/rc" "$SCRATCH/blob.bin"
rc_expect "regclient without --ca-file: verification is on, exit 1" rc_failed
rc_expect "regclient without --ca-file: a TLS certificate error naming $A" \
	tls_refused "$RC_ERR" "$A"
rc_expect "regclient without --ca-file: fails fast (${RC_MS} ms)" test "$RC_MS" -lt 10000

rc push "${RA[@]}" --ca-file "$PKI/ca.pem" push-blob "$A/t/rc" "$SCRATCH/blob.bin"
rc_expect "regclient --ca-file: push-blob over TLS" grep -qx "$BLOB_D uploaded" "$RC_OUT"
rc blob "${RA[@]}" --ca-file "$PKI/ca.pem" blob "$A/t/rc" "$BLOB_D" "$BLOB_S"
rc_expect "regclient --ca-file: the blob streams back" rc_out_is "$SCRATCH/blob.bin"
rc range "${RA[@]}" --ca-file "$PKI/ca.pem" range "$A/t/rc" "$BLOB_D" 1000 5000
reg_slice "$SCRATCH/blob.bin" 1000 5000 >"$SCRATCH/range.want"
rc_expect "regclient --ca-file: a range reads back" rc_out_is "$SCRATCH/range.want"
rc_expect "the registry saw Host: $A, never the address" \
	eval 'grep -qF "http.request.host=\"$A\"" "$A_LOG" &&
		! grep -q "http.request.host=\"127\." "$A_LOG"'

rc noverify "${RA[@]}" --tls-verify=false getblob "$A/t/rc" "$BLOB_D" "$BLOB_S"
rc_expect "regclient --tls-verify=false without the CA: the blob reads" \
	rc_out_is "$SCRATCH/blob.bin"

rc noresolve --retries 1 --connect-ms 5000 --ca-file "$PKI/ca.pem" tags "$A/t/rc"
rc_expect "without --resolve the name does not resolve (exit 1)" \
	eval 'rc_failed && rc_err_has "resolve"'

rc insecure "${RA[@]}" --insecure "$A" tags "$A/t/rc"
rc_expect "regclient --insecure against a TLS-only registry: exit 1" rc_failed
rc_expect "regclient --insecure: says the registry speaks https only" \
	eval 'rc_err_has "https only" && grep -qF "$A" "$RC_ERR"'

rc badres --resolve "$NAME:0:127.0.0.1" tags "$A/t/rc"
rc_expect "regclient --resolve with port 0: usage error (exit 2)" \
	eval '[ "$RC_RC" -eq 2 ] && rc_err_has "resolve.*$NAME:0:127.0.0.1"'
rc badres2 --resolve "$NAME:$TLS_PORT:localhost" tags "$A/t/rc"
rc_expect "regclient --resolve with a name as ADDRESS: usage error (exit 2)" \
	eval '[ "$RC_RC" -eq 2 ] && rc_err_has "ADDRESS"'

# --- ferry ---------------------------------------------------------------------
IMG=docker://$A/t/x:1
check_exit "ferry convert to docker:// without --ca-file: exit 1" 1 \
	"$FERRY" convert -q "dir:$TREE" "$IMG" "${RA[@]}"
expect "ferry convert without --ca-file: a TLS certificate error naming $A" \
	tls_refused "$LOG" "$A"
check "ferry convert dir: -> docker:// over TLS with --ca-file" \
	"$FERRY" convert -q "dir:$TREE" "$IMG" "${RA[@]}" --ca-file "$PKI/ca.pem"
check "ferry convert dir: -> dir: (the same tree, locally)" \
	"$FERRY" convert -q "dir:$TREE" "dir:$SCRATCH/local"
if check "ferry inspect --json docker:// with --ca-file" \
	"$FERRY" inspect --json "$IMG" "${RA[@]}" --ca-file "$PKI/ca.pem"; then
	cp "$LOG" "$SCRATCH/inspect-remote.json"
	"$FERRY" inspect --json "dir:$SCRATCH/local" >"$SCRATCH/inspect-local.json" 2>&1
	expect "ferry inspect: the pushed image has the local image's bootstrap" \
		python3 -c 'import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
sys.exit(0 if a == b else 1)' "$SCRATCH/inspect-remote.json" "$SCRATCH/inspect-local.json"
fi
check "ferry check docker:// with --ca-file" \
	"$FERRY" check "$IMG" "${RA[@]}" --ca-file "$PKI/ca.pem"
expect "ferry check: every chunk verified" grep -q ': ok (' "$LOG"
check_exit "ferry check docker:// without --ca-file: exit 1" 1 \
	"$FERRY" check "$IMG" "${RA[@]}"
expect "ferry check without --ca-file: a TLS certificate error naming $A" \
	tls_refused "$LOG" "$A"
check_exit "ferry inspect docker:// without --ca-file: exit 1" 1 \
	"$FERRY" inspect "$IMG" "${RA[@]}"
check "ferry check --tls-verify=false without the CA" \
	"$FERRY" check "$IMG" "${RA[@]}" --tls-verify=false
check_exit "ferry --insecure-registry against a TLS-only registry: exit 1" 1 \
	"$FERRY" inspect "$IMG" "${RA[@]}" --insecure-registry "$A"
expect "ferry --insecure-registry: says the registry speaks https only" \
	eval 'grep -qi "https only" "$LOG" && grep -qF "$A" "$LOG"'
check_exit "ferry --resolve without an ADDRESS: usage error (exit 2)" 2 \
	"$FERRY" inspect "$IMG" --resolve "$A"
expect "ferry --resolve without an ADDRESS: the message names the entry" \
	grep -qF "\"$A\"" "$LOG"

# --- a certificate for another name -----------------------------------------------
if tls_start anon other.ferry.test 2>"$LOG"; then
	C=$NAME:$TLS_PORT
	RC=(--resolve "$C:127.0.0.1")
	rc wrongname "${RC[@]}" --ca-file "$PKI/ca.pem" tags "$C/t/rc"
	rc_expect "regclient: a certificate for another name fails even with the CA" rc_failed
	rc_expect "regclient: the message says the name does not match, naming $C" \
		eval 'tls_refused "$RC_ERR" "$C" && rc_err_has "name"'
	check "ferry convert to it with --tls-verify=false (the cert is only misnamed)" \
		"$FERRY" convert -q "dir:$TREE" "docker://$C/t/x:1" "${RC[@]}" --tls-verify=false
	check_exit "ferry check: a certificate for another name fails even with the CA" 1 \
		"$FERRY" check "docker://$C/t/x:1" "${RC[@]}" --ca-file "$PKI/ca.pem"
	expect "ferry check: the message says the name does not match, naming $C" \
		eval 'tls_refused "$LOG" "$C" && grep -qi name "$LOG"'
else
	notok "start a TLS docker-registry with a certificate for another name"
	diag "$LOG"
fi

# --- Basic auth over TLS ---------------------------------------------------------
if tls_start basic "$NAME" 2>"$LOG"; then
	B=$NAME:$TLS_PORT
	RB=(--resolve "$B:127.0.0.1" --ca-file "$PKI/ca.pem")
	CR=(--creds "$REG_TEST_USER:$REG_TEST_PASS")
	rc bpush "${RB[@]}" "${CR[@]}" push-blob "$B/t/b" "$SCRATCH/blob.bin"
	rc_expect "regclient Basic auth over TLS: push-blob" grep -qx "$BLOB_D uploaded" "$RC_OUT"
	rc bget "${RB[@]}" "${CR[@]}" getblob "$B/t/b" "$BLOB_D" "$BLOB_S"
	rc_expect "regclient Basic auth over TLS: the blob reads back" rc_out_is "$SCRATCH/blob.bin"
	rc bnone "${RB[@]}" getblob "$B/t/b" "$BLOB_D" "$BLOB_S"
	rc_expect "regclient over TLS without credentials: access denied (exit 1)" \
		eval 'rc_failed && rc_err_has "denied|401"'
	rc bwrong "${RB[@]}" --creds "$REG_TEST_USER:wrong" getblob "$B/t/b" "$BLOB_D" "$BLOB_S"
	rc_expect "regclient over TLS with a wrong password: access denied (exit 1)" \
		eval 'rc_failed && rc_err_has "denied|401"'
	rc_expect "regclient: the password is never logged" \
		eval '! grep -rqF "$REG_TEST_PASS" "$SCRATCH/rc"'
	check "ferry convert to docker:// with Basic auth over TLS" \
		"$FERRY" convert -q "dir:$TREE" "docker://$B/t/x:1" "${RB[@]}" "${CR[@]}"
	check "ferry check docker:// with Basic auth over TLS" \
		"$FERRY" check "docker://$B/t/x:1" "${RB[@]}" "${CR[@]}"
	check_exit "ferry check over TLS without credentials: exit 1" 1 \
		"$FERRY" check "docker://$B/t/x:1" "${RB[@]}"
	expect "ferry check without credentials: access denied, naming $B" \
		eval 'grep -qiE "denied|401" "$LOG" && grep -qF "$B" "$LOG"'
else
	notok "start a TLS docker-registry with Basic auth"
	diag "$LOG"
fi

# --- retry message levels (plain http, fault proxy) --------------------------------
if reg_start anon 2>"$LOG" && fp_start 2>>"$LOG"; then
	# One 503 on the monolithic PUT: retried, warned, never an error.
	fp_set 503 count=1 "method=^PUT$" path=/blobs/uploads/
	rc up503 --retries 3 push-blob "$PROXY/t/r1" "$SCRATCH/blob.bin"
	fp_set none
	rc_expect "a 503 on an upload, retried: uploaded" grep -qx "$BLOB_D uploaded" "$RC_OUT"
	rc_expect "a 503 on an upload, retried: a warning naming the blob" \
		grep -qE "^ferry: warning: .*upload of blob $BLOB_D: HTTP 503; retrying" "$RC_ERR"
	rc_expect "a 503 on an upload, retried: no error line" \
		eval '! grep -q "error:" "$RC_ERR"'
	rc_expect "a 503 on an upload, retried: no doubled word" \
		eval '! grep -qi "upload upload" "$RC_ERR"'
	# One 503 on a manifest GET (the per-request retry).
	fp_set 503 count=1 "method=^GET$" path=/manifests/
	rc get503 --retries 3 manifest "$PROXY/t/none:v1"
	fp_set none
	rc_expect "a 503 then 404 on a manifest GET: exit 1, one error (not found)" \
		eval 'rc_failed && [ "$(grep -c "error:" "$RC_ERR")" -eq 1 ] &&
			grep -q "error:.*not found" "$RC_ERR" &&
			grep -q "warning:.*HTTP 503; retrying" "$RC_ERR"'
	# Always 500: warnings while retries remain, then one error.
	fp_set 500 count=-1 "method=^PUT$" path=/blobs/uploads/
	rc up500 --retries 2 push-blob "$PROXY/t/r2" "$SCRATCH/blob.bin"
	fp_set none
	rc_expect "a permanent 500 on an upload: exit 1" rc_failed
	rc_expect "a permanent 500 on an upload: one warning, then one error naming the blob and 500" \
		eval '[ "$(grep -c "warning:.*retrying" "$RC_ERR")" -eq 1 ] &&
			[ "$(grep -c "error:" "$RC_ERR")" -eq 1 ] &&
			grep -qE "error: .*upload of blob $BLOB_D: .*500" "$RC_ERR"'
else
	notok "start docker-registry and the fault proxy"
	diag "$LOG"
fi

e2e_done
