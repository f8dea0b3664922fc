#!/usr/bin/env bash
# Installs the Debian packages ferry's build, tests and benchmarks need.
# Idempotent: does nothing (and needs no network) when all are present.
set -eu
pkgs=(
	# build
	build-essential pkg-config clang libclang-rt-14-dev
	libcurl4-openssl-dev liblz4-dev libzstd-dev liblzma-dev zlib1g-dev
	libjson-c-dev libssl-dev libfuse3-dev libisal-dev
	# tests: format oracle, fixtures, tools
	fuse3 erofs-utils attr acl libcap2-bin tar gzip zstd xz-utils python3
	mmdebstrap umoci skopeo rsync docker-registry apache2-utils openssl
	python3-prometheus-client systemd iproute2 util-linux
	# containerd snapshotter (contrib/containerd): Go sources, runtime, ctr-remote
	golang-go golang-github-containerd-containerd-dev
	golang-github-containerd-stargz-snapshotter-dev containerd runc stargz-snapshotter
	golang-google-protobuf-dev golang-github-pelletier-go-toml-dev # protowire, hosts.toml
	# its CRI test's client (tests/tools/cri): gRPC, protobuf and protoc
	python3-grpcio python3-protobuf protobuf-compiler
	# VM tests (tests/vm): kernel source and build tools, guest userland, QEMU
	linux-source-6.12 bc flex bison libelf-dev cpio busybox-static
	qemu-system-x86 e2fsprogs
	# benchmarks
	hyperfine squashfs-tools squashfuse time fio
)
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
		missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
	echo "ferry: missing packages: ${missing[*]} (run 'make deps' as root)" >&2
	exit 1
fi
echo "ferry: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
