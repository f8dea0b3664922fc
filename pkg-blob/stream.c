// SPDX-License-Identifier: MIT
/*
 * Stream blobs: an OCI layer (plain tar, gzip or zstd) read where it is,
 * its file data served as chunks without a converted copy (FORMAT.md 2.8
 * and 3.5). This file owns the resume points section of the bootstrap,
 * decoding a frame from a resume point, and ferry check's pass over a
 * whole layer.
 *
 * gzip: a resume point is a deflate block boundary, with the up to 32 KiB
 * of decoded bytes before it that back-references may reach (zlib's
 * examples/zran.c model: raw inflate, inflatePrime for the bits of the
 * first byte, inflateSetDictionary for the window), or a member header.
 * A frame may run on into the next gzip members. zstd: a resume point is
 * a frame boundary, where decoding needs no state at all.
 *
 * Section body (little-endian), a required section of the area:
 *   header 16: magic "FERRYRP1", u32 version 1, u32 nr_streams
 *   per stream blob, in blob order, 64 bytes:
 *      0 u32 blob (its index in the blob index)   4 u8 format   5 u8[3] 0
 *      8 u32 nr_points   12 u32 0   16 u64 decoded bytes
 *     24 u8[32] diff_id (sha256 of the decoded stream)   56 u64 0
 *   then nr_points records of 28 bytes, each followed by its window:
 *      0 u64 cbit   8 u64 uoff   16 u32 window_len   20 u32 window_clen
 *     24 u32 flags
 */
#include "internal.h"
#include "../pkg-base/base.h"

#ifdef FERRY_HAVE_ISAL
#include <isa-l/igzip_lib.h>
#endif
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <zlib.h>
#include <zstd.h>

#define RP_HEADER 16u
#define RP_STREAM 64u
#define RP_POINT 28u

/* Decoded bytes thrown away between a resume point and a frame, per step. */
#define SKIP_BUF (64u << 10)

bool blob_streams_magic(const void *buf, size_t len)
{
	return len >= 8 && !memcmp(buf, BLOB_STREAMS_MAGIC, 8);
}

int blob_streams_encode(const struct blob_stream *s, uint32_t nr, void **buf,
			size_t *len)
{
	size_t total = RP_HEADER, pos;
	uint32_t i, k;
	uint8_t *out;

	for (i = 0; i < nr; i++) {
		total += RP_STREAM;
		for (k = 0; k < s[i].nr_points; k++)
			total += RP_POINT + s[i].points[k].window_clen;
	}
	out = calloc(1, total);
	if (!out)
		return -ENOMEM;
	memcpy(out, BLOB_STREAMS_MAGIC, 8);
	put_le32(out + 8, BLOB_STREAMS_VERSION);
	put_le32(out + 12, nr);
	pos = RP_HEADER;
	for (i = 0; i < nr; i++) {
		uint8_t *h = out + pos;

		put_le32(h, s[i].blob);
		h[4] = s[i].format;
		put_le32(h + 8, s[i].nr_points);
		put_le64(h + 16, s[i].usize);
		memcpy(h + 24, s[i].diff_id, BLOB_DIGEST_SIZE);
		pos += RP_STREAM;
		for (k = 0; k < s[i].nr_points; k++) {
			const struct blob_stream_point *p = &s[i].points[k];
			uint8_t *e = out + pos;

			put_le64(e, p->cbit);
			put_le64(e + 8, p->uoff);
			put_le32(e + 16, p->window_len);
			put_le32(e + 20, p->window_clen);
			put_le32(e + 24, p->flags);
			if (p->window_clen)
				memcpy(e + RP_POINT, p->window, p->window_clen);
			pos += RP_POINT + p->window_clen;
		}
	}
	*buf = out;
	*len = total;
	return 0;
}

void blob_streams_free(struct blob_streams *s)
{
	uint32_t i;

	for (i = 0; i < s->nr && s->streams; i++)
		free(s->streams[i].points);
	free(s->streams);
	s->streams = NULL;
	s->nr = 0;
}

const struct blob_stream *blob_streams_find(const struct blob_streams *s,
					    uint32_t blob)
{
	uint32_t i;

	for (i = 0; i < s->nr; i++)
		if (s->streams[i].blob == blob)
			return &s->streams[i];
	return NULL;
}

/* The point whose first byte is @coff, or NULL (binary search). */
static const struct blob_stream_point *point_at(const struct blob_stream *s,
						uint64_t coff)
{
	uint32_t lo = 0, hi = s->nr_points;

	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;
		uint64_t byte = s->points[mid].cbit / 8;

		if (byte == coff)
			return &s->points[mid];
		if (byte < coff)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

static int points_bad(uint32_t blob, uint32_t k, const char *why)
{
	ferry_err("resume points: blob %u, point %u: %s", blob, k, why);
	return -EFSCORRUPTED;
}

/* One stream's points from @p (@end its bound): fields and order. */
static int decode_points(const uint8_t **p, const uint8_t *end,
			 const struct blob_info *info, struct blob_stream *s)
{
	uint32_t k;

	for (k = 0; k < s->nr_points; k++) {
		struct blob_stream_point *pt = &s->points[k];
		const uint8_t *e = *p;
		const char *bad = NULL;

		if ((size_t)(end - e) < RP_POINT)
			return points_bad(s->blob, k, "runs past the section's end");
		pt->cbit = get_le64(e);
		pt->uoff = get_le64(e + 8);
		pt->window_len = get_le32(e + 16);
		pt->window_clen = get_le32(e + 20);
		pt->flags = get_le32(e + 24);
		pt->window = e + RP_POINT;
		if (pt->window_clen > (size_t)(end - e) - RP_POINT)
			return points_bad(s->blob, k, "window runs past the section's end");
		*p = e + RP_POINT + pt->window_clen;
		if (pt->flags & ~BLOB_POINT_HEADER)
			bad = "unknown flags";
		else if (k && (pt->cbit / 8 <= pt[-1].cbit / 8 || pt->uoff <= pt[-1].uoff))
			bad = "not after the point before it";
		else if (!k && (pt->cbit || pt->uoff))
			bad = "the first point is not at the stream's start";
		else if (pt->cbit / 8 >= info->size || pt->uoff >= s->usize)
			bad = "outside the stream";
		else if (s->format == BLOB_STREAM_ZSTD &&
			 (pt->cbit % 8 || pt->window_len || pt->flags))
			bad = "not a zstd frame boundary";
		else if (pt->window_len > BLOB_STREAM_WINDOW || pt->window_len > pt->uoff)
			bad = "window larger than the decoded bytes before it";
		else if ((pt->flags & BLOB_POINT_HEADER) &&
			 (pt->cbit % 8 || pt->window_len))
			bad = "member header with a window or not at a byte";
		else if (!k && s->format == BLOB_STREAM_GZIP &&
			 !(pt->flags & BLOB_POINT_HEADER))
			bad = "the first point is not a member header";
		else if (!pt->window_len != !pt->window_clen ||
			 pt->window_clen > ZSTD_compressBound(BLOB_STREAM_WINDOW))
			bad = "window size out of range";
		if (bad)
			return points_bad(s->blob, k, bad);
	}
	return 0;
}

/* Every frame of stream blob @info decodes from one of @s's points. */
static int check_frames(const struct blob_info *info, const struct blob_stream *s)
{
	uint32_t i;

	for (i = 0; i < info->nr_chunks; i++) {
		const struct blob_chunk *c = &info->chunks[i];
		const struct blob_stream_point *pt;
		bool want_none = s->format == BLOB_STREAM_TAR;
		uint8_t codec = s->format == BLOB_STREAM_GZIP ? BLOB_CODEC_GZIP_STREAM :
				s->format == BLOB_STREAM_ZSTD ? BLOB_CODEC_ZSTD_STREAM :
								 BLOB_CODEC_NONE;
		uint64_t end;

		if (c->codec != codec) {
			ferry_err("resume points: blob %u: chunk %u has codec %s in a %s stream",
				  s->blob, i, blob_codec_name(c->codec),
				  want_none ? "tar" : blob_codec_name(codec));
			return -EFSCORRUPTED;
		}
		if (c->frame_off)
			continue;
		if (want_none) {
			end = c->coff + c->frame_usize;
		} else {
			pt = point_at(s, c->coff);
			if (!pt) {
				ferry_err("resume points: blob %u: chunk %u's frame starts at byte %llu, where no point is",
					  s->blob, i, (unsigned long long)c->coff);
				return -EFSCORRUPTED;
			}
			end = pt->uoff + c->frame_skip + c->frame_usize;
		}
		if (end > s->usize) {
			ferry_err("resume points: blob %u: chunk %u's frame ends past the decoded stream (%llu bytes)",
				  s->blob, i, (unsigned long long)s->usize);
			return -EFSCORRUPTED;
		}
	}
	return 0;
}

int blob_streams_decode(const void *buf, size_t len,
			const struct blob_index *idx, struct blob_streams *out,
			size_t *used)
{
	const uint8_t *p = buf, *end = p + len;
	struct blob_streams ss = { 0 };
	uint32_t i, nr, want = 0, next = 0;
	int ret = -EFSCORRUPTED;

	memset(out, 0, sizeof(*out));
	if (len < RP_HEADER || !blob_streams_magic(buf, len) ||
	    get_le32(p + 8) != BLOB_STREAMS_VERSION) {
		ferry_err("resume points: bad section header");
		return -EFSCORRUPTED;
	}
	nr = get_le32(p + 12);
	for (i = 0; i < idx->nr_blobs; i++)
		want += !!(idx->blobs[i].flags & BLOB_INFO_STREAM);
	if (nr != want) {
		ferry_err("resume points: %u streams for %u stream blobs", nr, want);
		return -EFSCORRUPTED;
	}
	p += RP_HEADER;
	ss.streams = calloc(MAX(nr, 1u), sizeof(*ss.streams));
	if (!ss.streams)
		return -ENOMEM;
	ss.nr = nr;
	for (i = 0; i < nr; i++) {
		struct blob_stream *s = &ss.streams[i];
		const struct blob_info *info;

		if ((size_t)(end - p) < RP_STREAM) {
			ferry_err("resume points: stream %u runs past the section's end", i);
			goto fail;
		}
		s->blob = get_le32(p);
		s->format = p[4];
		s->nr_points = get_le32(p + 8);
		s->usize = get_le64(p + 16);
		memcpy(s->diff_id, p + 24, BLOB_DIGEST_SIZE);
		while (next < idx->nr_blobs &&
		       !(idx->blobs[next].flags & BLOB_INFO_STREAM))
			next++;
		if (s->blob != next || s->blob >= idx->nr_blobs ||
		    s->format > BLOB_STREAM_ZSTD || !mem_is_zero(p + 5, 3) ||
		    get_le32(p + 12) || get_le64(p + 56) ||
		    s->nr_points > BLOB_STREAM_POINTS_MAX ||
		    (s->format == BLOB_STREAM_TAR) != !s->nr_points) {
			ferry_err("resume points: stream %u (blob %u): bad header", i,
				  s->blob);
			goto fail;
		}
		next++;
		p += RP_STREAM;
		info = &idx->blobs[s->blob];
		s->points = calloc(MAX(s->nr_points, 1u), sizeof(*s->points));
		if (!s->points) {
			ret = -ENOMEM;
			goto fail;
		}
		if (decode_points(&p, end, info, s) || check_frames(info, s))
			goto fail;
	}
	*out = ss;
	*used = (size_t)(p - (const uint8_t *)buf);
	return 0;
fail:
	blob_streams_free(&ss);
	return ret;
}

/* ------------------------------------------------------------------ */
/* Decoding frames                                                     */
/* ------------------------------------------------------------------ */

/* The decoded bytes a reader keeps (circular): a window at each boundary. */
#define RING (2 * BLOB_STREAM_WINDOW)

struct blob_stream_reader {
	z_stream z;
	bool z_ready;      /* inflateInit2 done */
	bool z_gzip;       /* in a member with its header (else raw deflate) */
#ifdef FERRY_HAVE_ISAL
	struct inflate_state *isal; /* blob_stream_point_decode's, made on first use */
#endif
	ZSTD_DStream *zd;
	/* Where the decoder stands: bytes of the current run it reads. */
	bool active;
	const uint8_t *run; /* the run's first byte, at run_coff of the blob */
	uint64_t run_coff;
	const uint8_t *in;  /* next input byte */
	const uint8_t *in_end;
	uint64_t pos;       /* decoded stream offset of the next output byte */
	uint64_t member_out; /* decoded bytes of the current gzip member */
	/* The last place passed where decoding can resume, to learn. */
	bool boundary;
	uint64_t b_cbit, b_uoff;
	uint32_t b_window_len;
	uint8_t b_window[BLOB_STREAM_WINDOW]; /* its window, copied there */
	uint8_t ring[RING]; /* the last decoded bytes: ring[pos % RING] next */
	uint8_t window[BLOB_STREAM_WINDOW];
	uint8_t skip[SKIP_BUF];
};

int blob_stream_reader_new(struct blob_stream_reader **out)
{
	*out = calloc(1, sizeof(**out));
	return *out ? 0 : -ENOMEM;
}

void blob_stream_reader_reset(struct blob_stream_reader *r)
{
	r->active = false;
	r->boundary = false;
}

void blob_stream_reader_free(struct blob_stream_reader *r)
{
	if (!r)
		return;
	if (r->z_ready)
		inflateEnd(&r->z);
#ifdef FERRY_HAVE_ISAL
	free(r->isal);
#endif
	ZSTD_freeDStream(r->zd);
	free(r);
}

static int frame_bad(const struct blob_stream *s, const struct blob_chunk *c,
		     const char *why)
{
	ferry_err("stream blob %u: frame at byte %llu (decoded offset +%u): %s",
		  s->blob, (unsigned long long)c->coff, c->frame_skip, why);
	return -EFSCORRUPTED;
}

/* Keep @n decoded bytes ending at r->pos + @n in the ring. */
static void ring_put(struct blob_stream_reader *r, const uint8_t *p, size_t n)
{
	uint64_t at = r->pos;
	size_t first;

	if (n > RING) {
		p += n - RING;
		at += n - RING;
		n = RING;
	}
	first = MIN(n, RING - (size_t)(at % RING));
	memcpy(r->ring + at % RING, p, first);
	memcpy(r->ring, p + first, n - first);
}

/* Point @pt's window, decoded (into r->window) when it is stored compressed. */
static int point_window(struct blob_stream_reader *r, const struct blob_stream_point *pt,
			const uint8_t **w)
{
	*w = pt->window;
	if (pt->window_clen == pt->window_len) /* stored as it is */
		return 0;
	*w = r->window;
	return blob_decompress(BLOB_CODEC_ZSTD, pt->window, pt->window_clen, r->window,
			       pt->window_len);
}

/* Set the decoder up at point @pt, whose first byte is @in. */
static int start_at(struct blob_stream_reader *r, const struct blob_stream *s,
		    const struct blob_stream_point *pt, const uint8_t *in)
{
	unsigned int bits = (unsigned int)(pt->cbit % 8);

	r->in = in;
	r->pos = pt->uoff;
	r->member_out = pt->window_len;
	r->boundary = false;
	if (s->format == BLOB_STREAM_ZSTD) {
		if (!r->zd && !(r->zd = ZSTD_createDStream()))
			return -ENOMEM;
		ZSTD_DCtx_reset(r->zd, ZSTD_reset_session_only);
		return 0;
	}
	if (!r->z_ready) {
		if (inflateInit2(&r->z, -15) != Z_OK)
			return -ENOMEM;
		r->z_ready = true;
	}
	r->z_gzip = pt->flags & BLOB_POINT_HEADER;
	if (inflateReset2(&r->z, r->z_gzip ? 15 + 16 : -15) != Z_OK)
		return -EINVAL;
	if (bits) {
		if (r->in >= r->in_end)
			return -EFSCORRUPTED;
		/* The byte's low bits were the block before: take its high ones. */
		if (inflatePrime(&r->z, (int)(8 - bits), *r->in >> bits) != Z_OK)
			return -EFSCORRUPTED;
		r->in++;
	}
	if (pt->window_len) {
		const uint8_t *w;
		int ret = point_window(r, pt, &w);

		if (ret)
			return ret;
		if (inflateSetDictionary(&r->z, w, pt->window_len) != Z_OK)
			return -EFSCORRUPTED;
		/* The ring starts with it: a point learned soon after needs it. */
		r->pos -= pt->window_len;
		ring_put(r, w, pt->window_len);
		r->pos += pt->window_len;
	}
	return 0;
}

/* After a gzip member: the next one's header, or the stream's end. */
static int next_member(struct blob_stream_reader *r)
{
	/* Raw deflate ends at a byte boundary; its member's trailer follows. */
	if (!r->z_gzip) {
		if (r->in_end - r->in < 8)
			return -EFSCORRUPTED;
		r->in += 8;
	}
	if (r->in_end - r->in < 2 || r->in[0] != 0x1f || r->in[1] != 0x8b)
		return -EFSCORRUPTED; /* the stream ended before the frame did */
	r->z_gzip = true;
	r->member_out = 0;
	return inflateReset2(&r->z, 15 + 16) == Z_OK ? 0 : -EINVAL;
}

/* A boundary at @cbit, decoded offset @uoff (its bytes in the ring). */
static void note_boundary(struct blob_stream_reader *r, uint64_t cbit, uint64_t uoff,
			  uint32_t wlen)
{
	uint32_t i;

	r->boundary = true;
	r->b_cbit = cbit;
	r->b_uoff = uoff;
	r->b_window_len = wlen;
	for (i = 0; i < wlen; i++)
		r->b_window[i] = r->ring[(uoff - wlen + i) % RING];
}

/* Decode exactly @len bytes into @out (advancing pos). */
static int decode_some(struct blob_stream_reader *r, const struct blob_stream *s,
		       uint8_t *out, size_t len)
{
	while (len) {
		size_t avail = (size_t)(r->in_end - r->in), produced;

		if (s->format == BLOB_STREAM_ZSTD) {
			ZSTD_inBuffer ib = { r->in, avail, 0 };
			ZSTD_outBuffer ob = { out, len, 0 };
			size_t zr = ZSTD_decompressStream(r->zd, &ob, &ib);

			if (ZSTD_isError(zr))
				return -EFSCORRUPTED;
			r->in += ib.pos;
			produced = ob.pos;
			if (!produced && !ib.pos)
				return -EFSCORRUPTED; /* input ends early */
			if (!zr) /* a frame ended: the next one decodes alone */
				note_boundary(r, (r->run_coff + (uint64_t)(r->in - r->run)) * 8,
					      r->pos + produced, 0);
		} else {
			int zr;

			r->z.next_in = (Bytef *)r->in;
			r->z.avail_in = (uInt)MIN(avail, (size_t)UINT_MAX);
			r->z.next_out = out;
			r->z.avail_out = (uInt)MIN(len, (size_t)UINT_MAX);
			/* Z_BLOCK: note each block boundary, a point to learn. */
			zr = inflate(&r->z, Z_BLOCK);
			produced = (size_t)(r->z.next_out - out);
			r->in = r->z.next_in;
			ring_put(r, out, produced);
			r->member_out += produced;
			if (zr == Z_OK && (r->z.data_type & 128) && !(r->z.data_type & 64))
				note_boundary(r, (r->run_coff + (uint64_t)(r->in - r->run)) * 8 -
						 (uint64_t)(r->z.data_type & 7),
					      r->pos + produced,
					      (uint32_t)MIN(r->member_out,
							    (uint64_t)BLOB_STREAM_WINDOW));
			if (zr == Z_STREAM_END) {
				zr = next_member(r);
				if (zr && produced < len)
					return zr;
			} else if (zr != Z_OK && !(zr == Z_BUF_ERROR && produced)) {
				return zr == Z_MEM_ERROR ? -ENOMEM : -EFSCORRUPTED;
			}
		}
		out += produced;
		len -= produced;
		r->pos += produced;
	}
	return 0;
}

int blob_stream_frame_decode(struct blob_stream_reader *r,
			     const struct blob_stream *s,
			     const struct blob_chunk *c, const uint8_t *run,
			     uint64_t run_coff, size_t run_len, void *out)
{
	const struct blob_stream_point *pt;
	uint64_t start;
	int ret;

	if (c->codec == BLOB_CODEC_NONE) {
		if (c->coff < run_coff || c->coff - run_coff > run_len ||
		    c->frame_usize > run_len - (c->coff - run_coff))
			return frame_bad(s, c, "outside the bytes read");
		memcpy(out, run + (c->coff - run_coff), c->frame_usize);
		return 0;
	}
	pt = point_at(s, c->coff);
	if (!pt)
		return frame_bad(s, c, "no resume point there");
	start = pt->uoff + c->frame_skip;
	/* Go on from the frame before when it stopped between point and frame. */
	if (!r->active || r->pos < pt->uoff || r->pos > start ||
	    r->in_end != run + run_len) {
		if (c->coff < run_coff || c->coff - run_coff >= run_len)
			return frame_bad(s, c, "no resume point in the bytes read");
		r->run = run;
		r->run_coff = run_coff;
		r->in_end = run + run_len;
		r->active = false;
		ret = start_at(r, s, pt, run + (c->coff - run_coff));
		if (ret)
			return ret == -EFSCORRUPTED ?
			       frame_bad(s, c, "the resume point does not decode") : ret;
		r->active = true;
	}
	while (r->pos < start) {
		ret = decode_some(r, s, r->skip, (size_t)MIN(start - r->pos,
							      (uint64_t)SKIP_BUF));
		if (ret)
			goto fail;
	}
	ret = decode_some(r, s, out, c->frame_usize);
	if (!ret)
		return 0;
fail:
	r->active = false;
	return ret == -EFSCORRUPTED ? frame_bad(s, c, "does not decode") : ret;
}

#ifdef FERRY_HAVE_ISAL
/*
 * ISA-L's raw inflate from the point: its window as the dictionary, and
 * the bits of the point's first byte that belong to its block (zlib's
 * inflatePrime) put in the decoder's bit buffer, read_in, as
 * isal_inflate would have left them there.
 */
static int point_decode_isal(struct blob_stream_reader *r, const struct blob_stream_point *pt,
			     const uint8_t *in, size_t in_len, void *out, size_t out_len)
{
	unsigned int bits = (unsigned int)(pt->cbit % 8);
	struct inflate_state *st = r->isal;
	const uint8_t *w;
	int ret;

	if (!st && !(st = r->isal = malloc(sizeof(*st))))
		return -ENOMEM;
	if (in_len > UINT32_MAX || out_len > UINT32_MAX)
		return -EINVAL;
	isal_inflate_init(st); /* raw deflate, 32 KiB of history */
	if (pt->window_len) {
		ret = point_window(r, pt, &w);
		if (ret)
			return ret;
		if (isal_inflate_set_dict(st, (uint8_t *)w, pt->window_len) != COMP_OK)
			return -EFSCORRUPTED;
	}
	if (bits) {
		if (!in_len)
			return -EFSCORRUPTED;
		st->read_in = *in >> bits;
		st->read_in_length = (int32_t)(8 - bits);
		in++;
		in_len--;
	}
	st->next_in = (uint8_t *)in;
	st->avail_in = (uint32_t)in_len;
	st->next_out = out;
	st->avail_out = (uint32_t)out_len;
	/* Short output: the input ended, or the deflate stream did. */
	return isal_inflate(st) == ISAL_DECOMP_OK && !st->avail_out ? 0 : -EFSCORRUPTED;
}
#endif

int blob_stream_point_decode(struct blob_stream_reader *r, const struct blob_stream_point *pt,
			     const uint8_t *in, size_t in_len, void *out, size_t out_len)
{
#ifdef FERRY_HAVE_ISAL
	return point_decode_isal(r, pt, in, in_len, out, out_len);
#else
	struct blob_stream_point p = *pt;
	struct blob_stream s = { .format = BLOB_STREAM_GZIP, .usize = UINT64_MAX,
				 .points = &p, .nr_points = 1 };
	struct blob_chunk c = { .coff = pt->cbit / 8, .csize = (uint32_t)in_len,
				.frame_usize = (uint32_t)out_len,
				.codec = BLOB_CODEC_GZIP_STREAM };

	if (in_len > UINT32_MAX || out_len > UINT32_MAX)
		return -EINVAL;
	blob_stream_reader_reset(r);
	return blob_stream_frame_decode(r, &s, &c, in, c.coff, in_len, out);
#endif
}

/* ------------------------------------------------------------------ */
/* Points learned while decoding                                       */
/* ------------------------------------------------------------------ */

/*
 * A mount's reads of a stream blob decode from its resume points; each
 * run also passes block boundaries, and the last one is kept here (in
 * memory, this process only) as a point of its own: a later read of the
 * same span fetches from there rather than from the span's start again.
 * A boundary is where the decoder truly was and its window the bytes it
 * decoded, so a learned point is as good as a recorded one: a wrong
 * layer byte breaks every chunk after it either way.
 */
#define LEARNED_MAX 64u
/* A learned point this close after another point adds little. */
#define LEARNED_MIN_GAP (64u << 10)

struct learned_point {
	uint64_t cbit, uoff;
	uint32_t window_len;
	uint64_t used; /* clock of its last use */
	uint8_t window[BLOB_STREAM_WINDOW];
};

struct blob_stream_learned {
	pthread_mutex_t lock;
	struct learned_point *pts; /* LEARNED_MAX, in no order */
	uint32_t nr;
	uint64_t clock;
};

int blob_stream_learned_new(struct blob_stream_learned **out)
{
	struct blob_stream_learned *l = calloc(1, sizeof(*l));

	if (!l || !(l->pts = calloc(LEARNED_MAX, sizeof(*l->pts)))) {
		free(l);
		return -ENOMEM;
	}
	pthread_mutex_init(&l->lock, NULL);
	*out = l;
	return 0;
}

void blob_stream_learned_free(struct blob_stream_learned *l)
{
	if (!l)
		return;
	pthread_mutex_destroy(&l->lock);
	free(l->pts);
	free(l);
}

bool blob_stream_learned_find(struct blob_stream_learned *l, const struct blob_stream *s,
			      const struct blob_chunk *c, struct blob_stream_point *pt,
			      uint8_t window[BLOB_STREAM_WINDOW])
{
	const struct blob_stream_point *sp = point_at(s, c->coff);
	struct learned_point *best = NULL;
	uint64_t start;
	uint32_t i;

	if (!l || !sp)
		return false;
	start = sp->uoff + c->frame_skip;
	pthread_mutex_lock(&l->lock);
	for (i = 0; i < l->nr; i++) {
		struct learned_point *p = &l->pts[i];

		if (p->uoff > sp->uoff && p->uoff <= start && (!best || p->uoff > best->uoff))
			best = p;
	}
	if (best) {
		best->used = ++l->clock;
		*pt = (struct blob_stream_point){ .cbit = best->cbit, .uoff = best->uoff,
						  .window_len = best->window_len,
						  .window_clen = best->window_len,
						  .window = window };
		memcpy(window, best->window, best->window_len);
	}
	pthread_mutex_unlock(&l->lock);
	return best;
}

int blob_stream_reader_begin(struct blob_stream_reader *r, const struct blob_stream *s,
			     const struct blob_stream_point *pt, const uint8_t *run,
			     uint64_t run_coff, size_t run_len)
{
	int ret;

	if (pt->cbit / 8 < run_coff || pt->cbit / 8 - run_coff >= run_len)
		return -EINVAL;
	r->run = run;
	r->run_coff = run_coff;
	r->in_end = run + run_len;
	ret = start_at(r, s, pt, run + (pt->cbit / 8 - run_coff));
	r->active = !ret;
	return ret;
}

void blob_stream_reader_learn(struct blob_stream_reader *r, const struct blob_stream *s,
			      struct blob_stream_learned *l)
{
	struct learned_point *p;
	uint32_t i;

	if (!l || !r->boundary)
		return;
	/* Not near a recorded point (one at or before it within the gap). */
	for (i = s->nr_points; i-- > 0 && s->points[i].uoff > r->b_uoff;)
		;
	if (i < s->nr_points && r->b_uoff - s->points[i].uoff < LEARNED_MIN_GAP)
		return;
	pthread_mutex_lock(&l->lock);
	for (i = 0; i < l->nr; i++)
		if (l->pts[i].uoff <= r->b_uoff && r->b_uoff - l->pts[i].uoff < LEARNED_MIN_GAP)
			goto out;
	if (l->nr < LEARNED_MAX) {
		p = &l->pts[l->nr++];
	} else {
		p = &l->pts[0];
		for (i = 1; i < l->nr; i++)
			if (l->pts[i].used < p->used)
				p = &l->pts[i];
	}
	p->cbit = r->b_cbit;
	p->uoff = r->b_uoff;
	p->window_len = r->b_window_len;
	p->used = ++l->clock;
	memcpy(p->window, r->b_window, r->b_window_len);
out:
	pthread_mutex_unlock(&l->lock);
}

/* ------------------------------------------------------------------ */
/* ferry check: the whole layer once                                   */
/* ------------------------------------------------------------------ */

#define VERIFY_READ (16u << 20)
#define VERIFY_OUT (1u << 20)
/* Decoded bytes checked after each point: all that can copy from its
 * window (`ferry index` stores only the bytes they copy, FORMAT.md 2.8). */
#define VERIFY_PROBE (BLOB_STREAM_WINDOW + 258u)
#define VERIFY_PROBE_IN (256u << 10) /* layer bytes read to decode them */

struct verify {
	const struct blob_source *src;
	const struct blob_info *info;
	const struct blob_stream *s;
	const char *name;
	struct blob_verify_report *report;
	uint64_t *cstart;            /* each chunk's decoded stream offset */
	uint32_t chunk;              /* the next chunk to finish */
	struct sha256_hasher *chunk_hash; /* of chunk `chunk`, once begun */
	struct sha256_hasher *diff;  /* of the decoded stream */
	uint8_t ring[BLOB_STREAM_WINDOW]; /* the last decoded bytes */
	uint64_t pos;                /* decoded bytes so far */
	uint32_t point;              /* the next point to reach */
	uint8_t *probe;              /* VERIFY_PROBE bytes after each point */
	uint8_t window[BLOB_STREAM_WINDOW];
};

static int verify_fail(struct verify *v, uint32_t chunk, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int verify_fail(struct verify *v, uint32_t chunk, const char *fmt, ...)
{
	char msg[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (chunk == BLOB_VERIFY_NO_CHUNK)
		ferry_err("stream blob %s: %s", v->name, msg);
	else
		ferry_err("stream blob %s: chunk %u (uncompressed offset %llu): %s",
			  v->name, chunk,
			  (unsigned long long)v->info->chunks[chunk].uoff, msg);
	if (v->report && !v->report->error) {
		v->report->error = chunk == BLOB_VERIFY_NO_CHUNK ? -EFSCORRUPTED : -EIO;
		v->report->bad_chunk = chunk;
		v->report->bad_uoff = chunk == BLOB_VERIFY_NO_CHUNK ?
				      BLOB_VERIFY_NO_UOFF : v->info->chunks[chunk].uoff;
	}
	return chunk == BLOB_VERIFY_NO_CHUNK ? -EFSCORRUPTED : -EIO;
}

/* Each chunk's offset in the decoded stream; they must ascend. */
static int chunk_starts(struct verify *v)
{
	uint32_t i;

	v->cstart = calloc(MAX(v->info->nr_chunks, 1u), sizeof(*v->cstart));
	if (!v->cstart)
		return -ENOMEM;
	for (i = 0; i < v->info->nr_chunks; i++) {
		const struct blob_chunk *c = &v->info->chunks[i];
		const struct blob_stream_point *pt = point_at(v->s, c->coff);
		uint64_t base = c->codec == BLOB_CODEC_NONE ? c->coff :
				pt ? pt->uoff : UINT64_MAX;

		if (base == UINT64_MAX)
			return verify_fail(v, i, "no resume point at its frame's byte %llu",
					   (unsigned long long)c->coff);
		v->cstart[i] = base + c->frame_skip + c->frame_off;
		if (i && v->cstart[i] < v->cstart[i - 1] + v->info->chunks[i - 1].usize)
			return verify_fail(v, i, "not after the chunk before it in the decoded stream");
	}
	return 0;
}

/* Decoded bytes [v->pos, v->pos + @n): hashes, chunks, windows. */
static int verify_out(struct verify *v, const uint8_t *p, size_t n)
{
	uint64_t end = v->pos + n;
	int ret;

	sha256_hasher_update(v->diff, p, n);
	while (v->chunk < v->info->nr_chunks && v->cstart[v->chunk] < end) {
		const struct blob_chunk *c = &v->info->chunks[v->chunk];
		uint64_t from = MAX(v->cstart[v->chunk], v->pos);
		uint64_t to = MIN(v->cstart[v->chunk] + c->usize, end);
		uint8_t digest[BLOB_DIGEST_SIZE];

		if (!v->chunk_hash) {
			ret = sha256_hasher_new(&v->chunk_hash);
			if (ret)
				return ret;
		}
		sha256_hasher_update(v->chunk_hash, p + (from - v->pos), to - from);
		if (to < v->cstart[v->chunk] + c->usize)
			break;
		sha256_hasher_final(v->chunk_hash, digest);
		sha256_hasher_free(v->chunk_hash);
		v->chunk_hash = NULL;
		if (memcmp(digest, c->sha256, BLOB_DIGEST_SIZE))
			return verify_fail(v, v->chunk, "does not match its sha256");
		v->chunk++;
	}
	/* The ring keeps the last 32 KiB, for the next point's window. */
	if (n >= BLOB_STREAM_WINDOW) {
		memcpy(v->ring, p + n - BLOB_STREAM_WINDOW, BLOB_STREAM_WINDOW);
	} else {
		memmove(v->ring, v->ring + n, BLOB_STREAM_WINDOW - n);
		memcpy(v->ring + BLOB_STREAM_WINDOW - n, p, n);
	}
	if (v->point && v->point <= v->s->nr_points) {
		/* Probe bytes of the points just passed. */
		uint32_t k;

		for (k = v->point; k-- > 0;) {
			const struct blob_stream_point *pt = &v->s->points[k];
			uint64_t pend = pt->uoff + VERIFY_PROBE;

			if (pend <= v->pos)
				break;
			memcpy(v->probe + (size_t)k * VERIFY_PROBE +
				       (size_t)(MAX(v->pos, pt->uoff) - pt->uoff),
			       p + (MAX(v->pos, pt->uoff) - v->pos),
			       (size_t)(MIN(end, pend) - MAX(v->pos, pt->uoff)));
		}
	}
	v->pos = end;
	return 0;
}

/* At point v->point: its window must be the bytes just decoded, or zeros
 * where nothing copies from (verify_points decodes what can). */
static int verify_window(struct verify *v)
{
	const struct blob_stream_point *pt = &v->s->points[v->point];
	const uint8_t *before = v->ring + BLOB_STREAM_WINDOW - pt->window_len;
	uint32_t i = 0;
	int ret;

	if (pt->window_len) {
		ret = blob_decompress(pt->window_clen == pt->window_len ?
				      BLOB_CODEC_NONE : BLOB_CODEC_ZSTD,
				      pt->window, pt->window_clen, v->window,
				      pt->window_len);
		while (!ret && i < pt->window_len &&
		       (v->window[i] == before[i] || !v->window[i]))
			i++;
		if (ret || i < pt->window_len)
			return verify_fail(v, BLOB_VERIFY_NO_CHUNK,
					   "resume point %u: its window is not the stream's bytes before it",
					   v->point);
	}
	v->point++;
	return 0;
}

/* Hand decoded bytes to verify_out, stopping at every point. */
static int verify_feed(struct verify *v, const uint8_t *p, size_t n)
{
	int ret;

	while (n) {
		size_t step = n;

		while (v->point < v->s->nr_points && v->s->points[v->point].uoff == v->pos) {
			ret = verify_window(v);
			if (ret)
				return ret;
		}
		if (v->point < v->s->nr_points)
			step = (size_t)MIN((uint64_t)n, v->s->points[v->point].uoff - v->pos);
		ret = verify_out(v, p, step);
		if (ret)
			return ret;
		p += step;
		n -= step;
	}
	return 0;
}

/* Decode from each point with the random-access path and compare. */
static int verify_points(struct verify *v)
{
	struct blob_stream_reader *r = NULL;
	uint8_t *in = NULL, *out = NULL;
	uint32_t k;
	int ret;

	ret = blob_stream_reader_new(&r);
	if (!ret && (!(in = malloc(VERIFY_PROBE_IN)) || !(out = malloc(VERIFY_PROBE))))
		ret = -ENOMEM;
	for (k = 0; !ret && k < v->s->nr_points; k++) {
		const struct blob_stream_point *pt = &v->s->points[k];
		uint64_t coff = pt->cbit / 8;
		size_t clen = (size_t)MIN((uint64_t)VERIFY_PROBE_IN, v->info->size - coff);
		struct blob_chunk c = {
			.coff = coff, .csize = (uint32_t)clen,
			.frame_usize = (uint32_t)MIN((uint64_t)VERIFY_PROBE, v->s->usize - pt->uoff),
			.codec = v->s->format == BLOB_STREAM_GZIP ? BLOB_CODEC_GZIP_STREAM :
								    BLOB_CODEC_ZSTD_STREAM,
		};

		ret = v->src->read(v->src->ctx, coff, in, clen);
		if (ret) {
			ferry_err("stream blob %s: reading bytes %llu..%llu: %s", v->name,
				  (unsigned long long)coff, (unsigned long long)(coff + clen),
				  ferry_strerror(ret));
			break;
		}
		blob_stream_reader_reset(r);
		if (blob_stream_frame_decode(r, v->s, &c, in, coff, clen, out) ||
		    memcmp(out, v->probe + (size_t)k * VERIFY_PROBE, c.frame_usize))
			ret = verify_fail(v, BLOB_VERIFY_NO_CHUNK,
					  "resume point %u (bit %llu) does not decode to the stream's bytes there",
					  k, (unsigned long long)pt->cbit);
	}
	blob_stream_reader_free(r);
	free(in);
	free(out);
	return ret;
}

/* The decoder of the sequential pass. */
struct verify_dec {
	const struct blob_stream *s;
	z_stream z;
	bool z_ready, member_end, tail;
	ZSTD_DStream *zd;
};

/* Decode @in (all of it) into verify_feed. */
static int verify_decode(struct verify *v, struct verify_dec *d, const uint8_t *in,
			 size_t len, uint8_t *out)
{
	while (len) {
		size_t produced, used;

		if (d->s->format == BLOB_STREAM_TAR) {
			produced = MIN(len, (size_t)VERIFY_OUT);
			memcpy(out, in, produced);
			used = produced;
		} else if (d->s->format == BLOB_STREAM_ZSTD) {
			ZSTD_inBuffer ib = { in, len, 0 };
			ZSTD_outBuffer ob = { out, VERIFY_OUT, 0 };
			size_t zr = ZSTD_decompressStream(d->zd, &ob, &ib);

			if (ZSTD_isError(zr))
				return verify_fail(v, BLOB_VERIFY_NO_CHUNK, "corrupt zstd stream: %s",
						   ZSTD_getErrorName(zr));
			produced = ob.pos;
			used = ib.pos;
		} else if (d->tail) {
			/* After the last member only NUL padding may follow. */
			if (!mem_is_zero(in, len))
				return verify_fail(v, BLOB_VERIFY_NO_CHUNK,
						   "trailing garbage after the gzip stream");
			return 0;
		} else {
			int zr;

			if (d->member_end) {
				if (in[0] != 0x1f) {
					d->tail = true;
					continue;
				}
				inflateReset(&d->z);
				d->member_end = false;
			}
			d->z.next_in = (Bytef *)in;
			d->z.avail_in = (uInt)MIN(len, (size_t)UINT_MAX);
			d->z.next_out = out;
			d->z.avail_out = VERIFY_OUT;
			zr = inflate(&d->z, Z_NO_FLUSH);
			if (zr != Z_OK && zr != Z_STREAM_END && zr != Z_BUF_ERROR)
				return verify_fail(v, BLOB_VERIFY_NO_CHUNK, "corrupt gzip stream: %s",
						   d->z.msg ? d->z.msg : "bad data");
			d->member_end = zr == Z_STREAM_END;
			produced = VERIFY_OUT - d->z.avail_out;
			used = (size_t)(d->z.next_in - in);
		}
		if (!produced && !used)
			return verify_fail(v, BLOB_VERIFY_NO_CHUNK, "the decoder makes no progress");
		if (produced) {
			int ret = verify_feed(v, out, produced);

			if (ret)
				return ret;
		}
		in += used;
		len -= used;
	}
	return 0;
}

int blob_stream_verify(const struct blob_source *src, const char *name,
		       const struct blob_info *info, const struct blob_stream *s,
		       struct blob_verify_report *report)
{
	struct verify v = { .src = src, .info = info, .s = s, .name = name,
			    .report = report };
	struct verify_dec d = { .s = s };
	struct sha256_hasher *whole = NULL;
	uint8_t digest[BLOB_DIGEST_SIZE];
	uint8_t *in = NULL, *out = NULL;
	uint64_t off;
	int ret;

	if (report)
		*report = (struct blob_verify_report){ .bad_chunk = BLOB_VERIFY_NO_CHUNK,
						       .bad_uoff = BLOB_VERIFY_NO_UOFF };
	if (!s)
		return verify_fail(&v, BLOB_VERIFY_NO_CHUNK, "no resume points");
	ret = chunk_starts(&v);
	if (ret)
		goto out;
	if (s->format == BLOB_STREAM_GZIP) {
		if (inflateInit2(&d.z, 15 + 16) != Z_OK) {
			ret = -ENOMEM;
			goto out;
		}
		d.z_ready = true;
	} else if (s->format == BLOB_STREAM_ZSTD && !(d.zd = ZSTD_createDStream())) {
		ret = -ENOMEM;
		goto out;
	}
	in = malloc(VERIFY_READ);
	out = malloc(VERIFY_OUT);
	v.probe = calloc(MAX(s->nr_points, 1u), VERIFY_PROBE);
	ret = !in || !out || !v.probe ? -ENOMEM : sha256_hasher_new(&whole);
	if (!ret)
		ret = sha256_hasher_new(&v.diff);
	for (off = 0; !ret && off < info->size; off += VERIFY_READ) {
		size_t n = (size_t)MIN((uint64_t)VERIFY_READ, info->size - off);

		ret = src->read(src->ctx, off, in, n);
		if (ret) {
			ferry_err("stream blob %s: reading bytes %llu..%llu: %s", name,
				  (unsigned long long)off, (unsigned long long)(off + n),
				  ferry_strerror(ret));
			break;
		}
		sha256_hasher_update(whole, in, n);
		ret = verify_decode(&v, &d, in, n, out);
	}
	if (ret)
		goto out;
	sha256_hasher_final(whole, digest);
	if (memcmp(digest, info->digest, BLOB_DIGEST_SIZE)) {
		ret = verify_fail(&v, BLOB_VERIFY_NO_CHUNK, "the layer does not match its digest");
		goto out;
	}
	/* A point at the very end is refused by blob_streams_decode. */
	sha256_hasher_final(v.diff, digest);
	if (v.pos != s->usize || memcmp(digest, s->diff_id, BLOB_DIGEST_SIZE) ||
	    (s->format == BLOB_STREAM_GZIP && !d.member_end && !d.tail)) {
		ret = verify_fail(&v, BLOB_VERIFY_NO_CHUNK,
				  "the decoded stream (%llu bytes) is not the one indexed (%llu bytes, its diff_id)",
				  (unsigned long long)v.pos, (unsigned long long)s->usize);
		goto out;
	}
	if (v.chunk < info->nr_chunks) {
		ret = verify_fail(&v, v.chunk, "past the end of the decoded stream");
		goto out;
	}
	if (s->format != BLOB_STREAM_TAR)
		ret = verify_points(&v);
out:
	if (d.z_ready)
		inflateEnd(&d.z);
	ZSTD_freeDStream(d.zd);
	sha256_hasher_free(whole);
	sha256_hasher_free(v.diff);
	sha256_hasher_free(v.chunk_hash);
	free(v.cstart);
	free(v.probe);
	free(in);
	free(out);
	return ret;
}
