// SPDX-License-Identifier: MIT
/*
 * Fetch-ahead's planner (pkg-image/ahead_plan.c): the window's budget, its
 * growth under a sequential reader and its restart under a random one,
 * which misses start one, a file's chunks as pieces of contiguous blob
 * bytes, from either end, whole or its ends, and which directories are
 * predicted as sibling packages.
 */
#include <errno.h>

#include "../../pkg-image/cache.h"
#include "../test.h"

#define KIB 1024ull
#define MIB (1024ull * 1024)

static void test_budget(void)
{
	CHECK_EQ(ahead_budget(0, 0), AHEAD_MIN);              /* nothing measured */
	CHECK_EQ(ahead_budget(0.001, 1e6), AHEAD_MIN);        /* loopback */
	CHECK_EQ(ahead_budget(0.5, 1e9), AHEAD_MAX);          /* far and fast */
	/* 20 ms at 10 MB/s: four bandwidth-delay products, 800 kB. */
	CHECK_EQ(ahead_budget(0.02, 10e6), 800000);
}

static void test_window(void)
{
	struct ahead_span w = { 0 };
	struct ahead_range r = { 0 };
	uint64_t size = 100 * MIB, budget = MIB;

	/* A first miss: a quarter of the budget after the read. */
	CHECK(ahead_window_next(&w, size, budget, 0, 4 * KIB, &r));
	CHECK_EQ(r.uoff, 4 * KIB);
	CHECK_EQ(r.len, budget / 4);
	CHECK_EQ(w.origin, 0);
	CHECK_EQ(w.mark, 4 * KIB);
	CHECK_EQ(w.end, 4 * KIB + budget / 4);
	/* Reads before the mark queue nothing. */
	CHECK(!ahead_window_next(&w, size, budget, 0, 4 * KIB, &r));
	/* Crossing the mark: twice the last segment, then the budget. */
	CHECK(ahead_window_next(&w, size, budget, 4 * KIB, 4 * KIB, &r));
	CHECK_EQ(r.uoff, 4 * KIB + budget / 4);
	CHECK_EQ(r.len, budget / 2);
	CHECK(ahead_window_next(&w, size, budget, w.mark, 4 * KIB, &r));
	CHECK_EQ(r.len, budget);
	CHECK(ahead_window_next(&w, size, budget, w.mark, 4 * KIB, &r));
	CHECK_EQ(r.len, budget);
	CHECK_EQ(w.origin, 0);
	/* A small budget still starts with AHEAD_FIRST. */
	w = (struct ahead_span){ 0 };
	CHECK(ahead_window_next(&w, size, 64 * KIB, 0, 4 * KIB, &r));
	CHECK_EQ(r.len, AHEAD_FIRST);
	/* A read outside the window starts another where it is. */
	CHECK(ahead_window_next(&w, size, budget, 50 * MIB, 8 * KIB, &r));
	CHECK_EQ(w.origin, 50 * MIB);
	CHECK_EQ(r.uoff, 50 * MIB + 8 * KIB);
	CHECK_EQ(r.len, budget / 4);
	/* Near the blob's end the segment stops there; at the end, nothing
	 * is queued, though the window moved. */
	CHECK(ahead_window_next(&w, size, budget, size - 100 * KIB, 4 * KIB, &r));
	CHECK_EQ(r.len, 96 * KIB);
	CHECK_EQ(w.end, size);
	w = (struct ahead_span){ 0 };
	CHECK(!ahead_window_next(&w, size, budget, size - 4 * KIB, 4 * KIB, &r));
	CHECK_EQ(w.origin, size - 4 * KIB);
	CHECK_EQ(w.end, 0);
}

/*
 * A file of 64 KiB chunks: chunk c at 1 MiB + c * 64 KiB of blob 0, but
 * chunk 2 a hole, chunk 4 at 0 of blob 1, and chunk @bad corrupt.
 */
struct file {
	int bad;
	struct ahead_range got[32];
	uint32_t index[32];
	unsigned int nr;
};

static int fake_locate(void *ctx, uint64_t pos, uint32_t *index, uint64_t *uoff)
{
	struct file *f = ctx;
	uint64_t c = pos / (64 * KIB);

	if ((int)c == f->bad)
		return -EFSCORRUPTED;
	if (c == 2)
		return 1;
	*index = c == 4 ? 1 : 0;
	*uoff = c == 4 ? 0 : MIB + c * 64 * KIB;
	return 0;
}

static void fake_piece(void *ctx, uint32_t index, uint64_t uoff, uint64_t len)
{
	struct file *f = ctx;

	if (f->nr < ARRAY_SIZE(f->got)) {
		f->index[f->nr] = index;
		f->got[f->nr++] = (struct ahead_range){ .uoff = uoff, .len = len };
	}
}

static bool piece_is(const struct file *f, unsigned int i, uint32_t index, uint64_t uoff,
		     uint64_t len)
{
	if (i < f->nr && f->index[i] == index && f->got[i].uoff == uoff && f->got[i].len == len)
		return true;
	fprintf(stderr, "  piece %u: ", i);
	if (i < f->nr)
		fprintf(stderr, "blob %u %llu+%llu", f->index[i],
			(unsigned long long)f->got[i].uoff, (unsigned long long)f->got[i].len);
	else
		fprintf(stderr, "none");
	fprintf(stderr, ", expected blob %u %llu+%llu\n", index, (unsigned long long)uoff,
		(unsigned long long)len);
	return false;
}

static void test_file_pieces(void)
{
	struct meta_stat st = { .size = 4 * 64 * KIB + 1000, .chunk_size = 64 * KIB,
				.nr_chunks = 5 };
	struct file f = { .bad = -1 };

	/* From the start: runs of contiguous chunks, holes skipped. */
	CHECK_EQ(ahead_file_pieces(&st, false, false, AHEAD_STEP, fake_locate, fake_piece, &f), 0);
	CHECK_EQ(f.nr, 3);
	CHECK(piece_is(&f, 0, 0, MIB, 128 * KIB));
	CHECK(piece_is(&f, 1, 0, MIB + 192 * KIB, 64 * KIB));
	CHECK(piece_is(&f, 2, 1, 0, 1000));
	/* From the end: the same bytes, the file's start last queued. */
	f = (struct file){ .bad = -1 };
	CHECK_EQ(ahead_file_pieces(&st, true, false, AHEAD_STEP, fake_locate, fake_piece, &f), 0);
	CHECK_EQ(f.nr, 3);
	CHECK(piece_is(&f, 0, 1, 0, 1000));
	CHECK(piece_is(&f, 1, 0, MIB + 192 * KIB, 64 * KIB));
	CHECK(piece_is(&f, 2, 0, MIB, 128 * KIB));
	/* A corrupt chunk ends it: what came before is queued, the error returned. */
	f = (struct file){ .bad = 3 };
	CHECK_EQ(ahead_file_pieces(&st, false, false, AHEAD_STEP, fake_locate, fake_piece, &f), -EFSCORRUPTED);
	CHECK_EQ(f.nr, 1);
	CHECK(piece_is(&f, 0, 0, MIB, 128 * KIB));
}

/* A file of 20 contiguous 64 KiB chunks: pieces of at most the step. */
static int contiguous(void *ctx, uint64_t pos, uint32_t *index, uint64_t *uoff)
{
	*index = 0;
	*uoff = pos;
	return 0;
}

static void test_file_steps(void)
{
	struct meta_stat st = { .size = 20 * 64 * KIB, .chunk_size = 64 * KIB,
				.nr_chunks = 20 };
	struct file f = { .bad = -1 };

	CHECK_EQ(ahead_file_pieces(&st, false, false, AHEAD_STEP, contiguous, fake_piece, &f), 0);
	CHECK_EQ(f.nr, 2);
	CHECK(piece_is(&f, 0, 0, 0, AHEAD_STEP));
	CHECK(piece_is(&f, 1, 0, AHEAD_STEP, 20 * 64 * KIB - AHEAD_STEP));
	/* On a stream blob: one piece, each step would decode from its point. */
	f = (struct file){ .bad = -1 };
	CHECK_EQ(ahead_file_pieces(&st, false, false, AHEAD_STREAM_STEP, contiguous, fake_piece,
				   &f), 0);
	CHECK_EQ(f.nr, 1);
	CHECK(piece_is(&f, 0, 0, 0, 20 * 64 * KIB));
	/* A file of AHEAD_FILE_MAX bytes too. */
	st = (struct meta_stat){ .size = AHEAD_FILE_MAX, .chunk_size = MIB,
				 .nr_chunks = AHEAD_FILE_MAX / MIB };
	f = (struct file){ .bad = -1 };
	CHECK_EQ(ahead_file_pieces(&st, true, false, AHEAD_STREAM_STEP, contiguous, fake_piece,
				   &f), 0);
	CHECK_EQ(f.nr, 1);
	CHECK(piece_is(&f, 0, 0, 0, AHEAD_FILE_MAX));
}

/* Files fetch-ahead queues itself start no window; larger ones do. */
static void test_window_after(void)
{
	struct meta_stat st = { .size = AHEAD_FILE_MAX, .chunk_size = MIB };

	CHECK(!ahead_window_after(&st));
	st.size = 4 * KIB;
	CHECK(!ahead_window_after(&st));
	st.size = AHEAD_FILE_MAX + 1;
	CHECK(ahead_window_after(&st));
	CHECK(ahead_window_after(NULL));
}

/* A library's ends: its first and last chunks, from either end. */
static void test_file_ends(void)
{
	struct meta_stat st = { .size = 20 * 64 * KIB - 100, .chunk_size = 64 * KIB,
				.nr_chunks = 20 };
	struct file f = { .bad = -1 };

	CHECK_EQ(ahead_file_pieces(&st, false, true, AHEAD_STEP, contiguous, fake_piece, &f), 0);
	CHECK_EQ(f.nr, 2);
	CHECK(piece_is(&f, 0, 0, 0, 64 * KIB));
	CHECK(piece_is(&f, 1, 0, 19 * 64 * KIB, 64 * KIB - 100));
	f = (struct file){ .bad = -1 };
	CHECK_EQ(ahead_file_pieces(&st, true, true, AHEAD_STEP, contiguous, fake_piece, &f), 0);
	CHECK_EQ(f.nr, 2);
	CHECK(piece_is(&f, 0, 0, 19 * 64 * KIB, 64 * KIB - 100));
	CHECK(piece_is(&f, 1, 0, 0, 64 * KIB));
	/* Two chunks are both ends, one piece. */
	st = (struct meta_stat){ .size = 128 * KIB, .chunk_size = 64 * KIB, .nr_chunks = 2 };
	f = (struct file){ .bad = -1 };
	CHECK_EQ(ahead_file_pieces(&st, false, true, AHEAD_STEP, contiguous, fake_piece, &f), 0);
	CHECK_EQ(f.nr, 1);
	CHECK(piece_is(&f, 0, 0, 0, 128 * KIB));
}

/* Siblings: the subpackages of a package, not its tests, nothing else. */
static void test_dir_sibling(void)
{
	struct ahead_dir pkg = { .package = true }, dir = { 0 };
	struct ahead_dir sub = { .package = true }, tests = { .package = true, .tests = true };

	CHECK(ahead_dir_sibling(&pkg, &sub));     /* numpy/linalg beside numpy/core */
	CHECK(!ahead_dir_sibling(&pkg, &tests));  /* numpy/core/tests */
	CHECK(!ahead_dir_sibling(&pkg, &dir));    /* numpy/core/include */
	CHECK(!ahead_dir_sibling(&dir, &sub));    /* /usr/lib/python3.11/email */
	CHECK(!ahead_dir_sibling(&dir, &dir));    /* /usr/lib/x86_64-linux-gnu/gconv */
}

/* A full queue drops its oldest job that is not a module's reading. */
static void test_drop(void)
{
	struct ahead_job q[8] = { 0 };
	unsigned int i;

	/* Windows only: the oldest, wherever the ring starts. */
	CHECK_EQ(ahead_drop(q, 8, 0), 0);
	CHECK_EQ(ahead_drop(q, 8, 5), 0);
	/* The oldest two are .pyc readings: the third goes. */
	q[5].py = q[6].py = 1;
	CHECK_EQ(ahead_drop(q, 8, 5), 2);
	/* Across the ring's end. */
	q[7].py = q[0].py = 1;
	CHECK_EQ(ahead_drop(q, 8, 5), 4);
	/* Nothing but readings: the oldest after all. */
	for (i = 0; i < 8; i++)
		q[i].py = i + 1;
	CHECK_EQ(ahead_drop(q, 8, 3), 0);
}

int main(void)
{
	RUN_TEST(test_budget);
	RUN_TEST(test_drop);
	RUN_TEST(test_window);
	RUN_TEST(test_file_pieces);
	RUN_TEST(test_file_steps);
	RUN_TEST(test_file_ends);
	RUN_TEST(test_window_after);
	RUN_TEST(test_dir_sibling);
	TEST_MAIN_END();
}
