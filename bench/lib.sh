# SPDX-License-Identifier: MIT
# Shared by bench/*.sh (sourced after setting $top): the binaries, the run
# count and the datasets, cached in $data.

BIN=${BIN:-$top/bin}
case $BIN in /*) ;; *) BIN=$top/$BIN ;; esac
ferry=$BIN/ferry
data=${FERRY_BENCH_DIR:-/var/tmp/ferry-bench}
runs=${FERRY_BENCH_RUNS:-5}

dataset() { # name → builds $data/NAME.tar, .tar.gz and the reference tree
	local name=$1 include=
	[ "$name" = big ] && include=--include=python3,perl,gcc
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
