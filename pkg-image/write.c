// SPDX-License-Identifier: MIT
/*
 * Writing images: the converter hands over the bootstrap's bytes and its
 * blobs (already stored in blobs/sha256 under their digests); this file
 * lays them out as the reader in image.c expects them (docs/FORMAT.md):
 *
 *   dir:PATH        PATH/bootstrap (raw EROFS), PATH/ferry.json
 *   oci:PATH[:TAG]  the bootstrap as one zstd frame, the config (the
 *                   source image's, or a minimal one), a manifest whose
 *                   layers are the blobs then the bootstrap, and TAG
 *                   (default "latest") in index.json
 *   docker://REF    the oci: image in a staging layout in $TMPDIR, pushed
 *                   (blobs the registry lacks, then the manifest by tag)
 *                   and removed
 *
 * Every file appears whole (atomic writes); index.json and ferry.json
 * come last, so a reader never finds an index naming missing blobs.
 */
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <zstd.h>

#include "internal.h"

/* The bootstrap is small and compressed once: spend CPU on its size. */
#define BOOTSTRAP_ZSTD_LEVEL 12

struct image_out {
	enum image_transport transport;
	char *dir;       /* where files go: PATH (oci:) or a staging directory */
	char *final;     /* dir: PATH, where the staging directory lands */
	char *parent;    /* dir: PATH's directory */
	char *blobs_dir; /* dir/blobs/sha256 */
	char *tag;       /* oci: the tag */
	char *push_ref;  /* docker: HOST[:PORT]/REPO[:TAG] */
	int lock_fd;     /* flock held on dir while writing */
	bool replace;    /* dir: final holds an image the new one replaces */
	bool committed;  /* dir: the staging directory became final */
	bool created;    /* oci: the layout did not exist before */
};

/* Staging directories: "ferry-push.*" in $TMPDIR, ".NAME.ferry-*" beside dir:NAME. */
#define PUSH_STAGING_PREFIX "ferry-push."
#define DIR_STAGING_INFIX ".ferry-"

/* Remove ferry's temporary files (ATOMIC_TMP_PREFIX) directly in @dir. */
static void remove_tmp_files(const char *dir)
{
	struct dirent *de;
	DIR *d = opendir(dir);

	while (d && (de = readdir(d)))
		if (!strncmp(de->d_name, ATOMIC_TMP_PREFIX, strlen(ATOMIC_TMP_PREFIX)))
			unlinkat(dirfd(d), de->d_name, 0);
	if (d)
		closedir(d);
}

int image_dir_remove(const char *dir)
{
	static const char *const files[] = {
		"index.json", "oci-layout", "bootstrap", "ferry.json",
	};
	char *path = NULL;
	struct dirent *de;
	DIR *d;
	size_t i;

	if (asprintf(&path, "%s/blobs/sha256", dir) < 0)
		return -ENOMEM;
	d = opendir(path);
	while (d && (de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
			unlinkat(dirfd(d), de->d_name, 0);
	if (d)
		closedir(d);
	rmdir(path);
	*strrchr(path, '/') = '\0';
	rmdir(path);
	free(path);
	for (i = 0; i < ARRAY_SIZE(files); i++) {
		if (asprintf(&path, "%s/%s", dir, files[i]) < 0)
			return -ENOMEM;
		unlink(path);
		free(path);
	}
	remove_tmp_files(dir);
	return rmdir(dir) ? -errno : 0;
}

/*
 * Lock the directory @path for writing (LOCK_EX, held until *@fd is
 * closed); with @wait, after saying whom we wait for.
 */
int image_lock_dir(const char *path, bool wait, int *fd)
{
	int ret;

	/* Waiting, it is the layout the user named (a link to it is fine). */
	*fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC | (wait ? 0 : O_NOFOLLOW));
	if (*fd < 0)
		return -errno;
	ret = flock(*fd, LOCK_EX | LOCK_NB) ? -errno : 0;
	if (ret == -EWOULDBLOCK && wait) {
		ferry_info("%s: waiting for another ferry convert writing into it", path);
		while ((ret = flock(*fd, LOCK_EX) ? -errno : 0) == -EINTR)
			;
	}
	if (ret) {
		close(*fd);
		*fd = -1;
	}
	return ret;
}

/*
 * Remove the staging directories in @parent whose names start with
 * @prefix that a killed conversion left: ours (same owner) and unlocked,
 * since a live conversion holds the lock on its own.
 */
static void reclaim_staging(const char *parent, const char *prefix)
{
	struct dirent *de;
	struct stat st;
	char *path;
	DIR *d = opendir(parent);
	int fd;

	while (d && (de = readdir(d))) {
		if (strncmp(de->d_name, prefix, strlen(prefix)) ||
		    asprintf(&path, "%s/%s", parent, de->d_name) < 0)
			continue;
		if (!image_lock_dir(path, false, &fd)) {
			if (!fstat(fd, &st) && st.st_uid == geteuid() &&
			    !image_dir_remove(path))
				ferry_info("%s: removed, left by an interrupted conversion", path);
			close(fd);
		}
		free(path);
	}
	if (d)
		closedir(d);
}

/* A new locked staging directory @parent/@prefix.XXXXXX (mode 0700 until finished). */
static int staging_create(const char *parent, const char *prefix, char **path,
			  int *lock_fd)
{
	int ret;

	reclaim_staging(parent, prefix);
	if (asprintf(path, "%s/%sXXXXXX", parent, prefix) < 0) {
		*path = NULL;
		return -ENOMEM;
	}
	ret = mkdtemp(*path) ? image_lock_dir(*path, false, lock_fd) : -errno;
	if (ret) {
		ferry_err("%s: cannot create a staging directory: %s", *path,
			  ferry_strerror(ret));
		free(*path);
		*path = NULL;
	}
	return ret;
}

/* Whether @dir holds no entry; -errno when it cannot be read. */
static int dir_empty(const char *dir)
{
	struct dirent *de;
	DIR *d = opendir(dir);
	int empty = 1;

	if (!d)
		return -errno;
	while (empty && (de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
			empty = 0;
	closedir(d);
	return empty;
}

static bool has_file(const char *dir, const char *name)
{
	char path[PATH_MAX];

	return snprintf(path, sizeof(path), "%s/%s", dir, name) < (int)sizeof(path) &&
	       !access(path, F_OK);
}

/* The tag @tag in @layout's index.json. */
static bool layout_has_tag(const char *layout, const char *tag)
{
	struct json_object *index, *manifests;
	char path[PATH_MAX];
	const char *name;
	bool found = false;
	size_t i;

	if (snprintf(path, sizeof(path), "%s/index.json", layout) >= (int)sizeof(path) ||
	    access(path, F_OK))
		return false;
	index = json_object_from_file(path);
	if (json_object_object_get_ex(index, "manifests", &manifests) &&
	    json_object_is_type(manifests, json_type_array))
		for (i = 0; !found && i < json_object_array_length(manifests); i++) {
			name = oci_annotation(json_object_array_get_idx(manifests, i),
					      OCI_REF_NAME_ANNOTATION);
			found = name && !strcmp(name, tag);
		}
	json_object_put(index);
	return found;
}

/*
 * What is at the destination @path already decides what may happen: an
 * absent or empty directory is filled; a ferry image (dir:) or a layout
 * (oci:) only with @replace for dir: and for an existing oci: tag;
 * anything else is refused, so a typo never writes into someone's files.
 */
static int check_dest(struct image_out *o, const char *path, bool replace)
{
	struct stat st;
	int empty;

	/* dir: is renamed over, so a link there would be replaced; a layout is written into. */
	if (o->transport == IMAGE_OCI ? stat(path, &st) : lstat(path, &st)) {
		if (errno == ENOENT)
			return 0;
		ferry_err("destination %s: %s", path, strerror(errno));
		return -errno;
	}
	if (!S_ISDIR(st.st_mode)) {
		ferry_err("destination %s exists and is not a directory%s: name a new or empty directory",
			  path, S_ISLNK(st.st_mode) ? " (a symbolic link)" : "");
		return -EEXIST;
	}
	empty = dir_empty(path);
	if (empty < 0) {
		ferry_err("destination %s: %s", path, ferry_strerror(empty));
		return empty;
	}
	if (o->transport == IMAGE_OCI) {
		if (!empty && !has_file(path, "oci-layout")) {
			ferry_err("destination %s is not empty and not an OCI layout (no oci-layout file): name a layout, or a new or empty directory",
				  path);
			return -EEXIST;
		}
		if (!replace && layout_has_tag(path, o->tag ? o->tag : "latest")) {
			ferry_err("destination oci:%s:%s exists: pass --force to move the tag to the new image",
				  path, o->tag ? o->tag : "latest");
			return -EEXIST;
		}
		return 0;
	}
	if (empty)
		return 0;
	if (!has_file(path, "ferry.json") && !has_file(path, "bootstrap")) {
		ferry_err("destination %s is not empty and not a ferry image: name a new or empty directory",
			  path);
		return -EEXIST;
	}
	if (!replace) {
		ferry_err("destination %s holds a ferry image: pass --force to replace it (it stays intact until the new one is complete)",
			  path);
		return -EEXIST;
	}
	o->replace = true;
	return 0;
}

/* dir: PATH is written in .NAME.ferry-XXXXXX beside it. */
static int open_dir_staging(struct image_out *o)
{
	char *parent = strdup(o->final), *slash, *prefix = NULL;
	int ret;

	if (!parent)
		return -ENOMEM;
	o->parent = parent;
	while (strlen(parent) > 1 && parent[strlen(parent) - 1] == '/')
		parent[strlen(parent) - 1] = '\0';
	slash = strrchr(parent, '/');
	if (asprintf(&prefix, ".%s" DIR_STAGING_INFIX, slash ? slash + 1 : parent) < 0) {
		prefix = NULL;
		ret = -ENOMEM;
		goto out;
	}
	if (slash == parent)
		parent[1] = '\0';
	else if (slash)
		*slash = '\0';
	else
		strcpy(parent, ".");
	ret = staging_create(parent, prefix, &o->dir, &o->lock_fd);
out:
	free(prefix);
	return ret;
}

int image_out_open(const struct image_ref *dest, bool replace, struct image_out **out)
{
	struct image_out *o = calloc(1, sizeof(*o));
	const char *tmp = getenv("TMPDIR");
	int ret;

	if (!o)
		return -ENOMEM;
	o->transport = dest->transport;
	o->lock_fd = -1;
	switch (dest->transport) {
	case IMAGE_DIR:
		o->final = strdup(dest->path);
		ret = o->final ? check_dest(o, o->final, replace) : -ENOMEM;
		if (!ret)
			ret = open_dir_staging(o);
		break;
	case IMAGE_OCI:
		o->dir = strdup(dest->path);
		ret = o->dir ? 0 : -ENOMEM;
		if (!ret && dest->tag && !(o->tag = strdup(dest->tag)))
			ret = -ENOMEM;
		if (!ret)
			ret = check_dest(o, o->dir, replace);
		break;
	case IMAGE_DOCKER:
		/* Converted into a staging layout, then pushed from there. */
		o->push_ref = strdup(dest->path);
		ret = o->push_ref ? staging_create(tmp && *tmp ? tmp : "/var/tmp",
						   PUSH_STAGING_PREFIX, &o->dir,
						   &o->lock_fd) : -ENOMEM;
		o->transport = IMAGE_OCI;
		break;
	default:
		ferry_err("%s: not a destination transport", dest->path);
		ret = -EINVAL;
		break;
	}
	if (!ret && asprintf(&o->blobs_dir, "%s/blobs/sha256", o->dir) < 0) {
		o->blobs_dir = NULL;
		ret = -ENOMEM;
	}
	if (ret)
		goto fail;
	o->created = o->push_ref || access(o->dir, F_OK);
	ret = o->transport == IMAGE_DIR ? mkdir_p(o->blobs_dir, 0755) :
					  oci_layout_init(o->dir);
	if (!ret && o->lock_fd < 0) {
		/* An existing layout: one writer at a time, then its leftovers go. */
		ret = image_lock_dir(o->dir, true, &o->lock_fd);
		if (!ret) {
			remove_tmp_files(o->dir);
			remove_tmp_files(o->blobs_dir);
		}
	}
	if (ret)
		goto fail;
	*out = o;
	return 0;
fail:
	image_out_close(o, true);
	return ret;
}

const char *image_out_dir(const struct image_out *o)
{
	return o->dir;
}

const char *image_out_blobs_dir(const struct image_out *o)
{
	return o->blobs_dir;
}

void image_out_close(struct image_out *o, bool failed)
{
	int ret;

	if (!o)
		return;
	if (o->dir && (o->push_ref || (o->final && !o->committed) ||
		       (failed && o->created))) {
		ret = image_dir_remove(o->dir);
		if (ret && (o->push_ref || o->final))
			ferry_warn("%s: staging directory left behind: %s",
				   o->dir, ferry_strerror(ret));
	}
	if (o->lock_fd >= 0)
		close(o->lock_fd);
	free(o->dir);
	free(o->final);
	free(o->parent);
	free(o->blobs_dir);
	free(o->tag);
	free(o->push_ref);
	free(o);
}

/*
 * The complete staging directory becomes dir:PATH in one rename: into an
 * absent or empty PATH, or exchanged with the image there, which is then
 * removed. An interruption before leaves PATH as it was.
 */
static int commit_dir(struct image_out *o)
{
	int ret = 0;

	if (fsync(o->lock_fd) || fchmod(o->lock_fd, 0755))
		ret = -errno;
	else if (o->replace ? renameat2(AT_FDCWD, o->dir, AT_FDCWD, o->final, RENAME_EXCHANGE) :
			      rename(o->dir, o->final))
		ret = -errno;
	if (ret) {
		ferry_err("%s: cannot move the new image into place from %s: %s",
			  o->final, o->dir, ferry_strerror(ret));
		return ret;
	}
	o->committed = true;
	if (o->replace && image_dir_remove(o->dir))
		ferry_warn("%s: the replaced image is left in %s", o->final, o->dir);
	return fsync_dir(o->parent);
}

/* ------------------------------------------------------------------ */
/* dir:                                                                */
/* ------------------------------------------------------------------ */

static int finish_dir(struct image_out *o, const struct image_out_desc *d)
{
	struct json_object *root = NULL, *boot, *list;
	uint8_t boot_digest[BLOB_DIGEST_SIZE];
	char digest[DIGEST_STRING_SIZE];
	const char *text;
	uint32_t i;
	int ret;

	ret = write_file_atomic(o->dir, "bootstrap", d->bootstrap,
				d->bootstrap_len, 0644);
	if (ret)
		return ret;
	sha256_buf(d->bootstrap, d->bootstrap_len, boot_digest);
	root = json_object_new_object();
	boot = json_object_new_object();
	list = json_object_new_array();
	digest_format(boot_digest, digest);
	json_object_object_add(root, "schemaVersion", json_object_new_int(1));
	json_object_object_add(boot, "path", json_object_new_string("bootstrap"));
	json_object_object_add(boot, "digest", json_object_new_string(digest));
	json_object_object_add(boot, "size",
			       json_object_new_int64((int64_t)d->bootstrap_len));
	json_object_object_add(root, "bootstrap", boot);
	for (i = 0; i < d->nr_blobs; i++) {
		const struct image_out_blob *ob = &d->blobs[i];
		struct json_object *b = json_object_new_object();

		digest_format(ob->info->digest, digest);
		json_object_object_add(b, "digest", json_object_new_string(digest));
		json_object_object_add(b, "size", json_object_new_int64((int64_t)ob->info->size));
		json_object_object_add(b, "uncompressedSize",
				       json_object_new_int64((int64_t)ob->info->uncompressed_size));
		json_object_object_add(b, "chunks", json_object_new_int64(ob->info->nr_chunks));
		if (ob->source_layer)
			json_object_object_add(b, "sourceLayer",
					       json_object_new_string(ob->source_layer));
		json_object_array_add(list, b);
	}
	json_object_object_add(root, "blobs", list);
	json_object_object_add(root, "chunkSize", json_object_new_int64(d->chunk_size));
	json_object_object_add(root, "compression", json_object_new_string(d->compression));
	text = json_object_to_json_string_ext(root, JSON_C_TO_STRING_PRETTY |
						    JSON_C_TO_STRING_NOSLASHESCAPE);
	ret = write_file_atomic(o->dir, "ferry.json", text, strlen(text), 0644);
	json_object_put(root);
	return ret;
}

/* ------------------------------------------------------------------ */
/* oci: (and docker:, through a staging layout)                        */
/* ------------------------------------------------------------------ */

struct json_object *oci_descriptor_json(const char *media_type,
					const uint8_t *digest, uint64_t size)
{
	struct json_object *d = json_object_new_object();
	char dstr[DIGEST_STRING_SIZE];

	digest_format(digest, dstr);
	json_object_object_add(d, "mediaType", json_object_new_string(media_type));
	json_object_object_add(d, "digest", json_object_new_string(dstr));
	json_object_object_add(d, "size", json_object_new_int64((int64_t)size));
	return d;
}

void oci_annotate(struct json_object *o, const char *key, const char *value)
{
	struct json_object *ann;

	if (!json_object_object_get_ex(o, "annotations", &ann)) {
		ann = json_object_new_object();
		json_object_object_add(o, "annotations", ann);
	}
	json_object_object_add(ann, key, json_object_new_string(value));
}

/* @digest's diff_id as a ferry layer (FERRY_*_DIFF_ID_PREFIX). */
static void ferry_diff_id(const char *prefix, const uint8_t digest[32], uint8_t out[32])
{
	char text[64 + DIGEST_STRING_SIZE];
	int n;

	n = snprintf(text, sizeof(text), "%s", prefix);
	digest_format(digest, text + n);
	sha256_buf(text, strlen(text), out);
}

/*
 * The image config: the source's (@src, @src_len bytes; NULL: a minimal
 * one for the host's platform) with rootfs.diff_ids replaced by @diff_ids,
 * one per manifest layer, as containerd requires (docs/FORMAT.md 1a).
 */
static int put_config(const char *layout, const uint8_t *src, size_t src_len,
		      const uint8_t (*diff_ids)[32], uint32_t nr,
		      struct oci_descriptor *config)
{
	char platform[64], dstr[DIGEST_STRING_SIZE], *slash;
	struct json_object *root = NULL, *rootfs, *ids;
	struct json_tokener *tok;
	const char *text;
	uint32_t i;
	int ret;

	if (src) {
		tok = json_tokener_new();
		root = tok ? json_tokener_parse_ex(tok, (const char *)src, (int)src_len) : NULL;
		json_tokener_free(tok);
	} else {
		oci_host_platform(platform, sizeof(platform));
		slash = strchr(platform, '/');
		*slash = '\0';
		root = json_object_new_object();
		json_object_object_add(root, "architecture", json_object_new_string(slash + 1));
		json_object_object_add(root, "os", json_object_new_string(platform));
	}
	if (!json_object_is_type(root, json_type_object)) {
		ferry_err("the source image's config is not a JSON object: convert from an image with a valid config");
		ret = -EINVAL;
		goto out;
	}
	if (!json_object_object_get_ex(root, "rootfs", &rootfs) ||
	    !json_object_is_type(rootfs, json_type_object)) {
		rootfs = json_object_new_object();
		json_object_object_add(root, "rootfs", rootfs);
	}
	json_object_object_add(rootfs, "type", json_object_new_string("layers"));
	ids = json_object_new_array();
	json_object_object_add(rootfs, "diff_ids", ids);
	for (i = 0; i < nr; i++) {
		digest_format(diff_ids[i], dstr);
		json_object_array_add(ids, json_object_new_string(dstr));
	}
	text = json_object_to_json_string_ext(root, JSON_C_TO_STRING_PLAIN |
						    JSON_C_TO_STRING_NOSLASHESCAPE);
	config->size = strlen(text);
	if (!config->media_type[0])
		snprintf(config->media_type, sizeof(config->media_type), "%s",
			 OCI_CONFIG_TYPE);
	ret = oci_put_blob(layout, text, config->size, config->digest);
out:
	json_object_put(root);
	return ret;
}

/* Store the bootstrap in @layout as one zstd frame (FERRY_BOOTSTRAP_MEDIA_TYPE). */
static int put_compressed_bootstrap(const char *layout, const uint8_t *data,
				    size_t len, uint8_t digest[32], uint64_t *size)
{
	size_t cap = ZSTD_compressBound(len), n;
	void *z = malloc(cap);
	int ret;

	if (!z)
		return -ENOMEM;
	n = ZSTD_compress(z, cap, data, len, BOOTSTRAP_ZSTD_LEVEL);
	if (ZSTD_isError(n)) {
		ferry_err("bootstrap: zstd: %s", ZSTD_getErrorName(n));
		free(z);
		return -EIO;
	}
	*size = n;
	ret = oci_put_blob(layout, z, n, digest);
	free(z);
	return ret;
}

/* The source image's layers and manifest, named in annotations. */
static int annotate_source(struct json_object *manifest,
			   const struct oci_image *src)
{
	char dstr[DIGEST_STRING_SIZE], *joined = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&joined, &len);
	uint32_t i;

	if (!f)
		return -ENOMEM;
	for (i = 0; i < src->nr_layers; i++) {
		digest_format(src->layers[i].digest, dstr);
		fprintf(f, "%s%s", i ? "," : "", dstr);
	}
	if (fclose(f) || !joined) {
		free(joined);
		return -ENOMEM;
	}
	oci_annotate(manifest, "dev.ferry.source-layers", joined);
	free(joined);
	/* A docker-archive: source has no manifest of its own to name. */
	if (mem_is_zero(src->manifest_desc.digest, 32))
		return 0;
	digest_format(src->manifest_desc.digest, dstr);
	oci_annotate(manifest, "dev.ferry.source-manifest", dstr);
	return 0;
}

/*
 * Complete @manifest with its config (put_config, from @src's or a minimal
 * one) and the format version, and store it in @o, tagged unless it is
 * an index's member.
 */
static int put_manifest(struct image_out *o, struct json_object *manifest,
			const struct oci_image *src, const uint8_t (*diff_ids)[32],
			uint32_t nr, bool index_member, uint8_t digest[32],
			uint64_t *size)
{
	struct oci_descriptor config = { 0 };
	const char *text;
	int ret;

	if (src)
		snprintf(config.media_type, sizeof(config.media_type), "%s",
			 src->config.media_type);
	ret = put_config(o->dir, src ? src->config_data : NULL,
			 src ? src->config_len : 0, diff_ids, nr, &config);
	if (ret)
		return ret;
	json_object_object_add(manifest, "config",
			       oci_descriptor_json(config.media_type, config.digest,
					       config.size));
	oci_annotate(manifest, "dev.ferry.version", FERRY_FORMAT_VERSION);
	text = json_object_to_json_string_ext(manifest, JSON_C_TO_STRING_PLAIN |
							JSON_C_TO_STRING_NOSLASHESCAPE);
	*size = strlen(text);
	ret = oci_put_blob(o->dir, text, *size, digest);
	if (!ret && !index_member)
		ret = oci_tag_manifest(o->dir, o->tag ? o->tag : "latest", digest,
				       *size, FETCH_OCI_MANIFEST);
	return ret;
}

/* blobs, bootstrap blob, config, manifest, index.json. */
static int finish_oci(struct image_out *o, const struct image_out_desc *d,
		      uint8_t manifest_digest[32], uint64_t *manifest_size)
{
	struct json_object *manifest = NULL, *layers, *desc;
	char num[32], dstr[DIGEST_STRING_SIZE];
	uint8_t zboot_digest[BLOB_DIGEST_SIZE], boot_digest[32], (*diff_ids)[32];
	uint64_t zboot_size = 0;
	uint32_t i;
	int ret;

	diff_ids = calloc(d->nr_blobs + 1, sizeof(*diff_ids));
	if (!diff_ids)
		return -ENOMEM;
	sha256_buf(d->bootstrap, d->bootstrap_len, boot_digest);
	ferry_diff_id(FERRY_BOOTSTRAP_DIFF_ID_PREFIX, boot_digest, diff_ids[d->nr_blobs]);
	ret = put_compressed_bootstrap(o->dir, d->bootstrap, d->bootstrap_len,
				       zboot_digest, &zboot_size);
	if (ret)
		goto out;

	manifest = json_object_new_object();
	json_object_object_add(manifest, "schemaVersion", json_object_new_int(2));
	json_object_object_add(manifest, "mediaType",
			       json_object_new_string(FETCH_OCI_MANIFEST));
	json_object_object_add(manifest, "config", NULL); /* put_manifest's */
	layers = json_object_new_array();
	for (i = 0; i < d->nr_blobs; i++) {
		const struct image_out_blob *ob = &d->blobs[i];

		ferry_diff_id(FERRY_BLOB_DIFF_ID_PREFIX, ob->info->digest, diff_ids[i]);
		desc = oci_descriptor_json(FERRY_BLOB_MEDIA_TYPE, ob->info->digest,
				       ob->info->size);
		snprintf(num, sizeof(num), "%llu",
			 (unsigned long long)ob->info->uncompressed_size);
		oci_annotate(desc, "dev.ferry.blob.uncompressed-size", num);
		if (ob->source_layer)
			oci_annotate(desc, "dev.ferry.blob.source-layer", ob->source_layer);
		if (ob->from_dict)
			oci_annotate(desc, "dev.ferry.blob.chunk-dict", "true");
		oci_annotate(desc, FERRY_SNAPSHOT_BLOB_LABEL, "true");
		json_object_array_add(layers, desc);
	}
	desc = oci_descriptor_json(FERRY_BOOTSTRAP_MEDIA_TYPE, zboot_digest, zboot_size);
	oci_annotate(desc, "dev.ferry.bootstrap", "true");
	digest_format(boot_digest, dstr);
	oci_annotate(desc, FERRY_BOOTSTRAP_DIGEST_ANNOTATION, dstr);
	snprintf(num, sizeof(num), "%llu", (unsigned long long)d->bootstrap_len);
	oci_annotate(desc, "dev.ferry.bootstrap.uncompressed-size", num);
	oci_annotate(desc, FERRY_SNAPSHOT_BOOTSTRAP_LABEL, "true");
	json_object_array_add(layers, desc);
	json_object_object_add(manifest, "layers", layers);
	snprintf(num, sizeof(num), "%u", d->chunk_size);
	oci_annotate(manifest, "dev.ferry.chunk-size", num);
	oci_annotate(manifest, "dev.ferry.compression", d->compression);
	if (d->source) {
		ret = annotate_source(manifest, d->source);
		if (ret)
			goto out;
	}
	ret = put_manifest(o, manifest, d->source, (const uint8_t (*)[32])diff_ids,
			   d->nr_blobs + 1, d->index_member, manifest_digest,
			   manifest_size);
out:
	json_object_put(manifest);
	free(diff_ids);
	return ret;
}

/* Layer @l of @src into @o's blobs: linked or copied from a layout, else streamed. */
static int copy_layer(struct image_out *o, const struct oci_image *src,
		      const struct oci_descriptor *l)
{
	struct atomic_file af = { .fd = -1, .dir_fd = -1 };
	struct fetch_stream *st = NULL;
	char *path = NULL, hex[65];
	uint8_t buf[1 << 16];
	ssize_t n = 0;
	int ret;

	if (src->layout) {
		ret = oci_blob_path(src->layout, l->digest, &path);
		if (!ret)
			ret = oci_link_blob(path, o->dir, l->digest);
		free(path);
		return ret;
	}
	hex_encode(l->digest, 32, hex);
	ret = registry_open_stream(src->remote, l->digest, l->size, &st);
	if (!ret)
		ret = atomic_file_create(&af, o->blobs_dir, hex, 0644);
	while (!ret && (n = fetch_stream_read(st, buf, sizeof(buf))) > 0)
		ret = write_full(af.fd, buf, (size_t)n);
	if (!ret && n < 0)
		ret = (int)n;
	if (!ret)
		ret = atomic_file_commit(&af, hex);
	if (ret)
		ferry_err("%s: layer sha256:%s: cannot copy it into %s: %s", src->where,
			  hex, o->dir, ferry_strerror(ret));
	atomic_file_discard(&af);
	fetch_stream_close(st);
	return ret;
}

int image_out_upgrade(struct image_out *o, const struct oci_image *src,
		      const struct fetch_opts *fopts, struct ferry_progress *progress,
		      char manifest_digest[DIGEST_STRING_SIZE], uint64_t *manifest_size)
{
	struct json_object *manifest, *layers, *desc;
	uint8_t digest[32], (*diff_ids)[32];
	const char *s;
	uint32_t i, last = src->nr_layers - 1;
	int ret = 0;

	if (o->transport != IMAGE_OCI || !oci_is_old_ferry(src)) {
		ferry_err("%s: a ferry image of an earlier format is upgraded only into oci: or docker://; choose such a destination",
			  src->where);
		return -EINVAL;
	}
	manifest = NULL;
	diff_ids = calloc(src->nr_layers, sizeof(*diff_ids));
	if (!diff_ids || json_object_deep_copy(src->manifest, &manifest, NULL)) {
		ret = -ENOMEM;
		goto out;
	}
	json_object_object_get_ex(manifest, "layers", &layers);
	for (i = 0; !ret && i < src->nr_layers; i++) {
		desc = json_object_array_get_idx(layers, i);
		if (i == last) {
			s = oci_annotation(desc, FERRY_BOOTSTRAP_DIGEST_ANNOTATION);
			if (!s || digest_parse(s, digest)) {
				ferry_err("%s: bootstrap layer lacks a valid %s annotation",
					  src->where, FERRY_BOOTSTRAP_DIGEST_ANNOTATION);
				ret = -EFSCORRUPTED;
				break;
			}
			ferry_diff_id(FERRY_BOOTSTRAP_DIFF_ID_PREFIX, digest, diff_ids[i]);
		} else if (!oci_is_ferry_blob(src->layers[i].media_type)) {
			ferry_err("%s: layer %u is %s, not a ferry blob", src->where, i,
				  src->layers[i].media_type);
			ret = -EFSCORRUPTED;
			break;
		} else {
			ferry_diff_id(FERRY_BLOB_DIFF_ID_PREFIX, src->layers[i].digest,
				      diff_ids[i]);
		}
		json_object_object_add(desc, "mediaType", json_object_new_string(
			i == last ? FERRY_BOOTSTRAP_MEDIA_TYPE : FERRY_BLOB_MEDIA_TYPE));
		oci_annotate(desc, i == last ? FERRY_SNAPSHOT_BOOTSTRAP_LABEL :
					   FERRY_SNAPSHOT_BLOB_LABEL, "true");
		ret = copy_layer(o, src, &src->layers[i]);
	}
	if (!ret)
		ret = put_manifest(o, manifest, src, (const uint8_t (*)[32])diff_ids,
				   src->nr_layers, false, digest, manifest_size);
	if (!ret)
		digest_format(digest, manifest_digest);
	if (!ret && o->push_ref)
		ret = oci_push(o->dir, digest, *manifest_size, o->push_ref, false, fopts,
			       progress);
out:
	json_object_put(manifest);
	free(diff_ids);
	return ret;
}

int image_out_finish(struct image_out *o, const struct image_out_desc *d,
		     char manifest_digest[DIGEST_STRING_SIZE],
		     uint64_t *manifest_size)
{
	uint8_t digest[32];
	int ret;

	if (o->transport == IMAGE_DIR) {
		ret = finish_dir(o, d);
		return ret ? ret : commit_dir(o);
	}
	ret = finish_oci(o, d, digest, manifest_size);
	if (ret)
		return ret;
	digest_format(digest, manifest_digest);
	if (o->push_ref)
		ret = oci_push(o->dir, digest, *manifest_size, o->push_ref,
			       d->index_member, d->fetch, d->progress);
	return ret;
}

/* "os/arch[/variant]" as an index entry's platform object. */
static struct json_object *platform_json(const char *platform)
{
	struct json_object *p = json_object_new_object();
	const char *arch = strchr(platform, '/'), *variant;

	if (!p || !arch)
		return p;
	variant = strchr(arch + 1, '/');
	json_object_object_add(p, "architecture",
			       json_object_new_string_len(arch + 1, variant ?
					(int)(variant - arch - 1) : (int)strlen(arch + 1)));
	json_object_object_add(p, "os", json_object_new_string_len(platform,
						(int)(arch - platform)));
	if (variant)
		json_object_object_add(p, "variant", json_object_new_string(variant + 1));
	return p;
}

int image_out_finish_index(struct image_out *o,
			   const struct image_out_index_entry *entries,
			   uint32_t nr, const struct fetch_opts *fopts,
			   char index_digest[DIGEST_STRING_SIZE], uint64_t *index_size)
{
	struct json_object *index, *manifests;
	uint8_t digest[32];
	const char *text;
	uint32_t i;
	int ret;

	if (o->transport == IMAGE_DIR) {
		ferry_err("%s: an image index is written to oci: or docker://, not dir:",
			  o->final);
		return -EINVAL;
	}
	index = json_object_new_object();
	manifests = json_object_new_array();
	json_object_object_add(index, "schemaVersion", json_object_new_int(2));
	json_object_object_add(index, "mediaType", json_object_new_string(FETCH_OCI_INDEX));
	json_object_object_add(index, "manifests", manifests);
	for (i = 0; i < nr; i++) {
		struct json_object *d = oci_descriptor_json(FETCH_OCI_MANIFEST,
							entries[i].digest,
							entries[i].size);

		json_object_object_add(d, "platform", platform_json(entries[i].platform));
		json_object_array_add(manifests, d);
	}
	oci_annotate(index, "dev.ferry.version", FERRY_FORMAT_VERSION);
	text = json_object_to_json_string_ext(index, JSON_C_TO_STRING_PLAIN |
						     JSON_C_TO_STRING_NOSLASHESCAPE);
	*index_size = strlen(text);
	ret = oci_put_blob(o->dir, text, *index_size, digest);
	if (!ret && o->push_ref)
		ret = oci_push_index(o->push_ref, text, *index_size, fopts);
	else if (!ret)
		ret = oci_tag_manifest(o->dir, o->tag ? o->tag : "latest", digest,
				       *index_size, FETCH_OCI_INDEX);
	if (!ret)
		digest_format(digest, index_digest);
	json_object_put(index);
	return ret;
}

/* ------------------------------------------------------------------ */
/* Native EROFS layers                                                 */
/* ------------------------------------------------------------------ */

/*
 * The config of a native-layer image: the source's (or a minimal one)
 * with rootfs.diff_ids naming the EROFS layers and "erofs" among
 * os.features, as containerd's EROFS converter marks its images.
 */
static int put_layers_config(const char *layout,
			     const struct image_out_layers_desc *d,
			     struct oci_descriptor *config)
{
	struct json_object *cfg = NULL, *rootfs, *ids, *features, *f;
	char dstr[DIGEST_STRING_SIZE], platform[64], *slash;
	bool has_erofs = false;
	const char *text;
	int ret;

	if (d->source) {
		ret = json_parse_object((const char *)d->source->config_data,
					d->source->config_len, &cfg);
		if (ret) {
			ferry_err("%s: the image config: not a JSON object",
				  d->source->where);
			return ret;
		}
	} else {
		oci_host_platform(platform, sizeof(platform));
		slash = strchr(platform, '/');
		*slash = '\0';
		cfg = json_object_new_object();
		json_object_object_add(cfg, "architecture",
				       json_object_new_string(slash + 1));
		json_object_object_add(cfg, "os", json_object_new_string(platform));
	}
	rootfs = json_object_new_object();
	ids = json_object_new_array();
	for (uint32_t i = 0; i < d->nr_layers; i++) {
		digest_format(d->layers[i].digest, dstr);
		json_object_array_add(ids, json_object_new_string(dstr));
	}
	json_object_object_add(rootfs, "type", json_object_new_string("layers"));
	json_object_object_add(rootfs, "diff_ids", ids);
	json_object_object_add(cfg, "rootfs", rootfs);
	if (!json_object_object_get_ex(cfg, "os.features", &features) ||
	    !json_object_is_type(features, json_type_array)) {
		features = json_object_new_array();
		json_object_object_add(cfg, "os.features", features);
	}
	for (size_t i = 0; i < json_object_array_length(features); i++) {
		f = json_object_array_get_idx(features, i);
		has_erofs |= json_object_is_type(f, json_type_string) &&
			     !strcmp(json_object_get_string(f), "erofs");
	}
	if (!has_erofs)
		json_object_array_add(features, json_object_new_string("erofs"));
	text = json_object_to_json_string_ext(cfg, JSON_C_TO_STRING_PLAIN |
						   JSON_C_TO_STRING_NOSLASHESCAPE);
	config->size = strlen(text);
	snprintf(config->media_type, sizeof(config->media_type), "%s",
		 OCI_CONFIG_TYPE);
	ret = oci_put_blob(layout, text, config->size, config->digest);
	json_object_put(cfg);
	return ret;
}

int image_out_finish_layers(struct image_out *o,
			    const struct image_out_layers_desc *d,
			    char manifest_digest[DIGEST_STRING_SIZE],
			    uint64_t *manifest_size)
{
	struct json_object *manifest = NULL, *layers, *desc;
	struct oci_descriptor config;
	char dstr[DIGEST_STRING_SIZE];
	uint8_t digest[32];
	const char *text;
	int ret;

	if (o->transport == IMAGE_DIR) {
		ferry_err("%s: native EROFS layers are written to oci: or docker:// images, not dir:",
			  o->final);
		return -EINVAL;
	}
	ret = put_layers_config(o->dir, d, &config);
	if (ret)
		return ret;
	manifest = json_object_new_object();
	json_object_object_add(manifest, "schemaVersion", json_object_new_int(2));
	json_object_object_add(manifest, "mediaType",
			       json_object_new_string(FETCH_OCI_MANIFEST));
	json_object_object_add(manifest, "config",
			       oci_descriptor_json(OCI_CONFIG_TYPE, config.digest,
					       config.size));
	layers = json_object_new_array();
	for (uint32_t i = 0; i < d->nr_layers; i++) {
		desc = oci_descriptor_json(d->media_type, d->layers[i].digest,
				       d->layers[i].size);
		if (d->layers[i].source) {
			digest_format(d->layers[i].source, dstr);
			oci_annotate(desc, "dev.ferry.layer.source", dstr);
		}
		if (d->layers[i].ranges_offset) {
			char off[24];

			snprintf(off, sizeof(off), "%llu",
				 (unsigned long long)d->layers[i].ranges_offset);
			oci_annotate(desc, LAYER_RANGES_OFFSET_ANNOTATION, off);
			digest_format(d->layers[i].ranges_digest, dstr);
			oci_annotate(desc, LAYER_RANGES_DIGEST_ANNOTATION, dstr);
		}
		json_object_array_add(layers, desc);
	}
	json_object_object_add(manifest, "layers", layers);
	if (d->source) {
		ret = annotate_source(manifest, d->source);
		if (ret)
			goto out;
	}
	text = json_object_to_json_string_ext(manifest, JSON_C_TO_STRING_PLAIN |
							JSON_C_TO_STRING_NOSLASHESCAPE);
	*manifest_size = strlen(text);
	ret = oci_put_blob(o->dir, text, *manifest_size, digest);
	if (!ret && !d->index_member)
		ret = oci_tag_manifest(o->dir, o->tag ? o->tag : "latest", digest,
				       *manifest_size, FETCH_OCI_MANIFEST);
	if (ret)
		goto out;
	digest_format(digest, manifest_digest);
	if (o->push_ref)
		ret = oci_push(o->dir, digest, *manifest_size, o->push_ref,
			       d->index_member, d->fetch, d->progress);
out:
	json_object_put(manifest);
	return ret;
}
