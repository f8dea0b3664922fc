// SPDX-License-Identifier: MIT
/*
 * ferryd's metrics in the Prometheus text exposition format (0.0.4),
 * built from the same per-mount statistics as a list answer, so the two
 * never disagree; and the optional HTTP endpoint that serves them
 * (--metrics-listen: a unix socket, or TCP for a scraper on the network,
 * off unless asked for). The endpoint answers "GET /metrics" only, one
 * connection at a time with a short deadline, and reads nothing else: it
 * must never hold up the daemon.
 */
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "ferryd.h"

#define HTTP_DEADLINE_MS 5000
#define HTTP_REQUEST_MAX 4096

void daemon_memory(uint64_t *rss, uint64_t *peak)
{
	FILE *f = fopen("/proc/self/status", "re");
	unsigned long long kb;
	char line[256];

	*rss = *peak = 0;
	while (f && fgets(line, sizeof(line), f)) {
		if (sscanf(line, "VmRSS: %llu kB", &kb) == 1)
			*rss = kb * 1024;
		else if (sscanf(line, "VmHWM: %llu kB", &kb) == 1)
			*peak = kb * 1024;
	}
	if (f)
		fclose(f);
}

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

int metrics_text(char **out)
{
	static const char *const modes[] = { "fuse", "fanotify", "cachefiles" };
	struct ctl_ping_reply info, *d = &info;
	struct ctl_mount_stats *ms = NULL;
	size_t nr = 0, len = 0, i, j, n;
	char *text = NULL;
	FILE *f;
	int ret;

	daemon_info(&info);
	ret = mounts_list(&ms, &nr);
	f = ret ? NULL : open_memstream(&text, &len);
	if (!f) {
		ret = ret ?: -ENOMEM;
		goto out;
	}
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
	fprintf(f, "ferryd_control_connections %u\n", daemon_connections());
	family(f, "ferryd_mounts", "gauge", "Mounts served, by mode.");
	for (j = 0; j < ARRAY_SIZE(modes); j++) {
		for (n = 0, i = 0; i < nr; i++)
			n += !strcmp(ms[i].mode, modes[j]);
		fprintf(f, "ferryd_mounts{mode=\"%s\"} %zu\n", modes[j], n);
	}
	family(f, "ferryd_takeovers_total", "counter",
	       "Mounts this ferryd took over from a dead or replaced ferryd, by mode.");
	for (j = 0; j < ARRAY_SIZE(modes); j++)
		fprintf(f, "ferryd_takeovers_total{mode=\"%s\"} %u\n", modes[j],
			mounts_takeovers(modes[j]));
	family(f, "ferryd_keeper_restarts_total", "counter",
	       "Keepers this ferryd started again after one died.");
	fprintf(f, "ferryd_keeper_restarts_total %u\n", atomic_load(&keeper_restarts));
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
	if ((ferror(f) | fclose(f)) && !ret)
		ret = -ENOMEM;
	if (!ret) {
		*out = text;
		text = NULL;
	}
out:
	free(text);
	if (ms) {
		struct ctl_list_reply lr = { .mounts = ms, .nr_mounts = nr };

		ctl_list_reply_free(&lr);
	}
	return ret;
}

/* "unix:PATH" or "HOST:PORT" ("[V6]:PORT"): a listening socket, or -errno. */
static int listen_on(const char *addr, int *out)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
				  .ai_flags = AI_PASSIVE | AI_NUMERICSERV };
	struct addrinfo *ai = NULL;
	char host[256];
	const char *colon = strrchr(addr, ':');
	size_t hlen;
	ino_t ino;
	int fd = -1, one = 1, ret;

	if (!strncmp(addr, "unix:", 5))
		return addr[5] == '/' ? unix_listen(addr + 5, out, &ino) : -EINVAL;
	if (!colon || colon == addr || !colon[1])
		return -EINVAL;
	hlen = (size_t)(colon - addr);
	if (addr[0] == '[' && hlen >= 2 && addr[hlen - 1] == ']')
		addr++, hlen -= 2;
	if (hlen >= sizeof(host))
		return -EINVAL;
	memcpy(host, addr, hlen);
	host[hlen] = '\0';
	ret = getaddrinfo(host, colon + 1, &hints, &ai);
	if (ret)
		return ret == EAI_SYSTEM ? -errno : -EADDRNOTAVAIL;
	fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
	    bind(fd, ai->ai_addr, ai->ai_addrlen) || listen(fd, 16)) {
		ret = -errno;
		if (fd >= 0)
			close(fd);
	} else {
		*out = fd;
	}
	freeaddrinfo(ai);
	return ret;
}

/* Read the request head within the deadline: 0, or -errno (-ETIMEDOUT). */
static int read_head(int fd, char *buf, size_t max)
{
	uint64_t deadline = ferry_now_ns() + HTTP_DEADLINE_MS * 1000000ull, now;
	struct pollfd pfd = { .fd = fd, .events = POLLIN };
	size_t got = 0;
	ssize_t n;

	while (got < max - 1) {
		now = ferry_now_ns();
		if (now >= deadline || poll(&pfd, 1, (int)((deadline - now) / 1000000) + 1) <= 0)
			return -ETIMEDOUT;
		n = read(fd, buf + got, max - 1 - got);
		if (n <= 0)
			return n ? -errno : -ECONNRESET;
		got += (size_t)n;
		buf[got] = '\0';
		if (strstr(buf, "\r\n\r\n") || strstr(buf, "\n\n"))
			return 0;
	}
	return -EMSGSIZE;
}

static void answer(int fd, const char *status, const char *type, const char *body)
{
	char head[256];
	int n = snprintf(head, sizeof(head),
			 "HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
			 "Connection: close\r\n\r\n", status, type, strlen(body));

	if (!write_full(fd, head, (size_t)n))
		write_full(fd, body, strlen(body));
}

static void serve_one(int fd)
{
	char req[HTTP_REQUEST_MAX], *text = NULL;
	size_t path_len;
	int ret = read_head(fd, req, sizeof(req));

	if (ret)
		return;
	if (strncmp(req, "GET ", 4)) {
		answer(fd, "405 Method Not Allowed", "text/plain", "GET /metrics only\n");
		return;
	}
	path_len = strcspn(req + 4, " ?\r\n");
	if (path_len != 8 || strncmp(req + 4, "/metrics", 8)) {
		answer(fd, "404 Not Found", "text/plain", "ferryd serves /metrics only\n");
		return;
	}
	ret = metrics_text(&text);
	if (ret)
		answer(fd, "500 Internal Server Error", "text/plain", ferry_strerror(ret));
	else
		answer(fd, "200 OK", "text/plain; version=0.0.4; charset=utf-8", text);
	free(text);
}

static void *serve_main(void *arg)
{
	int lfd = (int)(intptr_t)arg, fd;

	for (;;) {
		fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno != EINTR && errno != ECONNABORTED && errno != EAGAIN) {
				ferry_err("metrics endpoint: accept: %s", strerror(errno));
				/* Do not spin on a persistent error (EMFILE). */
				nanosleep(&(struct timespec){ 1, 0 }, NULL);
			}
			continue;
		}
		serve_one(fd);
		close(fd);
	}
	return NULL;
}

int metrics_start(const char *addr)
{
	pthread_attr_t attr;
	pthread_t t;
	int fd = -1, ret = listen_on(addr, &fd);

	if (ret) {
		ferry_err("--metrics-listen %s: %s (expected unix:/PATH or HOST:PORT)", addr,
			  ret == -EINVAL ? "malformed address" : ferry_strerror(ret));
		return ret;
	}
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	ret = -pthread_create(&t, &attr, serve_main, (void *)(intptr_t)fd);
	pthread_attr_destroy(&attr);
	if (ret) {
		ferry_err("--metrics-listen %s: cannot start its thread: %s", addr,
			  ferry_strerror(ret));
		close(fd);
		return ret;
	}
	return 0;
}
