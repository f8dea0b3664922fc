#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# docker:// as a transport of ferry convert (source and destination),
# inspect, check and mount --mode local, against docker-registry on
# 127.0.0.1: a pull-convert-push round trip that skopeo reads back, the
# same bytes as converting from the OCI layout, a mounted tree equal to
# umoci unpack, Basic and Bearer auth, a chunk damaged inside the registry
# (check and mount name it, nothing wrong lands in the cache), and the
# chunk cache commands.
. "$(dirname "$0")/../lib/common.sh"
. "$(dirname "$0")/../lib/oci.sh"
. "$(dirname "$0")/../lib/registry.sh"
# Pushes stage under TMPDIR: ours alone, so that the check for leftovers
# below sees only this test's (other suites may push at the same time).
export TMPDIR=$SCRATCH/tmp
mkdir -p "$TMPDIR"
need_root
need_ferry
need_cmds docker-registry skopeo umoci htpasswd openssl
oci_fixtures
dmesg_mark

MNT=$SCRATCH/mnt
mkdir -p "$MNT"

if ! reg_start anon 2>"$LOG"; then
	notok "start docker-registry"
	diag "$LOG"
	e2e_done
fi
check "skopeo pushes the source image (edit)" reg_push_oci "$FIX:edit" "$REG/src/debian:edit"

# --- pull, convert, push ---------------------------------------------------
check "convert docker:// -> docker://" "$FERRY" convert -q \
	"docker://$REG/src/debian:edit" "docker://$REG/ferry/debian:edit"
check "convert oci: -> oci: (the same source, locally)" "$FERRY" convert -q \
	"oci:$FIX:edit" "oci:$SCRATCH/local:edit"
check "convert docker:// -> oci:" "$FERRY" convert -q \
	"docker://$REG/src/debian:edit" "oci:$SCRATCH/pulled:edit"
local_digest=$(tag_digest "$SCRATCH/local" edit)
expect "docker:// source gives the same manifest as the oci: source" \
	[ "$(tag_digest "$SCRATCH/pulled" edit)" = "$local_digest" ]
if skopeo inspect --raw --tls-verify=false "docker://$REG/ferry/debian:edit" \
	>"$SCRATCH/pushed.json" 2>"$LOG"; then
	ok "skopeo inspect reads the pushed ferry image"
	expect "the pushed manifest is the one ferry writes to a layout" \
		[ "sha256:$(sha256sum <"$SCRATCH/pushed.json" | cut -d' ' -f1)" = "$local_digest" ]
else
	notok "skopeo inspect reads the pushed ferry image"
	diag "$LOG"
fi
check "skopeo copy pulls the pushed ferry image" skopeo copy --quiet \
	--src-tls-verify=false "docker://$REG/ferry/debian:edit" "oci:$SCRATCH/skopeo:edit"
check "ferry check of what skopeo pulled" "$FERRY" check "oci:$SCRATCH/skopeo:edit"
check "no staging directory left in TMPDIR" \
	bash -c '! ls -d "${TMPDIR:-/var/tmp}"/ferry-push.* 2>/dev/null | grep -q .'

# --- read it back through the registry --------------------------------------
check "ferry inspect docker://" "$FERRY" inspect "docker://$REG/ferry/debian:edit"
check "ferry inspect docker://…@digest" "$FERRY" inspect "docker://$REG/ferry/debian@$local_digest"
check "ferry check docker://" "$FERRY" check "docker://$REG/ferry/debian:edit"
if ref=$(umoci_ref "$FIX:edit" "$SCRATCH/bundle" 2>"$LOG"); then
	if check "ferry mount --mode local docker://" mount_local \
		"docker://$REG/ferry/debian:edit" "$MNT"; then
		check "treecmp umoci unpack == docker:// mount" python3 "$TREECMP" "$ref" "$MNT"
		check "ferry umount" "$FERRY" umount "$MNT"
	fi
else
	notok "umoci unpack (reference tree)"
	diag "$LOG"
fi
cache_state() { stat -c '%n %i %Y %s' "$CACHE"/blobs/sha256/*.data; }
before=$(cache_state)
if check "mount docker:// again" mount_local "docker://$REG/ferry/debian:edit" "$MNT"; then
	expect "the second mount wrote nothing to the cache" [ "$before" = "$(cache_state)" ]
	"$FERRY" umount "$MNT"
fi

# --- the chunk cache commands ----------------------------------------------
if "$FERRY" cache --cache-dir "$CACHE" --json ls >"$SCRATCH/ls.json" 2>"$LOG"; then
	check "cache ls: every blob complete and named by the image record" \
		python3 - "$SCRATCH/ls.json" <<'EOF'
import json, sys
ls = json.load(open(sys.argv[1]))
assert ls["blobs"] and ls["images"], ls
for b in ls["blobs"]:
    assert b["chunksPresent"] == b["chunks"] and b["images"] >= 1 and not b["inUse"], b
EOF
else
	notok "ferry cache ls --json"
	diag "$LOG"
fi
check "cache gc keeps blobs an image record names" bash -c \
	'"$1" cache --cache-dir "$2" gc | grep -q "removed 0 blobs"' _ "$FERRY" "$CACHE"
# The bootstrap the kernel mounted stays while the record keeps it, even
# when old; once the record is gone, gc removes it (after a minute: aged).
expect "the mounted bootstrap is kept in the cache" [ -n "$(ls "$CACHE/bootstraps")" ]
touch -h -d '-2 min' "$CACHE"/bootstraps/*
check "cache gc keeps the bootstrap an image record keeps" bash -c \
	'"$1" cache --cache-dir "$2" gc | grep -q "removed 0 image documents" &&
	 [ -n "$(ls "$2/bootstraps")" ]' _ "$FERRY" "$CACHE"
check "cache prune --all removes every blob" bash -c \
	'"$1" cache --cache-dir "$2" prune --all >/dev/null &&
	 [ -z "$(ls "$2/blobs/sha256")" ]' _ "$FERRY" "$CACHE"
expect "  ... and the bootstrap no record keeps" [ -z "$(ls "$CACHE/bootstraps")" ]
check_fails "cache prune of an unknown image fails" "no image record" \
	"$FERRY" cache --cache-dir "$CACHE" prune docker://nowhere/x:y

# --- a damaged chunk inside the registry ------------------------------------
# The first data layer's first frame: one byte flipped in the registry's
# own copy of the blob.
blob=$(python3 - "$SCRATCH/pushed.json" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))
print(m["layers"][0]["digest"])
EOF
)
stored=$(reg_stored_blob "$blob")
if [ -f "$stored" ]; then
	cp "$stored" "$SCRATCH/blob.orig"
	python3 - "$stored" <<'EOF'
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(100)
    b = f.read(1)
    f.seek(100)
    f.write(bytes([b[0] ^ 0x55]))
EOF
	check_fails "check docker:// with a damaged chunk in the registry" "chunk" \
		"$FERRY" check "docker://$REG/ferry/debian:edit"
	rm -rf "$CACHE"
	check_fails "mount docker:// with a damaged chunk fails naming the chunk" "chunk" \
		"$FERRY" mount --mode local "docker://$REG/ferry/debian:edit" "$MNT" --cache-dir "$CACHE"
	expect "nothing mounted after the failure" [ -z "$(findmnt -n --mountpoint "$MNT")" ]
	cp "$SCRATCH/blob.orig" "$stored"
	check "after the registry is repaired the mount completes" mount_local \
		"docker://$REG/ferry/debian:edit" "$MNT"
	[ -n "$(findmnt -n --mountpoint "$MNT")" ] && "$FERRY" umount "$MNT"
else
	notok "locate the registry's copy of $blob"
fi

# --- authentication ---------------------------------------------------------
for mode in basic token; do
	if ! reg_start "$mode" 2>"$LOG"; then
		notok "start docker-registry ($mode auth)"
		diag "$LOG"
		continue
	fi
	check "convert oci: -> docker:// with --creds ($mode)" "$FERRY" convert -q \
		--creds "$REG_USER:$REG_PASS" "oci:$FIX:base" "docker://$REG/ferry/base:v1"
	check_fails "inspect without credentials is refused ($mode)" "$REG" \
		"$FERRY" inspect "docker://$REG/ferry/base:v1"
	if grep -q "$REG_PASS" "$LOG"; then
		notok "the refusal does not print the password ($mode)"
	else
		ok "the refusal does not print the password ($mode)"
	fi
	python3 - "$SCRATCH/auth.json" "$REG" "$REG_USER:$REG_PASS" <<'EOF'
import base64, json, sys
json.dump({"auths": {sys.argv[2]: {"auth": base64.b64encode(sys.argv[3].encode()).decode()}}},
          open(sys.argv[1], "w"))
EOF
	check "check docker:// with --authfile ($mode)" "$FERRY" check \
		--authfile "$SCRATCH/auth.json" "docker://$REG/ferry/base:v1"
	check "mount docker:// with \$REGISTRY_AUTH_FILE ($mode)" env \
		REGISTRY_AUTH_FILE="$SCRATCH/auth.json" "$FERRY" mount --mode local \
		"docker://$REG/ferry/base:v1" "$MNT" --cache-dir "$CACHE"
	[ -n "$(findmnt -n --mountpoint "$MNT")" ] && "$FERRY" umount "$MNT"
done

check_kernel_log
e2e_done
