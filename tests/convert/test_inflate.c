// SPDX-License-Identifier: MIT
/*
 * The gzip inflaters of the decompressing input, side by side: the same
 * streams (written by zlib's deflate, then cut, padded or corrupted) go
 * through ISA-L and zlib via the input_stream API the tar reader uses, fed
 * whole from memory and in odd-sized pieces that split member headers and
 * trailers. Both must return the expected bytes and errors; on an error
 * each may have returned only a prefix of the good bytes, as buffering
 * differs. A conversion must give the same digests with either.
 */
#include "../test.h"

#include <stdbool.h>
#include <stdint.h>
#include <unistd.h>
#include <zlib.h>

#include "../../pkg-base/base.h"
#include "../../pkg-convert/convert.h"
#include "../../pkg-convert/tar.h"

static const char *const inflaters[] = {
	"zlib",
#ifdef FERRY_HAVE_ISAL
	"isal",
#endif
};

struct buf {
	uint8_t *p;
	size_t len, cap;
};

static void buf_put(struct buf *b, const void *p, size_t n)
{
	if (b->len + n > b->cap) {
		b->cap = (b->len + n) * 2;
		b->p = realloc(b->p, b->cap);
		if (!b->p)
			abort();
	}
	memcpy(b->p + b->len, p, n);
	b->len += n;
}

/* Deterministic payloads: text-like (compressible) or random bytes. */
static void payload(struct buf *b, size_t len, bool text, uint32_t seed)
{
	uint32_t x = seed * 2654435761u + 1;
	size_t i;

	for (i = 0; i < len; i++) {
		uint8_t c;

		x = x * 1103515245u + 12345;
		c = text ? (uint8_t)("tar layers compress\n"[(x >> 16) % 20])
			 : (uint8_t)(x >> 24);
		buf_put(b, &c, 1);
	}
}

struct member_opts {
	int level, strategy;
	bool extra, name, comment, hcrc;
};

/* Append one gzip member of @data to @out, written by zlib's deflate. */
static void gzip_member(struct buf *out, const struct buf *data,
			const struct member_opts *o)
{
	static uint8_t extra[] = { 'F', 'y', 4, 0, 1, 2, 3, 4 };
	static char name[5000], comment[] = "a comment";
	gz_header h = { .os = 3, .hcrc = o->hcrc };
	uint8_t tmp[65536];
	z_stream z = { 0 };
	int zr;

	memset(name, 'n', sizeof(name) - 1); /* long: split by small reads */
	if (o->extra) {
		h.extra = extra;
		h.extra_len = sizeof(extra);
	}
	h.name = o->name ? (Bytef *)name : NULL;
	h.comment = o->comment ? (Bytef *)comment : NULL;
	CHECK(deflateInit2(&z, o->level, Z_DEFLATED, 31, 8, o->strategy) == Z_OK);
	CHECK(deflateSetHeader(&z, &h) == Z_OK);
	z.next_in = data->p;
	z.avail_in = (uInt)data->len;
	do {
		z.next_out = tmp;
		z.avail_out = sizeof(tmp);
		zr = deflate(&z, Z_FINISH);
		buf_put(out, tmp, sizeof(tmp) - z.avail_out);
	} while (zr == Z_OK);
	CHECK_EQ(zr, Z_STREAM_END);
	deflateEnd(&z);
}

/* A byte_source over memory returning at most @piece bytes a call. */
struct pieces {
	const struct buf *b;
	size_t off, piece;
};

static ssize_t pieces_read(void *ctx, void *dst, size_t len)
{
	struct pieces *p = ctx;
	size_t n = MIN(MIN(len, p->piece), p->b->len - p->off);

	memcpy(dst, p->b->p + p->off, n);
	p->off += n;
	return (ssize_t)n;
}

/*
 * Decode @gz with @inflater, read @chunk bytes at a time; @piece 0 feeds
 * it from memory, else in reads of at most @piece bytes. Returns 0 or the
 * read error, the output in @out.
 */
static int decode(const struct buf *gz, const char *inflater, size_t piece,
		  size_t chunk, struct buf *out)
{
	struct pieces src = { .b = gz, .piece = piece };
	struct input_stream *in;
	struct byte_source bs;
	uint8_t *tmp = malloc(chunk);
	ssize_t n;
	int ret;

	if (!tmp)
		abort();
	setenv("FERRY_INFLATE", inflater, 1);
	ret = piece ? input_open_source((struct byte_source){ .read = pieces_read,
							      .ctx = &src },
					NULL, "test", &in)
		    : input_open_mem(gz->p, gz->len, &in);
	unsetenv("FERRY_INFLATE");
	if (ret)
		goto out;
	CHECK(!strcmp(input_format(in), "gzip"));
	bs = input_source(in);
	while ((n = bs.read(bs.ctx, tmp, chunk)) > 0)
		buf_put(out, tmp, (size_t)n);
	ret = (int)n;
	/* Errors are sticky. */
	if (ret)
		CHECK_EQ(bs.read(bs.ctx, tmp, chunk), ret);
	input_close(in);
out:
	free(tmp);
	return ret;
}

/*
 * Every inflater and feed must give @want_ret and @want (all of it on
 * success, a prefix of it on error).
 */
static void check_stream(const char *what, const struct buf *gz,
			 const struct buf *want, int want_ret)
{
	static const size_t feeds[][2] = {
		{ 0, 1 << 20 }, { 0, 777 }, { 65537, 1 << 20 }, { 4093, 10000 },
		{ 1, 4096 },
	};
	size_t i, f;

	for (i = 0; i < ARRAY_SIZE(inflaters); i++) {
		for (f = 0; f < ARRAY_SIZE(feeds); f++) {
			struct buf out = { 0 };
			int ret;

			/* Byte-by-byte only where it stays fast. */
			if (feeds[f][0] == 1 && gz->len > 200000)
				continue;
			ret = decode(gz, inflaters[i], feeds[f][0], feeds[f][1], &out);
			if (ret != want_ret ||
			    (want_ret ? out.len > want->len : out.len != want->len) ||
			    (out.len && memcmp(out.p, want->p, out.len)))
				fprintf(stderr, "  %s: %s, pieces %zu, reads %zu: "
					"ret %d (want %d), %zu bytes (want %zu)\n",
					what, inflaters[i], feeds[f][0], feeds[f][1],
					ret, want_ret, out.len, want->len);
			CHECK_EQ(ret, want_ret);
			CHECK(want_ret ? out.len <= want->len : out.len == want->len);
			CHECK(!out.len || !memcmp(out.p, want->p, out.len));
			free(out.p);
		}
	}
}

/* The test streams: members of these payloads and options. */
struct stream {
	struct buf gz, data;
	size_t member_end[8]; /* offset in gz after each member */
	size_t nr;
};

static void add_member(struct stream *s, size_t len, bool text,
		       const struct member_opts *o)
{
	struct buf data = { 0 };

	payload(&data, len, text, (uint32_t)(s->nr + len));
	if (data.len)
		buf_put(&s->data, data.p, data.len);
	gzip_member(&s->gz, &data, o);
	s->member_end[s->nr++] = s->gz.len;
	free(data.p);
}

static void stream_free(struct stream *s)
{
	free(s->gz.p);
	free(s->data.p);
}

static const struct member_opts dflt = { .level = 6 };

static void test_single_members(void)
{
	static const struct { size_t len; bool text; int level, strategy; } m[] = {
		{ 0, true, 6, Z_DEFAULT_STRATEGY },
		{ 1, true, 6, Z_DEFAULT_STRATEGY },
		{ 1000, true, 9, Z_DEFAULT_STRATEGY },
		{ 100000, false, 0, Z_DEFAULT_STRATEGY },   /* stored blocks */
		{ 100000, true, 1, Z_FIXED },               /* fixed Huffman */
		{ 3u << 20, true, 6, Z_DEFAULT_STRATEGY },  /* dynamic, > 1 MiB */
		{ 3u << 20, false, 6, Z_DEFAULT_STRATEGY }, /* incompressible */
		{ 2u << 20, true, 1, Z_HUFFMAN_ONLY },
		{ 2u << 20, true, 9, Z_RLE },
	};
	size_t i;

	for (i = 0; i < ARRAY_SIZE(m); i++) {
		struct member_opts o = { .level = m[i].level, .strategy = m[i].strategy };
		struct stream s = { 0 };
		char what[64];

		add_member(&s, m[i].len, m[i].text, &o);
		snprintf(what, sizeof(what), "single member %zu", i);
		check_stream(what, &s.gz, &s.data, 0);
		stream_free(&s);
	}
}

static void test_multi_member(void)
{
	struct member_opts all = { .level = 6, .extra = true, .name = true,
				   .comment = true, .hcrc = true };
	struct stream s = { 0 };

	add_member(&s, 70000, true, &dflt);
	add_member(&s, 0, true, &dflt);       /* empty members */
	add_member(&s, 0, true, &all);
	add_member(&s, 1500000, false, &all); /* FEXTRA, FNAME, FCOMMENT, FHCRC */
	add_member(&s, 5, true, &dflt);
	add_member(&s, 2000000, true, &all);
	check_stream("multi-member", &s.gz, &s.data, 0);
	stream_free(&s);
}

static void test_header_fields(void)
{
	static const struct member_opts o[] = {
		{ .level = 6, .extra = true },
		{ .level = 6, .name = true },
		{ .level = 6, .comment = true },
		{ .level = 6, .hcrc = true },
		{ .level = 6, .extra = true, .name = true, .comment = true, .hcrc = true },
	};
	size_t i;

	for (i = 0; i < ARRAY_SIZE(o); i++) {
		struct stream s = { 0 };

		add_member(&s, 3000, true, &o[i]);
		add_member(&s, 3000, true, &o[i]);
		check_stream("header fields", &s.gz, &s.data, 0);
		stream_free(&s);
	}
}

/* What follows the last member: NULs only, else an error. */
static void test_trailing_data(void)
{
	static const uint8_t garbage[] = { 0, 0, 'x', 0 }, gz_magic[] = { 0x1f, 'x' };
	struct stream s = { 0 };
	uint8_t zeros[3000] = { 0 };
	struct buf b = { 0 };

	add_member(&s, 300000, true, &dflt);
	add_member(&s, 10, true, &dflt);
	buf_put(&b, s.gz.p, s.gz.len);
	buf_put(&b, zeros, sizeof(zeros));
	check_stream("NUL padding", &b, &s.data, 0);
	b.len = s.gz.len;
	buf_put(&b, garbage + 2, 1);
	check_stream("garbage", &b, &s.data, -EFSCORRUPTED);
	b.len = s.gz.len;
	buf_put(&b, garbage, sizeof(garbage));
	check_stream("NULs then garbage", &b, &s.data, -EFSCORRUPTED);
	b.len = s.gz.len;
	buf_put(&b, gz_magic, sizeof(gz_magic));
	check_stream("bad second magic", &b, &s.data, -EFSCORRUPTED);
	/* NULs then another member: gzip(1) does not decode it either. */
	b.len = s.gz.len;
	buf_put(&b, zeros, 10);
	buf_put(&b, s.gz.p, s.gz.len);
	check_stream("NULs then a member", &b, &s.data, -EFSCORRUPTED);
	free(b.p);
	stream_free(&s);
}

static void test_truncated(void)
{
	struct member_opts all = { .level = 6, .extra = true, .name = true,
				   .comment = true, .hcrc = true };
	struct stream s = { 0 };
	size_t first, cut[10], i;

	add_member(&s, 200000, true, &dflt);
	add_member(&s, 1200000, true, &all);
	first = s.member_end[0];
	cut[0] = 2;                 /* after the magic */
	cut[1] = 5;                 /* in the fixed header */
	cut[2] = first / 2;         /* in the deflate data */
	cut[3] = first - 8;         /* before the trailer */
	cut[4] = first - 3;         /* in the ISIZE */
	cut[5] = first + 3;         /* in the second header */
	cut[6] = first + 20;        /* in FEXTRA */
	cut[7] = first + 300;       /* in FNAME */
	cut[8] = (first + s.gz.len) / 2;
	cut[9] = s.gz.len - 1;
	for (i = 0; i < ARRAY_SIZE(cut); i++) {
		struct buf b = { .p = s.gz.p, .len = cut[i] };
		char what[64];

		snprintf(what, sizeof(what), "truncated at %zu", cut[i]);
		check_stream(what, &b, &s.data, -EFSCORRUPTED);
	}
	stream_free(&s);
}

/* Flip one byte at @off (from the end if negative) of a two-member stream. */
static void check_corrupt(const char *what, const struct member_opts *o,
			  long off, uint8_t xor)
{
	struct stream s = { 0 };

	add_member(&s, 100000, true, &dflt);
	add_member(&s, 1100000, true, o);
	s.gz.p[off < 0 ? (long)s.gz.len + off : (long)s.member_end[0] + off] ^= xor;
	check_stream(what, &s.gz, &s.data, -EFSCORRUPTED);
	stream_free(&s);
}

static void test_corrupt(void)
{
	struct member_opts hcrc = { .level = 6, .name = true, .hcrc = true };

	check_corrupt("bad CRC32", &dflt, -8, 0x01);
	check_corrupt("bad CRC32 (high byte)", &dflt, -5, 0x80);
	check_corrupt("bad ISIZE", &dflt, -4, 0x01);
	check_corrupt("bad ISIZE (high byte)", &dflt, -1, 0x10);
	check_corrupt("bad method", &dflt, 2, 0x01);
	check_corrupt("reserved flag", &dflt, 3, 0x20);
	check_corrupt("reserved flag 7", &dflt, 3, 0x80);
	check_corrupt("bad header CRC", &hcrc, 10 + 5000, 0x01);
	check_corrupt("bad block header", &dflt, 10, 0x06);
	check_corrupt("bad deflate data", &dflt, 5000, 0xff);
}

/* A converted image must not depend on the inflater. */
static void test_convert_same_digests(void)
{
	char dir[] = "/tmp/ferry-test-inflate-XXXXXX", cmd[1024], src[128];
	char digest[ARRAY_SIZE(inflaters)][72];
	size_t i;

	CHECK(mkdtemp(dir));
	snprintf(cmd, sizeof(cmd),
		 "cd %s && mkdir -p t/a && seq 1 300000 > t/a/seq && "
		 "head -c 3000000 /dev/urandom > t/rand && cp t/a/seq t/dup && "
		 "echo small > t/small && ln -s a/seq t/link && "
		 "tar -cf - t | gzip -c > in.tar.gz", dir);
	CHECK(!system(cmd));
	snprintf(src, sizeof(src), "tar:%s/in.tar.gz", dir);
	for (i = 0; i < ARRAY_SIZE(inflaters); i++) {
		struct convert_opts opts = {
			.chunk_size = CONVERT_DEFAULT_CHUNK_SIZE,
			.inline_max = CONVERT_DEFAULT_INLINE_MAX,
			.compress = { .codec = BLOB_CODEC_ZSTD },
			.jobs = 2,
		};
		struct convert_stats st = { 0 };
		char dst[128];

		snprintf(dst, sizeof(dst), "oci:%s/%s:t", dir, inflaters[i]);
		setenv("FERRY_INFLATE", inflaters[i], 1);
		CHECK_EQ(convert_run(src, dst, &opts, &st), 0);
		unsetenv("FERRY_INFLATE");
		memcpy(digest[i], st.manifest_digest, sizeof(digest[i]));
		CHECK(st.manifest_digest[0]);
		CHECK(i == 0 || !strcmp(digest[i], digest[0]));
		convert_stats_free(&st);
	}
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	CHECK(!system(cmd));
}

int main(void)
{
	size_t i;

	/* Expected errors would flood the output; FERRY_TEST_VERBOSE shows them. */
	if (!getenv("FERRY_TEST_VERBOSE"))
		ferry_log_level = -1;
	printf("# inflaters:");
	for (i = 0; i < ARRAY_SIZE(inflaters); i++)
		printf(" %s", inflaters[i]);
	printf("\n");

	RUN_TEST(test_single_members);
	RUN_TEST(test_multi_member);
	RUN_TEST(test_header_fields);
	RUN_TEST(test_trailing_data);
	RUN_TEST(test_truncated);
	RUN_TEST(test_corrupt);
	RUN_TEST(test_convert_same_digests);
	TEST_MAIN_END();
}
