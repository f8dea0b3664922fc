// SPDX-License-Identifier: MIT
/* The ferry <-> ferryd control protocol (ctl.h). */
#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../pkg-base/base.h"
#include "ctl.h"

const char *ctl_default_socket(void)
{
	const char *s = getenv(CTL_SOCKET_ENV);

	return s && *s ? s : CTL_DEFAULT_SOCKET;
}

int ctl_call(const char *socket_path, struct json_object *req, int timeout_ms,
	     struct json_object **resp)
{
	struct jsonl_reader rd;
	int fd, ret;

	ret = unix_connect(socket_path, &fd);
	if (ret)
		return ret;
	jsonl_reader_init(&rd, fd, CTL_LINE_MAX);
	ret = jsonl_send(fd, req, CTL_LINE_MAX);
	if (!ret) {
		ret = jsonl_recv(&rd, timeout_ms, resp);
		if (ret == 1) /* closed without an answer */
			ret = -ECONNRESET;
	}
	jsonl_reader_free(&rd);
	close(fd);
	return ret;
}

/* A mode, state or prefetch name: [a-z][a-z0-9_-]*, CTL_TOKEN_MAX bytes at most. */
static int get_token(struct json_object *o, const char *key, bool required,
		     const char **out, char *err, size_t errlen)
{
	const char *s = NULL;
	int ret = json_read_str(o, key, CTL_TOKEN_MAX, required, &s, err, errlen);

	if (ret || !s)
		return ret;
	if (s[0] < 'a' || s[0] > 'z' || strspn(s, "abcdefghijklmnopqrstuvwxyz0123456789_-") !=
					    strlen(s))
		return json_bad(err, errlen, "\"%s\": expected a lowercase name", key);
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

static int get_pid(struct json_object *o, const char *key, bool required, int *out,
		   char *err, size_t errlen)
{
	int64_t n = 0;
	int ret = json_read_s64(o, key, 1, INT_MAX, &n, err, errlen);

	if (!ret && !n && required)
		return json_bad(err, errlen, "\"%s\" is required", key);
	if (!ret && n)
		*out = (int)n;
	return ret;
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
#define OPT_HOSTS(key, opt, f, items)                                          \
	{ key, opt, CTL_OPT_HOSTS, FETCH_FIELD(f, const struct fetch_host *const *), \
	  FETCH_HOST_URL_MAX, items }

const struct ctl_fetch_opt ctl_fetch_opts[CTL_NR_FETCH_OPTS] = {
	OPT_STR("creds", "creds", creds, FETCH_CREDS_MAX),
	OPT_STR("authfile", "authfile", authfile, PATH_MAX - 1),
	OPT_BOOL("tlsVerify", "tls-verify", tls_verify),
	OPT_STR("caFile", "ca-file", ca_file, PATH_MAX - 1),
	OPT_STRS("insecure", "insecure-registry", insecure, 1024, CTL_HOSTS_MAX),
	OPT_HOSTS("hosts", "registry-hosts", hosts, CTL_HOSTS_MAX),
	OPT_STRS("resolve", "resolve", resolve, 1024, CTL_HOSTS_MAX),
	OPT_UINT("retries", "retries", retries, 100),
	OPT_UINT("stallTimeoutMs", "stall-timeout", stall_timeout_ms, 3600000),
	OPT_UINT("requestTimeoutMs", "request-timeout", request_timeout_ms, 3600000),
};

static const char *const host_caps[] = { "pull", "resolve", "push" };

static struct json_object *host_to_json(const struct fetch_host *h)
{
	struct json_object *o = json_object_new_object(), *caps;
	bool ok = true;
	size_t i;

	if (!o)
		return NULL;
	ok &= json_add_str(o, "registry", h->registry);
	ok &= json_add_str(o, "url", h->url);
	if (h->capabilities) {
		caps = json_object_new_array();
		ok &= json_add(o, "capabilities", caps);
		for (i = 0; ok && i < ARRAY_SIZE(host_caps); i++)
			if (h->capabilities & fetch_host_capability(host_caps[i]))
				ok &= !json_object_array_add(caps,
					json_object_new_string(host_caps[i]));
	}
	ok &= json_add(o, "server", json_object_new_boolean(h->server));
	ok &= json_add(o, "skipVerify", json_object_new_boolean(h->skip_verify));
	ok &= json_add(o, "overridePath", json_object_new_boolean(h->override_path));
	if (h->ca_files)
		ok &= json_add(o, "ca", json_str_array(h->ca_files, SIZE_MAX));
	ok &= json_add_str(o, "clientCert", h->client_cert);
	ok &= json_add_str(o, "clientKey", h->client_key);
	if (h->headers)
		ok &= json_add(o, "headers", json_str_array(h->headers, SIZE_MAX));
	return json_done(o, ok);
}

struct json_object *ctl_hosts_to_json(const struct fetch_host *const *hosts)
{
	struct json_object *a = json_object_new_array();
	bool ok = a != NULL;

	for (; ok && hosts && *hosts; hosts++) {
		struct json_object *h = host_to_json(*hosts);

		ok = h && !json_object_array_add(a, h);
		if (!ok)
			json_object_put(h);
	}
	return json_done(a, ok);
}

void ctl_hosts_free(const struct fetch_host *const *hosts)
{
	const struct fetch_host *const *p;

	for (p = hosts; p && *p; p++) {
		free((void *)(*p)->ca_files);
		free((void *)(*p)->headers);
		free((void *)*p);
	}
	free((void *)hosts);
}

static int host_parse(struct json_object *o, struct fetch_host *h, char *err,
		      size_t errlen)
{
	const char **list = NULL;
	size_t n, i;
	int ret;

	if (!json_object_is_type(o, json_type_object))
		return json_bad(err, errlen, "\"hosts\": expected objects");
	ret = json_read_str(o, "registry", 1024, true, &h->registry, err, errlen);
	if (!ret)
		ret = json_read_str(o, "url", FETCH_HOST_URL_MAX, true, &h->url, err,
				    errlen);
	if (!ret)
		ret = json_read_strs(o, "capabilities", ARRAY_SIZE(host_caps), 16,
				     &list, &n, err, errlen);
	for (i = 0; !ret && list[i]; i++) {
		if (!fetch_host_capability(list[i]))
			ret = json_bad(err, errlen, "\"capabilities\": \"%s\" is not "
				       "pull, resolve or push", list[i]);
		h->capabilities |= fetch_host_capability(list[i]);
	}
	free(list);
	if (!ret)
		ret = json_read_bool(o, "server", &h->server, err, errlen);
	if (!ret)
		ret = json_read_bool(o, "skipVerify", &h->skip_verify, err, errlen);
	if (!ret)
		ret = json_read_bool(o, "overridePath", &h->override_path, err, errlen);
	if (!ret)
		ret = json_read_strs(o, "ca", FETCH_HOST_CA_MAX, PATH_MAX - 1,
				     (const char ***)&h->ca_files, &n, err, errlen);
	if (!ret)
		ret = json_read_str(o, "clientCert", PATH_MAX - 1, false,
				    &h->client_cert, err, errlen);
	if (!ret)
		ret = json_read_str(o, "clientKey", PATH_MAX - 1, false,
				    &h->client_key, err, errlen);
	if (!ret)
		ret = json_read_strs(o, "headers", FETCH_HOST_HEADERS_MAX, 8192,
				     (const char ***)&h->headers, &n, err, errlen);
	if (!ret && fetch_check_host(h, err, errlen))
		ret = -EINVAL;
	return ret;
}

int ctl_hosts_parse(struct json_object *arr, const struct fetch_host *const **out,
		    char *err, size_t errlen)
{
	const struct fetch_host **hosts;
	size_t n = 0, i;
	int ret = 0;

	*out = NULL;
	if (arr && !json_object_is_type(arr, json_type_array))
		return json_bad(err, errlen, "\"hosts\": expected an array");
	if (arr)
		n = json_object_array_length(arr);
	if (n > CTL_HOSTS_MAX)
		return json_bad(err, errlen, "\"hosts\": more than %u", CTL_HOSTS_MAX);
	hosts = calloc(n + 1, sizeof(*hosts));
	if (!hosts)
		return -ENOMEM;
	for (i = 0; !ret && i < n; i++) {
		struct fetch_host *h = calloc(1, sizeof(*h));

		if (!h) {
			ret = -ENOMEM;
			break;
		}
		hosts[i] = h;
		ret = host_parse(json_object_array_get_idx(arr, i), h, err, errlen);
	}
	if (ret) {
		ctl_hosts_free(hosts);
		return ret;
	}
	*out = hosts;
	return 0;
}

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
			ok &= json_add_str(o, opt->key, *(const char *const *)p);
			break;
		case CTL_OPT_BOOL:
			ok &= json_add(o, opt->key, json_object_new_boolean(*(const bool *)p));
			break;
		case CTL_OPT_UINT:
			ok &= json_add(o, opt->key, json_object_new_int64(*(const unsigned int *)p));
			break;
		case CTL_OPT_STRS:
			ok &= json_add(o, opt->key, json_str_array(*(const char *const *const *)p, SIZE_MAX));
			break;
		case CTL_OPT_HOSTS:
			ok &= json_add(o, opt->key, ctl_hosts_to_json(
				*(const struct fetch_host *const *const *)p));
			break;
		}
	}
	return json_done(o, ok);
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
			ret = json_read_str(o, opt->key, opt->max, false, p, err, errlen);
			break;
		case CTL_OPT_BOOL:
			ret = json_read_bool(o, opt->key, p, err, errlen);
			break;
		case CTL_OPT_UINT:
			v = *(unsigned int *)p;
			ret = json_read_u64(o, opt->key, opt->max, &v, err, errlen);
			*(unsigned int *)p = (unsigned int)v;
			break;
		case CTL_OPT_STRS:
			list = NULL;
			ret = json_read_strs(o, opt->key, opt->max_items, opt->max,
					     &list, &n, err, errlen);
			*(const char *const **)p = list;
			break;
		case CTL_OPT_HOSTS:
			ret = ctl_hosts_parse(json_field(o, opt->key),
					      (const struct fetch_host *const **)p,
					      err, errlen);
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
		else if (opt->type == CTL_OPT_HOSTS)
			ctl_hosts_free(*(const struct fetch_host *const *const *)
					       ((char *)f + opt->offset));
}

/* ------------------------------------------------------------------ */
/* Requests                                                            */
/* ------------------------------------------------------------------ */

static const char *const op_names[] = {
	[CTL_OP_MOUNT] = "mount",   [CTL_OP_UMOUNT] = "umount", [CTL_OP_LIST] = "list",
	[CTL_OP_PING] = "ping",     [CTL_OP_SHUTDOWN] = "shutdown",
	[CTL_OP_METRICS] = "metrics", [CTL_OP_UPGRADE] = "upgrade",
	[CTL_OP_PROBE] = "probe",
};

void ctl_mount_req_init(struct ctl_mount_req *r)
{
	memset(r, 0, sizeof(*r));
	r->cache_min_free = -1;
	r->takeover_fd = -1;
	fetch_opts_init(&r->fetch);
}

struct json_object *ctl_mount_req_to_json(const struct ctl_mount_req *r)
{
	struct json_object *o = json_object_new_object();
	bool ok;

	if (!o)
		return NULL;
	ok = json_add_str(o, "op", op_names[CTL_OP_MOUNT]);
	ok &= json_add_str(o, "image", r->image);
	ok &= json_add_str(o, "mountpoint", r->mountpoint);
	ok &= json_add_str(o, "cacheDir", r->cache_dir);
	ok &= json_add_str(o, "mode", r->mode ?: "fuse");
	if (r->domain)
		ok &= json_add_str(o, "domain", r->domain);
	if (r->record)
		ok &= json_add_str(o, "record", r->record);
	if (r->image_digest)
		ok &= json_add_str(o, "imageDigest", r->image_digest);
	if (r->index_digest)
		ok &= json_add_str(o, "indexDigest", r->index_digest);
	if (r->sysfs)
		ok &= json_add_str(o, "sysfs", r->sysfs);
	ok &= json_add(o, "prefetchFiles", json_str_array(r->prefetch_files, r->nr_prefetch_files));
	ok &= json_add(o, "prefetchAll", json_object_new_boolean(r->prefetch_all));
	ok &= json_add(o, "prefetchBwlimit",
		  json_object_new_int64((int64_t)MIN(r->prefetch_bwlimit, (uint64_t)INT64_MAX)));
	if (r->cache_max_size)
		ok &= json_add(o, "cacheMaxSize", json_object_new_int64(
			(int64_t)MIN(r->cache_max_size, (uint64_t)INT64_MAX)));
	if (r->cache_min_free >= 0)
		ok &= json_add(o, "cacheMinFree",
			       json_object_new_int64(r->cache_min_free));
	ok &= json_add(o, "suid", json_object_new_boolean(r->suid));
	ok &= json_add(o, "dev", json_object_new_boolean(r->dev));
	ok &= json_add(o, "fetch", fetch_to_json(&r->fetch));
	return json_done(o, ok);
}

/* An optional "sha256:<hex>" string field of a request. */
static int req_digest(struct json_object *o, const char *key, const char **out,
		      char *err, size_t errlen)
{
	int ret = json_read_str(o, key, DIGEST_STRING_SIZE - 1, false, out, err, errlen);

	if (!ret && *out && digest_parse(*out, (uint8_t[32]){ 0 }))
		ret = json_bad(err, errlen, "\"%s\" is not a sha256 digest", key);
	return ret;
}

/* A mount request, or with @probe a probe's (no mount point). */
static int mount_req_parse(struct json_object *o, struct ctl_mount_req *r, bool probe,
			   char *err, size_t errlen)
{
	struct json_object *f = NULL;
	int ret;

	ctl_mount_req_init(r);
	r->root = json_object_get(o);
	r->mode = "fuse";
	ret = json_read_str(o, "image", 4096, true, &r->image, err, errlen);
	if (!ret && !*r->image)
		ret = json_bad(err, errlen, "\"image\" is required");
	if (!ret && !probe)
		ret = json_read_abspath(o, "mountpoint", &r->mountpoint, err, errlen);
	if (!ret)
		ret = json_read_abspath(o, "cacheDir", &r->cache_dir, err, errlen);
	if (!ret)
		ret = get_token(o, "mode", false, &r->mode, err, errlen);
	if (!ret && json_field(o, "record"))
		ret = json_read_abspath(o, "record", &r->record, err, errlen);
	if (!ret)
		ret = req_digest(o, "imageDigest", &r->image_digest, err, errlen);
	if (!ret)
		ret = req_digest(o, "indexDigest", &r->index_digest, err, errlen);
	if (!ret)
		ret = json_read_str(o, "domain", META_FSCACHE_ID_MAX, false, &r->domain, err,
				    errlen);
	if (!ret)
		ret = json_read_str(o, "sysfs", 159, false, &r->sysfs, err, errlen);
	if (!ret)
		ret = json_read_strs(o, "prefetchFiles", CTL_PREFETCH_FILES_MAX,
				     PATH_MAX - 1, &r->prefetch_files,
				     &r->nr_prefetch_files, err, errlen);
	if (!ret)
		ret = json_read_bool(o, "prefetchAll", &r->prefetch_all, err, errlen);
	if (!ret)
		ret = json_read_u64(o, "prefetchBwlimit", INT64_MAX,
				    &r->prefetch_bwlimit, err, errlen);
	if (!ret)
		ret = json_read_u64(o, "cacheMaxSize", INT64_MAX,
				    &r->cache_max_size, err, errlen);
	if (!ret)
		ret = json_read_s64(o, "cacheMinFree", 0, 99, &r->cache_min_free,
				    err, errlen);
	if (!ret)
		ret = json_read_bool(o, "suid", &r->suid, err, errlen);
	if (!ret)
		ret = json_read_bool(o, "dev", &r->dev, err, errlen);
	if (!ret)
		ret = json_read_object(o, "fetch", &f, err, errlen);
	if (!ret)
		ret = fetch_parse(f, &r->fetch, err, errlen);
	return ret;
}

int ctl_mount_req_parse(struct json_object *o, struct ctl_mount_req *r,
			char *err, size_t errlen)
{
	return mount_req_parse(o, r, false, err, errlen);
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
	ok = json_add_str(o, "op", op_names[CTL_OP_UMOUNT]);
	ok &= json_add_str(o, "mountpoint", r->mountpoint);
	ok &= json_add(o, "lazy", json_object_new_boolean(r->lazy));
	if (r->release)
		ok &= json_add(o, "release", json_object_new_boolean(true));
	return json_done(o, ok);
}

int ctl_umount_req_parse(struct json_object *o, struct ctl_umount_req *r,
			 char *err, size_t errlen)
{
	int ret;

	memset(r, 0, sizeof(*r));
	ret = json_read_abspath(o, "mountpoint", &r->mountpoint, err, errlen);
	if (!ret)
		ret = json_read_bool(o, "lazy", &r->lazy, err, errlen);
	if (!ret)
		ret = json_read_bool(o, "release", &r->release, err, errlen);
	return ret;
}

struct json_object *ctl_op_req_to_json(enum ctl_op op)
{
	struct json_object *o = json_object_new_object();

	return o ? json_done(o, json_add_str(o, "op", op_names[op])) : NULL;
}

int ctl_request_parse(struct json_object *o, struct ctl_request *req,
		      char *err, size_t errlen)
{
	const char *op = NULL;
	char why[1024] = "";
	int ret;

	memset(req, 0, sizeof(*req));
	ret = json_read_str(o, "op", 64, true, &op, err, errlen);
	if (ret)
		return json_bad(err, errlen, "request without \"op\"");
	for (req->op = CTL_OP_MOUNT; req->op <= CTL_OP_PROBE; req->op++)
		if (!strcmp(op, op_names[req->op]))
			break;
	switch (req->op) {
	case CTL_OP_MOUNT:
	case CTL_OP_PROBE:
		ret = mount_req_parse(o, &req->mount, req->op == CTL_OP_PROBE, why,
				      sizeof(why));
		break;
	case CTL_OP_UMOUNT:
		ret = ctl_umount_req_parse(o, &req->umount, why, sizeof(why));
		break;
	case CTL_OP_LIST:
	case CTL_OP_PING:
	case CTL_OP_SHUTDOWN:
	case CTL_OP_METRICS:
	case CTL_OP_UPGRADE:
		return 0;
	default:
		return json_bad(err, errlen, "unknown op \"%s\"", op);
	}
	if (ret)
		snprintf(err, errlen, "invalid %s request: %s", op,
			 why[0] ? why : strerror(-ret));
	return ret;
}

void ctl_request_free(struct ctl_request *req)
{
	if (req->op == CTL_OP_MOUNT || req->op == CTL_OP_PROBE)
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
	ok = json_add(o, "ok", json_object_new_boolean(!r->err));
	if (r->err) {
		ok &= json_add_str(o, "error", r->error ?: strerror(-r->err));
		ok &= json_add(o, "errno", json_object_new_int(r->err < 0 ? -r->err : r->err));
	}
	return json_done(o, ok);
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
	if (!json_field(o, "ok"))
		return proto(json_bad(err, errlen, "\"ok\" is required"));
	ret = json_read_bool(o, "ok", &ok, err, errlen);
	if (ret || ok)
		return proto(ret);
	ret = json_read_str(o, "error", CTL_MSG_MAX, true, &r->error, err, errlen);
	if (!ret)
		ret = json_read_s64(o, "errno", 1, 4095, &e, err, errlen);
	if (!ret && !e)
		ret = json_bad(err, errlen, "\"errno\" is required");
	r->err = -(int)e;
	return proto(ret);
}

/* An answer's "ok": it must be true for the answers that say more. */
static int want_ok(struct json_object *o, char *err, size_t errlen)
{
	bool ok = false;
	int ret = json_read_bool(o, "ok", &ok, err, errlen);

	if (!ret && !ok)
		ret = json_bad(err, errlen, "\"ok\": expected true");
	return ret;
}

struct json_object *ctl_mount_reply_to_json(const struct ctl_mount_reply *r)
{
	struct json_object *o = ctl_reply_to_json(&(struct ctl_reply){ 0 });
	bool ok;

	if (!o)
		return NULL;
	ok = json_add(o, "pid", json_object_new_int(r->pid));
	if (r->image_digest[0])
		ok &= json_add_str(o, "imageDigest", r->image_digest);
	if (r->bootstrap_digest[0])
		ok &= json_add_str(o, "bootstrapDigest", r->bootstrap_digest);
	return json_done(o, ok);
}

struct json_object *ctl_probe_reply_to_json(const struct ctl_probe_reply *r)
{
	struct json_object *o = ctl_reply_to_json(&(struct ctl_reply){ 0 });
	bool ok = true;

	if (!o)
		return NULL;
	if (r->image_digest[0])
		ok &= json_add_str(o, "imageDigest", r->image_digest);
	if (r->bootstrap_digest[0])
		ok &= json_add_str(o, "bootstrapDigest", r->bootstrap_digest);
	if (r->index_digest[0]) {
		ok &= json_add_str(o, "indexDigest", r->index_digest);
		ok &= json_add(o, "layers", json_digest_array(r->layers, r->nr_layers));
		ok &= json_add(o, "diffIds", json_digest_array(r->diff_ids, r->nr_layers));
	}
	return json_done(o, ok);
}

/* An optional "sha256:<hex>" field into @out ("" when absent). */
static int get_digest(struct json_object *o, const char *key,
		      char out[DIGEST_STRING_SIZE], char *err, size_t errlen)
{
	const char *s = NULL;
	int ret = json_read_str(o, key, DIGEST_STRING_SIZE - 1, false, &s, err, errlen);

	if (!ret && s && digest_parse(s, (uint8_t[32]){ 0 }))
		return json_bad(err, errlen, "\"%s\" is not a sha256 digest", key);
	if (!ret && s)
		snprintf(out, DIGEST_STRING_SIZE, "%s", s);
	return ret;
}

int ctl_mount_reply_parse(struct json_object *o, struct ctl_mount_reply *r,
			  char *err, size_t errlen)
{
	int ret = want_ok(o, err, errlen);

	memset(r, 0, sizeof(*r));
	if (!ret)
		ret = get_pid(o, "pid", true, &r->pid, err, errlen);
	if (!ret)
		ret = get_digest(o, "imageDigest", r->image_digest, err, errlen);
	if (!ret)
		ret = get_digest(o, "bootstrapDigest", r->bootstrap_digest, err, errlen);
	return proto(ret);
}

static bool add_u64(struct json_object *o, const char *key, uint64_t v)
{
	return json_add(o, key, json_object_new_uint64(v));
}

static bool add_ping(struct json_object *o, const struct ctl_ping_reply *r)
{
	bool ok = json_add(o, "pid", json_object_new_int(r->pid));

	ok &= json_add_str(o, "version", r->version);
	ok &= json_add_str(o, "socket", r->socket);
	ok &= json_add(o, "startedAt", json_object_new_int64(r->started_at));
	ok &= add_u64(o, "rssBytes", r->rss_bytes);
	ok &= add_u64(o, "peakRssBytes", r->peak_rss_bytes);
	ok &= add_u64(o, "idleTimeout", r->idle_timeout);
	ok &= json_add(o, "socketActivated", json_object_new_boolean(r->socket_activated));
	return ok;
}

struct json_object *ctl_ping_reply_to_json(const struct ctl_ping_reply *r)
{
	struct json_object *o = ctl_reply_to_json(&(struct ctl_reply){ 0 });

	return o ? json_done(o, add_ping(o, r)) : NULL;
}

static int parse_ping(struct json_object *o, struct ctl_ping_reply *r, char *err,
		      size_t errlen)
{
	int ret = want_ok(o, err, errlen);
	uint64_t idle = 0;

	memset(r, 0, sizeof(*r));
	if (!ret)
		ret = get_pid(o, "pid", true, &r->pid, err, errlen);
	if (!ret)
		ret = json_read_copy(o, "version", r->version, sizeof(r->version), err, errlen);
	if (!ret)
		ret = json_read_copy(o, "socket", r->socket, sizeof(r->socket), err, errlen);
	if (!ret)
		ret = json_read_s64(o, "startedAt", 0, INT64_MAX, &r->started_at, err, errlen);
	if (!ret)
		ret = json_read_u64(o, "rssBytes", UINT64_MAX, &r->rss_bytes, err, errlen);
	if (!ret)
		ret = json_read_u64(o, "peakRssBytes", UINT64_MAX, &r->peak_rss_bytes,
				    err, errlen);
	if (!ret)
		ret = json_read_u64(o, "idleTimeout", UINT_MAX, &idle, err, errlen);
	r->idle_timeout = (unsigned int)idle;
	if (!ret)
		ret = json_read_bool(o, "socketActivated", &r->socket_activated, err, errlen);
	return ret;
}

int ctl_ping_reply_parse(struct json_object *o, struct ctl_ping_reply *r,
			 char *err, size_t errlen)
{
	return proto(parse_ping(o, r, err, errlen));
}

struct json_object *ctl_mount_stats_to_json(const struct ctl_mount_stats *m)
{
	struct json_object *o = json_object_new_object(), *a;
	char secs[32];
	size_t i;
	bool ok;

	if (!o)
		return NULL;
	ok = json_add_str(o, "mountpoint", m->mountpoint);
	ok &= json_add_str(o, "image", m->image);
	ok &= json_add_str(o, "cacheDir", m->cache_dir);
	ok &= json_add_str(o, "mode", m->mode);
	if (m->keeper_pid)
		ok &= json_add(o, "keeperPid", json_object_new_int(m->keeper_pid));
	ok &= json_add(o, "suid", json_object_new_boolean(m->suid));
	ok &= json_add(o, "dev", json_object_new_boolean(m->dev));
	if (m->domain[0])
		ok &= json_add_str(o, "domain", m->domain);
	if (m->mode_reason[0])
		ok &= json_add_str(o, "modeReason", m->mode_reason);
	ok &= json_add_str(o, "state", m->state);
	ok &= json_add(o, "mountedAt", json_object_new_int64(m->mounted_at));
	ok &= add_u64(o, "bytesRead", m->bytes_read);
	ok &= add_u64(o, "bytesFetched", m->bytes_fetched);
	ok &= add_u64(o, "bytesPrefetched", m->bytes_prefetched);
	ok &= add_u64(o, "chunksPresent", m->chunks_present);
	ok &= add_u64(o, "chunksTotal", m->chunks_total);
	ok &= add_u64(o, "bytesPresent", m->bytes_present);
	ok &= add_u64(o, "bytesEvicted", m->bytes_evicted);
	ok &= json_add_str(o, "prefetch", m->prefetch);
	ok &= add_u64(o, "prefetchFiles", m->prefetch_files);
	ok &= add_u64(o, "readaheadFiles", m->readahead_files);
	ok &= add_u64(o, "readaheadBytes", m->readahead_bytes);
	ok &= add_u64(o, "fetches", m->fetches);
	ok &= add_u64(o, "fetchesAhead", m->fetches_ahead);
	ok &= add_u64(o, "bytesAhead", m->bytes_ahead);
	ok &= add_u64(o, "programsRecorded", m->programs_recorded);
	ok &= add_u64(o, "programsRead", m->programs_read);
	ok &= add_u64(o, "modulesRead", m->modules_read);
	/* Milliseconds as seconds, written with exactly three decimals. */
	snprintf(secs, sizeof(secs), "%llu.%03llu", (unsigned long long)(m->prefetch_ms / 1000),
		 (unsigned long long)(m->prefetch_ms % 1000));
	ok &= json_add(o, "prefetchSeconds", json_object_new_double_s((double)m->prefetch_ms / 1e3,
								 secs));
	ok &= add_u64(o, "cacheHits", m->hits);
	ok &= add_u64(o, "cacheMisses", m->misses);
	ok &= add_u64(o, "fetchErrors", m->fetch_errors);
	ok &= add_u64(o, "inFlight", m->inflight);
	ok &= add_u64(o, "missNanoseconds", m->miss_ns_total);
	ok &= add_u64(o, "registryRequests", m->requests);
	ok &= add_u64(o, "registryRetries", m->retries);
	a = json_object_new_array_ext(IMAGE_LATENCY_BUCKETS);
	for (i = 0; a && i < IMAGE_LATENCY_BUCKETS; i++)
		if (json_object_array_add(a, json_object_new_uint64(m->miss_ms[i]))) {
			json_object_put(a);
			a = NULL;
		}
	ok &= json_add(o, "missLatencyMs", a);
	return json_done(o, ok);
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
		C("bytesEvicted", bytes_evicted),
		C("prefetchFiles", prefetch_files), C("readaheadFiles", readahead_files),
		C("readaheadBytes", readahead_bytes), C("cacheHits", hits),
		C("cacheMisses", misses), C("fetchErrors", fetch_errors), C("inFlight", inflight),
		C("missNanoseconds", miss_ns_total), C("registryRequests", requests),
		C("registryRetries", retries), C("fetches", fetches),
		C("fetchesAhead", fetches_ahead), C("bytesAhead", bytes_ahead),
		C("programsRecorded", programs_recorded), C("programsRead", programs_read),
		C("modulesRead", modules_read),
#undef C
	};
	struct json_object *v;
	double secs;
	size_t i;
	int ret;

	if (!json_object_is_type(o, json_type_object))
		return json_bad(err, errlen, "expected an object");
	ret = json_read_strdup(o, "mountpoint", PATH_MAX - 1, &m->mountpoint, err, errlen);
	if (!ret)
		ret = json_read_strdup(o, "image", 4096, &m->image, err, errlen);
	if (!ret)
		ret = json_read_strdup(o, "cacheDir", PATH_MAX - 1, &m->cache_dir, err, errlen);
	if (!ret)
		ret = get_token_copy(o, "mode", m->mode, err, errlen);
	if (!ret)
		ret = get_token_copy(o, "state", m->state, err, errlen);
	if (!ret)
		ret = get_token_copy(o, "prefetch", m->prefetch, err, errlen);
	if (!ret)
		ret = get_pid(o, "keeperPid", false, &m->keeper_pid, err, errlen);
	if (!ret && json_field(o, "domain"))
		ret = json_read_copy(o, "domain", m->domain, sizeof(m->domain), err, errlen);
	if (!ret && json_field(o, "modeReason"))
		ret = json_read_copy(o, "modeReason", m->mode_reason, sizeof(m->mode_reason),
				     err, errlen);
	if (!ret)
		ret = json_read_bool(o, "suid", &m->suid, err, errlen);
	if (!ret)
		ret = json_read_bool(o, "dev", &m->dev, err, errlen);
	if (!ret)
		ret = json_read_s64(o, "mountedAt", INT64_MIN, INT64_MAX,
				    &m->mounted_at, err, errlen);
	for (i = 0; !ret && i < ARRAY_SIZE(counters); i++)
		ret = json_read_u64(o, counters[i].key, UINT64_MAX,
				    (uint64_t *)((char *)m + counters[i].off),
				    err, errlen);
	v = json_field(o, "prefetchSeconds");
	if (!ret && v) {
		secs = json_object_get_double(v);
		/* NaN fails both comparisons. */
		if ((!json_object_is_type(v, json_type_double) &&
		     !json_object_is_type(v, json_type_int)) || !(secs >= 0 && secs < 1e12))
			return json_bad(err, errlen, "\"prefetchSeconds\": expected a number of seconds");
		m->prefetch_ms = (uint64_t)(secs * 1e3 + 0.5);
	}
	v = json_field(o, "missLatencyMs");
	if (!ret && v && (!json_object_is_type(v, json_type_array) ||
			  json_object_array_length(v) != IMAGE_LATENCY_BUCKETS))
		return json_bad(err, errlen, "\"missLatencyMs\": expected %u counts",
				IMAGE_LATENCY_BUCKETS);
	for (i = 0; !ret && v && i < IMAGE_LATENCY_BUCKETS; i++) {
		struct json_object *n = json_object_array_get_idx(v, i);

		if (!json_object_is_type(n, json_type_int) || json_object_get_int64(n) < 0)
			return json_bad(err, errlen, "\"missLatencyMs\"[%zu]: expected a count", i);
		m->miss_ms[i] = json_object_get_uint64(n);
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
	ok &= json_add(o, "mounts", a);
	return json_done(o, ok);
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
	a = json_field(o, "mounts");
	if (!a || !json_object_is_type(a, json_type_array) ||
	    json_object_array_length(a) > CTL_MOUNTS_MAX)
		return proto(json_bad(err, errlen, "\"mounts\": expected an array of at most %u mounts",
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
			return proto(ret == -EINVAL ? json_bad(err, errlen, "\"mounts\"[%zu]: %s", i, why) :
						      ret);
	}
	return 0;
}

struct json_object *ctl_metrics_reply_to_json(const char *text)
{
	struct json_object *o = ctl_reply_to_json(&(struct ctl_reply){ 0 });

	return o ? json_done(o, json_add_str(o, "text", text)) : NULL;
}

int ctl_metrics_reply_parse(struct json_object *o, const char **text,
			    char *err, size_t errlen)
{
	int ret = want_ok(o, err, errlen);

	*text = NULL;
	if (!ret)
		ret = json_read_str(o, "text", CTL_LINE_MAX, true, text, err, errlen);
	return proto(ret);
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
