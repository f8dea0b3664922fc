#!/bin/sh
# SPDX-License-Identifier: MIT
# Runs `go CMD ARGS...` on ferry-snapshotter (or, with --pkg DIR, on the Go
# package in DIR, e.g. tests/tools/cripull) offline, in GOPATH mode, against
# Debian's packaged Go sources (/usr/share/gocode): no module proxy, no
# vendored copies. The package is linked into build/go/src; the build cache
# lives under /var/tmp, keyed by the Go and containerd package versions,
# so that a CI run after the first one takes seconds.
#   contrib/containerd/go.sh build -o bin/ferry-snapshotter
#   contrib/containerd/go.sh vet | test -c -o build/snapshotter.test
set -eu
top=$(cd "$(dirname "$0")/../.." && pwd)
dir=contrib/containerd/ferry-snapshotter
if [ "${1:-}" = --pkg ]; then
	dir=$2
	shift 2
fi
pkg=ferry/$(basename "$dir")
link=$top/build/go/src/$pkg
mkdir -p "$(dirname "$link")"
[ -L "$link" ] || ln -sfn "$top/$dir" "$link"
vers=$(dpkg-query -W -f='${Version} ' golang-go golang-github-containerd-containerd-dev \
	golang-github-containerd-stargz-snapshotter-dev golang-google-grpc-dev 2>/dev/null |
	sha256sum | cut -c1-16)
export GO111MODULE=off GOFLAGS= GOPROXY=off GOTOOLCHAIN=local CGO_ENABLED=0
export GOPATH="$top/build/go:/usr/share/gocode"
export GOCACHE=${FERRY_GOCACHE:-/var/tmp/ferry-gocache-$vers}
cmd=$1
shift
cd "$link"
# The release, from VERSION: ferry-snapshotter --version prints it.
if [ "$cmd" = build ]; then
	set -- -ldflags "-X main.version=$(cat "$top/VERSION")" "$@"
fi
exec go "$cmd" "$@" "$pkg"
