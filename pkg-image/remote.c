// SPDX-License-Identifier: MIT
/*
 * Images in registries (docker://[HOST[:PORT]/]REPO[:TAG|@DIGEST]): resolve
 * a reference to one image manifest through pkg-fetch, stream layers, and
 * push an image from an OCI layout.
 */
#include <fcntl.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

/*
 * The document the reference named, kept so it is not fetched twice, and
 * the chunk cache whose copies of documents come before the registry's.
 */
struct remote_loader {
	struct registry *reg;
	const char *cache_dir;
	struct fetch_buf top;
	uint8_t top_digest[32];
};

static int remote_load(void *ctx, const struct oci_descriptor *d,
		       bool manifest, uint8_t **data, size_t *len)
{
	struct remote_loader *l = ctx;
	struct fetch_buf body = { 0 };
	char dstr[72], type[128];
	uint8_t digest[32];
	int ret;

	if (l->top.data && !memcmp(d->digest, l->top_digest, 32)) {
		body = l->top;
		l->top = (struct fetch_buf){ 0 };
		goto check;
	}
	if (l->cache_dir &&
	    !image_cached_read(l->cache_dir, IMAGE_META_DIR, d->digest, OCI_JSON_MAX,
			       &body.data, &body.len, NULL))
		goto check;
	digest_format(d->digest, dstr);
	/* By digest: pkg-fetch checks the bytes against it. */
	ret = manifest ? registry_get_manifest(l->reg, dstr, &body, type, sizeof(type),
					       digest) :
			 registry_get_blob(l->reg, d->digest, d->size, OCI_JSON_MAX, &body);
	if (ret)
		return ret;
	if (l->cache_dir)
		image_cached_keep(l->cache_dir, IMAGE_META_DIR, d->digest, body.data,
				  body.len, NULL);
check:
	if (body.len != d->size) {
		digest_format(d->digest, dstr);
		ferry_err("%s: %s is %zu bytes, its descriptor says %llu",
			  registry_name(l->reg), dstr, body.len,
			  (unsigned long long)d->size);
		fetch_buf_free(&body);
		return -EFSCORRUPTED;
	}
	*data = body.data;
	*len = body.len;
	return 0;
}

int oci_remote_open(const char *ref, const struct image_opts *opts,
		    struct oci_image *img)
{
	struct remote_loader l = { .cache_dir = opts ? opts->cache_dir : NULL };
	struct fetch_ref fref = { 0 };
	struct oci_descriptor top = { 0 };
	char pinned[DIGEST_STRING_SIZE];
	const char *reference;
	int ret;

	memset(img, 0, sizeof(*img));
	ret = fetch_parse_ref(ref, &fref);
	if (ret)
		return ret;
	ret = registry_open(&fref, opts ? opts->fetch : NULL, FETCH_PULL, &img->remote);
	if (ret)
		goto out;
	img->where = strdup(ref);
	if (!img->where) {
		ret = -ENOMEM;
		goto out;
	}
	l.reg = img->remote;
	reference = fref.digest ? fref.digest : fref.tag ? fref.tag : "latest";
	if (opts && opts->digest) {
		digest_format(opts->digest, pinned);
		reference = pinned;
	}
	/*
	 * By digest, the document may be here already; by tag, the registry
	 * says what it names now. Either way resolve takes the media type
	 * from the document when it has one.
	 */
	if (l.cache_dir && !digest_parse(reference, l.top_digest) &&
	    !image_cached_read(l.cache_dir, IMAGE_META_DIR, l.top_digest, OCI_JSON_MAX,
			       &l.top.data, &l.top.len, NULL)) {
		ret = 0;
	} else {
		ret = registry_get_manifest(l.reg, reference, &l.top, top.media_type,
					    sizeof(top.media_type), l.top_digest);
		if (!ret && l.cache_dir)
			image_cached_keep(l.cache_dir, IMAGE_META_DIR, l.top_digest,
					  l.top.data, l.top.len, NULL);
	}
	if (ret)
		goto out;
	memcpy(top.digest, l.top_digest, 32);
	top.size = l.top.len;
	ret = oci_image_resolve(img, &top, opts ? opts->platform : NULL,
				&(struct oci_loader){ .load = remote_load, .ctx = &l,
						      .skip_config = opts && opts->no_config });
out:
	fetch_buf_free(&l.top);
	fetch_ref_free(&fref);
	if (ret)
		oci_image_free(img);
	return ret;
}

/* ------------------------------------------------------------------ */
/* Push                                                                */
/* ------------------------------------------------------------------ */

static int push_blob(struct registry *reg, const char *layout,
		     const struct oci_descriptor *d)
{
	char *path = NULL, dstr[72];
	struct stat st;
	int fd = -1, ret;

	ret = oci_blob_path(layout, d->digest, &path);
	if (ret)
		return ret;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st)) {
		ret = -errno;
		ferry_err("%s: %s", path, strerror(errno));
		goto out;
	}
	if ((uint64_t)st.st_size != d->size) {
		digest_format(d->digest, dstr);
		ferry_err("%s: %llu bytes, but the manifest says %s has %llu", path,
			  (unsigned long long)st.st_size, dstr,
			  (unsigned long long)d->size);
		ret = -EFSCORRUPTED;
		goto out;
	}
	ret = registry_put_blob_fd(reg, fd, d->size, d->digest, NULL);
	if (ret > 0)
		ret = 0;
out:
	if (fd >= 0)
		close(fd);
	free(path);
	return ret;
}

int oci_push(const char *layout, const uint8_t manifest_digest[32],
	     uint64_t manifest_size, const char *dest, bool by_digest,
	     const struct fetch_opts *fopts, struct ferry_progress *progress)
{
	char dstr[DIGEST_STRING_SIZE];
	struct oci_image img = { 0 };
	struct oci_descriptor top = { .size = manifest_size };
	struct fetch_ref ref = { 0 };
	struct registry *reg = NULL;
	uint8_t *text = NULL;
	size_t len = 0;
	uint64_t total = 0;
	uint32_t i;
	int ret;

	memcpy(top.digest, manifest_digest, 32);
	snprintf(top.media_type, sizeof(top.media_type), "%s", FETCH_OCI_MANIFEST);
	ret = fetch_parse_ref(dest, &ref);
	if (ret)
		return ret;
	if (ref.digest) {
		ferry_err("destination docker://%s: name a tag, not a digest (the "
			  "converted image's digest is not known in advance)", dest);
		ret = -EINVAL;
		goto out;
	}
	img.where = strdup(layout);
	img.layout = strdup(layout);
	if (!img.where || !img.layout) {
		ret = -ENOMEM;
		goto out;
	}
	ret = oci_image_resolve(&img, &top, NULL,
				&(struct oci_loader){ .load = oci_layout_load, .ctx = img.layout });
	if (ret)
		goto out;
	ret = registry_open(&ref, fopts, FETCH_PUSH, &reg);
	if (ret)
		goto out;
	for (i = 0; i < img.nr_layers; i++)
		total += img.layers[i].size;
	ferry_progress_begin(progress, "push", total);
	for (i = 0; i < img.nr_layers && !ret; i++) {
		ret = push_blob(reg, layout, &img.layers[i]);
		ferry_progress_add(progress, img.layers[i].size);
	}
	ferry_progress_end(progress);
	if (!ret)
		ret = push_blob(reg, layout, &img.config);
	if (ret)
		goto out;
	ret = oci_layout_load(img.layout, &top, true, &text, &len);
	digest_format(manifest_digest, dstr);
	if (!ret)
		ret = registry_put_manifest(reg, by_digest ? dstr :
						 ref.tag ? ref.tag : "latest",
					    FETCH_OCI_MANIFEST, text, len);
out:
	free(text);
	if (reg)
		registry_close(reg);
	oci_image_free(&img);
	fetch_ref_free(&ref);
	return ret;
}

int oci_push_index(const char *dest, const char *text, size_t len,
		   const struct fetch_opts *fopts)
{
	struct fetch_ref ref = { 0 };
	struct registry *reg = NULL;
	int ret = fetch_parse_ref(dest, &ref);

	if (!ret)
		ret = registry_open(&ref, fopts, FETCH_PUSH, &reg);
	if (!ret)
		ret = registry_put_manifest(reg, ref.tag ? ref.tag : "latest",
					    FETCH_OCI_INDEX, text, len);
	registry_close(reg);
	fetch_ref_free(&ref);
	return ret;
}
