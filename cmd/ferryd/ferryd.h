/* SPDX-License-Identifier: MIT */
/*
 * ferryd: the lazy-mount daemon. One process hosts any number of lazy
 * mounts of ferry images, each served in one of its modes (mode.h): FUSE,
 * fanotify (kernel EROFS over sparse cache files) or cachefiles (kernel
 * EROFS over fscache); ferry (the CLI)
 * talks to it over the control socket (cmd/ctl.h).
 *
 *   main.c     options, daemonizing, readiness pipe
 *   daemon.c   control socket, connections, signals, shutdown
 *   mounts.c   the mount table: mount, unmount, per-mount loop threads,
 *              whatever the mode (mode.h)
 *   mode.c     the table of serving modes
 *   prefetch.c the per-mount prefetch thread
 *   metrics.c  Prometheus text of the mounts' statistics, HTTP endpoint
 *   fuse.c     FUSE mode: the FUSE low-level operations over pkg-meta /
 *              image_cache, session and mount, takeover (fusefs.h)
 *   fuse_shim.c  FUSE takeover steps libfuse lacks: INIT, RESEND
 *   readahead.c  FUSE mode: stores the next files of a directory being
 *              read in order in the page cache
 *   fanotify.c fanotify mode: marks, mount(2), event loop, fill threads
 *   keeper.c   starting and stopping mounts' keepers (ferryd-keeper,
 *              keeper.h), which hold a FUSE connection, fanotify group
 *              or /dev/cachefiles when ferryd dies and hand it to a
 *              successor
 *   keeper_main.c  the keepers' program, ferryd-keeper (its own binary)
 *   succession.c  what ferryd and ferryd-keeper share (keeper.h)
 *   fanfill.c  fanotify events: range, ferry's own fills (fanotify.h)
 *   cachefiles.c  cachefiles mode: /dev/cachefiles, mount(2), OPEN/READ/
 *              CLOSE requests
 *   log.c      log lines (timestamps in the log file) and per-thread
 *              capture of error lines for control answers
 */
#ifndef FERRYD_H
#define FERRYD_H

#include <json-c/json.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "../../pkg-base/base.h"
#include "../../pkg-image/image.h"
#include "../ctl.h"
#include "keeper.h"
#include "mode.h"

#define FERRYD_VERSION FERRY_VERSION
#define FERRYD_DEFAULT_THREADS 16u  /* FUSE worker threads per mount */
#define FERRYD_MAX_THREADS 256u
#define FERRYD_DEFAULT_READAHEAD_KB 1024u
#define FERRYD_DEFAULT_DIR_READAHEAD_KB 2048u
#define FERRYD_METRICS_LISTEN_MAX 4u
#define FERRYD_DEFAULT_CACHE_MIN_FREE 10u /* % of the cache's file system */

/* ------------------------------------------------------------------ */
/* mounts.c / prefetch.c                                               */
/* ------------------------------------------------------------------ */

enum mount_state { MS_MOUNTING, MS_LIVE, MS_DETACHED, MS_STOPPING };
enum prefetch_state { PF_NONE, PF_RUNNING, PF_DONE, PF_STOPPED, PF_FAILED };

struct fmount {
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

	pthread_mutex_t lock;
	pthread_cond_t cond;
	pthread_t loop_thread, prefetch_thread;
	bool ready, loop_ended, prefetch_started; /* lock */

	volatile bool stop;             /* prefetch stops when set */
	_Atomic bool quiesced;          /* mounts_quiesce: the session keeps all */
	_Atomic bool fetch_cancel;      /* ends its fetches (req.fetch.cancel) */
	_Atomic int pstate;             /* enum prefetch_state */
	_Atomic uint64_t prefetch_ns;   /* duration once finished */
	_Atomic uint64_t prefetch_files; /* files prefetched */
};

void mounts_init(unsigned int threads, unsigned int readahead_kb,
		 unsigned int dir_readahead_kb, const char *socket_path,
		 const char *const *successor_args, void (*on_change)(void));
/*
 * Mount per @req (taken over, also on failure); the reason in @err, and
 * what is mounted in @rep (may be NULL) but its pid.
 */
int mounts_mount(struct ctl_mount_req *req, struct ctl_mount_reply *rep,
		 char *err, size_t errlen);
int mounts_umount(const struct ctl_umount_req *req, char *err, size_t errlen);
/* The mounts of a list answer (ctl_list_reply_free frees them). */
int mounts_list(struct ctl_mount_stats **mounts, size_t *nr);
size_t mounts_count(void);
/*
 * Failover counters of this ferryd (metrics): mounts of @mode it took
 * over from a dead or replaced ferryd, and keepers it started again after
 * one died.
 */
void mounts_note_takeover(const char *mode);
unsigned int mounts_takeovers(const char *mode);
extern _Atomic unsigned int keeper_restarts;
/*
 * Unmount everything (detach what is busy) and end every session,
 * waiting a few seconds at most: the mounts whose session is still
 * running (a worker inside a stalled fetch) are returned; the caller
 * then exits without further cleanup (the kernel closes their FUSE
 * connections; fanotify mounts stay with their keepers).
 */
size_t mounts_shutdown(void);
/* The modes' startup ops (mode.h), with the options mounts_init got. */
void mounts_startup(void);
/*
 * Before exiting for an upgrade: each live mount whose mode can
 * (serve_mode.quiesce) stops taking requests, keeping its mount and
 * keeper, and its session ends without tearing anything down; returns
 * once they ended or @wait_ms passed. @early: only the modes that must
 * quiesce before the new ferryd starts (serve_mode.quiesce_early); else
 * the rest, once it listens.
 */
void mounts_quiesce(bool early, unsigned int wait_ms);

/*
 * Before eviction in @cache_dir: each mount of it whose mode has an
 * evicting op makes sure its reads of what gets punched reach ferryd:
 * 0, or -errno when one cannot (then nothing may be evicted).
 */
int mounts_evicting(const char *cache_dir);

/* ------------------------------------------------------------------ */
/* evict.c: the chunk caches' size limits                              */
/* ------------------------------------------------------------------ */

/* ferryd's --cache-max-size (0: none) and --cache-min-free (%, 0: none). */
void evict_init(uint64_t max_size, unsigned int min_free_pct);
/*
 * A mount of @req->cache_dir: keep that directory within its limits from
 * now on (the request's, else ferryd's). 0 or -errno.
 */
int evict_register(const struct ctl_mount_req *req);
/*
 * Held by eviction from before it asks the modes (mounts_evicting) until
 * it is done: a mode that stops watching a complete blob takes it, so the
 * blob is never both unwatched and punched.
 */
void evict_marks_lock(void);
void evict_marks_unlock(void);

/* prefetch.c: the thread body (arg: struct fmount *). */
void *prefetch_main(void *arg);

/* ------------------------------------------------------------------ */
/* log.c                                                               */
/* ------------------------------------------------------------------ */

/*
 * Route stderr (ferry_log) and libfuse's log through ferryd's writer:
 * @timestamps prefixes lines (the log file); fd 2 is the destination.
 */
int log_init(bool timestamps);

/* Error lines logged by this thread between begin and end. */
struct log_capture {
	struct log_capture *prev;
	char text[4096]; /* "; "-joined, "ferry: error: " removed */
	size_t len;
	bool partial;    /* inside an error line */
	bool skipping;   /* inside another line */
};
void log_capture_begin(struct log_capture *c);
void log_capture_end(struct log_capture *c);

/* ------------------------------------------------------------------ */
/* keeper.c: processes that keep a descriptor open when ferryd dies    */
/* and hand it to a successor                                          */
/* ------------------------------------------------------------------ */

/*
 * Start "ferryd-keeper HOW FD SOCK ARGS..." (keeper.h; ARGS
 * NULL-terminated): double-forked in a session of its own (init reaps
 * it; a terminal's ^C is for ferryd) with descriptor @fd and one end of a
 * SOCK_SEQPACKET pair; 0 once it said hello: *@sock our end, *@pid its
 * pid. At most KEEPER_ARGS_MAX ARGS.
 */
int keeper_spawn(const char *how, int fd, const char *const *args, int *sock,
		 int *pid);

/*
 * A mount's keeper (fuse.c, fanotify.c): "ferryd-keeper HOW FD ARGS... SOCKET
 * OPTION..." (ARGS NULL-terminated; SOCKET and OPTION: ferryd's socket
 * and a successor's options, from @o), then the mount's request as a
 * successor is to get it (keeper_handover). 0 or -errno (no keeper).
 */
int keeper_start_mount(const char *how, int fd, const struct fmount *m,
		       const struct serve_opts *o, const char *const *args, int *sock,
		       int *pid);
/*
 * A mount's keeper, kept: a thread starts it (spawning takes a while, the
 * mount need not wait) and another one whenever it dies; stop (any
 * thread, once or more) says "bye" and waits until it has let the
 * descriptor go.
 */
struct keeper_guard {
	const char *how;
	int fd;
	const struct fmount *m;
	const struct serve_opts *o;
	int stop[2];
	int sock; /* the first keeper's, for the guard's thread */
	pthread_t thread;
	_Atomic bool started;
	_Atomic int pid; /* the keeper now, 0: none */
};
int keeper_guard_start(struct keeper_guard *g, const char *how, int fd,
		       const struct fmount *m, const struct serve_opts *o);
void keeper_guard_stop(struct keeper_guard *g);
/* Tell a mount's keeper to let go, and wait until it has: *@sock closed. */
int keeper_bye(int *sock);

/* ------------------------------------------------------------------ */
/* daemon.c                                                            */
/* ------------------------------------------------------------------ */

struct daemon_opts {
	const char *socket_path;
	const char *log_path;   /* daemon mode */
	struct ctl_mount_req *mount; /* --mount: mount this at start (taken over),
				      * exit when none is left */
	bool foreground;
	bool exist_ok;          /* another ferryd on the socket is success */
	unsigned int threads;
	unsigned int readahead_kb;
	unsigned int dir_readahead_kb;
	uint64_t cache_max_size;     /* --cache-max-size, 0: none */
	unsigned int cache_min_free; /* --cache-min-free (%) */
	int ready_fd;           /* daemon mode: "OK\n" once listening, then closed */
	int adopt_fd;           /* --cachefiles-adopt: /dev/cachefiles of a dead
				 * ferryd, whose mounts to take over; -1 */
	unsigned int idle_timeout; /* exit after this many seconds without
				    * mounts or clients; 0: never */
	const char *metrics_listen[FERRYD_METRICS_LISTEN_MAX]; /* --metrics-listen */
	unsigned int nr_metrics_listen;
};
int daemon_run(const struct daemon_opts *o);
/* What a ping answers: pid, version, socket, start, memory, lifecycle. */
void daemon_info(struct ctl_ping_reply *r);
/* Control connections open now. */
unsigned int daemon_connections(void);
/* The process's resident memory now and at its peak, in bytes. */
void daemon_memory(uint64_t *rss, uint64_t *peak);

/* ------------------------------------------------------------------ */
/* metrics.c                                                           */
/* ------------------------------------------------------------------ */

/* The Prometheus text exposition of ferryd and its mounts (malloc'ed). */
int metrics_text(char **out);
/* Serve it over HTTP on @addr ("unix:/PATH" or "HOST:PORT"); 0 or -errno. */
int metrics_start(const char *addr);

/* ------------------------------------------------------------------ */
/* cachefiles.c: failover                                              */
/* ------------------------------------------------------------------ */

/*
 * The successor: take over /dev/cachefiles (@devfd) and the cachefiles
 * mounts the dead ferryd recorded next to the socket, then have the
 * kernel send again what was pending ("restore"). Mounts that cannot be
 * taken over, and all when none can, fail their reads with EIO.
 */
void cachefiles_adopt(int devfd, const char *socket_path);

#endif
