/* SPDX-License-Identifier: MIT */
/*
 * Minimal unit-test harness. Each test is a function; CHECK records a
 * failure with file:line and continues. RUN_TEST prints "ok - name" or
 * "not ok - name" (tests/run.sh counts those lines); TEST_MAIN_END exits
 * non-zero if anything failed.
 */
#ifndef FERRY_TEST_H
#define FERRY_TEST_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../pkg-base/base.h"

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

/*
 * Run a shell command (printf-style): its exit status (system(3)). Its
 * output is kept aside and shown on stderr, with the command, only when
 * it fails.
 */
static inline int test_run(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline int test_run(const char *fmt, ...)
{
	char cmd[65536], log[] = "/tmp/ferry-test-run.XXXXXX", full[sizeof(cmd) + 128];
	int fd = mkstemp(log), rc;
	va_list ap;

	va_start(ap, fmt);
	rc = vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	if (rc < 0 || (size_t)rc >= sizeof(cmd) || fd < 0) {
		fprintf(stderr, "  command too long or no log file: %.300s\n", cmd);
		if (fd >= 0)
			unlink(log);
		return -1;
	}
	close(fd);
	snprintf(full, sizeof(full), "(%s) >%s 2>&1", cmd, log);
	rc = system(full);
	if (rc) {
		fprintf(stderr, "  command failed (%d): %.300s\n", rc, cmd);
		snprintf(full, sizeof(full), "head -c 3000 %s >&2", log);
		if (system(full))
			fprintf(stderr, "  (no output)\n");
	}
	unlink(log);
	return rc;
}

/*
 * The whole file @path (read_file_max), malloc'ed with a NUL after it, its
 * size in *@len; NULL, said on stderr, when it cannot be read.
 */
static inline uint8_t *test_read_file(const char *path, size_t *len)
{
	char *data = NULL;
	int ret = read_file_max(path, SIZE_MAX, &data, len);

	if (ret) {
		fprintf(stderr, "  reading %s: %s\n", path, strerror(-ret));
		return NULL;
	}
	return (uint8_t *)data;
}

/* @dir/@name in one of four static buffers (so that a call can take two). */
static inline const char *test_path(const char *dir, const char *name)
{
	static char path[4][PATH_MAX];
	static unsigned int n;
	char *p = path[n++ % 4];

	snprintf(p, sizeof(path[0]), "%s/%s", dir, name);
	return p;
}

#define TEST_MAIN_END() return test_failed_cases ? 1 : 0

#endif
