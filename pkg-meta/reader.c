// SPDX-License-Identifier: MIT
/*
 * Bootstrap reader. Bootstraps come from registries, so nothing on disk is
 * trusted: the superblock, device table and ferry preamble are checked at
 * open, and each inode, directory block, xattr entry and chunk index every
 * time it is touched, with the rules of the Linux fs/erofs reader (plus a
 * few stricter ones ferry's writer never violates). The image is one flat
 * read-only buffer, so lookups need neither allocation nor a cache and the
 * image can be shared by threads.
 */
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../pkg-base/base.h"
#include "internal.h"
#include "meta.h"

_Static_assert(META_SYMLINK_MAX < EROFS_BLKSIZ, "a symlink's target fits one block");
/* meta_stat.chunk_size is 32 bits: chunks up to 2 GiB. */
#define CHUNK_BITS_MAX 19

struct meta_image {
	const uint8_t *buf;
	size_t len;          /* bytes at buf: metadata is read within them */
	uint64_t data_len;   /* the image's bytes: data blocks lie within them */
	bool mapped;
	char *name;          /* for log lines */
	uint64_t meta_base;  /* byte offset of NID 0 */
	uint64_t xattr_base; /* byte offset of shared xattr id 0 */
	uint64_t devt_off;   /* byte offset of device slot 0 */
	const uint8_t *ext;
	size_t ext_len;
	bool has_ext;
	const uint8_t *sections; /* the section area after ext, or NULL */
	size_t sections_len;
	uint16_t zalgs;       /* compression algorithms files may use */
	uint64_t packed_nid;  /* FRAGMENTS: the inode holding them */
	uint64_t packed_size; /* its bytes; fragments lie inside */
	bool has_packed;
	struct meta_super sb;
};

/* An inode as decoded (and checked) from the image; lives on the stack. */
struct rinode {
	uint64_t nid;
	uint32_t mode, uid, gid, nlink, ino;
	uint32_t rdev_major, rdev_minor;
	uint64_t size;
	int64_t mtime;
	uint32_t mtime_nsec;
	uint8_t layout;
	bool extended;
	uint32_t startblk;   /* FLAT_*: first data block */
	uint64_t xattr_pos;  /* inline xattr region */
	uint32_t xattr_size;
	uint64_t tail_pos;   /* FLAT_INLINE: data of the last block */
	uint64_t chunk_pos;  /* CHUNK_BASED: index table */
	uint64_t nr_chunks;
	uint8_t chunk_bits;  /* log2 of the chunk size in bytes */
	uint8_t chunk_unit;  /* 8 with indexes, 4 for a plain block map */
	uint32_t zfirst, zend; /* compressed: the blocks its pclusters span */
};

/* A compressed file's pcluster of @blocks at @blk: widen its span. */
static void zspan(struct rinode *ri, uint64_t blk, uint64_t blocks)
{
	ri->zfirst = (uint32_t)MIN((uint64_t)ri->zfirst, blk);
	ri->zend = (uint32_t)MAX((uint64_t)ri->zend, blk + blocks);
}

static void log_corrupt(const struct meta_image *img, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void log_corrupt(const struct meta_image *img, const char *fmt, ...)
{
	char reason[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(reason, sizeof(reason), fmt, ap);
	va_end(ap);
	ferry_err("bootstrap %s: %s", img->name, reason);
}

/*
 * Log "bootstrap NAME: <reason>" and evaluate to -EFSCORRUPTED, visibly to
 * the compiler (a variadic function is never inlined, so its constant
 * return value would be hidden from the callers' flow analysis).
 */
#define corrupt(img, ...) (log_corrupt(img, __VA_ARGS__), -EFSCORRUPTED)

static bool in_image(const struct meta_image *img, uint64_t pos, uint64_t len)
{
	return pos <= img->len && len <= img->len - pos;
}

static unsigned long long ull(uint64_t v)
{
	return (unsigned long long)v;
}

/* ------------------------------------------------------------------ */
/* Open                                                                */
/* ------------------------------------------------------------------ */

/* The superblock crc32c covers the rest of block 0 with the field zeroed. */
static uint32_t super_crc(const uint8_t *sb)
{
	static const uint8_t zero[4];
	uint32_t crc;

	crc = erofs_crc32c(~0u, sb, EROFS_SB_CHECKSUM);
	crc = erofs_crc32c(crc, zero, sizeof(zero));
	return erofs_crc32c(crc, sb + EROFS_SB_CHECKSUM + 4,
			    EROFS_BLKSIZ - EROFS_SUPER_OFFSET - EROFS_SB_CHECKSUM - 4);
}

static int check_super(struct meta_image *img)
{
	const uint8_t *sb = img->buf + EROFS_SUPER_OFFSET;
	struct meta_super *s = &img->sb;
	uint32_t v;

	if (img->len < EROFS_BLKSIZ)
		return corrupt(img, "%zu bytes is smaller than one block",
			       img->len);
	v = get_le32(sb + EROFS_SB_MAGIC);
	if (v != EROFS_SUPER_MAGIC)
		return corrupt(img, "bad superblock magic %#x", v);
	if (sb[EROFS_SB_BLKSZBITS] != EROFS_BLKSIZ_BITS)
		return corrupt(img, "block size 2^%u, only 4096 is supported",
			       sb[EROFS_SB_BLKSZBITS]);
	s->feature_compat = get_le32(sb + EROFS_SB_FEATURE_COMPAT);
	s->feature_incompat = get_le32(sb + EROFS_SB_FEATURE_INCOMPAT);
	if (s->feature_compat & EROFS_FEATURE_COMPAT_SB_CHKSUM) {
		v = super_crc(sb);
		if (v != get_le32(sb + EROFS_SB_CHECKSUM))
			return corrupt(img, "superblock checksum %#x, expected %#x",
				       get_le32(sb + EROFS_SB_CHECKSUM), v);
	}
	if (s->feature_incompat & ~EROFS_FEATURE_INCOMPAT_READ)
		return corrupt(img, "unsupported incompat features %#x",
			       s->feature_incompat & ~EROFS_FEATURE_INCOMPAT_READ);
	/* u1: without COMPR_CFGS LZ4's distance (0: default), with it the
	 * algorithms (LZ4, MicroLZMA, deflate, zstd) whose records the
	 * kernel checks. */
	if (sb[EROFS_SB_EXTSLOTS] || sb[EROFS_SB_DIRBLKBITS] ||
	    (s->feature_incompat & EROFS_FEATURE_INCOMPAT_COMPR_CFGS ?
		     get_le16(sb + EROFS_SB_U1) & ~0xfu :
		     get_le16(sb + EROFS_SB_U1)))
		return corrupt(img, "unsupported superblock (extslots %u, u1 %u, dirblkbits %u)",
			       sb[EROFS_SB_EXTSLOTS], get_le16(sb + EROFS_SB_U1),
			       sb[EROFS_SB_DIRBLKBITS]);

	img->zalgs = s->feature_incompat & EROFS_FEATURE_INCOMPAT_COMPR_CFGS ?
		     get_le16(sb + EROFS_SB_U1) : 1u << Z_EROFS_COMPRESSION_LZ4;
	img->meta_base = (uint64_t)get_le32(sb + EROFS_SB_META_BLKADDR) * EROFS_BLKSIZ;
	if (img->meta_base >= img->len)
		return corrupt(img, "inode area at %llu is outside the image",
			       ull(img->meta_base));
	img->xattr_base = (uint64_t)get_le32(sb + EROFS_SB_XATTR_BLKADDR) * EROFS_BLKSIZ;

	/* Like the kernel, extra_devices means nothing without the feature. */
	if (s->feature_incompat & EROFS_FEATURE_INCOMPAT_DEVICE_TABLE) {
		s->nr_devices = get_le16(sb + EROFS_SB_EXTRA_DEVICES);
		img->devt_off = (uint64_t)get_le16(sb + EROFS_SB_DEVT_SLOTOFF) *
				EROFS_DEVT_SLOT_SIZE;
		if (s->nr_devices > META_MAX_DEVICES)
			return corrupt(img, "%u devices, at most %u are supported",
				       s->nr_devices, META_MAX_DEVICES);
		if (s->nr_devices &&
		    (img->devt_off < EROFS_SUPER_OFFSET + EROFS_SB_SIZE ||
		     !in_image(img, img->devt_off,
			       (uint64_t)s->nr_devices * EROFS_DEVT_SLOT_SIZE)))
			return corrupt(img, "device table at %llu (%u slots) is outside the image",
				       ull(img->devt_off), s->nr_devices);
	}

	s->root_nid = get_le16(sb + EROFS_SB_ROOT_NID);
	s->inos = get_le64(sb + EROFS_SB_INOS);
	s->epoch = get_le64(sb + EROFS_SB_EPOCH);
	s->fixed_nsec = get_le32(sb + EROFS_SB_FIXED_NSEC);
	s->blocks = get_le32(sb + EROFS_SB_BLOCKS);
	memcpy(s->uuid, sb + EROFS_SB_UUID, sizeof(s->uuid));
	memcpy(s->volume_name, sb + EROFS_SB_VOLUME_NAME, 16);
	s->volume_name[16] = '\0';
	s->image_bytes = img->data_len;
	/* The kernel would read the missing blocks as I/O errors later. */
	if ((uint64_t)s->blocks * EROFS_BLKSIZ > img->data_len)
		return corrupt(img, "superblock says %u blocks but the image has %llu bytes (truncated?)",
			       s->blocks, ull(img->data_len));
	if (s->fixed_nsec >= 1000000000u)
		return corrupt(img, "superblock fixed_nsec %u out of range",
			       s->fixed_nsec);
	return 0;
}

/* The bytes [@off, @off + @len), inside the image, match the crc at @crc_at. */
static int check_crc(const struct meta_image *img, uint64_t off, uint64_t len,
		     size_t crc_at, const char *what)
{
	uint32_t crc = erofs_crc32c(~0u, img->buf + off, len);

	if (crc != get_le32(img->buf + crc_at))
		return corrupt(img, "%s checksum %#x, expected %#x", what,
			       get_le32(img->buf + crc_at), crc);
	return 0;
}

/*
 * Bytes 0..63 are unused by EROFS. Without ferry's magic the image is plain
 * EROFS (e.g. from mkfs.erofs); with it, the preamble, the extension
 * payload and the section area after it must be intact.
 */
static int check_preamble(struct meta_image *img)
{
	const uint8_t *p = img->buf;
	uint64_t off, len, sec_len;
	uint32_t crc;
	int ret;

	if (memcmp(p + FERRY_PRE_MAGIC, META_PREAMBLE_MAGIC, 8))
		return 0;
	crc = erofs_crc32c(~0u, p, FERRY_PRE_CRC);
	if (crc != get_le32(p + FERRY_PRE_CRC))
		return corrupt(img, "preamble checksum %#x, expected %#x",
			       get_le32(p + FERRY_PRE_CRC), crc);
	if (get_le32(p + FERRY_PRE_VERSION) != META_PREAMBLE_VERSION)
		return corrupt(img, "preamble version %u is not supported",
			       get_le32(p + FERRY_PRE_VERSION));
	off = get_le64(p + FERRY_PRE_EXT_OFF);
	len = get_le64(p + FERRY_PRE_EXT_LEN);
	if (off % EROFS_BLKSIZ || off < EROFS_BLKSIZ || !in_image(img, off, len))
		return corrupt(img, "extension region %llu+%llu is not block-aligned inside the image",
			       ull(off), ull(len));
	ret = check_crc(img, off, len, FERRY_PRE_EXT_CRC, "extension");
	if (ret)
		return ret;
	img->ext = p + off;
	img->ext_len = len;
	img->has_ext = true;
	sec_len = get_le64(p + FERRY_PRE_SEC_LEN);
	if (!sec_len)
		return 0;
	if (!in_image(img, off + len, sec_len))
		return corrupt(img, "section area %llu+%llu is outside the image",
			       ull(off + len), ull(sec_len));
	ret = check_crc(img, off + len, sec_len, FERRY_PRE_SEC_CRC, "section area");
	if (!ret) {
		img->sections = p + off + len;
		img->sections_len = sec_len;
	}
	return ret;
}

static int load_inode(const struct meta_image *img, uint64_t nid,
		      struct rinode *ri);

static int image_init(struct meta_image *img)
{
	struct rinode root;
	int ret;

	ret = check_super(img);
	if (!ret)
		ret = check_preamble(img);
	/* Before any fragment is checked against it; it is none itself. */
	if (!ret && (img->sb.feature_incompat & EROFS_FEATURE_INCOMPAT_FRAGMENTS)) {
		img->packed_nid = get_le64(img->buf + EROFS_SUPER_OFFSET +
					   EROFS_SB_PACKED_NID);
		ret = load_inode(img, img->packed_nid, &root);
		if (!ret && !S_ISREG(root.mode))
			ret = corrupt(img, "packed nid %llu is not a regular file",
				      ull(img->packed_nid));
		img->packed_size = root.size;
		img->has_packed = !ret;
		img->sb.packed_nid = ret ? 0 : img->packed_nid;
	}
	if (!ret)
		ret = load_inode(img, img->sb.root_nid, &root);
	if (!ret && !S_ISDIR(root.mode))
		ret = corrupt(img, "root nid %llu is not a directory",
			      ull(img->sb.root_nid));
	return ret;
}

int meta_image_open_head(const void *buf, size_t len, uint64_t image_len,
			 struct meta_image **out)
{
	struct meta_image *img = calloc(1, sizeof(*img));
	int ret;

	if (!img)
		return -ENOMEM;
	img->buf = buf;
	img->len = len;
	img->data_len = MAX((uint64_t)len, image_len);
	img->name = strdup("(memory)");
	if (!img->name) {
		free(img);
		return -ENOMEM;
	}
	ret = image_init(img);
	if (ret) {
		meta_image_close(img);
		return ret;
	}
	*out = img;
	return 0;
}

int meta_image_open_mem(const void *buf, size_t len, struct meta_image **out)
{
	return meta_image_open_head(buf, len, len, out);
}

int meta_image_open(const char *path, struct meta_image **out)
{
	struct meta_image *img;
	struct stat st;
	void *map;
	int fd = -1, ret;

	img = calloc(1, sizeof(*img));
	if (!img)
		return -ENOMEM;
	img->name = strdup(path);
	if (!img->name) {
		ret = -ENOMEM;
		goto out;
	}
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st) < 0) {
		ret = -errno;
		ferry_err("bootstrap %s: %s", path, strerror(-ret));
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		ret = -EINVAL;
		ferry_err("bootstrap %s: not a regular file", path);
		goto out;
	}
	if (st.st_size < EROFS_BLKSIZ) {
		ret = corrupt(img, "%lld bytes is smaller than one block",
			      (long long)st.st_size);
		goto out;
	}
	map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
	if (map == MAP_FAILED) {
		ret = -errno;
		ferry_err("bootstrap %s: mmap: %s", path, strerror(-ret));
		goto out;
	}
	img->buf = map;
	img->len = (size_t)st.st_size;
	img->data_len = img->len;
	img->mapped = true;
	ret = image_init(img);
out:
	if (fd >= 0)
		close(fd);
	if (ret)
		meta_image_close(img);
	else
		*out = img;
	return ret;
}

void meta_image_close(struct meta_image *img)
{
	if (!img)
		return;
	if (img->mapped)
		munmap((void *)img->buf, img->len);
	free(img->name);
	free(img);
}

void meta_get_super(const struct meta_image *img, struct meta_super *sb)
{
	*sb = img->sb;
}

int meta_get_device(const struct meta_image *img, uint32_t device_id,
		    struct meta_device_info *out)
{
	const uint8_t *slot;

	if (device_id < 1 || device_id > img->sb.nr_devices)
		return -ENOENT;
	slot = img->buf + img->devt_off +
	       (uint64_t)(device_id - 1) * EROFS_DEVT_SLOT_SIZE;
	memset(out->tag, 0, sizeof(out->tag));
	memcpy(out->tag, slot + EROFS_DEVT_TAG,
	       strnlen((const char *)slot + EROFS_DEVT_TAG, EROFS_DEVT_TAG_LEN));
	out->blocks = get_le32(slot + EROFS_DEVT_BLOCKS);
	out->uniaddr = get_le32(slot + EROFS_DEVT_UNIADDR);
	return 0;
}

int meta_get_ext(const struct meta_image *img, const void **ext, size_t *len)
{
	if (!img->has_ext)
		return -ENODATA;
	*ext = img->ext;
	*len = img->ext_len;
	return 0;
}

void meta_get_sections(const struct meta_image *img, const void **sections,
		       size_t *len)
{
	*sections = img->sections;
	*len = img->sections_len;
}

/* ------------------------------------------------------------------ */
/* Inodes                                                              */
/* ------------------------------------------------------------------ */

static int inode_corrupt(const struct meta_image *img, uint64_t nid,
			 const char *what, uint64_t val)
{
	return corrupt(img, "inode nid %llu: %s (%llu)", ull(nid), what, ull(val));
}

static bool layout_flat(uint8_t layout)
{
	return layout == EROFS_INODE_FLAT_PLAIN || layout == EROFS_INODE_FLAT_INLINE;
}

/* Full indexes from @idx: each head and @big pcluster inside the image. */
static int check_zfull(const struct meta_image *img, struct rinode *ri,
		       uint64_t idx, uint64_t nr, bool big)
{
	uint64_t head_blk = 0, blocks = img->data_len / EROFS_BLKSIZ;

	for (uint64_t l = 0; l < nr; l++) {
		const uint8_t *d = img->buf + idx + l * Z_EROFS_LCLUSTER_INDEX_SIZE;
		uint16_t type = get_le16(d + Z_EROFS_LI_ADVISE);
		uint16_t d0 = get_le16(d + Z_EROFS_LI_DELTA0);

		if (type == Z_EROFS_LCLUSTER_TYPE_NONHEAD && l) {
			/* A big pcluster's block count: inside the image. */
			if (big && (d0 & Z_EROFS_LI_D0_CBLKCNT) &&
			    (d0 & ~Z_EROFS_LI_D0_CBLKCNT) >= 1 &&
			    head_blk + (d0 & ~Z_EROFS_LI_D0_CBLKCNT) <= blocks) {
				zspan(ri, head_blk, d0 & ~Z_EROFS_LI_D0_CBLKCNT);
				continue;
			}
			if (!(d0 & Z_EROFS_LI_D0_CBLKCNT) && d0 >= 1 && d0 <= l)
				continue;
		}
		head_blk = get_le32(d + Z_EROFS_LI_BLKADDR);
		if ((type != Z_EROFS_LCLUSTER_TYPE_PLAIN &&
		     type != Z_EROFS_LCLUSTER_TYPE_HEAD1) ||
		    get_le16(d + Z_EROFS_LI_CLUSTEROFS) >= EROFS_BLKSIZ ||
		    head_blk >= blocks)
			return inode_corrupt(img, ri->nid, "bad lcluster index", l);
		zspan(ri, head_blk, 1);
	}
	return 0;
}

/* Entry @i of a compact pack: its type, and its low bits returned. */
static uint32_t zc_entry(const uint8_t *pack, const struct z_erofs_cpack *pk,
			 uint32_t i, uint8_t *type)
{
	uint32_t bit = pk->bits * i;
	uint32_t v = get_le32(pack + bit / 8) >> bit % 8;

	*type = v >> Z_EROFS_COMPACT_LOBITS & 3;
	return v & ((1u << Z_EROFS_COMPACT_LOBITS) - 1);
}

/*
 * The block of the head at entry @i of a compact pack, counted as Linux
 * does with big pclusters (z_erofs_load_compact_lcluster); -1 where it
 * finds the pack corrupt.
 */
static int64_t zc_head_blk(const uint8_t *pack, const struct z_erofs_cpack *pk,
			   int64_t i)
{
	uint64_t nblk = 0;
	uint32_t lo;
	uint8_t type;

	while (i > 0) {
		lo = zc_entry(pack, pk, (uint32_t)--i, &type);
		if (type != Z_EROFS_LCLUSTER_TYPE_NONHEAD) {
			nblk++;
		} else if (lo & Z_EROFS_LI_D0_CBLKCNT) {
			i--; /* the head of the pcluster it counts */
			nblk += lo & ~Z_EROFS_LI_D0_CBLKCNT;
		} else if (lo <= 1) {
			return -1;
		} else {
			i -= lo - 2; /* on to the CBLKCNT of its pcluster */
		}
	}
	return (int64_t)(get_le32(pack + pk->size - 4) + nblk);
}

/*
 * Compact indexes from @ebase, decoded as Linux does: each head and big
 * pcluster inside the image, delta[0] back inside the file, a pack's last
 * delta[1] on inside it; a lone last lcluster's pack padded with zero.
 */
static int check_zcompact(const struct meta_image *img,
			  struct rinode *ri, uint64_t ebase, uint64_t nr)
{
	uint64_t head_blk = 0, blocks = img->data_len / EROFS_BLKSIZ;
	struct z_erofs_cpack pk = z_erofs_compact_pack(ebase, nr, nr - 1);
	const uint8_t *pack = img->buf + ebase + pk.off;
	uint8_t type;

	if (nr - pk.first < pk.vcnt &&
	    (zc_entry(pack, &pk, pk.vcnt - 1, &type) || type))
		return inode_corrupt(img, ri->nid, "bad lcluster index", nr);
	for (uint64_t l = 0; l < nr; l++) {
		uint32_t i, lo;
		int64_t blk;

		pk = z_erofs_compact_pack(ebase, nr, l);
		pack = img->buf + ebase + pk.off;
		i = (uint32_t)(l - pk.first);
		lo = zc_entry(pack, &pk, i, &type);
		if (type == Z_EROFS_LCLUSTER_TYPE_NONHEAD && l) {
			if (lo & Z_EROFS_LI_D0_CBLKCNT) {
				if ((lo & ~Z_EROFS_LI_D0_CBLKCNT) >= 1 &&
				    head_blk + (lo & ~Z_EROFS_LI_D0_CBLKCNT) <= blocks) {
					zspan(ri, head_blk, lo & ~Z_EROFS_LI_D0_CBLKCNT);
					continue;
				}
			} else if (i + 1 < pk.vcnt) {
				if (lo >= 1 && lo <= l)
					continue;
			} else if (lo >= 1 && lo <= nr - l) {
				/* delta[0] follows from the entry before. */
				continue;
			}
		} else if (type == Z_EROFS_LCLUSTER_TYPE_PLAIN ||
			   type == Z_EROFS_LCLUSTER_TYPE_HEAD1) {
			blk = zc_head_blk(pack, &pk, i);
			if (blk >= 0 && (uint64_t)blk < blocks) {
				head_blk = (uint64_t)blk;
				zspan(ri, head_blk, 1);
				continue;
			}
		}
		return inode_corrupt(img, ri->nid, "bad lcluster index", l);
	}
	return 0;
}

/*
 * A compressed file as ferry writes it (native layers): one algorithm, 4 KiB
 * lclusters, compact indexes (big pclusters, 2-byte packs) or full ones
 * in the image, an extent head first, heads and their big pclusters inside
 * the image, deltas pointing inside the file; or a whole file in the
 * packed inode, inside its bytes (a map header only). The data
 * itself is the kernel's to decompress.
 */
static int check_zmap(const struct meta_image *img, struct rinode *ri)
{
	uint64_t hdr = ROUND_UP(ri->tail_pos, 8u);
	uint64_t ebase = hdr + Z_EROFS_MAP_HEADER_SIZE;
	uint64_t nr = DIV_ROUND_UP(ri->size, EROFS_BLKSIZ);
	bool compact = ri->layout == EROFS_INODE_COMPRESSED_COMPACT;
	uint16_t advise;
	const uint8_t *h;

	if (!S_ISREG(ri->mode))
		return inode_corrupt(img, ri->nid, "compressed non-regular file, mode",
				     ri->mode);
	if (!in_image(img, hdr, Z_EROFS_MAP_HEADER_SIZE))
		return inode_corrupt(img, ri->nid, "compression map outside the image, at",
				     hdr);
	h = img->buf + hdr;
	if (h[Z_EROFS_MAP_H_CLUSTERBITS] & 0x80) {
		/* Whole in the packed inode, which is not a fragment itself. */
		uint64_t off = get_le64(h) & ~Z_EROFS_FRAGMENT_INODE;

		if (!img->has_packed || ri->nid == img->packed_nid ||
		    off > img->packed_size || ri->size > img->packed_size - off)
			return inode_corrupt(img, ri->nid,
					     "fragment outside the packed inode, at",
					     off);
		return 0;
	}
	if (compact ? !nr || !in_image(img, ebase, z_erofs_compact_size(ebase, nr)) :
		      nr > (img->len - MIN(ebase + Z_EROFS_FULL_INDEX_PAD, img->len)) /
				   Z_EROFS_LCLUSTER_INDEX_SIZE)
		return inode_corrupt(img, ri->nid, "compression map outside the image, at",
				     hdr);
	advise = get_le16(h + Z_EROFS_MAP_H_ADVISE);
	if (get_le32(h) || h[7] ||
	    (compact ? advise != (Z_EROFS_ADVISE_BIG_PCLUSTER_1 |
				  Z_EROFS_ADVISE_BIG_PCLUSTER_2 |
				  Z_EROFS_ADVISE_COMPACTED_2B) :
		       advise && advise != (Z_EROFS_ADVISE_BIG_PCLUSTER_1 |
					    Z_EROFS_ADVISE_BIG_PCLUSTER_2)) ||
	    h[Z_EROFS_MAP_H_ALGORITHMTYPE] > Z_EROFS_COMPRESSION_ZSTD ||
	    !(img->zalgs & 1u << h[Z_EROFS_MAP_H_ALGORITHMTYPE]))
		return inode_corrupt(img, ri->nid,
				     "unsupported compression (ferry reads the superblock's algorithms, one per file, 4 KiB clusters), header",
				     get_le64(h));
	ri->zfirst = UINT32_MAX;
	if (compact)
		return check_zcompact(img, ri, ebase, nr);
	return check_zfull(img, ri, ebase + Z_EROFS_FULL_INDEX_PAD, nr, advise);
}

/* Where the data of a FLAT_PLAIN / FLAT_INLINE inode lives; checked here. */
static int check_flat(const struct meta_image *img, struct rinode *ri)
{
	uint64_t nblocks = DIV_ROUND_UP(ri->size, EROFS_BLKSIZ);

	if (ri->layout == EROFS_INODE_FLAT_INLINE && nblocks) {
		uint64_t tail_len = ri->size - (nblocks - 1) * EROFS_BLKSIZ;

		nblocks--;
		if (ri->tail_pos % EROFS_BLKSIZ + tail_len > EROFS_BLKSIZ)
			return inode_corrupt(img, ri->nid,
					     "inline data crosses a block, bytes",
					     tail_len);
		if (!in_image(img, ri->tail_pos, tail_len))
			return inode_corrupt(img, ri->nid,
					     "inline data outside the image, at",
					     ri->tail_pos);
	}
	if (nblocks && ri->startblk + nblocks > img->data_len / EROFS_BLKSIZ)
		return inode_corrupt(img, ri->nid,
				     "data blocks outside the image, start",
				     ri->startblk);
	return 0;
}

/* Chunk table of a regular file (load_inode refuses other types). */
static int check_chunked(const struct meta_image *img, struct rinode *ri,
			 uint16_t format)
{
	uint64_t table;

	if (format & ~EROFS_CHUNK_FORMAT_ALL)
		return inode_corrupt(img, ri->nid, "unsupported chunk format",
				     format);
	if ((format & EROFS_CHUNK_FORMAT_BLKBITS_MASK) > CHUNK_BITS_MAX)
		return inode_corrupt(img, ri->nid, "chunk size too large, chunkbits",
				     format & EROFS_CHUNK_FORMAT_BLKBITS_MASK);
	ri->chunk_bits = EROFS_BLKSIZ_BITS + (format & EROFS_CHUNK_FORMAT_BLKBITS_MASK);
	ri->chunk_unit = format & EROFS_CHUNK_FORMAT_INDEXES ?
			 EROFS_CHUNK_INDEX_SIZE : 4;
	ri->nr_chunks = ri->size ? ((ri->size - 1) >> ri->chunk_bits) + 1 : 0;
	ri->chunk_pos = ROUND_UP(ri->xattr_pos + ri->xattr_size, ri->chunk_unit);
	if (ri->nr_chunks > img->data_len / ri->chunk_unit)
		return inode_corrupt(img, ri->nid, "chunk table larger than the image, chunks",
				     ri->nr_chunks);
	table = ri->nr_chunks * ri->chunk_unit;
	if (!in_image(img, ri->chunk_pos, table))
		return inode_corrupt(img, ri->nid, "chunk table outside the image, at",
				     ri->chunk_pos);
	return 0;
}

static int load_inode(const struct meta_image *img, uint64_t nid,
		      struct rinode *ri)
{
	const uint8_t *p;
	uint64_t pos;
	uint16_t format, icount;
	uint32_t isize;

	memset(ri, 0, sizeof(*ri));
	ri->nid = nid;
	if (nid > (img->len - img->meta_base) / EROFS_SLOT_SIZE)
		return inode_corrupt(img, nid, "nid outside the image, nid", nid);
	pos = img->meta_base + nid * EROFS_SLOT_SIZE;
	if (!in_image(img, pos, EROFS_INODE_COMPACT_SIZE))
		return inode_corrupt(img, nid, "inode outside the image, at", pos);
	p = img->buf + pos;
	format = get_le16(p + EROFS_I_FORMAT);
	/* Kernels before 6.15 refuse any other i_format bit. */
	if (format & ~EROFS_I_ALL_BITS)
		return inode_corrupt(img, nid, "unsupported i_format", format);
	ri->extended = (format & EROFS_I_VERSION_MASK) == EROFS_I_VERSION_EXTENDED;
	ri->layout = (format >> EROFS_I_DATALAYOUT_SHIFT) & EROFS_I_DATALAYOUT_MASK;
	if (ri->layout != EROFS_INODE_FLAT_PLAIN &&
	    ri->layout != EROFS_INODE_FLAT_INLINE &&
	    ri->layout != EROFS_INODE_CHUNK_BASED &&
	    ri->layout != EROFS_INODE_COMPRESSED_FULL &&
	    ri->layout != EROFS_INODE_COMPRESSED_COMPACT)
		return inode_corrupt(img, nid, "unsupported data layout", ri->layout);
	isize = ri->extended ? EROFS_INODE_EXTENDED_SIZE : EROFS_INODE_COMPACT_SIZE;
	if (!in_image(img, pos, isize))
		return inode_corrupt(img, nid, "extended inode outside the image, at",
				     pos);
	icount = get_le16(p + EROFS_I_XATTR_ICOUNT);
	ri->mode = get_le16(p + EROFS_I_MODE);
	ri->ino = get_le32(p + EROFS_I_INO);
	if (ri->extended) {
		ri->size = get_le64(p + EROFS_IE_SIZE);
		ri->uid = get_le32(p + EROFS_IE_UID);
		ri->gid = get_le32(p + EROFS_IE_GID);
		ri->mtime = (int64_t)get_le64(p + EROFS_IE_MTIME);
		ri->mtime_nsec = get_le32(p + EROFS_IE_MTIME_NSEC);
		ri->nlink = get_le32(p + EROFS_IE_NLINK);
	} else {
		uint64_t mtime;

		ri->size = get_le32(p + EROFS_IC_SIZE);
		ri->uid = get_le16(p + EROFS_IC_UID);
		ri->gid = get_le16(p + EROFS_IC_GID);
		ri->nlink = get_le16(p + EROFS_IC_NLINK);
		/* Linux >= 6.15 reads compact mtimes relative to the epoch. */
		if (__builtin_add_overflow(img->sb.epoch,
					   (uint64_t)get_le32(p + EROFS_IC_MTIME),
					   &mtime) || mtime > INT64_MAX)
			return inode_corrupt(img, nid, "mtime overflows, epoch",
					     img->sb.epoch);
		ri->mtime = (int64_t)mtime;
		ri->mtime_nsec = img->sb.fixed_nsec;
	}
	if (ri->size > INT64_MAX)
		return inode_corrupt(img, nid, "negative i_size", ri->size);
	if (ri->mtime_nsec >= 1000000000u)
		return inode_corrupt(img, nid, "mtime nanoseconds out of range",
				     ri->mtime_nsec);
	ri->xattr_pos = pos + isize;
	ri->xattr_size = EROFS_XATTR_IBODY_SIZE(icount);
	if (!in_image(img, ri->xattr_pos, ri->xattr_size))
		return inode_corrupt(img, nid, "xattrs outside the image, bytes",
				     ri->xattr_size);
	ri->tail_pos = ri->xattr_pos + ri->xattr_size;

	switch (ri->mode & S_IFMT) {
	case S_IFREG:
		break;
	case S_IFLNK:
		if (ri->size > META_SYMLINK_MAX)
			return inode_corrupt(img, nid, "symlink too long", ri->size);
		/* fall through */
	case S_IFDIR:
		if (!layout_flat(ri->layout))
			return inode_corrupt(img, nid, "chunk-based or compressed directory or symlink, mode",
					     ri->mode);
		break;
	case S_IFCHR:
	case S_IFBLK:
		erofs_decode_rdev(get_le32(p + EROFS_I_U), &ri->rdev_major,
				  &ri->rdev_minor);
		/* fall through */
	case S_IFIFO:
	case S_IFSOCK:
		if (ri->size || !layout_flat(ri->layout))
			return inode_corrupt(img, nid, "special file with data, size",
					     ri->size);
		return 0;
	default:
		return inode_corrupt(img, nid, "bogus mode", ri->mode);
	}

	if (ri->layout == EROFS_INODE_CHUNK_BASED)
		return check_chunked(img, ri, get_le16(p + EROFS_I_U));
	if (ri->layout == EROFS_INODE_COMPRESSED_FULL ||
	    ri->layout == EROFS_INODE_COMPRESSED_COMPACT)
		return check_zmap(img, ri);
	ri->startblk = get_le32(p + EROFS_I_U);
	return check_flat(img, ri);
}

/*
 * Data of a FLAT inode at @pos (< size): a pointer into the image and the
 * bytes available up to the end of that block or of the data. Bounds were
 * checked by load_inode().
 */
static const uint8_t *flat_data(const struct meta_image *img,
				const struct rinode *ri, uint64_t pos,
				size_t *avail)
{
	uint64_t blk = pos / EROFS_BLKSIZ, in_blk = pos % EROFS_BLKSIZ;
	uint64_t last = (ri->size - 1) / EROFS_BLKSIZ;
	uint64_t at = ri->layout == EROFS_INODE_FLAT_INLINE && blk == last ?
			      ri->tail_pos + in_blk :
			      (ri->startblk + blk) * EROFS_BLKSIZ + in_blk;

	*avail = (size_t)MIN(EROFS_BLKSIZ - in_blk, ri->size - pos);
	/* check_flat put it inside the image; a head holds less of it. */
	return in_image(img, at, *avail) ? img->buf + at : NULL;
}

int meta_getattr(const struct meta_image *img, uint64_t nid,
		 struct meta_stat *st)
{
	struct rinode ri;
	int ret = load_inode(img, nid, &ri);

	if (ret)
		return ret;
	memset(st, 0, sizeof(*st));
	st->nid = nid;
	st->mode = ri.mode;
	st->uid = ri.uid;
	st->gid = ri.gid;
	st->nlink = ri.nlink;
	st->size = ri.size;
	st->mtime = ri.mtime;
	st->mtime_nsec = ri.mtime_nsec;
	st->rdev_major = ri.rdev_major;
	st->rdev_minor = ri.rdev_minor;
	st->ino = ri.ino;
	st->layout = ri.layout;
	st->compressed = ri.layout == EROFS_INODE_COMPRESSED_FULL ||
			 ri.layout == EROFS_INODE_COMPRESSED_COMPACT;
	if (ri.zend) {
		st->zblk_first = ri.zfirst;
		st->zblk_end = ri.zend;
	}
	st->extended = ri.extended;
	if (ri.layout == EROFS_INODE_CHUNK_BASED) {
		st->chunk_size = 1u << ri.chunk_bits;
		st->nr_chunks = ri.nr_chunks;
	}
	return 0;
}

/* Copy data of a FLAT inode; short at EOF. */
static ssize_t read_flat(const struct meta_image *img, const struct rinode *ri,
			 uint64_t off, uint8_t *buf, size_t len)
{
	size_t done = 0, avail;

	if (off >= ri->size)
		return 0;
	len = (size_t)MIN((uint64_t)len, ri->size - off);
	while (done < len) {
		const uint8_t *p = flat_data(img, ri, off + done, &avail);

		if (!p)
			return inode_corrupt(img, ri->nid, "data outside the bytes at hand, at",
					     off + done);
		avail = MIN(avail, len - done);
		memcpy(buf + done, p, avail);
		done += avail;
	}
	return done;
}

ssize_t meta_read(const struct meta_image *img, uint64_t nid, uint64_t off,
		  void *buf, size_t len)
{
	struct rinode ri;
	int ret = load_inode(img, nid, &ri);

	if (ret)
		return ret;
	if (!layout_flat(ri.layout))
		return -EINVAL;
	return read_flat(img, &ri, off, buf, MIN(len, (size_t)SSIZE_MAX));
}

ssize_t meta_readlink(const struct meta_image *img, uint64_t nid, char *buf,
		      size_t size)
{
	struct rinode ri;
	ssize_t n;
	int ret = load_inode(img, nid, &ri);

	if (ret)
		return ret;
	if (!S_ISLNK(ri.mode))
		return -EINVAL;
	if (ri.size >= size)
		return -ERANGE;
	n = read_flat(img, &ri, 0, (uint8_t *)buf, (size_t)ri.size);
	if (n < 0)
		return n;
	if (memchr(buf, '\0', (size_t)n))
		return inode_corrupt(img, nid, "NUL in symlink target, length", n);
	buf[n] = '\0';
	return (ssize_t)n;
}

int meta_get_chunk(const struct meta_image *img, uint64_t nid, uint64_t index,
		   struct meta_chunk *out)
{
	struct rinode ri;
	const uint8_t *p;
	uint32_t dev = 0, blk, i;
	int ret = load_inode(img, nid, &ri);

	if (ret)
		return ret;
	if (ri.layout != EROFS_INODE_CHUNK_BASED || index >= ri.nr_chunks)
		return -EINVAL;
	p = img->buf + ri.chunk_pos + index * ri.chunk_unit;
	if (ri.chunk_unit == EROFS_CHUNK_INDEX_SIZE) {
		dev = get_le16(p + EROFS_CHUNK_INDEX_DEVICE_ID);
		blk = get_le32(p + EROFS_CHUNK_INDEX_STARTBLK);
	} else {
		blk = get_le32(p);
	}
	if (blk == EROFS_NULL_ADDR) {
		out->device_id = 0;
		out->blkaddr = META_CHUNK_HOLE;
		return 0;
	}
	if (dev > img->sb.nr_devices)
		return corrupt(img, "inode nid %llu: chunk %llu on device %u of %u",
			       ull(nid), ull(index), dev, img->sb.nr_devices);
	if (dev) {
		out->device_id = (uint16_t)dev;
		out->blkaddr = blk;
		return 0;
	}
	/*
	 * Device 0 is the unified address space, as in the kernel: a device
	 * claims the blocks [uniaddr, uniaddr + blocks), the rest is the
	 * bootstrap itself. ferry never writes either (mkfs.erofs does), and
	 * data inside the bootstrap has no place in struct meta_chunk.
	 */
	for (i = 0; i < img->sb.nr_devices; i++) {
		const uint8_t *slot = img->buf + img->devt_off +
				      (uint64_t)i * EROFS_DEVT_SLOT_SIZE;
		uint32_t uniaddr = get_le32(slot + EROFS_DEVT_UNIADDR);

		if (uniaddr && blk >= uniaddr &&
		    blk - uniaddr < get_le32(slot + EROFS_DEVT_BLOCKS)) {
			out->device_id = (uint16_t)(i + 1);
			out->blkaddr = blk - uniaddr;
			return 0;
		}
	}
	return corrupt(img, "inode nid %llu: chunk %llu is data inside the bootstrap (block %u), which ferry does not serve",
		       ull(nid), ull(index), blk);
}

/* ------------------------------------------------------------------ */
/* Extended attributes                                                 */
/* ------------------------------------------------------------------ */

struct xattr_ref {
	const struct erofs_xattr_prefix *prefix;
	const uint8_t *name; /* without the prefix */
	uint8_t name_len;
	const uint8_t *value;
	uint16_t value_len;
};

/* Returns non-zero to stop the iteration. */
typedef int (*xattr_fn)(void *ctx, const struct xattr_ref *x);

static const struct erofs_xattr_prefix *xattr_prefix_of(uint8_t index)
{
	size_t i;

	for (i = 0; i < ARRAY_SIZE(erofs_xattr_prefixes); i++)
		if (erofs_xattr_prefixes[i].index == index)
			return &erofs_xattr_prefixes[i];
	return NULL;
}

/*
 * Decode the entry at @pos, which must lie within @limit bytes of the
 * image; *@size gets its padded size.
 */
static int xattr_entry(const struct meta_image *img, uint64_t nid,
		       uint64_t pos, uint64_t limit, struct xattr_ref *x,
		       uint32_t *size)
{
	const uint8_t *p = img->buf + pos;
	uint32_t body;

	if (limit < EROFS_XATTR_ENTRY_SIZE)
		return inode_corrupt(img, nid, "truncated xattr entry at", pos);
	x->name_len = p[0];
	x->value_len = get_le16(p + 2);
	x->prefix = xattr_prefix_of(p[1]);
	body = EROFS_XATTR_ENTRY_SIZE + x->name_len + x->value_len;
	*size = EROFS_XATTR_ALIGN(body);
	if (body > limit)
		return inode_corrupt(img, nid, "xattr entry overflows its region, at",
				     pos);
	x->name = p + EROFS_XATTR_ENTRY_SIZE;
	x->value = x->name + x->name_len;
	if (!x->prefix)
		return inode_corrupt(img, nid, "unsupported xattr name index",
				     p[1]);
	/* ACL names are the whole prefix; the others need a suffix. */
	if ((x->prefix->prefix[x->prefix->len - 1] == '.') != (x->name_len > 0) ||
	    memchr(x->name, '\0', x->name_len))
		return inode_corrupt(img, nid, "bad xattr name, length",
				     x->name_len);
	return 0;
}

static int xattr_for_each(const struct meta_image *img, const struct rinode *ri,
			  xattr_fn fn, void *ctx)
{
	struct xattr_ref x;
	uint64_t pos, end;
	uint32_t shared, size, i;
	int ret;

	if (!ri->xattr_size)
		return 0;
	end = ri->xattr_pos + ri->xattr_size;
	shared = img->buf[ri->xattr_pos + 4];
	pos = ri->xattr_pos + EROFS_XATTR_IBODY_HEADER_SIZE;
	if ((uint64_t)shared * 4 > end - pos)
		return inode_corrupt(img, ri->nid, "too many shared xattrs", shared);
	for (i = 0; i < shared; i++) {
		uint64_t at = img->xattr_base +
			      (uint64_t)get_le32(img->buf + pos + 4 * i) * 4;

		if (at > img->len)
			return inode_corrupt(img, ri->nid,
					     "shared xattr outside the image, at", at);
		ret = xattr_entry(img, ri->nid, at, img->len - at, &x, &size);
		if (!ret)
			ret = fn(ctx, &x);
		if (ret)
			return ret;
	}
	for (pos += (uint64_t)shared * 4; pos < end; pos += size) {
		ret = xattr_entry(img, ri->nid, pos, end - pos, &x, &size);
		if (!ret)
			ret = fn(ctx, &x);
		if (ret)
			return ret;
	}
	return 0;
}

struct xattr_list {
	char *buf;
	size_t size, used;
};

static int list_one(void *ctx, const struct xattr_ref *x)
{
	struct xattr_list *l = ctx;
	size_t n = (size_t)x->prefix->len + x->name_len + 1;

	if (l->size) {
		if (n > l->size - l->used)
			return -ERANGE;
		memcpy(l->buf + l->used, x->prefix->prefix, x->prefix->len);
		memcpy(l->buf + l->used + x->prefix->len, x->name, x->name_len);
		l->buf[l->used + n - 1] = '\0';
	}
	l->used += n;
	return 0;
}

ssize_t meta_listxattr(const struct meta_image *img, uint64_t nid, char *buf,
		       size_t size)
{
	struct xattr_list l = { buf, size, 0 };
	struct rinode ri;
	int ret = load_inode(img, nid, &ri);

	if (!ret)
		ret = xattr_for_each(img, &ri, list_one, &l);
	return ret ? ret : (ssize_t)l.used;
}

struct xattr_find {
	const struct erofs_xattr_prefix *prefix;
	const char *name;
	size_t name_len;
	struct xattr_ref hit;
};

static int find_one(void *ctx, const struct xattr_ref *x)
{
	struct xattr_find *f = ctx;

	if (x->prefix != f->prefix || x->name_len != f->name_len ||
	    memcmp(x->name, f->name, f->name_len))
		return 0;
	f->hit = *x;
	return 1;
}

ssize_t meta_getxattr(const struct meta_image *img, uint64_t nid,
		      const char *name, void *buf, size_t size)
{
	struct xattr_find f = { 0 };
	struct rinode ri;
	size_t i, len = strlen(name);
	int ret;

	for (i = 0; i < ARRAY_SIZE(erofs_xattr_prefixes) && !f.prefix; i++)
		if (!strncmp(name, erofs_xattr_prefixes[i].prefix,
			     erofs_xattr_prefixes[i].len))
			f.prefix = &erofs_xattr_prefixes[i];
	ret = load_inode(img, nid, &ri);
	if (ret)
		return ret;
	if (!f.prefix)
		return -ENODATA;
	f.name = name + f.prefix->len;
	f.name_len = len - f.prefix->len;
	ret = xattr_for_each(img, &ri, find_one, &f);
	if (ret <= 0)
		return ret ? ret : -ENODATA;
	if (size) {
		if (f.hit.value_len > size)
			return -ERANGE;
		memcpy(buf, f.hit.value, f.hit.value_len);
	}
	return f.hit.value_len;
}

/* ------------------------------------------------------------------ */
/* Directories                                                         */
/* ------------------------------------------------------------------ */

/* One directory block: dirents, then their names. */
struct dir_block {
	uint64_t index;
	const uint8_t *p;
	uint32_t len; /* valid bytes (the last block may be short) */
	uint32_t nr;  /* dirents */
};

struct dir_entry {
	const char *name;
	uint32_t len;
	uint64_t nid;
	uint8_t file_type;
};

static int dir_corrupt(const struct meta_image *img, const struct rinode *dir,
		       uint64_t blk, const char *what, uint64_t val)
{
	return corrupt(img, "directory nid %llu block %llu: %s (%llu)",
		       ull(dir->nid), ull(blk), what, ull(val));
}

static uint64_t dir_blocks(const struct rinode *dir)
{
	return DIV_ROUND_UP(dir->size, EROFS_BLKSIZ);
}

static int dir_block(const struct meta_image *img, const struct rinode *dir,
		     uint64_t index, struct dir_block *db)
{
	size_t avail;
	uint32_t nameoff;

	db->index = index;
	db->p = flat_data(img, dir, index * EROFS_BLKSIZ, &avail);
	if (!db->p)
		return dir_corrupt(img, dir, index, "block outside the bytes at hand, at",
				   index);
	db->len = (uint32_t)avail;
	if (db->len < EROFS_DIRENT_SIZE)
		return dir_corrupt(img, dir, index, "block too short", db->len);
	nameoff = get_le16(db->p + EROFS_DIRENT_NAMEOFF);
	if (nameoff < EROFS_DIRENT_SIZE || nameoff % EROFS_DIRENT_SIZE ||
	    nameoff >= db->len)
		return dir_corrupt(img, dir, index, "bogus first nameoff", nameoff);
	db->nr = nameoff / EROFS_DIRENT_SIZE;
	return 0;
}

/*
 * Entry @i of @db. Names are packed back to back after the dirents; the
 * last one ends at a NUL or the end of the block.
 */
static int dir_entry(const struct meta_image *img, const struct rinode *dir,
		     const struct dir_block *db, uint32_t i,
		     struct dir_entry *de)
{
	const uint8_t *d = db->p + (size_t)i * EROFS_DIRENT_SIZE;
	uint32_t off = get_le16(d + EROFS_DIRENT_NAMEOFF), end;

	if (off < db->nr * EROFS_DIRENT_SIZE || off >= db->len)
		return dir_corrupt(img, dir, db->index, "nameoff outside the block",
				   off);
	if (i + 1 < db->nr)
		end = get_le16(d + EROFS_DIRENT_SIZE + EROFS_DIRENT_NAMEOFF);
	else
		end = off + (uint32_t)strnlen((const char *)db->p + off,
					      db->len - off);
	if (end <= off || end > db->len || end - off > EROFS_NAME_LEN)
		return dir_corrupt(img, dir, db->index, "bad name length of entry",
				   i);
	de->name = (const char *)db->p + off;
	de->len = end - off;
	if (memchr(de->name, '/', de->len) || memchr(de->name, '\0', de->len))
		return dir_corrupt(img, dir, db->index, "'/' or NUL in name of entry",
				   i);
	de->nid = get_le64(d + EROFS_DIRENT_NID);
	de->file_type = d[EROFS_DIRENT_FILE_TYPE];
	if (de->file_type >= EROFS_FT_MAX)
		return dir_corrupt(img, dir, db->index, "bad file type",
				   de->file_type);
	return 0;
}

static int name_cmp(const char *a, size_t alen, const char *b, size_t blen)
{
	int c = memcmp(a, b, MIN(alen, blen));

	if (c)
		return c;
	return alen < blen ? -1 : alen > blen;
}

/* Every entry of block @index, strictly ascending (lookup depends on it). */
static int dir_block_checked(const struct meta_image *img,
			     const struct rinode *dir, uint64_t index,
			     struct dir_block *db)
{
	struct dir_entry prev = { 0 }, cur;
	uint32_t i;
	int ret = dir_block(img, dir, index, db);

	for (i = 0; !ret && i < db->nr; i++) {
		ret = dir_entry(img, dir, db, i, &cur);
		if (!ret && i && name_cmp(prev.name, prev.len, cur.name, cur.len) >= 0)
			ret = dir_corrupt(img, dir, index, "names out of order at entry",
					  i);
		prev = cur;
	}
	return ret;
}

/* The first name of block @index must sort after the last of the one before. */
static int dir_block_follows(const struct meta_image *img,
			     const struct rinode *dir, const struct dir_block *db)
{
	struct dir_block prev;
	struct dir_entry last, first;
	int ret;

	if (!db->index)
		return 0;
	ret = dir_block(img, dir, db->index - 1, &prev);
	if (!ret)
		ret = dir_entry(img, dir, &prev, prev.nr - 1, &last);
	if (!ret)
		ret = dir_entry(img, dir, db, 0, &first);
	if (!ret && name_cmp(last.name, last.len, first.name, first.len) >= 0)
		ret = dir_corrupt(img, dir, db->index,
				  "first name not after the previous block's last, block",
				  db->index);
	return ret;
}

static int load_dir(const struct meta_image *img, uint64_t nid,
		    struct rinode *dir)
{
	int ret = load_inode(img, nid, dir);

	if (!ret && !S_ISDIR(dir->mode))
		ret = -ENOTDIR;
	return ret;
}

int meta_readdir(const struct meta_image *img, uint64_t dir_nid, uint64_t pos,
		 meta_filldir_t fill, void *ctx)
{
	struct rinode dir;
	struct dir_block db;
	struct dir_entry de;
	uint64_t blk, next;
	uint32_t i;
	int ret = load_dir(img, dir_nid, &dir);

	if (ret)
		return ret;
	/* Cookies are dirent offsets: block * 4096 + entry * 12. */
	if (pos % EROFS_BLKSIZ % EROFS_DIRENT_SIZE)
		return -EINVAL;
	for (blk = pos / EROFS_BLKSIZ; blk < dir_blocks(&dir); blk++) {
		ret = dir_block_checked(img, &dir, blk, &db);
		if (!ret)
			ret = dir_block_follows(img, &dir, &db);
		if (ret)
			return ret;
		i = blk == pos / EROFS_BLKSIZ ?
			    (uint32_t)(pos % EROFS_BLKSIZ / EROFS_DIRENT_SIZE) : 0;
		for (; i < db.nr; i++) {
			ret = dir_entry(img, &dir, &db, i, &de);
			if (ret)
				return ret;
			next = i + 1 < db.nr ?
				       blk * EROFS_BLKSIZ + (i + 1) * EROFS_DIRENT_SIZE :
				       (blk + 1) * EROFS_BLKSIZ;
			ret = fill(ctx, de.name, de.len, de.nid, de.file_type, next);
			if (ret)
				return ret;
		}
	}
	return 0;
}

mode_t meta_ftype_mode(unsigned int file_type)
{
	static const mode_t modes[EROFS_FT_MAX] = {
		[EROFS_FT_REG_FILE] = S_IFREG, [EROFS_FT_DIR] = S_IFDIR,
		[EROFS_FT_CHRDEV] = S_IFCHR,   [EROFS_FT_BLKDEV] = S_IFBLK,
		[EROFS_FT_FIFO] = S_IFIFO,     [EROFS_FT_SOCK] = S_IFSOCK,
		[EROFS_FT_SYMLINK] = S_IFLNK,
	};

	return file_type < EROFS_FT_MAX ? modes[file_type] : 0;
}

int meta_lookup(const struct meta_image *img, uint64_t dir_nid,
		const char *name, size_t len, uint64_t *nid)
{
	struct rinode dir;
	struct dir_block db;
	struct dir_entry de;
	uint64_t lo, hi, mid, blk = 0;
	uint32_t ilo, ihi, imid;
	int ret = load_dir(img, dir_nid, &dir), c;

	if (ret)
		return ret;
	if (len > EROFS_NAME_LEN)
		return -ENAMETOOLONG;
	if (!len || memchr(name, '/', len) || memchr(name, '\0', len) ||
	    !dir_blocks(&dir))
		return -ENOENT;
	/* The last block whose first name is <= @name holds it, if anyone. */
	lo = 0;
	hi = dir_blocks(&dir);
	while (lo < hi) {
		mid = lo + (hi - lo) / 2;
		ret = dir_block(img, &dir, mid, &db);
		if (!ret)
			ret = dir_entry(img, &dir, &db, 0, &de);
		if (ret)
			return ret;
		c = name_cmp(name, len, de.name, de.len);
		if (c < 0) {
			hi = mid;
		} else {
			blk = mid;
			lo = mid + 1;
			if (!c)
				break;
		}
	}
	if (lo == 0)
		return -ENOENT;
	ret = dir_block_checked(img, &dir, blk, &db);
	if (ret)
		return ret;
	ilo = 0;
	ihi = db.nr;
	while (ilo < ihi) {
		imid = ilo + (ihi - ilo) / 2;
		ret = dir_entry(img, &dir, &db, imid, &de);
		if (ret)
			return ret;
		c = name_cmp(name, len, de.name, de.len);
		if (!c) {
			*nid = de.nid;
			return 0;
		}
		if (c < 0)
			ihi = imid;
		else
			ilo = imid + 1;
	}
	return -ENOENT;
}
