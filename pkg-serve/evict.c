// SPDX-License-Identifier: MIT
/*
 * The chunk caches' size limits: a thread that keeps every cache directory
 * ferryd serves mounts from within its limit (blob_cache_enforce, pkg-blob
 * does the eviction). It looks whenever this process made more bytes
 * present, and at least every second for the others' (free space, other
 * processes' fills).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

/* How often the thread looks while chunks are being filled. */
#define EVICT_POLL_MS 10
/* ...and at most this long between looks when nothing is filled here. */
#define EVICT_IDLE_MS 1000
/* After a look that found nothing it may evict (all pinned, in use or recent). */
#define EVICT_BACKOFF_NS (200 * 1000000ull)

struct evict_dir {
	struct evict_dir *next;
	struct serve_ctx *ctx;
	char *path;
	struct blob_cache_limit lim;
	uint64_t evicted;      /* bytes freed here, ever */
	uint64_t recorded;     /* evicted as last recorded for ferry cache ls */
	uint64_t recorded_ns;  /* when */
	uint64_t next_ns;      /* eviction thread only: no look before */
};

void evict_init(struct serve_ctx *ctx)
{
	ctx->evict_defaults.max_size = ctx->opts.cache_max_size;
	ctx->evict_defaults.min_free_pct = ctx->opts.cache_min_free;
}

void evict_stop(struct serve_ctx *ctx)
{
	struct evict_dir *d;

	if (ctx->evict_started) {
		atomic_store(&ctx->evict_quit, true);
		pthread_join(ctx->evict_thread, NULL);
		ctx->evict_started = false;
	}
	while ((d = ctx->evict_dirs)) {
		ctx->evict_dirs = d->next;
		free(d->path);
		free(d);
	}
}

void evict_marks_lock(struct serve_ctx *ctx)
{
	pthread_mutex_lock(&ctx->marks_lock);
}

void evict_marks_unlock(struct serve_ctx *ctx)
{
	pthread_mutex_unlock(&ctx->marks_lock);
}

/* For ferry cache ls: at once when asked, else at most once a second. */
static void record(struct evict_dir *d, const struct blob_cache_limit *lim, bool now)
{
	uint64_t t = ferry_now_ns(), evicted;

	pthread_mutex_lock(&d->ctx->evict_lock);
	evicted = d->evicted;
	if (!now && (evicted == d->recorded || t - d->recorded_ns < 1000000000ull)) {
		pthread_mutex_unlock(&d->ctx->evict_lock);
		return;
	}
	d->recorded = evicted;
	d->recorded_ns = t;
	pthread_mutex_unlock(&d->ctx->evict_lock);
	if (blob_cache_record_limit(d->path, lim, evicted))
		ferry_warn("chunk cache %s: cannot record its limit for ferry cache ls", d->path);
}

/* Every mount of the cache makes sure its reads of what gets punched reach us. */
static int prepare(void *arg)
{
	struct evict_dir *d = arg;

	return mounts_evicting(d->ctx, d->path);
}

static void enforce(struct evict_dir *d, const struct blob_cache_limit *lim)
{
	struct blob_cache_enforce_report r;
	uint64_t freed;
	int ret;

	memset(&r, 0, sizeof(r));
	evict_marks_lock(d->ctx);
	ret = blob_cache_enforce(d->path, lim, prepare, d, &r);
	evict_marks_unlock(d->ctx);
	freed = r.freed_gc + r.freed_idle + r.freed_open;
	/* Over, and nothing could go: do not rescan the cache every tick. */
	if (r.want && !freed)
		d->next_ns = ferry_now_ns() + EVICT_BACKOFF_NS;
	if (ret)
		ferry_warn("chunk cache %s: eviction: %s", d->path, ferry_strerror(ret));
	if (!freed)
		return;
	pthread_mutex_lock(&d->ctx->evict_lock);
	d->evicted += freed;
	pthread_mutex_unlock(&d->ctx->evict_lock);
	record(d, lim, false);
	ferry_dbg("chunk cache %s: %llu bytes used, limit %llu: freed %llu (gc %llu, idle blobs %llu, LRU frames %llu)",
		  d->path, (unsigned long long)r.usage, (unsigned long long)lim->max_size,
		  (unsigned long long)freed, (unsigned long long)r.freed_gc,
		  (unsigned long long)r.freed_idle, (unsigned long long)r.freed_open);
}

static void *evict_main(void *arg)
{
	static const struct timespec tick = { 0, EVICT_POLL_MS * 1000000L };
	struct serve_ctx *ctx = arg;
	uint64_t seen = blob_cache_filled(), now;
	unsigned int idle = 0;
	struct evict_dir *d;

	while (!atomic_load(&ctx->evict_quit)) {
		nanosleep(&tick, NULL);
		now = blob_cache_filled();
		if (now == seen && (idle += EVICT_POLL_MS) < EVICT_IDLE_MS)
			continue;
		seen = now;
		idle = 0;
		/* Directories are only ever added: walking the list is safe. */
		pthread_mutex_lock(&ctx->evict_lock);
		d = ctx->evict_dirs;
		pthread_mutex_unlock(&ctx->evict_lock);
		for (; d; d = d->next) {
			struct blob_cache_limit lim;

			pthread_mutex_lock(&ctx->evict_lock);
			lim = d->lim;
			pthread_mutex_unlock(&ctx->evict_lock);
			if ((lim.max_size || lim.min_free_pct) &&
			    ferry_now_ns() >= d->next_ns)
				enforce(d, &lim);
			record(d, &lim, false); /* the last evictions' total */
		}
	}
	return NULL;
}

int evict_register(struct serve_ctx *ctx, const struct ctl_mount_req *req)
{
	struct blob_cache_limit lim;
	struct evict_dir *d;
	int ret = 0;

	pthread_mutex_lock(&ctx->evict_lock);
	for (d = ctx->evict_dirs; d && strcmp(d->path, req->cache_dir); d = d->next)
		;
	if (!d) {
		d = calloc(1, sizeof(*d));
		if (!d || !(d->path = strdup(req->cache_dir))) {
			free(d);
			ret = -ENOMEM;
			goto out;
		}
		d->ctx = ctx;
		d->lim = ctx->evict_defaults;
		d->next = ctx->evict_dirs;
		ctx->evict_dirs = d;
	}
	/* What a request says holds for the directory from now on. */
	if (req->cache_max_size)
		d->lim.max_size = req->cache_max_size;
	if (req->cache_min_free >= 0)
		d->lim.min_free_pct = (unsigned int)req->cache_min_free;
	lim = d->lim;
	if (!ctx->evict_started) {
		ret = -pthread_create(&ctx->evict_thread, NULL, evict_main, ctx);
		if (!ret) {
			ctx->evict_started = true;
		} else {
			ferry_err("cannot start the cache eviction thread: %s",
				  ferry_strerror(ret));
		}
	}
out:
	pthread_mutex_unlock(&ctx->evict_lock);
	if (!ret)
		record(d, &lim, true);
	return ret;
}
