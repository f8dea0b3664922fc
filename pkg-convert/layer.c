// SPDX-License-Identifier: MIT
/*
 * Applying tar archives to the tree: one archive for tar: sources, one per
 * layer for oci: sources, with OCI image-spec layer semantics:
 *  - a later entry replaces an earlier one, except that a directory over a
 *    directory only updates its attributes and keeps its children;
 *  - ".wh.NAME" removes NAME as it came from lower layers;
 *  - ".wh..wh..opq" hides every lower-layer child of its directory, as if
 *    it came first in the layer, wherever it stands in the archive;
 *  - whiteout files themselves never enter the tree.
 * The last two need to know which entries the current layer added: that
 * is the layer_set, cleared at the start of each layer.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "internal.h"
#include "tar.h"


/* ------------------------------------------------------------------ */
/* Entries added by the current layer                                  */
/* ------------------------------------------------------------------ */

static uint64_t entry_hash(const struct meta_inode *dir, const char *name,
			   size_t len)
{
	uint64_t h = 1469598103934665603ull ^ (uint64_t)(uintptr_t)dir;
	size_t i;

	for (i = 0; i < len; i++)
		h = (h ^ (uint8_t)name[i]) * 1099511628211ull;
	return h;
}

static struct layer_entry *layer_set_find(struct layer_set *s,
					  const struct meta_inode *dir,
					  const char *name, size_t len,
					  uint64_t hash)
{
	size_t i = (size_t)hash & (s->cap - 1);

	while (s->slots[i].dir) {
		struct layer_entry *e = &s->slots[i];

		if (e->hash == hash && e->dir == dir && !strncmp(e->name, name, len) &&
		    !e->name[len])
			return e;
		i = (i + 1) & (s->cap - 1);
	}
	return &s->slots[i];
}

static int layer_set_grow(struct layer_set *s)
{
	struct layer_set n = { .cap = s->cap ? s->cap * 2 : 1024 };
	size_t i;

	n.slots = calloc(n.cap, sizeof(*n.slots));
	if (!n.slots)
		return -ENOMEM;
	for (i = 0; i < s->cap; i++) {
		struct layer_entry *e = &s->slots[i], *slot;

		if (!e->dir)
			continue;
		slot = &n.slots[(size_t)e->hash & (n.cap - 1)];
		while (slot->dir)
			slot = &n.slots[((size_t)(slot - n.slots) + 1) & (n.cap - 1)];
		*slot = *e;
	}
	n.used = s->used;
	free(s->slots);
	*s = n;
	return 0;
}

static int layer_set_add(struct layer_set *s, const struct meta_inode *dir,
			 const char *name, bool fresh_dir)
{
	size_t len = strlen(name);
	uint64_t hash = entry_hash(dir, name, len);
	struct layer_entry *e;
	int ret;

	if (s->used * 2 >= s->cap) {
		ret = layer_set_grow(s);
		if (ret)
			return ret;
	}
	e = layer_set_find(s, dir, name, len, hash);
	if (e->dir) {
		e->fresh_dir = fresh_dir;
		return 0;
	}
	e->name = strdup(name);
	if (!e->name)
		return -ENOMEM;
	e->dir = dir;
	e->hash = hash;
	e->fresh_dir = fresh_dir;
	s->used++;
	return 0;
}

static const struct layer_entry *layer_set_get(struct layer_set *s,
					       const struct meta_inode *dir,
					       const char *name, size_t len)
{
	const struct layer_entry *e;

	if (!s->cap)
		return NULL;
	e = layer_set_find(s, dir, name, len, entry_hash(dir, name, len));
	return e->dir ? e : NULL;
}

static void layer_set_clear(struct layer_set *s)
{
	size_t i;

	for (i = 0; i < s->cap; i++)
		free(s->slots[i].name);
	free(s->slots);
	memset(s, 0, sizeof(*s));
}

/*
 * Opaque @dir: drop every child the current layer did not add; in a child
 * directory the layer only updated, do the same one level down.
 */
static int make_opaque(struct converter *c, struct meta_inode *dir,
		       unsigned int depth)
{
	uint32_t i = 0;
	int ret;

	if (depth > 4096)
		return -ELOOP;
	while (i < dir->nr_children) {
		struct meta_dentry *d = dir->children[i];
		const struct layer_entry *e =
			layer_set_get(&c->added, dir, d->name, d->name_len);

		if (!e) {
			/* unlink moves the last child into slot i */
			ret = meta_dir_unlink(c->tree, dir, d->name, d->name_len);
			if (ret)
				return ret;
			continue;
		}
		if (S_ISDIR(d->inode->mode) && !e->fresh_dir) {
			ret = make_opaque(c, d->inode, depth + 1);
			if (ret)
				return ret;
		}
		i++;
	}
	return 0;
}

/* ------------------------------------------------------------------ */
/* Tar entries                                                         */
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
 * Directory inode for the parent of @path ("a/b/c" → a/b). Missing
 * directories are created (0755, root-owned) like tar extraction does,
 * unless @create is false: then *dir_out is NULL.
 */
static int tar_parent_dir(struct converter *c, char *path, bool create,
			  struct meta_inode **dir_out, const char **name_out)
{
	struct meta_inode *dir = c->tree->root;
	char *comp = path, *slash;
	int ret;

	while ((slash = strchr(comp, '/'))) {
		size_t len = (size_t)(slash - comp);
		struct meta_inode *child = meta_dir_lookup(dir, comp, len);

		if (!child || !S_ISDIR(child->mode)) {
			if (!create) {
				*dir_out = NULL;
				return 0;
			}
			ret = meta_inode_new(c->tree, S_IFDIR | 0755, &child);
			if (!ret && c->native) {
				*slash = '\0';
				ret = native_implicit_dir(c, path, child);
				*slash = '/';
			}
			if (!ret)
				ret = meta_dir_link(c->tree, dir, comp, len, child);
			if (!ret && c->layered) {
				*slash = '\0';
				ret = layer_set_add(&c->added, dir, comp, true);
				*slash = '/';
			}
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

int convert_parent_dir(struct converter *c, char *path,
		       struct meta_inode **dir, const char **name)
{
	return tar_parent_dir(c, path, true, dir, name);
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

/* A whiteout entry in a layer: returns 1 if @path was one (and applied). */
static int apply_whiteout(struct converter *c, struct tar_entry *e, char *path)
{
	char *base = strrchr(path, '/');
	struct meta_inode *dir;
	const char *name, *target;
	int ret;

	base = base ? base + 1 : path;
	if (strncmp(base, WHITEOUT_PREFIX, strlen(WHITEOUT_PREFIX)))
		return 0;
	ret = tar_parent_dir(c, path, false, &dir, &name);
	if (ret)
		return ret;
	if (!dir)
		return 1; /* nothing below to hide */
	if (!strcmp(name, WHITEOUT_OPAQUE)) {
		ret = make_opaque(c, dir, 0);
		return ret ? ret : 1;
	}
	target = name + strlen(WHITEOUT_PREFIX);
	if (!*target || !strcmp(target, ".") || !strcmp(target, "..")) {
		ferry_err("tar entry \"%s\": invalid whiteout", e->path);
		return -EFSCORRUPTED;
	}
	/* Only lower layers' entries are whited out. */
	if (!layer_set_get(&c->added, dir, target, strlen(target)) &&
	    meta_dir_lookup(dir, target, strlen(target)))
		ret = meta_dir_unlink(c->tree, dir, target, strlen(target));
	return ret ? ret : 1;
}

static int tar_add_entry(struct converter *c, struct tar_reader *tar,
			 struct tar_entry *e)
{
	struct tar_data_reader reader = { .tar = tar };
	struct file_source src = { tar_read_exact, NULL, &reader };
	struct meta_inode *dir, *inode, *old;
	bool fresh_dir = false;
	const char *name;
	char *path = e->path;
	int ret = convert_cancelled(c);

	if (ret)
		return ret;
	if (strstr(path, "..")) {
		/* Normalising rewrites the path: keep the name for the message. */
		char *orig = strdup(path);

		ret = path_normalize(path);
		if (ret)
			ferry_err("tar entry \"%s\": \"..\" would leave the image root",
				  orig ? orig : path);
		free(orig);
		if (ret)
			return ret;
	} else {
		path_normalize(path);
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
	if (c->layered || c->native) {
		ret = c->native ? native_entry(c, e, path) :
				  apply_whiteout(c, e, path);
		if (ret)
			return ret < 0 ? ret : 0;
	}
	ret = tar_parent_dir(c, path, true, &dir, &name);
	if (ret)
		return ret;
	old = meta_dir_lookup(dir, name, strlen(name));

	switch (e->type) {
	case TAR_DIR:
		c->stats->dirs++;
		/* A directory over a directory updates it and keeps its children. */
		if (old && S_ISDIR(old->mode)) {
			ret = tar_apply_attrs(old, e);
			if (!ret && c->layered)
				ret = layer_set_add(&c->added, dir, name, false);
			return ret;
		}
		fresh_dir = true;
		ret = meta_inode_new(c->tree, S_IFDIR, &inode);
		if (!ret)
			ret = tar_apply_attrs(inode, e);
		break;
	case TAR_HARDLINK: {
		struct meta_inode *target_dir;
		const char *target_name;

		c->stats->hardlinks++;
		if (strstr(e->linkname, "..") || !*e->linkname) {
			ferry_err("tar entry \"%s\": bad hardlink target \"%s\"",
				  e->path, e->linkname);
			return -EFSCORRUPTED;
		}
		path_normalize(e->linkname);
		if (!*e->linkname) {
			ferry_err("tar entry \"%s\": hardlink to the root", e->path);
			return -EFSCORRUPTED;
		}
		ret = tar_parent_dir(c, e->linkname, false, &target_dir, &target_name);
		if (ret)
			return ret;
		inode = target_dir ? meta_dir_lookup(target_dir, target_name,
						     strlen(target_name)) : NULL;
		if (c->native) {
			ret = native_link_target(c, e->linkname, &inode);
			if (ret)
				return ret;
		}
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
			ret = convert_ingest_file(c, inode, e->size, &src, e->path,
						  e->path);
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
	if (ret) {
		ferry_err("tar entry \"%s\": %s", e->path, ferry_strerror(ret));
		return ret;
	}
	if (c->layered)
		ret = layer_set_add(&c->added, dir, name, fresh_dir);
	return ret;
}

/*
 * Read what follows the tar trailer to the end of the input, so that the
 * compressed stream's own checks (gzip CRC and length, xz and zstd
 * checksums) and the layer digest run, and junk after the archive is
 * reported.
 */
static int drain_input(struct input_stream *in, const char *name)
{
	struct byte_source src = input_source(in);
	uint8_t buf[16384];
	ssize_t n;

	while ((n = src.read(src.ctx, buf, sizeof(buf))) > 0)
		;
	if (n < 0)
		ferry_err("%s: after the end of the archive: %s", name,
			  ferry_strerror((int)n));
	return (int)n;
}

int convert_apply_input(struct converter *c, struct input_stream *in,
			uint64_t size, const char *name)
{
	struct tar_reader *tar = NULL;
	struct tar_entry *e;
	int ret;

	layer_set_clear(&c->added);
	ret = tar_reader_new(input_source(in), &tar);
	if (ret)
		goto out;
	ferry_progress_begin(&c->progress, name, size);
	c->tar = tar;
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
		ret = drain_input(in, name);
out:
	c->tar = NULL;
	layer_set_clear(&c->added);
	tar_reader_free(tar);
	return ret;
}

int convert_apply_tar(struct converter *c, const char *path,
		      const uint8_t *digest, const char *name)
{
	struct input_stream *in = NULL;
	struct stat st;
	int ret;

	ret = input_open_verified(path, digest, name, &in);
	if (ret)
		return ret;
	ret = convert_apply_input(c, in, stat(path, &st) ? 0 : (uint64_t)st.st_size,
				  name);
	input_close(in);
	return ret;
}
