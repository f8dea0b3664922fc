// SPDX-License-Identifier: MIT
/*
 * ferryd's metrics in the Prometheus text exposition format (0.0.4),
 * built from the same per-mount statistics as a list answer, so the two
 * never disagree; and the optional HTTP endpoint that serves them
 * (--metrics-listen: a unix socket, or TCP for a scraper on the network,
 * off unless asked for). The endpoint answers "GET /metrics" only, reading
 * its clients side by side with a short deadline each, and reads nothing
 * else: it must never hold up the daemon. An address it cannot bind (a
 * port another user holds, or the ferryd this one succeeds) is tried
 * again every second, never fatal: a ferryd that will not start leaves
 * its mounts without a server.
 */
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
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

/* "unix:PATH" or "HOST:PORT" ("[V6]:PORT") split: 0, or -EINVAL. */
static int parse_addr(const char *addr, char *host, size_t hsize, const char **port)
{
	const char *colon = strrchr(addr, ':');
	size_t hlen;

	if (!strncmp(addr, "unix:", 5))
		return addr[5] == '/' ? 0 : -EINVAL;
	if (!colon || colon == addr || !colon[1])
		return -EINVAL;
	hlen = (size_t)(colon - addr);
	if (addr[0] == '[' && hlen >= 2 && addr[hlen - 1] == ']')
		addr++, hlen -= 2;
	if (hlen >= hsize)
		return -EINVAL;
	memcpy(host, addr, hlen);
	host[hlen] = '\0';
	*port = colon + 1;
	return 0;
}

/* A listening socket on @addr (parse_addr's form), or -errno. */
static int listen_on(const char *addr, int *out)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
				  .ai_flags = AI_PASSIVE | AI_NUMERICSERV };
	struct addrinfo *ai = NULL;
	char host[256];
	const char *port;
	ino_t ino;
	int fd = -1, one = 1, ret = parse_addr(addr, host, sizeof(host), &port);

	if (ret)
		return ret;
	if (!strncmp(addr, "unix:", 5))
		return unix_listen(addr + 5, out, &ino);
	ret = getaddrinfo(host, port, &hints, &ai);
	if (ret)
		return ret == EAI_SYSTEM ? -errno : -EADDRNOTAVAIL;
	fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
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

static void answer(int fd, const char *status, const char *type, const char *body)
{
	char head[256];
	int n = snprintf(head, sizeof(head),
			 "HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
			 "Connection: close\r\n\r\n", status, type, strlen(body));

	if (!write_full(fd, head, (size_t)n))
		write_full(fd, body, strlen(body));
}

/* Answer the request head @req (complete) on @fd. */
static void serve_one(int fd, const char *req)
{
	struct timeval send_limit = { .tv_sec = 1 };
	char *text = NULL;
	size_t path_len;
	int ret, blocking = 0;

	/* The answer is written whole, a client that does not read it
	 * holding the others up for a second at most. */
	ioctl(fd, FIONBIO, &blocking);
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &send_limit, sizeof(send_limit));
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

/*
 * The clients of one endpoint, read side by side: a client that connects
 * and sends nothing holds only its own slot, for HTTP_DEADLINE_MS (16
 * such held the one-at-a-time endpoint off for 28-30 s). With every slot
 * taken, the oldest client makes room for a new one.
 */
#define HTTP_CLIENTS_MAX 32
struct http_client {
	int fd;
	uint64_t deadline_ns;
	size_t got;
	char req[HTTP_REQUEST_MAX];
};

static void client_drop(struct http_client *c, unsigned int *nr, unsigned int i)
{
	close(c[i].fd);
	c[i] = c[--*nr]; /* order does not matter */
}

/* Read what client @c has sent: 1 once its head is complete, 0 for more, -1 to drop it. */
static int client_read(struct http_client *c)
{
	ssize_t n = read(c->fd, c->req + c->got, sizeof(c->req) - 1 - c->got);

	if (n <= 0)
		return n < 0 && (errno == EAGAIN || errno == EINTR) ? 0 : -1;
	c->got += (size_t)n;
	c->req[c->got] = '\0';
	if (strstr(c->req, "\r\n\r\n") || strstr(c->req, "\n\n"))
		return 1;
	return c->got < sizeof(c->req) - 1 ? 0 : -1;
}

static pthread_mutex_t endpoints_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t endpoints_cond = PTHREAD_COND_INITIALIZER;
static bool endpoints_stopping;
static unsigned int endpoints_open; /* listening sockets not yet closed */

static bool stopping(void)
{
	bool s;

	pthread_mutex_lock(&endpoints_lock);
	s = endpoints_stopping;
	pthread_mutex_unlock(&endpoints_lock);
	return s;
}

/* Serve @lfd until metrics_stop. */
static void serve(int lfd)
{
	struct pollfd pfd[1 + HTTP_CLIENTS_MAX];
	struct http_client *c = calloc(HTTP_CLIENTS_MAX, sizeof(*c));
	unsigned int nr = 0, i, oldest;
	uint64_t now, next;
	int fd, r;

	while (c && !stopping()) {
		now = ferry_now_ns();
		next = now + 250 * 1000000ull; /* a look at stopping() */
		pfd[0] = (struct pollfd){ .fd = lfd, .events = POLLIN };
		for (i = 0; i < nr; i++) {
			pfd[1 + i] = (struct pollfd){ .fd = c[i].fd, .events = POLLIN };
			next = MIN(next, c[i].deadline_ns);
		}
		if (poll(pfd, 1 + nr, next > now ? (int)((next - now) / 1000000) + 1 : 0) < 0 &&
		    errno != EINTR)
			break;
		now = ferry_now_ns();
		for (i = nr; i-- > 0;) {
			r = pfd[1 + i].revents ? client_read(&c[i]) : 0;
			if (r > 0)
				serve_one(c[i].fd, c[i].req);
			if (r || now >= c[i].deadline_ns)
				client_drop(c, &nr, i);
		}
		if (!(pfd[0].revents & POLLIN))
			continue;
		fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
		if (fd < 0) {
			if (errno != EINTR && errno != ECONNABORTED && errno != EAGAIN) {
				ferry_err("metrics endpoint: accept: %s", strerror(errno));
				/* Do not spin on a persistent error (EMFILE). */
				nanosleep(&(struct timespec){ 1, 0 }, NULL);
			}
			continue;
		}
		if (nr == HTTP_CLIENTS_MAX) {
			for (oldest = 0, i = 1; i < nr; i++)
				if (c[i].deadline_ns < c[oldest].deadline_ns)
					oldest = i;
			client_drop(c, &nr, oldest);
		}
		c[nr++] = (struct http_client){ .fd = fd,
						.deadline_ns = now + HTTP_DEADLINE_MS * 1000000ull };
	}
	for (i = 0; c && i < nr; i++)
		close(c[i].fd);
	free(c);
}

struct endpoint {
	const char *addr;
	int lfd; /* -1 until bound */
	int err; /* the last bind error logged */
};

/*
 * Bind (again every second while the address is taken: by the ferryd we
 * succeed, or by another user) and serve; never fatal, a failure is
 * logged once per cause.
 */
static void *endpoint_main(void *arg)
{
	struct endpoint *e = arg;
	struct timespec ts;
	int ret;

	while (e->lfd < 0) {
		pthread_mutex_lock(&endpoints_lock);
		if (!endpoints_stopping) {
			ferry_deadline_ts(&ts, 1000);
			pthread_cond_timedwait(&endpoints_cond, &endpoints_lock, &ts);
		}
		if (endpoints_stopping) {
			pthread_mutex_unlock(&endpoints_lock);
			goto out;
		}
		pthread_mutex_unlock(&endpoints_lock);
		ret = listen_on(e->addr, &e->lfd);
		if (ret && ret != e->err)
			ferry_warn("--metrics-listen %s: %s; trying again every second",
				   e->addr, ferry_strerror(ret));
		else if (!ret)
			ferry_info("--metrics-listen %s: listening now", e->addr);
		e->err = ret;
	}
	serve(e->lfd);
	close(e->lfd);
out:
	pthread_mutex_lock(&endpoints_lock);
	endpoints_open--;
	pthread_cond_broadcast(&endpoints_cond);
	pthread_mutex_unlock(&endpoints_lock);
	free(e);
	return NULL;
}

int metrics_start(const char *addr)
{
	struct endpoint *e = calloc(1, sizeof(*e));
	pthread_attr_t attr;
	const char *port;
	char host[256];
	pthread_t t;
	int ret = parse_addr(addr, host, sizeof(host), &port);

	if (ret || !e) {
		ferry_err("--metrics-listen %s: %s (expected unix:/PATH or HOST:PORT)", addr,
			  e ? "malformed address" : ferry_strerror(-ENOMEM));
		free(e);
		return ret ? ret : -ENOMEM;
	}
	e->addr = addr;
	/* At once where it can: the usual case needs no wait. */
	e->err = listen_on(addr, &e->lfd);
	if (e->err) {
		e->lfd = -1;
		ferry_warn("--metrics-listen %s: %s; trying again every second", addr,
			   ferry_strerror(e->err));
	}
	pthread_mutex_lock(&endpoints_lock);
	endpoints_open++;
	pthread_mutex_unlock(&endpoints_lock);
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	ret = -pthread_create(&t, &attr, endpoint_main, e);
	pthread_attr_destroy(&attr);
	if (ret) {
		ferry_err("--metrics-listen %s: cannot start its thread: %s", addr,
			  ferry_strerror(ret));
		pthread_mutex_lock(&endpoints_lock);
		endpoints_open--;
		pthread_mutex_unlock(&endpoints_lock);
		if (e->lfd >= 0)
			close(e->lfd);
		free(e);
		return ret;
	}
	return 0;
}

void metrics_stop(void)
{
	struct timespec ts;

	ferry_deadline_ts(&ts, 2000);
	pthread_mutex_lock(&endpoints_lock);
	endpoints_stopping = true;
	pthread_cond_broadcast(&endpoints_cond);
	while (endpoints_open)
		if (pthread_cond_timedwait(&endpoints_cond, &endpoints_lock, &ts) == ETIMEDOUT)
			break;
	pthread_mutex_unlock(&endpoints_lock);
}
