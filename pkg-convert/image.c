// SPDX-License-Identifier: MIT
/*
 * Converted images on disk (dir:OUT): open and cross-check, verify
 * everything (ferry check), materialise and mount with the kernel.
 */
#include "convert.h"

#include <fcntl.h>
#include <json-c/json.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../pkg-base/base.h"
#include "internal.h"
#include "tar.h"

static int read_whole_file(const char *path, uint8_t **data, size_t *len)
{
	struct stat st;
	uint8_t *buf = NULL;
	int fd, ret;

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &st)) {
		ret = -errno;
		goto out;
	}
	buf = malloc(st.st_size ? (size_t)st.st_size : 1);
	if (!buf) {
		ret = -ENOMEM;
		goto out;
	}
	ret = read_full(fd, buf, (size_t)st.st_size);
	if (ret)
		goto out;
	*data = buf;
	*len = (size_t)st.st_size;
	buf = NULL;
out:
	free(buf);
	close(fd);
	return ret;
}

static const char *json_string_field(struct json_object *o, const char *key)
{
	struct json_object *v;

	if (!json_object_object_get_ex(o, key, &v) ||
	    !json_object_is_type(v, json_type_string))
		return NULL;
	return json_object_get_string(v);
}

/* What the image's index (ferry.json or OCI manifest) promises. */
struct image_expect {
	uint8_t bootstrap[BLOB_DIGEST_SIZE]; /* of the raw EROFS bytes */
	char *compressed_path;   /* oci: the zstd-compressed bootstrap blob */
	uint8_t compressed[BLOB_DIGEST_SIZE];
	uint32_t nr_blobs;
	uint8_t (*blobs)[BLOB_DIGEST_SIZE];
};

static int expect_blobs(struct image_expect *e, size_t n)
{
	e->nr_blobs = (uint32_t)n;
	e->blobs = calloc(n + 1, sizeof(*e->blobs));
	return e->blobs ? 0 : -ENOMEM;
}

/* dir:OUT — OUT/ferry.json. */
static int locate_dir(struct image *img, struct image_expect *e)
{
	struct json_object *root = NULL, *boot, *blobs, *v;
	char *index_path = NULL;
	const char *s;
	size_t i;
	int ret = -EFSCORRUPTED;

	if (asprintf(&img->bootstrap_path, "%s/bootstrap", img->dir) < 0 ||
	    asprintf(&index_path, "%s/ferry.json", img->dir) < 0)
		return -ENOMEM;
	root = json_object_from_file(index_path);
	if (!root) {
		ferry_err("%s: cannot read or parse: %s", index_path,
			  json_util_get_last_err());
		ret = access(index_path, F_OK) ? -ENOENT : -EFSCORRUPTED;
		goto out;
	}
	if (!json_object_object_get_ex(root, "schemaVersion", &v) ||
	    json_object_get_int(v) != 1) {
		ferry_err("%s: unsupported schemaVersion (expected 1)", index_path);
		goto out;
	}
	if (!json_object_object_get_ex(root, "bootstrap", &boot) ||
	    !(s = json_string_field(boot, "digest")) ||
	    oci_parse_digest(s, e->bootstrap)) {
		ferry_err("%s: missing or malformed bootstrap digest", index_path);
		goto out;
	}
	if (!json_object_object_get_ex(root, "blobs", &blobs) ||
	    !json_object_is_type(blobs, json_type_array)) {
		ferry_err("%s: missing blob list", index_path);
		goto out;
	}
	ret = expect_blobs(e, json_object_array_length(blobs));
	for (i = 0; !ret && i < e->nr_blobs; i++) {
		s = json_string_field(json_object_array_get_idx(blobs, i), "digest");
		if (!s || oci_parse_digest(s, e->blobs[i])) {
			ferry_err("%s: blob %zu has a malformed digest", index_path, i);
			ret = -EFSCORRUPTED;
		}
	}
	if (json_object_object_get_ex(root, "chunkSize", &v))
		img->chunk_size = (uint32_t)json_object_get_int64(v);
	s = json_string_field(root, "compression");
	snprintf(img->compression, sizeof(img->compression), "%s", s ? s : "?");
out:
	json_object_put(root);
	free(index_path);
	return ret;
}

/* oci:PATH[:TAG] — a manifest whose last layer is the bootstrap. */
static int locate_oci(struct image *img, const char *ref, struct image_expect *e)
{
	struct oci_image oci;
	struct json_object *ann, *layers;
	const char *s;
	uint32_t i;
	int ret;

	ret = oci_image_open(ref, NULL, &oci);
	if (ret)
		return ret;
	json_object_object_get_ex(oci.manifest, "layers", &layers);
	free(img->dir);
	img->dir = strdup(oci.layout);
	ret = -EFSCORRUPTED;
	if (!img->dir) {
		ret = -ENOMEM;
		goto out;
	}
	if (!oci.nr_layers ||
	    strcmp(oci.layers[oci.nr_layers - 1].media_type, FERRY_BOOTSTRAP_MEDIA_TYPE)) {
		ferry_err("%s: not a ferry image (the last layer is not a %s)", ref,
			  FERRY_BOOTSTRAP_MEDIA_TYPE);
		goto out;
	}
	memcpy(e->compressed, oci.layers[oci.nr_layers - 1].digest, BLOB_DIGEST_SIZE);
	s = oci_annotation(json_object_array_get_idx(layers, oci.nr_layers - 1),
			   FERRY_BOOTSTRAP_DIGEST_ANNOTATION);
	if (!s || oci_parse_digest(s, e->bootstrap)) {
		ferry_err("%s: bootstrap layer lacks a valid %s annotation", ref,
			  FERRY_BOOTSTRAP_DIGEST_ANNOTATION);
		goto out;
	}
	ret = oci_blob_path(oci.layout, e->compressed, &e->compressed_path);
	if (!ret)
		ret = expect_blobs(e, oci.nr_layers - 1);
	for (i = 0; !ret && i + 1 < oci.nr_layers; i++) {
		if (strcmp(oci.layers[i].media_type, FERRY_BLOB_MEDIA_TYPE)) {
			ferry_err("%s: layer %u is %s, expected %s", ref, i,
				  oci.layers[i].media_type, FERRY_BLOB_MEDIA_TYPE);
			ret = -EFSCORRUPTED;
		}
		memcpy(e->blobs[i], oci.layers[i].digest, BLOB_DIGEST_SIZE);
	}
	if (!ret && json_object_object_get_ex(oci.manifest, "annotations", &ann)) {
		s = json_string_field(ann, "dev.ferry.chunk-size");
		img->chunk_size = s ? (uint32_t)strtoul(s, NULL, 10) : 0;
		s = json_string_field(ann, "dev.ferry.compression");
		snprintf(img->compression, sizeof(img->compression), "%s", s ? s : "?");
	}
out:
	oci_image_free(&oci);
	return ret;
}

/* Decompress the oci: bootstrap blob (its digest checked while reading). */
static int load_compressed(const struct image_expect *e, uint8_t **data,
			   size_t *len)
{
	struct input_stream *in = NULL;
	struct byte_source src;
	size_t cap = 0;
	ssize_t n;
	int ret;

	*data = NULL;
	*len = 0;
	ret = input_open_verified(e->compressed_path, e->compressed,
				  e->compressed_path, &in);
	if (ret)
		return ret;
	src = input_source(in);
	for (;;) {
		if (array_reserve(data, &cap, *len + 65536, 1, 1 << 20)) {
			ret = -ENOMEM;
			break;
		}
		n = src.read(src.ctx, *data + *len, cap - *len);
		if (n <= 0) {
			ret = (int)n;
			break;
		}
		*len += (size_t)n;
		if (*len > FERRY_BOOTSTRAP_MAX) {
			ferry_err("%s: bootstrap larger than %llu bytes", e->compressed_path,
				  (unsigned long long)FERRY_BOOTSTRAP_MAX);
			ret = -EFBIG;
			break;
		}
	}
	input_close(in);
	if (ret) {
		free(*data);
		*data = NULL;
	}
	return ret;
}

/* Load the bootstrap's bytes; they must hash to the digest the index promises. */
static int load_bootstrap(struct image *img, const struct image_expect *e)
{
	const char *name = e->compressed_path ? e->compressed_path : img->bootstrap_path;
	uint8_t actual[BLOB_DIGEST_SIZE];
	int ret;

	if (e->compressed_path)
		ret = load_compressed(e, &img->bootstrap, &img->bootstrap_len);
	else
		ret = read_whole_file(img->bootstrap_path, &img->bootstrap,
				      &img->bootstrap_len);
	if (ret) {
		ferry_err("%s: %s", name, ferry_strerror(ret));
		return ret;
	}
	blob_sha256(img->bootstrap, img->bootstrap_len, actual);
	if (memcmp(actual, e->bootstrap, BLOB_DIGEST_SIZE)) {
		ferry_err("%s: sha256 does not match the image index", name);
		return -EFSCORRUPTED;
	}
	memcpy(img->bootstrap_digest, actual, sizeof(actual));
	return 0;
}

/* Device table, blob index and image index must describe the same blobs. */
static int image_match_devices(struct image *img, const struct image_expect *e)
{
	struct meta_super sb;
	uint32_t i;

	meta_get_super(img->meta, &sb);
	if (sb.nr_devices != img->blobs.nr_blobs || e->nr_blobs != sb.nr_devices) {
		ferry_err("%s: %u devices, %u blobs in the blob index, %u in the image index",
			  img->ref, sb.nr_devices, img->blobs.nr_blobs,
			  e->nr_blobs);
		return -EFSCORRUPTED;
	}
	for (i = 0; i < sb.nr_devices; i++) {
		const struct blob_info *b = &img->blobs.blobs[i];
		struct meta_device_info dev;
		char hex[2 * BLOB_DIGEST_SIZE + 1];
		int ret = meta_get_device(img->meta, i + 1, &dev);

		if (ret)
			return ret;
		hex_encode(b->digest, BLOB_DIGEST_SIZE, hex);
		if (strcmp(dev.tag, hex) || memcmp(e->blobs[i], b->digest, BLOB_DIGEST_SIZE) ||
		    (uint64_t)dev.blocks * META_BLOCK_SIZE != b->uncompressed_size) {
			ferry_err("%s: device %u (%s) does not match blob sha256:%s",
				  img->ref, i + 1, dev.tag, hex);
			return -EFSCORRUPTED;
		}
		if (asprintf(&img->blob_paths[i], "%s/blobs/sha256/%s", img->dir,
			     hex) < 0)
			return -ENOMEM;
	}
	return 0;
}

int image_open(const char *ref, struct image **out)
{
	struct image *img = calloc(1, sizeof(*img));
	struct image_expect expect = { 0 };
	const void *ext;
	size_t ext_len;
	struct stat st;
	int ret;

	if (!img)
		return -ENOMEM;
	img->ref = strdup(ref);
	if (!img->ref) {
		ret = -ENOMEM;
		goto fail;
	}
	if (!strncmp(ref, "oci:", 4)) {
		ret = locate_oci(img, ref + 4, &expect);
	} else {
		/* dir:OUT, or a plain path meaning the same */
		img->dir = strdup(strncmp(ref, "dir:", 4) ? ref : ref + 4);
		if (!img->dir) {
			ret = -ENOMEM;
			goto fail;
		}
		if (strncmp(ref, "dir:", 4) && strchr(ref, ':') && ref[0] != '/' &&
		    ref[0] != '.') {
			ferry_err("image \"%s\": expected dir:PATH or oci:PATH[:TAG]", ref);
			ret = -EINVAL;
			goto fail;
		}
		if (stat(img->dir, &st) || !S_ISDIR(st.st_mode)) {
			ferry_err("image %s: %s is not a directory", ref, img->dir);
			ret = -ENOENT;
			goto fail;
		}
		ret = locate_dir(img, &expect);
	}
	if (!ret)
		ret = load_bootstrap(img, &expect);
	if (ret)
		goto fail;
	ret = meta_image_open_mem(img->bootstrap, img->bootstrap_len, &img->meta);
	if (ret) {
		ferry_err("%s: cannot open bootstrap: %s", img->ref, ferry_strerror(ret));
		goto fail;
	}
	ret = meta_get_ext(img->meta, &ext, &ext_len);
	if (!ret)
		ret = blob_index_decode(ext, ext_len, &img->blobs);
	if (ret) {
		ferry_err("%s: no valid ferry blob index in the bootstrap: %s", img->ref,
			  ferry_strerror(ret));
		goto fail;
	}
	img->blob_paths = calloc(img->blobs.nr_blobs + 1, sizeof(char *));
	if (!img->blob_paths) {
		ret = -ENOMEM;
		goto fail;
	}
	ret = image_match_devices(img, &expect);
	if (ret)
		goto fail;
	free(expect.blobs);
	free(expect.compressed_path);
	*out = img;
	return 0;
fail:
	free(expect.blobs);
	free(expect.compressed_path);
	image_close(img);
	return ret;
}

void image_close(struct image *img)
{
	uint32_t i;

	if (!img)
		return;
	if (img->blob_paths)
		for (i = 0; i < img->blobs.nr_blobs; i++)
			free(img->blob_paths[i]);
	free(img->blob_paths);
	blob_index_free(&img->blobs);
	if (img->meta)
		meta_image_close(img->meta);
	free(img->bootstrap);
	free(img->bootstrap_path);
	free(img->dir);
	free(img->ref);
	free(img);
}

/* ------------------------------------------------------------------ */
/* ferry check                                                         */
/* ------------------------------------------------------------------ */

struct checker {
	struct image *img;
	struct image_check_report *report;
	const char *path;
	uint8_t *buf; /* 2 * CHECK_BUF_SIZE: xattr names, then a value */
};

#define CHECK_BUF_SIZE 65536u

static int check_fail(struct checker *c, int err, const char *what)
{
	ferry_err("%s: %s: %s", c->img->ref, c->path, what);
	return err;
}

/* Each chunk index must name a blob chunk of exactly the right length. */
static int check_chunks(struct checker *c, const struct meta_stat *st)
{
	uint64_t i;
	int ret;

	for (i = 0; i < st->nr_chunks; i++) {
		uint64_t want = MIN((uint64_t)st->chunk_size,
				    st->size - i * st->chunk_size);
		const struct blob_chunk *bc;
		struct meta_chunk mc;
		char what[160];

		ret = meta_get_chunk(c->img->meta, st->nid, i, &mc);
		if (ret)
			return check_fail(c, ret, "unreadable chunk index");
		c->report->chunks++;
		if (mc.blkaddr == META_CHUNK_HOLE)
			continue;
		if (mc.device_id < 1 || mc.device_id > c->img->blobs.nr_blobs) {
			snprintf(what, sizeof(what), "chunk %llu names device %u",
				 (unsigned long long)i, mc.device_id);
			return check_fail(c, -EFSCORRUPTED, what);
		}
		bc = blob_find_chunk(&c->img->blobs.blobs[mc.device_id - 1],
				     (uint64_t)mc.blkaddr * META_BLOCK_SIZE);
		if (!bc || bc->usize != want) {
			snprintf(what, sizeof(what),
				 "chunk %llu (device %u block %u) matches no %llu-byte blob chunk",
				 (unsigned long long)i, mc.device_id, mc.blkaddr,
				 (unsigned long long)want);
			return check_fail(c, -EFSCORRUPTED, what);
		}
	}
	return 0;
}

static int check_xattrs(struct checker *c, uint64_t nid)
{
	char *names = (char *)c->buf, *name;
	uint8_t *value = c->buf + CHECK_BUF_SIZE;
	ssize_t len, vlen;

	len = meta_listxattr(c->img->meta, nid, names, CHECK_BUF_SIZE);
	if (len < 0)
		return check_fail(c, (int)len, "unreadable xattr names");
	for (name = names; name < names + len; name += strlen(name) + 1) {
		vlen = meta_getxattr(c->img->meta, nid, name, value, CHECK_BUF_SIZE);
		if (vlen < 0)
			return check_fail(c, (int)vlen, "unreadable xattr value");
	}
	return 0;
}

static int check_visit(void *ctx, const char *path, const struct meta_stat *st)
{
	struct checker *c = ctx;
	uint64_t off;
	ssize_t n;
	int ret;

	c->path = path;
	c->report->inodes++;
	ret = check_xattrs(c, st->nid);
	if (ret)
		return ret;
	switch (st->mode & S_IFMT) {
	case S_IFLNK:
		n = meta_readlink(c->img->meta, st->nid, (char *)c->buf, CHECK_BUF_SIZE);
		return n < 0 ? check_fail(c, (int)n, "unreadable symlink") : 0;
	case S_IFREG:
		if (st->nr_chunks)
			return check_chunks(c, st);
		for (off = 0; off < st->size; off += (uint64_t)n) {
			n = meta_read(c->img->meta, st->nid, off, c->buf, CHECK_BUF_SIZE);
			if (n <= 0)
				return check_fail(c, n < 0 ? (int)n : -EFSCORRUPTED,
						  "unreadable inline data");
		}
		return 0;
	default:
		return 0;
	}
}

int image_check(struct image *img, struct image_check_report *report)
{
	struct checker c = { .img = img, .report = report };
	uint32_t i;
	int ret;

	memset(report, 0, sizeof(*report));
	c.buf = malloc(2 * CHECK_BUF_SIZE);
	if (!c.buf)
		return -ENOMEM;
	ret = meta_walk(img->meta, check_visit, &c);
	for (i = 0; !ret && i < img->blobs.nr_blobs; i++) {
		struct blob_verify_report vr;

		ret = blob_verify_file(img->blob_paths[i], &img->blobs.blobs[i], &vr);
		if (!ret)
			report->bytes_verified += img->blobs.blobs[i].uncompressed_size;
	}
	report->error = ret;
	free(c.buf);
	return ret;
}

/* ------------------------------------------------------------------ */
/* Local mode                                                          */
/* ------------------------------------------------------------------ */

static int ensure_dir(const char *path)
{
	if (mkdir(path, 0700) && errno != EEXIST) {
		int ret = -errno;

		ferry_err("%s: cannot create directory: %s", path, strerror(errno));
		return ret;
	}
	return 0;
}

/*
 * The kernel mounts a file: an oci: bootstrap is stored compressed, so its
 * raw bytes go to CACHE/bootstraps/<sha256> (content-addressed, reused).
 */
static int ensure_bootstrap_file(struct image *img, const char *cache_dir)
{
	char hex[2 * BLOB_DIGEST_SIZE + 1], *dir = NULL;
	struct stat st;
	int ret;

	if (img->bootstrap_path)
		return 0;
	hex_encode(img->bootstrap_digest, BLOB_DIGEST_SIZE, hex);
	if (asprintf(&dir, "%s/bootstraps", cache_dir) < 0 ||
	    asprintf(&img->bootstrap_path, "%s/%s", dir, hex) < 0) {
		free(dir);
		img->bootstrap_path = NULL;
		return -ENOMEM;
	}
	ret = ensure_dir(dir);
	if (!ret && (stat(img->bootstrap_path, &st) ||
		     (uint64_t)st.st_size != img->bootstrap_len))
		ret = convert_write_file(dir, hex, img->bootstrap, img->bootstrap_len);
	free(dir);
	return ret;
}

int image_mount_local(struct image *img, const char *cache_dir,
		      const char *target)
{
	char **devs = calloc(img->blobs.nr_blobs + 1, sizeof(char *));
	char *dev_dir = NULL;
	struct stat st;
	uint32_t i;
	int ret;

	if (!devs)
		return -ENOMEM;
	if (stat(target, &st) || !S_ISDIR(st.st_mode)) {
		ferry_err("mount point %s: not a directory", target);
		ret = -ENOTDIR;
		goto out;
	}
	if (asprintf(&dev_dir, "%s/devices", cache_dir) < 0) {
		ret = -ENOMEM;
		goto out;
	}
	ret = ensure_dir(cache_dir);
	if (!ret)
		ret = ensure_dir(dev_dir);
	if (ret)
		goto out;
	for (i = 0; i < img->blobs.nr_blobs; i++) {
		const struct blob_info *b = &img->blobs.blobs[i];
		char hex[2 * BLOB_DIGEST_SIZE + 1];

		hex_encode(b->digest, BLOB_DIGEST_SIZE, hex);
		if (asprintf(&devs[i], "%s/%s", dev_dir, hex) < 0) {
			ret = -ENOMEM;
			goto out;
		}
		/* Devices appear only by rename after full verification. */
		if (!stat(devs[i], &st) && S_ISREG(st.st_mode) &&
		    (uint64_t)st.st_size == b->uncompressed_size)
			continue;
		ret = blob_materialize(img->blob_paths[i], b, devs[i]);
		if (ret)
			goto out;
	}
	ret = ensure_bootstrap_file(img, cache_dir);
	if (ret)
		goto out;
	ret = meta_kernel_mount(img->bootstrap_path, (const char *const *)devs,
				img->blobs.nr_blobs, target);
out:
	for (i = 0; i < img->blobs.nr_blobs; i++)
		free(devs[i]);
	free(devs);
	free(dev_dir);
	return ret;
}
