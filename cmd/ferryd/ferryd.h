/* SPDX-License-Identifier: MIT */
/*
 * ferryd: the lazy-mount daemon. One process hosts any number of lazy
 * mounts of ferry images, FUSE or fanotify (kernel EROFS over sparse
 * cache files); ferry (the CLI) talks to it over the control socket
 * (cmd/ctl.h).
 *
 *   main.c     options, daemonizing, readiness pipe
 *   daemon.c   control socket, connections, signals, shutdown
 *   mounts.c   the mount table: mount, unmount, per-mount session loops
 *   prefetch.c the per-mount prefetch thread
 *   fuse.c     the FUSE low-level operations over pkg-meta / image_cache
 *   readahead.c  FUSE mounts: stores the next files of a directory being
 *              read in order in the page cache
 *   fanotify.c fanotify mode: marks, mount(2), event loop, fill threads
 *   keeper.c   the process that keeps a fanotify group open (fanotify.h)
 *   log.c      log lines (timestamps in the log file) and per-thread
 *              capture of error lines for control answers
 */
#ifndef FERRYD_H
#define FERRYD_H

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <json-c/json.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "../../pkg-base/base.h"
#include "../../pkg-image/image.h"
#include "../ctl.h"

#define FERRYD_VERSION FERRY_VERSION
#define FERRYD_DEFAULT_THREADS 16u  /* FUSE worker threads per mount */
#define FERRYD_MAX_THREADS 256u
#define FERRYD_DEFAULT_READAHEAD_KB 1024u
#define FERRYD_DEFAULT_DIR_READAHEAD_KB 2048u

/* ------------------------------------------------------------------ */
/* fuse.c                                                              */
/* ------------------------------------------------------------------ */

struct open_file;

/* What the FUSE operations of one mount serve. */
struct fs {
	struct image *img;
	struct image_cache *ic;
	uint64_t root_nid;
	uint64_t inos;        /* statfs */
	uint64_t total_bytes; /* statfs: bootstrap plus uncompressed blobs */
	void (*on_init)(void *arg); /* called from the INIT request */
	void *arg;
	bool no_open;          /* the kernel skips OPEN/RELEASE (fs_open) */
	bool no_opendir;       /* and OPENDIR/RELEASEDIR (fs_opendir) */
	pthread_mutex_t fail_lock; /* the last failed read (failed_recently) */
	uint64_t failed_nid, failed_chunk, failed_until;
	uint32_t dra_window_max; /* directory readahead, bytes; 0: off */
	struct dra *dra;         /* readahead.c, while the session lives */
	_Atomic uint64_t ra_files, ra_bytes; /* stored by readahead */
};

/* The FUSE inode number of nid @nid. */
fuse_ino_t fs_ino(const struct fs *fs, uint64_t nid);

/* Fill @fs's fields derived from img (root nid, statfs numbers). */
void fs_setup(struct fs *fs, struct image *img, struct image_cache *ic);
/* After the session is destroyed: free what fs_setup set up. */
void fs_teardown(struct fs *fs);

/*
 * A session serving @fs (not mounted yet), with directory readahead when
 * fs->dra_window_max is set; NULL after a log line.
 */
struct fuse_session *fs_session_new(struct fs *fs);
/*
 * After its loop has ended: end the connection (requests still pending
 * fail), stop directory readahead, free the session.
 */
void fs_session_destroy(struct fs *fs, struct fuse_session *se);

/*
 * Mount @se on @mountpoint: type fuse.ferry, source ferry:<image>,
 * options ro, default_permissions, allow_other (suid and devices allowed,
 * as for a kernel mount of the image). 0 or -errno after a log line.
 */
int fs_mount(struct fs *fs, struct fuse_session *se, const char *mountpoint);

/*
 * Resolve @path inside the image, following symlinks (at most 40, targets
 * relative to the image root): 0 and *@nid, or -errno.
 */
int fs_resolve(const struct fs *fs, const char *path, uint64_t *nid);

/*
 * readahead.c: directory readahead (see there). dra_start creates its
 * thread (nothing when @window_max is 0); the hooks are called by the
 * FUSE operations: dra_listed for each regular file a READDIRPLUS answer
 * lists (@prev_nid: the one listed before it in that answer, or 0;
 * @from_start: the answer starts the directory), dra_read for each READ
 * at offset 0. dra_stop once no operation runs and the connection has
 * ended (a store may wait on a page that only the end releases).
 */
struct dra;
int dra_start(struct fs *fs, struct fuse_session *se, uint32_t window_max);
void dra_listed(struct fs *fs, uint64_t dir, uint64_t nid, uint64_t next_pos,
		uint64_t prev_nid, bool from_start);
void dra_read(struct fs *fs, uint64_t nid);
void dra_stop(struct fs *fs);

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
	bool session_closed;            /* table lock: FUSE session gone */
	enum mount_state state;         /* table lock */
	struct image_cache_stats final;

	struct ctl_mount_req req;       /* owns the strings below */
	char *mountpoint;               /* canonical */
	struct image *img;
	struct image_cache *ic;
	struct fs fs;
	struct fuse_session *se;        /* FUSE mode */
	struct fan *fan;                /* fanotify mode (req.fanotify) */
	unsigned int dev_major, dev_minor;
	int64_t mounted_at;             /* unix seconds */

	pthread_mutex_t lock;
	pthread_cond_t cond;
	pthread_t loop_thread, prefetch_thread;
	bool init_done, loop_ended, prefetch_started; /* lock */

	volatile bool stop;             /* prefetch stops when set */
	_Atomic int pstate;             /* enum prefetch_state */
	_Atomic uint64_t prefetch_ns;   /* duration once finished */
	_Atomic uint64_t prefetch_files; /* files prefetched */
};

void mounts_init(unsigned int threads, unsigned int readahead_kb,
		 unsigned int dir_readahead_kb, void (*on_change)(void));
/* Mount per @req (taken over, also on failure); the reason in @err. */
int mounts_mount(struct ctl_mount_req *req, char *err, size_t errlen);
int mounts_umount(const char *mountpoint, bool lazy, char *err, size_t errlen);
/* The "mounts" array of a list answer. */
struct json_object *mounts_list(void);
size_t mounts_count(void);
/*
 * Unmount everything (detach what is busy) and end every session,
 * waiting a few seconds at most: the mounts whose session is still
 * running (a worker inside a stalled fetch) are returned; the caller
 * then exits without further cleanup (the kernel closes their FUSE
 * connections).
 */
size_t mounts_shutdown(void);

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
/* daemon.c                                                            */
/* ------------------------------------------------------------------ */

struct daemon_opts {
	const char *socket_path;
	const char *log_path;   /* daemon mode */
	const char *mount_json; /* --mount: mount this at start, exit when none left */
	bool foreground;
	bool exist_ok;          /* another ferryd on the socket is success */
	unsigned int threads;
	unsigned int readahead_kb;
	unsigned int dir_readahead_kb;
	int ready_fd;           /* daemon mode: "OK\n" once listening, then closed */
};
int daemon_run(const struct daemon_opts *o);

#endif
