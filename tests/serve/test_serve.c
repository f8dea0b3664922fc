// SPDX-License-Identifier: MIT
/*
 * pkg-serve without a kernel mount: the choice of a mode, the options a
 * successor ferryd gets, the range a fanotify event asks for, which
 * cachefiles mount an object the kernel names belongs to, and the
 * metrics text.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../pkg-serve/cachefiles.h"
#include "../../pkg-serve/fanotify.h"
#include "../../pkg-serve/internal.h"
#include "../test.h"

static struct serve_ctx *ctx_new(const struct serve_opts *o)
{
	struct serve_opts def = { .socket_path = "/nonexistent/ferryd.sock",
				  .log_path = "/nonexistent/ferryd.log" };
	struct serve_ctx *ctx = NULL;

	CHECK_EQ(serve_ctx_new(o ? o : &def, NULL, NULL, &ctx), 0);
	return ctx;
}

/* Mode names, the list for messages, and auto against each probe. */
static void test_mode_pick(void)
{
	struct ctl_mount_req req = { .mode = "fuse", .cache_dir = "/tmp" };
	struct serve_ctx *ctx = ctx_new(NULL);
	const struct serve_mode *mode, *first = NULL;
	static const char *const order[] = { "fanotify", "cachefiles", "fuse" };
	char why[2048], reason[512], names[128], expect[2048] = "";
	size_t i, n = 0;

	if (!ctx)
		return;
	for (i = 0; i < SERVE_NR_MODES; i++) {
		req.mode = serve_modes[i]->name;
		CHECK(serve_mode_pick(ctx, &req, why, sizeof(why)) == serve_modes[i]);
		CHECK_EQ(why[0], '\0');
		CHECK_EQ(serve_mode_slot(serve_modes[i]), i);
	}
	req.mode = "nfs";
	CHECK(serve_mode_pick(ctx, &req, why, sizeof(why)) == NULL);
	serve_mode_names(names, sizeof(names));
	CHECK(!strcmp(names, "fuse, fanotify, cachefiles, auto"));

	/* Auto: the first of its order whose probe says yes, and why not
	 * the ones before. */
	for (i = 0; i < ARRAY_SIZE(order) && !first; i++) {
		req.mode = order[i];
		mode = serve_mode_pick(ctx, &req, why, sizeof(why));
		if (!mode) {
			CHECK(mode);
			break;
		}
		if (!mode->probe(mode_state(ctx, mode), &req, reason, sizeof(reason))) {
			first = mode;
			n += (size_t)snprintf(expect + n, sizeof(expect) - n, "%s: %s",
					      mode->name, reason);
		} else {
			n += (size_t)snprintf(expect + n, sizeof(expect) - n, "not %s: %s; ",
					      mode->name, reason);
		}
	}
	if (!first && n >= 2)
		expect[n - 2] = '\0';
	req.mode = "auto";
	CHECK(serve_mode_pick(ctx, &req, why, sizeof(why)) == first);
	CHECK(!strcmp(why, expect));
	if (strcmp(why, expect))
		fprintf(stderr, "  auto: \"%s\", expected \"%s\"\n", why, expect);
	serve_ctx_free(ctx);
}

static bool args_are(const char *const *a, const char *const *want)
{
	size_t i;

	for (i = 0; want[i]; i++) {
		if (!a[i] || strcmp(a[i], want[i])) {
			fprintf(stderr, "  argument %zu: \"%s\", expected \"%s\"\n", i,
				a[i] ? a[i] : "(end)", want[i]);
			return false;
		}
	}
	if (a[i])
		fprintf(stderr, "  argument %zu: \"%s\", expected the end\n", i, a[i]);
	return !a[i];
}

/* Every option a successor needs, in the order ferryd's main reads them. */
static void test_successor_args(void)
{
	struct serve_opts o = {
		.socket_path = "/run/ferry/ferryd.sock",
		.log_path = "/var/log/ferryd.log",
		.fuse = { .threads = 7, .readahead_kb = 0, .dir_readahead_kb = 512 },
		.cache_max_size = 10ull << 30,
		.cache_min_free = 5,
		.idle_timeout = 0,
		.metrics_listen = { "unix:/run/m.sock", "127.0.0.1:9100" },
		.nr_metrics_listen = 2,
	};
	static const char *const want[] = {
		"--log-file", "/var/log/ferryd.log", "--threads", "7", "--readahead", "0",
		"--dir-readahead", "512", "--cache-max-size", "10737418240",
		"--cache-min-free", "5", "--idle-timeout", "0",
		"--metrics-listen", "unix:/run/m.sock", "--metrics-listen", "127.0.0.1:9100",
		"-v", NULL,
	};
	/* After the 14 fixed ones, without --metrics-listen. */
	static const char *const quiet_tail[] = { "-q", NULL };
	static const char *const info_tail[] = { NULL };
	int level = ferry_log_level;
	struct serve_ctx *ctx;

	ferry_log_level = FERRY_LOG_DEBUG; /* -v: ferryd's highest */
	ctx = ctx_new(&o);
	if (ctx) {
		CHECK(args_are(serve_successor_args(ctx), want));
		serve_ctx_free(ctx);
	}
	o.nr_metrics_listen = 0;
	ferry_log_level = FERRY_LOG_ERR;
	ctx = ctx_new(&o);
	if (ctx) {
		CHECK(args_are(serve_successor_args(ctx) + 14, quiet_tail));
		serve_ctx_free(ctx);
	}
	ferry_log_level = FERRY_LOG_INFO;
	ctx = ctx_new(&o);
	if (ctx) {
		CHECK(args_are(serve_successor_args(ctx) + 14, info_tail));
		serve_ctx_free(ctx);
	}
	ferry_log_level = level;
}

/* A pre-content event, with a RANGE record of (@off, @count) when @with_range. */
struct event {
	struct fanotify_event_metadata meta;
	struct fanotify_event_info_range range;
};

static void event_init(struct event *e, bool with_range, uint64_t off, uint64_t count)
{
	memset(e, 0, sizeof(*e));
	e->meta.vers = FANOTIFY_METADATA_VERSION;
	e->meta.metadata_len = sizeof(e->meta);
	e->meta.event_len = sizeof(e->meta) + (with_range ? sizeof(e->range) : 0);
	e->meta.mask = FAN_PRE_ACCESS;
	e->range.hdr.info_type = FAN_EVENT_INFO_TYPE_RANGE;
	e->range.hdr.len = sizeof(e->range);
	e->range.offset = off;
	e->range.count = count;
}

static void test_fan_event_range(void)
{
	uint64_t off = 1, len = 1;
	struct event e;

	event_init(&e, true, 4096, 8192);
	CHECK_EQ(fan_event_range(&e.meta, &off, &len), 0);
	CHECK_EQ(off, 4096);
	CHECK_EQ(len, 8192);
	/* Inside a file of 10000 bytes: cut at its end. */
	fan_event_span(&e.meta, 10000, &off, &len);
	CHECK_EQ(off, 4096);
	CHECK_EQ(len, 10000 - 4096);
	/* Past the end: nothing. */
	event_init(&e, true, 20000, 4096);
	fan_event_span(&e.meta, 10000, &off, &len);
	CHECK_EQ(off, 10000);
	CHECK_EQ(len, 0);
	/* An offset and count that overflow together stay within the file. */
	event_init(&e, true, 8192, UINT64_MAX);
	fan_event_span(&e.meta, 10000, &off, &len);
	CHECK_EQ(off, 8192);
	CHECK_EQ(len, 10000 - 8192);
	/* No record: -ENOENT, and the span is the whole file. */
	event_init(&e, false, 4096, 8192);
	CHECK_EQ(fan_event_range(&e.meta, &off, &len), -ENOENT);
	fan_event_span(&e.meta, 10000, &off, &len);
	CHECK_EQ(off, 0);
	CHECK_EQ(len, 10000);
	/* A record that claims more than the event holds is not read. */
	event_init(&e, true, 4096, 8192);
	e.range.hdr.len = sizeof(e.range) + 8;
	CHECK_EQ(fan_event_range(&e.meta, &off, &len), -ENOENT);
	/* Nor one too short for a range, nor a zero-length header (a loop). */
	event_init(&e, true, 4096, 8192);
	e.range.hdr.len = sizeof(e.range.hdr);
	CHECK_EQ(fan_event_range(&e.meta, &off, &len), -ENOENT);
	event_init(&e, true, 4096, 8192);
	e.range.hdr.len = 0;
	CHECK_EQ(fan_event_range(&e.meta, &off, &len), -ENOENT);
	/* Another record type first (its length covers the padding), then
	 * the range. */
	{
		struct two {
			struct fanotify_event_metadata meta;
			struct fanotify_event_info_header other;
			struct fanotify_event_info_range range;
		} two = { 0 };

		two.meta.metadata_len = sizeof(two.meta);
		two.meta.event_len = sizeof(two);
		two.other.info_type = FAN_EVENT_INFO_TYPE_RANGE + 1;
		two.other.len = offsetof(struct two, range) - offsetof(struct two, other);
		two.range.hdr.info_type = FAN_EVENT_INFO_TYPE_RANGE;
		two.range.hdr.len = sizeof(two.range);
		two.range.offset = 12;
		two.range.count = 34;
		CHECK_EQ(fan_event_range(&two.meta, &off, &len), 0);
		CHECK_EQ(off, 12);
		CHECK_EQ(len, 34);
	}
}

static void digest_of(uint8_t d[BLOB_DIGEST_SIZE], uint8_t seed)
{
	size_t i;

	for (i = 0; i < BLOB_DIGEST_SIZE; i++)
		d[i] = (uint8_t)(seed + i * 7);
}

/* An image of two blobs, in a domain or not, or native layers. */
static bool names_of(struct cf_names *n, bool layers, const char *domain)
{
	uint8_t boot[BLOB_DIGEST_SIZE], blob[BLOB_DIGEST_SIZE];
	uint32_t i;

	digest_of(boot, 1);
	if (cf_names_init(n, 2, layers ? NULL : boot, domain))
		return false;
	for (i = 0; i < 2; i++) {
		digest_of(blob, (uint8_t)(0x40 + i));
		hex_encode(blob, BLOB_DIGEST_SIZE, n->digests[i]);
	}
	return true;
}

static void test_cachefiles_names(void)
{
	char volume[CF_VOLUME_MAX + 8], sysfs[128];
	struct cf_names n, d, l;
	cf_name fsid, copy;
	uint32_t device = 99;

	if (!names_of(&n, false, NULL) || !names_of(&d, false, "dom") ||
	    !names_of(&l, true, NULL)) {
		CHECK(!"cf_names_init");
		return;
	}
	/* The bootstrap and each blob, in the image's own volume. */
	snprintf(volume, sizeof(volume), "erofs,%s", n.fsid);
	CHECK(!strcmp(n.volume, volume));
	CHECK(cf_names_resolve(&n, volume, n.fsid, &device));
	CHECK_EQ(device, 0);
	CHECK(cf_names_resolve(&n, volume, n.digests[1], &device));
	CHECK_EQ(device, 2);
	CHECK(!cf_names_resolve(&n, "erofs,other", n.digests[1], &device));
	CHECK(!cf_names_resolve(&n, volume, "unknown", &device));
	CHECK(cf_names_object_is(&n, 1, volume, n.digests[0]));
	CHECK(!cf_names_object_is(&n, 2, volume, n.digests[0]));
	CHECK(!cf_names_object_is(&n, 3, volume, n.digests[0]));
	/* In a domain the volume is the domain's: any mount of it serves. */
	CHECK(!strcmp(d.volume, "erofs,dom"));
	CHECK(cf_names_resolve(&d, "erofs,dom", d.digests[0], &device));
	CHECK_EQ(device, 1);
	CHECK(!cf_names_resolve(&d, volume, d.digests[0], &device));

	/* Native layers: each its own volume, any copy of it. */
	cf_layer_fsid(l.digests[1], 0, fsid);
	CHECK(!strcmp(fsid, l.digests[1]));
	cf_layer_fsid(l.digests[1], 7, copy);
	CHECK_EQ(strlen(copy), CF_FSID_LEN);
	CHECK(!strncmp(copy, "07-", 3) && !strncmp(copy + 3, l.digests[1], 61));
	snprintf(volume, sizeof(volume), "erofs,%s", copy);
	CHECK(cf_names_resolve(&l, volume, copy, &device));
	CHECK_EQ(device, 2);
	/* A copy's cookie in another layer's volume is nobody's. */
	snprintf(volume, sizeof(volume), "erofs,%s", l.digests[0]);
	CHECK(!cf_names_resolve(&l, volume, copy, &device));
	/* Mounted as copy 7, the object is copy 7's, not copy 0's. */
	memcpy(l.layer_fsids[1], copy, sizeof(copy));
	snprintf(volume, sizeof(volume), "erofs,%s", copy);
	CHECK(cf_names_object_is(&l, 2, volume, copy));
	snprintf(volume, sizeof(volume), "erofs,%s", fsid);
	CHECK(!cf_names_object_is(&l, 2, volume, fsid));
	/* Taken over (no copy known): any copy. */
	l.layer_fsids[1][0] = '\0';
	CHECK(cf_names_object_is(&l, 2, volume, fsid));

	/* Superblocks: "[DOMAIN,]FSID" cut to 36 bytes. */
	snprintf(sysfs, sizeof(sysfs), "/sys/fs/erofs/%.36s", n.fsid);
	CHECK(cf_names_sysfs_is(&n, sysfs));
	snprintf(sysfs, sizeof(sysfs), "/sys/fs/erofs/dom,%.32s", d.fsid);
	CHECK(cf_names_sysfs_is(&d, sysfs));
	CHECK(!cf_names_sysfs_is(&n, sysfs));
	snprintf(sysfs, sizeof(sysfs), "/sys/fs/erofs/../erofs/%.36s", n.fsid);
	CHECK(!cf_names_sysfs_is(&n, sysfs));
	snprintf(sysfs, sizeof(sysfs), "/sys/fs/ext4/%.36s", n.fsid);
	CHECK(!cf_names_sysfs_is(&n, sysfs));
	snprintf(sysfs, sizeof(sysfs), "/sys/fs/erofs/07-%.33s", l.digests[0]);
	CHECK(cf_names_sysfs_is(&l, sysfs));
	snprintf(sysfs, sizeof(sysfs), "/sys/fs/erofs/07-%.33s", l.digests[1]);
	CHECK(!cf_names_sysfs_is(&l, sysfs));
	cf_names_free(&n);
	cf_names_free(&d);
	cf_names_free(&l);
}

static bool has_line(const char *text, const char *line)
{
	const char *p = text;
	size_t len = strlen(line);

	while ((p = strstr(p, line))) {
		if ((p == text || p[-1] == '\n') && p[len] == '\n')
			return true;
		p += len;
	}
	fprintf(stderr, "  no line \"%s\"\n", line);
	return false;
}

static void test_metrics_text(void)
{
	struct ctl_ping_reply daemon = { .version = "9.9", .started_at = 1700000000,
					 .rss_bytes = 4096, .peak_rss_bytes = 8192 };
	struct ctl_mount_stats ms[2] = { 0 };
	struct serve_metrics in = { .daemon = &daemon, .connections = 3, .mounts = ms,
				    .nr_mounts = 2, .modes = { "fuse", "fanotify", "cachefiles" },
				    .takeovers = { 1, 0, 2 }, .keeper_restarts = 4 };
	char *text = NULL;

	snprintf(daemon.socket, sizeof(daemon.socket), "/run/a\"b.sock");
	ms[0].mountpoint = "/mnt/a";
	ms[0].image = "dir:/img\\x";
	snprintf(ms[0].mode, sizeof(ms[0].mode), "fuse");
	ms[0].bytes_read = 123;
	ms[0].misses = 3;
	ms[0].miss_ms[0] = 1;
	ms[0].miss_ms[2] = 2;
	ms[0].miss_ns_total = 1500000000;
	ms[1].mountpoint = "/mnt/b\nc";
	ms[1].image = "docker://r/i";
	snprintf(ms[1].mode, sizeof(ms[1].mode), "fuse");
	CHECK_EQ(serve_metrics_render(&in, &text), 0);
	if (!text)
		return;
	CHECK(has_line(text, "ferryd_info{version=\"9.9\",socket=\"/run/a\\\"b.sock\"} 1"));
	CHECK(has_line(text, "process_start_time_seconds 1700000000"));
	CHECK(has_line(text, "process_resident_memory_bytes 4096"));
	CHECK(has_line(text, "ferryd_control_connections 3"));
	CHECK(has_line(text, "ferryd_mounts{mode=\"fuse\"} 2"));
	CHECK(has_line(text, "ferryd_mounts{mode=\"cachefiles\"} 0"));
	CHECK(has_line(text, "ferryd_takeovers_total{mode=\"cachefiles\"} 2"));
	CHECK(has_line(text, "ferryd_keeper_restarts_total 4"));
	CHECK(has_line(text, "# TYPE ferryd_read_bytes_total counter"));
	CHECK(has_line(text, "ferryd_read_bytes_total{mountpoint=\"/mnt/a\",image=\"dir:/img\\\\x\",mode=\"fuse\"} 123"));
	CHECK(has_line(text, "ferryd_read_bytes_total{mountpoint=\"/mnt/b\\nc\",image=\"docker://r/i\",mode=\"fuse\"} 0"));
	/* Buckets count cumulatively; the last is +Inf. */
	CHECK(has_line(text, "ferryd_miss_duration_seconds_bucket{mountpoint=\"/mnt/a\",image=\"dir:/img\\\\x\",mode=\"fuse\",le=\"0.001\"} 1"));
	CHECK(has_line(text, "ferryd_miss_duration_seconds_bucket{mountpoint=\"/mnt/a\",image=\"dir:/img\\\\x\",mode=\"fuse\",le=\"0.005\"} 1"));
	CHECK(has_line(text, "ferryd_miss_duration_seconds_bucket{mountpoint=\"/mnt/a\",image=\"dir:/img\\\\x\",mode=\"fuse\",le=\"0.01\"} 3"));
	CHECK(has_line(text, "ferryd_miss_duration_seconds_bucket{mountpoint=\"/mnt/a\",image=\"dir:/img\\\\x\",mode=\"fuse\",le=\"+Inf\"} 3"));
	CHECK(has_line(text, "ferryd_miss_duration_seconds_sum{mountpoint=\"/mnt/a\",image=\"dir:/img\\\\x\",mode=\"fuse\"} 1.500000000"));
	CHECK(has_line(text, "ferryd_miss_duration_seconds_count{mountpoint=\"/mnt/a\",image=\"dir:/img\\\\x\",mode=\"fuse\"} 3"));
	free(text);
}

int main(void)
{
	ferry_log_level = FERRY_LOG_ERR;
	RUN_TEST(test_mode_pick);
	RUN_TEST(test_successor_args);
	RUN_TEST(test_fan_event_range);
	RUN_TEST(test_cachefiles_names);
	RUN_TEST(test_metrics_text);
	TEST_MAIN_END();
}
