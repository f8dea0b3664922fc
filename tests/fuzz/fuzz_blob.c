// SPDX-License-Identifier: MIT
/*
 * libFuzzer target for pkg-blob's parsers of untrusted bytes: the blob
 * index (from a bootstrap), a whole blob file held in memory (footer =
 * last 64 bytes, then its chunk table, then its frames decoded and their
 * chunks checked), a bare chunk table, and every decompressor. Anything
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

/* Frames of a validated table lie inside the data: decode and check them. */
static void fuzz_frames(const uint8_t *data, const struct blob_info *info)
{
	static uint8_t frame[1 << 20], out[1 << 20];
	uint32_t i;
	int ret = -1;

	for (i = 0; i < info->nr_chunks; i++) {
		const struct blob_chunk *c = &info->chunks[i];

		if (c->frame_off > c->frame_usize ||
		    c->usize > c->frame_usize - c->frame_off ||
		    c->coff + c->csize > info->table_offset)
			abort();
		/* Bounded work per input: frames up to 1 MiB. */
		if (c->frame_usize > sizeof(frame))
			continue;
		if (!c->frame_off)
			ret = blob_frame_decode(c, data + c->coff, frame);
		if (!ret)
			blob_chunk_verify(c, frame + c->frame_off);
		if (!blob_chunk_decode(c, data + c->coff, out) &&
		    (ret || memcmp(out, frame + c->frame_off, c->usize)))
			abort();
	}
}

static void fuzz_blob_file(const uint8_t *data, size_t size)
{
	uint8_t footer[BLOB_FOOTER_SIZE], *table;
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
	table = malloc(tlen + 1);
	if (!table)
		abort();
	blob_table_encode(info.chunks, info.nr_chunks, table);
	if (memcmp(table, data + info.table_offset, tlen))
		abort();
	free(table);
	fuzz_frames(data, &info);
	blob_info_free_chunks(&info);
}

/*
 * A bare chunk table after 16 bytes of uncompressed_size and
 * table_offset, with its sha256 supplied here so that mutations reach the
 * entry rules rather than stop at the digest.
 */
static void fuzz_table(const uint8_t *data, size_t size)
{
	struct blob_info info = { 0 };
	uint8_t *table;
	size_t tlen;
	uint32_t i;

	if (size < 16 || (size - 16) % BLOB_CHUNK_ENTRY_SIZE)
		return;
	tlen = size - 16;
	info.uncompressed_size = get_le64(data);
	info.table_offset = get_le64(data + 8);
	info.nr_chunks = (uint32_t)(tlen / BLOB_CHUNK_ENTRY_SIZE);
	sha256_buf(data + 16, tlen, info.table_sha256);
	if (blob_table_decode(data + 16, tlen, &info))
		return;
	for (i = 0; i < info.nr_chunks; i++) {
		const struct blob_chunk *c = &info.chunks[i];

		if (c->frame_usize > BLOB_FRAME_MAX ||
		    c->frame_off + (uint64_t)c->usize > c->frame_usize ||
		    c->coff + c->csize > info.table_offset)
			abort();
	}
	table = malloc(tlen + 1);
	if (!table)
		abort();
	blob_table_encode(info.chunks, info.nr_chunks, table);
	if (memcmp(table, data + 16, tlen))
		abort();
	free(table);
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
	fuzz_table(data, size);
	fuzz_codecs(data, size);
	return 0;
}
