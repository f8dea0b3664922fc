#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Issue 14, finding 2 and the fanotify mount's sources, as an attacker
# would try them: the image's author ships a setuid-root binary (a copy of
# id) and a world-readable character device (/dev/null's numbers) and
# waits for a local user to run them from the mount.
#   - every mode (local, fuse, fanotify) mounts nosuid,nodev by default:
#     /proc/mounts says so, nobody running the setuid binary stays nobody,
#     the device node cannot be opened; ferry mount --list (and --json)
#     shows it;
#   - --suid --dev opt in: the flags are absent, the setuid binary runs as
#     root, the device opens (what the defaults prevent);
#   - a fanotify mount names the descriptors ferryd verified and holds
#     (/proc/self/fd/N), never a cache path, as --mode local does;
#   - finding 10: a fanotify keeper dies on a plain SIGTERM (it starts with
#     no signal blocked), ferryd starts a new one and reads go on.
. "$(dirname "$0")/../lib/common.sh"
. "$(dirname "$0")/../lib/lazy.sh"

need_ferryd
need_cmds runuser python3 mknod

# nobody reaches the mount points, nothing else.
chmod 711 "$SCRATCH"

SRC=$SCRATCH/src
mkdir -p "$SRC"
cp /usr/bin/id "$SRC/id"
chown root:root "$SRC/id"
chmod 4755 "$SRC/id"
mknod -m 0666 "$SRC/null" c 1 3
head -c $((2 << 20)) /dev/urandom >"$SRC/data"
chmod 0644 "$SRC/data"
OUT=$SCRATCH/img
check "convert the image (setuid-root id, a char device, data)" \
	"$FERRY" convert -q "dir:$SRC" "dir:$OUT" || e2e_done

mount_opts() { # MNT: the options field of its /proc/mounts line
	awk -v m="$1" '$2 == m { print $4 }' /proc/mounts | tail -n 1
}
has_opt() { # MNT OPT
	case ,$(mount_opts "$1"), in *",$2,"*) return 0 ;; esac
	return 1
}
nobody_euid() { # MNT: the effective uid the setuid binary gives nobody
	runuser -u nobody -- "$1/id" -u 2>&1
}

mount_mode() { # MODE MNT [ARGS]
	local mode=$1
	shift
	if [ "$mode" = local ]; then
		mount_local "dir:$OUT" "$@"
	else
		mount_lazy "$mode" "dir:$OUT" "$@"
	fi
}
umount_mode() { # MODE MNT
	if [ "$1" = local ]; then umount_local "$2"; else umount_lazy "$2"; fi
}

lazy_use mount
for mode in local fuse fanotify; do
	M=$SCRATCH/m-$mode
	check "$mode: default mount of the image" mount_mode "$mode" "$M" || continue
	opts=$(mount_opts "$M")
	expect "$mode: /proc/mounts shows nosuid,nodev ($opts)" \
		eval 'has_opt "$M" nosuid && has_opt "$M" nodev'
	u=$(nobody_euid "$M")
	expect "$mode: nobody running the setuid-root binary stays nobody (euid $u)" \
		test "$u" = "$(id -u nobody)"
	expect "$mode: the device node cannot be opened, not even by root" \
		sh -c "! head -c 1 '$M/null' 2>/dev/null"
	check "$mode: its data reads right" cmp "$SRC/data" "$M/data"
	if [ "$mode" = fanotify ]; then
		src=$(awk -v m="$M" '$2 == m { print $1 }' /proc/mounts | tail -n 1)
		expect "fanotify: the mount's source is ferryd's verified bootstrap descriptor ($src)" \
			eval '[[ $src == /proc/self/fd/[0-9]* ]]'
	fi
	if [ "$mode" != local ]; then
		s=$(mount_field "$M" suid)/$(mount_field "$M" dev)
		expect "$mode: ferry mount --list --json says suid false, dev false ($s)" \
			test "$s" = false/false
		expect "$mode: ferry mount --list shows nosuid,nodev" \
			sh -c "'$FERRY' mount --list --socket '$FSOCK' '$M' | grep -q ' nosuid,nodev '"
	fi
	check "$mode: umount" umount_mode "$mode" "$M"

	check "$mode: mount with --suid --dev (a trusted image)" \
		mount_mode "$mode" "$M" --suid --dev || continue
	opts=$(mount_opts "$M")
	expect "$mode: --suid --dev: neither nosuid nor nodev ($opts)" \
		eval '! has_opt "$M" nosuid && ! has_opt "$M" nodev'
	u=$(nobody_euid "$M")
	expect "$mode: --suid: the setuid-root binary runs as root for nobody (euid $u)" \
		test "$u" = 0
	check "$mode: --dev: the device node opens" head -c 1 "$M/null"
	if [ "$mode" != local ]; then
		s=$(mount_field "$M" suid)/$(mount_field "$M" dev)
		expect "$mode: ferry mount --list --json says suid true, dev true ($s)" \
			test "$s" = true/true
	fi
	check "$mode: umount" umount_mode "$mode" "$M"
done

# --- finding 10: a keeper dies on a plain SIGTERM --------------------------
lazy_use keeper
M=$SCRATCH/m-keeper
if check "fanotify mount (its keeper to be terminated)" mount_lazy fanotify "dir:$OUT" "$M"; then
	kpid=$(keeper_pid "$M" 2>&1)
	if ! is_keeper "$kpid"; then
		notok "find the keeper ($kpid)"
	else
		blocked=$(awk '/^SigBlk:/ { print $2 }' "/proc/$kpid/status")
		expect "the keeper $kpid blocks no signal (SigBlk $blocked)" \
			test "$blocked" = 0000000000000000
		kill -TERM "$kpid"
		expect "the keeper $kpid is gone within 5 s of SIGTERM" wait_gone 5 "$kpid"
		NEW_KEEPER=
		poll 10 keeper_replaced "$M" "$kpid"
		expect "ferryd started a new keeper (${NEW_KEEPER:-none})" keeper_replaced "$M" "$kpid"
		check "the mount still reads right" cmp "$SRC/data" "$M/data"
	fi
	check "umount" umount_lazy "$M"
fi

e2e_done
