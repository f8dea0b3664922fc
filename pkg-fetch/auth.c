// SPDX-License-Identifier: MIT
/*
 * Authentication (distribution docs spec/auth/{token,oauth,scope}.md):
 * a 401 names the scheme, to the /v2/ ping where there is one (see
 * registry_open), else to the first request. Basic sends the
 * credentials on every request. Bearer trades them (or nothing, for
 * anonymous pulls) at the realm for a token per scope list — GET with
 * Basic auth, or an OAuth2 refresh_token POST for identity tokens,
 * falling back to GET when the POST is not served — and refreshes it
 * before it expires. A 401 on a request that carried a token drops that
 * token so the next attempt fetches a new one.
 *
 * Everything here runs under r->auth_lock: a token fetch is serialised
 * so concurrent requests do not each ask the token server.
 */
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

#include <openssl/crypto.h>

#include "../pkg-base/base.h"
#include "internal.h"

#define TOKEN_MAX (64u << 10)
#define TOKEN_BODY_MAX (1u << 20)
#define TOKEN_DEFAULT_S 60u
#define TOKEN_MAX_S (366u * 24 * 3600)
#define REFRESH_MIN_NS (5ull * 1000000000ull)

void auth_line_free(char *line)
{
	if (line) {
		OPENSSL_cleanse(line, strlen(line));
		free(line);
	}
}

static void token_clear(struct reg_token *t)
{
	free(t->scope);
	auth_line_free(t->line);
	memset(t, 0, sizeof(*t));
}

static void tokens_clear(struct registry *r)
{
	size_t i;

	for (i = 0; i < REG_TOKENS_MAX; i++)
		token_clear(&r->tokens[i]);
}

void auth_release(struct registry *r)
{
	tokens_clear(r);
	fetch_creds_clear(&r->creds);
	free(r->realm);
	free(r->service);
	free(r->base);
	r->realm = r->service = r->base = NULL;
}

/* ------------------------------------------------------------------ */
/* Token answers                                                       */
/* ------------------------------------------------------------------ */

/* "2006-01-02T15:04:05[.frac](Z|±hh:mm)" → seconds since the epoch. */
static int parse_rfc3339(const char *s, time_t *out)
{
	int v[6], i, off = 0;
	const int pos[6] = { 0, 5, 8, 11, 14, 17 };
	const int len[6] = { 4, 2, 2, 2, 2, 2 };
	const char *p;
	struct tm tm = { 0 };

	if (strlen(s) < 20 || s[4] != '-' || s[7] != '-' ||
	    (s[10] != 'T' && s[10] != 't') || s[13] != ':' || s[16] != ':')
		return -EINVAL;
	for (i = 0; i < 6; i++) {
		int k;

		v[i] = 0;
		for (k = 0; k < len[i]; k++) {
			char c = s[pos[i] + k];

			if (c < '0' || c > '9')
				return -EINVAL;
			v[i] = v[i] * 10 + (c - '0');
		}
	}
	if (v[1] < 1 || v[1] > 12 || v[2] < 1 || v[2] > 31 || v[3] > 23 ||
	    v[4] > 59 || v[5] > 60)
		return -EINVAL;
	p = s + 19;
	if (*p == '.')
		for (p++; *p >= '0' && *p <= '9'; p++)
			;
	if (*p == 'Z' || *p == 'z') {
		p++;
	} else if (*p == '+' || *p == '-') {
		int sign = *p == '-' ? -1 : 1;

		if (strlen(p) != 6 || p[3] != ':' || p[1] < '0' || p[1] > '9' ||
		    p[2] < '0' || p[2] > '9' || p[4] < '0' || p[4] > '9' ||
		    p[5] < '0' || p[5] > '9')
			return -EINVAL;
		off = sign * (((p[1] - '0') * 10 + (p[2] - '0')) * 3600 +
			      ((p[4] - '0') * 10 + (p[5] - '0')) * 60);
		p += 6;
	} else {
		return -EINVAL;
	}
	if (*p)
		return -EINVAL;
	tm.tm_year = v[0] - 1900;
	tm.tm_mon = v[1] - 1;
	tm.tm_mday = v[2];
	tm.tm_hour = v[3];
	tm.tm_min = v[4];
	tm.tm_sec = v[5];
	*out = timegm(&tm);
	if (*out == (time_t)-1)
		return -EINVAL;
	*out -= off;
	return 0;
}

int fetch_parse_token(const char *json, size_t len, time_t now,
		      char **token, unsigned int *lifetime_s)
{
	struct json_object *root, *v;
	const char *tok, *issued;
	int64_t exp = TOKEN_DEFAULT_S;
	size_t i, n;
	int err = -EINVAL;

	*token = NULL;
	if (json_parse_object(json, len, &root))
		return -EINVAL;
	tok = json_get_string(root, "token");
	if (!tok || !*tok)
		tok = json_get_string(root, "access_token");
	if (!tok)
		goto out;
	n = strlen(tok);
	if (!n || n > TOKEN_MAX)
		goto out;
	/* It goes into a header line: visible ASCII only. */
	for (i = 0; i < n; i++)
		if (tok[i] <= ' ' || tok[i] >= 0x7f)
			goto out;
	if (json_object_object_get_ex(root, "expires_in", &v) &&
	    json_object_is_type(v, json_type_int)) {
		exp = json_object_get_int64(v);
		if (exp <= 0)
			exp = TOKEN_DEFAULT_S;
		if (exp > TOKEN_MAX_S)
			exp = TOKEN_MAX_S;
	}
	issued = json_get_string(root, "issued_at");
	if (issued) {
		time_t when;

		/* Trust issued_at only when it is consistent with our clock:
		 * a skewed clock must not make every token look expired. */
		if (!parse_rfc3339(issued, &when) && when <= now &&
		    now - when < exp)
			exp -= now - when;
	}
	err = -ENOMEM;
	*token = strdup(tok);
	if (!*token)
		goto out;
	*lifetime_s = (unsigned int)exp;
	err = 0;
out:
	json_object_put(root);
	return err;
}

/* ------------------------------------------------------------------ */
/* Credentials and challenges                                          */
/* ------------------------------------------------------------------ */

static int creds_locked(struct registry *r)
{
	int err;

	if (r->creds_loaded)
		return 0;
	err = fetch_load_creds(r->opts, r->host, &r->creds);
	if (err)
		return err;
	r->creds_loaded = true;
	atomic_store(&r->creds_found, r->creds.kind != FETCH_CREDS_NONE);
	return 0;
}

bool auth_have_creds(struct registry *r)
{
	/* Called from error paths that may hold auth_lock. */
	return atomic_load(&r->creds_found);
}

/* "Authorization: Basic base64(user:secret)" */
static int basic_line(const char *user, const char *secret, char **line)
{
	char *pair = NULL, *b64 = NULL;
	int err;

	*line = NULL;
	if (asprintf(&pair, "%s:%s", user, secret) < 0)
		return -ENOMEM;
	err = base64_encode(pair, strlen(pair), &b64);
	OPENSSL_cleanse(pair, strlen(pair));
	free(pair);
	if (err)
		return err;
	if (asprintf(line, "Authorization: Basic %s", b64) < 0) {
		*line = NULL;
		err = -ENOMEM;
	}
	auth_line_free(b64);
	return err;
}

static bool realm_ok(const char *realm)
{
	const char *p;

	if (strncasecmp(realm, "https://", 8) && strncasecmp(realm, "http://", 7))
		return false;
	for (p = realm; *p; p++)
		if ((unsigned char)*p <= ' ' || *p == 0x7f || *p == '#')
			return false;
	return true;
}

static int set_str(char **dst, const char *src)
{
	char *s = strdup(src);

	if (!s)
		return -ENOMEM;
	free(*dst);
	*dst = s;
	return 0;
}

/*
 * Learn the challenge of a 401. Bearer (with a usable realm) is
 * preferred over Basic; *@changed tells whether anything differs from
 * what we used so far.
 */
static int learn_challenge(struct registry *r, const struct http_resp *resp,
			   bool *changed, bool *insufficient_scope)
{
	const char *hdr = http_header(resp, "WWW-Authenticate");
	struct fetch_challenge *ch;
	int n, i, basic = -1, bearer = -1, err = 0;

	*changed = false;
	*insufficient_scope = false;
	if (!hdr) {
		ferry_err("%s: HTTP 401 without a WWW-Authenticate challenge",
			  r->name);
		return -EACCES;
	}
	ch = calloc(4, sizeof(*ch));
	if (!ch)
		return -ENOMEM;
	n = fetch_parse_www_auth(hdr, strlen(hdr), ch, 4);
	for (i = 0; i < n; i++) {
		if (ch[i].scheme == FETCH_CHAL_BEARER && bearer < 0 &&
		    realm_ok(ch[i].realm))
			bearer = i;
		if (ch[i].scheme == FETCH_CHAL_BASIC && basic < 0)
			basic = i;
	}
	if (bearer >= 0 && !strncmp(r->base, "https://", 8) &&
	    !http_cleartext_ok(r->opts->insecure, ch[bearer].realm)) {
		/* Credentials and tokens would cross the network in clear. */
		ferry_err("%s: the registry speaks https but names a plain http "
			  "token server (realm \"%.200s\"): refused; fix the "
			  "registry's token realm, or name that host with "
			  "--insecure-registry if it really speaks only http",
			  r->name, ch[bearer].realm);
		err = -EACCES;
	} else if (bearer >= 0) {
		struct fetch_challenge *c = &ch[bearer];

		*insufficient_scope = !strcmp(c->error, "insufficient_scope");
		if (r->auth_kind != REG_AUTH_BEARER || !r->realm ||
		    strcmp(r->realm, c->realm) || !r->service ||
		    strcmp(r->service, c->service)) {
			err = set_str(&r->realm, c->realm);
			if (!err)
				err = set_str(&r->service, c->service);
			if (!err) {
				tokens_clear(r);
				r->auth_kind = REG_AUTH_BEARER;
				*changed = true;
			}
		}
	} else if (basic >= 0) {
		if (r->auth_kind != REG_AUTH_BASIC) {
			r->auth_kind = REG_AUTH_BASIC;
			*changed = true;
		}
	} else {
		ferry_err("%s: unsupported authentication challenge \"%.200s\"",
			  r->name, hdr);
		err = -EACCES;
	}
	free(ch);
	return err;
}

/* ------------------------------------------------------------------ */
/* Ping                                                                */
/* ------------------------------------------------------------------ */

static bool tls_failure(CURLcode cc)
{
	return cc == CURLE_SSL_CONNECT_ERROR ||
	       cc == CURLE_PEER_FAILED_VERIFICATION ||
	       cc == CURLE_SSL_CERTPROBLEM || cc == CURLE_SSL_CIPHER ||
	       cc == CURLE_SSL_ISSUER_ERROR;
}

static int ping_locked(struct registry *r)
{
	struct http_resp resp = { 0 };
	struct http_req q = {
		.what = "API version check (/v2/)",
		.method = "GET",
		.follow = true,
		.max_body = 64u << 10,
		.stop_at_max = true,
	};
	bool changed, insufficient;
	char *url = NULL;
	int err;

	for (;;) {
		free(url);
		if (asprintf(&url, "%s%s/", r->base, r->api) < 0) {
			url = NULL;
			err = -ENOMEM;
			goto out;
		}
		q.url = url;
		err = http_do(r, &q, &resp);
		if (err && tls_failure(resp.cc) && r->tls_noverify &&
		    !strncmp(r->base, "https://", 8)) {
			char *plain = NULL, why[320];

			http_describe(&resp, err, why, sizeof(why));
			ferry_warn("%s: %s; falling back to plain http", r->name,
				   why);
			if (asprintf(&plain, "http://%s", r->endpoint) < 0) {
				err = -ENOMEM;
				goto out;
			}
			free(r->base);
			r->base = plain;
			r->plain_why = "TLS failed without verification";
			continue;
		}
		break;
	}
	if (err) {
		http_log_failure(r, "cannot reach the registry", err, &resp);
		goto out;
	}
	if ((resp.status >= 200 && resp.status < 300) || resp.status == 404) {
		/* Open, or no ping endpoint: a later 401 still teaches us. */
		r->auth_kind = REG_AUTH_NONE;
	} else if (resp.status == 401) {
		err = learn_challenge(r, &resp, &changed, &insufficient);
	} else {
		err = http_status_error(r, q.what, &resp);
	}
out:
	free(url);
	http_resp_free(&resp);
	return err;
}

int auth_ping(struct registry *r)
{
	int err = 0;

	pthread_mutex_lock(&r->auth_lock);
	if (!r->pinged) {
		err = ping_locked(r);
		if (!err)
			r->pinged = true;
	}
	pthread_mutex_unlock(&r->auth_lock);
	return err;
}

/* ------------------------------------------------------------------ */
/* Tokens                                                              */
/* ------------------------------------------------------------------ */

/* "repository:R:pull[,push][ repository:SRC:pull]" */
static char *scope_string(struct registry *r, const struct reg_scope *sc)
{
	char *s = NULL;
	int n;

	if (sc->mount_from)
		n = asprintf(&s, "repository:%s:pull%s repository:%s:pull",
			     r->repo, sc->push ? ",push" : "", sc->mount_from);
	else
		n = asprintf(&s, "repository:%s:pull%s", r->repo,
			     sc->push ? ",push" : "");
	return n < 0 ? NULL : s;
}

/* Append "&name=value" (escaped) to *@url. */
static int url_add(char **url, const char *name, const char *value)
{
	char *esc = http_escape(value), *n = NULL;
	int rc;

	if (!esc)
		return -ENOMEM;
	rc = asprintf(&n, "%s%c%s=%s", *url, strchr(*url, '?') ? '&' : '?',
		      name, esc);
	free(esc);
	if (rc < 0)
		return -ENOMEM;
	free(*url);
	*url = n;
	return 0;
}

/* GET realm?service=..&scope=.. (one scope parameter per scope). */
static int token_get(struct registry *r, const char *scopes,
		     const char *basic, struct http_resp *resp)
{
	struct http_req q = {
		.what = "token request",
		.method = "GET",
		.auth_line = basic,
		.follow = true,
		.max_body = TOKEN_BODY_MAX,
	};
	char *url = strdup(r->realm), *copy = strdup(scopes), *sp, *tok;
	int err = -ENOMEM;

	if (!url || !copy)
		goto out;
	if (r->service && *r->service && url_add(&url, "service", r->service))
		goto out;
	for (tok = strtok_r(copy, " ", &sp); tok; tok = strtok_r(NULL, " ", &sp))
		if (url_add(&url, "scope", tok))
			goto out;
	q.url = url;
	err = http_do(r, &q, resp);
out:
	free(url);
	free(copy);
	return err;
}

/* OAuth2: POST realm grant_type=refresh_token (identity tokens). */
static int token_post(struct registry *r, const char *scopes,
		      struct http_resp *resp)
{
	char *body = NULL, *e_tok = http_escape(r->creds.secret);
	char *e_svc = http_escape(r->service ? r->service : "");
	char *e_scope = http_escape(scopes);
	struct http_req q = {
		.what = "OAuth2 token request",
		.method = "POST",
		.url = r->realm,
		.secret_body = true,
		.upload = true,
		.max_body = TOKEN_BODY_MAX,
	};
	int err = -ENOMEM;

	if (!e_tok || !e_svc || !e_scope)
		goto out;
	if (asprintf(&body,
		     "grant_type=refresh_token&refresh_token=%s&service=%s"
		     "&client_id=ferry&scope=%s",
		     e_tok, e_svc, e_scope) < 0) {
		body = NULL;
		goto out;
	}
	q.up_data = body;
	q.up_len = strlen(body);
	err = http_do(r, &q, resp);
out:
	auth_line_free(body);
	auth_line_free(e_tok);
	free(e_svc);
	free(e_scope);
	return err;
}

static int fetch_token(struct registry *r, const char *scopes, char **line,
		       unsigned int *lifetime)
{
	struct http_resp resp = { 0 };
	char *basic = NULL, *token = NULL;
	const char *how;
	int err;

	*line = NULL;
	err = creds_locked(r);
	if (err)
		return err;
	if (r->creds.kind == FETCH_CREDS_TOKEN) {
		how = "identity token";
		err = token_post(r, scopes, &resp);
		if (!err && (resp.status == 404 || resp.status == 405)) {
			err = basic_line(r->creds.user ? r->creds.user :
							 "<token>",
					 r->creds.secret, &basic);
			if (!err)
				err = token_get(r, scopes, basic, &resp);
		}
	} else {
		how = r->creds.kind == FETCH_CREDS_BASIC ?
			      "credentials" :
			      "anonymous request";
		if (r->creds.kind == FETCH_CREDS_BASIC)
			err = basic_line(r->creds.user, r->creds.secret, &basic);
		if (!err)
			err = token_get(r, scopes, basic, &resp);
	}
	if (err) {
		if (err != -ENOMEM)
			http_log_failure(r, "token server unreachable", err,
					 &resp);
		goto out;
	}
	if (resp.status == 401 || resp.status == 403) {
		ferry_err("%s: token server refused the %s for scope \"%s\" "
			  "(HTTP %ld)", r->name, how, scopes, resp.status);
		err = -EACCES;
		goto out;
	}
	if (resp.status != 200) {
		err = http_status_error(r, "token request", &resp);
		goto out;
	}
	err = fetch_parse_token((const char *)resp.body, resp.body_len,
				time(NULL), &token, lifetime);
	if (err) {
		ferry_err("%s: malformed answer from the token server", r->name);
		err = -EIO;
		goto out;
	}
	if (asprintf(line, "Authorization: Bearer %s", token) < 0) {
		*line = NULL;
		err = -ENOMEM;
	}
out:
	auth_line_free(token);
	auth_line_free(basic);
	if (resp.body)
		OPENSSL_cleanse(resp.body, resp.body_len);
	http_resp_free(&resp);
	return err;
}

static int bearer_line(struct registry *r, const struct reg_scope *sc,
		       char **out)
{
	struct reg_token *t = NULL, *lru = &r->tokens[0];
	uint64_t now = ferry_now_ns(), life_ns, margin;
	unsigned int lifetime = 0;
	char *scopes, *line = NULL;
	size_t i;
	int err;

	scopes = scope_string(r, sc);
	if (!scopes)
		return -ENOMEM;
	for (i = 0; i < REG_TOKENS_MAX; i++) {
		struct reg_token *c = &r->tokens[i];

		if (c->scope && !strcmp(c->scope, scopes)) {
			t = c;
			break;
		}
		if (c->used_ns < lru->used_ns)
			lru = c;
	}
	if (t && now < t->refresh_ns) {
		t->used_ns = now;
		*out = strdup(t->line);
		free(scopes);
		return *out ? 0 : -ENOMEM;
	}
	err = fetch_token(r, scopes, &line, &lifetime);
	if (err) {
		free(scopes);
		return err;
	}
	if (!t)
		t = lru;
	token_clear(t);
	/* Refresh when 10% of the lifetime (at least 5 s, at most half
	 * of it) is left. */
	life_ns = (uint64_t)lifetime * 1000000000ull;
	margin = MAX(life_ns / 10, REFRESH_MIN_NS);
	margin = MIN(margin, life_ns / 2);
	t->scope = scopes;
	t->line = line;
	t->refresh_ns = now + life_ns - margin;
	t->used_ns = now;
	*out = strdup(line);
	return *out ? 0 : -ENOMEM;
}

int auth_line(struct registry *r, const struct reg_scope *sc, char **out)
{
	int err = 0;

	*out = NULL;
	pthread_mutex_lock(&r->auth_lock);
	switch (r->auth_kind) {
	case REG_AUTH_NONE:
		break;
	case REG_AUTH_BASIC:
		err = creds_locked(r);
		if (!err && r->creds.kind == FETCH_CREDS_BASIC)
			err = basic_line(r->creds.user, r->creds.secret, out);
		break;
	case REG_AUTH_BEARER:
		err = bearer_line(r, sc, out);
		break;
	}
	pthread_mutex_unlock(&r->auth_lock);
	return err;
}

int auth_rejected(struct registry *r, const struct reg_scope *sc,
		  const struct http_resp *resp, const char *used)
{
	bool changed, insufficient;
	int err, i;

	pthread_mutex_lock(&r->auth_lock);
	err = learn_challenge(r, resp, &changed, &insufficient);
	if (err)
		goto out;
	/* Sent before any challenge was known (no ping): answer it now. */
	if (changed || (!used && r->auth_kind != REG_AUTH_NONE))
		goto retry;
	if (r->auth_kind == REG_AUTH_BEARER && used) {
		/* Forget the refused token: the next attempt fetches anew. */
		for (i = 0; i < REG_TOKENS_MAX; i++)
			if (r->tokens[i].line && !strcmp(r->tokens[i].line, used))
				token_clear(&r->tokens[i]);
		if (!insufficient)
			goto retry;
	}
	err = -EACCES;
	goto out;
retry:
	/* Another attempt only helps when we have something to send. */
	err = creds_locked(r);
	if (!err && r->auth_kind == REG_AUTH_BASIC &&
	    r->creds.kind != FETCH_CREDS_BASIC)
		err = -EACCES;
out:
	pthread_mutex_unlock(&r->auth_lock);
	(void)sc;
	return err;
}
