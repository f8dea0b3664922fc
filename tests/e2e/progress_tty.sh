#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The progress line on a terminal (tests/tools/ptyrun.py gives ferry a
# pty of a chosen width). ferry convert of the three-layer Debian fixture
# on an 80-column terminal: no line wider than 80 columns, the summary's
# included; progress lines name each layer by a 12-digit digest, count in
# human units with a percentage, and once measured show a rate and an
# ETA. On 40 columns none is wider than 40, a UTF-8 label included, cut
# between characters. With --json the terminal gets
# the JSON alone; with stderr not a terminal, no progress at all.
. "$(dirname "$0")/../lib/common.sh"
. "$(dirname "$0")/../lib/oci.sh"
need_root
need_ferry
oci_fixtures
PTYRUN=(python3 "$TOP/tests/tools/ptyrun.py")

# The terminal lines of a ptyrun.py capture: "LENGTH<tab>TEXT".
term_lines() { "${PTYRUN[@]}" --lines "$1"; }

widest() { # CAPTURE: the widest line's length
	term_lines "$1" | cut -f1 | sort -n | tail -1
}

check "convert on an 80-column terminal" \
	"${PTYRUN[@]}" 80 "$SCRATCH/tty80" "$FERRY" convert "oci:$FIX:edit" "dir:$SCRATCH/out80"
w=$(widest "$SCRATCH/tty80")
expect "no line wider than 80 columns (widest $w)" [ "${w:-999}" -le 80 ]
progress=$(term_lines "$SCRATCH/tty80" | cut -f2 | grep -c '^layer sha256:')
expect "progress lines were drawn ($progress)" [ "$progress" -ge 3 ]
expect "progress lines name layers by 12 hex digits, never 64" \
	bash -c '! "$@" | cut -f2 | grep "^layer" | grep -qE "[0-9a-f]{13}"' _ "${PTYRUN[@]}" --lines "$SCRATCH/tty80"
full='^layer sha256:[0-9a-f]{12}  [0-9.]+ (B|KiB|MiB|GiB) / [0-9.]+ (KiB|MiB|GiB)  [0-9]+%  [0-9.]+ (B|KiB|MiB|GiB)/s  ETA [0-9]+:[0-9]{2}$'
expect "a progress line with sizes, percentage, rate and ETA" \
	bash -c '"$@" | cut -f2 | grep -qE "$0"' "$full" "${PTYRUN[@]}" --lines "$SCRATCH/tty80"
expect "the summary follows on the terminal" grep -q "converted [0-9]* entries" "$SCRATCH/tty80"

check "convert on a 40-column terminal" \
	"${PTYRUN[@]}" 40 "$SCRATCH/tty40" "$FERRY" convert "oci:$FIX:base" "dir:$SCRATCH/out40"
w=$(term_lines "$SCRATCH/tty40" | grep -P '\tlayer' | cut -f1 | sort -n | tail -1)
expect "progress lines no wider than 40 columns (widest ${w:-none})" [ "${w:-999}" -le 40 ]

check "convert --json on a terminal" \
	"${PTYRUN[@]}" 80 "$SCRATCH/json" "$FERRY" convert --json "oci:$FIX:base" "dir:$SCRATCH/outj"
expect "with --json the terminal gets the JSON summary alone" \
	python3 -c 'import json, sys; json.loads(open(sys.argv[1], "rb").read().decode())' "$SCRATCH/json"

# A label of many-byte characters (an image under a directory named in
# UTF-8, the label of mount --mode local's fetch) cut to fit: never half a
# character, never wider than the terminal.
# The path is relative, so that the label's head (what stays) is UTF-8;
# then wide characters (two columns each).
u=$(printf 'ä%.0s' $(seq 5))$(printf '漢%.0s' $(seq 20))
mkdir -p "$SCRATCH/$u" "$SCRATCH/mnt-u"
cp -r "$SCRATCH/out40/." "$SCRATCH/$u/"
check "mount --mode local of a dir: image under a UTF-8 path, on a 40-column terminal" \
	env -C "$SCRATCH" "${PTYRUN[@]}" 40 "$SCRATCH/ttyu" "$FERRY" mount --mode local \
	--cache-dir "$SCRATCH/cache-u" "dir:$u" "$SCRATCH/mnt-u"
"$FERRY" umount "$SCRATCH/mnt-u" >/dev/null 2>&1
w=$(term_lines "$SCRATCH/ttyu" | grep -P '\tdir:' | cut -f2 | python3 -c '
import sys, unicodedata
print(max((sum(1 + (unicodedata.east_asian_width(c) in "WF") for c in l.rstrip("\n"))
           for l in sys.stdin), default=""))')
expect "its progress lines: drawn, no wider than 40 columns (widest ${w:-none})" [ "${w:-999}" -le 40 ]
expect "... and no character cut in half" bash -c '! "$@" | grep -q $'"'"'\xef\xbf\xbd'"'"'' _ "${PTYRUN[@]}" --lines "$SCRATCH/ttyu"

"$FERRY" convert "oci:$FIX:base" "dir:$SCRATCH/outp" 2>"$SCRATCH/err" </dev/null >/dev/null
expect "stderr not a terminal: no progress line" \
	bash -c '! grep -q "layer sha256" "$1" && ! grep -q $'"'"'\r'"'"' "$1"' _ "$SCRATCH/err"
e2e_done
