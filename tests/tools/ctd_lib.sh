# shellcheck shell=bash
# SPDX-License-Identifier: MIT
# A containerd of its own for tests/e2e/containerd.sh and bench/containerd.sh
# (sourced): configuration in a scratch directory, waiting for sockets,
# stopping by PID, and removing runc's fixed-path state afterwards.

# ctd_configs DIR SNROOT FERRYD_SOCK CACHE MODE: DIR/config.toml (root,
# state and sockets under DIR, CRI off, the proxy snapshotter "ferry" at
# DIR/snapshotter.sock) and DIR/snapshotter.json for ferry-snapshotter.
ctd_configs() {
	cat >"$1/config.toml" <<TOML
version = 2
root = "$1/root"
state = "$1/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$1/containerd.sock"
[ttrpc]
  address = "$1/containerd.sock.ttrpc"
[proxy_plugins.ferry]
  type = "snapshot"
  address = "$1/snapshotter.sock"
TOML
	cat >"$1/snapshotter.json" <<JSON
{"address": "$1/snapshotter.sock", "root": "$2", "ferrydSocket": "$3",
 "cacheDir": "$4", "mode": "$5"}
JSON
}

# ctd_wait_sock SOCKET PID SECS: the socket exists while PID lives.
ctd_wait_sock() {
	local i
	for i in $(seq $(($3 * 10))); do
		[ -S "$1" ] && return 0
		kill -0 "$2" 2>/dev/null || return 1
		sleep 0.1
	done
	return 1
}

# ctd_stop PID: SIGTERM, SIGKILL after 10 s.
ctd_stop() {
	local i
	[ -n "$1" ] || return 0
	kill -TERM "$1" 2>/dev/null || return 0
	for i in $(seq 100); do
		kill -0 "$1" 2>/dev/null || return 0
		sleep 0.1
	done
	kill -KILL "$1" 2>/dev/null || true
}

# Whether /run/containerd existed before (ctd_clean_run removes it if not).
CTD_HAD_RUN=0
[ -d /run/containerd ] && CTD_HAD_RUN=1

# ctd_clean_run NS: runc keeps its state at a fixed path per namespace.
ctd_clean_run() {
	rm -rf "/run/containerd/runc/$1"
	[ "$CTD_HAD_RUN" = 1 ] || rmdir /run/containerd/runc /run/containerd/s \
		/run/containerd/fifo /run/containerd 2>/dev/null || true
}
