#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# ferry-test: group vm (a TCG guest takes a whole CPU: two guests, one per CPU)
# shellcheck disable=SC2016 # bash -c scripts take their arguments
# ferry mount --mode cachefiles (EROFS over fscache, /dev/cachefiles owned
# by ferryd) in the QEMU/TCG guest of tests/vm/, whose 6.12 kernel has
# CACHEFILES_ONDEMAND and EROFS_FS_ONDEMAND (the host's has not):
#   on the host: the Debian fixture's base and pkgs tags (pkgs shares
#   base's layer blob) and the edge-case fixture (mkfixture.sh) converted
#   and pushed to a docker-registry whose storage the guest's is preloaded
#   with; reference listings (tests/tools/treelist, treecmp's fields) and
#   digests made on the host
#   in the guest (tests/vm/cachefiles-driver.sh): a lazy mount from the
#   guest's registry; the startup workload fetches < 25% of the image;
#   every entry's metadata equals the reference; 8 concurrent readers;
#   a corrupted chunk gives EIO, never wrong bytes; the fixture's every
#   attribute and byte; a warm restart with a new ferryd fetches nothing;
#   two images in one domain share one cache file for their common blob;
#   one copy on disk (the kernel's cache files, not the chunk cache);
#   ferry cache ls/gc/prune of CACHE/fscache, bound and not; kill -9 of
#   ferryd: the keeper's successor (same --log-file) takes over; 10
#   ferry daemon upgrades while 16 readers read a cold mount; kill -9 of
#   the keeper alone: ferryd starts another, whose successor takes over
#   when ferryd is killed next; ferryd and keeper killed: EIO, and ferry
#   umount works; --prefetch-all fills
#   the kernel's cache files; cachefiles over a FUSE-filled chunk cache
#   fetches nothing
# And on the host: --mode cachefiles fails at once, naming the kernel
# options and the other modes, when the kernel has no /dev/cachefiles.
# Skips (ok # SKIP) the VM part only when QEMU or the kernel source is not
# installed. The kernel is tests/vm/build-kernel.sh's (cached; a cold
# build takes up to ~26 min on a busy host, hence the 50 min watchdog).
E2E_TIMEOUT=$((${E2E_TIMEOUT:-0} > 3000 ? E2E_TIMEOUT : 3000))
. "$(dirname "$0")/../lib/common.sh"
. "$(dirname "$0")/../lib/oci.sh"
. "$(dirname "$0")/../lib/vm.sh"

TREELIST=$TOOLS/treelist
need_ferry
need_root

# --- on this host: no cachefiles, a clear answer ---------------------------------
if [ ! -e /dev/cachefiles ]; then
	mkdir -p "$SCRATCH/h/src" "$SCRATCH/h/m"
	echo x >"$SCRATCH/h/src/x"
	"$FERRY" convert -q "dir:$SCRATCH/h/src" "dir:$SCRATCH/h/img" >"$LOG" 2>&1
	t0=$(date +%s%N)
	timeout 30 "$FERRY" mount --mode cachefiles --socket "$SCRATCH/h/ferryd.sock" \
		--cache-dir "$SCRATCH/h/cache" "dir:$SCRATCH/h/img" "$SCRATCH/h/m" >"$LOG" 2>&1
	rc=$?
	ms=$((($(date +%s%N) - t0) / 1000000))
	if [ "$rc" -ne 0 ] && grep -q CONFIG_CACHEFILES_ONDEMAND "$LOG" &&
		grep -q -- "--mode fanotify" "$LOG" && grep -q -- "--mode fuse" "$LOG" && [ "$ms" -lt 5000 ]; then
		ok "host without /dev/cachefiles: --mode cachefiles fails in $ms ms naming CONFIG_CACHEFILES_ONDEMAND and the other modes"
	else
		notok "host without /dev/cachefiles: --mode cachefiles fails at once with a clear error (exit $rc, $ms ms)"
		diag "$LOG"
	fi
	sed 's/^/    /' "$LOG"
	"$FERRY" mount --list --json --socket "$SCRATCH/h/ferryd.sock" 2>/dev/null |
		sed -n 's/^ *"pid": *\([0-9]*\).*/\1/p' | xargs -r kill
fi

vm_requirements "cachefiles mode in the QEMU/TCG guest"
need_cmds umoci
if [ ! -x "$TREELIST" ]; then
	notok "tests/tools/treelist at $TREELIST (make tests)"
	e2e_done
fi
t0=$(date +%s)
vm_kernel

# --- images in a host registry, references ---------------------------------------
oci_fixtures
P=$SCRATCH/payload/cf FX=$SCRATCH/fx
mkdir -p "$P"
vm_host_registry
check "convert oci:base and oci:pkgs to the host registry" bash -c '
	"$1" convert -q "oci:$2:base" "docker://$3/deb:base" &&
	"$1" convert -q "oci:$2:pkgs" "docker://$3/deb:pkgs"' _ "$FERRY" "$FIX" "$HREG" || e2e_done
check "build the edge-case fixture and push it" bash -c '
	bash "$1" "$2" >/dev/null && "$3" convert -q "dir:$2" "docker://$4/fx:v1"' \
	_ "$MKFIXTURE" "$FX" "$FERRY" "$HREG" || e2e_done
if ! ref=$(umoci_ref "$FIX:base" "$SCRATCH/bundle" 2>"$LOG"); then
	notok "umoci unpack (reference tree of base)"
	diag "$LOG"
	e2e_done
fi

# The chunk to damage: the first (a frame of its own, 1 MiB) of the largest
# file under usr/lib that the startup workload does not load.
prep() {
	"$TREELIST" -n "$ref" >"$P/deb.list" &&
		"$TREELIST" "$FX" >"$P/fx.list" &&
		(cd "$ref" && find usr/bin -type f | sort | xargs sha256sum) >"$P/usrbin.sha256" &&
		(cd "$ref" && find usr | sort) >"$P/usr.find" &&
		cp "$ref/etc/os-release" "$P/os-release" || return 1
	python3 - "$FERRY" "docker://$HREG" "$ref" "$SCRATCH/reg/storage" "$P" <<'EOF'
import hashlib, json, os, stat, subprocess, sys
ferry, reg, ref, storage, out = sys.argv[1:]
def inspect(*args):
    return json.loads(subprocess.check_output([ferry, "inspect", "--json", *args]))
base, pkgs = inspect(reg + "/deb:base"), inspect(reg + "/deb:pkgs")
blobs = [b["digest"] for b in base["blobs"]]
shared = set(blobs) & set(b["digest"] for b in pkgs["blobs"])
if not shared:
    sys.exit("deb:base and deb:pkgs share no blob")
big = []
for d, _, names in os.walk(os.path.join(ref, "usr/lib")):
    for n in names:
        p = os.path.join(d, n)
        if os.path.islink(p) or n.startswith(("libc.", "ld-linux", "libc-")):
            continue
        if os.path.getsize(p) > 2 << 20:
            big.append((os.path.getsize(p), os.path.relpath(p, ref)))
big.sort(reverse=True)
if len(big) < 3:
    sys.exit("fewer than 3 files over 2 MiB under usr/lib")
best = big[0]
c = inspect(reg + "/deb:base", "/" + best[1])["chunks"][0]
digest = blobs[c["deviceId"] - 1]
h = digest.split(":", 1)[1]
blob = "docker/registry/v2/blobs/sha256/%s/%s/data" % (h[:2], h)
off = c["compressedOffset"] + c["compressedSize"] // 2
with open(os.path.join(storage, blob), "rb") as f:
    f.seek(off)
    good = f.read(1)[0]
with open(os.path.join(out, "cf.env"), "w") as f:
    f.write("DATA_C=%d\n" % sum(b["size"] for b in base["blobs"]))
    # usr/bin's file bytes, each inode once (the kernel caches it once).
    ino = {}
    for d, _, ns in os.walk(os.path.join(ref, "usr/bin")):
        for n in ns:
            st = os.lstat(os.path.join(d, n))
            if stat.S_ISREG(st.st_mode):
                ino[st.st_ino] = st.st_size
    f.write("USRBIN_BYTES=%d\n" % sum(ino.values()))
    f.write("DMG_FILE=%s\nDMG_BLOB_PATH=%s\nDMG_OFF=%d\nDMG_LEN1=%d\n" %
            (best[1], blob, off, c["length"]))
    f.write("DMG_GOOD=%03o\nDMG_BAD=%03o\n" % (good, good ^ 0x5a))
    f.write("SHARED=%s\n" % sorted(shared)[0].split(":", 1)[1])
    f.write("FX_BLOBS='%s'\n" % " ".join(b["digest"].split(":", 1)[1]
                                         for b in inspect(reg + "/fx:v1")["blobs"]))
    # Read while ferryd is killed (failover), and after ferryd and its
    # keeper are killed (no successor).
    f.write("FO_FILE=%s\nFO_SUM=%s\nGONE_FILE=%s\n" % (
        big[1][1], hashlib.sha256(open(os.path.join(ref, big[1][1]), "rb").read()).hexdigest(),
        big[2][1]))
with open(os.path.join(out, "dmg.ref"), "wb") as f:
    f.write(open(os.path.join(ref, best[1]), "rb").read())
print("damaged file: /%s (%d bytes), byte %d of %s" % (best[1], best[0], off, digest))
EOF
}
check "reference listings, digests and the chunk to damage (host)" prep || e2e_done
sed 's/^/# /' "$LOG"

# --- initramfs and boot ---------------------------------------------------------------
vm_run "$VM/cachefiles-driver.sh" 420 2048 -p "$P" -r "$SCRATCH/reg/storage" -x "$TREELIST" -c 0
