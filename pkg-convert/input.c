// SPDX-License-Identifier: MIT
/*
 * Decompressing input for the tar reader. The format is chosen by magic
 * bytes (gzip, zstd, xz, else plain tar) and the decoder writes straight
 * into the caller's buffer, so a tar layer costs one decompression pass
 * and no extra copy.
 *
 * Concatenation: multi-member gzip, multi-frame zstd (skippable frames
 * included) and concatenated xz streams (with stream padding) all decode
 * as one byte stream, as gzip(1), zstd(1) and xz(1) do.
 *
 * Trailing data after the last gzip member: NUL bytes up to the end of the
 * input are ignored (tape-style padding that GNU tar and gzip(1) tolerate);
 * anything else is an error. The error only surfaces if the tar reader
 * reads that far, i.e. when the archive is not terminated before it.
 * zstd and xz reject trailing garbage through their own decoders.
 *
 * gzip members are inflated by ISA-L's igzip when ferry is built with it
 * (about twice zlib's speed: inflate is the main thread's largest cost),
 * else by zlib; $FERRY_INFLATE=zlib selects zlib anyway (tests, benchmarks).
 * Both accept and reject the same streams: ISA-L checks the member header
 * (magic, method, FHCRC) and the trailer's CRC32 and ISIZE; the reserved
 * FLG bits, which zlib and gzip(1) refuse, are checked here.
 */
#include "convert.h"
#include "tar.h"

#include <fcntl.h>
#ifdef FERRY_HAVE_ISAL
#include <isa-l/igzip_lib.h>
#endif
#include <limits.h>
#include <lzma.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>
#include <zstd_errors.h>

#include "../pkg-base/base.h"
#include "../pkg-blob/blob.h"

#define INPUT_BUF_SIZE (256u * 1024)
/* xz -9 needs 65 MiB; refuse streams that ask for far more. */
#define INPUT_XZ_MEMLIMIT (256ull << 20)

enum input_kind {
	INPUT_PLAIN,
	INPUT_GZIP,
	INPUT_ZSTD,
	INPUT_XZ,
};

static const char *const kind_names[] = { "tar", "gzip", "zstd", "xz" };

enum inflater {
	INFLATE_ZLIB,
	INFLATE_ISAL,
};

static const char *const inflater_names[] = { "zlib", "isal" };

#ifdef FERRY_HAVE_ISAL
#define INFLATE_DEFAULT INFLATE_ISAL
/* FLG bits 5-7 are reserved (RFC 1952 2.3.1). */
#define GZIP_FLG_RESERVED 0xe0u
#else
#define INFLATE_DEFAULT INFLATE_ZLIB
#endif

struct input_stream {
	char *name;
	enum input_kind kind;
	int fd;              /* an input file, or -1 */
	struct byte_source raw; /* the compressed bytes; read NULL: memory input */
	uint8_t *buf;        /* compressed input buffer (file input only) */
	const uint8_t *next; /* unconsumed input */
	size_t avail;
	uint64_t bytes_read; /* read from the file or memory so far */
	bool eof;            /* no input beyond next/avail */
	bool finished;       /* decoder reached a clean end */
	bool member_end;     /* gzip: between members */
	bool frame_end;      /* zstd: last frame complete and flushed */
	int err;             /* sticky error, reported once pending output is out */
	struct sha256_hasher *hasher; /* verifying input: sha256 of the file bytes */
	uint8_t expect[BLOB_DIGEST_SIZE];
	enum inflater inflater; /* gzip */
	z_stream z;
#ifdef FERRY_HAVE_ISAL
	struct inflate_state *isal;
	/*
	 * The header is parsed here, not by isal_inflate(ISAL_GZIP), whose
	 * parse forgets the FLG byte when a header spans two calls (2.30).
	 */
	struct isal_gzip_header gz_hdr;
	bool in_header;      /* isal: the member header is not read yet */
#endif
	ZSTD_DStream *zd;
	lzma_stream lz;
	struct input_points *pts; /* `ferry index`: resume points, or NULL */
	struct input_thread *thread; /* decoding ahead on a thread, or NULL */
};

/*
 * `ferry index` decodes on a thread of its own, ahead of the tar reader
 * and the chunk hashing: a ring of blocks between them (decode_read fills
 * them, thread_read empties them). The decoder's state (buffers, inflater,
 * points' ring and marks) is the thread's alone once it runs.
 *
 * A third thread reads the compressed bytes and hashes them (raw_fill)
 * into a ring of input buffers that the decoder takes in turn
 * (reader_take), without a copy: inflating is the longest of the three
 * stages, and the read's copy and the layer's sha256 were a fifth of it
 * (performance-log.md, "Ferry indexes of ordinary images"). The
 * buffers are cut as input_fill cuts them, so the same points are found.
 * The decoder owns in->bytes_read; the reader owns the hasher. A fourth
 * thread, points.c's, probes and compresses the points' windows.
 */
#define THREAD_BLOCKS 4
#define THREAD_BLOCK (1u << 20)
#define READ_BUFS 4

struct input_thread {
	pthread_t tid, reader;
	bool reading;             /* the reader thread runs */
	pthread_mutex_t lock;     /* one lock for both rings */
	/* What each thread waits for: a wakeup goes to the one it concerns. */
	pthread_cond_t to_reader, to_decoder, to_main;
	uint8_t *blocks[THREAD_BLOCKS];
	size_t len[THREAD_BLOCKS];
	unsigned int head, count; /* the first full block, full blocks */
	size_t pos;               /* read so far of blocks[head] */
	bool done;                /* the decoder reached the end or an error */
	int err;
	bool stop;                /* input_close: the decoder and reader stop */
	uint64_t bytes_in;        /* compressed bytes consumed, published */
	uint8_t *bufs[READ_BUFS]; /* compressed input, INPUT_BUF_SIZE each */
	size_t buf_len[READ_BUFS];
	unsigned int buf_head, buf_count; /* the decoder's buffer, then full ones */
	bool buf_taken;           /* the decoder is reading bufs[buf_head] */
	bool read_done;           /* the reader reached the end or an error */
	int read_err;
};

/*
 * While the points recorder hunts, ISA-L gets this much input per call:
 * it never stops between deflate blocks on its own, but when its input
 * ends inside a block header it keeps that header unread (block_state
 * ISAL_BLOCK_HDR) — a block boundary. Headers are tens to hundreds of
 * bytes, so a hunt ends within about one block (bench: 227 calls).
 */
#define HUNT_SLICE 64u
/* Decoded bytes per step while recording: finer marks (points.c). */
#define RECORD_STEP (64u << 10)

/* Compressed bytes the decoder has consumed. */
static uint64_t consumed(const struct input_stream *in)
{
	return in->bytes_read - in->avail;
}

/*
 * Every byte read from the file passes here: counted, hashed when the
 * input is verified, and at the end of the file checked against the
 * expected digest, so that no consumer sees the end of a tampered file.
 */
static ssize_t raw_read(struct input_stream *in, void *buf, size_t len)
{
	uint8_t digest[BLOB_DIGEST_SIZE];
	ssize_t n = in->raw.read(in->raw.ctx, buf, len);

	if (n < 0)
		return n;
	if (!in->hasher)
		return n;
	if (n) {
		sha256_hasher_update(in->hasher, buf, (size_t)n);
		return n;
	}
	sha256_hasher_final(in->hasher, digest);
	sha256_hasher_free(in->hasher);
	in->hasher = NULL;
	if (memcmp(digest, in->expect, sizeof(digest))) {
		ferry_err("%s: content does not match its digest", in->name);
		return -EFSCORRUPTED;
	}
	return 0;
}

/* The next buffer's worth of the file into @buf (0: its end). */
static ssize_t raw_fill(struct input_stream *in, uint8_t *buf)
{
	ssize_t n = raw_read(in, buf, INPUT_BUF_SIZE);

	/*
	 * Recording points: whole buffers, so that where the decoder's input
	 * ends, and so which points it finds, is the same whether a layer
	 * comes from a file or in a registry's pieces (the same index).
	 */
	while (in->pts && n > 0 && (size_t)n < INPUT_BUF_SIZE) {
		ssize_t more = raw_read(in, buf + n, INPUT_BUF_SIZE - (size_t)n);

		if (more <= 0)
			return more < 0 ? more : n;
		n += more;
	}
	return n;
}

/* The decoder's next buffer from the reader thread; the last one back. */
static int reader_take(struct input_stream *in)
{
	struct input_thread *t = in->thread;
	int ret = 0;

	pthread_mutex_lock(&t->lock);
	if (t->buf_taken) {
		t->buf_head = (t->buf_head + 1) % READ_BUFS;
		t->buf_count--;
		t->buf_taken = false;
		pthread_cond_signal(&t->to_reader);
	}
	while (!t->buf_count && !t->read_done && !t->stop)
		pthread_cond_wait(&t->to_decoder, &t->lock);
	if (t->buf_count) {
		in->next = t->bufs[t->buf_head];
		in->avail = t->buf_len[t->buf_head];
		in->bytes_read += in->avail;
		t->buf_taken = true;
	} else if (t->stop) {
		ret = -ECANCELED;
	} else if (t->read_err) {
		ret = t->read_err;
	} else {
		in->eof = true;
	}
	pthread_mutex_unlock(&t->lock);
	return ret;
}

/* Read the next block of the file; sets eof at its end. */
static int input_fill(struct input_stream *in)
{
	ssize_t n;

	if (!in->raw.read) {
		in->eof = true;
		return 0;
	}
	if (in->thread && in->thread->reading)
		return reader_take(in);
	n = raw_fill(in, in->buf);
	if (n < 0)
		return (int)n;
	in->bytes_read += (uint64_t)n;
	in->next = in->buf;
	in->avail = (size_t)n;
	if (!n)
		in->eof = true;
	return 0;
}

static void input_consume(struct input_stream *in, size_t n)
{
	if (in->pts)
		points_input(in->pts, in->next, n);
	in->next += n;
	in->avail -= n;
}

static int input_corrupt(struct input_stream *in, const char *what)
{
	ferry_err("%s: %s %s stream", in->name, what, kind_names[in->kind]);
	return -EFSCORRUPTED;
}

/*
 * $FERRY_INFLATE names the gzip inflater (tests, benchmarks); unset or
 * empty: the fastest one built in.
 */
static int inflater_choose(enum inflater *out)
{
	const char *name = getenv("FERRY_INFLATE");
	size_t i;

	*out = INFLATE_DEFAULT;
	if (!name || !*name)
		return 0;
	/* The default is the last one built in. */
	for (i = 0; i <= INFLATE_DEFAULT; i++) {
		if (!strcmp(name, inflater_names[i])) {
			*out = (enum inflater)i;
			return 0;
		}
	}
	ferry_err("FERRY_INFLATE=%s: this build inflates with %s", name,
		  INFLATE_DEFAULT == INFLATE_ISAL ? "isal or zlib" : "zlib only");
	return -EINVAL;
}

const char *input_inflater(void)
{
	enum inflater i;

	return inflater_choose(&i) ? NULL : inflater_names[i];
}

/* Ready the inflater for the next member's header. */
static int gzip_member_start(struct input_stream *in)
{
#ifdef FERRY_HAVE_ISAL
	if (in->inflater == INFLATE_ISAL) {
		isal_inflate_reset(in->isal); /* keeps crc_flag */
		isal_gzip_header_init(&in->gz_hdr);
		in->in_header = true;
		return 0;
	}
#endif
	return inflateReset(&in->z) == Z_OK ? 0 : -EINVAL;
}

static int gzip_init(struct input_stream *in)
{
	int ret = inflater_choose(&in->inflater);

	if (ret)
		return ret;
#ifdef FERRY_HAVE_ISAL
	if (in->inflater == INFLATE_ISAL) {
		in->isal = malloc(sizeof(*in->isal));
		if (!in->isal)
			return -ENOMEM;
		isal_inflate_init(in->isal);
		/* Header read by isal_step; ISA-L checks CRC32 and ISIZE. */
		in->isal->crc_flag = ISAL_GZIP_NO_HDR_VER;
		return gzip_member_start(in);
	}
#endif
	/* 15 + 32: full window, gzip/zlib header auto-detected */
	return inflateInit2(&in->z, 15 + 32) == Z_OK ? 0 : -ENOMEM;
}

/*
 * After a gzip member: another member must start right away, or only NUL
 * bytes may follow up to the end of the input.
 */
static int gzip_between_members(struct input_stream *in)
{
	bool zeros = false;

	for (;;) {
		int ret;

		while (in->avail && !in->next[0]) {
			input_consume(in, 1);
			zeros = true;
		}
		if (in->avail)
			break;
		if (in->eof) {
			in->finished = true;
			return 0;
		}
		ret = input_fill(in);
		if (ret)
			return ret;
	}
	/* The inflater checks the rest of the next member's header. */
	if (zeros || in->next[0] != 0x1f)
		return input_corrupt(in, "trailing garbage after");
	in->member_end = false;
	if (in->pts) {
		int ret = points_here(in->pts, consumed(in) * 8, BLOB_POINT_HEADER);

		if (ret)
			return ret;
	}
	return gzip_member_start(in);
}

/* zlib and ISA-L count in 32 bits: feed them at most UINT_MAX at a time. */
static uInt clamp_uint(size_t n)
{
	return n > UINT_MAX ? UINT_MAX : (uInt)n;
}

#ifdef FERRY_HAVE_ISAL
static const char *isal_strerror(int ir)
{
	switch (ir) {
	case ISAL_INVALID_WRAPPER:
		return "bad member header";
	case ISAL_UNSUPPORTED_METHOD:
		return "unknown compression method";
	case ISAL_INCORRECT_CHECKSUM: /* header CRC16, or CRC32 / ISIZE */
		return "checksum or length mismatch";
	default:
		return "invalid deflate data";
	}
}

static int isal_step(struct input_stream *in, uint8_t *out, size_t len,
		     size_t *produced)
{
	struct inflate_state *s = in->isal;
	uInt in_len = clamp_uint(in->avail), out_len = clamp_uint(len);
	bool hunting = in->pts && points_hunting(in->pts) && !in->in_header;
	int ir = ISAL_DECOMP_OK;

	if (hunting)
		in_len = MIN(in_len, HUNT_SLICE);
	s->next_in = (uint8_t *)in->next;
	s->avail_in = in_len;
	s->next_out = out;
	s->avail_out = out_len;
	if (in->in_header) {
		ir = isal_read_gzip_header(s, &in->gz_hdr);
		/*
		 * ISA-L leaves the reserved FLG bits unchecked (zlib refuses
		 * them); it keeps the FLG byte in gz_hdr.flags.
		 */
		if (ir == ISAL_DECOMP_OK && (in->gz_hdr.flags & GZIP_FLG_RESERVED))
			ir = ISAL_INVALID_WRAPPER;
		in->in_header = ir == ISAL_END_INPUT;
	}
	if (ir == ISAL_DECOMP_OK && !in->in_header)
		ir = isal_inflate(s);
	input_consume(in, in_len - s->avail_in);
	*produced = out_len - s->avail_out;
	/* The header ISA-L keeps unread starts where its bits and bytes do. */
	if (hunting && ir == ISAL_DECOMP_OK && s->block_state == ISAL_BLOCK_HDR)
		points_found(in->pts, consumed(in) * 8 - (uint64_t)s->tmp_in_size * 8 -
				      (uint64_t)s->read_in_length, false);
	switch (ir) {
	case ISAL_DECOMP_OK:
		/* FINISH: the trailer is checked and all output flushed. */
		in->member_end = s->block_state == ISAL_BLOCK_FINISH;
		return 0;
	case ISAL_END_INPUT: /* header cut short: the caller refills or reports EOF */
		return 0;
	default:
		ferry_err("%s: corrupt gzip stream: %s", in->name,
			  isal_strerror(ir));
		return -EFSCORRUPTED;
	}
}
#endif

static int zlib_step(struct input_stream *in, uint8_t *out, size_t len,
		     size_t *produced)
{
	uInt in_len = clamp_uint(in->avail), out_len = clamp_uint(len);
	bool hunting = in->pts && points_hunting(in->pts);
	int zr;

	in->z.next_in = (Bytef *)in->next;
	in->z.avail_in = in_len;
	in->z.next_out = out;
	in->z.avail_out = out_len;
	/* Z_BLOCK: stop at the next deflate block boundary (zran.c's way). */
	zr = inflate(&in->z, hunting ? Z_BLOCK : Z_NO_FLUSH);
	input_consume(in, in_len - in->z.avail_in);
	*produced = out_len - in->z.avail_out;
	if (hunting && zr == Z_OK && (in->z.data_type & 128) &&
	    !(in->z.data_type & 64))
		points_found(in->pts, consumed(in) * 8 - (uint64_t)(in->z.data_type & 7),
			     false);
	switch (zr) {
	case Z_STREAM_END:
		in->member_end = true;
		return 0;
	case Z_OK:
	case Z_BUF_ERROR: /* no progress: the caller refills or reports EOF */
		return 0;
	case Z_MEM_ERROR:
		return -ENOMEM;
	default:
		ferry_err("%s: corrupt gzip stream: %s", in->name,
			  in->z.msg ? in->z.msg : "bad data");
		return -EFSCORRUPTED;
	}
}

static int gzip_step(struct input_stream *in, uint8_t *out, size_t len,
		     size_t *produced)
{
	if (in->member_end) {
		int ret = gzip_between_members(in);

		if (ret || in->finished)
			return ret;
	}
#ifdef FERRY_HAVE_ISAL
	if (in->inflater == INFLATE_ISAL)
		return isal_step(in, out, len, produced);
#endif
	return zlib_step(in, out, len, produced);
}

static int zstd_step(struct input_stream *in, uint8_t *out, size_t len,
		     size_t *produced)
{
	ZSTD_inBuffer ib = { in->next, in->avail, 0 };
	ZSTD_outBuffer ob = { out, len, 0 };
	size_t zr;

	if (!in->avail && in->eof && in->frame_end) {
		in->finished = true;
		return 0;
	}
	zr = ZSTD_decompressStream(in->zd, &ob, &ib);
	input_consume(in, ib.pos);
	*produced = ob.pos;
	if (!ZSTD_isError(zr)) {
		in->frame_end = zr == 0;
		/* A frame ended: the next one can be decoded by itself. */
		if (in->frame_end && in->pts)
			points_found(in->pts, consumed(in) * 8, true);
		return 0;
	}
	switch (ZSTD_getErrorCode(zr)) {
	case ZSTD_error_memory_allocation:
		return -ENOMEM;
	case ZSTD_error_frameParameter_windowTooLarge:
		ferry_err("%s: zstd window larger than 128 MiB is not supported",
			  in->name);
		return -ENOTSUP;
	default:
		ferry_err("%s: corrupt zstd stream: %s", in->name,
			  ZSTD_getErrorName(zr));
		return -EFSCORRUPTED;
	}
}

static int xz_step(struct input_stream *in, uint8_t *out, size_t len,
		   size_t *produced)
{
	lzma_ret lr;

	in->lz.next_in = in->next;
	in->lz.avail_in = in->avail;
	in->lz.next_out = out;
	in->lz.avail_out = len;
	/* With LZMA_CONCATENATED only LZMA_FINISH ends the last stream. */
	lr = lzma_code(&in->lz, in->eof ? LZMA_FINISH : LZMA_RUN);
	input_consume(in, in->avail - in->lz.avail_in);
	*produced = len - in->lz.avail_out;
	switch (lr) {
	case LZMA_STREAM_END:
		in->finished = true;
		return 0;
	case LZMA_OK:
	case LZMA_BUF_ERROR: /* no progress: the caller refills or reports EOF */
		return 0;
	case LZMA_MEM_ERROR:
		return -ENOMEM;
	case LZMA_MEMLIMIT_ERROR:
		ferry_err("%s: xz stream needs more than %llu MiB to decode",
			  in->name, INPUT_XZ_MEMLIMIT >> 20);
		return -ENOTSUP;
	default:
		ferry_err("%s: corrupt xz stream (liblzma error %d)", in->name,
			  (int)lr);
		return -EFSCORRUPTED;
	}
}

static ssize_t plain_read(struct input_stream *in, uint8_t *out, size_t len)
{
	size_t n;
	int ret;

	if (!in->avail) {
		if (in->eof)
			return 0;
		/* Large reads bypass the buffer: one copy, from the kernel. */
		if (in->raw.read && len >= INPUT_BUF_SIZE) {
			ssize_t got = raw_read(in, out, MIN(len, (size_t)SSIZE_MAX));

			if (got > 0)
				in->bytes_read += (uint64_t)got;
			if (got == 0)
				in->eof = true;
			return got;
		}
		ret = input_fill(in);
		if (ret)
			return ret;
		if (!in->avail)
			return 0;
	}
	n = MIN(len, in->avail);
	memcpy(out, in->next, n);
	input_consume(in, n);
	return (ssize_t)n;
}

static ssize_t decode_read(struct input_stream *in, void *buf, size_t len)
{
	uint8_t *out = buf;
	size_t done = 0;
	int ret = 0;

	if (in->err)
		return in->err;
	len = MIN(len, (size_t)SSIZE_MAX);
	if (in->kind == INPUT_PLAIN) {
		ssize_t n = plain_read(in, out, len);

		if (n < 0)
			in->err = (int)n;
		return n;
	}
	while (done < len && !in->finished) {
		size_t produced = 0, before, step;

		if (!in->avail && !in->eof) {
			ret = input_fill(in);
			if (ret)
				break;
		}
		before = in->avail;
		step = in->pts ? MIN(len - done, (size_t)RECORD_STEP) : len - done;
		switch (in->kind) {
		case INPUT_GZIP:
			ret = gzip_step(in, out + done, step, &produced);
			break;
		case INPUT_ZSTD:
			ret = zstd_step(in, out + done, step, &produced);
			break;
		default:
			ret = xz_step(in, out + done, step, &produced);
			break;
		}
		if (!ret && in->pts)
			ret = points_step(in->pts, out + done, produced, consumed(in));
		if (ret)
			break;
		done += produced;
		/* All input seen, the decoder still wants more: cut short. */
		if (!produced && in->avail == before && in->eof &&
		    !in->finished) {
			ret = input_corrupt(in, "truncated");
			break;
		}
	}
	if (ret) {
		in->err = ret;
		if (!done)
			return ret;
	}
	return (ssize_t)done;
}

static void *decode_thread(void *arg)
{
	struct input_stream *in = arg;
	struct input_thread *t = in->thread;
	unsigned int slot;
	ssize_t n = 0;
	size_t fill;

	pthread_mutex_lock(&t->lock);
	for (;;) {
		while (t->count == THREAD_BLOCKS && !t->stop)
			pthread_cond_wait(&t->to_decoder, &t->lock);
		if (t->stop)
			break;
		slot = (t->head + t->count) % THREAD_BLOCKS;
		pthread_mutex_unlock(&t->lock);
		for (fill = 0; fill < THREAD_BLOCK; fill += (size_t)n) {
			n = decode_read(in, t->blocks[slot] + fill, THREAD_BLOCK - fill);
			if (n <= 0)
				break;
		}
		pthread_mutex_lock(&t->lock);
		t->bytes_in = consumed(in);
		if (fill) {
			t->len[slot] = fill;
			t->count++;
		}
		if (n <= 0) {
			t->err = (int)n;
			t->done = true;
		}
		pthread_cond_signal(&t->to_main);
		if (t->done)
			break;
	}
	pthread_mutex_unlock(&t->lock);
	return NULL;
}

/*
 * The block at the head is this side's until it moves on (the decoder
 * fills only the others): copied out without the lock, which the
 * decoder takes for every input buffer and block.
 */
static ssize_t thread_read(struct input_thread *t, uint8_t *out, size_t len)
{
	size_t done = 0, n;

	pthread_mutex_lock(&t->lock);
	while (done < len) {
		while (!t->count && !t->done)
			pthread_cond_wait(&t->to_main, &t->lock);
		if (!t->count)
			break;
		n = MIN(len - done, t->len[t->head] - t->pos);
		pthread_mutex_unlock(&t->lock);
		memcpy(out + done, t->blocks[t->head] + t->pos, n);
		done += n;
		t->pos += n;
		pthread_mutex_lock(&t->lock);
		if (t->pos == t->len[t->head]) {
			t->pos = 0;
			t->head = (t->head + 1) % THREAD_BLOCKS;
			t->count--;
			pthread_cond_signal(&t->to_decoder);
		}
	}
	pthread_mutex_unlock(&t->lock);
	return done ? (ssize_t)done : t->err;
}

static ssize_t input_read(void *ctx, void *buf, size_t len)
{
	struct input_stream *in = ctx;
	ssize_t n = in->thread ? thread_read(in->thread, buf, len) :
				 decode_read(in, buf, len);

	/* The decoded stream's sha256 on this side: the decoder has more to do. */
	if (n > 0 && in->pts)
		points_hash(in->pts, buf, (size_t)n);
	return n;
}

/* Fill the ring of input buffers, ahead of the decoder, to the end. */
static void *read_thread(void *arg)
{
	struct input_stream *in = arg;
	struct input_thread *t = in->thread;
	unsigned int slot;
	ssize_t n;

	pthread_mutex_lock(&t->lock);
	while (!t->stop && !t->read_done) {
		if (t->buf_count == READ_BUFS) {
			pthread_cond_wait(&t->to_reader, &t->lock);
			continue;
		}
		slot = (t->buf_head + t->buf_count) % READ_BUFS;
		pthread_mutex_unlock(&t->lock);
		n = raw_fill(in, t->bufs[slot]);
		pthread_mutex_lock(&t->lock);
		if (n > 0) {
			t->buf_len[slot] = (size_t)n;
			t->buf_count++;
		} else {
			t->read_err = (int)n;
			t->read_done = true;
		}
		pthread_cond_signal(&t->to_decoder);
	}
	pthread_mutex_unlock(&t->lock);
	return NULL;
}

static void thread_free(struct input_thread *t)
{
	unsigned int i;

	for (i = 0; i < THREAD_BLOCKS; i++)
		free(t->blocks[i]);
	for (i = 0; i < READ_BUFS; i++)
		free(t->bufs[i]);
	pthread_mutex_destroy(&t->lock);
	pthread_cond_destroy(&t->to_reader);
	pthread_cond_destroy(&t->to_decoder);
	pthread_cond_destroy(&t->to_main);
	free(t);
}

/* Every thread that waits stops waiting, and stops. */
static void thread_halt(struct input_thread *t)
{
	pthread_mutex_lock(&t->lock);
	t->stop = true;
	pthread_cond_broadcast(&t->to_reader);
	pthread_cond_broadcast(&t->to_decoder);
	pthread_cond_broadcast(&t->to_main);
	pthread_mutex_unlock(&t->lock);
}

static void thread_stop(struct input_stream *in)
{
	struct input_thread *t = in->thread;

	thread_halt(t);
	/* The decoder first: it may be reading one of the reader's buffers. */
	pthread_join(t->tid, NULL);
	if (t->reading)
		pthread_join(t->reader, NULL);
	thread_free(t);
	in->thread = NULL;
}

static int thread_start(struct input_stream *in)
{
	struct input_thread *t = calloc(1, sizeof(*t));
	/* Nothing more to read after input_start's first buffer: no reader. */
	bool reader = in->raw.read && !in->eof;
	unsigned int i;
	int ret = 0;

	if (!t)
		return -ENOMEM;
	pthread_mutex_init(&t->lock, NULL);
	pthread_cond_init(&t->to_reader, NULL);
	pthread_cond_init(&t->to_decoder, NULL);
	pthread_cond_init(&t->to_main, NULL);
	for (i = 0; i < THREAD_BLOCKS; i++)
		if (!(t->blocks[i] = malloc(THREAD_BLOCK)))
			ret = -ENOMEM;
	for (i = 0; reader && i < READ_BUFS; i++)
		if (!(t->bufs[i] = malloc(INPUT_BUF_SIZE)))
			ret = -ENOMEM;
	if (ret) {
		thread_free(t);
		return ret;
	}
	in->thread = t;
	if (reader) {
		ret = -pthread_create(&t->reader, NULL, read_thread, in);
		t->reading = !ret;
	}
	if (!ret) {
		ret = -pthread_create(&t->tid, NULL, decode_thread, in);
		if (!ret)
			return 0;
	}
	if (t->reading) {
		thread_halt(t);
		pthread_join(t->reader, NULL);
	}
	in->thread = NULL;
	thread_free(t);
	return ret;
}

static int input_init_decoder(struct input_stream *in)
{
	static const uint8_t gzip_magic[] = { 0x1f, 0x8b };
	static const uint8_t zstd_magic[] = { 0x28, 0xb5, 0x2f, 0xfd };
	static const uint8_t xz_magic[] = { 0xfd, '7', 'z', 'X', 'Z', 0x00 };
	/* A zstd stream may start with a skippable frame (0x184d2a5?). */
	bool zstd_skippable = in->avail >= 4 && (in->next[0] & 0xf0) == 0x50 &&
			      !memcmp(in->next + 1, "\x2a\x4d\x18", 3);

#define HAS_MAGIC(m) (in->avail >= sizeof(m) && !memcmp(in->next, m, sizeof(m)))
	if (HAS_MAGIC(gzip_magic)) {
		in->kind = INPUT_GZIP;
		return gzip_init(in);
	} else if (HAS_MAGIC(zstd_magic) || zstd_skippable) {
		in->kind = INPUT_ZSTD;
		/* Default window limit (128 MiB) bounds memory on hostile input. */
		in->zd = ZSTD_createDStream();
		if (!in->zd)
			return -ENOMEM;
	} else if (HAS_MAGIC(xz_magic)) {
		in->kind = INPUT_XZ;
		if (lzma_stream_decoder(&in->lz, INPUT_XZ_MEMLIMIT,
					LZMA_CONCATENATED) != LZMA_OK)
			return -ENOMEM;
	} else {
		in->kind = INPUT_PLAIN;
	}
#undef HAS_MAGIC
	return 0;
}

static struct input_stream *input_alloc(const char *name)
{
	struct input_stream *in = calloc(1, sizeof(*in));

	if (!in)
		return NULL;
	in->fd = -1;
	in->lz = (lzma_stream)LZMA_STREAM_INIT;
	in->name = strdup(name);
	if (!in->name) {
		free(in);
		return NULL;
	}
	return in;
}

int input_open(const char *path, struct input_stream **out)
{
	return input_open_verified(path, NULL, path, out);
}

static ssize_t fd_read(void *ctx, void *buf, size_t len)
{
	const struct input_stream *in = ctx;
	ssize_t n;

	do
		n = read(in->fd, buf, len);
	while (n < 0 && errno == EINTR);
	if (n < 0) {
		n = -errno;
		ferry_err("%s: read: %s", in->name, strerror(errno));
	}
	return n;
}

/* Buffer, hash and sniff the first bytes of @in->raw; pick the decoder. */
static int input_start(struct input_stream *in, const uint8_t *sha256)
{
	int ret;

	if (sha256) {
		ret = sha256_hasher_new(&in->hasher);
		if (ret)
			return ret;
		memcpy(in->expect, sha256, sizeof(in->expect));
	}
	in->buf = malloc(INPUT_BUF_SIZE);
	if (!in->buf)
		return -ENOMEM;
	in->next = in->buf;
	/*
	 * Pipes may return less than the longest magic (6 bytes) at first;
	 * the whole first buffer, so that a registry's stream is cut into
	 * the same buffers as a file (what `ferry index` finds depends on it).
	 */
	while (in->avail < INPUT_BUF_SIZE && !in->eof) {
		ssize_t n = raw_read(in, in->buf + in->avail,
				     INPUT_BUF_SIZE - in->avail);

		if (n < 0)
			return (int)n;
		in->bytes_read += (uint64_t)n;
		in->avail += (size_t)n;
		in->eof = n == 0;
	}
	return input_init_decoder(in);
}

int input_open_verified(const char *path, const uint8_t *sha256,
			const char *name, struct input_stream **out)
{
	struct input_stream *in = input_alloc(name);
	int ret;

	if (!in)
		return -ENOMEM;
	in->fd = open(path, O_RDONLY | O_CLOEXEC);
	if (in->fd < 0) {
		ret = -errno;
		ferry_err("%s: open: %s", path, strerror(-ret));
		goto fail;
	}
	posix_fadvise(in->fd, 0, 0, POSIX_FADV_SEQUENTIAL);
	in->raw = (struct byte_source){ .read = fd_read, .ctx = in };
	ret = input_start(in, sha256);
	if (ret)
		goto fail;
	*out = in;
	return 0;
fail:
	input_close(in);
	return ret;
}

int input_open_source(struct byte_source raw, const uint8_t *sha256,
		      const char *name, struct input_stream **out)
{
	struct input_stream *in = input_alloc(name);
	int ret;

	if (!in)
		return -ENOMEM;
	in->raw = raw;
	ret = input_start(in, sha256);
	if (ret) {
		input_close(in);
		return ret;
	}
	*out = in;
	return 0;
}

int input_open_mem(const void *buf, size_t len, struct input_stream **out)
{
	struct input_stream *in = input_alloc("<memory>");
	int ret;

	if (!in)
		return -ENOMEM;
	in->next = buf;
	in->avail = len;
	in->bytes_read = len;
	in->eof = true;
	ret = input_init_decoder(in);
	if (ret) {
		input_close(in);
		return ret;
	}
	*out = in;
	return 0;
}

int input_record_points(struct input_stream *in, struct input_points *p)
{
	int ret;

	switch (in->kind) {
	case INPUT_XZ:
		ferry_err("%s: an xz layer has no places to resume decoding at: convert the image instead (ferry convert)",
			  in->name);
		return -ENOTSUP;
	case INPUT_PLAIN:
		return 0; /* read where it is: no points */
	default:
		in->pts = p;
		ret = points_here(p, 0, in->kind == INPUT_GZIP ? BLOB_POINT_HEADER : 0);
		return ret ? ret : thread_start(in);
	}
}

struct byte_source input_source(struct input_stream *in)
{
	return (struct byte_source){ .read = input_read, .ctx = in };
}

const char *input_format(const struct input_stream *in)
{
	return kind_names[in->kind];
}

uint64_t input_bytes_in(const struct input_stream *in)
{
	uint64_t n;

	if (!in->thread)
		return consumed(in);
	/* What the decoder thread has published (its blocks' worth). */
	pthread_mutex_lock(&in->thread->lock);
	n = in->thread->bytes_in;
	pthread_mutex_unlock(&in->thread->lock);
	return n;
}

void input_close(struct input_stream *in)
{
	if (!in)
		return;
	if (in->thread)
		thread_stop(in);
	sha256_hasher_free(in->hasher);
	switch (in->kind) {
	case INPUT_GZIP:
#ifdef FERRY_HAVE_ISAL
		free(in->isal);
#endif
		inflateEnd(&in->z); /* a no-op when zlib was not set up */
		break;
	case INPUT_ZSTD:
		ZSTD_freeDStream(in->zd);
		break;
	case INPUT_XZ:
		lzma_end(&in->lz);
		break;
	default:
		break;
	}
	if (in->fd >= 0)
		close(in->fd);
	free(in->buf);
	free(in->name);
	free(in);
}
