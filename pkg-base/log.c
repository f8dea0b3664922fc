// SPDX-License-Identifier: MIT
/*
 * The daemons' log (ferryd and its keepers): ferry_log writes whole lines
 * to stderr, so stderr is replaced by a stream of our own (fopencookie)
 * that writes to fd 2 —
 * the terminal with -f, the log file otherwise, where each line gets a
 * timestamp — and copies this thread's error lines into an active
 * capture, so that a failed mount answers with the reason that was
 * logged ("image docker://…: manifest not found") instead of an errno.
 * When stderr is systemd's journal (JOURNAL_STREAM names it), each line
 * starts with its syslog priority ("<3>" for errors), which the journal
 * turns into the entry's level.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base.h"

static bool log_stamps;
static bool log_journal;
static bool log_at_bol = true; /* under the stream's lock */
static _Thread_local struct ferry_log_capture *log_cur;

#define ERR_PREFIX "ferry: error: "

static void capture(struct ferry_log_capture *c, const char *buf, size_t size)
{
	size_t plen = strlen(ERR_PREFIX), n;
	const char *nl;

	while (size) {
		if (!c->partial && !c->skipping) {
			if (size >= plen && !memcmp(buf, ERR_PREFIX, plen)) {
				buf += plen;
				size -= plen;
				if (c->len && c->len + 2 < sizeof(c->text)) {
					memcpy(c->text + c->len, "; ", 2);
					c->len += 2;
				}
				c->partial = true;
			} else {
				c->skipping = true;
			}
		}
		nl = memchr(buf, '\n', size);
		n = nl ? (size_t)(nl - buf) : size;
		if (c->partial) {
			size_t room = sizeof(c->text) - 1 - c->len;

			memcpy(c->text + c->len, buf, MIN(n, room));
			c->len += MIN(n, room);
			c->text[c->len] = '\0';
		}
		if (nl) {
			c->partial = c->skipping = false;
			n++;
		}
		buf += n;
		size -= n;
	}
}

/* The syslog priority of the ferry_log line starting at @p. */
static int journal_priority(const char *p, size_t len)
{
	static const struct {
		const char *prefix;
		int prio;
	} levels[] = { { "ferry: error: ", 3 }, { "ferry: warning: ", 4 },
		       { "ferry: debug: ", 7 } };
	size_t i;

	for (i = 0; i < ARRAY_SIZE(levels); i++)
		if (len >= strlen(levels[i].prefix) &&
		    !memcmp(p, levels[i].prefix, strlen(levels[i].prefix)))
			return levels[i].prio;
	return 6; /* info */
}

/* systemd sets JOURNAL_STREAM=DEV:INO for the stream it connects to stderr. */
static bool stderr_is_journal(void)
{
	const char *js = getenv("JOURNAL_STREAM");
	unsigned long long dev, ino;
	struct stat st;

	return js && sscanf(js, "%llu:%llu", &dev, &ino) == 2 &&
	       !fstat(STDERR_FILENO, &st) && st.st_dev == dev && st.st_ino == ino;
}

static ssize_t log_write(void *cookie, const char *buf, size_t size)
{
	char out[16384 + 64];
	size_t o = 0, i;

	(void)cookie;
	if (log_cur)
		capture(log_cur, buf, size);
	for (i = 0; i < size; i++) {
		if (log_at_bol && log_journal)
			o += (size_t)snprintf(out + o, 8, "<%d>", journal_priority(buf + i, size - i));
		if (log_at_bol && log_stamps) {
			struct timespec ts;
			struct tm tm;

			clock_gettime(CLOCK_REALTIME, &ts);
			localtime_r(&ts.tv_sec, &tm);
			o += strftime(out + o, 32, "%Y-%m-%d %H:%M:%S", &tm);
			o += (size_t)snprintf(out + o, 32, ".%03ld [%d] ",
					      ts.tv_nsec / 1000000, (int)getpid());
		}
		out[o++] = buf[i];
		log_at_bol = buf[i] == '\n';
		if (o >= sizeof(out) - 64) {
			write_full(STDERR_FILENO, out, o);
			o = 0;
		}
	}
	if (o)
		write_full(STDERR_FILENO, out, o);
	return (ssize_t)size;
}

int ferry_log_stream(bool timestamps)
{
	static const cookie_io_functions_t fns = { .write = log_write };
	FILE *f = fopencookie(NULL, "w", fns);

	if (!f)
		return -errno;
	/* Line buffered: one write per ferry_log line, in the caller's thread. */
	setvbuf(f, NULL, _IOLBF, 16384);
	log_stamps = timestamps;
	log_journal = stderr_is_journal();
	stderr = f;
	return 0;
}

void ferry_log_capture_begin(struct ferry_log_capture *c)
{
	memset(c, 0, sizeof(*c));
	c->prev = log_cur;
	log_cur = c;
}

void ferry_log_capture_end(struct ferry_log_capture *c)
{
	log_cur = c->prev;
}
