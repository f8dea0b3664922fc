// SPDX-License-Identifier: MIT
/*
 * Parsers for the header values a registry sends: WWW-Authenticate
 * (RFC 9110 §11), Content-Range and the upload Range header, Link
 * (RFC 8288, for tag pagination) and Retry-After. All of them take the
 * raw bytes with a length, never read past it, reject control bytes and
 * check every number for overflow: the input comes from the network.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>


#include "../pkg-base/base.h"
#include "internal.h"

/* RFC 9110 tchar. */
static bool is_tchar(char c)
{
	if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
	    (c >= '0' && c <= '9'))
		return true;
	return c && strchr("!#$%&'*+-.^_`|~", c);
}

static bool is_alnum_c(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
	       (c >= '0' && c <= '9');
}

static bool is_ows(char c)
{
	return c == ' ' || c == '\t';
}

/* Visible ASCII, space and tab: what a header value may carry here. */
static bool is_text(char c)
{
	return (c >= 0x20 && c < 0x7f) || c == '\t';
}

static size_t skip_ows(const char *s, size_t i, size_t len)
{
	while (i < len && is_ows(s[i]))
		i++;
	return i;
}

static size_t tchar_run(const char *s, size_t i, size_t len)
{
	size_t n = 0;

	while (i + n < len && is_tchar(s[i + n]))
		n++;
	return n;
}

/*
 * A parameter value at s[*i]: quoted-string (backslash escapes) or, to be
 * lenient with servers that forget quotes, a run of bytes up to ',' or
 * whitespace. Copied NUL-terminated into @out (@cap bytes; @out may be
 * NULL to skip). -EINVAL when malformed or longer than @cap - 1.
 */
/* Append one value byte: -EINVAL if it is not text or @out is full. */
static int value_byte(char c, char *out, size_t cap, size_t *n)
{
	if (!is_text(c))
		return -EINVAL;
	if (out) {
		if (*n + 1 >= cap)
			return -EINVAL;
		out[*n] = c;
	}
	(*n)++;
	return 0;
}

static int param_value(const char *s, size_t *i, size_t len, char *out,
		       size_t cap)
{
	size_t j = *i, n = 0;

	if (j < len && s[j] == '"') {
		for (j++;; j++) {
			if (j >= len)
				return -EINVAL;
			if (s[j] == '"')
				break;
			if (s[j] == '\\' && ++j >= len)
				return -EINVAL;
			if (value_byte(s[j], out, cap, &n))
				return -EINVAL;
		}
		j++;
	} else {
		for (; j < len && s[j] != ',' && !is_ows(s[j]); j++)
			if (value_byte(s[j], out, cap, &n))
				return -EINVAL;
	}
	if (out)
		out[n] = '\0';
	*i = j;
	return 0;
}

static bool name_is(const char *s, size_t len, const char *name)
{
	return strlen(name) == len && !strncasecmp(s, name, len);
}

/*
 * A token68 credential right after the scheme ("Negotiate abc=="): a run
 * of token68 characters and '=' padding that ends the challenge. Returns
 * its length, or 0 when what follows is an auth-param list.
 */
static size_t token68_len(const char *s, size_t i, size_t len)
{
	size_t j = i, k;

	while (j < len && (is_alnum_c(s[j]) || strchr("-._~+/", s[j])))
		j++;
	if (j == i)
		return 0;
	while (j < len && s[j] == '=')
		j++;
	k = skip_ows(s, j, len);
	if (k < len && s[k] != ',')
		return 0;
	/* "name=" at the very end is an empty param, not token68 padding. */
	return j - i;
}

int fetch_parse_www_auth(const char *s, size_t len,
			 struct fetch_challenge *out, int max)
{
	struct fetch_challenge *cur = NULL;
	int n = 0, nr_seen = 0;
	size_t i = 0;

	while (i < len) {
		size_t t, tl, j;

		while (i < len && (is_ows(s[i]) || s[i] == ','))
			i++;
		if (i >= len)
			break;
		t = i;
		tl = tchar_run(s, i, len);
		if (!tl)
			goto bad;
		i += tl;
		j = skip_ows(s, i, len);
		if (nr_seen && j < len && s[j] == '=') {
			/* auth-param of the current challenge */
			char *dst = NULL;
			size_t cap = 0;

			i = skip_ows(s, j + 1, len);
			if (cur && name_is(s + t, tl, "realm")) {
				dst = cur->realm;
				cap = sizeof(cur->realm);
			} else if (cur && name_is(s + t, tl, "service")) {
				dst = cur->service;
				cap = sizeof(cur->service);
			} else if (cur && name_is(s + t, tl, "scope")) {
				dst = cur->scope;
				cap = sizeof(cur->scope);
			} else if (cur && name_is(s + t, tl, "error")) {
				dst = cur->error;
				cap = sizeof(cur->error);
			}
			if (param_value(s, &i, len, dst, cap)) {
				/* No half values: drop what was copied. */
				if (dst)
					dst[0] = '\0';
				goto bad;
			}
			i = skip_ows(s, i, len);
			if (i < len && s[i] != ',')
				goto bad;
			continue;
		}
		/* A new challenge: "scheme [token68 | params]". */
		nr_seen++;
		cur = n < max ? &out[n++] : NULL;
		if (cur) {
			memset(cur, 0, sizeof(*cur));
			if (name_is(s + t, tl, "basic"))
				cur->scheme = FETCH_CHAL_BASIC;
			else if (name_is(s + t, tl, "bearer"))
				cur->scheme = FETCH_CHAL_BEARER;
			else
				cur->scheme = FETCH_CHAL_OTHER;
		}
		if (j > i) {
			size_t k = token68_len(s, j, len);

			i = j + k;
		}
		if (nr_seen > 64)
			break;
	}
	return n ? n : -EINVAL;
bad:
	/* Keep what parsed cleanly before the junk: servers are sloppy. */
	return n ? n : -EINVAL;
}

/* Decimal digits at s[*i] into *@v; -EINVAL when none or overflowing. */
static int parse_u64(const char *s, size_t *i, size_t len, uint64_t *v)
{
	size_t j = *i;
	uint64_t x = 0;

	if (j >= len || s[j] < '0' || s[j] > '9')
		return -EINVAL;
	for (; j < len && s[j] >= '0' && s[j] <= '9'; j++) {
		unsigned d = (unsigned)(s[j] - '0');

		if (x > (UINT64_MAX - d) / 10)
			return -EINVAL;
		x = x * 10 + d;
	}
	*i = j;
	*v = x;
	return 0;
}

int fetch_parse_content_range(const char *s, size_t len,
			      struct fetch_content_range *out)
{
	size_t i = skip_ows(s, 0, len);
	uint64_t first = FETCH_RANGE_UNKNOWN, last = FETCH_RANGE_UNKNOWN;
	uint64_t total = FETCH_RANGE_UNKNOWN;

	if (len - i < 6 || strncasecmp(s + i, "bytes", 5) || !is_ows(s[i + 5]))
		return -EINVAL;
	i = skip_ows(s, i + 5, len);
	if (i < len && s[i] == '*') {
		i++;
	} else {
		if (parse_u64(s, &i, len, &first) || i >= len || s[i] != '-')
			return -EINVAL;
		i++;
		if (parse_u64(s, &i, len, &last) || last < first)
			return -EINVAL;
	}
	if (i >= len || s[i] != '/')
		return -EINVAL;
	i++;
	if (i < len && s[i] == '*') {
		/* Both parts unknown says nothing at all. */
		if (first == FETCH_RANGE_UNKNOWN)
			return -EINVAL;
		i++;
	} else if (parse_u64(s, &i, len, &total) ||
		   total == FETCH_RANGE_UNKNOWN) {
		return -EINVAL;
	}
	if (skip_ows(s, i, len) != len)
		return -EINVAL;
	if (first != FETCH_RANGE_UNKNOWN && total != FETCH_RANGE_UNKNOWN &&
	    last >= total)
		return -EINVAL;
	out->first = first;
	out->last = last;
	out->total = total;
	return 0;
}

int fetch_parse_upload_range(const char *s, size_t len, uint64_t *last)
{
	size_t i = skip_ows(s, 0, len);
	uint64_t first, end;

	if (len - i >= 6 && !strncasecmp(s + i, "bytes=", 6))
		i += 6;
	if (parse_u64(s, &i, len, &first) || first != 0 || i >= len ||
	    s[i] != '-')
		return -EINVAL;
	i++;
	if (parse_u64(s, &i, len, &end) || skip_ows(s, i, len) != len)
		return -EINVAL;
	*last = end;
	return 0;
}

/* Does a rel value (space-separated relation types) name "next"? */
static bool rel_has_next(const char *v)
{
	const char *p = v;

	while (*p) {
		size_t n;

		while (*p == ' ' || *p == '\t')
			p++;
		n = strcspn(p, " \t");
		if (n == 4 && !strncasecmp(p, "next", 4))
			return true;
		p += n;
	}
	return false;
}

int fetch_parse_link_next(const char *s, size_t len, char *url, size_t cap)
{
	size_t i = 0;
	int links = 0;

	while (i < len) {
		size_t u, ul;
		bool next = false;

		while (i < len && (is_ows(s[i]) || s[i] == ','))
			i++;
		if (i >= len)
			break;
		if (s[i] != '<' || ++links > 64)
			return -EINVAL;
		u = ++i;
		while (i < len && s[i] != '>') {
			if (!is_text(s[i]) || is_ows(s[i]))
				return -EINVAL;
			i++;
		}
		if (i >= len)
			return -EINVAL;
		ul = i - u;
		i++;
		/* ; name[=value] ... up to ',' or the end */
		for (;;) {
			char value[256];
			size_t t, tl;

			i = skip_ows(s, i, len);
			if (i >= len || s[i] == ',')
				break;
			if (s[i] != ';')
				return -EINVAL;
			i = skip_ows(s, i + 1, len);
			t = i;
			tl = tchar_run(s, i, len);
			if (!tl)
				return -EINVAL;
			i = skip_ows(s, i + tl, len);
			if (i >= len || s[i] != '=')
				continue;
			i = skip_ows(s, i + 1, len);
			if (param_value(s, &i, len, value, sizeof(value)))
				return -EINVAL;
			if (name_is(s + t, tl, "rel") && rel_has_next(value))
				next = true;
		}
		if (next) {
			if (!ul || ul >= cap)
				return -EINVAL;
			memcpy(url, s + u, ul);
			url[ul] = '\0';
			return 1;
		}
	}
	return 0;
}

static int two_digits(const char *s, int *v)
{
	if (s[0] < '0' || s[0] > '9' || s[1] < '0' || s[1] > '9')
		return -EINVAL;
	*v = (s[0] - '0') * 10 + (s[1] - '0');
	return 0;
}

/* IMF-fixdate "Sun, 06 Nov 1994 08:49:37 GMT" (RFC 9110 §5.6.7). */
static int parse_imf_date(const char *s, size_t len, time_t *out)
{
	static const char months[] = "JanFebMarAprMayJunJulAugSepOctNovDec";
	static const char days[] = "SunMonTueWedThuFriSat";
	struct tm tm = { 0 };
	int d, hh, mm, ss, y1, y2, m;
	const char *p;

	if (len != 29 || s[3] != ',' || s[4] != ' ' || s[7] != ' ' ||
	    s[11] != ' ' || s[16] != ' ' || s[19] != ':' || s[22] != ':' ||
	    s[25] != ' ' || memcmp(s + 26, "GMT", 3))
		return -EINVAL;
	for (p = days; *p; p += 3)
		if (!memcmp(p, s, 3))
			break;
	if (!*p)
		return -EINVAL;
	for (m = 0; m < 12; m++)
		if (!memcmp(months + 3 * m, s + 8, 3))
			break;
	if (m == 12 || two_digits(s + 5, &d) || two_digits(s + 12, &y1) ||
	    two_digits(s + 14, &y2) || two_digits(s + 17, &hh) ||
	    two_digits(s + 20, &mm) || two_digits(s + 23, &ss))
		return -EINVAL;
	if (d < 1 || d > 31 || hh > 23 || mm > 59 || ss > 60)
		return -EINVAL;
	tm.tm_mday = d;
	tm.tm_mon = m;
	tm.tm_year = y1 * 100 + y2 - 1900;
	tm.tm_hour = hh;
	tm.tm_min = mm;
	tm.tm_sec = ss;
	*out = timegm(&tm);
	return *out == (time_t)-1 ? -EINVAL : 0;
}

int fetch_parse_retry_after(const char *s, size_t len, time_t now,
			    unsigned int *ms)
{
	size_t i = skip_ows(s, 0, len), end = len;
	uint64_t secs;

	while (end > i && is_ows(s[end - 1]))
		end--;
	if (i == end)
		return -EINVAL;
	if (s[i] >= '0' && s[i] <= '9') {
		size_t j = i;

		/* Too many digits to fit is simply "a long time". */
		if (parse_u64(s, &j, end, &secs)) {
			while (j < end && s[j] >= '0' && s[j] <= '9')
				j++;
			secs = UINT64_MAX;
		}
		if (j != end)
			return -EINVAL;
	} else {
		time_t when;

		if (parse_imf_date(s + i, end - i, &when))
			return -EINVAL;
		secs = when > now ? (uint64_t)(when - now) : 0;
	}
	*ms = secs >= FETCH_RETRY_AFTER_MAX_MS / 1000 ?
		      FETCH_RETRY_AFTER_MAX_MS :
		      (unsigned int)secs * 1000;
	return 0;
}

