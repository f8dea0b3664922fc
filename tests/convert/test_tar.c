// SPDX-License-Identifier: MIT
/*
 * Tests for the streaming tar reader and the decompressing input:
 * archives written by GNU tar (gnu, posix, ustar, v7) from a tree built
 * here, compressed with gzip / zstd / xz, and archives crafted byte by
 * byte for the corner cases and corruptions real tools do not produce.
 */
#include "../test.h"

#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "../../pkg-base/base.h"
#include "../../pkg-convert/tar.h"

/* ---- collecting what the reader returns ---- */

#define MAX_ENTRIES 64
#define MAX_XATTRS 4

struct rec {
	enum tar_type type;
	char path[1200], link[1200];
	bool has_link;
	uint32_t mode, uid, gid, major, minor;
	int64_t mtime;
	uint32_t nsec;
	uint64_t size, data_len, data_hash; /* hash of the first MiB */
	uint8_t head[64]; /* first data bytes */
	uint32_t nx;
	char xname[MAX_XATTRS][64];
	uint8_t xval[MAX_XATTRS][64];
	uint32_t xlen[MAX_XATTRS];
};

struct result {
	int ret; /* last tar_next() / tar_read_data() error, or 0 */
	int n;
	uint64_t offset;
	struct rec e[MAX_ENTRIES];
};

static uint64_t fnv(uint64_t h, const uint8_t *p, size_t n)
{
	while (n--)
		h = (h ^ *p++) * 0x100000001b3ull;
	return h;
}

#define FNV_INIT 0xcbf29ce484222325ull

/*
 * Iterate the whole archive, reading data @chunk bytes at a time and at
 * most @limit bytes of each entry (tar_next skips the rest).
 */
static struct result *read_tar_limit(struct byte_source src, size_t chunk,
				     uint64_t limit)
{
	struct result *res = calloc(1, sizeof(*res));
	uint8_t *buf = malloc(chunk);
	struct tar_reader *r;
	struct tar_entry *e;
	int ret;

	if (tar_reader_new(src, &r)) {
		res->ret = -ENOMEM;
		goto out;
	}
	while ((ret = tar_next(r, &e)) == 1 && res->n < MAX_ENTRIES) {
		struct rec *c = &res->e[res->n++];
		uint32_t i;
		ssize_t k = 0;

		c->type = e->type;
		snprintf(c->path, sizeof(c->path), "%s", e->path);
		c->has_link = e->linkname != NULL;
		if (e->linkname)
			snprintf(c->link, sizeof(c->link), "%s", e->linkname);
		c->mode = e->mode;
		c->uid = e->uid;
		c->gid = e->gid;
		c->major = e->dev_major;
		c->minor = e->dev_minor;
		c->mtime = e->mtime;
		c->nsec = e->mtime_nsec;
		c->size = e->size;
		c->nx = e->nr_xattrs;
		for (i = 0; i < e->nr_xattrs && i < MAX_XATTRS; i++) {
			snprintf(c->xname[i], 64, "%s", e->xattrs[i].name);
			memcpy(c->xval[i], e->xattrs[i].value,
			       MIN(e->xattrs[i].value_len, 64u));
			c->xlen[i] = e->xattrs[i].value_len;
		}
		c->data_hash = FNV_INIT;
		while (c->data_len < limit &&
		       (k = tar_read_data(r, buf, chunk)) > 0) {
			if (c->data_len < sizeof(c->head))
				memcpy(c->head + c->data_len, buf,
				       MIN((size_t)k, sizeof(c->head) - c->data_len));
			if (c->data_len < (1 << 20))
				c->data_hash = fnv(c->data_hash, buf,
						   MIN((size_t)k, (1 << 20) - c->data_len));
			c->data_len += (uint64_t)k;
		}
		if (k < 0) {
			ret = (int)k;
			break;
		}
	}
	res->ret = ret;
	res->offset = tar_offset(r);
	tar_reader_free(r);
out:
	free(buf);
	return res;
}

static struct result *read_tar(struct byte_source src, size_t chunk)
{
	return read_tar_limit(src, chunk, UINT64_MAX);
}

static struct result *read_file(const char *path, size_t chunk)
{
	struct input_stream *in;
	struct result *res;
	int ret = input_open(path, &in);

	if (ret) {
		res = calloc(1, sizeof(*res));
		res->ret = ret;
		return res;
	}
	res = read_tar(input_source(in), chunk);
	input_close(in);
	return res;
}

static struct result *read_mem(const void *p, size_t n)
{
	struct input_stream *in;
	struct result *res;

	if (input_open_mem(p, n, &in)) {
		res = calloc(1, sizeof(*res));
		res->ret = -ENOMEM;
		return res;
	}
	res = read_tar(input_source(in), 4096);
	input_close(in);
	return res;
}

/* ---- a byte source made of segments, with a cap on each read ---- */

struct seg {
	const uint8_t *data; /* NULL: bytes nobody looks at (not written) */
	uint64_t len;
};

struct vsrc {
	const struct seg *segs;
	int nsegs, i;
	uint64_t off; /* within segs[i] */
	size_t max_read;
};

static ssize_t vsrc_read(void *ctx, void *buf, size_t len)
{
	struct vsrc *v = ctx;
	size_t n;

	while (v->i < v->nsegs && v->off == v->segs[v->i].len) {
		v->i++;
		v->off = 0;
	}
	if (v->i == v->nsegs)
		return 0;
	n = (size_t)MIN((uint64_t)MIN(len, v->max_read),
			v->segs[v->i].len - v->off);
	if (v->segs[v->i].data)
		memcpy(buf, v->segs[v->i].data + v->off, n);
	v->off += n;
	return (ssize_t)n;
}

static struct result *read_segs(const struct seg *segs, int n, size_t max_read,
				size_t chunk, uint64_t limit)
{
	struct vsrc v = { segs, n, 0, 0, max_read };

	return read_tar_limit((struct byte_source){ .read = vsrc_read, .ctx = &v }, chunk,
			      limit);
}

static struct result *read_buf(const void *p, size_t n, size_t max_read)
{
	struct seg s = { p, n };

	return read_segs(&s, 1, max_read, 4096, UINT64_MAX);
}

/* ---- crafting archives ---- */

struct ab {
	uint8_t *p;
	size_t len, cap;
};

static void ab_put(struct ab *a, const void *d, size_t n)
{
	if (a->len + n > a->cap) {
		a->cap = (a->len + n) * 2 + 4096;
		a->p = realloc(a->p, a->cap);
	}
	if (d)
		memcpy(a->p + a->len, d, n);
	else
		memset(a->p + a->len, 0, n);
	a->len += n;
}

static void ab_pad(struct ab *a)
{
	ab_put(a, NULL, (512 - a->len % 512) % 512);
}

enum { USTAR, GNU, V7 };

struct hs {
	const char *name;
	char type;
	int64_t size;
	const char *link;
	int fmt;
	int64_t mode, uid, gid, mtime;
	uint32_t major, minor;
	const char *prefix;
};

/* Octal when it fits in w-1 digits, else GNU base-256 (two's complement). */
static void put_num(uint8_t *f, size_t w, int64_t v)
{
	size_t i;

	if (v >= 0 && v < (1ll << (3 * (w - 1)))) {
		char tmp[24];

		snprintf(tmp, sizeof(tmp), "%0*llo", (int)(w - 1), (long long)v);
		memcpy(f, tmp, w - 1);
		f[w - 1] = 0;
		return;
	}
	for (i = 0; i < w; i++)
		f[w - 1 - i] = i < 8 ? (uint8_t)((uint64_t)v >> (8 * i)) :
			       (v < 0 ? 0xff : 0);
	f[0] = v < 0 ? 0xff : 0x80;
}

static void set_checksum(uint8_t *h)
{
	unsigned int sum = 0, i;
	char tmp[8];

	memset(h + 148, ' ', 8);
	for (i = 0; i < 512; i++)
		sum += h[i];
	snprintf(tmp, sizeof(tmp), "%06o", sum);
	memcpy(h + 148, tmp, 7);
}

static void make_header(uint8_t *h, const struct hs *s)
{
	memset(h, 0, 512);
	memcpy(h, s->name, MIN(strlen(s->name), 100u));
	put_num(h + 100, 8, s->mode ? s->mode : 0644);
	put_num(h + 108, 8, s->uid);
	put_num(h + 116, 8, s->gid);
	put_num(h + 124, 12, s->size);
	put_num(h + 136, 12, s->mtime);
	h[156] = (uint8_t)s->type;
	if (s->link)
		memcpy(h + 157, s->link, MIN(strlen(s->link), 100u));
	if (s->fmt == USTAR)
		memcpy(h + 257, "ustar\0" "00", 8);
	else if (s->fmt == GNU)
		memcpy(h + 257, "ustar  \0", 8);
	if (s->fmt != V7) {
		memcpy(h + 265, "root", 4);
		memcpy(h + 297, "root", 4);
		put_num(h + 329, 8, s->major);
		put_num(h + 337, 8, s->minor);
	}
	if (s->prefix)
		memcpy(h + 345, s->prefix, strlen(s->prefix));
	set_checksum(h);
}

/* Header plus data (NULL: zeros) plus padding; returns the header offset. */
static size_t ab_entry(struct ab *a, const struct hs *s, const void *data)
{
	size_t at = a->len;
	uint8_t h[512];

	make_header(h, s);
	ab_put(a, h, 512);
	if (s->size > 0 && s->size < (1 << 24)) {
		ab_put(a, data, (size_t)s->size);
		ab_pad(a);
	}
	return at;
}

static void ab_file(struct ab *a, const char *name, const char *content)
{
	struct hs s = { .name = name, .type = '0', .size = (int64_t)strlen(content) };

	ab_entry(a, &s, content);
}

static void ab_end(struct ab *a)
{
	ab_put(a, NULL, 1024);
}

/* Append one "LEN key=value\n" PAX record to @recs. */
static void pax_rec(struct ab *recs, const char *key, const void *val,
		    size_t vlen)
{
	size_t base = strlen(key) + vlen + 3, len = base + 1;
	char num[24];

	/* LEN counts its own digits: iterate to the fixed point. */
	for (;;) {
		snprintf(num, sizeof(num), "%zu", len);
		if (strlen(num) + base == len)
			break;
		len = strlen(num) + base;
	}
	ab_put(recs, num, strlen(num));
	ab_put(recs, " ", 1);
	ab_put(recs, key, strlen(key));
	ab_put(recs, "=", 1);
	ab_put(recs, val, vlen);
	ab_put(recs, "\n", 1);
}

static void pax_str(struct ab *recs, const char *key, const char *val)
{
	pax_rec(recs, key, val, strlen(val));
}

static void ab_pax(struct ab *a, char type, const struct ab *recs)
{
	struct hs s = { .name = "PaxHeaders/x", .type = type,
			.size = (int64_t)recs->len };

	ab_entry(a, &s, recs->p);
}

static bool rec_is(const struct rec *c, enum tar_type type, const char *path)
{
	bool ok = c->type == type && !strcmp(c->path, path);

	if (!ok)
		fprintf(stderr, "  got type %d path '%s', want %d '%s'\n",
			c->type, c->path, type, path);
	return ok;
}

static bool head_is(const struct rec *c, const char *content)
{
	size_t n = strlen(content);

	return c->data_len == n && c->size == n &&
	       !memcmp(c->head, content, MIN(n, sizeof(c->head))) &&
	       c->data_hash == fnv(FNV_INIT, (const uint8_t *)content, n);
}

/* ---- archives written by GNU tar ---- */

static char tmpdir[64];

static void tpath(char *buf, size_t n, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void tpath(char *buf, size_t n, const char *fmt, ...)
{
	int k = snprintf(buf, n, "%s/", tmpdir);
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf + k, n - (size_t)k, fmt, ap);
	va_end(ap);
}

enum { F_GNU = 1, F_PAX = 2, F_USTAR = 4, F_V7 = 8, F_ALL = 15 };

struct tspec {
	const char *path;
	enum tar_type type;
	uint32_t mode, uid, gid;
	int64_t mtime;
	uint32_t nsec;
	const uint8_t *data;
	size_t data_len;
	const char *link;
	uint32_t major, minor;
	bool xattrs;
	unsigned int fmts;
};

static char long_dir1[80], long_dir2[160], long_file[200], name255[300];
static char long_target[320];
static uint8_t big_data[200000];
static struct tspec tree[32];
static int tree_n;

static void tree_add(struct tspec t)
{
	if (!t.uid && !t.gid) {
		t.uid = 1000;
		t.gid = 1001;
	}
	if (!t.mtime)
		t.mtime = 1500000000 + tree_n;
	tree[tree_n++] = t;
}

/* The source tree: every entry type, long names, odd ids and times. */
static void tree_init(void)
{
	static const char hello[] = "hello tar\n", script[] = "#!/bin/sh\n";
	uint64_t x = 88172645463325252ull;
	size_t i;

	for (i = 0; i < sizeof(big_data); i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		big_data[i] = (uint8_t)x;
	}
	snprintf(long_dir1, sizeof(long_dir1), "dir/%.60s",
		 "pppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppp");
	snprintf(long_dir2, sizeof(long_dir2), "%s/%.60s", long_dir1,
		 "qqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqq");
	snprintf(long_file, sizeof(long_file), "%s/file", long_dir2);
	strcpy(name255, "dir/");
	memset(name255 + 4, 'x', 255);
	name255[259] = '\0';
	for (i = 0; i < 300; i++)
		long_target[i] = i % 10 == 9 ? '/' : 't';
	long_target[300] = '\0';

	tree_n = 0;
	tree_add((struct tspec){ "dir", TAR_DIR, 0750, .fmts = F_ALL });
	tree_add((struct tspec){ "dir/file", TAR_REG, 0640, .mtime = 1600000000,
				 .nsec = 123456789, .data = (const uint8_t *)hello,
				 .data_len = sizeof(hello) - 1, .fmts = F_ALL });
	tree[tree_n] = tree[tree_n - 1];
	tree[tree_n].path = "dir/hard";
	tree[tree_n].type = TAR_HARDLINK;
	tree[tree_n].data_len = 0;
	tree[tree_n++].link = "dir/file";
	tree_add((struct tspec){ "dir/sym", TAR_SYMLINK, 0777, .link = "file",
				 .fmts = F_ALL });
	tree_add((struct tspec){ "dir/fifo", TAR_FIFO, 0600,
				 .fmts = F_GNU | F_PAX | F_USTAR });
	tree_add((struct tspec){ "dir/chr", TAR_CHR, 0620, .major = 1, .minor = 3,
				 .fmts = F_GNU | F_PAX | F_USTAR });
	tree_add((struct tspec){ "dir/blk", TAR_BLK, 0660, .major = 7,
				 .minor = 300, .fmts = F_GNU | F_PAX | F_USTAR });
	tree_add((struct tspec){ "dir/suid", TAR_REG, 06755,
				 .data = (const uint8_t *)script,
				 .data_len = sizeof(script) - 1, .fmts = F_ALL });
	tree_add((struct tspec){ "dir/empty", TAR_REG, 0644, .fmts = F_ALL });
	tree_add((struct tspec){ long_dir1, TAR_DIR, 0755,
				 .fmts = F_GNU | F_PAX | F_USTAR });
	tree_add((struct tspec){ long_dir2, TAR_DIR, 0700,
				 .fmts = F_GNU | F_PAX | F_USTAR });
	tree_add((struct tspec){ long_file, TAR_REG, 0444,
				 .data = (const uint8_t *)hello,
				 .data_len = sizeof(hello) - 1,
				 .fmts = F_GNU | F_PAX | F_USTAR });
	tree_add((struct tspec){ name255, TAR_REG, 0644,
				 .fmts = F_GNU | F_PAX });
	tree_add((struct tspec){ "dir/longsym", TAR_SYMLINK, 0777,
				 .link = long_target, .fmts = F_GNU | F_PAX });
	tree_add((struct tspec){ "dir/bigid", TAR_REG, 0600, .uid = 3000000,
				 .gid = 4000000000u, .fmts = F_GNU | F_PAX });
	tree_add((struct tspec){ "dir/old", TAR_REG, 0644, .mtime = -100000,
				 .fmts = F_GNU | F_PAX });
	tree_add((struct tspec){ "dir/xattr", TAR_REG, 0644, .xattrs = true,
				 .fmts = F_ALL });
	tree_add((struct tspec){ "dir/big", TAR_REG, 0644, .data = big_data,
				 .data_len = sizeof(big_data), .fmts = F_ALL });
}

static int tree_create(void)
{
	char p[1024];
	int i, fd;

	for (i = 0; i < tree_n; i++) {
		const struct tspec *t = &tree[i];
		int ret = 0;

		tpath(p, sizeof(p), "src/%s", t->path);
		switch (t->type) {
		case TAR_DIR:
			ret = mkdir(p, 0700);
			break;
		case TAR_REG:
			fd = open(p, O_WRONLY | O_CREAT | O_EXCL, 0600);
			if (fd < 0 || write_full(fd, t->data, t->data_len))
				ret = -1;
			if (fd >= 0)
				close(fd);
			break;
		case TAR_HARDLINK: {
			char target[1024];

			tpath(target, sizeof(target), "src/%s", t->link);
			ret = link(target, p);
			break;
		}
		case TAR_SYMLINK:
			ret = symlink(t->link, p);
			break;
		case TAR_FIFO:
			ret = mkfifo(p, 0600);
			break;
		case TAR_CHR:
		case TAR_BLK:
			ret = mknod(p, (t->type == TAR_CHR ? S_IFCHR : S_IFBLK) | 0600,
				    makedev(t->major, t->minor));
			break;
		}
		if (ret) {
			perror(p);
			return -1;
		}
		if (t->type == TAR_HARDLINK)
			continue;
		/* chown before chmod: chown clears the set-id bits. */
		if (lchown(p, t->uid, t->gid) ||
		    (t->type != TAR_SYMLINK && chmod(p, t->mode))) {
			perror(p);
			return -1;
		}
		if (t->xattrs && (lsetxattr(p, "user.a", "v\0al", 4, 0) ||
				  lsetxattr(p, "user.empty", "", 0, 0))) {
			perror("lsetxattr");
			return -1;
		}
	}
	/* Times last, children before their directories. */
	for (i = tree_n - 1; i >= 0; i--) {
		struct timespec ts[2];

		ts[0].tv_sec = ts[1].tv_sec = tree[i].mtime;
		ts[0].tv_nsec = ts[1].tv_nsec = tree[i].nsec;
		tpath(p, sizeof(p), "src/%s", tree[i].path);
		if (tree[i].type != TAR_HARDLINK &&
		    utimensat(AT_FDCWD, p, ts, AT_SYMLINK_NOFOLLOW)) {
			perror(p);
			return -1;
		}
	}
	return 0;
}

static const char *const format_names[] = { "", "gnu", "posix", "", "ustar",
					    "", "", "", "v7" };

/* Archive the entries of @fmt with GNU tar into TMP/<name>.tar. */
static int make_tar(unsigned int fmt, const char *name)
{
	static char list[16384];
	size_t len = 0;
	int i;

	for (i = 0; i < tree_n; i++)
		if (tree[i].fmts & fmt)
			len += (size_t)snprintf(list + len, sizeof(list) - len,
						" %s", tree[i].path);
	return test_run("tar --format=%s %s --no-recursion -C %s/src -cf %s/%s.tar%s",
		  format_names[fmt],
		  fmt == F_PAX ? "--xattrs --xattrs-include='*'" : "", tmpdir,
		  tmpdir, name, list);
}

static const struct rec *find_xattr_rec(const struct rec *c, const char *name,
					uint32_t *idx)
{
	uint32_t i;

	for (i = 0; i < c->nx && i < MAX_XATTRS; i++)
		if (!strcmp(c->xname[i], name)) {
			*idx = i;
			return c;
		}
	return NULL;
}

static void check_entry(const struct rec *c, const struct tspec *t,
			unsigned int fmt)
{
	char want[1024];
	uint32_t i;

	snprintf(want, sizeof(want), "%s%s", t->path,
		 t->type == TAR_DIR ? "/" : "");
	CHECK(rec_is(c, t->type, want));
	CHECK_EQ(c->mode, t->mode);
	CHECK_EQ(c->uid, t->uid);
	CHECK_EQ(c->gid, t->gid);
	CHECK_EQ(c->mtime, t->mtime);
	CHECK_EQ(c->nsec, fmt == F_PAX ? t->nsec : 0);
	if (t->type == TAR_REG) {
		CHECK_EQ(c->size, t->data_len);
		CHECK_EQ(c->data_len, t->data_len);
		CHECK(c->data_hash == fnv(FNV_INIT, t->data, t->data_len));
	} else {
		CHECK_EQ(c->size, 0);
		CHECK_EQ(c->data_len, 0);
	}
	CHECK_EQ(c->has_link, t->link != NULL);
	if (t->link)
		CHECK(!strcmp(c->link, t->link));
	CHECK_EQ(c->major, t->major);
	CHECK_EQ(c->minor, t->minor);
	if (t->xattrs && fmt == F_PAX) {
		CHECK_EQ(c->nx, 2);
		CHECK(find_xattr_rec(c, "user.a", &i) && c->xlen[i] == 4 &&
		      !memcmp(c->xval[i], "v\0al", 4));
		CHECK(find_xattr_rec(c, "user.empty", &i) && c->xlen[i] == 0);
	} else {
		CHECK_EQ(c->nx, 0);
	}
}

static void check_format(unsigned int fmt)
{
	struct result *small, *large;
	char p[256];
	int i, n = 0;

	CHECK(!make_tar(fmt, format_names[fmt]));
	tpath(p, sizeof(p), "%s.tar", format_names[fmt]);
	small = read_file(p, 1000);
	large = read_file(p, 1 << 20);
	CHECK_EQ(small->ret, 0);
	for (i = 0; i < tree_n; i++) {
		if (!(tree[i].fmts & fmt))
			continue;
		if (n >= small->n) {
			CHECK(!"missing entries");
			break;
		}
		check_entry(&small->e[n++], &tree[i], fmt);
	}
	CHECK_EQ(small->n, n);
	/* Buffered and direct reads see the same archive. */
	CHECK(!memcmp(small, large, sizeof(*small)));
	free(small);
	free(large);
}

static void test_gnu_tar_gnu(void)
{
	check_format(F_GNU);
}

static void test_gnu_tar_pax(void)
{
	check_format(F_PAX);
}

static void test_gnu_tar_ustar(void)
{
	check_format(F_USTAR);
}

static void test_gnu_tar_v7(void)
{
	check_format(F_V7);
}

/* Real GNU tar headers for an 8 GiB + 1000 byte file (base-256 / PAX size). */
static void check_big_header(const char *fmt, size_t hdr_len)
{
	static const uint64_t size = (8ull << 30) + 1000;
	static const uint8_t zeros[1024 + 24];
	uint8_t hdr[4096];
	char p[256], cmd[2048];
	struct result *res;
	struct seg segs[3];
	FILE *f;
	size_t got;
	int i;

	tpath(p, sizeof(p), "bigsrc");
	snprintf(cmd, sizeof(cmd),
		 "rm -rf %s && mkdir %s && truncate -s %llu %s/big && "
		 "tar --format=%s -C %s -cf - big | head -c %zu",
		 p, p, (unsigned long long)size, p, fmt, p, hdr_len);
	f = popen(cmd, "r");
	CHECK(f != NULL);
	if (!f)
		return;
	got = fread(hdr, 1, hdr_len, f);
	pclose(f);
	CHECK_EQ(got, hdr_len);
	segs[0] = (struct seg){ hdr, hdr_len };
	segs[1] = (struct seg){ NULL, size };
	/* the padding (24 bytes) and the trailer */
	segs[2] = (struct seg){ zeros, sizeof(zeros) };
	for (i = 0; i < 2; i++) {
		res = read_segs(segs, 3, 1 << 20, 1 << 20, i ? UINT64_MAX : 1);
		CHECK_EQ(res->ret, 0);
		CHECK_EQ(res->n, 1);
		CHECK(rec_is(&res->e[0], TAR_REG, "big"));
		CHECK(res->e[0].size == size);
		/* i == 0: one read, the rest skipped by tar_next */
		CHECK(res->e[0].data_len == (i ? size : 1 << 20));
		CHECK(res->offset == hdr_len + size + 24 + 512);
		free(res);
	}
}

static void test_big_file_sizes(void)
{
	check_big_header("gnu", 512);
	check_big_header("posix", 1536);
}

/* ---- crafted archives ---- */

static void test_ustar_fields(void)
{
	struct ab a = { 0 };
	struct hs s = { .name = "name", .type = '0', .size = 5, .mode = 0104755,
			.uid = 1234, .gid = 5678, .mtime = 1234567890,
			.prefix = "some/prefix" };
	struct result *res;
	size_t at;

	ab_entry(&a, &s, "12345");
	/* Octal with leading spaces and a trailing space; empty = 0. */
	s = (struct hs){ .name = "spaced", .type = '0' };
	at = ab_entry(&a, &s, NULL);
	memcpy(a.p + at + 100, "  755 \0", 8);
	memset(a.p + at + 108, 0, 8);
	memcpy(a.p + at + 116, "     7 ", 8);
	set_checksum(a.p + at);
	ab_end(&a);
	res = read_buf(a.p, a.len, SIZE_MAX);
	CHECK_EQ(res->ret, 0);
	CHECK_EQ(res->n, 2);
	CHECK(rec_is(&res->e[0], TAR_REG, "some/prefix/name"));
	CHECK_EQ(res->e[0].mode, 04755);
	CHECK_EQ(res->e[0].uid, 1234);
	CHECK_EQ(res->e[0].gid, 5678);
	CHECK_EQ(res->e[0].mtime, 1234567890);
	CHECK_EQ(res->e[0].nsec, 0);
	CHECK(head_is(&res->e[0], "12345"));
	CHECK(!res->e[0].has_link);
	CHECK_EQ(res->e[0].nx, 0);
	CHECK_EQ(res->e[1].mode, 0755);
	CHECK_EQ(res->e[1].uid, 0);
	CHECK_EQ(res->e[1].gid, 7);
	/* Consumed: 3 blocks of entries and the first trailer block. */
	CHECK_EQ(res->offset, 4 * 512);
	free(res);
	free(a.p);
}

static void test_gnu_magic_has_no_prefix(void)
{
	struct ab a = { 0 };
	/* GNU keeps atime/ctime where ustar has the prefix. */
	struct hs s = { .name = "file", .type = '0', .fmt = GNU,
			.prefix = "14515044123\00014515044123" };
	struct result *res;

	ab_entry(&a, &s, NULL);
	ab_end(&a);
	res = read_buf(a.p, a.len, SIZE_MAX);
	CHECK_EQ(res->ret, 0);
	CHECK_EQ(res->n, 1);
	CHECK(rec_is(&res->e[0], TAR_REG, "file"));
	free(res);
	free(a.p);
}

static void test_v7_and_old_types(void)
{
	struct ab a = { 0 };
	struct result *res;
	struct hs s[] = {
		{ .name = "olddir/", .type = '\0', .fmt = V7 },
		{ .name = "oldfile", .type = '\0', .fmt = V7, .size = 3 },
		{ .name = "contig", .type = '7', .size = 2 },
		{ .name = "dev", .type = '3', .fmt = V7 }, /* no device fields */
	};
	size_t i;

	for (i = 0; i < ARRAY_SIZE(s); i++)
		ab_entry(&a, &s[i], "abc");
	ab_end(&a);
	res = read_buf(a.p, a.len, SIZE_MAX);
	CHECK_EQ(res->ret, 0);
	CHECK_EQ(res->n, 4);
	CHECK(rec_is(&res->e[0], TAR_DIR, "olddir/"));
	CHECK(rec_is(&res->e[1], TAR_REG, "oldfile"));
	CHECK(head_is(&res->e[1], "abc"));
	CHECK(rec_is(&res->e[2], TAR_REG, "contig"));
	CHECK(head_is(&res->e[2], "ab"));
	CHECK(rec_is(&res->e[3], TAR_CHR, "dev"));
	CHECK_EQ(res->e[3].major, 0);
	free(res);
	free(a.p);
}

static void test_base256(void)
{
	struct ab a = { 0 };
	struct hs s = { .name = "f", .type = '0', .fmt = GNU, .uid = 3000000,
			.gid = 4294967295ll, .mtime = -1, .size = 1 };
	struct hs dev = { .name = "c", .type = '3', .fmt = GNU,
			  .major = 4000000000u, .minor = 2097152 };
	struct result *res;

	ab_entry(&a, &s, "x");
	s.mtime = -(1ll << 40) - 12345;
	s.name = "g";
	ab_entry(&a, &s, "y");
	ab_entry(&a, &dev, NULL);
	ab_end(&a);
	CHECK_EQ(a.p[108], 0x80); /* really base-256 */
	res = read_buf(a.p, a.len, SIZE_MAX);
	CHECK_EQ(res->ret, 0);
	CHECK_EQ(res->n, 3);
	CHECK_EQ(res->e[0].uid, 3000000);
	CHECK_EQ(res->e[0].gid, 4294967295u);
	CHECK_EQ(res->e[0].mtime, -1);
	CHECK_EQ(res->e[1].mtime, -(1ll << 40) - 12345);
	CHECK(head_is(&res->e[1], "y"));
	CHECK_EQ(res->e[2].major, 4000000000u);
	CHECK_EQ(res->e[2].minor, 2097152);
	free(res);
	free(a.p);
}

/* One entry whose header bytes [off, off+n) are replaced (checksum redone). */
static int read_patched(const struct hs *s, size_t off, const void *bytes,
			size_t n, bool fix_checksum)
{
	struct ab a = { 0 };
	struct result *res;
	int ret;

	ab_entry(&a, s, NULL);
	memcpy(a.p + off, bytes, n);
	if (fix_checksum)
		set_checksum(a.p);
	ab_end(&a);
	res = read_buf(a.p, a.len, SIZE_MAX);
	ret = res->ret;
	free(res);
	free(a.p);
	return ret;
}

static void test_bad_numbers(void)
{
	struct hs s = { .name = "f", .type = '0', .fmt = GNU };
	static const uint8_t too_big[12] = { 0x80, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1 };
	static const uint8_t neg_size[12] = { 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
					      0xff, 0xff, 0xff, 0xff, 0xff, 0xfe };
	static const uint8_t big_uid[8] = { 0x80, 0, 0, 1, 0, 0, 0, 0 };

	CHECK_EQ(read_patched(&s, 124, "00000000009", 11, true), -EFSCORRUPTED);
	CHECK_EQ(read_patched(&s, 100, "0012a45", 7, true), -EFSCORRUPTED);
	CHECK_EQ(read_patched(&s, 100, "00 1245", 7, true), -EFSCORRUPTED);
	CHECK_EQ(read_patched(&s, 124, too_big, 12, true), -EFSCORRUPTED);
	CHECK_EQ(read_patched(&s, 124, neg_size, 12, true), -EFSCORRUPTED);
	CHECK_EQ(read_patched(&s, 108, big_uid, 8, true), -EFSCORRUPTED);
	/* a 12-digit octal mtime is fine */
	CHECK_EQ(read_patched(&s, 136, "777777777777", 12, true), 0);
}

static void test_checksum(void)
{
	struct hs s = { .name = "f", .type = '0' };
	struct ab a = { 0 };
	struct result *res;
	unsigned int i;
	int sum = 0;
	char tmp[8];

	CHECK_EQ(read_patched(&s, 0, "g", 1, false), -EFSCORRUPTED);
	CHECK_EQ(read_patched(&s, 148, "0000009", 7, false), -EFSCORRUPTED);
	CHECK_EQ(read_patched(&s, 148, "       ", 7, false), -EFSCORRUPTED);

	/* Old tars summed signed chars: accepted. */
	s.name = "\xe9t\xe9";
	ab_entry(&a, &s, NULL);
	memset(a.p + 148, ' ', 8);
	for (i = 0; i < 512; i++)
		sum += (int8_t)a.p[i];
	snprintf(tmp, sizeof(tmp), "%06o", sum);
	memcpy(a.p + 148, tmp, 7);
	ab_end(&a);
	res = read_buf(a.p, a.len, SIZE_MAX);
	CHECK_EQ(res->ret, 0);
	CHECK(res->n == 1 && rec_is(&res->e[0], TAR_REG, "\xe9t\xe9"));
	free(res);
	free(a.p);
}

static void test_truncations(void)
{
	static const size_t cuts[] = { 1024 + 512 + 41, 1812, 2048 };
	struct ab a = { 0 };
	struct result *res;
	size_t i;

	ab_file(&a, "one", "first file");
	ab_file(&a, "two", "second file, a bit longer than the first");
	ab_end(&a);

	/* Inside the second header. */
	res = read_buf(a.p, 1024 + 300, SIZE_MAX);
	CHECK_EQ(res->ret, -EFSCORRUPTED);
	CHECK_EQ(res->n, 1);
	free(res);
	/* Inside the first header. */
	res = read_buf(a.p, 100, SIZE_MAX);
	CHECK_EQ(res->ret, -EFSCORRUPTED);
	CHECK_EQ(res->n, 0);
	free(res);
	/* Inside the data, read or skipped. */
	res = read_buf(a.p, 1024 + 512 + 10, SIZE_MAX);
	CHECK_EQ(res->ret, -EFSCORRUPTED);
	CHECK_EQ(res->n, 2);
	CHECK_EQ(res->e[1].data_len, 10);
	free(res);
	{
		struct seg sg = { a.p, 1024 + 512 + 10 };

		res = read_segs(&sg, 1, SIZE_MAX, 4096, 0);
		CHECK_EQ(res->ret, -EFSCORRUPTED);
		CHECK_EQ(res->n, 2);
		free(res);
	}
	/* Clean ends: right after the data, in the padding, at a header. */
	for (i = 0; i < ARRAY_SIZE(cuts); i++) {
		res = read_buf(a.p, cuts[i], SIZE_MAX);
		CHECK_EQ(res->ret, 0);
		CHECK_EQ(res->n, 2);
		CHECK(head_is(&res->e[1], "second file, a bit longer than the first"));
		free(res);
	}
	/* A single zero block, then the end of input. */
	res = read_buf(a.p, 2048 + 512, SIZE_MAX);
	CHECK_EQ(res->ret, 0);
	CHECK_EQ(res->n, 2);
	free(res);
	/* ...or a partial second zero block. */
	res = read_buf(a.p, 2048 + 700, SIZE_MAX);
	CHECK_EQ(res->ret, -EFSCORRUPTED);
	free(res);
	free(a.p);
}

static void test_zero_blocks(void)
{
	struct ab a = { 0 };
	struct result *res;

	ab_file(&a, "one", "1");
	ab_put(&a, NULL, 512);
	ab_file(&a, "hidden", "2");
	ab_end(&a);
	/* A lone zero block followed by a header. */
	res = read_buf(a.p, a.len, SIZE_MAX);
	CHECK_EQ(res->ret, -EFSCORRUPTED);
	CHECK_EQ(res->n, 1);
	free(res);
	/* Two zero blocks end the archive, whatever follows. */
	a.len = 1024;
	ab_end(&a);
	ab_put(&a, "garbage", 7);
	res = read_buf(a.p, a.len, SIZE_MAX);
	CHECK_EQ(res->ret, 0);
	CHECK_EQ(res->n, 1);
	free(res);
	/* An empty input is an empty archive. */
	res = read_buf(a.p, 0, SIZE_MAX);
	CHECK_EQ(res->ret, 0);
	CHECK_EQ(res->n, 0);
	free(res);
	free(a.p);
}

static void test_pax_per_file(void)
{
	struct ab a = { 0 }, recs = { 0 };
	struct hs s = { .name = "short", .type = '0', .size = 0, .uid = 1,
			.mtime = 99 };
	struct hs dev = { .name = "dev", .type = '4', .major = 1, .minor = 2 };
	struct hs lnk = { .name = "l", .type = '2', .link = "short-target" };
	char longp[400];
	struct result *res;

	memset(longp, 'p', sizeof(longp) - 1);
	longp[sizeof(longp) - 1] = '\0';
	pax_str(&recs, "path", longp);
	pax_str(&recs, "uid", "4294967295");
	pax_str(&recs, "gid", "0");
	pax_str(&recs, "mtime", "1700000000.5");
	pax_str(&recs, "size", "6");
	pax_str(&recs, "uname", "ignored");
	pax_str(&recs, "atime", "not even a number");
	pax_str(&recs, "some.vendor.key", "x");
	pax_rec(&recs, "SCHILY.xattr.user.bin", "a\0b\nc=", 6);
	pax_str(&recs, "SCHILY.xattr.security.capability", "");
	ab_pax(&a, 'x', &recs);
	ab_entry(&a, &s, NULL);
	/* The header said 0 bytes, PAX says 6: the data follows. */
	ab_put(&a, "sixsix", 6);
	ab_pad(&a);

	recs.len = 0;
	pax_str(&recs, "SCHILY.devmajor", "300");
	pax_str(&recs, "SCHILY.devminor", "70000");
	pax_str(&recs, "mtime", "-1.25");
	ab_pax(&a, 'x', &recs);
	ab_entry(&a, &dev, NULL);

	recs.len = 0;
	pax_str(&recs, "linkpath", longp);
	ab_pax(&a, 'x', &recs);
	ab_entry(&a, &lnk, NULL);
	/* PAX values apply to one entry only. */
	ab_entry(&a, &s, NULL);
	ab_end(&a);

	res = read_buf(a.p, a.len, SIZE_MAX);
	CHECK_EQ(res->ret, 0);
	CHECK_EQ(res->n, 4);
	CHECK(rec_is(&res->e[0], TAR_REG, longp));
	CHECK_EQ(res->e[0].uid, 4294967295u);
	CHECK_EQ(res->e[0].gid, 0);
	CHECK_EQ(res->e[0].mtime, 1700000000);
	CHECK_EQ(res->e[0].nsec, 500000000);
	CHECK(head_is(&res->e[0], "sixsix"));
	CHECK_EQ(res->e[0].nx, 2);
	CHECK(!strcmp(res->e[0].xname[0], "user.bin"));
	CHECK_EQ(res->e[0].xlen[0], 6);
	CHECK(!memcmp(res->e[0].xval[0], "a\0b\nc=", 6));
	CHECK(!strcmp(res->e[0].xname[1], "security.capability"));
	CHECK_EQ(res->e[0].xlen[1], 0);

	CHECK(rec_is(&res->e[1], TAR_BLK, "dev"));
	CHECK_EQ(res->e[1].major, 300);
	CHECK_EQ(res->e[1].minor, 70000);
	CHECK_EQ(res->e[1].mtime, -2);
	CHECK_EQ(res->e[1].nsec, 750000000);

	CHECK(rec_is(&res->e[2], TAR_SYMLINK, "l"));
	CHECK(!strcmp(res->e[2].link, longp));

	CHECK(rec_is(&res->e[3], TAR_REG, "short"));
	CHECK_EQ(res->e[3].uid, 1);
	CHECK_EQ(res->e[3].mtime, 99);
	CHECK_EQ(res->e[3].nsec, 0);
	CHECK_EQ(res->e[3].nx, 0);
	CHECK_EQ(res->e[3].size, 0);
	free(res);
	free(a.p);
	free(recs.p);
}

/* Archive: one 'x' header with @recs then a file; returns tar_next's result. */
static int pax_result(const struct ab *recs, struct rec *out)
{
	struct ab a = { 0 };
	struct hs s = { .name = "f", .type = '0' };
	struct result *res;
	int ret;

	ab_pax(&a, 'x', recs);
	ab_entry(&a, &s, NULL);
	ab_end(&a);
	res = read_buf(a.p, a.len, SIZE_MAX);
	ret = res->ret;
	if (out && res->n == 1)
		*out = res->e[0];
	free(res);
	free(a.p);
	return ret;
}

static int pax_one(const char *key, const char *val, struct rec *out)
{
	struct ab recs = { 0 };
	int ret;

	pax_str(&recs, key, val);
	ret = pax_result(&recs, out);
	free(recs.p);
	return ret;
}

static int pax_raw(const char *raw, size_t len)
{
	struct ab recs = { 0 };
	int ret;

	ab_put(&recs, raw, len);
	ret = pax_result(&recs, NULL);
	free(recs.p);
	return ret;
}

static void test_pax_mtime(void)
{
	static const struct {
		const char *v;
		int64_t sec;
		uint32_t nsec;
	} good[] = {
		{ "0", 0, 0 },
		{ "12.", 12, 0 },
		{ "1.000000001", 1, 1 },
		{ "1.1234567891", 1, 123456789 },
		{ "-3", -3, 0 },
		{ "-1.5", -2, 500000000 },
		{ "-0.000000001", -1, 999999999 },
		{ "9223372036854775807.999999999", INT64_MAX, 999999999 },
		{ "-9223372036854775808", INT64_MIN, 0 },
	};
	static const char *const bad[] = {
		"1.2x", "-", "x", ".5", "+1", "1 ", "9223372036854775808",
		"-9223372036854775808.5", "-9223372036854775809",
		"99999999999999999999999",
	};
	struct rec c;
	size_t i;

	for (i = 0; i < ARRAY_SIZE(good); i++) {
		memset(&c, 0, sizeof(c));
		CHECK_EQ(pax_one("mtime", good[i].v, &c), 0);
		CHECK_EQ(c.mtime, good[i].sec);
		CHECK_EQ(c.nsec, good[i].nsec);
	}
	for (i = 0; i < ARRAY_SIZE(bad); i++)
		CHECK_EQ(pax_one("mtime", bad[i], NULL), -EFSCORRUPTED);
}

#define RAW(s) s, sizeof(s) - 1

static void test_pax_bad_records(void)
{
	static const struct {
		const char *s;
		size_t len;
	} bad[] = {
		{ RAW("13 path=abc\n") },   /* LEN one too big: past the data */
		{ RAW("11 path=abc\n") },   /* LEN one too small: no '\n' at its end */
		{ RAW("12 path=abc\n3") },  /* a partial record */
		{ RAW("1x path=abc\n") },   /* LEN not decimal */
		{ RAW(" 12 path=ab\n") },   /* no LEN */
		{ RAW("12path=abcd\n") },   /* no space */
		{ RAW("12 pathxabc\n") },   /* no '=' */
		{ RAW("7 =abc\n") },        /* empty key */
		{ RAW("4 a\n") },           /* too short for a record */
		{ RAW("99999999999999999999999 a=b\n") }, /* LEN overflow */
		{ RAW("12 path=abc\n\0\0\0") }, /* NULs after the records */
		{ RAW("9 k\0y=vv\n") },     /* NUL in a key */
		{ RAW("11 path=a\0\n") },   /* NUL in a path */
		{ RAW("14 linkpath=\0\n") }, /* NUL in a link target */
	};
	size_t i;

	for (i = 0; i < ARRAY_SIZE(bad); i++)
		CHECK_EQ(pax_raw(bad[i].s, bad[i].len), -EFSCORRUPTED);
	CHECK_EQ(pax_raw(RAW("12 path=abc\n")), 0);
	CHECK_EQ(pax_raw(RAW("012 path=ab\n")), 0);
	CHECK_EQ(pax_one("uid", "4294967296", NULL), -EFSCORRUPTED);
	CHECK_EQ(pax_one("gid", "-1", NULL), -EFSCORRUPTED);
	CHECK_EQ(pax_one("size", "12a", NULL), -EFSCORRUPTED);
	CHECK_EQ(pax_one("size", "9223372036854775808", NULL), -EFSCORRUPTED);
	CHECK_EQ(pax_one("SCHILY.devmajor", "0x10", NULL), -EFSCORRUPTED);
}

static void test_pax_global(void)
{
	struct ab a = { 0 }, recs = { 0 };
	struct hs s = { .name = "f1", .type = '0', .uid = 42, .gid = 43,
			.mtime = 1000 };
	struct result *res;

	pax_str(&recs, "uid", "5");
	pax_str(&recs, "gid", "6");
	pax_str(&recs, "mtime", "100.25");
	pax_str(&recs, "path", "not-for-everyone");
	pax_str(&recs, "size", "1000");
	pax_str(&recs, "SCHILY.xattr.user.g", "gv");
	pax_str(&recs, "SCHILY.xattr.user.h", "hv");
	pax_str(&recs, "comment", "git archive writes one of these");
	ab_pax(&a, 'g', &recs);
	ab_entry(&a, &s, NULL); /* f1: all global defaults */

	recs.len = 0;
	pax_str(&recs, "uid", "7");
	pax_str(&recs, "SCHILY.xattr.user.g", "over");
	ab_pax(&a, 'x', &recs);
	s.name = "f2";
	ab_entry(&a, &s, NULL); /* f2: per-file wins */

	recs.len = 0;
	pax_str(&recs, "uid", "");
	pax_str(&recs, "mtime", "");
	ab_pax(&a, 'x', &recs);
	s.name = "f3";
	ab_entry(&a, &s, NULL); /* f3: empty per-file values: header fields */

	recs.len = 0;
	pax_str(&recs, "gid", "9");
	pax_str(&recs, "uid", "");
	ab_pax(&a, 'g', &recs);
	s.name = "f4";
	ab_entry(&a, &s, NULL); /* f4: second global header merged */
	ab_end(&a);

	res = read_buf(a.p, a.len, SIZE_MAX);
	CHECK_EQ(res->ret, 0);
	CHECK_EQ(res->n, 4);
	CHECK(rec_is(&res->e[0], TAR_REG, "f1"));
	CHECK_EQ(res->e[0].uid, 5);
	CHECK_EQ(res->e[0].gid, 6);
	CHECK_EQ(res->e[0].mtime, 100);
	CHECK_EQ(res->e[0].nsec, 250000000);
	CHECK_EQ(res->e[0].size, 0);
	CHECK_EQ(res->e[0].nx, 2);
	CHECK(!strcmp(res->e[0].xname[0], "user.g") && res->e[0].xlen[0] == 2 &&
	      !memcmp(res->e[0].xval[0], "gv", 2));
	CHECK(!strcmp(res->e[0].xname[1], "user.h"));

	CHECK(rec_is(&res->e[1], TAR_REG, "f2"));
	CHECK_EQ(res->e[1].uid, 7);
	CHECK_EQ(res->e[1].gid, 6);
	CHECK_EQ(res->e[1].nx, 2);
	CHECK(!strcmp(res->e[1].xname[0], "user.h"));
	CHECK(!strcmp(res->e[1].xname[1], "user.g") && res->e[1].xlen[1] == 4 &&
	      !memcmp(res->e[1].xval[1], "over", 4));

	CHECK(rec_is(&res->e[2], TAR_REG, "f3"));
	CHECK_EQ(res->e[2].uid, 42);
	CHECK_EQ(res->e[2].gid, 6);
	CHECK_EQ(res->e[2].mtime, 1000);
	CHECK_EQ(res->e[2].nsec, 0);

	CHECK(rec_is(&res->e[3], TAR_REG, "f4"));
	CHECK_EQ(res->e[3].uid, 42);
	CHECK_EQ(res->e[3].gid, 9);
	CHECK_EQ(res->e[3].mtime, 100);
	CHECK_EQ(res->e[3].nx, 2);
	free(res);
	free(a.p);
	free(recs.p);
}

static void test_libarchive_xattrs(void)
{
	static const struct {
		const char *key, *val;
		const char *name;
		const char *value;
		uint32_t len;
	} good[] = {
		{ "LIBARCHIVE.xattr.user.a%3Db", "dmFsdWU", "user.a=b", "value", 5 },
		{ "LIBARCHIVE.xattr.user.p1", "YQ==", "user.p1", "a", 1 },
		{ "LIBARCHIVE.xattr.user.p2", "YWI=", "user.p2", "ab", 2 },
		{ "LIBARCHIVE.xattr.user.u2", "YWI", "user.u2", "ab", 2 },
		{ "LIBARCHIVE.xattr.user.n", "AAEC/w", "user.n", "\0\1\2\377", 4 },
		{ "LIBARCHIVE.xattr.user.e", "", "user.e", "", 0 },
		{ "LIBARCHIVE.xattr.%75ser.x", "YWJj", "user.x", "abc", 3 },
	};
	static const char *const bad_val[] = { "Y", "YQ=x", "Y===", "YQ=", "Y Q=",
					       "YQ==YQ==", "Y-Q=", "=" };
	static const char *const bad_key[] = { "LIBARCHIVE.xattr.a%G1",
					       "LIBARCHIVE.xattr.a%0",
					       "LIBARCHIVE.xattr.a%00b",
					       "LIBARCHIVE.xattr.%" };
	struct rec c;
	size_t i;

	for (i = 0; i < ARRAY_SIZE(good); i++) {
		memset(&c, 0, sizeof(c));
		CHECK_EQ(pax_one(good[i].key, good[i].val, &c), 0);
		CHECK_EQ(c.nx, 1);
		CHECK(!strcmp(c.xname[0], good[i].name));
		CHECK_EQ(c.xlen[0], good[i].len);
		CHECK(!memcmp(c.xval[0], good[i].value, good[i].len));
	}
	for (i = 0; i < ARRAY_SIZE(bad_val); i++)
		CHECK_EQ(pax_one("LIBARCHIVE.xattr.user.a", bad_val[i], NULL),
			 -EFSCORRUPTED);
	for (i = 0; i < ARRAY_SIZE(bad_key); i++)
		CHECK_EQ(pax_one(bad_key[i], "YQ", NULL), -EFSCORRUPTED);
}

static void test_xattr_limits(void)
{
	struct ab recs = { 0 };
	struct rec c;
	char key[64];
	int i;

	/* The same name twice: the last value wins. */
	pax_str(&recs, "SCHILY.xattr.user.d", "1");
	pax_str(&recs, "SCHILY.xattr.user.d", "22");
	memset(&c, 0, sizeof(c));
	CHECK_EQ(pax_result(&recs, &c), 0);
	CHECK_EQ(c.nx, 1);
	CHECK(c.xlen[0] == 2 && !memcmp(c.xval[0], "22", 2));
	recs.len = 0;
	for (i = 0; i < 1025; i++) {
		snprintf(key, sizeof(key), "SCHILY.xattr.user.%d", i);
		pax_str(&recs, key, "v");
	}
	CHECK_EQ(pax_result(&recs, NULL), -EFSCORRUPTED);
	free(recs.p);
}

static void test_gnu_long_names(void)
{
	struct ab a = { 0 };
	char name[600], target[300];
	struct hs L = { .name = "././@LongLink", .type = 'L', .fmt = GNU };
	struct hs K = { .name = "././@LongLink", .type = 'K', .fmt = GNU };
	struct hs s = { .name = "truncated-name", .type = '1', .fmt = GNU,
			.link = "truncated-link" };
	struct result *res;

	memset(name, 'n', sizeof(name));
	name[sizeof(name) - 1] = '\0';
	memset(target, 't', sizeof(target));
	target[sizeof(target) - 1] = '\0';
	L.size = (int64_t)sizeof(name); /* with its NUL, as GNU tar writes */
	ab_entry(&a, &L, name);
	K.size = (int64_t)sizeof(target) - 1; /* without a NUL */
	ab_entry(&a, &K, target);
	ab_entry(&a, &s, NULL);
	s = (struct hs){ .name = "plain", .type = '0', .fmt = GNU };
	ab_entry(&a, &s, NULL);
	ab_end(&a);
	res = read_buf(a.p, a.len, SIZE_MAX);
	CHECK_EQ(res->ret, 0);
	CHECK_EQ(res->n, 2);
	CHECK(rec_is(&res->e[0], TAR_HARDLINK, name));
	CHECK(!strcmp(res->e[0].link, target));
	CHECK(rec_is(&res->e[1], TAR_REG, "plain"));
	free(res);
	free(a.p);
}

static int one_header_result(const struct hs *s, const void *data)
{
	struct ab a = { 0 };
	struct result *res;
	int ret;

	ab_entry(&a, s, data);
	ab_file(&a, "after", "x");
	ab_end(&a);
	res = read_buf(a.p, a.len, SIZE_MAX);
	ret = res->ret;
	free(res);
	free(a.p);
	return ret;
}

static void test_unsupported(void)
{
	struct hs sparse = { .name = "sparse", .type = 'S', .fmt = GNU };
	struct hs multi = { .name = "cont", .type = 'M', .fmt = GNU, .size = 1 };
	struct ab a = { 0 }, recs = { 0 };
	struct hs s = { .name = "GNUSparseFile.0/f", .type = '0' };
	struct result *res;

	CHECK_EQ(one_header_result(&sparse, NULL), -ENOTSUP);
	CHECK_EQ(one_header_result(&multi, "x"), -ENOTSUP);

	pax_str(&recs, "GNU.sparse.major", "1");
	pax_str(&recs, "GNU.sparse.name", "f");
	ab_pax(&a, 'x', &recs);
	ab_entry(&a, &s, NULL);
	ab_end(&a);
	res = read_buf(a.p, a.len, SIZE_MAX);
	CHECK_EQ(res->ret, -ENOTSUP);
	CHECK_EQ(res->n, 0);
	free(res);

	a.len = 0;
	ab_pax(&a, 'g', &recs);
	ab_end(&a);
	res = read_buf(a.p, a.len, SIZE_MAX);
	CHECK_EQ(res->ret, -ENOTSUP);
	free(res);
	free(a.p);
	free(recs.p);
}

static void test_type_data_rules(void)
{
	struct ab a = { 0 };
	struct result *res;
	/* Types 1-6 carry no data whatever the size field says. */
	struct hs dir = { .name = "d/", .type = '5', .size = 512 };
	struct hs hard = { .name = "h", .type = '1', .size = 512, .link = "t" };
	struct hs chr = { .name = "c", .type = '3', .size = 100 };
	struct hs vol = { .name = "label", .type = 'V', .size = 5 };
	struct hs dump = { .name = "dd", .type = 'D', .fmt = GNU, .size = 700 };
	struct hs unk = { .name = "u", .type = 'Z', .size = 3 };
	uint8_t hdr[512];

	make_header(hdr, &dir);
	ab_put(&a, hdr, 512);
	make_header(hdr, &hard);
	ab_put(&a, hdr, 512);
	make_header(hdr, &chr);
	ab_put(&a, hdr, 512);
	ab_entry(&a, &vol, "VOLUM");
	ab_entry(&a, &dump, NULL);
	ab_entry(&a, &unk, "abc");
	ab_file(&a, "last", "z");
	ab_end(&a);
	res = read_buf(a.p, a.len, SIZE_MAX);
	CHECK_EQ(res->ret, 0);
	CHECK_EQ(res->n, 6);
	CHECK(rec_is(&res->e[0], TAR_DIR, "d/"));
	CHECK_EQ(res->e[0].size, 0);
	CHECK(rec_is(&res->e[1], TAR_HARDLINK, "h"));
	CHECK(!strcmp(res->e[1].link, "t"));
	CHECK(rec_is(&res->e[2], TAR_CHR, "c"));
	CHECK(rec_is(&res->e[3], TAR_DIR, "dd"));
	CHECK_EQ(res->e[3].size, 0);
	CHECK(rec_is(&res->e[4], TAR_REG, "u"));
	CHECK(head_is(&res->e[4], "abc"));
	CHECK(rec_is(&res->e[5], TAR_REG, "last"));
	free(res);
	free(a.p);
}

static void test_bad_entries(void)
{
	struct hs noname = { .name = "", .type = '0' };
	struct hs nolink = { .name = "s", .type = '2' };
	struct hs nohard = { .name = "h", .type = '1' };
	struct hs bigx = { .name = "x", .type = 'x', .size = (1 << 20) + 1 };
	struct hs bigL = { .name = "L", .type = 'L', .fmt = GNU, .size = 2 << 20 };
	struct ab a = { 0 }, recs = { 0 };
	struct result *res;

	CHECK_EQ(one_header_result(&noname, NULL), -EFSCORRUPTED);
	CHECK_EQ(one_header_result(&nolink, NULL), -EFSCORRUPTED);
	CHECK_EQ(one_header_result(&nohard, NULL), -EFSCORRUPTED);
	CHECK_EQ(one_header_result(&bigx, NULL), -EFSCORRUPTED);
	CHECK_EQ(one_header_result(&bigL, NULL), -EFSCORRUPTED);

	/* An extension header with no entry after it. */
	pax_str(&recs, "path", "p");
	ab_pax(&a, 'x', &recs);
	res = read_buf(a.p, a.len, SIZE_MAX);
	CHECK_EQ(res->ret, -EFSCORRUPTED);
	free(res);
	ab_end(&a);
	res = read_buf(a.p, a.len, SIZE_MAX);
	CHECK_EQ(res->ret, -EFSCORRUPTED);
	free(res);
	/* ...or cut inside its data. */
	res = read_buf(a.p, 600, SIZE_MAX);
	CHECK_EQ(res->ret, -EFSCORRUPTED);
	free(res);
	free(a.p);
	free(recs.p);
}

static void test_skip_and_offsets(void)
{
	struct ab a = { 0 };
	struct tar_reader *r;
	struct tar_entry *e;
	struct seg sg;
	struct vsrc v;
	char buf[3];
	static char data[2000];

	memset(data, 'd', sizeof(data) - 1);
	ab_file(&a, "a", data);
	ab_file(&a, "b", "bb");
	ab_end(&a);
	sg = (struct seg){ a.p, a.len };
	v = (struct vsrc){ &sg, 1, 0, 0, 100 };
	CHECK_EQ(tar_reader_new((struct byte_source){ .read = vsrc_read, .ctx = &v }, &r), 0);
	CHECK_EQ(tar_next(r, &e), 1);
	CHECK(!strcmp(e->path, "a"));
	CHECK_EQ(tar_offset(r), 512);
	CHECK_EQ(tar_read_data(r, buf, 3), 3);
	CHECK_EQ(tar_offset(r), 515);
	CHECK_EQ(tar_next(r, &e), 1); /* the rest of "a" is skipped */
	CHECK(!strcmp(e->path, "b"));
	CHECK_EQ(tar_offset(r), 512 + 2048 + 512);
	CHECK_EQ(tar_read_data(r, buf, 0), 0);
	CHECK_EQ(tar_read_data(r, buf, 3), 2);
	CHECK(!memcmp(buf, "bb", 2));
	CHECK_EQ(tar_read_data(r, buf, 3), 0);
	CHECK_EQ(tar_next(r, &e), 0);
	CHECK_EQ(tar_next(r, &e), 0);
	tar_reader_free(r);

	/* Errors are sticky. */
	a.p[0] ^= 1;
	v = (struct vsrc){ &sg, 1, 0, 0, SIZE_MAX };
	CHECK_EQ(tar_reader_new((struct byte_source){ .read = vsrc_read, .ctx = &v }, &r), 0);
	CHECK_EQ(tar_next(r, &e), -EFSCORRUPTED);
	CHECK_EQ(tar_next(r, &e), -EFSCORRUPTED);
	CHECK_EQ(tar_read_data(r, buf, 3), -EFSCORRUPTED);
	tar_reader_free(r);
	free(a.p);
}

/*
 * A seekable source (byte_source.skip): the reader passes over data it
 * does not read instead of reading it, with the same entries and offsets,
 * and a skip that reaches the end of the input is a truncated archive.
 */
struct seek_src {
	const uint8_t *p;
	uint64_t len, pos, bytes_read;
};

static ssize_t seek_read(void *ctx, void *buf, size_t len)
{
	struct seek_src *s = ctx;
	size_t n = (size_t)MIN((uint64_t)MIN(len, (size_t)4096), s->len - s->pos);

	memcpy(buf, s->p + s->pos, n);
	s->pos += n;
	s->bytes_read += n;
	return (ssize_t)n;
}

static int64_t seek_skip(void *ctx, uint64_t len)
{
	struct seek_src *s = ctx;

	len = MIN(len, s->len - s->pos);
	s->pos += len;
	return (int64_t)len;
}

static void test_seekable_source(void)
{
	static char big[1 << 20];
	struct ab a = { 0 };
	struct tar_reader *r;
	struct tar_entry *e;
	struct seek_src src;
	char buf[2];

	memset(big, 'x', sizeof(big) - 1);
	ab_file(&a, "big", big);
	ab_file(&a, "small", "s");
	ab_file(&a, "big2", big);
	ab_end(&a);
	src = (struct seek_src){ a.p, a.len, 0, 0 };
	CHECK_EQ(tar_reader_new((struct byte_source){ seek_read, &src, seek_skip }, &r), 0);
	CHECK_EQ(tar_next(r, &e), 1);
	CHECK(!strcmp(e->path, "big"));
	CHECK_EQ(tar_offset(r), 512);
	CHECK_EQ(tar_next(r, &e), 1);
	CHECK(!strcmp(e->path, "small"));
	CHECK_EQ(tar_offset(r), 512 + sizeof(big) - 1 + 1 + 512);
	CHECK_EQ(tar_read_data(r, buf, 2), 1);
	CHECK_EQ(buf[0], 's');
	CHECK_EQ(tar_next(r, &e), 1);
	CHECK(!strcmp(e->path, "big2"));
	CHECK_EQ(tar_next(r, &e), 0);
	tar_reader_free(r);
	/* Two MiB of data passed over; the headers and what they share a
	 * buffer with read. */
	CHECK(src.bytes_read < 300 * 1024);

	/* A member whose data runs past the end of the input. */
	src = (struct seek_src){ a.p, 512 + 8192, 0, 0 };
	CHECK_EQ(tar_reader_new((struct byte_source){ seek_read, &src, seek_skip }, &r), 0);
	CHECK_EQ(tar_next(r, &e), 1);
	CHECK_EQ(tar_next(r, &e), -EFSCORRUPTED);
	tar_reader_free(r);
	free(a.p);
}

/* A source that fails with EIO after @left bytes. */
static ssize_t failing_read(void *ctx, void *buf, size_t len)
{
	size_t *left = ctx;

	if (!*left)
		return -EIO;
	len = MIN(len, *left);
	memset(buf, 0, len);
	*left -= len;
	return (ssize_t)len;
}

static void test_source_errors(void)
{
	struct tar_reader *r;
	struct tar_entry *e;
	size_t left = 100;

	CHECK_EQ(tar_reader_new((struct byte_source){ .read = failing_read, .ctx = &left }, &r), 0);
	CHECK_EQ(tar_next(r, &e), -EIO);
	tar_reader_free(r);
}

/* Any split of the input into reads gives the same result. */
static void test_short_reads(void)
{
	static const size_t caps[] = { 1, 7, 511, 513, 4096, 200000 };
	struct ab a = { 0 }, recs = { 0 };
	struct hs L = { .name = "././@LongLink", .type = 'L', .fmt = GNU };
	struct hs s = { .name = "x", .type = '0', .fmt = GNU, .size = 140000 };
	struct result *ref, *res;
	char name[300];
	size_t i;

	memset(name, 'n', sizeof(name));
	name[sizeof(name) - 1] = '\0';
	L.size = sizeof(name);
	ab_entry(&a, &L, name);
	ab_entry(&a, &s, big_data);
	pax_str(&recs, "SCHILY.xattr.user.k", "v");
	pax_str(&recs, "mtime", "5.5");
	ab_pax(&a, 'x', &recs);
	ab_file(&a, "y", "yy");
	ab_end(&a);
	ref = read_buf(a.p, a.len, SIZE_MAX);
	CHECK_EQ(ref->ret, 0);
	CHECK_EQ(ref->n, 2);
	CHECK(ref->e[0].data_hash == fnv(FNV_INIT, big_data, 140000));
	CHECK_EQ(ref->e[1].nsec, 500000000);
	for (i = 0; i < ARRAY_SIZE(caps); i++) {
		res = read_buf(a.p, a.len, caps[i]);
		CHECK(!memcmp(ref, res, sizeof(*res)));
		free(res);
	}
	free(ref);
	free(a.p);
	free(recs.p);
}

/* ---- decompressing input ---- */

/* Read the whole decompressed stream; returns 0 or the error. */
static int drain(const char *path, uint64_t *total, uint64_t *bytes_in)
{
	struct input_stream *in;
	static uint8_t buf[100003];
	ssize_t n;
	int ret = input_open(path, &in);

	*total = 0;
	if (ret)
		return ret;
	while ((n = input_source(in).read(in, buf, sizeof(buf))) > 0)
		*total += (uint64_t)n;
	*bytes_in = input_bytes_in(in);
	input_close(in);
	return (int)n;
}

static uint64_t file_size(const char *path)
{
	struct stat st;

	return stat(path, &st) ? 0 : (uint64_t)st.st_size;
}

static const struct {
	const char *cmd, *ext, *name;
} codecs[] = {
	{ "gzip -c", "gz", "gzip" },
	{ "zstd -q -c", "zst", "zstd" },
	{ "xz -c", "xz", "xz" },
};

static void test_compressed_inputs(void)
{
	char tarp[256], p[256];
	struct result *ref, *res;
	struct input_stream *in;
	uint64_t total, in_bytes, tar_size;
	size_t i;

	CHECK(!make_tar(F_PAX, "c"));
	tpath(tarp, sizeof(tarp), "c.tar");
	tar_size = file_size(tarp);
	ref = read_file(tarp, 65536);
	CHECK_EQ(ref->ret, 0);
	CHECK(ref->n > 10);
	CHECK(!input_open(tarp, &in) && !strcmp(input_format(in), "tar"));
	input_close(in);

	for (i = 0; i < ARRAY_SIZE(codecs); i++) {
		uint8_t *mem;
		size_t len;
		FILE *f;

		tpath(p, sizeof(p), "c.tar.%s", codecs[i].ext);
		CHECK(!test_run("%s %s > %s", codecs[i].cmd, tarp, p));
		CHECK(!input_open(p, &in));
		CHECK(!strcmp(input_format(in), codecs[i].name));
		input_close(in);
		res = read_file(p, 65536);
		CHECK(!memcmp(ref, res, sizeof(*res)));
		free(res);
		res = read_file(p, 1 << 20);
		CHECK_EQ(res->ret, 0);
		CHECK_EQ(res->n, ref->n);
		free(res);
		CHECK_EQ(drain(p, &total, &in_bytes), 0);
		CHECK_EQ(total, tar_size);
		CHECK_EQ(in_bytes, file_size(p));

		/* The same bytes from memory. */
		len = (size_t)file_size(p);
		mem = malloc(len);
		f = fopen(p, "rb");
		CHECK(f && fread(mem, 1, len, f) == len);
		if (f)
			fclose(f);
		res = read_mem(mem, len);
		CHECK(!memcmp(ref, res, sizeof(*res)));
		free(res);
		free(mem);

		/* Two members / frames / streams, split mid-header. */
		tpath(p, sizeof(p), "multi.%s", codecs[i].ext);
		CHECK(!test_run("head -c 1000 %s | %s > %s && tail -c +1001 %s | %s >> %s",
			  tarp, codecs[i].cmd, p, tarp, codecs[i].cmd, p));
		res = read_file(p, 65536);
		CHECK(!memcmp(ref, res, sizeof(*res)));
		free(res);

		/* Cut in the middle: the tar reader sees a truncated stream. */
		tpath(p, sizeof(p), "half.%s", codecs[i].ext);
		CHECK(!test_run("%s %s | head -c 20000 > %s", codecs[i].cmd, tarp, p));
		res = read_file(p, 65536);
		CHECK_EQ(res->ret, -EFSCORRUPTED);
		free(res);
		/* Cut in the trailer: only a full read notices. */
		CHECK(!test_run("%s %s | head -c -3 > %s", codecs[i].cmd, tarp, p));
		CHECK_EQ(drain(p, &total, &in_bytes), -EFSCORRUPTED);
		/* Garbage after the stream. */
		CHECK(!test_run("%s %s > %s && printf 'junk' >> %s", codecs[i].cmd,
			  tarp, p, p));
		CHECK_EQ(drain(p, &total, &in_bytes), -EFSCORRUPTED);
	}
	free(ref);
}

static void test_gzip_trailing_bytes(void)
{
	char tarp[256], p[256];
	uint64_t total, in_bytes, tar_size;

	tpath(tarp, sizeof(tarp), "c.tar");
	tar_size = file_size(tarp);
	tpath(p, sizeof(p), "z.gz");
	/* NULs after the last member are tolerated. */
	CHECK(!test_run("gzip -c %s > %s && head -c 3000 /dev/zero >> %s", tarp, p, p));
	CHECK_EQ(drain(p, &total, &in_bytes), 0);
	CHECK_EQ(total, tar_size);
	CHECK_EQ(in_bytes, file_size(p));
	/* ...but not NULs then data, nor a non-gzip member. */
	CHECK(!test_run("printf 'x' >> %s", p));
	CHECK_EQ(drain(p, &total, &in_bytes), -EFSCORRUPTED);
	CHECK_EQ(total, tar_size);
	CHECK(!test_run("gzip -c %s > %s && printf '\\037x' >> %s", tarp, p, p));
	CHECK_EQ(drain(p, &total, &in_bytes), -EFSCORRUPTED);
	/* NULs then another member: rejected; gzip(1) does not decode it either. */
	CHECK(!test_run("gzip -c %s > %s && head -c 100 /dev/zero >> %s && gzip -c %s >> %s",
		  tarp, p, p, tarp, p));
	CHECK_EQ(drain(p, &total, &in_bytes), -EFSCORRUPTED);
	CHECK_EQ(total, tar_size);
	/* An empty member in between. */
	CHECK(!test_run("gzip -c %s > %s && gzip -c < /dev/null >> %s && gzip -c %s >> %s",
		  tarp, p, p, tarp, p));
	CHECK_EQ(drain(p, &total, &in_bytes), 0);
	CHECK_EQ(total, 2 * tar_size);
	/* A zstd skippable frame before the data. */
	tpath(p, sizeof(p), "s.zst");
	CHECK(!test_run("printf '\\120\\052\\115\\030\\004\\000\\000\\000abcd' > %s && "
		  "zstd -q -c %s >> %s", p, tarp, p));
	CHECK_EQ(drain(p, &total, &in_bytes), 0);
	CHECK_EQ(total, tar_size);
}

static void test_input_pipe_and_errors(void)
{
	char tarp[256], gz[256], cmd[2048], fdpath[64];
	struct input_stream *in;
	struct result *ref, *res;
	FILE *f;

	tpath(tarp, sizeof(tarp), "c.tar");
	tpath(gz, sizeof(gz), "c.tar.gz");
	ref = read_file(tarp, 65536);
	/* The magic arrives one byte at a time. */
	snprintf(cmd, sizeof(cmd),
		 "head -c 1 %s; sleep 0.1; tail -c +2 %s | head -c 1; sleep 0.1; tail -c +3 %s",
		 gz, gz, gz);
	f = popen(cmd, "r");
	CHECK(f != NULL);
	if (f) {
		snprintf(fdpath, sizeof(fdpath), "/proc/self/fd/%d", fileno(f));
		res = read_file(fdpath, 65536);
		CHECK(!memcmp(ref, res, sizeof(*res)));
		free(res);
		pclose(f);
	}
	free(ref);

	CHECK_EQ(input_open("/nonexistent/x.tar", &in), -ENOENT);
	CHECK_EQ(input_open(tmpdir, &in), -EISDIR);
	/* Short inputs that look like a magic: plain and truncated. */
	res = read_mem("\x1f", 1);
	CHECK_EQ(res->ret, -EFSCORRUPTED);
	free(res);
	res = read_mem("\x1f\x8b", 2);
	CHECK_EQ(res->ret, -EFSCORRUPTED);
	free(res);
	res = read_mem("\x28\xb5\x2f\xfd", 4);
	CHECK_EQ(res->ret, -EFSCORRUPTED);
	free(res);
	res = read_mem("\xfd" "7zXZ\0", 6);
	CHECK_EQ(res->ret, -EFSCORRUPTED);
	free(res);
}

static void test_make_tree(void)
{
	tree_init();
	CHECK(!test_run("mkdir -p %s/src", tmpdir));
	CHECK(!tree_create());
}

int main(void)
{
	strcpy(tmpdir, "/tmp/ferry-test-tar-XXXXXX");
	if (!mkdtemp(tmpdir)) {
		perror("mkdtemp");
		return 1;
	}
	/* Expected errors would flood the output; FERRY_TEST_VERBOSE shows them. */
	if (!getenv("FERRY_TEST_VERBOSE"))
		ferry_log_level = -1;

	RUN_TEST(test_make_tree);
	RUN_TEST(test_gnu_tar_gnu);
	RUN_TEST(test_gnu_tar_pax);
	RUN_TEST(test_gnu_tar_ustar);
	RUN_TEST(test_gnu_tar_v7);
	RUN_TEST(test_big_file_sizes);
	RUN_TEST(test_ustar_fields);
	RUN_TEST(test_gnu_magic_has_no_prefix);
	RUN_TEST(test_v7_and_old_types);
	RUN_TEST(test_base256);
	RUN_TEST(test_bad_numbers);
	RUN_TEST(test_checksum);
	RUN_TEST(test_truncations);
	RUN_TEST(test_zero_blocks);
	RUN_TEST(test_pax_per_file);
	RUN_TEST(test_pax_mtime);
	RUN_TEST(test_pax_bad_records);
	RUN_TEST(test_pax_global);
	RUN_TEST(test_libarchive_xattrs);
	RUN_TEST(test_xattr_limits);
	RUN_TEST(test_gnu_long_names);
	RUN_TEST(test_unsupported);
	RUN_TEST(test_type_data_rules);
	RUN_TEST(test_bad_entries);
	RUN_TEST(test_skip_and_offsets);
	RUN_TEST(test_source_errors);
	RUN_TEST(test_short_reads);
	RUN_TEST(test_compressed_inputs);
	RUN_TEST(test_gzip_trailing_bytes);
	RUN_TEST(test_input_pipe_and_errors);
	RUN_TEST(test_seekable_source);

	test_run("rm -rf %s", tmpdir);
	TEST_MAIN_END();
}
