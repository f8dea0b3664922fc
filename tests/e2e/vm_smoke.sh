#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# ferry-test: group vm (a TCG guest takes a whole CPU: two guests, one per CPU)
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
. "$(dirname "$0")/../lib/common.sh"
. "$(dirname "$0")/../lib/vm.sh"

need_ferry
vm_requirements "QEMU/TCG smoke test"

# --- kernel (cached) --------------------------------------------------------
t0=$(date +%s)
vm_kernel

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

vm_boot "$SCRATCH/initrd.gz" 240
echo "# whole test: $(($(date +%s) - t0)) s"
e2e_done
