// SPDX-License-Identifier: MIT
/*
 * Blob uploads (distribution spec "Pushing blobs"): HEAD first; an
 * optional cross-repository mount (201 = mounted, 202 = an ordinary
 * upload session to use); then a monolithic POST + PUT, or POST, PATCH
 * chunks (Content-Range inclusive, each answer naming the next Location)
 * and a closing PUT with the digest. Locations are kept as given (they
 * carry session state), resolved against the registry when relative, and
 * get the registry's credentials only when they stay on its origin.
 *
 * Requests go through http_do (a 401 is answered there; the POST, which
 * only opens a session, is retried there too). A session cannot be
 * retried request by request (a PATCH may have been half applied), so
 * PATCH and PUT are sent once and a retriable failure restarts the whole
 * upload with a new session (a struct http_try of its own) after checking
 * that the blob did not land anyway. Such a failure is only a warning
 * (the retry says why) until the last attempt.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "../pkg-base/base.h"
#include "internal.h"

#define CHUNK_MAX (1ull << 30)

struct up_src {
	int fd;
	uint64_t size;
};

struct up_ctx {
	struct registry *r;
	const struct up_src *src;
	char dstr[80];
	char what[120];
	struct reg_scope scope;
	struct http_resp resp;
	bool retry; /* the last failure is worth a new session */
	bool last;  /* ... but this is the last attempt */
	int xerr;   /* the transport error of the failure (0: a status) */
	char why[200]; /* what failed, when the response does not say */
	uint64_t chunk;
};

/* The request failed with @err, or answered an unexpected status. */
static int up_fail(struct up_ctx *u, int err)
{
	u->retry = http_judge(err, &u->resp, false) == HTTP_RETRY;
	u->xerr = err;
	if (u->retry && !u->last)
		/* Not an error yet: the retry warns (5xx are -EPROTO). */
		return err ? err : -EPROTO;
	return http_fail(u->r, u->what, err, &u->resp);
}

/* The Location of an answer to a request sent to @req_url. */
static int up_location(struct up_ctx *u, const char *req_url, char **loc)
{
	const char *l = http_header(&u->resp, "Location");

	if (!l || http_resolve(req_url, l, loc)) {
		ferry_err("%s: %s: missing or invalid upload Location",
			  u->r->name, u->what);
		return -EPROTO;
	}
	return 0;
}

/* POST: a session in *@loc, or *@mounted. */
static int up_post(struct up_ctx *u, const char *mount_from, char **loc,
		   bool *mounted)
{
	struct registry *r = u->r;
	struct http_req q = {
		.what = u->what,
		.method = "POST",
		.registry_auth = true,
		.scope = u->scope,
		.max_body = 64u << 10,
		.stop_at_max = true,
	};
	const char *min;
	char *url, *esc = NULL;
	int err;

	*loc = NULL;
	*mounted = false;
	q.scope.mount_from = mount_from;
	if (mount_from) {
		esc = http_escape(mount_from);
		url = esc ? reg_url(r, r->base, "/blobs/uploads/?mount=%s&from=%s",
				    u->dstr, esc) :
			    NULL;
	} else {
		url = reg_url(r, r->base, "/blobs/uploads/");
	}
	free(esc);
	if (!url)
		return -ENOMEM;
	q.url = url;
	err = http_do(r, &q, &u->resp);
	if (err || (u->resp.status != 201 && u->resp.status != 202)) {
		err = up_fail(u, err);
		goto out;
	}
	if (u->resp.status == 201) {
		if (mount_from) {
			*mounted = true;
			goto out;
		}
		/* 201 to a plain POST is not a session. */
		err = up_fail(u, 0);
		goto out;
	}
	err = up_location(u, url, loc);
	if (err)
		goto out;
	/* A registry may want larger chunks than ours. */
	min = http_header(&u->resp, "OCI-Chunk-Min-Length");
	if (min) {
		uint64_t v;

		if (!parse_size(min, &v) && v > u->chunk && v <= CHUNK_MAX)
			u->chunk = v;
	}
out:
	free(url);
	return err;
}

/* Check Docker-Content-Digest on the final answer, when present. */
static int up_check_digest(struct up_ctx *u)
{
	const char *h = http_header(&u->resp, "Docker-Content-Digest");

	if (h && strcmp(h, u->dstr)) {
		ferry_err("%s: %s: the registry stored %.80s", u->r->name,
			  u->what, h);
		return -EIO;
	}
	return 0;
}

/* PATCH or PUT @len bytes at @off of the source to @url. */
static int up_send(struct up_ctx *u, const char *method, const char *url,
		   uint64_t off, uint64_t len,
		   const struct curl_slist *headers)
{
	struct registry *r = u->r;
	struct http_req q = {
		.what = u->what,
		.method = method,
		.url = url,
		.headers = headers,
		/* Credentials only for the registry's own origin. */
		.registry_auth = http_same_origin(url, r->base),
		.scope = u->scope,
		.once = true,
		.no_deadline = true,
		.upload = true,
		.up_fd = u->src->fd,
		.up_off = off,
		.up_len = len,
		.max_body = 64u << 10,
		.stop_at_max = true,
	};

	return http_do(r, &q, &u->resp);
}

/* Close the session at @loc with PUT ?digest= and the last @len bytes. */
static int up_put(struct up_ctx *u, const char *loc, uint64_t off,
		  uint64_t len)
{
	struct curl_slist ct = {
		(char *)"Content-Type: application/octet-stream", NULL
	};
	char *url = NULL;
	int err;

	if (asprintf(&url, "%s%cdigest=%s", loc, strchr(loc, '?') ? '&' : '?',
		     u->dstr) < 0)
		return -ENOMEM;
	err = up_send(u, "PUT", url, off, len, &ct);
	free(url);
	if (err || u->resp.status != 201)
		return up_fail(u, err);
	return up_check_digest(u);
}

/* PATCH every chunk, following the Location of each answer. */
static int up_chunks(struct up_ctx *u, char **loc)
{
	uint64_t off = 0, size = u->src->size;
	int err;

	while (off < size) {
		uint64_t len = MIN(u->chunk, size - off), last;
		char range[80];
		struct curl_slist ct = {
			(char *)"Content-Type: application/octet-stream", NULL
		};
		struct curl_slist cr = { range, &ct };
		const char *rh;
		char *next = NULL;

		snprintf(range, sizeof(range),
			 "Content-Range: %" PRIu64 "-%" PRIu64, off,
			 off + len - 1);
		err = up_send(u, "PATCH", *loc, off, len, &cr);
		if (err || u->resp.status != 202)
			return up_fail(u, err);
		rh = http_header(&u->resp, "Range");
		if (rh && (fetch_parse_upload_range(rh, strlen(rh), &last) ||
			   last != off + len - 1)) {
			snprintf(u->why, sizeof(u->why),
				 "the registry holds \"%.40s\" after a chunk "
				 "ending at %" PRIu64, rh, off + len - 1);
			if (u->last)
				ferry_err("%s: %s: %s", u->r->name, u->what,
					  u->why);
			u->retry = true;
			return -EPROTO;
		}
		err = up_location(u, *loc, &next);
		if (err)
			return err;
		free(*loc);
		*loc = next;
		off += len;
	}
	return up_put(u, *loc, size, 0);
}

static int put_blob(struct registry *r, const struct up_src *src,
		    const uint8_t digest[FETCH_DIGEST_SIZE],
		    const char *mount_from)
{
	struct up_ctx u = { .r = r, .src = src, .chunk = FETCH_UPLOAD_CHUNK };
	struct http_try t = { .r = r, .what = u.what };
	uint64_t have;
	int err;

	u.scope.push = true;
	digest_format(digest, u.dstr);
	snprintf(u.what, sizeof(u.what), "upload of blob %s", u.dstr);
	if (mount_from && (!fetch_repo_valid(mount_from, strlen(mount_from)) ||
			   !strcmp(mount_from, r->repo)))
		mount_from = NULL;
	err = registry_blob_exists(r, digest, &have);
	if (err)
		return err < 0 ? err : 1;
	for (;;) {
		bool mounted = false;
		char *loc = NULL;

		u.retry = false;
		u.last = http_try_last(&t);
		u.xerr = 0;
		u.why[0] = '\0';
		err = up_post(&u, t.attempt ? NULL : mount_from, &loc, &mounted);
		if (!err && mounted) {
			ferry_dbg("%s: blob %s mounted from %s", r->name, u.dstr,
				  mount_from);
			err = 1;
			break;
		}
		if (!err) {
			if (src->size <= FETCH_MONOLITHIC_MAX)
				err = up_put(&u, loc, 0, src->size);
			else
				err = up_chunks(&u, &loc);
		}
		free(loc);
		if (!err || !u.retry || u.last)
			break;
		/* The failure may have hidden a completed upload. */
		if (registry_blob_exists(r, digest, &have) == 1) {
			err = 0;
			break;
		}
		http_try_backoff(&t, u.xerr, &u.resp, u.why[0] ? u.why : NULL);
	}
	http_resp_free(&u.resp);
	return err;
}

int registry_put_blob_fd(struct registry *r, int fd, uint64_t size,
			 const uint8_t digest[FETCH_DIGEST_SIZE],
			 const char *mount_from)
{
	struct up_src src = { .fd = fd, .size = size };

	return put_blob(r, &src, digest, mount_from);
}
