/* SPDX-License-Identifier: MIT */
/*
 * Offline unit tests of pkg-fetch: references and digests, the header
 * parsers (WWW-Authenticate, Content-Range, upload Range, Link,
 * Retry-After), base64, token answers, docker config lookups and
 * credential helpers (a fake docker-credential-ferrytest on PATH), URL
 * resolution, --resolve entries, failure descriptions, the retry policy
 * (verdicts, backoff). The network paths are covered by the e2e tests.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../pkg-base/base.h"
#include "../../pkg-fetch/internal.h"
#include "../test.h"

#define HEX64 "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

static char tmpdir[] = "/tmp/ferry-test-fetch.XXXXXX";

static void write_file(const char *path, const char *text, mode_t mode)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, mode);

	CHECK(fd >= 0);
	if (fd < 0)
		return;
	CHECK(write_full(fd, text, strlen(text)) == 0);
	close(fd);
}

/* ------------------------------------------------------------------ */

static void test_ref_valid(void)
{
	struct fetch_ref r;

	CHECK_EQ(fetch_parse_ref("localhost:5000/foo/bar:v1.2", &r), 0);
	CHECK(!strcmp(r.host, "localhost:5000"));
	CHECK(!strcmp(r.repo, "foo/bar"));
	CHECK(r.tag && !strcmp(r.tag, "v1.2"));
	CHECK(!r.digest);
	fetch_ref_free(&r);

	CHECK_EQ(fetch_parse_ref("docker://registry.example.com/a/b-c/d_e", &r), 0);
	CHECK(!strcmp(r.host, "registry.example.com"));
	CHECK(!strcmp(r.repo, "a/b-c/d_e"));
	CHECK(r.tag && !strcmp(r.tag, "latest") && !r.digest);
	fetch_ref_free(&r);

	CHECK_EQ(fetch_parse_ref("h.io/x@sha256:" HEX64, &r), 0);
	CHECK(r.digest && !strcmp(r.digest, "sha256:" HEX64));
	CHECK(!r.tag);
	fetch_ref_free(&r);

	/* tag@digest: the digest wins, as with docker. */
	CHECK_EQ(fetch_parse_ref("h.io/x:latest@sha256:" HEX64, &r), 0);
	CHECK(r.digest && !r.tag);
	CHECK(!strcmp(r.repo, "x"));
	fetch_ref_free(&r);

	CHECK_EQ(fetch_parse_ref("[::1]:5000/repo:_t", &r), 0);
	CHECK(!strcmp(r.host, "[::1]:5000"));
	CHECK(!strcmp(r.tag, "_t"));
	fetch_ref_free(&r);

	CHECK_EQ(fetch_parse_ref("localhost/a__b.c--d", &r), 0);
	CHECK(!strcmp(r.repo, "a__b.c--d"));
	fetch_ref_free(&r);

	CHECK_EQ(fetch_parse_ref("127.0.0.1:5000/x/y", &r), 0);
	fetch_ref_free(&r);
}

/* Names as Docker and containerd normalise them. */
static void test_ref_normalised(void)
{
	static const struct {
		const char *in, *out;
	} cases[] = {
		{ "debian", "docker.io/library/debian:latest" },
		{ "debian:bookworm", "docker.io/library/debian:bookworm" },
		{ "docker://debian:bookworm", "docker.io/library/debian:bookworm" },
		{ "docker.io/debian", "docker.io/library/debian:latest" },
		{ "docker.io/library/debian:bookworm", "docker.io/library/debian:bookworm" },
		{ "index.docker.io/library/debian:bookworm",
		  "docker.io/library/debian:bookworm" },
		{ "index.docker.io/debian", "docker.io/library/debian:latest" },
		{ "foo/bar", "docker.io/foo/bar:latest" },
		{ "foo/bar/baz:1", "docker.io/foo/bar/baz:1" },
		{ "localhost/a", "localhost/a:latest" },
		{ "localhost:5000", "docker.io/library/localhost:5000" },
		{ "nginx@sha256:" HEX64, "docker.io/library/nginx@sha256:" HEX64 },
		{ "reg.io/x", "reg.io/x:latest" },
		{ "reg.io:5000/x", "reg.io:5000/x:latest" },
		{ "[::1]:5000/x:t", "[::1]:5000/x:t" },
	};
	struct fetch_ref r;
	size_t i;

	for (i = 0; i < ARRAY_SIZE(cases); i++) {
		char *s = NULL;

		CHECK_EQ(fetch_parse_ref(cases[i].in, &r), 0);
		s = fetch_ref_string(&r);
		if (!s || strcmp(s, cases[i].out))
			fprintf(stderr, "  \"%s\" -> \"%s\", want \"%s\"\n",
				cases[i].in, s ? s : "(null)", cases[i].out);
		CHECK(s && !strcmp(s, cases[i].out));
		free(s);
		fetch_ref_free(&r);
	}
	CHECK_EQ(fetch_parse_ref("debian", &r), 0);
	CHECK(!strcmp(r.host, "docker.io") && !strcmp(r.repo, "library/debian"));
	CHECK(!strcmp(fetch_registry_endpoint(r.host), "registry-1.docker.io"));
	CHECK(!strcmp(fetch_registry_endpoint("reg.io:5000"), "reg.io:5000"));
	fetch_ref_free(&r);

	/* The Hub's credentials under the keys docker and containerd use. */
	{
		static const char *const keys[] = { FETCH_HUB_CONFIG_KEY,
						     "index.docker.io", "docker.io",
						     "registry-1.docker.io" };
		struct fetch_creds c;
		char json[256];
		size_t k;

		for (k = 0; k < ARRAY_SIZE(keys); k++) {
			/* "dTpw" is base64 of "u:p". */
			snprintf(json, sizeof(json),
				 "{\"auths\":{\"%s\":{\"auth\":\"dTpw\"}}}", keys[k]);
			CHECK_EQ(fetch_dockercfg_lookup(json, strlen(json), FETCH_HUB, &c), 0);
			CHECK_EQ(c.kind, FETCH_CREDS_BASIC);
			CHECK(c.user && !strcmp(c.user, "u"));
			fetch_creds_clear(&c);
		}
	}
}

static void test_ref_invalid(void)
{
	static const char *const bad[] = {
		"Foo/bar",          /* a host (upper-case) without '.' or ':' */
		"Debian",           /* an upper-case Hub name */
		"h.io/Upper",       /* upper-case repository */
		"h.io/a//b",        /* empty component */
		"h.io/a-",          /* trailing separator */
		"h.io/-a",          /* leading separator */
		"h.io/a___b",       /* three underscores */
		"h.io/a..b",        /* two dots */
		"h.io/a:",          /* empty tag */
		"h.io/a:-x",        /* tag starting with '-' */
		"h.io/a:x/y",       /* '/' after the tag is part of the repo */
		"h.io/a@sha256:abc", /* short digest */
		/* upper-case hex */
		("h.io/a@sha256:0123456789ABCDEF0123456789abcdef"
		 "0123456789abcdef0123456789abcdef"),
		"h.io/a@md5:0123",
		"h.io/",
		":5000/a",
		"h.io:0/a",
		"h.io:99999/a",
		"h.io:/a",
		"-h.io/a",
		"h..io/a",
		"[::1/a",
		"h.io/a b",
		"",
	};
	char longtag[200];
	struct fetch_ref r;
	size_t i;
	int saved = ferry_log_level;

	ferry_log_level = -1;
	for (i = 0; i < ARRAY_SIZE(bad); i++) {
		int err = fetch_parse_ref(bad[i], &r);

		if (err != -EINVAL)
			fprintf(stderr, "  accepted \"%s\"\n", bad[i]);
		CHECK_EQ(err, -EINVAL);
		CHECK(!r.host && !r.repo);
	}
	memset(longtag, 'a', sizeof(longtag));
	memcpy(longtag, "h.io/r:", 7);
	longtag[7 + 129] = '\0';
	CHECK_EQ(fetch_parse_ref(longtag, &r), -EINVAL);
	longtag[7 + 128] = '\0';
	CHECK_EQ(fetch_parse_ref(longtag, &r), 0);
	fetch_ref_free(&r);
	ferry_log_level = saved;
}

static void test_digest(void)
{
	uint8_t d[FETCH_DIGEST_SIZE];
	char s[80];

	CHECK_EQ(digest_parse("sha256:" HEX64, d), 0);
	CHECK_EQ(d[0], 0x01);
	CHECK_EQ(d[31], 0xef);
	digest_format(d, s);
	CHECK(!strcmp(s, "sha256:" HEX64));
	CHECK_EQ(digest_parse("sha256:" HEX64 "0", d), -EINVAL);
	CHECK_EQ(digest_parse("sha256:0123", d), -EINVAL);
	CHECK_EQ(digest_parse("SHA256:" HEX64, d), -EINVAL);
	CHECK_EQ(digest_parse("sha256:" "0123456789abcdef0123456789abcdef"
				    "0123456789abcdef0123456789abcdeF", d),
		 -EINVAL);
	CHECK_EQ(digest_parse("sha256:" "0123456789abcdef0123456789abcdef"
				    "0123456789abcdef0123456789abcdeg", d),
		 -EINVAL);
	CHECK_EQ(digest_parse("sha512:" HEX64, d), -EINVAL);
	CHECK_EQ(digest_parse(NULL, d), -EINVAL);
}

/* ------------------------------------------------------------------ */

static int www(const char *s, struct fetch_challenge *c, int max)
{
	return fetch_parse_www_auth(s, strlen(s), c, max);
}

static void test_www_auth(void)
{
	struct fetch_challenge c[4];
	char big[4000];

	CHECK_EQ(www("Bearer realm=\"https://auth.io/token\",service=\"reg.io\","
		     "scope=\"repository:a/b:pull,push\"", c, 4), 1);
	CHECK_EQ(c[0].scheme, FETCH_CHAL_BEARER);
	CHECK(!strcmp(c[0].realm, "https://auth.io/token"));
	CHECK(!strcmp(c[0].service, "reg.io"));
	CHECK(!strcmp(c[0].scope, "repository:a/b:pull,push"));
	CHECK(!c[0].error[0]);

	CHECK_EQ(www("Basic realm=\"basic-realm\"", c, 4), 1);
	CHECK_EQ(c[0].scheme, FETCH_CHAL_BASIC);
	CHECK(!strcmp(c[0].realm, "basic-realm"));

	/* Several challenges; commas inside quotes; escapes; odd spacing. */
	CHECK_EQ(www("Basic realm=\"a, b\" , bearer  realm = \"https://t/x\" ,"
		     "service=\"s\\\"q\",error=\"insufficient_scope\"", c, 4), 2);
	CHECK_EQ(c[0].scheme, FETCH_CHAL_BASIC);
	CHECK(!strcmp(c[0].realm, "a, b"));
	CHECK_EQ(c[1].scheme, FETCH_CHAL_BEARER);
	CHECK(!strcmp(c[1].realm, "https://t/x"));
	CHECK(!strcmp(c[1].service, "s\"q"));
	CHECK(!strcmp(c[1].error, "insufficient_scope"));

	/* token68 credentials, unknown schemes and parameters. */
	CHECK_EQ(www("Negotiate abc==, Basic realm=r, Foo x=\"1\", "
		     "Bearer realm=\"https://a\",other=\"z\"", c, 4), 4);
	CHECK_EQ(c[0].scheme, FETCH_CHAL_OTHER);
	CHECK_EQ(c[1].scheme, FETCH_CHAL_BASIC);
	CHECK(!strcmp(c[1].realm, "r"));
	CHECK_EQ(c[2].scheme, FETCH_CHAL_OTHER);
	CHECK_EQ(c[3].scheme, FETCH_CHAL_BEARER);
	CHECK(!strcmp(c[3].realm, "https://a"));

	/* More challenges than room: the first ones are kept. */
	CHECK_EQ(www("Basic realm=a, Basic realm=b, Bearer realm=\"x\"", c, 2), 2);
	CHECK(!strcmp(c[1].realm, "b"));

	CHECK_EQ(www("", c, 4), -EINVAL);
	CHECK_EQ(www(" , ", c, 4), -EINVAL);
	CHECK_EQ(www("=x", c, 4), -EINVAL);
	CHECK_EQ(www("\"Bearer\"", c, 4), -EINVAL);
	/* An unterminated quote loses the parameter, not the scheme. */
	CHECK_EQ(www("Bearer realm=\"https://a", c, 4), 1);
	CHECK(!c[0].realm[0]);
	/* Control bytes inside a quoted value. */
	CHECK_EQ(www("Bearer realm=\"a\001b\"", c, 4), 1);
	CHECK(!c[0].realm[0]);
	/* A realm longer than its field is refused. */
	memset(big, 'a', sizeof(big));
	memcpy(big, "Bearer realm=\"", 14);
	big[sizeof(big) - 2] = '"';
	big[sizeof(big) - 1] = '\0';
	CHECK_EQ(www(big, c, 4), 1);
	CHECK(!c[0].realm[0]);
	/* The length bounds the parse, not a NUL. */
	CHECK_EQ(fetch_parse_www_auth("Basic realm=\"abc\"XYZ", 17, c, 4), 1);
	CHECK(!strcmp(c[0].realm, "abc"));
}

static int crange(const char *s, struct fetch_content_range *cr)
{
	return fetch_parse_content_range(s, strlen(s), cr);
}

static void test_content_range(void)
{
	struct fetch_content_range cr;
	uint64_t last;

	CHECK_EQ(crange("bytes 0-99/100", &cr), 0);
	CHECK(cr.first == 0 && cr.last == 99 && cr.total == 100);
	CHECK_EQ(crange(" bytes 5-5/*", &cr), 0);
	CHECK(cr.first == 5 && cr.last == 5 && cr.total == FETCH_RANGE_UNKNOWN);
	CHECK_EQ(crange("bytes */4096", &cr), 0);
	CHECK(cr.first == FETCH_RANGE_UNKNOWN && cr.total == 4096);
	CHECK_EQ(crange("BYTES 1-2/3", &cr), 0);
	CHECK_EQ(crange("bytes 0-18446744073709551614/18446744073709551615", &cr),
		 -EINVAL); /* total would be the "unknown" marker */
	CHECK_EQ(crange("bytes 0-18446744073709551613/18446744073709551614", &cr),
		 0);
	CHECK(cr.last == UINT64_MAX - 2);

	CHECK_EQ(crange("bytes */*", &cr), -EINVAL);
	CHECK_EQ(crange("bytes 5-4/10", &cr), -EINVAL);
	CHECK_EQ(crange("bytes 0-100/100", &cr), -EINVAL);
	CHECK_EQ(crange("bytes 0-99999999999999999999/1", &cr), -EINVAL);
	CHECK_EQ(crange("bytes=0-9/10", &cr), -EINVAL);
	CHECK_EQ(crange("items 0-1/2", &cr), -EINVAL);
	CHECK_EQ(crange("bytes 0-1/2 x", &cr), -EINVAL);
	CHECK_EQ(crange("bytes -1-2/3", &cr), -EINVAL);
	CHECK_EQ(crange("bytes 1-/3", &cr), -EINVAL);
	CHECK_EQ(crange("bytes", &cr), -EINVAL);
	CHECK_EQ(crange("", &cr), -EINVAL);

	CHECK_EQ(fetch_parse_upload_range("0-1999", 6, &last), 0);
	CHECK_EQ(last, 1999);
	CHECK_EQ(fetch_parse_upload_range("bytes=0-5", 9, &last), 0);
	CHECK_EQ(last, 5);
	CHECK_EQ(fetch_parse_upload_range("1-5", 3, &last), -EINVAL);
	CHECK_EQ(fetch_parse_upload_range("0-", 2, &last), -EINVAL);
	CHECK_EQ(fetch_parse_upload_range("0-5x", 4, &last), -EINVAL);
}

static int link_next(const char *s, char *url, size_t cap)
{
	return fetch_parse_link_next(s, strlen(s), url, cap);
}

static void test_link(void)
{
	char url[256];

	CHECK_EQ(link_next("</v2/a/tags/list?last=x&n=2>; rel=\"next\"", url,
			   sizeof(url)), 1);
	CHECK(!strcmp(url, "/v2/a/tags/list?last=x&n=2"));
	CHECK_EQ(link_next("<https://h/a>; rel=\"prev\", <https://h/b,c>;"
			   " title=\"x, y\"; rel=next", url, sizeof(url)), 1);
	CHECK(!strcmp(url, "https://h/b,c"));
	CHECK_EQ(link_next("<a>; rel=\"prev NEXT\"", url, sizeof(url)), 1);
	CHECK(!strcmp(url, "a"));
	CHECK_EQ(link_next("<a>; rel=\"prev\"", url, sizeof(url)), 0);
	CHECK_EQ(link_next("<a>; rel=\"nextpage\"", url, sizeof(url)), 0);
	CHECK_EQ(link_next("", url, sizeof(url)), 0);
	CHECK_EQ(link_next("a; rel=next", url, sizeof(url)), -EINVAL);
	CHECK_EQ(link_next("<a; rel=next", url, sizeof(url)), -EINVAL);
	CHECK_EQ(link_next("<a b>; rel=next", url, sizeof(url)), -EINVAL);
	CHECK_EQ(link_next("<>; rel=next", url, sizeof(url)), -EINVAL);
	CHECK_EQ(link_next("<abcdef>; rel=next", url, 4), -EINVAL);
	CHECK_EQ(link_next("<a> rel=next", url, sizeof(url)), -EINVAL);
}

static void test_retry_after(void)
{
	/* Sun, 06 Nov 1994 08:49:37 GMT */
	const time_t t = 784111777;
	unsigned int ms = 7;

	CHECK_EQ(fetch_parse_retry_after("5", 1, t, &ms), 0);
	CHECK_EQ(ms, 5000);
	CHECK_EQ(fetch_parse_retry_after(" 0 ", 3, t, &ms), 0);
	CHECK_EQ(ms, 0);
	CHECK_EQ(fetch_parse_retry_after("120", 3, t, &ms), 0);
	CHECK_EQ(ms, FETCH_RETRY_AFTER_MAX_MS);
	CHECK_EQ(fetch_parse_retry_after("99999999999999999999999", 23, t, &ms), 0);
	CHECK_EQ(ms, FETCH_RETRY_AFTER_MAX_MS);
	CHECK_EQ(fetch_parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", 29,
					 t - 3, &ms), 0);
	CHECK_EQ(ms, 3000);
	CHECK_EQ(fetch_parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", 29,
					 t + 100, &ms), 0);
	CHECK_EQ(ms, 0);
	CHECK_EQ(fetch_parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", 29,
					 t - 3600, &ms), 0);
	CHECK_EQ(ms, FETCH_RETRY_AFTER_MAX_MS);
	CHECK_EQ(fetch_parse_retry_after("Sun, 06 Foo 1994 08:49:37 GMT", 29, t,
					 &ms), -EINVAL);
	CHECK_EQ(fetch_parse_retry_after("Sun, 06 Nov 1994 25:49:37 GMT", 29, t,
					 &ms), -EINVAL);
	CHECK_EQ(fetch_parse_retry_after("Sunday, 06-Nov-94 08:49:37 GMT", 30, t,
					 &ms), -EINVAL);
	CHECK_EQ(fetch_parse_retry_after("5s", 2, t, &ms), -EINVAL);
	CHECK_EQ(fetch_parse_retry_after("-5", 2, t, &ms), -EINVAL);
	CHECK_EQ(fetch_parse_retry_after("", 0, t, &ms), -EINVAL);
}

static void test_token(void)
{
	const time_t now = 1700000000; /* 2023-11-14T22:13:20Z */
	unsigned int life;
	char *tok;

#define TOK(json) fetch_parse_token(json, strlen(json), now, &tok, &life)
	CHECK_EQ(TOK("{\"token\":\"abc.def\",\"expires_in\":300}"), 0);
	CHECK(!strcmp(tok, "abc.def"));
	CHECK_EQ(life, 300);
	free(tok);
	CHECK_EQ(TOK("{\"access_token\":\"xyz\"}"), 0);
	CHECK(!strcmp(tok, "xyz"));
	CHECK_EQ(life, 60);
	free(tok);
	/* "token" empty: access_token counts. */
	CHECK_EQ(TOK("{\"token\":\"\",\"access_token\":\"q\",\"expires_in\":-4}"), 0);
	CHECK(!strcmp(tok, "q"));
	CHECK_EQ(life, 60);
	free(tok);
	/* Issued 100 s ago: 200 s left. */
	CHECK_EQ(TOK("{\"token\":\"t\",\"expires_in\":300,"
		     "\"issued_at\":\"2023-11-14T22:11:40Z\"}"), 0);
	CHECK_EQ(life, 200);
	free(tok);
	CHECK_EQ(TOK("{\"token\":\"t\",\"expires_in\":300,"
		     "\"issued_at\":\"2023-11-14T23:11:40.123+01:00\"}"), 0);
	CHECK_EQ(life, 200);
	free(tok);
	/* issued_at in the future or too long ago: our clock decides. */
	CHECK_EQ(TOK("{\"token\":\"t\",\"expires_in\":300,"
		     "\"issued_at\":\"2023-11-14T23:11:40Z\"}"), 0);
	CHECK_EQ(life, 300);
	free(tok);
	CHECK_EQ(TOK("{\"token\":\"t\",\"expires_in\":300,"
		     "\"issued_at\":\"2020-01-01T00:00:00Z\"}"), 0);
	CHECK_EQ(life, 300);
	free(tok);
	CHECK_EQ(TOK("{\"token\":\"t\",\"issued_at\":\"yesterday\"}"), 0);
	free(tok);

	CHECK_EQ(TOK("{\"token\":\"a b\"}"), -EINVAL);
	CHECK_EQ(TOK("{\"token\":\"a\\nb\"}"), -EINVAL);
	CHECK_EQ(TOK("{\"token\":5}"), -EINVAL);
	CHECK_EQ(TOK("{}"), -EINVAL);
	CHECK_EQ(TOK("[\"token\"]"), -EINVAL);
	CHECK_EQ(TOK("{\"token\":\"a\"} x"), -EINVAL);
	CHECK_EQ(TOK("{\"token\":\"a\""), -EINVAL);
#undef TOK
}

/* ------------------------------------------------------------------ */

static int cfg(const char *json, const char *host, struct fetch_creds *c)
{
	return fetch_dockercfg_lookup(json, strlen(json), host, c);
}

static void test_dockercfg(void)
{
	struct fetch_creds c;

	/* "auth" under the host, a URL key, a key with a path. */
	CHECK_EQ(cfg("{\"auths\":{\"reg.io:5000\":{\"auth\":\"YWxpY2U6czNjcmV0\"}}}",
		      "reg.io:5000", &c), 0);
	CHECK_EQ(c.kind, FETCH_CREDS_BASIC);
	CHECK(c.user && !strcmp(c.user, "alice"));
	CHECK(c.secret && !strcmp(c.secret, "s3cret"));
	fetch_creds_clear(&c);
	CHECK_EQ(cfg("{\"auths\":{\"https://reg.io:5000/v1/\":{\"auth\":\"YTpiOmM=\"}}}",
		      "reg.io:5000", &c), 0);
	CHECK_EQ(c.kind, FETCH_CREDS_BASIC);
	CHECK(!strcmp(c.user, "a") && !strcmp(c.secret, "b:c"));
	fetch_creds_clear(&c);
	CHECK_EQ(cfg("{\"auths\":{\"http://REG.io:5000\":{\"auth\":\"YTpi\"}}}",
		      "reg.io:5000", &c), 0);
	CHECK_EQ(c.kind, FETCH_CREDS_BASIC);
	fetch_creds_clear(&c);
	/* Another port is another registry. */
	CHECK_EQ(cfg("{\"auths\":{\"reg.io:5001\":{\"auth\":\"YTpi\"}}}",
		      "reg.io:5000", &c), 0);
	CHECK_EQ(c.kind, FETCH_CREDS_NONE);
	CHECK_EQ(cfg("{\"auths\":{\"reg.io\":{\"auth\":\"YTpi\"}}}",
		      "reg.io:5000", &c), 0);
	CHECK_EQ(c.kind, FETCH_CREDS_NONE);
	/* Docker Hub's legacy key. */
	CHECK_EQ(cfg("{\"auths\":{\"https://index.docker.io/v1/\":{\"auth\":\"YTpi\"}}}",
		      "registry-1.docker.io", &c), 0);
	CHECK_EQ(c.kind, FETCH_CREDS_BASIC);
	fetch_creds_clear(&c);
	/* identitytoken wins over auth. */
	CHECK_EQ(cfg("{\"auths\":{\"r.io\":{\"auth\":\"YTpi\",\"identitytoken\":\"rt\"}}}",
		      "r.io", &c), 0);
	CHECK_EQ(c.kind, FETCH_CREDS_TOKEN);
	CHECK(!strcmp(c.secret, "rt") && !strcmp(c.user, "a"));
	fetch_creds_clear(&c);
	/* Empty entries (credsStore placeholders) fall through to the store. */
	CHECK_EQ(cfg("{\"auths\":{\"r.io\":{}},\"credsStore\":\"desktop\"}",
		      "r.io", &c), 0);
	CHECK_EQ(c.kind, FETCH_CREDS_HELPER);
	CHECK(!strcmp(c.helper, "desktop"));
	fetch_creds_clear(&c);
	/* credHelpers wins over auths and credsStore. */
	CHECK_EQ(cfg("{\"credsStore\":\"desktop\",\"auths\":{\"r.io\":{\"auth\":\"YTpi\"}},"
		      "\"credHelpers\":{\"r.io\":\"ecr-login\"}}", "r.io", &c), 0);
	CHECK_EQ(c.kind, FETCH_CREDS_HELPER);
	CHECK(!strcmp(c.helper, "ecr-login"));
	fetch_creds_clear(&c);
	CHECK_EQ(cfg("{\"credHelpers\":{\"other.io\":\"x\"}}", "r.io", &c), 0);
	CHECK_EQ(c.kind, FETCH_CREDS_NONE);
	CHECK_EQ(cfg("{}", "r.io", &c), 0);
	CHECK_EQ(c.kind, FETCH_CREDS_NONE);
	/* username/password fields (older writers). */
	CHECK_EQ(cfg("{\"auths\":{\"r.io\":{\"username\":\"u\",\"password\":\"p\"}}}",
		      "r.io", &c), 0);
	CHECK_EQ(c.kind, FETCH_CREDS_BASIC);
	CHECK(!strcmp(c.user, "u") && !strcmp(c.secret, "p"));
	fetch_creds_clear(&c);

	/* Malformed input. */
	CHECK_EQ(cfg("{\"auths\":", "r.io", &c), -EINVAL);
	CHECK_EQ(cfg("[]", "r.io", &c), -EINVAL);
	CHECK_EQ(cfg("{\"auths\":{\"r.io\":{\"auth\":\"!!!!\"}}}", "r.io", &c), -EINVAL);
	/* "alice" without ':' */
	CHECK_EQ(cfg("{\"auths\":{\"r.io\":{\"auth\":\"YWxpY2U=\"}}}", "r.io", &c), -EINVAL);
	/* ":pass" (no user) */
	CHECK_EQ(cfg("{\"auths\":{\"r.io\":{\"auth\":\"OnBhc3M=\"}}}", "r.io", &c), -EINVAL);
	/* "a:b\n" control byte */
	CHECK_EQ(cfg("{\"auths\":{\"r.io\":{\"auth\":\"YTpiCg==\"}}}", "r.io", &c), -EINVAL);
	/* a helper name that could escape the docker-credential- prefix */
	CHECK_EQ(cfg("{\"credHelpers\":{\"r.io\":\"../../bin/sh\"}}", "r.io", &c), -EINVAL);
	CHECK_EQ(cfg("{\"credsStore\":\"a b\"}", "r.io", &c), -EINVAL);
	CHECK_EQ(c.kind, FETCH_CREDS_NONE);

	CHECK(fetch_cfg_key_matches("https://r.io:5000/v2/", "r.io:5000"));
	CHECK(fetch_cfg_key_matches("R.IO", "r.io"));
	CHECK(!fetch_cfg_key_matches("r.io.evil", "r.io"));
	CHECK(!fetch_cfg_key_matches("ftp://r.io", "r.io"));
}

static void test_helper_output(void)
{
	struct fetch_creds c;
	const char *s;

	s = "{\"ServerURL\":\"r.io\",\"Username\":\"bob\",\"Secret\":\"pw\"}";
	CHECK_EQ(fetch_helper_output_parse(s, strlen(s), &c), 0);
	CHECK_EQ(c.kind, FETCH_CREDS_BASIC);
	CHECK(!strcmp(c.user, "bob") && !strcmp(c.secret, "pw"));
	fetch_creds_clear(&c);
	s = "{\"Username\":\"<token>\",\"Secret\":\"refresh\"}";
	CHECK_EQ(fetch_helper_output_parse(s, strlen(s), &c), 0);
	CHECK_EQ(c.kind, FETCH_CREDS_TOKEN);
	CHECK(!c.user && !strcmp(c.secret, "refresh"));
	fetch_creds_clear(&c);
	s = "{\"Username\":\"bob\"}";
	CHECK_EQ(fetch_helper_output_parse(s, strlen(s), &c), -EINVAL);
	s = "{\"Secret\":\"pw\"}";
	CHECK_EQ(fetch_helper_output_parse(s, strlen(s), &c), -EINVAL);
	s = "credentials not found in native keychain";
	CHECK_EQ(fetch_helper_output_parse(s, strlen(s), &c), -EINVAL);
}

/* A fake helper: answers for hosts starting "good", fails otherwise. */
static const char helper_script[] =
	"#!/bin/sh\n"
	"[ \"$1\" = get ] || exit 9\n"
	"read -r host\n"
	"case \"$host\" in\n"
	"good*) printf '{\"ServerURL\":\"%s\",\"Username\":\"hu\",\"Secret\":\"hp\"}' \"$host\";;\n"
	"tok*) printf '{\"Username\":\"<token>\",\"Secret\":\"idt\"}';;\n"
	"junk*) echo 'not json';;\n"
	"*) echo 'credentials not found in native keychain'; exit 1;;\n"
	"esac\n";

static void test_cred_helper(void)
{
	char path[256], bin[200], cfgfile[256], *oldpath, *newpath = NULL;
	struct fetch_opts opts;
	struct fetch_creds c;
	int saved = ferry_log_level;

	snprintf(bin, sizeof(bin), "%s/bin", tmpdir);
	CHECK(mkdir(bin, 0755) == 0);
	snprintf(path, sizeof(path), "%s/docker-credential-ferrytest", bin);
	write_file(path, helper_script, 0755);
	oldpath = getenv("PATH") ? strdup(getenv("PATH")) : NULL;
	CHECK(asprintf(&newpath, "%s:%s", bin, oldpath ? oldpath : "/usr/bin:/bin") > 0);
	setenv("PATH", newpath, 1);
	ferry_log_level = -1;

	CHECK_EQ(fetch_run_cred_helper("ferrytest", "good.io:5000", &c), 0);
	CHECK_EQ(c.kind, FETCH_CREDS_BASIC);
	CHECK(c.user && !strcmp(c.user, "hu") && !strcmp(c.secret, "hp"));
	fetch_creds_clear(&c);
	CHECK_EQ(fetch_run_cred_helper("ferrytest", "tok.io", &c), 0);
	CHECK_EQ(c.kind, FETCH_CREDS_TOKEN);
	CHECK(!strcmp(c.secret, "idt"));
	fetch_creds_clear(&c);
	CHECK_EQ(fetch_run_cred_helper("ferrytest", "other.io", &c), -ENOENT);
	CHECK_EQ(c.kind, FETCH_CREDS_NONE);
	CHECK_EQ(fetch_run_cred_helper("ferrytest", "junk.io", &c), -EINVAL);
	CHECK_EQ(fetch_run_cred_helper("ferry-no-such-helper", "good.io", &c),
		 -ENOENT);
	CHECK_EQ(fetch_run_cred_helper("../x", "good.io", &c), -EINVAL);

	/* Through a config file: credHelpers names the helper. */
	snprintf(cfgfile, sizeof(cfgfile), "%s/config.json", tmpdir);
	write_file(cfgfile,
		   "{\"auths\":{\"good.io\":{\"auth\":\"YTpi\"}},"
		   "\"credHelpers\":{\"good.io\":\"ferrytest\","
		   "\"other.io\":\"ferrytest\"}}", 0600);
	fetch_opts_init(&opts);
	CHECK(opts.tls_verify);
	opts.authfile = cfgfile;
	CHECK_EQ(fetch_load_creds(&opts, "good.io", &c), 0);
	CHECK_EQ(c.kind, FETCH_CREDS_BASIC);
	CHECK(c.user && !strcmp(c.user, "hu"));
	fetch_creds_clear(&c);
	/* The helper has nothing: no credentials, no error. */
	CHECK_EQ(fetch_load_creds(&opts, "other.io", &c), 0);
	CHECK_EQ(c.kind, FETCH_CREDS_NONE);
	/* $DOCKER_CONFIG/config.json when no file is named. */
	opts.authfile = NULL;
	unsetenv("REGISTRY_AUTH_FILE");
	setenv("DOCKER_CONFIG", tmpdir, 1);
	CHECK_EQ(fetch_load_creds(&opts, "good.io", &c), 0);
	CHECK_EQ(c.kind, FETCH_CREDS_BASIC);
	fetch_creds_clear(&c);
	/* $REGISTRY_AUTH_FILE comes first. */
	snprintf(path, sizeof(path), "%s/auth.json", tmpdir);
	write_file(path, "{\"auths\":{\"good.io\":{\"auth\":\"eDp5\"}}}", 0600);
	setenv("REGISTRY_AUTH_FILE", path, 1);
	CHECK_EQ(fetch_load_creds(&opts, "good.io", &c), 0);
	CHECK(c.user && !strcmp(c.user, "x") && !strcmp(c.secret, "y"));
	fetch_creds_clear(&c);
	/* "USER:PASS" from the caller beats every file. */
	opts.creds = "me:pw:x";
	CHECK_EQ(fetch_load_creds(&opts, "good.io", &c), 0);
	CHECK(!strcmp(c.user, "me") && !strcmp(c.secret, "pw:x"));
	fetch_creds_clear(&c);
	opts.creds = "nocolon";
	CHECK_EQ(fetch_load_creds(&opts, "good.io", &c), -EINVAL);
	opts.creds = NULL;
	/* A named file that is missing is an error; a default one is not. */
	opts.authfile = "/nonexistent/ferry/config.json";
	CHECK_EQ(fetch_load_creds(&opts, "good.io", &c), -ENOENT);
	opts.authfile = NULL;
	unsetenv("REGISTRY_AUTH_FILE");
	setenv("DOCKER_CONFIG", "/nonexistent/ferry", 1);
	CHECK_EQ(fetch_load_creds(&opts, "good.io", &c), 0);
	CHECK_EQ(c.kind, FETCH_CREDS_NONE);
	/* A malformed file is an error. */
	write_file(cfgfile, "{\"auths\":[", 0600);
	setenv("DOCKER_CONFIG", tmpdir, 1);
	CHECK_EQ(fetch_load_creds(&opts, "good.io", &c), -EINVAL);
	unsetenv("DOCKER_CONFIG");

	ferry_log_level = saved;
	if (oldpath)
		setenv("PATH", oldpath, 1);
	free(oldpath);
	free(newpath);
}

/* ------------------------------------------------------------------ */

/* A pipe holding @text, for fetch_creds_password. */
static int pipe_with(const char *text)
{
	int p[2];

	if (pipe(p))
		return -1;
	CHECK(write_full(p[1], text, strlen(text)) == 0);
	close(p[1]);
	return p[0];
}

/* Credentials kept out of argv: --creds-file and --password-stdin. */
static void test_creds_sources(void)
{
	char path[256], out[FETCH_CREDS_MAX + 1], *big;
	int fd;

	snprintf(path, sizeof(path), "%s/creds", tmpdir);
	write_file(path, "alice:pa:ss word\n", 0600);
	CHECK_EQ(fetch_creds_file(path, out), 0);
	CHECK(!strcmp(out, "alice:pa:ss word"));
	write_file(path, "alice:pw\r\n", 0600);
	CHECK_EQ(fetch_creds_file(path, out), 0);
	CHECK(!strcmp(out, "alice:pw"));
	/* Readable (or writable) by group or others: refused, chmod 600 says how. */
	CHECK_EQ(chmod(path, 0640), 0);
	CHECK_EQ(fetch_creds_file(path, out), -EACCES);
	CHECK_EQ(chmod(path, 0602), 0);
	CHECK_EQ(fetch_creds_file(path, out), -EACCES);
	CHECK_EQ(chmod(path, 0400), 0);
	CHECK_EQ(fetch_creds_file(path, out), 0);
	unlink(path);
	/* Not one line USER:PASS, too long, not a file, missing. */
	write_file(path, "alice:pw\nbob:pw\n", 0600);
	CHECK_EQ(fetch_creds_file(path, out), -EBADMSG);
	write_file(path, "no-colon\n", 0600);
	CHECK_EQ(fetch_creds_file(path, out), -EBADMSG);
	write_file(path, ":pw\n", 0600);
	CHECK_EQ(fetch_creds_file(path, out), -EBADMSG);
	write_file(path, "alice:\n", 0600);
	CHECK_EQ(fetch_creds_file(path, out), -EBADMSG);
	big = malloc(FETCH_CREDS_MAX + 2);
	memset(big, 'x', FETCH_CREDS_MAX + 1);
	big[1] = ':';
	big[FETCH_CREDS_MAX + 1] = '\0';
	write_file(path, big, 0600);
	CHECK_EQ(fetch_creds_file(path, out), -EBADMSG);
	big[FETCH_CREDS_MAX] = '\0'; /* exactly the limit */
	write_file(path, big, 0600);
	CHECK_EQ(fetch_creds_file(path, out), 0);
	CHECK_EQ(strlen(out), FETCH_CREDS_MAX);
	CHECK_EQ(fetch_creds_file(tmpdir, out), -EBADMSG); /* a directory */
	CHECK_EQ(fetch_creds_file("/nonexistent/creds", out), -ENOENT);

	fd = pipe_with("s3cret\n");
	CHECK_EQ(fetch_creds_password(fd, "bob", out), 0);
	CHECK(!strcmp(out, "bob:s3cret"));
	close(fd);
	fd = pipe_with("");
	CHECK_EQ(fetch_creds_password(fd, "bob", out), -EBADMSG);
	close(fd);
	fd = pipe_with("two\nlines\n");
	CHECK_EQ(fetch_creds_password(fd, "bob", out), -EBADMSG);
	close(fd);
	fd = pipe_with("pw");
	CHECK_EQ(fetch_creds_password(fd, "b:ob", out), -EBADMSG);
	close(fd);
	fd = pipe_with(big + 2);
	CHECK_EQ(fetch_creds_password(fd, "bob", out), -EBADMSG);
	close(fd);
	free(big);
}

static void test_urls(void)
{
	const char *base = "https://reg.io:5000/v2/a/blobs/uploads/";
	char *u;

	CHECK_EQ(http_resolve(base, "http://x.io/up?_state=a%2Fb==", &u), 0);
	CHECK(!strcmp(u, "http://x.io/up?_state=a%2Fb=="));
	free(u);
	CHECK_EQ(http_resolve(base, "/v2/a/blobs/uploads/id?_state=Zz%3D", &u), 0);
	CHECK(!strcmp(u, "https://reg.io:5000/v2/a/blobs/uploads/id?_state=Zz%3D"));
	free(u);
	CHECK_EQ(http_resolve(base, "id2?x=1", &u), 0);
	CHECK(!strcmp(u, "https://reg.io:5000/v2/a/blobs/uploads/id2?x=1"));
	free(u);
	CHECK_EQ(http_resolve("https://reg.io/v2/a/tags/list", "?n=1&last=b", &u), 0);
	CHECK(!strcmp(u, "https://reg.io/v2/a/tags/list?n=1&last=b"));
	free(u);
	CHECK_EQ(http_resolve(base, "/a b", &u), -EPROTO);
	CHECK_EQ(http_resolve(base, "/a\r\nX: y", &u), -EPROTO);
	CHECK_EQ(http_resolve(base, "", &u), -EPROTO);
	CHECK_EQ(http_resolve(base, "file:///etc/passwd", &u), -EPROTO);

	CHECK(http_same_origin("https://R.io/a", "https://r.io:443/b"));
	CHECK(!http_same_origin("https://r.io/a", "http://r.io/a"));
	CHECK(!http_same_origin("https://r.io:5000/a", "https://r.io:5001/a"));
	CHECK(!http_same_origin("https://r.io/a", "https://s3.r.io/a"));

	u = http_escape("repository:a/b:pull,push x");
	CHECK(u && !strcmp(u, "repository%3Aa%2Fb%3Apull%2Cpush%20x"));
	free(u);
}

static void test_resolve(void)
{
	static const char *const good[] = {
		"registry.ferry.test:5000:127.0.0.1",
		"reg.io:443:10.0.0.1,10.0.0.2",
		"my_reg-1.example:1:[::1]",
		"r.io:65535:[2001:db8::1],192.0.2.7",
		"localhost:8080:127.0.0.2",
	};
	static const char *const bad[] = {
		"", "reg.io", "reg.io:5000", ":5000:127.0.0.1",
		"reg.io::127.0.0.1", "reg.io:0:127.0.0.1",
		"reg.io:65536:127.0.0.1", "reg.io:123456:127.0.0.1",
		"reg.io:+80:127.0.0.1", "reg.io:80:", "reg.io:80:127.0.0",
		"reg.io:80:127.0.0.1,", "reg.io:80:,127.0.0.1",
		"reg.io:80:::1", "reg.io:80:[::1", "reg.io:80:[]",
		"reg.io:80:[127.0.0.1]", "reg.io:80:example.com",
		"reg.io:80:127.0.0.1 ", "-reg.io:80:127.0.0.1",
		"+reg.io:80:127.0.0.1", "*:80:127.0.0.1", "reg.io.:80:1.2.3.4",
		"[::1]:80:127.0.0.1", "re g.io:80:1.2.3.4",
	};
	const char *list[] = { "reg.io:5000:127.0.0.1", "reg.io:443:[::1]",
			       NULL };
	const char *bad_list[] = { "reg.io:5000:127.0.0.1", "reg.io:443",
				   NULL };
	struct fetch_opts opts;
	struct fetch_ref ref;
	struct registry *r;
	char *big;
	int saved = ferry_log_level;
	size_t i;

	for (i = 0; i < sizeof(good) / sizeof(*good); i++) {
		if (fetch_check_resolve(good[i]))
			fprintf(stderr, "  rejected: %s\n", good[i]);
		CHECK_EQ(fetch_check_resolve(good[i]), 0);
	}
	ferry_log_level = -1;
	for (i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
		if (!fetch_check_resolve(bad[i]))
			fprintf(stderr, "  accepted: \"%s\"\n", bad[i]);
		CHECK_EQ(fetch_check_resolve(bad[i]), -EINVAL);
	}
	big = malloc(3000);
	CHECK(big != NULL);
	if (big) {
		memset(big, 'a', 3000);
		memcpy(big + 2980, ":80:127.0.0.1", 14);
		CHECK_EQ(fetch_check_resolve(big), -EINVAL);
		free(big);
	}

	/* registry_open checks the list and hands it to libcurl. */
	fetch_opts_init(&opts);
	opts.resolve = list;
	CHECK_EQ(fetch_parse_ref("reg.io:5000/a", &ref), 0);
	CHECK_EQ(registry_open(&ref, &opts, FETCH_PULL, &r), 0);
	CHECK(r->resolve && !strcmp(r->resolve->data, list[0]) &&
	      r->resolve->next && !strcmp(r->resolve->next->data, list[1]) &&
	      !r->resolve->next->next);
	/* The address changes nothing about the URL (TLS uses the name). */
	CHECK(!strcmp(r->base, "https://reg.io:5000"));
	registry_close(r);
	opts.resolve = bad_list;
	CHECK_EQ(registry_open(&ref, &opts, FETCH_PULL, &r), -EINVAL);
	fetch_ref_free(&ref);
	ferry_log_level = saved;
}

/* Messages for transport failures: TLS problems say so, with detail. */
static void test_describe(void)
{
	struct http_resp resp = { 0 };
	char buf[320];

	http_resp_reset(&resp);
	resp.status = 503;
	http_describe(&resp, 0, buf, sizeof(buf));
	CHECK(!strcmp(buf, "HTTP 503"));
	resp.status = 0;
	resp.cc = CURLE_PEER_FAILED_VERIFICATION;
	snprintf(resp.errbuf, sizeof(resp.errbuf),
		 "SSL certificate problem: unable to get local issuer "
		 "certificate");
	http_describe(&resp, -EPROTO, buf, sizeof(buf));
	CHECK(!strcmp(buf, "TLS certificate verification failed: SSL "
			   "certificate problem: unable to get local issuer "
			   "certificate"));
	resp.errbuf[0] = '\0';
	resp.cc = CURLE_SSL_CONNECT_ERROR;
	http_describe(&resp, -EPROTO, buf, sizeof(buf));
	CHECK(!strncmp(buf, "TLS handshake failed: ", 22) && buf[22]);
	resp.cc = CURLE_COULDNT_CONNECT;
	snprintf(resp.errbuf, sizeof(resp.errbuf), "Failed to connect");
	http_describe(&resp, -ECONNREFUSED, buf, sizeof(buf));
	CHECK(!strcmp(buf, "Failed to connect"));
	resp.cc = CURLE_OK;
	http_describe(&resp, -ENOMEM, buf, sizeof(buf));
	CHECK(!strcmp(buf, ferry_strerror(-ENOMEM)));
	http_resp_reset(&resp);
	CHECK(!resp.errbuf[0] && resp.cc == CURLE_OK);

	/* A stall aborted by the progress callback is a timeout, and
	 * libcurl's "callback aborted" detail no longer applies. */
	{
		struct http_xfer x = { .resp = &resp, .stalled = true };

		snprintf(resp.errbuf, sizeof(resp.errbuf), "Callback aborted");
		CHECK_EQ(http_xfer_err(&x, CURLE_ABORTED_BY_CALLBACK),
			 -ETIMEDOUT);
		CHECK(resp.cc == CURLE_OPERATION_TIMEDOUT);
		CHECK(!resp.errbuf[0]);
		resp.cc = CURLE_OPERATION_TIMEDOUT;
		http_describe(&resp, -ETIMEDOUT, buf, sizeof(buf));
		CHECK(!strcmp(buf, curl_easy_strerror(CURLE_OPERATION_TIMEDOUT)));
		snprintf(resp.errbuf, sizeof(resp.errbuf), "Recv failure");
		CHECK_EQ(http_xfer_err(&x, CURLE_RECV_ERROR), -EIO);
		CHECK(resp.cc == CURLE_RECV_ERROR);
		CHECK(!strcmp(resp.errbuf, "Recv failure"));
	}
	http_resp_free(&resp);
}

/* How an ended transfer is judged before any retry logic sees it. */
static void test_xfer_err(void)
{
	struct http_resp resp = { 0 };
	struct http_xfer x = { .resp = &resp };

	http_resp_reset(&resp);
	CHECK_EQ(http_xfer_err(&x, CURLE_OK), 0);
	/* A sink that stopped on purpose (enough bytes) succeeded. */
	x.stopped = true;
	CHECK_EQ(http_xfer_err(&x, CURLE_WRITE_ERROR), 0);
	CHECK(resp.cc == CURLE_OK);
	x.stopped = false;
	/* The sink's own error wins over libcurl's code. */
	x.sink_err = -EFBIG;
	CHECK_EQ(http_xfer_err(&x, CURLE_WRITE_ERROR), -EFBIG);
	CHECK(resp.cc == CURLE_WRITE_ERROR);
	x.sink_err = 0;
	/* An error page cut short still answered with its status... */
	resp.status = 416;
	CHECK_EQ(http_xfer_err(&x, CURLE_PARTIAL_FILE), 0);
	CHECK_EQ(http_xfer_err(&x, CURLE_RECV_ERROR), 0);
	/* ... a 2xx body cut short did not. */
	resp.status = 200;
	CHECK_EQ(http_xfer_err(&x, CURLE_PARTIAL_FILE), -EIO);
	resp.status = 0;
	CHECK_EQ(http_xfer_err(&x, CURLE_COULDNT_CONNECT), -ECONNREFUSED);
	CHECK_EQ(http_xfer_err(&x, CURLE_PEER_FAILED_VERIFICATION), -EPROTO);
	http_resp_free(&resp);
}

static void set_header(struct http_resp *resp, const char *name,
		       const char *value)
{
	resp->hdrs = calloc(1, sizeof(*resp->hdrs));
	CHECK(resp->hdrs != NULL);
	if (!resp->hdrs)
		return;
	resp->hdrs[0].name = strdup(name);
	resp->hdrs[0].value = strdup(value);
	resp->nr_hdrs = 1;
}

/* The shared retry policy: what is retried, refreshed, or final. */
static void test_judge(void)
{
	static const long retry[] = { 408, 429, 500, 502, 503, 504, 599 };
	static const long final[] = { 200, 206, 301, 400, 403, 404, 416,
				      501, 505 };
	static const CURLcode again[] = {
		CURLE_COULDNT_CONNECT, CURLE_COULDNT_RESOLVE_HOST,
		CURLE_OPERATION_TIMEDOUT, CURLE_RECV_ERROR, CURLE_SEND_ERROR,
		CURLE_GOT_NOTHING, CURLE_PARTIAL_FILE, CURLE_HTTP2,
		CURLE_HTTP2_STREAM,
	};
	static const CURLcode stop[] = {
		CURLE_PEER_FAILED_VERIFICATION, CURLE_SSL_CONNECT_ERROR,
		CURLE_TOO_MANY_REDIRECTS, CURLE_UNSUPPORTED_PROTOCOL,
		CURLE_WRITE_ERROR, CURLE_ABORTED_BY_CALLBACK, CURLE_OK,
	};
	struct http_resp resp = { 0 };
	size_t i;

	http_resp_reset(&resp);
	for (i = 0; i < ARRAY_SIZE(retry); i++) {
		resp.status = retry[i];
		CHECK(http_judge(0, &resp, true) == HTTP_RETRY);
	}
	for (i = 0; i < ARRAY_SIZE(final); i++) {
		resp.status = final[i];
		CHECK(http_judge(0, &resp, true) == HTTP_FINAL);
	}
	/* 401: refreshed once when credentials were sent, else final. */
	resp.status = 401;
	CHECK(http_judge(0, &resp, true) == HTTP_REAUTH);
	CHECK(http_judge(0, &resp, false) == HTTP_FINAL);
	/* Transport failures by libcurl's code, whatever the status. */
	resp.status = 0;
	for (i = 0; i < ARRAY_SIZE(again); i++) {
		resp.cc = again[i];
		CHECK(http_judge(http_curl_error(again[i]), &resp, true) ==
		      HTTP_RETRY);
	}
	for (i = 0; i < ARRAY_SIZE(stop); i++) {
		resp.cc = stop[i];
		CHECK(http_judge(-EIO, &resp, true) == HTTP_FINAL);
	}
	/* Our own failures never are the server's. */
	resp.cc = CURLE_RECV_ERROR;
	CHECK(http_judge(-EFBIG, &resp, true) == HTTP_FINAL);
	CHECK(http_judge(-ENOMEM, &resp, true) == HTTP_FINAL);
	http_resp_free(&resp);
}

/* Exponential cap with full jitter; Retry-After of an answer wins. */
static void test_backoff(void)
{
	struct http_resp resp = { 0 };
	time_t now = 1700000000;

	http_resp_reset(&resp);
	resp.status = 503;
	CHECK_EQ(http_backoff_ms(1, 0, &resp, 0, now), 0);
	CHECK_EQ(http_backoff_ms(1, 0, &resp, 200, now), 200);
	CHECK_EQ(http_backoff_ms(1, 0, &resp, 201, now), 0);
	CHECK_EQ(http_backoff_ms(2, 0, &resp, 400, now), 400);
	CHECK_EQ(http_backoff_ms(3, 0, &resp, 800, now), 800);
	CHECK_EQ(http_backoff_ms(3, 0, &resp, 801, now), 0);
	CHECK_EQ(http_backoff_ms(7, 0, &resp, 10000, now), 10000);
	CHECK_EQ(http_backoff_ms(7, 0, &resp, 10001, now), 0);
	CHECK_EQ(http_backoff_ms(100, 0, &resp, UINT64_MAX, now),
		 (unsigned int)(UINT64_MAX % 10001u));
	resp.status = 429;
	set_header(&resp, "Retry-After", "2");
	CHECK_EQ(http_backoff_ms(1, 0, &resp, 5, now), 2000);
	CHECK_EQ(http_backoff_ms(9, 0, &resp, 5, now), 2000);
	/* Not from a transport failure (the headers are a stale answer's). */
	CHECK_EQ(http_backoff_ms(1, -EIO, &resp, 5, now), 5);
	http_resp_free(&resp);
	set_header(&resp, "Retry-After", "3600");
	CHECK_EQ(http_backoff_ms(1, 0, &resp, 5, now),
		 FETCH_RETRY_AFTER_MAX_MS);
	http_resp_free(&resp);
	/* Junk is ignored: the jittered wait applies. */
	set_header(&resp, "Retry-After", "soon");
	CHECK_EQ(http_backoff_ms(1, 0, &resp, 7, now), 7);
	http_resp_free(&resp);
}

/* Finding 7 and 8 of issue 14: who gets credentials in clear; deadlines. */
static void test_cleartext(void)
{
	const char *const insecure[] = { "reg.example", "other.example:5000",
					 NULL };
	const char *const none[] = { NULL };
	struct http_resp resp = { 0 };

	CHECK(fetch_host_plain(NULL, "localhost:5000"));
	CHECK(fetch_host_plain(NULL, "127.0.0.1"));
	CHECK(fetch_host_plain(NULL, "[::1]:80"));
	CHECK(!fetch_host_plain(NULL, "registry.ferry.test:443"));
	CHECK(fetch_host_plain(insecure, "reg.example:8080"));
	CHECK(fetch_host_plain(insecure, "other.example:5000"));
	CHECK(!fetch_host_plain(insecure, "other.example:5001"));
	CHECK(!fetch_host_plain(none, "evil.example"));

	CHECK(http_cleartext_ok(none, "https://registry.ferry.test/token"));
	CHECK(http_cleartext_ok(none, "HTTPS://registry.ferry.test:8443/v2/"));
	CHECK(!http_cleartext_ok(none, "http://registry.ferry.test/token"));
	CHECK(!http_cleartext_ok(none, "http://registry.ferry.test:443/v2/"));
	CHECK(http_cleartext_ok(none, "http://127.0.0.1:5000/token"));
	CHECK(http_cleartext_ok(none, "http://[::1]:5000/v2/"));
	CHECK(http_cleartext_ok(insecure, "http://reg.example:5000/v2/"));
	CHECK(http_cleartext_ok(insecure, "http://other.example:5000/t"));
	CHECK(!http_cleartext_ok(insecure, "http://other.example/t"));
	/* A look-alike of a loopback name is not one. */
	CHECK(!http_cleartext_ok(none, "http://127.0.0.1.evil.example/t"));
	CHECK(!http_cleartext_ok(none, "http://localhost.evil.example/t"));
	CHECK(!http_cleartext_ok(none, "not a url"));

	CHECK_EQ(http_deadline_ms(60000, 0), 60000);
	CHECK_EQ(http_deadline_ms(60000, 4u << 20), 64002);
	CHECK_EQ(http_deadline_ms(2000, 1048), 2001);
	CHECK(http_deadline_ms(UINT32_MAX, UINT64_MAX) > UINT32_MAX);

	/* A cancel is final, whatever the transport said. */
	http_resp_reset(&resp);
	resp.cc = CURLE_ABORTED_BY_CALLBACK;
	CHECK_EQ(http_judge(-ECANCELED, &resp, true), HTTP_FINAL);
	http_resp_free(&resp);
}

static void test_open(void)
{
	const struct fetch_host other = { .registry = "other.io", .url = "http://m1" };
	const struct fetch_host m2 = {
		.registry = "reg.io:5000", .url = "http://m2//cache/",
		.capabilities = FETCH_HOST_PULL,
	};
	const struct fetch_host m3 = {
		.registry = "reg.io:5000", .url = "https://m3:8443/v2",
		.override_path = true,
	};
	const struct fetch_host *hosts[] = { &other, &m2, &m3, NULL };
	const struct fetch_host bad = { .registry = "reg.io", .url = "ftp://m" };
	const struct fetch_host *bad_hosts[] = { &bad, NULL };
	struct fetch_opts opts;
	struct fetch_ref ref;
	struct registry *r;
	char *url;
	int saved = ferry_log_level;

	fetch_opts_init(&opts);
	opts.hosts = hosts;
	CHECK_EQ(fetch_parse_ref("reg.io:5000/a/b:t", &ref), 0);
	CHECK_EQ(registry_open(&ref, &opts, FETCH_PULL, &r), 0);
	CHECK(!strcmp(registry_name(r), "reg.io:5000/a/b"));
	CHECK(!strcmp(r->base, "https://reg.io:5000"));
	CHECK_EQ(r->attempts, 5);
	/* The registry's hosts in order; the path as containerd takes it. */
	CHECK_EQ(r->nr_mirrors, 2);
	CHECK(!strcmp(r->mirrors[0]->base, "http://m2"));
	CHECK(!strcmp(r->mirrors[0]->api, "/cache/v2"));
	CHECK_EQ(r->mirrors[0]->caps, FETCH_HOST_PULL);
	CHECK(!strcmp(r->mirrors[0]->host, "m2"));
	CHECK(!strcmp(r->mirrors[1]->base, "https://m3:8443"));
	CHECK(!strcmp(r->mirrors[1]->api, "/v2"));
	CHECK_EQ(r->mirrors[1]->caps, FETCH_HOST_ALL);
	/* A mirror is told the registry; the registry is not. */
	url = reg_url(r->mirrors[0], r->mirrors[0]->base, "/blobs/%s", "x");
	CHECK(url && !strcmp(url, "http://m2/cache/v2/a/b/blobs/x?ns=reg.io%3A5000"));
	free(url);
	url = reg_url(r, r->base, "/tags/list?n=%d", 5);
	CHECK(url && !strcmp(url, "https://reg.io:5000/v2/a/b/tags/list?n=5"));
	free(url);
	CHECK(reg_mirror_usable(r->mirrors[0], FETCH_HOST_PULL));
	CHECK(!reg_mirror_usable(r->mirrors[0], FETCH_HOST_RESOLVE));
	registry_close(r);
	/* Pushes go to the registry only. */
	CHECK_EQ(registry_open(&ref, &opts, FETCH_PUSH, &r), 0);
	CHECK_EQ(r->nr_mirrors, 0);
	registry_close(r);
	fetch_ref_free(&ref);

	/* Loopback and --insecure hosts speak plain http. */
	CHECK_EQ(fetch_parse_ref("127.0.0.1:5000/a", &ref), 0);
	CHECK_EQ(registry_open(&ref, &opts, FETCH_PULL, &r), 0);
	CHECK(!strcmp(r->base, "http://127.0.0.1:5000"));
	CHECK_EQ(r->nr_mirrors, 0);
	registry_close(r);
	fetch_ref_free(&ref);
	{
		const char *insecure[] = { "reg.io", NULL };

		opts.insecure = insecure;
		CHECK_EQ(fetch_parse_ref("reg.io:5000/a", &ref), 0);
		CHECK_EQ(registry_open(&ref, &opts, FETCH_PULL, &r), 0);
		CHECK(!strcmp(r->base, "http://reg.io:5000"));
		registry_close(r);
		fetch_ref_free(&ref);
		opts.insecure = NULL;
	}

	/* The Hub answers at registry-1.docker.io, by either of its names. */
	CHECK_EQ(fetch_parse_ref("index.docker.io/debian", &ref), 0);
	CHECK_EQ(registry_open(&ref, &opts, FETCH_PULL, &r), 0);
	CHECK(!strcmp(r->base, "https://registry-1.docker.io"));
	CHECK(!strcmp(registry_name(r), "docker.io/library/debian"));
	CHECK(!r->ns);
	registry_close(r);
	{
		const struct fetch_host hub_mirror = {
			.registry = "index.docker.io", .url = "https://hub.local",
		};
		const struct fetch_host hub_server = {
			.registry = "docker.io", .url = "http://10.1.1.1:5000",
			.server = true,
		};
		const struct fetch_host *hub[] = { &hub_server, &hub_mirror, NULL };

		opts.hosts = hub;
		CHECK_EQ(registry_open(&ref, &opts, FETCH_PULL, &r), 0);
		CHECK_EQ(r->nr_mirrors, 1);
		CHECK(!strcmp(r->base, "http://10.1.1.1:5000"));
		CHECK(r->ns && !strcmp(r->ns, "ns=docker.io"));
		CHECK(!strcmp(r->mirrors[0]->base, "https://hub.local"));
		registry_close(r);
	}
	fetch_ref_free(&ref);

	ferry_log_level = -1;
	opts.hosts = bad_hosts;
	CHECK_EQ(fetch_parse_ref("reg.io/a", &ref), 0);
	CHECK_EQ(registry_open(&ref, &opts, FETCH_PULL, &r), -EINVAL);
	fetch_ref_free(&ref);
	ferry_log_level = saved;
}

static void test_check_host(void)
{
	static const char *const rel_ca[] = { "ca.pem", NULL };
	static const char *const bad_header[] = { "X-A: b\r\nX-B: c", NULL };
	static const char *const no_name[] = { ": v", NULL };
	const struct fetch_host good = {
		.registry = "r.io", .url = "https://[::1]:5000/some/path..x/.y/",
	};
	const struct fetch_host bad[] = {
		{ .registry = "r", .url = "https://m" },           /* no registry form */
		{ .registry = "r.io", .url = "m:5000" },           /* no scheme */
		{ .registry = "r.io", .url = "https://u@m/" },     /* credentials */
		{ .registry = "r.io", .url = "https://m/?q=1" },   /* query */
		{ .registry = "r.io", .url = "https://m/a b" },    /* space */
		{ .registry = "r.io", .url = "https://m/a/../v2" }, /* dot-dot */
		{ .registry = "r.io", .url = "https://m/./v2" },   /* dot */
		{ .registry = "r.io", .url = "https://m", .capabilities = 8 },
		{ .registry = "r.io", .url = "https://m", .ca_files = rel_ca },
		{ .registry = "r.io", .url = "https://m", .client_key = "/k" },
		{ .registry = "r.io", .url = "https://m", .headers = bad_header },
		{ .registry = "r.io", .url = "https://m", .headers = no_name },
		{ .registry = "r.io", .url = NULL },
	};
	char why[800];
	size_t i;

	CHECK_EQ(fetch_check_host(&good, why, sizeof(why)), 0);
	for (i = 0; i < ARRAY_SIZE(bad); i++) {
		int err = fetch_check_host(&bad[i], why, sizeof(why));

		if (err != -EINVAL)
			fprintf(stderr, "  accepted host %zu\n", i);
		CHECK_EQ(err, -EINVAL);
		CHECK(strstr(why, "registry host"));
	}
	CHECK_EQ(fetch_host_capability("resolve"), FETCH_HOST_RESOLVE);
	CHECK_EQ(fetch_host_capability("Pull"), 0);
}

int main(void)
{
	char cmd[128];

	if (!mkdtemp(tmpdir)) {
		perror("mkdtemp");
		return 1;
	}
	RUN_TEST(test_ref_valid);
	RUN_TEST(test_ref_invalid);
	RUN_TEST(test_ref_normalised);
	RUN_TEST(test_check_host);
	RUN_TEST(test_digest);
	RUN_TEST(test_www_auth);
	RUN_TEST(test_content_range);
	RUN_TEST(test_link);
	RUN_TEST(test_retry_after);
	RUN_TEST(test_token);
	RUN_TEST(test_dockercfg);
	RUN_TEST(test_helper_output);
	RUN_TEST(test_cred_helper);
	RUN_TEST(test_creds_sources);
	RUN_TEST(test_urls);
	RUN_TEST(test_open);
	RUN_TEST(test_resolve);
	RUN_TEST(test_describe);
	RUN_TEST(test_xfer_err);
	RUN_TEST(test_judge);
	RUN_TEST(test_backoff);
	RUN_TEST(test_cleartext);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", tmpdir);
	TEST_MAIN_END();
}
