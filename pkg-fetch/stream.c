// SPDX-License-Identifier: MIT
/*
 * Blob reads. One engine serves streams, whole-blob reads and ranges: a
 * pull-style reader that drives a curl multi handle only while the
 * caller wants bytes. The write callback copies the wanted part of the
 * body into a bounded buffer and pauses the transfer when it is full, so
 * memory stays bounded without threads.
 *
 * Sources, in order: each mirror that may serve blobs (fetch_host), then
 * the registry; of each host, first the cached redirect target of the
 * blob, then the host itself. A failing cached URL or mirror falls
 * through to the next source at once, from the byte reached (a cached
 * signed URL that answers 401/403 has expired; a mirror gets one attempt,
 * its 401 answered). The registry gets authentication and retries
 * through the shared request path (struct http_try); a transfer that
 * ends early resumes with a Range request at the current offset, counted
 * as a retry (the retry budget restarts whenever a transfer moved
 * STREAM_PROGRESS_RESET bytes).
 *
 * Every answer is checked against what was asked: a 206 must carry a
 * Content-Range starting at the requested offset (and the expected total);
 * a 200 that ignores Range is skipped up to the offset and cut after the
 * range; a whole blob must match its size and sha256.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

#include "../pkg-base/base.h"
#include "internal.h"

#define STREAM_BUF (256u << 10)
#define STREAM_BUF_MAX (4u << 20)
#define POLL_MS 1000
#define SETTLE_NS (500ull * 1000000ull)
/* Bytes a dropped connection must have moved to earn a fresh set of retries. */
#define STREAM_PROGRESS_RESET (1u << 20)

enum stream_src {
	SRC_CACHED,
	SRC_HOST,
};

struct fetch_stream {
	struct registry *r;
	struct registry *h;  /* the host asked now: r, or one of r->mirrors */
	size_t next_mirror;  /* r->mirrors not yet tried start here */
	uint8_t digest[FETCH_DIGEST_SIZE];
	char dstr[80];
	char what[160];
	uint64_t size; /* of the blob, or FETCH_RANGE_UNKNOWN */
	uint64_t off, len; /* the wanted bytes */
	bool verify;
	struct sha256_hasher *hasher;
	uint64_t pos;    /* wanted bytes received so far */
	uint64_t handed; /* ... and handed to the caller */
	uint8_t *buf;
	size_t cap, head, tail;

	/* The current transfer. */
	CURL *easy;
	CURLM *multi;
	struct http_req q;
	struct http_xfer x;
	struct http_resp resp;
	struct curl_slist h_ident, h_range;
	char range[80];
	char *url;
	enum stream_src src;
	bool active, paused, checked;
	uint64_t xfer_start; /* blob offset this transfer asked for */
	uint64_t skip;       /* body bytes before xfer_start (a 200) */
	uint64_t xfer_got;
	char why[160];       /* what the checks of the answer refused */

	uint64_t pump_exit_ns; /* when the reader last got control back */
	struct reg_scope scope;
	struct http_try t;   /* the attempts of h */
	bool cache_failed, eof_checked;
	int err; /* sticky */
};

/* ------------------------------------------------------------------ */
/* The write side                                                      */
/* ------------------------------------------------------------------ */

static int check_fail(struct fetch_stream *s, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int check_fail(struct fetch_stream *s, int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(s->why, sizeof(s->why), fmt, ap);
	va_end(ap);
	return err;
}

/* Validate the status line and range headers before the first byte. */
static int stream_check(struct fetch_stream *s)
{
	uint64_t want_last = s->off + s->len - 1, left = s->len - s->pos;
	long st = s->resp.status;

	if (st == 200) {
		curl_off_t cl = -1;

		if (curl_easy_getinfo(s->easy, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T,
				      &cl) != CURLE_OK)
			cl = -1;
		if (cl >= 0 && s->size != FETCH_RANGE_UNKNOWN &&
		    (uint64_t)cl != s->size)
			return check_fail(s, -EIO,
					  "blob is %" PRId64 " bytes, expected %" PRIu64,
					  (int64_t)cl, s->size);
		if (cl >= 0 && ((uint64_t)cl < s->xfer_start ||
				(uint64_t)cl - s->xfer_start < left))
			return check_fail(s, s->verify ? -EIO : -ERANGE,
					  "blob is only %" PRId64 " bytes",
					  (int64_t)cl);
		/* Range ignored: the body starts at offset 0. */
		s->skip = s->xfer_start;
	} else if (st == 206) {
		const char *cr_hdr = http_header(&s->resp, "Content-Range");
		const char *ct = http_header(&s->resp, "Content-Type");
		struct fetch_content_range cr;

		if (ct && !strncasecmp(ct, "multipart/", 10))
			return check_fail(s, -EPROTO,
					  "multipart answer to a single range");
		if (!cr_hdr ||
		    fetch_parse_content_range(cr_hdr, strlen(cr_hdr), &cr) ||
		    cr.first == FETCH_RANGE_UNKNOWN)
			return check_fail(s, -EPROTO,
					  "206 without a valid Content-Range");
		if (cr.first != s->xfer_start)
			return check_fail(s, -EPROTO,
					  "answer starts at %" PRIu64
					  ", asked for %" PRIu64,
					  cr.first, s->xfer_start);
		if (cr.total != FETCH_RANGE_UNKNOWN &&
		    s->size != FETCH_RANGE_UNKNOWN && cr.total != s->size)
			return check_fail(s, -EIO,
					  "blob is %" PRIu64 " bytes, expected %" PRIu64,
					  cr.total, s->size);
		/* Ending before the wanted end is a short answer: the
		 * transfer resumes from there, unless the blob ends. */
		if (cr.last < want_last && cr.total != FETCH_RANGE_UNKNOWN &&
		    cr.last + 1 == cr.total)
			return check_fail(s, s->verify ? -EIO : -ERANGE,
					  "blob is only %" PRIu64 " bytes",
					  cr.total);
		s->skip = 0;
	}
	s->checked = true;
	return 0;
}

static int buf_make_room(struct fetch_stream *s, size_t need)
{
	uint8_t *nb;

	if (s->cap - s->tail >= need)
		return 0;
	if (s->head) {
		memmove(s->buf, s->buf + s->head, s->tail - s->head);
		s->tail -= s->head;
		s->head = 0;
	}
	if (s->cap - s->tail >= need)
		return 0;
	if (s->tail)
		return 1; /* full: pause until the reader drains it */
	/* A single delivery larger than the buffer: grow, bounded. */
	if (need > STREAM_BUF_MAX)
		return -ENOMEM;
	nb = realloc(s->buf, need);
	if (!nb)
		return -ENOMEM;
	s->buf = nb;
	s->cap = need;
	return 0;
}

static size_t stream_write(char *p, size_t size, size_t nmemb, void *arg)
{
	struct fetch_stream *s = arg;
	size_t n = size * nmemb, drop, use;
	uint64_t want = s->len - s->pos;
	int rc;

	if (http_side_body(&s->x, p, n))
		return s->x.sink_err ? 0 : n;
	if (!s->checked) {
		s->x.sink_err = stream_check(s);
		if (s->x.sink_err)
			return 0;
	}
	drop = (size_t)MIN((uint64_t)n, s->skip);
	use = (size_t)MIN((uint64_t)(n - drop), want);
	rc = buf_make_room(s, use);
	if (rc < 0) {
		s->x.sink_err = rc;
		return 0;
	}
	if (rc > 0) {
		/* Nothing consumed: libcurl hands the same bytes again. */
		s->paused = s->x.paused = true;
		return CURL_WRITEFUNC_PAUSE;
	}
	atomic_fetch_add(&s->h->st_down, n);
	memcpy(s->buf + s->tail, p + drop, use);
	s->tail += use;
	s->pos += use;
	s->skip -= drop;
	s->xfer_got += use;
	if (n - drop > use) {
		/* More than wanted: a longer blob is an error for a whole
		 * blob read; otherwise the rest of a 200 is not needed. */
		if (s->verify) {
			s->x.sink_err = check_fail(s, -EIO,
						   "blob is longer than %" PRIu64
						   " bytes", s->size);
			return 0;
		}
		s->x.stopped = true;
		return 0;
	}
	return n;
}

/* ------------------------------------------------------------------ */
/* Transfers                                                           */
/* ------------------------------------------------------------------ */

static void xfer_release(struct fetch_stream *s)
{
	if (s->active) {
		curl_multi_remove_handle(s->multi, s->easy);
		s->active = false;
	}
	s->paused = false;
	curl_slist_free_all(s->x.hdrs);
	s->x.hdrs = NULL;
	free(s->url);
	s->url = NULL;
}

/* Ask host @h from now on, with attempts of its own. */
static void stream_use_host(struct fetch_stream *s, struct registry *h)
{
	uint64_t deadline = s->t.deadline_ns;

	auth_line_free(s->t.auth);
	if (s->easy) {
		/* A handle goes back to the pool of its host. */
		http_put_handle(s->h, s->easy);
		s->easy = NULL;
	}
	s->h = h;
	s->t = (struct http_try){
		.r = h, .method = "GET", .what = s->what, .scope = &s->scope,
		.deadline_ns = deadline, .once = h->mirror,
	};
	s->cache_failed = false;
}

/* The next mirror that may serve blobs, else the registry, from now on. */
static void stream_next_host(struct fetch_stream *s)
{
	while (s->next_mirror < s->r->nr_mirrors) {
		struct registry *m = s->r->mirrors[s->next_mirror++];

		if (reg_mirror_usable(m, FETCH_HOST_PULL)) {
			stream_use_host(s, m);
			return;
		}
	}
	stream_use_host(s, s->r);
}

static int stream_start(struct fetch_stream *s)
{
	bool whole;
	int err;

	xfer_release(s);
	s->xfer_start = s->off + s->pos;
	if (!s->cache_failed &&
	    (s->url = reg_redirect_get(s->h, s->digest))) {
		s->src = SRC_CACHED;
	} else {
		s->src = SRC_HOST;
		/* A mirror whose credentials fail hands over to the next. */
		while ((err = http_try_auth(&s->t)) && s->h->mirror &&
		       err != -ENOMEM && err != -ECANCELED) {
			reg_mirror_failed(s->h, s->what, ferry_strerror(err), true);
			stream_next_host(s);
		}
		if (err)
			return err;
		s->url = reg_url(s->h, s->h->base, "/blobs/%s", s->dstr);
	}
	if (!s->url)
		return -ENOMEM;
	/* No Range for a whole blob from its start, an open-ended one to
	 * resume a whole blob, a closed one for a part. */
	whole = s->verify && s->pos == 0;
	s->h_ident.data = (char *)"Accept-Encoding: identity";
	s->h_ident.next = NULL;
	if (!whole) {
		if (s->verify)
			snprintf(s->range, sizeof(s->range),
				 "Range: bytes=%" PRIu64 "-", s->xfer_start);
		else
			snprintf(s->range, sizeof(s->range),
				 "Range: bytes=%" PRIu64 "-%" PRIu64,
				 s->xfer_start, s->off + s->len - 1);
		s->h_range.data = s->range;
		s->h_range.next = NULL;
		s->h_ident.next = &s->h_range;
	}
	s->q = (struct http_req){
		.what = s->what,
		.method = "GET",
		.url = s->url,
		.headers = &s->h_ident,
		.follow = true,
	};
	s->x = (struct http_xfer){
		.r = s->h, .q = &s->q, .resp = &s->resp,
		.deadline_ns = s->t.deadline_ns,
	};
	http_resp_reset(&s->resp);
	s->checked = false;
	s->skip = 0;
	s->xfer_got = 0;
	s->why[0] = '\0';
	if (!s->easy) {
		s->easy = http_get_handle(s->h);
		if (!s->easy)
			return -ENOMEM;
	} else {
		curl_easy_reset(s->easy);
	}
	/* A host's credentials go to it only, not to where it redirects. */
	err = http_setup(s->h, s->easy, &s->x,
			 s->src == SRC_HOST ? s->t.auth : NULL, stream_write, s);
	if (err)
		return err;
	if (curl_multi_add_handle(s->multi, s->easy) != CURLM_OK)
		return -ENOMEM;
	s->active = true;
	atomic_fetch_add(&s->h->st_requests, 1);
	return 0;
}

/* A mirror or cached redirect failed: the next source takes over. */
static void source_failed(struct fetch_stream *s, int err)
{
	char why[320];

	if (s->x.sink_err)
		snprintf(why, sizeof(why), "%s", s->why);
	else
		http_describe(&s->resp, err, why, sizeof(why));
	if (s->src == SRC_HOST && s->xfer_got) {
		/* Broken off mid-way: the next host goes on from there. */
		ferry_warn("%s: %s broke off after %" PRIu64 " bytes (%s); asking "
			   "the next host from byte %" PRIu64, s->h->name, s->what,
			   s->xfer_got, why, s->off + s->pos);
		stream_next_host(s);
	} else if (s->src == SRC_HOST) {
		/* No answer at all: rest the mirror. A status (it lacks this
		 * blob) concerns this blob. */
		reg_mirror_failed(s->h, s->what, why, err && !s->resp.status);
		stream_next_host(s);
	} else {
		ferry_dbg("%s: cached redirect for %s failed (%s); resolving "
			  "again", s->h->name, s->what, why);
		reg_redirect_drop(s->h, s->digest);
		s->cache_failed = true;
	}
}

/* A transfer ended: done, switch source, retry, or fail. */
static int stream_done(struct fetch_stream *s, CURLcode cc)
{
	struct registry *h = s->h;
	int err = http_xfer_end(&s->x, s->easy, cc);
	bool answer = !err && s->resp.status >= 200 && s->resp.status < 300;

	if (answer && !s->checked)
		err = s->x.sink_err = stream_check(s); /* an empty body */
	if (s->pos == s->len && !s->x.sink_err) {
		/* Everything wanted arrived (even if the end was unclean). */
		if (s->src == SRC_HOST && s->resp.redirects > 0 &&
		    s->resp.effective_url)
			reg_redirect_put(h, s->digest, s->resp.effective_url);
		xfer_release(s);
		return 0;
	}
	if (answer && !err) {
		/* Short body: resume from where it stopped. */
		err = -EIO;
		s->resp.cc = CURLE_PARTIAL_FILE;
	}
	xfer_release(s);
	if (s->src == SRC_CACHED ||
	    (h->mirror && (s->x.sink_err || !http_try_next(&s->t, err, &s->resp)))) {
		/* A mirror's one attempt (its 401 answered) is spent. */
		source_failed(s, err);
		return 0;
	}
	if (h->mirror)
		return 0;
	if (s->x.sink_err) {
		/* The answer itself was wrong: no retry makes it right. */
		ferry_err("%s: %s: %s", h->name, s->what,
			  s->why[0] ? s->why : ferry_strerror(err));
		return err;
	}
	/*
	 * A connection that moved real progress before dropping starts a new
	 * round of attempts; a trickle does not, so a server that sends a
	 * little and stalls each time still runs out of attempts.
	 */
	if (s->xfer_got >= STREAM_PROGRESS_RESET)
		s->t.attempt = 0;
	if (http_try_next(&s->t, err, &s->resp))
		return 0;
	return http_fail(h, s->what, err, &s->resp);
}

static int stream_pump_inner(struct fetch_stream *s);

/*
 * Drive the transfer until bytes are buffered or the range is complete.
 * Time spent outside (the reader busy with the last bytes) is not a
 * stall: the stall clock is moved forward by it.
 */
static int stream_pump(struct fetch_stream *s)
{
	int err;

	if (s->active && s->pump_exit_ns)
		s->x.moved_ns += ferry_now_ns() - s->pump_exit_ns;
	err = stream_pump_inner(s);
	s->pump_exit_ns = ferry_now_ns();
	return err;
}

static int stream_pump_inner(struct fetch_stream *s)
{
	for (;;) {
		CURLMsg *msg;
		int running, left, err;

		if (s->tail > s->head)
			return 0;
		if (!s->active) {
			if (s->pos == s->len)
				return 0;
			err = stream_start(s);
			if (err)
				return err;
		}
		if (s->paused) {
			s->paused = s->x.paused = false;
			s->x.moved_ns = ferry_now_ns();
			/* May deliver the held bytes right away. */
			curl_easy_pause(s->easy, CURLPAUSE_CONT);
			if (s->tail > s->head)
				return 0;
		}
		if (curl_multi_perform(s->multi, &running) != CURLM_OK) {
			ferry_err("%s: %s: libcurl multi interface failed",
				  s->r->name, s->what);
			return -EIO;
		}
		while ((msg = curl_multi_info_read(s->multi, &left))) {
			if (msg->msg != CURLMSG_DONE)
				continue;
			err = stream_done(s, msg->data.result);
			if (err)
				return err;
			break; /* the handle was removed */
		}
		if (s->tail > s->head)
			return 0;
		if (s->active && !s->paused)
			curl_multi_poll(s->multi, NULL, 0, POLL_MS, NULL);
	}
}

/* ------------------------------------------------------------------ */
/* API                                                                 */
/* ------------------------------------------------------------------ */

/*
 * All wanted bytes are in but the response has not ended (its last
 * chunk, a trailer): let it end, briefly, so the connection can be
 * reused rather than closed.
 */
static void stream_settle(struct fetch_stream *s)
{
	uint64_t deadline = ferry_now_ns() + SETTLE_NS;

	while (s->active && !s->paused && ferry_now_ns() < deadline) {
		CURLMsg *msg;
		int running, left;

		if (curl_multi_perform(s->multi, &running) != CURLM_OK)
			break;
		while ((msg = curl_multi_info_read(s->multi, &left)))
			if (msg->msg == CURLMSG_DONE) {
				xfer_release(s);
				return;
			}
		curl_multi_poll(s->multi, NULL, 0, 50, NULL);
	}
}

void fetch_stream_close(struct fetch_stream *s)
{
	if (!s)
		return;
	if (s->active && s->pos == s->len && !s->err)
		stream_settle(s);
	xfer_release(s);
	auth_line_free(s->t.auth);
	if (s->easy)
		http_put_handle(s->h, s->easy);
	if (s->multi)
		curl_multi_cleanup(s->multi);
	http_resp_free(&s->resp);
	if (s->hasher)
		sha256_hasher_free(s->hasher);
	free(s->buf);
	free(s);
}

int stream_open(struct registry *r, const uint8_t digest[FETCH_DIGEST_SIZE],
		uint64_t size, uint64_t off, uint64_t len, bool verify,
		bool bounded, struct fetch_stream **out)
{
	struct fetch_stream *s;
	int err = -ENOMEM;

	*out = NULL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->r = r;
	s->scope.push = r->access == FETCH_PUSH;
	s->t = (struct http_try){ .r = r };
	if (bounded)
		http_try_start(&s->t, len);
	stream_next_host(s);
	memcpy(s->digest, digest, FETCH_DIGEST_SIZE);
	digest_format(digest, s->dstr);
	if (verify)
		snprintf(s->what, sizeof(s->what), "blob %s", s->dstr);
	else
		snprintf(s->what, sizeof(s->what),
			 "blob %s bytes %" PRIu64 "+%" PRIu64, s->dstr, off, len);
	s->size = size;
	s->off = off;
	s->len = len;
	s->verify = verify;
	s->cap = STREAM_BUF;
	s->buf = malloc(s->cap);
	s->multi = curl_multi_init();
	if (!s->buf || !s->multi ||
	    curl_multi_setopt(s->multi, CURLMOPT_MAXCONNECTS,
			      (long)REG_MAXCONNECTS) != CURLM_OK)
		goto fail;
	if (verify && sha256_hasher_new(&s->hasher))
		goto fail;
	/* Start now so a missing blob or refused access shows at open. */
	if (len) {
		err = stream_pump(s);
		if (err)
			goto fail;
	}
	*out = s;
	return 0;
fail:
	fetch_stream_close(s);
	return err;
}

int registry_open_stream(struct registry *r,
			 const uint8_t digest[FETCH_DIGEST_SIZE], uint64_t size,
			 struct fetch_stream **out)
{
	return stream_open(r, digest, size, 0, size, true, false, out);
}

/* All bytes handed out: check the size and digest of a whole blob. */
static int stream_eof(struct fetch_stream *s)
{
	uint8_t got[FETCH_DIGEST_SIZE];

	if (!s->verify || s->eof_checked)
		return 0;
	s->eof_checked = true;
	sha256_hasher_final(s->hasher, got);
	if (s->handed != s->size ||
	    memcmp(got, s->digest, FETCH_DIGEST_SIZE)) {
		ferry_err("%s: %s: the bytes do not match the digest",
			  s->r->name, s->what);
		s->err = -EIO;
		return -EIO;
	}
	return 0;
}

ssize_t fetch_stream_read(struct fetch_stream *s, void *buf, size_t len)
{
	size_t n;
	int err;

	if (s->err)
		return s->err;
	if (!len)
		return 0;
	if (s->tail == s->head) {
		err = stream_pump(s);
		if (err) {
			s->err = err;
			return err;
		}
		if (s->tail == s->head)
			return stream_eof(s);
	}
	n = MIN(len, s->tail - s->head);
	if (n > SSIZE_MAX)
		n = SSIZE_MAX;
	memcpy(buf, s->buf + s->head, n);
	if (s->hasher)
		sha256_hasher_update(s->hasher, s->buf + s->head, n);
	s->head += n;
	s->handed += n;
	if (s->head == s->tail)
		s->head = s->tail = 0;
	return (ssize_t)n;
}

int registry_get_blob(struct registry *r,
		      const uint8_t digest[FETCH_DIGEST_SIZE], uint64_t size,
		      size_t max, struct fetch_buf *out)
{
	struct fetch_stream *s;
	uint8_t *data;
	size_t got = 0;
	ssize_t n;
	int err;

	memset(out, 0, sizeof(*out));
	if (size > max || size >= SIZE_MAX) {
		char d[80];

		digest_format(digest, d);
		ferry_err("%s: blob %s: %" PRIu64 " bytes is over the %zu "
			  "byte limit", r->name, d, size, max);
		return -EFBIG;
	}
	data = malloc((size_t)size + 1);
	if (!data)
		return -ENOMEM;
	err = stream_open(r, digest, size, 0, size, true, true, &s);
	if (err)
		goto fail;
	for (;;) {
		size_t room = (size_t)size - got;

		/* Room for one more byte shows a blob longer than @size. */
		n = fetch_stream_read(s, data + got, room ? room : 1);
		if (n <= 0)
			break;
		got += (size_t)n;
	}
	fetch_stream_close(s);
	if (n < 0) {
		err = (int)n;
		goto fail;
	}
	data[got] = '\0';
	out->data = data;
	out->len = got;
	return 0;
fail:
	free(data);
	return err;
}

int registry_get_range(struct registry *r,
		       const uint8_t digest[FETCH_DIGEST_SIZE], uint64_t off,
		       uint64_t len, void *buf)
{
	struct fetch_stream *s;
	uint64_t got = 0;
	int err;

	if (!len)
		return 0;
	if (off > UINT64_MAX - len || len > SIZE_MAX)
		return -ERANGE;
	err = stream_open(r, digest, FETCH_RANGE_UNKNOWN, off, len, false, true,
			  &s);
	if (err)
		return err;
	while (got < len) {
		ssize_t n = fetch_stream_read(s, (uint8_t *)buf + got,
					      (size_t)(len - got));

		if (n <= 0) {
			err = n < 0 ? (int)n : -EIO;
			break;
		}
		got += (uint64_t)n;
	}
	fetch_stream_close(s);
	return err;
}
