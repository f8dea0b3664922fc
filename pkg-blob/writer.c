// SPDX-License-Identifier: MIT
/*
 * Blob writer: appends compressed chunks to a file in one sequential
 * pass, hashing exactly the bytes written so the blob digest is known the
 * moment the footer is written (no re-read). Layout in format.c.
 */
#include "internal.h"
#include "../pkg-base/base.h"

#include <stdlib.h>

struct blob_writer {
	int fd;
	struct blob_compress c;
	struct blob_codec_ctx ctx;
	struct blob_hasher *hasher; /* of every byte written so far */
	uint8_t *scratch;           /* compressed output of one chunk */
	size_t scratch_cap;
	struct blob_chunk *chunks;
	uint32_t nr_chunks, chunks_cap;
	uint64_t uend;              /* next slot's uoff */
	uint64_t cend;              /* next chunk's coff == bytes written */
	int error;                  /* sticky: the file is in an unknown state */
};

int blob_writer_new(int fd, const struct blob_compress *c,
		    struct blob_writer **out)
{
	struct blob_writer *w;
	int ret;

	if (!blob_compress_valid(c))
		return -EINVAL;
	w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	w->fd = fd;
	w->c = *c;
	ret = blob_hasher_new(&w->hasher);
	if (ret) {
		free(w);
		return ret;
	}
	*out = w;
	return 0;
}

static int grow_chunks(struct blob_writer *w)
{
	uint32_t cap = 64;
	struct blob_chunk *p;

	if (w->chunks_cap)
		cap = w->chunks_cap > UINT32_MAX / 2 ? UINT32_MAX :
						       w->chunks_cap * 2;
	if (cap == w->chunks_cap)
		return -EOVERFLOW;
	p = realloc(w->chunks, (size_t)cap * sizeof(*p));
	if (!p)
		return -ENOMEM;
	w->chunks = p;
	w->chunks_cap = cap;
	return 0;
}

/* Room for a compressed chunk of @len bytes (always shorter than @len). */
static int grow_scratch(struct blob_writer *w, size_t len)
{
	if (w->scratch_cap >= len)
		return 0;
	free(w->scratch);
	w->scratch = malloc(len);
	w->scratch_cap = w->scratch ? len : 0;
	return w->scratch ? 0 : -ENOMEM;
}

int blob_writer_add(struct blob_writer *w, const void *data, uint32_t len,
		    const uint8_t sha256[BLOB_DIGEST_SIZE], uint64_t *uoff)
{
	uint64_t slot = ROUND_UP((uint64_t)len, BLOB_SLOT_ALIGN), uend, cend;
	struct blob_chunk *c;
	enum blob_codec codec;
	const void *bytes;
	size_t clen;
	int ret;

	if (w->error)
		return w->error;
	if (!len || len > BLOB_CHUNK_MAX)
		return -EINVAL;
	if (__builtin_add_overflow(w->uend, slot, &uend))
		return -EOVERFLOW;
	if (w->nr_chunks == w->chunks_cap) {
		ret = grow_chunks(w);
		if (ret)
			return ret;
	}
	ret = grow_scratch(w, blob_compress_bound(len));
	if (ret)
		return ret;
	ret = blob_codec_compress(&w->ctx, &w->c, data, len, w->scratch, &clen,
				  &codec);
	if (ret)
		return ret;
	if (codec == BLOB_CODEC_NONE) {
		bytes = data;
		clen = len;
	} else {
		bytes = w->scratch;
	}
	if (__builtin_add_overflow(w->cend, (uint64_t)clen, &cend))
		return -EOVERFLOW;
	ret = write_full(w->fd, bytes, clen);
	if (ret) {
		w->error = ret;
		return ret;
	}
	blob_hasher_update(w->hasher, bytes, clen);
	c = &w->chunks[w->nr_chunks++];
	*c = (struct blob_chunk){
		.uoff = w->uend,
		.coff = w->cend,
		.usize = len,
		.csize = (uint32_t)clen,
		.codec = (uint8_t)codec,
	};
	memcpy(c->sha256, sha256, BLOB_DIGEST_SIZE);
	*uoff = w->uend;
	w->uend = uend;
	w->cend = cend;
	return 0;
}

static void writer_free(struct blob_writer *w)
{
	blob_codec_ctx_release(&w->ctx);
	blob_hasher_free(w->hasher);
	free(w->scratch);
	free(w->chunks);
	free(w);
}

int blob_writer_finish(struct blob_writer *w, struct blob_info *info)
{
	size_t tlen = (size_t)w->nr_chunks * BLOB_CHUNK_ENTRY_SIZE;
	struct blob_info bi = {
		.size = w->cend + tlen + BLOB_FOOTER_SIZE,
		.uncompressed_size = w->uend,
		.table_offset = w->cend,
		.nr_chunks = w->nr_chunks,
	};
	uint8_t *tail = NULL;
	int ret = w->error;

	if (ret)
		goto out;
	tail = malloc(tlen + BLOB_FOOTER_SIZE);
	if (!tail) {
		ret = -ENOMEM;
		goto out;
	}
	blob_table_encode(w->chunks, w->nr_chunks, tail);
	blob_sha256(tail, tlen, bi.table_sha256);
	blob_footer_encode(&bi, tail + tlen);
	ret = write_full(w->fd, tail, tlen + BLOB_FOOTER_SIZE);
	if (ret)
		goto out;
	blob_hasher_update(w->hasher, tail, tlen + BLOB_FOOTER_SIZE);
	blob_hasher_final(w->hasher, bi.digest);
	if (w->nr_chunks) {
		/* Give back the geometric growth slack; keep it on failure. */
		struct blob_chunk *fit = realloc(w->chunks,
						 (size_t)w->nr_chunks *
							 sizeof(*fit));

		bi.chunks = fit ? fit : w->chunks;
		w->chunks = NULL;
	}
	*info = bi;
out:
	free(tail);
	writer_free(w);
	return ret;
}

void blob_writer_abort(struct blob_writer *w)
{
	if (w)
		writer_free(w);
}
