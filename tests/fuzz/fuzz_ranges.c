// SPDX-License-Identifier: MIT
/*
 * libFuzzer target for a native layer's range table (image.h,
 * FORMAT.md 1d), which a registry serves and the manifest's annotation
 * only names by digest: the input is the table, its offset in the layer
 * the image size its header claims (so most inputs reach the checks
 * behind it). An accepted table must describe the image exactly: ranges
 * in order, back to back, each within the range size, the last one
 * ending at the image's end, the metadata inside the image.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../pkg-base/base.h"
#include "../../pkg-blob/blob.h"
#include "../../pkg-image/image.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const uint8_t digest[32];
	struct blob_info b = { 0 };
	uint64_t meta = 0, offset = size >= 24 ? get_le64(data + 16) : 0, end = 0;
	int ret;

	ferry_log_level = -1;
	ret = image_layer_ranges_decode(data, size, offset, digest, &b, &meta);
	if (ret) {
		if (ret != -EFSCORRUPTED && ret != -ENOMEM)
			abort();
		return 0;
	}
	if (!b.nr_chunks || b.uncompressed_size != offset || !meta || meta > offset)
		abort();
	for (uint32_t i = 0; i < b.nr_chunks; i++) {
		const struct blob_chunk *c = &b.chunks[i];

		if (c->uoff != end || c->coff != c->uoff || !c->usize ||
		    c->usize != c->csize || c->usize > get_le32(data + 8) ||
		    c->codec != BLOB_CODEC_NONE ||
		    memcmp(c->sha256, data + LAYER_RANGES_HEADER + (size_t)i * 32, 32))
			abort();
		end += c->usize;
	}
	if (end != offset)
		abort();
	blob_info_free_chunks(&b);
	return 0;
}
