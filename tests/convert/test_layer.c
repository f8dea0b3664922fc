// SPDX-License-Identifier: MIT
/*
 * Tests for the layer merge (layer.c): tar layers built in memory are
 * applied one after another to a converter's tree, as an oci: source's
 * layers are, and the tree is checked with pkg-meta's lookups. Files stay
 * below the inline limit, so no blob is written.
 */
#include "../test.h"

#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>

#include "../../pkg-base/base.h"
#include "../../pkg-convert/internal.h"
#include "../../pkg-convert/tar.h"

/* ---- ustar archives in memory ---- */

struct tarbuf {
	uint8_t *p;
	size_t len, cap;
};

/* @v as @width - 1 octal digits and a NUL (values here always fit). */
static void octal(char *field, size_t width, uint64_t v)
{
	size_t i;

	field[width - 1] = '\0';
	for (i = width - 1; i-- > 0; v >>= 3)
		field[i] = (char)('0' + (v & 7));
}

/* One entry: @type '0' file, '1' hardlink, '2' symlink, '5' directory. */
static void tar_add(struct tarbuf *t, char type, const char *name,
		    const char *link, const char *data, uint32_t mode)
{
	size_t size = data ? strlen(data) : 0, blocks = 1 + DIV_ROUND_UP(size, 512);
	uint8_t *h;
	unsigned int sum = 0, i;

	if (array_reserve(&t->p, &t->cap, t->len + blocks * 512 + 1024, 1, 65536))
		abort();
	h = t->p + t->len;
	memset(h, 0, blocks * 512);
	snprintf((char *)h, 100, "%s", name);
	octal((char *)h + 100, 8, mode);
	octal((char *)h + 108, 8, 0);
	octal((char *)h + 116, 8, 0);
	octal((char *)h + 124, 12, size);
	octal((char *)h + 136, 12, 1700000000);
	h[156] = (uint8_t)type;
	if (link)
		snprintf((char *)h + 157, 100, "%s", link);
	memcpy(h + 257, "ustar", 6);
	memcpy(h + 263, "00", 2);
	memset(h + 148, ' ', 8);
	for (i = 0; i < 512; i++)
		sum += h[i];
	snprintf((char *)h + 148, 8, "%06o", sum);
	if (size)
		memcpy(h + 512, data, size);
	t->len += blocks * 512;
}

#define FILE_(t, name, data) tar_add(t, '0', name, NULL, data, 0644)
#define DIR_(t, name, mode) tar_add(t, '5', name, NULL, NULL, mode)
#define LINK_(t, name, target) tar_add(t, '1', name, target, NULL, 0644)

/* ---- a converter applying layers ---- */

struct merge {
	struct convert_opts opts;
	struct convert_stats stats;
	struct converter c;
};

static void merge_init(struct merge *m)
{
	memset(m, 0, sizeof(*m));
	m->opts.chunk_size = 4096;
	m->opts.inline_max = 3072;
	m->c.opts = &m->opts;
	m->c.stats = &m->stats;
	m->c.layered = true;
	if (meta_tree_new(&m->c.tree))
		abort();
}

static void merge_free(struct merge *m)
{
	meta_tree_free(m->c.tree);
	free(m->c.links);
}

/* Apply @t (terminated here) as the next layer, then empty it. */
static int apply(struct merge *m, struct tarbuf *t)
{
	struct input_stream *in = NULL;
	int ret;

	if (array_reserve(&t->p, &t->cap, t->len + 1024, 1, 65536))
		abort();
	memset(t->p + t->len, 0, 1024);
	t->len += 1024;
	ret = input_open_mem(t->p, t->len, &in);
	if (!ret)
		ret = convert_apply_input(&m->c, in, t->len, "test layer");
	input_close(in);
	t->len = 0;
	return ret;
}

/* The inode at "a/b/c", or NULL. */
static struct meta_inode *at(struct merge *m, const char *path)
{
	struct meta_inode *inode = m->c.tree->root;
	char copy[256], *save = NULL, *name;

	snprintf(copy, sizeof(copy), "%s", path);
	for (name = strtok_r(copy, "/", &save); name && inode;
	     name = strtok_r(NULL, "/", &save))
		inode = meta_dir_lookup(inode, name, strlen(name));
	return inode;
}

static bool is_file(struct merge *m, const char *path, const char *data)
{
	struct meta_inode *i = at(m, path);

	return i && S_ISREG(i->mode) && i->size == strlen(data) &&
	       (!i->size || !memcmp(i->data, data, i->size));
}

static bool is_dir(struct merge *m, const char *path)
{
	struct meta_inode *i = at(m, path);

	return i && S_ISDIR(i->mode);
}

/* ---- tests ---- */

static void test_whiteouts(void)
{
	struct tarbuf t = { 0 };
	struct merge m;

	merge_init(&m);
	DIR_(&t, "a/", 0755);
	FILE_(&t, "a/x", "x1");
	FILE_(&t, "a/y", "y1");
	FILE_(&t, "b", "b1");
	CHECK_EQ(apply(&m, &t), 0);
	FILE_(&t, "a/.wh.x", "");
	tar_add(&t, '0', "./.wh.b", NULL, "", 0);
	/* A whiteout hides lower layers only: z, added here, stays. */
	FILE_(&t, "a/z", "z2");
	FILE_(&t, "a/.wh.z", "");
	/* Whiting out what no layer has is no error. */
	FILE_(&t, "a/.wh.none", "");
	FILE_(&t, "nodir/.wh.n", "");
	CHECK_EQ(apply(&m, &t), 0);
	CHECK(!at(&m, "a/x"));
	CHECK(!at(&m, "b"));
	CHECK(is_file(&m, "a/y", "y1"));
	CHECK(is_file(&m, "a/z", "z2"));
	/* Whiteout files never enter the tree. */
	CHECK(!at(&m, "a/.wh.x"));
	CHECK(!at(&m, ".wh.b"));
	CHECK(!at(&m, "a/.wh.z"));
	CHECK(!at(&m, "nodir"));
	/* A removed name can come back in a later layer. */
	FILE_(&t, "b", "b3");
	CHECK_EQ(apply(&m, &t), 0);
	CHECK(is_file(&m, "b", "b3"));
	/* Invalid whiteout names are corrupt layers. */
	FILE_(&t, "a/.wh.", "");
	CHECK_EQ(apply(&m, &t), -EFSCORRUPTED);
	FILE_(&t, "a/.wh...", "");
	CHECK_EQ(apply(&m, &t), -EFSCORRUPTED);
	merge_free(&m);
	free(t.p);
}

static void test_opaque_dirs(void)
{
	struct tarbuf t = { 0 };
	struct merge m;

	merge_init(&m);
	DIR_(&t, "d/", 0755);
	FILE_(&t, "d/old", "o");
	DIR_(&t, "d/sub/", 0755);
	FILE_(&t, "d/sub/deep", "o");
	DIR_(&t, "d/kept/", 0755);
	FILE_(&t, "d/kept/lower", "o");
	FILE_(&t, "other", "o");
	CHECK_EQ(apply(&m, &t), 0);
	/* The marker hides every lower child wherever it stands in the layer. */
	FILE_(&t, "d/new", "n");
	DIR_(&t, "d/kept/", 0700);
	FILE_(&t, "d/kept/upper", "n");
	FILE_(&t, "d/.wh..wh..opq", "");
	CHECK_EQ(apply(&m, &t), 0);
	CHECK(is_file(&m, "d/new", "n"));
	CHECK(!at(&m, "d/old"));
	CHECK(!at(&m, "d/sub"));
	CHECK(!at(&m, "d/.wh..wh..opq"));
	/* A child directory the layer only updated loses its lower entries. */
	CHECK(is_dir(&m, "d/kept"));
	CHECK(at(&m, "d/kept") && (at(&m, "d/kept")->mode & 07777) == 0700);
	CHECK(!at(&m, "d/kept/lower"));
	CHECK(is_file(&m, "d/kept/upper", "n"));
	CHECK(is_file(&m, "other", "o"));
	CHECK_EQ(at(&m, "d")->nr_children, 2);
	merge_free(&m);
	free(t.p);
}

static void test_dir_over_dir(void)
{
	struct tarbuf t = { 0 };
	struct merge m;

	merge_init(&m);
	DIR_(&t, "d/", 0755);
	FILE_(&t, "d/keep", "k");
	DIR_(&t, "d/e/", 0755);
	FILE_(&t, "d/e/f", "f");
	CHECK_EQ(apply(&m, &t), 0);
	DIR_(&t, "d/", 0710);
	FILE_(&t, "d/added", "a");
	CHECK_EQ(apply(&m, &t), 0);
	/* Attributes updated, children kept. */
	CHECK(is_dir(&m, "d"));
	CHECK_EQ(at(&m, "d")->mode & 07777, 0710);
	CHECK(is_file(&m, "d/keep", "k"));
	CHECK(is_file(&m, "d/e/f", "f"));
	CHECK(is_file(&m, "d/added", "a"));
	/* Parents a layer does not list are created like tar does. */
	FILE_(&t, "p/q/r", "r");
	CHECK_EQ(apply(&m, &t), 0);
	CHECK(is_dir(&m, "p/q"));
	CHECK(is_file(&m, "p/q/r", "r"));
	merge_free(&m);
	free(t.p);
}

static void test_file_and_dir_replace_each_other(void)
{
	struct tarbuf t = { 0 };
	struct merge m;

	merge_init(&m);
	DIR_(&t, "p/", 0755);
	FILE_(&t, "p/child", "c");
	FILE_(&t, "q", "file");
	tar_add(&t, '2', "s", "q", NULL, 0777);
	CHECK_EQ(apply(&m, &t), 0);
	/* A file replaces a directory with its subtree... */
	FILE_(&t, "p", "now a file");
	/* ...a directory a file, and a directory a symlink. */
	DIR_(&t, "q/", 0755);
	FILE_(&t, "q/inner", "i");
	DIR_(&t, "s/", 0755);
	CHECK_EQ(apply(&m, &t), 0);
	CHECK(is_file(&m, "p", "now a file"));
	CHECK(!at(&m, "p/child"));
	CHECK(is_dir(&m, "q"));
	CHECK(is_file(&m, "q/inner", "i"));
	CHECK(is_dir(&m, "s"));
	CHECK_EQ(at(&m, "s")->nr_children, 0);
	/* A symlink replaces a file. */
	tar_add(&t, '2', "q/inner", "../p", NULL, 0777);
	CHECK_EQ(apply(&m, &t), 0);
	CHECK(at(&m, "q/inner") && S_ISLNK(at(&m, "q/inner")->mode));
	merge_free(&m);
	free(t.p);
}

static void test_hardlinks_across_layers(void)
{
	struct tarbuf t = { 0 };
	struct merge m;
	struct meta_inode *f;

	merge_init(&m);
	DIR_(&t, "bin/", 0755);
	FILE_(&t, "bin/tool", "tool v1");
	CHECK_EQ(apply(&m, &t), 0);
	/* A link to a lower layer's file shares its inode. */
	LINK_(&t, "bin/alias", "bin/tool");
	LINK_(&t, "./top", "/bin/tool");
	CHECK_EQ(apply(&m, &t), 0);
	f = at(&m, "bin/tool");
	CHECK(f && at(&m, "bin/alias") == f && at(&m, "top") == f);
	CHECK(f && f->links == 3);
	/* Replacing one name leaves the others on the old inode. */
	FILE_(&t, "bin/tool", "tool v2");
	CHECK_EQ(apply(&m, &t), 0);
	CHECK(is_file(&m, "bin/tool", "tool v2"));
	CHECK(is_file(&m, "bin/alias", "tool v1"));
	CHECK(at(&m, "bin/alias") == at(&m, "top"));
	CHECK(at(&m, "bin/alias") && at(&m, "bin/alias")->links == 2);
	/* Whiting out a link keeps the inode's other name. */
	FILE_(&t, "bin/.wh.alias", "");
	CHECK_EQ(apply(&m, &t), 0);
	CHECK(!at(&m, "bin/alias"));
	CHECK(is_file(&m, "top", "tool v1"));
	/* Links to nothing, to the root or out of it are corrupt layers. */
	LINK_(&t, "dangling", "no/such");
	CHECK(apply(&m, &t) < 0);
	LINK_(&t, "up", "../etc/passwd");
	CHECK_EQ(apply(&m, &t), -EFSCORRUPTED);
	LINK_(&t, "root", "./");
	CHECK_EQ(apply(&m, &t), -EFSCORRUPTED);
	merge_free(&m);
	free(t.p);
}

static void test_paths(void)
{
	struct tarbuf t = { 0 };
	struct merge m;

	merge_init(&m);
	FILE_(&t, "./a//b/./c", "c");
	CHECK_EQ(apply(&m, &t), 0);
	CHECK(is_file(&m, "a/b/c", "c"));
	FILE_(&t, "a/../../evil", "e");
	CHECK_EQ(apply(&m, &t), -EINVAL);
	CHECK(!at(&m, "evil"));
	/* The root can only be a directory. */
	FILE_(&t, "./", "x");
	CHECK_EQ(apply(&m, &t), -EFSCORRUPTED);
	DIR_(&t, "./", 0700);
	CHECK_EQ(apply(&m, &t), 0);
	CHECK_EQ(m.c.tree->root->mode & 07777, 0700);
	merge_free(&m);
	free(t.p);
}

int main(void)
{
	ferry_log_level = -1;
	RUN_TEST(test_whiteouts);
	RUN_TEST(test_opaque_dirs);
	RUN_TEST(test_dir_over_dir);
	RUN_TEST(test_file_and_dir_replace_each_other);
	RUN_TEST(test_hardlinks_across_layers);
	RUN_TEST(test_paths);
	TEST_MAIN_END();
}
