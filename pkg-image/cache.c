// SPDX-License-Identifier: MIT
/*
 * An image's blobs opened in the chunk cache, and the demand path: file
 * reads (FUSE), device ranges (fanotify) and cachefiles' frames make the
 * chunks they touch present, fetching them from the image's blob sources,
 * then read the cache data files. Each read also drives fetch-ahead
 * (fetch_ahead.c), which takes round trips off the readers' path for
 * images in a registry; prefetch (prefetch_plan.c) works in bounded steps
 * and yields while a demand read is in flight (cache.h says which file
 * holds what).
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cache.h"

_Thread_local bool in_fetch_ahead;

void image_cache_close(struct image_cache *ic)
{
	uint32_t i;

	if (!ic)
		return;
	ahead_close(ic);
	pthread_mutex_destroy(&ic->lock);
	for (i = 0; ic->blobs && i < ic->nr_blobs; i++)
		if (ic->blobs[i])
			blob_cache_close(ic->blobs[i]);
	free(ic->blobs);
	free(ic->srcs);
	free(ic->tsrcs);
	free(ic->planned);
	free(ic);
}

/* Fold one fetch of @bytes that took @ns into the link estimates. */
static void link_sample(struct image_cache *ic, uint64_t bytes, uint64_t ns)
{
	double t = (double)ns / 1e9, lat;

	pthread_mutex_lock(&ic->lock);
	/* What the transfer alone would have taken is not latency. */
	lat = ic->bw_Bps > 0 ? t - (double)bytes / ic->bw_Bps : t;
	lat = MAX(lat, 0.0);
	ic->rtt_s = ic->rtt_s > 0 ? 0.75 * ic->rtt_s + 0.25 * lat : lat;
	if (bytes >= AHEAD_BW_SAMPLE && t > ic->rtt_s) {
		double bw = (double)bytes / (t - ic->rtt_s);

		ic->bw_Bps = ic->bw_Bps > 0 ? 0.75 * ic->bw_Bps + 0.25 * bw : bw;
	}
	pthread_mutex_unlock(&ic->lock);
}

static int timed_read(void *ctx, uint64_t off, void *buf, size_t len)
{
	struct timed_source *ts = ctx;
	uint64_t t0 = ferry_now_ns();
	int ret = ts->inner.read(ts->inner.ctx, off, buf, len);

	atomic_fetch_add(&ts->ic->fetches, 1);
	if (in_fetch_ahead)
		atomic_fetch_add(&ts->ic->fetches_ahead, 1);
	if (!ret)
		link_sample(ts->ic, len, ferry_now_ns() - t0);
	return ret;
}

int image_cache_open(struct image *img, const char *cache_dir,
		     struct image_cache **out)
{
	uint8_t (*digests)[BLOB_DIGEST_SIZE] = NULL, keep[3][BLOB_DIGEST_SIZE];
	struct image_cache *ic = calloc(1, sizeof(*ic));
	uint32_t i, n = img->blobs.nr_blobs;
	int ret = -ENOMEM;

	if (!ic)
		return -ENOMEM;
	ic->img = img;
	ic->nr_blobs = n;
	pthread_mutex_init(&ic->lock, NULL);
	ic->blobs = calloc(n + 1, sizeof(*ic->blobs));
	ic->srcs = calloc(n + 1, sizeof(*ic->srcs));
	ic->tsrcs = calloc(n + 1, sizeof(*ic->tsrcs));
	digests = calloc(n + 1, sizeof(*digests));
	if (!ic->blobs || !ic->srcs || !ic->tsrcs || !digests || ahead_open(ic))
		goto fail;
	ret = blob_cache_dir(cache_dir, NULL, true, NULL);
	if (ret)
		goto fail;
	for (i = 0; i < n; i++)
		memcpy(digests[i], img->blobs.blobs[i].digest, BLOB_DIGEST_SIZE);
	/* Recorded first, so a concurrent gc keeps what is being filled,
	 * with the documents and the bootstrap file the cache may hold for
	 * it (meta/, bootstraps/: image_meta_gc); a dir: image has no config. */
	memcpy(keep[0], img->image_digest, BLOB_DIGEST_SIZE);
	memcpy(keep[1], img->bootstrap_digest, BLOB_DIGEST_SIZE);
	memcpy(keep[2], img->config_digest, BLOB_DIGEST_SIZE);
	ret = blob_cache_add_image(cache_dir, img->ref, img->image_digest,
				   (const uint8_t (*)[BLOB_DIGEST_SIZE])digests, n,
				   (const uint8_t (*)[BLOB_DIGEST_SIZE])keep,
				   mem_is_zero(keep[2], BLOB_DIGEST_SIZE) ? 2 : 3);
	for (i = 0; !ret && i < n; i++) {
		ret = image_blob_source(img, i, &ic->tsrcs[i].inner);
		ic->tsrcs[i].ic = ic;
		ic->srcs[i] = (struct blob_source){ timed_read, &ic->tsrcs[i],
						    ic->tsrcs[i].inner.stream };
		if (!ret)
			ret = blob_cache_open(cache_dir, &img->blobs.blobs[i],
					      &ic->blobs[i]);
	}
	if (ret)
		goto fail;
	free(digests);
	*out = ic;
	return 0;
fail:
	free(digests);
	image_cache_close(ic);
	return ret;
}

const char *image_cache_data_path(const struct image_cache *ic, uint32_t index)
{
	return blob_cache_data_path(ic->blobs[index]);
}

int image_cache_data_fd(const struct image_cache *ic, uint32_t index)
{
	return blob_cache_data_fd(ic->blobs[index]);
}

struct image *image_cache_img(const struct image_cache *ic)
{
	return ic->img;
}

int image_cache_fill(struct image_cache *ic, uint32_t index, uint64_t uoff,
		     uint64_t len)
{
	return ensure(ic, index, uoff, len, false);
}

void image_cache_set_sb_note(struct image_cache *ic,
			     void (*noted)(void *ctx, const char *sysfs), void *ctx)
{
	ic->sb_noted = noted;
	ic->sb_noted_ctx = ctx;
}

void image_cache_note_sb(const struct image_cache *ic, const char *sysfs)
{
	if (ic->sb_noted)
		ic->sb_noted(ic->sb_noted_ctx, sysfs);
}

static void count_miss(struct image_cache *ic, uint64_t ns)
{
	static const uint64_t bounds[] = IMAGE_LATENCY_BOUNDS_MS;
	size_t b = 0;

	_Static_assert(ARRAY_SIZE(bounds) + 1 == IMAGE_LATENCY_BUCKETS,
		       "one bucket per bound plus the overflow one");
	while (b < ARRAY_SIZE(bounds) && ns > bounds[b] * 1000000u)
		b++;
	atomic_fetch_add(&ic->misses, 1);
	atomic_fetch_add(&ic->miss_ns_total, ns);
	atomic_fetch_add(&ic->miss_ms[b], 1);
}

/* Demand reads and prefetch; only the demand ones count as hits or misses. */
/* A demand read's outcome for the metrics: an error, a miss or a hit. */
static void count_demand(struct image_cache *ic, int ret, uint64_t fetched,
			 uint64_t start)
{
	if (ret)
		atomic_fetch_add(&ic->fetch_errors, 1);
	else if (fetched)
		count_miss(ic, ferry_now_ns() - start);
	else
		atomic_fetch_add(&ic->hits, 1);
}

int ensure(struct image_cache *ic, uint32_t index, uint64_t uoff, uint64_t len,
	   bool demand)
{
	uint64_t fetched = 0, start = demand ? ferry_now_ns() : 0;
	int ret = blob_cache_ensure(ic->blobs[index], uoff, len, &ic->srcs[index],
				    &fetched);

	atomic_fetch_add(&ic->bytes_fetched, fetched);
	if (demand)
		count_demand(ic, ret, fetched, start);
	return ret;
}

/* A reader's ensure (@st: of that file, or NULL): it also drives fetch-ahead. */
static int demand_ensure(struct image_cache *ic, const struct meta_stat *st,
			 uint32_t index, uint64_t uoff, uint64_t len)
{
	struct meta_stat owner;
	bool program;
	int ret;

	if (blob_cache_range_present(ic->blobs[index], uoff, len)) {
		ahead_hit(ic, st, index, uoff, len);
		atomic_fetch_add(&ic->hits, 1);
		return 0;
	}
	/* Queued first, so that fetch-ahead's fetches overlap the reader's. */
	program = ahead_miss(ic, &st, &owner, index, uoff, len);
	ret = ensure(ic, index, uoff, len, true);
	if (!ret && program)
		ahead_program_fetched(ic, st);
	return ret;
}

int image_cache_ensure(struct image_cache *ic, uint32_t index,
		       uint64_t uoff, uint64_t len)
{
	int ret;

	if (index >= ic->nr_blobs)
		return -EINVAL;
	atomic_fetch_add(&ic->demand_inflight, 1);
	ret = demand_ensure(ic, NULL, index, uoff, len);
	atomic_fetch_sub(&ic->demand_inflight, 1);
	return ret;
}

int image_cache_read_frames(struct image_cache *ic, uint32_t index,
			    uint64_t uoff, uint64_t len, blob_emit_fn emit, void *ctx)
{
	uint64_t fetched = 0, start = ferry_now_ns();
	int ret;

	if (index >= ic->nr_blobs)
		return -EINVAL;
	atomic_fetch_add(&ic->demand_inflight, 1);
	ret = blob_cache_read_frames(ic->blobs[index], uoff, len,
				     &ic->srcs[index], &fetched, emit, ctx);
	atomic_fetch_sub(&ic->demand_inflight, 1);
	atomic_fetch_add(&ic->bytes_fetched, fetched);
	count_demand(ic, ret, fetched, start);
	if (!ret)
		atomic_fetch_add(&ic->bytes_read, len);
	return ret;
}

bool image_cache_present(const struct image_cache *ic, uint32_t index,
			 uint64_t uoff, uint64_t len)
{
	return index < ic->nr_blobs &&
	       blob_cache_range_present(ic->blobs[index], uoff, len);
}

bool image_cache_blob_complete(const struct image_cache *ic, uint32_t index)
{
	uint32_t chunks;

	if (index >= ic->nr_blobs)
		return false;
	blob_cache_usage(ic->blobs[index], &chunks, NULL);
	return chunks == ic->img->blobs.blobs[index].nr_chunks;
}

void image_cache_kernel_reads(struct image_cache *ic)
{
	uint32_t i;

	for (i = 0; i < ic->nr_blobs; i++)
		blob_cache_kernel_reads(ic->blobs[i]);
}

/*
 * Where byte @pos of the chunk-based file @st lives: 0 and *@index (blob)
 * and *@uoff, 1 for a hole, or -EFSCORRUPTED naming the file's nid.
 */
int locate(const struct image_cache *ic, const struct meta_stat *st, uint64_t pos,
	   uint32_t *index, uint64_t *uoff)
{
	struct meta_chunk mc;
	int ret = meta_get_chunk(ic->img->meta, st->nid, pos / st->chunk_size, &mc);

	if (ret)
		return ret;
	if (mc.blkaddr == META_CHUNK_HOLE)
		return 1;
	if (mc.device_id < 1 || mc.device_id > ic->nr_blobs) {
		ferry_err("%s: inode %llu: chunk %llu names device %u of %u",
			  ic->img->ref, (unsigned long long)st->nid,
			  (unsigned long long)(pos / st->chunk_size),
			  mc.device_id, ic->nr_blobs);
		return -EFSCORRUPTED;
	}
	*index = mc.device_id - 1u;
	*uoff = (uint64_t)mc.blkaddr * META_BLOCK_SIZE + pos % st->chunk_size;
	return 0;
}

/*
 * The bytes from @pos (at blob @index's @uoff, @n of them in its chunk) up
 * to @end that lie back to back in that blob: a read across a chunk
 * boundary (a FUSE read of 512 KiB, kernel readahead of a file's next
 * chunks) is one fetch of their frames, not one round trip after another.
 */
static uint64_t blob_run(struct image_cache *ic, const struct meta_stat *st, uint64_t pos,
			 uint64_t end, uint32_t index, uint64_t uoff, uint64_t n)
{
	uint64_t at;
	uint32_t i;

	while (pos + n < end && !locate(ic, st, pos + n, &i, &at) && i == index &&
	       at == uoff + n)
		n += MIN(end - (pos + n), (uint64_t)st->chunk_size);
	return n;
}

/*
 * Make the chunks behind [off, off + len) of a chunk-based file present
 * (clamped to its size), or with !@fetch only check that they are
 * (-EAGAIN if not), and describe where the bytes are, merging contiguous
 * pieces of one cache file.
 */
static ssize_t map_chunked(struct image_cache *ic, const struct meta_stat *st,
			   uint64_t off, size_t len, struct image_extent *ext,
			   size_t max, bool fetch)
{
	uint64_t end = MIN(st->size, off + len), pos, uoff = 0, ensured = off;
	uint32_t index = 0;
	size_t nr = 0;
	int ret;

	for (pos = off; pos < end;) {
		size_t n = (size_t)MIN(end - pos,
				       st->chunk_size - pos % st->chunk_size);
		int fd = -1;

		ret = locate(ic, st, pos, &index, &uoff);
		if (ret < 0)
			return ret;
		if (!ret) {
			if (fetch && pos >= ensured) {
				uint64_t run = blob_run(ic, st, pos, end, index, uoff, n);

				ret = demand_ensure(ic, st, index, uoff, run);
				ensured = pos + run;
			} else if (!fetch && !blob_cache_range_present(ic->blobs[index], uoff, n))
				ret = -EAGAIN;
			if (ret)
				return ret;
			fd = blob_cache_data_fd(ic->blobs[index]);
		}
		if (nr && ext[nr - 1].fd == fd &&
		    (fd < 0 || ext[nr - 1].off + ext[nr - 1].len == uoff)) {
			ext[nr - 1].len += n;
		} else {
			if (nr == max)
				return -E2BIG;
			ext[nr++] = (struct image_extent){ fd, fd < 0 ? 0 : uoff, n };
		}
		pos += n;
	}
	return (ssize_t)nr;
}

ssize_t image_cache_map(struct image_cache *ic, const struct meta_stat *st,
			uint64_t off, size_t len, struct image_extent *ext,
			size_t max)
{
	unsigned int tries = 0;
	ssize_t nr;
	size_t i;

	if (!S_ISREG(st->mode) || !st->nr_chunks)
		return -EINVAL;
	atomic_fetch_add(&ic->demand_inflight, 1);
	/*
	 * Fetch without the readers lock, then check under it (eviction may
	 * take a fetched chunk back in between); the last try fetches under
	 * it. The lock is held exactly when nr >= 0 leaves the loop.
	 */
	for (;;) {
		bool last = ++tries == EVICTED_RETRIES;

		if (!last) {
			nr = map_chunked(ic, st, off, len, ext, max, true);
			if (nr < 0)
				break;
		}
		blob_cache_read_begin();
		nr = map_chunked(ic, st, off, len, ext, max, last);
		if (nr >= 0)
			break;
		blob_cache_read_end();
		if (nr != -EAGAIN || last)
			break;
	}
	atomic_fetch_sub(&ic->demand_inflight, 1);
	for (i = 0; nr > 0 && i < (size_t)nr; i++)
		atomic_fetch_add(&ic->bytes_read, ext[i].len);
	return nr;
}

void image_cache_map_end(struct image_cache *ic)
{
	(void)ic;
	blob_cache_read_end();
}

/* image_cache_read, or with !@fetch image_cache_read_cached. */
static ssize_t cache_read(struct image_cache *ic, const struct meta_stat *st,
			  uint64_t off, void *buf, size_t len, bool fetch)
{
	struct image_extent ext[8];
	uint8_t *p = buf;
	size_t done = 0, i;
	ssize_t nr;
	int ret;

	if (!S_ISREG(st->mode))
		return -EINVAL;
	if (off >= st->size)
		return 0;
	if (!st->nr_chunks)
		return meta_read(ic->img->meta, st->nid, off, buf, len);
	len = (size_t)MIN((uint64_t)len, st->size - off);
	while (done < len) {
		/* A piece at a time: eight extents cover at least 8 chunks. */
		size_t piece = MIN(len - done, (size_t)8 * st->chunk_size);

		if (fetch) {
			nr = image_cache_map(ic, st, off + done, piece, ext,
					     ARRAY_SIZE(ext));
		} else {
			blob_cache_read_begin();
			nr = map_chunked(ic, st, off + done, piece, ext,
					 ARRAY_SIZE(ext), false);
			if (nr < 0)
				blob_cache_read_end();
		}
		if (nr < 0)
			return nr;
		for (i = 0, ret = nr ? 0 : -EFSCORRUPTED;
		     !ret && i < (size_t)nr; i++) {
			if (ext[i].fd < 0)
				memset(p + done, 0, ext[i].len);
			else
				ret = pread_full(ext[i].fd, p + done,
						 ext[i].len, ext[i].off);
			done += ext[i].len;
		}
		blob_cache_read_end();
		if (ret)
			return ret;
	}
	return (ssize_t)done;
}

ssize_t image_cache_read(struct image_cache *ic, const struct meta_stat *st,
			 uint64_t off, void *buf, size_t len)
{
	return cache_read(ic, st, off, buf, len, true);
}

ssize_t image_cache_read_cached(struct image_cache *ic, const struct meta_stat *st,
				uint64_t off, void *buf, size_t len)
{
	return cache_read(ic, st, off, buf, len, false);
}

void image_cache_get_stats(struct image_cache *ic, struct image_cache_stats *s)
{
	uint32_t i, chunks;
	uint64_t bytes;

	memset(s, 0, sizeof(*s));
	s->bytes_read = atomic_load(&ic->bytes_read);
	s->bytes_fetched = atomic_load(&ic->bytes_fetched);
	s->bytes_prefetched = atomic_load(&ic->prefetched);
	s->hits = atomic_load(&ic->hits);
	s->misses = atomic_load(&ic->misses);
	s->fetch_errors = atomic_load(&ic->fetch_errors);
	s->inflight = atomic_load(&ic->demand_inflight);
	s->miss_ns_total = atomic_load(&ic->miss_ns_total);
	for (i = 0; i < IMAGE_LATENCY_BUCKETS; i++)
		s->miss_ms[i] = atomic_load(&ic->miss_ms[i]);
	if (ic->img->remote) {
		struct fetch_stats fs;

		registry_get_stats(ic->img->remote, &fs);
		s->requests = fs.requests;
		s->retries = fs.retries;
	}
	s->bytes_ahead = atomic_load(&ic->bytes_ahead);
	s->fetches = atomic_load(&ic->fetches);
	s->fetches_ahead = atomic_load(&ic->fetches_ahead);
	s->programs_recorded = atomic_load(&ic->programs_recorded);
	s->programs_read = atomic_load(&ic->programs_read);
	s->modules_read = atomic_load(&ic->modules_read);
	for (i = 0; i < ic->nr_blobs; i++) {
		blob_cache_usage(ic->blobs[i], &chunks, &bytes);
		s->chunks_present += chunks;
		s->bytes_present += bytes;
		s->bytes_evicted += blob_cache_evicted(ic->blobs[i]);
		s->chunks_total += ic->img->blobs.blobs[i].nr_chunks;
	}
}
