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
E2E_TIMEOUT=${E2E_TIMEOUT:-120}
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/registry_lib.sh"
need_cmds docker-registry python3
need_tool "$REGCLIENT"

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
e2e_done
