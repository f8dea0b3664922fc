// SPDX-License-Identifier: MIT
/*
 * Chunk cache tests: ensure (ranges, frames, merged reads, the run size
 * bound), corrupt sources, persistence and damaged maps, threads and
 * processes filling one blob at once (each frame fetched exactly once),
 * processes killed mid-fill, image records, listing and gc. Ends with a
 * few measurements, printed as "#" lines.
 */
#include "../test.h"
#include "../../pkg-base/base.h"
#include "../../pkg-blob/blob.h"
#include "../../pkg-blob/internal.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define KIB 1024u
#define MIB (1024u * 1024u)

static char tmpdir[64];

/* ------------------------------------------------------------------ */
/* Test blobs                                                          */
/* ------------------------------------------------------------------ */

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static uint64_t rng_next(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static uint64_t rng(void)
{
	return rng_next(&rng_state);
}

enum kind { TEXT, RANDOM };

static void fill(uint8_t *p, size_t len, enum kind kind)
{
	static const char *const words[] = {
		"cache ", "chunk ", "frame ", "blob ", "map ", "sparse ",
		"fdatasync ", "verify\n",
	};
	size_t i = 0;

	if (kind == RANDOM) {
		for (; i + 8 <= len; i += 8) {
			uint64_t v = rng();

			memcpy(p + i, &v, 8);
		}
		for (; i < len; i++)
			p[i] = (uint8_t)rng();
		return;
	}
	while (i < len) {
		const char *w = words[rng() % ARRAY_SIZE(words)];
		size_t n = MIN(strlen(w), len - i);

		memcpy(p + i, w, n);
		i += n;
	}
}

struct tblob {
	char path[128];
	uint32_t n;
	uint8_t **data;
	struct blob_info info;
	uint32_t nr_frames;
	uint64_t *frame_coff; /* ascending */
};

static void tblob_free(struct tblob *tb)
{
	uint32_t i;

	for (i = 0; tb->data && i < tb->n; i++)
		free(tb->data[i]);
	free(tb->data);
	free(tb->frame_coff);
	blob_info_free_chunks(&tb->info);
	memset(tb, 0, sizeof(*tb));
}

/*
 * Write blob @name of @n chunks (@lens, @kinds; a NULL @kinds is all
 * TEXT) compressed with @spec; @small/@max override the frame policy
 * (0/0: the default policy).
 */
static int tblob_make(struct tblob *tb, const char *name, const char *spec,
		      uint32_t small, uint32_t max, uint32_t n,
		      const uint32_t *lens, const enum kind *kinds)
{
	struct blob_compress c;
	struct blob_writer *w;
	uint32_t i;
	int fd, ret;

	memset(tb, 0, sizeof(*tb));
	snprintf(tb->path, sizeof(tb->path), "%s/%s", tmpdir, name);
	ret = blob_compress_parse(spec, &c);
	if (ret)
		return ret;
	tb->n = n;
	tb->data = calloc(n, sizeof(*tb->data));
	if (!tb->data)
		return -ENOMEM;
	fd = open(tb->path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd < 0)
		return -errno;
	ret = blob_writer_new(fd, &c, 2, &w);
	if (ret) {
		close(fd);
		return ret;
	}
	if (max)
		ret = blob_writer_set_batching(w, small, max);
	for (i = 0; !ret && i < n; i++) {
		uint8_t sha[BLOB_DIGEST_SIZE];
		uint64_t uoff;

		tb->data[i] = malloc(lens[i]);
		if (!tb->data[i]) {
			ret = -ENOMEM;
			break;
		}
		fill(tb->data[i], lens[i], kinds ? kinds[i] : TEXT);
		sha256_buf(tb->data[i], lens[i], sha);
		ret = blob_writer_add(w, tb->data[i], lens[i], sha, &uoff);
	}
	if (ret) {
		blob_writer_abort(w);
		close(fd);
		return ret;
	}
	ret = blob_writer_finish(w, &tb->info, NULL);
	close(fd);
	if (ret)
		return ret;
	tb->frame_coff = malloc(n * sizeof(*tb->frame_coff));
	if (!tb->frame_coff)
		return -ENOMEM;
	for (i = 0; i < n; i++)
		if (!tb->info.chunks[i].frame_off)
			tb->frame_coff[tb->nr_frames++] = tb->info.chunks[i].coff;
	return 0;
}

#define MUST(call)                                                             \
	do {                                                                   \
		int _ret = (call);                                             \
		CHECK_EQ(_ret, 0);                                             \
		if (_ret)                                                      \
			return;                                                \
	} while (0)

/* Slot range of chunk @i's bytes. */
static uint64_t cuoff(const struct tblob *tb, uint32_t i)
{
	return tb->info.chunks[i].uoff;
}

static uint64_t culen(const struct tblob *tb, uint32_t i)
{
	return tb->info.chunks[i].usize;
}

/* ------------------------------------------------------------------ */
/* A counting source over the blob file                                */
/* ------------------------------------------------------------------ */

struct src {
	int fd;
	const struct tblob *tb;
	unsigned int delay_us;
	uint64_t corrupt_off; /* UINT64_MAX: none */
	uint32_t reads;       /* atomic */
	uint64_t bytes;       /* atomic */
	uint64_t max_len;     /* atomic */
	uint32_t *frame_reads; /* per frame, atomic; may be shared memory */
};

static int src_read(void *ctx, uint64_t off, void *buf, size_t len)
{
	struct src *s = ctx;
	uint64_t prev;
	uint32_t f;
	int ret;

	if (s->delay_us)
		usleep(s->delay_us);
	ret = pread_full(s->fd, buf, len, off);
	if (ret)
		return ret;
	if (s->corrupt_off >= off && s->corrupt_off < off + len)
		((uint8_t *)buf)[s->corrupt_off - off] ^= 0x5a;
	__atomic_fetch_add(&s->reads, 1, __ATOMIC_RELAXED);
	__atomic_fetch_add(&s->bytes, (uint64_t)len, __ATOMIC_RELAXED);
	prev = __atomic_load_n(&s->max_len, __ATOMIC_RELAXED);
	while (len > prev &&
	       !__atomic_compare_exchange_n(&s->max_len, &prev, (uint64_t)len,
					    false, __ATOMIC_RELAXED,
					    __ATOMIC_RELAXED))
		;
	for (f = 0; s->frame_reads && f < s->tb->nr_frames; f++)
		if (s->tb->frame_coff[f] >= off &&
		    s->tb->frame_coff[f] < off + len)
			__atomic_fetch_add(&s->frame_reads[f], 1,
					   __ATOMIC_RELAXED);
	return 0;
}

static int src_open(struct src *s, const struct tblob *tb,
		    struct blob_source *bs)
{
	memset(s, 0, sizeof(*s));
	s->tb = tb;
	s->corrupt_off = UINT64_MAX;
	s->fd = open(tb->path, O_RDONLY);
	bs->read = src_read;
	bs->ctx = s;
	return s->fd < 0 ? -errno : 0;
}

static void src_reset(struct src *s)
{
	s->reads = 0;
	s->bytes = 0;
	s->max_len = 0;
}

/* ------------------------------------------------------------------ */
/* Checks                                                              */
/* ------------------------------------------------------------------ */

/* Chunk @i's bytes in the data file equal the original. */
static bool chunk_ok(const struct blob_cache_blob *b, const struct tblob *tb,
		     uint32_t i)
{
	uint8_t *buf = malloc(culen(tb, i));
	bool ok;

	ok = buf && !pread_full(blob_cache_data_fd(b), buf, culen(tb, i),
				cuoff(tb, i)) &&
	     !memcmp(buf, tb->data[i], culen(tb, i));
	free(buf);
	return ok;
}

static uint32_t nr_present(const struct blob_cache_blob *b,
			   const struct tblob *tb)
{
	uint32_t i, n = 0;

	for (i = 0; i < tb->n; i++)
		n += blob_cache_chunk_present(b, i);
	return n;
}

/*
 * The data file is the blob's address space: each chunk's bytes at its
 * uoff, zeros everywhere else.
 */
static bool data_is_address_space(const struct blob_cache_blob *b,
				  const struct tblob *tb)
{
	uint64_t size = tb->info.uncompressed_size, i, pos = 0;
	uint8_t *buf = malloc(size ? size : 1);
	struct stat st;
	bool ok = false;
	uint32_t k;

	if (!buf || fstat(blob_cache_data_fd(b), &st) ||
	    (uint64_t)st.st_size != size ||
	    pread_full(blob_cache_data_fd(b), buf, size, 0))
		goto out;
	for (k = 0; k <= tb->n; k++) {
		uint64_t next = k < tb->n ? cuoff(tb, k) : size;

		for (i = pos; i < next; i++)
			if (buf[i])
				goto out;
		if (k < tb->n) {
			if (memcmp(buf + next, tb->data[k], culen(tb, k)))
				goto out;
			pos = next + culen(tb, k);
		}
	}
	ok = true;
out:
	free(buf);
	return ok;
}

static const char *cache_path(const char *name)
{
	return test_path(tmpdir, name);
}

/* DIR/blobs/sha256/<hex><suffix> of @tb. */
static char *blob_file(const char *dir, const struct tblob *tb,
		       const char *suffix)
{
	static char p[4][320];
	static int k;
	char hex[2 * BLOB_DIGEST_SIZE + 1], *s = p[k++ % 4];

	hex_encode(tb->info.digest, BLOB_DIGEST_SIZE, hex);
	snprintf(s, sizeof(p[0]), "%s/blobs/sha256/%s%s", dir, hex, suffix);
	return s;
}

static bool exists(const char *path)
{
	struct stat st;

	return !stat(path, &st);
}

/* ------------------------------------------------------------------ */
/* Ranges                                                              */
/* ------------------------------------------------------------------ */

static void test_ensure_ranges(void)
{
	static const uint32_t lens[] = { 5000,   200 * KIB, MIB,      100,
					 70 * KIB, 300 * KIB, 4096,   9000 };
	const char *dir = cache_path("c-ranges");
	struct blob_source bs;
	struct blob_cache_blob *b;
	struct tblob tb;
	struct src s;
	uint64_t fetched = 0, size, bytes;
	uint32_t i, chunks;

	MUST(tblob_make(&tb, "ranges.blob", "zstd", 1, 1, ARRAY_SIZE(lens),
			lens, NULL));
	MUST(src_open(&s, &tb, &bs));
	MUST(blob_cache_open(dir, &tb.info, &b));
	size = tb.info.uncompressed_size;
	CHECK(exists(blob_file(dir, &tb, ".map")));
	CHECK_EQ(nr_present(b, &tb), 0);

	/* One chunk: exactly its frame is read, nothing else appears. */
	CHECK_EQ(blob_cache_ensure(b, cuoff(&tb, 2) + 10, 100, &bs, &fetched),
		 0);
	CHECK_EQ(s.reads, 1);
	CHECK_EQ(fetched, tb.info.chunks[2].csize);
	CHECK(blob_cache_chunk_present(b, 2));
	CHECK_EQ(nr_present(b, &tb), 1);
	CHECK(chunk_ok(b, &tb, 2));

	/* Again: nothing to fetch. */
	CHECK_EQ(blob_cache_ensure(b, cuoff(&tb, 2), culen(&tb, 2), &bs,
				   &fetched), 0);
	CHECK_EQ(s.reads, 1);

	/* Empty ranges anywhere, even at the very end. */
	CHECK_EQ(blob_cache_ensure(b, cuoff(&tb, 5), 0, &bs, NULL), 0);
	CHECK_EQ(blob_cache_ensure(b, size, 0, &bs, NULL), 0);
	/* Padding only: chunk 0 ends at 5000, its slot at 8192. */
	CHECK_EQ(blob_cache_ensure(b, 5000, 8192 - 5000, &bs, NULL), 0);
	CHECK_EQ(s.reads, 1);
	CHECK(!blob_cache_chunk_present(b, 0));
	/* The padding byte before chunk 1 plus chunk 1's first byte. */
	CHECK_EQ(blob_cache_ensure(b, 8191, 2, &bs, NULL), 0);
	CHECK(!blob_cache_chunk_present(b, 0));
	CHECK(blob_cache_chunk_present(b, 1));
	CHECK(chunk_ok(b, &tb, 1));

	/* The last byte of the address space (padding of the last chunk),
	 * and the last chunk's last byte. */
	CHECK_EQ(blob_cache_ensure(b, size - 1, 1, &bs, NULL), 0);
	CHECK(!blob_cache_chunk_present(b, tb.n - 1));
	CHECK_EQ(blob_cache_ensure(b, cuoff(&tb, tb.n - 1) +
					      culen(&tb, tb.n - 1) - 1,
				   1, &bs, NULL), 0);
	CHECK(blob_cache_chunk_present(b, tb.n - 1));
	CHECK(chunk_ok(b, &tb, tb.n - 1));

	/* Outside the address space: -EINVAL, nothing fetched. */
	src_reset(&s);
	CHECK_EQ(blob_cache_ensure(b, size, 1, &bs, NULL), -EINVAL);
	CHECK_EQ(blob_cache_ensure(b, size - 4096, 4097, &bs, NULL), -EINVAL);
	CHECK_EQ(blob_cache_ensure(b, 4096, UINT64_MAX, &bs, NULL), -EINVAL);
	CHECK_EQ(blob_cache_ensure(b, UINT64_MAX, 2, &bs, NULL), -EINVAL);
	CHECK_EQ(s.reads, 0);

	/* Everything; then the file is the blob's address space. */
	CHECK_EQ(blob_cache_ensure(b, 0, size, &bs, NULL), 0);
	CHECK_EQ(nr_present(b, &tb), tb.n);
	for (i = 0; i < tb.n; i++)
		CHECK(chunk_ok(b, &tb, i));
	CHECK(data_is_address_space(b, &tb));
	blob_cache_usage(b, &chunks, &bytes);
	CHECK_EQ(chunks, tb.n);
	{
		uint64_t want = 0;

		for (i = 0; i < tb.n; i++)
			want += culen(&tb, i);
		CHECK_EQ(bytes, want);
	}
	CHECK(!strcmp(blob_cache_data_path(b), blob_file(dir, &tb, ".data")));
	CHECK(!blob_cache_chunk_present(b, tb.n));
	blob_cache_close(b);

	/* A second blob without a digest cannot be cached. */
	{
		struct blob_info bad = tb.info;

		memset(bad.digest, 0, sizeof(bad.digest));
		CHECK_EQ(blob_cache_open(dir, &bad, &b), -EINVAL);
	}
	close(s.fd);
	tblob_free(&tb);
}

/* ------------------------------------------------------------------ */
/* Frames and runs                                                     */
/* ------------------------------------------------------------------ */

static void test_frames_and_runs(void)
{
	const char *dir = cache_path("c-frames");
	uint32_t lens[24], i, n;
	enum kind kinds[24];
	struct blob_source bs;
	struct blob_cache_blob *b;
	struct tblob tb;
	struct src s;

	/* 16 small chunks batched into one frame: one read fills them all. */
	for (i = 0; i < 16; i++)
		lens[i] = 20 * KIB + i * 100;
	MUST(tblob_make(&tb, "batched.blob", "zstd", 0, 0, 16, lens, NULL));
	CHECK_EQ(tb.nr_frames, 1);
	MUST(src_open(&s, &tb, &bs));
	MUST(blob_cache_open(dir, &tb.info, &b));
	CHECK_EQ(blob_cache_ensure(b, cuoff(&tb, 3), culen(&tb, 3), &bs, NULL),
		 0);
	CHECK_EQ(s.reads, 1);
	CHECK_EQ(nr_present(b, &tb), 16);
	for (i = 0; i < 16; i++)
		CHECK(chunk_ok(b, &tb, i));
	CHECK_EQ(blob_cache_ensure(b, 0, tb.info.uncompressed_size, &bs, NULL),
		 0);
	CHECK_EQ(s.reads, 1);
	blob_cache_close(b);
	close(s.fd);
	tblob_free(&tb);

	/* 8 frames of 64 KiB: adjacent missing frames take one read, a
	 * present frame splits the run. */
	for (i = 0; i < 8; i++) {
		lens[i] = 64 * KIB;
		kinds[i] = RANDOM;
	}
	MUST(tblob_make(&tb, "eight.blob", "zstd", 1, 1, 8, lens, kinds));
	CHECK_EQ(tb.nr_frames, 8);
	MUST(src_open(&s, &tb, &bs));
	MUST(blob_cache_open(dir, &tb.info, &b));
	CHECK_EQ(blob_cache_ensure(b, cuoff(&tb, 3), 1, &bs, NULL), 0);
	CHECK_EQ(s.reads, 1);
	src_reset(&s);
	CHECK_EQ(blob_cache_ensure(b, 0, tb.info.uncompressed_size, &bs, NULL),
		 0);
	CHECK_EQ(s.reads, 2); /* frames 0-2 and 4-7 */
	CHECK_EQ(s.bytes, tb.info.table_offset - tb.info.chunks[3].csize);
	for (i = 0; i < 8; i++)
		CHECK(chunk_ok(b, &tb, i));
	blob_cache_close(b);
	close(s.fd);
	tblob_free(&tb);

	/* 24 incompressible 512 KiB frames (12 MiB): reads of at most
	 * BLOB_CACHE_RUN_MAX, so 8 frames each. */
	for (i = 0; i < 24; i++) {
		lens[i] = 512 * KIB;
		kinds[i] = RANDOM;
	}
	MUST(tblob_make(&tb, "runs.blob", "lz4", 1, 1, 24, lens, kinds));
	MUST(src_open(&s, &tb, &bs));
	MUST(blob_cache_open(dir, &tb.info, &b));
	CHECK_EQ(blob_cache_ensure(b, 0, tb.info.uncompressed_size, &bs, NULL),
		 0);
	n = (uint32_t)(BLOB_CACHE_RUN_MAX / (512 * KIB));
	CHECK_EQ(s.reads, DIV_ROUND_UP(24, n));
	CHECK(s.max_len <= BLOB_CACHE_RUN_MAX);
	CHECK_EQ(s.bytes, tb.info.table_offset);
	CHECK_EQ(nr_present(b, &tb), 24);
	CHECK(data_is_address_space(b, &tb));
	blob_cache_close(b);
	close(s.fd);
	tblob_free(&tb);

	/* A frame bigger than the run bound is read alone. */
	lens[0] = MIB;
	lens[1] = 6 * MIB;
	lens[2] = MIB;
	kinds[0] = kinds[1] = kinds[2] = RANDOM;
	MUST(tblob_make(&tb, "big.blob", "zstd", 1, 1, 3, lens, kinds));
	MUST(src_open(&s, &tb, &bs));
	MUST(blob_cache_open(dir, &tb.info, &b));
	CHECK_EQ(blob_cache_ensure(b, 0, tb.info.uncompressed_size, &bs, NULL),
		 0);
	CHECK_EQ(s.reads, 3);
	CHECK_EQ(s.max_len, tb.info.chunks[1].csize);
	CHECK(s.max_len > BLOB_CACHE_RUN_MAX);
	for (i = 0; i < 3; i++)
		CHECK(chunk_ok(b, &tb, i));
	blob_cache_close(b);
	close(s.fd);
	tblob_free(&tb);
}

/* ------------------------------------------------------------------ */
/* Corrupt sources                                                     */
/* ------------------------------------------------------------------ */

/* blob_cache_read_frames' emit: the frames into an address-space image. */
struct sink {
	uint8_t *space;    /* the uncompressed address space, rounded up */
	uint64_t size;
	uint64_t next;     /* frames come in order and tile it */
	uint32_t calls;
	bool bad;
};

static int sink_emit(void *ctx, uint64_t off, const void *buf, size_t len)
{
	struct sink *k = ctx;

	k->calls++;
	if (off % BLOB_SLOT_ALIGN || len % BLOB_SLOT_ALIGN ||
	    (uintptr_t)buf % BLOB_SLOT_ALIGN || off < k->next ||
	    off + len > k->size) {
		k->bad = true;
		return -EINVAL;
	}
	memcpy(k->space + off, buf, len);
	k->next = off + len;
	return 0;
}

static void test_read_frames(void)
{
	static const uint32_t lens[] = { 64 * KIB, 64 * KIB, 64 * KIB,
					 10 * KIB, 12 * KIB, 14 * KIB };
	static const enum kind kinds[] = { TEXT, RANDOM, TEXT,
					   TEXT, TEXT, TEXT };
	const char *dir = cache_path("c-readframes");
	struct blob_source bs;
	struct blob_cache_blob *b;
	struct sink k = { 0 };
	uint64_t fetched = 0;
	struct tblob tb;
	struct src s;
	uint32_t i;

	/* Chunks 0-2 are frames of their own; 3-5 share one. */
	MUST(tblob_make(&tb, "frames.blob", "zstd", 32 * KIB, 64 * KIB,
			ARRAY_SIZE(lens), lens, kinds));
	CHECK_EQ(tb.nr_frames, 4);
	MUST(src_open(&s, &tb, &bs));
	MUST(blob_cache_open(dir, &tb.info, &b));
	k.size = ROUND_UP(tb.info.uncompressed_size, BLOB_SLOT_ALIGN);
	k.space = calloc(1, k.size);
	MUST(k.space ? 0 : -ENOMEM);

	/* One byte of chunk 4: the whole frame of 3-5, fetched, not cached. */
	CHECK_EQ(blob_cache_read_frames(b, cuoff(&tb, 4) + 5, 1, &bs, &fetched,
					sink_emit, &k), 0);
	CHECK_EQ(k.calls, 1);
	CHECK_EQ(s.reads, 1);
	CHECK_EQ(fetched, tb.info.chunks[3].csize);
	for (i = 3; i < 6; i++)
		CHECK(!memcmp(k.space + cuoff(&tb, i), tb.data[i], culen(&tb, i)));
	CHECK_EQ(nr_present(b, &tb), 0);

	/* Chunks 0 and 2 present (ensure), 1 missing: 0 from the data file,
	 * 1 fetched, 2 from the data file again; in order, tiling. */
	MUST(blob_cache_ensure(b, cuoff(&tb, 0), 1, &bs, NULL));
	MUST(blob_cache_ensure(b, cuoff(&tb, 2), 1, &bs, NULL));
	src_reset(&s);
	memset(k.space, 0, k.size);
	k.next = 0;
	k.calls = 0;
	CHECK_EQ(blob_cache_read_frames(b, 0, tb.info.uncompressed_size, &bs, NULL,
					sink_emit, &k), 0);
	CHECK(!k.bad);
	CHECK_EQ(s.reads, 2); /* chunk 1, then the frame of 3-5 */
	for (i = 0; i < tb.n; i++)
		CHECK(!memcmp(k.space + cuoff(&tb, i), tb.data[i], culen(&tb, i)));
	CHECK_EQ(nr_present(b, &tb), 2);

	/* A corrupt stored frame: -EIO, never its bytes; the range check. */
	s.corrupt_off = tb.info.chunks[1].coff + 1000;
	k.next = 0;
	CHECK_EQ(blob_cache_read_frames(b, cuoff(&tb, 1), 1, &bs, NULL,
					sink_emit, &k), -EIO);
	CHECK_EQ(blob_cache_read_frames(b, tb.info.uncompressed_size, 1, &bs, NULL,
					sink_emit, &k), -EINVAL);
	CHECK(!k.bad);
	free(k.space);
	blob_cache_close(b);
	close(s.fd);
	tblob_free(&tb);
}

static int failing_read(void *ctx, uint64_t off, void *buf, size_t len)
{
	return -ECONNRESET;
}

static void test_corrupt_source(void)
{
	static const uint32_t lens[] = { 64 * KIB, 64 * KIB, 64 * KIB,
					 10 * KIB, 12 * KIB, 14 * KIB };
	static const enum kind kinds[] = { TEXT, RANDOM, TEXT,
					   TEXT, TEXT, TEXT };
	const char *dir = cache_path("c-corrupt");
	struct blob_source bs, fail = { .read = failing_read };
	struct blob_cache_blob *b;
	struct tblob tb;
	struct src s;
	uint32_t i, n;

	/* Chunks 0-2 are frames of their own; 3-5 share one. */
	MUST(tblob_make(&tb, "corrupt.blob", "zstd", 32 * KIB, 64 * KIB,
			ARRAY_SIZE(lens), lens, kinds));
	CHECK_EQ(tb.nr_frames, 4);
	CHECK_EQ(tb.info.chunks[1].codec, BLOB_CODEC_NONE);
	MUST(src_open(&s, &tb, &bs));
	MUST(blob_cache_open(dir, &tb.info, &b));

	/* A source error: nothing becomes present. */
	CHECK_EQ(blob_cache_ensure(b, 0, tb.info.uncompressed_size, &fail,
				   NULL), -ECONNRESET);
	CHECK_EQ(nr_present(b, &tb), 0);

	/* A stored (codec none) frame with a flipped byte: its chunk fails,
	 * the other frames of the same read complete. */
	s.corrupt_off = tb.info.chunks[1].coff + 1000;
	CHECK_EQ(blob_cache_ensure(b, 0, cuoff(&tb, 3), &bs, NULL), -EIO);
	CHECK_EQ(s.reads, 1);
	CHECK(blob_cache_chunk_present(b, 0));
	CHECK(!blob_cache_chunk_present(b, 1));
	CHECK(blob_cache_chunk_present(b, 2));

	/* A zstd frame whose magic is broken does not decode. */
	s.corrupt_off = tb.info.chunks[3].coff;
	CHECK_EQ(blob_cache_ensure(b, cuoff(&tb, 4), 1, &bs, NULL), -EIO);
	CHECK(!blob_cache_chunk_present(b, 3));
	CHECK(!blob_cache_chunk_present(b, 4));
	CHECK(!blob_cache_chunk_present(b, 5));

	/* Broken further in, it decodes to wrong bytes from some point:
	 * chunk 4 fails, chunks of the frame that verify are kept. */
	s.corrupt_off = tb.info.chunks[3].coff + tb.info.chunks[3].csize / 2;
	CHECK_EQ(blob_cache_ensure(b, cuoff(&tb, 4), 1, &bs, NULL), -EIO);
	CHECK(!blob_cache_chunk_present(b, 4));
	for (i = 3; i < 6; i++)
		CHECK(!blob_cache_chunk_present(b, i) || chunk_ok(b, &tb, i));
	n = nr_present(b, &tb);

	/* After a reopen the bad chunks are still missing. */
	blob_cache_close(b);
	MUST(blob_cache_open(dir, &tb.info, &b));
	CHECK_EQ(nr_present(b, &tb), n);
	CHECK(!blob_cache_chunk_present(b, 1));
	CHECK(!blob_cache_chunk_present(b, 4));

	/* A good source fills them. */
	s.corrupt_off = UINT64_MAX;
	src_reset(&s);
	CHECK_EQ(blob_cache_ensure(b, 0, tb.info.uncompressed_size, &bs, NULL),
		 0);
	CHECK_EQ(s.reads, 2); /* frame 1, then the batch frame */
	for (i = 0; i < tb.n; i++)
		CHECK(chunk_ok(b, &tb, i));
	blob_cache_close(b);
	close(s.fd);
	tblob_free(&tb);
}

/* ------------------------------------------------------------------ */
/* Persistence and damaged maps                                        */
/* ------------------------------------------------------------------ */

static int poke(const char *path, uint64_t off, uint8_t xor)
{
	uint8_t c;
	int fd = open(path, O_RDWR), ret;

	if (fd < 0)
		return -errno;
	ret = pread_full(fd, &c, 1, off);
	c ^= xor;
	if (!ret)
		ret = pwrite_full(fd, &c, 1, off);
	close(fd);
	return ret;
}

static void test_persistence(void)
{
	uint32_t lens[12], i;
	const char *dir = cache_path("c-persist");
	struct blob_source bs;
	struct blob_cache_blob *b, *b2;
	struct tblob tb;
	struct src s;
	struct stat st;
	char *map;

	for (i = 0; i < 12; i++)
		lens[i] = 40 * KIB + i * 1000;
	MUST(tblob_make(&tb, "persist.blob", "lz4", 1, 1, 12, lens, NULL));
	MUST(src_open(&s, &tb, &bs));
	map = blob_file(dir, &tb, ".map");
	MUST(blob_cache_open(dir, &tb.info, &b));
	CHECK_EQ(blob_cache_ensure(b, cuoff(&tb, 2), cuoff(&tb, 5) -
					      cuoff(&tb, 2), &bs, NULL), 0);
	CHECK_EQ(blob_cache_ensure(b, cuoff(&tb, 9), 1, &bs, NULL), 0);
	blob_cache_close(b);

	/* Reopened: the same chunks, nothing refetched. */
	src_reset(&s);
	MUST(blob_cache_open(dir, &tb.info, &b));
	CHECK_EQ(nr_present(b, &tb), 4);
	CHECK(blob_cache_chunk_present(b, 2) && blob_cache_chunk_present(b, 4) &&
	      blob_cache_chunk_present(b, 9));
	CHECK_EQ(blob_cache_ensure(b, cuoff(&tb, 2), cuoff(&tb, 5) -
					      cuoff(&tb, 2), &bs, NULL), 0);
	CHECK_EQ(s.reads, 0);
	for (i = 2; i < 5; i++)
		CHECK(chunk_ok(b, &tb, i));

	/* A second open in this process shares the handle, marks and all. */
	MUST(blob_cache_open(dir, &tb.info, &b2));
	CHECK(b2 == b);
	blob_cache_close(b2);

	/* A damaged header while another process has the blob open: its
	 * open refuses instead of pulling the files away. */
	MUST(poke(map, 40, 0x01));
	{
		pid_t kid = fork();
		int status = 0;

		if (!kid)
			_exit(blob_cache_open(dir, &tb.info, &b2) == -EFSCORRUPTED ? 0 : 1);
		CHECK(kid > 0 && waitpid(kid, &status, 0) == kid &&
		      WIFEXITED(status) && !WEXITSTATUS(status));
	}
	blob_cache_close(b);

	/* Alone, the damaged map is discarded with a warning. */
	fprintf(stderr, "  (a warning about a discarded map is expected)\n");
	MUST(blob_cache_open(dir, &tb.info, &b));
	CHECK_EQ(nr_present(b, &tb), 0);
	CHECK(!stat(blob_file(dir, &tb, ".data"), &st));
	CHECK_EQ(st.st_blocks, 0); /* the stale chunks' blocks are freed */
	CHECK_EQ(blob_cache_ensure(b, cuoff(&tb, 2), 1, &bs, NULL), 0);
	CHECK(chunk_ok(b, &tb, 2));
	blob_cache_close(b);

	/* An invalid state byte, a truncated map, a missing data file. */
	MUST(poke(map, 128 + 7, 0x10));
	MUST(blob_cache_open(dir, &tb.info, &b));
	CHECK_EQ(nr_present(b, &tb), 0);
	blob_cache_close(b);
	CHECK(!truncate(map, 128 + 5));
	MUST(blob_cache_open(dir, &tb.info, &b));
	CHECK_EQ(nr_present(b, &tb), 0);
	CHECK_EQ(blob_cache_ensure(b, 0, tb.info.uncompressed_size, &bs, NULL),
		 0);
	blob_cache_close(b);
	CHECK(!unlink(blob_file(dir, &tb, ".data")));
	MUST(blob_cache_open(dir, &tb.info, &b));
	CHECK_EQ(nr_present(b, &tb), 0);
	blob_cache_close(b);

	/* A map describing another table for this digest. */
	{
		struct blob_info other = tb.info;

		other.table_sha256[0] ^= 1;
		MUST(blob_cache_open(dir, &other, &b));
		blob_cache_close(b);
		MUST(blob_cache_open(dir, &tb.info, &b));
		CHECK_EQ(nr_present(b, &tb), 0);
		blob_cache_close(b);
	}
	close(s.fd);
	tblob_free(&tb);
}

/* ------------------------------------------------------------------ */
/* Threads and processes                                               */
/* ------------------------------------------------------------------ */

struct worker {
	pthread_t thread;
	struct blob_cache_blob *b;
	const struct blob_source *bs;
	const struct tblob *tb;
	uint64_t seed;
	int ret;
	bool ok;
};

/* Random overlapping ranges, then everything; checks every range. */
static void *worker_run(void *arg)
{
	struct worker *w = arg;
	uint64_t size = w->tb->info.uncompressed_size;
	uint32_t k, i;

	w->ok = true;
	for (k = 0; k < 25 && !w->ret; k++) {
		uint64_t off = rng_next(&w->seed) % size;
		uint64_t len = rng_next(&w->seed) % (3 * MIB);

		len = MIN(len, size - off);

		w->ret = blob_cache_ensure(w->b, off, len, w->bs, NULL);
		for (i = 0; !w->ret && i < w->tb->n; i++) {
			const struct blob_chunk *c = &w->tb->info.chunks[i];

			if (c->uoff < off + len && c->uoff + c->usize > off &&
			    !blob_cache_chunk_present(w->b, i))
				w->ok = false;
		}
	}
	if (!w->ret)
		w->ret = blob_cache_ensure(w->b, 0, size, w->bs, NULL);
	return NULL;
}

/* @nr threads on handle @b; 0 when all succeeded. */
static int run_workers(struct blob_cache_blob *b,
		       const struct blob_source *bs,
		       const struct tblob *tb, uint32_t nr, uint64_t seed)
{
	struct worker w[8];
	uint32_t i;
	int ret = 0;

	for (i = 0; i < nr; i++) {
		w[i] = (struct worker){ .b = b, .bs = bs, .tb = tb,
					.seed = seed + i * 7919 + 1 };
		if (pthread_create(&w[i].thread, NULL, worker_run, &w[i]))
			return -EAGAIN;
	}
	for (i = 0; i < nr; i++) {
		pthread_join(w[i].thread, NULL);
		if (w[i].ret || !w[i].ok)
			ret = w[i].ret ? w[i].ret : -EIO;
	}
	return ret;
}

static void test_concurrent(void)
{
	const char *dir = cache_path("c-conc");
	uint32_t lens[160], i, f, once = 0;
	struct blob_source bs;
	struct blob_cache_blob *b;
	struct tblob tb;
	struct src s;
	uint32_t *counts;
	pid_t kids[2];
	int go[2], status;

	for (i = 0; i < ARRAY_SIZE(lens); i++)
		lens[i] = 2 * KIB + (uint32_t)(rng() % (300 * KIB));
	MUST(tblob_make(&tb, "conc.blob", "zstd:1", 0, 0, ARRAY_SIZE(lens),
			lens, NULL));
	counts = mmap(NULL, tb.nr_frames * sizeof(*counts),
		      PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	CHECK(counts != MAP_FAILED);
	if (counts == MAP_FAILED)
		return;
	MUST(src_open(&s, &tb, &bs));
	s.frame_reads = counts;
	s.delay_us = 1000;
	/* Opened before the fork; the children leave it alone. */
	MUST(blob_cache_open(dir, &tb.info, &b));
	MUST(pipe(go));

	for (i = 0; i < 2; i++) {
		kids[i] = fork();
		CHECK(kids[i] >= 0);
		if (!kids[i]) {
			char c;
			int ret;

			close(go[1]);
			if (read(go[0], &c, 1) < 0)
				_exit(2);
			ret = blob_cache_open(dir, &tb.info, &b);
			if (!ret)
				ret = run_workers(b, &bs, &tb, 3, 1000 + i);
			if (!ret) {
				for (f = 0; f < tb.n; f++)
					if (!chunk_ok(b, &tb, f))
						ret = -EIO;
				blob_cache_close(b);
			}
			_exit(ret ? 1 : 0);
		}
	}
	close(go[0]);
	close(go[1]); /* go */
	CHECK_EQ(run_workers(b, &bs, &tb, 8, 1), 0);
	for (i = 0; i < 2 && kids[i] > 0; i++) {
		CHECK_EQ(waitpid(kids[i], &status, 0), kids[i]);
		CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	}
	for (f = 0; f < tb.nr_frames; f++) {
		if (counts[f] != 1)
			fprintf(stderr, "  frame %u read %u times\n", f,
				counts[f]);
		once += counts[f] == 1;
	}
	CHECK_EQ(once, tb.nr_frames);
	printf("# concurrent: %u frames, each read once; %u of the reads by this process's 8 threads, the rest by 2 processes x 3 threads\n",
	       tb.nr_frames, s.reads);
	CHECK(data_is_address_space(b, &tb));
	blob_cache_close(b);
	munmap(counts, tb.nr_frames * sizeof(*counts));
	close(s.fd);
	tblob_free(&tb);
}

/* ------------------------------------------------------------------ */
/* Crash safety                                                        */
/* ------------------------------------------------------------------ */

/*
 * Until @deadline, watch the map of @tb as another process fills it: each
 * chunk that shows up marked present must already have its bytes in the
 * data file. Returns the chunks checked.
 */
static uint32_t observe(const char *dir, const struct tblob *tb,
			uint64_t deadline, uint8_t *buf)
{
	uint8_t marks[64], seen[64] = { 0 };
	uint32_t i, n = 0;
	int mfd = -1, dfd = -1;

	while (ferry_now_ns() < deadline) {
		if (mfd < 0) {
			mfd = open(blob_file(dir, tb, ".map"), O_RDONLY);
			if (mfd >= 0)
				dfd = open(blob_file(dir, tb, ".data"), O_RDONLY);
			if (mfd < 0 || dfd < 0) {
				if (mfd >= 0)
					close(mfd);
				mfd = -1;
				continue;
			}
		}
		/* 128: the map header size (docs/FORMAT.md). */
		if (pread_full(mfd, marks, tb->n, 128))
			break;
		for (i = 0; i < tb->n; i++) {
			if (marks[i] != 1 || seen[i])
				continue;
			seen[i] = 1;
			n++;
			CHECK_EQ(pread_full(dfd, buf, culen(tb, i),
					    cuoff(tb, i)), 0);
			CHECK_EQ(blob_chunk_verify(&tb->info.chunks[i], buf), 0);
		}
	}
	if (mfd >= 0)
		close(mfd);
	if (dfd >= 0)
		close(dfd);
	return n;
}

static void test_crash(void)
{
	const char *dir = cache_path("c-crash");
	uint32_t lens[40], order[40], i, round, present_total = 0, observed = 0;
	struct blob_source bs;
	struct blob_cache_blob *b;
	struct tblob tb;
	struct src s;
	uint8_t *buf;

	for (i = 0; i < ARRAY_SIZE(lens); i++)
		lens[i] = 16 * KIB + (uint32_t)(rng() % (64 * KIB));
	MUST(tblob_make(&tb, "crash.blob", "zstd", 1, 1, ARRAY_SIZE(lens),
			lens, NULL));
	MUST(src_open(&s, &tb, &bs));
	buf = malloc(128 * KIB);
	if (!buf)
		return;
	for (round = 0; round < 20; round++) {
		pid_t pid;
		int status;

		/* Every 4th round starts without any cache files. */
		if (round % 4 == 0) {
			unlink(blob_file(dir, &tb, ".map"));
			unlink(blob_file(dir, &tb, ".data"));
		}
		pid = fork();
		CHECK(pid >= 0);
		if (pid < 0)
			break;
		if (!pid) {
			uint64_t seed = round + 17;

			if (blob_cache_open(dir, &tb.info, &b))
				_exit(1);
			s.delay_us = 300;
			for (i = 0; i < tb.n; i++)
				order[i] = i;
			for (i = tb.n - 1; i > 0; i--) {
				uint32_t j = (uint32_t)(rng_next(&seed) % (i + 1));
				uint32_t t = order[i];

				order[i] = order[j];
				order[j] = t;
			}
			for (i = 0; i < tb.n; i++)
				if (blob_cache_ensure(b, cuoff(&tb, order[i]), 1,
						      &bs, NULL))
					_exit(1);
			_exit(0);
		}
		observed += observe(dir, &tb, ferry_now_ns() +
						      rng() % 25000000, buf);
		kill(pid, SIGKILL);
		CHECK_EQ(waitpid(pid, &status, 0), pid);
		CHECK(WIFSIGNALED(status) ||
		      (WIFEXITED(status) && !WEXITSTATUS(status)));

		/* Every chunk marked present has its bytes. */
		MUST(blob_cache_open(dir, &tb.info, &b));
		for (i = 0; i < tb.n; i++) {
			if (!blob_cache_chunk_present(b, i))
				continue;
			present_total++;
			CHECK_EQ(pread_full(blob_cache_data_fd(b), buf,
					    culen(&tb, i), cuoff(&tb, i)), 0);
			CHECK_EQ(blob_chunk_verify(&tb.info.chunks[i], buf), 0);
		}
		/* Every other round also completes the blob. */
		if (round % 2) {
			CHECK_EQ(blob_cache_ensure(b, 0,
						   tb.info.uncompressed_size,
						   &bs, NULL), 0);
			CHECK_EQ(nr_present(b, &tb), tb.n);
		}
		blob_cache_close(b);
		if (round % 2) {
			unlink(blob_file(dir, &tb, ".map"));
			unlink(blob_file(dir, &tb, ".data"));
		}
	}
	printf("# crash: 20 kills, %u chunks found marked present after them, %u seen marked while filling, all verified\n",
	       present_total, observed);
	MUST(blob_cache_open(dir, &tb.info, &b));
	CHECK_EQ(blob_cache_ensure(b, 0, tb.info.uncompressed_size, &bs, NULL),
		 0);
	CHECK(data_is_address_space(b, &tb));
	blob_cache_close(b);
	free(buf);
	close(s.fd);
	tblob_free(&tb);
}

/* ------------------------------------------------------------------ */
/* Image records, list, gc                                             */
/* ------------------------------------------------------------------ */

static const struct blob_cache_entry *
find_entry(const struct blob_cache_list *l, const struct tblob *tb)
{
	uint32_t i;

	for (i = 0; i < l->nr_blobs; i++)
		if (!memcmp(l->blobs[i].digest, tb->info.digest,
			    BLOB_DIGEST_SIZE))
			return &l->blobs[i];
	return NULL;
}

static int make_old_file(const char *path)
{
	struct timespec ts[2] = { { .tv_sec = time(NULL) - 3600 },
				  { .tv_sec = time(NULL) - 3600 } };
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);

	if (fd < 0)
		return -errno;
	if (write_full(fd, "leftover", 8) || futimens(fd, ts)) {
		close(fd);
		return -EIO;
	}
	close(fd);
	return 0;
}

static void test_images_gc(void)
{
	const char *dir = cache_path("c-gc");
	/* Chunks 0 and 1 share a batch frame, chunk 2 is a frame alone. */
	static const uint32_t lens[] = { 100 * KIB, 50 * KIB, BLOB_BATCH_SMALL };
	struct tblob t[3];
	struct blob_source bs[3];
	struct blob_cache_blob *b;
	struct blob_cache_blob *keep;
	struct blob_cache_list l;
	const struct blob_cache_entry *e;
	struct src s[3];
	uint8_t img1[BLOB_DIGEST_SIZE], img2[BLOB_DIGEST_SIZE];
	uint8_t names[2][BLOB_DIGEST_SIZE];
	char path[320];
	uint64_t freed;
	uint32_t removed, i;

	/* Nothing there yet: empty, and nothing to do. */
	MUST(blob_cache_list(dir, &l));
	CHECK_EQ(l.nr_blobs, 0);
	CHECK_EQ(l.nr_images, 0);
	blob_cache_list_free(&l);
	CHECK_EQ(blob_cache_gc(dir, &freed, &removed), 0);
	CHECK_EQ(removed, 0);
	CHECK_EQ(blob_cache_forget_image(dir, NULL), 0);

	for (i = 0; i < 3; i++) {
		char name[32];

		snprintf(name, sizeof(name), "gc%u.blob", i);
		MUST(tblob_make(&t[i], name, "zstd", 0, 0, 3, lens, NULL));
		MUST(src_open(&s[i], &t[i], &bs[i]));
		MUST(blob_cache_open(dir, &t[i].info, &b));
		CHECK_EQ(blob_cache_ensure(b, 0, cuoff(&t[i], 1) + 1, &bs[i],
					   NULL), 0);
		blob_cache_close(b);
	}
	/* Blob 2 stays open. */
	MUST(blob_cache_open(dir, &t[2].info, &keep));

	sha256_buf("image one", 9, img1);
	sha256_buf("image two", 9, img2);
	memcpy(names[0], t[0].info.digest, BLOB_DIGEST_SIZE);
	memcpy(names[1], t[0].info.digest, BLOB_DIGEST_SIZE);
	MUST(blob_cache_add_image(dir, "registry.local/app:1", img1, names, 2, NULL, 0));
	MUST(blob_cache_add_image(dir, NULL, img2, NULL, 0, NULL, 0));

	MUST(blob_cache_list(dir, &l));
	CHECK_EQ(l.nr_blobs, 3);
	CHECK_EQ(l.nr_images, 2);
	e = find_entry(&l, &t[0]);
	CHECK(e && e->nr_images == 1 && !e->in_use);
	CHECK(e && e->nr_chunks == 3 && e->chunks_present == 2);
	CHECK(e && e->uncompressed_size == t[0].info.uncompressed_size);
	CHECK(e && e->disk_bytes >= 150 * KIB);
	e = find_entry(&l, &t[1]);
	CHECK(e && e->nr_images == 0 && !e->in_use);
	e = find_entry(&l, &t[2]);
	CHECK(e && e->nr_images == 0 && e->in_use);
	for (i = 0; i < l.nr_images; i++) {
		if (!memcmp(l.images[i].digest, img1, BLOB_DIGEST_SIZE)) {
			CHECK(!strcmp(l.images[i].ref, "registry.local/app:1"));
			CHECK_EQ(l.images[i].nr_blobs, 1); /* deduplicated */
		} else {
			CHECK(!memcmp(l.images[i].digest, img2,
				      BLOB_DIGEST_SIZE));
			CHECK(!strcmp(l.images[i].ref, ""));
			CHECK_EQ(l.images[i].nr_blobs, 0);
		}
	}
	blob_cache_list_free(&l);

	/* Leftovers: old temporary files go, a fresh one and a foreign
	 * file stay; a broken image record is ignored. */
	snprintf(path, sizeof(path), "%s/blobs/sha256/.tmp-old", dir);
	MUST(make_old_file(path));
	snprintf(path, sizeof(path), "%s/images/.tmp-old.json", dir);
	MUST(make_old_file(path));
	snprintf(path, sizeof(path), "%s/blobs/sha256/.tmp-fresh", dir);
	MUST(make_old_file(path));
	CHECK(!utimensat(AT_FDCWD, path, NULL, 0));
	snprintf(path, sizeof(path), "%s/blobs/sha256/README", dir);
	MUST(make_old_file(path));
	snprintf(path, sizeof(path), "%s/images/%064x.json", dir, 0);
	MUST(make_old_file(path));
	fprintf(stderr, "  (warnings about an unexpected file and a broken record are expected)\n");

	/* gc: blob 1 goes; 0 is named by an image, 2 is in use. */
	CHECK_EQ(blob_cache_gc(dir, &freed, &removed), 0);
	CHECK_EQ(removed, 1);
	CHECK(freed >= 50 * KIB);
	CHECK(!exists(blob_file(dir, &t[1], ".map")));
	CHECK(!exists(blob_file(dir, &t[1], ".data")));
	CHECK(exists(blob_file(dir, &t[0], ".data")));
	CHECK(exists(blob_file(dir, &t[2], ".data")));
	snprintf(path, sizeof(path), "%s/blobs/sha256/.tmp-old", dir);
	CHECK(!exists(path));
	snprintf(path, sizeof(path), "%s/images/.tmp-old.json", dir);
	CHECK(!exists(path));
	snprintf(path, sizeof(path), "%s/blobs/sha256/.tmp-fresh", dir);
	CHECK(exists(path));
	snprintf(path, sizeof(path), "%s/blobs/sha256/README", dir);
	CHECK(exists(path));

	/* An old data file without a map (a crashed creation) goes. */
	MUST(make_old_file(blob_file(dir, &t[1], ".data")));
	CHECK_EQ(blob_cache_gc(dir, &freed, &removed), 0);
	CHECK_EQ(removed, 1);
	CHECK(!exists(blob_file(dir, &t[1], ".data")));

	/* Forgetting: one unknown image is an error, then image 1. */
	CHECK_EQ(blob_cache_forget_image(dir, names[0]), -ENOENT);
	MUST(blob_cache_forget_image(dir, img1));
	CHECK_EQ(blob_cache_gc(dir, &freed, &removed), 0);
	CHECK_EQ(removed, 1);
	CHECK(!exists(blob_file(dir, &t[0], ".map")));
	CHECK(exists(blob_file(dir, &t[2], ".map")));

	/* The open handle still works; once closed, gc takes it. */
	CHECK_EQ(blob_cache_ensure(keep, 0, t[2].info.uncompressed_size,
				   &bs[2], NULL), 0);
	CHECK(chunk_ok(keep, &t[2], 2));
	blob_cache_close(keep);
	CHECK_EQ(blob_cache_gc(dir, &freed, &removed), 0);
	CHECK_EQ(removed, 1);
	CHECK(freed >= 350 * KIB);

	/* Reopening a removed blob starts afresh. */
	MUST(blob_cache_open(dir, &t[2].info, &b));
	CHECK_EQ(nr_present(b, &t[2]), 0);
	blob_cache_close(b);

	/* Forget everything. */
	MUST(blob_cache_add_image(dir, "x", img1, names, 1, NULL, 0));
	MUST(blob_cache_forget_image(dir, NULL));
	MUST(blob_cache_list(dir, &l));
	CHECK_EQ(l.nr_images, 0);
	blob_cache_list_free(&l);
	for (i = 0; i < 3; i++) {
		close(s[i].fd);
		tblob_free(&t[i]);
	}
}

/*
 * Records keep other files by digest ("keep"): blob_cache_kept is the
 * union over every record, apart from the blobs; a record without "keep"
 * (an older ferry's) still counts, one with a damaged "keep" is ignored.
 */
static void test_records_keep(void)
{
	const char *dir = cache_path("c-keep");
	uint8_t img[3][BLOB_DIGEST_SIZE], k[3][BLOB_DIGEST_SIZE], blob[BLOB_DIGEST_SIZE];
	uint8_t (*got)[BLOB_DIGEST_SIZE] = NULL;
	char path[320], hex[2 * BLOB_DIGEST_SIZE + 1];
	uint32_t nr = 0, i;
	FILE *f;

	for (i = 0; i < 3; i++) {
		sha256_buf(&i, sizeof(i), img[i]);
		memset(k[i], 0x10 * (i + 1), BLOB_DIGEST_SIZE); /* sorted: k0 < k1 < k2 */
	}
	memset(blob, 0xee, sizeof(blob));
	MUST(blob_cache_add_image(dir, "a", img[0], (const uint8_t (*)[BLOB_DIGEST_SIZE])blob, 1,
				  (const uint8_t (*)[BLOB_DIGEST_SIZE])k, 2));
	MUST(blob_cache_add_image(dir, "b", img[1], NULL, 0,
				  (const uint8_t (*)[BLOB_DIGEST_SIZE])k[1], 2));
	MUST(blob_cache_kept(dir, &got, &nr));
	CHECK_EQ(nr, 3);
	for (i = 0; i < 3 && nr == 3; i++)
		CHECK(!memcmp(got[i], k[i], BLOB_DIGEST_SIZE));
	free(got);
	MUST(blob_cache_named(dir, &got, &nr));
	CHECK(nr == 1 && !memcmp(got[0], blob, BLOB_DIGEST_SIZE));
	free(got);

	/* A damaged "keep": the whole record is ignored (warned). */
	hex_encode(img[2], BLOB_DIGEST_SIZE, hex);
	snprintf(path, sizeof(path), "%s/images/%s.json", dir, hex);
	f = fopen(path, "w");
	CHECK(f != NULL);
	if (f) {
		fprintf(f, "{\"ref\":\"c\",\"digest\":\"sha256:%s\",\"blobs\":[],\"keep\":[7]}", hex);
		fclose(f);
	}
	fprintf(stderr, "  (a warning about a broken record is expected)\n");
	MUST(blob_cache_forget_image(dir, img[0]));
	MUST(blob_cache_kept(dir, &got, &nr));
	CHECK_EQ(nr, 2);
	CHECK(nr == 2 && !memcmp(got[0], k[1], BLOB_DIGEST_SIZE) &&
	      !memcmp(got[1], k[2], BLOB_DIGEST_SIZE));
	free(got);
	MUST(blob_cache_forget_image(dir, NULL));
	MUST(blob_cache_kept(dir, &got, &nr));
	CHECK_EQ(nr, 0);
	free(got);
}

/* ------------------------------------------------------------------ */
/* Measurements                                                        */
/* ------------------------------------------------------------------ */

static double secs_since(uint64_t t0)
{
	return (double)(ferry_now_ns() - t0) / 1e9;
}

static void test_measure(void)
{
	const char *dir = cache_path("c-measure");
	uint32_t lens[64], i;
	struct blob_source bs;
	struct blob_cache_blob *b;
	struct tblob tb;
	struct src s;
	uint64_t t0, fetched = 0;
	double dt;
	char path[320];
	uint8_t *buf;
	int fd;

	for (i = 0; i < 64; i++)
		lens[i] = MIB;
	MUST(tblob_make(&tb, "measure.blob", "zstd", 0, 0, 64, lens, NULL));
	MUST(src_open(&s, &tb, &bs));

	/* Whole blob at once. */
	MUST(blob_cache_open(dir, &tb.info, &b));
	t0 = ferry_now_ns();
	CHECK_EQ(blob_cache_ensure(b, 0, tb.info.uncompressed_size, &bs,
				   &fetched), 0);
	dt = secs_since(t0);
	printf("# ensure 64 MiB blob (1 MiB zstd chunks, %.1f MiB compressed) in one call: %.3f s, %.0f MiB/s, %u reads\n",
	       (double)fetched / MIB, dt, 64 / dt, s.reads);
	for (i = 0; i < tb.n; i++)
		CHECK(chunk_ok(b, &tb, i));
	blob_cache_close(b);
	unlink(blob_file(dir, &tb, ".map"));
	unlink(blob_file(dir, &tb, ".data"));

	/* Chunk by chunk: one fdatasync per chunk. */
	MUST(blob_cache_open(dir, &tb.info, &b));
	t0 = ferry_now_ns();
	for (i = 0; i < tb.n; i++)
		CHECK_EQ(blob_cache_ensure(b, cuoff(&tb, i), culen(&tb, i),
					   &bs, NULL), 0);
	dt = secs_since(t0);
	printf("# ensure the same, 64 calls of 1 MiB: %.3f s, %.0f MiB/s\n", dt,
	       64 / dt);

	/* Already present: the lock-free path. */
	t0 = ferry_now_ns();
	for (i = 0; i < 100000; i++)
		blob_cache_ensure(b, cuoff(&tb, i % tb.n), 4096, &bs, NULL);
	printf("# ensure of a present 4 KiB range: %.0f ns\n",
	       (double)(ferry_now_ns() - t0) / 100000);
	blob_cache_close(b);

	/* fdatasync after writing 1 and 4 MiB on this file system. */
	buf = malloc(4 * MIB);
	snprintf(path, sizeof(path), "%s/sync-test", tmpdir);
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
	if (buf && fd >= 0) {
		uint32_t sz;

		fill(buf, 4 * MIB, RANDOM);
		for (sz = MIB; sz <= 4 * MIB; sz *= 4) {
			double w = 0;

			for (i = 0; i < 8; i++) {
				CHECK_EQ(pwrite_full(fd, buf, sz,
						     (uint64_t)i * sz), 0);
				t0 = ferry_now_ns();
				CHECK_EQ(fdatasync(fd), 0);
				w += secs_since(t0);
			}
			printf("# fdatasync after a %u MiB write: %.2f ms\n",
			       sz / MIB, w / 8 * 1e3);
		}
	}
	if (fd >= 0)
		close(fd);
	unlink(path);
	free(buf);
	close(s.fd);
	tblob_free(&tb);
}

/* ------------------------------------------------------------------ */
/* Trust: directory checks, symlinks, verify                           */
/* ------------------------------------------------------------------ */

static mode_t mode_of(const char *path)
{
	struct stat st;

	return lstat(path, &st) ? (mode_t)-1 : st.st_mode & 07777;
}

static void test_trust_dirs(void)
{
	const char *dir = cache_path("c-trust"), *victim = cache_path("victim");
	char blobs[256], sha[256], real[256];
	struct blob_cache_blob *b;
	uint32_t lens[2] = { 10 * KIB, 20 * KIB };
	struct tblob tb;
	struct stat st;
	int fd = -1, ret;

	snprintf(blobs, sizeof(blobs), "%s/blobs", dir);
	snprintf(sha, sizeof(sha), "%s/blobs/sha256", dir);
	snprintf(real, sizeof(real), "%s/blobs/real", dir);
	CHECK_EQ(blob_cache_dir(dir, NULL, false, NULL), -ENOENT);
	CHECK_EQ(blob_cache_dir(dir, "blobs/sha256", true, &fd), 0);
	CHECK(fd >= 0 && !fstat(fd, &st) && S_ISDIR(st.st_mode));
	if (fd >= 0)
		close(fd);
	CHECK_EQ(mode_of(dir), 0700);
	CHECK_EQ(mode_of(sha), 0700);

	/* Writable by others: refused; readable by others: narrowed. */
	CHECK(!chmod(dir, 0777));
	CHECK_EQ(blob_cache_dir(dir, NULL, false, NULL), -EPERM);
	CHECK(!chmod(blobs, 0775) && !chmod(dir, 0700));
	CHECK_EQ(blob_cache_dir(dir, "blobs/sha256", false, NULL), -EPERM);
	CHECK(!chmod(blobs, 0755));
	CHECK_EQ(blob_cache_dir(dir, "blobs", false, NULL), 0);
	CHECK_EQ(mode_of(blobs), 0700);
	/* Someone else's: refused. */
	CHECK(!chown(sha, 65534, (gid_t)-1));
	CHECK_EQ(blob_cache_dir(dir, "blobs/sha256", false, NULL), -EPERM);
	CHECK(!chown(sha, geteuid(), (gid_t)-1));
	/* A symlink for a directory: never followed. */
	CHECK(!rename(sha, real) && !symlink("real", sha));
	ret = blob_cache_dir(dir, "blobs/sha256", false, NULL);
	CHECK(ret == -ELOOP || ret == -ENOTDIR);
	CHECK(!unlink(sha) && !rename(real, sha));

	/* A .data symlink to someone's file: refused, the file untouched. */
	MUST(tblob_make(&tb, "trust.blob", "none", 0, 0, 2, lens, NULL));
	fd = open(victim, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	CHECK(fd >= 0 && !write_full(fd, "victim", 6));
	if (fd >= 0)
		close(fd);
	CHECK(!symlink(victim, blob_file(dir, &tb, ".data")));
	CHECK(blob_cache_open(dir, &tb.info, &b) < 0);
	CHECK(!stat(victim, &st) && st.st_size == 6);
	CHECK(!unlink(blob_file(dir, &tb, ".data")));
	/* Created files are 0600. */
	MUST(blob_cache_open(dir, &tb.info, &b));
	CHECK_EQ(mode_of(blob_file(dir, &tb, ".data")), 0600);
	CHECK_EQ(mode_of(blob_file(dir, &tb, ".map")), 0600);
	CHECK_EQ(mode_of(blob_file(dir, &tb, CACHE_INDEX_SUFFIX)), 0600);
	blob_cache_close(b);
	tblob_free(&tb);
}

/* Allocated bytes of the cache's blob files, as blob_cache_enforce counts. */
static uint64_t blobs_allocated(const char *dir, const struct tblob *tb)
{
	static const char *const ext[] = { ".data", ".map", ".index" };
	struct stat st;
	uint64_t n = 0;
	size_t i;

	for (i = 0; i < ARRAY_SIZE(ext); i++)
		if (!stat(blob_file(dir, tb, ext[i]), &st))
			n += (uint64_t)st.st_blocks * 512;
	return n;
}

/*
 * The size limit: the least recently used frames go, their marks first,
 * then their bytes; what is used again is fetched again; what is recent
 * and what another process has open stays.
 */
static void test_evict(void)
{
	static const uint8_t image_digest[BLOB_DIGEST_SIZE] = { 0xee };
	const char *dir = cache_path("c-evict");
	struct blob_cache_enforce_report r;
	struct blob_cache_limit lim = { 0 };
	struct timespec pause = { 0, 150 * 1000 * 1000 };
	uint32_t lens[16], i, kept = 0;
	enum kind kinds[16];
	struct blob_source bs;
	struct blob_cache_blob *b, *b2;
	struct tblob tb;
	struct src s;
	uint64_t full, evicted;
	uint8_t mark;
	int fd, status;
	pid_t kid;

	for (i = 0; i < 16; i++) {
		lens[i] = 64 * KIB;
		kinds[i] = RANDOM;
	}
	MUST(tblob_make(&tb, "evict.blob", "lz4", 1, 1, 16, lens, kinds));
	CHECK_EQ(tb.nr_frames, 16);
	MUST(src_open(&s, &tb, &bs));
	/* An image names it, so gc keeps it. */
	MUST(blob_cache_add_image(dir, "evict", image_digest,
				  (const uint8_t (*)[BLOB_DIGEST_SIZE])tb.info.digest, 1, NULL, 0));
	MUST(blob_cache_open(dir, &tb.info, &b));
	CHECK_EQ(blob_cache_ensure(b, 0, tb.info.uncompressed_size, &bs, NULL), 0);
	full = blobs_allocated(dir, &tb);

	/* Under the limit, or everything used just now: nothing goes. */
	lim.max_size = full;
	CHECK_EQ(blob_cache_enforce(dir, &lim, NULL, NULL, &r), 0);
	CHECK(r.usage == full && !r.freed_open);
	lim.max_size = full / 2;
	CHECK_EQ(blob_cache_enforce(dir, &lim, NULL, NULL, &r), 0);
	CHECK_EQ(r.freed_open, 0);

	/* Chunks 12..15 used again later: the older ones go first. */
	nanosleep(&pause, NULL);
	CHECK(blob_cache_range_present(b, cuoff(&tb, 12), 4 * 64 * KIB));
	nanosleep(&pause, NULL);
	CHECK(blob_cache_range_present(b, cuoff(&tb, 12), 4 * 64 * KIB));
	CHECK_EQ(blob_cache_enforce(dir, &lim, NULL, NULL, &r), 0);
	CHECK(r.freed_open >= full / 2 - 64 * KIB && r.freed_open < full);
	evicted = blob_cache_evicted(b);
	CHECK_EQ(evicted, r.freed_open);
	CHECK(blobs_allocated(dir, &tb) <= full / 16 * 15);
	for (i = 12; i < 16; i++)
		kept += blob_cache_chunk_present(b, i);
	CHECK_EQ(kept, 4);
	/* Every chunk not present in memory is unmarked in the map and holds no bytes. */
	fd = open(blob_file(dir, &tb, ".map"), O_RDONLY);
	CHECK(fd >= 0);
	for (i = 0; fd >= 0 && i < 16; i++) {
		CHECK(!pread_full(fd, &mark, 1, 128 + i));
		CHECK_EQ(mark, blob_cache_chunk_present(b, i) ? 1 : 0);
	}
	if (fd >= 0)
		close(fd);
	fd = open(blob_file(dir, &tb, ".data"), O_RDONLY);
	CHECK(fd >= 0 && lseek(fd, (off_t)cuoff(&tb, 0), SEEK_HOLE) == (off_t)cuoff(&tb, 0));
	if (fd >= 0)
		close(fd);

	/* Read again: fetched again, right bytes. */
	src_reset(&s);
	CHECK_EQ(blob_cache_ensure(b, 0, tb.info.uncompressed_size, &bs, NULL), 0);
	CHECK(s.reads > 0);
	for (i = 0; i < 16; i++)
		CHECK(chunk_ok(b, &tb, i));

	/* Another process has the blob open: its marks would go stale, so nothing goes. */
	nanosleep(&pause, NULL);
	kid = fork();
	if (!kid) {
		if (blob_cache_open(dir, &tb.info, &b2))
			_exit(1);
		pause.tv_sec = 1;
		nanosleep(&pause, NULL);
		_exit(0);
	}
	pause.tv_nsec = 300 * 1000 * 1000;
	nanosleep(&pause, NULL);
	CHECK_EQ(blob_cache_enforce(dir, &lim, NULL, NULL, &r), 0);
	CHECK_EQ(r.freed_open, 0);
	CHECK_EQ(nr_present(b, &tb), 16);
	CHECK(kid > 0 && waitpid(kid, &status, 0) == kid && WIFEXITED(status) &&
	      !WEXITSTATUS(status));
	/* Alone again, it goes. */
	CHECK_EQ(blob_cache_enforce(dir, &lim, NULL, NULL, &r), 0);
	CHECK(r.freed_open > 0);
	blob_cache_close(b);

	/* Nobody has it open: emptied whole, marks and bytes, its record kept. */
	lim.max_size = 4096;
	CHECK_EQ(blob_cache_enforce(dir, &lim, NULL, NULL, &r), 0);
	CHECK(r.freed_idle > 0);
	MUST(blob_cache_open(dir, &tb.info, &b));
	CHECK_EQ(nr_present(b, &tb), 0);
	blob_cache_close(b);
	close(s.fd);
	tblob_free(&tb);
}

static void test_verify(void)
{
	const char *dir = cache_path("c-verify");
	struct blob_cache_verify_report r;
	enum kind kinds[8];
	uint32_t lens[8], i;
	struct blob_source bs;
	struct blob_cache_blob *b;
	struct tblob tb;
	struct src s;
	uint8_t z[64];

	for (i = 0; i < 8; i++) {
		lens[i] = 30 * KIB + i * 777;
		kinds[i] = RANDOM;
	}
	MUST(tblob_make(&tb, "verify.blob", "zstd", 1, 1, 8, lens, kinds));
	MUST(src_open(&s, &tb, &bs));
	MUST(blob_cache_open(dir, &tb.info, &b));
	CHECK_EQ(blob_cache_ensure(b, 0, tb.info.uncompressed_size, &bs, NULL), 0);
	blob_cache_close(b);

	CHECK_EQ(blob_cache_verify(dir, &r), 0);
	CHECK(r.blobs == 1 && r.blobs_skipped == 0 && r.chunks == 8 && !r.nr_bad);
	blob_cache_verify_report_free(&r);

	/* One flipped byte: found, its slot zeroed and its mark cleared. */
	MUST(poke(blob_file(dir, &tb, ".data"), cuoff(&tb, 3) + 5, 0x40));
	CHECK_EQ(blob_cache_verify(dir, &r), 0);
	CHECK(r.nr_bad == 1 && r.bad[0].chunk == 3 &&
	      r.bad[0].uoff == cuoff(&tb, 3) &&
	      !memcmp(r.bad[0].blob, tb.info.digest, BLOB_DIGEST_SIZE));
	blob_cache_verify_report_free(&r);
	{
		int fd = open(blob_file(dir, &tb, ".data"), O_RDONLY);

		CHECK(fd >= 0 && !pread_full(fd, z, sizeof(z), cuoff(&tb, 3)) &&
		      mem_is_zero(z, sizeof(z)));
		if (fd >= 0)
			close(fd);
	}
	CHECK_EQ(blob_cache_verify(dir, &r), 0);
	CHECK(r.chunks == 7 && !r.nr_bad);
	blob_cache_verify_report_free(&r);

	/* Its next reader fetches it again. */
	src_reset(&s);
	MUST(blob_cache_open(dir, &tb.info, &b));
	CHECK(!blob_cache_chunk_present(b, 3) && blob_cache_chunk_present(b, 4));
	CHECK_EQ(blob_cache_ensure(b, cuoff(&tb, 3), 1, &bs, NULL), 0);
	CHECK(chunk_ok(b, &tb, 3));
	CHECK_EQ(s.reads, 1);
	blob_cache_close(b);

	/* Without a recorded table the blob is skipped, not guessed at. */
	CHECK(!unlink(blob_file(dir, &tb, CACHE_INDEX_SUFFIX)));
	CHECK_EQ(blob_cache_verify(dir, &r), 0);
	CHECK(r.blobs == 0 && r.blobs_skipped == 1);
	blob_cache_verify_report_free(&r);
	/* gc removes the table with its blob. */
	MUST(blob_cache_open(dir, &tb.info, &b));
	blob_cache_close(b);
	CHECK(exists(blob_file(dir, &tb, CACHE_INDEX_SUFFIX)));
	CHECK_EQ(blob_cache_gc(dir, NULL, NULL), 0);
	CHECK(!exists(blob_file(dir, &tb, CACHE_INDEX_SUFFIX)));
	close(s.fd);
	tblob_free(&tb);
}

int main(void)
{
	char cmd[128];

	snprintf(tmpdir, sizeof(tmpdir), "/tmp/ferry-test-cache-XXXXXX");
	if (!mkdtemp(tmpdir)) {
		perror("mkdtemp");
		return 1;
	}
	RUN_TEST(test_ensure_ranges);
	RUN_TEST(test_frames_and_runs);
	RUN_TEST(test_corrupt_source);
	RUN_TEST(test_read_frames);
	RUN_TEST(test_persistence);
	RUN_TEST(test_concurrent);
	RUN_TEST(test_crash);
	RUN_TEST(test_images_gc);
	RUN_TEST(test_records_keep);
	RUN_TEST(test_trust_dirs);
	RUN_TEST(test_verify);
	RUN_TEST(test_evict);
	RUN_TEST(test_measure);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
	if (system(cmd))
		fprintf(stderr, "cannot remove %s\n", tmpdir);
	TEST_MAIN_END();
}
