#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Multi-arch images: `ferry convert` of an image index (the fixture
# "multi": linux/amd64 the base image, linux/arm64 and linux/arm/v7 with
# a file /platform naming themselves) writes an index of ferry images with the same
# platforms — every platform by default, those of a repeated --platform
# otherwise — into oci: and docker:// (also with --format erofs-layers); skopeo inspect --raw reads the
# index and its platforms, each member is a ferry image of its platform,
# and mounting the index (ferry mount --mode local of the oci: index, a
# lazy ferryd mount of the docker:// one) picks the host's platform. One
# --platform still converts one image; a platform the index lacks and two
# platforms into a dir: are refused.
# shellcheck disable=SC2016 # conditions for eval are single-quoted on purpose
E2E_TIMEOUT=${E2E_TIMEOUT:-600}
. "$(dirname "$0")/../lib/common.sh"
. "$(dirname "$0")/../lib/oci.sh"
. "$(dirname "$0")/../lib/registry.sh"
. "$(dirname "$0")/../lib/lazy.sh"
need_ferryd
need_cmds skopeo docker-registry python3
oci_fixtures

OUT=$SCRATCH/out
host=$(host_platform)

# The fixture's linux/amd64 image is "base" (no /platform); the others
# have /platform naming themselves. MNT shows the host's platform.
is_host_platform() { # MNT
	if [ "$host" = linux/amd64 ]; then
		[ ! -e "$1/platform" ] && [ -s "$1/etc/debian_version" ]
	else
		[ "$(cat "$1/platform")" = "$host" ]
	fi
}

# The platforms an index (skopeo inspect --raw of REF) lists, sorted, one
# per line; fails when REF is not an OCI image index.
index_platforms() { # REF [skopeo args]
	local ref=$1
	shift
	skopeo inspect --raw "$@" "$ref" | python3 -c '
import json, sys
doc = json.load(sys.stdin)
if doc.get("mediaType") != "application/vnd.oci.image.index.v1+json":
    sys.exit("not an OCI image index: %s" % doc.get("mediaType"))
print("\n".join(sorted("/".join(filter(None, (m["platform"]["os"],
    m["platform"]["architecture"], m["platform"].get("variant"))))
    for m in doc["manifests"])))'
}

# Every member of the oci: index LAYOUT:TAG is a ferry image (bootstrap
# layer last) whose config says the platform its entry says.
members_are_ferry() { # LAYOUT TAG
	python3 - "$1" "$2" <<'EOF'
import json, sys
lay, tag = sys.argv[1], sys.argv[2]
def blob(d):
    return json.load(open("%s/blobs/%s" % (lay, d["digest"].replace(":", "/"))))
idx = json.load(open(lay + "/index.json"))
top = [d for d in idx["manifests"]
       if d.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag]
assert len(top) == 1 and top[0]["mediaType"].endswith("image.index.v1+json"), top
for m in blob(top[0])["manifests"]:
    man = blob(m)
    assert man["layers"][-1]["mediaType"].startswith("application/vnd.ferry") or \
        "bootstrap" in man["layers"][-1]["mediaType"], man["layers"][-1]
    cfg = blob(man["config"])
    p = m["platform"]
    assert (cfg["os"], cfg["architecture"]) == (p["os"], p["architecture"]), (cfg, p)
EOF
}

want_all=$(printf '%s\n' linux/amd64 linux/arm/v7 linux/arm64 | sort)
want_two=$(printf '%s\n' linux/amd64 linux/arm64 | sort)

# --- oci: --------------------------------------------------------------------------
if check "convert an index (every platform) into oci:" \
	"$FERRY" convert "oci:$FIX:multi" "oci:$OUT:all" -q; then
	expect "skopeo inspect --raw: an index of the 3 platforms" \
		test "$(index_platforms "oci:$OUT:all")" = "$want_all"
	check "each member is a ferry image of its platform" members_are_ferry "$OUT" all
fi
if check "convert --platform linux/amd64 --platform linux/arm64 into oci:" \
	"$FERRY" convert --platform linux/amd64 --platform linux/arm64 \
	"oci:$FIX:multi" "oci:$OUT:two" -q; then
	expect "skopeo inspect --raw: an index of the two platforms named" \
		test "$(index_platforms "oci:$OUT:two")" = "$want_two"
	check "ferry check of the index (the host's member)" "$FERRY" check "oci:$OUT:two"
	if check "ferry mount --mode local of the index" mount_local "oci:$OUT:two" "$SCRATCH/mnt"; then
		check "the mount is the host's platform ($host)" is_host_platform "$SCRATCH/mnt"
		check "ferry umount" umount_local "$SCRATCH/mnt"
	fi
fi
# Native EROFS layers: the same index of the same platforms.
if check "convert an index into native EROFS layers (oci:, every platform)" \
	"$FERRY" convert --format erofs-layers "oci:$FIX:multi" "oci:$OUT:native" -q; then
	expect "skopeo inspect --raw: an index of the 3 platforms" \
		test "$(index_platforms "oci:$OUT:native")" = "$want_all"
	check "each member is an image of native EROFS layers" \
		eval 'skopeo inspect --raw "oci:$OUT:native" | python3 -c "
import json, sys
lay = sys.argv[1]
for m in json.load(sys.stdin)[\"manifests\"]:
    man = json.load(open(lay + \"/blobs/\" + m[\"digest\"].replace(\":\", \"/\")))
    assert all(l[\"mediaType\"] == \"application/vnd.erofs.layer.v1\" for l in man[\"layers\"]), man
" "$OUT"'
	if check "ferry mount --mode local of the native index" \
		mount_local "oci:$OUT:native" "$SCRATCH/nmnt"; then
		check "the native mount is the host's platform ($host)" is_host_platform "$SCRATCH/nmnt"
		check "ferry umount (native)" umount_local "$SCRATCH/nmnt"
	fi
fi
if check "one --platform still converts one image" \
	"$FERRY" convert --platform linux/arm64 "oci:$FIX:multi" "oci:$OUT:one" -q; then
	check "... a manifest, not an index" \
		eval 'skopeo inspect --raw "oci:$OUT:one" | grep -q "image.manifest.v1+json"'
fi
check_fails "a platform the index lacks is refused" s390x \
	"$FERRY" convert --platform linux/s390x --platform linux/amd64 \
	"oci:$FIX:multi" "oci:$OUT:none" -q
check_exit "two platforms into a dir: are refused" 2 \
	"$FERRY" convert --platform linux/arm64 --platform linux/amd64 \
	"oci:$FIX:multi" "dir:$SCRATCH/none" -q
check "the refused conversions tagged nothing" \
	eval '! grep -q "\"none\"" "$OUT/index.json" && test ! -e "$SCRATCH/none"'

# --- docker:// ---------------------------------------------------------------------
if ! reg_start anon 2>"$LOG"; then
	notok "$E2E_NAME: start docker-registry"
	diag "$LOG"
	e2e_done
fi
IMG=docker://$REG/multi/debian:two
if check "convert the index into docker:// (two platforms)" \
	"$FERRY" convert --platform linux/arm64 --platform linux/amd64 \
	"oci:$FIX:multi" "$IMG" -q; then
	expect "skopeo inspect --raw docker://: an index of the two platforms" \
		test "$(index_platforms "$IMG" --tls-verify=false)" = "$want_two"
	lazy_use multi
	if check "lazy ferry mount of the docker:// index" \
		mount_lazy auto "$IMG" "$SCRATCH/lazy"; then
		check "the lazy mount is the host's platform ($host)" is_host_platform "$SCRATCH/lazy"
		check "ferry umount (lazy)" umount_lazy "$SCRATCH/lazy"
	fi
fi
e2e_done
