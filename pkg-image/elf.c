// SPDX-License-Identifier: MIT
/*
 * What a dynamic loader opens right after an ELF file: its interpreter
 * (PT_INTERP), its DT_NEEDED libraries and where it says to look for them
 * (DT_RUNPATH, else DT_RPATH). Fetch-ahead uses it to fetch a program's
 * libraries while the loader still waits for the program (cache.c). The
 * file comes from an image, so everything is untrusted: every offset and
 * size is checked against the file and bounded before a byte is read, and
 * anything unusual is "nothing to predict", never a guess.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define EHDR_MAX 64          /* ELF64 header; ELF32's is 52 */
#define PHNUM_MAX 512
#define DYNAMIC_MAX (64u << 10)
#define INTERP_MAX 4096
#define NAME_MAX_LEN 255     /* a DT_NEEDED name, as the loaders allow */

enum {
	PT_LOAD = 1, PT_DYNAMIC = 2, PT_INTERP = 3,
	DT_NULL = 0, DT_NEEDED = 1, DT_STRTAB = 5, DT_STRSZ = 10,
	DT_RPATH = 15, DT_RUNPATH = 29,
};

struct elf_file {
	elf_read_fn read;
	void *ctx;
	uint64_t size;
	bool is64;
	uint8_t *ph;            /* the program headers */
	uint32_t phnum, phentsize;
};

/* Read [@off, @off + @len) of the file: 1 where it is not all in the file. */
static int elf_read(const struct elf_file *f, uint64_t off, void *buf, size_t len)
{
	if (off > f->size || len > f->size - off)
		return 1;
	return f->read(f->ctx, off, buf, len);
}

static uint64_t field(const struct elf_file *f, const uint8_t *p, size_t off64,
		      size_t off32)
{
	return f->is64 ? get_le64(p + off64) : get_le32(p + off32);
}

/* Program header @i: type, file offset, virtual address, size in the file. */
static void phdr(const struct elf_file *f, uint32_t i, uint32_t *type,
		 uint64_t *offset, uint64_t *vaddr, uint64_t *filesz)
{
	const uint8_t *p = f->ph + (size_t)i * f->phentsize;

	*type = get_le32(p);
	*offset = field(f, p, 8, 4);
	*vaddr = field(f, p, 16, 8);
	*filesz = field(f, p, 32, 16);
}

/* The file offset of @len bytes at virtual address @vaddr, or 1. */
static int vaddr_to_off(const struct elf_file *f, uint64_t vaddr, uint64_t len,
			uint64_t *off)
{
	uint64_t o, v, sz;
	uint32_t i, type;

	for (i = 0; i < f->phnum; i++) {
		phdr(f, i, &type, &o, &v, &sz);
		if (type != PT_LOAD || vaddr < v || vaddr - v > sz ||
		    len > sz - (vaddr - v))
			continue;
		if (__builtin_add_overflow(o, vaddr - v, off))
			return 1;
		return 0;
	}
	return 1;
}

/* A NUL-terminated string of 1..@max bytes at @off, no further than @end. */
static int read_string(const struct elf_file *f, uint64_t off, uint64_t end,
		       size_t max, char **out)
{
	size_t len = (size_t)MIN((uint64_t)max + 1, end > off ? end - off : 0);
	char *s, *nul;
	int ret;

	/* A string that ends the file ends its window there too. */
	if (off < f->size)
		len = (size_t)MIN((uint64_t)len, f->size - off);
	if (!len)
		return 1;
	s = malloc(len);
	if (!s)
		return -ENOMEM;
	ret = elf_read(f, off, s, len);
	nul = ret ? NULL : memchr(s, '\0', len);
	if (!ret && (!nul || nul == s))
		ret = 1;
	if (ret) {
		free(s);
		return ret;
	}
	*out = s;
	return 0;
}

static int read_interp(struct elf_file *f, uint64_t off, uint64_t sz,
		       struct elf_deps *d)
{
	if (sz < 2 || sz > INTERP_MAX || off > UINT64_MAX - sz)
		return 1;
	return read_string(f, off, off + sz, (size_t)sz - 1, &d->interp);
}

/* DT_NEEDED names and the run path from the dynamic section at @off. */
static int read_dynamic(struct elf_file *f, uint64_t off, uint64_t sz,
			struct elf_deps *d)
{
	size_t ent = f->is64 ? 16 : 8, n, i;
	uint64_t needed[ELF_NEEDED_MAX], strtab = 0, strsz = 0, str_off, path = 0;
	uint32_t nr_needed = 0;
	bool have_strtab = false, have_path = false;
	uint8_t *dyn;
	int ret;

	n = (size_t)MIN(sz, (uint64_t)DYNAMIC_MAX) / ent;
	if (!n)
		return 1;
	dyn = malloc(n * ent);
	if (!dyn)
		return -ENOMEM;
	ret = elf_read(f, off, dyn, n * ent);
	for (i = 0; !ret && i < n; i++) {
		uint64_t tag = field(f, dyn + i * ent, 0, 0);
		uint64_t val = field(f, dyn + i * ent, 8, 4);

		if (tag == DT_NULL)
			break;
		switch (tag) {
		case DT_NEEDED:
			if (nr_needed < ELF_NEEDED_MAX)
				needed[nr_needed++] = val;
			break;
		case DT_STRTAB:
			strtab = val;
			have_strtab = true;
			break;
		case DT_STRSZ:
			strsz = val;
			break;
		case DT_RPATH: /* DT_RUNPATH wins, as in the loader */
		case DT_RUNPATH:
			if (!have_path || tag == DT_RUNPATH)
				path = val;
			have_path = true;
			break;
		}
	}
	free(dyn);
	if (ret || (!nr_needed && !have_path))
		return ret;
	if (!have_strtab || !strsz || vaddr_to_off(f, strtab, strsz, &str_off) ||
	    str_off > UINT64_MAX - strsz)
		return 1;
	/* A name the table does not hold is skipped, not the whole file. */
	for (i = 0; i < nr_needed; i++) {
		if (needed[i] >= strsz)
			continue;
		ret = read_string(f, str_off + needed[i], str_off + strsz,
				  NAME_MAX_LEN, &d->needed[d->nr_needed]);
		if (ret < 0)
			return ret;
		if (!ret)
			d->nr_needed++;
	}
	if (have_path && path < strsz) {
		ret = read_string(f, str_off + path, str_off + strsz, INTERP_MAX,
				  &d->runpath);
		if (ret < 0)
			return ret;
	}
	return 0;
}

int elf_deps_read(elf_read_fn read, elf_interp_fn interp, void *ctx,
		  uint64_t size, struct elf_deps *d)
{
	struct elf_file f = { .read = read, .ctx = ctx, .size = size };
	uint8_t eh[EHDR_MAX];
	uint64_t phoff, off, vaddr, sz;
	uint32_t i, type;
	int ret;

	memset(d, 0, sizeof(*d));
	if (size < 52)
		return 1;
	ret = elf_read(&f, 0, eh, (size_t)MIN(size, (uint64_t)EHDR_MAX));
	if (ret)
		return ret;
	/* Little-endian ELF32 or ELF64, version 1. */
	if (memcmp(eh, "\177ELF", 4) || (eh[4] != 1 && eh[4] != 2) || eh[5] != 1 ||
	    eh[6] != 1 || (eh[4] == 2 && size < EHDR_MAX))
		return 1;
	f.is64 = eh[4] == 2;
	d->is64 = f.is64;
	d->machine = get_le16(eh + 18);
	phoff = field(&f, eh, 32, 28);
	f.phentsize = get_le16(eh + (f.is64 ? 54 : 42));
	f.phnum = get_le16(eh + (f.is64 ? 56 : 44));
	if (!f.phnum || f.phnum > PHNUM_MAX || f.phentsize < (f.is64 ? 56u : 32u))
		return 1;
	f.ph = malloc((size_t)f.phnum * f.phentsize);
	if (!f.ph)
		return -ENOMEM;
	ret = elf_read(&f, phoff, f.ph, (size_t)f.phnum * f.phentsize);
	for (i = 0; !ret && i < f.phnum; i++) {
		phdr(&f, i, &type, &off, &vaddr, &sz);
		if (type == PT_INTERP && !d->interp)
			ret = read_interp(&f, off, sz, d);
	}
	if (!ret && d->interp && interp)
		interp(ctx, d->interp);
	for (i = 0; !ret && i < f.phnum; i++) {
		phdr(&f, i, &type, &off, &vaddr, &sz);
		if (type == PT_DYNAMIC) {
			ret = read_dynamic(&f, off, sz, d);
			break;
		}
	}
	free(f.ph);
	if (ret || (!d->interp && !d->nr_needed)) {
		elf_deps_free(d);
		return ret < 0 ? ret : 1;
	}
	return 0;
}

void elf_deps_free(struct elf_deps *d)
{
	uint32_t i;

	free(d->interp);
	for (i = 0; i < d->nr_needed; i++)
		free(d->needed[i]);
	free(d->runpath);
	memset(d, 0, sizeof(*d));
}

/*
 * The loader dependencies section (docs/FORMAT.md 2.6): what elf_deps_read
 * found in each ELF file at conversion, by path. Header: magic, version,
 * count; then per file: u16 path length and path, u16 e_machine, u8 flags
 * (bit 0: ELF64), u8 number of DT_NEEDED names, u16 length and bytes of
 * the interpreter and of the run path (0: none), then each name as a u8
 * length and bytes.
 */
#define SECTION_HEADER 16
#define FLAG_ELF64 1u

static int entry_cmp(const void *key, const void *e)
{
	return strcmp(key, ((const struct image_elf_entry *)e)->path);
}

const struct image_elf_entry *image_elf_find(const struct image *img,
					     const char *path)
{
	if (!img->nr_elf)
		return NULL; /* bsearch wants a base even for no elements */
	return bsearch(path, img->elf, img->nr_elf, sizeof(*img->elf), entry_cmp);
}

void image_elf_entries_free(struct image_elf_entry *e, uint32_t nr)
{
	uint32_t i;

	for (i = 0; e && i < nr; i++) {
		free(e[i].path);
		elf_deps_free(&e[i].deps);
	}
	free(e);
}

static size_t opt_len(const char *s)
{
	return s ? strlen(s) : 0;
}

static uint8_t *put_str16(uint8_t *p, const char *s)
{
	size_t l = opt_len(s);

	put_le16(p, (uint16_t)l);
	memcpy(p + 2, s ? s : "", l);
	return p + 2 + l;
}

int elf_section_encode(const struct image_elf_entry *e, uint32_t nr,
		       uint8_t **buf, size_t *len)
{
	size_t total = SECTION_HEADER;
	uint32_t i, k;
	uint8_t *p;

	for (i = 0; i < nr; i++) {
		const struct elf_deps *d = &e[i].deps;

		total += 2 + strlen(e[i].path) + 4 + 2 + opt_len(d->interp) +
			 2 + opt_len(d->runpath);
		for (k = 0; k < d->nr_needed; k++)
			total += 1 + strlen(d->needed[k]);
	}
	*buf = p = calloc(1, total);
	if (!p)
		return -ENOMEM;
	memcpy(p, ELF_SECTION_MAGIC, 8);
	put_le32(p + 8, ELF_SECTION_VERSION);
	put_le32(p + 12, nr);
	p += SECTION_HEADER;
	for (i = 0; i < nr; i++) {
		const struct elf_deps *d = &e[i].deps;

		p = put_str16(p, e[i].path);
		put_le16(p, d->machine);
		p[2] = d->is64 ? FLAG_ELF64 : 0;
		p[3] = (uint8_t)d->nr_needed;
		p = put_str16(p + 4, d->interp);
		p = put_str16(p, d->runpath);
		for (k = 0; k < d->nr_needed; k++) {
			size_t l = strlen(d->needed[k]);

			*p = (uint8_t)l;
			memcpy(p + 1, d->needed[k], l);
			p += 1 + l;
		}
	}
	*len = total;
	return 0;
}

/* A string of @len bytes at @p without NUL, copied; NULL for an empty one. */
static int get_str(const uint8_t *p, size_t len, size_t max, char **out)
{
	*out = NULL;
	if (len > max || memchr(p, '\0', len))
		return -EFSCORRUPTED;
	if (!len)
		return 0;
	*out = strndup((const char *)p, len);
	return *out ? 0 : -ENOMEM;
}

/* One entry at @p of the @left bytes that remain: its size, or -errno. */
static ssize_t decode_entry(const uint8_t *p, size_t left,
			    struct image_elf_entry *e)
{
	const uint8_t *start = p, *end = p + left;
	struct elf_deps *d = &e->deps;
	size_t l;
	uint32_t k, nr;
	int ret;

	if (end - p < 2 || (l = get_le16(p)) > (size_t)(end - p) - 2 || !l)
		return -EFSCORRUPTED;
	/* Stored normalised: anything else was not written by ferry. */
	ret = memchr(p + 2, '\0', l) ? -EINVAL : image_path_normalize((const char *)p + 2, l, &e->path);
	if (!ret && (strlen(e->path) != l || memcmp(e->path, p + 2, l)))
		ret = -EINVAL;
	if (ret)
		return ret == -ENOMEM ? ret : -EFSCORRUPTED;
	p += 2 + l;
	if (end - p < 6 || (p[2] & ~FLAG_ELF64) || p[3] > ELF_NEEDED_MAX)
		return -EFSCORRUPTED;
	d->machine = get_le16(p);
	d->is64 = p[2] & FLAG_ELF64;
	nr = p[3];
	p += 4;
	if ((l = get_le16(p)) > (size_t)(end - p) - 2)
		return -EFSCORRUPTED;
	ret = get_str(p + 2, l, INTERP_MAX - 1, &d->interp);
	if (ret)
		return ret;
	p += 2 + l;
	if (end - p < 2 || (l = get_le16(p)) > (size_t)(end - p) - 2)
		return -EFSCORRUPTED;
	ret = get_str(p + 2, l, INTERP_MAX, &d->runpath); /* as read_dynamic reads it */
	if (ret)
		return ret;
	p += 2 + l;
	for (k = 0; k < nr; k++) {
		if (end - p < 1 || !(l = *p) || l > (size_t)(end - p) - 1)
			return -EFSCORRUPTED;
		ret = get_str(p + 1, l, NAME_MAX_LEN, &d->needed[k]);
		if (ret)
			return ret;
		d->nr_needed++;
		p += 1 + l;
	}
	/* What elf_deps_read returns 1 for is not recorded. */
	if (!d->interp && !d->nr_needed)
		return -EFSCORRUPTED;
	return p - start;
}

int elf_section_decode(const void *buf, size_t len,
		       struct image_elf_entry **out, uint32_t *nr_out)
{
	const uint8_t *p = buf;
	struct image_elf_entry *e = NULL;
	size_t off = SECTION_HEADER;
	uint32_t nr, i = 0;
	ssize_t n = 0;

	*out = NULL;
	*nr_out = 0;
	if (ext_section_header(buf, len, ELF_SECTION_MAGIC, ELF_SECTION_VERSION,
			       "loader dependencies", &nr))
		return -EFSCORRUPTED;
	/* Each entry takes 11 bytes at least: no count the bytes cannot hold. */
	if (nr > IMAGE_ELF_MAX_FILES || nr > (len - off) / 11) {
		ferry_err("loader dependencies: %u files in %zu bytes (limit %u)",
			  nr, len, IMAGE_ELF_MAX_FILES);
		return -EFSCORRUPTED;
	}
	e = calloc(nr + 1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	for (i = 0; i < nr; i++) {
		n = decode_entry(p + off, len - off, &e[i]);
		if (n < 0)
			break;
		if (i && strcmp(e[i - 1].path, e[i].path) >= 0) {
			n = -EFSCORRUPTED; /* sorted and unique, for bsearch */
			break;
		}
		off += (size_t)n;
	}
	if (n >= 0 && off != len)
		n = -EFSCORRUPTED;
	if (n < 0) {
		if (n != -ENOMEM)
			ferry_err("loader dependencies: entry %u is malformed", i);
		image_elf_entries_free(e, nr);
		return (int)n;
	}
	*out = e;
	*nr_out = nr;
	return 0;
}
