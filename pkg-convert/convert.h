/* SPDX-License-Identifier: MIT */
/*
 * pkg-convert: turns a source — a directory, a tar archive (plain, gzip,
 * zstd or xz), or an OCI image in a layout or a registry, whose layers are
 * merged with OCI whiteout semantics — into a ferry image: one bootstrap
 * (EROFS metadata, pkg-meta) plus chunk-deduplicated data blobs
 * (pkg-blob), written as a dir:, oci: or docker:// image through
 * pkg-image, which also parses every reference.
 *
 * The output is a deterministic function of the source, the options and
 * the release (sorted directory entries, archive order, blob bytes
 * independent of --jobs; the bootstrap's writer section names the
 * release).
 *
 * Errors: 0 or a negative errno with a log line naming the source path,
 * tar entry, layer or blob: -EINVAL for bad references or options,
 * -EFSCORRUPTED for a source that does not match its digest or does not
 * parse, pkg-image's and pkg-fetch's errors for images and registries.
 *
 * Thread-safety: one conversion per call; concurrent calls share nothing
 * but must not write the same destination. Compression runs on --jobs
 * worker threads inside a call.
 */
#ifndef FERRY_CONVERT_H
#define FERRY_CONVERT_H

#include <stdbool.h>
#include <stdint.h>

#include "../pkg-image/image.h"

#define CONVERT_DEFAULT_CHUNK_SIZE (1u << 20)
#define CONVERT_DEFAULT_INLINE_MAX 256u

enum convert_format {
	CONVERT_FORMAT_FERRY,       /* bootstrap + chunk blobs (the default) */
	/*
	 * One standalone EROFS image per OCI layer, whiteouts in overlayfs
	 * form, media type EROFS_LAYER_MEDIA_TYPE: containerd's native EROFS
	 * layers (pkg-convert/erofslayers.c). oci:/docker:/tar: sources,
	 * oci:/docker: destinations; chunk options do not apply.
	 */
	CONVERT_FORMAT_EROFS_LAYERS,
};

struct convert_opts {
	enum convert_format format;
	uint32_t chunk_size;   /* power of two, 4 KiB .. 64 MiB */
	uint32_t inline_max;   /* regular files up to this size live in the bootstrap */
	struct blob_compress compress;
	unsigned int jobs;     /* compression threads; 0 = online CPUs */
	/* oci: and docker: sources that are image indexes: this platform
	 * ("os/arch[/variant]") only, converted into one image; NULL: an
	 * index of ferry images of @platforms (NULL: every platform of the
	 * source index), or the host's platform for a dir: DEST. */
	const char *platform;
	const char *const *platforms; /* NULL-terminated */
	const char *chunk_dict; /* image whose stored chunks are reused, or NULL */
	const struct fetch_opts *fetch; /* docker:// references; NULL = defaults */
	/* A file listing paths (one per line) that lazy mounts prefetch
	 * first; kept in the bootstrap. NULL = none. */
	const char *prefetch_files;
	bool replace;          /* an existing dir: image or oci: tag may be replaced */
	/* No loader dependencies section (FORMAT.md 2.6): for ferryd before it. */
	bool no_loader_deps;
	/* --format erofs-layers: no fragments (EROFS FRAGMENTS needs Linux
	 * 6.1 and erofs-utils 1.6 to read). */
	bool no_fragments;
	/* --format erofs-layers: raw deflate at this level (1..9; Linux 6.6)
	 * instead of compress; 0 = compress says. */
	int deflate_level;
	/* ferry index: compressed bytes between resume points (at least;
	 * the next deflate block or zstd frame boundary). */
	uint64_t span;
	/* While *@cancel is true the conversion stops (-ECANCELED) and
	 * leaves the destination as it was; NULL = never. */
	const _Atomic bool *cancel;
};

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
	char manifest_digest[72]; /* oci: and docker: destinations (an index's) */
	uint64_t manifest_size;
	/* An index converted: its members (the numbers above are their sums). */
	struct convert_platform_stat {
		char platform[64];
		char manifest_digest[72];
		uint64_t manifest_size;
	} *platforms;
	uint32_t nr_platforms;
	double seconds;
	bool upgraded;            /* a format-1 ferry image rewritten, nothing converted */
	/* ferry index */
	uint64_t layer_bytes;     /* the image's layers (compressed) */
	uint64_t points;          /* resume points recorded */
	uint64_t index_bytes;     /* the attached index: its blobs and manifest */
};

/* Free what convert_run allocated in @stats. */
void convert_stats_free(struct convert_stats *stats);

/*
 * Check SOURCE (dir:PATH, tar:PATH, oci:PATH[:TAG] or
 * docker://HOST[:PORT]/REPO[:TAG|@DIGEST]), DEST (dir:PATH,
 * oci:PATH[:TAG] or docker://HOST[:PORT]/REPO[:TAG]) and the options
 * without touching the file system or a registry: 0 or -EINVAL with a
 * message. Bare paths are refused: a conversion names its transports.
 */
int convert_check_args(const char *source, const char *dest,
		       const struct convert_opts *opts);

/*
 * Convert SOURCE into DEST (both as for convert_check_args). dir: and tar:
 * sources become one blob; oci: and docker: sources one blob per layer
 * that adds chunks, layers streamed and digest-checked, choosing
 * opts->platform from image indexes, or every platform of an index (or
 * opts->platforms) into an index of ferry images with the same platforms
 * when DEST is oci: or docker:// and no opts->platform is named (each
 * member stored, or pushed by digest, then the index under the tag).
 * DEST: dir:OUT (OUT/bootstrap,
 * OUT/blobs/sha256/<hex>, OUT/ferry.json); oci:PATH[:TAG] adds the image to
 * the layout under TAG (default "latest"); docker:// pushes it (a digest
 * is refused: it is not known in advance). A failed conversion removes a
 * destination it created. @stats is filled (convert_stats_free).
 *
 * Refused (-EINVAL or -EEXIST, logged) before anything is written: a
 * ferry image as the source (it is converted already), a destination
 * equal to or inside a dir: source, and what image_out_open refuses.
 */
int convert_run(const char *source, const char *dest,
		const struct convert_opts *opts, struct convert_stats *stats);

/*
 * `ferry index IMAGE` (oci:PATH[:TAG] or docker://REF): read every layer
 * once, streaming and digest-checked, into a bootstrap of the merged tree
 * whose file data are chunks of the layers themselves (stream blobs, with
 * resume points every opts->span compressed bytes), checked against the
 * config's diff_ids, and attach it to the image as an OCI artifact whose
 * subject is the image's manifest (image_index_attach). Uses chunk_size,
 * inline_max, platform, fetch, no_loader_deps, prefetch_files (the list's
 * section only: an index moves no data) and span of @opts. An xz
 * layer, or one without a resume point within 64 MiB (one big zstd
 * frame), is refused with -ENOTSUP: convert such images instead.
 * stats->manifest_digest is the index's.
 */
/*
 * The span: the index grows ~2 KiB per point (a sparse window, zstd-
 * compressed), `ferry index` spends CPU on each, and a cold read fetches
 * up to the span's bytes before what it wants. At 128 KiB issue 21's
 * cold start of "big" through its index fetched 1.13x the converted
 * image's bytes, 1.48x at 512 KiB (3 runs each on a quiet machine), for
 * an index of 1.7% of the layer (0.6%) and ~20% more CPU in `ferry
 * index`; docs/performance-log.md, "Fetch-ahead through an index".
 */
#define CONVERT_DEFAULT_SPAN (128u << 10)
int convert_ferry_index(const char *image, const struct convert_opts *opts,
			struct convert_stats *stats);

/*
 * The inflater of gzip layers, "isal" or "zlib": $FERRY_INFLATE, else the
 * fastest built in (pkg-convert/input.c); NULL (logged) if $FERRY_INFLATE
 * names neither.
 */
const char *input_inflater(void);

#endif
