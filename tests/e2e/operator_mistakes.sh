#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Operator mistakes and interrupted work lose nothing (issue 19):
#   - ferry convert refuses, naming both paths, a destination equal to or
#     inside a dir: source, a non-empty directory that is not an image, an
#     existing dir: image or oci: tag without --force, and a ferry image as
#     the source; each refusal leaves everything byte-identical
#   - --force replaces an image by a complete new one
#   - SIGTERM while streaming a layer, while writing into an existing
#     layout and while pushing leaves the destination as it was and no
#     temporary file; SIGKILL's leftovers are reclaimed by the next
#     conversion into the same destination
#   - ferry cache prune keeps the blobs of a --mode local mount (no daemon
#     holds them) and frees them after the umount
#   - a second mount (any mode) on a mount point holding a ferry mount is
#     refused
#   - a missing mount point, a dir: that is not an image and a mount by a
#     user who is not root are each said once, by their real cause
E2E_TIMEOUT=${E2E_TIMEOUT:-240}
. "$(dirname "$0")/../lib/common.sh"
. "$(dirname "$0")/../lib/registry.sh"
. "$(dirname "$0")/../lib/lazy.sh"
need_ferryd
need_cmds docker-registry python3 sha256sum runuser

# Everything about a tree: names, types, sizes, modes, file contents.
tree_sum() { # DIR
	(cd "$1" && find . -printf '%p %y %s %m\n' | LC_ALL=C sort &&
		find . -type f -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum) |
		sha256sum | cut -d' ' -f1
}

# Nothing ferry leaves behind while writing: temp files, staging dirs.
no_leftovers() { # DIR...
	[ -z "$(find "$@" \( -name '.tmp-*' -o -name '.*.ferry-*' -o -name 'ferry-push.*' \) 2>/dev/null)" ]
}

# Run ferry convert ARGS in the background, send SIG once FILE-COND holds
# (or after SECS), and expect death by that signal.
convert_killed() { # SIG COND ARGS...
	local sig=$1 cond=$2 pid i rc
	shift 2
	"$FERRY" convert -q "$@" >"$LOG" 2>&1 &
	pid=$!
	for ((i = 0; i < 300; i++)); do
		eval "$cond" && break
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.05
	done
	kill -"$sig" "$pid" 2>/dev/null
	{ wait "$pid"; } 2>/dev/null
	rc=$?
	[ "$rc" -eq $((128 + $(kill -l "$sig"))) ] || {
		echo "    exit $rc, expected death by SIG$sig" >&2
		diag "$LOG" >&2
		return 1
	}
}

SRC=$SCRATCH/src
mkdir -p "$SRC/etc" "$SRC/data"
echo "operator mistakes" >"$SRC/etc/motd"
head -c 2000000 /dev/urandom >"$SRC/data/small.bin"
BIG=$SCRATCH/big
mkdir -p "$BIG"
head -c $((400 << 20)) /dev/urandom >"$BIG/random.bin"
export TMPDIR=$SCRATCH/tmp
mkdir -p "$TMPDIR"

IMG=$SCRATCH/img
check "convert dir:SRC dir:IMG" "$FERRY" convert -q "dir:$SRC" "dir:$IMG" || e2e_done
SUM=$(tree_sum "$IMG")

# --- refusals ------------------------------------------------------------

check_exit "an existing image is not replaced without --force" 1 \
	"$FERRY" convert -q "dir:$SRC" "dir:$IMG"
expect "... the message names it and says --force" grep -q "$IMG holds a ferry image: pass --force" "$LOG"
check_exit "dir:IMG dir:IMG (the image as its own source) is refused" 1 \
	"$FERRY" convert -q --force "dir:$IMG" "dir:$IMG"
expect "... as a ferry image source, clearly" grep -q "is a ferry image (it has ferry.json), converted already" "$LOG"
expect "... the image is byte-identical" [ "$(tree_sum "$IMG")" = "$SUM" ]
check "... and still checks" "$FERRY" check "dir:$IMG"

SRCSUM=$(tree_sum "$SRC")
check_exit "dir:SRC dir:SRC/out is refused" 1 "$FERRY" convert -q "dir:$SRC" "dir:$SRC/out"
expect "... naming both paths" grep -q "destination $SRC/out is inside the source directory $SRC" "$LOG"
check_exit "dir:SRC dir:SRC is refused" 1 "$FERRY" convert -q "dir:$SRC" "dir:$SRC"
check_exit "dir:SRC oci:SRC/layout is refused" 1 "$FERRY" convert -q "dir:$SRC" "oci:$SRC/layout"
expect "... the source is byte-identical" [ "$(tree_sum "$SRC")" = "$SRCSUM" ]

OTHER=$SCRATCH/other
mkdir -p "$OTHER"
echo precious >"$OTHER/notes.txt"
OSUM=$(tree_sum "$OTHER")
check_exit "a non-empty directory that is not an image is refused (dir:)" 1 \
	"$FERRY" convert -q --force "dir:$SRC" "dir:$OTHER"
expect "... saying so" grep -q "$OTHER is not empty and not a ferry image" "$LOG"
check_exit "... and as an OCI layout (oci:)" 1 "$FERRY" convert -q --force "dir:$SRC" "oci:$OTHER"
expect "... the directory is byte-identical" [ "$(tree_sum "$OTHER")" = "$OSUM" ]
mkdir -p "$SCRATCH/empty"
check "an empty directory is a fine destination" "$FERRY" convert -q "dir:$SRC" "dir:$SCRATCH/empty"

LAY=$SCRATCH/layout
check "convert into oci:LAYOUT:v1" "$FERRY" convert -q "dir:$SRC" "oci:$LAY:v1"
LSUM=$(tree_sum "$LAY")
check_exit "an existing oci: tag is not moved without --force" 1 \
	"$FERRY" convert -q "dir:$SRC/etc" "oci:$LAY:v1"
expect "... the layout is byte-identical" [ "$(tree_sum "$LAY")" = "$LSUM" ]
check_exit "an oci: ferry image as the source is refused" 1 \
	"$FERRY" convert -q "oci:$LAY:v1" "dir:$SCRATCH/again"
expect "... clearly, not as tar corruption" grep -q "oci:$LAY:v1 is a ferry image (layer 1 is" "$LOG"
expect "... and writes nothing" [ ! -e "$SCRATCH/again" ]

check "--force replaces an image" "$FERRY" convert -q --force "dir:$SRC/etc" "dir:$IMG"
expect "... by the new one" [ "$(tree_sum "$IMG")" != "$SUM" ]
check "... which checks" "$FERRY" check "dir:$IMG"
check "--force moves an oci: tag" "$FERRY" convert -q --force "dir:$SRC/etc" "oci:$LAY:v1"
check "... whose image checks" "$FERRY" check "oci:$LAY:v1"

# --- interruptions -------------------------------------------------------

SUM=$(tree_sum "$IMG")
LSUM=$(tree_sum "$LAY")
if convert_killed TERM "sleep 0.5" --jobs 1 "dir:$BIG" "dir:$SCRATCH/new"; then
	ok "SIGTERM while streaming into a new dir: image ends the conversion"
else
	notok "SIGTERM while streaming into a new dir: image ends the conversion"
fi
expect "... no partial image" [ ! -e "$SCRATCH/new" ]
expect "... no temporary files" no_leftovers "$SCRATCH"
expect "... the message says so" grep -q "interrupted (Terminated): dir:$SCRATCH/new is left as it was" "$LOG"

if convert_killed TERM "sleep 1.2" --jobs 1 --force "dir:$BIG" "dir:$IMG"; then
	ok "SIGTERM while replacing an image (--force) ends the conversion"
else
	notok "SIGTERM while replacing an image (--force) ends the conversion"
fi
expect "... the old image is byte-identical" [ "$(tree_sum "$IMG")" = "$SUM" ]
expect "... no temporary files" no_leftovers "$SCRATCH"

# A blob finishing: the writer is past the source when the (single) big
# file's last chunks compress; kill when the blob's temp file is large.
cond_blob_big='[ -n "$(find "$LAY/blobs/sha256" -name ".tmp-*" -size +300M 2>/dev/null)" ]'
if convert_killed TERM "$cond_blob_big" --jobs 1 "dir:$BIG" "oci:$LAY:big"; then
	ok "SIGTERM while a blob finishes in an existing layout ends the conversion"
else
	notok "SIGTERM while a blob finishes in an existing layout ends the conversion"
fi
expect "... index.json unchanged, no tag added" \
	[ "$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["manifests"]))' "$LAY/index.json")" = 1 ]
expect "... no temporary files" no_leftovers "$LAY" "$TMPDIR"

# SIGKILL: nothing can clean up; the next conversion reclaims the leftovers.
convert_killed KILL "sleep 0.8" --jobs 1 "dir:$BIG" "dir:$SCRATCH/killed" || true
expect "SIGKILL leaves a staging directory beside the destination" \
	[ -n "$(find "$SCRATCH" -maxdepth 1 -name '.killed.ferry-*')" ]
expect "... never a partial image at the destination" [ ! -e "$SCRATCH/killed" ]
check "the next conversion into it succeeds" "$FERRY" convert -q "dir:$SRC" "dir:$SCRATCH/killed"
expect "... and removed the leftovers" no_leftovers "$SCRATCH"
convert_killed KILL "$cond_blob_big" --jobs 1 "dir:$BIG" "oci:$LAY:big" || true
expect "SIGKILL leaves a temporary blob in the layout" \
	[ -n "$(find "$LAY" -name '.tmp-*')" ]
check "the next conversion into the layout succeeds" "$FERRY" convert -q "dir:$SRC/etc" "oci:$LAY:small"
expect "... and removed it" no_leftovers "$LAY"

# A push: the registry answers blob uploads only after 20 s.
if reg_start anon >"$LOG" 2>&1 && fp_start >>"$LOG" 2>&1; then
	fp_set slow count=-1 delay=20 method=PUT 'path=/blobs/uploads/' >/dev/null
	cond_push='[ "$(fp_stat requests)" -gt 2 ] 2>/dev/null'
	if convert_killed TERM "$cond_push" "dir:$SRC" "docker://$PROXY/ops/app:1"; then
		ok "SIGTERM while pushing ends the conversion"
	else
		notok "SIGTERM while pushing ends the conversion"
	fi
	expect "... the staging layout is removed" no_leftovers "$TMPDIR"
	fp_set none >/dev/null
	expect "... no tag in the registry" [ "$(curl -s -o /dev/null -w '%{http_code}' \
		"http://$REG/v2/ops/app/manifests/1")" = 404 ]
else
	notok "start a registry and a fault proxy"
	diag "$LOG"
fi

ln -s "$LAY" "$SCRATCH/layout-link"
check "a layout named through a symbolic link is written into" \
	"$FERRY" convert -q "dir:$SRC/etc" "oci:$SCRATCH/layout-link:linked"

# --- the cache and mounts -------------------------------------------------

C=$SCRATCH/cache
M=$SCRATCH/mnt
mkdir -p "$M"
check "convert an image with a blob" "$FERRY" convert -q "dir:$SRC" "dir:$SCRATCH/mimg"
check "mount --mode local" "$FERRY" mount --mode local --cache-dir "$C" "dir:$SCRATCH/mimg" "$M"
BLOB=$(find "$C/blobs/sha256" -name '*.data' | head -1)
check_exit "a second mount on that mount point is refused" 1 \
	"$FERRY" mount --mode local --cache-dir "$C" "dir:$SCRATCH/mimg" "$M"
expect "... saying why" grep -q "already holds a ferry mount (erofs): ferry umount it first" "$LOG"
lazy_use mistakes
for mode in fuse fanotify; do
	check_exit "... as is one by ferryd (--mode $mode)" 1 \
		"$FERRY" mount --mode $mode "${FERRYD_SOCK_OPT[@]}" --cache-dir "$C" "dir:$SCRATCH/mimg" "$M"
	expect "... saying why" grep -q "$M is already a ferry mount" "$LOG"
done
expect "... one mount there, not two" [ "$(grep -c " $M " /proc/self/mountinfo)" = 1 ]
check "cache prune --all while it is mounted" "$FERRY" cache --cache-dir "$C" prune --all
expect "... frees nothing" grep -q "removed 0 blobs, freed 0 bytes" "$LOG"
expect "... the mounted blob is still there" [ -n "$BLOB" ] && [ -f "$BLOB" ]
check "cache ls --json" "$FERRY" cache --cache-dir "$C" ls --json
expect "... shows it in use" python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
sys.exit(0 if j["blobs"] and all(b["inUse"] for b in j["blobs"]) else 1)' "$LOG"
check "umount" umount "$M"
check "cache prune --all after the umount" "$FERRY" cache --cache-dir "$C" prune --all
expect "... frees the blob" [ ! -e "$BLOB" ]
expect "... and reports bytes freed" grep -qE "removed 1 blobs, freed [1-9][0-9]* bytes" "$LOG"

# Each mistake is said once, by its real cause (issue 44).
for mode in local fuse; do
	check_exit "--mode $mode on a missing mount point is refused" 1 \
		"$FERRY" mount --mode "$mode" --cache-dir "$C" "dir:$SCRATCH/mimg" "$SCRATCH/nowhere"
	expect "... saying it does not exist, once" \
		test "$(grep -c "mount point $SCRATCH/nowhere: No such file or directory" "$LOG")" = 1
	expect "... and nothing about a directory" sh -c "! grep -q 'Not a directory' '$LOG'"
done
check_exit "a dir: mount of a directory that is not an image is refused" 1 \
	"$FERRY" mount --mode local --cache-dir "$C" "dir:$SRC" "$M"
expect "... saying it has no ferry.json" grep -q "$SRC: not a ferry image: it has no ferry.json" "$LOG"
# The socket's directory is root's, as /run/ferry is.
mkdir -p "$SCRATCH/run"
chmod 0755 "$SCRATCH" "$SCRATCH/run"
check_exit "ferry mount by a user who is not root fails" 1 \
	runuser -u nobody -- env FERRYD_SOCKET="$SCRATCH/run/ferryd.sock" \
	"$FERRY" mount --cache-dir "$SCRATCH/run/cache" "dir:$SCRATCH/mimg" "$M"
expect "... saying ferryd's error once and that ferryd runs as root" sh -c \
	"[ \"\$(grep -c 'ferry: error' '$LOG')\" = 2 ] && grep -q 'ferryd could not start on .*ferryd runs as root' '$LOG'"
expect "... pointing to no log" sh -c "! grep -q 'see its log' '$LOG'"

e2e_done
