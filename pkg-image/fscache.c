// SPDX-License-Identifier: MIT
/*
 * The cachefiles mode's kernel cache under the chunk cache directory: its
 * usage for ferry cache ls and its gc (image.h). Only an unbound cache is
 * changed: while /dev/cachefiles is open the kernel owns the files (it
 * marks those in use and culls the rest itself when space runs short).
 * The same walk collects the registry documents and bootstraps image_open
 * keeps in the cache (image_meta_gc).
 */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#define FSCACHE_CACHE IMAGE_FSCACHE_DIR "/cache"
#define FSCACHE_GRAVEYARD IMAGE_FSCACHE_DIR "/graveyard"
#define WALK_DEPTH 4 /* cache/I<volume>/@<hash>/D<cookie> */
/* Kept documents younger than this stay: a mount writes them before its record. */
#define META_GC_AGE_S 60

struct walk {
	bool gc;           /* remove what is not kept (else count only) */
	bool all;          /* keep nothing (the graveyard) */
	const char *prefix; /* a kept file is named prefix + the hex of keep[i] */
	const uint8_t (*keep)[BLOB_DIGEST_SIZE];
	uint32_t nr_keep;
	time_t changed_before; /* gc: files changed since then stay (0: none) */
	uint64_t files, bytes;
	int err;
};

static int digest_cmp(const void *a, const void *b)
{
	return memcmp(a, b, BLOB_DIGEST_SIZE);
}

/* A file kept by gc: the prefix + the hex of a digest still named. */
static bool kept(const struct walk *w, const char *name, const struct stat *st)
{
	size_t n = strlen(w->prefix);
	uint8_t d[BLOB_DIGEST_SIZE];

	if (w->changed_before && st->st_mtime >= w->changed_before)
		return true;
	return !w->all && w->nr_keep && !strncmp(name, w->prefix, n) &&
	       strlen(name + n) == 2 * BLOB_DIGEST_SIZE &&
	       !hex_decode(name + n, d, sizeof(d)) &&
	       bsearch(d, w->keep, w->nr_keep, BLOB_DIGEST_SIZE, digest_cmp);
}

/* Count (or, with a keep list, remove) below the directory @fd; closes @fd. */
static void walk_dir(struct walk *w, int fd, const char *path, unsigned int depth)
{
	DIR *d = fdopendir(fd);
	struct dirent *de;
	struct stat st;

	if (!d) {
		close(fd);
		w->err = w->err ? w->err : -errno;
		return;
	}
	while ((de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW))
			continue; /* gone meanwhile */
		if (S_ISDIR(st.st_mode)) {
			int sub = depth < WALK_DEPTH ?
				  openat(dirfd(d), de->d_name,
					 O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) : -1;

			if (sub >= 0)
				walk_dir(w, sub, path, depth + 1);
			/* Emptied (or empty) directories below cache/: not needed. */
			if (w->gc && unlinkat(dirfd(d), de->d_name, AT_REMOVEDIR) &&
			    errno != ENOTEMPTY && errno != EEXIST && errno != ENOENT)
				ferry_warn("%s: removing directory %s: %s", path, de->d_name,
					   strerror(errno));
			continue;
		}
		if (w->gc && !kept(w, de->d_name, &st)) {
			if (unlinkat(dirfd(d), de->d_name, 0)) {
				if (errno != ENOENT)
					ferry_warn("%s: removing %s: %s", path, de->d_name,
						   strerror(errno));
				continue;
			}
		} else if (w->gc) {
			continue; /* kept: gc counts what it removes */
		}
		w->files++;
		w->bytes += (uint64_t)st.st_blocks * 512;
	}
	closedir(d);
}

/* Walk @cache_dir/@sub: 0 when it is not there. */
static int walk(const char *cache_dir, const char *sub, struct walk *w)
{
	char path[PATH_MAX];
	int n = snprintf(path, sizeof(path), "%s/%s", cache_dir, sub);
	int fd;

	if (n < 0 || (size_t)n >= sizeof(path))
		return -ENAMETOOLONG;
	fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? 0 : -errno;
	walk_dir(w, fd, path, 0);
	if (w->err)
		ferry_err("%s: %s", path, ferry_strerror(w->err));
	return w->err;
}

static void holder(struct image_fscache_usage *u)
{
	u->holder = proc_holder(IMAGE_CACHEFILES_DEVICE, u->holder_comm, sizeof(u->holder_comm));
}

int image_fscache_usage(const char *cache_dir, struct image_fscache_usage *u)
{
	struct walk w = { 0 };
	int ret = walk(cache_dir, FSCACHE_CACHE, &w);

	memset(u, 0, sizeof(*u));
	if (!ret)
		ret = walk(cache_dir, FSCACHE_GRAVEYARD, &w);
	u->files = w.files;
	u->disk_bytes = w.bytes;
	holder(u);
	return ret;
}

int image_fscache_gc(const char *cache_dir, uint64_t *freed, uint32_t *removed,
		     struct image_fscache_usage *u)
{
	uint8_t (*named)[BLOB_DIGEST_SIZE] = NULL;
	struct walk w = { .gc = true, .prefix = "D" };
	uint32_t nr = 0;
	int ret;

	memset(u, 0, sizeof(*u));
	*freed = 0;
	*removed = 0;
	holder(u);
	if (u->holder)
		return 0;
	ret = blob_cache_named(cache_dir, &named, &nr);
	if (ret)
		return ret;
	w.keep = (const uint8_t (*)[BLOB_DIGEST_SIZE])named;
	w.nr_keep = nr;
	ret = walk(cache_dir, FSCACHE_CACHE, &w);
	w.all = true;
	if (!ret)
		ret = walk(cache_dir, FSCACHE_GRAVEYARD, &w);
	*freed = w.bytes;
	*removed = (uint32_t)MIN(w.files, (uint64_t)UINT32_MAX);
	free(named);
	return ret;
}

int image_meta_gc(const char *cache_dir, uint64_t *freed, uint32_t *removed)
{
	static const char *const subs[] = { IMAGE_META_DIR, IMAGE_BOOTSTRAPS_DIR };
	uint8_t (*kept_digests)[BLOB_DIGEST_SIZE] = NULL;
	struct walk w = {
		.gc = true,
		.prefix = "",
		.changed_before = time(NULL) - META_GC_AGE_S,
	};
	uint32_t nr = 0;
	size_t i;
	int ret;

	ret = blob_cache_kept(cache_dir, &kept_digests, &nr);
	w.keep = (const uint8_t (*)[BLOB_DIGEST_SIZE])kept_digests;
	w.nr_keep = nr;
	for (i = 0; !ret && i < ARRAY_SIZE(subs); i++)
		ret = walk(cache_dir, subs[i], &w);
	if (freed)
		*freed = w.bytes;
	if (removed)
		*removed = (uint32_t)MIN(w.files, (uint64_t)UINT32_MAX);
	free(kept_digests);
	return ret;
}
