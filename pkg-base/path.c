// SPDX-License-Identifier: MIT
/*
 * Path strings, lexically: no file system access, so the answers do not
 * depend on symlinks or on what exists yet.
 */
#include "base.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int path_normalize(char *path)
{
	char *src = path, *dst = path;

	while (*src) {
		char *end = strchrnul(src, '/');
		size_t len = (size_t)(end - src);

		if (len == 2 && src[0] == '.' && src[1] == '.')
			return -EINVAL;
		if (len && !(len == 1 && src[0] == '.')) {
			if (dst != path)
				*dst++ = '/';
			memmove(dst, src, len);
			dst += len;
		}
		src = *end ? end + 1 : end;
	}
	*dst = '\0';
	return 0;
}

int path_absolute(const char *path, char **out)
{
	char cwd[PATH_MAX], *buf, *p, *save = NULL, *seg;
	size_t len = 0, cap;
	char *res;

	if (!*path)
		return -EINVAL;
	if (path[0] != '/' && !getcwd(cwd, sizeof(cwd)))
		return -errno;
	if (path[0] == '/')
		cwd[0] = '\0';
	if (asprintf(&buf, "%s/%s", cwd, path) < 0)
		return -ENOMEM;
	cap = strlen(buf) + 2;
	res = malloc(cap);
	if (!res) {
		free(buf);
		return -ENOMEM;
	}
	for (seg = strtok_r(buf, "/", &save); seg; seg = strtok_r(NULL, "/", &save)) {
		if (!strcmp(seg, "."))
			continue;
		if (!strcmp(seg, "..")) {
			p = len ? memrchr(res, '/', len) : NULL;
			len = p ? (size_t)(p - res) : 0;
			continue;
		}
		res[len++] = '/';
		memcpy(res + len, seg, strlen(seg));
		len += strlen(seg);
	}
	if (!len)
		res[len++] = '/';
	res[len] = '\0';
	free(buf);
	*out = res;
	return 0;
}

int path_mountpoint(const char *path, char **out)
{
	char *abs, *slash, *dir;
	int ret;

	*out = realpath(path, NULL);
	if (*out)
		return 0;
	if (errno == ENOMEM)
		return -ENOMEM;
	ret = path_absolute(path, &abs);
	if (ret)
		return ret;
	slash = strrchr(abs, '/');
	if (slash == abs) {
		*out = abs;
		return 0;
	}
	*slash = '\0';
	dir = realpath(abs, NULL);
	*slash = '/';
	if (!dir) {
		*out = abs;
		return 0;
	}
	if (asprintf(out, "%s%s", strcmp(dir, "/") ? dir : "", slash) < 0)
		ret = -ENOMEM;
	free(dir);
	free(abs);
	return ret;
}
