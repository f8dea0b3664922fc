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
 * The in-memory marks only ever go from missing to present, so readers
 * check them without a lock.
 *
 * Image records (DIR/images/<hex>.json) only matter to gc, which keeps
 * the blobs they name and removes the rest when nobody has them open.
 */
#include "internal.h"
#include "../pkg-base/base.h"

#include <dirent.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* The map file (docs/FORMAT.md, "Chunk cache"). */
#define CACHE_MAP_MAGIC "FERRYCM1"
#define CACHE_MAP_VERSION 1u
#define CACHE_MAP_HEADER_SIZE 128u
#define CACHE_MAP_CHECK_OFF 96u /* sha256 of the bytes before it */
#define CACHE_STATE_MISSING 0
#define CACHE_STATE_PRESENT 1
#define CACHE_STATE_PENDING 2 /* in memory only: written, not yet marked */

#define CACHE_BLOBS_DIR "blobs/sha256"
#define CACHE_IMAGES_DIR "images"
#define CACHE_HEX_LEN (2 * BLOB_DIGEST_SIZE)
/* Temporary files (ATOMIC_TMP_PREFIX) older than this are gc's to remove. */
#define CACHE_TMP_AGE_S 60
/* Largest image record read back. */
#define CACHE_RECORD_MAX (16u << 20)

struct cache_map_header {
	uint32_t nr_chunks;
	uint64_t uncompressed_size;
	uint8_t digest[BLOB_DIGEST_SIZE];
	uint8_t table_sha256[BLOB_DIGEST_SIZE];
};

/* At most this many compressed bytes are claimed by one thread at once. */
#define CLAIM_MAX (4 * (uint64_t)BLOB_CACHE_RUN_MAX)
/* Opening retries while other handles replace or remove the files. */
#define OPEN_ATTEMPTS 8

struct frame {
	uint32_t first; /* first chunk */
	uint32_t count; /* chunks */
};

struct blob_cache_blob {
	const struct blob_info *info;
	char hex[CACHE_HEX_LEN + 1];
	char *dir_path;  /* DIR/blobs/sha256 */
	char *data_path;
	char *map_path;
	int data_fd;
	int map_fd;
	uint32_t nr_frames;
	struct frame *frames;
	uint32_t *chunk_frame; /* frame of each chunk */
	uint8_t *present;      /* per chunk, atomic, 0 -> 1 only */
	uint32_t present_chunks; /* atomic */
	uint64_t present_bytes;  /* atomic */
	pthread_mutex_t lock;
	pthread_cond_t done;     /* a frame stopped being in flight */
	uint8_t *inflight;       /* per frame, under lock */
};

/* ------------------------------------------------------------------ */
/* Files                                                               */
/* ------------------------------------------------------------------ */

static bool cache_is_hex(const char *s, size_t len)
{
	size_t i;

	for (i = 0; i < len; i++)
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return false;
	return true;
}

/* @dir/@name@suffix into @out (PATH_MAX bytes), or -ENAMETOOLONG. */
static int path_join(char *out, const char *dir, const char *name,
		     const char *suffix)
{
	int n = snprintf(out, PATH_MAX, "%s/%s%s", dir, name, suffix);

	return n < 0 || n >= PATH_MAX ? -ENAMETOOLONG : 0;
}

/* Create @cache_dir and each level of @sub ("a/b") under it, as needed. */
static int cache_mkdirs(const char *cache_dir, const char *sub)
{
	char path[PATH_MAX];
	size_t i;
	int n;

	n = snprintf(path, sizeof(path), "%s/%s", cache_dir, sub);
	if (n < 0 || (size_t)n >= sizeof(path))
		return -ENAMETOOLONG;
	for (i = strlen(cache_dir);; i++) {
		char c = path[i];

		if (c != '/' && c)
			continue;
		path[i] = '\0';
		if (mkdir(path, 0755) && errno != EEXIST) {
			n = -errno;
			ferry_err("chunk cache: cannot create %s: %s", path,
				  ferry_strerror(n));
			return n;
		}
		path[i] = c;
		if (!c)
			return 0;
	}
}

/* unlink @path (@missing_ok: ENOENT is fine); 0 or -errno, logged. */
static int remove_file(const char *path, bool missing_ok)
{
	int ret;

	if (!unlink(path) || (missing_ok && errno == ENOENT))
		return 0;
	ret = -errno;
	ferry_err("chunk cache: cannot remove %s: %s", path, ferry_strerror(ret));
	return ret;
}

/* opendir; a missing directory is *@d NULL (nothing cached yet). */
static int open_dir(const char *dir, DIR **d)
{
	int ret;

	*d = opendir(dir);
	if (*d || errno == ENOENT)
		return 0;
	ret = -errno;
	ferry_err("chunk cache: cannot read %s: %s", dir, ferry_strerror(ret));
	return ret;
}

static int cache_fsync_dir(const char *dir)
{
	int fd, ret = 0;

	fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0 || fsync(fd))
		ret = -errno;
	if (fd >= 0)
		close(fd);
	if (ret)
		ferry_err("chunk cache: fsync of directory %s: %s", dir,
			  ferry_strerror(ret));
	return ret;
}

static void cache_map_header_encode(const struct blob_info *info,
			     uint8_t h[CACHE_MAP_HEADER_SIZE])
{
	memset(h, 0, CACHE_MAP_HEADER_SIZE);
	memcpy(h, CACHE_MAP_MAGIC, 8);
	put_le32(h + 8, CACHE_MAP_VERSION);
	put_le32(h + 12, CACHE_MAP_HEADER_SIZE);
	put_le32(h + 16, info->nr_chunks);
	put_le64(h + 24, info->uncompressed_size);
	memcpy(h + 32, info->digest, BLOB_DIGEST_SIZE);
	memcpy(h + 64, info->table_sha256, BLOB_DIGEST_SIZE);
	sha256_buf(h, CACHE_MAP_CHECK_OFF, h + CACHE_MAP_CHECK_OFF);
}

static int cache_map_header_decode(const uint8_t h[CACHE_MAP_HEADER_SIZE],
			    struct cache_map_header *mh, const char **why)
{
	uint8_t check[BLOB_DIGEST_SIZE];

	if (memcmp(h, CACHE_MAP_MAGIC, 8)) {
		*why = "bad magic";
		return -EFSCORRUPTED;
	}
	sha256_buf(h, CACHE_MAP_CHECK_OFF, check);
	if (memcmp(check, h + CACHE_MAP_CHECK_OFF, BLOB_DIGEST_SIZE)) {
		*why = "header checksum mismatch";
		return -EFSCORRUPTED;
	}
	if (get_le32(h + 8) != CACHE_MAP_VERSION ||
	    get_le32(h + 12) != CACHE_MAP_HEADER_SIZE || get_le32(h + 20)) {
		*why = "unknown version or header size";
		return -EFSCORRUPTED;
	}
	mh->nr_chunks = get_le32(h + 16);
	mh->uncompressed_size = get_le64(h + 24);
	memcpy(mh->digest, h + 32, BLOB_DIGEST_SIZE);
	memcpy(mh->table_sha256, h + 64, BLOB_DIGEST_SIZE);
	return 0;
}

static int cache_flock(int fd, int op)
{
	while (flock(fd, op)) {
		if (errno != EINTR)
			return -errno;
	}
	return 0;
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
			b->frames[nf++] = (struct frame){ .first = i, .count = 1 };
		} else {
			const struct blob_chunk *p = i ? c - 1 : NULL;

			if (!p || p->coff != c->coff || p->csize != c->csize ||
			    p->codec != c->codec ||
			    p->frame_usize != c->frame_usize ||
			    c->frame_off != p->frame_off + p->usize)
				return bad_table(b, i, "frame members disagree");
			b->frames[nf - 1].count++;
		}
		b->chunk_frame[i] = nf - 1;
	}
	if (nf && !ends_frame(&info->chunks[i - 1]))
		return bad_table(b, i - 1, "frame ends early");
	b->nr_frames = nf;
	b->inflight = calloc(MAX(nf, 1u), 1);
	b->present = calloc(MAX(info->nr_chunks, 1u), 1);
	return b->inflight && b->present ? 0 : -ENOMEM;
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

	fd = open(b->data_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
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
		if (!stat(b->map_path, &st)) {
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
				 map, len, 0644);
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
	b->data_fd = open(b->data_path, O_RDWR | O_CLOEXEC);
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

	fd = open(b->map_path, O_RDWR | O_CLOEXEC);
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

int blob_cache_open(const char *cache_dir, const struct blob_info *info,
		    struct blob_cache_blob **out)
{
	static const uint8_t zero[BLOB_DIGEST_SIZE];
	struct blob_cache_blob *b;
	int attempt, ret;

	*out = NULL;
	b = calloc(1, sizeof(*b));
	if (!b)
		return -ENOMEM;
	b->info = info;
	b->data_fd = b->map_fd = -1;
	hex_encode(info->digest, BLOB_DIGEST_SIZE, b->hex);
	pthread_mutex_init(&b->lock, NULL);
	pthread_cond_init(&b->done, NULL);
	if (!memcmp(info->digest, zero, BLOB_DIGEST_SIZE)) {
		ferry_err("chunk cache: a blob without a known digest cannot be cached");
		ret = -EINVAL;
		goto fail;
	}
	ret = index_frames(b);
	if (ret)
		goto fail;
	ret = -ENOMEM;
	if (asprintf(&b->dir_path, "%s/" CACHE_BLOBS_DIR, cache_dir) < 0) {
		b->dir_path = NULL;
		goto fail;
	}
	if (asprintf(&b->data_path, "%s/%s.data", b->dir_path, b->hex) < 0) {
		b->data_path = NULL;
		goto fail;
	}
	if (asprintf(&b->map_path, "%s/%s.map", b->dir_path, b->hex) < 0) {
		b->map_path = NULL;
		goto fail;
	}
	ret = cache_mkdirs(cache_dir, CACHE_BLOBS_DIR);
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
	if (ret)
		goto fail;
	*out = b;
	return 0;
fail:
	blob_cache_close(b);
	return ret;
}

void blob_cache_close(struct blob_cache_blob *b)
{
	if (!b)
		return;
	if (b->data_fd >= 0)
		close(b->data_fd);
	if (b->map_fd >= 0)
		close(b->map_fd); /* drops the flock */
	pthread_mutex_destroy(&b->lock);
	pthread_cond_destroy(&b->done);
	free(b->frames);
	free(b->chunk_frame);
	free(b->present);
	free(b->inflight);
	free(b->dir_path);
	free(b->data_path);
	free(b->map_path);
	free(b);
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
	uint32_t c0;          /* chunk whose mark is marks[0] */
	uint8_t *marks;       /* map bytes of the group being filled */
	size_t marks_cap;
	uint8_t *run;         /* compressed bytes of one run */
	size_t run_cap;
	uint8_t *frame;       /* one decoded frame */
	size_t frame_cap;
};

static void set_present(struct blob_cache_blob *b, uint32_t i)
{
	if (!__atomic_exchange_n(&b->present[i], 1, __ATOMIC_ACQ_REL)) {
		__atomic_fetch_add(&b->present_chunks, 1, __ATOMIC_RELAXED);
		__atomic_fetch_add(&b->present_bytes, b->info->chunks[i].usize,
				   __ATOMIC_RELAXED);
	}
}

/* Does frame @fr hold a requested chunk that is missing? */
static bool frame_needed(const struct blob_cache_blob *b,
			 const struct fill *f, uint32_t fr)
{
	uint32_t i = MAX(b->frames[fr].first, f->i0);
	uint32_t end = MIN(b->frames[fr].first + b->frames[fr].count - 1,
			   f->i1);

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
			set_present(b, c0 + i);
		else if (blob_cache_chunk_present(b, c0 + i))
			f->marks[i] = CACHE_STATE_PRESENT;
		else
			f->marks[i] = CACHE_STATE_MISSING;
	}
	return 0;
}

/* Lock or unlock the map bytes of chunks @c0 .. @c0 + @n - 1. */
static int map_lock(struct blob_cache_blob *b, short type, uint32_t c0,
		    uint32_t n)
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
 * Fetch frames @fa .. @fb (consecutive in the blob file, needed, ours)
 * with one source read of @len bytes, then write, sync and mark their
 * missing chunks. Returns -EIO when some chunk did not verify (the others
 * are kept), or another -errno when nothing could be kept.
 */
static int fill_run(struct blob_cache_blob *b, struct fill *f, uint32_t fa,
		    uint32_t fb, size_t len)
{
	const struct blob_chunk *chunks = b->info->chunks;
	uint64_t coff0 = chunks[b->frames[fa].first].coff;
	uint32_t c0 = b->frames[fa].first;
	uint32_t c1 = b->frames[fb].first + b->frames[fb].count; /* end */
	uint32_t fr, i;
	bool wrote = false;
	int ret, err = 0;

	ret = blob_buf_reserve(&f->run, &f->run_cap, len);
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

	for (fr = fa; fr <= fb; fr++) {
		const struct blob_chunk *c = &chunks[b->frames[fr].first];
		const uint8_t *cdata = f->run + (c->coff - coff0);
		const uint8_t *bytes = cdata;

		if (c->codec != BLOB_CODEC_NONE || c->csize != c->frame_usize) {
			ret = blob_buf_reserve(&f->frame, &f->frame_cap,
					       c->frame_usize);
			if (ret)
				return ret;
			ret = blob_frame_decode(c, cdata, f->frame);
			if (ret) {
				/* A needed frame: it holds an asked-for chunk. */
				chunk_bad(b, f, b->frames[fr].first,
					  "does not decode");
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
			set_present(b, i);
	return err;
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
	ret = map_lock(b, F_WRLCK, c0, n);
	if (ret)
		return ret;
	ret = refresh_marks(b, f, c0, n);
	if (ret)
		goto out;
	for (fr = fa; fr <= fb; fr = last + 1) {
		const struct blob_chunk *c;
		uint64_t len;

		last = fr;
		if (!frame_needed(b, f, fr))
			continue;
		c = &chunks[b->frames[fr].first];
		len = c->csize;
		/* Merge the next needed frames that follow in the file. */
		while (last < fb && frame_needed(b, f, last + 1)) {
			const struct blob_chunk *p =
				&chunks[b->frames[last].first];
			const struct blob_chunk *q =
				&chunks[b->frames[last + 1].first];

			if (q->coff != p->coff + p->csize ||
			    len + q->csize > BLOB_CACHE_RUN_MAX)
				break;
			len += q->csize;
			last++;
		}
		ret = fill_run(b, f, fr, last, (size_t)len);
		if (ret == -EIO) {
			err = ret; /* bad chunks are logged; go on */
			continue;
		}
		if (ret)
			goto out;
	}
	ret = err;
out:
	err = map_lock(b, F_UNLCK, c0, n);
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
	for (; i <= i1; i++)
		if (!blob_cache_chunk_present(b, i))
			return false;
	return true;
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
	for (i = f.i0; i <= f.i1 && blob_cache_chunk_present(b, i); i++)
		;
	if (i > f.i1)
		return 0;

	fa = b->chunk_frame[f.i0];
	fb = b->chunk_frame[f.i1];
	claimed = malloc((size_t)(fb - fa + 1) * sizeof(*claimed));
	if (!claimed)
		return -ENOMEM;
	pthread_mutex_lock(&b->lock);
	for (;;) {
		uint64_t claimed_bytes = 0;
		bool waiting = false;

		nr = 0;
		for (fr = fa; fr <= fb && claimed_bytes < CLAIM_MAX; fr++) {
			if (!frame_needed(b, &f, fr))
				continue;
			if (b->inflight[fr]) {
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
	}
	pthread_mutex_unlock(&b->lock);
	free(claimed);
	free(f.marks);
	free(f.run);
	free(f.frame);
	return ret;
}

/* ------------------------------------------------------------------ */
/* Image records                                                       */
/* ------------------------------------------------------------------ */

struct cache_record {
	uint8_t digest[BLOB_DIGEST_SIZE];
	char *ref;
	uint8_t (*blobs)[BLOB_DIGEST_SIZE]; /* sorted, no duplicates */
	uint32_t nr_blobs;
};

struct cache_records {
	struct cache_record *r;
	uint32_t nr;
	size_t cap;
};

static void records_free(struct cache_records *rs)
{
	uint32_t i;

	for (i = 0; i < rs->nr; i++) {
		free(rs->r[i].ref);
		free(rs->r[i].blobs);
	}
	free(rs->r);
	memset(rs, 0, sizeof(*rs));
}

static int digest_cmp(const void *a, const void *b)
{
	return memcmp(a, b, BLOB_DIGEST_SIZE);
}

/* A directory entry named <64 hex><suffix>: the digest, else -EINVAL. */
static int name_digest(const char *name, const char *suffix,
		       uint8_t out[BLOB_DIGEST_SIZE])
{
	char hex[CACHE_HEX_LEN + 1];

	if (strlen(name) != CACHE_HEX_LEN + strlen(suffix) ||
	    strcmp(name + CACHE_HEX_LEN, suffix) ||
	    !cache_is_hex(name, CACHE_HEX_LEN))
		return -EINVAL;
	memcpy(hex, name, CACHE_HEX_LEN);
	hex[CACHE_HEX_LEN] = '\0';
	return hex_decode(hex, out, BLOB_DIGEST_SIZE);
}

/* Parse record file @path (named after @digest) into @r. */
static int record_parse(const char *path, const uint8_t digest[BLOB_DIGEST_SIZE],
			struct cache_record *r, const char **why)
{
	struct json_tokener *tok = NULL;
	struct json_object *root = NULL, *v, *blobs;
	uint8_t d[BLOB_DIGEST_SIZE];
	char *text = NULL;
	size_t len = 0, i, n;
	int ret;

	memset(r, 0, sizeof(*r));
	ret = read_file_max(path, CACHE_RECORD_MAX, &text, &len);
	if (ret) {
		*why = ferry_strerror(ret);
		return ret;
	}
	ret = -EFSCORRUPTED;
	*why = "not valid JSON";
	tok = json_tokener_new();
	if (!tok) {
		ret = -ENOMEM;
		goto out;
	}
	root = json_tokener_parse_ex(tok, text, (int)len);
	if (!root || json_tokener_get_error(tok) != json_tokener_success ||
	    !json_object_is_type(root, json_type_object))
		goto out;
	*why = "\"digest\" missing or not the file's name";
	if (!json_object_object_get_ex(root, "digest", &v) ||
	    !json_object_is_type(v, json_type_string) ||
	    digest_parse(json_object_get_string(v), d) ||
	    memcmp(d, digest, BLOB_DIGEST_SIZE))
		goto out;
	*why = "\"ref\" missing or not a string";
	if (!json_object_object_get_ex(root, "ref", &v) ||
	    !json_object_is_type(v, json_type_string))
		goto out;
	*why = "\"blobs\" missing or not an array of sha256 digests";
	if (!json_object_object_get_ex(root, "blobs", &blobs) ||
	    !json_object_is_type(blobs, json_type_array))
		goto out;
	n = json_object_array_length(blobs);
	if (n > UINT32_MAX)
		goto out;
	r->ref = strdup(json_object_get_string(v));
	r->blobs = malloc(MAX(n, (size_t)1) * BLOB_DIGEST_SIZE);
	if (!r->ref || !r->blobs) {
		ret = -ENOMEM;
		goto out;
	}
	for (i = 0; i < n; i++) {
		v = json_object_array_get_idx(blobs, i);
		if (!json_object_is_type(v, json_type_string) ||
		    digest_parse(json_object_get_string(v), r->blobs[i]))
			goto out;
	}
	qsort(r->blobs, n, BLOB_DIGEST_SIZE, digest_cmp);
	for (i = 0; i < n; i++)
		if (!r->nr_blobs || memcmp(r->blobs[r->nr_blobs - 1],
					   r->blobs[i], BLOB_DIGEST_SIZE))
			memmove(r->blobs[r->nr_blobs++], r->blobs[i],
				BLOB_DIGEST_SIZE);
	memcpy(r->digest, digest, BLOB_DIGEST_SIZE);
	ret = 0;
out:
	if (ret) {
		free(r->ref);
		free(r->blobs);
		memset(r, 0, sizeof(*r));
	}
	if (root)
		json_object_put(root);
	if (tok)
		json_tokener_free(tok);
	free(text);
	return ret;
}

/*
 * Every readable image record of @cache_dir, sorted by digest. A record
 * that does not parse is reported and skipped: it names nothing that can
 * be trusted, and the cache only ever costs a refetch.
 */
static int records_read(const char *cache_dir, struct cache_records *rs)
{
	char dir[PATH_MAX], path[PATH_MAX];
	struct dirent *de;
	DIR *d;
	int n, ret = 0;

	memset(rs, 0, sizeof(*rs));
	n = snprintf(dir, sizeof(dir), "%s/" CACHE_IMAGES_DIR, cache_dir);
	if (n < 0 || (size_t)n >= sizeof(dir))
		return -ENAMETOOLONG;
	ret = open_dir(dir, &d);
	if (ret || !d)
		return ret;
	while ((errno = 0, de = readdir(d))) {
		uint8_t digest[BLOB_DIGEST_SIZE];
		const char *why;

		if (de->d_name[0] == '.')
			continue; /* ".", "..", temporary files */
		if (name_digest(de->d_name, ".json", digest)) {
			ferry_warn("chunk cache: %s/%s: unexpected file, ignored",
				   dir, de->d_name);
			continue;
		}
		ret = array_reserve(&rs->r, &rs->cap, rs->nr + 1,
				    sizeof(*rs->r), 16);
		if (ret)
			break;
		if (path_join(path, dir, de->d_name, ""))
			continue;
		ret = record_parse(path, digest, &rs->r[rs->nr], &why);
		if (ret == -ENOMEM)
			break;
		if (ret == -ENOENT) { /* forgotten meanwhile */
			ret = 0;
			continue;
		}
		if (ret) {
			ferry_warn("chunk cache: image record %s: %s; ignored",
				   path, why);
			ret = 0;
			continue;
		}
		rs->nr++;
	}
	if (!ret && errno) {
		ret = -errno;
		ferry_err("chunk cache: reading %s: %s", dir,
			  ferry_strerror(ret));
	}
	closedir(d);
	if (ret)
		records_free(rs);
	else if (rs->nr)
		qsort(rs->r, rs->nr, sizeof(*rs->r), digest_cmp);
	return ret;
}

/* Image records naming @digest. */
static uint32_t records_naming(const struct cache_records *rs,
			       const uint8_t digest[BLOB_DIGEST_SIZE])
{
	uint32_t i, n = 0;

	for (i = 0; i < rs->nr; i++)
		if (bsearch(digest, rs->r[i].blobs, rs->r[i].nr_blobs,
			    BLOB_DIGEST_SIZE, digest_cmp))
			n++;
	return n;
}

int blob_cache_add_image(const char *cache_dir, const char *ref,
			 const uint8_t image_digest[BLOB_DIGEST_SIZE],
			 const uint8_t (*digests)[BLOB_DIGEST_SIZE],
			 uint32_t nr_digests)
{
	char hex[CACHE_HEX_LEN + 1], dig[8 + CACHE_HEX_LEN], name[80];
	char dir[PATH_MAX];
	struct json_object *root, *list;
	const char *text;
	uint32_t i;
	int n, ret = -ENOMEM;

	n = snprintf(dir, sizeof(dir), "%s/" CACHE_IMAGES_DIR, cache_dir);
	if (n < 0 || (size_t)n >= sizeof(dir))
		return -ENAMETOOLONG;
	hex_encode(image_digest, BLOB_DIGEST_SIZE, hex);
	snprintf(name, sizeof(name), "%s.json", hex);
	root = json_object_new_object();
	list = json_object_new_array();
	if (!root || !list) {
		json_object_put(list);
		goto out;
	}
	snprintf(dig, sizeof(dig), "sha256:%s", hex);
	if (json_object_object_add(root, "ref",
				   json_object_new_string(ref ? ref : "")) ||
	    json_object_object_add(root, "digest",
				   json_object_new_string(dig))) {
		json_object_put(list);
		goto out;
	}
	if (json_object_object_add(root, "blobs", list))
		goto out_list;
	for (i = 0; i < nr_digests; i++) {
		hex_encode(digests[i], BLOB_DIGEST_SIZE, hex);
		snprintf(dig, sizeof(dig), "sha256:%s", hex);
		if (json_object_array_add(list, json_object_new_string(dig)))
			goto out;
	}
	if (json_object_object_add(root, "updated",
				   json_object_new_int64((int64_t)time(NULL))))
		goto out;
	text = json_object_to_json_string_ext(root, JSON_C_TO_STRING_PRETTY |
						    JSON_C_TO_STRING_NOSLASHESCAPE);
	if (!text)
		goto out;
	ret = cache_mkdirs(cache_dir, CACHE_IMAGES_DIR);
	if (!ret)
		ret = write_file_atomic(dir, name, text, strlen(text), 0644);
	goto out;
out_list:
	json_object_put(list);
out:
	json_object_put(root);
	return ret;
}

int blob_cache_forget_image(const char *cache_dir,
			    const uint8_t *image_digest)
{
	char dir[PATH_MAX], path[PATH_MAX], hex[CACHE_HEX_LEN + 1];
	struct dirent *de;
	DIR *d;
	int n, ret = 0;

	n = snprintf(dir, sizeof(dir), "%s/" CACHE_IMAGES_DIR, cache_dir);
	if (n < 0 || (size_t)n >= sizeof(dir))
		return -ENAMETOOLONG;
	if (image_digest) {
		hex_encode(image_digest, BLOB_DIGEST_SIZE, hex);
		if (path_join(path, dir, hex, ".json"))
			return -ENAMETOOLONG;
		if (unlink(path)) {
			ret = -errno;
			ferry_err("chunk cache: cannot forget image sha256:%s (%s): %s",
				  hex, path, ferry_strerror(ret));
			return ret;
		}
		return cache_fsync_dir(dir);
	}
	ret = open_dir(dir, &d);
	if (ret || !d)
		return ret;
	while ((errno = 0, de = readdir(d))) {
		uint8_t digest[BLOB_DIGEST_SIZE];

		if (name_digest(de->d_name, ".json", digest))
			continue;
		if (path_join(path, dir, de->d_name, ""))
			continue;
		ret = remove_file(path, true);
		if (ret)
			break;
	}
	if (!ret && errno) {
		ret = -errno;
		ferry_err("chunk cache: reading %s: %s", dir,
			  ferry_strerror(ret));
	}
	closedir(d);
	return ret ? ret : cache_fsync_dir(dir);
}

/* ------------------------------------------------------------------ */
/* Listing and gc                                                      */
/* ------------------------------------------------------------------ */

/* A blob seen in DIR/blobs/sha256. */
struct cache_file {
	uint8_t digest[BLOB_DIGEST_SIZE];
	bool map, data;
};

struct cache_scan {
	struct cache_file *f;
	uint32_t nr;
	size_t cap;
	char **tmp; /* temporary files (names) */
	uint32_t nr_tmp;
	size_t tmp_cap;
};

static void scan_free(struct cache_scan *s)
{
	uint32_t i;

	for (i = 0; i < s->nr_tmp; i++)
		free(s->tmp[i]);
	free(s->tmp);
	free(s->f);
	memset(s, 0, sizeof(*s));
}

static int file_cmp(const void *a, const void *b)
{
	return memcmp(((const struct cache_file *)a)->digest,
		      ((const struct cache_file *)b)->digest, BLOB_DIGEST_SIZE);
}

static int scan_add_tmp(struct cache_scan *s, const char *name)
{
	if (array_reserve(&s->tmp, &s->tmp_cap, s->nr_tmp + 1, sizeof(*s->tmp), 8))
		return -ENOMEM;
	s->tmp[s->nr_tmp] = strdup(name);
	if (!s->tmp[s->nr_tmp])
		return -ENOMEM;
	s->nr_tmp++;
	return 0;
}

/*
 * The blobs (map and/or data file) and temporary files in @dir, sorted by
 * digest; other names are reported and left alone. Missing dir: empty.
 */
static int scan_blobs(const char *dir, struct cache_scan *s)
{
	struct dirent *de;
	uint32_t i, j;
	DIR *d;
	int ret = 0;

	memset(s, 0, sizeof(*s));
	ret = open_dir(dir, &d);
	if (ret || !d)
		return ret;
	while ((errno = 0, de = readdir(d))) {
		struct cache_file cf = { .map = true };

		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (!strncmp(de->d_name, ATOMIC_TMP_PREFIX,
			     strlen(ATOMIC_TMP_PREFIX))) {
			ret = scan_add_tmp(s, de->d_name);
			if (ret)
				break;
			continue;
		}
		if (name_digest(de->d_name, ".map", cf.digest)) {
			cf.map = false;
			cf.data = true;
			if (name_digest(de->d_name, ".data", cf.digest)) {
				ferry_warn("chunk cache: %s/%s: unexpected file, ignored",
					   dir, de->d_name);
				continue;
			}
		}
		ret = array_reserve(&s->f, &s->cap, s->nr + 1, sizeof(*s->f),
				    16);
		if (ret)
			break;
		s->f[s->nr++] = cf;
	}
	if (!ret && errno) {
		ret = -errno;
		ferry_err("chunk cache: reading %s: %s", dir,
			  ferry_strerror(ret));
	}
	closedir(d);
	if (ret) {
		scan_free(s);
		return ret;
	}
	/* Merge the .map and .data entries of each blob. */
	if (s->nr)
		qsort(s->f, s->nr, sizeof(*s->f), file_cmp);
	for (i = 0, j = 0; i < s->nr; i++) {
		if (j && !file_cmp(&s->f[j - 1], &s->f[i])) {
			s->f[j - 1].map |= s->f[i].map;
			s->f[j - 1].data |= s->f[i].data;
		} else {
			s->f[j++] = s->f[i];
		}
	}
	s->nr = j;
	return 0;
}

/* Allocated bytes of @path, 0 when it does not exist. */
static uint64_t disk_bytes(const char *path)
{
	struct stat st;

	if (lstat(path, &st))
		return 0;
	return (uint64_t)st.st_blocks * 512;
}

/*
 * Fill @e from the map file @path: header fields, present chunks and
 * whether another handle holds it. A damaged map is reported and its
 * fields left zero.
 */
static int list_map(const char *path, struct blob_cache_entry *e)
{
	uint8_t h[CACHE_MAP_HEADER_SIZE], buf[65536];
	struct cache_map_header mh;
	const char *why = "map file has the wrong size";
	struct stat st;
	uint64_t off, end;
	int fd, ret;

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		ret = -errno;
		if (ret == -ENOENT)
			return 0; /* removed meanwhile */
		ferry_err("chunk cache: cannot open %s: %s", path,
			  ferry_strerror(ret));
		return ret;
	}
	ret = cache_flock(fd, LOCK_EX | LOCK_NB);
	if (ret == -EWOULDBLOCK)
		e->in_use = true;
	else if (ret)
		goto out;
	else
		flock(fd, LOCK_UN);
	if (fstat(fd, &st)) {
		ret = -errno;
		goto out;
	}
	ret = 0;
	if ((uint64_t)st.st_size < CACHE_MAP_HEADER_SIZE ||
	    pread_full(fd, h, sizeof(h), 0) ||
	    cache_map_header_decode(h, &mh, &why) ||
	    (uint64_t)st.st_size != CACHE_MAP_HEADER_SIZE +
					    (uint64_t)mh.nr_chunks) {
		ferry_warn("chunk cache: %s: %s", path, why);
		goto out;
	}
	e->nr_chunks = mh.nr_chunks;
	e->uncompressed_size = mh.uncompressed_size;
	end = (uint64_t)st.st_size;
	for (off = CACHE_MAP_HEADER_SIZE; off < end;) {
		size_t n = (size_t)MIN((uint64_t)sizeof(buf), end - off), i;

		ret = pread_full(fd, buf, n, off);
		if (ret)
			break;
		for (i = 0; i < n; i++)
			e->chunks_present += buf[i] == CACHE_STATE_PRESENT;
		off += n;
	}
out:
	if (ret)
		ferry_err("chunk cache: reading %s: %s", path,
			  ferry_strerror(ret));
	close(fd);
	return ret;
}

int blob_cache_list(const char *cache_dir, struct blob_cache_list *out)
{
	struct cache_records rs;
	struct cache_scan s;
	char dir[PATH_MAX], path[PATH_MAX], hex[CACHE_HEX_LEN + 1];
	uint32_t i;
	int n, ret;

	memset(out, 0, sizeof(*out));
	n = snprintf(dir, sizeof(dir), "%s/" CACHE_BLOBS_DIR, cache_dir);
	if (n < 0 || (size_t)n >= sizeof(dir))
		return -ENAMETOOLONG;
	ret = records_read(cache_dir, &rs);
	if (ret)
		return ret;
	ret = scan_blobs(dir, &s);
	if (ret)
		goto out;
	out->blobs = calloc(MAX(s.nr, 1u), sizeof(*out->blobs));
	out->images = calloc(MAX(rs.nr, 1u), sizeof(*out->images));
	if (!out->blobs || !out->images) {
		ret = -ENOMEM;
		goto out;
	}
	for (i = 0; i < s.nr; i++) {
		struct blob_cache_entry *e = &out->blobs[out->nr_blobs++];

		memcpy(e->digest, s.f[i].digest, BLOB_DIGEST_SIZE);
		hex_encode(e->digest, BLOB_DIGEST_SIZE, hex);
		if (path_join(path, dir, hex, ".data")) {
			ret = -ENAMETOOLONG;
			goto out;
		}
		e->disk_bytes = disk_bytes(path);
		if (path_join(path, dir, hex, ".map")) {
			ret = -ENAMETOOLONG;
			goto out;
		}
		e->disk_bytes += disk_bytes(path);
		e->nr_images = records_naming(&rs, e->digest);
		if (s.f[i].map) {
			ret = list_map(path, e);
			if (ret)
				goto out;
		}
	}
	for (i = 0; i < rs.nr; i++) {
		struct blob_cache_image *im = &out->images[out->nr_images++];

		memcpy(im->digest, rs.r[i].digest, BLOB_DIGEST_SIZE);
		im->nr_blobs = rs.r[i].nr_blobs;
		im->ref = rs.r[i].ref;
		rs.r[i].ref = NULL;
	}
out:
	scan_free(&s);
	records_free(&rs);
	if (ret)
		blob_cache_list_free(out);
	return ret;
}

void blob_cache_list_free(struct blob_cache_list *l)
{
	uint32_t i;

	for (i = 0; i < l->nr_images; i++)
		free(l->images[i].ref);
	free(l->images);
	free(l->blobs);
	memset(l, 0, sizeof(*l));
}

/*
 * Remove the blob @hex, unless it is in use. Its map is locked LOCK_EX
 * while both files are unlinked, so an opener waiting for the map sees
 * it gone and starts afresh. Returns 1 when removed, 0 when skipped.
 */
static int gc_blob(const char *dir, const char *hex, uint64_t *freed)
{
	char map[PATH_MAX], data[PATH_MAX];
	struct stat st;
	uint64_t bytes;
	int fd, ret;

	if (path_join(map, dir, hex, ".map") ||
	    path_join(data, dir, hex, ".data"))
		return -ENAMETOOLONG;
	fd = open(map, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		if (errno == ENOENT)
			return 0;
		ret = -errno;
		ferry_err("chunk cache: cannot open %s: %s", map,
			  ferry_strerror(ret));
		return ret;
	}
	ret = cache_flock(fd, LOCK_EX | LOCK_NB);
	if (ret == -EWOULDBLOCK) {
		ferry_dbg("chunk cache: %s is in use; kept", map);
		ret = 0;
		goto out;
	}
	if (ret || fstat(fd, &st)) {
		ret = ret ? ret : -errno;
		ferry_err("chunk cache: %s: %s", map, ferry_strerror(ret));
		goto out;
	}
	if (!st.st_nlink)
		goto out; /* replaced meanwhile */
	bytes = disk_bytes(data) + (uint64_t)st.st_blocks * 512;
	ret = remove_file(data, true);
	if (ret)
		goto out;
	ret = remove_file(map, false);
	if (ret)
		goto out;
	*freed += bytes;
	ret = 1;
out:
	close(fd);
	return ret;
}

static bool older_than(const struct stat *st, time_t age)
{
	return st->st_mtime + age < time(NULL);
}

/*
 * A data file without a map: a creator's in progress (it holds LOCK_EX on
 * the data file and is quick) or a leftover. Removed once old and idle.
 */
static int gc_orphan(const char *dir, const char *hex, uint64_t *freed)
{
	char map[PATH_MAX], data[PATH_MAX];
	struct stat st;
	int fd, ret = 0;

	if (path_join(map, dir, hex, ".map") ||
	    path_join(data, dir, hex, ".data"))
		return -ENAMETOOLONG;
	fd = open(data, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? 0 : -errno;
	if (cache_flock(fd, LOCK_EX | LOCK_NB) || fstat(fd, &st) ||
	    !st.st_nlink || !older_than(&st, CACHE_TMP_AGE_S) ||
	    !lstat(map, &st) || errno != ENOENT)
		goto out;
	if (fstat(fd, &st)) {
		ret = -errno;
		goto out;
	}
	ret = remove_file(data, false);
	if (ret)
		goto out;
	*freed += (uint64_t)st.st_blocks * 512;
	ret = 1;
out:
	close(fd);
	return ret;
}

/* Remove the old temporary files @names of @dir. */
static int gc_tmp(const char *dir, char *const *names, uint32_t nr,
		  uint64_t *freed)
{
	char path[PATH_MAX];
	struct stat st;
	uint32_t i;
	int ret = 0;

	for (i = 0; i < nr; i++) {
		if (path_join(path, dir, names[i], ""))
			continue;
		if (lstat(path, &st) || !S_ISREG(st.st_mode) ||
		    !older_than(&st, CACHE_TMP_AGE_S))
			continue;
		ret = remove_file(path, true);
		if (ret)
			continue;
		*freed += (uint64_t)st.st_blocks * 512;
	}
	return ret;
}

/* The temporary files of DIR/images. */
static int scan_image_tmp(const char *dir, struct cache_scan *s)
{
	struct dirent *de;
	DIR *d;
	int ret = 0;

	memset(s, 0, sizeof(*s));
	ret = open_dir(dir, &d);
	if (ret || !d)
		return ret;
	while ((de = readdir(d))) {
		if (strncmp(de->d_name, ATOMIC_TMP_PREFIX,
			    strlen(ATOMIC_TMP_PREFIX)))
			continue;
		ret = scan_add_tmp(s, de->d_name);
		if (ret)
			break;
	}
	closedir(d);
	return ret;
}

int blob_cache_gc(const char *cache_dir, uint64_t *freed, uint32_t *removed)
{
	char dir[PATH_MAX], idir[PATH_MAX], hex[CACHE_HEX_LEN + 1];
	struct cache_records rs;
	struct cache_scan s, is = { 0 };
	uint64_t bytes = 0;
	uint32_t i, nr = 0;
	int n, ret, err = 0;

	n = snprintf(dir, sizeof(dir), "%s/" CACHE_BLOBS_DIR, cache_dir);
	if (n < 0 || (size_t)n >= sizeof(dir))
		return -ENAMETOOLONG;
	if (path_join(idir, cache_dir, CACHE_IMAGES_DIR, ""))
		return -ENAMETOOLONG;
	ret = records_read(cache_dir, &rs);
	if (ret)
		return ret;
	ret = scan_blobs(dir, &s);
	if (ret)
		goto out;
	for (i = 0; i < s.nr; i++) {
		if (records_naming(&rs, s.f[i].digest))
			continue;
		hex_encode(s.f[i].digest, BLOB_DIGEST_SIZE, hex);
		ret = s.f[i].map ? gc_blob(dir, hex, &bytes) :
				   gc_orphan(dir, hex, &bytes);
		if (ret > 0)
			nr++;
		else if (ret < 0 && !err)
			err = ret;
	}
	ret = gc_tmp(dir, s.tmp, s.nr_tmp, &bytes);
	if (ret && !err)
		err = ret;
	ret = scan_image_tmp(idir, &is);
	if (!ret)
		ret = gc_tmp(idir, is.tmp, is.nr_tmp, &bytes);
	if (ret && !err)
		err = ret;
	if (nr) {
		ret = cache_fsync_dir(dir);
		if (ret && !err)
			err = ret;
	}
	ret = err;
out:
	scan_free(&is);
	scan_free(&s);
	records_free(&rs);
	if (freed)
		*freed = bytes;
	if (removed)
		*removed = nr;
	return ret;
}
