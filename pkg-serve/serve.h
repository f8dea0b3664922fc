/* SPDX-License-Identifier: MIT */
/*
 * pkg-serve: ferry's serving core, the library under ferryd. It serves
 * lazy mounts of ferry images (pkg-image's chunk cache), each in one of its
 * modes: "fuse" (ferryd answers FUSE requests), "fanotify" (kernel EROFS
 * over the chunk cache's files, filled on pre-content events) or
 * "cachefiles" (kernel EROFS over fscache, its cache files filled on
 * /dev/cachefiles requests). It owns:
 *
 *  - the mount table: mount, unmount, list, shutdown, the mounts' loop
 *    and prefetch threads (mounts.c, prefetch.c);
 *  - the mode interface and the modes (mode.h; fuse.c, fanotify.c,
 *    cachefiles.c), which nothing outside their files names;
 *  - failover: the keepers, processes that hold a mount's kernel
 *    descriptor so that it outlives ferryd and hand it to a successor
 *    ferryd (keeper.c; the keepers' program is serve_keeper_main);
 *  - the chunk caches' size limits (evict.c), and the metrics text.
 *
 * One struct serve_ctx holds all of it: ferryd makes one. Requests come
 * as the control protocol's structs (cmd/ctl.h), which is what keepers and
 * a cachefiles successor are handed too.
 *
 * Errors: functions return 0 or a negative errno; a request's reason is
 * written into the caller's @err and logged (ferry_err).
 * Thread-safety: every serve_* function on one context may be called from
 * any thread at any time, but serve_ctx_free (no other call may run).
 */
#ifndef FERRY_SERVE_H
#define FERRY_SERVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../cmd/ctl.h"

#define SERVE_DEFAULT_THREADS 16u
#define SERVE_MAX_THREADS 256u
#define SERVE_DEFAULT_READAHEAD_KB 512u
#define SERVE_DEFAULT_DIR_READAHEAD_KB 2048u
#define SERVE_DEFAULT_CACHE_MIN_FREE 10u /* % of the cache's file system */
#define SERVE_METRICS_LISTEN_MAX 4u

/* The FUSE mode's options. */
struct serve_fuse_opts {
	unsigned int threads;          /* worker threads per mount */
	unsigned int readahead_kb;     /* kernel readahead of the mount's bdi; 0: the kernel's */
	unsigned int dir_readahead_kb; /* directory readahead's window; 0: off */
};

/*
 * ferryd's options: those the serving core applies, and all those a
 * successor ferryd is started with (serve_successor_args). The strings
 * must live as long as the context.
 */
struct serve_opts {
	const char *socket_path;      /* the control socket: keepers hand mounts over there */
	const char *log_path;         /* the log file */
	struct serve_fuse_opts fuse;
	uint64_t cache_max_size;      /* --cache-max-size, 0: none */
	unsigned int cache_min_free;  /* --cache-min-free (%), 0: none */
	unsigned int idle_timeout;    /* ferryd's own, passed on to a successor */
	const char *metrics_listen[SERVE_METRICS_LISTEN_MAX]; /* likewise */
	unsigned int nr_metrics_listen;
};

struct serve_ctx;

/*
 * A serving core with @o (copied; its strings are not). @on_change(@arg)
 * is called, from any thread, when a mount came or went.
 */
int serve_ctx_new(const struct serve_opts *o, void (*on_change)(void *arg), void *arg,
		  struct serve_ctx **out);
/* Free @ctx: before serve_startup, or once serve_shutdown returned 0. */
void serve_ctx_free(struct serve_ctx *ctx);

/*
 * Once ferryd listens and before it serves a request: what a successor
 * must take before its takeovers open descriptors (the modes' startup).
 */
void serve_startup(struct serve_ctx *ctx);
/*
 * A successor started with a device its keeper held (ferryd
 * --cachefiles-takeover FD): take over the device and the mounts the dead
 * ferryd recorded next to the socket. Mounts that cannot be taken over
 * fail their reads with EIO.
 */
void serve_takeover_device(struct serve_ctx *ctx, int fd);

/*
 * Mount per @req (taken over, also on failure; req->takeover: a keeper
 * handed the mount over, which is taken over, not mounted). 0 once the
 * kernel serves it, and what is mounted in @rep (may be NULL) but its
 * pid; else -errno and the reason in @err.
 */
int serve_mount(struct serve_ctx *ctx, struct ctl_mount_req *req, struct ctl_mount_reply *rep,
		char *err, size_t errlen);
/*
 * Open the image of @req as a mount would (its config too, so that an
 * indexed image's diff_ids are checked against it), mount nothing, and
 * hand what was found to @answer (its result returned; the reply borrows
 * from the image, closed afterwards); else -errno and the reason in @err.
 */
int serve_probe(const struct ctl_mount_req *req, char *err, size_t errlen,
		int (*answer)(const struct ctl_probe_reply *rep, void *arg), void *arg);
/*
 * Unmount per @req; with req->release, forget the image's record in its
 * cache unless another mount serves it from there.
 */
int serve_umount(struct serve_ctx *ctx, const struct ctl_umount_req *req, char *err,
		 size_t errlen);
/* The mounts of a list answer (ctl_list_reply_free frees them). */
int serve_list(struct serve_ctx *ctx, struct ctl_mount_stats **mounts, size_t *nr);
size_t serve_count(struct serve_ctx *ctx);
/*
 * Unmount everything (detach what is busy) and end every session,
 * waiting a few seconds at most: the mounts whose session is still
 * running (a worker inside a stalled fetch) are returned; the caller
 * then exits without further cleanup (the kernel closes their FUSE
 * connections; fanotify mounts stay with their keepers).
 */
size_t serve_shutdown(struct serve_ctx *ctx);

/*
 * Upgrade (ferry daemon upgrade). serve_keeper_succeeds: a mount is
 * served whose keeper becomes the successor itself (it holds a device the
 * new ferryd needs), so ferryd must only exit. serve_quiesce, before
 * exiting: each live mount whose mode can stops taking requests, keeping
 * its mount and keeper, and its session ends without tearing anything
 * down; returns once they ended or @wait_ms passed. @early: only the
 * modes that must stop before the new ferryd starts (serve_mode
 * .quiesce_early); else the rest, once it listens.
 */
bool serve_keeper_succeeds(struct serve_ctx *ctx);
void serve_quiesce(struct serve_ctx *ctx, bool early, unsigned int wait_ms);
/* The options a successor ferryd gets after its --socket: NULL-terminated. */
const char *const *serve_successor_args(const struct serve_ctx *ctx);

/*
 * The Prometheus text exposition (0.0.4) of ferryd (@daemon: what a ping
 * answers; @connections: control connections open) and its mounts,
 * malloc'ed into *@out.
 */
int serve_metrics_text(struct serve_ctx *ctx, const struct ctl_ping_reply *daemon,
		       unsigned int connections, char **out);

/*
 * The installed ferryd binary, next to this program (ferryd or
 * ferryd-keeper), also once replaced on disk (an upgrade: the path names
 * the new binary): 0 or -errno.
 */
int serve_ferryd_exe(char *buf, size_t len);

/* The keepers' program, ferryd-keeper (keeper.h): its main. */
int serve_keeper_main(int argc, char **argv);

#endif
