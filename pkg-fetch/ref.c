// SPDX-License-Identifier: MIT
/*
 * Image references and digests, validated by the grammar of the OCI
 * distribution spec: a repository name is path components matching
 * [a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*, a tag [A-Za-z0-9_][A-Za-z0-9._-]{0,127}.
 * Names are normalised as Docker and containerd do (docker/distribution's
 * reference package): a first component that is no host (no '.' or ':',
 * not "localhost", all lower-case) means Docker Hub, "docker.io", as does
 * its old name "index.docker.io"; a one-component Hub repository is
 * "library/NAME"; neither tag nor digest means "latest". So "debian",
 * "docker.io/library/debian:latest" and "index.docker.io/debian" are one
 * reference, and the normalised one is what messages and credential
 * lookups see. Also the client options checked without I/O.
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../pkg-base/base.h"
#include "internal.h"

#define REF_HOST_MAX 255
#define REF_REPO_MAX 255
#define REF_TAG_MAX 128
#define RESOLVE_MAX 1024

static bool is_lower_alnum(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
}

static bool is_alnum(char c)
{
	return is_lower_alnum(c) || (c >= 'A' && c <= 'Z');
}

/* One path component of a repository name, @len bytes at @s. */
static bool repo_component_valid(const char *s, size_t len)
{
	size_t i = 0;

	if (!len || !is_lower_alnum(s[0]) || !is_lower_alnum(s[len - 1]))
		return false;
	while (i < len) {
		size_t seps = 0;

		while (i < len && is_lower_alnum(s[i]))
			i++;
		if (i == len)
			return true;
		/* A separator: '.', '_', '__' or any run of '-'. */
		if (s[i] == '.') {
			seps = 1;
		} else if (s[i] == '_') {
			seps = i + 1 < len && s[i + 1] == '_' ? 2 : 1;
		} else if (s[i] == '-') {
			while (i + seps < len && s[i + seps] == '-')
				seps++;
		} else {
			return false;
		}
		i += seps;
		if (i >= len || !is_lower_alnum(s[i]))
			return false;
	}
	return true;
}

bool fetch_repo_valid(const char *s, size_t len)
{
	size_t start = 0, i;

	if (!len || len > REF_REPO_MAX)
		return false;
	for (i = 0; i <= len; i++) {
		if (i < len && s[i] != '/')
			continue;
		if (!repo_component_valid(s + start, i - start))
			return false;
		start = i + 1;
	}
	return true;
}

bool fetch_tag_valid(const char *s, size_t len)
{
	size_t i;

	if (!len || len > REF_TAG_MAX || !(is_alnum(s[0]) || s[0] == '_'))
		return false;
	for (i = 1; i < len; i++)
		if (!is_alnum(s[i]) && s[i] != '_' && s[i] != '.' && s[i] != '-')
			return false;
	return true;
}

/*
 * "name[:port]" or "[v6addr][:port]". A DNS name is labels of letters,
 * digits and '-'; it must be recognisable as a host (a '.', a port, an
 * IPv6 literal, or "localhost"): only an upper-case first component gets
 * here without one, and Docker refuses that too.
 */
static bool host_syntax_valid(const char *s, size_t len, bool need_mark)
{
	size_t i = 0, name_end;
	bool dot = false, port = false;

	if (!len || len > REF_HOST_MAX)
		return false;
	if (s[0] == '[') {
		for (i = 1; i < len && s[i] != ']'; i++)
			if (!(is_alnum(s[i]) || s[i] == ':' || s[i] == '.'))
				return false;
		if (i >= len || i == 1)
			return false;
		name_end = ++i;
		dot = true;
	} else {
		for (; i < len && s[i] != ':'; i++) {
			if (s[i] == '.') {
				if (i == 0 || s[i - 1] == '.' || s[i - 1] == '-')
					return false;
				dot = true;
			} else if (s[i] == '-') {
				if (i == 0 || s[i - 1] == '.')
					return false;
			} else if (!is_alnum(s[i])) {
				return false;
			}
		}
		name_end = i;
		if (!name_end || s[name_end - 1] == '.' || s[name_end - 1] == '-')
			return false;
	}
	if (i < len) {
		unsigned long portnum = 0;

		if (s[i] != ':' || i + 1 == len || len - i - 1 > 5)
			return false;
		for (i++; i < len; i++) {
			if (s[i] < '0' || s[i] > '9')
				return false;
			portnum = portnum * 10 + (unsigned long)(s[i] - '0');
		}
		if (!portnum || portnum > 65535)
			return false;
		port = true;
	}
	return !need_mark || dot || port ||
	       (name_end == 9 && !strncmp(s, "localhost", 9));
}

static bool host_valid(const char *s, size_t len)
{
	return host_syntax_valid(s, len, true);
}

void fetch_ref_free(struct fetch_ref *ref)
{
	if (!ref)
		return;
	free(ref->host);
	free(ref->repo);
	free(ref->tag);
	free(ref->digest);
	memset(ref, 0, sizeof(*ref));
}

static int ref_invalid(const char *s, const char *why)
{
	ferry_err("invalid image reference \"%.300s\": %s", s, why);
	return -EINVAL;
}

/* The first component of @s (@len bytes) names a registry, not a Hub path. */
static bool names_host(const char *s, size_t len)
{
	size_t i;

	if (len == 9 && !strncmp(s, "localhost", 9))
		return true;
	for (i = 0; i < len; i++)
		if (s[i] == '.' || s[i] == ':' || (s[i] >= 'A' && s[i] <= 'Z'))
			return true;
	return false;
}

int fetch_parse_ref(const char *s, struct fetch_ref *out)
{
	const char *slash, *at, *rest, *colon, *repo_end, *host = FETCH_HUB;
	struct fetch_ref ref = { 0 };
	uint8_t d[FETCH_DIGEST_SIZE];
	size_t len, host_len = strlen(FETCH_HUB), repo_len;
	bool hub;

	memset(out, 0, sizeof(*out));
	if (!s)
		return -EINVAL;
	if (!strncmp(s, "docker://", 9))
		s += 9;
	len = strlen(s);
	if (len > REF_HOST_MAX + REF_REPO_MAX + REF_TAG_MAX + 80)
		return ref_invalid(s, "too long");
	if (!len)
		return ref_invalid(s, "empty");
	rest = s;
	slash = strchr(s, '/');
	if (slash && names_host(s, (size_t)(slash - s))) {
		if (!host_valid(s, (size_t)(slash - s)))
			return ref_invalid(s, "bad registry host (it must contain "
					   "'.' or ':' or be \"localhost\")");
		host = s;
		host_len = (size_t)(slash - s);
		rest = slash + 1;
		if (host_len == strlen(FETCH_HUB_OLD) &&
		    !strncmp(host, FETCH_HUB_OLD, host_len)) {
			host = FETCH_HUB;
			host_len = strlen(FETCH_HUB);
		}
	}
	hub = host_len == strlen(FETCH_HUB) && !strncmp(host, FETCH_HUB, host_len);
	at = strchr(rest, '@');
	repo_end = at ? at : s + len;
	/* A tag follows the last ':' after the last '/' of the name. */
	colon = memrchr(rest, ':', (size_t)(repo_end - rest));
	if (colon && memchr(colon, '/', (size_t)(repo_end - colon)))
		colon = NULL;
	if (at) {
		if (digest_parse(at + 1, d))
			return ref_invalid(s, "digest is not sha256:<64 hex>");
		if (colon && !fetch_tag_valid(colon + 1,
					      (size_t)(at - colon - 1)))
			return ref_invalid(s, "bad tag");
	} else if (colon && !fetch_tag_valid(colon + 1,
					     (size_t)(repo_end - colon - 1))) {
		return ref_invalid(s, "bad tag");
	}
	if (colon)
		repo_end = colon;
	repo_len = (size_t)(repo_end - rest);
	if (!fetch_repo_valid(rest, repo_len))
		return ref_invalid(s, "bad repository name (lower-case "
				   "[a-z0-9] components joined by '.', '_', "
				   "'__' or '-', separated by '/')");
	ref.host = strndup(host, host_len);
	/* The Hub's official images live under library/. */
	if (hub && !memchr(rest, '/', repo_len)) {
		if (asprintf(&ref.repo, "library/%.*s", (int)repo_len, rest) < 0)
			ref.repo = NULL;
		else if (!fetch_repo_valid(ref.repo, strlen(ref.repo))) {
			fetch_ref_free(&ref);
			return ref_invalid(s, "repository name too long");
		}
	} else {
		ref.repo = strndup(rest, repo_len);
	}
	if (at)
		ref.digest = strdup(at + 1);
	else
		ref.tag = colon ? strdup(colon + 1) : strdup("latest");
	if (!ref.host || !ref.repo || (at && !ref.digest) || (!at && !ref.tag)) {
		fetch_ref_free(&ref);
		return -ENOMEM;
	}
	*out = ref;
	return 0;
}

char *fetch_ref_string(const struct fetch_ref *ref)
{
	char *s = NULL;

	if (asprintf(&s, "%s/%s%s%s", ref->host, ref->repo,
		     ref->digest ? "@" : ":",
		     ref->digest ? ref->digest : ref->tag ? ref->tag : "latest") < 0)
		return NULL;
	return s;
}

const char *fetch_registry_endpoint(const char *host)
{
	return strcmp(host, FETCH_HUB) ? host : FETCH_HUB_ENDPOINT;
}

void fetch_opts_init(struct fetch_opts *opts)
{
	memset(opts, 0, sizeof(*opts));
	opts->tls_verify = true;
}

static int resolve_invalid(const char *s, const char *why)
{
	ferry_err("invalid resolve entry \"%.300s\": %s (expected "
		  "HOST:PORT:ADDRESS)", s, why);
	return -EINVAL;
}

/* One ADDRESS of a resolve entry: @len bytes at @s. */
static bool resolve_addr_valid(const char *s, size_t len)
{
	char buf[INET6_ADDRSTRLEN + 2];
	uint8_t bin[16];

	if (!len || len >= sizeof(buf))
		return false;
	if (s[0] == '[') {
		if (len < 3 || s[len - 1] != ']')
			return false;
		memcpy(buf, s + 1, len - 2);
		buf[len - 2] = '\0';
		return inet_pton(AF_INET6, buf, bin) == 1;
	}
	memcpy(buf, s, len);
	buf[len] = '\0';
	return inet_pton(AF_INET, buf, bin) == 1;
}

int fetch_check_resolve(const char *s)
{
	const char *c1, *c2, *p, *a;
	size_t i, n = strlen(s);
	unsigned long port = 0;

	if (n > RESOLVE_MAX)
		return resolve_invalid(s, "too long");
	c1 = strchr(s, ':');
	if (!c1)
		return resolve_invalid(s, "no PORT");
	if (c1 == s)
		return resolve_invalid(s, "no HOST");
	/* A DNS name: curl's "+" (timeout) and "-" (removal) prefixes,
	 * wildcards and IP literals have no use here. */
	if (s[0] == '-' || s[0] == '.' || c1[-1] == '.')
		return resolve_invalid(s, "bad HOST");
	for (p = s; p < c1; p++)
		if (!is_alnum(*p) && *p != '-' && *p != '.' && *p != '_')
			return resolve_invalid(s, "bad HOST (a DNS name)");
	c2 = strchr(c1 + 1, ':');
	if (!c2)
		return resolve_invalid(s, "no ADDRESS");
	for (p = c1 + 1, i = 0; p < c2; p++, i++) {
		if (*p < '0' || *p > '9' || i >= 5)
			return resolve_invalid(s, "bad PORT");
		port = port * 10 + (unsigned long)(*p - '0');
	}
	if (port < 1 || port > 65535)
		return resolve_invalid(s, "PORT must be 1..65535");
	for (a = c2 + 1;; a = p + 1) {
		p = strchr(a, ',');
		if (!p)
			p = s + n;
		if (!resolve_addr_valid(a, (size_t)(p - a)))
			return resolve_invalid(s, "bad ADDRESS (an IPv4 "
					       "address or [IPv6])");
		if (!*p)
			break;
	}
	return 0;
}

unsigned int fetch_host_capability(const char *name)
{
	if (!strcmp(name, "pull"))
		return FETCH_HOST_PULL;
	if (!strcmp(name, "resolve"))
		return FETCH_HOST_RESOLVE;
	if (!strcmp(name, "push"))
		return FETCH_HOST_PUSH;
	return 0;
}

static int host_invalid(const struct fetch_host *h, const char *why,
			char *out, size_t out_len)
{
	snprintf(out, out_len, "registry host \"%.300s\" for %.300s: %s",
		 h->url ? h->url : "", h->registry ? h->registry : "(no registry)",
		 why);
	return -EINVAL;
}

/* A URL's path: '/'-separated, printable, no query, fragment, escapes,
 * "." or ".." segments. */
static bool url_path_valid(const char *p)
{
	const char *seg = p;
	size_t n;

	for (; *p; p++)
		if ((unsigned char)*p <= ' ' || *p >= 0x7f || strchr("?#%\\\"", *p))
			return false;
	for (; *seg; seg += n + (seg[n] == '/')) {
		n = strcspn(seg, "/");
		if ((n == 1 && seg[0] == '.') || (n == 2 && !strncmp(seg, "..", 2)))
			return false;
	}
	return true;
}

/* "Name: value": a token, ": ", and printable text (tabs allowed). */
static bool header_valid(const char *s)
{
	const char *colon = strchr(s, ':'), *p;

	if (!colon || colon == s || strlen(s) > 8192)
		return false;
	for (p = s; p < colon; p++)
		if (!is_alnum(*p) && !strchr("!#$%&'*+-.^_`|~", *p))
			return false;
	for (p = colon + 1; *p; p++)
		if (((unsigned char)*p < ' ' && *p != '\t') || *p == 0x7f)
			return false;
	return true;
}

int fetch_check_host(const struct fetch_host *h, char *why, size_t why_len)
{
	const char *auth, *path, *bad = NULL;
	const char *const *p;
	size_t n;

	if (!h->registry || !host_valid(h->registry, strlen(h->registry)))
		bad = "the registry must be HOST[:PORT]";
	else if (!h->url || strlen(h->url) > FETCH_HOST_URL_MAX)
		bad = "no URL, or longer than 1024 bytes";
	else if (strncmp(h->url, "https://", 8) && strncmp(h->url, "http://", 7))
		bad = "the URL must start with http:// or https://";
	if (bad)
		return host_invalid(h, bad, why, why_len);
	auth = h->url + (h->url[4] == 's' ? 8 : 7);
	path = auth + strcspn(auth, "/");
	if (!host_syntax_valid(auth, (size_t)(path - auth), false))
		bad = "bad host in the URL (HOST[:PORT], no user name, query or "
		      "fragment)";
	else if (!url_path_valid(path))
		bad = "bad path in the URL";
	else if (h->capabilities & ~FETCH_HOST_ALL)
		bad = "unknown capabilities";
	else if ((h->client_cert && *h->client_cert != '/') ||
		 (h->client_key && *h->client_key != '/'))
		bad = "client certificate and key must be absolute paths";
	else if (h->client_key && !h->client_cert)
		bad = "a client key without a certificate";
	for (p = h->ca_files, n = 0; !bad && p && *p; p++, n++)
		if (**p != '/' || n >= FETCH_HOST_CA_MAX)
			bad = "CA files must be absolute paths, at most 8";
	for (p = h->headers, n = 0; !bad && p && *p; p++, n++)
		if (!header_valid(*p) || n >= FETCH_HOST_HEADERS_MAX)
			bad = "headers must be \"Name: value\" without control "
			      "characters, at most 32";
	return bad ? host_invalid(h, bad, why, why_len) : 0;
}
