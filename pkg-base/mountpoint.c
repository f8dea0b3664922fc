// SPDX-License-Identifier: MIT
/*
 * mount(2) and umount2(2) onto a mount point named by its canonical path
 * (realpath's, taken when the request was checked), resolved again at the
 * moment of the call without following any symbolic link. Between the
 * check and the call (an image opened, fetched, validated: seconds) a user
 * who owns a directory on the path could swap it for a link to a
 * directory of root's; by path, the mount would land there. Here such a
 * swap fails with ELOOP, and the mount lands on the directory the path
 * names without links, through its descriptor (/proc/self/fd/N).
 */
#include "base.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef UMOUNT_NOFOLLOW
#define UMOUNT_NOFOLLOW 0x8
#endif

int open_dir_nofollow(const char *path)
{
	struct open_how how = {
		.flags = O_PATH | O_DIRECTORY | O_CLOEXEC,
		.resolve = RESOLVE_NO_SYMLINKS,
	};
	int fd = (int)syscall(SYS_openat2, AT_FDCWD, path, &how, sizeof(how));

	return fd < 0 ? -errno : fd;
}

int mount_nofollow(const char *source, const char *target, const char *fstype,
		   unsigned long flags, const void *data)
{
	char fdpath[32];
	int fd = open_dir_nofollow(target), ret, e;

	if (fd < 0) {
		errno = -fd;
		return -1;
	}
	snprintf(fdpath, sizeof(fdpath), "/proc/self/fd/%d", fd);
	ret = mount(source, fdpath, fstype, flags, data);
	e = errno;
	close(fd);
	errno = e;
	return ret;
}

int umount_nofollow(const char *target, int flags)
{
	char *dir, *slash, *path = NULL;
	int fd, ret = -1, e;

	dir = strdup(target);
	slash = dir ? strrchr(dir, '/') : NULL;
	if (!slash || !slash[1] || target[0] != '/') {
		free(dir);
		errno = dir ? EINVAL : ENOMEM;
		return -1;
	}
	*slash = '\0';
	/* The parent only: the mount point itself may be a dead FUSE mount. */
	fd = open_dir_nofollow(slash == dir ? "/" : dir);
	if (fd < 0) {
		e = -fd;
	} else if (asprintf(&path, "/proc/self/fd/%d/%s", fd, slash + 1) < 0) {
		e = ENOMEM;
	} else {
		ret = umount2(path, flags | UMOUNT_NOFOLLOW);
		e = errno;
	}
	if (fd >= 0)
		close(fd);
	free(path);
	free(dir);
	errno = e;
	return ret;
}
