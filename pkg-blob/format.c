// SPDX-License-Identifier: MIT
/*
 * Chunk blob format v1: byte layout, encoders and validating decoders.
 *
 * All integers are little-endian. Offsets are in bytes.
 *
 * Blob file
 * ---------
 *   [frame data][chunk table][footer]
 *
 * Chunks are stored in frames. A frame is one compressed unit: the
 * uncompressed bytes of one or more chunks (consecutive in the table),
 * concatenated back to back with no padding, compressed together as one
 * codec stream, or stored as they are (codec none). Frame data is every
 * frame's compressed bytes, back to back in table order, starting at file
 * offset 0 with no padding. Then comes the chunk table (nr_chunks entries
 * of 64 bytes), then the 64-byte footer, which is the last 64 bytes of the
 * file.
 *
 * Uncompressed address space: chunk i owns the slot
 * [uoff, uoff + ROUND_UP(usize, 4096)); the first slot starts at 0 and each
 * next slot starts where the previous one ends, so the space is
 * uncompressed_size = sum of the rounded slot sizes bytes long and the
 * bytes between usize and the slot end are zero. The bootstrap's EROFS
 * chunk indexes address this space in 4 KiB blocks (block = uoff / 4096),
 * which is why every slot is block aligned. A blob materialised to its
 * uncompressed form is exactly this space. Frames do not change it: only
 * the compressed side is shared between the chunks of a frame.
 *
 * Chunk table entry (64 bytes), entries in ascending uoff order:
 *    0  u64  uoff       slot start in the uncompressed space, 4096-aligned
 *    8  u64  coff       file offset of the chunk's frame's compressed bytes
 *   16  u32  usize      the chunk's uncompressed bytes, 1 .. BLOB_CHUNK_MAX
 *                       (64 MiB)
 *   20  u32  csize      compressed bytes of the chunk's frame
 *   24  u8   codec      of the frame: 0 none, 1 lz4, 2 zstd, 3 lzma (see
 *                       codec.c)
 *   25  u8[3]           reserved, must be 0
 *   28  u32  frame_off  offset of the chunk's bytes in its frame's
 *                       uncompressed concatenation
 *   32  u8[32]          sha256 of the chunk's uncompressed bytes
 *
 * Frames in the table: an entry with frame_off 0 starts a frame; an entry
 * with frame_off > 0 belongs to the frame of the entry before it and has
 * frame_off = that entry's frame_off + usize, and the same coff, csize and
 * codec. A frame's uncompressed size (frame_usize) is the sum of its
 * chunks' usize, at most BLOB_FRAME_MAX (64 MiB). To read chunk i, read
 * csize bytes at coff, decode them to frame_usize bytes and take usize
 * bytes at frame_off; in a stored frame (codec none) these are the usize
 * file bytes at coff + frame_off.
 *
 * Footer (64 bytes, at file size - 64):
 *    0  u8[8] magic "FERRYBL1"
 *    8  u32  version            1
 *   12  u32  nr_chunks
 *   16  u64  table_offset       file offset of the chunk table
 *   24  u64  uncompressed_size  multiple of 4096
 *   32  u8[32] table_sha256     sha256 of the nr_chunks * 64 table bytes
 *
 * The blob's identity (its name in a blob directory and its digest in
 * the blob index) is the sha256 of the whole file.
 *
 * Validation. A decoder accepts a blob only if every byte of the file is
 * accounted for, with no holes, overlaps or alternative encodings:
 *   - file size == table_offset + nr_chunks * 64 + 64 (no overflow);
 *   - the table hashes to table_sha256;
 *   - slot i starts at 0 (i = 0) or where slot i - 1 ends, and the last
 *     slot ends at uncompressed_size (uncompressed_size is 0 when there
 *     are no chunks);
 *   - entry 0 has frame_off 0; every entry with frame_off > 0 has the
 *     frame_off, coff, csize and codec stated above for frame members;
 *   - frames are consecutive: the first at coff 0, each next one at the
 *     previous frame's coff + csize, the last ending at table_offset;
 *   - codec known; reserved bytes zero; usize in 1 .. BLOB_CHUNK_MAX;
 *     frame_usize <= BLOB_FRAME_MAX; codec none has csize == frame_usize,
 *     any other codec 1 <= csize < frame_usize (the writer stores a frame
 *     raw unless compression made it smaller).
 * So frame reads never exceed BLOB_FRAME_MAX bytes and the data region can
 * be streamed front to back.
 *
 * Which chunks share a frame is the writer's choice (writer.c: small
 * chunks are batched, big ones get a frame each); readers need nothing
 * but the table.
 *
 * Blob index (inside the bootstrap; every blob's footer and table so that
 * a reader needs nothing from the blob files to map chunks):
 *   header (16 bytes):
 *      0  u8[8] magic "FERRYIX1"
 *      8  u32  version  1
 *     12  u32  nr_blobs
 *   nr_blobs records of 128 bytes; record i describes EROFS device i + 1:
 *      0  u8[32] digest           sha256 of the whole blob file
 *     32  u64  size               blob file bytes
 *     40  u64  uncompressed_size
 *     48  u64  table_offset
 *     56  u32  nr_chunks
 *     60  u32  reserved, 0
 *     64  u8[32] table_sha256
 *     96  u8[32] reserved, 0
 *   then each blob's chunk table (nr_chunks * 64 bytes, entries as in the
 *   blob file, byte for byte) in record order; nothing after the last.
 * Each record must satisfy the footer rules above and its table the table
 * rules, checked by the same code as for blob files.
 *
 * Stream blobs (record flags bit 0, BLOB_INFO_STREAM; FORMAT.md 3.5): an
 * OCI layer read in place. size == table_offset == the layer's bytes (no
 * table or footer in it); the table lives only in the blob index, with
 * the same entry layout read differently:
 *   coff       the byte of the frame's resume point (gzip, zstd), or
 *              the frame's first byte (codec none: a plain tar layer)
 *   csize      layer bytes from coff that decode the whole frame
 *   codec      0 none, 4 gzip stream, 5 zstd stream
 *   25  u8     bit 0: the entry starts a frame; other bits and bytes
 *              26..27 zero
 *   frame_off  the chunk's offset in the decoded stream from the resume
 *              point (codec none: from coff)
 * Slots as above. Entry 0 starts a frame; a member shares coff, csize
 * and codec with the entry before it and starts at or after its end;
 * frames start at non-decreasing coff (several may share a resume point)
 * inside the layer; a frame's first chunk is at most BLOB_FRAME_MAX
 * decoded bytes after its resume point (codec none: at 0, csize the
 * frame's size) and the frame spans at most BLOB_FRAME_MAX bytes.
 */
#include "internal.h"
#include "../pkg-base/base.h"

#include <stdio.h>
#include <stdlib.h>

#define MAGIC_LEN 8
#define INDEX_HEADER_SIZE 16
#define INDEX_RECORD_SIZE 128

/* Chunk entry and footer / record field offsets. */
#define CE_UOFF 0
#define CE_COFF 8
#define CE_USIZE 16
#define CE_CSIZE 20
#define CE_CODEC 24
#define CE_RESERVED 25
#define CE_RESERVED_LEN 3
#define CE_STREAM_FLAGS 25 /* stream blobs: the first reserved byte */
#define CE_FRAME_START 0x1u
#define CE_FRAME_OFF 28
#define CE_SHA256 32

#define FT_MAGIC 0
#define FT_VERSION 8
#define FT_NR_CHUNKS 12
#define FT_TABLE_OFFSET 16
#define FT_USIZE 24
#define FT_TABLE_SHA256 32

#define IR_DIGEST 0
#define IR_SIZE 32
#define IR_USIZE 40
#define IR_TABLE_OFFSET 48
#define IR_NR_CHUNKS 56
#define IR_FLAGS 60 /* BLOB_INFO_STREAM; reserved, 0, before stream blobs */
#define IR_TABLE_SHA256 64
#define IR_RESERVED2 96
#define IR_RESERVED2_LEN 32

void blob_table_encode(const struct blob_chunk *chunks, uint32_t nr,
		       uint8_t *out)
{
	uint32_t i;

	for (i = 0; i < nr; i++, out += BLOB_CHUNK_ENTRY_SIZE) {
		const struct blob_chunk *c = &chunks[i];

		memset(out, 0, BLOB_CHUNK_ENTRY_SIZE);
		put_le64(out + CE_UOFF, c->uoff);
		put_le64(out + CE_COFF, c->coff);
		put_le32(out + CE_USIZE, c->usize);
		put_le32(out + CE_CSIZE, c->csize);
		out[CE_CODEC] = c->codec;
		put_le32(out + CE_FRAME_OFF, c->frame_off);
		memcpy(out + CE_SHA256, c->sha256, BLOB_DIGEST_SIZE);
	}
}

/* A stream blob's table: frame starts flagged, offsets from the point. */
static void stream_table_encode(const struct blob_chunk *chunks, uint32_t nr,
				uint8_t *out)
{
	uint32_t i;

	blob_table_encode(chunks, nr, out);
	for (i = 0; i < nr; i++, out += BLOB_CHUNK_ENTRY_SIZE) {
		const struct blob_chunk *c = &chunks[i];

		if (!c->frame_off)
			out[CE_STREAM_FLAGS] = CE_FRAME_START;
		put_le32(out + CE_FRAME_OFF, c->frame_skip + c->frame_off);
	}
}

static void info_table_encode(const struct blob_info *info, uint8_t *out)
{
	if (info->flags & BLOB_INFO_STREAM)
		stream_table_encode(info->chunks, info->nr_chunks, out);
	else
		blob_table_encode(info->chunks, info->nr_chunks, out);
}

void blob_footer_encode(const struct blob_info *info,
			uint8_t out[BLOB_FOOTER_SIZE])
{
	memcpy(out + FT_MAGIC, BLOB_MAGIC, MAGIC_LEN);
	put_le32(out + FT_VERSION, BLOB_FORMAT_VERSION);
	put_le32(out + FT_NR_CHUNKS, info->nr_chunks);
	put_le64(out + FT_TABLE_OFFSET, info->table_offset);
	put_le64(out + FT_USIZE, info->uncompressed_size);
	memcpy(out + FT_TABLE_SHA256, info->table_sha256, BLOB_DIGEST_SIZE);
}

/* Bytes of a table of @nr chunks; false if that overflows size_t. */
static bool table_len(uint32_t nr, size_t *len)
{
	return !__builtin_mul_overflow((size_t)nr, (size_t)BLOB_CHUNK_ENTRY_SIZE,
				       len);
}

int blob_info_as_table(struct blob_info *info)
{
	size_t len;
	uint8_t *table;

	if (!table_len(info->nr_chunks, &len) || !(table = malloc(MAX(len, 1))))
		return -ENOMEM;
	info_table_encode(info, table);
	sha256_buf(table, len, info->table_sha256);
	free(table);
	if (!(info->flags & BLOB_INFO_STREAM))
		info->size = info->table_offset + len + BLOB_FOOTER_SIZE;
	return 0;
}

/* The size rules shared by blob footers and blob index records. */
static int check_sizes(const struct blob_info *info, const char *what)
{
	uint64_t end;

	if (info->flags & BLOB_INFO_STREAM) {
		if (info->table_offset != info->size) {
			ferry_err("%s: stream blob of %llu bytes with table offset %llu",
				  what, (unsigned long long)info->size,
				  (unsigned long long)info->table_offset);
			return -EFSCORRUPTED;
		}
	} else if (__builtin_add_overflow(info->table_offset,
				   (uint64_t)info->nr_chunks *
					   BLOB_CHUNK_ENTRY_SIZE +
				   BLOB_FOOTER_SIZE, &end) ||
	    end != info->size) {
		ferry_err("%s: size %llu does not match table offset %llu + %u chunk entries + footer",
			  what, (unsigned long long)info->size,
			  (unsigned long long)info->table_offset,
			  info->nr_chunks);
		return -EFSCORRUPTED;
	}
	if (info->uncompressed_size % BLOB_SLOT_ALIGN) {
		ferry_err("%s: uncompressed size %llu is not a multiple of %u",
			  what, (unsigned long long)info->uncompressed_size,
			  BLOB_SLOT_ALIGN);
		return -EFSCORRUPTED;
	}
	return 0;
}

int blob_footer_parse(const void *footer, uint64_t blob_size,
		      struct blob_info *info, const char *what)
{
	const uint8_t *f = footer;
	uint32_t version;

	if (memcmp(f + FT_MAGIC, BLOB_MAGIC, MAGIC_LEN)) {
		ferry_err("%s: bad footer magic (not a ferry blob)", what);
		return -EFSCORRUPTED;
	}
	version = get_le32(f + FT_VERSION);
	if (version != BLOB_FORMAT_VERSION) {
		ferry_err("%s: unsupported blob format version %u", what,
			  version);
		return -EFSCORRUPTED;
	}
	memset(info, 0, sizeof(*info));
	info->size = blob_size;
	info->nr_chunks = get_le32(f + FT_NR_CHUNKS);
	info->table_offset = get_le64(f + FT_TABLE_OFFSET);
	info->uncompressed_size = get_le64(f + FT_USIZE);
	memcpy(info->table_sha256, f + FT_TABLE_SHA256, BLOB_DIGEST_SIZE);
	return check_sizes(info, what);
}

int blob_footer_decode(const void *footer, uint64_t blob_size,
		       struct blob_info *info)
{
	return blob_footer_parse(footer, blob_size, info, "blob");
}

/* Entries @a and @b describe the same frame: coff, csize and codec. */
static bool same_frame(const uint8_t *a, const uint8_t *b)
{
	return get_le64(a + CE_COFF) == get_le64(b + CE_COFF) &&
	       get_le32(a + CE_CSIZE) == get_le32(b + CE_CSIZE) &&
	       a[CE_CODEC] == b[CE_CODEC];
}

/* The table's length and sha256 against @info. */
static int table_check_digest(const uint8_t *buf, size_t len,
			      const struct blob_info *info, const char *what)
{
	uint8_t digest[BLOB_DIGEST_SIZE];
	size_t want;

	if (!table_len(info->nr_chunks, &want) || len != want) {
		ferry_err("%s: chunk table is %zu bytes, expected %u entries",
			  what, len, info->nr_chunks);
		return -EFSCORRUPTED;
	}
	sha256_buf(buf, len, digest);
	if (memcmp(digest, info->table_sha256, BLOB_DIGEST_SIZE)) {
		ferry_err("%s: chunk table sha256 mismatch", what);
		return -EFSCORRUPTED;
	}
	return 0;
}

static bool stream_codec(uint8_t codec)
{
	return codec == BLOB_CODEC_NONE || codec == BLOB_CODEC_GZIP_STREAM ||
	       codec == BLOB_CODEC_ZSTD_STREAM;
}

static bool starts_frame(const uint8_t *e)
{
	return e[CE_STREAM_FLAGS] & CE_FRAME_START;
}

/* The rules of a stream blob's table (see the top). */
static int stream_table_check(const uint8_t *buf, size_t len,
			      const struct blob_info *info, const char *what)
{
	uint64_t uend = 0, fcoff = 0;
	uint64_t first = 0; /* the frame's first chunk, from its resume point */
	uint64_t fend = 0;  /* where the previous chunk of the frame ends */
	uint32_t i;
	int ret = table_check_digest(buf, len, info, what);

	for (i = 0; !ret && i < info->nr_chunks; i++, buf += BLOB_CHUNK_ENTRY_SIZE) {
		uint64_t uoff = get_le64(buf + CE_UOFF);
		uint64_t coff = get_le64(buf + CE_COFF);
		uint32_t usize = get_le32(buf + CE_USIZE);
		uint32_t csize = get_le32(buf + CE_CSIZE);
		uint64_t frame_off = get_le32(buf + CE_FRAME_OFF);
		uint8_t codec = buf[CE_CODEC];
		bool start = starts_frame(buf);
		bool last = i + 1 == info->nr_chunks ||
			    starts_frame(buf + BLOB_CHUNK_ENTRY_SIZE);
		const char *bad = NULL;

		if (buf[CE_STREAM_FLAGS] & ~CE_FRAME_START ||
		    !mem_is_zero(buf + CE_STREAM_FLAGS + 1, CE_RESERVED_LEN - 1))
			bad = "reserved bits are not zero";
		else if (!stream_codec(codec))
			bad = "codec not one of a stream blob";
		else if (!usize || usize > BLOB_CHUNK_MAX)
			bad = "uncompressed size out of range";
		else if (uoff != uend)
			bad = "slot does not start where the previous one ends";
		else if (!i && !start)
			bad = "the first entry does not start a frame";
		else if (start && coff < fcoff)
			bad = "frame starts before the previous frame";
		else if (start && (!csize || coff > info->size ||
				   csize > info->size - coff))
			bad = "compressed range outside the layer";
		else if (start && csize > BLOB_FRAME_MAX)
			bad = "compressed range larger than the maximum frame size";
		else if (start && codec == BLOB_CODEC_NONE && frame_off)
			bad = "stored frame that does not start at its first chunk";
		else if (start && frame_off > BLOB_FRAME_MAX)
			bad = "frame starts too far from its resume point";
		else if (!start && !same_frame(buf - BLOB_CHUNK_ENTRY_SIZE, buf))
			bad = "compressed range or codec differs from the rest of its frame";
		else if (!start && frame_off < fend)
			bad = "chunk overlaps the chunk before it in its frame";
		else if (frame_off + usize - (start ? frame_off : first) >
			 BLOB_FRAME_MAX)
			bad = "frame larger than the maximum frame size";
		else if (last && codec == BLOB_CODEC_NONE &&
			 csize != frame_off + usize - (start ? frame_off : first))
			bad = "stored frame whose compressed size differs from its size";
		if (bad) {
			ferry_err("%s: chunk %u (uoff %llu, coff %llu, usize %u, csize %u, frame offset %llu, codec %u): %s",
				  what, i, (unsigned long long)uoff,
				  (unsigned long long)coff, usize, csize,
				  (unsigned long long)frame_off, codec, bad);
			return -EFSCORRUPTED;
		}
		uend = uoff + ROUND_UP((uint64_t)usize, BLOB_SLOT_ALIGN);
		if (start) {
			first = frame_off;
			fcoff = coff;
		}
		fend = frame_off + usize;
	}
	if (!ret && uend != info->uncompressed_size) {
		ferry_err("%s: chunk slots end at %llu but the uncompressed size is %llu",
			  what, (unsigned long long)uend,
			  (unsigned long long)info->uncompressed_size);
		return -EFSCORRUPTED;
	}
	return ret;
}

/* Check the table bytes of @info against every rule (see the top). */
static int table_check(const uint8_t *buf, size_t len,
		       const struct blob_info *info, const char *what)
{
	uint64_t uend = 0, cend = 0;
	uint64_t fend = 0; /* where the previous chunk ends in its frame */
	uint32_t i;
	int ret;

	if (info->flags & BLOB_INFO_STREAM)
		return stream_table_check(buf, len, info, what);
	ret = table_check_digest(buf, len, info, what);
	if (ret)
		return ret;
	for (i = 0; i < info->nr_chunks; i++, buf += BLOB_CHUNK_ENTRY_SIZE) {
		uint64_t uoff = get_le64(buf + CE_UOFF);
		uint64_t coff = get_le64(buf + CE_COFF);
		uint32_t usize = get_le32(buf + CE_USIZE);
		uint32_t csize = get_le32(buf + CE_CSIZE);
		uint32_t frame_off = get_le32(buf + CE_FRAME_OFF);
		uint8_t codec = buf[CE_CODEC];
		/* The frame's size so far: all of it if this chunk is last. */
		uint64_t fusize = (uint64_t)frame_off + usize;
		/* The frame ends here unless the next entry continues it. */
		bool last = i + 1 == info->nr_chunks ||
			    !get_le32(buf + BLOB_CHUNK_ENTRY_SIZE + CE_FRAME_OFF);
		const char *bad = NULL;

		if (!mem_is_zero(buf + CE_RESERVED, CE_RESERVED_LEN))
			bad = "reserved bytes are not zero";
		else if (codec > BLOB_CODEC_LZMA)
			bad = "unknown codec";
		else if (!usize || usize > BLOB_CHUNK_MAX)
			bad = "uncompressed size out of range";
		else if (uoff != uend)
			bad = "slot does not start where the previous one ends";
		else if (frame_off && frame_off != fend)
			bad = "frame offset is not where the previous chunk of its frame ends";
		else if (!frame_off && coff != cend)
			bad = "frame does not start where the previous frame's compressed bytes end";
		else if (frame_off && !same_frame(buf - BLOB_CHUNK_ENTRY_SIZE,
						  buf))
			bad = "compressed range or codec differs from the rest of its frame";
		else if (fusize > BLOB_FRAME_MAX)
			bad = "frame larger than the maximum frame size";
		else if (last && codec == BLOB_CODEC_NONE && csize != fusize)
			bad = "stored frame whose compressed size differs from its size";
		else if (last && codec != BLOB_CODEC_NONE &&
			 (!csize || csize >= fusize))
			bad = "frame's compressed size not in 1 .. frame size - 1";
		if (bad) {
			ferry_err("%s: chunk %u (uoff %llu, coff %llu, usize %u, csize %u, frame offset %u, codec %u): %s",
				  what, i, (unsigned long long)uoff,
				  (unsigned long long)coff, usize, csize,
				  frame_off, codec, bad);
			return -EFSCORRUPTED;
		}
		/* Both stay below 2^32 * 2^26: no overflow. */
		uend = uoff + ROUND_UP((uint64_t)usize, BLOB_SLOT_ALIGN);
		fend = fusize;
		if (last)
			cend = coff + csize;
	}
	if (uend != info->uncompressed_size) {
		ferry_err("%s: chunk slots end at %llu but the uncompressed size is %llu",
			  what, (unsigned long long)uend,
			  (unsigned long long)info->uncompressed_size);
		return -EFSCORRUPTED;
	}
	if (cend != info->table_offset) {
		ferry_err("%s: frame data ends at %llu but the chunk table starts at %llu",
			  what, (unsigned long long)cend,
			  (unsigned long long)info->table_offset);
		return -EFSCORRUPTED;
	}
	return 0;
}

/*
 * A stream blob's frames in memory: frame_skip the first chunk's offset
 * from the resume point, frame_off from the frame's start (0 starts a
 * frame, as in blob v1).
 */
static void stream_table_frames(const uint8_t *e, struct blob_info *info)
{
	uint32_t i, skip = 0;

	for (i = 0; i < info->nr_chunks; i++, e += BLOB_CHUNK_ENTRY_SIZE) {
		struct blob_chunk *c = &info->chunks[i];

		if (starts_frame(e))
			skip = c->frame_off;
		c->frame_skip = skip;
		c->frame_off -= skip;
	}
}

int blob_table_parse(const void *buf, size_t len, struct blob_info *info,
		     const char *what)
{
	const uint8_t *e = buf;
	uint32_t i;
	int ret;

	info->chunks = NULL;
	ret = table_check(buf, len, info, what);
	if (ret || !info->nr_chunks)
		return ret;
	info->chunks = calloc(info->nr_chunks, sizeof(*info->chunks));
	if (!info->chunks)
		return -ENOMEM;
	for (i = 0; i < info->nr_chunks; i++, e += BLOB_CHUNK_ENTRY_SIZE) {
		struct blob_chunk *c = &info->chunks[i];

		c->uoff = get_le64(e + CE_UOFF);
		c->coff = get_le64(e + CE_COFF);
		c->usize = get_le32(e + CE_USIZE);
		c->csize = get_le32(e + CE_CSIZE);
		c->frame_off = get_le32(e + CE_FRAME_OFF);
		c->codec = e[CE_CODEC];
		memcpy(c->sha256, e + CE_SHA256, BLOB_DIGEST_SIZE);
	}
	if (info->flags & BLOB_INFO_STREAM)
		stream_table_frames(buf, info);
	/* A frame's size is where its last chunk ends. */
	for (i = info->nr_chunks; i--;) {
		struct blob_chunk *c = &info->chunks[i];

		if (i + 1 < info->nr_chunks && c[1].frame_off)
			c->frame_usize = c[1].frame_usize;
		else
			c->frame_usize = c->frame_off + c->usize;
	}
	return 0;
}

int blob_table_decode(const void *buf, size_t len, struct blob_info *info)
{
	return blob_table_parse(buf, len, info, "blob");
}

void blob_info_free_chunks(struct blob_info *info)
{
	free(info->chunks);
	info->chunks = NULL;
}

const struct blob_chunk *blob_find_chunk(const struct blob_info *info,
					 uint64_t uoff)
{
	uint32_t lo = 0, hi = info->nr_chunks;

	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;
		const struct blob_chunk *c = &info->chunks[mid];

		if (c->uoff == uoff)
			return c;
		if (c->uoff < uoff)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

int blob_index_encode(const struct blob_info *blobs, uint32_t nr_blobs,
		      void **buf, size_t *len)
{
	size_t total = INDEX_HEADER_SIZE, tlen;
	uint8_t *out, *rec, *table;
	char what[48];
	uint32_t i;
	int ret;

	if (__builtin_mul_overflow((size_t)nr_blobs, (size_t)INDEX_RECORD_SIZE,
				   &tlen) ||
	    __builtin_add_overflow(total, tlen, &total))
		return -EOVERFLOW;
	for (i = 0; i < nr_blobs; i++)
		if (!table_len(blobs[i].nr_chunks, &tlen) ||
		    __builtin_add_overflow(total, tlen, &total))
			return -EOVERFLOW;
	out = calloc(1, total);
	if (!out)
		return -ENOMEM;
	memcpy(out, BLOB_INDEX_MAGIC, MAGIC_LEN);
	put_le32(out + 8, BLOB_FORMAT_VERSION);
	put_le32(out + 12, nr_blobs);
	rec = out + INDEX_HEADER_SIZE;
	table = rec + (size_t)nr_blobs * INDEX_RECORD_SIZE;
	for (i = 0; i < nr_blobs; i++, rec += INDEX_RECORD_SIZE) {
		const struct blob_info *b = &blobs[i];

		memcpy(rec + IR_DIGEST, b->digest, BLOB_DIGEST_SIZE);
		put_le64(rec + IR_SIZE, b->size);
		put_le64(rec + IR_USIZE, b->uncompressed_size);
		put_le64(rec + IR_TABLE_OFFSET, b->table_offset);
		put_le32(rec + IR_NR_CHUNKS, b->nr_chunks);
		put_le32(rec + IR_FLAGS, b->flags);
		memcpy(rec + IR_TABLE_SHA256, b->table_sha256,
		       BLOB_DIGEST_SIZE);
		tlen = (size_t)b->nr_chunks * BLOB_CHUNK_ENTRY_SIZE;
		info_table_encode(b, table);
		/* Never write an index that blob_index_decode would reject. */
		snprintf(what, sizeof(what), "blob index: blob %u", i);
		ret = check_sizes(b, what);
		if (!ret)
			ret = table_check(table, tlen, b, what);
		if (ret) {
			free(out);
			return -EINVAL;
		}
		table += tlen;
	}
	*buf = out;
	*len = total;
	return 0;
}

int blob_index_decode_prefix(const void *buf, size_t len,
			     struct blob_index *out, size_t *used)
{
	const uint8_t *p = buf, *rec;
	struct blob_index idx = { 0 };
	uint64_t pos;
	uint32_t version, i;
	char what[48];
	int ret;

	memset(out, 0, sizeof(*out));
	if (len < INDEX_HEADER_SIZE || memcmp(p, BLOB_INDEX_MAGIC, MAGIC_LEN)) {
		ferry_err("blob index: bad header (%zu bytes)", len);
		return -EFSCORRUPTED;
	}
	version = get_le32(p + 8);
	if (version != BLOB_FORMAT_VERSION) {
		ferry_err("blob index: unsupported version %u", version);
		return -EFSCORRUPTED;
	}
	idx.nr_blobs = get_le32(p + 12);
	/* At most 2^32 * 128 + 16: no overflow in 64 bits. */
	pos = INDEX_HEADER_SIZE + (uint64_t)idx.nr_blobs * INDEX_RECORD_SIZE;
	if (pos > len) {
		ferry_err("blob index: %u blob records do not fit in %zu bytes",
			  idx.nr_blobs, len);
		return -EFSCORRUPTED;
	}
	if (idx.nr_blobs) {
		idx.blobs = calloc(idx.nr_blobs, sizeof(*idx.blobs));
		if (!idx.blobs)
			return -ENOMEM;
	}
	rec = p + INDEX_HEADER_SIZE;
	for (i = 0; i < idx.nr_blobs; i++, rec += INDEX_RECORD_SIZE) {
		struct blob_info *b = &idx.blobs[i];
		size_t tlen;

		snprintf(what, sizeof(what), "blob index: blob %u", i);
		if (get_le32(rec + IR_FLAGS) & ~BLOB_INFO_STREAM ||
		    !mem_is_zero(rec + IR_RESERVED2, IR_RESERVED2_LEN)) {
			ferry_err("%s: reserved bytes are not zero", what);
			ret = -EFSCORRUPTED;
			goto fail;
		}
		memcpy(b->digest, rec + IR_DIGEST, BLOB_DIGEST_SIZE);
		b->size = get_le64(rec + IR_SIZE);
		b->uncompressed_size = get_le64(rec + IR_USIZE);
		b->table_offset = get_le64(rec + IR_TABLE_OFFSET);
		b->nr_chunks = get_le32(rec + IR_NR_CHUNKS);
		b->flags = get_le32(rec + IR_FLAGS);
		memcpy(b->table_sha256, rec + IR_TABLE_SHA256,
		       BLOB_DIGEST_SIZE);
		ret = check_sizes(b, what);
		if (ret)
			goto fail;
		if (!table_len(b->nr_chunks, &tlen) || tlen > len - pos) {
			ferry_err("%s: chunk table of %u entries runs past the index end",
				  what, b->nr_chunks);
			ret = -EFSCORRUPTED;
			goto fail;
		}
		ret = blob_table_parse(p + pos, tlen, b, what);
		if (ret)
			goto fail;
		pos += tlen;
	}
	*out = idx;
	*used = (size_t)pos;
	return 0;
fail:
	blob_index_free(&idx);
	return ret;
}

int blob_index_decode(const void *buf, size_t len, struct blob_index *out)
{
	size_t used;
	int ret = blob_index_decode_prefix(buf, len, out, &used);

	if (!ret && used != len) {
		ferry_err("blob index: %llu unexpected bytes after the last chunk table",
			  (unsigned long long)(len - used));
		blob_index_free(out);
		ret = -EFSCORRUPTED;
	}
	return ret;
}

void blob_index_free(struct blob_index *idx)
{
	uint32_t i;

	for (i = 0; i < idx->nr_blobs && idx->blobs; i++)
		blob_info_free_chunks(&idx->blobs[i]);
	free(idx->blobs);
	idx->blobs = NULL;
	idx->nr_blobs = 0;
}
