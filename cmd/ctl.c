// SPDX-License-Identifier: MIT
/* The ferry <-> ferryd control protocol (ctl.h). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "../pkg-base/base.h"
#include "ctl.h"

const char *ctl_default_socket(void)
{
	const char *s = getenv(CTL_SOCKET_ENV);

	return s && *s ? s : CTL_DEFAULT_SOCKET;
}

int ctl_connect(const char *path, int *out)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd, err;

	if (strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
		err = -errno;
		close(fd);
		return err;
	}
	*out = fd;
	return 0;
}

int ctl_send(int fd, struct json_object *msg)
{
	const char *s = json_object_to_json_string_ext(msg, JSON_C_TO_STRING_PLAIN |
						       JSON_C_TO_STRING_NOSLASHESCAPE);
	size_t len = strlen(s), off = 0;
	char nl = '\n';
	ssize_t n;

	if (len + 1 > CTL_LINE_MAX)
		return -EMSGSIZE;
	/* Plain JSON never holds a raw newline: strings escape it. */
	while (off < len) {
		n = send(fd, s + off, len - off, MSG_NOSIGNAL);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		off += (size_t)n;
	}
	while ((n = send(fd, &nl, 1, MSG_NOSIGNAL)) < 0 && errno == EINTR)
		;
	return n < 0 ? -errno : 0;
}

void ctl_reader_init(struct ctl_reader *r, int fd)
{
	memset(r, 0, sizeof(*r));
	r->fd = fd;
}

void ctl_reader_free(struct ctl_reader *r)
{
	free(r->buf);
	r->buf = NULL;
	r->len = r->cap = 0;
}

static int parse_line(struct ctl_reader *r, size_t nl, struct json_object **out)
{
	struct json_tokener *tok;
	struct json_object *o;
	enum json_tokener_error jerr;
	size_t consumed;

	r->buf[nl] = '\0';
	tok = json_tokener_new();
	if (!tok)
		return -ENOMEM;
	o = json_tokener_parse_ex(tok, r->buf, (int)nl);
	jerr = json_tokener_get_error(tok);
	/* Anything but blanks after the object on its line is junk too. */
	if (o && jerr == json_tokener_success) {
		size_t i = json_tokener_get_parse_end(tok);

		while (i < nl && strchr(" \t\r", r->buf[i]))
			i++;
		if (i != nl)
			jerr = json_tokener_error_parse_unexpected;
	}
	if (o && jerr != json_tokener_success) {
		json_object_put(o);
		o = NULL;
	}
	json_tokener_free(tok);
	/* @nl == r->len: a last line without its newline. */
	consumed = MIN(nl + 1, r->len);
	memmove(r->buf, r->buf + consumed, r->len - consumed);
	r->len -= consumed;
	if (!o || !json_object_is_type(o, json_type_object)) {
		json_object_put(o);
		return -EPROTO;
	}
	*out = o;
	return 0;
}

int ctl_recv(struct ctl_reader *r, int timeout_ms, struct json_object **out)
{
	uint64_t deadline = timeout_ms < 0 ? 0 :
			    ferry_now_ns() + (uint64_t)timeout_ms * 1000000u;
	size_t scanned = 0;
	char *nl;
	ssize_t n;

	for (;;) {
		nl = r->len > scanned ? memchr(r->buf + scanned, '\n', r->len - scanned) :
					NULL;
		if (nl)
			return parse_line(r, (size_t)(nl - r->buf), out);
		scanned = r->len;
		if (r->len >= CTL_LINE_MAX)
			return -EMSGSIZE;
		if (r->cap - r->len < 4096) {
			size_t cap = r->cap ? r->cap * 2 : 8192;
			char *p;

			cap = MIN(cap, (size_t)CTL_LINE_MAX + 1);
			p = realloc(r->buf, cap);
			if (!p)
				return -ENOMEM;
			r->buf = p;
			r->cap = cap;
		}
		if (timeout_ms >= 0) {
			struct pollfd pfd = { .fd = r->fd, .events = POLLIN };
			uint64_t now = ferry_now_ns();
			int ret;

			if (now >= deadline)
				return -ETIMEDOUT;
			ret = poll(&pfd, 1, (int)MIN((deadline - now) / 1000000u + 1,
						     (uint64_t)INT_MAX));
			if (ret < 0 && errno == EINTR)
				continue;
			if (ret < 0)
				return -errno;
			if (!ret)
				return -ETIMEDOUT;
		}
		n = recv(r->fd, r->buf + r->len, r->cap - r->len - 1, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (!n && !r->len)
			return 1;
		if (!n) /* a last line without its newline */
			return parse_line(r, r->len, out);
		r->len += (size_t)n;
	}
}

int ctl_call(const char *socket_path, struct json_object *req, int timeout_ms,
	     struct json_object **resp)
{
	struct ctl_reader rd;
	int fd, ret;

	ret = ctl_connect(socket_path, &fd);
	if (ret)
		return ret;
	ctl_reader_init(&rd, fd);
	ret = ctl_send(fd, req);
	if (!ret) {
		ret = ctl_recv(&rd, timeout_ms, resp);
		if (ret == 1) /* closed without an answer */
			ret = -ECONNRESET;
	}
	ctl_reader_free(&rd);
	close(fd);
	return ret;
}

struct json_object *ctl_ok(void)
{
	struct json_object *o = json_object_new_object();

	if (o)
		json_object_object_add(o, "ok", json_object_new_boolean(1));
	return o;
}

struct json_object *ctl_error(int err, const char *msg)
{
	struct json_object *o = json_object_new_object();

	if (!o)
		return NULL;
	json_object_object_add(o, "ok", json_object_new_boolean(0));
	json_object_object_add(o, "error", json_object_new_string(msg));
	json_object_object_add(o, "errno", json_object_new_int(err < 0 ? -err : err));
	return o;
}

int ctl_status(struct json_object *resp, const char **msg)
{
	uint64_t e;

	*msg = "malformed answer from ferryd";
	if (!resp || !json_object_is_type(resp, json_type_object))
		return -EPROTO;
	if (ctl_get_bool(resp, "ok", false))
		return 0;
	if (json_get_string(resp, "error"))
		*msg = json_get_string(resp, "error");
	e = ctl_get_u64(resp, "errno", EPROTO);
	return e >= 1 && e < 4096 ? -(int)e : -EPROTO;
}

bool ctl_get_bool(struct json_object *o, const char *key, bool def)
{
	struct json_object *v;

	if (!json_object_object_get_ex(o, key, &v) || !json_object_is_type(v, json_type_boolean))
		return def;
	return json_object_get_boolean(v);
}

uint64_t ctl_get_u64(struct json_object *o, const char *key, uint64_t def)
{
	struct json_object *v;

	if (!json_object_object_get_ex(o, key, &v) || !json_object_is_type(v, json_type_int))
		return def;
	if (json_object_get_int64(v) < 0)
		return def;
	return json_object_get_uint64(v);
}

/* ------------------------------------------------------------------ */
/* Mount requests                                                      */
/* ------------------------------------------------------------------ */

void ctl_mount_req_init(struct ctl_mount_req *r)
{
	memset(r, 0, sizeof(*r));
	fetch_opts_init(&r->fetch);
}

static void add_str(struct json_object *o, const char *key, const char *s)
{
	if (s)
		json_object_object_add(o, key, json_object_new_string(s));
}

static struct json_object *str_array(const char *const *list, size_t n)
{
	struct json_object *a = json_object_new_array();
	size_t i;

	for (i = 0; a && list && (n == SIZE_MAX ? list[i] != NULL : i < n); i++)
		json_object_array_add(a, json_object_new_string(list[i]));
	return a;
}

struct json_object *ctl_mount_req_to_json(const struct ctl_mount_req *r)
{
	struct json_object *o = json_object_new_object(), *f;

	if (!o)
		return NULL;
	f = json_object_new_object();
	if (!f) {
		json_object_put(o);
		return NULL;
	}
	add_str(o, "op", "mount");
	add_str(o, "image", r->image);
	add_str(o, "mountpoint", r->mountpoint);
	add_str(o, "cacheDir", r->cache_dir);
	add_str(o, "mode", r->mode);
	json_object_object_add(o, "prefetchFiles",
			       str_array(r->prefetch_files, r->nr_prefetch_files));
	json_object_object_add(o, "prefetchAll", json_object_new_boolean(r->prefetch_all));
	json_object_object_add(o, "prefetchBwlimit",
			       json_object_new_int64((int64_t)MIN(r->prefetch_bwlimit,
								  (uint64_t)INT64_MAX)));
	add_str(f, "creds", r->fetch.creds);
	add_str(f, "authfile", r->fetch.authfile);
	json_object_object_add(f, "tlsVerify", json_object_new_boolean(r->fetch.tls_verify));
	add_str(f, "caFile", r->fetch.ca_file);
	json_object_object_add(f, "insecure", str_array(r->fetch.insecure, SIZE_MAX));
	json_object_object_add(f, "mirrors", str_array(r->fetch.mirrors, SIZE_MAX));
	json_object_object_add(f, "retries", json_object_new_int64(r->fetch.retries));
	json_object_object_add(f, "stallTimeoutMs",
			       json_object_new_int64(r->fetch.stall_timeout_ms));
	json_object_object_add(o, "fetch", f);
	return o;
}

/* Optional string field: 0 and *@out (NULL if absent), or -EINVAL. */
static int opt_str(struct json_object *o, const char *key, size_t max,
		   const char **out, char *err, size_t errlen)
{
	struct json_object *v;

	*out = NULL;
	if (!json_object_object_get_ex(o, key, &v) || json_object_is_type(v, json_type_null))
		return 0;
	if (!json_object_is_type(v, json_type_string) ||
	    (size_t)json_object_get_string_len(v) > max ||
	    strlen(json_object_get_string(v)) != (size_t)json_object_get_string_len(v)) {
		snprintf(err, errlen, "\"%s\": expected a string of at most %zu bytes",
			 key, max);
		return -EINVAL;
	}
	*out = json_object_get_string(v);
	return 0;
}

static int opt_u64(struct json_object *o, const char *key, uint64_t max,
		   uint64_t *out, char *err, size_t errlen)
{
	struct json_object *v;
	int64_t n;

	if (!json_object_object_get_ex(o, key, &v) || json_object_is_type(v, json_type_null))
		return 0;
	n = json_object_is_type(v, json_type_int) ? json_object_get_int64(v) : -1;
	if (n < 0 || (uint64_t)n > max) {
		snprintf(err, errlen, "\"%s\": expected an integer 0..%llu", key,
			 (unsigned long long)max);
		return -EINVAL;
	}
	*out = (uint64_t)n;
	return 0;
}

static int opt_bool(struct json_object *o, const char *key, bool *out,
		    char *err, size_t errlen)
{
	struct json_object *v;

	if (!json_object_object_get_ex(o, key, &v) || json_object_is_type(v, json_type_null))
		return 0;
	if (!json_object_is_type(v, json_type_boolean)) {
		snprintf(err, errlen, "\"%s\": expected true or false", key);
		return -EINVAL;
	}
	*out = json_object_get_boolean(v);
	return 0;
}

/* A string array: *@out is malloc'ed and NULL-terminated (also when absent). */
static int opt_strs(struct json_object *o, const char *key, size_t max_items,
		    size_t max_len, const char ***out, size_t *nr,
		    char *err, size_t errlen)
{
	struct json_object *v, *e;
	size_t i, n = 0;

	*out = NULL;
	*nr = 0;
	if (json_object_object_get_ex(o, key, &v) && !json_object_is_type(v, json_type_null)) {
		if (!json_object_is_type(v, json_type_array) ||
		    json_object_array_length(v) > max_items) {
			snprintf(err, errlen, "\"%s\": expected an array of at most %zu strings",
				 key, max_items);
			return -EINVAL;
		}
		n = json_object_array_length(v);
	}
	*out = calloc(n + 1, sizeof(**out));
	if (!*out)
		return -ENOMEM;
	for (i = 0; i < n; i++) {
		e = json_object_array_get_idx(v, i);
		if (!json_object_is_type(e, json_type_string) ||
		    !json_object_get_string_len(e) ||
		    (size_t)json_object_get_string_len(e) > max_len ||
		    strlen(json_object_get_string(e)) != (size_t)json_object_get_string_len(e)) {
			snprintf(err, errlen, "\"%s\"[%zu]: expected a non-empty string of at most %zu bytes",
				 key, i, max_len);
			return -EINVAL;
		}
		(*out)[i] = json_object_get_string(e);
	}
	*nr = n;
	return 0;
}

int ctl_mount_req_parse(struct json_object *req, struct ctl_mount_req *r,
			char *err, size_t errlen)
{
	struct json_object *f = NULL;
	const char *mode;
	uint64_t v;
	size_t n;
	int ret;

	ctl_mount_req_init(r);
	r->root = json_object_get(req);
	ret = opt_str(req, "image", 4096, &r->image, err, errlen);
	if (!ret)
		ret = opt_str(req, "mountpoint", PATH_MAX - 1, &r->mountpoint, err, errlen);
	if (!ret)
		ret = opt_str(req, "cacheDir", PATH_MAX - 1, &r->cache_dir, err, errlen);
	if (ret)
		return ret;
	if (!r->image || !*r->image) {
		snprintf(err, errlen, "\"image\" is required");
		return -EINVAL;
	}
	if (!r->mountpoint || r->mountpoint[0] != '/') {
		snprintf(err, errlen, "\"mountpoint\" must be an absolute path");
		return -EINVAL;
	}
	if (!r->cache_dir || r->cache_dir[0] != '/') {
		snprintf(err, errlen, "\"cacheDir\" must be an absolute path");
		return -EINVAL;
	}
	mode = json_get_string(req, "mode") ?: "fuse";
	if (!*mode || strlen(mode) > CTL_MODE_MAX ||
	    mode[strspn(mode, "abcdefghijklmnopqrstuvwxyz")]) {
		snprintf(err, errlen, "\"mode\": expected a mode name such as \"fuse\" or \"fanotify\"");
		return -EINVAL;
	}
	r->mode = mode;
	ret = opt_strs(req, "prefetchFiles", CTL_PREFETCH_FILES_MAX, PATH_MAX - 1,
		       &r->prefetch_files, &r->nr_prefetch_files, err, errlen);
	if (!ret)
		ret = opt_bool(req, "prefetchAll", &r->prefetch_all, err, errlen);
	if (!ret)
		ret = opt_u64(req, "prefetchBwlimit", INT64_MAX, &r->prefetch_bwlimit,
			      err, errlen);
	if (ret)
		return ret;
	if (json_object_object_get_ex(req, "fetch", &f) &&
	    !json_object_is_type(f, json_type_null) &&
	    !json_object_is_type(f, json_type_object)) {
		snprintf(err, errlen, "\"fetch\": expected an object");
		return -EINVAL;
	}
	if (f && json_object_is_type(f, json_type_null))
		f = NULL;
	if (f) {
		ret = opt_str(f, "creds", 4096, &r->fetch.creds, err, errlen);
		if (!ret)
			ret = opt_str(f, "authfile", PATH_MAX - 1, &r->fetch.authfile,
				      err, errlen);
		if (!ret)
			ret = opt_str(f, "caFile", PATH_MAX - 1, &r->fetch.ca_file,
				      err, errlen);
		if (!ret)
			ret = opt_bool(f, "tlsVerify", &r->fetch.tls_verify, err, errlen);
		if (!ret)
			ret = opt_strs(f, "insecure", CTL_HOSTS_MAX, 1024, &r->insecure,
				       &n, err, errlen);
		if (!ret)
			ret = opt_strs(f, "mirrors", CTL_HOSTS_MAX, 4096, &r->mirrors,
				       &n, err, errlen);
		v = 0;
		if (!ret && !(ret = opt_u64(f, "retries", 100, &v, err, errlen)))
			r->fetch.retries = (unsigned int)v;
		v = 0;
		if (!ret && !(ret = opt_u64(f, "stallTimeoutMs", 3600000u, &v, err, errlen)))
			r->fetch.stall_timeout_ms = (unsigned int)v;
		if (ret)
			return ret;
	}
	/* Empty lists rather than NULL, so fetch_opts always has them. */
	if (!r->insecure)
		r->insecure = calloc(1, sizeof(*r->insecure));
	if (!r->mirrors)
		r->mirrors = calloc(1, sizeof(*r->mirrors));
	if (!r->insecure || !r->mirrors)
		return -ENOMEM;
	r->fetch.insecure = r->insecure;
	r->fetch.mirrors = r->mirrors;
	return 0;
}

void ctl_mount_req_free(struct ctl_mount_req *r)
{
	free(r->prefetch_files);
	free(r->insecure);
	free(r->mirrors);
	json_object_put(r->root);
	memset(r, 0, sizeof(*r));
}

/* ------------------------------------------------------------------ */
/* Mount table and paths                                               */
/* ------------------------------------------------------------------ */

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
	struct ctl_mnt m;
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

int ctl_mountinfo(const char *mountpoint, struct ctl_mnt *out)
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

int ctl_mountpoint_path(const char *path, char **out)
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
