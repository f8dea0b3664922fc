// SPDX-License-Identifier: MIT
/*
 * Blob writer. blob_writer_add gives each chunk its slot at once and
 * copies its bytes into a frame (layout in format.c): chunks shorter than
 * batch_small share a batch frame of at most batch_max bytes, so the codec
 * sees enough data to exploit the redundancy between small files; a bigger
 * chunk is a frame of its own. Closed frames are compressed by worker
 * threads and written strictly in frame order by whichever thread
 * completes the frame that is next in file order, hashing exactly the
 * bytes written so the blob digest is known the moment the footer is
 * written (no re-read).
 *
 * The file is a function of the sequence of adds and group switches alone:
 * frames are cut on the caller's thread by a rule that looks only at chunk
 * sizes and groups, each frame is compressed on its own with a codec
 * context reset per frame, and the frames are written in order. Thread
 * count and timing cannot change it.
 *
 * Hot group (blob_writer_hot): its frames are compressed at the codec's
 * densest practical level (blob_compress_hot), written to a staging file
 * as they complete and copied behind the others by blob_writer_finish,
 * with their slots after every other slot; the table stays sorted by uoff
 * and the frames consecutive (format.c), so readers see an ordinary blob.
 *
 * Frame policy (BLOB_BATCH_SMALL / BLOB_BATCH_MAX), measured on a Debian
 * minbase rootfs (170 MB tar, 60.5 MB tar.gz; its files > 256 bytes in tar
 * order, 1 MiB chunks, deduplicated: 5820 chunks, 160 MB) when zstd:3 was
 * the default codec (codec.c has today's, with these frames). Total blob
 * size / tar.gz size, batching chunks < small into frames <= max:
 *
 *   small:max    zstd:3  lz4    lzma:6
 *   no batching  1.024   1.400  0.839
 *   64K:64K      0.992   1.357  0.804
 *   64K:128K     0.975   1.346  0.788
 *   64K:256K     0.965   1.342  0.778
 *   64K:512K     0.960   1.340  0.774
 *   128K:128K    0.975   1.346  0.786
 *   128K:256K    0.950   1.341  0.766
 *   128K:512K    0.935   1.338  0.750
 *   256K:256K    0.950   1.342  0.764
 *   256K:512K    0.926   1.339  0.742
 *   256K:1M      0.909 (zstd:3; 1M:1M 0.906, 1M:2M 0.869)  <- the defaults
 *
 * With the default codec (codec.c), measured in OCI layouts (bootstrap
 * included) on minbase and on "big" (minbase + python3, perl, gcc; 142.5 MB
 * tar.gz): 128K:512K 0.908 and 0.939 of the tar.gz, 256K:1M (the
 * defaults) 0.882 and 0.926, at the same compression CPU time; frames
 * of 2 MiB would gain ~0.01 more but double what a read costs. A lazy
 * reader of one small file fetches and decodes at most 1 MiB, what reading
 * any part of a big file costs with the default 1 MiB chunks; files in
 * tar order that share a frame tend to be read together (one package, one
 * directory). Bigger frames compress faster than the per-file frames
 * they replace.
 *
 * Threads: frames in flight (filling, queued, compressing, or done and
 * waiting for an older frame to be written) are bounded by a window, and
 * blob_writer_add blocks while it is full. Frame seq s lives in window
 * slot s % nr_frames; the counters below say which frames are in which
 * state. One mutex guards them; the slow parts (copying into the open
 * frame, compressing, writing) run outside it. Slot buffers are reused.
 */
#include "internal.h"
#include "../pkg-base/base.h"

#include <pthread.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

/*
 * The window. As frames are written in order, the caller stalls whenever
 * the oldest frame is still compressing and the rest of the window is
 * done: measured on the rootfs above with 2 CPUs (medians of 6 runs), a
 * window of 2 frames per job made conversion ~1.3x as slow as `gzip -dc`,
 * 8 per job ~1.1x. So up to WINDOW_FRAMES frames per job as long as they
 * hold at most WINDOW_BYTES per job, and WINDOW_MIN_FRAMES per job
 * whatever their size, so that big chunks are compressed in parallel too:
 * with 1 MiB chunks, ~16 MiB (input and output) per job. Slot buffers
 * bigger than SLOT_KEEP are freed after use rather than kept in every
 * slot.
 */
#define WINDOW_FRAMES 8u
#define WINDOW_MIN_FRAMES 2u
#define WINDOW_BYTES (8u << 20)
#define SLOT_KEEP (WINDOW_BYTES / WINDOW_FRAMES)

/*
 * Workers run slightly below the caller's thread, which in a conversion
 * also inflates and parses the layer: it is the critical path, and with
 * fair shares among 3 threads on 2 CPUs it got 2/3 of one. Measured as
 * above: ~1.15x `gzip -dc` at the same priority, ~1.0x at nice +3 (no
 * better beyond). The window's back pressure keeps the workers fed.
 */
#define WORKER_NICE 3

struct frame {
	uint8_t *in;          /* the chunks' bytes, back to back */
	size_t in_len, in_cap;
	uint8_t *out;         /* compressed bytes: fewer than in_len */
	size_t out_len, out_cap;
	size_t charge;        /* its share of w->window_bytes */
	enum blob_codec codec; /* BLOB_CODEC_NONE: write @in itself */
	uint8_t group;        /* GROUP_COLD or GROUP_HOT */
	uint32_t first, nr;   /* its entries in its group's chunks */
	bool done;            /* compressed, waiting to be written */
};

struct worker {
	struct blob_writer *w;
	pthread_t thread;
	struct blob_codec_ctx ctx;
};

enum { GROUP_COLD, GROUP_HOT, NR_GROUPS };

/* The chunks of one group and the file its frames go to. */
struct group {
	int fd; /* the blob (cold), the staging file (hot), or -1 */
	struct blob_chunk *chunks; /* frame fields are filled when written */
	uint32_t nr_chunks, chunks_cap;
	uint64_t uend; /* caller's thread: next slot's uoff in the group */
	uint64_t cend; /* writing thread: bytes written to fd */
};

struct blob_writer {
	struct blob_compress c, hot_c; /* cold and hot frames' */
	uint32_t batch_small, batch_max;
	struct blob_codec_ctx ctx; /* compresses inline when nr_workers is 0 */
	struct frame *frames;      /* the window */
	uint32_t nr_frames, min_frames;
	uint64_t max_bytes;
	struct worker *workers;
	uint32_t nr_workers, nr_started;

	/* Caller's thread only, and the groups' fds and uends. */
	bool filling;              /* frame next_seq - 1 takes chunks */
	uint8_t group;             /* the group adds join */
	uint64_t next_seq;
	/* The caller appends entries, the writing thread fills in the frame
	 * fields of written frames; grow_chunks reallocates under the lock. */
	struct group groups[NR_GROUPS];

	pthread_mutex_t lock;
	pthread_cond_t work;  /* to workers: a frame was queued, or stop */
	pthread_cond_t space; /* to the caller: a frame was written, or error */
	/* Under lock: frames < next_write are written (their slots free), */
	uint64_t next_write;
	/* next_write .. next_compress - 1 are compressing or done, */
	uint64_t next_compress;
	/* next_compress .. submitted - 1 are queued. */
	uint64_t submitted;
	uint64_t window_bytes; /* charged by the frames in the window */
	bool writing; /* a thread is writing frames, outside the lock */
	bool stop;
	int error;    /* sticky: the file is in an unknown state */

	/* Only the thread that is writing (see writing) touches these and
	 * the groups' cends. */
	struct sha256_hasher *hasher; /* of every byte written to the blob */
};

static struct frame *frame_of(struct blob_writer *w, uint64_t seq)
{
	return &w->frames[seq % w->nr_frames];
}

/* Called with the lock held. */
static void set_error(struct blob_writer *w, int error)
{
	if (!w->error)
		w->error = error;
	pthread_cond_broadcast(&w->space);
}

/* The bytes of @f that go to the file. */
static const uint8_t *frame_bytes(const struct frame *f, size_t *len)
{
	if (f->codec == BLOB_CODEC_NONE) {
		*len = f->in_len;
		return f->in;
	}
	*len = f->out_len;
	return f->out;
}

/*
 * Called with the lock held: write the done frames that are next in file
 * order, unless another thread is already doing that (it will pick them
 * up: it looks again under the lock before it stops).
 */
static void write_ready(struct blob_writer *w)
{
	if (w->writing)
		return;
	w->writing = true;
	while (!w->error && w->next_write < w->next_compress &&
	       frame_of(w, w->next_write)->done) {
		struct frame *f = frame_of(w, w->next_write);
		struct group *g = &w->groups[f->group];
		size_t csize;
		const uint8_t *bytes = frame_bytes(f, &csize);
		uint32_t i;
		int ret;

		/* The hasher and the files are this thread's (writing). */
		pthread_mutex_unlock(&w->lock);
		ret = write_full(g->fd, bytes, csize);
		if (!ret && f->group == GROUP_COLD)
			sha256_hasher_update(w->hasher, bytes, csize);
		if (f->in_cap > SLOT_KEEP) {
			free(f->in);
			free(f->out);
			f->in = f->out = NULL;
			f->in_cap = f->out_cap = 0;
		}
		pthread_mutex_lock(&w->lock);
		if (ret) {
			ferry_err("blob writer: writing %zu bytes at offset %llu%s: %s",
				  csize, (unsigned long long)g->cend,
				  f->group == GROUP_HOT ? " of the staging file" : "",
				  ferry_strerror(ret));
			set_error(w, ret);
			break;
		}
		/* The caller only appends entries beyond these ones. */
		for (i = f->first; i < f->first + f->nr; i++) {
			g->chunks[i].coff = g->cend;
			g->chunks[i].csize = (uint32_t)csize;
			g->chunks[i].codec = (uint8_t)f->codec;
			g->chunks[i].frame_usize = (uint32_t)f->in_len;
		}
		g->cend += csize;
		w->window_bytes -= f->charge;
		f->done = false;
		w->next_write++;
		pthread_cond_broadcast(&w->space);
	}
	w->writing = false;
}

static int frame_compress(struct blob_writer *w, struct blob_codec_ctx *ctx,
			  struct frame *f)
{
	return blob_codec_compress(ctx, f->group == GROUP_HOT ? &w->hot_c : &w->c,
				   f->in, f->in_len, f->out, &f->out_len, &f->codec);
}

/* Called with the lock held, by whoever compressed @f. */
static void frame_done(struct blob_writer *w, struct frame *f, int ret)
{
	if (ret) {
		ferry_err("blob writer: compressing: %s", ferry_strerror(ret));
		set_error(w, ret);
	}
	f->done = true;
	write_ready(w);
}

static void *worker_main(void *arg)
{
	struct worker *wk = arg;
	struct blob_writer *w = wk->w;

	/* Linux: "who" 0 is this thread alone. Best effort, a hint only. */
	setpriority(PRIO_PROCESS, 0,
		    getpriority(PRIO_PROCESS, 0) + WORKER_NICE);
	pthread_mutex_lock(&w->lock);
	for (;;) {
		struct frame *f;
		int ret;

		while (!w->stop && w->next_compress == w->submitted)
			pthread_cond_wait(&w->work, &w->lock);
		if (w->stop)
			break;
		f = frame_of(w, w->next_compress++);
		pthread_mutex_unlock(&w->lock);
		ret = frame_compress(w, &wk->ctx, f);
		pthread_mutex_lock(&w->lock);
		frame_done(w, f, ret);
	}
	pthread_mutex_unlock(&w->lock);
	return NULL;
}

/* Queue the open frame (inline: compress and write it now). */
static int frame_submit(struct blob_writer *w)
{
	struct frame *f = frame_of(w, w->next_seq - 1);
	int ret = 0;

	w->filling = false;
	if (!w->nr_workers)
		ret = frame_compress(w, &w->ctx, f);
	pthread_mutex_lock(&w->lock);
	w->submitted++;
	if (w->nr_workers) {
		pthread_cond_signal(&w->work);
	} else {
		w->next_compress++;
		frame_done(w, f, ret);
	}
	ret = w->error;
	pthread_mutex_unlock(&w->lock);
	return ret;
}

/* Called with the lock held: no room for a frame of @len bytes. */
static bool window_full(const struct blob_writer *w, size_t len)
{
	uint64_t frames = w->next_seq - w->next_write;

	return frames >= w->nr_frames ||
	       (frames >= w->min_frames && w->window_bytes + len > w->max_bytes);
}

/* Open a frame for up to @len bytes, waiting for room in the window. */
static int frame_open(struct blob_writer *w, size_t len)
{
	struct frame *f;
	int ret;

	pthread_mutex_lock(&w->lock);
	while (!w->error && window_full(w, len))
		pthread_cond_wait(&w->space, &w->lock);
	ret = w->error;
	pthread_mutex_unlock(&w->lock);
	if (ret)
		return ret;
	/* The slot is free, and only this thread adds to the window. */
	f = frame_of(w, w->next_seq);
	ret = blob_buf_reserve(&f->in, &f->in_cap, len);
	/* Compressed output must be shorter than the input: len - 1. */
	if (!ret && w->c.codec != BLOB_CODEC_NONE)
		ret = blob_buf_reserve(&f->out, &f->out_cap, len);
	if (ret)
		return ret;
	pthread_mutex_lock(&w->lock);
	w->window_bytes += len;
	pthread_mutex_unlock(&w->lock);
	f->charge = len;
	f->in_len = 0;
	f->group = w->group;
	f->first = w->groups[w->group].nr_chunks;
	f->nr = 0;
	w->next_seq++;
	w->filling = true;
	return 0;
}

static int grow_chunks(struct blob_writer *w, struct group *g)
{
	uint32_t cap = 64;
	struct blob_chunk *p;

	if (g->chunks_cap)
		cap = g->chunks_cap > UINT32_MAX / 2 ? UINT32_MAX :
						       g->chunks_cap * 2;
	if (cap == g->chunks_cap)
		return -EOVERFLOW;
	/* The writing thread fills in entries of written frames. */
	pthread_mutex_lock(&w->lock);
	p = realloc(g->chunks, (size_t)cap * sizeof(*p));
	if (p) {
		g->chunks = p;
		g->chunks_cap = cap;
	}
	pthread_mutex_unlock(&w->lock);
	return p ? 0 : -ENOMEM;
}

static int writer_error(struct blob_writer *w)
{
	int ret;

	pthread_mutex_lock(&w->lock);
	ret = w->error;
	pthread_mutex_unlock(&w->lock);
	return ret;
}

int blob_writer_add(struct blob_writer *w, const void *data, uint32_t len,
		    const uint8_t sha256[BLOB_DIGEST_SIZE], uint64_t *uoff)
{
	uint64_t slot = ROUND_UP((uint64_t)len, BLOB_SLOT_ALIGN), uend;
	bool small = len < w->batch_small;
	struct group *g = &w->groups[w->group];
	struct blob_chunk *c;
	struct frame *f;
	int ret;

	if (!len || len > BLOB_CHUNK_MAX)
		return -EINVAL;
	ret = writer_error(w);
	if (ret)
		return ret;
	if (__builtin_add_overflow(g->uend, slot, &uend))
		return -EOVERFLOW;
	if (g->nr_chunks == g->chunks_cap) {
		ret = grow_chunks(w, g);
		if (ret)
			return ret;
	}
	if (w->filling &&
	    (!small || frame_of(w, w->next_seq - 1)->in_len + len >
			       w->batch_max)) {
		ret = frame_submit(w);
		if (ret)
			return ret;
	}
	if (!w->filling) {
		ret = frame_open(w, small ? w->batch_max : len);
		if (ret)
			return ret;
	}
	f = frame_of(w, w->next_seq - 1);
	memcpy(f->in + f->in_len, data, len);
	c = &g->chunks[g->nr_chunks++];
	*c = (struct blob_chunk){
		.uoff = g->uend,
		.usize = len,
		.frame_off = (uint32_t)f->in_len,
	};
	memcpy(c->sha256, sha256, BLOB_DIGEST_SIZE);
	f->in_len += len;
	f->nr++;
	*uoff = g->uend;
	g->uend = uend;
	return small ? 0 : frame_submit(w);
}

int blob_writer_set_hot_stage(struct blob_writer *w, int stage_fd)
{
	if (stage_fd < 0)
		return -EINVAL;
	if (w->groups[GROUP_HOT].fd >= 0 || w->next_seq)
		return -EBUSY;
	w->groups[GROUP_HOT].fd = stage_fd;
	w->hot_c = blob_compress_hot(&w->c);
	return 0;
}

int blob_writer_hot(struct blob_writer *w, bool hot)
{
	int ret;

	if (hot && w->groups[GROUP_HOT].fd < 0)
		return -EINVAL;
	if (hot == (w->group == GROUP_HOT))
		return writer_error(w);
	/* A frame holds chunks of one group. */
	ret = w->filling ? frame_submit(w) : writer_error(w);
	if (!ret)
		w->group = hot ? GROUP_HOT : GROUP_COLD;
	return ret;
}

int blob_writer_set_batching(struct blob_writer *w, uint32_t small,
			     uint32_t max)
{
	if (small > max || max > BLOB_FRAME_MAX)
		return -EINVAL;
	if (w->next_seq)
		return -EBUSY;
	w->batch_small = small;
	w->batch_max = max;
	return 0;
}

/* Stop and join the workers; queued frames are dropped. */
static void workers_stop(struct blob_writer *w)
{
	uint32_t i;

	pthread_mutex_lock(&w->lock);
	w->stop = true;
	pthread_cond_broadcast(&w->work);
	pthread_mutex_unlock(&w->lock);
	for (i = 0; i < w->nr_started; i++)
		pthread_join(w->workers[i].thread, NULL);
	w->nr_started = 0;
}

static void writer_free(struct blob_writer *w)
{
	uint32_t i;

	workers_stop(w);
	for (i = 0; i < w->nr_workers; i++)
		blob_codec_ctx_release(&w->workers[i].ctx);
	for (i = 0; i < w->nr_frames; i++) {
		free(w->frames[i].in);
		free(w->frames[i].out);
	}
	blob_codec_ctx_release(&w->ctx);
	sha256_hasher_free(w->hasher);
	pthread_cond_destroy(&w->space);
	pthread_cond_destroy(&w->work);
	pthread_mutex_destroy(&w->lock);
	free(w->workers);
	free(w->frames);
	for (i = 0; i < NR_GROUPS; i++)
		free(w->groups[i].chunks);
	free(w);
}

int blob_writer_new(int fd, const struct blob_compress *c, unsigned int jobs,
		    struct blob_writer **out)
{
	struct blob_writer *w;
	int ret;

	if (!blob_compress_valid(c) || jobs > BLOB_WRITER_JOBS_MAX)
		return -EINVAL;
	if (!jobs)
		jobs = online_cpus(BLOB_WRITER_JOBS_MAX);
	w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	w->groups[GROUP_COLD].fd = fd;
	w->groups[GROUP_HOT].fd = -1;
	w->c = *c;
	w->batch_small = BLOB_BATCH_SMALL;
	w->batch_max = BLOB_BATCH_MAX;
	pthread_mutex_init(&w->lock, NULL);
	pthread_cond_init(&w->work, NULL);
	pthread_cond_init(&w->space, NULL);
	/* With one job, the caller's thread compresses: no workers. */
	w->frames = calloc(jobs > 1 ? WINDOW_FRAMES * jobs : 1,
			   sizeof(*w->frames));
	w->workers = calloc(jobs > 1 ? jobs : 1, sizeof(*w->workers));
	ret = sha256_hasher_new(&w->hasher);
	if (!ret && (!w->frames || !w->workers))
		ret = -ENOMEM;
	if (!ret) {
		w->nr_frames = jobs > 1 ? WINDOW_FRAMES * jobs : 1;
		w->min_frames = jobs > 1 ? WINDOW_MIN_FRAMES * jobs : 1;
		w->max_bytes = (uint64_t)WINDOW_BYTES * jobs;
		w->nr_workers = jobs > 1 ? jobs : 0;
	}
	while (!ret && w->nr_started < w->nr_workers) {
		struct worker *wk = &w->workers[w->nr_started];

		wk->w = w;
		ret = -pthread_create(&wk->thread, NULL, worker_main, wk);
		if (!ret)
			w->nr_started++;
	}
	if (ret) {
		ferry_err("blob writer: cannot start: %s", ferry_strerror(ret));
		writer_free(w);
		return ret;
	}
	*out = w;
	return 0;
}

/*
 * Copy the hot group's staged frames behind the cold ones and move its
 * entries behind the cold group's, rebased: one table, sorted by uoff.
 */
static int append_hot(struct blob_writer *w)
{
	struct group *cold = &w->groups[GROUP_COLD], *hot = &w->groups[GROUP_HOT];
	uint64_t off, uend, cend;
	struct blob_chunk *all;
	uint32_t i, nr;
	uint8_t *buf;
	int ret = 0;

	if (__builtin_add_overflow(cold->uend, hot->uend, &uend) ||
	    __builtin_add_overflow(cold->cend, hot->cend, &cend) ||
	    __builtin_add_overflow(cold->nr_chunks, hot->nr_chunks, &nr))
		return -EOVERFLOW;
	all = realloc(cold->chunks, (size_t)nr * sizeof(*all));
	buf = malloc(SLOT_KEEP);
	if (!all || !buf) {
		if (all)
			cold->chunks = all;
		free(buf);
		return -ENOMEM;
	}
	cold->chunks = all;
	cold->chunks_cap = nr;
	for (off = 0; off < hot->cend && !ret; off += SLOT_KEEP) {
		size_t len = (size_t)MIN((uint64_t)SLOT_KEEP, hot->cend - off);

		ret = pread_full(hot->fd, buf, len, off);
		if (ret)
			ferry_err("blob writer: reading the staging file at offset %llu: %s",
				  (unsigned long long)off, ferry_strerror(ret));
		else
			ret = write_full(cold->fd, buf, len);
		if (!ret)
			sha256_hasher_update(w->hasher, buf, len);
	}
	free(buf);
	if (ret)
		return ret;
	for (i = 0; i < hot->nr_chunks; i++) {
		struct blob_chunk *c = &all[cold->nr_chunks + i];

		*c = hot->chunks[i];
		c->uoff += cold->uend;
		c->coff += cold->cend;
	}
	cold->nr_chunks = nr;
	cold->uend = uend;
	cold->cend = cend;
	return 0;
}

int blob_writer_finish(struct blob_writer *w, struct blob_info *info,
		       uint64_t *hot_uoff)
{
	struct group *cold = &w->groups[GROUP_COLD];
	struct blob_info bi = { 0 };
	uint8_t *tail = NULL;
	size_t tlen;
	int ret;

	if (w->filling)
		frame_submit(w); /* an error sticks: read below */
	pthread_mutex_lock(&w->lock);
	while (!w->error && w->next_write < w->submitted)
		pthread_cond_wait(&w->space, &w->lock);
	ret = w->error;
	pthread_mutex_unlock(&w->lock);
	/* From here on this thread owns everything. */
	workers_stop(w);
	if (ret)
		goto out;
	if (hot_uoff)
		*hot_uoff = cold->uend;
	if (w->groups[GROUP_HOT].nr_chunks) {
		ret = append_hot(w);
		if (ret)
			goto out;
	}
	tlen = (size_t)cold->nr_chunks * BLOB_CHUNK_ENTRY_SIZE;
	bi.uncompressed_size = cold->uend;
	bi.nr_chunks = cold->nr_chunks;
	bi.table_offset = cold->cend;
	bi.size = cold->cend + tlen + BLOB_FOOTER_SIZE;
	tail = malloc(tlen + BLOB_FOOTER_SIZE);
	if (!tail) {
		ret = -ENOMEM;
		goto out;
	}
	blob_table_encode(cold->chunks, cold->nr_chunks, tail);
	sha256_buf(tail, tlen, bi.table_sha256);
	blob_footer_encode(&bi, tail + tlen);
	ret = write_full(cold->fd, tail, tlen + BLOB_FOOTER_SIZE);
	if (ret)
		goto out;
	sha256_hasher_update(w->hasher, tail, tlen + BLOB_FOOTER_SIZE);
	sha256_hasher_final(w->hasher, bi.digest);
	if (cold->nr_chunks) {
		/* Give back the geometric growth slack; keep it on failure. */
		struct blob_chunk *fit = realloc(cold->chunks,
						 (size_t)cold->nr_chunks *
							 sizeof(*fit));

		bi.chunks = fit ? fit : cold->chunks;
		cold->chunks = NULL;
	}
	*info = bi;
out:
	free(tail);
	writer_free(w);
	return ret;
}

void blob_writer_abort(struct blob_writer *w)
{
	if (w)
		writer_free(w);
}
