// SPDX-License-Identifier: MIT
/*
 * Laying out file data as EROFS compressed extents. Each extent is a
 * fixed run of whole 4 KiB lclusters (the last one ends with the file),
 * so every extent starts at cluster offset 0 and two heads never share an
 * lcluster; its compressed form goes into a pcluster of as many blocks as
 * it needs (big pclusters), right-aligned after zero padding
 * (ZERO_PADDING: the kernel skips the leading zeros). An extent whose
 * compressed form would not save a block, or starts with a zero byte
 * (the kernel would take it for padding), is stored plain, one lcluster
 * per block. So the output is never longer than the input in blocks. The
 * caller compresses (any codec the kernel decodes): this file only places.
 */
#include <string.h>

#include "../pkg-base/base.h"
#include "meta.h"

#define BLK META_BLOCK_SIZE

uint32_t meta_zextent_put(const uint8_t *raw, size_t len, const uint8_t *zdata,
			  size_t z, uint32_t lcn, uint32_t blkaddr,
			  uint8_t *out, struct meta_zextent *ext,
			  uint32_t *nr_ext)
{
	size_t lcls = DIV_ROUND_UP(len, BLK);
	size_t blocks = DIV_ROUND_UP(z, BLK);

	/* A compressed extent needs a second lcluster for its CBLKCNT. */
	if (lcls > 1 && z && blocks < lcls && zdata[0]) {
		ext[0] = (struct meta_zextent){ lcn, blkaddr, (uint16_t)blocks,
						false };
		memset(out, 0, blocks * BLK - z);
		memcpy(out + blocks * BLK - z, zdata, z);
		*nr_ext = 1;
		return (uint32_t)blocks;
	}
	for (size_t k = 0; k < lcls; k++) {
		size_t part = MIN(len - k * BLK, (size_t)BLK);

		ext[k] = (struct meta_zextent){ lcn + (uint32_t)k,
						blkaddr + (uint32_t)k, 1, true };
		memmove(out + k * BLK, raw + k * BLK, part);
		memset(out + k * BLK + part, 0, BLK - part);
	}
	*nr_ext = (uint32_t)lcls;
	return (uint32_t)lcls;
}
