// SPDX-License-Identifier: MIT
/*
 * The bootstrap's extension (docs/FORMAT.md 2.4-2.7): the payload that
 * every ferry reads (the blob index, then the prefetch list and the loader
 * dependencies, told apart by their magics), and after it the section
 * area, whose sections are framed (magic, version, flags, length) so that
 * a reader skips the ones it does not know.
 *
 * Why two places: a reader before 0.5.0 refuses anything in the payload
 * it does not know (the loader dependencies made ferryd 0.2 refuse images
 * of 0.3), and never looks past the payload. New sections go to the area:
 * readers before 0.5.0 do not see them, readers from 0.5.0 on skip the
 * ones they do not know, unless a section is marked required.
 *
 * Adding a section: encode its body where its data is made and pass it in
 * struct image_ext.sections; write a decoder of the shape of
 * decode_writer below; add one line to section_types[] (which also makes
 * --version list it) and a row to FORMAT.md 2.7's table.
 */
#include <stdlib.h>

#include "internal.h"

/* The writer section: which ferry wrote the image, e.g. "ferry 0.5.0". */
#define WRITER_MAGIC "FERRYWR1"
#define WRITER_VERSION 1u
#define WRITER_MAX 255u
#define WRITER_NAME "ferry " FERRY_VERSION

static bool printable(const uint8_t *s, size_t len)
{
	for (size_t i = 0; i < len; i++)
		if (s[i] < 0x20 || s[i] > 0x7e)
			return false;
	return true;
}

static int decode_writer(struct image *img, const uint8_t *body, size_t len)
{
	if (!len || len > WRITER_MAX || !printable(body, len)) {
		ferry_err("%s: writer section: %zu bytes, not 1-%u printable ones",
			  img->ref, len, WRITER_MAX);
		return -EFSCORRUPTED;
	}
	img->writer = strndup((const char *)body, len);
	return img->writer ? 0 : -ENOMEM;
}

/* The resume points of the image's stream blobs (an indexed image). */
static int decode_streams(struct image *img, const uint8_t *body, size_t len)
{
	size_t used = 0;
	int ret = blob_streams_decode(body, len, &img->blobs, &img->streams, &used);

	if (!ret && used != len) {
		ferry_err("%s: resume points section: %zu bytes after its streams",
			  img->ref, len - used);
		ret = -EFSCORRUPTED;
	}
	return ret;
}

/* The sections this build reads: one line each. */
static const struct {
	char magic[9];
	uint32_t version;
	const char *what;
	int (*decode)(struct image *img, const uint8_t *body, size_t len);
} section_types[] = {
	{ WRITER_MAGIC, WRITER_VERSION, "writer", decode_writer },
	{ BLOB_STREAMS_MAGIC, BLOB_STREAMS_VERSION, "resume points", decode_streams },
};

/* Append @len bytes at @data to the malloc'ed *@buf of *@buf_len bytes. */
static int append(void **buf, size_t *buf_len, const void *data, size_t len)
{
	void *both = realloc(*buf, *buf_len + len);

	if (!both)
		return -ENOMEM;
	memcpy((uint8_t *)both + *buf_len, data, len);
	*buf = both;
	*buf_len += len;
	return 0;
}

/* A payload section made by @encode (prefetch list, loader dependencies). */
static int append_owned(void **buf, size_t *buf_len, uint8_t *sec, size_t len)
{
	int ret = append(buf, buf_len, sec, len);

	free(sec);
	return ret;
}

static int append_section(void **area, size_t *area_len,
			  const struct image_section *s)
{
	uint8_t hdr[IMAGE_SECTION_HEADER];
	int ret;

	memcpy(hdr, s->magic, 8);
	put_le32(hdr + 8, s->version);
	put_le32(hdr + 12, s->flags);
	put_le64(hdr + 16, s->len);
	ret = append(area, area_len, hdr, sizeof(hdr));
	return ret ? ret : append(area, area_len, s->body, s->len);
}

int image_ext_encode(const struct image_ext *in, void **payload,
		     size_t *payload_len, void **area, size_t *area_len)
{
	const struct image_section writer = {
		WRITER_MAGIC, WRITER_VERSION, 0, WRITER_NAME, strlen(WRITER_NAME),
	};
	uint8_t *sec;
	size_t len;
	int ret;

	*area = NULL;
	*area_len = 0;
	ret = blob_index_encode(in->blobs, in->nr_blobs, payload, payload_len);
	/* The payload's optional sections follow the blob index, in this order. */
	if (!ret && in->nr_prefetch) {
		ret = prefetch_section_encode(in->prefetch, in->nr_prefetch, &sec, &len);
		if (!ret)
			ret = append_owned(payload, payload_len, sec, len);
	}
	if (!ret && in->nr_elf) {
		ret = elf_section_encode(in->elf, in->nr_elf, &sec, &len);
		if (!ret)
			ret = append_owned(payload, payload_len, sec, len);
	}
	if (!ret)
		ret = append_section(area, area_len, &writer);
	/* Required: a reader that cannot decode them cannot serve the image. */
	if (!ret && in->nr_streams) {
		void *rp;

		ret = blob_streams_encode(in->streams, in->nr_streams, &rp, &len);
		if (!ret) {
			const struct image_section streams = {
				BLOB_STREAMS_MAGIC, BLOB_STREAMS_VERSION,
				IMAGE_SECTION_REQUIRED, rp, len,
			};

			ret = append_section(area, area_len, &streams);
			free(rp);
		}
	}
	for (uint32_t i = 0; !ret && i < in->nr_sections; i++)
		ret = append_section(area, area_len, &in->sections[i]);
	if (ret) {
		free(*payload);
		free(*area);
		*payload = *area = NULL;
	}
	return ret;
}

static int section_type(const uint8_t *magic, uint32_t version)
{
	for (size_t t = 0; t < ARRAY_SIZE(section_types); t++)
		if (!memcmp(magic, section_types[t].magic, 8) &&
		    version == section_types[t].version)
			return (int)t;
	return -1;
}

int image_sections_decode(struct image *img, const void *area, size_t len)
{
	bool decoded[ARRAY_SIZE(section_types)] = { false };
	const uint8_t *p = area;
	size_t off = 0, cap = 0;
	int ret = 0;

	while (!ret && off < len) {
		struct image_section_seen seen = { .known = false };
		uint64_t body;
		int t;

		if (len - off < IMAGE_SECTION_HEADER ||
		    (body = get_le64(p + off + 16)) > len - off - IMAGE_SECTION_HEADER) {
			ferry_err("%s: the bootstrap's section at byte %zu of its section area overruns it (%zu bytes)",
				  img->ref, off, len);
			return -EFSCORRUPTED;
		}
		memcpy(seen.magic, p + off, 8);
		seen.version = get_le32(p + off + 8);
		seen.flags = get_le32(p + off + 12);
		seen.len = body;
		t = section_type(p + off, seen.version);
		if (t >= 0 && decoded[t]) {
			ferry_err("%s: the bootstrap has section %.8s v%u twice",
				  img->ref, seen.magic, seen.version);
			return -EFSCORRUPTED;
		}
		if (t >= 0) {
			decoded[t] = seen.known = true;
			ret = section_types[t].decode(img, p + off + IMAGE_SECTION_HEADER,
						      (size_t)body);
		} else if (seen.flags & IMAGE_SECTION_REQUIRED) {
			ferry_err("%s: the image needs bootstrap section %.8s v%u, which ferry %s does not read: use a newer ferry ('ferry --version' lists the sections a build reads)",
				  img->ref, printable(p + off, 8) ? seen.magic : "(binary)",
				  seen.version, FERRY_VERSION);
			return -ENOTSUP;
		}
		if (!ret && array_reserve(&img->sections, &cap, img->nr_sections + 1,
					  sizeof(*img->sections), 4))
			ret = -ENOMEM;
		if (!ret)
			img->sections[img->nr_sections++] = seen;
		off += IMAGE_SECTION_HEADER + (size_t)body;
	}
	return ret;
}

void image_print_formats(FILE *out)
{
	fprintf(out,
		"image formats (docs/FORMAT.md, Compatibility), as ferry convert writes\n"
		"them and ferry and ferryd read them:\n"
		"  ferry image       format %s (earlier ones are read too)\n"
		"  bootstrap         preamble %s v%u, blob index %s v%u\n"
		"  payload sections  %s v%u prefetch list, %s v%u loader deps\n"
		"  framed sections  ",
		FERRY_FORMAT_VERSION, META_PREAMBLE_MAGIC,
		META_PREAMBLE_VERSION, BLOB_INDEX_MAGIC, BLOB_FORMAT_VERSION,
		PREFETCH_MAGIC, PREFETCH_VERSION, ELF_SECTION_MAGIC,
		ELF_SECTION_VERSION);
	for (size_t t = 0; t < ARRAY_SIZE(section_types); t++)
		fprintf(out, " %s v%u %s,", section_types[t].magic,
			section_types[t].version, section_types[t].what);
	fprintf(out,
		" others skipped unless required\n"
		"  data blob         %s v%u\n"
		"  native layers     %s, range table %s\n"
		"  ferry index       %s (ferry index: attached to an image)\n",
		BLOB_MAGIC, BLOB_FORMAT_VERSION, EROFS_LAYER_MEDIA_TYPE,
		LAYER_RANGES_MAGIC, FERRY_INDEX_ARTIFACT_TYPE);
}
