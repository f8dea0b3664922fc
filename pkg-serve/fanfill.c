// SPDX-License-Identifier: MIT
/*
 * What the fanotify mode (fanotify.c) and the fanotify keeper
 * (ferryd-keeper) both need of an event: its range, and whether the
 * process behind it is one of ferry's fills (fanotify.h).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../pkg-base/base.h"
#include "keeper.h"
#include "fanotify.h"

void ferry_exes_find(struct ferry_exes *e)
{
	static const char *const names[] = { "ferryd", "ferry" };
	char path[PATH_MAX];
	struct stat st;
	size_t i;

	memset(e, 0, sizeof(*e));
	/* Our own binary even if it was replaced on disk since. */
	if (!stat("/proc/self/exe", &st)) {
		e->dev[0] = st.st_dev;
		e->ino[0] = st.st_ino;
	}
	for (i = 0; i < ARRAY_SIZE(names); i++) {
		if (!sibling_exe(names[i], path, sizeof(path)) && !stat(path, &st)) {
			e->dev[i + 1] = st.st_dev;
			e->ino[i + 1] = st.st_ino;
		}
	}
}

/* Every uid of the process in /proc/PID (@proc) is 0. */
static bool proc_is_root(int proc)
{
	char buf[2048], *l;
	unsigned int u[4];
	ssize_t n;
	int fd = openat(proc, "status", O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return false;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return false;
	buf[n] = '\0';
	l = strstr(buf, "\nUid:");
	return l && sscanf(l + 5, "%u %u %u %u", &u[0], &u[1], &u[2], &u[3]) == 4 &&
	       !(u[0] | u[1] | u[2] | u[3]);
}

/* The process holds a descriptor of @st's file open for writing. */
static bool proc_writes(int proc, const struct stat *st)
{
	char name[300], buf[512];
	struct dirent *d;
	struct stat fst;
	unsigned int flags;
	bool found = false;
	DIR *dir;
	int dfd = openat(proc, "fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	if (dfd < 0 || !(dir = fdopendir(dfd))) {
		if (dfd >= 0)
			close(dfd);
		return false;
	}
	while (!found && (d = readdir(dir))) {
		ssize_t n;
		char *f;
		int fd;

		if (d->d_name[0] == '.' || fstatat(dfd, d->d_name, &fst, 0) ||
		    fst.st_ino != st->st_ino || fst.st_dev != st->st_dev)
			continue;
		snprintf(name, sizeof(name), "fdinfo/%s", d->d_name);
		fd = openat(proc, name, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			continue;
		n = read(fd, buf, sizeof(buf) - 1);
		close(fd);
		if (n <= 0)
			continue;
		buf[n] = '\0';
		f = strstr(buf, "flags:");
		found = f && sscanf(f + 6, "%o", &flags) == 1 &&
			(flags & O_ACCMODE) != O_RDONLY;
	}
	closedir(dir);
	return found;
}

bool fan_fill_process(const struct ferry_exes *e, pid_t pid, int fd)
{
	char path[64];
	struct stat st, data;
	bool ok = false;
	int proc, i;

	snprintf(path, sizeof(path), "/proc/%d", (int)pid);
	proc = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (proc < 0)
		return false;
	if (fstatat(proc, "exe", &st, 0) || fstat(fd, &data))
		goto out;
	for (i = 0; i < FERRY_EXES && !ok; i++)
		ok = e->ino[i] && st.st_ino == e->ino[i] && st.st_dev == e->dev[i];
	ok = ok && proc_is_root(proc) && proc_writes(proc, &data);
out:
	close(proc);
	return ok;
}

int fan_event_range(const struct fanotify_event_metadata *meta, uint64_t *off,
		    uint64_t *count)
{
	size_t pos = meta->metadata_len;

	while (pos + sizeof(struct fanotify_event_info_header) <= meta->event_len) {
		const struct fanotify_event_info_header *h =
			(const void *)((const char *)meta + pos);

		if (h->len < sizeof(*h) || h->len > meta->event_len - pos)
			break;
		if (h->info_type == FAN_EVENT_INFO_TYPE_RANGE &&
		    h->len >= sizeof(struct fanotify_event_info_range)) {
			const struct fanotify_event_info_range *r = (const void *)h;

			*off = r->offset;
			*count = r->count;
			return 0;
		}
		pos += h->len;
	}
	return -ENOENT;
}


void fan_event_span(const struct fanotify_event_metadata *meta, uint64_t size,
		    uint64_t *off, uint64_t *len)
{
	if (fan_event_range(meta, off, len)) {
		*off = 0;
		*len = size;
	}
	*off = MIN(*off, size);
	*len = MIN(*len, size - *off);
}
