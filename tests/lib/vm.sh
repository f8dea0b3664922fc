# shellcheck shell=bash
# SPDX-License-Identifier: MIT
# Helpers for the e2e tests that run in the QEMU/TCG guest of tests/vm/
# (vm_smoke.sh, vm_cachefiles.sh, vm_cachefiles_layers.sh), sourced after
# lib/common.sh (run directly it does nothing). docs/TESTING.md describes the harness.
#
#   vm_requirements WHAT   ok # SKIP (and exit) when QEMU, the kernel source
#                          or busybox-static is missing; then the commands
#                          and root every VM test needs
#   vm_kernel              the guest kernel (tests/vm/build-kernel.sh,
#                          cached; a first build's progress is shown as it
#                          comes) in KERNEL; ends the test when it fails
#   vm_boot INITRD SECS [run-vm.sh options]
#                          boot it (tests/vm/run-vm.sh, logs kept in
#                          $SCRATCH/vm) and count the guest's results
#   vm_run DRIVER SECS MB [mkinitramfs.sh options]
#                          stop the host registry, pack the initramfs with
#                          the guest driver DRIVER, boot it with MB of
#                          memory for SECS (vm_boot), end the test
#   vm_host_registry       a docker-registry on the host (storage in
#                          $SCRATCH/reg, preloaded into the guest's): HREG
#                          (127.0.0.1:PORT) and REGPID; ends the test when
#                          it does not start

[ "${BASH_SOURCE[0]}" = "$0" ] && exit 0

VM=$TOP/tests/vm

vm_requirements() { # WHAT
	local skip="ok - vm: $1 # SKIP"
	if ! command -v qemu-system-x86_64 >/dev/null; then
		echo "$skip qemu-system-x86_64 not installed (make deps installs qemu-system-x86)"
		exit 0
	fi
	if ! dpkg-query -W -f='${Status}' linux-source-6.12 2>/dev/null |
		grep -q "install ok installed"; then
		echo "$skip linux-source-6.12 not installed (make deps installs it)"
		exit 0
	fi
	case $(ldd /bin/busybox 2>&1 || true) in
	*"not a dynamic"*) ;;
	*)
		echo "$skip /bin/busybox is not busybox-static (make deps installs it)"
		exit 0
		;;
	esac
	need_cmds mkfs.ext4 dumpe2fs cpio gzip docker-registry python3
	need_root
}

vm_kernel() {
	local rc t0
	t0=$(date +%s)
	# The path (stdout) to a file, progress (stderr) through at once.
	exec 3>"$SCRATCH/kernel.path"
	"$VM/build-kernel.sh" 2>&1 >&3 | tee "$SCRATCH/kernel.log" | sed -u 's/^/# /'
	rc=${PIPESTATUS[0]}
	exec 3>&-
	KERNEL=$(cat "$SCRATCH/kernel.path")
	if [ "$rc" -ne 0 ] || [ ! -s "$KERNEL" ]; then
		notok "vm: build the VM kernel (tests/vm/build-kernel.sh, exit $rc)"
		diag "$SCRATCH/kernel.log" 40
		e2e_done
	fi
	echo "# kernel: $KERNEL ($(($(date +%s) - t0)) s)"
}

vm_boot() { # INITRD SECS [run-vm.sh options]
	local initrd=$1 secs=$2 rc t1
	shift 2
	t1=$(date +%s)
	"$VM/run-vm.sh" -t "$secs" -l "$SCRATCH/vm" "$@" "$KERNEL" "$initrd" |
		tee "$SCRATCH/vm.out"
	rc=${PIPESTATUS[0]}
	E2E_PASS=$((E2E_PASS + $(grep -c '^ok ' "$SCRATCH/vm.out")))
	E2E_FAIL=$((E2E_FAIL + $(grep -c '^not ok ' "$SCRATCH/vm.out")))
	if [ "$rc" -ne 0 ] && ! grep -q '^not ok ' "$SCRATCH/vm.out"; then
		notok "vm: tests/vm/run-vm.sh failed (exit $rc)"
	fi
	echo "# VM boot + guest tests: $(($(date +%s) - t1)) s"
}

vm_host_registry() {
	local out port
	if ! out=$(bash "$TOP/tests/tools/start-registry.sh" "$SCRATCH/reg" 2>"$LOG"); then
		notok "start a host docker-registry"
		diag "$LOG"
		e2e_done
	fi
	read -r port REGPID <<<"$out"
	# shellcheck disable=SC2034 # the caller's
	HREG=127.0.0.1:$port
}

vm_run() {
	local driver=$1 secs=$2 mem=$3
	shift 3
	[ -z "${REGPID:-}" ] || kill "$REGPID" 2>/dev/null
	check "pack the initramfs (tests/vm/mkinitramfs.sh)" \
		"$VM/mkinitramfs.sh" -o "$SCRATCH/initrd.gz" -d "$driver" "$@" || e2e_done
	sed 's/^/# /' "$LOG"
	vm_boot "$SCRATCH/initrd.gz" "$secs" -m "$mem"
	echo "# whole test: $(($(date +%s) - t0)) s"
	e2e_done
}
