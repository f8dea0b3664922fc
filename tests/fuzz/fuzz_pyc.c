// SPDX-License-Identifier: MIT
/*
 * libFuzzer target for pkg-image's .pyc reader (pyc.c), which fetch-ahead
 * runs on the modules of untrusted images: the input is the whole file.
 * A read outside it is ASan's to find; every import it returns must be a
 * module name inside the input (identifiers joined by dots, no '/'), with
 * a bounded level, at most the number asked for.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../pkg-base/base.h"
#include "../../pkg-image/internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_OUT 32

static bool name_ok(const char *s, size_t len, bool dots)
{
	size_t i;

	for (i = 0; i < len; i++) {
		char c = s[i];

		if (c == '.' && dots && i && i + 1 < len && s[i - 1] != '.')
			continue;
		if (c != '_' && !(c >= 'a' && c <= 'z') && !(c >= 'A' && c <= 'Z') &&
		    !(c >= '0' && c <= '9'))
			return false;
	}
	return true;
}

static bool inside(const uint8_t *data, size_t size, const char *p, size_t len)
{
	return (const uint8_t *)p >= data && (size_t)((const uint8_t *)p - data) <= size &&
	       len <= size - (size_t)((const uint8_t *)p - data);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct pyc_import im[MAX_OUT + 1];
	int nr, i;

	memset(im, 0xa5, sizeof(im));
	nr = pyc_imports(data, size, im, MAX_OUT);
	if (nr < 0 || nr > MAX_OUT)
		abort();
	/* The slot after the last returned is untouched. */
	if (im[MAX_OUT].name_len != 0xa5)
		abort();
	for (i = 0; i < nr; i++) {
		if (!inside(data, size, im[i].name, im[i].name_len) ||
		    !name_ok(im[i].name, im[i].name_len, true) ||
		    (!im[i].name_len && !im[i].level) || im[i].level > 64)
			abort();
		if (im[i].from && (!im[i].from_len ||
				   !inside(data, size, im[i].from, im[i].from_len) ||
				   !name_ok(im[i].from, im[i].from_len, false)))
			abort();
	}
	return 0;
}
