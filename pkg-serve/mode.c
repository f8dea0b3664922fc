// SPDX-License-Identifier: MIT
/* The table of serving modes (mode.h). */
#include <stdio.h>
#include <string.h>

#include "internal.h"

extern const struct serve_mode fuse_mode, fanotify_mode, cachefiles_mode;

const struct serve_mode *const serve_modes[SERVE_NR_MODES] = { &fuse_mode, &fanotify_mode,
								&cachefiles_mode };

/* Auto's preference: the kernel's mounts first, the newer interface first. */
static const struct serve_mode *const auto_order[] = { &fanotify_mode, &cachefiles_mode,
						       &fuse_mode };
_Static_assert(ARRAY_SIZE(auto_order) == SERVE_NR_MODES, "auto tries every mode");

unsigned int serve_mode_slot(const struct serve_mode *mode)
{
	unsigned int i;

	for (i = 0; i < SERVE_NR_MODES && serve_modes[i] != mode; i++)
		;
	return i;
}

void *mode_state(const struct serve_ctx *ctx, const struct serve_mode *mode)
{
	unsigned int i = serve_mode_slot(mode);

	return i < SERVE_NR_MODES ? ctx->mode_ctx[i] : NULL;
}

static const struct serve_mode *pick_auto(const struct serve_ctx *ctx,
					  const struct ctl_mount_req *req, char *why,
					  size_t len)
{
	char reason[512];
	size_t i, n = 0;

	why[0] = '\0';
	for (i = 0; i < ARRAY_SIZE(auto_order); i++) {
		const struct serve_mode *mode = auto_order[i];

		reason[0] = '\0';
		if (!mode->probe(mode_state(ctx, mode), req, reason, sizeof(reason))) {
			snprintf(why + MIN(n, len), len - MIN(n, len), "%s: %s", mode->name,
				 reason);
			return mode;
		}
		n += (size_t)snprintf(why + MIN(n, len), len - MIN(n, len), "not %s: %s; ",
				      mode->name, reason);
	}
	if (n >= 2 && n < len)
		why[n - 2] = '\0'; /* the last "; " */
	return NULL;
}

const struct serve_mode *serve_mode_pick(const struct serve_ctx *ctx,
					 const struct ctl_mount_req *req, char *why,
					 size_t len)
{
	size_t i;

	why[0] = '\0';
	if (!strcmp(req->mode, "auto"))
		return pick_auto(ctx, req, why, len);
	for (i = 0; i < SERVE_NR_MODES; i++)
		if (!strcmp(serve_modes[i]->name, req->mode))
			return serve_modes[i];
	return NULL;
}

void serve_mode_names(char *buf, size_t len)
{
	size_t i, n = 0;

	buf[0] = '\0';
	for (i = 0; i < SERVE_NR_MODES && n < len; i++)
		n += (size_t)snprintf(buf + n, len - n, "%s, ", serve_modes[i]->name);
	if (n < len)
		snprintf(buf + n, len - n, "auto");
}
