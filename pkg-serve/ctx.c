// SPDX-License-Identifier: MIT
/*
 * The serving context (serve.h): ferryd's options, the mount table, the
 * failover counters, eviction and each mode's own state; and the options
 * a successor ferryd is started with.
 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "internal.h"

/*
 * The options a successor (a keeper's start of ferryd, which adds
 * --socket and, for cachefiles, --cachefiles-takeover) starts with: this
 * ferryd's serving options, log file and level; not what only a first
 * start does (-f, --mount, --exist-ok).
 */
static void successor_args_make(struct serve_ctx *ctx)
{
	const struct serve_opts *o = &ctx->opts;
	char (*num)[24] = ctx->successor_nums;
	const char **a = ctx->successor_args;
	unsigned int n = 0, i;
	int level;

	snprintf(num[0], sizeof(num[0]), "%u", o->fuse.threads);
	snprintf(num[1], sizeof(num[1]), "%u", o->fuse.readahead_kb);
	snprintf(num[2], sizeof(num[2]), "%u", o->fuse.dir_readahead_kb);
	snprintf(num[3], sizeof(num[3]), "%llu", (unsigned long long)o->cache_max_size);
	snprintf(num[4], sizeof(num[4]), "%u", o->cache_min_free);
	snprintf(num[5], sizeof(num[5]), "%u", o->idle_timeout);
	a[n++] = "--log-file", a[n++] = o->log_path;
	a[n++] = "--threads", a[n++] = num[0];
	a[n++] = "--readahead", a[n++] = num[1];
	a[n++] = "--dir-readahead", a[n++] = num[2];
	a[n++] = "--cache-max-size", a[n++] = num[3];
	a[n++] = "--cache-min-free", a[n++] = num[4];
	a[n++] = "--idle-timeout", a[n++] = num[5];
	for (i = 0; i < o->nr_metrics_listen; i++)
		a[n++] = "--metrics-listen", a[n++] = o->metrics_listen[i];
	if (ferry_log_level < FERRY_LOG_INFO)
		a[n++] = "-q";
	for (level = ferry_log_level; level > FERRY_LOG_INFO; level--)
		a[n++] = "-v";
	a[n] = NULL;
}

const char *const *serve_successor_args(const struct serve_ctx *ctx)
{
	return ctx->successor_args;
}

int serve_ctx_new(const struct serve_opts *o, void (*on_change)(void *arg), void *arg,
		  struct serve_ctx **out)
{
	struct serve_ctx *ctx = calloc(1, sizeof(*ctx));
	unsigned int i;
	int ret = 0;

	if (!ctx)
		return -ENOMEM;
	ctx->opts = *o;
	if (ctx->opts.nr_metrics_listen > SERVE_METRICS_LISTEN_MAX)
		ctx->opts.nr_metrics_listen = SERVE_METRICS_LISTEN_MAX;
	ctx->on_change = on_change;
	ctx->on_change_arg = arg;
	pthread_mutex_init(&ctx->lock, NULL);
	pthread_cond_init(&ctx->cond, NULL);
	pthread_mutex_init(&ctx->evict_lock, NULL);
	pthread_mutex_init(&ctx->marks_lock, NULL);
	successor_args_make(ctx);
	evict_init(ctx);
	for (i = 0; !ret && i < SERVE_NR_MODES; i++)
		if (serve_modes[i]->init)
			ret = serve_modes[i]->init(ctx, &ctx->mode_ctx[i]);
	if (ret) {
		serve_ctx_free(ctx);
		return ret;
	}
	*out = ctx;
	return 0;
}

void serve_ctx_free(struct serve_ctx *ctx)
{
	unsigned int i;

	if (!ctx)
		return;
	for (i = 0; i < SERVE_NR_MODES; i++)
		if (serve_modes[i]->fini && ctx->mode_ctx[i])
			serve_modes[i]->fini(ctx->mode_ctx[i]);
	evict_stop(ctx);
	pthread_mutex_destroy(&ctx->lock);
	pthread_cond_destroy(&ctx->cond);
	pthread_mutex_destroy(&ctx->evict_lock);
	pthread_mutex_destroy(&ctx->marks_lock);
	free(ctx);
}

void serve_startup(struct serve_ctx *ctx)
{
	unsigned int i;

	for (i = 0; i < SERVE_NR_MODES; i++)
		if (serve_modes[i]->startup)
			serve_modes[i]->startup(ctx, ctx->mode_ctx[i]);
}

void serve_takeover_device(struct serve_ctx *ctx, int fd)
{
	unsigned int i;

	for (i = 0; i < SERVE_NR_MODES; i++) {
		if (serve_modes[i]->takeover_device) {
			serve_modes[i]->takeover_device(ctx, ctx->mode_ctx[i], fd);
			return;
		}
	}
	close(fd);
}
