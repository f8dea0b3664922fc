// SPDX-License-Identifier: MIT
/*
 * Directories and files that appear whole: mkdir -p, and files written
 * under a unique temporary name and renamed into place once complete and
 * durable, so a reader or a crash never sees half a file.
 */
#include "base.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int mkdir_p(const char *path, mode_t mode)
{
	char *copy = strdup(path), *p;
	int ret = 0;

	if (!copy)
		return -ENOMEM;
	for (p = copy + 1;; p++) {
		if (*p != '/' && *p)
			continue;
		char saved = *p;

		*p = '\0';
		if (mkdir(copy, mode) && errno != EEXIST) {
			ret = -errno;
			ferry_err("%s: cannot create directory: %s", copy,
				  strerror(errno));
			break;
		}
		*p = saved;
		if (!saved)
			break;
	}
	free(copy);
	return ret;
}

int fsync_dir(const char *path)
{
	int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC), ret = 0;

	if (fd < 0 || fsync(fd))
		ret = -errno;
	if (fd >= 0)
		close(fd);
	if (ret)
		ferry_err("cannot sync the directory %s: %s", path, ferry_strerror(ret));
	return ret;
}

int atomic_file_create(struct atomic_file *af, const char *dir,
		       const char *name, mode_t mode)
{
	static unsigned int counter;
	int ret, tries;

	af->fd = -1;
	af->tmp[0] = '\0';
	af->unsynced = false;
	af->dir = dir;
	af->dir_fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (af->dir_fd < 0) {
		ret = -errno;
		ferry_err("%s: cannot open directory: %s", dir, strerror(errno));
		return ret;
	}
	/* O_EXCL: never through a planted link, never another writer's file. */
	for (tries = 0; tries < 100; tries++) {
		int n = snprintf(af->tmp, sizeof(af->tmp),
				 ATOMIC_TMP_PREFIX "%s.%ld.%u", name,
				 (long)getpid(),
				 __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED));

		if (n < 0 || (size_t)n >= sizeof(af->tmp)) {
			ret = -ENAMETOOLONG;
			break;
		}
		af->fd = openat(af->dir_fd, af->tmp,
				O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
				mode);
		ret = af->fd < 0 ? -errno : 0;
		if (ret != -EEXIST)
			break;
	}
	if (ret) {
		ferry_err("%s/%s: cannot create a temporary file: %s", dir,
			  name, ferry_strerror(ret));
		af->tmp[0] = '\0';
		atomic_file_discard(af);
	}
	return ret;
}

int atomic_file_commit(struct atomic_file *af, const char *name)
{
	int ret = 0;

	if (!af->unsynced && fsync(af->fd))
		ret = -errno;
	if (close(af->fd) && !ret)
		ret = -errno;
	af->fd = -1;
	if (!ret && renameat(af->dir_fd, af->tmp, af->dir_fd, name))
		ret = -errno;
	if (!ret) {
		af->tmp[0] = '\0';
		/* The rename is durable only once the directory is. */
		if (!af->unsynced && fsync(af->dir_fd))
			ret = -errno;
	}
	if (ret)
		ferry_err("%s/%s: cannot write: %s", af->dir, name,
			  ferry_strerror(ret));
	atomic_file_discard(af);
	return ret;
}

void atomic_file_discard(struct atomic_file *af)
{
	if (af->fd >= 0)
		close(af->fd);
	af->fd = -1;
	if (af->tmp[0])
		unlinkat(af->dir_fd, af->tmp, 0);
	af->tmp[0] = '\0';
	if (af->dir_fd >= 0)
		close(af->dir_fd);
	af->dir_fd = -1;
}

int write_file_atomic(const char *dir, const char *name, const void *data,
		      size_t len, mode_t mode)
{
	struct atomic_file af;
	int ret;

	ret = atomic_file_create(&af, dir, name, mode);
	if (ret)
		return ret;
	ret = write_full(af.fd, data, len);
	if (ret) {
		ferry_err("%s/%s: cannot write: %s", dir, name,
			  ferry_strerror(ret));
		atomic_file_discard(&af);
		return ret;
	}
	return atomic_file_commit(&af, name);
}

int proc_holder(const char *path_held, char *comm, size_t len)
{
	char path[64], link[PATH_MAX];
	struct dirent *p, *f;
	DIR *proc = opendir("/proc"), *fds;
	FILE *fp;
	int pid = 0;
	ssize_t n;

	while (proc && !pid && (p = readdir(proc))) {
		if (p->d_name[0] < '1' || p->d_name[0] > '9' || strlen(p->d_name) > 16)
			continue;
		snprintf(path, sizeof(path), "/proc/%s/fd", p->d_name);
		fds = opendir(path);
		while (fds && !pid && (f = readdir(fds))) {
			n = readlinkat(dirfd(fds), f->d_name, link, sizeof(link) - 1);
			if (n > 0 && (link[n] = '\0', !strcmp(link, path_held)))
				pid = atoi(p->d_name);
		}
		if (fds)
			closedir(fds);
	}
	if (proc)
		closedir(proc);
	snprintf(comm, len, "?");
	snprintf(path, sizeof(path), "/proc/%d/comm", pid);
	fp = pid ? fopen(path, "re") : NULL;
	if (fp) {
		if (fgets(comm, (int)len, fp))
			comm[strcspn(comm, "\n")] = '\0';
		fclose(fp);
	}
	return pid;
}
