/* SPDX-License-Identifier: MIT */
/* Internal to pkg-convert: the converter's state, shared by its files. */
#ifndef FERRY_CONVERT_INTERNAL_H
#define FERRY_CONVERT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <stdbool.h>
#include <sys/types.h>

#include "../pkg-base/base.h"
#include "convert.h"

/* Where a stored chunk lives: the dedup table maps sha256 to this. */
struct chunk_slot {
	uint8_t sha256[BLOB_DIGEST_SIZE];
	uint32_t usize;
	uint16_t blob; /* index into converter.blobs + 1; 0 = empty table slot */
	bool hot;      /* blkaddr is relative to the blob's hot run */
	uint32_t blkaddr;
};

struct chunk_table {
	struct chunk_slot *slots;
	size_t cap, used; /* cap is a power of two */
};

/*
 * A blob the new image uses: written by this conversion (one per source
 * layer that adds chunks) or borrowed from a --chunk-dict image.
 */
struct out_blob {
	struct blob_info info;
	char *source_layer; /* "sha256:…" of the source layer, or NULL */
	bool from_dict;
	uint32_t dict_index; /* from_dict: the blob's index in converter.dict */
	uint64_t refs;      /* chunk references from the final tree */
	uint16_t device_id; /* assigned at the end; 0 = not used */
	uint32_t hot_blkaddr; /* where its hot run (blob_writer_hot) starts */
};

/*
 * While converting, chunk indexes name blobs provisionally (this bit |
 * blob index, with PROVISIONAL_HOT when the block address is relative to
 * the blob's hot run); the final device ids and hot addresses are set once
 * every blob is known.
 */
/* OCI layer whiteouts (the image spec's "Whiteouts"). */
#define WHITEOUT_PREFIX ".wh."
#define WHITEOUT_OPAQUE ".wh..wh..opq"

#define PROVISIONAL_DEVICE 0x8000u
#define PROVISIONAL_HOT 0x4000u
#define PROVISIONAL_BLOB_MASK 0x3fffu
_Static_assert(META_MAX_DEVICES <= PROVISIONAL_BLOB_MASK,
	       "provisional device ids must hold every blob index");

struct hardlink {
	dev_t dev;
	ino_t ino;
	struct meta_inode *inode;
};

/* Directory entries added by the layer being applied (for opaque dirs). */
struct layer_entry {
	const struct meta_inode *dir; /* NULL = empty slot */
	uint64_t hash;
	char *name;
	bool fresh_dir; /* a directory created (not updated) by this layer */
};

struct layer_set {
	struct layer_entry *slots;
	size_t cap, used;
};

struct converter {
	const struct convert_opts *opts;
	struct convert_stats *stats;
	struct meta_tree *tree;
	struct chunk_table chunks;
	struct out_blob *blobs;
	uint32_t nr_blobs;
	size_t blobs_cap;
	const char *blobs_dir;      /* the destination's blobs/sha256 */
	struct blob_writer *writer; /* the current layer's blob */
	struct atomic_file writer_file; /* the blob, until named by its digest */
	struct atomic_file hot_file; /* the writer's hot stage (prefetch list) */
	bool writer_hot;            /* adds go to the writer's hot run */
	uint32_t writer_blob;       /* its index in blobs */
	uint64_t writer_chunks;
	uint8_t *buf;               /* one chunk */
	struct hardlink *links;
	size_t nr_links, links_cap;
	bool layered;               /* OCI layers: whiteouts apply */
	struct layer_set added;
	struct ferry_progress progress;
	struct image *dict;         /* --chunk-dict image, or NULL */
	char **prefetch;            /* --prefetch-files paths */
	uint32_t nr_prefetch;
	const char **prefetch_sorted; /* the same, sorted, for convert_ingest_file */
	size_t dir_root_len;        /* convert_dir: the source path's length */
	struct native_state *native; /* CONVERT_FORMAT_EROFS_LAYERS, else NULL */
	struct elf_capture *elf_cap; /* the ELF file being ingested (elfdeps.c) */
	struct elf_record *elf_records; /* every ELF file ingested */
	size_t nr_elf_records, elf_records_cap;
	struct image_elf_entry *elf; /* those in the final tree, by path */
	uint32_t nr_elf;
	struct tar_reader *tar;      /* the archive being applied, or NULL */
	struct index_state *index;   /* `ferry index` (index.c), else NULL */
};

/* -ECANCELED once the caller asked to stop (convert_opts.cancel), else 0. */
static inline int convert_cancelled(const struct converter *c)
{
	return c->opts->cancel && *c->opts->cancel ? -ECANCELED : 0;
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
 * Fill a regular file @inode of @size bytes: inline when small, else
 * chunks. @path names it in messages; @image_path ("a/b") is its place
 * in the image, for the prefetch list.
 */
int convert_ingest_file(struct converter *c, struct meta_inode *inode,
			uint64_t size, const struct file_source *src,
			const char *path, const char *image_path);
/* Index the prefetch list (c->prefetch) for convert_ingest_file. */
int convert_prefetch_index(struct converter *c);

/*
 * Start / end the blob of one source layer (dedup.c; @source_layer may be
 * NULL); discard drops the current layer's writer and temporary file.
 */
int convert_layer_begin(struct converter *c, const char *source_layer);
int convert_layer_end(struct converter *c);
void convert_layer_discard(struct converter *c);

/* A new out_blob at the end of c->blobs. */
int convert_add_blob(struct converter *c, struct out_blob **out);

/*
 * The end of a conversion (convert.c), shared with `ferry index`: give
 * the blobs device ids, list the used ones in device order, and write
 * the bootstrap (with @streams, the stream blobs' resume points, in
 * blob order) into *@data.
 */
int convert_assign_devices(struct converter *c);
int convert_used_blobs(struct converter *c, struct out_blob ***out, uint32_t *nr);
int convert_write_bootstrap(struct converter *c, struct out_blob **blobs,
			    uint32_t nr, const struct blob_stream *streams,
			    uint32_t nr_streams, uint8_t **data);
int convert_fill_stats(struct convert_stats *s, struct out_blob **blobs, uint32_t nr);

/*
 * `ferry index`: store a new chunk of @len bytes that the archive has
 * just read, where it lies in the layer's decoded stream; *@uoff gets its
 * slot (index.c).
 */
int index_add_chunk(struct converter *c, uint32_t len,
		    const uint8_t sha256[BLOB_DIGEST_SIZE], uint64_t *uoff);

/* Make every chunk of the image @ref's blobs available for reference. */
int convert_load_chunk_dict(struct converter *c, const char *ref);
/* Put the chunk-dict blobs among @blobs into the destination directory @dir. */
int convert_copy_dict_blobs(struct converter *c, const char *dir,
			    struct out_blob **blobs, uint32_t nr);

/* A dir: source (dirsrc.c): the tree at @path into c->tree. */
int convert_dir(struct converter *c, const char *path);

/*
 * Apply the tar archive at @path (@digest: expected sha256 or NULL) as one
 * layer: OCI whiteouts apply when c->layered.
 */
int convert_apply_tar(struct converter *c, const char *path,
		      const uint8_t *digest, const char *name);

/* The same for an open (compressed) tar stream of @size bytes (0: unknown). */
struct input_stream;
int convert_apply_input(struct converter *c, struct input_stream *in,
			uint64_t size, const char *name);

/*
 * Layer @d of @img: its blob file in an OCI layout, or streamed from the
 * registry into convert_apply_input (convert.c).
 */
struct oci_image;
struct oci_descriptor;
int convert_apply_oci_layer(struct converter *c, const struct oci_image *img,
			    const struct oci_descriptor *d, const char *name);

/*
 * oci-archive: and docker-archive: sources (archive.c): @ref's image into
 * @img (@platform and the tag as for oci:, OCI_PLATFORMS included), its
 * archive, indexed, in img->archive; layer @d of @img applied as one
 * layer, streamed from its member and digest-checked; the archive closed.
 */
struct convert_archive;
int archive_image_open(const struct image_ref *ref, const char *platform,
		       struct oci_image *img);
int archive_apply_layer(struct converter *c, const struct oci_image *img,
			const struct oci_descriptor *d, const char *name);
void archive_close(struct convert_archive *a);
/*
 * The image of an oci:, docker://, oci-archive: or docker-archive: source
 * (as oci_image_open); convert_close_image frees it and closes its archive.
 */
int convert_open_image(const struct image_ref *src, const char *platform,
		       const struct fetch_opts *fopts, struct oci_image *img);
void convert_close_image(struct oci_image *img);

/* Loader dependencies of the ELF files ingested (elfdeps.c, FORMAT.md 2.6) */
int convert_elf_init(struct converter *c);
int convert_elf_chunk(struct converter *c, uint64_t off, const uint8_t *data,
		      uint32_t len, uint64_t size);
int convert_elf_file_end(struct converter *c, const struct meta_inode *inode,
			 const char *image_path);
int convert_elf_collect(struct converter *c);
void convert_elf_free(struct converter *c);

/* The parent directory of @path in c->tree, created as tar extraction does. */
int convert_parent_dir(struct converter *c, char *path,
		       struct meta_inode **dir, const char **name);

/*
 * Native EROFS layers (erofslayers.c). native_entry turns a whiteout or
 * opaque marker into its overlayfs form (1: handled), refuses what
 * overlayfs cannot carry, and escapes trusted.overlay.* xattrs (0: go on).
 * native_link_target settles a hardlink's target *@target as this layer
 * found it: a whiteout of this layer is no target (NULL), and a target
 * only a lower layer holds is copied into this one (NULL when none does). native_ingest_file stores a regular file in
 * the layer's embedded data.
 */
struct tar_entry;
int native_entry(struct converter *c, struct tar_entry *e, char *path);
int native_link_target(struct converter *c, const char *path,
		       struct meta_inode **target);
/*
 * A directory this layer implies (an entry below it, no entry of its own)
 * takes the attributes it has in the layers below, as in the merged view.
 */
int native_implicit_dir(struct converter *c, const char *path,
			struct meta_inode *dir);
int native_ingest_file(struct converter *c, struct meta_inode *inode,
		       uint64_t size, const struct file_source *src,
		       const char *path);
/* -EINVAL (logged) for transports native layers do not support. */
int native_check_refs(const struct image_ref *src, const struct image_ref *dst);

/*
 * A native layer's file data laid out in order, compressed by @jobs
 * threads (0: one per CPU) with @algorithm at @level (0: the codec's
 * default) into @fd (zpipe.c).
 * zpipe_add reads a file through @src and gives @inode its size and
 * embedded blocks (extents if compressing saves a block) once laid out;
 * zpipe_flush lays out everything added and says how many blocks the
 * data has; zpipe_reserve flushes and keeps @nr blocks at *@start for
 * the caller to write. All return 0 or -errno.
 */
struct zpipe;
int zpipe_new(enum meta_zalgorithm algorithm, int level, unsigned int jobs,
	      int fd, struct zpipe **out);
void zpipe_free(struct zpipe *zp);
int zpipe_add(struct zpipe *zp, struct meta_inode *inode, uint64_t size,
	      bool compress, const struct file_source *src, const char *path);
int zpipe_flush(struct zpipe *zp, uint32_t *blocks);
int zpipe_reserve(struct zpipe *zp, uint32_t nr, uint32_t *start);
/*
 * Convert one image, @src (@img for oci: and docker:, else NULL), into the
 * open destination @out: tagged, or with @index_member stored for an index
 * (image_out_desc.index_member). convert.c's is convert_into,
 * erofslayers.c's native_convert_into.
 */
typedef int (*convert_image_fn)(const struct image_ref *src,
				const struct oci_image *img, struct image_out *out,
				bool index_member, const struct convert_opts *opts,
				struct convert_stats *stats);
/*
 * The image index @src (its platforms listed in @index: OCI_PLATFORMS) into
 * @out: each wanted platform (convert_opts.platforms, else all) through
 * @one as an index member, then the index of them under DEST's tag.
 */
int convert_index(const struct image_ref *src, const struct oci_image *index,
		  struct image_out *out, convert_image_fn one,
		  const struct convert_opts *opts, struct convert_stats *stats);
/* Several platforms only into oci: or docker:// (-EINVAL, logged). */
int convert_check_platforms(const struct image_ref *dst,
			    const struct convert_opts *opts);

int convert_run_erofs_layers(const char *source, const char *dest,
			     const struct convert_opts *opts,
			     struct convert_stats *stats);

#endif
