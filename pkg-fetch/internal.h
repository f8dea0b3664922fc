/* SPDX-License-Identifier: MIT */
/*
 * pkg-fetch internals shared by its source files, the unit tests and the
 * fuzz target: the pure parsers of network and config input, the HTTP
 * layer (curl plumbing, retries, handle pool) and the registry state.
 *
 *   ref.c       references and digests
 *   parse.c     WWW-Authenticate, Content-Range, Link, Retry-After, base64
 *   creds.c     docker config files and credential helpers
 *   http.c      curl setup, handle pool, the request path (auth, retries)
 *   auth.c      the /v2/ ping, challenges, Basic and Bearer tokens
 *   registry.c  client lifetime, manifests, tags, blob HEAD, redirects
 *   stream.c    blob reads (streams, whole blobs, ranges) over curl multi
 *   upload.c    blob and manifest uploads
 */
#ifndef FERRY_FETCH_INTERNAL_H
#define FERRY_FETCH_INTERNAL_H

#include <curl/curl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/types.h>
#include <time.h>

#include "../pkg-base/base.h"
#include "fetch.h"

/* ------------------------------------------------------------------ */
/* Pure parsers (no I/O): unit-tested and fuzzed                       */
/* ------------------------------------------------------------------ */

bool fetch_repo_valid(const char *s, size_t len);
bool fetch_tag_valid(const char *s, size_t len);
/* The host a registry's API answers on: FETCH_HUB_ENDPOINT for the Hub,
 * else @host itself. */
const char *fetch_registry_endpoint(const char *host);

enum fetch_chal_scheme {
	FETCH_CHAL_OTHER,
	FETCH_CHAL_BASIC,
	FETCH_CHAL_BEARER,
};

struct fetch_challenge {
	enum fetch_chal_scheme scheme;
	char realm[2048];
	char service[512];
	char scope[1024];
	char error[64];
};

/*
 * A WWW-Authenticate value: one or more comma-separated challenges, each
 * a scheme and auth-params (quoted strings may hold commas and escapes)
 * or a token68. Fills up to @max challenges and returns how many; junk
 * after the first well-formed challenge is ignored. -EINVAL when there is
 * none, or a known parameter is longer than its field.
 */
int fetch_parse_www_auth(const char *s, size_t len,
			 struct fetch_challenge *out, int max);

#define FETCH_RANGE_UNKNOWN UINT64_MAX

/*
 * "bytes FIRST-LAST/TOTAL", "bytes FIRST-LAST/<star>" or
 * "bytes <star>/TOTAL" (<star> being '*': unknown parts are
 * FETCH_RANGE_UNKNOWN); checks FIRST <= LAST < TOTAL.
 */
struct fetch_content_range {
	uint64_t first, last, total;
};
int fetch_parse_content_range(const char *s, size_t len,
			      struct fetch_content_range *out);

/* An upload's "Range: 0-LAST" (optionally "bytes=0-LAST"). */
int fetch_parse_upload_range(const char *s, size_t len, uint64_t *last);

/*
 * The target of the rel="next" link in a Link value ("<url>; rel=next",
 * several links comma-separated): 1 and the URL (as written) in @url,
 * 0 when there is none, -EINVAL when malformed or longer than @cap - 1.
 */
int fetch_parse_link_next(const char *s, size_t len, char *url, size_t cap);

#define FETCH_RETRY_AFTER_MAX_MS 60000u

/*
 * Retry-After: delta-seconds or an IMF-fixdate (relative to @now); the
 * delay in milliseconds, capped at FETCH_RETRY_AFTER_MAX_MS.
 */
int fetch_parse_retry_after(const char *s, size_t len, time_t now,
			    unsigned int *ms);

/*
 * A bearer token answer {"token"|"access_token", "expires_in",
 * "issued_at"}: the token (malloc'ed, printable, no spaces) and its
 * remaining lifetime in seconds at @now (expires_in, default 60, less
 * the time since issued_at when that is plausible).
 */
int fetch_parse_token(const char *json, size_t len, time_t now,
		      char **token, unsigned int *lifetime_s);

/* Credentials: what a docker config or a helper yields. */
enum fetch_creds_kind {
	FETCH_CREDS_NONE,
	FETCH_CREDS_BASIC,  /* user + secret (password) */
	FETCH_CREDS_TOKEN,  /* secret is an OAuth2 refresh/identity token */
	FETCH_CREDS_HELPER, /* run docker-credential-<helper> */
};

struct fetch_creds {
	enum fetch_creds_kind kind;
	char *user;
	char *secret;
	char *helper;
};
void fetch_creds_clear(struct fetch_creds *c);

/* Where docker login keeps the Hub's credentials (config.json "auths"). */
#define FETCH_HUB_CONFIG_KEY "https://index.docker.io/v1/"
/* An "auths"/"credHelpers" key ("h:5000", "https://h:5000/v1/") names
 * @host; every name of the Hub names it. */
bool fetch_cfg_key_matches(const char *key, const char *host);
/*
 * Credentials for @host in a docker config.json: credHelpers[host], else
 * auths[host] ("auth" base64 user:pass, "identitytoken", or
 * "username"/"password"), else credsStore. kind NONE when nothing
 * applies; -EINVAL when the JSON or an entry is malformed.
 */
int fetch_dockercfg_lookup(const char *json, size_t len, const char *host,
			   struct fetch_creds *out);
/* A helper's answer {"ServerURL","Username","Secret"}. */
int fetch_helper_output_parse(const char *json, size_t len,
			      struct fetch_creds *out);

/* ------------------------------------------------------------------ */
/* Credentials with I/O (creds.c)                                      */
/* ------------------------------------------------------------------ */

/* Run docker-credential-@suffix get for @server: -ENOENT when it has
 * nothing (non-zero exit) or does not exist. */
int fetch_run_cred_helper(const char *suffix, const char *server,
			  struct fetch_creds *out);
/* opts->creds, else the docker config chain (see fetch.h). */
int fetch_load_creds(const struct fetch_opts *opts, const char *host,
		     struct fetch_creds *out);

/* ------------------------------------------------------------------ */
/* Registry state                                                      */
/* ------------------------------------------------------------------ */

#define REG_POOL_MAX 8
#define REG_MAXCONNECTS 32
#define REG_TOKENS_MAX 8
#define REG_REDIRECTS_MAX 256
#define REG_REDIRECT_TTL_NS (600ull * 1000000000ull)

enum reg_auth_kind {
	REG_AUTH_NONE,
	REG_AUTH_BASIC,
	REG_AUTH_BEARER,
};

struct reg_token {
	char *scope;       /* the scope list it was issued for */
	char *line;        /* "Authorization: Bearer ..." */
	uint64_t refresh_ns; /* CLOCK_MONOTONIC: fetch a new one after this */
	uint64_t used_ns;  /* for replacing the least recently used */
};

struct reg_redirect {
	uint8_t digest[FETCH_DIGEST_SIZE];
	char *url;
	uint64_t when_ns;
};

/* What a request needs from a token: pull (and push), plus pull on
 * another repository for a cross-repository mount. */
struct reg_scope {
	bool push;
	const char *mount_from;
};

/*
 * The client of one repository on one host. registry_open returns the one
 * of the registry's endpoint (or its fetch_host.server), which owns a
 * client per other host of that registry (@mirrors, in the order they are
 * tried before it); each has its own connections, authentication and
 * TLS settings.
 */
struct registry {
	/* host: whose credentials (the registry's name; a mirror's
	 * host[:port]); endpoint: where requests go. */
	char *host, *endpoint, *repo, *name;
	const struct fetch_opts *opts;
	enum fetch_access access;
	unsigned int connect_ms, stall_ms, request_ms, attempts;
	const char *user_agent;
	bool tls_noverify;
	struct curl_slist *resolve; /* opts->resolve for CURLOPT_RESOLVE */
	const struct fetch_host *cfg; /* this host's settings, or NULL */
	char *api;          /* the API root's path: "/v2" */
	char *ns;           /* "ns=REGISTRY" (escaped) for a mirror, or NULL */
	struct curl_blob ca; /* cfg's CA files, read at open ({0}: none) */
	struct curl_slist *headers; /* cfg's */
	struct fetch_opts mirror_opts; /* a mirror's opts: no opts->creds */

	bool mirror;        /* a host before the registry's own */
	struct registry **mirrors; /* the hosts before this one */
	size_t nr_mirrors;
	unsigned int caps; /* FETCH_HOST_* of a mirror */
	_Atomic uint64_t down_until_ns; /* a mirror resting after a failure */

	/* Under auth_lock. base is final once pinged is set. */
	pthread_mutex_t auth_lock;
	bool pinged;
	char *base; /* "https://endpoint" */
	const char *plain_why; /* why base is http://, for messages */
	enum reg_auth_kind auth_kind;
	char *realm, *service;
	bool creds_loaded;
	struct fetch_creds creds;
	_Atomic bool creds_found; /* readable without auth_lock */
	struct reg_token tokens[REG_TOKENS_MAX];

	/* Under lock: the handle pool and the redirect cache. */
	pthread_mutex_t lock;
	CURL *pool[REG_POOL_MAX];
	size_t nr_pool;
	struct reg_redirect redirects[REG_REDIRECTS_MAX];

	CURLSH *share;
	pthread_mutex_t share_locks[CURL_LOCK_DATA_LAST];

	_Atomic uint64_t st_requests, st_retries, st_down, st_up;
};

#define REG_MIRROR_BACKOFF_NS (30ull * 1000000000ull)
#define REG_CA_MAX (1u << 20) /* bytes of a host's CA files together */

/*
 * @host ("host[:port]") may be spoken to in plain http with credentials:
 * loopback, or named in @insecure (fetch_opts.insecure).
 */
bool fetch_host_plain(const char *const *insecure, const char *host);

/* Mirror @m may serve @caps (FETCH_HOST_*) and is not resting. */
bool reg_mirror_usable(struct registry *m, unsigned int caps);
/*
 * Mirror @m failed @what: @why says how. An unreachable mirror
 * (@unreachable) is left alone for a while; other failures (a blob it
 * does not have) only concern this object. The next host takes over.
 */
void reg_mirror_failed(struct registry *m, const char *what, const char *why,
		       bool unreachable);

/* Cached final URL of a redirected blob GET (malloc'ed copy), or NULL. */
char *reg_redirect_get(struct registry *r, const uint8_t *digest);
void reg_redirect_put(struct registry *r, const uint8_t *digest,
		      const char *url);
void reg_redirect_drop(struct registry *r, const uint8_t *digest);

/* base + api + "/" + repo + @suffix (printf-style), then a mirror's
 * "ns" query parameter; malloc'ed. */
char *reg_url(struct registry *r, const char *base, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* ------------------------------------------------------------------ */
/* HTTP layer (http.c)                                                 */
/* ------------------------------------------------------------------ */

struct http_hdr {
	char *name;
	char *value;
};

/* The final response of a request (after redirects). */
struct http_resp {
	long status;
	struct http_hdr *hdrs; /* duplicates joined with ", " */
	size_t nr_hdrs;
	size_t hdr_bytes;
	uint8_t *body;  /* NUL-terminated; error bodies are truncated */
	size_t body_len, body_cap;
	int64_t content_length; /* -1 when not sent */
	long redirects;
	char *effective_url;
	CURLcode cc;
	char errbuf[CURL_ERROR_SIZE]; /* libcurl's detail of cc, or "" */
};

void http_resp_reset(struct http_resp *resp);
/* Append to resp->body (kept NUL-terminated). */
int http_body_append(struct http_resp *resp, const void *p, size_t n);
void http_resp_free(struct http_resp *resp);
/* A response header (case-insensitive name), or NULL. */
const char *http_header(const struct http_resp *resp, const char *name);

struct http_req {
	const char *what;   /* for messages: "manifest latest" */
	const char *method; /* "GET", "HEAD", "POST", "PUT", "PATCH" */
	const char *url;
	const struct curl_slist *headers; /* extra request headers */
	/* Attach the registry's Authorization (Basic or Bearer for
	 * @scope), pinging /v2/ first; a 401 is answered once. */
	bool registry_auth;
	struct reg_scope scope;
	const char *auth_line; /* or this exact "Authorization: ..." line */
	bool secret_body;      /* the body carries a credential */
	bool follow;           /* follow redirects (GET / HEAD) */
	bool once;             /* a single attempt: no retries */
	/* No request deadline: a blob upload moves at the uplink's pace,
	 * bounded by the stall timeout (as a streamed whole blob is). */
	bool no_deadline;
	/* Request body: @up_data, else @up_fd from @up_off; @up_len bytes. */
	bool upload;
	const void *up_data;
	int up_fd;
	uint64_t up_off, up_len;
	/* A 2xx body larger than this fails with -EFBIG, or ends the
	 * transfer successfully when @stop_at_max. */
	size_t max_body;
	bool stop_at_max;
};

int http_global_init(void);
CURL *http_get_handle(struct registry *r);
void http_put_handle(struct registry *r, CURL *h);

/* Transfer state behind the curl callbacks of one request. */
struct http_xfer {
	struct registry *r;
	const struct http_req *q;
	struct http_resp *resp;
	struct curl_slist *hdrs;
	uint64_t up_pos;
	bool stopped;  /* the sink ended the transfer on purpose */
	int sink_err;  /* the sink failed: this error */
	/* Stall detection: libcurl's low-speed check averages over a
	 * window of seconds, so the progress callback watches too. */
	bool paused;   /* the reader paused it: not a stall */
	bool stalled;
	uint64_t moved_ns;
	uint64_t moved_bytes;
	uint64_t deadline_ns; /* the request's (http_try), 0: none */
	bool cancelled;       /* fetch_opts.cancel ended it */
};

/*
 * A transfer ended with @cc: 0 when an HTTP answer came (any status), else
 * a negative errno, the sink's own first; a deliberate stop is success, a
 * stall a timeout (sets resp->cc). http_xfer_end first fills in the
 * response from @h (status, redirects, effective URL, length).
 */
int http_xfer_err(const struct http_xfer *x, CURLcode cc);
int http_xfer_end(struct http_xfer *x, CURL *h, CURLcode cc);
/*
 * Bodies that are not the answer: a redirect's (dropped) and an error
 * page's (its start kept in resp->body for the message). True when @p is
 * one of them (x->sink_err set on failure); false for a 2xx body.
 */
bool http_side_body(struct http_xfer *x, const char *p, size_t n);

/*
 * Configure @h for @q (method, body, headers plus @auth_line, timeouts
 * up to x->deadline_ns, TLS, redirects) with the response going to
 * x->resp, bodies to @write_cb(@write_arg) (NULL: into resp->body).
 * Refuses (-EACCES, logged) to send @auth_line or a secret body over
 * plain http unless http_cleartext_ok. Frees nothing on error.
 */
int http_setup(struct registry *r, CURL *h, struct http_xfer *x,
	       const char *auth_line, curl_write_callback write_cb,
	       void *write_arg);

/*
 * The one request path: plain requests (http_do), each request of an
 * upload and each transfer of a stream run their attempts under a struct
 * http_try — http_try_auth (credentials for the scope), the transfer,
 * http_xfer_end, then http_try_next (a 401 refreshes once, a retriable
 * failure backs off) — and end in http_fail when the answer is not the
 * one wanted. Streams (Range resumption) and upload sessions (a new
 * session) add their own rules around it, judged and timed the same.
 */
enum http_verdict {
	HTTP_FINAL,  /* an answer to act on, or an error not worth repeating */
	HTTP_REAUTH, /* a 401 to credentials not yet refreshed */
	HTTP_RETRY,  /* transient: another attempt after a backoff */
};

/* The verdict on an attempt that got @err / @resp: retriable are
 * transport failures, 408, 429, 5xx but 501/505; @authed: it carried
 * registry credentials that a 401 has not yet refused. */
enum http_verdict http_judge(int err, const struct http_resp *resp,
			     bool authed);
/*
 * The wait before retry @attempt (1-based): Retry-After of an answer
 * (relative to @now, at most FETCH_RETRY_AFTER_MAX_MS), else full jitter
 * (@rnd) under an exponential cap (200 ms doubling up to 10 s).
 */
unsigned int http_backoff_ms(unsigned int attempt, int err,
			     const struct http_resp *resp, uint64_t rnd,
			     time_t now);

struct http_try {
	struct registry *r;
	uint64_t deadline_ns; /* http_try_start; 0: none */
	const char *method; /* for messages; NULL when @what names it */
	const char *what;
	const struct reg_scope *scope; /* registry credentials, or NULL */
	bool once;          /* no retries (a 401 is still answered) */
	unsigned int attempt; /* retries so far */
	bool challenged;    /* a 401 to a request without credentials
			     * (none known yet) was answered already */
	bool reauthed;      /* a 401 to credentials was answered already */
	char *auth;         /* the Authorization line of this attempt */
};

/*
 * The deadline of a request moving @bytes: @base_ms (the request timeout)
 * plus the time @bytes take at FETCH_DEADLINE_RATE, in milliseconds.
 */
uint64_t http_deadline_ms(unsigned int base_ms, uint64_t bytes);
/* Start the clock of @t for a request moving @bytes. */
void http_try_start(struct http_try *t, uint64_t bytes);
/* The caller cancelled every request (fetch_opts.cancel). */
bool http_cancelled(const struct registry *r);
/*
 * Credentials may go to @url: https, or plain http to a host that
 * fetch_host_plain allows. False for a URL that does not parse.
 */
bool http_cleartext_ok(const char *const *insecure, const char *url);

/* Ping /v2/ if due and set t->auth for t->scope (NULL without one). */
int http_try_auth(struct http_try *t);
/* No retry is left (the budget, the deadline, or a cancel). */
bool http_try_last(const struct http_try *t);
/* Warn (why, or what @err / @resp say) and sleep before the next retry. */
void http_try_backoff(struct http_try *t, int err,
		      const struct http_resp *resp, const char *why);
/* After an attempt: true when another should follow (the 401 answered,
 * or the backoff slept), false when @err / @resp is the result. */
bool http_try_next(struct http_try *t, int err, const struct http_resp *resp);

/* With authentication and retries, as @q asks. */
int http_do(struct registry *r, const struct http_req *q,
	    struct http_resp *resp);

/* What went wrong with a request, for a message: "HTTP 503", libcurl's
 * detail of a transport error, a TLS certificate problem. */
void http_describe(const struct http_resp *resp, int err, char *buf,
		   size_t cap);
/* negative errno for a transport failure. */
int http_curl_error(CURLcode cc);
/* The errno for an unexpected status, logged with the registry's
 * error message: 404 -ENOENT, 401/403 -EACCES, 416 -ERANGE, ... */
int http_status_error(struct registry *r, const char *what,
		      const struct http_resp *resp);
/* Log a transport failure of @what (not -EFBIG: logged when cut). */
void http_log_failure(struct registry *r, const char *what, int err,
		      const struct http_resp *resp);
/* The final error of a request that failed (@err) or did not get the
 * status it wanted: logged one way, as either of the two above. */
int http_fail(struct registry *r, const char *what, int err,
	      const struct http_resp *resp);

/* Resolve an upload/Link location against @base_url (absolute URLs are
 * kept as given). */
int http_resolve(const char *base_url, const char *loc, char **out);
/* Same scheme, host and port. */
bool http_same_origin(const char *a, const char *b);
/* Percent-encode for a query value. */
char *http_escape(const char *s);

/* ------------------------------------------------------------------ */
/* Authentication (auth.c)                                             */
/* ------------------------------------------------------------------ */

/* Ping /v2/ once per client: scheme and authentication method. */
int auth_ping(struct registry *r);
/* The Authorization header line for @sc (malloc'ed), or NULL for none;
 * fetches or refreshes a bearer token as needed. */
int auth_line(struct registry *r, const struct reg_scope *sc, char **line);
/*
 * A request sent with @used (may be NULL) got the 401 in @resp: learn
 * the challenge, forget a rejected token. 0 when another attempt may
 * succeed, -EACCES otherwise.
 */
int auth_rejected(struct registry *r, const struct reg_scope *sc,
		  const struct http_resp *resp, const char *used);
/* Wipe and free an Authorization line. */
void auth_line_free(char *line);
/* Whether credentials were found (for messages; takes no lock). */
bool auth_have_creds(struct registry *r);
void auth_release(struct registry *r);

/* ------------------------------------------------------------------ */
/* Blob reads (stream.c)                                               */
/* ------------------------------------------------------------------ */

/*
 * A stream of @len bytes at @off of a blob of @size bytes
 * (FETCH_RANGE_UNKNOWN when unknown); with @verify (whole blob only) the
 * sha256 and size are checked at the end; @bounded: read at once, under
 * the request deadline.
 */
int stream_open(struct registry *r, const uint8_t digest[FETCH_DIGEST_SIZE],
		uint64_t size, uint64_t off, uint64_t len, bool verify,
		bool bounded, struct fetch_stream **out);

#endif
