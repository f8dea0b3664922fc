/* SPDX-License-Identifier: MIT */
/*
 * EROFS on-disk format, as far as ferry writes and reads it. Written from
 * the format documentation (docs/FORMAT.md has the prose); every integer is
 * little-endian and accessed through get_le* / put_le* on byte buffers, so
 * the structs below document layout and carry size checks, and code uses
 * the EROFS_* offset constants.
 *
 * ferry emits only what Linux >= 5.16 mounts: incompat CHUNKED_FILE and
 * DEVICE_TABLE, 4 KiB blocks, compact and extended inodes, layouts
 * FLAT_PLAIN, FLAT_INLINE and CHUNK_BASED with 8-byte chunk indexes;
 * native layers also COMPRESSED_COMPACT and COMPRESSED_FULL.
 */
#ifndef FERRY_EROFS_FS_H
#define FERRY_EROFS_FS_H

#include <stdint.h>

#define EROFS_SUPER_MAGIC 0xE0F5E1E2u
#define EROFS_SUPER_OFFSET 1024
#define EROFS_BLKSIZ_BITS 12
#define EROFS_BLKSIZ (1u << EROFS_BLKSIZ_BITS)
#define EROFS_SLOT_SIZE 32 /* NID unit: byte offset = meta_blkaddr * bs + nid * 32 */
#define EROFS_NAME_LEN 255

#define EROFS_FEATURE_COMPAT_SB_CHKSUM 0x00000001u
#define EROFS_FEATURE_COMPAT_MTIME 0x00000002u
/* Compressed data right-aligned in its pcluster (leading zeros skipped). */
#define EROFS_FEATURE_INCOMPAT_ZERO_PADDING 0x00000001u
/* Per-algorithm configs after the superblock, u1 = the algorithms' bitmap;
 * also big (multi-block) pclusters. */
#define EROFS_FEATURE_INCOMPAT_COMPR_CFGS 0x00000002u
#define EROFS_FEATURE_INCOMPAT_CHUNKED_FILE 0x00000004u
#define EROFS_FEATURE_INCOMPAT_DEVICE_TABLE 0x00000008u
/* Whole files or tails stored in the packed inode (packed_nid), 6.1+. */
#define EROFS_FEATURE_INCOMPAT_FRAGMENTS 0x00000020u
/* The incompat bits of ferry's images (bootstraps)... */
#define EROFS_FEATURE_INCOMPAT_FERRY                                           \
	(EROFS_FEATURE_INCOMPAT_CHUNKED_FILE | EROFS_FEATURE_INCOMPAT_DEVICE_TABLE)
/* ...and the only ones its reader accepts (native layers compress). */
#define EROFS_FEATURE_INCOMPAT_READ                                            \
	(EROFS_FEATURE_INCOMPAT_FERRY | EROFS_FEATURE_INCOMPAT_ZERO_PADDING | \
	 EROFS_FEATURE_INCOMPAT_COMPR_CFGS | EROFS_FEATURE_INCOMPAT_FRAGMENTS)

/* Superblock: 128 bytes at byte 1024 of the primary device. */
struct erofs_super_block {
	uint32_t magic;            /* 0x00 */
	uint32_t checksum;         /* 0x04 crc32c, see docs/FORMAT.md */
	uint32_t feature_compat;   /* 0x08 */
	uint8_t blkszbits;         /* 0x0C */
	uint8_t sb_extslots;       /* 0x0D */
	uint16_t root_nid;         /* 0x0E */
	uint64_t inos;             /* 0x10 */
	uint64_t epoch;            /* 0x18 compact inodes' mtime seconds */
	uint32_t fixed_nsec;       /* 0x20 compact inodes' mtime nanoseconds */
	uint32_t blocks;           /* 0x24 */
	uint32_t meta_blkaddr;     /* 0x28 */
	uint32_t xattr_blkaddr;    /* 0x2C */
	uint8_t uuid[16];          /* 0x30 */
	uint8_t volume_name[16];   /* 0x40 */
	uint32_t feature_incompat; /* 0x50 */
	uint16_t u1;               /* 0x54 must be 0: no compression */
	uint16_t extra_devices;    /* 0x56 */
	uint16_t devt_slotoff;     /* 0x58 device table at devt_slotoff * 128 */
	uint8_t dirblkbits;        /* 0x5A must be 0 */
	uint8_t xattr_prefix_count; /* 0x5B 0: no long xattr prefixes */
	uint32_t xattr_prefix_start; /* 0x5C */
	uint64_t packed_nid;       /* 0x60 the packed inode, with FRAGMENTS */
	uint8_t reserved[24];      /* 0x68 */
} __attribute__((packed));
_Static_assert(sizeof(struct erofs_super_block) == 128, "erofs sb size");

#define EROFS_SB_MAGIC 0x00
#define EROFS_SB_CHECKSUM 0x04
#define EROFS_SB_FEATURE_COMPAT 0x08
#define EROFS_SB_BLKSZBITS 0x0C
#define EROFS_SB_EXTSLOTS 0x0D
#define EROFS_SB_ROOT_NID 0x0E
#define EROFS_SB_INOS 0x10
#define EROFS_SB_EPOCH 0x18
#define EROFS_SB_FIXED_NSEC 0x20
#define EROFS_SB_BLOCKS 0x24
#define EROFS_SB_META_BLKADDR 0x28
#define EROFS_SB_XATTR_BLKADDR 0x2C
#define EROFS_SB_UUID 0x30
#define EROFS_SB_VOLUME_NAME 0x40
#define EROFS_SB_FEATURE_INCOMPAT 0x50
#define EROFS_SB_U1 0x54
#define EROFS_SB_EXTRA_DEVICES 0x56
#define EROFS_SB_DEVT_SLOTOFF 0x58
#define EROFS_SB_DIRBLKBITS 0x5A
#define EROFS_SB_PACKED_NID 0x60
#define EROFS_SB_SIZE 128

/* Device table slot: 128 bytes, slot i describes device_id i + 1. */
struct erofs_deviceslot {
	uint8_t tag[64];    /* 0x00 ferry: the blob's sha256 as 64 hex digits */
	uint32_t blocks;    /* 0x40 device size in blocks */
	uint32_t uniaddr;   /* 0x44 first block in the unified (flat) address space */
	uint8_t reserved[56];
} __attribute__((packed));
_Static_assert(sizeof(struct erofs_deviceslot) == 128, "erofs devslot size");

#define EROFS_DEVT_SLOT_SIZE 128
#define EROFS_DEVT_TAG 0x00
#define EROFS_DEVT_TAG_LEN 64
#define EROFS_DEVT_BLOCKS 0x40
#define EROFS_DEVT_UNIADDR 0x44

/* i_format: bit 0 version, bits 1-3 data layout; other bits must be 0. */
#define EROFS_I_VERSION_MASK 0x1
#define EROFS_I_VERSION_COMPACT 0
#define EROFS_I_VERSION_EXTENDED 1
#define EROFS_I_DATALAYOUT_SHIFT 1
#define EROFS_I_DATALAYOUT_MASK 0x7
#define EROFS_I_ALL_BITS 0xF /* kernels before 6.15 reject anything above */

enum erofs_datalayout {
	EROFS_INODE_FLAT_PLAIN = 0,
	EROFS_INODE_COMPRESSED_FULL = 1, /* i_u: compressed blocks */
	EROFS_INODE_FLAT_INLINE = 2,
	EROFS_INODE_COMPRESSED_COMPACT = 3, /* i_u: compressed blocks */
	EROFS_INODE_CHUNK_BASED = 4,
};

/* Compact inode: 32 bytes. */
struct erofs_inode_compact {
	uint16_t i_format;       /* 0x00 */
	uint16_t i_xattr_icount; /* 0x02 */
	uint16_t i_mode;         /* 0x04 */
	uint16_t i_nlink;        /* 0x06 */
	uint32_t i_size;         /* 0x08 */
	uint32_t i_mtime;        /* 0x0C ferry writes 0: mtime is sb epoch */
	uint32_t i_u;            /* 0x10 startblk / rdev / chunk format */
	uint32_t i_ino;          /* 0x14 */
	uint16_t i_uid;          /* 0x18 */
	uint16_t i_gid;          /* 0x1A */
	uint32_t i_reserved;     /* 0x1C */
} __attribute__((packed));
_Static_assert(sizeof(struct erofs_inode_compact) == 32, "compact inode");

/* Extended inode: 64 bytes. */
struct erofs_inode_extended {
	uint16_t i_format;       /* 0x00 */
	uint16_t i_xattr_icount; /* 0x02 */
	uint16_t i_mode;         /* 0x04 */
	uint16_t i_reserved;     /* 0x06 */
	uint64_t i_size;         /* 0x08 */
	uint32_t i_u;            /* 0x10 */
	uint32_t i_ino;          /* 0x14 */
	uint32_t i_uid;          /* 0x18 */
	uint32_t i_gid;          /* 0x1C */
	uint64_t i_mtime;        /* 0x20 seconds (signed) */
	uint32_t i_mtime_nsec;   /* 0x28 */
	uint32_t i_nlink;        /* 0x2C */
	uint8_t i_reserved2[16]; /* 0x30 */
} __attribute__((packed));
_Static_assert(sizeof(struct erofs_inode_extended) == 64, "extended inode");

#define EROFS_I_FORMAT 0x00
#define EROFS_I_XATTR_ICOUNT 0x02
#define EROFS_I_MODE 0x04
#define EROFS_IC_NLINK 0x06
#define EROFS_IC_SIZE 0x08
#define EROFS_IC_MTIME 0x0C
#define EROFS_I_U 0x10
#define EROFS_I_INO 0x14
#define EROFS_IC_UID 0x18
#define EROFS_IC_GID 0x1A
#define EROFS_IE_SIZE 0x08
#define EROFS_IE_UID 0x18
#define EROFS_IE_GID 0x1C
#define EROFS_IE_MTIME 0x20
#define EROFS_IE_MTIME_NSEC 0x28
#define EROFS_IE_NLINK 0x2C
#define EROFS_INODE_COMPACT_SIZE 32
#define EROFS_INODE_EXTENDED_SIZE 64

/* Chunk-based i_u: bits 0-4 chunkbits (chunk = bs << chunkbits), bit 5 indexes. */
#define EROFS_CHUNK_FORMAT_BLKBITS_MASK 0x1F
#define EROFS_CHUNK_FORMAT_INDEXES 0x20
#define EROFS_CHUNK_FORMAT_ALL 0x3F

/* 8-byte chunk index, aligned to 8 after inode + inline xattrs. */
struct erofs_inode_chunk_index {
	uint16_t startblk_hi; /* 0x00 write 0 (only read with 48-bit layout) */
	uint16_t device_id;   /* 0x02 0 = primary, N = device table slot N - 1 */
	uint32_t startblk_lo; /* 0x04 block on that device; ~0 = hole */
} __attribute__((packed));
_Static_assert(sizeof(struct erofs_inode_chunk_index) == 8, "chunk index");

#define EROFS_CHUNK_INDEX_SIZE 8
#define EROFS_CHUNK_INDEX_DEVICE_ID 0x02
#define EROFS_CHUNK_INDEX_STARTBLK 0x04
#define EROFS_NULL_ADDR 0xFFFFFFFFu

/*
 * Compressed files (fixed-size output: each extent of the file compresses
 * into one pcluster). The 8-byte map header sits at ALIGN(inode + inline
 * xattrs, 8); full indexes follow it after 8 reserved bytes, one per
 * lcluster (2^(blkszbits + h_clusterbits) bytes of the file); compact
 * indexes follow it directly (see Z_EROFS_COMPACT_*).
 */
struct z_erofs_map_header {
	uint32_t h_fragmentoff;  /* 0x00 0 without fragments */
	uint16_t h_advise;       /* 0x04 Z_EROFS_ADVISE_*: 0 = 1-block pclusters */
	uint8_t h_algorithmtype; /* 0x06 HEAD1 algorithm (low nibble), HEAD2 (high) */
	uint8_t h_clusterbits;   /* 0x07 lclusterbits - blkszbits (bits 0-2) */
} __attribute__((packed));
_Static_assert(sizeof(struct z_erofs_map_header) == 8, "z map header");
#define Z_EROFS_MAP_HEADER_SIZE 8
#define Z_EROFS_FULL_INDEX_PAD 8 /* after the map header */
#define Z_EROFS_MAP_H_ADVISE 0x04
#define Z_EROFS_MAP_H_ALGORITHMTYPE 0x06
#define Z_EROFS_MAP_H_CLUSTERBITS 0x07
/*
 * A file stored whole in the packed inode: the header read as le64 has
 * bit 63 set (h_clusterbits bit 7) and the file's offset in the packed
 * inode's data below it; no indexes are read.
 */
#define Z_EROFS_FRAGMENT_INODE (1ull << 63)
/* Compact indexes: 2-byte packs of 16 lclusters in the middle. */
#define Z_EROFS_ADVISE_COMPACTED_2B 0x0001
/* Both set: pclusters of several blocks, counted on the first NONHEAD. */
#define Z_EROFS_ADVISE_BIG_PCLUSTER_1 0x0002
#define Z_EROFS_ADVISE_BIG_PCLUSTER_2 0x0004
#define Z_EROFS_COMPRESSION_LZ4 0
#define Z_EROFS_COMPRESSION_LZMA 1    /* MicroLZMA, Linux 5.16 */
#define Z_EROFS_COMPRESSION_DEFLATE 2 /* raw deflate, Linux 6.6 */
#define Z_EROFS_COMPRESSION_ZSTD 3
#define Z_EROFS_PCLUSTER_MAX_BLOCKS 256 /* 1 MiB */

/*
 * COMPR_CFGS records, from byte 1024 + 128 (4-aligned): le16 length, then
 * one record per algorithm of the u1 bitmap in ascending order.
 * lz4: le16 max_distance (0 = 64 KiB), le16 max_pclusterblks, 10 reserved;
 * lzma: le32 dict_size (4 KiB..8 MiB), le16 format (0), 8 reserved;
 * deflate: u8 windowbits (8..15), 5 reserved;
 * zstd: u8 format (0), u8 windowlog - 10, 4 reserved.
 */
#define Z_EROFS_LZ4_CFGS_SIZE 14
#define Z_EROFS_LZ4_CFGS_MAX_PCLUSTERBLKS 2
#define Z_EROFS_LZMA_CFGS_SIZE 14
#define Z_EROFS_LZMA_CFGS_DICT_SIZE 0
#define Z_EROFS_DEFLATE_CFGS_SIZE 6
#define Z_EROFS_DEFLATE_CFGS_WINDOWBITS 0
#define Z_EROFS_ZSTD_CFGS_SIZE 6
#define Z_EROFS_ZSTD_CFGS_WINDOWLOG 1

/* Full lcluster index: di_advise type bits, clusterofs, blkaddr or deltas. */
struct z_erofs_lcluster_index {
	uint16_t di_advise;     /* 0x00 bits 0-1: Z_EROFS_LCLUSTER_TYPE_* */
	uint16_t di_clusterofs; /* 0x02 where the extent starts in a HEAD lcluster */
	union {
		uint32_t blkaddr;   /* 0x04 HEAD / PLAIN: the pcluster */
		uint16_t delta[2];  /* 0x04 NONHEAD: lclusters back to the head, on to the next */
	} di_u;
} __attribute__((packed));
_Static_assert(sizeof(struct z_erofs_lcluster_index) == 8, "lcluster index");
#define Z_EROFS_LCLUSTER_INDEX_SIZE 8
#define Z_EROFS_LI_ADVISE 0x00
#define Z_EROFS_LI_CLUSTEROFS 0x02
#define Z_EROFS_LI_BLKADDR 0x04
#define Z_EROFS_LI_DELTA0 0x04
#define Z_EROFS_LI_DELTA1 0x06
#define Z_EROFS_LI_D0_CBLKCNT (1u << 11) /* first NONHEAD: pcluster blocks */
enum {
	Z_EROFS_LCLUSTER_TYPE_PLAIN = 0,   /* pcluster stored uncompressed */
	Z_EROFS_LCLUSTER_TYPE_HEAD1 = 1,   /* extent starts here, algorithm 1 */
	Z_EROFS_LCLUSTER_TYPE_NONHEAD = 2, /* inside an extent */
};

/*
 * Compact indexes (COMPRESSED_COMPACT, Linux fs/erofs/zmap.c
 * z_erofs_load_compact_lcluster), from ebase = the end of the map header:
 * packs of 2 lclusters in 8 bytes up to a 32-byte boundary
 * (((32 - ebase % 32) / 4) & 7 lclusters), then, with COMPACTED_2B, packs
 * of 16 in 32 bytes for as many whole packs as the rest fills, then packs
 * of 2 again (a lone last lcluster padded with a zero entry). A pack
 * is vcnt entries of (size - 4) * 8 / vcnt bits from bit 0 up, each the
 * lcluster type << 12 | 12 bits: clusterofs of a head, delta[0] or CBLKCNT
 * of a NONHEAD, but delta[1] for a NONHEAD ending the pack; then a le32
 * block address: a head's pcluster is there plus the blocks the entries
 * before it in the pack count (a PLAIN head 1, a CBLKCNT its blocks and
 * its head none, a pcluster whose CBLKCNT lies before the pack none).
 */
#define Z_EROFS_COMPACT_LOBITS 12
#define Z_EROFS_COMPACT_4B_VCNT 2
#define Z_EROFS_COMPACT_4B_SIZE 8
#define Z_EROFS_COMPACT_2B_VCNT 16
#define Z_EROFS_COMPACT_2B_SIZE 32
/* With 4 KiB lclusters an entry's low bits are the 12 a CBLKCNT needs... */
_Static_assert(Z_EROFS_LI_D0_CBLKCNT == 1u << (Z_EROFS_COMPACT_LOBITS - 1) &&
		       EROFS_BLKSIZ_BITS <= Z_EROFS_COMPACT_LOBITS,
	       "compact lobits");
/* ...and the type above them fits in both kinds of pack. */
_Static_assert((Z_EROFS_COMPACT_2B_SIZE - 4) * 8 / Z_EROFS_COMPACT_2B_VCNT >=
			       Z_EROFS_COMPACT_LOBITS + 2 &&
		       (Z_EROFS_COMPACT_4B_SIZE - 4) * 8 / Z_EROFS_COMPACT_4B_VCNT >=
			       Z_EROFS_COMPACT_LOBITS + 2,
	       "compact entry bits");

/* Inline xattr region: 12-byte header, shared ids, then entries. */
struct erofs_xattr_ibody_header {
	uint32_t h_name_filter; /* 0x00 ferry writes 0 (filter feature off) */
	uint8_t h_shared_count; /* 0x04 */
	uint8_t h_reserved[7];
} __attribute__((packed));
_Static_assert(sizeof(struct erofs_xattr_ibody_header) == 12, "xattr hdr");

/* Xattr entry: 4 bytes, then name (without prefix) and value, padded to 4. */
struct erofs_xattr_entry {
	uint8_t e_name_len;
	uint8_t e_name_index;
	uint16_t e_value_size;
} __attribute__((packed));
_Static_assert(sizeof(struct erofs_xattr_entry) == 4, "xattr entry");

#define EROFS_XATTR_IBODY_HEADER_SIZE 12
#define EROFS_XATTR_ENTRY_SIZE 4
#define EROFS_XATTR_ALIGN(x) (((x) + 3u) & ~3u)
/* Inline region bytes for an i_xattr_icount value. */
#define EROFS_XATTR_IBODY_SIZE(icount)                                        \
	((icount) ? 12u + 4u * ((uint32_t)(icount) - 1u) : 0u)

enum erofs_xattr_index {
	EROFS_XATTR_INDEX_USER = 1,
	EROFS_XATTR_INDEX_POSIX_ACL_ACCESS = 2,
	EROFS_XATTR_INDEX_POSIX_ACL_DEFAULT = 3,
	EROFS_XATTR_INDEX_TRUSTED = 4,
	EROFS_XATTR_INDEX_SECURITY = 6,
};

/* Directory entry: 12 bytes; names follow the entry array in each block. */
struct erofs_dirent {
	uint64_t nid;
	uint16_t nameoff;
	uint8_t file_type;
	uint8_t reserved;
} __attribute__((packed));
_Static_assert(sizeof(struct erofs_dirent) == 12, "erofs dirent");

#define EROFS_DIRENT_SIZE 12
#define EROFS_DIRENT_NID 0x00
#define EROFS_DIRENT_NAMEOFF 0x08
#define EROFS_DIRENT_FILE_TYPE 0x0A

enum erofs_file_type {
	EROFS_FT_UNKNOWN = 0,
	EROFS_FT_REG_FILE = 1,
	EROFS_FT_DIR = 2,
	EROFS_FT_CHRDEV = 3,
	EROFS_FT_BLKDEV = 4,
	EROFS_FT_FIFO = 5,
	EROFS_FT_SOCK = 6,
	EROFS_FT_SYMLINK = 7,
	EROFS_FT_MAX = 8,
};

/*
 * ferry preamble: bytes 0..63 of the bootstrap, which EROFS leaves unused
 * (the superblock starts at 1024). It locates ferry's extension region, a
 * block-aligned run of blocks after all EROFS metadata that no inode
 * references, so the kernel and fsck.erofs never look at it.
 */
#define FERRY_PREAMBLE_SIZE 64 /* magic and version: META_PREAMBLE_* (meta.h) */
#define FERRY_PRE_MAGIC 0x00    /* 8 bytes */
#define FERRY_PRE_VERSION 0x08  /* u32 */
#define FERRY_PRE_EXT_OFF 0x10  /* u64 byte offset, block-aligned */
#define FERRY_PRE_EXT_LEN 0x18  /* u64 payload length */
#define FERRY_PRE_EXT_CRC 0x20  /* u32 crc32c (erofs convention) of payload */
/*
 * The section area (ferry 0.5.0 on): framed, skippable sections right
 * after the payload. Readers before it never look past the payload, so
 * to them every section is invisible; 0 when there is none.
 */
#define FERRY_PRE_SEC_LEN 0x24  /* u64 bytes of the section area */
#define FERRY_PRE_SEC_CRC 0x2C  /* u32 crc32c of the section area */
#define FERRY_PRE_CRC 0x3C      /* u32 crc32c of bytes 0..0x3B */

#endif
