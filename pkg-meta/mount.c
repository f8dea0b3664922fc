// SPDX-License-Identifier: MIT
/*
 * Kernel EROFS mounts. File-backed (Linux >= 6.12): the bootstrap is the
 * primary device and every blob an extra device= regular file. mount(2)
 * takes its options as one comma-separated page, so a long device list,
 * or a path with a comma in it, goes through fsopen/fsconfig, which passes
 * each device as its own string. Over fscache: no files at all, the
 * cachefiles daemon serves every blob by name.
 */
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../pkg-base/base.h"
#include "meta.h"

/* The new mount API; glibc before 2.36 has no constants for it. */
#ifndef FSOPEN_CLOEXEC
#define FSOPEN_CLOEXEC 0x00000001
#endif
#ifndef FSMOUNT_CLOEXEC
#define FSMOUNT_CLOEXEC 0x00000001
#endif
#ifndef FSCONFIG_SET_FLAG
#define FSCONFIG_SET_FLAG 0
#endif
#ifndef FSCONFIG_SET_STRING
#define FSCONFIG_SET_STRING 1
#endif
#ifndef FSCONFIG_CMD_CREATE
#define FSCONFIG_CMD_CREATE 6
#endif
#ifndef MOUNT_ATTR_RDONLY
#define MOUNT_ATTR_RDONLY 0x00000001
#define MOUNT_ATTR_NOSUID 0x00000002
#define MOUNT_ATTR_NODEV 0x00000004
#endif
#ifndef MOVE_MOUNT_F_EMPTY_PATH
#define MOVE_MOUNT_F_EMPTY_PATH 0x00000004
#define MOVE_MOUNT_T_EMPTY_PATH 0x00000040
#endif
#ifndef SYS_fsopen
#define SYS_fsopen 430
#define SYS_fsconfig 431
#define SYS_fsmount 432
#define SYS_move_mount 429
#endif

#define MOUNT_DATA_MAX 4095 /* mount(2) copies one page, NUL included */

struct mount_args {
	char *bootstrap;
	const char *fsid; /* over fscache: the primary blob's name, no source */
	char *target;
	char **devices;
	uint32_t nr_devices;
	char *opts; /* "device=A,device=B", NULL to use fsconfig */
	unsigned long flags; /* MS_NOSUID, MS_NODEV */
};

static void mount_args_free(struct mount_args *a)
{
	uint32_t i;

	for (i = 0; a->devices && i < a->nr_devices; i++)
		free(a->devices[i]);
	free(a->devices);
	free(a->bootstrap);
	free(a->target);
	free(a->opts);
}

/* Absolute, symlink-free path of an existing @what into *@out (logged). */
static int real_path(const char *path, const char *what, bool regular,
		     char **out)
{
	struct stat st;
	int ret;

	/* A descriptor of ours stays one: resolving it would reopen by name. */
	*out = !strncmp(path, "/proc/self/fd/", 14) ? strdup(path) :
						      realpath(path, NULL);
	if (!*out) {
		ret = -errno;
		ferry_err("mount: %s %s: %s", what, path, strerror(-ret));
		return ret;
	}
	if (regular && (stat(*out, &st) < 0 || !S_ISREG(st.st_mode))) {
		ferry_err("mount: %s %s is not a regular file (file-backed EROFS needs one)",
			  what, *out);
		return -EINVAL;
	}
	return 0;
}

/*
 * Join the device= options into a->opts; leave it NULL when mount(2)
 * cannot carry them (a comma inside a path, or more than a page).
 */
static int device_options(struct mount_args *a)
{
	size_t len = 0, off = 0;
	uint32_t i;

	for (i = 0; i < a->nr_devices; i++) {
		if (strchr(a->devices[i], ','))
			return 0;
		len += strlen(",device=") + strlen(a->devices[i]);
		if (len > MOUNT_DATA_MAX + 1)
			return 0;
	}
	a->opts = malloc(len + 1);
	if (!a->opts)
		return -ENOMEM;
	a->opts[0] = '\0';
	for (i = 0; i < a->nr_devices; i++)
		off += (size_t)sprintf(a->opts + off, "%sdevice=%s",
				       i ? "," : "", a->devices[i]);
	return 0;
}

static int prepare(struct mount_args *a, const char *bootstrap,
		   const char *const *devices, uint32_t nr_devices,
		   const char *target)
{
	uint32_t i;
	int ret;

	ret = real_path(bootstrap, "bootstrap", true, &a->bootstrap);
	if (ret)
		return ret;
	/* Canonical already: resolving it again would follow a swapped link. */
	if (target[0] != '/') {
		ferry_err("mount: target %s is not an absolute path", target);
		return -EINVAL;
	}
	a->target = strdup(target);
	if (!a->target)
		return -ENOMEM;
	a->devices = calloc(nr_devices ? nr_devices : 1, sizeof(*a->devices));
	if (!a->devices)
		return -ENOMEM;
	for (i = 0; i < nr_devices; i++) {
		a->nr_devices = i + 1;
		ret = real_path(devices[i], "device", true, &a->devices[i]);
		if (ret)
			return ret;
	}
	return device_options(a);
}

/* The kernel's own explanation from an fs context, if it left one. */
static void log_fs_messages(int fsfd, const char *bootstrap)
{
	char msg[512];
	ssize_t n;

	while ((n = read(fsfd, msg, sizeof(msg) - 1)) > 0) {
		msg[n] = '\0';
		ferry_err("mount: %s: kernel says: %s", bootstrap, msg);
	}
}

/* A detached mount of @a's image and devices in *@mfd (not yet attached). */
static int fsmount_erofs(const struct mount_args *a, int *mfd)
{
	unsigned int attr = MOUNT_ATTR_RDONLY |
			    (a->flags & MS_NOSUID ? MOUNT_ATTR_NOSUID : 0) |
			    (a->flags & MS_NODEV ? MOUNT_ATTR_NODEV : 0);
	int fsfd, ret = 0;
	uint32_t i;

	fsfd = (int)syscall(SYS_fsopen, "erofs", FSOPEN_CLOEXEC);
	if (fsfd < 0)
		return -errno;
	if (syscall(SYS_fsconfig, fsfd, FSCONFIG_SET_STRING,
		    a->fsid ? "fsid" : "source", a->fsid ? a->fsid : a->bootstrap,
		    0) < 0)
		goto fail;
	for (i = 0; i < a->nr_devices; i++)
		if (syscall(SYS_fsconfig, fsfd, FSCONFIG_SET_STRING, "device",
			    a->devices[i], 0) < 0)
			goto fail;
	if (syscall(SYS_fsconfig, fsfd, FSCONFIG_SET_FLAG, "ro", NULL, 0) < 0 ||
	    syscall(SYS_fsconfig, fsfd, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0)
		goto fail;
	*mfd = (int)syscall(SYS_fsmount, fsfd, FSMOUNT_CLOEXEC, attr);
	if (*mfd < 0)
		goto fail;
	goto out;
fail:
	ret = -errno;
	log_fs_messages(fsfd, a->fsid ? a->fsid : a->bootstrap);
out:
	close(fsfd);
	return ret;
}

static int mount_fsconfig(const struct mount_args *a)
{
	int mfd = -1, tfd = -1, ret = fsmount_erofs(a, &mfd);

	/* Onto the target resolved without links, as mount_nofollow. */
	if (!ret) {
		tfd = open_dir_nofollow(a->target);
		ret = tfd < 0 ? tfd : 0;
	}
	if (!ret && syscall(SYS_move_mount, mfd, "", tfd, "",
			    MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) < 0)
		ret = -errno;
	if (tfd >= 0)
		close(tfd);
	if (mfd >= 0)
		close(mfd);
	return ret;
}

int meta_kernel_mount_detached(const char *image, unsigned long flags,
			       int *mnt_fd)
{
	struct mount_args a = { .flags = flags & (MS_NOSUID | MS_NODEV) };
	int ret = real_path(image, "image", true, &a.bootstrap);

	*mnt_fd = -1;
	if (!ret)
		ret = fsmount_erofs(&a, mnt_fd);
	if (ret)
		ferry_err("mount: erofs %s: %s", image, strerror(-ret));
	mount_args_free(&a);
	return ret;
}

int meta_mount_attach(int mnt_fd, const char *target)
{
	if (syscall(SYS_move_mount, mnt_fd, "", AT_FDCWD, target,
		    MOVE_MOUNT_F_EMPTY_PATH) < 0) {
		int ret = -errno;

		ferry_err("mount: attaching on %s: %s", target, strerror(-ret));
		return ret;
	}
	return 0;
}

/* A likely cause for the common failures, to save a trip to dmesg. */
static const char *mount_hint(int err, const struct mount_args *a,
			      char *hint, size_t size)
{
	struct meta_image *img;
	struct meta_super sb;

	switch (err) {
	case -EINVAL:
		if (!meta_image_open(a->bootstrap, &img)) {
			meta_get_super(img, &sb);
			meta_image_close(img);
			if (sb.nr_devices != a->nr_devices) {
				snprintf(hint, size,
					 " (the bootstrap has %u devices, %u given)",
					 sb.nr_devices, a->nr_devices);
				return hint;
			}
		}
		return " (device count mismatch, a device that is not a regular file, or a bad image; see dmesg)";
	case -EPERM:
		return " (needs CAP_SYS_ADMIN in the initial user namespace)";
	case -ENODEV:
		return " (kernel without EROFS)";
	case -ENOTBLK:
		return " (kernel without file-backed EROFS: CONFIG_EROFS_FS_BACKED_BY_FILE, Linux >= 6.12)";
	case -EBADMSG:
		return " (superblock checksum mismatch)";
	case -EOPNOTSUPP:
		return " (image uses features this kernel lacks)";
	default:
		return "";
	}
}

int meta_kernel_mount(const char *bootstrap, const char *const *devices,
		      uint32_t nr_devices, const char *target,
		      unsigned long flags)
{
	struct mount_args a = { .flags = flags & (MS_NOSUID | MS_NODEV) };
	char hint[128];
	int ret;

	ret = prepare(&a, bootstrap, devices, nr_devices, target);
	if (ret)
		goto out;
	if (a.opts) {
		if (mount_nofollow(a.bootstrap, a.target, "erofs", MS_RDONLY | a.flags,
			  a.opts) < 0)
			ret = -errno;
	} else {
		ret = mount_fsconfig(&a);
	}
	if (ret)
		ferry_err("mount: erofs %s on %s with %u devices: %s%s",
			  a.bootstrap, a.target, a.nr_devices, strerror(-ret),
			  mount_hint(ret, &a, hint, sizeof(hint)));
out:
	mount_args_free(&a);
	return ret;
}

/* A token the kernel's option parser and the cache's file names carry as is. */
static bool fscache_id_ok(const char *s)
{
	size_t n = strlen(s);

	return n && n <= META_FSCACHE_ID_MAX &&
	       strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") == n;
}

/* Why an EROFS over fscache did not mount, most likely. */
static const char *fscache_hint(int err)
{
	switch (err) {
	case -EINVAL:
		return " (a kernel without EROFS over fscache: CONFIG_EROFS_FS_ONDEMAND; see dmesg)";
	case -ENOBUFS:
	case -EIO:
		return " (the cachefiles daemon refused the image or could not read its superblock; see its log and dmesg)";
	case -EEXIST:
	case -EBUSY:
		return " (this bootstrap is mounted already: mount it again only in a domain)";
	case -EOPNOTSUPP:
		return " (no cachefiles cache is bound)";
	case -EPERM:
		return " (needs CAP_SYS_ADMIN in the initial user namespace)";
	default:
		return "";
	}
}

static int fscache_ids_ok(const char *fsid, const char *domain)
{
	if (fscache_id_ok(fsid) && (!domain || fscache_id_ok(domain)))
		return 0;
	ferry_err("mount: fsid \"%s\" or domain \"%s\": expected 1..%u of A-Z a-z 0-9 . _ -",
		  fsid, domain ? domain : "", META_FSCACHE_ID_MAX);
	return -EINVAL;
}

int meta_kernel_mount_fscache(const char *fsid, const char *domain,
			      const char *target, unsigned long flags)
{
	char opts[2 * META_FSCACHE_ID_MAX + 32];
	int ret = fscache_ids_ok(fsid, domain);

	if (ret)
		return ret;
	snprintf(opts, sizeof(opts), "fsid=%s%s%s", fsid, domain ? ",domain_id=" : "",
		 domain ? domain : "");
	if (!mount_nofollow(fsid, target, "erofs", MS_RDONLY | flags, opts))
		return 0;
	ret = -errno;
	ferry_err("mount: erofs over fscache %s on %s: %s%s", opts, target, strerror(-ret),
		  fscache_hint(ret));
	return ret;
}

int meta_kernel_mount_fscache_detached(const char *fsid, unsigned long flags,
				       int *mnt_fd)
{
	struct mount_args a = { .fsid = fsid, .flags = flags & (MS_NOSUID | MS_NODEV) };
	int ret = fscache_ids_ok(fsid, NULL);

	*mnt_fd = -1;
	if (ret)
		return ret;
	ret = fsmount_erofs(&a, mnt_fd);
	/* EBUSY: a superblock of this fsid lives; the caller picks another. */
	if (ret && ret != -EBUSY)
		ferry_err("mount: erofs over fscache fsid=%s: %s%s", fsid, strerror(-ret),
			  fscache_hint(ret));
	return ret;
}

/* The kernel's mount-side view of a file system (Linux 6.8+). */
struct fs_sysfs_path_arg {
	uint8_t len;
	uint8_t name[128];
};
#ifndef FS_IOC_GETFSSYSFSPATH
#define FS_IOC_GETFSSYSFSPATH _IOR(0x15, 1, struct fs_sysfs_path_arg)
#endif

int meta_sysfs_path(const char *path, char *out, size_t len)
{
	struct fs_sysfs_path_arg p = { 0 };
	int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC), ret = 0;

	if (fd < 0)
		return -errno;
	if (ioctl(fd, FS_IOC_GETFSSYSFSPATH, &p))
		ret = -errno;
	else if (!p.len || p.len >= sizeof(p.name))
		ret = -EPROTO;
	else
		snprintf(out, len, "/sys/fs/%.*s", (int)p.len, (const char *)p.name);
	close(fd);
	return ret;
}
