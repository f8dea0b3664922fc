// SPDX-License-Identifier: MIT
/*
 * Eviction of the frames of blobs this process has open (cache_evict_open,
 * for blob_cache_enforce in cache_limit.c), at frame granularity, least
 * recently used first: marks cleared in memory under the readers lock in
 * write mode, then in the map (fdatasync'ed), and only then the slots
 * punched, so that a crash leaves every chunk either marked over its
 * verified bytes or unmarked (cache.c says how the locks nest).
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../pkg-base/base.h"
#include "internal.h"

/*
 * Frames younger than this stay: a reader that found them present may
 * still be reading. The kernel reads a fanotify mount's data files after
 * ferryd allowed the range, holding no lock of ours, so there the age
 * alone covers the gap between the answer and the read.
 */
#define EVICT_MIN_AGE_MS 100u
#define EVICT_KERNEL_AGE_MS 250u

void blob_cache_kernel_reads(struct blob_cache_blob *b)
{
	__atomic_store_n(&b->kernel_reads, true, __ATOMIC_RELAXED);
}

static uint32_t min_age(const struct blob_cache_blob *b)
{
	return __atomic_load_n(&b->kernel_reads, __ATOMIC_RELAXED) ?
	       EVICT_KERNEL_AGE_MS : EVICT_MIN_AGE_MS;
}

/* Used within min_age of @now (a stamp after @now counts as recent)? */
static bool frame_recent(const struct blob_cache_blob *b, uint32_t fr,
			 uint32_t now)
{
	int32_t age = (int32_t)(now - __atomic_load_n(&b->stamp[fr],
						      __ATOMIC_RELAXED));

	return age < (int32_t)min_age(b);
}

/*
 * Give frame @fr its marks back from the map (which eviction has not
 * touched yet): the map marks only chunks whose bytes are in place.
 */
static void restore_marks(struct blob_cache_blob *b, uint32_t fr)
{
	uint32_t c, first = b->frames[fr].first;
	uint8_t mark;

	for (c = first; c < first + b->frames[fr].count; c++)
		if (!pread_full(b->map_fd, &mark, 1,
				CACHE_MAP_HEADER_SIZE + (uint64_t)c) &&
		    mark == CACHE_STATE_PRESENT)
			cache_set_present(b, c);
}

/*
 * Evict frames @fr[0..@n) of @b: take them from readers and fillers, clear
 * their marks durably, then punch their slots out of the data file.
 * Adds the uncompressed bytes dropped to *@freed. Caller holds
 * cache_registry_lock, so no opener of this process loads marks meanwhile.
 */
static int evict_blob(struct blob_cache_blob *b, uint32_t *fr, uint32_t n,
		      uint64_t *freed)
{
	uint8_t zeros[4096] = { 0 };
	uint32_t now, i, k = 0, c, locked = 0;
	uint64_t bytes = 0, start, len;
	int ret, err = 0;

	/* Another process holding the blob keeps marks of its own. */
	ret = cache_users_lock(b->map_fd, F_WRLCK, false);
	if (ret == -EAGAIN || ret == -EACCES) {
		ferry_dbg("chunk cache: blob sha256:%s is open in another process: not evicted",
			  b->hex);
		return 0;
	}
	if (ret)
		goto out_lock;
	cache_readers_exclude();
	pthread_mutex_lock(&b->lock);
	for (i = 0; i < n; i++) {
		uint64_t got = 0;

		if (b->inflight[fr[i]])
			continue;
		for (c = b->frames[fr[i]].first;
		     c < b->frames[fr[i]].first + b->frames[fr[i]].count; c++)
			got += cache_set_missing(b, c);
		__atomic_thread_fence(__ATOMIC_SEQ_CST);
		now = cache_clock_ms();
		if (got && frame_recent(b, fr[i], now)) {
			/* Used meanwhile (touch_frames): its bytes stay. */
			restore_marks(b, fr[i]);
			continue;
		}
		if (!got)
			continue;
		b->inflight[fr[i]] = 1;
		fr[k++] = fr[i];
		bytes += got;
	}
	pthread_mutex_unlock(&b->lock);
	blob_cache_read_end();

	/*
	 * Marks first, durably: a crash then leaves bytes without a mark.
	 * Under the fillers' OFD locks over the marks (ascending, as theirs),
	 * so ferry cache verify, which takes them too, never hashes a slot
	 * being punched under a mark it still sees.
	 */
	for (locked = 0; locked < k && !err; locked++)
		err = cache_map_lock(b, F_WRLCK, b->frames[fr[locked]].first,
			       b->frames[fr[locked]].count);
	if (err)
		locked--;
	for (i = 0; i < k && !err; i++) {
		c = b->frames[fr[i]].first;
		for (uint32_t done = 0; done < b->frames[fr[i]].count && !err;) {
			uint32_t m = MIN(b->frames[fr[i]].count - done,
					 (uint32_t)sizeof(zeros));

			err = pwrite_full(b->map_fd, zeros, m,
					  CACHE_MAP_HEADER_SIZE + (uint64_t)c + done);
			done += m;
		}
	}
	if (!err && k && fdatasync(b->map_fd))
		err = -errno;
	if (err)
		ferry_err("chunk cache: clearing chunk marks in %s: %s; the chunks stay in place",
			  b->map_path, ferry_strerror(err));
	for (i = 0; i < k && !err; i++) {
		cache_frame_span(b, fr[i], &start, &len);
		if (fallocate(b->data_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
			      (off_t)start, (off_t)len)) {
			err = -errno;
			ferry_err("chunk cache: cannot punch %llu bytes at %llu out of %s: %s",
				  (unsigned long long)len,
				  (unsigned long long)start, b->data_path,
				  ferry_strerror(err));
		}
	}
	for (i = 0; i < locked; i++)
		cache_map_lock(b, F_UNLCK, b->frames[fr[i]].first, b->frames[fr[i]].count);
	if (!err) {
		*freed += bytes;
		__atomic_fetch_add(&b->evicted, bytes, __ATOMIC_RELAXED);
	}
	pthread_mutex_lock(&b->lock);
	for (i = 0; i < k; i++)
		b->inflight[fr[i]] = 0;
	pthread_cond_broadcast(&b->done);
	pthread_mutex_unlock(&b->lock);
out_lock:
	ret = cache_users_lock(b->map_fd, F_RDLCK, true);
	return err ? err : ret;
}

struct victim {
	struct blob_cache_blob *b;
	uint32_t frame;
	uint32_t age;
};

/* Oldest first; then by blob and frame, so a blob's victims are together. */
static int victim_age_cmp(const void *x, const void *y)
{
	const struct victim *a = x, *b = y;

	return a->age != b->age ? (a->age < b->age ? 1 : -1) : 0;
}

static int victim_blob_cmp(const void *x, const void *y)
{
	const struct victim *a = x, *b = y;

	if (a->b != b->b)
		return (uintptr_t)a->b < (uintptr_t)b->b ? -1 : 1;
	return a->frame < b->frame ? -1 : a->frame > b->frame;
}

static bool frame_has_present(const struct blob_cache_blob *b, uint32_t fr)
{
	uint32_t c;

	for (c = b->frames[fr].first;
	     c < b->frames[fr].first + b->frames[fr].count; c++)
		if (blob_cache_chunk_present(b, c))
			return true;
	return false;
}

int cache_evict_open(const char *cache_dir, uint64_t want,
		     bool (*pinned)(void *arg, const uint8_t *digest),
		     void *arg, uint64_t *freed)
{
	struct victim *v = NULL;
	struct blob_cache_blob *b;
	size_t nr = 0, cap = 0, i, j, take;
	uint32_t now, fr, *frames = NULL;
	uint64_t sum = 0;
	char *dir_path;
	int ret = 0, err;

	if (asprintf(&dir_path, "%s/" CACHE_BLOBS_DIR, cache_dir) < 0)
		return -ENOMEM;
	pthread_mutex_lock(&cache_registry_lock);
	now = cache_clock_ms();
	for (b = cache_registry; b && !ret; b = b->next) {
		if (b->pid != getpid() || strcmp(b->dir_path, dir_path) ||
		    pinned(arg, b->own.digest))
			continue;
		for (fr = 0; fr < b->nr_frames; fr++) {
			if (frame_recent(b, fr, now) || !frame_has_present(b, fr))
				continue;
			if (array_reserve(&v, &cap, nr + 1, sizeof(*v), 256)) {
				ret = -ENOMEM;
				break;
			}
			v[nr++] = (struct victim){ b, fr,
				now - __atomic_load_n(&b->stamp[fr], __ATOMIC_RELAXED) };
		}
	}
	if (nr)
		qsort(v, nr, sizeof(*v), victim_age_cmp);
	for (take = 0; take < nr && sum < want; take++) {
		uint64_t start, len;

		cache_frame_span(v[take].b, v[take].frame, &start, &len);
		sum += len;
	}
	if (take)
		qsort(v, take, sizeof(*v), victim_blob_cmp);
	frames = malloc(MAX(take, (size_t)1) * sizeof(*frames));
	if (!frames && !ret)
		ret = -ENOMEM;
	for (i = 0; !ret && i < take; i = j) {
		for (j = i; j < take && v[j].b == v[i].b; j++)
			frames[j - i] = v[j].frame;
		err = evict_blob(v[i].b, frames, (uint32_t)(j - i), freed);
		if (err)
			ret = err;
	}
	pthread_mutex_unlock(&cache_registry_lock);
	free(frames);
	free(v);
	free(dir_path);
	return ret;
}

uint64_t blob_cache_evicted(const struct blob_cache_blob *b)
{
	return __atomic_load_n(&b->evicted, __ATOMIC_RELAXED);
}
