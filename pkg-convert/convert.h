/* SPDX-License-Identifier: MIT */
/*
 * pkg-convert: turns a source tree (a directory, or a tar stream that may
 * be gzip / zstd / xz compressed) into a ferry image: one bootstrap (EROFS
 * metadata, pkg-meta) plus chunk-deduplicated data blobs (pkg-blob).
 *
 * Errors: 0 or a negative errno with a log line naming the source path or
 * tar entry. Not thread-safe; one conversion per call.
 */
#ifndef FERRY_CONVERT_H
#define FERRY_CONVERT_H

#include <stdbool.h>
#include <stdint.h>

#include "../pkg-blob/blob.h"
#include "../pkg-fetch/fetch.h"
#include "../pkg-meta/meta.h"

#define CONVERT_DEFAULT_CHUNK_SIZE (1u << 20)
#define CONVERT_DEFAULT_INLINE_MAX 256u

struct convert_opts {
	uint32_t chunk_size;   /* power of two, 4 KiB .. 64 MiB */
	uint32_t inline_max;   /* regular files up to this size live in the bootstrap */
	struct blob_compress compress;
	unsigned int jobs;     /* compression threads; 0 = online CPUs */
	const char *platform;  /* oci: sources: "os/arch[/variant]"; NULL = host */
	const char *chunk_dict; /* image whose stored chunks are reused, or NULL */
	const struct fetch_opts *fetch; /* docker:// references; NULL = defaults */
	/* A file listing paths (one per line) that lazy mounts prefetch
	 * first; kept in the bootstrap. NULL = none. */
	const char *prefetch_files;
};

/* Media types of a ferry image in an OCI layout or registry. */
#define OCI_MANIFEST_TYPE "application/vnd.oci.image.manifest.v1+json"
#define FERRY_BLOB_MEDIA_TYPE "application/vnd.ferry.blob.v1"
/* In OCI layouts the bootstrap is stored as one zstd frame: it is always
 * fetched whole before use, and compressing it saves ~70% of its bytes. */
#define FERRY_BOOTSTRAP_MEDIA_TYPE "application/vnd.ferry.bootstrap.v1.erofs+zstd"
#define FERRY_BOOTSTRAP_DIGEST_ANNOTATION "dev.ferry.bootstrap.uncompressed-digest"
#define FERRY_BOOTSTRAP_MAX (1ull << 30) /* larger bootstraps are refused */

struct convert_blob_stat {
	char digest[72]; /* "sha256:<hex>" */
	uint64_t size, uncompressed_size;
	uint32_t nr_chunks;
	bool from_dict;  /* borrowed from --chunk-dict, not written */
};

struct convert_stats {
	uint64_t entries;
	uint64_t files, dirs, symlinks, specials, hardlinks;
	uint64_t bytes_in;        /* regular file bytes read from the source */
	uint64_t bytes_inline;    /* of which stored in the bootstrap */
	uint64_t bytes_zero;      /* of which all-zero chunks (holes) */
	uint64_t chunks_total;    /* chunks referenced by files */
	uint64_t chunks_unique;   /* chunks stored by this conversion */
	uint64_t bytes_unique;    /* uncompressed bytes stored by this conversion */
	uint64_t bootstrap_bytes;
	uint32_t nr_blobs;        /* devices of the image, in device order */
	struct convert_blob_stat *blobs;
	char manifest_digest[72]; /* oci: and docker: destinations */
	uint64_t manifest_size;
	double seconds;
};

/* Free what convert_run allocated in @stats. */
void convert_stats_free(struct convert_stats *stats);

/*
 * Check SOURCE ("dir:PATH" / "tar:PATH"), DEST ("dir:PATH") and options
 * without touching the file system: 0 or -EINVAL with a message.
 */
int convert_check_args(const char *source, const char *dest,
		       const struct convert_opts *opts);

/*
 * Convert SOURCE ("dir:PATH", "tar:PATH", "oci:PATH[:TAG]") into DEST
 * ("dir:OUT", "oci:PATH[:TAG]", default tag "latest").
 */
int convert_run(const char *source, const char *dest,
		const struct convert_opts *opts, struct convert_stats *stats);

/* ------------------------------------------------------------------ */
/* Converted images                                                    */
/* ------------------------------------------------------------------ */

/*
 * A converted image: dir:OUT (OUT/bootstrap, OUT/blobs/sha256/<hex>,
 * OUT/ferry.json), oci:PATH[:TAG] or docker://HOST[:PORT]/REPO[:TAG|@DIGEST]
 * (docs/FORMAT.md). image_open reads the index, loads and verifies the
 * bootstrap, opens it with pkg-meta and decodes its blob index, checking
 * that the device table, the blob index and the image index agree. Blob
 * bytes stay where they are (local file or registry) until read.
 */
struct image;

/* Where the bytes of one blob come from (image_blob_source). */
struct image_blob {
	struct image *img;
	uint32_t index;
	int fd; /* local blob file, opened on first use; -1 */
};

struct image {
	char *ref;            /* as given, for messages */
	char *dir;            /* OUT or PATH; NULL for a registry image */
	struct registry *remote; /* docker: the repository's client */
	char *bootstrap_path;    /* raw EROFS file; NULL until needed for oci:/docker: */
	uint8_t *bootstrap;      /* the bootstrap's bytes (verified) */
	size_t bootstrap_len;
	uint8_t bootstrap_digest[BLOB_DIGEST_SIZE]; /* of the raw bytes */
	/* The manifest's digest (oci:, docker:) or the bootstrap's (dir:). */
	uint8_t image_digest[BLOB_DIGEST_SIZE];
	struct meta_image *meta;
	struct blob_index blobs; /* blob i is device_id i + 1 */
	char **blob_paths;       /* local blob files; NULL entries for docker: */
	struct image_blob *blob_srcs;
	uint32_t chunk_size;
	char compression[32];
	char **prefetch;      /* the embedded prefetch list ("/a/b"), or NULL */
	uint32_t nr_prefetch;
};

struct image_opts {
	const struct fetch_opts *fetch; /* docker: client options; NULL = defaults */
	const char *platform;           /* image indexes; NULL = the host's */
};

/* @opts may be NULL. */
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
/* Put blob @index into the OCI layout @layout (linked, or downloaded). */
int image_copy_blob(struct image *img, uint32_t index, const char *layout);

struct image_check_report {
	uint64_t inodes, chunks, bytes_verified;
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

/* ------------------------------------------------------------------ */
/* Lazy reads through the chunk cache (lazy.c)                         */
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
 * -errno as image_cache_read. The descriptors stay valid while @ic is open.
 */
ssize_t image_cache_map(struct image_cache *ic, const struct meta_stat *st,
			uint64_t off, size_t len, struct image_extent *ext,
			size_t max);

/* Make [@uoff, @uoff + @len) of device @device_id (1-based) present. */
int image_cache_ensure(struct image_cache *ic, uint32_t device_id,
		       uint64_t uoff, uint64_t len);
/*
 * Without I/O or locks: is [@uoff, @uoff + @len) of device @device_id
 * known present (false may only mean "ask image_cache_ensure")? Is all
 * of that blob present?
 */
bool image_cache_present(const struct image_cache *ic, uint32_t device_id,
			 uint64_t uoff, uint64_t len);
bool image_cache_blob_complete(const struct image_cache *ic, uint32_t device_id);

/*
 * Prefetch: make every chunk of file @st, or of every blob (with
 * @progress, may be NULL), present in steps of at most 4 MiB; each step
 * first waits (up to 200 ms) while demand reads are in flight, and keeps
 * to the bandwidth limit. Stops early when *@stop becomes true.
 */
int image_cache_prefetch_file(struct image_cache *ic, const struct meta_stat *st,
			      const volatile bool *stop);
int image_cache_prefetch_blobs(struct image_cache *ic,
			       struct ferry_progress *progress,
			       const volatile bool *stop);
/* Prefetch bytes per second (uncompressed), 0 = unlimited. */
void image_cache_set_bwlimit(struct image_cache *ic, uint64_t bytes_per_sec);

struct image_cache_stats {
	uint64_t bytes_read;       /* file bytes served by image_cache_read */
	uint64_t bytes_fetched;    /* compressed bytes read from the sources */
	uint64_t bytes_prefetched; /* uncompressed bytes made present by prefetch */
	uint64_t chunks_present, chunks_total, bytes_present;
};
void image_cache_get_stats(struct image_cache *ic, struct image_cache_stats *s);

/*
 * Open the image in the chunk cache @cache_dir, make every chunk of every
 * blob present, then mount the bootstrap on @target with the kernel, one
 * device= per blob naming its complete cache data file.
 */
int image_mount_local(struct image *img, const char *cache_dir,
		      const char *target);

/*
 * Set img->bootstrap_path to a raw bootstrap file the kernel can mount:
 * the image's own (dir:), else CACHE/bootstraps/<sha256>, written once.
 */
int image_bootstrap_file(struct image *img, const char *cache_dir);

#endif
