#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# ferry-test: group vm (a TCG guest takes a whole CPU: two guests, one per CPU)
# ferry mount --mode cachefiles of an ordinary gzip image through the ferry
# index attached to it (issue 45), in the QEMU/TCG guest of tests/vm/ (a
# 6.12 kernel with EROFS over fscache): on the host the Debian fixture's
# edit tag (three gzip layers, whiteouts) copied to a docker-registry and
# indexed there (the referrers tag: docker-registry has no referrers API),
# the guest's registry preloaded with its storage; reference listing and
# digests from umoci unpack. In the guest (tests/vm/cachefiles-index-
# driver.sh): the lazy mount is EROFS over fscache whose devices are the
# layers' virtual devices, every entry equals the reference, and readers
# of usr/bin get the reference bytes. Skips (ok # SKIP) only when QEMU or
# the kernel source is not installed.
E2E_TIMEOUT=$((${E2E_TIMEOUT:-0} > 3000 ? E2E_TIMEOUT : 3000))
. "$(dirname "$0")/../lib/common.sh"
. "$(dirname "$0")/../lib/oci.sh"
. "$(dirname "$0")/../lib/vm.sh"

TREELIST=$TOOLS/treelist
need_ferry
need_root
vm_requirements "cachefiles mode of an indexed image in the QEMU/TCG guest"
need_cmds umoci skopeo
if [ ! -x "$TREELIST" ]; then
	notok "tests/tools/treelist at $TREELIST (make tests)"
	e2e_done
fi
t0=$(date +%s)
vm_kernel

oci_fixtures
P=$SCRATCH/payload/idx
mkdir -p "$P"
vm_host_registry
check "skopeo copy oci:edit to the host registry, ferry index it there" bash -c '
	skopeo copy -q --dest-tls-verify=false "oci:$2:edit" "docker://$3/src:edit" &&
	"$1" index -q "docker://$3/src:edit"' _ "$FERRY" "$FIX" "$HREG" || e2e_done
if ! redit=$(umoci_ref "$FIX:edit" "$SCRATCH/bundle-edit" 2>"$LOG"); then
	notok "umoci unpack (reference tree)"
	diag "$LOG"
	e2e_done
fi
prep() {
	"$TREELIST" -n "$redit" | cut -d'|' -f1-9,12 >"$P/edit.list" &&
		(cd "$redit" && find usr/bin -type f | sort | xargs sha256sum) >"$P/usrbin.sha256" &&
		skopeo inspect --raw --tls-verify=false "docker://$HREG/src:edit" |
		python3 -c 'import json, sys
print("LAYERS_BYTES=%d" % sum(l["size"] for l in json.load(sys.stdin)["layers"]))' >"$P/idx.env"
}
check "reference listing and digests (host)" prep || e2e_done
vm_run "$VM/cachefiles-index-driver.sh" 420 2048 -p "$P" -r "$SCRATCH/reg/storage" \
	-x "$TREELIST" -c 0
