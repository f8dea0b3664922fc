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
