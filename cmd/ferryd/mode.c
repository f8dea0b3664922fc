// SPDX-License-Identifier: MIT
/* The table of serving modes (mode.h). */
#include <stdio.h>
#include <string.h>

#include "ferryd.h"

static const struct serve_mode *const modes[] = { &fuse_mode, &fanotify_mode,
						   &cachefiles_mode };

const struct serve_mode *serve_mode_find(const char *name)
{
	size_t i;

	for (i = 0; i < ARRAY_SIZE(modes); i++)
		if (!strcmp(modes[i]->name, name))
			return modes[i];
	return NULL;
}

void serve_mode_names(char *buf, size_t len)
{
	size_t i, n = 0;

	buf[0] = '\0';
	for (i = 0; i < ARRAY_SIZE(modes) && n < len; i++)
		n += (size_t)snprintf(buf + n, len - n, "%s%s", i ? ", " : "",
				      modes[i]->name);
}
