// SPDX-License-Identifier: MIT
/*
 * Resume points of a compressed layer, taken while input.c decodes it
 * once (`ferry index`, FORMAT.md 2.8): a gzip member header, a deflate
 * block boundary with the 32 KiB of decoded bytes before it, or a zstd
 * frame boundary. After every `spacing` compressed bytes (or `out_spacing`
 * decoded ones) the recorder "hunts": input.c makes its decoder stop at
 * the next place decoding can resume and reports it here. It also keeps
 * marks of how many compressed bytes decoding had consumed when its
 * output reached each offset, from which a frame's compressed range is
 * bounded.
 *
 * Sparse windows: of a deflate point's 32 KiB window, only the bytes that
 * the next 32 KiB + 258 of output copy from matter (no back-reference
 * reaches further), a tenth on Debian's layers; the others are stored as
 * zeros, so the window compresses to about a ninth (performance-log.md,
 * "Ferry indexes of ordinary images") and the index holds that many more
 * points. A point is "probed" once that output is decoded: its compressed
 * bytes are decoded again by pkg-blob's point decoder (ISA-L's inflate
 * when built with it: with zlib's, the three decodes were half the probe)
 * from windows tagged with each byte's position, which shows the bytes
 * copied from; then the sparse window must decode to exactly the stream's
 * bytes, or the point keeps its whole window.
 *
 * The probes and the windows' compression run on a worker thread of
 * their own: on the decoder's thread they were a fifth of its time, and
 * that thread bounds the build (performance-log.md, "Where `ferry index`
 * spends its time"). The decoder fills a probe (the point, its window,
 * the compressed and decoded bytes after it) and hands it over; it puts
 * the window back into its point when it needs the probe again, or in
 * points_take. What the worker makes of a probe depends on the probe's
 * bytes alone, not on when it runs: the same index either way.
 */
#include "tar.h"

#include <pthread.h>
#include <stdlib.h>

#include "../pkg-base/base.h"
#include "../pkg-blob/blob.h"

struct points_mark {
	uint64_t out; /* decoded bytes after a step */
	uint64_t in;  /* compressed bytes consumed by then */
};

/* Decoded bytes after a point that back-references can reach its window from. */
#define PROBE_OUT (BLOB_STREAM_WINDOW + 258u)
/* Compressed bytes kept to decode them again; more: the whole window. */
#define PROBE_IN_MAX (128u << 10)
/* Compressed bytes kept behind the decoder: ISA-L reads a block header
 * (up to 328 bytes) and 8 bytes more before it reports the boundary. */
#define IN_RING 4096u

/* Probes at a time: the one the decoder fills, the ones the worker has. */
#define PROBES 4

struct points_probe {
	uint32_t k;              /* the point */
	struct blob_stream_point pt; /* its copy; the window is the probe's until put back */
	uint8_t *in;             /* its compressed bytes from cbit / 8 on */
	size_t in_len;
	bool in_full;            /* more than PROBE_IN_MAX: not probed */
	bool complete;           /* all the output that can reach the window seen */
	uint8_t out[PROBE_OUT];  /* the stream's bytes after it */
	size_t out_len;
	int ret;                 /* the worker's */
};

/*
 * Probes are numbered in the order the decoder hands them over: probe n
 * is probes[n % PROBES]. The decoder fills probe `handed` (while
 * `probing`) and puts back those before `done`; the worker finishes those
 * from `done` to `handed`.
 */
struct points_worker {
	pthread_t tid;
	bool running;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	uint32_t handed, done;
	bool stop;
	/* The worker's alone. */
	struct blob_stream_reader *reader; /* made on first use */
	/* Windows holding each byte's position: its low byte, its high byte. */
	uint8_t tag_low[BLOB_STREAM_WINDOW], tag_high[BLOB_STREAM_WINDOW];
	/* Indexed by any two bytes' position (no bound check in the loop). */
	uint8_t used[1u << 16];
	uint8_t probed[PROBE_OUT], low[PROBE_OUT];
};

struct input_points {
	uint64_t spacing, out_spacing;
	uint64_t next_in, next_out; /* hunt from here on */
	bool hunting;
	uint64_t out;        /* decoded bytes so far */
	uint64_t member_out; /* of them in the current gzip member */
	bool pending;        /* a boundary found in the current step */
	bool pending_fresh;  /* ...where decoding needs no window (zstd) */
	uint64_t pending_cbit;
	struct blob_stream_point *points;
	uint32_t nr;
	size_t cap;
	struct points_mark *marks;
	size_t nr_marks, marks_cap;
	/* Of the decoded stream (its diff_id), hashed as it is read. */
	struct sha256_hasher *diff;
	/* The last decoded bytes, circular from ring_head, once a hunt nears. */
	uint8_t ring[BLOB_STREAM_WINDOW];
	uint32_t ring_head;
	/* The last compressed bytes consumed (in_pos of them), once a hunt
	 * nears: those from in_kept on. */
	uint8_t in_ring[IN_RING];
	uint64_t in_pos, in_kept;
	struct points_probe probes[PROBES];
	bool probing;        /* the decoder fills probes[w.handed % PROBES] */
	uint32_t put_back;   /* probes whose windows are back in their points */
	struct points_worker w;
};

/*
 * The rings are kept only from this many bytes (compressed, or decoded)
 * before a hunt on: more than a window's worth of output reaches it by
 * then (deflate's stored blocks, its worst, decode a byte per byte), and
 * far from one, copying every step's tail cost 5% of `ferry index`
 * (hunting steps are a few hundred bytes each). Spans as short as this
 * copy all the output.
 */
#define RING_LEAD (64u << 10)

static void ring_put(struct input_points *p, const uint8_t *out, size_t n)
{
	size_t first;

	if (n >= BLOB_STREAM_WINDOW) {
		memcpy(p->ring, out + n - BLOB_STREAM_WINDOW, BLOB_STREAM_WINDOW);
		p->ring_head = 0;
		return;
	}
	first = MIN(n, (size_t)(BLOB_STREAM_WINDOW - p->ring_head));
	memcpy(p->ring + p->ring_head, out, first);
	memcpy(p->ring, out + first, n - first);
	p->ring_head = (uint32_t)((p->ring_head + n) % BLOB_STREAM_WINDOW);
}

/* The last @len (<= the window) bytes of the ring, in order, into @w. */
static void ring_get(const struct input_points *p, uint8_t *w, uint32_t len)
{
	uint32_t start = (p->ring_head + BLOB_STREAM_WINDOW - len) % BLOB_STREAM_WINDOW;
	uint32_t first = MIN(len, BLOB_STREAM_WINDOW - start);

	memcpy(w, p->ring + start, first);
	memcpy(w + first, p->ring, len - first);
}

int points_new(uint64_t spacing, uint64_t out_spacing, struct input_points **out)
{
	struct input_points *p = calloc(1, sizeof(*p));

	if (!p)
		return -ENOMEM;
	p->spacing = spacing;
	p->out_spacing = out_spacing;
	p->hunting = true; /* for the point at the start */
	if (sha256_hasher_new(&p->diff)) {
		free(p);
		return -ENOMEM;
	}
	pthread_mutex_init(&p->w.lock, NULL);
	pthread_cond_init(&p->w.cond, NULL);
	*out = p;
	return 0;
}

/* The worker, when it runs, stops once it has finished its probe. */
static void worker_stop(struct points_worker *w)
{
	if (!w->running)
		return;
	pthread_mutex_lock(&w->lock);
	w->stop = true;
	pthread_cond_broadcast(&w->cond);
	pthread_mutex_unlock(&w->lock);
	pthread_join(w->tid, NULL);
	w->running = false;
}

void points_free(struct input_points *p)
{
	uint32_t i;

	if (!p)
		return;
	worker_stop(&p->w);
	for (i = 0; i < p->nr; i++)
		free((void *)p->points[i].window);
	/* Windows not put back (an error ended the build): the probes'. */
	for (i = 0; i < PROBES; i++) {
		free((void *)p->probes[i].pt.window);
		free(p->probes[i].in);
	}
	free(p->points);
	free(p->marks);
	blob_stream_reader_free(p->w.reader);
	pthread_mutex_destroy(&p->w.lock);
	pthread_cond_destroy(&p->w.cond);
	sha256_hasher_free(p->diff);
	free(p);
}

bool points_hunting(const struct input_points *p)
{
	return p->hunting;
}

/* Decode probe @pr's bytes again from window @win into @out. */
static int probe_decode(struct points_worker *w, const struct points_probe *pr,
			const uint8_t *win, uint8_t *out)
{
	struct blob_stream_point pt = pr->pt;

	/* window_clen == window_len: stored as it is (FORMAT.md 2.8). */
	pt.window_clen = pt.window_len;
	pt.window = win;
	if (!w->reader && blob_stream_reader_new(&w->reader))
		return -ENOMEM;
	return blob_stream_point_decode(w->reader, &pt, pr->in, pr->in_len, out,
					pr->out_len);
}

/*
 * Zero in @w (the point's window) the bytes the probed output does not
 * copy from; false when that cannot be shown (the window stays whole).
 * Copies are the same whatever the window holds: decoded from windows
 * holding each byte's position, low byte then high byte, an output byte
 * copied from the window names its source. A literal names one too (its
 * value twice: one of 128 places), which only keeps that byte.
 */
static bool probe_sparse(struct points_worker *w, const struct points_probe *pr,
			 uint8_t *win, uint32_t wlen)
{
	uint8_t *used = w->used;
	size_t i, n = pr->out_len;

	if (probe_decode(w, pr, w->tag_low, w->low) ||
	    probe_decode(w, pr, w->tag_high, w->probed))
		return false;
	/* No test in the loops (used[] has room for any source): half their time. */
	memset(used, 0, wlen);
	for (i = 0; i < n; i++)
		used[w->probed[i] << 8 | w->low[i]] = 1;
	for (i = 0; i < wlen; i++)
		win[i] &= (uint8_t)-used[i];
	/* The proof: the sparse window decodes to the stream's very bytes. */
	return !probe_decode(w, pr, win, w->probed) && !memcmp(w->probed, pr->out, n);
}

/* Store point @pt's window zstd-compressed, or as it is when that is no smaller. */
static int window_store(struct blob_stream_point *pt)
{
	struct blob_compress zstd = { BLOB_CODEC_ZSTD, 0 };
	uint8_t *w = (uint8_t *)pt->window, *z = malloc(pt->window_len);
	enum blob_codec used;
	size_t clen = 0;
	int ret;

	if (!z)
		return -ENOMEM;
	ret = blob_compress(&zstd, w, pt->window_len, z, pt->window_len, &clen, &used);
	if (ret || used == BLOB_CODEC_NONE) {
		free(z);
		pt->window_clen = pt->window_len; /* stored as it is */
		return ret;
	}
	free(w);
	pt->window = z;
	pt->window_clen = (uint32_t)clen;
	return 0;
}

/*
 * The worker's part: the probe's window made sparse if it is complete
 * (all the output that can reach the window seen, or the stream ended)
 * and the proof holds, then stored.
 */
static void probe_finish(struct points_worker *w, struct points_probe *pr)
{
	struct blob_stream_point *pt = &pr->pt;
	uint8_t *win = (uint8_t *)pt->window;

	if (pr->complete && !pr->in_full && pr->out_len) {
		uint8_t whole[BLOB_STREAM_WINDOW];

		memcpy(whole, win, pt->window_len);
		if (!probe_sparse(w, pr, win, pt->window_len))
			memcpy(win, whole, pt->window_len);
	}
	pr->ret = window_store(pt);
}

static void *worker_thread(void *arg)
{
	struct input_points *p = arg;
	struct points_worker *w = &p->w;
	size_t i;

	for (i = 0; i < BLOB_STREAM_WINDOW; i++) {
		w->tag_low[i] = (uint8_t)i;
		w->tag_high[i] = (uint8_t)(i >> 8);
	}
	pthread_mutex_lock(&w->lock);
	for (;;) {
		while (w->done == w->handed && !w->stop)
			pthread_cond_wait(&w->cond, &w->lock);
		if (w->stop)
			break;
		pthread_mutex_unlock(&w->lock);
		probe_finish(w, &p->probes[w->done % PROBES]);
		pthread_mutex_lock(&w->lock);
		w->done++;
		pthread_cond_broadcast(&w->cond);
	}
	pthread_mutex_unlock(&w->lock);
	return NULL;
}

/* The oldest probe handed over, once finished: its window back in its point. */
static int probe_put_back(struct input_points *p)
{
	struct points_worker *w = &p->w;
	struct points_probe *pr = &p->probes[p->put_back % PROBES];
	struct blob_stream_point *pt = &p->points[pr->k];

	pthread_mutex_lock(&w->lock);
	while (w->done == p->put_back)
		pthread_cond_wait(&w->cond, &w->lock);
	pthread_mutex_unlock(&w->lock);
	p->put_back++;
	pt->window = pr->pt.window;
	pt->window_clen = pr->pt.window_clen;
	pr->pt.window = NULL;
	return pr->ret;
}

/* The probe ends: handed to the worker (started on the first one). */
static int probe_end(struct input_points *p, bool complete)
{
	struct points_worker *w = &p->w;

	p->probing = false;
	p->probes[w->handed % PROBES].complete = complete;
	if (!w->running) {
		int ret = -pthread_create(&w->tid, NULL, worker_thread, p);

		if (ret)
			return ret;
		w->running = true;
	}
	pthread_mutex_lock(&w->lock);
	w->handed++;
	pthread_cond_broadcast(&w->cond);
	pthread_mutex_unlock(&w->lock);
	return 0;
}

/* Keep compressed bytes for the probe; past PROBE_IN_MAX, mark it unprobeable. */
static void probe_input(struct points_probe *pr, const uint8_t *buf, size_t n)
{
	if (pr->in_full)
		return;
	if (n > PROBE_IN_MAX - pr->in_len) {
		pr->in_full = true;
		return;
	}
	memcpy(pr->in + pr->in_len, buf, n);
	pr->in_len += n;
}

/*
 * Start probing point @k (at @cbit), which gives its window to the probe:
 * its compressed bytes from the ring on.
 */
static int probe_start(struct input_points *p, uint32_t k, uint64_t cbit)
{
	struct points_probe *pr = &p->probes[p->w.handed % PROBES];
	uint64_t lag = p->in_pos - cbit / 8;
	size_t start;
	int ret;

	/* This probe was handed over PROBES probes ago: its window back first. */
	if (p->w.handed - p->put_back == PROBES) {
		ret = probe_put_back(p);
		if (ret)
			return ret;
	}
	if (!pr->in && !(pr->in = malloc(PROBE_IN_MAX)))
		return -ENOMEM;
	p->probing = true;
	pr->k = k;
	pr->pt = p->points[k];
	p->points[k].window = NULL;
	pr->in_len = 0;
	pr->out_len = 0;
	pr->in_full = cbit / 8 > p->in_pos || cbit / 8 < p->in_kept || lag > IN_RING;
	if (pr->in_full)
		return 0;
	start = (size_t)((p->in_pos - lag) % IN_RING);
	if (start + lag > IN_RING) {
		probe_input(pr, p->in_ring + start, IN_RING - start);
		probe_input(pr, p->in_ring, (size_t)lag - (IN_RING - start));
	} else {
		probe_input(pr, p->in_ring + start, (size_t)lag);
	}
	return 0;
}

void points_input(struct input_points *p, const uint8_t *buf, size_t n)
{
	size_t at, first;

	if (p->probing)
		probe_input(&p->probes[p->w.handed % PROBES], buf, n);
	if (!p->hunting && p->in_pos + n + RING_LEAD < p->next_in &&
	    p->out + RING_LEAD < p->next_out) {
		p->in_pos += n;
		p->in_kept = p->in_pos;
		return;
	}
	if (n > IN_RING) {
		p->in_pos += n - IN_RING;
		buf += n - IN_RING;
		n = IN_RING;
	}
	at = (size_t)(p->in_pos % IN_RING);
	first = MIN(n, IN_RING - at);
	memcpy(p->in_ring + at, buf, first);
	memcpy(p->in_ring, buf + first, n - first);
	p->in_pos += n;
}

/* Take a point at @cbit, decoded offset p->out, with its window. */
static int capture(struct input_points *p, uint64_t cbit, uint32_t flags)
{
	struct blob_stream_point *pt;
	uint32_t wlen = flags & BLOB_POINT_HEADER ? 0 :
			(uint32_t)MIN(p->member_out, (uint64_t)BLOB_STREAM_WINDOW);
	uint8_t *w = NULL;
	int ret;

	if (p->nr && p->points[p->nr - 1].uoff >= p->out)
		return 0; /* a member header here already */
	/* A member header: the stream before it ended. */
	if (p->probing) {
		ret = probe_end(p, flags & BLOB_POINT_HEADER);
		if (ret)
			return ret;
	}
	if (array_reserve(&p->points, &p->cap, p->nr + 1, sizeof(*p->points), 64))
		return -ENOMEM;
	if (wlen) {
		w = malloc(wlen);
		if (!w)
			return -ENOMEM;
		ring_get(p, w, wlen);
	}
	pt = &p->points[p->nr++];
	*pt = (struct blob_stream_point){ .cbit = cbit, .uoff = p->out,
					  .window_len = wlen, .window_clen = wlen,
					  .flags = flags, .window = w };
	p->hunting = false;
	p->next_in = cbit / 8 + p->spacing;
	p->next_out = p->out + p->out_spacing;
	return wlen ? probe_start(p, p->nr - 1, cbit) : 0;
}

int points_here(struct input_points *p, uint64_t cbit, uint32_t flags)
{
	if (flags & BLOB_POINT_HEADER)
		p->member_out = 0;
	return p->hunting ? capture(p, cbit, flags) : 0;
}

void points_found(struct input_points *p, uint64_t cbit, bool fresh)
{
	if (p->hunting) {
		p->pending = true;
		p->pending_fresh = fresh;
		p->pending_cbit = cbit;
	}
}

int points_step(struct input_points *p, const uint8_t *out, size_t n, uint64_t pos)
{
	int ret = 0;

	if (n) {
		struct points_probe *pr = &p->probes[p->w.handed % PROBES];

		if (p->hunting || pos + RING_LEAD >= p->next_in ||
		    p->out + RING_LEAD >= p->next_out)
			ring_put(p, out, n);
		p->out += n;
		p->member_out += n;
		if (array_reserve(&p->marks, &p->marks_cap, p->nr_marks + 1,
				  sizeof(*p->marks), 1024))
			return -ENOMEM;
		p->marks[p->nr_marks++] = (struct points_mark){ p->out, pos };
		if (p->probing) {
			size_t take = MIN(n, PROBE_OUT - pr->out_len);

			memcpy(pr->out + pr->out_len, out, take);
			pr->out_len += take;
			if (pr->out_len == PROBE_OUT)
				ret = probe_end(p, true);
			if (ret)
				return ret;
		}
	}
	if (p->pending) {
		p->pending = false;
		/* A zstd frame decodes alone: no window (FORMAT.md 2.8). */
		if (p->pending_fresh)
			p->member_out = 0;
		ret = capture(p, p->pending_cbit, 0);
	}
	if (!p->hunting && p->nr && (pos >= p->next_in || p->out >= p->next_out))
		p->hunting = true;
	return ret;
}

uint64_t points_bound(const struct input_points *p, uint64_t uoff)
{
	size_t lo = 0, hi = p->nr_marks;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (p->marks[mid].out < uoff)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < p->nr_marks ? p->marks[lo].in : UINT64_MAX;
}

uint64_t points_decoded(const struct input_points *p)
{
	return p->out;
}

void points_hash(struct input_points *p, const uint8_t *out, size_t n)
{
	sha256_hasher_update(p->diff, out, n);
}

void points_diff_id(struct input_points *p, uint8_t out[SHA256_SIZE])
{
	sha256_hasher_final(p->diff, out);
}

int points_take(struct input_points *p, struct blob_stream_point **points,
		uint32_t *nr)
{
	int ret = 0;

	/* The stream has ended: a probe has seen all it will. */
	if (p->probing)
		ret = probe_end(p, true);
	while (!ret && p->put_back != p->w.handed)
		ret = probe_put_back(p);
	worker_stop(&p->w);
	if (ret)
		return ret;
	/* A point at the very end starts nothing. */
	while (p->nr && p->points[p->nr - 1].uoff >= p->out) {
		p->nr--;
		free((void *)p->points[p->nr].window);
	}
	*points = p->points;
	*nr = p->nr;
	p->points = NULL;
	p->nr = p->cap = 0;
	return 0;
}
