// SPDX-License-Identifier: MIT
/*
 * Native-layer pieces of pkg-meta: extents laid out by meta_zextent_put
 * (LZ4 or zstd, compressed here) decode back to the input, apart or
 * packed in place, and a standalone image with
 * embedded plain and compressed files reads back through the reader,
 * which refuses a compression map that does not start with a head; files
 * stored whole as fragments of a packed inode are placed inside it, and
 * the reader refuses fragments outside it.
 */
#include "../test.h"

#include <fcntl.h>
#include <lz4.h>
#include <stdint.h>
#include <unistd.h>
#include <zstd.h>

#include "../../pkg-base/base.h"
#include "../../pkg-meta/erofs_fs.h"
#include "../../pkg-meta/internal.h"
#include "../../pkg-meta/meta.h"

#define BLK META_BLOCK_SIZE

static uint64_t rng = 88172645463325252ull;

static uint8_t next_byte(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint8_t)rng;
}

/*
 * What a converter does: each @extent-byte piece compressed (nothing for a
 * one-lcluster piece) and laid out from block @blkaddr into @out.
 */
static int zpack(enum meta_zalgorithm alg, uint32_t extent, const uint8_t *in,
		 size_t len, uint32_t blkaddr, uint8_t *out,
		 struct meta_zextent *ext, uint32_t *nr_ext, uint32_t *nr_blocks)
{
	uint8_t *z = malloc(extent);
	uint32_t n = 0, blk = 0;

	for (size_t pos = 0; z && pos < len; pos += extent) {
		size_t take = len - pos < extent ? len - pos : extent, zlen = 0;
		uint32_t got;

		if (take > BLK && alg == META_Z_LZ4) {
			int r = LZ4_compress_default((const char *)in + pos, (char *)z,
						     (int)take, (int)extent);
			zlen = r > 0 ? (size_t)r : 0;
		} else if (take > BLK) {
			zlen = ZSTD_compress(z, extent, in + pos, take, 3);
			zlen = ZSTD_isError(zlen) ? 0 : zlen;
		}
		blk += meta_zextent_put(in + pos, take, z, zlen,
					(uint32_t)(pos / BLK), blkaddr + blk,
					out + (size_t)blk * BLK, ext + n, &got);
		n += got;
	}
	*nr_ext = n;
	*nr_blocks = blk;
	free(z);
	return z ? 0 : -ENOMEM;
}

/* Decode @nr extents of @out back over @len bytes and compare with @want. */
static int unpack_cmp(enum meta_zalgorithm alg, const uint8_t *out,
		      const struct meta_zextent *ext, uint32_t nr,
		      const uint8_t *want, size_t len)
{
	uint8_t *got = malloc(len + BLK);
	uint32_t blk = 100;
	int bad = 0;

	for (uint32_t k = 0; k < nr && !bad; k++) {
		size_t start = (size_t)ext[k].lcn * BLK;
		size_t end = k + 1 < nr ? (size_t)ext[k + 1].lcn * BLK : len;
		size_t psize = (size_t)ext[k].blocks * BLK, skip = 0;
		const uint8_t *b = out + (size_t)(ext[k].blkaddr - 100) * BLK;

		/* Consecutive pclusters, each smaller than its input. */
		if (ext[k].blkaddr != blk || end <= start || !ext[k].blocks ||
		    psize >= ROUND_UP(end - start, BLK) + (ext[k].plain ? BLK : 0)) {
			bad = 1;
			break;
		}
		blk += ext[k].blocks;
		if (ext[k].plain) {
			bad = end - start > BLK || (memcpy(got + start, b, end - start), 0);
			continue;
		}
		while (skip < BLK && !b[skip])
			skip++;
		if (alg == META_Z_LZ4)
			bad = LZ4_decompress_safe((const char *)b + skip,
						  (char *)got + start, (int)(psize - skip),
						  (int)(end - start)) != (int)(end - start);
		else
			bad = ZSTD_decompress(got + start, end - start, b + skip,
					      psize - skip) != end - start;
	}
	if (!bad)
		bad = memcmp(got, want, len) != 0;
	free(got);
	return bad;
}

static void check_pack_with(enum meta_zalgorithm alg, uint32_t extent,
			    const uint8_t *in, size_t len, bool expect_smaller)
{
	size_t nblk = (len + BLK - 1) / BLK;
	struct meta_zextent *ext = calloc(nblk, sizeof(*ext)), *ext2 = calloc(nblk, sizeof(*ext2));
	uint8_t *out = malloc(nblk * BLK), *inplace = malloc(nblk * BLK);
	uint32_t nr = 0, nr2 = 0, blocks = 0, blocks2 = 0;

	CHECK(!zpack(alg, extent, in, len, 100, out, ext, &nr, &blocks));
	CHECK(nr >= 1 && nr <= nblk && blocks <= nblk);
	CHECK(!expect_smaller || blocks < nblk);
	CHECK(ext[0].lcn == 0);
	for (uint32_t k = 1; k < nr; k++)
		CHECK(ext[k].lcn > ext[k - 1].lcn);
	CHECK(!unpack_cmp(alg, out, ext, nr, in, len));
	/* Packed over its own input: the same blocks. */
	memcpy(inplace, in, len);
	CHECK(!zpack(alg, extent, inplace, len, 100, inplace, ext2, &nr2,
		     &blocks2));
	CHECK_EQ(nr2, nr);
	CHECK_EQ(blocks2, blocks);
	CHECK(!memcmp(inplace, out, (size_t)blocks * BLK));
	CHECK(!memcmp(ext, ext2, nr * sizeof(*ext)));
	free(ext);
	free(ext2);
	free(out);
	free(inplace);
}

static void check_pack(const uint8_t *in, size_t len, bool expect_smaller)
{
	check_pack_with(META_Z_LZ4, 128 << 10, in, len, expect_smaller);
	check_pack_with(META_Z_LZ4, BLK * 2, in, len, expect_smaller);
	check_pack_with(META_Z_ZSTD, 1 << 20, in, len, expect_smaller);
}

static void test_zpack_roundtrip(void)
{
	size_t len = 300 * 1024 + 123;
	uint8_t *buf = malloc(1u << 20);

	for (size_t i = 0; i < len; i++) /* text-like */
		buf[i] = (uint8_t)("line of a compressible text\n"[i % 28] + (i / 4096 % 3));
	check_pack(buf, len, true);
	for (size_t i = 0; i < len; i++) /* incompressible: all plain */
		buf[i] = next_byte();
	check_pack(buf, len, false);
	for (size_t i = 0; i < len; i++) /* halves of both */
		buf[i] = i % 16384 < 8192 ? next_byte() : (uint8_t)(i % 7);
	check_pack(buf, len, true);
	/* Compressed bytes starting with a zero would read as padding. */
	{
		uint8_t z[16] = { 0, 1, 2 }, out[2 * BLK];
		struct meta_zextent e[2];
		uint32_t n = 0;

		CHECK_EQ(meta_zextent_put(buf, 2 * BLK, z, sizeof(z), 0, 7, out, e, &n), 2);
		CHECK(n == 2 && e[0].plain && e[1].plain && e[1].blkaddr == 8);
		CHECK(!memcmp(out, buf, sizeof(out)));
		z[0] = 0x28;
		CHECK_EQ(meta_zextent_put(buf, 2 * BLK, z, sizeof(z), 0, 7, out, e, &n), 1);
		CHECK(n == 1 && !e[0].plain && e[0].blocks == 1);
		CHECK(!memcmp(out + BLK - sizeof(z), z, sizeof(z)));
	}
	memset(buf, 0, 1u << 20); /* one MiB of zeros: few extents */
	check_pack(buf, 1u << 20, true);
	check_pack(buf, 100, false); /* a tail alone */
	free(buf);
}

/* The superblock checksum covers the rest of block 0 (inodes included). */
static void fix_sb_checksum(int fd)
{
	uint8_t b[BLK];

	CHECK(pread(fd, b, BLK, 0) == BLK);
	put_le32(b + 1024 + EROFS_SB_CHECKSUM, 0);
	put_le32(b + 1024 + EROFS_SB_CHECKSUM, erofs_crc32c(~0u, b + 1024, BLK - 1024));
	CHECK(pwrite(fd, b, BLK, 0) == BLK);
}

/* Patch 8 bytes of @fd at @pos and fix the superblock checksum. */
static void patch_le64(int fd, uint64_t pos, uint64_t v)
{
	uint8_t b[8];

	put_le64(b, v);
	CHECK(pwrite(fd, b, 8, (off_t)pos) == 8);
	fix_sb_checksum(fd);
}

/* Byte offset of @path's map header in the image at @img_path. */
static uint64_t zmap_pos(const char *img_path, const char *path, uint64_t *nid)
{
	struct meta_image *img = NULL;
	struct meta_stat st = { 0 };

	CHECK(!meta_image_open(img_path, &img));
	if (!img)
		return 0;
	CHECK(!meta_resolve(img, path, nid));
	CHECK(!meta_getattr(img, *nid, &st));
	meta_image_close(img);
	return (*nid * 32 + (st.extended ? 64 : 32) + 7) / 8 * 8;
}

static void test_standalone_compressed(void)
{
	char path[] = "/tmp/ferry-test-zpack.XXXXXX";
	char dpath[] = "/tmp/ferry-test-zdata.XXXXXX";
	struct meta_tree *t = NULL;
	struct meta_inode *plain, *z;
	struct meta_image *img = NULL;
	size_t len = 64 * 1024;
	uint8_t *data = malloc(len), *out = malloc(len);
	struct meta_zextent *ext = calloc(len / BLK, sizeof(*ext));
	uint32_t nr = 0, blocks = 0;
	int fd = mkstemp(path), dfd = mkstemp(dpath);
	struct meta_stat st;
	uint64_t nid;

	for (size_t i = 0; i < len; i++)
		data[i] = (uint8_t)(i % 61);
	/* Block 0 of the data: the plain file; then the pclusters. */
	CHECK(pwrite(dfd, "plain\n", 6, 0) == 6);
	CHECK(!zpack(META_Z_ZSTD, 4 * BLK, data, len, 1, out, ext, &nr, &blocks));
	CHECK(nr > 1 && blocks < len / BLK);
	CHECK(pwrite(dfd, out, (size_t)blocks * BLK, BLK) == (ssize_t)(blocks * BLK));
	CHECK(!meta_tree_new(&t));
	CHECK(!meta_inode_new(t, S_IFREG | 0644, &plain));
	plain->size = 6;
	plain->embedded = true;
	CHECK(!meta_dir_link(t, t->root, "plain", 5, plain));
	CHECK(!meta_inode_new(t, S_IFREG | 0644, &z));
	z->size = len;
	z->embedded = true;
	z->zextents = ext;
	z->nr_zextents = nr;
	z->zalgorithm = META_Z_ZSTD;
	CHECK(!meta_dir_link(t, t->root, "z", 1, z));
	struct meta_embedded emb = { dfd, 1 + blocks };
	struct meta_write_opts wo = { .standalone = true, .embedded = &emb };
	CHECK(!meta_write(t, &wo, fd, NULL));
	CHECK(!meta_image_open(path, &img));
	CHECK(!meta_resolve(img, "/z", &nid));
	CHECK(!meta_getattr(img, nid, &st));
	CHECK_EQ(st.layout, EROFS_INODE_COMPRESSED_FULL);
	CHECK_EQ(st.size, len);
	CHECK(meta_read(img, nid, 0, out, 16) == -EINVAL); /* the kernel's to decode */
	CHECK(!meta_resolve(img, "/plain", &nid));
	CHECK(meta_read(img, nid, 0, out, 16) == 6 && !memcmp(out, "plain\n", 6));
	meta_image_close(img);
	img = NULL;

	/* A file's algorithm must be one the superblock declares (zstd). */
	{
		uint64_t zi, pos = zmap_pos(path, "/z", &zi);
		uint8_t alg = Z_EROFS_COMPRESSION_LZMA;

		CHECK(pwrite(fd, &alg, 1, (off_t)pos + Z_EROFS_MAP_H_ALGORITHMTYPE) == 1);
		fix_sb_checksum(fd);
		CHECK(!meta_image_open(path, &img));
		if (img)
			CHECK(meta_getattr(img, zi, &st) == -EFSCORRUPTED);
		meta_image_close(img);
		img = NULL;
		alg = Z_EROFS_COMPRESSION_ZSTD;
		CHECK(pwrite(fd, &alg, 1, (off_t)pos + Z_EROFS_MAP_H_ALGORITHMTYPE) == 1);
		fix_sb_checksum(fd);
	}
	/* lcluster 0 as NONHEAD: no head to start from. */
	{
		struct meta_super sb;
		uint64_t zi, pos;
		uint8_t two[2] = { Z_EROFS_LCLUSTER_TYPE_NONHEAD, 0 };

		CHECK(!meta_image_open(path, &img));
		CHECK(!meta_resolve(img, "/z", &zi));
		meta_get_super(img, &sb);
		CHECK(!meta_getattr(img, zi, &st));
		meta_image_close(img);
		img = NULL;
		pos = zi * 32 + (st.extended ? 64 : 32);
		pos = (pos + 7) / 8 * 8 + 16;
		CHECK(pwrite(fd, two, 2, (off_t)pos) == 2);
		fix_sb_checksum(fd);
		CHECK(!meta_image_open(path, &img));
		if (img)
			CHECK(meta_getattr(img, zi, &st) == -EFSCORRUPTED);
		meta_image_close(img);
	}
	meta_tree_free(t);
	close(fd);
	close(dfd);
	unlink(path);
	unlink(dpath);
	free(data);
	free(out);
}

static int walk_count(void *ctx, const char *path, const struct meta_stat *st)
{
	(void)path;
	(void)st;
	++*(int *)ctx;
	return 0;
}

/*
 * A lazily fetched layer is walked from its head: the metadata in the
 * first bytes, data blocks only checked against the image's size and
 * never read (plain data beyond the head is refused, not zeros).
 */
static void test_open_head(void)
{
	char path[] = "/tmp/ferry-test-head.XXXXXX";
	char dpath[] = "/tmp/ferry-test-hdata.XXXXXX";
	struct meta_tree *t = NULL;
	struct meta_inode *plain;
	struct meta_image *img = NULL;
	struct meta_write_stats ws;
	int fd = mkstemp(path), dfd = mkstemp(dpath), n = 0;
	uint8_t *buf = malloc(1 << 20), out[16];
	uint64_t nid, head;
	ssize_t size;

	CHECK(pwrite(dfd, "plain\n", 6, 0) == 6);
	CHECK(!meta_tree_new(&t));
	CHECK(!meta_inode_new(t, S_IFREG | 0644, &plain));
	plain->size = 6;
	plain->embedded = true;
	CHECK(!meta_dir_link(t, t->root, "plain", 5, plain));
	struct meta_embedded emb = { dfd, 1 };
	struct meta_write_opts wo = { .standalone = true, .embedded = &emb };
	CHECK(!meta_write(t, &wo, fd, &ws));
	size = pread(fd, buf, 1 << 20, 0);
	head = (uint64_t)ws.embedded_blkaddr * BLK;
	CHECK(size > 0 && head > 0 && head < (uint64_t)size);
	CHECK(!meta_image_open_head(buf, head, (uint64_t)size, &img));
	if (img) {
		CHECK(!meta_walk(img, walk_count, &n));
		CHECK(n >= 2);
		CHECK(!meta_resolve(img, "/plain", &nid));
		CHECK(meta_read(img, nid, 0, out, sizeof(out)) == -EFSCORRUPTED);
	}
	meta_image_close(img);
	img = NULL;
	/* The whole image: the same file reads. */
	CHECK(!meta_image_open_head(buf, (size_t)size, (uint64_t)size, &img));
	if (img) {
		CHECK(!meta_resolve(img, "/plain", &nid));
		CHECK(meta_read(img, nid, 0, out, sizeof(out)) == 6);
	}
	meta_image_close(img);
	img = NULL;
	/* An image size below what the superblock counts is refused. */
	CHECK(meta_image_open_head(buf, head, head, &img) == -EFSCORRUPTED);
	meta_tree_free(t);
	close(fd);
	close(dfd);
	unlink(path);
	unlink(dpath);
	free(buf);
}

static void test_fragments(void)
{
	char path[] = "/tmp/ferry-test-zfrag.XXXXXX";
	char dpath[] = "/tmp/ferry-test-zfdata.XXXXXX";
	struct meta_tree *t = NULL;
	struct meta_inode *a, *b, *packed;
	struct meta_image *img = NULL;
	struct meta_write_stats ws;
	struct meta_super sb;
	struct meta_stat st;
	uint8_t raw[3 * BLK];
	int fd = mkstemp(path), dfd = mkstemp(dpath);
	uint64_t nid, pos;

	/* The packed inode: 3 blocks of raw data holding "a" and "b". */
	for (size_t i = 0; i < sizeof(raw); i++)
		raw[i] = (uint8_t)(i * 7);
	CHECK(pwrite(dfd, raw, sizeof(raw), 0) == (ssize_t)sizeof(raw));
	CHECK(!meta_tree_new(&t));
	CHECK(!meta_inode_new(t, S_IFREG | 0644, &a));
	a->size = 5000;
	a->fragment = true;
	a->fragment_off = 100;
	CHECK(!meta_dir_link(t, t->root, "a", 1, a));
	CHECK(!meta_inode_new(t, S_IFREG | 0600, &b));
	b->size = 3;
	b->fragment = true;
	b->fragment_off = sizeof(raw) - 3;
	CHECK(!meta_dir_link(t, t->root, "b", 1, b));
	CHECK(!meta_inode_new(t, S_IFREG | 0600, &packed));
	packed->size = sizeof(raw);
	packed->embedded = true;
	struct meta_embedded emb = { dfd, 3 };
	struct meta_write_opts wo = { .standalone = true, .embedded = &emb };

	/* A fragment needs a packed inode that holds it... */
	CHECK(meta_write(t, &wo, fd, NULL) == -EINVAL);
	wo.packed = packed;
	b->fragment_off = sizeof(raw) - 2;
	CHECK(meta_write(t, &wo, fd, NULL) == -EINVAL);
	b->fragment_off = sizeof(raw) - 3;
	/* ...and is not in the tree itself. */
	CHECK(!meta_dir_link(t, t->root, "p", 1, packed));
	CHECK(meta_write(t, &wo, fd, NULL) == -EINVAL);
	CHECK(!meta_dir_unlink(t, t->root, "p", 1));
	CHECK(!meta_write(t, &wo, fd, &ws));
	CHECK(!meta_image_open(path, &img));
	if (img) {
		meta_get_super(img, &sb);
		CHECK(sb.feature_incompat & EROFS_FEATURE_INCOMPAT_FRAGMENTS);
		CHECK_EQ(sb.inos, 4); /* root, a, b, the packed inode */
		CHECK(!meta_resolve(img, "/a", &nid));
		CHECK(!meta_getattr(img, nid, &st));
		CHECK_EQ(st.layout, EROFS_INODE_COMPRESSED_FULL);
		CHECK_EQ(st.size, 5000);
		CHECK(meta_read(img, nid, 0, raw, 16) == -EINVAL);
		meta_image_close(img);
		img = NULL;
	}
	/* The header names the fragment: bit 63 and its offset. */
	pos = zmap_pos(path, "/a", &nid);
	{
		uint8_t h[8];

		CHECK(pread(fd, h, 8, (off_t)pos) == 8);
		CHECK_EQ(get_le64(h), 100 | 1ull << 63);
	}
	/* An offset past the packed inode's end is refused. */
	patch_le64(fd, pos, (sizeof(raw) - 4999) | 1ull << 63);
	CHECK(!meta_image_open(path, &img));
	if (img)
		CHECK(meta_getattr(img, nid, &st) == -EFSCORRUPTED);
	meta_image_close(img);
	img = NULL;
	patch_le64(fd, pos, UINT64_MAX);
	CHECK(!meta_image_open(path, &img));
	if (img)
		CHECK(meta_getattr(img, nid, &st) == -EFSCORRUPTED);
	meta_image_close(img);
	img = NULL;
	/* packed_nid naming the root (a directory) is refused at open. */
	{
		uint8_t root[2];

		CHECK(pread(fd, root, 2, 1024 + EROFS_SB_ROOT_NID) == 2);
		patch_le64(fd, 1024 + EROFS_SB_PACKED_NID, get_le16(root));
		CHECK(meta_image_open(path, &img) == -EFSCORRUPTED);
		CHECK(!img);
	}
	meta_tree_free(t);
	close(fd);
	close(dfd);
	unlink(path);
	unlink(dpath);
}

int main(void)
{
	RUN_TEST(test_zpack_roundtrip);
	RUN_TEST(test_standalone_compressed);
	RUN_TEST(test_open_head);
	RUN_TEST(test_fragments);
	TEST_MAIN_END();
}
