// SPDX-License-Identifier: MIT
/*
 * Opening images (dir:OUT, oci:PATH[:TAG], docker://REF): the index
 * (ferry.json or the manifest) names the bootstrap's digest and the blobs;
 * the bootstrap is loaded, checked against that digest, opened with
 * pkg-meta, and its device table and blob index are cross-checked with
 * the index before any blob byte is trusted. Blob bytes are then read
 * where they are: pread on a local file, or registry Range requests.
 */
#include <fcntl.h>
#include <json-c/json.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include "internal.h"

void image_expect_free(struct image_expect *e)
{
	free(e->blobs);
	free(e->layers);
	free(e->compressed_path);
	memset(e, 0, sizeof(*e));
}

static int expect_blobs(struct image_expect *e, size_t n)
{
	e->nr_blobs = (uint32_t)n;
	e->blobs = calloc(n + 1, sizeof(*e->blobs));
	return e->blobs ? 0 : -ENOMEM;
}

int image_expect_dir(struct image *img, struct json_object *root,
		     const char *index_path, struct image_expect *e)
{
	struct json_object *boot, *blobs, *v;
	const char *s;
	size_t i;
	int ret;

	if (!json_object_object_get_ex(root, "schemaVersion", &v) ||
	    json_object_get_int(v) != 1) {
		ferry_err("%s: unsupported schemaVersion (expected 1)", index_path);
		return -EFSCORRUPTED;
	}
	if (!json_object_object_get_ex(root, "bootstrap", &boot) ||
	    !(s = json_get_string(boot, "digest")) ||
	    digest_parse(s, e->bootstrap)) {
		ferry_err("%s: missing or malformed bootstrap digest", index_path);
		return -EFSCORRUPTED;
	}
	if (!json_object_object_get_ex(root, "blobs", &blobs) ||
	    !json_object_is_type(blobs, json_type_array)) {
		ferry_err("%s: missing blob list", index_path);
		return -EFSCORRUPTED;
	}
	ret = expect_blobs(e, json_object_array_length(blobs));
	for (i = 0; !ret && i < e->nr_blobs; i++) {
		s = json_get_string(json_object_array_get_idx(blobs, i), "digest");
		if (!s || digest_parse(s, e->blobs[i])) {
			ferry_err("%s: blob %zu has a malformed digest", index_path, i);
			ret = -EFSCORRUPTED;
		}
	}
	if (json_object_object_get_ex(root, "chunkSize", &v))
		img->chunk_size = (uint32_t)json_object_get_int64(v);
	s = json_get_string(root, "compression");
	snprintf(img->compression, sizeof(img->compression), "%s", s ? s : "?");
	return ret;
}

/* dir:OUT — OUT/ferry.json. */
static int locate_dir(struct image *img, struct image_expect *e)
{
	struct json_object *root;
	char *index_path = NULL;
	int ret;

	if (asprintf(&img->bootstrap_path, "%s/bootstrap", img->dir) < 0 ||
	    asprintf(&index_path, "%s/ferry.json", img->dir) < 0)
		return -ENOMEM;
	ret = json_read_file(index_path, OCI_JSON_MAX, &root);
	if (!ret) {
		ret = image_expect_dir(img, root, index_path, e);
		json_object_put(root);
	} else if (ret == -ENOENT) {
		ferry_err("%s: not a ferry image: it has no ferry.json (ferry convert SOURCE dir:%s writes one)",
			  img->dir, img->dir);
	} else {
		ferry_err("%s: not a ferry image: %s is %s", img->dir, index_path,
			  json_read_file_error(ret));
		ret = -EFSCORRUPTED;
	}
	free(index_path);
	return ret;
}

int image_expect_manifest(struct image *img, const struct oci_image *oci,
			  struct image_expect *e)
{
	const char *ref = img->ref;
	struct json_object *ann, *layers;
	const char *s;
	uint32_t i;
	int ret;

	json_object_object_get_ex(oci->manifest, "layers", &layers);
	memcpy(img->image_digest, oci->manifest_desc.digest, BLOB_DIGEST_SIZE);
	memcpy(img->config_digest, oci->config.digest, BLOB_DIGEST_SIZE);
	if (!oci->nr_layers ||
	    !oci_is_ferry_bootstrap(oci->layers[oci->nr_layers - 1].media_type)) {
		ferry_err("%s: not a ferry image (its last layer is not of type %s)", ref,
			  FERRY_BOOTSTRAP_MEDIA_TYPE);
		return -EFSCORRUPTED;
	}
	e->compressed_bootstrap = true;
	memcpy(e->compressed, oci->layers[oci->nr_layers - 1].digest, BLOB_DIGEST_SIZE);
	e->compressed_size = oci->layers[oci->nr_layers - 1].size;
	s = oci_annotation(json_object_array_get_idx(layers, oci->nr_layers - 1),
			   FERRY_BOOTSTRAP_DIGEST_ANNOTATION);
	if (!s || digest_parse(s, e->bootstrap)) {
		ferry_err("%s: bootstrap layer lacks a valid %s annotation", ref,
			  FERRY_BOOTSTRAP_DIGEST_ANNOTATION);
		return -EFSCORRUPTED;
	}
	ret = 0;
	if (oci->layout) {
		img->dir = strdup(oci->layout);
		ret = img->dir ? oci_blob_path(oci->layout, e->compressed,
					       &e->compressed_path) : -ENOMEM;
	}
	if (!ret)
		ret = expect_blobs(e, oci->nr_layers - 1);
	for (i = 0; !ret && i + 1 < oci->nr_layers; i++) {
		if (!oci_is_ferry_blob(oci->layers[i].media_type)) {
			ferry_err("%s: layer %u is %s, expected %s", ref, i,
				  oci->layers[i].media_type, FERRY_BLOB_MEDIA_TYPE);
			ret = -EFSCORRUPTED;
		}
		memcpy(e->blobs[i], oci->layers[i].digest, BLOB_DIGEST_SIZE);
	}
	if (!ret && json_object_object_get_ex(oci->manifest, "annotations", &ann)) {
		s = json_get_string(ann, "dev.ferry.chunk-size");
		img->chunk_size = s ? (uint32_t)strtoul(s, NULL, 10) : 0;
		s = json_get_string(ann, "dev.ferry.compression");
		snprintf(img->compression, sizeof(img->compression), "%s", s ? s : "?");
	}
	return ret;
}

/*
 * oci:PATH[:TAG] and docker://REF — a manifest whose last layer is the
 * bootstrap. A registry image keeps its client in img->remote.
 */
static int locate_manifest(struct image *img, const struct image_ref *r,
			   const struct image_opts *opts, struct image_expect *e)
{
	struct oci_image oci;
	int ret;

	ret = r->transport == IMAGE_DOCKER ? oci_remote_open(r->path, opts, &oci) :
					     oci_image_open(r, opts->platform, opts->fetch, &oci);
	if (ret)
		return ret;
	if (opts->erofs_layers && oci_is_layers_image(&oci)) {
		ret = image_open_layers(img, &oci);
		oci_image_free(&oci);
		return ret;
	}
	/* An ordinary image is served through the ferry index attached to it. */
	if (oci.nr_layers && !oci_is_ferry_bootstrap(oci.layers[oci.nr_layers - 1].media_type) &&
	    !oci_is_layers_image(&oci))
		ret = image_index_expect(img, &oci, opts, e);
	else
		ret = image_expect_manifest(img, &oci, e);
	if (!ret) {
		img->remote = oci.remote; /* kept for blob reads */
		oci.remote = NULL;
	}
	oci_image_free(&oci);
	return ret;
}

/*
 * One frame that says its size (what ferry writes): decoded in one call
 * into a buffer of that size, without the stream's window buffer and its
 * second copy. 1 when the input is not such a frame.
 */
static int bootstrap_decompress_frame(const uint8_t *z, size_t zlen, const char *name,
				      uint8_t **data, size_t *len)
{
	unsigned long long size = ZSTD_getFrameContentSize(z, zlen);
	size_t n;

	if (size == ZSTD_CONTENTSIZE_UNKNOWN || size == ZSTD_CONTENTSIZE_ERROR ||
	    ZSTD_findFrameCompressedSize(z, zlen) != zlen)
		return 1;
	if (size > FERRY_BOOTSTRAP_MAX) {
		ferry_err("%s: bootstrap larger than %llu bytes", name,
			  (unsigned long long)FERRY_BOOTSTRAP_MAX);
		return -EFBIG;
	}
	*data = malloc(size ? (size_t)size : 1);
	if (!*data)
		return -ENOMEM;
	n = ZSTD_decompress(*data, (size_t)size, z, zlen);
	if (ZSTD_isError(n)) {
		ferry_err("%s: zstd: %s", name, ZSTD_getErrorName(n));
		free(*data);
		*data = NULL;
		return -EFSCORRUPTED;
	}
	*len = n;
	return 0;
}

/* One or more zstd frames, decoded to at most FERRY_BOOTSTRAP_MAX bytes. */
static int bootstrap_decompress(const uint8_t *z, size_t zlen, const char *name,
				uint8_t **data, size_t *len)
{
	ZSTD_DStream *ds;
	ZSTD_inBuffer in = { z, zlen, 0 };
	size_t cap = 0, left;
	int ret;

	*data = NULL;
	*len = 0;
	ret = bootstrap_decompress_frame(z, zlen, name, data, len);
	if (ret <= 0)
		return ret;
	ret = 0;
	ds = ZSTD_createDStream();
	if (!ds)
		return -ENOMEM;
	for (;;) {
		ZSTD_outBuffer out;

		if (array_reserve(data, &cap, *len + 65536, 1, 1 << 20)) {
			ret = -ENOMEM;
			break;
		}
		out = (ZSTD_outBuffer){ *data, cap, *len };
		left = ZSTD_decompressStream(ds, &out, &in);
		if (ZSTD_isError(left)) {
			ferry_err("%s: zstd: %s", name, ZSTD_getErrorName(left));
			ret = -EFSCORRUPTED;
			break;
		}
		*len = out.pos;
		if (*len > FERRY_BOOTSTRAP_MAX) {
			ferry_err("%s: bootstrap larger than %llu bytes", name,
				  (unsigned long long)FERRY_BOOTSTRAP_MAX);
			ret = -EFBIG;
			break;
		}
		/* All input read and output to spare: nothing more will come. */
		if (in.pos == in.size && out.pos < out.size) {
			if (left) {
				ferry_err("%s: zstd: truncated frame", name);
				ret = -EFSCORRUPTED;
			}
			break;
		}
	}
	ZSTD_freeDStream(ds);
	if (ret) {
		free(*data);
		*data = NULL;
	}
	return ret;
}

/*
 * The bootstrap blob: read from the layout, or fetched whole from the
 * registry (which checks the digest), then checked against its
 * descriptor and decompressed.
 */
static int load_compressed(struct image *img, const struct image_expect *e,
			   const char *name, uint8_t **data, size_t *len)
{
	struct fetch_buf z = { 0 };
	uint8_t digest[BLOB_DIGEST_SIZE];
	char *raw = NULL;
	int ret;

	if (img->remote) {
		ret = registry_get_blob(img->remote, e->compressed, e->compressed_size,
					FERRY_BOOTSTRAP_MAX, &z);
	} else {
		ret = read_file_max(e->compressed_path, FERRY_BOOTSTRAP_MAX, &raw,
				    &z.len);
		z.data = (uint8_t *)raw;
		if (!ret) {
			sha256_buf(z.data, z.len, digest);
			if (memcmp(digest, e->compressed, BLOB_DIGEST_SIZE)) {
				ferry_err("%s: content does not match its digest", name);
				ret = -EFSCORRUPTED;
			}
		}
	}
	if (!ret)
		ret = bootstrap_decompress(z.data, z.len, name, data, len);
	fetch_buf_free(&z);
	return ret;
}

/* CACHE/bootstraps/<sha256 of the raw bootstrap>, in img->bootstrap_path. */
static int bootstrap_cache_path(struct image *img, const char *cache_dir)
{
	char hex[2 * BLOB_DIGEST_SIZE + 1];

	hex_encode(img->bootstrap_digest, BLOB_DIGEST_SIZE, hex);
	if (asprintf(&img->bootstrap_path, "%s/" IMAGE_BOOTSTRAPS_DIR "/%s", cache_dir,
		     hex) < 0) {
		img->bootstrap_path = NULL;
		return -ENOMEM;
	}
	return 0;
}

/*
 * @fd (-1: none) is that file, just read and checked or just written from
 * the checked bytes: what image_bootstrap_file gives the kernel, without
 * reading it again.
 */
static void bootstrap_file_known(struct image *img, const char *cache_dir, int fd)
{
	if (fd < 0)
		return;
	if (bootstrap_cache_path(img, cache_dir)) {
		close(fd);
		return;
	}
	img->bootstrap_fd = fd;
}

/*
 * Load the bootstrap's bytes; they must hash to the digest the index
 * promises. A registry's is kept raw in @cache_dir (if any) and taken
 * from there the next time.
 */
static int load_bootstrap(struct image *img, const struct image_expect *e,
			  const char *cache_dir)
{
	const char *name = e->compressed_path ? e->compressed_path :
			   img->bootstrap_path ? img->bootstrap_path : img->ref;
	uint8_t actual[BLOB_DIGEST_SIZE];
	int ret, fd;

	if (!img->remote)
		cache_dir = NULL;
	if (cache_dir && !image_cached_read(cache_dir, IMAGE_BOOTSTRAPS_DIR, e->bootstrap,
					    FERRY_BOOTSTRAP_MAX, &img->bootstrap,
					    &img->bootstrap_len, &fd)) {
		memcpy(img->bootstrap_digest, e->bootstrap, sizeof(actual));
		bootstrap_file_known(img, cache_dir, fd);
		return 0;
	}
	if (e->compressed_bootstrap) {
		ret = load_compressed(img, e, name, &img->bootstrap, &img->bootstrap_len);
	} else {
		char *raw = NULL;

		ret = read_file_max(img->bootstrap_path, FERRY_BOOTSTRAP_MAX, &raw,
				    &img->bootstrap_len);
		img->bootstrap = (uint8_t *)raw;
	}
	if (ret) {
		ferry_err("%s: bootstrap: %s", name, ferry_strerror(ret));
		return ret;
	}
	sha256_buf(img->bootstrap, img->bootstrap_len, actual);
	if (memcmp(actual, e->bootstrap, BLOB_DIGEST_SIZE)) {
		ferry_err("%s: sha256 does not match the image index", name);
		return -EFSCORRUPTED;
	}
	memcpy(img->bootstrap_digest, actual, sizeof(actual));
	if (cache_dir) {
		image_cached_keep(cache_dir, IMAGE_BOOTSTRAPS_DIR, actual, img->bootstrap,
				  img->bootstrap_len, &fd);
		bootstrap_file_known(img, cache_dir, fd);
	}
	return 0;
}

/*
 * Device table, blob index and image index must describe the same blobs:
 * a ferry image's blobs in order; for an ordinary image with a ferry index
 * (e->index) stream blobs of some of its layers, in layer order, each of
 * the layer's size, read from the image's own layout or repository.
 */
static int image_match_devices(struct image *img, const struct image_expect *e)
{
	struct meta_super sb;
	uint32_t i, k = 0;

	meta_get_super(img->meta, &sb);
	if (sb.nr_devices != img->blobs.nr_blobs ||
	    (!e->index && e->nr_blobs != sb.nr_devices)) {
		ferry_err("%s: %u devices, %u blobs in the blob index, %u in the image index",
			  img->ref, sb.nr_devices, img->blobs.nr_blobs,
			  e->index ? e->nr_layers : e->nr_blobs);
		return -EFSCORRUPTED;
	}
	for (i = 0; i < sb.nr_devices; i++) {
		const struct blob_info *b = &img->blobs.blobs[i];
		struct meta_device_info dev;
		char hex[2 * BLOB_DIGEST_SIZE + 1];
		int ret = meta_get_device(img->meta, i + 1, &dev);
		bool ok;

		if (ret)
			return ret;
		hex_encode(b->digest, BLOB_DIGEST_SIZE, hex);
		ok = !strcmp(dev.tag, hex) &&
		     (uint64_t)dev.blocks * META_BLOCK_SIZE == b->uncompressed_size;
		if (e->index) {
			while (k < e->nr_layers && memcmp(e->layers[k].digest, b->digest, 32))
				k++;
			ok = ok && k < e->nr_layers && (b->flags & BLOB_INFO_STREAM) &&
			     b->size == e->layers[k].size &&
			     blob_streams_find(&img->streams, i);
			k++;
		} else {
			ok = ok && !memcmp(e->blobs[i], b->digest, BLOB_DIGEST_SIZE) &&
			     !(b->flags & BLOB_INFO_STREAM);
		}
		if (!ok) {
			ferry_err("%s: device %u (%s) does not match blob sha256:%s%s",
				  img->ref, i + 1, dev.tag, hex,
				  e->index ? ", one of the image's layers in order: index the image again" : "");
			return -EFSCORRUPTED;
		}
		if (!img->remote &&
		    asprintf(&img->blob_paths[i], "%s/blobs/sha256/%s", img->dir, hex) < 0)
			return -ENOMEM;
	}
	return 0;
}

int image_blob_sources_init(struct image *img)
{
	img->blob_srcs = calloc(img->blobs.nr_blobs + 1, sizeof(*img->blob_srcs));
	if (!img->blob_srcs)
		return -ENOMEM;
	for (uint32_t i = 0; i < img->blobs.nr_blobs; i++)
		img->blob_srcs[i] = (struct image_blob){ img, i, -1 };
	return 0;
}

/*
 * A ferry image: its bootstrap loaded and checked against @e, opened, its
 * blob index and the sections after it decoded, the devices matched.
 */
static int open_bootstrap(struct image *img, const struct image_expect *e,
			  const char *cache_dir)
{
	const void *ext, *area;
	size_t ext_len, used, area_len;
	int ret = load_bootstrap(img, e, cache_dir);

	if (ret)
		return ret;
	ret = meta_image_open_mem(img->bootstrap, img->bootstrap_len, &img->meta);
	if (ret) {
		ferry_err("%s: cannot open bootstrap: %s", img->ref, ferry_strerror(ret));
		return ret;
	}
	ret = meta_get_ext(img->meta, &ext, &ext_len);
	if (!ret)
		ret = blob_index_decode_prefix(ext, ext_len, &img->blobs, &used);
	if (ret) {
		ferry_err("%s: no valid ferry blob index in the bootstrap: %s", img->ref,
			  ferry_strerror(ret));
		return ret;
	}
	/* What may follow: a prefetch list, then the loader dependencies
	 * (docs/FORMAT.md 2.5, 2.6). */
	if (!ret && used < ext_len && ext_len - used >= 8 &&
	    !memcmp((const uint8_t *)ext + used, PREFETCH_MAGIC, 8)) {
		size_t n = 0;

		ret = prefetch_section_decode((const uint8_t *)ext + used,
					      ext_len - used, &img->prefetch,
					      &img->nr_prefetch, &n);
		used += n;
	}
	if (!ret && used < ext_len)
		ret = elf_section_decode((const uint8_t *)ext + used,
					 ext_len - used, &img->elf, &img->nr_elf);
	if (ret) {
		ferry_err("%s: the bootstrap's extension payload is corrupt",
			  img->ref);
		return ret;
	}
	meta_get_sections(img->meta, &area, &area_len);
	ret = image_sections_decode(img, area, area_len);
	if (ret)
		return ret;
	/* Stream blobs decode from their resume points (FORMAT.md 2.8). */
	for (uint32_t i = 0; !img->streams.nr && i < img->blobs.nr_blobs; i++)
		if (img->blobs.blobs[i].flags & BLOB_INFO_STREAM) {
			ferry_err("%s: the bootstrap has stream blobs but no resume points section",
				  img->ref);
			return -EFSCORRUPTED;
		}
	img->blob_paths = calloc(img->blobs.nr_blobs + 1, sizeof(char *));
	if (!img->blob_paths)
		return -ENOMEM;
	ret = image_blob_sources_init(img);
	return ret ? ret : image_match_devices(img, e);
}

int image_open(const char *ref, const struct image_opts *opts,
	       struct image **out)
{
	static const struct image_opts no_opts;
	struct image *img = calloc(1, sizeof(*img));
	struct image_expect expect = { 0 };
	struct image_ref r = { 0 };
	struct stat st;
	int ret;

	if (!img)
		return -ENOMEM;
	img->bootstrap_fd = -1;
	img->ref = strdup(ref);
	if (!img->ref) {
		ret = -ENOMEM;
		goto fail;
	}
	if (!opts)
		opts = &no_opts;
	ret = image_ref_parse(ref, IMAGE_ACCEPT_IMAGE, "image", &r);
	if (ret)
		goto fail;
	if (r.transport == IMAGE_DOCKER) {
		/* Messages and progress name it as normalised. */
		free(img->ref);
		if (asprintf(&img->ref, "docker://%s", r.path) < 0) {
			img->ref = NULL;
			ret = -ENOMEM;
			goto fail;
		}
	}
	if (r.transport != IMAGE_DIR) {
		ret = locate_manifest(img, &r, opts, &expect);
	} else {
		img->dir = strdup(r.path);
		if (!img->dir) {
			ret = -ENOMEM;
			goto fail;
		}
		if (stat(img->dir, &st) || !S_ISDIR(st.st_mode)) {
			ferry_err("image %s: %s is not a directory", ref, img->dir);
			ret = -ENOENT;
			goto fail;
		}
		ret = locate_dir(img, &expect);
	}
	/* A dir: image is named by its bootstrap's digest (load_bootstrap
	 * checks the bytes). A takeover must serve the image the kernel
	 * was served. */
	if (!ret && r.transport == IMAGE_DIR)
		memcpy(img->image_digest, expect.bootstrap, BLOB_DIGEST_SIZE);
	if (!ret && opts->digest &&
	    memcmp(opts->digest, img->image_digest, BLOB_DIGEST_SIZE)) {
		char was[DIGEST_STRING_SIZE], now[DIGEST_STRING_SIZE];

		digest_format(opts->digest, was);
		digest_format(img->image_digest, now);
		ferry_err("%s is now %s, not %s: the image changed since it was mounted",
			  ref, now, was);
		ret = -ESTALE;
	}
	if (!ret)
		ret = img->erofs_layers ? 0 : open_bootstrap(img, &expect, opts->cache_dir);
	if (ret)
		goto fail;
	image_expect_free(&expect);
	image_ref_free(&r);
	*out = img;
	return 0;
fail:
	image_expect_free(&expect);
	image_ref_free(&r);
	image_close(img);
	return ret;
}

void image_close(struct image *img)
{
	uint32_t i;

	if (!img)
		return;
	for (i = 0; img->blob_paths && i < img->blobs.nr_blobs; i++)
		free(img->blob_paths[i]);
	for (i = 0; img->blob_srcs && i < img->blobs.nr_blobs; i++)
		if (img->blob_srcs[i].fd >= 0)
			close(img->blob_srcs[i].fd);
	free(img->blob_paths);
	free(img->blob_srcs);
	free(img->layer_meta);
	for (i = 0; img->layer_units && i < img->blobs.nr_blobs; i++)
		free(img->layer_units[i]);
	free(img->layer_units);
	free(img->nr_layer_units);
	image_prefetch_list_free(img->prefetch, img->nr_prefetch);
	image_elf_entries_free(img->elf, img->nr_elf);
	free(img->writer);
	free(img->index_layers);
	free(img->index_diff_ids);
	free(img->sections);
	if (img->remote)
		registry_close(img->remote);
	blob_streams_free(&img->streams);
	blob_index_free(&img->blobs);
	if (img->meta)
		meta_image_close(img->meta);
	free(img->bootstrap);
	if (img->bootstrap_fd >= 0)
		close(img->bootstrap_fd);
	free(img->bootstrap_path);
	free(img->dir);
	free(img->ref);
	free(img);
}

/* ------------------------------------------------------------------ */
/* Blob bytes                                                          */
/* ------------------------------------------------------------------ */

static int image_blob_read(void *ctx, uint64_t off, void *buf, size_t len)
{
	const struct image_blob *ib = ctx;
	const struct image *img = ib->img;

	if (img->remote)
		return registry_get_range(img->remote, img->blobs.blobs[ib->index].digest,
					  off, len, buf);
	return pread_full(ib->fd, buf, len, off);
}

void image_blob_name(const struct image *img, uint32_t index, char *buf,
		     size_t len)
{
	char hex[2 * BLOB_DIGEST_SIZE + 1];

	if (!img->remote) {
		snprintf(buf, len, "%s", img->blob_paths[index]);
		return;
	}
	hex_encode(img->blobs.blobs[index].digest, BLOB_DIGEST_SIZE, hex);
	snprintf(buf, len, "%s@sha256:%s", registry_name(img->remote), hex);
}

int image_blob_source(struct image *img, uint32_t index, struct blob_source *src)
{
	struct image_blob *ib = &img->blob_srcs[index];

	if (!img->remote && ib->fd < 0) {
		ib->fd = open(img->blob_paths[index], O_RDONLY | O_CLOEXEC);
		if (ib->fd < 0) {
			int ret = -errno;

			ferry_err("%s: %s", img->blob_paths[index], strerror(errno));
			return ret;
		}
	}
	*src = (struct blob_source){ image_blob_read, ib,
				     blob_streams_find(&img->streams, index) };
	return 0;
}

/* ------------------------------------------------------------------ */
/* Local mode                                                          */
/* ------------------------------------------------------------------ */

/*
 * Open @name (relative to @dir_fd, never through a symlink) and check that
 * it holds exactly the verified bootstrap bytes: 0 and *@fd, or -errno
 * (-EFSCORRUPTED: different bytes). Compared byte for byte with the
 * in-memory copy, which was checked against the bootstrap digest: as
 * strong as re-hashing and no slower.
 */
static int open_verified(const struct image *img, int dir_fd, const char *name,
			 int *fd)
{
	uint8_t *buf = NULL;
	struct stat st;
	int ret;

	*fd = openat(dir_fd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (*fd < 0)
		return -errno;
	if (fstat(*fd, &st))
		ret = -errno;
	else if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size != img->bootstrap_len)
		ret = -EFSCORRUPTED;
	else if (!(buf = malloc(MAX(img->bootstrap_len, (size_t)1))))
		ret = -ENOMEM;
	else if (!(ret = pread_full(*fd, buf, img->bootstrap_len, 0)) &&
		 memcmp(buf, img->bootstrap, img->bootstrap_len))
		ret = -EFSCORRUPTED;
	free(buf);
	if (ret) {
		close(*fd);
		*fd = -1;
	}
	return ret;
}

int image_cached_read(const char *cache_dir, const char *sub,
		      const uint8_t digest[32], size_t max, uint8_t **data,
		      size_t *len, int *fd_out)
{
	char hex[2 * BLOB_DIGEST_SIZE + 1];
	uint8_t got[BLOB_DIGEST_SIZE], *buf = NULL;
	int dir_fd = -1, fd = -1, ret;
	struct stat st;

	hex_encode(digest, BLOB_DIGEST_SIZE, hex);
	/* Only a directory root alone can write; no link, FIFO or device. */
	ret = blob_cache_dir(cache_dir, sub, false, &dir_fd);
	if (!ret) {
		fd = openat(dir_fd, hex, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
		ret = fd < 0 ? -errno : fstat(fd, &st) ? -errno : 0;
	}
	if (!ret && (!S_ISREG(st.st_mode) || (uint64_t)st.st_size > max))
		ret = -EFSCORRUPTED;
	if (!ret && !(buf = malloc((size_t)st.st_size + 1)))
		ret = -ENOMEM;
	if (!ret)
		ret = pread_full(fd, buf, (size_t)st.st_size, 0);
	if (!ret) {
		sha256_buf(buf, (size_t)st.st_size, got);
		if (memcmp(got, digest, BLOB_DIGEST_SIZE))
			ret = -EFSCORRUPTED;
	}
	if (ret == -EFSCORRUPTED) {
		ferry_warn("%s/%s/%s does not hold sha256:%s; fetching it again", cache_dir,
			   sub, hex, hex);
		unlinkat(dir_fd, hex, 0);
	}
	if (!ret) {
		buf[st.st_size] = '\0';
		*data = buf;
		*len = (size_t)st.st_size;
		buf = NULL;
		if (fd_out) {
			*fd_out = fd;
			fd = -1;
		}
	} else if (ret != -EFSCORRUPTED && ret != -ENOMEM) {
		ret = -ENOENT;
	}
	free(buf);
	if (fd >= 0)
		close(fd);
	if (dir_fd >= 0)
		close(dir_fd);
	return ret;
}

void image_cached_keep(const char *cache_dir, const char *sub,
		       const uint8_t digest[32], const void *data, size_t len,
		       int *fd_out)
{
	struct atomic_file af = { .fd = -1, .dir_fd = -1 };
	char hex[2 * BLOB_DIGEST_SIZE + 1], *dir = NULL;
	int dir_fd = -1, fd = -1, ret;

	hex_encode(digest, BLOB_DIGEST_SIZE, hex);
	ret = blob_cache_dir(cache_dir, sub, true, &dir_fd);
	/* Content-addressed: one there is this (a wrong one was removed). */
	if (!ret && !faccessat(dir_fd, hex, F_OK, AT_SYMLINK_NOFOLLOW))
		goto out;
	if (!ret)
		ret = asprintf(&dir, "%s/%s", cache_dir, sub) < 0 ? -ENOMEM : 0;
	if (!ret)
		ret = atomic_file_create(&af, dir, hex, 0600);
	if (!ret) {
		af.unsynced = true;
		ret = write_full(af.fd, data, len);
	}
	/* The file just written, read-only (O_EXCL made it ours). */
	if (!ret && fd_out &&
	    (fd = openat(af.dir_fd, af.tmp, O_RDONLY | O_NOFOLLOW | O_CLOEXEC)) < 0)
		ret = -errno;
	if (!ret)
		ret = atomic_file_commit(&af, hex);
	if (ret)
		ferry_warn("%s/%s/%s: cannot keep a copy (%s); it will be fetched again next time",
			   cache_dir, sub, hex, ferry_strerror(ret));
out:
	atomic_file_discard(&af);
	if (ret && fd >= 0) {
		close(fd);
		fd = -1;
	}
	if (fd_out)
		*fd_out = fd;
	free(dir);
	if (dir_fd >= 0)
		close(dir_fd);
}

/*
 * The kernel mounts a file: the image's own bootstrap (dir:), or for an
 * oci: or docker: image, whose bootstrap is stored compressed, its raw
 * bytes in CACHE/bootstraps/<sha256> (content-addressed, reused). Either
 * way the file is opened once and checked, and mounted through that
 * descriptor; a cached copy the image was loaded from or written to
 * (load_bootstrap) was checked then, through the descriptor kept. A
 * cached copy lives in a directory only root can write (blob_cache_dir),
 * so nobody else can plant or change one; it is checked anyway, as a
 * disk or a bug can still damage it.
 */
int image_bootstrap_file(struct image *img, const char *cache_dir)
{
	char hex[2 * BLOB_DIGEST_SIZE + 1], *dir = NULL;
	int dir_fd = -1, ret, attempt;

	if (img->bootstrap_fd >= 0)
		return 0;
	if (img->bootstrap_path) {
		ret = open_verified(img, AT_FDCWD, img->bootstrap_path,
				    &img->bootstrap_fd);
		if (ret)
			ferry_err("%s: %s since the image was opened; mount it again",
				  img->bootstrap_path, ret == -EFSCORRUPTED ?
				  "changed" : ferry_strerror(ret));
		return ret;
	}
	hex_encode(img->bootstrap_digest, BLOB_DIGEST_SIZE, hex);
	if (asprintf(&dir, "%s/" IMAGE_BOOTSTRAPS_DIR, cache_dir) < 0)
		return -ENOMEM;
	if (bootstrap_cache_path(img, cache_dir)) {
		free(dir);
		return -ENOMEM;
	}
	ret = blob_cache_dir(cache_dir, IMAGE_BOOTSTRAPS_DIR, true, &dir_fd);
	for (attempt = 0; !ret; attempt++) {
		ret = open_verified(img, dir_fd, hex, &img->bootstrap_fd);
		if (!ret || attempt || (ret != -ENOENT && ret != -EFSCORRUPTED))
			break;
		if (ret == -EFSCORRUPTED)
			ferry_warn("%s does not hold the image's bootstrap (sha256:%s); replacing it",
				   img->bootstrap_path, hex);
		ret = write_file_atomic(dir, hex, img->bootstrap,
					img->bootstrap_len, 0600);
	}
	if (ret)
		ferry_err("%s: cannot provide the bootstrap for mounting: %s",
			  img->bootstrap_path, ferry_strerror(ret));
	if (dir_fd >= 0)
		close(dir_fd);
	free(dir);
	return ret;
}

int image_copy_blob(struct image *img, uint32_t index, const char *layout)
{
	const struct blob_info *b = &img->blobs.blobs[index];
	struct atomic_file af = { .fd = -1, .dir_fd = -1 };
	struct fetch_stream *fs = NULL;
	char *path = NULL, *dir = NULL, hex[2 * BLOB_DIGEST_SIZE + 1];
	uint8_t *buf = NULL;
	ssize_t n;
	int ret;

	if (!img->remote)
		return oci_link_blob(img->blob_paths[index], layout, b->digest);
	ret = oci_blob_path(layout, b->digest, &path);
	if (ret)
		return ret;
	if (!access(path, F_OK))
		goto out; /* content-addressed: already there */
	hex_encode(b->digest, BLOB_DIGEST_SIZE, hex);
	buf = malloc(1 << 20);
	if (!buf || asprintf(&dir, "%s/blobs/sha256", layout) < 0) {
		dir = NULL;
		ret = -ENOMEM;
		goto out;
	}
	ret = atomic_file_create(&af, dir, hex, 0644);
	if (!ret)
		ret = registry_open_stream(img->remote, b->digest, b->size, &fs);
	/* The stream ends (n == 0) only after the digest matched. */
	while (!ret && (n = fetch_stream_read(fs, buf, 1 << 20)) != 0)
		ret = n < 0 ? (int)n : write_full(af.fd, buf, (size_t)n);
	if (!ret)
		ret = atomic_file_commit(&af, hex);
	if (ret)
		ferry_err("%s: cannot store blob: %s", path, ferry_strerror(ret));
out:
	fetch_stream_close(fs);
	atomic_file_discard(&af);
	free(dir);
	free(buf);
	free(path);
	return ret;
}
