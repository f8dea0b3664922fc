// SPDX-License-Identifier: MIT
/*
 * ferry cache verify: every present chunk of every blob hashed again
 * against the chunk table kept next to its map, and a bad one cleared
 * (its mark and its slot), so that it is fetched again.
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

	if (cache_path_join(map, dir, hex, ".map") ||
	    cache_path_join(data, dir, hex, ".data") ||
	    cache_path_join(index, dir, hex, CACHE_INDEX_SUFFIX))
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
		ret = cache_scan_blobs(dir, &s);
	if (ret)
		return ret;
	for (i = 0; !ret && i < s.nr; i++) {
		if (!s.f[i].map)
			continue;
		hex_encode(s.f[i].digest, BLOB_DIGEST_SIZE, hex);
		ret = verify_blob(dir, hex, r);
	}
	cache_scan_free(&s);
	return ret;
}

void blob_cache_verify_report_free(struct blob_cache_verify_report *r)
{
	free(r->bad);
	memset(r, 0, sizeof(*r));
}
