// SPDX-License-Identifier: MIT
/*
 * The chunk cache's listing and gc: gc removes every blob no record names
 * (cache_records.c) when nobody has it open (a blob's users hold a shared
 * flock on its map, gc takes it exclusively before removing the pair),
 * and temporary files a crash left. Also the directory helpers the
 * bookkeeping files share.
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

/* Temporary files (ATOMIC_TMP_PREFIX) older than this are gc's to remove. */
#define CACHE_TMP_AGE_S 60

/* @dir/@name@suffix into @out (PATH_MAX bytes), or -ENAMETOOLONG. */
int cache_path_join(char *out, const char *dir, const char *name, const char *suffix)
{
	int n = snprintf(out, PATH_MAX, "%s/%s%s", dir, name, suffix);

	return n < 0 || n >= PATH_MAX ? -ENAMETOOLONG : 0;
}

/* unlink @path (@missing_ok: ENOENT is fine); 0 or -errno, logged. */
int cache_remove_file(const char *path, bool missing_ok)
{
	int ret;

	if (!unlink(path) || (missing_ok && errno == ENOENT))
		return 0;
	ret = -errno;
	ferry_err("chunk cache: cannot remove %s: %s", path, ferry_strerror(ret));
	return ret;
}

/* opendir; a missing directory is *@d NULL (nothing cached yet). */
int cache_open_dir(const char *dir, DIR **d)
{
	int ret;

	*d = opendir(dir);
	if (*d || errno == ENOENT)
		return 0;
	ret = -errno;
	ferry_err("chunk cache: cannot read %s: %s", dir, ferry_strerror(ret));
	return ret;
}

/* A blob seen in DIR/blobs/sha256. */
void cache_scan_free(struct cache_scan *s)
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
int cache_scan_blobs(const char *dir, struct cache_scan *s)
{
	struct dirent *de;
	uint32_t i, j;
	DIR *d;
	int ret = 0;

	memset(s, 0, sizeof(*s));
	ret = cache_open_dir(dir, &d);
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
		if (!cache_name_digest(de->d_name, CACHE_INDEX_SUFFIX, cf.digest))
			continue; /* goes with its map */
		if (cache_name_digest(de->d_name, ".map", cf.digest)) {
			cf.map = false;
			cf.data = true;
			if (cache_name_digest(de->d_name, ".data", cf.digest)) {
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
		cache_scan_free(s);
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
	ret = cache_records_read(cache_dir, CACHE_IMAGES_DIR, &rs);
	if (ret)
		return ret;
	ret = cache_pins_read(cache_dir, &pins);
	if (!ret)
		ret = cache_scan_blobs(dir, &s);
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
		if (cache_path_join(path, dir, hex, ".data")) {
			ret = -ENAMETOOLONG;
			goto out;
		}
		e->disk_bytes = cache_disk_bytes(path);
		if (cache_path_join(path, dir, hex, ".map")) {
			ret = -ENAMETOOLONG;
			goto out;
		}
		e->disk_bytes += cache_disk_bytes(path);
		e->nr_images = cache_records_naming(&rs, e->digest);
		e->in_use = cache_records_naming(&pins, e->digest) > 0;
		if (s.f[i].map) {
			ret = list_map(path, e);
			if (ret)
				goto out;
		}
	}
	ret = cache_blobs_usage(dir, &out->usage);
	if (!ret)
		ret = cache_read_limit(cache_dir, out);
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
	cache_scan_free(&s);
	cache_records_free(&pins);
	cache_records_free(&rs);
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

	if (cache_path_join(map, dir, hex, ".map") ||
	    cache_path_join(data, dir, hex, ".data") ||
	    cache_path_join(index, dir, hex, CACHE_INDEX_SUFFIX))
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
	bytes = cache_disk_bytes(data) + cache_disk_bytes(index) +
		(uint64_t)st.st_blocks * 512;
	ret = cache_remove_file(data, true);
	if (!ret)
		ret = cache_remove_file(index, true);
	if (ret)
		goto out;
	ret = cache_remove_file(map, false);
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

	if (cache_path_join(map, dir, hex, ".map") ||
	    cache_path_join(data, dir, hex, ".data"))
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
	ret = cache_remove_file(data, false);
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
		if (cache_path_join(path, dir, names[i], ""))
			continue;
		if (lstat(path, &st) || !S_ISREG(st.st_mode) ||
		    !older_than(&st, CACHE_TMP_AGE_S))
			continue;
		ret = cache_remove_file(path, true);
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
	ret = cache_open_dir(dir, &d);
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
	if (cache_path_join(idir, cache_dir, CACHE_IMAGES_DIR, ""))
		return -ENAMETOOLONG;
	ret = cache_records_read(cache_dir, CACHE_IMAGES_DIR, &rs);
	if (ret)
		return ret;
	ret = cache_pins_read(cache_dir, &pins);
	if (!ret)
		ret = cache_scan_blobs(dir, &s);
	if (ret)
		goto out;
	for (i = 0; i < s.nr; i++) {
		/* Kept: named by an image record, or by a kernel mount's pin. */
		if (cache_records_naming(&rs, s.f[i].digest) ||
		    cache_records_naming(&pins, s.f[i].digest))
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
		ret = fsync_dir(dir);
		if (ret && !err)
			err = ret;
	}
	ret = err;
out:
	cache_scan_free(&is);
	cache_scan_free(&s);
	cache_records_free(&pins);
	cache_records_free(&rs);
	if (freed)
		*freed = bytes;
	if (removed)
		*removed = nr;
	return ret;
}
