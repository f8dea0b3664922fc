// SPDX-License-Identifier: MIT
/*
 * The HTTP layer: libcurl setup shared by every request, a small pool of
 * easy handles per client and a share handle (connections, DNS, TLS
 * sessions) so that requests — synchronous ones and the multi-driven
 * streams alike — reuse connections; the one request path (struct
 * http_try) that plain requests, streams and uploads share: credentials
 * per attempt, a 401 answered once, retries with exponential backoff,
 * full jitter and Retry-After, failures logged one way.
 *
 * Security: registry credentials travel in an Authorization header that
 * libcurl drops when a redirect leaves the original host (and
 * CURLOPT_UNRESTRICTED_AUTH stays off); only http(s) is allowed, also
 * for redirects. Credentials and tokens go over plain http only to hosts
 * the user named so (or loopback): http_setup, which every transfer
 * passes, refuses the rest, whatever scheme a TLS fallback or a token
 * realm chose. Requests have a deadline (http_try_start; not blob
 * uploads and streamed whole blobs, which the stall timeout bounds) and end
 * when the caller cancels (fetch_opts.cancel), checked from the progress
 * callback and between attempts.
 */
#include <json-c/json.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <unistd.h>

#include "../pkg-base/base.h"
#include "internal.h"

#define HDR_MAX_COUNT 100
#define HDR_MAX_BYTES (64u << 10)
#define HDR_VALUE_MAX (16u << 10)
#define ERROR_BODY_MAX (16u << 10)
#define MAX_REDIRS 10L
#define BACKOFF_BASE_MS 200u
#define BACKOFF_CAP_MS 10000u
#define URL_MAX (16u << 10)
#define CANCEL_CHECK_MS 100u  /* a backoff sleep looks at the cancel flag */

static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static CURLcode global_rc;

static void global_init(void)
{
	global_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

int http_global_init(void)
{
	pthread_once(&global_once, global_init);
	if (global_rc != CURLE_OK) {
		ferry_err("libcurl initialisation failed: %s",
			  curl_easy_strerror(global_rc));
		return -ENOMEM;
	}
	return 0;
}

CURL *http_get_handle(struct registry *r)
{
	CURL *h = NULL;

	pthread_mutex_lock(&r->lock);
	if (r->nr_pool)
		h = r->pool[--r->nr_pool];
	pthread_mutex_unlock(&r->lock);
	if (!h)
		h = curl_easy_init();
	return h;
}

void http_put_handle(struct registry *r, CURL *h)
{
	if (!h)
		return;
	/* Forget options that point at the finished request's state. */
	curl_easy_reset(h);
	pthread_mutex_lock(&r->lock);
	if (r->nr_pool < REG_POOL_MAX) {
		r->pool[r->nr_pool++] = h;
		h = NULL;
	}
	pthread_mutex_unlock(&r->lock);
	if (h)
		curl_easy_cleanup(h);
}

/* ------------------------------------------------------------------ */
/* Responses                                                           */
/* ------------------------------------------------------------------ */

static void hdrs_clear(struct http_resp *resp)
{
	size_t i;

	for (i = 0; i < resp->nr_hdrs; i++) {
		free(resp->hdrs[i].name);
		free(resp->hdrs[i].value);
	}
	free(resp->hdrs);
	resp->hdrs = NULL;
	resp->nr_hdrs = 0;
	resp->hdr_bytes = 0;
}

void http_resp_reset(struct http_resp *resp)
{
	hdrs_clear(resp);
	free(resp->effective_url);
	resp->effective_url = NULL;
	resp->status = 0;
	resp->body_len = 0;
	if (resp->body)
		resp->body[0] = '\0';
	resp->content_length = -1;
	resp->redirects = 0;
	resp->cc = CURLE_OK;
	resp->errbuf[0] = '\0';
}

void http_resp_free(struct http_resp *resp)
{
	http_resp_reset(resp);
	free(resp->body);
	resp->body = NULL;
	resp->body_cap = 0;
}

const char *http_header(const struct http_resp *resp, const char *name)
{
	size_t i;

	for (i = 0; i < resp->nr_hdrs; i++)
		if (!strcasecmp(resp->hdrs[i].name, name))
			return resp->hdrs[i].value;
	return NULL;
}

/* "HTTP/1.1 200 OK" → 200; 0 when it is not a status line. */
static long status_line(const char *p, size_t n)
{
	size_t i = 5;
	long code = 0;
	int digits = 0;

	if (n < 8 || memcmp(p, "HTTP/", 5))
		return 0;
	while (i < n && p[i] != ' ')
		i++;
	while (i < n && p[i] == ' ')
		i++;
	for (; i < n && p[i] >= '0' && p[i] <= '9' && digits < 3; i++, digits++)
		code = code * 10 + (p[i] - '0');
	return digits == 3 ? code : 0;
}

static int hdr_store(struct http_resp *resp, const char *name, size_t nlen,
		     const char *val, size_t vlen)
{
	struct http_hdr *h = NULL;
	size_t i;

	if (resp->hdr_bytes + nlen + vlen > HDR_MAX_BYTES)
		return 0; /* ignore the excess rather than fail */
	for (i = 0; i < resp->nr_hdrs; i++)
		if (strlen(resp->hdrs[i].name) == nlen &&
		    !strncasecmp(resp->hdrs[i].name, name, nlen))
			h = &resp->hdrs[i];
	if (h) {
		/* Repeated fields combine into a list (RFC 9110 §5.3). */
		size_t old = strlen(h->value);
		char *v = realloc(h->value, old + 2 + vlen + 1);

		if (!v)
			return -ENOMEM;
		memcpy(v + old, ", ", 2);
		memcpy(v + old + 2, val, vlen);
		v[old + 2 + vlen] = '\0';
		h->value = v;
	} else {
		struct http_hdr *arr;

		if (resp->nr_hdrs >= HDR_MAX_COUNT)
			return 0;
		arr = realloc(resp->hdrs, (resp->nr_hdrs + 1) * sizeof(*arr));
		if (!arr)
			return -ENOMEM;
		resp->hdrs = arr;
		h = &arr[resp->nr_hdrs];
		h->name = strndup(name, nlen);
		h->value = strndup(val, vlen);
		if (!h->name || !h->value) {
			free(h->name);
			free(h->value);
			return -ENOMEM;
		}
		resp->nr_hdrs++;
	}
	resp->hdr_bytes += nlen + vlen;
	return 0;
}

/*
 * Headers of each response in turn (redirects, 100 Continue): a status
 * line starts a new set, so what remains describes the final response.
 */
static size_t header_cb(char *p, size_t size, size_t nmemb, void *arg)
{
	struct http_xfer *x = arg;
	size_t n = size * nmemb, len = n, nlen, v;
	long code;

	while (len && (p[len - 1] == '\n' || p[len - 1] == '\r'))
		len--;
	code = status_line(p, len);
	if (code) {
		hdrs_clear(x->resp);
		x->resp->status = code;
		return n;
	}
	for (nlen = 0; nlen < len && p[nlen] != ':'; nlen++)
		if (p[nlen] <= ' ' || p[nlen] >= 0x7f)
			return n; /* not a field line: ignore */
	if (!nlen || nlen == len)
		return n;
	v = nlen + 1;
	while (v < len && (p[v] == ' ' || p[v] == '\t'))
		v++;
	while (len > v && (p[len - 1] == ' ' || p[len - 1] == '\t'))
		len--;
	if (len - v > HDR_VALUE_MAX)
		return n;
	for (size_t i = v; i < len; i++)
		if ((unsigned char)p[i] < 0x20 && p[i] != '\t')
			return n; /* control bytes: drop the field */
	if (hdr_store(x->resp, p, nlen, p + v, len - v)) {
		x->sink_err = -ENOMEM;
		return 0;
	}
	return n;
}

int http_body_append(struct http_resp *resp, const void *p, size_t n)
{
	if (resp->body_len + n + 1 > resp->body_cap) {
		size_t cap = resp->body_cap ? resp->body_cap : 4096;
		uint8_t *b;

		while (cap < resp->body_len + n + 1)
			cap *= 2;
		b = realloc(resp->body, cap);
		if (!b)
			return -ENOMEM;
		resp->body = b;
		resp->body_cap = cap;
	}
	memcpy(resp->body + resp->body_len, p, n);
	resp->body_len += n;
	resp->body[resp->body_len] = '\0';
	return 0;
}

bool http_side_body(struct http_xfer *x, const char *p, size_t n)
{
	struct http_resp *resp = x->resp;
	long st = resp->status;
	size_t keep;

	if (st >= 200 && st < 300)
		return false;
	atomic_fetch_add(&x->r->st_down, n);
	if (st >= 300 && st < 400)
		return true;
	keep = resp->body_len < ERROR_BODY_MAX ?
		       MIN(n, ERROR_BODY_MAX - resp->body_len) : 0;
	if (keep && http_body_append(resp, p, keep))
		x->sink_err = -ENOMEM;
	return true;
}

/* Default sink: 2xx bodies up to max_body into resp->body. */
static size_t write_cb(char *p, size_t size, size_t nmemb, void *arg)
{
	struct http_xfer *x = arg;
	struct http_resp *resp = x->resp;
	size_t n = size * nmemb;

	if (http_side_body(x, p, n))
		return x->sink_err ? 0 : n;
	atomic_fetch_add(&x->r->st_down, n);
	if (resp->body_len + n > x->q->max_body) {
		if (x->q->stop_at_max) {
			size_t keep = x->q->max_body - resp->body_len;

			if (keep && http_body_append(resp, p, keep)) {
				x->sink_err = -ENOMEM;
				return 0;
			}
			x->stopped = true;
		} else {
			x->sink_err = -EFBIG;
		}
		return 0;
	}
	if (http_body_append(resp, p, n)) {
		x->sink_err = -ENOMEM;
		return 0;
	}
	return n;
}

/* ------------------------------------------------------------------ */
/* Request bodies                                                      */
/* ------------------------------------------------------------------ */

static size_t read_cb(char *buf, size_t size, size_t nmemb, void *arg)
{
	struct http_xfer *x = arg;
	const struct http_req *q = x->q;
	size_t n = size * nmemb;
	uint64_t left = q->up_len - x->up_pos;

	if (n > left)
		n = (size_t)left;
	if (!n)
		return 0;
	if (q->up_data) {
		memcpy(buf, (const uint8_t *)q->up_data + x->up_pos, n);
	} else {
		ssize_t k;

		do
			k = pread(q->up_fd, buf, n,
				  (off_t)(q->up_off + x->up_pos));
		while (k < 0 && errno == EINTR);
		if (k <= 0) {
			x->sink_err = k < 0 ? -errno : -EIO;
			return CURL_READFUNC_ABORT;
		}
		n = (size_t)k;
	}
	x->up_pos += n;
	atomic_fetch_add(&x->r->st_up, n);
	return n;
}

/* libcurl rewinds the body when it must send it again. */
static int seek_cb(void *arg, curl_off_t off, int origin)
{
	struct http_xfer *x = arg;

	if (origin != SEEK_SET || off < 0 || (uint64_t)off > x->q->up_len)
		return CURL_SEEKFUNC_FAIL;
	x->up_pos = (uint64_t)off;
	return CURL_SEEKFUNC_OK;
}

/* ------------------------------------------------------------------ */
/* Stalls, deadlines, cancels                                          */
/* ------------------------------------------------------------------ */

bool http_cancelled(const struct registry *r)
{
	return r->opts->cancel && atomic_load(r->opts->cancel);
}

uint64_t http_deadline_ms(unsigned int base_ms, uint64_t bytes)
{
	return (uint64_t)base_ms + bytes / (FETCH_DEADLINE_RATE / 1000u);
}

void http_try_start(struct http_try *t, uint64_t bytes)
{
	t->deadline_ns = ferry_now_ns() +
			 http_deadline_ms(t->r->request_ms, bytes) * 1000000ull;
}

static int xferinfo_cb(void *arg, curl_off_t dltotal, curl_off_t dlnow,
		       curl_off_t ultotal, curl_off_t ulnow)
{
	struct http_xfer *x = arg;
	uint64_t now = ferry_now_ns();
	uint64_t moved = (uint64_t)dlnow + (uint64_t)ulnow;

	(void)dltotal;
	(void)ultotal;
	if (http_cancelled(x->r)) {
		x->cancelled = true;
		return 1;
	}
	if (moved != x->moved_bytes || x->paused) {
		x->moved_bytes = moved;
		x->moved_ns = now;
		return 0;
	}
	if (now - x->moved_ns >= (uint64_t)x->r->stall_ms * 1000000ull) {
		x->stalled = true;
		return 1; /* CURLE_ABORTED_BY_CALLBACK */
	}
	return 0;
}

/* Some servers announce a Content-Length for error pages and send less
 * (registry 2.8 on 416): the status is what matters then. */
static bool error_status_answered(CURLcode cc, const struct http_resp *resp)
{
	return resp->status >= 300 &&
	       (cc == CURLE_PARTIAL_FILE || cc == CURLE_RECV_ERROR);
}

int http_xfer_err(const struct http_xfer *x, CURLcode cc)
{
	CURLcode res = cc;

	if (cc == CURLE_WRITE_ERROR && x->stopped)
		res = CURLE_OK;
	else if (cc == CURLE_ABORTED_BY_CALLBACK && x->stalled)
		res = CURLE_OPERATION_TIMEDOUT;
	/* libcurl's detail describes the code it returned, not ours. */
	if (res != cc)
		x->resp->errbuf[0] = '\0';
	x->resp->cc = res;
	if (x->sink_err)
		return x->sink_err;
	if (cc == CURLE_ABORTED_BY_CALLBACK && x->cancelled) {
		snprintf(x->resp->errbuf, sizeof(x->resp->errbuf),
			 "cancelled by its caller");
		return -ECANCELED;
	}
	if (cc == CURLE_OPERATION_TIMEDOUT && x->deadline_ns &&
	    ferry_now_ns() >= x->deadline_ns)
		snprintf(x->resp->errbuf, sizeof(x->resp->errbuf),
			 "the request deadline passed (fetch request timeout)");
	if (error_status_answered(res, x->resp))
		return 0;
	return http_curl_error(res);
}

/* ------------------------------------------------------------------ */
/* Setup                                                               */
/* ------------------------------------------------------------------ */

static int slist_add(struct curl_slist **l, const char *s)
{
	struct curl_slist *n = curl_slist_append(*l, s);

	if (!n)
		return -ENOMEM;
	*l = n;
	return 0;
}

int http_setup(struct registry *r, CURL *h, struct http_xfer *x,
	       const char *auth_line, curl_write_callback wcb, void *warg)
{
	const struct http_req *q = x->q;
	const struct curl_slist *e;
	long stall_s = (long)DIV_ROUND_UP(r->stall_ms, 1000u);
	uint64_t now = ferry_now_ns();
	CURLcode c = CURLE_OK;

	x->hdrs = NULL;
	x->up_pos = 0;
	x->paused = x->stalled = x->cancelled = false;
	if (http_cancelled(r)) {
		ferry_err("%s: %s: cancelled by its caller", r->name, q->what);
		return -ECANCELED;
	}
	if ((auth_line || q->secret_body) &&
	    !http_cleartext_ok(r->opts->insecure, q->url)) {
		ferry_err("%s: %s: refusing to send credentials over plain http "
			  "(%s is not loopback and not named plain http); if it "
			  "really speaks only http, name it with "
			  "--insecure-registry HOST[:PORT], else fix its TLS",
			  r->name, q->what, q->url);
		return -EACCES;
	}
	x->moved_bytes = 0;
	x->moved_ns = ferry_now_ns();
	for (e = q->headers; e; e = e->next)
		if (slist_add(&x->hdrs, e->data))
			return -ENOMEM;
	if (auth_line && slist_add(&x->hdrs, auth_line))
		return -ENOMEM;
	/* A host's own headers go to it, not to its token server. */
	if (r->headers && http_same_origin(q->url, r->base))
		for (e = r->headers; e; e = e->next)
			if (slist_add(&x->hdrs, e->data))
				return -ENOMEM;
	/* No 100-continue round trip: proxies often never answer it. */
	if (q->upload && slist_add(&x->hdrs, "Expect:"))
		return -ENOMEM;

#define SET(opt, val)                                                          \
	do {                                                                   \
		if (c == CURLE_OK)                                             \
			c = curl_easy_setopt(h, opt, val);                     \
	} while (0)
	x->resp->errbuf[0] = '\0';
	SET(CURLOPT_ERRORBUFFER, x->resp->errbuf);
	SET(CURLOPT_URL, q->url);
	SET(CURLOPT_NOSIGNAL, 1L);
	SET(CURLOPT_SHARE, r->share);
	SET(CURLOPT_USERAGENT, r->user_agent);
	SET(CURLOPT_PROTOCOLS_STR, "http,https");
	SET(CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
	SET(CURLOPT_CONNECTTIMEOUT_MS, (long)r->connect_ms);
	if (x->deadline_ns)
		SET(CURLOPT_TIMEOUT_MS,
		    (long)MAX(1u, MIN((x->deadline_ns - MIN(now, x->deadline_ns)) /
					      1000000u,
				      (uint64_t)LONG_MAX)));
	SET(CURLOPT_LOW_SPEED_LIMIT, 1L);
	SET(CURLOPT_LOW_SPEED_TIME, stall_s ? stall_s : 1L);
	SET(CURLOPT_TCP_KEEPALIVE, 1L);
	/* The shared cache keeps this many idle connections (libcurl's
	 * default of a few would close them under parallel use). */
	SET(CURLOPT_MAXCONNECTS, (long)REG_MAXCONNECTS);
	SET(CURLOPT_FOLLOWLOCATION, q->follow ? 1L : 0L);
	SET(CURLOPT_MAXREDIRS, MAX_REDIRS);
	SET(CURLOPT_UNRESTRICTED_AUTH, 0L);
	SET(CURLOPT_NOPROGRESS, 0L);
	SET(CURLOPT_XFERINFOFUNCTION, xferinfo_cb);
	SET(CURLOPT_XFERINFODATA, x);
	SET(CURLOPT_HEADERFUNCTION, header_cb);
	SET(CURLOPT_HEADERDATA, x);
	SET(CURLOPT_WRITEFUNCTION, wcb ? wcb : write_cb);
	SET(CURLOPT_WRITEDATA, wcb ? warg : x);
	if (r->tls_noverify) {
		SET(CURLOPT_SSL_VERIFYPEER, 0L);
		SET(CURLOPT_SSL_VERIFYHOST, 0L);
	}
	if (r->ca.data)
		SET(CURLOPT_CAINFO_BLOB, &r->ca);
	else if (r->opts->ca_file)
		SET(CURLOPT_CAINFO, r->opts->ca_file);
	if (r->cfg && r->cfg->client_cert) {
		SET(CURLOPT_SSLCERT, r->cfg->client_cert);
		if (r->cfg->client_key)
			SET(CURLOPT_SSLKEY, r->cfg->client_key);
	}
	if (r->resolve)
		SET(CURLOPT_RESOLVE, r->resolve);
	if (!strcmp(q->method, "HEAD")) {
		SET(CURLOPT_NOBODY, 1L);
	} else if (!strcmp(q->method, "GET")) {
		SET(CURLOPT_HTTPGET, 1L);
	} else if (!strcmp(q->method, "POST")) {
		SET(CURLOPT_POST, 1L);
		SET(CURLOPT_POSTFIELDSIZE_LARGE,
		    (curl_off_t)(q->upload ? q->up_len : 0));
		SET(CURLOPT_POSTFIELDS, q->upload ? q->up_data : "");
	} else {
		SET(CURLOPT_UPLOAD, 1L);
		SET(CURLOPT_INFILESIZE_LARGE,
		    (curl_off_t)(q->upload ? q->up_len : 0));
		SET(CURLOPT_READFUNCTION, read_cb);
		SET(CURLOPT_READDATA, x);
		SET(CURLOPT_SEEKFUNCTION, seek_cb);
		SET(CURLOPT_SEEKDATA, x);
		if (strcmp(q->method, "PUT"))
			SET(CURLOPT_CUSTOMREQUEST, q->method);
	}
	SET(CURLOPT_HTTPHEADER, x->hdrs);
#undef SET
	if (c != CURLE_OK) {
		ferry_err("%s: libcurl setup of %s failed: %s", r->name, q->what,
			  curl_easy_strerror(c));
		return -EINVAL;
	}
	return 0;
}

int http_curl_error(CURLcode cc)
{
	switch (cc) {
	case CURLE_OK:
		return 0;
	case CURLE_COULDNT_CONNECT:
		return -ECONNREFUSED;
	case CURLE_COULDNT_RESOLVE_HOST:
	case CURLE_COULDNT_RESOLVE_PROXY:
		return -EHOSTUNREACH;
	case CURLE_OPERATION_TIMEDOUT:
		return -ETIMEDOUT;
	case CURLE_OUT_OF_MEMORY:
		return -ENOMEM;
	case CURLE_SSL_CONNECT_ERROR:
	case CURLE_PEER_FAILED_VERIFICATION:
	case CURLE_SSL_CERTPROBLEM:
	case CURLE_SSL_CIPHER:
	case CURLE_SSL_CACERT_BADFILE:
	case CURLE_SSL_ISSUER_ERROR:
	case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
	case CURLE_SSL_INVALIDCERTSTATUS:
	case CURLE_UNSUPPORTED_PROTOCOL:
	case CURLE_TOO_MANY_REDIRECTS:
	case CURLE_WEIRD_SERVER_REPLY:
		return -EPROTO;
	default:
		/* Resets, truncated bodies, empty replies. */
		return -EIO;
	}
}

int http_xfer_end(struct http_xfer *x, CURL *h, CURLcode cc)
{
	struct http_resp *resp = x->resp;
	curl_off_t cl = -1;
	char *eff = NULL;
	long code = 0;

	if (curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code) == CURLE_OK &&
	    code)
		resp->status = code;
	curl_easy_getinfo(h, CURLINFO_REDIRECT_COUNT, &resp->redirects);
	if (curl_easy_getinfo(h, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &cl) !=
	    CURLE_OK)
		cl = -1;
	resp->content_length = cl;
	if (curl_easy_getinfo(h, CURLINFO_EFFECTIVE_URL, &eff) == CURLE_OK &&
	    eff) {
		free(resp->effective_url);
		resp->effective_url = strdup(eff);
	}
	return http_xfer_err(x, cc);
}

/* One attempt: http_xfer_end's verdict, or a setup failure. */
static int http_once(struct registry *r, const struct http_req *q,
		     const char *auth_line, uint64_t deadline_ns,
		     struct http_resp *resp)
{
	struct http_xfer x = {
		.r = r, .q = q, .resp = resp, .deadline_ns = deadline_ns
	};
	CURLcode cc;
	CURL *h;
	int err;

	http_resp_reset(resp);
	h = http_get_handle(r);
	if (!h)
		return -ENOMEM;
	err = http_setup(r, h, &x, auth_line, NULL, NULL);
	if (err)
		goto out;
	atomic_fetch_add(&r->st_requests, 1);
	cc = curl_easy_perform(h);
	err = http_xfer_end(&x, h, cc);
	if (err == -EFBIG)
		ferry_err("%s: %s: answer larger than %zu bytes", r->name,
			  q->what, q->max_body);
out:
	curl_slist_free_all(x.hdrs);
	http_put_handle(r, h);
	return err;
}

/* Failures of TLS itself, as opposed to the connection under it. */
static const char *tls_problem(CURLcode cc)
{
	switch (cc) {
	case CURLE_PEER_FAILED_VERIFICATION:
	case CURLE_SSL_ISSUER_ERROR:
	case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
	case CURLE_SSL_INVALIDCERTSTATUS:
		return "TLS certificate verification failed";
	case CURLE_SSL_CACERT_BADFILE:
		return "cannot load the CA certificates";
	case CURLE_SSL_CONNECT_ERROR:
	case CURLE_SSL_CERTPROBLEM:
	case CURLE_SSL_CIPHER:
		return "TLS handshake failed";
	default:
		return NULL;
	}
}

void http_describe(const struct http_resp *resp, int err, char *buf,
		   size_t cap)
{
	const char *tls = tls_problem(resp->cc);
	const char *detail = resp->errbuf[0] ? resp->errbuf :
			     curl_easy_strerror(resp->cc);

	if (!err)
		snprintf(buf, cap, "HTTP %ld", resp->status);
	else if (tls)
		snprintf(buf, cap, "%s: %s", tls, detail);
	else if (resp->cc != CURLE_OK)
		snprintf(buf, cap, "%s", detail);
	else
		snprintf(buf, cap, "%s", ferry_strerror(err));
}

/* ------------------------------------------------------------------ */
/* The retry policy                                                    */
/* ------------------------------------------------------------------ */

static bool retriable(int err, const struct http_resp *resp)
{
	if (err) {
		switch (resp->cc) {
		case CURLE_COULDNT_CONNECT:
		case CURLE_COULDNT_RESOLVE_HOST:
		case CURLE_OPERATION_TIMEDOUT:
		case CURLE_RECV_ERROR:
		case CURLE_SEND_ERROR:
		case CURLE_GOT_NOTHING:
		case CURLE_PARTIAL_FILE:
		case CURLE_HTTP2:
		case CURLE_HTTP2_STREAM:
		case CURLE_HTTP3:
			return true;
		default:
			return false;
		}
	}
	return resp->status == 408 || resp->status == 429 ||
	       (resp->status >= 500 && resp->status <= 599 &&
		resp->status != 501 && resp->status != 505);
}

enum http_verdict http_judge(int err, const struct http_resp *resp,
			     bool authed)
{
	if (!err && resp->status == 401 && authed)
		return HTTP_REAUTH;
	/* Our own failures (a full sink, no memory, a cancel) are not the
	 * server's. */
	if (err == -EFBIG || err == -ENOMEM || err == -ECANCELED)
		return HTTP_FINAL;
	return retriable(err, resp) ? HTTP_RETRY : HTTP_FINAL;
}

unsigned int http_backoff_ms(unsigned int attempt, int err,
			     const struct http_resp *resp, uint64_t rnd,
			     time_t now)
{
	const char *ra = err ? NULL : http_header(resp, "Retry-After");
	unsigned int cap = BACKOFF_BASE_MS, ra_ms, i;

	if (ra && !fetch_parse_retry_after(ra, strlen(ra), now, &ra_ms))
		return ra_ms;
	for (i = 1; i < attempt && cap < BACKOFF_CAP_MS; i++)
		cap = MIN(cap * 2, BACKOFF_CAP_MS);
	return (unsigned int)(rnd % (cap + 1u));
}

/* xorshift64*, per thread, seeded from the clock: jitter needs no
 * cryptographic quality, only independence between clients. */
static uint64_t jitter_rand(void)
{
	static _Thread_local uint64_t state;

	if (!state)
		state = ferry_now_ns() ^ ((uint64_t)getpid() << 32) ^
			(uint64_t)(uintptr_t)&state;
	state ^= state >> 12;
	state ^= state << 25;
	state ^= state >> 27;
	return state * 2685821657736338717ull;
}

int http_try_auth(struct http_try *t)
{
	int err;

	auth_line_free(t->auth);
	t->auth = NULL;
	if (!t->scope)
		return 0;
	err = auth_ping(t->r);
	return err ? err : auth_line(t->r, t->scope, &t->auth);
}

bool http_try_last(const struct http_try *t)
{
	return t->once || t->attempt + 1 >= t->r->attempts ||
	       (t->deadline_ns && ferry_now_ns() >= t->deadline_ns) ||
	       http_cancelled(t->r);
}

void http_try_backoff(struct http_try *t, int err,
		      const struct http_resp *resp, const char *why)
{
	struct registry *r = t->r;
	uint64_t now = ferry_now_ns(), end;
	unsigned int ms;
	char buf[320];

	ms = http_backoff_ms(++t->attempt, err, resp, jitter_rand(),
			     time(NULL));
	if (!why) {
		http_describe(resp, err, buf, sizeof(buf));
		why = buf;
	}
	ferry_warn("%s: %s%s%s: %s; retrying in %u ms (attempt %u of %u)",
		   r->name, t->method ? t->method : "", t->method ? " " : "",
		   t->what, why, ms, t->attempt + 1, r->attempts);
	atomic_fetch_add(&r->st_retries, 1);
	/* Never past the deadline; a cancel cuts the sleep short. */
	end = now + (uint64_t)ms * 1000000ull;
	if (t->deadline_ns)
		end = MIN(end, t->deadline_ns);
	while ((now = ferry_now_ns()) < end && !http_cancelled(r)) {
		uint64_t ns = MIN(end - now, CANCEL_CHECK_MS * 1000000ull);
		struct timespec ts = {
			.tv_sec = (time_t)(ns / 1000000000ull),
			.tv_nsec = (long)(ns % 1000000000ull),
		};

		nanosleep(&ts, NULL);
	}
}

bool http_try_next(struct http_try *t, int err, const struct http_resp *resp)
{
	bool *answered = t->auth ? &t->reauthed : &t->challenged;

	switch (http_judge(err, resp, t->scope && !*answered)) {
	case HTTP_REAUTH:
		/* Once each: the challenge to a request sent before any was
		 * known, and a refusal of credentials (a second means the
		 * new credentials failed too). */
		*answered = true;
		return !auth_rejected(t->r, t->scope, resp, t->auth);
	case HTTP_RETRY:
		if (http_try_last(t))
			return false;
		http_try_backoff(t, err, resp, NULL);
		return true;
	default:
		return false;
	}
}

int http_do(struct registry *r, const struct http_req *q,
	    struct http_resp *resp)
{
	struct http_try t = {
		.r = r,
		.method = q->method,
		.what = q->what,
		.scope = q->registry_auth ? &q->scope : NULL,
		.once = q->once,
	};
	int err;

	if (!q->no_deadline)
		http_try_start(&t, q->upload ? q->up_len : 0);
	http_resp_reset(resp);
	do {
		err = http_try_auth(&t);
		if (err) {
			/* Logged where it failed; nothing was sent. */
			http_resp_reset(resp);
			break;
		}
		err = http_once(r, q, t.auth ? t.auth : q->auth_line,
				t.deadline_ns, resp);
	} while (http_try_next(&t, err, resp));
	auth_line_free(t.auth);
	return err;
}

void http_log_failure(struct registry *r, const char *what, int err,
		      const struct http_resp *resp)
{
	char why[320];

	/* No answer and no transport error: nothing was sent, and whatever
	 * stopped it (token server, setup) has said why already; an answer
	 * too large was logged where it was cut. */
	if ((!resp->status && resp->cc == CURLE_OK) || err == -EFBIG)
		return;
	http_describe(resp, err, why, sizeof(why));
	ferry_err("%s: %s: %s", r->name, what, why);
}

/* The first error of a registry error body, sanitised for a log line. */
static void error_detail(const struct http_resp *resp, char *buf, size_t cap)
{
	struct json_object *root, *errs, *e;
	const char *code = NULL, *msg = NULL;
	size_t i, n = 0;

	buf[0] = '\0';
	if (!resp->body_len)
		return;
	if (json_parse_object((const char *)resp->body, resp->body_len, &root))
		return;
	if (json_object_object_get_ex(root, "errors", &errs) &&
	    json_object_is_type(errs, json_type_array) &&
	    json_object_array_length(errs) > 0) {
		e = json_object_array_get_idx(errs, 0);
		code = json_get_string(e, "code");
		msg = json_get_string(e, "message");
	}
	if (code || msg)
		n = (size_t)snprintf(buf, cap, " (%s%s%s)", code ? code : "",
				     code && msg ? ": " : "", msg ? msg : "");
	for (i = 0; i < n && i < cap && buf[i]; i++)
		if ((unsigned char)buf[i] < 0x20 || buf[i] == 0x7f)
			buf[i] = '?';
	json_object_put(root);
}

int http_fail(struct registry *r, const char *what, int err,
	      const struct http_resp *resp)
{
	if (!err)
		return http_status_error(r, what, resp);
	http_log_failure(r, what, err, resp);
	return err;
}

int http_status_error(struct registry *r, const char *what,
		      const struct http_resp *resp)
{
	char detail[240];
	long st = resp->status;
	int err;

	error_detail(resp, detail, sizeof(detail));
	if (st == 404) {
		err = -ENOENT;
		ferry_err("%s: %s: not found%s", r->name, what, detail);
	} else if (st == 401 || st == 403) {
		err = -EACCES;
		ferry_err("%s: %s: access denied (HTTP %ld%s)%s", r->name, what,
			  st, auth_have_creds(r) ? "" : ", no credentials",
			  detail);
	} else if (st == 416) {
		err = -ERANGE;
		ferry_err("%s: %s: range not satisfiable%s", r->name, what,
			  detail);
	} else if (st == 400 && !strncmp(r->base, "http://", 7) && resp->body &&
		   strcasestr((const char *)resp->body, "https")) {
		/* Go and nginx answer plain http on a TLS port this way. */
		err = -EPROTO;
		ferry_err("%s: %s: HTTP 400, the registry speaks https only "
			  "(plain http was used: %s)", r->name, what,
			  r->plain_why ? r->plain_why : "");
	} else {
		err = -EPROTO;
		ferry_err("%s: %s: unexpected HTTP status %ld%s", r->name, what,
			  st, detail);
	}
	return err;
}

/* ------------------------------------------------------------------ */
/* URLs                                                                */
/* ------------------------------------------------------------------ */

static bool url_text_ok(const char *s)
{
	size_t n = 0;

	for (; *s; s++, n++)
		if ((unsigned char)*s <= ' ' || *s == 0x7f || n >= URL_MAX)
			return false;
	return n > 0;
}

static bool has_http_scheme(const char *s)
{
	return !strncasecmp(s, "http://", 7) || !strncasecmp(s, "https://", 8);
}

int http_resolve(const char *base_url, const char *loc, char **out)
{
	CURLU *u;
	char *res = NULL;
	int err = -EPROTO;

	*out = NULL;
	if (!loc || !url_text_ok(loc))
		return -EPROTO;
	if (has_http_scheme(loc)) {
		*out = strdup(loc);
		return *out ? 0 : -ENOMEM;
	}
	if (loc[0] == '/' && loc[1] != '/') {
		/* An absolute path: keep it byte for byte on our origin. */
		const char *p = strstr(base_url, "://");
		size_t olen;

		if (!p)
			return -EINVAL;
		olen = (size_t)(p + 3 - base_url) + strcspn(p + 3, "/?#");
		if (asprintf(out, "%.*s%s", (int)olen, base_url, loc) < 0) {
			*out = NULL;
			return -ENOMEM;
		}
		return 0;
	}
	u = curl_url();
	if (!u)
		return -ENOMEM;
	if (curl_url_set(u, CURLUPART_URL, base_url, 0) == CURLUE_OK &&
	    curl_url_set(u, CURLUPART_URL, loc, 0) == CURLUE_OK &&
	    curl_url_get(u, CURLUPART_URL, &res, 0) == CURLUE_OK &&
	    has_http_scheme(res)) {
		*out = strdup(res);
		err = *out ? 0 : -ENOMEM;
	}
	curl_free(res);
	curl_url_cleanup(u);
	return err;
}

static bool origin_of(const char *url, char **scheme, char **host,
		      char **port)
{
	CURLU *u = curl_url();
	bool ok;

	*scheme = *host = *port = NULL;
	if (!u)
		return false;
	ok = curl_url_set(u, CURLUPART_URL, url, 0) == CURLUE_OK &&
	     curl_url_get(u, CURLUPART_SCHEME, scheme, 0) == CURLUE_OK &&
	     curl_url_get(u, CURLUPART_HOST, host, 0) == CURLUE_OK &&
	     curl_url_get(u, CURLUPART_PORT, port, CURLU_DEFAULT_PORT) ==
		     CURLUE_OK;
	curl_url_cleanup(u);
	return ok;
}

bool http_cleartext_ok(const char *const *insecure, const char *url)
{
	char *scheme, *host, *port = NULL, *hp = NULL;
	CURLU *u = curl_url();
	bool ok = false;

	if (!u)
		return false;
	if (curl_url_set(u, CURLUPART_URL, url, 0) != CURLUE_OK ||
	    curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK)
		goto out;
	if (!strcasecmp(scheme, "https")) {
		ok = true;
	} else if (curl_url_get(u, CURLUPART_HOST, &host, 0) == CURLUE_OK) {
		/* The port as written: an insecure entry with a port names
		 * that port only. */
		if (curl_url_get(u, CURLUPART_PORT, &port, 0) != CURLUE_OK)
			port = NULL;
		if (asprintf(&hp, "%s%s%s", host, port ? ":" : "",
			     port ? port : "") < 0)
			hp = NULL;
		ok = hp && fetch_host_plain(insecure, hp);
		free(hp);
		curl_free(port);
		curl_free(host);
	}
	curl_free(scheme);
out:
	curl_url_cleanup(u);
	return ok;
}

bool http_same_origin(const char *a, const char *b)
{
	char *s1, *h1, *p1, *s2, *h2, *p2;
	bool same;

	/* Both parsed (each call fills its outputs, even on failure). */
	same = origin_of(a, &s1, &h1, &p1);
	same = origin_of(b, &s2, &h2, &p2) && same;
	same = same && !strcasecmp(s1, s2) && !strcasecmp(h1, h2) &&
	       !strcmp(p1, p2);
	curl_free(s1);
	curl_free(h1);
	curl_free(p1);
	curl_free(s2);
	curl_free(h2);
	curl_free(p2);
	return same;
}

char *http_escape(const char *s)
{
	static const char hex[] = "0123456789ABCDEF";
	size_t n = strlen(s), i, j = 0;
	char *out;

	if (n > URL_MAX)
		return NULL;
	out = malloc(3 * n + 1);
	if (!out)
		return NULL;
	for (i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];

		if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		    (c >= '0' && c <= '9') || strchr("-._~", c)) {
			out[j++] = (char)c;
		} else {
			out[j++] = '%';
			out[j++] = hex[c >> 4];
			out[j++] = hex[c & 15];
		}
	}
	out[j] = '\0';
	return out;
}
