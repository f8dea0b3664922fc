#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Recorded prefetch: 'ferry mount --record LIST' writes the files a
# workload reads (data in blobs only, first access order, once each), and
# an image converted with that list as --prefetch-files fetches exactly
# what the workload needs before it runs: the workload then fetches
# nothing. Plus the refusals (--record with a kernel mode) and a planted
# symbolic link at the list's path, which root must not write through.
. "$(dirname "$0")/../lib/common.sh"
. "$(dirname "$0")/../lib/oci.sh"
. "$(dirname "$0")/../lib/registry.sh"
. "$(dirname "$0")/../lib/lazy.sh"
lazy_setup
lazy_use rec
L=$SCRATCH/startup.list
M=$SCRATCH/m-rec

workload() { # ROOT
	cat "$1/usr/bin/bash" >/dev/null &&
		cat "$1/usr/bin/ls" >/dev/null &&
		cat "$1/usr/bin/bash" >/dev/null &&
		ls -l "$1/usr/bin/perl" >/dev/null &&
		chroot "$1" /bin/sh -c 'true'
}

# A directory of small files read one after another in directory order:
# the pattern FUSE directory readahead serves from the page cache without
# a READ; a recording mount must still see (and list) every one of them.
DRA_DIR=$(cd "$ref" && find usr -type f -size +1k -size -64k -printf '%h\n' |
	sort | uniq -c | sort -rn | awk '$1 >= 8 && $1 <= 40 { print $2; exit }')
read_dir_in_order() { # MNT: every small file of DRA_DIR, in readdir order
	local f
	for f in $(ls -U "$1/$DRA_DIR"); do
		[ -f "$1/$DRA_DIR/$f" ] && [ ! -L "$1/$DRA_DIR/$f" ] || continue
		[ "$(stat -c %s "$1/$DRA_DIR/$f")" -gt 256 ] || continue
		cat "$1/$DRA_DIR/$f" >/dev/null && echo "/$DRA_DIR/$f"
	done
}

check "ferry mount --record (mode fuse implied)" mount_lazy fuse "$IMG" "$M" --record "$L"
# mount_lazy fuse passes --mode fuse; the implication is checked below without it.
check "the startup workload" workload "$M"
expect "a directory of small files to read in order ($DRA_DIR)" [ -n "$DRA_DIR" ]
read_dir_in_order "$M" >"$SCRATCH/dra.read"
echo "# read $(wc -l <"$SCRATCH/dra.read") files of /$DRA_DIR in directory order"
check "umount" umount_lazy "$M"
expect "the list exists" [ -s "$L" ]
sed 's/^/# recorded: /' "$L" | head -20
expect "first line: the first file read" [ "$(sed -n 1p "$L")" = /usr/bin/bash ]
expect "second line: the second file read" [ "$(sed -n 2p "$L")" = /usr/bin/ls ]
expect "no file twice" [ "$(sort "$L" | uniq -d | wc -l)" -eq 0 ]
expect "the shell chroot ran (dash) is there" grep -qx /usr/bin/dash "$L"
expect "so is the C library it loaded" grep -qx /usr/lib/x86_64-linux-gnu/libc.so.6 "$L"
expect "a file only stat'ed is not" bash -c '! grep -qx /usr/bin/perl "$0"' "$L"
expect "small inline files are not (no fetch to save)" bash -c '! grep -qx /etc/os-release "$0"' "$L"
expect "every file read in directory order is listed (directory readahead stores none ahead)" \
	bash -c '[ -s "$0" ] && ! grep -vxF -f "$1" "$0"' "$SCRATCH/dra.read" "$L"
expect "every line names a regular file of the image" bash -c '
	while read -r p; do [ -f "$0$p" ] && [ ! -L "$0$p" ] || { echo "not a file: $p"; exit 1; }; done <"$1"' "$ref" "$L"

# Without --mode: --record implies fuse.
M2=$SCRATCH/m-rec2
L2=$SCRATCH/second.list
mkdir -p "$M2"
check "--record without --mode mounts" timeout -k 5 90 "$FERRY" mount "${FERRYD_SOCK_OPT[@]}" \
	--cache-dir "$FCACHE" --record "$L2" "$IMG" "$M2"
expect "  ... in fuse mode" [ "$(mount_field "$M2" mode)" = fuse ]
check "read one file" cmp "$M2/usr/bin/ls" "$ref/usr/bin/ls"
expect "the list grows while the mount lives" grep -qx /usr/bin/ls "$L2"
check "umount" umount_lazy "$M2"

check_exit "--record with --mode fanotify: usage error" 2 \
	"$FERRY" mount "${FERRYD_SOCK_OPT[@]}" --mode fanotify --record "$L2" "$IMG" "$M2"
expect "  ... naming fuse" grep -q "needs --mode fuse" "$LOG"
check_exit "--record with --mode local: usage error" 2 \
	"$FERRY" mount --mode local --record "$L2" "$IMG" "$M2"

# A link planted where the list goes: ferryd (root) must not follow it.
echo precious >"$SCRATCH/victim"
ln -s "$SCRATCH/victim" "$SCRATCH/planted.list"
check_exit "--record onto a symbolic link: the mount fails" 1 \
	"$FERRY" mount "${FERRYD_SOCK_OPT[@]}" --mode fuse --cache-dir "$FCACHE" \
	--record "$SCRATCH/planted.list" "$IMG" "$M2"
expect "  ... naming the list" grep -q "planted.list" "$LOG"
expect "the link's target is untouched" [ "$(cat "$SCRATCH/victim")" = precious ]
expect "nothing is mounted" bash -c '! mountpoint -q "$0"' "$M2"

# The list embedded by ferry convert: a fresh mount fetches those files
# first, and the workload then fetches nothing.
RIMG=docker://$REG/ferry/debian:recorded
check "ferry convert --prefetch-files LIST" "$FERRY" convert -q --prefetch-files "$L" \
	"oci:$FIX:edit" "$RIMG"
# The listed files' new chunks form the blob's hot run (blob_writer_hot):
# one contiguous range of frames behind every unlisted file's, so a mount
# fetches them with a few large requests and nothing else. Checked over
# the listed files and their directories' other files. (The run may hold
# frames no file uses any more: a lower layer's version of a listed file
# that an upper layer replaced, which is why runs are counted, not
# required to be one.)
hot_run() {
	python3 - "$FERRY" "$RIMG" "$L" "$ref" <<'PY'
import json, os, subprocess, sys
ferry, img, lst, ref = sys.argv[1:]
listed = {l.strip() for l in open(lst) if l.strip()}
dirs = {os.path.dirname(p) for p in listed}
frames = {}  # (device, compressed offset) -> [size, set of listed?]
for d in sorted(dirs):
    for name in sorted(os.listdir(ref + d)):
        p = d + "/" + name
        if os.path.islink(ref + p) or not os.path.isfile(ref + p) or os.path.getsize(ref + p) <= 256:
            continue
        out = subprocess.run([ferry, "inspect", "--json", img, p], capture_output=True, text=True, check=True).stdout
        for c in json.loads(out).get("chunks", []):
            if "compressedOffset" in c:
                f = frames.setdefault((c["deviceId"], c["compressedOffset"]), [c["compressedSize"], set()])
                f[1].add(p in listed)
mixed = [k for k, f in frames.items() if len(f[1]) > 1]
bad = len(mixed)
for dev in sorted({k[0] for k in frames}):
    hot = sorted((k[1], f[0]) for k, f in frames.items() if k[0] == dev and f[1] == {True})
    cold = [k[1] for k, f in frames.items() if k[0] == dev and f[1] == {False}]
    if not hot:
        continue
    gaps = sum(1 for a, b in zip(hot, hot[1:]) if a[0] + a[1] != b[0])
    behind = sum(1 for off in cold if off > hot[0][0])
    print("# device %d: %d listed frames in %d runs, %d unlisted frames, %d of them behind the first listed one"
          % (dev, len(hot), gaps + 1, len(cold), behind))
    bad += behind
print("# %d frames in the listed files' directories, %d mixed" % (len(frames), len(mixed)))
sys.exit(1 if bad or not any(f[1] == {True} for f in frames.values()) else 0)
PY
}
expect "listed files share no frame with unlisted ones, and form one run at the end" hot_run

lazy_use replay
M3=$SCRATCH/m-replay
check "mount the image with the list (fresh cache)" mount_lazy fuse "$RIMG" "$M3"
prefetch_done() { [ "$(mount_field "$M3" prefetch)" = done ]; }
expect "prefetch of the embedded list finishes" poll 60 prefetch_done
read -r _ before _ _ _ < <(mount_stats "$M3")
check "the workload on the replayed mount" workload "$M3"
read -r _ after _ _ _ < <(mount_stats "$M3")
echo "# fetched before the workload $before bytes, during it $((after - before))"
expect "the workload fetches nothing: the list covered it" [ "$after" -eq "$before" ]
expect "and prefetch fetched something" [ "$before" -gt 0 ]
check "the replayed image's tree is the reference's (hot-run addresses)" \
	python3 "$TREECMP" "$ref" "$M3"
check "umount" umount_lazy "$M3"

e2e_done
