// SPDX-License-Identifier: MIT
/*
 * ferry check: every inode through the reader, then every blob front to
 * back. The walk needs no blob bytes, so a broken bootstrap is reported
 * before any blob is read (from a registry, possibly).
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "internal.h"

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
	bool acl = false;
	ssize_t len, vlen;

	len = meta_listxattr(c->img->meta, nid, names, CHECK_BUF_SIZE);
	if (len < 0)
		return check_fail(c, (int)len, "unreadable xattr names");
	for (name = names; name < names + len; name += strlen(name) + 1) {
		vlen = meta_getxattr(c->img->meta, nid, name, value, CHECK_BUF_SIZE);
		if (vlen < 0)
			return check_fail(c, (int)vlen, "unreadable xattr value");
		acl |= !strncmp(name, "system.posix_acl_", 17);
	}
	c->report->posix_acls += acl;
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

/* The metadata walk of image_check, counting into @report. */
static int walk_metadata(struct image *img, struct image_check_report *report)
{
	struct checker c = { .img = img, .report = report };
	int ret;

	c.buf = malloc(2 * CHECK_BUF_SIZE);
	if (!c.buf)
		return -ENOMEM;
	ret = meta_walk(img->meta, check_visit, &c);
	free(c.buf);
	return ret;
}

int image_validate_metadata(struct image *img)
{
	struct image_check_report report = { 0 };
	uint64_t t0 = ferry_now_ns();
	int ret;

	/* Their metadata is fetched first: image_cache_walk_layers. */
	if (img->erofs_layers)
		return 0;
	ret = walk_metadata(img, &report);

	img->has_posix_acls = report.posix_acls > 0;

	ferry_dbg("%s: metadata validated: %llu inodes, %llu chunk indexes in %.1f ms",
		  img->ref, (unsigned long long)report.inodes,
		  (unsigned long long)report.chunks,
		  (double)(ferry_now_ns() - t0) / 1e6);
	if (ret && ret != -ENOMEM) {
		ferry_err("%s: refusing to mount or serve the image: its metadata is invalid (see above; ferry check tells more)",
			  img->ref);
		ret = -EFSCORRUPTED;
	}
	return ret;
}

int image_check(struct image *img, struct image_check_report *report)
{
	uint32_t i;
	int ret;

	memset(report, 0, sizeof(*report));
	ret = walk_metadata(img, report);
	for (i = 0; !ret && i < img->blobs.nr_blobs; i++) {
		struct blob_verify_report vr;
		struct blob_source src;
		char name[PATH_MAX];

		image_blob_name(img, i, name, sizeof(name));
		ret = image_blob_source(img, i, &src);
		if (!ret)
			ret = blob_verify_source(&src, name, &img->blobs.blobs[i], &vr);
		if (!ret)
			report->bytes_verified += img->blobs.blobs[i].uncompressed_size;
	}
	report->error = ret;
	return ret;
}
