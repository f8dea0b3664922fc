// SPDX-License-Identifier: MIT
/*
 * pkg-blob unit tests: codecs, digests, the writer, footer/table/index
 * encoding and validation, verification and materialisation, and the
 * rejection of corrupt or truncated blobs and indexes.
 */
#include "../test.h"
#include "../../pkg-base/base.h"
#include "../../pkg-blob/blob.h"
#include "../../pkg-blob/internal.h"

#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#define MIB (1u << 20)

static char tmpdir[64];

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng(void)
{
	return test_xorshift(&rng_state);
}

enum data_kind { DATA_TEXT, DATA_RANDOM, DATA_ZERO };

/* Compressible but not trivial: random words from a small vocabulary. */
static void fill(uint8_t *buf, size_t len, enum data_kind kind)
{
	static const char *const words[] = {
		"ferry ", "blob ", "chunk ", "erofs ", "image ", "layer ",
		"digest ", "sha256 ", "zstd ", "device\n",
	};
	size_t i = 0;

	if (kind == DATA_ZERO) {
		memset(buf, 0, len);
		return;
	}
	if (kind == DATA_RANDOM) {
		for (i = 0; i < len; i++)
			buf[i] = (uint8_t)(rng() >> 24);
		return;
	}
	while (i < len) {
		const char *w = words[rng() % ARRAY_SIZE(words)];
		size_t n = MIN(strlen(w), len - i);

		memcpy(buf + i, w, n);
		i += n;
	}
}

static uint8_t *alloc_fill(size_t len, enum data_kind kind)
{
	uint8_t *p = malloc(len ? len : 1);

	if (p)
		fill(p, len, kind);
	return p;
}

static const char *tmp_path(const char *name)
{
	return test_path(tmpdir, name);
}

static int write_file(const char *path, const void *buf, size_t len)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	int ret;

	if (fd < 0)
		return -errno;
	ret = write_full(fd, buf, len);
	close(fd);
	return ret;
}

/* A blob of @n chunks with the given sizes and data kinds. */
struct test_blob {
	uint32_t n;
	uint8_t **data;
	uint32_t *len;
	uint64_t *uoff;
	struct blob_info info;
};

/* Writer threads and frame policy (max 0: the default policy). */
struct writer_opts {
	unsigned int jobs;
	uint32_t small, max;
};

/* Every chunk a frame of its own. */
static const struct writer_opts unbatched = { .jobs = 2, .small = 1, .max = 1 };

static int make_blob_opts(const char *path, const char *spec,
			  const struct writer_opts *o, uint32_t n,
			  const uint32_t *lens, const enum data_kind *kinds,
			  struct test_blob *tb)
{
	struct blob_compress c;
	struct blob_writer *w;
	uint32_t i;
	int fd, ret;

	memset(tb, 0, sizeof(*tb));
	ret = blob_compress_parse(spec, &c);
	if (ret)
		return ret;
	tb->n = n;
	tb->data = calloc(n + 1, sizeof(*tb->data));
	tb->len = calloc(n + 1, sizeof(*tb->len));
	tb->uoff = calloc(n + 1, sizeof(*tb->uoff));
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd < 0)
		return -errno;
	ret = blob_writer_new(fd, &c, o->jobs, &w);
	if (ret) {
		close(fd);
		return ret;
	}
	if (o->max)
		ret = blob_writer_set_batching(w, o->small, o->max);
	for (i = 0; !ret && i < n; i++) {
		uint8_t sha[BLOB_DIGEST_SIZE];

		tb->len[i] = lens[i];
		tb->data[i] = alloc_fill(lens[i], kinds[i]);
		sha256_buf(tb->data[i], lens[i], sha);
		ret = blob_writer_add(w, tb->data[i], lens[i], sha,
				      &tb->uoff[i]);
	}
	if (ret) {
		blob_writer_abort(w);
		close(fd);
		return ret;
	}
	ret = blob_writer_finish(w, &tb->info, NULL);
	close(fd);
	return ret;
}

/* The default policy, on two worker threads. */
static int make_blob(const char *path, const char *spec, uint32_t n,
		     const uint32_t *lens, const enum data_kind *kinds,
		     struct test_blob *tb)
{
	static const struct writer_opts dflt = { .jobs = 2 };

	return make_blob_opts(path, spec, &dflt, n, lens, kinds, tb);
}

/* The rest of a test cannot run without its blob. */
#define MAKE_BLOB(...) MUST(make_blob(__VA_ARGS__))
#define MAKE_BLOB_OPTS(...) MUST(make_blob_opts(__VA_ARGS__))
#define MUST(call)                                                             \
	do {                                                                   \
		int _ret = (call);                                             \
		CHECK_EQ(_ret, 0);                                             \
		if (_ret)                                                      \
			return;                                                \
	} while (0)

static void free_blob(struct test_blob *tb)
{
	uint32_t i;

	for (i = 0; i < tb->n; i++)
		free(tb->data[i]);
	free(tb->data);
	free(tb->len);
	free(tb->uoff);
	blob_info_free_chunks(&tb->info);
}

/* A deep copy of @src's info (chunks owned by the copy). */
static struct blob_info info_dup(const struct blob_info *src)
{
	struct blob_info d = *src;

	d.chunks = malloc((src->nr_chunks + 1) * sizeof(*d.chunks));
	if (src->nr_chunks)
		memcpy(d.chunks, src->chunks,
		       src->nr_chunks * sizeof(*d.chunks));
	return d;
}

/* A device file == chunks at their slots, zeros elsewhere. */
static void check_device(const char *dev, const struct test_blob *tb)
{
	uint8_t *file;
	uint64_t pos = 0;
	size_t len;
	uint32_t i;

	file = test_read_file(dev, &len);
	CHECK(file != NULL);
	if (!file)
		return;
	CHECK_EQ(len, tb->info.uncompressed_size);
	for (i = 0; i < tb->n && len == tb->info.uncompressed_size; i++) {
		uint64_t end = tb->uoff[i] + tb->len[i];

		for (; pos < tb->uoff[i]; pos++)
			if (file[pos])
				break;
		CHECK_EQ(pos, tb->uoff[i]);
		CHECK(!memcmp(file + tb->uoff[i], tb->data[i], tb->len[i]));
		for (pos = end; pos < ROUND_UP(end, 4096); pos++)
			if (file[pos])
				break;
		CHECK_EQ(pos, ROUND_UP(end, 4096));
	}
	free(file);
}

static int file_source_read(void *ctx, uint64_t off, void *buf, size_t len)
{
	return pread_full(*(int *)ctx, buf, len, off);
}

/* blob_verify_source over a pread source: must agree with blob_verify_file. */
static int source_verify(const char *path, const struct blob_info *info,
			 struct blob_verify_report *rep)
{
	int fd = open(path, O_RDONLY), ret;
	struct blob_source src = { file_source_read, &fd, NULL };

	if (fd < 0)
		return -errno;
	ret = blob_verify_source(&src, path, info, rep);
	close(fd);
	return ret;
}

/* Fill a fresh chunk cache from @blob: its data file is the device file. */
static void fill_cache_check(const char *blob, const struct test_blob *tb)
{
	char dir[256];
	struct blob_cache_blob *b = NULL;
	int fd = open(blob, O_RDONLY);
	struct blob_source src = { file_source_read, &fd, NULL };

	snprintf(dir, sizeof(dir), "%s/cache", tmpdir);
	CHECK(fd >= 0);
	CHECK_EQ(blob_cache_open(dir, &tb->info, &b), 0);
	if (b) {
		CHECK_EQ(blob_cache_ensure(b, 0, tb->info.uncompressed_size, &src,
					   NULL), 0);
		check_device(blob_cache_data_path(b), tb);
		blob_cache_close(b);
	}
	close(fd);
	CHECK_EQ(blob_cache_gc(dir, NULL, NULL), 0);
}

/* ---------------------------------------------------------------- */

static void test_sha256(void)
{
	static const char *const abc_hex =
		"ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
	uint8_t one[BLOB_DIGEST_SIZE], two[BLOB_DIGEST_SIZE], want[32];
	uint8_t *big = alloc_fill(3 * MIB + 17, DATA_RANDOM);
	struct sha256_hasher *h;

	CHECK_EQ(hex_decode(abc_hex, want, 32), 0);
	sha256_buf("abc", 3, one);
	CHECK(!memcmp(one, want, 32));

	sha256_buf(big, 3 * MIB + 17, one);
	CHECK_EQ(sha256_hasher_new(&h), 0);
	sha256_hasher_update(h, big, 1);
	sha256_hasher_update(h, big + 1, MIB);
	sha256_hasher_update(h, big + 1 + MIB, 2 * MIB + 16);
	sha256_hasher_final(h, two);
	sha256_hasher_free(h);
	CHECK(!memcmp(one, two, 32));
	free(big);
}

static void test_compress_parse(void)
{
	static const struct {
		const char *spec;
		enum blob_codec codec;
		int level;
	} good[] = {
		{ "none", BLOB_CODEC_NONE, 0 }, { "lz4", BLOB_CODEC_LZ4, 0 },
		{ "lz4:1", BLOB_CODEC_LZ4, 1 }, { "lz4:12", BLOB_CODEC_LZ4, 12 },
		{ "zstd", BLOB_CODEC_ZSTD, 0 }, { "zstd:1", BLOB_CODEC_ZSTD, 1 },
		{ "zstd:22", BLOB_CODEC_ZSTD, 22 },
		{ "lzma", BLOB_CODEC_LZMA, 0 }, { "lzma:9", BLOB_CODEC_LZMA, 9 },
	};
	static const char *const bad[] = {
		"", "gzip", "lz4x", "LZ4", "lz4:", "lz4:0", "lz4:13", "zstd:23",
		"zstd:-1", "zstd: 3", "zstd:3x", "zstd:003000000000000000001",
		"lzma:0", "lzma:10", "none:1", "none:", "zstd::3", ":3",
	};
	struct blob_compress c;
	size_t i;

	for (i = 0; i < ARRAY_SIZE(good); i++) {
		c = (struct blob_compress){ .codec = 99, .level = -1 };
		CHECK_EQ(blob_compress_parse(good[i].spec, &c), 0);
		CHECK_EQ(c.codec, good[i].codec);
		CHECK_EQ(c.level, good[i].level);
	}
	for (i = 0; i < ARRAY_SIZE(bad); i++)
		CHECK_EQ(blob_compress_parse(bad[i], &c), -EINVAL);
	CHECK(!strcmp(blob_codec_name(BLOB_CODEC_ZSTD), "zstd"));
	CHECK(!strcmp(blob_codec_name(BLOB_CODEC_LZMA), "lzma"));
	CHECK(!strcmp(blob_codec_name(7), "unknown"));
}

/* Compress + decompress @len bytes of @kind; returns the codec used. */
static int roundtrip(const char *spec, size_t len, enum data_kind kind,
		     size_t *clen_out)
{
	uint8_t *src = alloc_fill(len, kind);
	uint8_t *dst = malloc(blob_compress_bound(len));
	uint8_t *back = malloc(len + 1);
	struct blob_compress c;
	enum blob_codec used = 99;
	size_t clen = 0;
	int ret = -1;

	CHECK_EQ(blob_compress_parse(spec, &c), 0);
	CHECK_EQ(blob_compress(&c, src, len, dst, blob_compress_bound(len),
			       &clen, &used), 0);
	CHECK(clen <= len);
	if (used != BLOB_CODEC_NONE) {
		CHECK_EQ(used, c.codec);
		CHECK(clen < len);
	} else {
		CHECK_EQ(clen, len);
		CHECK(!memcmp(src, dst, len));
	}
	CHECK_EQ(blob_decompress(used, dst, clen, back, len), 0);
	CHECK(!memcmp(src, back, len));
	/* Exactly dst_len bytes: one more or one fewer is corrupt. */
	CHECK_EQ(blob_decompress(used, dst, clen, back, len + 1),
		 -EFSCORRUPTED);
	if (len > 1)
		CHECK_EQ(blob_decompress(used, dst, clen, back, len - 1),
			 -EFSCORRUPTED);
	/* A truncated stream never decodes. */
	if (clen > 1)
		CHECK_EQ(blob_decompress(used, dst, clen - 1, back, len),
			 -EFSCORRUPTED);
	ret = used;
	if (clen_out)
		*clen_out = clen;
	free(src);
	free(dst);
	free(back);
	return ret;
}

static void test_codec_roundtrip(void)
{
	static const char *const specs[] = {
		"none", "lz4", "lz4:1", "lz4:9", "lz4:12", "zstd", "zstd:1",
		"zstd:19", "lzma", "lzma:1", "lzma:9",
	};
	static const size_t sizes[] = { 1, 4095, 4096, 4097, MIB };
	size_t s, k, clen;

	for (s = 0; s < ARRAY_SIZE(specs); s++) {
		bool none = !strcmp(specs[s], "none");

		for (k = 0; k < ARRAY_SIZE(sizes); k++) {
			int used;

			used = roundtrip(specs[s], sizes[k], DATA_TEXT, &clen);
			if (sizes[k] >= 4096 && !none)
				CHECK(used != BLOB_CODEC_NONE &&
				      clen < sizes[k] / 2);
			if (sizes[k] == 1)
				CHECK_EQ(used, BLOB_CODEC_NONE);
			used = roundtrip(specs[s], sizes[k], DATA_ZERO, &clen);
			if (sizes[k] >= 4096 && !none)
				CHECK(used != BLOB_CODEC_NONE &&
				      clen < sizes[k] / 20);
			/* Random data: compression does not help. */
			CHECK_EQ(roundtrip(specs[s], sizes[k], DATA_RANDOM,
					   NULL), BLOB_CODEC_NONE);
		}
	}
}

static void test_codec_chunk_max(void)
{
	static const char *const specs[] = { "none", "lz4", "zstd", "lzma:1" };
	size_t s;

	for (s = 0; s < ARRAY_SIZE(specs); s++)
		roundtrip(specs[s], BLOB_CHUNK_MAX, DATA_ZERO, NULL);
	roundtrip("zstd", BLOB_CHUNK_MAX, DATA_TEXT, NULL);
	roundtrip("lz4", BLOB_CHUNK_MAX, DATA_RANDOM, NULL);
}

/* Compress @len bytes of @src with @spec into @dst (capacity @len). */
static size_t compress_spec(const char *spec, const uint8_t *src, size_t len,
			    uint8_t *dst)
{
	struct blob_compress c;
	enum blob_codec used;
	size_t clen = 0;

	CHECK_EQ(blob_compress_parse(spec, &c), 0);
	CHECK_EQ(blob_compress(&c, src, len, dst, len, &clen, &used), 0);
	CHECK_EQ(used, BLOB_CODEC_ZSTD);
	return clen;
}

/*
 * The default zstd parameters are not a library level, and a thread's
 * context must not carry them over to explicit levels: those give exactly
 * the library's output for that level, whatever was compressed before.
 */
static void test_codec_zstd_params(void)
{
	static const int levels[] = { 1, 3, 5, 19 };
	size_t len = 256u << 10, n_def, n, i;
	uint8_t *src = alloc_fill(len, DATA_TEXT);
	uint8_t *def = malloc(len), *out = malloc(len);
	uint8_t *ref = malloc(ZSTD_compressBound(len));

	CHECK(src && def && out && ref);
	n_def = compress_spec("zstd", src, len, def);
	for (i = 0; i < ARRAY_SIZE(levels); i++) {
		char spec[16];
		size_t r = ZSTD_compress(ref, ZSTD_compressBound(len), src,
					 len, levels[i]);

		CHECK(!ZSTD_isError(r));
		snprintf(spec, sizeof(spec), "zstd:%d", levels[i]);
		compress_spec("zstd", src, len, out);
		n = compress_spec(spec, src, len, out);
		CHECK(n == r && !memcmp(out, ref, n));
		/* Nor do explicit levels leak into the default. */
		n = compress_spec("zstd", src, len, out);
		CHECK(n == n_def && !memcmp(out, def, n));
		if (levels[i] == 5)
			CHECK(n_def != r || memcmp(def, ref, r));
	}
	free(src);
	free(def);
	free(out);
	free(ref);
}

static void test_compress_errors(void)
{
	struct blob_compress c = { .codec = BLOB_CODEC_ZSTD, .level = 23 };
	uint8_t src[8192] = { 0 }, dst[8192];
	enum blob_codec used;
	size_t clen;

	CHECK_EQ(blob_compress(&c, src, sizeof(src), dst, sizeof(dst), &clen,
			       &used), -EINVAL);
	c = (struct blob_compress){ .codec = 9 };
	CHECK_EQ(blob_compress(&c, src, sizeof(src), dst, sizeof(dst), &clen,
			       &used), -EINVAL);
	c = (struct blob_compress){ .codec = BLOB_CODEC_LZ4 };
	/* dst smaller than blob_compress_bound */
	CHECK_EQ(blob_compress(&c, src, sizeof(src), dst, 100, &clen, &used),
		 -EINVAL);
	CHECK_EQ(blob_compress(&c, src, sizeof(src), dst, sizeof(dst), &clen,
			       &used), 0);
	CHECK_EQ(used, BLOB_CODEC_LZ4);
}

static void test_decompress_garbage(void)
{
	uint8_t junk[256], out[4096];
	enum blob_codec codec;
	size_t i;

	for (i = 0; i < sizeof(junk); i++)
		junk[i] = (uint8_t)(i * 37 + 11);
	for (codec = BLOB_CODEC_LZ4; codec <= BLOB_CODEC_LZMA; codec++)
		CHECK_EQ(blob_decompress(codec, junk, sizeof(junk), out,
					 sizeof(out)), -EFSCORRUPTED);
	CHECK_EQ(blob_decompress(9, junk, sizeof(junk), out, sizeof(out)),
		 -EFSCORRUPTED);
	CHECK_EQ(blob_decompress(BLOB_CODEC_NONE, junk, sizeof(junk), out,
				 sizeof(junk) - 1), -EFSCORRUPTED);
	CHECK_EQ(blob_decompress(BLOB_CODEC_ZSTD, junk, 0, out, 16),
		 -EFSCORRUPTED);
}

/*
 * The fill buffers: from 2 MiB up, 2 MiB-aligned multiples of 2 MiB (huge
 * pages); smaller ones as asked; never reallocated when big enough.
 */
static void test_buf_reserve_fresh(void)
{
	uint8_t *buf = NULL, *was;
	size_t cap = 0;

	CHECK_EQ(blob_buf_reserve_fresh(&buf, &cap, 100 << 10), 0);
	CHECK(buf && cap == 100 << 10);
	CHECK_EQ(blob_buf_reserve_fresh(&buf, &cap, (3 << 20) / 2), 0);
	CHECK(buf && cap == (3 << 20) / 2);
	CHECK_EQ(blob_buf_reserve_fresh(&buf, &cap, 2 << 20), 0);
	CHECK(buf && cap == 2 << 20 && !((uintptr_t)buf & ((2 << 20) - 1)));
	if (buf)
		memset(buf, 0xa5, cap);
	was = buf;
	CHECK_EQ(blob_buf_reserve_fresh(&buf, &cap, (2 << 20) - 100), 0);
	CHECK(buf == was && cap == 2 << 20);
	CHECK_EQ(blob_buf_reserve_fresh(&buf, &cap, (4 << 20) + 1), 0);
	CHECK(buf && cap == 6 << 20 && !((uintptr_t)buf & ((2 << 20) - 1)));
	if (buf)
		memset(buf, 0x5a, cap);
	CHECK_EQ(blob_buf_reserve_fresh(&buf, &cap, SIZE_MAX - 1), -ENOMEM);
	CHECK(!buf && !cap);
	free(buf);
}

/* Trailing bytes after a valid stream are corrupt for zstd and lzma. */
static void test_decompress_trailing(void)
{
	static const char *const specs[] = { "zstd", "lzma" };
	uint8_t src[16384], dst[16384 + 8], back[16384];
	struct blob_compress c;
	enum blob_codec used;
	size_t s, clen;

	fill(src, sizeof(src), DATA_TEXT);
	for (s = 0; s < ARRAY_SIZE(specs); s++) {
		CHECK_EQ(blob_compress_parse(specs[s], &c), 0);
		CHECK_EQ(blob_compress(&c, src, sizeof(src), dst, sizeof(dst),
				       &clen, &used), 0);
		CHECK_EQ(used, c.codec);
		memset(dst + clen, 0, 8);
		CHECK_EQ(blob_decompress(used, dst, clen + 8, back,
					 sizeof(back)), -EFSCORRUPTED);
		CHECK_EQ(blob_decompress(used, dst, clen, back, sizeof(back)),
			 0);
	}
}

static const uint32_t mix_lens[] = { 1, 4095, 4096, 4097, MIB, 70000, 8192 };
static const enum data_kind mix_kinds[] = {
	DATA_TEXT, DATA_TEXT, DATA_ZERO, DATA_RANDOM, DATA_TEXT, DATA_RANDOM,
	DATA_ZERO,
};
#define MIX_N ((uint32_t)ARRAY_SIZE(mix_lens))

static void test_writer_layout(void)
{
	uint8_t digest[BLOB_DIGEST_SIZE], *file;
	struct blob_info *bi;
	struct test_blob tb;
	uint64_t uoff = 0, coff = 0;
	size_t len;
	uint32_t i;

	MAKE_BLOB_OPTS(tmp_path("w.blob"), "zstd", &unbatched, MIX_N, mix_lens,
		       mix_kinds, &tb);
	bi = &tb.info;
	file = test_read_file(tmp_path("w.blob"), &len);
	CHECK(file != NULL);
	CHECK_EQ(bi->size, len);
	CHECK_EQ(bi->nr_chunks, MIX_N);
	sha256_buf(file, len, digest);
	CHECK(!memcmp(digest, bi->digest, 32));
	for (i = 0; i < MIX_N; i++) {
		const struct blob_chunk *c = &bi->chunks[i];

		CHECK_EQ(tb.uoff[i], uoff);
		CHECK_EQ(c->uoff, uoff);
		CHECK_EQ(c->coff, coff);
		CHECK_EQ(c->usize, mix_lens[i]);
		CHECK_EQ(c->frame_off, 0);
		CHECK_EQ(c->frame_usize, mix_lens[i]);
		sha256_buf(tb.data[i], mix_lens[i], digest);
		CHECK(!memcmp(digest, c->sha256, 32));
		/* random data stays raw, the rest compresses (except 1 B) */
		if (mix_kinds[i] == DATA_RANDOM || mix_lens[i] == 1)
			CHECK_EQ(c->codec, BLOB_CODEC_NONE);
		else
			CHECK_EQ(c->codec, BLOB_CODEC_ZSTD);
		if (c->codec == BLOB_CODEC_NONE)
			CHECK(!memcmp(file + c->coff, tb.data[i], c->usize));
		uoff += ROUND_UP((uint64_t)mix_lens[i], 4096);
		coff += c->csize;
	}
	CHECK_EQ(bi->uncompressed_size, uoff);
	CHECK_EQ(bi->table_offset, coff);
	CHECK_EQ(bi->size, coff + MIX_N * 64 + 64);
	/* Byte layout of the footer and first entry, as documented. */
	CHECK(!memcmp(file + len - 64, "FERRYBL1", 8));
	CHECK_EQ(get_le32(file + len - 56), 1);
	CHECK_EQ(get_le32(file + len - 52), MIX_N);
	CHECK_EQ(get_le64(file + len - 48), bi->table_offset);
	CHECK_EQ(get_le64(file + len - 40), bi->uncompressed_size);
	CHECK(!memcmp(file + len - 32, bi->table_sha256, 32));
	sha256_buf(file + coff, MIX_N * 64, digest);
	CHECK(!memcmp(digest, bi->table_sha256, 32));
	CHECK_EQ(get_le64(file + coff + 64 + 0), bi->chunks[1].uoff);
	CHECK_EQ(get_le64(file + coff + 64 + 8), bi->chunks[1].coff);
	CHECK_EQ(get_le32(file + coff + 64 + 16), bi->chunks[1].usize);
	CHECK_EQ(get_le32(file + coff + 64 + 20), bi->chunks[1].csize);
	CHECK_EQ(file[coff + 64 + 24], bi->chunks[1].codec);
	CHECK_EQ(get_le32(file + coff + 64 + 28), 0);
	CHECK(!memcmp(file + coff + 64 + 32, bi->chunks[1].sha256, 32));

	CHECK(blob_find_chunk(bi, 0) == &bi->chunks[0]);
	CHECK(blob_find_chunk(bi, bi->chunks[4].uoff) == &bi->chunks[4]);
	CHECK(blob_find_chunk(bi, bi->chunks[MIX_N - 1].uoff) ==
	      &bi->chunks[MIX_N - 1]);
	CHECK(blob_find_chunk(bi, 4096 * 1000) == NULL);
	CHECK(blob_find_chunk(bi, 1) == NULL);
	free(file);
	free_blob(&tb);
}

static void test_writer_errors(void)
{
	struct blob_compress c = { .codec = BLOB_CODEC_LZ4 };
	uint8_t sha[32] = { 0 }, data[16] = { 1 };
	struct blob_writer *w;
	uint64_t uoff;
	int fd = open(tmp_path("err.blob"), O_WRONLY | O_CREAT | O_TRUNC, 0644);

	CHECK(fd >= 0);
	c.level = 13;
	CHECK_EQ(blob_writer_new(fd, &c, 1, &w), -EINVAL);
	c.level = 0;
	CHECK_EQ(blob_writer_new(fd, &c, BLOB_WRITER_JOBS_MAX + 1, &w),
		 -EINVAL);
	CHECK_EQ(blob_writer_new(fd, &c, 0, &w), 0);
	CHECK_EQ(blob_writer_add(w, data, 0, sha, &uoff), -EINVAL);
	CHECK_EQ(blob_writer_add(w, data, BLOB_CHUNK_MAX + 1, sha, &uoff),
		 -EINVAL);
	CHECK_EQ(blob_writer_set_batching(w, 4097, 4096), -EINVAL);
	CHECK_EQ(blob_writer_set_batching(w, 1, BLOB_FRAME_MAX + 1), -EINVAL);
	CHECK_EQ(blob_writer_set_batching(w, 4096, 4096), 0);
	CHECK_EQ(blob_writer_add(w, data, sizeof(data), sha, &uoff), 0);
	CHECK_EQ(uoff, 0);
	CHECK_EQ(blob_writer_set_batching(w, 1, 1), -EBUSY);
	blob_writer_abort(w);
	close(fd);
}

/*
 * One blob with a hot group: chunks 0..7, of which 2, 3 (small) and 5
 * (a frame of its own) are hot; the switches close batch frames. Returns
 * the digest in @digest and the chunks' returned uoffs in @uoff.
 */
static void write_hot_blob(const char *path, unsigned int jobs,
			   uint8_t *const *data, const uint32_t *len,
			   uint64_t *uoff, struct blob_info *info,
			   uint64_t *hot_uoff)
{
	static const bool hot[8] = { 0, 0, 1, 1, 0, 1, 0, 0 };
	struct blob_compress c = { .codec = BLOB_CODEC_ZSTD };
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
	int stage = open(tmp_path("hot.stage"), O_RDWR | O_CREAT | O_TRUNC, 0600);
	struct blob_writer *w;
	int i;

	CHECK(fd >= 0 && stage >= 0);
	CHECK_EQ(blob_writer_new(fd, &c, jobs, &w), 0);
	CHECK_EQ(blob_writer_hot(w, true), -EINVAL); /* no stage yet */
	CHECK_EQ(blob_writer_set_hot_stage(w, -1), -EINVAL);
	CHECK_EQ(blob_writer_set_hot_stage(w, stage), 0);
	CHECK_EQ(blob_writer_set_hot_stage(w, stage), -EBUSY);
	CHECK_EQ(blob_writer_hot(w, false), 0); /* already cold */
	for (i = 0; i < 8; i++) {
		uint8_t sha[BLOB_DIGEST_SIZE];

		CHECK_EQ(blob_writer_hot(w, hot[i]), 0);
		CHECK_EQ(blob_writer_hot(w, hot[i]), 0); /* no second cut */
		sha256_buf(data[i], len[i], sha);
		CHECK_EQ(blob_writer_add(w, data[i], len[i], sha, &uoff[i]), 0);
	}
	CHECK_EQ(blob_writer_finish(w, info, hot_uoff), 0);
	close(stage);
	close(fd);
}

/*
 * blob_writer_hot: hot chunks form one run behind the others, in the file
 * and in the uncompressed space; no frame mixes groups; the blob verifies
 * and does not depend on the number of jobs.
 */
static void test_writer_hot(void)
{
	static const uint32_t len[8] = { 1000, 3000, 2000, 5000,
					 7000, 300 << 10, 4000, 100 };
	static const uint32_t hot_at[3] = { 2, 3, 5 }, cold_at[5] = { 0, 1, 4, 6, 7 };
	uint8_t *data[8], digest1[BLOB_DIGEST_SIZE];
	uint64_t uoff[8], uoff3[8], hot_uoff, hot_uoff3, cold_cend = 0;
	struct blob_info info, info3;
	uint32_t i;

	for (i = 0; i < 8; i++)
		data[i] = alloc_fill(len[i], i == 5 ? DATA_RANDOM : DATA_TEXT);
	write_hot_blob(tmp_path("hot1.blob"), 1, data, len, uoff, &info, &hot_uoff);
	CHECK_EQ(info.nr_chunks, 8);
	/* Returned uoffs: each group from 0 in its own order (4 KiB slots). */
	CHECK_EQ(uoff[0], 0);
	CHECK_EQ(uoff[1], 4096);
	CHECK_EQ(uoff[4], 8192);
	CHECK_EQ(uoff[6], 16384);
	CHECK_EQ(uoff[7], 20480);
	CHECK_EQ(uoff[2], 0);
	CHECK_EQ(uoff[3], 4096);
	CHECK_EQ(uoff[5], 12288);
	CHECK_EQ(hot_uoff, 24576);
	/* The table: the cold chunks in add order, then the hot ones. */
	for (i = 0; i < 5; i++) {
		const struct blob_chunk *ch = &info.chunks[i];

		CHECK_EQ(ch->uoff, uoff[cold_at[i]]);
		CHECK_EQ(ch->usize, len[cold_at[i]]);
		cold_cend = ch->coff + ch->csize;
	}
	for (i = 0; i < 3; i++) {
		const struct blob_chunk *ch = &info.chunks[5 + i];

		CHECK_EQ(ch->uoff, hot_uoff + uoff[hot_at[i]]);
		CHECK_EQ(ch->usize, len[hot_at[i]]);
		CHECK(ch->coff >= cold_cend);
	}
	CHECK_EQ(info.uncompressed_size, hot_uoff + 12288 + (300 << 10));
	/* Frames: [0 1] [4] [6 7] cold, [2 3] [5] hot: a switch cuts. */
	CHECK_EQ(info.chunks[0].coff, info.chunks[1].coff);
	CHECK_EQ(info.chunks[2].frame_off, 0);
	CHECK(info.chunks[2].coff != info.chunks[1].coff);
	CHECK(info.chunks[3].coff != info.chunks[2].coff);
	CHECK_EQ(info.chunks[3].coff, info.chunks[4].coff);
	CHECK_EQ(info.chunks[5].coff, cold_cend);
	CHECK_EQ(info.chunks[5].coff, info.chunks[6].coff);
	CHECK_EQ(info.chunks[7].coff, info.chunks[6].coff + info.chunks[6].csize);
	CHECK_EQ(info.table_offset, info.chunks[7].coff + info.chunks[7].csize);
	/* Every chunk's bytes and the file's digest check out. */
	CHECK_EQ(blob_verify_file(tmp_path("hot1.blob"), &info, NULL), 0);
	memcpy(digest1, info.digest, sizeof(digest1));
	write_hot_blob(tmp_path("hot3.blob"), 3, data, len, uoff3, &info3, &hot_uoff3);
	CHECK_EQ(memcmp(info3.digest, digest1, sizeof(digest1)), 0);
	CHECK_EQ(memcmp(uoff3, uoff, sizeof(uoff)), 0);
	CHECK_EQ(hot_uoff3, hot_uoff);
	blob_info_free_chunks(&info);
	blob_info_free_chunks(&info3);
	for (i = 0; i < 8; i++)
		free(data[i]);
}

/* The hot run's level: denser within the chosen codec, never another. */
static void test_compress_hot(void)
{
	static const struct { struct blob_compress in; int level; } cases[] = {
		{ { BLOB_CODEC_ZSTD, 0 }, 18 },  { { BLOB_CODEC_ZSTD, 3 }, 18 },
		{ { BLOB_CODEC_ZSTD, 22 }, 22 }, { { BLOB_CODEC_LZ4, 0 }, 12 },
		{ { BLOB_CODEC_LZ4, 4 }, 12 },   { { BLOB_CODEC_LZMA, 6 }, 6 },
		{ { BLOB_CODEC_NONE, 0 }, 0 },
	};
	size_t i;

	for (i = 0; i < ARRAY_SIZE(cases); i++) {
		struct blob_compress hot = blob_compress_hot(&cases[i].in);

		CHECK_EQ(hot.codec, cases[i].in.codec);
		CHECK_EQ(hot.level, cases[i].level);
		CHECK(blob_compress_valid(&hot));
	}
}

/* A staging file that cannot be written fails the blob, and it sticks. */
static void test_writer_hot_stage_error(void)
{
	struct blob_compress c = { .codec = BLOB_CODEC_ZSTD };
	uint8_t sha[BLOB_DIGEST_SIZE], data[1000];
	int fd = open(tmp_path("hoterr.blob"), O_RDWR | O_CREAT | O_TRUNC, 0644);
	int stage = open(tmp_path("hoterr.blob"), O_RDONLY);
	struct blob_writer *w;
	struct blob_info info;
	uint64_t uoff;

	CHECK(fd >= 0 && stage >= 0);
	memset(data, 3, sizeof(data));
	sha256_buf(data, sizeof(data), sha);
	CHECK_EQ(blob_writer_new(fd, &c, 1, &w), 0);
	CHECK_EQ(blob_writer_set_hot_stage(w, stage), 0);
	CHECK_EQ(blob_writer_add(w, data, sizeof(data), sha, &uoff), 0);
	CHECK_EQ(blob_writer_hot(w, true), 0);
	CHECK_EQ(blob_writer_add(w, data, sizeof(data), sha, &uoff), 0);
	/* With one job the hot frame is written at the switch back. */
	CHECK_EQ(blob_writer_hot(w, false), -EBADF);
	CHECK_EQ(blob_writer_add(w, data, sizeof(data), sha, &uoff), -EBADF);
	CHECK_EQ(blob_writer_finish(w, &info, NULL), -EBADF);
	close(stage);
	close(fd);
}

/*
 * Add 64 KiB chunks (each a frame) to a writer on @fd until an add fails
 * (writes happen in the background); the error must stick and fail
 * finish. Returns the error, or 0 if nothing failed after 64 adds.
 */
static int add_until_error(int fd, unsigned int jobs)
{
	struct blob_compress c = { .codec = BLOB_CODEC_ZSTD };
	uint8_t sha[32], *data = alloc_fill(64 << 10, DATA_RANDOM);
	struct blob_writer *w;
	struct blob_info info;
	uint64_t uoff;
	int i, ret = 0;

	sha256_buf(data, 64 << 10, sha);
	CHECK_EQ(blob_writer_new(fd, &c, jobs, &w), 0);
	CHECK_EQ(blob_writer_set_batching(w, 1, 1), 0);
	for (i = 0; i < 64 && !ret; i++)
		ret = blob_writer_add(w, data, 64 << 10, sha, &uoff);
	if (ret) {
		CHECK_EQ(blob_writer_add(w, data, 1, sha, &uoff), ret);
		CHECK_EQ(blob_writer_finish(w, &info, NULL), ret);
	} else {
		ret = blob_writer_finish(w, &info, NULL);
		if (!ret)
			blob_info_free_chunks(&info);
	}
	free(data);
	return ret;
}

/* Write errors of any thread reach the caller: EBADF, ENOSPC, EFBIG. */
static void test_writer_write_errors(void)
{
	static const unsigned int jobs[] = { 1, 2, 4 };
	struct rlimit old, lim;
	struct stat st;
	size_t j;
	int fd;

	ferry_log_level = -1;
	for (j = 0; j < ARRAY_SIZE(jobs); j++) {
		fd = open(tmp_path("err.blob"), O_RDONLY);
		CHECK_EQ(add_until_error(fd, jobs[j]), -EBADF);
		close(fd);

		fd = open("/dev/full", O_WRONLY);
		CHECK(fd >= 0);
		CHECK_EQ(add_until_error(fd, jobs[j]), -ENOSPC);
		close(fd);

		/* A file size limit: the first frames are written, then EFBIG. */
		fd = open(tmp_path("err.blob"), O_WRONLY | O_TRUNC);
		CHECK_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
		lim = old;
		lim.rlim_cur = 1 << 20;
		signal(SIGXFSZ, SIG_IGN);
		CHECK_EQ(setrlimit(RLIMIT_FSIZE, &lim), 0);
		CHECK_EQ(add_until_error(fd, jobs[j]), -EFBIG);
		CHECK_EQ(setrlimit(RLIMIT_FSIZE, &old), 0);
		signal(SIGXFSZ, SIG_DFL);
		CHECK(!fstat(fd, &st) && st.st_size == 1 << 20);
		close(fd);
	}
	ferry_log_level = FERRY_LOG_INFO;
}

/* Abort with frames queued, compressing and done: no hang, no leak. */
static void test_writer_abort_in_flight(void)
{
	struct blob_compress c = { .codec = BLOB_CODEC_LZMA, .level = 9 };
	uint8_t sha[32] = { 0 }, *data = alloc_fill(MIB, DATA_TEXT);
	struct blob_writer *w;
	uint64_t uoff;
	int fd = open(tmp_path("abort.blob"), O_WRONLY | O_CREAT | O_TRUNC,
		      0644);
	uint32_t i;

	CHECK_EQ(blob_writer_new(fd, &c, 4, &w), 0);
	for (i = 0; i < 8; i++)
		CHECK_EQ(blob_writer_add(w, data, MIB - i, sha, &uoff), 0);
	CHECK_EQ(blob_writer_add(w, data, 100, sha, &uoff), 0);
	blob_writer_abort(w);
	/* Only the open batch, and nothing at all. */
	CHECK_EQ(blob_writer_new(fd, &c, 3, &w), 0);
	CHECK_EQ(blob_writer_add(w, data, 100, sha, &uoff), 0);
	blob_writer_abort(w);
	CHECK_EQ(blob_writer_new(fd, &c, 2, &w), 0);
	blob_writer_abort(w);
	blob_writer_abort(NULL);
	close(fd);
	free(data);
}

static void test_empty_blob(void)
{
	struct test_blob tb;
	struct blob_info info;
	struct blob_verify_report rep;
	struct stat st;
	int fd;

	MAKE_BLOB(tmp_path("empty.blob"), "zstd", 0, NULL, NULL, &tb);
	CHECK_EQ(tb.info.size, 64);
	CHECK_EQ(tb.info.uncompressed_size, 0);
	CHECK(tb.info.chunks == NULL);
	fd = open(tmp_path("empty.blob"), O_RDONLY);
	CHECK_EQ(blob_read_info(fd, "empty", &tb.info, &info), 0);
	close(fd);
	CHECK_EQ(info.nr_chunks, 0);
	CHECK_EQ(blob_verify_file(tmp_path("empty.blob"), &tb.info, &rep), 0);
	CHECK_EQ(source_verify(tmp_path("empty.blob"), &tb.info, &rep), 0);
	fill_cache_check(tmp_path("empty.blob"), &tb);
	(void)st;
	free_blob(&tb);
}

static void test_read_info(void)
{
	struct blob_info info, expect;
	struct test_blob tb;
	uint32_t i;
	int fd;

	MAKE_BLOB(tmp_path("ri.blob"), "lz4", MIX_N, mix_lens, mix_kinds, &tb);
	fd = open(tmp_path("ri.blob"), O_RDONLY);
	CHECK(fd >= 0);

	i = (uint32_t)blob_read_info(fd, "ri", NULL, &info);
	CHECK_EQ(i, 0);
	if (i) {
		close(fd);
		free_blob(&tb);
		return;
	}
	CHECK_EQ(info.size, tb.info.size);
	CHECK_EQ(info.uncompressed_size, tb.info.uncompressed_size);
	CHECK_EQ(info.table_offset, tb.info.table_offset);
	CHECK_EQ(info.nr_chunks, tb.info.nr_chunks);
	CHECK(!memcmp(info.table_sha256, tb.info.table_sha256, 32));
	for (i = 0; i < MIX_N; i++) {
		CHECK_EQ(info.chunks[i].uoff, tb.info.chunks[i].uoff);
		CHECK_EQ(info.chunks[i].coff, tb.info.chunks[i].coff);
		CHECK_EQ(info.chunks[i].csize, tb.info.chunks[i].csize);
		CHECK_EQ(info.chunks[i].codec, tb.info.chunks[i].codec);
		CHECK(!memcmp(info.chunks[i].sha256, tb.info.chunks[i].sha256,
			      32));
	}
	blob_info_free_chunks(&info);

	CHECK_EQ(blob_read_info(fd, "ri", &tb.info, &info), 0);
	CHECK(!memcmp(info.digest, tb.info.digest, 32));
	blob_info_free_chunks(&info);

	/* Every compared field and entry. */
	CHECK(tb.info.chunks[1].frame_off > 0);
	for (i = 0; i < 10; i++) {
		expect = info_dup(&tb.info);
		switch (i) {
		case 0: expect.size++; break;
		case 1: expect.uncompressed_size += 4096; break;
		case 2: expect.table_offset--; break;
		case 3: expect.nr_chunks--; break;
		case 4: expect.table_sha256[5] ^= 1; break;
		case 5: expect.chunks[3].sha256[0] ^= 1; break;
		case 6: expect.chunks[2].codec = BLOB_CODEC_LZMA; break;
		case 7: expect.chunks[6].csize++; break;
		case 8: expect.chunks[1].frame_off++; break;
		case 9: expect.chunks[0].frame_usize--; break;
		}
		info.chunks = NULL;
		CHECK_EQ(blob_read_info(fd, "ri", &expect, &info),
			 -EFSCORRUPTED);
		CHECK(info.chunks == NULL);
		free(expect.chunks);
	}
	close(fd);
	free_blob(&tb);
}

static void test_verify_ok(void)
{
	static const char *const specs[] = { "none", "lz4", "lz4:9", "zstd",
					      "lzma" };
	struct blob_verify_report rep;
	struct test_blob tb;
	size_t s;

	for (s = 0; s < ARRAY_SIZE(specs); s++) {
		const char *blob = tmp_path("ok.blob");

		MAKE_BLOB(blob, specs[s], MIX_N, mix_lens, mix_kinds, &tb);
		memset(&rep, 0xff, sizeof(rep));
		CHECK_EQ(blob_verify_file(blob, &tb.info, &rep), 0);
		CHECK_EQ(rep.error, 0);
		CHECK_EQ(blob_verify_file(blob, &tb.info, NULL), 0);
		CHECK_EQ(source_verify(blob, &tb.info, &rep), 0);
		fill_cache_check(blob, &tb);
		free_blob(&tb);
	}
}

/* A chunk larger than the 16 MiB read buffer, between small ones. */
static void test_verify_big_chunks(void)
{
	const uint32_t lens[] = { 5000, BLOB_CHUNK_MAX, 3 * MIB, BLOB_CHUNK_MAX };
	const enum data_kind kinds[] = { DATA_TEXT, DATA_RANDOM, DATA_TEXT,
					 DATA_ZERO };
	const char *blob = tmp_path("big.blob");
	struct blob_verify_report rep;
	struct test_blob tb;

	MAKE_BLOB(blob, "lz4", 4, lens, kinds, &tb);
	CHECK_EQ(tb.info.chunks[1].codec, BLOB_CODEC_NONE);
	CHECK_EQ(blob_verify_file(blob, &tb.info, &rep), 0);
	CHECK_EQ(source_verify(blob, &tb.info, &rep), 0);
	fill_cache_check(blob, &tb);
	free_blob(&tb);
}

static void flip_byte(const char *path, uint64_t off)
{
	uint8_t b;
	int fd = open(path, O_RDWR);

	CHECK(fd >= 0);
	CHECK_EQ(pread_full(fd, &b, 1, off), 0);
	b ^= 0x55;
	CHECK_EQ(pwrite_full(fd, &b, 1, off), 0);
	close(fd);
}

/* First and last chunk of the frame of chunk @k. */
static void frame_range(const struct blob_info *bi, uint32_t k, uint32_t *first,
			uint32_t *last)
{
	*first = k;
	while (bi->chunks[*first].frame_off)
		--*first;
	*last = k;
	while (*last + 1 < bi->nr_chunks && bi->chunks[*last + 1].frame_off)
		++*last;
}

/*
 * A flipped byte in the middle of each frame: verify (from a file or a source) fails
 * naming a chunk of that frame (the one holding the byte when the frame
 * is stored raw), with and without batching.
 */
static void test_verify_corrupt_chunk(void)
{
	static const char *const specs[] = { "none", "lz4", "zstd", "lzma" };
	static const struct writer_opts batched = { .jobs = 2 };
	const struct writer_opts *opts[] = { &unbatched, &batched };
	const char *blob = tmp_path("bad.blob");
	struct blob_verify_report rep;
	struct test_blob tb;
	uint8_t *file;
	size_t s, o, len;
	uint32_t k, first, last, holder;

	for (s = 0; s < ARRAY_SIZE(specs) * ARRAY_SIZE(opts); s++) {
		o = s % ARRAY_SIZE(opts);
		MAKE_BLOB_OPTS(blob, specs[s / ARRAY_SIZE(opts)], opts[o],
			       MIX_N, mix_lens, mix_kinds, &tb);
		file = test_read_file(blob, &len);
		for (k = 0; k < MIX_N; k++) {
			const struct blob_chunk *c = &tb.info.chunks[k];

			frame_range(&tb.info, k, &first, &last);
			if (c->frame_off)
				continue; /* one flip per frame */
			CHECK(o || first == last);
			for (holder = first; holder < last; holder++)
				if (tb.info.chunks[holder + 1].frame_off >
				    c->csize / 2)
					break;
			CHECK_EQ(write_file(blob, file, len), 0);
			flip_byte(blob, c->coff + c->csize / 2);
			CHECK_EQ(blob_verify_file(blob, &tb.info, &rep),
				 rep.error);
			CHECK(rep.error == -EIO ||
			      (rep.error == -EFSCORRUPTED &&
			       c->codec != BLOB_CODEC_NONE));
			CHECK(rep.bad_chunk >= first && rep.bad_chunk <= last);
			if (c->codec == BLOB_CODEC_NONE)
				CHECK_EQ(rep.bad_chunk, holder);
			CHECK_EQ(rep.bad_uoff,
				 tb.info.chunks[MIN(rep.bad_chunk, last)].uoff);
			CHECK_EQ(source_verify(blob, &tb.info, NULL), rep.error);
		}
		free(file);
		free_blob(&tb);
	}
}

static void test_verify_whole_blob_errors(void)
{
	const char *blob = tmp_path("t.blob");
	struct blob_verify_report rep;
	struct blob_info info;
	struct test_blob tb;
	uint8_t *file;
	size_t len;
	int fd;

	MAKE_BLOB(blob, "zstd", MIX_N, mix_lens, mix_kinds, &tb);
	file = test_read_file(blob, &len);

	/* Wrong digest in the index: every chunk fine, the file is not. */
	info = tb.info;
	info.digest[0] ^= 1;
	CHECK_EQ(blob_verify_file(blob, &info, &rep), -EFSCORRUPTED);
	CHECK_EQ(rep.bad_chunk, BLOB_VERIFY_NO_CHUNK);
	CHECK_EQ(rep.bad_uoff, BLOB_VERIFY_NO_UOFF);
	CHECK_EQ(source_verify(blob, &info, NULL), -EFSCORRUPTED);
	/* An unknown (zero) digest skips only that check. */
	memset(info.digest, 0, 32);
	CHECK_EQ(blob_verify_file(blob, &info, &rep), 0);

	/* Truncated by one byte, and to less than a footer. */
	CHECK_EQ(write_file(blob, file, len - 1), 0);
	CHECK_EQ(blob_verify_file(blob, &tb.info, &rep), -EFSCORRUPTED);
	CHECK_EQ(rep.bad_chunk, BLOB_VERIFY_NO_CHUNK);
	fd = open(blob, O_RDONLY);
	CHECK_EQ(blob_read_info(fd, "trunc", NULL, &info), -EFSCORRUPTED);
	close(fd);
	CHECK_EQ(write_file(blob, file + len - 63, 63), 0);
	fd = open(blob, O_RDONLY);
	CHECK_EQ(blob_read_info(fd, "tiny", NULL, &info), -EFSCORRUPTED);
	close(fd);
	/* Missing file */
	unlink(blob);
	CHECK_EQ(blob_verify_file(blob, &tb.info, &rep), -ENOENT);
	CHECK_EQ(source_verify(blob, &tb.info, NULL), -ENOENT);
	free(file);
	free_blob(&tb);
}

static void test_chunk_decode(void)
{
	const uint32_t lens[] = { 10000 };
	const enum data_kind kinds[] = { DATA_TEXT };
	struct blob_chunk c;
	struct test_blob tb;
	uint8_t *file, out[10000];
	size_t len;

	MAKE_BLOB(tmp_path("cd.blob"), "lzma", 1, lens, kinds, &tb);
	file = test_read_file(tmp_path("cd.blob"), &len);
	c = tb.info.chunks[0];
	CHECK_EQ(c.codec, BLOB_CODEC_LZMA);
	CHECK_EQ(blob_chunk_decode(&c, file + c.coff, out), 0);
	CHECK(!memcmp(out, tb.data[0], sizeof(out)));
	c.sha256[31] ^= 1;
	CHECK_EQ(blob_chunk_decode(&c, file + c.coff, out), -EIO);
	c = tb.info.chunks[0];
	c.csize--;
	CHECK_EQ(blob_chunk_decode(&c, file + c.coff, out), -EFSCORRUPTED);
	free(file);
	free_blob(&tb);
}

/* ---------------- in-memory footer / table corruption ---------------- */

/* Decode @file (a whole blob) as blob_read_info would; 0 or the error. */
static int decode_mem(const uint8_t *file, size_t len)
{
	struct blob_info info;
	int ret;

	if (len < 64)
		return -EFSCORRUPTED;
	ret = blob_footer_decode(file + len - 64, len, &info);
	if (ret)
		return ret;
	if (info.table_offset > len)
		return -EFSCORRUPTED;
	ret = blob_table_decode(file + info.table_offset,
				len - 64 - info.table_offset, &info);
	blob_info_free_chunks(&info);
	return ret;
}

static void test_footer_corrupt(void)
{
	struct test_blob tb;
	uint8_t *file, *f;
	size_t len;
	int i;

	MAKE_BLOB(tmp_path("f.blob"), "zstd", MIX_N, mix_lens, mix_kinds, &tb);
	file = test_read_file(tmp_path("f.blob"), &len);
	CHECK_EQ(decode_mem(file, len), 0);
	f = file + len - 64;
	for (i = 0; i < 10; i++) {
		uint8_t save[64];

		memcpy(save, f, 64);
		switch (i) {
		case 0: f[0] = 'X'; break;                       /* magic */
		case 1: put_le32(f + 8, 2); break;               /* version */
		case 2: put_le32(f + 12, MIX_N + 1); break;      /* nr_chunks */
		case 3: put_le32(f + 12, MIX_N - 1); break;
		case 4: put_le32(f + 12, UINT32_MAX); break;
		case 5: put_le64(f + 16, get_le64(f + 16) + 1); break;
		case 6: put_le64(f + 16, UINT64_MAX - 63); break; /* overflow */
		case 7: put_le64(f + 24, get_le64(f + 24) + 4096); break;
		case 8: put_le64(f + 24, get_le64(f + 24) + 1); break;
		case 9: f[40] ^= 1; break;                       /* table sha */
		}
		CHECK_EQ(decode_mem(file, len), -EFSCORRUPTED);
		memcpy(f, save, 64);
	}
	CHECK_EQ(decode_mem(file, len), 0);
	free(file);
	free_blob(&tb);
}

/*
 * Change entry fields, then fix the table digest (in a footer copy) so
 * that the entry rules, not the digest, must reject the table.
 */
static int decode_table_modified(const uint8_t *file, size_t len,
				 uint8_t *table, uint32_t nr)
{
	struct blob_info info;
	int ret;

	CHECK_EQ(blob_footer_decode(file + len - 64, len, &info), 0);
	sha256_buf(table, (size_t)nr * 64, info.table_sha256);
	ret = blob_table_decode(table, (size_t)nr * 64, &info);
	blob_info_free_chunks(&info);
	return ret;
}

static void test_table_corrupt(void)
{
	struct test_blob tb;
	uint8_t *file, *t, *e;
	size_t len;
	int i;

	MAKE_BLOB_OPTS(tmp_path("t.blob"), "lz4", &unbatched, MIX_N, mix_lens,
		       mix_kinds, &tb);
	file = test_read_file(tmp_path("t.blob"), &len);
	t = file + tb.info.table_offset;
	CHECK_EQ(decode_table_modified(file, len, t, MIX_N), 0);
	/* chunk 1: text, lz4-compressed; chunk 3: random, stored raw */
	CHECK_EQ(tb.info.chunks[1].codec, BLOB_CODEC_LZ4);
	CHECK_EQ(tb.info.chunks[3].codec, BLOB_CODEC_NONE);
	for (i = 0; i < 17; i++) {
		uint8_t save[MIX_N * 64];

		memcpy(save, t, sizeof(save));
		e = t + 64 * (i < 8 ? 1 : 3);
		switch (i) {
		case 0: e[25] = 1; break;                   /* reserved */
		case 1: e[27] = 0x80; break;
		case 2: e[24] = 4; break;                   /* codec */
		case 3: put_le64(e, get_le64(e) + 512); break;  /* misaligned */
		case 4: put_le64(e, 0); break;              /* overlaps 0 */
		case 5: put_le64(e, get_le64(e) + 4096); break; /* gap */
		case 6: put_le32(e + 20, get_le32(e + 16)); break; /* csize */
		case 7: put_le32(e + 20, 0); break;
		case 8: put_le32(e + 20, get_le32(e + 20) - 1); break;
		case 9: put_le32(e + 16, 0); break;         /* usize 0 */
		case 10: put_le32(e + 16, BLOB_CHUNK_MAX + 1);
			put_le32(e + 20, BLOB_CHUNK_MAX + 1); break;
		case 11: put_le64(e + 8, get_le64(e + 8) + 1); break; /* coff */
		case 12: put_le64(e + 8, tb.info.table_offset); break;
		case 13: put_le64(e + 8, UINT64_MAX - 10); break;
		case 14: put_le64(e + 8, 0); break;         /* overlaps 0 */
		case 15: /* swap chunks 3 and 4: not ascending */
			memcpy(e, save + 4 * 64, 64);
			memcpy(e + 64, save + 3 * 64, 64);
			break;
		case 16: put_le32(t + 28, 1); break;        /* chunk 0 */
		}
		CHECK_EQ(decode_table_modified(file, len, t, MIX_N),
			 -EFSCORRUPTED);
		memcpy(t, save, sizeof(save));
	}
	/* The last slot must end at uncompressed_size, the data at the table. */
	e = t + 64 * (MIX_N - 1);
	put_le32(e + 16, get_le32(e + 16) + 4096);
	put_le32(e + 20, get_le32(e + 20) + 4096);
	CHECK_EQ(decode_table_modified(file, len, t, MIX_N), -EFSCORRUPTED);
	free(file);
	free_blob(&tb);
}

/* ------------------------------- frames ------------------------------ */

/* The frame policy, restated: chunk i goes to frame frame[i] at off[i]. */
static void model_frames(const uint32_t *lens, uint32_t n, uint32_t small,
			 uint32_t max, uint32_t *frame, uint32_t *off)
{
	uint32_t i, next = 0, cur = 0, fill = 0;
	bool open = false;

	for (i = 0; i < n; i++) {
		bool batched = lens[i] < small;

		if (open && (!batched || fill + lens[i] > max))
			open = false;
		if (!open) {
			cur = next++;
			fill = 0;
			open = true;
		}
		frame[i] = cur;
		off[i] = fill;
		fill += lens[i];
		if (!batched)
			open = false;
	}
}

/* @bi's frames are the model's: offsets, shared and consecutive ranges. */
static void check_frames(const struct test_blob *tb, uint32_t small,
			 uint32_t max)
{
	const struct blob_info *bi = &tb->info;
	uint32_t *frame = calloc(tb->n + 1, sizeof(*frame));
	uint32_t *off = calloc(tb->n + 1, sizeof(*off));
	uint32_t i, j, fsize;

	model_frames(tb->len, tb->n, small, max, frame, off);
	CHECK_EQ(bi->nr_chunks, tb->n);
	for (i = 0; i < tb->n && i < bi->nr_chunks; i = j) {
		const struct blob_chunk *c = &bi->chunks[i];

		for (j = i, fsize = 0; j < tb->n && frame[j] == frame[i]; j++)
			fsize += tb->len[j];
		CHECK(fsize <= max || j == i + 1);
		if (i)
			CHECK_EQ(c->coff, c[-1].coff + c[-1].csize);
		else
			CHECK_EQ(c->coff, 0);
		for (; i < j; i++) {
			CHECK_EQ(bi->chunks[i].frame_off, off[i]);
			CHECK_EQ(bi->chunks[i].frame_usize, fsize);
			CHECK_EQ(bi->chunks[i].coff, c->coff);
			CHECK_EQ(bi->chunks[i].csize, c->csize);
			CHECK_EQ(bi->chunks[i].codec, c->codec);
			CHECK_EQ(bi->chunks[i].uoff, tb->uoff[i]);
		}
	}
	free(frame);
	free(off);
}

/* Random chunk sizes, mostly small, some big, and random data kinds. */
static void random_sequence(uint32_t n, uint32_t big, uint32_t *lens,
			    enum data_kind *kinds)
{
	uint32_t i;

	for (i = 0; i < n; i++) {
		uint64_t r = rng();

		lens[i] = r % 8 ? 1 + (uint32_t)(r >> 8) % (big / 2) :
				  big / 2 + (uint32_t)(r >> 8) % (2 * big);
		kinds[i] = (enum data_kind)((r >> 40) % 3);
	}
}

static void test_batch_composition(void)
{
	/* 64 KiB / 128 KiB: closed by a big chunk, by size, at the end. */
	static const uint32_t lens[] = {
		1000, 2000, 70000, 3000, 60000, 60000, 10000, 65535, 65536,
		65535, 65535, 2, 1, 65536, 65535,
	};
	static const uint32_t want_off[] = {
		0, 1000, 0, 0, 3000, 63000, 0, 10000, 0,
		0, 65535, 131070, 0, 0, 0,
	};
	static const struct writer_opts o = {
		.jobs = 3, .small = 64 << 10, .max = 128 << 10,
	};
	static const struct writer_opts dflt = { .jobs = 2 };
	enum data_kind kinds[300];
	uint32_t rlens[300], i, frames = 0;
	struct test_blob tb;

	for (i = 0; i < ARRAY_SIZE(lens); i++)
		kinds[i] = DATA_TEXT;
	MAKE_BLOB_OPTS(tmp_path("bc.blob"), "zstd", &o, ARRAY_SIZE(lens), lens,
		       kinds, &tb);
	for (i = 0; i < ARRAY_SIZE(lens); i++) {
		CHECK_EQ(tb.info.chunks[i].frame_off, want_off[i]);
		frames += !want_off[i];
	}
	CHECK_EQ(frames, 9);
	CHECK_EQ(tb.info.chunks[11].frame_usize, 131072);
	CHECK_EQ(tb.info.chunks[12].frame_usize, 1);
	check_frames(&tb, o.small, o.max);
	free_blob(&tb);

	/* Random sequences, small thresholds and the defaults. */
	random_sequence(ARRAY_SIZE(rlens), 16 << 10, rlens, kinds);
	MAKE_BLOB_OPTS(tmp_path("bc.blob"), "lz4",
		       &(struct writer_opts){ .jobs = 2, .small = 8 << 10,
					      .max = 20 << 10 },
		       ARRAY_SIZE(rlens), rlens, kinds, &tb);
	check_frames(&tb, 8 << 10, 20 << 10);
	free_blob(&tb);
	random_sequence(ARRAY_SIZE(rlens), BLOB_BATCH_SMALL, rlens, kinds);
	MAKE_BLOB_OPTS(tmp_path("bc.blob"), "zstd", &dflt, ARRAY_SIZE(rlens),
		       rlens, kinds, &tb);
	check_frames(&tb, BLOB_BATCH_SMALL, BLOB_BATCH_MAX);
	CHECK_EQ(blob_verify_file(tmp_path("bc.blob"), &tb.info, NULL), 0);
	free_blob(&tb);
}

/* Every chunk decodes alone and through its decoded frame. */
static void test_batch_decode(void)
{
	static const char *const specs[] = { "none", "lz4", "zstd", "lzma" };
	/* A compressible batch, an incompressible one, a big chunk. */
	static const uint32_t lens[] = { 5000, 1, 4096, 3000, 90000, 700, 800 };
	static const enum data_kind kinds[] = {
		DATA_TEXT, DATA_TEXT, DATA_ZERO, DATA_TEXT, DATA_TEXT,
		DATA_RANDOM, DATA_RANDOM,
	};
	static const struct writer_opts o = {
		.jobs = 2, .small = 64 << 10, .max = 128 << 10,
	};
	uint8_t *file, *frame = malloc(o.max), *out = malloc(90000);
	struct test_blob tb;
	struct blob_chunk c;
	size_t s, len;
	uint32_t i;

	for (s = 0; s < ARRAY_SIZE(specs); s++) {
		const char *path = tmp_path("bd.blob");
		const struct blob_chunk *ch;

		MAKE_BLOB_OPTS(path, specs[s], &o, ARRAY_SIZE(lens), lens,
			       kinds, &tb);
		ch = tb.info.chunks;
		file = test_read_file(path, &len);
		/* frames {0..3} {4} {5, 6} */
		CHECK_EQ(ch[3].frame_off, 9097);
		CHECK_EQ(ch[3].frame_usize, 12097);
		CHECK_EQ(ch[4].frame_off, 0);
		CHECK_EQ(ch[6].frame_off, 700);
		CHECK_EQ(ch[6].codec, BLOB_CODEC_NONE);
		CHECK_EQ(ch[6].csize, 1500);
		CHECK(!memcmp(file + ch[6].coff + 700, tb.data[6], 800));
		/* specs[0] is "none" */
		CHECK_EQ(ch[0].codec != BLOB_CODEC_NONE, s != 0);
		for (i = 0; i < tb.n; i++) {
			memset(out, 0xaa, 90000);
			CHECK_EQ(blob_chunk_decode(&ch[i], file + ch[i].coff,
						   out), 0);
			CHECK(!memcmp(out, tb.data[i], tb.len[i]));
			if (!ch[i].frame_off)
				CHECK_EQ(blob_frame_decode(&ch[i],
							   file + ch[i].coff,
							   frame), 0);
			CHECK(!memcmp(frame + ch[i].frame_off, tb.data[i],
				      tb.len[i]));
			CHECK_EQ(blob_chunk_verify(&ch[i],
						   frame + ch[i].frame_off), 0);
			c = ch[i];
			c.sha256[0] ^= 1;
			CHECK_EQ(blob_chunk_verify(&c, frame + c.frame_off),
				 -EIO);
			CHECK_EQ(blob_chunk_decode(&c, file + c.coff, out),
				 -EIO);
			c = ch[i];
			c.frame_off = c.frame_usize;
			CHECK_EQ(blob_chunk_decode(&c, file + c.coff, out),
				 -EINVAL);
		}
		/* A frame cut short does not decode. */
		c = ch[1];
		c.csize--;
		CHECK_EQ(blob_frame_decode(&c, file + c.coff, frame),
			 -EFSCORRUPTED);
		CHECK_EQ(blob_chunk_decode(&c, file + c.coff, out),
			 -EFSCORRUPTED);
		free(file);
		free_blob(&tb);
	}
	free(frame);
	free(out);
}

/* A table of @nr hand-made entries with consistent footer fields. */
static int decode_entries(const struct blob_chunk *chunks, uint32_t nr,
			  uint64_t table_offset)
{
	struct blob_info info = {
		.nr_chunks = nr,
		.table_offset = table_offset,
		.size = table_offset + nr * 64 + 64,
	};
	uint8_t *t = malloc(nr * 64);
	uint32_t i;
	int ret;

	for (i = 0; i < nr; i++)
		info.uncompressed_size += ROUND_UP((uint64_t)chunks[i].usize,
						   4096);
	blob_table_encode(chunks, nr, t);
	sha256_buf(t, nr * 64, info.table_sha256);
	ret = blob_table_decode(t, nr * 64, &info);
	if (!ret)
		CHECK_EQ(info.chunks[0].frame_usize,
			 chunks[nr - 1].frame_off + chunks[nr - 1].usize);
	blob_info_free_chunks(&info);
	free(t);
	return ret;
}

static void test_frame_corrupt(void)
{
	/* frames {0, 1, 2} {3} {4, 5}, compressed with lz4 */
	static const uint32_t lens[] = { 1000, 2000, 3000, 70000, 500, 600 };
	static const enum data_kind kinds[] = {
		DATA_TEXT, DATA_TEXT, DATA_RANDOM, DATA_TEXT, DATA_TEXT,
		DATA_TEXT,
	};
	const uint32_t half = BLOB_FRAME_MAX / 2;
	struct blob_chunk big[3] = {
		{ .uoff = 0, .usize = half, .csize = 100,
		  .codec = BLOB_CODEC_ZSTD },
		{ .uoff = half, .usize = half, .csize = 100, .frame_off = half,
		  .codec = BLOB_CODEC_ZSTD },
		{ .uoff = 2 * (uint64_t)half, .usize = 4096, .csize = 100,
		  .frame_off = 2 * half, .codec = BLOB_CODEC_ZSTD },
	};
	struct test_blob tb;
	uint8_t *file, *t, *e;
	size_t len;
	int i, j;

	MAKE_BLOB_OPTS(tmp_path("fc.blob"), "lz4",
		       &(struct writer_opts){ .jobs = 2, .small = 64 << 10,
					      .max = 128 << 10 },
		       ARRAY_SIZE(lens), lens, kinds, &tb);
	file = test_read_file(tmp_path("fc.blob"), &len);
	t = file + tb.info.table_offset;
	CHECK_EQ(decode_table_modified(file, len, t, 6), 0);
	CHECK_EQ(tb.info.chunks[2].frame_off, 3000);
	CHECK_EQ(tb.info.chunks[5].frame_off, 500);
	CHECK_EQ(tb.info.chunks[0].codec, BLOB_CODEC_LZ4);
	for (i = 0; i < 15; i++) {
		uint8_t save[6 * 64];

		memcpy(save, t, sizeof(save));
		e = t + 64;
		switch (i) {
		case 0: put_le32(e + 28, 1001); break;      /* frame_off */
		case 1: put_le32(e + 28, 999); break;
		case 2: put_le32(e + 28, 0); break;         /* splits frame */
		case 3: put_le32(t + 28, 1); break;         /* first chunk */
		case 4: put_le32(e + 64 * 4 + 28, 0); break;
		case 5: put_le64(e + 8, get_le64(e + 8) + 1); break; /* coff */
		case 6: put_le32(e + 20, get_le32(e + 20) - 1); break;
		case 7: e[24] = BLOB_CODEC_ZSTD; break;     /* codec */
		case 8: e[26] = 1; break;                   /* reserved */
		case 9: /* the whole frame's csize: the next frame moves */
			for (j = 0; j < 3; j++)
				put_le32(t + 64 * j + 20,
					 get_le32(t + 20) - 1);
			break;
		case 10: /* stored, but csize is not the frame size */
			for (j = 0; j < 3; j++)
				t[64 * j + 24] = BLOB_CODEC_NONE;
			break;
		case 11: /* compressed to its full size */
			for (j = 4; j < 6; j++)
				put_le32(t + 64 * j + 20, 1100);
			break;
		case 12: /* chunk 3 joins frame 0 */
			put_le64(t + 64 * 3 + 8, get_le64(t + 8));
			put_le32(t + 64 * 3 + 20, get_le32(t + 20));
			t[64 * 3 + 24] = t[24];
			put_le32(t + 64 * 3 + 28, 6000);
			break;
		case 13: /* chunk 5 moves 1 byte into its frame */
			put_le32(e + 64 * 4 + 28, 501);
			break;
		case 14: e[31] = 0x80; break;
		}
		CHECK_EQ(decode_table_modified(file, len, t, 6),
			 -EFSCORRUPTED);
		memcpy(t, save, sizeof(save));
	}
	CHECK_EQ(decode_table_modified(file, len, t, 6), 0);

	/* A frame of exactly BLOB_FRAME_MAX bytes, and one byte more. */
	CHECK_EQ(decode_entries(big, 2, 100), 0);
	CHECK_EQ(decode_entries(big, 3, 100), -EFSCORRUPTED);
	big[1].usize++;
	CHECK_EQ(decode_entries(big, 2, 100), -EFSCORRUPTED);
	big[1].usize--;
	big[0].codec = big[1].codec = BLOB_CODEC_NONE;
	big[0].csize = big[1].csize = BLOB_FRAME_MAX;
	CHECK_EQ(decode_entries(big, 2, BLOB_FRAME_MAX), 0);
	CHECK_EQ(decode_entries(big, 2, BLOB_FRAME_MAX - 1), -EFSCORRUPTED);
	free(file);
	free_blob(&tb);
}

/* The same adds give the same bytes whatever the thread count. */
static void test_writer_determinism(void)
{
	static const unsigned int jobs[] = { 1, 2, 3, 8 };
	/* Big chunks fill the window by bytes before they fill its slots. */
	static const struct {
		uint32_t n, big;
		const char *spec;
		struct writer_opts policy;
	} cases[] = {
		{ 400, 64 << 10, "zstd", { .small = 8 << 10, .max = 24 << 10 } },
		{ 400, 64 << 10, "zstd", { .max = 0 } },
		{ 400, 64 << 10, "lz4:9", { .small = 8 << 10, .max = 24 << 10 } },
		{ 400, 64 << 10, "lz4:9", { .max = 0 } },
		{ 16, 4 << 20, "zstd:1", { .max = 0 } },
	};
	enum data_kind kinds[400];
	uint32_t lens[400];
	uint8_t *first = NULL, *file;
	size_t first_len = 0, len, k, j;
	struct test_blob tb;
	uint64_t seed;

	for (k = 0; k < ARRAY_SIZE(cases); k++) {
		random_sequence(cases[k].n, cases[k].big, lens, kinds);
		seed = rng();
		for (j = 0; j < ARRAY_SIZE(jobs); j++) {
			struct writer_opts o = cases[k].policy;

			o.jobs = jobs[j];
			rng_state = seed; /* the same data */
			MAKE_BLOB_OPTS(tmp_path("det.blob"), cases[k].spec, &o,
				       cases[k].n, lens, kinds, &tb);
			file = test_read_file(tmp_path("det.blob"), &len);
			if (!j) {
				first = file;
				first_len = len;
			} else {
				CHECK_EQ(len, first_len);
				CHECK(file && first && !memcmp(file, first, len));
				free(file);
			}
			free_blob(&tb);
		}
		free(first);
	}
}

/* ------------------------------- index ------------------------------- */

static void check_same_info(const struct blob_info *a,
			    const struct blob_info *b)
{
	uint32_t i;

	CHECK(!memcmp(a->digest, b->digest, 32));
	CHECK_EQ(a->size, b->size);
	CHECK_EQ(a->uncompressed_size, b->uncompressed_size);
	CHECK_EQ(a->table_offset, b->table_offset);
	CHECK_EQ(a->nr_chunks, b->nr_chunks);
	CHECK(!memcmp(a->table_sha256, b->table_sha256, 32));
	for (i = 0; i < a->nr_chunks && i < b->nr_chunks; i++) {
		CHECK_EQ(a->chunks[i].uoff, b->chunks[i].uoff);
		CHECK_EQ(a->chunks[i].coff, b->chunks[i].coff);
		CHECK_EQ(a->chunks[i].usize, b->chunks[i].usize);
		CHECK_EQ(a->chunks[i].csize, b->chunks[i].csize);
		CHECK_EQ(a->chunks[i].codec, b->chunks[i].codec);
		CHECK(!memcmp(a->chunks[i].sha256, b->chunks[i].sha256, 32));
	}
}

static void test_index(void)
{
	const uint32_t lens2[] = { 300, 9000 };
	const enum data_kind kinds2[] = { DATA_TEXT, DATA_RANDOM };
	struct test_blob tb[3];
	struct blob_info infos[3];
	struct blob_index idx;
	size_t len, i, tables_at;
	uint8_t *buf, *copy;
	void *vbuf;

	MAKE_BLOB(tmp_path("i0.blob"), "zstd", MIX_N, mix_lens, mix_kinds,
	          &tb[0]);
	MAKE_BLOB(tmp_path("i1.blob"), "none", 0, NULL, NULL, &tb[1]);
	MAKE_BLOB(tmp_path("i2.blob"), "lzma", 2, lens2, kinds2, &tb[2]);
	for (i = 0; i < 3; i++)
		infos[i] = tb[i].info;
	i = (size_t)-blob_index_encode(infos, 3, &vbuf, &len);
	CHECK_EQ(i, 0);
	if (i)
		return;
	buf = vbuf;
	CHECK_EQ(len, 16 + 3 * 128 + (MIX_N + 0 + 2) * 64);
	CHECK(!memcmp(buf, "FERRYIX1", 8));
	CHECK_EQ(get_le32(buf + 8), 1);
	CHECK_EQ(get_le32(buf + 12), 3);
	CHECK_EQ(get_le64(buf + 16 + 128 + 32), tb[1].info.size);
	CHECK_EQ(blob_index_decode(buf, len, &idx), 0);
	CHECK_EQ(idx.nr_blobs, 3);
	for (i = 0; i < 3 && idx.nr_blobs == 3; i++)
		check_same_info(&idx.blobs[i], &tb[i].info);
	blob_index_free(&idx);
	CHECK(idx.blobs == NULL);

	/* Empty index */
	CHECK_EQ(blob_index_encode(NULL, 0, &vbuf, &i), 0);
	CHECK_EQ(i, 16);
	CHECK_EQ(blob_index_decode(vbuf, i, &idx), 0);
	CHECK_EQ(idx.nr_blobs, 0);
	blob_index_free(&idx);
	free(vbuf);

	/* Encoding an inconsistent info is refused. */
	infos[2].table_sha256[0] ^= 1;
	CHECK_EQ(blob_index_encode(infos, 3, &vbuf, &i), -EINVAL);
	infos[2].table_sha256[0] ^= 1;
	infos[0].size++;
	CHECK_EQ(blob_index_encode(infos, 3, &vbuf, &i), -EINVAL);
	infos[0].size--;

	/* Every truncation and one extra byte are rejected. */
	copy = malloc(len + 1);
	memcpy(copy, buf, len);
	copy[len] = 0;
	CHECK_EQ(blob_index_decode(copy, len + 1, &idx), -EFSCORRUPTED);
	ferry_log_level = -1; /* ~1000 expected error lines */
	for (i = 0; i < len; i++)
		CHECK_EQ(blob_index_decode(copy, i, &idx), -EFSCORRUPTED);
	ferry_log_level = FERRY_LOG_INFO;

	tables_at = 16 + 3 * 128;
	for (i = 0; i < 14; i++) {
		uint8_t *r0 = copy + 16, *r2 = copy + 16 + 256;

		memcpy(copy, buf, len);
		switch (i) {
		case 0: copy[0] = 'x'; break;
		case 1: put_le32(copy + 8, 2); break;
		case 2: put_le32(copy + 12, 4); break;     /* records overrun */
		case 3: put_le32(copy + 12, 2); break;     /* trailing table */
		case 4: put_le32(copy + 12, UINT32_MAX); break;
		case 5: put_le64(r0 + 32, get_le64(r0 + 32) + 1); break;
		case 6: put_le64(r0 + 40, get_le64(r0 + 40) + 4096); break;
		case 7: put_le64(r0 + 48, get_le64(r0 + 48) + 64);
			put_le32(r0 + 56, get_le32(r0 + 56) - 1); break;
		case 8: put_le32(r2 + 56, UINT32_MAX); break;
		case 9: r0[60] = 1; break;                 /* reserved */
		case 10: r2[127] = 1; break;
		case 11: r2[64] ^= 1; break;               /* table sha */
		case 12: copy[tables_at + 64 + 25] = 1; break; /* entry */
		case 13: copy[len - 1] ^= 1; break;         /* last entry sha */
		}
		CHECK_EQ(blob_index_decode(copy, len, &idx), -EFSCORRUPTED);
		CHECK(idx.blobs == NULL);
	}
	free(copy);
	free(buf);
	for (i = 0; i < 3; i++)
		free_blob(&tb[i]);
}

/* With the chunk cache's directories (cache/blobs/sha256) under it. */
static void remove_tmpdir(void)
{
	char cmd[96];

	snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
	if (system(cmd))
		fprintf(stderr, "cannot remove %s\n", tmpdir);
}

int main(void)
{
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/ferry-test-blob.XXXXXX");
	if (!mkdtemp(tmpdir)) {
		perror("mkdtemp");
		return 1;
	}
	RUN_TEST(test_sha256);
	RUN_TEST(test_compress_parse);
	RUN_TEST(test_codec_roundtrip);
	RUN_TEST(test_codec_chunk_max);
	RUN_TEST(test_codec_zstd_params);
	RUN_TEST(test_compress_errors);
	RUN_TEST(test_decompress_garbage);
	RUN_TEST(test_decompress_trailing);
	RUN_TEST(test_buf_reserve_fresh);
	RUN_TEST(test_writer_layout);
	RUN_TEST(test_writer_errors);
	RUN_TEST(test_writer_hot);
	RUN_TEST(test_writer_hot_stage_error);
	RUN_TEST(test_compress_hot);
	RUN_TEST(test_writer_write_errors);
	RUN_TEST(test_writer_abort_in_flight);
	RUN_TEST(test_empty_blob);
	RUN_TEST(test_read_info);
	RUN_TEST(test_verify_ok);
	RUN_TEST(test_verify_big_chunks);
	RUN_TEST(test_verify_corrupt_chunk);
	RUN_TEST(test_verify_whole_blob_errors);
	RUN_TEST(test_chunk_decode);
	RUN_TEST(test_footer_corrupt);
	RUN_TEST(test_table_corrupt);
	RUN_TEST(test_batch_composition);
	RUN_TEST(test_batch_decode);
	RUN_TEST(test_frame_corrupt);
	RUN_TEST(test_writer_determinism);
	RUN_TEST(test_index);
	remove_tmpdir();
	TEST_MAIN_END();
}
