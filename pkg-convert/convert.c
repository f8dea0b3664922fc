// SPDX-License-Identifier: MIT
/*
 * Conversion: source tree → in-memory meta_tree + one chunk blob →
 * bootstrap, blob and ferry.json under dir:OUT.
 *
 * File data is streamed: each file is cut into chunk_size pieces; all-zero
 * pieces become holes, pieces whose sha256 was seen before are referenced
 * again, new ones are appended to the blob. Traversal order is fixed
 * (sorted directory entries, archive order for tar) so that the output is
 * a deterministic function of the input and options.
 */
#include "convert.h"

#include <dirent.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>
#include <zstd.h>

#include "../pkg-base/base.h"
#include "internal.h"

/* The bootstrap is small and compressed once: spend CPU on its size. */
#define BOOTSTRAP_ZSTD_LEVEL 12
#include "tar.h"

static int chunk_table_grow(struct chunk_table *t)
{
	size_t new_cap = t->cap ? t->cap * 2 : 4096, i;
	struct chunk_slot *slots = calloc(new_cap, sizeof(*slots));

	if (!slots)
		return -ENOMEM;
	for (i = 0; i < t->cap; i++) {
		const struct chunk_slot *s = &t->slots[i];
		size_t h;

		if (!s->blob)
			continue;
		h = (size_t)get_le64(s->sha256) & (new_cap - 1);
		while (slots[h].blob)
			h = (h + 1) & (new_cap - 1);
		slots[h] = *s;
	}
	free(t->slots);
	t->slots = slots;
	t->cap = new_cap;
	return 0;
}

/* The slot for (@sha256, @usize): either the stored chunk or an empty slot. */
static struct chunk_slot *chunk_table_find(struct chunk_table *t,
					   const uint8_t *sha256,
					   uint32_t usize)
{
	size_t h = (size_t)get_le64(sha256) & (t->cap - 1);

	while (t->slots[h].blob) {
		struct chunk_slot *s = &t->slots[h];

		if (s->usize == usize && !memcmp(s->sha256, sha256, BLOB_DIGEST_SIZE))
			return s;
		h = (h + 1) & (t->cap - 1);
	}
	return &t->slots[h];
}

/* Store one piece of file data (or find it stored) and fill @out. */
static int store_chunk(struct converter *c, const uint8_t *data, uint32_t len,
		       struct meta_chunk *out)
{
	uint8_t sha256[BLOB_DIGEST_SIZE];
	struct chunk_slot *slot;
	uint64_t uoff;
	int ret;

	c->stats->chunks_total++;
	if (mem_is_zero(data, len)) {
		c->stats->bytes_zero += len;
		*out = (struct meta_chunk){ .device_id = 0, .blkaddr = META_CHUNK_HOLE };
		return 0;
	}
	sha256_buf(data, len, sha256);
	if (c->chunks.used * 2 >= c->chunks.cap) {
		ret = chunk_table_grow(&c->chunks);
		if (ret)
			return ret;
	}
	slot = chunk_table_find(&c->chunks, sha256, len);
	if (!slot->blob) {
		ret = blob_writer_add(c->writer, data, len, sha256, &uoff);
		if (ret)
			return ret;
		if (uoff / META_BLOCK_SIZE > UINT32_MAX - 1) {
			ferry_err("blob exceeds %u blocks: split the input",
				  UINT32_MAX - 1);
			return -EFBIG;
		}
		memcpy(slot->sha256, sha256, sizeof(sha256));
		slot->usize = len;
		slot->blob = (uint16_t)(c->writer_blob + 1);
		slot->blkaddr = (uint32_t)(uoff / META_BLOCK_SIZE);
		c->chunks.used++;
		c->writer_chunks++;
		c->stats->chunks_unique++;
		c->stats->bytes_unique += len;
	}
	*out = (struct meta_chunk){
		.device_id = (uint16_t)(PROVISIONAL_DEVICE | (slot->blob - 1u)),
		.blkaddr = slot->blkaddr,
	};
	return 0;
}

/* Insert a stored chunk (from a chunk dict) unless its digest is known. */
static int remember_chunk(struct converter *c, const struct blob_chunk *bc,
			  uint32_t blob)
{
	struct chunk_slot *slot;
	int ret;

	if (c->chunks.used * 2 >= c->chunks.cap) {
		ret = chunk_table_grow(&c->chunks);
		if (ret)
			return ret;
	}
	slot = chunk_table_find(&c->chunks, bc->sha256, bc->usize);
	if (slot->blob)
		return 0;
	memcpy(slot->sha256, bc->sha256, BLOB_DIGEST_SIZE);
	slot->usize = bc->usize;
	slot->blob = (uint16_t)(blob + 1);
	slot->blkaddr = (uint32_t)(bc->uoff / META_BLOCK_SIZE);
	c->chunks.used++;
	return 0;
}

/*
 * Fill @inode (a regular file of @size bytes) from @read: inline in the
 * bootstrap when small, else as chunks.
 */
int convert_ingest_file(struct converter *c, struct meta_inode *inode,
			uint64_t size, const struct file_source *src,
			const char *path)
{
	uint32_t chunk_size = c->opts->chunk_size;
	uint64_t nr_chunks, i;
	int ret;

	inode->size = size;
	c->stats->bytes_in += size;
	ferry_progress_add(&c->progress, size);
	if (size <= c->opts->inline_max) {
		c->stats->bytes_inline += size;
		if (!size)
			return 0;
		inode->data = malloc(size);
		if (!inode->data)
			return -ENOMEM;
		ret = src->read(src->ctx, inode->data, size);
		goto out;
	}
	nr_chunks = DIV_ROUND_UP(size, chunk_size);
	inode->chunk_bits = (uint8_t)(__builtin_ctz(chunk_size) - 12);
	inode->chunks = calloc(nr_chunks, sizeof(*inode->chunks));
	if (!inode->chunks)
		return -ENOMEM;
	for (i = 0; i < nr_chunks; i++) {
		uint32_t len = (uint32_t)MIN((uint64_t)chunk_size,
					     size - i * chunk_size);

		if (src->skip_hole && src->skip_hole(src->ctx, len)) {
			c->stats->chunks_total++;
			c->stats->bytes_zero += len;
			inode->chunks[i] = (struct meta_chunk){ 0, META_CHUNK_HOLE };
			continue;
		}
		ret = src->read(src->ctx, c->buf, len);
		if (ret)
			goto out;
		ret = store_chunk(c, c->buf, len, &inode->chunks[i]);
		if (ret)
			goto out;
	}
	ret = 0;
out:
	if (ret)
		ferry_err("%s: %s", path, ferry_strerror(ret));
	return ret;
}

/* ------------------------------------------------------------------ */
/* dir: sources                                                        */
/* ------------------------------------------------------------------ */

struct fd_reader {
	int fd;
};

static int fd_read_exact(void *ctx, void *buf, size_t len)
{
	struct fd_reader *r = ctx;
	int ret = read_full(r->fd, buf, len);

	/* A file that shrank while we read it would silently lose data. */
	return ret == -EIO ? -ESTALE : ret;
}

/* Sparse files: SEEK_DATA tells whether the next bytes hold any data. */
static bool fd_skip_hole(void *ctx, uint64_t len)
{
	struct fd_reader *r = ctx;
	off_t pos = lseek(r->fd, 0, SEEK_CUR), data;

	if (pos < 0)
		return false;
	data = lseek(r->fd, pos, SEEK_DATA);
	if (data < 0 && errno != ENXIO) {
		lseek(r->fd, pos, SEEK_SET);
		return false;
	}
	if (data >= 0 && (uint64_t)data < (uint64_t)pos + len) {
		lseek(r->fd, pos, SEEK_SET);
		return false;
	}
	return lseek(r->fd, pos + (off_t)len, SEEK_SET) >= 0;
}

static int copy_xattrs(struct meta_inode *inode, const char *path)
{
	char *names = NULL, *value = NULL, *name;
	ssize_t len, vlen;
	int ret = 0;

	len = llistxattr(path, NULL, 0);
	if (len <= 0) {
		if (len < 0 && errno != ENOTSUP)
			ret = -errno;
		goto out;
	}
	names = malloc((size_t)len);
	value = malloc(META_XATTR_VALUE_MAX + 1);
	if (!names || !value) {
		ret = -ENOMEM;
		goto out;
	}
	len = llistxattr(path, names, (size_t)len);
	if (len < 0) {
		ret = -errno;
		goto out;
	}
	for (name = names; name < names + len; name += strlen(name) + 1) {
		vlen = lgetxattr(path, name, value, META_XATTR_VALUE_MAX + 1);
		if (vlen < 0) {
			ret = -errno;
			ferry_err("%s: xattr %s: %s", path, name, strerror(errno));
			goto out;
		}
		ret = meta_inode_set_xattr(inode, name, value, (uint32_t)vlen);
		if (ret)
			goto out;
	}
out:
	if (ret && ret != -ENOMEM)
		ferry_err("%s: cannot read xattrs: %s", path, ferry_strerror(ret));
	free(names);
	free(value);
	return ret;
}

static void set_attrs(struct meta_inode *inode, const struct stat *st)
{
	inode->mode = st->st_mode;
	inode->uid = st->st_uid;
	inode->gid = st->st_gid;
	inode->mtime = st->st_mtim.tv_sec;
	inode->mtime_nsec = (uint32_t)st->st_mtim.tv_nsec;
	if (S_ISCHR(st->st_mode) || S_ISBLK(st->st_mode)) {
		inode->rdev_major = major(st->st_rdev);
		inode->rdev_minor = minor(st->st_rdev);
	}
}

static struct meta_inode *find_hardlink(struct converter *c,
					const struct stat *st)
{
	size_t i;

	for (i = c->nr_links; i-- > 0;)
		if (c->links[i].dev == st->st_dev && c->links[i].ino == st->st_ino)
			return c->links[i].inode;
	return NULL;
}

static int remember_hardlink(struct converter *c, const struct stat *st,
			     struct meta_inode *inode)
{
	if (array_reserve(&c->links, &c->links_cap, c->nr_links + 1,
			  sizeof(*c->links), 64))
		return -ENOMEM;
	c->links[c->nr_links++] = (struct hardlink){ st->st_dev, st->st_ino, inode };
	return 0;
}

static int cmp_names(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sorted names of directory @path (without "." and ".."). */
static int list_dir(const char *path, char ***names_out, size_t *nr_out)
{
	char **names = NULL;
	size_t nr = 0, cap = 0;
	struct dirent *de;
	DIR *d = opendir(path);
	int ret = 0;

	if (!d) {
		ret = -errno;
		ferry_err("%s: cannot open directory: %s", path, strerror(errno));
		return ret;
	}
	while ((errno = 0, de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (array_reserve(&names, &cap, nr + 1, sizeof(*names), 64)) {
			ret = -ENOMEM;
			goto out;
		}
		names[nr] = strdup(de->d_name);
		if (!names[nr]) {
			ret = -ENOMEM;
			goto out;
		}
		nr++;
	}
	if (errno) {
		ret = -errno;
		ferry_err("%s: readdir: %s", path, strerror(errno));
		goto out;
	}
	if (nr) /* qsort(NULL, 0) is undefined */
		qsort(names, nr, sizeof(*names), cmp_names);
out:
	closedir(d);
	if (ret) {
		while (nr)
			free(names[--nr]);
		free(names);
		return ret;
	}
	*names_out = names;
	*nr_out = nr;
	return 0;
}

static int add_dir_tree(struct converter *c, struct meta_inode *dir,
			const char *path, unsigned int depth);

/* Convert one directory entry @name of @dir found at @path. */
static int add_dir_entry(struct converter *c, struct meta_inode *dir,
			 const char *path, const char *name,
			 unsigned int depth)
{
	struct meta_inode *inode = NULL;
	struct fd_reader reader = { .fd = -1 };
	struct file_source src = { fd_read_exact, fd_skip_hole, &reader };
	struct stat st;
	int ret;

	if (lstat(path, &st)) {
		ret = -errno;
		ferry_err("%s: %s", path, strerror(errno));
		return ret;
	}
	c->stats->entries++;
	if (!S_ISDIR(st.st_mode) && st.st_nlink > 1) {
		inode = find_hardlink(c, &st);
		if (inode) {
			c->stats->hardlinks++;
			return meta_dir_link(c->tree, dir, name, strlen(name), inode);
		}
	}
	ret = meta_inode_new(c->tree, st.st_mode, &inode);
	if (ret)
		return ret;
	set_attrs(inode, &st);
	ret = copy_xattrs(inode, path);
	if (ret)
		return ret;

	switch (st.st_mode & S_IFMT) {
	case S_IFREG:
		c->stats->files++;
		reader.fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
		if (reader.fd < 0) {
			ret = -errno;
			ferry_err("%s: %s", path, strerror(errno));
			return ret;
		}
		ret = convert_ingest_file(c, inode, (uint64_t)st.st_size, &src, path);
		close(reader.fd);
		break;
	case S_IFLNK: {
		char *target = malloc((size_t)st.st_size + 1);
		ssize_t n;

		c->stats->symlinks++;
		if (!target)
			return -ENOMEM;
		n = readlink(path, target, (size_t)st.st_size + 1);
		if (n < 0 || n != st.st_size) {
			free(target);
			ferry_err("%s: cannot read symlink (changed while reading?)", path);
			return n < 0 ? -errno : -ESTALE;
		}
		inode->data = (uint8_t *)target;
		inode->size = (uint64_t)n;
		ret = 0;
		break;
	}
	case S_IFDIR:
		c->stats->dirs++;
		ret = 0;
		break;
	default:
		c->stats->specials++;
		ret = 0;
		break;
	}
	if (ret)
		return ret;
	if (!S_ISDIR(st.st_mode) && st.st_nlink > 1) {
		ret = remember_hardlink(c, &st, inode);
		if (ret)
			return ret;
	}
	ret = meta_dir_link(c->tree, dir, name, strlen(name), inode);
	if (ret) {
		ferry_err("%s: cannot add to the image: %s", path, ferry_strerror(ret));
		return ret;
	}
	if (S_ISDIR(st.st_mode))
		return add_dir_tree(c, inode, path, depth + 1);
	return 0;
}

static int add_dir_tree(struct converter *c, struct meta_inode *dir,
			const char *path, unsigned int depth)
{
	char **names = NULL;
	size_t nr = 0, i;
	char *child = NULL;
	int ret;

	if (depth > 4096) {
		ferry_err("%s: directory tree deeper than 4096 levels", path);
		return -ELOOP;
	}
	ret = list_dir(path, &names, &nr);
	if (ret)
		return ret;
	for (i = 0; i < nr && !ret; i++) {
		if (asprintf(&child, "%s/%s", path, names[i]) < 0) {
			ret = -ENOMEM;
			break;
		}
		ret = add_dir_entry(c, dir, child, names[i], depth);
		free(child);
	}
	for (i = 0; i < nr; i++)
		free(names[i]);
	free(names);
	return ret;
}

static int convert_dir(struct converter *c, const char *path)
{
	struct stat st;
	int ret;

	if (stat(path, &st)) {
		ret = -errno;
		ferry_err("%s: %s", path, strerror(errno));
		return ret;
	}
	if (!S_ISDIR(st.st_mode)) {
		ferry_err("%s: not a directory", path);
		return -ENOTDIR;
	}
	set_attrs(c->tree->root, &st);
	ret = copy_xattrs(c->tree->root, path);
	if (ret)
		return ret;
	ferry_progress_begin(&c->progress, "converting", 0);
	ret = add_dir_tree(c, c->tree->root, path, 0);
	ferry_progress_end(&c->progress);
	return ret;
}

/* ------------------------------------------------------------------ */
/* Output                                                              */
/* ------------------------------------------------------------------ */

static void compression_name(const struct convert_opts *o, char *buf, size_t len)
{
	if (o->compress.level)
		snprintf(buf, len, "%s:%d", blob_codec_name(o->compress.codec),
			 o->compress.level);
	else
		snprintf(buf, len, "%s", blob_codec_name(o->compress.codec));
}

/* ------------------------------------------------------------------ */
/* Blobs                                                               */
/* ------------------------------------------------------------------ */

static int add_blob(struct converter *c, struct out_blob **out)
{
	if (c->nr_blobs >= META_MAX_DEVICES) {
		ferry_err("more than %u blobs: too many layers", META_MAX_DEVICES);
		return -E2BIG;
	}
	if (array_reserve(&c->blobs, &c->blobs_cap, c->nr_blobs + 1,
			  sizeof(*c->blobs), 16))
		return -ENOMEM;
	*out = &c->blobs[c->nr_blobs++];
	memset(*out, 0, sizeof(**out));
	return 0;
}

int convert_layer_begin(struct converter *c, const char *source_layer)
{
	struct out_blob *b;
	int ret;

	ret = add_blob(c, &b);
	if (ret)
		return ret;
	c->writer_blob = c->nr_blobs - 1;
	c->writer_chunks = 0;
	if (source_layer && !(b->source_layer = strdup(source_layer)))
		return -ENOMEM;
	/* Named by its digest once complete. */
	ret = atomic_file_create(&c->writer_file, c->blobs_dir, "blob", 0644);
	if (ret)
		return ret;
	return blob_writer_new(c->writer_file.fd, &c->opts->compress,
			       c->opts->jobs, &c->writer);
}

/* Drop the current layer's writer and temporary file. */
static void layer_discard(struct converter *c)
{
	if (c->writer)
		blob_writer_abort(c->writer);
	c->writer = NULL;
	atomic_file_discard(&c->writer_file);
}

int convert_layer_end(struct converter *c)
{
	struct out_blob *b = &c->blobs[c->writer_blob];
	char hex[2 * BLOB_DIGEST_SIZE + 1];
	int ret;

	if (!c->writer_chunks) {
		/* The layer added no chunks: it gets no blob. */
		layer_discard(c);
		free(b->source_layer);
		c->nr_blobs--;
		return 0;
	}
	ret = blob_writer_finish(c->writer, &b->info);
	c->writer = NULL;
	if (ret)
		goto fail;
	hex_encode(b->info.digest, BLOB_DIGEST_SIZE, hex);
	if (asprintf(&b->path, "%s/%s", c->blobs_dir, hex) < 0) {
		b->path = NULL;
		ret = -ENOMEM;
		goto fail;
	}
	ret = atomic_file_commit(&c->writer_file, hex);
	if (ret)
		goto fail;
	return 0;
fail:
	layer_discard(c);
	return ret;
}

/* Make every chunk of an earlier image's blobs available for reference. */
static int load_chunk_dict(struct converter *c, const char *ref)
{
	struct image *dict;
	uint32_t i, k;
	int ret;

	ret = image_open(ref, &(struct image_opts){ .fetch = c->opts->fetch },
			 &dict);
	if (ret) {
		ferry_err("chunk dict %s: cannot open: %s", ref, ferry_strerror(ret));
		return ret;
	}
	for (i = 0; i < dict->blobs.nr_blobs; i++) {
		const struct blob_info *src = &dict->blobs.blobs[i];
		struct out_blob *b;

		ret = add_blob(c, &b);
		if (ret)
			break;
		b->from_dict = true;
		b->dict_index = i;
		b->info = *src;
		b->info.chunks = malloc((size_t)src->nr_chunks * sizeof(*src->chunks) + 1);
		if (!b->info.chunks) {
			ret = -ENOMEM;
			break;
		}
		memcpy(b->info.chunks, src->chunks, (size_t)src->nr_chunks * sizeof(*src->chunks));
		for (k = 0; k < src->nr_chunks && !ret; k++)
			ret = remember_chunk(c, &src->chunks[k], c->nr_blobs - 1);
		if (ret)
			break;
	}
	c->dict = dict;
	return ret;
}

/* Put the chunk-dict blobs the image uses into the destination @layout. */
static int copy_dict_blobs(struct converter *c, const char *layout,
			   struct out_blob **blobs, uint32_t nr)
{
	uint32_t i;
	int ret;

	for (i = 0; i < nr; i++) {
		if (!blobs[i]->from_dict)
			continue;
		ret = image_copy_blob(c->dict, blobs[i]->dict_index, layout);
		if (ret)
			return ret;
	}
	return 0;
}

/*
 * Give every blob the tree references a device id (written blobs first,
 * in layer order, then chunk-dict blobs), and rewrite the provisional ids
 * in the chunk indexes. Hardlinked inodes are reached more than once, so
 * the rewrite only touches provisional ids.
 */
static int assign_devices(struct converter *c)
{
	struct meta_inode **stack = NULL;
	size_t depth = 0, cap = 0;
	uint16_t next_id = 1;
	uint32_t i;
	int pass, ret = 0;

	for (pass = 0; pass < 2 && !ret; pass++) {
		if (pass == 1) {
			for (i = 0; i < c->nr_blobs; i++)
				if (!c->blobs[i].from_dict)
					c->blobs[i].device_id = next_id++;
			for (i = 0; i < c->nr_blobs; i++)
				if (c->blobs[i].from_dict && c->blobs[i].refs)
					c->blobs[i].device_id = next_id++;
		}
		depth = 0;
		if (array_reserve(&stack, &cap, 1, sizeof(*stack), 256)) {
			ret = -ENOMEM;
			break;
		}
		stack[depth++] = c->tree->root;
		while (depth) {
			struct meta_inode *inode = stack[--depth];
			uint64_t n, k;

			if (inode->chunks) {
				n = DIV_ROUND_UP(inode->size,
						 (uint64_t)META_BLOCK_SIZE << inode->chunk_bits);
				for (k = 0; k < n; k++) {
					struct meta_chunk *mc = &inode->chunks[k];
					struct out_blob *b;

					if (!(mc->device_id & PROVISIONAL_DEVICE))
						continue;
					b = &c->blobs[mc->device_id & ~PROVISIONAL_DEVICE];
					if (pass == 0)
						b->refs++;
					else
						mc->device_id = b->device_id;
				}
			}
			if (array_reserve(&stack, &cap, depth + inode->nr_children,
					  sizeof(*stack), 256)) {
				ret = -ENOMEM;
				break;
			}
			for (k = 0; k < inode->nr_children; k++)
				stack[depth++] = inode->children[k]->inode;
		}
	}
	free(stack);
	return ret;
}

/* The used blobs in device order. */
static int used_blobs(struct converter *c, struct out_blob ***out, uint32_t *nr)
{
	struct out_blob **list = calloc(c->nr_blobs + 1, sizeof(*list));
	uint32_t i;

	if (!list)
		return -ENOMEM;
	*nr = 0;
	for (i = 0; i < c->nr_blobs; i++)
		if (c->blobs[i].device_id)
			list[c->blobs[i].device_id - 1] = &c->blobs[i];
	while (*nr < c->nr_blobs && list[*nr])
		(*nr)++;
	*out = list;
	return 0;
}

/* ------------------------------------------------------------------ */
/* Bootstrap and destinations                                          */
/* ------------------------------------------------------------------ */

/* The prefetch section follows the blob index in the extension payload. */
static int append_prefetch(struct converter *c, void **ext, size_t *ext_len)
{
	uint8_t *sec = NULL;
	size_t len;
	void *both;
	int ret = prefetch_section_encode(c->prefetch, c->nr_prefetch, &sec, &len);

	if (ret)
		return ret;
	both = realloc(*ext, *ext_len + len);
	if (!both) {
		free(sec);
		return -ENOMEM;
	}
	memcpy((uint8_t *)both + *ext_len, sec, len);
	*ext = both;
	*ext_len += len;
	free(sec);
	return 0;
}

/* Every prefetch path must name an entry of the written image. */
static int check_prefetch(struct converter *c, const uint8_t *data, size_t len)
{
	struct meta_image *img;
	uint64_t nid;
	uint32_t i;
	int ret;

	if (!c->nr_prefetch)
		return 0;
	ret = meta_image_open_mem(data, len, &img);
	if (ret)
		return ret;
	for (i = 0; i < c->nr_prefetch && !ret; i++) {
		ret = meta_resolve(img, c->prefetch[i], &nid);
		if (ret)
			ferry_err("prefetch list %s: %s is not in the image",
				  c->opts->prefetch_files, c->prefetch[i]);
	}
	meta_image_close(img);
	return ret;
}

/* Write the bootstrap to @path; return its bytes in *@data (caller frees). */
static int write_bootstrap(struct converter *c, struct out_blob **blobs,
			   uint32_t nr, int fd, uint8_t **data)
{
	struct meta_device *devices = calloc(nr + 1, sizeof(*devices));
	struct blob_info *infos = calloc(nr + 1, sizeof(*infos));
	struct meta_write_opts wopts = { 0 };
	struct meta_write_stats wstats;
	void *ext = NULL;
	size_t ext_len = 0;
	uint32_t i;
	int ret;

	*data = NULL;
	if (!devices || !infos) {
		ret = -ENOMEM;
		goto out;
	}
	for (i = 0; i < nr; i++) {
		char hex[2 * BLOB_DIGEST_SIZE + 1];

		hex_encode(blobs[i]->info.digest, BLOB_DIGEST_SIZE, hex);
		memcpy(devices[i].tag, hex, sizeof(devices[i].tag));
		devices[i].blocks = (uint32_t)(blobs[i]->info.uncompressed_size /
					       META_BLOCK_SIZE);
		infos[i] = blobs[i]->info;
	}
	ret = blob_index_encode(infos, nr, &ext, &ext_len);
	if (!ret && c->nr_prefetch)
		ret = append_prefetch(c, &ext, &ext_len);
	if (ret)
		goto out;
	wopts.devices = devices;
	wopts.nr_devices = nr;
	wopts.ext = ext;
	wopts.ext_len = ext_len;
	ret = meta_write(c->tree, &wopts, fd, &wstats);
	if (ret)
		goto out;
	c->stats->bootstrap_bytes = wstats.bytes;
	*data = malloc(wstats.bytes);
	if (!*data) {
		ret = -ENOMEM;
		goto out;
	}
	ret = pread_full(fd, *data, wstats.bytes, 0);
	if (!ret)
		ret = check_prefetch(c, *data, wstats.bytes);
out:
	if (ret) {
		free(*data);
		*data = NULL;
	}
	free(ext);
	free(devices);
	free(infos);
	return ret;
}

static int fill_stats(struct convert_stats *s, struct out_blob **blobs, uint32_t nr)
{
	uint32_t i;

	s->blobs = calloc(nr + 1, sizeof(*s->blobs));
	if (!s->blobs)
		return -ENOMEM;
	s->nr_blobs = nr;
	for (i = 0; i < nr; i++) {
		digest_format(blobs[i]->info.digest, s->blobs[i].digest);
		s->blobs[i].size = blobs[i]->info.size;
		s->blobs[i].uncompressed_size = blobs[i]->info.uncompressed_size;
		s->blobs[i].nr_chunks = blobs[i]->info.nr_chunks;
		s->blobs[i].from_dict = blobs[i]->from_dict;
	}
	return 0;
}

/* dir:OUT: bootstrap, blobs (dict blobs linked in) and ferry.json. */
static int finish_dir(struct converter *c, const char *out_dir,
		      struct out_blob **blobs, uint32_t nr)
{
	struct atomic_file boot_file = { .fd = -1, .dir_fd = -1 };
	struct json_object *root = NULL, *boot, *list;
	char digest[72], comp[32];
	uint8_t *data = NULL, boot_digest[BLOB_DIGEST_SIZE];
	const char *text;
	uint32_t i;
	int ret;

	ret = copy_dict_blobs(c, out_dir, blobs, nr);
	if (ret)
		return ret;
	ret = atomic_file_create(&boot_file, out_dir, "bootstrap", 0644);
	if (!ret)
		ret = write_bootstrap(c, blobs, nr, boot_file.fd, &data);
	if (!ret)
		ret = atomic_file_commit(&boot_file, "bootstrap");
	if (ret)
		goto out;
	sha256_buf(data, c->stats->bootstrap_bytes, boot_digest);
	root = json_object_new_object();
	boot = json_object_new_object();
	list = json_object_new_array();
	digest_format(boot_digest, digest);
	json_object_object_add(root, "schemaVersion", json_object_new_int(1));
	json_object_object_add(boot, "path", json_object_new_string("bootstrap"));
	json_object_object_add(boot, "digest", json_object_new_string(digest));
	json_object_object_add(boot, "size",
			       json_object_new_int64((int64_t)c->stats->bootstrap_bytes));
	json_object_object_add(root, "bootstrap", boot);
	for (i = 0; i < nr; i++) {
		struct json_object *b = json_object_new_object();

		digest_format(blobs[i]->info.digest, digest);
		json_object_object_add(b, "digest", json_object_new_string(digest));
		json_object_object_add(b, "size", json_object_new_int64((int64_t)blobs[i]->info.size));
		json_object_object_add(b, "uncompressedSize",
				       json_object_new_int64((int64_t)blobs[i]->info.uncompressed_size));
		json_object_object_add(b, "chunks", json_object_new_int64(blobs[i]->info.nr_chunks));
		if (blobs[i]->source_layer)
			json_object_object_add(b, "sourceLayer",
					       json_object_new_string(blobs[i]->source_layer));
		json_object_array_add(list, b);
	}
	json_object_object_add(root, "blobs", list);
	json_object_object_add(root, "chunkSize", json_object_new_int64(c->opts->chunk_size));
	compression_name(c->opts, comp, sizeof(comp));
	json_object_object_add(root, "compression", json_object_new_string(comp));
	text = json_object_to_json_string_ext(root, JSON_C_TO_STRING_PRETTY |
						    JSON_C_TO_STRING_NOSLASHESCAPE);
	ret = write_file_atomic(out_dir, "ferry.json", text, strlen(text), 0644);
out:
	atomic_file_discard(&boot_file);
	json_object_put(root);
	free(data);
	return ret;
}

static struct json_object *descriptor_json(const char *media_type,
					   const uint8_t *digest, uint64_t size)
{
	struct json_object *d = json_object_new_object();
	char dstr[72];

	digest_format(digest, dstr);
	json_object_object_add(d, "mediaType", json_object_new_string(media_type));
	json_object_object_add(d, "digest", json_object_new_string(dstr));
	json_object_object_add(d, "size", json_object_new_int64((int64_t)size));
	return d;
}

static void annotate(struct json_object *o, const char *key, const char *value)
{
	struct json_object *ann;

	if (!json_object_object_get_ex(o, "annotations", &ann)) {
		ann = json_object_new_object();
		json_object_object_add(o, "annotations", ann);
	}
	json_object_object_add(ann, key, json_object_new_string(value));
}

/* A minimal image config for sources that have none (dir:, tar:). */
static int put_default_config(const char *layout, struct oci_descriptor *config)
{
	char platform[64], text[256], *slash;

	oci_host_platform(platform, sizeof(platform));
	slash = strchr(platform, '/');
	*slash = '\0';
	snprintf(text, sizeof(text),
		 "{\"architecture\":\"%s\",\"os\":\"%s\",\"rootfs\":{\"type\":\"layers\",\"diff_ids\":[]}}",
		 slash + 1, platform);
	config->size = strlen(text);
	snprintf(config->media_type, sizeof(config->media_type), "%s",
		 "application/vnd.oci.image.config.v1+json");
	return oci_put_blob(layout, text, config->size, config->digest);
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

/* oci:PATH[:TAG]: blobs, bootstrap blob, config, manifest, index.json. */
static int finish_oci(struct converter *c, const char *dest_ref,
		      const struct oci_image *src, struct out_blob **blobs,
		      uint32_t nr)
{
	struct json_object *manifest = NULL, *layers, *d;
	struct oci_descriptor config;
	struct atomic_file boot_file = { .fd = -1, .dir_fd = -1 };
	char *copy = strdup(dest_ref), *layout, *tag;
	char num[32], comp[32], dstr[72];
	uint8_t *data = NULL, boot_digest[BLOB_DIGEST_SIZE], manifest_digest[32];
	uint8_t zboot_digest[BLOB_DIGEST_SIZE];
	uint64_t zboot_size = 0;
	const char *text;
	uint32_t i;
	int ret;

	if (!copy)
		return -ENOMEM;
	oci_split_ref(copy, &layout, &tag);
	ret = copy_dict_blobs(c, layout, blobs, nr);
	if (ret)
		goto out;
	/* The raw bootstrap is scratch: the layout stores it compressed. */
	ret = atomic_file_create(&boot_file, c->blobs_dir, "bootstrap", 0644);
	if (!ret)
		ret = write_bootstrap(c, blobs, nr, boot_file.fd, &data);
	atomic_file_discard(&boot_file);
	if (ret)
		goto out;
	sha256_buf(data, c->stats->bootstrap_bytes, boot_digest);
	ret = put_compressed_bootstrap(layout, data, c->stats->bootstrap_bytes,
				       zboot_digest, &zboot_size);
	if (ret)
		goto out;

	if (src) {
		config = src->config;
		ret = oci_put_blob(layout, src->config_data, src->config_len,
				   config.digest);
	} else {
		ret = put_default_config(layout, &config);
	}
	if (ret)
		goto out;

	manifest = json_object_new_object();
	json_object_object_add(manifest, "schemaVersion", json_object_new_int(2));
	json_object_object_add(manifest, "mediaType",
			       json_object_new_string(OCI_MANIFEST_TYPE));
	json_object_object_add(manifest, "config",
			       descriptor_json(config.media_type[0] ? config.media_type :
					       "application/vnd.oci.image.config.v1+json",
					       config.digest, config.size));
	layers = json_object_new_array();
	for (i = 0; i < nr; i++) {
		d = descriptor_json(FERRY_BLOB_MEDIA_TYPE, blobs[i]->info.digest,
				    blobs[i]->info.size);
		snprintf(num, sizeof(num), "%llu",
			 (unsigned long long)blobs[i]->info.uncompressed_size);
		annotate(d, "dev.ferry.blob.uncompressed-size", num);
		if (blobs[i]->source_layer)
			annotate(d, "dev.ferry.blob.source-layer", blobs[i]->source_layer);
		if (blobs[i]->from_dict)
			annotate(d, "dev.ferry.blob.chunk-dict", "true");
		json_object_array_add(layers, d);
	}
	d = descriptor_json(FERRY_BOOTSTRAP_MEDIA_TYPE, zboot_digest, zboot_size);
	annotate(d, "dev.ferry.bootstrap", "true");
	digest_format(boot_digest, dstr);
	annotate(d, FERRY_BOOTSTRAP_DIGEST_ANNOTATION, dstr);
	snprintf(num, sizeof(num), "%llu", (unsigned long long)c->stats->bootstrap_bytes);
	annotate(d, "dev.ferry.bootstrap.uncompressed-size", num);
	json_object_array_add(layers, d);
	json_object_object_add(manifest, "layers", layers);
	annotate(manifest, "dev.ferry.version", "1");
	snprintf(num, sizeof(num), "%u", c->opts->chunk_size);
	annotate(manifest, "dev.ferry.chunk-size", num);
	compression_name(c->opts, comp, sizeof(comp));
	annotate(manifest, "dev.ferry.compression", comp);
	if (src) {
		char *joined = NULL;
		size_t len = 0;
		FILE *f = open_memstream(&joined, &len);

		if (!f) {
			ret = -ENOMEM;
			goto out;
		}
		for (i = 0; i < src->nr_layers; i++) {
			digest_format(src->layers[i].digest, dstr);
			fprintf(f, "%s%s", i ? "," : "", dstr);
		}
		if (fclose(f) || !joined) {
			free(joined);
			ret = -ENOMEM;
			goto out;
		}
		annotate(manifest, "dev.ferry.source-layers", joined);
		free(joined);
		digest_format(src->manifest_desc.digest, dstr);
		annotate(manifest, "dev.ferry.source-manifest", dstr);
	}
	text = json_object_to_json_string_ext(manifest, JSON_C_TO_STRING_PLAIN |
							JSON_C_TO_STRING_NOSLASHESCAPE);
	ret = oci_put_blob(layout, text, strlen(text), manifest_digest);
	if (!ret)
		ret = oci_tag_manifest(layout, tag ? tag : "latest", manifest_digest,
				       strlen(text), OCI_MANIFEST_TYPE);
	if (!ret) {
		digest_format(manifest_digest, c->stats->manifest_digest);
		c->stats->manifest_size = strlen(text);
	}
out:
	json_object_put(manifest);
	free(data);
	free(copy);
	return ret;
}

/* ------------------------------------------------------------------ */
/* Sources                                                             */
/* ------------------------------------------------------------------ */

static ssize_t stream_read(void *ctx, void *buf, size_t len)
{
	return fetch_stream_read(ctx, buf, len);
}

/* A registry layer, streamed: the stream checks size and digest. */
static int apply_remote_layer(struct converter *c, const struct oci_image *img,
			      const struct oci_descriptor *d, const char *name)
{
	struct fetch_stream *fs = NULL;
	struct input_stream *in = NULL;
	int ret;

	ret = registry_open_stream(img->remote, d->digest, d->size, &fs);
	if (ret)
		return ret;
	ret = input_open_source((struct byte_source){ stream_read, fs }, name, &in);
	if (!ret)
		ret = convert_apply_input(c, in, d->size, name);
	input_close(in);
	fetch_stream_close(fs);
	return ret;
}

static int convert_oci_layers(struct converter *c, const struct oci_image *img)
{
	uint32_t i;
	int ret = 0;

	c->layered = true;
	for (i = 0; i < img->nr_layers && !ret; i++) {
		const struct oci_descriptor *d = &img->layers[i];
		char *path = NULL, name[96];

		digest_format(d->digest, name + 6);
		memcpy(name, "layer ", 6);
		ret = convert_layer_begin(c, name + 6);
		if (ret)
			break;
		if (img->remote) {
			ret = apply_remote_layer(c, img, d, name);
		} else {
			ret = oci_blob_path(img->layout, d->digest, &path);
			if (!ret)
				ret = convert_apply_tar(c, path, d->digest, name);
			free(path);
		}
		if (!ret)
			ret = convert_layer_end(c);
	}
	return ret;
}

static int parse_ref(const char *ref, const char *const *kinds, size_t nr_kinds,
		     size_t *kind, const char **path)
{
	size_t i;

	for (i = 0; i < nr_kinds; i++) {
		size_t len = strlen(kinds[i]);

		if (!strncmp(ref, kinds[i], len) && ref[len] == ':' && ref[len + 1]) {
			*kind = i;
			*path = ref + len + 1;
			return 0;
		}
	}
	return -EINVAL;
}

static int validate_opts(const struct convert_opts *o)
{
	if (o->chunk_size < 4096 || o->chunk_size > BLOB_CHUNK_MAX ||
	    (o->chunk_size & (o->chunk_size - 1))) {
		ferry_err("chunk size %u: must be a power of two from 4 KiB to %u MiB",
			  o->chunk_size, BLOB_CHUNK_MAX >> 20);
		return -EINVAL;
	}
	if (o->inline_max > 3072) {
		ferry_err("inline limit %u: must be at most 3072 bytes", o->inline_max);
		return -EINVAL;
	}
	if (o->jobs > 256) {
		ferry_err("--jobs %u: at most 256", o->jobs);
		return -EINVAL;
	}
	return 0;
}

enum { SRC_DIR, SRC_TAR, SRC_OCI, SRC_DOCKER };
enum { DST_DIR, DST_OCI, DST_DOCKER };
static const char *const src_kinds[] = { "dir", "tar", "oci", "docker" };
static const char *const dst_kinds[] = { "dir", "oci", "docker" };

/* "docker://REF" → "REF": the transport's path starts with "//". */
static int docker_path(const char *ref, const char **path)
{
	if (strncmp(*path, "//", 2) || !(*path)[2]) {
		ferry_err("\"%s\": expected docker://HOST[:PORT]/REPO[:TAG|@DIGEST]",
			  ref);
		return -EINVAL;
	}
	*path += 2;
	return 0;
}

static int parse_refs(const char *source, const char *dest, size_t *skind,
		      const char **spath, size_t *dkind, const char **dpath)
{
	if (parse_ref(source, src_kinds, ARRAY_SIZE(src_kinds), skind, spath)) {
		ferry_err("source \"%s\": expected dir:PATH, tar:PATH, oci:PATH[:TAG] or docker://HOST/REPO[:TAG|@DIGEST]",
			  source);
		return -EINVAL;
	}
	if (parse_ref(dest, dst_kinds, ARRAY_SIZE(dst_kinds), dkind, dpath)) {
		ferry_err("destination \"%s\": expected dir:PATH, oci:PATH[:TAG] or docker://HOST/REPO[:TAG]",
			  dest);
		return -EINVAL;
	}
	if (*skind == SRC_DOCKER && docker_path(source, spath))
		return -EINVAL;
	if (*dkind == DST_DOCKER && docker_path(dest, dpath))
		return -EINVAL;
	return 0;
}

int convert_check_args(const char *source, const char *dest,
		       const struct convert_opts *opts)
{
	const char *spath, *dpath;
	size_t skind, dkind;

	if (parse_refs(source, dest, &skind, &spath, &dkind, &dpath))
		return -EINVAL;
	return validate_opts(opts);
}

void convert_stats_free(struct convert_stats *stats)
{
	free(stats->blobs);
	stats->blobs = NULL;
	stats->nr_blobs = 0;
}

int convert_run(const char *source, const char *dest,
		const struct convert_opts *opts, struct convert_stats *stats)
{
	struct converter c = { .opts = opts, .stats = stats, .writer_file = { .fd = -1, .dir_fd = -1 } };
	struct oci_image src_img = { 0 };
	struct out_blob **used = NULL;
	const char *src_path = NULL, *dst_path = NULL;
	char *layout = NULL, *tag, *blobs_dir = NULL;
	char *staging = NULL, *oci_dst = NULL;
	size_t skind = 0, dkind = 0;
	uint32_t nr_used = 0, i;
	bool out_existed = true;
	uint64_t start = ferry_now_ns();
	int ret;

	memset(stats, 0, sizeof(*stats));
	if (parse_refs(source, dest, &skind, &src_path, &dkind, &dst_path))
		return -EINVAL;
	ret = validate_opts(opts);
	if (ret)
		return ret;
	if (dkind == DST_DOCKER) {
		/* Converted into a staging layout, then pushed from there. */
		ret = oci_staging_create(&staging);
		if (ret)
			return ret;
		oci_dst = staging;
	}
	layout = strdup(oci_dst ? oci_dst : dst_path);
	if (!layout) {
		ret = -ENOMEM;
		goto out;
	}
	if (dkind == DST_OCI)
		oci_split_ref(layout, &layout, &tag);
	if (asprintf(&blobs_dir, "%s/blobs/sha256", layout) < 0) {
		blobs_dir = NULL;
		ret = -ENOMEM;
		goto out;
	}
	c.blobs_dir = blobs_dir;
	if (skind == SRC_OCI || skind == SRC_DOCKER) {
		ret = skind == SRC_OCI ?
			oci_image_open(src_path, opts->platform, &src_img) :
			oci_remote_open(src_path, opts->platform, opts->fetch,
					&src_img);
		if (ret)
			goto out;
	}
	out_existed = !access(layout, F_OK);
	ret = dkind == DST_DIR ? mkdir_p(blobs_dir, 0755) : oci_layout_init(layout);
	if (ret)
		goto out;
	c.buf = malloc(opts->chunk_size);
	if (!c.buf) {
		ret = -ENOMEM;
		goto out;
	}
	ret = meta_tree_new(&c.tree);
	if (ret)
		goto out;
	if (opts->chunk_dict) {
		ret = load_chunk_dict(&c, opts->chunk_dict);
		if (ret)
			goto out;
	}
	if (opts->prefetch_files) {
		ret = prefetch_list_load(opts->prefetch_files, &c.prefetch,
					 &c.nr_prefetch);
		if (ret)
			goto out;
	}

	switch (skind) {
	case SRC_DIR:
		ret = convert_layer_begin(&c, NULL);
		if (!ret)
			ret = convert_dir(&c, src_path);
		if (!ret)
			ret = convert_layer_end(&c);
		break;
	case SRC_TAR:
		ret = convert_layer_begin(&c, NULL);
		if (!ret)
			ret = convert_apply_tar(&c, src_path, NULL, src_path);
		if (!ret)
			ret = convert_layer_end(&c);
		break;
	default:
		ret = convert_oci_layers(&c, &src_img);
		break;
	}
	if (ret)
		goto out;
	ret = assign_devices(&c);
	if (!ret)
		ret = used_blobs(&c, &used, &nr_used);
	if (!ret)
		ret = fill_stats(stats, used, nr_used);
	if (ret)
		goto out;
	if (dkind == DST_DIR)
		ret = finish_dir(&c, layout, used, nr_used);
	else
		ret = finish_oci(&c, oci_dst ? oci_dst : dst_path,
				 src_img.manifest ? &src_img : NULL, used, nr_used);
	if (!ret && dkind == DST_DOCKER) {
		uint8_t digest[32];

		digest_parse(stats->manifest_digest, digest);
		ret = oci_push(staging, digest, stats->manifest_size, dst_path,
			       opts->fetch, &c.progress);
	}
	stats->seconds = (double)(ferry_now_ns() - start) / 1e9;
out:
	layer_discard(&c);
	if (ret) {
		/*
		 * A destination this run created holds nothing else: remove
		 * it. In an existing one, finished blobs may be shared with
		 * other images (same digest), so they stay.
		 */
		for (i = 0; !out_existed && i < c.nr_blobs; i++)
			if (!c.blobs[i].from_dict && c.blobs[i].path)
				unlink(c.blobs[i].path);
		if (!out_existed && !staging && !rmdir(blobs_dir)) {
			*strrchr(blobs_dir, '/') = '\0';
			rmdir(blobs_dir);
			if (dkind == DST_OCI) {
				char *f = NULL;

				if (asprintf(&f, "%s/oci-layout", layout) >= 0)
					unlink(f);
				free(f);
			}
			rmdir(layout);
		}
		convert_stats_free(stats);
	}
	for (i = 0; i < c.nr_blobs; i++) {
		blob_info_free_chunks(&c.blobs[i].info);
		free(c.blobs[i].path);
		free(c.blobs[i].source_layer);
	}
	free(c.blobs);
	free(used);
	image_close(c.dict);
	prefetch_list_free(c.prefetch, c.nr_prefetch);
	if (staging)
		oci_staging_remove(staging);
	free(staging);
	oci_image_free(&src_img);
	meta_tree_free(c.tree);
	free(c.chunks.slots);
	free(c.links);
	free(c.buf);
	free(blobs_dir);
	free(layout);
	return ret;
}
