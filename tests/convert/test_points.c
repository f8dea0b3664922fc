// SPDX-License-Identifier: MIT
/*
 * Resume points recorded while the decompressing input decodes a layer
 * (pkg-convert/points.c; FORMAT.md 2.7): with each gzip inflater (ISA-L
 * hunting for a block header at its input's end, zlib stopping with
 * Z_BLOCK) and for zstd frames, every point must decode — through
 * pkg-blob's frame decoder, as a lazy mount decodes — to the stream's
 * bytes from its offset on; points are spaced as asked; the decoded
 * stream's sha256 is recorded; and the compressed bound of an offset
 * decodes up to it. Streams: two gzip members (a point may not cross
 * the member boundary unnoticed) and several zstd frames, read whole from
 * memory and through a source that returns odd-sized pieces. Read from a
 * source, the compressed bytes are read and hashed on a thread of their
 * own: a file and a source in pieces give the same points, a digest
 * mismatch is an error at the end, and closing mid-stream stops both
 * threads.
 */
#include "../test.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include "../../pkg-base/base.h"
#include "../../pkg-blob/blob.h"
#include "../../pkg-convert/tar.h"

static const char *const inflaters[] = {
	"zlib",
#ifdef FERRY_HAVE_ISAL
	"isal",
#endif
};

#define PLAIN (6u << 20)

static uint8_t *plain;
static uint64_t rng_state = 88172645463325252ull;

static uint64_t rng(void)
{
	return test_xorshift(&rng_state);
}

static void make_plain(void)
{
	static const char *const words[] = { "layer ", "point ", "deflate ", "block\n" };
	size_t i = 0;

	plain = malloc(PLAIN);
	while (i < PLAIN) {
		const char *w = words[rng() % 4];
		size_t n = MIN(strlen(w), PLAIN - i);

		memcpy(plain + i, w, n);
		i += n;
		if (rng() % 8 == 0)
			for (n = (size_t)(rng() % 200); n-- && i < PLAIN; i++)
				plain[i] = (uint8_t)rng();
	}
}

static size_t gzip(uint8_t *out, size_t cap)
{
	size_t len = 0, part;

	/* Two members, the second starting mid-stream. */
	for (part = 0; part < 2; part++) {
		z_stream z = { 0 };
		size_t off = part ? PLAIN / 3 : 0, n = part ? PLAIN - PLAIN / 3 : PLAIN / 3;

		if (deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK)
			abort();
		z.next_in = plain + off;
		z.avail_in = (uInt)n;
		z.next_out = out + len;
		z.avail_out = (uInt)(cap - len);
		if (deflate(&z, Z_FINISH) != Z_STREAM_END)
			abort();
		len += z.total_out;
		deflateEnd(&z);
	}
	return len;
}

static size_t zstd(uint8_t *out, size_t cap)
{
	size_t len = 0, off;

	for (off = 0; off < PLAIN; off += 200000) {
		size_t n = MIN((size_t)200000, PLAIN - off);
		size_t c = ZSTD_compress(out + len, cap - len, plain + off, n, 3);

		if (ZSTD_isError(c))
			abort();
		len += c;
	}
	return len;
}

/* A source returning pieces of 1 to 5000 bytes. */
struct pieces {
	const uint8_t *p;
	size_t len, pos;
};

static ssize_t pieces_read(void *ctx, void *buf, size_t len)
{
	struct pieces *s = ctx;
	size_t r = (size_t)(1 + rng() % 5000), n = MIN(len, MIN(s->len - s->pos, r));

	memcpy(buf, s->p + s->pos, n);
	s->pos += n;
	return (ssize_t)n;
}

/*
 * A zstd frame decodes alone: its points have no window (blob_streams_decode
 * refuses one that has). A deflate point's window holds the stream's bytes
 * before it, or zeros where nothing after it copies from: sparse windows,
 * some of them at least (the stream repeats its words).
 */
static void check_windows(const struct blob_stream_point *pts, uint32_t nr,
			  enum blob_stream_format fmt)
{
	static uint8_t w[BLOB_STREAM_WINDOW];
	uint32_t k, sparse = 0;

	for (k = 0; k < nr; k++) {
		const struct blob_stream_point *pt = &pts[k];
		const uint8_t *before = plain + pt->uoff - pt->window_len;
		uint32_t i, zeroed = 0;

		if (fmt == BLOB_STREAM_ZSTD) {
			CHECK_EQ(pt->window_len, 0);
			continue;
		}
		if (!pt->window_len)
			continue;
		CHECK_EQ(blob_decompress(pt->window_clen == pt->window_len ?
					 BLOB_CODEC_NONE : BLOB_CODEC_ZSTD,
					 pt->window, pt->window_clen, w, pt->window_len), 0);
		for (i = 0; i < pt->window_len; i++) {
			CHECK(w[i] == before[i] || !w[i]);
			zeroed += w[i] != before[i];
		}
		sparse += zeroed > pt->window_len / 2;
	}
	if (fmt == BLOB_STREAM_GZIP)
		CHECK(sparse > nr / 2);
}

/* Decode all of @in (closed after) into @out with points recorded. */
static struct input_points *decode_whole(struct input_stream *in, uint64_t spacing,
					 uint8_t *out)
{
	struct input_points *p = NULL;
	struct byte_source src;
	uint64_t got = 0;
	ssize_t n;

	CHECK_EQ(points_new(spacing, 16u << 20, &p), 0);
	CHECK_EQ(input_record_points(in, p), 0);
	src = input_source(in);
	while ((n = src.read(src.ctx, out + got, PLAIN + 1 - got)) > 0)
		got += (uint64_t)n;
	CHECK_EQ(n, 0);
	CHECK_EQ(got, PLAIN);
	CHECK(!memcmp(out, plain, PLAIN));
	input_close(in);
	return p;
}

/* Decode the whole stream with points recorded; check every point. */
static void check_points(const uint8_t *comp, size_t clen, enum blob_stream_format fmt,
			 uint64_t spacing, bool in_pieces)
{
	struct pieces pc = { comp, clen, 0 };
	struct input_stream *in = NULL;
	struct input_points *p = NULL;
	struct blob_stream_point *pts = NULL;
	struct blob_stream_reader *r = NULL;
	struct blob_stream s = { .format = (uint8_t)fmt };
	uint8_t *out = malloc(PLAIN + 1), digest[32], want[32];
	/* Past the window's reach: what a sparse window lacks would show. */
	static uint8_t probe[BLOB_STREAM_WINDOW * 3];
	uint64_t bound;
	uint32_t nr = 0, k;

	CHECK_EQ(in_pieces ? input_open_source((struct byte_source){ .read = pieces_read,
								     .ctx = &pc },
					       NULL, "pieces", &in) :
			     input_open_mem(comp, clen, &in), 0);
	p = decode_whole(in, spacing, out);
	points_diff_id(p, digest);
	sha256_buf(plain, PLAIN, want);
	CHECK(!memcmp(digest, want, 32));
	CHECK_EQ(points_decoded(p), PLAIN);
	/* The bound of the half-way offset decodes at least that far. */
	bound = points_bound(p, PLAIN / 2);
	CHECK(bound > 0 && bound <= clen);
	CHECK_EQ(points_take(p, &pts, &nr), 0);
	check_windows(pts, nr, fmt);
	s.points = pts;
	s.nr_points = nr;
	s.usize = PLAIN;
	/* One point per spacing at least (the stream is ~3 spacings or more). */
	CHECK(nr >= clen / spacing / 2 && nr <= clen / spacing + 3);
	CHECK(blob_stream_reader_new(&r) == 0);
	for (k = 0; k < nr; k++) {
		struct blob_chunk c = {
			.coff = pts[k].cbit / 8, .csize = (uint32_t)(clen - pts[k].cbit / 8),
			.frame_usize = (uint32_t)MIN((uint64_t)sizeof(probe), PLAIN - pts[k].uoff),
			.codec = fmt == BLOB_STREAM_GZIP ? BLOB_CODEC_GZIP_STREAM :
							   BLOB_CODEC_ZSTD_STREAM,
		};

		CHECK(!k || pts[k].cbit / 8 > pts[k - 1].cbit / 8);
		blob_stream_reader_reset(r);
		CHECK_EQ(blob_stream_frame_decode(r, &s, &c, comp + c.coff, c.coff,
						  clen - c.coff, probe), 0);
		CHECK(!memcmp(probe, plain + pts[k].uoff, c.frame_usize));
	}
	blob_stream_reader_free(r);
	for (k = 0; k < nr; k++)
		free((void *)pts[k].window);
	free(pts);
	points_free(p);
	free(out);
}

static void test_zstd(void)
{
	size_t cap = ZSTD_compressBound(PLAIN) + 4096, clen;
	uint8_t *comp = malloc(cap);

	clen = zstd(comp, cap);
	check_points(comp, clen, BLOB_STREAM_ZSTD, 128 << 10, false);
	check_points(comp, clen, BLOB_STREAM_ZSTD, 128 << 10, true);
	free(comp);
}

/* The points of @comp read through @in (opened on it), taken. */
static uint32_t points_of(struct input_stream *in, struct blob_stream_point **pts)
{
	uint8_t *out = malloc(PLAIN + 1);
	struct input_points *p = decode_whole(in, 200 << 10, out);
	uint32_t nr = 0;

	CHECK_EQ(points_take(p, pts, &nr), 0);
	points_free(p);
	free(out);
	return nr;
}

static void free_points(struct blob_stream_point *pts, uint32_t nr)
{
	while (nr--)
		free((void *)pts[nr].window);
	free(pts);
}

/*
 * A layer file and the same bytes from a registry, in pieces, both read
 * by the reader thread: the same points, windows included (the index
 * must not depend on where the layer came from).
 */
static void check_file_and_pieces(const uint8_t *comp, size_t clen)
{
	char path[] = "/tmp/ferry-test-points.XXXXXX";
	struct pieces pc = { comp, clen, 0 };
	struct blob_stream_point *a = NULL, *b = NULL;
	struct input_stream *in = NULL;
	uint8_t digest[32];
	uint32_t na, nb, k;
	int fd = mkstemp(path);

	CHECK(fd >= 0);
	CHECK_EQ(write(fd, comp, clen), (ssize_t)clen);
	close(fd);
	sha256_buf(comp, clen, digest);
	CHECK_EQ(input_open_verified(path, digest, "file", &in), 0);
	na = points_of(in, &a);
	CHECK_EQ(input_open_source((struct byte_source){ .read = pieces_read, .ctx = &pc },
				   digest, "pieces", &in), 0);
	nb = points_of(in, &b);
	CHECK(na > 3);
	CHECK_EQ(na, nb);
	for (k = 0; k < na && k < nb; k++) {
		CHECK_EQ(a[k].cbit, b[k].cbit);
		CHECK_EQ(a[k].uoff, b[k].uoff);
		CHECK_EQ(a[k].window_clen, b[k].window_clen);
		CHECK(!a[k].window_clen ||
		      !memcmp(a[k].window, b[k].window, a[k].window_clen));
	}
	free_points(a, na);
	free_points(b, nb);
	unlink(path);
}

/*
 * A layer whose bytes are not its digest's: an error, never its end.
 * Padded with NUL bytes (gzip's tolerated trailer) to whole MiBs, so that
 * all of it is decoded before the digest is known.
 */
static void check_digest_mismatch(const uint8_t *comp, size_t clen)
{
	size_t padded = ROUND_UP(clen, (size_t)1 << 20);
	uint8_t *whole = calloc(1, padded);
	struct pieces pc = { whole, padded, 0 };
	struct input_stream *in = NULL;
	struct input_points *p = NULL;
	uint8_t *out = malloc(PLAIN + 1), digest[32];
	struct byte_source src;
	uint64_t got = 0;
	ssize_t n;

	memcpy(whole, comp, clen);
	sha256_buf(whole, padded, digest);
	digest[7] ^= 1;
	CHECK_EQ(input_open_source((struct byte_source){ .read = pieces_read, .ctx = &pc },
				   digest, "pieces", &in), 0);
	CHECK_EQ(points_new(200 << 10, 16u << 20, &p), 0);
	CHECK_EQ(input_record_points(in, p), 0);
	src = input_source(in);
	while ((n = src.read(src.ctx, out + got, PLAIN + 1 - got)) > 0)
		got += (uint64_t)n;
	CHECK_EQ(n, -EFSCORRUPTED);
	input_close(in);
	points_free(p);
	free(whole);
	free(out);
}

/* Closed after a little was read: the decoder and reader threads stop. */
static void check_close_early(const uint8_t *comp, size_t clen)
{
	struct pieces pc = { comp, clen, 0 };
	struct input_stream *in = NULL;
	struct input_points *p = NULL;
	uint8_t buf[4096];
	struct byte_source src;

	CHECK_EQ(input_open_source((struct byte_source){ .read = pieces_read, .ctx = &pc },
				   NULL, "pieces", &in), 0);
	CHECK_EQ(points_new(200 << 10, 16u << 20, &p), 0);
	CHECK_EQ(input_record_points(in, p), 0);
	src = input_source(in);
	CHECK_EQ(src.read(src.ctx, buf, sizeof(buf)), (ssize_t)sizeof(buf));
	CHECK(!memcmp(buf, plain, sizeof(buf)));
	usleep(20000); /* the threads' rings fill up and wait */
	input_close(in);
	points_free(p);
}

static void test_gzip(void)
{
	size_t cap = PLAIN * 2, clen;
	uint8_t *comp = malloc(cap);
	size_t i;

	clen = gzip(comp, cap);
	for (i = 0; i < ARRAY_SIZE(inflaters); i++) {
		setenv("FERRY_INFLATE", inflaters[i], 1);
		check_points(comp, clen, BLOB_STREAM_GZIP, 256 << 10, false);
		check_points(comp, clen, BLOB_STREAM_GZIP, 300 << 10, true);
		/* Read from a file or a source: the reader thread. */
		check_file_and_pieces(comp, clen);
		check_digest_mismatch(comp, clen);
		check_close_early(comp, clen);
		unsetenv("FERRY_INFLATE");
	}
	free(comp);
}

/* xz has nowhere to resume: refused, saying to convert. */
static void test_xz_refused(void)
{
	static const uint8_t xz_magic[] = { 0xfd, '7', 'z', 'X', 'Z', 0x00, 0, 0 };
	struct input_stream *in = NULL;
	struct input_points *p = NULL;

	CHECK_EQ(input_open_mem(xz_magic, sizeof(xz_magic), &in), 0);
	CHECK_EQ(points_new(1 << 20, 16u << 20, &p), 0);
	CHECK_EQ(input_record_points(in, p), -ENOTSUP);
	input_close(in);
	points_free(p);
}

int main(void)
{
	ferry_log_level = getenv("FERRY_TEST_VERBOSE") ? FERRY_LOG_DEBUG : -1;
	make_plain();
	RUN_TEST(test_gzip);
	RUN_TEST(test_zstd);
	RUN_TEST(test_xz_refused);
	free(plain);
	TEST_MAIN_END();
}
