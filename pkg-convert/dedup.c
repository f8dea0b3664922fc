// SPDX-License-Identifier: MIT
/*
 * Dedup: every regular file is cut into chunk_size pieces; all-zero pieces
 * become holes, a piece whose (sha256, length) is in the chunk table is
 * referenced where it is stored (this layer's blob, a lower layer's, or a
 * --chunk-dict image's), and a new one is added to the current layer's
 * blob. Each source layer gets one blob, named by its digest at the end of
 * the layer, or none when the layer adds no chunk.
 */
#include <stdio.h>
#include <stdlib.h>

#include "internal.h"

static int chunk_table_grow(struct chunk_table *t)
{
	size_t new_cap = t->cap ? t->cap * 2 : 4096, i;
	struct chunk_slot *slots = calloc(new_cap, sizeof(*slots));

	if (!slots)
		return -ENOMEM;
	for (i = 0; i < t->cap; i++) {
		const struct chunk_slot *s = &t->slots[i];
		size_t h;

		if (!s->blob)
			continue;
		h = (size_t)get_le64(s->sha256) & (new_cap - 1);
		while (slots[h].blob)
			h = (h + 1) & (new_cap - 1);
		slots[h] = *s;
	}
	free(t->slots);
	t->slots = slots;
	t->cap = new_cap;
	return 0;
}

/* The slot for (@sha256, @usize): either the stored chunk or an empty slot. */
static struct chunk_slot *chunk_table_find(struct chunk_table *t,
					   const uint8_t *sha256,
					   uint32_t usize)
{
	size_t h = (size_t)get_le64(sha256) & (t->cap - 1);

	while (t->slots[h].blob) {
		struct chunk_slot *s = &t->slots[h];

		if (s->usize == usize && !memcmp(s->sha256, sha256, BLOB_DIGEST_SIZE))
			return s;
		h = (h + 1) & (t->cap - 1);
	}
	return &t->slots[h];
}

/* Store one piece of file data (or find it stored) and fill @out. */
static int store_chunk(struct converter *c, const uint8_t *data, uint32_t len,
		       struct meta_chunk *out)
{
	uint8_t sha256[BLOB_DIGEST_SIZE];
	struct chunk_slot *slot;
	uint64_t uoff;
	int ret;

	c->stats->chunks_total++;
	if (mem_is_zero(data, len)) {
		c->stats->bytes_zero += len;
		*out = (struct meta_chunk){ .device_id = 0, .blkaddr = META_CHUNK_HOLE };
		return 0;
	}
	sha256_buf(data, len, sha256);
	if (c->chunks.used * 2 >= c->chunks.cap) {
		ret = chunk_table_grow(&c->chunks);
		if (ret)
			return ret;
	}
	slot = chunk_table_find(&c->chunks, sha256, len);
	if (!slot->blob) {
		ret = c->index ? index_add_chunk(c, len, sha256, &uoff) :
				 blob_writer_add(c->writer, data, len, sha256, &uoff);
		if (ret)
			return ret;
		/* A hot run's final addresses are checked at the layer's end. */
		if (uoff / META_BLOCK_SIZE > UINT32_MAX - 1) {
			ferry_err("blob exceeds %u blocks: split the input",
				  UINT32_MAX - 1);
			return -EFBIG;
		}
		memcpy(slot->sha256, sha256, sizeof(sha256));
		slot->usize = len;
		slot->blob = (uint16_t)(c->writer_blob + 1);
		slot->hot = c->writer_hot;
		slot->blkaddr = (uint32_t)(uoff / META_BLOCK_SIZE);
		c->chunks.used++;
		c->writer_chunks++;
		c->stats->chunks_unique++;
		c->stats->bytes_unique += len;
	}
	*out = (struct meta_chunk){
		.device_id = (uint16_t)(PROVISIONAL_DEVICE |
					(slot->hot ? PROVISIONAL_HOT : 0) |
					(slot->blob - 1u)),
		.blkaddr = slot->blkaddr,
	};
	return 0;
}

/* Insert a stored chunk (from a chunk dict) unless its digest is known. */
static int remember_chunk(struct converter *c, const struct blob_chunk *bc,
			  uint32_t blob)
{
	struct chunk_slot *slot;
	int ret;

	if (c->chunks.used * 2 >= c->chunks.cap) {
		ret = chunk_table_grow(&c->chunks);
		if (ret)
			return ret;
	}
	slot = chunk_table_find(&c->chunks, bc->sha256, bc->usize);
	if (slot->blob)
		return 0;
	memcpy(slot->sha256, bc->sha256, BLOB_DIGEST_SIZE);
	slot->usize = bc->usize;
	slot->blob = (uint16_t)(blob + 1);
	slot->blkaddr = (uint32_t)(bc->uoff / META_BLOCK_SIZE);
	c->chunks.used++;
	return 0;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

int convert_prefetch_index(struct converter *c)
{
	uint32_t i;

	if (!c->nr_prefetch)
		return 0;
	c->prefetch_sorted = malloc(c->nr_prefetch * sizeof(*c->prefetch_sorted));
	if (!c->prefetch_sorted)
		return -ENOMEM;
	/* Stored as "/a/b" (image_prefetch_list_load), compared as "a/b". */
	for (i = 0; i < c->nr_prefetch; i++)
		c->prefetch_sorted[i] = c->prefetch[i] + 1;
	qsort(c->prefetch_sorted, c->nr_prefetch, sizeof(*c->prefetch_sorted), cmp_str);
	return 0;
}

static bool listed(const struct converter *c, const char *image_path)
{
	return c->prefetch_sorted &&
	       bsearch(&image_path, c->prefetch_sorted, c->nr_prefetch,
		       sizeof(*c->prefetch_sorted), cmp_str);
}

/*
 * Fill @inode (a regular file of @size bytes) from @read: inline in the
 * bootstrap when small, else as chunks. The new chunks of the prefetch
 * list's files go to the blob's hot run: one contiguous range that the
 * mount fetches first with a few large requests, sharing no frame with
 * unlisted files, which it would bring along (on "big" with a recorded
 * Python list: 12.3 MB fetched for 7.3 MB of listed data compressed when
 * frames were shared; ~35 requests when the listed frames were scattered
 * in tar order).
 */
int convert_ingest_file(struct converter *c, struct meta_inode *inode,
			uint64_t size, const struct file_source *src,
			const char *path, const char *image_path)
{
	uint32_t chunk_size = c->opts->chunk_size;
	uint64_t nr_chunks, i;
	bool is_listed;
	int ret;

	if (c->native)
		return native_ingest_file(c, inode, size, src, path);
	inode->size = size;
	c->stats->bytes_in += size;
	ferry_progress_add(&c->progress, size);
	if (size <= c->opts->inline_max) {
		c->stats->bytes_inline += size;
		if (!size)
			return 0;
		inode->data = malloc(size);
		if (!inode->data)
			return -ENOMEM;
		ret = src->read(src->ctx, inode->data, size);
		goto out;
	}
	is_listed = listed(c, image_path);
	/* A ferry index's chunks stay where the layer has them: no hot run. */
	if (!c->index && is_listed != c->writer_hot) {
		ret = blob_writer_hot(c->writer, is_listed);
		if (ret)
			goto out;
		c->writer_hot = is_listed;
	}
	nr_chunks = DIV_ROUND_UP(size, chunk_size);
	inode->chunk_bits = (uint8_t)(__builtin_ctz(chunk_size) - 12);
	inode->chunks = calloc(nr_chunks, sizeof(*inode->chunks));
	if (!inode->chunks)
		return -ENOMEM;
	for (i = 0; i < nr_chunks; i++) {
		uint32_t len = (uint32_t)MIN((uint64_t)chunk_size,
					     size - i * chunk_size);

		ret = convert_cancelled(c);
		if (ret)
			return ret;
		if (src->skip_hole && src->skip_hole(src->ctx, len)) {
			c->stats->chunks_total++;
			c->stats->bytes_zero += len;
			inode->chunks[i] = (struct meta_chunk){ 0, META_CHUNK_HOLE };
			continue;
		}
		ret = src->read(src->ctx, c->buf, len);
		if (!ret)
			ret = convert_elf_chunk(c, i * chunk_size, c->buf, len, size);
		if (!ret)
			ret = store_chunk(c, c->buf, len, &inode->chunks[i]);
		if (ret)
			goto out;
	}
	ret = convert_elf_file_end(c, inode, image_path);
out:
	if (ret)
		ferry_err("%s: %s", path, ferry_strerror(ret));
	return ret;
}


/* ------------------------------------------------------------------ */
/* Blobs: one per source layer, plus the chunk dict's                  */
/* ------------------------------------------------------------------ */

int convert_add_blob(struct converter *c, struct out_blob **out)
{
	if (c->nr_blobs >= META_MAX_DEVICES) {
		ferry_err("more than %u blobs: too many layers", META_MAX_DEVICES);
		return -E2BIG;
	}
	if (array_reserve(&c->blobs, &c->blobs_cap, c->nr_blobs + 1,
			  sizeof(*c->blobs), 16))
		return -ENOMEM;
	*out = &c->blobs[c->nr_blobs++];
	memset(*out, 0, sizeof(**out));
	return 0;
}

int convert_layer_begin(struct converter *c, const char *source_layer)
{
	struct out_blob *b;
	int ret;

	ret = convert_add_blob(c, &b);
	if (ret)
		return ret;
	c->writer_blob = c->nr_blobs - 1;
	c->writer_chunks = 0;
	if (source_layer && !(b->source_layer = strdup(source_layer)))
		return -ENOMEM;
	/* Named by its digest once complete. */
	ret = atomic_file_create(&c->writer_file, c->blobs_dir, "blob", 0644);
	if (ret)
		return ret;
	ret = blob_writer_new(c->writer_file.fd, &c->opts->compress,
			      c->opts->jobs, &c->writer);
	if (ret || !c->nr_prefetch)
		return ret;
	/* The prefetch list's frames wait here for the blob's end. */
	c->writer_hot = false;
	ret = atomic_file_create(&c->hot_file, c->blobs_dir, "hot", 0600);
	if (!ret)
		ret = blob_writer_set_hot_stage(c->writer, c->hot_file.fd);
	return ret;
}

void convert_layer_discard(struct converter *c)
{
	if (c->writer)
		blob_writer_abort(c->writer);
	c->writer = NULL;
	atomic_file_discard(&c->writer_file);
	atomic_file_discard(&c->hot_file);
}

int convert_layer_end(struct converter *c)
{
	struct out_blob *b = &c->blobs[c->writer_blob];
	char hex[2 * BLOB_DIGEST_SIZE + 1];
	uint64_t hot_uoff;
	int ret;

	if (!c->writer_chunks) {
		/* The layer added no chunks: it gets no blob. */
		convert_layer_discard(c);
		free(b->source_layer);
		c->nr_blobs--;
		return 0;
	}
	ret = blob_writer_finish(c->writer, &b->info, &hot_uoff);
	c->writer = NULL;
	if (ret)
		goto fail;
	atomic_file_discard(&c->hot_file);
	if (b->info.uncompressed_size / META_BLOCK_SIZE > UINT32_MAX - 1) {
		ferry_err("blob exceeds %u blocks: split the input",
			  UINT32_MAX - 1);
		ret = -EFBIG;
		goto fail;
	}
	b->hot_blkaddr = (uint32_t)(hot_uoff / META_BLOCK_SIZE);
	hex_encode(b->info.digest, BLOB_DIGEST_SIZE, hex);
	ret = atomic_file_commit(&c->writer_file, hex);
	if (ret)
		goto fail;
	return 0;
fail:
	convert_layer_discard(c);
	return ret;
}

int convert_load_chunk_dict(struct converter *c, const char *ref)
{
	struct image *dict;
	uint32_t i, k;
	int ret;

	ret = image_open(ref, &(struct image_opts){ .fetch = c->opts->fetch },
			 &dict);
	if (ret) {
		ferry_err("chunk dict %s: cannot open: %s", ref, ferry_strerror(ret));
		return ret;
	}
	for (i = 0; i < dict->blobs.nr_blobs; i++) {
		const struct blob_info *src = &dict->blobs.blobs[i];
		struct out_blob *b;

		ret = convert_add_blob(c, &b);
		if (ret)
			break;
		b->from_dict = true;
		b->dict_index = i;
		b->info = *src;
		b->info.chunks = malloc((size_t)src->nr_chunks * sizeof(*src->chunks) + 1);
		if (!b->info.chunks) {
			ret = -ENOMEM;
			break;
		}
		memcpy(b->info.chunks, src->chunks, (size_t)src->nr_chunks * sizeof(*src->chunks));
		for (k = 0; k < src->nr_chunks && !ret; k++)
			ret = remember_chunk(c, &src->chunks[k], c->nr_blobs - 1);
		if (ret)
			break;
	}
	c->dict = dict;
	return ret;
}

int convert_copy_dict_blobs(struct converter *c, const char *layout,
			   struct out_blob **blobs, uint32_t nr)
{
	uint32_t i;
	int ret;

	for (i = 0; i < nr; i++) {
		if (!blobs[i]->from_dict)
			continue;
		ret = image_copy_blob(c->dict, blobs[i]->dict_index, layout);
		if (ret)
			return ret;
	}
	return 0;
}

