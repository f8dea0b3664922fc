/* SPDX-License-Identifier: MIT */
/*
 * FUSE mode: the FUSE file system of one mount (fuse.c), its directory
 * readahead (dir_readahead.c) and recording (record.c). Private to those
 * files; the rest of pkg-serve sees only the mode (mode.h).
 */
#ifndef FERRY_SERVE_FUSEFS_H
#define FERRY_SERVE_FUSEFS_H

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include "internal.h"

/* A FUSE mount: what its operations serve (fuse_mode's state). */
struct fs {
	struct fmount *m;
	struct image *img;
	struct image_cache *ic;
	struct fuse_session *se;
	uint64_t root_nid;
	uint64_t inos;        /* statfs */
	uint64_t total_bytes; /* statfs */
	unsigned int threads;      /* workers of the session loop */
	unsigned int readahead_kb; /* the bdi's once live; 0: the kernel's */
	_Atomic bool no_open;    /* the kernel skips OPEN/RELEASE (fs_open): set at INIT */
	_Atomic bool no_opendir; /* and OPENDIR/RELEASEDIR (fs_opendir) */
	pthread_mutex_t fail_lock; /* the last failed read (failed_recently) */
	uint64_t failed_nid, failed_chunk, failed_until;
	uint32_t dra_window_max; /* directory readahead, bytes; 0: off */
	struct dra *dra;         /* dir_readahead.c, while the session lives */
	_Atomic uint64_t ra_files, ra_bytes; /* stored by directory readahead */
	struct recorder *rec;    /* record.c: --record; NULL: not recording */
	struct keeper_guard keeper; /* holds /dev/fuse for a successor */
};

/*
 * fuse_shim.c: a takeover's steps libfuse has no API for (see there).
 * fuse_shim_init: a FUSE_INIT request into @buf for
 * fuse_session_process_buf, its size (0: @len too small).
 * fuse_shim_resend: FUSE_NOTIFY_RESEND on @fd; 0 or -errno (-EINVAL:
 * a kernel before 6.9).
 */
size_t fuse_shim_init(void *buf, size_t len);
int fuse_shim_resend(int fd);

/* The FUSE inode number of nid @nid. */
fuse_ino_t fs_ino(const struct fs *fs, uint64_t nid);

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

/*
 * record.c: the prefetch list of a workload (--record). record_start walks
 * the image and creates the list at @path (after a message on failure);
 * record_read is called for every READ and writes the file's path the
 * first time; record_count: paths written.
 */
struct recorder;
int record_start(struct fs *fs, const char *path, struct recorder **out);
void record_read(struct recorder *r, uint64_t nid);
uint64_t record_count(struct recorder *r);
void record_free(struct recorder *r);

#endif
