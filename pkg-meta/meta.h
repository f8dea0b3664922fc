/* SPDX-License-Identifier: MIT */
/*
 * pkg-meta: the EROFS metadata blob ("bootstrap") — an in-memory tree, the
 * writer that serialises it into an image the Linux kernel mounts, the
 * reader that serves it back, and the kernel mount call.
 *
 * No network, no codec: the compressed files of standalone images come
 * compressed (meta_zextent_put lays them out). File data lives either inside the bootstrap
 * (directories, symlinks, small "inline" regular files) or in external
 * devices (blobs) addressed by chunk indexes; this module only records the
 * (device_id, block) pairs it is given. A standalone image (a native
 * container layer) embeds its files' data instead. ferry's own per-image data (the
 * blob tables, see pkg-blob) travels in the bootstrap as an opaque
 * "extension" payload, followed by an opaque section area (pkg-image
 * frames its sections), that the kernel never reads.
 *
 * Errors: functions return 0 (or a count) on success and a negative errno
 * on failure; corrupt images give -EFSCORRUPTED with a log line naming the
 * inode or block. Thread-safety: a meta_tree belongs to one thread; a
 * meta_image is immutable after open and safe to read from many threads.
 */
#ifndef FERRY_META_H
#define FERRY_META_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define META_BLOCK_SIZE 4096u
/* The ferry preamble (docs/FORMAT.md 2.3): magic, and the version written and read. */
#define META_PREAMBLE_MAGIC "FERRYBS1"
#define META_PREAMBLE_VERSION 1u
#define META_MAX_DEVICES 1024u /* blobs per image */
#define META_NAME_MAX 255u
#define META_SYMLINK_MAX 4095u /* a target's bytes: PATH_MAX - 1, what readlink can return */
#define META_XATTR_VALUE_MAX 65535u /* e_value_size is 16 bits */

/* ------------------------------------------------------------------ */
/* In-memory tree                                                      */
/* ------------------------------------------------------------------ */

struct meta_xattr {
	char *name;        /* full name, e.g. "user.foo", NUL-terminated */
	uint8_t *value;
	uint32_t value_len;
};

/* One extent of a compressed file (meta_inode.zextents). */
struct meta_zextent {
	uint32_t lcn;     /* first 4 KiB logical cluster */
	uint32_t blkaddr; /* its first block in the embedded data */
	uint16_t blocks;  /* its pcluster's blocks (1 when plain) */
	bool plain;       /* stored uncompressed (at most 4 KiB of data) */
};

/* The kernel's numbers for the algorithms of compressed files. */
enum meta_zalgorithm {
	META_Z_LZ4 = 0,
	META_Z_LZMA = 1,    /* MicroLZMA, dictionary META_ZPACK_EXTENT_MAX */
	META_Z_DEFLATE = 2, /* raw deflate, 32 KiB window */
	META_Z_ZSTD = 3,
};
#define META_ZPACK_EXTENT_MAX (1u << 20) /* input per extent: 1 pcluster */

/* Where one chunk of a chunk-based regular file lives. */
struct meta_chunk {
	uint16_t device_id; /* 1..nr_devices; 0 only for holes */
	uint32_t blkaddr;   /* block on that device; META_CHUNK_HOLE = zeros */
};
#define META_CHUNK_HOLE 0xFFFFFFFFu

struct meta_dentry;

struct meta_inode {
	uint32_t mode; /* S_IFMT | permission bits (incl. suid/sgid/sticky) */
	uint32_t uid, gid;
	int64_t mtime;
	uint32_t mtime_nsec;
	uint32_t rdev_major, rdev_minor; /* S_IFCHR / S_IFBLK */
	uint64_t size;                   /* regular files and symlinks */

	struct meta_xattr *xattrs; /* owned; names unique */
	uint32_t nr_xattrs;

	/*
	 * Data kept in the bootstrap: a symlink's target, or a regular
	 * file's bytes when it is stored inline (size bytes, owned).
	 * Directories generate their own data.
	 */
	uint8_t *data;

	/*
	 * Chunk-based regular file: nr_chunks == DIV_ROUND_UP(size,
	 * 4096 << chunk_bits) entries (owned). data must be NULL.
	 */
	uint8_t chunk_bits;
	struct meta_chunk *chunks;

	/*
	 * Regular file whose bytes are in the image itself: DIV_ROUND_UP(size,
	 * 4096) blocks from block @embedded_blkaddr of the embedded data
	 * (meta_write_opts.embedded), written FLAT_PLAIN. data and chunks
	 * must be NULL.
	 */
	bool embedded;
	uint32_t embedded_blkaddr;
	/*
	 * An embedded file stored compressed (LZ4, EROFS fixed-size output):
	 * extent k covers lclusters [zextents[k].lcn, zextents[k + 1].lcn)
	 * (the last to the end of the file), compressed into the one block
	 * zextents[k].blkaddr of the embedded data, or stored there as is
	 * when plain. zextents[0].lcn is 0; NULL = not compressed.
	 */
	struct meta_zextent *zextents;
	uint32_t nr_zextents;
	uint8_t zalgorithm; /* enum meta_zalgorithm */
	/*
	 * A regular file stored whole as a fragment: its size bytes at
	 * @fragment_off of the packed inode's data (meta_write_opts.packed;
	 * EROFS FRAGMENTS, Linux 6.1+). data, chunks and embedded unset.
	 */
	bool fragment;
	uint64_t fragment_off;

	/*
	 * Directories: children (owned dentries) in insertion order, except
	 * that unlink moves the last child into the freed slot (O(1)).
	 */
	struct meta_dentry **children;
	uint32_t nr_children, children_cap;
	void *child_index; /* private lookup index */

	/* Private to the tree and writer. */
	uint32_t links;  /* dentries pointing here */
	uint64_t nid;
	uint64_t order;
	void *wpriv;
};

struct meta_dentry {
	struct meta_inode *inode;
	uint16_t name_len;
	char name[]; /* NUL-terminated for convenience; length is name_len */
};

struct meta_tree {
	struct meta_inode *root;
	void *priv;
};

/* A new tree whose root is a directory 0755 owned by 0:0, mtime 0. */
int meta_tree_new(struct meta_tree **out);
void meta_tree_free(struct meta_tree *t);

/* A new unlinked inode of @mode; it belongs to @t and is freed with it. */
int meta_inode_new(struct meta_tree *t, uint32_t mode, struct meta_inode **out);

/* Add or replace (same name) an xattr; copies name and value. */
int meta_inode_set_xattr(struct meta_inode *inode, const char *name,
			 const void *value, uint32_t value_len);
/* Remove all xattrs. */
void meta_inode_clear_xattrs(struct meta_inode *inode);

/* Child of directory @dir named @name (not "." or ".."), or NULL. */
struct meta_inode *meta_dir_lookup(const struct meta_inode *dir,
				   const char *name, size_t len);

/*
 * Link @inode into @dir as @name. An existing entry of that name is
 * replaced (and its subtree dropped if no other link holds it). Returns
 * -EINVAL for an invalid name ("", ".", "..", '/' or NUL inside, or longer
 * than 255 bytes), -ENOTDIR if @dir is not a directory, -EMLINK if @inode
 * is a directory that already has a parent.
 */
int meta_dir_link(struct meta_tree *t, struct meta_inode *dir, const char *name,
		  size_t len, struct meta_inode *inode);

/* Remove @name from @dir; -ENOENT if absent. */
int meta_dir_unlink(struct meta_tree *t, struct meta_inode *dir,
		    const char *name, size_t len);

/* Remove every entry of @dir (opaque-directory semantics). */
void meta_dir_clear(struct meta_tree *t, struct meta_inode *dir);

/* ------------------------------------------------------------------ */
/* Writer                                                              */
/* ------------------------------------------------------------------ */

struct meta_device {
	char tag[64];    /* exactly 64 bytes, e.g. the blob digest in hex */
	uint32_t blocks; /* device size in 4 KiB blocks */
};

/* File data stored in the image: @blocks blocks read from @fd at offset 0. */
struct meta_embedded {
	int fd;
	uint32_t blocks;
};

struct meta_write_opts {
	const struct meta_device *devices; /* device_id i+1 = devices[i] */
	uint32_t nr_devices;
	const void *ext;   /* ferry extension payload, may be NULL */
	size_t ext_len;
	/* The section area, written right after the payload; may be NULL. */
	const void *sections;
	size_t sections_len;
	const char *volume_name; /* <= 15 bytes; NULL = "ferry" */
	/*
	 * A plain EROFS image for other readers (a native container layer):
	 * no ferry preamble and no extension payload (ext must be NULL).
	 */
	bool standalone;
	/* Data of the inodes marked embedded, copied in after the metadata. */
	const struct meta_embedded *embedded;
	/* The superblock uuid; NULL = derived from a hash of the image. */
	const uint8_t *uuid; /* 16 bytes */
	/*
	 * The packed inode holding the fragments (a regular file of the tree
	 * made by meta_inode_new but linked nowhere, embedded, usually
	 * compressed); required when an inode is a fragment.
	 */
	struct meta_inode *packed;
};

struct meta_write_stats {
	uint64_t bytes;          /* bootstrap size */
	uint64_t inodes;
	uint64_t compact_inodes;
	uint64_t extended_inodes;
	uint64_t shared_xattrs;
	uint32_t embedded_blkaddr; /* where the embedded data starts */
};

/*
 * Serialise @t into @fd (from offset 0; the file is truncated to the image
 * size). Output is a deterministic function of the tree and options: the
 * same input gives identical bytes. Fails with -EINVAL and a log line
 * naming the path if the tree cannot be represented (xattr name without a
 * known prefix, value over 65535 bytes, device_id out of range, ...).
 */
int meta_write(struct meta_tree *t, const struct meta_write_opts *opts, int fd,
	       struct meta_write_stats *stats);

/*
 * Lay out one extent of a compressed file: @len bytes of it at @raw (its
 * lclusters from @lcn on; a multiple of 4096 except at the file's end, at
 * most META_ZPACK_EXTENT_MAX) and their compressed form, @z bytes at
 * @zdata (0: none), as the blocks from embedded data block @blkaddr on,
 * written to @out (room for the input's blocks; @out may be @raw): one
 * pcluster when that saves a block, else the input plain, one lcluster
 * per block. The extents go to @ext (room for one per lcluster) and their
 * count to *@nr_ext; returns the blocks used.
 */
uint32_t meta_zextent_put(const uint8_t *raw, size_t len, const uint8_t *zdata,
			  size_t z, uint32_t lcn, uint32_t blkaddr,
			  uint8_t *out, struct meta_zextent *ext,
			  uint32_t *nr_ext);

/* ------------------------------------------------------------------ */
/* Reader                                                              */
/* ------------------------------------------------------------------ */

struct meta_image;

/*
 * Open a bootstrap file (mapped read-only) or a caller-owned buffer that
 * must outlive the image. Validates the superblock, device table and
 * preamble; inodes are validated when first touched.
 */
int meta_image_open(const char *path, struct meta_image **out);
int meta_image_open_mem(const void *buf, size_t len, struct meta_image **out);
/*
 * The first @len bytes of an image of @image_len bytes (a lazily fetched
 * layer's metadata): every metadata structure must lie in them (one
 * beyond is corrupt, never read), data blocks within @image_len.
 */
int meta_image_open_head(const void *buf, size_t len, uint64_t image_len,
			 struct meta_image **out);
void meta_image_close(struct meta_image *img);

struct meta_super {
	uint64_t root_nid;
	uint64_t inos;
	uint64_t epoch;
	uint32_t fixed_nsec;
	uint32_t blocks;
	uint32_t feature_compat, feature_incompat;
	uint32_t nr_devices;
	uint8_t uuid[16];
	char volume_name[17];
	uint64_t image_bytes;
	uint64_t packed_nid; /* the inode holding fragments (meta_getattr), 0: none */
};
void meta_get_super(const struct meta_image *img, struct meta_super *sb);

struct meta_device_info {
	char tag[65]; /* NUL-terminated */
	uint32_t blocks;
	uint32_t uniaddr;
};
/* @device_id is 1-based, as in chunk indexes. */
int meta_get_device(const struct meta_image *img, uint32_t device_id,
		    struct meta_device_info *out);

/* The extension payload (borrowed, valid while @img is open); crc-checked. */
int meta_get_ext(const struct meta_image *img, const void **ext, size_t *len);
/*
 * The section area after the payload (borrowed, crc-checked), or NULL and
 * 0 when the image has none.
 */
void meta_get_sections(const struct meta_image *img, const void **sections,
		       size_t *len);

struct meta_stat {
	uint64_t nid;
	uint32_t mode, uid, gid, nlink;
	uint64_t size;
	int64_t mtime;
	uint32_t mtime_nsec;
	uint32_t rdev_major, rdev_minor;
	uint32_t ino;   /* on-disk i_ino */
	uint8_t layout; /* enum erofs_datalayout */
	bool compressed; /* a compressed layout: the kernel decompresses it */
	/* Compressed, not a fragment: the blocks its pclusters span. */
	uint32_t zblk_first, zblk_end;
	bool extended;
	uint32_t chunk_size; /* chunk-based files */
	uint64_t nr_chunks;
};
int meta_getattr(const struct meta_image *img, uint64_t nid,
		 struct meta_stat *st);

/* Look @name up in directory @dir_nid: 0 and *nid, -ENOENT, or error. */
int meta_lookup(const struct meta_image *img, uint64_t dir_nid,
		const char *name, size_t len, uint64_t *nid);

/*
 * Resolve a path (absolute or not: from the root; "." and ".." as in the
 * kernel, ".." of the root is the root; a component followed by '/' must
 * be a directory): 0 and *@nid, or -ENOENT, -ENOTDIR, -ENAMETOOLONG (paths
 * of 4096 bytes or more), another -errno. meta_resolve follows no symlink
 * (one in the middle is -ENOTDIR, one at the end is the result);
 * meta_resolve_follow follows every one, at most 40 (-ELOOP), targets
 * relative to the image root.
 */
int meta_resolve(const struct meta_image *img, const char *path, uint64_t *nid);
int meta_resolve_follow(const struct meta_image *img, const char *path,
			uint64_t *nid);

/*
 * Directory iteration including "." and "..". @pos is an opaque cookie: 0
 * starts; @fill receives the cookie of the following entry. A non-zero
 * return from @fill stops the walk and is returned (use > 0 to stop).
 */
typedef int (*meta_filldir_t)(void *ctx, const char *name, size_t len,
			      uint64_t nid, unsigned int file_type,
			      uint64_t next_pos);
int meta_readdir(const struct meta_image *img, uint64_t dir_nid, uint64_t pos,
		 meta_filldir_t fill, void *ctx);
/* The S_IFMT bits of a meta_filldir_t @file_type (0 for "unknown"). */
mode_t meta_ftype_mode(unsigned int file_type);

/*
 * Read bytes of data stored in the bootstrap (FLAT_PLAIN / FLAT_INLINE:
 * directories, symlinks, inline regular files). Returns bytes read (short
 * at EOF), -EINVAL for chunk-based files.
 */
ssize_t meta_read(const struct meta_image *img, uint64_t nid, uint64_t off,
		  void *buf, size_t len);

/* Symlink target into @buf (NUL-terminated); returns its length. */
ssize_t meta_readlink(const struct meta_image *img, uint64_t nid, char *buf,
		      size_t size);

/*
 * listxattr(2)/getxattr(2) semantics: with @size 0 return the needed
 * length; -ERANGE if @buf is too small; getxattr gives -ENODATA if absent.
 */
ssize_t meta_listxattr(const struct meta_image *img, uint64_t nid, char *buf,
		       size_t size);
ssize_t meta_getxattr(const struct meta_image *img, uint64_t nid,
		      const char *name, void *buf, size_t size);

/* Chunk @index of a chunk-based file (device_id 0 + META_CHUNK_HOLE = hole). */
int meta_get_chunk(const struct meta_image *img, uint64_t nid, uint64_t index,
		   struct meta_chunk *out);

/*
 * Visit the root and every entry below it, depth first in directory order,
 * each hardlinked inode once per link. @path is "/" or "/a/b". Directories
 * are entered once: one reached twice, or nesting deeper than
 * META_WALK_MAX_DEPTH, is -EFSCORRUPTED (hostile images cannot loop us).
 * A non-zero return from @visit stops the walk and is returned.
 */
#define META_WALK_MAX_DEPTH 2048u
typedef int (*meta_walk_fn)(void *ctx, const char *path,
			    const struct meta_stat *st);
int meta_walk(const struct meta_image *img, meta_walk_fn visit, void *ctx);

/* ------------------------------------------------------------------ */
/* Kernel mount                                                        */
/* ------------------------------------------------------------------ */

/*
 * mount(2) @bootstrap read-only on @target as a file-backed EROFS with one
 * device= option per entry of @devices (device_id order). @flags adds
 * MS_NOSUID and / or MS_NODEV (nothing else): an untrusted image needs
 * both. Calls the kernel directly: util-linux mount would silently use a
 * loop device. When the option string exceeds one page it uses
 * fsopen/fsconfig instead.
 */
int meta_kernel_mount(const char *bootstrap, const char *const *devices,
		      uint32_t nr_devices, const char *target,
		      unsigned long flags);

/*
 * A detached read-only file-backed EROFS mount of the standalone image
 * @image (no devices), not attached anywhere (fsopen/fsmount): its
 * descriptor in *@mnt_fd, usable as a path ("/proc/self/fd/N", e.g. an
 * overlayfs lowerdir) or attached with meta_mount_attach. @flags as for
 * meta_kernel_mount.
 */
int meta_kernel_mount_detached(const char *image, unsigned long flags,
			       int *mnt_fd);
/* Attach the detached mount @mnt_fd on @target (move_mount). */
int meta_mount_attach(int mnt_fd, const char *target);

/*
 * The sysfs directory of the file system mounted on @path (a mount point,
 * or "/proc/self/fd/N" of a detached mount): "/sys/fs/erofs/NAME". It
 * exists exactly while that superblock lives, also after a lazy unmount.
 * 0 or -errno.
 */
int meta_sysfs_path(const char *path, char *out, size_t len);

/*
 * mount(2) an EROFS over fscache (cachefiles on-demand, Linux 5.19 to 7.1)
 * read-only on @target: the kernel asks the daemon holding /dev/cachefiles
 * for the primary blob @fsid (the bootstrap) and for each device by its
 * device table tag, in the volume "erofs,@domain" (blobs shared by every
 * mount of the domain), or "erofs,@fsid" when @domain is NULL. Both are
 * tokens of [A-Za-z0-9._-] (1..64 bytes; -EINVAL otherwise). Returns once
 * the daemon has answered the OPENs and the superblock's READ. @flags are
 * added to MS_RDONLY (MS_NOSUID, MS_NODEV).
 */
#define META_FSCACHE_ID_MAX 64u
int meta_kernel_mount_fscache(const char *fsid, const char *domain,
			      const char *target, unsigned long flags);
/*
 * The same, no domain, as a detached mount (meta_kernel_mount_detached):
 * a standalone image that is its own primary blob. -EBUSY (not logged)
 * when a superblock of @fsid lives on this host: fscache allows one
 * volume per name, so mount the same blob again under another fsid.
 */
int meta_kernel_mount_fscache_detached(const char *fsid, unsigned long flags,
				       int *mnt_fd);

#endif
