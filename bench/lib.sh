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
