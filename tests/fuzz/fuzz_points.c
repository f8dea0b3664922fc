// SPDX-License-Identifier: MIT
/*
 * libFuzzer target for the resume points `ferry index` records while it
 * decodes a layer (pkg-convert/points.c, input.c; FORMAT.md 2.8): the
 * input is a gzip or zstd stream, its first byte picks the inflater and
 * the span. Whatever the stream, every point recorded (its window sparse
 * or whole) must decode, through pkg-blob's frame decoder as mounts do,
 * to the stream's own bytes from its offset on, past the window's reach;
 * a corrupt stream may fail, never crash or read outside its buffers.
 */
#include <stdlib.h>

#include "../../pkg-base/base.h"
#include "../../pkg-blob/blob.h"
#include "../../pkg-convert/tar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define OUT_MAX (8u << 20)
#define PROBE (BLOB_STREAM_WINDOW * 2)

static void check_point(const uint8_t *comp, size_t clen, const struct blob_stream *s,
			const struct blob_stream_point *pt, const uint8_t *plain,
			uint64_t len, struct blob_stream_reader *r)
{
	static uint8_t out[PROBE];
	struct blob_chunk c = {
		.coff = pt->cbit / 8, .csize = (uint32_t)(clen - pt->cbit / 8),
		.frame_usize = (uint32_t)MIN((uint64_t)PROBE, len - pt->uoff),
		.codec = s->format == BLOB_STREAM_GZIP ? BLOB_CODEC_GZIP_STREAM :
							 BLOB_CODEC_ZSTD_STREAM,
	};

	blob_stream_reader_reset(r);
	if (blob_stream_frame_decode(r, s, &c, comp + c.coff, c.coff, clen - c.coff, out) ||
	    memcmp(out, plain + pt->uoff, c.frame_usize))
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static uint8_t plain[OUT_MAX];
	struct input_stream *in = NULL;
	struct input_points *p = NULL;
	struct blob_stream_point *pts = NULL;
	struct blob_stream_reader *r = NULL;
	struct blob_stream s = { 0 };
	struct byte_source src;
	uint64_t got = 0;
	uint32_t nr = 0, k;
	ssize_t n = 0;

	ferry_log_level = -1;
	if (size < 2)
		return 0;
	setenv("FERRY_INFLATE", data[0] & 1 ? "zlib" : "isal", 1);
	if (input_open_mem(data + 1, size - 1, &in))
		return 0;
	s.format = !strcmp(input_format(in), "gzip") ? BLOB_STREAM_GZIP :
		   !strcmp(input_format(in), "zstd") ? BLOB_STREAM_ZSTD : BLOB_STREAM_TAR;
	/* Spans of 1..128 KiB: many points in a small stream. */
	if (s.format == BLOB_STREAM_TAR ||
	    points_new((uint64_t)(data[0] >> 1) * 1024 + 1, 16u << 20, &p) ||
	    input_record_points(in, p))
		goto out;
	src = input_source(in);
	while (got < OUT_MAX && (n = src.read(src.ctx, plain + got, OUT_MAX - got)) > 0)
		got += (uint64_t)n;
	input_close(in);
	in = NULL;
	/* Only a stream that decoded whole is indexed. */
	if (n || got >= OUT_MAX || points_take(p, &pts, &nr))
		goto out;
	s.points = pts;
	s.nr_points = nr;
	s.usize = got;
	if (blob_stream_reader_new(&r))
		goto out;
	for (k = 0; k < nr; k++)
		if (pts[k].uoff < got)
			check_point(data + 1, size - 1, &s, &pts[k], plain, got, r);
out:
	blob_stream_reader_free(r);
	input_close(in);
	for (k = 0; k < nr; k++)
		free((void *)pts[k].window);
	free(pts);
	points_free(p);
	return 0;
}
