// SPDX-License-Identifier: MIT
/*
 * elf.c: a program's interpreter, DT_NEEDED libraries and run path from
 * synthetic ELF64 and ELF32 files, and hostile variants of them, which
 * must be "nothing to predict" (1) or lose only the bad name, never read
 * outside the file.
 */
#include <errno.h>

#include "../test.h"
#include "../../pkg-image/internal.h"

#define FILE_SIZE 0x600
#define INTERP "/lib64/ld-linux-x86-64.so.2"
#define VADDR 0x400000u

struct mem {
	uint8_t buf[FILE_SIZE];
	uint64_t size;
	int fail;        /* -errno to return from every read */
	unsigned int reads;
	uint64_t read_end; /* the end of the furthest read so far */
	unsigned int interp_calls;
};

static int mem_read(void *ctx, uint64_t off, void *buf, size_t len)
{
	struct mem *m = ctx;

	m->reads++;
	if (m->fail)
		return m->fail;
	/* elf.c checks bounds itself; a read outside the file is its bug. */
	CHECK(off <= m->size && len <= m->size - off);
	if (off > m->size || len > m->size - off)
		return -EINVAL;
	memcpy(buf, m->buf + off, len);
	m->read_end = MAX(m->read_end, off + len);
	return 0;
}

/* The interpreter is told before the dynamic section (at 0x300) is read. */
static void mem_interp(void *ctx, const char *interp)
{
	struct mem *m = ctx;

	m->interp_calls++;
	CHECK(!strcmp(interp, INTERP));
	CHECK(m->read_end <= 0x300);
}

static const char dynstr[] = "\0libm.so.6\0libc.so.6\0/opt/lib:$ORIGIN/x";
#define STRSZ sizeof(dynstr) /* with the final NUL */

/* ELF64: PT_INTERP at 0x200, PT_LOAD of the whole file, dynamic at 0x300. */
static void elf64(struct mem *m)
{
	uint8_t *b = m->buf, *ph, *dyn;
	static const uint64_t tags[][2] = {
		{ 1, 1 }, { 1, 11 }, { 29, 21 }, { 5, VADDR + 0x400 },
		{ 10, STRSZ }, { 0, 0 },
	};
	size_t i;

	memset(m, 0, sizeof(*m));
	m->size = FILE_SIZE;
	memcpy(b, "\177ELF\2\1\1", 7);
	put_le16(b + 18, 62);
	put_le64(b + 32, 64);   /* e_phoff */
	put_le16(b + 54, 56);   /* e_phentsize */
	put_le16(b + 56, 3);    /* e_phnum */
	ph = b + 64;
	put_le32(ph, 3);        /* PT_INTERP */
	put_le64(ph + 8, 0x200);
	put_le64(ph + 32, sizeof(INTERP));
	ph += 56;
	put_le32(ph, 1);        /* PT_LOAD */
	put_le64(ph + 16, VADDR);
	put_le64(ph + 32, FILE_SIZE);
	ph += 56;
	put_le32(ph, 2);        /* PT_DYNAMIC */
	put_le64(ph + 8, 0x300);
	put_le64(ph + 32, sizeof(tags));
	memcpy(b + 0x200, INTERP, sizeof(INTERP));
	for (i = 0, dyn = b + 0x300; i < ARRAY_SIZE(tags); i++, dyn += 16) {
		put_le64(dyn, tags[i][0]);
		put_le64(dyn + 8, tags[i][1]);
	}
	memcpy(b + 0x400, dynstr, STRSZ);
}

static void test_elf64(void)
{
	struct elf_deps d;
	struct mem m;

	elf64(&m);
	CHECK_EQ(elf_deps_read(mem_read, mem_interp, &m, m.size, &d), 0);
	CHECK_EQ(m.interp_calls, 1);
	CHECK(m.read_end > 0x300);
	CHECK(d.interp && !strcmp(d.interp, INTERP));
	CHECK_EQ(d.nr_needed, 2);
	CHECK(d.nr_needed == 2 && !strcmp(d.needed[0], "libm.so.6") &&
	      !strcmp(d.needed[1], "libc.so.6"));
	CHECK(d.runpath && !strcmp(d.runpath, "/opt/lib:$ORIGIN/x"));
	CHECK_EQ(d.machine, 62);
	CHECK(d.is64);
	elf_deps_free(&d);

	/* Errors of the reader reach the caller. */
	elf64(&m);
	m.fail = -EIO;
	CHECK_EQ(elf_deps_read(mem_read, NULL, &m, m.size, &d), -EIO);
}

static void test_elf32(void)
{
	uint8_t *b, *ph;
	struct elf_deps d;
	struct mem m;

	memset(&m, 0, sizeof(m));
	m.size = FILE_SIZE;
	b = m.buf;
	memcpy(b, "\177ELF\1\1\1", 7);
	put_le16(b + 18, 3);
	put_le32(b + 28, 52);   /* e_phoff */
	put_le16(b + 42, 32);   /* e_phentsize */
	put_le16(b + 44, 2);
	ph = b + 52;
	put_le32(ph, 1);        /* PT_LOAD */
	put_le32(ph + 8, VADDR);
	put_le32(ph + 16, FILE_SIZE);
	ph += 32;
	put_le32(ph, 2);        /* PT_DYNAMIC */
	put_le32(ph + 4, 0x300);
	put_le32(ph + 16, 32);
	put_le32(b + 0x300, 1);
	put_le32(b + 0x304, 11);
	put_le32(b + 0x308, 5);
	put_le32(b + 0x30c, VADDR + 0x400);
	put_le32(b + 0x310, 10);
	put_le32(b + 0x314, STRSZ);
	memcpy(b + 0x400, dynstr, STRSZ);
	CHECK_EQ(elf_deps_read(mem_read, NULL, &m, m.size, &d), 0);
	CHECK(!d.interp && !d.runpath && !d.is64);
	CHECK(d.nr_needed == 1 && !strcmp(d.needed[0], "libc.so.6"));
	elf_deps_free(&d);
}

/* Each variant of the good file, and what elf_deps_read must say. */
static void test_hostile(void)
{
	struct elf_deps d;
	struct mem m;
	int ret;

	/* Not ELF, big-endian, too short. */
	elf64(&m);
	m.buf[0] = 'x';
	CHECK_EQ(elf_deps_read(mem_read, NULL, &m, m.size, &d), 1);
	elf64(&m);
	m.buf[5] = 2;
	CHECK_EQ(elf_deps_read(mem_read, NULL, &m, m.size, &d), 1);
	elf64(&m);
	CHECK_EQ(elf_deps_read(mem_read, NULL, &m, 51, &d), 1);
	CHECK_EQ(elf_deps_read(mem_read, NULL, &m, 63, &d), 1);
	/* Program headers past the end, too many, too small, none. */
	elf64(&m);
	CHECK_EQ(elf_deps_read(mem_read, NULL, &m, 64 + 56 * 2, &d), 1);
	elf64(&m);
	put_le64(m.buf + 32, UINT64_MAX - 8);
	CHECK_EQ(elf_deps_read(mem_read, NULL, &m, m.size, &d), 1);
	elf64(&m);
	put_le16(m.buf + 56, 0xffff);
	CHECK_EQ(elf_deps_read(mem_read, NULL, &m, m.size, &d), 1);
	elf64(&m);
	put_le16(m.buf + 54, 32);
	CHECK_EQ(elf_deps_read(mem_read, NULL, &m, m.size, &d), 1);
	elf64(&m);
	put_le16(m.buf + 56, 0);
	CHECK_EQ(elf_deps_read(mem_read, NULL, &m, m.size, &d), 1);
	/* An interpreter without its NUL, empty, or of absurd size. */
	elf64(&m);
	m.buf[0x200 + sizeof(INTERP) - 1] = 'x';
	CHECK_EQ(elf_deps_read(mem_read, NULL, &m, m.size, &d), 1);
	elf64(&m);
	m.buf[0x200] = '\0';
	CHECK_EQ(elf_deps_read(mem_read, NULL, &m, m.size, &d), 1);
	elf64(&m);
	put_le64(m.buf + 64 + 32, UINT64_MAX);
	CHECK_EQ(elf_deps_read(mem_read, NULL, &m, m.size, &d), 1);
	/* A string table outside every PT_LOAD, or larger than it. */
	elf64(&m);
	put_le64(m.buf + 0x300 + 3 * 16 + 8, 0x10);
	CHECK_EQ(elf_deps_read(mem_read, NULL, &m, m.size, &d), 1);
	elf64(&m);
	put_le64(m.buf + 0x300 + 4 * 16 + 8, UINT64_MAX);
	CHECK_EQ(elf_deps_read(mem_read, NULL, &m, m.size, &d), 1);
	/* A PT_LOAD that claims more than the file: reads stay inside. */
	elf64(&m);
	put_le64(m.buf + 64 + 56 + 32, UINT64_MAX / 2);
	put_le64(m.buf + 0x300 + 3 * 16 + 8, VADDR + FILE_SIZE - 4);
	put_le64(m.buf + 0x300 + 4 * 16 + 8, 1u << 20);
	ret = elf_deps_read(mem_read, NULL, &m, m.size, &d);
	CHECK(ret == 0 || ret == 1);
	if (!ret) {
		CHECK_EQ(d.nr_needed, 0);
		elf_deps_free(&d);
	}
	/* A name the table does not hold, or unterminated: that name only. */
	elf64(&m);
	put_le64(m.buf + 0x300 + 8, STRSZ + 5);
	CHECK_EQ(elf_deps_read(mem_read, NULL, &m, m.size, &d), 0);
	CHECK(d.nr_needed == 1 && !strcmp(d.needed[0], "libc.so.6"));
	elf_deps_free(&d);
	elf64(&m);
	memset(m.buf + 0x400 + 11, 'a', STRSZ - 11);
	put_le64(m.buf + 0x300 + 2 * 16, 0x7fffffff); /* no run path */
	CHECK_EQ(elf_deps_read(mem_read, NULL, &m, m.size, &d), 0);
	CHECK(d.nr_needed == 1 && !strcmp(d.needed[0], "libm.so.6") && !d.runpath);
	elf_deps_free(&d);
	/* A dynamic section running off the end of the file. */
	elf64(&m);
	put_le64(m.buf + 64 + 2 * 56 + 32, 1u << 30);
	CHECK_EQ(elf_deps_read(mem_read, NULL, &m, m.size, &d), 1);
}

/* Two entries: a program (interpreter, two libraries, run path) and a library. */
static void section_entries(struct image_elf_entry e[2])
{
	memset(e, 0, 2 * sizeof(*e));
	e[0].path = strdup("/usr/bin/prog");
	e[0].deps.interp = strdup(INTERP);
	e[0].deps.needed[0] = strdup("libm.so.6");
	e[0].deps.needed[1] = strdup("libc.so.6");
	e[0].deps.nr_needed = 2;
	e[0].deps.runpath = strdup("/opt/lib");
	e[0].deps.machine = 62;
	e[0].deps.is64 = true;
	e[1].path = strdup("/usr/lib/libm.so.6");
	e[1].deps.needed[0] = strdup("libc.so.6");
	e[1].deps.nr_needed = 1;
	e[1].deps.machine = 3;
}

/* @buf with byte @at set to @v decodes to -EFSCORRUPTED. */
static void section_bad(const uint8_t *buf, size_t len, size_t at, uint8_t v)
{
	uint8_t *copy = malloc(len);
	struct image_elf_entry *e;
	uint32_t nr;

	memcpy(copy, buf, len);
	copy[at] = v;
	CHECK_EQ(elf_section_decode(copy, len, &e, &nr), -EFSCORRUPTED);
	CHECK(!e && !nr);
	free(copy);
}

static void test_section(void)
{
	struct image_elf_entry e[2], *got;
	uint8_t *buf, *again;
	size_t len, len2, i;
	uint32_t nr;

	section_entries(e);
	CHECK_EQ(elf_section_encode(e, 2, &buf, &len), 0);
	CHECK_EQ(elf_section_decode(buf, len, &got, &nr), 0);
	CHECK_EQ(nr, 2);
	CHECK(!strcmp(got[0].path, "/usr/bin/prog") && !strcmp(got[0].deps.interp, INTERP) &&
	      got[0].deps.nr_needed == 2 && !strcmp(got[0].deps.needed[1], "libc.so.6") &&
	      !strcmp(got[0].deps.runpath, "/opt/lib") && got[0].deps.machine == 62 &&
	      got[0].deps.is64);
	CHECK(!strcmp(got[1].path, "/usr/lib/libm.so.6") && !got[1].deps.interp &&
	      !got[1].deps.runpath && got[1].deps.nr_needed == 1 &&
	      got[1].deps.machine == 3 && !got[1].deps.is64);
	/* One form per content: encoding what was decoded gives the bytes back. */
	CHECK_EQ(elf_section_encode(got, nr, &again, &len2), 0);
	CHECK(len2 == len && !memcmp(again, buf, len));
	free(again);
	image_elf_entries_free(got, nr);

	/* Every truncation, and one byte too many, is refused. */
	for (i = 0; i < len; i++) {
		CHECK_EQ(elf_section_decode(buf, i, &got, &nr), -EFSCORRUPTED);
		CHECK(!got && !nr);
	}
	again = calloc(1, len + 1);
	memcpy(again, buf, len);
	CHECK_EQ(elf_section_decode(again, len + 1, &got, &nr), -EFSCORRUPTED);
	free(again);
	section_bad(buf, len, 0, 'X');          /* magic */
	section_bad(buf, len, 8, 2);            /* version */
	section_bad(buf, len, 12, 3);           /* count */
	section_bad(buf, len, 16 + 2, 'u');     /* "uusr/bin/prog": not absolute */
	section_bad(buf, len, 16 + 2 + 5, '/'); /* "/usr//in/prog" */
	section_bad(buf, len, 16 + 2 + 13 + 2, 2); /* a flag bit ferry does not set */
	section_bad(buf, len, 16 + 2 + 13 + 3, ELF_NEEDED_MAX + 1);
	section_bad(buf, len, 16 + 2 + 13 + 4 + 2 + 3, 0); /* NUL in the interpreter */
	/* The second path sorted before the first. */
	section_bad(buf, len, 16 + 2 + 13 + 4 + 2 + sizeof(INTERP) - 1 + 2 + 8 +
			      1 + 9 + 1 + 9 + 2 + 5, 'a');
	free(buf);

	/* Unsorted or duplicate paths cannot be bsearched: refused. */
	free(e[1].path);
	e[1].path = strdup("/usr/bin/prog");
	CHECK_EQ(elf_section_encode(e, 2, &buf, &len), 0);
	CHECK_EQ(elf_section_decode(buf, len, &got, &nr), -EFSCORRUPTED);
	free(buf);
	/* An entry with neither interpreter nor library records nothing. */
	elf_deps_free(&e[1].deps);
	free(e[1].path);
	e[1].path = strdup("/z");
	CHECK_EQ(elf_section_encode(e, 2, &buf, &len), 0);
	CHECK_EQ(elf_section_decode(buf, len, &got, &nr), -EFSCORRUPTED);
	free(buf);
	for (i = 0; i < 2; i++) {
		free(e[i].path);
		elf_deps_free(&e[i].deps);
	}
}

int main(void)
{
	RUN_TEST(test_elf64);
	RUN_TEST(test_elf32);
	RUN_TEST(test_hostile);
	RUN_TEST(test_section);
	TEST_MAIN_END();
}
