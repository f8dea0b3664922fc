// SPDX-License-Identifier: MIT
/*
 * Directory readahead for FUSE mounts. A program that reads the files of
 * a directory one after another (tar, cp -a, rsync, a scanner) pays one
 * READ round trip per file however small it is, and the kernel's
 * readahead never crosses into the next file. When a directory's files
 * are read in directory order, a thread of the mount stores the files
 * that follow in the kernel's page cache (FUSE_NOTIFY_STORE) while the
 * reader works on the current one, and the reader finds them there.
 *
 * What is stored comes from the chunk cache only (image_cache_read_cached:
 * present chunks, verified when they were fetched), so readahead never
 * fetches and never stores bytes a READ would refuse; a file whose chunks
 * are missing ends the window and is fetched by the reader's own READ.
 *
 * The pattern: READDIRPLUS answers record each regular file's directory,
 * position and successor (dra_listed). A READ at offset 0 of the first
 * regular file of a listing, or of the file a stream of that directory
 * expects next, starts a window after it; the reader then asks only for
 * the file the window ended at, which starts the next window, twice as
 * large, up to the mount's limit (like the kernel's readahead within a
 * file). Any other READ only sets what the stream expects, so random
 * reads store a window only when they hit a listing's first file.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fusefs.h"

#define DRA_STREAMS 8           /* directories followed at once */
#define DRA_JOBS 16             /* windows queued; more are dropped */
#define DRA_FILE_MAX (256u << 10) /* larger files: the kernel's readahead */
#define DRA_WINDOW_MIN (64u << 10)
#define DRA_WINDOW_FILES 256u   /* files per window at most */
#define DRA_HINTS_MAX (1u << 17)
#define DRA_PROBE 4             /* slots a hint may take; then it replaces */

/* A regular file as a READDIRPLUS answer listed it. */
struct dra_hint {
	uint64_t nid;      /* 0: free */
	uint64_t dir;
	uint64_t next_pos; /* the directory position after its entry */
	uint64_t next_nid; /* the next regular file of that answer, or 0 */
	bool first;        /* the first regular file of a listing from the start */
	bool read;         /* a READ came for it since it was listed */
	bool stored;       /* and readahead stored it */
};

/* A directory being read in order. */
struct dra_stream {
	uint64_t dir;
	uint64_t expect;   /* the file whose READ starts the next window */
	uint32_t window;   /* bytes of the next window */
	uint64_t used;     /* for replacing the least recently used */
};

struct dra_job {
	uint64_t dir, pos;
	uint32_t window;
	unsigned int stream;
};

struct dra {
	struct fs *fs;
	struct fuse_session *se;
	uint32_t window_max;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct dra_hint *hints; /* open addressing, DRA_PROBE slots per nid */
	size_t hint_mask;
	struct dra_stream streams[DRA_STREAMS];
	uint64_t tick;
	struct dra_job jobs[DRA_JOBS];
	unsigned int head, tail;
	_Atomic bool stop;  /* also read by window_fill, without the lock */
	pthread_t thread;
	uint8_t buf[DRA_FILE_MAX];
};

static size_t hint_home(const struct dra *d, uint64_t nid)
{
	/* Fibonacci hashing: nids are multiples of small inode sizes. */
	return (size_t)(nid * 0x9e3779b97f4a7c15ull >> 32) & d->hint_mask;
}

/* The hint for @nid, or NULL; lock held. */
static struct dra_hint *hint_find(struct dra *d, uint64_t nid)
{
	size_t i, home = hint_home(d, nid);

	for (i = 0; i < DRA_PROBE; i++) {
		struct dra_hint *h = &d->hints[(home + i) & d->hint_mask];

		if (h->nid == nid)
			return h;
	}
	return NULL;
}

/* The slot for a new hint of @nid: its old one, a free one, or its home
 * slot (whose hint is lost: that file is then never stored). */
static struct dra_hint *hint_slot(struct dra *d, uint64_t nid)
{
	struct dra_hint *h = hint_find(d, nid);
	size_t i, home = hint_home(d, nid);

	for (i = 0; !h && i < DRA_PROBE; i++)
		if (!d->hints[(home + i) & d->hint_mask].nid)
			h = &d->hints[(home + i) & d->hint_mask];
	return h ? h : &d->hints[home];
}

void dra_listed(struct fs *fs, uint64_t dir, uint64_t nid, uint64_t next_pos,
		uint64_t prev_nid, bool from_start)
{
	struct dra *d = fs->dra;
	struct dra_hint *h, *prev;

	if (!d || !nid)
		return;
	pthread_mutex_lock(&d->lock);
	h = hint_slot(d, nid);
	/* A new listing means the kernel dropped the entries, and with
	 * them the pages: the file may be stored again. */
	*h = (struct dra_hint){ .nid = nid, .dir = dir, .next_pos = next_pos,
				.first = from_start && !prev_nid };
	prev = prev_nid ? hint_find(d, prev_nid) : NULL;
	if (prev && prev->dir == dir)
		prev->next_nid = nid;
	pthread_mutex_unlock(&d->lock);
}

static struct dra_stream *stream_for(struct dra *d, uint64_t dir)
{
	struct dra_stream *s, *lru = &d->streams[0];

	for (s = d->streams; s < d->streams + DRA_STREAMS; s++) {
		if (s->dir == dir)
			return s;
		if (s->used < lru->used)
			lru = s;
	}
	*lru = (struct dra_stream){ .dir = dir, .window = DRA_WINDOW_MIN };
	return lru;
}

void dra_read(struct fs *fs, uint64_t nid)
{
	struct dra *d = fs->dra;
	struct dra_stream *s;
	struct dra_hint *h;
	bool start;

	if (!d)
		return;
	pthread_mutex_lock(&d->lock);
	h = hint_find(d, nid);
	/* A hint serves once: a READ of a file already read or stored
	 * since its listing means its pages were evicted, not a pattern. */
	if (!h || h->read || h->stored) {
		pthread_mutex_unlock(&d->lock);
		return;
	}
	h->read = true;
	s = stream_for(d, h->dir);
	s->used = ++d->tick;
	start = s->expect == nid || h->first;
	if (h->first && s->expect != nid)
		s->window = DRA_WINDOW_MIN;
	s->expect = h->next_nid;
	if (start && d->tail - d->head < DRA_JOBS) {
		d->jobs[d->tail++ % DRA_JOBS] = (struct dra_job){
			.dir = h->dir, .pos = h->next_pos, .window = s->window,
			.stream = (unsigned int)(s - d->streams),
		};
		s->expect = 0; /* set when the window is stored */
		s->window = (uint32_t)MIN((uint64_t)s->window * 2, d->window_max);
		pthread_cond_signal(&d->cond);
	}
	pthread_mutex_unlock(&d->lock);
}

/* A window being stored (meta_readdir context). */
struct dra_window {
	struct dra *d;
	uint32_t bytes, files, limit;
	uint64_t end_nid; /* the first file not stored, 0 at the end */
};

/* Store file @nid in the page cache: 0, or -EAGAIN to end the window there. */
static int store_file(struct dra *d, uint64_t nid, uint32_t *stored)
{
	struct fs *fs = d->fs;
	struct fuse_bufvec bv;
	struct meta_stat ms;
	struct dra_hint *h;
	bool done;
	ssize_t n;
	int ret;

	*stored = 0;
	pthread_mutex_lock(&d->lock);
	h = hint_find(d, nid);
	done = !h || h->read || h->stored;
	pthread_mutex_unlock(&d->lock);
	/* The reader got there first, or an earlier window; without a hint
	 * that is unknown, so the file is left to its READ. */
	if (done)
		return 0;
	ret = meta_getattr(fs->img->meta, nid, &ms);
	if (ret || !S_ISREG(ms.mode))
		return -EAGAIN;
	if (!ms.size)
		return 0;
	if (ms.size > DRA_FILE_MAX)
		return -EAGAIN;
	n = image_cache_read_cached(fs->ic, &ms, 0, d->buf, (size_t)ms.size);
	if (n != (ssize_t)ms.size)
		return -EAGAIN; /* not cached (or an error its READ will report) */
	bv = (struct fuse_bufvec)FUSE_BUFVEC_INIT((size_t)ms.size);
	bv.buf[0].mem = d->buf;
	/* -ENOENT: the kernel has forgotten the inode; nothing to do. */
	ret = fuse_lowlevel_notify_store(d->se, fs_ino(fs, nid), 0, &bv, 0);
	if (ret && ret != -ENOENT) {
		ferry_dbg("%s: readahead of inode %llu: %s", fs->img->ref,
			  (unsigned long long)nid, ferry_strerror(ret));
		return -EAGAIN;
	}
	if (ret)
		return 0;
	pthread_mutex_lock(&d->lock);
	h = hint_find(d, nid);
	if (h)
		h->stored = true;
	pthread_mutex_unlock(&d->lock);
	*stored = (uint32_t)ms.size;
	atomic_fetch_add(&fs->ra_files, 1);
	atomic_fetch_add(&fs->ra_bytes, ms.size);
	return 0;
}

static int window_fill(void *arg, const char *name, size_t len, uint64_t nid,
		       unsigned int file_type, uint64_t next_pos)
{
	struct dra_window *w = arg;
	uint32_t stored;

	if (meta_ftype_mode(file_type) != S_IFREG)
		return 0;
	if (w->d->stop || w->bytes >= w->limit || w->files >= DRA_WINDOW_FILES ||
	    store_file(w->d, nid, &stored)) {
		w->end_nid = nid;
		return 1;
	}
	w->bytes += stored;
	w->files++;
	return 0;
}

static void *dra_main(void *arg)
{
	struct dra *d = arg;

	pthread_mutex_lock(&d->lock);
	for (;;) {
		struct dra_job job;
		struct dra_window w;
		struct dra_stream *s;

		while (!d->stop && d->head == d->tail)
			pthread_cond_wait(&d->cond, &d->lock);
		if (d->stop)
			break;
		job = d->jobs[d->head++ % DRA_JOBS];
		pthread_mutex_unlock(&d->lock);

		w = (struct dra_window){ .d = d, .limit = job.window };
		meta_readdir(d->fs->img->meta, job.dir, job.pos, window_fill, &w);

		pthread_mutex_lock(&d->lock);
		s = &d->streams[job.stream];
		if (s->dir == job.dir && !s->expect)
			s->expect = w.end_nid;
	}
	pthread_mutex_unlock(&d->lock);
	return NULL;
}

int dra_start(struct fs *fs, struct fuse_session *se, uint32_t window_max)
{
	struct dra *d;
	size_t n = 1024;
	int ret;

	if (!window_max)
		return 0;
	d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	/* Twice the inodes: few hints lost to full probe runs. */
	while (n < 2 * fs->inos && n < DRA_HINTS_MAX)
		n <<= 1;
	ret = -ENOMEM;
	d->hints = calloc(n, sizeof(*d->hints));
	if (!d->hints)
		goto fail;
	d->hint_mask = n - 1;
	d->fs = fs;
	d->se = se;
	d->window_max = MAX(window_max, DRA_WINDOW_MIN);
	pthread_mutex_init(&d->lock, NULL);
	pthread_cond_init(&d->cond, NULL);
	ret = -pthread_create(&d->thread, NULL, dra_main, d);
	if (ret) {
		pthread_cond_destroy(&d->cond);
		pthread_mutex_destroy(&d->lock);
		goto fail;
	}
	fs->dra = d;
	return 0;
fail:
	free(d->hints);
	free(d);
	return ret;
}

void dra_stop(struct fs *fs)
{
	struct dra *d = fs->dra;

	if (!d)
		return;
	pthread_mutex_lock(&d->lock);
	d->stop = true;
	pthread_cond_signal(&d->cond);
	pthread_mutex_unlock(&d->lock);
	pthread_join(d->thread, NULL);
	fs->dra = NULL;
	pthread_cond_destroy(&d->cond);
	pthread_mutex_destroy(&d->lock);
	free(d->hints);
	free(d);
}
