/* SPDX-License-Identifier: MIT */
/* Internal to pkg-convert. */
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
	char *path;         /* the blob file */
	char *source_layer; /* "sha256:…" of the source layer, or NULL */
	bool from_dict;
	uint32_t dict_index; /* from_dict: the blob's index in converter.dict */
	uint64_t refs;      /* chunk references from the final tree */
	uint16_t device_id; /* assigned at the end; 0 = not used */
};

/*
 * While converting, chunk indexes name blobs provisionally (this bit |
 * blob index); the final device ids are assigned once every blob is known.
 */
#define PROVISIONAL_DEVICE 0x8000u

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
	const char *blobs_dir;      /* destination blobs/sha256 */
	struct blob_writer *writer; /* the current layer's blob */
	struct atomic_file writer_file; /* the blob, until named by its digest */
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
};

/* Where a regular file's bytes come from. */
struct file_source {
	/* Read exactly @len bytes: 0 or -errno. */
	int (*read)(void *ctx, void *buf, size_t len);
	/* Optional: skip the next @len bytes and return true if they are
	 * known to be a hole (all zero) without reading them. */
	bool (*skip_hole)(void *ctx, uint64_t len);
	void *ctx;
};

/* Fill a regular file @inode of @size bytes: inline when small, else chunks. */
int convert_ingest_file(struct converter *c, struct meta_inode *inode,
			uint64_t size, const struct file_source *src,
			const char *path);

/* Start / end the blob of one source layer (@source_layer may be NULL). */
int convert_layer_begin(struct converter *c, const char *source_layer);
int convert_layer_end(struct converter *c);

/*
 * Apply the tar archive at @path (@digest: expected sha256 or NULL) as one
 * layer: OCI whiteouts apply when c->layered.
 */
int convert_apply_tar(struct converter *c, const char *path,
		      const uint8_t *digest, const char *name);

/*
 * Normalise an archive path in place to "a/b/c" (leading '/', "." and
 * empty components dropped; "" is the root). -EINVAL if it has "..".
 */
int convert_normalize_path(char *path);

/* The same for an open (compressed) tar stream of @size bytes (0: unknown). */
struct input_stream;
int convert_apply_input(struct converter *c, struct input_stream *in,
			uint64_t size, const char *name);

/* The prefetch list (prefetch.c, docs/FORMAT.md 2.5). */
#define PREFETCH_MAX_PATHS 65536u
#define PREFETCH_PATH_MAX 4096u
/* One path per line ('#' comments, blank lines skipped), normalised "/a/b". */
int prefetch_list_load(const char *file, char ***paths, uint32_t *nr);
int prefetch_section_encode(char *const *paths, uint32_t nr, uint8_t **buf,
			    size_t *len);
int prefetch_section_decode(const void *buf, size_t len, char ***paths,
			    uint32_t *nr);
void prefetch_list_free(char **paths, uint32_t nr);

/* ------------------------------------------------------------------ */
/* OCI image layouts (oci.c)                                           */
/* ------------------------------------------------------------------ */

struct json_object;

struct oci_descriptor {
	uint8_t digest[32]; /* sha256 */
	uint64_t size;
	char media_type[128];
};

struct registry;

#define OCI_JSON_MAX (4u << 20) /* larger manifests, indexes, configs are refused */

struct oci_image {
	char *layout;                   /* PATH; NULL for a registry image */
	struct registry *remote;        /* docker: the repository's client */
	char *where;                    /* PATH or host/repo, for messages */
	struct json_object *manifest;   /* the image manifest, parsed */
	struct oci_descriptor manifest_desc;
	struct oci_descriptor config;
	uint8_t *config_data;           /* the config's bytes (checked) */
	size_t config_len;
	struct oci_descriptor *layers;  /* in manifest order */
	uint32_t nr_layers;
};

/* Where manifests, indexes and configs come from. */
struct oci_loader {
	/*
	 * The bytes of @d (a manifest or index when @manifest, else a
	 * config), at most OCI_JSON_MAX, checked against its size and digest.
	 */
	int (*load)(void *ctx, const struct oci_descriptor *d, bool manifest,
		    uint8_t **data, size_t *len);
	void *ctx;
};

/* A loader over the blobs of the layout @ctx (a PATH string). */
int oci_layout_load(void *ctx, const struct oci_descriptor *d, bool manifest,
		    uint8_t **data, size_t *len);

/*
 * From the manifest or index @top, follow indexes (choosing @platform, NULL
 * = the host's) to one image manifest; load its config and layer list
 * into @img (whose where is set).
 */
int oci_image_resolve(struct oci_image *img, const struct oci_descriptor *top,
		      const char *platform, const struct oci_loader *l);

/* Split "PATH[:TAG]" in place; *tag is NULL when there is none. */
void oci_split_ref(char *ref, char **path, char **tag);
/* The host's platform as "os/arch[/variant]". */
int oci_host_platform(char *out, size_t len);

/*
 * Resolve "PATH[:TAG]" to one image manifest, choosing @platform (NULL =
 * the host's) from image indexes. Manifests and indexes are digest- and
 * size-checked; layer blobs are not read.
 */
int oci_image_open(const char *ref, const char *platform, struct oci_image *img);
/*
 * The same for "HOST[:PORT]/REPO[:TAG|@DIGEST]" in a registry (remote.c);
 * img->remote stays open for reading (or, with FETCH_PUSH, writing) blobs.
 */
struct fetch_opts;
int oci_remote_open(const char *ref, const char *platform,
		    const struct fetch_opts *fopts, struct oci_image *img);
/*
 * Push the image whose manifest is blob @manifest_digest of @layout to
 * @dest ("HOST[:PORT]/REPO[:TAG]"): every layer and the config (skipping
 * blobs the registry has), then the manifest under the tag.
 */
int oci_push(const char *layout, const uint8_t manifest_digest[32],
	     uint64_t manifest_size, const char *dest,
	     const struct fetch_opts *fopts, struct ferry_progress *progress);
void oci_image_free(struct oci_image *img);

/* PATH/blobs/sha256/<hex> (allocated). */
int oci_blob_path(const char *layout, const uint8_t digest[32], char **out);
/* A descriptor's annotation @key, or NULL. */
const char *oci_annotation(struct json_object *desc, const char *key);

/* Create PATH/blobs/sha256 and oci-layout if missing. */
int oci_layout_init(const char *layout);
/* Store @data as a blob of @layout; its digest goes to @digest. */
int oci_put_blob(const char *layout, const void *data, size_t len,
		 uint8_t digest[32]);
/* Hardlink (or copy) the file @src_path into @layout as blob @digest. */
int oci_link_blob(const char *src_path, const char *layout,
		  const uint8_t digest[32]);
/* A new empty layout in $TMPDIR (default /var/tmp), and its removal. */
int oci_staging_create(char **layout);
void oci_staging_remove(const char *layout);
/* Point index.json's @tag at the manifest blob @digest. */
int oci_tag_manifest(const char *layout, const char *tag,
		     const uint8_t digest[32], uint64_t size,
		     const char *media_type);

#endif
