/* SPDX-License-Identifier: MIT */
/*
 * Private to the EROFS writer: writer.c (the layout and the image) and
 * writer_xattr.c (extended attributes).
 */
#ifndef FERRY_META_WRITER_H
#define FERRY_META_WRITER_H

#include <openssl/evp.h>

#include "erofs_fs.h"
#include "meta.h"

#define BLK EROFS_BLKSIZ
#define DEVT_SLOTOFF 9 /* right after the 128-byte superblock */
#define DEVT_OFFSET (DEVT_SLOTOFF * EROFS_DEVT_SLOT_SIZE)
/* Chunks of at most 2 GiB keep chunk arithmetic within 32 bits everywhere. */
#define MAX_CHUNK_BITS (31 - EROFS_BLKSIZ_BITS)
#define MAX_SHARED_PER_INODE 255 /* h_shared_count is 8 bits */
#define XATTR_IBODY_MAX EROFS_XATTR_IBODY_SIZE(0xFFFFu)
#define STREAM_BUF (1u << 20)
#define PATH_BUF 4096

enum wr_kind {
	KIND_FLAT,    /* data in the bootstrap: FLAT_PLAIN or FLAT_INLINE */
	KIND_CHUNKED, /* CHUNK_BASED with 8-byte indexes */
	KIND_SPECIAL, /* devices, fifos, sockets: no data */
};

struct wr_inode {
	struct meta_inode *inode;
	const struct meta_dentry *name; /* dentry that first reached it */
	uint32_t parent;                /* index of that dentry's directory */
	uint32_t nlink;
	uint64_t size;      /* i_size; generated for directories */
	uint64_t pos;       /* byte offset of the inode: nid * 32 */
	uint64_t nr_chunks; /* KIND_CHUNKED */
	size_t ents;        /* directories: first sorted entry in w->ents */
	uint32_t nr_ents;
	uint32_t xattrs;     /* first of inode->nr_xattrs entries in w->xattrs */
	uint32_t xattr_size; /* inline xattr region, 0 or 12 + 4 * (icount - 1) */
	uint32_t tail;       /* data bytes inline after the xattrs */
	uint64_t nr_blocks;  /* KIND_FLAT: blocks in the data area */
	uint32_t i_u;
	uint8_t kind, layout, nr_shared;
	bool extended;
	bool embedded; /* FLAT_PLAIN in the embedded data */
	bool compressed; /* embedded, COMPRESSED_COMPACT or _FULL */
	bool fragment;   /* whole in the packed inode: map header only */
	uint32_t zblocks; /* compressed: its pclusters' blocks (i_u) */
};

struct wr_xattr {
	const char *suffix; /* name without its EROFS prefix */
	const uint8_t *value;
	uint32_t value_len;
	uint32_t shared_id; /* valid when shared */
	uint8_t index;      /* EROFS name index */
	uint8_t suffix_len;
	bool shared;
};

struct writer {
	const struct meta_write_opts *opts;
	int fd;

	struct wr_inode *inodes; /* breadth-first; [0] is the root */
	uint32_t nr_inodes, cap_inodes;
	const struct meta_dentry **ents; /* per directory, sorted, with . and .. */
	size_t nr_ents, cap_ents;
	struct meta_dentry *dot, *dotdot; /* inode NULL: resolved per directory */

	struct wr_xattr *xattrs;
	const struct wr_xattr **shared; /* one per shared entry, by id */
	uint32_t nr_shared;
	uint64_t shared_bytes;

	uint64_t epoch;
	uint32_t fixed_nsec;
	bool chunked, compressed, fragments;
	uint16_t zalgs;          /* bitmap of compression algorithms used */
	uint16_t max_pclusterblks;
	uint32_t zcfgs_size;     /* COMPR_CFGS records after the superblock */
	uint32_t xattr_blkaddr, data_blkaddr, embed_blkaddr, ext_blkaddr;
	uint32_t total_blocks;

	uint8_t *meta; /* bytes [0, data_blkaddr * BLK) */
	uint8_t block[BLK];

	uint8_t *buf; /* data area and ext region, streamed */
	size_t buf_len;
	uint64_t buf_off;
	EVP_MD_CTX *sha;
};

/* "/a/b" for @wi, shortened from the left to fit @size. */
const char *wr_path(const struct writer *w, const struct wr_inode *wi, char *buf,
		    size_t size);
/* Log that @wi cannot be written, and why; returns @err. */
__attribute__((format(printf, 4, 5)))
int wr_fail(const struct writer *w, const struct wr_inode *wi, int err, const char *fmt, ...);

/* writer_xattr.c: every inode's xattrs into w->xattrs and the shared area. */
int wr_xattrs(struct writer *w);
/* One xattr entry at @p: its size. */
uint32_t xattr_put_entry(uint8_t *p, const struct wr_xattr *x);

#endif
