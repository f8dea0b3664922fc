// SPDX-License-Identifier: MIT
/*
 * What ferryd and ferryd-keeper both use to find each other and a
 * successor (keeper.h): the binaries' paths, the recorded cachefiles
 * mounts.
 */
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../pkg-base/base.h"
#include "keeper.h"
#include "serve.h"

int sibling_exe(const char *name, char *buf, size_t len)
{
	static const char deleted[] = " (deleted)";
	ssize_t n = readlink("/proc/self/exe", buf, len - 1);
	size_t l;
	char *slash;

	if (n <= 0)
		return n < 0 ? -errno : -ENOENT;
	buf[n] = '\0';
	l = (size_t)n;
	if (l > sizeof(deleted) - 1 && !strcmp(buf + l - (sizeof(deleted) - 1), deleted))
		buf[l - (sizeof(deleted) - 1)] = '\0';
	if (!name)
		return 0;
	slash = strrchr(buf, '/');
	if (!slash || (size_t)(slash + 1 - buf) + strlen(name) >= len)
		return -ENAMETOOLONG;
	strcpy(slash + 1, name);
	return 0;
}

int serve_ferryd_exe(char *buf, size_t len)
{
	int ret = sibling_exe(NULL, buf, len);
	const char *slash = strrchr(buf, '/');

	if (!ret && slash && !strcmp(slash + 1, KEEPER_BINARY))
		ret = sibling_exe("ferryd", buf, len);
	return ret;
}

int cf_recorded_mounts(const char *socket_path, char *path, size_t path_len,
		       struct json_object **top, struct json_object **mounts)
{
	char *text = NULL, *copy = strdup(socket_path);
	size_t len;
	int ret;

	*top = *mounts = NULL;
	snprintf(path, path_len, "%s/%s", copy ? dirname(copy) : ".", CF_STATE);
	free(copy);
	ret = read_file_max(path, CF_STATE_MAX, &text, &len);
	if (!ret)
		ret = json_parse_object(text, len, top);
	if (!ret && !json_object_is_type(*mounts = json_field(*top, "mounts"), json_type_array))
		ret = -EPROTO;
	free(text);
	return ret;
}
