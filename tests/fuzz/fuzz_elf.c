// SPDX-License-Identifier: MIT
/*
 * libFuzzer target for pkg-image's ELF reader (elf.c), which fetch-ahead
 * runs on files of untrusted images: the input is the whole file. Reads
 * outside it abort (elf.c must bound every one itself); accepted results
 * are checked for consistency, and that the bootstrap section that
 * records them takes them. The same input is also decoded as such a
 * section (a bootstrap's loader dependencies), which must be canonical.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../pkg-base/base.h"
#include "../../pkg-image/internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct input {
	const uint8_t *data;
	size_t size;
};

static int input_read(void *ctx, uint64_t off, void *buf, size_t len)
{
	const struct input *in = ctx;

	if (off > in->size || len > in->size - off)
		abort();
	memcpy(buf, in->data + off, len);
	return 0;
}

/* Called with what d.interp will hold: a name, never an empty or huge one. */
static void check_interp(void *ctx, const char *interp)
{
	(void)ctx;
	if (!*interp || strlen(interp) >= 4096)
		abort();
}

/* The input as a loader dependencies section: one form per content. */
static void fuzz_section(const uint8_t *data, size_t size)
{
	struct image_elf_entry *e;
	uint8_t *again;
	uint32_t nr;
	size_t len;

	if (elf_section_decode(data, size, &e, &nr))
		return;
	if (elf_section_encode(e, nr, &again, &len) || len != size ||
	    memcmp(again, data, size))
		abort();
	free(again);
	image_elf_entries_free(e, nr);
}

/* What the reader accepts, `ferry convert` records: its decoder must too. */
static void check_recordable(struct elf_deps *d)
{
	struct image_elf_entry e = { .path = (char *)"/f", .deps = *d }, *got;
	uint8_t *buf;
	uint32_t nr;
	size_t len;

	if (elf_section_encode(&e, 1, &buf, &len) ||
	    elf_section_decode(buf, len, &got, &nr) || nr != 1 ||
	    got->deps.nr_needed != d->nr_needed)
		abort();
	free(buf);
	image_elf_entries_free(got, nr);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct input in = { data, size };
	struct elf_deps d;
	uint32_t i;

	fuzz_section(data, size);
	if (elf_deps_read(input_read, check_interp, &in, size, &d))
		return 0;
	if ((!d.interp && !d.nr_needed) || d.nr_needed > ELF_NEEDED_MAX ||
	    (d.interp && (!*d.interp || strlen(d.interp) >= 4096)))
		abort();
	for (i = 0; i < d.nr_needed; i++)
		if (!*d.needed[i] || strlen(d.needed[i]) > 255)
			abort();
	check_recordable(&d);
	elf_deps_free(&d);
	return 0;
}
