// SPDX-License-Identifier: MIT
/*
 * Prefetch lists: paths a lazy mount fetches in the background first, in
 * list order. One text form, read by image_prefetch_list_load for every
 * caller (ferry convert --prefetch-files embeds it; ferry mount
 * --prefetch-files sends it to ferryd), and one binary form, kept in the
 * bootstrap's extension payload after the blob index (docs/FORMAT.md 2.5).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define PREFETCH_HEADER_SIZE 16u

void image_prefetch_list_free(char **paths, uint32_t nr)
{
	uint32_t i;

	for (i = 0; paths && i < nr; i++)
		free(paths[i]);
	free(paths);
}

int image_path_normalize(const char *in, size_t len, char **out)
{
	char *copy = strndup(in, len), *norm = NULL;
	int ret;

	if (!copy)
		return -ENOMEM;
	ret = path_normalize(copy);
	if (!ret && (!*copy || strlen(copy) > IMAGE_PREFETCH_PATH_MAX))
		ret = -EINVAL;
	if (!ret && asprintf(&norm, "/%s", copy) < 0)
		ret = -ENOMEM;
	free(copy);
	if (!ret)
		*out = norm;
	return ret;
}

static int add_path(char ***paths, uint32_t *nr, size_t *cap, char *p)
{
	if (*nr >= IMAGE_PREFETCH_MAX_PATHS) {
		free(p);
		return -E2BIG;
	}
	if (array_reserve(paths, cap, *nr + 1, sizeof(**paths), 64)) {
		free(p);
		return -ENOMEM;
	}
	(*paths)[(*nr)++] = p;
	return 0;
}

int image_prefetch_list_load(const char *file, char ***paths, uint32_t *nr)
{
	FILE *f = fopen(file, "re");
	char *line = NULL, *p;
	size_t line_cap = 0, cap = 0;
	unsigned long lineno = 0;
	ssize_t n;
	int ret = 0;

	*paths = NULL;
	*nr = 0;
	if (!f) {
		ret = -errno;
		ferry_err("prefetch list %s: %s", file, strerror(errno));
		return ret;
	}
	while (!ret && (n = getline(&line, &line_cap, f)) >= 0) {
		lineno++;
		while (n && (line[n - 1] == '\n' || line[n - 1] == '\r' ||
			     line[n - 1] == ' ' || line[n - 1] == '\t'))
			line[--n] = '\0';
		if (!n || line[0] == '#')
			continue;
		ret = image_path_normalize(line, (size_t)n, &p);
		if (ret) {
			ferry_err("prefetch list %s:%lu: \"%s\" is not a path inside the image",
				  file, lineno, line);
			break;
		}
		ret = add_path(paths, nr, &cap, p);
		if (ret == -E2BIG)
			ferry_err("prefetch list %s: more than %u paths", file,
				  IMAGE_PREFETCH_MAX_PATHS);
	}
	if (!ret && ferror(f)) {
		ret = -EIO;
		ferry_err("prefetch list %s: read error", file);
	}
	free(line);
	fclose(f);
	if (ret) {
		image_prefetch_list_free(*paths, *nr);
		*paths = NULL;
		*nr = 0;
	}
	return ret;
}

int prefetch_section_encode(char *const *paths, uint32_t nr, uint8_t **buf,
			    size_t *len)
{
	size_t total = PREFETCH_HEADER_SIZE, off;
	uint32_t i;
	uint8_t *p;

	for (i = 0; i < nr; i++)
		total += 2 + strlen(paths[i]);
	p = calloc(1, total);
	if (!p)
		return -ENOMEM;
	memcpy(p, PREFETCH_MAGIC, 8);
	put_le32(p + 8, PREFETCH_VERSION);
	put_le32(p + 12, nr);
	for (i = 0, off = PREFETCH_HEADER_SIZE; i < nr; i++) {
		size_t l = strlen(paths[i]);

		put_le16(p + off, (uint16_t)l);
		memcpy(p + off + 2, paths[i], l);
		off += 2 + l;
	}
	*buf = p;
	*len = total;
	return 0;
}

int ext_section_header(const void *buf, size_t len, const char *magic,
		       uint32_t version, const char *what, uint32_t *count)
{
	const uint8_t *p = buf;

	if (len < PREFETCH_HEADER_SIZE || memcmp(p, magic, 8) ||
	    get_le32(p + 8) != version) {
		ferry_err("%s: bad header (%zu bytes)", what, len);
		return -EFSCORRUPTED;
	}
	*count = get_le32(p + 12);
	return 0;
}

int prefetch_section_decode(const void *buf, size_t len, char ***paths,
			    uint32_t *nr, size_t *used)
{
	const uint8_t *p = buf;
	size_t off = PREFETCH_HEADER_SIZE, cap = 0;
	uint32_t count, i;
	char *path;
	int ret = 0;

	*paths = NULL;
	*nr = 0;
	if (ext_section_header(buf, len, PREFETCH_MAGIC, PREFETCH_VERSION,
			       "prefetch list", &count))
		return -EFSCORRUPTED;
	if (count > IMAGE_PREFETCH_MAX_PATHS) {
		ferry_err("prefetch list: %u paths (limit %u)", count,
			  IMAGE_PREFETCH_MAX_PATHS);
		return -EFSCORRUPTED;
	}
	for (i = 0; i < count && !ret; i++) {
		size_t l;

		if (len - off < 2 || (l = get_le16(p + off)) > len - off - 2 ||
		    memchr(p + off + 2, '\0', l)) {
			ret = -EFSCORRUPTED;
			break;
		}
		/* Stored normalised: anything else was not written by ferry. */
		ret = image_path_normalize((const char *)p + off + 2, l, &path);
		if (!ret && (strlen(path) != l ||
			     memcmp(path, p + off + 2, l))) {
			free(path);
			ret = -EFSCORRUPTED;
		}
		if (!ret)
			ret = add_path(paths, nr, &cap, path);
		else if (ret == -EINVAL)
			ret = -EFSCORRUPTED;
		off += 2 + l;
	}
	if (!ret && off != len && !used)
		ret = -EFSCORRUPTED;
	if (!ret && used)
		*used = off;
	if (ret) {
		ferry_err("prefetch list: entry %u is malformed", i);
		image_prefetch_list_free(*paths, *nr);
		*paths = NULL;
		*nr = 0;
	}
	return ret;
}
