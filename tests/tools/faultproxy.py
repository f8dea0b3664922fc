#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""faultproxy: an HTTP/1.1 reverse proxy in front of a registry that
injects faults on chosen requests (tests; 127.0.0.1 only).

  faultproxy.py --upstream HOST:PORT [--port N] [--port-file F] [--log F]

Every request is forwarded to the upstream (Host rewritten, hop-by-hop
headers dropped, chunked request and response bodies decoded); Location
headers that point at the upstream are rewritten to the proxy, so clients
keep talking to it. WWW-Authenticate is passed on untouched.

Control (GET, never counted as traffic):
  /__fault?mode=M[&count=N][&method=RE][&path=RE][&auth=1][&delay=S]
          [&rate=B][&frac=F][&retry_after=S][&after=1]
      The next N (default 1; -1 = every) requests whose method and path
      (with query) match the regexes (re.search; default: any), and with
      auth=1 that carry an Authorization header, get fault M; then
      requests pass through. Replaces the previous rule. Modes:
        none            pass everything through
        500 503 429 403 404 ...  that status, a JSON error body (429 with
                        "Retry-After: retry_after", default 1)
        reset           close the connection with a TCP RST, no answer
        reset_mid       headers and the first frac (0.5) of the body, RST
        truncate        headers (full Content-Length), frac of the body, FIN
        slow            wait delay (default 2) s before answering
        stall           headers, frac of the body, wait delay s, the rest
        trickle         the body at rate (default 65536) bytes/s
        corrupt         flip bytes in the middle of the body
        norange         drop Range/If-Range upstream (a 200 full answer)
        chunked         answer with Transfer-Encoding: chunked
      after=1 forwards the request first, then replaces the answer with
      the fault (the upstream saw it: status/reset modes only).
  /__redirect?on=1|0[&uses=N][&ttl=S]
      Blob GETs (/v2/NAME/blobs/sha256:HEX) that exist upstream are
      answered "307 Location: /__obj/TOKEN/v2/NAME/blobs/DIGEST?sig=.." on
      the proxy itself, a stand-in for object storage with signed URLs:
      a TOKEN serves uses (default 1) requests within ttl (default 0:
      unlimited) seconds, after that 403 AccessDenied (an expired URL).
  /__referrers?on=1|0
      Act as a registry with the OCI 1.1 referrers API (docker-registry
      2.8 has none): manifests PUT through the proxy with a "subject" are
      remembered, and GET /v2/NAME/referrers/DIGEST[?artifactType=T] is
      answered with an image index of them (off: passed upstream, 404).
  /__stats    counters and the last requests as JSON (method, path,
              Range, X-* request headers, fault, status)
  /__reset    zero the counters and the request log (rules stay)

Everything is bounded: socket timeouts of 30 s (client) and 60 s
(upstream), delays capped at 60 s, request bodies at 512 MiB.
"""
import argparse
import collections
import hashlib
import http.client
import json
import os
import re
import secrets
import socket
import struct
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler

import httpserve

MAX_BODY = 512 << 20
MAX_DELAY = 60.0
UPSTREAM_TIMEOUT = 60
HOP = {"connection", "keep-alive", "proxy-connection", "proxy-authenticate",
       "proxy-authorization", "te", "trailer", "transfer-encoding", "upgrade",
       "expect", "host", "content-length"}
BLOB_RE = re.compile(r"^/v2/(.+)/blobs/(sha256:[0-9a-f]{64})$")
REFERRERS_RE = re.compile(r"^/v2/(.+)/referrers/(sha256:[0-9a-f]{64})$")
MANIFEST_RE = re.compile(r"^/v2/(.+)/manifests/[^/]+$")
STATUS_MODES = re.compile(r"^[1-5][0-9][0-9]$")
MODES = {"none", "reset", "reset_mid", "truncate", "slow", "stall", "trickle",
         "corrupt", "norange", "chunked"}


class State:
    def __init__(self):
        self.lock = threading.Lock()
        self.rule = {"mode": "none", "count": 0}
        self.redirect = {"on": False, "uses": 1, "ttl": 0.0}
        self.referrers = None  # {(name, subject digest): [descriptor]} when on
        self.objs = {}
        self.reset()

    def reset(self):
        self.c = collections.Counter()
        self.log = collections.deque(maxlen=400)

    def take_fault(self, method, path, has_auth):
        """The fault rule for this request (a copy), or None."""
        with self.lock:
            r = self.rule
            if r["mode"] == "none" or r["count"] == 0:
                return None
            if not re.search(r["method"], method) or not re.search(r["path"], path):
                return None
            if r["auth"] and not has_auth:
                return None
            if r["count"] > 0:
                r["count"] -= 1
            self.c["faults"] += 1
            self.c["fault_" + r["mode"]] += 1
            return dict(r)

    def snapshot(self):
        with self.lock:
            return {"counters": dict(self.c), "rule": dict(self.rule),
                    "redirect": dict(self.redirect), "log": list(self.log)}


def num(q, name, default, lo, hi, kind=float):
    v = q.get(name, [None])[0]
    if v is None or v == "":
        return default
    x = kind(v)
    if not lo <= x <= hi:
        raise ValueError("%s out of range" % name)
    return x


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 30
    server_version = "ferry-faultproxy"

    def log_message(self, fmt, *a):
        pass

    # --- plumbing ---------------------------------------------------

    def read_body(self):
        te = self.headers.get("Transfer-Encoding", "").lower()
        if "chunked" in te:
            out = bytearray()
            while True:
                line = self.rfile.readline(1024)
                if not line:
                    raise ConnectionError("eof in chunked body")
                n = int(line.split(b";")[0].strip() or b"0", 16)
                if n == 0:
                    while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(out)
                if len(out) + n > MAX_BODY:
                    raise ValueError("body too large")
                out += self.rfile.read(n)
                self.rfile.readline(16)
        n = int(self.headers.get("Content-Length") or 0)
        if n < 0 or n > MAX_BODY:
            raise ValueError("bad Content-Length")
        return self.rfile.read(n) if n else b""

    def simple(self, status, body=b"", ctype="application/json", extra=()):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)

    def json_reply(self, obj):
        self.simple(200, json.dumps(obj, indent=1).encode() + b"\n")

    def rst(self):
        """Abort the connection with a TCP reset."""
        self.close_connection = True
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                       struct.pack("ii", 1, 0))
            # rfile holds a reference that would keep the socket open:
            # take the descriptor away from the socket object and close
            # it here (the object is left with fd -1, later closes no-op).
            os.close(self.connection.detach())
        except OSError:
            pass

    def fin(self):
        """End the connection cleanly (the client sees a short body)."""
        self.close_connection = True
        try:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def base(self):
        return "http://" + self.headers.get("Host", "%s:%d" % self.server.server_address[:2])

    def note(self, entry):
        with st.lock:
            st.log.append(entry)
        if logf:
            with st.lock:
                logf.write(json.dumps(entry) + "\n")

    # --- control ----------------------------------------------------

    def control(self, u):
        q = urllib.parse.parse_qs(u.query)
        try:
            if u.path == "/__fault":
                mode = q.get("mode", ["none"])[0]
                if mode not in MODES and not STATUS_MODES.match(mode):
                    raise ValueError("unknown mode %r" % mode)
                rule = {"mode": mode,
                        "count": num(q, "count", 1, -1, 1 << 30, int),
                        "method": q.get("method", [""])[0],
                        "path": q.get("path", [""])[0],
                        "auth": q.get("auth", ["0"])[0] == "1",
                        "delay": num(q, "delay", 2.0, 0, MAX_DELAY),
                        "rate": num(q, "rate", 65536, 1, 1 << 30, int),
                        "frac": num(q, "frac", 0.5, 0, 1),
                        "retry_after": q.get("retry_after", ["1"])[0],
                        "after": q.get("after", ["0"])[0] == "1"}
                re.compile(rule["method"])
                re.compile(rule["path"])
                with st.lock:
                    st.rule = rule
            elif u.path == "/__redirect":
                with st.lock:
                    st.redirect = {"on": q.get("on", ["1"])[0] == "1",
                                   "uses": num(q, "uses", 1, 1, 1 << 30, int),
                                   "ttl": num(q, "ttl", 0.0, 0, 3600)}
            elif u.path == "/__referrers":
                with st.lock:
                    st.referrers = {} if q.get("on", ["1"])[0] == "1" else None
            elif u.path == "/__reset":
                with st.lock:
                    st.reset()
            elif u.path != "/__stats":
                return self.simple(404, b'{"error":"unknown control path"}\n')
        except (ValueError, re.error) as e:
            return self.simple(400, json.dumps({"error": str(e)}).encode() + b"\n")
        self.json_reply(st.snapshot())

    # --- upstream ---------------------------------------------------

    def upstream(self, method, path, body, drop_range=False, auth=None):
        hdrs = {}
        for k, v in self.headers.items():
            lk = k.lower()
            if lk in HOP or (drop_range and lk in ("range", "if-range")):
                continue
            if auth is not None and lk == "authorization":
                continue
            hdrs[k] = v
        if auth:
            hdrs["Authorization"] = auth
        hdrs["Host"] = up
        if body or method in ("POST", "PUT", "PATCH"):
            hdrs["Content-Length"] = str(len(body))
        conn = http.client.HTTPConnection(up_host, up_port, timeout=UPSTREAM_TIMEOUT)
        try:
            try:
                conn.request(method, path, body=body or None, headers=hdrs)
            except (BrokenPipeError, ConnectionResetError):
                # The upstream answered (e.g. 401) without reading a large
                # body and closed: its answer may still be readable.
                pass
            try:
                r = conn.getresponse()
                data = r.read()
            except (OSError, http.client.HTTPException) as e:
                msg = json.dumps({"errors": [{"code": "BAD_GATEWAY", "message": str(e)}]})
                return 502, "Bad Gateway", [("Content-Type", "application/json")], msg.encode()
            return r.status, r.reason, r.getheaders(), data
        finally:
            conn.close()

    def fixed_headers(self, headers):
        out = []
        for k, v in headers:
            lk = k.lower()
            if (lk in HOP and lk != "content-length") or lk in ("date", "server"):
                continue
            if lk == "location" and v.startswith("http://" + up):
                v = self.base() + v[len("http://" + up):]
            out.append((k, v))
        return out

    # --- request ----------------------------------------------------

    def handle_any(self):
        u = urllib.parse.urlsplit(self.path)
        if u.path.startswith("/__") and not u.path.startswith("/__obj/"):
            if self.command != "GET":
                return self.simple(405)
            return self.control(u)
        try:
            body = self.read_body()
        except (ValueError, ConnectionError, OSError) as e:
            self.close_connection = True
            return self.simple(400, json.dumps({"error": str(e)}).encode())
        entry = {"method": self.command, "path": self.path,
                 "range": self.headers.get("Range"), "t": round(time.time(), 3),
                 "authorization": self.headers.get("Authorization"),
                 "agent": self.headers.get("User-Agent"),
                 "x": ";".join("%s=%s" % (k, v) for k, v in self.headers.items()
                               if k.lower().startswith("x-"))}
        with st.lock:
            st.c["requests"] += 1
            st.c["method_" + self.command] += 1
        f = st.take_fault(self.command, self.path, "Authorization" in self.headers)
        entry["fault"] = f["mode"] if f else None
        try:
            entry["status"] = self.serve(u, body, f)
        except (OSError, http.client.HTTPException) as e:
            entry["status"] = "error: %s" % e
            self.close_connection = True
        self.note(entry)

    def serve(self, u, body, f):
        mode = f["mode"] if f else "none"
        if f and not f["after"]:
            if STATUS_MODES.match(mode):
                return self.fault_status(f)
            if mode == "reset":
                self.rst()
                return "reset"
            if mode == "slow":
                time.sleep(f["delay"])

        ref = REFERRERS_RE.match(u.path)
        if ref and self.command == "GET" and st.referrers is not None:
            return self.referrers_get(ref, u)
        if u.path.startswith("/__obj/"):
            res = self.object_get(u, body, mode == "norange")
            if isinstance(res, int):
                return res
        elif self.command == "GET" and BLOB_RE.match(u.path) and self.redirect_on():
            res = self.redirect(u)
            if isinstance(res, int):
                return res
        else:
            res = self.upstream(self.command, self.path, body,
                                drop_range=(mode == "norange"))
        status, reason, headers, data = res
        if self.command == "PUT" and 200 <= status < 300:
            self.referrers_note(u, body)

        if f and f["after"]:
            if STATUS_MODES.match(mode):
                return self.fault_status(f)
            if mode == "reset":
                self.rst()
                return "reset"
        return self.send_upstream(status, reason, headers, data, f)

    def referrers_note(self, u, body):
        m = MANIFEST_RE.match(u.path)
        if not m or st.referrers is None:
            return
        try:
            doc = json.loads(body)
            subject = doc["subject"]["digest"]
        except (ValueError, KeyError, TypeError):
            return
        desc = {"mediaType": doc.get("mediaType", "application/vnd.oci.image.manifest.v1+json"),
                "digest": "sha256:" + hashlib.sha256(body).hexdigest(),
                "size": len(body)}
        for k in ("artifactType", "annotations"):
            if k in doc:
                desc[k] = doc[k]
        with st.lock:
            st.referrers.setdefault((m.group(1), subject), []).append(desc)

    def referrers_get(self, ref, u):
        want = urllib.parse.parse_qs(u.query).get("artifactType", [None])[0]
        with st.lock:
            found = list(st.referrers.get((ref.group(1), ref.group(2)), []))
        found = [d for d in found if want is None or d.get("artifactType") == want]
        body = json.dumps({"schemaVersion": 2,
                           "mediaType": "application/vnd.oci.image.index.v1+json",
                           "manifests": found}).encode()
        self.simple(200, body, ctype="application/vnd.oci.image.index.v1+json")
        return 200

    def fault_status(self, f):
        code = int(f["mode"])
        extra = [("Retry-After", f["retry_after"])] if code == 429 else []
        msg = {"errors": [{"code": "FAULT", "message": "injected %d" % code}]}
        self.simple(code, json.dumps(msg).encode(), extra=extra)
        return code

    def send_upstream(self, status, reason, headers, data, f):
        mode = f["mode"] if f else "none"
        head = self.command == "HEAD" or status in (204, 304) or status < 200
        hdrs = self.fixed_headers(headers)
        if not head:
            hdrs = [(k, v) for k, v in hdrs if k.lower() != "content-length"]
            if mode == "corrupt" and data:
                b = bytearray(data)
                mid = len(b) // 2
                for i in range(mid, min(mid + 16, len(b))):
                    b[i] ^= 0xA5
                data = bytes(b)
        self.send_response(status, reason)
        for k, v in hdrs:
            self.send_header(k, v)
        if head:
            self.end_headers()
            return status
        if mode == "chunked":
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(0, len(data), 65536):
                c = data[i:i + 65536]
                self.wfile.write(b"%x\r\n%s\r\n" % (len(c), c))
            self.wfile.write(b"0\r\n\r\n")
            return status
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        cut = int(len(data) * f["frac"]) if f else len(data)
        if mode in ("truncate", "reset_mid") and data:
            self.wfile.write(data[:cut])
            if mode == "truncate":
                self.fin()
            else:
                time.sleep(0.05)
                self.rst()
            return "%d %s" % (status, mode)
        if mode == "stall" and data:
            self.wfile.write(data[:cut])
            time.sleep(f["delay"])
            self.wfile.write(data[cut:])
            return status
        if mode == "trickle" and data:
            step = max(1, f["rate"] // 20)
            deadline = time.monotonic() + 120
            for i in range(0, len(data), step):
                self.wfile.write(data[i:i + step])
                if time.monotonic() > deadline:
                    self.rst()
                    return "%d trickle-aborted" % status
                time.sleep(0.05)
            return status
        self.wfile.write(data)
        return status

    # --- object storage stand-in -------------------------------------

    def redirect_on(self):
        with st.lock:
            return st.redirect["on"]

    def redirect(self, u):
        auth = self.headers.get("Authorization")
        # Registries only redirect for blobs they have: ask first.
        status, reason, headers, data = self.upstream("HEAD", u.path, b"",
                                                      drop_range=True,
                                                      auth=auth or "")
        if status != 200:
            # Not there (or not allowed): the registry's own answer.
            return self.upstream("GET", u.path, b"", auth=auth or "")
        tok = secrets.token_hex(12)
        with st.lock:
            ttl = st.redirect["ttl"]
            st.objs[tok] = {"path": u.path, "auth": auth,
                            "uses": st.redirect["uses"],
                            "until": time.monotonic() + ttl if ttl else None}
            st.c["redirects"] += 1
        loc = "%s/__obj/%s%s?sig=%s" % (self.base(), tok, u.path, secrets.token_hex(8))
        self.simple(307, b"", ctype="text/plain", extra=[("Location", loc)])
        return 307

    def object_get(self, u, body, drop_range):
        m = re.match(r"^/__obj/([0-9a-f]+)(/v2/.*)$", u.path)
        o = None
        with st.lock:
            if m:
                o = st.objs.get(m.group(1))
            live = (o is not None and o["path"] == m.group(2) and o["uses"] > 0 and
                    (o["until"] is None or time.monotonic() < o["until"]))
            if live:
                o["uses"] -= 1
                st.c["obj_ok"] += 1
            else:
                st.c["obj_denied"] += 1
        if not live or self.command not in ("GET", "HEAD"):
            x = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied'
                 b'</Code><Message>Request has expired</Message></Error>\n')
            self.simple(403, x, ctype="application/xml")
            return 403
        return self.upstream(self.command, o["path"], b"", drop_range=drop_range,
                             auth=o["auth"] or "")

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = handle_any


def main():
    global up, up_host, up_port, logf
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--upstream", required=True)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--port-file")
    p.add_argument("--log")
    args = p.parse_args()
    up = args.upstream
    up_host, _, port = up.rpartition(":")
    up_port = int(port)
    logf = open(args.log, "a", buffering=1) if args.log else None
    httpserve.serve(Handler, args.port, args.port_file)


st = State()
up = up_host = None
up_port = 0
logf = None
if __name__ == "__main__":
    main()
