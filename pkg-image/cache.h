/* SPDX-License-Identifier: MIT */
/*
 * Private to pkg-image's image cache (image_cache, image.h), which is
 * split by idea:
 *
 *   cache.c          opening an image's blobs in the chunk cache, the demand
 *                    path (readers' ensure, map, read), statistics
 *   fetch_ahead.c    fetch-ahead: background fetches of the ranges readers
 *                    are predicted to want next (the window after a miss,
 *                    whole files, directory, ELF and Python prediction),
 *                    and its threads
 *   ahead_plan.c     fetch-ahead's planner: which ranges a read queues
 *                    (pure functions)
 *   prefetch_plan.c  prefetch: the image's list, --prefetch-files and
 *                    --prefetch-all as plans of blob ranges, run in paced
 *                    steps
 *   kernel_mount.c   the kernel mount of an image from the cache (local
 *                    mode, and fanotify's)
 */
#ifndef FERRY_IMAGE_CACHE_H
#define FERRY_IMAGE_CACHE_H

#include <pthread.h>
#include <stdatomic.h>

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
 * Fetch-ahead: threads, queued windows, and the window's bounds. A window
 * is AHEAD_BDP_FACTOR bandwidth-delay products; its worker fetches it in
 * steps of AHEAD_STEP so that a demand read waiting on one of its frames
 * waits for one step, not the window.
 */
#define AHEAD_THREADS 4
#define AHEAD_QUEUE 64
#define AHEAD_MIN (512u << 10)
#define AHEAD_MAX (4u << 20)
#define AHEAD_STEP (1u << 20)
#define AHEAD_FIRST (128u << 10) /* a new window's first segment, at least */
/* Files up to this size are fetched whole after their first miss. */
#define AHEAD_FILE_MAX (8u << 20)
/*
 * On a stream blob (a layer read through a ferry index) a job is one
 * step, and a file queued whole one piece: a fetch decodes from the
 * resume point before it, so the 1 MiB steps of a file that threads
 * fetched at once each fetched again the layer bytes from their point
 * to the step before (2.5 to 3.2 of the 24 MB the issue-21 workload
 * fetched were fetched twice, 1.0 to 1.7 with one fetch that decodes on
 * from frame to frame; performance-log.md, "Fetch-ahead through an
 * index").
 */
#define AHEAD_STREAM_STEP AHEAD_FILE_MAX
#define AHEAD_FILES 1024 /* remembered files (by inode, direct-mapped) */
#define AHEAD_BDP_FACTOR 4
/* Fetches this large or larger also measure the bandwidth. */
#define AHEAD_BW_SAMPLE (128u << 10)
/*
 * Directory prediction: a miss in a file of at most AHEAD_DIR_FILE bytes
 * (one chunk) in directory D queues, once per D, D's other such files
 * within AHEAD_DIR_SPAN blob bytes around it, and the first such file of up
 * to AHEAD_DIR_SIBLINGS of D's sibling directories; only for a D at least
 * AHEAD_DIR_DEPTH deep (/usr/lib/python3.11 is 3): the directories nearer
 * the root (/etc, /usr/bin, /usr/lib) hold unrelated programs' files,
 * and predicting them took the link from the next stalls of a startup.
 */
#define AHEAD_DIR_FILE (256u << 10)
#define AHEAD_DIR_SPAN (4u << 20)
#define AHEAD_DIR_SIBLINGS 32
#define AHEAD_DIR_DEPTH 3
/*
 * Only when a fetch's latency is at least this: below it a stall costs
 * less than the predicted frames' decoding and verifying (a registry on
 * loopback measures 5-20 ms, most of it the registry's own).
 */
#define AHEAD_DIR_RTT_MIN 0.025
/*
 * ELF prediction: the files inspected or queued as a program's
 * dependencies, at most this many per mount, and the DT_RUNPATH
 * directories searched before the standard ones.
 */
#define ELF_SEEN_MAX 1024
#define ELF_RUNPATH_DIRS 8
/*
 * Python prediction: the modules read or queued, at most this many per
 * mount (a large application imports a few thousand; its own set, so
 * that they cannot use up ELF prediction's), the imports read of one
 * .pyc (pyc.c), and the modules queued for it.
 */
#define PY_SEEN_MAX 4096
#define PY_IMPORTS_MAX 128
#define PY_QUEUE_MAX 64

struct ahead_job {
	uint32_t index;
	uint64_t uoff, len;
	uint64_t elf; /* or nid + 1 of a file to inspect as a program (elf_predict) */
	uint64_t py;  /* or nid + 1 of a .pyc to fetch and read (py_predict) */
};

/* Which file a piece of a blob belongs to (for misses that name no file). */
struct ahead_owner {
	uint32_t index;
	uint32_t len;
	uint64_t uoff, nid;
};

/* A one-chunk small file, by directory (for directory prediction). */
struct ahead_dfile {
	uint64_t nid, uoff;
	uint32_t dir, index, len;
	bool pyc; /* a compiled module: NAME.TAG.pyc in a __pycache__ */
};

/* Where a small file is in dfiles, by inode. */
struct ahead_nidx {
	uint64_t nid;
	uint32_t i;
};

/* A directory: its small files dfiles[first, first + nr), its parent. */
struct ahead_dir {
	uint64_t nid;
	uint32_t parent, first, nr;
	uint32_t kids, nr_kids; /* its subdirectories: kids[kids, kids + nr_kids) */
	uint32_t depth;         /* path components: / is 0, /usr/lib 2 */
	bool package;           /* a Python package: holds __init__.py */
	bool tests;             /* named tests or test */
	bool pycache;           /* named __pycache__ */
	bool done;              /* predicted already */
	bool kids_done;         /* its subdirectories predicted already */
};

/* A source read that is timed, to estimate the link. */
struct timed_source {
	struct image_cache *ic;
	struct blob_source inner;
};

/*
 * Per blob: the fetch-ahead window [origin, end), queued in segments, the
 * last one [mark, end) of seg bytes; origin and seg under lock.
 */
struct ahead_window {
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
	atomic_uint_fast64_t programs_recorded, programs_read, modules_read;
	uint64_t bwlimit; /* prefetch bytes per second, 0 = unlimited */
	atomic_uint_fast64_t bw_start_ns, bw_bytes;

	/* Fetch-ahead, all under lock but the windows' atomic reads. */
	pthread_mutex_t lock;
	pthread_cond_t ahead_cond;
	struct ahead_job ahead_q[AHEAD_QUEUE];
	unsigned int ahead_head, ahead_nr, nr_ahead_threads;
	bool ahead_on, ahead_started; /* an image in a registry; threads tried */
	atomic_bool ahead_quit;
	pthread_t ahead_threads[AHEAD_THREADS];
	struct ahead_window *ahead_win;
	uint64_t ahead_files[AHEAD_FILES]; /* nid + 1 of files queued whole */
	/* Sorted by (index, uoff), set once by the first fetch-ahead thread. */
	struct ahead_owner *owners;
	size_t nr_owners, owners_cap;
	/* Directory prediction's map, built with the owners. */
	struct ahead_dfile *dfiles;
	struct ahead_nidx *dfile_by_nid;
	struct ahead_nidx *elf_by_nid; /* the image's loader dependencies, by inode */
	size_t nr_elf_by_nid, elf_by_nid_cap;
	struct ahead_dir *dirs;
	uint32_t *kids;
	size_t nr_dfiles, dfiles_cap, nr_dirs, dirs_cap;
	uint32_t *walk_stack; /* the walk's directories by depth */
	size_t walk_depth_cap;
	atomic_bool owners_claimed, owners_ready;
	double rtt_s, bw_Bps; /* link estimates, 0 = none yet */
	struct image_prefetch_sink sink; /* put: prefetch goes there */
	/* A running prefetch plan's ranges, sorted by place, under lock. */
	struct plan_range *planned;
	size_t nr_planned;
	/* ELF and Python prediction's files so far, under lock. */
	uint64_t elf_seen[ELF_SEEN_MAX], py_seen[PY_SEEN_MAX];
	uint32_t nr_elf_seen, nr_py_seen;
};

/* Set in the fetch-ahead threads: their fetches are not on a reader's path. */
extern _Thread_local bool in_fetch_ahead;

/* cache.c */
/*
 * Make [@uoff, @uoff + @len) of blob @index present; @demand: a reader's
 * (counted as a hit, miss or error).
 */
int ensure(struct image_cache *ic, uint32_t index, uint64_t uoff, uint64_t len,
	   bool demand);
/*
 * Where byte @pos of the chunk-based file @st lives: 0 and *@index (blob)
 * and *@uoff, 1 for a hole, or -EFSCORRUPTED naming the file's nid.
 */
int locate(const struct image_cache *ic, const struct meta_stat *st, uint64_t pos,
	   uint32_t *index, uint64_t *uoff);

/* ahead_plan.c: fetch-ahead's planner, pure */
/* A blob's window, [origin, end) queued, its last segment [mark, end) of seg bytes. */
struct ahead_span {
	uint64_t origin, mark, end, seg;
};
struct ahead_range {
	uint64_t uoff, len;
};
/* The window's budget: AHEAD_BDP_FACTOR bandwidth-delay products, bounded. */
uint64_t ahead_budget(double rtt_s, double bw_Bps);
/*
 * After a demand read of [@uoff, @uoff + @len) of a blob of @size bytes
 * whose window is *@w: true and the next segment to queue in *@out, *@w
 * moved on; false when nothing is to be queued (*@w may still have a new
 * origin).
 */
bool ahead_window_next(struct ahead_span *w, uint64_t size, uint64_t budget, uint64_t uoff,
		       uint64_t len, struct ahead_range *out);
/* Whether a miss in the file @st (NULL: unknown) starts a window. */
bool ahead_window_after(const struct meta_stat *st);
/*
 * The file @st's chunks as pieces of at most @step contiguous bytes
 * of a blob: @locate_fn as locate (0, 1: a hole, or -errno, which ends
 * it and is returned), each piece to @piece, from the file's end when
 * @start_first (the threads take the newest piece first: its start comes
 * first), else from its start; with @ends only its first and last chunks.
 */
int ahead_file_pieces(const struct meta_stat *st, bool start_first, bool ends, uint64_t step,
		      int (*locate_fn)(void *ctx, uint64_t pos, uint32_t *index, uint64_t *uoff),
		      void (*piece)(void *ctx, uint32_t index, uint64_t uoff, uint64_t len),
		      void *ctx);

/*
 * Whether directory prediction may predict @d, a subdirectory of
 * @parent, as a package beside the one read.
 */
bool ahead_dir_sibling(const struct ahead_dir *parent, const struct ahead_dir *d);
/*
 * Which job a full ring of @n jobs @q, the oldest at @head, drops: its
 * distance from @head (the oldest that is not a .pyc's reading, else the
 * oldest).
 */
unsigned int ahead_drop(const struct ahead_job *q, unsigned int n, unsigned int head);

/* fetch_ahead.c */
/*
 * ahead_open: fetch-ahead's state of @ic, whose image and blob count are
 * set (-ENOMEM); ahead_close stops its threads and frees it.
 */
int ahead_open(struct image_cache *ic);
void ahead_close(struct image_cache *ic);
/*
 * A reader's read of [@uoff, @uoff + @len) of blob @index (*@st: its
 * file, or NULL) found the range present (hit) or must fetch it (miss):
 * queue what that predicts, before the reader's own fetch so that they
 * overlap. A miss may find the file itself (*@st then points to @owner);
 * true when it is at a program's start, for ahead_program_fetched once
 * the reader's fetch succeeded.
 */
void ahead_hit(struct image_cache *ic, const struct meta_stat *st, uint32_t index,
	       uint64_t uoff, uint64_t len);
bool ahead_miss(struct image_cache *ic, const struct meta_stat **st,
		struct meta_stat *owner, uint32_t index, uint64_t uoff, uint64_t len);
void ahead_program_fetched(struct image_cache *ic, const struct meta_stat *st);

/* prefetch_plan.c */
/* Is [@uoff, @uoff + @len) of blob @index in a running plan's ranges? */
bool planned(struct image_cache *ic, uint32_t index, uint64_t uoff, uint64_t len);

#endif
