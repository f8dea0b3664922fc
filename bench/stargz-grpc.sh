#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Builds stargz-snapshotter's `containerd-stargz-grpc` for bench/peers.sh
# and prints its path. Debian packages the snapshotter's library sources
# (golang-github-containerd-stargz-snapshotter-dev) and `ctr-remote`, not the
# daemon, so its command (upstream cmd/containerd-stargz-grpc/{main,server}.go
# at the tag of Debian's version) is built here offline, in GOPATH mode,
# against /usr/share/gocode, as contrib/containerd/go.sh builds ferry's.
#
# The upstream files are never in this repository: they are read from
#   $FERRY_PEERS_CACHE/stargz-snapshotter-vVERSION/cmd/containerd-stargz-grpc/
# (default /var/tmp/ferry-peers), or, when that is missing, extracted from a
# git clone of github.com/containerd/stargz-snapshotter named by
# $FERRY_STARGZ_GIT (`git show vVERSION:...`).
#
# Debian lacks the Go packages of three optional parts, so they are left
# out by a minimal edit made at build time (edit_main below; every anchor
# must match, or the build stops): the IPFS resolver, the bbolt "db"
# metadata store and the kubeconfig/CRI keychains (with the grpc backoff and
# insecure-credentials packages only they use; Debian's grpc is older). The
# defaults that remain, in-memory metadata and docker-config credentials,
# are the path the bench measures. The library's service/resolver/cri.go
# (the CRI registry-mirror config, k8s cri-api) is left out by building
# from a tree of links to Debian's sources without it, first in GOPATH.
# go-systemd's v22 import path is Debian's unversioned one.
#
# The binary is cached next to the sources, keyed by the Go and Go-source
# package versions, the upstream files and this script.
set -euo pipefail
cache=${FERRY_PEERS_CACHE:-/var/tmp/ferry-peers}
pkgver=$(dpkg-query -W -f='${Version}' golang-github-containerd-stargz-snapshotter-dev) || {
	echo "stargz-grpc.sh: golang-github-containerd-stargz-snapshotter-dev is not installed; run make deps" >&2
	exit 1
}
ver=${pkgver%%-*}
ver=${ver%%~*}
src=$cache/stargz-snapshotter-v$ver/cmd/containerd-stargz-grpc
if [ ! -f "$src/main.go" ] || [ ! -f "$src/server.go" ]; then
	if [ -z "${FERRY_STARGZ_GIT:-}" ]; then
		echo "stargz-grpc.sh: $src/main.go and server.go are missing: copy them from" \
			"github.com/containerd/stargz-snapshotter tag v$ver, or set FERRY_STARGZ_GIT" \
			"to a clone of it" >&2
		exit 1
	fi
	mkdir -p "$src"
	for f in main.go server.go; do
		git -C "$FERRY_STARGZ_GIT" show "v$ver:cmd/containerd-stargz-grpc/$f" >"$src/$f.tmp"
		mv "$src/$f.tmp" "$src/$f"
	done
fi
key=$( { dpkg-query -W -f='${Package} ${Version}\n' golang-go 'golang-*-dev' 2>/dev/null
	cat "$src/main.go" "$src/server.go" "$0"; } | sha256sum | cut -c1-16)
out=$cache/containerd-stargz-grpc-$key
if [ -x "$out" ]; then
	echo "$out"
	exit 0
fi

gopath=$cache/gopath-$key
rm -rf "$gopath"
main=$gopath/src/stargz-grpc
mkdir -p "$main" "$gopath/src/github.com/containerd"
cp "$src/server.go" "$main/"
# A tree of links to Debian's sources, less service/resolver/cri.go (GOPATH
# mode takes a package from the first entry that has its directory).
cp -rs /usr/share/gocode/src/github.com/containerd/stargz-snapshotter \
	"$gopath/src/github.com/containerd/"
rm "$gopath/src/github.com/containerd/stargz-snapshotter/service/resolver/cri.go"

# edit_main IN OUT: the edit described above. Blocks are removed from their
# opening line to the line that closes them at the same indentation.
python3 - "$src/main.go" "$main/main.go" <<'PY'
import re, sys
lines = open(sys.argv[1]).read().split("\n")

def fail(what):
    sys.exit("stargz-grpc.sh: upstream main.go changed, cannot remove %s; update the edit" % what)

def drop_import(path):
    hits = [i for i, l in enumerate(lines) if re.fullmatch(r'\s*(\w+ )?"%s"' % re.escape(path), l)]
    if len(hits) != 1:
        fail("import " + path)
    del lines[hits[0]]

def drop_block(opening, end="}"):
    hits = [i for i, l in enumerate(lines) if l.strip() == opening]
    if len(hits) != 1:
        fail(opening)
    i = hits[0]
    indent = lines[i][:len(lines[i]) - len(lines[i].lstrip())]
    for j in range(i + 1, len(lines)):
        if lines[j] == indent + end:
            del lines[i:j + 1 if end == "}" else j]
            return
    fail(opening)

for p in ("github.com/containerd/stargz-snapshotter/cmd/containerd-stargz-grpc/db",
          "github.com/containerd/stargz-snapshotter/cmd/containerd-stargz-grpc/ipfs",
          "github.com/containerd/stargz-snapshotter/service/keychain/cri",
          "github.com/containerd/stargz-snapshotter/service/keychain/kubeconfig",
          "go.etcd.io/bbolt", "google.golang.org/grpc/backoff",
          "google.golang.org/grpc/credentials/insecure",
          "k8s.io/cri-api/pkg/apis/runtime/v1alpha2",
          "github.com/containerd/containerd/defaults",
          "github.com/containerd/containerd/pkg/dialer", "io"):
    drop_import(p)
drop_block("if config.Config.KubeconfigKeychainConfig.EnableKeychain {")
drop_block("if config.Config.CRIKeychainConfig.EnableKeychain {")
drop_block("if config.IPFS {")
drop_block("case dbMetadataType:", end="default:")
text = "\n".join(lines)
old = '"github.com/coreos/go-systemd/v22/daemon"'
if text.count(old) != 1:
    fail(old)
text = text.replace(old, '"github.com/coreos/go-systemd/daemon"')
open(sys.argv[2], "w").write(text)
PY

export GO111MODULE=off GOFLAGS='' GOPROXY=off GOTOOLCHAIN=local CGO_ENABLED=0
export GOPATH="$gopath:/usr/share/gocode"
export GOCACHE=$cache/gocache
(cd "$main" && go build -o "$out.tmp" stargz-grpc)
mv "$out.tmp" "$out"
rm -rf "$gopath"
echo "$out"
