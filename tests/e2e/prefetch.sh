#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The prefetch list embedded at conversion (ferry convert --prefetch-files,
# docs/FORMAT.md 2.5): kept in the bootstrap, shown by inspect, refused
# when it names what the image lacks or escapes it, and fetched first by a
# lazy mount without any read, in list order, before --prefetch-files
# given at mount time.
. "$(dirname "$0")/../lib/common.sh"
. "$(dirname "$0")/../lib/oci.sh"
. "$(dirname "$0")/../lib/registry.sh"
. "$(dirname "$0")/../lib/lazy.sh"
need_ferryd

SRC=$SCRATCH/src
mkdir -p "$SRC/etc" "$SRC/opt/app" "$SCRATCH/mnt"
for f in etc/first opt/app/second opt/app/never; do
	head -c 3000000 /dev/urandom >"$SRC/$f"
done
echo small >"$SRC/etc/small"
printf '# read at start\n/etc/first\n\nopt/app/second\n' >"$SCRATCH/list"

check "convert with --prefetch-files" "$FERRY" convert -q --prefetch-files "$SCRATCH/list" \
	"dir:$SRC" "dir:$SCRATCH/img"
if "$FERRY" inspect --json "dir:$SCRATCH/img" >"$SCRATCH/inspect.json" 2>"$LOG"; then
	check "inspect lists the normalised prefetch paths in order" python3 -c '
import json, sys
got = json.load(open(sys.argv[1]))["prefetch"]
assert got == ["/etc/first", "/opt/app/second"], got' "$SCRATCH/inspect.json"
else
	notok "inspect --json"
	diag "$LOG"
fi
check "check accepts the image" "$FERRY" check "dir:$SCRATCH/img"

printf '/etc/first\n/no/such/file\n' >"$SCRATCH/missing"
check_fails "a path the image lacks is refused" "/no/such/file is not in the image" \
	"$FERRY" convert -q --prefetch-files "$SCRATCH/missing" "dir:$SRC" "dir:$SCRATCH/bad1"
expect "nothing left of the refused conversion" [ ! -e "$SCRATCH/bad1" ]
printf '../etc/passwd\n' >"$SCRATCH/escape"
check_fails "a path escaping the image is refused" "not a path inside the image" \
	"$FERRY" convert -q --prefetch-files "$SCRATCH/escape" "dir:$SRC" "dir:$SCRATCH/bad2"
check_fails "a missing list file is refused" "$SCRATCH/nolist" \
	"$FERRY" convert -q --prefetch-files "$SCRATCH/nolist" "dir:$SRC" "dir:$SCRATCH/bad3"

# A lazy mount fetches the listed files by itself: 3 + 3 chunks of the 9.
lazy_use pf
present_is() { [ "$(fcache_sum | cut -d' ' -f1)" = "$1" ]; }
if check "lazy mount of the image" mount_lazy fuse "dir:$SCRATCH/img" "$SCRATCH/mnt"; then
	check "the listed files' 6 chunks become present without a read" \
		poll 30 present_is 6
	expect "nothing was read through the mount" [ "$(mount_stats "$SCRATCH/mnt" | cut -d' ' -f1)" = 0 ]
	check "the files read right" cmp "$SRC/opt/app/second" "$SCRATCH/mnt/opt/app/second"
	check "umount" umount_lazy "$SCRATCH/mnt"
fi
# A list given at mount time comes after the image's own.
rm -rf "$FCACHE"
echo /opt/app/never >"$SCRATCH/more"
if check "lazy mount with --prefetch-files" mount_lazy fuse "dir:$SCRATCH/img" "$SCRATCH/mnt" \
	--prefetch-files "$SCRATCH/more"; then
	check "both lists are prefetched (9 chunks)" \
		poll 30 present_is 9
	check "umount" umount_lazy "$SCRATCH/mnt"
fi
e2e_done
