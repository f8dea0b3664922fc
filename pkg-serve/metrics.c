// SPDX-License-Identifier: MIT
/*
 * ferryd's metrics in the Prometheus text exposition format (0.0.4),
 * built from the same per-mount statistics as a list answer, so the two
 * never disagree. ferryd serves them over the control socket and, when
 * asked, over HTTP (cmd/ferryd/metrics.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* @s as a label value: backslash, double quote and newline escaped. */
static void put_label(FILE *f, const char *s)
{
	for (; *s; s++) {
		if (*s == '\\' || *s == '"')
			fprintf(f, "\\%c", *s);
		else if (*s == '\n')
			fputs("\\n", f);
		else
			fputc(*s, f);
	}
}

static void put_labels(FILE *f, const struct ctl_mount_stats *m)
{
	fputs("{mountpoint=\"", f);
	put_label(f, m->mountpoint);
	fputs("\",image=\"", f);
	put_label(f, m->image);
	fprintf(f, "\",mode=\"%s\"}", m->mode);
}

static void family(FILE *f, const char *name, const char *type, const char *help)
{
	fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A per-mount counter or gauge: the value at @off in each entry. */
static void per_mount(FILE *f, const struct ctl_mount_stats *ms, size_t nr,
		      const char *name, const char *type, const char *help,
		      size_t off)
{
	size_t i;

	family(f, name, type, help);
	for (i = 0; i < nr; i++) {
		fputs(name, f);
		put_labels(f, &ms[i]);
		fprintf(f, " %llu\n",
			(unsigned long long)*(const uint64_t *)((const char *)&ms[i] + off));
	}
}

static void miss_histogram(FILE *f, const struct ctl_mount_stats *ms, size_t nr)
{
	static const uint64_t bounds[] = IMAGE_LATENCY_BOUNDS_MS;
	const char *name = "ferryd_miss_duration_seconds";
	uint64_t sum;
	size_t i, b;

	family(f, name, "histogram",
	       "How long demand reads waited for their chunks to be fetched, verified and stored.");
	for (i = 0; i < nr; i++) {
		for (sum = 0, b = 0; b < IMAGE_LATENCY_BUCKETS; b++) {
			sum += ms[i].miss_ms[b];
			fprintf(f, "%s_bucket", name);
			/* The labels again, with le added before the closing brace. */
			fputs("{mountpoint=\"", f);
			put_label(f, ms[i].mountpoint);
			fputs("\",image=\"", f);
			put_label(f, ms[i].image);
			if (b < ARRAY_SIZE(bounds))
				fprintf(f, "\",mode=\"%s\",le=\"%g\"} %llu\n", ms[i].mode,
					(double)bounds[b] / 1e3, (unsigned long long)sum);
			else
				fprintf(f, "\",mode=\"%s\",le=\"+Inf\"} %llu\n", ms[i].mode,
					(unsigned long long)sum);
		}
		fprintf(f, "%s_sum", name);
		put_labels(f, &ms[i]);
		fprintf(f, " %.9f\n", (double)ms[i].miss_ns_total / 1e9);
		fprintf(f, "%s_count", name);
		put_labels(f, &ms[i]);
		fprintf(f, " %llu\n", (unsigned long long)ms[i].misses);
	}
}

int serve_metrics_render(const struct serve_metrics *in, char **out)
{
	const struct ctl_ping_reply *d = in->daemon;
	const struct ctl_mount_stats *ms = in->mounts;
	size_t nr = in->nr_mounts, len = 0, i, j, n;
	char *text = NULL;
	FILE *f;
	int ret = 0;

	f = open_memstream(&text, &len);
	if (!f)
		return -ENOMEM;
	family(f, "ferryd_info", "gauge", "ferryd's version and control socket (always 1).");
	fprintf(f, "ferryd_info{version=\"%s\",socket=\"", d->version);
	put_label(f, d->socket);
	fputs("\"} 1\n", f);
	family(f, "process_start_time_seconds", "gauge", "When ferryd started (unix time).");
	fprintf(f, "process_start_time_seconds %lld\n", (long long)d->started_at);
	family(f, "process_resident_memory_bytes", "gauge", "ferryd's resident memory (VmRSS).");
	fprintf(f, "process_resident_memory_bytes %llu\n", (unsigned long long)d->rss_bytes);
	family(f, "ferryd_peak_resident_memory_bytes", "gauge",
	       "ferryd's peak resident memory (VmHWM).");
	fprintf(f, "ferryd_peak_resident_memory_bytes %llu\n",
		(unsigned long long)d->peak_rss_bytes);
	family(f, "ferryd_control_connections", "gauge", "Open control connections.");
	fprintf(f, "ferryd_control_connections %u\n", in->connections);
	family(f, "ferryd_mounts", "gauge", "Mounts served, by mode.");
	for (j = 0; j < SERVE_NR_MODES; j++) {
		for (n = 0, i = 0; i < nr; i++)
			n += !strcmp(ms[i].mode, in->modes[j]);
		fprintf(f, "ferryd_mounts{mode=\"%s\"} %zu\n", in->modes[j], n);
	}
	family(f, "ferryd_takeovers_total", "counter",
	       "Mounts this ferryd took over from a dead or replaced ferryd, by mode.");
	for (j = 0; j < SERVE_NR_MODES; j++)
		fprintf(f, "ferryd_takeovers_total{mode=\"%s\"} %u\n", in->modes[j],
			in->takeovers[j]);
	family(f, "ferryd_keeper_restarts_total", "counter",
	       "Keepers this ferryd started again after one died.");
	fprintf(f, "ferryd_keeper_restarts_total %u\n", in->keeper_restarts);
#define M(name, type, help, field) \
	per_mount(f, ms, nr, name, type, help, offsetof(struct ctl_mount_stats, field))
	M("ferryd_read_bytes_total", "counter", "File bytes read through the mount.", bytes_read);
	M("ferryd_fetched_bytes_total", "counter", "Compressed bytes fetched from the blob sources.",
	  bytes_fetched);
	M("ferryd_prefetched_bytes_total", "counter", "Bytes made present by prefetch.",
	  bytes_prefetched);
	M("ferryd_readahead_bytes_total", "counter",
	  "Bytes stored in the page cache ahead of readers (FUSE).", readahead_bytes);
	M("ferryd_evicted_bytes_total", "counter",
	  "Bytes of the image's blobs evicted from the chunk cache (--cache-max-size).",
	  bytes_evicted);
	M("ferryd_present_bytes", "gauge", "Bytes of the image's blobs present in the chunk cache.",
	  bytes_present);
	M("ferryd_present_chunks", "gauge", "Chunks of the image's blobs present in the chunk cache.",
	  chunks_present);
	M("ferryd_chunks", "gauge", "Chunks of the image's blobs.", chunks_total);
	M("ferryd_cache_hits_total", "counter",
	  "Chunk ranges of demand reads (one per chunk touched) found present.", hits);
	M("ferryd_cache_misses_total", "counter",
	  "Chunk ranges of demand reads that had to be fetched.", misses);
	M("ferryd_fetch_errors_total", "counter",
	  "Demand reads that failed (registry down, corrupt chunk: the reader got EIO).",
	  fetch_errors);
	M("ferryd_in_flight_reads", "gauge", "Demand reads waiting for their chunks now.", inflight);
	M("ferryd_registry_requests_total", "counter", "HTTP requests sent to the registry.",
	  requests);
	M("ferryd_registry_retries_total", "counter", "Registry requests retried after an error.",
	  retries);
#undef M
	miss_histogram(f, ms, nr);
	if (ferror(f) | fclose(f))
		ret = -ENOMEM;
	if (!ret) {
		*out = text;
		text = NULL;
	}
	free(text);
	return ret;
}

int serve_metrics_text(struct serve_ctx *ctx, const struct ctl_ping_reply *daemon,
		       unsigned int connections, char **out)
{
	struct serve_metrics in = { .daemon = daemon, .connections = connections };
	struct ctl_list_reply lr = { 0 };
	unsigned int i;
	int ret;

	ret = serve_list(ctx, &lr.mounts, &lr.nr_mounts);
	in.mounts = lr.mounts;
	in.nr_mounts = lr.nr_mounts;
	for (i = 0; i < SERVE_NR_MODES; i++) {
		in.modes[i] = serve_modes[i]->name;
		in.takeovers[i] = atomic_load(&ctx->takeovers[i]);
	}
	in.keeper_restarts = atomic_load(&ctx->keeper_restarts);
	if (!ret)
		ret = serve_metrics_render(&in, out);
	ctl_list_reply_free(&lr);
	return ret;
}

