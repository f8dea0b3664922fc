// SPDX-License-Identifier: MIT
#include "base.h"

#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int ferry_log_level = FERRY_LOG_INFO;
bool ferry_progress_enabled;

static const char *const level_names[] = { "error", "warning", "info", "debug" };

void ferry_log(int level, const char *fmt, ...)
{
	char line[2048];
	va_list ap;
	int n;

	if (level > ferry_log_level)
		return;
	n = snprintf(line, sizeof(line), "ferry: %s: ", level_names[level]);
	va_start(ap, fmt);
	vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
	va_end(ap);
	/* One write per line so concurrent threads do not interleave. */
	fprintf(stderr, "%s\n", line);
}

const char *ferry_strerror(int negative_errno)
{
	if (negative_errno == -EFSCORRUPTED)
		return "corrupt data";
	return strerror(-negative_errno);
}

int read_full(int fd, void *buf, size_t len)
{
	uint8_t *p = buf;

	while (len) {
		ssize_t n = read(fd, p, len);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			return -EIO;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

int pread_full(int fd, void *buf, size_t len, uint64_t off)
{
	uint8_t *p = buf;

	while (len) {
		ssize_t n = pread(fd, p, len, (off_t)off);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			return -EIO;
		p += n;
		off += (uint64_t)n;
		len -= (size_t)n;
	}
	return 0;
}

/*
 * The regular file open at @fd, at most @max bytes, as read_file_max says;
 * closes @fd. Its size is taken once: a file growing meanwhile (or a
 * device, refused anyway) cannot make the read unbounded.
 */
static int read_fd_max(int fd, size_t max, char **data, size_t *len)
{
	struct stat st;
	char *buf = NULL;
	int ret;

	if (fd < 0)
		return -errno;
	if (fstat(fd, &st)) {
		ret = -errno;
		goto out;
	}
	if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size > max) {
		ret = S_ISREG(st.st_mode) ? -EFBIG : -EINVAL;
		goto out;
	}
	buf = malloc((size_t)st.st_size + 1);
	if (!buf) {
		ret = -ENOMEM;
		goto out;
	}
	ret = read_full(fd, buf, (size_t)st.st_size);
	if (ret)
		goto out;
	buf[st.st_size] = '\0';
	*data = buf;
	*len = (size_t)st.st_size;
	buf = NULL;
out:
	free(buf);
	close(fd);
	return ret;
}

/* O_NONBLOCK: opening a FIFO planted there must not wait for a writer. */
int read_file_max(const char *path, size_t max, char **data, size_t *len)
{
	return read_fd_max(open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC), max, data, len);
}

int read_file_nofollow(const char *path, size_t max, char **data, size_t *len)
{
	return read_fd_max(open(path, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC),
			   max, data, len);
}

int write_full(int fd, const void *buf, size_t len)
{
	const uint8_t *p = buf;

	while (len) {
		ssize_t n = write(fd, p, len);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

int pwrite_full(int fd, const void *buf, size_t len, uint64_t off)
{
	const uint8_t *p = buf;

	while (len) {
		ssize_t n = pwrite(fd, p, len, (off_t)off);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += n;
		off += (uint64_t)n;
		len -= (size_t)n;
	}
	return 0;
}

int array_reserve(void *arr, size_t *cap, size_t need, size_t elem_size,
		  size_t min_cap)
{
	void **array = arr, *n;
	size_t new_cap = *cap ? *cap : min_cap;

	if (need <= *cap)
		return 0;
	while (new_cap < need) {
		if (new_cap > SIZE_MAX / 2 / elem_size)
			return -ENOMEM;
		new_cap *= 2;
	}
	n = realloc(*array, new_cap * elem_size);
	if (!n)
		return -ENOMEM;
	*array = n;
	*cap = new_cap;
	return 0;
}

void hex_encode(const uint8_t *in, size_t len, char *out)
{
	static const char digits[] = "0123456789abcdef";
	size_t i;

	for (i = 0; i < len; i++) {
		out[2 * i] = digits[in[i] >> 4];
		out[2 * i + 1] = digits[in[i] & 15];
	}
	out[2 * len] = '\0';
}

int hex_digit(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

int hex_decode(const char *in, uint8_t *out, size_t len)
{
	size_t i;

	for (i = 0; i < len; i++) {
		int hi = hex_digit(in[2 * i]), lo;

		if (hi < 0)
			return -EINVAL;
		lo = hex_digit(in[2 * i + 1]);
		if (lo < 0)
			return -EINVAL;
		out[i] = (uint8_t)(hi << 4 | lo);
	}
	return in[2 * len] == '\0' ? 0 : -EINVAL;
}

int parse_size(const char *s, uint64_t *out)
{
	unsigned long long v;
	unsigned int shift = 0;
	char *end;

	if (!*s || *s == '-')
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s)
		return -EINVAL;
	switch (*end) {
	case '\0':
		break;
	case 'k': case 'K':
		shift = 10;
		break;
	case 'm': case 'M':
		shift = 20;
		break;
	case 'g': case 'G':
		shift = 30;
		break;
	default:
		return -EINVAL;
	}
	if (*end && end[1] && strcmp(end + 1, "iB") && strcmp(end + 1, "B"))
		return -EINVAL;
	if (shift && v > (UINT64_MAX >> shift))
		return -EINVAL;
	*out = (uint64_t)v << shift;
	return 0;
}

uint64_t ferry_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void ferry_deadline_ts(struct timespec *ts, unsigned int ms)
{
	clock_gettime(CLOCK_REALTIME, ts);
	ts->tv_sec += ms / 1000;
	ts->tv_nsec += (long)(ms % 1000) * 1000000;
	if (ts->tv_nsec >= 1000000000) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000;
	}
}

unsigned int online_cpus(unsigned int max)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);

	return n < 1 ? 1 : (unsigned int)MIN((unsigned long)n, (unsigned long)max);
}

/* "512 B", "3.4 KiB", "12.0 MiB", "1.5 GiB": at most 9 characters. */
static void human_size(uint64_t n, char *buf, size_t len)
{
	static const char *const units[] = { "KiB", "MiB", "GiB", "TiB", "PiB" };
	double v = (double)n;
	size_t u = 0;

	if (n < 1024) {
		snprintf(buf, len, "%llu B", (unsigned long long)n);
		return;
	}
	for (v /= 1024; v >= 1000 && u + 1 < ARRAY_SIZE(units); u++)
		v /= 1024;
	snprintf(buf, len, "%.1f %s", v, units[u]);
}

/* A UTF-8 continuation byte: not where a character starts. */
static bool utf8_cont(char c)
{
	return ((unsigned char)c & 0xc0) == 0x80;
}

/*
 * Columns of the UTF-8 character at @s: two from U+0800 up, where East
 * Asian wide characters are (a narrow one there is cut early, never
 * wraps the line); the C locale ferry runs in has no wcwidth for them.
 */
static size_t utf8_width(const char *s)
{
	return (unsigned char)*s >= 0xe0 ? 2 : 1;
}

/* The bytes of @s's first whole characters that fit in @cols columns. */
static size_t utf8_prefix(const char *s, size_t cols)
{
	size_t i = 0;

	while (s[i] && utf8_width(s + i) <= cols) {
		cols -= utf8_width(s + i);
		for (i++; utf8_cont(s[i]); i++)
			;
	}
	return i;
}

/*
 * @what with every "sha256:<64 hex>" cut to 12 hex digits, as docker shows
 * them, and control characters as '?' (a name may come from an image).
 * Cut short by @len, it ends before the character that did not fit.
 */
static void short_digests(const char *what, char *buf, size_t len)
{
	size_t o = 0;

	while (*what && o + 1 < len) {
		if (!strncmp(what, "sha256:", 7) && strspn(what + 7, "0123456789abcdef") >= 64) {
			o += (size_t)snprintf(buf + o, len - o, "%.19s", what);
			what += 7 + 64;
		} else {
			unsigned char c = (unsigned char)*what++;

			buf[o++] = c < 0x20 || c == 0x7f ? '?' : (char)c;
		}
		o = MIN(o, len - 1);
	}
	if (utf8_cont(*what)) { /* cut inside a character: drop its first bytes */
		while (o && utf8_cont(buf[o - 1]))
			o--;
		o -= o > 0; /* its lead byte */
	}
	buf[o] = '\0';
}

/*
 * "LABEL  DONE / TOTAL  PCT%  RATE/s  ETA M:SS" in one line narrower than
 * the terminal (at most 80 columns: a wider one gains nothing), the label
 * cut first when it does not fit, between UTF-8 characters.
 */
static void progress_draw(struct ferry_progress *p)
{
	char label[128], done[16], total[16], rate[16], nums[112], eta[32] = "";
	double secs = (double)(ferry_now_ns() - p->start_ns) / 1e9;
	struct winsize ws;
	size_t width = 80, n, room;

	if (!ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) && ws.ws_col)
		width = MIN((size_t)ws.ws_col, width);
	width--; /* the last column would wrap on some terminals */
	short_digests(p->what, label, sizeof(label));
	human_size(p->done, done, sizeof(done));
	n = (size_t)snprintf(nums, sizeof(nums), "  %s", done);
	if (p->total) {
		human_size(p->total, total, sizeof(total));
		n += (size_t)snprintf(nums + n, sizeof(nums) - n, " / %s  %u%%", total,
				      (unsigned int)(MIN(p->done, p->total) * 100 / p->total));
	}
	if (secs >= 0.5 && p->done) {
		double bps = (double)p->done / secs;

		human_size((uint64_t)bps, rate, sizeof(rate));
		n += (size_t)snprintf(nums + n, sizeof(nums) - n, "  %s/s", rate);
		if (p->total > p->done) {
			uint64_t left = (uint64_t)((double)(p->total - p->done) / bps + 0.5);

			if (left >= 3600)
				snprintf(eta, sizeof(eta), "  ETA %llu:%02u:%02u",
					 (unsigned long long)(left / 3600),
					 (unsigned int)(left / 60 % 60),
					 (unsigned int)(left % 60));
			else
				snprintf(eta, sizeof(eta), "  ETA %u:%02u",
					 (unsigned int)(left / 60), (unsigned int)(left % 60));
		}
	}
	snprintf(nums + n, sizeof(nums) - n, "%s", eta);
	n = strlen(nums);
	/* The numbers first; what is left for the label, "..." where cut. */
	if (n > width)
		nums[n = width] = '\0';
	room = width - n;
	if (label[utf8_prefix(label, room)]) { /* wider than room */
		size_t cut = room > 3 ? utf8_prefix(label, room - 3) : 0;

		snprintf(label + cut, sizeof(label) - cut, "%s", room > 3 ? "..." : "");
	}
	fprintf(stderr, "\r\033[K%s%s", label, nums);
	p->drawn = true;
}

void ferry_progress_begin(struct ferry_progress *p, const char *what,
			  uint64_t total)
{
	*p = (struct ferry_progress){ .what = what, .total = total,
				      .start_ns = ferry_now_ns() };
	if (!isatty(STDERR_FILENO))
		p->what = NULL;
}

void ferry_progress_add(struct ferry_progress *p, uint64_t n)
{
	uint64_t now;

	p->done += n;
	if (!ferry_progress_enabled || !p->what)
		return;
	now = ferry_now_ns();
	if (now - p->last_draw_ns < 100000000ull)
		return;
	p->last_draw_ns = now;
	progress_draw(p);
}

void ferry_progress_end(struct ferry_progress *p)
{
	if (p->drawn)
		fprintf(stderr, "\r\033[K");
	p->drawn = false;
}

void digest_format(const uint8_t d[32], char out[DIGEST_STRING_SIZE])
{
	memcpy(out, "sha256:", 7);
	hex_encode(d, 32, out + 7);
}

int digest_parse(const char *s, uint8_t out[32])
{
	if (!s || strncmp(s, "sha256:", 7) || strlen(s) != 7 + 64 || !hex_is_lower(s + 7, 64))
		return -EINVAL;
	return hex_decode(s + 7, out, 32);
}

bool hex_is_lower(const char *s, size_t len)
{
	size_t i;

	for (i = 0; i < len; i++)
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return false;
	return true;
}

bool mem_is_zero(const void *p, size_t len)
{
	static const uint8_t zeros[4096];
	const uint8_t *b = p;

	while (len >= sizeof(zeros)) {
		if (memcmp(b, zeros, sizeof(zeros)))
			return false;
		b += sizeof(zeros);
		len -= sizeof(zeros);
	}
	return !memcmp(b, zeros, len);
}
