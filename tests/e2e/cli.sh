#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The ferry command line: help texts, exit codes (0 success, 1 failure,
# 2 usage error) with messages, errors naming missing paths, inspect's text
# and JSON output (superblock, blobs, tree; a file's chunk map with holes
# and chunk digests) and check --json.
. "$(dirname "$0")/../lib/common.sh"
need_root
need_ferry

SRC=$SCRATCH/src
OUT=$SCRATCH/out
MNT=$SCRATCH/mnt
mkdir -p "$SRC/dir" "$MNT"
python3 - "$SRC" <<'EOF'
import os, random, sys
r = random.Random(3)
d = sys.argv[1]
with open(d + "/dir/hole", "wb") as f:  # chunk 0 data, chunk 1 zero, chunk 2 data
    f.write(r.randbytes(1 << 20) + bytes(1 << 20) + r.randbytes((1 << 20) - 5))
open(d + "/small", "wb").write(b"small file\n")
open(d + "/dir/k300", "wb").write(r.randbytes(300))
os.symlink("dir/hole", d + "/link")
os.setxattr(d + "/small", "user.note", b"hi")
EOF

# --- help ----------------------------------------------------------------
help_ok() { # DESC CMD...: exit 0, usage and exit statuses on stdout
	local desc=$1
	shift
	if check "$desc" "$@" && grep -q "Usage: ferry" "$LOG" &&
		grep -qiE "exit (status|code)" "$LOG" && grep -q "2" "$LOG"; then
		ok "$desc: shows usage and exit statuses"
	else
		notok "$desc: shows usage and exit statuses"
		diag "$LOG" 10
	fi
}
help_ok "ferry --help" "$FERRY" --help
for cmd in convert mount umount inspect check; do
	help_ok "ferry $cmd --help" "$FERRY" "$cmd" --help
done
check "ferry --help lists the commands" \
	bash -c '"$1" --help | grep -q convert && "$1" --help | grep -q inspect' _ "$FERRY"
check "ferry --version" "$FERRY" --version
# ferryd's option for a cachefiles keeper's successor, and its name before
# 0.5.0, which the keepers of those releases pass to the installed ferryd:
# both parsed (a closed descriptor refused as such, not as unknown).
for opt in --cachefiles-takeover --cachefiles-adopt; do
	check_exit "ferryd $opt with a closed descriptor: usage error" 2 \
		"$(dirname "$FERRY")/ferryd" -f --socket "$SCRATCH/never.sock" "$opt" 987 &&
		expect "ferryd $opt: parsed, the descriptor refused" \
			grep -q -- "--cachefiles-takeover 987: expected an open descriptor" "$LOG"
done

# --- usage errors: exit 2, a message on stderr, nothing written -----------
usage() { # DESC ARGS...
	local desc=$1 rc
	shift
	"$FERRY" "$@" >"$SCRATCH/stdout" 2>"$LOG" </dev/null
	rc=$?
	# Without a command the help text on stdout is the message.
	[ $# -eq 0 ] && cat "$SCRATCH/stdout" >>"$LOG"
	if [ "$rc" -eq 2 ] && [ -s "$LOG" ] && [ ! -e "$SCRATCH/never" ]; then
		ok "usage error exits 2 with a message: $desc"
	else
		notok "usage error exits 2 with a message: $desc"
		echo "    ferry $* -> exit $rc"
		diag "$LOG" 5
	fi
}
N=$SCRATCH/never
usage "no command"
usage "unknown command" frobnicate
usage "unknown global option" --frobnicate
usage "convert without arguments" convert
usage "convert without DEST" convert "dir:$SRC"
usage "convert with three arguments" convert "dir:$SRC" "dir:$N" extra
usage "convert unknown option" convert --frobnicate "dir:$SRC" "dir:$N"
usage "convert --compress unknown codec" convert --compress brotli "dir:$SRC" "dir:$N"
usage "convert --compress zstd:99" convert --compress zstd:99 "dir:$SRC" "dir:$N"
usage "convert --compress deflate (ferry format)" convert --compress deflate "dir:$SRC" "dir:$N"
usage "convert --compress deflate:10" convert --format erofs-layers --compress deflate:10 "tar:$SRC.tar" "oci:$N:t"
usage "convert --no-fragments (ferry format)" convert --no-fragments "dir:$SRC" "dir:$N"
usage "convert --chunk-size not a power of two" convert --chunk-size 1000000 "dir:$SRC" "dir:$N"
usage "convert --chunk-size below 4 KiB" convert --chunk-size 2048 "dir:$SRC" "dir:$N"
usage "convert --chunk-size above 64 MiB" convert --chunk-size 134217728 "dir:$SRC" "dir:$N"
usage "convert --chunk-size garbage" convert --chunk-size lots "dir:$SRC" "dir:$N"
usage "convert --inline-max too large" convert --inline-max 1000000 "dir:$SRC" "dir:$N"
usage "convert unknown source scheme" convert "zip:$SRC" "dir:$N"
usage "convert source without scheme" convert "$SRC" "dir:$N"
usage "convert unknown destination scheme" convert "dir:$SRC" "tar:$N"
usage "mount --mode local --domain (a lazy option)" mount --mode local --domain d "dir:$N" "$MNT"
usage "mount --mode unknown" mount --mode warp "dir:$N" "$MNT"
usage "mount without MOUNTPOINT" mount --mode local "dir:$N"
usage "umount without MOUNTPOINT" umount
usage "inspect without IMAGE" inspect
usage "inspect with three arguments" inspect "dir:$N" /a /b
usage "check without IMAGE" check
usage "check unknown option" check --frobnicate "dir:$N"
expect "usage errors write nothing" [ ! -e "$N" ]

# --- failures: exit 1 naming the path -------------------------------------
fails() { # DESC PATTERN ARGS...
	local desc=$1 pat=$2 rc
	shift 2
	"$FERRY" "$@" >"$SCRATCH/stdout" 2>"$LOG" </dev/null
	rc=$?
	if [ "$rc" -eq 1 ] && grep -qF -- "$pat" "$LOG" && ! sanitizer_report "$LOG"; then
		ok "fails with exit 1 naming $pat: $desc"
	else
		notok "fails with exit 1 naming $pat: $desc"
		echo "    ferry $* -> exit $rc"
		diag "$LOG" 5
	fi
}
fails "convert from a missing directory" /nonexistent/src convert dir:/nonexistent/src "dir:$N"
fails "convert from a missing tar" /nonexistent/layer.tar convert tar:/nonexistent/layer.tar "dir:$N"
fails "convert dir: of a regular file" "$SRC/small" convert "dir:$SRC/small" "dir:$N"
head -c 20000 /dev/urandom >"$SCRATCH/notatar"
fails "convert tar: of random bytes" "$SCRATCH/notatar" convert "tar:$SCRATCH/notatar" "dir:$N"
# A tar cut short inside a file's data, after blob data was written.
tar -C "$SRC" -cf "$SCRATCH/full.tar" . && head -c 1500000 "$SCRATCH/full.tar" >"$SCRATCH/cut.tar"
fails "convert tar: cut short" "$SCRATCH/cut.tar" convert "tar:$SCRATCH/cut.tar" "dir:$N"
fails "inspect a missing image" /nonexistent/img inspect dir:/nonexistent/img
fails "check a missing image" /nonexistent/img check dir:/nonexistent/img
fails "mount a missing image" /nonexistent/img mount --mode local dir:/nonexistent/img "$MNT" --cache-dir "$CACHE"
fails "umount something not mounted" "$MNT" umount "$MNT"
if [ ! -e "$N" ]; then
	ok "failed conversions leave no destination"
else
	notok "failed conversions leave no destination"
	find "$N" | head -n 10 | sed 's/^/    left: /'
fi

# --- inspect and check output ---------------------------------------------
check "convert the small tree" "$FERRY" convert "dir:$SRC" "dir:$OUT" -q || e2e_done
check "inspect (text) shows superblock, blob digest and tree" bash -c '
	out=$("$1" inspect "dir:$2") || exit 1
	printf "%s\n" "$out"
	hex=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[\"blobs\"][0][\"digest\"])" "$2/ferry.json")
	printf "%s\n" "$out" | grep -qF "$hex"' _ "$FERRY" "$OUT"
check "inspect --json: superblock, blobs and tree agree with ferry.json and the source" \
	bash -c '"$1" inspect --json "dir:$2" >"$3/inspect.json" && python3 - "$3/inspect.json" "$2/ferry.json" <<"EOF"
import json, sys
i = json.load(open(sys.argv[1]))
idx = json.load(open(sys.argv[2]))
assert i["superblock"]["devices"] == len(idx["blobs"]) == len(i["blobs"]), i
assert [b["digest"] for b in i["blobs"]] == [b["digest"] for b in idx["blobs"]], i["blobs"]
assert [b["uncompressedSize"] for b in i["blobs"]] == [b["uncompressedSize"] for b in idx["blobs"]]
t = i["tree"]
assert (t["files"], t["symlinks"]) == (3, 1) and t["directories"] in (1, 2), t
assert t["fileBytes"] == (3 << 20) - 5 + 11 + 300, t
assert i["chunkSize"] == idx["chunkSize"] == 1 << 20
EOF' _ "$FERRY" "$OUT" "$SCRATCH"

# The chunk map of a 3-chunk file whose middle chunk is all zero.
check "inspect --json PATH: chunk map with a hole and chunk sha256s" \
	bash -c '"$1" inspect --json "dir:$2" /dir/hole >"$3/file.json" && python3 - "$3/file.json" "$4" <<"EOF"
import hashlib, json, sys
f = json.load(open(sys.argv[1]))
data = open(sys.argv[2], "rb").read()
MiB = 1 << 20
assert f["type"] == "file" and f["size"] == len(data), f
c = f["chunks"]
assert len(c) == 3, c
assert c[1].get("hole") is True, c[1]
for k in (0, 2):
    want = "sha256:" + hashlib.sha256(data[k * MiB:(k + 1) * MiB]).hexdigest()
    assert c[k]["sha256"] == want and c[k]["deviceId"] == 1, (k, c[k], want)
    assert c[k]["fileOffset"] == k * MiB and c[k]["length"] == len(data[k * MiB:(k + 1) * MiB])
EOF' _ "$FERRY" "$OUT" "$SCRATCH" "$SRC/dir/hole"
check "inspect PATH (text) lists 3 chunks incl. the hole" bash -c '
	out=$("$1" inspect "dir:$2" /dir/hole) || exit 1
	printf "%s\n" "$out"
	printf "%s\n" "$out" | grep -q "3 chunks" && printf "%s\n" "$out" | grep -q hole' \
	_ "$FERRY" "$OUT"
check "inspect --json PATH: symlink target, xattr names, inline file" \
	bash -c '"$1" inspect --json "dir:$2" /link >"$3/l.json" &&
		"$1" inspect --json "dir:$2" /small >"$3/s.json" && python3 - "$3" <<"EOF"
import json, sys
l = json.load(open(sys.argv[1] + "/l.json"))
s = json.load(open(sys.argv[1] + "/s.json"))
assert l["type"] == "symlink" and l["target"] == "dir/hole", l
assert s["xattrs"] == ["user.note"] and s["size"] == 11 and "chunks" not in s, s
EOF' _ "$FERRY" "$OUT" "$SCRATCH"
fails "inspect a path that does not exist" /no/such/file inspect "dir:$OUT" /no/such/file
check "check --json reports ok" bash -c '"$1" check --json "dir:$2" | python3 -c "
import json, sys
j = json.load(sys.stdin)
assert j[\"ok\"] is True and j[\"chunks\"] >= 2, j"' _ "$FERRY" "$OUT"

# --- mount / umount ----------------------------------------------------------
fails "mount on a missing mount point" "$SCRATCH/nomnt" mount --mode local "dir:$OUT" "$SCRATCH/nomnt" --cache-dir "$CACHE"
if check "mount --mode local" "$FERRY" mount --mode local "dir:$OUT" "$MNT" --cache-dir "$CACHE"; then
	check "mounted file reads back" cmp "$SRC/dir/hole" "$MNT/dir/hole"
	check "ferry umount" "$FERRY" umount "$MNT"
	expect "not mounted after ferry umount" eval '! is_mounted "$MNT"'
fi
e2e_done
