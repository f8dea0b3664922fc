// SPDX-License-Identifier: MIT
/*
 * Packing file data into EROFS compressed extents. Each extent is a fixed
 * run of whole 4 KiB lclusters (the last one ends with the file), so every
 * extent starts at cluster offset 0 and two heads never share an
 * lcluster; it compresses into a pcluster of as many blocks as its
 * output needs (big pclusters), right-aligned after zero padding
 * (ZERO_PADDING: the kernel skips the leading zeros; neither an LZ4 stream
 * nor a zstd frame starts with a zero byte). An extent that would not
 * save a block is stored plain, one lcluster per block. So the output is
 * never longer than the input in blocks, and a caller may pack a buffer
 * over the file's own blocks: an extent is compressed into scratch
 * memory before any of its blocks is written.
 */
#include <lz4.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "../pkg-base/base.h"
#include "meta.h"

#define BLK META_BLOCK_SIZE

/* @len bytes of @in into @out (room for @cap): bytes written, or 0. */
static size_t compress_one(enum meta_zalgorithm algorithm, int level,
			   const uint8_t *in, size_t len, uint8_t *out,
			   size_t cap, ZSTD_CCtx *zc)
{
	if (algorithm == META_Z_LZ4) {
		int z = LZ4_compress_fast((const char *)in, (char *)out, (int)len,
					  (int)cap, 1);

		return z > 0 ? (size_t)z : 0;
	}
	size_t z = ZSTD_compressCCtx(zc, out, cap, in, len,
				     level ? level : ZSTD_CLEVEL_DEFAULT);

	return ZSTD_isError(z) ? 0 : z;
}

int meta_zpack(enum meta_zalgorithm algorithm, int level, uint32_t extent,
	       const uint8_t *in, size_t len, uint32_t lcn, uint32_t blkaddr,
	       uint8_t *out, struct meta_zextent *ext, uint32_t *nr_ext,
	       uint32_t *nr_blocks)
{
	size_t cap = extent; /* more would not save a block */
	uint8_t *buf = malloc(cap);
	ZSTD_CCtx *zc = algorithm == META_Z_ZSTD ? ZSTD_createCCtx() : NULL;
	size_t pos = 0;
	uint32_t n = 0, blk = 0;

	if (!buf || (algorithm == META_Z_ZSTD && !zc) || extent % BLK ||
	    !extent || extent > META_ZPACK_EXTENT_MAX) {
		free(buf);
		ZSTD_freeCCtx(zc);
		return buf ? -EINVAL : -ENOMEM;
	}
	while (pos < len) {
		size_t take = MIN(len - pos, (size_t)extent);
		size_t lcls = DIV_ROUND_UP(take, BLK);
		size_t z = lcls > 1 ? compress_one(algorithm, level, in + pos, take,
						   buf, cap, zc) : 0;
		size_t blocks = DIV_ROUND_UP(z, BLK);

		if (z && blocks < lcls) {
			uint8_t *p = out + (size_t)blk * BLK;

			ext[n++] = (struct meta_zextent){ lcn + (uint32_t)(pos / BLK),
							  blkaddr + blk,
							  (uint16_t)blocks, false };
			memset(p, 0, blocks * BLK - z);
			memcpy(p + blocks * BLK - z, buf, z);
			blk += (uint32_t)blocks;
		} else {
			for (size_t k = 0; k < lcls; k++) {
				size_t part = MIN(take - k * BLK, (size_t)BLK);
				uint8_t *p = out + (size_t)blk * BLK;

				ext[n++] = (struct meta_zextent){
					lcn + (uint32_t)(pos / BLK + k), blkaddr + blk, 1, true };
				memmove(p, in + pos + k * BLK, part);
				memset(p + part, 0, BLK - part);
				blk++;
			}
		}
		pos += take;
	}
	*nr_ext = n;
	*nr_blocks = blk;
	free(buf);
	ZSTD_freeCCtx(zc);
	return 0;
}
