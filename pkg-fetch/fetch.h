/* SPDX-License-Identifier: MIT */
/*
 * pkg-fetch: an OCI distribution client over libcurl — references,
 * authentication (Basic, Bearer token, docker config files and credential
 * helpers), manifests, whole / ranged / streamed blob reads, uploads and
 * tag listing, with timeouts, retries and connection reuse.
 *
 * Knows nothing of ferry's formats: callers hand it digests and bytes.
 *
 * Errors: 0 (or a documented positive value) or a negative errno, each
 * with a log line naming the registry, repository and object:
 *   -ENOENT     the manifest, tag or blob does not exist (404)
 *   -EACCES     authentication failed or was refused (401/403)
 *   -EIO        bytes did not match their digest, or a malformed answer
 *   -ETIMEDOUT  a request (with its retries) ran out of time
 *   -ECANCELED  the caller cancelled it (fetch_opts.cancel)
 *   -ECONNREFUSED / -EHOSTUNREACH  the registry cannot be reached
 *   -ERANGE     a range outside the blob (416)
 *   -EPROTO     any other unexpected status or answer
 * Secrets (passwords, tokens, Authorization headers) are never logged.
 *
 * Thread-safety: a struct registry may be used from several threads at
 * once; its connection pool, token cache and redirect cache are locked
 * inside. A struct fetch_stream belongs to one thread.
 */
#ifndef FERRY_FETCH_H
#define FERRY_FETCH_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define FETCH_DIGEST_SIZE 32u        /* sha256 */
#define FETCH_MANIFEST_MAX (4u << 20) /* larger manifests are refused */

/* Media types this client asks for and understands. */
#define FETCH_OCI_MANIFEST "application/vnd.oci.image.manifest.v1+json"
#define FETCH_OCI_INDEX "application/vnd.oci.image.index.v1+json"
#define FETCH_DOCKER_MANIFEST "application/vnd.docker.distribution.manifest.v2+json"
#define FETCH_DOCKER_LIST "application/vnd.docker.distribution.manifest.list.v2+json"

/* ------------------------------------------------------------------ */
/* References                                                          */
/* ------------------------------------------------------------------ */

/*
 * "[HOST[:PORT]/]REPO[:TAG|@sha256:HEX]" (the part after "docker://"),
 * normalised as Docker and containerd normalise image names: a first
 * component with no '.' or ':' that is not "localhost" is part of a
 * Docker Hub repository ("docker.io"; "index.docker.io" is the Hub too);
 * a one-component Hub repository is "library/NAME"; neither tag nor
 * digest means the tag "latest". REPO is lower-case path components
 * [a-z0-9._-/]; TAG is [A-Za-z0-9_][A-Za-z0-9._-]{0,127}; with both a tag
 * and a digest, the digest is the reference.
 */
#define FETCH_HUB "docker.io"               /* Docker Hub's name */
#define FETCH_HUB_OLD "index.docker.io"     /* ... its old name */
#define FETCH_HUB_ENDPOINT "registry-1.docker.io" /* ... and where it answers */
struct fetch_ref {
	char *host;   /* "host[:port]" as written, or "docker.io" */
	char *repo;   /* "library/debian" */
	char *tag;    /* "latest" when none is given; NULL with a digest */
	char *digest; /* "sha256:<hex>" or NULL */
};

/* -EINVAL with a message naming @s and the offending part. */
int fetch_parse_ref(const char *s, struct fetch_ref *out);
void fetch_ref_free(struct fetch_ref *ref);
/* "HOST/REPO:TAG" or "HOST/REPO@DIGEST" (malloc'ed; NULL: no memory):
 * the normalised name, for messages and as the key of what was pulled. */
char *fetch_ref_string(const struct fetch_ref *ref);
/* Digest strings: digest_parse / digest_format in pkg-base/base.h. */

/* ------------------------------------------------------------------ */
/* Client options                                                      */
/* ------------------------------------------------------------------ */

struct fetch_opts {
	/* "USER:PASS" for every registry, or NULL. */
	const char *creds;
	/* A docker config.json; NULL: $REGISTRY_AUTH_FILE, then
	 * $DOCKER_CONFIG/config.json or ~/.docker/config.json. */
	const char *authfile;
	/* Verify TLS certificates (default true). When false, https is
	 * tried without verification and plain http is used if the TLS
	 * handshake fails — for anonymous requests only: credentials and
	 * tokens never travel over plain http to a host that is neither
	 * loopback nor listed in @insecure (such a request fails with
	 * -EACCES, saying so). */
	bool tls_verify;
	const char *ca_file;   /* CA bundle (PEM) replacing libcurl's, or NULL */
	/* NULL-terminated "host[:port]" list spoken to over plain http.
	 * Loopback hosts (localhost, 127.0.0.0/8, [::1]) always are. A
	 * registry that answers plain http with a 400 asking for https
	 * fails (-EPROTO, saying so); https is not tried instead. These
	 * hosts are also the only ones (with loopback) that get
	 * credentials or tokens over plain http, token servers included:
	 * an https registry whose Bearer realm is a plain http URL on
	 * another host is refused (-EACCES). */
	const char *const *insecure;
	/* NULL-terminated list of the hosts that serve registries besides
	 * (or instead of) their own endpoints: mirrors, pull-through caches,
	 * P2P distributors (struct fetch_host). Checked by registry_open. */
	const struct fetch_host *const *hosts;
	/* NULL-terminated "HOST:PORT:ADDRESS" list (like curl --resolve):
	 * connections to HOST:PORT — the registry, its token server, blob
	 * redirects — go to ADDRESS (IPv4, or IPv6 in brackets; several
	 * comma-separated ones are tried in turn), while the URL, the Host
	 * header, TLS server name and certificate verification still use
	 * HOST. Checked by registry_open (see fetch_check_resolve). */
	const char *const *resolve;
	unsigned int connect_timeout_ms; /* 0 = 10 s */
	/* A request fails when no byte moved for this long (0 = 30 s). */
	unsigned int stall_timeout_ms;
	/* The deadline of one request, every attempt and backoff included
	 * (0 = 60 s), plus 1 s per MiB it moves (FETCH_DEADLINE_RATE): a
	 * registry that trickles bytes cannot hold a reader for ever. A
	 * streamed whole blob (registry_open_stream), read at its caller's
	 * pace, and a blob upload have none; the stall timeout still
	 * applies. -ETIMEDOUT. */
	unsigned int request_timeout_ms;
	/* While *@cancel is true, requests in flight end within about a
	 * second and new ones fail at once, with -ECANCELED (no retry);
	 * NULL: never. Set by another thread, e.g. to unmount. */
	const _Atomic bool *cancel;
	/* Attempts per request on 429 / 5xx / connection errors / short
	 * bodies (0 = 5), with exponential backoff (base 200 ms, cap 10 s)
	 * and full jitter; Retry-After is honoured up to 60 s. */
	unsigned int retries;
	const char *user_agent; /* NULL = "ferry/<version>" */
};

#define FETCH_DEADLINE_RATE (1u << 20) /* bytes/s a deadline allows for */

/*
 * A host that serves a registry, as containerd's hosts.toml describes one
 * (a [host."URL"] table, or the file's "server"). A registry's hosts are
 * tried in the order given, then its own endpoint ("https://NAME", or
 * https://registry-1.docker.io for the Hub) unless a host is its @server.
 * A host serves only what its capabilities allow: tags (manifests by tag)
 * with FETCH_HOST_RESOLVE, blobs and manifests by digest with
 * FETCH_HOST_PULL; pushes go to the registry's endpoint (or @server)
 * only. A host that fails (unreachable, an error status, wrong bytes,
 * a connection dropped mid-blob) hands the request to the next one, from
 * the byte it had reached; an unreachable one rests for 30 s. Requests
 * to a host other than the registry's endpoint carry "?ns=REGISTRY" (as
 * containerd's do: pull-through caches use it to pick the upstream).
 * Credentials: a mirror gets those the docker config (or a credential
 * helper) has for its own host[:port], never fetch_opts.creds, which go
 * to the registry's endpoint or @server.
 */
#define FETCH_HOST_PULL 1u
#define FETCH_HOST_RESOLVE 2u
#define FETCH_HOST_PUSH 4u
#define FETCH_HOST_ALL (FETCH_HOST_PULL | FETCH_HOST_RESOLVE | FETCH_HOST_PUSH)
#define FETCH_HOST_CA_MAX 8u       /* CA files per host */
#define FETCH_HOST_HEADERS_MAX 32u /* extra headers per host */
#define FETCH_HOST_URL_MAX 1024u
struct fetch_host {
	const char *registry;      /* the registry it serves: "docker.io", "h:5000" */
	/* "https://HOST[:PORT][/PATH]" or "http://…": the API root is PATH +
	 * "/v2" (PATH as given with @override_path), as containerd says. */
	const char *url;
	unsigned int capabilities; /* FETCH_HOST_*; 0 = all */
	bool server;               /* the registry's own endpoint, tried last */
	bool skip_verify;          /* https without certificate verification */
	bool override_path;
	/* PEM CA files trusted for this host besides the system's
	 * (NULL-terminated, at most FETCH_HOST_CA_MAX); NULL: fetch_opts.ca_file. */
	const char *const *ca_files;
	const char *client_cert;   /* PEM client certificate (and key), or NULL */
	const char *client_key;    /* its key when in a file of its own, or NULL */
	/* "Name: value" headers sent to this host (NULL-terminated). */
	const char *const *headers;
};

/*
 * @h is well-formed: a registry "host[:port]", an http(s) URL of a host
 * with an optional path (no query, no credentials), known capabilities,
 * absolute file paths, headers "Name: value" without control characters.
 * -EINVAL with a message naming the host and what is wrong in @why.
 */
int fetch_check_host(const struct fetch_host *h, char *why, size_t why_len);
/* "pull", "resolve", "push": the FETCH_HOST_* bit, or 0. */
unsigned int fetch_host_capability(const char *name);

/*
 * Credentials kept out of argv, which every local user can read in
 * /proc/PID/cmdline: "USER:PASS" for fetch_opts.creds into @out, read
 * from the file @path (one line, a trailing newline dropped; a file that
 * group or others may access is refused, -EACCES, saying to chmod 600
 * it), or @user's password read from @fd until EOF (docker login
 * --password-stdin). 0, or -errno after a message that never shows the
 * secret (-EBADMSG: not a regular file of one line USER:PASS).
 */
#define FETCH_CREDS_MAX 4096u /* longest "USER:PASS" */
int fetch_creds_file(const char *path, char out[FETCH_CREDS_MAX + 1]);
int fetch_creds_password(int fd, const char *user, char out[FETCH_CREDS_MAX + 1]);
/*
 * The credentials a command line gave, one way at most: @creds
 * "USER:PASS" (or "USER" with @password_stdin), a @file, or @user with
 * @password_stdin (read from stdin). 0 and *@out: @creds, @buf (filled),
 * or NULL when none was given; -EINVAL after a message for another
 * combination; the errors above otherwise (never -EINVAL).
 */
int fetch_creds_from_options(const char *creds, const char *file, const char *user,
			     bool password_stdin, char buf[FETCH_CREDS_MAX + 1],
			     const char **out);

/* Defaults as documented above (tls_verify true). */
void fetch_opts_init(struct fetch_opts *opts);

/*
 * The docker config file the client reads for @opts (malloc'ed), or NULL
 * when none applies: opts->authfile or $REGISTRY_AUTH_FILE (then
 * *@explicit_path: a missing file is an error), else
 * $DOCKER_CONFIG/config.json or ~/.docker/config.json (which may not
 * exist: then there are no credentials).
 */
char *fetch_authfile_path(const struct fetch_opts *opts, bool *explicit_path);

/*
 * One resolve entry "HOST:PORT:ADDRESS[,ADDRESS...]": HOST a DNS name,
 * PORT 1..65535, each ADDRESS an IPv4 literal or a bracketed IPv6 one.
 * -EINVAL with a message naming the entry and what is wrong.
 */
int fetch_check_resolve(const char *entry);

/* ------------------------------------------------------------------ */
/* Registry client                                                     */
/* ------------------------------------------------------------------ */

struct registry;

enum fetch_access {
	FETCH_PULL = 1,
	FETCH_PUSH = 2, /* pull and push */
};

/*
 * A client for one repository of one registry. Does no I/O yet: the
 * first request negotiates authentication (anonymous Bearer tokens
 * included), after a /v2/ ping for pushes and for https without
 * verification (which may fall back to plain http). @opts and its
 * strings must outlive the client.
 * HTTP(S) proxies come from the usual environment variables
 * (https_proxy, http_proxy, no_proxy), as libcurl reads them.
 */
int registry_open(const struct fetch_ref *ref, const struct fetch_opts *opts,
		  enum fetch_access access, struct registry **out);
void registry_close(struct registry *r);
/* "host/repo", for messages. */
const char *registry_name(const struct registry *r);

struct fetch_buf {
	uint8_t *data; /* malloc'ed; NUL-terminated for convenience */
	size_t len;
};
void fetch_buf_free(struct fetch_buf *b);

/*
 * GET a manifest or index by tag or "sha256:…" digest with the full
 * Accept list. Fills @media_type (Content-Type, or the document's
 * mediaType field when the registry sends a generic type) and the sha256
 * of the bytes in @digest; a digest reference must match (-EIO).
 */
int registry_get_manifest(struct registry *r, const char *reference,
			  struct fetch_buf *body, char *media_type,
			  size_t media_type_len,
			  uint8_t digest[FETCH_DIGEST_SIZE]);

/* PUT a manifest under @reference (a tag, or its own digest). */
int registry_put_manifest(struct registry *r, const char *reference,
			  const char *media_type, const void *data, size_t len);

/*
 * The referrers of manifest @digest whose artifactType is @artifact_type
 * (OCI distribution 1.1 referrers API): 0 and the image index listing
 * them in @body (not checked: untrusted), 1 when the registry has no
 * referrers API (it answers 404, 400 or 405; the caller falls back to the
 * referrers tag schema, a tag "sha256-<hex>"), or -errno.
 */
int registry_get_referrers(struct registry *r, const uint8_t digest[FETCH_DIGEST_SIZE],
			   const char *artifact_type, struct fetch_buf *body);

/* Every tag (following Link pagination), malloc'ed, sorted. */
int registry_list_tags(struct registry *r, char ***tags, size_t *nr_tags);
void fetch_free_tags(char **tags, size_t nr_tags);

/* HEAD a blob: 1 and its size when present, 0 when absent. */
int registry_blob_exists(struct registry *r,
			 const uint8_t digest[FETCH_DIGEST_SIZE],
			 uint64_t *size);

/*
 * Read a whole blob of @size bytes into memory (at most @max bytes, else
 * -EFBIG), verifying its digest.
 */
int registry_get_blob(struct registry *r,
		      const uint8_t digest[FETCH_DIGEST_SIZE], uint64_t size,
		      size_t max, struct fetch_buf *out);

/*
 * Read exactly @len bytes at @off of a blob into @buf: one Range request
 * (a 206 answer; a 200 answer that ignores Range is read up to the range
 * and the rest discarded; 416 is -ERANGE). The caller verifies the bytes
 * (a partial read cannot be checked against the blob digest). Redirects
 * are followed; a cached redirect that answers 401/403 is resolved again.
 */
int registry_get_range(struct registry *r,
		       const uint8_t digest[FETCH_DIGEST_SIZE], uint64_t off,
		       uint64_t len, void *buf);

/*
 * Stream a blob of @size bytes from the start: fetch_stream_read returns
 * the next bytes (> 0), 0 at the end — only after the whole blob matched
 * @digest and @size, -EIO otherwise — or a negative errno. A dropped
 * connection is resumed with a Range request at the current offset.
 * Nothing is staged on disk; memory stays bounded (libcurl's buffer).
 */
struct fetch_stream;
int registry_open_stream(struct registry *r,
			 const uint8_t digest[FETCH_DIGEST_SIZE], uint64_t size,
			 struct fetch_stream **out);
ssize_t fetch_stream_read(struct fetch_stream *s, void *buf, size_t len);
void fetch_stream_close(struct fetch_stream *s);

/*
 * Upload the blob in file @fd (@size bytes from offset 0, with digest
 * @digest) unless the registry has it: HEAD first, then a monolithic
 * POST + PUT up to FETCH_MONOLITHIC_MAX bytes, else chunked PATCH uploads
 * of FETCH_UPLOAD_CHUNK bytes. @mount_from (a repository of the same
 * registry, or NULL) is tried first as a cross-repository mount.
 * Returns 1 when the blob was already there or mounted, 0 when uploaded.
 */
#define FETCH_MONOLITHIC_MAX (32u << 20)
#define FETCH_UPLOAD_CHUNK (16u << 20)
int registry_put_blob_fd(struct registry *r, int fd, uint64_t size,
			 const uint8_t digest[FETCH_DIGEST_SIZE],
			 const char *mount_from);

/* Bytes moved by this client so far (bodies only), for statistics. */
struct fetch_stats {
	uint64_t requests, retries, bytes_down, bytes_up;
};
void registry_get_stats(struct registry *r, struct fetch_stats *out);

#endif
