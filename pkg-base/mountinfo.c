// SPDX-License-Identifier: MIT
/* What is mounted where, from /proc/self/mountinfo. */
#include "base.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Undo mountinfo's octal escapes (\040 space, \011, \012, \134) in place. */
static void unescape_octal(char *s)
{
	char *d = s;

	for (; *s; s++) {
		if (s[0] == '\\' && s[1] >= '0' && s[1] <= '3' && s[2] >= '0' &&
		    s[2] <= '7' && s[3] >= '0' && s[3] <= '7') {
			*d++ = (char)((s[1] - '0') << 6 | (s[2] - '0') << 3 | (s[3] - '0'));
			s += 3;
		} else {
			*d++ = *s;
		}
	}
	*d = '\0';
}

struct mi_line {
	unsigned long id, parent;
	struct mount_entry m;
};

/* Parse one mountinfo line; 1 when it is for @mountpoint. */
static int mi_parse(char *line, const char *mountpoint, struct mi_line *out)
{
	char *f[6], *sep, *save = NULL, *tail;
	int i;

	sep = strstr(line, " - ");
	if (!sep)
		return 0;
	*sep = '\0';
	tail = sep + 3;
	for (i = 0; i < 6; i++) {
		f[i] = strtok_r(i ? NULL : line, " ", &save);
		if (!f[i])
			return 0;
	}
	unescape_octal(f[4]);
	if (strcmp(f[4], mountpoint))
		return 0;
	memset(out, 0, sizeof(*out));
	out->id = strtoul(f[0], NULL, 10);
	out->parent = strtoul(f[1], NULL, 10);
	if (sscanf(f[2], "%u:%u", &out->m.major, &out->m.minor) != 2)
		return 0;
	save = NULL;
	f[0] = strtok_r(tail, " \n", &save);
	f[1] = f[0] ? strtok_r(NULL, " \n", &save) : NULL;
	if (!f[0] || !f[1])
		return 0;
	unescape_octal(f[1]);
	snprintf(out->m.fstype, sizeof(out->m.fstype), "%s", f[0]);
	snprintf(out->m.source, sizeof(out->m.source), "%s", f[1]);
	return 1;
}

int mountinfo_has(uint64_t mount_id, const char *mountpoint)
{
	struct mi_line one;
	char *line = NULL;
	size_t linecap = 0;
	FILE *fp = fopen("/proc/self/mountinfo", "re");
	int found = 0;

	if (!fp)
		return -errno;
	while (!found && getline(&line, &linecap, fp) > 0)
		found = mi_parse(line, mountpoint, &one) && one.id == mount_id;
	free(line);
	fclose(fp);
	return found;
}

int mountinfo_find(const char *mountpoint, struct mount_entry *out)
{
	struct mi_line *hits = NULL, one;
	size_t nr = 0, cap = 0, i, j;
	char *line = NULL;
	size_t linecap = 0;
	FILE *fp;
	int ret = -ENOENT;

	fp = fopen("/proc/self/mountinfo", "re");
	if (!fp)
		return -errno;
	while (getline(&line, &linecap, fp) > 0) {
		if (!mi_parse(line, mountpoint, &one))
			continue;
		if (array_reserve(&hits, &cap, nr + 1, sizeof(*hits), 4)) {
			ret = -ENOMEM;
			goto out;
		}
		hits[nr++] = one;
	}
	/* The top of a stack of mounts on one path is no other's parent. */
	for (i = nr; i-- > 0;) {
		for (j = 0; j < nr && hits[j].parent != hits[i].id; j++)
			;
		if (j == nr) {
			*out = hits[i].m;
			ret = 0;
			break;
		}
	}
out:
	free(line);
	free(hits);
	fclose(fp);
	return ret;
}
