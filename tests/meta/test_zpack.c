// SPDX-License-Identifier: MIT
/*
 * Native-layer pieces of pkg-meta: extents laid out by meta_zextent_put
 * (LZ4 or zstd, compressed here) decode back to the input, apart or
 * packed in place, and a standalone image with
 * embedded plain and compressed files reads back through the reader,
 * which refuses a compression map that does not start with a head; files
 * stored whole as fragments of a packed inode are placed inside it, and
 * the reader refuses fragments outside it. Compact indexes of files of
 * every shape (pack boundaries, alignments, big and plain pclusters), and
 * full ones where pclusters are not back to back, read back through
 * fsck.erofs --extract and the kernel (bytes and FIEMAP extents); the
 * reader refuses each kind of corrupt compact index.
 */
#include "../test.h"

#include <fcntl.h>
#include <linux/fiemap.h>
#include <linux/fs.h>
#include <lz4.h>
#include <stdarg.h>
#include <stdint.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
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
	uint8_t icount[2] = { 0 };
	int fd = open(img_path, O_RDONLY);

	CHECK(!meta_image_open(img_path, &img));
	if (!img || fd < 0) {
		meta_image_close(img);
		if (fd >= 0)
			close(fd);
		return 0;
	}
	CHECK(!meta_resolve(img, path, nid));
	CHECK(!meta_getattr(img, *nid, &st));
	meta_image_close(img);
	CHECK(pread(fd, icount, 2, (off_t)(*nid * 32 + EROFS_I_XATTR_ICOUNT)) == 2);
	close(fd);
	return ROUND_UP(*nid * 32 + (st.extended ? 64 : 32) +
			EROFS_XATTR_IBODY_SIZE(get_le16(icount)), 8u);
}

/*
 * Compact index of lcluster @l (of @nr, from image byte @ebase): its type
 * and low bits, read and rewritten in place (superblock checksum fixed).
 */
static void zc_get(int fd, uint64_t ebase, uint64_t nr, uint64_t l,
		   uint32_t *type, uint32_t *lo)
{
	struct z_erofs_cpack pk = z_erofs_compact_pack(ebase, nr, l);
	uint32_t bit = pk.bits * (uint32_t)(l - pk.first);
	uint8_t b[4] = { 0 };
	uint32_t v;

	CHECK(pread(fd, b, 4, (off_t)(ebase + pk.off + bit / 8)) == 4);
	v = get_le32(b) >> bit % 8;
	*type = v >> Z_EROFS_COMPACT_LOBITS & 3;
	*lo = v & ((1u << Z_EROFS_COMPACT_LOBITS) - 1);
}

static void zc_set(int fd, uint64_t ebase, uint64_t nr, uint64_t l,
		   uint32_t type, uint32_t lo)
{
	struct z_erofs_cpack pk = z_erofs_compact_pack(ebase, nr, l);
	uint32_t bit = pk.bits * (uint32_t)(l - pk.first);
	uint32_t mask = ((1u << (Z_EROFS_COMPACT_LOBITS + 2)) - 1) << bit % 8;
	off_t at = (off_t)(ebase + pk.off + bit / 8);
	uint8_t b[4] = { 0 };

	CHECK(pread(fd, b, 4, at) == 4);
	put_le32(b, (get_le32(b) & ~mask) |
		    (type << Z_EROFS_COMPACT_LOBITS | lo) << bit % 8);
	CHECK(pwrite(fd, b, 4, at) == 4);
	fix_sb_checksum(fd);
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
	CHECK_EQ(st.layout, EROFS_INODE_COMPRESSED_COMPACT);
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
		uint64_t zi, pos = zmap_pos(path, "/z", &zi);

		zc_set(fd, pos + Z_EROFS_MAP_HEADER_SIZE, len / BLK, 0,
		       Z_EROFS_LCLUSTER_TYPE_NONHEAD, 2);
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

/* Whole blocks of text, and about one in four of random bytes. */
static void mixed_data(uint8_t *p, size_t len)
{
	for (size_t b = 0; b * BLK < len; b++) {
		bool random = next_byte() < 64;

		for (size_t i = b * BLK; i < len && i < (b + 1) * BLK; i++)
			p[i] = random ? next_byte() :
					(uint8_t)("compact indexes\n"[i % 16] + b % 5);
	}
}

/* A compressed file of the shapes test and what it should read back as. */
struct zfile {
	char name[32];
	uint8_t *data;
	size_t len;
	struct meta_zextent *ext;
	uint32_t nr;
	bool gap; /* a block between its last two pclusters: full indexes */
};

/*
 * Compress @f's data in extents of @extent_lcl lclusters (LZ4) into @dfd
 * from block *@blk on, leaving a block out before the last pcluster
 * with @f->gap.
 */
static void zfile_pack(struct zfile *f, uint32_t extent_lcl, int dfd,
		       uint32_t *blk)
{
	size_t nblk = DIV_ROUND_UP(f->len, BLK);
	uint8_t *out = malloc(nblk * BLK);
	uint32_t blocks = 0;

	f->ext = calloc(nblk, sizeof(*f->ext));
	CHECK(!zpack(META_Z_LZ4, extent_lcl * BLK, f->data, f->len, *blk, out,
		     f->ext, &f->nr, &blocks));
	CHECK(pwrite(dfd, out, (size_t)blocks * BLK, (off_t)*blk * BLK) ==
	      (ssize_t)blocks * BLK);
	if (f->gap && f->nr > 1) {
		struct meta_zextent *last = &f->ext[f->nr - 1];
		size_t at = (size_t)(last->blkaddr - *blk) * BLK;

		CHECK(pwrite(dfd, out + at, (size_t)last->blocks * BLK,
			     (off_t)(last->blkaddr + 1) * BLK) ==
		      (ssize_t)last->blocks * BLK);
		last->blkaddr++;
		blocks++;
	}
	*blk += blocks;
	free(out);
}

static bool erofs_mountable(void)
{
	char line[128];
	bool ok = false;
	FILE *f = geteuid() ? NULL : fopen("/proc/filesystems", "r");

	while (f && !ok && fgets(line, sizeof(line), f))
		ok = !strcmp(line, "\terofs\n");
	if (f)
		fclose(f);
	if (!ok)
		printf("# kernel mount skipped: not root or no erofs\n");
	return ok;
}

/* @f's bytes and FIEMAP extents (one per pcluster) in the kernel's view. */
static void check_kernel_file(const char *mnt, const struct zfile *f,
			      uint32_t embed_blkaddr)
{
	char p[640];
	size_t got_len = 0;
	uint8_t *got;
	struct fiemap *fm = calloc(1, sizeof(*fm) + (f->nr + 1) *
					      sizeof(struct fiemap_extent));
	int fd;

	snprintf(p, sizeof(p), "%s/%s", mnt, f->name);
	got = malloc(f->len + 1);
	fd = open(p, O_RDONLY);
	CHECK(fd >= 0);
	if (fd < 0 || !fm || !got)
		goto out;
	got_len = (size_t)read(fd, got, f->len + 1);
	CHECK(got_len == f->len && !memcmp(got, f->data, f->len));
	fm->fm_length = FIEMAP_MAX_OFFSET;
	fm->fm_extent_count = f->nr + 1;
	CHECK_EQ(ioctl(fd, FS_IOC_FIEMAP, fm), 0);
	CHECK_EQ(fm->fm_mapped_extents, f->nr);
	for (uint32_t k = 0; k < f->nr && k < fm->fm_mapped_extents; k++) {
		const struct meta_zextent *z = &f->ext[k];
		uint64_t end = k + 1 < f->nr ? (uint64_t)z[1].lcn * BLK : f->len;

		CHECK_EQ(fm->fm_extents[k].fe_logical, (uint64_t)z->lcn * BLK);
		CHECK_EQ(fm->fm_extents[k].fe_length, end - (uint64_t)z->lcn * BLK);
		CHECK_EQ(fm->fm_extents[k].fe_physical,
			 (uint64_t)(embed_blkaddr + z->blkaddr) * BLK);
	}
out:
	if (fd >= 0)
		close(fd);
	free(got);
	free(fm);
}

/*
 * Files of 1 to 5000 lclusters, ending at and inside a pack, in extents
 * of 2 to 256 lclusters (big, one-block and plain pclusters mixed), their
 * compact indexes starting at each 8-byte step of 32 (inline xattrs,
 * extended inodes); one with a gap between pclusters gets full indexes.
 * fsck.erofs --extract and the kernel read every byte back; FIEMAP shows
 * each pcluster where it was put, which takes every head's block address
 * and the deltas the kernel looks ahead with.
 */
static void test_compact_shapes(void)
{
	static const uint32_t lcls[] = { 1, 2, 15, 16, 17, 33, 41 };
	static const uint32_t extents[] = { 2, 5, 32 };
	enum { NR = 7 * 3 * 4 + 3 };
	char path[] = "/tmp/ferry-test-zshape.XXXXXX";
	char dpath[] = "/tmp/ferry-test-zsdata.XXXXXX";
	char dir[] = "/tmp/ferry-test-zsdir.XXXXXX";
	char p[600];
	struct zfile *files = calloc(NR, sizeof(*files));
	struct meta_tree *t = NULL;
	struct meta_image *img = NULL;
	struct meta_write_stats ws;
	int fd = mkstemp(path), dfd = mkstemp(dpath);
	uint32_t blk = 0, n = 0, aligns = 0, kinds = 0;

	CHECK(mkdtemp(dir) != NULL);
	CHECK(!meta_tree_new(&t));
	for (uint32_t a = 0; a < 7; a++)
		for (uint32_t e = 0; e < 3; e++)
			for (uint32_t v = 0; v < 4; v++, n++) {
				struct zfile *f = &files[n];

				snprintf(f->name, sizeof(f->name), "f%u-e%u-v%u",
					 lcls[a], extents[e], v);
				/* Odd ones end inside their last lcluster. */
				f->len = (size_t)lcls[a] * BLK - (lcls[a] % 2) * 1000;
			}
	/* Many packs: 5000 lclusters; 1 MiB extents; a gap. */
	snprintf(files[n].name, sizeof(files[n].name), "big-e5");
	files[n++].len = 5000u * BLK - 7;
	snprintf(files[n].name, sizeof(files[n].name), "big-e256");
	files[n++].len = 700u * BLK;
	snprintf(files[n].name, sizeof(files[n].name), "gap");
	files[n].gap = true;
	files[n++].len = 33u * BLK;
	for (uint32_t i = 0; i < NR; i++) {
		struct zfile *f = &files[i];
		uint32_t extent = i < NR - 3 ? extents[i / 4 % 3] :
				  i == NR - 2 ? 256 : 5;
		struct meta_inode *in;
		char value[32];

		f->data = malloc(f->len);
		mixed_data(f->data, f->len);
		zfile_pack(f, extent, dfd, &blk);
		CHECK(!meta_inode_new(t, S_IFREG | 0644, &in));
		in->size = f->len;
		in->embedded = true;
		in->zextents = f->ext;
		in->nr_zextents = f->nr;
		in->zalgorithm = META_Z_LZ4;
		/*
		 * Map header ends at 8, 0, 24 and 16 mod 32: no xattrs,
		 * inline ones of 20 and 44 bytes, an extended inode (not
		 * the epoch's mtime) with 36. Distinct values: none shared.
		 */
		if (i % 4) {
			static const uint32_t vlen[] = { 0, 3, 27, 19 };

			snprintf(value, sizeof(value), "%031u", i);
			CHECK(!meta_inode_set_xattr(in, "user.x",
						    value + 31 - vlen[i % 4],
						    vlen[i % 4]));
		}
		if (i % 4 == 3)
			in->mtime = 1000 + i;
		CHECK(!meta_dir_link(t, t->root, f->name, strlen(f->name), in));
	}
	/* Plain, one-block and big pclusters all occur. */
	for (uint32_t i = 0; i < NR; i++)
		for (uint32_t k = 0; k < files[i].nr; k++)
			kinds |= files[i].ext[k].plain ? 1 :
				 files[i].ext[k].blocks == 1 ? 2 : 4;
	CHECK_EQ(kinds, 7);
	struct meta_embedded emb = { dfd, blk };
	struct meta_write_opts wo = { .standalone = true, .embedded = &emb };
	CHECK(!meta_write(t, &wo, fd, &ws));

	CHECK(!meta_image_open(path, &img));
	for (uint32_t i = 0; img && i < NR; i++) {
		struct meta_stat st;
		uint64_t nid, pos;

		snprintf(p, sizeof(p), "/%s", files[i].name);
		CHECK(!meta_resolve(img, p, &nid));
		CHECK(!meta_getattr(img, nid, &st));
		CHECK_EQ(st.layout, files[i].gap ? EROFS_INODE_COMPRESSED_FULL :
						   EROFS_INODE_COMPRESSED_COMPACT);
		pos = zmap_pos(path, p, &nid);
		if (!files[i].gap)
			aligns |= 1u << (pos + Z_EROFS_MAP_HEADER_SIZE) % 32 / 8;
	}
	CHECK_EQ(aligns, 0xF);
	meta_image_close(img);

	CHECK_EQ(test_run("fsck.erofs --extract=%s/x %s", dir, path), 0);
	for (uint32_t i = 0; i < NR; i++) {
		size_t len = 0;
		uint8_t *got;
		int xfd;

		snprintf(p, sizeof(p), "%s/x/%s", dir, files[i].name);
		xfd = open(p, O_RDONLY);
		got = malloc(files[i].len + 1);
		if (xfd >= 0 && got)
			len = (size_t)read(xfd, got, files[i].len + 1);
		CHECK(len == files[i].len && !memcmp(got, files[i].data, len));
		if (xfd >= 0)
			close(xfd);
		free(got);
	}
	if (erofs_mountable()) {
		snprintf(p, sizeof(p), "%s/mnt", dir);
		CHECK_EQ(mkdir(p, 0755), 0);
		CHECK_EQ(meta_kernel_mount(path, NULL, 0, p, 0), 0);
		for (uint32_t i = 0; i < NR; i++)
			check_kernel_file(p, &files[i], ws.embedded_blkaddr);
		CHECK_EQ(umount2(p, 0), 0);
	}
	CHECK_EQ(test_run("rm -rf %s", dir), 0);
	for (uint32_t i = 0; i < NR; i++)
		free(files[i].data);
	free(files);
	meta_tree_free(t); /* frees the extents */
	close(fd);
	close(dfd);
	unlink(path);
	unlink(dpath);
}

/*
 * Each way a compact index can lie, in a file of 41 lclusters in extents
 * of 5 (packs of 2 to lcluster 6, of 16 to 38, of 2 after, the last one
 * padded): the reader refuses it, as the kernel would misread it.
 */
static void test_compact_corrupt(void)
{
	char path[] = "/tmp/ferry-test-zcorrupt.XXXXXX";
	char dpath[] = "/tmp/ferry-test-zcdata.XXXXXX";
	struct zfile f = { .len = 41 * BLK };
	struct meta_tree *t = NULL;
	struct meta_inode *in;
	struct meta_image *img = NULL;
	struct meta_stat st;
	int fd = mkstemp(path), dfd = mkstemp(dpath);
	uint32_t blk = 0, type, lo;
	uint64_t nid, ebase;
	uint8_t *good, *h;
	size_t size;

	f.data = malloc(f.len);
	for (size_t i = 0; i < f.len; i++)
		f.data[i] = (uint8_t)("compact\n"[i % 8]);
	zfile_pack(&f, 5, dfd, &blk);
	CHECK(!meta_tree_new(&t));
	CHECK(!meta_inode_new(t, S_IFREG | 0644, &in));
	in->size = f.len;
	in->embedded = true;
	in->zextents = f.ext;
	in->nr_zextents = f.nr;
	in->zalgorithm = META_Z_LZ4;
	CHECK(!meta_dir_link(t, t->root, "c", 1, in));
	struct meta_embedded emb = { dfd, blk };
	struct meta_write_opts wo = { .standalone = true, .embedded = &emb };
	CHECK(!meta_write(t, &wo, fd, NULL));
	ebase = zmap_pos(path, "/c", &nid) + Z_EROFS_MAP_HEADER_SIZE;
	CHECK_EQ(ebase % 32, 8);
	size = (size_t)lseek(fd, 0, SEEK_END);
	good = malloc(size);
	CHECK(pread(fd, good, size, 0) == (ssize_t)size);

	/* Extents 0-4, 5-9, ..., 35-39 compressed, 40 plain. */
	zc_get(fd, ebase, 41, 37, &type, &lo);
	CHECK(type == Z_EROFS_LCLUSTER_TYPE_NONHEAD && lo == 3); /* delta[1] */
	zc_get(fd, ebase, 41, 36, &type, &lo);
	CHECK(type == Z_EROFS_LCLUSTER_TYPE_NONHEAD &&
	      lo == (Z_EROFS_LI_D0_CBLKCNT | 1));
	zc_get(fd, ebase, 41, 40, &type, &lo);
	CHECK(type == Z_EROFS_LCLUSTER_TYPE_PLAIN && !lo);

	static const struct {
		uint32_t l, type, lo;
		const char *what;
	} bad[] = {
		{ 0, Z_EROFS_LCLUSTER_TYPE_NONHEAD, 2, "no head first" },
		{ 10, 3, 0, "HEAD2 of no algorithm" },
		{ 11, Z_EROFS_LCLUSTER_TYPE_NONHEAD, Z_EROFS_LI_D0_CBLKCNT, "CBLKCNT 0" },
		{ 11, Z_EROFS_LCLUSTER_TYPE_NONHEAD, Z_EROFS_LI_D0_CBLKCNT | 2000,
		  "a pcluster past the image" },
		{ 13, Z_EROFS_LCLUSTER_TYPE_NONHEAD, 0, "delta[0] 0" },
		{ 8, Z_EROFS_LCLUSTER_TYPE_NONHEAD, 9, "delta[0] before the file" },
		{ 14, Z_EROFS_LCLUSTER_TYPE_NONHEAD, 1, "delta[0] 1 walked back over" },
		{ 37, Z_EROFS_LCLUSTER_TYPE_NONHEAD, 0, "delta[1] 0" },
		{ 37, Z_EROFS_LCLUSTER_TYPE_NONHEAD, 5, "delta[1] past the file" },
		{ 41, Z_EROFS_LCLUSTER_TYPE_HEAD1, 0, "padding not zero" },
	};
	for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
		CHECK(pwrite(fd, good, size, 0) == (ssize_t)size);
		zc_set(fd, ebase, 41, bad[k].l, bad[k].type, bad[k].lo);
		CHECK(!meta_image_open(path, &img));
		if (img && meta_getattr(img, nid, &st) != -EFSCORRUPTED) {
			fprintf(stderr, "  accepted: %s\n", bad[k].what);
			CHECK(0);
		}
		meta_image_close(img);
		img = NULL;
	}
	/* A pack's block address past the image; advise without 2B packs. */
	h = malloc(size);
	for (int k = 0; h && k < 2; k++) {
		struct z_erofs_cpack pk = z_erofs_compact_pack(ebase, 41, 24);

		memcpy(h, good, size);
		if (k)
			h[ebase - Z_EROFS_MAP_HEADER_SIZE + Z_EROFS_MAP_H_ADVISE] &=
				(uint8_t)~Z_EROFS_ADVISE_COMPACTED_2B;
		else
			put_le32(h + ebase + pk.off + pk.size - 4, blk + 1000);
		CHECK(pwrite(fd, h, size, 0) == (ssize_t)size);
		fix_sb_checksum(fd);
		CHECK(!meta_image_open(path, &img));
		if (img)
			CHECK(meta_getattr(img, nid, &st) == -EFSCORRUPTED);
		meta_image_close(img);
		img = NULL;
	}
	/* The good image again: read as before. */
	CHECK(pwrite(fd, good, size, 0) == (ssize_t)size);
	CHECK(!meta_image_open(path, &img));
	if (img)
		CHECK(!meta_getattr(img, nid, &st));
	meta_image_close(img);
	free(h);
	free(good);
	free(f.data);
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
	RUN_TEST(test_compact_shapes);
	RUN_TEST(test_compact_corrupt);
	TEST_MAIN_END();
}
