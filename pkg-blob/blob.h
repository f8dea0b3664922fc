/* SPDX-License-Identifier: MIT */
/*
 * pkg-blob: ferry's chunk blob format v1 — codecs, the
 * blob writer, the chunk tables (at each blob's tail and, as the "blob
 * index", inside the bootstrap), chunk decode + verify, and the chunk
 * cache that fills a blob's uncompressed device file on demand.
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

#include "../pkg-base/base.h"

/* Magics and the version (docs/FORMAT.md 3.3, 2.4) written and read. */
#define BLOB_MAGIC "FERRYBL1"
#define BLOB_INDEX_MAGIC "FERRYIX1"
#define BLOB_FORMAT_VERSION 1u
#define BLOB_SLOT_ALIGN 4096u
#define BLOB_CHUNK_MAX (64u << 20)   /* largest chunk (uncompressed) */
#define BLOB_FRAME_MAX BLOB_CHUNK_MAX /* largest frame (uncompressed) */
#define BLOB_FOOTER_SIZE 64u
#define BLOB_CHUNK_ENTRY_SIZE 64u
#define BLOB_DIGEST_SIZE SHA256_SIZE /* chunks and blobs are named by sha256 (pkg-base) */

/* ------------------------------------------------------------------ */
/* Codecs                                                              */
/* ------------------------------------------------------------------ */

enum blob_codec {
	BLOB_CODEC_NONE = 0,
	BLOB_CODEC_LZ4 = 1,
	BLOB_CODEC_ZSTD = 2,
	BLOB_CODEC_LZMA = 3,
	/*
	 * Stream blobs only (a layer read in place, FORMAT.md 3.5): frames
	 * decoded from a resume point of the layer's gzip stream (deflate
	 * resumed there) or zstd stream (a frame boundary). blob_decompress
	 * refuses them: they need the blob's resume points (blob_stream).
	 */
	BLOB_CODEC_GZIP_STREAM = 4,
	BLOB_CODEC_ZSTD_STREAM = 5,
};

struct blob_compress {
	enum blob_codec codec;
	int level; /* 0 = codec default (codec.c); lz4 > 0 selects LZ4 HC */
};

/*
 * "none", "lz4[:N]", "zstd[:N]", "lzma[:N]" with N in lz4 1..12 (HC),
 * zstd 1..22, lzma 1..9 (xz presets; the default is 6; zstd's is level 5
 * with tuned match finding, see codec.c); -EINVAL with a message
 * otherwise.
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
 * frame_off + usize of the frame's frame_usize decoded bytes. In a stream
 * blob the frame's decoded bytes start frame_skip bytes after the resume
 * point at coff, and its chunks may have gaps between them (tar headers).
 */
struct blob_chunk {
	uint64_t uoff;  /* slot start in the uncompressed space, 4 KiB aligned */
	uint64_t coff;  /* the frame's compressed bytes start in the blob file */
	uint32_t usize; /* uncompressed bytes (1..BLOB_CHUNK_MAX) */
	uint32_t csize; /* the frame's compressed bytes */
	uint32_t frame_off;   /* chunk start in the decoded frame */
	uint32_t frame_usize; /* decoded frame bytes (derived from the table) */
	uint32_t frame_skip;  /* stream blobs: decoded bytes before the frame */
	uint8_t codec;  /* the frame's enum blob_codec */
	uint8_t sha256[BLOB_DIGEST_SIZE]; /* of the uncompressed bytes */
};

/*
 * A stream blob: an OCI layer (tar, gzip or zstd) read where it is, not a
 * ferry blob file. Its chunks are pieces of the layer's decoded stream
 * (file data between tar headers); size is the layer's, table_offset ==
 * size (the table lives only in the blob index), and frames may overlap
 * in the layer and leave gaps (FORMAT.md 3.5).
 */
#define BLOB_INFO_STREAM 0x1u

/* One blob: what its footer says plus its chunk table. */
struct blob_info {
	uint8_t digest[BLOB_DIGEST_SIZE]; /* sha256 of the whole blob file */
	uint64_t size;              /* blob file bytes */
	uint64_t uncompressed_size; /* address space bytes, 4 KiB multiple */
	uint64_t table_offset;      /* chunk table start == data bytes */
	uint32_t nr_chunks;
	uint8_t table_sha256[BLOB_DIGEST_SIZE];
	uint32_t flags;            /* BLOB_INFO_STREAM */
	struct blob_chunk *chunks; /* sorted by uoff; owned */
};

void blob_info_free_chunks(struct blob_info *info);

/*
 * For a chunk table that comes from elsewhere (a native layer's range
 * table): set @info's table_sha256 and size from its table_offset and
 * chunks as a ferry blob holding them would have them, the form the chunk
 * cache records and checks. Nothing may read such a blob past its
 * table_offset.
 */
int blob_info_as_table(struct blob_info *info);

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
#define BLOB_BATCH_SMALL (256u << 10)
#define BLOB_BATCH_MAX (1024u << 10)
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
 * The hot group: chunks read together first (a prefetch list's files),
 * placed behind every other chunk in one contiguous run, in the file and
 * in the uncompressed space, so a mount fetches them with a few large
 * requests and nothing else. blob_writer_set_hot_stage gives it an empty
 * read-write scratch file (before the first add; the caller removes it
 * after finish), where its frames wait until blob_writer_finish copies
 * them in; its frames are compressed harder (zstd 18, lz4 HC 12: writer.c,
 * codec.c). After blob_writer_hot(w, true) added chunks join the hot group
 * until blob_writer_hot(w, false); a switch closes the open batch frame,
 * so no frame mixes groups. blob_writer_add returns a hot chunk's uoff
 * relative to the hot run, which starts at *@hot_uoff of finish. The file
 * stays a function of the sequence of adds and switches.
 */
int blob_writer_set_hot_stage(struct blob_writer *w, int stage_fd);
int blob_writer_hot(struct blob_writer *w, bool hot);

/*
 * Write the outstanding frames (then the hot group's), the chunk table and
 * the footer, fill @info (chunks ownership moves to @info), set *@hot_uoff
 * (unless NULL) to where the hot run starts, and free the writer.
 * blob_writer_abort stops the workers and frees without finishing.
 */
int blob_writer_finish(struct blob_writer *w, struct blob_info *info,
		       uint64_t *hot_uoff);
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
/* The same for an index followed by other data: *@used is its length. */
int blob_index_decode_prefix(const void *buf, size_t len,
			     struct blob_index *out, size_t *used);
void blob_index_free(struct blob_index *idx);

/* ------------------------------------------------------------------ */
/* Reading and verifying                                              */
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

/*
 * Where a blob file's bytes come from: read exactly @len bytes at @off
 * into @buf — a local file, or a registry Range request. 0 or -errno; may
 * be called from several threads at once.
 */
struct blob_stream;
struct blob_source {
	int (*read)(void *ctx, uint64_t off, void *buf, size_t len);
	void *ctx;
	/* A stream blob's resume points (its frames decode from them); NULL
	 * for ferry blobs. */
	const struct blob_stream *stream;
};

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
 * The same for a blob read through @src (info->size bytes), e.g. from a
 * registry: the data region is read front to back in reads of up to
 * 16 MiB. @name is used in messages.
 */
int blob_verify_source(const struct blob_source *src, const char *name,
		       const struct blob_info *info,
		       struct blob_verify_report *report);


/* ------------------------------------------------------------------ */
/* Stream blobs: resume points (stream.c, FORMAT.md 3.5)               */
/* ------------------------------------------------------------------ */

/*
 * Where decoding of a layer's compressed stream can start: a gzip member
 * header, a deflate block boundary with the 32 KiB of decoded bytes
 * before it (zlib's examples/zran.c model), or a zstd frame boundary.
 * A stream blob's frames each decode from one of them (coff is the byte
 * holding its first bit), skipping frame_skip decoded bytes first.
 */
#define BLOB_STREAM_WINDOW 32768u
#define BLOB_STREAM_POINTS_MAX (1u << 22)

enum blob_stream_format {
	BLOB_STREAM_TAR = 0,  /* uncompressed: no resume points */
	BLOB_STREAM_GZIP = 1,
	BLOB_STREAM_ZSTD = 2,
};

#define BLOB_POINT_HEADER 0x1u /* gzip: a member header starts here */

struct blob_stream_point {
	uint64_t cbit;         /* position in the blob, in bits */
	uint64_t uoff;         /* position in the decoded stream */
	uint32_t window_len;   /* gzip: decoded bytes before uoff deflate may use */
	uint32_t window_clen;  /* their stored bytes: == window_len raw, else zstd */
	uint32_t flags;        /* BLOB_POINT_* */
	const uint8_t *window; /* window_clen bytes (borrowed) */
};

struct blob_stream {
	uint32_t blob;          /* the stream blob's index in the blob index */
	uint8_t format;         /* enum blob_stream_format */
	uint64_t usize;         /* decoded stream bytes */
	uint8_t diff_id[BLOB_DIGEST_SIZE]; /* sha256 of the decoded stream */
	uint32_t nr_points;
	struct blob_stream_point *points; /* ascending; owned */
};

struct blob_streams {
	uint32_t nr;
	struct blob_stream *streams; /* ascending blob */
};

#define BLOB_STREAMS_MAGIC "FERRYRP1"
#define BLOB_STREAMS_VERSION 1u
/*
 * The resume points section of a bootstrap (FORMAT.md 2.8): one record
 * per stream blob of the blob index, in blob order. Windows are copied
 * into *@buf.
 */
int blob_streams_encode(const struct blob_stream *s, uint32_t nr, void **buf,
			size_t *len);
/* Does @buf start with the section's magic? */
bool blob_streams_magic(const void *buf, size_t len);
/*
 * Decode the section at the start of @buf, *@used its length, checking it
 * against @idx: exactly the stream blobs of @idx, each frame's coff a
 * resume point's byte, frames inside the stream. The points' windows
 * point into @buf, which must outlive @out. -EFSCORRUPTED (logged).
 */
int blob_streams_decode(const void *buf, size_t len,
			const struct blob_index *idx, struct blob_streams *out,
			size_t *used);
void blob_streams_free(struct blob_streams *s);
/* The stream of blob @blob, or NULL. */
const struct blob_stream *blob_streams_find(const struct blob_streams *s,
					    uint32_t blob);

/*
 * Decoding frames of a stream blob. A reader given several frames of one
 * run (the blob's bytes [@run_coff, @run_coff + @run_len) in memory, read
 * once) in ascending order goes on decoding from where the previous frame
 * ended when that is on the way, instead of from the frame's resume
 * point; blob_stream_reader_reset before each new run.
 */
struct blob_stream_reader;
int blob_stream_reader_new(struct blob_stream_reader **out);
void blob_stream_reader_reset(struct blob_stream_reader *r);
void blob_stream_reader_free(struct blob_stream_reader *r);
/*
 * Decode the frame whose first chunk is @c into @out (c->frame_usize
 * bytes). @run must hold [c->coff, c->coff + c->csize). No digest is
 * checked (blob_chunk_verify each chunk). -EFSCORRUPTED when the bytes
 * do not decode to the frame.
 */
int blob_stream_frame_decode(struct blob_stream_reader *r,
			     const struct blob_stream *s,
			     const struct blob_chunk *c, const uint8_t *run,
			     uint64_t run_coff, size_t run_len, void *out);

/*
 * Decode exactly @out_len bytes of a gzip stream from its point @pt (a
 * deflate block boundary, not a member header) into @out, @in holding
 * the stream's bytes from the point's first one (cbit / 8) on: what
 * `ferry index` proves sparse windows with, thousands of times a layer.
 * ISA-L's inflate when ferry is built with it (about twice zlib's speed),
 * else blob_stream_frame_decode's. -EFSCORRUPTED when they do not decode
 * to that many bytes.
 */
int blob_stream_point_decode(struct blob_stream_reader *r, const struct blob_stream_point *pt,
			     const uint8_t *in, size_t in_len, void *out, size_t out_len);

/*
 * Points a process learned while decoding a stream blob's frames: the
 * last block boundary (gzip; frame end for zstd) each run passed, with
 * its window (at most 64 per blob, the least recently used replaced).
 * blob_stream_learned_find: for the frame of @c, the learned point
 * nearest before it and after its recorded one, copied into @pt (its
 * window, raw, into @window); false when there is none.
 * blob_stream_reader_begin sets @r up at such a point @pt inside the run
 * (its first frame then decodes on from there); blob_stream_reader_learn
 * keeps the last boundary @r passed. Thread-safe.
 */
struct blob_stream_learned;
int blob_stream_learned_new(struct blob_stream_learned **out);
void blob_stream_learned_free(struct blob_stream_learned *l);
bool blob_stream_learned_find(struct blob_stream_learned *l, const struct blob_stream *s,
			      const struct blob_chunk *c, struct blob_stream_point *pt,
			      uint8_t window[BLOB_STREAM_WINDOW]);
int blob_stream_reader_begin(struct blob_stream_reader *r, const struct blob_stream *s,
			     const struct blob_stream_point *pt, const uint8_t *run,
			     uint64_t run_coff, size_t run_len);
void blob_stream_reader_learn(struct blob_stream_reader *r, const struct blob_stream *s,
			      struct blob_stream_learned *l);

/*
 * ferry check of a stream blob: read the layer through @src front to
 * back once, decoding it, and check its sha256 (info->digest), the
 * decoded stream's (s->diff_id and usize), every chunk's sha256 and every
 * resume point (its window, and a decode from it). @report may be NULL.
 */
int blob_stream_verify(const struct blob_source *src, const char *name,
		       const struct blob_info *info, const struct blob_stream *s,
		       struct blob_verify_report *report);

/* ------------------------------------------------------------------ */
/* Chunk cache                                                         */
/* ------------------------------------------------------------------ */

/*
 * A content-addressed cache directory shared by every image and mount
 * (docs/FORMAT.md, "Chunk cache"):
 *   DIR/blobs/sha256/<hex>.data  the blob's uncompressed address space, a
 *                                sparse file of uncompressed_size bytes —
 *                                once complete, a valid EROFS device file
 *   DIR/blobs/sha256/<hex>.map   header + one state byte per chunk
 *   DIR/blobs/sha256/<hex>.index the blob's chunk table (blob index form)
 *   DIR/images/<hex>.json        images that use the cache (blob_cache_*
 *                                _image), so gc knows what to keep
 *
 * A chunk is marked present only after its bytes were decoded, verified
 * against its sha256, written and made durable (fdatasync), so a crash at
 * any moment never leaves a chunk marked present with wrong bytes; a mark
 * lost in a crash only costs a second fetch. Concurrent users — threads
 * of one process or other processes — never fetch the same frame twice at
 * once and never see a chunk before it is complete: a filler holds an
 * open-file-description lock over its chunks' map bytes and checks the
 * marks again once it has the lock.
 *
 * Every user of a blob holds a shared flock on its map file, so gc only
 * removes blobs nobody has open.
 */
struct blob_cache_blob;

/*
 * The cache is a trust store: root mounts what it holds. Open the cache
 * directory @cache_dir, then each level of @sub ("a/b"; NULL or "" for
 * none) below it without following symlinks, creating what is missing
 * with mode 0700 when @create. Each must be owned by the effective uid
 * and writable by nobody else (-EPERM, logged naming the directory and
 * the fix), and so must the root's ancestors unless sticky; one readable
 * by others is narrowed to 0700. *@dir_fd (may be NULL) gets the deepest
 * directory's descriptor. -ENOENT (not logged) when missing and !@create.
 */
int blob_cache_dir(const char *cache_dir, const char *sub, bool create,
		   int *dir_fd);

/*
 * Reads of adjacent missing frames are merged into one source read of at
 * most this many compressed bytes (a frame larger than this is read alone).
 */
#define BLOB_CACHE_RUN_MAX (4u << 20)

/*
 * Open (creating when missing) the cache files of the blob @info in
 * @cache_dir. @info (with its chunk table, as the bootstrap's blob index
 * gives it) is copied. Opening a blob this process has open already (same
 * @cache_dir string, digest and table) returns that handle, counted: each
 * open needs its blob_cache_close. A map file whose header disagrees
 * with @info (a damaged or truncated file) is discarded with a warning
 * and the blob starts empty — unless another handle has it open, then
 * -EFSCORRUPTED with a message naming the file. A handle's locks belong
 * to its open files: do not use it in a child after fork().
 */
int blob_cache_open(const char *cache_dir, const struct blob_info *info,
		    struct blob_cache_blob **out);
void blob_cache_close(struct blob_cache_blob *b);

/* The data file: its path, and a descriptor open for reading. */
const char *blob_cache_data_path(const struct blob_cache_blob *b);
int blob_cache_data_fd(const struct blob_cache_blob *b);

/* Is chunk @index (into info->chunks) present? Lock-free. */
bool blob_cache_chunk_present(const struct blob_cache_blob *b, uint32_t index);
/*
 * Is every chunk overlapping [@uoff, @uoff + @len) present, as this handle
 * knows (a chunk another handle filled counts once an ensure of this
 * handle saw it)? Lock-free; false for a range outside the blob.
 */
bool blob_cache_range_present(const struct blob_cache_blob *b, uint64_t uoff,
			      uint64_t len);

/*
 * Make every chunk whose bytes overlap [@uoff, @uoff + @len) present,
 * fetching missing frames from @src (adjacent ones in one read, up to
 * BLOB_CACHE_RUN_MAX), decoding, verifying and writing them (every chunk
 * of a fetched frame, asked for or not; of a stream blob, every frame of
 * the resume points they decode from, tried once). Bytes of the range outside every
 * chunk (the alignment padding ending a slot) are zeros and need nothing;
 * an empty range is 0, one reaching past uncompressed_size -EINVAL. A
 * chunk of the range that fails to verify is -EIO naming blob and chunk,
 * and stays missing. Returns 0 when the range is present, or -errno;
 * *@fetched (may be NULL) is increased by the compressed bytes read.
 */
int blob_cache_ensure(struct blob_cache_blob *b, uint64_t uoff, uint64_t len,
		      const struct blob_source *src, uint64_t *fetched);

/*
 * Hand the bytes of every frame overlapping [@uoff, @uoff + @len) (of a
 * stream blob, every frame of their resume points) to @emit, in order, as they lie in the uncompressed address space: @off
 * and @len multiples of BLOB_SLOT_ALIGN (the frame's slots, the last
 * page zero-padded), @buf aligned to it (for O_DIRECT writes). Frames
 * this handle knows present are read from the data file; missing ones are
 * fetched from @src (adjacent ones in one read, up to BLOB_CACHE_RUN_MAX),
 * decoded and verified in memory, and not written to the cache: for a
 * reader that keeps the bytes itself (the cachefiles mode: the kernel's
 * cache file). A chunk that fails to verify is -EIO naming blob and chunk
 * (the frames before it were emitted); otherwise 0, or @emit's or the
 * source's -errno. *@fetched (may be NULL) grows by the bytes read from @src.
 */
typedef int (*blob_emit_fn)(void *ctx, uint64_t off, const void *buf, size_t len);
int blob_cache_read_frames(struct blob_cache_blob *b, uint64_t uoff, uint64_t len,
			   const struct blob_source *src, uint64_t *fetched,
			   blob_emit_fn emit, void *ctx);

/* Chunks and uncompressed bytes present now. */
void blob_cache_usage(const struct blob_cache_blob *b, uint32_t *chunks,
		      uint64_t *bytes);
/* Uncompressed bytes of @b evicted by this process (blob_cache_enforce). */
uint64_t blob_cache_evicted(const struct blob_cache_blob *b);

/*
 * Eviction (docs/ARCHITECTURE.md, "Cache size limit"). Opening a blob
 * twice in a process gives the same shared handle (counted), so marks
 * taken back by eviction are taken back for every reader of the process.
 *
 * A reader that uses the data file's bytes after checking their marks
 * (pread, or a splice handed to the kernel) brackets check and use with
 * blob_cache_read_begin/_end: eviction takes marks back only while no
 * reader is inside. One process-wide lock, held for reading, never while
 * fetching, never nested; a waiting evictor holds back new readers.
 */
void blob_cache_read_begin(void);
void blob_cache_read_end(void);
/*
 * The kernel reads @b's data file after a present check, outside any
 * lock of ours (fanotify mode): its frames are evicted only once unused
 * for longer (250 ms instead of 100 ms).
 */
void blob_cache_kernel_reads(struct blob_cache_blob *b);
/* Uncompressed bytes this process made present so far (monotonic). */
uint64_t blob_cache_filled(void);

struct blob_cache_limit {
	uint64_t max_size;         /* bytes of DIR/blobs, 0 = none */
	unsigned int min_free_pct; /* of the file system, 0 = none */
};
struct blob_cache_enforce_report {
	uint64_t usage;      /* allocated bytes of DIR/blobs before */
	uint64_t want;       /* bytes it set out to free (0: within the limits) */
	uint64_t freed_gc;   /* blobs no image record names, removed */
	uint64_t freed_idle; /* blobs no process has open, emptied */
	uint64_t freed_open; /* LRU frames of blobs only this process has open */
};
/*
 * Keep @cache_dir within @lim: when DIR/blobs holds more than max_size
 * bytes, or the file system has less than min_free_pct free, free down
 * to 15/16 of the limit: gc first, then empty the blobs nobody has open
 * (oldest map first), then evict the least recently used frames of the
 * blobs this process alone has open. Pinned blobs (--mode local) and
 * blobs another process has open are never touched. @prepare (may be
 * NULL) runs first, only when something is to be freed; its error stops
 * the eviction. 0 or -errno.
 */
int blob_cache_enforce(const char *cache_dir, const struct blob_cache_limit *lim,
		       int (*prepare)(void *arg), void *arg,
		       struct blob_cache_enforce_report *r);

/*
 * Record that the image with manifest (or bootstrap) digest @image_digest,
 * known to users as @ref (NULL: recorded as ""), uses the blobs @digests:
 * gc keeps them until the record is forgotten. @keep names other files the
 * image needs (its registry documents and bootstrap, which pkg-image keeps
 * in the cache): blob_cache_kept lists them for pkg-image's gc. A record
 * for the same @image_digest is replaced.
 */
int blob_cache_add_image(const char *cache_dir, const char *ref,
			 const uint8_t image_digest[BLOB_DIGEST_SIZE],
			 const uint8_t (*digests)[BLOB_DIGEST_SIZE],
			 uint32_t nr_digests, const uint8_t (*keep)[BLOB_DIGEST_SIZE],
			 uint32_t nr_keep);
/*
 * Pin the blobs @digests for the kernel mount @mount_id on @mountpoint (a
 * --mode local mount: the kernel holds the files, no process does): gc
 * and prune keep them, and list shows them in use, while that mount
 * exists; a pin whose mount is gone is dropped by the next gc or list.
 * 0 or -errno (logged).
 */
int blob_cache_pin_mount(const char *cache_dir, const char *mountpoint,
			 uint64_t mount_id, const uint8_t (*digests)[BLOB_DIGEST_SIZE],
			 uint32_t nr_digests);

/*
 * Forget one image record (by digest; -ENOENT when there is none), or
 * every one with @image_digest NULL.
 */
int blob_cache_forget_image(const char *cache_dir,
			    const uint8_t *image_digest);

struct blob_cache_entry {
	uint8_t digest[BLOB_DIGEST_SIZE];
	uint64_t uncompressed_size; /* from the map header */
	uint64_t disk_bytes;        /* allocated bytes of data + map */
	uint32_t nr_chunks, chunks_present;
	uint32_t nr_images;         /* image records naming this blob */
	bool in_use;                /* another handle has it open, or a kernel mount */
};
struct blob_cache_image {
	uint8_t digest[BLOB_DIGEST_SIZE];
	char *ref; /* "" when none was given */
	uint32_t nr_blobs;
};
struct blob_cache_list {
	uint64_t usage;         /* allocated bytes of DIR/blobs (what limits count) */
	bool limited;           /* a ferryd keeps the cache within: */
	uint64_t max_size;      /* 0: none */
	unsigned int min_free_pct;
	uint64_t evicted;       /* bytes it freed so far (that ferryd's run) */
	struct blob_cache_entry *blobs;
	uint32_t nr_blobs;
	struct blob_cache_image *images;
	uint32_t nr_images;
};
/*
 * Say in @cache_dir that a ferryd keeps it within @lim and has freed
 * @evicted bytes so far (blob_cache_list reads it back). 0 or -errno.
 */
int blob_cache_record_limit(const char *cache_dir,
			    const struct blob_cache_limit *lim, uint64_t evicted);
/* Everything in the cache; a missing cache directory is an empty list. */
int blob_cache_list(const char *cache_dir, struct blob_cache_list *out);
void blob_cache_list_free(struct blob_cache_list *l);

/*
 * The blobs an image record or a live mount's pin names, sorted, no
 * duplicates (malloc'ed into *@out; NULL when none).
 */
int blob_cache_named(const char *cache_dir, uint8_t (**out)[BLOB_DIGEST_SIZE],
		     uint32_t *nr);
/* The same for the other files image records keep (@keep above). */
int blob_cache_kept(const char *cache_dir, uint8_t (**out)[BLOB_DIGEST_SIZE],
		    uint32_t *nr);

/*
 * Remove the files of every blob no image record names and nobody has
 * open, plus leftover temporary files. *@freed (may be NULL): bytes freed;
 * *@removed (may be NULL): blobs removed.
 */
int blob_cache_gc(const char *cache_dir, uint64_t *freed, uint32_t *removed);

/*
 * Re-hash every chunk marked present against its sha256 (from the chunk
 * table recorded with the blob, DIR/blobs/sha256/<hex>.index). A chunk
 * that does not match is logged, its slot zeroed and its mark cleared, so
 * its next reader fetches it again; it is listed in r->bad. Blobs without
 * a recorded table (cached by an older ferry) or with a damaged map are
 * counted in blobs_skipped. 0 or -errno; free @r with
 * blob_cache_verify_report_free either way.
 */
struct blob_cache_bad_chunk {
	uint8_t blob[BLOB_DIGEST_SIZE];
	uint32_t chunk;
	uint64_t uoff;
};
struct blob_cache_verify_report {
	uint32_t blobs, blobs_skipped;
	uint64_t chunks, bytes; /* verified */
	struct blob_cache_bad_chunk *bad;
	uint32_t nr_bad;
	size_t bad_cap;
};
int blob_cache_verify(const char *cache_dir, struct blob_cache_verify_report *r);
void blob_cache_verify_report_free(struct blob_cache_verify_report *r);

#endif
