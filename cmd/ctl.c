// SPDX-License-Identifier: MIT
/* The ferry <-> ferryd control protocol (ctl.h). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stddef.h>
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

int ctl_json_parse(const char *text, size_t len, struct json_object **out)
{
	struct json_tokener *tok;
	struct json_object *o;
	enum json_tokener_error jerr;

	if (len > INT_MAX)
		return -EPROTO;
	tok = json_tokener_new();
	if (!tok)
		return -ENOMEM;
	o = json_tokener_parse_ex(tok, text, (int)len);
	jerr = json_tokener_get_error(tok);
	/* Anything but blanks after the object on its line is junk too. */
	if (o && jerr == json_tokener_success) {
		size_t i = json_tokener_get_parse_end(tok);

		while (i < len && text[i] && strchr(" \t\r\n", text[i]))
			i++;
		if (i != len)
			jerr = json_tokener_error_parse_unexpected;
	}
	json_tokener_free(tok);
	if (!o || jerr != json_tokener_success ||
	    !json_object_is_type(o, json_type_object)) {
		json_object_put(o);
		return -EPROTO;
	}
	*out = o;
	return 0;
}

static int parse_line(struct ctl_reader *r, size_t nl, struct json_object **out)
{
	size_t consumed;
	int ret;

	r->buf[nl] = '\0';
	ret = ctl_json_parse(r->buf, nl, out);
	/* @nl == r->len: a last line without its newline. */
	consumed = MIN(nl + 1, r->len);
	memmove(r->buf, r->buf + consumed, r->len - consumed);
	r->len -= consumed;
	return ret;
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

/* ------------------------------------------------------------------ */
/* Validation: every parser's input is untrusted                       */
/* ------------------------------------------------------------------ */

__attribute__((format(printf, 3, 4)))
static int bad(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return -EINVAL;
}

/* The value of @key; NULL when absent or null. */
static struct json_object *field(struct json_object *o, const char *key)
{
	struct json_object *v;

	if (!o || !json_object_object_get_ex(o, key, &v) ||
	    json_object_is_type(v, json_type_null))
		return NULL;
	return v;
}

/* A string without NULs of at most @max bytes, or NULL. */
static const char *str_val(struct json_object *v, size_t max)
{
	size_t len;

	if (!json_object_is_type(v, json_type_string))
		return NULL;
	len = (size_t)json_object_get_string_len(v);
	if (len > max || strlen(json_object_get_string(v)) != len)
		return NULL;
	return json_object_get_string(v);
}

/* *@out stays as it is when @key is absent and not @required. */
static int get_str(struct json_object *o, const char *key, size_t max, bool required,
		   const char **out, char *err, size_t errlen)
{
	struct json_object *v = field(o, key);
	const char *s;

	if (!v)
		return required ? bad(err, errlen, "\"%s\" is required", key) : 0;
	s = str_val(v, max);
	if (!s)
		return bad(err, errlen, "\"%s\": expected a string of at most %zu bytes",
			   key, max);
	*out = s;
	return 0;
}

static int get_abspath(struct json_object *o, const char *key, const char **out,
		       char *err, size_t errlen)
{
	int ret = get_str(o, key, PATH_MAX - 1, true, out, err, errlen);

	if (!ret && (*out)[0] != '/')
		return bad(err, errlen, "\"%s\" must be an absolute path", key);
	return ret;
}

/* Into @buf of @size bytes, the string is required. */
static int get_copy(struct json_object *o, const char *key, char *buf, size_t size,
		    char *err, size_t errlen)
{
	const char *s = NULL;
	int ret = get_str(o, key, size - 1, true, &s, err, errlen);

	if (!ret)
		memcpy(buf, s, strlen(s) + 1);
	return ret;
}

static int get_strdup(struct json_object *o, const char *key, size_t max, char **out,
		      char *err, size_t errlen)
{
	const char *s = NULL;
	int ret = get_str(o, key, max, true, &s, err, errlen);

	if (ret)
		return ret;
	*out = strdup(s);
	return *out ? 0 : -ENOMEM;
}

/* A mode, state or prefetch name: [a-z][a-z0-9_-]*, CTL_TOKEN_MAX bytes at most. */
static int get_token(struct json_object *o, const char *key, bool required,
		     const char **out, char *err, size_t errlen)
{
	const char *s = NULL;
	int ret = get_str(o, key, CTL_TOKEN_MAX, required, &s, err, errlen);

	if (ret || !s)
		return ret;
	if (s[0] < 'a' || s[0] > 'z' || strspn(s, "abcdefghijklmnopqrstuvwxyz0123456789_-") !=
					    strlen(s))
		return bad(err, errlen, "\"%s\": expected a lowercase name", key);
	*out = s;
	return 0;
}

static int get_token_copy(struct json_object *o, const char *key,
			  char buf[CTL_TOKEN_MAX + 1], char *err, size_t errlen)
{
	const char *s = NULL;
	int ret = get_token(o, key, true, &s, err, errlen);

	if (!ret)
		memcpy(buf, s, strlen(s) + 1);
	return ret;
}

static int get_s64(struct json_object *o, const char *key, int64_t min, int64_t max,
		   int64_t *out, char *err, size_t errlen)
{
	struct json_object *v = field(o, key);
	int64_t n;

	if (!v)
		return 0;
	/* json-c keeps integers above INT64_MAX as unsigned: never in range. */
	n = json_object_get_int64(v);
	if (!json_object_is_type(v, json_type_int) || n < min || n > max ||
	    (n == INT64_MAX && json_object_get_uint64(v) != (uint64_t)INT64_MAX))
		return bad(err, errlen, "\"%s\": expected an integer %lld..%lld", key,
			   (long long)min, (long long)max);
	*out = n;
	return 0;
}

static int get_u64(struct json_object *o, const char *key, uint64_t max, uint64_t *out,
		   char *err, size_t errlen)
{
	struct json_object *v = field(o, key);

	if (!v)
		return 0;
	if (!json_object_is_type(v, json_type_int) || json_object_get_int64(v) < 0 ||
	    json_object_get_uint64(v) > max)
		return bad(err, errlen, "\"%s\": expected an integer 0..%llu", key,
			   (unsigned long long)max);
	*out = json_object_get_uint64(v);
	return 0;
}

static int get_pid(struct json_object *o, const char *key, bool required, int *out,
		   char *err, size_t errlen)
{
	int64_t n = 0;
	int ret = get_s64(o, key, 1, INT_MAX, &n, err, errlen);

	if (!ret && !n && required)
		return bad(err, errlen, "\"%s\" is required", key);
	if (!ret && n)
		*out = (int)n;
	return ret;
}

static int get_bool(struct json_object *o, const char *key, bool *out, char *err,
		    size_t errlen)
{
	struct json_object *v = field(o, key);

	if (!v)
		return 0;
	if (!json_object_is_type(v, json_type_boolean))
		return bad(err, errlen, "\"%s\": expected true or false", key);
	*out = json_object_get_boolean(v);
	return 0;
}

/*
 * A string array: *@out is malloc'ed and NULL-terminated (also when
 * absent); entries are non-empty.
 */
static int get_strs(struct json_object *o, const char *key, size_t max_items,
		    size_t max_len, const char ***out, size_t *nr, char *err, size_t errlen)
{
	struct json_object *v = field(o, key);
	const char **list;
	size_t i, n = 0;

	if (v && (!json_object_is_type(v, json_type_array) ||
		  json_object_array_length(v) > max_items))
		return bad(err, errlen, "\"%s\": expected an array of at most %zu strings",
			   key, max_items);
	if (v)
		n = json_object_array_length(v);
	list = calloc(n + 1, sizeof(*list));
	if (!list)
		return -ENOMEM;
	*out = list;
	for (i = 0; i < n; i++) {
		list[i] = str_val(json_object_array_get_idx(v, i), max_len);
		if (!list[i] || !*list[i]) {
			list[i] = NULL;
			return bad(err, errlen, "\"%s\"[%zu]: expected a non-empty string of at most %zu bytes",
				   key, i, max_len);
		}
	}
	*nr = n;
	return 0;
}

/* An object field, or NULL when absent. */
static int get_object(struct json_object *o, const char *key, struct json_object **out,
		      char *err, size_t errlen)
{
	*out = field(o, key);
	if (*out && !json_object_is_type(*out, json_type_object))
		return bad(err, errlen, "\"%s\": expected an object", key);
	return 0;
}

/* ------------------------------------------------------------------ */
/* Encoding                                                            */
/* ------------------------------------------------------------------ */

/*
 * Add @v (NULL after a failed allocation) to @o under @key: false when it
 * could not be added (and @v is put).
 */
static bool add(struct json_object *o, const char *key, struct json_object *v)
{
	if (v && !json_object_object_add(o, key, v))
		return true;
	json_object_put(v);
	return false;
}

static bool add_str(struct json_object *o, const char *key, const char *s)
{
	return !s || add(o, key, json_object_new_string(s));
}

/* @n strings of @list (n SIZE_MAX: up to its NULL; a NULL list is empty). */
static struct json_object *str_array(const char *const *list, size_t n)
{
	struct json_object *a = json_object_new_array();
	struct json_object *s;
	size_t i;

	for (i = 0; a && list && (n == SIZE_MAX ? list[i] != NULL : i < n); i++) {
		s = json_object_new_string(list[i]);
		if (!s || json_object_array_add(a, s)) {
			json_object_put(s);
			json_object_put(a);
			return NULL;
		}
	}
	return a;
}

/* @o, or NULL (put) when one of its fields could not be added. */
static struct json_object *done(struct json_object *o, bool ok)
{
	if (ok)
		return o;
	json_object_put(o);
	return NULL;
}

/* ------------------------------------------------------------------ */
/* Registry options                                                    */
/* ------------------------------------------------------------------ */

/* The field's offset; does not compile when it is not of type @T. */
#define FETCH_FIELD(f, T)                                                      \
	(offsetof(struct fetch_opts, f) +                                      \
	 0 * sizeof(char[_Generic(((struct fetch_opts *)0)->f, T: 1, default: -1)]))
#define OPT_STR(key, opt, f, max) { key, opt, CTL_OPT_STR, FETCH_FIELD(f, const char *), max, 0 }
#define OPT_BOOL(key, opt, f) { key, opt, CTL_OPT_BOOL, FETCH_FIELD(f, bool), 0, 0 }
#define OPT_UINT(key, opt, f, max) { key, opt, CTL_OPT_UINT, FETCH_FIELD(f, unsigned int), max, 0 }
#define OPT_STRS(key, opt, f, max, items)                                      \
	{ key, opt, CTL_OPT_STRS, FETCH_FIELD(f, const char *const *), max, items }

const struct ctl_fetch_opt ctl_fetch_opts[CTL_NR_FETCH_OPTS] = {
	OPT_STR("creds", "creds", creds, 4096),
	OPT_STR("authfile", "authfile", authfile, PATH_MAX - 1),
	OPT_BOOL("tlsVerify", "tls-verify", tls_verify),
	OPT_STR("caFile", "ca-file", ca_file, PATH_MAX - 1),
	OPT_STRS("insecure", "insecure-registry", insecure, 1024, CTL_HOSTS_MAX),
	OPT_STRS("mirrors", "registry-mirror", mirrors, 4096, CTL_HOSTS_MAX),
	OPT_STRS("resolve", "resolve", resolve, 1024, CTL_HOSTS_MAX),
	OPT_UINT("retries", "retries", retries, 100),
	OPT_UINT("stallTimeoutMs", "stall-timeout", stall_timeout_ms, 3600000),
};

static struct json_object *fetch_to_json(const struct fetch_opts *f)
{
	struct json_object *o = json_object_new_object();
	const struct ctl_fetch_opt *opt;
	const void *p;
	bool ok = true;

	if (!o)
		return NULL;
	for (opt = ctl_fetch_opts; opt < ctl_fetch_opts + CTL_NR_FETCH_OPTS; opt++) {
		p = (const char *)f + opt->offset;
		switch (opt->type) {
		case CTL_OPT_STR:
			ok &= add_str(o, opt->key, *(const char *const *)p);
			break;
		case CTL_OPT_BOOL:
			ok &= add(o, opt->key, json_object_new_boolean(*(const bool *)p));
			break;
		case CTL_OPT_UINT:
			ok &= add(o, opt->key, json_object_new_int64(*(const unsigned int *)p));
			break;
		case CTL_OPT_STRS:
			ok &= add(o, opt->key, str_array(*(const char *const *const *)p, SIZE_MAX));
			break;
		}
	}
	return done(o, ok);
}

/* Into @f (defaults set); every list is allocated, also when @o is NULL. */
static int fetch_parse(struct json_object *o, struct fetch_opts *f, char *err,
		       size_t errlen)
{
	const struct ctl_fetch_opt *opt;
	const char **list;
	uint64_t v;
	size_t n;
	void *p;
	int ret = 0;

	for (opt = ctl_fetch_opts; !ret && opt < ctl_fetch_opts + CTL_NR_FETCH_OPTS; opt++) {
		p = (char *)f + opt->offset;
		switch (opt->type) {
		case CTL_OPT_STR:
			ret = get_str(o, opt->key, opt->max, false, p, err, errlen);
			break;
		case CTL_OPT_BOOL:
			ret = get_bool(o, opt->key, p, err, errlen);
			break;
		case CTL_OPT_UINT:
			v = *(unsigned int *)p;
			ret = get_u64(o, opt->key, opt->max, &v, err, errlen);
			*(unsigned int *)p = (unsigned int)v;
			break;
		case CTL_OPT_STRS:
			list = NULL;
			ret = get_strs(o, opt->key, opt->max_items, opt->max, &list, &n,
				       err, errlen);
			*(const char *const **)p = list;
			break;
		}
	}
	return ret;
}

static void fetch_free_lists(struct fetch_opts *f)
{
	const struct ctl_fetch_opt *opt;

	for (opt = ctl_fetch_opts; opt < ctl_fetch_opts + CTL_NR_FETCH_OPTS; opt++)
		if (opt->type == CTL_OPT_STRS)
			free((void *)*(const char *const *const *)((char *)f + opt->offset));
}

/* ------------------------------------------------------------------ */
/* Requests                                                            */
/* ------------------------------------------------------------------ */

static const char *const op_names[] = {
	[CTL_OP_MOUNT] = "mount",   [CTL_OP_UMOUNT] = "umount", [CTL_OP_LIST] = "list",
	[CTL_OP_PING] = "ping",     [CTL_OP_SHUTDOWN] = "shutdown",
};

void ctl_mount_req_init(struct ctl_mount_req *r)
{
	memset(r, 0, sizeof(*r));
	fetch_opts_init(&r->fetch);
}

struct json_object *ctl_mount_req_to_json(const struct ctl_mount_req *r)
{
	struct json_object *o = json_object_new_object();
	bool ok;

	if (!o)
		return NULL;
	ok = add_str(o, "op", op_names[CTL_OP_MOUNT]);
	ok &= add_str(o, "image", r->image);
	ok &= add_str(o, "mountpoint", r->mountpoint);
	ok &= add_str(o, "cacheDir", r->cache_dir);
	ok &= add_str(o, "mode", r->mode ?: "fuse");
	ok &= add(o, "prefetchFiles", str_array(r->prefetch_files, r->nr_prefetch_files));
	ok &= add(o, "prefetchAll", json_object_new_boolean(r->prefetch_all));
	ok &= add(o, "prefetchBwlimit",
		  json_object_new_int64((int64_t)MIN(r->prefetch_bwlimit, (uint64_t)INT64_MAX)));
	ok &= add(o, "fetch", fetch_to_json(&r->fetch));
	return done(o, ok);
}

int ctl_mount_req_parse(struct json_object *o, struct ctl_mount_req *r,
			char *err, size_t errlen)
{
	struct json_object *f = NULL;
	int ret;

	ctl_mount_req_init(r);
	r->root = json_object_get(o);
	r->mode = "fuse";
	ret = get_str(o, "image", 4096, true, &r->image, err, errlen);
	if (!ret && !*r->image)
		ret = bad(err, errlen, "\"image\" is required");
	if (!ret)
		ret = get_abspath(o, "mountpoint", &r->mountpoint, err, errlen);
	if (!ret)
		ret = get_abspath(o, "cacheDir", &r->cache_dir, err, errlen);
	if (!ret)
		ret = get_token(o, "mode", false, &r->mode, err, errlen);
	if (!ret)
		ret = get_strs(o, "prefetchFiles", CTL_PREFETCH_FILES_MAX, PATH_MAX - 1,
			       &r->prefetch_files, &r->nr_prefetch_files, err, errlen);
	if (!ret)
		ret = get_bool(o, "prefetchAll", &r->prefetch_all, err, errlen);
	if (!ret)
		ret = get_u64(o, "prefetchBwlimit", INT64_MAX, &r->prefetch_bwlimit, err,
			      errlen);
	if (!ret)
		ret = get_object(o, "fetch", &f, err, errlen);
	if (!ret)
		ret = fetch_parse(f, &r->fetch, err, errlen);
	return ret;
}

void ctl_mount_req_free(struct ctl_mount_req *r)
{
	free(r->prefetch_files);
	fetch_free_lists(&r->fetch);
	json_object_put(r->root);
	memset(r, 0, sizeof(*r));
}

struct json_object *ctl_umount_req_to_json(const struct ctl_umount_req *r)
{
	struct json_object *o = json_object_new_object();
	bool ok;

	if (!o)
		return NULL;
	ok = add_str(o, "op", op_names[CTL_OP_UMOUNT]);
	ok &= add_str(o, "mountpoint", r->mountpoint);
	ok &= add(o, "lazy", json_object_new_boolean(r->lazy));
	return done(o, ok);
}

int ctl_umount_req_parse(struct json_object *o, struct ctl_umount_req *r,
			 char *err, size_t errlen)
{
	int ret;

	memset(r, 0, sizeof(*r));
	ret = get_abspath(o, "mountpoint", &r->mountpoint, err, errlen);
	if (!ret)
		ret = get_bool(o, "lazy", &r->lazy, err, errlen);
	return ret;
}

struct json_object *ctl_op_req_to_json(enum ctl_op op)
{
	struct json_object *o = json_object_new_object();

	return o ? done(o, add_str(o, "op", op_names[op])) : NULL;
}

int ctl_request_parse(struct json_object *o, struct ctl_request *req,
		      char *err, size_t errlen)
{
	const char *op = NULL;
	char why[1024] = "";
	int ret;

	memset(req, 0, sizeof(*req));
	ret = get_str(o, "op", 64, true, &op, err, errlen);
	if (ret)
		return bad(err, errlen, "request without \"op\"");
	for (req->op = CTL_OP_MOUNT; req->op <= CTL_OP_SHUTDOWN; req->op++)
		if (!strcmp(op, op_names[req->op]))
			break;
	switch (req->op) {
	case CTL_OP_MOUNT:
		ret = ctl_mount_req_parse(o, &req->mount, why, sizeof(why));
		break;
	case CTL_OP_UMOUNT:
		ret = ctl_umount_req_parse(o, &req->umount, why, sizeof(why));
		break;
	case CTL_OP_LIST:
	case CTL_OP_PING:
	case CTL_OP_SHUTDOWN:
		return 0;
	default:
		return bad(err, errlen, "unknown op \"%s\"", op);
	}
	if (ret)
		snprintf(err, errlen, "invalid %s request: %s", op,
			 why[0] ? why : strerror(-ret));
	return ret;
}

void ctl_request_free(struct ctl_request *req)
{
	if (req->op == CTL_OP_MOUNT)
		ctl_mount_req_free(&req->mount);
	memset(req, 0, sizeof(*req));
}

/* ------------------------------------------------------------------ */
/* Answers                                                             */
/* ------------------------------------------------------------------ */

struct json_object *ctl_reply_to_json(const struct ctl_reply *r)
{
	struct json_object *o = json_object_new_object();
	bool ok;

	if (!o)
		return NULL;
	ok = add(o, "ok", json_object_new_boolean(!r->err));
	if (r->err) {
		ok &= add_str(o, "error", r->error ?: strerror(-r->err));
		ok &= add(o, "errno", json_object_new_int(r->err < 0 ? -r->err : r->err));
	}
	return done(o, ok);
}

/* Malformed answers are -EPROTO, not the -EINVAL of the field checks. */
static int proto(int ret)
{
	return ret == -EINVAL ? -EPROTO : ret;
}

int ctl_reply_parse(struct json_object *o, struct ctl_reply *r, char *err, size_t errlen)
{
	bool ok = false;
	int64_t e = 0;
	int ret;

	memset(r, 0, sizeof(*r));
	if (!field(o, "ok"))
		return proto(bad(err, errlen, "\"ok\" is required"));
	ret = get_bool(o, "ok", &ok, err, errlen);
	if (ret || ok)
		return proto(ret);
	ret = get_str(o, "error", CTL_MSG_MAX, true, &r->error, err, errlen);
	if (!ret)
		ret = get_s64(o, "errno", 1, 4095, &e, err, errlen);
	if (!ret && !e)
		ret = bad(err, errlen, "\"errno\" is required");
	r->err = -(int)e;
	return proto(ret);
}

/* An answer's "ok": it must be true for the answers that say more. */
static int want_ok(struct json_object *o, char *err, size_t errlen)
{
	bool ok = false;
	int ret = get_bool(o, "ok", &ok, err, errlen);

	if (!ret && !ok)
		ret = bad(err, errlen, "\"ok\": expected true");
	return ret;
}

struct json_object *ctl_mount_reply_to_json(const struct ctl_mount_reply *r)
{
	struct json_object *o = ctl_reply_to_json(&(struct ctl_reply){ 0 });

	return o ? done(o, add(o, "pid", json_object_new_int(r->pid))) : NULL;
}

int ctl_mount_reply_parse(struct json_object *o, struct ctl_mount_reply *r,
			  char *err, size_t errlen)
{
	int ret = want_ok(o, err, errlen);

	memset(r, 0, sizeof(*r));
	if (!ret)
		ret = get_pid(o, "pid", true, &r->pid, err, errlen);
	return proto(ret);
}

static bool add_ping(struct json_object *o, const struct ctl_ping_reply *r)
{
	bool ok = add(o, "pid", json_object_new_int(r->pid));

	ok &= add_str(o, "version", r->version);
	ok &= add_str(o, "socket", r->socket);
	return ok;
}

struct json_object *ctl_ping_reply_to_json(const struct ctl_ping_reply *r)
{
	struct json_object *o = ctl_reply_to_json(&(struct ctl_reply){ 0 });

	return o ? done(o, add_ping(o, r)) : NULL;
}

static int parse_ping(struct json_object *o, struct ctl_ping_reply *r, char *err,
		      size_t errlen)
{
	int ret = want_ok(o, err, errlen);

	memset(r, 0, sizeof(*r));
	if (!ret)
		ret = get_pid(o, "pid", true, &r->pid, err, errlen);
	if (!ret)
		ret = get_copy(o, "version", r->version, sizeof(r->version), err, errlen);
	if (!ret)
		ret = get_copy(o, "socket", r->socket, sizeof(r->socket), err, errlen);
	return ret;
}

int ctl_ping_reply_parse(struct json_object *o, struct ctl_ping_reply *r,
			 char *err, size_t errlen)
{
	return proto(parse_ping(o, r, err, errlen));
}

static bool add_u64(struct json_object *o, const char *key, uint64_t v)
{
	return add(o, key, json_object_new_uint64(v));
}

struct json_object *ctl_mount_stats_to_json(const struct ctl_mount_stats *m)
{
	struct json_object *o = json_object_new_object();
	char secs[32];
	bool ok;

	if (!o)
		return NULL;
	ok = add_str(o, "mountpoint", m->mountpoint);
	ok &= add_str(o, "image", m->image);
	ok &= add_str(o, "cacheDir", m->cache_dir);
	ok &= add_str(o, "mode", m->mode);
	if (m->keeper_pid)
		ok &= add(o, "keeperPid", json_object_new_int(m->keeper_pid));
	ok &= add_str(o, "state", m->state);
	ok &= add(o, "mountedAt", json_object_new_int64(m->mounted_at));
	ok &= add_u64(o, "bytesRead", m->bytes_read);
	ok &= add_u64(o, "bytesFetched", m->bytes_fetched);
	ok &= add_u64(o, "bytesPrefetched", m->bytes_prefetched);
	ok &= add_u64(o, "chunksPresent", m->chunks_present);
	ok &= add_u64(o, "chunksTotal", m->chunks_total);
	ok &= add_u64(o, "bytesPresent", m->bytes_present);
	ok &= add_str(o, "prefetch", m->prefetch);
	ok &= add_u64(o, "prefetchFiles", m->prefetch_files);
	ok &= add_u64(o, "readaheadFiles", m->readahead_files);
	ok &= add_u64(o, "readaheadBytes", m->readahead_bytes);
	/* Milliseconds as seconds, written with exactly three decimals. */
	snprintf(secs, sizeof(secs), "%llu.%03llu", (unsigned long long)(m->prefetch_ms / 1000),
		 (unsigned long long)(m->prefetch_ms % 1000));
	ok &= add(o, "prefetchSeconds", json_object_new_double_s((double)m->prefetch_ms / 1e3,
								 secs));
	return done(o, ok);
}

static int parse_stats(struct json_object *o, struct ctl_mount_stats *m, char *err,
		       size_t errlen)
{
	static const struct {
		const char *key;
		size_t off;
	} counters[] = {
#define C(k, f) { k, offsetof(struct ctl_mount_stats, f) }
		C("bytesRead", bytes_read), C("bytesFetched", bytes_fetched),
		C("bytesPrefetched", bytes_prefetched), C("chunksPresent", chunks_present),
		C("chunksTotal", chunks_total), C("bytesPresent", bytes_present),
		C("prefetchFiles", prefetch_files), C("readaheadFiles", readahead_files),
		C("readaheadBytes", readahead_bytes),
#undef C
	};
	struct json_object *v;
	double secs;
	size_t i;
	int ret;

	if (!json_object_is_type(o, json_type_object))
		return bad(err, errlen, "expected an object");
	ret = get_strdup(o, "mountpoint", PATH_MAX - 1, &m->mountpoint, err, errlen);
	if (!ret)
		ret = get_strdup(o, "image", 4096, &m->image, err, errlen);
	if (!ret)
		ret = get_strdup(o, "cacheDir", PATH_MAX - 1, &m->cache_dir, err, errlen);
	if (!ret)
		ret = get_token_copy(o, "mode", m->mode, err, errlen);
	if (!ret)
		ret = get_token_copy(o, "state", m->state, err, errlen);
	if (!ret)
		ret = get_token_copy(o, "prefetch", m->prefetch, err, errlen);
	if (!ret)
		ret = get_pid(o, "keeperPid", false, &m->keeper_pid, err, errlen);
	if (!ret)
		ret = get_s64(o, "mountedAt", INT64_MIN, INT64_MAX, &m->mounted_at, err,
			      errlen);
	for (i = 0; !ret && i < ARRAY_SIZE(counters); i++)
		ret = get_u64(o, counters[i].key, UINT64_MAX,
			      (uint64_t *)((char *)m + counters[i].off), err, errlen);
	v = field(o, "prefetchSeconds");
	if (!ret && v) {
		secs = json_object_get_double(v);
		/* NaN fails both comparisons. */
		if ((!json_object_is_type(v, json_type_double) &&
		     !json_object_is_type(v, json_type_int)) || !(secs >= 0 && secs < 1e12))
			return bad(err, errlen, "\"prefetchSeconds\": expected a number of seconds");
		m->prefetch_ms = (uint64_t)(secs * 1e3 + 0.5);
	}
	return ret;
}

struct json_object *ctl_list_reply_to_json(const struct ctl_list_reply *r)
{
	struct json_object *o = ctl_reply_to_json(&(struct ctl_reply){ 0 }), *a, *m;
	bool ok;
	size_t i;

	if (!o)
		return NULL;
	ok = add_ping(o, &r->daemon);
	a = json_object_new_array();
	for (i = 0; a && i < r->nr_mounts; i++) {
		m = ctl_mount_stats_to_json(&r->mounts[i]);
		if (!m || json_object_array_add(a, m)) {
			json_object_put(m);
			json_object_put(a);
			a = NULL;
		}
	}
	ok &= add(o, "mounts", a);
	return done(o, ok);
}

int ctl_list_reply_parse(struct json_object *o, struct ctl_list_reply *r,
			 char *err, size_t errlen)
{
	struct json_object *a;
	char why[512];
	size_t i, n;
	int ret;

	memset(r, 0, sizeof(*r));
	ret = parse_ping(o, &r->daemon, err, errlen);
	if (ret)
		return proto(ret);
	a = field(o, "mounts");
	if (!a || !json_object_is_type(a, json_type_array) ||
	    json_object_array_length(a) > CTL_MOUNTS_MAX)
		return proto(bad(err, errlen, "\"mounts\": expected an array of at most %u mounts",
				 CTL_MOUNTS_MAX));
	n = json_object_array_length(a);
	r->mounts = calloc(n ?: 1, sizeof(*r->mounts));
	if (!r->mounts)
		return -ENOMEM;
	for (i = 0; i < n; i++) {
		/* Counted first: a failed entry is freed with the others. */
		r->nr_mounts++;
		ret = parse_stats(json_object_array_get_idx(a, i), &r->mounts[i], why,
				  sizeof(why));
		if (ret)
			return proto(ret == -EINVAL ? bad(err, errlen, "\"mounts\"[%zu]: %s", i, why) :
						      ret);
	}
	return 0;
}

void ctl_list_reply_free(struct ctl_list_reply *r)
{
	size_t i;

	for (i = 0; i < r->nr_mounts; i++) {
		free(r->mounts[i].mountpoint);
		free(r->mounts[i].image);
		free(r->mounts[i].cache_dir);
	}
	free(r->mounts);
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
