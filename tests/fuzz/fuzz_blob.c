// SPDX-License-Identifier: MIT
/*
 * libFuzzer target for pkg-blob's parsers of untrusted bytes: the blob
 * index (from a bootstrap), a whole blob file held in memory (footer =
 * last 64 bytes, then its chunk table), and every decompressor. Anything
 * accepted must re-encode to the same bytes.
 */
#include "../../pkg-base/base.h"
#include "../../pkg-blob/blob.h"
#include "../../pkg-blob/internal.h"

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fuzz_index(const uint8_t *data, size_t size)
{
	struct blob_index idx;
	void *buf;
	size_t len;
	uint32_t i;

	if (blob_index_decode(data, size, &idx))
		return;
	for (i = 0; i < idx.nr_blobs; i++) {
		const struct blob_info *b = &idx.blobs[i];

		if (b->nr_chunks &&
		    blob_find_chunk(b, b->chunks[b->nr_chunks - 1].uoff) !=
			    &b->chunks[b->nr_chunks - 1])
			abort();
	}
	if (blob_index_encode(idx.blobs, idx.nr_blobs, &buf, &len) ||
	    len != size || memcmp(buf, data, size))
		abort();
	free(buf);
	blob_index_free(&idx);
}

static void fuzz_blob_file(const uint8_t *data, size_t size)
{
	uint8_t footer[BLOB_FOOTER_SIZE];
	struct blob_info info;
	size_t tlen;

	if (size < BLOB_FOOTER_SIZE ||
	    blob_footer_decode(data + size - BLOB_FOOTER_SIZE, size, &info))
		return;
	/* The footer check guarantees the table lies inside the file. */
	tlen = (size_t)info.nr_chunks * BLOB_CHUNK_ENTRY_SIZE;
	if (blob_table_decode(data + info.table_offset, tlen, &info))
		return;
	blob_footer_encode(&info, footer);
	if (memcmp(footer, data + size - BLOB_FOOTER_SIZE, BLOB_FOOTER_SIZE))
		abort();
	blob_info_free_chunks(&info);
}

static void fuzz_codecs(const uint8_t *data, size_t size)
{
	static uint8_t dst[65536];
	/* A small fixed size and one the input picks. */
	size_t lens[2] = { 4096, 1 };
	enum blob_codec codec;
	size_t i;

	if (size >= 2)
		lens[1] += get_le16(data + size - 2);
	for (codec = BLOB_CODEC_NONE; codec <= BLOB_CODEC_LZMA + 1; codec++)
		for (i = 0; i < ARRAY_SIZE(lens); i++)
			blob_decompress(codec, data, size, dst, lens[i]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static bool quiet;

	if (!quiet) {
		ferry_log_level = -1;
		quiet = true;
	}
	fuzz_index(data, size);
	fuzz_blob_file(data, size);
	fuzz_codecs(data, size);
	return 0;
}
