#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Recorded prefetch: 'ferry mount --record LIST' writes the files a
# workload reads (data in blobs only, first access order, once each), and
# an image converted with that list as --prefetch-files fetches exactly
# what the workload needs before it runs: the workload then fetches
# nothing. Plus the refusals (--record with a kernel mode) and a planted
# symbolic link at the list's path, which root must not write through.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/oci_lib.sh"
. "$(dirname "$0")/registry_lib.sh"
. "$(dirname "$0")/lazy_lib.sh"
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

check "ferry mount --record (mode fuse implied)" fmount "$IMG" "$M" --record "$L"
# fmount passes --mode fuse; the implication is checked below without it.
check "the startup workload" workload "$M"
check "umount" fumount "$M"
expect "the list exists" [ -s "$L" ]
sed 's/^/# recorded: /' "$L" | head -20
expect "first line: the first file read" [ "$(sed -n 1p "$L")" = /usr/bin/bash ]
expect "second line: the second file read" [ "$(sed -n 2p "$L")" = /usr/bin/ls ]
expect "no file twice" [ "$(sort "$L" | uniq -d | wc -l)" -eq 0 ]
expect "the shell chroot ran (dash) is there" grep -qx /usr/bin/dash "$L"
expect "so is the C library it loaded" grep -qx /usr/lib/x86_64-linux-gnu/libc.so.6 "$L"
expect "a file only stat'ed is not" bash -c '! grep -qx /usr/bin/perl "$0"' "$L"
expect "small inline files are not (no fetch to save)" bash -c '! grep -qx /etc/os-release "$0"' "$L"
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
check "umount" fumount "$M2"

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
lazy_use replay
M3=$SCRATCH/m-replay
check "mount the image with the list (fresh cache)" fmount "$RIMG" "$M3"
prefetch_done() { [ "$(mount_field "$M3" prefetch)" = done ]; }
expect "prefetch of the embedded list finishes" poll 60 prefetch_done
read -r _ before _ _ _ < <(mount_stats "$M3")
check "the workload on the replayed mount" workload "$M3"
read -r _ after _ _ _ < <(mount_stats "$M3")
echo "# fetched before the workload $before bytes, during it $((after - before))"
expect "the workload fetches nothing: the list covered it" [ "$after" -eq "$before" ]
expect "and prefetch fetched something" [ "$before" -gt 0 ]
check "umount" fumount "$M3"

e2e_done
