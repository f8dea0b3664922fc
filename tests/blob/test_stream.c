// SPDX-License-Identifier: MIT
/*
 * Stream blobs (FORMAT.md 2.7, 3.5): a gzip, zstd or plain "layer" whose
 * file pieces are chunks, read through the chunk cache from resume
 * points. The layers here are made in the test: pieces of data with
 * 512-byte "headers" between them, compressed with zlib (two members)
 * or zstd (several frames); resume points taken where zlib's Z_BLOCK
 * stops, as an indexer would. Checks the table and section round trips
 * and their refusals, decoding every frame, filling a cache from the
 * layer, a flipped layer byte (EIO for the chunks it touches and no
 * wrong byte in the cache), ferry check's pass, and the point decoder
 * `ferry index` probes windows with.
 */
#include "../test.h"
#include "../../pkg-base/base.h"
#include "../../pkg-blob/blob.h"

#include <fcntl.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#define KIB 1024u
#define MIB (1024u * 1024u)

#define MUST(x)                                                                \
	do {                                                                   \
		int _r = (x);                                                  \
		if (_r) {                                                      \
			fprintf(stderr, "  %s:%d: %s = %d\n", __FILE__,        \
				__LINE__, #x, _r);                             \
			exit(1);                                               \
		}                                                              \
	} while (0)

static char tmpdir[64];
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng(void)
{
	return test_xorshift(&rng_state);
}

/* Compressible bytes, with some random runs. */
static void fill(uint8_t *p, size_t len)
{
	static const char *const words[] = { "tar ", "gzip ", "point ", "window ",
					     "inflate ", "layer\n" };
	size_t i = 0;

	while (i < len) {
		if (rng() % 16 == 0) {
			size_t r = (size_t)(rng() % 300), n = MIN(r, len - i);

			for (size_t k = 0; k < n; k++)
				p[i + k] = (uint8_t)rng();
			i += n;
			continue;
		}
		const char *w = words[rng() % ARRAY_SIZE(words)];
		size_t n = MIN(strlen(w), len - i);

		memcpy(p + i, w, n);
		i += n;
	}
}

/* A layer: its decoded stream, compressed form, pieces and points. */
struct piece {
	uint64_t off; /* in the decoded stream */
	uint32_t len;
};

struct layer {
	enum blob_stream_format format;
	uint8_t *plain;
	size_t plain_len;
	uint8_t *comp;
	size_t comp_len;
	struct piece pieces[256];
	uint32_t nr_pieces;
	struct blob_stream_point points[256];
	uint8_t *windows[256];
	uint64_t in_at[256]; /* compressed bytes consumed when... */
	uint32_t nr_points;
	/* (decoded end, compressed bytes consumed) after each decode step */
	uint64_t mark_out[65536], mark_in[65536];
	uint32_t nr_marks;
	struct blob_info info;
	struct blob_stream stream;
};

static void make_plain(struct layer *l, size_t total)
{
	uint64_t pos = 0;

	l->plain = malloc(total);
	fill(l->plain, total);
	/* Pieces of 1 .. 96 KiB with a 512-byte "header" before each. */
	while (l->nr_pieces < ARRAY_SIZE(l->pieces)) {
		uint32_t len = 1 + (uint32_t)(rng() % (96 * KIB));

		pos += 512;
		if (pos + len > total)
			break;
		l->pieces[l->nr_pieces++] = (struct piece){ pos, len };
		pos += ROUND_UP(len, 512);
	}
	l->plain_len = total;
}

static void gzip_member(struct layer *l, const uint8_t *p, size_t n)
{
	z_stream z = { 0 };

	MUST(deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK);
	z.next_in = (Bytef *)p;
	z.avail_in = (uInt)n;
	z.next_out = l->comp + l->comp_len;
	z.avail_out = (uInt)deflateBound(&z, n);
	MUST(deflate(&z, Z_FINISH) != Z_STREAM_END);
	l->comp_len += z.total_out;
	deflateEnd(&z);
}

static void add_point(struct layer *l, uint64_t cbit, uint64_t uoff,
		      uint32_t wlen, uint32_t flags)
{
	struct blob_stream_point *pt = &l->points[l->nr_points];
	uint8_t *w = NULL;
	size_t clen = 0;

	if (wlen) {
		w = malloc(ZSTD_compressBound(wlen));
		clen = ZSTD_compress(w, ZSTD_compressBound(wlen),
				     l->plain + uoff - wlen, wlen, 3);
		MUST(ZSTD_isError(clen));
	}
	l->windows[l->nr_points] = w;
	*pt = (struct blob_stream_point){ cbit, uoff, wlen, (uint32_t)clen, flags, w };
	l->nr_points++;
}

/* Points as an indexer takes them: zlib's Z_BLOCK boundaries. */
static void gzip_points(struct layer *l, size_t spacing)
{
	z_stream z = { 0 };
	uint8_t *out = malloc(l->plain_len);
	uint64_t member_out = 0, last = 0;
	int zr;

	MUST(inflateInit2(&z, 15 + 16) != Z_OK);
	z.next_in = l->comp;
	z.avail_in = (uInt)l->comp_len;
	z.next_out = out;
	z.avail_out = (uInt)l->plain_len;
	add_point(l, 0, 0, 0, BLOB_POINT_HEADER);
	for (;;) {
		zr = inflate(&z, Z_BLOCK);
		l->mark_out[l->nr_marks] = z.total_out;
		l->mark_in[l->nr_marks++] = z.total_in;
		if (zr == Z_STREAM_END) {
			if (!z.avail_in)
				break;
			/* The next member: a point at its header. */
			add_point(l, z.total_in * 8, z.total_out, 0, BLOB_POINT_HEADER);
			last = z.total_in;
			member_out = z.total_out;
			uLong tin = z.total_in, tout = z.total_out;

			inflateReset(&z);
			z.total_in = tin;
			z.total_out = tout;
			continue;
		}
		MUST(zr != Z_OK);
		if ((z.data_type & 128) && !(z.data_type & 64) &&
		    z.total_in - last >= spacing && z.total_out > member_out) {
			uint32_t wlen = (uint32_t)MIN((uint64_t)BLOB_STREAM_WINDOW,
						      z.total_out - member_out);

			add_point(l, z.total_in * 8 - (z.data_type & 7), z.total_out,
				  wlen, 0);
			last = z.total_in;
		}
	}
	MUST(z.total_out != l->plain_len);
	MUST(memcmp(out, l->plain, l->plain_len) != 0);
	inflateEnd(&z);
	free(out);
}

static void make_gzip(struct layer *l, size_t total, size_t spacing)
{
	memset(l, 0, sizeof(*l));
	l->format = BLOB_STREAM_GZIP;
	make_plain(l, total);
	l->comp = malloc(total * 2 + 1024);
	/* Two members, split inside a piece. */
	gzip_member(l, l->plain, total / 3);
	gzip_member(l, l->plain + total / 3, total - total / 3);
	gzip_points(l, spacing);
}

static void make_zstd(struct layer *l, size_t total, size_t frame)
{
	size_t off = 0;

	memset(l, 0, sizeof(*l));
	l->format = BLOB_STREAM_ZSTD;
	make_plain(l, total);
	l->comp = malloc(ZSTD_compressBound(total) + total / frame * 64 + 1024);
	while (off < total) {
		size_t n = MIN(frame, total - off);
		size_t c = ZSTD_compress(l->comp + l->comp_len, ZSTD_compressBound(n),
					 l->plain + off, n, 3);

		MUST(ZSTD_isError(c));
		add_point(l, l->comp_len * 8, off, 0, 0);
		l->comp_len += c;
		off += n;
		/* zstd decodes a frame at once: its end is where output appears. */
		l->mark_out[l->nr_marks] = off;
		l->mark_in[l->nr_marks++] = l->comp_len;
	}
}

static void make_tar(struct layer *l, size_t total)
{
	memset(l, 0, sizeof(*l));
	l->format = BLOB_STREAM_TAR;
	make_plain(l, total);
	l->comp = malloc(total);
	memcpy(l->comp, l->plain, total);
	l->comp_len = total;
}

/* Compressed bytes that decode the stream up to @uoff. */
static uint64_t in_bound(const struct layer *l, uint64_t uoff)
{
	uint32_t i;

	for (i = 0; i < l->nr_marks; i++)
		if (l->mark_out[i] >= uoff)
			return MIN(l->mark_in[i] + 16, (uint64_t)l->comp_len);
	return l->comp_len;
}

/* The point at or before @uoff. */
static uint32_t point_before(const struct layer *l, uint64_t uoff)
{
	uint32_t k = 0;

	while (k + 1 < l->nr_points && l->points[k + 1].uoff <= uoff)
		k++;
	return k;
}

/*
 * The blob table: one chunk per piece (pieces over 32 KiB cut in two),
 * frames of up to 128 KiB decoded per point, as an indexer groups them.
 */
static void make_table(struct layer *l)
{
	struct blob_chunk *c = calloc(2 * l->nr_pieces + 1, sizeof(*c));
	uint32_t n = 0, i, first = 0;
	uint64_t uoff = 0;
	uint8_t codec = l->format == BLOB_STREAM_GZIP ? BLOB_CODEC_GZIP_STREAM :
			l->format == BLOB_STREAM_ZSTD ? BLOB_CODEC_ZSTD_STREAM :
							BLOB_CODEC_NONE;

	for (i = 0; i < l->nr_pieces; i++) {
		uint32_t cut = l->pieces[i].len > 32 * KIB ? l->pieces[i].len / 2 / 4096 * 4096 : 0;
		uint32_t part;

		for (part = 0; part < (cut ? 2u : 1u); part++) {
			uint64_t off = l->pieces[i].off + (part ? cut : 0);
			uint32_t len = cut ? (part ? l->pieces[i].len - cut : cut) : l->pieces[i].len;

			c[n] = (struct blob_chunk){ .uoff = uoff, .usize = len, .codec = codec };
			sha256_buf(l->plain + off, len, c[n].sha256);
			c[n].coff = off; /* the stream offset, for now */
			uoff += ROUND_UP((uint64_t)len, 4096);
			n++;
		}
	}
	/* Group into frames. */
	for (i = 0; i < n; i++) {
		uint64_t off = c[i].coff, base;
		uint32_t k = point_before(l, off);
		bool start = i == 0;

		base = l->format == BLOB_STREAM_TAR ? c[first].coff : l->points[k].uoff;
		if (!start) {
			const struct blob_chunk *f = &c[first];
			uint64_t fbase = l->format == BLOB_STREAM_TAR ? f->coff :
					 l->points[point_before(l, f->coff)].uoff;

			start = fbase != base || off + c[i].usize - (f->coff) > 128 * KIB;
		}
		if (start)
			first = i;
		c[i].frame_skip = (uint32_t)(c[first].coff -
					     (l->format == BLOB_STREAM_TAR ? c[first].coff :
					      l->points[point_before(l, c[first].coff)].uoff));
		c[i].frame_off = (uint32_t)(off - c[first].coff);
	}
	/* Frame sizes and compressed ranges, then coff to the point's byte. */
	for (i = n; i--;) {
		if (i + 1 < n && c[i + 1].frame_off)
			c[i].frame_usize = c[i + 1].frame_usize;
		else
			c[i].frame_usize = c[i].frame_off + c[i].usize;
	}
	for (i = 0; i < n; i++) {
		uint64_t fstart = c[i].coff - c[i].frame_off;

		if (l->format == BLOB_STREAM_TAR) {
			c[i].coff = fstart;
			c[i].csize = c[i].frame_usize;
		} else {
			const struct blob_stream_point *pt = &l->points[point_before(l, fstart)];

			c[i].coff = pt->cbit / 8;
			c[i].csize = (uint32_t)(in_bound(l, fstart + c[i].frame_usize) - c[i].coff);
		}
	}
	l->info = (struct blob_info){
		.size = l->comp_len, .table_offset = l->comp_len,
		.uncompressed_size = uoff, .nr_chunks = n, .chunks = c,
		.flags = BLOB_INFO_STREAM,
	};
	sha256_buf(l->comp, l->comp_len, l->info.digest);
	MUST(blob_info_as_table(&l->info));
	l->stream = (struct blob_stream){
		.blob = 0, .format = (uint8_t)l->format, .usize = l->plain_len,
		.nr_points = l->nr_points, .points = l->points,
	};
	sha256_buf(l->plain, l->plain_len, l->stream.diff_id);
}

static void layer_free(struct layer *l)
{
	for (uint32_t i = 0; i < l->nr_points; i++)
		free(l->windows[i]);
	free(l->plain);
	free(l->comp);
	free(l->info.chunks);
}

/* A chunk's bytes in the decoded stream. */
static const uint8_t *chunk_plain(const struct layer *l, const struct blob_chunk *c)
{
	uint64_t base = l->format == BLOB_STREAM_TAR ? c->coff :
			l->points[0].uoff;

	if (l->format != BLOB_STREAM_TAR)
		for (uint32_t k = 0; k < l->nr_points; k++)
			if (l->points[k].cbit / 8 == c->coff)
				base = l->points[k].uoff;
	return l->plain + base + c->frame_skip + c->frame_off;
}

struct mem_src {
	const uint8_t *p;
	size_t len;
	unsigned long reads;
	uint64_t last_off, bytes;
};

static int mem_read(void *ctx, uint64_t off, void *buf, size_t len)
{
	struct mem_src *m = ctx;

	if (off > m->len || len > m->len - off)
		return -EIO;
	memcpy(buf, m->p + off, len);
	m->reads++;
	m->last_off = off;
	m->bytes += len;
	return 0;
}

/* Encode index + section, decode them back into @idx / @ss. */
static int round_trip(struct layer *l, struct blob_index *idx,
		      struct blob_streams *ss, void **ext, size_t *ext_len)
{
	void *ib, *sb;
	size_t il, sl, used;
	int ret;

	memset(idx, 0, sizeof(*idx));
	memset(ss, 0, sizeof(*ss));
	*ext = NULL;
	ret = blob_index_encode(&l->info, 1, &ib, &il);
	if (ret)
		return ret;
	ret = blob_streams_encode(&l->stream, 1, &sb, &sl);
	if (ret)
		return ret;
	*ext = malloc(il + sl);
	memcpy(*ext, ib, il);
	memcpy((uint8_t *)*ext + il, sb, sl);
	*ext_len = il + sl;
	free(ib);
	free(sb);
	ret = blob_index_decode_prefix(*ext, *ext_len, idx, &used);
	if (ret)
		return ret;
	ret = blob_streams_decode((uint8_t *)*ext + used, *ext_len - used, idx, ss, &il);
	if (!ret && used + il != *ext_len)
		ret = -EINVAL;
	return ret;
}

/* Every frame of @l decodes (through the decoded tables) to the stream's bytes. */
static void check_layer(struct layer *l)
{
	struct blob_index idx;
	struct blob_streams ss;
	struct blob_stream_reader *r;
	const struct blob_info *info;
	void *ext;
	size_t ext_len;
	uint32_t i;

	MUST(round_trip(l, &idx, &ss, &ext, &ext_len));
	info = &idx.blobs[0];
	CHECK_EQ(info->flags, BLOB_INFO_STREAM);
	CHECK_EQ(info->nr_chunks, l->info.nr_chunks);
	CHECK_EQ(ss.nr, 1);
	CHECK_EQ(ss.streams[0].nr_points, l->nr_points);
	MUST(blob_stream_reader_new(&r));
	for (i = 0; i < info->nr_chunks; i++) {
		const struct blob_chunk *c = &info->chunks[i];
		const struct blob_chunk *o = &l->info.chunks[i];
		uint8_t *out;

		CHECK(c->coff == o->coff && c->frame_skip == o->frame_skip &&
		      c->frame_off == o->frame_off && c->frame_usize == o->frame_usize);
		if (c->frame_off)
			continue;
		out = malloc(c->frame_usize);
		/* Alone: the frame's own compressed range. */
		blob_stream_reader_reset(r);
		CHECK_EQ(blob_stream_frame_decode(r, &ss.streams[0], c, l->comp + c->coff,
						  c->coff, c->csize, out), 0);
		for (uint32_t k = i; k < info->nr_chunks && (k == i || info->chunks[k].frame_off); k++)
			CHECK(!memcmp(out + info->chunks[k].frame_off,
				      chunk_plain(l, &info->chunks[k]), info->chunks[k].usize));
		free(out);
	}
	blob_stream_reader_free(r);
	blob_streams_free(&ss);
	blob_index_free(&idx);
	free(ext);
}

static void test_frames_gzip(void)
{
	struct layer l;

	make_gzip(&l, 6 * MIB, 256 * KIB);
	CHECK(l.nr_points > 8);
	make_table(&l);
	check_layer(&l);
	layer_free(&l);
}

/* What `ferry index` decodes after a point to probe its window. */
#define PROBE_LEN (BLOB_STREAM_WINDOW + 258u)

/* blob_stream_frame_decode's (zlib's) bytes from point @pt, for comparison. */
static int frame_decode_at(struct blob_stream_reader *r, struct blob_stream_point *pt,
			   const uint8_t *in, size_t in_len, uint8_t *out, size_t out_len)
{
	struct blob_stream s = { .format = BLOB_STREAM_GZIP, .usize = UINT64_MAX,
				 .points = pt, .nr_points = 1 };
	struct blob_chunk c = { .coff = pt->cbit / 8, .csize = (uint32_t)in_len,
				.frame_usize = (uint32_t)out_len,
				.codec = BLOB_CODEC_GZIP_STREAM };

	blob_stream_reader_reset(r);
	return blob_stream_frame_decode(r, &s, &c, in, c.coff, in_len, out);
}

/*
 * blob_stream_point_decode (ISA-L's inflate when built with it) from
 * every point inside a member, with the point's window (zstd-stored, and
 * raw) and with one of zeros: the stream's bytes, and zlib's bytes for
 * the zeros; an error, not bytes, for a truncated stream, output past
 * the member's last block, a missing window and an invalid block type.
 */
static void test_point_decode(void)
{
	static const uint8_t zeros[BLOB_STREAM_WINDOW];
	static const uint8_t bad_block[8] = { 0x07 }; /* BFINAL, BTYPE 11 */
	struct blob_stream_reader *r;
	uint8_t *out = malloc(PROBE_LEN), *ref = malloc(PROBE_LEN);
	uint32_t i, tried = 0, odd = 0;
	struct layer l;

	make_gzip(&l, 2 * MIB, 64 * KIB);
	MUST(blob_stream_reader_new(&r));
	for (i = 0; i < l.nr_points; i++) {
		struct blob_stream_point pt = l.points[i];
		uint64_t end = i + 1 < l.nr_points && (l.points[i + 1].flags & BLOB_POINT_HEADER) ?
			       l.points[i + 1].uoff : l.plain_len;
		size_t n = (size_t)MIN((uint64_t)PROBE_LEN, end - pt.uoff);
		const uint8_t *in = l.comp + pt.cbit / 8;
		size_t in_len = l.comp_len - pt.cbit / 8;

		if (pt.flags & BLOB_POINT_HEADER)
			continue;
		tried++;
		odd += pt.cbit % 8 != 0;
		CHECK_EQ(blob_stream_point_decode(r, &pt, in, in_len, out, n), 0);
		CHECK(!memcmp(out, l.plain + pt.uoff, n));
		pt.window = l.plain + pt.uoff - pt.window_len;
		pt.window_clen = pt.window_len;
		memset(out, 0, n);
		CHECK_EQ(blob_stream_point_decode(r, &pt, in, in_len, out, n), 0);
		CHECK(!memcmp(out, l.plain + pt.uoff, n));
		pt.window = zeros;
		CHECK_EQ(blob_stream_point_decode(r, &pt, in, in_len, out, n), 0);
		CHECK_EQ(frame_decode_at(r, &pt, in, in_len, ref, n), 0);
		CHECK(!memcmp(out, ref, n));
		/* Cut short: the stream's first 64 bytes give fewer bytes. */
		CHECK_EQ(blob_stream_point_decode(r, &pt, in, 64, out, n), -EFSCORRUPTED);
		/* More than the member holds: its last block ends first. */
		if (end < l.plain_len && end - pt.uoff < PROBE_LEN)
			CHECK_EQ(blob_stream_point_decode(r, &pt, in, in_len, out, n + 1),
				 -EFSCORRUPTED);
		/* Copies from a window it does not have. */
		pt.window_len = pt.window_clen = 0;
		CHECK_EQ(blob_stream_point_decode(r, &pt, in, in_len, out, n), -EFSCORRUPTED);
	}
	CHECK(tried > 8 && odd > 0);
	{
		struct blob_stream_point pt = { .cbit = 0 };

		CHECK_EQ(blob_stream_point_decode(r, &pt, bad_block, sizeof(bad_block), out, 16),
			 -EFSCORRUPTED);
	}
	blob_stream_reader_free(r);
	free(out);
	free(ref);
	layer_free(&l);
}

static void test_frames_zstd(void)
{
	struct layer l;

	make_zstd(&l, 4 * MIB, 300 * KIB);
	make_table(&l);
	check_layer(&l);
	layer_free(&l);
}

static void test_frames_tar(void)
{
	struct layer l;

	make_tar(&l, 3 * MIB);
	make_table(&l);
	check_layer(&l);
	layer_free(&l);
}

/* Fill a cache from the layer; optionally with one layer byte flipped. */
static void fill_cache(struct layer *l, uint64_t flip, bool *all_ok)
{
	char dir[128];
	struct blob_index idx;
	struct blob_streams ss;
	struct blob_cache_blob *b;
	struct mem_src m;
	struct blob_source src;
	void *ext;
	size_t ext_len;
	uint8_t *comp = malloc(l->comp_len);
	uint8_t *data = NULL;
	int ret, fd;
	uint32_t i, bad = 0;

	memcpy(comp, l->comp, l->comp_len);
	if (flip != UINT64_MAX)
		comp[flip] ^= 0x20;
	m = (struct mem_src){ .p = comp, .len = l->comp_len };
	snprintf(dir, sizeof(dir), "%s/cache%llu", tmpdir, (unsigned long long)flip);
	MUST(round_trip(l, &idx, &ss, &ext, &ext_len));
	src = (struct blob_source){ mem_read, &m, &ss.streams[0] };
	MUST(blob_cache_open(dir, &idx.blobs[0], &b));
	ret = blob_cache_ensure(b, 0, idx.blobs[0].uncompressed_size, &src, NULL);
	*all_ok = !ret;
	/* Every present chunk holds its bytes; every other one zeros. */
	fd = blob_cache_data_fd(b);
	data = malloc(idx.blobs[0].uncompressed_size + 1);
	MUST(pread_full(fd, data, idx.blobs[0].uncompressed_size, 0));
	for (i = 0; i < idx.blobs[0].nr_chunks; i++) {
		const struct blob_chunk *c = &idx.blobs[0].chunks[i];

		if (blob_cache_chunk_present(b, i))
			CHECK(!memcmp(data + c->uoff, chunk_plain(l, c), c->usize));
		else {
			CHECK(mem_is_zero(data + c->uoff, c->usize));
			bad++;
		}
	}
	if (flip == UINT64_MAX) {
		CHECK_EQ(ret, 0);
		CHECK_EQ(bad, 0);
	} else {
		CHECK_EQ(ret, -EIO);
		CHECK(bad > 0 && bad < idx.blobs[0].nr_chunks);
	}
	blob_cache_close(b);
	blob_streams_free(&ss);
	blob_index_free(&idx);
	free(ext);
	free(data);
	free(comp);
}

static void test_cache_fill(void)
{
	struct layer g, z, t;
	bool ok;

	make_gzip(&g, 6 * MIB, 256 * KIB);
	make_table(&g);
	fill_cache(&g, UINT64_MAX, &ok);
	CHECK(ok);
	/* A flipped byte in the middle: EIO, no wrong bytes, others present. */
	fill_cache(&g, g.comp_len / 2, &ok);
	CHECK(!ok);
	make_zstd(&z, 4 * MIB, 300 * KIB);
	make_table(&z);
	fill_cache(&z, UINT64_MAX, &ok);
	CHECK(ok);
	fill_cache(&z, z.comp_len / 2, &ok);
	CHECK(!ok);
	make_tar(&t, 3 * MIB);
	make_table(&t);
	fill_cache(&t, UINT64_MAX, &ok);
	CHECK(ok);
	fill_cache(&t, t.pieces[7].off + 3, &ok);
	CHECK(!ok);
	layer_free(&g);
	layer_free(&z);
	layer_free(&t);
}

/*
 * A fill from a resume point also fills the other frames of that point;
 * one of them failing must not fail (nor, as it once did, loop on) the
 * chunk asked for, which decodes before the damage.
 */
static void test_neighbour_fails(void)
{
	struct layer l;
	struct blob_index idx;
	struct blob_streams ss;
	struct blob_cache_blob *b;
	struct blob_source src;
	struct mem_src m;
	const struct blob_chunk *c, *last = NULL;
	char dir[128];
	void *ext;
	size_t ext_len;
	uint32_t i, first = UINT32_MAX;

	make_gzip(&l, 6 * MIB, 512 * KIB);
	make_table(&l);
	MUST(round_trip(&l, &idx, &ss, &ext, &ext_len));
	/* The frames of point 2: damage the compressed end of the last one. */
	for (i = 0; i < idx.blobs[0].nr_chunks; i++) {
		c = &idx.blobs[0].chunks[i];
		if (c->coff != l.points[2].cbit / 8)
			continue;
		if (first == UINT32_MAX)
			first = i;
		last = c;
	}
	MUST(!last || last == &idx.blobs[0].chunks[first]);
	c = &idx.blobs[0].chunks[first];
	/* Past what decodes the first frame of the point: the later ones break. */
	l.comp[in_bound(&l, l.points[2].uoff + c->frame_skip + c->frame_usize) + 32] ^= 0x10;
	m = (struct mem_src){ .p = l.comp, .len = l.comp_len };
	src = (struct blob_source){ mem_read, &m, &ss.streams[0] };
	snprintf(dir, sizeof(dir), "%s/neighbour", tmpdir);
	MUST(blob_cache_open(dir, &idx.blobs[0], &b));
	alarm(60); /* a loop would be killed here */
	c = &idx.blobs[0].chunks[first];
	CHECK_EQ(blob_cache_ensure(b, c->uoff, c->usize, &src, NULL), 0);
	CHECK(blob_cache_chunk_present(b, first));
	CHECK_EQ(blob_cache_ensure(b, last->uoff, last->usize, &src, NULL), -EIO);
	alarm(0);
	CHECK(!blob_cache_chunk_present(b, (uint32_t)(last - idx.blobs[0].chunks)));
	blob_cache_close(b);
	blob_streams_free(&ss);
	blob_index_free(&idx);
	free(ext);
	layer_free(&l);
}

/*
 * A read late in a span after one early in it fetches from the point the
 * first run learned, not from the span's recorded point again; the
 * bytes are right either way.
 */
static void test_learned_points(void)
{
	struct layer l;
	struct blob_index idx;
	struct blob_streams ss;
	struct blob_cache_blob *b;
	struct blob_source src;
	struct mem_src m;
	const struct blob_chunk *c, *first = NULL, *late = NULL;
	char dir[128];
	void *ext;
	size_t ext_len;
	uint32_t i;
	uint8_t *data;

	make_gzip(&l, 6 * MIB, 2 * MIB);
	make_table(&l);
	MUST(round_trip(&l, &idx, &ss, &ext, &ext_len));
	/* Point 1's first frame, and a frame of it ~1 MiB of stream later. */
	for (i = 0; i < idx.blobs[0].nr_chunks; i++) {
		c = &idx.blobs[0].chunks[i];
		if (c->coff != l.points[1].cbit / 8 || c->frame_off)
			continue;
		if (!first)
			first = c;
		else if (c->frame_skip > first->frame_skip + MIB && !late)
			late = c;
	}
	MUST(!first || !late);
	m = (struct mem_src){ .p = l.comp, .len = l.comp_len };
	src = (struct blob_source){ mem_read, &m, &ss.streams[0] };
	snprintf(dir, sizeof(dir), "%s/learned", tmpdir);
	MUST(blob_cache_open(dir, &idx.blobs[0], &b));
	CHECK_EQ(blob_cache_ensure(b, first->uoff, first->usize, &src, NULL), 0);
	CHECK_EQ(m.last_off, first->coff);
	CHECK_EQ(blob_cache_ensure(b, late->uoff, late->usize, &src, NULL), 0);
	CHECK(m.last_off > first->coff + 64 * KIB);
	data = malloc(late->usize);
	MUST(pread_full(blob_cache_data_fd(b), data, late->usize, late->uoff));
	CHECK(!memcmp(data, chunk_plain(&l, late), late->usize));
	free(data);
	blob_cache_close(b);
	blob_streams_free(&ss);
	blob_index_free(&idx);
	free(ext);
	layer_free(&l);
}

static void test_verify(void)
{
	struct layer l;
	struct blob_index idx;
	struct blob_streams ss;
	struct blob_verify_report rep;
	struct mem_src m;
	struct blob_source src;
	void *ext;
	size_t ext_len;

	make_gzip(&l, 4 * MIB, 200 * KIB);
	make_table(&l);
	MUST(round_trip(&l, &idx, &ss, &ext, &ext_len));
	m = (struct mem_src){ .p = l.comp, .len = l.comp_len };
	src = (struct blob_source){ mem_read, &m, &ss.streams[0] };
	CHECK_EQ(blob_verify_source(&src, "t", &idx.blobs[0], &rep), 0);
	CHECK_EQ(rep.error, 0);
	/* A wrong window: the pass names the point. */
	ss.streams[0].points[3].window = l.windows[2];
	ss.streams[0].points[3].window_clen = l.points[2].window_clen;
	CHECK_EQ(blob_verify_source(&src, "t", &idx.blobs[0], &rep), -EFSCORRUPTED);
	ss.streams[0].points[3] = l.points[3];
	/*
	 * Zeros are allowed where nothing after the point copies from
	 * (sparse windows); a window of zeros only is not that: the decode
	 * from the point, 32 KiB + 258 far, shows it.
	 */
	{
		static const uint8_t zeros[BLOB_STREAM_WINDOW];

		ss.streams[0].points[3].window = zeros;
		ss.streams[0].points[3].window_clen = ss.streams[0].points[3].window_len;
		CHECK_EQ(blob_verify_source(&src, "t", &idx.blobs[0], &rep), -EFSCORRUPTED);
		ss.streams[0].points[3] = l.points[3];
	}
	/* A flipped byte of the layer. */
	l.comp[l.comp_len / 3] ^= 1;
	CHECK(blob_verify_source(&src, "t", &idx.blobs[0], &rep) < 0);
	CHECK(rep.error < 0);
	blob_streams_free(&ss);
	blob_index_free(&idx);
	free(ext);
	layer_free(&l);
}

/* The table rules a stream blob's index must meet. */
static void test_table_refused(void)
{
	struct layer l;
	struct blob_index idx;
	void *ib;
	size_t il;
	struct blob_chunk saved;
	uint32_t m;

	make_gzip(&l, 2 * MIB, 128 * KIB);
	make_table(&l);
	for (m = 1; m < l.info.nr_chunks && !l.info.chunks[m].frame_off; m++)
		;
	MUST(m == l.info.nr_chunks); /* a frame with two members */
	MUST(blob_index_encode(&l.info, 1, &ib, &il));
	CHECK_EQ(blob_index_decode(ib, il, &idx), 0);
	blob_index_free(&idx);
	/* Bits of the flags byte other than the frame start (table sha256 fixed). */
	((uint8_t *)ib)[16 + 128 + 25] |= 0x4;
	sha256_buf((uint8_t *)ib + 16 + 128, (size_t)l.info.nr_chunks * 64,
		   (uint8_t *)ib + 16 + 64);
	CHECK_EQ(blob_index_decode(ib, il, &idx), -EFSCORRUPTED);
	/* An entry 0 that does not start a frame. */
	((uint8_t *)ib)[16 + 128 + 25] = 0;
	sha256_buf((uint8_t *)ib + 16 + 128, (size_t)l.info.nr_chunks * 64,
		   (uint8_t *)ib + 16 + 64);
	CHECK_EQ(blob_index_decode(ib, il, &idx), -EFSCORRUPTED);
	free(ib);
	/* A member overlapping the chunk before it: the encoder refuses it. */
	saved = l.info.chunks[m];
	l.info.chunks[m].frame_off = l.info.chunks[m - 1].frame_off + 1;
	MUST(blob_info_as_table(&l.info));
	CHECK_EQ(blob_index_encode(&l.info, 1, &ib, &il), -EINVAL);
	l.info.chunks[m] = saved;
	/* A frame range past the layer's end. */
	l.info.chunks[0].csize = (uint32_t)l.comp_len + 1;
	MUST(blob_info_as_table(&l.info));
	CHECK_EQ(blob_index_encode(&l.info, 1, &ib, &il), -EINVAL);
	layer_free(&l);
}

/* The section's refusals: points out of order, frames without a point. */
static void test_points_refused(void)
{
	struct layer l;
	struct blob_index idx;
	struct blob_streams ss;
	void *ext;
	size_t ext_len;
	struct blob_stream_point saved;

	make_gzip(&l, 3 * MIB, 200 * KIB);
	make_table(&l);
	MUST(l.nr_points < 4);
	CHECK_EQ(round_trip(&l, &idx, &ss, &ext, &ext_len), 0);
	blob_streams_free(&ss);
	blob_index_free(&idx);
	free(ext);
	saved = l.points[2];
	l.points[2].uoff = l.points[1].uoff;
	CHECK_EQ(round_trip(&l, &idx, &ss, &ext, &ext_len), -EFSCORRUPTED);
	blob_index_free(&idx);
	free(ext);
	l.points[2] = saved;
	/* A window longer than the bytes before the point. */
	saved = l.points[1];
	l.points[1].window_len = BLOB_STREAM_WINDOW + 1;
	CHECK_EQ(round_trip(&l, &idx, &ss, &ext, &ext_len), -EFSCORRUPTED);
	blob_index_free(&idx);
	free(ext);
	l.points[1] = saved;
	/* A first point that is not a member header. */
	l.points[0].flags = 0;
	CHECK_EQ(round_trip(&l, &idx, &ss, &ext, &ext_len), -EFSCORRUPTED);
	blob_index_free(&idx);
	free(ext);
	layer_free(&l);
	/* A frame whose coff is no point's byte. */
	make_gzip(&l, 3 * MIB, 200 * KIB);
	make_table(&l);
	for (uint32_t i = l.info.nr_chunks; i--;) {
		l.info.chunks[i].coff += 1;
		l.info.chunks[i].csize -= 1;
		if (!l.info.chunks[i].frame_off)
			break;
	}
	MUST(blob_info_as_table(&l.info));
	CHECK_EQ(round_trip(&l, &idx, &ss, &ext, &ext_len), -EFSCORRUPTED);
	blob_index_free(&idx);
	free(ext);
	layer_free(&l);
}

int main(void)
{
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/ferry-test-stream-XXXXXX");
	if (!mkdtemp(tmpdir))
		return 1;
	ferry_log_level = getenv("FERRY_TEST_VERBOSE") ? FERRY_LOG_DEBUG : -1;
	RUN_TEST(test_frames_gzip);
	RUN_TEST(test_point_decode);
	RUN_TEST(test_frames_zstd);
	RUN_TEST(test_frames_tar);
	RUN_TEST(test_cache_fill);
	RUN_TEST(test_neighbour_fails);
	RUN_TEST(test_learned_points);
	RUN_TEST(test_verify);
	RUN_TEST(test_table_refused);
	RUN_TEST(test_points_refused);
	if (!test_failed_cases) {
		char cmd[128];

		snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
		if (system(cmd))
			return 1;
	}
	TEST_MAIN_END();
}
