#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# ferry-test: alone (times cold starts through the delaying proxy)
# shellcheck disable=SC2016 # expect_sh evaluates its quoted condition
# Lazy mounts across a slow network: docker-registry on 127.0.0.1 behind
# tests/tools/wanproxy.py (5 ms each way, 200 Mbit/s), for --mode fuse and
# --mode fanotify, each on a fresh cache:
#   - 8 concurrent readers in different orders agree with the reference
#     digests, and the proxy saw more than one request in flight at once
#     (ferryd's fetches overlap instead of queueing behind each other)
#   - the whole tree then equals umoci unpack (treecmp)
#   - one reader alone, reading files one after another, still has more
#     than one request in flight (fetch-ahead fetches ahead of it), most of
#     them fetch-ahead's (fetchesAhead), and reads the reference bytes
#   - directory prediction (through a second proxy, 15 ms each way: it
#     needs 25 ms round trips): after a miss in a small file of a Python
#     subpackage, the first small file of a sibling subpackage that lies
#     before it in the blob (where no window reaches) reads without a
#     fetch; a sibling named tests, one without __init__.py, and the
#     siblings of a directory that is no package (usr/share/doc) are not
#     predicted
#   - Python prediction (through the second proxy): after a miss in a
#     module's .pyc, the .pyc of a module its body imports (in another
#     directory, frames away) and the one that module's body imports in
#     turn read without a fetch; a module imported only inside a
#     function is not predicted
#   - ELF prediction: once a program's first bytes are read (as execve
#     reads them), its interpreter, DT_NEEDED libraries (theirs too) and
#     /etc/ld.so.cache read their first and last 4 KiB without a fetch; the same for a program of
#     9 MiB, larger than fetch-ahead fetches whole; a program that only
#     came with its directory's other files is not inspected
. "$(dirname "$0")/../lib/common.sh"
. "$(dirname "$0")/../lib/oci.sh"
. "$(dirname "$0")/../lib/registry.sh"
. "$(dirname "$0")/../lib/lazy.sh"

lazy_setup "(ferry image in the registry)"
if ! wp_start 5 200 2>"$LOG"; then
	notok "start the WAN proxy (wanproxy.py)"
	diag "$LOG"
	e2e_done
fi
WIMG=docker://$WAN/ferry/debian:edit

wan_checks() { # MODE
	local mode=$1 m=$SCRATCH/m-wan-$1 t0 reqs inflight conns
	lazy_use "wan-$mode"
	check "mount --mode $mode through the WAN proxy (fresh cache)" \
		mount_lazy "$mode" "$WIMG" "$m" || return 1
	wp_stat requests reset >/dev/null
	t0=$(now_ms)
	readers_start "wan-$mode" "$m" 170 sorted reverse shuffle pread sorted reverse shuffle pread
	readers_wait
	echo "# $mode: 8 readers took $(($(now_ms) - t0)) ms"
	readers_agree "$mode: 8 concurrent readers through the WAN proxy: every digest equals the reference" \
		"$SCRATCH/ref.sums"
	reqs=$(wp_stat requests)
	inflight=$(wp_stat max_inflight)
	conns=$(wp_stat max_open)
	echo "# $mode: $reqs requests, at most $inflight in flight, $conns connections open at once"
	expect_sh "$mode: fetches overlap (at most $inflight requests in flight at once, > 1)" \
		'[ "$inflight" -gt 1 ] && [ "$conns" -gt 1 ]'
	check "$mode: treecmp umoci unpack == the mount read through the WAN proxy" \
		timeout 180 python3 "$TREECMP" "$ref" "$m"
	check "ferry umount ($mode)" umount_lazy "$m"
}

# One sequential reader of /usr/lib's files (sorted) on a fresh cache.
one_reader() { # MODE
	local mode=$1 m=$SCRATCH/m-wan1-$1 inflight fetches ahead
	lazy_use "wan1-$mode"
	check "mount --mode $mode through the WAN proxy (fresh cache, one reader)" \
		mount_lazy "$mode" "$WIMG" "$m" || return 1
	wp_stat requests reset >/dev/null
	check "$mode: one reader: every file of /usr/lib has the reference bytes" bash -c \
		'diff <(cd "$1/usr/lib" && find . -type f | sort | head -400 | xargs -d "\n" sha256sum) \
		      <(cd "$2/usr/lib" && find . -type f | sort | head -400 | xargs -d "\n" sha256sum)' \
		_ "$ref" "$m"
	inflight=$(wp_stat max_inflight)
	fetches=$(mount_field "$m" fetches)
	ahead=$(mount_field "$m" fetchesAhead)
	echo "# $mode, one reader: $(wp_stat requests) requests ($fetches by ferryd, $ahead fetch-ahead), at most $inflight in flight"
	expect_sh "$mode: one reader, yet requests overlap (at most $inflight in flight, > 1)" \
		'[ "$inflight" -gt 1 ]'
	expect_sh "$mode: fetch-ahead made most of the requests ($ahead of $fetches)" \
		'[ "$ahead" -gt 0 ] && [ $((ahead * 2)) -gt "$fetches" ]'
	check "ferry umount ($mode, one reader)" umount_lazy "$m"
}

# Directory prediction's pair: A, a small file in the 32nd (or last) of
# the subdirectories of one directory that hold small files, and B, the
# small file of the first such subdirectory that comes first in the blob,
# in a frame before A's ("PATH UOFF COFF" lines, A first).
dir_pair() {
	local w p
	python3 - "$ref" <<'EOF' >"$SCRATCH/dirpair.paths" || return 1
import os, sys
ref = sys.argv[1]
def small(d):
    return [os.path.join(d, n) for n in sorted(os.listdir(d))
            if os.path.isfile(os.path.join(d, n)) and not os.path.islink(os.path.join(d, n))
            and 0 < os.path.getsize(os.path.join(d, n)) <= 65536]
for top in ("usr/share/doc", "usr/share", "usr/lib", "etc"):
    d = os.path.join(ref, top)
    if not os.path.isdir(d):
        continue
    subs = [s for s in sorted(os.listdir(d))
            if os.path.isdir(os.path.join(d, s)) and not os.path.islink(os.path.join(d, s))
            and small(os.path.join(d, s))]
    if len(subs) < 4:
        continue
    # The last subdirectory whose siblings, the first 32, include subs[0].
    for p in small(os.path.join(d, subs[min(len(subs), 32) - 1])):
        print("A", os.path.relpath(p, ref))
    for p in small(os.path.join(d, subs[0])):
        print("B", os.path.relpath(p, ref))
    sys.exit(0)
sys.exit(1)
EOF
	# Files stored in the bootstrap (no chunks) are never fetched: skipped.
	while read -r w p; do
		"$FERRY" inspect --json "$IMG" "/$p" | python3 -c '
import json, sys
c = json.load(sys.stdin).get("chunks", [])
if len(c) == 1:
    print(sys.argv[1], sys.argv[2], c[0]["uncompressedOffset"], c[0]["compressedOffset"])' "$w" "$p" ||
			return 1
	done <"$SCRATCH/dirpair.paths" >"$SCRATCH/dirpair.all"
	# The first A, then the B with the lowest blob offset, if its frame
	# is before A's.
	awk '$1 == "A" && !a { a = $2 " " $3 " " $4; ac = $4 }
	     $1 == "B" && (!b || $3 < bu) { b = $2 " " $3 " " $4; bu = $3; bc = $4 }
	     END { if (a && b && bc < ac) { print a; print b } else exit 1 }' \
		"$SCRATCH/dirpair.all"
}

dir_predict() { # MODE
	local mode=$1 m=$SCRATCH/m-wandir-$1 a b big before after
	read -r a _ < <(sed -n 1p "$SCRATCH/dirpair.txt")
	read -r b _ < <(sed -n 2p "$SCRATCH/dirpair.txt")
	lazy_use "wandir-$mode"
	check "mount --mode $mode through the WAN proxy (fresh cache, directory prediction)" \
		mount_lazy "$mode" "$WIMG" "$m" || return 1
	# A first miss starts the fetch-ahead threads, which map the tree (a
	# large file: small ones may be stored in the bootstrap).
	big=$(find "$ref/usr/bin" -type f -printf '%s %P\n' | sort -n | tail -1 | cut -d' ' -f2)
	check "$mode: a first read (/usr/bin/$big)" cmp "$ref/usr/bin/$big" "$m/usr/bin/$big"
	fetch_settle "$m"
	check "$mode: read /$a (a miss in its directory)" cmp "$ref/$a" "$m/$a"
	fetch_settle "$m"
	# Not cacheMisses: a miss that waits for a fetch-ahead thread's fetch
	# of its frame counts as a hit.
	before=$(mount_field "$m" fetches)
	check "$mode: /$b reads the reference bytes" cmp "$ref/$b" "$m/$b"
	after=$(mount_field "$m" fetches)
	expect_sh "$mode: /$b (a sibling directory's, before /$a in the blob, in no Python package) was not predicted: fetched ($before fetches before reading it, $after after)" \
		'[ -n "$before" ] && [ -n "$after" ] && [ "$after" -gt "$before" ]'
	check "ferry umount ($mode, directory prediction)" umount_lazy "$m"
}

# Read PATH of the mount MNT against the tree REF: with WANT "none" it
# must need no fetch (it was predicted: WHY), with "fetch" one at least
# (it was not: WHY).
read_fetches() { # MODE MNT REF PATH WANT WHY
	local mode=$1 m=$2 d=$3 p=$4 want=$5 why=$6 before after
	before=$(mount_field "$m" fetches)
	check "$mode: /$p reads the reference bytes" cmp "$d/$p" "$m/$p"
	after=$(mount_field "$m" fetches)
	if [ "$want" = none ]; then
		expect_sh "$mode: /$p ($why) was there: no fetch ($before fetches before reading it, $after after)" \
			'[ -n "$before" ] && [ "$before" = "$after" ]'
	else
		expect_sh "$mode: /$p ($why) was not predicted: fetched ($before fetches before reading it, $after after)" \
			'[ -n "$before" ] && [ -n "$after" ] && [ "$after" -gt "$before" ]'
	fi
}

# A Python package (py/pkg/__init__.py) with, in blob order: data/, small
# files without __init__.py (a.bin..e.bin, 250 KB each: a..d fill a batch
# frame), tests/, a subpackage of 250 KB modules (m3 ends the next frame),
# and 36 subpackages x00..x35 of 300 KiB each; py/first, a file to read
# first. The code before predicted the first 32 subdirectories with small
# files, data and tests among them. Random bytes, so that frames hold what
# their size says. docker://$REG/ferry/pypkg:1.
py_image() {
	local d=$SCRATCH/pypkg i f
	rm -rf "$d"
	mkdir -p "$d/py/pkg/data" "$d/py/pkg/tests" || return 1
	head -c 1048576 /dev/urandom >"$d/py/first" || return 1
	echo '"""pkg"""' >"$d/py/pkg/__init__.py"
	for f in a b c d e; do head -c 250000 /dev/urandom >"$d/py/pkg/data/$f.bin" || return 1; done
	echo "# tests" >"$d/py/pkg/tests/__init__.py"
	for f in m1 m2 m3 m4; do head -c 250000 /dev/urandom >"$d/py/pkg/tests/$f.py" || return 1; done
	for i in $(seq -w 0 35); do
		mkdir -p "$d/py/pkg/x$i" || return 1
		echo "# x$i" >"$d/py/pkg/x$i/__init__.py"
		for f in m1 m2 m3 m4; do
			head -c 76800 /dev/urandom >"$d/py/pkg/x$i/$f.py" || return 1
		done
	done
	"$FERRY" convert -q "dir:$d" "docker://$REG/ferry/pypkg:1"
}

# After a miss in x29's module (the 30th subpackage, within the first 32
# siblings either way), PATH reads with a fetch (WANT "fetch") or without
# ("none").
py_predict() { # MODE
	local mode=$1 m=$SCRATCH/m-wanpy-$1 d=$SCRATCH/pypkg
	lazy_use "wanpy-$mode"
	check "mount --mode $mode through the WAN proxy (fresh cache, Python packages)" \
		mount_lazy "$mode" "docker://$WAN/ferry/pypkg:1" "$m" || return 1
	check "$mode: a first read (/py/first)" cmp "$d/py/first" "$m/py/first"
	fetch_settle "$m"
	check "$mode: read /py/pkg/x29/m2.py (a miss in a subpackage)" \
		cmp "$d/py/pkg/x29/m2.py" "$m/py/pkg/x29/m2.py"
	fetch_settle "$m"
	read_fetches "$mode" "$m" "$d" py/pkg/x00/__init__.py none \
		"a sibling subpackage's, before x29 in the blob"
	read_fetches "$mode" "$m" "$d" py/pkg/tests/m3.py fetch "tests, or no package"
	read_fetches "$mode" "$m" "$d" py/pkg/data/a.bin fetch "tests, or no package"
	check "ferry umount ($mode, Python packages)" umount_lazy "$m"
}

# Modules compiled by /usr/bin/python3 in a sys.path directory, py/lib/site:
# a package app whose main module imports zmod in its body (which imports
# the package zdeep in its own) and zlazy only inside a function. Their
# .pyc files are each a frame apart (1.2 MB of random small files between
# them), and directory prediction reaches none of them from app (site is
# no package), nor zdeep's from zmod. py/first, a file to read first.
# docker://$REG/ferry/pyimp:1.
pyc_image() {
	local d=$SCRATCH/pyimp s
	s=$d/py/lib/site
	rm -rf "$d"
	mkdir -p "$s/app" "$s/_pad" "$s/b_pad" "$s/zdeep" || return 1
	head -c 1048576 /dev/urandom >"$d/py/first" || return 1
	printf '' >"$s/app/__init__.py"
	# A docstring each: files of 256 bytes or less are stored in the
	# bootstrap, never fetched.
	doc() { printf '"""%s"""\n' "$(head -c 1500 /dev/urandom | base64 -w0)"; }
	{ doc; printf 'import zmod\n\ndef later():\n    import zlazy\n    return zlazy\n'; } >"$s/app/main.py"
	{ doc; printf 'import zdeep\nVALUE = zdeep.VALUE\n'; } >"$s/zmod.py"
	{ doc; echo 'VALUE = 1'; } >"$s/zdeep/__init__.py"
	{ doc; echo 'LAZY = 1'; } >"$s/zlazy.py"
	/usr/bin/python3 -m compileall -q "$s" || return 1
	# Small files join the open batch frame up to 1 MiB: 1.2 MB of them
	# between two modules puts them in different frames.
	for i in 0 1 2 3 4 5; do
		head -c 200000 /dev/urandom >"$s/__pycache__/zf-pad$i" &&
			head -c 200000 /dev/urandom >"$s/__pycache__/zm-pad$i" &&
			head -c 200000 /dev/urandom >"$s/_pad/pad$i" &&
			head -c 200000 /dev/urandom >"$s/b_pad/pad$i" || return 1
	done
	"$FERRY" convert -q "dir:$d" "docker://$REG/ferry/pyimp:1"
}

# After a miss in app/main's .pyc: zmod's and zdeep's (its __init__) read
# without a fetch, zlazy's with one.
pyc_predict() { # MODE
	local mode=$1 m=$SCRATCH/m-wanpyc-$1 d=$SCRATCH/pyimp tag p read
	tag=$(/usr/bin/python3 -c 'import sys; print(sys.implementation.cache_tag)')
	lazy_use "wanpyc-$mode"
	check "mount --mode $mode through the WAN proxy (fresh cache, Python modules)" \
		mount_lazy "$mode" "docker://$WAN/ferry/pyimp:1" "$m" || return 1
	check "$mode: a first read (/py/first)" cmp "$d/py/first" "$m/py/first"
	fetch_settle "$m"
	p=py/lib/site/app/__pycache__/main.$tag.pyc
	check "$mode: read /$p (a miss in a module's .pyc)" cmp "$d/$p" "$m/$p"
	fetch_settle "$m"
	for p in __pycache__/zmod zdeep/__pycache__/__init__; do
		read_fetches "$mode" "$m" "$d" "py/lib/site/$p.$tag.pyc" none \
			"imported by a module body read before"
	done
	read_fetches "$mode" "$m" "$d" "py/lib/site/__pycache__/zlazy.$tag.pyc" fetch \
		"imported inside a function only"
	read=$(mount_field "$m" modulesRead)
	expect_sh "$mode: the imports of app.main and zmod were read (modulesRead $read)" \
		'[ "${read:-0}" -ge 2 ]'
	check "ferry umount ($mode, Python modules)" umount_lazy "$m"
}

# A program in usr/bin with two or more libraries, then its interpreter
# and libraries, as paths of regular files in the reference tree (found
# by name in usr/lib: the tree's links are absolute, meant for a chroot).
elf_set() {
	local p lib name found
	lib_file() { # NAME: a relative link resolves inside the tree
		local f
		f=$(find "$ref/usr/lib" -maxdepth 2 -name "$1" | head -1)
		[ -n "$f" ] && f=$(realpath -e "$f") || return 0
		case $f in "$ref"/*) [ -f "$f" ] && echo "${f#"$ref"/}" ;; esac
	}
	for p in $(find "$ref/usr/bin" -maxdepth 1 -type f -size +16k | sort); do
		name=$(readelf -lW "$p" 2>/dev/null | sed -n 's/.*Requesting program interpreter: \(.*\)\]/\1/p')
		[ -n "$name" ] || continue
		found=()
		for lib in "${name##*/}" $(readelf -dW "$p" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p'); do
			name=$(lib_file "$lib")
			[ -n "$name" ] && found+=("$name")
		done
		[ -f "$ref/etc/ld.so.cache" ] && found+=(etc/ld.so.cache)
		if [ "${#found[@]}" -ge 4 ]; then
			echo "${p#"$ref"/}" "${found[@]}"
			return 0
		fi
	done
	return 1
}

# A file's first and last 4 KiB against the reference: what the loader
# reads of a library first (fetch-ahead queues one of more than two
# chunks by its first and last chunks; the rest comes when read).
ends_cmp() { # REF MNT
	cmp -n 4096 "$1" "$2" && cmp <(tail -c 4096 "$1") <(tail -c 4096 "$2")
}

elf_predict() { # MODE
	local mode=$1 m=$SCRATCH/m-wanelf-$1 prog deps d before after big
	read -r prog deps <"$SCRATCH/elfset.txt"
	lazy_use "wanelf-$mode"
	check "mount --mode $mode through the WAN proxy (fresh cache, ELF prediction)" \
		mount_lazy "$mode" "$WIMG" "$m" || return 1
	# A first miss starts the fetch-ahead threads and their map of files.
	big=$(find "$ref/usr/share" -type f -size +300k -printf '%P\n' | sort | head -1)
	check "$mode: a first read (/usr/share/$big)" cmp "$ref/usr/share/$big" "$m/usr/share/$big"
	fetch_settle "$m"
	check "$mode: the first 64 bytes of /$prog" \
		cmp -n 64 "$ref/$prog" "$m/$prog"
	fetch_settle "$m"
	before=$(mount_field "$m" fetches)
	for d in $deps; do
		check "$mode: /$d: its first and last 4 KiB are the reference bytes" \
			ends_cmp "$ref/$d" "$m/$d"
	done
	after=$(mount_field "$m" fetches)
	expect_sh "$mode: /$prog's interpreter and libraries were there: no fetch ($before fetches before reading them, $after after)" \
		'[ -n "$before" ] && [ "$before" = "$after" ]'
	check "ferry umount ($mode, ELF prediction)" umount_lazy "$m"
}

# A program larger than 8 MiB (the elf_set program padded with zeros),
# its interpreter at /lib64 and its libraries under their DT_NEEDED
# names, a file to read first, and a directory of modules (a text file
# and the program as mod.so): a dir: tree converted into the registry as
# ferry/bigelf:1.
big_elf_image() {
	local prog=$1 d=$SCRATCH/bigelf lib
	rm -rf "$d"
	mkdir -p "$d/usr/bin" "$d/lib64" "$d/usr/lib/x86_64-linux-gnu" "$d/usr/share" \
		"$d/usr/lib/mods" || return 1
	cp "$ref/$prog" "$d/usr/bin/big" && truncate -s 9M "$d/usr/bin/big" || return 1
	seq 2000 >"$d/usr/lib/mods/a.txt" && cp "$ref/$prog" "$d/usr/lib/mods/mod.so" || return 1
	cp -L "$ref/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" "$d/lib64/" || return 1
	for lib in $(readelf -dW "$ref/$prog" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p'); do
		cp -L "$ref/usr/lib/x86_64-linux-gnu/$lib" "$d/usr/lib/x86_64-linux-gnu/$lib" || return 1
	done
	head -c 1048576 /dev/urandom >"$d/usr/share/first" || return 1
	"$FERRY" convert -q "dir:$d" "docker://$REG/ferry/bigelf:1"
}

# In a fresh mount of ferry/bigelf:1, after a first read: COMMAND (a cmp)
# of PATH in the reference and in the mount must bring the interpreter and the
# libraries, so that reading them fetches nothing, predicted from the
# image's record of them with at most READ_MAX headers read in the mount.
#  - elf_big: the first 64 bytes of a program too large to be fetched
#    whole: fanotify misses name a blob range, and the map that names
#    their file must cover the start of such a program too;
#  - elf_modules: see elf_modules below.
bigelf_check() { # MODE NAME WHAT READ_MAX COMMAND... PATH
	local mode=$1 name=$2 what=$3 read_max=$4 m=$SCRATCH/m-$2-$1 d=$SCRATCH/bigelf
	local f before after path recorded read
	shift 4
	path=${*: -1}
	lazy_use "$name-$mode"
	check "mount --mode $mode through the WAN proxy (fresh cache, $what)" \
		mount_lazy "$mode" "docker://$WAN/ferry/bigelf:1" "$m" || return 1
	check "$mode: a first read (/usr/share/first)" cmp "$d/usr/share/first" "$m/usr/share/first"
	fetch_settle "$m"
	check "$mode: $what: $* reads the reference bytes" "${@:1:$#-1}" "$d$path" "$m$path"
	fetch_settle "$m"
	before=$(mount_field "$m" fetches)
	for f in lib64/ld-linux-x86-64.so.2 $(cd "$d" && echo usr/lib/x86_64-linux-gnu/*); do
		check "$mode: /$f: its first and last 4 KiB are the reference bytes" \
			ends_cmp "$d/$f" "$m/$f"
	done
	after=$(mount_field "$m" fetches)
	expect_sh "$mode: $what: the interpreter and libraries were there: no fetch ($before fetches before reading them, $after after)" \
		'[ -n "$before" ] && [ "$before" = "$after" ]'
	# The interpreter has no record (it needs nothing); it is inspected
	# when it is first queued as libc's DT_NEEDED or fetched by directory
	# prediction rather than as the interpreter (the threads race).
	recorded=$(mount_field "$m" programsRecorded)
	read=$(mount_field "$m" programsRead)
	expect_sh "$mode: $what: predicted from the image's loader dependencies, at most $read_max header(s) read in the mount (programsRecorded $recorded, programsRead $read)" \
		'[ "${recorded:-0}" -ge 1 ] && [ -n "$read" ] && [ "$read" -le "$read_max" ]'
	check "ferry umount ($mode, $what)" umount_lazy "$m"
}
# ferry convert records each program's loader dependencies (FORMAT.md
# 2.6) as the stream passes: with 4 KiB chunks mod.so's dynamic section
# lies chunks after its first, which is all that is kept of it.
loader_deps_recorded() {
	local d=$SCRATCH/bigelf o=$SCRATCH/bigelf-4k f=/usr/lib/mods/mod.so want got
	want="$(readelf -lW "$d$f" | sed -n 's/.*Requesting program interpreter: \(.*\)\]/\1/p') $(readelf -dW "$d$f" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p' | tr '\n' ' ')"
	rm -rf "$o"
	check "convert dir:bigelf with 4 KiB chunks" "$FERRY" convert -q --chunk-size 4096 "dir:$d" "dir:$o" || return 1
	got=$("$FERRY" inspect --json "dir:$o" "$f" | /usr/bin/python3 -c '
import json, sys
d = json.load(sys.stdin).get("loaderDeps", {})
print(d.get("interpreter", "-"), " ".join(d.get("needed", [])) + " ")')
	expect_sh "ferry inspect $f: the interpreter and DT_NEEDED names readelf shows ($got)" '[ "$got" = "$want" ]'
	got=$("$FERRY" inspect --json "dir:$o" /usr/lib/mods/a.txt | /usr/bin/python3 -c '
import json, sys
print("loaderDeps" in json.load(sys.stdin))')
	expect_sh "ferry inspect /usr/lib/mods/a.txt: no loader dependencies ($got)" '[ "$got" = False ]'
	rm -rf "$o-none"
	check "convert dir:bigelf --no-loader-deps" \
		"$FERRY" convert -q --no-loader-deps --chunk-size 4096 "dir:$d" "dir:$o-none" || return 1
	got=$("$FERRY" inspect --json "dir:$o-none" | /usr/bin/python3 -c '
import json, sys
print(json.load(sys.stdin)["loaderDeps"])')
	expect_sh "ferry inspect: --no-loader-deps records none ($got)" '[ "$got" = 0 ]'
}

elf_big() { bigelf_check "$1" wanbig "a program > 8 MiB" 1 cmp -n 64 /usr/bin/big; }
# A text file whose directory (which directory prediction may fetch) also
# holds a program: the program is not inspected without a miss of its own
# (inspecting them fetched the libraries of Python's lib-dynload modules
# that `import numpy` never loads, libdb, libsqlite3, libssl...).
elf_modules() { # MODE
	local mode=$1 m=$SCRATCH/m-wanmod-$1 d=$SCRATCH/bigelf recorded read
	lazy_use "wanmod-$mode"
	check "mount --mode $mode through the WAN proxy (fresh cache, a directory of modules)" \
		mount_lazy "$mode" "docker://$WAN/ferry/bigelf:1" "$m" || return 1
	check "$mode: a first read (/usr/share/first)" cmp "$d/usr/share/first" "$m/usr/share/first"
	fetch_settle "$m"
	check "$mode: /usr/lib/mods/a.txt reads the reference bytes" \
		cmp "$d/usr/lib/mods/a.txt" "$m/usr/lib/mods/a.txt"
	fetch_settle "$m"
	recorded=$(mount_field "$m" programsRecorded)
	read=$(mount_field "$m" programsRead)
	expect_sh "$mode: a directory of modules: no program inspected (programsRecorded $recorded, programsRead $read)" \
		'[ "$recorded" = 0 ] && [ "$read" = 0 ]'
	check "ferry umount ($mode, a directory of modules)" umount_lazy "$m"
}

wan_checks fuse
wan_checks fanotify
one_reader fuse
one_reader fanotify
if elf_set >"$SCRATCH/elfset.txt" 2>"$LOG"; then
	echo "# ELF prediction: $(cat "$SCRATCH/elfset.txt")"
	elf_predict fuse
	elf_predict fanotify
	read -r prog _ <"$SCRATCH/elfset.txt"
	if big_elf_image "$prog" >"$LOG" 2>&1; then
		loader_deps_recorded
		elf_big fuse
		elf_big fanotify
		elf_modules fuse
		elf_modules fanotify
	else
		notok "a dir: image with a 9 MiB program and its libraries in the registry"
		diag "$LOG"
	fi
else
	notok "a program with an interpreter and two libraries in the reference tree's usr/bin, and etc/ld.so.cache"
	diag "$LOG"
fi
# Directory prediction needs a round trip of 25 ms or more: 15 ms each way.
if ! wp_start 15 200 2>"$LOG"; then
	notok "start the WAN proxy (wanproxy.py, 15 ms each way)"
	diag "$LOG"
elif dir_pair >"$SCRATCH/dirpair.txt" 2>"$LOG"; then
	WIMG=docker://$WAN/ferry/debian:edit
	echo "# directory prediction: A, B: $(tr '\n' ' ' <"$SCRATCH/dirpair.txt")"
	dir_predict fuse
	dir_predict fanotify
else
	notok "two sibling directories of small files in the reference tree"
	diag "$LOG"
fi
if py_image >"$LOG" 2>&1; then
	py_predict fuse
	py_predict fanotify
else
	notok "a dir: image of a Python package with 37 subpackages in the registry"
	diag "$LOG"
fi
if pyc_image >"$LOG" 2>&1; then
	pyc_predict fuse
	pyc_predict fanotify
else
	notok "a dir: image of compiled Python modules in the registry"
	diag "$LOG"
fi
e2e_done
