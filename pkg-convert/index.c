// SPDX-License-Identifier: MIT
/*
 * `ferry index IMAGE`: a ferry index attached to an ordinary image
 * (docs/FORMAT.md 1e, 2.8, 3.5). Each layer is read once, streaming,
 * digest-checked, and merged into the tree as `ferry convert` does
 * (layer.c, dedup.c), but a file's new chunks are not written anywhere:
 * each is recorded where it lies in the layer's decoded stream and gets
 * a 4 KiB-aligned slot of the layer's *stream blob* (its virtual device),
 * and the layer's decoder records resume points (points.c) so that lazy
 * mounts fetch and decode only from the nearest one. The bootstrap names
 * the layers themselves as devices; pkg-image attaches it to the image.
 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "internal.h"
#include "tar.h"

/* A point can lie up to a deflate block past its spacing; frames are
 * bounded by BLOB_FRAME_MAX from their point (FORMAT.md 3.5). */
#define INDEX_OUT_SPACING (16u << 20)

struct index_chunk {
	uint64_t soff; /* in the decoded stream */
	uint32_t len;
	uint8_t sha256[BLOB_DIGEST_SIZE];
};

struct index_layer {
	struct blob_stream stream;   /* blob set at the end */
	uint32_t out_blob;           /* its index in c->blobs, or UINT32_MAX */
};

struct index_state {
	uint64_t span;
	const char *name;            /* the layer being read */
	struct input_points *pts;    /* its points (gzip, zstd), or NULL */
	enum blob_stream_format format;
	struct index_chunk *chunks;  /* its new chunks, in stream order */
	size_t nr_chunks, chunks_cap;
	uint64_t next_uoff;          /* its next slot */
	struct index_layer *layers;  /* per layer of the image */
	uint32_t nr_layers;
};

int index_add_chunk(struct converter *c, uint32_t len,
		    const uint8_t sha256[BLOB_DIGEST_SIZE], uint64_t *uoff)
{
	struct index_state *x = c->index;
	struct index_chunk *ic;

	if (array_reserve(&x->chunks, &x->chunks_cap, x->nr_chunks + 1,
			  sizeof(*x->chunks), 1024))
		return -ENOMEM;
	ic = &x->chunks[x->nr_chunks++];
	/* The archive has just read the chunk: it ends where the reader is. */
	ic->soff = tar_offset(c->tar) - len;
	ic->len = len;
	memcpy(ic->sha256, sha256, BLOB_DIGEST_SIZE);
	*uoff = x->next_uoff;
	x->next_uoff += ROUND_UP((uint64_t)len, BLOB_SLOT_ALIGN);
	return 0;
}

static uint8_t stream_codec(enum blob_stream_format f)
{
	return f == BLOB_STREAM_GZIP ? BLOB_CODEC_GZIP_STREAM :
	       f == BLOB_STREAM_ZSTD ? BLOB_CODEC_ZSTD_STREAM : BLOB_CODEC_NONE;
}

/* The last point at or before decoded offset @soff (from *@k on). */
static uint32_t point_for(const struct blob_stream *s, uint64_t soff, uint32_t k)
{
	while (k + 1 < s->nr_points && s->points[k + 1].uoff <= soff)
		k++;
	return k;
}

/*
 * The stream blob of the layer just read: its chunks grouped into frames
 * as a ferry blob's writer groups them (a chunk of BLOB_BATCH_SMALL or
 * more alone, smaller ones together while their span, tar headers
 * included, stays within BLOB_BATCH_MAX), never across a resume point,
 * each frame's compressed range bounded by the decoder's marks.
 */
static int build_table(struct converter *c, struct out_blob *b,
		       const struct oci_descriptor *d, struct blob_stream *s)
{
	struct index_state *x = c->index;
	struct blob_chunk *ch;
	uint32_t i, first = 0, k = 0, kf = 0;
	uint8_t codec = stream_codec(x->format);

	ch = calloc(MAX(x->nr_chunks, (size_t)1), sizeof(*ch));
	if (!ch)
		return -ENOMEM;
	for (i = 0; i < x->nr_chunks; i++) {
		const struct index_chunk *ic = &x->chunks[i];
		const struct index_chunk *f = &x->chunks[first];
		bool start = !i;

		if (x->format != BLOB_STREAM_TAR)
			k = point_for(s, ic->soff, k);
		if (i)
			start = k != kf || ic->len >= BLOB_BATCH_SMALL ||
				f->len >= BLOB_BATCH_SMALL ||
				ic->soff + ic->len - f->soff > BLOB_BATCH_MAX;
		if (start) {
			first = i;
			kf = k;
			f = ic;
		}
		ch[i] = (struct blob_chunk){
			.uoff = i ? ch[i - 1].uoff + ROUND_UP((uint64_t)ch[i - 1].usize,
							      BLOB_SLOT_ALIGN) : 0,
			.usize = ic->len, .codec = codec,
			.frame_off = (uint32_t)(ic->soff - f->soff),
			.frame_skip = x->format == BLOB_STREAM_TAR ? 0 :
				      (uint32_t)MIN(f->soff - s->points[kf].uoff,
						    (uint64_t)UINT32_MAX),
			.coff = x->format == BLOB_STREAM_TAR ? f->soff :
				s->points[kf].cbit / 8,
		};
		memcpy(ch[i].sha256, ic->sha256, BLOB_DIGEST_SIZE);
		if (x->format != BLOB_STREAM_TAR &&
		    f->soff - s->points[kf].uoff > BLOB_FRAME_MAX) {
			ferry_err("%s: %llu decoded bytes without a place to resume decoding (a zstd layer of one frame?): convert the image instead (ferry convert)",
				  x->name, (unsigned long long)(f->soff - s->points[kf].uoff));
			free(ch);
			return -ENOTSUP;
		}
	}
	/* Sizes from each frame's last chunk, compressed ranges from the marks. */
	for (i = (uint32_t)x->nr_chunks; i--;) {
		struct blob_chunk *cc = &ch[i];

		cc->frame_usize = i + 1 < x->nr_chunks && ch[i + 1].frame_off ?
				  ch[i + 1].frame_usize : cc->frame_off + cc->usize;
		if (cc->frame_off)
			continue;
		if (x->format == BLOB_STREAM_TAR) {
			cc->csize = cc->frame_usize;
		} else {
			uint64_t end = points_bound(x->pts, x->chunks[i].soff +
							    cc->frame_usize);

			if (end > d->size || end - cc->coff > BLOB_FRAME_MAX) {
				ferry_err("%s: a frame at byte %llu needs %llu compressed bytes: convert the image instead (ferry convert)",
					  x->name, (unsigned long long)cc->coff,
					  (unsigned long long)(end - cc->coff));
				free(ch);
				return -ENOTSUP;
			}
			cc->csize = (uint32_t)(end - cc->coff);
		}
	}
	for (i = 1; i < x->nr_chunks; i++)
		if (ch[i].frame_off)
			ch[i].csize = ch[i - 1].csize;
	b->info = (struct blob_info){
		.size = d->size, .table_offset = d->size,
		.uncompressed_size = x->next_uoff, .nr_chunks = (uint32_t)x->nr_chunks,
		.flags = BLOB_INFO_STREAM, .chunks = ch,
	};
	memcpy(b->info.digest, d->digest, BLOB_DIGEST_SIZE);
	return blob_info_as_table(&b->info);
}

/* Read layer @d of @img into the tree and its stream blob. */
static int index_layer(struct converter *c, const struct oci_image *img,
		       uint32_t li, struct input_stream *in)
{
	struct index_state *x = c->index;
	struct index_layer *l = &x->layers[li];
	const struct oci_descriptor *d = &img->layers[li];
	struct out_blob *b;
	const char *fmt = input_format(in);
	int ret;

	x->format = !strcmp(fmt, "gzip") ? BLOB_STREAM_GZIP :
		    !strcmp(fmt, "zstd") ? BLOB_STREAM_ZSTD : BLOB_STREAM_TAR;
	x->nr_chunks = 0;
	x->next_uoff = 0;
	ret = points_new(x->span, INDEX_OUT_SPACING, &x->pts);
	if (!ret)
		ret = input_record_points(in, x->pts);
	if (!ret)
		ret = convert_add_blob(c, &b);
	if (ret)
		return ret;
	c->writer_blob = c->nr_blobs - 1;
	c->writer_chunks = 0;
	ret = convert_apply_input(c, in, d->size, x->name);
	if (ret)
		return ret;
	l->stream.format = (uint8_t)x->format;
	if (x->format == BLOB_STREAM_TAR) {
		l->stream.usize = input_bytes_in(in);
		memcpy(l->stream.diff_id, d->digest, BLOB_DIGEST_SIZE);
	} else {
		l->stream.usize = points_decoded(x->pts);
		points_diff_id(x->pts, l->stream.diff_id);
		ret = points_take(x->pts, &l->stream.points, &l->stream.nr_points);
		if (ret)
			return ret;
	}
	c->stats->points += l->stream.nr_points;
	if (!x->nr_chunks) {
		/* Nothing of it is read lazily: it is no device. */
		c->nr_blobs--;
		l->out_blob = UINT32_MAX;
		return 0;
	}
	l->out_blob = c->writer_blob;
	return build_table(c, &c->blobs[c->writer_blob], d, &l->stream);
}

static ssize_t stream_read(void *ctx, void *buf, size_t len)
{
	return fetch_stream_read(ctx, buf, len);
}

static int index_layers(struct converter *c, const struct oci_image *img)
{
	struct index_state *x = c->index;
	uint32_t i;
	int ret = 0;

	c->layered = true;
	for (i = 0; i < img->nr_layers && !ret; i++) {
		const struct oci_descriptor *d = &img->layers[i];
		struct fetch_stream *fs = NULL;
		struct input_stream *in = NULL;
		char name[96], *path = NULL;

		memcpy(name, "layer ", 6);
		digest_format(d->digest, name + 6);
		x->name = name;
		c->stats->layer_bytes += d->size;
		if (img->remote) {
			ret = registry_open_stream(img->remote, d->digest, d->size, &fs);
			if (!ret)
				ret = input_open_source((struct byte_source){ .read = stream_read,
									      .ctx = fs },
							NULL, name, &in);
		} else {
			ret = oci_blob_path(img->layout, d->digest, &path);
			if (!ret)
				ret = input_open_verified(path, d->digest, name, &in);
		}
		if (!ret)
			ret = index_layer(c, img, i, in);
		input_close(in);
		fetch_stream_close(fs);
		free(path);
		points_free(x->pts);
		x->pts = NULL;
	}
	return ret;
}

/* The layers' decoded streams must be the ones the config names. */
static int check_diff_ids(const struct oci_image *img, const struct index_state *x,
			  uint8_t (*diff_ids)[BLOB_DIGEST_SIZE])
{
	uint32_t i;
	int ret = oci_config_diff_ids(img, diff_ids);

	if (ret)
		return ret;
	for (i = 0; i < img->nr_layers; i++) {
		char want[DIGEST_STRING_SIZE], got[DIGEST_STRING_SIZE];

		if (!memcmp(diff_ids[i], x->layers[i].stream.diff_id, BLOB_DIGEST_SIZE))
			continue;
		digest_format(diff_ids[i], want);
		digest_format(x->layers[i].stream.diff_id, got);
		ferry_err("%s: layer %u decodes to %s, but its config's diff_id is %s",
			  img->where, i + 1, got, want);
		return -EFSCORRUPTED;
	}
	return 0;
}

/* The bootstrap and its attachment to the image. */
static int index_finish(struct converter *c, const struct oci_image *img)
{
	struct index_state *x = c->index;
	struct out_blob **used = NULL;
	struct blob_stream *streams = NULL;
	uint8_t (*diff_ids)[BLOB_DIGEST_SIZE] = NULL;
	uint8_t *data = NULL;
	uint32_t nr_used = 0, i, n = 0;
	int ret;

	diff_ids = calloc(img->nr_layers + 1, sizeof(*diff_ids));
	streams = calloc(img->nr_layers + 1, sizeof(*streams));
	if (!diff_ids || !streams) {
		ret = -ENOMEM;
		goto out;
	}
	ret = check_diff_ids(img, x, diff_ids);
	if (!ret)
		ret = convert_assign_devices(c);
	if (!ret)
		ret = convert_used_blobs(c, &used, &nr_used);
	if (ret)
		goto out;
	/* Resume points in device order, for the layers that are devices. */
	for (i = 0; i < img->nr_layers; i++) {
		struct index_layer *l = &x->layers[i];

		if (l->out_blob == UINT32_MAX || !c->blobs[l->out_blob].device_id)
			continue;
		streams[n] = l->stream;
		streams[n].blob = c->blobs[l->out_blob].device_id - 1u;
		n++;
	}
	ret = convert_fill_stats(c->stats, used, nr_used);
	if (!ret)
		ret = convert_write_bootstrap(c, used, nr_used, streams, n, &data);
	if (!ret)
		ret = image_index_attach(&(struct image_index_out){
						 .bootstrap = data,
						 .bootstrap_len = c->stats->bootstrap_bytes,
						 .subject = img,
						 .diff_ids = (const uint8_t (*)[32])diff_ids,
						 .chunk_size = c->opts->chunk_size,
						 .fetch = c->opts->fetch,
						 .progress = &c->progress },
					 c->stats->manifest_digest, &c->stats->manifest_size,
					 &c->stats->index_bytes);
out:
	free(data);
	free(used);
	free(streams);
	free(diff_ids);
	return ret;
}

/* Where the bootstrap is written before it is attached: $TMPDIR. */
static int scratch_dir(char **out)
{
	const char *tmp = getenv("TMPDIR");

	if (asprintf(out, "%s/ferry-index.XXXXXX", tmp && *tmp ? tmp : "/var/tmp") < 0) {
		*out = NULL;
		return -ENOMEM;
	}
	if (!mkdtemp(*out)) {
		int ret = -errno;

		ferry_err("%s: %s", *out, strerror(errno));
		free(*out);
		*out = NULL;
		return ret;
	}
	return 0;
}

int convert_ferry_index(const char *image, const struct convert_opts *opts,
			struct convert_stats *stats)
{
	struct index_state x = { .span = opts->span };
	struct converter c = {
		.opts = opts, .stats = stats, .index = &x,
		.writer_file = { .fd = -1, .dir_fd = -1 },
		.hot_file = { .fd = -1, .dir_fd = -1 },
	};
	struct image_ref ref = { 0 };
	struct oci_image img = { 0 };
	char *scratch = NULL;
	uint64_t start = ferry_now_ns();
	uint32_t i;
	int ret;

	memset(stats, 0, sizeof(*stats));
	ret = image_ref_parse(image, IMAGE_ACCEPT(IMAGE_OCI) | IMAGE_ACCEPT(IMAGE_DOCKER),
			      "image", &ref);
	if (ret)
		return ret;
	ret = oci_image_open(&ref, opts->platform, opts->fetch, &img);
	if (ret)
		goto out;
	for (i = 0; i < img.nr_layers; i++)
		if (oci_is_ferry_blob(img.layers[i].media_type) ||
		    oci_is_ferry_bootstrap(img.layers[i].media_type) ||
		    !strcmp(img.layers[i].media_type, EROFS_LAYER_MEDIA_TYPE)) {
			ferry_err("%s: layer %u is %s: a ferry or EROFS image mounts lazily as it is, without an index",
				  image, i + 1, img.layers[i].media_type);
			ret = -EINVAL;
			goto out;
		}
	ret = scratch_dir(&scratch);
	if (ret)
		goto out;
	c.blobs_dir = scratch;
	x.layers = calloc(img.nr_layers + 1, sizeof(*x.layers));
	c.buf = malloc(opts->chunk_size);
	if (!x.layers || !c.buf) {
		ret = -ENOMEM;
		goto out;
	}
	x.nr_layers = img.nr_layers;
	ret = meta_tree_new(&c.tree);
	if (!ret)
		ret = convert_elf_init(&c);
	if (!ret && opts->prefetch_files)
		ret = image_prefetch_list_load(opts->prefetch_files, &c.prefetch,
					       &c.nr_prefetch);
	if (!ret)
		ret = index_layers(&c, &img);
	if (!ret)
		ret = index_finish(&c, &img);
	stats->seconds = (double)(ferry_now_ns() - start) / 1e9;
out:
	if (ret)
		convert_stats_free(stats);
	for (i = 0; i < c.nr_blobs; i++)
		blob_info_free_chunks(&c.blobs[i].info);
	for (i = 0; i < x.nr_layers; i++) {
		for (uint32_t k = 0; k < x.layers[i].stream.nr_points; k++)
			free((void *)x.layers[i].stream.points[k].window);
		free(x.layers[i].stream.points);
	}
	free(x.layers);
	free(x.chunks);
	free(c.blobs);
	convert_elf_free(&c);
	image_prefetch_list_free(c.prefetch, c.nr_prefetch);
	meta_tree_free(c.tree);
	free(c.chunks.slots);
	free(c.links);
	free(c.buf);
	if (scratch && rmdir(scratch))
		ferry_warn("%s: cannot remove: %s", scratch, strerror(errno));
	free(scratch);
	oci_image_free(&img);
	image_ref_free(&ref);
	return ret;
}
