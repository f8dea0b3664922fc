// SPDX-License-Identifier: MIT
/*
 * Ferry indexes of ordinary images (docs/FORMAT.md 1e): `ferry index`
 * writes a bootstrap whose devices are the image's own layers (stream
 * blobs), and this file attaches it to the image as an OCI artifact
 * whose subject is the image's manifest — into the image's OCI layout
 * (an untagged index.json entry with its artifactType) or its registry
 * repository (pushed by digest; found through the referrers API, or the
 * referrers tag schema "sha256-<hex>" on registries without it) — and
 * finds it again when the image is opened, checking that it names this
 * image and exactly its layers. No layer is copied or uploaded.
 */
#include <fcntl.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include "internal.h"

/* The OCI 1.1 empty descriptor: the config of artifacts without one. */
#define EMPTY_JSON "{}"
#define INDEX_LAYERS_ANNOTATION "dev.ferry.index.layers"
#define INDEX_DIFF_IDS_ANNOTATION "dev.ferry.index.diff-ids"
/*
 * An index's bootstrap is mostly sha256s and zstd-compressed windows:
 * level 12 saved 1.8% over level 3 (Debian minbase: 1342276 against
 * 1367376 bytes) at 13 times the time (0.13 s, a sixth of `ferry index`).
 */
#define INDEX_ZSTD_LEVEL 3

int oci_config_diff_ids(const struct oci_image *img, uint8_t (*out)[32])
{
	struct json_tokener *tok = json_tokener_new();
	struct json_object *root, *rootfs, *ids;
	uint32_t i;
	int ret = -EFSCORRUPTED;

	root = tok && img->config_data ?
	       json_tokener_parse_ex(tok, (const char *)img->config_data,
				     (int)img->config_len) : NULL;
	json_tokener_free(tok);
	if (json_object_object_get_ex(root, "rootfs", &rootfs) &&
	    json_object_object_get_ex(rootfs, "diff_ids", &ids) &&
	    json_object_is_type(ids, json_type_array) &&
	    json_object_array_length(ids) == img->nr_layers) {
		ret = 0;
		for (i = 0; !ret && i < img->nr_layers; i++) {
			struct json_object *v = json_object_array_get_idx(ids, i);

			if (!json_object_is_type(v, json_type_string) ||
			    digest_parse(json_object_get_string(v), out[i]))
				ret = -EFSCORRUPTED;
		}
	}
	if (ret)
		ferry_err("%s: its config does not list one diff_id per layer (%u layers)",
			  img->where, img->nr_layers);
	json_object_put(root);
	return ret;
}

/* "sha256:a,sha256:b": @n digests, comma-separated (malloc'ed). */
static char *digest_list(const uint8_t (*d)[32], uint32_t n)
{
	char *s = malloc((size_t)n * DIGEST_STRING_SIZE + 1), *p = s;
	uint32_t i;

	if (!s)
		return NULL;
	*p = '\0';
	for (i = 0; i < n; i++) {
		if (i)
			*p++ = ',';
		digest_format(d[i], p);
		p += strlen(p);
	}
	return s;
}

/* The index's manifest (FORMAT.md 1e) as JSON text (malloc'ed). */
static int index_manifest(const struct image_index_out *d, const uint8_t zdigest[32],
			  uint64_t zsize, const uint8_t empty[32], char **text)
{
	const struct oci_image *img = d->subject;
	uint8_t (*layers)[32] = calloc(img->nr_layers + 1, sizeof(*layers));
	struct json_object *m = json_object_new_object(), *arr, *desc;
	char num[32], dstr[DIGEST_STRING_SIZE], *list = NULL, *ids = NULL;
	uint32_t i;
	int ret = -ENOMEM;

	if (!layers)
		goto out;
	for (i = 0; i < img->nr_layers; i++)
		memcpy(layers[i], img->layers[i].digest, 32);
	list = digest_list((const uint8_t (*)[32])layers, img->nr_layers);
	ids = digest_list(d->diff_ids, img->nr_layers);
	if (!list || !ids)
		goto out;
	json_object_object_add(m, "schemaVersion", json_object_new_int(2));
	json_object_object_add(m, "mediaType", json_object_new_string(FETCH_OCI_MANIFEST));
	json_object_object_add(m, "artifactType",
			       json_object_new_string(FERRY_INDEX_ARTIFACT_TYPE));
	json_object_object_add(m, "config", oci_descriptor_json(OCI_EMPTY_MEDIA_TYPE, empty,
						       strlen(EMPTY_JSON)));
	arr = json_object_new_array();
	desc = oci_descriptor_json(FERRY_INDEX_BOOTSTRAP_MEDIA_TYPE, zdigest, zsize);
	sha256_buf(d->bootstrap, d->bootstrap_len, layers[0]);
	digest_format(layers[0], dstr);
	oci_annotate(desc, FERRY_BOOTSTRAP_DIGEST_ANNOTATION, dstr);
	snprintf(num, sizeof(num), "%zu", d->bootstrap_len);
	oci_annotate(desc, "dev.ferry.bootstrap.uncompressed-size", num);
	json_object_array_add(arr, desc);
	json_object_object_add(m, "layers", arr);
	json_object_object_add(m, "subject", oci_descriptor_json(img->manifest_desc.media_type,
							img->manifest_desc.digest,
							img->manifest_desc.size));
	oci_annotate(m, "dev.ferry.version", FERRY_FORMAT_VERSION);
	oci_annotate(m, INDEX_LAYERS_ANNOTATION, list);
	oci_annotate(m, INDEX_DIFF_IDS_ANNOTATION, ids);
	snprintf(num, sizeof(num), "%u", d->chunk_size);
	oci_annotate(m, "dev.ferry.chunk-size", num);
	*text = strdup(json_object_to_json_string_ext(m, JSON_C_TO_STRING_PLAIN |
							 JSON_C_TO_STRING_NOSLASHESCAPE));
	ret = *text ? 0 : -ENOMEM;
out:
	json_object_put(m);
	free(layers);
	free(list);
	free(ids);
	return ret;
}

/* The subject a ferry index manifest names, or -EFSCORRUPTED. */
static int index_subject(struct json_object *m, uint8_t subject[32])
{
	struct json_object *sub;
	const char *s;

	if (!json_object_object_get_ex(m, "subject", &sub) ||
	    !(s = json_get_string(sub, "digest")) || digest_parse(s, subject))
		return -EFSCORRUPTED;
	return 0;
}

static struct json_object *parse_json(const uint8_t *data, size_t len)
{
	struct json_object *o = NULL;

	return json_parse_object((const char *)data, len, &o) ? NULL : o;
}

static bool is_ferry_index(struct json_object *desc)
{
	const char *t = json_get_string(desc, "artifactType");

	return t && !strcmp(t, FERRY_INDEX_ARTIFACT_TYPE);
}


/*
 * Ferry index entries of an image index read, the last first: one
 * manifest fetch each, so a list (a registry's answer) may not make a
 * reader fetch thousands.
 */
#define INDEX_ENTRIES_MAX 16

/*
 * Entry @e of an image index, when a ferry index's: 0 with its descriptor
 * @d, its manifest (read through @load) parsed into *@m, and the subject
 * that names; 1 when it is none, or its manifest names no subject; or the
 * -errno of @load.
 */
static int read_entry(struct json_object *e, image_manifest_load_fn load, void *ctx,
		      struct oci_descriptor *d, struct json_object **m,
		      uint8_t subject[32])
{
	uint8_t *data = NULL;
	size_t len;
	int ret;

	*m = NULL;
	if (!is_ferry_index(e) || oci_parse_descriptor(e, "ferry index", d))
		return 1;
	ret = load(ctx, d, &data, &len);
	if (ret)
		return ret;
	*m = parse_json(data, len);
	free(data);
	if (*m && !index_subject(*m, subject))
		return 0;
	json_object_put(*m);
	*m = NULL;
	return 1;
}

/*
 * List the index manifest @mdigest (@mlen bytes) in the image index @idx
 * (index.json, or a referrers tag's index), dropping the ferry indexes of
 * the same subject before it (@load reads a listed manifest to see its
 * subject); the new index's text (owned by @idx).
 */
static const char *list_index(struct json_object *idx, const uint8_t mdigest[32],
			      size_t mlen, const uint8_t subject[32],
			      image_manifest_load_fn load, void *ctx)
{
	struct json_object *arr, *entry;
	size_t i, seen = 0;

	json_object_object_add(idx, "schemaVersion", json_object_new_int(2));
	json_object_object_add(idx, "mediaType", json_object_new_string(FETCH_OCI_INDEX));
	if (!json_object_object_get_ex(idx, "manifests", &arr) ||
	    !json_object_is_type(arr, json_type_array)) {
		arr = json_object_new_array();
		json_object_object_add(idx, "manifests", arr);
	}
	for (i = json_object_array_length(arr); i-- > 0 && seen < INDEX_ENTRIES_MAX;) {
		struct json_object *e = json_object_array_get_idx(arr, i), *m;
		struct oci_descriptor d;
		uint8_t sub[32];

		seen += is_ferry_index(e);
		/* Not a ferry index, or gone or broken: left as it is. */
		if (read_entry(e, load, ctx, &d, &m, sub))
			continue;
		if (!memcmp(sub, subject, 32))
			json_object_array_del_idx(arr, i, 1);
		json_object_put(m);
	}
	entry = oci_descriptor_json(FETCH_OCI_MANIFEST, mdigest, mlen);
	json_object_object_add(entry, "artifactType",
			       json_object_new_string(FERRY_INDEX_ARTIFACT_TYPE));
	json_object_array_add(arr, entry);
	return json_object_to_json_string_ext(idx, JSON_C_TO_STRING_PLAIN |
						   JSON_C_TO_STRING_NOSLASHESCAPE);
}

static int layout_load(void *ctx, const struct oci_descriptor *d, uint8_t **data,
		       size_t *len)
{
	return oci_layout_load(ctx, d, true, data, len);
}

/* oci: the blobs, the manifest and its index.json entry. */
static int attach_layout(const struct image_index_out *d, const uint8_t *z,
			 size_t zlen, const char *text, uint8_t mdigest[32])
{
	const char *layout = d->subject->layout;
	struct json_object *idx = NULL;
	const char *out;
	uint8_t digest[32], sub_digest[32];
	char *path = NULL;
	int lock_fd = -1, ret;

	memcpy(sub_digest, d->subject->manifest_desc.digest, 32);
	ret = image_lock_dir(layout, true, &lock_fd);
	if (ret) {
		ferry_err("%s: cannot lock the layout: %s", layout, ferry_strerror(ret));
		return ret;
	}
	ret = oci_put_blob(layout, z, zlen, digest);
	if (!ret)
		ret = oci_put_blob(layout, EMPTY_JSON, strlen(EMPTY_JSON), digest);
	if (!ret)
		ret = oci_put_blob(layout, text, strlen(text), mdigest);
	if (ret)
		goto out;
	if (asprintf(&path, "%s/index.json", layout) < 0) {
		ret = -ENOMEM;
		goto out;
	}
	idx = json_object_from_file(path);
	if (!idx || !json_object_is_type(idx, json_type_object)) {
		ferry_err("%s: cannot parse: %s", path, json_util_get_last_err());
		ret = -EFSCORRUPTED;
		goto out;
	}
	out = list_index(idx, mdigest, strlen(text), sub_digest, layout_load, (void *)layout);
	ret = write_file_atomic(layout, "index.json", out, strlen(out), 0644);
out:
	json_object_put(idx);
	free(path);
	close(lock_fd);
	return ret;
}

/* A registry's index manifests, kept in (and read from) a chunk cache. */
struct remote_ctx {
	struct registry *reg;
	const char *cache_dir; /* or NULL */
};

static int remote_manifest_load(void *ctx, const struct oci_descriptor *d,
				uint8_t **data, size_t *len)
{
	struct remote_ctx *rc = ctx;
	struct fetch_buf b;
	char ref[DIGEST_STRING_SIZE], type[128];
	uint8_t got[32];
	int ret;

	if (rc->cache_dir &&
	    !image_cached_read(rc->cache_dir, IMAGE_META_DIR, d->digest, OCI_JSON_MAX,
			       data, len, NULL))
		return 0;
	digest_format(d->digest, ref);
	/* By digest: pkg-fetch checks the bytes against it. */
	ret = registry_get_manifest(rc->reg, ref, &b, type, sizeof(type), got);
	if (ret)
		return ret;
	if (rc->cache_dir)
		image_cached_keep(rc->cache_dir, IMAGE_META_DIR, d->digest, b.data, b.len,
				  NULL);
	*data = b.data;
	*len = b.len;
	return 0;
}

/* "sha256-<hex>": the referrers tag schema's tag for @digest. */
static void referrers_tag(const uint8_t digest[32], char tag[72])
{
	memcpy(tag, "sha256-", 7);
	hex_encode(digest, 32, tag + 7);
}

/*
 * The image index under the referrers tag of @digest: 0 and @body, or
 * -ENOENT (quietly: most images have none) when the tag does not exist.
 */
static int get_referrers_tag(struct registry *reg, const uint8_t digest[32],
			     struct fetch_buf *body)
{
	char tag[72], type[128], **tags = NULL;
	size_t nr = 0, i;
	uint8_t got[32];
	int ret;

	referrers_tag(digest, tag);
	ret = registry_list_tags(reg, &tags, &nr);
	for (i = 0; !ret && i < nr && strcmp(tags[i], tag); i++)
		;
	if (!ret)
		ret = i < nr ? registry_get_manifest(reg, tag, body, type, sizeof(type), got) :
			       -ENOENT;
	fetch_free_tags(tags, nr);
	return ret;
}

/*
 * Upload @len bytes at @data as a blob: through a memfd, pkg-fetch's one
 * upload source (an index's blobs are small).
 */
static int put_mem_blob(struct registry *reg, const void *data, size_t len,
			const uint8_t digest[32])
{
	int fd = memfd_create("ferry-index-blob", MFD_CLOEXEC);
	int ret;

	if (fd < 0)
		return -errno;
	ret = write_full(fd, data, len);
	if (!ret)
		ret = registry_put_blob_fd(reg, fd, len, digest, NULL);
	close(fd);
	return ret;
}

/*
 * docker: the blobs and the manifest pushed by digest; without the
 * referrers API, listed in the referrers tag's index.
 */
static int attach_remote(const struct image_index_out *d, const uint8_t *z,
			 size_t zlen, const char *text, uint8_t mdigest[32])
{
	const struct oci_image *img = d->subject;
	struct fetch_ref ref = { 0 };
	struct registry *reg = NULL;
	struct fetch_buf body = { 0 };
	struct json_object *idx = NULL;
	char dstr[DIGEST_STRING_SIZE], tag[72];
	const char *out;
	uint8_t digest[32];
	int ret;

	ret = fetch_parse_ref(img->where, &ref);
	if (!ret)
		ret = registry_open(&ref, d->fetch, FETCH_PUSH, &reg);
	if (ret)
		goto out;
	sha256_buf(z, zlen, digest);
	ret = put_mem_blob(reg, z, zlen, digest);
	if (ret >= 0) {
		sha256_buf(EMPTY_JSON, strlen(EMPTY_JSON), digest);
		ret = put_mem_blob(reg, EMPTY_JSON, strlen(EMPTY_JSON), digest);
	}
	if (ret < 0)
		goto out;
	sha256_buf(text, strlen(text), mdigest);
	digest_format(mdigest, dstr);
	ret = registry_put_manifest(reg, dstr, FETCH_OCI_MANIFEST, text, strlen(text));
	if (ret)
		goto out;
	ret = registry_get_referrers(reg, img->manifest_desc.digest,
				     FERRY_INDEX_ARTIFACT_TYPE, &body);
	if (ret <= 0)
		goto out; /* the registry lists referrers itself */
	referrers_tag(img->manifest_desc.digest, tag);
	ret = get_referrers_tag(reg, img->manifest_desc.digest, &body);
	if (ret == -ENOENT) {
		idx = json_object_new_object();
		ret = 0;
	} else if (!ret && !(idx = parse_json(body.data, body.len))) {
		ferry_err("%s: the referrers tag %s is not an image index: replaced",
			  registry_name(reg), tag);
		idx = json_object_new_object();
	}
	if (ret)
		goto out;
	out = list_index(idx, mdigest, strlen(text), img->manifest_desc.digest,
			 remote_manifest_load, &(struct remote_ctx){ reg, NULL });
	ret = registry_put_manifest(reg, tag, FETCH_OCI_INDEX, out, strlen(out));
out:
	json_object_put(idx);
	fetch_buf_free(&body);
	if (reg)
		registry_close(reg);
	fetch_ref_free(&ref);
	return ret;
}

int image_index_attach(const struct image_index_out *d,
		       char manifest_digest[DIGEST_STRING_SIZE],
		       uint64_t *manifest_size, uint64_t *index_bytes)
{
	size_t cap = ZSTD_compressBound(d->bootstrap_len), zlen;
	uint8_t *z = malloc(cap), zdigest[32], empty[32], mdigest[32];
	char *text = NULL;
	int ret;

	if (!z)
		return -ENOMEM;
	zlen = ZSTD_compress(z, cap, d->bootstrap, d->bootstrap_len, INDEX_ZSTD_LEVEL);
	if (ZSTD_isError(zlen)) {
		ferry_err("index bootstrap: zstd: %s", ZSTD_getErrorName(zlen));
		free(z);
		return -EIO;
	}
	sha256_buf(z, zlen, zdigest);
	sha256_buf(EMPTY_JSON, strlen(EMPTY_JSON), empty);
	ret = index_manifest(d, zdigest, zlen, empty, &text);
	if (!ret)
		ret = d->subject->remote ? attach_remote(d, z, zlen, text, mdigest) :
					   attach_layout(d, z, zlen, text, mdigest);
	if (!ret) {
		digest_format(mdigest, manifest_digest);
		*manifest_size = strlen(text);
		*index_bytes = zlen + strlen(EMPTY_JSON) + strlen(text);
	}
	free(text);
	free(z);
	return ret;
}

/* ------------------------------------------------------------------ */
/* Finding an image's index                                            */
/* ------------------------------------------------------------------ */

/*
 * The ferry index descriptors of image index @idx (index.json or a
 * referrers list), last first: their manifests are read until one names
 * @subject (parsed into *@out, its digest into @digest). -ENOENT: none.
 */
static int pick_index(struct json_object *idx, const uint8_t subject[32],
		      image_manifest_load_fn load, void *ctx, struct json_object **out,
		      uint8_t digest[32])
{
	struct json_object *arr;
	size_t i, seen = 0;

	*out = NULL;
	if (!json_object_object_get_ex(idx, "manifests", &arr) ||
	    !json_object_is_type(arr, json_type_array))
		return -ENOENT;
	for (i = json_object_array_length(arr); i-- > 0 && seen < INDEX_ENTRIES_MAX;) {
		struct json_object *e = json_object_array_get_idx(arr, i), *m;
		struct oci_descriptor d;
		uint8_t sub[32];
		int ret = read_entry(e, load, ctx, &d, &m, sub);

		seen += is_ferry_index(e);
		if (ret < 0)
			return -EIO;
		if (ret)
			continue;
		if (!memcmp(sub, subject, 32)) {
			*out = m;
			memcpy(digest, d.digest, 32);
			return 0;
		}
		json_object_put(m);
	}
	return -ENOENT;
}

/* A registry image's referrers: the referrers API, else the referrers tag. */
static int list_remote(const struct oci_image *oci, struct json_object **list)
{
	struct fetch_buf body = { 0 };
	int ret;

	ret = registry_get_referrers(oci->remote, oci->manifest_desc.digest,
				     FERRY_INDEX_ARTIFACT_TYPE, &body);
	if (ret == 1)
		ret = get_referrers_tag(oci->remote, oci->manifest_desc.digest, &body);
	if (!ret && !(*list = parse_json(body.data, body.len)))
		ret = -ENOENT;
	fetch_buf_free(&body);
	return ret;
}

/* An OCI layout's index.json. */
static int list_layout(const struct oci_image *oci, struct json_object **list)
{
	char *path = NULL;

	if (asprintf(&path, "%s/index.json", oci->layout) < 0)
		return -ENOMEM;
	*list = json_object_from_file(path);
	free(path);
	return *list ? 0 : -ENOENT;
}

/* "sha256:a,sha256:b": exactly @n digests into @out; -EFSCORRUPTED if not. */
static int parse_digest_list(const char *list, uint32_t n, uint8_t (*out)[32])
{
	char one[DIGEST_STRING_SIZE];
	uint32_t i;

	for (i = 0; list && i < n; i++) {
		size_t len = strcspn(list, ",");

		if (len >= sizeof(one))
			return -EFSCORRUPTED;
		memcpy(one, list, len);
		one[len] = '\0';
		if (digest_parse(one, out[i]))
			return -EFSCORRUPTED;
		list += len;
		if (*list == ',' && i + 1 < n)
			list++;
	}
	return list && i == n && !*list ? 0 : -EFSCORRUPTED;
}

/*
 * The index manifest @m must name exactly @oci's layers, in order, and
 * record one diff_id each (into img->index_*); the config's diff_ids, when
 * @oci has its config, are those.
 */
static int check_index(struct image *img, const struct oci_image *oci,
		       struct json_object *m, struct image_expect *e)
{
	struct json_object *layers, *l, *ann = NULL;
	struct oci_descriptor boot;
	uint8_t (*config_ids)[32] = NULL;
	const char *s, *ref = img->ref;
	uint32_t i, n = oci->nr_layers;
	int ret = -EFSCORRUPTED;

	if (!json_object_object_get_ex(m, "layers", &layers) ||
	    !json_object_is_type(layers, json_type_array) ||
	    json_object_array_length(layers) != 1 ||
	    !(l = json_object_array_get_idx(layers, 0)) ||
	    oci_parse_descriptor(l, ref, &boot) ||
	    strcmp(boot.media_type, FERRY_INDEX_BOOTSTRAP_MEDIA_TYPE) ||
	    !(s = oci_annotation(l, FERRY_BOOTSTRAP_DIGEST_ANNOTATION)) ||
	    digest_parse(s, e->bootstrap)) {
		ferry_err("%s: its ferry index has no valid bootstrap layer", ref);
		return -EFSCORRUPTED;
	}
	memcpy(e->compressed, boot.digest, 32);
	e->compressed_size = boot.size;
	img->index_layers = calloc(n + 1, sizeof(*img->index_layers));
	img->index_diff_ids = calloc(n + 1, sizeof(*img->index_diff_ids));
	if (!img->index_layers || !img->index_diff_ids)
		return -ENOMEM;
	img->nr_index_layers = n;
	json_object_object_get_ex(m, "annotations", &ann);
	ret = parse_digest_list(json_get_string(ann, INDEX_LAYERS_ANNOTATION), n,
				img->index_layers);
	for (i = 0; !ret && i < n; i++)
		if (memcmp(img->index_layers[i], oci->layers[i].digest, 32))
			ret = -EFSCORRUPTED;
	if (ret) {
		ferry_err("%s: its ferry index was made for other layers (%s): index the image again",
			  ref, INDEX_LAYERS_ANNOTATION);
		return ret;
	}
	ret = parse_digest_list(json_get_string(ann, INDEX_DIFF_IDS_ANNOTATION), n,
				img->index_diff_ids);
	if (ret) {
		ferry_err("%s: its ferry index lacks one diff_id per layer (%s): index the image again",
			  ref, INDEX_DIFF_IDS_ANNOTATION);
		return ret;
	}
	if (!oci->config_data)
		return 0;
	config_ids = calloc(n + 1, sizeof(*config_ids));
	if (!config_ids)
		return -ENOMEM;
	ret = oci_config_diff_ids(oci, config_ids);
	if (!ret && memcmp(config_ids, img->index_diff_ids, (size_t)n * 32)) {
		ferry_err("%s: its ferry index records diff_ids (%s) that are not its config's rootfs.diff_ids: the index was made for another image or altered; index the image again",
			  ref, INDEX_DIFF_IDS_ANNOTATION);
		ret = -EFSCORRUPTED;
	}
	free(config_ids);
	return ret;
}

/* Serve @oci through index manifest @m (digest @digest), checked. */
static int use_index(struct image *img, const struct oci_image *oci,
		     struct json_object *m, const uint8_t digest[32],
		     struct image_expect *e)
{
	struct json_object *ann;
	const char *s;
	uint32_t i;
	int ret;

	ret = check_index(img, oci, m, e);
	if (ret)
		return ret;
	memcpy(img->image_digest, oci->manifest_desc.digest, 32);
	memcpy(img->config_digest, oci->config.digest, 32);
	memcpy(img->index_digest, digest, 32);
	e->compressed_bootstrap = true;
	e->index = true;
	e->nr_layers = oci->nr_layers;
	e->layers = calloc(oci->nr_layers + 1, sizeof(*e->layers));
	if (!e->layers)
		return -ENOMEM;
	for (i = 0; i < oci->nr_layers; i++)
		e->layers[i] = oci->layers[i];
	if (oci->layout) {
		img->dir = strdup(oci->layout);
		ret = img->dir ? oci_blob_path(oci->layout, e->compressed,
					       &e->compressed_path) : -ENOMEM;
	}
	s = json_object_object_get_ex(m, "annotations", &ann) ?
	    json_get_string(ann, "dev.ferry.chunk-size") : NULL;
	img->chunk_size = s ? (uint32_t)strtoul(s, NULL, 10) : 0;
	snprintf(img->compression, sizeof(img->compression), "%s", "layers");
	return ret;
}

int image_index_from_list(struct image *img, const struct oci_image *oci,
			  struct json_object *list, image_manifest_load_fn load,
			  void *ctx, struct image_expect *e)
{
	struct json_object *m = NULL;
	uint8_t digest[32];
	int ret;

	ret = pick_index(list, oci->manifest_desc.digest, load, ctx, &m, digest);
	if (!ret)
		ret = use_index(img, oci, m, digest, e);
	json_object_put(m);
	return ret;
}

/*
 * The index whose manifest is @digest (image_opts.index_digest): it must
 * name @oci as its subject.
 */
static int pinned_index(struct image *img, const struct oci_image *oci,
			const uint8_t digest[32], image_manifest_load_fn load,
			void *ctx, struct image_expect *e)
{
	struct oci_descriptor d = { .media_type = FETCH_OCI_MANIFEST };
	struct json_object *m = NULL;
	char dstr[DIGEST_STRING_SIZE], *path = NULL;
	uint8_t *data = NULL, sub[32];
	struct stat st;
	size_t len;
	int ret = 0;

	memcpy(d.digest, digest, 32);
	digest_format(digest, dstr);
	/* A layout's reader checks the size a descriptor gives. */
	if (oci->layout) {
		ret = oci_blob_path(oci->layout, digest, &path);
		if (!ret && stat(path, &st))
			ret = -errno;
		d.size = ret ? 0 : (uint64_t)st.st_size;
		free(path);
	}
	if (!ret)
		ret = load(ctx, &d, &data, &len);
	if (!ret && (!(m = parse_json(data, len)) || index_subject(m, sub) ||
		     memcmp(sub, oci->manifest_desc.digest, 32))) {
		ferry_err("%s: ferry index %s is not one of this image", img->ref, dstr);
		ret = -EFSCORRUPTED;
	} else if (ret) {
		ferry_err("%s: ferry index %s: %s", img->ref, dstr, ferry_strerror(ret));
	}
	if (!ret)
		ret = use_index(img, oci, m, digest, e);
	json_object_put(m);
	free(data);
	return ret;
}

int image_index_expect(struct image *img, const struct oci_image *oci,
		       const struct image_opts *opts, struct image_expect *e)
{
	struct remote_ctx rc = { oci->remote, opts->cache_dir };
	image_manifest_load_fn load = oci->remote ? remote_manifest_load : layout_load;
	void *ctx = oci->remote ? (void *)&rc : (void *)oci->layout;
	struct json_object *list = NULL;
	int ret;

	if (opts->index_digest)
		return pinned_index(img, oci, opts->index_digest, load, ctx, e);
	ret = oci->remote ? list_remote(oci, &list) : list_layout(oci, &list);
	if (!ret)
		ret = image_index_from_list(img, oci, list, load, ctx, e);
	json_object_put(list);
	if (ret == -ENOENT) {
		ferry_err("%s: not a ferry image, and no ferry index is attached to it: `ferry index %s` attaches one, `ferry convert` converts it, and `--mode local` mounts a ferry image only",
			  img->ref, img->ref);
		return -EMEDIUMTYPE;
	}
	return ret;
}
