#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Issue 14, findings 7 and 8 against the registry client (regclient over
# pkg-fetch), each as an attacker would try it:
#   - --tls-verify=false against a host whose "TLS" port speaks plain http
#     (an active attacker breaking the handshake): the client falls back to
#     plain http anonymously, but never sends the Basic credentials there;
#     the listener logs every Authorization header it gets (none)
#   - a registry trickling a blob's bytes: a Range read ends with an error
#     by the request deadline (--request-ms), not after the trickle
#   - finding 4: nobody running the ferry binary (ferry convert dir:MNT,
#     and cat) on a fanotify mount whose data is not cached reads the
#     image's bytes, filled on demand, never zeros; a root reader after it
#     too (no zeros left in the page cache)
#   - finding 8: ferry umount of a FUSE and of a fanotify mount while a
#     reader waits in a trickled fetch returns within seconds, the reader
#     gets EIO
#   - finding 7: an https registry (test CA) whose Bearer realm is a plain
#     http URL on another host is refused; the token server gets no
#     request (with --insecure-registry for that host it does)
E2E_TIMEOUT=${E2E_TIMEOUT:-240}
. "$(dirname "$0")/../lib/common.sh"
. "$(dirname "$0")/../lib/oci.sh"
. "$(dirname "$0")/../lib/registry.sh"
. "$(dirname "$0")/../lib/lazy.sh"
need_cmds docker-registry python3 openssl runuser sha256sum
need_tool "$REGCLIENT"
need_ferryd

# --- finding 7: no credentials over plain http after a TLS failure ---------
AUTHLOG=$SCRATCH/auth.log
: >"$AUTHLOG"
python3 - "$SCRATCH/plain.port" "$AUTHLOG" <<'EOF' &
import http.server, sys
port_file, log = sys.argv[1], sys.argv[2]
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        with open(log, "a") as f:
            f.write("%s auth=%s\n" % (self.path, self.headers.get("Authorization", "-")))
        self.send_response(401)
        self.send_header("WWW-Authenticate", 'Basic realm="x"')
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *a):
        pass
s = http.server.HTTPServer(("127.0.0.1", 0), H)
open(port_file + ".tmp", "w").write(str(s.server_address[1]))
import os; os.rename(port_file + ".tmp", port_file)
s.serve_forever()
EOF
PLAIN_PID=$!
for _ in $(seq 50); do [ -s "$SCRATCH/plain.port" ] && break; sleep 0.1; done
P=$(cat "$SCRATCH/plain.port")
rc tlsdown --tls-verify=false --creds alice:s3cret \
	--resolve "registry.ferry.test:$P:127.0.0.1" manifest "registry.ferry.test:$P/ferry/x:v1"
rc_expect "--tls-verify=false, TLS broken: the pull fails (no credentials over plain http)" rc_failed
rc_expect "... the error says why and what to do" rc_err_has "refusing to send credentials over plain http.*--insecure-registry"
if grep -q "auth=-" "$AUTHLOG" && ! grep -qv "auth=-" "$AUTHLOG"; then
	ok "... the plain listener got requests ($(wc -l <"$AUTHLOG")) but never an Authorization header"
else
	notok "... the plain listener got an Authorization header (or nothing)"
	diag "$AUTHLOG"
fi
: >"$AUTHLOG"
rc tlsnamed --creds alice:s3cret --insecure "registry.ferry.test:$P" \
	--resolve "registry.ferry.test:$P:127.0.0.1" manifest "registry.ferry.test:$P/ferry/x:v1"
expect_named() { grep -q "auth=Basic" "$AUTHLOG"; }
rc_expect "a registry named plain http (--insecure-registry) still gets its credentials" expect_named
kill "$PLAIN_PID" 2>/dev/null
wait "$PLAIN_PID" 2>/dev/null

# --- finding 8: a trickling registry meets the request deadline -------------
IMG=$SCRATCH/img
if ! reg_mkimage "$IMG" 8 2>"$LOG" || ! reg_start anon 2>"$LOG" || ! fp_start 2>>"$LOG"; then
	notok "start docker-registry and the fault proxy"
	diag "$LOG"
	e2e_done
fi
reg_put_blob ferry/f "$IMG/big.tar" 2>>"$LOG" || notok "setup: upload big.tar"
D=sha256:$(sha256sum "$IMG/big.tar" | cut -d' ' -f1)
fp_set trickle rate=2000 "method=^GET$" path=/blobs/
rc trickle --request-ms 3000 range "$PROXY/ferry/f" "$D" 0 $((1 << 20))
rc_expect "a trickled 1 MiB Range read fails by its deadline (3 s + 1 s/MiB): ${RC_MS} ms" \
	eval 'rc_failed && [ "$RC_MS" -lt 8000 ]'
rc_expect "... saying the deadline passed" rc_err_has "deadline"
fp_reset
rc untrickled --request-ms 3000 range "$PROXY/ferry/f" "$D" 0 $((1 << 20))
rc_expect "the same read without the trickle succeeds" rc_ok

# --- an image whose data no cache holds yet --------------------------------
TREE=$SCRATCH/tree
mkdir -p "$TREE/sub"
head -c $((3 << 20)) /dev/urandom >"$TREE/big"
head -c 200000 /dev/urandom >"$TREE/small"
head -c $((1 << 20)) /dev/urandom >"$TREE/sub/mid"
echo "ferry security test" >"$TREE/sub/motd"
chmod -R a+rX "$TREE"
SIMG=ferry/sec:1
check "convert dir: -> docker:// (the test image)" "$FERRY" convert -q "dir:$TREE" \
	"docker://$REG/$SIMG" || e2e_done
hashtree "$TREE" sorted 0 >"$SCRATCH/tree.sums"
# nobody reaches the mount points and its own output, nothing else.
chmod 711 "$SCRATCH"

# --- finding 4: nobody running ferry reads filled bytes, never zeros ----------
lazy_use nobody
M=$SCRATCH/m-nobody
if check "mount --mode fanotify, empty cache" mount_lazy fanotify "docker://$REG/$SIMG" "$M"; then
	read -r _ _ present total _ < <(mount_stats "$M")
	expect_sh "... no data chunk present before the reads ($present of $total)" \
		'[ "$present" -lt "$total" ]'
	s=$(runuser -u nobody -- sha256sum <"$M/big" | cut -d' ' -f1)
	expect_sh "nobody: cat of a file not cached reads its bytes" \
		'[ "$s" = "$(sha256sum <"$TREE/big" | cut -d" " -f1)" ]'
	X=$SCRATCH/x-nobody
	mkdir -p "$X" && chown nobody "$X"
	check "nobody: ferry convert dir:MOUNT dir:OUT (the ferry binary, not root)" \
		runuser -u nobody -- "$FERRY" convert -q "dir:$M" "dir:$X/out"
	MX=$SCRATCH/m-x
	if check "... mount what it converted (fuse)" mount_lazy fuse "dir:$X/out" "$MX"; then
		hashtree "$MX" sorted 0 >"$SCRATCH/x.sums" 2>"$LOG"
		check "... every file it read is the image's (filled on demand, no zeros)" \
			diff "$SCRATCH/tree.sums" "$SCRATCH/x.sums"
		umount_lazy "$MX"
	fi
	hashtree "$M" sorted 0 >"$SCRATCH/root.sums" 2>"$LOG"
	check "root then reads the same bytes (the page cache kept no zeros)" \
		diff "$SCRATCH/tree.sums" "$SCRATCH/root.sums"
	read -r _ _ present total _ < <(mount_stats "$M")
	expect_sh "... every chunk was filled by ferryd ($present of $total)" \
		'[ "$present" -eq "$total" ]'
	check "umount" umount_lazy "$M"
fi

# --- finding 8: ferry umount ends a read stuck in a trickled fetch ------------
stuck_umount() { # MODE
	local mode=$1 mnt=$SCRATCH/m-stuck-$1 rp t0 ms out
	lazy_use "stuck-$mode"
	fp_reset
	check "$mode: mount through the proxy, empty cache" \
		mount_lazy "$mode" "docker://$PROXY/$SIMG" "$mnt" || return
	fp_set trickle rate=2000 "method=^GET$" path=/blobs/
	read_check "$mnt/big" "$TREE/big" >"$SCRATCH/stuck-$mode.out" 2>&1 &
	rp=$!
	sleep 2
	expect "$mode: the reader waits in the trickled fetch" kill -0 "$rp"
	t0=$(now_ms)
	check "$mode: ferry umount while it waits" umount_lazy "$mnt"
	ms=$(($(now_ms) - t0))
	expect_sh "... returns within a few seconds ($ms ms, < 6000; the deadline is 60 s)" \
		'[ "$ms" -lt 6000 ]'
	wait_gone 5 "$rp"
	kill "$rp" 2>/dev/null
	wait "$rp" 2>/dev/null
	out=$(cat "$SCRATCH/stuck-$mode.out")
	expect_sh "... the reader got EIO, no wrong bytes ($out)" \
		'[[ $out == "error EIO after "*" match" ]]'
	fp_reset
}
stuck_umount fuse
stuck_umount fanotify

# --- finding 7: an https registry naming a plain http token server ------------
PKI=$SCRATCH/pki
if ! tls_pki >"$LOG" 2>&1; then
	notok "make the test CA and certificates"
	diag "$LOG"
	e2e_done
fi
if ! REG_TLS_CERT=$PKI/registry.ferry.test.pem REG_TLS_KEY=$PKI/registry.ferry.test.key \
	REG_REALM_HOST=token.ferry.test reg_start token 2>"$LOG"; then
	notok "start an https docker-registry with an http:// token realm"
	diag "$LOG"
	e2e_done
fi
P=${REG##*:}
TP=$(cat "$REG_DIR/token.port")
TLSREG=(--ca-file "$PKI/ca.pem" --creds "$REG_USER:$REG_PASS"
	--resolve "registry.ferry.test:$P:127.0.0.1" --resolve "token.ferry.test:$TP:127.0.0.1")
rc realm "${TLSREG[@]}" manifest "registry.ferry.test:$P/ferry/x:v1"
rc_expect "https registry, realm http://token.ferry.test:$TP/token: refused" \
	eval 'rc_failed && rc_err_has "plain http token server.*--insecure-registry"'
expect_sh "... the token server got no request" '[ ! -s "$REG_TOKEN_LOG" ]'
rc realm_named --insecure "token.ferry.test:$TP" "${TLSREG[@]}" \
	manifest "registry.ferry.test:$P/ferry/x:v1"
expect_sh "with --insecure-registry token.ferry.test:$TP the token server is asked" \
	'grep -q "user=$REG_USER" "$REG_TOKEN_LOG"'

# Every ferryd of the script stopped: no sanitizer report in its log (leaks
# are reported at exit).
ferryd_stop_all
for l in "$SCRATCH"/fd-*/ferryd.log; do
	expect "no sanitizer report in ${l#"$SCRATCH"/}" eval '! sanitizer_report "$l"' ||
		diag "$l" 20
done
e2e_done
