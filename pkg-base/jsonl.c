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

int jsonl_send_fd(int fd, struct json_object *msg, size_t max, int pass)
{
	const char *s = json_object_to_json_string_ext(msg, JSON_C_TO_STRING_PLAIN |
						       JSON_C_TO_STRING_NOSLASHESCAPE);
	size_t len = strlen(s), off = 0;
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} ctl;
	struct iovec iov;
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
	struct cmsghdr *c;
	char nl = '\n';
	ssize_t n;

	if (len + 1 > max)
		return -EMSGSIZE;
	/* Plain JSON never holds a raw newline: strings escape it. */
	while (off < len) {
		iov = (struct iovec){ .iov_base = (char *)s + off, .iov_len = len - off };
		if (pass >= 0 && !off) {
			/* With the line's first bytes. */
			memset(&ctl, 0, sizeof(ctl));
			mh.msg_control = ctl.buf;
			mh.msg_controllen = sizeof(ctl.buf);
			c = CMSG_FIRSTHDR(&mh);
			c->cmsg_level = SOL_SOCKET;
			c->cmsg_type = SCM_RIGHTS;
			c->cmsg_len = CMSG_LEN(sizeof(int));
			memcpy(CMSG_DATA(c), &pass, sizeof(int));
		} else {
			mh.msg_control = NULL;
			mh.msg_controllen = 0;
		}
		n = sendmsg(fd, &mh, MSG_NOSIGNAL);
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

int jsonl_send(int fd, struct json_object *msg, size_t max)
{
	return jsonl_send_fd(fd, msg, max, -1);
}

void jsonl_reader_init(struct jsonl_reader *r, int fd, size_t max)
{
	memset(r, 0, sizeof(*r));
	r->fd = fd;
	r->max = max;
	r->passed = -1;
}

void jsonl_reader_free(struct jsonl_reader *r)
{
	if (r->passed >= 0)
		close(r->passed);
	r->passed = -1;
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

/*
 * recv(2) that keeps a descriptor passed along (SCM_RIGHTS) in r->passed,
 * the newest one: a sender passes at most one per request.
 */
static ssize_t recv_fd(struct jsonl_reader *r, char *buf, size_t len)
{
	union {
		char buf[CMSG_SPACE(4 * sizeof(int))];
		struct cmsghdr align;
	} ctl;
	struct iovec iov = { .iov_base = buf, .iov_len = len };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1,
			     .msg_control = ctl.buf, .msg_controllen = sizeof(ctl.buf) };
	struct cmsghdr *c;
	ssize_t n = recvmsg(r->fd, &mh, MSG_CMSG_CLOEXEC);
	size_t i, nr;
	int fd;

	for (c = n < 0 ? NULL : CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		nr = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (i = 0; i < nr; i++) {
			memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
			if (r->passed >= 0)
				close(r->passed);
			r->passed = fd;
		}
	}
	return n;
}

int jsonl_take_fd(struct jsonl_reader *r)
{
	int fd = r->passed;

	r->passed = -1;
	return fd;
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
		n = recv_fd(r, r->buf + r->len, r->cap - r->len - 1);
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
