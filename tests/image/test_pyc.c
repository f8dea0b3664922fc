// SPDX-License-Identifier: MIT
/*
 * pyc.c: the imports of a module body, read from .pyc files that this
 * machine's /usr/bin/python3 compiles (CPython 3.8 to 3.12), and hostile
 * variants of them: truncated at every length, a byte changed at every
 * place, huge lengths and counts, deep nesting, a back-reference past the
 * ones read, another Python's magic. Those must be "nothing" or fewer
 * imports, never a read outside the buffer (run under ASan by
 * check-asan) or a name that is not one.
 */
#include <errno.h>

#include "../test.h"
#include "../../pkg-image/internal.h"

/*
 * The module: its body's imports in order (EXPECT), then names that are
 * no import of the body: a string, a function's and a class body's
 * imports.
 */
static const char source[] =
	"\"\"\"A module.\"\"\"\n"
	"import os\n"
	"import json.decoder\n"
	"from . import sibling\n"
	"from .pkg.sub import thing, other\n"
	"from ..up import x\n"
	"import zlib as z\n"
	"try:\n"
	"    import missing_mod\n"
	"except ImportError:\n"
	"    missing_mod = None\n"
	"if os.name == 'posix':\n"
	"    from email import message as m\n"
	"NAME = 'stringmod'\n"
	"def f():\n"
	"    import lazy_inside\n"
	"    return lazy_inside\n"
	"class C:\n"
	"    def g(self):\n"
	"        from . import lazy_method\n"
	"        return lazy_method\n"
	"X = [i for i in range(300)]\n";

static const struct { const char *name, *from; unsigned int level; } expect[] = {
	{ "os", NULL, 0 }, { "json.decoder", NULL, 0 }, { "", NULL, 1 },
	{ "", "sibling", 1 }, { "pkg.sub", NULL, 1 }, { "pkg.sub", "thing", 1 },
	{ "pkg.sub", "other", 1 }, { "up", NULL, 2 }, { "up", "x", 2 },
	{ "zlib", NULL, 0 }, { "missing_mod", NULL, 0 }, { "email", NULL, 0 },
	{ "email", "message", 0 },
};

#define MAX_OUT 64

static char dir[] = "/tmp/ferry-test-pyc.XXXXXX";

/* The source compiled by /usr/bin/python3 into @path; its bytes. */
static uint8_t *compile(const char *src, size_t *len)
{
	const char *py = test_path(dir, "m.py"), *pyc = test_path(dir, "m.pyc");
	FILE *f = fopen(py, "w");

	if (!f || fputs(src, f) < 0 || fclose(f)) {
		CHECK(!"write the module's source");
		return NULL;
	}
	if (test_run("/usr/bin/python3 -c 'import py_compile, sys; "
		     "py_compile.compile(sys.argv[1], cfile=sys.argv[2], doraise=True)' %s %s",
		     py, pyc)) {
		CHECK(!"/usr/bin/python3 compiles the module");
		return NULL;
	}
	return test_read_file(pyc, len);
}

/* What any result must be: names and levels within bounds, in @buf. */
static void check_sane(const uint8_t *buf, size_t len, const struct pyc_import *im, int nr)
{
	int i;

	CHECK(nr >= 0 && nr <= MAX_OUT);
	for (i = 0; i < nr; i++) {
		CHECK((const uint8_t *)im[i].name >= buf &&
		      (const uint8_t *)im[i].name + im[i].name_len <= buf + len);
		CHECK(im[i].name_len || im[i].level);
		CHECK(im[i].level <= 64);
		CHECK(!im[i].from || ((const uint8_t *)im[i].from >= buf && im[i].from_len &&
				      (const uint8_t *)im[i].from + im[i].from_len <= buf + len &&
				      !memchr(im[i].from, '.', im[i].from_len)));
		CHECK(!memchr(im[i].name, '/', im[i].name_len));
	}
}

static void test_module(void)
{
	struct pyc_import im[MAX_OUT];
	uint8_t *buf;
	size_t len, i;
	int nr;

	buf = compile(source, &len);
	if (!buf)
		return;
	nr = pyc_imports(buf, len, im, MAX_OUT);
	check_sane(buf, len, im, nr);
	CHECK_EQ(nr, (int)ARRAY_SIZE(expect));
	for (i = 0; i < ARRAY_SIZE(expect) && (int)i < nr; i++) {
		CHECK_EQ(im[i].level, expect[i].level);
		CHECK(im[i].name_len == strlen(expect[i].name) &&
		      !memcmp(im[i].name, expect[i].name, im[i].name_len));
		CHECK(!im[i].from == !expect[i].from);
		CHECK(!im[i].from || (im[i].from_len == strlen(expect[i].from) &&
				      !memcmp(im[i].from, expect[i].from, im[i].from_len)));
		if (im[i].level != expect[i].level || !im[i].from != !expect[i].from)
			fprintf(stderr, "  import %zu: got %.*s (level %u, from %.*s)\n", i,
				im[i].name_len, im[i].name, im[i].level,
				im[i].from ? im[i].from_len : 4, im[i].from ? im[i].from : "none");
	}
	/* At most @max, the first ones. */
	CHECK_EQ(pyc_imports(buf, len, im, 2), 2);
	CHECK(im[1].name_len == 12 && !memcmp(im[1].name, "json.decoder", 12));
	free(buf);
}

/* A module without imports has none; one that only defines functions too. */
static void test_no_imports(void)
{
	struct pyc_import im[MAX_OUT];
	uint8_t *buf;
	size_t len;

	buf = compile("def f():\n    import os\n    return os\nos = 1\n", &len);
	if (!buf)
		return;
	CHECK_EQ(pyc_imports(buf, len, im, MAX_OUT), 0);
	free(buf);
}

static void test_hostile(void)
{
	struct pyc_import im[MAX_OUT];
	uint8_t *buf, *b;
	size_t len, i;
	int nr, full;

	buf = compile(source, &len);
	if (!buf)
		return;
	full = pyc_imports(buf, len, im, MAX_OUT);
	b = malloc(len);
	if (!b) {
		free(buf);
		CHECK(!"memory");
		return;
	}
	/* Truncated at every length: a copy of just that many bytes, so
	 * that ASan sees a read past them. */
	for (i = 0; i < len; i++) {
		uint8_t *t = malloc(i ? i : 1);

		if (!t)
			break;
		memcpy(t, buf, i);
		nr = pyc_imports(t, i, im, MAX_OUT);
		check_sane(t, i, im, nr);
		CHECK(nr <= full);
		free(t);
	}
	/* A byte changed at every place, to three values. */
	for (i = 0; i < len * 3; i++) {
		static const uint8_t v[] = { 0xff, 0x7f, 0x00 };

		memcpy(b, buf, len);
		b[i / 3] = b[i / 3] == v[i % 3] ? 0x80 : v[i % 3];
		nr = pyc_imports(b, len, im, MAX_OUT);
		check_sane(b, len, im, nr);
	}
	/* The body's code bytes (after the 16-byte header, its type and its
	 * five or six counts) with a huge or negative length. */
	for (i = 17; i + 5 < len && (buf[i] & 0x7f) != 's'; i += 4)
		;
	CHECK((buf[i] & 0x7f) == 's');
	memcpy(b, buf, len);
	put_le32(b + i + 1, 0x7fffffff);
	CHECK_EQ(pyc_imports(b, len, im, MAX_OUT), 0);
	put_le32(b + i + 1, 0xffffffff);
	CHECK_EQ(pyc_imports(b, len, im, MAX_OUT), 0);
	/* Another Python's magic (3.13's 3571, 3.7's 3394), or none. */
	memcpy(b, buf, len);
	put_le16(b, 3571);
	CHECK_EQ(pyc_imports(b, len, im, MAX_OUT), 0);
	put_le16(b, 3394);
	CHECK_EQ(pyc_imports(b, len, im, MAX_OUT), 0);
	b[2] = 0;
	CHECK_EQ(pyc_imports(b, len, im, MAX_OUT), 0);
	free(b);
	free(buf);
}

/* Synthetic bodies: nesting, counts, back-references. */
static void test_synthetic(void)
{
	static uint8_t b[16 + 1 + 20 + 200000];
	struct pyc_import im[MAX_OUT];
	size_t n, i;

	/* 3.11's header and a body whose code is a tuple nested 100,000 deep. */
	memset(b, 0, sizeof(b));
	put_le16(b, 3495);
	b[2] = '\r';
	b[3] = '\n';
	b[16] = 0xe3; /* 'c' | FLAG_REF */
	n = 37;
	for (i = 0; i < 100000; i++) {
		b[n++] = ')';
		b[n++] = 1;
	}
	CHECK_EQ(pyc_imports(b, n, im, MAX_OUT), 0);
	/* A tuple of 2^31 - 1 items in a few bytes. */
	n = 37;
	b[n++] = 's';
	put_le32(b + n, 0);
	n += 4;
	b[n++] = '(';
	put_le32(b + n, 0x7fffffff);
	n += 4;
	CHECK_EQ(pyc_imports(b, n + 8, im, MAX_OUT), 0);
	/* A body that imports abc (LOAD_CONST 0, LOAD_CONST None,
	 * IMPORT_NAME 0), then the same with the name a back-reference past
	 * those read, or to the body itself (refs[0], no string). */
	n = 37;
	b[n++] = 's';
	put_le32(b + n, 6);
	memcpy(b + n + 4, "\x64\x00\x64\x01\x6c\x00", 6);
	n += 10;
	memcpy(b + n, ")\x02i\0\0\0\0N)\x01", 10); /* consts (0, None); names: 1 */
	n += 10;
	memcpy(b + n, "z\x03" "abc", 5);
	CHECK_EQ(pyc_imports(b, n + 5, im, MAX_OUT), 1);
	CHECK(im[0].name_len == 3 && !memcmp(im[0].name, "abc", 3) && !im[0].level);
	b[n] = 'r';
	put_le32(b + n + 1, 1);
	CHECK_EQ(pyc_imports(b, n + 5, im, MAX_OUT), 0);
	put_le32(b + n + 1, 0);
	CHECK_EQ(pyc_imports(b, n + 5, im, MAX_OUT), 0);
	/* A level that is no int, or a name that is no module name. */
	memcpy(b + n, "z\x03" "a/c", 5);
	CHECK_EQ(pyc_imports(b, n + 5, im, MAX_OUT), 0);
	memcpy(b + n, "z\x03" "abc", 5);
	memcpy(b + n - 8, "z\x03lvl", 5);
	CHECK_EQ(pyc_imports(b, n + 5, im, MAX_OUT), 0);
}

int main(void)
{
	if (!mkdtemp(dir)) {
		perror("mkdtemp");
		return 1;
	}
	RUN_TEST(test_module);
	RUN_TEST(test_no_imports);
	RUN_TEST(test_hostile);
	RUN_TEST(test_synthetic);
	test_run("rm -rf %s", dir);
	TEST_MAIN_END();
}
