#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# shellcheck disable=SC2016,SC2034 # expect_sh evaluates its quoted condition
# The chunk cache's size limit (ferry mount --cache-max-size, enforced by
# ferryd): one ferryd serves a FUSE and a fanotify mount of the Debian
# fixture image from docker-registry (through tests/tools/faultproxy.py,
# which counts the blob bytes served) over one cache that also holds a
# --mode local mount of a small dir: image, with a limit well below the
# lazy image's size:
#   - the whole tree of both mounts, read twice (the mounts' page cache
#     dropped in between), equals umoci unpack's every time
#   - the cache's blob files never take more than the limit plus two fetch
#     windows (sampled every 20 ms while reading)
#   - ranges evicted after the first pass are fetched again in the second
#     (the proxy counts them), and --list reports bytesEvicted
#   - the local mount's blobs (pinned) are never touched: same bytes, same
#     allocation, and its tree still reads as the reference
#   - kill -9 of ferryd while it evicts continuously (five times, at
#     different moments): ferry cache verify finds no chunk marked present
#     over punched (or any wrong) bytes
. "$(dirname "$0")/../lib/common.sh"
. "$(dirname "$0")/../lib/oci.sh"
. "$(dirname "$0")/../lib/registry.sh"
. "$(dirname "$0")/../lib/lazy.sh"

lazy_setup proxy
lazy_use limit
BLOBS=$FCACHE/blobs/sha256
# One fetch window: a fill claims at most 16 MiB of compressed frames
# (CLAIM_MAX in pkg-blob/cache.c); eviction runs 10 ms after a fill. Fills
# run concurrently (readers and fetch-ahead threads), so on a loaded machine
# a second one can land before the eviction thread is scheduled (seen:
# 18 MiB over at load average 9): the bound is two windows.
WINDOW=$((16 << 20))

blobs_du() { du -sB1 "$BLOBS" 2>/dev/null | cut -f1; }

# sha256 and allocated bytes of each pinned blob's data file.
pinned_sig() {
	python3 - "$FCACHE" <<'EOF'
import glob, hashlib, os, re, sys
cache = sys.argv[1]
digests = set()
for p in glob.glob(os.path.join(cache, "pins", "*.json")):
    digests |= set(re.findall(r"sha256:([0-9a-f]{64})", open(p).read()))
for d in sorted(digests):
    f = os.path.join(cache, "blobs", "sha256", d + ".data")
    h = hashlib.sha256()
    with open(f, "rb") as fh:
        for b in iter(lambda: fh.read(1 << 20), b""):
            h.update(b)
    print(d, h.hexdigest(), os.stat(f).st_blocks)
EOF
}

# Bytes of IMG's data blobs (uncompressed) that no pin names.
unpinned_bytes() {
	python3 - "$FCACHE" "$SCRATCH/blobs.txt" <<'EOF'
import glob, os, re, sys
cache, blobs = sys.argv[1], sys.argv[2]
pinned = set()
for p in glob.glob(os.path.join(cache, "pins", "*.json")):
    pinned |= set(re.findall(r"sha256:([0-9a-f]{64})", open(p).read()))
print(sum(int(l.split()[2]) for l in open(blobs)
          if l.split()[0].split(":")[-1] not in pinned))
EOF
}

# Highest blobs_du seen, every 20 ms, into $SCRATCH/maxusage until
# $SCRATCH/sampler.stop exists (at most 15 minutes).
sampler_start() {
	rm -f "$SCRATCH/sampler.stop"
	echo 0 >"$SCRATCH/maxusage"
	(
		max=0 end=$((SECONDS + 900))
		while [ ! -e "$SCRATCH/sampler.stop" ] && [ "$SECONDS" -lt "$end" ]; do
			u=$(blobs_du)
			if [ "${u:-0}" -gt "$max" ]; then
				max=$u
				echo "$max" >"$SCRATCH/maxusage"
			fi
			sleep 0.02
		done
	) &
	SAMPLER=$!
}
sampler_stop() {
	touch "$SCRATCH/sampler.stop"
	wait "$SAMPLER" 2>/dev/null
	cat "$SCRATCH/maxusage"
}

drop_tree() { # ROOT
	find "$1" -type f -print0 | xargs -0 -r python3 -c '
import os, sys
for p in sys.argv[1:]:
    fd = os.open(p, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)'
}

# --- a --mode local mount of a small dir: image in the cache: pinned -----------
LT=$SCRATCH/ltree
ML=$SCRATCH/m-local
mkdir -p "$LT/d" "$ML"
for i in 1 2 3 4; do
	head -c $((i << 20)) /dev/urandom >"$LT/d/f$i"
done
echo small >"$LT/small"
check "convert a small tree to dir:" "$FERRY" convert -q "dir:$LT" "dir:$SCRATCH/lout" || e2e_done
check "ferry mount --mode local of it into the cache" \
	timeout -k 5 300 "$FERRY" mount --mode local "dir:$SCRATCH/lout" "$ML" --cache-dir "$FCACHE" </dev/null ||
	e2e_done
sig0=$(pinned_sig 2>&1)
npinned=$(wc -l <<<"$sig0")
expect_sh "the local mount pinned its blobs ($npinned)" '[ "$npinned" -ge 1 ]'
base_usage=$(blobs_du)
lazy_u=$(unpinned_bytes)
LIMIT=$((base_usage + lazy_u / 4))
echo "# pinned blobs take $base_usage bytes; the lazy image has $lazy_u uncompressed bytes outside them; limit $LIMIT"
expect_sh "the lazy image's own data is several fetch windows (${lazy_u} bytes)" \
	'[ "$lazy_u" -ge $((4 * WINDOW)) ]'

# --- FUSE and fanotify mounts of the image, limited -----------------------------
MF=$SCRATCH/m-fuse
MN=$SCRATCH/m-fan
check "mount --mode fuse --cache-max-size $LIMIT --cache-min-free 0" \
	mount_lazy fuse "$PIMG" "$MF" --cache-max-size "$LIMIT" --cache-min-free 0 || e2e_done
check "mount --mode fanotify of the same image, same cache and ferryd" \
	mount_lazy fanotify "$PIMG" "$MN" || e2e_done

sampler_start
declare -A fetched
for pass in 1 2; do
	for m in "$MF" "$MN"; do
		name=fuse
		[ "$m" = "$MN" ] && name=fanotify
		fp_mark
		t0=$(now_ms)
		if hashtree "$m" sorted 0 >"$SCRATCH/sums-$name-$pass" 2>"$LOG"; then
			check "pass $pass: every file of the $name mount reads as the reference ($(($(now_ms) - t0)) ms)" \
				diff -q "$SCRATCH/ref.sums" "$SCRATCH/sums-$name-$pass"
		else
			notok "pass $pass: read the $name mount's tree"
			diag "$LOG"
		fi
		fetched[$name$pass]=$(fp_data_bytes)
		# The mount's own page cache: what is read next comes from the cache files.
		drop_tree "$m"
	done
done
max=$(sampler_stop)
echo "# blob bytes fetched: fuse ${fetched[fuse1]} then ${fetched[fuse2]}, fanotify ${fetched[fanotify1]} then ${fetched[fanotify2]}; highest cache usage $max (limit $LIMIT, window $WINDOW)"
expect_sh "the cache never exceeded the limit by more than two fetch windows ($max <= $LIMIT + 2 x $WINDOW)" \
	'[ "$max" -gt 0 ] && [ "$max" -le $((LIMIT + 2 * WINDOW)) ]'
now=$(blobs_du)
expect_sh "after reading, the cache is within the limit ($now <= $LIMIT)" '[ "$now" -le "$LIMIT" ]'
expect_sh "pass 1 of the fuse mount fetched more than the limit leaves room for (${fetched[fuse1]} > $((LIMIT - base_usage)))" \
	'[ "${fetched[fuse1]}" -gt $((LIMIT - base_usage)) ]'
# The fanotify mount reads the same blobs after the FUSE mount: what the
# limit evicted meanwhile raises pre-content events on the punched ranges.
for k in fanotify1 fuse2 fanotify2; do
	expect_sh "evicted ranges were fetched again ($k: ${fetched[$k]} bytes)" \
		'[ "${fetched[$k]}" -gt $((lazy_u / 8)) ]'
done
ev_f=$(mount_field "$MF" bytesEvicted 2>&1)
ev_n=$(mount_field "$MN" bytesEvicted 2>&1)
expect_sh "ferry mount --list reports bytesEvicted (fuse $ev_f, fanotify $ev_n)" \
	'[ "${ev_f:-0}" -gt 0 ] && [ "${ev_n:-0}" -gt 0 ]'
sig1=$(pinned_sig 2>&1)
expect_sh "the local mount's blobs are untouched (same bytes and allocation)" '[ "$sig0" = "$sig1" ]'
if hashtree "$ML" sorted 0 >"$SCRATCH/sums-local" 2>"$LOG"; then
	check "the local mount still reads as its tree" bash -c \
		'diff -q <(python3 -c "$1" "$2" sorted 0) "$3"' _ "$HASHTREE_PY" "$LT" "$SCRATCH/sums-local"
else
	notok "read the local mount's tree"
	diag "$LOG"
fi
check "ferry cache ls shows the usage against the limit" bash -c \
	'"$1" cache --cache-dir "$2" ls | grep -q "limit $3"' _ "$FERRY" "$FCACHE" "$LIMIT"
check "ferry umount (fanotify)" umount_lazy "$MN"
check "ferry umount (fuse)" umount_lazy "$MF"

# --- kill -9 while evicting ----------------------------------------------------
# A tiny limit keeps ferryd evicting while a reader fetches; it is killed at
# a different moment each round, then the cache is checked offline.
tiny=$((base_usage + (2 << 20)))
bad=0 rounds=0 evicted=0
for delay in 1.5 2.0 2.6 3.2 3.9; do
	mount_lazy fuse "$PIMG" "$MF" --cache-max-size "$tiny" --cache-min-free 0 2>"$LOG" || break
	hashtree "$MF" shuffle 7 >/dev/null 2>&1 &
	reader=$!
	sleep "$delay"
	e=$(mount_field "$MF" bytesEvicted 2>/dev/null)
	[ "${e:-0}" -gt 0 ] && evicted=$((evicted + 1))
	# With its keeper: a successor would take the mount over and the
	# reader would read on (failover is daemon_failover.sh's).
	mapfile -t dp < <(daemon_pids; keeper_pids)
	kill -9 "${dp[@]}" 2>/dev/null
	wait "$reader" 2>/dev/null
	timeout -k 5 60 "$FERRY" umount "$MF" </dev/null >/dev/null 2>&1
	out=$(timeout -k 5 300 "$FERRY" cache --cache-dir "$FCACHE" verify 2>&1)
	n=$(sed -n 's/.*; \([0-9]*\) bad chunks cleared$/\1/p' <<<"$out")
	bad=$((bad + ${n:-1}))
	rounds=$((rounds + 1))
done
expect_sh "ferryd had evicted before it was killed ($evicted of $rounds rounds)" '[ "$evicted" -ge 4 ]'
expect_sh "after each kill -9, no chunk is marked present over punched or wrong bytes ($bad bad in $rounds rounds)" \
	'[ "$rounds" -eq 5 ] && [ "$bad" -eq 0 ]'
sig2=$(pinned_sig 2>&1)
expect_sh "the local mount's blobs are still untouched" '[ "$sig0" = "$sig2" ]'
check "umount the local mount" umount "$ML"
e2e_done
