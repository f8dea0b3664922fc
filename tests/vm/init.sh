#!/bin/sh
# SPDX-License-Identifier: MIT
# The VM guest's /init (busybox sh), packed by tests/vm/mkinitramfs.sh.
#
# Mounts proc, sys, devtmpfs; sets the clock from ferry.epoch=; brings up
# lo; loop-mounts the ext4 cache image /vm/cache.ext4 on /cache; runs the
# test driver /vm/driver.sh (killed after ferry.timeout= seconds); prints
# "== VM DONE rc=N" and ends with `reboot -f`, which QEMU's -no-reboot turns
# into an exit (`poweroff -f` only halts: there is no ACPI).
#
# Result lines ("ok - ...", "not ok - ...", indented diagnostics) go to
# $VM_RESULTS, the second serial port, which the host keeps apart from the
# console log (kernel messages can split console lines). See lib.sh.
PATH=/usr/sbin:/usr/bin:/sbin:/bin
export PATH
umask 022

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/shm /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm

VM_RESULTS=/dev/ttyS1
if [ -c "$VM_RESULTS" ]; then
	stty -F "$VM_RESULTS" raw -echo 2>/dev/null
else
	VM_RESULTS=/dev/console
fi
export VM_RESULTS

vm_timeout=150
# shellcheck disable=SC2013 # words, not lines
for w in $(cat /proc/cmdline); do
	case $w in
	ferry.epoch=*) date -s "@${w#*=}" >/dev/null ;;
	ferry.timeout=*) vm_timeout=${w#*=} ;;
	esac
done

boot_fail() {
	echo "not ok - boot: $*" | tee "$VM_RESULTS"
}

echo "== VM init: $(uname -r), uptime $(cut -d' ' -f1 /proc/uptime) s"
ip link set lo up 2>/dev/null || ifconfig lo 127.0.0.1 up ||
	boot_fail "loopback interface up"

export VM_CACHE=/cache VM_PAYLOAD=/payload VM_LIB=/vm/lib.sh
if [ -e /vm/cache.ext4 ]; then
	mount -t ext4 -o loop /vm/cache.ext4 /cache ||
		boot_fail "mount the ext4 cache image on /cache"
fi

rc=0
if [ -e /vm/driver.sh ]; then
	echo "== VM driver start (timeout ${vm_timeout} s)"
	cd / && timeout -s KILL "$vm_timeout" /bin/sh /vm/driver.sh </dev/null
	rc=$?
	[ "$rc" -eq 137 ] && boot_fail "test driver killed after ${vm_timeout} s"
else
	boot_fail "no /vm/driver.sh"
	rc=1
fi

sync
grep -q ' /cache ' /proc/mounts && umount /cache
echo "== VM DONE rc=$rc uptime $(cut -d' ' -f1 /proc/uptime) s" | tee "$VM_RESULTS"
reboot -f
# Not reached; if it were, the host's timeout ends QEMU.
sleep 3600
