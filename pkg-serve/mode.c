// SPDX-License-Identifier: MIT
/* The table of serving modes (mode.h). */
#include <stdio.h>
#include <string.h>

#include "ferryd.h"

static const struct serve_mode *const modes[] = { &fuse_mode, &fanotify_mode,
						   &cachefiles_mode };

/* Auto's preference: the kernel's mounts first, the newer interface first. */
static const struct serve_mode *const auto_order[] = { &fanotify_mode, &cachefiles_mode,
						       &fuse_mode };

static const struct serve_mode *pick_auto(const struct ctl_mount_req *req, char *why,
					  size_t len)
{
	char reason[512];
	size_t i, n = 0;

	why[0] = '\0';
	for (i = 0; i < ARRAY_SIZE(auto_order); i++) {
		reason[0] = '\0';
		if (!auto_order[i]->probe(req, reason, sizeof(reason))) {
			snprintf(why + MIN(n, len), len - MIN(n, len), "%s: %s", auto_order[i]->name,
				 reason);
			return auto_order[i];
		}
		n += (size_t)snprintf(why + MIN(n, len), len - MIN(n, len), "not %s: %s; ",
				      auto_order[i]->name, reason);
	}
	if (n >= 2 && n < len)
		why[n - 2] = '\0'; /* the last "; " */
	return NULL;
}

const struct serve_mode *serve_mode_pick(const struct ctl_mount_req *req, char *why,
					 size_t len)
{
	size_t i;

	why[0] = '\0';
	if (!strcmp(req->mode, "auto"))
		return pick_auto(req, why, len);
	for (i = 0; i < ARRAY_SIZE(modes); i++)
		if (!strcmp(modes[i]->name, req->mode))
			return modes[i];
	return NULL;
}

void serve_mode_names(char *buf, size_t len)
{
	size_t i, n = 0;

	buf[0] = '\0';
	for (i = 0; i < ARRAY_SIZE(modes) && n < len; i++)
		n += (size_t)snprintf(buf + n, len - n, "%s, ", modes[i]->name);
	if (n < len)
		snprintf(buf + n, len - n, "auto");
}

void serve_modes_startup(const struct serve_opts *o)
{
	size_t i;

	for (i = 0; i < ARRAY_SIZE(modes); i++)
		if (modes[i]->startup)
			modes[i]->startup(o);
}
