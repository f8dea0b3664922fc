/* SPDX-License-Identifier: MIT */
/* Internal to pkg-image. */
#ifndef FERRY_IMAGE_INTERNAL_H
#define FERRY_IMAGE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../pkg-base/base.h"
#include "image.h"

/* ------------------------------------------------------------------ */
/* The bootstrap's prefetch section (prefetch.c), after the blob index */
/* ------------------------------------------------------------------ */

int prefetch_section_encode(char *const *paths, uint32_t nr, uint8_t **buf,
			    size_t *len);
#define PREFETCH_MAGIC "FERRYPF1"
#define PREFETCH_VERSION 1u
/*
 * The 16-byte header the optional sections share: @magic (8 bytes), u32
 * @version, u32 count (into *@count). -EFSCORRUPTED with a message naming
 * @what otherwise.
 */
int ext_section_header(const void *buf, size_t len, const char *magic,
		       uint32_t version, const char *what, uint32_t *count);
/* With @used, the section may end before @len: *@used is its size. */
int prefetch_section_decode(const void *buf, size_t len, char ***paths,
			    uint32_t *nr, size_t *used);

/* The loader dependencies section (elf.c), after the prefetch list */
#define ELF_SECTION_MAGIC "FERRYLD1"
#define ELF_SECTION_VERSION 1u
int elf_section_encode(const struct image_elf_entry *e, uint32_t nr,
		       uint8_t **buf, size_t *len);
int elf_section_decode(const void *buf, size_t len,
		       struct image_elf_entry **e, uint32_t *nr);
/* @img's loader dependencies entry for @path ("/a/b"), or NULL. */
const struct image_elf_entry *image_elf_find(const struct image *img,
					     const char *path);

/* What a compiled Python module's body imports (pyc.c) */
#define PYC_NAME_MAX 255
struct pyc_import {
	const char *name;   /* "a.b" of `import a.b`, "a" of `from .a import x`, "" of `from . import x` */
	const char *from;   /* "x" of `from M import x` (maybe a submodule of M), or NULL */
	uint8_t name_len, from_len;
	uint8_t level;      /* 0 absolute, 1 `from .`, 2 `from ..`... */
};
/*
 * The imports that the module body of the .pyc file in @buf (@len bytes,
 * untrusted) runs, in its order, at most @max into @out: their count
 * (names are identifiers joined by dots, at most PYC_NAME_MAX bytes,
 * pointing into @buf, not NUL-terminated), 0 for a file this reader does
 * not understand (CPython 3.8 to 3.12), or -ENOMEM.
 */
int pyc_imports(const uint8_t *buf, size_t len, struct pyc_import *out,
		unsigned int max);

/*
 * The section area (sections.c, FORMAT.md 2.7) into @img: the sections it
 * knows decoded, the others skipped; -EFSCORRUPTED for a malformed area,
 * -ENOTSUP for a required section it does not know (both logged).
 */
int image_sections_decode(struct image *img, const void *area, size_t len);

/* ------------------------------------------------------------------ */
/* What an image's index promises (image.c)                            */
/* ------------------------------------------------------------------ */

/* What the image's index (ferry.json or OCI manifest) promises. */
struct image_expect {
	uint8_t bootstrap[BLOB_DIGEST_SIZE]; /* of the raw EROFS bytes */
	bool compressed_bootstrap;    /* oci:, docker: zstd-compressed blob */
	char *compressed_path;        /* oci: that blob's file */
	uint8_t compressed[BLOB_DIGEST_SIZE];
	uint64_t compressed_size;
	uint32_t nr_blobs;
	uint8_t (*blobs)[BLOB_DIGEST_SIZE];
	/* An ordinary image with a ferry index: its devices are some of
	 * these layers, in this order, read in place. */
	bool index;
	struct oci_descriptor *layers;
	uint32_t nr_layers;
};
void image_expect_free(struct image_expect *e);
/*
 * Read a dir: image's parsed ferry.json @root (named @index_path in
 * messages), or a resolved OCI image @oci whose last layer must be the
 * bootstrap, into @e and @img's chunk_size, compression (and, for a
 * layout, dir): 0 or -EFSCORRUPTED after a message. Untrusted input.
 */
int image_expect_dir(struct image *img, struct json_object *root,
		     const char *index_path, struct image_expect *e);
int image_expect_manifest(struct image *img, const struct oci_image *oci,
			  struct image_expect *e);

/* Native layers (layers.c): is @oci one; open it lazily into @img (which
 * takes oci->remote); @img's cache data file @index; their kernel mount. */
bool oci_is_layers_image(const struct oci_image *oci);
/* One source per blob of @img (image_blob_source: local files are opened
 * on first use), once its blobs' digests and local paths are set. */
int image_blob_sources_init(struct image *img);
int image_open_layers(struct image *img, struct oci_image *oci);
int image_cache_data_fd(const struct image_cache *ic, uint32_t index);
struct image *image_cache_img(const struct image_cache *ic);
/* Make [@uoff, @uoff + @len) of blob @index present for ferry itself: no
 * fetch-ahead, not a reader's hit or miss (bytes fetched still count). */
int image_cache_fill(struct image_cache *ic, uint32_t index, uint64_t uoff,
		     uint64_t len);
void image_cache_note_sb(const struct image_cache *ic, const char *sysfs);
int image_layers_kernel_mount(struct image_cache *ic, const char *target,
			      unsigned long flags);

/* ------------------------------------------------------------------ */
/* OCI image layouts (oci.c) and registries (remote.c)                 */
/* ------------------------------------------------------------------ */

/* Where manifests, indexes and configs come from. */
struct oci_loader {
	/*
	 * The bytes of @d (a manifest or index when @manifest, else a
	 * config), at most OCI_JSON_MAX, checked against its size and digest.
	 */
	int (*load)(void *ctx, const struct oci_descriptor *d, bool manifest,
		    uint8_t **data, size_t *len);
	void *ctx;
	/* The caller never reads the config (a mount): not loaded, one
	 * round trip less to a registry; img->config is still parsed. */
	bool skip_config;
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

/*
 * From an OCI layout's parsed index.json @index (@layout names it in
 * messages), the descriptor of the image tagged @tag, or of its only one
 * when @tag is NULL: 0, -ENOENT or -EFSCORRUPTED after a message.
 */
int oci_index_pick(struct json_object *index, const char *layout,
		   const char *tag, struct oci_descriptor *d);

/* The host's platform as "os/arch[/variant]". */
int oci_host_platform(char *out, size_t len);

/* The layout @path: index.json's image tagged @tag (NULL: its only one). */
int oci_layout_open(const char *path, const char *tag, const char *platform,
		    struct oci_image *img);
/*
 * The same for "HOST[:PORT]/REPO[:TAG|@DIGEST]" in a registry (remote.c);
 * img->remote stays open for reading blobs. @opts: fetch, platform, and
 * cache_dir / digest / no_config as image_open takes them (NULL: none).
 */
int oci_remote_open(const char *ref, const struct image_opts *opts,
		    struct oci_image *img);

/*
 * Local copies of content-addressed bytes under a chunk cache,
 * CACHE/@sub/<hex> (CACHE/meta: registry documents; CACHE/bootstraps: raw
 * bootstraps). image_cached_read: the copy of @digest, at most @max bytes,
 * checked against it; -ENOENT when there is none (or the directory is
 * not one root can trust: blob_cache_dir), -EFSCORRUPTED (warned) when it
 * holds other bytes: fetch them again. image_cached_keep: store a copy
 * (already checked by the caller), warning when it cannot; not synced to
 * disk, as every read checks it. With @fd, each also gives the file it
 * read or wrote, open read-only (-1 when the copy could not be made).
 */
#define IMAGE_META_DIR "meta"
#define IMAGE_BOOTSTRAPS_DIR "bootstraps"
int image_cached_read(const char *cache_dir, const char *sub,
		      const uint8_t digest[32], size_t max, uint8_t **data,
		      size_t *len, int *fd);
void image_cached_keep(const char *cache_dir, const char *sub,
		       const uint8_t digest[32], const void *data, size_t len,
		       int *fd);
/*
 * Push the image whose manifest is blob @manifest_digest of @layout to
 * @dest ("HOST[:PORT]/REPO[:TAG]"): every layer and the config (skipping
 * blobs the registry has), then the manifest under the tag, or with
 * @by_digest under its digest (an index's member).
 */
int oci_push(const char *layout, const uint8_t manifest_digest[32],
	     uint64_t manifest_size, const char *dest, bool by_digest,
	     const struct fetch_opts *fopts, struct ferry_progress *progress);

/* PUT the image index @text under @dest's tag (its members are there). */
int oci_push_index(const char *dest, const char *text, size_t len,
		   const struct fetch_opts *fopts);

/* A descriptor's annotation @key, or NULL. */
const char *oci_annotation(struct json_object *desc, const char *key);
/* A descriptor object; an annotation set on an object (write.c). */
struct json_object *oci_descriptor_json(const char *media_type,
					const uint8_t *digest, uint64_t size);
void oci_annotate(struct json_object *o, const char *key, const char *value);
/* Parse a descriptor object (digest, size, mediaType checked). */
int oci_parse_descriptor(struct json_object *o, const char *where,
			 struct oci_descriptor *d);
/* Lock the directory @path (flock LOCK_EX, waiting when @wait) into *@fd. */
int image_lock_dir(const char *path, bool wait, int *fd);
/*
 * The ferry index of @oci listed in @list (an image index: a layout's
 * index.json, a referrers API answer or referrers tag), the manifests
 * read through @load: the last that names @oci, checked as below
 * (img->index_* allocated: image_close frees them).
 * -ENOENT when none does.
 */
typedef int (*image_manifest_load_fn)(void *ctx, const struct oci_descriptor *d,
				      uint8_t **data, size_t *len);
int image_index_from_list(struct image *img, const struct oci_image *oci,
			  struct json_object *list, image_manifest_load_fn load,
			  void *ctx, struct image_expect *e);
/*
 * An ordinary image @oci's attached ferry index (index.c): found (or the
 * one @opts pins), checked to name exactly @oci (its subject), its layers
 * and, when @oci has its config, its diff_ids; its bootstrap expected in
 * @e (e->index). -EMEDIUMTYPE (logged) when none is attached.
 */
int image_index_expect(struct image *img, const struct oci_image *oci,
		       const struct image_opts *opts, struct image_expect *e);

/* Create PATH/blobs/sha256 and oci-layout if missing. */
int oci_layout_init(const char *layout);
/* Store @data as a blob of @layout; its digest goes to @digest. */
int oci_put_blob(const char *layout, const void *data, size_t len,
		 uint8_t digest[32]);
/* Hardlink (or copy) the file @src_path into @layout as blob @digest. */
int oci_link_blob(const char *src_path, const char *layout,
		  const uint8_t digest[32]);
/* Point index.json's @tag at the manifest blob @digest. */
int oci_tag_manifest(const char *layout, const char *tag,
		     const uint8_t digest[32], uint64_t size,
		     const char *media_type);
/*
 * Remove what ferry writes into a layout or dir: image (the blob files,
 * index.json, oci-layout, bootstrap, ferry.json, ferry's temporary files)
 * and then the directory: 0, or -errno when something else kept it.
 */
int image_dir_remove(const char *dir);

/* -EBUSY (logged) when @target holds a ferry mount already (cache.c). */
int image_check_not_mounted(const char *target);
/*
 * 0 when the canonical @mountpoint is still a directory reached without a
 * symbolic link; else -errno, logged: a link swapped into its path since
 * it was checked is refused here (and by mount_nofollow in the end).
 */
int image_mountpoint_unchanged(const char *mountpoint);

#endif
