// SPDX-License-Identifier: MIT
/*
 * pkg-meta tree and writer tests. Images are checked by independent
 * oracles: fsck.erofs / dump.erofs (erofs-utils) and the running kernel,
 * mounting each image file-backed with mount(2) and reading everything
 * back with stat, readdir, readlink, getxattr and read. Needs root.
 */
#include "../test.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdarg.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "../../pkg-base/base.h"
#include "../../pkg-meta/internal.h"
#include "../../pkg-meta/meta.h"

#define BLK 4096u

static char top[64]; /* per-run scratch directory */

/* ------------------------------------------------------------------ */
/* Helpers                                                             */
/* ------------------------------------------------------------------ */

static const char *tpath(char *buf, const char *fmt, ...)
{
	va_list ap;
	int n = snprintf(buf, 512, "%s/", top);

	va_start(ap, fmt);
	vsnprintf(buf + n, 512 - (size_t)n, fmt, ap);
	va_end(ap);
	return buf;
}

/* Output of a command (first 64 KiB), NUL-terminated; caller frees. */
static char *capture(const char *fmt, ...)
{
	char cmd[4096];
	char *out = calloc(1, 65536);
	size_t n = 0;
	va_list ap;
	FILE *f;

	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	f = popen(cmd, "r");
	if (f) {
		n = fread(out, 1, 65535, f);
		pclose(f);
	}
	out[n] = '\0';
	return out;
}

/* The number after @label in dump.erofs output, or -1. */
static long long dump_field(const char *out, const char *label)
{
	const char *p = strstr(out, label);

	return p ? strtoll(p + strlen(label), NULL, 0) : -1;
}

static int write_image(struct meta_tree *t, const struct meta_write_opts *o,
		       const char *path, struct meta_write_stats *st)
{
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
	int ret;

	if (fd < 0)
		return -errno;
	ret = meta_write(t, o, fd, st);
	close(fd);
	return ret;
}

/* @out = @a || @b || @c, for flat (single-file) images. */
static int concat(const char *out, const char *a, const char *b, const char *c)
{
	const char *in[3] = { a, b, c };
	int fd = open(out, O_RDWR | O_CREAT | O_TRUNC, 0644);
	int ret = fd < 0 ? -errno : 0;

	for (int i = 0; !ret && i < 3; i++) {
		size_t len = 0;
		uint8_t *buf = test_read_file(in[i], &len);

		ret = buf ? write_full(fd, buf, len) : -EIO;
		free(buf);
	}
	if (fd >= 0)
		close(fd);
	return ret;
}

/* fsck.erofs with one --device= per device path. */
static int fsck(const char *img, const char *const *devs, unsigned int n)
{
	char args[60000] = "";
	size_t off = 0;

	for (unsigned int i = 0; i < n; i++)
		off += (size_t)snprintf(args + off, sizeof(args) - off,
					"--device=%s ", devs[i]);
	return test_run("fsck.erofs %s%s", args, img);
}

static int do_mount(const char *img, const char *const *devs, unsigned int n,
		    const char *mnt)
{
	char opts[4096] = "";
	size_t off = 0;

	mkdir(mnt, 0755);
	for (unsigned int i = 0; i < n; i++)
		off += (size_t)snprintf(opts + off, sizeof(opts) - off,
					"%sdevice=%s", i ? "," : "", devs[i]);
	if (mount(img, mnt, "erofs", MS_RDONLY, n ? opts : NULL) < 0) {
		fprintf(stderr, "  mount %s: %s\n", img, strerror(errno));
		return -errno;
	}
	return 0;
}

static void do_umount(const char *mnt)
{
	if (umount2(mnt, 0) < 0) {
		fprintf(stderr, "  umount %s: %s\n", mnt, strerror(errno));
		umount2(mnt, MNT_DETACH);
	}
}

static struct meta_inode *add(struct meta_tree *t, struct meta_inode *dir,
			      const char *name, uint32_t mode)
{
	struct meta_inode *in = NULL;

	CHECK_EQ(meta_inode_new(t, mode, &in), 0);
	if (!in)
		abort();
	CHECK_EQ(meta_dir_link(t, dir, name, strlen(name), in), 0);
	return in;
}

static void set_data(struct meta_inode *in, const void *data, size_t len)
{
	free(in->data);
	in->data = malloc(len ? len : 1);
	memcpy(in->data, data, len);
	in->size = len;
}

static struct meta_inode *add_file(struct meta_tree *t, struct meta_inode *dir,
				   const char *name, const void *data,
				   size_t len)
{
	struct meta_inode *in = add(t, dir, name, S_IFREG | 0644);

	if (len)
		set_data(in, data, len);
	return in;
}

/* Deterministic device contents: byte @off of device @dev (1-based). */
static uint8_t dev_byte(unsigned int dev, uint64_t off)
{
	uint64_t x = off * 0x9E3779B97F4A7C15ull + dev * 0xD1B54A32D192ED03ull;

	return (uint8_t)(x >> 56);
}

static void make_device(const char *path, unsigned int dev, uint32_t blocks)
{
	uint8_t *buf = malloc((size_t)blocks * BLK + 1);
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);

	for (uint64_t i = 0; i < (uint64_t)blocks * BLK; i++)
		buf[i] = dev_byte(dev, i);
	CHECK(fd >= 0);
	CHECK_EQ(write_full(fd, buf, (size_t)blocks * BLK), 0);
	close(fd);
	free(buf);
}

/* What a chunk-based file reads as at byte @off. */
static uint8_t chunk_byte(const struct meta_inode *in, uint64_t off)
{
	uint64_t cs = (uint64_t)BLK << in->chunk_bits;
	const struct meta_chunk *c = &in->chunks[off / cs];

	if (c->blkaddr == META_CHUNK_HOLE)
		return 0;
	return dev_byte(c->device_id, (uint64_t)c->blkaddr * BLK + off % cs);
}

static void fill_pattern(uint8_t *buf, size_t len, unsigned int seed)
{
	for (size_t i = 0; i < len; i++)
		buf[i] = (uint8_t)(i * 31 + seed * 7 + (i >> 9));
}

static bool file_equals(const char *path, const uint8_t *want, size_t len)
{
	size_t got_len = 0;
	uint8_t *got = test_read_file(path, &got_len);
	bool ok = got && got_len == len && !memcmp(got, want, len);

	if (!ok)
		fprintf(stderr, "  %s: content differs (%zu vs %zu bytes)\n",
			path, got_len, len);
	free(got);
	return ok;
}

/* EROFS directory order: bytewise, a prefix before its extensions. */
static int name_cmp(const char *a, size_t la, const char *b, size_t lb)
{
	int c = memcmp(a, b, MIN(la, lb));

	return c ? c : (la < lb ? -1 : la > lb);
}

/*
 * Entries of directory @path in readdir order; 1 if strictly ascending
 * (the on-disk order), with the count in *n.
 */
static int readdir_sorted(const char *path, int *n)
{
	char prev[300] = "";
	size_t prev_len = 0;
	int ordered = 1;
	struct dirent *de;
	DIR *dh = opendir(path);

	*n = 0;
	while (dh && (de = readdir(dh))) {
		size_t len = strlen(de->d_name);

		if (*n && name_cmp(prev, prev_len, de->d_name, len) >= 0)
			ordered = 0;
		memcpy(prev, de->d_name, len + 1);
		prev_len = len;
		(*n)++;
	}
	if (dh)
		closedir(dh);
	return ordered;
}

/* The on-disk inode behind a mounted path: st_ino is the nid. */
static unsigned int layout_of(const uint8_t *img, const char *mpath)
{
	struct stat st;

	if (lstat(mpath, &st) < 0)
		return 99;
	return (get_le16(img + st.st_ino * 32) >> 1) & 7;
}

/* ------------------------------------------------------------------ */
/* CRC and tree                                                         */
/* ------------------------------------------------------------------ */

static void test_crc32c(void)
{
	uint8_t buf[1031];

	/* The standard check value 0xE3069283, without the final inversion. */
	CHECK_EQ(erofs_crc32c(~0u, "123456789", 9), 0x1CF96D7Cu);
	CHECK_EQ(erofs_crc32c(~0u, NULL, 0), 0xFFFFFFFFu);
	fill_pattern(buf, sizeof(buf), 3);
	/* Split anywhere: same result as one pass. */
	for (size_t cut = 0; cut < 9; cut++)
		CHECK_EQ(erofs_crc32c(erofs_crc32c(~0u, buf, cut), buf + cut,
				      sizeof(buf) - cut),
			 erofs_crc32c(~0u, buf, sizeof(buf)));
}

static void test_tree_ops(void)
{
	struct meta_tree *t;
	struct meta_inode *d, *f, *g, *sub, *x;
	char name[300];

	CHECK_EQ(meta_tree_new(&t), 0);
	CHECK(S_ISDIR(t->root->mode));
	CHECK_EQ(t->root->mode & 07777, 0755);
	d = add(t, t->root, "d", S_IFDIR | 0755);
	f = add(t, d, "f", S_IFREG | 0644);
	CHECK(meta_dir_lookup(t->root, "d", 1) == d);
	CHECK(meta_dir_lookup(d, "f", 1) == f);
	CHECK(meta_dir_lookup(d, "g", 1) == NULL);
	CHECK(meta_dir_lookup(d, ".", 1) == NULL);
	CHECK(meta_dir_lookup(f, "f", 1) == NULL);

	/* Name rules. */
	CHECK_EQ(meta_dir_link(t, d, "", 0, f), -EINVAL);
	CHECK_EQ(meta_dir_link(t, d, ".", 1, f), -EINVAL);
	CHECK_EQ(meta_dir_link(t, d, "..", 2, f), -EINVAL);
	CHECK_EQ(meta_dir_link(t, d, "a/b", 3, f), -EINVAL);
	CHECK_EQ(meta_dir_link(t, d, "a\0b", 3, f), -EINVAL);
	memset(name, 'n', sizeof(name));
	CHECK_EQ(meta_dir_link(t, d, name, 256, f), -EINVAL);
	CHECK_EQ(meta_dir_link(t, d, name, 255, f), 0);
	CHECK(meta_dir_lookup(d, name, 255) == f);
	CHECK_EQ(f->links, 2);
	CHECK_EQ(meta_dir_link(t, f, "x", 1, d), -ENOTDIR);
	CHECK_EQ(meta_dir_link(t, t->root, "d2", 2, d), -EMLINK);
	CHECK_EQ(meta_dir_link(t, d, "root", 4, t->root), -EMLINK);
	CHECK_EQ(meta_inode_new(t, 0777, &x), -EINVAL);

	/* Relinking the same inode under the same name changes nothing. */
	CHECK_EQ(meta_dir_link(t, d, "f", 1, f), 0);
	CHECK_EQ(f->links, 2);
	CHECK_EQ(meta_dir_unlink(t, d, name, 255), 0);
	CHECK_EQ(f->links, 1);
	CHECK_EQ(meta_dir_unlink(t, d, name, 255), -ENOENT);

	/* Replace: the old entry's subtree drops, hardlinks elsewhere stay. */
	sub = add(t, d, "sub", S_IFDIR | 0700);
	g = add(t, sub, "g", S_IFREG | 0600);
	CHECK_EQ(meta_dir_link(t, t->root, "g-link", 6, g), 0);
	CHECK_EQ(g->links, 2);
	add(t, sub, "deeper", S_IFDIR | 0700);
	CHECK_EQ(meta_dir_link(t, d, "sub", 3, f), 0);
	CHECK(meta_dir_lookup(d, "sub", 3) == f);
	CHECK_EQ(f->links, 2);
	CHECK_EQ(sub->links, 0);
	CHECK_EQ(sub->nr_children, 0);
	CHECK_EQ(g->links, 1);
	/* A dropped directory is an ordinary unlinked one again. */
	CHECK_EQ(meta_dir_link(t, t->root, "sub-again", 9, sub), 0);

	/* Xattrs: set, replace, clear. */
	CHECK_EQ(meta_inode_set_xattr(f, "user.a", "1", 1), 0);
	CHECK_EQ(meta_inode_set_xattr(f, "user.b", "22", 2), 0);
	CHECK_EQ(meta_inode_set_xattr(f, "user.a", "333", 3), 0);
	CHECK_EQ(f->nr_xattrs, 2);
	CHECK_EQ(f->xattrs[0].value_len, 3);
	CHECK(!memcmp(f->xattrs[0].value, "333", 3));
	CHECK_EQ(meta_inode_set_xattr(f, "user.e", NULL, 0), 0);
	CHECK_EQ(meta_inode_set_xattr(f, "", "x", 1), -EINVAL);
	meta_inode_clear_xattrs(f);
	CHECK_EQ(f->nr_xattrs, 0);

	/* Clear drops everything below. */
	meta_dir_clear(t, d);
	CHECK_EQ(d->nr_children, 0);
	CHECK_EQ(f->links, 0);
	CHECK(meta_dir_lookup(d, "f", 1) == NULL);
	CHECK_EQ(meta_dir_unlink(t, d, "f", 1), -ENOENT);
	CHECK_EQ(meta_dir_unlink(t, f, "f", 1), -ENOTDIR);
	meta_tree_free(t);
}

/* Unreachable cycles and deep chains must not hurt drop or free. */
static void test_tree_deep_drop(void)
{
	struct meta_tree *t;
	struct meta_inode *a, *b, *dir;

	CHECK_EQ(meta_tree_new(&t), 0);
	CHECK_EQ(meta_inode_new(t, S_IFDIR | 0755, &a), 0);
	CHECK_EQ(meta_inode_new(t, S_IFDIR | 0755, &b), 0);
	CHECK_EQ(meta_dir_link(t, a, "b", 1, b), 0);
	CHECK_EQ(meta_dir_link(t, b, "a", 1, a), 0);
	CHECK_EQ(meta_dir_unlink(t, a, "b", 1), 0);
	CHECK_EQ(a->links, 0);
	CHECK_EQ(b->links, 0);

	/* 200k nested directories, dropped without recursion. */
	dir = add(t, t->root, "deep", S_IFDIR | 0755);
	for (int i = 0; i < 200000; i++)
		dir = add(t, dir, "d", S_IFDIR | 0755);
	CHECK_EQ(meta_dir_unlink(t, t->root, "deep", 4), 0);
	CHECK_EQ(dir->links, 0);
	meta_tree_free(t);
}

static void test_tree_big_dir(void)
{
	enum { N = 100000 };
	struct meta_tree *t;
	struct meta_inode *dir, **in = calloc(N, sizeof(*in));
	char name[32];
	uint64_t t0;

	CHECK_EQ(meta_tree_new(&t), 0);
	dir = add(t, t->root, "big", S_IFDIR | 0755);
	t0 = ferry_now_ns();
	for (int i = 0; i < N; i++) {
		int len = snprintf(name, sizeof(name), "file-%d", i);

		CHECK_EQ(meta_inode_new(t, S_IFREG | 0644, &in[i]), 0);
		CHECK_EQ(meta_dir_link(t, dir, name, (size_t)len, in[i]), 0);
		/* Converters look up before every insert. */
		CHECK(meta_dir_lookup(dir, name, (size_t)len) == in[i]);
	}
	/* Remove every third entry, then check all names. */
	for (int i = 0; i < N; i += 3) {
		int len = snprintf(name, sizeof(name), "file-%d", i);

		CHECK_EQ(meta_dir_unlink(t, dir, name, (size_t)len), 0);
	}
	for (int i = 0; i < N; i++) {
		int len = snprintf(name, sizeof(name), "file-%d", i);
		struct meta_inode *got = meta_dir_lookup(dir, name, (size_t)len);

		if (got != (i % 3 ? in[i] : NULL)) {
			CHECK(!"lookup after unlink");
			break;
		}
	}
	CHECK_EQ(dir->nr_children, N - (N + 2) / 3);
	/* The array and the index agree. */
	for (uint32_t k = 0; k < dir->nr_children; k++) {
		const struct meta_dentry *d = dir->children[k];

		if (meta_dir_lookup(dir, d->name, d->name_len) != d->inode) {
			CHECK(!"children[] vs index");
			break;
		}
	}
	/* Untouched entries keep their insertion order. */
	CHECK(!strcmp(dir->children[1]->name, "file-1"));
	CHECK(!strcmp(dir->children[2]->name, "file-2"));
	fprintf(stderr, "  100k links + lookups + 33k unlinks: %.1f ms\n",
		(double)(ferry_now_ns() - t0) / 1e6);
	meta_tree_free(t);
	free(in);
}

/* ------------------------------------------------------------------ */
/* Writer: format basics                                                */
/* ------------------------------------------------------------------ */

static void test_write_empty_tree(void)
{
	char img[512], mnt[512];
	struct meta_tree *t;
	struct meta_write_stats st;
	uint8_t *b, sbcopy[3072];
	size_t len = 0;
	DIR *dh;
	struct dirent *de;
	int n = 0;

	CHECK_EQ(meta_tree_new(&t), 0);
	t->root->mtime = 1700000000;
	t->root->mtime_nsec = 5;
	tpath(img, "empty.img");
	CHECK_EQ(write_image(t, NULL, img, &st), 0);
	b = test_read_file(img, &len);
	if (!b) {
		CHECK(!"image");
		return;
	}
	CHECK_EQ(len, st.bytes);
	CHECK_EQ(len % BLK, 0);
	CHECK_EQ(st.inodes, 1);
	CHECK_EQ(st.compact_inodes, 1);
	/* Preamble. */
	CHECK(!memcmp(b, META_PREAMBLE_MAGIC, 8));
	CHECK_EQ(get_le32(b + FERRY_PRE_VERSION), 1);
	CHECK_EQ(get_le64(b + FERRY_PRE_EXT_OFF), len);
	CHECK_EQ(get_le64(b + FERRY_PRE_EXT_LEN), 0);
	CHECK_EQ(get_le32(b + FERRY_PRE_EXT_CRC), 0xFFFFFFFFu);
	CHECK_EQ(get_le32(b + FERRY_PRE_CRC), erofs_crc32c(~0u, b, 0x3C));
	/* Superblock. */
	const uint8_t *sb = b + EROFS_SUPER_OFFSET;
	CHECK_EQ(get_le32(sb + EROFS_SB_MAGIC), EROFS_SUPER_MAGIC);
	CHECK_EQ(get_le32(sb + EROFS_SB_FEATURE_COMPAT), 3);
	CHECK_EQ(get_le32(sb + EROFS_SB_FEATURE_INCOMPAT), 0);
	CHECK_EQ(sb[EROFS_SB_BLKSZBITS], 12);
	CHECK_EQ(get_le16(sb + EROFS_SB_ROOT_NID), 36);
	CHECK_EQ(get_le64(sb + EROFS_SB_INOS), 1);
	CHECK_EQ(get_le64(sb + EROFS_SB_EPOCH), 1700000000);
	CHECK_EQ(get_le32(sb + EROFS_SB_FIXED_NSEC), 5);
	CHECK_EQ((uint64_t)get_le32(sb + EROFS_SB_BLOCKS) * BLK, len);
	CHECK_EQ(get_le32(sb + EROFS_SB_META_BLKADDR), 0);
	CHECK(!memcmp(sb + EROFS_SB_VOLUME_NAME, "ferry\0", 6));
	CHECK_EQ(get_le16(sb + EROFS_SB_EXTRA_DEVICES), 0);
	CHECK_EQ(get_le16(sb + EROFS_SB_U1), 0);
	CHECK_EQ((sb[EROFS_SB_UUID + 6] >> 4), 8);
	memcpy(sbcopy, sb, sizeof(sbcopy));
	put_le32(sbcopy + EROFS_SB_CHECKSUM, 0);
	CHECK_EQ(get_le32(sb + EROFS_SB_CHECKSUM),
		 erofs_crc32c(~0u, sbcopy, sizeof(sbcopy)));
	/* Root: compact, inline directory with "." and "..". */
	CHECK_EQ(get_le16(b + 36 * 32 + EROFS_I_FORMAT),
		 EROFS_INODE_FLAT_INLINE << 1);
	CHECK_EQ(get_le32(b + 36 * 32 + EROFS_IC_SIZE), 2 * 12 + 3);
	CHECK_EQ(get_le16(b + 36 * 32 + EROFS_IC_NLINK), 2);
	free(b);

	CHECK_EQ(fsck(img, NULL, 0), 0);
	char *out = capture("dump.erofs -s %s 2>&1", img);
	CHECK_EQ(dump_field(out, "Filesystem root nid:"), 36);
	CHECK_EQ(dump_field(out, "Filesystem inode count:"), 1);
	CHECK_EQ(dump_field(out, "Filesystem blocks:"), st.bytes / BLK);
	CHECK_EQ(dump_field(out, "Filesystem magic number:"), EROFS_SUPER_MAGIC);
	free(out);
	tpath(mnt, "empty.mnt");
	if (do_mount(img, NULL, 0, mnt) == 0) {
		struct stat s;

		dh = opendir(mnt);
		while (dh && (de = readdir(dh)))
			n++;
		if (dh)
			closedir(dh);
		CHECK_EQ(n, 2);
		CHECK_EQ(stat(mnt, &s), 0);
		CHECK_EQ(s.st_mtim.tv_sec, 1700000000);
		CHECK_EQ(s.st_mtim.tv_nsec, 5);
		CHECK_EQ(s.st_nlink, 2);
		do_umount(mnt);
	} else {
		CHECK(!"mount");
	}
	meta_tree_free(t);
}


/* ------------------------------------------------------------------ */
/* Writer: every file type, read back by the kernel                     */
/* ------------------------------------------------------------------ */

struct expect {
	const char *path;
	uint32_t mode, uid, gid;
	int64_t mtime;
	uint32_t nsec;
	uint64_t size;
	const uint8_t *data;   /* regular files */
	const char *target;    /* symlinks */
	uint32_t major, minor; /* devices */
	unsigned int layout;   /* 99: do not check */
	uint32_t nlink;
};

static void check_expect(const uint8_t *img, const char *mnt,
			 const struct expect *e)
{
	char path[1024], link[8192];
	struct stat st;

	snprintf(path, sizeof(path), "%s/%s", mnt, e->path);
	if (lstat(path, &st) < 0) {
		fprintf(stderr, "  lstat %s: %s\n", path, strerror(errno));
		CHECK(!"lstat");
		return;
	}
	CHECK_EQ(st.st_mode, e->mode);
	CHECK_EQ(st.st_uid, e->uid);
	CHECK_EQ(st.st_gid, e->gid);
	CHECK_EQ(st.st_mtim.tv_sec, e->mtime);
	CHECK_EQ(st.st_mtim.tv_nsec, e->nsec);
	CHECK_EQ(st.st_nlink, e->nlink);
	if (!S_ISDIR(e->mode))
		CHECK_EQ(st.st_size, e->size);
	if (e->layout != 99)
		CHECK_EQ(layout_of(img, path), e->layout);
	if (S_ISREG(e->mode))
		CHECK(file_equals(path, e->data, e->size));
	if (S_ISLNK(e->mode)) {
		ssize_t n = readlink(path, link, sizeof(link));

		CHECK_EQ(n, (ssize_t)strlen(e->target));
		CHECK(n > 0 && !memcmp(link, e->target, (size_t)n));
	}
	if (S_ISCHR(e->mode) || S_ISBLK(e->mode)) {
		CHECK_EQ(major(st.st_rdev), e->major);
		CHECK_EQ(minor(st.st_rdev), e->minor);
	}
	if (test_failures_in_case)
		fprintf(stderr, "  (while checking %s)\n", e->path);
}

static void test_write_all_types(void)
{
	static uint8_t d10000[10000], d8192[8192], d4064[4064], d4065[4065],
		d4032[4032], d4033[4033];
	char img[512], mnt[512], longlink[4096];
	struct meta_tree *t;
	struct meta_inode *d, *in, *hard;
	struct meta_write_stats ws;
	const int64_t T = 1600000000;
	uint8_t *b;
	size_t len;

	fill_pattern(d10000, sizeof(d10000), 1);
	fill_pattern(d8192, sizeof(d8192), 2);
	fill_pattern(d4064, sizeof(d4064), 3);
	fill_pattern(d4065, sizeof(d4065), 4);
	fill_pattern(d4032, sizeof(d4032), 5);
	fill_pattern(d4033, sizeof(d4033), 6);
	for (size_t i = 0; i < sizeof(longlink) - 1; i++)
		longlink[i] = i % 2 ? '/' : 'a';
	longlink[sizeof(longlink) - 1] = '\0';

	struct expect ex[] = {
		{ "d", S_IFDIR | 0750, 1000, 1000, T, 0, 0, 0, 0, 0, 0, 99, 4 },
		{ "d/sub", S_IFDIR | 0700, 0, 0, T, 0, 0, 0, 0, 0, 0, 99, 2 },
		{ "d/sub2", S_IFDIR | 0700, 0, 0, T, 0, 0, 0, 0, 0, 0, 99, 2 },
		{ "sticky", S_IFDIR | 01777, 0, 0, T, 0, 0, 0, 0, 0, 0, 99, 2 },
		{ "empty", S_IFREG | 04755, 70000, 80000, T, 0, 0, (uint8_t *)"", 0, 0, 0, 0, 1 },
		{ "small", S_IFREG | 0644, 0, 0, T, 0, 5, (uint8_t *)"hello", 0, 0, 0, 2, 1 },
		{ "blocks", S_IFREG | 0644, 0, 0, T, 0, 10000, d10000, 0, 0, 0, 2, 1 },
		{ "exact", S_IFREG | 0644, 0, 0, T, 0, 8192, d8192, 0, 0, 0, 0, 1 },
		{ "inline4064", S_IFREG | 0644, 0, 0, T, 0, 4064, d4064, 0, 0, 0, 2, 1 },
		{ "plain4065", S_IFREG | 0644, 0, 0, T, 0, 4065, d4065, 0, 0, 0, 0, 1 },
		{ "ext4032", S_IFREG | 0600, 65536, 0, T, 0, 4032, d4032, 0, 0, 0, 2, 1 },
		{ "ext4033", S_IFREG | 0600, 0, 65536, T, 0, 4033, d4033, 0, 0, 0, 0, 1 },
		{ "link", S_IFLNK | 0777, 0, 0, T, 0, 5, 0, "small", 0, 0, 2, 1 },
		{ "longlink", S_IFLNK | 0777, 0, 0, T, 0, 4095, 0, longlink, 0, 0, 0, 1 },
		{ "chr", S_IFCHR | 0600, 0, 0, T, 0, 0, 0, 0, 4095, 1048575, 0, 1 },
		{ "blk", S_IFBLK | 0660, 0, 6, T, 0, 0, 0, 0, 8, 1, 0, 1 },
		{ "whiteout", S_IFCHR | 0, 0, 0, T, 0, 0, 0, 0, 0, 0, 0, 1 },
		{ "fifo", S_IFIFO | 0644, 0, 0, T, 0, 0, 0, 0, 0, 0, 0, 1 },
		{ "sock", S_IFSOCK | 0755, 0, 0, T, 0, 0, 0, 0, 0, 0, 0, 1 },
		{ "nsec", S_IFREG | 0644, 0, 0, 1234567890, 123456789, 0, (uint8_t *)"", 0, 0, 0, 0, 1 },
		{ "neg", S_IFREG | 0644, 0, 0, -1000, 500, 0, (uint8_t *)"", 0, 0, 0, 0, 1 },
		{ "bigids", S_IFREG | 02755, 4294967294u, 4000000000u, T, 0, 0, (uint8_t *)"", 0, 0, 0, 0, 1 },
	};

	CHECK_EQ(meta_tree_new(&t), 0);
	t->root->mtime = T;
	for (size_t i = 0; i < ARRAY_SIZE(ex); i++) {
		const struct expect *e = &ex[i];
		const char *slash = strrchr(e->path, '/');

		d = slash ? meta_dir_lookup(t->root, e->path,
					    (size_t)(slash - e->path)) : t->root;
		in = add(t, d, slash ? slash + 1 : e->path, e->mode);
		in->uid = e->uid;
		in->gid = e->gid;
		in->mtime = e->mtime;
		in->mtime_nsec = e->nsec;
		in->rdev_major = e->major;
		in->rdev_minor = e->minor;
		if (e->data && e->size)
			set_data(in, e->data, e->size);
		if (e->target)
			set_data(in, e->target, strlen(e->target));
	}
	/* Three links to one inode, one of them in a subdirectory. */
	hard = add(t, t->root, "hard1", S_IFREG | 0640);
	hard->mtime = T;
	set_data(hard, "hardlinked", 10);
	CHECK_EQ(meta_dir_link(t, t->root, "hard2", 5, hard), 0);
	CHECK_EQ(meta_dir_link(t, meta_dir_lookup(t->root, "d", 1), "hard3", 5,
			       hard), 0);

	tpath(img, "types.img");
	CHECK_EQ(write_image(t, NULL, img, &ws), 0);
	CHECK_EQ(ws.inodes, ARRAY_SIZE(ex) + 2);
	/* empty, ext*, neg, nsec, bigids are extended; everything else compact. */
	CHECK_EQ(ws.extended_inodes, 6);
	CHECK_EQ(fsck(img, NULL, 0), 0);
	char *out = capture("dump.erofs --path=/d %s 2>&1", img);
	CHECK_EQ(dump_field(out, "Links:"), 4);
	CHECK_EQ(dump_field(out, "Layout:"), EROFS_INODE_FLAT_INLINE);
	CHECK_EQ(dump_field(out, "Uid:"), 1000);
	free(out);
	out = capture("dump.erofs -S %s 2>&1", img);
	CHECK_EQ(dump_field(out, "Filesystem total file count:"), ARRAY_SIZE(ex) + 4);
	CHECK_EQ(dump_field(out, "Filesystem symlink file count:"), 2);
	free(out);
	b = test_read_file(img, &len);
	tpath(mnt, "types.mnt");
	if (b && do_mount(img, NULL, 0, mnt) == 0) {
		char p1[1024], p2[1024], p3[1024];
		struct stat s1, s2, s3, sr;
		int n = 0;

		for (size_t i = 0; i < ARRAY_SIZE(ex); i++)
			check_expect(b, mnt, &ex[i]);
		snprintf(p1, sizeof(p1), "%s/hard1", mnt);
		snprintf(p2, sizeof(p2), "%s/hard2", mnt);
		snprintf(p3, sizeof(p3), "%s/d/hard3", mnt);
		CHECK_EQ(lstat(p1, &s1), 0);
		CHECK_EQ(lstat(p2, &s2), 0);
		CHECK_EQ(lstat(p3, &s3), 0);
		CHECK_EQ(s1.st_nlink, 3);
		CHECK_EQ(s1.st_ino, s2.st_ino);
		CHECK_EQ(s1.st_ino, s3.st_ino);
		CHECK(file_equals(p3, (const uint8_t *)"hardlinked", 10));
		CHECK_EQ(stat(mnt, &sr), 0);
		CHECK_EQ(sr.st_nlink, 4); /* ".", "..", d, sticky */
		/* readdir returns the on-disk (bytewise sorted) order. */
		CHECK(readdir_sorted(mnt, &n));
		/* ".", "..", hard1, hard2 and all of ex[] but d/sub, d/sub2. */
		CHECK_EQ(n, 4 + ARRAY_SIZE(ex) - 2);
		do_umount(mnt);
	} else {
		CHECK(!"mount");
	}
	free(b);
	meta_tree_free(t);
}

/*
 * Files of every tail size around the inline limit, behind xattrs of
 * varying size, so inline tails land at every offset of a block.
 */
static void test_write_inline_sweep(void)
{
	enum { N = 400 };
	static uint8_t data[N][6000];
	char img[512], mnt[512], name[64], path[1024], xv[256];
	struct meta_tree *t;
	struct meta_inode *in;
	uint8_t *b;
	size_t len;
	int inl = 0, plain = 0;

	CHECK_EQ(meta_tree_new(&t), 0);
	memset(xv, 'v', sizeof(xv));
	for (int i = 0; i < N; i++) {
		size_t size = i < 200 ? 3800 + (size_t)i * 3 : 1 + (size_t)(i - 200) * 29;

		snprintf(name, sizeof(name), "f%03d", i);
		fill_pattern(data[i], size, (unsigned int)i);
		in = add_file(t, t->root, name, data[i], size);
		if (i % 3)
			CHECK_EQ(meta_inode_set_xattr(in, "user.pad", xv,
						      (uint32_t)(i * 7) % 250), 0);
	}
	tpath(img, "sweep.img");
	CHECK_EQ(write_image(t, NULL, img, NULL), 0);
	CHECK_EQ(fsck(img, NULL, 0), 0);
	b = test_read_file(img, &len);
	tpath(mnt, "sweep.mnt");
	if (b && do_mount(img, NULL, 0, mnt) == 0) {
		for (int i = 0; i < N; i++) {
			size_t size = i < 200 ? 3800 + (size_t)i * 3 : 1 + (size_t)(i - 200) * 29;
			unsigned int lay;
			struct stat st;

			snprintf(path, sizeof(path), "%s/f%03d", mnt, i);
			CHECK(file_equals(path, data[i], size));
			lay = layout_of(b, path);
			CHECK(lay == 0 || lay == 2);
			inl += lay == 2;
			plain += lay == 0;
			/* Inline: inode, xattrs and tail share one block. */
			if (lay == 2 && lstat(path, &st) == 0) {
				uint64_t pos = st.st_ino * 32;
				uint16_t ic = get_le16(b + pos + 2);
				uint64_t end = pos + 32 + EROFS_XATTR_IBODY_SIZE(ic) + size % BLK;

				CHECK(pos / BLK == (end - 1) / BLK);
			}
		}
		do_umount(mnt);
	} else {
		CHECK(!"mount");
	}
	CHECK(inl > 200);
	CHECK(plain > 10);
	free(b);
	meta_tree_free(t);
}

/* ------------------------------------------------------------------ */
/* Chunk-based files on external devices                                */
/* ------------------------------------------------------------------ */

static void set_chunks(struct meta_inode *in, uint8_t bits, uint64_t size,
		       const struct meta_chunk *c, size_t n)
{
	in->chunk_bits = bits;
	in->size = size;
	in->chunks = malloc(n ? n * sizeof(*c) : 1);
	if (n)
		memcpy(in->chunks, c, n * sizeof(*c));
}

static bool chunked_equals(const char *path, const struct meta_inode *in)
{
	size_t len = 0;
	uint8_t *got = test_read_file(path, &len);
	bool ok = got && len == in->size;

	for (size_t i = 0; ok && i < len; i++)
		ok = got[i] == chunk_byte(in, i);
	if (!ok)
		fprintf(stderr, "  %s: chunked content differs\n", path);
	free(got);
	return ok;
}

static void test_write_chunked(void)
{
	const struct meta_chunk c0[] = {
		{ 1, 3 }, { 0, META_CHUNK_HOLE }, { 2, 10 }, { 2, 10 },
		{ 1, 0 }, { 2, 99 },
	};
	const struct meta_chunk c2[] = { { 1, 8 }, { 0, META_CHUNK_HOLE }, { 2, 50 } };
	const struct meta_chunk holes[] = { { 0, META_CHUNK_HOLE },
					    { 0, META_CHUNK_HOLE },
					    { 0, META_CHUNK_HOLE } };
	struct meta_device devs[2] = { { "", 64 }, { "", 100 } };
	char img[512], mnt[512], flat[512], dev1[512], dev2[512], path[1024];
	const char *devpaths[2] = { dev1, dev2 };
	struct meta_write_opts o = { .devices = devs, .nr_devices = 2 };
	struct meta_inode *f[5];
	const char *names[5] = { "c0", "c2", "holes", "cempty", "cx" };
	struct meta_tree *t;
	uint8_t *b;
	size_t len;

	memset(devs[0].tag, 'a', 64);
	memset(devs[1].tag, 'b', 64);
	tpath(dev1, "chunk.dev1");
	tpath(dev2, "chunk.dev2");
	make_device(dev1, 1, 64);
	make_device(dev2, 2, 100);
	CHECK_EQ(meta_tree_new(&t), 0);
	for (int i = 0; i < 5; i++)
		f[i] = add(t, t->root, names[i], S_IFREG | 0644);
	set_chunks(f[0], 0, 5 * BLK + 100, c0, ARRAY_SIZE(c0));
	set_chunks(f[1], 2, 40000, c2, ARRAY_SIZE(c2));
	set_chunks(f[2], 1, 20000, holes, ARRAY_SIZE(holes));
	set_chunks(f[3], 0, 0, NULL, 0);
	/* An xattr region of 4 mod 8 bytes forces the 8-byte index gap. */
	set_chunks(f[4], 0, 2 * BLK, c0 + 2, 2);
	CHECK_EQ(meta_inode_set_xattr(f[4], "user.k", "v", 1), 0);

	tpath(img, "chunk.img");
	CHECK_EQ(write_image(t, &o, img, NULL), 0);
	CHECK_EQ(fsck(img, devpaths, 2), 0);
	b = test_read_file(img, &len);
	if (b) {
		const uint8_t *sb = b + EROFS_SUPER_OFFSET;
		uint32_t blocks = get_le32(sb + EROFS_SB_BLOCKS);

		CHECK_EQ(get_le32(sb + EROFS_SB_FEATURE_INCOMPAT), 0xC);
		CHECK_EQ(get_le16(sb + EROFS_SB_EXTRA_DEVICES), 2);
		CHECK_EQ(get_le16(sb + EROFS_SB_DEVT_SLOTOFF), 9);
		CHECK(!memcmp(b + 1152, devs[0].tag, 64));
		CHECK_EQ(get_le32(b + 1152 + 0x40), 64);
		CHECK_EQ(get_le32(b + 1152 + 0x44), blocks);
		CHECK(!memcmp(b + 1280, devs[1].tag, 64));
		CHECK_EQ(get_le32(b + 1280 + 0x40), 100);
		CHECK_EQ(get_le32(b + 1280 + 0x44), blocks + 64);
	}
	tpath(mnt, "chunk.mnt");
	if (b && do_mount(img, devpaths, 2, mnt) == 0) {
		for (int i = 0; i < 5; i++) {
			snprintf(path, sizeof(path), "%s/%s", mnt, names[i]);
			CHECK(chunked_equals(path, f[i]));
			CHECK_EQ(layout_of(b, path), EROFS_INODE_CHUNK_BASED);
		}
		do_umount(mnt);
	} else {
		CHECK(!"mount");
	}
	/* bootstrap || dev1 || dev2 mounts with no options (uniaddr). */
	tpath(flat, "chunk.flat");
	CHECK_EQ(concat(flat, img, dev1, dev2), 0);
	if (do_mount(flat, NULL, 0, mnt) == 0) {
		for (int i = 0; i < 5; i++) {
			snprintf(path, sizeof(path), "%s/%s", mnt, names[i]);
			CHECK(chunked_equals(path, f[i]));
		}
		do_umount(mnt);
	} else {
		CHECK(!"flat mount");
	}
	free(b);
	meta_tree_free(t);
}

/*
 * @n one-block devices, one chunk on each: the device table spills over
 * many blocks before the root. Checked through a flat image (a mount
 * option string cannot name 1024 devices) and, with @fsck, by fsck.erofs
 * (1.5 corrupts its heap parsing ~850+ --device options).
 */
static void many_devices(unsigned int n, bool with_fsck)
{
	struct meta_device *devs = calloc(n, sizeof(*devs));
	struct meta_chunk *c = calloc(n, sizeof(*c));
	struct meta_write_opts o = { .devices = devs, .nr_devices = n };
	char img[512], mnt[512], flat[512], path[1024];
	char (*devpath)[512] = calloc(n, sizeof(*devpath));
	const char **devp = calloc(n, sizeof(*devp));
	struct meta_tree *t;
	struct meta_inode *in;
	uint8_t *b, *want = malloc((size_t)n * BLK);
	size_t len;
	int fd;

	for (unsigned int i = 0; i < n; i++) {
		snprintf(devs[i].tag, sizeof(devs[i].tag), "%063u", i);
		devs[i].tag[63] = 'x';
		devs[i].blocks = 1;
		c[i] = (struct meta_chunk){ (uint16_t)(i + 1), 0 };
		for (unsigned int k = 0; k < BLK; k++)
			want[(size_t)i * BLK + k] = dev_byte(i + 1, k);
	}
	CHECK_EQ(meta_tree_new(&t), 0);
	in = add(t, t->root, "f", S_IFREG | 0644);
	set_chunks(in, 0, (uint64_t)n * BLK, c, n);
	tpath(img, "many%u.img", n);
	CHECK_EQ(write_image(t, &o, img, NULL), 0);
	b = test_read_file(img, &len);
	if (!b) {
		CHECK(!"image");
		goto out;
	}
	CHECK_EQ(get_le16(b + EROFS_SUPER_OFFSET + EROFS_SB_ROOT_NID),
		 (1152 + 128 * n) / 32);
	CHECK(!memcmp(b + 1152 + 128 * (n - 1), devs[n - 1].tag, 64));
	CHECK_EQ(get_le32(b + 1152 + 128 * (n - 1) + 0x44), len / BLK + n - 1);
	if (with_fsck) {
		for (unsigned int i = 0; i < n; i++) {
			tpath(devpath[i], "many.dev%u", i);
			make_device(devpath[i], i + 1, 1);
			devp[i] = devpath[i];
		}
		CHECK_EQ(fsck(img, devp, n), 0);
	}
	tpath(flat, "many%u.flat", n);
	fd = open(flat, O_RDWR | O_CREAT | O_TRUNC, 0644);
	CHECK_EQ(write_full(fd, b, len), 0);
	CHECK_EQ(write_full(fd, want, (size_t)n * BLK), 0);
	close(fd);
	tpath(mnt, "many.mnt");
	if (do_mount(flat, NULL, 0, mnt) == 0) {
		snprintf(path, sizeof(path), "%s/f", mnt);
		CHECK(file_equals(path, want, (size_t)n * BLK));
		do_umount(mnt);
	} else {
		CHECK(!"mount");
	}
	free(b);
out:
	meta_tree_free(t);
	free(want);
	free(devp);
	free(devpath);
	free(devs);
	free(c);
}

static void test_write_many_devices(void)
{
	many_devices(600, true);
	many_devices(META_MAX_DEVICES, false);
}

/* A 4 GiB + sparse file: extended inode, 2049 hole chunks of 2 MiB. */
static void test_write_sparse_4g(void)
{
	const uint64_t size = (4ull << 30) + 12345;
	const uint64_t n = DIV_ROUND_UP(size, 2u << 20);
	struct meta_chunk *c = malloc(n * sizeof(*c));
	char img[512], mnt[512], path[1024];
	uint8_t buf[20000], zero[20000] = { 0 };
	struct meta_write_stats ws;
	struct meta_tree *t;
	struct meta_inode *in;

	for (uint64_t i = 0; i < n; i++)
		c[i] = (struct meta_chunk){ 0, META_CHUNK_HOLE };
	CHECK_EQ(meta_tree_new(&t), 0);
	in = add(t, t->root, "sparse", S_IFREG | 0644);
	set_chunks(in, 9, size, c, n);
	tpath(img, "sparse.img");
	CHECK_EQ(write_image(t, NULL, img, &ws), 0);
	CHECK_EQ(ws.extended_inodes, 1);
	CHECK_EQ(fsck(img, NULL, 0), 0);
	tpath(mnt, "sparse.mnt");
	if (do_mount(img, NULL, 0, mnt) == 0) {
		struct stat st;
		int fd;

		snprintf(path, sizeof(path), "%s/sparse", mnt);
		CHECK_EQ(stat(path, &st), 0);
		CHECK_EQ(st.st_size, size);
		fd = open(path, O_RDONLY);
		memset(buf, 0xAA, sizeof(buf));
		CHECK_EQ(pread(fd, buf, sizeof(buf), (off_t)(size - 12345 - 7000)),
			 19345);
		CHECK(!memcmp(buf, zero, 19345));
		close(fd);
		do_umount(mnt);
	} else {
		CHECK(!"mount");
	}
	meta_tree_free(t);
	free(c);
}

/* ------------------------------------------------------------------ */
/* Directories: many entries, long names, deep paths                    */
/* ------------------------------------------------------------------ */

static size_t big_name(int i, char *name)
{
	static const char *specials[] = { "-dash", "+plus", "!bang", " space",
					  ".-x", ".hidden", "...", ".a", "~" };
	size_t len;

	if (i < (int)ARRAY_SIZE(specials)) {
		strcpy(name, specials[i]);
		return strlen(name);
	}
	len = (size_t)snprintf(name, 256, "%05d-", i);
	/* Every 50th name is the longest allowed. */
	size_t want = i % 50 == 0 ? 255 : 6 + (size_t)(i * 37) % 120;
	for (; len < want; len++)
		name[len] = (char)('a' + (i + (int)len) % 26);
	name[len] = '\0';
	return len;
}

static void test_write_big_dir(void)
{
	enum { N = 5000, HARD = 70000 };
	char img[512], mnt[512], name[300], path[1024];
	struct meta_tree *t;
	struct meta_inode *dir, *hl, *in;
	int seen = 0;

	CHECK_EQ(meta_tree_new(&t), 0);
	dir = add(t, t->root, "big", S_IFDIR | 0755);
	for (int i = 0; i < N; i++) {
		size_t len = big_name(i, name);

		CHECK_EQ(meta_inode_new(t, i % 10 ? S_IFREG | 0644 : S_IFDIR | 0755,
					&in), 0);
		CHECK_EQ(meta_dir_link(t, dir, name, len, in), 0);
	}
	/* 70000 links to one inode: nlink needs an extended inode. */
	hl = add(t, t->root, "hl", S_IFDIR | 0755);
	in = add(t, hl, "h0", S_IFREG | 0644);
	for (int i = 1; i < HARD; i++) {
		int len = snprintf(name, sizeof(name), "h%d", i);

		CHECK_EQ(meta_dir_link(t, hl, name, (size_t)len, in), 0);
	}
	tpath(img, "bigdir.img");
	CHECK_EQ(write_image(t, NULL, img, NULL), 0);
	CHECK_EQ(fsck(img, NULL, 0), 0);
	tpath(mnt, "bigdir.mnt");
	if (do_mount(img, NULL, 0, mnt) == 0) {
		struct stat st;

		snprintf(path, sizeof(path), "%s/big", mnt);
		CHECK_EQ(stat(path, &st), 0);
		CHECK_EQ(st.st_nlink, 2 + N / 10);
		CHECK(st.st_size > 50 * BLK);
		CHECK(readdir_sorted(path, &seen));
		CHECK_EQ(seen, N + 2);
		for (int i = 0; i < N; i++) {
			big_name(i, name);
			snprintf(path, sizeof(path), "%s/big/%s", mnt, name);
			if (lstat(path, &st) < 0 ||
			    !!S_ISDIR(st.st_mode) != (i % 10 == 0)) {
				fprintf(stderr, "  lookup %s failed\n", name);
				CHECK(!"lookup");
				break;
			}
		}
		snprintf(path, sizeof(path), "%s/hl/h69999", mnt);
		CHECK_EQ(lstat(path, &st), 0);
		CHECK_EQ(st.st_nlink, HARD);
		do_umount(mnt);
	} else {
		CHECK(!"mount");
	}
	meta_tree_free(t);
}

/* 255-byte component: three digits, then 'L's. */
static void deep_name(int i, char *name)
{
	memset(name, 'L', 255);
	name[255] = '\0';
	name[0] = (char)('0' + i / 100);
	name[1] = (char)('0' + i / 10 % 10);
	name[2] = (char)('0' + i % 10);
}

static void test_write_deep(void)
{
	enum { DEPTH = 100 };
	char img[512], mnt[512], name[256];
	struct meta_tree *t;
	struct meta_inode *dir;
	int fd;

	CHECK_EQ(meta_tree_new(&t), 0);
	dir = t->root;
	for (int i = 0; i < DEPTH; i++) {
		deep_name(i, name);
		dir = add(t, dir, name, S_IFDIR | 0755);
	}
	add_file(t, dir, "bottom", "deep", 4);
	tpath(img, "deep.img");
	CHECK_EQ(write_image(t, NULL, img, NULL), 0);
	CHECK_EQ(fsck(img, NULL, 0), 0);
	tpath(mnt, "deep.mnt");
	if (do_mount(img, NULL, 0, mnt) == 0) {
		char buf[8] = "";

		/* 25 KiB of path: walk it with openat. */
		fd = open(mnt, O_PATH | O_DIRECTORY);
		for (int i = 0; fd >= 0 && i < DEPTH; i++) {
			int next;

			deep_name(i, name);
			next = openat(fd, name, O_PATH | O_DIRECTORY);
			close(fd);
			fd = next;
		}
		CHECK(fd >= 0);
		if (fd >= 0) {
			int f = openat(fd, "bottom", O_RDONLY);

			CHECK_EQ(read(f, buf, sizeof(buf)), 4);
			CHECK(!memcmp(buf, "deep", 4));
			close(f);
			close(fd);
		}
		do_umount(mnt);
	} else {
		CHECK(!"mount");
	}
	meta_tree_free(t);
}

/* ------------------------------------------------------------------ */
/* Extended attributes                                                  */
/* ------------------------------------------------------------------ */

/* A valid POSIX ACL xattr blob: u:rw, u:1000:r, g:r, m:r, o:r. */
static size_t make_acl(uint8_t *p)
{
	static const struct { uint16_t tag, perm; uint32_t id; } e[] = {
		{ 0x01, 6, 0xFFFFFFFF }, { 0x02, 4, 1000 }, { 0x04, 4, 0xFFFFFFFF },
		{ 0x10, 4, 0xFFFFFFFF }, { 0x20, 4, 0xFFFFFFFF },
	};

	put_le32(p, 2);
	for (size_t i = 0; i < ARRAY_SIZE(e); i++) {
		put_le16(p + 4 + i * 8, e[i].tag);
		put_le16(p + 6 + i * 8, e[i].perm);
		put_le32(p + 8 + i * 8, e[i].id);
	}
	return 4 + ARRAY_SIZE(e) * 8;
}

/* Every xattr of @in reads back through the kernel, and nothing else. */
static void check_xattrs(const char *path, const struct meta_inode *in)
{
	static uint8_t buf[70000];
	char list[65536];
	ssize_t n = llistxattr(path, list, sizeof(list));
	uint32_t count = 0;

	CHECK(n >= 0);
	for (ssize_t off = 0; n > 0 && off < n; off += (ssize_t)strlen(list + off) + 1)
		count++;
	CHECK_EQ(count, in->nr_xattrs);
	for (uint32_t i = 0; i < in->nr_xattrs; i++) {
		const struct meta_xattr *x = &in->xattrs[i];
		ssize_t got = lgetxattr(path, x->name, buf, sizeof(buf));

		if (got != (ssize_t)x->value_len ||
		    memcmp(buf, x->value, x->value_len)) {
			fprintf(stderr, "  %s: xattr %s: got %zd bytes, want %u\n",
				path, x->name, got, x->value_len);
			CHECK(!"xattr value");
		}
	}
}

static void test_write_xattrs(void)
{
	static uint8_t big[60000];
	const char *label = "system_u:object_r:etc_t:s0";
	/* vfs_cap_data rev 2, effective, cap_net_bind_service permitted. */
	static const uint8_t cap[20] = { 1, 0, 0, 2, 0, 4 };
	char img[512], mnt[512], path[1024], name[64], val[64];
	struct meta_inode *f[8], *xdir;
	size_t len;
	const char *names[8] = { "big", "many", "acl", "s1", "s2", "s3", "ms1", "ms2" };
	struct meta_write_stats ws;
	struct meta_tree *t;
	uint8_t acl[64];
	size_t acl_len = make_acl(acl);

	fill_pattern(big, sizeof(big), 9);
	CHECK_EQ(meta_tree_new(&t), 0);
	for (int i = 0; i < 8; i++)
		f[i] = add_file(t, t->root, names[i], "x", 1);
	f[2]->mode = S_IFDIR | 0755;
	free(f[2]->data);
	f[2]->data = NULL;
	f[2]->size = 0;
	CHECK_EQ(meta_inode_set_xattr(f[0], "user.big", big, sizeof(big)), 0);
	CHECK_EQ(meta_inode_set_xattr(f[0], "trusted.overlay.opaque", "y", 1), 0);
	CHECK_EQ(meta_inode_set_xattr(f[0], "user.empty", "", 0), 0);
	for (int i = 0; i < 200; i++) {
		snprintf(name, sizeof(name), "user.k%03d", i);
		snprintf(val, sizeof(val), "value-%.*s", i % 40, "0123456789012345678901234567890123456789");
		CHECK_EQ(meta_inode_set_xattr(f[1], name, val, (uint32_t)strlen(val)), 0);
	}
	CHECK_EQ(meta_inode_set_xattr(f[2], "system.posix_acl_access", acl,
				      (uint32_t)acl_len), 0);
	CHECK_EQ(meta_inode_set_xattr(f[2], "system.posix_acl_default", acl,
				      (uint32_t)acl_len), 0);
	for (int i = 3; i < 6; i++) {
		CHECK_EQ(meta_inode_set_xattr(f[i], "security.selinux", label,
					      (uint32_t)strlen(label) + 1), 0);
		CHECK_EQ(meta_inode_set_xattr(f[i], "security.capability",
					      cap, sizeof(cap)), 0);
	}
	CHECK_EQ(meta_inode_set_xattr(f[5], "user.only-mine", "z", 1), 0);
	/* 300 identical pairs on two inodes: at most 255 shared per inode. */
	for (int i = 0; i < 300; i++) {
		snprintf(name, sizeof(name), "user.s%03d", i);
		for (int k = 6; k < 8; k++)
			CHECK_EQ(meta_inode_set_xattr(f[k], name, "same", 4), 0);
	}
	/* A directory whose xattrs leave no room for an inline tail. */
	xdir = add(t, t->root, "xdir", S_IFDIR | 0755);
	CHECK_EQ(meta_inode_set_xattr(xdir, "user.pad", big, 4050), 0);
	for (int i = 0; i < 3; i++) {
		snprintf(name, sizeof(name), "child%d", i);
		add_file(t, xdir, name, name, strlen(name));
	}
	tpath(img, "xattr.img");
	CHECK_EQ(write_image(t, NULL, img, &ws), 0);
	CHECK_EQ(ws.shared_xattrs, 2 + 255);
	CHECK_EQ(fsck(img, NULL, 0), 0);
	tpath(mnt, "xattr.mnt");
	if (do_mount(img, NULL, 0, mnt) == 0) {
		uint8_t *b = test_read_file(img, &len);
		int n = 0;

		for (int i = 0; i < 8; i++) {
			snprintf(path, sizeof(path), "%s/%s", mnt, names[i]);
			check_xattrs(path, f[i]);
		}
		snprintf(path, sizeof(path), "%s/xdir", mnt);
		check_xattrs(path, xdir);
		CHECK(b && layout_of(b, path) == EROFS_INODE_FLAT_PLAIN);
		CHECK(readdir_sorted(path, &n));
		CHECK_EQ(n, 5);
		snprintf(path, sizeof(path), "%s/xdir/child2", mnt);
		CHECK(file_equals(path, (const uint8_t *)"child2", 6));
		free(b);
		do_umount(mnt);
	} else {
		CHECK(!"mount");
	}
	meta_tree_free(t);
}

/* ------------------------------------------------------------------ */
/* Determinism, extension payload, invalid trees, speed                 */
/* ------------------------------------------------------------------ */

/* The same content built in two insertion orders. */
static struct meta_tree *build_mixed(bool reverse)
{
	static const struct meta_chunk c[] = { { 1, 2 }, { 0, META_CHUNK_HOLE } };
	struct meta_tree *t;
	struct meta_inode *d[20];
	char name[32];

	CHECK_EQ(meta_tree_new(&t), 0);
	for (int k = 0; k < 20; k++) {
		int i = reverse ? 19 - k : k;

		snprintf(name, sizeof(name), "dir%02d", i);
		d[i] = add(t, t->root, name, S_IFDIR | 0755);
		d[i]->mtime = 1000 + i % 3;
	}
	for (int k = 0; k < 400; k++) {
		int i = reverse ? 399 - k : k;
		struct meta_inode *in;

		snprintf(name, sizeof(name), "f%03d", i);
		in = add(t, d[i % 20], name, S_IFREG | 0644);
		in->mtime = 1000 + i % 5;
		in->mtime_nsec = (uint32_t)(i % 2);
		in->uid = (uint32_t)i * 1000;
		if (i % 4 == 0)
			set_chunks(in, 0, 5000, c, 2);
		else
			set_data(in, name, strlen(name));
		CHECK_EQ(meta_inode_set_xattr(in, i % 2 ? "user.b" : "user.a",
					      "v", 1), 0);
		CHECK_EQ(meta_inode_set_xattr(in, i % 2 ? "user.a" : "user.b",
					      name, (uint32_t)(i % 7)), 0);
	}
	return t;
}

static void test_write_deterministic(void)
{
	struct meta_device dev = { "", 8 };
	struct meta_write_opts o = { .devices = &dev, .nr_devices = 1,
				     .ext = "payload", .ext_len = 7 };
	char a[512], b[512], c[512];
	struct meta_tree *t1 = build_mixed(false), *t2 = build_mixed(true);
	uint8_t *ia, *ib, *ic;
	size_t la = 0, lb = 0, lc = 0;

	memset(dev.tag, 'd', 64);
	tpath(a, "det.a");
	tpath(b, "det.b");
	tpath(c, "det.c");
	CHECK_EQ(write_image(t1, &o, a, NULL), 0);
	CHECK_EQ(write_image(t1, &o, b, NULL), 0);
	CHECK_EQ(write_image(t2, &o, c, NULL), 0);
	ia = test_read_file(a, &la);
	ib = test_read_file(b, &lb);
	ic = test_read_file(c, &lc);
	CHECK(ia && ib && ic && la == lb && la == lc);
	CHECK(ia && ib && !memcmp(ia, ib, la));
	CHECK(ia && ic && !memcmp(ia, ic, la));
	/* Another tree gives another uuid. */
	meta_inode_set_xattr(t1->root, "user.changed", "1", 1);
	CHECK_EQ(write_image(t1, &o, b, NULL), 0);
	free(ib);
	ib = test_read_file(b, &lb);
	CHECK(ia && ib && memcmp(ia + 1024 + EROFS_SB_UUID, ib + 1024 + EROFS_SB_UUID, 16));
	free(ia);
	free(ib);
	free(ic);
	meta_tree_free(t1);
	meta_tree_free(t2);
}

static void test_write_ext_payload(void)
{
	static uint8_t ext[10000];
	char img[512], mnt[512], path[1024];
	struct meta_write_opts o = { .ext = ext, .ext_len = sizeof(ext),
				     .volume_name = "fifteen-chars-x" };
	struct meta_tree *t;
	struct meta_write_stats ws;
	uint8_t *b;
	size_t len;

	fill_pattern(ext, sizeof(ext), 77);
	CHECK_EQ(meta_tree_new(&t), 0);
	add_file(t, t->root, "f", "data", 4);
	tpath(img, "ext.img");
	CHECK_EQ(write_image(t, &o, img, &ws), 0);
	b = test_read_file(img, &len);
	if (b) {
		uint64_t off = get_le64(b + FERRY_PRE_EXT_OFF);

		CHECK_EQ(len, ws.bytes);
		CHECK_EQ(off % BLK, 0);
		CHECK_EQ(get_le64(b + FERRY_PRE_EXT_LEN), sizeof(ext));
		CHECK_EQ(off + ROUND_UP(sizeof(ext), BLK), len);
		CHECK(off + sizeof(ext) <= len && !memcmp(b + off, ext, sizeof(ext)));
		CHECK_EQ(get_le32(b + FERRY_PRE_EXT_CRC),
			 erofs_crc32c(~0u, ext, sizeof(ext)));
		CHECK_EQ(get_le32(b + FERRY_PRE_CRC), erofs_crc32c(~0u, b, 0x3C));
		CHECK(!memcmp(b + 1024 + EROFS_SB_VOLUME_NAME, "fifteen-chars-x\0", 16));
		CHECK_EQ((uint64_t)get_le32(b + 1024 + EROFS_SB_BLOCKS) * BLK, len);
	}
	free(b);
	CHECK_EQ(fsck(img, NULL, 0), 0);
	tpath(mnt, "ext.mnt");
	if (do_mount(img, NULL, 0, mnt) == 0) {
		snprintf(path, sizeof(path), "%s/f", mnt);
		CHECK(file_equals(path, (const uint8_t *)"data", 4));
		do_umount(mnt);
	} else {
		CHECK(!"mount");
	}
	meta_tree_free(t);
}

/*
 * The section area follows the payload inside the extension region; the
 * preamble gives its length and crc, and the reader hands it back.
 */
static void test_write_sections(void)
{
	static uint8_t ext[3000], area[5000];
	char img[512];
	struct meta_write_opts o = { .ext = ext, .ext_len = sizeof(ext),
				     .sections = area, .sections_len = sizeof(area) };
	struct meta_image *mi = NULL;
	struct meta_tree *t;
	struct meta_write_stats ws;
	const void *got;
	uint8_t *b;
	size_t len, got_len;

	fill_pattern(ext, sizeof(ext), 5);
	fill_pattern(area, sizeof(area), 9);
	CHECK_EQ(meta_tree_new(&t), 0);
	add_file(t, t->root, "f", "data", 4);
	tpath(img, "sections.img");
	CHECK_EQ(write_image(t, &o, img, &ws), 0);
	b = test_read_file(img, &len);
	if (b) {
		uint64_t off = get_le64(b + FERRY_PRE_EXT_OFF);

		CHECK_EQ(get_le64(b + FERRY_PRE_SEC_LEN), sizeof(area));
		CHECK_EQ(get_le32(b + FERRY_PRE_SEC_CRC),
			 erofs_crc32c(~0u, area, sizeof(area)));
		CHECK_EQ(off + ROUND_UP(sizeof(ext) + sizeof(area), BLK), len);
		CHECK(!memcmp(b + off + sizeof(ext), area, sizeof(area)));
		CHECK_EQ(meta_image_open_mem(b, len, &mi), 0);
		if (mi) {
			meta_get_sections(mi, &got, &got_len);
			CHECK(got_len == sizeof(area) && !memcmp(got, area, got_len));
			CHECK_EQ(meta_get_ext(mi, &got, &got_len), 0);
			CHECK_EQ(got_len, sizeof(ext));
			meta_image_close(mi);
			mi = NULL;
		}
		/* A flipped byte in the area: the image is refused. */
		b[off + sizeof(ext) + 4321] ^= 1;
		CHECK_EQ(meta_image_open_mem(b, len, &mi), -EFSCORRUPTED);
		b[off + sizeof(ext) + 4321] ^= 1;
		/* An area running past the image, with a crc that matches it. */
		put_le64(b + FERRY_PRE_SEC_LEN, len);
		put_le32(b + FERRY_PRE_CRC, erofs_crc32c(~0u, b, FERRY_PRE_CRC));
		CHECK_EQ(meta_image_open_mem(b, len, &mi), -EFSCORRUPTED);
	}
	free(b);
	CHECK_EQ(fsck(img, NULL, 0), 0);
	/* Without an area the fields stay 0 and there is nothing to read. */
	o.sections = NULL;
	o.sections_len = 0;
	CHECK_EQ(write_image(t, &o, img, &ws), 0);
	b = test_read_file(img, &len);
	CHECK(b && !get_le64(b + FERRY_PRE_SEC_LEN) && !get_le32(b + FERRY_PRE_SEC_CRC));
	CHECK(b && meta_image_open_mem(b, len, &mi) == 0);
	if (mi) {
		meta_get_sections(mi, &got, &got_len);
		CHECK(!got && !got_len);
		meta_image_close(mi);
	}
	free(b);
	meta_tree_free(t);
}

/* Inodes reachable only from dropped or unlinked directories are not written. */
static void test_write_unreachable(void)
{
	char img[512];
	struct meta_tree *t;
	struct meta_inode *loose, *f, *d;
	struct meta_write_stats ws;

	CHECK_EQ(meta_tree_new(&t), 0);
	CHECK_EQ(meta_inode_new(t, S_IFDIR | 0755, &loose), 0);
	f = add_file(t, t->root, "f", "x", 1);
	CHECK_EQ(meta_dir_link(t, loose, "f", 1, f), 0);
	d = add(t, t->root, "d", S_IFDIR | 0755);
	add_file(t, d, "gone", "y", 1);
	CHECK_EQ(meta_dir_unlink(t, t->root, "d", 1), 0);
	tpath(img, "unreach.img");
	CHECK_EQ(write_image(t, NULL, img, &ws), 0);
	CHECK_EQ(ws.inodes, 2);
	CHECK_EQ(fsck(img, NULL, 0), 0);
	/* st_nlink counts reachable links only: dump.erofs shows "Links: 1". */
	char *out = capture("dump.erofs --path=/f %s 2>&1", img);
	CHECK(strstr(out, "Links: 1") != NULL);
	free(out);
	meta_tree_free(t);
}

typedef void (*spoil_fn)(struct meta_tree *t, struct meta_inode *f,
			 struct meta_write_opts *o);

static void spoil_prefix(struct meta_tree *t, struct meta_inode *f,
			struct meta_write_opts *o)
{
	meta_inode_set_xattr(f, "foo.bar", "1", 1);
}

static void spoil_empty_suffix(struct meta_tree *t, struct meta_inode *f,
			struct meta_write_opts *o)
{
	meta_inode_set_xattr(f, "user.", "1", 1);
}

static void spoil_long_suffix(struct meta_tree *t, struct meta_inode *f,
			struct meta_write_opts *o)
{
	char name[300] = "trusted.";

	memset(name + 8, 'n', 256);
	name[264] = '\0';
	meta_inode_set_xattr(f, name, "1", 1);
}

static void spoil_acl_suffix(struct meta_tree *t, struct meta_inode *f,
			struct meta_write_opts *o)
{
	meta_inode_set_xattr(f, "system.posix_acl_accessx", "1", 1);
}

static void spoil_system(struct meta_tree *t, struct meta_inode *f,
			struct meta_write_opts *o)
{
	meta_inode_set_xattr(f, "system.nfs4_acl", "1", 1);
}

static void spoil_big_value(struct meta_tree *t, struct meta_inode *f,
			struct meta_write_opts *o)
{
	static uint8_t v[65536];

	meta_inode_set_xattr(f, "user.v", v, sizeof(v));
}

static void spoil_xattr_total(struct meta_tree *t, struct meta_inode *f,
			struct meta_write_opts *o)
{
	static uint8_t v[60000];
	char name[24];

	for (int i = 0; i < 5; i++) {
		snprintf(name, sizeof(name), "user.%d", i);
		meta_inode_set_xattr(f, name, v, sizeof(v));
	}
}

static void set_one_chunk(struct meta_inode *f, uint16_t dev, uint32_t blk)
{
	const struct meta_chunk c = { dev, blk };

	free(f->data);
	f->data = NULL;
	set_chunks(f, 1, 8192, &c, 1);
}

static void spoil_dev0(struct meta_tree *t, struct meta_inode *f,
			struct meta_write_opts *o)
{
	set_one_chunk(f, 0, 1);
}

static void spoil_dev_range(struct meta_tree *t, struct meta_inode *f,
			struct meta_write_opts *o)
{
	set_one_chunk(f, 3, 1);
}

static void spoil_dev_end(struct meta_tree *t, struct meta_inode *f,
			struct meta_write_opts *o)
{
	set_one_chunk(f, 2, 9); /* device 2 has 10 blocks; the chunk needs 2 */
}

static void spoil_chunk_bits(struct meta_tree *t, struct meta_inode *f,
			struct meta_write_opts *o)
{
	set_one_chunk(f, 1, 0);
	f->chunk_bits = 20;
}

static void spoil_data_and_chunks(struct meta_tree *t, struct meta_inode *f,
			struct meta_write_opts *o)
{
	const struct meta_chunk c = { 1, 0 };

	set_chunks(f, 1, 8192, &c, 1);
}

static void spoil_no_data(struct meta_tree *t, struct meta_inode *f,
			struct meta_write_opts *o)
{
	free(f->data);
	f->data = NULL;
}

static void spoil_symlink(struct meta_tree *t, struct meta_inode *f,
			struct meta_write_opts *o)
{
	f->mode = S_IFLNK | 0777;
	free(f->data);
	f->data = NULL;
}

static void spoil_symlink_long(struct meta_tree *t, struct meta_inode *f,
			struct meta_write_opts *o)
{
	static uint8_t target[4096];

	memset(target, 'a', sizeof(target));
	f->mode = S_IFLNK | 0777;
	set_data(f, target, sizeof(target));
}

static void spoil_nsec(struct meta_tree *t, struct meta_inode *f,
			struct meta_write_opts *o)
{
	f->mtime_nsec = 1000000000;
}

static void spoil_rdev(struct meta_tree *t, struct meta_inode *f,
			struct meta_write_opts *o)
{
	spoil_no_data(t, f, o);
	f->size = 0;
	f->mode = S_IFCHR | 0600;
	f->rdev_major = 4096;
}

static void spoil_dir_data(struct meta_tree *t, struct meta_inode *f,
			struct meta_write_opts *o)
{
	set_data(t->root, "x", 1);
}

static void spoil_volume(struct meta_tree *t, struct meta_inode *f,
			struct meta_write_opts *o)
{
	o->volume_name = "sixteen-chars-xx";
}

static void spoil_devices(struct meta_tree *t, struct meta_inode *f,
			struct meta_write_opts *o)
{
	o->nr_devices = META_MAX_DEVICES + 1;
}

static void test_write_invalid(void)
{
	static const struct { const char *what; spoil_fn fn; } cases[] = {
		{ "prefix", spoil_prefix }, { "empty suffix", spoil_empty_suffix },
		{ "long suffix", spoil_long_suffix }, { "acl suffix", spoil_acl_suffix },
		{ "system.", spoil_system }, { "big value", spoil_big_value },
		{ "xattr total", spoil_xattr_total }, { "device 0", spoil_dev0 },
		{ "device range", spoil_dev_range }, { "device end", spoil_dev_end },
		{ "chunk bits", spoil_chunk_bits },
		{ "data and chunks", spoil_data_and_chunks },
		{ "no data", spoil_no_data }, { "symlink", spoil_symlink },
		{ "symlink long", spoil_symlink_long }, { "nsec", spoil_nsec },
		{ "rdev", spoil_rdev }, { "dir data", spoil_dir_data },
		{ "volume", spoil_volume }, { "devices", spoil_devices },
	};
	struct meta_device devs[2] = { { "", 10 }, { "", 10 } };
	char img[512], log[512];
	int saved = dup(2);

	tpath(img, "invalid.img");
	tpath(log, "invalid.log");
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		struct meta_write_opts o = { .devices = devs, .nr_devices = 2 };
		struct meta_tree *t;
		struct meta_inode *d, *f;
		char *msg;
		size_t len = 0;
		int fd = open(log, O_RDWR | O_CREAT | O_TRUNC, 0644);
		int ret;

		CHECK_EQ(meta_tree_new(&t), 0);
		d = add(t, t->root, "dir", S_IFDIR | 0755);
		f = add_file(t, d, "file", "0123456789", 10);
		cases[i].fn(t, f, &o);
		/* The message names the offending path. */
		fflush(stderr);
		dup2(fd, 2);
		ret = write_image(t, &o, img, NULL);
		fflush(stderr);
		dup2(saved, 2);
		close(fd);
		msg = (char *)test_read_file(log, &len);
		if (msg)
			msg[len] = '\0';
		if (ret != -EINVAL)
			fprintf(stderr, "  case %s: %d\n", cases[i].what, ret);
		CHECK_EQ(ret, -EINVAL);
		/* A failed write leaves the tree reusable. */
		if (cases[i].fn == spoil_prefix) {
			meta_inode_clear_xattrs(f);
			CHECK_EQ(write_image(t, &o, img, NULL), 0);
		}
		if (cases[i].fn == spoil_dir_data)
			CHECK(msg && strstr(msg, "write /: "));
		else if (cases[i].fn != spoil_volume && cases[i].fn != spoil_devices)
			CHECK(msg && strstr(msg, "/dir/file"));
		free(msg);
		meta_tree_free(t);
	}
	close(saved);
}

static void test_write_bad_fd(void)
{
	struct meta_tree *t;
	char img[512];
	int fd;

	CHECK_EQ(meta_tree_new(&t), 0);
	add_file(t, t->root, "f", "x", 1);
	tpath(img, "badfd.img");
	fd = open(img, O_RDONLY | O_CREAT, 0644);
	CHECK_EQ(meta_write(t, NULL, fd, NULL), -EBADF);
	close(fd);
	meta_tree_free(t);
}

/* A Debian-sized tree (~10k entries) must write in well under 100 ms. */
static void test_write_speed(void)
{
	const struct meta_chunk c = { 1, 0 };
	struct meta_device dev = { "", 1 << 20 };
	struct meta_write_opts o = { .devices = &dev, .nr_devices = 1 };
	char img[512], name[64];
	struct meta_write_stats ws;
	struct meta_tree *t;
	uint64_t t0, ns;

	memset(dev.tag, '0', 64);
	CHECK_EQ(meta_tree_new(&t), 0);
	for (int i = 0; i < 500; i++) {
		struct meta_inode *d;

		snprintf(name, sizeof(name), "usr-share-%d", i);
		d = add(t, t->root, name, S_IFDIR | 0755);
		for (int k = 0; k < 20; k++) {
			struct meta_inode *in;
			int len = snprintf(name, sizeof(name), "file-%d-%d.so.1", i, k);

			in = add(t, d, name, k % 5 ? S_IFREG | 0644 : S_IFLNK | 0777);
			if (k % 5 == 0)
				set_data(in, name, (size_t)len);
			else if (k % 2)
				set_chunks(in, 0, 3000, &c, 1);
			else
				set_data(in, name, (size_t)len);
			if (k % 3 == 0)
				meta_inode_set_xattr(in, "security.selinux",
						     "system_u:object_r:lib_t:s0", 27);
		}
	}
	tpath(img, "speed.img");
	t0 = ferry_now_ns();
	CHECK_EQ(write_image(t, &o, img, &ws), 0);
	ns = ferry_now_ns() - t0;
	fprintf(stderr, "  %llu inodes, %llu bytes written in %.1f ms\n",
		(unsigned long long)ws.inodes, (unsigned long long)ws.bytes,
		(double)ns / 1e6);
	CHECK_EQ(ws.inodes, 10501);
	/* Generous: this also runs under ASan. */
	CHECK(ns < 1000000000ull);
	meta_tree_free(t);
}

int main(void)
{
	snprintf(top, sizeof(top), "/tmp/ferry-test-writer-XXXXXX");
	if (!mkdtemp(top)) {
		perror("mkdtemp");
		return 1;
	}
	RUN_TEST(test_crc32c);
	RUN_TEST(test_tree_ops);
	RUN_TEST(test_tree_deep_drop);
	RUN_TEST(test_tree_big_dir);
	RUN_TEST(test_write_empty_tree);
	RUN_TEST(test_write_all_types);
	RUN_TEST(test_write_inline_sweep);
	RUN_TEST(test_write_chunked);
	RUN_TEST(test_write_many_devices);
	RUN_TEST(test_write_sparse_4g);
	RUN_TEST(test_write_big_dir);
	RUN_TEST(test_write_deep);
	RUN_TEST(test_write_xattrs);
	RUN_TEST(test_write_deterministic);
	RUN_TEST(test_write_ext_payload);
	RUN_TEST(test_write_sections);
	RUN_TEST(test_write_unreachable);
	RUN_TEST(test_write_invalid);
	RUN_TEST(test_write_bad_fd);
	RUN_TEST(test_write_speed);
	if (!getenv("FERRY_KEEP_TMP"))
		test_run("rm -rf %s", top);
	TEST_MAIN_END();
}
