#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Permission checks for other users are the same through every mount mode
# (local and fanotify: the kernel's EROFS; fuse: ferryd with the kernel's
# default_permissions): POSIX ACLs in an image grant and deny as they do on
# the source tree, and in an image without ACLs (where ferryd does not ask
# the kernel for ACL support) mode bits alone decide.
. "$(dirname "$0")/../lib/common.sh"
. "$(dirname "$0")/../lib/oci.sh"
. "$(dirname "$0")/../lib/registry.sh"
. "$(dirname "$0")/../lib/lazy.sh"
need_ferryd
need_cmds setpriv getfacl

# as UID CMD...: run CMD as UID (same gid, no supplementary groups).
as() {
	local uid=$1
	shift
	setpriv --reuid="$uid" --regid="$uid" --clear-groups "$@" </dev/null >/dev/null 2>&1
}
denied() { ! as "$@"; } # UID CMD...

# Other users must reach the trees and mount points.
chmod 0755 "$SCRATCH"
# The fixture's xattr/acl (0640, root) grants uid 1000 read and uid 70000
# read-write; xattr/acl_dir (0750) lets uid 1000 list it.
make_fixture "$SCRATCH/acl"
chmod 0755 "$SCRATCH/acl" "$SCRATCH/acl/xattr"
# No ACL anywhere: a private file, a public one, a private directory.
NOACL=$SCRATCH/noacl
mkdir -p "$NOACL/private_dir"
echo secret >"$NOACL/private"
echo public >"$NOACL/public"
chmod 0600 "$NOACL/private"
chmod 0644 "$NOACL/public"
chmod 0700 "$NOACL/private_dir"
chmod 0755 "$NOACL"
check "convert the fixture (with ACLs)" "$FERRY" convert -q "dir:$SCRATCH/acl" "dir:$SCRATCH/img-acl"
check "convert a tree without ACLs" "$FERRY" convert -q "dir:$NOACL" "dir:$SCRATCH/img-noacl"

# expect_access MNT: the same answers as the source trees.
expect_access() { # DESC MNT IMG
	local desc=$1 m=$2 img=$3
	if [ "$img" = acl ]; then
		expect "$desc: uid 1000 reads xattr/acl (ACL user entry)" as 1000 cat "$m/xattr/acl"
		expect "$desc: uid 1001 is denied xattr/acl" denied 1001 cat "$m/xattr/acl"
		expect "$desc: uid 1000 lists xattr/acl_dir (ACL)" as 1000 ls "$m/xattr/acl_dir"
		expect "$desc: uid 1001 cannot list xattr/acl_dir" denied 1001 ls "$m/xattr/acl_dir"
		expect "$desc: getfacl shows the source's ACL" \
			[ "$(cd "$m" && getfacl -n xattr/acl 2>&1)" = "$(cd "$SCRATCH/acl" && getfacl -n xattr/acl 2>&1)" ]
	else
		expect "$desc: uid 1001 reads a 0644 file" as 1001 cat "$m/public"
		expect "$desc: uid 1001 is denied a 0600 file" denied 1001 cat "$m/private"
		expect "$desc: uid 1001 cannot list a 0700 directory" denied 1001 ls "$m/private_dir"
	fi
}

# The source trees answer as the mounts must (this proves the checks can fail).
expect_access "source tree" "$SCRATCH/acl" acl
expect_access "source tree" "$NOACL" noacl

lazy_use acl
mkdir -p "$SCRATCH/mnt"
for img in acl noacl; do
	for mode in local fuse fanotify; do
		if [ "$mode" = local ]; then
			mnt() { mount_local "$@" --cache-dir "$FCACHE"; }
		else
			mnt() { mount_lazy "$mode" "$@"; }
		fi
		if check "mount --mode $mode (image $img)" mnt "dir:$SCRATCH/img-$img" "$SCRATCH/mnt"; then
			expect_access "$mode, image $img" "$SCRATCH/mnt" "$img"
			check "umount ($mode, image $img)" umount_lazy "$SCRATCH/mnt"
		fi
	done
done
e2e_done
