/* SPDX-License-Identifier: MIT */
/*
 * pkg-image: ferry images and where they live. An image is a bootstrap
 * (EROFS metadata, pkg-meta) whose extension payload holds the blob index
 * (pkg-blob) and an optional prefetch list, plus one chunk blob per device.
 * This module owns everything that knows how images are stored and named:
 *
 *  - references: dir:PATH, tar:PATH, oci:PATH[:TAG],
 *    docker://HOST[:PORT]/REPO[:TAG|@DIGEST] and bare paths, parsed here
 *    and nowhere else;
 *  - opening an image: its index (ferry.json or an OCI manifest) → the
 *    digest-checked bootstrap → one blob_source per blob (a local file, or
 *    registry Range requests through pkg-fetch);
 *  - ferry check, copying blobs, OCI layouts (read and written), registry
 *    manifests and push;
 *  - writing images (image_out): pkg-convert produces the bootstrap bytes
 *    and blob files, this module lays them out as dir:, oci: or docker://
 *    images, so that readers and the writer share one description;
 *  - the prefetch list (its text form and its bootstrap section);
 *  - an image's blobs in the chunk cache (image_cache, for lazy mounts)
 *    and the local kernel mount.
 *
 * It never converts: pkg-convert builds on it, ferryd serves through it.
 *
 * Ownership: what a function allocates into an out-parameter is freed by
 * the matching *_free / *_close; strings passed in are copied when kept,
 * except where a comment says "borrowed".
 *
 * Errors: 0 or a negative errno, logged naming the image, file or blob:
 *   -EINVAL       a malformed reference or argument
 *   -ENOENT       the image, layout, tag, platform or file does not exist
 *   -EFSCORRUPTED an index, manifest, bootstrap, blob or list that does
 *                 not match its digest or size, or does not parse
 *   -EIO          an I/O error, or a chunk that failed to verify
 * and pkg-fetch's errors for docker:// images.
 *
 * Thread-safety: an open struct image is read-only after image_open and
 * its blob sources may be read from several threads; setting a blob
 * source up (image_blob_source) and everything else belong to one thread
 * at a time, except where a comment (image_cache) says otherwise.
 */
#ifndef FERRY_IMAGE_H
#define FERRY_IMAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "../pkg-blob/blob.h"
#include "../pkg-fetch/fetch.h"
#include "../pkg-meta/meta.h"

/* ------------------------------------------------------------------ */
/* Media types and limits (docs/FORMAT.md)                             */
/* ------------------------------------------------------------------ */

/* OCI manifest and index types: FETCH_OCI_* / FETCH_DOCKER_* (fetch.h). */
#define OCI_CONFIG_TYPE "application/vnd.oci.image.config.v1+json"
#define OCI_REF_NAME_ANNOTATION "org.opencontainers.image.ref.name"
/* Layer types under containerd's layer prefix (images.IsLayerType), so that
 * containerd hands them to a snapshotter instead of storing them as content. */
#define FERRY_BLOB_MEDIA_TYPE "application/vnd.oci.image.layer.ferry.blob.v1"
/* In OCI layouts the bootstrap is stored as one zstd frame: it is always
 * fetched whole before use, and compressing it saves ~70% of its bytes. */
#define FERRY_BOOTSTRAP_MEDIA_TYPE \
	"application/vnd.oci.image.layer.ferry.bootstrap.v1.erofs+zstd"
/* The types of images written before them: still read; `ferry convert`
 * of such an image rewrites it with the types above. */
#define FERRY_BLOB_MEDIA_TYPE_OLD "application/vnd.ferry.blob.v1"
#define FERRY_BOOTSTRAP_MEDIA_TYPE_OLD "application/vnd.ferry.bootstrap.v1.erofs+zstd"
/* containerd passes "containerd.io/snapshot/" layer annotations to the
 * snapshotter as labels: these tell ferry-snapshotter what a layer is. */
#define FERRY_SNAPSHOT_BLOB_LABEL "containerd.io/snapshot/ferry.blob"
#define FERRY_SNAPSHOT_BOOTSTRAP_LABEL "containerd.io/snapshot/ferry.bootstrap"
#define FERRY_FORMAT_VERSION "3" /* the manifest's dev.ferry.version */
/*
 * A ferry layer's config diff_id (docs/FORMAT.md 1a) is the sha256 of
 * PREFIX + its digest string (a data blob's own digest, the bootstrap's
 * raw bytes' digest): no tar layer hashes to such a short text, so the
 * chain IDs containerd computes for a ferry image's layers never name
 * layers it unpacks itself (docs/SECURITY.md, containerd).
 */
#define FERRY_BLOB_DIFF_ID_PREFIX "dev.ferry.blob "
#define FERRY_BOOTSTRAP_DIFF_ID_PREFIX "dev.ferry.bootstrap "
#define FERRY_BOOTSTRAP_DIGEST_ANNOTATION "dev.ferry.bootstrap.uncompressed-digest"
#define FERRY_BOOTSTRAP_MAX (1ull << 30) /* larger bootstraps are refused */
#define OCI_JSON_MAX (4u << 20) /* larger manifests, indexes, configs are refused */

/* ------------------------------------------------------------------ */
/* References (ref.c)                                                  */
/* ------------------------------------------------------------------ */

enum image_transport {
	IMAGE_DIR,    /* dir:PATH: a ferry image directory, or a tree to convert */
	IMAGE_TAR,    /* tar:PATH: an archive to convert */
	IMAGE_OCI,    /* oci:PATH[:TAG]: an OCI image layout */
	IMAGE_DOCKER, /* docker://HOST[:PORT]/REPO[:TAG|@DIGEST]: a registry */
	IMAGE_OCI_ARCHIVE,    /* oci-archive:PATH[:TAG]: a tar of an OCI layout */
	IMAGE_DOCKER_ARCHIVE, /* docker-archive:PATH: what docker save writes */
};

/* image_ref_parse's @accept: a bit per transport, and bare paths. */
#define IMAGE_ACCEPT(t) (1u << (t))
#define IMAGE_ACCEPT_BARE (1u << 8) /* a path without a transport is dir: */
/* What images (as opposed to conversion sources) may be. */
#define IMAGE_ACCEPT_IMAGE (IMAGE_ACCEPT(IMAGE_DIR) | IMAGE_ACCEPT(IMAGE_OCI) | \
			    IMAGE_ACCEPT(IMAGE_DOCKER) | IMAGE_ACCEPT_BARE)

struct image_ref {
	enum image_transport transport;
	/* dir:, tar:, oci:, archives: the path; docker: the name
	 * fetch_parse_ref normalises, "HOST[:PORT]/REPO:TAG" or
	 * "HOST[:PORT]/REPO@DIGEST". */
	char *path;
	char *tag; /* oci:, oci-archive: the tag, or NULL (the only image) */
};

/*
 * Parse @s into @out. oci:PATH:TAG (and oci-archive:) splits at the last ':' unless what
 * follows it contains a '/' (then it is part of PATH). A bare path is
 * dir: only with IMAGE_ACCEPT_BARE, and only when it has no ':' or starts
 * with '/' or '.'. A transport outside @accept, an empty path, or
 * "docker:" without "//" is -EINVAL, logged as "@what \"@s\": expected …"
 * unless @what is NULL.
 */
int image_ref_parse(const char *s, unsigned int accept, const char *what,
		    struct image_ref *out);
void image_ref_free(struct image_ref *ref);

/*
 * @s with a dir:, oci: or bare path made absolute (path_absolute; a bare
 * path gains "dir:"), for a process with another working directory
 * (ferryd works in "/"). docker:// references and strings image_open
 * would refuse are copied unchanged (image_open names the problem).
 */
int image_ref_absolute(const char *s, char **out);

/* ------------------------------------------------------------------ */
/* Opening an image (image.c)                                          */
/* ------------------------------------------------------------------ */

/*
 * An open image: dir:OUT (OUT/bootstrap, OUT/blobs/sha256/<hex>,
 * OUT/ferry.json), oci:PATH[:TAG] or docker://REF (docs/FORMAT.md).
 * image_open reads the index, loads and verifies the bootstrap, opens it
 * with pkg-meta and decodes its blob index, checking that the device
 * table, the blob index and the image index agree. Blob bytes stay where
 * they are (local file or registry) until read.
 */
struct image;
struct registry;

/* Where the bytes of one blob come from (image_blob_source). */
struct image_blob {
	struct image *img;
	uint32_t index;
	int fd; /* local blob file, opened on first use; -1 */
};

/* Bytes [off, off + len) of a blob's uncompressed space. */
struct image_span {
	uint64_t off, len;
};

struct image {
	char *ref;            /* as given, for messages */
	char *dir;            /* OUT or PATH; NULL for a registry image */
	struct registry *remote; /* docker: the repository's client */
	char *bootstrap_path;    /* raw EROFS file; NULL until needed for oci:/docker: */
	int bootstrap_fd;        /* that file, its bytes checked; -1 until then */
	uint8_t *bootstrap;      /* the bootstrap's bytes (verified) */
	size_t bootstrap_len;
	uint8_t bootstrap_digest[BLOB_DIGEST_SIZE]; /* of the raw bytes */
	/* The manifest's digest (oci:, docker:) or the bootstrap's (dir:). */
	uint8_t image_digest[BLOB_DIGEST_SIZE];
	/* An ordinary image: its attached ferry index's manifest; else zero. */
	uint8_t index_digest[BLOB_DIGEST_SIZE];
	/*
	 * An indexed image: its nr_layers layer digests and the diff_ids its
	 * index records (checked against the config when image_open read it);
	 * else NULL and 0.
	 */
	uint8_t (*index_layers)[32];
	uint8_t (*index_diff_ids)[32];
	uint32_t nr_index_layers;
	uint8_t config_digest[BLOB_DIGEST_SIZE]; /* oci:, docker:; else zero */
	struct meta_image *meta;
	struct blob_index blobs; /* blob i is device_id i + 1 */
	struct blob_streams streams; /* resume points of its stream blobs */
	char **blob_paths;       /* local blob files; NULL entries for docker: */
	struct image_blob *blob_srcs;
	uint32_t chunk_size;
	char compression[32];
	char **prefetch;      /* the embedded prefetch list ("/a/b"), or NULL */
	uint32_t nr_prefetch;
	struct image_elf_entry *elf; /* the loader dependencies, or NULL */
	uint32_t nr_elf;
	char *writer;         /* FERRYWR1: "ferry 0.5.0", or NULL (older images) */
	struct image_section_seen *sections; /* the section area's, in order */
	uint32_t nr_sections;
	bool has_posix_acls;  /* set by image_validate_metadata */
	/*
	 * Native EROFS layers served lazily (image_opts.erofs_layers): no
	 * bootstrap and no meta; blob i is layer i (bottom first), its
	 * chunks the ranges of its range table, its "uncompressed" space the
	 * layer's EROFS image; the metadata is its first layer_meta[i] bytes.
	 */
	bool erofs_layers;
	uint64_t *layer_meta;
	/*
	 * image_cache_walk_layers: per layer, the byte ranges its compressed
	 * files' pclusters span (each file's, overlapping ones merged),
	 * sorted. EROFS over fscache must find each of them wholly in its
	 * cache file or not at all (cachefiles.c).
	 */
	struct image_span **layer_units;
	uint32_t *nr_layer_units;
};

struct image_opts {
	const struct fetch_opts *fetch; /* docker: client options; NULL = defaults */
	const char *platform;           /* image indexes; NULL = the host's */
	/*
	 * docker: a chunk cache whose CACHE/meta/<sha256> (manifests,
	 * indexes, configs) and CACHE/bootstraps/<sha256> hold local copies,
	 * each checked against its digest before use and kept after each
	 * fetch: a reference by digest opens without the registry. NULL: none.
	 */
	const char *cache_dir;
	/*
	 * The image must be this one (its image_digest): a docker: reference
	 * is resolved by this digest instead of its tag, any other is refused
	 * with -ESTALE when it now holds another image. NULL: any.
	 */
	const uint8_t *digest;
	/* docker: leave the image's config unfetched (a mount never reads
	 * it): one round trip less before a lazy mount is served. */
	bool no_config;
	/*
	 * An ordinary image's ferry index must be this one (its manifest's
	 * digest, img->index_digest), read by digest (from cache_dir first)
	 * instead of looked for among the image's referrers. NULL: the last
	 * one attached.
	 */
	const uint8_t *index_digest;
	/* Accept an image of native EROFS layers that carry range tables
	 * (img->erofs_layers; only a lazy kernel mount serves them). */
	bool erofs_layers;
};

/* @ref: dir:, oci:, docker:// or a bare path; @opts may be NULL. */
int image_open(const char *ref, const struct image_opts *opts,
	       struct image **out);
void image_close(struct image *img);

/*
 * A blob_source over blob @index's file bytes: pread on the local file, or
 * one registry Range request per read. Not thread-safe to set up; the
 * source itself may be used from several threads.
 */
int image_blob_source(struct image *img, uint32_t index, struct blob_source *src);
/* "PATH" or "HOST/REPO@sha256:HEX", for messages. */
void image_blob_name(const struct image *img, uint32_t index, char *buf,
		     size_t len);
/*
 * Put blob @index into @dir/blobs/sha256 (an OCI layout or a dir: image):
 * hardlinked or copied from a local image, streamed from a registry.
 */
int image_copy_blob(struct image *img, uint32_t index, const char *dir);

/*
 * Set img->bootstrap_path to a raw bootstrap file the kernel can mount:
 * the image's own (dir:), else CACHE/bootstraps/<sha256>, written once —
 * and img->bootstrap_fd to it opened read-only, its bytes checked equal
 * to the verified img->bootstrap (a cached copy that differs, e.g. one
 * planted, is replaced with a warning); a registry image opened with a
 * cache has them already, from the copy it was loaded from or kept in.
 * Mount through the descriptor (/proc/self/fd/N) so the kernel reads
 * exactly the checked bytes.
 */
int image_bootstrap_file(struct image *img, const char *cache_dir);

/* ------------------------------------------------------------------ */
/* ferry check (check.c)                                               */
/* ------------------------------------------------------------------ */

struct image_check_report {
	uint64_t inodes, chunks, bytes_verified;
	uint64_t posix_acls; /* inodes carrying a POSIX ACL xattr */
	int error; /* first error, 0 when the image is intact */
};

/*
 * Walk every inode through the reader (validating metadata and that each
 * chunk index names a chunk of its blob with the right length), then read
 * every blob front to back (from the registry for docker: images) and
 * check its table, every chunk's sha256 and the blob digest. Logs the
 * first problem naming the inode path or the blob and chunk.
 */
int image_check(struct image *img, struct image_check_report *report);

/*
 * image_check's metadata part alone, without reading any blob: every
 * inode reachable once through the reader (only the layouts ferry writes,
 * sizes and ranges in bounds, no directory loops or shared directories,
 * chunk indexes naming real blob chunks). Run before anything hands the
 * bootstrap to the kernel or serves it: the kernel's EROFS parser must
 * never see what ferry has not walked. On failure logs the problem naming
 * the inode path, then that the image is refused; returns -EFSCORRUPTED
 * (or -ENOMEM).
 */
int image_validate_metadata(struct image *img);

/* ------------------------------------------------------------------ */
/* ferry inspect (describe.c)                                          */
/* ------------------------------------------------------------------ */

/*
 * The image as a JSON object (the caller puts it): superblock, chunk
 * size, compression, blobs (device id, digest, sizes, chunks), the
 * embedded prefetch list and a tree summary from a full metadata walk.
 * 0 or -errno.
 */
struct json_object;
int image_describe(struct image *img, struct json_object **out);
/*
 * The entry @path (not following a final symlink): attributes, symlink
 * target, xattr names and, for chunked files, the chunk map (file range
 * -> device, offsets, codec, sha256). -errno logged naming the path.
 */
int image_describe_file(struct image *img, const char *path,
			struct json_object **out);

/* ------------------------------------------------------------------ */
/* What a dynamic loader opens after an ELF file (elf.c, FORMAT.md 2.6) */
/* ------------------------------------------------------------------ */

#define ELF_NEEDED_MAX 64

struct elf_deps {
	char *interp;                   /* PT_INTERP, or NULL */
	char *needed[ELF_NEEDED_MAX];   /* DT_NEEDED names, in order */
	uint32_t nr_needed;
	char *runpath;                  /* DT_RUNPATH, else DT_RPATH, or NULL */
	uint16_t machine;               /* e_machine */
	bool is64;
};

/* Read exactly @len bytes at @off of the file: 0 or -errno. */
typedef int (*elf_read_fn)(void *ctx, uint64_t off, void *buf, size_t len);
/* Told the interpreter as soon as it is known (it is in d->interp too). */
typedef void (*elf_interp_fn)(void *ctx, const char *interp);
/*
 * The dependencies of the @size-byte file that @read reads: 0 and *@d
 * (free with elf_deps_free), 1 when it is not a little-endian ELF file
 * with an interpreter or libraries that this parser understands (nothing
 * to predict), or -errno from @read or allocation. @interp, if not NULL,
 * is called before the dynamic section is read, which in a large program
 * is far from its header and may cost a fetch of its own.
 */
int elf_deps_read(elf_read_fn read, elf_interp_fn interp, void *ctx,
		  uint64_t size, struct elf_deps *d);
void elf_deps_free(struct elf_deps *d);

/*
 * One ELF file's dependencies as `ferry convert` recorded them in the
 * bootstrap (the loader dependencies section), so that a lazy mount
 * queues them at the file's first miss instead of after its header.
 * image.elf is sorted by path, paths unique.
 */
#define IMAGE_ELF_MAX_FILES 65536u
struct image_elf_entry {
	char *path; /* "/a/b" */
	struct elf_deps deps;
};
void image_elf_entries_free(struct image_elf_entry *e, uint32_t nr);

/* ------------------------------------------------------------------ */
/* Prefetch lists (prefetch.c, docs/FORMAT.md 2.5)                     */
/* ------------------------------------------------------------------ */

#define IMAGE_PREFETCH_MAX_PATHS 65536u
#define IMAGE_PREFETCH_PATH_MAX 4096u
#define IMAGE_PREFETCH_LIST_MAX (64u << 20) /* bytes of a list file */

/*
 * Read a prefetch list: one path per line, surrounding blanks trimmed,
 * blank lines and '#' comments skipped, each path normalised to "/a/b"
 * (".." refused), at most IMAGE_PREFETCH_MAX_PATHS in a regular file of
 * at most IMAGE_PREFETCH_LIST_MAX bytes. -EINVAL, -E2BIG, -EFBIG or -errno
 * with a message naming the file (and line).
 */
int image_prefetch_list_load(const char *file, char ***paths, uint32_t *nr);
/*
 * "/a/b" (malloc'ed) from an archive-style path of @len bytes: the form
 * the bootstrap's path sections store; -EINVAL for "..", "" or a path
 * longer than IMAGE_PREFETCH_PATH_MAX.
 */
int image_path_normalize(const char *in, size_t len, char **out);
void image_prefetch_list_free(char **paths, uint32_t nr);

/* ------------------------------------------------------------------ */
/* The bootstrap's extension (sections.c, docs/FORMAT.md 2.4-2.7)      */
/* ------------------------------------------------------------------ */

/*
 * A section of the bootstrap's section area (FORMAT.md 2.7): framed with
 * its magic, version, flags and length, so that readers that do not know
 * it skip it (readers before ferry 0.5.0 never see the area at all). A
 * section readers must understand to serve the image has
 * IMAGE_SECTION_REQUIRED: a reader that does not know it refuses the image.
 */
#define IMAGE_SECTION_REQUIRED 0x1u
#define IMAGE_SECTION_HEADER 24u
struct image_section {
	char magic[8]; /* "FERRYxxN", no NUL */
	uint32_t version;
	uint32_t flags;
	const void *body;
	size_t len;
};

/* What image_open saw in the section area, known or skipped (inspect). */
struct image_section_seen {
	char magic[9];
	uint32_t version, flags;
	uint64_t len;
	bool known;
};

/* Everything the bootstrap's extension carries. */
struct image_ext {
	const struct blob_info *blobs;     /* the blob index, device order */
	uint32_t nr_blobs;
	char *const *prefetch;             /* the prefetch list, or none */
	uint32_t nr_prefetch;
	const struct image_elf_entry *elf; /* loader dependencies: sorted by path, unique */
	uint32_t nr_elf;
	/* The stream blobs' resume points, one per stream blob in blob order:
	 * a required section (FERRYRP1) of the area. */
	const struct blob_stream *streams;
	uint32_t nr_streams;
	/* Sections for the area, after the writer's (FERRYWR1, always written). */
	const struct image_section *sections;
	uint32_t nr_sections;
};

/*
 * The payload (the blob index, then the prefetch list and the loader
 * dependencies when there are any: what readers before 0.5.0 read too)
 * into *@payload, and the section area into *@area (both malloc'ed), as
 * meta_write_opts' ext and sections take them. image_open decodes both.
 */
int image_ext_encode(const struct image_ext *in, void **payload,
		     size_t *payload_len, void **area, size_t *area_len);

/*
 * What this build writes and reads, one format a line (release, image
 * format, bootstrap, its sections, blobs, native layers): the body of
 * ferry --version and ferryd --version after their first line.
 */
void image_print_formats(FILE *out);

/* ------------------------------------------------------------------ */
/* OCI images as conversion sources (oci.c, remote.c)                  */
/* ------------------------------------------------------------------ */

struct json_object;

struct oci_descriptor {
	uint8_t digest[32]; /* sha256 */
	uint64_t size;
	char media_type[128];
};

/* One image manifest, resolved; its layer blobs are not read. */
#define OCI_PLATFORM_MAX 64 /* "os/arch/variant" and its NUL */
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
	/* OCI_PLATFORMS: the image platforms of the index, or none. */
	char (*platforms)[OCI_PLATFORM_MAX];
	uint32_t nr_platforms;
	/* The archive the image is read from (pkg-convert's oci-archive: and
	 * docker-archive:, opaque here), or NULL: its owner closes it, as
	 * oci_image_free does not. */
	void *archive;
};

/*
 * Resolve an oci: or docker: reference to one image manifest, choosing
 * @platform ("os/arch[/variant]", NULL = the host's) from image indexes.
 * Manifests, indexes and the config are digest- and size-checked. A
 * registry image keeps img->remote open for reading its blobs.
 * With @platform OCI_PLATFORMS, a reference to an image index is not
 * resolved: img->platforms lists the platforms of its image manifests
 * (in index order, each once; attestations and other "unknown" ones
 * left out) and img->manifest stays NULL; a manifest resolves as usual.
 */
#define OCI_PLATFORMS "*"
/* @want ("os/arch[/variant]") names @platform: without a variant, any
 * variant of os/arch. */
bool oci_platform_names(const char *want, const char *platform);
int oci_image_open(const struct image_ref *ref, const char *platform,
		   const struct fetch_opts *fopts, struct oci_image *img);
void oci_image_free(struct oci_image *img);
/*
 * Read the file @name of an OCI layout ("index.json", "blobs/sha256/<hex>")
 * into a malloc'ed *@data: 0, -ENOENT when there is none, -EFBIG when it
 * has more than @max bytes, or -errno, each after a message naming it.
 */
typedef int (*oci_file_read_fn)(void *ctx, const char *name, size_t max,
				uint8_t **data, size_t *len);
/*
 * The same as an oci: layout's oci_image_open for a layout whose files
 * come through @read (an archive holding one: pkg-convert's oci-archive:),
 * @where naming it in messages: every document size-limited and
 * digest-checked. img->layout stays NULL: the caller reads the layers.
 */
int oci_image_open_files(const char *where, const char *tag,
			 const char *platform, oci_file_read_fn read, void *ctx,
			 struct oci_image *img);
/* PATH/blobs/sha256/<hex> (allocated). */
int oci_blob_path(const char *layout, const uint8_t digest[32], char **out);
/* A ferry data-blob / bootstrap layer type, current or old. */
bool oci_is_ferry_blob(const char *media_type);
bool oci_is_ferry_bootstrap(const char *media_type);
/*
 * @img is a ferry image of an earlier format: its last layer is a
 * bootstrap of the old type (FERRY_*_OLD, format 1), or its manifest's
 * dev.ferry.version is not FERRY_FORMAT_VERSION (format 2: its diff_ids
 * are the layers' digests).
 */
bool oci_is_old_ferry(const struct oci_image *img);

/*
 * The rootfs.diff_ids of @img's config (img->config_data), one per layer,
 * into @out (img->nr_layers entries). -EFSCORRUPTED (logged) otherwise.
 */
int oci_config_diff_ids(const struct oci_image *img, uint8_t (*out)[32]);

/* ------------------------------------------------------------------ */
/* Ferry indexes of ordinary images (index.c, docs/FORMAT.md 1e)       */
/* ------------------------------------------------------------------ */

#define FERRY_INDEX_ARTIFACT_TYPE "application/vnd.ferry.index.v1"
#define FERRY_INDEX_BOOTSTRAP_MEDIA_TYPE "application/vnd.ferry.index.bootstrap.v1.erofs+zstd"
#define OCI_EMPTY_MEDIA_TYPE "application/vnd.oci.empty.v1+json"

struct image_index_out {
	const uint8_t *bootstrap;   /* raw EROFS bytes: devices = stream blobs */
	size_t bootstrap_len;
	const struct oci_image *subject;     /* the image indexed */
	const uint8_t (*diff_ids)[32];       /* its layers' */
	uint32_t chunk_size;
	const struct fetch_opts *fetch;      /* docker: pushing */
	struct ferry_progress *progress;
};

/*
 * Attach the index @d describes to its image, as an artifact (artifactType
 * FERRY_INDEX_ARTIFACT_TYPE, the bootstrap as its one zstd layer, subject
 * the image's manifest): into the image's OCI layout (blobs, and an
 * untagged index.json entry) or pushed to its repository by digest, and
 * listed in the referrers tag "sha256-<hex>" when the registry has no
 * referrers API. An index of the same image that was there is replaced in
 * index.json or that tag. No layer is written. The manifest's digest and
 * size, and the bytes written or uploaded, are returned.
 */
int image_index_attach(const struct image_index_out *d,
		       char manifest_digest[DIGEST_STRING_SIZE],
		       uint64_t *manifest_size, uint64_t *index_bytes);

/* ------------------------------------------------------------------ */
/* Writing an image (write.c)                                          */
/* ------------------------------------------------------------------ */

/*
 * A destination being written: dir:PATH, oci:PATH[:TAG] (default tag
 * "latest") or docker://HOST[:PORT]/REPO[:TAG], the last through a
 * staging OCI layout in $TMPDIR (default /var/tmp) that is pushed and
 * removed. The writer of the blob files (pkg-convert) puts them into
 * image_out_blobs_dir, each named by its sha256 hex.
 */
struct image_out;

/*
 * Create the directories (and oci-layout) the destination needs, after
 * checking what is there: an absent or empty directory is used; an
 * existing dir: image or oci: tag only with @replace; anything else is
 * refused (-EEXIST, logged). A dir: image is written into a staging
 * directory beside PATH (".NAME.ferry-XXXXXX") that image_out_finish
 * renames into place, so PATH never holds half an image; an oci: layout
 * is locked while written. Staging directories and temporary files that
 * a killed conversion left are removed first.
 */
int image_out_open(const struct image_ref *dest, bool replace, struct image_out **out);
/* The directory the image is laid out in: PATH, or the staging layout. */
const char *image_out_dir(const struct image_out *o);
/* Its blobs/sha256 (borrowed, valid until image_out_close). */
const char *image_out_blobs_dir(const struct image_out *o);

struct image_out_blob {
	const struct blob_info *info; /* borrowed */
	const char *source_layer;     /* "sha256:…" it was converted from, or NULL */
	bool from_dict;               /* borrowed from --chunk-dict */
};

struct image_out_desc {
	const uint8_t *bootstrap;  /* the raw bootstrap */
	size_t bootstrap_len;
	const struct image_out_blob *blobs; /* in device order */
	uint32_t nr_blobs;
	uint32_t chunk_size;
	const char *compression;   /* "zstd:3", as blob_compress_parse takes */
	/* The OCI image converted: its config is kept and it is named in
	 * annotations; NULL: a minimal config for the host's platform. */
	const struct oci_image *source;
	const struct fetch_opts *fetch;   /* docker: push; NULL = defaults */
	struct ferry_progress *progress;  /* docker: push */
	/* One image of an index image_out_finish_index writes: stored (oci:)
	 * or pushed by digest (docker:), not tagged. */
	bool index_member;
};

/*
 * Write the bootstrap and the index naming the blobs: dir: bootstrap and
 * ferry.json; oci: the zstd-compressed bootstrap blob, the config, the
 * manifest, and the tag in index.json; docker: that, then push every blob
 * the registry lacks and the manifest under the tag. The manifest's
 * digest and size (oci:, docker:) go to @manifest_digest / @manifest_size.
 */
int image_out_finish(struct image_out *o, const struct image_out_desc *d,
		     char manifest_digest[DIGEST_STRING_SIZE],
		     uint64_t *manifest_size);
/* A member of an image index: a manifest written by image_out_finish. */
struct image_out_index_entry {
	char platform[OCI_PLATFORM_MAX]; /* "os/arch[/variant]" */
	uint8_t digest[32];
	uint64_t size;
};

/*
 * An OCI image index of @entries (index_member images of @o) under the
 * destination's tag: oci: stored and tagged; docker: pushed by tag
 * (its members were pushed by digest). Its digest and size go to
 * @index_digest / @index_size. dir: destinations are -EINVAL.
 */
int image_out_finish_index(struct image_out *o,
			   const struct image_out_index_entry *entries,
			   uint32_t nr, const struct fetch_opts *fopts,
			   char index_digest[DIGEST_STRING_SIZE], uint64_t *index_size);

/*
 * Rewrite the old-format ferry image @src (oci_is_old_ferry) into @o in
 * the current format: the same blobs, current layer types, the snapshot
 * labels, a config with the layers' diff_ids (docs/FORMAT.md 1a).
 */
int image_out_upgrade(struct image_out *o, const struct oci_image *src,
		      const struct fetch_opts *fopts, struct ferry_progress *progress,
		      char manifest_digest[DIGEST_STRING_SIZE], uint64_t *manifest_size);

/*
 * Native EROFS layers (containerd's application/vnd.erofs.layer.v1): one
 * standalone EROFS image per layer, already in image_out_blobs_dir under
 * its sha256, which is also its diff_id.
 */
#define EROFS_LAYER_MEDIA_TYPE "application/vnd.erofs.layer.v1"

/*
 * A native layer's range table (docs/FORMAT.md 1d): appended to the layer
 * after its EROFS image and named by two annotations of its descriptor
 * (where it starts, its sha256), so a lazy mount verifies every range of
 * the image it fetches. Little-endian: magic, u32 range size, u32 ranges,
 * u64 image bytes (== the table's offset), u64 metadata bytes (the
 * image's head that holds every metadata structure, read into memory at
 * mount: at most FERRY_BOOTSTRAP_MAX), then one sha256 per range, the
 * last range short.
 */
#define LAYER_RANGES_MAGIC "FERRYRT1"
#define LAYER_RANGES_HEADER 32u
#define LAYER_RANGE_SIZE (128u << 10)
#define LAYER_RANGES_MAX (64u << 20) /* table bytes a reader accepts */
#define LAYER_RANGES_OFFSET_ANNOTATION "dev.ferry.erofs.range-table.offset"
#define LAYER_RANGES_DIGEST_ANNOTATION "dev.ferry.erofs.range-table.digest"
/* The table of an image of @image_bytes whose metadata is its first
 * @meta_bytes, from the sha256 of each LAYER_RANGE_SIZE range. */
int image_layer_ranges_encode(uint64_t image_bytes, uint64_t meta_bytes,
			      const uint8_t (*range_sha256)[32], uint8_t **buf,
			      size_t *len);
/*
 * The table @table (@len bytes, at @offset of the layer @digest names;
 * its sha256 checked by the caller) as the chunk table of blob @b: one
 * uncompressed chunk per range, each its own frame, at the same offset in
 * the layer and in its cache data file (the layer's EROFS image), @b's
 * size and table_sha256 as blob_info_as_table sets them; the metadata
 * bytes into *@meta_bytes. -EFSCORRUPTED (logged) for a malformed table.
 */
int image_layer_ranges_decode(const void *table, size_t len, uint64_t offset,
			      const uint8_t digest[32], struct blob_info *b,
			      uint64_t *meta_bytes);

struct image_out_layer {
	uint8_t digest[32];
	uint64_t size;
	const uint8_t *source; /* digest of the OCI layer it came from, or NULL */
	uint64_t ranges_offset;    /* its range table; 0: none */
	uint8_t ranges_digest[32];
};

struct image_out_layers_desc {
	const char *media_type;             /* of every layer */
	const struct image_out_layer *layers; /* bottom first */
	uint32_t nr_layers;
	/* Its config is kept with rootfs.diff_ids replaced and "erofs" in
	 * os.features; NULL: a minimal config for the host's platform. */
	const struct oci_image *source;
	const struct fetch_opts *fetch;
	struct ferry_progress *progress;
	bool index_member; /* as image_out_desc's */
};

/*
 * Write config, manifest and tag of a native-layer image (oci:, docker:
 * pushed as image_out_finish does); dir: destinations are -EINVAL.
 */
int image_out_finish_layers(struct image_out *o,
			    const struct image_out_layers_desc *d,
			    char manifest_digest[DIGEST_STRING_SIZE],
			    uint64_t *manifest_size);

/*
 * Release @o. A staging directory that was not renamed into place is
 * removed; with @failed, so is an oci: layout that image_out_open created.
 * In a layout that existed, finished blobs may be shared with other
 * images (same digest), so they stay.
 */
void image_out_close(struct image_out *o, bool failed);

/* ------------------------------------------------------------------ */
/* Lazy reads through the chunk cache (cache.c)                        */
/* ------------------------------------------------------------------ */

/*
 * An image's blobs opened in the chunk cache @cache_dir (the image is
 * recorded there first, so gc keeps its blobs). Reads make the chunks
 * they touch present — fetched from the image's blob sources, verified —
 * and then read the cache data files. Thread-safe, except that prefetch
 * and image_cache_set_bwlimit belong to one thread at a time. @img must
 * outlive it.
 */
struct image_cache;
struct ferry_progress;
int image_cache_open(struct image *img, const char *cache_dir,
		     struct image_cache **out);
void image_cache_close(struct image_cache *ic);

/* Blob @index's cache data file: the EROFS device file once complete. */
const char *image_cache_data_path(const struct image_cache *ic, uint32_t index);

/*
 * Read up to @len bytes at @off of the regular file @st (from
 * meta_getattr): bytes read (short at EOF) or -errno; a chunk that fails
 * to verify is -EIO, logged naming blob and chunk. Holes read as zeros.
 */
ssize_t image_cache_read(struct image_cache *ic, const struct meta_stat *st,
			 uint64_t off, void *buf, size_t len);
/*
 * The same from what is already present only: -EAGAIN, with nothing
 * fetched, where a chunk is missing. Not counted as bytes read (for
 * speculative reads: ferryd's directory readahead).
 */
ssize_t image_cache_read_cached(struct image_cache *ic, const struct meta_stat *st,
				uint64_t off, void *buf, size_t len);

/* A piece of a file: @len bytes at @off of cache data file @fd, or zeros (@fd -1). */
struct image_extent {
	int fd;
	uint64_t off;
	size_t len;
};

/*
 * For zero-copy replies: make the chunks behind up to @len bytes at @off of
 * the chunk-based regular file @st present, and describe where the bytes
 * are in at most @max extents (contiguous pieces merged), clamped to the
 * file's size. Returns the number of extents, -E2BIG when more are needed,
 * -EINVAL for a file without chunks (inline: use image_cache_read), or
 * -errno as image_cache_read. The descriptors stay valid while @ic is open;
 * on success the bytes stay in place (no eviction) until the caller,
 * having used them, calls image_cache_map_end (soon: evictions wait).
 */
ssize_t image_cache_map(struct image_cache *ic, const struct meta_stat *st,
			uint64_t off, size_t len, struct image_extent *ext,
			size_t max);
void image_cache_map_end(struct image_cache *ic);

/*
 * Blobs are named by their 0-based blob index here, as everywhere but
 * the EROFS device table (device id = index + 1).
 *
 * Make [@uoff, @uoff + @len) of blob @index present.
 */
int image_cache_ensure(struct image_cache *ic, uint32_t index,
		       uint64_t uoff, uint64_t len);
/*
 * The frames of blob @index overlapping [@uoff, @uoff + @len) to
 * @emit (blob_cache_read_frames): from the chunk cache where it has them,
 * else fetched and verified without being kept there; counted as bytes
 * read and fetched. For a reader that keeps the bytes itself (cachefiles:
 * the kernel's cache file), so the two caches do not hold them twice.
 */
int image_cache_read_frames(struct image_cache *ic, uint32_t index,
			    uint64_t uoff, uint64_t len, blob_emit_fn emit, void *ctx);
/*
 * Without I/O or locks: is [@uoff, @uoff + @len) of blob @index
 * known present (false may only mean "ask image_cache_ensure")? Is all
 * of that blob present?
 */
bool image_cache_present(const struct image_cache *ic, uint32_t index,
			 uint64_t uoff, uint64_t len);
bool image_cache_blob_complete(const struct image_cache *ic, uint32_t index);
/* The kernel reads the data files after present checks: blob_cache_kernel_reads. */
void image_cache_kernel_reads(struct image_cache *ic);

/*
 * Prefetch of every blob (with @progress, may be NULL): in steps of at
 * most 4 MiB, each of which first waits (up to 200 ms) while demand reads
 * are in flight, within the bandwidth limit. Stops early when *@stop
 * becomes true.
 */
int image_cache_prefetch_blobs(struct image_cache *ic,
			       struct ferry_progress *progress,
			       const _Atomic bool *stop);
/*
 * Prefetch of listed paths (an image's embedded list, a mount's
 * --prefetch-files). image_prefetch_plan_add adds @path in the image
 * (symlinks followed) to *@plan, allocated on first use: a regular file,
 * or a directory standing for every file below it (at most 64 levels; the
 * image must have passed image_validate_metadata, so its directories form
 * a tree and each is visited once). It returns the files added, -ENOENT
 * when there is no such path, or -errno; each call is one list position.
 * image_cache_prefetch_plan then makes the plan's chunks present: ranges
 * of one blob less than 128 KiB apart fetched as one (up to 2 MiB), eight
 * fetches at a time, the ranges of the first-listed paths first. It does
 * not wait for demand reads — the list names what readers are about to
 * want, and a reader waiting for a range being fetched gets it with that
 * fetch; while it runs, a demand miss inside a planned range queues no
 * fetch-ahead — but keeps to the bandwidth limit. A range that fails does not
 * stop the others; stops early when *@stop becomes true. 0 or the first
 * -errno.
 */
struct image_prefetch_plan;
int image_prefetch_plan_add(struct image_cache *ic, struct image_prefetch_plan **plan,
			    const char *path);
int image_cache_prefetch_plan(struct image_cache *ic, struct image_prefetch_plan *plan,
			      const _Atomic bool *stop);
void image_prefetch_plan_free(struct image_prefetch_plan *plan);
/* Prefetch bytes per second (uncompressed), 0 = unlimited. */
void image_cache_set_bwlimit(struct image_cache *ic, uint64_t bytes_per_sec);
/*
 * Where prefetch puts the bytes instead of the chunk cache: a reader that
 * keeps them itself (cachefiles: the kernel's cache files). @has: does
 * the sink hold [@uoff, @uoff + @len) of blob @index already (then
 * nothing is fetched); @put: the whole frames of a range prefetch wants,
 * as image_cache_read_frames emits them. Set before prefetch starts.
 */
struct image_prefetch_sink {
	bool (*has)(void *ctx, uint32_t index, uint64_t uoff, uint64_t len);
	int (*put)(void *ctx, uint32_t index, uint64_t uoff, const void *buf, size_t len);
	void *ctx;
};
void image_cache_set_prefetch_sink(struct image_cache *ic,
				   const struct image_prefetch_sink *sink);

/*
 * Upper bounds (milliseconds) of the buckets of the miss latency
 * histogram: how long a demand read waited for its chunks to be fetched,
 * verified and written. The last bucket counts everything slower.
 */
#define IMAGE_LATENCY_BOUNDS_MS { 1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 10000 }
#define IMAGE_LATENCY_BUCKETS 12

struct image_cache_stats {
	uint64_t bytes_read;       /* file bytes served by image_cache_read */
	uint64_t bytes_fetched;    /* compressed bytes read from the sources */
	uint64_t bytes_prefetched; /* uncompressed bytes made present by prefetch */
	uint64_t bytes_ahead;      /* uncompressed bytes fetch-ahead covered */
	uint64_t fetches;          /* reads from the sources (registry requests) */
	uint64_t fetches_ahead;    /* of those, by fetch-ahead: off readers' paths */
	/* Programs whose libraries were predicted from the image's record of
	 * them (FORMAT.md 2.6), and from their headers read in the mount. */
	uint64_t programs_recorded, programs_read;
	/* Compiled Python modules whose imports were read (Python prediction). */
	uint64_t modules_read;
	uint64_t chunks_present, chunks_total, bytes_present;
	/* Demand reads: served from present chunks, or after fetching. */
	uint64_t hits, misses, fetch_errors, inflight;
	uint64_t miss_ms[IMAGE_LATENCY_BUCKETS]; /* per bucket, not cumulative */
	uint64_t miss_ns_total;
	/* The registry client's (0 for a local image). */
	uint64_t requests, retries;
	uint64_t bytes_evicted;    /* uncompressed bytes of its blobs evicted */
};
void image_cache_get_stats(struct image_cache *ic, struct image_cache_stats *s);

/*
 * The mount(2) flags every mode adds to read-only: MS_NOSUID and
 * MS_NODEV, unless the image is trusted with its setuid bits (@suid) or
 * its device nodes (@dev).
 */
unsigned long image_mount_flags(bool suid, bool dev);

/*
 * Mount @ic's image with the kernel on @target (meta_kernel_mount, @flags
 * as there): its bootstrap file (image_bootstrap_file, in @cache_dir for
 * oci: and docker: images) and one device= per blob naming its cache data
 * file, each through the descriptor this process holds and verified or
 * filled ("/proc/self/fd/N", also the mount's source in mountinfo), so
 * the kernel opens exactly those files. Data not yet present reads as
 * holes: only local mode's complete cache, or fanotify's events, make
 * that safe.
 */
#define IMAGE_FD_SOURCE "/proc/self/fd/"
int image_cache_kernel_mount(struct image_cache *ic, const char *cache_dir,
			     const char *target, unsigned long flags);
/*
 * Native layers (img->erofs_layers): make each layer's metadata present
 * and walk it (pkg-meta), before anything marks or mounts the cache
 * files. image_cache_kernel_mount then mounts each layer file-backed
 * over its cache data file, detached, and stacks them with overlayfs on
 * @target (source IMAGE_LAYERS_SOURCE; one layer is attached directly).
 * It sets img->layer_units (the spans of compressed files' pclusters).
 */
int image_cache_walk_layers(struct image_cache *ic);
/*
 * Native layers: image_cache_kernel_mount calls @noted with the bottom
 * layer's sysfs directory (meta_sysfs_path: the superblock that lives as
 * long as the stack) once the layers are mounted and before the stack is
 * attached on its mount point, so a keeper knows it before any reader can
 * reach the mount.
 */
void image_cache_set_sb_note(struct image_cache *ic,
			     void (*noted)(void *ctx, const char *sysfs), void *ctx);

/* The fstype of a ferry FUSE mount (fuse.<subtype>). */
#define IMAGE_FUSE_FSTYPE "fuse.ferry"
/* A mount ferry made (kernel EROFS, ferry's FUSE, or the overlay of
 * native layers): never stacked over. */
struct mount_entry;
bool image_mount_is_ferry(const struct mount_entry *mi);

/*
 * The canonical path (realpath) of the directory @mountpoint in *@canon
 * (malloc'ed), for the local mounts below, taken before the image is
 * fetched: 0, or -errno logged naming it (a missing one, a file, a mount
 * point that holds a ferry mount already).
 */
int image_mountpoint_check(const char *mountpoint, char **canon);
/*
 * Open the image in the chunk cache @cache_dir, make every chunk of every
 * blob present, then mount the bootstrap on @mountpoint (canonical:
 * image_mountpoint_check's, not resolved again; a symbolic link swapped
 * into it since is refused) with the kernel,
 * one device= per blob naming its complete cache data file (@flags as for
 * meta_kernel_mount: MS_NOSUID | MS_NODEV unless the image is trusted),
 * and pin those blobs in the cache for as long as the mount exists. A
 * mount point that holds a ferry mount (erofs or fuse.ferry) already is
 * refused (-EBUSY).
 */
int image_mount_local(struct image *img, const char *cache_dir,
		      const char *mountpoint, unsigned long flags);

/*
 * Native EROFS layers (image_out_finish_layers' images): mount each layer
 * file-backed (digest-checked, walked by pkg-meta first) as a detached
 * mount and stack them read-only with overlayfs on @mountpoint (canonical,
 * as for image_mount_local; source
 * IMAGE_LAYERS_SOURCE), as containerd's EROFS snapshotter does; one layer
 * is attached directly. docker:// layers are downloaded whole into
 * @cache_dir/erofs-layers first. Returns 1, touching nothing, when @ref
 * is not such an image (a ferry image: use image_mount_local).
 */
#define IMAGE_LAYERS_SOURCE "ferry-erofs-layers"
int image_mount_erofs_layers(const char *ref, const struct fetch_opts *fopts,
			     const char *cache_dir, const char *mountpoint,
			     unsigned long flags);
/*
 * Put the @nr detached layer mounts @mfds (bottom first) on @target as
 * image_mount_erofs_layers does: one attached directly, more stacked
 * read-only with overlayfs. Our descriptors stay open (the caller
 * closes them; the overlay holds its own). For modes that mount the
 * layers themselves (EROFS over fscache).
 */
int image_layers_attach(const int *mfds, uint32_t nr, const char *target,
			unsigned long flags);

/*
 * The cachefiles mode's kernel cache, @cache_dir/fscache: ferryd binds it
 * to /dev/cachefiles and the kernel owns what is inside (cache/I<volume>/
 * @<hash>/D<cookie>: volume "erofs,<fsid or domain>", cookie a blob's
 * sha256 or a bootstrap's fsid, both hex, or a native layer's (its
 * sha256, or a second copy's "kk-" + 61 hex digits); graveyard/ what it
 * culled).
 * image_fscache_usage: its files and allocated bytes (zeros when there is
 * none); *@holder: the pid holding /dev/cachefiles (0: none, the cache is
 * not bound; root sees every holder). The files of objects in use are
 * unlinked temporary files until the kernel lets go: not counted.
 * image_fscache_gc: unless /dev/cachefiles is held (then it removes
 * nothing and says which process holds it: the kernel culls a bound cache
 * itself), remove every cache file that names no blob an image record or
 * a live mount names (bootstraps too: refilled from memory at the next
 * mount), the graveyard, and directories left empty.
 */
#define IMAGE_FSCACHE_DIR "fscache"
#define IMAGE_CACHEFILES_DEVICE "/dev/cachefiles"
struct image_fscache_usage {
	uint64_t files, disk_bytes;
	int holder;
	char holder_comm[32];
};
int image_fscache_usage(const char *cache_dir, struct image_fscache_usage *u);
int image_fscache_gc(const char *cache_dir, uint64_t *freed, uint32_t *removed,
		     struct image_fscache_usage *u);

/*
 * Remove the registry documents and bootstraps kept in @cache_dir (meta/,
 * bootstraps/: see image_open's cache_dir) that no image record keeps
 * (blob_cache_kept), and leftover temporary files, once older than a
 * minute: a mount that is opening its image writes them before its
 * record. *@freed / *@removed (may be NULL): bytes and files removed.
 */
int image_meta_gc(const char *cache_dir, uint64_t *freed, uint32_t *removed);

#endif
