// SPDX-License-Identifier: MIT
/*
 * Tests for native layers' range tables (image.h, FORMAT.md 1d): what the
 * converter encodes decodes into a chunk table the chunk cache accepts
 * (one uncompressed chunk per range, the last one short), and every
 * malformed table is refused: magic, range size, image size against the
 * table's offset, range count, table length, metadata size.
 */
#include "../test.h"

#include <stdint.h>

#include "../../pkg-base/base.h"
#include "../../pkg-blob/blob.h"
#include "../../pkg-image/image.h"

#define IMAGE_BYTES (3 * LAYER_RANGE_SIZE + 8192) /* four ranges, one short */
#define META_BYTES 8192

static const uint8_t digest[32] = { 0xab, 0xcd };

static uint8_t *encode(size_t *len)
{
	uint8_t sha[4][32], *buf = NULL;

	for (int i = 0; i < 4; i++)
		memset(sha[i], 0x10 + i, 32);
	CHECK(!image_layer_ranges_encode(IMAGE_BYTES, META_BYTES,
					 (const uint8_t (*)[32])sha, &buf, len));
	return buf;
}

static int decode(const uint8_t *buf, size_t len, uint64_t offset)
{
	struct blob_info b = { 0 };
	uint64_t meta = 0;
	int ret = image_layer_ranges_decode(buf, len, offset, digest, &b, &meta);

	blob_info_free_chunks(&b);
	return ret;
}

static void test_roundtrip(void)
{
	struct blob_info b = { 0 };
	uint64_t meta = 0;
	size_t len;
	uint8_t *buf = encode(&len);

	CHECK_EQ(len, LAYER_RANGES_HEADER + 4 * 32);
	CHECK(!memcmp(buf, LAYER_RANGES_MAGIC, 8));
	CHECK(!image_layer_ranges_decode(buf, len, IMAGE_BYTES, digest, &b, &meta));
	CHECK_EQ(meta, META_BYTES);
	CHECK(!memcmp(b.digest, digest, 32));
	CHECK_EQ(b.uncompressed_size, IMAGE_BYTES);
	CHECK_EQ(b.table_offset, IMAGE_BYTES);
	CHECK_EQ(b.nr_chunks, 4);
	/* The size the chunk cache's blob-index records want. */
	CHECK_EQ(b.size, IMAGE_BYTES + 4 * BLOB_CHUNK_ENTRY_SIZE + BLOB_FOOTER_SIZE);
	for (uint32_t i = 0; b.chunks && i < b.nr_chunks; i++) {
		const struct blob_chunk *c = &b.chunks[i];

		CHECK_EQ(c->uoff, (uint64_t)i * LAYER_RANGE_SIZE);
		CHECK_EQ(c->coff, c->uoff);
		CHECK_EQ(c->usize, i < 3 ? LAYER_RANGE_SIZE : 8192);
		CHECK_EQ(c->csize, c->usize);
		CHECK_EQ(c->frame_usize, c->usize);
		CHECK_EQ(c->frame_off, 0);
		CHECK_EQ(c->codec, BLOB_CODEC_NONE);
		CHECK_EQ(c->sha256[0], 0x10 + i);
	}
	/* What the cache records of it decodes back, table digest and all. */
	{
		struct blob_index idx = { 0 };
		void *rec = NULL;
		size_t rlen = 0;

		CHECK(!blob_index_encode(&b, 1, &rec, &rlen));
		CHECK(!blob_index_decode(rec, rlen, &idx));
		CHECK_EQ(idx.nr_blobs, 1);
		blob_index_free(&idx);
		free(rec);
	}
	blob_info_free_chunks(&b);
	free(buf);
}

static void test_malformed_refused(void)
{
	size_t len;
	uint8_t *buf = encode(&len), *t = malloc(len + 32);

#define MUTATE(stmt)                                                           \
	do {                                                                   \
		memcpy(t, buf, len);                                           \
		stmt;                                                          \
		CHECK_EQ(decode(t, len, IMAGE_BYTES), -EFSCORRUPTED);          \
	} while (0)
	MUTATE(t[0] ^= 1);                               /* magic */
	MUTATE(put_le32(t + 8, 3 * 4096));               /* range not a power of 2 */
	MUTATE(put_le32(t + 8, 2048));                   /* range below a block */
	MUTATE(put_le32(t + 12, 5));                     /* count */
	MUTATE(put_le32(t + 12, 0xffffffffu));           /* count, overflowing */
	MUTATE(put_le64(t + 16, IMAGE_BYTES + 4096));    /* image size != offset */
	MUTATE(put_le64(t + 24, 0));                     /* no metadata */
	MUTATE(put_le64(t + 24, IMAGE_BYTES + 4096));    /* metadata past the image */
	MUTATE(put_le64(t + 24, META_BYTES + 1));        /* not whole blocks */
#undef MUTATE
	CHECK_EQ(decode(buf, len, IMAGE_BYTES - 4096), -EFSCORRUPTED); /* offset */
	CHECK_EQ(decode(buf, len - 1, IMAGE_BYTES), -EFSCORRUPTED);    /* short */
	memcpy(t, buf, len);
	memset(t + len, 0, 32);
	CHECK_EQ(decode(t, len + 32, IMAGE_BYTES), -EFSCORRUPTED);      /* long */
	CHECK_EQ(decode(buf, 16, IMAGE_BYTES), -EFSCORRUPTED);         /* no header */
	CHECK(!decode(buf, len, IMAGE_BYTES));
	free(t);
	free(buf);
}

/* A metadata head is read into memory at mount: at most 1 GiB. */
static void test_head_bound(void)
{
	uint64_t image = FERRY_BOOTSTRAP_MAX + 8192, nr = DIV_ROUND_UP(image, LAYER_RANGE_SIZE);
	uint8_t (*sha)[32] = calloc(nr, 32), *buf = NULL;
	size_t len = 0;

	CHECK(!image_layer_ranges_encode(image, FERRY_BOOTSTRAP_MAX + 4096,
					 (const uint8_t (*)[32])sha, &buf, &len));
	CHECK_EQ(decode(buf, len, image), -EFSCORRUPTED);
	free(buf);
	CHECK(!image_layer_ranges_encode(image, FERRY_BOOTSTRAP_MAX,
					 (const uint8_t (*)[32])sha, &buf, &len));
	CHECK(!decode(buf, len, image));
	free(buf);
	free(sha);
}

int main(void)
{
	ferry_log_level = -1;
	RUN_TEST(test_roundtrip);
	RUN_TEST(test_malformed_refused);
	RUN_TEST(test_head_bound);
	TEST_MAIN_END();
}
