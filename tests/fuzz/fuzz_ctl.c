// SPDX-License-Identifier: MIT
/*
 * libFuzzer target for the control protocol's parsers (cmd/ctl.c): the
 * input goes through a socket into jsonl_recv's line reader; every line is
 * parsed as a request of any op and as every answer. What a parser
 * accepts must be within its limits and must encode and parse back to
 * the same message.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../../cmd/ctl.h"
#include "../../pkg-base/base.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool same(const char *a, const char *b)
{
	return (!a && !b) || (a && b && !strcmp(a, b));
}

static bool lists_same(const char *const *a, const char *const *b)
{
	size_t i;

	for (i = 0; a[i] && b[i]; i++)
		if (strcmp(a[i], b[i]))
			return false;
	return !a[i] && !b[i];
}

/* Two parsed host lists are equal, and every host passes fetch_check_host. */
static bool hosts_same(const struct fetch_host *const *a,
		       const struct fetch_host *const *b)
{
	char why[800];
	size_t i;

	for (i = 0; a[i] && b[i]; i++)
		if (fetch_check_host(a[i], why, sizeof(why)) ||
		    !same(a[i]->registry, b[i]->registry) || !same(a[i]->url, b[i]->url) ||
		    a[i]->capabilities != b[i]->capabilities || a[i]->server != b[i]->server ||
		    a[i]->skip_verify != b[i]->skip_verify ||
		    a[i]->override_path != b[i]->override_path ||
		    !lists_same(a[i]->ca_files, b[i]->ca_files) ||
		    !same(a[i]->client_cert, b[i]->client_cert) ||
		    !same(a[i]->client_key, b[i]->client_key) ||
		    !lists_same(a[i]->headers, b[i]->headers))
			return false;
	return !a[i] && !b[i];
}

static void check_fetch(const struct fetch_opts *a, const struct fetch_opts *b)
{
	const struct ctl_fetch_opt *o;
	const void *x, *y;

	for (o = ctl_fetch_opts; o < ctl_fetch_opts + CTL_NR_FETCH_OPTS; o++) {
		x = (const char *)a + o->offset;
		y = (const char *)b + o->offset;
		switch (o->type) {
		case CTL_OPT_STR:
			if (!same(*(const char *const *)x, *(const char *const *)y) ||
			    (*(const char *const *)x &&
			     strlen(*(const char *const *)x) > o->max))
				abort();
			break;
		case CTL_OPT_BOOL:
			if (*(const bool *)x != *(const bool *)y)
				abort();
			break;
		case CTL_OPT_UINT:
			if (*(const unsigned int *)x != *(const unsigned int *)y ||
			    *(const unsigned int *)x > o->max)
				abort();
			break;
		case CTL_OPT_STRS:
			if (!lists_same(*(const char *const *const *)x,
					*(const char *const *const *)y))
				abort();
			break;
		case CTL_OPT_HOSTS:
			if (!hosts_same(*(const struct fetch_host *const *const *)x,
					*(const struct fetch_host *const *const *)y))
				abort();
			break;
		}
	}
}

/* An accepted request encodes and parses back equal. */
static void check_request(const struct ctl_request *a)
{
	struct json_object *o = NULL;
	struct ctl_request b;
	char err[256];
	size_t i;

	switch (a->op) {
	case CTL_OP_MOUNT:
		if (a->mount.image[0] == '\0' || a->mount.mountpoint[0] != '/' ||
		    a->mount.cache_dir[0] != '/' || !a->mount.mode ||
		    strlen(a->mount.mode) > CTL_TOKEN_MAX)
			abort();
		o = ctl_mount_req_to_json(&a->mount);
		break;
	case CTL_OP_UMOUNT:
		if (a->umount.mountpoint[0] != '/')
			abort();
		o = ctl_umount_req_to_json(&a->umount);
		break;
	default:
		o = ctl_op_req_to_json(a->op);
		break;
	}
	if (!o)
		return;
	if (ctl_request_parse(o, &b, err, sizeof(err)) || b.op != a->op)
		abort();
	if (a->op == CTL_OP_MOUNT) {
		if (!same(a->mount.image, b.mount.image) ||
		    !same(a->mount.mountpoint, b.mount.mountpoint) ||
		    !same(a->mount.cache_dir, b.mount.cache_dir) ||
		    !same(a->mount.mode, b.mount.mode) ||
		    a->mount.prefetch_all != b.mount.prefetch_all ||
		    a->mount.prefetch_bwlimit != b.mount.prefetch_bwlimit ||
		    a->mount.suid != b.mount.suid || a->mount.dev != b.mount.dev ||
		    a->mount.nr_prefetch_files != b.mount.nr_prefetch_files)
			abort();
		for (i = 0; i < a->mount.nr_prefetch_files; i++)
			if (strcmp(a->mount.prefetch_files[i], b.mount.prefetch_files[i]))
				abort();
		check_fetch(&a->mount.fetch, &b.mount.fetch);
	}
	if (a->op == CTL_OP_UMOUNT && (!same(a->umount.mountpoint, b.umount.mountpoint) ||
				       a->umount.lazy != b.umount.lazy))
		abort();
	ctl_request_free(&b);
	json_object_put(o);
}

static void check_stats(const struct ctl_mount_stats *a, const struct ctl_mount_stats *b)
{
	if (strcmp(a->mountpoint, b->mountpoint) || strcmp(a->image, b->image) ||
	    strcmp(a->cache_dir, b->cache_dir) || strcmp(a->mode, b->mode) ||
	    strcmp(a->state, b->state) || strcmp(a->prefetch, b->prefetch) ||
	    a->keeper_pid != b->keeper_pid || a->mounted_at != b->mounted_at ||
	    a->suid != b->suid || a->dev != b->dev ||
	    a->bytes_read != b->bytes_read || a->chunks_total != b->chunks_total ||
	    a->readahead_bytes != b->readahead_bytes || a->prefetch_ms != b->prefetch_ms ||
	    a->hits != b->hits || a->misses != b->misses || a->inflight != b->inflight ||
	    memcmp(a->miss_ms, b->miss_ms, sizeof(a->miss_ms)))
		abort();
}

/* The answer parsers on @o; what they accept encodes and parses back. */
static void check_replies(struct json_object *o)
{
	struct ctl_list_reply l, l2;
	struct ctl_mount_reply m, m2;
	struct ctl_ping_reply p, p2;
	struct ctl_reply r, r2;
	struct json_object *back;
	const char *text, *text2;
	char err[256];
	size_t i;

	if (!ctl_reply_parse(o, &r, err, sizeof(err))) {
		if (r.err && (r.err <= -4096 || !r.error))
			abort();
		back = ctl_reply_to_json(&r);
		if (back && (ctl_reply_parse(back, &r2, err, sizeof(err)) || r2.err != r.err ||
			     !same(r.error, r2.error)))
			abort();
		json_object_put(back);
	}
	if (!ctl_mount_reply_parse(o, &m, err, sizeof(err))) {
		back = ctl_mount_reply_to_json(&m);
		if (m.pid <= 0 || (back && (ctl_mount_reply_parse(back, &m2, err, sizeof(err)) ||
					    memcmp(&m, &m2, sizeof(m)))))
			abort();
		json_object_put(back);
	}
	if (!ctl_ping_reply_parse(o, &p, err, sizeof(err))) {
		back = ctl_ping_reply_to_json(&p);
		if (back && (ctl_ping_reply_parse(back, &p2, err, sizeof(err)) ||
			     memcmp(&p, &p2, sizeof(p))))
			abort();
		json_object_put(back);
	}
	if (!ctl_metrics_reply_parse(o, &text, err, sizeof(err))) {
		back = ctl_metrics_reply_to_json(text);
		if (back && (ctl_metrics_reply_parse(back, &text2, err, sizeof(err)) ||
			     strcmp(text, text2)))
			abort();
		json_object_put(back);
	}
	if (!ctl_list_reply_parse(o, &l, err, sizeof(err))) {
		if (l.nr_mounts > CTL_MOUNTS_MAX)
			abort();
		back = ctl_list_reply_to_json(&l);
		if (back) {
			if (ctl_list_reply_parse(back, &l2, err, sizeof(err)) ||
			    l2.nr_mounts != l.nr_mounts)
				abort();
			for (i = 0; i < l.nr_mounts; i++)
				check_stats(&l.mounts[i], &l2.mounts[i]);
			ctl_list_reply_free(&l2);
		}
		json_object_put(back);
	}
	ctl_list_reply_free(&l);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct json_object *o;
	struct ctl_request req;
	struct jsonl_reader rd;
	char err[1024];
	int sv[2], ret;

	/* Within one socket buffer, so that writing never blocks. */
	if (size > 65536 || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv))
		return 0;
	if (write_full(sv[0], data, size))
		abort();
	close(sv[0]);
	jsonl_reader_init(&rd, sv[1], CTL_LINE_MAX);
	while ((ret = jsonl_recv(&rd, -1, &o)) <= 0) {
		if (ret == -EPROTO)
			continue;
		if (ret)
			break;
		if (!ctl_request_parse(o, &req, err, sizeof(err)))
			check_request(&req);
		else if (strnlen(err, sizeof(err)) >= sizeof(err))
			abort();
		ctl_request_free(&req);
		check_replies(o);
		json_object_put(o);
	}
	jsonl_reader_free(&rd);
	close(sv[1]);
	return 0;
}
