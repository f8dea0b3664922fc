// SPDX-License-Identifier: MIT
/*
 * json-c accessors shared by the modules that read and write JSON: plain
 * lookups, and bounded, typed reads of untrusted documents that name the
 * offending key in their error message.
 */
#include <json-c/json.h>
#include <stdarg.h>
#include <stdio.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "base.h"

int json_parse_object(const char *text, size_t len, struct json_object **out)
{
	struct json_tokener *tok;
	struct json_object *o;
	enum json_tokener_error jerr;
	size_t i;

	if (len > INT_MAX)
		return -EPROTO;
	tok = json_tokener_new(); /* nesting depth 32 */
	if (!tok)
		return -ENOMEM;
	o = json_tokener_parse_ex(tok, text, (int)len);
	jerr = json_tokener_get_error(tok);
	/* Anything but blanks after the object is junk too, a NUL included. */
	if (o && jerr == json_tokener_success) {
		for (i = json_tokener_get_parse_end(tok); i < len; i++)
			if (!text[i] || !strchr(" \t\r\n", text[i]))
				jerr = json_tokener_error_parse_unexpected;
	}
	json_tokener_free(tok);
	if (!o || jerr != json_tokener_success || !json_object_is_type(o, json_type_object)) {
		json_object_put(o);
		return -EPROTO;
	}
	*out = o;
	return 0;
}

int json_read_file(const char *path, size_t max, struct json_object **out)
{
	char *text;
	size_t len;
	int ret = read_file_nofollow(path, max, &text, &len);

	if (ret)
		return ret;
	ret = json_parse_object(text, len, out);
	free(text);
	return ret;
}

const char *json_read_file_error(int ret)
{
	switch (ret) {
	case -ENOENT:
		return "no such file";
	case -ELOOP:
		return "a symbolic link (not followed)";
	case -EINVAL:
		return "not a regular file";
	case -EFBIG:
		return "too large";
	case -EPROTO:
		return "not a JSON object";
	default:
		return ferry_strerror(ret);
	}
}

const char *json_get_string(struct json_object *o, const char *key)
{
	struct json_object *v;

	if (!o || !json_object_object_get_ex(o, key, &v) ||
	    !json_object_is_type(v, json_type_string))
		return NULL;
	return json_object_get_string(v);
}

__attribute__((format(printf, 3, 4)))
int json_bad(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return -EINVAL;
}

/* The value of @key; NULL when absent or null. */
struct json_object *json_field(struct json_object *o, const char *key)
{
	struct json_object *v;

	if (!o || !json_object_object_get_ex(o, key, &v) ||
	    json_object_is_type(v, json_type_null))
		return NULL;
	return v;
}

/* A string without NULs of at most @max bytes, or NULL. */
const char *json_str_val(struct json_object *v, size_t max)
{
	size_t len;

	if (!json_object_is_type(v, json_type_string))
		return NULL;
	len = (size_t)json_object_get_string_len(v);
	if (len > max || strlen(json_object_get_string(v)) != len)
		return NULL;
	return json_object_get_string(v);
}

/* *@out stays as it is when @key is absent and not @required. */
int json_read_str(struct json_object *o, const char *key, size_t max, bool required,
		  const char **out, char *err, size_t errlen)
{
	struct json_object *v = json_field(o, key);
	const char *s;

	if (!v)
		return required ? json_bad(err, errlen, "\"%s\" is required", key) : 0;
	s = json_str_val(v, max);
	if (!s)
		return json_bad(err, errlen, "\"%s\": expected a string of at most %zu bytes",
			   key, max);
	*out = s;
	return 0;
}

int json_read_abspath(struct json_object *o, const char *key, const char **out,
		      char *err, size_t errlen)
{
	int ret = json_read_str(o, key, PATH_MAX - 1, true, out, err, errlen);

	if (!ret && (*out)[0] != '/')
		return json_bad(err, errlen, "\"%s\" must be an absolute path", key);
	return ret;
}

/* Into @buf of @size bytes, the string is required. */
int json_read_copy(struct json_object *o, const char *key, char *buf, size_t size,
		   char *err, size_t errlen)
{
	const char *s = NULL;
	int ret = json_read_str(o, key, size - 1, true, &s, err, errlen);

	if (!ret)
		memcpy(buf, s, strlen(s) + 1);
	return ret;
}

int json_read_strdup(struct json_object *o, const char *key, size_t max, char **out,
		     char *err, size_t errlen)
{
	const char *s = NULL;
	int ret = json_read_str(o, key, max, true, &s, err, errlen);

	if (ret)
		return ret;
	*out = strdup(s);
	return *out ? 0 : -ENOMEM;
}

int json_read_s64(struct json_object *o, const char *key, int64_t min, int64_t max,
		  int64_t *out, char *err, size_t errlen)
{
	struct json_object *v = json_field(o, key);
	int64_t n;

	if (!v)
		return 0;
	/* json-c keeps integers above INT64_MAX as unsigned: never in range. */
	n = json_object_get_int64(v);
	if (!json_object_is_type(v, json_type_int) || n < min || n > max ||
	    (n == INT64_MAX && json_object_get_uint64(v) != (uint64_t)INT64_MAX))
		return json_bad(err, errlen, "\"%s\": expected an integer %lld..%lld", key,
			   (long long)min, (long long)max);
	*out = n;
	return 0;
}

int json_read_u64(struct json_object *o, const char *key, uint64_t max, uint64_t *out,
		  char *err, size_t errlen)
{
	struct json_object *v = json_field(o, key);

	if (!v)
		return 0;
	if (!json_object_is_type(v, json_type_int) || json_object_get_int64(v) < 0 ||
	    json_object_get_uint64(v) > max)
		return json_bad(err, errlen, "\"%s\": expected an integer 0..%llu", key,
			   (unsigned long long)max);
	*out = json_object_get_uint64(v);
	return 0;
}

int json_read_bool(struct json_object *o, const char *key, bool *out, char *err,
		   size_t errlen)
{
	struct json_object *v = json_field(o, key);

	if (!v)
		return 0;
	if (!json_object_is_type(v, json_type_boolean))
		return json_bad(err, errlen, "\"%s\": expected true or false", key);
	*out = json_object_get_boolean(v);
	return 0;
}

/*
 * A string array: *@out is malloc'ed and NULL-terminated (also when
 * absent); entries are non-empty.
 */
int json_read_strs(struct json_object *o, const char *key, size_t max_items,
		   size_t max_len, const char ***out, size_t *nr, char *err, size_t errlen)
{
	struct json_object *v = json_field(o, key);
	const char **list;
	size_t i, n = 0;

	if (v && (!json_object_is_type(v, json_type_array) ||
		  json_object_array_length(v) > max_items))
		return json_bad(err, errlen, "\"%s\": expected an array of at most %zu strings",
			   key, max_items);
	if (v)
		n = json_object_array_length(v);
	list = calloc(n + 1, sizeof(*list));
	if (!list)
		return -ENOMEM;
	*out = list;
	for (i = 0; i < n; i++) {
		list[i] = json_str_val(json_object_array_get_idx(v, i), max_len);
		if (!list[i] || !*list[i]) {
			list[i] = NULL;
			return json_bad(err, errlen, "\"%s\"[%zu]: expected a non-empty string of at most %zu bytes",
				   key, i, max_len);
		}
	}
	*nr = n;
	return 0;
}

/* An object field, or NULL when absent. */
int json_read_object(struct json_object *o, const char *key, struct json_object **out,
		     char *err, size_t errlen)
{
	*out = json_field(o, key);
	if (*out && !json_object_is_type(*out, json_type_object))
		return json_bad(err, errlen, "\"%s\": expected an object", key);
	return 0;
}

/*
 * Add @v (NULL after a failed allocation) to @o under @key: false when it
 * could not be added (and @v is put).
 */
bool json_add(struct json_object *o, const char *key, struct json_object *v)
{
	if (v && !json_object_object_add(o, key, v))
		return true;
	json_object_put(v);
	return false;
}

bool json_add_str(struct json_object *o, const char *key, const char *s)
{
	return !s || json_add(o, key, json_object_new_string(s));
}

/* @n strings of @list (n SIZE_MAX: up to its NULL; a NULL list is empty). */
struct json_object *json_str_array(const char *const *list, size_t n)
{
	struct json_object *a = json_object_new_array();
	struct json_object *s;
	size_t i;

	for (i = 0; a && list && (n == SIZE_MAX ? list[i] != NULL : i < n); i++) {
		s = json_object_new_string(list[i]);
		if (!s || json_object_array_add(a, s)) {
			json_object_put(s);
			json_object_put(a);
			return NULL;
		}
	}
	return a;
}

struct json_object *json_digest_array(const uint8_t (*d)[32], size_t n)
{
	struct json_object *a = json_object_new_array();
	struct json_object *s;
	char dig[DIGEST_STRING_SIZE];
	size_t i;

	for (i = 0; a && i < n; i++) {
		digest_format(d[i], dig);
		s = json_object_new_string(dig);
		if (!s || json_object_array_add(a, s)) {
			json_object_put(s);
			json_object_put(a);
			return NULL;
		}
	}
	return a;
}

/* @o, or NULL (put) when one of its fields could not be added. */
struct json_object *json_done(struct json_object *o, bool ok)
{
	if (ok)
		return o;
	json_object_put(o);
	return NULL;
}
