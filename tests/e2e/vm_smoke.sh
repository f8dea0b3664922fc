#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The QEMU/TCG VM harness (tests/vm/) end to end, on a kernel with EROFS
# over fscache (cachefiles on-demand), which the development host lacks:
#   - builds the VM kernel once per machine (cached under
#     /var/tmp/ferry-vm; later runs reuse it at once)
#   - converts a small tree on the host (dir: image, and pushed to a host
#     docker-registry whose storage is then preloaded into the guest's)
#   - boots the guest, whose driver (tests/vm/smoke-driver.sh) checks:
#     /dev/cachefiles; dir/tag/bind ondemand on the ext4 cache (refused on
#     tmpfs); a fresh ext4 by mkfs.ext4; docker-registry on the guest's
#     127.0.0.1 with the preloaded image, which ferry check reads over
#     http; ferry --version; ferry check dir:; ferry mount --mode local of
#     the image on the ext4 cache (file-backed EROFS), file digests equal
#     the host's; ferry umount
# Skips (ok # SKIP) only when QEMU or the kernel source is not installed.
#
# A cold kernel build took 16-26 min on a busy 2-core host: this script's
# watchdog gets 50 min (build-kernel.sh and run-vm.sh bound their own parts).
E2E_TIMEOUT=$((${E2E_TIMEOUT:-0} > 3000 ? E2E_TIMEOUT : 3000))
. "$(dirname "$0")/lib.sh"

VM=$TOP/tests/vm
need_ferry

skip() {
	echo "ok - vm: QEMU/TCG smoke test # SKIP $*"
	exit 0
}
command -v qemu-system-x86_64 >/dev/null ||
	skip "qemu-system-x86_64 not installed (make deps installs qemu-system-x86)"
dpkg-query -W -f='${Status}' linux-source-6.12 2>/dev/null | grep -q "install ok installed" ||
	skip "linux-source-6.12 not installed (make deps installs it)"
case $(ldd /bin/busybox 2>&1 || true) in
*"not a dynamic"*) ;;
*) skip "/bin/busybox is not busybox-static (make deps installs it)" ;;
esac
need_cmds mkfs.ext4 dumpe2fs cpio gzip docker-registry python3
need_root

# --- kernel (cached) --------------------------------------------------------
# A first build's progress (stderr) shows as it comes, so that a long CI
# step is visibly alive; the path (stdout) goes to a file.
t0=$(date +%s)
exec 3>"$SCRATCH/kernel.path"
"$VM/build-kernel.sh" 2>&1 >&3 | tee "$SCRATCH/kernel.log" | sed -u 's/^/# /'
rc=${PIPESTATUS[0]}
exec 3>&-
kernel=$(cat "$SCRATCH/kernel.path")
if [ "$rc" -ne 0 ] || [ ! -s "$kernel" ]; then
	notok "vm: build the VM kernel (tests/vm/build-kernel.sh, exit $rc)"
	diag "$SCRATCH/kernel.log" 40
	e2e_done
fi
echo "# kernel: $kernel ($(($(date +%s) - t0)) s)"

# --- a small image, converted on the host ------------------------------------
T=$SCRATCH/tree P=$SCRATCH/payload/smoke
mkdir -p "$T/sub/deeper" "$P"
echo "hello from the ferry VM smoke test" >"$T/hello.txt"
seq 1 40000 >"$T/sub/numbers.txt"
head -c 300000 /dev/urandom >"$T/sub/deeper/random.bin"
ln -s ../hello.txt "$T/sub/link"
(cd "$T" && sha256sum hello.txt sub/numbers.txt sub/deeper/random.bin) >"$P/expected.sha256"
"$FERRY" --version >"$P/ferry.version"
check "ferry convert dir: (host, 64K chunks)" \
	"$FERRY" convert -q --chunk-size 64K "dir:$T" "dir:$P/img" || e2e_done

# The same tree pushed to a host registry; its storage preloads the guest's.
regargs=()
if out=$(bash "$TOP/tests/tools/start-registry.sh" "$SCRATCH/reg" 2>"$SCRATCH/reg.err"); then
	read -r port pid <<<"$out"
	check "ferry convert to the host registry (guest registry preload)" \
		"$FERRY" convert -q --chunk-size 64K "dir:$T" "docker://127.0.0.1:$port/smoke:v1" &&
		regargs=(-r "$SCRATCH/reg/storage")
	kill "$pid" 2>/dev/null
	wait "$pid" 2>/dev/null
else
	notok "start a host docker-registry"
	diag "$SCRATCH/reg.err"
fi

# --- initramfs and boot --------------------------------------------------------
check "pack the initramfs (tests/vm/mkinitramfs.sh)" \
	"$VM/mkinitramfs.sh" -o "$SCRATCH/initrd.gz" -d "$VM/smoke-driver.sh" \
	-p "$P" "${regargs[@]}" || e2e_done
sed 's/^/# /' "$LOG"

t1=$(date +%s)
"$VM/run-vm.sh" -t 240 -l "$SCRATCH/vm" "$kernel" "$SCRATCH/initrd.gz" | tee "$SCRATCH/vm.out"
rc=${PIPESTATUS[0]}
E2E_PASS=$((E2E_PASS + $(grep -c '^ok ' "$SCRATCH/vm.out")))
E2E_FAIL=$((E2E_FAIL + $(grep -c '^not ok ' "$SCRATCH/vm.out")))
if [ "$rc" -ne 0 ] && ! grep -q '^not ok ' "$SCRATCH/vm.out"; then
	notok "vm: tests/vm/run-vm.sh failed (exit $rc)"
fi
echo "# VM boot + guest tests: $(($(date +%s) - t1)) s; whole test: $(($(date +%s) - t0)) s"
e2e_done
