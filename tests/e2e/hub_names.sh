#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Docker Hub names, offline: in a network namespace of its own (so port
# 443 of 127.0.0.1 is ours), a docker-registry with a self-signed
# certificate for registry-1.docker.io and Basic auth answers on
# 127.0.0.1:443; ferry reaches it with --resolve
# registry-1.docker.io:443:127.0.0.1 and --ca-file (the certificate).
# A ferry image pushed as docker://debian:bookworm lands in
# library/debian; `ferry inspect` of docker://debian:bookworm,
# docker://docker.io/library/debian:bookworm and
# docker://index.docker.io/library/debian:bookworm all reach it (the
# registry sees Host registry-1.docker.io and /v2/library/debian), with
# the credentials stored under the Hub's docker-config key
# (https://index.docker.io/v1/), and through a credential helper, which is
# asked for that key; without credentials the registry refuses. Errors
# name the normalised reference.
# shellcheck disable=SC2016 # conditions for eval are single-quoted on purpose
E2E_TIMEOUT=${E2E_TIMEOUT:-300}
# Port 443 and the name registry-1.docker.io stay inside a network
# namespace of this script's own: nothing else on the machine sees them.
if [ -z "${FERRY_HUB_NETNS:-}" ] && [ "$(id -u)" -eq 0 ]; then
	exec env FERRY_HUB_NETNS=1 unshare --net -- bash "$0" "$@"
fi
. "$(dirname "$0")/../lib/common.sh"
. "$(dirname "$0")/../lib/registry.sh"
need_root
need_ferry
need_cmds docker-registry openssl htpasswd ip

if ! ip link set lo up 2>"$LOG"; then
	notok "$E2E_NAME: bring up lo in the test's network namespace"
	diag "$LOG"
	e2e_done
fi

HUB=registry-1.docker.io
CERT=$SCRATCH/hub.pem
openssl req -x509 -newkey rsa:2048 -nodes -keyout "$SCRATCH/hub.key" -out "$CERT" \
	-days 2 -subj "/CN=$HUB" -addext "subjectAltName=DNS:$HUB" >"$LOG" 2>&1 ||
	{ notok "$E2E_NAME: a self-signed certificate for $HUB"; diag "$LOG"; e2e_done; }
if ! REG_PORT=443 REG_ACCESS_LOG=1 REG_TLS_CERT=$CERT REG_TLS_KEY=$SCRATCH/hub.key \
	reg_start basic 2>"$LOG"; then
	notok "$E2E_NAME: docker-registry for $HUB on 127.0.0.1:443"
	diag "$LOG"
	e2e_done
fi
HUB_LOG=$REG_DIR/registry.log
NET=(--resolve "$HUB:443:127.0.0.1" --ca-file "$CERT")

# Credentials the way `docker login` stores Hub ones.
AUTH=$SCRATCH/auth.json
printf '{"auths":{"https://index.docker.io/v1/":{"auth":"%s"}}}\n' \
	"$(printf '%s:%s' "$REG_TEST_USER" "$REG_TEST_PASS" | base64 -w0)" >"$AUTH"

TREE=$SCRATCH/tree
mkdir -p "$TREE/etc"
echo "bookworm from the offline hub" >"$TREE/etc/debian_version"
head -c 300000 /dev/urandom >"$TREE/etc/blob.bin"

check "convert into docker://debian:bookworm (a push to the Hub's library/debian)" \
	"$FERRY" convert -q "dir:$TREE" docker://debian:bookworm "${NET[@]}" --authfile "$AUTH"
expect "the push went to /v2/library/debian with Host $HUB" \
	eval 'grep "msg=\"authorized request\"" "$HUB_LOG" | grep "http.request.method=PUT" |
		grep "http.request.host=$HUB " |
		grep -q "http.request.uri=/v2/library/debian/manifests/bookworm "'

for ref in debian:bookworm docker.io/library/debian:bookworm \
	index.docker.io/library/debian:bookworm; do
	# shellcheck disable=SC2034 # read in the eval below
	n=$(wc -l <"$HUB_LOG")
	if check "ferry inspect docker://$ref" \
		"$FERRY" inspect --json "docker://$ref" "${NET[@]}" --authfile "$AUTH"; then
		# Every request needs auth there; $REG_TEST_USER is its only user.
		expect "docker://$ref: $HUB authorized the request for library/debian" \
			eval 'tail -n +"$((n + 1))" "$HUB_LOG" | grep "msg=\"authorized request\"" |
				grep "http.request.host=$HUB " |
				grep -q "http.request.uri=/v2/library/debian/manifests/bookworm "'
	fi
done

check_exit "without credentials the Hub refuses (exit 1)" 1 \
	"$FERRY" inspect docker://debian:bookworm "${NET[@]}"
expect "... and the error names docker.io/library/debian" \
	grep -q "docker.io/library/debian" "$LOG"
check_exit "a tag the Hub lacks: exit 1" 1 \
	"$FERRY" inspect docker://debian:nosuchtag "${NET[@]}" --authfile "$AUTH"
expect "... naming the normalised reference" grep -q "docker.io/library/debian" "$LOG"
check_exit "without the certificate the TLS check fails (exit 1)" 1 \
	"$FERRY" inspect docker://debian:bookworm --resolve "$HUB:443:127.0.0.1" \
	--authfile "$AUTH"

# A credential helper is asked for the Hub by docker login's key.
mkdir -p "$SCRATCH/bin"
cat >"$SCRATCH/bin/docker-credential-ferrytest" <<EOF
#!/bin/sh
[ "\$1" = get ] || exit 1
read -r server
echo "\$server" >>"$SCRATCH/helper.log"
[ "\$server" = "https://index.docker.io/v1/" ] || exit 1
printf '{"ServerURL":"%s","Username":"%s","Secret":"%s"}\n' "\$server" \
	"$REG_TEST_USER" "$REG_TEST_PASS"
EOF
chmod 755 "$SCRATCH/bin/docker-credential-ferrytest"
echo '{"credsStore":"ferrytest"}' >"$SCRATCH/helper.json"
check "ferry inspect docker://debian:bookworm with a credential helper" \
	env PATH="$SCRATCH/bin:$PATH" "$FERRY" inspect docker://debian:bookworm \
	"${NET[@]}" --authfile "$SCRATCH/helper.json"
expect "the helper was asked for https://index.docker.io/v1/" \
	grep -qx "https://index.docker.io/v1/" "$SCRATCH/helper.log"
e2e_done
