// SPDX-License-Identifier: MIT
/*
 * Local stream sockets carrying JSON lines: one JSON object per line, each
 * line bounded, read with an optional deadline. ferry and ferryd talk this
 * way; nothing here knows what the objects mean.
 */
#include <errno.h>
#include <json-c/json.h>
#include <limits.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "base.h"

static int unix_addr(const char *path, struct sockaddr_un *sa)
{
	memset(sa, 0, sizeof(*sa));
	sa->sun_family = AF_UNIX;
	if (strlen(path) >= sizeof(sa->sun_path))
		return -ENAMETOOLONG;
	strcpy(sa->sun_path, path);
	return 0;
}

int unix_connect(const char *path, int *out)
{
	struct sockaddr_un sa;
	int fd, ret = unix_addr(path, &sa);

	if (ret)
		return ret;
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
		ret = -errno;
		close(fd);
		return ret;
	}
	*out = fd;
	return 0;
}

int unix_listen(const char *path, int *out, ino_t *ino)
{
	struct sockaddr_un sa;
	struct stat st;
	mode_t old;
	int fd, ret = unix_addr(path, &sa);

	if (ret)
		return ret;
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -errno;
	if (unlink(path) && errno != ENOENT) {
		ret = -errno;
		goto fail;
	}
	old = umask(0177); /* mode 0600 from the start, never wider */
	ret = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
	umask(old);
	if (ret || listen(fd, 64) || stat(path, &st)) {
		ret = -errno;
		goto fail;
	}
	*ino = st.st_ino;
	*out = fd;
	return 0;
fail:
	close(fd);
	return ret;
}

int jsonl_send(int fd, struct json_object *msg, size_t max)
{
	const char *s = json_object_to_json_string_ext(msg, JSON_C_TO_STRING_PLAIN |
						       JSON_C_TO_STRING_NOSLASHESCAPE);
	size_t len = strlen(s), off = 0;
	char nl = '\n';
	ssize_t n;

	if (len + 1 > max)
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

void jsonl_reader_init(struct jsonl_reader *r, int fd, size_t max)
{
	memset(r, 0, sizeof(*r));
	r->fd = fd;
	r->max = max;
}

void jsonl_reader_free(struct jsonl_reader *r)
{
	free(r->buf);
	r->buf = NULL;
	r->len = r->cap = 0;
}

static int parse_line(struct jsonl_reader *r, size_t nl, struct json_object **out)
{
	size_t consumed;
	int ret;

	r->buf[nl] = '\0';
	ret = json_parse_object(r->buf, nl, out);
	/* @nl == r->len: a last line without its newline. */
	consumed = MIN(nl + 1, r->len);
	memmove(r->buf, r->buf + consumed, r->len - consumed);
	r->len -= consumed;
	return ret;
}

/* Wait until @r->fd is readable: 0, -ETIMEDOUT or -errno (-EINTR: again). */
static int wait_readable(const struct jsonl_reader *r, uint64_t deadline)
{
	struct pollfd pfd = { .fd = r->fd, .events = POLLIN };
	uint64_t now = ferry_now_ns();
	int ret;

	if (now >= deadline)
		return -ETIMEDOUT;
	ret = poll(&pfd, 1, (int)MIN((deadline - now) / 1000000u + 1, (uint64_t)INT_MAX));
	return ret < 0 ? -errno : ret ? 0 : -ETIMEDOUT;
}

int jsonl_recv(struct jsonl_reader *r, int timeout_ms, struct json_object **out)
{
	uint64_t deadline = timeout_ms < 0 ? 0 :
			    ferry_now_ns() + (uint64_t)timeout_ms * 1000000u;
	size_t scanned = 0, cap;
	char *nl, *p;
	ssize_t n;
	int ret;

	for (;;) {
		nl = r->len > scanned ? memchr(r->buf + scanned, '\n', r->len - scanned) :
					NULL;
		if (nl)
			return parse_line(r, (size_t)(nl - r->buf), out);
		scanned = r->len;
		if (r->len >= r->max)
			return -EMSGSIZE;
		if (r->cap - r->len < 4096) {
			cap = MIN(r->cap ? r->cap * 2 : 8192, r->max + 1);
			p = realloc(r->buf, cap);
			if (!p)
				return -ENOMEM;
			r->buf = p;
			r->cap = cap;
		}
		ret = timeout_ms < 0 ? 0 : wait_readable(r, deadline);
		if (ret == -EINTR)
			continue;
		if (ret)
			return ret;
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
