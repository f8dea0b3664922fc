// SPDX-License-Identifier: MIT
/*
 * Image references: the one parser of transport prefixes. Every command,
 * ferryd and the converter go through image_ref_parse, so "what is an
 * image name" has one answer and one error message.
 */
#include <stdio.h>
#include <stdlib.h>

#include "internal.h"

static const struct {
	const char *prefix; /* with its ':' */
	const char *form;   /* for messages */
} transports[] = {
	[IMAGE_DIR] = { "dir:", "dir:PATH" },
	[IMAGE_TAR] = { "tar:", "tar:PATH" },
	[IMAGE_OCI] = { "oci:", "oci:PATH[:TAG]" },
	[IMAGE_DOCKER] = { "docker:", "docker://[HOST[:PORT]/]REPO[:TAG|@DIGEST]" },
	[IMAGE_OCI_ARCHIVE] = { "oci-archive:", "oci-archive:PATH[:TAG]" },
	[IMAGE_DOCKER_ARCHIVE] = { "docker-archive:", "docker-archive:PATH" },
};

/* "@what \"@s\": expected dir:PATH, oci:PATH[:TAG] or docker://…" */
static void expected(const char *what, const char *s, unsigned int accept)
{
	char list[256] = "";
	size_t i, nr = 0, total = 0, len = 0;

	if (!what)
		return;
	for (i = 0; i < ARRAY_SIZE(transports); i++)
		total += !!(accept & IMAGE_ACCEPT(i));
	for (i = 0; i < ARRAY_SIZE(transports); i++) {
		if (!(accept & IMAGE_ACCEPT(i)))
			continue;
		nr++;
		len += (size_t)snprintf(list + len, sizeof(list) - len, "%s%s",
					nr == 1 ? "" : nr == total ? " or " : ", ",
					transports[i].form);
	}
	ferry_err("%s \"%s\": expected %s", what, s, list);
}

/* "PATH[:TAG]": a tag follows the last ':' unless it looks like a path. */
static int split_tag(const char *s, char **path, char **tag)
{
	const char *colon = strrchr(s, ':');

	if (colon && colon != s && colon[1] && !strchr(colon + 1, '/')) {
		*path = strndup(s, (size_t)(colon - s));
		*tag = strdup(colon + 1);
		return *path && *tag ? 0 : -ENOMEM;
	}
	*path = strdup(s);
	return *path ? 0 : -ENOMEM;
}

/* A registry image's name as Docker normalises it ("debian" is
 * "docker.io/library/debian:latest"), so messages and records agree. */
static int docker_name(const char *s, char **out)
{
	struct fetch_ref ref;
	int ret = fetch_parse_ref(s, &ref);

	if (ret)
		return ret;
	*out = fetch_ref_string(&ref);
	fetch_ref_free(&ref);
	return *out ? 0 : -ENOMEM;
}

int image_ref_parse(const char *s, unsigned int accept, const char *what,
		    struct image_ref *out)
{
	const char *rest = NULL;
	size_t i;
	int ret;

	memset(out, 0, sizeof(*out));
	for (i = 0; i < ARRAY_SIZE(transports); i++) {
		size_t len = strlen(transports[i].prefix);

		if (!strncmp(s, transports[i].prefix, len)) {
			out->transport = (enum image_transport)i;
			rest = s + len;
			break;
		}
	}
	if (!rest) {
		/* "host:5000/x" is no path: only "/…" and "./…" may hold ':'. */
		if (!(accept & IMAGE_ACCEPT_BARE) ||
		    (strchr(s, ':') && s[0] != '/' && s[0] != '.')) {
			expected(what, s, accept);
			return -EINVAL;
		}
		out->transport = IMAGE_DIR;
		rest = s;
	} else if (!(accept & IMAGE_ACCEPT(out->transport))) {
		expected(what, s, accept);
		return -EINVAL;
	}
	if (out->transport == IMAGE_DOCKER) {
		if (strncmp(rest, "//", 2)) {
			if (what)
				ferry_err("\"%s\": expected %s", s,
					  transports[IMAGE_DOCKER].form);
			return -EINVAL;
		}
		rest += 2;
	}
	if (!*rest) {
		expected(what, s, accept);
		return -EINVAL;
	}
	if (out->transport == IMAGE_OCI || out->transport == IMAGE_OCI_ARCHIVE)
		ret = split_tag(rest, &out->path, &out->tag);
	else if (out->transport == IMAGE_DOCKER)
		ret = docker_name(rest, &out->path);
	else
		ret = (out->path = strdup(rest)) ? 0 : -ENOMEM;
	if (ret)
		image_ref_free(out);
	return ret;
}

void image_ref_free(struct image_ref *ref)
{
	free(ref->path);
	free(ref->tag);
	ref->path = ref->tag = NULL;
}

int image_ref_absolute(const char *s, char **out)
{
	struct image_ref ref;
	char *abs = NULL;
	int ret;

	if (image_ref_parse(s, IMAGE_ACCEPT_IMAGE, NULL, &ref) ||
	    ref.transport == IMAGE_DOCKER) {
		image_ref_free(&ref);
		return (*out = strdup(s)) ? 0 : -ENOMEM;
	}
	ret = path_absolute(ref.path, &abs);
	if (!ret && asprintf(out, "%s%s%s%s", transports[ref.transport].prefix,
			     abs, ref.tag ? ":" : "", ref.tag ? ref.tag : "") < 0)
		ret = -ENOMEM;
	free(abs);
	image_ref_free(&ref);
	return ret;
}
