// SPDX-License-Identifier: MIT
/*
 * Codecs of frames (format.c). Every frame is compressed on its own so
 * any chunk can be read without the other frames:
 *
 *   lz4   raw LZ4 block (not the LZ4 frame format); level 0 is
 *         LZ4_compress_default's algorithm, levels 1..12 are LZ4 HC.
 *   zstd  one zstd frame (ZSTD_compress2, with the content size in its
 *         header). Levels 1..22 are the library's; level 0, the default,
 *         is level 5 (greedy) with a 4-byte minimum match and 16 match
 *         attempts per position (see ZSTD_DEFAULT_* below).
 *   lzma  one .xz stream, one block, LZMA2, check type NONE; level 0
 *         means xz's default preset 6. The .xz container costs ~60 bytes
 *         per frame (stream header/footer, block header, index), all of
 *         it CRC32-protected so a damaged header is detected before
 *         decoding; the payload integrity check is left out because the
 *         chunks' sha256 already cover the decoded bytes. A raw LZMA2
 *         stream would save those bytes but carries no framing to
 *         validate and cannot be inspected with xz(1).
 *   none  the bytes themselves.
 *
 * A compressor is given room for len - 1 output bytes only: output that
 * is not strictly smaller than the input is useless, and the library
 * stops as soon as it would overflow, so incompressible frames cost
 * little and are stored raw.
 */
#include "internal.h"
#include "../pkg-base/base.h"

#include <limits.h>
#include <lz4.h>
#include <lz4hc.h>
#include <lzma.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <zstd.h>
#include <zstd_errors.h>

#define LZ4_LEVEL_MAX LZ4HC_CLEVEL_MAX /* 12 */
#define LZMA_LEVEL_MAX 9
#define LZMA_LEVEL_DEFAULT 6

/*
 * The default zstd parameters. Measured with ferry's frames (1 MiB
 * chunks, files under 128 KiB batched into 512 KiB frames at the time) on
 * the "big" Debian layer (minbase + python3, perl, gcc; 142.5 MB tar.gz,
 * 384 MB of unique file data, 43% of it ELF code): blob bytes / tar.gz
 * bytes, and the CPU seconds of `ferry convert --jobs 1` (1.7 s with no
 * codec, zlib inflating):
 *
 *   level 3 (ZSTD_CLEVEL_DEFAULT, dfast)           0.974  3.2 s
 *   level 4 (dfast)                                0.967  3.9 s
 *   level 5 (greedy, minMatch 5, searchLog 3)      0.944  4.2 s
 *   level 5, minMatch 4, searchLog 4               0.935  4.3 s  <-
 *   level 5, minMatch 4, searchLog 5               0.931  4.7 s
 *   level 6 (lazy)                                 0.927  5.1 s
 *   level 6, minMatch 4                            0.916  5.7 s
 *
 * (Parameters of frames over 256 KiB; zstd picks smaller tables for
 * smaller frames, and the two settings below override them too.) Machine
 * code is full of 4-byte matches that zstd's default minimum of 5 for
 * these levels skips, and 16 attempts instead of 8 find the longer ones
 * at little cost. Re-measured with today's frames (256 KiB / 1 MiB,
 * writer.c) in OCI layouts, minbase and big: this choice 0.882 and 0.926
 * of the tar.gz; level 3 with minMatch 4 0.912 and 0.957 at ~55% of the
 * compression CPU; level 5 for batch frames and level 3 for the big
 * chunks' frames 0.896 and 0.946 at ~75%. Neither reaches 0.90 on big,
 * and the cheaper ones give up the size that inflating with ISA-L paid
 * for; docs/performance-log.md has the conversion times. Decoding this
 * output is ~10% slower than level 3's (~1.1 GB/s per core), negligible
 * next to fetching.
 */
#define ZSTD_DEFAULT_LEVEL 5
#define ZSTD_DEFAULT_MIN_MATCH 4
#define ZSTD_DEFAULT_SEARCH_LOG 4

static const char *const codec_names[] = {
	[BLOB_CODEC_NONE] = "none",
	[BLOB_CODEC_LZ4] = "lz4",
	[BLOB_CODEC_ZSTD] = "zstd",
	[BLOB_CODEC_LZMA] = "lzma",
	[BLOB_CODEC_GZIP_STREAM] = "gzip-stream",
	[BLOB_CODEC_ZSTD_STREAM] = "zstd-stream",
};

const char *blob_codec_name(enum blob_codec codec)
{
	if ((unsigned int)codec < ARRAY_SIZE(codec_names))
		return codec_names[codec];
	return "unknown";
}

static int codec_level_max(enum blob_codec codec)
{
	switch (codec) {
	case BLOB_CODEC_LZ4:
		return LZ4_LEVEL_MAX;
	case BLOB_CODEC_ZSTD:
		return ZSTD_maxCLevel();
	case BLOB_CODEC_LZMA:
		return LZMA_LEVEL_MAX;
	default:
		return 0;
	}
}

/*
 * The hot run (writer.c) is a few MB that every cold start fetches first,
 * so it gets the codec's densest practical level, at a cost paid once at
 * conversion. A recorded Python startup list on "big" (17.8 MB in 1 MiB
 * frames, zstd CLI): level 5 (the default) 7.22 MB, 9 7.04, 15 7.00, 17
 * 6.55, 18 6.19 (-14%; 3.6 s of CPU against 0.27), 19 6.18 (5.2 s);
 * lzma 6 5.69 MB, but it decodes ~10x slower than zstd on the reader's
 * critical path, so only the level of the chosen codec changes. `ferry
 * convert` of big with that list: 2.0 -> 3.4 s, peak RSS 53 -> 75 MB (the
 * workers' level-18 contexts); without a list nothing changes. lz4 HC 12
 * is lz4's densest; lzma stays as chosen (its 9 takes ~670 MB to encode).
 */
#define ZSTD_HOT_LEVEL 18

struct blob_compress blob_compress_hot(const struct blob_compress *c)
{
	struct blob_compress hot = *c;

	if (c->codec == BLOB_CODEC_ZSTD && c->level < ZSTD_HOT_LEVEL)
		hot.level = ZSTD_HOT_LEVEL;
	else if (c->codec == BLOB_CODEC_LZ4)
		hot.level = LZ4_LEVEL_MAX;
	return hot;
}

bool blob_compress_valid(const struct blob_compress *c)
{
	return (unsigned int)c->codec <= BLOB_CODEC_LZMA && c->level >= 0 &&
	       c->level <= codec_level_max(c->codec);
}

/* Strict decimal 1..@max: no sign, spaces or trailing junk. */
static bool parse_level(const char *s, int max, int *out)
{
	int v = 0;

	if (!*s)
		return false;
	for (; *s; s++) {
		if (*s < '0' || *s > '9')
			return false;
		v = v * 10 + (*s - '0');
		if (v > max)
			return false;
	}
	if (v < 1)
		return false;
	*out = v;
	return true;
}

/*
 * Level 0 in struct blob_compress means "codec default", so the explicit
 * levels start at 1 for every codec (xz's preset 0 is not selectable).
 */
int blob_compress_parse(const char *spec, struct blob_compress *out)
{
	enum blob_codec codec;

	for (codec = BLOB_CODEC_NONE; codec <= BLOB_CODEC_LZMA; codec++) {
		size_t n = strlen(codec_names[codec]);
		int level = 0;

		if (strncmp(spec, codec_names[codec], n))
			continue;
		if (spec[n] && (spec[n] != ':' || codec == BLOB_CODEC_NONE ||
				!parse_level(spec + n + 1,
					     codec_level_max(codec), &level)))
			continue;
		*out = (struct blob_compress){ .codec = codec, .level = level };
		return 0;
	}
	ferry_err("invalid compression '%s': expected none, lz4, lz4:1..%d, zstd, zstd:1..%d, lzma or lzma:1..%d",
		  spec, LZ4_LEVEL_MAX, ZSTD_maxCLevel(), LZMA_LEVEL_MAX);
	return -EINVAL;
}

/*
 * blob_compress keeps compressed output only when it is smaller than the
 * input and otherwise copies the input, so its output never exceeds the
 * input length.
 */
size_t blob_compress_bound(size_t len)
{
	return len;
}

void blob_codec_ctx_release(struct blob_codec_ctx *ctx)
{
	ZSTD_freeCCtx(ctx->zstd_c);
	ZSTD_freeDCtx(ctx->zstd_d);
	free(ctx->lz4_state);
	free(ctx->lz4hc_state);
	free(ctx->frame_buf);
	*ctx = (struct blob_codec_ctx){ 0 };
}

int blob_buf_reserve(uint8_t **buf, size_t *cap, size_t len)
{
	if (*cap >= len)
		return 0;
	free(*buf);
	*buf = malloc(len);
	*cap = *buf ? len : 0;
	return *buf ? 0 : -ENOMEM;
}

/*
 * Aligned to 2 MiB and a multiple of it, a buffer gets transparent huge
 * pages where the kernel gives them on request (THP "madvise", Debian's
 * default): one page fault per 2 MiB instead of 512. A fresh 2 MiB
 * buffer's 4 KiB faults cost 5.5 ms on the project's PVM guest, its huge
 * page's 0.1 ms (the 4 KiB faults: 0.7 ms on the Firecracker guest).
 * Only from 2 MiB up: a 1 MiB frame in a huge page holds 2 MiB, which put
 * ferryd's peak over its goal (performance-log.md, "ferryd memory").
 */
#define BUF_HUGE (2u << 20)
#define BUF_HUGE_MIN (2u << 20)

int blob_buf_reserve_fresh(uint8_t **buf, size_t *cap, size_t len)
{
	void *p = NULL;

	if (*cap >= len)
		return 0;
	if (len < BUF_HUGE_MIN)
		return blob_buf_reserve(buf, cap, len);
	free(*buf);
	*buf = NULL;
	*cap = 0;
	if (len > SIZE_MAX - BUF_HUGE)
		return -ENOMEM;
	len = (len + BUF_HUGE - 1) & ~(size_t)(BUF_HUGE - 1);
	if (posix_memalign(&p, BUF_HUGE, len))
		return -ENOMEM;
	madvise(p, len, MADV_HUGEPAGE); /* a hint: refused is fine */
	*buf = p;
	*cap = len;
	return 0;
}

static pthread_key_t thread_ctx_key;
static pthread_once_t thread_ctx_once = PTHREAD_ONCE_INIT;
static int thread_ctx_key_err;

static void thread_ctx_destroy(void *p)
{
	blob_codec_ctx_release(p);
	free(p);
}

static void thread_ctx_key_init(void)
{
	thread_ctx_key_err = pthread_key_create(&thread_ctx_key,
						thread_ctx_destroy);
}

struct blob_codec_ctx *blob_codec_ctx_thread(void)
{
	struct blob_codec_ctx *ctx;

	pthread_once(&thread_ctx_once, thread_ctx_key_init);
	if (thread_ctx_key_err)
		return NULL;
	ctx = pthread_getspecific(thread_ctx_key);
	if (ctx)
		return ctx;
	ctx = calloc(1, sizeof(*ctx));
	if (!ctx)
		return NULL;
	if (pthread_setspecific(thread_ctx_key, ctx)) {
		free(ctx);
		return NULL;
	}
	return ctx;
}

static int lz4_compress(struct blob_codec_ctx *ctx, int level,
			const void *src, int len, void *dst, int cap)
{
	if (!level) {
		if (!ctx->lz4_state)
			ctx->lz4_state = malloc((size_t)LZ4_sizeofState());
		if (!ctx->lz4_state)
			return -ENOMEM;
		return LZ4_compress_fast_extState(ctx->lz4_state, src, dst,
						  len, cap, 1);
	}
	if (!ctx->lz4hc_state)
		ctx->lz4hc_state = malloc((size_t)LZ4_sizeofStateHC());
	if (!ctx->lz4hc_state)
		return -ENOMEM;
	return LZ4_compress_HC_extStateHC(ctx->lz4hc_state, src, dst, len, cap,
					  level);
}

/*
 * Parameters of the next frame: the context keeps them across calls and
 * one thread's context may serve several levels, so reset them first
 * (with the session: resetting parameters alone is refused after a
 * frame that stopped for lack of output space).
 */
static size_t zstd_set_params(ZSTD_CCtx *z, int level)
{
	size_t r = ZSTD_CCtx_reset(z, ZSTD_reset_session_and_parameters);

	if (!ZSTD_isError(r))
		r = ZSTD_CCtx_setParameter(z, ZSTD_c_compressionLevel,
					   level ? level : ZSTD_DEFAULT_LEVEL);
	if (!ZSTD_isError(r) && !level)
		r = ZSTD_CCtx_setParameter(z, ZSTD_c_minMatch,
					   ZSTD_DEFAULT_MIN_MATCH);
	if (!ZSTD_isError(r) && !level)
		r = ZSTD_CCtx_setParameter(z, ZSTD_c_searchLog,
					   ZSTD_DEFAULT_SEARCH_LOG);
	return r;
}

/* 0 when @dst got *@out_len (< @len) bytes, 1 when it did not fit. */
static int zstd_compress(struct blob_codec_ctx *ctx, int level,
			 const void *src, size_t len, void *dst, size_t cap,
			 size_t *out_len)
{
	size_t r;

	if (!ctx->zstd_c)
		ctx->zstd_c = ZSTD_createCCtx();
	if (!ctx->zstd_c)
		return -ENOMEM;
	r = zstd_set_params(ctx->zstd_c, level);
	if (!ZSTD_isError(r))
		r = ZSTD_compress2(ctx->zstd_c, dst, cap, src, len);
	if (!ZSTD_isError(r)) {
		*out_len = r;
		return 0;
	}
	if (ZSTD_getErrorCode(r) == ZSTD_error_dstSize_tooSmall)
		return 1;
	if (ZSTD_getErrorCode(r) == ZSTD_error_memory_allocation)
		return -ENOMEM;
	ferry_err("zstd: %s", ZSTD_getErrorName(r));
	return -EINVAL;
}

static int lzma_compress(int level, const void *src, size_t len, void *dst,
			 size_t cap, size_t *out_len)
{
	lzma_options_lzma opt;
	lzma_filter filters[2];
	lzma_ret ret;

	if (lzma_lzma_preset(&opt, (uint32_t)(level ? level :
					     LZMA_LEVEL_DEFAULT)))
		return -EINVAL;
	/*
	 * A frame cannot refer back further than its own length: a larger
	 * dictionary only costs encoder memory (~10x the dictionary) and
	 * decoder memory (the dictionary size is in the block header).
	 */
	opt.dict_size = (uint32_t)MIN((size_t)opt.dict_size,
				      MAX(len, (size_t)LZMA_DICT_SIZE_MIN));
	filters[0] = (lzma_filter){ .id = LZMA_FILTER_LZMA2, .options = &opt };
	filters[1] = (lzma_filter){ .id = LZMA_VLI_UNKNOWN };
	*out_len = 0;
	ret = lzma_stream_buffer_encode(filters, LZMA_CHECK_NONE, NULL, src,
					len, dst, out_len, cap);
	switch (ret) {
	case LZMA_OK:
		return 0;
	case LZMA_BUF_ERROR:
		return 1;
	case LZMA_MEM_ERROR:
		return -ENOMEM;
	default:
		ferry_err("xz: encoder error %d", (int)ret);
		return -EINVAL;
	}
}

int blob_codec_compress(struct blob_codec_ctx *ctx,
			const struct blob_compress *c, const void *src,
			size_t len, void *dst, size_t *dst_len,
			enum blob_codec *codec_used)
{
	size_t cap = len ? len - 1 : 0, n = 0;
	int ret = 1;

	if (len > BLOB_FRAME_MAX || !blob_compress_valid(c))
		return -EINVAL;
	*codec_used = BLOB_CODEC_NONE;
	*dst_len = 0;
	if (!cap)
		return 0;
	switch (c->codec) {
	case BLOB_CODEC_NONE:
		return 0;
	case BLOB_CODEC_LZ4:
		ret = lz4_compress(ctx, c->level, src, (int)len, dst, (int)cap);
		if (ret < 0)
			return ret;
		n = (size_t)ret;
		ret = ret ? 0 : 1; /* LZ4 returns 0 when the output did not fit */
		break;
	case BLOB_CODEC_ZSTD:
		ret = zstd_compress(ctx, c->level, src, len, dst, cap, &n);
		break;
	case BLOB_CODEC_LZMA:
		ret = lzma_compress(c->level, src, len, dst, cap, &n);
		break;
	case BLOB_CODEC_GZIP_STREAM:
	case BLOB_CODEC_ZSTD_STREAM:
		return -EINVAL; /* refused by blob_compress_valid */
	}
	if (ret < 0)
		return ret;
	if (ret == 0) {
		*codec_used = c->codec;
		*dst_len = n;
	}
	return 0;
}

int blob_compress(const struct blob_compress *c, const void *src, size_t len,
		  void *dst, size_t dst_cap, size_t *dst_len,
		  enum blob_codec *codec_used)
{
	struct blob_codec_ctx *ctx = blob_codec_ctx_thread();
	int ret;

	if (!ctx)
		return -ENOMEM;
	if (dst_cap < blob_compress_bound(len))
		return -EINVAL;
	ret = blob_codec_compress(ctx, c, src, len, dst, dst_len, codec_used);
	if (ret || *codec_used != BLOB_CODEC_NONE)
		return ret;
	memcpy(dst, src, len);
	*dst_len = len;
	return 0;
}

static const char *lzma_ret_text(lzma_ret ret)
{
	switch (ret) {
	case LZMA_FORMAT_ERROR:
		return "not an .xz stream";
	case LZMA_OPTIONS_ERROR:
		return "unsupported options";
	case LZMA_DATA_ERROR:
		return "corrupt data";
	case LZMA_BUF_ERROR:
		return "truncated input or more output than expected";
	case LZMA_MEMLIMIT_ERROR:
		return "dictionary larger than the frame allows";
	default:
		return "decoder error";
	}
}

static int zstd_decompress(struct blob_codec_ctx *ctx, const void *src,
			   size_t src_len, void *dst, size_t dst_len,
			   size_t *out, char *why)
{
	size_t r;

	if (!ctx->zstd_d)
		ctx->zstd_d = ZSTD_createDCtx();
	if (!ctx->zstd_d)
		return -ENOMEM;
	r = ZSTD_decompressDCtx(ctx->zstd_d, dst, dst_len, src, src_len);
	if (!ZSTD_isError(r)) {
		*out = r;
		return 0;
	}
	if (ZSTD_getErrorCode(r) == ZSTD_error_memory_allocation)
		return -ENOMEM;
	snprintf(why, BLOB_WHY_MAX, "zstd: %s", ZSTD_getErrorName(r));
	return -EFSCORRUPTED;
}

/*
 * The LZMA2 dictionary is bounded by the frame length (see lzma_compress)
 * and rounds up to at most 1.5x, so a block header asking for more is
 * corrupt rather than a reason to allocate it.
 */
static int lzma_decompress(const void *src, size_t src_len, void *dst,
			   size_t dst_len, size_t *out, char *why)
{
	uint64_t memlimit = (uint64_t)dst_len * 2 + (1u << 20);
	size_t in_pos = 0;
	lzma_ret ret;

	*out = 0;
	ret = lzma_stream_buffer_decode(&memlimit, 0, NULL, src, &in_pos,
					src_len, dst, out, dst_len);
	if (ret == LZMA_MEM_ERROR)
		return -ENOMEM;
	if (ret != LZMA_OK) {
		snprintf(why, BLOB_WHY_MAX, "xz: %s", lzma_ret_text(ret));
		return -EFSCORRUPTED;
	}
	if (in_pos != src_len) {
		snprintf(why, BLOB_WHY_MAX,
			 "xz: %zu trailing bytes after the stream",
			 src_len - in_pos);
		return -EFSCORRUPTED;
	}
	return 0;
}

int blob_codec_decompress(struct blob_codec_ctx *ctx, enum blob_codec codec,
			  const void *src, size_t src_len, void *dst,
			  size_t dst_len, char *why)
{
	size_t n = 0;
	int ret = 0;

	if (src_len > INT_MAX || dst_len > BLOB_FRAME_MAX) {
		snprintf(why, BLOB_WHY_MAX, "sizes out of range");
		return -EFSCORRUPTED;
	}
	switch (codec) {
	case BLOB_CODEC_NONE:
		if (src_len == dst_len)
			memcpy(dst, src, dst_len);
		n = src_len;
		break;
	case BLOB_CODEC_LZ4:
		ret = LZ4_decompress_safe(src, dst, (int)src_len, (int)dst_len);
		if (ret < 0) {
			snprintf(why, BLOB_WHY_MAX, "lz4: malformed block");
			return -EFSCORRUPTED;
		}
		n = (size_t)ret;
		ret = 0;
		break;
	case BLOB_CODEC_ZSTD:
		ret = zstd_decompress(ctx, src, src_len, dst, dst_len, &n, why);
		break;
	case BLOB_CODEC_LZMA:
		ret = lzma_decompress(src, src_len, dst, dst_len, &n, why);
		break;
	default:
		snprintf(why, BLOB_WHY_MAX, "unknown codec %d", (int)codec);
		return -EFSCORRUPTED;
	}
	if (ret)
		return ret;
	if (n != dst_len) {
		snprintf(why, BLOB_WHY_MAX, "%s: %zu bytes where %zu expected",
			 blob_codec_name(codec), n, dst_len);
		return -EFSCORRUPTED;
	}
	return 0;
}

int blob_decompress(enum blob_codec codec, const void *src, size_t src_len,
		    void *dst, size_t dst_len)
{
	struct blob_codec_ctx *ctx = blob_codec_ctx_thread();
	char why[BLOB_WHY_MAX];

	if (!ctx)
		return -ENOMEM;
	return blob_codec_decompress(ctx, codec, src, src_len, dst, dst_len,
				     why);
}
