// SPDX-License-Identifier: MIT
/*
 * Fetch-ahead (amplified I/O) for images in a registry: a demand read that
 * misses queues its whole file (FUSE) and the blob bytes that follow it
 * for a few background threads, so the rest of the file and its
 * neighbours in the blob (files are laid out in tree order) arrive on
 * other connections while the reader works, instead of one round trip
 * per fault. The window is a few bandwidth-delay products of the link,
 * measured on the fetches themselves; it starts small and doubles while
 * a reader keeps reaching it, so a sequential reader stays ahead and a
 * random one wastes little (the planner: ahead_plan.c). A miss in a small
 * file also predicts the rest of its directory and the packages beside it
 * (ahead_dir), a miss at a program's start its loader dependencies
 * (elf_predict), and a miss in a compiled Python module the modules it
 * imports (py_predict). The background fetches go through
 * blob_cache_ensure like any other: verified, one per frame.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cache.h"


/*
 * The walk's directory tree: @path's depth names its parent on the
 * stack (meta_walk visits a directory before its entries, depth first).
 * Files of one chunk of at most AHEAD_DIR_FILE bytes go into dfiles.
 */
static int dir_add(struct image_cache *ic, const char *path,
		   const struct meta_stat *st)
{
	size_t depth = 0;
	uint32_t parent, index;
	const char *p, *name;
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
		name = strrchr(path, '/') + 1;
		ic->dirs[ic->nr_dirs] = (struct ahead_dir){
			.nid = st->nid, .parent = parent, .depth = (uint32_t)depth,
			.tests = !strcmp(name, "tests") || !strcmp(name, "test"),
			.pycache = !strcmp(name, "__pycache__"),
		};
		ic->walk_stack[depth] = (uint32_t)ic->nr_dirs++;
		return 0;
	}
	if (depth && S_ISREG(st->mode) && !strcmp(strrchr(path, '/') + 1, "__init__.py"))
		ic->dirs[parent].package = true;
	if (!depth || !S_ISREG(st->mode) || st->nr_chunks != 1 ||
	    !st->size || st->size > AHEAD_DIR_FILE)
		return 0;
	ret = locate(ic, st, 0, &index, &uoff);
	if (ret)
		return ret < 0 ? ret : 0; /* a hole */
	if (array_reserve(&ic->dfiles, &ic->dfiles_cap, ic->nr_dfiles + 1,
			  sizeof(*ic->dfiles), 256))
		return -ENOMEM;
	name = strrchr(path, '/') + 1;
	ic->dfiles[ic->nr_dfiles++] = (struct ahead_dfile){
		.nid = st->nid, .dir = parent, .index = index, .uoff = uoff,
		.len = (uint32_t)st->size,
		.pyc = ic->dirs[parent].pycache && strlen(name) > 4 &&
		       !strcmp(name + strlen(name) - 4, ".pyc"),
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
	ic->elf_by_nid[ic->nr_elf_by_nid++] = (struct ahead_nidx){
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
	for (c = 0; c < (st->size > AHEAD_FILE_MAX ? 1 : st->nr_chunks) &&
		    c * st->chunk_size < st->size; c++) {
		ret = locate(ic, st, c * st->chunk_size, &index, &uoff);
		if (ret < 0)
			return ret;
		if (ret)
			continue; /* a hole */
		if (array_reserve(&ic->owners, &ic->owners_cap, ic->nr_owners + 1,
				  sizeof(*ic->owners), 256))
			return -ENOMEM;
		ic->owners[ic->nr_owners++] = (struct ahead_owner){
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
	const struct ahead_owner *x = a, *y = b;

	if (x->index != y->index)
		return x->index < y->index ? -1 : 1;
	return x->uoff < y->uoff ? -1 : x->uoff > y->uoff;
}

static int dfile_cmp(const void *a, const void *b)
{
	const struct ahead_dfile *x = a, *y = b;

	if (x->dir != y->dir)
		return x->dir < y->dir ? -1 : 1;
	if (x->index != y->index)
		return x->index < y->index ? -1 : 1;
	return x->uoff < y->uoff ? -1 : x->uoff > y->uoff;
}

static int nidx_cmp(const void *a, const void *b)
{
	const struct ahead_nidx *x = a, *y = b;

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
		struct ahead_dir *dir = &ic->dirs[ic->dfiles[i].dir];

		if (!dir->nr++)
			dir->first = (uint32_t)i;
		ic->dfile_by_nid[i] = (struct ahead_nidx){ ic->dfiles[i].nid, (uint32_t)i };
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
		struct ahead_dir *p = &ic->dirs[ic->dirs[d].parent];

		ic->kids[p->kids + p->nr_kids++] = d;
	}
	return 0;
}

/*
 * The owners of every chunk of the files fetch-ahead may fetch whole and of
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
		ferry_dbg("%s: fetch-ahead: no map of files to blob ranges: %s",
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
	const struct ahead_owner *o;

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
static void py_predict(struct image_cache *ic, uint64_t nid);

/* The most bytes of blob @index one fetch-ahead ensure takes. */
static uint64_t ahead_step(const struct image_cache *ic, uint32_t index)
{
	return ic->img->blobs.blobs[index].flags & BLOB_INFO_STREAM ? AHEAD_STREAM_STEP :
								       AHEAD_STEP;
}

static void *ahead_main(void *arg)
{
	struct image_cache *ic = arg;
	struct ahead_job j;
	uint64_t pos, step;
	int ret;

	in_fetch_ahead = true;
	if (!atomic_exchange(&ic->owners_claimed, true))
		owners_build(ic);
	pthread_mutex_lock(&ic->lock);
	for (;;) {
		while (!ic->ahead_nr && !ic->ahead_quit)
			pthread_cond_wait(&ic->ahead_cond, &ic->lock);
		if (ic->ahead_quit)
			break;
		/* Newest first: the window a reader has just reached. */
		j = ic->ahead_q[(ic->ahead_head + --ic->ahead_nr) % AHEAD_QUEUE];
		pthread_mutex_unlock(&ic->lock);
		if (j.elf)
			elf_predict(ic, j.elf - 1);
		if (j.py)
			py_predict(ic, j.py - 1);
		for (pos = j.uoff; pos < j.uoff + j.len; pos += step) {
			step = MIN(j.uoff + j.len - pos, ahead_step(ic, j.index));
			if (atomic_load(&ic->ahead_quit))
				break;
			ret = ensure(ic, j.index, pos, step, false);
			if (ret) {
				/* A demand read of these bytes will say why. */
				ferry_dbg("%s: fetch-ahead of blob %u bytes %llu+%llu: %s",
					  ic->img->ref, j.index, (unsigned long long)pos,
					  (unsigned long long)step, ferry_strerror(ret));
				break;
			}
			atomic_fetch_add(&ic->bytes_ahead, step);
		}
		pthread_mutex_lock(&ic->lock);
	}
	pthread_mutex_unlock(&ic->lock);
	return NULL;
}

static void ahead_start(struct image_cache *ic)
{
	int err;

	while (ic->nr_ahead_threads < AHEAD_THREADS) {
		err = pthread_create(&ic->ahead_threads[ic->nr_ahead_threads], NULL, ahead_main, ic);
		if (err) {
			ferry_warn("%s: cannot start a fetch-ahead thread (%s): %u of %u run, reads wait for more round trips",
				   ic->img->ref, strerror(err), ic->nr_ahead_threads, AHEAD_THREADS);
			return;
		}
		ic->nr_ahead_threads++;
	}
}

static void py_forget(struct image_cache *ic, uint64_t nid);

/*
 * Queue @j; under lock. The threads start with the first job: a mount
 * that never misses has none. A full queue drops a job (ahead_drop); a
 * module whose reading is dropped is forgotten, so that a miss in it
 * reads it after all.
 */
static void ahead_push_job(struct image_cache *ic, struct ahead_job j)
{
	const unsigned int q = AHEAD_QUEUE;
	unsigned int k;

	if (!ic->ahead_started) {
		ic->ahead_started = true;
		ahead_start(ic);
	}
	if (ic->ahead_nr == q) {
		k = ahead_drop(ic->ahead_q, q, ic->ahead_head);
		if (ic->ahead_q[(ic->ahead_head + k) % q].py)
			py_forget(ic, ic->ahead_q[(ic->ahead_head + k) % q].py - 1);
		for (; k; k--) /* the older ones move up over it */
			ic->ahead_q[(ic->ahead_head + k) % q] =
				ic->ahead_q[(ic->ahead_head + k - 1) % q];
		ic->ahead_head = (ic->ahead_head + 1) % q;
		ic->ahead_nr--;
	}
	ic->ahead_q[(ic->ahead_head + ic->ahead_nr++) % AHEAD_QUEUE] = j;
	pthread_cond_signal(&ic->ahead_cond);
}

/* Queue [@uoff, @uoff + @len) of blob @index; under lock. */
static void ahead_push(struct image_cache *ic, uint32_t index, uint64_t uoff,
		    uint64_t len)
{
	ahead_push_job(ic, (struct ahead_job){ .index = index, .uoff = uoff, .len = len });
}

/*
 * After a demand read of [@uoff, @uoff + @len) of blob @index (@missed:
 * it had to fetch): the window's next segment, if any (ahead_window_next;
 * a hit comes here only in a file larger than AHEAD_FILE_MAX: ahead_hit).
 */
static void ahead_queue(struct image_cache *ic, uint32_t index, uint64_t uoff,
			uint64_t len, bool missed)
{
	struct ahead_window *w;
	struct ahead_span span;
	struct ahead_range r;

	if (!ic->ahead_on)
		return;
	w = &ic->ahead_win[index];
	/* The common case, a hit before the mark, takes no lock. */
	if (!missed && !(uoff + len > atomic_load_explicit(&w->mark, memory_order_relaxed) &&
			 uoff < atomic_load_explicit(&w->end, memory_order_relaxed)))
		return;
	pthread_mutex_lock(&ic->lock);
	if (atomic_load(&ic->ahead_quit))
		goto out;
	span = (struct ahead_span){ .origin = w->origin, .seg = w->seg,
				    .mark = atomic_load(&w->mark), .end = atomic_load(&w->end) };
	if (ahead_window_next(&span, ic->img->blobs.blobs[index].uncompressed_size,
			      ahead_budget(ic->rtt_s, ic->bw_Bps), uoff, len, &r))
		ahead_push(ic, index, r.uoff, r.len);
	w->origin = span.origin;
	w->seg = span.seg;
	atomic_store(&w->mark, span.mark);
	atomic_store(&w->end, span.end);
out:
	pthread_mutex_unlock(&ic->lock);
}

/*
 * The first miss in a regular file of at most AHEAD_FILE_MAX bytes queues
 * the whole file, in pieces of at most AHEAD_STEP contiguous blob bytes that
 * the threads share (on a stream blob AHEAD_STREAM_STEP: one piece): a
 * file is usually read whole once opened, and a mapped library faults
 * all over it. The threads take the newest piece
 * first: with @start_first the pieces are queued from the file's end, so
 * that its start comes first (a predicted program's reader wants its
 * header next); else from its start, so that a reader's own miss is not
 * inside the first step a thread fetches (it would wait for the whole
 * step instead of its frame).
 */
struct file_pieces {
	struct image_cache *ic;
	const struct meta_stat *st;
};

static int file_locate(void *ctx, uint64_t pos, uint32_t *index, uint64_t *uoff)
{
	struct file_pieces *f = ctx;

	return locate(f->ic, f->st, pos, index, uoff);
}

static void file_piece(void *ctx, uint32_t index, uint64_t uoff, uint64_t len)
{
	struct file_pieces *f = ctx;

	ahead_push(f->ic, index, uoff, len);
}

static const struct elf_deps *elf_recorded(struct image_cache *ic, uint64_t nid);

/* In ahead_files: only the file's first and last chunks are queued. */
#define AHEAD_ENDS_ONLY (1ull << 63)

/* Whether blob @index's byte @uoff is in the first or last chunk of @st. */
static bool in_ends(struct image_cache *ic, const struct meta_stat *st, uint32_t index,
		    uint64_t uoff)
{
	uint64_t nr = DIV_ROUND_UP(st->size, st->chunk_size), at;
	uint32_t i;

	return (!locate(ic, st, 0, &i, &at) && i == index && uoff - at < st->chunk_size) ||
	       (!locate(ic, st, (nr - 1) * st->chunk_size, &i, &at) && i == index &&
		uoff - at < st->chunk_size);
}

/*
 * A shared library the image records (loader dependencies, no
 * interpreter) of more than two chunks is queued by its ends first: the
 * loader reads its headers, symbol tables and relocations at its start
 * and its data segment at its end, while its code is read only where it
 * runs (liblapack: 0.16 of 7.3 MB read in `import numpy`, in its first
 * and last chunks). A miss elsewhere in it (@middle) queues the rest.
 */
static void ahead_file(struct image_cache *ic, const struct meta_stat *st,
		       bool start_first, bool middle)
{
	struct file_pieces f = { .ic = ic, .st = st };
	uint64_t *slot = &ic->ahead_files[st->nid % AHEAD_FILES];
	const struct elf_deps *rec;
	uint64_t key = st->nid + 1, step = AHEAD_STEP, at;
	uint32_t index;
	bool ends;

	if (!ic->ahead_on || st->size > AHEAD_FILE_MAX)
		return;
	if (!locate(ic, st, 0, &index, &at))
		step = ahead_step(ic, index);
	rec = elf_recorded(ic, st->nid);
	ends = rec && !rec->interp && !middle &&
	       DIV_ROUND_UP(st->size, st->chunk_size) > 2;
	pthread_mutex_lock(&ic->lock);
	if (*slot != key && (*slot != (key | AHEAD_ENDS_ONLY) || !ends)) {
		*slot = key | (ends ? AHEAD_ENDS_ONLY : 0);
		ahead_file_pieces(st, start_first, ends, step, file_locate, file_piece, &f);
	}
	pthread_mutex_unlock(&ic->lock);
}

/* The small file @nid in the directory map, or NULL. */
static const struct ahead_dfile *dfile_find(const struct image_cache *ic, uint64_t nid)
{
	const struct ahead_nidx key = { .nid = nid }, *x;

	x = bsearch(&key, ic->dfile_by_nid, ic->nr_dfiles, sizeof(key), nidx_cmp);
	return x ? &ic->dfiles[x->i] : NULL;
}

/*
 * The first small file of each of @p's first AHEAD_DIR_SIBLINGS subdirectories
 * that have some and may be predicted (ahead_dir_sibling), but @skip, into
 * @out; once per @p. Under lock.
 */
static uint32_t kids_first_files(struct image_cache *ic, struct ahead_dir *p,
				 const struct ahead_dir *skip,
				 const struct ahead_dfile **out)
{
	uint32_t i, n = 0;

	if (p->kids_done)
		return 0;
	p->kids_done = true;
	for (i = 0; i < p->nr_kids && n < AHEAD_DIR_SIBLINGS; i++) {
		const struct ahead_dir *s = &ic->dirs[ic->kids[p->kids + i]];

		if (s != skip && s->nr && ahead_dir_sibling(p, s))
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
 * small files within AHEAD_DIR_SPAN blob bytes around the miss (the window
 * only goes forward) and the first small file of each of D's sibling
 * directories (a package's __init__, usually in the frame of the rest of
 * it), once per parent, or of its parent's siblings where D's have none.
 * The threads take the newest job first: the siblings are queued
 * last one first, then D's files, so that D goes first, then the
 * siblings in directory order, all after the file's own pieces (which
 * demand_ensure queues next). Under lock.
 */
static void ahead_dir(struct image_cache *ic, uint64_t nid)
{
	const struct ahead_dfile *f, *g, *sibs[AHEAD_DIR_SIBLINGS];
	uint64_t lo, hi, run_off = 0, run_end = 0;
	uint32_t i, run_index = 0, nr_sibs = 0;
	struct ahead_dir *d, *p;

	if (!atomic_load(&ic->owners_ready) || ic->rtt_s < AHEAD_DIR_RTT_MIN)
		return;
	f = dfile_find(ic, nid);
	if (!f || ic->dirs[f->dir].done || ic->dirs[f->dir].depth < AHEAD_DIR_DEPTH)
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
			ahead_push(ic, g->index, g->uoff, g->len);
	}
	lo = f->uoff > AHEAD_DIR_SPAN / 2 ? f->uoff - AHEAD_DIR_SPAN / 2 : 0;
	hi = f->uoff + AHEAD_DIR_SPAN / 2;
	/* D's files, in runs of at most AHEAD_STEP blob bytes. */
	for (i = d->first; i < d->first + d->nr; i++) {
		g = &ic->dfiles[i];
		if (g->index != f->index || g->uoff + g->len <= lo || g->uoff >= hi)
			continue;
		if (run_end && g->index == run_index && g->uoff + g->len - run_off <= AHEAD_STEP) {
			run_end = MAX(run_end, g->uoff + g->len);
			continue;
		}
		if (run_end)
			ahead_push(ic, run_index, run_off, run_end - run_off);
		run_index = g->index;
		run_off = g->uoff;
		run_end = g->uoff + g->len;
	}
	if (run_end)
		ahead_push(ic, run_index, run_off, run_end - run_off);
}

/*
 * ELF prediction. A program's start is read first (by execve, or by the
 * loader's dlopen), and then the dynamic loader opens one file after
 * another, each its own stall: the interpreter, /etc/ld.so.cache, the
 * program's DT_NEEDED libraries, theirs in turn. Once the miss at a
 * program's start has its header, a fetch-ahead thread reads its
 * dependencies (elf.c; the bytes it needs, such as the dynamic section
 * at the end of a large program, are fetched as fetch-ahead), finds them
 * in the image as the loader would (DT_RUNPATH or DT_RPATH directories
 * without $ORIGIN, then the standard and multiarch directories; ld.so's
 * cache is not read), and queues each whole (ahead_file) with, for a
 * library, its own inspection. Each file once per mount (elf_first).
 */

/* Under lock: true the first time @nid comes to the set @seen of @max. */
static bool seen_first(uint64_t *seen, uint32_t *nr, uint32_t max, uint64_t nid)
{
	uint32_t i;

	for (i = 0; i < *nr; i++)
		if (seen[i] == nid)
			return false;
	if (*nr == max)
		return false;
	seen[(*nr)++] = nid;
	return true;
}

static bool elf_first(struct image_cache *ic, uint64_t nid)
{
	return seen_first(ic->elf_seen, &ic->nr_elf_seen, ELF_SEEN_MAX, nid);
}

static bool py_first(struct image_cache *ic, uint64_t nid)
{
	return seen_first(ic->py_seen, &ic->nr_py_seen, PY_SEEN_MAX, nid);
}

/* Under lock: @nid's reading was dropped; a miss may queue it again. */
static void py_forget(struct image_cache *ic, uint64_t nid)
{
	uint32_t i;

	for (i = 0; i < ic->nr_py_seen; i++)
		if (ic->py_seen[i] == nid) {
			ic->py_seen[i] = ic->py_seen[--ic->nr_py_seen];
			return;
		}
}

/* Whether [@uoff, @uoff + @len) of blob @index holds @st's first byte. */
static bool miss_at_start(struct image_cache *ic, const struct meta_stat *st,
			  uint32_t index, uint64_t uoff, uint64_t len)
{
	uint64_t start;
	uint32_t first;

	return ic->ahead_on && st->nr_chunks && !locate(ic, st, 0, &first, &start) &&
	       first == index && start >= uoff && start - uoff < len;
}

/* Queue @nid's inspection, once per mount. */
static void elf_push(struct image_cache *ic, uint64_t nid)
{
	pthread_mutex_lock(&ic->lock);
	if (elf_first(ic, nid))
		ahead_push_job(ic, (struct ahead_job){ .elf = nid + 1 });
	pthread_mutex_unlock(&ic->lock);
}

/* After the miss at @st's start made it present: is it a program? */
static void elf_check(struct image_cache *ic, const struct meta_stat *st)
{
	uint8_t magic[4];

	if (image_cache_read_cached(ic, st, 0, magic, sizeof(magic)) == sizeof(magic) &&
	    !memcmp(magic, "\177ELF", 4))
		elf_push(ic, st->nid);
}

struct ahead_src {
	struct image_cache *ic;
	const struct meta_stat *st;
};

/* elf.c's reads, and py_predict's: the bytes are fetched as fetch-ahead, then read. */
static int ahead_src_read(void *ctx, uint64_t off, void *buf, size_t len)
{
	const struct ahead_src *s = ctx;
	uint64_t pos, n, uoff;
	uint32_t index;
	ssize_t got;
	int ret;

	if (atomic_load(&s->ic->ahead_quit))
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

	pthread_mutex_lock(&ic->lock);
	first = elf_first(ic, st->nid);
	if (first && inspect)
		ahead_push_job(ic, (struct ahead_job){ .elf = st->nid + 1 });
	pthread_mutex_unlock(&ic->lock);
	if (first)
		ahead_file(ic, st, true, false);
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
	const struct ahead_src *s = ctx;

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
	const struct ahead_nidx key = { .nid = nid }, *x;

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
	struct ahead_src src = { ic, &st };
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
	if (elf_deps_read(ahead_src_read, elf_interp, &src, st.size, &d))
		return;
	elf_queue_libs(ic, &d);
	elf_deps_free(&d);
}

/*
 * Python prediction. Python reads a module's .pyc, runs its body, and the
 * body's imports read the next modules, one after another, each a stall
 * of its own (numpy's subpackages, the standard library's packages: issue
 * 48's request timeline). So once a reader misses in a .pyc (a small file
 * in a __pycache__), a fetch-ahead thread fetches it, reads the imports
 * its body runs (pyc.c), finds each module as Python's path finder would
 * in the image, and queues each one's .pyc with its own reading: the
 * imports are fetched ahead of the interpreter, import after import.
 * Relative imports are found from the module's package; absolute ones
 * from the sys.path directory the module is in (the first one above its
 * packages: site-packages, dist-packages, the standard library) and from
 * the standard library (lib/python3.X in /usr or /usr/local, the version
 * the .pyc's cache tag names). Each name's packages (their __init__) and
 * the module itself are queued, `from M import x` also M.x (x may be a
 * submodule); a module is NAME.py's __pycache__/NAME.TAG.pyc, the tag
 * that of the .pyc read. Each module once per mount (py_first), and
 * only where directory prediction runs (AHEAD_DIR_RTT_MIN).
 */
struct py_modules {
	struct image_cache *ic;
	const char *tag;               /* ".cpython-311.pyc" */
	uint64_t nids[PY_QUEUE_MAX];   /* the modules found, in import order */
	bool ext[PY_QUEUE_MAX];        /* an extension module, not a .pyc */
	uint32_t nr;
};

static int py_lookup(struct image_cache *ic, uint64_t dir, const char *name, size_t len,
		     mode_t type, uint64_t *nid)
{
	struct meta_stat st;
	int ret = meta_lookup(ic->img->meta, dir, name, len, nid);

	if (!ret)
		ret = meta_getattr(ic->img->meta, *nid, &st);
	return ret ? ret : (st.mode & S_IFMT) == type ? 0 : -ENOENT;
}

static void py_add(struct py_modules *m, uint64_t nid, bool ext)
{
	uint32_t i;

	for (i = 0; i < m->nr; i++)
		if (m->nids[i] == nid)
			return;
	if (m->nr < PY_QUEUE_MAX) {
		m->ext[m->nr] = ext;
		m->nids[m->nr++] = nid;
	}
}

/* Module @mod of directory @dir: its __pycache__/@mod.TAG.pyc, if any. */
static void py_found(struct py_modules *m, uint64_t dir, const char *mod, size_t len)
{
	char file[PYC_NAME_MAX + 64];
	uint64_t cache, nid;
	int n = snprintf(file, sizeof(file), "%.*s%s", (int)len, mod, m->tag);

	if (n > 0 && (size_t)n < sizeof(file) &&
	    !py_lookup(m->ic, dir, "__pycache__", 11, S_IFDIR, &cache) &&
	    !py_lookup(m->ic, cache, file, (size_t)n, S_IFREG, &nid))
		py_add(m, nid, false);
}

/*
 * An extension module: MOD.SUFFIX.so or MOD.so (".cpython-311-x86_64-linux-gnu",
 * ".abi3": the machine's suffixes are not in the image), the first one
 * the directory lists.
 */
struct py_ext {
	const char *mod;
	size_t len;
	uint64_t nid;
};

static int py_ext_fill(void *ctx, const char *name, size_t len, uint64_t nid,
		       unsigned int file_type, uint64_t next_pos)
{
	struct py_ext *e = ctx;

	if (len < e->len + 4 || memcmp(name, e->mod, e->len) || name[e->len] != '.' ||
	    memcmp(name + len - 3, ".so", 3) || meta_ftype_mode(file_type) != S_IFREG)
		return 0;
	e->nid = nid;
	return 1;
}

/*
 * The dotted @name from directory @base: each package's __init__ (a
 * directory with __init__.py; one without is a namespace package,
 * passed through), then a module (NAME.py, or an extension module),
 * which ends it.
 */
static void py_resolve(struct py_modules *m, uint64_t base, const char *name, size_t len)
{
	const char *c = name, *end = name + len, *dot;
	char file[PYC_NAME_MAX + 4];
	uint64_t cur = base, nid, init;
	size_t n;

	while (c < end) {
		dot = memchr(c, '.', (size_t)(end - c));
		n = (size_t)((dot ? dot : end) - c);
		if (!py_lookup(m->ic, cur, c, n, S_IFDIR, &nid)) {
			if (!py_lookup(m->ic, nid, "__init__.py", 11, S_IFREG, &init))
				py_found(m, nid, "__init__", 8);
			cur = nid;
		} else {
			struct py_ext e = { .mod = c, .len = n };

			snprintf(file, sizeof(file), "%.*s.py", (int)n, c);
			if (!py_lookup(m->ic, cur, file, n + 3, S_IFREG, &nid))
				py_found(m, cur, c, n);
			else if (meta_readdir(m->ic->img->meta, cur, 0, py_ext_fill, &e) == 1)
				py_add(m, e.nid, true);
			return;
		}
		if (!dot)
			return;
		c = dot + 1;
	}
}

/* The standard library of the Python of the tag ".cpython-3XY...": 0 and *@nid. */
static int py_stdlib(struct image_cache *ic, const char *tag, uint64_t *nid)
{
	static const char *const prefixes[] = { "/usr/lib", "/usr/local/lib" };
	char path[64];
	unsigned int minor;
	size_t i;

	if (sscanf(tag, ".cpython-3%u", &minor) != 1 || minor > 99)
		return -ENOENT;
	for (i = 0; i < ARRAY_SIZE(prefixes); i++) {
		snprintf(path, sizeof(path), "%s/python3.%u", prefixes[i], minor);
		if (!meta_resolve_follow(ic->img->meta, path, nid))
			return 0;
	}
	return -ENOENT;
}

struct py_name {
	uint64_t nid;
	char name[PYC_NAME_MAX + 1];
};

static int py_name_fill(void *ctx, const char *name, size_t len, uint64_t nid,
			unsigned int file_type, uint64_t next_pos)
{
	struct py_name *f = ctx;

	if (nid != f->nid || len >= sizeof(f->name))
		return 0;
	memcpy(f->name, name, len);
	f->name[len] = '\0';
	return 1;
}

/* @f's imports, found from its directories, into @m. */
static void py_imports_find(struct py_modules *m, const struct ahead_dfile *f,
			    const struct pyc_import *im, int nr)
{
	struct image_cache *ic = m->ic;
	uint32_t pkg = ic->dirs[f->dir].parent, top = pkg, d;
	char full[2 * PYC_NAME_MAX + 2];
	uint64_t stdlib, dynload;
	bool have_stdlib, have_dynload;
	int i, n;
	unsigned int up;

	/* The sys.path directory: the first above the module's packages. */
	while (top && ic->dirs[top].package)
		top = ic->dirs[top].parent;
	have_stdlib = !py_stdlib(ic, m->tag, &stdlib);
	/* The standard library's extension modules (_json, _ctypes...). */
	have_dynload = have_stdlib &&
		       !py_lookup(ic, stdlib, "lib-dynload", 11, S_IFDIR, &dynload);
	have_stdlib = have_stdlib && stdlib != ic->dirs[top].nid;
	for (i = 0; i < nr; i++) {
		n = snprintf(full, sizeof(full), "%.*s%s%.*s", im[i].name_len, im[i].name,
			     im[i].name_len && im[i].from ? "." : "",
			     im[i].from ? im[i].from_len : 0, im[i].from ? im[i].from : "");
		if (n <= 0 || (size_t)n >= sizeof(full))
			continue;
		if (!im[i].level) {
			py_resolve(m, ic->dirs[top].nid, full, (size_t)n);
			if (have_stdlib)
				py_resolve(m, stdlib, full, (size_t)n);
			if (have_dynload)
				py_resolve(m, dynload, full, (size_t)n);
			continue;
		}
		/* `from .` is the package itself, each further dot its parent. */
		for (d = pkg, up = 1; up < im[i].level && d; up++)
			d = ic->dirs[d].parent;
		if (up == im[i].level && d)
			py_resolve(m, ic->dirs[d].nid, full, (size_t)n);
	}
}

/*
 * A module to predict from: fetch the .pyc @nid (a small file in a
 * __pycache__), read its imports, queue theirs (a .pyc too large to be
 * read is fetched whole).
 */
static void py_predict(struct image_cache *ic, uint64_t nid)
{
	struct py_modules m = { .ic = ic };
	struct pyc_import im[PY_IMPORTS_MAX];
	struct py_name self = { .nid = nid };
	const struct ahead_dfile *f;
	struct meta_stat st;
	struct ahead_src src = { ic, &st };
	uint8_t *buf;
	int nr;

	if (meta_getattr(ic->img->meta, nid, &st) || !S_ISREG(st.mode) || !st.nr_chunks)
		return;
	f = dfile_find(ic, nid);
	if (!f || !f->pyc) {
		ahead_file(ic, &st, true, false);
		return;
	}
	/* Its name, for the tag: NAME.TAG.pyc (module names have no dot). */
	if (meta_readdir(ic->img->meta, ic->dirs[f->dir].nid, 0, py_name_fill, &self) != 1 ||
	    !(m.tag = strchr(self.name, '.')))
		return;
	buf = malloc(st.size); /* a dfile's: at most AHEAD_DIR_FILE */
	if (!buf)
		return;
	nr = 0;
	if (!ahead_src_read(&src, 0, buf, st.size)) {
		nr = pyc_imports(buf, st.size, im, PY_IMPORTS_MAX);
		atomic_fetch_add(&ic->modules_read, 1);
	}
	if (nr > 0)
		py_imports_find(&m, f, im, nr);
	free(buf);
	/*
	 * The threads take the newest job first: the first import last. An
	 * extension module is a library the loader maps: queued as ELF
	 * prediction queues one, with its own dependencies.
	 */
	while (m.nr--) {
		if (m.ext[m.nr]) {
			if (!meta_getattr(ic->img->meta, m.nids[m.nr], &st) && st.nr_chunks)
				elf_queue(ic, &st, true);
			continue;
		}
		pthread_mutex_lock(&ic->lock);
		if (py_first(ic, m.nids[m.nr]))
			ahead_push_job(ic, (struct ahead_job){ .py = m.nids[m.nr] + 1 });
		pthread_mutex_unlock(&ic->lock);
	}
}

/* After a miss in the small file @nid: a .pyc's imports are predicted. Under lock. */
static void py_miss(struct image_cache *ic, uint64_t nid)
{
	const struct ahead_dfile *f;

	if (!atomic_load(&ic->owners_ready) || ic->rtt_s < AHEAD_DIR_RTT_MIN)
		return;
	f = dfile_find(ic, nid);
	if (f && f->pyc && py_first(ic, nid))
		ahead_push_job(ic, (struct ahead_job){ .py = nid + 1 });
}

int ahead_open(struct image_cache *ic)
{
	pthread_cond_init(&ic->ahead_cond, NULL);
	ic->ahead_win = calloc(ic->nr_blobs + 1, sizeof(*ic->ahead_win));
	/* Local blob files answer at once: nothing to hide. */
	ic->ahead_on = ic->img->remote != NULL;
	return ic->ahead_win ? 0 : -ENOMEM;
}

void ahead_close(struct image_cache *ic)
{
	pthread_mutex_lock(&ic->lock);
	ic->ahead_quit = true;
	pthread_cond_broadcast(&ic->ahead_cond);
	pthread_mutex_unlock(&ic->lock);
	while (ic->nr_ahead_threads)
		pthread_join(ic->ahead_threads[--ic->nr_ahead_threads], NULL);
	pthread_cond_destroy(&ic->ahead_cond);
	free(ic->ahead_win);
	free(ic->owners);
	free(ic->dfiles);
	free(ic->dfile_by_nid);
	free(ic->elf_by_nid);
	free(ic->kids);
	free(ic->dirs);
}

void ahead_hit(struct image_cache *ic, const struct meta_stat *st, uint32_t index,
	       uint64_t uoff, uint64_t len)
{
	/*
	 * Only a file too large to be queued whole grows the window on
	 * hits: a smaller one's hits are its own queued bytes, and growing
	 * the window past them fetched neighbours nothing read (9.7 of
	 * FUSE's 24.4 MB in a run at 20 ms RTT; fanotify's hits never come
	 * here, and it fetched 19.7 MB).
	 */
	if (st && st->size > AHEAD_FILE_MAX)
		ahead_queue(ic, index, uoff, len, false);
}

bool ahead_miss(struct image_cache *ic, const struct meta_stat **stp,
		struct meta_stat *owner, uint32_t index, uint64_t uoff, uint64_t len)
{
	uint64_t size = ic->img->blobs.blobs[index].uncompressed_size;
	const struct meta_stat *st = *stp;
	bool at_start;

	/*
	 * A miss inside a running prefetch plan queues nothing: the plan has
	 * its file's bytes under way, and a window beyond them would take
	 * the link from the listed bytes.
	 */
	if (uoff <= size && len <= size - uoff && /* else ensure says why */
	    !planned(ic, index, uoff, len)) {
		if (!st && !owner_find(ic, index, uoff, owner))
			st = owner;
		if (ahead_window_after(st))
			ahead_queue(ic, index, uoff, len, true);
		if (st && st->size <= AHEAD_DIR_FILE && ic->ahead_on) {
			pthread_mutex_lock(&ic->lock);
			ahead_dir(ic, st->nid);
			py_miss(ic, st->nid);
			pthread_mutex_unlock(&ic->lock);
		}
		if (st)
			ahead_file(ic, st, false, !in_ends(ic, st, index, uoff));
	}
	/*
	 * A program the image records the dependencies of has them queued
	 * now, while its own start is fetched; another is inspected once
	 * its header is in.
	 */
	at_start = st && miss_at_start(ic, st, index, uoff, len);
	if (at_start && elf_recorded(ic, st->nid))
		elf_push(ic, st->nid);
	*stp = st;
	return at_start;
}

void ahead_program_fetched(struct image_cache *ic, const struct meta_stat *st)
{
	elf_check(ic, st);
}
