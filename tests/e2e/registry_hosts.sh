#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Registry hosts (--registry-hosts FILE: containerd's hosts.toml as JSON;
# docs/registries.md), with ferry and a lazy ferryd mount:
# - a mirror with capabilities pull and resolve in front of an origin that
#   cannot be reached serves the tag: ferry inspect, and a lazy mount whose
#   files read back; the mirror is told the registry (?ns=). A pull-only
#   mirror does not resolve the tag (the unreachable origin is asked, and
#   fails) but serves the same image by digest.
# - a mirror that breaks off mid-blob (tests/tools/faultproxy.py:
#   reset_mid) hands the read to the origin from the byte it reached:
#   ferry check and a lazy mount read every byte right, no error, and a
#   conversion streaming whole layers through it gives the same image as
#   one straight from the registry.
# - a TLS mirror with a private CA named in its host entry ("ca") is
#   trusted; without it the TLS check fails. One that wants a client
#   certificate gets the host entry's (clientCert, clientKey; also as the
#   registry's own "server" entry, for a push); without it, it refuses.
#   A host entry's headers reach its host.
# - a malformed hosts file is a usage error naming the problem.
E2E_TIMEOUT=${E2E_TIMEOUT:-300}
. "$(dirname "$0")/../lib/common.sh"
. "$(dirname "$0")/../lib/registry.sh"
. "$(dirname "$0")/../lib/lazy.sh"
need_ferryd
need_cmds docker-registry openssl python3
export FERRY_CACHE_DIR=$CACHE

if ! reg_start anon 2>"$LOG"; then
	notok "$E2E_NAME: start docker-registry"
	diag "$LOG"
	e2e_done
fi
ORIGIN_REG=$REG
TREE=$SCRATCH/tree
mkdir -p "$TREE/etc" "$TREE/data"
echo "served by a mirror" >"$TREE/etc/motd"
head -c $((3 << 20)) /dev/urandom >"$TREE/data/random.bin"
DIGEST=$("$FERRY" convert --json --chunk-size 262144 "dir:$TREE" "docker://$REG/t/x:1" \
	2>"$LOG" | python3 -c 'import json,sys; print(json.load(sys.stdin)["manifestDigest"])')
if ! check "push the test image to $REG" test -n "$DIGEST"; then
	diag "$LOG"
	e2e_done
fi

# hosts_file FILE REGISTRY URL CAPS [EXTRA JSON]: one host entry.
hosts_file() {
	printf '{"hosts":[{"registry":"%s","url":"%s","capabilities":%s%s}]}\n' \
		"$2" "$3" "$4" "${5:+,$5}" >"$1"
}

# --- a mirror in front of an unreachable origin -------------------------------------
DEAD=$(reg_free_port)
ORIGIN=origin.ferry.test:$DEAD
NORES=(--resolve "$ORIGIN:127.0.0.1")
fp_start
hosts_file "$SCRATCH/pr.json" "$ORIGIN" "http://$PROXY" '["pull","resolve"]' \
	'"headers":["X-Ferry-Mirror: yes"]'
check "pull+resolve mirror, origin unreachable: ferry inspect of the tag" \
	"$FERRY" inspect "docker://$ORIGIN/t/x:1" "${NORES[@]}" \
	--registry-hosts "$SCRATCH/pr.json" --retries 1
expect "the mirror answered the tag and was told the registry" \
	fp_log_has "^GET /v2/t/x/manifests/1\\?ns=origin\\.ferry\\.test%3A$DEAD .*-> 200"
expect "the host's header went with it" \
	fp_log_has "^GET /v2/t/x/manifests/1.* x=X-Ferry-Mirror=yes"
lazy_use mirror
fp_reset
if check "pull+resolve mirror, origin unreachable: lazy ferry mount of the tag" \
	mount_lazy auto "docker://$ORIGIN/t/x:1" "$SCRATCH/m1" "${NORES[@]}" \
	--registry-hosts "$SCRATCH/pr.json" --retries 1; then
	check "the lazy mount reads back" cmp "$TREE/data/random.bin" "$SCRATCH/m1/data/random.bin"
	expect "the mirror served its blobs" \
		fp_log_has '^GET /v2/t/x/blobs/sha256:[0-9a-f]{64}\?ns=origin[^ ]* .*-> 20[06]'
	check "umount" umount_lazy "$SCRATCH/m1"
fi
hosts_file "$SCRATCH/p.json" "$ORIGIN" "http://$PROXY" '["pull"]'
check_exit "a pull-only mirror does not resolve tags (the origin is asked): exit 1" 1 \
	"$FERRY" inspect "docker://$ORIGIN/t/x:1" "${NORES[@]}" \
	--registry-hosts "$SCRATCH/p.json" --retries 1
check "... but serves the image by digest" \
	"$FERRY" inspect "docker://$ORIGIN/t/x@$DIGEST" "${NORES[@]}" \
	--registry-hosts "$SCRATCH/p.json" --retries 1

# --- a mirror that breaks off mid-blob -------------------------------------------
hosts_file "$SCRATCH/mid.json" "$ORIGIN_REG" "http://$PROXY" '["pull"]'
fp_reset
fp_set reset_mid count=2 method=GET 'path=/blobs/sha256:'
check "ferry check through a mirror that breaks off twice mid-blob" \
	"$FERRY" check "docker://$ORIGIN_REG/t/x:1" --registry-hosts "$SCRATCH/mid.json"
expect "the mirror did break off" test "$(fp_stat faults)" -ge 2
expect "ferry said so, and went on from the byte reached" \
	grep -q "broke off after .* asking the next host from byte" "$LOG"
# A whole layer streamed for a conversion: the same bytes as without it.
if ! { reg_mkimage "$SCRATCH/img" 4 &&
	reg_put_blob t/oci "$SCRATCH/img/layer1.tar" && reg_put_blob t/oci "$SCRATCH/img/big.tar" &&
	reg_put_blob t/oci "$SCRATCH/img/config.json" &&
	reg_put_manifest t/oci 1 "$OCI_MANIFEST" "$SCRATCH/img/manifest.json"; } >"$LOG" 2>&1; then
	notok "push an OCI image to $ORIGIN_REG"
	diag "$LOG"
fi
check "ferry convert straight from the registry" \
	"$FERRY" convert -q "docker://$ORIGIN_REG/t/oci:1" "dir:$SCRATCH/direct"
fp_reset
fp_set reset_mid count=2 method=GET 'path=/blobs/sha256:'
check "ferry convert through a mirror that breaks off twice mid-layer" \
	"$FERRY" convert -q "docker://$ORIGIN_REG/t/oci:1" "dir:$SCRATCH/mirrored" \
	--registry-hosts "$SCRATCH/mid.json"
expect "the mirror did break off (mid-layer)" test "$(fp_stat faults)" -ge 2
check "... the same image as straight from the registry" \
	cmp "$SCRATCH/direct/bootstrap" "$SCRATCH/mirrored/bootstrap"
lazy_use midblob
fp_reset
fp_set none
if check "lazy mount through that mirror" \
	mount_lazy auto "docker://$ORIGIN_REG/t/x:1" "$SCRATCH/m2" \
	--registry-hosts "$SCRATCH/mid.json"; then
	fp_set reset_mid count=3 method=GET 'path=/blobs/sha256:'
	check "every byte reads back, no error for the reader" \
		cmp "$TREE/data/random.bin" "$SCRATCH/m2/data/random.bin"
	expect "the mirror broke off during those reads" test "$(fp_stat faults)" -ge 1
	check "umount" umount_lazy "$SCRATCH/m2"
fi
fp_set none

# --- a TLS mirror with a private CA -----------------------------------------------
PKI=$SCRATCH/pki
if tls_pki >"$LOG" 2>&1; then
	REG_TLS_CERT=$PKI/registry.ferry.test.pem REG_TLS_KEY=$PKI/registry.ferry.test.key \
		reg_start anon 2>"$LOG" || { notok "start a TLS registry"; diag "$LOG"; }
	TLS=registry.ferry.test:${REG##*:}
	check "push the test image to the TLS mirror" \
		"$FERRY" convert -q --chunk-size 262144 "dir:$TREE" "docker://$TLS/t/x:1" \
		--resolve "$TLS:127.0.0.1" --ca-file "$PKI/ca.pem"
	hosts_file "$SCRATCH/ca.json" "$ORIGIN" "https://$TLS" '["pull","resolve"]' \
		"\"ca\":[\"$PKI/ca.pem\"]"
	hosts_file "$SCRATCH/noca.json" "$ORIGIN" "https://$TLS" '["pull","resolve"]'
	check "the mirror's private CA from its host entry is used" \
		"$FERRY" inspect "docker://$ORIGIN/t/x:1" "${NORES[@]}" --resolve "$TLS:127.0.0.1" \
		--registry-hosts "$SCRATCH/ca.json" --retries 1
	check_exit "without it the mirror's certificate is refused (exit 1)" 1 \
		"$FERRY" inspect "docker://$ORIGIN/t/x:1" "${NORES[@]}" --resolve "$TLS:127.0.0.1" \
		--registry-hosts "$SCRATCH/noca.json" --retries 1
	expect "... saying why" grep -qi "certificate" "$LOG"

	# A mirror that wants a client certificate signed by the test CA.
	(cd "$PKI" && openssl req -newkey rsa:2048 -nodes -keyout client.key \
		-out client.csr -subj /CN=ferry-client &&
		printf '%s\n' extendedKeyUsage=clientAuth >client.ext &&
		openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key \
			-CAcreateserial -days 2 -extfile client.ext -out client.pem) >"$LOG" 2>&1 ||
		{ notok "make a client certificate"; diag "$LOG"; }
	if REG_TLS_CERT=$PKI/other.ferry.test.pem REG_TLS_KEY=$PKI/other.ferry.test.key \
		REG_TLS_CLIENT_CA=$PKI/ca.pem reg_start anon 2>"$LOG"; then
		MTLS=other.ferry.test:${REG##*:}
		MTLS_ARGS=(--resolve "$MTLS:127.0.0.1" --ca-file "$PKI/ca.pem")
		hosts_file "$SCRATCH/server.json" "$MTLS" "https://$MTLS" '["pull","resolve","push"]' \
			"\"server\":true,\"clientCert\":\"$PKI/client.pem\",\"clientKey\":\"$PKI/client.key\""
		check "push the test image to the mirror that wants a client certificate" \
			"$FERRY" convert -q "dir:$TREE" "docker://$MTLS/t/x:1" "${MTLS_ARGS[@]}" \
			--registry-hosts "$SCRATCH/server.json"
		hosts_file "$SCRATCH/mtls.json" "$ORIGIN" "https://$MTLS" '["pull","resolve"]' \
			"\"ca\":[\"$PKI/ca.pem\"],\"clientCert\":\"$PKI/client.pem\",\"clientKey\":\"$PKI/client.key\""
		hosts_file "$SCRATCH/nocert.json" "$ORIGIN" "https://$MTLS" '["pull","resolve"]' \
			"\"ca\":[\"$PKI/ca.pem\"]"
		check "the mirror's client certificate from its host entry is shown" \
			"$FERRY" inspect "docker://$ORIGIN/t/x:1" "${NORES[@]}" --resolve "$MTLS:127.0.0.1" \
			--registry-hosts "$SCRATCH/mtls.json" --retries 1
		check_exit "without it the mirror refuses the connection (exit 1)" 1 \
			"$FERRY" inspect "docker://$ORIGIN/t/x:1" "${NORES[@]}" --resolve "$MTLS:127.0.0.1" \
			--registry-hosts "$SCRATCH/nocert.json" --retries 1
	else
		notok "start a TLS registry that wants client certificates"
		diag "$LOG"
	fi
else
	notok "$E2E_NAME: make the test CA"
	diag "$LOG"
fi

# --- malformed files ------------------------------------------------------------------
echo '{"hosts":[{"registry":"r.io","url":"ftp://m"}]}' >"$SCRATCH/bad.json"
check_exit "a host URL that is not http(s): usage error" 2 \
	"$FERRY" inspect "docker://r.io/a:1" --registry-hosts "$SCRATCH/bad.json"
expect "... naming it" grep -q "ftp://m" "$LOG"
echo '[1,2]' >"$SCRATCH/bad.json"
check_exit "not a JSON object: usage error" 2 \
	"$FERRY" inspect "docker://r.io/a:1" --registry-hosts "$SCRATCH/bad.json"
e2e_done
