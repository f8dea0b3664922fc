// SPDX-License-Identifier: MIT
/*
 * The ferry <-> ferryd control protocol (cmd/ctl.c): every message
 * encoded, sent over the wire format and parsed back equal; the registry
 * option table against struct fetch_opts and ferry's options; parsers
 * rejecting wrong types, out-of-range values, oversized lists and missing
 * required fields.
 */
#include <errno.h>
#include <getopt.h>
#include <stddef.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../cmd/ctl.h"
#include "../../cmd/ferry/cmd.h"
#include "../../pkg-base/base.h"
#include "../test.h"

/* @o as one wire line, parsed back. */
static struct json_object *wire(struct json_object *o)
{
	const char *text;
	struct json_object *back = NULL;

	if (!o)
		return NULL;
	text = json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN |
					      JSON_C_TO_STRING_NOSLASHESCAPE);
	if (json_parse_object(text, strlen(text), &back))
		back = NULL;
	json_object_put(o);
	return back;
}

static struct json_object *text_json(const char *text)
{
	struct json_object *o = NULL;

	return json_parse_object(text, strlen(text), &o) ? NULL : o;
}

static bool str_eq(const char *a, const char *b)
{
	return (!a && !b) || (a && b && !strcmp(a, b));
}

static size_t list_len(const char *const *l)
{
	size_t n = 0;

	while (l && l[n])
		n++;
	return n;
}

static bool list_eq(const char *const *a, const char *const *b)
{
	size_t i, n = list_len(a);

	if (n != list_len(b))
		return false;
	for (i = 0; i < n; i++)
		if (strcmp(a[i], b[i]))
			return false;
	return true;
}

static bool host_eq(const struct fetch_host *a, const struct fetch_host *b)
{
	return str_eq(a->registry, b->registry) && str_eq(a->url, b->url) &&
	       a->capabilities == b->capabilities && a->server == b->server &&
	       a->skip_verify == b->skip_verify &&
	       a->override_path == b->override_path &&
	       list_eq(a->ca_files, b->ca_files) &&
	       str_eq(a->client_cert, b->client_cert) &&
	       str_eq(a->client_key, b->client_key) &&
	       list_eq(a->headers, b->headers);
}

static size_t hosts_len(const struct fetch_host *const *l)
{
	size_t n = 0;

	while (l && l[n])
		n++;
	return n;
}

static bool hosts_eq(const struct fetch_host *const *a,
		     const struct fetch_host *const *b)
{
	size_t i, n = hosts_len(a);

	if (n != hosts_len(b))
		return false;
	for (i = 0; i < n; i++)
		if (!host_eq(a[i], b[i]))
			return false;
	return true;
}

static const void *opt_ptr(const struct fetch_opts *f, const struct ctl_fetch_opt *o)
{
	return (const char *)f + o->offset;
}

/* Field @o of @a and @b equal. */
static bool opt_eq(const struct fetch_opts *a, const struct fetch_opts *b,
		   const struct ctl_fetch_opt *o)
{
	const void *x = opt_ptr(a, o), *y = opt_ptr(b, o);

	switch (o->type) {
	case CTL_OPT_STR:
		return str_eq(*(const char *const *)x, *(const char *const *)y);
	case CTL_OPT_BOOL:
		return *(const bool *)x == *(const bool *)y;
	case CTL_OPT_UINT:
		return *(const unsigned int *)x == *(const unsigned int *)y;
	case CTL_OPT_STRS:
		return list_eq(*(const char *const *const *)x, *(const char *const *const *)y);
	case CTL_OPT_HOSTS:
		return hosts_eq(*(const struct fetch_host *const *const *)x,
				*(const struct fetch_host *const *const *)y);
	}
	return false;
}

/* Field @o of @f differs from fetch_opts_init's (an empty list counts as unset). */
static bool opt_set(const struct fetch_opts *f, const struct ctl_fetch_opt *o)
{
	struct fetch_opts def;

	fetch_opts_init(&def);
	if (o->type == CTL_OPT_STRS)
		return list_len(*(const char *const *const *)opt_ptr(f, o)) > 0;
	if (o->type == CTL_OPT_HOSTS)
		return hosts_len(*(const struct fetch_host *const *const *)opt_ptr(f, o)) > 0;
	return !opt_eq(f, &def, o);
}

static const char *const insecure[] = { "reg.example:5000", "10.0.0.1", NULL };
static const char *const host_ca[] = { "/etc/certs.d/reg.example/ca.crt",
				       "/etc/certs.d/ca2.pem", NULL };
static const char *const host_headers[] = { "X-Ferry: yes", "X-Other: a b", NULL };
static const struct fetch_host mirror_host = {
	.registry = "reg.example",
	.url = "https://mirror.example:5000/cache",
	.capabilities = FETCH_HOST_PULL | FETCH_HOST_RESOLVE,
	.skip_verify = true,
	.override_path = true,
	.ca_files = host_ca,
	.client_cert = "/etc/certs.d/client.cert",
	.client_key = "/etc/certs.d/client.key",
	.headers = host_headers,
};
static const struct fetch_host server_host = {
	.registry = "docker.io",
	.url = "http://127.0.0.1:9",
	.server = true,
};
static const struct fetch_host *const hosts[] = { &mirror_host, &server_host, NULL };
static const char *const resolve[] = { "reg.example:443:127.0.0.1",
				       "other.example:80:[::1],127.0.0.2", NULL };

/* Every field of struct fetch_opts away from its default. */
static void fetch_all_set(struct fetch_opts *f)
{
	fetch_opts_init(f);
	f->creds = "alice:s3cret:with:colons";
	f->authfile = "/etc/ferry/auth.json";
	f->tls_verify = false;
	f->ca_file = "/etc/ferry/ca.pem";
	f->insecure = insecure;
	f->hosts = hosts;
	f->resolve = resolve;
	f->connect_timeout_ms = 1234;
	f->stall_timeout_ms = 4321;
	f->request_timeout_ms = 5678;
	f->retries = 9;
	f->user_agent = "test/1";
}

/* A mount request carrying @f, through the wire and ctl_request_parse. */
static int mount_roundtrip(const struct fetch_opts *f, struct ctl_request *req)
{
	struct ctl_mount_req r;
	struct json_object *o;
	char err[256] = "";
	int ret;

	ctl_mount_req_init(&r);
	r.image = "docker://reg.example/a/b:1";
	r.mountpoint = "/mnt/x";
	r.cache_dir = "/var/cache/ferry";
	r.fetch = *f;
	o = wire(ctl_mount_req_to_json(&r));
	if (!o)
		return -ENOMEM;
	ret = ctl_request_parse(o, req, err, sizeof(err));
	if (ret)
		fprintf(stderr, "  parse: %s\n", err);
	json_object_put(o);
	return ret;
}

static void test_fetch_opts_roundtrip(void)
{
	const struct ctl_fetch_opt *o;
	struct ctl_request req;
	struct fetch_opts f;
	const struct fetch_opts *g;

	fetch_all_set(&f);
	CHECK_EQ(mount_roundtrip(&f, &req), 0);
	CHECK_EQ(req.op, CTL_OP_MOUNT);
	g = &req.mount.fetch;
	/* Each field by name, so that a row dropped from the table fails. */
	CHECK(str_eq(g->creds, f.creds));
	CHECK(str_eq(g->authfile, f.authfile));
	CHECK(!g->tls_verify);
	CHECK(str_eq(g->ca_file, f.ca_file));
	CHECK(list_eq(g->insecure, insecure));
	CHECK(hosts_eq(g->hosts, hosts));
	CHECK(list_eq(g->resolve, resolve));
	CHECK_EQ(g->stall_timeout_ms, 4321);
	CHECK_EQ(g->request_timeout_ms, 5678);
	CHECK_EQ(g->retries, 9);
	/* Not carried: ferryd's own. */
	CHECK_EQ(g->connect_timeout_ms, 0);
	CHECK(!g->user_agent);
	/* And every row of the table: set by fetch_all_set, carried. */
	for (o = ctl_fetch_opts; o < ctl_fetch_opts + CTL_NR_FETCH_OPTS; o++) {
		if (!opt_set(&f, o) || !opt_eq(&f, g, o)) {
			fprintf(stderr, "  fetch option \"%s\" not round-tripped\n", o->key);
			CHECK(0);
		}
	}
	ctl_request_free(&req);

	/* Defaults: absent fields parse as fetch_opts_init, lists empty. */
	fetch_opts_init(&f);
	CHECK_EQ(mount_roundtrip(&f, &req), 0);
	CHECK(req.mount.fetch.tls_verify);
	for (o = ctl_fetch_opts; o < ctl_fetch_opts + CTL_NR_FETCH_OPTS; o++) {
		CHECK(!opt_set(&req.mount.fetch, o));
		if (o->type == CTL_OPT_STRS)
			CHECK(*(const char *const *const *)opt_ptr(&req.mount.fetch, o));
	}
	ctl_request_free(&req);
}

/* The table names fields of struct fetch_opts once each, sensibly. */
static void test_fetch_table(void)
{
	const struct ctl_fetch_opt *o, *p;

	for (o = ctl_fetch_opts; o < ctl_fetch_opts + CTL_NR_FETCH_OPTS; o++) {
		CHECK(o->key && o->option);
		CHECK(o->offset < sizeof(struct fetch_opts));
		CHECK(o->type == CTL_OPT_BOOL || o->max > 0);
		CHECK(o->type != CTL_OPT_STRS || o->max_items > 0);
		CHECK(o->offset != offsetof(struct fetch_opts, connect_timeout_ms));
		CHECK(o->offset != offsetof(struct fetch_opts, user_agent));
		for (p = ctl_fetch_opts; p < o; p++)
			CHECK(p->offset != o->offset && strcmp(p->key, o->key) &&
			      strcmp(p->option, o->option));
	}
}

static const struct option regopts[] = { REGISTRY_LONGOPTS, { 0 } };

/* Options that fill a field another option's row carries: regopts_finish
 * reads these into fetch.creds ("creds"); --registry-mirror adds to
 * fetch.hosts ("hosts", as --registry-hosts does). */
static bool feeds_another_row(const char *option)
{
	return !strcmp(option, "creds-file") || !strcmp(option, "username") ||
	       !strcmp(option, "password-stdin") || !strcmp(option, "registry-mirror");
}

/* ferry's registry options and the table name the same options. */
static void test_fetch_table_matches_cli(void)
{
	const struct ctl_fetch_opt *o;
	const struct option *l;
	char flag[64];
	size_t n = 0;

	for (l = regopts; l->name; l++) {
		if (feeds_another_row(l->name))
			continue;
		n++;
		for (o = ctl_fetch_opts; o < ctl_fetch_opts + CTL_NR_FETCH_OPTS; o++)
			if (!strcmp(o->option, l->name))
				break;
		if (o == ctl_fetch_opts + CTL_NR_FETCH_OPTS) {
			fprintf(stderr, "  --%s has no row in ctl_fetch_opts\n", l->name);
			CHECK(0);
		}
	}
	CHECK_EQ(n, CTL_NR_FETCH_OPTS);
	for (o = ctl_fetch_opts; o < ctl_fetch_opts + CTL_NR_FETCH_OPTS; o++) {
		snprintf(flag, sizeof(flag), "--%s", o->option);
		if (!strstr(REGISTRY_OPTIONS_HELP, flag)) {
			fprintf(stderr, "  %s is not in REGISTRY_OPTIONS_HELP\n", flag);
			CHECK(0);
		}
	}
}

/* Every registry option as ferry parses it reaches the parsed request. */
static void test_cli_options_reach_request(void)
{
	static const struct {
		const char *name, *arg;
	} args[] = {
		{ "creds", "bob:pw" },
		{ "authfile", "/root/auth.json" },
		{ "tls-verify", "false" },
		{ "ca-file", "/root/ca.pem" },
		{ "insecure-registry", "a.example:5000" },
		{ "insecure-registry", "b.example" },
		{ "registry-mirror", "a.example:5000=http://127.0.0.1:1" },
		{ "resolve", "a.example:5000:127.0.0.1" },
		{ "retries", "3" },
		{ "stall-timeout", "7" },
		{ "request-timeout", "11" },
	};
	const struct ctl_fetch_opt *o;
	const struct option *l;
	struct ctl_request req;
	struct regopts ro;
	size_t i;

	regopts_init(&ro);
	for (i = 0; i < ARRAY_SIZE(args); i++) {
		for (l = regopts; l->name && strcmp(l->name, args[i].name); l++)
			;
		CHECK(l->name);
		if (l->name)
			CHECK_EQ(regopts_parse(&ro, l->val, args[i].arg), 1);
	}
	CHECK_EQ(ro.fetch.stall_timeout_ms, 7000);
	CHECK_EQ(ro.fetch.request_timeout_ms, 11000);
	CHECK_EQ(mount_roundtrip(&ro.fetch, &req), 0);
	for (o = ctl_fetch_opts; o < ctl_fetch_opts + CTL_NR_FETCH_OPTS; o++) {
		if (!opt_set(&ro.fetch, o))
			fprintf(stderr, "  --%s not exercised\n", o->option);
		if (!opt_eq(&ro.fetch, &req.mount.fetch, o))
			fprintf(stderr, "  --%s (\"%s\") lost on the way\n", o->option, o->key);
		CHECK(opt_set(&ro.fetch, o) && opt_eq(&ro.fetch, &req.mount.fetch, o));
	}
	ctl_request_free(&req);
}

/* ferry option @name (no "--") with @arg, as getopt hands it over. */
static int regopt(struct regopts *ro, const char *name, const char *arg)
{
	const struct option *l;

	for (l = regopts; l->name && strcmp(l->name, name); l++)
		;
	return l->name ? regopts_parse(ro, l->val, arg) : -ENOENT;
}

/* Credentials from a file or stdin reach the request; combinations. */
static void test_cli_creds_sources(void)
{
	char path[] = "/tmp/ferry-test-ctl-creds.XXXXXX";
	struct ctl_request req;
	struct regopts ro;
	int fd = mkstemp(path), p[2], in;

	CHECK(fd >= 0 && write_full(fd, "carol:file-pw\n", 14) == 0);
	close(fd);
	regopts_init(&ro);
	CHECK_EQ(regopt(&ro, "creds-file", path), 1);
	CHECK_EQ(regopts_finish(&ro), EXIT_OK);
	CHECK(str_eq(ro.fetch.creds, "carol:file-pw"));
	CHECK_EQ(mount_roundtrip(&ro.fetch, &req), 0);
	CHECK(str_eq(req.mount.fetch.creds, "carol:file-pw"));
	ctl_request_free(&req);
	CHECK_EQ(chmod(path, 0644), 0);
	regopts_init(&ro);
	CHECK_EQ(regopt(&ro, "creds-file", path), 1);
	CHECK_EQ(regopts_finish(&ro), EXIT_FAIL);
	unlink(path);

	/* --password-stdin with --username, or with --creds USER. */
	in = dup(STDIN_FILENO);
	CHECK(in >= 0 && !pipe(p) && write_full(p[1], "stdin-pw\n", 9) == 0);
	close(p[1]);
	CHECK(dup2(p[0], STDIN_FILENO) == STDIN_FILENO);
	close(p[0]);
	regopts_init(&ro);
	CHECK_EQ(regopt(&ro, "password-stdin", NULL), 1);
	CHECK_EQ(regopt(&ro, "creds", "dave"), 1);
	CHECK_EQ(regopts_finish(&ro), EXIT_OK);
	CHECK(str_eq(ro.fetch.creds, "dave:stdin-pw"));
	dup2(in, STDIN_FILENO);
	close(in);

	/* One source only; a bare user needs --password-stdin. */
	regopts_init(&ro);
	CHECK_EQ(regopt(&ro, "creds", "dave"), 1);
	CHECK_EQ(regopts_finish(&ro), EXIT_USAGE);
	regopts_init(&ro);
	CHECK_EQ(regopt(&ro, "username", "dave"), 1);
	CHECK_EQ(regopts_finish(&ro), EXIT_USAGE);
	regopts_init(&ro);
	CHECK_EQ(regopt(&ro, "password-stdin", NULL), 1);
	CHECK_EQ(regopts_finish(&ro), EXIT_USAGE);
	CHECK_EQ(regopt(&ro, "creds", "dave:pw"), 1);
	CHECK_EQ(regopts_finish(&ro), EXIT_USAGE);
	regopts_init(&ro);
	CHECK_EQ(regopt(&ro, "creds-file", "/x"), 1);
	CHECK_EQ(regopt(&ro, "creds", "dave:pw"), 1);
	CHECK_EQ(regopts_finish(&ro), EXIT_USAGE);
	regopts_init(&ro);
	CHECK_EQ(regopt(&ro, "creds", "dave:pw"), 1);
	CHECK_EQ(regopts_finish(&ro), EXIT_OK);
	CHECK(str_eq(ro.fetch.creds, "dave:pw"));
}

/* A sha256 hex digest of 64 copies of the character C. */
#define D64(c) c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c \
	c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c

static void test_mount_req_roundtrip(void)
{
	static const char *files[] = { "/usr/bin/perl", "/etc/os-release" };
	struct ctl_mount_req r, *p;
	struct ctl_request req;
	struct json_object *o;
	char err[256];

	ctl_mount_req_init(&r);
	r.image = "oci:/srv/img:v1";
	r.mountpoint = "/mnt/with space";
	r.cache_dir = "/cache";
	r.prefetch_files = files;
	r.nr_prefetch_files = 2;
	r.prefetch_all = true;
	r.mode = "cachefiles";
	r.domain = "dom.1_a-b";
	r.prefetch_bwlimit = 10u << 20;
	r.cache_max_size = 3ull << 30;
	r.cache_min_free = 0;
	r.suid = true;
	r.image_digest = "sha256:" D64("1");
	r.index_digest = "sha256:" D64("2");
	o = wire(ctl_mount_req_to_json(&r));
	CHECK(o);
	CHECK_EQ(ctl_request_parse(o, &req, err, sizeof(err)), 0);
	json_object_put(o); /* the request holds its own reference */
	p = &req.mount;
	CHECK_EQ(req.op, CTL_OP_MOUNT);
	CHECK(str_eq(p->image, r.image) && str_eq(p->mountpoint, r.mountpoint) &&
	      str_eq(p->cache_dir, r.cache_dir) && str_eq(p->mode, "cachefiles") &&
	      str_eq(p->domain, "dom.1_a-b"));
	CHECK_EQ(p->nr_prefetch_files, 2);
	CHECK(p->nr_prefetch_files == 2 && !strcmp(p->prefetch_files[1], files[1]) &&
	      !p->prefetch_files[2]);
	CHECK(p->prefetch_all);
	CHECK_EQ(p->prefetch_bwlimit, 10u << 20);
	CHECK_EQ(p->cache_max_size, 3ull << 30);
	CHECK_EQ(p->cache_min_free, 0); /* 0 is sent: it turns the floor off */
	CHECK(p->suid && !p->dev);
	CHECK(str_eq(p->image_digest, r.image_digest) && str_eq(p->index_digest, r.index_digest));
	ctl_request_free(&req);

	/* The mode defaults to fuse; any short lowercase name passes. */
	o = text_json("{\"op\":\"mount\",\"image\":\"dir:/a\",\"mountpoint\":\"/m\",\"cacheDir\":\"/c\"}");
	CHECK_EQ(ctl_request_parse(o, &req, err, sizeof(err)), 0);
	CHECK(str_eq(req.mount.mode, "fuse"));
	CHECK(!req.mount.prefetch_all && !req.mount.nr_prefetch_files && !req.mount.domain);
	/* No limits given: ferryd's own. */
	CHECK(!req.mount.cache_max_size && req.mount.cache_min_free == -1);
	/* Untrusted unless the request says otherwise: nosuid,nodev. */
	CHECK(!req.mount.suid && !req.mount.dev);
	CHECK_EQ(image_mount_flags(req.mount.suid, req.mount.dev), MS_NOSUID | MS_NODEV);
	CHECK_EQ(image_mount_flags(true, true), 0);
	ctl_request_free(&req);
	json_object_put(o);
	o = text_json("{\"op\":\"mount\",\"image\":\"dir:/a\",\"mountpoint\":\"/m\",\"cacheDir\":\"/c\",\"mode\":\"erofs-ondemand_2\"}");
	CHECK_EQ(ctl_request_parse(o, &req, err, sizeof(err)), 0);
	CHECK(str_eq(req.mount.mode, "erofs-ondemand_2"));
	ctl_request_free(&req);
	json_object_put(o);
}

/*
 * A probe is a mount request without a mount point; its answer names an
 * indexed image's layers and the diff_ids its index records.
 */
static void test_probe(void)
{
	static const uint8_t layers[2][32] = { { 1 }, { 2 } }, ids[2][32] = { { 3 }, { 4 } };
	struct ctl_probe_reply rep = { .nr_layers = 2, .layers = layers, .diff_ids = ids };
	struct json_object *o, *a;
	struct ctl_request req;
	char err[256], d[DIGEST_STRING_SIZE];

	o = text_json("{\"op\":\"probe\",\"image\":\"docker://r.example/a:1\",\"cacheDir\":\"/c\","
		      "\"imageDigest\":\"sha256:" D64("1") "\"}");
	CHECK_EQ(ctl_request_parse(o, &req, err, sizeof(err)), 0);
	CHECK_EQ(req.op, CTL_OP_PROBE);
	CHECK(str_eq(req.mount.image, "docker://r.example/a:1") && !req.mount.mountpoint &&
	      str_eq(req.mount.image_digest, "sha256:" D64("1")) && !req.mount.index_digest);
	ctl_request_free(&req);
	json_object_put(o);
	o = text_json("{\"op\":\"probe\",\"image\":\"docker://r.example/a:1\",\"cacheDir\":\"/c\","
		      "\"indexDigest\":\"sha256:12\"}");
	CHECK_EQ(ctl_request_parse(o, &req, err, sizeof(err)), -EINVAL);
	CHECK(strstr(err, "indexDigest"));
	ctl_request_free(&req);
	json_object_put(o);

	/* An ordinary answer (no index) names no layers. */
	snprintf(rep.image_digest, sizeof(rep.image_digest), "sha256:%s", D64("a"));
	o = wire(ctl_probe_reply_to_json(&rep));
	CHECK(o && str_eq(json_get_string(o, "imageDigest"), rep.image_digest) &&
	      !json_field(o, "layers") && !json_field(o, "indexDigest"));
	json_object_put(o);
	snprintf(rep.index_digest, sizeof(rep.index_digest), "sha256:%s", D64("b"));
	o = wire(ctl_probe_reply_to_json(&rep));
	CHECK(o && str_eq(json_get_string(o, "indexDigest"), rep.index_digest));
	CHECK(json_object_object_get_ex(o, "diffIds", &a) && json_object_array_length(a) == 2);
	digest_format(ids[1], d);
	CHECK(str_eq(json_object_get_string(json_object_array_get_idx(a, 1)), d));
	CHECK(json_object_object_get_ex(o, "layers", &a) && json_object_array_length(a) == 2);
	digest_format(layers[0], d);
	CHECK(str_eq(json_object_get_string(json_object_array_get_idx(a, 0)), d));
	json_object_put(o);
}

static void test_other_requests_roundtrip(void)
{
	struct ctl_umount_req u = { .mountpoint = "/mnt/a b", .lazy = true, .release = true };
	struct ctl_request req;
	struct json_object *o;
	enum ctl_op op;
	char err[256];

	o = wire(ctl_umount_req_to_json(&u));
	CHECK_EQ(ctl_request_parse(o, &req, err, sizeof(err)), 0);
	CHECK_EQ(req.op, CTL_OP_UMOUNT);
	CHECK(str_eq(req.umount.mountpoint, u.mountpoint) && req.umount.lazy &&
	      req.umount.release);
	ctl_request_free(&req);
	json_object_put(o);
	for (op = CTL_OP_LIST; op <= CTL_OP_UPGRADE; op++) {
		o = wire(ctl_op_req_to_json(op));
		CHECK_EQ(ctl_request_parse(o, &req, err, sizeof(err)), 0);
		CHECK_EQ(req.op, op);
		ctl_request_free(&req);
		json_object_put(o);
	}
}

static void test_replies_roundtrip(void)
{
	struct ctl_mount_stats ms[2] = {
		{ .mountpoint = "/m/1", .image = "docker://r.example/a:1", .cache_dir = "/c",
		  .mode = "fanotify", .state = "mounted", .prefetch = "done", .keeper_pid = 4242,
		  .dev = true,
		  .domain = "shared", .mode_reason = "not fanotify: tmpfs; cachefiles: ok",
		  .mounted_at = 1700000000, .bytes_read = 1, .bytes_fetched = 2,
		  .bytes_prefetched = 3, .chunks_present = 4, .chunks_total = 5,
		  .bytes_present = 6, .bytes_evicted = 16, .prefetch_files = 7,
		  .readahead_files = 8, .readahead_bytes = UINT64_MAX, .prefetch_ms = 12345,
		  .hits = 9, .misses = 10, .fetch_errors = 11, .inflight = 12,
		  .miss_ns_total = 13,
		  .miss_ms = { 1, 0, 2, [IMAGE_LATENCY_BUCKETS - 1] = UINT64_MAX },
		  .requests = 14, .retries = 15 },
		{ .mountpoint = "/m/2", .image = "dir:/i", .cache_dir = "/c2", .mode = "fuse",
		  .state = "mounting", .prefetch = "none", .mounted_at = -1 },
	};
	struct ctl_list_reply lr = { .daemon = { .pid = 77, .version = "1.2.3",
						 .socket = "/run/ferry/ferryd.sock",
						 .started_at = 1700000001, .rss_bytes = 3 << 20,
						 .peak_rss_bytes = UINT64_MAX, .idle_timeout = 300,
						 .socket_activated = true },
				     .mounts = ms, .nr_mounts = 2 }, lb;
	struct ctl_mount_reply mr;
	struct ctl_ping_reply pr;
	struct ctl_reply st;
	struct json_object *o;
	char err[256];
	size_t i;

	o = wire(ctl_reply_to_json(&(struct ctl_reply){ 0 }));
	CHECK_EQ(ctl_reply_parse(o, &st, err, sizeof(err)), 0);
	CHECK_EQ(st.err, 0);
	json_object_put(o);
	o = wire(ctl_reply_to_json(&(struct ctl_reply){ .err = -EBUSY, .error = "busy!" }));
	CHECK_EQ(ctl_reply_parse(o, &st, err, sizeof(err)), 0);
	CHECK_EQ(st.err, -EBUSY);
	CHECK(str_eq(st.error, "busy!"));
	/* An error answer is no mount answer. */
	CHECK_EQ(ctl_mount_reply_parse(o, &mr, err, sizeof(err)), -EPROTO);
	json_object_put(o);

	o = wire(ctl_mount_reply_to_json(&(struct ctl_mount_reply){ .pid = 99 }));
	CHECK_EQ(ctl_reply_parse(o, &st, err, sizeof(err)), 0);
	CHECK_EQ(ctl_mount_reply_parse(o, &mr, err, sizeof(err)), 0);
	CHECK_EQ(mr.pid, 99);
	CHECK(!mr.image_digest[0] && !mr.bootstrap_digest[0]);
	json_object_put(o);
	/* What is mounted: the snapshotter checks it (docs/containerd.md). */
	o = wire(ctl_mount_reply_to_json(&(struct ctl_mount_reply){
		.pid = 98, .image_digest = "sha256:" "abababababababababababababababababababababababababababababababab",
		.bootstrap_digest = "sha256:" "cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd" }));
	CHECK_EQ(ctl_mount_reply_parse(o, &mr, err, sizeof(err)), 0);
	CHECK(mr.pid == 98 && str_eq(mr.image_digest, "sha256:" "abababababababababababababababababababababababababababababababab") &&
	      str_eq(mr.bootstrap_digest, "sha256:" "cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd"));
	json_object_put(o);

	o = wire(ctl_ping_reply_to_json(&lr.daemon));
	CHECK_EQ(ctl_ping_reply_parse(o, &pr, err, sizeof(err)), 0);
	CHECK(pr.pid == 77 && !strcmp(pr.version, "1.2.3") &&
	      !strcmp(pr.socket, "/run/ferry/ferryd.sock"));
	CHECK(pr.started_at == 1700000001 && pr.rss_bytes == 3 << 20 &&
	      pr.peak_rss_bytes == UINT64_MAX && pr.idle_timeout == 300 && pr.socket_activated);
	json_object_put(o);

	{
		const char *text;

		o = wire(ctl_metrics_reply_to_json("# TYPE a counter\na_total 1\n"));
		CHECK_EQ(ctl_metrics_reply_parse(o, &text, err, sizeof(err)), 0);
		CHECK(str_eq(text, "# TYPE a counter\na_total 1\n"));
		json_object_put(o);
		/* A list answer is no metrics answer. */
		o = wire(ctl_list_reply_to_json(&lr));
		CHECK_EQ(ctl_metrics_reply_parse(o, &text, err, sizeof(err)), -EPROTO);
		json_object_put(o);
	}

	o = wire(ctl_list_reply_to_json(&lr));
	CHECK_EQ(ctl_list_reply_parse(o, &lb, err, sizeof(err)), 0);
	json_object_put(o);
	CHECK(lb.daemon.pid == 77 && !strcmp(lb.daemon.socket, lr.daemon.socket));
	CHECK_EQ(lb.nr_mounts, 2);
	for (i = 0; i < 2 && lb.nr_mounts == 2; i++) {
		const struct ctl_mount_stats *a = &ms[i], *b = &lb.mounts[i];

		CHECK(!strcmp(a->mountpoint, b->mountpoint) && !strcmp(a->image, b->image) &&
		      !strcmp(a->cache_dir, b->cache_dir) && !strcmp(a->mode, b->mode) &&
		      !strcmp(a->state, b->state) && !strcmp(a->prefetch, b->prefetch));
		CHECK(a->keeper_pid == b->keeper_pid && a->mounted_at == b->mounted_at);
		CHECK(a->suid == b->suid && a->dev == b->dev);
		CHECK(!strcmp(a->domain, b->domain) && !strcmp(a->mode_reason, b->mode_reason));
		CHECK(a->bytes_read == b->bytes_read && a->bytes_fetched == b->bytes_fetched &&
		      a->bytes_prefetched == b->bytes_prefetched &&
		      a->chunks_present == b->chunks_present &&
		      a->chunks_total == b->chunks_total && a->bytes_present == b->bytes_present &&
		      a->bytes_evicted == b->bytes_evicted &&
		      a->prefetch_files == b->prefetch_files &&
		      a->readahead_files == b->readahead_files &&
		      a->readahead_bytes == b->readahead_bytes);
		CHECK_EQ(b->prefetch_ms, a->prefetch_ms);
		CHECK(a->hits == b->hits && a->misses == b->misses &&
		      a->fetch_errors == b->fetch_errors && a->inflight == b->inflight &&
		      a->miss_ns_total == b->miss_ns_total && a->requests == b->requests &&
		      a->retries == b->retries);
		CHECK(!memcmp(a->miss_ms, b->miss_ms, sizeof(a->miss_ms)));
	}
	ctl_list_reply_free(&lb);

	/* prefetchSeconds keeps exactly three decimals on the wire. */
	o = ctl_mount_stats_to_json(&ms[0]);
	CHECK(o && strstr(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN),
			  "\"prefetchSeconds\":12.345"));
	json_object_put(o);
}

/* A fuse mount has no keeperPid field at all. */
static void test_stats_keeper_absent(void)
{
	struct ctl_mount_stats m = { .mountpoint = "/m", .image = "dir:/i", .cache_dir = "/c",
				     .mode = "fuse", .state = "mounted", .prefetch = "none" };
	struct json_object *o = ctl_mount_stats_to_json(&m);

	CHECK(o && !strstr(json_object_to_json_string(o), "keeperPid"));
	json_object_put(o);
}

/* @text must fail ctl_request_parse with -EINVAL and a message naming @what. */
static void reject_req(const char *text, const char *what)
{
	struct json_object *o = text_json(text);
	struct ctl_request req;
	char err[512] = "";
	int ret;

	if (!o) {
		fprintf(stderr, "  not JSON: %s\n", text);
		CHECK(0);
		return;
	}
	ret = ctl_request_parse(o, &req, err, sizeof(err));
	ctl_request_free(&req);
	json_object_put(o);
	if (ret != -EINVAL || !strstr(err, what)) {
		fprintf(stderr, "  %.200s: got %d \"%s\", want -EINVAL naming %s\n", text, ret, err,
			what);
		CHECK(0);
	}
}

#define MNT "\"op\":\"mount\",\"image\":\"dir:/a\",\"mountpoint\":\"/m\",\"cacheDir\":\"/c\""

static void test_request_rejections(void)
{
	char *big, *p;
	size_t i;

	reject_req("{}", "\"op\"");
	reject_req("{\"op\":7}", "\"op\"");
	reject_req("{\"op\":\"frob\"}", "unknown op");
	/* Missing required fields. */
	reject_req("{\"op\":\"mount\",\"mountpoint\":\"/m\",\"cacheDir\":\"/c\"}", "\"image\"");
	reject_req("{\"op\":\"mount\",\"image\":\"\",\"mountpoint\":\"/m\",\"cacheDir\":\"/c\"}",
		   "\"image\"");
	reject_req("{\"op\":\"mount\",\"image\":\"dir:/a\",\"cacheDir\":\"/c\"}", "\"mountpoint\"");
	reject_req("{\"op\":\"mount\",\"image\":\"dir:/a\",\"mountpoint\":\"/m\"}", "\"cacheDir\"");
	reject_req("{\"op\":\"umount\"}", "\"mountpoint\"");
	/* Wrong types and ranges. */
	reject_req("{\"op\":\"mount\",\"image\":1,\"mountpoint\":\"/m\",\"cacheDir\":\"/c\"}",
		   "\"image\"");
	reject_req("{\"op\":\"mount\",\"image\":\"dir:/a\",\"mountpoint\":\"m\",\"cacheDir\":\"/c\"}",
		   "absolute");
	reject_req("{\"op\":\"mount\",\"image\":\"a\\u0000b\",\"mountpoint\":\"/m\",\"cacheDir\":\"/c\"}",
		   "\"image\"");
	reject_req("{" MNT ",\"mode\":\"FUSE\"}", "\"mode\"");
	reject_req("{" MNT ",\"mode\":\"a b\"}", "\"mode\"");
	reject_req("{" MNT ",\"mode\":\"abcdefghijklmnopq\"}", "\"mode\"");
	reject_req("{" MNT ",\"mode\":true}", "\"mode\"");
	reject_req("{" MNT ",\"domain\":7}", "\"domain\"");
	reject_req("{" MNT ",\"domain\":\"" "0123456789012345678901234567890123456789012345678901234567890123456789" "\"}",
		   "\"domain\"");
	reject_req("{" MNT ",\"prefetchFiles\":\"/a\"}", "\"prefetchFiles\"");
	reject_req("{" MNT ",\"prefetchFiles\":[\"/a\",3]}", "\"prefetchFiles\"[1]");
	reject_req("{" MNT ",\"prefetchFiles\":[\"\"]}", "\"prefetchFiles\"[0]");
	reject_req("{" MNT ",\"prefetchAll\":\"yes\"}", "\"prefetchAll\"");
	reject_req("{" MNT ",\"prefetchBwlimit\":-1}", "\"prefetchBwlimit\"");
	reject_req("{" MNT ",\"prefetchBwlimit\":1.5}", "\"prefetchBwlimit\"");
	reject_req("{" MNT ",\"prefetchBwlimit\":18446744073709551615}", "\"prefetchBwlimit\"");
	reject_req("{" MNT ",\"cacheMaxSize\":-1}", "\"cacheMaxSize\"");
	reject_req("{" MNT ",\"cacheMinFree\":100}", "\"cacheMinFree\"");
	reject_req("{" MNT ",\"cacheMinFree\":-1}", "\"cacheMinFree\"");
	reject_req("{" MNT ",\"fetch\":[]}", "\"fetch\"");
	reject_req("{" MNT ",\"fetch\":{\"creds\":5}}", "\"creds\"");
	reject_req("{" MNT ",\"fetch\":{\"tlsVerify\":\"false\"}}", "\"tlsVerify\"");
	reject_req("{" MNT ",\"fetch\":{\"tlsVerify\":0}}", "\"tlsVerify\"");
	reject_req("{" MNT ",\"fetch\":{\"retries\":101}}", "\"retries\"");
	reject_req("{" MNT ",\"fetch\":{\"retries\":-1}}", "\"retries\"");
	reject_req("{" MNT ",\"fetch\":{\"stallTimeoutMs\":3600001}}", "\"stallTimeoutMs\"");
	reject_req("{" MNT ",\"fetch\":{\"requestTimeoutMs\":3600001}}", "\"requestTimeoutMs\"");
	reject_req("{" MNT ",\"fetch\":{\"resolve\":\"a:1:127.0.0.1\"}}", "\"resolve\"");
	reject_req("{" MNT ",\"fetch\":{\"hosts\":{}}}", "\"hosts\": expected an array");
	reject_req("{" MNT ",\"fetch\":{\"hosts\":[7]}}", "\"hosts\": expected objects");
	reject_req("{" MNT ",\"fetch\":{\"hosts\":[{\"url\":\"https://m\"}]}}",
		   "\"registry\"");
	reject_req("{" MNT ",\"fetch\":{\"hosts\":[{\"registry\":\"r.io\","
		   "\"url\":\"https://m\",\"capabilities\":[\"fly\"]}]}}",
		   "\"fly\" is not pull, resolve or push");
	reject_req("{" MNT ",\"fetch\":{\"hosts\":[{\"registry\":\"r.io\","
		   "\"url\":\"ftp://m\"}]}}", "must start with http:// or https://");
	reject_req("{" MNT ",\"fetch\":{\"hosts\":[{\"registry\":\"r.io\","
		   "\"url\":\"https://m\",\"headers\":[\"X: a\\r\\nY: b\"]}]}}",
		   "headers must be");
	reject_req("{" MNT ",\"fetch\":{\"hosts\":[{\"registry\":\"r.io\","
		   "\"url\":\"https://m\",\"ca\":[\"ca.pem\"]}]}}", "absolute");
	reject_req("{\"op\":\"umount\",\"mountpoint\":\"/m\",\"lazy\":1}", "\"lazy\"");
	reject_req("{\"op\":\"umount\",\"mountpoint\":\"rel\"}", "absolute");

	/* Oversized: a list over its entries, a string over its length. */
	big = malloc(64 * 8 + 2048 + 256);
	CHECK(big);
	if (!big)
		return;
	p = big + sprintf(big, "{" MNT ",\"fetch\":{\"insecure\":[");
	for (i = 0; i <= CTL_HOSTS_MAX; i++)
		p += sprintf(p, "%s\"h%zu\"", i ? "," : "", i);
	strcpy(p, "]}}");
	reject_req(big, "\"insecure\"");
	p = big + sprintf(big, "{" MNT ",\"fetch\":{\"resolve\":[\"");
	memset(p, 'a', 1025);
	strcpy(p + 1025, "\"]}}");
	reject_req(big, "\"resolve\"[0]");
	free(big);
}

/* @text must fail @parse with -EPROTO and a message naming @what. */
#define reject_reply(parse, type, text, what)                                  \
	do {                                                                   \
		struct json_object *_o = text_json(text);                     \
		type _r;                                                       \
		char _err[512] = "";                                           \
		int _ret = _o ? parse(_o, &_r, _err, sizeof(_err)) : 0;        \
		json_object_put(_o);                                           \
		if (_ret != -EPROTO || !strstr(_err, what)) {                  \
			fprintf(stderr, "  %s: got %d \"%s\", want -EPROTO naming %s\n", \
				text, _ret, _err, what);                       \
			CHECK(0);                                              \
		}                                                              \
	} while (0)

static int list_parse(struct json_object *o, struct ctl_list_reply *r, char *err,
		      size_t errlen)
{
	int ret = ctl_list_reply_parse(o, r, err, errlen);

	ctl_list_reply_free(r);
	return ret;
}

#define PING "\"ok\":true,\"pid\":1,\"version\":\"v\",\"socket\":\"/s\""
#define ENTRY "\"mountpoint\":\"/m\",\"image\":\"i\",\"cacheDir\":\"/c\",\"mode\":\"fuse\"," \
	      "\"state\":\"mounted\",\"prefetch\":\"none\""

static void test_reply_rejections(void)
{
	struct json_object *a, *o, *e;
	struct ctl_list_reply lr;
	char err[256] = "";
	size_t i;

	reject_reply(ctl_reply_parse, struct ctl_reply, "{}", "\"ok\"");
	reject_reply(ctl_reply_parse, struct ctl_reply, "{\"ok\":1}", "\"ok\"");
	reject_reply(ctl_reply_parse, struct ctl_reply, "{\"ok\":false,\"errno\":5}", "\"error\"");
	reject_reply(ctl_reply_parse, struct ctl_reply, "{\"ok\":false,\"error\":\"x\"}", "\"errno\"");
	reject_reply(ctl_reply_parse, struct ctl_reply,
		     "{\"ok\":false,\"error\":\"x\",\"errno\":0}", "\"errno\"");
	reject_reply(ctl_reply_parse, struct ctl_reply,
		     "{\"ok\":false,\"error\":\"x\",\"errno\":4096}", "\"errno\"");
	reject_reply(ctl_mount_reply_parse, struct ctl_mount_reply, "{\"ok\":true}", "\"pid\"");
	reject_reply(ctl_mount_reply_parse, struct ctl_mount_reply,
		     "{\"ok\":true,\"pid\":1,\"imageDigest\":\"sha256:12\"}", "imageDigest");
	reject_reply(ctl_mount_reply_parse, struct ctl_mount_reply,
		     "{\"ok\":true,\"pid\":1,\"bootstrapDigest\":7}", "bootstrapDigest");
	reject_reply(ctl_mount_reply_parse, struct ctl_mount_reply, "{\"ok\":true,\"pid\":0}",
		     "\"pid\"");
	reject_reply(ctl_mount_reply_parse, struct ctl_mount_reply, "{\"ok\":true,\"pid\":\"1\"}",
		     "\"pid\"");
	reject_reply(ctl_mount_reply_parse, struct ctl_mount_reply,
		     "{\"ok\":true,\"pid\":2147483648}", "\"pid\"");
	reject_reply(ctl_ping_reply_parse, struct ctl_ping_reply,
		     "{\"ok\":true,\"pid\":1,\"version\":\"v\"}", "\"socket\"");
	reject_reply(ctl_ping_reply_parse, struct ctl_ping_reply,
		     "{\"ok\":true,\"pid\":1,\"version\":\"v\",\"socket\":\""
		     "/123456789/123456789/123456789/123456789/123456789/123456789"
		     "/123456789/123456789/123456789/123456789/1234567\"}", "\"socket\"");
	reject_reply(list_parse, struct ctl_list_reply, "{" PING "}", "\"mounts\"");
	reject_reply(list_parse, struct ctl_list_reply, "{" PING ",\"mounts\":{}}", "\"mounts\"");
	reject_reply(list_parse, struct ctl_list_reply, "{" PING ",\"mounts\":[1]}", "\"mounts\"[0]");
	reject_reply(list_parse, struct ctl_list_reply,
		     "{" PING ",\"mounts\":[{" ENTRY "},{\"image\":\"i\"}]}", "\"mountpoint\"");
	reject_reply(list_parse, struct ctl_list_reply,
		     "{" PING ",\"mounts\":[{" ENTRY ",\"bytesRead\":-1}]}", "\"bytesRead\"");
	reject_reply(list_parse, struct ctl_list_reply,
		     "{" PING ",\"mounts\":[{" ENTRY ",\"keeperPid\":-5}]}", "\"keeperPid\"");
	reject_reply(list_parse, struct ctl_list_reply,
		     "{" PING ",\"mounts\":[{" ENTRY ",\"prefetchSeconds\":-0.5}]}",
		     "\"prefetchSeconds\"");
	reject_reply(list_parse, struct ctl_list_reply,
		     "{" PING ",\"mounts\":[{" ENTRY ",\"prefetchSeconds\":\"1\"}]}",
		     "\"prefetchSeconds\"");
	reject_reply(list_parse, struct ctl_list_reply,
		     "{\"ok\":true,\"pid\":1,\"version\":\"v\",\"socket\":\"/s\",\"mounts\":"
		     "[{\"mountpoint\":\"/m\",\"image\":\"i\",\"cacheDir\":\"/c\",\"mode\":\"Fuse\","
		     "\"state\":\"mounted\",\"prefetch\":\"none\"}]}", "\"mode\"");

	/* More mounts than a list answer may hold. */
	o = text_json("{" PING "}");
	a = json_object_new_array();
	for (i = 0; o && a && i <= CTL_MOUNTS_MAX; i++) {
		e = text_json("{" ENTRY "}");
		json_object_array_add(a, e);
	}
	json_object_object_add(o, "mounts", a);
	CHECK_EQ(ctl_list_reply_parse(o, &lr, err, sizeof(err)), -EPROTO);
	CHECK(strstr(err, "\"mounts\""));
	ctl_list_reply_free(&lr);
	json_object_put(o);
}

int main(void)
{
	ferry_log_level = FERRY_LOG_ERR;
	RUN_TEST(test_fetch_opts_roundtrip);
	RUN_TEST(test_fetch_table);
	RUN_TEST(test_fetch_table_matches_cli);
	RUN_TEST(test_cli_options_reach_request);
	RUN_TEST(test_cli_creds_sources);
	RUN_TEST(test_mount_req_roundtrip);
	RUN_TEST(test_probe);
	RUN_TEST(test_other_requests_roundtrip);
	RUN_TEST(test_replies_roundtrip);
	RUN_TEST(test_stats_keeper_absent);
	RUN_TEST(test_request_rejections);
	RUN_TEST(test_reply_rejections);
	TEST_MAIN_END();
}
