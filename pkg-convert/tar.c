// SPDX-License-Identifier: MIT
/*
 * Streaming tar reader: POSIX ustar, old GNU ("ustar  "), v7 and PAX.
 *
 * Headers are read from a 128 KiB buffer refilled from the byte source;
 * file data is copied out of that buffer, or read by the source straight
 * into the caller's buffer for large reads, so the reader adds no copy
 * beyond the decompressor's output.
 *
 * Semantics chosen where writers and readers disagree (documented here
 * because convert.c depends on them):
 * - End of archive: a zero block followed by a zero block or by the end
 *   of input; a clean end of input at a header boundary (umoci layers
 *   have no trailer); the end of input inside the padding after the last
 *   entry's data (umoci 0.4.7 omits it). A lone zero block followed by a
 *   header is corrupt, as in Go's archive/tar which containerd uses.
 * - Types 1-6 (links, devices, directories, FIFOs) carry no data whatever
 *   their size field says (POSIX; Go and Python agree, GNU tar does too
 *   for hard links and directories). Only regular files, GNU dumpdirs
 *   ('D', read as directories, data skipped), volume labels ('V', skipped)
 *   and unknown types have data. Unknown types are regular files with a
 *   warning, as POSIX and GNU tar say.
 * - PAX global headers ('g') give defaults for uid, gid, mtime and xattrs
 *   of all later entries; per-file values win, and an empty per-file
 *   value restores the header field. Global path, linkpath and size make
 *   no sense for many files and are ignored. Several 'x' headers before
 *   one entry: the last wins (as in Go).
 * - Empty xattr values are kept as empty values (GNU tar writes them so).
 */
#include "tar.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "../pkg-base/base.h"

#define TAR_BLOCK 512u
#define TAR_BUF_SIZE (128u * 1024)
#define TAR_META_MAX (1u << 20) /* PAX / long-name data of one header */
#define TAR_XATTR_MAX 1024u     /* xattrs in one PAX header set */
#define TAR_EOF 1               /* internal: input ended early */

/* Header fields: offset and width (ustar; GNU reuses the prefix area). */
#define F_NAME 0, 100
#define F_MODE 100, 8
#define F_UID 108, 8
#define F_GID 116, 8
#define F_SIZE 124, 12
#define F_MTIME 136, 12
#define OFF_CHKSUM 148
#define F_CHKSUM OFF_CHKSUM, 8
#define F_TYPEFLAG 156
#define F_LINKNAME 157, 100
#define F_MAGIC 257
#define F_DEVMAJOR 329, 8
#define F_DEVMINOR 337, 8
#define OFF_PREFIX 345
#define F_PREFIX OFF_PREFIX, 155

enum hdr_format { FMT_V7, FMT_USTAR, FMT_GNU };

/* PAX keys that override header fields. */
enum {
	PAX_PATH = 1 << 0,
	PAX_LINKPATH = 1 << 1,
	PAX_SIZE = 1 << 2,
	PAX_UID = 1 << 3,
	PAX_GID = 1 << 4,
	PAX_MTIME = 1 << 5,
	PAX_DEVMAJOR = 1 << 6,
	PAX_DEVMINOR = 1 << 7,
};

struct pax_attrs {
	unsigned int set;   /* PAX_* present */
	unsigned int unset; /* PAX_* deleted by an empty value */
	bool sparse;        /* some GNU.sparse.* key */
	char *path, *linkpath;
	uint64_t size;
	uint32_t uid, gid, devmajor, devminor;
	int64_t mtime;
	uint32_t mtime_nsec;
	struct tar_xattr *xattrs;
	uint32_t nr_xattrs;
	size_t xattr_bytes;
};

struct tar_reader {
	struct byte_source src;
	uint8_t *buf;
	size_t pos, len;
	bool src_eof;
	bool end;
	int err;          /* sticky */
	uint64_t off;     /* archive bytes consumed */
	uint64_t hdr_off; /* offset of the header being parsed */
	uint64_t remain;  /* unread data of the current entry */
	uint64_t pad;     /* padding after it */
	bool pending;     /* extension headers seen, entry header not yet */
	char *longname, *longlink; /* GNU 'L' / 'K' */
	struct pax_attrs pax, gpax; /* per-file, global */
	struct tar_entry ent;
	uint32_t xattr_cap;
};

static int tar_fail(struct tar_reader *r, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Log "tar entry <name or offset>: <reason>" and make the error sticky. */
static int tar_fail(struct tar_reader *r, int err, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (r->ent.path)
		ferry_err("tar entry '%s' (header at offset %llu): %s",
			  r->ent.path, (unsigned long long)r->hdr_off, msg);
	else
		ferry_err("tar entry at offset %llu: %s",
			  (unsigned long long)r->hdr_off, msg);
	r->err = err;
	return err;
}

static int tar_truncated(struct tar_reader *r)
{
	return tar_fail(r, -EFSCORRUPTED, "truncated archive");
}

/* Make at least @want bytes available (fewer only at end of input). */
static ssize_t tar_fill(struct tar_reader *r, size_t want)
{
	size_t have = r->len - r->pos;

	if (have >= want)
		return (ssize_t)have;
	memmove(r->buf, r->buf + r->pos, have);
	r->pos = 0;
	r->len = have;
	while (r->len < want && !r->src_eof) {
		ssize_t n = r->src.read(r->src.ctx, r->buf + r->len,
					TAR_BUF_SIZE - r->len);

		if (n < 0)
			return n;
		if (!n)
			r->src_eof = true;
		r->len += (size_t)n;
	}
	return (ssize_t)(r->len - r->pos);
}

static void tar_consume(struct tar_reader *r, size_t n)
{
	r->pos += n;
	r->off += n;
}

/* Skip @n bytes: 0, TAR_EOF if the input ends first, or -errno. */
static int tar_skip(struct tar_reader *r, uint64_t n)
{
	while (n) {
		ssize_t have;
		size_t k;

		/* Nothing buffered: a seekable source passes over the data. */
		if (r->pos == r->len && r->src.skip && !r->src_eof) {
			int64_t got = r->src.skip(r->src.ctx, n);

			if (got < 0)
				return (int)got;
			r->off += (uint64_t)got;
			if ((uint64_t)got < n) {
				r->src_eof = true;
				return TAR_EOF;
			}
			return 0;
		}
		have = tar_fill(r, 1);

		if (have < 0)
			return (int)have;
		if (!have)
			return TAR_EOF;
		k = (size_t)MIN((uint64_t)have, n);
		tar_consume(r, k);
		n -= k;
	}
	return 0;
}

/* Copy @n bytes out: 0, TAR_EOF if the input ends first, or -errno. */
static int tar_read_exact(struct tar_reader *r, uint8_t *dst, size_t n)
{
	while (n) {
		ssize_t have = tar_fill(r, 1);
		size_t k;

		if (have < 0)
			return (int)have;
		if (!have)
			return TAR_EOF;
		k = MIN((size_t)have, n);
		memcpy(dst, r->buf + r->pos, k);
		tar_consume(r, k);
		dst += k;
		n -= k;
	}
	return 0;
}

static uint64_t tar_padding(uint64_t size)
{
	return (TAR_BLOCK - size % TAR_BLOCK) % TAR_BLOCK;
}

/*
 * Numeric header field: octal digits between optional spaces / NULs, or
 * GNU base-256 (bit 7 of the first byte set; bit 6 gives the sign of a
 * big-endian two's complement number). -EINVAL on junk, -ERANGE beyond
 * 63 bits.
 */
static int parse_numeric(const uint8_t *f, size_t n, int64_t *out)
{
	uint64_t v = 0;
	size_t i = 0, end = n;

	if (f[0] & 0x80) {
		uint8_t inv = f[0] & 0x40 ? 0xff : 0;

		for (i = 0; i < n; i++) {
			uint8_t c = f[i] ^ inv;

			if (!i)
				c &= 0x7f;
			if (v >> 55)
				return -ERANGE;
			v = v << 8 | c;
		}
		/* For negatives v is ~x, and ~x == -x - 1. */
		*out = inv ? -(int64_t)v - 1 : (int64_t)v;
		return 0;
	}
	while (i < end && (f[i] == ' ' || !f[i]))
		i++;
	while (end > i && (f[end - 1] == ' ' || !f[end - 1]))
		end--;
	for (; i < end; i++) {
		if (f[i] < '0' || f[i] > '7')
			return -EINVAL;
		if (v >> 60)
			return -ERANGE;
		v = v << 3 | (uint64_t)(f[i] - '0');
	}
	*out = (int64_t)v;
	return 0;
}

static int hdr_number(struct tar_reader *r, const uint8_t *h, size_t off,
		      size_t len, int64_t min, int64_t max, const char *what,
		      int64_t *out)
{
	int ret = parse_numeric(h + off, len, out);

	if (ret == -EINVAL)
		return tar_fail(r, -EFSCORRUPTED, "bad %s field", what);
	if (ret || *out < min || *out > max)
		return tar_fail(r, -EFSCORRUPTED, "%s field out of range",
				what);
	return 0;
}

/* Unsigned sum per POSIX; some old tars summed signed chars. */
static bool checksum_ok(const uint8_t *h, int64_t want)
{
	int64_t usum = 0, ssum = 0;
	size_t i;

	for (i = 0; i < TAR_BLOCK; i++) {
		uint8_t c = i >= OFF_CHKSUM && i < OFF_CHKSUM + 8 ? ' ' : h[i];

		usum += c;
		ssum += (int8_t)c;
	}
	return want == usum || want == ssum;
}

static bool is_zero_block(const uint8_t *h)
{
	size_t i;

	for (i = 0; i < TAR_BLOCK; i++)
		if (h[i])
			return false;
	return true;
}

static enum hdr_format hdr_format(const uint8_t *h)
{
	if (!memcmp(h + F_MAGIC, "ustar\0" "00", 8))
		return FMT_USTAR;
	if (!memcmp(h + F_MAGIC, "ustar  \0", 8))
		return FMT_GNU;
	return FMT_V7;
}

/* Header string fields are NUL-terminated unless they fill the field. */
static size_t field_len(const uint8_t *h, size_t off, size_t len)
{
	return strnlen((const char *)h + off, len);
}

static char *field_dup(const uint8_t *h, size_t off, size_t len)
{
	return strndup((const char *)h + off, len);
}

static void pax_clear(struct pax_attrs *pa)
{
	uint32_t i;

	for (i = 0; i < pa->nr_xattrs; i++) {
		free(pa->xattrs[i].name);
		free(pa->xattrs[i].value);
	}
	free(pa->xattrs);
	free(pa->path);
	free(pa->linkpath);
	memset(pa, 0, sizeof(*pa));
}

static int parse_decimal(const char *s, size_t n, uint64_t max, uint64_t *out)
{
	uint64_t v = 0;
	size_t i;

	if (!n)
		return -EINVAL;
	for (i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9')
			return -EINVAL;
		if (__builtin_mul_overflow(v, 10, &v) ||
		    __builtin_add_overflow(v, (uint64_t)(s[i] - '0'), &v))
			return -ERANGE;
	}
	if (v > max)
		return -ERANGE;
	*out = v;
	return 0;
}

/* PAX time: [-]SECONDS[.FRACTION]; digits past nanoseconds are dropped. */
static int parse_pax_time(const char *s, size_t n, int64_t *sec,
			  uint32_t *nsec)
{
	bool neg = n && s[0] == '-';
	size_t i = neg, start = neg, digits = 0;
	uint64_t v;
	uint32_t ns = 0;
	int ret;

	while (i < n && s[i] != '.')
		i++;
	ret = parse_decimal(s + start, i - start, (uint64_t)INT64_MAX + neg, &v);
	if (ret)
		return ret;
	if (i < n) {
		for (i++; i < n; i++) {
			if (s[i] < '0' || s[i] > '9')
				return -EINVAL;
			if (digits < 9) {
				ns = ns * 10 + (uint32_t)(s[i] - '0');
				digits++;
			}
		}
		for (; digits < 9; digits++)
			ns *= 10;
	}
	if (!neg) {
		*sec = (int64_t)v;
		*nsec = ns;
		return 0;
	}
	/* -(v + ns / 1e9) with a non-negative nanosecond part. */
	if (ns && v > (uint64_t)INT64_MAX)
		return -ERANGE;
	if (ns) {
		*sec = -(int64_t)v - 1;
		*nsec = 1000000000u - ns;
	} else {
		*sec = v > (uint64_t)INT64_MAX ? INT64_MIN : -(int64_t)v;
		*nsec = 0;
	}
	return 0;
}

/* libarchive's base64 xattr values (unpadded), decoded into a new buffer. */
static int pax_base64_value(const char *in, size_t n, uint8_t **out,
			    uint32_t *out_len)
{
	uint8_t *dst = malloc(n / 4 * 3 + 3);
	size_t len;
	int ret;

	if (!dst)
		return -ENOMEM;
	ret = base64_decode(in, n, dst, n / 4 * 3 + 3, &len);
	if (ret) {
		free(dst);
		return ret;
	}
	*out = dst;
	*out_len = (uint32_t)len;
	return 0;
}

/* libarchive %-encodes xattr names in LIBARCHIVE.xattr.NAME keys. */
static int url_decode(const char *in, size_t n, char **out)
{
	char *s = malloc(n + 1), *d = s;
	size_t i;

	if (!s)
		return -ENOMEM;
	for (i = 0; i < n; i++) {
		if (in[i] == '%') {
			int hi = i + 2 < n ? hex_digit(in[i + 1]) : -1;
			int lo = hi >= 0 ? hex_digit(in[i + 2]) : -1;

			if (lo < 0 || !(hi | lo)) {
				free(s);
				return -EINVAL;
			}
			*d++ = (char)(hi << 4 | lo);
			i += 2;
		} else {
			*d++ = in[i];
		}
	}
	*d = '\0';
	*out = s;
	return 0;
}

/* Add or replace an xattr; takes ownership of @name and @value. */
static int pax_set_xattr(struct tar_reader *r, struct pax_attrs *pa,
			 char *name, uint8_t *value, uint32_t value_len)
{
	size_t bytes = strlen(name) + value_len;
	struct tar_xattr *x = NULL;
	uint32_t i;

	if (!*name) {
		free(name);
		free(value);
		return tar_fail(r, -EFSCORRUPTED, "PAX xattr with empty name");
	}
	for (i = 0; i < pa->nr_xattrs && !x; i++)
		if (!strcmp(pa->xattrs[i].name, name))
			x = &pa->xattrs[i];
	if (x) {
		pa->xattr_bytes -= strlen(x->name) + x->value_len;
		free(x->name);
		free(x->value);
	} else if (pa->nr_xattrs >= TAR_XATTR_MAX) {
		free(name);
		free(value);
		return tar_fail(r, -EFSCORRUPTED, "more than %u xattrs",
				TAR_XATTR_MAX);
	} else {
		struct tar_xattr *nx = realloc(pa->xattrs, (pa->nr_xattrs + 1) *
							   sizeof(*nx));

		if (!nx) {
			free(name);
			free(value);
			return -ENOMEM;
		}
		pa->xattrs = nx;
		x = &nx[pa->nr_xattrs++];
	}
	x->name = name;
	x->value = value;
	x->value_len = value_len;
	pa->xattr_bytes += bytes;
	if (pa->xattr_bytes > TAR_META_MAX)
		return tar_fail(r, -EFSCORRUPTED, "xattrs larger than %u bytes",
				TAR_META_MAX);
	return 0;
}

static bool key_is(const char *key, size_t klen, const char *want)
{
	return klen == strlen(want) && !memcmp(key, want, klen);
}

static bool key_has_prefix(const char *key, size_t klen, const char *prefix)
{
	size_t plen = strlen(prefix);

	return klen > plen && !memcmp(key, prefix, plen);
}

static int pax_xattr(struct tar_reader *r, struct pax_attrs *pa,
		     const char *key, size_t klen, const char *val, size_t vlen)
{
	static const char schily[] = "SCHILY.xattr.";
	static const char libarchive[] = "LIBARCHIVE.xattr.";
	uint8_t *value = NULL;
	uint32_t value_len;
	char *name;
	int ret;

	if (key_has_prefix(key, klen, schily)) {
		/* Raw bytes; the record length delimits them (NULs allowed). */
		name = strndup(key + sizeof(schily) - 1, klen - (sizeof(schily) - 1));
		value = malloc(vlen + 1);
		if (!name || !value) {
			free(name);
			free(value);
			return -ENOMEM;
		}
		memcpy(value, val, vlen);
		value_len = (uint32_t)vlen;
	} else {
		ret = url_decode(key + sizeof(libarchive) - 1,
				 klen - (sizeof(libarchive) - 1), &name);
		if (ret == -EINVAL)
			return tar_fail(r, -EFSCORRUPTED,
					"bad %%-encoding in PAX key '%.*s'",
					(int)klen, key);
		if (ret)
			return ret;
		ret = pax_base64_value(val, vlen, &value, &value_len);
		if (ret) {
			free(name);
			if (ret != -EINVAL)
				return ret;
			return tar_fail(r, -EFSCORRUPTED,
					"bad base64 value for PAX key '%.*s'",
					(int)klen, key);
		}
	}
	return pax_set_xattr(r, pa, name, value, value_len);
}

static int pax_string(struct tar_reader *r, char **dst, const char *key,
		      const char *val, size_t vlen)
{
	char *s;

	if (memchr(val, '\0', vlen))
		return tar_fail(r, -EFSCORRUPTED, "NUL byte in PAX %s", key);
	s = strndup(val, vlen);
	if (!s)
		return -ENOMEM;
	free(*dst);
	*dst = s;
	return 0;
}

static int pax_record(struct tar_reader *r, struct pax_attrs *pa,
		      const char *key, size_t klen, const char *val,
		      size_t vlen)
{
	static const struct {
		const char *key;
		unsigned int bit;
		uint64_t max;
	} numbers[] = {
		{ "size", PAX_SIZE, INT64_MAX },
		{ "uid", PAX_UID, UINT32_MAX },
		{ "gid", PAX_GID, UINT32_MAX },
		{ "SCHILY.devmajor", PAX_DEVMAJOR, UINT32_MAX },
		{ "SCHILY.devminor", PAX_DEVMINOR, UINT32_MAX },
	};
	unsigned int bit = 0;
	uint64_t max = 0;
	size_t i;
	int ret;

	if (key_has_prefix(key, klen, "GNU.sparse.")) {
		pa->sparse = true;
		return 0;
	}
	if (key_has_prefix(key, klen, "SCHILY.xattr.") ||
	    key_has_prefix(key, klen, "LIBARCHIVE.xattr."))
		return pax_xattr(r, pa, key, klen, val, vlen);

	if (key_is(key, klen, "path"))
		bit = PAX_PATH;
	else if (key_is(key, klen, "linkpath"))
		bit = PAX_LINKPATH;
	else if (key_is(key, klen, "mtime"))
		bit = PAX_MTIME;
	for (i = 0; i < ARRAY_SIZE(numbers) && !bit; i++)
		if (key_is(key, klen, numbers[i].key)) {
			bit = numbers[i].bit;
			max = numbers[i].max;
		}
	/* uname, gname, atime, ctime, comment, charset...: not stored. */
	if (!bit)
		return 0;
	/* An empty value deletes the key (POSIX). */
	if (!vlen) {
		pa->set &= ~bit;
		pa->unset |= bit;
		return 0;
	}
	if (bit == PAX_PATH) {
		ret = pax_string(r, &pa->path, "path", val, vlen);
	} else if (bit == PAX_LINKPATH) {
		ret = pax_string(r, &pa->linkpath, "linkpath", val, vlen);
	} else if (bit == PAX_MTIME) {
		ret = parse_pax_time(val, vlen, &pa->mtime, &pa->mtime_nsec);
	} else {
		uint64_t v = 0;

		ret = parse_decimal(val, vlen, max, &v);
		if (bit == PAX_SIZE)
			pa->size = v;
		else if (bit == PAX_UID)
			pa->uid = (uint32_t)v;
		else if (bit == PAX_GID)
			pa->gid = (uint32_t)v;
		else if (bit == PAX_DEVMAJOR)
			pa->devmajor = (uint32_t)v;
		else
			pa->devminor = (uint32_t)v;
	}
	if (ret == -EINVAL || ret == -ERANGE)
		return tar_fail(r, -EFSCORRUPTED, "bad PAX %.*s value '%.*s'",
				(int)klen, key, (int)MIN(vlen, 64), val);
	if (ret)
		return ret;
	pa->set |= bit;
	pa->unset &= ~bit;
	return 0;
}

/* Records are "LEN KEY=VALUE\n" with LEN counting the whole record. */
static int pax_parse(struct tar_reader *r, struct pax_attrs *pa,
		     const char *data, size_t len)
{
	size_t pos = 0;

	while (pos < len) {
		const char *rec = data + pos, *key, *eq;
		size_t rest = len - pos, rlen = 0, i;
		int ret;

		for (i = 0; i < rest && rec[i] >= '0' && rec[i] <= '9'; i++) {
			rlen = rlen * 10 + (size_t)(rec[i] - '0');
			if (rlen > rest)
				break;
		}
		/* Shortest record: LEN, ' ', 1-byte key, '=', '\n'. */
		if (!i || i >= rest || rec[i] != ' ' || rlen > rest ||
		    rlen < i + 4 || rec[rlen - 1] != '\n')
			return tar_fail(r, -EFSCORRUPTED,
					"bad PAX record at byte %zu", pos);
		key = rec + i + 1;
		eq = memchr(key, '=', (size_t)(rec + rlen - 1 - key));
		if (!eq || eq == key || memchr(key, '\0', (size_t)(eq - key)))
			return tar_fail(r, -EFSCORRUPTED,
					"bad PAX record at byte %zu", pos);
		ret = pax_record(r, pa, key, (size_t)(eq - key), eq + 1,
				 (size_t)(rec + rlen - 1 - (eq + 1)));
		if (ret)
			return ret;
		pos += rlen;
	}
	return 0;
}

/* Read an extension header's data (PAX records, GNU long name). */
static int read_meta(struct tar_reader *r, int64_t size, char **out)
{
	char *data;
	int ret;

	if ((uint64_t)size > TAR_META_MAX)
		return tar_fail(r, -EFSCORRUPTED,
				"entry header data too large (%lld bytes)",
				(long long)size);
	data = malloc((size_t)size + 1);
	if (!data)
		return -ENOMEM;
	ret = tar_read_exact(r, (uint8_t *)data, (size_t)size);
	if (!ret)
		ret = tar_skip(r, tar_padding((uint64_t)size));
	if (ret) {
		free(data);
		if (ret == TAR_EOF)
			return tar_truncated(r);
		return tar_fail(r, ret, "read: %s", ferry_strerror(ret));
	}
	data[size] = '\0';
	*out = data;
	return 0;
}

static int read_pax_header(struct tar_reader *r, int64_t size, bool global)
{
	struct pax_attrs *pa = global ? &r->gpax : &r->pax;
	char *data;
	int ret;

	if (!global)
		pax_clear(pa);
	ret = read_meta(r, size, &data);
	if (ret)
		return ret;
	ret = pax_parse(r, pa, data, (size_t)size);
	free(data);
	if (!ret && global && pa->sparse)
		return tar_fail(r, -ENOTSUP,
				"GNU sparse files are not supported");
	return ret;
}

/* GNU long names: the data holds the name, NUL-terminated. */
static int read_long_name(struct tar_reader *r, int64_t size, char **dst)
{
	char *data;
	int ret = read_meta(r, size, &data);

	if (ret)
		return ret;
	free(*dst);
	*dst = data;
	return 0;
}

static int entry_path(struct tar_reader *r, const uint8_t *h,
		      enum hdr_format fmt)
{
	size_t plen = field_len(h, F_PREFIX), nlen = field_len(h, F_NAME);

	if (r->pax.set & PAX_PATH)
		r->ent.path = strdup(r->pax.path);
	else if (r->longname)
		r->ent.path = strdup(r->longname);
	else if (fmt == FMT_USTAR && plen) {
		r->ent.path = malloc(plen + 1 + nlen + 1);
		if (r->ent.path)
			sprintf(r->ent.path, "%.*s/%.*s", (int)plen,
				(const char *)h + OFF_PREFIX, (int)nlen,
				(const char *)h);
	} else {
		r->ent.path = field_dup(h, F_NAME);
	}
	return r->ent.path ? 0 : -ENOMEM;
}

static int entry_linkname(struct tar_reader *r, const uint8_t *h)
{
	if (r->pax.set & PAX_LINKPATH)
		r->ent.linkname = strdup(r->pax.linkpath);
	else if (r->longlink)
		r->ent.linkname = strdup(r->longlink);
	else
		r->ent.linkname = field_dup(h, F_LINKNAME);
	if (!r->ent.linkname)
		return -ENOMEM;
	if (!*r->ent.linkname)
		return tar_fail(r, -EFSCORRUPTED, "empty link target");
	return 0;
}

/*
 * Where uid, gid or mtime come from: the per-file PAX header, else the
 * global one unless a per-file empty value deleted it, else (NULL) the
 * tar header. Other keys are taken from the per-file header only.
 */
static const struct pax_attrs *pax_source(const struct tar_reader *r,
					  unsigned int bit)
{
	if (r->pax.set & bit)
		return &r->pax;
	if ((r->gpax.set & bit) && !(r->pax.unset & bit))
		return &r->gpax;
	return NULL;
}

/* Entry xattrs: global ones not overridden, then the per-file ones. */
static int entry_xattrs(struct tar_reader *r)
{
	uint32_t n = 0, need = r->gpax.nr_xattrs + r->pax.nr_xattrs, i, j;

	if (!need)
		return 0;
	if (need > r->xattr_cap) {
		struct tar_xattr *x = realloc(r->ent.xattrs, need * sizeof(*x));

		if (!x)
			return -ENOMEM;
		r->ent.xattrs = x;
		r->xattr_cap = need;
	}
	for (i = 0; i < r->gpax.nr_xattrs; i++) {
		const struct tar_xattr *g = &r->gpax.xattrs[i];

		for (j = 0; j < r->pax.nr_xattrs; j++)
			if (!strcmp(r->pax.xattrs[j].name, g->name))
				break;
		if (j == r->pax.nr_xattrs)
			r->ent.xattrs[n++] = *g;
	}
	for (j = 0; j < r->pax.nr_xattrs; j++)
		r->ent.xattrs[n++] = r->pax.xattrs[j];
	r->ent.nr_xattrs = n;
	return 0;
}

static int entry_type(struct tar_reader *r, uint8_t tf, bool *has_data)
{
	size_t plen = strlen(r->ent.path);

	*has_data = false;
	switch (tf) {
	case '\0':
		/* Old tars mark directories with a trailing slash. */
		if (plen && r->ent.path[plen - 1] == '/') {
			r->ent.type = TAR_DIR;
			return 0;
		}
		/* fall through */
	case '0':
	case '7': /* contiguous file */
		r->ent.type = TAR_REG;
		*has_data = true;
		return 0;
	case '1':
		r->ent.type = TAR_HARDLINK;
		return 0;
	case '2':
		r->ent.type = TAR_SYMLINK;
		return 0;
	case '3':
		r->ent.type = TAR_CHR;
		return 0;
	case '4':
		r->ent.type = TAR_BLK;
		return 0;
	case '5':
		r->ent.type = TAR_DIR;
		return 0;
	case '6':
		r->ent.type = TAR_FIFO;
		return 0;
	case 'D': /* GNU incremental dumpdir: a directory plus a listing */
		r->ent.type = TAR_DIR;
		*has_data = true;
		return 0;
	case 'S':
		return tar_fail(r, -ENOTSUP,
				"GNU sparse files are not supported");
	case 'M':
		return tar_fail(r, -ENOTSUP,
				"multi-volume archives are not supported");
	default:
		ferry_warn("tar entry '%s': unknown type '%c' (0x%02x), read as a regular file",
			   r->ent.path, tf >= 0x20 && tf < 0x7f ? tf : '?', tf);
		r->ent.type = TAR_REG;
		*has_data = true;
		return 0;
	}
}

/* Fill r->ent from a file header and the pending extension headers. */
static int parse_entry(struct tar_reader *r, const uint8_t *h,
		       enum hdr_format fmt, int64_t size)
{
	const struct pax_attrs *pa;
	uint8_t tf = h[F_TYPEFLAG];
	int64_t mode, v;
	bool has_data;
	int ret;

	ret = entry_path(r, h, fmt);
	if (ret)
		return ret;
	if (r->pax.sparse)
		return tar_fail(r, -ENOTSUP,
				"GNU sparse files are not supported");
	if (!*r->ent.path)
		return tar_fail(r, -EFSCORRUPTED, "empty path");
	ret = entry_type(r, tf, &has_data);
	if (ret)
		return ret;
	if (r->ent.type == TAR_HARDLINK || r->ent.type == TAR_SYMLINK) {
		ret = entry_linkname(r, h);
		if (ret)
			return ret;
	}

	ret = hdr_number(r, h, F_MODE, 0, INT64_MAX, "mode", &mode);
	if (ret)
		return ret;
	r->ent.mode = (uint32_t)(mode & 07777);

	pa = pax_source(r, PAX_UID);
	if (pa) {
		r->ent.uid = pa->uid;
	} else {
		ret = hdr_number(r, h, F_UID, 0, UINT32_MAX, "uid", &v);
		if (ret)
			return ret;
		r->ent.uid = (uint32_t)v;
	}
	pa = pax_source(r, PAX_GID);
	if (pa) {
		r->ent.gid = pa->gid;
	} else {
		ret = hdr_number(r, h, F_GID, 0, UINT32_MAX, "gid", &v);
		if (ret)
			return ret;
		r->ent.gid = (uint32_t)v;
	}
	pa = pax_source(r, PAX_MTIME);
	if (pa) {
		r->ent.mtime = pa->mtime;
		r->ent.mtime_nsec = pa->mtime_nsec;
	} else {
		ret = hdr_number(r, h, F_MTIME, INT64_MIN, INT64_MAX, "mtime",
				 &r->ent.mtime);
		if (ret)
			return ret;
	}

	if (r->ent.type == TAR_CHR || r->ent.type == TAR_BLK) {
		/* v7 headers have no device fields. */
		if (r->pax.set & PAX_DEVMAJOR) {
			r->ent.dev_major = r->pax.devmajor;
		} else if (fmt != FMT_V7) {
			ret = hdr_number(r, h, F_DEVMAJOR, 0, UINT32_MAX,
					 "devmajor", &v);
			if (ret)
				return ret;
			r->ent.dev_major = (uint32_t)v;
		}
		if (r->pax.set & PAX_DEVMINOR) {
			r->ent.dev_minor = r->pax.devminor;
		} else if (fmt != FMT_V7) {
			ret = hdr_number(r, h, F_DEVMINOR, 0, UINT32_MAX,
					 "devminor", &v);
			if (ret)
				return ret;
			r->ent.dev_minor = (uint32_t)v;
		}
	}

	ret = entry_xattrs(r);
	if (ret)
		return ret;

	if (!has_data)
		return 0;
	if (r->pax.set & PAX_SIZE)
		size = (int64_t)r->pax.size;
	r->pad = tar_padding((uint64_t)size);
	if (r->ent.type == TAR_REG) {
		r->ent.size = (uint64_t)size;
		r->remain = (uint64_t)size;
		return 0;
	}
	/* Dumpdir listing: not needed. */
	ret = tar_skip(r, (uint64_t)size);
	if (ret == TAR_EOF)
		return tar_truncated(r);
	return ret ? tar_fail(r, ret, "read: %s", ferry_strerror(ret)) : 0;
}

/* Reset per-entry state; extension headers apply to one entry only. */
static void entry_clear(struct tar_reader *r)
{
	struct tar_xattr *xattrs = r->ent.xattrs;

	free(r->ent.path);
	free(r->ent.linkname);
	memset(&r->ent, 0, sizeof(r->ent));
	r->ent.xattrs = xattrs;
	free(r->longname);
	free(r->longlink);
	r->longname = r->longlink = NULL;
	pax_clear(&r->pax);
	r->pending = false;
}

/*
 * One header block: 1 when r->ent is an entry, 0 when it was an
 * extension header (or volume label) and another header follows.
 */
static int parse_header(struct tar_reader *r, const uint8_t *h)
{
	enum hdr_format fmt = hdr_format(h);
	int64_t chksum, size;
	int ret;

	if (parse_numeric(h + F_CHKSUM, &chksum) || !checksum_ok(h, chksum))
		return tar_fail(r, -EFSCORRUPTED, "header checksum mismatch");
	ret = hdr_number(r, h, F_SIZE, 0, INT64_MAX, "size", &size);
	if (ret)
		return ret;

	switch (h[F_TYPEFLAG]) {
	case 'L':
		r->pending = true;
		return read_long_name(r, size, &r->longname);
	case 'K':
		r->pending = true;
		return read_long_name(r, size, &r->longlink);
	case 'x':
		r->pending = true;
		return read_pax_header(r, size, false);
	case 'g':
		return read_pax_header(r, size, true);
	case 'V': /* volume label: not a file */
		ret = tar_skip(r, (uint64_t)size + tar_padding((uint64_t)size));
		if (ret == TAR_EOF)
			return tar_truncated(r);
		return ret ? tar_fail(r, ret, "read: %s", ferry_strerror(ret)) : 0;
	}
	ret = parse_entry(r, h, fmt, size);
	return ret ? ret : 1;
}

/* After a zero block: another one, or the end of input, ends the archive. */
static int end_of_archive(struct tar_reader *r)
{
	ssize_t have;

	if (r->pending)
		return tar_truncated(r);
	have = tar_fill(r, TAR_BLOCK);
	if (have < 0)
		return tar_fail(r, (int)have, "read: %s",
				ferry_strerror((int)have));
	if (have && have < TAR_BLOCK)
		return tar_truncated(r);
	if (have && !is_zero_block(r->buf + r->pos)) {
		r->hdr_off = r->off;
		return tar_fail(r, -EFSCORRUPTED,
				"data after a single zero block");
	}
	r->end = true;
	return 0;
}

int tar_next(struct tar_reader *r, struct tar_entry **e)
{
	uint8_t h[TAR_BLOCK];
	int ret;

	if (r->err)
		return r->err;
	if (r->end)
		return 0;
	ret = tar_skip(r, r->remain);
	if (ret == TAR_EOF)
		return tar_truncated(r);
	if (ret)
		return tar_fail(r, ret, "read: %s", ferry_strerror(ret));
	r->remain = 0;
	ret = tar_skip(r, r->pad);
	r->pad = 0;
	if (ret == TAR_EOF) { /* the final padding may be missing */
		r->end = true;
		return 0;
	}
	if (ret)
		return tar_fail(r, ret, "read: %s", ferry_strerror(ret));
	entry_clear(r);

	for (;;) {
		ssize_t have;

		r->hdr_off = r->off;
		have = tar_fill(r, TAR_BLOCK);
		if (have < 0)
			return tar_fail(r, (int)have, "read: %s",
					ferry_strerror((int)have));
		if (!have) {
			if (r->pending)
				return tar_truncated(r);
			r->end = true;
			return 0;
		}
		if (have < TAR_BLOCK)
			return tar_truncated(r);
		memcpy(h, r->buf + r->pos, TAR_BLOCK);
		tar_consume(r, TAR_BLOCK);
		if (is_zero_block(h))
			return end_of_archive(r);
		ret = parse_header(r, h);
		if (ret == 1) {
			*e = &r->ent;
			return 1;
		}
		if (ret)
			return r->err ? r->err : (r->err = ret);
	}
}

ssize_t tar_read_data(struct tar_reader *r, void *buf, size_t len)
{
	size_t want, n;
	ssize_t got;

	if (r->err)
		return r->err;
	want = (size_t)MIN((uint64_t)MIN(len, (size_t)SSIZE_MAX), r->remain);
	if (!want)
		return 0;
	if (r->pos == r->len && want >= TAR_BUF_SIZE) {
		/* Big reads: let the source write into the caller's buffer. */
		got = r->src_eof ? 0 : r->src.read(r->src.ctx, buf, want);
		if (!got)
			r->src_eof = true;
		n = got > 0 ? (size_t)got : 0;
		r->off += n;
	} else {
		got = tar_fill(r, 1);
		n = got > 0 ? MIN((size_t)got, want) : 0;
		memcpy(buf, r->buf + r->pos, n);
		tar_consume(r, n);
	}
	if (got < 0)
		return tar_fail(r, (int)got, "read: %s",
				ferry_strerror((int)got));
	if (!got)
		return tar_truncated(r);
	r->remain -= n;
	return (ssize_t)n;
}

uint64_t tar_offset(const struct tar_reader *r)
{
	return r->off;
}

int tar_reader_new(struct byte_source src, struct tar_reader **out)
{
	struct tar_reader *r = calloc(1, sizeof(*r));

	if (!r)
		return -ENOMEM;
	r->buf = malloc(TAR_BUF_SIZE);
	if (!r->buf) {
		free(r);
		return -ENOMEM;
	}
	r->src = src;
	*out = r;
	return 0;
}

void tar_reader_free(struct tar_reader *r)
{
	if (!r)
		return;
	entry_clear(r);
	free(r->ent.xattrs);
	pax_clear(&r->gpax);
	free(r->buf);
	free(r);
}
