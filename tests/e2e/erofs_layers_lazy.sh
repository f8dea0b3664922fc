#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# shellcheck disable=SC2016,SC2034 # expect_sh evaluates its quoted condition
# Lazy mounts of native EROFS layer images (convert --format erofs-layers)
# from docker-registry on 127.0.0.1, in fanotify mode: each layer is a
# kernel EROFS over its sparse cache file, stacked with overlayfs, and
# ferryd fetches byte ranges of the layers on demand, each checked against
# the layer's range table (FORMAT.md 1d). Through the counting proxy
# (tests/tools/faultproxy.py):
#   - every layer carries a range table its annotations name (offset,
#     sha256), behind the EROFS image;
#   - the mount is an overlay of kernel EROFS mounts (a one-layer image
#     the layer's EROFS itself), listed as mode fanotify, and fetched only
#     the layers' metadata; two images sharing a layer are served side by
#     side from one cache file;
#   - a startup workload fetches a small part of the layers;
#   - the whole tree equals umoci's unpack; a remount with the same cache
#     fetches nothing; --prefetch-all makes every range present;
#   - a byte flipped in a layer's data in the registry: the files in that
#     range fail with EIO, every other file reads right, none reads wrong
#     bytes; flipped in its metadata: the mount is refused;
#   - refused with a reason: --mode fuse, --prefetch-files, a layer
#     without a range table (which --mode local still mounts), a range
#     table that does not match its annotation;
#   - kill -9 of ferryd under 4 readers: a new ferryd takes the mount
#     over (the keeper tells it the bottom layer's superblock), every
#     reader gets the reference bytes; kill -9 of the keeper is survived.
. "$(dirname "$0")/../lib/common.sh"
. "$(dirname "$0")/../lib/oci.sh"
. "$(dirname "$0")/../lib/registry.sh"
. "$(dirname "$0")/../lib/lazy.sh"

need_ferryd
need_cmds docker-registry skopeo umoci findmnt chroot
oci_fixtures
if ! reg_start anon 2>"$LOG" || ! fp_start 2>>"$LOG"; then
	notok "start docker-registry and the counting proxy"
	diag "$LOG"
	e2e_done
fi
IMG=docker://$REG/ferry/native:edit
PIMG=docker://$PROXY/ferry/native:edit
check "convert oci:edit -> docker:// --format erofs-layers" \
	"$FERRY" convert -q --format erofs-layers "oci:$FIX:edit" "$IMG" || e2e_done
if ! ref=$(umoci_ref "$FIX:edit" "$SCRATCH/bundle" 2>"$LOG"); then
	notok "umoci unpack (reference tree)"
	diag "$LOG"
	e2e_done
fi
hashtree "$ref" sorted 0 >"$SCRATCH/ref.sums" || e2e_done

# The manifest's layers as "DIGEST SIZE TABLE-OFFSET META-BYTES" lines in
# $SCRATCH/blobs.txt (what fp_data_bytes counts), each range table checked
# against its annotation and the layer's bytes.
layers_txt() { # IMAGE-REF (docker://)
	skopeo inspect --raw --tls-verify=false "$1" >"$SCRATCH/manifest.json" || return 1
	/usr/bin/python3 - "$SCRATCH/manifest.json" "$REG_DIR/storage/docker/registry/v2/blobs/sha256" \
		>"$SCRATCH/blobs.txt" <<'PY'
import hashlib, json, struct, sys
man = json.load(open(sys.argv[1]))
for l in man["layers"]:
    a = l.get("annotations", {})
    off = int(a["dev.ferry.erofs.range-table.offset"])
    want = a["dev.ferry.erofs.range-table.digest"]
    path = "%s/%s/%s/data" % (sys.argv[2], l["digest"][7:9], l["digest"][7:])
    data = open(path, "rb").read()
    table = data[off:]
    assert "sha256:" + hashlib.sha256(table).hexdigest() == want, "table digest"
    magic, rsize, nr, ibytes, mbytes = struct.unpack("<8sIIQQ", table[:32])
    assert magic == b"FERRYRT1" and ibytes == off and len(table) == 32 + 32 * nr, "header"
    for i in range(nr):
        piece = data[i * rsize:min((i + 1) * rsize, off)]
        assert hashlib.sha256(piece).digest() == table[32 + 32 * i:64 + 32 * i], "range %d" % i
    print(l["digest"], l["size"], off, mbytes)
PY
}
check "each layer's range table: named by its annotations, one sha256 per 128 KiB of the image" \
	layers_txt "$IMG" || e2e_done
read -r DATA_C META < <(awk '{ c += $2; m += $4 } END { print c + 0, m + 0 }' "$SCRATCH/blobs.txt")
echo "# $(wc -l <"$SCRATCH/blobs.txt") layers, $DATA_C bytes, $META of them metadata"

# --- startup workload on a fresh cache ----------------------------------------
lazy_use startup
M=$SCRATCH/m-startup
fp_mark
if check "mount --mode fanotify (through the proxy, fresh cache)" mount_lazy fanotify "$PIMG" "$M"; then
	t=$(fstype "$M")
	expect_sh "the mount point is an overlay (${t:-not mounted})" '[ "$t" = overlay ]'
	mode=$(mount_field "$M" mode 2>&1)
	expect_sh "ferry mount --list --json says mode fanotify ($mode)" '[ "$mode" = fanotify ]'
	mf=$(fp_data_bytes)
	expect_sh "the mount fetched the layers' metadata and little more ($mf B, metadata $META B)" \
		'[ "$mf" -ge "$META" ] && [ "$mf" -le $((META + 3 * 131072 * $(wc -l <"$SCRATCH/blobs.txt"))) ]'
	fp_mark
	check "startup: /etc/os-release reads as in the image" cmp "$ref/etc/os-release" "$M/etc/os-release"
	check "startup: find /usr lists the same entries as the reference" bash -c \
		'diff <(cd "$1" && find usr | sort) <(cd "$2" && timeout 60 find usr | sort)' _ "$ref" "$M"
	check "startup: chroot MNT /bin/sh -c true" timeout 60 chroot "$M" /bin/sh -c true
	settle_fetches "$M"
	f=$(fp_data_bytes)
	read -r s_read s_fetched s_present s_total s_pf < <(mount_stats "$M")
	echo "# startup fetched $f B of $DATA_C; ranges ${s_present:-?}/${s_total:-?} present"
	expect_sh "startup fetched < 25% of the layers ($f of $DATA_C B)" \
		'[ "$f" -gt 0 ] && [ "$f" -lt $((DATA_C / 4)) ]'
	# The proxy also counted the range tables (32 B per range, fetched
	# when the image was opened); ferry counts the ranges it fetched.
	tables=$(awk '{ t += $2 - $3 } END { print t }' "$SCRATCH/blobs.txt")
	expect_sh "ferry's stats: bytes fetched match the registry traffic ($s_fetched + tables $tables vs $mf + $f)" \
		'[ $((s_fetched + tables)) -eq $((mf + f)) ]'
	check "ferry umount" umount_lazy "$M"
fi

# Two checks on $M, whose ranges are all cached: the tree equals the
# reference, and reading it fetched nothing.
read_all_cached() { # WHAT
	local f
	fp_mark
	check "treecmp after $1" timeout 180 python3 "$TREECMP" --ignore nlink,links "$ref" "$M"
	f=$(fp_data_bytes)
	expect_sh "after $1, reading everything fetched nothing ($f B)" '[ "$f" -eq 0 ]'
}

# --- the whole tree, a remount, prefetch ----------------------------------------
lazy_use tree
M=$SCRATCH/m-tree
if check "mount --mode fanotify (fresh cache)" mount_lazy fanotify "$PIMG" "$M"; then
	fp_mark
	# Overlayfs cannot link across layers (erofs_layers.sh).
	check "treecmp umoci unpack == lazy native-layer mount" \
		timeout 180 python3 "$TREECMP" --ignore nlink,links "$ref" "$M"
	f=$(fp_data_bytes)
	expect_sh "a full read fetched at most the layers once ($f of $DATA_C B)" \
		'[ "$f" -gt 0 ] && [ "$f" -le "$DATA_C" ]'
	check "ferry umount (tree)" umount_lazy "$M"
	# The cache keeps layers like blobs: verified by their ranges' sha256,
	# kept by gc while the image is recorded.
	check "ferry cache verify: every present range matches its sha256" \
		"$FERRY" cache --cache-dir "$FCACHE" verify
	check "ferry cache gc keeps the recorded image's layers" \
		"$FERRY" cache --cache-dir "$FCACHE" gc
	check "mount again with the same cache" mount_lazy fanotify "$PIMG" "$M"
	read_all_cached "the remount"
	check "ferry umount (remount)" umount_lazy "$M"
fi
lazy_use pfall
M=$SCRATCH/m-pfall
if check "mount --mode fanotify --prefetch-all" mount_lazy fanotify "$PIMG" "$M" --prefetch-all; then
	if poll 60 all_present; then
		ok "--prefetch-all: every range present without reads"
	else
		notok "--prefetch-all: every range present without reads (waited 60 s)"
	fi
	read_all_cached "--prefetch-all"
	check "ferry umount (prefetch-all)" umount_lazy "$M"
fi

# --- one layer: attached directly, no overlay ----------------------------------------
lazy_use one
M=$SCRATCH/m-one
if check "convert oci:base (one layer) -> docker:// --format erofs-layers" \
	"$FERRY" convert -q --format erofs-layers "oci:$FIX:base" "docker://$REG/ferry/native:base" &&
	refbase=$(umoci_ref "$FIX:base" "$SCRATCH/bundle-base" 2>"$LOG") &&
	check "mount --mode fanotify (one layer)" mount_lazy fanotify "docker://$REG/ferry/native:base" "$M"; then
	t=$(fstype "$M")
	expect_sh "a one-layer image is the layer's kernel EROFS itself (${t:-not mounted})" \
		'[ "$t" = erofs ]'
	check "treecmp umoci unpack == lazy one-layer mount" \
		timeout 180 python3 "$TREECMP" "$refbase" "$M"
	# The edit image's bottom layer is this very layer (same bytes, same
	# digest): one cache file, marked by both mounts' groups, mounted by
	# both stacks.
	M2=$SCRATCH/m-one-edit
	if check "mount the edit image beside it (they share the base layer)" mount_lazy fanotify "$PIMG" "$M2"; then
		readers_start shared "$M2" 170 sorted shuffle
		check "treecmp base again, while the edit image is read" \
			timeout 180 python3 "$TREECMP" "$refbase" "$M"
		readers_wait
		readers_agree "the edit image's readers, beside it: every digest equals the reference" \
			"$SCRATCH/ref.sums"
		check "ferry umount (edit, beside base)" umount_lazy "$M2"
	fi
	check "ferry umount (one layer)" umount_lazy "$M"
fi

# --- a damaged range --------------------------------------------------------------
# A byte flipped in the registry's copy of the top layer, in the middle of
# its data (FILE) or of its metadata (META).
damage() { # data|meta
	local digest size off meta at
	read -r digest size off meta < <(tail -n 1 "$SCRATCH/blobs.txt")
	DMG_STORED=$(reg_stored_blob "$digest")
	[ -f "$SCRATCH/layer.orig" ] || cp "$DMG_STORED" "$SCRATCH/layer.orig"
	cp "$SCRATCH/layer.orig" "$DMG_STORED"
	if [ "$1" = data ]; then at=$(((meta + off) / 2)); else at=$((meta / 2)); fi
	python3 -c '
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(int(sys.argv[2])); b = f.read(1); f.seek(int(sys.argv[2])); f.write(bytes([b[0] ^ 0x5a]))' \
		"$DMG_STORED" "$at"
}
damage data
lazy_use damaged
M=$SCRATCH/m-damaged
if check "mount --mode fanotify with a damaged data range in the top layer" mount_lazy fanotify "$IMG" "$M"; then
	out=$(damaged_counts "$M" "$SCRATCH/ref.sums")
	read -r eio wrong other good <<<"$out"
	echo "# damaged data range: $eio files EIO, $wrong wrong, $other other errors, $good right"
	expect_sh "no file reads wrong bytes ($wrong), some fail with EIO ($eio), the rest read right ($good)" \
		'[ "$wrong" -eq 0 ] && [ "$other" -eq 0 ] && [ "$eio" -ge 1 ] && [ "$good" -gt 100 ]'
	check "ferryd's log names the layer range that failed to verify" \
		grep -q "sha256" "$FLOG"
	check "ferry umount (damaged)" umount_lazy "$M"
fi
damage meta
lazy_use damaged-meta
check_fails "a damaged metadata range: the mount is refused" "" \
	mount_lazy fanotify "$IMG" "$SCRATCH/m-dmeta"
expect_sh "nothing is mounted there" '! is_mounted "$SCRATCH/m-dmeta"'
cp "$SCRATCH/layer.orig" "$DMG_STORED"

# --- refusals ------------------------------------------------------------------------
lazy_use refuse
check_fails "--mode fuse is refused, naming fanotify, cachefiles and local" "in fanotify (Linux 6.14+, cache on ext4, xfs or btrfs) and cachefiles modes" \
	mount_lazy fuse "$IMG" "$SCRATCH/m-fuse"
printf '/etc/os-release\n' >"$SCRATCH/pf.list"
check_fails "--prefetch-files is refused" "prefetch-files needs ferry's format" \
	mount_lazy fanotify "$IMG" "$SCRATCH/m-pf" --prefetch-files "$SCRATCH/pf.list"

# An OCI layout of the image whose manifest lost its range tables, or
# names another table.
check "copy the image to an OCI layout" skopeo copy -q --src-tls-verify=false \
	"$IMG" "oci:$SCRATCH/nat:edit"
edit_layout() { # SRC-TAG DST-TAG drop|wrong
	/usr/bin/python3 - "$SCRATCH/nat" "$1" "$2" "$3" <<'PY'
import hashlib, json, os, sys
lay, src, dst, how = sys.argv[1:]
idx = json.load(open(lay + "/index.json"))
d = [m for m in idx["manifests"] if m["annotations"]["org.opencontainers.image.ref.name"] == src][0]
blob = lambda dg: lay + "/blobs/sha256/" + dg[7:]
man = json.load(open(blob(d["digest"])))
for l in man["layers"]:
    a = l["annotations"]
    if how == "drop":
        del a["dev.ferry.erofs.range-table.offset"], a["dev.ferry.erofs.range-table.digest"]
    else:
        a["dev.ferry.erofs.range-table.digest"] = "sha256:" + "0" * 64
text = json.dumps(man).encode()
dg = "sha256:" + hashlib.sha256(text).hexdigest()
open(blob(dg), "wb").write(text)
n = dict(d, digest=dg, size=len(text), annotations={"org.opencontainers.image.ref.name": dst})
idx["manifests"].append(n)
json.dump(idx, open(lay + "/index.json", "w"))
PY
}
if edit_layout edit plain drop && edit_layout edit wrong wrong; then
	check_fails "layers without a range table: refused, pointing to --mode local" "mount it with --mode local" \
		mount_lazy fanotify "oci:$SCRATCH/nat:plain" "$SCRATCH/m-plain"
	mkdir -p "$SCRATCH/m-plain"
	check "--mode local mounts them" "$FERRY" mount --mode local --cache-dir "$FCACHE" \
		"oci:$SCRATCH/nat:plain" "$SCRATCH/m-plain" &&
		check "ferry umount (local)" umount_lazy "$SCRATCH/m-plain"
	check_fails "a range table that is not the annotation's: refused" "does not match the manifest" \
		mount_lazy fanotify "oci:$SCRATCH/nat:wrong" "$SCRATCH/m-wrong"
else
	notok "edit the OCI layout's manifest"
fi

# --- ferryd killed ------------------------------------------------------------------
# Its keeper hands the mount to a new ferryd, told the bottom layer's
# superblock (an overlay has none of its own); readers only wait.
lazy_use killed
M=$SCRATCH/m-killed
if check "mount --mode fanotify (for kill -9, fresh cache)" mount_lazy fanotify "$PIMG" "$M"; then
	dpid=$(daemon_pids | head -n 1)
	kpid=$(keeper_pid "$M" 2>&1)
	fp_set slow delay=0.05 count=-1 "method=^GET$" path=/blobs/
	readers_start killed "$M" 170 sorted reverse shuffle pread
	sleep 1
	kill -9 "$dpid"
	readers_wait
	fp_set none
	readers_agree "kill -9 of ferryd ($dpid) under 4 readers: every digest equals the reference" \
		"$SCRATCH/ref.sums"
	npid=$(daemon_pids | head -n 1)
	expect_sh "a new ferryd ($npid) serves the mount, not the killed one ($dpid)" \
		'[ -n "$npid" ] && [ "$npid" != "$dpid" ]'
	expect_sh "the mount never left (mode $(mount_field "$M" mode 2>&1))" \
		'is_mounted "$M" && [ "$(fstype "$M")" = overlay ]'
	check "after the takeover: os-release reads right" reread etc/os-release
	kpid2=$(keeper_pid "$M" 2>&1)
	kill -9 "$kpid2" 2>/dev/null
	sleep 0.5
	check "kill -9 of the keeper ($kpid2): the mount is still served" \
		bash -c 'drop_pages() { :; }; cmp "$1" "$2"' _ "$ref/usr/bin/perl" "$M/usr/bin/perl"
	kpid3=$(keeper_pid "$M" 2>&1)
	expect_sh "a new keeper ($kpid3) stands in ($kpid2)" \
		'is_keeper "$kpid3" && [ "$kpid3" != "$kpid2" ]'
	upid=$(daemon_pids | head -n 1)
	check "ferry daemon upgrade: the mount is handed to the new binary" \
		"$FERRY" daemon upgrade --socket "$FSOCK"
	check "after the upgrade: usr/bin/perl reads right" reread usr/bin/perl
	expect_sh "another ferryd serves it ($(daemon_pids | head -n 1), was $upid)" \
		'[ "$(daemon_pids | head -n 1)" != "$upid" ]'
	check "ferry umount (after the takeover)" umount_lazy "$M"
	expect_sh "the keepers exit after the umount" 'wait_gone 5 "$kpid" "$kpid3"'
fi

e2e_done
