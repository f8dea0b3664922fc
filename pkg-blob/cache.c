// SPDX-License-Identifier: MIT
/*
 * The persistent chunk cache: per blob a sparse data file holding the
 * blob's uncompressed address space and a map file with one state byte
 * per chunk (docs/FORMAT.md, "Chunk cache").
 *
 * Ordering is what makes it crash-safe: a chunk's bytes are written and
 * fdatasync'ed before its state byte is set, so a mark never points at
 * bytes that are not there. The mark itself is not fsync'ed: losing it in
 * a power cut only costs fetching the frame again. A chunk's region of
 * the data file only ever holds zeros or that chunk's verified bytes.
 *
 * Locking, outermost first:
 * - flock(LOCK_SH) on the map by every handle, LOCK_EX by whoever removes
 *   or replaces the files (gc, repair of a damaged map);
 * - flock(LOCK_EX) on the data file while (re)creating the pair, so two
 *   creators do not race;
 * - in a process, a mutex + condvar and an in-flight flag per frame, so
 *   threads sharing a handle never fetch the same frame twice;
 * - between handles (other processes, or a second handle of this one), an
 *   open-file-description write lock over the map bytes of the frames
 *   being filled, taken in ascending order one group at a time, with the
 *   marks read again once it is held.
 * Readers check the in-memory marks without a lock. Only eviction
 * (cache_evict_open) takes a mark back, and it does so under the
 * process's readers lock in write mode (blob_cache_read_begin), with the
 * frames claimed as in flight and, across processes, the map's users
 * byte write-locked: nobody else has the blob open then.
 *
 * Eviction of open blobs' frames is cache_evict.c; records, listing, gc,
 * verify and the size limit are cache_records.c, cache_gc.c,
 * cache_verify.c and cache_limit.c: they share only the file layout, the
 * map header and the map's locks (cache_files.c, internal.h) with the
 * fill path here.
 */
#include "internal.h"
#include "../pkg-base/base.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

/* At most this many compressed bytes are claimed by one thread at once. */
#define CLAIM_MAX (4 * (uint64_t)BLOB_CACHE_RUN_MAX)
/* Opening retries while other handles replace or remove the files. */
#define OPEN_ATTEMPTS 8

pthread_mutex_t cache_registry_lock = PTHREAD_MUTEX_INITIALIZER;
struct blob_cache_blob *cache_registry;
uint64_t cache_filled_total;

/* Readers of the data files against eviction (blob_cache_read_begin). */
static pthread_rwlock_t readers_lock;
static pthread_once_t readers_once = PTHREAD_ONCE_INIT;

static void readers_init(void)
{
	pthread_rwlockattr_t a;

	/* A waiting evictor holds back new readers: readers never starve it. */
	pthread_rwlockattr_init(&a);
	pthread_rwlockattr_setkind_np(&a,
		PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
	pthread_rwlock_init(&readers_lock, &a);
	pthread_rwlockattr_destroy(&a);
}

void blob_cache_read_begin(void)
{
	pthread_once(&readers_once, readers_init);
	pthread_rwlock_rdlock(&readers_lock);
}

void blob_cache_read_end(void)
{
	pthread_rwlock_unlock(&readers_lock);
}

void cache_readers_exclude(void)
{
	pthread_once(&readers_once, readers_init);
	pthread_rwlock_wrlock(&readers_lock);
}

uint64_t blob_cache_filled(void)
{
	return __atomic_load_n(&cache_filled_total, __ATOMIC_RELAXED);
}

/*
 * Frames @fa..@fb are used now: one store per frame whose stamp moves.
 * For a blob the kernel reads, the fence orders the stamps before the
 * caller's look at the marks; evict_blob clears marks, fences, then looks
 * at the stamps, so one of the two sees the other (a kernel reader allowed
 * in after a present check holds no lock that could keep the evictor out;
 * other readers hold the readers lock instead).
 */
static void touch_frames(const struct blob_cache_blob *b, uint32_t fa,
			 uint32_t fb)
{
	uint32_t now = cache_clock_ms(), fr;

	for (fr = fa; fr <= fb; fr++)
		if (__atomic_load_n(&b->stamp[fr], __ATOMIC_RELAXED) != now)
			__atomic_store_n(&b->stamp[fr], now, __ATOMIC_RELAXED);
	if (__atomic_load_n(&b->kernel_reads, __ATOMIC_RELAXED))
		__atomic_thread_fence(__ATOMIC_SEQ_CST);
}

/* ------------------------------------------------------------------ */
/* Opening                                                             */
/* ------------------------------------------------------------------ */

static int bad_table(const struct blob_cache_blob *b, uint32_t i,
		     const char *why)
{
	ferry_err("chunk cache: blob sha256:%s: chunk %u of its chunk table is unusable: %s",
		  b->hex, i, why);
	return -EINVAL;
}

static bool ends_frame(const struct blob_chunk *c)
{
	return c->frame_off + c->usize == c->frame_usize;
}

/*
 * Group the chunks into frames, checking what the fill path relies on
 * (the table normally comes from blob_table_decode, which checks more).
 */
static int index_frames(struct blob_cache_blob *b)
{
	const struct blob_info *info = b->info;
	uint64_t prev_end = 0;
	uint32_t i, nf = 0;

	if (info->uncompressed_size % BLOB_SLOT_ALIGN)
		return bad_table(b, 0, "uncompressed size not 4 KiB aligned");
	if (info->nr_chunks && !info->chunks)
		return bad_table(b, 0, "no chunk table");
	b->frames = malloc(MAX(info->nr_chunks, 1u) * sizeof(*b->frames));
	b->chunk_frame = malloc(MAX(info->nr_chunks, 1u) *
				sizeof(*b->chunk_frame));
	if (!b->frames || !b->chunk_frame)
		return -ENOMEM;
	for (i = 0; i < info->nr_chunks; i++) {
		const struct blob_chunk *c = &info->chunks[i];

		if (!c->usize || c->usize > BLOB_CHUNK_MAX ||
		    c->uoff % BLOB_SLOT_ALIGN || c->uoff < prev_end ||
		    c->uoff > info->uncompressed_size ||
		    c->usize > info->uncompressed_size - c->uoff)
			return bad_table(b, i, "slot out of order or range");
		prev_end = c->uoff + c->usize;
		if (!c->frame_usize || c->frame_usize > BLOB_FRAME_MAX ||
		    c->frame_off > c->frame_usize ||
		    c->usize > c->frame_usize - c->frame_off || !c->csize ||
		    c->csize > BLOB_FRAME_MAX || c->coff > UINT64_MAX - c->csize)
			return bad_table(b, i, "frame fields out of range");
		if (!c->frame_off) {
			if (nf && !ends_frame(c - 1))
				return bad_table(b, i - 1, "frame ends early");
			b->frames[nf++] = (struct cache_frame){ .first = i, .count = 1 };
		} else {
			const struct blob_chunk *p = i ? c - 1 : NULL;

			/* A stream blob's chunks may have gaps (tar headers). */
			bool gaps = info->flags & BLOB_INFO_STREAM;

			if (!p || p->coff != c->coff || p->csize != c->csize ||
			    p->codec != c->codec ||
			    p->frame_usize != c->frame_usize ||
			    p->frame_skip != c->frame_skip ||
			    (gaps ? c->frame_off < p->frame_off + p->usize :
				    c->frame_off != p->frame_off + p->usize))
				return bad_table(b, i, "frame members disagree");
			b->frames[nf - 1].count++;
		}
		b->chunk_frame[i] = nf - 1;
	}
	if (nf && !ends_frame(&info->chunks[i - 1]))
		return bad_table(b, i - 1, "frame ends early");
	b->nr_frames = nf;
	b->inflight = calloc(MAX(nf, 1u), 1);
	b->stamp = calloc(MAX(nf, 1u), sizeof(*b->stamp));
	b->present = calloc(MAX(info->nr_chunks, 1u), 1);
	if (!b->inflight || !b->stamp || !b->present)
		return -ENOMEM;
	touch_frames(b, 0, nf ? nf - 1 : 0);
	return 0;
}

/*
 * Create (or, with @replace, recreate) the data file and a map saying no
 * chunk is present. -EAGAIN when another opener created the files first
 * (the caller opens them again). Without @replace no map exists, so no
 * handle uses the data file; with it the caller holds LOCK_EX on the
 * map being replaced. Either way emptying the data file is safe.
 */
static int make_files(struct blob_cache_blob *b, bool replace)
{
	const struct blob_info *info = b->info;
	size_t len = CACHE_MAP_HEADER_SIZE + (size_t)info->nr_chunks;
	uint8_t *map = NULL;
	struct stat st;
	int fd, ret;

	fd = open(b->data_path,
		  O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0) {
		ret = -errno;
		ferry_err("chunk cache: cannot create %s: %s", b->data_path,
			  ferry_strerror(ret));
		return ret;
	}
	ret = cache_flock(fd, LOCK_EX);
	if (ret || fstat(fd, &st)) {
		ret = ret ? ret : -errno;
		ferry_err("chunk cache: %s: %s", b->data_path,
			  ferry_strerror(ret));
		goto out;
	}
	if (!st.st_nlink) {
		ret = -EAGAIN; /* gc removed it meanwhile */
		goto out;
	}
	if (!replace) {
		if (!lstat(b->map_path, &st)) {
			ret = -EAGAIN; /* another opener was faster */
			goto out;
		}
		if (errno != ENOENT) {
			ret = -errno;
			ferry_err("chunk cache: %s: %s", b->map_path,
				  ferry_strerror(ret));
			goto out;
		}
	}
	/*
	 * Truncating to 0 first drops the blocks of stale chunks; the fsync
	 * makes that durable before a map saying "all missing" exists, as a
	 * chunk of zeros is marked without writing anything.
	 */
	if (ftruncate(fd, 0) ||
	    ftruncate(fd, (off_t)info->uncompressed_size) || fsync(fd)) {
		ret = -errno;
		ferry_err("chunk cache: cannot size %s to %llu bytes: %s",
			  b->data_path,
			  (unsigned long long)info->uncompressed_size,
			  ferry_strerror(ret));
		goto out;
	}
	map = calloc(1, len);
	if (!map) {
		ret = -ENOMEM;
		goto out;
	}
	cache_map_header_encode(info, map);
	ret = write_file_atomic(b->dir_path, strrchr(b->map_path, '/') + 1,
				 map, len, 0600);
out:
	free(map);
	close(fd);
	return ret;
}

/*
 * Check the map at @fd against the blob and load its marks, then open the
 * data file. -EFSCORRUPTED with *@why set when the files are damaged.
 */
static int load_files(struct blob_cache_blob *b, int fd, const char **why)
{
	const struct blob_info *info = b->info;
	uint8_t h[CACHE_MAP_HEADER_SIZE];
	struct cache_map_header mh;
	struct stat st;
	uint32_t i;
	int ret;

	if (fstat(fd, &st))
		return -errno;
	if ((uint64_t)st.st_size !=
	    CACHE_MAP_HEADER_SIZE + (uint64_t)info->nr_chunks) {
		*why = "map file has the wrong size";
		return -EFSCORRUPTED;
	}
	ret = pread_full(fd, h, sizeof(h), 0);
	if (ret)
		return ret;
	ret = cache_map_header_decode(h, &mh, why);
	if (ret)
		return ret;
	if (mh.nr_chunks != info->nr_chunks ||
	    mh.uncompressed_size != info->uncompressed_size ||
	    memcmp(mh.digest, info->digest, BLOB_DIGEST_SIZE) ||
	    memcmp(mh.table_sha256, info->table_sha256, BLOB_DIGEST_SIZE)) {
		*why = "map header describes a different blob or table";
		return -EFSCORRUPTED;
	}
	ret = pread_full(fd, b->present, info->nr_chunks,
			 CACHE_MAP_HEADER_SIZE);
	if (ret)
		return ret;
	b->present_chunks = 0;
	b->present_bytes = 0;
	for (i = 0; i < info->nr_chunks; i++) {
		if (b->present[i] > CACHE_STATE_PRESENT) {
			*why = "invalid chunk state byte";
			return -EFSCORRUPTED;
		}
		if (b->present[i]) {
			b->present_chunks++;
			b->present_bytes += info->chunks[i].usize;
		}
	}
	b->data_fd = open(b->data_path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
	if (b->data_fd < 0) {
		if (errno == ENOENT) {
			*why = "data file missing";
			return -EFSCORRUPTED;
		}
		return -errno;
	}
	if (fstat(b->data_fd, &st))
		return -errno;
	if ((uint64_t)st.st_size != info->uncompressed_size) {
		*why = "data file has the wrong size";
		return -EFSCORRUPTED;
	}
	return 0;
}

/* One attempt at opening; -EAGAIN when the files changed underneath. */
static int open_files(struct blob_cache_blob *b)
{
	const char *why = NULL;
	struct stat st;
	int fd, ret;

	fd = open(b->map_path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		ret = -errno;
		if (ret != -ENOENT) {
			ferry_err("chunk cache: cannot open %s: %s",
				  b->map_path, ferry_strerror(ret));
			return ret;
		}
		ret = make_files(b, false);
		return ret ? ret : -EAGAIN;
	}
	ret = cache_flock(fd, LOCK_SH);
	if (!ret && fstat(fd, &st))
		ret = -errno;
	if (ret) {
		ferry_err("chunk cache: %s: %s", b->map_path,
			  ferry_strerror(ret));
		goto fail;
	}
	if (!st.st_nlink) {
		ret = -EAGAIN; /* removed or replaced before we locked it */
		goto fail;
	}
	/* Before the marks are read: an evictor elsewhere finishes first. */
	ret = cache_users_lock(fd, F_RDLCK, true);
	if (ret) {
		ferry_err("chunk cache: %s: cannot lock its users byte: %s",
			  b->map_path, ferry_strerror(ret));
		goto fail;
	}
	ret = load_files(b, fd, &why);
	if (!ret) {
		b->map_fd = fd;
		return 0;
	}
	if (b->data_fd >= 0) {
		close(b->data_fd);
		b->data_fd = -1;
	}
	if (ret != -EFSCORRUPTED) {
		ferry_err("chunk cache: reading %s or its data file: %s",
			  b->map_path, ferry_strerror(ret));
		goto fail;
	}
	/* Damaged: replace it, unless someone else uses the blob. */
	if (cache_flock(fd, LOCK_EX | LOCK_NB)) {
		ferry_err("chunk cache: %s: %s, and the blob is in use by another handle",
			  b->map_path, why);
		ret = -EFSCORRUPTED;
		goto fail;
	}
	if (fstat(fd, &st) || !st.st_nlink) {
		ret = -EAGAIN;
		goto fail;
	}
	ferry_warn("chunk cache: %s: %s; discarding the cached chunks of blob sha256:%s",
		   b->map_path, why, b->hex);
	ret = make_files(b, true);
	if (!ret)
		ret = -EAGAIN;
fail:
	close(fd);
	return ret;
}

/*
 * Keep the blob's chunk table next to its map, once: blob_cache_verify
 * needs each chunk's sha256 without the image at hand.
 */
static int record_index(const struct blob_cache_blob *b)
{
	char name[CACHE_HEX_LEN + sizeof(CACHE_INDEX_SUFFIX)], *path = NULL;
	void *buf = NULL;
	struct stat st;
	size_t len;
	int ret;

	snprintf(name, sizeof(name), "%s" CACHE_INDEX_SUFFIX, b->hex);
	if (asprintf(&path, "%s/%s", b->dir_path, name) < 0)
		return -ENOMEM;
	ret = lstat(path, &st) ? -errno : 0;
	if (ret == -ENOENT)
		ret = blob_index_encode(b->info, 1, &buf, &len);
	if (!ret && buf)
		ret = write_file_atomic(b->dir_path, name, buf, len, 0600);
	free(buf);
	free(path);
	return ret;
}

/* The registry's blob for @info in @dir_path, with a reference, or NULL. */
static struct blob_cache_blob *registry_get(const char *dir_path,
					    const struct blob_info *info)
{
	struct blob_cache_blob *b;

	for (b = cache_registry; b; b = b->next)
		if (b->pid == getpid() && !strcmp(b->dir_path, dir_path) &&
		    !memcmp(b->own.digest, info->digest, BLOB_DIGEST_SIZE) &&
		    !memcmp(b->own.table_sha256, info->table_sha256,
			    BLOB_DIGEST_SIZE)) {
			b->refs++;
			return b;
		}
	return NULL;
}

static void blob_free(struct blob_cache_blob *b)
{
	if (b->data_fd >= 0)
		close(b->data_fd);
	if (b->map_fd >= 0)
		close(b->map_fd); /* drops the flock and the users lock */
	pthread_mutex_destroy(&b->lock);
	pthread_cond_destroy(&b->done);
	free(b->own.chunks);
	free(b->frames);
	free(b->chunk_frame);
	free(b->present);
	free(b->inflight);
	free(b->stamp);
	blob_stream_learned_free(b->learned);
	free(b->dir_path);
	free(b->data_path);
	free(b->map_path);
	free(b);
}

int blob_cache_open(const char *cache_dir, const struct blob_info *info,
		    struct blob_cache_blob **out)
{
	static const uint8_t zero[BLOB_DIGEST_SIZE];
	struct blob_cache_blob *b;
	char *dir_path;
	int attempt, ret;

	*out = NULL;
	if (!memcmp(info->digest, zero, BLOB_DIGEST_SIZE)) {
		ferry_err("chunk cache: a blob without a known digest cannot be cached");
		return -EINVAL;
	}
	if (asprintf(&dir_path, "%s/" CACHE_BLOBS_DIR, cache_dir) < 0)
		return -ENOMEM;
	/* Held while the files open and their marks load: see evict_blob. */
	pthread_mutex_lock(&cache_registry_lock);
	b = registry_get(dir_path, info);
	if (b) {
		pthread_mutex_unlock(&cache_registry_lock);
		free(dir_path);
		*out = b;
		return 0;
	}
	b = calloc(1, sizeof(*b));
	if (!b) {
		pthread_mutex_unlock(&cache_registry_lock);
		free(dir_path);
		return -ENOMEM;
	}
	b->dir_path = dir_path;
	b->own = *info;
	b->own.chunks = NULL;
	b->info = &b->own;
	b->data_fd = b->map_fd = -1;
	hex_encode(info->digest, BLOB_DIGEST_SIZE, b->hex);
	pthread_mutex_init(&b->lock, NULL);
	pthread_cond_init(&b->done, NULL);
	ret = -ENOMEM;
	if (info->nr_chunks) {
		b->own.chunks = malloc((size_t)info->nr_chunks *
				       sizeof(*info->chunks));
		if (!b->own.chunks)
			goto fail;
		memcpy(b->own.chunks, info->chunks,
		       (size_t)info->nr_chunks * sizeof(*info->chunks));
	}
	ret = index_frames(b);
	if (!ret && (info->flags & BLOB_INFO_STREAM))
		ret = blob_stream_learned_new(&b->learned);
	if (ret)
		goto fail;
	ret = -ENOMEM;
	if (asprintf(&b->data_path, "%s/%s.data", b->dir_path, b->hex) < 0) {
		b->data_path = NULL;
		goto fail;
	}
	if (asprintf(&b->map_path, "%s/%s.map", b->dir_path, b->hex) < 0) {
		b->map_path = NULL;
		goto fail;
	}
	ret = blob_cache_dir(cache_dir, CACHE_BLOBS_DIR, true, NULL);
	if (ret)
		goto fail;
	for (attempt = 0;; attempt++) {
		if (attempt == OPEN_ATTEMPTS) {
			ferry_err("chunk cache: %s keeps being replaced or removed; giving up",
				  b->map_path);
			ret = -EAGAIN;
			goto fail;
		}
		ret = open_files(b);
		if (ret != -EAGAIN)
			break;
	}
	if (!ret)
		ret = record_index(b);
	if (ret)
		goto fail;
	b->refs = 1;
	b->pid = getpid();
	b->next = cache_registry;
	cache_registry = b;
	pthread_mutex_unlock(&cache_registry_lock);
	*out = b;
	return 0;
fail:
	pthread_mutex_unlock(&cache_registry_lock);
	blob_free(b);
	return ret;
}

void blob_cache_close(struct blob_cache_blob *b)
{
	struct blob_cache_blob **p;

	if (!b)
		return;
	pthread_mutex_lock(&cache_registry_lock);
	if (--b->refs) {
		pthread_mutex_unlock(&cache_registry_lock);
		return;
	}
	for (p = &cache_registry; *p != b; p = &(*p)->next)
		;
	*p = b->next;
	pthread_mutex_unlock(&cache_registry_lock);
	blob_free(b);
}

const char *blob_cache_data_path(const struct blob_cache_blob *b)
{
	return b->data_path;
}

int blob_cache_data_fd(const struct blob_cache_blob *b)
{
	return b->data_fd;
}

bool blob_cache_chunk_present(const struct blob_cache_blob *b, uint32_t index)
{
	return index < b->info->nr_chunks &&
	       __atomic_load_n(&b->present[index], __ATOMIC_ACQUIRE);
}

void blob_cache_usage(const struct blob_cache_blob *b, uint32_t *chunks,
		      uint64_t *bytes)
{
	if (chunks)
		*chunks = __atomic_load_n(&b->present_chunks, __ATOMIC_RELAXED);
	if (bytes)
		*bytes = __atomic_load_n(&b->present_bytes, __ATOMIC_RELAXED);
}

/* ------------------------------------------------------------------ */
/* Filling                                                             */
/* ------------------------------------------------------------------ */

/* One ensure call's working state. */
struct fill {
	const struct blob_source *src;
	uint64_t *fetched;
	uint32_t i0, i1;      /* requested chunks, inclusive */
	uint32_t w0, w1;      /* filled: i0 .. i1, or more (see ensure) */
	uint32_t c0;          /* chunk whose mark is marks[0] */
	uint8_t *marks;       /* map bytes of the group being filled */
	size_t marks_cap;
	uint8_t *run;         /* compressed bytes of one run */
	size_t run_cap;
	uint8_t *frame;       /* one decoded frame */
	size_t frame_cap;
	size_t mem;           /* of the fill budget held for run and frame */
	struct blob_stream_reader *reader; /* stream blobs, made on first use */
	/* A stream blob's run starts at this learned point (has_start). */
	bool has_start;
	struct blob_stream_point start;
	uint8_t start_window[BLOB_STREAM_WINDOW];
};

/*
 * The buffers of every fill in the process (a run of compressed bytes and
 * a decoded frame) count against one budget: with 64 MiB chunks, eight
 * reads at once held 531 MB in ferryd. A fill whose buffers would take the
 * total over FILL_MEM_MAX waits until others are done; one alone always
 * proceeds, so a chunk of any size convert allows (BLOB_CHUNK_MAX) can be
 * filled. Fills of 1 MiB chunks (runs of at most BLOB_CACHE_RUN_MAX) never
 * come near it.
 */
#define FILL_MEM_MAX ((size_t)128 << 20)
static pthread_mutex_t fill_mem_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t fill_mem_cond = PTHREAD_COND_INITIALIZER;
static size_t fill_mem_used;

static void fill_mem_put(struct fill *f)
{
	if (!f->mem)
		return;
	pthread_mutex_lock(&fill_mem_lock);
	fill_mem_used -= f->mem;
	pthread_cond_broadcast(&fill_mem_cond);
	pthread_mutex_unlock(&fill_mem_lock);
	f->mem = 0;
}

/* Room in the budget for @need bytes of @f's buffers (@f holds none). */
static void fill_mem_get(struct fill *f, size_t need)
{
	pthread_mutex_lock(&fill_mem_lock);
	while (fill_mem_used && fill_mem_used + need > FILL_MEM_MAX)
		pthread_cond_wait(&fill_mem_cond, &fill_mem_lock);
	fill_mem_used += need;
	pthread_mutex_unlock(&fill_mem_lock);
	f->mem = need;
}

/* Does frame @fr hold a requested chunk that is missing? */
static bool frame_needed(const struct blob_cache_blob *b,
			 const struct fill *f, uint32_t fr)
{
	uint32_t i = MAX(b->frames[fr].first, f->w0);
	uint32_t end = MIN(b->frames[fr].first + b->frames[fr].count - 1,
			   f->w1);

	for (; i <= end; i++)
		if (!blob_cache_chunk_present(b, i))
			return true;
	return false;
}

/*
 * Read the marks of chunks @c0 .. @c0 + @n - 1 into f->marks and take
 * over every present one (another handle may have filled it).
 */
static int refresh_marks(struct blob_cache_blob *b, struct fill *f,
			 uint32_t c0, uint32_t n)
{
	uint32_t i;
	int ret;

	ret = blob_buf_reserve(&f->marks, &f->marks_cap, n);
	if (ret)
		return ret;
	ret = pread_full(b->map_fd, f->marks, n, CACHE_MAP_HEADER_SIZE + c0);
	if (ret) {
		ferry_err("chunk cache: reading %s: %s", b->map_path,
			  ferry_strerror(ret));
		return ret;
	}
	f->c0 = c0;
	for (i = 0; i < n; i++) {
		if (f->marks[i] == CACHE_STATE_PRESENT)
			cache_set_present(b, c0 + i);
		else if (blob_cache_chunk_present(b, c0 + i))
			f->marks[i] = CACHE_STATE_PRESENT;
		else
			f->marks[i] = CACHE_STATE_MISSING;
	}
	return 0;
}

/* Lock or unlock the map bytes of chunks @c0 .. @c0 + @n - 1. */
int cache_map_lock(struct blob_cache_blob *b, short type, uint32_t c0, uint32_t n)
{
	struct flock fl = {
		.l_type = type,
		.l_whence = SEEK_SET,
		.l_start = (off_t)(CACHE_MAP_HEADER_SIZE + (uint64_t)c0),
		.l_len = (off_t)n,
	};

	while (fcntl(b->map_fd, type == F_UNLCK ? F_OFD_SETLK : F_OFD_SETLKW,
		     &fl)) {
		int ret = -errno;

		if (ret == -EINTR)
			continue;
		ferry_err("chunk cache: %s: cannot %s chunk marks %u..%u: %s",
			  b->map_path, type == F_UNLCK ? "unlock" : "lock", c0,
			  c0 + n - 1, ferry_strerror(ret));
		return ret;
	}
	return 0;
}

/*
 * Report chunk @i, which came from the source broken: -EIO when it was
 * asked for, 0 for a neighbour in the same frame (it just stays missing).
 */
static int chunk_bad(const struct blob_cache_blob *b, const struct fill *f,
		     uint32_t i, const char *why)
{
	bool asked = i >= f->i0 && i <= f->i1;

	ferry_log(asked ? FERRY_LOG_ERR : FERRY_LOG_WARN,
		  "chunk cache: blob sha256:%s: chunk %u (uncompressed offset %llu) from the source %s; it stays missing",
		  b->hex, i, (unsigned long long)b->info->chunks[i].uoff, why);
	return asked ? -EIO : 0;
}

/*
 * Frames read together: a frame joins a run of compressed bytes
 * [@coff0, *@end) when it starts inside it or at most RUN_GAP_MAX after
 * (a stream blob's frames overlap, several share a resume point, and a
 * plain tar layer's are apart by tar headers: reading those few bytes
 * beats another request) and the run stays within BLOB_CACHE_RUN_MAX.
 * A ferry blob's frames are back to back.
 */
#define RUN_GAP_MAX (64u << 10)

static bool run_join(const struct blob_chunk *q, uint64_t coff0, uint64_t *end,
		     bool onward)
{
	uint64_t qend = MAX(*end, q->coff + q->csize);

	/* @onward: a stream blob's frame is reached by decoding on, whatever
	 * point it would start from. */
	if ((q->coff < coff0 && !onward) || q->coff > *end + RUN_GAP_MAX ||
	    qend - coff0 > BLOB_CACHE_RUN_MAX)
		return false;
	*end = qend;
	return true;
}

/*
 * Decode the frame of @c (its first chunk) from a run: the blob's bytes
 * [@coff0, @coff0 + @len) at @run. A stream blob's frames decode through
 * *@reader (made on first use; reset it for each run), which goes on
 * from one frame of the run to the next.
 */
static int decode_frame(const struct blob_source *src,
			struct blob_stream_reader **reader,
			const struct blob_chunk *c, const uint8_t *run,
			uint64_t coff0, size_t len, uint8_t *out)
{
	int ret;

	if (c->codec != BLOB_CODEC_GZIP_STREAM && c->codec != BLOB_CODEC_ZSTD_STREAM)
		return blob_frame_decode(c, run + (c->coff - coff0), out);
	if (!src->stream)
		return -EFSCORRUPTED;
	if (!*reader) {
		ret = blob_stream_reader_new(reader);
		if (ret)
			return ret;
	}
	return blob_stream_frame_decode(*reader, src->stream, c, run, coff0, len,
					out);
}

/*
 * Fetch frames @fa .. @fb (consecutive in the blob file, needed, ours)
 * with one source read of @len bytes, then write, sync and mark their
 * missing chunks. Returns -EIO when some chunk did not verify (the others
 * are kept), or another -errno when nothing could be kept.
 */
static int fill_run_held(struct blob_cache_blob *b, struct fill *f, uint32_t fa,
			 uint32_t fb, uint64_t coff0, size_t len)
{
	const struct blob_chunk *chunks = b->info->chunks;
	uint32_t c0 = b->frames[fa].first;
	uint32_t c1 = b->frames[fb].first + b->frames[fb].count; /* end */
	uint32_t fr, i;
	bool wrote = false;
	int ret, err = 0;

	ret = blob_buf_reserve_fresh(&f->run, &f->run_cap, len);
	if (ret)
		return ret;
	ret = f->src->read(f->src->ctx, coff0, f->run, len);
	if (ret) {
		ret = ret < 0 ? ret : -EIO;
		ferry_err("chunk cache: blob sha256:%s: reading compressed bytes %llu..%llu (chunks %u..%u) from the source: %s",
			  b->hex, (unsigned long long)coff0,
			  (unsigned long long)(coff0 + len), c0, c1 - 1,
			  ferry_strerror(ret));
		return ret;
	}
	if (f->fetched)
		__atomic_fetch_add(f->fetched, (uint64_t)len, __ATOMIC_RELAXED);
	ferry_dbg("chunk cache: blob sha256:%s: fetched frames %u..%u, %zu bytes at %llu",
		  b->hex, fa, fb, len, (unsigned long long)coff0);
	if (f->reader)
		blob_stream_reader_reset(f->reader);
	if (f->has_start) {
		if (!f->reader && (ret = blob_stream_reader_new(&f->reader)))
			return ret;
		ret = blob_stream_reader_begin(f->reader, f->src->stream, &f->start,
					       f->run, coff0, len);
		if (ret == -ENOMEM)
			return ret;
		/* Else the frames decode from their recorded points. */
	}

	for (fr = fa; fr <= fb; fr++) {
		const struct blob_chunk *c = &chunks[b->frames[fr].first];
		const uint8_t *cdata = f->run + (c->coff - coff0);
		const uint8_t *bytes = cdata;

		if (c->codec != BLOB_CODEC_NONE || c->csize != c->frame_usize) {
			ret = blob_buf_reserve_fresh(&f->frame, &f->frame_cap,
						     c->frame_usize);
			if (ret)
				return ret;
			ret = decode_frame(f->src, &f->reader, c, f->run, coff0,
					   len, f->frame);
			if (ret == -ENOMEM)
				return ret;
			if (ret) {
				/* Named by an asked-for chunk when it holds one. */
				uint32_t first = b->frames[fr].first;

				if (chunk_bad(b, f, MAX(first, MIN(f->i0, first +
								 b->frames[fr].count - 1)),
					      "does not decode"))
					err = -EIO;
				continue;
			}
			bytes = f->frame;
		}
		for (i = b->frames[fr].first;
		     i < b->frames[fr].first + b->frames[fr].count; i++) {
			const struct blob_chunk *ci = &chunks[i];
			const uint8_t *p = bytes + ci->frame_off;

			if (f->marks[i - f->c0] == CACHE_STATE_PRESENT)
				continue;
			if (blob_chunk_verify(ci, p)) {
				if (chunk_bad(b, f, i, "does not match its sha256"))
					err = -EIO;
				continue;
			}
			/* The region is zeros or these very bytes already. */
			if (!mem_is_zero(p, ci->usize)) {
				ret = pwrite_full(b->data_fd, p, ci->usize,
						  ci->uoff);
				if (ret) {
					ferry_err("chunk cache: writing chunk %u of blob sha256:%s to %s: %s",
						  i, b->hex, b->data_path,
						  ferry_strerror(ret));
					return ret;
				}
				wrote = true;
			}
			/* Marked in memory only once the map says so. */
			f->marks[i - f->c0] = CACHE_STATE_PENDING;
		}
	}
	if (f->reader && b->learned)
		blob_stream_reader_learn(f->reader, f->src->stream, b->learned);
	if (wrote && fdatasync(b->data_fd)) {
		ret = -errno;
		ferry_err("chunk cache: fdatasync %s: %s", b->data_path,
			  ferry_strerror(ret));
		return ret;
	}
	/* Pending marks become present in the map... */
	for (i = c0; i < c1; i++)
		if (f->marks[i - f->c0] == CACHE_STATE_PENDING)
			break;
	if (i == c1)
		return err;
	for (; i < c1; i++)
		if (f->marks[i - f->c0] == CACHE_STATE_PENDING)
			f->marks[i - f->c0] = CACHE_STATE_PRESENT;
	ret = pwrite_full(b->map_fd, f->marks + (c0 - f->c0), c1 - c0,
			  CACHE_MAP_HEADER_SIZE + (uint64_t)c0);
	if (ret) {
		ferry_err("chunk cache: writing chunk marks to %s: %s",
			  b->map_path, ferry_strerror(ret));
		return ret;
	}
	/* ...and only then in memory. */
	for (i = c0; i < c1; i++)
		if (f->marks[i - f->c0] == CACHE_STATE_PRESENT)
			cache_set_present(b, i);
	return err;
}

/*
 * fill_run_held with its buffers' room in the fill budget, given back
 * when it returns: a thread holds budget only here, where it waits for
 * nothing another fill of this process holds (the OFD locks of its
 * callers are taken outside), so waiting for the budget cannot deadlock.
 */
static int fill_run(struct blob_cache_blob *b, struct fill *f, uint32_t fa,
		    uint32_t fb, uint64_t coff0, size_t len)
{
	const struct blob_chunk *chunks = b->info->chunks;
	size_t frame_need = 0;
	uint32_t fr;
	int ret;

	for (fr = fa; fr <= fb; fr++) {
		const struct blob_chunk *c = &chunks[b->frames[fr].first];

		if (c->codec != BLOB_CODEC_NONE || c->csize != c->frame_usize)
			frame_need = MAX(frame_need, (size_t)c->frame_usize);
	}
	fill_mem_get(f, len + frame_need);
	ret = fill_run_held(b, f, fa, fb, coff0, len);
	free(f->run);
	free(f->frame);
	f->run = f->frame = NULL;
	f->run_cap = f->frame_cap = 0;
	fill_mem_put(f);
	return ret;
}

/*
 * Fill the needed frames of @fa .. @fb (consecutive frame numbers, all
 * claimed by this thread) under an OFD lock over their marks.
 */
static int fill_group(struct blob_cache_blob *b, struct fill *f, uint32_t fa,
		      uint32_t fb)
{
	const struct blob_chunk *chunks = b->info->chunks;
	uint32_t c0 = b->frames[fa].first;
	uint32_t n = b->frames[fb].first + b->frames[fb].count - c0;
	uint32_t fr, last;
	int ret, err = 0;

	/* Cheap check first: another process may have filled them. */
	ret = refresh_marks(b, f, c0, n);
	if (ret)
		return ret;
	for (fr = fa; fr <= fb && !frame_needed(b, f, fr); fr++)
		;
	if (fr > fb)
		return 0;
	ret = cache_map_lock(b, F_WRLCK, c0, n);
	if (ret)
		return ret;
	ret = refresh_marks(b, f, c0, n);
	if (ret)
		goto out;
	for (fr = fa; fr <= fb; fr = last + 1) {
		const struct blob_chunk *c;
		uint64_t coff0, end;

		last = fr;
		if (!frame_needed(b, f, fr))
			continue;
		c = &chunks[b->frames[fr].first];
		coff0 = c->coff;
		/* A stream blob: from the nearest point this process learned. */
		f->has_start = b->learned &&
			       blob_stream_learned_find(b->learned, f->src->stream, c,
							&f->start, f->start_window);
		if (f->has_start)
			coff0 = f->start.cbit / 8;
		end = MAX(coff0, c->coff + c->csize);
		/* Merge the next needed frames that follow in the file. */
		while (last < fb && frame_needed(b, f, last + 1) &&
		       run_join(&chunks[b->frames[last + 1].first], coff0, &end,
				b->learned))
			last++;
		ret = fill_run(b, f, fr, last, coff0, (size_t)(end - coff0));
		if (ret == -EIO) {
			err = ret; /* bad chunks are logged; go on */
			continue;
		}
		if (ret)
			goto out;
	}
	ret = err;
out:
	err = cache_map_lock(b, F_UNLCK, c0, n);
	return ret ? ret : err;
}

/* Fill the claimed frames @claimed (ascending), group by group. */
static int fill_claimed(struct blob_cache_blob *b, struct fill *f,
			const uint32_t *claimed, uint32_t nr)
{
	uint32_t k = 0, j;
	int ret, err = 0;

	while (k < nr) {
		for (j = k; j + 1 < nr && claimed[j + 1] == claimed[j] + 1; j++)
			;
		ret = fill_group(b, f, claimed[k], claimed[j]);
		if (ret == -EIO)
			err = ret;
		else if (ret)
			return ret;
		k = j + 1;
	}
	return err;
}

/* First chunk whose bytes end after @uoff (nr_chunks if none). */
static uint32_t first_chunk_after(const struct blob_info *info, uint64_t uoff)
{
	uint32_t lo = 0, hi = info->nr_chunks;

	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;
		const struct blob_chunk *c = &info->chunks[mid];

		if (c->uoff + c->usize <= uoff)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/*
 * The chunks overlapping [@uoff, @uoff + @len) (in range) as *@i0..*@i1;
 * false when none does (an empty range, or alignment padding only).
 */
static bool range_chunks(const struct blob_info *info, uint64_t uoff,
			 uint64_t len, uint32_t *i0, uint32_t *i1)
{
	uint64_t end = uoff + len;
	uint32_t i = first_chunk_after(info, uoff);

	if (!len || i == info->nr_chunks || info->chunks[i].uoff >= end)
		return false;
	*i0 = i;
	while (i + 1 < info->nr_chunks && info->chunks[i + 1].uoff < end)
		i++;
	*i1 = i;
	return true;
}

bool blob_cache_range_present(const struct blob_cache_blob *b, uint64_t uoff,
			      uint64_t len)
{
	const struct blob_info *info = b->info;
	uint32_t i, i1;

	if (uoff > info->uncompressed_size || len > info->uncompressed_size - uoff)
		return false;
	if (!range_chunks(info, uoff, len, &i, &i1))
		return true;
	touch_frames(b, b->chunk_frame[i], b->chunk_frame[i1]);
	for (; i <= i1; i++)
		if (!blob_cache_chunk_present(b, i))
			return false;
	return true;
}

/*
 * A stream blob's frames *@fa .. *@fb widened back to the first frame of
 * the resume point they decode from (see ensure), and with @onward to its
 * last one.
 */
static void stream_point_frames(const struct blob_cache_blob *b, uint32_t *fa,
				uint32_t *fb, bool onward)
{
	const struct blob_chunk *chunks = b->info->chunks;

	if (!(b->info->flags & BLOB_INFO_STREAM))
		return;
	while (*fa && chunks[b->frames[*fa - 1].first].coff ==
			      chunks[b->frames[*fa].first].coff)
		(*fa)--;
	while (onward && *fb + 1 < b->nr_frames &&
	       chunks[b->frames[*fb + 1].first].coff == chunks[b->frames[*fb].first].coff)
		(*fb)++;
}

int blob_cache_ensure(struct blob_cache_blob *b, uint64_t uoff, uint64_t len,
		      const struct blob_source *src, uint64_t *fetched)
{
	const struct blob_info *info = b->info;
	struct fill f = { .src = src, .fetched = fetched };
	uint32_t *claimed = NULL;
	uint32_t i, fa, fb, fr, nr;
	int ret = 0;

	if (uoff > info->uncompressed_size ||
	    len > info->uncompressed_size - uoff) {
		ferry_err("chunk cache: blob sha256:%s: range %llu+%llu is outside its %llu bytes",
			  b->hex, (unsigned long long)uoff,
			  (unsigned long long)len,
			  (unsigned long long)info->uncompressed_size);
		return -EINVAL;
	}
	if (!range_chunks(info, uoff, len, &f.i0, &f.i1))
		return 0; /* empty, or padding only */
	touch_frames(b, b->chunk_frame[f.i0], b->chunk_frame[f.i1]);
	for (i = f.i0; i <= f.i1 && blob_cache_chunk_present(b, i); i++)
		;
	if (i > f.i1)
		return 0;

	fa = b->chunk_frame[f.i0];
	fb = b->chunk_frame[f.i1];
	/*
	 * A stream blob's frame decodes from its resume point (or a point
	 * learned since), through the frames before it that share the point:
	 * fill those in the same pass, once (missing ones there move the
	 * start back). Later frames wait for their readers, who fetch from
	 * the point this pass learned at its end, not from the span's start
	 * again (which fetched 3.1x a Debian minbase layer to read it whole).
	 */
	stream_point_frames(b, &fa, &fb, false);
	f.w0 = MIN(f.i0, b->frames[fa].first);
	f.w1 = MAX(f.i1, b->frames[fb].first + b->frames[fb].count - 1);
	claimed = malloc((size_t)(fb - fa + 1) * sizeof(*claimed));
	if (!claimed)
		return -ENOMEM;
	pthread_mutex_lock(&b->lock);
	for (;;) {
		uint64_t claimed_bytes = 0;
		bool waiting = false;

		nr = 0;
		uint64_t busy_point = UINT64_MAX;

		for (fr = fa; fr <= fb && claimed_bytes < CLAIM_MAX; fr++) {
			uint64_t coff = info->chunks[b->frames[fr].first].coff;

			if (!frame_needed(b, &f, fr))
				continue;
			/*
			 * A stream blob's frames after one of the same resume
			 * point in flight wait for it: then they start from the
			 * point its fill learned, not the span's start again.
			 */
			if (b->inflight[fr] || (b->learned && coff == busy_point)) {
				if (b->inflight[fr])
					busy_point = coff;
				waiting = true;
				continue;
			}
			b->inflight[fr] = 1;
			claimed[nr++] = fr;
			claimed_bytes += info->chunks[b->frames[fr].first].csize;
		}
		if (!nr) {
			if (!waiting)
				break; /* everything is present */
			pthread_cond_wait(&b->done, &b->lock);
			continue;
		}
		pthread_mutex_unlock(&b->lock);
		ret = fill_claimed(b, &f, claimed, nr);
		pthread_mutex_lock(&b->lock);
		for (i = 0; i < nr; i++)
			b->inflight[claimed[i]] = 0;
		pthread_cond_broadcast(&b->done);
		if (ret)
			break;
		/* Chunks not asked for are tried once: one that failed stays missing. */
		f.w0 = f.i0;
		f.w1 = f.i1;
	}
	pthread_mutex_unlock(&b->lock);
	/* Used now, not when asked: a fetch may have taken seconds. */
	touch_frames(b, fa, fb);
	free(claimed);
	free(f.marks);
	blob_stream_reader_free(f.reader);
	return ret;
}

/* A 4 KiB-aligned buffer of at least @len bytes (contents not kept). */
static int aligned_reserve(uint8_t **buf, size_t *cap, size_t len)
{
	void *p;

	if (*cap >= len)
		return 0;
	if (posix_memalign(&p, BLOB_SLOT_ALIGN, len))
		return -ENOMEM;
	free(*buf);
	*buf = p;
	*cap = len;
	return 0;
}

/* Frames *@fa.. of the blob whose chunks are all present: their count. */
static uint32_t present_frames(const struct blob_cache_blob *b, uint32_t fa,
			       uint32_t fb, bool present)
{
	uint32_t fr, i;

	for (fr = fa; fr <= fb; fr++) {
		for (i = b->frames[fr].first;
		     i < b->frames[fr].first + b->frames[fr].count &&
		     blob_cache_chunk_present(b, i); i++)
			;
		if ((i == b->frames[fr].first + b->frames[fr].count) != present)
			break;
	}
	return fr - fa;
}

/* Where frame @fr's slots end in the uncompressed address space. */
static uint64_t frame_end(const struct blob_cache_blob *b, uint32_t fr)
{
	uint64_t start, len;

	cache_frame_span(b, fr, &start, &len);
	return start + len;
}

int blob_cache_read_frames(struct blob_cache_blob *b, uint64_t uoff, uint64_t len,
			   const struct blob_source *src, uint64_t *fetched,
			   blob_emit_fn emit, void *ctx)
{
	const struct blob_info *info = b->info;
	const struct blob_chunk *chunks = info->chunks;
	uint8_t *run = NULL, *frame = NULL, *out = NULL;
	size_t run_cap = 0, frame_cap = 0, out_cap = 0;
	struct blob_stream_reader *reader = NULL;
	uint32_t i0, i1, fa, fb, fr, n, i;
	int ret = 0;

	if (uoff > info->uncompressed_size || len > info->uncompressed_size - uoff) {
		ferry_err("chunk cache: blob sha256:%s: range %llu+%llu is outside its %llu bytes",
			  b->hex, (unsigned long long)uoff, (unsigned long long)len,
			  (unsigned long long)info->uncompressed_size);
		return -EINVAL;
	}
	if (!range_chunks(info, uoff, len, &i0, &i1))
		return 0;
	fa = b->chunk_frame[i0];
	fb = b->chunk_frame[i1];
	stream_point_frames(b, &fa, &fb, true);
	while (!ret && fa <= fb) {
		uint64_t start = chunks[b->frames[fa].first].uoff, end, coff0, cend, clen;

		/*
		 * Present frames: read back from the data file, no fetch; the
		 * check and the read inside the readers lock, the frames
		 * stamped, so eviction does not punch them in between.
		 */
		touch_frames(b, fa, fb);
		blob_cache_read_begin();
		n = present_frames(b, fa, fb, true);
		if (n) {
			end = frame_end(b, fa + n - 1);
			ret = aligned_reserve(&out, &out_cap, end - start);
			if (!ret)
				ret = pread_full(b->data_fd, out, end - start, start);
		}
		blob_cache_read_end();
		if (n) {
			if (!ret)
				ret = emit(ctx, start, out, end - start);
			fa += n;
			continue;
		}
		/* Missing ones: adjacent frames in one read, in memory only. */
		coff0 = chunks[b->frames[fa].first].coff;
		cend = coff0 + chunks[b->frames[fa].first].csize;
		n = present_frames(b, fa, fb, false);
		for (i = 1; i < n; i++)
			if (!run_join(&chunks[b->frames[fa + i].first], coff0, &cend, false))
				break;
		n = i;
		clen = cend - coff0;
		if (reader)
			blob_stream_reader_reset(reader);
		ret = blob_buf_reserve_fresh(&run, &run_cap, clen);
		if (!ret)
			ret = src->read(src->ctx, coff0, run, clen);
		if (ret) {
			ret = ret < 0 ? ret : -EIO;
			ferry_err("blob sha256:%s: reading compressed bytes %llu..%llu from the source: %s",
				  b->hex, (unsigned long long)coff0,
				  (unsigned long long)(coff0 + clen), ferry_strerror(ret));
			break;
		}
		if (fetched)
			__atomic_fetch_add(fetched, clen, __ATOMIC_RELAXED);
		for (fr = fa; !ret && fr < fa + n; fr++) {
			const struct blob_chunk *c = &chunks[b->frames[fr].first];
			const uint8_t *bytes = run + (c->coff - coff0);

			start = c->uoff;
			end = frame_end(b, fr);
			if (c->codec != BLOB_CODEC_NONE || c->csize != c->frame_usize) {
				ret = blob_buf_reserve_fresh(&frame, &frame_cap, c->frame_usize);
				if (!ret)
					ret = decode_frame(src, &reader, c, run, coff0,
							   (size_t)clen, frame);
				if (ret && ret != -ENOMEM) {
					ferry_err("blob sha256:%s: chunk %u: its frame does not decode",
						  b->hex, b->frames[fr].first);
					ret = -EIO;
				}
				bytes = frame;
			}
			if (!ret)
				ret = aligned_reserve(&out, &out_cap, end - start);
			if (ret)
				break;
			memset(out, 0, end - start);
			for (i = b->frames[fr].first; !ret && i < b->frames[fr].first + b->frames[fr].count; i++) {
				ret = blob_chunk_verify(&chunks[i], bytes + chunks[i].frame_off);
				if (ret)
					ferry_err("blob sha256:%s: chunk %u does not match its sha256",
						  b->hex, i);
				else
					memcpy(out + (chunks[i].uoff - start),
					       bytes + chunks[i].frame_off, chunks[i].usize);
			}
			if (!ret)
				ret = emit(ctx, start, out, end - start);
		}
		fa += n;
	}
	blob_stream_reader_free(reader);
	free(run);
	free(frame);
	free(out);
	return ret;
}
