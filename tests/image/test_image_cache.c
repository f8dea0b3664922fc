// SPDX-License-Identifier: MIT
/*
 * Tests for an image's blobs in the chunk cache (cache.c): reads, maps,
 * ensure, present/complete, prefetch and stats against a dir: image
 * converted here (uncompressed blobs, one chunk per frame, a hole), and a
 * blob with a damaged chunk: -EIO, never its bytes.
 */
#include "../test.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>
#include <sys/stat.h>

#include "fixture.h"

static char image_ref[128];
static int cache_nr;

/* The image opened in a cache of its own, and the big file's attributes. */
struct open_cache {
	struct image *img;
	struct image_cache *ic;
	struct meta_stat big, small;
	char dir[128]; /* its cache directory */
};

static int open_cache(const char *ref, struct open_cache *oc)
{
	uint64_t nid;
	int ret;

	memset(oc, 0, sizeof(*oc));
	snprintf(oc->dir, sizeof(oc->dir), "%s/cache%d", tmpdir, cache_nr++);
	ret = image_open(ref, NULL, &oc->img);
	if (!ret)
		ret = image_cache_open(oc->img, oc->dir, &oc->ic);
	if (!ret)
		ret = meta_resolve(oc->img->meta, "/big", &nid);
	if (!ret)
		ret = meta_getattr(oc->img->meta, nid, &oc->big);
	if (!ret)
		ret = meta_resolve(oc->img->meta, "/small", &nid);
	if (!ret)
		ret = meta_getattr(oc->img->meta, nid, &oc->small);
	return ret;
}

static void close_cache(struct open_cache *oc)
{
	image_cache_close(oc->ic);
	image_close(oc->img);
}

static bool big_bytes_ok(const uint8_t *buf, uint64_t off, size_t len)
{
	size_t i;

	for (i = 0; i < len; i++)
		if (buf[i] != big_byte(off + i))
			return false;
	return true;
}

static void test_read(void)
{
	struct image_cache_stats s;
	struct open_cache oc;
	uint8_t *buf = malloc(FIXTURE_BIG_SIZE + 100);
	char small[16];
	uint64_t off;
	ssize_t n;

	CHECK_EQ(open_cache(image_ref, &oc), 0);
	if (!oc.ic || !buf)
		goto out;
	CHECK(!image_cache_present(oc.ic, 0, 0, 4096));
	CHECK(!image_cache_blob_complete(oc.ic, 0));
	/* Odd-sized reads across chunk boundaries and the hole. */
	for (off = 0; off < FIXTURE_BIG_SIZE; off += (uint64_t)n) {
		n = image_cache_read(oc.ic, &oc.big, off, buf + off, 100003);
		CHECK(n > 0);
		if (n <= 0)
			break;
	}
	CHECK_EQ(off, FIXTURE_BIG_SIZE);
	CHECK(big_bytes_ok(buf, 0, FIXTURE_BIG_SIZE));
	/* Short at the end of the file, nothing after it. */
	CHECK_EQ(image_cache_read(oc.ic, &oc.big, FIXTURE_BIG_SIZE - 10, buf, 100), 10);
	CHECK_EQ(image_cache_read(oc.ic, &oc.big, FIXTURE_BIG_SIZE, buf, 100), 0);
	CHECK(image_cache_present(oc.ic, 0, 0, FIXTURE_CHUNK));
	CHECK(image_cache_blob_complete(oc.ic, 0));
	/* Inline files come from the bootstrap. */
	CHECK_EQ(image_cache_read(oc.ic, &oc.small, 0, small, sizeof(small)), 6);
	CHECK(!memcmp(small, "hello\n", 6));
	image_cache_get_stats(oc.ic, &s);
	CHECK_EQ(s.chunks_total, 3);
	CHECK_EQ(s.chunks_present, 3);
	CHECK_EQ(s.bytes_present, 2 * FIXTURE_CHUNK + 1000);
	CHECK_EQ(s.bytes_fetched, 2 * FIXTURE_CHUNK + 1000);
	CHECK_EQ(s.bytes_read, FIXTURE_BIG_SIZE + 10);
	CHECK_EQ(s.bytes_prefetched, 0);
	/* Blob indexes are 0-based: past the one blob are 1 and 0 - 1 (device id 0). */
	CHECK(!image_cache_present(oc.ic, UINT32_MAX, 0, 1));
	CHECK(!image_cache_present(oc.ic, 1, 0, 1));
	CHECK(!image_cache_blob_complete(oc.ic, 1));
	CHECK_EQ(image_cache_ensure(oc.ic, 1, 0, 1), -EINVAL);
out:
	close_cache(&oc);
	free(buf);
}

static void test_map_and_cached_reads(void)
{
	struct image_cache_stats s;
	struct image_extent ext[8];
	struct open_cache oc;
	uint8_t buf[4096];

	CHECK_EQ(open_cache(image_ref, &oc), 0);
	if (!oc.ic)
		goto out;
	/* Nothing present: a cached read fetches nothing. */
	CHECK_EQ(image_cache_read_cached(oc.ic, &oc.big, 0, buf, sizeof(buf)), -EAGAIN);
	image_cache_get_stats(oc.ic, &s);
	CHECK_EQ(s.bytes_fetched, 0);
	/* The hole reads as zeros without any chunk. */
	memset(buf, 1, sizeof(buf));
	CHECK_EQ(image_cache_read_cached(oc.ic, &oc.big, FIXTURE_CHUNK, buf,
					 sizeof(buf)), sizeof(buf));
	CHECK(mem_is_zero(buf, sizeof(buf)));
	CHECK_EQ(image_cache_ensure(oc.ic, 0, 0, 4096), 0);
	CHECK(image_cache_present(oc.ic, 0, 0, 4096));
	CHECK(!image_cache_blob_complete(oc.ic, 0));
	CHECK_EQ(image_cache_read_cached(oc.ic, &oc.big, 100, buf, 1000), 1000);
	CHECK(big_bytes_ok(buf, 100, 1000));
	image_cache_get_stats(oc.ic, &s);
	CHECK_EQ(s.bytes_read, 0); /* speculative reads are not counted */

	/* Chunk 0, the hole, then chunks 2 and 3 adjacent in the cache file. */
	CHECK_EQ(image_cache_map(oc.ic, &oc.big, 0, FIXTURE_BIG_SIZE + 5, ext, 8), 3);
	CHECK(ext[0].fd >= 0 && ext[0].off == 0 && ext[0].len == FIXTURE_CHUNK);
	CHECK(ext[1].fd == -1 && ext[1].len == FIXTURE_CHUNK);
	CHECK(ext[2].fd == ext[0].fd && ext[2].off == FIXTURE_CHUNK &&
	      ext[2].len == FIXTURE_CHUNK + 1000);
	image_cache_map_end(oc.ic);
	CHECK(image_cache_blob_complete(oc.ic, 0));
	CHECK_EQ(image_cache_map(oc.ic, &oc.big, 10, 2 * FIXTURE_CHUNK, ext, 8), 3);
	CHECK(ext[0].off == 10 && ext[0].len == FIXTURE_CHUNK - 10 && ext[2].len == 10);
	image_cache_map_end(oc.ic);
	CHECK_EQ(image_cache_map(oc.ic, &oc.big, 0, FIXTURE_BIG_SIZE, ext, 2), -E2BIG);
	CHECK_EQ(image_cache_map(oc.ic, &oc.small, 0, 6, ext, 8), -EINVAL);
	/* Complete, the data file is the blob's EROFS device file. */
	CHECK(!access(image_cache_data_path(oc.ic, 0), R_OK));
out:
	close_cache(&oc);
}

/* A read across chunks adjacent in the blob is one fetch, not one per chunk. */
static void test_map_one_fetch(void)
{
	struct image_cache_stats s;
	struct image_extent ext[8];
	struct open_cache oc;

	CHECK_EQ(open_cache(image_ref, &oc), 0);
	if (!oc.ic)
		goto out;
	CHECK_EQ(image_cache_map(oc.ic, &oc.big, 2 * FIXTURE_CHUNK, FIXTURE_CHUNK + 1000, ext, 8), 1);
	image_cache_map_end(oc.ic);
	image_cache_get_stats(oc.ic, &s);
	CHECK_EQ(s.fetches, 1);
	CHECK_EQ(s.bytes_fetched, FIXTURE_CHUNK + 1000);
out:
	close_cache(&oc);
}

static void test_prefetch(void)
{
	struct image_cache_stats s;
	struct ferry_progress progress = { 0 };
	struct image_prefetch_plan *plan = NULL;
	struct open_cache oc;
	_Atomic bool stop = true;

	CHECK_EQ(open_cache(image_ref, &oc), 0);
	if (!oc.ic)
		goto out;
	/* Stopped before it starts: nothing happens. */
	CHECK_EQ(image_prefetch_plan_add(oc.ic, &plan, "/big"), 1);
	CHECK_EQ(image_cache_prefetch_plan(oc.ic, plan, &stop), 0);
	CHECK_EQ(image_cache_prefetch_blobs(oc.ic, NULL, &stop), 0);
	image_cache_get_stats(oc.ic, &s);
	CHECK_EQ(s.chunks_present, 0);
	/* A file: its chunks, not its hole; an inline file has none. */
	image_cache_set_bwlimit(oc.ic, 1ull << 40);
	CHECK_EQ(image_cache_prefetch_plan(oc.ic, plan, NULL), 0);
	image_cache_get_stats(oc.ic, &s);
	CHECK_EQ(s.bytes_prefetched, 2 * FIXTURE_CHUNK + 1000);
	CHECK(image_cache_blob_complete(oc.ic, 0));
	image_prefetch_plan_free(plan);
	plan = NULL;
	CHECK_EQ(image_prefetch_plan_add(oc.ic, &plan, "/small"), 1);
	CHECK_EQ(image_prefetch_plan_add(oc.ic, &plan, "/no-such-file"), -ENOENT);
	/* A symlink is followed; the root stands for big, small and sub/deep. */
	CHECK_EQ(image_prefetch_plan_add(oc.ic, &plan, "/link"), 1);
	CHECK_EQ(image_prefetch_plan_add(oc.ic, &plan, "/"), 3);
	CHECK_EQ(image_cache_prefetch_plan(oc.ic, plan, NULL), 0);
	image_prefetch_plan_free(plan);
	plan = NULL;
	close_cache(&oc);

	/* Every blob, with progress. */
	CHECK_EQ(open_cache(image_ref, &oc), 0);
	if (!oc.ic)
		goto out;
	CHECK_EQ(image_cache_prefetch_blobs(oc.ic, &progress, NULL), 0);
	CHECK(image_cache_blob_complete(oc.ic, 0));
	CHECK_EQ(progress.total, oc.img->blobs.blobs[0].uncompressed_size);
	CHECK_EQ(progress.done, progress.total);
out:
	image_prefetch_plan_free(plan);
	close_cache(&oc);
}

/* A prefetch sink over a copy of blob 0's address space in memory. */
struct mem_sink {
	uint8_t *space;
	uint64_t size, put;
	bool has_all;
};

static bool mem_has(void *ctx, uint32_t index, uint64_t uoff, uint64_t len)
{
	return ((struct mem_sink *)ctx)->has_all;
}

static int mem_put(void *ctx, uint32_t index, uint64_t uoff, const void *buf, size_t len)
{
	struct mem_sink *k = ctx;

	if (index != 0 || uoff > k->size || len > k->size - uoff)
		return -EINVAL;
	memcpy(k->space + uoff, buf, len);
	k->put += len;
	return 0;
}

static void test_prefetch_sink(void)
{
	struct mem_sink k = { 0 };
	struct image_prefetch_sink sink = { .has = mem_has, .put = mem_put, .ctx = &k };
	struct image_cache_stats s;
	struct open_cache oc, ref = { 0 };
	uint8_t *want = NULL;
	int fd = -1;

	CHECK_EQ(open_cache(image_ref, &oc), 0);
	if (!oc.ic)
		goto out;
	k.size = ROUND_UP(oc.img->blobs.blobs[0].uncompressed_size, 4096);
	k.space = calloc(1, k.size);
	want = calloc(1, k.size);
	if (!k.space || !want)
		goto out;
	/* The sink has it all: nothing is fetched. */
	k.has_all = true;
	image_cache_set_prefetch_sink(oc.ic, &sink);
	CHECK_EQ(image_cache_prefetch_blobs(oc.ic, NULL, NULL), 0);
	image_cache_get_stats(oc.ic, &s);
	CHECK_EQ(s.bytes_fetched, 0);
	CHECK_EQ(k.put, 0);
	/* It has nothing: every frame goes to the sink, none to the chunk cache. */
	k.has_all = false;
	CHECK_EQ(image_cache_prefetch_blobs(oc.ic, NULL, NULL), 0);
	image_cache_get_stats(oc.ic, &s);
	CHECK(s.bytes_fetched > 0);
	CHECK_EQ(s.chunks_present, 0);
	CHECK(k.put >= oc.img->blobs.blobs[0].uncompressed_size);
	/* The same bytes as the chunk cache's copy made by an ordinary prefetch. */
	CHECK_EQ(open_cache(image_ref, &ref), 0);
	if (!ref.ic)
		goto out;
	CHECK_EQ(image_cache_prefetch_blobs(ref.ic, NULL, NULL), 0);
	fd = open(image_cache_data_path(ref.ic, 0), O_RDONLY);
	CHECK(fd >= 0);
	if (fd >= 0)
		CHECK_EQ(pread_full(fd, want, oc.img->blobs.blobs[0].uncompressed_size, 0), 0);
	CHECK(!memcmp(k.space, want, k.size));
out:
	if (fd >= 0)
		close(fd);
	free(want);
	free(k.space);
	if (ref.img)
		close_cache(&ref);
	close_cache(&oc);
}

/*
 * Whole-blob prefetch of four images at once takes at most two steps at
 * a time in the process (each holds its fill's buffers): the sinks count
 * the steps inside put, each noting the most it found on coming in. Each
 * put waits (up to 2 s) for a second step to come in, then stays 50 ms
 * longer, time enough for a third to show; with *hold set it stays until
 * that is cleared (at most 5 s).
 */
struct slot_sink {
	atomic_uint *inside, *most;
	atomic_bool *hold;
};

static bool slot_has(void *ctx, uint32_t index, uint64_t uoff, uint64_t len)
{
	(void)ctx, (void)index, (void)uoff, (void)len;
	return false;
}

static int slot_put(void *ctx, uint32_t index, uint64_t uoff, const void *buf,
		    size_t len)
{
	struct slot_sink *k = ctx;
	struct timespec ts = { 0, 10 * 1000 * 1000 }, stay = { 0, 50 * 1000 * 1000 };
	unsigned int waited, now = atomic_fetch_add(k->inside, 1) + 1;
	unsigned int most = atomic_load(k->most);

	(void)index, (void)uoff, (void)buf, (void)len;
	while (now > most && !atomic_compare_exchange_weak(k->most, &most, now))
		;
	for (waited = 0; waited < 200 && atomic_load(k->inside) < 2; waited++)
		nanosleep(&ts, NULL);
	nanosleep(&stay, NULL);
	for (waited = 0; k->hold && atomic_load(k->hold) && waited < 500; waited++)
		nanosleep(&ts, NULL);
	atomic_fetch_sub(k->inside, 1);
	return 0;
}

struct slot_run {
	struct image_cache *ic;
	const _Atomic bool *stop;
	atomic_bool done;
	int ret;
};

static void *slot_prefetch(void *arg)
{
	struct slot_run *r = arg;

	r->ret = image_cache_prefetch_blobs(r->ic, NULL, r->stop);
	atomic_store(&r->done, true);
	return NULL;
}

/* Open @n caches of the image, each with @sink; false on failure. */
static bool slot_caches(struct open_cache *oc, struct slot_run *runs, int n,
			const struct image_prefetch_sink *sink)
{
	int i;

	for (i = 0; i < n; i++) {
		CHECK_EQ(open_cache(image_ref, &oc[i]), 0);
		if (!oc[i].ic)
			return false;
		image_cache_set_prefetch_sink(oc[i].ic, &sink[i]);
		runs[i].ic = oc[i].ic;
	}
	return true;
}

static void test_prefetch_slots(void)
{
	enum { N = 4 };
	atomic_uint inside = 0, most = 0;
	struct slot_sink k = { &inside, &most, NULL };
	struct image_prefetch_sink sinks[N];
	struct open_cache oc[N] = { 0 };
	struct slot_run runs[N] = { 0 };
	pthread_t t[N];
	int i, started = 0;

	for (i = 0; i < N; i++)
		sinks[i] = (struct image_prefetch_sink){ slot_has, slot_put, &k };
	if (!slot_caches(oc, runs, N, sinks))
		goto out;
	for (started = 0; started < N; started++)
		if (pthread_create(&t[started], NULL, slot_prefetch, &runs[started]))
			break;
	CHECK_EQ(started, N);
	for (i = 0; i < started; i++) {
		pthread_join(t[i], NULL);
		CHECK_EQ(runs[i].ret, 0);
	}
	CHECK_EQ(atomic_load(&most), 2);
out:
	for (i = 0; i < N; i++)
		if (oc[i].img)
			close_cache(&oc[i]);
}

/*
 * A prefetch waiting for a slot ends soon after its stop flag is set (an
 * unmount does not wait for other mounts' steps), without a step.
 */
static void test_prefetch_slot_stop(void)
{
	struct timespec ts = { 0, 10 * 1000 * 1000 };
	atomic_uint inside = 0, most = 0, inside3 = 0, most3 = 0;
	atomic_bool hold = true;
	struct slot_sink k = { &inside, &most, &hold }, k3 = { &inside3, &most3, NULL };
	struct image_prefetch_sink sinks[3] = {
		{ slot_has, slot_put, &k }, { slot_has, slot_put, &k }, { slot_has, slot_put, &k3 },
	};
	struct open_cache oc[3] = { 0 };
	struct slot_run runs[3] = { 0 };
	_Atomic bool stop = false;
	pthread_t t[3];
	int i, started = 0, waited;

	runs[2].stop = &stop;
	if (!slot_caches(oc, runs, 3, sinks))
		goto out;
	/* Two steps hold both slots. */
	for (; started < 2; started++)
		if (pthread_create(&t[started], NULL, slot_prefetch, &runs[started]))
			goto release;
	for (waited = 0; waited < 200 && atomic_load(&inside) < 2; waited++)
		nanosleep(&ts, NULL);
	CHECK_EQ(atomic_load(&inside), 2);
	if (pthread_create(&t[started], NULL, slot_prefetch, &runs[started]))
		goto release;
	started++;
	for (waited = 0; waited < 10; waited++)
		nanosleep(&ts, NULL);
	CHECK(!atomic_load(&runs[2].done));
	stop = true;
	for (waited = 0; waited < 100 && !atomic_load(&runs[2].done); waited++)
		nanosleep(&ts, NULL);
	CHECK(atomic_load(&runs[2].done));
	CHECK_EQ(atomic_load(&most3), 0);
	CHECK_EQ(atomic_load(&inside), 2); /* the two still hold theirs */
release:
	atomic_store(&hold, false);
	for (i = 0; i < started; i++) {
		pthread_join(t[i], NULL);
		CHECK_EQ(runs[i].ret, 0);
	}
	CHECK_EQ(started, 3);
out:
	for (i = 0; i < 3; i++)
		if (oc[i].img)
			close_cache(&oc[i]);
}

/* ferry cache gc of CACHE/fscache: what no record names goes. */
static void test_fscache_gc(void)
{
	struct image_fscache_usage u;
	struct open_cache oc;
	char cache[160], blob[80], vol[300];
	uint64_t freed = 0;
	uint32_t removed = 0;

	snprintf(cache, sizeof(cache), "%s/cache%d", tmpdir, cache_nr);
	CHECK_EQ(open_cache(image_ref, &oc), 0); /* records the image */
	if (!oc.ic)
		goto out;
	CHECK_EQ(image_fscache_usage(cache, &u), 0); /* none yet */
	CHECK_EQ(u.files, 0);
	hex_encode(oc.img->blobs.blobs[0].digest, BLOB_DIGEST_SIZE, blob);
	snprintf(vol, sizeof(vol), "%s/fscache/cache/Ierofs,x/@1a", cache);
	sh("mkdir -p %s %s/fscache/cache/Ierofs,gone/@2b %s/fscache/graveyard/a && "
	   "head -c 8192 /dev/urandom >%s/D%s && echo b >%s/D%064d && "
	   "echo c >%s/fscache/cache/Ierofs,gone/@2b/D%064d && echo d >%s/fscache/graveyard/a/x",
	   vol, cache, cache, vol, blob, vol, 7, cache, 8, cache);
	CHECK_EQ(image_fscache_usage(cache, &u), 0);
	CHECK_EQ(u.files, 4);
	CHECK(u.disk_bytes >= 8192);
	CHECK_EQ(u.holder, 0); /* this host has no /dev/cachefiles */
	CHECK_EQ(image_fscache_gc(cache, &freed, &removed, &u), 0);
	CHECK_EQ(removed, 3);
	CHECK_EQ(sh("test -f %s/D%s && ! test -e %s/D%064d && ! test -e %s/fscache/cache/Ierofs,gone && "
		    "test -d %s/fscache/graveyard && ! test -e %s/fscache/graveyard/a",
		    vol, blob, vol, 7, cache, cache, cache), 0);
	CHECK_EQ(image_fscache_usage(cache, &u), 0);
	CHECK_EQ(u.files, 1);
out:
	close_cache(&oc);
}

static void *evict_all(void *dir)
{
	struct blob_cache_limit lim = { .max_size = 1 };
	struct blob_cache_enforce_report r;
	int ret;

	usleep(200 * 1000); /* older than eviction's 100 ms grace */
	ret = blob_cache_enforce(dir, &lim, NULL, NULL, &r);
	return (void *)(intptr_t)(ret ? ret : r.freed_open ? 0 : -ENODATA);
}

/* Whether eviction of @dir's open frames ends, freeing some, within @secs s. */
static bool evict_within(const char *dir, int secs)
{
	struct timespec deadline;
	pthread_t t;
	void *ret;

	if (pthread_create(&t, NULL, evict_all, (void *)dir))
		return false;
	clock_gettime(CLOCK_REALTIME, &deadline);
	deadline.tv_sec += secs;
	if (pthread_timedjoin_np(t, &ret, &deadline)) {
		pthread_detach(t);
		return false;
	}
	return ret == NULL;
}

static void test_corrupt_chunk(void)
{
	const struct blob_chunk *bc;
	struct open_cache oc;
	char ref[160], c[128];
	uint8_t *buf = malloc(2 * FIXTURE_CHUNK);
	struct image_extent ext[4];
	struct image_prefetch_plan *plan = NULL;
	int fd;

	snprintf(c, sizeof(c), "%s/corrupt", tmpdir);
	CHECK_EQ(sh("rm -rf %s && cp -a %s %s", c, image_ref + 4, c), 0);
	snprintf(ref, sizeof(ref), "dir:%s", c);
	CHECK_EQ(open_cache(ref, &oc), 0);
	if (!oc.ic || !buf)
		goto out;
	/* The blob's second chunk is the file's third (the second is a hole). */
	CHECK_EQ(oc.img->blobs.blobs[0].nr_chunks, 3);
	bc = &oc.img->blobs.blobs[0].chunks[1];
	CHECK_EQ(flip_byte(oc.img->blob_paths[0], bc->coff + bc->frame_off + 10), 0);
	/* Intact chunks still read. */
	CHECK_EQ(image_cache_read(oc.ic, &oc.big, 0, buf, FIXTURE_CHUNK), FIXTURE_CHUNK);
	CHECK(big_bytes_ok(buf, 0, FIXTURE_CHUNK));
	/* The damaged one: -EIO however it is asked for, and never present. */
	memset(buf, 0xAA, 2 * FIXTURE_CHUNK);
	CHECK_EQ(image_cache_read(oc.ic, &oc.big, 2 * FIXTURE_CHUNK, buf, 100), -EIO);
	CHECK_EQ(image_cache_read(oc.ic, &oc.big, FIXTURE_CHUNK, buf,
				  2 * FIXTURE_CHUNK), -EIO);
	CHECK_EQ(image_cache_map(oc.ic, &oc.big, 2 * FIXTURE_CHUNK, 10, ext, 4), -EIO);
	CHECK_EQ(image_cache_ensure(oc.ic, 0, bc->uoff, 1), -EIO);
	CHECK_EQ(image_prefetch_plan_add(oc.ic, &plan, "/big"), 1);
	CHECK_EQ(image_cache_prefetch_plan(oc.ic, plan, NULL), -EIO);
	image_prefetch_plan_free(plan);
	CHECK(!image_cache_present(oc.ic, 0, bc->uoff, 1));
	CHECK(!image_cache_blob_complete(oc.ic, 0));
	CHECK_EQ(image_cache_read_cached(oc.ic, &oc.big, 2 * FIXTURE_CHUNK, buf, 10),
		 -EAGAIN);
	/* The cache data file holds no byte of it: the region is still a hole. */
	fd = open(image_cache_data_path(oc.ic, 0), O_RDONLY);
	CHECK_EQ(pread_full(fd, buf, bc->usize, bc->uoff), 0);
	CHECK(mem_is_zero(buf, bc->usize));
	if (fd >= 0)
		close(fd);
	/* The failed maps left the readers lock as they found it: eviction
	 * (which takes it for writing) still runs (issue 44: it hung). */
	CHECK(evict_within(oc.dir, 5));
	/* The last chunk, after the damaged one, is fine. */
	CHECK_EQ(image_cache_read(oc.ic, &oc.big, 3 * FIXTURE_CHUNK, buf, 1000), 1000);
	CHECK(big_bytes_ok(buf, 3 * FIXTURE_CHUNK, 1000));
out:
	close_cache(&oc);
	free(buf);
}

int main(void)
{
	ferry_log_level = getenv("TEST_LOG") ? FERRY_LOG_DEBUG : -1;
	if (fixture_init("cache"))
		return 1;
	snprintf(image_ref, sizeof(image_ref), "dir:%s/img", tmpdir);
	if (fixture_convert(image_ref, NULL)) {
		printf("not ok - fixture conversion\n");
		return 1;
	}
	RUN_TEST(test_read);
	RUN_TEST(test_map_and_cached_reads);
	RUN_TEST(test_map_one_fetch);
	RUN_TEST(test_prefetch);
	RUN_TEST(test_corrupt_chunk);
	RUN_TEST(test_prefetch_sink);
	RUN_TEST(test_prefetch_slots);
	RUN_TEST(test_prefetch_slot_stop);
	RUN_TEST(test_fscache_gc);
	sh("rm -rf %s", tmpdir);
	TEST_MAIN_END();
}
