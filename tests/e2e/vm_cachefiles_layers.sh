#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# ferry-test: group vm (a TCG guest takes a whole CPU: two guests, one per CPU)
# shellcheck disable=SC2016 # bash -c scripts take their arguments
# ferry mount --mode cachefiles of images of native EROFS layers (convert
# --format erofs-layers) in the QEMU/TCG guest of tests/vm/ (a 6.12 kernel
# with EROFS over fscache and overlayfs):
#   on the host: the Debian fixture's base (one layer) and edit (three,
#   whiteouts and opaque directories included, the first base's) converted
#   uncompressed (--compress none), and edit zstd-compressed too, pushed
#   to a docker-registry whose storage the guest's is preloaded with;
#   reference listings and digests from umoci unpack;
#   in the guest (tests/vm/cachefiles-layers-driver.sh): the one-layer
#   image is the layer's EROFS over fscache itself (fsid = the layer's
#   digest), the three-layer one an overlay of three; both mounted at
#   once, the shared layer a second time under its copy's fsid; each
#   fetched only the layers' metadata; every entry equals the reference
#   (type, mode, owner, size, mtime, target, xattrs); 4 concurrent
#   readers of usr/bin; --domain refused with its reason; the compressed
#   image beside them: metadata-only fetch, the reference listing, 4
#   readers, no decompression error (ferryd fills each compressed file's
#   pclusters whole: Linux 6.12 misreads partly cached ones); kill -9 of
#   ferryd under 8 readers of cold files of both three-layer images: the
#   keeper's successor takes all mounts over, every reader gets the
#   reference bytes; the layers' superblocks go with ferry umount;
#   --prefetch-all fills the kernel's cache files (reads fetch nothing
#   more; of the compressed image, what lies outside compressed files,
#   fetching less than half of it); --mode local of the compressed image stacks its downloaded
#   layers on this kernel (6.12 takes only attached mounts as overlayfs
#   layers: staged).
# Skips (ok # SKIP) only when QEMU or the kernel source is not installed.
E2E_TIMEOUT=$((${E2E_TIMEOUT:-0} > 3000 ? E2E_TIMEOUT : 3000))
. "$(dirname "$0")/../lib/common.sh"
. "$(dirname "$0")/../lib/oci.sh"
. "$(dirname "$0")/../lib/vm.sh"

TREELIST=$TOOLS/treelist
need_ferry
need_root
vm_requirements "cachefiles mode of native EROFS layers in the QEMU/TCG guest"
need_cmds umoci skopeo
if [ ! -x "$TREELIST" ]; then
	notok "tests/tools/treelist at $TREELIST (make tests)"
	e2e_done
fi
t0=$(date +%s)
vm_kernel

oci_fixtures
P=$SCRATCH/payload/nat
mkdir -p "$P"
vm_host_registry
# Uncompressed layers, and compressed ones (EROFS over fscache misreads
# partly cached compressed extents on 6.12: ferryd fills them whole).
check "convert oci:base and oci:edit --format erofs-layers (--compress none, and zstd) to the host registry" bash -c '
	"$1" convert -q --format erofs-layers --compress none "oci:$2:base" "docker://$3/nat:base" &&
	"$1" convert -q --format erofs-layers --compress none "oci:$2:edit" "docker://$3/nat:edit" &&
	"$1" convert -q --format erofs-layers "oci:$2:edit" "docker://$3/nat:zedit"' \
	_ "$FERRY" "$FIX" "$HREG" || e2e_done
if ! rbase=$(umoci_ref "$FIX:base" "$SCRATCH/bundle-base" 2>"$LOG") ||
	! redit=$(umoci_ref "$FIX:edit" "$SCRATCH/bundle-edit" 2>>"$LOG"); then
	notok "umoci unpack (reference trees)"
	diag "$LOG"
	e2e_done
fi

prep() {
	"$TREELIST" -n "$rbase" | cut -d'|' -f1-9,12 >"$P/base.list" &&
		"$TREELIST" -n "$redit" | cut -d'|' -f1-9,12 >"$P/edit.list" &&
		(cd "$redit" && find usr/bin -type f | sort | xargs sha256sum) >"$P/usrbin.sha256" &&
		skopeo inspect --raw --tls-verify=false "docker://$HREG/nat:base" >"$SCRATCH/base.json" &&
		skopeo inspect --raw --tls-verify=false "docker://$HREG/nat:edit" >"$SCRATCH/edit.json" &&
		skopeo inspect --raw --tls-verify=false "docker://$HREG/nat:zedit" >"$SCRATCH/zedit.json" ||
		return 1
	/usr/bin/python3 - "$SCRATCH/base.json" "$SCRATCH/edit.json" "$SCRATCH/zedit.json" "$redit" "$rbase" "$P" <<'PY'
import hashlib, json, os, subprocess, sys
base, edit, zedit, ref, rbase, out = sys.argv[1:]
bl = [l["digest"] for l in json.load(open(base))["layers"]]
el = json.load(open(edit))["layers"]
if len(bl) != 1 or len(el) < 2 or el[0]["digest"] != bl[0]:
    sys.exit("expected nat:base of one layer, the first of nat:edit's")
# Cold files for the failover: the largest under usr/lib, outside usr/bin.
files = []
for d, _, names in os.walk(os.path.join(ref, "usr/lib")):
    for n in names:
        p = os.path.join(d, n)
        if not os.path.islink(p) and os.path.isfile(p):
            files.append((os.path.getsize(p), os.path.relpath(p, ref)))
files.sort(reverse=True)
pick = sorted(p for _, p in files[:40])
sums = subprocess.check_output(["sha256sum", *pick], cwd=ref)
open(os.path.join(out, "fo.sha256"), "wb").write(sums)
with open(os.path.join(out, "nat.env"), "w") as f:
    f.write("LAYERS_BYTES=%d\n" % sum(l["size"] for l in el))
    f.write("ZLAYERS_BYTES=%d\n" % sum(l["size"] for l in json.load(open(zedit))["layers"]))
    f.write("BASE_FSID=%s\n" % bl[0].split(":", 1)[1])
    f.write("BASE_OSREL=%s\n" % hashlib.sha256(
        open(os.path.join(rbase, "etc/os-release"), "rb").read()).hexdigest())
PY
}
check "reference listings and digests (host)" prep || e2e_done
vm_run "$VM/cachefiles-layers-driver.sh" 420 2048 -p "$P" -r "$SCRATCH/reg/storage" \
	-x "$TREELIST" -c 0
