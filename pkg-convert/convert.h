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
	char manifest_digest[72]; /* oci: destinations */
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
/* Converted images on disk ("dir:OUT")                                */
/* ------------------------------------------------------------------ */

/*
 * dir:OUT holds OUT/bootstrap, OUT/blobs/sha256/<hex> and OUT/ferry.json
 * (docs/FORMAT.md). image_open reads the index, opens the bootstrap with
 * pkg-meta and decodes its blob index, checking that the device table,
 * the blob index and ferry.json agree.
 */
struct image {
	char *ref;            /* as given, for messages */
	char *dir;            /* OUT */
	char *bootstrap_path;    /* raw EROFS file; NULL until needed for oci: */
	uint8_t *bootstrap;      /* the bootstrap's bytes (verified) */
	size_t bootstrap_len;
	uint8_t bootstrap_digest[BLOB_DIGEST_SIZE]; /* of the raw bytes */
	struct meta_image *meta;
	struct blob_index blobs; /* blob i is device_id i + 1 */
	char **blob_paths;       /* OUT/blobs/sha256/<hex> */
	uint32_t chunk_size;
	char compression[32];
};

int image_open(const char *ref, struct image **out);
void image_close(struct image *img);

struct image_check_report {
	uint64_t inodes, chunks, bytes_verified;
	int error; /* first error, 0 when the image is intact */
};

/*
 * Walk every inode through the reader (validating metadata and that each
 * chunk index names a chunk of its blob with the right length), then
 * decompress and verify every chunk of every blob. Logs the first problem
 * naming the inode path or the blob and chunk.
 */
int image_check(struct image *img, struct image_check_report *report);

/*
 * Materialise every blob into CACHE/devices/<hex> (verified; reused when
 * already present with the right size) and mount the bootstrap on @target
 * with the kernel.
 */
int image_mount_local(struct image *img, const char *cache_dir,
		      const char *target);

#endif
