// SPDX-License-Identifier: MIT
/*
 * ferryd's metrics endpoint: the Prometheus text (pkg-serve's
 * serve_metrics_text) over HTTP (--metrics-listen: a unix socket, or TCP
 * for a scraper on the network, off unless asked for); and the process's
 * memory, which the text and a ping show. The endpoint answers
 * "GET /metrics" only, reading its clients side by side with a short
 * deadline each, and reads nothing else: it must never hold up the daemon.
 * An address it cannot bind (a port another user holds, or the ferryd this
 * one succeeds) is tried again every second, never fatal: a ferryd that
 * will not start leaves its mounts without a server.
 */
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
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
	ret = daemon_metrics_text(&text);
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
