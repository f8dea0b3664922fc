// SPDX-License-Identifier: MIT
/*
 * An image's blobs opened in the chunk cache: file reads (FUSE), device
 * ranges (fanotify) and prefetch make the chunks they touch present,
 * fetching them from the image's blob sources, then read the cache data
 * files. On-demand reads go ahead of prefetch: prefetch works in bounded
 * steps and yields while a demand read is in flight. The local kernel
 * mount is the same cache filled completely first.
 *
 * Readahead (amplified I/O) for images in a registry: a demand read that
 * misses queues its whole file (FUSE) and the blob bytes that follow it
 * for a few background threads, so the rest of the file and its
 * neighbours in the blob (files are laid out in tree order) arrive on
 * other connections while the reader works, instead of one round trip
 * per fault. The window is a few bandwidth-delay products of the link,
 * measured on the fetches themselves; it starts small and doubles while
 * a reader keeps reaching it, so a sequential reader stays ahead and a
 * random one wastes little. A miss in a small file also predicts the
 * rest of its directory and the packages beside it (ra_dir). The
 * background fetches go through blob_cache_ensure like any other:
 * verified, one per frame.
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

/* Prefetch makes at most this much present per step before yielding. */
#define PREFETCH_STEP (4u << 20)
/* How long prefetch waits, at most, for demand reads to drain per step. */
#define PREFETCH_YIELD_MAX_MS 200
/*
 * A range evicted again between its fetch and its read is fetched again;
 * the last try fetches inside the readers lock, which evictions wait for.
 */
#define EVICTED_RETRIES 8

/*
 * Readahead: threads, queued windows, and the window's bounds. A window
 * is RA_BDP_FACTOR bandwidth-delay products; its worker fetches it in
 * steps of RA_STEP so that a demand read waiting on one of its frames
 * waits for one step, not the window.
 */
#define RA_THREADS 4
#define RA_QUEUE 64
#define RA_MIN (512u << 10)
#define RA_MAX (4u << 20)
#define RA_STEP (1u << 20)
#define RA_FIRST (128u << 10) /* a new window's first segment, at least */
/* Files up to this size are fetched whole after their first miss. */
#define RA_FILE_MAX (8u << 20)
#define RA_FILES 1024 /* remembered files (by inode, direct-mapped) */
#define RA_BDP_FACTOR 4
/* Fetches this large or larger also measure the bandwidth. */
#define RA_BW_SAMPLE (128u << 10)
/*
 * Directory prediction: a miss in a file of at most RA_DIR_FILE bytes
 * (one chunk) in directory D queues, once per D, D's other such files
 * within RA_DIR_SPAN blob bytes around it, and the first such file of up
 * to RA_DIR_SIBLINGS of D's sibling directories; only for a D at least
 * RA_DIR_DEPTH deep (/usr/lib/python3.11 is 3): the directories nearer
 * the root (/etc, /usr/bin, /usr/lib) hold unrelated programs' files,
 * and predicting them took the link from the next stalls of a startup.
 */
#define RA_DIR_FILE (256u << 10)
#define RA_DIR_SPAN (4u << 20)
#define RA_DIR_SIBLINGS 32
#define RA_DIR_DEPTH 3
/*
 * Only when a fetch's latency is at least this: below it a stall costs
 * less than the predicted frames' decoding and verifying (a registry on
 * loopback measures 5-20 ms, most of it the registry's own).
 */
#define RA_DIR_RTT_MIN 0.025
/*
 * ELF prediction: the files inspected or queued as a program's
 * dependencies, at most this many per mount, and the DT_RUNPATH
 * directories searched before the standard ones.
 */
#define ELF_SEEN_MAX 1024
#define ELF_RUNPATH_DIRS 8

struct ra_job {
	uint32_t index;
	uint64_t uoff, len;
	uint64_t elf; /* or nid + 1 of a file to inspect as a program (elf_predict) */
	bool modules; /* predicted small files: inspect the programs among them */
};

/* Which file a piece of a blob belongs to (for misses that name no file). */
struct ra_owner {
	uint32_t index;
	uint32_t len;
	uint64_t uoff, nid;
};

/* A one-chunk small file, by directory (for directory prediction). */
struct ra_dfile {
	uint64_t nid, uoff;
	uint32_t dir, index, len;
};

/* Where a small file is in dfiles, by inode. */
struct ra_nidx {
	uint64_t nid;
	uint32_t i;
};

/* A directory: its small files dfiles[first, first + nr), its parent. */
struct ra_dir {
	uint32_t parent, first, nr;
	uint32_t kids, nr_kids; /* its subdirectories: kids[kids, kids + nr_kids) */
	uint32_t depth;         /* path components: / is 0, /usr/lib 2 */
	bool done;              /* predicted already */
	bool kids_done;         /* its subdirectories predicted already */
};

/* A source read that is timed, to estimate the link. */
struct timed_source {
	struct image_cache *ic;
	struct blob_source inner;
};

/*
 * Per blob: the readahead window [origin, end), queued in segments, the
 * last one [mark, end) of seg bytes; origin and seg under ra_lock.
 */
struct ra_window {
	_Atomic uint64_t mark, end;
	uint64_t origin, seg;
};

struct image_cache {
	struct image *img;
	uint32_t nr_blobs;
	void (*sb_noted)(void *ctx, const char *sysfs); /* image_cache_set_sb_note */
	void *sb_noted_ctx;
	struct blob_cache_blob **blobs;
	struct blob_source *srcs;
	struct timed_source *tsrcs;
	atomic_uint demand_inflight;
	atomic_uint_fast64_t bytes_read, bytes_fetched, prefetched;
	atomic_uint_fast64_t hits, misses, fetch_errors, miss_ns_total;
	atomic_uint_fast64_t miss_ms[IMAGE_LATENCY_BUCKETS];
	atomic_uint_fast64_t fetches, fetches_ahead, bytes_ahead;
	atomic_uint_fast64_t programs_recorded, programs_read;
	uint64_t bwlimit; /* prefetch bytes per second, 0 = unlimited */
	atomic_uint_fast64_t bw_start_ns, bw_bytes;

	/* Readahead, all under ra_lock but the windows' atomic reads. */
	pthread_mutex_t ra_lock;
	pthread_cond_t ra_cond;
	struct ra_job ra_q[RA_QUEUE];
	unsigned int ra_head, ra_nr, nr_ra_threads;
	bool ra_on, ra_started; /* an image in a registry; threads tried */
	atomic_bool ra_quit;
	pthread_t ra_threads[RA_THREADS];
	struct ra_window *ra_win;
	uint64_t ra_files[RA_FILES]; /* nid + 1 of files queued whole */
	/* Sorted by (index, uoff), set once by the first readahead thread. */
	struct ra_owner *owners;
	size_t nr_owners, owners_cap;
	/* Directory prediction's map, built with the owners. */
	struct ra_dfile *dfiles;
	struct ra_nidx *dfile_by_nid;
	struct ra_nidx *elf_by_nid; /* the image's loader dependencies, by inode */
	size_t nr_elf_by_nid, elf_by_nid_cap;
	struct ra_dir *dirs;
	uint32_t *kids;
	size_t nr_dfiles, dfiles_cap, nr_dirs, dirs_cap;
	uint32_t *walk_stack; /* the walk's directories by depth */
	size_t walk_depth_cap;
	atomic_bool owners_claimed, owners_ready;
	double rtt_s, bw_Bps; /* link estimates, 0 = none yet */
	struct image_prefetch_sink sink; /* put: prefetch goes there */
	/* A running prefetch plan's ranges, sorted by place, under ra_lock. */
	struct plan_range *planned;
	size_t nr_planned;
	/* ELF prediction's files so far, under ra_lock. */
	uint64_t elf_seen[ELF_SEEN_MAX];
	uint32_t nr_elf_seen;
};

/* Set in the readahead threads: their fetches are not on a reader's path. */
static _Thread_local bool in_readahead;

void image_cache_close(struct image_cache *ic)
{
	uint32_t i;

	if (!ic)
		return;
	pthread_mutex_lock(&ic->ra_lock);
	ic->ra_quit = true;
	pthread_cond_broadcast(&ic->ra_cond);
	pthread_mutex_unlock(&ic->ra_lock);
	while (ic->nr_ra_threads)
		pthread_join(ic->ra_threads[--ic->nr_ra_threads], NULL);
	pthread_mutex_destroy(&ic->ra_lock);
	pthread_cond_destroy(&ic->ra_cond);
	for (i = 0; ic->blobs && i < ic->nr_blobs; i++)
		if (ic->blobs[i])
			blob_cache_close(ic->blobs[i]);
	free(ic->blobs);
	free(ic->srcs);
	free(ic->tsrcs);
	free(ic->ra_win);
	free(ic->owners);
	free(ic->dfiles);
	free(ic->dfile_by_nid);
	free(ic->elf_by_nid);
	free(ic->kids);
	free(ic->dirs);
	free(ic->planned);
	free(ic);
}

/* Fold one fetch of @bytes that took @ns into the link estimates. */
static void link_sample(struct image_cache *ic, uint64_t bytes, uint64_t ns)
{
	double t = (double)ns / 1e9, lat;

	pthread_mutex_lock(&ic->ra_lock);
	/* What the transfer alone would have taken is not latency. */
	lat = ic->bw_Bps > 0 ? t - (double)bytes / ic->bw_Bps : t;
	lat = MAX(lat, 0.0);
	ic->rtt_s = ic->rtt_s > 0 ? 0.75 * ic->rtt_s + 0.25 * lat : lat;
	if (bytes >= RA_BW_SAMPLE && t > ic->rtt_s) {
		double bw = (double)bytes / (t - ic->rtt_s);

		ic->bw_Bps = ic->bw_Bps > 0 ? 0.75 * ic->bw_Bps + 0.25 * bw : bw;
	}
	pthread_mutex_unlock(&ic->ra_lock);
}

static int timed_read(void *ctx, uint64_t off, void *buf, size_t len)
{
	struct timed_source *ts = ctx;
	uint64_t t0 = ferry_now_ns();
	int ret = ts->inner.read(ts->inner.ctx, off, buf, len);

	atomic_fetch_add(&ts->ic->fetches, 1);
	if (in_readahead)
		atomic_fetch_add(&ts->ic->fetches_ahead, 1);
	if (!ret)
		link_sample(ts->ic, len, ferry_now_ns() - t0);
	return ret;
}

/* The readahead window's size now: RA_BDP_FACTOR x bandwidth x RTT. */
static uint64_t ra_budget(struct image_cache *ic)
{
	double b = RA_BDP_FACTOR * ic->bw_Bps * ic->rtt_s;

	return (uint64_t)MIN(MAX(b, (double)RA_MIN), (double)RA_MAX);
}

static int ensure(struct image_cache *ic, uint32_t index, uint64_t uoff,
		  uint64_t len, bool demand);
static int locate(const struct image_cache *ic, const struct meta_stat *st,
		  uint64_t pos, uint32_t *index, uint64_t *uoff);

/*
 * The walk's directory tree: @path's depth names its parent on the
 * stack (meta_walk visits a directory before its entries, depth first).
 * Files of one chunk of at most RA_DIR_FILE bytes go into dfiles.
 */
static int dir_add(struct image_cache *ic, const char *path,
		   const struct meta_stat *st)
{
	size_t depth = 0;
	uint32_t parent, index;
	const char *p;
	uint64_t uoff;
	int ret;

	for (p = path; *p && path[1]; p++)
		depth += *p == '/';
	parent = depth ? ic->walk_stack[depth - 1] : 0;
	if (S_ISDIR(st->mode)) {
		if (array_reserve(&ic->dirs, &ic->dirs_cap, ic->nr_dirs + 1,
				  sizeof(*ic->dirs), 256) ||
		    array_reserve(&ic->walk_stack, &ic->walk_depth_cap, depth + 1,
				  sizeof(*ic->walk_stack), 32))
			return -ENOMEM;
		ic->dirs[ic->nr_dirs] = (struct ra_dir){
			.parent = parent, .depth = (uint32_t)depth,
		};
		ic->walk_stack[depth] = (uint32_t)ic->nr_dirs++;
		return 0;
	}
	if (!depth || !S_ISREG(st->mode) || st->nr_chunks != 1 ||
	    !st->size || st->size > RA_DIR_FILE)
		return 0;
	ret = locate(ic, st, 0, &index, &uoff);
	if (ret)
		return ret < 0 ? ret : 0; /* a hole */
	if (array_reserve(&ic->dfiles, &ic->dfiles_cap, ic->nr_dfiles + 1,
			  sizeof(*ic->dfiles), 256))
		return -ENOMEM;
	ic->dfiles[ic->nr_dfiles++] = (struct ra_dfile){
		.nid = st->nid, .dir = parent, .index = index, .uoff = uoff,
		.len = (uint32_t)st->size,
	};
	return 0;
}

/* The walk also maps the loader dependencies' paths to inodes. */
static int elf_entry_add(struct image_cache *ic, const char *path,
			 const struct meta_stat *st)
{
	const struct image_elf_entry *e = image_elf_find(ic->img, path);

	if (!e)
		return 0;
	if (array_reserve(&ic->elf_by_nid, &ic->elf_by_nid_cap, ic->nr_elf_by_nid + 1,
			  sizeof(*ic->elf_by_nid), 64))
		return -ENOMEM;
	ic->elf_by_nid[ic->nr_elf_by_nid++] = (struct ra_nidx){
		st->nid, (uint32_t)(e - ic->img->elf)
	};
	return 0;
}

static int owner_add(void *ctx, const char *path, const struct meta_stat *st)
{
	struct image_cache *ic = ctx;
	uint64_t c, uoff;
	uint32_t index;
	int ret;

	ret = dir_add(ic, path, st);
	if (ret)
		return ret;
	if (!S_ISREG(st->mode) || !st->nr_chunks)
		return 0;
	ret = elf_entry_add(ic, path, st);
	if (ret)
		return ret;
	/* A larger file's first chunk only: a miss there may be an exec. */
	for (c = 0; c < (st->size > RA_FILE_MAX ? 1 : st->nr_chunks) &&
		    c * st->chunk_size < st->size; c++) {
		ret = locate(ic, st, c * st->chunk_size, &index, &uoff);
		if (ret < 0)
			return ret;
		if (ret)
			continue; /* a hole */
		if (array_reserve(&ic->owners, &ic->owners_cap, ic->nr_owners + 1,
				  sizeof(*ic->owners), 256))
			return -ENOMEM;
		ic->owners[ic->nr_owners++] = (struct ra_owner){
			.index = index,
			.len = (uint32_t)MIN((uint64_t)st->chunk_size,
					     st->size - c * st->chunk_size),
			.uoff = uoff,
			.nid = st->nid,
		};
	}
	return 0;
}

static int owner_cmp(const void *a, const void *b)
{
	const struct ra_owner *x = a, *y = b;

	if (x->index != y->index)
		return x->index < y->index ? -1 : 1;
	return x->uoff < y->uoff ? -1 : x->uoff > y->uoff;
}

static int dfile_cmp(const void *a, const void *b)
{
	const struct ra_dfile *x = a, *y = b;

	if (x->dir != y->dir)
		return x->dir < y->dir ? -1 : 1;
	if (x->index != y->index)
		return x->index < y->index ? -1 : 1;
	return x->uoff < y->uoff ? -1 : x->uoff > y->uoff;
}

static int nidx_cmp(const void *a, const void *b)
{
	const struct ra_nidx *x = a, *y = b;

	return x->nid < y->nid ? -1 : x->nid > y->nid;
}

/* Directories' file ranges and subdirectory lists, from the walk's tables. */
static int dirs_index(struct image_cache *ic)
{
	size_t i, n = ic->nr_dfiles;
	uint32_t d, k;

	ic->dfile_by_nid = malloc(MAX(n, (size_t)1) * sizeof(*ic->dfile_by_nid));
	ic->kids = malloc(MAX(ic->nr_dirs, (size_t)1) * sizeof(*ic->kids));
	if (!ic->dfile_by_nid || !ic->kids)
		return -ENOMEM;
	if (n) /* no small file: dfiles is NULL, which qsort must not get */
		qsort(ic->dfiles, n, sizeof(*ic->dfiles), dfile_cmp);
	for (i = 0; i < n; i++) {
		struct ra_dir *dir = &ic->dirs[ic->dfiles[i].dir];

		if (!dir->nr++)
			dir->first = (uint32_t)i;
		ic->dfile_by_nid[i] = (struct ra_nidx){ ic->dfiles[i].nid, (uint32_t)i };
	}
	qsort(ic->dfile_by_nid, n, sizeof(*ic->dfile_by_nid), nidx_cmp);
	/* Preorder: a directory's subdirectories come after it, in order. */
	for (d = 1; d < ic->nr_dirs; d++)
		ic->dirs[ic->dirs[d].parent].nr_kids++;
	for (d = 0, k = 0; d < ic->nr_dirs; d++) {
		ic->dirs[d].kids = k;
		k += ic->dirs[d].nr_kids;
		ic->dirs[d].nr_kids = 0;
	}
	for (d = 1; d < ic->nr_dirs; d++) {
		struct ra_dir *p = &ic->dirs[ic->dirs[d].parent];

		ic->kids[p->kids + p->nr_kids++] = d;
	}
	return 0;
}

/*
 * The owners of every chunk of the files readahead may fetch whole and of
 * the first chunk of larger ones (for ELF prediction), for misses that
 * name a blob range only (fanotify, cachefiles), and the directory tree of
 * small files. Built in the background: until it is
 * there, such misses get the window alone, as they always do in native
 * layers (no merged tree to map).
 */
static void owners_build(struct image_cache *ic)
{
	int ret;

	if (ic->img->erofs_layers)
		return;
	ret = meta_walk(ic->img->meta, owner_add, ic);

	free(ic->walk_stack);
	ic->walk_stack = NULL;
	if (!ret)
		ret = dirs_index(ic);
	if (ret) {
		ferry_dbg("%s: readahead: no map of files to blob ranges: %s",
			  ic->img->ref, ferry_strerror(ret));
		return;
	}
	if (ic->nr_owners)
		qsort(ic->owners, ic->nr_owners, sizeof(*ic->owners), owner_cmp);
	if (ic->nr_elf_by_nid)
		qsort(ic->elf_by_nid, ic->nr_elf_by_nid, sizeof(*ic->elf_by_nid),
		      nidx_cmp);
	atomic_store(&ic->owners_ready, true);
}

/* The file that blob @index's byte @uoff belongs to: 0 and *@st, or -ENOENT. */
static int owner_find(struct image_cache *ic, uint32_t index, uint64_t uoff,
		      struct meta_stat *st)
{
	size_t lo = 0, hi = ic->nr_owners;
	const struct ra_owner *o;

	if (!atomic_load(&ic->owners_ready))
		return -ENOENT;
	/* The last owner that starts at or before (index, uoff). */
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		o = &ic->owners[mid];
		if (o->index < index || (o->index == index && o->uoff <= uoff))
			lo = mid + 1;
		else
			hi = mid;
	}
	if (!lo)
		return -ENOENT;
	o = &ic->owners[lo - 1];
	if (o->index != index || uoff >= o->uoff + o->len)
		return -ENOENT;
	return meta_getattr(ic->img->meta, o->nid, st);
}

static void elf_predict(struct image_cache *ic, uint64_t nid);
static void elf_scan(struct image_cache *ic, const struct ra_job *j);

static void *ra_main(void *arg)
{
	struct image_cache *ic = arg;
	struct ra_job j;
	uint64_t pos, step;
	int ret;

	in_readahead = true;
	if (!atomic_exchange(&ic->owners_claimed, true))
		owners_build(ic);
	pthread_mutex_lock(&ic->ra_lock);
	for (;;) {
		while (!ic->ra_nr && !ic->ra_quit)
			pthread_cond_wait(&ic->ra_cond, &ic->ra_lock);
		if (ic->ra_quit)
			break;
		/* Newest first: the window a reader has just reached. */
		j = ic->ra_q[(ic->ra_head + --ic->ra_nr) % RA_QUEUE];
		pthread_mutex_unlock(&ic->ra_lock);
		if (j.elf)
			elf_predict(ic, j.elf - 1);
		for (pos = j.uoff; pos < j.uoff + j.len; pos += step) {
			step = MIN(j.uoff + j.len - pos, (uint64_t)RA_STEP);
			if (atomic_load(&ic->ra_quit))
				break;
			ret = ensure(ic, j.index, pos, step, false);
			if (ret) {
				/* A demand read of these bytes will say why. */
				ferry_dbg("%s: readahead of blob %u bytes %llu+%llu: %s",
					  ic->img->ref, j.index, (unsigned long long)pos,
					  (unsigned long long)step, ferry_strerror(ret));
				break;
			}
			atomic_fetch_add(&ic->bytes_ahead, step);
		}
		if (j.modules && pos >= j.uoff + j.len)
			elf_scan(ic, &j);
		pthread_mutex_lock(&ic->ra_lock);
	}
	pthread_mutex_unlock(&ic->ra_lock);
	return NULL;
}

static void ra_start(struct image_cache *ic)
{
	int err;

	while (ic->nr_ra_threads < RA_THREADS) {
		err = pthread_create(&ic->ra_threads[ic->nr_ra_threads], NULL, ra_main, ic);
		if (err) {
			ferry_warn("%s: cannot start a readahead thread (%s): %u of %u run, reads wait for more round trips",
				   ic->img->ref, strerror(err), ic->nr_ra_threads, RA_THREADS);
			return;
		}
		ic->nr_ra_threads++;
	}
}

/*
 * Queue @j; under ra_lock. The threads start with the first job: a mount
 * that never misses has none.
 */
static void ra_push_job(struct image_cache *ic, struct ra_job j)
{
	if (!ic->ra_started) {
		ic->ra_started = true;
		ra_start(ic);
	}
	if (ic->ra_nr == RA_QUEUE) { /* drop the oldest: readers moved on */
		ic->ra_head = (ic->ra_head + 1) % RA_QUEUE;
		ic->ra_nr--;
	}
	ic->ra_q[(ic->ra_head + ic->ra_nr++) % RA_QUEUE] = j;
	pthread_cond_signal(&ic->ra_cond);
}

/* Queue [@uoff, @uoff + @len) of blob @index; under ra_lock. */
static void ra_push(struct image_cache *ic, uint32_t index, uint64_t uoff,
		    uint64_t len)
{
	ra_push_job(ic, (struct ra_job){ .index = index, .uoff = uoff, .len = len });
}

/* The same for small files that directory prediction chose. */
static void ra_push_modules(struct image_cache *ic, uint32_t index,
			    uint64_t uoff, uint64_t len)
{
	ra_push_job(ic, (struct ra_job){ .index = index, .uoff = uoff, .len = len,
					 .modules = true });
}

/*
 * After a demand read of [@uoff, @uoff + @len) of blob @index (@missed:
 * it had to fetch). A miss outside the blob's window starts a new one
 * with a quarter of the budget after the read (a random reader wastes
 * little); a read that crosses the window's mark (the start of its last
 * segment) queues a segment twice as large as the last, up to the
 * budget, so a sequential reader stays a segment or two ahead (a hit
 * comes here only in a file larger than RA_FILE_MAX: demand_ensure).
 */
static void ra_queue(struct image_cache *ic, uint32_t index, uint64_t uoff,
		     uint64_t len, bool missed)
{
	struct ra_window *w;
	uint64_t size, end, budget, from, seg;

	if (!ic->ra_on)
		return;
	w = &ic->ra_win[index];
	/* The common case, a hit before the mark, takes no lock. */
	if (!missed && !(uoff + len > atomic_load_explicit(&w->mark, memory_order_relaxed) &&
			 uoff < atomic_load_explicit(&w->end, memory_order_relaxed)))
		return;
	size = ic->img->blobs.blobs[index].uncompressed_size;
	pthread_mutex_lock(&ic->ra_lock);
	budget = ra_budget(ic);
	end = atomic_load(&w->end);
	if (uoff + len > w->origin && uoff < end) {
		if (uoff + len <= atomic_load(&w->mark))
			goto out; /* queued already, and the reader is not near its end */
		from = end;
		seg = MIN(2 * w->seg, budget);
	} else {
		w->origin = uoff;
		from = uoff + len;
		seg = MAX(budget / 4, (uint64_t)RA_FIRST);
	}
	if (from >= size || atomic_load(&ic->ra_quit))
		goto out;
	seg = MIN(seg, size - from);
	ra_push(ic, index, from, seg);
	w->seg = seg;
	atomic_store(&w->mark, from);
	atomic_store(&w->end, from + seg);
out:
	pthread_mutex_unlock(&ic->ra_lock);
}

int image_cache_open(struct image *img, const char *cache_dir,
		     struct image_cache **out)
{
	uint8_t (*digests)[BLOB_DIGEST_SIZE] = NULL, keep[3][BLOB_DIGEST_SIZE];
	struct image_cache *ic = calloc(1, sizeof(*ic));
	uint32_t i, n = img->blobs.nr_blobs;
	int ret = -ENOMEM;

	if (!ic)
		return -ENOMEM;
	ic->img = img;
	ic->nr_blobs = n;
	pthread_mutex_init(&ic->ra_lock, NULL);
	pthread_cond_init(&ic->ra_cond, NULL);
	ic->blobs = calloc(n + 1, sizeof(*ic->blobs));
	ic->srcs = calloc(n + 1, sizeof(*ic->srcs));
	ic->tsrcs = calloc(n + 1, sizeof(*ic->tsrcs));
	ic->ra_win = calloc(n + 1, sizeof(*ic->ra_win));
	digests = calloc(n + 1, sizeof(*digests));
	if (!ic->blobs || !ic->srcs || !ic->tsrcs || !ic->ra_win || !digests)
		goto fail;
	ret = blob_cache_dir(cache_dir, NULL, true, NULL);
	if (ret)
		goto fail;
	for (i = 0; i < n; i++)
		memcpy(digests[i], img->blobs.blobs[i].digest, BLOB_DIGEST_SIZE);
	/* Recorded first, so a concurrent gc keeps what is being filled,
	 * with the documents and the bootstrap file the cache may hold for
	 * it (meta/, bootstraps/: image_meta_gc); a dir: image has no config. */
	memcpy(keep[0], img->image_digest, BLOB_DIGEST_SIZE);
	memcpy(keep[1], img->bootstrap_digest, BLOB_DIGEST_SIZE);
	memcpy(keep[2], img->config_digest, BLOB_DIGEST_SIZE);
	ret = blob_cache_add_image(cache_dir, img->ref, img->image_digest,
				   (const uint8_t (*)[BLOB_DIGEST_SIZE])digests, n,
				   (const uint8_t (*)[BLOB_DIGEST_SIZE])keep,
				   mem_is_zero(keep[2], BLOB_DIGEST_SIZE) ? 2 : 3);
	for (i = 0; !ret && i < n; i++) {
		ret = image_blob_source(img, i, &ic->tsrcs[i].inner);
		ic->tsrcs[i].ic = ic;
		ic->srcs[i] = (struct blob_source){ timed_read, &ic->tsrcs[i],
						    ic->tsrcs[i].inner.stream };
		if (!ret)
			ret = blob_cache_open(cache_dir, &img->blobs.blobs[i],
					      &ic->blobs[i]);
	}
	if (ret)
		goto fail;
	/* Local blob files answer at once: nothing to hide. */
	ic->ra_on = img->remote != NULL;
	free(digests);
	*out = ic;
	return 0;
fail:
	free(digests);
	image_cache_close(ic);
	return ret;
}

const char *image_cache_data_path(const struct image_cache *ic, uint32_t index)
{
	return blob_cache_data_path(ic->blobs[index]);
}

int image_cache_data_fd(const struct image_cache *ic, uint32_t index)
{
	return blob_cache_data_fd(ic->blobs[index]);
}

struct image *image_cache_img(const struct image_cache *ic)
{
	return ic->img;
}

int image_cache_fill(struct image_cache *ic, uint32_t index, uint64_t uoff,
		     uint64_t len)
{
	return ensure(ic, index, uoff, len, false);
}

void image_cache_set_sb_note(struct image_cache *ic,
			     void (*noted)(void *ctx, const char *sysfs), void *ctx)
{
	ic->sb_noted = noted;
	ic->sb_noted_ctx = ctx;
}

void image_cache_note_sb(const struct image_cache *ic, const char *sysfs)
{
	if (ic->sb_noted)
		ic->sb_noted(ic->sb_noted_ctx, sysfs);
}

static void count_miss(struct image_cache *ic, uint64_t ns)
{
	static const uint64_t bounds[] = IMAGE_LATENCY_BOUNDS_MS;
	size_t b = 0;

	_Static_assert(ARRAY_SIZE(bounds) + 1 == IMAGE_LATENCY_BUCKETS,
		       "one bucket per bound plus the overflow one");
	while (b < ARRAY_SIZE(bounds) && ns > bounds[b] * 1000000u)
		b++;
	atomic_fetch_add(&ic->misses, 1);
	atomic_fetch_add(&ic->miss_ns_total, ns);
	atomic_fetch_add(&ic->miss_ms[b], 1);
}

/* Demand reads and prefetch; only the demand ones count as hits or misses. */
/* A demand read's outcome for the metrics: an error, a miss or a hit. */
static void count_demand(struct image_cache *ic, int ret, uint64_t fetched,
			 uint64_t start)
{
	if (ret)
		atomic_fetch_add(&ic->fetch_errors, 1);
	else if (fetched)
		count_miss(ic, ferry_now_ns() - start);
	else
		atomic_fetch_add(&ic->hits, 1);
}

static int ensure(struct image_cache *ic, uint32_t index, uint64_t uoff,
		  uint64_t len, bool demand)
{
	uint64_t fetched = 0, start = demand ? ferry_now_ns() : 0;
	int ret = blob_cache_ensure(ic->blobs[index], uoff, len, &ic->srcs[index],
				    &fetched);

	atomic_fetch_add(&ic->bytes_fetched, fetched);
	if (demand)
		count_demand(ic, ret, fetched, start);
	return ret;
}

/*
 * The first miss in a regular file of at most RA_FILE_MAX bytes queues
 * the whole file, in pieces of at most RA_STEP contiguous blob bytes that
 * the threads share: a file is usually read whole once opened, and a
 * mapped library faults all over it. The threads take the newest piece
 * first: with @start_first the pieces are queued from the file's end, so
 * that its start comes first (a predicted program's reader wants its
 * header next); else from its start, so that a reader's own miss is not
 * inside the first step a thread fetches (it would wait for the whole
 * step instead of its frame).
 */
static void ra_file(struct image_cache *ic, const struct meta_stat *st,
		    bool start_first)
{
	uint64_t c, nr, pos, n, uoff = 0, run_off = 0, run_len = 0;
	uint32_t index = 0, run_index = 0;
	uint64_t *slot = &ic->ra_files[st->nid % RA_FILES];

	if (!ic->ra_on || st->size > RA_FILE_MAX)
		return;
	pthread_mutex_lock(&ic->ra_lock);
	if (*slot == st->nid + 1) {
		pthread_mutex_unlock(&ic->ra_lock);
		return;
	}
	*slot = st->nid + 1;
	nr = DIV_ROUND_UP(st->size, st->chunk_size);
	for (c = 0; c < nr; c++) {
		int ret;

		pos = (start_first ? nr - 1 - c : c) * st->chunk_size;
		n = MIN(st->size - pos, (uint64_t)st->chunk_size);
		ret = locate(ic, st, pos, &index, &uoff);
		if (ret < 0)
			break; /* the reader's own read reports it */
		if (ret)
			continue; /* a hole */
		if (run_len && index == run_index && run_len + n <= RA_STEP &&
		    (start_first ? uoff + n == run_off : run_off + run_len == uoff)) {
			run_off = MIN(run_off, uoff);
			run_len += n;
			continue;
		}
		if (run_len)
			ra_push(ic, run_index, run_off, run_len);
		run_index = index;
		run_off = uoff;
		run_len = n;
	}
	if (run_len)
		ra_push(ic, run_index, run_off, run_len);
	pthread_mutex_unlock(&ic->ra_lock);
}

/* The small file @nid in the directory map, or NULL. */
static const struct ra_dfile *dfile_find(const struct image_cache *ic, uint64_t nid)
{
	const struct ra_nidx key = { .nid = nid }, *x;

	x = bsearch(&key, ic->dfile_by_nid, ic->nr_dfiles, sizeof(key), nidx_cmp);
	return x ? &ic->dfiles[x->i] : NULL;
}

/*
 * The first small file of each of @p's first RA_DIR_SIBLINGS subdirectories
 * that have some, but @skip, into @out; once per @p, and none for a @p
 * whose subdirectories are nearer the root than RA_DIR_DEPTH. Under ra_lock.
 */
static uint32_t kids_first_files(struct image_cache *ic, struct ra_dir *p,
				 const struct ra_dir *skip,
				 const struct ra_dfile **out)
{
	uint32_t i, n = 0;

	if (p->kids_done || p->depth + 1 < RA_DIR_DEPTH)
		return 0;
	p->kids_done = true;
	for (i = 0; i < p->nr_kids && n < RA_DIR_SIBLINGS; i++) {
		const struct ra_dir *s = &ic->dirs[ic->kids[p->kids + i]];

		if (s != skip && s->nr)
			out[n++] = &ic->dfiles[s->first];
	}
	return n;
}

/*
 * Directory prediction, after a miss in the small file @nid: a program
 * that loads modules (a Python import, a dynamic linker's libraries,
 * locale and gconv files) reads many small files of one directory, and
 * goes on into the packages beside it, each its own stall as it faults
 * in one new file after another. So, once per directory D, queue D's
 * small files within RA_DIR_SPAN blob bytes around the miss (the window
 * only goes forward) and the first small file of each of D's sibling
 * directories (a package's __init__, usually in the frame of the rest of
 * it), once per parent, or of its parent's siblings where D's have none.
 * The threads take the newest job first: the siblings are queued
 * last one first, then D's files, so that D goes first, then the
 * siblings in directory order, all after the file's own pieces (which
 * demand_ensure queues next). Under ra_lock.
 */
static void ra_dir(struct image_cache *ic, uint64_t nid)
{
	const struct ra_dfile *f, *g, *sibs[RA_DIR_SIBLINGS];
	uint64_t lo, hi, run_off = 0, run_end = 0;
	uint32_t i, run_index = 0, nr_sibs = 0;
	struct ra_dir *d, *p;

	if (!atomic_load(&ic->owners_ready) || ic->rtt_s < RA_DIR_RTT_MIN)
		return;
	f = dfile_find(ic, nid);
	if (!f || ic->dirs[f->dir].done || ic->dirs[f->dir].depth < RA_DIR_DEPTH)
		return;
	d = &ic->dirs[f->dir];
	d->done = true;
	p = &ic->dirs[d->parent];
	if (!p->kids_done) {
		nr_sibs = kids_first_files(ic, p, d, sibs);
		/* None has small files (D is a package's __pycache__): the
		 * siblings of D's parent, the other packages. */
		if (!nr_sibs)
			nr_sibs = kids_first_files(ic, &ic->dirs[p->parent], p, sibs);
	}
	while (nr_sibs--) {
		g = sibs[nr_sibs];
		if (!blob_cache_range_present(ic->blobs[g->index], g->uoff, g->len))
			ra_push_modules(ic, g->index, g->uoff, g->len);
	}
	lo = f->uoff > RA_DIR_SPAN / 2 ? f->uoff - RA_DIR_SPAN / 2 : 0;
	hi = f->uoff + RA_DIR_SPAN / 2;
	/* D's files, in runs of at most RA_STEP blob bytes. */
	for (i = d->first; i < d->first + d->nr; i++) {
		g = &ic->dfiles[i];
		if (g->index != f->index || g->uoff + g->len <= lo || g->uoff >= hi)
			continue;
		if (run_end && g->index == run_index && g->uoff + g->len - run_off <= RA_STEP) {
			run_end = MAX(run_end, g->uoff + g->len);
			continue;
		}
		if (run_end)
			ra_push_modules(ic, run_index, run_off, run_end - run_off);
		run_index = g->index;
		run_off = g->uoff;
		run_end = g->uoff + g->len;
	}
	if (run_end)
		ra_push_modules(ic, run_index, run_off, run_end - run_off);
}

/*
 * ELF prediction. A program's start is read first (by execve, or by the
 * loader's dlopen), and then the dynamic loader opens one file after
 * another, each its own stall: the interpreter, /etc/ld.so.cache, the
 * program's DT_NEEDED libraries, theirs in turn. Once the miss at a
 * program's start has its header, a readahead thread reads its
 * dependencies (elf.c; the bytes it needs, such as the dynamic section
 * at the end of a large program, are fetched as readahead), finds them
 * in the image as the loader would (DT_RUNPATH or DT_RPATH directories
 * without $ORIGIN, then the standard and multiarch directories; ld.so's
 * cache is not read), and queues each whole (ra_file) with, for a
 * library, its own inspection. Each file once per mount (elf_seen).
 */

/* Under ra_lock: true the first time @nid comes here. */
static bool elf_first(struct image_cache *ic, uint64_t nid)
{
	uint32_t i;

	for (i = 0; i < ic->nr_elf_seen; i++)
		if (ic->elf_seen[i] == nid)
			return false;
	if (ic->nr_elf_seen == ELF_SEEN_MAX)
		return false;
	ic->elf_seen[ic->nr_elf_seen++] = nid;
	return true;
}

/* Whether [@uoff, @uoff + @len) of blob @index holds @st's first byte. */
static bool miss_at_start(struct image_cache *ic, const struct meta_stat *st,
			  uint32_t index, uint64_t uoff, uint64_t len)
{
	uint64_t start;
	uint32_t first;

	return ic->ra_on && st->nr_chunks && !locate(ic, st, 0, &first, &start) &&
	       first == index && start >= uoff && start - uoff < len;
}

/* Queue @nid's inspection, once per mount. */
static void elf_push(struct image_cache *ic, uint64_t nid)
{
	pthread_mutex_lock(&ic->ra_lock);
	if (elf_first(ic, nid))
		ra_push_job(ic, (struct ra_job){ .elf = nid + 1 });
	pthread_mutex_unlock(&ic->ra_lock);
}

/* After the miss at @st's start made it present: is it a program? */
static void elf_check(struct image_cache *ic, const struct meta_stat *st)
{
	uint8_t magic[4];

	if (image_cache_read_cached(ic, st, 0, magic, sizeof(magic)) == sizeof(magic) &&
	    !memcmp(magic, "\177ELF", 4))
		elf_push(ic, st->nid);
}

struct elf_src {
	struct image_cache *ic;
	const struct meta_stat *st;
};

/* elf.c's reads: the bytes are fetched as readahead, then read. */
static int elf_src_read(void *ctx, uint64_t off, void *buf, size_t len)
{
	const struct elf_src *s = ctx;
	uint64_t pos, n, uoff;
	uint32_t index;
	ssize_t got;
	int ret;

	if (atomic_load(&s->ic->ra_quit))
		return -ECANCELED; /* unmounting */
	for (pos = off; pos < off + len; pos += n) {
		n = MIN(off + len - pos,
			(uint64_t)s->st->chunk_size - pos % s->st->chunk_size);
		ret = locate(s->ic, s->st, pos, &index, &uoff);
		if (!ret)
			ret = ensure(s->ic, index, uoff, n, false);
		if (ret < 0)
			return ret;
	}
	got = image_cache_read_cached(s->ic, s->st, off, buf, len);
	if (got < 0)
		return (int)got;
	return (size_t)got == len ? 0 : -EIO;
}

/* The file at @path (links followed), if it has chunks to fetch. */
static int elf_find(struct image_cache *ic, const char *path, struct meta_stat *st)
{
	uint64_t nid;
	int ret = meta_resolve_follow(ic->img->meta, path, &nid);

	if (!ret)
		ret = meta_getattr(ic->img->meta, nid, st);
	if (!ret && (!S_ISREG(st->mode) || !st->nr_chunks))
		ret = -ENOENT;
	return ret;
}

/* Queue @st whole, and with @inspect its own dependencies after it. */
static void elf_queue(struct image_cache *ic, const struct meta_stat *st,
		      bool inspect)
{
	bool first;

	pthread_mutex_lock(&ic->ra_lock);
	first = elf_first(ic, st->nid);
	if (first && inspect)
		ra_push_job(ic, (struct ra_job){ .elf = st->nid + 1 });
	pthread_mutex_unlock(&ic->ra_lock);
	if (first)
		ra_file(ic, st, true);
}

/* Debian's multiarch directory for the machine, or NULL. */
static const char *elf_triplet(const struct elf_deps *d)
{
	switch (d->machine) {
	case 62: /* EM_X86_64 */
		return d->is64 ? "x86_64-linux-gnu" : NULL;
	case 3: /* EM_386 */
		return "i386-linux-gnu";
	case 183: /* EM_AARCH64 */
		return "aarch64-linux-gnu";
	case 40: /* EM_ARM */
		return "arm-linux-gnueabihf";
	case 21: /* EM_PPC64, little-endian: elf.c reads no other */
		return "powerpc64le-linux-gnu";
	case 243: /* EM_RISCV */
		return d->is64 ? "riscv64-linux-gnu" : NULL;
	default:
		return NULL;
	}
}

/* The interpreter and the loader's cache of a dynamic program. */
static void elf_queue_loader(struct image_cache *ic, const char *interp)
{
	struct meta_stat lib;

	if (!elf_find(ic, "/etc/ld.so.cache", &lib))
		elf_queue(ic, &lib, false);
	if (!elf_find(ic, interp, &lib))
		elf_queue(ic, &lib, false);
}

/*
 * Queued as soon as a program's header names the interpreter: the kernel
 * maps the interpreter right after the header, while the libraries'
 * names wait for the dynamic section (at the end of dash: another round
 * trip).
 */
static void elf_interp(void *ctx, const char *interp)
{
	const struct elf_src *s = ctx;

	elf_queue_loader(s->ic, interp);
}

/* @d's DT_NEEDED libraries, found as the loader would, last one first. */
static void elf_queue_libs(struct image_cache *ic, const struct elf_deps *d)
{
	static const char *const std_dirs[] = { "/lib64", "/usr/lib64", "/lib", "/usr/lib" };
	const char *dirs[ELF_RUNPATH_DIRS + 2 + ARRAY_SIZE(std_dirs)];
	char multi[2][64], path[4096], runpath[4097], *save = NULL, *dir;
	struct meta_stat lib;
	const char *triplet;
	size_t nr_dirs = 0, i, k;

	/* A copy to cut up: at most 4096 bytes (elf.c's and FORMAT.md's limit). */
	snprintf(runpath, sizeof(runpath), "%s", d->runpath ? d->runpath : "");
	for (dir = strtok_r(runpath, ":", &save);
	     dir && nr_dirs < ELF_RUNPATH_DIRS; dir = strtok_r(NULL, ":", &save))
		if (dir[0] == '/' && !strchr(dir, '$'))
			dirs[nr_dirs++] = dir;
	triplet = elf_triplet(d);
	if (triplet) {
		snprintf(multi[0], sizeof(multi[0]), "/lib/%s", triplet);
		snprintf(multi[1], sizeof(multi[1]), "/usr/lib/%s", triplet);
		dirs[nr_dirs++] = multi[0];
		dirs[nr_dirs++] = multi[1];
	}
	for (k = 0; k < ARRAY_SIZE(std_dirs); k++)
		dirs[nr_dirs++] = std_dirs[k];
	for (i = d->nr_needed; i-- > 0;) {
		if (strchr(d->needed[i], '/'))
			continue;
		for (k = 0; k < nr_dirs; k++) {
			if ((size_t)snprintf(path, sizeof(path), "%s/%s", dirs[k],
					     d->needed[i]) < sizeof(path) &&
			    !elf_find(ic, path, &lib)) {
				elf_queue(ic, &lib, true);
				break;
			}
		}
	}
}

/* What `ferry convert` recorded of @nid (FORMAT.md 2.6), or NULL. */
static const struct elf_deps *elf_recorded(struct image_cache *ic, uint64_t nid)
{
	const struct ra_nidx key = { .nid = nid }, *x;

	if (!atomic_load(&ic->owners_ready) || !ic->nr_elf_by_nid)
		return NULL;
	x = bsearch(&key, ic->elf_by_nid, ic->nr_elf_by_nid, sizeof(key), nidx_cmp);
	return x ? &ic->img->elf[x->i].deps : NULL;
}

/*
 * The dependencies of @nid: those the image records, at once, or else
 * read from its header. The threads take the newest job first: the
 * libraries last one first, then the interpreter (with a recorded one,
 * queued last; a read one went when the header named it: elf_interp).
 */
static void elf_predict(struct image_cache *ic, uint64_t nid)
{
	const struct elf_deps *rec = elf_recorded(ic, nid);
	struct meta_stat st;
	struct elf_src src = { ic, &st };
	struct elf_deps d;

	if (rec) {
		atomic_fetch_add(&ic->programs_recorded, 1);
		elf_queue_libs(ic, rec);
		if (rec->interp)
			elf_queue_loader(ic, rec->interp);
		return;
	}
	if (meta_getattr(ic->img->meta, nid, &st) || !S_ISREG(st.mode) || !st.nr_chunks)
		return;
	atomic_fetch_add(&ic->programs_read, 1);
	if (elf_deps_read(elf_src_read, elf_interp, &src, st.size, &d))
		return;
	elf_queue_libs(ic, &d);
	elf_deps_free(&d);
}

/*
 * After directory prediction fetched @j: the programs among its files
 * are inspected as a miss at their start would be. A directory of
 * modules (Python's lib-dynload) is fetched before they are loaded, so
 * their loading misses only in the libraries they need (libssl,
 * libsqlite3...), each a stall that nothing predicted.
 */
static void elf_scan(struct image_cache *ic, const struct ra_job *j)
{
	size_t lo = 0, hi = ic->nr_owners;
	const struct ra_owner *o;
	struct meta_stat st;
	uint8_t magic[4];
	bool first;

	/* The first owner that ends after the job's start. */
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		o = &ic->owners[mid];
		if (o->index < j->index ||
		    (o->index == j->index && o->uoff + o->len <= j->uoff))
			lo = mid + 1;
		else
			hi = mid;
	}
	for (; lo < ic->nr_owners && !atomic_load(&ic->ra_quit); lo++) {
		o = &ic->owners[lo];
		if (o->index != j->index || o->uoff >= j->uoff + j->len)
			break;
		if (!elf_recorded(ic, o->nid) &&
		    (meta_getattr(ic->img->meta, o->nid, &st) ||
		     image_cache_read_cached(ic, &st, 0, magic, sizeof(magic)) != sizeof(magic) ||
		     memcmp(magic, "\177ELF", 4)))
			continue;
		pthread_mutex_lock(&ic->ra_lock);
		first = elf_first(ic, o->nid);
		pthread_mutex_unlock(&ic->ra_lock);
		if (first)
			elf_predict(ic, o->nid);
	}
}

static bool planned(struct image_cache *ic, uint32_t index, uint64_t uoff,
		    uint64_t len);

/* A reader's ensure (@st: of that file, or NULL): it also drives readahead. */
static int demand_ensure(struct image_cache *ic, const struct meta_stat *st,
			 uint32_t index, uint64_t uoff, uint64_t len)
{
	uint64_t size = ic->img->blobs.blobs[index].uncompressed_size;
	struct meta_stat owner;
	bool at_start;
	int ret;

	if (blob_cache_range_present(ic->blobs[index], uoff, len)) {
		/*
		 * Only a file too large to be queued whole grows the window on
		 * hits: a smaller one's hits are its own queued bytes, and
		 * growing the window past them fetched neighbours nothing read
		 * (9.7 of FUSE's 24.4 MB in a run at 20 ms RTT; fanotify's hits
		 * never come here, and it fetched 19.7 MB).
		 */
		if (st && st->size > RA_FILE_MAX)
			ra_queue(ic, index, uoff, len, false);
		atomic_fetch_add(&ic->hits, 1);
		return 0;
	}
	/*
	 * Queued first, so that readahead's fetches overlap the reader's. A
	 * miss inside a running prefetch plan queues nothing: the plan has its
	 * file's bytes under way, and a window beyond them would take the link
	 * from the listed bytes.
	 */
	if (uoff <= size && len <= size - uoff && /* else ensure says why */
	    !planned(ic, index, uoff, len)) {
		ra_queue(ic, index, uoff, len, true);
		if (!st && !owner_find(ic, index, uoff, &owner))
			st = &owner;
		if (st && st->size <= RA_DIR_FILE && ic->ra_on) {
			pthread_mutex_lock(&ic->ra_lock);
			ra_dir(ic, st->nid);
			pthread_mutex_unlock(&ic->ra_lock);
		}
		if (st)
			ra_file(ic, st, false);
	}
	/*
	 * A program the image records the dependencies of has them queued
	 * now, while its own start is fetched; another is inspected once
	 * its header is in.
	 */
	at_start = st && miss_at_start(ic, st, index, uoff, len);
	if (at_start && elf_recorded(ic, st->nid))
		elf_push(ic, st->nid);
	ret = ensure(ic, index, uoff, len, true);
	if (!ret && at_start)
		elf_check(ic, st);
	return ret;
}

int image_cache_ensure(struct image_cache *ic, uint32_t device_id,
		       uint64_t uoff, uint64_t len)
{
	int ret;

	if (device_id < 1 || device_id > ic->nr_blobs)
		return -EINVAL;
	atomic_fetch_add(&ic->demand_inflight, 1);
	ret = demand_ensure(ic, NULL, device_id - 1, uoff, len);
	atomic_fetch_sub(&ic->demand_inflight, 1);
	return ret;
}

int image_cache_read_frames(struct image_cache *ic, uint32_t device_id,
			    uint64_t uoff, uint64_t len, blob_emit_fn emit, void *ctx)
{
	uint64_t fetched = 0, start = ferry_now_ns();
	int ret;

	if (device_id < 1 || device_id > ic->nr_blobs)
		return -EINVAL;
	atomic_fetch_add(&ic->demand_inflight, 1);
	ret = blob_cache_read_frames(ic->blobs[device_id - 1], uoff, len,
				     &ic->srcs[device_id - 1], &fetched, emit, ctx);
	atomic_fetch_sub(&ic->demand_inflight, 1);
	atomic_fetch_add(&ic->bytes_fetched, fetched);
	count_demand(ic, ret, fetched, start);
	if (!ret)
		atomic_fetch_add(&ic->bytes_read, len);
	return ret;
}

bool image_cache_present(const struct image_cache *ic, uint32_t device_id,
			 uint64_t uoff, uint64_t len)
{
	return device_id >= 1 && device_id <= ic->nr_blobs &&
	       blob_cache_range_present(ic->blobs[device_id - 1], uoff, len);
}

bool image_cache_blob_complete(const struct image_cache *ic, uint32_t device_id)
{
	uint32_t chunks;

	if (device_id < 1 || device_id > ic->nr_blobs)
		return false;
	blob_cache_usage(ic->blobs[device_id - 1], &chunks, NULL);
	return chunks == ic->img->blobs.blobs[device_id - 1].nr_chunks;
}

void image_cache_kernel_reads(struct image_cache *ic)
{
	uint32_t i;

	for (i = 0; i < ic->nr_blobs; i++)
		blob_cache_kernel_reads(ic->blobs[i]);
}

/*
 * Where byte @pos of the chunk-based file @st lives: 0 and *@index (blob)
 * and *@uoff, 1 for a hole, or -EFSCORRUPTED naming the file's nid.
 */
static int locate(const struct image_cache *ic, const struct meta_stat *st,
		  uint64_t pos, uint32_t *index, uint64_t *uoff)
{
	struct meta_chunk mc;
	int ret = meta_get_chunk(ic->img->meta, st->nid, pos / st->chunk_size, &mc);

	if (ret)
		return ret;
	if (mc.blkaddr == META_CHUNK_HOLE)
		return 1;
	if (mc.device_id < 1 || mc.device_id > ic->nr_blobs) {
		ferry_err("%s: inode %llu: chunk %llu names device %u of %u",
			  ic->img->ref, (unsigned long long)st->nid,
			  (unsigned long long)(pos / st->chunk_size),
			  mc.device_id, ic->nr_blobs);
		return -EFSCORRUPTED;
	}
	*index = mc.device_id - 1u;
	*uoff = (uint64_t)mc.blkaddr * META_BLOCK_SIZE + pos % st->chunk_size;
	return 0;
}

/*
 * Make the chunks behind [off, off + len) of a chunk-based file present
 * (clamped to its size), or with !@fetch only check that they are
 * (-EAGAIN if not), and describe where the bytes are, merging contiguous
 * pieces of one cache file.
 */
static ssize_t map_chunked(struct image_cache *ic, const struct meta_stat *st,
			   uint64_t off, size_t len, struct image_extent *ext,
			   size_t max, bool fetch)
{
	uint64_t end = MIN(st->size, off + len), pos, uoff = 0;
	uint32_t index = 0;
	size_t nr = 0;
	int ret;

	for (pos = off; pos < end;) {
		size_t n = (size_t)MIN(end - pos,
				       st->chunk_size - pos % st->chunk_size);
		int fd = -1;

		ret = locate(ic, st, pos, &index, &uoff);
		if (ret < 0)
			return ret;
		if (!ret) {
			if (fetch)
				ret = demand_ensure(ic, st, index, uoff, n);
			else if (!blob_cache_range_present(ic->blobs[index], uoff, n))
				ret = -EAGAIN;
			if (ret)
				return ret;
			fd = blob_cache_data_fd(ic->blobs[index]);
		}
		if (nr && ext[nr - 1].fd == fd &&
		    (fd < 0 || ext[nr - 1].off + ext[nr - 1].len == uoff)) {
			ext[nr - 1].len += n;
		} else {
			if (nr == max)
				return -E2BIG;
			ext[nr++] = (struct image_extent){ fd, fd < 0 ? 0 : uoff, n };
		}
		pos += n;
	}
	return (ssize_t)nr;
}

ssize_t image_cache_map(struct image_cache *ic, const struct meta_stat *st,
			uint64_t off, size_t len, struct image_extent *ext,
			size_t max)
{
	unsigned int tries = 0;
	ssize_t nr;
	size_t i;

	if (!S_ISREG(st->mode) || !st->nr_chunks)
		return -EINVAL;
	atomic_fetch_add(&ic->demand_inflight, 1);
	/*
	 * Fetch without the readers lock, then check under it (eviction may
	 * take a fetched chunk back in between); the last try fetches under
	 * it. The lock is held exactly when nr >= 0 leaves the loop.
	 */
	for (;;) {
		bool last = ++tries == EVICTED_RETRIES;

		if (!last) {
			nr = map_chunked(ic, st, off, len, ext, max, true);
			if (nr < 0)
				break;
		}
		blob_cache_read_begin();
		nr = map_chunked(ic, st, off, len, ext, max, last);
		if (nr >= 0)
			break;
		blob_cache_read_end();
		if (nr != -EAGAIN || last)
			break;
	}
	atomic_fetch_sub(&ic->demand_inflight, 1);
	for (i = 0; nr > 0 && i < (size_t)nr; i++)
		atomic_fetch_add(&ic->bytes_read, ext[i].len);
	return nr;
}

void image_cache_map_end(struct image_cache *ic)
{
	(void)ic;
	blob_cache_read_end();
}

/* image_cache_read, or with !@fetch image_cache_read_cached. */
static ssize_t cache_read(struct image_cache *ic, const struct meta_stat *st,
			  uint64_t off, void *buf, size_t len, bool fetch)
{
	struct image_extent ext[8];
	uint8_t *p = buf;
	size_t done = 0, i;
	ssize_t nr;
	int ret;

	if (!S_ISREG(st->mode))
		return -EINVAL;
	if (off >= st->size)
		return 0;
	if (!st->nr_chunks)
		return meta_read(ic->img->meta, st->nid, off, buf, len);
	len = (size_t)MIN((uint64_t)len, st->size - off);
	while (done < len) {
		/* A piece at a time: eight extents cover at least 8 chunks. */
		size_t piece = MIN(len - done, (size_t)8 * st->chunk_size);

		if (fetch) {
			nr = image_cache_map(ic, st, off + done, piece, ext,
					     ARRAY_SIZE(ext));
		} else {
			blob_cache_read_begin();
			nr = map_chunked(ic, st, off + done, piece, ext,
					 ARRAY_SIZE(ext), false);
			if (nr < 0)
				blob_cache_read_end();
		}
		if (nr < 0)
			return nr;
		for (i = 0, ret = nr ? 0 : -EFSCORRUPTED;
		     !ret && i < (size_t)nr; i++) {
			if (ext[i].fd < 0)
				memset(p + done, 0, ext[i].len);
			else
				ret = pread_full(ext[i].fd, p + done,
						 ext[i].len, ext[i].off);
			done += ext[i].len;
		}
		blob_cache_read_end();
		if (ret)
			return ret;
	}
	return (ssize_t)done;
}

ssize_t image_cache_read(struct image_cache *ic, const struct meta_stat *st,
			 uint64_t off, void *buf, size_t len)
{
	return cache_read(ic, st, off, buf, len, true);
}

ssize_t image_cache_read_cached(struct image_cache *ic, const struct meta_stat *st,
				uint64_t off, void *buf, size_t len)
{
	return cache_read(ic, st, off, buf, len, false);
}

static void sleep_ms(unsigned int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000 };

	nanosleep(&ts, NULL);
}

/*
 * Keep prefetch under the bandwidth limit, from any number of threads;
 * sleeps are short enough to notice *@stop within 100 ms.
 */
static void prefetch_bwlimit(struct image_cache *ic, uint64_t step_bytes,
			     const volatile bool *stop)
{
	uint_fast64_t none = 0;
	uint64_t start, total;

	if (!ic->bwlimit)
		return;
	/* The first step starts the clock. */
	atomic_compare_exchange_strong(&ic->bw_start_ns, &none, ferry_now_ns());
	start = atomic_load(&ic->bw_start_ns);
	total = atomic_fetch_add(&ic->bw_bytes, step_bytes) + step_bytes;
	while (!(stop && *stop)) {
		uint64_t elapsed = ferry_now_ns() - start;
		uint64_t allowed = (uint64_t)((double)ic->bwlimit * (double)elapsed / 1e9);

		if (total <= allowed)
			break;
		sleep_ms((unsigned int)MIN(100.0, (double)(total - allowed) * 1000.0 /
					   (double)ic->bwlimit + 1));
	}
}

/* Whole-blob prefetch lets demand reads run first, then keeps the limit. */
static void prefetch_pace(struct image_cache *ic, uint64_t step_bytes,
			  const volatile bool *stop)
{
	unsigned int waited = 0;

	while (atomic_load(&ic->demand_inflight) && waited < PREFETCH_YIELD_MAX_MS) {
		sleep_ms(1);
		waited++;
	}
	prefetch_bwlimit(ic, step_bytes, stop);
}

/*
 * Whole-blob prefetch steps in flight in the process, over all mounts. A
 * step holds its fill's buffers (a run of up to 4 MiB of compressed bytes
 * and the frame decoded from it) until it ends, so without a bound
 * ferryd's memory grew with the mounts prefetching at once (six mounts of
 * the big image: a peak of 56-60 MiB, 46 MiB with it; PERFORMANCE.md).
 * Two keep both CPUs decoding on a fast link. Demand reads never wait.
 */
#define PREFETCH_STEPS_IN_FLIGHT 2u

static struct {
	pthread_mutex_t lock;
	pthread_cond_t freed;
	unsigned int used;
} prefetch_slots = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0 };

/* Take a step's slot; false when *@stop was set first. */
static bool prefetch_slot_take(const volatile bool *stop)
{
	struct timespec ts;
	bool took = false;

	pthread_mutex_lock(&prefetch_slots.lock);
	while (!(stop && *stop)) {
		if (prefetch_slots.used < PREFETCH_STEPS_IN_FLIGHT) {
			prefetch_slots.used++;
			took = true;
			break;
		}
		/* Nobody signals a stop: look at it every 100 ms. */
		ferry_deadline_ts(&ts, 100);
		pthread_cond_timedwait(&prefetch_slots.freed, &prefetch_slots.lock, &ts);
	}
	pthread_mutex_unlock(&prefetch_slots.lock);
	return took;
}

static void prefetch_slot_give(void)
{
	pthread_mutex_lock(&prefetch_slots.lock);
	prefetch_slots.used--;
	pthread_cond_signal(&prefetch_slots.freed);
	pthread_mutex_unlock(&prefetch_slots.lock);
}

void image_cache_set_bwlimit(struct image_cache *ic, uint64_t bytes_per_sec)
{
	ic->bwlimit = bytes_per_sec;
}

void image_cache_set_prefetch_sink(struct image_cache *ic,
				   const struct image_prefetch_sink *sink)
{
	ic->sink = *sink;
}

struct sink_call {
	struct image_cache *ic;
	uint32_t device_id;
};

static int sink_put(void *ctx, uint64_t off, const void *buf, size_t len)
{
	struct sink_call *c = ctx;

	return c->ic->sink.put(c->ic->sink.ctx, c->device_id, off, buf, len);
}

/* One prefetch step: into the sink when there is one, else the chunk cache. */
static int prefetch_step(struct image_cache *ic, uint32_t index, uint64_t uoff,
			 uint64_t len)
{
	struct sink_call c = { ic, index + 1 };
	uint64_t fetched = 0;
	int ret;

	if (!ic->sink.put)
		return ensure(ic, index, uoff, len, false);
	if (ic->sink.has(ic->sink.ctx, index + 1, uoff, len))
		return 0;
	ret = blob_cache_read_frames(ic->blobs[index], uoff, len, &ic->srcs[index],
				     &fetched, sink_put, &c);
	atomic_fetch_add(&ic->bytes_fetched, fetched);
	return ret;
}

/*
 * A prefetch plan: the blob ranges of listed files, each with the list
 * position of its first file. Running it merges ranges of one blob that
 * lie within PLAN_GAP of each other (fetching a gap is cheaper than a round
 * trip) up to PLAN_RANGE_MAX, and PLAN_THREADS fetch them at once, the
 * ranges of the first-listed files first. A list is many small ranges, so
 * round trips bound it: at 20 ms RTT a Python startup list (35 ranges,
 * 7.4 MB) took 0.59-0.64 s with 4 threads and 4 MiB ranges, 0.43-0.59 s
 * with 8 and 2 MiB (the same worst-case buffers: one range per thread).
 * Ranges of PLAN_LARGE or more (a hot run's, a big file's) go at most
 * PLAN_LARGE_IN_FLIGHT at once: with all in flight a hot-run list arrives
 * in one lump, its first-listed files last. Three, not two: two started
 * together end together and leave the link idle for the next pair's round
 * trip (a cold start at 50 ms RTT 5% faster, loopback and 20 ms RTT within
 * noise; four was slower at 20 ms; PERFORMANCE.md).
 */
#define PLAN_THREADS 8
#define PLAN_GAP (128u << 10)
#define PLAN_RANGE_MAX (2u << 20)
#define PLAN_LARGE (1u << 20)
#define PLAN_LARGE_IN_FLIGHT 3u

struct plan_range {
	uint32_t index;
	uint32_t order; /* list position of the first file it holds */
	uint64_t uoff, len;
};

struct image_prefetch_plan {
	struct plan_range *ranges;
	size_t nr, cap;
	uint32_t paths; /* list positions used */
};

void image_prefetch_plan_free(struct image_prefetch_plan *plan)
{
	if (plan) {
		free(plan->ranges);
		free(plan);
	}
}

static int plan_file(struct image_cache *ic, struct image_prefetch_plan *plan,
		     const struct meta_stat *st)
{
	uint64_t pos, n, uoff = 0;
	uint32_t index = 0;
	int ret;

	if (!S_ISREG(st->mode) || !st->nr_chunks)
		return 0;
	for (pos = 0; pos < st->size; pos += n) {
		struct plan_range *last = plan->nr ? &plan->ranges[plan->nr - 1] : NULL;

		n = MIN(st->size - pos, (uint64_t)st->chunk_size - pos % st->chunk_size);
		ret = locate(ic, st, pos, &index, &uoff);
		if (ret < 0)
			return ret;
		if (ret)
			continue; /* a hole */
		if (last && last->index == index && last->uoff + last->len == uoff) {
			last->len += n;
			continue;
		}
		if (array_reserve(&plan->ranges, &plan->cap, plan->nr + 1,
				  sizeof(*plan->ranges), 64))
			return -ENOMEM;
		plan->ranges[plan->nr++] = (struct plan_range){
			.index = index, .order = plan->paths, .uoff = uoff, .len = n,
		};
	}
	return 0;
}

/* Deeper directories are skipped: a bound on the recursion below. */
#define PREFETCH_DIR_DEPTH 64u

struct dir_walk {
	uint64_t *nids;
	size_t nr, cap;
	int err;
};

static int collect(void *arg, const char *name, size_t len, uint64_t nid,
		   unsigned int file_type, uint64_t next_pos)
{
	struct dir_walk *w = arg;

	if ((len == 1 && name[0] == '.') || (len == 2 && !memcmp(name, "..", 2)))
		return 0;
	if (array_reserve(&w->nids, &w->cap, w->nr + 1, sizeof(*w->nids), 16)) {
		w->err = -ENOMEM;
		return 1;
	}
	w->nids[w->nr++] = nid;
	return 0;
}

/* The regular file or directory tree @nid into @plan: files, or -errno. */
static int plan_nid(struct image_cache *ic, struct image_prefetch_plan *plan,
		    uint64_t nid, unsigned int depth, const char *path)
{
	struct dir_walk w = { 0 };
	struct meta_stat st;
	size_t i;
	int ret, files = 0;

	ret = meta_getattr(ic->img->meta, nid, &st);
	if (ret)
		return ret;
	if (S_ISREG(st.mode)) {
		ret = plan_file(ic, plan, &st);
		return ret ? ret : 1;
	}
	if (!S_ISDIR(st.mode))
		return 0;
	if (depth >= PREFETCH_DIR_DEPTH) {
		ferry_warn("%s: prefetch: %s: directories nested deeper than %u skipped",
			   ic->img->ref, path, PREFETCH_DIR_DEPTH);
		return 0;
	}
	ret = meta_readdir(ic->img->meta, nid, 0, collect, &w);
	if (ret > 0)
		ret = w.err;
	for (i = 0; !ret && i < w.nr; i++) {
		int n = plan_nid(ic, plan, w.nids[i], depth + 1, path);

		if (n < 0)
			ret = n;
		else
			files += n;
	}
	free(w.nids);
	return ret ? ret : files;
}

int image_prefetch_plan_add(struct image_cache *ic, struct image_prefetch_plan **plan,
			    const char *path)
{
	uint64_t nid;
	int ret;

	if (!*plan && !(*plan = calloc(1, sizeof(**plan))))
		return -ENOMEM;
	ret = meta_resolve_follow(ic->img->meta, path, &nid);
	if (!ret)
		ret = plan_nid(ic, *plan, nid, 0, path);
	(*plan)->paths++;
	return ret;
}

static int plan_by_place(const void *a, const void *b)
{
	const struct plan_range *x = a, *y = b;

	if (x->index != y->index)
		return x->index < y->index ? -1 : 1;
	return x->uoff < y->uoff ? -1 : x->uoff > y->uoff;
}

static int plan_by_order(const void *a, const void *b)
{
	const struct plan_range *x = a, *y = b;

	if (x->order != y->order)
		return x->order < y->order ? -1 : 1;
	return plan_by_place(a, b);
}

/* Sort by place, merge neighbours, then sort by list order. */
static void plan_merge(struct image_prefetch_plan *plan)
{
	size_t i, nr = 0;

	if (!plan->nr)
		return;
	qsort(plan->ranges, plan->nr, sizeof(*plan->ranges), plan_by_place);
	for (i = 1; i < plan->nr; i++) {
		struct plan_range *last = &plan->ranges[nr], *r = &plan->ranges[i];
		uint64_t end = MAX(last->uoff + last->len, r->uoff + r->len);

		if (r->index == last->index && r->uoff <= last->uoff + last->len + PLAN_GAP &&
		    end - last->uoff <= PLAN_RANGE_MAX) {
			last->len = end - last->uoff;
			last->order = MIN(last->order, r->order);
		} else {
			plan->ranges[++nr] = *r;
		}
	}
	plan->nr = nr + 1;
	qsort(plan->ranges, plan->nr, sizeof(*plan->ranges), plan_by_order);
}

struct plan_run {
	struct image_cache *ic;
	struct image_prefetch_plan *plan;
	const volatile bool *stop;
	pthread_mutex_t lock; /* guards next and large */
	pthread_cond_t large_done;
	size_t next;
	unsigned int large; /* ranges of PLAN_LARGE or more being fetched */
	atomic_int err;
};

static bool plan_stopped(const struct plan_run *run)
{
	return run->stop && *run->stop;
}

/*
 * The next range in list order, or NULL when the plan is done or stopped.
 * A large range waits while PLAN_LARGE_IN_FLIGHT others are fetched (and
 * holds back those listed after it): fetched all at once, the hot run's
 * 2 MiB ranges share the link and the CPUs, and the first-listed files
 * arrive last with the rest. Small ranges are round-trip bound and keep
 * every thread.
 */
static const struct plan_range *plan_take(struct plan_run *run)
{
	const struct plan_range *r = NULL;

	pthread_mutex_lock(&run->lock);
	while (!plan_stopped(run) && run->next < run->plan->nr &&
	       run->plan->ranges[run->next].len >= PLAN_LARGE &&
	       run->large >= PLAN_LARGE_IN_FLIGHT)
		pthread_cond_wait(&run->large_done, &run->lock);
	if (!plan_stopped(run) && run->next < run->plan->nr) {
		r = &run->plan->ranges[run->next++];
		run->large += r->len >= PLAN_LARGE;
	}
	pthread_mutex_unlock(&run->lock);
	return r;
}

static void plan_done(struct plan_run *run, const struct plan_range *r)
{
	if (r->len < PLAN_LARGE)
		return;
	pthread_mutex_lock(&run->lock);
	run->large--;
	pthread_cond_broadcast(&run->large_done);
	pthread_mutex_unlock(&run->lock);
}

static void *plan_worker(void *arg)
{
	struct plan_run *run = arg;
	struct image_cache *ic = run->ic;
	const struct plan_range *r;
	int ret;

	while ((r = plan_take(run))) {
		prefetch_bwlimit(ic, r->len, run->stop);
		/* Stopped meanwhile: the next plan_take says so. */
		if (!plan_stopped(run)) {
			ret = prefetch_step(ic, r->index, r->uoff, r->len);
			if (ret) { /* the rest may still come: go on, report the first */
				int none = 0;

				atomic_compare_exchange_strong(&run->err, &none, ret);
			} else {
				atomic_fetch_add(&ic->prefetched, r->len);
			}
		}
		plan_done(run, r);
	}
	return NULL;
}

/* Is [@uoff, @uoff + @len) of blob @index inside a running plan's range? */
static bool planned(struct image_cache *ic, uint32_t index, uint64_t uoff,
		    uint64_t len)
{
	struct plan_range key = { .index = index, .uoff = uoff };
	size_t lo = 0, hi;
	bool in = false;

	pthread_mutex_lock(&ic->ra_lock);
	/* The last range that starts at or before (index, uoff). */
	for (hi = ic->nr_planned; lo < hi;) {
		size_t mid = lo + (hi - lo) / 2;

		if (plan_by_place(&ic->planned[mid], &key) <= 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo) {
		const struct plan_range *r = &ic->planned[lo - 1];

		in = r->index == index && uoff + len <= r->uoff + r->len;
	}
	pthread_mutex_unlock(&ic->ra_lock);
	return in;
}

/* Publish @plan's ranges to demand reads (planned), or withdraw them (NULL). */
static void plan_publish(struct image_cache *ic, const struct image_prefetch_plan *plan)
{
	struct plan_range *copy = NULL;

	if (plan && (copy = malloc(plan->nr * sizeof(*copy)))) {
		memcpy(copy, plan->ranges, plan->nr * sizeof(*copy));
		qsort(copy, plan->nr, sizeof(*copy), plan_by_place);
	}
	pthread_mutex_lock(&ic->ra_lock);
	free(ic->planned);
	ic->planned = copy;
	ic->nr_planned = copy ? plan->nr : 0;
	pthread_mutex_unlock(&ic->ra_lock);
}

int image_cache_prefetch_plan(struct image_cache *ic, struct image_prefetch_plan *plan,
			      const volatile bool *stop)
{
	struct plan_run run = {
		.ic = ic, .plan = plan, .stop = stop,
		.lock = PTHREAD_MUTEX_INITIALIZER, .large_done = PTHREAD_COND_INITIALIZER,
	};
	pthread_t threads[PLAN_THREADS - 1];
	unsigned int i, nr_threads = 0;

	if (!plan)
		return 0;
	plan_merge(plan);
	/* Without the copy (no memory), readahead only duplicates work. */
	plan_publish(ic, plan);
	/* This thread is the last worker; fewer threads only mean slower. */
	for (i = 0; i + 1 < PLAN_THREADS && i + 1 < plan->nr; i++) {
		if (pthread_create(&threads[nr_threads], NULL, plan_worker, &run))
			break;
		nr_threads++;
	}
	plan_worker(&run);
	while (nr_threads)
		pthread_join(threads[--nr_threads], NULL);
	plan_publish(ic, NULL);
	return atomic_load(&run.err);
}

int image_cache_prefetch_blobs(struct image_cache *ic,
			       struct ferry_progress *progress,
			       const volatile bool *stop)
{
	uint32_t i;
	uint64_t pos, step;
	int ret;

	for (i = 0; progress && i < ic->nr_blobs; i++)
		progress->total += ic->img->blobs.blobs[i].uncompressed_size;
	for (i = 0; i < ic->nr_blobs; i++) {
		const struct blob_info *b = &ic->img->blobs.blobs[i];

		for (pos = 0; pos < b->uncompressed_size && !(stop && *stop); pos += step) {
			step = MIN(b->uncompressed_size - pos, (uint64_t)PREFETCH_STEP);
			prefetch_pace(ic, step, stop);
			if (!prefetch_slot_take(stop))
				break;
			ret = prefetch_step(ic, i, pos, step);
			prefetch_slot_give();
			if (ret)
				return ret;
			atomic_fetch_add(&ic->prefetched, step);
			if (progress)
				ferry_progress_add(progress, step);
		}
	}
	return 0;
}

void image_cache_get_stats(struct image_cache *ic, struct image_cache_stats *s)
{
	uint32_t i, chunks;
	uint64_t bytes;

	memset(s, 0, sizeof(*s));
	s->bytes_read = atomic_load(&ic->bytes_read);
	s->bytes_fetched = atomic_load(&ic->bytes_fetched);
	s->bytes_prefetched = atomic_load(&ic->prefetched);
	s->hits = atomic_load(&ic->hits);
	s->misses = atomic_load(&ic->misses);
	s->fetch_errors = atomic_load(&ic->fetch_errors);
	s->inflight = atomic_load(&ic->demand_inflight);
	s->miss_ns_total = atomic_load(&ic->miss_ns_total);
	for (i = 0; i < IMAGE_LATENCY_BUCKETS; i++)
		s->miss_ms[i] = atomic_load(&ic->miss_ms[i]);
	if (ic->img->remote) {
		struct fetch_stats fs;

		registry_get_stats(ic->img->remote, &fs);
		s->requests = fs.requests;
		s->retries = fs.retries;
	}
	s->bytes_ahead = atomic_load(&ic->bytes_ahead);
	s->fetches = atomic_load(&ic->fetches);
	s->fetches_ahead = atomic_load(&ic->fetches_ahead);
	s->programs_recorded = atomic_load(&ic->programs_recorded);
	s->programs_read = atomic_load(&ic->programs_read);
	for (i = 0; i < ic->nr_blobs; i++) {
		blob_cache_usage(ic->blobs[i], &chunks, &bytes);
		s->chunks_present += chunks;
		s->bytes_present += bytes;
		s->bytes_evicted += blob_cache_evicted(ic->blobs[i]);
		s->chunks_total += ic->img->blobs.blobs[i].nr_chunks;
	}
}

/* ------------------------------------------------------------------ */
/* Local mode                                                          */
/* ------------------------------------------------------------------ */

bool image_mount_is_ferry(const struct mount_entry *mi)
{
	return !strcmp(mi->fstype, "erofs") || !strcmp(mi->fstype, IMAGE_FUSE_FSTYPE) ||
	       (!strcmp(mi->fstype, "overlay") && !strcmp(mi->source, IMAGE_LAYERS_SOURCE));
}

/* Refuse to stack a mount on a ferry mount: the one below would be hidden. */
int image_check_not_mounted(const char *target)
{
	struct mount_entry mi;

	if (mountinfo_find(target, &mi) || !image_mount_is_ferry(&mi))
		return 0;
	ferry_err("mount point %s already holds a ferry mount (%s): ferry umount it first",
		  target, mi.fstype);
	return -EBUSY;
}

/* Keep the blobs the kernel now holds from gc while it does. */
static void pin_blobs(const struct image *img, const char *cache_dir, const char *target)
{
	uint8_t (*digests)[BLOB_DIGEST_SIZE] = calloc(img->blobs.nr_blobs + 1, sizeof(*digests));
	struct statx stx;
	uint32_t i;

	if (!digests || statx(AT_FDCWD, target, AT_SYMLINK_NOFOLLOW, STATX_MNT_ID, &stx) ||
	    !(stx.stx_mask & STATX_MNT_ID)) {
		ferry_warn("%s: cannot record the mount in the chunk cache: gc may remove its blobs while it is mounted",
			   target);
	} else {
		for (i = 0; i < img->blobs.nr_blobs; i++)
			memcpy(digests[i], img->blobs.blobs[i].digest, BLOB_DIGEST_SIZE);
		blob_cache_pin_mount(cache_dir, target, stx.stx_mnt_id,
				     (const uint8_t (*)[BLOB_DIGEST_SIZE])digests,
				     img->blobs.nr_blobs);
	}
	free(digests);
}

unsigned long image_mount_flags(bool suid, bool dev)
{
	return (suid ? 0 : MS_NOSUID) | (dev ? 0 : MS_NODEV);
}

int image_cache_kernel_mount(struct image_cache *ic, const char *cache_dir,
			     const char *target, unsigned long flags)
{
	struct image *img = ic->img;
	char (*devs)[32] = NULL, boot[32];
	const char **devp = NULL;
	uint32_t i;
	int ret;

	if (img->erofs_layers)
		return image_layers_kernel_mount(ic, target, flags);
	devs = calloc(ic->nr_blobs + 1, sizeof(*devs));
	devp = calloc(ic->nr_blobs + 1, sizeof(*devp));
	ret = devs && devp ? image_bootstrap_file(img, cache_dir) : -ENOMEM;
	if (ret)
		goto out;
	/*
	 * The kernel opens exactly the files verified and filled here: the
	 * descriptors we hold, through /proc/self/fd, not a path that
	 * could have been replaced meanwhile.
	 */
	snprintf(boot, sizeof(boot), IMAGE_FD_SOURCE "%d", img->bootstrap_fd);
	for (i = 0; i < ic->nr_blobs; i++) {
		snprintf(devs[i], sizeof(devs[i]), IMAGE_FD_SOURCE "%d",
			 blob_cache_data_fd(ic->blobs[i]));
		devp[i] = devs[i];
	}
	ret = meta_kernel_mount(boot, devp, ic->nr_blobs, target, flags);
out:
	free(devp);
	free(devs);
	return ret;
}

int image_mount_local(struct image *img, const char *cache_dir,
		      const char *mountpoint, unsigned long flags)
{
	struct ferry_progress progress = { 0 };
	struct image_cache *ic = NULL;
	char *target = realpath(mountpoint, NULL);
	struct stat st;
	int ret;

	if (!target || stat(target, &st) || !S_ISDIR(st.st_mode)) {
		ferry_err("mount point %s: %s", mountpoint,
			  target ? "not a directory" : strerror(errno));
		free(target);
		return -ENOTDIR;
	}
	ret = image_check_not_mounted(target);
	/* The kernel parses what ferry walked, never more (image.h). */
	if (!ret)
		ret = image_validate_metadata(img);
	if (!ret)
		ret = image_cache_open(img, cache_dir, &ic);
	if (!ret) {
		ferry_progress_begin(&progress, img->ref, 0);
		ret = image_cache_prefetch_blobs(ic, &progress, NULL);
		ferry_progress_end(&progress);
	}
	if (!ret)
		ret = image_cache_kernel_mount(ic, cache_dir, target, flags);
	if (!ret)
		pin_blobs(img, cache_dir, target);
	image_cache_close(ic);
	free(target);
	return ret;
}
