// SPDX-License-Identifier: MIT
/*
 * The chunk cache's records: images (DIR/images/<hex>.json, each naming
 * the blobs and the other files an image needs) and pins (DIR/pins: the
 * blobs of a --mode local mount, kept while it is mounted). Records only
 * matter to gc and eviction, which keep the blobs they name; the fill
 * path (cache.c) never reads them.
 */
#include <dirent.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "../pkg-base/base.h"
#include "internal.h"

/* Largest image record read back. */
#define CACHE_RECORD_MAX (16u << 20)

void cache_records_free(struct cache_records *rs)
{
	uint32_t i;

	for (i = 0; i < rs->nr; i++) {
		free(rs->r[i].ref);
		free(rs->r[i].blobs);
		free(rs->r[i].keep);
	}
	free(rs->r);
	memset(rs, 0, sizeof(*rs));
}

static int digest_cmp(const void *a, const void *b)
{
	return memcmp(a, b, BLOB_DIGEST_SIZE);
}

/* A directory entry named <64 hex><suffix>: the digest, else -EINVAL. */
int cache_name_digest(const char *name, const char *suffix,
		       uint8_t out[BLOB_DIGEST_SIZE])
{
	char hex[CACHE_HEX_LEN + 1];

	if (strlen(name) != CACHE_HEX_LEN + strlen(suffix) ||
	    strcmp(name + CACHE_HEX_LEN, suffix) ||
	    !hex_is_lower(name, CACHE_HEX_LEN))
		return -EINVAL;
	memcpy(hex, name, CACHE_HEX_LEN);
	hex[CACHE_HEX_LEN] = '\0';
	return hex_decode(hex, out, BLOB_DIGEST_SIZE);
}

/*
 * The array of "sha256:…" strings @list into *@out (malloc'ed, at least
 * one slot) and *@nr; -EFSCORRUPTED if it is anything else.
 */
static int digests_parse(struct json_object *list,
			 uint8_t (**out)[BLOB_DIGEST_SIZE], uint32_t *nr)
{
	size_t i, n;

	if (!json_object_is_type(list, json_type_array))
		return -EFSCORRUPTED;
	n = json_object_array_length(list);
	if (n > UINT32_MAX)
		return -EFSCORRUPTED;
	*out = malloc(MAX(n, (size_t)1) * BLOB_DIGEST_SIZE);
	if (!*out)
		return -ENOMEM;
	for (i = 0; i < n; i++) {
		struct json_object *v = json_object_array_get_idx(list, i);

		if (!json_object_is_type(v, json_type_string) ||
		    digest_parse(json_object_get_string(v), (*out)[i]))
			return -EFSCORRUPTED;
	}
	*nr = (uint32_t)n;
	return 0;
}

/* Parse record file @path (named after @digest) into @r. */
static int record_parse(const char *path, const uint8_t digest[BLOB_DIGEST_SIZE],
			struct cache_record *r, const char **why)
{
	struct json_object *root = NULL, *v, *m = NULL, *blobs, *keep;
	uint8_t d[BLOB_DIGEST_SIZE];
	char *text = NULL;
	size_t len = 0;
	uint32_t i, n = 0;
	int ret;

	memset(r, 0, sizeof(*r));
	ret = read_file_max(path, CACHE_RECORD_MAX, &text, &len);
	if (ret) {
		*why = ferry_strerror(ret);
		return ret;
	}
	*why = "not a JSON object";
	ret = json_parse_object(text, len, &root);
	if (ret) {
		ret = ret == -ENOMEM ? ret : -EFSCORRUPTED;
		goto out;
	}
	ret = -EFSCORRUPTED;
	*why = "\"digest\" missing or not the file's name";
	if (!json_object_object_get_ex(root, "digest", &v) ||
	    !json_object_is_type(v, json_type_string) ||
	    digest_parse(json_object_get_string(v), d) ||
	    memcmp(d, digest, BLOB_DIGEST_SIZE))
		goto out;
	*why = "\"ref\" missing or not a string";
	if (!json_object_object_get_ex(root, "ref", &v) ||
	    !json_object_is_type(v, json_type_string))
		goto out;
	*why = "\"mountId\" not a number";
	if (json_object_object_get_ex(root, "mountId", &m) &&
	    (!json_object_is_type(m, json_type_int) || json_object_get_int64(m) < 0))
		goto out;
	r->mount_id = m ? (uint64_t)json_object_get_int64(m) : 0;
	r->ref = strdup(json_object_get_string(v));
	if (!r->ref) {
		ret = -ENOMEM;
		goto out;
	}
	*why = "\"blobs\" missing or not an array of sha256 digests";
	if (!json_object_object_get_ex(root, "blobs", &blobs))
		goto out;
	ret = digests_parse(blobs, &r->blobs, &n);
	if (ret)
		goto out;
	/* "keep" came later: older records have none. */
	*why = "\"keep\" not an array of sha256 digests";
	if (json_object_object_get_ex(root, "keep", &keep)) {
		ret = digests_parse(keep, &r->keep, &r->nr_keep);
		if (ret)
			goto out;
	}
	qsort(r->blobs, n, BLOB_DIGEST_SIZE, digest_cmp);
	for (i = 0; i < n; i++)
		if (!r->nr_blobs || memcmp(r->blobs[r->nr_blobs - 1],
					   r->blobs[i], BLOB_DIGEST_SIZE))
			memmove(r->blobs[r->nr_blobs++], r->blobs[i],
				BLOB_DIGEST_SIZE);
	memcpy(r->digest, digest, BLOB_DIGEST_SIZE);
	ret = 0;
out:
	if (ret) {
		free(r->ref);
		free(r->blobs);
		free(r->keep);
		memset(r, 0, sizeof(*r));
	}
	json_object_put(root);
	free(text);
	return ret;
}

/*
 * Check the cache's directories that exist (blob_cache_dir): what gc,
 * listing and verify read below them is then only root's to change.
 */
int cache_check_existing(const char *cache_dir)
{
	static const char *const subs[] = { CACHE_BLOBS_DIR, CACHE_IMAGES_DIR, CACHE_PINS_DIR };
	size_t i;
	int ret;

	for (i = 0; i < ARRAY_SIZE(subs); i++) {
		ret = blob_cache_dir(cache_dir, subs[i], false, NULL);
		if (ret && ret != -ENOENT)
			return ret;
	}
	return 0;
}

/*
 * Every readable image record of @cache_dir, sorted by digest. A record
 * that does not parse is reported and skipped: it names nothing that can
 * be trusted, and the cache only ever costs a refetch.
 */
int cache_records_read(const char *cache_dir, const char *sub, struct cache_records *rs)
{
	char dir[PATH_MAX], path[PATH_MAX];
	struct dirent *de;
	DIR *d;
	int n, ret = 0;

	memset(rs, 0, sizeof(*rs));
	n = snprintf(dir, sizeof(dir), "%s/%s", cache_dir, sub);
	if (n < 0 || (size_t)n >= sizeof(dir))
		return -ENAMETOOLONG;
	ret = cache_check_existing(cache_dir);
	if (!ret)
		ret = cache_open_dir(dir, &d);
	if (ret || !d)
		return ret;
	while ((errno = 0, de = readdir(d))) {
		uint8_t digest[BLOB_DIGEST_SIZE];
		const char *why;

		if (de->d_name[0] == '.')
			continue; /* ".", "..", temporary files */
		if (cache_name_digest(de->d_name, ".json", digest)) {
			ferry_warn("chunk cache: %s/%s: unexpected file, ignored",
				   dir, de->d_name);
			continue;
		}
		ret = array_reserve(&rs->r, &rs->cap, rs->nr + 1,
				    sizeof(*rs->r), 16);
		if (ret)
			break;
		if (cache_path_join(path, dir, de->d_name, ""))
			continue;
		ret = record_parse(path, digest, &rs->r[rs->nr], &why);
		if (ret == -ENOMEM)
			break;
		if (ret == -ENOENT) { /* forgotten meanwhile */
			ret = 0;
			continue;
		}
		if (ret) {
			ferry_warn("chunk cache: record %s: %s; ignored",
				   path, why);
			ret = 0;
			continue;
		}
		rs->nr++;
	}
	if (!ret && errno) {
		ret = -errno;
		ferry_err("chunk cache: reading %s: %s", dir,
			  ferry_strerror(ret));
	}
	closedir(d);
	if (ret)
		cache_records_free(rs);
	else if (rs->nr)
		qsort(rs->r, rs->nr, sizeof(*rs->r), digest_cmp);
	return ret;
}

/* Image records naming @digest. */
uint32_t cache_records_naming(const struct cache_records *rs,
			      const uint8_t digest[BLOB_DIGEST_SIZE])
{
	uint32_t i, n = 0;

	for (i = 0; i < rs->nr; i++)
		if (bsearch(digest, rs->r[i].blobs, rs->r[i].nr_blobs,
			    BLOB_DIGEST_SIZE, digest_cmp))
			n++;
	return n;
}

/*
 * Write the record @sub/<hex of @name>.json: @ref, the blobs @digests,
 * the other files @keep and, for a pin, @mount_id (0: none).
 */
static int record_write(const char *cache_dir, const char *sub,
			const uint8_t name[BLOB_DIGEST_SIZE], const char *ref,
			uint64_t mount_id, const uint8_t (*digests)[BLOB_DIGEST_SIZE],
			uint32_t nr_digests, const uint8_t (*keep)[BLOB_DIGEST_SIZE],
			uint32_t nr_keep)
{
	char dig[DIGEST_STRING_SIZE], file[80], dir[PATH_MAX];
	struct json_object *root;
	const char *text;
	bool ok;
	int ret = -ENOMEM;

	if (cache_path_join(dir, cache_dir, sub, ""))
		return -ENAMETOOLONG;
	digest_format(name, dig);
	snprintf(file, sizeof(file), "%s.json", dig + 7);
	root = json_object_new_object();
	ok = root && json_add_str(root, "ref", ref ? ref : "") &&
	     json_add_str(root, "digest", dig) &&
	     json_add(root, "blobs", json_digest_array(digests, nr_digests));
	if (ok && nr_keep)
		ok = json_add(root, "keep", json_digest_array(keep, nr_keep));
	if (ok && mount_id)
		ok = json_add(root, "mountId", json_object_new_int64((int64_t)mount_id));
	ok = ok && json_add(root, "updated", json_object_new_int64((int64_t)time(NULL)));
	root = json_done(root, ok);
	text = root ? json_object_to_json_string_ext(root, JSON_C_TO_STRING_PRETTY |
						     JSON_C_TO_STRING_NOSLASHESCAPE) : NULL;
	if (text) {
		ret = blob_cache_dir(cache_dir, sub, true, NULL);
		if (!ret)
			ret = write_file_atomic(dir, file, text, strlen(text), 0600);
	}
	json_object_put(root);
	return ret;
}

int blob_cache_add_image(const char *cache_dir, const char *ref,
			 const uint8_t image_digest[BLOB_DIGEST_SIZE],
			 const uint8_t (*digests)[BLOB_DIGEST_SIZE],
			 uint32_t nr_digests, const uint8_t (*keep)[BLOB_DIGEST_SIZE],
			 uint32_t nr_keep)
{
	return record_write(cache_dir, CACHE_IMAGES_DIR, image_digest, ref, 0,
			    digests, nr_digests, keep, nr_keep);
}

int blob_cache_pin_mount(const char *cache_dir, const char *mountpoint,
			 uint64_t mount_id, const uint8_t (*digests)[BLOB_DIGEST_SIZE],
			 uint32_t nr_digests)
{
	uint8_t name[BLOB_DIGEST_SIZE];
	char *key = NULL;
	int ret;

	/* One pin per mount: named after its id and mount point. */
	if (asprintf(&key, "%llu %s", (unsigned long long)mount_id, mountpoint) < 0)
		return -ENOMEM;
	sha256_buf(key, strlen(key), name);
	free(key);
	ret = record_write(cache_dir, CACHE_PINS_DIR, name, mountpoint, mount_id,
			   digests, nr_digests, NULL, 0);
	if (ret)
		ferry_err("chunk cache %s: cannot record the mount on %s: %s (gc may remove its blobs while it is mounted)",
			  cache_dir, mountpoint, ferry_strerror(ret));
	return ret;
}

/*
 * The pins of mounts that still exist; a pin whose mount is gone is
 * removed, and one that cannot be checked is kept.
 */
int cache_pins_read(const char *cache_dir, struct cache_records *pins)
{
	char dir[PATH_MAX], path[PATH_MAX], hex[CACHE_HEX_LEN + 1];
	struct cache_record *r;
	int ret = cache_path_join(dir, cache_dir, CACHE_PINS_DIR, "");

	if (!ret)
		ret = cache_records_read(cache_dir, CACHE_PINS_DIR, pins);
	for (r = pins->r; !ret && r < pins->r + pins->nr; r++) {
		if (mountinfo_has(r->mount_id, r->ref) != 0)
			continue;
		hex_encode(r->digest, BLOB_DIGEST_SIZE, hex);
		if (!cache_path_join(path, dir, hex, ".json"))
			unlink(path);
		r->nr_blobs = 0; /* names nothing any more */
	}
	return ret;
}

/* blob_cache_named (@keep false) and blob_cache_kept (@keep true). */
static int records_union(const char *cache_dir, bool keep,
			 uint8_t (**out)[BLOB_DIGEST_SIZE], uint32_t *nr)
{
	struct cache_records rs[2] = { { 0 }, { 0 } };
	uint8_t (*d)[BLOB_DIGEST_SIZE] = NULL;
	size_t cap = 0, n = 0;
	uint32_t i, k, j;
	int ret = cache_records_read(cache_dir, CACHE_IMAGES_DIR, &rs[0]);

	if (!ret)
		ret = cache_pins_read(cache_dir, &rs[1]);
	for (k = 0; !ret && k < 2; k++)
		for (i = 0; !ret && i < rs[k].nr; i++) {
			const struct cache_record *r = &rs[k].r[i];
			uint32_t m = keep ? r->nr_keep : r->nr_blobs;

			ret = array_reserve(&d, &cap, n + m, sizeof(*d), 64);
			for (j = 0; !ret && j < m; j++)
				memcpy(d[n++], keep ? r->keep[j] : r->blobs[j],
				       BLOB_DIGEST_SIZE);
		}
	cache_records_free(&rs[0]);
	cache_records_free(&rs[1]);
	if (ret) {
		free(d);
		return ret;
	}
	if (n)
		qsort(d, n, sizeof(*d), digest_cmp);
	/* Unique. */
	for (i = 0, j = 0; i < n; i++)
		if (!j || memcmp(d[j - 1], d[i], BLOB_DIGEST_SIZE))
			memmove(d[j++], d[i], BLOB_DIGEST_SIZE);
	*out = d;
	*nr = j;
	return 0;
}

int blob_cache_named(const char *cache_dir, uint8_t (**out)[BLOB_DIGEST_SIZE],
		     uint32_t *nr)
{
	return records_union(cache_dir, false, out, nr);
}

int blob_cache_kept(const char *cache_dir, uint8_t (**out)[BLOB_DIGEST_SIZE],
		    uint32_t *nr)
{
	return records_union(cache_dir, true, out, nr);
}

int blob_cache_forget_image(const char *cache_dir,
			    const uint8_t *image_digest)
{
	char dir[PATH_MAX], path[PATH_MAX], hex[CACHE_HEX_LEN + 1];
	struct dirent *de;
	DIR *d;
	int n, ret = 0;

	n = snprintf(dir, sizeof(dir), "%s/" CACHE_IMAGES_DIR, cache_dir);
	if (n < 0 || (size_t)n >= sizeof(dir))
		return -ENAMETOOLONG;
	ret = cache_check_existing(cache_dir);
	if (ret)
		return ret;
	if (image_digest) {
		hex_encode(image_digest, BLOB_DIGEST_SIZE, hex);
		if (cache_path_join(path, dir, hex, ".json"))
			return -ENAMETOOLONG;
		if (unlink(path)) {
			ret = -errno;
			ferry_err("chunk cache: cannot forget image sha256:%s (%s): %s",
				  hex, path, ferry_strerror(ret));
			return ret;
		}
		return fsync_dir(dir);
	}
	ret = cache_open_dir(dir, &d);
	if (ret || !d)
		return ret;
	while ((errno = 0, de = readdir(d))) {
		uint8_t digest[BLOB_DIGEST_SIZE];

		if (cache_name_digest(de->d_name, ".json", digest))
			continue;
		if (cache_path_join(path, dir, de->d_name, ""))
			continue;
		ret = cache_remove_file(path, true);
		if (ret)
			break;
	}
	if (!ret && errno) {
		ret = -errno;
		ferry_err("chunk cache: reading %s: %s", dir,
			  ferry_strerror(ret));
	}
	closedir(d);
	return ret ? ret : fsync_dir(dir);
}
