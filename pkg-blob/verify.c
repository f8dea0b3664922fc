// SPDX-License-Identifier: MIT
/*
 * Reading blob files back: footer + table, frame and chunk decode, and the
 * streaming verify pass, which reads the data region front to back in large reads (frames are contiguous, see
 * format.c), decodes every frame once and checks each of its chunks, and
 * hashes the whole file on the way to check the blob digest without a
 * second read.
 */
#include "internal.h"
#include "../pkg-base/base.h"

#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

/* Large sequential reads; a bigger compressed frame gets its own size. */
#define STREAM_BUF_SIZE (16u << 20)

static int info_mismatch(const char *what, const char *field, uint64_t file,
			 uint64_t index)
{
	ferry_err("%s: %s is %llu in the file but %llu in the blob index",
		  what, field, (unsigned long long)file,
		  (unsigned long long)index);
	return -EFSCORRUPTED;
}

/* @info (decoded from the file) against @expect (from the blob index). */
static int info_compare(const struct blob_info *info,
			const struct blob_info *expect, const char *what)
{
	uint32_t i;

	if (info->uncompressed_size != expect->uncompressed_size)
		return info_mismatch(what, "uncompressed size",
				     info->uncompressed_size,
				     expect->uncompressed_size);
	if (info->table_offset != expect->table_offset)
		return info_mismatch(what, "table offset", info->table_offset,
				     expect->table_offset);
	if (info->nr_chunks != expect->nr_chunks)
		return info_mismatch(what, "chunk count", info->nr_chunks,
				     expect->nr_chunks);
	if (memcmp(info->table_sha256, expect->table_sha256,
		   BLOB_DIGEST_SIZE)) {
		ferry_err("%s: chunk table sha256 differs from the blob index",
			  what);
		return -EFSCORRUPTED;
	}
	for (i = 0; i < info->nr_chunks; i++) {
		const struct blob_chunk *a = &info->chunks[i];
		const struct blob_chunk *b = &expect->chunks[i];

		if (a->uoff != b->uoff || a->coff != b->coff ||
		    a->usize != b->usize || a->csize != b->csize ||
		    a->frame_off != b->frame_off ||
		    a->frame_usize != b->frame_usize || a->codec != b->codec ||
		    memcmp(a->sha256, b->sha256, BLOB_DIGEST_SIZE)) {
			ferry_err("%s: chunk %u differs from the blob index",
				  what, i);
			return -EFSCORRUPTED;
		}
	}
	return 0;
}

/*
 * blob_read_info, also handing back the raw table + footer bytes when
 * @tail is not NULL (the streaming pass hashes them).
 */
static int read_info(const struct blob_source *src, uint64_t size,
		     const char *what, const struct blob_info *expect,
		     struct blob_info *info, uint8_t **tail)
{
	uint8_t footer[BLOB_FOOTER_SIZE], *buf = NULL;
	struct blob_info bi;
	size_t tlen;
	int ret;

	if (expect && size != expect->size) {
		ferry_err("%s: file is %llu bytes but the blob index says %llu",
			  what, (unsigned long long)size,
			  (unsigned long long)expect->size);
		return -EFSCORRUPTED;
	}
	if (size < BLOB_FOOTER_SIZE) {
		ferry_err("%s: %llu bytes is too short for a blob", what,
			  (unsigned long long)size);
		return -EFSCORRUPTED;
	}
	ret = src->read(src->ctx, size - BLOB_FOOTER_SIZE, footer,
			BLOB_FOOTER_SIZE);
	if (ret)
		return ret;
	ret = blob_footer_parse(footer, size, &bi, what);
	if (ret)
		return ret;
	/* The footer check bounds the table by the file size. */
	tlen = (size_t)bi.nr_chunks * BLOB_CHUNK_ENTRY_SIZE;
	buf = malloc(tlen + BLOB_FOOTER_SIZE);
	if (!buf)
		return -ENOMEM;
	ret = tlen ? src->read(src->ctx, bi.table_offset, buf, tlen) : 0;
	if (ret)
		goto fail;
	memcpy(buf + tlen, footer, BLOB_FOOTER_SIZE);
	ret = blob_table_parse(buf, tlen, &bi, what);
	if (ret)
		goto fail;
	if (expect) {
		ret = info_compare(&bi, expect, what);
		if (ret) {
			blob_info_free_chunks(&bi);
			goto fail;
		}
		memcpy(bi.digest, expect->digest, BLOB_DIGEST_SIZE);
	}
	*info = bi;
	if (tail)
		*tail = buf;
	else
		free(buf);
	return 0;
fail:
	free(buf);
	return ret;
}

static int fd_source_read(void *ctx, uint64_t off, void *buf, size_t len)
{
	return pread_full(*(int *)ctx, buf, len, off);
}

int blob_read_info(int fd, const char *name, const struct blob_info *expect,
		   struct blob_info *info)
{
	struct blob_source src = { .read = fd_source_read, .ctx = &fd };
	char what[PATH_MAX + 8];
	struct stat st;

	if (fstat(fd, &st))
		return -errno;
	snprintf(what, sizeof(what), "blob %s", name);
	return read_info(&src, (uint64_t)st.st_size, what, expect, info, NULL);
}

static void chunk_err(const char *what, uint32_t index,
		      const struct blob_chunk *c, const char *reason)
{
	if (what)
		ferry_err("%s: chunk %u (uncompressed offset %llu, bytes %u+%u of the frame at %llu+%u): %s",
			  what, index, (unsigned long long)c->uoff,
			  c->frame_off, c->usize, (unsigned long long)c->coff,
			  c->csize, reason);
	else
		ferry_err("chunk at uncompressed offset %llu (bytes %u+%u of the frame at %llu+%u): %s",
			  (unsigned long long)c->uoff, c->frame_off, c->usize,
			  (unsigned long long)c->coff, c->csize, reason);
}

/* blob_frame_decode, naming the blob (@what may be NULL) in errors. */
static int frame_decode(struct blob_codec_ctx *ctx, const struct blob_chunk *c,
			const void *cdata, void *frame_out, const char *what,
			uint32_t index)
{
	char why[BLOB_WHY_MAX];
	int ret;

	ret = blob_codec_decompress(ctx, c->codec, cdata, c->csize, frame_out,
				    c->frame_usize, why);
	if (ret == -EFSCORRUPTED)
		chunk_err(what, index, c, why);
	return ret;
}

/* blob_chunk_verify, naming the blob (@what may be NULL) in errors. */
static int chunk_verify(const struct blob_chunk *c, const void *data,
			const char *what, uint32_t index)
{
	uint8_t digest[BLOB_DIGEST_SIZE];

	sha256_buf(data, c->usize, digest);
	if (memcmp(digest, c->sha256, BLOB_DIGEST_SIZE)) {
		chunk_err(what, index, c, "sha256 mismatch");
		return -EIO;
	}
	return 0;
}

int blob_frame_decode(const struct blob_chunk *c, const void *cdata,
		      void *frame_out)
{
	struct blob_codec_ctx *ctx = blob_codec_ctx_thread();

	if (!ctx)
		return -ENOMEM;
	return frame_decode(ctx, c, cdata, frame_out, NULL, 0);
}

int blob_chunk_verify(const struct blob_chunk *c, const void *data)
{
	return chunk_verify(c, data, NULL, 0);
}

int blob_chunk_decode(const struct blob_chunk *c, const void *cdata, void *out)
{
	struct blob_codec_ctx *ctx = blob_codec_ctx_thread();
	const uint8_t *stored = cdata;
	int ret;

	if (!ctx)
		return -ENOMEM;
	if (c->frame_off > c->frame_usize ||
	    c->usize > c->frame_usize - c->frame_off)
		return -EINVAL;
	if (c->codec == BLOB_CODEC_NONE && c->csize == c->frame_usize) {
		/* A stored frame holds the chunk's bytes as they are. */
		memcpy(out, stored + c->frame_off, c->usize);
	} else if (c->usize == c->frame_usize) {
		ret = frame_decode(ctx, c, cdata, out, NULL, 0);
		if (ret)
			return ret;
	} else {
		ret = blob_buf_reserve(&ctx->frame_buf, &ctx->frame_cap,
				       c->frame_usize);
		if (!ret)
			ret = frame_decode(ctx, c, cdata, ctx->frame_buf, NULL, 0);
		if (ret)
			return ret;
		memcpy(out, ctx->frame_buf + c->frame_off, c->usize);
	}
	return chunk_verify(c, out, NULL, 0);
}

static void report_set(struct blob_verify_report *r, int error, uint32_t chunk,
		       uint64_t uoff)
{
	if (r)
		*r = (struct blob_verify_report){
			.bad_chunk = chunk, .bad_uoff = uoff, .error = error,
		};
}

/*
 * The data region, read front to back in large reads, each byte hashed
 * once as it is read.
 */
struct data_reader {
	const struct blob_source *src;
	uint8_t *buf;
	size_t cap, have;   /* buf holds file bytes buf_off .. + have */
	uint64_t buf_off;
	uint64_t end;       /* the data region's end: table_offset */
	struct sha256_hasher *hasher;
};

/*
 * Point *@p at file bytes @off .. @off + @len, which start at or before
 * the end of what was read so far (frames are consecutive).
 */
static int reader_get(struct data_reader *r, uint64_t off, size_t len,
		      const uint8_t **p)
{
	if (off + len > r->buf_off + r->have) {
		size_t keep = (size_t)(r->buf_off + r->have - off);
		size_t want;
		int ret;

		memmove(r->buf, r->buf + (off - r->buf_off), keep);
		r->buf_off = off;
		r->have = keep;
		want = (size_t)MIN((uint64_t)(r->cap - keep),
				   r->end - off - keep);
		ret = r->src->read(r->src->ctx, off + keep, r->buf + keep, want);
		if (ret)
			return ret;
		sha256_hasher_update(r->hasher, r->buf + keep, want);
		r->have += want;
	}
	*p = r->buf + (off - r->buf_off);
	return 0;
}

/*
 * Check the blob of @size bytes read through @src against @info: its size,
 * footer and table, every frame (decoded), every chunk (hashed) and the
 * whole-file digest.
 */
static int stream_blob(const struct blob_source *src, uint64_t size,
		       const char *what, const struct blob_info *info,
		       struct blob_verify_report *report)
{
	struct blob_codec_ctx *ctx = blob_codec_ctx_thread();
	struct data_reader r = { .src = src, .cap = STREAM_BUF_SIZE };
	uint8_t *out = NULL, *tail = NULL;
	uint8_t digest[BLOB_DIGEST_SIZE];
	const uint8_t *frame = NULL; /* the decoded frame of chunk i */
	struct blob_info finfo = { 0 };
	size_t max_frame = 1;
	uint32_t i = BLOB_VERIFY_NO_CHUNK; /* the chunk being checked */
	uint32_t j;
	int ret = -ENOMEM;

	report_set(report, 0, 0, 0);
	if (!ctx)
		goto out;
	/* From here on @info matches the validated table of the file. */
	ret = read_info(src, size, what, info, &finfo, &tail);
	if (ret)
		goto out;
	ret = sha256_hasher_new(&r.hasher);
	if (ret)
		goto out;
	for (j = 0; j < info->nr_chunks; j++) {
		r.cap = MAX(r.cap, (size_t)info->chunks[j].csize);
		max_frame = MAX(max_frame, (size_t)info->chunks[j].frame_usize);
	}
	r.end = info->table_offset;
	r.cap = (size_t)MIN((uint64_t)r.cap, MAX(r.end, 1));
	r.buf = malloc(r.cap);
	out = malloc(max_frame);
	if (!r.buf || !out) {
		ret = -ENOMEM;
		goto out;
	}
	for (i = 0; i < info->nr_chunks; i++) {
		const struct blob_chunk *c = &info->chunks[i];
		const uint8_t *bytes;

		if (!c->frame_off) {
			ret = reader_get(&r, c->coff, c->csize, &bytes);
			if (ret) {
				chunk_err(what, i, c, ferry_strerror(ret));
				goto out;
			}
			frame = bytes;
			if (c->codec != BLOB_CODEC_NONE) {
				ret = frame_decode(ctx, c, bytes, out, what, i);
				if (ret)
					goto out;
				frame = out;
			}
		}
		bytes = frame + c->frame_off;
		ret = chunk_verify(c, bytes, what, i);
		if (ret)
			goto out;
	}
	i = BLOB_VERIFY_NO_CHUNK;
	sha256_hasher_update(r.hasher, tail,
			   (size_t)(info->size - info->table_offset));
	sha256_hasher_final(r.hasher, digest);
	if (!mem_is_zero(info->digest, BLOB_DIGEST_SIZE) &&
	    memcmp(digest, info->digest, BLOB_DIGEST_SIZE)) {
		char want_hex[2 * BLOB_DIGEST_SIZE + 1];
		char got_hex[2 * BLOB_DIGEST_SIZE + 1];

		hex_encode(info->digest, BLOB_DIGEST_SIZE, want_hex);
		hex_encode(digest, BLOB_DIGEST_SIZE, got_hex);
		ferry_err("%s: blob digest mismatch: expected sha256:%s, file has sha256:%s",
			  what, want_hex, got_hex);
		ret = -EFSCORRUPTED;
	}
out:
	if (ret)
		report_set(report, ret, i,
			   i < info->nr_chunks ? info->chunks[i].uoff :
						 BLOB_VERIFY_NO_UOFF);
	sha256_hasher_free(r.hasher);
	blob_info_free_chunks(&finfo);
	free(tail);
	free(out);
	free(r.buf);
	return ret;
}

int blob_verify_file(const char *path, const struct blob_info *info,
		     struct blob_verify_report *report)
{
	struct blob_source src = { .read = fd_source_read };
	char what[PATH_MAX + 8];
	struct stat st;
	int fd, ret;

	snprintf(what, sizeof(what), "blob %s", path);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st)) {
		ret = -errno;
		ferry_err("%s: %s", what, ferry_strerror(ret));
		report_set(report, ret, BLOB_VERIFY_NO_CHUNK, BLOB_VERIFY_NO_UOFF);
		if (fd >= 0)
			close(fd);
		return ret;
	}
	posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
	src.ctx = &fd;
	ret = stream_blob(&src, (uint64_t)st.st_size, what, info, report);
	close(fd);
	return ret;
}

int blob_verify_source(const struct blob_source *src, const char *name,
		       const struct blob_info *info,
		       struct blob_verify_report *report)
{
	char what[PATH_MAX + 8];

	if (info->flags & BLOB_INFO_STREAM)
		return blob_stream_verify(src, name, info, src->stream, report);
	snprintf(what, sizeof(what), "blob %s", name);
	return stream_blob(src, info->size, what, info, report);
}
