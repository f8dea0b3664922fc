// SPDX-License-Identifier: MIT
/*
 * libFuzzer target for the bootstrap's section area (pkg-image/sections.c,
 * docs/FORMAT.md 2.7), which image_open decodes from untrusted images:
 * the input is the area. It must be refused cleanly or accepted whole:
 * the frames of an accepted area account for every byte, and only
 * optional sections are skipped.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../pkg-base/base.h"
#include "../../pkg-image/internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct image img = { .ref = "fuzz" };
	uint64_t total = 0;
	int ret;

	ferry_log_level = -1;
	ret = image_sections_decode(&img, data, size);
	if (ret && ret != -EFSCORRUPTED && ret != -ENOTSUP && ret != -ENOMEM)
		abort();
	for (uint32_t i = 0; !ret && i < img.nr_sections; i++) {
		const struct image_section_seen *s = &img.sections[i];

		if (!s->known && (s->flags & IMAGE_SECTION_REQUIRED))
			abort();
		total += IMAGE_SECTION_HEADER + s->len;
	}
	if (!ret && total != size)
		abort();
	if (!ret && img.writer && (!*img.writer || strlen(img.writer) > 255))
		abort();
	free(img.writer);
	free(img.sections);
	blob_streams_free(&img.streams);
	return 0;
}
