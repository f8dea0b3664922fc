// SPDX-License-Identifier: MIT
/*
 * libFuzzer target for the tar reader behind the decompressing input:
 * the input may be a plain, gzip, zstd or xz tar stream. Each entry's
 * data is read in odd-sized pieces (crossing buffer boundaries) or, for
 * every third entry, left for tar_next() to skip. What the reader
 * accepts must be consistent: non-empty names, data length == size.
 * Inputs starting with "FERRYPF1" go to the bootstrap's prefetch list
 * (pkg-image, the other parser of what conversion embeds), whose accepted
 * inputs must re-encode to the same bytes.
 *
 * gzip input goes through the default inflater (ISA-L when built with it)
 * and, decoded whole, also through zlib: both must accept or reject it
 * alike and agree on every byte both returned.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../pkg-base/base.h"
#include "../../pkg-convert/tar.h"
#include "../../pkg-image/internal.h"

#define MAX_ENTRIES 10000

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint8_t sink;

/* Read every byte the entry points to, so ASan checks the pointers. */
static void touch_entry(const struct tar_entry *e)
{
	uint32_t i;

	if (!e->path[0] || (e->linkname && !e->linkname[0]))
		abort();
	for (i = 0; i < e->nr_xattrs; i++) {
		const struct tar_xattr *x = &e->xattrs[i];

		if (!x->name[0])
			abort();
		sink ^= (uint8_t)strlen(x->name);
		if (x->value_len)
			sink ^= x->value[0] ^ x->value[x->value_len - 1];
	}
	sink ^= (uint8_t)strlen(e->path);
}

/* Decode all of @data with @inflater into @out (at most @cap bytes). */
static int inflate_all(const uint8_t *data, size_t size, const char *inflater,
		       uint8_t *out, size_t cap, size_t *len)
{
	struct input_stream *in;
	struct byte_source bs;
	ssize_t n = 0;

	setenv("FERRY_INFLATE", inflater, 1);
	if (input_open_mem(data, size, &in))
		abort();
	unsetenv("FERRY_INFLATE");
	bs = input_source(in);
	*len = 0;
	while (*len < cap) {
		n = bs.read(bs.ctx, out + *len, MIN(cap - *len, 4099));
		if (n <= 0)
			break;
		*len += (size_t)n;
	}
	input_close(in);
	return (int)n;
}

static void fuzz_inflaters(const uint8_t *data, size_t size)
{
	static uint8_t a[8 << 20], b[sizeof(a)];
	size_t alen, blen;
	int aret = inflate_all(data, size, "isal", a, sizeof(a), &alen);
	int bret = inflate_all(data, size, "zlib", b, sizeof(b), &blen);

	if (alen == sizeof(a) || blen == sizeof(b))
		return; /* cut at the cap: not comparable */
	if ((aret < 0) != (bret < 0) || (!aret && alen != blen) ||
	    memcmp(a, b, MIN(alen, blen)))
		abort();
}

static void fuzz_prefetch(const uint8_t *data, size_t size)
{
	uint8_t *again = NULL;
	char **paths;
	uint32_t nr;
	size_t len;

	if (prefetch_section_decode(data, size, &paths, &nr, NULL))
		return;
	if (prefetch_section_encode(paths, nr, &again, &len) ||
	    len != size || memcmp(again, data, size))
		abort();
	free(again);
	image_prefetch_list_free(paths, nr);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static uint8_t buf[3 * 65536 + 7];
	struct input_stream *in;
	struct tar_reader *r;
	struct tar_entry *e;
	unsigned int n = 0;

	ferry_log_level = -1;
	if (size >= 8 && !memcmp(data, "FERRYPF1", 8)) {
		fuzz_prefetch(data, size);
		return 0;
	}
#ifdef FERRY_HAVE_ISAL
	if (size >= 2 && data[0] == 0x1f && data[1] == 0x8b)
		fuzz_inflaters(data, size);
#endif
	if (input_open_mem(data, size, &in))
		return 0;
	if (tar_reader_new(input_source(in), &r)) {
		input_close(in);
		return 0;
	}
	while (n < MAX_ENTRIES && tar_next(r, &e) == 1) {
		size_t chunk = n % 2 ? 1021 : sizeof(buf);
		uint64_t got = 0;
		ssize_t k;

		touch_entry(e);
		if (n++ % 3 == 2)
			continue;
		while ((k = tar_read_data(r, buf, chunk)) > 0)
			got += (uint64_t)k;
		if (k < 0)
			break;
		if (got != e->size)
			abort();
	}
	tar_reader_free(r);
	input_close(in);
	return 0;
}
