#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""tokenserver: a Docker registry token issuer for tests (127.0.0.1 only).

  tokenserver.py --key KEY.pem --cert CERT.pem [--port N] [--port-file F]
                 [--issuer I] [--service S] [--user NAME:PASS[:ro]]...
                 [--anon-pull PREFIX]... [--refresh-token TOKEN=NAME]...
                 [--expires SECS] [--real-expiry] [--no-post] [--log FILE]

GET /token?service=S&scope=repository:NAME:ACTIONS[&scope=...]
    With "Authorization: Basic" the user is checked (401 when wrong) and
    gets every action asked for (pull only for an ":ro" user); anonymous
    callers get "pull" on repositories starting with an --anon-pull prefix
    and nothing else. An empty grant is still a token (the registry then
    answers 401 insufficient_scope), as real token servers do.
    offline_token=true with credentials adds a refresh_token.
POST /token (OAuth2 form: grant_type=password with username/password, or
    grant_type=refresh_token with refresh_token; scope is space-separated)
    answers access_token + refresh_token; --no-post answers 404 so that
    clients fall back to GET.

Tokens are RS256 JWTs signed with `openssl dgst -sha256 -sign KEY`, the
certificate in the x5c header. The registry accepts tokens up to 60 s past
their "exp" claim; --real-expiry moves "exp" back by that leeway so that a
token really stops working after --expires seconds.

--log FILE gets one line per request: "METHOD PATH kind=get|password|
refresh user=NAME|- granted=SCOPES status=N" (never a secret). --port 0
(the default) binds a free port; --port-file receives the port once
listening.
"""
import argparse
import base64
import hmac
import json
import secrets
import subprocess
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler

import httpserve

LEEWAY = 60          # registry/auth/token: accepted skew on exp and nbf
MAX_BODY = 64 << 10  # token requests are tiny


def b64url(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


class Issuer:
    def __init__(self, args):
        self.args = args
        self.users = {}
        for u in args.user:
            parts = u.split(":")
            if len(parts) not in (2, 3) or not parts[0]:
                sys.exit("tokenserver: --user wants NAME:PASS[:ro], got %r" % u)
            self.users[parts[0]] = (parts[1], len(parts) == 3 and parts[2] == "ro")
        self.refresh = {}
        for r in args.refresh_token:
            tok, _, name = r.partition("=")
            if name not in self.users:
                sys.exit("tokenserver: --refresh-token for unknown user %r" % name)
            self.refresh[tok] = name
        pem = open(args.cert).read()
        body = pem.split("-----BEGIN CERTIFICATE-----")[1].split("-----END CERTIFICATE-----")[0]
        self.x5c = base64.b64encode(base64.b64decode("".join(body.split()))).decode()
        self.lock = threading.Lock()
        self.logf = open(args.log, "a", buffering=1) if args.log else None

    def log(self, line):
        if self.logf:
            with self.lock:
                self.logf.write(line + "\n")

    def check_user(self, name, password):
        u = self.users.get(name)
        return u is not None and hmac.compare_digest(u[0].encode(), password.encode())

    def grant(self, user, scopes):
        """List of access entries for USER (None: anonymous)."""
        access = []
        for sc in scopes:
            typ, _, rest = sc.partition(":")
            name, _, actions = rest.rpartition(":")
            if typ != "repository" or not name:
                continue
            want = [a for a in actions.split(",") if a]
            if user is None:
                ok = any(name.startswith(p) for p in self.args.anon_pull)
                got = ["pull"] if ok and "pull" in want else []
            elif self.users[user][1]:
                got = ["pull"] if "pull" in want else []
            else:
                got = [a for a in want if a in ("pull", "push", "delete", "*")]
            if got:
                access.append({"type": "repository", "name": name, "actions": got})
        return access

    def sign(self, user, access):
        now = int(time.time())
        exp = now + self.args.expires - (LEEWAY if self.args.real_expiry else 0)
        header = {"typ": "JWT", "alg": "RS256", "x5c": [self.x5c]}
        claims = {"iss": self.args.issuer, "aud": self.args.service,
                  "sub": user or "", "exp": exp, "nbf": now - 10, "iat": now,
                  "jti": secrets.token_hex(16), "access": access}
        sinput = (b64url(json.dumps(header, separators=(",", ":")).encode()) + "." +
                  b64url(json.dumps(claims, separators=(",", ":")).encode()))
        sig = subprocess.run(["openssl", "dgst", "-sha256", "-sign", self.args.key],
                             input=sinput.encode(), capture_output=True,
                             timeout=20, check=True).stdout
        return sinput + "." + b64url(sig), now

    def answer(self, user, access, refresh=False):
        tok, now = self.sign(user, access)
        out = {"token": tok, "access_token": tok, "expires_in": self.args.expires,
               "issued_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))}
        if refresh and user is not None:
            rt = secrets.token_urlsafe(24)
            with self.lock:
                self.refresh[rt] = user
            out["refresh_token"] = rt
        return out


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 30
    server_version = "ferry-tokenserver"

    def log_message(self, fmt, *a):
        pass

    def reply(self, status, obj, extra=()):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def denied(self, msg):
        return self.reply(401, {"errors": [{"code": "UNAUTHORIZED", "message": msg}]},
                          [("WWW-Authenticate", 'Basic realm="ferry-tokenserver"')])

    def basic_user(self):
        """(ok, user): user None when no credentials were sent."""
        h = self.headers.get("Authorization", "")
        if not h:
            return True, None
        kind, _, val = h.partition(" ")
        if kind.lower() != "basic":
            return False, None
        try:
            name, _, pw = base64.b64decode(val.strip(), validate=True).decode().partition(":")
        except Exception:
            return False, None
        return iss.check_user(name, pw), name

    def do_GET(self):
        u = urllib.parse.urlsplit(self.path)
        q = urllib.parse.parse_qs(u.query)
        if u.path != "/token":
            iss.log("GET %s status=404" % u.path)
            return self.reply(404, {"errors": [{"code": "NOT_FOUND"}]})
        ok, user = self.basic_user()
        scopes = q.get("scope", [])
        if not ok:
            iss.log("GET %s kind=get user=%s granted=- status=401" % (self.path, user or "?"))
            return self.denied("bad credentials")
        if q.get("service", [iss.args.service])[0] != iss.args.service:
            iss.log("GET %s kind=get status=400" % self.path)
            return self.reply(400, {"errors": [{"code": "UNSUPPORTED", "message": "unknown service"}]})
        access = iss.grant(user, scopes)
        iss.log("GET %s kind=get user=%s granted=%s status=200" %
                (self.path, user or "-", fmt_access(access)))
        self.reply(200, iss.answer(user, access,
                                   q.get("offline_token", [""])[0] == "true"))

    def do_POST(self):
        u = urllib.parse.urlsplit(self.path)
        n = int(self.headers.get("Content-Length") or 0)
        if n < 0 or n > MAX_BODY:
            return self.reply(413, {"error": "too large"})
        body = self.rfile.read(n).decode(errors="replace")
        if u.path != "/token" or iss.args.no_post:
            iss.log("POST %s status=404" % u.path)
            return self.reply(404, {"errors": [{"code": "NOT_FOUND"}]})
        f = urllib.parse.parse_qs(body)
        grant = f.get("grant_type", [""])[0]
        scopes = " ".join(f.get("scope", [])).split()
        user = None
        if grant == "password":
            name = f.get("username", [""])[0]
            if iss.check_user(name, f.get("password", [""])[0]):
                user = name
        elif grant == "refresh_token":
            with iss.lock:
                user = iss.refresh.get(f.get("refresh_token", [""])[0])
        else:
            iss.log("POST /token kind=%s status=400" % (grant or "-"))
            return self.reply(400, {"error": "unsupported_grant_type"})
        if user is None:
            iss.log("POST /token kind=%s user=? granted=- status=401" % grant)
            return self.reply(401, {"error": "invalid_grant"})
        if f.get("service", [iss.args.service])[0] != iss.args.service:
            iss.log("POST /token kind=%s status=400" % grant)
            return self.reply(400, {"error": "invalid_request"})
        access = iss.grant(user, scopes)
        iss.log("POST /token kind=%s user=%s granted=%s status=200" %
                (grant, user, fmt_access(access)))
        out = iss.answer(user, access, refresh=True)
        del out["token"]
        out["scope"] = " ".join(scopes)
        self.reply(200, out)


def fmt_access(access):
    return ",".join("%s:%s" % (a["name"], "+".join(a["actions"])) for a in access) or "-"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--key", required=True)
    p.add_argument("--cert", required=True)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--port-file")
    p.add_argument("--issuer", default="ferry-test-issuer")
    p.add_argument("--service", default="ferry-test-registry")
    p.add_argument("--user", action="append", default=[])
    p.add_argument("--anon-pull", action="append", default=[])
    p.add_argument("--refresh-token", action="append", default=[])
    p.add_argument("--expires", type=int, default=60)
    p.add_argument("--real-expiry", action="store_true")
    p.add_argument("--no-post", action="store_true")
    p.add_argument("--log")
    args = p.parse_args()
    if not 1 <= args.expires <= 86400:
        sys.exit("tokenserver: --expires out of range")
    global iss
    iss = Issuer(args)
    httpserve.serve(Handler, args.port, args.port_file)


iss = None
if __name__ == "__main__":
    main()
