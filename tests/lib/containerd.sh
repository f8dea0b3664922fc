# shellcheck shell=bash
# SPDX-License-Identifier: MIT
# A containerd of its own for tests/e2e/containerd.sh and bench/containerd.sh
# (sourced): configuration in a scratch directory, waiting for sockets,
# stopping by PID, and removing runc's fixed-path state afterwards.

# ctd_configs DIR SNROOT FERRYD_SOCK CACHE MODE [JSON]: DIR/config.toml
# (root, state and sockets under DIR, CRI off unless CTD_CRI holds its
# tables, the proxy snapshotter "ferry" at DIR/snapshotter.sock) and
# DIR/snapshotter.json for ferry-snapshotter (hosts directory DIR/certs.d,
# not the machine's), with JSON's members added (e.g. its "pullers").
CTD_CRI=
ctd_configs() {
	local cri_off='disabled_plugins = ["io.containerd.grpc.v1.cri"]'
	[ -z "$CTD_CRI" ] || cri_off=
	cat >"$1/config.toml" <<TOML
version = 2
root = "$1/root"
state = "$1/state"
$cri_off
[grpc]
  address = "$1/containerd.sock"
[ttrpc]
  address = "$1/containerd.sock.ttrpc"
[proxy_plugins.ferry]
  type = "snapshot"
  address = "$1/snapshotter.sock"
$CTD_CRI
TOML
	cat >"$1/snapshotter.json" <<JSON
{"address": "$1/snapshotter.sock", "root": "$2", "ferrydSocket": "$3",
 "cacheDir": "$4", "mode": "$5", "hostsDir": "$1/certs.d"${6:+, $6}}
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

# ctd_clean_run NS: runc keeps its state at a fixed path per namespace,
# unless the runtime's options name a Root of its own (CTD_RUNC_ROOT=1).
CTD_RUNC_ROOT=
ctd_clean_run() {
	[ -n "$CTD_RUNC_ROOT" ] || rm -rf "/run/containerd/runc/$1"
	[ "$CTD_HAD_RUN" = 1 ] || rmdir /run/containerd/runc /run/containerd/s \
		/run/containerd/fifo /run/containerd 2>/dev/null || true
}

# ---------------------------------------------------------------- e2e
# For tests/e2e (lib/common.sh and lib/lazy.sh sourced first): one containerd in
# $CTD with ferry-snapshotter ($SNAP, state in $SNROOT) and a ferryd on
# $FSOCK with cache $FCACHE. CTD_NAMESPACES are cleaned up at exit;
# SN_JSON is added to the snapshotter's configuration.
CTD_PID=
SN_PID=
CTD_NAMESPACES=()
SN_JSON=

ctr_ns() { # NS ARGS...
	local ns=$1
	shift
	timeout -k 5 180 ctr --address "$CTD/containerd.sock" -n "$ns" "$@" </dev/null
}

ctd_stop_all() {
	local c ns
	trap '' INT TERM
	if [ -n "$CTD_PID" ] && kill -0 "$CTD_PID" 2>/dev/null; then
		for ns in "${CTD_NAMESPACES[@]}"; do
			for c in $(ctr_ns "$ns" tasks ls -q 2>/dev/null); do
				ctr_ns "$ns" tasks kill -s KILL "$c" >/dev/null 2>&1
				ctr_ns "$ns" tasks rm -f "$c" >/dev/null 2>&1
			done
		done
	fi
	ctd_stop "$CTD_PID"
	ctd_stop "$SN_PID"
	for ns in "${CTD_NAMESPACES[@]}"; do
		ctd_clean_run "$ns"
	done
}

ctd_start_ferryd() { "$FERRYD" --socket "$FSOCK" --persistent; }

# The start of a containerd e2e test ($GO, $SNAP and $CRIPULL set): every
# daemon stopped at exit (before the EXIT trap set so far), then
# ferry-snapshotter built into $SNAP and tests/tools/cripull into
# $CRIPULL; the test ends when a build fails.
ctd_e2e_begin() {
	eval "_ctd_prev_exit=$(trap -p EXIT | sed -e 's/^trap -- //' -e 's/ EXIT$//')"
	trap 'ctd_stop_all; '"$_ctd_prev_exit" EXIT
	check "build ferry-snapshotter (offline, GOPATH mode)" "$GO" build -o "$SNAP" ||
		{ e2e_done; exit 1; }
	check "build cripull" "$GO" --pkg tests/tools/cripull build -o "$CRIPULL" ||
		{ e2e_done; exit 1; }
}

# containerd's gRPC connection to a restarted snapshotter is back (it
# redials with a backoff): at most 30 s. A snapshot is prepared and removed
# because listing snapshots reads containerd's own database only and would
# pass with the snapshotter unreachable.
ctd_reachable() {
	local i ns=${CTD_NAMESPACES[0]} key=ferry-e2e-reachable-$$
	for i in $(seq 60); do
		if ctr_ns "$ns" snapshots --snapshotter ferry prepare "$key" >/dev/null 2>&1; then
			ctr_ns "$ns" snapshots --snapshotter ferry rm "$key"
			return
		fi
		sleep 0.5
	done
	ctr_ns "$ns" snapshots --snapshotter ferry prepare "$key"
}

ctd_start_snapshotter() { # MODE
	ctd_configs "$CTD" "$SNROOT" "$FSOCK" "$FCACHE" "$1" "$SN_JSON"
	rm -f "$CTD/snapshotter.sock"
	"$SNAP" -config "$CTD/snapshotter.json" >>"$CTD/snapshotter.log" 2>&1 &
	SN_PID=$!
	ctd_wait_sock "$CTD/snapshotter.sock" "$SN_PID" 20 &&
		{ [ -z "$CTD_PID" ] || ctd_reachable; } && return 0
	kill -0 "$SN_PID" 2>/dev/null || { wait "$SN_PID"; echo "exit status $?"; }
	tail -5 "$CTD/snapshotter.log"
	return 1
}

ctd_start_containerd() {
	containerd --config "$CTD/config.toml" >>"$CTD/containerd.log" 2>&1 &
	CTD_PID=$!
	ctd_wait_sock "$CTD/containerd.sock" "$CTD_PID" 30 &&
		ctr_ns "${CTD_NAMESPACES[0]}" version >/dev/null ||
		{ tail -5 "$CTD/containerd.log"; return 1; }
}

# What a failed containerd call needs explained: whether the snapshotter
# lives and listens, and the last words of both daemons.
ctd_diagnose() {
	local s=dead
	kill -0 "$SN_PID" 2>/dev/null && s=alive
	echo "snapshotter $SN_PID: $s; socket: $(ls -l "$CTD/snapshotter.sock" 2>&1)"
	echo "snapshotter log:"
	tail -8 "$CTD/snapshotter.log"
	echo "containerd log (snapshotter lines):"
	grep -i snapshotter "$CTD/containerd.log" | tail -5
}

# The ferry mounts under the snapshotter's state.
ctd_ferry_mounts() { findmnt -rn -o TARGET | grep -F "$SNROOT/"; }
