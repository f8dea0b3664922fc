// SPDX-License-Identifier: MIT
/*
 * libFuzzer target for pkg-fetch's parsers of untrusted input. The first
 * byte picks the parser, the rest is its input: image references and
 * digests, WWW-Authenticate, Content-Range, the upload Range, Link,
 * Retry-After, base64, token answers, docker config files, credential
 * helper answers, upload Locations and registry hosts (fetch_host, then
 * the client it opens). Accepted results are checked for
 * consistency (bounds, NUL-terminated fields, a reference normalised as
 * Docker does that formats back to itself).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "../../pkg-base/base.h"
#include "../../pkg-fetch/internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum {
	F_REF,
	F_DIGEST,
	F_WWW_AUTH,
	F_CONTENT_RANGE,
	F_UPLOAD_RANGE,
	F_LINK,
	F_RETRY_AFTER,
	F_BASE64,
	F_TOKEN,
	F_DOCKERCFG,
	F_HELPER,
	F_LOCATION,
	F_HOST,
	F_COUNT,
};

static void check_str(const char *s, size_t cap)
{
	if (strnlen(s, cap) >= cap)
		abort();
}

static void fuzz_ref(const char *s)
{
	struct fetch_ref r, again;
	char *text = NULL;

	if (fetch_parse_ref(s, &r))
		return;
	if (!r.host || !r.repo || !r.tag == !r.digest ||
	    !fetch_repo_valid(r.repo, strlen(r.repo)) ||
	    (r.tag && !fetch_tag_valid(r.tag, strlen(r.tag))) ||
	    !strcmp(r.host, FETCH_HUB_OLD) ||
	    (!strcmp(r.host, FETCH_HUB) && !strchr(r.repo, '/')))
		abort();
	/* What was accepted formats back to an equal (normalised) reference. */
	text = fetch_ref_string(&r);
	if (!text)
		abort();
	if (fetch_parse_ref(text, &again) || strcmp(r.host, again.host) ||
	    strcmp(r.repo, again.repo) || !r.tag != !again.tag ||
	    (r.tag && strcmp(r.tag, again.tag)) || !r.digest != !again.digest ||
	    (r.digest && strcmp(r.digest, again.digest)))
		abort();
	fetch_ref_free(&again);
	fetch_ref_free(&r);
	free(text);
}

static void fuzz_www_auth(const char *s, size_t len)
{
	struct fetch_challenge c[3];
	int n = fetch_parse_www_auth(s, len, c, 3), i;

	if (n > 3)
		abort();
	for (i = 0; i < n; i++) {
		check_str(c[i].realm, sizeof(c[i].realm));
		check_str(c[i].service, sizeof(c[i].service));
		check_str(c[i].scope, sizeof(c[i].scope));
		check_str(c[i].error, sizeof(c[i].error));
	}
}

static void fuzz_ranges(int which, const char *s, size_t len)
{
	struct fetch_content_range cr;
	uint64_t last;

	if (which == F_UPLOAD_RANGE) {
		fetch_parse_upload_range(s, len, &last);
		return;
	}
	if (fetch_parse_content_range(s, len, &cr))
		return;
	if (cr.first == FETCH_RANGE_UNKNOWN) {
		if (cr.total == FETCH_RANGE_UNKNOWN)
			abort();
	} else if (cr.last < cr.first ||
		   (cr.total != FETCH_RANGE_UNKNOWN && cr.last >= cr.total)) {
		abort();
	}
}

static void fuzz_misc(int which, const char *s, size_t len)
{
	uint8_t out[64];
	char url[128];
	unsigned int ms, life;
	size_t n;
	char *tok;
	int rc;

	switch (which) {
	case F_LINK:
		rc = fetch_parse_link_next(s, len, url, sizeof(url));
		if (rc == 1 && (!url[0] || strlen(url) >= sizeof(url)))
			abort();
		break;
	case F_RETRY_AFTER:
		if (!fetch_parse_retry_after(s, len, 1700000000, &ms) &&
		    ms > FETCH_RETRY_AFTER_MAX_MS)
			abort();
		break;
	case F_BASE64:
		if (!base64_decode(s, len, out, sizeof(out), &n)) {
			uint8_t again[sizeof(out)];
			size_t m;
			char *enc;

			/* What decodes re-encodes to text that decodes alike. */
			if (n > sizeof(out) || base64_encode(out, n, &enc))
				abort();
			if (base64_decode(enc, strlen(enc), again, sizeof(again), &m) ||
			    m != n || memcmp(again, out, n))
				abort();
			free(enc);
		}
		break;
	case F_TOKEN:
		if (!fetch_parse_token(s, len, 1700000000, &tok, &life)) {
			if (!*tok || strpbrk(tok, " \r\n") || !life)
				abort();
			free(tok);
		}
		break;
	}
}

static void check_creds(const struct fetch_creds *c)
{
	switch (c->kind) {
	case FETCH_CREDS_NONE:
		if (c->user || c->secret || c->helper)
			abort();
		break;
	case FETCH_CREDS_BASIC:
		if (!c->user || !*c->user || !c->secret)
			abort();
		break;
	case FETCH_CREDS_TOKEN:
		if (!c->secret || !*c->secret)
			abort();
		break;
	case FETCH_CREDS_HELPER:
		if (!c->helper || strchr(c->helper, '/'))
			abort();
		break;
	}
}

static void fuzz_creds(int which, const char *s, size_t len)
{
	static const char *const hosts[] = { "reg.io", "reg.io:5000",
					     "registry-1.docker.io" };
	struct fetch_creds c;
	size_t i;

	if (which == F_HELPER) {
		if (!fetch_helper_output_parse(s, len, &c)) {
			check_creds(&c);
			fetch_creds_clear(&c);
		}
		return;
	}
	for (i = 0; i < ARRAY_SIZE(hosts); i++) {
		if (fetch_dockercfg_lookup(s, len, hosts[i], &c))
			continue;
		check_creds(&c);
		fetch_creds_clear(&c);
	}
}

static void fuzz_location(const char *s)
{
	char *u;

	if (http_resolve("https://reg.io:5000/v2/a/blobs/uploads/", s, &u))
		return;
	if (strncasecmp(u, "http://", 7) && strncasecmp(u, "https://", 8))
		abort();
	(void)http_same_origin(u, "https://reg.io:5000");
	free(u);
}

/*
 * A registry host: lines "registry", "url", then headers. One that
 * fetch_check_host accepts opens a client (no I/O) whose URLs stay on it.
 */
static void fuzz_host(char *s)
{
	const char *headers[FETCH_HOST_HEADERS_MAX + 2] = { 0 };
	struct fetch_host h = { .headers = headers, .override_path = s[0] & 1 };
	const struct fetch_host *hosts[] = { &h, NULL };
	struct fetch_ref ref = { .repo = (char *)"a" };
	struct fetch_opts opts;
	struct registry *r;
	char why[800], *line, *save = NULL, *url;
	size_t n = 0;

	h.registry = strtok_r(s, "\n", &save);
	h.url = strtok_r(NULL, "\n", &save);
	while (n < FETCH_HOST_HEADERS_MAX + 1 && (line = strtok_r(NULL, "\n", &save)))
		headers[n++] = line;
	if (fetch_check_host(&h, why, sizeof(why))) {
		check_str(why, sizeof(why));
		return;
	}
	fetch_opts_init(&opts);
	opts.hosts = hosts;
	ref.host = (char *)h.registry;
	if (registry_open(&ref, &opts, FETCH_PULL, &r))
		abort();
	if (r->nr_mirrors != 1 || strncmp(h.url, r->mirrors[0]->base,
					  strlen(r->mirrors[0]->base)))
		abort();
	url = reg_url(r->mirrors[0], r->mirrors[0]->base, "/blobs/%s", "x");
	if (!url || strncmp(url, r->mirrors[0]->base, strlen(r->mirrors[0]->base)) ||
	    !strstr(url, "/a/blobs/x"))
		abort();
	free(url);
	registry_close(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t d[FETCH_DIGEST_SIZE];
	char *s, *raw;
	int which;

	ferry_log_level = -1;
	if (!size || size > 65536)
		return 0;
	which = data[0] % F_COUNT;
	/* Parsers taking a length get an exact copy, the others a
	 * NUL-terminated one: either way ASan sees any overread. */
	s = malloc(size);
	raw = malloc(size - 1 ? size - 1 : 1);
	if (!s || !raw) {
		free(s);
		free(raw);
		return 0;
	}
	memcpy(s, data + 1, size - 1);
	s[size - 1] = '\0';
	memcpy(raw, data + 1, size - 1);
	switch (which) {
	case F_REF:
		fuzz_ref(s);
		break;
	case F_DIGEST:
		if (!digest_parse(s, d)) {
			char back[80];

			digest_format(d, back);
			if (strcmp(back, s))
				abort();
		}
		break;
	case F_WWW_AUTH:
		fuzz_www_auth(raw, size - 1);
		break;
	case F_CONTENT_RANGE:
	case F_UPLOAD_RANGE:
		fuzz_ranges(which, raw, size - 1);
		break;
	case F_LINK:
	case F_RETRY_AFTER:
	case F_BASE64:
	case F_TOKEN:
		fuzz_misc(which, raw, size - 1);
		break;
	case F_DOCKERCFG:
	case F_HELPER:
		fuzz_creds(which, raw, size - 1);
		break;
	case F_LOCATION:
		fuzz_location(s);
		break;
	case F_HOST:
		fuzz_host(s);
		break;
	}
	free(s);
	free(raw);
	return 0;
}
