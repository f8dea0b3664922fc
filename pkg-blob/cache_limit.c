// SPDX-License-Identifier: MIT
/*
 * The chunk cache's size limit (blob_cache_enforce, for ferryd's
 * eviction): its usage, and what it gives back when over: whole blobs no
 * record names (gc), blobs nobody has open, then the least recently used
 * frames of blobs only this process has open (cache.c); the limits and
 * the bytes evicted recorded for ferry cache ls (DIR/limit.json).
 */
#include <dirent.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "../pkg-base/base.h"
#include "internal.h"

/* Eviction goes down to this share of the limit (in 1/16), not just under it. */
#define EVICT_LOW_16THS 15u

/* Allocated bytes of @path, 0 when it does not exist. */
uint64_t cache_disk_bytes(const char *path)
{
	struct stat st;

	if (lstat(path, &st))
		return 0;
	return (uint64_t)st.st_blocks * 512;
}

/* What ferryd said it keeps the cache within, if it did (lenient: advice only). */
int cache_read_limit(const char *cache_dir, struct blob_cache_list *out)
{
	struct json_object *o = NULL;
	char path[PATH_MAX], *text = NULL;
	uint64_t pct = 0;
	size_t len;
	int ret;

	if (cache_path_join(path, cache_dir, CACHE_LIMIT_FILE, ""))
		return -ENAMETOOLONG;
	ret = read_file_max(path, 4096, &text, &len);
	if (ret)
		return ret == -ENOENT ? 0 : ret;
	if (!json_parse_object(text, len, &o) &&
	    !json_read_u64(o, "maxSize", UINT64_MAX, &out->max_size, NULL, 0) &&
	    !json_read_u64(o, "minFreePct", 99, &pct, NULL, 0) &&
	    !json_read_u64(o, "evictedBytes", UINT64_MAX, &out->evicted, NULL, 0)) {
		out->min_free_pct = (unsigned int)pct;
		out->limited = true;
	} else {
		ferry_warn("chunk cache: %s is damaged; ignored", path);
	}
	json_object_put(o);
	free(text);
	return 0;
}

int blob_cache_record_limit(const char *cache_dir,
			    const struct blob_cache_limit *lim, uint64_t evicted)
{
	char buf[160];
	int n = snprintf(buf, sizeof(buf),
			 "{\"maxSize\":%llu,\"minFreePct\":%u,\"evictedBytes\":%llu}\n",
			 (unsigned long long)lim->max_size, lim->min_free_pct,
			 (unsigned long long)evicted);

	return write_file_atomic(cache_dir, CACHE_LIMIT_FILE, buf, (size_t)n, 0600);
}

/* Allocated bytes of every file in DIR/blobs/sha256. */
int cache_blobs_usage(const char *dir, uint64_t *bytes)
{
	struct dirent *de;
	struct stat st;
	DIR *d;
	int ret;

	*bytes = 0;
	ret = cache_open_dir(dir, &d);
	if (ret || !d)
		return ret;
	while ((errno = 0, de = readdir(d)))
		if (!fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) &&
		    S_ISREG(st.st_mode))
			*bytes += (uint64_t)st.st_blocks * 512;
	ret = errno ? -errno : 0;
	closedir(d);
	return ret;
}

/*
 * Drop every chunk of the blob @hex that no process has open (its map's
 * flock is free): marks cleared durably, then the data file punched
 * whole. Its records stay: a later mount fetches it again. Bytes freed.
 */
static uint64_t drop_idle(const char *dir, const char *hex)
{
	char map[PATH_MAX], data[PATH_MAX];
	uint8_t zeros[4096] = { 0 };
	uint64_t before, off;
	struct stat st;
	int mfd, dfd = -1, ret;

	if (cache_path_join(map, dir, hex, ".map") ||
	    cache_path_join(data, dir, hex, ".data"))
		return 0;
	mfd = open(map, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
	if (mfd < 0)
		return 0;
	if (cache_flock(mfd, LOCK_EX | LOCK_NB) || fstat(mfd, &st) ||
	    !st.st_nlink || (uint64_t)st.st_size < CACHE_MAP_HEADER_SIZE)
		goto out;
	dfd = open(data, O_WRONLY | O_NOFOLLOW | O_CLOEXEC);
	if (dfd < 0)
		goto out;
	before = cache_disk_bytes(data);
	if (!before)
		goto out;
	ret = 0;
	for (off = CACHE_MAP_HEADER_SIZE; !ret && off < (uint64_t)st.st_size;
	     off += sizeof(zeros))
		ret = pwrite_full(mfd, zeros,
				  (size_t)MIN((uint64_t)sizeof(zeros),
					      (uint64_t)st.st_size - off), off);
	if (ret || fdatasync(mfd) || fstat(dfd, &st) ||
	    fallocate(dfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0,
		      st.st_size)) {
		ferry_warn("chunk cache: cannot drop the chunks of %s: %s", data,
			   ferry_strerror(ret ? ret : -errno));
		goto out;
	}
	close(dfd);
	close(mfd);
	return before - MIN(before, cache_disk_bytes(data));
out:
	if (dfd >= 0)
		close(dfd);
	close(mfd);
	return 0;
}

struct idle_blob {
	char hex[CACHE_HEX_LEN + 1];
	time_t used; /* the map's mtime: its last fill */
};

static int idle_cmp(const void *a, const void *b)
{
	time_t x = ((const struct idle_blob *)a)->used;
	time_t y = ((const struct idle_blob *)b)->used;

	return x < y ? -1 : x > y;
}

static bool pinned_cb(void *arg, const uint8_t *digest)
{
	return cache_records_naming(arg, digest) > 0;
}

int blob_cache_enforce(const char *cache_dir, const struct blob_cache_limit *lim,
		       int (*prepare)(void *arg), void *arg,
		       struct blob_cache_enforce_report *r)
{
	char dir[PATH_MAX], path[PATH_MAX];
	struct cache_records pins = { 0 };
	struct cache_scan s = { 0 };
	struct idle_blob *idle = NULL;
	struct statvfs sv;
	uint64_t want = 0, floor;
	uint32_t i, nr_idle = 0;
	struct stat st;
	int ret;

	memset(r, 0, sizeof(*r));
	if (cache_path_join(dir, cache_dir, CACHE_BLOBS_DIR, ""))
		return -ENAMETOOLONG;
	ret = cache_blobs_usage(dir, &r->usage);
	if (ret)
		return ret;
	if (lim->max_size && r->usage > lim->max_size)
		want = r->usage - lim->max_size / 16 * EVICT_LOW_16THS;
	if (lim->min_free_pct && !statvfs(cache_dir, &sv)) {
		floor = (uint64_t)sv.f_blocks * sv.f_frsize / 100 *
			lim->min_free_pct;
		if ((uint64_t)sv.f_bavail * sv.f_frsize < floor)
			want = MAX(want, floor -
				   (uint64_t)sv.f_bavail * sv.f_frsize);
	}
	r->want = want;
	if (!want)
		return 0;
	ret = prepare ? prepare(arg) : 0;
	if (ret)
		return ret;
	/* Whole blobs no image uses, then blobs nobody has open, then LRU frames. */
	ret = blob_cache_gc(cache_dir, &r->freed_gc, NULL);
	if (ret || r->freed_gc >= want)
		return ret;
	want -= r->freed_gc;
	ret = cache_pins_read(cache_dir, &pins);
	if (!ret)
		ret = cache_scan_blobs(dir, &s);
	if (ret)
		goto out;
	idle = calloc(MAX(s.nr, 1u), sizeof(*idle));
	if (!idle) {
		ret = -ENOMEM;
		goto out;
	}
	for (i = 0; i < s.nr; i++) {
		if (!s.f[i].map || cache_records_naming(&pins, s.f[i].digest))
			continue;
		hex_encode(s.f[i].digest, BLOB_DIGEST_SIZE, idle[nr_idle].hex);
		if (cache_path_join(path, dir, idle[nr_idle].hex, ".map") ||
		    lstat(path, &st))
			continue;
		idle[nr_idle++].used = st.st_mtime;
	}
	if (nr_idle)
		qsort(idle, nr_idle, sizeof(*idle), idle_cmp);
	for (i = 0; i < nr_idle && r->freed_idle < want; i++)
		r->freed_idle += drop_idle(dir, idle[i].hex);
	if (r->freed_idle < want)
		ret = cache_evict_open(cache_dir, want - r->freed_idle,
				       pinned_cb, &pins, &r->freed_open);
out:
	free(idle);
	cache_scan_free(&s);
	cache_records_free(&pins);
	return ret;
}
