// SPDX-License-Identifier: MIT
/*
 * Fetch-ahead's planner (fetch_ahead.c): which blob ranges a read queues.
 * Pure functions of their arguments, so that the window's growth and a
 * file's pieces can be tested without a registry (tests/image/
 * test_ahead_plan.c).
 */
#include "cache.h"

uint64_t ahead_budget(double rtt_s, double bw_Bps)
{
	double b = AHEAD_BDP_FACTOR * bw_Bps * rtt_s;

	return (uint64_t)MIN(MAX(b, (double)AHEAD_MIN), (double)AHEAD_MAX);
}

/*
 * A miss outside the blob's window starts a new one with a quarter of
 * the budget after the read (a random reader wastes little); a read that
 * crosses the window's mark (the start of its last segment) queues a
 * segment twice as large as the last, up to the budget, so a sequential
 * reader stays a segment or two ahead.
 */
bool ahead_window_next(struct ahead_span *w, uint64_t size, uint64_t budget, uint64_t uoff,
		       uint64_t len, struct ahead_range *out)
{
	uint64_t from, seg;

	if (uoff + len > w->origin && uoff < w->end) {
		if (uoff + len <= w->mark)
			return false; /* queued already, and the reader is not near its end */
		from = w->end;
		seg = MIN(2 * w->seg, budget);
	} else {
		w->origin = uoff;
		from = uoff + len;
		seg = MAX(budget / 4, (uint64_t)AHEAD_FIRST);
	}
	if (from >= size)
		return false;
	seg = MIN(seg, size - from);
	w->seg = seg;
	w->mark = from;
	w->end = from + seg;
	*out = (struct ahead_range){ .uoff = from, .len = seg };
	return true;
}

/*
 * A miss in a file fetch-ahead queues by itself (at most AHEAD_FILE_MAX
 * bytes: ahead_file) starts no window: the window went past the file into
 * its neighbours in the blob, other libraries and packages (6 of the
 * 29 MB `import numpy` fetched at 20 ms RTT, a tenth of it read). It
 * keeps a reader of a larger file, or of bytes no known file owns,
 * ahead.
 */
bool ahead_window_after(const struct meta_stat *st)
{
	return !st || st->size > AHEAD_FILE_MAX;
}

/*
 * The chunks of a file in pieces of at most @step contiguous blob bytes,
 * from its end (@start_first: the threads take the newest piece first,
 * so its start comes first) or from its start; with @ends its first and
 * last chunks only.
 */
int ahead_file_pieces(const struct meta_stat *st, bool start_first, bool ends, uint64_t step,
		      int (*locate_fn)(void *ctx, uint64_t pos, uint32_t *index, uint64_t *uoff),
		      void (*piece)(void *ctx, uint32_t index, uint64_t uoff, uint64_t len),
		      void *ctx)
{
	uint64_t c, nr, pos, n, uoff = 0, run_off = 0, run_len = 0;
	uint32_t index = 0, run_index = 0;
	int ret = 0;

	nr = st->chunk_size ? DIV_ROUND_UP(st->size, st->chunk_size) : 0;
	for (c = 0; c < nr; c++) {
		pos = (start_first ? nr - 1 - c : c) * st->chunk_size;
		if (ends && pos && pos / st->chunk_size != nr - 1)
			continue;
		n = MIN(st->size - pos, (uint64_t)st->chunk_size);
		ret = locate_fn(ctx, pos, &index, &uoff);
		if (ret < 0)
			break; /* the reader's own read reports it */
		if (ret) {
			ret = 0;
			continue; /* a hole */
		}
		if (run_len && index == run_index && run_len + n <= step &&
		    (start_first ? uoff + n == run_off : run_off + run_len == uoff)) {
			run_off = MIN(run_off, uoff);
			run_len += n;
			continue;
		}
		if (run_len)
			piece(ctx, run_index, run_off, run_len);
		run_index = index;
		run_off = uoff;
		run_len = n;
	}
	if (run_len)
		piece(ctx, run_index, run_off, run_len);
	return ret;
}

/*
 * Sibling prediction bets that the package being imported imports the
 * packages beside it: numpy's __init__ imports numpy.core, numpy.lib,
 * numpy.linalg... So only the subpackages of a package (directories
 * holding __init__.py, in one that does) are predicted, never its
 * tests: the subdirectories of /usr/lib, /usr/lib/python3.11 or gconv's
 * directory are unrelated programs, modules and data, and predicting
 * them was 6.5 of the 35 MB `import numpy` fetched at 20 ms RTT, 3 %
 * of it read.
 */
bool ahead_dir_sibling(const struct ahead_dir *parent, const struct ahead_dir *d)
{
	return parent->package && d->package && !d->tests;
}

/*
 * A full queue drops its oldest job, for readers moved on past a window,
 * but a module's reading only when it holds nothing else: an interpreter
 * reaches every import of a module body, however late (a module's 25
 * imports and theirs, depth first, dropped numpy's last subpackages).
 */
unsigned int ahead_drop(const struct ahead_job *q, unsigned int n, unsigned int head)
{
	unsigned int k;

	for (k = 0; k < n && q[(head + k) % n].py; k++)
		;
	return k == n ? 0 : k;
}
