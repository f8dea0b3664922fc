/* SPDX-License-Identifier: MIT */
/* Internal to pkg-meta: helpers shared by writer.c, reader.c and tree.c. */
#ifndef FERRY_META_INTERNAL_H
#define FERRY_META_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "erofs_fs.h"

/*
 * CRC32C (Castagnoli, reflected polynomial 0x82F63B78) without the final
 * inversion, as EROFS uses it: erofs_crc32c(~0, buf, len) is the value
 * stored in the superblock checksum. Defined in crc32c.c.
 */
uint32_t erofs_crc32c(uint32_t crc, const void *buf, size_t len);

/* Short xattr name prefixes, by EROFS name index. */
struct erofs_xattr_prefix {
	uint8_t index;
	const char *prefix;
	uint8_t len;
};

static const struct erofs_xattr_prefix erofs_xattr_prefixes[] = {
	/* Whole-name prefixes first: they must win over "system." */
	{ EROFS_XATTR_INDEX_POSIX_ACL_ACCESS, "system.posix_acl_access", 23 },
	{ EROFS_XATTR_INDEX_POSIX_ACL_DEFAULT, "system.posix_acl_default", 24 },
	{ EROFS_XATTR_INDEX_USER, "user.", 5 },
	{ EROFS_XATTR_INDEX_TRUSTED, "trusted.", 8 },
	{ EROFS_XATTR_INDEX_SECURITY, "security.", 9 },
};

/* One pack of compact lcluster indexes (erofs_fs.h, Z_EROFS_COMPACT_*). */
struct z_erofs_cpack {
	uint64_t off;   /* byte offset from ebase */
	uint64_t first; /* its first lcluster */
	uint32_t vcnt;  /* lclusters a whole pack holds */
	uint32_t size;  /* bytes, the le32 block address last */
	uint32_t bits;  /* per entry */
};

/*
 * The pack holding lcluster @lcn of a file of @nr lclusters whose compact
 * indexes (COMPACTED_2B) start at image byte @ebase, 8-aligned: the split
 * z_erofs_load_compact_lcluster() makes.
 */
static inline struct z_erofs_cpack z_erofs_compact_pack(uint64_t ebase,
							 uint64_t nr,
							 uint64_t lcn)
{
	uint64_t initial = ((32 - ebase % 32) / 4) & 7;
	uint64_t nr_2b = initial < nr ? (nr - initial) / Z_EROFS_COMPACT_2B_VCNT *
						Z_EROFS_COMPACT_2B_VCNT : 0;
	uint64_t from = 0, from_off = 0;
	struct z_erofs_cpack pk = { .vcnt = Z_EROFS_COMPACT_4B_VCNT,
				    .size = Z_EROFS_COMPACT_4B_SIZE };

	if (lcn >= initial && lcn - initial < nr_2b) {
		pk.vcnt = Z_EROFS_COMPACT_2B_VCNT;
		pk.size = Z_EROFS_COMPACT_2B_SIZE;
		from = initial;
		from_off = initial * (Z_EROFS_COMPACT_4B_SIZE / Z_EROFS_COMPACT_4B_VCNT);
	} else if (lcn >= initial) {
		from = initial + nr_2b;
		from_off = initial * (Z_EROFS_COMPACT_4B_SIZE / Z_EROFS_COMPACT_4B_VCNT) +
			   nr_2b * (Z_EROFS_COMPACT_2B_SIZE / Z_EROFS_COMPACT_2B_VCNT);
	}
	pk.first = from + (lcn - from) / pk.vcnt * pk.vcnt;
	pk.off = from_off + (pk.first - from) / pk.vcnt * pk.size;
	pk.bits = (pk.size - 4) * 8 / pk.vcnt;
	return pk;
}

/* Bytes of the compact indexes of @nr (>= 1) lclusters from @ebase. */
static inline uint64_t z_erofs_compact_size(uint64_t ebase, uint64_t nr)
{
	struct z_erofs_cpack last = z_erofs_compact_pack(ebase, nr, nr - 1);

	return last.off + last.size;
}

/* EROFS file_type for an S_IFMT mode (EROFS_FT_UNKNOWN if none). */
static inline uint8_t erofs_ftype_of_mode(uint32_t mode)
{
	switch (mode & 0170000) {
	case 0100000: return EROFS_FT_REG_FILE;
	case 0040000: return EROFS_FT_DIR;
	case 0020000: return EROFS_FT_CHRDEV;
	case 0060000: return EROFS_FT_BLKDEV;
	case 0010000: return EROFS_FT_FIFO;
	case 0140000: return EROFS_FT_SOCK;
	case 0120000: return EROFS_FT_SYMLINK;
	default: return EROFS_FT_UNKNOWN;
	}
}

/* Linux new_encode_dev(): the rdev form stored in i_u. */
static inline uint32_t erofs_encode_rdev(uint32_t major, uint32_t minor)
{
	return (minor & 0xff) | (major << 8) | ((minor & ~0xffu) << 12);
}

static inline void erofs_decode_rdev(uint32_t rdev, uint32_t *major,
				     uint32_t *minor)
{
	*major = (rdev & 0xfff00) >> 8;
	*minor = (rdev & 0xff) | ((rdev >> 12) & 0xfff00);
}

#endif
