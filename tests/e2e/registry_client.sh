#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The registry client (build/tests/tools/regclient over pkg-fetch) against
# docker-registry 2.8 on 127.0.0.1, once per auth mode: anonymous, htpasswd
# Basic, and Bearer tokens from tests/tools/tokenserver.py. In each mode:
# blob uploads (monolithic, and > 32 MiB in PATCH chunks, checked against
# the registry's own storage), "exists" on repeated uploads, an OCI
# manifest pushed by tag and by digest and read back by tag and by digest
# (bytes, media type, digest), exists/absent, streamed and in-memory blob
# reads, ranges (start, middle, end, > 16 MiB) and ranges outside the blob,
# a wrong size, tags, cross-repository mounts (and a mount source without
# the blob), and skopeo interop both ways (a umoci-made layout pushed by
# skopeo and read by regclient; regclient's image read by skopeo inspect
# and skopeo copy). With auth: missing and wrong credentials fail naming
# the registry without echoing a password; docker config files ("auths"
# through --authfile, $REGISTRY_AUTH_FILE, $DOCKER_CONFIG, ~/.docker, an
# http:// key) and credential helpers (credHelpers, preferred over
# "auths"). Token mode also: anonymous pulls of public/ repositories,
# refused anonymous and pull-only pushes, identity (refresh) tokens via
# "auths" and a helper, and 3-second tokens that expire in the middle of
# an upload and of a delayed read.
# shellcheck disable=SC2016 # conditions for eval are single-quoted on purpose
E2E_TIMEOUT=${E2E_TIMEOUT:-175}
. "$(dirname "$0")/../lib/common.sh"
. "$(dirname "$0")/../lib/registry.sh"
need_cmds docker-registry htpasswd skopeo umoci openssl python3
need_tool "$REGCLIENT"

IMG=$SCRATCH/img
BIG_MB=${REG_BIG_MB:-40}
if ! reg_mkimage "$IMG" "$BIG_MB" 2>"$LOG"; then
	notok "$E2E_NAME: make the test image files"
	diag "$LOG"
	exit 1
fi
ABSENT=sha256:$(printf 'not in any registry' | sha256sum | cut -d' ' -f1)

# The fake credential helper docker-credential-ferrytest: answers for
# $CH_SERVER with $CH_USER/$CH_SECRET (read from files at run time), logs
# every call to $SCRATCH/credhelper.log.
mkdir -p "$SCRATCH/bin" "$SCRATCH/ch"
cat >"$SCRATCH/bin/docker-credential-ferrytest" <<EOF
#!/bin/sh
server=\$(cat)
echo "\$1 \$server" >>"$SCRATCH/credhelper.log"
if [ "\$1" = get ] && [ "\$server" = "\$(cat "$SCRATCH/ch/server")" ]; then
	printf '{"ServerURL":"%s","Username":"%s","Secret":"%s"}\n' "\$server" \
		"\$(cat "$SCRATCH/ch/user")" "\$(cat "$SCRATCH/ch/secret")"
	exit 0
fi
echo "credentials not found in native keychain"
exit 1
EOF
chmod +x "$SCRATCH/bin/docker-credential-ferrytest"
export PATH=$SCRATCH/bin:$PATH

b64() { printf '%s' "$1" | base64 -w0; }

# Files listing "DIGEST SIZE" of a layout's (tag t) manifest, config and
# layers, and the manifest digest alone.
layout_blobs() { # LAYOUT
	python3 - "$1" <<'EOF'
import json, sys
L = sys.argv[1]
idx = json.load(open(L + "/index.json"))
d = [m for m in idx["manifests"]
     if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == "t"][0]
print(d["digest"], d["size"])
m = json.load(open(L + "/blobs/sha256/" + d["digest"][7:]))
for x in [m["config"]] + m["layers"]:
    print(x["digest"], x["size"])
EOF
}
layout_tag_digest() { # LAYOUT TAG
	python3 - "$1" "$2" <<'EOF'
import json, sys
idx = json.load(open(sys.argv[1] + "/index.json"))
print(" ".join(m["digest"] for m in idx["manifests"]
               if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == sys.argv[2]))
EOF
}

to_file() { # FILE CMD...: CMD's stdout into FILE
	local f=$1
	shift
	"$@" >"$f"
}

stored_is() { # DIGEST FILE: the registry's stored blob has FILE's bytes
	cmp -s "$(reg_stored_blob "$1")" "$2"
}

# Auth failures: exit 1, the registry named, 401/denied in the message, no
# password echoed.
auth_refused() { # DESC PASSWORD...
	local desc=$1 pw
	shift
	rc_expect "$desc: exit 1" rc_failed
	rc_expect "$desc: the message names the registry" grep -qF "$REG" "$RC_ERR"
	rc_expect "$desc: the message says why (401/denied/unauthorized)" \
		rc_err_has '401|403|denied|unauthori[sz]ed|authenticat|credential'
	for pw in "$@"; do
		if grep -qF -- "$pw" "$RC_ERR" "$RC_OUT"; then
			notok "$desc: no password in the output"
			return
		fi
	done
	ok "$desc: no password in the output"
}

write_authfile() { # FILE JSON
	mkdir -p "$(dirname "$1")"
	printf '%s\n' "$2" >"$1"
}

suite() { # MODE
	local m=$1 R C=() sc=() mid end i t b want L
	if ! reg_start "$m" 2>"$LOG"; then
		notok "$m: start docker-registry"
		diag "$LOG"
		return
	fi
	echo "# $m: registry at $REG"
	R=$REG/ferry/app
	[ -n "$REG_USER" ] && C=(--creds "$REG_USER:$REG_PASS")

	# --- uploads ---------------------------------------------------
	rc "$m-push-cfg" "${C[@]}" push-blob "$R" "$IMG/config.json"
	rc_expect "$m: push-blob the config: uploaded" grep -qx "$CFG_D uploaded" "$RC_OUT"
	rc_expect "$m: the registry stores the config's bytes" stored_is "$CFG_D" "$IMG/config.json"
	rc "$m-push-l1" "${C[@]}" push-blob "$R" "$IMG/layer1.tar"
	rc_expect "$m: push-blob a 300 KiB layer: uploaded" grep -qx "$L1_D uploaded" "$RC_OUT"
	rc "$m-push-big" "${C[@]}" --stats push-blob "$R" "$IMG/big.tar"
	rc_expect "$m: push-blob a $BIG_MB MiB layer (chunked): uploaded" \
		grep -qx "$BIG_D uploaded" "$RC_OUT"
	rc_expect "$m: the registry stores the $BIG_MB MiB layer's bytes" stored_is "$BIG_D" "$IMG/big.tar"
	rc_expect "$m: --stats bytes_up counts the upload" test "$(rc_stat bytes_up)" -ge "$BIG_S"
	rc "$m-push-again" "${C[@]}" --stats push-blob "$R" "$IMG/big.tar"
	rc_expect "$m: pushing the same blob again: exists, nothing sent" \
		eval 'grep -qx "$BIG_D exists" "$RC_OUT" && [ "$(rc_stat bytes_up)" = 0 ]'

	rc "$m-push-man" "${C[@]}" push-manifest "$R:v1" "$OCI_MANIFEST" "$IMG/manifest.json"
	rc_expect "$m: push-manifest by tag prints its digest" grep -qx "$MAN_D" "$RC_OUT"
	rc "$m-push-man2" "${C[@]}" push-manifest "$R:v2" "$OCI_MANIFEST" "$IMG/manifest.json"
	rc_expect "$m: push-manifest under a second tag" grep -qx "$MAN_D" "$RC_OUT"
	rc "$m-push-man-d" "${C[@]}" push-manifest "$R@$MAN_D" "$OCI_MANIFEST" "$IMG/manifest.json"
	rc_expect "$m: push-manifest by digest" grep -qx "$MAN_D" "$RC_OUT"

	# --- manifests ---------------------------------------------------
	rc "$m-man-tag" "${C[@]}" manifest "$R:v1"
	rc_expect "$m: manifest by tag: the pushed bytes" rc_out_is "$IMG/manifest.json"
	rc_expect "$m: manifest by tag: media type and digest on stderr" \
		grep -qxF "$OCI_MANIFEST $MAN_D" "$RC_ERR"
	rc "$m-man-dig" "${C[@]}" manifest "$R@$MAN_D"
	rc_expect "$m: manifest by digest: the pushed bytes" rc_out_is "$IMG/manifest.json"
	rc_expect "$m: manifest by digest: media type and digest on stderr" \
		grep -qxF "$OCI_MANIFEST $MAN_D" "$RC_ERR"
	rc "$m-man-notag" "${C[@]}" manifest "$R:nosuchtag"
	rc_expect "$m: manifest of an unknown tag fails naming it" \
		eval 'rc_failed && grep -qF nosuchtag "$RC_ERR"'
	rc "$m-man-nodig" "${C[@]}" manifest "$R@$ABSENT"
	rc_expect "$m: manifest of an absent digest fails" rc_failed
	rc "$m-man-norepo" "${C[@]}" manifest "$REG/ferry/never-pushed:v1"
	rc_expect "$m: manifest of an unknown repository fails" rc_failed

	# --- blobs ---------------------------------------------------------
	rc "$m-exists" "${C[@]}" exists "$R" "$BIG_D"
	rc_expect "$m: exists prints the size" eval 'rc_ok && [ "$(cat "$RC_OUT")" = "$BIG_S" ]'
	rc "$m-absent" "${C[@]}" exists "$R" "$ABSENT"
	rc_expect "$m: exists of an absent blob: exit 3" test "$RC_RC" -eq 3
	rc "$m-blob-cfg" "${C[@]}" blob "$R" "$CFG_D" "$CFG_S"
	rc_expect "$m: blob (stream) of the config" rc_out_is "$IMG/config.json"
	rc "$m-blob-big" "${C[@]}" --stats blob "$R" "$BIG_D" "$BIG_S"
	rc_expect "$m: blob (stream) of the $BIG_MB MiB layer" rc_out_is "$IMG/big.tar"
	rc_expect "$m: --stats bytes_down counts the read" test "$(rc_stat bytes_down)" -ge "$BIG_S"
	rc "$m-getblob-l1" "${C[@]}" getblob "$R" "$L1_D" "$L1_S"
	rc_expect "$m: getblob of the small layer" rc_out_is "$IMG/layer1.tar"
	rc "$m-getblob-big" "${C[@]}" getblob "$R" "$BIG_D" "$BIG_S"
	rc_expect "$m: getblob of the $BIG_MB MiB layer" rc_out_is "$IMG/big.tar"
	rc "$m-blob-size" "${C[@]}" blob "$R" "$L1_D" $((L1_S + 1))
	rc_expect "$m: blob with a wrong size fails" rc_failed
	rc "$m-getblob-size" "${C[@]}" getblob "$R" "$L1_D" $((L1_S - 1))
	rc_expect "$m: getblob with a wrong size fails" rc_failed
	rc "$m-blob-absent" "${C[@]}" blob "$R" "$ABSENT" 10
	rc_expect "$m: blob of an absent digest fails naming it" \
		eval 'rc_failed && grep -qF "${ABSENT#sha256:}" "$RC_ERR"'

	mid=$((BIG_S / 2 - 1000))
	end=$((BIG_S - 777))
	for t in "0 4096 start" "$mid 1048579 middle" "$end 777 end" "1000 $((17 << 20)) 17MiB"; do
		# shellcheck disable=SC2086 # split into OFF LEN NAME
		set -- $t
		reg_slice "$IMG/big.tar" "$1" "$2" >"$SCRATCH/want"
		rc "$m-range-$3" "${C[@]}" range "$R" "$BIG_D" "$1" "$2"
		rc_expect "$m: range at the $3 ($1+$2)" rc_out_is "$SCRATCH/want"
	done
	# A pull sends no /v2/ ping: 16 first requests at once on one client
	# each meet the challenge, and every one must still get through.
	reg_slice "$IMG/big.tar" 4096 65536 >"$SCRATCH/want"
	rc "$m-range-parallel" "${C[@]}" --parallel 16 range "$R" "$BIG_D" 4096 65536
	rc_expect "$m: 16 concurrent first range reads on one client" rc_out_is "$SCRATCH/want"
	rc "$m-range-416" "${C[@]}" range "$R" "$BIG_D" $((BIG_S + 10)) 10
	rc_expect "$m: range beyond the blob (416) fails" rc_failed
	rc "$m-range-past" "${C[@]}" range "$R" "$BIG_D" $((BIG_S - 10)) 20
	rc_expect "$m: range running past the end fails" rc_failed

	# --- tags ----------------------------------------------------------
	rc "$m-tags" "${C[@]}" tags "$R"
	rc_expect "$m: tags lists v1 and v2" eval 'rc_ok && [ "$(cat "$RC_OUT")" = "$(printf "v1\nv2")" ]'
	rc "$m-tags-none" "${C[@]}" tags "$REG/ferry/never-pushed"
	rc_expect "$m: tags of an unknown repository fails" rc_failed

	# --- cross-repository mount ------------------------------------------
	rc "$m-mount" "${C[@]}" --stats push-blob "$REG/ferry/other" "$IMG/big.tar" ferry/app
	rc_expect "$m: push-blob with a mount source: exists, nothing sent" \
		eval 'grep -qx "$BIG_D exists" "$RC_OUT" && [ "$(rc_stat bytes_up)" = 0 ]'
	rc_expect "$m: the mounted blob is linked into the new repository" \
		test -f "$REG_DIR/storage/docker/registry/v2/repositories/ferry/other/_layers/sha256/${BIG_D#sha256:}/link"
	rc "$m-mount-read" "${C[@]}" getblob "$REG/ferry/other" "$L1_D" "$L1_S"
	rc_expect "$m: a blob not mounted is absent from the new repository" rc_failed
	rc "$m-mount-miss" "${C[@]}" push-blob "$REG/ferry/third" "$IMG/layer1.tar" ferry/never-pushed
	rc_expect "$m: a mount source without the blob: uploaded instead" \
		grep -qx "$L1_D uploaded" "$RC_OUT"

	# --- skopeo interop --------------------------------------------------
	L=$SCRATCH/umoci-$m
	if ! reg_umoci_layout "$L" >"$LOG" 2>&1; then
		notok "$m: umoci builds a layout"
		diag "$LOG"
	elif check "$m: skopeo pushes the umoci layout" reg_push_oci "$L:t" "$REG/ferry/umoci:t"; then
		rc "$m-sk-man" "${C[@]}" manifest "$REG/ferry/umoci:t"
		want=$(layout_tag_digest "$L" t)
		rc_expect "$m: regclient reads skopeo's manifest (digest $want)" \
			eval 'rc_ok && [ "$(sha256sum <"$RC_OUT" | cut -d" " -f1)" = "${want#sha256:}" ] && cmp -s "$RC_OUT" "$L/blobs/sha256/${want#sha256:}"'
		i=0
		while read -r b t; do
			i=$((i + 1))
			[ "$i" -eq 1 ] && continue
			rc "$m-sk-blob$i" "${C[@]}" blob "$REG/ferry/umoci" "$b" "$t"
			rc_expect "$m: regclient reads skopeo's blob $b" rc_out_is "$L/blobs/sha256/${b#sha256:}"
		done < <(layout_blobs "$L")
	fi
	[ -n "$REG_USER" ] && sc=(--creds "$REG_USER:$REG_PASS")
	if check "$m: skopeo inspect --raw reads regclient's manifest" \
		to_file "$SCRATCH/inspect.out" skopeo inspect --tls-verify=false "${sc[@]}" --raw "docker://$R:v1"; then
		expect "$m: skopeo inspect --raw: the same bytes" cmp -s "$SCRATCH/inspect.out" "$IMG/manifest.json"
	fi
	[ -n "$REG_USER" ] && sc=(--src-creds "$REG_USER:$REG_PASS")
	if check "$m: skopeo copy regclient's image to an OCI layout" \
		skopeo copy --quiet --src-tls-verify=false "${sc[@]}" \
		--dest-oci-accept-uncompressed-layers "docker://$R:v1" "oci:$SCRATCH/back-$m:v1"; then
		expect "$m: skopeo copy: the manifest digest" \
			test "$(layout_tag_digest "$SCRATCH/back-$m" v1)" = "$MAN_D"
		expect "$m: skopeo copy: config and layers byte-identical" blobs_back_same "$SCRATCH/back-$m"
		rm -rf "$SCRATCH/back-$m"
	fi
	rm -rf "$L"

	[ "$m" = anon ] && return
	auth_suite "$m"
	[ "$m" = token ] && token_suite
}

# The three blobs of $IMG in an OCI layout made by skopeo are the same bytes.
blobs_back_same() { # LAYOUT
	local f d
	for f in config.json:$CFG_D layer1.tar:$L1_D big.tar:$BIG_D; do
		d=${f#*:}
		cmp -s "$1/blobs/sha256/${d#sha256:}" "$IMG/${f%%:*}" || {
			echo "    ${f%%:*} differs"
			return 1
		}
	done
}

auth_suite() { # MODE (basic|token)
	local m=$1 R=$REG/ferry/app a
	rc "$m-nocreds" manifest "$R:v1"
	auth_refused "$m: no credentials" "$REG_PASS"
	rc "$m-wrongpw" --creds "$REG_USER:wr0ng-Pa55-xyz" manifest "$R:v1"
	auth_refused "$m: a wrong password" "wr0ng-Pa55-xyz" "$REG_PASS"
	rc "$m-wronguser" --creds "mallory:$REG_PASS" manifest "$R:v1"
	auth_refused "$m: an unknown user" "$REG_PASS"

	a=$(b64 "$REG_USER:$REG_PASS")
	write_authfile "$SCRATCH/auth-$m.json" "{\"auths\": {\"$REG\": {\"auth\": \"$a\"}}}"
	rc "$m-authfile" --authfile "$SCRATCH/auth-$m.json" manifest "$R:v1"
	rc_expect "$m: --authfile with auths" rc_out_is "$IMG/manifest.json"
	rc "$m-authfile-push" --authfile "$SCRATCH/auth-$m.json" push-manifest "$R:v3" "$OCI_MANIFEST" "$IMG/manifest.json"
	rc_expect "$m: --authfile with auths: push" grep -qx "$MAN_D" "$RC_OUT"
	REGISTRY_AUTH_FILE=$SCRATCH/auth-$m.json rc "$m-regauthfile" manifest "$R:v1"
	rc_expect "$m: \$REGISTRY_AUTH_FILE" rc_out_is "$IMG/manifest.json"
	write_authfile "$SCRATCH/dc-$m/config.json" "{\"auths\": {\"$REG\": {\"auth\": \"$a\"}}}"
	DOCKER_CONFIG=$SCRATCH/dc-$m rc "$m-dockerconfig" manifest "$R:v1"
	rc_expect "$m: \$DOCKER_CONFIG/config.json" rc_out_is "$IMG/manifest.json"
	write_authfile "$HOME/.docker/config.json" "{\"auths\": {\"http://$REG/v1/\": {\"auth\": \"$a\"}}}"
	rc "$m-homeconfig" manifest "$R:v1"
	rc_expect "$m: ~/.docker/config.json with an http://HOST/v1/ key" rc_out_is "$IMG/manifest.json"
	rm -f "$HOME/.docker/config.json"
	write_authfile "$SCRATCH/auth-bad-$m.json" \
		"{\"auths\": {\"$REG\": {\"auth\": \"$(b64 "$REG_USER:wr0ng-Pa55-xyz")\"}}}"
	rc "$m-authfile-bad" --authfile "$SCRATCH/auth-bad-$m.json" manifest "$R:v1"
	auth_refused "$m: --authfile with a wrong password" "wr0ng-Pa55-xyz" "$REG_PASS"
	write_authfile "$SCRATCH/auth-other-$m.json" "{\"auths\": {\"127.0.0.2:1\": {\"auth\": \"$a\"}}}"
	rc "$m-authfile-other" --authfile "$SCRATCH/auth-other-$m.json" manifest "$R:v1"
	rc_expect "$m: auths for another host are not used" rc_failed

	# Credential helper, preferred over a wrong "auths" entry.
	echo "$REG" >"$SCRATCH/ch/server"
	echo "$REG_USER" >"$SCRATCH/ch/user"
	echo "$REG_PASS" >"$SCRATCH/ch/secret"
	: >"$SCRATCH/credhelper.log"
	write_authfile "$SCRATCH/ch-$m.json" "{\"credHelpers\": {\"$REG\": \"ferrytest\"},
 \"auths\": {\"$REG\": {\"auth\": \"$(b64 "$REG_USER:wr0ng-Pa55-xyz")\"}}}"
	rc "$m-credhelper" --authfile "$SCRATCH/ch-$m.json" manifest "$R:v1"
	rc_expect "$m: credHelpers (preferred over auths)" rc_out_is "$IMG/manifest.json"
	rc_expect "$m: the helper was asked 'get' for $REG" grep -qx "get $REG" "$SCRATCH/credhelper.log"
	echo "127.0.0.2:1" >"$SCRATCH/ch/server"
	rc "$m-credhelper-none" --authfile "$SCRATCH/ch-$m.json" manifest "$R:v1"
	rc_expect "$m: a helper without credentials for the host: refused" rc_failed
	write_authfile "$SCRATCH/ch-missing-$m.json" "{\"credHelpers\": {\"$REG\": \"ferry-no-such-helper\"}}"
	rc "$m-credhelper-missing" --authfile "$SCRATCH/ch-missing-$m.json" manifest "$R:v1"
	rc_expect "$m: a missing helper program: fails naming it" \
		eval 'rc_failed && rc_err_has "ferry-no-such-helper|401|denied|unauthori"'
}

token_suite() {
	local R=$REG/ferry/app n0 n1 P f d
	# Public repository: pushed with credentials (mounts), pulled anonymously.
	for f in config.json layer1.tar big.tar; do
		d=sha256:$(sha256sum <"$IMG/$f" | cut -d' ' -f1)
		rc "tok-pub-mount-$f" --creds "$REG_USER:$REG_PASS" push-blob "$REG/public/img" "$IMG/$f" ferry/app
		rc_expect "token: mount $f into public/img" grep -qx "$d exists" "$RC_OUT"
	done
	rc "tok-pub-man" --creds "$REG_USER:$REG_PASS" push-manifest "$REG/public/img:v1" "$OCI_MANIFEST" "$IMG/manifest.json"
	rc_expect "token: push public/img:v1" grep -qx "$MAN_D" "$RC_OUT"
	rc "tok-anon-man" manifest "$REG/public/img:v1"
	rc_expect "token: anonymous manifest read of public/img" rc_out_is "$IMG/manifest.json"
	rc "tok-anon-blob" getblob "$REG/public/img" "$L1_D" "$L1_S"
	rc_expect "token: anonymous blob read of public/img" rc_out_is "$IMG/layer1.tar"
	rc "tok-anon-range" range "$REG/public/img" "$BIG_D" 5 100
	reg_slice "$IMG/big.tar" 5 100 >"$SCRATCH/want"
	rc_expect "token: anonymous range read of public/img" rc_out_is "$SCRATCH/want"
	rc "tok-anon-tags" tags "$REG/public/img"
	rc_expect "token: anonymous tags of public/img" eval 'rc_ok && [ "$(cat "$RC_OUT")" = v1 ]'
	head -c 1000 /dev/urandom >"$SCRATCH/anon.bin"
	rc "tok-anon-push" push-blob "$REG/public/img" "$SCRATCH/anon.bin"
	auth_refused "token: anonymous push to public/img" "$REG_PASS"
	rc "tok-anon-push-man" push-manifest "$REG/public/img:v9" "$OCI_MANIFEST" "$IMG/manifest.json"
	rc_expect "token: anonymous manifest push refused" rc_failed
	rc "tok-anon-private" manifest "$R:v1"
	auth_refused "token: anonymous read of a private repository" "$REG_PASS"

	# A pull-only user.
	rc "tok-ro-pull" --creds "$REG_RO_USER:$REG_RO_PASS" manifest "$R:v1"
	rc_expect "token: a pull-only user reads" rc_out_is "$IMG/manifest.json"
	rc "tok-ro-push" --creds "$REG_RO_USER:$REG_RO_PASS" push-blob "$R" "$SCRATCH/anon.bin"
	auth_refused "token: a pull-only user cannot push" "$REG_RO_PASS"

	# Identity tokens (OAuth2 refresh tokens).
	n0=$(grep -c 'kind=refresh_token user=alice.*status=200' "$REG_TOKEN_LOG")
	write_authfile "$SCRATCH/idtok.json" "{\"auths\": {\"$REG\": {\"identitytoken\": \"$REG_REFRESH\"}}}"
	rc "tok-idtoken" --authfile "$SCRATCH/idtok.json" manifest "$R:v1"
	rc_expect "token: auths identitytoken" rc_out_is "$IMG/manifest.json"
	n1=$(grep -c 'kind=refresh_token user=alice.*status=200' "$REG_TOKEN_LOG")
	rc_expect "token: the identity token went through POST grant_type=refresh_token" test "$n1" -gt "$n0"
	echo "$REG" >"$SCRATCH/ch/server"
	echo "<token>" >"$SCRATCH/ch/user"
	echo "$REG_REFRESH" >"$SCRATCH/ch/secret"
	write_authfile "$SCRATCH/ch-idtok.json" "{\"credHelpers\": {\"$REG\": \"ferrytest\"}}"
	rc "tok-ch-idtoken" --authfile "$SCRATCH/ch-idtok.json" getblob "$R" "$L1_D" "$L1_S"
	rc_expect "token: a helper answering Username <token> (identity token)" rc_out_is "$IMG/layer1.tar"
	if grep -qF "$REG_REFRESH" "$RC_ERR"; then
		notok "token: the identity token is not printed"
	else
		ok "token: the identity token is not printed"
	fi

	# Tokens living 3 s (and really refused after that), requests delayed
	# by a proxy so that a token expires between and during requests.
	if ! reg_start token --expires 3 --real-expiry 2>"$LOG"; then
		notok "token: start a registry with 3 s tokens"
		diag "$LOG"
		return
	fi
	if ! fp_start 2>"$LOG"; then
		notok "token: start the proxy"
		diag "$LOG"
		return
	fi
	P=$PROXY/ferry/app
	fp_set slow count=3 delay=1.3 method=PATCH auth=1
	rc "tok-exp-push" --creds "$REG_USER:$REG_PASS" push-blob "$P" "$IMG/big.tar"
	rc_expect "token: a chunked upload outliving its 3 s token" \
		eval 'grep -qx "$BIG_D uploaded" "$RC_OUT" && stored_is "$BIG_D" "$IMG/big.tar"'
	n0=$(grep -c 'status=200' "$REG_TOKEN_LOG")
	rc_expect "token: new tokens were fetched during the upload ($n0 token requests)" test "$n0" -gt 1
	fp_set slow count=1 delay=4 method=GET path=/blobs/ auth=1
	rc "tok-exp-read" --creds "$REG_USER:$REG_PASS" getblob "$P" "$BIG_D" "$BIG_S"
	rc_expect "token: a read whose token expired in flight is re-authenticated" rc_out_is "$IMG/big.tar"
	n1=$(grep -c 'status=200' "$REG_TOKEN_LOG")
	rc_expect "token: a new token for the delayed read ($((n1 - n0)) token requests)" test "$n1" -gt "$((n0 + 1))"
}

for mode in anon basic token; do
	suite "$mode"
done
e2e_done
