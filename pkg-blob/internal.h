/* SPDX-License-Identifier: MIT */
/*
 * pkg-blob internals shared between its source files: codec contexts,
 * on-disk encoders and the validating decoders that take an object name
 * for their error messages.
 */
#ifndef FERRY_BLOB_INTERNAL_H
#define FERRY_BLOB_INTERNAL_H

#include <dirent.h>
#include <pthread.h>
#include <time.h>

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
/* A new map file's header for @info's blob (CACHE_MAP_HEADER_SIZE bytes). */
void cache_map_header_encode(const struct blob_info *info,
			     uint8_t h[CACHE_MAP_HEADER_SIZE]);
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

/* ------------------------------------------------------------------ */
/* The chunk cache's bookkeeping: cache_records.c, cache_gc.c,         */
/* cache_verify.c, cache_limit.c                                       */
/* ------------------------------------------------------------------ */

struct cache_record {
	uint8_t digest[BLOB_DIGEST_SIZE];
	char *ref;                          /* a pin: the mount point */
	uint64_t mount_id;                  /* a pin: the mount's id */
	uint8_t (*blobs)[BLOB_DIGEST_SIZE]; /* sorted, no duplicates */
	uint32_t nr_blobs;
	uint8_t (*keep)[BLOB_DIGEST_SIZE];  /* other files it needs, as given */
	uint32_t nr_keep;
};

struct cache_records {
	struct cache_record *r;
	uint32_t nr;
	size_t cap;
};

/*
 * The records of DIR/@sub (images, pins) into *@rs; cache_records_naming:
 * how many of them name @digest; cache_pins_read: the pins, whose mounts
 * are still there (others are removed).
 */
void cache_records_free(struct cache_records *rs);
int cache_records_read(const char *cache_dir, const char *sub, struct cache_records *rs);
uint32_t cache_records_naming(const struct cache_records *rs,
			      const uint8_t digest[BLOB_DIGEST_SIZE]);
int cache_pins_read(const char *cache_dir, struct cache_records *pins);

struct cache_file {
	uint8_t digest[BLOB_DIGEST_SIZE];
	bool map, data;
};

struct cache_scan {
	struct cache_file *f;
	uint32_t nr;
	size_t cap;
	char **tmp; /* temporary files (names) */
	uint32_t nr_tmp;
	size_t tmp_cap;
};

/* The blobs (and temporary files) of DIR/blobs/sha256 @dir. */
int cache_scan_blobs(const char *dir, struct cache_scan *s);
void cache_scan_free(struct cache_scan *s);

/* The digest a cache file's name "<64 lowercase hex>@suffix" gives: 0 or -EINVAL. */
int cache_name_digest(const char *name, const char *suffix, uint8_t out[BLOB_DIGEST_SIZE]);
/* @dir/@name@suffix into @out (PATH_MAX bytes), or -ENAMETOOLONG. */
int cache_path_join(char *out, const char *dir, const char *name, const char *suffix);
/* unlink @path (@missing_ok: ENOENT is fine); 0 or -errno, logged. */
int cache_remove_file(const char *path, bool missing_ok);
/* opendir; a missing directory is *@d NULL (nothing cached yet). */
int cache_open_dir(const char *dir, DIR **d);

/* Allocated bytes of @path; of every file in DIR/blobs/sha256 @dir. */
uint64_t cache_disk_bytes(const char *path);
int cache_blobs_usage(const char *dir, uint64_t *bytes);
/* The limits and bytes evicted ferryd recorded (DIR/limit.json) into @out. */
int cache_read_limit(const char *cache_dir, struct blob_cache_list *out);

/* ------------------------------------------------------------------ */
/* The open blobs of the chunk cache (cache.c, cache_evict.c)          */
/* ------------------------------------------------------------------ */

struct cache_frame {
	uint32_t first; /* first chunk */
	uint32_t count; /* chunks */
};

/*
 * One per blob and cache directory in a process, shared by every
 * blob_cache_open of it (refs): eviction clears marks in the one place
 * every reader of this process looks.
 */
struct blob_cache_blob {
	const struct blob_info *info; /* &own */
	struct blob_info own;         /* a copy: openers' tables may go first */
	struct blob_cache_blob *next; /* in the process's registry */
	unsigned int refs;            /* under registry_lock */
	pid_t pid;                    /* the opener: a child after fork opens its own */
	bool kernel_reads;            /* atomic: see blob_cache_kernel_reads */
	char hex[CACHE_HEX_LEN + 1];
	char *dir_path;  /* DIR/blobs/sha256 */
	char *data_path;
	char *map_path;
	int data_fd;
	int map_fd;
	uint32_t nr_frames;
	struct cache_frame *frames;
	uint32_t *chunk_frame; /* frame of each chunk */
	uint8_t *present;      /* per chunk, atomic, 0 -> 1 only */
	uint32_t present_chunks; /* atomic */
	uint64_t present_bytes;  /* atomic */
	pthread_mutex_t lock;
	pthread_cond_t done;     /* a frame stopped being in flight */
	uint8_t *inflight;       /* per frame, under lock */
	uint32_t *stamp;         /* per frame: last use, cache_clock_ms() */
	uint64_t evicted;        /* atomic: uncompressed bytes evicted */
	struct blob_stream_learned *learned; /* a stream blob's, else NULL */
};

/* Every open blob of this process (see cache_evict_open), under its lock. */
extern pthread_mutex_t cache_registry_lock;
extern struct blob_cache_blob *cache_registry;
/* Bytes of chunks this process made present, ever (blob_cache_filled). */
extern uint64_t cache_filled_total;

/* A coarse millisecond clock: stamping a read costs a vDSO call at most. */
static inline uint32_t cache_clock_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
	return (uint32_t)((uint64_t)ts.tv_sec * 1000 +
			  (uint64_t)ts.tv_nsec / 1000000);
}

static inline void cache_set_present(struct blob_cache_blob *b, uint32_t i)
{
	if (!__atomic_exchange_n(&b->present[i], 1, __ATOMIC_ACQ_REL)) {
		__atomic_fetch_add(&b->present_chunks, 1, __ATOMIC_RELAXED);
		__atomic_fetch_add(&b->present_bytes, b->info->chunks[i].usize,
				   __ATOMIC_RELAXED);
		__atomic_fetch_add(&cache_filled_total, b->info->chunks[i].usize,
				   __ATOMIC_RELAXED);
	}
}

/* Uncompressed bytes no longer present, or 0 if chunk @i was not. */
static inline uint32_t cache_set_missing(struct blob_cache_blob *b, uint32_t i)
{
	uint32_t usize = b->info->chunks[i].usize;

	if (!__atomic_exchange_n(&b->present[i], 0, __ATOMIC_ACQ_REL))
		return 0;
	__atomic_fetch_sub(&b->present_chunks, 1, __ATOMIC_RELAXED);
	__atomic_fetch_sub(&b->present_bytes, usize, __ATOMIC_RELAXED);
	return usize;
}

/* A frame's slots: from its first chunk to its last's 4 KiB end. */
static inline void cache_frame_span(const struct blob_cache_blob *b, uint32_t fr,
				    uint64_t *start, uint64_t *len)
{
	const struct blob_chunk *first = &b->info->chunks[b->frames[fr].first];
	const struct blob_chunk *last = first + b->frames[fr].count - 1;

	*start = first->uoff;
	*len = ROUND_UP(last->uoff + last->usize, BLOB_SLOT_ALIGN) - first->uoff;
}

/* Lock or unlock (F_UNLCK) the map bytes of chunks @c0 .. @c0 + @n - 1. */
int cache_map_lock(struct blob_cache_blob *b, short type, uint32_t c0, uint32_t n);
/* The readers lock (blob_cache_read_begin) in write mode: an eviction's;
 * blob_cache_read_end releases it. */
void cache_readers_exclude(void);

#endif
