// SPDX-License-Identifier: MIT
/*
 * The file data of a native EROFS layer (erofslayers.c), laid out in the
 * order the files arrive: each file a run of blocks after the previous
 * one, read an extent (1 MiB) at a time. Extents are compressed on worker
 * threads, each on its own (a codec context reset per extent: LZ4 and
 * zstd through pkg-blob's codec with its tuned defaults, MicroLZMA through
 * liblzma, raw deflate through zlib, the formats the kernel decodes), and
 * laid out strictly in submission order on the caller's thread
 * (meta_zextent_put, then one pwrite), so block addresses, and so the
 * layer, do not depend on the number of threads or their timing.
 *
 * Extents in flight (queued, compressing, or done and waiting for an
 * older one) live in a window of slots, slot s % nr_slots for extent s;
 * the caller lays out the oldest whenever it needs its slot. One mutex
 * guards the counters and slot states; compressing, copying and writing
 * run outside it. A file's inode gets its blocks, and its extents if
 * compressing saved a block, when its last extent is laid out: after
 * zpipe_flush every file added is complete. Unfinished files wait in a
 * queue, oldest first: the order in which they finish.
 */
#include <lzma.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "internal.h"

#define BLK META_BLOCK_SIZE
#define EXTENT META_ZPACK_EXTENT_MAX
#define SLOTS_PER_JOB 4

struct zp_file {
	struct meta_inode *inode;
	uint64_t size;
	uint32_t blocks;          /* laid out so far */
	struct meta_zextent *ext; /* one per lcluster; NULL = stored raw */
	uint32_t nr_ext;
	struct zp_file *next;     /* files finish in the order they came */
};

enum { SLOT_FREE, SLOT_QUEUED, SLOT_DONE };

struct zp_slot {
	struct zp_file *file;
	uint8_t *raw, *z; /* EXTENT bytes each, allocated on first use */
	size_t len, zlen; /* zlen 0: not compressed */
	uint32_t lcn;
	bool first, last; /* the file's first / last extent */
	int state, err;
};

/* A compressing thread's liblzma and zlib streams, set up on first use. */
struct zp_worker {
	struct zpipe *zp;
	pthread_t thread;
	lzma_stream lzma;
	z_stream zlib;
	bool zlib_ready;
};

struct zpipe {
	uint8_t zalgorithm; /* enum meta_zalgorithm */
	int level;          /* 0: the codec's default */
	int fd;
	uint32_t blocks;    /* laid out */
	uint64_t reserved;  /* blocks plus the raw blocks of extents in flight */
	struct zp_slot *slots;
	uint32_t nr_slots;
	uint64_t submitted, handed, done; /* extent counters */
	struct zp_file *head, **tail;     /* unfinished files */
	uint8_t *out;       /* the extent being laid out */
	struct meta_zextent plain_ext[EXTENT / BLK];
	pthread_mutex_t lock;
	pthread_cond_t work, finished;
	struct zp_worker *workers; /* [0] compresses inline without threads */
	uint32_t nr_threads;
	bool stop;
};

/* MicroLZMA: as much of the input as fits in @cap; all of it, or nothing. */
static int zp_lzma(struct zp_worker *wk, const struct zp_slot *s, size_t cap,
		   size_t *zlen)
{
	lzma_options_lzma opt;
	lzma_ret r;

	if (lzma_lzma_preset(&opt, (uint32_t)(wk->zp->level ? wk->zp->level : 6)))
		return -EINVAL;
	opt.dict_size = EXTENT;
	r = lzma_microlzma_encoder(&wk->lzma, &opt);
	if (r == LZMA_OK) {
		wk->lzma.next_in = s->raw;
		wk->lzma.avail_in = s->len;
		wk->lzma.next_out = s->z;
		wk->lzma.avail_out = cap;
		r = lzma_code(&wk->lzma, LZMA_FINISH);
	}
	if (r == LZMA_MEM_ERROR)
		return -ENOMEM;
	if (r != LZMA_STREAM_END) {
		ferry_err("lzma: MicroLZMA encoder error %d", (int)r);
		return -EIO;
	}
	*zlen = wk->lzma.avail_in ? 0 : cap - wk->lzma.avail_out;
	return 0;
}

/* Raw deflate (no zlib header), 32 KiB window, into at most @cap bytes. */
static int zp_deflate(struct zp_worker *wk, const struct zp_slot *s, size_t cap,
		      size_t *zlen)
{
	z_stream *z = &wk->zlib;
	int r;

	if (!wk->zlib_ready) {
		r = deflateInit2(z, wk->zp->level ? wk->zp->level : Z_DEFAULT_COMPRESSION,
				 Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY);
		if (r != Z_OK)
			return r == Z_MEM_ERROR ? -ENOMEM : -EINVAL;
		wk->zlib_ready = true;
	}
	z->next_in = (Bytef *)s->raw;
	z->avail_in = (uInt)s->len;
	z->next_out = s->z;
	z->avail_out = (uInt)cap;
	r = deflate(z, Z_FINISH);
	*zlen = r == Z_STREAM_END ? cap - z->avail_out : 0;
	return deflateReset(z) == Z_OK ? 0 : -EIO;
}

static void zp_compress(struct zp_worker *wk, struct zp_slot *s)
{
	const struct zpipe *zp = wk->zp;
	/* What would save a block; LZ4 and zstd take room for the input. */
	size_t cap = ROUND_UP(s->len, BLK) - BLK;
	struct blob_compress c = { zp->zalgorithm == META_Z_LZ4 ? BLOB_CODEC_LZ4 :
				   BLOB_CODEC_ZSTD, zp->level };
	enum blob_codec used;
	int ret;

	s->zlen = 0;
	/* One lcluster cannot be compressed (no room for its CBLKCNT). */
	if (!s->file->ext || s->len <= BLK)
		return;
	if (zp->zalgorithm == META_Z_LZMA) {
		ret = zp_lzma(wk, s, cap, &s->zlen);
	} else if (zp->zalgorithm == META_Z_DEFLATE) {
		ret = zp_deflate(wk, s, cap, &s->zlen);
	} else {
		ret = blob_compress(&c, s->raw, s->len, s->z, EXTENT, &s->zlen,
				    &used);
		if (!ret && used == BLOB_CODEC_NONE)
			s->zlen = 0;
	}
	if (ret < 0)
		s->err = ret;
}

static void *zp_worker(void *arg)
{
	struct zp_worker *wk = arg;
	struct zpipe *zp = wk->zp;

	pthread_mutex_lock(&zp->lock);
	for (;;) {
		struct zp_slot *s;

		while (!zp->stop && zp->handed == zp->submitted)
			pthread_cond_wait(&zp->work, &zp->lock);
		if (zp->stop)
			break;
		s = &zp->slots[zp->handed++ % zp->nr_slots];
		pthread_mutex_unlock(&zp->lock);
		zp_compress(wk, s);
		pthread_mutex_lock(&zp->lock);
		s->state = SLOT_DONE;
		pthread_cond_broadcast(&zp->finished);
	}
	pthread_mutex_unlock(&zp->lock);
	return NULL;
}

/* The oldest file, complete: its extents, or raw blocks if none saved one. */
static void zp_file_finish(struct zpipe *zp, struct zp_file *f)
{
	struct meta_inode *inode = f->inode;

	if (f->ext && f->blocks < DIV_ROUND_UP(f->size, BLK)) {
		inode->zextents = f->ext;
		inode->nr_zextents = f->nr_ext;
		inode->zalgorithm = zp->zalgorithm;
		f->ext = NULL;
	}
	zp->head = f->next;
	if (!zp->head)
		zp->tail = &zp->head;
	free(f->ext);
	free(f);
}

/* Lay out the oldest extent in flight, waiting for its compression. */
static int zp_lay_out(struct zpipe *zp)
{
	struct zp_slot *s = &zp->slots[zp->done % zp->nr_slots];
	struct zp_file *f = s->file;
	uint32_t nr = 0, got = 0;
	int ret;

	pthread_mutex_lock(&zp->lock);
	while (s->state != SLOT_DONE)
		pthread_cond_wait(&zp->finished, &zp->lock);
	pthread_mutex_unlock(&zp->lock);
	ret = s->err;
	if (!ret) {
		got = meta_zextent_put(s->raw, s->len, s->z, s->zlen, s->lcn,
				       zp->blocks, zp->out,
				       f->ext ? f->ext + f->nr_ext : zp->plain_ext,
				       &nr);
		ret = pwrite_full(zp->fd, zp->out, (size_t)got * BLK,
				  (uint64_t)zp->blocks * BLK);
	}
	if (!ret) {
		if (s->first)
			f->inode->embedded_blkaddr = zp->blocks;
		zp->blocks += got;
		zp->reserved -= DIV_ROUND_UP(s->len, BLK) - got;
		f->blocks += got;
		if (f->ext)
			f->nr_ext += nr;
		if (s->last)
			zp_file_finish(zp, f);
	}
	s->state = SLOT_FREE;
	s->file = NULL;
	zp->done++;
	return ret;
}

/* The slot for the next extent, laying out the oldest while it is busy. */
static int zp_slot(struct zpipe *zp, struct zp_slot **out)
{
	struct zp_slot *s;
	int ret;

	while (zp->submitted - zp->done == zp->nr_slots) {
		ret = zp_lay_out(zp);
		if (ret)
			return ret;
	}
	s = &zp->slots[zp->submitted % zp->nr_slots];
	if (!s->raw) {
		s->raw = malloc(EXTENT);
		s->z = malloc(EXTENT);
		if (!s->raw || !s->z)
			return -ENOMEM;
	}
	*out = s;
	return 0;
}

static void zp_submit(struct zpipe *zp, struct zp_slot *s)
{
	s->state = SLOT_QUEUED;
	s->err = 0;
	if (!zp->nr_threads) {
		zp->submitted++;
		zp->handed++;
		zp_compress(&zp->workers[0], s);
		s->state = SLOT_DONE;
		return;
	}
	pthread_mutex_lock(&zp->lock);
	zp->submitted++;
	pthread_cond_signal(&zp->work);
	pthread_mutex_unlock(&zp->lock);
}

int zpipe_add(struct zpipe *zp, struct meta_inode *inode, uint64_t size,
	      bool compress, const struct file_source *src, const char *path)
{
	uint64_t raw = DIV_ROUND_UP(size, BLK), off = 0;
	struct zp_file *f;
	int ret = 0;

	inode->size = size;
	inode->embedded = true;
	inode->embedded_blkaddr = 0;
	if (!size)
		return 0;
	/* Block numbers are 32 bits; half of that space is plenty. */
	if (zp->reserved + raw > UINT32_MAX / 2) {
		ferry_err("%s: the layer's data exceeds 8 TiB, more than a native EROFS layer holds",
			  path);
		return -EFBIG;
	}
	f = calloc(1, sizeof(*f));
	if (!f)
		return -ENOMEM;
	f->inode = inode;
	f->size = size;
	*zp->tail = f;
	zp->tail = &f->next;
	if (compress && size > BLK) {
		f->ext = calloc(raw, sizeof(*f->ext));
		if (!f->ext)
			return -ENOMEM;
	}
	zp->reserved += raw;
	while (off < size) {
		struct zp_slot *s;

		ret = zp_slot(zp, &s);
		if (ret)
			return ret;
		s->file = f;
		s->len = (size_t)MIN(size - off, (uint64_t)EXTENT);
		s->lcn = (uint32_t)(off / BLK);
		s->first = !off;
		s->last = off + s->len == size;
		ret = src->read(src->ctx, s->raw, s->len);
		if (ret) {
			s->file = NULL;
			return ret;
		}
		off += s->len;
		zp_submit(zp, s);
	}
	return 0;
}

int zpipe_flush(struct zpipe *zp, uint32_t *blocks)
{
	int ret = 0;

	while (!ret && zp->done < zp->submitted)
		ret = zp_lay_out(zp);
	*blocks = zp->blocks;
	return ret;
}

int zpipe_reserve(struct zpipe *zp, uint32_t nr, uint32_t *start)
{
	int ret = zpipe_flush(zp, start);

	if (!ret && zp->reserved + nr > UINT32_MAX / 2) {
		ferry_err("the layer's data exceeds 8 TiB, more than a native EROFS layer holds");
		ret = -EFBIG;
	}
	if (!ret) {
		zp->blocks += nr;
		zp->reserved += nr;
	}
	return ret;
}

int zpipe_new(enum meta_zalgorithm algorithm, int level, unsigned int jobs,
	      int fd, struct zpipe **out)
{
	struct zpipe *zp = calloc(1, sizeof(*zp));
	int ret = 0;

	if (!zp)
		return -ENOMEM;
	pthread_mutex_init(&zp->lock, NULL);
	pthread_cond_init(&zp->work, NULL);
	pthread_cond_init(&zp->finished, NULL);
	zp->zalgorithm = (uint8_t)algorithm;
	zp->level = level;
	zp->fd = fd;
	zp->tail = &zp->head;
	if (!jobs)
		jobs = online_cpus(BLOB_WRITER_JOBS_MAX);
	/* With one job, the caller's thread compresses: no workers. */
	zp->nr_slots = jobs > 1 ? SLOTS_PER_JOB * jobs : 1;
	zp->slots = calloc(zp->nr_slots, sizeof(*zp->slots));
	zp->workers = calloc(jobs, sizeof(*zp->workers));
	zp->out = malloc(EXTENT);
	if (!zp->slots || !zp->workers || !zp->out)
		ret = -ENOMEM;
	for (uint32_t i = 0; !ret && i < jobs; i++) {
		zp->workers[i].zp = zp;
		zp->workers[i].lzma = (lzma_stream)LZMA_STREAM_INIT;
	}
	while (!ret && jobs > 1 && zp->nr_threads < jobs) {
		struct zp_worker *wk = &zp->workers[zp->nr_threads];

		ret = -pthread_create(&wk->thread, NULL, zp_worker, wk);
		if (!ret)
			zp->nr_threads++;
	}
	if (ret) {
		ferry_err("starting %u compression threads: %s", jobs,
			  ferry_strerror(ret));
		zpipe_free(zp);
		return ret;
	}
	*out = zp;
	return 0;
}

void zpipe_free(struct zpipe *zp)
{
	if (!zp)
		return;
	pthread_mutex_lock(&zp->lock);
	zp->stop = true;
	pthread_cond_broadcast(&zp->work);
	pthread_mutex_unlock(&zp->lock);
	for (uint32_t i = 0; i < zp->nr_threads; i++)
		pthread_join(zp->workers[i].thread, NULL);
	for (uint32_t i = 0; zp->workers && i < MAX(zp->nr_threads, 1u); i++) {
		lzma_end(&zp->workers[i].lzma);
		if (zp->workers[i].zlib_ready)
			deflateEnd(&zp->workers[i].zlib);
	}
	while (zp->head) {
		struct zp_file *f = zp->head;

		zp->head = f->next;
		free(f->ext);
		free(f);
	}
	for (uint32_t i = 0; zp->slots && i < zp->nr_slots; i++) {
		free(zp->slots[i].raw);
		free(zp->slots[i].z);
	}
	pthread_cond_destroy(&zp->work);
	pthread_cond_destroy(&zp->finished);
	pthread_mutex_destroy(&zp->lock);
	free(zp->workers);
	free(zp->slots);
	free(zp->out);
	free(zp);
}
