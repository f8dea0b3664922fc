// SPDX-License-Identifier: MIT
/*
 * libFuzzer target for the bootstrap reader: open the input as an image,
 * then walk every inode reachable from the root (at most WALK_MAX_INODES,
 * each once) through every read operation. Corrupt data must give clean
 * errors; answers that contradict each other are bugs and abort.
 *
 * tests/meta/test_reader.c includes this file to run the same walk over
 * truncated and damaged images, so the walker reports instead of aborting.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../../pkg-base/base.h"
#include "../../pkg-meta/internal.h"
#include "../../pkg-meta/meta.h"

#define WALK_MAX_INODES 10000u
#define WALK_SET_SIZE 16384u /* power of two > WALK_MAX_INODES */
#define WALK_MAX_READ 65536u
#define WALK_MAX_CHUNKS 4096u

struct walk_stats {
	unsigned int visited;
	unsigned int corrupt; /* operations that returned -EFSCORRUPTED */
	unsigned int bad;     /* wrong errno or inconsistent answers */
};

struct walk_entry {
	const char *name; /* points into the image */
	size_t len;
	uint64_t nid;
};

struct walker {
	const struct meta_image *img;
	struct walk_stats *st;
	uint64_t set[WALK_SET_SIZE]; /* nid + 1, 0 = empty */
	uint64_t queue[WALK_MAX_INODES];
	unsigned int head, tail;
	struct walk_entry *ents;
	size_t nr_ents, cap_ents;
	uint8_t buf[WALK_MAX_READ];
	char list[WALK_MAX_READ];
};

static void walk_bad(struct walker *w, const char *what, uint64_t nid, long ret)
{
	fprintf(stderr, "walk: %s on nid %llu: %ld\n", what,
		(unsigned long long)nid, ret);
	w->st->bad++;
}

/* 0 or -EFSCORRUPTED are the only answers a corrupt image may give. */
static bool walk_ok(struct walker *w, const char *what, uint64_t nid, long ret)
{
	if (ret == -EFSCORRUPTED)
		w->st->corrupt++;
	else if (ret < 0)
		walk_bad(w, what, nid, ret);
	return ret >= 0;
}

static void walk_push(struct walker *w, uint64_t nid)
{
	uint32_t h = (uint32_t)((nid + 1) * 0x9E3779B97F4A7C15ull >> 40) &
		     (WALK_SET_SIZE - 1);

	if (w->tail >= WALK_MAX_INODES)
		return;
	while (w->set[h]) {
		if (w->set[h] == nid + 1)
			return;
		h = (h + 1) & (WALK_SET_SIZE - 1);
	}
	w->set[h] = nid + 1;
	w->queue[w->tail++] = nid;
}

static int walk_fill(void *ctx, const char *name, size_t len, uint64_t nid,
		     unsigned int file_type, uint64_t next_pos)
{
	struct walker *w = ctx;

	if (w->nr_ents == w->cap_ents) {
		size_t cap = w->cap_ents ? w->cap_ents * 2 : 64;
		struct walk_entry *e = realloc(w->ents, cap * sizeof(*e));

		if (!e)
			abort();
		w->ents = e;
		w->cap_ents = cap;
	}
	w->ents[w->nr_ents++] = (struct walk_entry){ name, len, nid };
	return 0;
}

static void walk_dir(struct walker *w, uint64_t nid)
{
	uint64_t found;
	size_t i;
	int ret, lret;

	w->nr_ents = 0;
	ret = meta_readdir(w->img, nid, 0, walk_fill, w);
	walk_ok(w, "readdir", nid, ret);
	for (i = 0; i < w->nr_ents; i++) {
		const struct walk_entry *e = &w->ents[i];

		lret = meta_lookup(w->img, nid, e->name, e->len, &found);
		/* A directory that reads back whole is sorted: lookup must agree. */
		if (!ret && (lret || found != e->nid))
			walk_bad(w, "lookup after readdir", nid, lret);
		else if (lret != -ENOENT)
			walk_ok(w, "lookup", nid, lret);
		walk_push(w, e->nid);
	}
}

static void walk_xattrs(struct walker *w, uint64_t nid)
{
	ssize_t need, total, vlen, got;
	size_t off;

	need = meta_listxattr(w->img, nid, NULL, 0);
	if (!walk_ok(w, "listxattr", nid, need) || need > (ssize_t)sizeof(w->list))
		return;
	total = meta_listxattr(w->img, nid, w->list, sizeof(w->list));
	if (total != need) {
		walk_bad(w, "listxattr size", nid, total);
		return;
	}
	for (off = 0; off < (size_t)total; off += strlen(w->list + off) + 1) {
		if (!memchr(w->list + off, '\0', (size_t)total - off)) {
			walk_bad(w, "listxattr termination", nid, total);
			return;
		}
		vlen = meta_getxattr(w->img, nid, w->list + off, NULL, 0);
		if (vlen < 0) {
			walk_bad(w, "getxattr of a listed name", nid, vlen);
			continue;
		}
		got = meta_getxattr(w->img, nid, w->list + off, w->buf,
				    sizeof(w->buf));
		if (got != vlen)
			walk_bad(w, "getxattr size", nid, got);
	}
}

static void walk_data(struct walker *w, const struct meta_stat *st)
{
	struct meta_super sb;
	struct meta_chunk c;
	uint64_t i;
	ssize_t n;
	char link[4096];

	if (st->layout == EROFS_INODE_CHUNK_BASED) {
		meta_get_super(w->img, &sb);
		for (i = 0; i < st->nr_chunks && i < WALK_MAX_CHUNKS; i++)
			if (walk_ok(w, "get_chunk", st->nid,
				    meta_get_chunk(w->img, st->nid, i, &c)) &&
			    (c.device_id > sb.nr_devices ||
			     (c.blkaddr == META_CHUNK_HOLE && c.device_id)))
				walk_bad(w, "chunk device", st->nid, c.device_id);
		return;
	}
	/* Compressed (native layers): the kernel's to decode, never ours. */
	if (st->layout == EROFS_INODE_COMPRESSED_FULL ||
	    st->layout == EROFS_INODE_COMPRESSED_COMPACT) {
		n = meta_read(w->img, st->nid, 0, w->buf, sizeof(w->buf));
		if (n != -EINVAL)
			walk_bad(w, "read of a compressed file", st->nid, n);
		return;
	}
	n = meta_read(w->img, st->nid, 0, w->buf, sizeof(w->buf));
	if (walk_ok(w, "read", st->nid, n) &&
	    (uint64_t)n != MIN(st->size, (uint64_t)sizeof(w->buf)))
		walk_bad(w, "read length", st->nid, n);
	if (S_ISLNK(st->mode)) {
		n = meta_readlink(w->img, st->nid, link, sizeof(link));
		if (walk_ok(w, "readlink", st->nid, n) && (uint64_t)n != st->size)
			walk_bad(w, "readlink length", st->nid, n);
	}
}

/* Paths in the seed images, to exercise meta_resolve. */
static const char *const walk_paths[] = { "/", "small", "/d/e/f", "h/349",
					  "/d/../d/./e/", "/small/x" };

/* Walk everything reachable from the root of @img into @st. */
static void walk_image(const struct meta_image *img, struct walk_stats *st)
{
	struct walker *w = calloc(1, sizeof(*w));
	struct meta_device_info dev;
	struct meta_super sb;
	struct meta_stat ms;
	uint64_t found;
	uint32_t i;
	int ret;

	if (!w)
		abort();
	w->img = img;
	w->st = st;
	meta_get_super(img, &sb);
	for (i = 1; i <= sb.nr_devices; i++)
		if (meta_get_device(img, i, &dev) || strlen(dev.tag) > 64)
			walk_bad(w, "get_device", i, -1);
	for (i = 0; i < ARRAY_SIZE(walk_paths); i++) {
		ret = meta_resolve(img, walk_paths[i], &found);
		if (ret != -ENOENT && ret != -ENOTDIR)
			walk_ok(w, "resolve", i, ret);
	}
	walk_push(w, sb.root_nid);
	while (w->head < w->tail) {
		uint64_t nid = w->queue[w->head++];

		st->visited++;
		if (!walk_ok(w, "getattr", nid, meta_getattr(img, nid, &ms)))
			continue;
		walk_xattrs(w, nid);
		if (S_ISDIR(ms.mode))
			walk_dir(w, nid);
		walk_data(w, &ms);
	}
	free(w->ents);
	free(w);
}

/* @size bytes of an image of @image_len (a lazily fetched layer's head). */
static void fuzz_one(const uint8_t *data, size_t size, uint64_t image_len)
{
	struct walk_stats st = { 0 };
	struct meta_image *img;
	const void *ext;
	size_t ext_len;
	int ret;

	ret = meta_image_open_head(data, size, image_len, &img);
	if (ret) {
		if (ret != -EFSCORRUPTED)
			abort();
		return;
	}
	ret = meta_get_ext(img, &ext, &ext_len);
	if (ret && ret != -ENODATA)
		abort();
	meta_get_sections(img, &ext, &ext_len);
	if (!ext != !ext_len)
		abort();
	walk_image(img, &st);
	meta_image_close(img);
	if (st.bad)
		abort();
}

/*
 * Mutations almost always break the superblock and preamble checksums;
 * a copy with them recomputed lets the fuzzer reach everything behind.
 */
static void fix_checksums(uint8_t *buf, size_t size)
{
	static const uint8_t zero[4];
	uint8_t *sb = buf + EROFS_SUPER_OFFSET;
	uint64_t off, len;
	uint32_t crc;

	crc = erofs_crc32c(~0u, sb, EROFS_SB_CHECKSUM);
	crc = erofs_crc32c(crc, zero, sizeof(zero));
	crc = erofs_crc32c(crc, sb + EROFS_SB_CHECKSUM + 4,
			   EROFS_BLKSIZ - EROFS_SUPER_OFFSET - EROFS_SB_CHECKSUM - 4);
	put_le32(sb + EROFS_SB_CHECKSUM, crc);
	if (memcmp(buf + FERRY_PRE_MAGIC, META_PREAMBLE_MAGIC, 8))
		return;
	off = get_le64(buf + FERRY_PRE_EXT_OFF);
	len = get_le64(buf + FERRY_PRE_EXT_LEN);
	if (off <= size && len <= size - off)
		put_le32(buf + FERRY_PRE_EXT_CRC, erofs_crc32c(~0u, buf + off, len));
	off += len;
	len = get_le64(buf + FERRY_PRE_SEC_LEN);
	if (off <= size && len <= size - off)
		put_le32(buf + FERRY_PRE_SEC_CRC, erofs_crc32c(~0u, buf + off, len));
	put_le32(buf + FERRY_PRE_CRC, erofs_crc32c(~0u, buf, FERRY_PRE_CRC));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t *copy;

	ferry_log_level = -1;
	fuzz_one(data, size, size);
	if (size < EROFS_BLKSIZ)
		return 0;
	copy = malloc(size);
	if (!copy)
		abort();
	memcpy(copy, data, size);
	fix_checksums(copy, size);
	fuzz_one(copy, size, size);
	/* Its first blocks as the head of a larger image: nothing may be
	 * read past them (an exact allocation, for ASan). */
	{
		size_t head = size / 2 / EROFS_BLKSIZ * EROFS_BLKSIZ;
		uint8_t *h = head ? malloc(head) : NULL;

		if (h) {
			memcpy(h, copy, head);
			fuzz_one(h, head, (uint64_t)size * 2);
			free(h);
		}
	}
	free(copy);
	return 0;
}
