// SPDX-License-Identifier: MIT
/*
 * The chunk cache's bookkeeping: image records (DIR/images/<hex>.json),
 * listing, and gc. Records only matter to gc, which keeps the blobs they
 * name and removes the rest when nobody has them open: a blob's users hold
 * a shared flock on its map, gc takes it exclusively before removing the
 * pair. The fill path (cache.c) never reads records.
 */
#include "internal.h"
#include "../pkg-base/base.h"

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

/* Temporary files (ATOMIC_TMP_PREFIX) older than this are gc's to remove. */
#define CACHE_TMP_AGE_S 60
/* Largest image record read back. */
#define CACHE_RECORD_MAX (16u << 20)

static bool cache_is_hex(const char *s, size_t len)
{
	size_t i;

	for (i = 0; i < len; i++)
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return false;
	return true;
}

/* @dir/@name@suffix into @out (PATH_MAX bytes), or -ENAMETOOLONG. */
static int path_join(char *out, const char *dir, const char *name,
		     const char *suffix)
{
	int n = snprintf(out, PATH_MAX, "%s/%s%s", dir, name, suffix);

	return n < 0 || n >= PATH_MAX ? -ENAMETOOLONG : 0;
}

/* unlink @path (@missing_ok: ENOENT is fine); 0 or -errno, logged. */
static int remove_file(const char *path, bool missing_ok)
{
	int ret;

	if (!unlink(path) || (missing_ok && errno == ENOENT))
		return 0;
	ret = -errno;
	ferry_err("chunk cache: cannot remove %s: %s", path, ferry_strerror(ret));
	return ret;
}

/* opendir; a missing directory is *@d NULL (nothing cached yet). */
static int open_dir(const char *dir, DIR **d)
{
	int ret;

	*d = opendir(dir);
	if (*d || errno == ENOENT)
		return 0;
	ret = -errno;
	ferry_err("chunk cache: cannot read %s: %s", dir, ferry_strerror(ret));
	return ret;
}

static int cache_fsync_dir(const char *dir)
{
	int fd, ret = 0;

	fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0 || fsync(fd))
		ret = -errno;
	if (fd >= 0)
		close(fd);
	if (ret)
		ferry_err("chunk cache: fsync of directory %s: %s", dir,
			  ferry_strerror(ret));
	return ret;
}

/* ------------------------------------------------------------------ */
/* Image records                                                       */
/* ------------------------------------------------------------------ */

struct cache_record {
	uint8_t digest[BLOB_DIGEST_SIZE];
	char *ref;                          /* a pin: the mount point */
	uint64_t mount_id;                  /* a pin: the mount's id */
	uint8_t (*blobs)[BLOB_DIGEST_SIZE]; /* sorted, no duplicates */
	uint32_t nr_blobs;
	uint8_t (*keep)[BLOB_DIGEST_SIZE];  /* other files it needs, as given */
	uint32_t nr_keep;
};

struct cache_records {
	struct cache_record *r;
	uint32_t nr;
	size_t cap;
};

static void records_free(struct cache_records *rs)
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
static int name_digest(const char *name, const char *suffix,
		       uint8_t out[BLOB_DIGEST_SIZE])
{
	char hex[CACHE_HEX_LEN + 1];

	if (strlen(name) != CACHE_HEX_LEN + strlen(suffix) ||
	    strcmp(name + CACHE_HEX_LEN, suffix) ||
	    !cache_is_hex(name, CACHE_HEX_LEN))
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
static int records_read(const char *cache_dir, const char *sub,
			struct cache_records *rs)
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
		ret = open_dir(dir, &d);
	if (ret || !d)
		return ret;
	while ((errno = 0, de = readdir(d))) {
		uint8_t digest[BLOB_DIGEST_SIZE];
		const char *why;

		if (de->d_name[0] == '.')
			continue; /* ".", "..", temporary files */
		if (name_digest(de->d_name, ".json", digest)) {
			ferry_warn("chunk cache: %s/%s: unexpected file, ignored",
				   dir, de->d_name);
			continue;
		}
		ret = array_reserve(&rs->r, &rs->cap, rs->nr + 1,
				    sizeof(*rs->r), 16);
		if (ret)
			break;
		if (path_join(path, dir, de->d_name, ""))
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
		records_free(rs);
	else if (rs->nr)
		qsort(rs->r, rs->nr, sizeof(*rs->r), digest_cmp);
	return ret;
}

/* Image records naming @digest. */
static uint32_t records_naming(const struct cache_records *rs,
			       const uint8_t digest[BLOB_DIGEST_SIZE])
{
	uint32_t i, n = 0;

	for (i = 0; i < rs->nr; i++)
		if (bsearch(digest, rs->r[i].blobs, rs->r[i].nr_blobs,
			    BLOB_DIGEST_SIZE, digest_cmp))
			n++;
	return n;
}

/* @digests as an array of "sha256:…" strings, or NULL (no memory). */
static struct json_object *digests_json(const uint8_t (*digests)[BLOB_DIGEST_SIZE],
					uint32_t nr)
{
	struct json_object *list = json_object_new_array();
	char dig[DIGEST_STRING_SIZE];
	uint32_t i;

	for (i = 0; list && i < nr; i++) {
		digest_format(digests[i], dig);
		if (json_object_array_add(list, json_object_new_string(dig))) {
			json_object_put(list);
			list = NULL;
		}
	}
	return list;
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

	if (path_join(dir, cache_dir, sub, ""))
		return -ENAMETOOLONG;
	digest_format(name, dig);
	snprintf(file, sizeof(file), "%s.json", dig + 7);
	root = json_object_new_object();
	ok = root && json_add_str(root, "ref", ref ? ref : "") &&
	     json_add_str(root, "digest", dig) &&
	     json_add(root, "blobs", digests_json(digests, nr_digests));
	if (ok && nr_keep)
		ok = json_add(root, "keep", digests_json(keep, nr_keep));
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
static int pins_read(const char *cache_dir, struct cache_records *pins)
{
	char dir[PATH_MAX], path[PATH_MAX], hex[CACHE_HEX_LEN + 1];
	struct cache_record *r;
	int ret = path_join(dir, cache_dir, CACHE_PINS_DIR, "");

	if (!ret)
		ret = records_read(cache_dir, CACHE_PINS_DIR, pins);
	for (r = pins->r; !ret && r < pins->r + pins->nr; r++) {
		if (mountinfo_has(r->mount_id, r->ref) != 0)
			continue;
		hex_encode(r->digest, BLOB_DIGEST_SIZE, hex);
		if (!path_join(path, dir, hex, ".json"))
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
	int ret = records_read(cache_dir, CACHE_IMAGES_DIR, &rs[0]);

	if (!ret)
		ret = pins_read(cache_dir, &rs[1]);
	for (k = 0; !ret && k < 2; k++)
		for (i = 0; !ret && i < rs[k].nr; i++) {
			const struct cache_record *r = &rs[k].r[i];
			uint32_t m = keep ? r->nr_keep : r->nr_blobs;

			ret = array_reserve(&d, &cap, n + m, sizeof(*d), 64);
			for (j = 0; !ret && j < m; j++)
				memcpy(d[n++], keep ? r->keep[j] : r->blobs[j],
				       BLOB_DIGEST_SIZE);
		}
	records_free(&rs[0]);
	records_free(&rs[1]);
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
		if (path_join(path, dir, hex, ".json"))
			return -ENAMETOOLONG;
		if (unlink(path)) {
			ret = -errno;
			ferry_err("chunk cache: cannot forget image sha256:%s (%s): %s",
				  hex, path, ferry_strerror(ret));
			return ret;
		}
		return cache_fsync_dir(dir);
	}
	ret = open_dir(dir, &d);
	if (ret || !d)
		return ret;
	while ((errno = 0, de = readdir(d))) {
		uint8_t digest[BLOB_DIGEST_SIZE];

		if (name_digest(de->d_name, ".json", digest))
			continue;
		if (path_join(path, dir, de->d_name, ""))
			continue;
		ret = remove_file(path, true);
		if (ret)
			break;
	}
	if (!ret && errno) {
		ret = -errno;
		ferry_err("chunk cache: reading %s: %s", dir,
			  ferry_strerror(ret));
	}
	closedir(d);
	return ret ? ret : cache_fsync_dir(dir);
}

/* ------------------------------------------------------------------ */
/* Listing and gc                                                      */
/* ------------------------------------------------------------------ */

/* A blob seen in DIR/blobs/sha256. */
struct cache_file {
	uint8_t digest[BLOB_DIGEST_SIZE];
	bool map, data;
};

struct cache_scan {
	struct cache_file *f;
	uint32_t nr;
	size_t cap;
	char **tmp; /* temporary files (names) */
	uint32_t nr_tmp;
	size_t tmp_cap;
};

static void scan_free(struct cache_scan *s)
{
	uint32_t i;

	for (i = 0; i < s->nr_tmp; i++)
		free(s->tmp[i]);
	free(s->tmp);
	free(s->f);
	memset(s, 0, sizeof(*s));
}

static int file_cmp(const void *a, const void *b)
{
	return memcmp(((const struct cache_file *)a)->digest,
		      ((const struct cache_file *)b)->digest, BLOB_DIGEST_SIZE);
}

static int scan_add_tmp(struct cache_scan *s, const char *name)
{
	if (array_reserve(&s->tmp, &s->tmp_cap, s->nr_tmp + 1, sizeof(*s->tmp), 8))
		return -ENOMEM;
	s->tmp[s->nr_tmp] = strdup(name);
	if (!s->tmp[s->nr_tmp])
		return -ENOMEM;
	s->nr_tmp++;
	return 0;
}

/*
 * The blobs (map and/or data file) and temporary files in @dir, sorted by
 * digest; other names are reported and left alone. Missing dir: empty.
 */
static int scan_blobs(const char *dir, struct cache_scan *s)
{
	struct dirent *de;
	uint32_t i, j;
	DIR *d;
	int ret = 0;

	memset(s, 0, sizeof(*s));
	ret = open_dir(dir, &d);
	if (ret || !d)
		return ret;
	while ((errno = 0, de = readdir(d))) {
		struct cache_file cf = { .map = true };

		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (!strncmp(de->d_name, ATOMIC_TMP_PREFIX,
			     strlen(ATOMIC_TMP_PREFIX))) {
			ret = scan_add_tmp(s, de->d_name);
			if (ret)
				break;
			continue;
		}
		if (!name_digest(de->d_name, CACHE_INDEX_SUFFIX, cf.digest))
			continue; /* goes with its map */
		if (name_digest(de->d_name, ".map", cf.digest)) {
			cf.map = false;
			cf.data = true;
			if (name_digest(de->d_name, ".data", cf.digest)) {
				ferry_warn("chunk cache: %s/%s: unexpected file, ignored",
					   dir, de->d_name);
				continue;
			}
		}
		ret = array_reserve(&s->f, &s->cap, s->nr + 1, sizeof(*s->f),
				    16);
		if (ret)
			break;
		s->f[s->nr++] = cf;
	}
	if (!ret && errno) {
		ret = -errno;
		ferry_err("chunk cache: reading %s: %s", dir,
			  ferry_strerror(ret));
	}
	closedir(d);
	if (ret) {
		scan_free(s);
		return ret;
	}
	/* Merge the .map and .data entries of each blob. */
	if (s->nr)
		qsort(s->f, s->nr, sizeof(*s->f), file_cmp);
	for (i = 0, j = 0; i < s->nr; i++) {
		if (j && !file_cmp(&s->f[j - 1], &s->f[i])) {
			s->f[j - 1].map |= s->f[i].map;
			s->f[j - 1].data |= s->f[i].data;
		} else {
			s->f[j++] = s->f[i];
		}
	}
	s->nr = j;
	return 0;
}

/* Allocated bytes of @path, 0 when it does not exist. */
static uint64_t disk_bytes(const char *path)
{
	struct stat st;

	if (lstat(path, &st))
		return 0;
	return (uint64_t)st.st_blocks * 512;
}

/*
 * Fill @e from the map file @path: header fields, present chunks and
 * whether another handle holds it. A damaged map is reported and its
 * fields left zero.
 */
static int list_map(const char *path, struct blob_cache_entry *e)
{
	uint8_t h[CACHE_MAP_HEADER_SIZE], buf[65536];
	struct cache_map_header mh;
	const char *why = "map file has the wrong size";
	struct stat st;
	uint64_t off, end;
	int fd, ret;

	fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		ret = -errno;
		if (ret == -ENOENT)
			return 0; /* removed meanwhile */
		ferry_err("chunk cache: cannot open %s: %s", path,
			  ferry_strerror(ret));
		return ret;
	}
	ret = cache_flock(fd, LOCK_EX | LOCK_NB);
	if (ret == -EWOULDBLOCK)
		e->in_use = true;
	else if (ret)
		goto out;
	else
		flock(fd, LOCK_UN);
	if (fstat(fd, &st)) {
		ret = -errno;
		goto out;
	}
	ret = 0;
	if ((uint64_t)st.st_size < CACHE_MAP_HEADER_SIZE ||
	    pread_full(fd, h, sizeof(h), 0) ||
	    cache_map_header_decode(h, &mh, &why) ||
	    (uint64_t)st.st_size != CACHE_MAP_HEADER_SIZE +
					    (uint64_t)mh.nr_chunks) {
		ferry_warn("chunk cache: %s: %s", path, why);
		goto out;
	}
	e->nr_chunks = mh.nr_chunks;
	e->uncompressed_size = mh.uncompressed_size;
	end = (uint64_t)st.st_size;
	for (off = CACHE_MAP_HEADER_SIZE; off < end;) {
		size_t n = (size_t)MIN((uint64_t)sizeof(buf), end - off), i;

		ret = pread_full(fd, buf, n, off);
		if (ret)
			break;
		for (i = 0; i < n; i++)
			e->chunks_present += buf[i] == CACHE_STATE_PRESENT;
		off += n;
	}
out:
	if (ret)
		ferry_err("chunk cache: reading %s: %s", path,
			  ferry_strerror(ret));
	close(fd);
	return ret;
}

static int blobs_usage(const char *dir, uint64_t *bytes);

/* What ferryd said it keeps the cache within, if it did (lenient: advice only). */
static int read_limit(const char *cache_dir, struct blob_cache_list *out)
{
	struct json_object *o = NULL;
	char path[PATH_MAX], *text = NULL;
	uint64_t pct = 0;
	size_t len;
	int ret;

	if (path_join(path, cache_dir, CACHE_LIMIT_FILE, ""))
		return -ENAMETOOLONG;
	ret = read_file_max(path, 4096, &text, &len);
	if (ret)
		return ret == -ENOENT ? 0 : ret;
	if (!json_parse_object(text, len, &o) &&
	    !json_read_u64(o, "maxSize", UINT64_MAX, &out->max_size, NULL, 0) &&
	    !json_read_u64(o, "minFreePct", 99, &pct, NULL, 0) &&
	    !json_read_u64(o, "evictedBytes", UINT64_MAX, &out->evicted, NULL, 0)) {
		out->min_free_pct = (unsigned int)pct;
		out->limited = true;
	} else {
		ferry_warn("chunk cache: %s is damaged; ignored", path);
	}
	json_object_put(o);
	free(text);
	return 0;
}

int blob_cache_record_limit(const char *cache_dir,
			    const struct blob_cache_limit *lim, uint64_t evicted)
{
	char buf[160];
	int n = snprintf(buf, sizeof(buf),
			 "{\"maxSize\":%llu,\"minFreePct\":%u,\"evictedBytes\":%llu}\n",
			 (unsigned long long)lim->max_size, lim->min_free_pct,
			 (unsigned long long)evicted);

	return write_file_atomic(cache_dir, CACHE_LIMIT_FILE, buf, (size_t)n, 0600);
}

int blob_cache_list(const char *cache_dir, struct blob_cache_list *out)
{
	struct cache_records rs, pins = { 0 };
	struct cache_scan s = { 0 };
	char dir[PATH_MAX], path[PATH_MAX], hex[CACHE_HEX_LEN + 1];
	uint32_t i;
	int n, ret;

	memset(out, 0, sizeof(*out));
	n = snprintf(dir, sizeof(dir), "%s/" CACHE_BLOBS_DIR, cache_dir);
	if (n < 0 || (size_t)n >= sizeof(dir))
		return -ENAMETOOLONG;
	ret = records_read(cache_dir, CACHE_IMAGES_DIR, &rs);
	if (ret)
		return ret;
	ret = pins_read(cache_dir, &pins);
	if (!ret)
		ret = scan_blobs(dir, &s);
	if (ret)
		goto out;
	out->blobs = calloc(MAX(s.nr, 1u), sizeof(*out->blobs));
	out->images = calloc(MAX(rs.nr, 1u), sizeof(*out->images));
	if (!out->blobs || !out->images) {
		ret = -ENOMEM;
		goto out;
	}
	for (i = 0; i < s.nr; i++) {
		struct blob_cache_entry *e = &out->blobs[out->nr_blobs++];

		memcpy(e->digest, s.f[i].digest, BLOB_DIGEST_SIZE);
		hex_encode(e->digest, BLOB_DIGEST_SIZE, hex);
		if (path_join(path, dir, hex, ".data")) {
			ret = -ENAMETOOLONG;
			goto out;
		}
		e->disk_bytes = disk_bytes(path);
		if (path_join(path, dir, hex, ".map")) {
			ret = -ENAMETOOLONG;
			goto out;
		}
		e->disk_bytes += disk_bytes(path);
		e->nr_images = records_naming(&rs, e->digest);
		e->in_use = records_naming(&pins, e->digest) > 0;
		if (s.f[i].map) {
			ret = list_map(path, e);
			if (ret)
				goto out;
		}
	}
	ret = blobs_usage(dir, &out->usage);
	if (!ret)
		ret = read_limit(cache_dir, out);
	if (ret)
		goto out;
	for (i = 0; i < rs.nr; i++) {
		struct blob_cache_image *im = &out->images[out->nr_images++];

		memcpy(im->digest, rs.r[i].digest, BLOB_DIGEST_SIZE);
		im->nr_blobs = rs.r[i].nr_blobs;
		im->ref = rs.r[i].ref;
		rs.r[i].ref = NULL;
	}
out:
	scan_free(&s);
	records_free(&pins);
	records_free(&rs);
	if (ret)
		blob_cache_list_free(out);
	return ret;
}

void blob_cache_list_free(struct blob_cache_list *l)
{
	uint32_t i;

	for (i = 0; i < l->nr_images; i++)
		free(l->images[i].ref);
	free(l->images);
	free(l->blobs);
	memset(l, 0, sizeof(*l));
}

/*
 * Remove the blob @hex, unless it is in use. Its map is locked LOCK_EX
 * while both files are unlinked, so an opener waiting for the map sees
 * it gone and starts afresh. Returns 1 when removed, 0 when skipped.
 */
static int gc_blob(const char *dir, const char *hex, uint64_t *freed)
{
	char map[PATH_MAX], data[PATH_MAX], index[PATH_MAX];
	struct stat st;
	uint64_t bytes;
	int fd, ret;

	if (path_join(map, dir, hex, ".map") ||
	    path_join(data, dir, hex, ".data") ||
	    path_join(index, dir, hex, CACHE_INDEX_SUFFIX))
		return -ENAMETOOLONG;
	fd = open(map, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		if (errno == ENOENT)
			return 0;
		ret = -errno;
		ferry_err("chunk cache: cannot open %s: %s", map,
			  ferry_strerror(ret));
		return ret;
	}
	ret = cache_flock(fd, LOCK_EX | LOCK_NB);
	if (ret == -EWOULDBLOCK) {
		ferry_dbg("chunk cache: %s is in use; kept", map);
		ret = 0;
		goto out;
	}
	if (ret || fstat(fd, &st)) {
		ret = ret ? ret : -errno;
		ferry_err("chunk cache: %s: %s", map, ferry_strerror(ret));
		goto out;
	}
	if (!st.st_nlink)
		goto out; /* replaced meanwhile */
	bytes = disk_bytes(data) + disk_bytes(index) +
		(uint64_t)st.st_blocks * 512;
	ret = remove_file(data, true);
	if (!ret)
		ret = remove_file(index, true);
	if (ret)
		goto out;
	ret = remove_file(map, false);
	if (ret)
		goto out;
	*freed += bytes;
	ret = 1;
out:
	close(fd);
	return ret;
}

static bool older_than(const struct stat *st, time_t age)
{
	return st->st_mtime + age < time(NULL);
}

/*
 * A data file without a map: a creator's in progress (it holds LOCK_EX on
 * the data file and is quick) or a leftover. Removed once old and idle.
 */
static int gc_orphan(const char *dir, const char *hex, uint64_t *freed)
{
	char map[PATH_MAX], data[PATH_MAX];
	struct stat st;
	int fd, ret = 0;

	if (path_join(map, dir, hex, ".map") ||
	    path_join(data, dir, hex, ".data"))
		return -ENAMETOOLONG;
	fd = open(data, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? 0 : -errno;
	if (cache_flock(fd, LOCK_EX | LOCK_NB) || fstat(fd, &st) ||
	    !st.st_nlink || !older_than(&st, CACHE_TMP_AGE_S) ||
	    !lstat(map, &st) || errno != ENOENT)
		goto out;
	if (fstat(fd, &st)) {
		ret = -errno;
		goto out;
	}
	ret = remove_file(data, false);
	if (ret)
		goto out;
	*freed += (uint64_t)st.st_blocks * 512;
	ret = 1;
out:
	close(fd);
	return ret;
}

/* Remove the old temporary files @names of @dir. */
static int gc_tmp(const char *dir, char *const *names, uint32_t nr,
		  uint64_t *freed)
{
	char path[PATH_MAX];
	struct stat st;
	uint32_t i;
	int ret = 0;

	for (i = 0; i < nr; i++) {
		if (path_join(path, dir, names[i], ""))
			continue;
		if (lstat(path, &st) || !S_ISREG(st.st_mode) ||
		    !older_than(&st, CACHE_TMP_AGE_S))
			continue;
		ret = remove_file(path, true);
		if (ret)
			continue;
		*freed += (uint64_t)st.st_blocks * 512;
	}
	return ret;
}

/* The temporary files of DIR/images. */
static int scan_image_tmp(const char *dir, struct cache_scan *s)
{
	struct dirent *de;
	DIR *d;
	int ret = 0;

	memset(s, 0, sizeof(*s));
	ret = open_dir(dir, &d);
	if (ret || !d)
		return ret;
	while ((de = readdir(d))) {
		if (strncmp(de->d_name, ATOMIC_TMP_PREFIX,
			    strlen(ATOMIC_TMP_PREFIX)))
			continue;
		ret = scan_add_tmp(s, de->d_name);
		if (ret)
			break;
	}
	closedir(d);
	return ret;
}

int blob_cache_gc(const char *cache_dir, uint64_t *freed, uint32_t *removed)
{
	char dir[PATH_MAX], idir[PATH_MAX], hex[CACHE_HEX_LEN + 1];
	struct cache_records rs, pins = { 0 };
	struct cache_scan s = { 0 }, is = { 0 };
	uint64_t bytes = 0;
	uint32_t i, nr = 0;
	int n, ret, err = 0;

	n = snprintf(dir, sizeof(dir), "%s/" CACHE_BLOBS_DIR, cache_dir);
	if (n < 0 || (size_t)n >= sizeof(dir))
		return -ENAMETOOLONG;
	if (path_join(idir, cache_dir, CACHE_IMAGES_DIR, ""))
		return -ENAMETOOLONG;
	ret = records_read(cache_dir, CACHE_IMAGES_DIR, &rs);
	if (ret)
		return ret;
	ret = pins_read(cache_dir, &pins);
	if (!ret)
		ret = scan_blobs(dir, &s);
	if (ret)
		goto out;
	for (i = 0; i < s.nr; i++) {
		/* Kept: named by an image record, or by a kernel mount's pin. */
		if (records_naming(&rs, s.f[i].digest) ||
		    records_naming(&pins, s.f[i].digest))
			continue;
		hex_encode(s.f[i].digest, BLOB_DIGEST_SIZE, hex);
		ret = s.f[i].map ? gc_blob(dir, hex, &bytes) :
				   gc_orphan(dir, hex, &bytes);
		if (ret > 0)
			nr++;
		else if (ret < 0 && !err)
			err = ret;
	}
	ret = gc_tmp(dir, s.tmp, s.nr_tmp, &bytes);
	if (ret && !err)
		err = ret;
	ret = scan_image_tmp(idir, &is);
	if (!ret)
		ret = gc_tmp(idir, is.tmp, is.nr_tmp, &bytes);
	if (ret && !err)
		err = ret;
	if (nr) {
		ret = cache_fsync_dir(dir);
		if (ret && !err)
			err = ret;
	}
	ret = err;
out:
	scan_free(&is);
	scan_free(&s);
	records_free(&pins);
	records_free(&rs);
	if (freed)
		*freed = bytes;
	if (removed)
		*removed = nr;
	return ret;
}

/* ------------------------------------------------------------------ */
/* Verify                                                              */
/* ------------------------------------------------------------------ */

/*
 * The chunk table recorded next to the map (blob_cache_open writes it),
 * checked against the map header @mh: 0, or -ENOENT / -EFSCORRUPTED.
 */
static int read_index(const char *path, const struct cache_map_header *mh,
		      struct blob_index *idx)
{
	const struct blob_info *b;
	char *text = NULL;
	size_t len;
	int ret;

	memset(idx, 0, sizeof(*idx));
	ret = read_file_max(path, (size_t)BLOB_CHUNK_ENTRY_SIZE * mh->nr_chunks +
				  (1u << 16), &text, &len);
	if (!ret)
		ret = blob_index_decode(text, len, idx);
	free(text);
	if (ret)
		return ret == -ENOENT ? ret : -EFSCORRUPTED;
	b = idx->blobs;
	if (idx->nr_blobs != 1 || b->nr_chunks != mh->nr_chunks ||
	    b->uncompressed_size != mh->uncompressed_size ||
	    memcmp(b->digest, mh->digest, BLOB_DIGEST_SIZE) ||
	    memcmp(b->table_sha256, mh->table_sha256, BLOB_DIGEST_SIZE)) {
		blob_index_free(idx);
		return -EFSCORRUPTED;
	}
	return 0;
}

/*
 * Forget chunk @c (mark @i of @map_fd): zero its slot, which fill_run
 * relies on (it writes nothing for a chunk of zeros), make that durable,
 * then clear the mark. Under the OFD lock fillers take over marks, and
 * only if it is still marked.
 */
static int clear_chunk(int map_fd, int data_fd, const struct blob_chunk *c,
		       uint32_t i)
{
	struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET,
			    .l_start = (off_t)(CACHE_MAP_HEADER_SIZE + (uint64_t)i),
			    .l_len = 1 };
	uint64_t len = ROUND_UP((uint64_t)c->usize, BLOB_SLOT_ALIGN);
	uint8_t mark = CACHE_STATE_MISSING;
	int ret = 0;

	while (fcntl(map_fd, F_OFD_SETLKW, &fl))
		if (errno != EINTR)
			return -errno;
	ret = pread_full(map_fd, &mark, 1, fl.l_start);
	if (ret || mark != CACHE_STATE_PRESENT)
		goto out;
	if (fallocate(data_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
		      (off_t)c->uoff, (off_t)len) || fdatasync(data_fd)) {
		ret = -errno;
		goto out;
	}
	mark = CACHE_STATE_MISSING;
	ret = pwrite_full(map_fd, &mark, 1, fl.l_start);
out:
	fl.l_type = F_UNLCK;
	fcntl(map_fd, F_OFD_SETLK, &fl);
	return ret;
}

static int report_bad(struct blob_cache_verify_report *r,
		      const uint8_t digest[BLOB_DIGEST_SIZE], uint32_t i,
		      uint64_t uoff)
{
	struct blob_cache_bad_chunk *b;

	if (array_reserve(&r->bad, &r->bad_cap, r->nr_bad + 1, sizeof(*r->bad), 8))
		return -ENOMEM;
	b = &r->bad[r->nr_bad++];
	memcpy(b->blob, digest, BLOB_DIGEST_SIZE);
	b->chunk = i;
	b->uoff = uoff;
	return 0;
}

/* Re-hash the present chunks of blob @hex in @dir, clearing bad ones. */
static int verify_blob(const char *dir, const char *hex,
		       struct blob_cache_verify_report *r)
{
	char map[PATH_MAX], data[PATH_MAX], index[PATH_MAX];
	uint8_t h[CACHE_MAP_HEADER_SIZE], *marks = NULL, *buf = NULL;
	struct blob_index idx = { 0 };
	struct cache_map_header mh;
	const char *why = "map file unreadable";
	int map_fd, data_fd = -1, ret;
	uint32_t i;

	if (path_join(map, dir, hex, ".map") ||
	    path_join(data, dir, hex, ".data") ||
	    path_join(index, dir, hex, CACHE_INDEX_SUFFIX))
		return -ENAMETOOLONG;
	map_fd = open(map, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
	if (map_fd < 0)
		return errno == ENOENT ? 0 : -errno; /* removed meanwhile */
	/* Shared, as every user holds it: gc keeps the files meanwhile. */
	ret = cache_flock(map_fd, LOCK_SH);
	if (ret)
		goto out;
	if (pread_full(map_fd, h, sizeof(h), 0) ||
	    cache_map_header_decode(h, &mh, &why)) {
		ferry_warn("chunk cache: %s: %s; not verified (its next user discards it)",
			   map, why);
		r->blobs_skipped++;
		goto out;
	}
	ret = read_index(index, &mh, &idx);
	if (ret) {
		ferry_warn("chunk cache: %s: %s; blob sha256:%s not verified (mounting an image that uses it records it)",
			   index, ret == -ENOENT ? "no chunk table recorded" :
			   "chunk table damaged or of another blob", hex);
		r->blobs_skipped++;
		ret = 0;
		goto out;
	}
	ret = -ENOMEM;
	marks = malloc(MAX(mh.nr_chunks, 1u));
	buf = malloc(BLOB_CHUNK_MAX);
	if (!marks || !buf)
		goto out;
	ret = pread_full(map_fd, marks, mh.nr_chunks, CACHE_MAP_HEADER_SIZE);
	if (ret)
		goto out;
	data_fd = open(data, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
	if (data_fd < 0) {
		ret = -errno;
		goto out;
	}
	r->blobs++;
	for (i = 0; i < mh.nr_chunks; i++) {
		const struct blob_chunk *c = &idx.blobs[0].chunks[i];
		uint8_t sum[BLOB_DIGEST_SIZE];

		if (marks[i] != CACHE_STATE_PRESENT)
			continue;
		ret = pread_full(data_fd, buf, c->usize, c->uoff);
		if (ret)
			goto out;
		sha256_buf(buf, c->usize, sum);
		r->chunks++;
		r->bytes += c->usize;
		if (!memcmp(sum, c->sha256, BLOB_DIGEST_SIZE))
			continue;
		ferry_err("chunk cache: %s: chunk %u (uncompressed offset %llu) does not match its sha256; cleared, its next reader fetches it again",
			  data, i, (unsigned long long)c->uoff);
		ret = clear_chunk(map_fd, data_fd, c, i);
		if (!ret)
			ret = report_bad(r, mh.digest, i, c->uoff);
		if (ret)
			goto out;
	}
out:
	if (ret)
		ferry_err("chunk cache: verifying %s: %s", data, ferry_strerror(ret));
	blob_index_free(&idx);
	free(marks);
	free(buf);
	if (data_fd >= 0)
		close(data_fd);
	close(map_fd);
	return ret;
}

int blob_cache_verify(const char *cache_dir, struct blob_cache_verify_report *r)
{
	char dir[PATH_MAX], hex[CACHE_HEX_LEN + 1];
	struct cache_scan s;
	uint32_t i;
	int n, ret;

	memset(r, 0, sizeof(*r));
	n = snprintf(dir, sizeof(dir), "%s/" CACHE_BLOBS_DIR, cache_dir);
	if (n < 0 || (size_t)n >= sizeof(dir))
		return -ENAMETOOLONG;
	ret = cache_check_existing(cache_dir);
	if (!ret)
		ret = scan_blobs(dir, &s);
	if (ret)
		return ret;
	for (i = 0; !ret && i < s.nr; i++) {
		if (!s.f[i].map)
			continue;
		hex_encode(s.f[i].digest, BLOB_DIGEST_SIZE, hex);
		ret = verify_blob(dir, hex, r);
	}
	scan_free(&s);
	return ret;
}

void blob_cache_verify_report_free(struct blob_cache_verify_report *r)
{
	free(r->bad);
	memset(r, 0, sizeof(*r));
}

/* ------------------------------------------------------------------ */
/* Size limit                                                          */
/* ------------------------------------------------------------------ */

/* Eviction goes down to this share of the limit (in 1/16), not just under it. */
#define EVICT_LOW_16THS 15u

/* Allocated bytes of every file in DIR/blobs/sha256. */
static int blobs_usage(const char *dir, uint64_t *bytes)
{
	struct dirent *de;
	struct stat st;
	DIR *d;
	int ret;

	*bytes = 0;
	ret = open_dir(dir, &d);
	if (ret || !d)
		return ret;
	while ((errno = 0, de = readdir(d)))
		if (!fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) &&
		    S_ISREG(st.st_mode))
			*bytes += (uint64_t)st.st_blocks * 512;
	ret = errno ? -errno : 0;
	closedir(d);
	return ret;
}

/*
 * Drop every chunk of the blob @hex that no process has open (its map's
 * flock is free): marks cleared durably, then the data file punched
 * whole. Its records stay: a later mount fetches it again. Bytes freed.
 */
static uint64_t drop_idle(const char *dir, const char *hex)
{
	char map[PATH_MAX], data[PATH_MAX];
	uint8_t zeros[4096] = { 0 };
	uint64_t before, off;
	struct stat st;
	int mfd, dfd = -1, ret;

	if (path_join(map, dir, hex, ".map") ||
	    path_join(data, dir, hex, ".data"))
		return 0;
	mfd = open(map, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
	if (mfd < 0)
		return 0;
	if (cache_flock(mfd, LOCK_EX | LOCK_NB) || fstat(mfd, &st) ||
	    !st.st_nlink || (uint64_t)st.st_size < CACHE_MAP_HEADER_SIZE)
		goto out;
	dfd = open(data, O_WRONLY | O_NOFOLLOW | O_CLOEXEC);
	if (dfd < 0)
		goto out;
	before = disk_bytes(data);
	if (!before)
		goto out;
	ret = 0;
	for (off = CACHE_MAP_HEADER_SIZE; !ret && off < (uint64_t)st.st_size;
	     off += sizeof(zeros))
		ret = pwrite_full(mfd, zeros,
				  (size_t)MIN((uint64_t)sizeof(zeros),
					      (uint64_t)st.st_size - off), off);
	if (ret || fdatasync(mfd) || fstat(dfd, &st) ||
	    fallocate(dfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0,
		      st.st_size)) {
		ferry_warn("chunk cache: cannot drop the chunks of %s: %s", data,
			   ferry_strerror(ret ? ret : -errno));
		goto out;
	}
	close(dfd);
	close(mfd);
	return before - MIN(before, disk_bytes(data));
out:
	if (dfd >= 0)
		close(dfd);
	close(mfd);
	return 0;
}

struct idle_blob {
	char hex[CACHE_HEX_LEN + 1];
	time_t used; /* the map's mtime: its last fill */
};

static int idle_cmp(const void *a, const void *b)
{
	time_t x = ((const struct idle_blob *)a)->used;
	time_t y = ((const struct idle_blob *)b)->used;

	return x < y ? -1 : x > y;
}

static bool pinned_cb(void *arg, const uint8_t *digest)
{
	return records_naming(arg, digest) > 0;
}

int blob_cache_enforce(const char *cache_dir, const struct blob_cache_limit *lim,
		       int (*prepare)(void *arg), void *arg,
		       struct blob_cache_enforce_report *r)
{
	char dir[PATH_MAX], path[PATH_MAX];
	struct cache_records pins = { 0 };
	struct cache_scan s = { 0 };
	struct idle_blob *idle = NULL;
	struct statvfs sv;
	uint64_t want = 0, floor;
	uint32_t i, nr_idle = 0;
	struct stat st;
	int ret;

	memset(r, 0, sizeof(*r));
	if (path_join(dir, cache_dir, CACHE_BLOBS_DIR, ""))
		return -ENAMETOOLONG;
	ret = blobs_usage(dir, &r->usage);
	if (ret)
		return ret;
	if (lim->max_size && r->usage > lim->max_size)
		want = r->usage - lim->max_size / 16 * EVICT_LOW_16THS;
	if (lim->min_free_pct && !statvfs(cache_dir, &sv)) {
		floor = (uint64_t)sv.f_blocks * sv.f_frsize / 100 *
			lim->min_free_pct;
		if ((uint64_t)sv.f_bavail * sv.f_frsize < floor)
			want = MAX(want, floor -
				   (uint64_t)sv.f_bavail * sv.f_frsize);
	}
	r->want = want;
	if (!want)
		return 0;
	ret = prepare ? prepare(arg) : 0;
	if (ret)
		return ret;
	/* Whole blobs no image uses, then blobs nobody has open, then LRU frames. */
	ret = blob_cache_gc(cache_dir, &r->freed_gc, NULL);
	if (ret || r->freed_gc >= want)
		return ret;
	want -= r->freed_gc;
	ret = pins_read(cache_dir, &pins);
	if (!ret)
		ret = scan_blobs(dir, &s);
	if (ret)
		goto out;
	idle = calloc(MAX(s.nr, 1u), sizeof(*idle));
	if (!idle) {
		ret = -ENOMEM;
		goto out;
	}
	for (i = 0; i < s.nr; i++) {
		if (!s.f[i].map || records_naming(&pins, s.f[i].digest))
			continue;
		hex_encode(s.f[i].digest, BLOB_DIGEST_SIZE, idle[nr_idle].hex);
		if (path_join(path, dir, idle[nr_idle].hex, ".map") ||
		    lstat(path, &st))
			continue;
		idle[nr_idle++].used = st.st_mtime;
	}
	if (nr_idle)
		qsort(idle, nr_idle, sizeof(*idle), idle_cmp);
	for (i = 0; i < nr_idle && r->freed_idle < want; i++)
		r->freed_idle += drop_idle(dir, idle[i].hex);
	if (r->freed_idle < want)
		ret = cache_evict_open(cache_dir, want - r->freed_idle,
				       pinned_cb, &pins, &r->freed_open);
out:
	free(idle);
	scan_free(&s);
	records_free(&pins);
	return ret;
}
