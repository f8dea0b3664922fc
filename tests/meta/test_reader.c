// SPDX-License-Identifier: MIT
/*
 * Bootstrap reader and kernel mount, checked against an independent
 * oracle: mkfs.erofs (erofs-utils) builds images from a source tree made
 * here, and the reader must give back exactly what lstat, readlink,
 * listxattr, getxattr, read and readdir say about that tree. Then damaged
 * and truncated copies must fail cleanly (the fuzz target's walker, which
 * this file includes, drives every operation over them).
 */
#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdarg.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "../test.h"
#include "../../pkg-meta/internal.h"
#include "../fuzz/fuzz_meta.c"

#define CHUNK_SIZE 65536u
#define TINY_CHUNK_SIZE 4096u
#define MANY_ENTRIES 3000
#define FIXED_TIME 1600000000

static char tmp_dir[] = "/tmp/ferry-test-reader.XXXXXX";
/*
 * The full tree has every kind of inode, thousands of entries and
 * multi-chunk files; the tiny one (images under 16 KiB) is for the
 * exhaustive damage loops and the fuzz seeds.
 */
static char src[256], tiny_src[256];
/* Short buffers for paths under tmp_dir, PATH_MAX for paths built on them. */
static char plain_img[256], fixed_img[256], chunked_img[256], blob_path[256];
static char tiny_plain_img[256], tiny_chunked_img[256], tiny_blob_path[256];
static bool have_images;
static const char *tree; /* the source tree being built or compared */

/* ------------------------------------------------------------------ */
/* Helpers                                                             */
/* ------------------------------------------------------------------ */


static void spath(char *out, const char *rel)
{
	snprintf(out, PATH_MAX, "%s/%s", tree, rel);
}

static void make_file(const char *rel, const void *data, size_t len, mode_t mode)
{
	char p[PATH_MAX];
	int fd;

	spath(p, rel);
	fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, mode);
	CHECK(fd >= 0);
	if (fd < 0)
		return;
	CHECK(write_full(fd, data, len) == 0);
	CHECK(fchmod(fd, mode) == 0);
	close(fd);
}

static void make_dir(const char *rel, mode_t mode)
{
	char p[PATH_MAX];

	spath(p, rel);
	CHECK(mkdir(p, mode) == 0);
	CHECK(chmod(p, mode) == 0);
}

static void make_node(const char *rel, mode_t mode, dev_t dev)
{
	char p[PATH_MAX];

	spath(p, rel);
	CHECK(mknod(p, mode, dev) == 0);
}

static void set_xattr(const char *rel, const char *name, const void *value,
		      size_t len)
{
	char p[PATH_MAX];

	spath(p, rel);
	CHECK(lsetxattr(p, name, value, len, 0) == 0);
}

static uint64_t pseudo_random(uint64_t *state)
{
	*state = *state * 6364136223846793005ull + 1442695040888963407ull;
	return *state >> 33;
}

static unsigned int mtime_counter;

/* Distinct mtimes with nanoseconds; children first, so dirs keep theirs. */
static int set_mtime(const char *path, const struct stat *sb, int flag,
		     struct FTW *ftw)
{
	struct timespec ts[2];

	mtime_counter++;
	ts[0].tv_sec = ts[1].tv_sec = 1500000000 + (time_t)mtime_counter * 7919;
	ts[0].tv_nsec = ts[1].tv_nsec =
		mtime_counter % 5 ? (long)(mtime_counter * 123456789u % 1000000000u) : 0;
	return utimensat(AT_FDCWD, path, ts, AT_SYMLINK_NOFOLLOW);
}

static int remove_one(const char *path, const struct stat *sb, int flag,
		      struct FTW *ftw)
{
	return remove(path);
}

static void build_full_tree(void)
{
	static uint8_t big[3 * CHUNK_SIZE + 1000], attr[3000];
	char name[300], target[4001], p[PATH_MAX], q[PATH_MAX];
	uint64_t rnd = 42;
	size_t i;

	for (i = 0; i < sizeof(big); i++)
		big[i] = (uint8_t)pseudo_random(&rnd);
	make_file("inline3000", big, 3000, 0600);
	make_file("page", big, 4096, 0644);
	make_file("block_and_tail", big, 4096 + 100, 0644);
	/* A zero chunk in the middle. */
	memset(big + CHUNK_SIZE, 0, CHUNK_SIZE);
	make_file("multi", big, sizeof(big), 0755);
	make_file("big_ids", "x", 1, 0640);
	spath(p, "big_ids");
	CHECK(lchown(p, 100000, 200000) == 0);
	make_dir("modes", 0755);
	make_file("modes/suid", "s", 1, 04755);
	make_file("modes/sgid", "s", 1, 02711);
	make_dir("modes/sticky", 01777);
	make_dir("modes/private", 0700);
	spath(p, "small");
	spath(q, "modes/small.hardlink2");
	CHECK(link(p, q) == 0);

	memset(target, 'a', 4000);
	for (i = 50; i < 4000; i += 50)
		target[i] = '/';
	target[4000] = '\0';
	spath(p, "sym_long");
	CHECK(symlink(target, p) == 0);
	make_node("sock", S_IFSOCK | 0755, 0);
	make_node("whiteout", S_IFCHR | 0000, makedev(0, 0));
	make_node("bigdev", S_IFCHR | 0600, makedev(300, 70000));

	make_file("xattrs/all", "data", 4, 0644);
	set_xattr("xattrs/all", "trusted.t", "tv", 2);
	set_xattr("xattrs/all", "security.s", "sv", 2);
	set_xattr("xattrs/all", "user.empty", "", 0);
	memset(attr, 'v', sizeof(attr));
	set_xattr("xattrs/all", "user.big", attr, sizeof(attr));

	make_dir("many", 0755);
	for (i = 0; i < MANY_ENTRIES; i++) {
		int n = snprintf(name, sizeof(name), "many/entry-%05zu", i);

		if (i % 7 == 0) { /* longer names vary the packing */
			memset(name + n, 'x', i % 200);
			name[n + i % 200] = '\0';
		}
		make_file(name, "", 0, 0644);
	}
	/* mkfs.erofs 1.5 fails on 255-byte names ("Could not format"). */
	memset(name, 'L', 254);
	name[254] = '\0';
	make_file(name, "long name", 9, 0644);
	make_file("!bang", "", 0, 0644); /* sorts before "." */
	make_file("-dash", "", 0, 0644);
	make_file("\xc3\xa9t\xc3\xa9", "", 0, 0644);
	make_dir("deep/a/b", 0755);
	make_dir("deep/a/b/c", 0755);
	make_file("deep/a/b/c/file", "deep", 4, 0644);
	make_dir("emptydir", 0750);
	make_dir("names", 0755);
	make_file("names/a-x", "", 0, 0644);
	make_file("names/b", "", 0, 0644);
}

/* The tiny tree; the full one adds build_full_tree() to it. */
static void build_tree(const char *root, bool full)
{
	static uint8_t data[TINY_CHUNK_SIZE + 900];
	char name[64], p[PATH_MAX], q[PATH_MAX];
	uint64_t rnd = 7;
	size_t i;

	tree = root;
	CHECK(mkdir(root, 0755) == 0);
	make_file("empty", "", 0, 0644);
	make_file("small", "hello world\n", 12, 0644);
	set_xattr("small", "user.greeting", "hi", 2);
	spath(p, "small");
	CHECK(lchown(p, 1000, 1001) == 0);
	spath(q, "small.hardlink");
	CHECK(link(p, q) == 0);
	spath(p, "sym_short");
	CHECK(symlink("small", p) == 0);
	for (i = 0; i < sizeof(data); i++)
		data[i] = (uint8_t)pseudo_random(&rnd);
	make_file("two_chunks", data, sizeof(data), 0644);
	make_node("fifo", S_IFIFO | 0644, 0);
	make_node("null", S_IFCHR | 0666, makedev(1, 3));
	make_node("sda1", S_IFBLK | 0660, makedev(8, 1));
	make_dir("xattrs", 0755);
	set_xattr("xattrs", "trusted.overlay.opaque", "y", 1);
	/* On more inodes than mkfs.erofs -x2 tolerates: shared xattrs. */
	for (i = 0; i < 4; i++) {
		snprintf(name, sizeof(name), "xattrs/shared%zu", i);
		make_file(name, name, strlen(name), 0644);
		set_xattr(name, "user.shared", "same value", 10);
		set_xattr(name, "trusted.shared", "another", 7);
	}
	make_dir("deep", 0755);
	make_dir("deep/a", 0755);
	make_file("deep/a/file", "deep", 4, 0644);
	if (full)
		build_full_tree();
	mtime_counter = 0;
	CHECK(nftw(root, set_mtime, 16, FTW_DEPTH | FTW_PHYS) == 0);
}

static void setup(void)
{
	CHECK(mkdtemp(tmp_dir) != NULL);
	snprintf(src, sizeof(src), "%s/src", tmp_dir);
	snprintf(tiny_src, sizeof(tiny_src), "%s/tiny", tmp_dir);
	build_tree(src, true);
	build_tree(tiny_src, false);
	snprintf(tiny_plain_img, sizeof(tiny_plain_img), "%s/tiny.erofs", tmp_dir);
	snprintf(tiny_chunked_img, sizeof(tiny_chunked_img), "%s/tiny-chunked.erofs",
		 tmp_dir);
	snprintf(tiny_blob_path, sizeof(tiny_blob_path), "%s/tiny-blob", tmp_dir);
	snprintf(plain_img, sizeof(plain_img), "%s/plain.erofs", tmp_dir);
	snprintf(fixed_img, sizeof(fixed_img), "%s/fixed.erofs", tmp_dir);
	snprintf(chunked_img, sizeof(chunked_img), "%s/chunked.erofs", tmp_dir);
	snprintf(blob_path, sizeof(blob_path), "%s/blob", tmp_dir);
	/* erofs-utils 1.5 has no -b: its block size is the page size (4 KiB). */
	have_images =
		!test_run("mkfs.erofs --quiet '%s' '%s' >/dev/null", plain_img, src) &&
		!test_run("mkfs.erofs --quiet -T %d '%s' '%s' >/dev/null", FIXED_TIME,
		     fixed_img, src) &&
		!test_run("mkfs.erofs --quiet --chunksize=%u --blobdev='%s' '%s' '%s' >/dev/null 2>&1",
		     CHUNK_SIZE, blob_path, chunked_img, src) &&
		!test_run("mkfs.erofs --quiet '%s' '%s' >/dev/null", tiny_plain_img,
		     tiny_src) &&
		!test_run("mkfs.erofs --quiet --chunksize=%u --blobdev='%s' '%s' '%s' >/dev/null 2>&1",
		     TINY_CHUNK_SIZE, tiny_blob_path, tiny_chunked_img, tiny_src);
	CHECK(have_images);
}

static struct meta_image *open_image(const char *path)
{
	struct meta_image *img = NULL;

	CHECK_EQ(meta_image_open(path, &img), 0);
	return img;
}

/* ------------------------------------------------------------------ */
/* Comparing an image with the source tree                             */
/* ------------------------------------------------------------------ */

struct compare {
	struct meta_image *img;
	uint8_t *raw; /* the image file, to look at on-disk details */
	size_t raw_len;
	const uint8_t *blob;
	size_t blob_len;
	bool fixed_time;
	uint32_t chunk_size;
	unsigned int inodes, chunks, inline_files, extended, shared_xattrs;
};

struct dir_list {
	size_t nr;
	uint64_t dot, dotdot;
	char names[MANY_ENTRIES + 64][256];
	uint8_t types[MANY_ENTRIES + 64];
	uint64_t nids[MANY_ENTRIES + 64];
};

static int collect(void *ctx, const char *name, size_t len, uint64_t nid,
		   unsigned int file_type, uint64_t next_pos)
{
	struct dir_list *l = ctx;

	if (len == 1 && name[0] == '.') {
		l->dot = nid;
		return 0;
	}
	if (len == 2 && !memcmp(name, "..", 2)) {
		l->dotdot = nid;
		return 0;
	}
	if (l->nr >= ARRAY_SIZE(l->names) || len > 255)
		return -E2BIG;
	memcpy(l->names[l->nr], name, len);
	l->names[l->nr][len] = '\0';
	l->types[l->nr] = (uint8_t)file_type;
	l->nids[l->nr++] = nid;
	return 0;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sorted NUL-separated names of @buf (@len bytes) into @out; count. */
static size_t split_names(char *buf, size_t len, char **out, size_t max)
{
	size_t n = 0, off;

	for (off = 0; off < len && n < max; off += strlen(buf + off) + 1)
		out[n++] = buf + off;
	qsort(out, n, sizeof(*out), cmp_str);
	return n;
}

static void compare_xattrs(struct compare *c, const char *path, uint64_t nid)
{
	static char want[65536], got[65536], wval[65536], gval[65536];
	char *wn[64], *gn[64];
	ssize_t wl, gl, wv, gv;
	size_t nw, ng, i;

	wl = llistxattr(path, want, sizeof(want));
	gl = meta_listxattr(c->img, nid, got, sizeof(got));
	CHECK(wl >= 0);
	CHECK_EQ(gl, wl);
	CHECK_EQ(meta_listxattr(c->img, nid, NULL, 0), wl);
	if (wl > 0)
		CHECK_EQ(meta_listxattr(c->img, nid, got, (size_t)wl - 1), -ERANGE);
	if (gl != wl || wl < 0)
		return;
	nw = split_names(want, (size_t)wl, wn, ARRAY_SIZE(wn));
	ng = split_names(got, (size_t)gl, gn, ARRAY_SIZE(gn));
	CHECK_EQ(ng, nw);
	for (i = 0; i < nw && i < ng; i++) {
		CHECK(!strcmp(wn[i], gn[i]));
		wv = lgetxattr(path, wn[i], wval, sizeof(wval));
		gv = meta_getxattr(c->img, nid, wn[i], gval, sizeof(gval));
		CHECK_EQ(gv, wv);
		CHECK(gv < 0 || !memcmp(wval, gval, (size_t)gv));
		CHECK_EQ(meta_getxattr(c->img, nid, wn[i], NULL, 0), wv);
		if (wv > 1)
			CHECK_EQ(meta_getxattr(c->img, nid, wn[i], gval, (size_t)wv - 1),
				 -ERANGE);
	}
	CHECK_EQ(meta_getxattr(c->img, nid, "user.absent", gval, sizeof(gval)),
		 -ENODATA);
	CHECK_EQ(meta_getxattr(c->img, nid, "user.", gval, sizeof(gval)), -ENODATA);
	CHECK_EQ(meta_getxattr(c->img, nid, "unknown.ns", gval, sizeof(gval)),
		 -ENODATA);
}

static void compare_chunks(struct compare *c, const struct meta_stat *ms,
			   const uint8_t *data)
{
	struct meta_chunk ch;
	uint64_t i, off, len;
	static const uint8_t zero[CHUNK_SIZE];

	CHECK_EQ(ms->chunk_size, c->chunk_size);
	CHECK_EQ(ms->nr_chunks, DIV_ROUND_UP(ms->size, c->chunk_size));
	for (i = 0; i < ms->nr_chunks; i++) {
		off = i * ms->chunk_size;
		len = MIN(ms->chunk_size, ms->size - off);
		CHECK_EQ(meta_get_chunk(c->img, ms->nid, i, &ch), 0);
		c->chunks++;
		if (ch.blkaddr == META_CHUNK_HOLE) {
			CHECK_EQ(ch.device_id, 0);
			CHECK(!memcmp(data + off, zero, len));
			continue;
		}
		CHECK_EQ(ch.device_id, 1);
		CHECK((uint64_t)ch.blkaddr * 4096 + len <= c->blob_len);
		if ((uint64_t)ch.blkaddr * 4096 + len <= c->blob_len)
			CHECK(!memcmp(c->blob + (uint64_t)ch.blkaddr * 4096,
				      data + off, len));
	}
	CHECK_EQ(meta_get_chunk(c->img, ms->nid, ms->nr_chunks, &ch), -EINVAL);
	CHECK_EQ(meta_read(c->img, ms->nid, 0, &ch, 1), -EINVAL);
}

static void compare_data(struct compare *c, const char *path,
			 const struct meta_stat *ms)
{
	static uint8_t got[4 * CHUNK_SIZE];
	uint8_t *want;
	size_t len, off;
	ssize_t n;

	want = test_read_file(path, &len);
	CHECK(want != NULL);
	if (!want)
		return;
	CHECK_EQ(ms->size, len);
	if (ms->layout == EROFS_INODE_CHUNK_BASED) {
		CHECK(c->blob != NULL);
		if (c->blob)
			compare_chunks(c, ms, want);
		free(want);
		return;
	}
	if (ms->layout == EROFS_INODE_FLAT_INLINE)
		c->inline_files++;
	CHECK(len <= sizeof(got));
	n = meta_read(c->img, ms->nid, 0, got, sizeof(got));
	CHECK_EQ(n, len);
	CHECK(n < 0 || !memcmp(got, want, (size_t)n));
	/* Odd-sized pieces cross block and tail boundaries. */
	memset(got, 0, sizeof(got));
	for (off = 0; off < len; off += 999) {
		n = meta_read(c->img, ms->nid, off, got + off, 999);
		CHECK_EQ(n, MIN(999, len - off));
	}
	CHECK(!memcmp(got, want, len));
	CHECK_EQ(meta_read(c->img, ms->nid, len, got, 10), 0);
	CHECK_EQ(meta_read(c->img, ms->nid, len + 12345, got, 10), 0);
	free(want);
}

static void compare_inode(struct compare *c, const char *path, uint64_t nid,
			  uint64_t parent);

static void compare_dir(struct compare *c, const char *path, uint64_t nid,
			uint64_t parent)
{
	struct dir_list *l = calloc(1, sizeof(*l));
	char *names[MANY_ENTRIES + 64], child[PATH_MAX];
	size_t nr = 0, i;
	struct dirent *de;
	uint64_t found;
	struct meta_stat cst;
	DIR *d;

	CHECK(l != NULL);
	if (!l)
		return;
	CHECK_EQ(meta_readdir(c->img, nid, 0, collect, l), 0);
	CHECK_EQ(l->dot, nid);
	CHECK_EQ(l->dotdot, parent);
	d = opendir(path);
	CHECK(d != NULL);
	while (d && (de = readdir(d)) && nr < ARRAY_SIZE(names))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
			names[nr++] = strdup(de->d_name);
	if (d)
		closedir(d);
	qsort(names, nr, sizeof(*names), cmp_str);
	CHECK_EQ(l->nr, nr);
	for (i = 0; i < nr && i < l->nr; i++) {
		CHECK(!strcmp(names[i], l->names[i]));
		CHECK_EQ(meta_lookup(c->img, nid, l->names[i], strlen(l->names[i]),
				     &found), 0);
		CHECK_EQ(found, l->nids[i]);
		snprintf(child, sizeof(child), "%s/%s", path, names[i]);
		CHECK_EQ(meta_getattr(c->img, l->nids[i], &cst), 0);
		CHECK_EQ(l->types[i], erofs_ftype_of_mode(cst.mode));
		compare_inode(c, child, l->nids[i], nid);
	}
	CHECK_EQ(meta_lookup(c->img, nid, ".", 1, &found), 0);
	CHECK_EQ(found, nid);
	CHECK_EQ(meta_lookup(c->img, nid, "..", 2, &found), 0);
	CHECK_EQ(found, parent);
	CHECK_EQ(meta_lookup(c->img, nid, "zzzz-absent", 11, &found), -ENOENT);
	CHECK_EQ(meta_lookup(c->img, nid, "\x01", 1, &found), -ENOENT);
	CHECK_EQ(meta_lookup(c->img, nid, "", 0, &found), -ENOENT);
	for (i = 0; i < nr; i++)
		free(names[i]);
	free(l);
}

static void compare_inode(struct compare *c, const char *path, uint64_t nid,
			  uint64_t parent)
{
	struct meta_stat ms;
	struct stat st;
	char want[4096], got[4096];
	ssize_t wl;

	c->inodes++;
	CHECK_EQ(lstat(path, &st), 0);
	CHECK_EQ(meta_getattr(c->img, nid, &ms), 0);
	CHECK_EQ(ms.nid, nid);
	CHECK_EQ(ms.mode, st.st_mode);
	CHECK_EQ(ms.uid, st.st_uid);
	CHECK_EQ(ms.gid, st.st_gid);
	CHECK_EQ(ms.nlink, st.st_nlink);
	if (c->fixed_time) {
		CHECK_EQ(ms.mtime, FIXED_TIME);
		CHECK_EQ(ms.mtime_nsec, 0);
		/* Only ids above 16 bits need the 64-byte form. */
		CHECK_EQ(ms.extended, st.st_uid > 0xffff || st.st_gid > 0xffff);
	} else {
		CHECK_EQ(ms.mtime, st.st_mtim.tv_sec);
		CHECK_EQ(ms.mtime_nsec, st.st_mtim.tv_nsec);
	}
	c->extended += ms.extended;
	{
		size_t pos = (size_t)get_le32(c->raw + 1024 + EROFS_SB_META_BLKADDR) *
				     4096 + nid * 32 + (ms.extended ? 64 : 32);

		if (get_le16(c->raw + pos - (ms.extended ? 64 : 32) +
			     EROFS_I_XATTR_ICOUNT))
			c->shared_xattrs += c->raw[pos + 4];
	}
	if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) {
		CHECK_EQ(ms.rdev_major, major(st.st_rdev));
		CHECK_EQ(ms.rdev_minor, minor(st.st_rdev));
	}
	if (S_ISREG(st.st_mode) || S_ISLNK(st.st_mode))
		CHECK_EQ(ms.size, st.st_size);
	if (!S_ISLNK(st.st_mode))
		CHECK_EQ(meta_readlink(c->img, nid, got, sizeof(got)), -EINVAL);
	compare_xattrs(c, path, nid);
	if (S_ISLNK(st.st_mode)) {
		wl = readlink(path, want, sizeof(want) - 1);
		CHECK(wl > 0);
		CHECK_EQ(meta_readlink(c->img, nid, got, sizeof(got)), wl);
		CHECK(wl > 0 && !memcmp(got, want, (size_t)wl) && !got[wl]);
		CHECK_EQ(meta_readlink(c->img, nid, got, (size_t)wl), -ERANGE);
	} else if (S_ISREG(st.st_mode)) {
		compare_data(c, path, &ms);
	} else if (S_ISDIR(st.st_mode)) {
		compare_dir(c, path, nid, parent);
	}
}

/* Every path of the source tree resolves to the nid readdir reported. */
static struct meta_image *resolve_img;

static int resolve_one(const char *path, const struct stat *sb, int flag,
		       struct FTW *ftw)
{
	uint64_t nid, again;
	char alt[PATH_MAX];
	struct meta_stat ms;
	const char *rel = path + strlen(tree);

	CHECK_EQ(meta_resolve(resolve_img, rel, &nid), 0);
	CHECK_EQ(meta_getattr(resolve_img, nid, &ms), 0);
	CHECK_EQ(ms.mode, sb->st_mode);
	CHECK_EQ(ms.nlink, sb->st_nlink);
	/* Root-relative, doubled slashes and "." name the same inode. */
	snprintf(alt, sizeof(alt), ".//%s%s", rel[0] ? rel + 1 : "",
		 S_ISDIR(sb->st_mode) ? "/." : "");
	CHECK_EQ(meta_resolve(resolve_img, alt, &again), 0);
	CHECK_EQ(again, nid);
	return 0;
}

/* @blob is the chunked image's device, NULL for a plain image. */
static void compare_image(const char *path, const char *root, const char *blob,
			  uint32_t chunk_size, bool fixed_time, struct compare *c)
{
	struct meta_super sb;
	size_t blob_len = 0;
	uint8_t *blob_data = NULL;

	memset(c, 0, sizeof(*c));
	c->img = open_image(path);
	c->raw = test_read_file(path, &c->raw_len);
	CHECK(c->raw != NULL);
	if (!c->img || !c->raw) {
		meta_image_close(c->img);
		free(c->raw);
		return;
	}
	if (blob) {
		blob_data = test_read_file(blob, &blob_len);
		CHECK(blob_data != NULL);
	}
	c->blob = blob_data;
	c->blob_len = blob_len;
	c->chunk_size = chunk_size;
	c->fixed_time = fixed_time;
	tree = root;
	meta_get_super(c->img, &sb);
	compare_inode(c, root, sb.root_nid, sb.root_nid);
	resolve_img = c->img;
	CHECK_EQ(nftw(root, resolve_one, 16, FTW_PHYS), 0);
	meta_image_close(c->img);
	free(c->raw);
	free(blob_data);
}

/* ------------------------------------------------------------------ */
/* Tests against mkfs.erofs images                                     */
/* ------------------------------------------------------------------ */

static void test_plain_image_matches_source(void)
{
	struct compare c;
	struct meta_super sb;
	struct meta_image *img;
	const void *ext;
	size_t ext_len;

	compare_image(plain_img, src, NULL, 0, false, &c);
	CHECK(c.inodes > MANY_ENTRIES);
	CHECK(c.inline_files > 0);
	CHECK(c.extended > 0);
	CHECK(c.shared_xattrs >= 8);
	compare_image(tiny_plain_img, tiny_src, NULL, 0, false, &c);
	CHECK(c.inodes > 10);
	img = open_image(plain_img);
	if (!img)
		return;
	meta_get_super(img, &sb);
	CHECK_EQ(sb.nr_devices, 0);
	CHECK_EQ(sb.feature_incompat, 0);
	CHECK(sb.feature_compat & EROFS_FEATURE_COMPAT_SB_CHKSUM);
	CHECK_EQ(meta_get_ext(img, &ext, &ext_len), -ENODATA);
	meta_image_close(img);
}

static void test_fixed_time_compact_inodes(void)
{
	struct compare c;

	compare_image(fixed_img, src, NULL, 0, true, &c);
	CHECK(c.inodes > MANY_ENTRIES);
	CHECK_EQ(c.extended, 1); /* big_ids */
}

static void test_chunked_image_matches_blob(void)
{
	struct compare c;
	struct meta_super sb;
	struct meta_device_info dev;
	struct meta_image *img;

	compare_image(chunked_img, src, blob_path, CHUNK_SIZE, false, &c);
	CHECK(c.inodes > MANY_ENTRIES);
	CHECK(c.chunks >= 6);
	compare_image(tiny_chunked_img, tiny_src, tiny_blob_path, TINY_CHUNK_SIZE,
		      false, &c);
	CHECK(c.chunks > 2);
	img = open_image(chunked_img);
	if (!img)
		return;
	meta_get_super(img, &sb);
	CHECK_EQ(sb.nr_devices, 1);
	CHECK_EQ(sb.feature_incompat, EROFS_FEATURE_INCOMPAT_FERRY);
	CHECK_EQ(meta_get_device(img, 1, &dev), 0);
	CHECK_EQ(dev.uniaddr, 0);
	CHECK_EQ(meta_get_device(img, 0, &dev), -ENOENT);
	CHECK_EQ(meta_get_device(img, 2, &dev), -ENOENT);
	meta_image_close(img);
}

static void test_open_mem_and_errors(void)
{
	struct meta_image *img = NULL, *img2 = NULL;
	struct meta_super a, b;
	struct meta_stat st;
	uint64_t nid, small;
	uint8_t *buf;
	size_t len;
	char link[64];

	buf = test_read_file(plain_img, &len);
	CHECK(buf != NULL);
	if (!buf)
		return;
	CHECK_EQ(meta_image_open_mem(buf, len, &img), 0);
	img2 = open_image(plain_img);
	if (img && img2) {
		meta_get_super(img, &a);
		meta_get_super(img2, &b);
		CHECK(!memcmp(&a, &b, sizeof(a)));
		CHECK_EQ(a.image_bytes, len);
		CHECK_EQ(meta_resolve(img, "/small", &small), 0);
		CHECK_EQ(meta_resolve(img, "small.hardlink", &nid), 0);
		CHECK_EQ(nid, small);
		CHECK_EQ(meta_getattr(img, nid, &st), 0);
		CHECK_EQ(st.nlink, 3);
		CHECK_EQ(meta_resolve(img, "/small/x", &nid), -ENOTDIR);
		CHECK_EQ(meta_resolve(img, "/nope/x", &nid), -ENOENT);
		CHECK_EQ(meta_resolve(img, "/deep/a/b/../..", &nid), 0);
		CHECK_EQ(meta_resolve(img, "/deep", &small), 0);
		CHECK_EQ(nid, small);
		CHECK_EQ(meta_resolve(img, "/", &nid), 0);
		CHECK_EQ(nid, a.root_nid);
		CHECK_EQ(meta_resolve(img, "", &nid), 0);
		CHECK_EQ(nid, a.root_nid);
		CHECK_EQ(meta_lookup(img, small, "a/b", 3, &nid), -ENOENT);
		CHECK_EQ(meta_resolve(img, "/small", &small), 0);
		CHECK_EQ(meta_lookup(img, small, "x", 1, &nid), -ENOTDIR);
		CHECK_EQ(meta_readdir(img, small, 0, collect, NULL), -ENOTDIR);
		CHECK_EQ(meta_readlink(img, small, link, sizeof(link)), -EINVAL);
		CHECK_EQ(meta_get_chunk(img, small, 0, NULL), -EINVAL);
		{
			char longname[300];

			memset(longname, 'L', 256);
			CHECK_EQ(meta_lookup(img, a.root_nid, longname, 256, &nid),
				 -ENAMETOOLONG);
			CHECK_EQ(meta_lookup(img, a.root_nid, longname, 255, &nid),
				 -ENOENT);
			CHECK_EQ(meta_lookup(img, a.root_nid, longname, 254, &nid), 0);
		}
	}
	meta_image_close(img);
	meta_image_close(img2);
	CHECK_EQ(meta_image_open("/nonexistent/bootstrap", &img), -ENOENT);
	CHECK_EQ(meta_image_open(tmp_dir, &img), -EINVAL);
	free(buf);
}

/* Stop after every @step entries and resume from the cookie. */
struct resume {
	unsigned int step, seen_in_call, total;
	uint64_t next;
	char last[256];
	bool order_ok;
};

static int resume_fill(void *ctx, const char *name, size_t len, uint64_t nid,
		       unsigned int file_type, uint64_t next_pos)
{
	struct resume *r = ctx;
	char cur[256];

	memcpy(cur, name, len);
	cur[len] = '\0';
	if (r->total && strcmp(r->last, cur) >= 0)
		r->order_ok = false;
	strcpy(r->last, cur);
	r->total++;
	r->next = next_pos;
	return ++r->seen_in_call == r->step ? 1 : 0;
}

/* A tree of symlinks for meta_resolve_follow, made into its own image. */
static void make_link(const char *rel, const char *target)
{
	char p[PATH_MAX];

	spath(p, rel);
	CHECK(symlink(target, p) == 0);
}

/* meta_resolve_follow(@path) is the nid meta_resolve gives for @want. */
static void expect_follow(const struct meta_image *img, const char *path,
			  const char *want)
{
	uint64_t nid = 0, expect = 1;

	CHECK_EQ(meta_resolve(img, want, &expect), 0);
	CHECK_EQ(meta_resolve_follow(img, path, &nid), 0);
	if (nid != expect)
		fprintf(stderr, "  %s: nid %llu, expected %llu (%s)\n", path,
			(unsigned long long)nid, (unsigned long long)expect, want);
	CHECK_EQ(nid, expect);
}

static void test_resolve_symlinks(void)
{
	/* Absolute and relative targets, from the image root or the link's
	 * directory; ".." at the root stays there: path, same as. */
	static const char *const follows[][2] = {
		{ "abs/f", "d/e/f" },	{ "rel/f", "d/e/f" },
		{ "/rel", "d/e" },	{ "rel/", "d/e" },
		{ "d/up", "d/e/f" },	{ "d/e/back/file", "d/file" },
		{ "escape", "d/file" }, { "abs_dotdot", "d/file" },
		{ "chain", "d/e/f" },	{ "../..", "/" },
		{ "/../d/./e/../file", "d/file" },
		{ "l1/e/f", "d/e/f" },	{ "", "/" },
	};
	/* Loops, absent names, non-directories in the middle. */
	static const struct {
		const char *path;
		int err;
	} fails[] = {
		{ "loop1", -ELOOP },	   { "self/x", -ELOOP },
		{ "l0", -ELOOP },	   { "dangling", -ENOENT },
		{ "d/e/nope", -ENOENT },   { "tofile/x", -ENOTDIR },
		{ "d/file/x", -ENOTDIR },  { "d/file/", -ENOTDIR },
		{ "d/e/f/..", -ENOTDIR },
	};
	char root[PATH_MAX], image[PATH_MAX], name[16], target[16];
	struct meta_image *img;
	struct meta_stat st;
	uint64_t nid, d_nid;
	int i;

	snprintf(root, sizeof(root), "%s/links", tmp_dir);
	snprintf(image, sizeof(image), "%s/links.erofs", tmp_dir);
	tree = root;
	CHECK(mkdir(root, 0755) == 0);
	make_dir("d", 0755);
	make_dir("d/e", 0755);
	make_file("d/e/f", "f", 1, 0644);
	make_file("d/file", "file", 4, 0644);
	make_link("abs", "/d/e");
	make_link("rel", "d/e");
	make_link("d/up", "../d/e/f");
	make_link("d/e/back", "..");
	make_link("escape", "../../../d/file");
	make_link("abs_dotdot", "/../d/e/../file");
	make_link("chain", "rel/back/up");
	make_link("loop1", "loop2");
	make_link("loop2", "loop1");
	make_link("self", "./self");
	make_link("dangling", "d/nope");
	make_link("tofile", "d/file");
	/* l0 -> l1 -> ... -> l40 -> d: 41 links from l0, 40 from l1. */
	for (i = 0; i <= 40; i++) {
		snprintf(name, sizeof(name), "l%d", i);
		snprintf(target, sizeof(target), i < 40 ? "l%d" : "d", i + 1);
		make_link(name, target);
	}
	if (test_run("mkfs.erofs --quiet '%s' '%s' >/dev/null", image, root))
		return;
	img = open_image(image);
	if (!img)
		return;

	for (i = 0; i < (int)ARRAY_SIZE(follows); i++)
		expect_follow(img, follows[i][0], follows[i][1]);
	for (i = 0; i < (int)ARRAY_SIZE(fails); i++) {
		int ret = meta_resolve_follow(img, fails[i].path, &nid);

		if (ret != fails[i].err)
			fprintf(stderr, "  %s: expected %s\n", fails[i].path,
				strerror(-fails[i].err));
		CHECK_EQ(ret, fails[i].err);
	}

	/* Without following: the link itself, and never through one. */
	CHECK_EQ(meta_resolve(img, "abs", &nid), 0);
	CHECK_EQ(meta_getattr(img, nid, &st), 0);
	CHECK(S_ISLNK(st.mode));
	CHECK_EQ(meta_resolve(img, "loop1", &nid), 0);
	CHECK_EQ(meta_resolve(img, "abs/f", &nid), -ENOTDIR);
	CHECK_EQ(meta_resolve(img, "abs/", &nid), -ENOTDIR);
	CHECK_EQ(meta_resolve(img, "/../../d/e/..", &nid), 0);
	CHECK_EQ(meta_resolve(img, "d", &d_nid), 0);
	CHECK_EQ(nid, d_nid);
	meta_image_close(img);
}

static void test_readdir_resume(void)
{
	static const unsigned int steps[] = { 1, 7, 100, 1000 };
	struct meta_image *img;
	struct resume r;
	uint64_t many;
	size_t i;
	int ret, calls;

	img = open_image(plain_img);
	if (!img)
		return;
	CHECK_EQ(meta_resolve(img, "/many", &many), 0);
	for (i = 0; i < ARRAY_SIZE(steps); i++) {
		memset(&r, 0, sizeof(r));
		r.step = steps[i];
		r.order_ok = true;
		calls = 0;
		do {
			r.seen_in_call = 0;
			ret = meta_readdir(img, many, r.next, resume_fill, &r);
			calls++;
		} while (ret == 1 && calls < 10000);
		CHECK_EQ(ret, 0);
		CHECK_EQ(r.total, MANY_ENTRIES + 2);
		CHECK(r.order_ok);
	}
	CHECK_EQ(meta_readdir(img, many, 5, resume_fill, &r), -EINVAL);
	meta_image_close(img);
}

/* ------------------------------------------------------------------ */
/* ferry preamble and extension region                                 */
/* ------------------------------------------------------------------ */

static const char ext_payload[] = "ferry extension payload: blob tables go here";

/* @buf (image @len bytes, block multiple) + ext region at @len. */
static void add_preamble(uint8_t *buf, size_t len, const void *ext, size_t ext_len)
{
	memset(buf, 0, FERRY_PREAMBLE_SIZE);
	memcpy(buf + FERRY_PRE_MAGIC, META_PREAMBLE_MAGIC, 8);
	put_le32(buf + FERRY_PRE_VERSION, 1);
	put_le64(buf + FERRY_PRE_EXT_OFF, len);
	put_le64(buf + FERRY_PRE_EXT_LEN, ext_len);
	memcpy(buf + len, ext, ext_len);
	fix_checksums(buf, len + ext_len);
}

static void test_preamble_ext(void)
{
	struct meta_image *img;
	const void *ext;
	size_t len, ext_len, total;
	uint8_t *buf, *work;
	char path[PATH_MAX];
	int fd;

	buf = test_read_file(plain_img, &len);
	CHECK(buf && len % 4096 == 0);
	if (!buf)
		return;
	total = len + sizeof(ext_payload);
	work = malloc(total);
	memcpy(work, buf, len);
	add_preamble(work, len, ext_payload, sizeof(ext_payload));
	CHECK_EQ(meta_image_open_mem(work, total, &img), 0);
	if (img) {
		CHECK_EQ(meta_get_ext(img, &ext, &ext_len), 0);
		CHECK_EQ(ext_len, sizeof(ext_payload));
		CHECK(!memcmp(ext, ext_payload, ext_len));
		meta_image_close(img);
	}
	/* The kernel's own checker must not mind the preamble or the tail. */
	snprintf(path, sizeof(path), "%s/preamble.erofs", tmp_dir);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	CHECK(fd >= 0 && write_full(fd, work, total) == 0);
	close(fd);
	CHECK_EQ(test_run("fsck.erofs '%s' >/dev/null 2>&1", path), 0);

	ferry_log_level = -1;
	work[FERRY_PRE_CRC] ^= 1; /* preamble checksum */
	CHECK_EQ(meta_image_open_mem(work, total, &img), -EFSCORRUPTED);
	work[FERRY_PRE_CRC] ^= 1;
	work[len + 3] ^= 0x40; /* payload */
	CHECK_EQ(meta_image_open_mem(work, total, &img), -EFSCORRUPTED);
	work[len + 3] ^= 0x40;
	CHECK_EQ(meta_image_open_mem(work, total - 1, &img), -EFSCORRUPTED); /* cut short */
	put_le64(work + FERRY_PRE_EXT_OFF, len - 100); /* unaligned */
	fix_checksums(work, total);
	CHECK_EQ(meta_image_open_mem(work, total, &img), -EFSCORRUPTED);
	put_le64(work + FERRY_PRE_EXT_OFF, 0); /* over the superblock */
	fix_checksums(work, total);
	CHECK_EQ(meta_image_open_mem(work, total, &img), -EFSCORRUPTED);
	put_le64(work + FERRY_PRE_EXT_OFF, len);
	put_le64(work + FERRY_PRE_EXT_LEN, UINT64_MAX - 100); /* overflow */
	fix_checksums(work, total);
	CHECK_EQ(meta_image_open_mem(work, total, &img), -EFSCORRUPTED);
	put_le64(work + FERRY_PRE_EXT_LEN, sizeof(ext_payload));
	put_le32(work + FERRY_PRE_VERSION, 2);
	fix_checksums(work, total);
	CHECK_EQ(meta_image_open_mem(work, total, &img), -EFSCORRUPTED);
	put_le32(work + FERRY_PRE_VERSION, 1);
	fix_checksums(work, total);
	CHECK_EQ(meta_image_open_mem(work, total, &img), 0);
	meta_image_close(img);
	/* Another magic: plain EROFS, whatever follows. */
	work[7] = '2';
	CHECK_EQ(meta_image_open_mem(work, total, &img), 0);
	if (img) {
		CHECK_EQ(meta_get_ext(img, &ext, &ext_len), -ENODATA);
		meta_image_close(img);
	}
	/* Empty payload. */
	add_preamble(work, len, "", 0);
	CHECK_EQ(meta_image_open_mem(work, len, &img), 0);
	if (img) {
		CHECK_EQ(meta_get_ext(img, &ext, &ext_len), 0);
		CHECK_EQ(ext_len, 0);
		meta_image_close(img);
	}
	ferry_log_level = FERRY_LOG_INFO;
	free(work);
	free(buf);
}

/* ------------------------------------------------------------------ */
/* Damaged images                                                      */
/* ------------------------------------------------------------------ */

struct damaged {
	uint8_t *orig, *buf;
	size_t len;
	uint64_t meta_base;
};

static bool damaged_load(struct damaged *d, const char *path)
{
	memset(d, 0, sizeof(*d));
	d->orig = test_read_file(path, &d->len);
	CHECK(d->orig != NULL);
	if (!d->orig)
		return false;
	d->buf = malloc(d->len);
	memcpy(d->buf, d->orig, d->len);
	d->meta_base = (uint64_t)get_le32(d->orig + 1024 + EROFS_SB_META_BLKADDR) * 4096;
	return true;
}

static void damaged_reset(struct damaged *d)
{
	memcpy(d->buf, d->orig, d->len);
}

static void damaged_free(struct damaged *d)
{
	free(d->orig);
	free(d->buf);
}

static uint64_t nid_of(const struct damaged *d, const char *path)
{
	struct meta_image *img;
	uint64_t nid = 0;

	CHECK_EQ(meta_image_open_mem(d->orig, d->len, &img), 0);
	CHECK_EQ(meta_resolve(img, path, &nid), 0);
	meta_image_close(img);
	return nid;
}

static uint8_t *inode_at(const struct damaged *d, uint64_t nid)
{
	return d->buf + d->meta_base + nid * 32;
}

/* Walk the (damaged) copy; returns corrupt count, -1 if open failed. */
static int damaged_walk(const struct damaged *d, size_t len)
{
	struct walk_stats st = { 0 };
	struct meta_image *img;
	uint8_t *copy = malloc(len ? len : 1); /* exact size: ASan sees overreads */
	int ret;

	memcpy(copy, d->buf, len);
	ret = meta_image_open_mem(copy, len, &img);
	if (ret) {
		CHECK_EQ(ret, -EFSCORRUPTED);
		free(copy);
		return -1;
	}
	walk_image(img, &st);
	meta_image_close(img);
	free(copy);
	CHECK_EQ(st.bad, 0);
	return (int)st.corrupt;
}

static void test_truncated(void)
{
	static const char *const images[] = { tiny_plain_img, tiny_chunked_img,
					      plain_img };
	struct damaged d;
	size_t i, l, cuts;

	ferry_log_level = -1;
	for (i = 0; i < ARRAY_SIZE(images); i++) {
		if (!damaged_load(&d, images[i]))
			continue;
		cuts = 0;
		for (l = 0; l < d.len; l += i < 2 ? 61 : 40961) {
			/* Every cut loses something the tree references. */
			if (damaged_walk(&d, l) == 0) {
				fprintf(stderr, "  %s cut at %zu went unnoticed\n",
					images[i], l);
				CHECK(0);
			}
			cuts++;
		}
		CHECK(cuts > 5);
		CHECK_EQ(damaged_walk(&d, d.len), 0);
		damaged_free(&d);
	}
	ferry_log_level = FERRY_LOG_INFO;
}

/* Patch a superblock field (and its checksum): open must fail. */
static void sb_case(struct damaged *d, unsigned int off, unsigned int size,
		    uint64_t value, bool fix_crc)
{
	struct meta_image *img;

	damaged_reset(d);
	if (size == 1)
		d->buf[1024 + off] = (uint8_t)value;
	else if (size == 2)
		put_le16(d->buf + 1024 + off, (uint16_t)value);
	else
		put_le32(d->buf + 1024 + off, (uint32_t)value);
	if (fix_crc)
		fix_checksums(d->buf, d->len);
	CHECK_EQ(meta_image_open_mem(d->buf, d->len, &img), -EFSCORRUPTED);
	CHECK(damaged_walk(d, d->len) == -1);
}

static void test_bad_superblock(void)
{
	struct damaged d;
	struct meta_image *img;
	uint64_t small;

	if (!damaged_load(&d, chunked_img))
		return;
	ferry_log_level = -1;
	small = nid_of(&d, "/small");
	sb_case(&d, EROFS_SB_MAGIC, 4, 0xE0F5E1E3, true);
	sb_case(&d, EROFS_SB_CHECKSUM, 4, get_le32(d.orig + 1024 + 4) ^ 1, false);
	sb_case(&d, EROFS_SB_VOLUME_NAME, 1, 'x', false); /* covered by crc */
	sb_case(&d, EROFS_SB_BLKSZBITS, 1, 13, true);
	sb_case(&d, EROFS_SB_BLKSZBITS, 1, 9, true);
	sb_case(&d, EROFS_SB_FEATURE_INCOMPAT, 4, 0x1c, true);
	sb_case(&d, EROFS_SB_FEATURE_INCOMPAT, 4, 0x8000000c, true);
	sb_case(&d, EROFS_SB_U1, 2, 1, true);
	sb_case(&d, EROFS_SB_EXTSLOTS, 1, 1, true);
	sb_case(&d, EROFS_SB_DIRBLKBITS, 1, 1, true);
	sb_case(&d, EROFS_SB_ROOT_NID, 2, small, true);  /* not a directory */
	sb_case(&d, EROFS_SB_ROOT_NID, 2, 0xffff, true); /* outside */
	sb_case(&d, EROFS_SB_META_BLKADDR, 4, 0x100000, true);
	sb_case(&d, EROFS_SB_EXTRA_DEVICES, 2, META_MAX_DEVICES + 1, true);
	sb_case(&d, EROFS_SB_DEVT_SLOTOFF, 2, 0xffff, true);
	sb_case(&d, EROFS_SB_DEVT_SLOTOFF, 2, 0, true); /* over the superblock */
	sb_case(&d, EROFS_SB_FIXED_NSEC, 4, 1000000000, true);

	/* Without SB_CHKSUM nobody checks the field. */
	damaged_reset(&d);
	put_le32(d.buf + 1024 + EROFS_SB_FEATURE_COMPAT,
		 get_le32(d.orig + 1024 + EROFS_SB_FEATURE_COMPAT) &
			 ~EROFS_FEATURE_COMPAT_SB_CHKSUM);
	put_le32(d.buf + 1024 + EROFS_SB_CHECKSUM, 0x12345678);
	CHECK_EQ(meta_image_open_mem(d.buf, d.len, &img), 0);
	meta_image_close(img);
	/* Without DEVICE_TABLE, extra_devices means nothing. */
	put_le32(d.buf + 1024 + EROFS_SB_FEATURE_INCOMPAT,
		 EROFS_FEATURE_INCOMPAT_CHUNKED_FILE);
	CHECK_EQ(meta_image_open_mem(d.buf, d.len, &img), 0);
	if (img) {
		struct meta_super sb;
		struct meta_chunk c;
		uint64_t multi;

		meta_get_super(img, &sb);
		CHECK_EQ(sb.nr_devices, 0);
		CHECK_EQ(meta_resolve(img, "/multi", &multi), 0);
		CHECK_EQ(meta_get_chunk(img, multi, 0, &c), -EFSCORRUPTED);
		meta_image_close(img);
	}
	ferry_log_level = FERRY_LOG_INFO;
	damaged_free(&d);
}

/* After damage applied to d->buf: @path's @op fails, the rest is fine. */
static void expect_corrupt_inode(struct damaged *d, const char *path)
{
	struct meta_image *img;
	struct meta_stat st;
	uint64_t nid, other;
	char buf[64];

	CHECK_EQ(meta_image_open_mem(d->buf, d->len, &img), 0);
	if (!img)
		return;
	CHECK_EQ(meta_resolve(img, path, &nid), 0);
	CHECK_EQ(meta_getattr(img, nid, &st), -EFSCORRUPTED);
	CHECK_EQ(meta_read(img, nid, 0, buf, sizeof(buf)), -EFSCORRUPTED);
	CHECK_EQ(meta_listxattr(img, nid, buf, sizeof(buf)), -EFSCORRUPTED);
	CHECK_EQ(meta_readlink(img, nid, buf, sizeof(buf)), -EFSCORRUPTED);
	CHECK_EQ(meta_get_chunk(img, nid, 0, NULL), -EFSCORRUPTED);
	CHECK_EQ(meta_resolve(img, "/page", &other), 0);
	CHECK_EQ(meta_getattr(img, other, &st), 0);
	meta_image_close(img);
	CHECK(damaged_walk(d, d->len) > 0);
}

/* Data block @blk of FLAT inode @path, inline tail included. */
static uint8_t *data_block_at(struct damaged *d, const char *path, uint64_t blk)
{
	uint8_t *ino = inode_at(d, nid_of(d, path));
	uint16_t format = get_le16(ino);
	uint64_t size = format & 1 ? get_le64(ino + EROFS_IE_SIZE) :
				     get_le32(ino + EROFS_IC_SIZE);

	if ((format >> 1 & 7) == EROFS_INODE_FLAT_INLINE &&
	    blk == (size - 1) / 4096)
		return ino + (format & 1 ? 64 : 32) +
		       EROFS_XATTR_IBODY_SIZE(get_le16(ino + EROFS_I_XATTR_ICOUNT));
	return d->buf + ((uint64_t)get_le32(ino + EROFS_I_U) + blk) * 4096;
}

/* Compact inodes: mtime = epoch + i_mtime (as Linux >= 6.15), fixed_nsec. */
static void test_compact_mtime(void)
{
	struct damaged d;
	struct meta_image *img;
	struct meta_stat st;
	uint64_t small, page, big_ids;
	uint8_t *ino;

	if (!damaged_load(&d, fixed_img))
		return;
	small = nid_of(&d, "/small");
	page = nid_of(&d, "/page");
	big_ids = nid_of(&d, "/big_ids");
	ino = inode_at(&d, small);
	CHECK_EQ(get_le16(ino) & 1, 0);
	CHECK_EQ(get_le32(ino + EROFS_IC_MTIME), 0);
	put_le64(d.buf + 1024 + EROFS_SB_EPOCH, FIXED_TIME + 7);
	put_le32(d.buf + 1024 + EROFS_SB_FIXED_NSEC, 12345);
	put_le32(ino + EROFS_IC_MTIME, 100);
	fix_checksums(d.buf, d.len);
	CHECK_EQ(meta_image_open_mem(d.buf, d.len, &img), 0);
	if (img) {
		CHECK_EQ(meta_getattr(img, small, &st), 0);
		CHECK_EQ(st.mtime, FIXED_TIME + 107);
		CHECK_EQ(st.mtime_nsec, 12345);
		CHECK_EQ(meta_getattr(img, page, &st), 0);
		CHECK_EQ(st.mtime, FIXED_TIME + 7);
		CHECK_EQ(st.mtime_nsec, 12345);
		CHECK_EQ(meta_getattr(img, big_ids, &st), 0);
		CHECK(st.extended);
		CHECK_EQ(st.mtime, FIXED_TIME);
		CHECK_EQ(st.mtime_nsec, 0);
		meta_image_close(img);
	}
	/* epoch + i_mtime past INT64_MAX. */
	put_le64(d.buf + 1024 + EROFS_SB_EPOCH, INT64_MAX);
	fix_checksums(d.buf, d.len);
	ferry_log_level = -1;
	CHECK_EQ(meta_image_open_mem(d.buf, d.len, &img), 0);
	if (img) {
		CHECK_EQ(meta_getattr(img, small, &st), -EFSCORRUPTED);
		CHECK_EQ(meta_getattr(img, page, &st), 0);
		CHECK_EQ(st.mtime, INT64_MAX);
		meta_image_close(img);
	}
	ferry_log_level = FERRY_LOG_INFO;
	damaged_free(&d);
}

static void test_bad_inodes(void)
{
	struct damaged d;
	uint8_t *ino;
	uint16_t format;

	if (!damaged_load(&d, plain_img))
		return;
	ferry_log_level = -1;
	ino = inode_at(&d, nid_of(&d, "/small"));
	format = get_le16(ino);
	put_le16(ino, format | 0x10); /* NLINK_1/DOT_OMITTED (6.15+) */
	expect_corrupt_inode(&d, "/small");
	damaged_reset(&d);
	put_le16(ino, (format & 1) | 1 << 1); /* COMPRESSED_FULL */
	expect_corrupt_inode(&d, "/small");
	damaged_reset(&d);
	put_le16(ino, (format & 1) | 6 << 1);
	expect_corrupt_inode(&d, "/small");
	damaged_reset(&d);
	put_le16(ino + EROFS_I_MODE, 0644); /* no S_IFMT */
	expect_corrupt_inode(&d, "/small");
	damaged_reset(&d);
	put_le16(ino + EROFS_I_XATTR_ICOUNT, 0xffff);
	expect_corrupt_inode(&d, "/small");
	damaged_reset(&d);
	put_le64(ino + EROFS_IE_SIZE, 1ull << 63); /* negative (extended) */
	CHECK(format & 1);
	expect_corrupt_inode(&d, "/small");

	/* Inline tail that would cross into the next block. */
	damaged_reset(&d);
	ino = inode_at(&d, nid_of(&d, "/inline3000"));
	CHECK_EQ(get_le16(ino) >> 1 & 7, EROFS_INODE_FLAT_INLINE);
	put_le64(ino + EROFS_IE_SIZE, 4095);
	expect_corrupt_inode(&d, "/inline3000");
	/* Data blocks outside the image. */
	damaged_reset(&d);
	ino = inode_at(&d, nid_of(&d, "/multi"));
	put_le32(ino + EROFS_I_U, (uint32_t)(d.len / 4096) - 2);
	expect_corrupt_inode(&d, "/multi");
	/* Symlink longer than a page. */
	damaged_reset(&d);
	ino = inode_at(&d, nid_of(&d, "/sym_long"));
	put_le64(ino + EROFS_IE_SIZE, 4096);
	expect_corrupt_inode(&d, "/sym_long");
	/* NUL inside a symlink target. */
	damaged_reset(&d);
	data_block_at(&d, "/sym_short", 0)[2] = '\0';
	{
		struct meta_image *img;
		uint64_t nid;
		char buf[64];

		CHECK_EQ(meta_image_open_mem(d.buf, d.len, &img), 0);
		CHECK_EQ(meta_resolve(img, "/sym_short", &nid), 0);
		CHECK_EQ(meta_readlink(img, nid, buf, sizeof(buf)), -EFSCORRUPTED);
		meta_image_close(img);
	}
	/* Device with data. */
	damaged_reset(&d);
	ino = inode_at(&d, nid_of(&d, "/null"));
	put_le64(ino + EROFS_IE_SIZE, 1);
	expect_corrupt_inode(&d, "/null");
	/* Shared xattr count beyond the inline region. */
	damaged_reset(&d);
	ino = inode_at(&d, nid_of(&d, "/small"));
	ino[64 + 4] = 200;
	{
		struct meta_image *img;
		uint64_t nid;
		char buf[256];

		CHECK_EQ(meta_image_open_mem(d.buf, d.len, &img), 0);
		CHECK_EQ(meta_resolve(img, "/small", &nid), 0);
		CHECK_EQ(meta_listxattr(img, nid, buf, sizeof(buf)), -EFSCORRUPTED);
		CHECK_EQ(meta_getxattr(img, nid, "user.greeting", buf, sizeof(buf)),
			 -EFSCORRUPTED);
		meta_image_close(img);
	}
	ferry_log_level = FERRY_LOG_INFO;
	damaged_free(&d);
}

/* Reading directory @dir fails, and so does looking up @name (if given). */
static void expect_bad_dir(struct damaged *d, const char *dir, const char *name)
{
	struct meta_image *img;
	uint64_t dir_nid, nid;
	struct dir_list *l = calloc(1, sizeof(*l));

	CHECK_EQ(meta_image_open_mem(d->buf, d->len, &img), 0);
	if (img && l) {
		CHECK_EQ(meta_resolve(img, dir, &dir_nid), 0);
		CHECK_EQ(meta_readdir(img, dir_nid, 0, collect, l), -EFSCORRUPTED);
		if (name)
			CHECK_EQ(meta_lookup(img, dir_nid, name, strlen(name), &nid),
				 -EFSCORRUPTED);
		CHECK_EQ(meta_resolve(img, "/page", &nid), 0);
	}
	meta_image_close(img);
	free(l);
	CHECK(damaged_walk(d, d->len) > 0);
}

static void test_bad_dirents(void)
{
	struct damaged d;
	uint8_t *blk, *blk1, tmp[16];
	uint16_t off_a, off_b;
	size_t len_a;

	if (!damaged_load(&d, plain_img))
		return;
	ferry_log_level = -1;
	blk = data_block_at(&d, "/many", 0);
	/* Block 0 starts with "." and ".."; entry 2 is "entry-00000". */
	CHECK(!memcmp(blk + get_le16(blk + 8), "...entry-00000", 14));
	put_le16(blk + 8, 13); /* not a multiple of 12 */
	expect_bad_dir(&d, "/many", "entry-00001");
	damaged_reset(&d);
	put_le16(blk + 8, 0);
	expect_bad_dir(&d, "/many", "entry-00001");
	damaged_reset(&d);
	put_le16(blk + 8, 4092);
	expect_bad_dir(&d, "/many", "entry-00001");
	damaged_reset(&d);
	put_le16(blk + 5 * 12 + 8, 4095); /* a name past the others */
	expect_bad_dir(&d, "/many", "entry-00001");
	damaged_reset(&d);
	put_le16(blk + 5 * 12 + 8, get_le16(blk + 4 * 12 + 8)); /* empty name */
	expect_bad_dir(&d, "/many", "entry-00001");
	/* '/' or NUL inside a name that still sorts right: "a-x" < "b". */
	damaged_reset(&d);
	blk = data_block_at(&d, "/names", 0);
	CHECK(!memcmp(blk + get_le16(blk + 2 * 12 + 8), "a-xb", 4));
	blk[get_le16(blk + 2 * 12 + 8) + 1] = '/';
	expect_bad_dir(&d, "/names", "b");
	blk[get_le16(blk + 2 * 12 + 8) + 1] = '\0';
	expect_bad_dir(&d, "/names", "b");
	damaged_reset(&d);
	blk = data_block_at(&d, "/many", 0);
	damaged_reset(&d);
	blk[4 * 12 + 10] = EROFS_FT_MAX;
	expect_bad_dir(&d, "/many", "entry-00001");
	/* Swap two names of equal length: strictly ascending is broken. */
	damaged_reset(&d);
	off_a = get_le16(blk + 3 * 12 + 8);
	off_b = get_le16(blk + 4 * 12 + 8);
	len_a = off_b - off_a;
	CHECK_EQ(len_a, 11);
	CHECK_EQ(get_le16(blk + 5 * 12 + 8) - off_b, 11);
	memcpy(tmp, blk + off_a, len_a);
	memcpy(blk + off_a, blk + off_b, len_a);
	memcpy(blk + off_b, tmp, len_a);
	expect_bad_dir(&d, "/many", "entry-00002");
	/* Block 1 starting below the end of block 0. */
	damaged_reset(&d);
	blk1 = data_block_at(&d, "/many", 1);
	blk1[get_le16(blk1 + 8)] = '!';
	expect_bad_dir(&d, "/many", NULL);
	/* A dirent whose nid points outside the image. */
	damaged_reset(&d);
	put_le64(blk + 3 * 12, UINT64_MAX / 16);
	{
		struct meta_image *img;
		struct meta_stat st;
		uint64_t nid, many;

		CHECK_EQ(meta_image_open_mem(d.buf, d.len, &img), 0);
		CHECK_EQ(meta_resolve(img, "/many", &many), 0);
		CHECK_EQ(meta_lookup(img, many, "entry-00001", 11, &nid), 0);
		CHECK_EQ(nid, UINT64_MAX / 16);
		CHECK_EQ(meta_getattr(img, nid, &st), -EFSCORRUPTED);
		meta_image_close(img);
	}
	ferry_log_level = FERRY_LOG_INFO;
	damaged_free(&d);
}

static void test_bad_chunks(void)
{
	struct damaged d;
	struct meta_image *img;
	struct meta_chunk c;
	uint8_t *ino, *idx;
	uint64_t nid;

	if (!damaged_load(&d, chunked_img))
		return;
	ferry_log_level = -1;
	nid = nid_of(&d, "/multi");
	ino = inode_at(&d, nid);
	CHECK_EQ(get_le16(ino) >> 1 & 7, EROFS_INODE_CHUNK_BASED);
	CHECK(get_le16(ino + EROFS_I_U) & EROFS_CHUNK_FORMAT_INDEXES);
	idx = ino + (get_le16(ino) & 1 ? 64 : 32) +
	      EROFS_XATTR_IBODY_SIZE(get_le16(ino + EROFS_I_XATTR_ICOUNT));
	idx = d.buf + ROUND_UP((size_t)(idx - d.buf), 8);
	put_le16(idx + EROFS_CHUNK_INDEX_DEVICE_ID, 2);
	CHECK_EQ(meta_image_open_mem(d.buf, d.len, &img), 0);
	if (img) {
		CHECK_EQ(meta_get_chunk(img, nid, 0, &c), -EFSCORRUPTED);
		CHECK_EQ(meta_get_chunk(img, nid, 2, &c), 0);
		CHECK_EQ(c.device_id, 1);
		meta_image_close(img);
	}
	CHECK(damaged_walk(&d, d.len) > 0);
	/* A hole, whatever its device_id says. */
	damaged_reset(&d);
	put_le16(idx + 8 + EROFS_CHUNK_INDEX_DEVICE_ID, 1);
	put_le32(idx + 8 + EROFS_CHUNK_INDEX_STARTBLK, EROFS_NULL_ADDR);
	CHECK_EQ(meta_image_open_mem(d.buf, d.len, &img), 0);
	if (img) {
		CHECK_EQ(meta_get_chunk(img, nid, 1, &c), 0);
		CHECK_EQ(c.device_id, 0);
		CHECK_EQ(c.blkaddr, META_CHUNK_HOLE);
		meta_image_close(img);
	}
	/* Device 0: unified addresses, resolved through the device's uniaddr. */
	damaged_reset(&d);
	{
		uint8_t *slot = d.buf + get_le16(d.buf + 1024 + EROFS_SB_DEVT_SLOTOFF) * 128;

		put_le32(slot + EROFS_DEVT_UNIADDR, 1000);
		put_le32(slot + EROFS_DEVT_BLOCKS, 500);
	}
	put_le16(idx + EROFS_CHUNK_INDEX_DEVICE_ID, 0);
	put_le32(idx + EROFS_CHUNK_INDEX_STARTBLK, 1000 + 77);
	put_le16(idx + 8 + EROFS_CHUNK_INDEX_DEVICE_ID, 0);
	put_le32(idx + 8 + EROFS_CHUNK_INDEX_STARTBLK, 1000 + 500);
	fix_checksums(d.buf, d.len);
	CHECK_EQ(meta_image_open_mem(d.buf, d.len, &img), 0);
	if (img) {
		CHECK_EQ(meta_get_chunk(img, nid, 0, &c), 0);
		CHECK_EQ(c.device_id, 1);
		CHECK_EQ(c.blkaddr, 77);
		/* Past the device: the bootstrap itself, which ferry refuses. */
		CHECK_EQ(meta_get_chunk(img, nid, 1, &c), -EFSCORRUPTED);
		meta_image_close(img);
	}
	/* Unknown chunk format bits (48-bit addressing). */
	damaged_reset(&d);
	put_le16(ino + EROFS_I_U, get_le16(ino + EROFS_I_U) | 0x40);
	CHECK(damaged_walk(&d, d.len) > 0);
	/* A chunk table running off the end of the image. */
	damaged_reset(&d);
	put_le64(ino + EROFS_IE_SIZE, (uint64_t)d.len * CHUNK_SIZE);
	if (!(get_le16(ino) & 1))
		put_le32(ino + EROFS_IC_SIZE, UINT32_MAX);
	CHECK(damaged_walk(&d, d.len) > 0);
	ferry_log_level = FERRY_LOG_INFO;
	damaged_free(&d);
}

/* Every single-byte flip of the tiny images: never a wrong answer. */
static void test_byte_flips(void)
{
	static const char *const images[] = { tiny_plain_img, tiny_chunked_img };
	struct damaged d;
	size_t i, pos, noticed;

	ferry_log_level = -1;
	for (i = 0; i < ARRAY_SIZE(images); i++) {
		if (!damaged_load(&d, images[i]))
			continue;
		CHECK(d.len <= 16384);
		noticed = 0;
		for (pos = 1024; pos < d.len; pos++) {
			d.buf[pos] ^= 0x5a;
			if (pos >= 1024 + 128)
				fix_checksums(d.buf, d.len);
			noticed += damaged_walk(&d, d.len) != 0;
			damaged_reset(&d);
		}
		CHECK(noticed > 100);
		damaged_free(&d);
	}
	ferry_log_level = FERRY_LOG_INFO;
}

/* ------------------------------------------------------------------ */
/* Kernel mount                                                        */
/* ------------------------------------------------------------------ */

static bool can_mount(void)
{
	char line[128];
	bool ok = false;
	FILE *f;

	if (geteuid() != 0) {
		printf("# kernel mount tests skipped: not root\n");
		return false;
	}
	f = fopen("/proc/filesystems", "r");
	while (f && !ok && fgets(line, sizeof(line), f))
		ok = !strcmp(line, "\terofs\n");
	if (f)
		fclose(f);
	if (!ok)
		printf("# kernel mount tests skipped: no erofs in /proc/filesystems\n");
	return ok;
}

/* The mount on @mnt honours setuid bits and devices exactly when @trusted. */
static void check_mount_flags(const char *mnt, bool trusted)
{
	struct statvfs sv;

	CHECK_EQ(statvfs(mnt, &sv), 0);
	CHECK_EQ(!(sv.f_flag & ST_NOSUID), trusted);
	CHECK_EQ(!(sv.f_flag & ST_NODEV), trusted);
	CHECK(sv.f_flag & ST_RDONLY);
}

static void check_mounted(const char *mnt)
{
	char p[PATH_MAX], q[PATH_MAX];
	uint8_t *a, *b;
	size_t al, bl;

	snprintf(p, sizeof(p), "%s/multi", mnt);
	snprintf(q, sizeof(q), "%s/multi", src);
	a = test_read_file(p, &al);
	b = test_read_file(q, &bl);
	CHECK(a && b && al == bl && !memcmp(a, b, al));
	free(a);
	free(b);
	snprintf(p, sizeof(p), "%s/many/entry-02999", mnt);
	CHECK_EQ(access(p, F_OK), 0);
	CHECK_EQ(umount2(mnt, 0), 0);
}

static void test_kernel_mount(void)
{
	char mnt[256], comma[256];
	const char *devs[2];

	if (!can_mount())
		return;
	snprintf(mnt, sizeof(mnt), "%s/mnt", tmp_dir);
	CHECK_EQ(mkdir(mnt, 0755), 0);
	devs[0] = blob_path;
	CHECK_EQ(meta_kernel_mount(chunked_img, devs, 1, mnt, MS_NOSUID | MS_NODEV), 0);
	check_mount_flags(mnt, false);
	check_mounted(mnt);
	CHECK_EQ(meta_kernel_mount(chunked_img, devs, 1, mnt, 0), 0);
	check_mount_flags(mnt, true);
	check_mounted(mnt);
	/* Wrong device count. */
	devs[1] = blob_path;
	CHECK_EQ(meta_kernel_mount(chunked_img, devs, 2, mnt, 0), -EINVAL);
	/* A comma in a path: mount(2) cannot say it, fsconfig can. */
	snprintf(comma, sizeof(comma), "%s/bl,ob", tmp_dir);
	CHECK_EQ(link(blob_path, comma), 0);
	devs[0] = comma;
	CHECK_EQ(meta_kernel_mount(chunked_img, devs, 1, mnt, MS_NOSUID | MS_NODEV), 0);
	check_mount_flags(mnt, false);
	check_mounted(mnt);
	CHECK_EQ(meta_kernel_mount(chunked_img, devs, 1, mnt, 0), 0);
	check_mount_flags(mnt, true);
	check_mounted(mnt);
	devs[1] = comma;
	CHECK_EQ(meta_kernel_mount(chunked_img, devs, 2, mnt, 0), -EINVAL);
	/* Not a regular file / missing. */
	devs[0] = tmp_dir;
	CHECK_EQ(meta_kernel_mount(chunked_img, devs, 1, mnt, 0), -EINVAL);
	devs[0] = "/nonexistent/blob";
	CHECK_EQ(meta_kernel_mount(chunked_img, devs, 1, mnt, 0), -ENOENT);
	devs[0] = blob_path;
	CHECK_EQ(meta_kernel_mount(chunked_img, devs, 1, "/nonexistent/mnt", 0), -ENOENT);
	CHECK_EQ(meta_kernel_mount(blob_path, devs, 1, mnt, 0), -EINVAL); /* not EROFS */
	rmdir(mnt);
}

/*
 * More devices than one page of options holds: the chunked image with its
 * device table moved to a new block at the end and grown to @n slots.
 */
static void test_kernel_mount_many_devices(void)
{
	enum { NR = 48 };
	char mnt[256], img_path[256], dir[512];
	char *paths[NR];
	const char *devs[NR];
	uint8_t *orig, *buf;
	size_t len, total, i;
	int fd;

	if (!can_mount())
		return;
	orig = test_read_file(chunked_img, &len);
	CHECK(orig != NULL);
	if (!orig)
		return;
	total = len + 2 * 4096;
	buf = calloc(1, total);
	memcpy(buf, orig, len);
	CHECK_EQ(get_le16(orig + 1024 + EROFS_SB_EXTRA_DEVICES), 1);
	memcpy(buf + len, orig + get_le16(orig + 1024 + EROFS_SB_DEVT_SLOTOFF) * 128,
	       128);
	put_le16(buf + 1024 + EROFS_SB_DEVT_SLOTOFF, (uint16_t)(len / 128));
	put_le16(buf + 1024 + EROFS_SB_EXTRA_DEVICES, NR);
	put_le32(buf + 1024 + EROFS_SB_BLOCKS, (uint32_t)(total / 4096));
	fix_checksums(buf, total);
	snprintf(img_path, sizeof(img_path), "%s/many-devices.erofs", tmp_dir);
	fd = open(img_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	CHECK(fd >= 0 && write_full(fd, buf, total) == 0);
	close(fd);
	snprintf(dir, sizeof(dir), "%s/a-directory-name-long-enough-that-%d-device-paths-overflow-one-page-of-mount-options",
		 tmp_dir, NR);
	CHECK_EQ(mkdir(dir, 0755), 0);
	for (i = 0; i < NR; i++) {
		paths[i] = malloc(PATH_MAX);
		snprintf(paths[i], PATH_MAX, "%s/device-%02zu", dir, i);
		if (i == 0) {
			CHECK_EQ(link(blob_path, paths[i]), 0);
		} else {
			fd = open(paths[i], O_WRONLY | O_CREAT | O_TRUNC, 0644);
			CHECK(fd >= 0 && ftruncate(fd, 4096) == 0);
			close(fd);
		}
		devs[i] = paths[i];
	}
	snprintf(mnt, sizeof(mnt), "%s/mnt-many", tmp_dir);
	CHECK_EQ(mkdir(mnt, 0755), 0);
	CHECK_EQ(meta_kernel_mount(img_path, devs, NR, mnt, MS_NOSUID | MS_NODEV), 0);
	check_mount_flags(mnt, false);
	check_mounted(mnt);
	CHECK_EQ(meta_kernel_mount(img_path, devs, NR - 1, mnt, 0), -EINVAL);
	{
		struct meta_image *img = open_image(img_path);
		struct meta_super sb;

		if (img) {
			meta_get_super(img, &sb);
			CHECK_EQ(sb.nr_devices, NR);
			meta_image_close(img);
		}
	}
	for (i = 0; i < NR; i++)
		free(paths[i]);
	rmdir(mnt);
	free(buf);
	free(orig);
}

/* A ferry preamble and extension tail do not disturb the kernel. */
static void test_kernel_mount_preamble(void)
{
	char mnt[256], path[256], p[PATH_MAX];
	uint8_t *a;
	size_t al;

	if (!can_mount())
		return;
	snprintf(path, sizeof(path), "%s/preamble.erofs", tmp_dir);
	snprintf(mnt, sizeof(mnt), "%s/mnt-pre", tmp_dir);
	CHECK_EQ(mkdir(mnt, 0755), 0);
	CHECK_EQ(meta_kernel_mount(path, NULL, 0, mnt, 0), 0);
	snprintf(p, sizeof(p), "%s/small", mnt);
	a = test_read_file(p, &al);
	CHECK(a && al == 12 && !memcmp(a, "hello world\n", 12));
	free(a);
	CHECK_EQ(umount2(mnt, 0), 0);
	rmdir(mnt);
}

/*
 * EROFS over fscache: ids the kernel's option parser or the cache's file
 * names would take apart are refused before mount(2).
 */
static void test_kernel_mount_fscache_ids(void)
{
	char long_id[META_FSCACHE_ID_MAX + 2];

	memset(long_id, 'a', sizeof(long_id) - 1);
	long_id[sizeof(long_id) - 1] = '\0';
	CHECK_EQ(meta_kernel_mount_fscache("", NULL, "/nonexistent", 0), -EINVAL);
	CHECK_EQ(meta_kernel_mount_fscache("a,domain_id=b", NULL, "/nonexistent", 0), -EINVAL);
	CHECK_EQ(meta_kernel_mount_fscache("../x", NULL, "/nonexistent", 0), -EINVAL);
	CHECK_EQ(meta_kernel_mount_fscache(long_id, NULL, "/nonexistent", 0), -EINVAL);
	CHECK_EQ(meta_kernel_mount_fscache("abc", "a b", "/nonexistent", 0), -EINVAL);
	CHECK_EQ(meta_kernel_mount_fscache("abc", "", "/nonexistent", 0), -EINVAL);
	/* The longest allowed: mount(2) is tried, and finds no target. */
	long_id[META_FSCACHE_ID_MAX] = '\0';
	CHECK_EQ(meta_kernel_mount_fscache(long_id, "d.1_x-y", "/nonexistent", 0), -ENOENT);
}

int main(void)
{
	RUN_TEST(setup);
	RUN_TEST(test_kernel_mount_fscache_ids);
	if (!have_images)
		TEST_MAIN_END();
	RUN_TEST(test_plain_image_matches_source);
	RUN_TEST(test_fixed_time_compact_inodes);
	RUN_TEST(test_chunked_image_matches_blob);
	RUN_TEST(test_open_mem_and_errors);
	RUN_TEST(test_resolve_symlinks);
	RUN_TEST(test_readdir_resume);
	RUN_TEST(test_preamble_ext);
	RUN_TEST(test_truncated);
	RUN_TEST(test_bad_superblock);
	RUN_TEST(test_compact_mtime);
	RUN_TEST(test_bad_inodes);
	RUN_TEST(test_bad_dirents);
	RUN_TEST(test_bad_chunks);
	RUN_TEST(test_byte_flips);
	RUN_TEST(test_kernel_mount);
	RUN_TEST(test_kernel_mount_many_devices);
	RUN_TEST(test_kernel_mount_preamble);
	if (test_failed_cases)
		fprintf(stderr, "# kept %s for inspection\n", tmp_dir);
	else
		nftw(tmp_dir, remove_one, 16, FTW_DEPTH | FTW_PHYS);
	TEST_MAIN_END();
}
