// SPDX-License-Identifier: MIT
/*
 * The registry client: lifetime (scheme, mirror, connection sharing),
 * manifests and tags, blob HEAD, the cache of blob redirects, statistics.
 * Blob bodies are read in stream.c and written in upload.c.
 */
#include <json-c/json.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

#include "../pkg-base/base.h"
#include "internal.h"

#define DEFAULT_CONNECT_MS 10000u
#define DEFAULT_STALL_MS 30000u
#define DEFAULT_REQUEST_MS 60000u
#define DEFAULT_ATTEMPTS 5u
#define TAGS_PAGE_MAX (4u << 20)
#define TAGS_PAGES_MAX 10000u
#define TAGS_MAX 1000000u
/* Page size to ask for; 0 lets the registry choose (tests set it). */
#ifndef TAGS_PAGE_N
#define TAGS_PAGE_N 0u
#endif

static const char manifest_accept[] =
	"Accept: " FETCH_OCI_MANIFEST ", " FETCH_OCI_INDEX ", "
	FETCH_DOCKER_MANIFEST ", " FETCH_DOCKER_LIST ", */*;q=0.1";

/* ------------------------------------------------------------------ */
/* Lifetime                                                            */
/* ------------------------------------------------------------------ */

static void share_lock(CURL *h, curl_lock_data data, curl_lock_access acc,
		       void *arg)
{
	struct registry *r = arg;

	(void)h;
	(void)acc;
	if ((unsigned)data < CURL_LOCK_DATA_LAST)
		pthread_mutex_lock(&r->share_locks[data]);
}

static void share_unlock(CURL *h, curl_lock_data data, void *arg)
{
	struct registry *r = arg;

	(void)h;
	if ((unsigned)data < CURL_LOCK_DATA_LAST)
		pthread_mutex_unlock(&r->share_locks[data]);
}

/* "host" of "host[:port]" / "[v6]:port", for the loopback test. */
static size_t hostname_len(const char *host)
{
	const char *p;

	if (host[0] == '[') {
		p = strchr(host, ']');
		return p ? (size_t)(p - host + 1) : strlen(host);
	}
	p = strrchr(host, ':');
	return p ? (size_t)(p - host) : strlen(host);
}

static bool is_loopback(const char *host)
{
	size_t n = hostname_len(host), i;

	if ((n == 9 && !strncasecmp(host, "localhost", 9)) ||
	    (n == 5 && !strncmp(host, "[::1]", 5)))
		return true;
	if (n < 5 || strncmp(host, "127.", 4))
		return false;
	for (i = 4; i < n; i++)
		if (!(host[i] == '.' || (host[i] >= '0' && host[i] <= '9')))
			return false;
	return true;
}

/* An entry "host[:port]" names @host; without a port, any port. */
static bool host_entry_matches(const char *entry, size_t elen,
			       const char *host)
{
	if (strlen(host) == elen && !strncasecmp(entry, host, elen))
		return true;
	return memchr(entry, ':', elen) == NULL && entry[0] != '[' &&
	       hostname_len(host) == elen && !strncasecmp(entry, host, elen);
}

static bool is_insecure(const char *const *insecure, const char *host)
{
	const char *const *p;

	for (p = insecure; p && *p; p++)
		if (host_entry_matches(*p, strlen(*p), host))
			return true;
	return false;
}

bool fetch_host_plain(const char *const *insecure, const char *host)
{
	return is_loopback(host) || is_insecure(insecure, host);
}

/* @a and @b name the same registry (the Hub by either of its names). */
static bool same_registry(const char *a, const char *b)
{
	if (!strcasecmp(a, FETCH_HUB_OLD))
		a = FETCH_HUB;
	if (!strcasecmp(b, FETCH_HUB_OLD))
		b = FETCH_HUB;
	return !strcasecmp(a, b);
}

/* The checked resolve list, once per client (every handle sets it). */
static int load_resolve(struct registry *r)
{
	const char *const *p;
	int err;

	for (p = r->opts->resolve; p && *p; p++) {
		struct curl_slist *l;

		err = fetch_check_resolve(*p);
		if (err)
			return err;
		l = curl_slist_append(r->resolve, *p);
		if (!l)
			return -ENOMEM;
		r->resolve = l;
	}
	return 0;
}

/* A host's CA files, concatenated for CURLOPT_CAINFO_BLOB. */
static int load_ca(struct registry *r)
{
	const char *const *p;
	char *all = NULL;
	size_t len = 0;
	int err = 0;

	for (p = r->cfg->ca_files; p && *p; p++) {
		char *text = NULL, *grown;
		size_t n = 0;

		err = read_file_max(*p, REG_CA_MAX, &text, &n);
		if (err || len + n + 1 > REG_CA_MAX) {
			ferry_err("%s: CA file %s: %s", r->name, *p,
				  err ? ferry_strerror(err) :
					"the CA files are over 1 MiB together");
			free(text);
			err = err ? err : -EFBIG;
			break;
		}
		grown = realloc(all, len + n + 1);
		if (!grown) {
			free(text);
			err = -ENOMEM;
			break;
		}
		all = grown;
		memcpy(all + len, text, n);
		all[len + n] = '\n';
		len += n + 1;
		free(text);
	}
	if (err) {
		free(all);
		return err;
	}
	r->ca.data = all;
	r->ca.len = len;
	r->ca.flags = CURL_BLOB_NOCOPY;
	return 0;
}

/*
 * The API root's path of a host URL's @path (after the authority), as
 * containerd takes it: cleaned, with "/v2" appended unless it ends so or
 * @override says the path is the root.
 */
static char *api_path(const char *path, bool override)
{
	size_t n = strlen(path), i, w = 0;
	char *out = malloc(n + 4);

	if (!out)
		return NULL;
	for (i = 0; i < n; i++)
		if (path[i] != '/' || (w && out[w - 1] != '/'))
			out[w++] = path[i];
		else if (!w)
			out[w++] = '/';
	while (w && out[w - 1] == '/')
		w--;
	out[w] = '\0';
	if (!override && (w < 3 || strcmp(out + w - 3, "/v2")))
		memcpy(out + w, "/v2", 4);
	return out;
}

/* A client's name, endpoint, API root and credentials' host. */
static int host_names(struct registry *r, const struct fetch_ref *ref,
		      bool mirror, const char **scheme)
{
	const char *auth, *path;

	if (!r->cfg) {
		*scheme = NULL;
		r->endpoint = strdup(fetch_registry_endpoint(ref->host));
		r->api = strdup("/v2");
	} else {
		*scheme = strncmp(r->cfg->url, "https://", 8) ? "http" : "https";
		auth = r->cfg->url + strlen(*scheme) + 3;
		path = auth + strcspn(auth, "/");
		r->endpoint = strndup(auth, (size_t)(path - auth));
		r->api = api_path(path, r->cfg->override_path);
	}
	if (!r->endpoint || !r->api)
		return -ENOMEM;
	r->host = strdup(mirror ? r->endpoint : ref->host);
	if (!r->host)
		return -ENOMEM;
	if (mirror ? asprintf(&r->name, "%s/%s via %s", ref->host, ref->repo,
			      r->cfg->url) < 0 :
		     asprintf(&r->name, "%s/%s", ref->host, ref->repo) < 0) {
		r->name = NULL;
		return -ENOMEM;
	}
	/* Like containerd: a host that is not the registry's own is told
	 * which registry is meant. */
	if (!same_registry(r->endpoint, ref->host) &&
	    !(strcmp(ref->host, FETCH_HUB) == 0 &&
	      strcasecmp(r->endpoint, FETCH_HUB_ENDPOINT) == 0)) {
		char *esc = http_escape(ref->host);

		if (!esc || asprintf(&r->ns, "ns=%s", esc) < 0)
			r->ns = NULL;
		free(esc);
		if (!r->ns)
			return -ENOMEM;
	}
	return 0;
}

/* One client: of @cfg's host (NULL: the registry's endpoint) for @ref. */
static int reg_init(struct registry *r, const struct fetch_ref *ref,
		    const struct fetch_opts *opts, enum fetch_access access,
		    const struct fetch_host *cfg, bool mirror)
{
	const char *scheme, *const *h;
	bool plain;
	int err, i;

	pthread_mutex_init(&r->auth_lock, NULL);
	pthread_mutex_init(&r->lock, NULL);
	for (i = 0; i < CURL_LOCK_DATA_LAST; i++)
		pthread_mutex_init(&r->share_locks[i], NULL);
	r->opts = opts;
	if (mirror) {
		/* The caller's credentials are for the registry only. */
		r->mirror_opts = *opts;
		r->mirror_opts.creds = NULL;
		r->opts = &r->mirror_opts;
	}
	r->cfg = cfg;
	r->mirror = mirror;
	r->access = access;
	r->connect_ms = opts->connect_timeout_ms ? opts->connect_timeout_ms :
						   DEFAULT_CONNECT_MS;
	r->stall_ms = opts->stall_timeout_ms ? opts->stall_timeout_ms :
					       DEFAULT_STALL_MS;
	r->request_ms = opts->request_timeout_ms ? opts->request_timeout_ms :
						   DEFAULT_REQUEST_MS;
	r->attempts = opts->retries ? opts->retries : DEFAULT_ATTEMPTS;
	r->user_agent = opts->user_agent ? opts->user_agent :
					   "ferry/" FERRY_VERSION;
	r->tls_noverify = !opts->tls_verify || (cfg && cfg->skip_verify);
	r->caps = cfg && cfg->capabilities ? cfg->capabilities : FETCH_HOST_ALL;
	r->repo = strdup(ref->repo);
	if (!r->repo)
		return -ENOMEM;
	err = host_names(r, ref, mirror, &scheme);
	if (err)
		return err;
	plain = true;
	if (scheme)
		plain = !strcmp(scheme, "http");
	if (scheme && plain)
		r->plain_why = "its URL says http";
	else if (scheme)
		;
	else if (is_loopback(r->endpoint))
		r->plain_why = "loopback registries always are";
	else if (is_insecure(opts->insecure, r->host) ||
		 is_insecure(opts->insecure, r->endpoint))
		r->plain_why = "the registry is listed as insecure";
	else
		plain = false;
	if (asprintf(&r->base, "%s://%s", plain ? "http" : "https",
		     r->endpoint) < 0) {
		r->base = NULL;
		return -ENOMEM;
	}
	/*
	 * A pull skips the /v2/ ping where it would decide nothing: the first
	 * request's 401 teaches the challenge as the ping's would, and every
	 * cold mount saves a round trip. It stays where https without
	 * verification may fall back to http, and for pushes, which learn
	 * the challenge before they send a body.
	 */
	r->pinged = access == FETCH_PULL && (plain || !r->tls_noverify);
	for (h = cfg ? cfg->headers : NULL; h && *h; h++) {
		struct curl_slist *l = curl_slist_append(r->headers, *h);

		if (!l)
			return -ENOMEM;
		r->headers = l;
	}
	err = load_resolve(r);
	if (!err && cfg && cfg->ca_files)
		err = load_ca(r);
	if (err)
		return err;
	r->share = curl_share_init();
	if (!r->share ||
	    curl_share_setopt(r->share, CURLSHOPT_LOCKFUNC, share_lock) ||
	    curl_share_setopt(r->share, CURLSHOPT_UNLOCKFUNC, share_unlock) ||
	    curl_share_setopt(r->share, CURLSHOPT_USERDATA, r) ||
	    curl_share_setopt(r->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_CONNECT) ||
	    curl_share_setopt(r->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS) ||
	    curl_share_setopt(r->share, CURLSHOPT_SHARE,
			      CURL_LOCK_DATA_SSL_SESSION))
		return -ENOMEM;
	return 0;
}

/*
 * The hosts of @ref's registry in @opts: its server (or NULL) and the
 * mirrors a pull tries before it, in order, into @mirrors (@nr).
 */
static int registry_hosts(const struct fetch_ref *ref,
			  const struct fetch_opts *opts, enum fetch_access access,
			  const struct fetch_host **server,
			  const struct fetch_host ***mirrors, size_t *nr)
{
	const struct fetch_host *const *p;
	size_t n = 0;
	int err;

	*server = NULL;
	*mirrors = NULL;
	*nr = 0;
	for (p = opts->hosts; p && *p; p++) {
		char why[800];

		err = fetch_check_host(*p, why, sizeof(why));
		if (err) {
			ferry_err("%s", why);
			return err;
		}
		n++;
	}
	if (n && !(*mirrors = calloc(n, sizeof(**mirrors))))
		return -ENOMEM;
	for (p = opts->hosts; p && *p; p++) {
		if (!same_registry((*p)->registry, ref->host))
			continue;
		if ((*p)->server && !*server)
			*server = *p;
		else if (!(*p)->server && access == FETCH_PULL)
			(*mirrors)[(*nr)++] = *p;
	}
	return 0;
}

int registry_open(const struct fetch_ref *ref, const struct fetch_opts *opts,
		  enum fetch_access access, struct registry **out)
{
	const struct fetch_host *server, **mirrors = NULL;
	struct registry *r;
	size_t nr, i;
	int err;

	*out = NULL;
	if (!ref->host || !ref->repo || !fetch_repo_valid(ref->repo, strlen(ref->repo)))
		return -EINVAL;
	err = http_global_init();
	if (!err)
		err = registry_hosts(ref, opts, access, &server, &mirrors, &nr);
	if (err)
		return err;
	r = calloc(1, sizeof(*r));
	if (!r) {
		free(mirrors);
		return -ENOMEM;
	}
	err = reg_init(r, ref, opts, access, server, false);
	if (!err && nr && !(r->mirrors = calloc(nr, sizeof(*r->mirrors))))
		err = -ENOMEM;
	for (i = 0; !err && i < nr; i++) {
		r->mirrors[i] = calloc(1, sizeof(**r->mirrors));
		if (!r->mirrors[i]) {
			err = -ENOMEM;
			break;
		}
		r->nr_mirrors++;
		err = reg_init(r->mirrors[i], ref, opts, access, mirrors[i], true);
	}
	free(mirrors);
	if (err) {
		if (err == -ENOMEM)
			ferry_err("%s: cannot set up the registry client: %s",
				  ref->host, ferry_strerror(err));
		registry_close(r);
		return err;
	}
	*out = r;
	return 0;
}

void registry_close(struct registry *r)
{
	size_t i;

	if (!r)
		return;
	for (i = 0; i < r->nr_mirrors; i++)
		registry_close(r->mirrors[i]);
	free(r->mirrors);
	for (i = 0; i < r->nr_pool; i++)
		curl_easy_cleanup(r->pool[i]);
	if (r->share)
		curl_share_cleanup(r->share);
	for (i = 0; i < REG_REDIRECTS_MAX; i++)
		free(r->redirects[i].url);
	auth_release(r);
	for (i = 0; i < CURL_LOCK_DATA_LAST; i++)
		pthread_mutex_destroy(&r->share_locks[i]);
	pthread_mutex_destroy(&r->lock);
	pthread_mutex_destroy(&r->auth_lock);
	curl_slist_free_all(r->resolve);
	curl_slist_free_all(r->headers);
	free(r->ca.data);
	free(r->ns);
	free(r->api);
	free(r->endpoint);
	free(r->host);
	free(r->repo);
	free(r->name);
	free(r);
}

const char *registry_name(const struct registry *r)
{
	return r->name;
}

void registry_get_stats(struct registry *r, struct fetch_stats *out)
{
	size_t i;

	out->requests = atomic_load(&r->st_requests);
	out->retries = atomic_load(&r->st_retries);
	out->bytes_down = atomic_load(&r->st_down);
	out->bytes_up = atomic_load(&r->st_up);
	for (i = 0; i < r->nr_mirrors; i++) {
		struct fetch_stats m;

		registry_get_stats(r->mirrors[i], &m);
		out->requests += m.requests;
		out->retries += m.retries;
		out->bytes_down += m.bytes_down;
		out->bytes_up += m.bytes_up;
	}
}

void fetch_buf_free(struct fetch_buf *b)
{
	if (!b)
		return;
	free(b->data);
	b->data = NULL;
	b->len = 0;
}

char *reg_url(struct registry *r, const char *base, const char *fmt, ...)
{
	char *tail = NULL, *url = NULL;
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vasprintf(&tail, fmt, ap);
	va_end(ap);
	if (n < 0)
		return NULL;
	if (asprintf(&url, "%s%s/%s%s%s%s", base, r->api, r->repo, tail,
		     !r->ns ? "" : strchr(tail, '?') ? "&" : "?",
		     r->ns ? r->ns : "") < 0)
		url = NULL;
	free(tail);
	return url;
}

/* ------------------------------------------------------------------ */
/* Mirror                                                              */
/* ------------------------------------------------------------------ */

bool reg_mirror_usable(struct registry *m, unsigned int caps)
{
	return (m->caps & caps) == caps &&
	       ferry_now_ns() >= atomic_load(&m->down_until_ns);
}

void reg_mirror_failed(struct registry *m, const char *what, const char *why,
		       bool unreachable)
{
	if (unreachable) {
		atomic_store(&m->down_until_ns,
			     ferry_now_ns() + REG_MIRROR_BACKOFF_NS);
		ferry_warn("%s: %s failed (%s); not asking it for %llu s", m->name,
			   what, why, REG_MIRROR_BACKOFF_NS / 1000000000ull);
	} else {
		ferry_dbg("%s: %s: %s; asking the next host", m->name, what, why);
	}
}

/* ------------------------------------------------------------------ */
/* Redirect cache                                                      */
/* ------------------------------------------------------------------ */

/* The entry of @digest, or NULL (under r->lock). */
static struct reg_redirect *redirect_find(struct registry *r,
					  const uint8_t *digest)
{
	size_t i;

	for (i = 0; i < REG_REDIRECTS_MAX; i++)
		if (r->redirects[i].url &&
		    !memcmp(r->redirects[i].digest, digest, FETCH_DIGEST_SIZE))
			return &r->redirects[i];
	return NULL;
}

char *reg_redirect_get(struct registry *r, const uint8_t *digest)
{
	struct reg_redirect *e;
	char *url = NULL;

	pthread_mutex_lock(&r->lock);
	e = redirect_find(r, digest);
	/* Signed URLs expire; re-resolve now and then anyway. */
	if (e && ferry_now_ns() - e->when_ns > REG_REDIRECT_TTL_NS) {
		free(e->url);
		e->url = NULL;
	} else if (e) {
		url = strdup(e->url);
	}
	pthread_mutex_unlock(&r->lock);
	return url;
}

void reg_redirect_put(struct registry *r, const uint8_t *digest,
		      const char *url)
{
	struct reg_redirect *slot;
	char *copy = strdup(url);
	size_t i;

	if (!copy)
		return;
	pthread_mutex_lock(&r->lock);
	slot = redirect_find(r, digest);
	if (!slot) {
		/* A free entry, else the oldest. */
		slot = &r->redirects[0];
		for (i = 1; i < REG_REDIRECTS_MAX && slot->url; i++)
			if (!r->redirects[i].url ||
			    r->redirects[i].when_ns < slot->when_ns)
				slot = &r->redirects[i];
	}
	free(slot->url);
	memcpy(slot->digest, digest, FETCH_DIGEST_SIZE);
	slot->url = copy;
	slot->when_ns = ferry_now_ns();
	pthread_mutex_unlock(&r->lock);
}

void reg_redirect_drop(struct registry *r, const uint8_t *digest)
{
	struct reg_redirect *e;

	pthread_mutex_lock(&r->lock);
	e = redirect_find(r, digest);
	if (e) {
		free(e->url);
		e->url = NULL;
	}
	pthread_mutex_unlock(&r->lock);
}

/* ------------------------------------------------------------------ */
/* Manifests                                                           */
/* ------------------------------------------------------------------ */

static bool generic_type(const char *t)
{
	return !*t || !strcmp(t, "application/json") ||
	       !strcmp(t, "text/plain") ||
	       !strcmp(t, "application/octet-stream") ||
	       !strcmp(t, "binary/octet-stream");
}

/*
 * The manifest's media type: Content-Type without parameters, checked
 * against the document's mediaType; the document decides (or its shape)
 * when the registry sends a generic type. -EIO with @why filled.
 */
static int manifest_type(const struct http_resp *resp, char *out, size_t cap,
			 char *why, size_t why_len)
{
	const char *ct = http_header(resp, "Content-Type"), *doc;
	struct json_object *root;
	char type[256];
	size_t n = 0;
	int err = 0;

	if (ct) {
		n = strcspn(ct, ";");
		while (n && (ct[n - 1] == ' ' || ct[n - 1] == '\t'))
			n--;
		if (n >= sizeof(type))
			n = 0;
		memcpy(type, ct, n);
	}
	type[n] = '\0';
	if (json_parse_object((const char *)resp->body, resp->body_len, &root)) {
		snprintf(why, why_len, "not a JSON object");
		return -EIO;
	}
	doc = json_get_string(root, "mediaType");
	if (doc && *doc && !generic_type(type) && strcasecmp(doc, type)) {
		snprintf(why, why_len, "Content-Type %.100s but the document says %.100s",
			 type, doc);
		err = -EIO;
	} else if (generic_type(type)) {
		if (doc && *doc)
			snprintf(type, sizeof(type), "%s", doc);
		else if (json_object_object_get_ex(root, "manifests", NULL))
			snprintf(type, sizeof(type), "%s", FETCH_OCI_INDEX);
		else
			snprintf(type, sizeof(type), "%s", FETCH_OCI_MANIFEST);
	}
	json_object_put(root);
	if (err)
		return err;
	if (strlen(type) >= cap) {
		snprintf(why, why_len, "media type too long");
		return -EIO;
	}
	memcpy(out, type, strlen(type) + 1);
	return 0;
}

/* A Docker-Content-Digest header, when the registry sends one, must be @digest. */
static int check_content_digest(const struct http_resp *resp,
				const uint8_t digest[FETCH_DIGEST_SIZE],
				const char *complaint, char *why, size_t why_len)
{
	const char *hdr = http_header(resp, "Docker-Content-Digest");
	uint8_t claimed[FETCH_DIGEST_SIZE];

	if (!hdr || strncmp(hdr, "sha256:", 7))
		return 0;
	if (!digest_parse(hdr, claimed) &&
	    !memcmp(claimed, digest, FETCH_DIGEST_SIZE))
		return 0;
	snprintf(why, why_len, "Docker-Content-Digest %.80s %s", hdr, complaint);
	return -EIO;
}

/*
 * GET manifest @reference from host @h (the registry, or a mirror: one
 * attempt, a 401 answered): 0 and the answer in @resp, its sha256 in
 * @digest (matching @want when by digest) and its type in @media_type;
 * 1 for an answer other than 200; else an error. What went wrong is in
 * @why, not logged.
 */
static int manifest_from(struct registry *h, const char *reference,
			 const uint8_t *want, const char *what,
			 struct http_resp *resp, char *media_type,
			 size_t media_type_len, uint8_t digest[FETCH_DIGEST_SIZE],
			 char *why, size_t why_len)
{
	struct curl_slist accept = { (char *)manifest_accept, NULL };
	struct http_req q = {
		.what = what,
		.method = "GET",
		.headers = &accept,
		.registry_auth = true,
		.scope = { .push = h->access == FETCH_PUSH },
		.follow = true,
		.once = h->mirror, /* the next host is the retry */
		.max_body = FETCH_MANIFEST_MAX,
	};
	char *url;
	int err;

	why[0] = '\0';
	err = auth_ping(h);
	if (err)
		return err;
	url = reg_url(h, h->base, "/manifests/%s", reference);
	if (!url)
		return -ENOMEM;
	q.url = url;
	err = http_do(h, &q, resp);
	free(url);
	if (err || resp->status != 200) {
		http_describe(resp, err, why, why_len);
		return err ? err : 1;
	}
	sha256_buf(resp->body, resp->body_len, digest);
	if (want && memcmp(digest, want, FETCH_DIGEST_SIZE)) {
		snprintf(why, why_len, "the bytes do not match the digest");
		return -EIO;
	}
	err = check_content_digest(resp, digest, "does not match the bytes", why,
				   why_len);
	if (!err)
		err = manifest_type(resp, media_type, media_type_len, why, why_len);
	return err;
}

int registry_get_manifest(struct registry *r, const char *reference,
			  struct fetch_buf *body, char *media_type,
			  size_t media_type_len,
			  uint8_t digest[FETCH_DIGEST_SIZE])
{
	struct http_resp resp = { 0 };
	uint8_t want[FETCH_DIGEST_SIZE];
	char what[300], why[320];
	bool by_digest = !digest_parse(reference, want);
	unsigned int need = by_digest ? FETCH_HOST_PULL : FETCH_HOST_RESOLVE;
	size_t i;
	int err = 0;

	memset(body, 0, sizeof(*body));
	if (!by_digest && !fetch_tag_valid(reference, strlen(reference))) {
		ferry_err("%s: invalid tag or digest \"%.200s\"", r->name,
			  reference);
		return -EINVAL;
	}
	snprintf(what, sizeof(what), "manifest %s", reference);
	for (i = 0; i < r->nr_mirrors; i++) {
		struct registry *m = r->mirrors[i];

		if (!reg_mirror_usable(m, need))
			continue;
		err = manifest_from(m, reference, by_digest ? want : NULL, what,
				    &resp, media_type, media_type_len, digest,
				    why, sizeof(why));
		if (!err)
			goto got;
		if (err == -ENOMEM || err == -ECANCELED)
			goto out;
		/* No answer at all: rest it; an answer concerns this object. */
		reg_mirror_failed(m, what, why, err < 0 && !resp.status);
	}
	err = manifest_from(r, reference, by_digest ? want : NULL, what, &resp,
			    media_type, media_type_len, digest, why, sizeof(why));
	if (err > 0 || (err && err != -ENOMEM && !resp.status && why[0]))
		err = http_fail(r, what, err > 0 ? 0 : err, &resp);
	else if (err && resp.status == 200)
		ferry_err("%s: %s: %s", r->name, what, why);
	if (err)
		goto out;
got:
	if (!resp.body) {
		/* An empty body still hands out a NUL-terminated buffer. */
		resp.body = calloc(1, 1);
		if (!resp.body) {
			err = -ENOMEM;
			goto out;
		}
	}
	body->data = resp.body;
	body->len = resp.body_len;
	resp.body = NULL;
	resp.body_cap = 0;
out:
	http_resp_free(&resp);
	return err;
}

int registry_put_manifest(struct registry *r, const char *reference,
			  const char *media_type, const void *data, size_t len)
{
	struct http_resp resp = { 0 };
	struct curl_slist ct = { 0 };
	uint8_t want[FETCH_DIGEST_SIZE], got[FETCH_DIGEST_SIZE];
	char what[300], why[200], *url = NULL, *ct_line = NULL;
	bool by_digest = !digest_parse(reference, want);
	int err;

	snprintf(what, sizeof(what), "upload of manifest %s", reference);
	if (!by_digest && !fetch_tag_valid(reference, strlen(reference))) {
		ferry_err("%s: invalid tag or digest \"%.200s\"", r->name,
			  reference);
		return -EINVAL;
	}
	if (len > FETCH_MANIFEST_MAX) {
		ferry_err("%s: %s: %zu bytes is over the %u byte limit", r->name,
			  what, len, FETCH_MANIFEST_MAX);
		return -EFBIG;
	}
	if (!media_type || !*media_type || strpbrk(media_type, "\r\n")) {
		ferry_err("%s: %s: invalid media type", r->name, what);
		return -EINVAL;
	}
	sha256_buf(data, len, got);
	if (by_digest && memcmp(want, got, FETCH_DIGEST_SIZE)) {
		ferry_err("%s: %s: the bytes do not match the digest", r->name,
			  what);
		return -EINVAL;
	}
	err = auth_ping(r);
	if (err)
		return err;
	if (asprintf(&ct_line, "Content-Type: %s", media_type) < 0)
		return -ENOMEM;
	ct.data = ct_line;
	url = reg_url(r, r->base, "/manifests/%s", reference);
	err = -ENOMEM;
	if (!url)
		goto out;
	{
		struct http_req q = {
			.what = what,
			.method = "PUT",
			.url = url,
			.headers = &ct,
			.registry_auth = true,
			.scope = { .push = true },
			.upload = true,
			.up_data = data,
			.up_len = len,
			.max_body = 64u << 10,
			.stop_at_max = true,
		};

		err = http_do(r, &q, &resp);
	}
	if (err || (resp.status != 201 && resp.status != 200 &&
		    resp.status != 202)) {
		err = http_fail(r, what, err, &resp);
		goto out;
	}
	err = check_content_digest(&resp, got,
				   "is not the digest of the bytes sent",
				   why, sizeof(why));
	if (err)
		ferry_err("%s: %s: %s", r->name, what, why);
out:
	free(url);
	free(ct_line);
	http_resp_free(&resp);
	return err;
}

/* ------------------------------------------------------------------ */
/* Tags                                                                */
/* ------------------------------------------------------------------ */

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

void fetch_free_tags(char **tags, size_t nr_tags)
{
	size_t i;

	for (i = 0; tags && i < nr_tags; i++)
		free(tags[i]);
	free(tags);
}

/* Append the "tags" of one page; -EIO when malformed. */
static int tags_page(struct registry *r, const struct http_resp *resp,
		     char ***tags, size_t *nr, size_t *cap)
{
	struct json_object *root, *arr;
	size_t i, n;
	int err = 0;

	if (json_parse_object((const char *)resp->body, resp->body_len, &root))
		return -EIO;
	if (!json_object_object_get_ex(root, "tags", &arr) ||
	    json_object_is_type(arr, json_type_null))
		goto out; /* a repository without tags says null */
	if (!json_object_is_type(arr, json_type_array)) {
		err = -EIO;
		goto out;
	}
	n = json_object_array_length(arr);
	for (i = 0; i < n; i++) {
		struct json_object *t = json_object_array_get_idx(arr, i);
		const char *s;

		if (!json_object_is_type(t, json_type_string)) {
			err = -EIO;
			goto out;
		}
		s = json_object_get_string(t);
		if (!fetch_tag_valid(s, strlen(s))) {
			ferry_warn("%s: ignoring invalid tag \"%.140s\"", r->name,
				   s);
			continue;
		}
		if (*nr >= TAGS_MAX) {
			err = -EFBIG;
			goto out;
		}
		err = array_reserve(tags, cap, *nr + 1, sizeof(**tags), 64);
		if (err)
			goto out;
		(*tags)[*nr] = strdup(s);
		if (!(*tags)[*nr]) {
			err = -ENOMEM;
			goto out;
		}
		(*nr)++;
	}
out:
	json_object_put(root);
	return err;
}

int registry_list_tags(struct registry *r, char ***tags_out, size_t *nr_out)
{
	struct http_resp resp = { 0 };
	char **tags = NULL, *url = NULL, *prev = NULL, next[8192];
	size_t nr = 0, cap = 0, w, i;
	unsigned int pages = 0;
	int err;

	*tags_out = NULL;
	*nr_out = 0;
	err = auth_ping(r);
	if (err)
		return err;
	url = TAGS_PAGE_N ? reg_url(r, r->base, "/tags/list?n=%u", TAGS_PAGE_N) :
			    reg_url(r, r->base, "/tags/list");
	if (!url)
		return -ENOMEM;
	for (;;) {
		struct http_req q = {
			.what = "tag list",
			.method = "GET",
			.url = url,
			.registry_auth = true,
			.scope = { .push = r->access == FETCH_PUSH },
			.follow = true,
			.max_body = TAGS_PAGE_MAX,
		};
		const char *link;
		int k;

		err = http_do(r, &q, &resp);
		if (err || resp.status != 200) {
			err = http_fail(r, q.what, err, &resp);
			goto out;
		}
		err = tags_page(r, &resp, &tags, &nr, &cap);
		if (err) {
			ferry_err("%s: tag list: %s", r->name,
				  err == -EIO ? "malformed answer" :
						ferry_strerror(err));
			goto out;
		}
		link = http_header(&resp, "Link");
		k = link ? fetch_parse_link_next(link, strlen(link), next,
						 sizeof(next)) :
			   0;
		if (k < 0) {
			ferry_err("%s: tag list: malformed Link header", r->name);
			err = -EIO;
			goto out;
		}
		if (!k)
			break;
		free(prev);
		prev = url;
		url = NULL;
		err = http_resolve(prev, next, &url);
		if (err) {
			ferry_err("%s: tag list: bad next page link", r->name);
			goto out;
		}
		/* A link to the same page again, or endless pages. */
		if (!strcmp(url, prev) || ++pages >= TAGS_PAGES_MAX) {
			ferry_err("%s: tag list: pagination does not end",
				  r->name);
			err = -EIO;
			goto out;
		}
		if (!http_same_origin(url, r->base)) {
			ferry_err("%s: tag list: next page on another host",
				  r->name);
			err = -EIO;
			goto out;
		}
	}
	qsort(tags, nr, sizeof(*tags), cmp_str);
	/* Pages may overlap at their edges. */
	for (i = w = 0; i < nr; i++) {
		if (w && !strcmp(tags[w - 1], tags[i]))
			free(tags[i]);
		else
			tags[w++] = tags[i];
	}
	*tags_out = tags;
	*nr_out = w;
	tags = NULL;
	nr = 0;
out:
	fetch_free_tags(tags, nr);
	free(url);
	free(prev);
	http_resp_free(&resp);
	return err;
}

/* ------------------------------------------------------------------ */
/* Blob existence                                                      */
/* ------------------------------------------------------------------ */

int registry_blob_exists(struct registry *r,
			 const uint8_t digest[FETCH_DIGEST_SIZE],
			 uint64_t *size)
{
	struct http_resp resp = { 0 };
	struct curl_slist range = { (char *)"Range: bytes=0-0", NULL };
	struct curl_slist ident = { (char *)"Accept-Encoding: identity", NULL };
	char d[80], what[120], *url = NULL;
	struct fetch_content_range cr;
	/* HEAD without following: a 3xx answer also means present. */
	struct http_req q = {
		.what = what,
		.method = "HEAD",
		.registry_auth = true,
		.scope = { .push = r->access == FETCH_PUSH },
	};
	const char *hdr;
	int err;

	digest_format(digest, d);
	snprintf(what, sizeof(what), "blob %s", d);
	err = auth_ping(r);
	if (err)
		return err;
	url = reg_url(r, r->base, "/blobs/%s", d);
	if (!url)
		return -ENOMEM;
	q.url = url;
	err = http_do(r, &q, &resp);
	if (!err && resp.status == 200 && resp.content_length >= 0) {
		*size = (uint64_t)resp.content_length;
		err = 1;
		goto out;
	}
	if (err || (resp.status != 200 && resp.status != 404 &&
		    (resp.status < 300 || resp.status > 399))) {
		err = http_fail(r, what, err, &resp);
		goto out;
	}
	if (resp.status == 404)
		goto out;
	/* Present but no length (or redirected): ask for one byte and read
	 * the total from Content-Range. */
	range.next = &ident;
	q.method = "GET";
	q.headers = &range;
	q.follow = true;
	q.max_body = 1;
	q.stop_at_max = true;
	err = http_do(r, &q, &resp);
	if (err) {
		http_log_failure(r, what, err, &resp);
		goto out;
	}
	if (resp.status == 404)
		goto out;
	hdr = http_header(&resp, "Content-Range");
	if (resp.status == 206 && hdr &&
	    !fetch_parse_content_range(hdr, strlen(hdr), &cr) &&
	    cr.total != FETCH_RANGE_UNKNOWN) {
		*size = cr.total;
		err = 1;
	} else if (resp.status == 200 && resp.content_length >= 0) {
		*size = (uint64_t)resp.content_length;
		err = 1;
	} else if (resp.status == 416 && hdr &&
		   !fetch_parse_content_range(hdr, strlen(hdr), &cr) &&
		   cr.total == 0) {
		*size = 0; /* the empty blob */
		err = 1;
	} else if (resp.status >= 200 && resp.status < 300) {
		ferry_err("%s: %s: present but its size is not given", r->name,
			  what);
		err = -EPROTO;
	} else {
		err = http_status_error(r, what, &resp);
	}
out:
	free(url);
	http_resp_free(&resp);
	return err;
}

/* ------------------------------------------------------------------ */
/* Referrers (OCI distribution 1.1)                                    */
/* ------------------------------------------------------------------ */

int registry_get_referrers(struct registry *r, const uint8_t digest[FETCH_DIGEST_SIZE],
			   const char *artifact_type, struct fetch_buf *body)
{
	struct curl_slist accept = { (char *)"Accept: " FETCH_OCI_INDEX, NULL };
	struct http_resp resp = { 0 };
	char what[128], hex[2 * FETCH_DIGEST_SIZE + 1], *url = NULL, *esc = NULL;
	CURL *h;
	int err;

	memset(body, 0, sizeof(*body));
	hex_encode(digest, FETCH_DIGEST_SIZE, hex);
	snprintf(what, sizeof(what), "referrers of sha256:%.12s", hex);
	err = auth_ping(r);
	if (err)
		return err;
	h = http_get_handle(r);
	esc = h ? curl_easy_escape(h, artifact_type, 0) : NULL;
	if (h)
		http_put_handle(r, h);
	if (!esc)
		return -ENOMEM;
	url = reg_url(r, r->base, "/referrers/sha256:%s?artifactType=%s", hex, esc);
	curl_free(esc);
	if (!url)
		return -ENOMEM;
	{
		struct http_req q = {
			.what = what,
			.method = "GET",
			.url = url,
			.headers = &accept,
			.registry_auth = true,
			.scope = { .push = r->access == FETCH_PUSH },
			.follow = true,
			.max_body = FETCH_MANIFEST_MAX,
		};

		err = http_do(r, &q, &resp);
	}
	/* Registries without the API answer 404 (or 400/405 for the path). */
	if (!err && (resp.status == 404 || resp.status == 400 || resp.status == 405)) {
		err = 1;
		goto out;
	}
	if (err || resp.status != 200) {
		err = http_fail(r, what, err, &resp);
		goto out;
	}
	body->data = resp.body ? resp.body : calloc(1, 1);
	body->len = resp.body_len;
	resp.body = NULL;
	if (!body->data)
		err = -ENOMEM;
out:
	free(url);
	http_resp_free(&resp);
	return err;
}
