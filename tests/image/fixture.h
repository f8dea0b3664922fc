/* SPDX-License-Identifier: MIT */
/*
 * Images for the pkg-image tests, built by running a conversion through
 * the library (pkg-convert) from a small tree made here: inline files, a
 * file of several chunks with a hole, a symlink and a subdirectory.
 */
#ifndef FERRY_TEST_IMAGE_FIXTURE_H
#define FERRY_TEST_IMAGE_FIXTURE_H

#include <stdarg.h>
#include <stdint.h>
#include <fcntl.h>
#include <unistd.h>

#include "../../pkg-base/base.h"
#include "../../pkg-convert/convert.h"
#include "../../pkg-image/image.h"

#define FIXTURE_CHUNK (256u << 10) /* each chunk a frame of its own */
#define FIXTURE_BIG_SIZE (3 * FIXTURE_CHUNK + 1000)

static char tmpdir[64];

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...)
{
	char cmd[4096];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	return system(cmd);
}

/* Byte @i of the big file: no two chunks alike, chunk 1 all zero (a hole). */
static uint8_t big_byte(uint64_t i)
{
	return i / FIXTURE_CHUNK == 1 ? 0 : (uint8_t)(i * 7 + i / 4093);
}

/* TMP/src: the tree every image of these tests is converted from. */
static int fixture_tree(void)
{
	char path[256];
	uint8_t *buf = malloc(FIXTURE_BIG_SIZE);
	uint64_t i;
	int fd, ret;

	if (!buf)
		return -ENOMEM;
	for (i = 0; i < FIXTURE_BIG_SIZE; i++)
		buf[i] = big_byte(i);
	if (sh("mkdir -p %s/src/sub && echo hello > %s/src/small && "
	       "ln -s small %s/src/link && echo deep > %s/src/sub/deep",
	       tmpdir, tmpdir, tmpdir, tmpdir)) {
		free(buf);
		return -EIO;
	}
	snprintf(path, sizeof(path), "%s/src/big", tmpdir);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	ret = fd < 0 ? -errno : write_full(fd, buf, FIXTURE_BIG_SIZE);
	if (fd >= 0)
		close(fd);
	free(buf);
	return ret;
}

/* Convert TMP/src into @dest ("dir:…" or "oci:…"), uncompressed blobs. */
static int fixture_convert(const char *dest, const char *prefetch_file)
{
	struct convert_opts opts = {
		.chunk_size = FIXTURE_CHUNK,
		.inline_max = CONVERT_DEFAULT_INLINE_MAX,
		.compress = { BLOB_CODEC_NONE, 0 },
		.jobs = 1,
		.prefetch_files = prefetch_file,
	};
	struct convert_stats stats;
	char src[128];
	int ret;

	snprintf(src, sizeof(src), "dir:%s/src", tmpdir);
	ret = convert_run(src, dest, &opts, &stats);
	if (!ret)
		convert_stats_free(&stats);
	return ret;
}

/* Flip one bit of byte @off of @path. */
static int flip_byte(const char *path, uint64_t off)
{
	int fd = open(path, O_RDWR), ret;
	uint8_t b;

	if (fd < 0)
		return -errno;
	ret = pread_full(fd, &b, 1, off);
	b ^= 0x10;
	if (!ret)
		ret = pwrite_full(fd, &b, 1, off);
	close(fd);
	return ret;
}

static int fixture_init(const char *name)
{
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/ferry-test-%s-XXXXXX", name);
	if (!mkdtemp(tmpdir))
		return -errno;
	return fixture_tree();
}

#endif
