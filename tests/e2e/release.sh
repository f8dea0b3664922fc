#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# What an operator rolls out. Versions: ferry, ferryd, ferryd-keeper and
# ferry-snapshotter --version print the release of the VERSION file, and
# ferry and ferryd the same image formats; no help text or document
# states compatibility by date. make install into a scratch DESTDIR puts
# exactly the binaries, man pages, systemd units (with the installed
# paths) and default configuration in place, keeps an edited
# configuration, and make uninstall removes the rest. Sections: a
# bootstrap section a later ferry adds (tests/tools/bootstrap_section.py)
# is skipped by this one (check, inspect, a mount), unless flagged
# required: then the image is refused naming the section.
. "$(dirname "$0")/../lib/common.sh"
need_root
need_ferry
BIN=$(dirname "$FERRY")
VERSION=$(cat "$TOP/VERSION")
FERRYD=$BIN/ferryd
SNAPSHOTTER=$BIN/ferry-snapshotter

# --- versions ----------------------------------------------------------------
formats() { sed -n '2,/^  ferry index/p'; } # the format lines of --version
check "ferry --version" "$FERRY" --version
cp "$LOG" "$SCRATCH/ferry.version"
expect "ferry --version names the release $VERSION" \
	[ "$(head -1 "$SCRATCH/ferry.version")" = "ferry $VERSION" ]
expect "ferry --version lists the formats (image 3, FERRYWR1, unknown sections skipped, the ferry index)" \
	bash -c 'grep -q "ferry image *format 3" "$1" && grep -q "FERRYWR1 v1 writer" "$1" &&
		grep -q "others skipped unless required" "$1" && grep -q "FERRYRT1" "$1" &&
		grep -q "ferry index  *application/vnd.ferry.index.v1" "$1"' _ \
	"$SCRATCH/ferry.version"
check "ferryd --version" "$FERRYD" --version
cp "$LOG" "$SCRATCH/ferryd.version"
expect "ferryd --version names the release $VERSION" \
	[ "$(head -1 "$SCRATCH/ferryd.version")" = "ferryd $VERSION" ]
expect "ferryd --version lists the same formats as ferry" \
	[ "$(formats <"$SCRATCH/ferryd.version")" = "$(formats <"$SCRATCH/ferry.version")" ]
# The keepers outlive ferryd across upgrades: which release one is.
check "ferryd-keeper --version" "$BIN/ferryd-keeper" --version
expect "ferryd-keeper --version names the release $VERSION" \
	[ "$(cat "$LOG")" = "ferryd-keeper $VERSION" ]
if [ -x "$SNAPSHOTTER" ]; then
	check "ferry-snapshotter --version" "$SNAPSHOTTER" --version
	expect "ferry-snapshotter --version names the release $VERSION and its format" \
		bash -c '[ "$(head -1 "$1")" = "ferry-snapshotter $2" ] && grep -q "ferry format 3" "$1"' _ \
		"$LOG" "$VERSION"
else
	echo "# $SNAPSHOTTER not built (make contrib): its --version not checked"
fi

# Compatibility is stated in versions: no "before 2026-12-05" anywhere.
dated='(before|after|since|from|until|older than) (the )?20[0-9]{2}-[0-9]{2}-[0-9]{2}'
{
	"$FERRY" --help
	for c in convert mount umount inspect check cache daemon metrics; do
		"$FERRY" "$c" --help
	done
	"$FERRYD" --help
} >"$SCRATCH/help" 2>&1
expect "no help text states compatibility by a date" \
	bash -c '! grep -qiE "$1" "$2"' _ "$dated" "$SCRATCH/help"
# (PERFORMANCE.md, performance-log.md and TESTING.md date their measurements, which is no claim.)
expect "README, docs and man pages state compatibility by version, not date" \
	bash -c '! grep -iE "$1" "$2"/README.md "$2"/CHANGELOG.md "$2"/docs/man/* \
		$(ls "$2"/docs/*.md | grep -v "PERFORMANCE\|performance-log\|TESTING")' _ "$dated" "$TOP"

# --- make install / uninstall ------------------------------------------------
ROOT=$SCRATCH/root
installed() { (cd "$ROOT" && find . \( -type f -o -type l \) | sed 's|^\./||' | sort); }
want="usr/bin/ferry
usr/bin/ferryd
usr/bin/ferryd-keeper
usr/lib/systemd/system/ferryd.service
usr/lib/systemd/system/ferryd.socket
usr/share/man/man1/ferry.1
usr/share/man/man8/ferryd.8"
if [ -x "$SNAPSHOTTER" ]; then
	want=$(printf '%s\n' "$want" etc/ferry/snapshotter.json usr/bin/ferry-snapshotter \
		usr/lib/systemd/system/ferry-snapshotter.service \
		usr/share/ferry/containerd-config.toml | sort)
fi
make_root() { make -C "$TOP" --no-print-directory BIN="$BIN" BUILD="$BUILD" \
	DESTDIR="$ROOT" PREFIX=/usr "$@"; }
check "make install DESTDIR=... PREFIX=/usr" make_root install
installed >"$SCRATCH/list"
echo "# installed:"
sed 's/^/#   /' "$SCRATCH/list"
expect "exactly the binaries, man pages, units and configuration" \
	[ "$(cat "$SCRATCH/list")" = "$want" ]
expect "ferryd.service runs the installed ferryd" \
	grep -qx 'ExecStart=/usr/bin/ferryd -f --socket /run/ferry/ferryd.sock --idle-timeout 300' \
	"$ROOT/usr/lib/systemd/system/ferryd.service"
expect "no unit keeps a placeholder" bash -c '! grep -r @ "$1"/usr/lib/systemd' _ "$ROOT"
check "the installed ferry runs" "$ROOT/usr/bin/ferry" --version
if [ -x "$SNAPSHOTTER" ]; then
	expect "ferry-snapshotter.service runs it with the installed configuration" \
		grep -qx 'ExecStart=/usr/bin/ferry-snapshotter -config /etc/ferry/snapshotter.json' \
		"$ROOT/usr/lib/systemd/system/ferry-snapshotter.service"
	expect "the configuration installed is the default one" \
		cmp -s "$TOP/contrib/containerd/snapshotter.json" "$ROOT/etc/ferry/snapshotter.json"
	echo '{"mode": "fuse"}' >"$ROOT/etc/ferry/snapshotter.json"
	check "make install again" make_root install
	expect "an edited configuration is kept by install" grep -q fuse "$ROOT/etc/ferry/snapshotter.json"
fi
check "make uninstall" make_root uninstall
installed >"$SCRATCH/left"
if [ -x "$SNAPSHOTTER" ]; then
	expect "uninstall removes all but the edited configuration" \
		[ "$(cat "$SCRATCH/left")" = etc/ferry/snapshotter.json ]
	rm "$ROOT/etc/ferry/snapshotter.json"
	make_root install >"$LOG" 2>&1 && make_root uninstall >>"$LOG" 2>&1
	expect "install then uninstall leaves no file" [ -z "$(installed)" ]
else
	expect "uninstall removes every file" [ ! -s "$SCRATCH/left" ]
fi

# --- sections a later ferry adds -------------------------------------------------
mkdir -p "$SCRATCH/src/dir"
head -c 300000 /dev/urandom >"$SCRATCH/src/dir/data"
echo hello >"$SCRATCH/src/small"
IMG=$SCRATCH/img
check "convert a tree" "$FERRY" convert -q "dir:$SCRATCH/src" "dir:$IMG"
cp -a "$IMG" "$SCRATCH/img-required"
check "add an optional section from a later ferry" \
	python3 "$TOP/tests/tools/bootstrap_section.py" "$IMG" FERRYZZ9 3 0 "from ferry 9"
check "ferry check passes over it" "$FERRY" check "dir:$IMG"
check "ferry inspect --json" "$FERRY" inspect --json "dir:$IMG"
expect "inspect lists it as skipped, and the writer" \
	python3 -c 'import json, sys
j = json.load(open(sys.argv[1]))
s = [(x["magic"], x["version"], x["known"]) for x in j["sections"]]
sys.exit(not (s == [("FERRYWR1", 1, True), ("FERRYZZ9", 3, False)] and
              j["writer"] == "ferry " + sys.argv[2]))' "$LOG" "$VERSION"
mkdir -p "$SCRATCH/mnt"
if check "ferry mount --mode local" "$FERRY" mount --mode local --cache-dir "$SCRATCH/cache" \
	"dir:$IMG" "$SCRATCH/mnt"; then
	check "its files read back" cmp "$SCRATCH/src/dir/data" "$SCRATCH/mnt/dir/data"
	check "ferry umount" umount_local "$SCRATCH/mnt"
fi
check "add a required section from a later ferry" \
	python3 "$TOP/tests/tools/bootstrap_section.py" "$SCRATCH/img-required" FERRYZZ9 3 1 "needed"
check_exit "an image that needs an unknown section is refused" 1 \
	"$FERRY" inspect "dir:$SCRATCH/img-required"
expect "the refusal names the section and asks for a newer ferry" \
	grep -q "needs bootstrap section FERRYZZ9 v3.*use a newer ferry" "$LOG"
e2e_done
