// SPDX-License-Identifier: MIT
/*
 * Native EROFS layers (convert --format erofs-layers): every OCI layer
 * becomes one standalone EROFS image that the kernel mounts by itself and
 * overlayfs stacks, the layer format containerd's EROFS snapshotter pulls
 * as application/vnd.erofs.layer.v1 (docs/FORMAT.md, "Native EROFS
 * layers").
 *
 * Each layer is read by layer.c into a tree of its own, with these hooks:
 *  - ".wh.NAME" becomes NAME as a 0:0 character device (an overlayfs
 *    whiteout), unless this layer itself has NAME: whiteouts only hide
 *    lower layers, as in the merged conversion;
 *  - ".wh..wh..opq" marks its directory trusted.overlay.opaque=y, set
 *    when the layer ends (a later entry of the directory would reset its
 *    xattrs);
 *  - a 0:0 character device in the archive is refused: overlayfs would
 *    take it for a whiteout;
 *  - trusted.overlay.* xattrs from the archive are stored escaped
 *    (trusted.overlay.overlay.*), which overlayfs (Linux 6.7+) shows
 *    unescaped and never interprets;
 *  - a hardlink to a file of a lower layer becomes a copy of it (its
 *    attributes and bytes): overlayfs cannot link across layers;
 *  - file bytes go to a temporary data file, each file contiguous and
 *    block-aligned, which meta_write embeds after the metadata (files
 *    FLAT_PLAIN, nothing inline: what containerd's differ builds with
 *    -Enoinline_data);
 *  - when compressing, files of at most FRAGMENT_MAX bytes go whole into
 *    the layer's packed inode instead (EROFS fragments), compressed there
 *    together: alone each would take at least a block.
 * The image is named by its sha256, which is also its diff_id.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "tar.h"

#define OVL_PREFIX "trusted.overlay."
#define OVL_ESCAPED "trusted.overlay.overlay."
#define OVL_OPAQUE "trusted.overlay.opaque"
#define COPY_BUF (1u << 20)
/*
 * Input per compressed extent, what a cold read of one byte decompresses:
 * the kernel's largest pcluster. On bench's "big" layer (142.5 MB tar.gz)
 * with zstd:3 and fragments, extents of 128 KiB / 256 KiB / 1 MiB gave
 * 1.09 / 1.04 / 1.01x the tar.gz at the same speed.
 */
#define NATIVE_EXTENT META_ZPACK_EXTENT_MAX
/*
 * The largest file stored as a fragment; a read of it decompresses at most
 * two of the packed inode's extents. On "big" (zstd:3, 128 KiB extents):
 * none 1.28x the tar.gz, up to 16 KiB 1.13x, 64 KiB 1.09x, 128 KiB 1.09x.
 */
#define FRAGMENT_MAX (64u << 10)

struct native_layer {
	struct meta_tree *tree;
	int image_fd;        /* the written layer, read-only */
	uint64_t data_off;   /* where its embedded data starts */
	uint8_t digest[32]; /* of the layer */
	uint64_t size;       /* the layer's: image and range table */
	uint64_t ranges_offset; /* the range table's, == the image's bytes */
	uint8_t ranges_digest[32];
	const uint8_t *source; /* the OCI layer's digest, or NULL (tar:) */
	int packed_fd;       /* its fragments uncompressed, or -1 */
};

struct native_state {
	struct native_layer *layers; /* converted so far, bottom first */
	uint32_t nr_layers;
	size_t layers_cap;
	int data_fd;          /* the current layer's data */
	struct zpipe *zp;     /* lays it out, compressing */
	char **opaque;        /* directories marked opaque in this layer */
	size_t nr_opaque, opaque_cap;
	char **escaped;       /* xattr names this layer's entries borrow */
	size_t nr_escaped, escaped_cap;
	bool compress;        /* compressed files (not --compress none) */
	enum meta_zalgorithm zalgorithm;
	int zlevel;           /* 0: the codec's default */
	bool fragments;       /* small files into the packed inode */
	int packed_fd;        /* the current layer's fragments, or -1 */
	uint64_t packed_len;
};

int native_check_refs(const struct image_ref *src, const struct image_ref *dst)
{
	if (src->transport == IMAGE_DIR) {
		ferry_err("source dir:%s: --format erofs-layers converts layers: give a tar:, oci: or docker:// source",
			  src->path);
		return -EINVAL;
	}
	if (dst->transport == IMAGE_DIR) {
		ferry_err("destination dir:%s: --format erofs-layers writes an OCI image: give an oci: or docker:// destination",
			  dst->path);
		return -EINVAL;
	}
	return 0;
}

static bool is_whiteout(const struct meta_inode *inode)
{
	return S_ISCHR(inode->mode) && !inode->rdev_major && !inode->rdev_minor;
}

static int push_string(char ***arr, size_t *nr, size_t *cap, char *s)
{
	if (!s || array_reserve(arr, cap, *nr + 1, sizeof(**arr), 16)) {
		free(s);
		return -ENOMEM;
	}
	(*arr)[(*nr)++] = s;
	return 0;
}

static void free_strings(char ***arr, size_t *nr, size_t *cap)
{
	for (size_t i = 0; i < *nr; i++)
		free((*arr)[i]);
	free(*arr);
	*arr = NULL;
	*nr = *cap = 0;
}

/* trusted.overlay.X of the archive is stored as trusted.overlay.overlay.X. */
static int escape_overlay_xattrs(struct native_state *n, struct tar_entry *e)
{
	for (uint32_t i = 0; i < e->nr_xattrs; i++) {
		char *name;
		int ret;

		if (strncmp(e->xattrs[i].name, OVL_PREFIX, strlen(OVL_PREFIX)))
			continue;
		if (asprintf(&name, "%s%s", OVL_ESCAPED,
			     e->xattrs[i].name + strlen(OVL_PREFIX)) < 0)
			return -ENOMEM;
		ret = push_string(&n->escaped, &n->nr_escaped, &n->escaped_cap, name);
		if (ret)
			return ret;
		/* The entry's array is the reader's copy: its names stay owned there. */
		e->xattrs[i].name = name;
	}
	return 0;
}

static int add_whiteout(struct converter *c, struct tar_entry *e, char *path,
			char *base)
{
	const char *target = base + strlen(WHITEOUT_PREFIX), *name;
	struct meta_inode *dir, *old, *wh;
	int ret;

	if (!*target || !strcmp(target, ".") || !strcmp(target, "..")) {
		ferry_err("tar entry \"%s\": invalid whiteout", e->path);
		return -EFSCORRUPTED;
	}
	/* "dir/.wh.x" → "dir/x": the whiteout takes the name it hides. */
	memmove(base, target, strlen(target) + 1);
	ret = convert_parent_dir(c, path, &dir, &name);
	if (ret)
		return ret;
	old = meta_dir_lookup(dir, name, strlen(name));
	if (old && !is_whiteout(old))
		return 1; /* this layer's own entry stays */
	ret = meta_inode_new(c->tree, S_IFCHR, &wh);
	if (ret)
		return ret;
	wh->uid = e->uid;
	wh->gid = e->gid;
	wh->mtime = e->mtime;
	wh->mtime_nsec = e->mtime_nsec;
	ret = meta_dir_link(c->tree, dir, name, strlen(name), wh);
	return ret ? ret : 1;
}

int native_entry(struct converter *c, struct tar_entry *e, char *path)
{
	struct native_state *n = c->native;
	char *base = strrchr(path, '/');

	base = base ? base + 1 : path;
	/* Nothing below the first layer: its markers hide nothing. */
	if (!n->nr_layers && !strncmp(base, WHITEOUT_PREFIX, strlen(WHITEOUT_PREFIX)))
		return 1;
	if (!strcmp(base, WHITEOUT_OPAQUE)) {
		char *dir = strndup(path, (size_t)(base - path));
		struct meta_inode *parent;
		const char *name;
		int ret = push_string(&n->opaque, &n->nr_opaque, &n->opaque_cap,
				      dir);

		if (ret)
			return ret;
		/* The directory exists in this layer, even if only implied. */
		ret = convert_parent_dir(c, path, &parent, &name);
		return ret ? ret : 1;
	}
	if (!strncmp(base, WHITEOUT_PREFIX, strlen(WHITEOUT_PREFIX)))
		return add_whiteout(c, e, path, base);
	if (e->type == TAR_CHR && !e->dev_major && !e->dev_minor) {
		ferry_err("tar entry \"%s\": a 0:0 character device is an overlayfs whiteout and cannot be carried in a native EROFS layer; convert without --format erofs-layers",
			  e->path);
		return -EINVAL;
	}
	return escape_overlay_xattrs(n, e);
}

static bool is_opaque(const struct meta_inode *dir)
{
	for (uint32_t k = 0; k < dir->nr_xattrs; k++)
		if (!strcmp(dir->xattrs[k].name, OVL_OPAQUE))
			return true;
	return false;
}

/*
 * @path ("a/b") in @t, or NULL; with @hides, whether @t also hides the
 * path from the layers below (as overlayfs would): a non-directory (a
 * whiteout among them) on the way, or an opaque directory that lacks the
 * rest.
 */
static struct meta_inode *tree_lookup(struct meta_tree *t, const char *path,
				      bool *hides)
{
	struct meta_inode *inode = t->root, *next;
	const char *comp = path;
	bool stop = false;

	while (*comp) {
		const char *slash = strchr(comp, '/');
		size_t len = slash ? (size_t)(slash - comp) : strlen(comp);

		if (!S_ISDIR(inode->mode)) {
			stop = true;
			inode = NULL;
			break;
		}
		next = meta_dir_lookup(inode, comp, len);
		if (!next) {
			stop = is_opaque(inode);
			inode = NULL;
			break;
		}
		inode = next;
		comp += len + (slash ? 1 : 0);
	}
	if (hides)
		*hides = stop;
	return inode;
}

/* The topmost visible lower-layer entry at @path, and its layer; or NULL. */
static struct meta_inode *lower_lookup(struct native_state *n, const char *path,
				       struct native_layer **layer)
{
	for (uint32_t i = n->nr_layers; i-- > 0;) {
		bool hides;
		struct meta_inode *inode = tree_lookup(n->layers[i].tree, path,
						       &hides);

		if (inode) {
			*layer = &n->layers[i];
			return inode;
		}
		if (hides)
			break;
	}
	return NULL;
}

static int copy_attrs(struct meta_inode *to, const struct meta_inode *from)
{
	int ret = 0;

	to->mode = from->mode;
	to->uid = from->uid;
	to->gid = from->gid;
	to->mtime = from->mtime;
	to->mtime_nsec = from->mtime_nsec;
	to->rdev_major = from->rdev_major;
	to->rdev_minor = from->rdev_minor;
	for (uint32_t k = 0; k < from->nr_xattrs && !ret; k++) {
		/* Opacity belongs to the lower layer's own directory. */
		if (!strcmp(from->xattrs[k].name, OVL_OPAQUE))
			continue;
		ret = meta_inode_set_xattr(to, from->xattrs[k].name,
					   from->xattrs[k].value,
					   from->xattrs[k].value_len);
	}
	return ret;
}

int native_implicit_dir(struct converter *c, const char *path,
			struct meta_inode *dir)
{
	struct native_layer *l;
	const struct meta_inode *lower = lower_lookup(c->native, path, &l);

	return lower && S_ISDIR(lower->mode) ? copy_attrs(dir, lower) : 0;
}

/* Copy @len bytes at @off of @fd to @dst of @dst_fd. */
static int copy_data(struct converter *c, int fd, uint64_t off, int dst_fd,
		     uint64_t dst, uint64_t len)
{
	uint64_t done = 0;
	int ret = 0;

	while (!ret && done < len) {
		size_t k = (size_t)MIN(len - done, (uint64_t)COPY_BUF);

		ret = pread_full(fd, c->buf, k, off + done);
		if (!ret)
			ret = pwrite_full(dst_fd, c->buf, k, dst + done);
		done += k;
	}
	return ret;
}

/* A @size-byte file as the next fragment of the layer's packed inode. */
static void reserve_fragment(struct converter *c, struct meta_inode *inode,
			     uint64_t size)
{
	inode->size = size;
	inode->fragment = true;
	inode->fragment_off = c->native->packed_len;
}

int native_link_target(struct converter *c, const char *path,
		       struct meta_inode **target)
{
	struct native_state *n = c->native;
	struct meta_inode *lower = NULL, *copy;
	struct native_layer *l = NULL;
	int ret;

	if (*target) {
		/* Whited out by this very layer: gone, as in the merged view. */
		if (is_whiteout(*target))
			*target = NULL;
		return 0;
	}
	lower = lower_lookup(n, path, &l);
	if (!lower || is_whiteout(lower) || S_ISDIR(lower->mode))
		return 0;
	ret = meta_inode_new(c->tree, lower->mode, &copy);
	if (!ret)
		ret = copy_attrs(copy, lower);
	if (ret)
		return ret;
	if (S_ISREG(lower->mode) && lower->fragment) {
		reserve_fragment(c, copy, lower->size);
		ret = copy_data(c, l->packed_fd, lower->fragment_off, n->packed_fd,
				n->packed_len, lower->size);
		if (ret)
			return ret;
		n->packed_len += lower->size;
	} else if (S_ISLNK(lower->mode)) {
		copy->size = lower->size;
		copy->data = malloc(lower->size);
		if (!copy->data)
			return -ENOMEM;
		memcpy(copy->data, lower->data, lower->size);
	} else if (S_ISREG(lower->mode)) {
		/* Compressed: its pclusters (consecutive blocks) as they are. */
		const struct meta_zextent *z = lower->zextents;
		uint32_t nz = lower->nr_zextents, from, nr, start;

		from = z ? z[0].blkaddr : lower->embedded_blkaddr;
		nr = z ? z[nz - 1].blkaddr + z[nz - 1].blocks - from :
			 (uint32_t)DIV_ROUND_UP(lower->size, META_BLOCK_SIZE);
		ret = zpipe_reserve(n->zp, nr, &start);
		if (!ret)
			ret = copy_data(c, l->image_fd,
					l->data_off + (uint64_t)from * META_BLOCK_SIZE,
					n->data_fd, (uint64_t)start * META_BLOCK_SIZE,
					z ? (uint64_t)nr * META_BLOCK_SIZE : lower->size);
		if (ret)
			return ret;
		copy->size = lower->size;
		copy->embedded = true;
		copy->embedded_blkaddr = start;
		if (z) {
			copy->zextents = calloc(nz, sizeof(*copy->zextents));
			if (!copy->zextents)
				return -ENOMEM;
			copy->nr_zextents = nz;
			copy->zalgorithm = lower->zalgorithm;
			for (uint32_t k = 0; k < nz; k++) {
				copy->zextents[k] = z[k];
				copy->zextents[k].blkaddr = start + (z[k].blkaddr - from);
			}
		}
	}
	c->stats->files += S_ISREG(lower->mode);
	*target = copy;
	return 0;
}

struct cancellable {
	struct converter *c;
	const struct file_source *src;
};

static int cancellable_read(void *ctx, void *buf, size_t len)
{
	struct cancellable *k = ctx;
	int ret = convert_cancelled(k->c);

	return ret ? ret : k->src->read(k->src->ctx, buf, len);
}

int native_ingest_file(struct converter *c, struct meta_inode *inode,
		       uint64_t size, const struct file_source *src,
		       const char *path)
{
	struct native_state *n = c->native;
	struct cancellable k = { c, src };
	struct file_source checked = { .read = cancellable_read, .ctx = &k };
	uint64_t done = 0;
	int ret = 0;

	c->stats->bytes_in += size;
	ferry_progress_add(&c->progress, size);
	if (!n->fragments || !size || size > FRAGMENT_MAX) {
		ret = zpipe_add(n->zp, inode, size, n->compress, &checked, path);
		if (ret)
			ferry_err("%s: %s", path, ferry_strerror(ret));
		return ret;
	}
	reserve_fragment(c, inode, size);
	while (!ret && done < size) {
		size_t len = (size_t)MIN(size - done, (uint64_t)COPY_BUF);

		ret = checked.read(checked.ctx, c->buf, len);
		if (!ret)
			ret = pwrite_full(n->packed_fd, c->buf, len,
					  n->packed_len + done);
		done += len;
	}
	if (ret) {
		ferry_err("%s: %s", path, ferry_strerror(ret));
		return ret;
	}
	n->packed_len += size;
	return 0;
}

struct fd_reader {
	int fd;
	uint64_t off;
};

static int fd_read(void *ctx, void *buf, size_t len)
{
	struct fd_reader *r = ctx;
	int ret = pread_full(r->fd, buf, len, r->off);

	r->off += len;
	return ret;
}

/* The layer's fragments as its packed inode, compressed like a file. */
static int pack_fragments(struct converter *c, struct meta_inode **packed)
{
	static const char name[] = "the layer's packed inode";
	struct native_state *n = c->native;
	struct fd_reader r = { n->packed_fd, 0 };
	struct file_source src = { .read = fd_read, .ctx = &r };
	struct meta_inode *p = NULL;
	int ret = meta_inode_new(c->tree, S_IFREG | 0600, &p);

	if (!ret)
		ret = zpipe_add(n->zp, p, n->packed_len, true, &src, name);
	if (ret) {
		ferry_err("%s: %s", name, ferry_strerror(ret));
		return ret;
	}
	*packed = p;
	return 0;
}

/* ------------------------------------------------------------------ */
/* One layer                                                           */
/* ------------------------------------------------------------------ */

static int mark_opaque(struct converter *c)
{
	struct native_state *n = c->native;
	int ret = 0;

	for (size_t i = 0; i < n->nr_opaque && !ret; i++) {
		char *p = n->opaque[i];
		struct meta_inode *dir;

		/* "a/b/" as recorded: drop the slash for the lookup. */
		if (*p)
			p[strlen(p) - 1] = '\0';
		dir = tree_lookup(c->tree, p, NULL);
		/* A later entry may have replaced the directory: nothing to mark. */
		if (dir && S_ISDIR(dir->mode))
			ret = meta_inode_set_xattr(dir, OVL_OPAQUE, "y", 1);
	}
	return ret;
}

/*
 * Append the range table of the @size-byte image in @fd (its metadata the
 * first l->data_off bytes) and name the layer: l->digest, size and where
 * the table is, with its digest (image.h, FORMAT.md 1d).
 */
static int seal_layer(struct converter *c, int fd, uint64_t size,
		      struct native_layer *l)
{
	uint64_t nr = DIV_ROUND_UP(size, LAYER_RANGE_SIZE), off = 0;
	uint8_t (*ranges)[32] = calloc(nr + 1, sizeof(*ranges)), *table = NULL;
	struct sha256_hasher *h = NULL;
	size_t len = 0;
	int ret = ranges ? sha256_hasher_new(&h) : -ENOMEM;

	_Static_assert(COPY_BUF >= LAYER_RANGE_SIZE, "a range fits the buffer");
	for (uint64_t i = 0; !ret && i < nr; i++, off += LAYER_RANGE_SIZE) {
		size_t k = (size_t)MIN(size - off, (uint64_t)LAYER_RANGE_SIZE);

		ret = pread_full(fd, c->buf, k, off);
		if (!ret) {
			sha256_hasher_update(h, c->buf, k);
			sha256_buf(c->buf, k, ranges[i]);
		}
	}
	if (!ret)
		ret = image_layer_ranges_encode(size, l->data_off,
						(const uint8_t (*)[32])ranges, &table, &len);
	if (!ret)
		ret = pwrite_full(fd, table, len, size);
	if (!ret) {
		sha256_hasher_update(h, table, len);
		sha256_hasher_final(h, l->digest);
		sha256_buf(table, len, l->ranges_digest);
		l->ranges_offset = size;
		l->size = size + len;
	}
	sha256_hasher_free(h);
	free(table);
	free(ranges);
	return ret;
}

/* The tree and data of the layer just read → blobs/sha256/<digest>. */
static int write_layer(struct converter *c, const char *blobs_dir,
		       struct native_layer *l)
{
	struct native_state *n = c->native;
	struct meta_embedded emb = { n->data_fd, 0 };
	struct meta_write_opts wo = {
		.volume_name = "ferry-layer", .standalone = true, .embedded = &emb,
	};
	struct atomic_file af = { .fd = -1, .dir_fd = -1 };
	struct meta_write_stats ws;
	char hex[65], *path;
	int ret = mark_opaque(c);

	if (!ret && n->packed_len)
		ret = pack_fragments(c, &wo.packed);
	if (!ret)
		ret = zpipe_flush(n->zp, &emb.blocks);
	if (!ret)
		ret = atomic_file_create(&af, blobs_dir, "erofs-layer", 0644);
	if (!ret)
		ret = meta_write(c->tree, &wo, af.fd, &ws);
	if (!ret) {
		l->data_off = (uint64_t)ws.embedded_blkaddr * META_BLOCK_SIZE;
		ret = seal_layer(c, af.fd, ws.bytes, l);
	}
	if (!ret) {
		hex_encode(l->digest, 32, hex);
		ret = atomic_file_commit(&af, hex);
	}
	if (ret) {
		atomic_file_discard(&af);
		return ret;
	}
	/* Upper layers' hardlinks copy from it (the data file goes). */
	if (asprintf(&path, "%s/%s", blobs_dir, hex) < 0)
		return -ENOMEM;
	l->image_fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (l->image_fd < 0) {
		ret = -errno;
		ferry_err("%s: %s", path, ferry_strerror(ret));
	}
	free(path);
	return ret;
}

static int convert_layer(struct converter *c, const struct oci_image *img,
			 const struct image_ref *src, uint32_t index,
			 const char *blobs_dir)
{
	struct native_state *n = c->native;
	struct native_layer *l;
	char name[96] = "layer ";
	int ret;

	if (array_reserve(&n->layers, &n->layers_cap, n->nr_layers + 1,
			  sizeof(*n->layers), 16))
		return -ENOMEM;
	l = &n->layers[n->nr_layers];
	memset(l, 0, sizeof(*l));
	l->image_fd = -1;
	l->packed_fd = -1;
	n->packed_len = 0;
	/*
	 * Unnamed and gone when closed: the data lives only until written,
	 * the raw fragments until the last layer (upper layers' hardlinks
	 * copy from them).
	 */
	n->data_fd = open(blobs_dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
	if (n->data_fd >= 0 && n->fragments)
		n->packed_fd = open(blobs_dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
	if (n->data_fd < 0 || (n->fragments && n->packed_fd < 0)) {
		ret = -errno;
		ferry_err("%s: cannot create a temporary file: %s (a file system with O_TMPFILE is needed)",
			  blobs_dir, ferry_strerror(ret));
		goto out;
	}
	ret = zpipe_new(n->zalgorithm, n->zlevel, c->opts->jobs, n->data_fd,
			&n->zp);
	if (!ret)
		ret = meta_tree_new(&c->tree);
	/* Overlayfs shows the top root: without "./" keep the one below. */
	if (!ret && n->nr_layers)
		ret = copy_attrs(c->tree->root, n->layers[n->nr_layers - 1].tree->root);
	if (ret)
		goto out;
	if (!img) {
		ret = convert_apply_tar(c, src->path, NULL, src->path);
	} else {
		const struct oci_descriptor *d = &img->layers[index];

		digest_format(d->digest, name + 6);
		l->source = d->digest;
		ret = convert_apply_oci_layer(c, img, d, name);
	}
	if (!ret)
		ret = write_layer(c, blobs_dir, l);
out:
	free_strings(&n->opaque, &n->nr_opaque, &n->opaque_cap);
	free_strings(&n->escaped, &n->nr_escaped, &n->escaped_cap);
	/* The tree is kept for upper layers' lookups. */
	l->tree = c->tree;
	c->tree = NULL;
	zpipe_free(n->zp);
	n->zp = NULL;
	if (n->data_fd >= 0)
		close(n->data_fd);
	n->data_fd = -1;
	l->packed_fd = n->packed_fd;
	n->packed_fd = -1;
	n->nr_layers++;
	return ret;
}

static int fill_stats(struct converter *c, struct convert_stats *s)
{
	struct native_state *n = c->native;

	s->blobs = calloc(n->nr_layers + 1, sizeof(*s->blobs));
	if (!s->blobs)
		return -ENOMEM;
	s->nr_blobs = n->nr_layers;
	for (uint32_t i = 0; i < n->nr_layers; i++) {
		digest_format(n->layers[i].digest, s->blobs[i].digest);
		s->blobs[i].size = n->layers[i].size;
		s->blobs[i].uncompressed_size = n->layers[i].size;
	}
	return 0;
}

static int finish(struct converter *c, struct image_out *out,
		  const struct oci_image *img, bool index_member)
{
	struct native_state *n = c->native;
	struct image_out_layer *layers = calloc(n->nr_layers + 1, sizeof(*layers));
	struct image_out_layers_desc d = {
		.media_type = EROFS_LAYER_MEDIA_TYPE, .layers = layers,
		.nr_layers = n->nr_layers, .source = img,
		.fetch = c->opts->fetch, .progress = &c->progress,
		.index_member = index_member,
	};
	int ret;

	if (!layers)
		return -ENOMEM;
	for (uint32_t i = 0; i < n->nr_layers; i++) {
		memcpy(layers[i].digest, n->layers[i].digest, 32);
		layers[i].size = n->layers[i].size;
		layers[i].source = n->layers[i].source;
		layers[i].ranges_offset = n->layers[i].ranges_offset;
		memcpy(layers[i].ranges_digest, n->layers[i].ranges_digest, 32);
	}
	ret = image_out_finish_layers(out, &d, c->stats->manifest_digest,
				      &c->stats->manifest_size);
	free(layers);
	return ret;
}

#define SOURCES (IMAGE_ACCEPT(IMAGE_TAR) | IMAGE_ACCEPT(IMAGE_OCI) | \
		 IMAGE_ACCEPT(IMAGE_DOCKER) | IMAGE_ACCEPT(IMAGE_DIR) | \
		 IMAGE_ACCEPT(IMAGE_OCI_ARCHIVE) | IMAGE_ACCEPT(IMAGE_DOCKER_ARCHIVE))
#define DESTS (IMAGE_ACCEPT(IMAGE_OCI) | IMAGE_ACCEPT(IMAGE_DOCKER) | \
	       IMAGE_ACCEPT(IMAGE_DIR))

/* One image into @out (convert_image_fn): each layer, then its manifest. */
static int native_convert_into(const struct image_ref *src,
			       const struct oci_image *img, struct image_out *out,
			       bool index_member, const struct convert_opts *opts,
			       struct convert_stats *stats)
{
	struct native_state n = { .data_fd = -1, .packed_fd = -1 };
	struct converter c = { .opts = opts, .stats = stats, .native = &n };
	enum blob_codec codec = opts->compress.codec;
	uint64_t start = ferry_now_ns();
	uint32_t nr = img ? img->nr_layers : 1;
	int ret = 0;

	/* The kernel's numbers; lzma is MicroLZMA here, not an .xz stream. */
	n.zalgorithm = codec == BLOB_CODEC_LZ4 ? META_Z_LZ4 :
		       codec == BLOB_CODEC_LZMA ? META_Z_LZMA : META_Z_ZSTD;
	n.zlevel = opts->compress.level;
	if (opts->deflate_level) {
		n.zalgorithm = META_Z_DEFLATE;
		n.zlevel = opts->deflate_level;
	}
	n.compress = codec != BLOB_CODEC_NONE || opts->deflate_level;
	n.fragments = n.compress && !opts->no_fragments;
	for (uint32_t i = 0; img && i < nr; i++) {
		const char *mt = img->layers[i].media_type;

		if (!strcmp(mt, EROFS_LAYER_MEDIA_TYPE) || oci_is_ferry_blob(mt) ||
		    oci_is_ferry_bootstrap(mt)) {
			ferry_err("source %s is converted already (layer %u is %s): convert the container image it came from",
				  img->where, i + 1, mt);
			return -EINVAL;
		}
	}
	if (!(c.buf = malloc(COPY_BUF)))
		ret = -ENOMEM;
	for (uint32_t i = 0; !ret && i < nr; i++)
		ret = convert_layer(&c, img, src, i, image_out_blobs_dir(out));
	if (!ret)
		ret = fill_stats(&c, stats);
	if (!ret)
		ret = finish(&c, out, img, index_member);
	stats->seconds = (double)(ferry_now_ns() - start) / 1e9;
	for (uint32_t i = 0; i < n.nr_layers; i++) {
		meta_tree_free(n.layers[i].tree);
		if (n.layers[i].image_fd >= 0)
			close(n.layers[i].image_fd);
		if (n.layers[i].packed_fd >= 0)
			close(n.layers[i].packed_fd);
	}
	free(n.layers);
	free(c.buf);
	return ret;
}

int convert_run_erofs_layers(const char *source, const char *dest,
			     const struct convert_opts *opts,
			     struct convert_stats *stats)
{
	struct image_ref src = { 0 }, dst = { 0 };
	struct oci_image img = { 0 };
	struct image_out *out = NULL;
	int ret;

	memset(stats, 0, sizeof(*stats));
	ret = image_ref_parse(source, SOURCES, "source", &src);
	if (!ret)
		ret = image_ref_parse(dest, DESTS, "destination", &dst);
	if (!ret)
		ret = native_check_refs(&src, &dst);
	if (!ret)
		ret = convert_check_platforms(&dst, opts);
	/* An index becomes an index, unless one platform is named. */
	if (!ret && src.transport != IMAGE_TAR)
		ret = convert_open_image(&src, opts->platform ? opts->platform :
					 OCI_PLATFORMS, opts->fetch, &img);
	if (!ret)
		ret = image_out_open(&dst, opts->replace, &out);
	if (!ret && img.nr_platforms)
		ret = convert_index(&src, &img, out, native_convert_into, opts, stats);
	else if (!ret)
		ret = native_convert_into(&src, img.manifest ? &img : NULL, out, false,
					  opts, stats);
	image_out_close(out, ret != 0);
	if (ret)
		convert_stats_free(stats);
	convert_close_image(&img);
	image_ref_free(&src);
	image_ref_free(&dst);
	return ret;
}
