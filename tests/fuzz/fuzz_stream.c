// SPDX-License-Identifier: MIT
/*
 * libFuzzer target for stream blobs (FORMAT.md 2.8, 3.5): a blob index
 * with stream blobs and the resume points section after it, as a
 * bootstrap's extension payload carries them, then bytes that stand for
 * the layers. Input: u32 length of the payload, the payload, the layer
 * bytes. What decodes must re-encode to the same bytes, and every frame
 * of a small stream blob is decoded from its point (errors are fine,
 * crashes and reads outside the buffers are not).
 */
#include "../../pkg-base/base.h"
#include "../../pkg-blob/blob.h"

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define LAYER_MAX (4u << 20)
#define FRAME_MAX (1u << 20)

static void decode_frames(const struct blob_info *info, const struct blob_stream *s,
			  const uint8_t *bytes, size_t len)
{
	static uint8_t layer[LAYER_MAX], out[FRAME_MAX];
	struct blob_stream_reader *r;
	uint32_t i;

	if (info->size > LAYER_MAX || blob_stream_reader_new(&r))
		return;
	memset(layer, 0, (size_t)info->size);
	memcpy(layer, bytes, MIN(len, (size_t)info->size));
	for (i = 0; i < info->nr_chunks; i++) {
		const struct blob_chunk *c = &info->chunks[i];

		if (c->frame_off || c->frame_usize > FRAME_MAX ||
		    c->frame_skip > FRAME_MAX)
			continue;
		if (c->coff + c->csize > info->size)
			abort();
		blob_stream_reader_reset(r);
		blob_stream_frame_decode(r, s, c, layer + c->coff, c->coff, c->csize, out);
		/* Also as part of a run from the layer's start. */
		blob_stream_frame_decode(r, s, c, layer, 0, (size_t)info->size, out);
	}
	blob_stream_reader_free(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct blob_index idx;
	struct blob_streams ss;
	size_t len, used, sused;
	void *buf;
	uint32_t i;

	if (size < 4)
		return 0;
	len = get_le32(data);
	if (len > size - 4)
		return 0;
	data += 4;
	size -= 4;
	if (blob_index_decode_prefix(data, len, &idx, &used))
		return 0;
	if (blob_streams_decode(data + used, len - used, &idx, &ss, &sused)) {
		blob_index_free(&idx);
		return 0;
	}
	if (blob_index_encode(idx.blobs, idx.nr_blobs, &buf, &len) || len != used ||
	    memcmp(buf, data, used))
		abort();
	free(buf);
	if (blob_streams_encode(ss.streams, ss.nr, &buf, &len) || len != sused ||
	    memcmp(buf, data + used, sused))
		abort();
	free(buf);
	for (i = 0; i < ss.nr; i++)
		decode_frames(&idx.blobs[ss.streams[i].blob], &ss.streams[i],
			      data + used + sused, size - used - sused);
	blob_streams_free(&ss);
	blob_index_free(&idx);
	return 0;
}
