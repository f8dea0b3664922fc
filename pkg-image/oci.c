// SPDX-License-Identifier: MIT
/*
 * OCI image layouts on disk (image-spec image-layout.md): resolve
 * PATH[:TAG] through index.json to one image manifest (choosing a platform
 * from an image index; remote.c does the same through a registry), and
 * the primitives write.c lays images out with (blobs, oci-layout, tags in
 * index.json). Every manifest, index and config read is size-limited and
 * digest-checked.
 */
#include <dirent.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "internal.h"

#define OCI_INDEX_DEPTH 4       /* nested indexes followed at most */

static const char *const manifest_types[] = {
	FETCH_OCI_MANIFEST,
	FETCH_DOCKER_MANIFEST,
};
static const char *const index_types[] = {
	FETCH_OCI_INDEX,
	FETCH_DOCKER_LIST,
};

static bool is_one_of(const char *s, const char *const *list, size_t n)
{
	size_t i;

	for (i = 0; s && i < n; i++)
		if (!strcmp(s, list[i]))
			return true;
	return false;
}

/* Parse a descriptor object; every field a consumer relies on is checked. */
int oci_parse_descriptor(struct json_object *o, const char *where,
			 struct oci_descriptor *d)
{
	struct json_object *v;
	const char *digest = json_get_string(o, "digest"), *type = json_get_string(o, "mediaType");
	int64_t size;

	memset(d, 0, sizeof(*d));
	if (!digest || digest_parse(digest, d->digest)) {
		ferry_err("%s: descriptor digest \"%s\" is not sha256:<64 lowercase hex>", where,
			  digest ? digest : "(missing)");
		return -EFSCORRUPTED;
	}
	if (!json_object_object_get_ex(o, "size", &v) ||
	    !json_object_is_type(v, json_type_int) ||
	    (size = json_object_get_int64(v)) < 0) {
		ferry_err("%s: descriptor %s has no valid size", where, digest);
		return -EFSCORRUPTED;
	}
	d->size = (uint64_t)size;
	snprintf(d->media_type, sizeof(d->media_type), "%s", type ? type : "");
	return 0;
}

int oci_layout_load(void *ctx, const struct oci_descriptor *d,
		       bool manifest, uint8_t **out, size_t *out_len)
{
	const char *layout = ctx;
	char hex[65], *path = NULL;
	uint8_t digest[32], *data = NULL;
	int fd = -1, ret;

	hex_encode(d->digest, 32, hex);
	if (asprintf(&path, "%s/blobs/sha256/%s", layout, hex) < 0)
		return -ENOMEM;
	data = malloc(d->size + 1);
	if (!data) {
		ret = -ENOMEM;
		goto out;
	}
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		ret = -errno;
		ferry_err("%s: %s", path, strerror(errno));
		goto out;
	}
	ret = read_full(fd, data, d->size);
	/* Shorter (read_full's -EIO) or longer than its descriptor says. */
	if (ret == -EIO || (!ret && read(fd, digest, 1) != 0))
		ret = -EFSCORRUPTED;
	if (ret) {
		ferry_err("%s: size does not match its descriptor (%llu bytes)", path,
			  (unsigned long long)d->size);
		goto out;
	}
	sha256_buf(data, d->size, digest);
	if (memcmp(digest, d->digest, 32)) {
		ferry_err("%s: content does not match its digest", path);
		ret = -EFSCORRUPTED;
		goto out;
	}
	*out = data;
	*out_len = d->size;
	data = NULL;
out:
	if (fd >= 0)
		close(fd);
	free(data);
	free(path);
	return ret;
}

/* Load the JSON document @d names through @img's loader. */
static int load_json(const struct oci_image *img, const struct oci_loader *l,
		     const struct oci_descriptor *d, bool manifest,
		     struct json_object **out, uint8_t **keep, size_t *keep_len)
{
	uint8_t *data = NULL;
	size_t len = 0;
	char hex[65];
	int ret;

	hex_encode(d->digest, 32, hex);
	if (d->size > OCI_JSON_MAX) {
		ferry_err("%s: %s sha256:%s is %llu bytes (limit %u)", img->where,
			  manifest ? "manifest" : "config", hex,
			  (unsigned long long)d->size, OCI_JSON_MAX);
		return -EFBIG;
	}
	ret = l->load(l->ctx, d, manifest, &data, &len);
	if (ret)
		return ret;
	ret = json_parse_object((const char *)data, len, out);
	if (ret == -EPROTO) {
		ferry_err("%s: sha256:%s is not a JSON object", img->where, hex);
		ret = -EFSCORRUPTED;
	}
	if (!ret && keep) {
		*keep = data;
		*keep_len = len;
		data = NULL;
	}
	free(data);
	return ret;
}

int oci_host_platform(char *out, size_t len)
{
	static const struct { const char *uname, *oci; } arches[] = {
		{ "x86_64", "amd64" }, { "aarch64", "arm64" }, { "armv7l", "arm/v7" },
		{ "i686", "386" }, { "ppc64le", "ppc64le" }, { "s390x", "s390x" },
		{ "riscv64", "riscv64" },
	};
	struct utsname u;
	size_t i;

	if (uname(&u))
		return -errno;
	for (i = 0; i < ARRAY_SIZE(arches); i++)
		if (!strcmp(u.machine, arches[i].uname)) {
			snprintf(out, len, "linux/%s", arches[i].oci);
			return 0;
		}
	snprintf(out, len, "linux/%s", u.machine);
	return 0;
}

bool oci_platform_names(const char *want, const char *platform)
{
	size_t n = strlen(want);

	return !strcmp(want, platform) ||
	       (strchr(want, '/') == strrchr(want, '/') &&
		!strncmp(want, platform, n) && platform[n] == '/');
}

/* Does index entry @m match "os/arch[/variant]"? */
static bool platform_matches(struct json_object *m, const char *want)
{
	struct json_object *p;
	char buf[128];
	const char *os, *arch, *variant;

	if (!json_object_object_get_ex(m, "platform", &p))
		return false;
	os = json_get_string(p, "os");
	arch = json_get_string(p, "architecture");
	variant = json_get_string(p, "variant");
	if (!os || !arch)
		return false;
	snprintf(buf, sizeof(buf), "%s/%s%s%s", os, arch,
		 variant && *variant ? "/" : "", variant ? variant : "");
	return oci_platform_names(want, buf);
}

/* An image index's "manifests" array, or -EFSCORRUPTED naming @where. */
static int index_manifests(struct json_object *index, const char *where,
			   struct json_object **manifests)
{
	if (!json_object_object_get_ex(index, "manifests", manifests) ||
	    !json_object_is_type(*manifests, json_type_array)) {
		ferry_err("%s: image index without a manifests array", where);
		return -EFSCORRUPTED;
	}
	return 0;
}

/* From an image index, the descriptor for @platform. */
static int pick_platform(struct json_object *index, const char *where,
			 const char *platform, struct oci_descriptor *d)
{
	struct json_object *manifests;
	size_t i, n;
	int ret = index_manifests(index, where, &manifests);

	if (ret)
		return ret;
	n = json_object_array_length(manifests);
	for (i = 0; i < n; i++) {
		struct json_object *m = json_object_array_get_idx(manifests, i);

		if (platform_matches(m, platform))
			return oci_parse_descriptor(m, where, d);
	}
	ferry_err("%s: no manifest for platform %s (use --platform os/arch[/variant])",
		  where, platform);
	return -ENOENT;
}

/* The platforms of @index's image manifests into img->platforms. */
static int list_platforms(struct oci_image *img, struct json_object *index)
{
	struct json_object *manifests, *p;
	size_t i, n, k;
	int ret = index_manifests(index, img->where, &manifests);

	if (ret)
		return ret;
	n = json_object_array_length(manifests);
	img->platforms = calloc(n ? n : 1, sizeof(*img->platforms));
	if (!img->platforms)
		return -ENOMEM;
	for (i = 0; i < n; i++) {
		struct json_object *m = json_object_array_get_idx(manifests, i);
		const char *os, *arch, *variant, *type = json_get_string(m, "mediaType");
		char *name = img->platforms[img->nr_platforms];
		int len;

		if (!json_object_object_get_ex(m, "platform", &p) ||
		    (type && !is_one_of(type, manifest_types, ARRAY_SIZE(manifest_types))))
			continue;
		os = json_get_string(p, "os");
		arch = json_get_string(p, "architecture");
		variant = json_get_string(p, "variant");
		if (!os || !arch || !strcmp(os, "unknown") || !strcmp(arch, "unknown"))
			continue;
		len = snprintf(name, OCI_PLATFORM_MAX, "%s/%s%s%s", os, arch,
			       variant && *variant ? "/" : "", variant ? variant : "");
		if (len >= OCI_PLATFORM_MAX || strspn(name, "abcdefghijklmnopqrstuvwxyz"
						       "0123456789/._-") != (size_t)len) {
			ferry_err("%s: image index names a malformed platform", img->where);
			return -EFSCORRUPTED;
		}
		for (k = 0; k < img->nr_platforms; k++)
			if (!strcmp(img->platforms[k], name))
				break;
		if (k == img->nr_platforms)
			img->nr_platforms++;
	}
	return 0;
}

int oci_index_pick(struct json_object *index, const char *layout,
		   const char *tag, struct oci_descriptor *d)
{
	struct json_object *manifests, *match = NULL;
	size_t i, n;
	int ret = index_manifests(index, layout, &manifests);

	if (ret)
		return ret;
	n = json_object_array_length(manifests);
	for (i = 0; i < n; i++) {
		struct json_object *m = json_object_array_get_idx(manifests, i);
		const char *name = oci_annotation(m, OCI_REF_NAME_ANNOTATION);
		if (tag ? name && !strcmp(name, tag) : n == 1)
			match = m;
	}
	if (!match) {
		if (tag)
			ferry_err("%s: no image tagged \"%s\" in index.json", layout, tag);
		else
			ferry_err("%s: index.json lists %zu images; name one as %s:TAG",
				  layout, n, layout);
		return -ENOENT;
	}
	return oci_parse_descriptor(match, layout, d);
}

static void oci_image_clear(struct oci_image *img)
{
	json_object_put(img->manifest);
	free(img->platforms);
	free(img->config_data);
	free(img->layers);
	free(img->layout);
	free(img->where);
	if (img->remote)
		registry_close(img->remote);
	memset(img, 0, sizeof(*img));
}

void oci_image_free(struct oci_image *img)
{
	if (img)
		oci_image_clear(img);
}

int oci_image_resolve(struct oci_image *img, const struct oci_descriptor *top,
		      const char *platform, const struct oci_loader *l)
{
	struct json_object *layers, *config, *doc_config = NULL;
	struct oci_descriptor d = *top;
	char host[64];
	size_t i, n;
	int depth, ret;

	if (!platform) {
		ret = oci_host_platform(host, sizeof(host));
		if (ret)
			return ret;
		platform = host;
	}
	/* Follow nested indexes (a tag may name an index) to one manifest. */
	for (depth = 0;; depth++) {
		struct json_object *doc = NULL;
		const char *type;

		ret = load_json(img, l, &d, true, &doc, NULL, NULL);
		if (ret)
			return ret;
		type = json_get_string(doc, "mediaType");
		if (!type || !*type)
			type = d.media_type;
		if (is_one_of(type, manifest_types, ARRAY_SIZE(manifest_types)) ||
		    (!*type && json_object_object_get_ex(doc, "layers", NULL))) {
			img->manifest = doc;
			img->manifest_desc = d;
			break;
		}
		if (!is_one_of(type, index_types, ARRAY_SIZE(index_types)) &&
		    !json_object_object_get_ex(doc, "manifests", NULL)) {
			ferry_err("%s: %s is neither an image manifest nor an index",
				  img->where, type && *type ? type : "untyped document");
			json_object_put(doc);
			return -EFSCORRUPTED;
		}
		if (!strcmp(platform, OCI_PLATFORMS)) {
			ret = list_platforms(img, doc);
			json_object_put(doc);
			return ret;
		}
		if (depth == OCI_INDEX_DEPTH) {
			ferry_err("%s: image indexes nested deeper than %d", img->where,
				  OCI_INDEX_DEPTH);
			json_object_put(doc);
			return -EFSCORRUPTED;
		}
		ret = pick_platform(doc, img->where, platform, &d);
		json_object_put(doc);
		if (ret)
			return ret;
	}
	if (!json_object_object_get_ex(img->manifest, "config", &config) ||
	    oci_parse_descriptor(config, img->where, &img->config)) {
		ferry_err("%s: manifest has no valid config descriptor", img->where);
		return -EFSCORRUPTED;
	}
	/* Converted images carry the config along: load and check it now. */
	if (!l->skip_config) {
		ret = load_json(img, l, &img->config, false, &doc_config,
				&img->config_data, &img->config_len);
		if (ret)
			return ret;
		json_object_put(doc_config);
	}
	if (!json_object_object_get_ex(img->manifest, "layers", &layers) ||
	    !json_object_is_type(layers, json_type_array)) {
		ferry_err("%s: manifest has no layers array", img->where);
		return -EFSCORRUPTED;
	}
	n = json_object_array_length(layers);
	img->layers = calloc(n ? n : 1, sizeof(*img->layers));
	if (!img->layers)
		return -ENOMEM;
	for (i = 0; i < n; i++) {
		ret = oci_parse_descriptor(json_object_array_get_idx(layers, i), img->where,
				       &img->layers[i]);
		if (ret)
			return ret;
	}
	img->nr_layers = (uint32_t)n;
	return 0;
}

int oci_layout_open(const char *path, const char *tag, const char *platform,
		    struct oci_image *img)
{
	struct json_object *index = NULL;
	struct oci_descriptor d;
	char *index_path = NULL;
	int ret;

	memset(img, 0, sizeof(*img));
	img->layout = strdup(path);
	img->where = strdup(path);
	if (!img->layout || !img->where ||
	    asprintf(&index_path, "%s/index.json", path) < 0) {
		index_path = NULL;
		ret = -ENOMEM;
		goto out;
	}
	index = json_object_from_file(index_path);
	if (!index || !json_object_is_type(index, json_type_object)) {
		ferry_err("%s: not an OCI image layout (cannot read index.json)", path);
		ret = access(path, F_OK) ? -ENOENT : -EFSCORRUPTED;
		goto out;
	}
	ret = oci_index_pick(index, path, tag, &d);
	if (!ret)
		ret = oci_image_resolve(img, &d, platform,
					&(struct oci_loader){ .load = oci_layout_load, .ctx = img->layout });
out:
	json_object_put(index);
	free(index_path);
	if (ret)
		oci_image_clear(img);
	return ret;
}

/* A layout whose files come through oci_image_open_files' @read. */
struct files_ctx {
	const char *where;
	oci_file_read_fn read;
	void *ctx;
};

static int files_load(void *ctx, const struct oci_descriptor *d, bool manifest,
		      uint8_t **out, size_t *out_len)
{
	const struct files_ctx *f = ctx;
	uint8_t digest[32], *data = NULL;
	char name[96];
	size_t len = 0;
	int ret;

	memcpy(name, "blobs/sha256/", 13);
	hex_encode(d->digest, 32, name + 13);
	ret = f->read(f->ctx, name, d->size, &data, &len);
	if (ret == -EFBIG || (!ret && len != d->size)) {
		ferry_err("%s: %s: size does not match its descriptor (%llu bytes)",
			  f->where, name, (unsigned long long)d->size);
		ret = -EFSCORRUPTED;
	}
	if (!ret) {
		sha256_buf(data, len, digest);
		if (memcmp(digest, d->digest, 32)) {
			ferry_err("%s: %s: content does not match its digest",
				  f->where, name);
			ret = -EFSCORRUPTED;
		}
	}
	if (ret) {
		free(data);
		return ret;
	}
	*out = data;
	*out_len = len;
	return 0;
}

int oci_image_open_files(const char *where, const char *tag,
			 const char *platform, oci_file_read_fn read, void *ctx,
			 struct oci_image *img)
{
	struct files_ctx f = { where, read, ctx };
	struct json_object *index = NULL;
	struct oci_descriptor d;
	uint8_t *data = NULL;
	size_t len = 0;
	int ret;

	memset(img, 0, sizeof(*img));
	img->where = strdup(where);
	if (!img->where)
		return -ENOMEM;
	ret = read(ctx, "index.json", OCI_JSON_MAX, &data, &len);
	if (ret == -EFBIG)
		ferry_err("%s: index.json is larger than %u bytes", where, OCI_JSON_MAX);
	if (!ret && json_parse_object((const char *)data, len, &index)) {
		ferry_err("%s: index.json is not a JSON object", where);
		ret = -EFSCORRUPTED;
	}
	if (!ret)
		ret = oci_index_pick(index, where, tag, &d);
	if (!ret)
		ret = oci_image_resolve(img, &d, platform,
					&(struct oci_loader){ .load = files_load, .ctx = &f });
	json_object_put(index);
	free(data);
	if (ret)
		oci_image_clear(img);
	return ret;
}

int oci_image_open(const struct image_ref *ref, const char *platform,
		   const struct fetch_opts *fopts, struct oci_image *img)
{
	if (ref->transport == IMAGE_DOCKER)
		return oci_remote_open(ref->path,
				       &(struct image_opts){ .fetch = fopts, .platform = platform },
				       img);
	if (ref->transport == IMAGE_OCI)
		return oci_layout_open(ref->path, ref->tag, platform, img);
	memset(img, 0, sizeof(*img));
	return -EINVAL;
}

bool oci_is_ferry_blob(const char *media_type)
{
	return !strcmp(media_type, FERRY_BLOB_MEDIA_TYPE) ||
	       !strcmp(media_type, FERRY_BLOB_MEDIA_TYPE_OLD);
}

bool oci_is_ferry_bootstrap(const char *media_type)
{
	return !strcmp(media_type, FERRY_BOOTSTRAP_MEDIA_TYPE) ||
	       !strcmp(media_type, FERRY_BOOTSTRAP_MEDIA_TYPE_OLD);
}

bool oci_is_old_ferry(const struct oci_image *img)
{
	struct json_object *ann;
	const char *version;
	const char *boot;

	if (!img->nr_layers)
		return false;
	boot = img->layers[img->nr_layers - 1].media_type;
	if (!strcmp(boot, FERRY_BOOTSTRAP_MEDIA_TYPE_OLD))
		return true;
	if (strcmp(boot, FERRY_BOOTSTRAP_MEDIA_TYPE) ||
	    !json_object_object_get_ex(img->manifest, "annotations", &ann))
		return false;
	version = json_get_string(ann, "dev.ferry.version");
	return !version || strcmp(version, FERRY_FORMAT_VERSION);
}

int oci_blob_path(const char *layout, const uint8_t digest[32], char **out)
{
	char hex[65];

	hex_encode(digest, 32, hex);
	return asprintf(out, "%s/blobs/sha256/%s", layout, hex) < 0 ? -ENOMEM : 0;
}

const char *oci_annotation(struct json_object *desc, const char *key)
{
	struct json_object *ann;

	if (!json_object_object_get_ex(desc, "annotations", &ann))
		return NULL;
	return json_get_string(ann, key);
}

/* ------------------------------------------------------------------ */
/* Writing a layout                                                    */
/* ------------------------------------------------------------------ */

int oci_put_blob(const char *layout, const void *data, size_t len,
		 uint8_t digest[32])
{
	char hex[65], *dir = NULL;
	int ret;

	sha256_buf(data, len, digest);
	hex_encode(digest, 32, hex);
	if (asprintf(&dir, "%s/blobs/sha256", layout) < 0)
		return -ENOMEM;
	ret = write_file_atomic(dir, hex, data, len, 0644);
	free(dir);
	return ret;
}

int oci_link_blob(const char *src_path, const char *layout,
		  const uint8_t digest[32])
{
	struct atomic_file af = { .fd = -1, .dir_fd = -1 };
	char *dst = NULL, *dir = NULL, hex[65];
	uint8_t buf[1 << 16];
	int in = -1, ret;
	ssize_t n = 0;

	ret = oci_blob_path(layout, digest, &dst);
	if (ret)
		return ret;
	if (!access(dst, F_OK) || !link(src_path, dst))
		goto done; /* already there, or hardlinked */
	hex_encode(digest, 32, hex);
	if (asprintf(&dir, "%s/blobs/sha256", layout) < 0) {
		dir = NULL;
		ret = -ENOMEM;
		goto done;
	}
	in = open(src_path, O_RDONLY | O_CLOEXEC);
	ret = in < 0 ? -errno : atomic_file_create(&af, dir, hex, 0644);
	while (!ret && (n = read(in, buf, sizeof(buf))) > 0)
		ret = write_full(af.fd, buf, (size_t)n);
	if (!ret && n < 0)
		ret = -errno;
	if (!ret)
		ret = atomic_file_commit(&af, hex);
done:
	if (ret)
		ferry_err("%s: cannot copy into %s: %s", src_path, layout,
			  ferry_strerror(ret));
	atomic_file_discard(&af);
	if (in >= 0)
		close(in);
	free(dir);
	free(dst);
	return ret;
}

int oci_layout_init(const char *layout)
{
	char *blobs = NULL, *path = NULL;
	int ret = 0;

	if (asprintf(&blobs, "%s/blobs/sha256", layout) < 0 ||
	    asprintf(&path, "%s/oci-layout", layout) < 0) {
		ret = -ENOMEM;
		goto out;
	}
	ret = mkdir_p(blobs, 0755);
	if (!ret && access(path, F_OK))
		ret = write_file_atomic(layout, "oci-layout",
					 "{\"imageLayoutVersion\":\"1.0.0\"}", 30, 0644);
out:
	free(blobs);
	free(path);
	return ret;
}

int oci_tag_manifest(const char *layout, const char *tag,
		     const uint8_t digest[32], uint64_t size,
		     const char *media_type)
{
	struct json_object *index = NULL, *manifests, *entry, *ann;
	char *index_path = NULL, dstr[80], hex[65];
	const char *text;
	size_t i;
	int ret;

	if (asprintf(&index_path, "%s/index.json", layout) < 0)
		return -ENOMEM;
	index = access(index_path, F_OK) ? json_object_new_object() :
					    json_object_from_file(index_path);
	if (!index || !json_object_is_type(index, json_type_object)) {
		ferry_err("%s: cannot parse: %s", index_path, json_util_get_last_err());
		ret = -EFSCORRUPTED;
		goto out;
	}
	json_object_object_add(index, "schemaVersion", json_object_new_int(2));
	json_object_object_add(index, "mediaType",
			       json_object_new_string(FETCH_OCI_INDEX));
	if (!json_object_object_get_ex(index, "manifests", &manifests) ||
	    !json_object_is_type(manifests, json_type_array)) {
		manifests = json_object_new_array();
		json_object_object_add(index, "manifests", manifests);
	}
	/* The tag moves to the new manifest; other entries stay. */
	for (i = json_object_array_length(manifests); i-- > 0;) {
		const char *name;

		entry = json_object_array_get_idx(manifests, i);
		name = oci_annotation(entry, OCI_REF_NAME_ANNOTATION);
		if (name && !strcmp(name, tag))
			json_object_array_del_idx(manifests, i, 1);
	}
	hex_encode(digest, 32, hex);
	snprintf(dstr, sizeof(dstr), "sha256:%s", hex);
	entry = json_object_new_object();
	json_object_object_add(entry, "mediaType", json_object_new_string(media_type));
	json_object_object_add(entry, "digest", json_object_new_string(dstr));
	json_object_object_add(entry, "size", json_object_new_int64((int64_t)size));
	ann = json_object_new_object();
	json_object_object_add(ann, OCI_REF_NAME_ANNOTATION, json_object_new_string(tag));
	json_object_object_add(entry, "annotations", ann);
	json_object_array_add(manifests, entry);
	text = json_object_to_json_string_ext(index, JSON_C_TO_STRING_PLAIN |
						     JSON_C_TO_STRING_NOSLASHESCAPE);
	ret = write_file_atomic(layout, "index.json", text, strlen(text), 0644);
out:
	json_object_put(index);
	free(index_path);
	return ret;
}
