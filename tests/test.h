/* SPDX-License-Identifier: MIT */
/*
 * Minimal unit-test harness. Each test is a function; CHECK records a
 * failure with file:line and continues. RUN_TEST prints "ok - name" or
 * "not ok - name" (tests/run.sh counts those lines); TEST_MAIN_END exits
 * non-zero if anything failed.
 */
#ifndef FERRY_TEST_H
#define FERRY_TEST_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int test_failures_in_case;
static int test_failed_cases;

#define CHECK(cond)                                                            \
	do {                                                                   \
		if (!(cond)) {                                                 \
			fprintf(stderr, "  %s:%d: CHECK(%s) failed\n",         \
				__FILE__, __LINE__, #cond);                    \
			test_failures_in_case++;                               \
		}                                                              \
	} while (0)

#define CHECK_EQ(a, b)                                                         \
	do {                                                                   \
		long long _a = (long long)(a), _b = (long long)(b);            \
		if (_a != _b) {                                                \
			fprintf(stderr, "  %s:%d: %s == %lld, expected %s == %lld\n", \
				__FILE__, __LINE__, #a, _a, #b, _b);           \
			test_failures_in_case++;                               \
		}                                                              \
	} while (0)

#define RUN_TEST(fn)                                                           \
	do {                                                                   \
		test_failures_in_case = 0;                                     \
		fn();                                                          \
		printf("%s - %s\n", test_failures_in_case ? "not ok" : "ok", #fn); \
		fflush(stdout);                                                \
		if (test_failures_in_case)                                     \
			test_failed_cases++;                                   \
	} while (0)

/* xorshift64: the tests' reproducible pseudo-random numbers. */
static inline uint64_t test_xorshift(uint64_t *state)
{
	*state ^= *state << 13;
	*state ^= *state >> 7;
	*state ^= *state << 17;
	return *state;
}

#define TEST_MAIN_END() return test_failed_cases ? 1 : 0

#endif
