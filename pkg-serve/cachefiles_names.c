// SPDX-License-Identifier: MIT
/* The names fscache knows a cachefiles mount's objects by (cachefiles.h). */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../pkg-base/base.h"
#include "cachefiles.h"

int cf_names_init(struct cf_names *n, uint32_t nr, const uint8_t *bootstrap,
		  const char *domain)
{
	memset(n, 0, sizeof(*n));
	if (domain && strlen(domain) >= sizeof(n->domain))
		return -ENAMETOOLONG;
	n->layers = !bootstrap;
	n->nr = nr;
	n->digests = calloc(nr + 1, sizeof(*n->digests));
	n->layer_fsids = n->layers ? calloc(nr + 1, sizeof(*n->layer_fsids)) : NULL;
	if (!n->digests || (n->layers && !n->layer_fsids)) {
		cf_names_free(n);
		return -ENOMEM;
	}
	snprintf(n->domain, sizeof(n->domain), "%s", domain ? domain : "");
	if (!n->layers) {
		hex_encode(bootstrap, BLOB_DIGEST_SIZE, n->fsid);
		snprintf(n->volume, sizeof(n->volume), "erofs,%s", domain ? domain : n->fsid);
	}
	return 0;
}

void cf_names_free(struct cf_names *n)
{
	free(n->digests);
	free(n->layer_fsids);
	n->digests = n->layer_fsids = NULL;
}

void cf_layer_fsid(const char *hex, unsigned int k, cf_name out)
{
	if (k)
		snprintf(out, CF_FSID_LEN + 1, "%02u-%.61s", k % CF_LAYER_COPIES, hex);
	else
		snprintf(out, CF_FSID_LEN + 1, "%s", hex);
}

/* Are the @len bytes at @s the start of one of cf_layer_fsid(@hex)'s names? */
static bool layer_fsid_prefix(const char *s, size_t len, const char *hex)
{
	if (len >= 3 && isdigit((unsigned char)s[0]) && isdigit((unsigned char)s[1]) &&
	    s[2] == '-')
		return len - 3 <= 61 && !strncmp(s + 3, hex, len - 3);
	return len <= CF_FSID_LEN && !strncmp(s, hex, len);
}

/* Is @cookie in @volume a copy of layer @i? */
static bool layer_object(const struct cf_names *n, uint32_t i, const char *volume,
			 const char *cookie)
{
	return !strncmp(volume, "erofs,", 6) && !strcmp(volume + 6, cookie) &&
	       strlen(cookie) == CF_FSID_LEN &&
	       layer_fsid_prefix(cookie, CF_FSID_LEN, n->digests[i]);
}

bool cf_names_resolve(const struct cf_names *n, const char *volume, const char *cookie,
		      uint32_t *device)
{
	uint32_t i;

	for (i = 0; n->layers && i < n->nr; i++) {
		if (layer_object(n, i, volume, cookie)) {
			*device = i + 1;
			return true;
		}
	}
	if (n->layers || strcmp(n->volume, volume))
		return false;
	if (!strcmp(n->fsid, cookie)) {
		*device = 0;
		return true;
	}
	for (i = 0; i < n->nr; i++) {
		if (!strcmp(n->digests[i], cookie)) {
			*device = i + 1;
			return true;
		}
	}
	return false;
}

bool cf_names_object_is(const struct cf_names *n, uint32_t device, const char *volume,
			const char *cookie)
{
	if (!device || device > n->nr)
		return false;
	if (n->layers && !n->layer_fsids[device - 1][0])
		return layer_object(n, device - 1, volume, cookie);
	if (n->layers)
		return !strcmp(cookie, n->layer_fsids[device - 1]) &&
		       !strncmp(volume, "erofs,", 6) && !strcmp(volume + 6, cookie);
	return !strcmp(volume, n->volume) && !strcmp(cookie, n->digests[device - 1]);
}

bool cf_names_sysfs_is(const struct cf_names *n, const char *sysfs)
{
	const char *base = strrchr(sysfs, '/');
	char name[CF_VOLUME_MAX + CF_FSID_LEN + 2];

	if (!base || !base[1] || strncmp(sysfs, "/sys/fs/erofs/", 14) ||
	    strstr(sysfs, "/.."))
		return false;
	if (n->layers)
		return n->nr && layer_fsid_prefix(base + 1, strlen(base + 1), n->digests[0]);
	snprintf(name, sizeof(name), "%s%s%s", n->domain, n->domain[0] ? "," : "", n->fsid);
	return !strncmp(name, base + 1, strlen(base + 1));
}
