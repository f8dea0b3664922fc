/* SPDX-License-Identifier: MIT */
/*
 * Internal to pkg-serve: the serving context, a mount, and what its files
 * share. The files:
 *
 *   mounts.c   the mount table: mount, unmount, list, shutdown, the
 *              per-mount loop threads, whatever the mode (mode.h)
 *   ctx.c      the serving context; the options a successor gets
 *   mode.c     the table of serving modes
 *   prefetch.c the per-mount prefetch thread
 *   evict.c    the chunk caches' size limits
 *   metrics.c  the Prometheus text of the mounts' statistics
 *   fuse.c     FUSE mode: the FUSE low-level operations over pkg-meta /
 *              image_cache, session and mount, takeover (fusefs.h)
 *   fuse_shim.c  FUSE takeover steps libfuse lacks: INIT, RESEND
 *   dir_readahead.c  FUSE mode: stores the next files of a directory
 *              being read in order in the page cache
 *   record.c   FUSE mode: --record, the files a workload reads
 *   fanotify.c fanotify mode: marks, mount(2), event loop, fill threads
 *   fanfill.c  fanotify events: range, ferry's own fills (fanotify.h)
 *   cachefiles.c  cachefiles mode: /dev/cachefiles, mount(2), OPEN/READ/
 *              CLOSE requests
 *   cachefiles_names.c  the names fscache knows its objects by, and which
 *              mount an object belongs to (cachefiles.h; pure)
 *   keeper.c   starting and stopping mounts' keepers (ferryd-keeper,
 *              keeper.h), which hold a FUSE connection, fanotify group
 *              or /dev/cachefiles when ferryd dies and hand it to a
 *              successor
 *   keeper_main.c  the keepers' program, ferryd-keeper
 *   succession.c  what ferryd and ferryd-keeper share (keeper.h)
 */
#ifndef FERRY_SERVE_INTERNAL_H
#define FERRY_SERVE_INTERNAL_H

#include <json-c/json.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "../pkg-base/base.h"
#include "../pkg-blob/blob.h"
#include "../pkg-image/image.h"
#include "keeper.h"
#include "mode.h"
#include "serve.h"

/* ------------------------------------------------------------------ */
/* The serving context                                                 */
/* ------------------------------------------------------------------ */

struct evict_dir;

struct serve_ctx {
	struct serve_opts opts;
	/* serve_successor_args: the options and their numbers' text. */
	const char *successor_args[16 + 2 * SERVE_METRICS_LISTEN_MAX];
	char successor_nums[6][24];
	void (*on_change)(void *arg);
	void *on_change_arg;

	/* The mount table (mounts.c). */
	pthread_mutex_t lock;   /* the list, refs and states */
	pthread_cond_t cond;
	struct fmount *mounts;
	bool shutting_down;

	/* Failover counters (metrics): mounts of each mode (slot) taken
	 * over from a dead or replaced ferryd; keepers started again after
	 * one died. */
	_Atomic unsigned int takeovers[SERVE_NR_MODES];
	_Atomic unsigned int keeper_restarts;
	_Atomic bool keeper_missing_told; /* keeper_spawn said it once */

	/* The chunk caches' limits (evict.c). */
	pthread_mutex_t evict_lock;     /* the list and each directory's limit */
	struct evict_dir *evict_dirs;   /* only ever added */
	struct blob_cache_limit evict_defaults;
	pthread_t evict_thread;
	bool evict_started;
	_Atomic bool evict_quit;
	pthread_mutex_t marks_lock;     /* evict_marks_lock */

	void *mode_ctx[SERVE_NR_MODES]; /* each mode's own (mode_state) */
};

/* ------------------------------------------------------------------ */
/* A mount (mounts.c, prefetch.c)                                      */
/* ------------------------------------------------------------------ */

enum mount_state { MS_MOUNTING, MS_LIVE, MS_DETACHED, MS_STOPPING };
enum prefetch_state { PF_NONE, PF_RUNNING, PF_DONE, PF_STOPPED, PF_FAILED };

struct fmount {
	struct serve_ctx *ctx;
	struct fmount *next;            /* table */
	unsigned int refs;              /* table lock */
	bool removed;                   /* table lock: out of the table */
	bool closed;                    /* table lock: ic closed, use final */
	bool session_closed;            /* table lock: the mode's session gone */
	enum mount_state state;         /* table lock */
	struct image_cache_stats final;

	struct ctl_mount_req req;       /* owns the strings below */
	char *mountpoint;               /* canonical */
	struct image *img;
	struct image_cache *ic;
	const struct serve_mode *mode;  /* per req.mode */
	char mode_why[CTL_REASON_MAX];  /* "auto": why this mode */
	void *mode_state;               /* the mode's; NULL (table lock) once closed */
	unsigned int dev_major, dev_minor;
	char fstype[64];       /* its type there: the mode's, or overlay */
	int64_t mounted_at;             /* unix seconds */
	char image_digest[DIGEST_STRING_SIZE]; /* the image served: req.image_digest */
	char index_digest[DIGEST_STRING_SIZE]; /* its ferry index: req.index_digest */

	pthread_mutex_t lock;
	pthread_cond_t cond;
	pthread_t loop_thread, prefetch_thread;
	bool ready, loop_ended, prefetch_started; /* lock */

	_Atomic bool stop;              /* prefetch stops when set */
	_Atomic bool quiesced;          /* serve_quiesce: the session keeps all */
	_Atomic bool fetch_cancel;      /* ends its fetches (req.fetch.cancel) */
	_Atomic int pstate;             /* enum prefetch_state */
	_Atomic uint64_t prefetch_ns;   /* duration once finished */
	_Atomic uint64_t prefetch_files; /* files prefetched */
};

/*
 * Before eviction in @cache_dir: each mount of it whose mode has an
 * evicting op makes sure its reads of what gets punched reach ferryd:
 * 0, or -errno when one cannot (then nothing may be evicted).
 */
int mounts_evicting(struct serve_ctx *ctx, const char *cache_dir);

/* prefetch.c: the thread body (arg: struct fmount *). */
void *prefetch_main(void *arg);

/* ------------------------------------------------------------------ */
/* evict.c: the chunk caches' size limits                              */
/* ------------------------------------------------------------------ */

/* The limits of @ctx->opts; evict_stop ends the thread (serve_ctx_free). */
void evict_init(struct serve_ctx *ctx);
void evict_stop(struct serve_ctx *ctx);
/*
 * A mount of @req->cache_dir: keep that directory within its limits from
 * now on (the request's, else ferryd's). 0 or -errno.
 */
int evict_register(struct serve_ctx *ctx, const struct ctl_mount_req *req);
/*
 * Held by eviction from before it asks the modes (mounts_evicting) until
 * it is done: a mode that stops watching a complete blob takes it, so the
 * blob is never both unwatched and punched.
 */
void evict_marks_lock(struct serve_ctx *ctx);
void evict_marks_unlock(struct serve_ctx *ctx);

/* ------------------------------------------------------------------ */
/* metrics.c                                                           */
/* ------------------------------------------------------------------ */

/* What the metrics text shows (serve_metrics_text gathers it). */
struct serve_metrics {
	const struct ctl_ping_reply *daemon;
	unsigned int connections;
	const struct ctl_mount_stats *mounts;
	size_t nr_mounts;
	const char *modes[SERVE_NR_MODES];       /* the table's names */
	unsigned int takeovers[SERVE_NR_MODES];  /* per mode */
	unsigned int keeper_restarts;
};
/* The text of @in, malloc'ed into *@out: 0 or -ENOMEM. */
int serve_metrics_render(const struct serve_metrics *in, char **out);

/* ------------------------------------------------------------------ */
/* keeper.c: processes that keep a descriptor open when ferryd dies    */
/* and hand it to a successor                                          */
/* ------------------------------------------------------------------ */

/*
 * Start "ferryd-keeper HOW FD SOCK ARGS..." (keeper.h; ARGS
 * NULL-terminated): in a session of its own, not our child (init reaps
 * it; a terminal's ^C is for ferryd) with descriptor @fd and one end of a
 * SOCK_SEQPACKET pair; 0 once it said hello: *@sock our end, *@pid its
 * pid. At most KEEPER_ARGS_MAX ARGS.
 */
int keeper_spawn(struct serve_ctx *ctx, const char *how, int fd, const char *const *args,
		 int *sock, int *pid);

/*
 * A mount's keeper (fuse.c, fanotify.c): "ferryd-keeper HOW FD ARGS... SOCKET
 * OPTION..." (ARGS NULL-terminated; SOCKET and OPTION: ferryd's socket
 * and a successor's options), then the mount's request as a successor is
 * to get it (keeper_handover). 0 or -errno (no keeper).
 */
int keeper_start_mount(const char *how, int fd, const struct fmount *m,
		       const char *const *args, int *sock, int *pid);
/*
 * A keeper, kept: a thread starts another one whenever it dies; stop (any
 * thread, once or more) says "bye" and waits until it has let the
 * descriptor go. A mount's (keeper_guard_start: the first keeper is
 * started before it returns, so that a kill -9 right after the mount
 * finds the descriptor held), or the cachefiles device's
 * (keeper_guard_start_dev: @spawn starts one; the first from the thread,
 * as spawning takes a while and the mount need not wait).
 */
struct keeper_guard {
	const char *how;
	int fd;
	const struct fmount *m; /* NULL: the device's */
	int (*spawn)(void *arg, int *sock, int *pid);
	void *arg;
	struct serve_ctx *ctx;
	const char *name; /* in messages: the mount point, or the device */
	int stop[2];
	int sock; /* the first keeper's, for the guard's thread */
	pthread_t thread;
	_Atomic bool started;
	_Atomic int pid; /* the keeper now, 0: none */
};
int keeper_guard_start(struct keeper_guard *g, const char *how, int fd,
		       const struct fmount *m);
int keeper_guard_start_dev(struct keeper_guard *g, struct serve_ctx *ctx, const char *name,
			   int (*spawn)(void *arg, int *sock, int *pid), void *arg);
void keeper_guard_stop(struct keeper_guard *g);
/* Tell a mount's keeper to let go, and wait until it has: *@sock closed. */
int keeper_bye(int *sock);

#endif
