// SPDX-License-Identifier: MIT
/*
 * The loader dependencies (docs/FORMAT.md 2.6): while a regular file
 * streams through convert_ingest_file, an ELF file's interpreter,
 * DT_NEEDED names and run path are read with the reader lazy mounts use
 * (pkg-image's elf_deps_read), so that a mount can queue a program's
 * libraries at its first miss instead of after its header has arrived.
 *
 * The stream passes once, so the reader runs over what was kept: the
 * first chunk, and each range it asked for beyond it (the dynamic
 * section, usually near a large file's end), captured as the stream
 * reaches it. A range that the stream has already passed, or more than
 * CAPTURE_RANGES of them, means "no entry": the mount then inspects the
 * file itself, as for images converted before this section existed.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "internal.h"

#define HEAD_MAX (1u << 20)  /* of the first chunk, kept */
#define CAPTURE_RANGES 4
#define CAPTURE_MAX (64u << 10) /* a range elf.c reads: its dynamic section at most */

struct capture_range {
	uint64_t off;
	uint32_t len, filled;
	uint8_t *buf;
};

struct elf_capture {
	uint64_t size;
	const uint8_t *cur;   /* the chunk being ingested */
	uint64_t cur_off;
	uint32_t cur_len;
	uint8_t *head;
	uint32_t head_len;
	struct capture_range r[CAPTURE_RANGES];
	uint32_t nr;          /* complete ranges in r; r[nr] is the wanted one */
	bool wanted;          /* r[nr] is being captured */
	bool missed;          /* the last parse asked for bytes not kept */
	bool have_deps;
	struct elf_deps deps;
};

struct elf_record {
	char *path;                 /* "/a/b" */
	size_t seq;                 /* ingest order: the last of a path wins */
	const struct meta_inode *inode;
	uint64_t size;
	struct elf_deps deps;
};

static bool in_range(uint64_t off, size_t len, uint64_t start, uint64_t n)
{
	return off >= start && off - start <= n && len <= n - (off - start);
}

/* elf.c's reads, from what was kept; the first miss becomes the wanted range. */
static int capture_read(void *ctx, uint64_t off, void *buf, size_t len)
{
	struct elf_capture *cap = ctx;
	const struct capture_range *r;
	uint32_t i;

	if (in_range(off, len, 0, cap->head_len)) {
		memcpy(buf, cap->head + off, len);
		return 0;
	}
	if (in_range(off, len, cap->cur_off, cap->cur_len)) {
		memcpy(buf, cap->cur + (off - cap->cur_off), len);
		return 0;
	}
	for (i = 0, r = cap->r; i < cap->nr; i++, r++) {
		if (in_range(off, len, r->off, r->len)) {
			memcpy(buf, r->buf + (off - r->off), len);
			return 0;
		}
	}
	/* Bytes the stream has passed are gone; the rest can be captured. */
	if (!cap->missed && cap->nr < CAPTURE_RANGES && len <= CAPTURE_MAX &&
	    off >= cap->cur_off) {
		cap->r[cap->nr] = (struct capture_range){ .off = off, .len = (uint32_t)len };
		cap->wanted = true;
	}
	cap->missed = true;
	return -ENODATA;
}

static void capture_reset(struct elf_capture *cap)
{
	uint32_t i;

	for (i = 0; i < CAPTURE_RANGES; i++)
		free(cap->r[i].buf);
	free(cap->head);
	elf_deps_free(&cap->deps);
	memset(cap, 0, sizeof(*cap));
}

/*
 * Read the file's dependencies from what is kept: 0 and *@d, 1 for
 * nothing to record (not a dynamic ELF file, or a range that cannot be
 * had), -ENODATA while a wanted range lies ahead in the stream.
 */
static int capture_parse(struct elf_capture *cap, struct elf_deps *d)
{
	int ret;

	cap->missed = false;
	cap->wanted = false;
	ret = elf_deps_read(capture_read, NULL, cap, cap->size, d);
	if (ret == -ENODATA && !cap->wanted)
		return 1;
	if (ret == -ENODATA) {
		struct capture_range *r = &cap->r[cap->nr];

		r->buf = malloc(r->len);
		return r->buf ? -ENODATA : -ENOMEM;
	}
	return ret;
}

/* Copy what the current chunk has of the wanted range. */
static void capture_fill(struct elf_capture *cap)
{
	struct capture_range *r = &cap->r[cap->nr];
	uint64_t lo = MAX(r->off, cap->cur_off);
	uint64_t hi = MIN(r->off + r->len, cap->cur_off + cap->cur_len);

	if (lo >= hi)
		return;
	memcpy(r->buf + (lo - r->off), cap->cur + (lo - cap->cur_off), hi - lo);
	r->filled += (uint32_t)(hi - lo);
}

static int record_add(struct converter *c, const char *image_path,
		      const struct meta_inode *inode, struct elf_deps *d)
{
	struct elf_record *rec;
	char *path;
	int ret;

	if (array_reserve(&c->elf_records, &c->elf_records_cap,
			  c->nr_elf_records + 1, sizeof(*rec), 64))
		return -ENOMEM;
	/* The section's form of the path, or none: a path it cannot hold. */
	ret = image_path_normalize(image_path, strlen(image_path), &path);
	if (ret)
		return ret == -ENOMEM ? ret : 0;
	rec = &c->elf_records[c->nr_elf_records++];
	rec->path = path;
	rec->seq = c->nr_elf_records;
	rec->inode = inode;
	rec->size = inode->size;
	rec->deps = *d;
	memset(d, 0, sizeof(*d));
	return 0;
}

/*
 * Each chunk of a regular file of @size bytes, at @off, as it is ingested;
 * the first one (@off 0) starts a new file.
 */
int convert_elf_chunk(struct converter *c, uint64_t off, const uint8_t *data,
		      uint32_t len, uint64_t size)
{
	struct elf_capture *cap = c->elf_cap;
	int ret;

	if (!off) {
		capture_reset(cap);
		if (c->opts->no_loader_deps || len < 4 || memcmp(data, "\177ELF", 4))
			return 0;
		cap->size = size;
	} else if (!cap->wanted) {
		return 0;
	}
	cap->cur = data;
	cap->cur_off = off;
	cap->cur_len = len;
	ret = off ? -ENODATA : capture_parse(cap, &cap->deps);
	/* More is wanted: keep the first chunk, where the strings usually are. */
	if (!off && ret == -ENODATA) {
		cap->head_len = MIN(len, HEAD_MAX);
		cap->head = malloc(cap->head_len);
		if (!cap->head)
			return -ENOMEM;
		memcpy(cap->head, data, cap->head_len);
	}
	/* Bounded: each pass completes one of the CAPTURE_RANGES ranges. */
	while (ret == -ENODATA) {
		struct capture_range *r = &cap->r[cap->nr];

		capture_fill(cap);
		if (r->filled < r->len)
			break; /* the rest comes with the next chunks */
		cap->nr++;
		ret = capture_parse(cap, &cap->deps);
	}
	cap->cur = NULL;
	cap->cur_len = 0;
	if (!ret)
		cap->have_deps = true;
	if (ret != -ENODATA)
		cap->wanted = false;
	return ret < 0 && ret != -ENODATA ? ret : 0;
}

/* After the last chunk of @inode, which is @image_path ("a/b") in the image. */
int convert_elf_file_end(struct converter *c, const struct meta_inode *inode,
			 const char *image_path)
{
	struct elf_capture *cap = c->elf_cap;
	int ret = 0;

	if (cap->have_deps)
		ret = record_add(c, image_path, inode, &cap->deps);
	capture_reset(cap);
	return ret;
}

/* The inode at @path ("/a/b") in the tree now, or NULL. */
static const struct meta_inode *tree_find(const struct meta_tree *t, const char *path)
{
	const struct meta_inode *dir = t->root;
	const char *comp = path + 1, *slash;

	for (;;) {
		slash = strchr(comp, '/');
		dir = meta_dir_lookup(dir, comp, slash ? (size_t)(slash - comp) : strlen(comp));
		if (!dir || !slash)
			return dir;
		if (!S_ISDIR(dir->mode))
			return NULL;
		comp = slash + 1;
	}
}

static int record_cmp(const void *a, const void *b)
{
	const struct elf_record *x = a, *y = b;
	int d = strcmp(x->path, y->path);

	/* The later of two records of one path last: it is the one kept. */
	return d ? d : (x->seq > y->seq) - (x->seq < y->seq);
}

/*
 * The records whose file is still at its path in the final tree (a later
 * layer may have removed or replaced it), as the section's entries in
 * c->elf, sorted by path. An inode freed and another allocated at the
 * same address, path and size would keep a stale entry: that costs a
 * mount a wrong prediction (fetched bytes), never a wrong byte.
 */
int convert_elf_collect(struct converter *c)
{
	struct elf_record *rec;
	size_t i;

	if (!c->nr_elf_records)
		return 0;
	qsort(c->elf_records, c->nr_elf_records, sizeof(*rec), record_cmp);
	c->elf = calloc(c->nr_elf_records, sizeof(*c->elf));
	if (!c->elf)
		return -ENOMEM;
	for (i = 0; i < c->nr_elf_records && c->nr_elf < IMAGE_ELF_MAX_FILES; i++) {
		rec = &c->elf_records[i];
		if (i + 1 < c->nr_elf_records && !strcmp(rec->path, rec[1].path))
			continue;
		if (tree_find(c->tree, rec->path) != rec->inode ||
		    rec->inode->size != rec->size)
			continue;
		c->elf[c->nr_elf].path = rec->path;
		c->elf[c->nr_elf++].deps = rec->deps;
		rec->path = NULL;
		memset(&rec->deps, 0, sizeof(rec->deps));
	}
	return 0;
}

void convert_elf_free(struct converter *c)
{
	size_t i;

	for (i = 0; i < c->nr_elf_records; i++) {
		free(c->elf_records[i].path);
		elf_deps_free(&c->elf_records[i].deps);
	}
	free(c->elf_records);
	image_elf_entries_free(c->elf, c->nr_elf);
	if (c->elf_cap)
		capture_reset(c->elf_cap);
	free(c->elf_cap);
}

int convert_elf_init(struct converter *c)
{
	c->elf_cap = calloc(1, sizeof(*c->elf_cap));
	return c->elf_cap ? 0 : -ENOMEM;
}
