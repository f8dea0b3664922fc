/* SPDX-License-Identifier: MIT */
/*
 * pkg-blob: ferry's chunk blob format v1 — codecs, sha256 digests, the
 * blob writer, the chunk tables (at each blob's tail and, as the "blob
 * index", inside the bootstrap), chunk decode + verify, and materialising
 * a blob into its uncompressed device file.
 *
 * A blob holds chunks grouped into frames, each frame compressed on its
 * own: a big chunk is a frame by itself, small chunks are batched into a
 * shared frame. Each chunk owns a 4 KiB aligned slot in the blob's
 * *uncompressed* address space; the bootstrap's chunk indexes point into
 * that space (device block = uoff / 4096). docs/FORMAT.md gives the byte
 * layout.
 *
 * Errors: 0 or a negative errno; corrupt data is -EFSCORRUPTED, a chunk
 * whose bytes do not match its sha256 is -EIO, each with a log line naming
 * the blob and chunk. Thread-safety: no shared state; a blob_writer
 * belongs to one thread (it runs worker threads of its own).
 */
#ifndef FERRY_BLOB_H
#define FERRY_BLOB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define BLOB_SLOT_ALIGN 4096u
#define BLOB_CHUNK_MAX (64u << 20)   /* largest chunk (uncompressed) */
#define BLOB_FRAME_MAX BLOB_CHUNK_MAX /* largest frame (uncompressed) */
#define BLOB_FOOTER_SIZE 64u
#define BLOB_CHUNK_ENTRY_SIZE 64u
#define BLOB_DIGEST_SIZE 32u

/* ------------------------------------------------------------------ */
/* Digests                                                             */
/* ------------------------------------------------------------------ */

void blob_sha256(const void *data, size_t len, uint8_t out[BLOB_DIGEST_SIZE]);

/* Streaming sha256 (wraps OpenSSL EVP). */
struct blob_hasher;
int blob_hasher_new(struct blob_hasher **out);
void blob_hasher_update(struct blob_hasher *h, const void *data, size_t len);
void blob_hasher_final(struct blob_hasher *h, uint8_t out[BLOB_DIGEST_SIZE]);
void blob_hasher_free(struct blob_hasher *h);

/* ------------------------------------------------------------------ */
/* Codecs                                                              */
/* ------------------------------------------------------------------ */

enum blob_codec {
	BLOB_CODEC_NONE = 0,
	BLOB_CODEC_LZ4 = 1,
	BLOB_CODEC_ZSTD = 2,
	BLOB_CODEC_LZMA = 3,
};

struct blob_compress {
	enum blob_codec codec;
	int level; /* 0 = codec default; lz4 > 0 selects LZ4 HC */
};

/*
 * "none", "lz4[:N]", "zstd[:N]", "lzma[:N]" with N in lz4 1..12 (HC),
 * zstd 1..22, lzma 1..9 (xz presets; the default is 6); -EINVAL with a
 * message otherwise.
 */
int blob_compress_parse(const char *spec, struct blob_compress *out);
const char *blob_codec_name(enum blob_codec codec);

/*
 * Worst-case compressed size of @len input bytes for any codec: @len, as
 * blob_compress stores input that does not shrink raw.
 */
size_t blob_compress_bound(size_t len);

/*
 * Compress @len bytes into @dst (capacity from blob_compress_bound). Sets
 * *@codec_used to the codec whose output is kept: BLOB_CODEC_NONE (a plain
 * copy) when compression does not make the chunk smaller.
 */
int blob_compress(const struct blob_compress *c, const void *src, size_t len,
		  void *dst, size_t dst_cap, size_t *dst_len,
		  enum blob_codec *codec_used);

/* Decompress exactly @dst_len bytes; anything else is -EFSCORRUPTED. */
int blob_decompress(enum blob_codec codec, const void *src, size_t src_len,
		    void *dst, size_t dst_len);

/* ------------------------------------------------------------------ */
/* Chunk table                                                         */
/* ------------------------------------------------------------------ */

/*
 * One chunk. coff, csize and codec describe the chunk's frame, shared by
 * every chunk of that frame; the chunk's bytes are frame_off ..
 * frame_off + usize of the frame's frame_usize decoded bytes.
 */
struct blob_chunk {
	uint64_t uoff;  /* slot start in the uncompressed space, 4 KiB aligned */
	uint64_t coff;  /* the frame's compressed bytes start in the blob file */
	uint32_t usize; /* uncompressed bytes (1..BLOB_CHUNK_MAX) */
	uint32_t csize; /* the frame's compressed bytes */
	uint32_t frame_off;   /* chunk start in the decoded frame */
	uint32_t frame_usize; /* decoded frame bytes (derived from the table) */
	uint8_t codec;  /* the frame's enum blob_codec */
	uint8_t sha256[BLOB_DIGEST_SIZE]; /* of the uncompressed bytes */
};

/* One blob: what its footer says plus its chunk table. */
struct blob_info {
	uint8_t digest[BLOB_DIGEST_SIZE]; /* sha256 of the whole blob file */
	uint64_t size;              /* blob file bytes */
	uint64_t uncompressed_size; /* address space bytes, 4 KiB multiple */
	uint64_t table_offset;      /* chunk table start == data bytes */
	uint32_t nr_chunks;
	uint8_t table_sha256[BLOB_DIGEST_SIZE];
	struct blob_chunk *chunks; /* sorted by uoff; owned */
};

void blob_info_free_chunks(struct blob_info *info);

/* Chunk whose slot starts at @uoff, or NULL (binary search). */
const struct blob_chunk *blob_find_chunk(const struct blob_info *info,
					 uint64_t uoff);

/*
 * Parse a 64-byte footer into @info (everything but digest and chunks).
 * @blob_size is the blob file size, checked against the footer.
 */
int blob_footer_decode(const void *footer, uint64_t blob_size,
		       struct blob_info *info);

/*
 * Parse and validate @info->nr_chunks table entries from @buf (@len bytes,
 * must equal nr_chunks * 64 and match table_sha256) into @info->chunks:
 * slots ascending, aligned, non-overlapping, inside uncompressed_size;
 * frames consecutive, their compressed ranges inside [0, table_offset);
 * known codecs. Fills every field of struct blob_chunk.
 */
int blob_table_decode(const void *buf, size_t len, struct blob_info *info);

/* ------------------------------------------------------------------ */
/* Writer                                                              */
/* ------------------------------------------------------------------ */

struct blob_writer;

/*
 * Frame policy (fixed, so a blob is a function of the added chunks): a
 * chunk shorter than BLOB_BATCH_SMALL joins the open batch frame, which is
 * closed before it would exceed BLOB_BATCH_MAX bytes or when a bigger
 * chunk arrives; a bigger chunk is a frame of its own. Reading one
 * batched chunk means fetching and decoding its whole frame, hence the
 * modest size; writer.c has the measurements behind both values.
 */
#define BLOB_BATCH_SMALL (128u << 10)
#define BLOB_BATCH_MAX (512u << 10)
#define BLOB_WRITER_JOBS_MAX 256u

/*
 * Write a new blob into @fd (positioned at 0, empty), compressing on
 * @jobs threads: 0 means the number of online CPUs (at most
 * BLOB_WRITER_JOBS_MAX), 1 compresses on the caller's thread. The
 * file's bytes do not depend on @jobs.
 */
int blob_writer_new(int fd, const struct blob_compress *c, unsigned int jobs,
		    struct blob_writer **out);

/*
 * Append one chunk of @len bytes (1..BLOB_CHUNK_MAX) whose sha256 is
 * @sha256; returns its slot's uncompressed offset in *@uoff at once. The
 * bytes are copied: the chunk is compressed and written later, in the
 * background, and this blocks while the window of frames in flight is
 * full (2 to 8 frames per job, see writer.c). An error of that
 * background work (e.g. -ENOSPC) sticks: every later call returns it.
 * The writer does not dedup: callers look digests up before adding.
 */
int blob_writer_add(struct blob_writer *w, const void *data, uint32_t len,
		    const uint8_t sha256[BLOB_DIGEST_SIZE], uint64_t *uoff);

/*
 * Write the outstanding frames, the chunk table and the footer, fill
 * @info (chunks ownership moves to @info) and free the writer.
 * blob_writer_abort stops the workers and frees without finishing.
 */
int blob_writer_finish(struct blob_writer *w, struct blob_info *info);
void blob_writer_abort(struct blob_writer *w);

/* ------------------------------------------------------------------ */
/* Blob index: every blob's footer fields and table, kept in bootstrap */
/* ------------------------------------------------------------------ */

struct blob_index {
	uint32_t nr_blobs;
	struct blob_info *blobs; /* blob i is EROFS device_id i + 1 */
};

int blob_index_encode(const struct blob_info *blobs, uint32_t nr_blobs,
		      void **buf, size_t *len);
int blob_index_decode(const void *buf, size_t len, struct blob_index *out);
void blob_index_free(struct blob_index *idx);

/* ------------------------------------------------------------------ */
/* Reading, verifying, materialising                                   */
/* ------------------------------------------------------------------ */

/*
 * Read the footer and table of the blob file at @fd and check them against
 * @expect (from the blob index): sizes, table digest and every entry.
 * With @expect NULL, fill @info from the file alone. info->digest is
 * copied from @expect (all zero without it): checking it needs the whole
 * file, which blob_verify_file reads.
 */
int blob_read_info(int fd, const char *name, const struct blob_info *expect,
		   struct blob_info *info);

/*
 * Decode the frame of chunk @c from its compressed bytes @cdata (c->csize
 * bytes, read at c->coff) into @frame_out (c->frame_usize bytes). No
 * digest is checked: check each chunk of the frame, whose bytes are at
 * frame_out + its frame_off, with blob_chunk_verify.
 */
int blob_frame_decode(const struct blob_chunk *c, const void *cdata,
		      void *frame_out);

/* Check @data (c->usize bytes) against c->sha256: -EIO (logged) if not. */
int blob_chunk_verify(const struct blob_chunk *c, const void *data);

/*
 * Decode chunk @c from its frame's compressed bytes @cdata (c->csize
 * bytes, read at c->coff) into @out (c->usize bytes) and verify its
 * sha256: -EIO on mismatch. A chunk sharing a compressed frame is decoded
 * through a buffer of the calling thread, kept for reuse until the thread
 * exits (at most BLOB_FRAME_MAX bytes); to read several chunks of one
 * frame, blob_frame_decode it once instead.
 */
int blob_chunk_decode(const struct blob_chunk *c, const void *cdata, void *out);

struct blob_verify_report {
	uint32_t bad_chunk; /* index of the first failing chunk */
	uint64_t bad_uoff;
	int error;          /* 0 when every chunk verified */
};
/* bad_chunk / bad_uoff when the failure is the blob's, not one chunk's. */
#define BLOB_VERIFY_NO_CHUNK UINT32_MAX
#define BLOB_VERIFY_NO_UOFF UINT64_MAX

/*
 * Verify every chunk of the blob at @path against @info (decompress each
 * frame once, sha256 each chunk); stops at the first bad chunk and logs it
 * naming the blob (a frame that does not decode reports its first chunk).
 * Also checks the file's size, footer and table against @info and its
 * sha256 against info->digest (unless that is all zero: unknown, as
 * blob_read_info leaves it without @expect). @report may be NULL.
 */
int blob_verify_file(const char *path, const struct blob_info *info,
		     struct blob_verify_report *report);

/*
 * Write @info's uncompressed address space to @dev_path (a sparse regular
 * file of info->uncompressed_size bytes), verifying every chunk. Writes to
 * a temporary name and renames into place only when every chunk verified,
 * so an existing @dev_path is always complete.
 */
int blob_materialize(const char *blob_path, const struct blob_info *info,
		     const char *dev_path);

#endif
