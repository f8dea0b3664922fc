// SPDX-License-Identifier: MIT
/*
 * oci-archive:PATH[:TAG] and docker-archive:PATH sources: a tar file that
 * holds an OCI image layout (skopeo copy ... oci-archive:), or what docker
 * save writes (manifest.json naming a config and one tar per layer;
 * skopeo's docker-archive: too, whose layer names are symlinks to tars
 * named by their diff_id; docker 25 and later name blobs/sha256/<hex>).
 *
 * Nothing is extracted. One pass over the headers indexes the members,
 * passing over their data with lseek; documents are then read from their
 * members (at most OCI_JSON_MAX bytes each) and each layer is streamed
 * from its member into the converter, checked against its digest as an
 * oci: layout's layer is. docker and skopeo write every layer before the
 * manifest or index that names it, so no archive they write could be
 * converted in a single pass: a pipe, a device or a compressed archive
 * is refused, saying how to make a plain file of it.
 *
 * The archive is untrusted. It is opened without following a symbolic
 * link and must be a regular file; every read stays inside its member;
 * symlink and hardlink members are followed inside the archive (never on
 * the file system), at most ARCHIVE_LINKS_MAX of them per name, and a
 * name that would climb out of the archive is refused.
 */
#include <fcntl.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "tar.h"

#define ARCHIVE_MEMBERS_MAX 65536u
#define ARCHIVE_LINKS_MAX 8u
#define DOCKER_MANIFEST "manifest.json"

struct archive_member {
	char *name;      /* normalised: "a/b" */
	char *link;      /* a symlink's target, or a hardlink's member; else NULL */
	bool hardlink;   /* @link names a member from the archive's top */
	uint64_t off, size;
};

struct convert_archive {
	char *where;     /* "oci-archive:PATH", for messages */
	int fd;
	uint64_t size;
	struct archive_member *members;
	size_t nr, cap;
	uint32_t *layers; /* member of the image's layer i */
};

/* A byte range of the archive file, read with pread; skip moves on. */
struct archive_range {
	int fd;
	uint64_t pos, end;
};

static ssize_t range_read(void *ctx, void *buf, size_t len)
{
	struct archive_range *r = ctx;
	ssize_t n;

	len = (size_t)MIN((uint64_t)len, r->end - r->pos);
	if (!len)
		return 0;
	do
		n = pread(r->fd, buf, len, (off_t)r->pos);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	r->pos += (uint64_t)n;
	return n;
}

static int64_t range_skip(void *ctx, uint64_t len)
{
	struct archive_range *r = ctx;

	len = MIN(len, r->end - r->pos);
	r->pos += len;
	return (int64_t)len;
}

static struct byte_source range_source(struct archive_range *r)
{
	return (struct byte_source){ range_read, r, range_skip };
}

/* @name of a tar entry, normalised into *@out; -EFSCORRUPTED climbing out. */
static int member_name(const struct convert_archive *a, const char *name,
		       char **out)
{
	char *n = strdup(name);

	if (!n)
		return -ENOMEM;
	if (path_normalize(n)) {
		ferry_err("%s: member \"%s\" climbs out of the archive", a->where, name);
		free(n);
		return -EFSCORRUPTED;
	}
	*out = n;
	return 0;
}

static int add_member(struct convert_archive *a, const struct tar_entry *e,
		      uint64_t off)
{
	struct archive_member m = { .off = off, .size = e->size };
	int ret;

	if (a->nr == ARCHIVE_MEMBERS_MAX) {
		ferry_err("%s: more than %u members", a->where, ARCHIVE_MEMBERS_MAX);
		return -EFSCORRUPTED;
	}
	ret = member_name(a, e->path, &m.name);
	if (!ret && e->type != TAR_REG) {
		m.size = 0;
		m.hardlink = e->type == TAR_HARDLINK;
		m.link = strdup(e->linkname);
		if (!m.link)
			ret = -ENOMEM;
	}
	if (!ret && array_reserve(&a->members, &a->cap, a->nr + 1,
				  sizeof(*a->members), 64))
		ret = -ENOMEM;
	if (ret) {
		free(m.name);
		free(m.link);
		return ret;
	}
	a->members[a->nr++] = m;
	return 0;
}

static int member_cmp(const void *x, const void *y)
{
	return strcmp(((const struct archive_member *)x)->name,
		      ((const struct archive_member *)y)->name);
}

/*
 * One pass over the headers: every file, symlink and hardlink member,
 * then sorted by name (a name twice is refused: which one is meant?).
 */
static int index_members(struct convert_archive *a)
{
	struct archive_range all = { a->fd, 0, a->size };
	struct tar_reader *r = NULL;
	struct tar_entry *e;
	int ret = tar_reader_new(range_source(&all), &r);

	while (!ret && (ret = tar_next(r, &e)) == 1)
		ret = e->type == TAR_REG || e->type == TAR_SYMLINK ||
		      e->type == TAR_HARDLINK ? add_member(a, e, tar_offset(r)) : 0;
	tar_reader_free(r);
	if (ret) {
		ferry_err("%s: not a tar archive ferry can read", a->where);
		return ret;
	}
	if (a->nr)
		qsort(a->members, a->nr, sizeof(*a->members), member_cmp);
	for (size_t i = 1; i < a->nr; i++)
		if (!strcmp(a->members[i - 1].name, a->members[i].name)) {
			ferry_err("%s: member \"%s\" appears twice", a->where,
				  a->members[i].name);
			return -EFSCORRUPTED;
		}
	return 0;
}

/*
 * The file member @name names, through symlink and hardlink members;
 * -ENOENT (logged) when there is none.
 */
static int find_member(const struct convert_archive *a, const char *name,
		       const struct archive_member **out)
{
	char *path = NULL, *next = NULL;
	unsigned int links = 0;
	int ret = member_name(a, name, &path);

	while (!ret) {
		const struct archive_member key = { .name = path }, *m;
		const char *target, *slash;
		size_t dir_len;

		m = a->nr ? bsearch(&key, a->members, a->nr, sizeof(*m), member_cmp) :
			    NULL;
		if (!m) {
			ferry_err("%s: no member \"%s\"", a->where, name);
			ret = -ENOENT;
			break;
		}
		if (!m->link) {
			*out = m;
			break;
		}
		if (++links > ARCHIVE_LINKS_MAX) {
			ferry_err("%s: \"%s\" goes through more than %u links", a->where,
				  name, ARCHIVE_LINKS_MAX);
			ret = -EFSCORRUPTED;
			break;
		}
		/* A symlink's target is relative to its directory: "../" climbs. */
		target = m->link;
		slash = strrchr(path, '/');
		dir_len = m->hardlink || target[0] == '/' || !slash ? 0 :
			  (size_t)(slash - path);
		while (!strncmp(target, "../", 3)) {
			if (!dir_len) {
				ferry_err("%s: link \"%s\" -> \"%s\" climbs out of the archive",
					  a->where, m->name, m->link);
				ret = -EFSCORRUPTED;
				break;
			}
			slash = memrchr(path, '/', dir_len);
			dir_len = slash ? (size_t)(slash - path) : 0;
			target += 3;
		}
		if (!ret && asprintf(&next, "%.*s/%s", (int)dir_len, path, target) < 0)
			ret = -ENOMEM;
		if (!ret) {
			free(path);
			path = NULL;
			ret = member_name(a, next, &path);
			free(next);
			next = NULL;
		}
	}
	free(path);
	return ret;
}

/* oci_file_read_fn, and docker's documents: a member, at most @max bytes. */
static int read_member(void *ctx, const char *name, size_t max,
		       uint8_t **data, size_t *len)
{
	const struct convert_archive *a = ctx;
	const struct archive_member *m;
	uint8_t *buf;
	int ret = find_member(a, name, &m);

	if (ret)
		return ret;
	if (m->size > max) {
		ferry_err("%s: member \"%s\" has %llu bytes, more than %zu", a->where,
			  name, (unsigned long long)m->size, max);
		return -EFBIG;
	}
	buf = malloc((size_t)m->size + 1);
	if (!buf)
		return -ENOMEM;
	ret = pread_full(a->fd, buf, (size_t)m->size, m->off);
	if (ret) {
		ferry_err("%s: member \"%s\": %s", a->where, name, ferry_strerror(ret));
		free(buf);
		return ret;
	}
	buf[m->size] = '\0';
	*data = buf;
	*len = (size_t)m->size;
	return 0;
}

static const char *const compressed_magics[][2] = {
	{ "\x1f\x8b", "gzip: gunzip" },
	{ "\x28\xb5\x2f\xfd", "zstd: zstd -d" },
	{ "\xfd" "7zXZ", "xz: unxz" },
};

static int archive_open(const struct image_ref *ref, struct convert_archive **out)
{
	struct convert_archive *a = calloc(1, sizeof(*a));
	const char *kind = ref->transport == IMAGE_OCI_ARCHIVE ? "oci-archive" :
							       "docker-archive";
	uint8_t head[8] = { 0 };
	struct stat st;
	int ret;

	if (!a)
		return -ENOMEM;
	a->fd = -1;
	*out = a;
	if (asprintf(&a->where, "%s:%s", kind, ref->path) < 0) {
		a->where = NULL;
		return -ENOMEM;
	}
	a->fd = open(ref->path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	if (a->fd < 0) {
		ret = -errno;
		ferry_err("%s: %s", a->where, ret == -ELOOP ?
			  "a symbolic link: archives are opened without following links; name the file itself" :
			  strerror(-ret));
		return ret;
	}
	if (fstat(a->fd, &st))
		return -errno;
	if (!S_ISREG(st.st_mode)) {
		ferry_err("%s: not a regular file: its layers are read in place, after the manifest at its end; save the archive to a file first",
			  a->where);
		return -EINVAL;
	}
	a->size = (uint64_t)st.st_size;
	if (pread(a->fd, head, sizeof(head), 0) < 0)
		return -errno;
	for (size_t i = 0; i < ARRAY_SIZE(compressed_magics); i++)
		if (!memcmp(head, compressed_magics[i][0], strlen(compressed_magics[i][0]))) {
			ferry_err("%s: compressed (%s it first): layers are read in place from a plain tar",
				  a->where, compressed_magics[i][1]);
			return -EINVAL;
		}
	return index_members(a);
}

void archive_close(struct convert_archive *a)
{
	if (!a)
		return;
	for (size_t i = 0; i < a->nr; i++) {
		free(a->members[i].name);
		free(a->members[i].link);
	}
	free(a->members);
	free(a->layers);
	if (a->fd >= 0)
		close(a->fd);
	free(a->where);
	free(a);
}

/* "sha256:<hex>" at the end of @name (".../<hex>", "<hex>.json", "<hex>.tar"). */
static bool digest_in_name(const char *name, uint8_t digest[32])
{
	const char *base = strrchr(name, '/');
	char hex[65];

	base = base ? base + 1 : name;
	if (strlen(base) < 64 || (base[64] && strcmp(base + 64, ".json") &&
				  strcmp(base + 64, ".tar")))
		return false;
	memcpy(hex, base, 64);
	hex[64] = '\0';
	return !hex_decode(hex, digest, 32);
}

static const char *json_string_at(struct json_object *array, size_t i)
{
	struct json_object *v = json_object_array_get_idx(array, i);

	return json_object_is_type(v, json_type_string) ? json_object_get_string(v) : NULL;
}

/* The config named @name, checked against the digest its name carries. */
static int docker_config(struct convert_archive *a, const char *name,
			 struct oci_image *img, struct json_object **cfg)
{
	const struct archive_member *m;
	uint8_t digest[32];
	int ret = find_member(a, name, &m);

	if (ret)
		return ret;
	if (!digest_in_name(m->name, img->config.digest)) {
		ferry_err("%s: config \"%s\" is not named by its sha256: it cannot be checked",
			  a->where, name);
		return -EFSCORRUPTED;
	}
	ret = read_member(a, name, OCI_JSON_MAX, &img->config_data, &img->config_len);
	if (ret)
		return ret;
	img->config.size = img->config_len;
	snprintf(img->config.media_type, sizeof(img->config.media_type), "%s",
		 OCI_CONFIG_TYPE);
	sha256_buf(img->config_data, img->config_len, digest);
	if (memcmp(digest, img->config.digest, 32)) {
		ferry_err("%s: config \"%s\": content does not match its digest",
			  a->where, name);
		return -EFSCORRUPTED;
	}
	ret = json_parse_object((const char *)img->config_data, img->config_len, cfg);
	if (ret)
		ferry_err("%s: config \"%s\" is not a JSON object", a->where, name);
	return ret ? -EFSCORRUPTED : 0;
}

/*
 * Layer @i named @name: its member, and the digest its bytes must have:
 * the one its name carries (blobs/sha256/<hex>), else the config's
 * diff_id (docker save's <id>/layer.tar, an uncompressed tar).
 */
static int docker_layer(struct convert_archive *a, struct json_object *diff_ids,
			uint32_t i, const char *name, struct oci_descriptor *d)
{
	const struct archive_member *m;
	const char *diff_id = json_string_at(diff_ids, i);
	int ret = find_member(a, name, &m);

	if (ret)
		return ret;
	a->layers[i] = (uint32_t)(m - a->members);
	d->size = m->size;
	snprintf(d->media_type, sizeof(d->media_type), "%s",
		 "application/vnd.oci.image.layer.v1.tar");
	if (!strncmp(m->name, "blobs/sha256/", 13) && digest_in_name(m->name, d->digest))
		return 0;
	if (!diff_id || digest_parse(diff_id, d->digest)) {
		ferry_err("%s: layer %u (\"%s\") has no diff_id in the config to check it against",
			  a->where, i + 1, name);
		return -EFSCORRUPTED;
	}
	return 0;
}

/* The manifest of a docker-archive, for the converter's annotations. */
static struct json_object *docker_manifest(const struct oci_image *img)
{
	struct json_object *m = json_object_new_object(), *layers = json_object_new_array();
	char dstr[DIGEST_STRING_SIZE];

	json_object_object_add(m, "schemaVersion", json_object_new_int(2));
	json_object_object_add(m, "mediaType", json_object_new_string(FETCH_OCI_MANIFEST));
	for (uint32_t i = 0; i < img->nr_layers; i++) {
		struct json_object *l = json_object_new_object();

		digest_format(img->layers[i].digest, dstr);
		json_object_object_add(l, "mediaType",
				       json_object_new_string(img->layers[i].media_type));
		json_object_object_add(l, "digest", json_object_new_string(dstr));
		json_object_object_add(l, "size", json_object_new_int64((int64_t)img->layers[i].size));
		json_object_array_add(layers, l);
	}
	json_object_object_add(m, "layers", layers);
	return m;
}

/*
 * docker save's manifest.json: one image, its config, its layers. There
 * is no OCI manifest, so img->manifest_desc stays zero (no
 * dev.ferry.source-manifest is written) and img->manifest lists the layers.
 */
static int docker_open(struct convert_archive *a, struct oci_image *img)
{
	struct json_object *doc = NULL, *entry, *layers, *cfg = NULL, *rootfs, *ids = NULL;
	uint8_t *data = NULL;
	const char *config;
	size_t len = 0, n;
	int ret = read_member(a, DOCKER_MANIFEST, OCI_JSON_MAX, &data, &len);

	if (ret == -ENOENT)
		ferry_err("%s: no %s: not what docker save writes (an OCI layout in a tar is oci-archive:)",
			  a->where, DOCKER_MANIFEST);
	if (ret)
		return ret;
	doc = json_tokener_parse((const char *)data);
	free(data);
	if (!doc || !json_object_is_type(doc, json_type_array) ||
	    json_object_array_length(doc) != 1) {
		ferry_err("%s: %s is not an array of one image (save one image per archive)",
			  a->where, DOCKER_MANIFEST);
		ret = -EFSCORRUPTED;
		goto out;
	}
	entry = json_object_array_get_idx(doc, 0);
	config = json_get_string(entry, "Config");
	if (!config || !json_object_object_get_ex(entry, "Layers", &layers) ||
	    !json_object_is_type(layers, json_type_array)) {
		ferry_err("%s: %s has no Config and Layers", a->where, DOCKER_MANIFEST);
		ret = -EFSCORRUPTED;
		goto out;
	}
	ret = docker_config(a, config, img, &cfg);
	if (ret)
		goto out;
	if (json_object_object_get_ex(cfg, "rootfs", &rootfs))
		json_object_object_get_ex(rootfs, "diff_ids", &ids);
	n = json_object_array_length(layers);
	if (!ids || !json_object_is_type(ids, json_type_array) ||
	    json_object_array_length(ids) != n) {
		ferry_err("%s: the config's rootfs.diff_ids do not match the %zu layers",
			  a->where, n);
		ret = -EFSCORRUPTED;
		goto out;
	}
	img->layers = calloc(n + 1, sizeof(*img->layers));
	a->layers = calloc(n + 1, sizeof(*a->layers));
	if (!img->layers || !a->layers) {
		ret = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; !ret && i < n; i++) {
		const char *name = json_string_at(layers, i);

		if (!name) {
			ferry_err("%s: layer %zu is not a name", a->where, i + 1);
			ret = -EFSCORRUPTED;
		} else {
			ret = docker_layer(a, ids, (uint32_t)i, name, &img->layers[i]);
		}
	}
	img->nr_layers = (uint32_t)n;
	if (!ret)
		img->manifest = docker_manifest(img);
out:
	json_object_put(cfg);
	json_object_put(doc);
	return ret;
}

/* The members of an OCI layout's layers: blobs/sha256/<hex>. */
static int oci_layers(struct convert_archive *a, const struct oci_image *img)
{
	a->layers = calloc(img->nr_layers + 1, sizeof(*a->layers));
	if (!a->layers)
		return -ENOMEM;
	for (uint32_t i = 0; i < img->nr_layers; i++) {
		const struct archive_member *m;
		char name[96];
		int ret;

		memcpy(name, "blobs/sha256/", 13);
		hex_encode(img->layers[i].digest, 32, name + 13);
		ret = find_member(a, name, &m);
		if (ret)
			return ret;
		a->layers[i] = (uint32_t)(m - a->members);
	}
	return 0;
}

int archive_image_open(const struct image_ref *ref, const char *platform,
		       struct oci_image *img)
{
	struct convert_archive *a = NULL;
	int ret;

	memset(img, 0, sizeof(*img));
	ret = archive_open(ref, &a);
	if (!ret && ref->transport == IMAGE_OCI_ARCHIVE) {
		ret = oci_image_open_files(a->where, ref->tag, platform, read_member,
					   a, img);
		if (!ret)
			ret = oci_layers(a, img);
	} else if (!ret) {
		img->where = strdup(a->where);
		ret = img->where ? docker_open(a, img) : -ENOMEM;
	}
	if (ret) {
		archive_close(a);
		oci_image_free(img);
		return ret;
	}
	img->archive = a;
	return 0;
}

int archive_apply_layer(struct converter *c, const struct oci_image *img,
			const struct oci_descriptor *d, const char *name)
{
	const struct convert_archive *a = img->archive;
	const struct archive_member *m = &a->members[a->layers[d - img->layers]];
	struct archive_range r = { a->fd, m->off, m->off + m->size };
	struct input_stream *in = NULL;
	int ret;

	if (m->size != d->size) {
		ferry_err("%s: %s: member \"%s\" has %llu bytes, its descriptor %llu",
			  a->where, name, m->name, (unsigned long long)m->size,
			  (unsigned long long)d->size);
		return -EFSCORRUPTED;
	}
	ret = input_open_source(range_source(&r), d->digest, name, &in);
	if (!ret)
		ret = convert_apply_input(c, in, d->size, name);
	input_close(in);
	return ret;
}
