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

#include "../pkg-base/base.h"
#include "internal.h"
#include "tar.h"

/* Where a stored chunk lives: the dedup table maps sha256 to this. */
struct chunk_slot {
	uint8_t sha256[BLOB_DIGEST_SIZE];
	uint32_t usize;
	uint16_t device_id; /* 0 = empty table slot */
	uint32_t blkaddr;
};

struct chunk_table {
	struct chunk_slot *slots;
	size_t cap, used; /* cap is a power of two */
};

struct hardlink {
	dev_t dev;
	ino_t ino;
	struct meta_inode *inode;
};

struct converter {
	const struct convert_opts *opts;
	struct convert_stats *stats;
	struct meta_tree *tree;
	struct blob_writer *blob;
	uint16_t blob_device_id;
	struct chunk_table chunks;
	uint8_t *buf; /* one chunk */
	struct hardlink *links;
	size_t nr_links, links_cap;
	struct ferry_progress progress;
};

static int chunk_table_grow(struct chunk_table *t)
{
	size_t new_cap = t->cap ? t->cap * 2 : 4096, i;
	struct chunk_slot *slots = calloc(new_cap, sizeof(*slots));

	if (!slots)
		return -ENOMEM;
	for (i = 0; i < t->cap; i++) {
		const struct chunk_slot *s = &t->slots[i];
		size_t h;

		if (!s->device_id)
			continue;
		h = (size_t)get_le64(s->sha256) & (new_cap - 1);
		while (slots[h].device_id)
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

	while (t->slots[h].device_id) {
		struct chunk_slot *s = &t->slots[h];

		if (s->usize == usize && !memcmp(s->sha256, sha256, BLOB_DIGEST_SIZE))
			return s;
		h = (h + 1) & (t->cap - 1);
	}
	return &t->slots[h];
}

static bool all_zero(const uint8_t *p, size_t len)
{
	static const uint8_t zeros[4096];

	while (len >= sizeof(zeros)) {
		if (memcmp(p, zeros, sizeof(zeros)))
			return false;
		p += sizeof(zeros);
		len -= sizeof(zeros);
	}
	return !memcmp(p, zeros, len);
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
	if (all_zero(data, len)) {
		c->stats->bytes_zero += len;
		*out = (struct meta_chunk){ .device_id = 0, .blkaddr = META_CHUNK_HOLE };
		return 0;
	}
	blob_sha256(data, len, sha256);
	if (c->chunks.used * 2 >= c->chunks.cap) {
		ret = chunk_table_grow(&c->chunks);
		if (ret)
			return ret;
	}
	slot = chunk_table_find(&c->chunks, sha256, len);
	if (!slot->device_id) {
		ret = blob_writer_add(c->blob, data, len, sha256, &uoff);
		if (ret)
			return ret;
		if (uoff / META_BLOCK_SIZE > UINT32_MAX - 1) {
			ferry_err("blob exceeds %u blocks: split the input",
				  UINT32_MAX - 1);
			return -EFBIG;
		}
		memcpy(slot->sha256, sha256, sizeof(sha256));
		slot->usize = len;
		slot->device_id = c->blob_device_id;
		slot->blkaddr = (uint32_t)(uoff / META_BLOCK_SIZE);
		c->chunks.used++;
		c->stats->chunks_unique++;
		c->stats->bytes_unique += len;
	}
	*out = (struct meta_chunk){ .device_id = slot->device_id,
				    .blkaddr = slot->blkaddr };
	return 0;
}

/* Where a regular file's bytes come from. */
struct file_source {
	/* Read exactly @len bytes: 0 or -errno. */
	int (*read)(void *ctx, void *buf, size_t len);
	/* Optional: skip the next @len bytes and return true if they are
	 * known to be a hole (all zero) without reading them. */
	bool (*skip_hole)(void *ctx, uint64_t len);
	void *ctx;
};

/*
 * Fill @inode (a regular file of @size bytes) from @read: inline in the
 * bootstrap when small, else as chunks.
 */
static int ingest_file(struct converter *c, struct meta_inode *inode,
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
	if (c->nr_links == c->links_cap) {
		size_t cap = c->links_cap ? c->links_cap * 2 : 64;
		struct hardlink *n = realloc(c->links, cap * sizeof(*n));

		if (!n)
			return -ENOMEM;
		c->links = n;
		c->links_cap = cap;
	}
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
		if (nr == cap) {
			char **n;

			cap = cap ? cap * 2 : 64;
			n = realloc(names, cap * sizeof(*n));
			if (!n) {
				ret = -ENOMEM;
				goto out;
			}
			names = n;
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
		ret = ingest_file(c, inode, (uint64_t)st.st_size, &src, path);
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
/* tar: sources                                                        */
/* ------------------------------------------------------------------ */

struct tar_data_reader {
	struct tar_reader *tar;
};

static int tar_read_exact(void *ctx, void *buf, size_t len)
{
	struct tar_data_reader *r = ctx;
	uint8_t *p = buf;

	while (len) {
		ssize_t n = tar_read_data(r->tar, p, len);

		if (n < 0)
			return (int)n;
		if (n == 0)
			return -EFSCORRUPTED;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/*
 * Normalise an archive path in place into "a/b/c" (no leading '/', no
 * "." or empty components). "" means the root. ".." is refused: the image
 * root is the only root an entry may name.
 */
int convert_normalize_path(char *path)
{
	char *src = path, *dst = path;

	while (*src) {
		char *end = strchrnul(src, '/');
		size_t len = (size_t)(end - src);

		if (len == 2 && src[0] == '.' && src[1] == '.')
			return -EINVAL;
		if (len && !(len == 1 && src[0] == '.')) {
			if (dst != path)
				*dst++ = '/';
			memmove(dst, src, len);
			dst += len;
		}
		src = *end ? end + 1 : end;
	}
	*dst = '\0';
	return 0;
}

/*
 * Directory inode for the parent of @path ("a/b/c" → a/b), creating
 * missing directories (0755, root-owned) like tar extraction does.
 */
static int tar_parent_dir(struct converter *c, char *path,
			  struct meta_inode **dir_out, const char **name_out)
{
	struct meta_inode *dir = c->tree->root;
	char *comp = path, *slash;
	int ret;

	while ((slash = strchr(comp, '/'))) {
		struct meta_inode *child;

		child = meta_dir_lookup(dir, comp, (size_t)(slash - comp));
		if (!child || !S_ISDIR(child->mode)) {
			ret = meta_inode_new(c->tree, S_IFDIR | 0755, &child);
			if (ret)
				return ret;
			ret = meta_dir_link(c->tree, dir, comp,
					    (size_t)(slash - comp), child);
			if (ret)
				return ret;
		}
		dir = child;
		comp = slash + 1;
	}
	*dir_out = dir;
	*name_out = comp;
	return 0;
}

static int tar_apply_attrs(struct meta_inode *inode, const struct tar_entry *e)
{
	static const uint32_t type_bits[] = {
		[TAR_REG] = S_IFREG, [TAR_HARDLINK] = 0, [TAR_SYMLINK] = S_IFLNK,
		[TAR_CHR] = S_IFCHR, [TAR_BLK] = S_IFBLK, [TAR_DIR] = S_IFDIR,
		[TAR_FIFO] = S_IFIFO,
	};
	uint32_t i;
	int ret;

	/* Linux symlinks are always 0777, whatever the archive recorded. */
	inode->mode = type_bits[e->type] |
		      (e->type == TAR_SYMLINK ? 0777 : (e->mode & 07777));
	inode->uid = e->uid;
	inode->gid = e->gid;
	inode->mtime = e->mtime;
	inode->mtime_nsec = e->mtime_nsec;
	inode->rdev_major = e->dev_major;
	inode->rdev_minor = e->dev_minor;
	meta_inode_clear_xattrs(inode);
	for (i = 0; i < e->nr_xattrs; i++) {
		ret = meta_inode_set_xattr(inode, e->xattrs[i].name,
					   e->xattrs[i].value,
					   e->xattrs[i].value_len);
		if (ret)
			return ret;
	}
	return 0;
}

static int tar_add_entry(struct converter *c, struct tar_reader *tar,
			 struct tar_entry *e)
{
	struct tar_data_reader reader = { .tar = tar };
	struct file_source src = { tar_read_exact, NULL, &reader };
	struct meta_inode *dir, *inode, *old;
	const char *name;
	char *path = e->path;
	int ret;

	ret = convert_normalize_path(path);
	if (ret) {
		ferry_err("tar entry \"%s\": path leaves the image root", e->path);
		return ret;
	}
	c->stats->entries++;
	if (!*path) { /* "./": the root directory itself */
		if (e->type != TAR_DIR) {
			ferry_err("tar entry \"%s\": the root must be a directory",
				  e->path);
			return -EFSCORRUPTED;
		}
		return tar_apply_attrs(c->tree->root, e);
	}
	ret = tar_parent_dir(c, path, &dir, &name);
	if (ret)
		return ret;
	old = meta_dir_lookup(dir, name, strlen(name));

	switch (e->type) {
	case TAR_DIR:
		c->stats->dirs++;
		/* Re-listing a directory updates it and keeps its children. */
		if (old && S_ISDIR(old->mode))
			return tar_apply_attrs(old, e);
		ret = meta_inode_new(c->tree, S_IFDIR, &inode);
		if (!ret)
			ret = tar_apply_attrs(inode, e);
		break;
	case TAR_HARDLINK: {
		struct meta_inode *target_dir;
		const char *target_name;

		c->stats->hardlinks++;
		ret = convert_normalize_path(e->linkname);
		if (ret || !*e->linkname) {
			ferry_err("tar entry \"%s\": bad hardlink target \"%s\"",
				  e->path, e->linkname);
			return -EFSCORRUPTED;
		}
		ret = tar_parent_dir(c, e->linkname, &target_dir, &target_name);
		if (ret)
			return ret;
		inode = meta_dir_lookup(target_dir, target_name,
					strlen(target_name));
		if (!inode || S_ISDIR(inode->mode)) {
			ferry_err("tar entry \"%s\": hardlink target \"%s\" %s",
				  e->path, e->linkname,
				  inode ? "is a directory" : "does not exist");
			return -EFSCORRUPTED;
		}
		if (inode == old)
			return 0;
		break;
	}
	default:
		ret = meta_inode_new(c->tree, S_IFREG, &inode);
		if (!ret)
			ret = tar_apply_attrs(inode, e);
		if (ret)
			break;
		if (e->type == TAR_REG) {
			c->stats->files++;
			ret = ingest_file(c, inode, e->size, &src, e->path);
		} else if (e->type == TAR_SYMLINK) {
			c->stats->symlinks++;
			inode->size = strlen(e->linkname);
			inode->data = (uint8_t *)strdup(e->linkname);
			if (!inode->data)
				ret = -ENOMEM;
		} else {
			c->stats->specials++;
		}
		break;
	}
	if (ret)
		return ret;
	ret = meta_dir_link(c->tree, dir, name, strlen(name), inode);
	if (ret)
		ferry_err("tar entry \"%s\": %s", e->path, ferry_strerror(ret));
	return ret;
}

/*
 * Read what follows the tar trailer to the end of the input, so that the
 * compressed stream's own checks (gzip CRC and length, xz and zstd
 * checksums) run and junk after the archive is reported.
 */
static int drain_input(struct input_stream *in, const char *path)
{
	struct byte_source src = input_source(in);
	uint8_t buf[16384];
	ssize_t n;

	while ((n = src.read(src.ctx, buf, sizeof(buf))) > 0)
		;
	if (n < 0)
		ferry_err("%s: after the end of the archive: %s", path,
			  ferry_strerror((int)n));
	return (int)n;
}

static int convert_tar(struct converter *c, const char *path)
{
	struct input_stream *in = NULL;
	struct tar_reader *tar = NULL;
	struct tar_entry *e;
	struct stat st;
	int ret;

	ret = input_open(path, &in);
	if (ret)
		return ret;
	ret = tar_reader_new(input_source(in), &tar);
	if (ret)
		goto out;
	ferry_progress_begin(&c->progress, "converting",
			     stat(path, &st) ? 0 : (uint64_t)st.st_size);
	while ((ret = tar_next(tar, &e)) > 0) {
		ret = tar_add_entry(c, tar, e);
		if (ret)
			break;
		/* Progress counts compressed input, the size we know up front. */
		c->progress.done = 0;
		ferry_progress_add(&c->progress, input_bytes_in(in));
	}
	ferry_progress_end(&c->progress);
	if (!ret)
		ret = drain_input(in, path);
out:
	tar_reader_free(tar);
	input_close(in);
	return ret;
}

/* ------------------------------------------------------------------ */
/* Output                                                              */
/* ------------------------------------------------------------------ */

static int mkdir_p(const char *path)
{
	char *copy = strdup(path), *p;
	int ret = 0;

	if (!copy)
		return -ENOMEM;
	for (p = copy + 1;; p++) {
		if (*p != '/' && *p)
			continue;
		char saved = *p;

		*p = '\0';
		if (mkdir(copy, 0755) && errno != EEXIST) {
			ret = -errno;
			ferry_err("%s: cannot create directory: %s", copy,
				  strerror(errno));
			break;
		}
		*p = saved;
		if (!saved)
			break;
	}
	free(copy);
	return ret;
}

/* Write @data to @dir/@name through a temporary file and rename. */
static int write_file_atomic(const char *dir, const char *name,
			     const void *data, size_t len)
{
	char *path = NULL, *tmp = NULL;
	int fd = -1, ret;

	if (asprintf(&path, "%s/%s", dir, name) < 0 ||
	    asprintf(&tmp, "%s/.%s.tmp", dir, name) < 0) {
		ret = -ENOMEM;
		goto out;
	}
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		ret = -errno;
		goto out;
	}
	ret = write_full(fd, data, len);
	if (!ret && fsync(fd))
		ret = -errno;
	if (!ret && rename(tmp, path))
		ret = -errno;
out:
	if (fd >= 0)
		close(fd);
	if (ret) {
		ferry_err("%s/%s: cannot write: %s", dir, name, ferry_strerror(ret));
		if (tmp)
			unlink(tmp);
	}
	free(path);
	free(tmp);
	return ret;
}

static int write_index_json(const char *out_dir, const struct convert_opts *o,
			    const struct convert_stats *s,
			    const uint8_t *bootstrap_digest)
{
	struct json_object *root = json_object_new_object();
	struct json_object *boot = json_object_new_object();
	struct json_object *blobs = json_object_new_array();
	char hex[2 * BLOB_DIGEST_SIZE + 1], digest[80], comp[32];
	const char *text;
	uint32_t i;
	int ret;

	hex_encode(bootstrap_digest, BLOB_DIGEST_SIZE, hex);
	snprintf(digest, sizeof(digest), "sha256:%s", hex);
	json_object_object_add(root, "schemaVersion", json_object_new_int(1));
	json_object_object_add(boot, "path", json_object_new_string("bootstrap"));
	json_object_object_add(boot, "digest", json_object_new_string(digest));
	json_object_object_add(boot, "size", json_object_new_int64((int64_t)s->bootstrap_bytes));
	json_object_object_add(root, "bootstrap", boot);
	for (i = 0; i < s->nr_blobs; i++) {
		struct json_object *b = json_object_new_object();

		json_object_object_add(b, "digest", json_object_new_string(s->blobs[i].digest));
		json_object_object_add(b, "size", json_object_new_int64((int64_t)s->blobs[i].size));
		json_object_object_add(b, "uncompressedSize",
				       json_object_new_int64((int64_t)s->blobs[i].uncompressed_size));
		json_object_object_add(b, "chunks", json_object_new_int64(s->blobs[i].nr_chunks));
		json_object_array_add(blobs, b);
	}
	json_object_object_add(root, "blobs", blobs);
	json_object_object_add(root, "chunkSize", json_object_new_int64(o->chunk_size));
	if (o->compress.level)
		snprintf(comp, sizeof(comp), "%s:%d",
			 blob_codec_name(o->compress.codec), o->compress.level);
	else
		snprintf(comp, sizeof(comp), "%s", blob_codec_name(o->compress.codec));
	json_object_object_add(root, "compression", json_object_new_string(comp));
	text = json_object_to_json_string_ext(root, JSON_C_TO_STRING_PRETTY |
						    JSON_C_TO_STRING_NOSLASHESCAPE);
	ret = write_file_atomic(out_dir, "ferry.json", text, strlen(text));
	json_object_put(root);
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
	return 0;
}

static const char *const src_kinds[] = { "dir", "tar" };
static const char *const dst_kinds[] = { "dir" };

int convert_check_args(const char *source, const char *dest,
		       const struct convert_opts *opts)
{
	const char *path;
	size_t kind;

	if (parse_ref(source, src_kinds, ARRAY_SIZE(src_kinds), &kind, &path)) {
		ferry_err("source \"%s\": expected dir:PATH or tar:PATH", source);
		return -EINVAL;
	}
	if (parse_ref(dest, dst_kinds, ARRAY_SIZE(dst_kinds), &kind, &path)) {
		ferry_err("destination \"%s\": expected dir:PATH", dest);
		return -EINVAL;
	}
	return validate_opts(opts);
}

int convert_run(const char *source, const char *dest,
		const struct convert_opts *opts, struct convert_stats *stats)
{
	struct converter c = { .opts = opts, .stats = stats, .blob_device_id = 1 };
	struct blob_info blob = { 0 };
	struct meta_write_stats wstats;
	struct meta_device device;
	struct meta_write_opts wopts = { 0 };
	const char *src_path = NULL, *out_dir = NULL;
	char *blobs_dir = NULL, *blob_tmp = NULL, *blob_path = NULL;
	char *boot_tmp = NULL, *boot_path = NULL;
	char hex[2 * BLOB_DIGEST_SIZE + 1];
	uint8_t boot_digest[BLOB_DIGEST_SIZE];
	void *ext = NULL, *boot_data = NULL;
	size_t ext_len = 0, kind = 0, dkind;
	int blob_fd = -1, boot_fd = -1, ret;
	bool out_existed = true;
	uint64_t start = ferry_now_ns();

	memset(stats, 0, sizeof(*stats));
	ret = convert_check_args(source, dest, opts);
	if (ret)
		return ret;
	parse_ref(source, src_kinds, ARRAY_SIZE(src_kinds), &kind, &src_path);
	parse_ref(dest, dst_kinds, ARRAY_SIZE(dst_kinds), &dkind, &out_dir);

	if (asprintf(&blobs_dir, "%s/blobs/sha256", out_dir) < 0 ||
	    asprintf(&blob_tmp, "%s/.blob.tmp", blobs_dir) < 0 ||
	    asprintf(&boot_tmp, "%s/.bootstrap.tmp", out_dir) < 0 ||
	    asprintf(&boot_path, "%s/bootstrap", out_dir) < 0) {
		ret = -ENOMEM;
		goto out;
	}
	out_existed = !access(out_dir, F_OK);
	ret = mkdir_p(blobs_dir);
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
	blob_fd = open(blob_tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (blob_fd < 0) {
		ret = -errno;
		ferry_err("%s: %s", blob_tmp, strerror(errno));
		goto out;
	}
	ret = blob_writer_new(blob_fd, &opts->compress, &c.blob);
	if (ret)
		goto out;

	ret = kind == 0 ? convert_dir(&c, src_path) : convert_tar(&c, src_path);
	if (ret)
		goto out;

	if (c.chunks.used) {
		ret = blob_writer_finish(c.blob, &blob);
		c.blob = NULL;
		if (ret)
			goto out;
		if (fsync(blob_fd)) {
			ret = -errno;
			goto out;
		}
		hex_encode(blob.digest, BLOB_DIGEST_SIZE, hex);
		if (asprintf(&blob_path, "%s/%s", blobs_dir, hex) < 0) {
			ret = -ENOMEM;
			goto out;
		}
		if (rename(blob_tmp, blob_path)) {
			ret = -errno;
			ferry_err("%s: %s", blob_path, strerror(errno));
			goto out;
		}
		memcpy(device.tag, hex, sizeof(device.tag));
		device.blocks = (uint32_t)(blob.uncompressed_size / META_BLOCK_SIZE);
		wopts.devices = &device;
		wopts.nr_devices = 1;
		stats->nr_blobs = 1;
		snprintf(stats->blobs[0].digest, sizeof(stats->blobs[0].digest),
			 "sha256:%s", hex);
		stats->blobs[0].size = blob.size;
		stats->blobs[0].uncompressed_size = blob.uncompressed_size;
		stats->blobs[0].nr_chunks = blob.nr_chunks;
	} else {
		/* Everything was inline or a hole: no blob at all. */
		blob_writer_abort(c.blob);
		c.blob = NULL;
		unlink(blob_tmp);
	}
	ret = blob_index_encode(&blob, stats->nr_blobs, &ext, &ext_len);
	if (ret)
		goto out;
	wopts.ext = ext;
	wopts.ext_len = ext_len;

	boot_fd = open(boot_tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (boot_fd < 0) {
		ret = -errno;
		ferry_err("%s: %s", boot_tmp, strerror(errno));
		goto out;
	}
	ret = meta_write(c.tree, &wopts, boot_fd, &wstats);
	if (ret)
		goto out;
	stats->bootstrap_bytes = wstats.bytes;
	boot_data = malloc(wstats.bytes);
	if (!boot_data) {
		ret = -ENOMEM;
		goto out;
	}
	ret = pread_full(boot_fd, boot_data, wstats.bytes, 0);
	if (ret)
		goto out;
	blob_sha256(boot_data, wstats.bytes, boot_digest);
	if (fsync(boot_fd) || rename(boot_tmp, boot_path)) {
		ret = -errno;
		ferry_err("%s: %s", boot_path, strerror(errno));
		goto out;
	}
	ret = write_index_json(out_dir, opts, stats, boot_digest);
	stats->seconds = (double)(ferry_now_ns() - start) / 1e9;
out:
	if (c.blob)
		blob_writer_abort(c.blob);
	if (blob_fd >= 0)
		close(blob_fd);
	if (boot_fd >= 0)
		close(boot_fd);
	if (ret) {
		if (blob_tmp)
			unlink(blob_tmp);
		if (boot_tmp)
			unlink(boot_tmp);
		/* Leave no half-made destination: rmdir only removes empty ones. */
		if (blobs_dir && !rmdir(blobs_dir)) {
			*strrchr(blobs_dir, '/') = '\0';
			rmdir(blobs_dir);
			if (!out_existed)
				rmdir(out_dir);
		}
	}
	blob_info_free_chunks(&blob);
	meta_tree_free(c.tree);
	free(c.chunks.slots);
	free(c.links);
	free(c.buf);
	free(ext);
	free(boot_data);
	free(blobs_dir);
	free(blob_tmp);
	free(blob_path);
	free(boot_tmp);
	free(boot_path);
	return ret;
}
