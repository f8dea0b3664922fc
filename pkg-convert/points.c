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
 */
#include "tar.h"

#include <stdlib.h>

#include "../pkg-base/base.h"
#include "../pkg-blob/blob.h"

struct points_mark {
	uint64_t out; /* decoded bytes after a step */
	uint64_t in;  /* compressed bytes consumed by then */
};

struct input_points {
	uint64_t spacing, out_spacing;
	uint64_t next_in, next_out; /* hunt from here on */
	bool hunting;
	uint64_t out;        /* decoded bytes so far */
	uint64_t member_out; /* of them in the current gzip member */
	bool pending;        /* a boundary found in the current step */
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
};

/*
 * The ring is kept only from this many bytes (compressed, or decoded)
 * before a hunt on: more than a window's worth of output reaches it by
 * then, and far from one, copying every step's tail cost 5% of `ferry
 * index` (hunting steps are a few hundred bytes each).
 */
#define RING_LEAD (256u << 10)

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
	*out = p;
	return 0;
}

void points_free(struct input_points *p)
{
	uint32_t i;

	if (!p)
		return;
	for (i = 0; i < p->nr; i++)
		free((void *)p->points[i].window);
	free(p->points);
	free(p->marks);
	sha256_hasher_free(p->diff);
	free(p);
}

bool points_hunting(const struct input_points *p)
{
	return p->hunting;
}

/* Take a point at @cbit, decoded offset p->out, with its window. */
static int capture(struct input_points *p, uint64_t cbit, uint32_t flags)
{
	struct blob_stream_point *pt;
	uint32_t wlen = flags & BLOB_POINT_HEADER ? 0 :
			(uint32_t)MIN(p->member_out, (uint64_t)BLOB_STREAM_WINDOW);
	struct blob_compress zstd = { BLOB_CODEC_ZSTD, 0 };
	enum blob_codec used;
	uint8_t *w = NULL;
	size_t clen = 0;
	int ret;

	if (p->nr && p->points[p->nr - 1].uoff >= p->out)
		return 0; /* a member header here already */
	if (array_reserve(&p->points, &p->cap, p->nr + 1, sizeof(*p->points), 64))
		return -ENOMEM;
	if (wlen) {
		uint8_t window[BLOB_STREAM_WINDOW];

		ring_get(p, window, wlen);
		w = malloc(wlen);
		if (!w)
			return -ENOMEM;
		ret = blob_compress(&zstd, window, wlen, w, wlen, &clen, &used);
		if (ret) {
			free(w);
			return ret;
		}
		if (used == BLOB_CODEC_NONE) {
			memcpy(w, window, wlen);
			clen = wlen;
		}
	}
	pt = &p->points[p->nr++];
	*pt = (struct blob_stream_point){ .cbit = cbit, .uoff = p->out,
					  .window_len = wlen,
					  .window_clen = (uint32_t)clen,
					  .flags = flags, .window = w };
	p->hunting = false;
	p->next_in = cbit / 8 + p->spacing;
	p->next_out = p->out + p->out_spacing;
	return 0;
}

int points_here(struct input_points *p, uint64_t cbit, uint32_t flags)
{
	if (flags & BLOB_POINT_HEADER)
		p->member_out = 0;
	return p->hunting ? capture(p, cbit, flags) : 0;
}

void points_found(struct input_points *p, uint64_t cbit)
{
	if (p->hunting) {
		p->pending = true;
		p->pending_cbit = cbit;
	}
}

int points_step(struct input_points *p, const uint8_t *out, size_t n, uint64_t pos)
{
	int ret = 0;

	if (n) {
		if (p->hunting || pos + RING_LEAD >= p->next_in ||
		    p->out + RING_LEAD >= p->next_out)
			ring_put(p, out, n);
		p->out += n;
		p->member_out += n;
		if (array_reserve(&p->marks, &p->marks_cap, p->nr_marks + 1,
				  sizeof(*p->marks), 1024))
			return -ENOMEM;
		p->marks[p->nr_marks++] = (struct points_mark){ p->out, pos };
	}
	if (p->pending) {
		p->pending = false;
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

void points_take(struct input_points *p, struct blob_stream_point **points,
		 uint32_t *nr)
{
	/* A point at the very end starts nothing. */
	while (p->nr && p->points[p->nr - 1].uoff >= p->out) {
		p->nr--;
		free((void *)p->points[p->nr].window);
	}
	*points = p->points;
	*nr = p->nr;
	p->points = NULL;
	p->nr = p->cap = 0;
}
