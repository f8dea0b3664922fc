// SPDX-License-Identifier: MIT
/*
 * ferryd's metrics endpoint: the Prometheus text (pkg-serve's
 * serve_metrics_text) over HTTP (--metrics-listen: a unix socket, or TCP
 * for a scraper on the network, off unless asked for); and the process's
 * memory, which the text and a ping show. The endpoint answers "GET /metrics" only, one
 * connection at a time with a short deadline, and reads nothing else: it
 * must never hold up the daemon.
 */
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
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
	ret = daemon_metrics_text(&text);
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
