// SPDX-License-Identifier: MIT
/*
 * FUSE mode: recording a workload's prefetch list (ferry mount --record).
 * Every file whose data lives in the blobs is written to the list the
 * first time it is read, one path per line in first-access order: the
 * list 'ferry convert --prefetch-files' embeds and mounts then fetch
 * first. FUSE operations name inodes, not paths, so the recorder walks the
 * image once at mount and keeps each such file's first path, sorted by
 * nid; only a mount that records pays for it. Lines are written as they
 * happen (O_APPEND), so the list is usable while the workload still runs.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fusefs.h"

/* Paths of more files than a prefetch list may hold are not recorded. */
#define RECORD_FILES_MAX IMAGE_PREFETCH_MAX_PATHS

struct rec_file {
	uint64_t nid;
	char *path;
	bool seen;
};

struct recorder {
	int fd;
	char *where;             /* the list's path, for messages */
	pthread_mutex_t lock;
	struct rec_file *files;  /* sorted by nid, one per inode */
	size_t nr, cap;
	uint64_t recorded;
	bool failed;             /* a write failed: said once */
};

static int collect(void *arg, const char *path, const struct meta_stat *st)
{
	struct recorder *r = arg;

	/* Inline files and holes need no fetch; a path with a newline
	 * cannot be a line of the list, nor one longer than it allows. */
	if (!S_ISREG(st->mode) || !st->nr_chunks || strchr(path, '\n') ||
	    strlen(path) > IMAGE_PREFETCH_PATH_MAX)
		return 0;
	if (array_reserve(&r->files, &r->cap, r->nr + 1, sizeof(*r->files), 256))
		return -ENOMEM;
	r->files[r->nr].path = strdup(path);
	if (!r->files[r->nr].path)
		return -ENOMEM;
	r->files[r->nr].nid = st->nid;
	r->files[r->nr++].seen = false;
	return 0;
}

static int by_nid(const void *a, const void *b)
{
	const struct rec_file *x = a, *y = b;

	return x->nid < y->nid ? -1 : x->nid > y->nid;
}

void record_free(struct recorder *r)
{
	size_t i;

	if (!r)
		return;
	for (i = 0; i < r->nr; i++)
		free(r->files[i].path);
	free(r->files);
	if (r->fd >= 0)
		close(r->fd);
	free(r->where);
	pthread_mutex_destroy(&r->lock);
	free(r);
}

int record_start(struct fs *fs, const char *path, struct recorder **out)
{
	struct recorder *r = calloc(1, sizeof(*r));
	size_t i, j;
	int ret;

	if (!r)
		return -ENOMEM;
	r->fd = -1;
	pthread_mutex_init(&r->lock, NULL);
	r->where = strdup(path);
	ret = r->where ? meta_walk(fs->img->meta, collect, r) : -ENOMEM;
	if (ret) {
		ferry_err("%s: --record: cannot list the image's files: %s", fs->img->ref,
			  ferry_strerror(ret));
		goto fail;
	}
	qsort(r->files, r->nr, sizeof(*r->files), by_nid);
	/* Hard links: the first path in walk order is the one kept. */
	for (i = 0, j = 0; i < r->nr; i++) {
		if (j && r->files[j - 1].nid == r->files[i].nid) {
			free(r->files[i].path);
			continue;
		}
		r->files[j++] = r->files[i];
	}
	r->nr = j;
	/* Root writes where root asked; never through a planted link. */
	r->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_NOFOLLOW | O_CLOEXEC,
		     0644);
	if (r->fd < 0) {
		ret = -errno;
		ferry_err("--record %s: %s", path, strerror(errno));
		goto fail;
	}
	*out = r;
	return 0;
fail:
	record_free(r);
	return ret;
}

void record_read(struct recorder *r, uint64_t nid)
{
	struct rec_file key = { .nid = nid }, *f;
	int ret;

	f = bsearch(&key, r->files, r->nr, sizeof(*r->files), by_nid);
	if (!f)
		return;
	pthread_mutex_lock(&r->lock);
	if (!f->seen && r->recorded < RECORD_FILES_MAX && !r->failed) {
		size_t len = strlen(f->path);

		f->seen = true;
		/* One write per line: a reader of the list never sees half. */
		f->path[len] = '\n';
		ret = write_full(r->fd, f->path, len + 1);
		f->path[len] = '\0';
		if (!ret)
			r->recorded++;
		else if (!r->failed)
			ferry_err("--record %s: %s; the list stops here", r->where,
				  ferry_strerror(ret));
		r->failed |= ret != 0;
	}
	pthread_mutex_unlock(&r->lock);
}

uint64_t record_count(struct recorder *r)
{
	uint64_t n;

	pthread_mutex_lock(&r->lock);
	n = r->recorded;
	pthread_mutex_unlock(&r->lock);
	return n;
}
