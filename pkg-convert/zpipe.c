// SPDX-License-Identifier: MIT
/*
 * The file data of a native EROFS layer (erofslayers.c), laid out in the
 * order the files arrive: each file a run of blocks after the previous
 * one, read an extent (1 MiB) at a time. Extents are compressed on worker
 * threads, each on its own (a codec context reset per extent), and laid
 * out strictly in submission order on the caller's thread
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
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

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

struct zpipe {
	struct blob_compress codec;
	uint8_t zalgorithm;
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
	pthread_t *threads;
	uint32_t nr_threads;
	bool stop;
};

static void zp_compress(const struct zpipe *zp, struct zp_slot *s)
{
	enum blob_codec used;
	int ret;

	s->zlen = 0;
	/* One lcluster cannot be compressed (no room for its CBLKCNT). */
	if (!s->file->ext || s->len <= BLK)
		return;
	ret = blob_compress(&zp->codec, s->raw, s->len, s->z, EXTENT, &s->zlen,
			    &used);
	if (ret < 0)
		s->err = ret;
	else if (used == BLOB_CODEC_NONE)
		s->zlen = 0;
}

static void *zp_worker(void *arg)
{
	struct zpipe *zp = arg;

	pthread_mutex_lock(&zp->lock);
	for (;;) {
		struct zp_slot *s;

		while (!zp->stop && zp->handed == zp->submitted)
			pthread_cond_wait(&zp->work, &zp->lock);
		if (zp->stop)
			break;
		s = &zp->slots[zp->handed++ % zp->nr_slots];
		pthread_mutex_unlock(&zp->lock);
		zp_compress(zp, s);
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
		zp_compress(zp, s);
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

int zpipe_new(const struct blob_compress *codec, unsigned int jobs, int fd,
	      struct zpipe **out)
{
	struct zpipe *zp = calloc(1, sizeof(*zp));
	int ret = 0;

	if (!zp)
		return -ENOMEM;
	pthread_mutex_init(&zp->lock, NULL);
	pthread_cond_init(&zp->work, NULL);
	pthread_cond_init(&zp->finished, NULL);
	zp->codec = *codec;
	zp->zalgorithm = codec->codec == BLOB_CODEC_ZSTD ? META_Z_ZSTD : META_Z_LZ4;
	zp->fd = fd;
	zp->tail = &zp->head;
	if (!jobs)
		jobs = online_cpus(BLOB_WRITER_JOBS_MAX);
	/* With one job, the caller's thread compresses: no workers. */
	zp->nr_slots = jobs > 1 ? SLOTS_PER_JOB * jobs : 1;
	zp->slots = calloc(zp->nr_slots, sizeof(*zp->slots));
	zp->threads = calloc(jobs, sizeof(*zp->threads));
	zp->out = malloc(EXTENT);
	if (!zp->slots || !zp->threads || !zp->out)
		ret = -ENOMEM;
	while (!ret && jobs > 1 && zp->nr_threads < jobs) {
		ret = -pthread_create(&zp->threads[zp->nr_threads], NULL,
				      zp_worker, zp);
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
		pthread_join(zp->threads[i], NULL);
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
	free(zp->threads);
	free(zp->slots);
	free(zp->out);
	free(zp);
}
