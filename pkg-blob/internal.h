/* SPDX-License-Identifier: MIT */
/*
 * pkg-blob internals shared between its source files: codec contexts,
 * on-disk encoders and the validating decoders that take an object name
 * for their error messages.
 */
#ifndef FERRY_BLOB_INTERNAL_H
#define FERRY_BLOB_INTERNAL_H

#include "blob.h"

/*
 * Reusable codec state. Compressors and the zstd decompressor need large
 * working memory; allocating it per frame would dominate small frames, so
 * each writer thread keeps one of these and the one-shot public calls use
 * a per-thread one. Members are allocated on first use.
 */
struct blob_codec_ctx {
	void *zstd_c;    /* ZSTD_CCtx */
	void *zstd_d;    /* ZSTD_DCtx */
	void *lz4_state; /* LZ4_compress_fast_extState() state */
	void *lz4hc_state;
	uint8_t *frame_buf; /* blob_chunk_decode's decoded frame */
	size_t frame_cap;
};

/* Known codec and a level it supports (0 = its default). */
bool blob_compress_valid(const struct blob_compress *c);
/* @c at the level the writer's hot run is compressed with (codec.c). */
struct blob_compress blob_compress_hot(const struct blob_compress *c);

void blob_codec_ctx_release(struct blob_codec_ctx *ctx);

/*
 * Grow the reusable buffer *@buf (*@cap bytes) to at least @len bytes; its
 * contents are not kept. 0 or -ENOMEM (then *@buf is NULL, *@cap 0).
 */
int blob_buf_reserve(uint8_t **buf, size_t *cap, size_t len);
/*
 * The same for a buffer that is filled whole soon after and freed after
 * one use (the chunk cache's fetch and decode buffers, mapped afresh for
 * each fill: ferryd's fixed mmap threshold): from 2 MiB up, rounded up to
 * a multiple of 2 MiB and backed by huge pages where the kernel has them.
 * Long-lived buffers (the writer's) stay on blob_buf_reserve: there the
 * rounding only costs memory.
 */
int blob_buf_reserve_fresh(uint8_t **buf, size_t *cap, size_t len);
/* This thread's context (freed at thread exit), or NULL on ENOMEM. */
struct blob_codec_ctx *blob_codec_ctx_thread(void);

/*
 * Compress @len bytes into @dst, keeping the result only when it is
 * strictly smaller than @len: then *@codec_used is c->codec and *@dst_len
 * its size; otherwise *@codec_used is BLOB_CODEC_NONE and @dst holds
 * nothing (the caller stores @src itself). @dst has room for len - 1 bytes.
 */
int blob_codec_compress(struct blob_codec_ctx *ctx,
			const struct blob_compress *c, const void *src,
			size_t len, void *dst, size_t *dst_len,
			enum blob_codec *codec_used);

/* Room for a decompressor's reason why a chunk is corrupt. */
#define BLOB_WHY_MAX 128

/*
 * blob_decompress with a caller-owned context; on -EFSCORRUPTED @why
 * (BLOB_WHY_MAX bytes) says what was wrong, for the caller's log line.
 */
int blob_codec_decompress(struct blob_codec_ctx *ctx, enum blob_codec codec,
			  const void *src, size_t src_len, void *dst,
			  size_t dst_len, char *why);

/*
 * Override the frame policy's BLOB_BATCH_SMALL / BLOB_BATCH_MAX (for tests
 * and measurements) before the first blob_writer_add: chunks shorter than
 * @small are batched into frames of at most @max bytes; @small 0 or 1
 * gives every chunk a frame of its own. -EINVAL unless @small <= @max <=
 * BLOB_FRAME_MAX, -EBUSY after an add.
 */
int blob_writer_set_batching(struct blob_writer *w, uint32_t small,
			     uint32_t max);

/* The 64-byte chunk table entry and footer encoders (format.c). */
void blob_table_encode(const struct blob_chunk *chunks, uint32_t nr,
		       uint8_t *out);
void blob_footer_encode(const struct blob_info *info,
			uint8_t out[BLOB_FOOTER_SIZE]);

/*
 * blob_footer_decode / blob_table_decode with @what (e.g. "blob foo")
 * naming the object in error messages.
 */
int blob_footer_parse(const void *footer, uint64_t blob_size,
		      struct blob_info *info, const char *what);
int blob_table_parse(const void *buf, size_t len, struct blob_info *info,
		     const char *what);

/* ------------------------------------------------------------------ */
/* Chunk cache files, shared by cache.c (fill) and cache_gc.c (gc)     */
/* ------------------------------------------------------------------ */

/* The map file (docs/FORMAT.md, "Chunk cache"). */
#define CACHE_MAP_MAGIC "FERRYCM1"
#define CACHE_MAP_VERSION 1u
#define CACHE_MAP_HEADER_SIZE 128u
#define CACHE_MAP_CHECK_OFF 96u /* sha256 of the bytes before it */
#define CACHE_STATE_MISSING 0
#define CACHE_STATE_PRESENT 1
#define CACHE_STATE_PENDING 2 /* in memory only: written, not yet marked */

#define CACHE_BLOBS_DIR "blobs/sha256"
#define CACHE_IMAGES_DIR "images"
/* Records of kernel mounts (--mode local) using blobs, kept while mounted. */
#define CACHE_PINS_DIR "pins"
/* ferryd's limits for the cache and what it evicted (blob_cache_record_limit). */
#define CACHE_LIMIT_FILE "limit.json"
/* The blob's chunk table (a one-blob blob index), for blob_cache_verify. */
#define CACHE_INDEX_SUFFIX ".index"
#define CACHE_HEX_LEN (2 * BLOB_DIGEST_SIZE)

struct cache_map_header {
	uint32_t nr_chunks;
	uint64_t uncompressed_size;
	uint8_t digest[BLOB_DIGEST_SIZE];
	uint8_t table_sha256[BLOB_DIGEST_SIZE];
};

/* blob_cache_dir's checks for each of the cache's directories that exist. */
int cache_check_existing(const char *cache_dir);
/* Check and decode a map file header; *@why says what is wrong. */
int cache_map_header_decode(const uint8_t h[CACHE_MAP_HEADER_SIZE],
			    struct cache_map_header *mh, const char **why);
/* flock, retried on EINTR: 0 or -errno. */
int cache_flock(int fd, int op);

/*
 * The map's users byte: every process with the blob open holds a read
 * lock on it (OFD, so one per open file); an evictor write-locks it
 * (without waiting: -EAGAIN while another process has the blob open), so
 * an opener reads marks only once an eviction is complete.
 */
#define CACHE_MAP_USERS_BYTE 0
int cache_users_lock(int map_fd, short type, bool wait);

/*
 * Evict about @want uncompressed bytes of the least recently used frames
 * of the blobs in @cache_dir this process has open and no other has,
 * skipping blobs @pinned says are pinned. *@freed grows by the bytes
 * dropped. cache.c, for blob_cache_enforce.
 */
int cache_evict_open(const char *cache_dir, uint64_t want,
		     bool (*pinned)(void *arg, const uint8_t *digest),
		     void *arg, uint64_t *freed);

#endif
