/* SPDX-License-Identifier: MIT */
/*
 * Internal to pkg-convert: a streaming tar reader (ustar, GNU long names,
 * PAX) over a byte source that may be compressed. Every header field is
 * validated before use; names are not yet normalised (layer.c does, with
 * path_normalize).
 */
#ifndef FERRY_CONVERT_TAR_H
#define FERRY_CONVERT_TAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/*
 * A byte source: read returns bytes read, 0 at end, or a negative errno.
 * skip (optional: a seekable file) passes over @len bytes without reading
 * them: the bytes skipped, fewer only at the end of the input, or -errno.
 */
struct byte_source {
	ssize_t (*read)(void *ctx, void *buf, size_t len);
	void *ctx;
	int64_t (*skip)(void *ctx, uint64_t len);
};

/* Decompressing input: detects gzip, zstd, xz or plain tar by magic. */
struct input_stream;
int input_open(const char *path, struct input_stream **out);
/*
 * Same, and the file's bytes must hash to @sha256 (NULL: no check): the
 * read that reaches the end of the file fails with -EFSCORRUPTED on a
 * mismatch. @name is used in messages (e.g. the layer digest).
 */
int input_open_verified(const char *path, const uint8_t *sha256,
			const char *name, struct input_stream **out);
/*
 * Decompressing input over @raw (e.g. a registry blob stream, which checks
 * its own digest, or an archive member): its bytes must hash to @sha256,
 * as for input_open_verified (NULL: no check). @name is used in messages.
 */
int input_open_source(struct byte_source raw, const uint8_t *sha256,
		      const char *name, struct input_stream **out);
/* Wrap an in-memory buffer (fuzzing, tests); the buffer must outlive it. */
int input_open_mem(const void *buf, size_t len, struct input_stream **out);
struct byte_source input_source(struct input_stream *in);
const char *input_format(const struct input_stream *in); /* "tar", "gzip", ... */
uint64_t input_bytes_in(const struct input_stream *in);  /* compressed bytes consumed */
void input_close(struct input_stream *in);

/*
 * Resume points (points.c; FORMAT.md 2.8), for `ferry index`: with a
 * recorder attached before the first read, the decoder stops at the next
 * place decoding can resume once @spacing compressed or @out_spacing
 * decoded bytes passed since the last one, and records it there. -ENOTSUP
 * (logged) for xz, which has none. input_points_take moves the points
 * (their windows malloc'ed) out; input_points_bound: the compressed bytes
 * that decode the stream's first @uoff bytes (UINT64_MAX: past its end).
 */
struct input_points;
int points_new(uint64_t spacing, uint64_t out_spacing, struct input_points **out);
void points_free(struct input_points *p);
bool points_hunting(const struct input_points *p);
/* Decoding can resume at @cbit, before the current step's output... */
int points_here(struct input_points *p, uint64_t cbit, uint32_t flags);
/* ...or after it (taken once points_step has seen that output); @fresh:
 * decoding needs nothing before it (a zstd frame), not even a window. */
void points_found(struct input_points *p, uint64_t cbit, bool fresh);
int points_step(struct input_points *p, const uint8_t *out, size_t n, uint64_t pos);
/* The compressed bytes the decoder consumes, every one, in order. */
void points_input(struct input_points *p, const uint8_t *buf, size_t n);
uint64_t points_bound(const struct input_points *p, uint64_t uoff);
uint64_t points_decoded(const struct input_points *p);
/*
 * The sha256 of the decoded stream, once it has ended; points_hash adds
 * the bytes the stream's reader got (the decoder may run on a thread of
 * its own: input_record_points starts one).
 */
void points_hash(struct input_points *p, const uint8_t *out, size_t n);
void points_diff_id(struct input_points *p, uint8_t out[32]);
struct blob_stream_point;
int points_take(struct input_points *p, struct blob_stream_point **points,
		uint32_t *nr);
/*
 * Attach @p (owned by the caller, who frees it after input_close); a
 * compressed stream is then decoded on a thread of its own, ahead of its
 * reader.
 */
int input_record_points(struct input_stream *in, struct input_points *p);

enum tar_type {
	TAR_REG,
	TAR_HARDLINK,
	TAR_SYMLINK,
	TAR_CHR,
	TAR_BLK,
	TAR_DIR,
	TAR_FIFO,
};

struct tar_xattr {
	char *name;
	uint8_t *value;
	uint32_t value_len;
};

struct tar_entry {
	enum tar_type type;
	char *path;     /* as in the archive (PAX / GNU long name applied) */
	char *linkname; /* symlink target or hardlink source */
	uint32_t mode;  /* permission bits only (07777) */
	uint32_t uid, gid;
	int64_t mtime;
	uint32_t mtime_nsec;
	uint64_t size; /* data bytes that follow (regular files) */
	uint32_t dev_major, dev_minor;
	struct tar_xattr *xattrs;
	uint32_t nr_xattrs;
};

struct tar_reader;
int tar_reader_new(struct byte_source src, struct tar_reader **out);
void tar_reader_free(struct tar_reader *r);

/*
 * Next entry: 1 and *@e (valid until the next call), 0 at the end of the
 * archive (two zero blocks, or a clean end of input at a header boundary),
 * or a negative errno (-EFSCORRUPTED with a message naming the entry).
 * Unread data of the previous entry is skipped.
 */
int tar_next(struct tar_reader *r, struct tar_entry **e);

/* Read the current entry's data: bytes read, 0 at its end, or -errno. */
ssize_t tar_read_data(struct tar_reader *r, void *buf, size_t len);

/* Bytes of archive consumed so far (for progress). */
uint64_t tar_offset(const struct tar_reader *r);

#endif
