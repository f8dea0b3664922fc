// SPDX-License-Identifier: MIT
/*
 * libFuzzer target for pkg-image's ELF reader (elf.c), which readahead
 * runs on files of untrusted images: the input is the whole file. Reads
 * outside it abort (elf.c must bound every one itself); accepted results
 * are checked for consistency.
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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct input in = { data, size };
	struct elf_deps d;
	uint32_t i;

	if (elf_deps_read(input_read, check_interp, &in, size, &d))
		return 0;
	if ((!d.interp && !d.nr_needed) || d.nr_needed > ELF_NEEDED_MAX ||
	    (d.interp && (!*d.interp || strlen(d.interp) >= 4096)))
		abort();
	for (i = 0; i < d.nr_needed; i++)
		if (!*d.needed[i] || strlen(d.needed[i]) > 255)
			abort();
	elf_deps_free(&d);
	return 0;
}
