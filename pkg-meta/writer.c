// SPDX-License-Identifier: MIT
/*
 * meta_write(): serialise a meta_tree into an EROFS image the kernel mounts.
 *
 * Layout (4 KiB blocks; meta_blkaddr = 0, so NID = byte offset / 32):
 *   byte 0          ferry preamble (FERRY_PRE_*)
 *   byte 1024       superblock
 *   byte 1152       device table (devt_slotoff 9), may spill past block 0
 *   then            inodes, 32-byte aligned, in breadth-first order from
 *                   the root (sorted names); each followed by its inline
 *                   xattrs, then its 8-byte chunk indexes (8-aligned from
 *                   the inode) or its inline data tail. No inode header
 *                   crosses a block boundary.
 *   xattr_blkaddr   shared xattr entries (only if some pair is shared)
 *   data area       full blocks of directories and bootstrap-stored files
 *   embedded data   the caller's file data (meta_write_opts.embedded),
 *                   copied as given: files there are FLAT_PLAIN
 *   ext region      ferry extension payload, block aligned, then the
 *                   section area right after it, zero padded
 * A standalone image (native container layers) has no preamble and no ext.
 *
 * Choices a reader relies on (docs/FORMAT.md):
 * - An inline (FLAT_INLINE) tail is placed so that inode, xattrs and tail
 *   share one block (kernels reject tails crossing a block and fast
 *   symlinks must sit in the inode's block); when that cannot hold even at
 *   a block start, the file is FLAT_PLAIN with the tail in the data area.
 * - Files with no bytes in the data area (empty files, tail-only inline
 *   files) have startblk EROFS_NULL_ADDR; empty files are FLAT_PLAIN.
 * - Chunk holes are device_id 0 + startblk EROFS_NULL_ADDR.
 * - A compressed file whose pclusters follow each other in the embedded
 *   data, in file order, has compact indexes (COMPRESSED_COMPACT, 2-byte
 *   packs): a pack's one block address then locates all its heads. Any
 *   other has full ones; a file whole in the packed inode is
 *   COMPRESSED_FULL with the map header only, as mkfs.erofs writes it.
 * - The superblock epoch/fixed_nsec is the most common (mtime, nsec) pair
 *   with mtime >= 0 (earliest on ties); inodes with exactly that mtime and
 *   small ids/size/nlink are compact with i_mtime 0, others extended.
 * - uuid: the first 16 bytes of SHA-256 over the whole image in file order
 *   with uuid and checksum fields zero, stamped as an RFC 9562 version-8
 *   UUID. The superblock checksum is computed last, over the final bytes.
 */
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../pkg-base/base.h"
#include "internal.h"
#include "writer.h"

/* "/a/b" for @wi, shortened from the left to fit @size. */
const char *wr_path(const struct writer *w, const struct wr_inode *wi, char *buf,
		    size_t size)
{
	char *p = buf + size - 1;

	*p = '\0';
	if (wi->inode == w->opts->packed)
		return "(the packed inode)";
	if (!wi->name)
		return "/";
	while (wi->name) {
		size_t len = wi->name->name_len;

		if ((size_t)(p - buf) < len + 1 + 3) {
			p -= 3;
			memcpy(p, "...", 3);
			break;
		}
		p -= len;
		memcpy(p, wi->name->name, len);
		*--p = '/';
		wi = &w->inodes[wi->parent];
	}
	return p;
}

int wr_fail(const struct writer *w, const struct wr_inode *wi, int err, const char *fmt, ...)
{
	char path[PATH_BUF], msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	ferry_err("meta: cannot write %s: %s",
		  wr_path(w, wi, path, sizeof(path)), msg);
	return err;
}

/* ------------------------------------------------------------------ */
/* Collect: breadth-first walk, sorted entries, link counts             */
/* ------------------------------------------------------------------ */

static int dentry_cmp(const void *a, const void *b)
{
	const struct meta_dentry *x = *(const struct meta_dentry *const *)a;
	const struct meta_dentry *y = *(const struct meta_dentry *const *)b;
	int c = memcmp(x->name, y->name, MIN(x->name_len, y->name_len));

	return c ? c : (int)x->name_len - (int)y->name_len;
}

static int wr_add_inode(struct writer *w, struct meta_inode *inode,
			uint32_t parent, const struct meta_dentry *name)
{
	struct wr_inode *wi;

	if (w->nr_inodes == w->cap_inodes) {
		uint32_t cap = w->cap_inodes ? w->cap_inodes * 2 : 1024;
		struct wr_inode *n;

		if (w->cap_inodes > UINT32_MAX / 4) {
			ferry_err("meta: more than %u inodes", UINT32_MAX / 4);
			return -EFBIG;
		}
		n = realloc(w->inodes, (size_t)cap * sizeof(*n));
		if (!n)
			return -ENOMEM;
		w->inodes = n;
		w->cap_inodes = cap;
	}
	wi = &w->inodes[w->nr_inodes];
	memset(wi, 0, sizeof(*wi));
	wi->inode = inode;
	wi->parent = parent;
	wi->name = name;
	/* wpriv == w marks "visited"; it is reset before meta_write returns. */
	inode->wpriv = w;
	inode->order = w->nr_inodes++;
	return 0;
}

static int wr_collect_dir(struct writer *w, uint32_t idx)
{
	const struct meta_inode *dir = w->inodes[idx].inode;
	size_t n = (size_t)dir->nr_children + 2;
	const struct meta_dentry **ents;
	uint32_t nlink = 2;
	int ret;

	if (w->nr_ents + n > w->cap_ents) {
		size_t cap = MAX(w->cap_ents * 2, w->nr_ents + n);
		const struct meta_dentry **e = realloc(w->ents, cap * sizeof(*e));

		if (!e)
			return -ENOMEM;
		w->ents = e;
		w->cap_ents = cap;
	}
	ents = w->ents + w->nr_ents;
	ents[0] = w->dot;
	ents[1] = w->dotdot;
	if (dir->nr_children)
		memcpy(ents + 2, dir->children,
		       dir->nr_children * sizeof(ents[0]));
	qsort(ents, n, sizeof(ents[0]), dentry_cmp);
	w->inodes[idx].ents = w->nr_ents;
	w->inodes[idx].nr_ents = (uint32_t)n;
	w->nr_ents += n;

	for (size_t k = 0; k < n; k++) {
		struct meta_inode *child = ents[k]->inode;

		if (!child)
			continue;
		if (child->wpriv != w) {
			ret = wr_add_inode(w, child, idx, ents[k]);
			if (ret)
				return ret;
		}
		if (S_ISDIR(child->mode))
			nlink++;
		else
			w->inodes[child->order].nlink++;
	}
	w->inodes[idx].nlink = nlink;
	return 0;
}

static int wr_collect(struct writer *w, struct meta_tree *t)
{
	struct meta_inode *packed = w->opts->packed;
	int ret = wr_add_inode(w, t->root, 0, NULL);

	for (uint32_t i = 0; !ret && i < w->nr_inodes; i++)
		if (S_ISDIR(w->inodes[i].inode->mode))
			ret = wr_collect_dir(w, i);
	if (ret || !packed)
		return ret;
	/* Last, linked nowhere: no directory lists it. */
	if (packed->wpriv == w || !S_ISREG(packed->mode) || packed->fragment) {
		ferry_err("meta: the packed inode must be a regular file outside the tree");
		return -EINVAL;
	}
	ret = wr_add_inode(w, packed, 0, NULL);
	if (!ret)
		w->inodes[w->nr_inodes - 1].nlink = 1;
	return ret;
}

/* ------------------------------------------------------------------ */
/* Directory blocks                                                     */
/* ------------------------------------------------------------------ */

typedef int (*dir_block_fn)(struct writer *w, struct wr_inode *wi,
			    uint64_t blk, size_t first, size_t count,
			    uint32_t used);

/*
 * Pack directory @wi's sorted entries into blocks as readers expect: each
 * block holds its dirents, then their names; an entry that does not fit
 * with its name starts the next block. Sets wi->size (the used bytes of
 * the last block are not rounded up) and calls @fn, if any, per block.
 */
static int dir_blocks(struct writer *w, struct wr_inode *wi, dir_block_fn fn)
{
	const struct meta_dentry **ents = w->ents + wi->ents;
	uint64_t blk = 0;
	size_t first = 0;
	uint32_t used = 0;
	int ret;

	for (size_t k = 0;; k++) {
		uint32_t need = k < wi->nr_ents ?
			EROFS_DIRENT_SIZE + ents[k]->name_len : 0;

		if (k == wi->nr_ents || used + need > BLK) {
			if (fn) {
				ret = fn(w, wi, blk, first, k - first, used);
				if (ret)
					return ret;
			}
			if (k == wi->nr_ents)
				break;
			blk++;
			first = k;
			used = 0;
		}
		used += need;
	}
	wi->size = blk * BLK + used;
	return 0;
}

/* Render entries [first, first + count) of @wi as one block in w->block. */
static void dir_render(struct writer *w, const struct wr_inode *wi,
		       size_t first, size_t count)
{
	const struct meta_dentry **ents = w->ents + wi->ents + first;
	uint32_t nameoff = (uint32_t)count * EROFS_DIRENT_SIZE;

	memset(w->block, 0, BLK);
	for (size_t k = 0; k < count; k++) {
		const struct meta_dentry *d = ents[k];
		const struct wr_inode *target;
		uint8_t *de = w->block + k * EROFS_DIRENT_SIZE;

		if (d->inode)
			target = &w->inodes[d->inode->order];
		else if (d->name_len == 1)
			target = wi;
		else
			target = &w->inodes[wi->parent];
		put_le64(de + EROFS_DIRENT_NID, target->pos / EROFS_SLOT_SIZE);
		put_le16(de + EROFS_DIRENT_NAMEOFF, (uint16_t)nameoff);
		de[EROFS_DIRENT_FILE_TYPE] =
			erofs_ftype_of_mode(target->inode->mode);
		memcpy(w->block + nameoff, d->name, d->name_len);
		nameoff += d->name_len;
	}
}

/* ------------------------------------------------------------------ */
/* Validation and classification                                        */
/* ------------------------------------------------------------------ */

static int wr_check_chunks(struct writer *w, struct wr_inode *wi)
{
	const struct meta_inode *in = wi->inode;
	const struct meta_write_opts *o = w->opts;
	uint64_t chunk_size, chunk_blocks;

	if (in->data)
		return wr_fail(w, wi, -EINVAL, "has both inline data and chunks");
	if (in->chunk_bits > MAX_CHUNK_BITS)
		return wr_fail(w, wi, -EINVAL, "chunk_bits %u exceeds %u",
			       in->chunk_bits, MAX_CHUNK_BITS);
	chunk_blocks = 1ull << in->chunk_bits;
	chunk_size = chunk_blocks * BLK;
	wi->nr_chunks = DIV_ROUND_UP(in->size, chunk_size);
	for (uint64_t k = 0; k < wi->nr_chunks; k++) {
		const struct meta_chunk *c = &in->chunks[k];
		uint64_t left = in->size - k * chunk_size;
		uint64_t blocks = MIN(chunk_blocks, DIV_ROUND_UP(left, BLK));

		if (c->blkaddr == META_CHUNK_HOLE)
			continue;
		if (c->device_id == 0 || c->device_id > o->nr_devices)
			return wr_fail(w, wi, -EINVAL,
				       "chunk %llu has device_id %u, not in 1..%u",
				       (unsigned long long)k, c->device_id,
				       o->nr_devices);
		if (c->blkaddr + blocks > o->devices[c->device_id - 1].blocks)
			return wr_fail(w, wi, -EINVAL,
				       "chunk %llu (blocks %u+%llu) ends past device %u (%u blocks)",
				       (unsigned long long)k, c->blkaddr,
				       (unsigned long long)blocks, c->device_id,
				       o->devices[c->device_id - 1].blocks);
	}
	wi->kind = KIND_CHUNKED;
	wi->layout = EROFS_INODE_CHUNK_BASED;
	wi->i_u = EROFS_CHUNK_FORMAT_INDEXES | in->chunk_bits;
	w->chunked = true;
	return 0;
}

/*
 * Extents in order from lcluster 0, each a valid pcluster of the data.
 * Compact indexes need the pclusters back to back (erofs_fs.h).
 */
static int wr_check_zextents(struct writer *w, struct wr_inode *wi)
{
	const struct meta_inode *in = wi->inode;
	uint64_t nr_lcl = DIV_ROUND_UP(in->size, BLK);

	if (in->zalgorithm > META_Z_ZSTD)
		return wr_fail(w, wi, -EINVAL, "compression algorithm %u",
			       in->zalgorithm);
	for (uint32_t k = 0; k < in->nr_zextents; k++) {
		const struct meta_zextent *z = &in->zextents[k];
		uint64_t end = k + 1 < in->nr_zextents ? z[1].lcn : nr_lcl;

		/* A compressed extent needs a second lcluster for its CBLKCNT. */
		if ((k ? z->lcn <= z[-1].lcn : z->lcn != 0) || end <= z->lcn ||
		    end - z->lcn > META_ZPACK_EXTENT_MAX / BLK || !z->blocks ||
		    z->blocks > Z_EROFS_PCLUSTER_MAX_BLOCKS ||
		    (z->plain ? end - z->lcn != 1 || z->blocks != 1 :
				end - z->lcn < 2) ||
		    (uint64_t)z->blkaddr + z->blocks > w->opts->embedded->blocks)
			return wr_fail(w, wi, -EINVAL,
				       "compressed extent %u (lcluster %u, block %u) is out of order or range",
				       k, z->lcn, z->blkaddr);
		w->max_pclusterblks = MAX(w->max_pclusterblks, z->blocks);
		wi->zblocks += z->blocks;
	}
	if (!in->nr_zextents || !in->size)
		return wr_fail(w, wi, -EINVAL, "compressed without extents");
	wi->layout = EROFS_INODE_COMPRESSED_COMPACT;
	for (uint32_t k = 1; k < in->nr_zextents; k++)
		if (in->zextents[k].blkaddr !=
		    in->zextents[k - 1].blkaddr + in->zextents[k - 1].blocks)
			wi->layout = EROFS_INODE_COMPRESSED_FULL;
	w->zalgs |= (uint16_t)(1u << in->zalgorithm);
	wi->compressed = true;
	w->compressed = true;
	return 0;
}

static int wr_check_embedded(struct writer *w, struct wr_inode *wi)
{
	const struct meta_inode *in = wi->inode;
	const struct meta_embedded *e = w->opts->embedded;
	uint64_t blocks = DIV_ROUND_UP(in->size, BLK);

	if (in->data || in->chunks)
		return wr_fail(w, wi, -EINVAL,
			       "has embedded data and inline data or chunks");
	if (!e || (!in->zextents &&
		   (uint64_t)in->embedded_blkaddr + blocks > e->blocks))
		return wr_fail(w, wi, -EINVAL,
			       "embedded blocks %u+%llu outside the %u given",
			       in->embedded_blkaddr, (unsigned long long)blocks,
			       e ? e->blocks : 0);
	wi->embedded = true;
	return in->zextents ? wr_check_zextents(w, wi) : 0;
}

static int wr_check_fragment(struct writer *w, struct wr_inode *wi)
{
	const struct meta_inode *in = wi->inode, *packed = w->opts->packed;

	if (in->data || in->chunks || in->embedded || !in->size)
		return wr_fail(w, wi, -EINVAL,
			       "a fragment of %llu bytes with data, chunks or embedded blocks",
			       (unsigned long long)in->size);
	if (!packed)
		return wr_fail(w, wi, -EINVAL, "a fragment but no packed inode");
	if (in->fragment_off > packed->size ||
	    in->size > packed->size - in->fragment_off ||
	    in->fragment_off >= Z_EROFS_FRAGMENT_INODE)
		return wr_fail(w, wi, -EINVAL,
			       "fragment %llu+%llu outside the packed inode's %llu bytes",
			       (unsigned long long)in->fragment_off,
			       (unsigned long long)in->size,
			       (unsigned long long)packed->size);
	wi->fragment = true;
	w->fragments = true;
	return 0;
}

static int wr_classify(struct writer *w, struct wr_inode *wi)
{
	const struct meta_inode *in = wi->inode;
	uint32_t type = in->mode & S_IFMT;

	if (in->mtime_nsec >= 1000000000u)
		return wr_fail(w, wi, -EINVAL, "mtime_nsec %u out of range",
			       in->mtime_nsec);
	if (type != S_IFREG && in->chunks)
		return wr_fail(w, wi, -EINVAL, "chunks on a non-regular file");
	if (type != S_IFREG && type != S_IFLNK && in->data)
		return wr_fail(w, wi, -EINVAL, "data on a file without contents");
	wi->kind = KIND_FLAT;
	switch (type) {
	case S_IFDIR:
		return dir_blocks(w, wi, NULL);
	case S_IFREG:
		if (in->size > INT64_MAX)
			return wr_fail(w, wi, -EINVAL, "size %llu too large",
				       (unsigned long long)in->size);
		wi->size = in->size;
		if (in->fragment)
			return wr_check_fragment(w, wi);
		if (in->embedded)
			return wr_check_embedded(w, wi);
		if (in->chunks)
			return wr_check_chunks(w, wi);
		if (in->size && !in->data)
			return wr_fail(w, wi, -EINVAL,
				       "%llu bytes but neither data nor chunks",
				       (unsigned long long)in->size);
		return 0;
	case S_IFLNK:
		if (!in->size || in->size > META_SYMLINK_MAX || !in->data)
			return wr_fail(w, wi, -EINVAL,
				       "symlink target of %llu bytes%s",
				       (unsigned long long)in->size,
				       in->data ? "" : " without data");
		wi->size = in->size;
		return 0;
	case S_IFCHR:
	case S_IFBLK:
		/* new_encode_dev() keeps 12 bits of major, 20 of minor. */
		if (in->rdev_major > 0xfff || in->rdev_minor > 0xfffff)
			return wr_fail(w, wi, -EINVAL,
				       "device %u:%u does not fit 12:20 bits",
				       in->rdev_major, in->rdev_minor);
		wi->i_u = erofs_encode_rdev(in->rdev_major, in->rdev_minor);
		wi->kind = KIND_SPECIAL;
		return 0;
	case S_IFIFO:
	case S_IFSOCK:
		wi->kind = KIND_SPECIAL;
		return 0;
	default:
		return wr_fail(w, wi, -EINVAL, "unknown file type 0%o", type);
	}
}

/* ------------------------------------------------------------------ */
/* Timestamps and inode versions                                        */
/* ------------------------------------------------------------------ */

struct wr_mtime {
	int64_t sec;
	uint32_t nsec;
};

static int mtime_cmp(const void *a, const void *b)
{
	const struct wr_mtime *x = a, *y = b;

	if (x->sec != y->sec)
		return x->sec < y->sec ? -1 : 1;
	return x->nsec < y->nsec ? -1 : x->nsec > y->nsec;
}

/* The most common non-negative (mtime, nsec) becomes the compact epoch. */
static int wr_pick_epoch(struct writer *w)
{
	struct wr_mtime *t = malloc(w->nr_inodes * sizeof(*t));
	size_t n = 0, best = 0;

	if (!t)
		return -ENOMEM;
	for (uint32_t i = 0; i < w->nr_inodes; i++) {
		const struct meta_inode *in = w->inodes[i].inode;

		if (in->mtime >= 0)
			t[n++] = (struct wr_mtime){ in->mtime, in->mtime_nsec };
	}
	qsort(t, n, sizeof(*t), mtime_cmp);
	for (size_t a = 0, b; a < n; a = b) {
		for (b = a + 1; b < n && !mtime_cmp(&t[a], &t[b]); b++)
			;
		if (b - a > best) {
			best = b - a;
			w->epoch = (uint64_t)t[a].sec;
			w->fixed_nsec = t[a].nsec;
		}
	}
	free(t);

	for (uint32_t i = 0; i < w->nr_inodes; i++) {
		struct wr_inode *wi = &w->inodes[i];
		const struct meta_inode *in = wi->inode;

		wi->extended = in->uid > UINT16_MAX || in->gid > UINT16_MAX ||
			       wi->size > UINT32_MAX || wi->nlink > UINT16_MAX ||
			       in->mtime < 0 ||
			       (uint64_t)in->mtime != w->epoch ||
			       in->mtime_nsec != w->fixed_nsec;
	}
	return 0;
}

/* ------------------------------------------------------------------ */
/* Placement                                                            */
/* ------------------------------------------------------------------ */

static uint32_t inode_isize(const struct wr_inode *wi)
{
	return wi->extended ? EROFS_INODE_EXTENDED_SIZE :
			      EROFS_INODE_COMPACT_SIZE;
}

/* Where the chunk indexes start, relative to the inode (8-aligned). */
static uint32_t chunk_table_off(const struct wr_inode *wi)
{
	return ROUND_UP(inode_isize(wi) + wi->xattr_size, 8u);
}

/* Where a compressed file's map header starts, relative to the inode. */
static uint32_t zmap_off(const struct wr_inode *wi)
{
	return ROUND_UP(inode_isize(wi) + wi->xattr_size, 8u);
}

/* Bytes of a compressed file's map header and indexes, the inode at @pos. */
static uint64_t zmap_size(const struct wr_inode *wi, uint64_t pos)
{
	uint64_t nr = DIV_ROUND_UP(wi->size, BLK);
	uint64_t ebase = pos + zmap_off(wi) + Z_EROFS_MAP_HEADER_SIZE;

	if (wi->layout == EROFS_INODE_COMPRESSED_COMPACT)
		return Z_EROFS_MAP_HEADER_SIZE + z_erofs_compact_size(ebase, nr);
	return Z_EROFS_MAP_HEADER_SIZE + Z_EROFS_FULL_INDEX_PAD +
	       nr * Z_EROFS_LCLUSTER_INDEX_SIZE;
}

static int wr_place(struct writer *w)
{
	const struct meta_write_opts *o = w->opts;
	uint64_t pos, blk, end;

	if (o->packed && !w->fragments) {
		ferry_err("meta: a packed inode but no fragment in it");
		return -EINVAL;
	}
	/* COMPR_CFGS records follow the superblock (standalone images have
	 * no device table there). */
	if (w->zalgs & (1u << META_Z_LZ4))
		w->zcfgs_size += ROUND_UP(2u + Z_EROFS_LZ4_CFGS_SIZE, 4u);
	if (w->zalgs & (1u << META_Z_LZMA))
		w->zcfgs_size += ROUND_UP(2u + Z_EROFS_LZMA_CFGS_SIZE, 4u);
	if (w->zalgs & (1u << META_Z_DEFLATE))
		w->zcfgs_size += ROUND_UP(2u + Z_EROFS_DEFLATE_CFGS_SIZE, 4u);
	if (w->zalgs & (1u << META_Z_ZSTD))
		w->zcfgs_size += ROUND_UP(2u + Z_EROFS_ZSTD_CFGS_SIZE, 4u);
	if (w->zcfgs_size && o->nr_devices) {
		ferry_err("meta: compressed files and a device table together");
		return -EINVAL;
	}
	pos = ROUND_UP(DEVT_OFFSET + (uint64_t)o->nr_devices * EROFS_DEVT_SLOT_SIZE +
		       w->zcfgs_size, (uint64_t)EROFS_SLOT_SIZE);

	for (uint32_t i = 0; i < w->nr_inodes; i++) {
		struct wr_inode *wi = &w->inodes[i];
		uint32_t body = inode_isize(wi) + wi->xattr_size;
		uint64_t meta = body;

		/* Keep each inode inside one block (an extended one at 4064). */
		if (pos % BLK + inode_isize(wi) > BLK)
			pos = ROUND_UP(pos, BLK);
		if (wi->kind == KIND_CHUNKED) {
			meta = chunk_table_off(wi) +
			       wi->nr_chunks * EROFS_CHUNK_INDEX_SIZE;
		} else if (wi->compressed) {
			meta = zmap_off(wi) + zmap_size(wi, pos);
		} else if (wi->fragment) {
			/* The header and the pad of full indexes, as mkfs.erofs. */
			wi->layout = EROFS_INODE_COMPRESSED_FULL;
			meta = zmap_off(wi) + Z_EROFS_MAP_HEADER_SIZE +
			       Z_EROFS_FULL_INDEX_PAD;
		} else if (wi->kind == KIND_FLAT && wi->embedded) {
			wi->layout = EROFS_INODE_FLAT_PLAIN;
		} else if (wi->kind == KIND_FLAT) {
			uint32_t tail = (uint32_t)(wi->size % BLK);

			if (tail && body + tail <= BLK) {
				if (pos % BLK + body + tail > BLK)
					pos = ROUND_UP(pos, BLK);
				wi->layout = EROFS_INODE_FLAT_INLINE;
				wi->tail = tail;
				meta += tail;
			} else {
				wi->layout = EROFS_INODE_FLAT_PLAIN;
			}
			wi->nr_blocks = DIV_ROUND_UP(wi->size - wi->tail, BLK);
		}
		wi->pos = pos;
		pos = ROUND_UP(pos + meta, (uint64_t)EROFS_SLOT_SIZE);
		if (pos > (uint64_t)UINT32_MAX * BLK)
			return wr_fail(w, wi, -EFBIG, "inode area exceeds 2^32 blocks");
	}
	/* The root comes first, within META_MAX_DEVICES slots + 1 block: nid < 2^16. */
	blk = DIV_ROUND_UP(pos, BLK);
	if (w->shared_bytes) {
		w->xattr_blkaddr = (uint32_t)blk;
		blk += DIV_ROUND_UP(w->shared_bytes, BLK);
	}
	w->data_blkaddr = (uint32_t)blk;
	for (uint32_t i = 0; i < w->nr_inodes; i++) {
		struct wr_inode *wi = &w->inodes[i];

		if (wi->kind != KIND_FLAT)
			continue;
		if (blk + wi->nr_blocks > UINT32_MAX)
			return wr_fail(w, wi, -EFBIG, "data area exceeds 2^32 blocks");
		wi->i_u = wi->nr_blocks ? (uint32_t)blk : EROFS_NULL_ADDR;
		blk += wi->nr_blocks;
	}
	w->embed_blkaddr = (uint32_t)blk;
	if (o->embedded)
		blk += o->embedded->blocks;
	if (blk > UINT32_MAX) {
		ferry_err("meta: embedded data ends past 2^32 blocks");
		return -EFBIG;
	}
	for (uint32_t i = 0; i < w->nr_inodes; i++) {
		struct wr_inode *wi = &w->inodes[i];

		if (wi->compressed)
			wi->i_u = wi->zblocks;
		else if (wi->embedded)
			wi->i_u = wi->size ? w->embed_blkaddr +
					     wi->inode->embedded_blkaddr :
					     EROFS_NULL_ADDR;
	}
	w->ext_blkaddr = (uint32_t)blk;
	end = blk + DIV_ROUND_UP((uint64_t)o->ext_len + o->sections_len, BLK);
	/* Devices follow in the unified address space (flat images). */
	for (uint32_t d = 0; d < o->nr_devices; d++)
		end += o->devices[d].blocks;
	if (end > UINT32_MAX) {
		ferry_err("meta: image plus devices need %llu blocks, more than 2^32",
			  (unsigned long long)end);
		return -EFBIG;
	}
	w->total_blocks = (uint32_t)(blk + DIV_ROUND_UP((uint64_t)o->ext_len +
						       o->sections_len, BLK));
	return 0;
}

/* ------------------------------------------------------------------ */
/* Rendering the metadata area                                          */
/* ------------------------------------------------------------------ */

static void put_inode_header(const struct writer *w, const struct wr_inode *wi,
			     uint8_t *p)
{
	const struct meta_inode *in = wi->inode;
	uint16_t icount = wi->xattr_size ?
		(uint16_t)((wi->xattr_size - EROFS_XATTR_IBODY_HEADER_SIZE) / 4 + 1) : 0;
	uint32_t ino = (uint32_t)(in->order + 1);

	put_le16(p + EROFS_I_FORMAT,
		 (uint16_t)((wi->extended ? EROFS_I_VERSION_EXTENDED :
					    EROFS_I_VERSION_COMPACT) |
			    wi->layout << EROFS_I_DATALAYOUT_SHIFT));
	put_le16(p + EROFS_I_XATTR_ICOUNT, icount);
	put_le16(p + EROFS_I_MODE, (uint16_t)in->mode);
	put_le32(p + EROFS_I_U, wi->i_u);
	put_le32(p + EROFS_I_INO, ino);
	if (!wi->extended) {
		put_le16(p + EROFS_IC_NLINK, (uint16_t)wi->nlink);
		put_le32(p + EROFS_IC_SIZE, (uint32_t)wi->size);
		put_le16(p + EROFS_IC_UID, (uint16_t)in->uid);
		put_le16(p + EROFS_IC_GID, (uint16_t)in->gid);
		return;
	}
	put_le64(p + EROFS_IE_SIZE, wi->size);
	put_le32(p + EROFS_IE_UID, in->uid);
	put_le32(p + EROFS_IE_GID, in->gid);
	put_le64(p + EROFS_IE_MTIME, (uint64_t)in->mtime);
	put_le32(p + EROFS_IE_MTIME_NSEC, in->mtime_nsec);
	put_le32(p + EROFS_IE_NLINK, wi->nlink);
}

static void put_inode_xattrs(const struct writer *w, const struct wr_inode *wi,
			     uint8_t *p)
{
	const struct wr_xattr *x = &w->xattrs[wi->xattrs];
	uint8_t *ids = p + EROFS_XATTR_IBODY_HEADER_SIZE;
	uint8_t *e = ids + 4u * wi->nr_shared;

	/* h_name_filter stays 0: COMPAT_XATTR_FILTER is not set. */
	p[4] = wi->nr_shared;
	for (uint32_t k = 0; k < wi->inode->nr_xattrs; k++) {
		if (x[k].shared) {
			put_le32(ids, x[k].shared_id);
			ids += 4;
		} else {
			e += xattr_put_entry(e, &x[k]);
		}
	}
}

static void put_chunk_indexes(const struct wr_inode *wi, uint8_t *p)
{
	const struct meta_chunk *c = wi->inode->chunks;

	for (uint64_t k = 0; k < wi->nr_chunks; k++, p += EROFS_CHUNK_INDEX_SIZE) {
		bool hole = c[k].blkaddr == META_CHUNK_HOLE;

		put_le16(p + EROFS_CHUNK_INDEX_DEVICE_ID, hole ? 0 : c[k].device_id);
		put_le32(p + EROFS_CHUNK_INDEX_STARTBLK, c[k].blkaddr);
	}
}

/* Delta[0] and delta[1] fit in 11 bits: bit 11 marks CBLKCNT. */
_Static_assert(META_ZPACK_EXTENT_MAX / BLK < Z_EROFS_LI_D0_CBLKCNT &&
		       Z_EROFS_PCLUSTER_MAX_BLOCKS < Z_EROFS_LI_D0_CBLKCNT,
	       "lcluster deltas and CBLKCNT overflow 11 bits");

/* Set entry @i of the compact pack at @pack to @type and @lo. */
static void put_zcompact(uint8_t *pack, const struct z_erofs_cpack *pk,
			 uint32_t i, uint16_t type, uint16_t lo)
{
	uint32_t bit = pk->bits * i;
	uint8_t *q = pack + bit / 8;

	/* The le32 stays in the pack (the last entries' may cover some of
	 * the block address, adding no bits to it). */
	put_le32(q, get_le32(q) |
		    (uint32_t)(type << Z_EROFS_COMPACT_LOBITS | lo) << bit % 8);
}

/*
 * Map header (big pclusters, 4 KiB lclusters) and the index of each
 * lcluster: an extent's head names its pcluster, its first NONHEAD counts
 * the pcluster's blocks, the others say how far back the head is and how
 * far on the next one. Full indexes say all of it; compact ones
 * (erofs_fs.h) say the head's block once per pack, which is right as
 * pclusters follow each other (wr_check_zextents), and only delta[1] in
 * a pack's last entry.
 */
static void put_zmap(const struct writer *w, const struct wr_inode *wi,
		     uint8_t *p)
{
	const struct meta_inode *in = wi->inode;
	bool compact = wi->layout == EROFS_INODE_COMPRESSED_COMPACT;
	uint64_t ebase = wi->pos + zmap_off(wi) + Z_EROFS_MAP_HEADER_SIZE;
	uint32_t nr_lcl = (uint32_t)DIV_ROUND_UP(wi->size, BLK);
	uint8_t *idx = p + Z_EROFS_MAP_HEADER_SIZE;

	put_le16(p + Z_EROFS_MAP_H_ADVISE,
		 Z_EROFS_ADVISE_BIG_PCLUSTER_1 | Z_EROFS_ADVISE_BIG_PCLUSTER_2 |
		 (compact ? Z_EROFS_ADVISE_COMPACTED_2B : 0));
	p[Z_EROFS_MAP_H_ALGORITHMTYPE] = in->zalgorithm;
	if (!compact)
		idx += Z_EROFS_FULL_INDEX_PAD;
	for (uint32_t k = 0; k < in->nr_zextents; k++) {
		const struct meta_zextent *z = &in->zextents[k];
		uint32_t end = k + 1 < in->nr_zextents ? z[1].lcn : nr_lcl;
		uint32_t blkaddr = w->embed_blkaddr + z->blkaddr;

		for (uint32_t l = z->lcn; l < end; l++) {
			uint16_t type = Z_EROFS_LCLUSTER_TYPE_NONHEAD;
			uint16_t lo = (uint16_t)(l - z->lcn); /* delta[0] */
			struct z_erofs_cpack pk;
			uint8_t *d;

			if (l == z->lcn) /* clusterofs 0 */
				type = z->plain ? Z_EROFS_LCLUSTER_TYPE_PLAIN :
						  Z_EROFS_LCLUSTER_TYPE_HEAD1;
			else if (l == z->lcn + 1)
				lo = (uint16_t)(Z_EROFS_LI_D0_CBLKCNT | z->blocks);
			if (!compact) {
				d = idx + (size_t)l * Z_EROFS_LCLUSTER_INDEX_SIZE;
				put_le16(d + Z_EROFS_LI_ADVISE, type);
				if (type == Z_EROFS_LCLUSTER_TYPE_NONHEAD) {
					put_le16(d + Z_EROFS_LI_DELTA0, lo);
					put_le16(d + Z_EROFS_LI_DELTA1, (uint16_t)(end - l));
				} else {
					put_le32(d + Z_EROFS_LI_BLKADDR, blkaddr);
				}
				continue;
			}
			pk = z_erofs_compact_pack(ebase, nr_lcl, l);
			d = idx + pk.off;
			/*
			 * The pack's block address: this pcluster's when the
			 * decoder counts it in the pack (from its head or
			 * CBLKCNT there), else the next one's.
			 */
			if (l == pk.first)
				put_le32(d + pk.size - 4,
					 l <= z->lcn + 1 ? blkaddr : blkaddr + z->blocks);
			if (type == Z_EROFS_LCLUSTER_TYPE_NONHEAD &&
			    l - pk.first + 1 == pk.vcnt &&
			    !(lo & Z_EROFS_LI_D0_CBLKCNT))
				lo = (uint16_t)(end - l); /* delta[1] */
			put_zcompact(d, &pk, (uint32_t)(l - pk.first), type, lo);
		}
	}
}

static int dir_tail_fn(struct writer *w, struct wr_inode *wi, uint64_t blk,
		       size_t first, size_t count, uint32_t used)
{
	if (blk != wi->nr_blocks)
		return 0;
	dir_render(w, wi, first, count);
	memcpy(w->meta + wi->pos + inode_isize(wi) + wi->xattr_size, w->block,
	       used);
	return 0;
}

static void put_super(const struct writer *w, uint8_t *sb)
{
	const struct meta_write_opts *o = w->opts;
	const char *name = o->volume_name ? o->volume_name : "ferry";
	uint32_t incompat = 0;

	if (w->chunked)
		incompat |= EROFS_FEATURE_INCOMPAT_CHUNKED_FILE;
	if (w->compressed)
		incompat |= EROFS_FEATURE_INCOMPAT_ZERO_PADDING |
			    EROFS_FEATURE_INCOMPAT_COMPR_CFGS;
	if (o->nr_devices)
		incompat |= EROFS_FEATURE_INCOMPAT_DEVICE_TABLE;
	/* Without a fragment the packed inode would only cost a lookup. */
	if (w->fragments) {
		incompat |= EROFS_FEATURE_INCOMPAT_FRAGMENTS;
		/* wr_collect added it last. */
		put_le64(sb + EROFS_SB_PACKED_NID,
			 w->inodes[w->nr_inodes - 1].pos / EROFS_SLOT_SIZE);
	}
	put_le32(sb + EROFS_SB_MAGIC, EROFS_SUPER_MAGIC);
	put_le32(sb + EROFS_SB_FEATURE_COMPAT,
		 EROFS_FEATURE_COMPAT_SB_CHKSUM | EROFS_FEATURE_COMPAT_MTIME);
	sb[EROFS_SB_BLKSZBITS] = EROFS_BLKSIZ_BITS;
	put_le16(sb + EROFS_SB_ROOT_NID,
		 (uint16_t)(w->inodes[0].pos / EROFS_SLOT_SIZE));
	put_le64(sb + EROFS_SB_INOS, w->nr_inodes);
	put_le64(sb + EROFS_SB_EPOCH, w->epoch);
	put_le32(sb + EROFS_SB_FIXED_NSEC, w->fixed_nsec);
	put_le32(sb + EROFS_SB_BLOCKS, w->total_blocks);
	put_le32(sb + EROFS_SB_XATTR_BLKADDR, w->xattr_blkaddr);
	memcpy(sb + EROFS_SB_VOLUME_NAME, name, strlen(name));
	put_le32(sb + EROFS_SB_FEATURE_INCOMPAT, incompat);
	put_le16(sb + EROFS_SB_EXTRA_DEVICES, (uint16_t)o->nr_devices);
	put_le16(sb + EROFS_SB_DEVT_SLOTOFF, o->nr_devices ? DEVT_SLOTOFF : 0);
	put_le16(sb + EROFS_SB_U1, w->zalgs);
}

/* One COMPR_CFGS record per algorithm used, ascending, each 4-aligned. */
static void put_zcfgs(const struct writer *w, uint8_t *p)
{
	if (w->zalgs & (1u << META_Z_LZ4)) {
		put_le16(p, Z_EROFS_LZ4_CFGS_SIZE);
		put_le16(p + 2 + Z_EROFS_LZ4_CFGS_MAX_PCLUSTERBLKS, w->max_pclusterblks);
		p += ROUND_UP(2u + Z_EROFS_LZ4_CFGS_SIZE, 4u);
	}
	if (w->zalgs & (1u << META_Z_LZMA)) {
		/* The dictionary of one extent's stream (format 0: MicroLZMA). */
		put_le16(p, Z_EROFS_LZMA_CFGS_SIZE);
		put_le32(p + 2 + Z_EROFS_LZMA_CFGS_DICT_SIZE, META_ZPACK_EXTENT_MAX);
		p += ROUND_UP(2u + Z_EROFS_LZMA_CFGS_SIZE, 4u);
	}
	if (w->zalgs & (1u << META_Z_DEFLATE)) {
		put_le16(p, Z_EROFS_DEFLATE_CFGS_SIZE);
		p[2 + Z_EROFS_DEFLATE_CFGS_WINDOWBITS] = 15;
		p += ROUND_UP(2u + Z_EROFS_DEFLATE_CFGS_SIZE, 4u);
	}
	if (w->zalgs & (1u << META_Z_ZSTD)) {
		put_le16(p, Z_EROFS_ZSTD_CFGS_SIZE);
		/* Windows up to 1 MiB: the largest extent wr_check_zextents takes. */
		p[2 + Z_EROFS_ZSTD_CFGS_WINDOWLOG] = 20 - 10;
	}
}

static void put_preamble(const struct writer *w, uint8_t *p)
{
	const struct meta_write_opts *o = w->opts;

	memcpy(p + FERRY_PRE_MAGIC, META_PREAMBLE_MAGIC, 8);
	put_le32(p + FERRY_PRE_VERSION, META_PREAMBLE_VERSION);
	put_le64(p + FERRY_PRE_EXT_OFF, (uint64_t)w->ext_blkaddr * BLK);
	put_le64(p + FERRY_PRE_EXT_LEN, o->ext_len);
	put_le32(p + FERRY_PRE_EXT_CRC, erofs_crc32c(~0u, o->ext, o->ext_len));
	put_le64(p + FERRY_PRE_SEC_LEN, o->sections_len);
	put_le32(p + FERRY_PRE_SEC_CRC,
		 o->sections_len ? erofs_crc32c(~0u, o->sections, o->sections_len) : 0);
	put_le32(p + FERRY_PRE_CRC, erofs_crc32c(~0u, p, FERRY_PRE_CRC));
}

static int wr_render_meta(struct writer *w)
{
	const struct meta_write_opts *o = w->opts;
	int ret;

	w->meta = calloc((size_t)w->data_blkaddr, BLK);
	if (!w->meta)
		return -ENOMEM;
	if (!o->standalone)
		put_preamble(w, w->meta);
	put_super(w, w->meta + EROFS_SUPER_OFFSET);
	put_zcfgs(w, w->meta + DEVT_OFFSET);
	for (uint32_t d = 0; d < o->nr_devices; d++) {
		uint8_t *slot = w->meta + DEVT_OFFSET + d * EROFS_DEVT_SLOT_SIZE;
		uint64_t uniaddr = w->total_blocks;

		for (uint32_t k = 0; k < d; k++)
			uniaddr += o->devices[k].blocks;
		memcpy(slot + EROFS_DEVT_TAG, o->devices[d].tag, EROFS_DEVT_TAG_LEN);
		put_le32(slot + EROFS_DEVT_BLOCKS, o->devices[d].blocks);
		put_le32(slot + EROFS_DEVT_UNIADDR, (uint32_t)uniaddr);
	}
	for (uint32_t i = 0; i < w->nr_inodes; i++) {
		struct wr_inode *wi = &w->inodes[i];
		const struct meta_inode *in = wi->inode;
		uint8_t *p = w->meta + wi->pos;
		uint8_t *tail = p + inode_isize(wi) + wi->xattr_size;

		/* Tell the caller where each inode went. */
		wi->inode->nid = wi->pos / EROFS_SLOT_SIZE;
		put_inode_header(w, wi, p);
		if (wi->xattr_size)
			put_inode_xattrs(w, wi, p + inode_isize(wi));
		if (wi->kind == KIND_CHUNKED)
			put_chunk_indexes(wi, p + chunk_table_off(wi));
		if (wi->compressed)
			put_zmap(w, wi, p + zmap_off(wi));
		if (wi->fragment)
			put_le64(p + zmap_off(wi),
				 in->fragment_off | Z_EROFS_FRAGMENT_INODE);
		if (!wi->tail)
			continue;
		if (S_ISDIR(in->mode)) {
			ret = dir_blocks(w, wi, dir_tail_fn);
			if (ret)
				return ret;
		} else {
			memcpy(tail, in->data + (size_t)wi->nr_blocks * BLK,
			       wi->tail);
		}
	}
	for (uint32_t k = 0; k < w->nr_shared; k++)
		xattr_put_entry(w->meta + (size_t)w->xattr_blkaddr * BLK +
					(size_t)w->shared[k]->shared_id * 4,
				w->shared[k]);
	return 0;
}

/* ------------------------------------------------------------------ */
/* Streaming the data area and the extension region                     */
/* ------------------------------------------------------------------ */

static int stream_flush(struct writer *w)
{
	int ret;

	if (!w->buf_len)
		return 0;
	if (!EVP_DigestUpdate(w->sha, w->buf, w->buf_len))
		return -ENOMEM;
	ret = pwrite_full(w->fd, w->buf, w->buf_len, w->buf_off);
	if (ret) {
		ferry_err("meta: writing bootstrap: %s", ferry_strerror(ret));
		return ret;
	}
	w->buf_off += w->buf_len;
	w->buf_len = 0;
	return 0;
}

/* Append @len bytes of @data (zeros when NULL). */
static int stream_put(struct writer *w, const void *data, uint64_t len)
{
	const uint8_t *p = data;
	int ret;

	while (len) {
		size_t n = (size_t)MIN(len, (uint64_t)(STREAM_BUF - w->buf_len));

		if (p) {
			memcpy(w->buf + w->buf_len, p, n);
			p += n;
		} else {
			memset(w->buf + w->buf_len, 0, n);
		}
		w->buf_len += n;
		len -= n;
		if (w->buf_len == STREAM_BUF) {
			ret = stream_flush(w);
			if (ret)
				return ret;
		}
	}
	return 0;
}

static int dir_data_fn(struct writer *w, struct wr_inode *wi, uint64_t blk,
		       size_t first, size_t count, uint32_t used)
{
	if (blk >= wi->nr_blocks)
		return 0;
	dir_render(w, wi, first, count);
	return stream_put(w, w->block, BLK);
}

/*
 * Copy the embedded data in. Its bytes join the uuid hash only when the
 * caller gave no uuid.
 */
static int stream_embedded(struct writer *w)
{
	const struct meta_embedded *e = w->opts->embedded;
	uint64_t off = 0, len = (uint64_t)e->blocks * BLK;
	int ret = stream_flush(w);

	while (!ret && off < len) {
		size_t n = (size_t)MIN(len - off, (uint64_t)STREAM_BUF);
		ssize_t got = pread(e->fd, w->buf, n, (off_t)off);

		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0) {
			/* A short data file reads as zeros (its sparse tail). */
			if (got < 0) {
				ret = -errno;
				ferry_err("meta: reading embedded data: %s",
					  ferry_strerror(ret));
				break;
			}
			memset(w->buf, 0, n);
			got = (ssize_t)n;
		}
		if (!w->opts->uuid && !EVP_DigestUpdate(w->sha, w->buf, (size_t)got))
			ret = -ENOMEM;
		if (!ret)
			ret = pwrite_full(w->fd, w->buf, (size_t)got, w->buf_off);
		if (ret) {
			ferry_err("meta: writing the image: %s", ferry_strerror(ret));
			break;
		}
		off += (uint64_t)got;
		w->buf_off += (uint64_t)got;
	}
	return ret;
}

static int wr_stream(struct writer *w)
{
	const struct meta_write_opts *o = w->opts;
	uint64_t ext_bytes = (uint64_t)o->ext_len + o->sections_len;
	uint64_t ext_pad = ROUND_UP(ext_bytes, BLK) - ext_bytes;
	int ret = 0;

	w->buf = malloc(STREAM_BUF);
	if (!w->buf)
		return -ENOMEM;
	w->buf_off = (uint64_t)w->data_blkaddr * BLK;
	for (uint32_t i = 0; !ret && i < w->nr_inodes; i++) {
		struct wr_inode *wi = &w->inodes[i];
		uint64_t bytes = (uint64_t)wi->nr_blocks * BLK;

		if (!wi->nr_blocks)
			continue;
		if (S_ISDIR(wi->inode->mode)) {
			ret = dir_blocks(w, wi, dir_data_fn);
		} else {
			uint64_t len = MIN(wi->size, bytes);

			ret = stream_put(w, wi->inode->data, len);
			if (!ret)
				ret = stream_put(w, NULL, bytes - len);
		}
	}
	if (!ret && o->embedded)
		ret = stream_embedded(w);
	if (!ret && o->ext_len)
		ret = stream_put(w, o->ext, o->ext_len);
	if (!ret && o->sections_len)
		ret = stream_put(w, o->sections, o->sections_len);
	if (!ret)
		ret = stream_put(w, NULL, ext_pad);
	if (!ret)
		ret = stream_flush(w);
	return ret;
}

/* ------------------------------------------------------------------ */
/* Entry point                                                          */
/* ------------------------------------------------------------------ */

static int wr_check_opts(const struct meta_write_opts *o)
{
	if (o->nr_devices > META_MAX_DEVICES) {
		ferry_err("meta: %u devices, at most %u", o->nr_devices,
			  META_MAX_DEVICES);
		return -EINVAL;
	}
	if (o->nr_devices && !o->devices) {
		ferry_err("meta: %u devices but no device table", o->nr_devices);
		return -EINVAL;
	}
	if (o->standalone && (o->ext || o->ext_len || o->sections_len)) {
		ferry_err("meta: a standalone image carries no extension payload");
		return -EINVAL;
	}
	if ((o->ext_len && !o->ext) || (o->sections_len && !o->sections)) {
		ferry_err("meta: extension payload of %zu bytes or section area of %zu is NULL",
			  o->ext_len, o->sections_len);
		return -EINVAL;
	}
	if (o->volume_name && strlen(o->volume_name) > 15) {
		ferry_err("meta: volume name \"%s\" longer than 15 bytes",
			  o->volume_name);
		return -EINVAL;
	}
	return 0;
}

/* The uuid hashes the image with uuid and checksum still zero. */
static int wr_finish(struct writer *w)
{
	uint8_t *sb = w->meta + EROFS_SUPER_OFFSET;
	uint8_t digest[EVP_MAX_MD_SIZE];
	uint64_t size = (uint64_t)w->total_blocks * BLK;
	int ret;

	if (!EVP_DigestFinal_ex(w->sha, digest, NULL))
		return -ENOMEM;
	digest[6] = (uint8_t)((digest[6] & 0x0f) | 0x80); /* version 8 */
	digest[8] = (uint8_t)((digest[8] & 0x3f) | 0x80); /* RFC variant */
	memcpy(sb + EROFS_SB_UUID, w->opts->uuid ? w->opts->uuid : digest, 16);
	put_le32(sb + EROFS_SB_CHECKSUM,
		 erofs_crc32c(~0u, sb, BLK - EROFS_SUPER_OFFSET));
	ret = pwrite_full(w->fd, w->meta, (size_t)w->data_blkaddr * BLK, 0);
	if (!ret && ftruncate(w->fd, (off_t)size) < 0)
		ret = -errno;
	if (ret)
		ferry_err("meta: writing bootstrap: %s", ferry_strerror(ret));
	return ret;
}

static int wr_make_dots(struct writer *w)
{
	w->dot = calloc(1, sizeof(*w->dot) + 2);
	w->dotdot = calloc(1, sizeof(*w->dotdot) + 3);
	if (!w->dot || !w->dotdot)
		return -ENOMEM;
	w->dot->name_len = 1;
	memcpy(w->dot->name, ".", 2);
	w->dotdot->name_len = 2;
	memcpy(w->dotdot->name, "..", 3);
	return 0;
}

int meta_write(struct meta_tree *t, const struct meta_write_opts *opts, int fd,
	       struct meta_write_stats *stats)
{
	static const struct meta_write_opts no_opts;
	struct writer *w;
	int ret;

	if (!opts)
		opts = &no_opts;
	ret = wr_check_opts(opts);
	if (ret)
		return ret;
	w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	w->opts = opts;
	w->fd = fd;
	ret = wr_make_dots(w);
	if (!ret)
		ret = wr_collect(w, t);
	for (uint32_t i = 0; !ret && i < w->nr_inodes; i++)
		ret = wr_classify(w, &w->inodes[i]);
	if (!ret)
		ret = wr_xattrs(w);
	if (!ret)
		ret = wr_pick_epoch(w);
	if (!ret)
		ret = wr_place(w);
	if (!ret)
		ret = wr_render_meta(w);
	if (!ret) {
		w->sha = EVP_MD_CTX_new();
		if (!w->sha || !EVP_DigestInit_ex(w->sha, EVP_sha256(), NULL) ||
		    !EVP_DigestUpdate(w->sha, w->meta,
				      (size_t)w->data_blkaddr * BLK))
			ret = -ENOMEM;
	}
	if (!ret)
		ret = wr_stream(w);
	if (!ret)
		ret = wr_finish(w);
	if (!ret && stats) {
		memset(stats, 0, sizeof(*stats));
		stats->bytes = (uint64_t)w->total_blocks * BLK;
		stats->inodes = w->nr_inodes;
		for (uint32_t i = 0; i < w->nr_inodes; i++)
			stats->extended_inodes += w->inodes[i].extended;
		stats->compact_inodes = w->nr_inodes - stats->extended_inodes;
		stats->shared_xattrs = w->nr_shared;
		stats->embedded_blkaddr = w->embed_blkaddr;
	}

	for (uint32_t i = 0; i < w->nr_inodes; i++)
		w->inodes[i].inode->wpriv = NULL;
	EVP_MD_CTX_free(w->sha);
	free(w->buf);
	free(w->meta);
	free(w->shared);
	free(w->xattrs);
	free(w->ents);
	free(w->inodes);
	free(w->dot);
	free(w->dotdot);
	free(w);
	return ret;
}
