// SPDX-License-Identifier: MIT
/*
 * Prefetch of an image in the chunk cache: the image's own list and a
 * mount's --prefetch-files as a plan of blob ranges (neighbours merged),
 * fetched several at once, the first listed first; --prefetch-all every
 * blob in bounded steps that yield to demand reads. All keep to the
 * bandwidth limit, and a prefetch sink (cachefiles) takes the bytes
 * instead of the chunk cache.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cache.h"

static void sleep_ms(unsigned int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000 };

	nanosleep(&ts, NULL);
}

/*
 * Keep prefetch under the bandwidth limit, from any number of threads;
 * sleeps are short enough to notice *@stop within 100 ms.
 */
static void prefetch_bwlimit(struct image_cache *ic, uint64_t step_bytes,
			     const _Atomic bool *stop)
{
	uint_fast64_t none = 0;
	uint64_t start, total;

	if (!ic->bwlimit)
		return;
	/* The first step starts the clock. */
	atomic_compare_exchange_strong(&ic->bw_start_ns, &none, ferry_now_ns());
	start = atomic_load(&ic->bw_start_ns);
	total = atomic_fetch_add(&ic->bw_bytes, step_bytes) + step_bytes;
	while (!(stop && atomic_load(stop))) {
		uint64_t elapsed = ferry_now_ns() - start;
		uint64_t allowed = (uint64_t)((double)ic->bwlimit * (double)elapsed / 1e9);

		if (total <= allowed)
			break;
		sleep_ms((unsigned int)MIN(100.0, (double)(total - allowed) * 1000.0 /
					   (double)ic->bwlimit + 1));
	}
}

/* Whole-blob prefetch lets demand reads run first, then keeps the limit. */
static void prefetch_pace(struct image_cache *ic, uint64_t step_bytes,
			  const _Atomic bool *stop)
{
	unsigned int waited = 0;

	while (atomic_load(&ic->demand_inflight) && waited < PREFETCH_YIELD_MAX_MS) {
		sleep_ms(1);
		waited++;
	}
	prefetch_bwlimit(ic, step_bytes, stop);
}

/*
 * Whole-blob prefetch steps in flight in the process, over all mounts. A
 * step holds its fill's buffers (a run of up to 4 MiB of compressed bytes
 * and the frame decoded from it) until it ends, so without a bound
 * ferryd's memory grew with the mounts prefetching at once (six mounts of
 * the big image: a peak of 56-60 MiB, 46 MiB with it; docs/performance-log.md).
 * Two keep both CPUs decoding on a fast link. Demand reads never wait.
 */
#define PREFETCH_STEPS_IN_FLIGHT 2u

static struct {
	pthread_mutex_t lock;
	pthread_cond_t freed;
	unsigned int used;
} prefetch_slots = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0 };

/* Take a step's slot; false when *@stop was set first. */
static bool prefetch_slot_take(const _Atomic bool *stop)
{
	struct timespec ts;
	bool took = false;

	pthread_mutex_lock(&prefetch_slots.lock);
	while (!(stop && atomic_load(stop))) {
		if (prefetch_slots.used < PREFETCH_STEPS_IN_FLIGHT) {
			prefetch_slots.used++;
			took = true;
			break;
		}
		/* Nobody signals a stop: look at it every 100 ms. */
		ferry_deadline_ts(&ts, 100);
		pthread_cond_timedwait(&prefetch_slots.freed, &prefetch_slots.lock, &ts);
	}
	pthread_mutex_unlock(&prefetch_slots.lock);
	return took;
}

static void prefetch_slot_give(void)
{
	pthread_mutex_lock(&prefetch_slots.lock);
	prefetch_slots.used--;
	pthread_cond_signal(&prefetch_slots.freed);
	pthread_mutex_unlock(&prefetch_slots.lock);
}

void image_cache_set_bwlimit(struct image_cache *ic, uint64_t bytes_per_sec)
{
	ic->bwlimit = bytes_per_sec;
}

void image_cache_set_prefetch_sink(struct image_cache *ic,
				   const struct image_prefetch_sink *sink)
{
	ic->sink = *sink;
}

struct sink_call {
	struct image_cache *ic;
	uint32_t index;
};

static int sink_put(void *ctx, uint64_t off, const void *buf, size_t len)
{
	struct sink_call *c = ctx;

	return c->ic->sink.put(c->ic->sink.ctx, c->index, off, buf, len);
}

/* One prefetch step: into the sink when there is one, else the chunk cache. */
static int prefetch_step(struct image_cache *ic, uint32_t index, uint64_t uoff,
			 uint64_t len)
{
	struct sink_call c = { ic, index };
	uint64_t fetched = 0;
	int ret;

	if (!ic->sink.put)
		return ensure(ic, index, uoff, len, false);
	if (ic->sink.has(ic->sink.ctx, index, uoff, len))
		return 0;
	ret = blob_cache_read_frames(ic->blobs[index], uoff, len, &ic->srcs[index],
				     &fetched, sink_put, &c);
	atomic_fetch_add(&ic->bytes_fetched, fetched);
	return ret;
}

/*
 * A prefetch plan: the blob ranges of listed files, each with the list
 * position of its first file. Running it merges ranges of one blob that
 * lie within PLAN_GAP of each other (fetching a gap is cheaper than a round
 * trip) up to PLAN_RANGE_MAX, and PLAN_THREADS fetch them at once, the
 * ranges of the first-listed files first. A list is many small ranges, so
 * round trips bound it: at 20 ms RTT a Python startup list (35 ranges,
 * 7.4 MB) took 0.59-0.64 s with 4 threads and 4 MiB ranges, 0.43-0.59 s
 * with 8 and 2 MiB (the same worst-case buffers: one range per thread).
 * Ranges of PLAN_LARGE or more (a hot run's, a big file's) go at most
 * PLAN_LARGE_IN_FLIGHT at once: with all in flight a hot-run list arrives
 * in one lump, its first-listed files last. Three, not two: two started
 * together end together and leave the link idle for the next pair's round
 * trip (a cold start at 50 ms RTT 5% faster, loopback and 20 ms RTT within
 * noise; four was slower at 20 ms; docs/performance-log.md).
 */
#define PLAN_THREADS 8
#define PLAN_GAP (128u << 10)
#define PLAN_RANGE_MAX (2u << 20)
#define PLAN_LARGE (1u << 20)
#define PLAN_LARGE_IN_FLIGHT 3u

struct plan_range {
	uint32_t index;
	uint32_t order; /* list position of the first file it holds */
	uint64_t uoff, len;
};

struct image_prefetch_plan {
	struct plan_range *ranges;
	size_t nr, cap;
	uint32_t paths; /* list positions used */
};

void image_prefetch_plan_free(struct image_prefetch_plan *plan)
{
	if (plan) {
		free(plan->ranges);
		free(plan);
	}
}

static int plan_file(struct image_cache *ic, struct image_prefetch_plan *plan,
		     const struct meta_stat *st)
{
	uint64_t pos, n, uoff = 0;
	uint32_t index = 0;
	int ret;

	if (!S_ISREG(st->mode) || !st->nr_chunks)
		return 0;
	for (pos = 0; pos < st->size; pos += n) {
		struct plan_range *last = plan->nr ? &plan->ranges[plan->nr - 1] : NULL;

		n = MIN(st->size - pos, (uint64_t)st->chunk_size - pos % st->chunk_size);
		ret = locate(ic, st, pos, &index, &uoff);
		if (ret < 0)
			return ret;
		if (ret)
			continue; /* a hole */
		if (last && last->index == index && last->uoff + last->len == uoff) {
			last->len += n;
			continue;
		}
		if (array_reserve(&plan->ranges, &plan->cap, plan->nr + 1,
				  sizeof(*plan->ranges), 64))
			return -ENOMEM;
		plan->ranges[plan->nr++] = (struct plan_range){
			.index = index, .order = plan->paths, .uoff = uoff, .len = n,
		};
	}
	return 0;
}

/* Deeper directories are skipped: a bound on the recursion below. */
#define PREFETCH_DIR_DEPTH 64u

struct dir_walk {
	uint64_t *nids;
	size_t nr, cap;
	int err;
};

static int collect(void *arg, const char *name, size_t len, uint64_t nid,
		   unsigned int file_type, uint64_t next_pos)
{
	struct dir_walk *w = arg;

	if ((len == 1 && name[0] == '.') || (len == 2 && !memcmp(name, "..", 2)))
		return 0;
	if (array_reserve(&w->nids, &w->cap, w->nr + 1, sizeof(*w->nids), 16)) {
		w->err = -ENOMEM;
		return 1;
	}
	w->nids[w->nr++] = nid;
	return 0;
}

/* The regular file or directory tree @nid into @plan: files, or -errno. */
static int plan_nid(struct image_cache *ic, struct image_prefetch_plan *plan,
		    uint64_t nid, unsigned int depth, const char *path)
{
	struct dir_walk w = { 0 };
	struct meta_stat st;
	size_t i;
	int ret, files = 0;

	ret = meta_getattr(ic->img->meta, nid, &st);
	if (ret)
		return ret;
	if (S_ISREG(st.mode)) {
		ret = plan_file(ic, plan, &st);
		return ret ? ret : 1;
	}
	if (!S_ISDIR(st.mode))
		return 0;
	if (depth >= PREFETCH_DIR_DEPTH) {
		ferry_warn("%s: prefetch: %s: directories nested deeper than %u skipped",
			   ic->img->ref, path, PREFETCH_DIR_DEPTH);
		return 0;
	}
	ret = meta_readdir(ic->img->meta, nid, 0, collect, &w);
	if (ret > 0)
		ret = w.err;
	for (i = 0; !ret && i < w.nr; i++) {
		int n = plan_nid(ic, plan, w.nids[i], depth + 1, path);

		if (n < 0)
			ret = n;
		else
			files += n;
	}
	free(w.nids);
	return ret ? ret : files;
}

int image_prefetch_plan_add(struct image_cache *ic, struct image_prefetch_plan **plan,
			    const char *path)
{
	uint64_t nid;
	int ret;

	if (!*plan && !(*plan = calloc(1, sizeof(**plan))))
		return -ENOMEM;
	ret = meta_resolve_follow(ic->img->meta, path, &nid);
	if (!ret)
		ret = plan_nid(ic, *plan, nid, 0, path);
	(*plan)->paths++;
	return ret;
}

static int plan_by_place(const void *a, const void *b)
{
	const struct plan_range *x = a, *y = b;

	if (x->index != y->index)
		return x->index < y->index ? -1 : 1;
	return x->uoff < y->uoff ? -1 : x->uoff > y->uoff;
}

static int plan_by_order(const void *a, const void *b)
{
	const struct plan_range *x = a, *y = b;

	if (x->order != y->order)
		return x->order < y->order ? -1 : 1;
	return plan_by_place(a, b);
}

/* Sort by place, merge neighbours, then sort by list order. */
static void plan_merge(struct image_prefetch_plan *plan)
{
	size_t i, nr = 0;

	if (!plan->nr)
		return;
	qsort(plan->ranges, plan->nr, sizeof(*plan->ranges), plan_by_place);
	for (i = 1; i < plan->nr; i++) {
		struct plan_range *last = &plan->ranges[nr], *r = &plan->ranges[i];
		uint64_t end = MAX(last->uoff + last->len, r->uoff + r->len);

		if (r->index == last->index && r->uoff <= last->uoff + last->len + PLAN_GAP &&
		    end - last->uoff <= PLAN_RANGE_MAX) {
			last->len = end - last->uoff;
			last->order = MIN(last->order, r->order);
		} else {
			plan->ranges[++nr] = *r;
		}
	}
	plan->nr = nr + 1;
	qsort(plan->ranges, plan->nr, sizeof(*plan->ranges), plan_by_order);
}

struct plan_run {
	struct image_cache *ic;
	struct image_prefetch_plan *plan;
	const _Atomic bool *stop;
	pthread_mutex_t lock; /* guards next and large */
	pthread_cond_t large_done;
	size_t next;
	unsigned int large; /* ranges of PLAN_LARGE or more being fetched */
	atomic_int err;
};

static bool plan_stopped(const struct plan_run *run)
{
	return run->stop && atomic_load(run->stop);
}

/*
 * The next range in list order, or NULL when the plan is done or stopped.
 * A large range waits while PLAN_LARGE_IN_FLIGHT others are fetched (and
 * holds back those listed after it): fetched all at once, the hot run's
 * 2 MiB ranges share the link and the CPUs, and the first-listed files
 * arrive last with the rest. Small ranges are round-trip bound and keep
 * every thread.
 */
static const struct plan_range *plan_take(struct plan_run *run)
{
	const struct plan_range *r = NULL;

	pthread_mutex_lock(&run->lock);
	while (!plan_stopped(run) && run->next < run->plan->nr &&
	       run->plan->ranges[run->next].len >= PLAN_LARGE &&
	       run->large >= PLAN_LARGE_IN_FLIGHT)
		pthread_cond_wait(&run->large_done, &run->lock);
	if (!plan_stopped(run) && run->next < run->plan->nr) {
		r = &run->plan->ranges[run->next++];
		run->large += r->len >= PLAN_LARGE;
	}
	pthread_mutex_unlock(&run->lock);
	return r;
}

static void plan_done(struct plan_run *run, const struct plan_range *r)
{
	if (r->len < PLAN_LARGE)
		return;
	pthread_mutex_lock(&run->lock);
	run->large--;
	pthread_cond_broadcast(&run->large_done);
	pthread_mutex_unlock(&run->lock);
}

static void *plan_worker(void *arg)
{
	struct plan_run *run = arg;
	struct image_cache *ic = run->ic;
	const struct plan_range *r;
	int ret;

	while ((r = plan_take(run))) {
		prefetch_bwlimit(ic, r->len, run->stop);
		/* Stopped meanwhile: the next plan_take says so. */
		if (!plan_stopped(run)) {
			ret = prefetch_step(ic, r->index, r->uoff, r->len);
			if (ret) { /* the rest may still come: go on, report the first */
				int none = 0;

				atomic_compare_exchange_strong(&run->err, &none, ret);
			} else {
				atomic_fetch_add(&ic->prefetched, r->len);
			}
		}
		plan_done(run, r);
	}
	return NULL;
}

bool planned(struct image_cache *ic, uint32_t index, uint64_t uoff, uint64_t len)
{
	struct plan_range key = { .index = index, .uoff = uoff };
	size_t lo = 0, hi;
	bool in = false;

	pthread_mutex_lock(&ic->lock);
	/* The last range that starts at or before (index, uoff). */
	for (hi = ic->nr_planned; lo < hi;) {
		size_t mid = lo + (hi - lo) / 2;

		if (plan_by_place(&ic->planned[mid], &key) <= 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo) {
		const struct plan_range *r = &ic->planned[lo - 1];

		in = r->index == index && uoff + len <= r->uoff + r->len;
	}
	pthread_mutex_unlock(&ic->lock);
	return in;
}

/* Publish @plan's ranges to demand reads (planned), or withdraw them (NULL). */
static void plan_publish(struct image_cache *ic, const struct image_prefetch_plan *plan)
{
	struct plan_range *copy = NULL;

	if (plan && (copy = malloc(plan->nr * sizeof(*copy)))) {
		memcpy(copy, plan->ranges, plan->nr * sizeof(*copy));
		qsort(copy, plan->nr, sizeof(*copy), plan_by_place);
	}
	pthread_mutex_lock(&ic->lock);
	free(ic->planned);
	ic->planned = copy;
	ic->nr_planned = copy ? plan->nr : 0;
	pthread_mutex_unlock(&ic->lock);
}

int image_cache_prefetch_plan(struct image_cache *ic, struct image_prefetch_plan *plan,
			      const _Atomic bool *stop)
{
	struct plan_run run = {
		.ic = ic, .plan = plan, .stop = stop,
		.lock = PTHREAD_MUTEX_INITIALIZER, .large_done = PTHREAD_COND_INITIALIZER,
	};
	pthread_t threads[PLAN_THREADS - 1];
	unsigned int i, nr_threads = 0;

	if (!plan)
		return 0;
	plan_merge(plan);
	/* Without the copy (no memory), fetch-ahead only duplicates work. */
	plan_publish(ic, plan);
	/* This thread is the last worker; fewer threads only mean slower. */
	for (i = 0; i + 1 < PLAN_THREADS && i + 1 < plan->nr; i++) {
		if (pthread_create(&threads[nr_threads], NULL, plan_worker, &run))
			break;
		nr_threads++;
	}
	plan_worker(&run);
	while (nr_threads)
		pthread_join(threads[--nr_threads], NULL);
	plan_publish(ic, NULL);
	return atomic_load(&run.err);
}

int image_cache_prefetch_blobs(struct image_cache *ic,
			       struct ferry_progress *progress,
			       const _Atomic bool *stop)
{
	uint32_t i;
	uint64_t pos, step;
	int ret;

	for (i = 0; progress && i < ic->nr_blobs; i++)
		progress->total += ic->img->blobs.blobs[i].uncompressed_size;
	for (i = 0; i < ic->nr_blobs; i++) {
		const struct blob_info *b = &ic->img->blobs.blobs[i];

		for (pos = 0; pos < b->uncompressed_size && !(stop && atomic_load(stop)); pos += step) {
			step = MIN(b->uncompressed_size - pos, (uint64_t)PREFETCH_STEP);
			prefetch_pace(ic, step, stop);
			if (!prefetch_slot_take(stop))
				break;
			ret = prefetch_step(ic, i, pos, step);
			prefetch_slot_give();
			if (ret)
				return ret;
			atomic_fetch_add(&ic->prefetched, step);
			if (progress)
				ferry_progress_add(progress, step);
		}
	}
	return 0;
}
