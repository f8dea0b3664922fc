# SPDX-License-Identifier: MIT
# Shared by bench/*.sh (sourced after setting $top): the binaries, the run
# count and the datasets, cached in $data.

# Debian's tools, not the caller's: a python3 early on PATH may be a pyenv
# shim (0.3 s of bash per start) running another interpreter than the one
# `make deps` gives its python3-* modules; the WAN proxy is one of them.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin

BIN=${BIN:-$top/bin}
case $BIN in /*) ;; *) BIN=$top/$BIN ;; esac
ferry=$BIN/ferry
data=${FERRY_BENCH_DIR:-/var/tmp/ferry-bench}
runs=${FERRY_BENCH_RUNS:-5}

dataset() { # name → builds $data/NAME.tar, .tar.gz and the reference tree
	local name=$1 include=
	case $name in
	big) include=--include=python3,perl,gcc ;;
	numpy) include=--include=python3-numpy ;; # bench/peers.sh
	esac
	mkdir -p "$data" # a new machine has none of it
	if [ ! -f "$data/$name.tar" ]; then
		echo "bench: building $name.tar with mmdebstrap (once)" >&2
		mmdebstrap --variant=minbase --quiet $include bookworm "$data/$name.tmp.tar"
		mv "$data/$name.tmp.tar" "$data/$name.tar"
	fi
	[ -f "$data/$name.tar.gz" ] || gzip -6 -c "$data/$name.tar" > "$data/$name.tar.gz"
	if [ ! -d "$data/$name.ref" ]; then
		mkdir -p "$data/$name.ref.tmp"
		tar --numeric-owner --xattrs --xattrs-include='*' -xpf "$data/$name.tar" \
			-C "$data/$name.ref.tmp"
		mv "$data/$name.ref.tmp" "$data/$name.ref"
	fi
}

# $data/gib.tar.gz: a 1 GiB layer for the peak-RSS goal: the "big" tree
# twice (under a/ and b/, so half of it dedups) and 256 random 1 MiB files.
gib_layer() {
	[ -f "$data/gib.tar.gz" ] && return 0
	dataset big
	echo "bench: building gib.tar.gz (once)" >&2
	python3 - "$data/big.tar" <<'PY' | gzip -6 >"$data/gib.tmp.tar.gz"
import io, random, sys, tarfile
out = tarfile.open(fileobj=sys.stdout.buffer, mode="w|", format=tarfile.PAX_FORMAT)
for prefix in ("a/", "b/"):
    with tarfile.open(sys.argv[1]) as src:
        for m in src:
            data = src.extractfile(m) if m.isreg() else None
            m.name = prefix + m.name.lstrip("./")
            if m.islnk():
                m.linkname = prefix + m.linkname.lstrip("./")
            out.addfile(m, data)
rnd = random.Random(1)
for i in range(256):
    m = tarfile.TarInfo("rand/%03d.bin" % i)
    m.size = 1 << 20
    out.addfile(m, io.BytesIO(rnd.randbytes(m.size)))
out.close()
PY
	mv "$data/gib.tmp.tar.gz" "$data/gib.tar.gz"
}

# bench_workdir NAME: a fresh $work under $data, removed on exit with every
# mount under it, every ferryd whose socket is in it, and the registry of
# bench_image.
bench_workdir() {
	mkdir -p "$data"
	work=$(mktemp -d "$data/$1.XXXXXX")
	reg_pid=
	trap bench_cleanup EXIT
}
bench_cleanup() {
	local m s
	for m in $(awk -v w="$work/" 'index($5, w) == 1 { print $5 }' /proc/self/mountinfo | sort -r); do
		umount "$m" 2>/dev/null || umount -l "$m"
	done
	for s in $(find "$work" -type s -name '*.sock' 2>/dev/null); do
		ferryd_stop "$s" || true
	done
	[ -n "$reg_pid" ] && kill "$reg_pid" 2>/dev/null
	rm -rf "$work"
}

# The pid of the ferryd answering SOCK (its `ferry mount --list`), or
# nothing when none answers.
ferryd_pid() { # SOCK [FERRY]
	timeout -k 1 10 "${2:-$ferry}" mount --list --json --socket "$1" </dev/null 2>/dev/null |
		python3 -c 'import json, sys; print(json.load(sys.stdin).get("pid", ""))' 2>/dev/null
}
# Stops the ferryd answering SOCK, by its pid, and waits for it to exit
# (5 s); processes are never picked by name.
ferryd_stop() { # SOCK [FERRY]
	local pid
	pid=$(ferryd_pid "$@")
	[ -n "$pid" ] || return 0
	kill "$pid" 2>/dev/null || return 0
	for _ in $(seq 50); do
		kill -0 "$pid" 2>/dev/null || return 0
		sleep 0.1
	done
	echo "bench: ferryd (pid $pid, socket $1) did not exit" >&2
	return 1
}

# bench_builds DEFAULT_ROUNDS [OLD_BIN] NEW_BIN [ROUNDS]: $old (empty with
# one build), $new and $rounds from a script's arguments; usage on others.
bench_builds() {
	local def=$1
	shift
	if [ $# -ge 2 ] && [ -d "$2" ]; then
		old=$(cd "$1" && pwd) new=$(cd "$2" && pwd) rounds=${3:-$def}
	elif [ $# -ge 1 ] && [ $# -le 2 ]; then
		old='' new=$(cd "$1" && pwd) rounds=${2:-$def}
	else
		echo "usage: $0 [OLD_BIN] NEW_BIN [ROUNDS]" >&2
		exit 2
	fi
}

# bench_wanproxy NAME DELAY_MS MBIT: tests/tools/wanproxy.py in front of
# $reg, its ports in $work/wp-NAME.{port,stats}, its pid added to
# $wp_pids (the caller stops them); wstat NAME [--reset] KEY reads one of
# its counters.
bench_wanproxy() {
	python3 "$top/tests/tools/wanproxy.py" --upstream "$reg" --port-file "$work/wp-$1.port" \
		--stats-port-file "$work/wp-$1.stats" --delay-ms "$2" --rate-mbit "$3" &
	wp_pids+=($!)
	for _ in $(seq 50); do [ -s "$work/wp-$1.stats" ] && break; sleep 0.1; done
}
wstat() { python3 "$top/tests/tools/wanproxy.py" --query "$(cat "$work/wp-$1.stats")" "${@:2}"; }

# bench_image SET: a docker-registry in $work ($reg, $reg_pid) holding
# dataset SET as a one-layer gzip image (docker://$reg/src/SET:1, as a
# registry would hold it) and its ferry conversion ($image).
bench_image() {
	local port
	read -r port reg_pid < <("$top/tests/tools/start-registry.sh" "$work/registry")
	reg=127.0.0.1:$port
	umoci init --layout "$work/src" >/dev/null
	umoci new --image "$work/src:1" >/dev/null
	# umoci compresses the tar with gzip itself.
	umoci raw add-layer --image "$work/src:1" "$data/$1.tar" >/dev/null
	skopeo copy --quiet --dest-tls-verify=false "oci:$work/src:1" "docker://$reg/src/$1:1"
	"$ferry" convert -q "docker://$reg/src/$1:1" "docker://$reg/ferry/$1:1"
	image=docker://$reg/ferry/$1:1
}
