// SPDX-License-Identifier: MIT
/*
 * Packing file data into EROFS compressed extents (LZ4, fixed-size
 * output): each extent is as many whole 4 KiB lclusters as LZ4 fits into
 * one 4 KiB pcluster, so every extent starts at cluster offset 0 and two
 * heads never share an lcluster. The compressed bytes are right-aligned in
 * their block (ZERO_PADDING: the kernel skips the leading zeros; an LZ4
 * stream never starts with a zero byte). Where not even two lclusters fit,
 * one lcluster is stored plain. The output is never longer than the input
 * in blocks, so a caller may pack a buffer over the file's own blocks.
 */
#include <lz4.h>
#include <string.h>

#include "../pkg-base/base.h"
#include "meta.h"

#define BLK META_BLOCK_SIZE

void meta_zpack(const uint8_t *in, size_t len, uint32_t lcn, uint32_t blkaddr,
		uint8_t *out, struct meta_zextent *ext, uint32_t *nr_ext)
{
	char block[BLK];
	size_t pos = 0;
	uint32_t n = 0;

	while (pos < len) {
		size_t left = len - pos, take;
		int src = (int)left, z;

		z = LZ4_compress_destSize((const char *)in + pos, block, &src, BLK);
		take = (size_t)src == left ? left : ((size_t)src / BLK) * BLK;
		if (take < left && take > BLK && (size_t)src != take)
			z = LZ4_compress_default((const char *)in + pos, block,
						 (int)take, BLK);
		ext[n] = (struct meta_zextent){ lcn + (uint32_t)(pos / BLK),
						blkaddr + n, false };
		if (z <= 0 || take <= BLK) {
			/* Plain: one lcluster as it is. */
			take = MIN(left, (size_t)BLK);
			ext[n].plain = true;
			memmove(out + (size_t)n * BLK, in + pos, take);
			memset(out + (size_t)n * BLK + take, 0, BLK - take);
		} else {
			memset(out + (size_t)n * BLK, 0, BLK - (size_t)z);
			memcpy(out + (size_t)n * BLK + BLK - (size_t)z, block,
			       (size_t)z);
		}
		pos += take;
		n++;
	}
	*nr_ext = n;
}
