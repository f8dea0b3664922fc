// SPDX-License-Identifier: MIT
/*
 * The mount table. Each mount has a session thread running its mode's
 * loop (mode.h: serve). When the loop ends — unmounted from outside (FUSE
 * workers read ENODEV; the fanotify superblock is gone), by ferry umount
 * (ferryd's own umount2, same path), or forced at shutdown (the mode's
 * stop) — that thread tears the mount down: stops prefetch, closes the
 * session, the chunk cache and the image, and takes the mount out of the
 * table. Other mounts keep running.
 *
 * Locking: ctx->lock guards the list, refs and state; m->lock guards the
 * session thread's progress flags. A mount is freed at its last ref
 * (the table's, the session thread's, and any request handling it).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#define READY_TIMEOUT_MS 10000    /* mount(2) to mount_ready (FUSE: INIT) */
#define UMOUNT_WAIT_MS 5000       /* umount until the mount is torn down */
#define FORCE_WAIT_MS 10000       /* forced stop of a session that never ran */
#define SHUTDOWN_WAIT_MS 5000     /* every session ended at shutdown */
#define BUSY_CANCEL_MS 3000       /* a busy umount: readers in a fetch leave */

/* Drop @n references; the last one frees. */
static void mount_put_locked_n(struct fmount *m, unsigned int n)
{
	m->refs -= n;
	if (m->refs)
		return;
	if (m->req.takeover_fd >= 0)
		close(m->req.takeover_fd);
	ctl_mount_req_free(&m->req);
	free(m->mountpoint);
	pthread_mutex_destroy(&m->lock);
	pthread_cond_destroy(&m->cond);
	free(m);
}

static void mount_put_locked(struct fmount *m)
{
	mount_put_locked_n(m, 1);
}

static void mount_put(struct fmount *m)
{
	struct serve_ctx *ctx = m->ctx;

	pthread_mutex_lock(&ctx->lock);
	mount_put_locked(m);
	pthread_mutex_unlock(&ctx->lock);
}

/*
 * The mount on @mountpoint. One being torn down (unmounted already, its
 * session finishing a fetch) only when there is no other: a new mount
 * may take the mount point meanwhile.
 */
static struct fmount *find_locked(struct serve_ctx *ctx, const char *mountpoint,
				  bool stopping_too)
{
	struct fmount *m, *stopping = NULL;

	for (m = ctx->mounts; m; m = m->next) {
		if (strcmp(m->mountpoint, mountpoint))
			continue;
		if (m->state != MS_STOPPING)
			return m;
		stopping = m;
	}
	return stopping_too ? stopping : NULL;
}

static void unlink_locked(struct fmount *m)
{
	struct fmount **pp;

	for (pp = &m->ctx->mounts; *pp; pp = &(*pp)->next) {
		if (*pp == m) {
			*pp = m->next;
			break;
		}
	}
	m->removed = true;
	pthread_cond_broadcast(&m->ctx->cond);
}

static void notify_change(struct serve_ctx *ctx)
{
	if (ctx->on_change)
		ctx->on_change(ctx->on_change_arg);
}

/* Whether our mount is what sits on top of its mount point. */
static bool on_top(const struct fmount *m)
{
	struct mount_entry mi;

	return !mountinfo_find(m->mountpoint, &mi) && mi.major == m->dev_major &&
	       mi.minor == m->dev_minor && !strcmp(mi.fstype, m->fstype);
}

void mount_detach(const struct fmount *m)
{
	if (on_top(m) && umount_nofollow(m->mountpoint, MNT_DETACH))
		ferry_warn("%s: detaching %s: %s", m->req.image, m->mountpoint,
			   strerror(errno));
}

void mount_ready(struct fmount *m)
{
	pthread_mutex_lock(&m->lock);
	m->ready = true;
	pthread_cond_broadcast(&m->cond);
	pthread_mutex_unlock(&m->lock);
}

uint64_t mount_bytes(const struct fmount *m)
{
	uint64_t n = m->img->bootstrap_len;
	uint32_t i;

	for (i = 0; i < m->img->blobs.nr_blobs; i++)
		n += m->img->blobs.blobs[i].uncompressed_size;
	return n;
}

/* After the loop ended: the mode closes its session, out of --list's sight. */
static void session_close(struct fmount *m, int loop_ret)
{
	void *state;

	pthread_mutex_lock(&m->ctx->lock);
	state = m->mode_state;
	m->mode_state = NULL;
	pthread_mutex_unlock(&m->ctx->lock);
	m->mode->close(state, loop_ret);
}

static void log_final(const struct fmount *m, const struct image_cache_stats *s)
{
	ferry_info("unmounted %s from %s: %llu bytes read, %llu bytes fetched, %llu prefetched; %llu of %llu chunks present",
		   m->req.image, m->mountpoint, (unsigned long long)s->bytes_read,
		   (unsigned long long)s->bytes_fetched,
		   (unsigned long long)s->bytes_prefetched,
		   (unsigned long long)s->chunks_present,
		   (unsigned long long)s->chunks_total);
}

static void *session_main(void *arg)
{
	struct fmount *m = arg;
	struct serve_ctx *ctx = m->ctx;
	struct image_cache_stats s;
	int ret;

	ret = m->mode->serve(m->mode_state);
	pthread_mutex_lock(&m->lock);
	m->loop_ended = true;
	pthread_cond_broadcast(&m->cond);
	pthread_mutex_unlock(&m->lock);
	/* ferryd exits for an upgrade: the mount and its keeper stay. */
	if (atomic_load(&m->quiesced))
		return NULL;
	if (ret)
		ferry_warn("%s on %s: %s loop: %s", m->req.image, m->mountpoint,
			   m->mode->name, ret < 0 ? ferry_strerror(ret) : "stopped");

	/* The prefetch thread may sleep in its bandwidth pacing: the
	 * session (and the umount waiting for it) ends first. */
	atomic_store(&m->stop, true);
	session_close(m, ret);
	pthread_mutex_lock(&ctx->lock);
	m->session_closed = true;
	pthread_cond_broadcast(&ctx->cond);
	pthread_mutex_unlock(&ctx->lock);
	if (m->prefetch_started)
		pthread_join(m->prefetch_thread, NULL);

	pthread_mutex_lock(&ctx->lock);
	if (m->state != MS_STOPPING && !ctx->shutting_down)
		ferry_info("%s was unmounted from outside ferryd", m->mountpoint);
	image_cache_get_stats(m->ic, &m->final);
	m->closed = true;
	s = m->final;
	pthread_mutex_unlock(&ctx->lock);

	image_cache_close(m->ic);
	image_close(m->img);
	m->ic = NULL;
	m->img = NULL;
	log_final(m, &s);

	pthread_mutex_lock(&ctx->lock);
	unlink_locked(m);
	mount_put_locked_n(m, 2); /* the table's and ours */
	pthread_mutex_unlock(&ctx->lock);
	notify_change(ctx);
	return NULL;
}

/*
 * Ask a session loop that no unmount will end (busy mount at shutdown,
 * never ready) to stop. Repeated by the callers, since a wake-up that
 * lands before the loop waits may be lost. True once the loop has ended.
 * force_end cancels the fetches in flight first, so workers return soon.
 */
static bool poke(struct fmount *m)
{
	bool ended;

	pthread_mutex_lock(&m->lock);
	/* Until loop_ended is set (under this lock) the session exists. */
	if (!m->loop_ended)
		m->mode->stop(m->mode_state);
	ended = m->loop_ended;
	pthread_mutex_unlock(&m->lock);
	return ended;
}

static void force_end(struct fmount *m, unsigned int ms)
{
	struct timespec ts;
	unsigned int waited;

	/* A worker inside a fetch would hold the session until it ends. */
	atomic_store(&m->fetch_cancel, true);
	for (waited = 0; !poke(m) && waited < ms; waited += 20) {
		pthread_mutex_lock(&m->lock);
		ferry_deadline_ts(&ts, 20);
		if (!m->loop_ended)
			pthread_cond_timedwait(&m->cond, &m->lock, &ts);
		pthread_mutex_unlock(&m->lock);
	}
}

/* Wait (bounded) until @m's session has ended; ctx->lock held. */
static bool wait_session_locked(struct fmount *m, unsigned int ms)
{
	struct timespec ts;

	ferry_deadline_ts(&ts, ms);
	while (!m->session_closed && !m->removed)
		if (pthread_cond_timedwait(&m->ctx->cond, &m->ctx->lock, &ts) == ETIMEDOUT)
			break;
	return m->session_closed || m->removed;
}

/* @takeover: the mount there is the one being taken over (mode.h). */
static int check_mountpoint(const char *path, bool takeover, char **canon, char *err,
			    size_t errlen)
{
	struct mount_entry mi;
	struct stat st;

	if (takeover) {
		/*
		 * The dead ferryd's canonical path, not resolved again: a
		 * lookup on a FUSE mount would wait for the answer we are
		 * about to give.
		 */
		*canon = path[0] == '/' ? strdup(path) : NULL;
		if (!*canon || mountinfo_find(*canon, &mi) || !image_mount_is_ferry(&mi)) {
			snprintf(err, errlen, "%s: no ferry mount there to take over", path);
			return -ENOENT;
		}
		return 0;
	}
	*canon = realpath(path, NULL);
	if (!*canon) {
		int e = errno;

		if (e == ENOTCONN)
			snprintf(err, errlen, "mount point %s: %s (a dead FUSE mount: was its ferryd killed? run ferry umount %s first)",
				 path, strerror(e), path);
		else
			snprintf(err, errlen, "mount point %s: %s", path, strerror(e));
		return -e;
	}
	if (stat(*canon, &st) || !S_ISDIR(st.st_mode)) {
		snprintf(err, errlen, "mount point %s: not a directory", path);
		return -ENOTDIR;
	}
	if (!mountinfo_find(*canon, &mi) &&
	    image_mount_is_ferry(&mi)) {
		snprintf(err, errlen, "%s is already a ferry mount (%s); ferry umount it first",
			 *canon, mi.source);
		return -EBUSY;
	}
	return 0;
}

/* The captured error lines, else @fallback with the errno. */
static void set_err(char *err, size_t errlen, const struct ferry_log_capture *c,
		    int ret, const char *fallback)
{
	if (c->len)
		snprintf(err, errlen, "%s: %s", fallback, c->text);
	else
		snprintf(err, errlen, "%s: %s", fallback, ferry_strerror(ret));
}

/*
 * A new mount of @req (taken over, also on failure) in its mode, in the
 * table as being set up: refs for the table and the caller.
 */
/* The first mode of the table that can @capable, or NULL. */
static const struct serve_mode *mode_that(bool (*capable)(const struct serve_mode *))
{
	unsigned int i;

	for (i = 0; i < SERVE_NR_MODES; i++)
		if (capable(serve_modes[i]))
			return serve_modes[i];
	return NULL;
}

static bool records(const struct serve_mode *mode)
{
	return mode->records_reads;
}

static int mount_new(struct serve_ctx *ctx, struct ctl_mount_req *req, struct fmount **out,
		     char *err, size_t errlen)
{
	struct fmount *m = calloc(1, sizeof(*m)), *other;
	const struct serve_mode *recorder;
	char modes[128];
	int ret = 0;

	if (!m) {
		if (req->takeover_fd >= 0)
			close(req->takeover_fd);
		ctl_mount_req_free(req);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	m->ctx = ctx;
	m->req = *req;
	memset(req, 0, sizeof(*req));
	pthread_mutex_init(&m->lock, NULL);
	pthread_cond_init(&m->cond, NULL);
	m->refs = 1;
	m->mode = serve_mode_pick(ctx, &m->req, m->mode_why, sizeof(m->mode_why));
	if (!m->mode && m->mode_why[0]) {
		snprintf(err, errlen, "no mode can serve it on this host (%s)", m->mode_why);
		ret = -EOPNOTSUPP;
	} else if (!m->mode) {
		serve_mode_names(modes, sizeof(modes));
		snprintf(err, errlen, "unknown mode \"%s\" (this ferryd serves %s)",
			 m->req.mode, modes);
		ret = -EINVAL;
	} else if (m->req.record && !m->mode->records_reads) {
		recorder = mode_that(records);
		snprintf(err, errlen, "recording (--record) needs --mode %s: the kernel reads %s mounts without ferryd seeing which files",
			 recorder ? recorder->name : "?", m->mode->name);
		ret = -EINVAL;
	} else {
		if (m->mode_why[0])
			ferry_info("mount %s: mode %s: %s", m->req.image, m->req.mode,
				   m->mode_why);
		ret = check_mountpoint(m->req.mountpoint, m->req.takeover, &m->mountpoint, err,
				       errlen);
	}
	if (ret) {
		ferry_err("mount %s: %s", m->req.image, err);
		goto fail;
	}

	pthread_mutex_lock(&ctx->lock);
	other = find_locked(ctx, m->mountpoint, false);
	if (ctx->shutting_down) {
		ret = -ESHUTDOWN;
		snprintf(err, errlen, "mount %s on %s: ferryd is shutting down",
			 m->req.image, m->mountpoint);
	} else if (other) {
		ret = -EBUSY;
		snprintf(err, errlen, "mount %s on %s: %s is already mounted by this ferryd (%s)",
			 m->req.image, m->mountpoint, m->mountpoint, other->req.image);
	} else {
		m->state = MS_MOUNTING;
		m->next = ctx->mounts;
		ctx->mounts = m;
		m->refs++;
	}
	pthread_mutex_unlock(&ctx->lock);
	if (ret) {
		ferry_err("%s", err);
		goto fail;
	}
	*out = m;
	return 0;

fail:
	mount_put(m);
	return ret;
}

/*
 * "fanotify (Linux 6.14+, ...) and cachefiles": the modes that serve
 * native layers, with what each needs of the host.
 */
static void layer_modes(char *buf, size_t len)
{
	size_t n = 0, left = 0, i;

	buf[0] = '\0';
	for (i = 0; i < SERVE_NR_MODES; i++)
		left += serve_modes[i]->serves_layers;
	for (i = 0; i < SERVE_NR_MODES && n < len; i++) {
		const struct serve_mode *mode = serve_modes[i];

		if (!mode->serves_layers)
			continue;
		left--;
		n += (size_t)snprintf(buf + n, len - n, "%s%s%s%s%s", mode->name,
				      mode->layers_needs ? " (" : "",
				      mode->layers_needs ? mode->layers_needs : "",
				      mode->layers_needs ? ")" : "",
				      left > 1 ? ", " : left ? " and " : "");
	}
}

/*
 * Native EROFS layers are one kernel EROFS per layer under overlayfs:
 * the kernel's modes serve such a stack lazily, FUSE serves one merged
 * tree. Nothing is shared through a device table (no --domain), and
 * there is no merged tree to take --prefetch-files from. A mode that
 * cannot serve the image answers -EMEDIUMTYPE: ferry mount's auto mode
 * then mounts it fully fetched (--mode local).
 */
static int layers_supported(const struct fmount *m, char *err, size_t errlen)
{
	char modes[256];

	if (!m->mode->serves_layers) {
		layer_modes(modes, sizeof(modes));
		snprintf(err, errlen, "%s is an image of native EROFS layers: ferryd serves those lazily in %s modes, not %s%s%s; --mode local mounts them fully fetched",
			 m->req.image, modes, m->mode->name, m->mode_why[0] ? ": " : "",
			 m->mode_why);
		return -EMEDIUMTYPE;
	}
	if (m->req.domain) {
		snprintf(err, errlen, "%s is an image of native EROFS layers: --domain shares the blobs of ferry's format through the EROFS device table, and native layers have none; mount without --domain",
			 m->req.image);
		return -EINVAL;
	}
	if (m->req.nr_prefetch_files) {
		snprintf(err, errlen, "%s is an image of native EROFS layers: --prefetch-files needs ferry's format (one tree); --prefetch-all works",
			 m->req.image);
		return -EOPNOTSUPP;
	}
	return 0;
}

/* Open the image and its chunk cache, and start the mode (mount(2)). */
static int mount_setup(struct fmount *m, const char *what, char *err,
		       size_t errlen)
{
	struct image_opts opts = {
		.fetch = &m->req.fetch,
		.cache_dir = m->req.cache_dir,
		.no_config = true,
		.erofs_layers = true,
	};
	uint8_t pin[BLOB_DIGEST_SIZE], index_pin[BLOB_DIGEST_SIZE];
	struct ferry_log_capture cap;
	char why[1024] = "";
	struct mount_entry mi;
	int ret;

	ferry_log_capture_begin(&cap);
	m->req.fetch.cancel = &m->fetch_cancel;
	if (m->req.image_digest && !digest_parse(m->req.image_digest, pin))
		opts.digest = pin;
	if (m->req.index_digest && !digest_parse(m->req.index_digest, index_pin))
		opts.index_digest = index_pin;
	ret = image_open(m->req.image, &opts, &m->img);
	/* Whoever takes this mount over serves this very image (and index),
	 * even if a tag moved meanwhile, and finds its metadata in the cache. */
	if (!ret) {
		digest_format(m->img->image_digest, m->image_digest);
		m->req.image_digest = m->image_digest;
	}
	if (!ret && m->img->nr_index_layers) {
		digest_format(m->img->index_digest, m->index_digest);
		m->req.index_digest = m->index_digest;
	}
	if (!ret && m->img->erofs_layers) {
		ret = layers_supported(m, err, errlen);
		if (ret)
			goto out;
	}
	/* Before the kernel or FUSE sees it, and prefetch walks it. */
	if (!ret)
		ret = image_validate_metadata(m->img);
	if (ret) {
		set_err(err, errlen, &cap, ret, what);
		goto out;
	}
	ret = image_cache_open(m->img, m->req.cache_dir, &m->ic);
	/* Native layers: before the mode marks or mounts their files; a
	 * takeover's are mounted and may be watched (a read here would wait
	 * for an answer only this ferryd can give, once it serves), so only
	 * a mode that walks them taken over does (mode.h). */
	if (!ret && m->img->erofs_layers && (!m->req.takeover || m->mode->walks_on_takeover))
		ret = image_cache_walk_layers(m->ic);
	if (!ret)
		ret = evict_register(m->ctx, &m->req);
	if (ret) {
		snprintf(why, sizeof(why), "%s: chunk cache %s", m->req.image,
			 m->req.cache_dir);
		set_err(err, errlen, &cap, ret, why);
		goto out;
	}
	ret = m->mode->start(m, &m->mode_state, why, sizeof(why));
	if (ret && why[0])
		snprintf(err, errlen, "%s: %s", what, why);
	else if (ret)
		set_err(err, errlen, &cap, ret, what);
	if (ret)
		goto out;
	/* Our mount's device, to recognise it later without touching it. */
	if (!mountinfo_find(m->mountpoint, &mi)) {
		m->dev_major = mi.major;
		m->dev_minor = mi.minor;
		snprintf(m->fstype, sizeof(m->fstype), "%s", mi.fstype);
	}
	m->mounted_at = (int64_t)time(NULL);
out:
	ferry_log_capture_end(&cap);
	return ret;
}

/* The session thread, which from now on tears the mount down. */
static int session_start(struct fmount *m, const char *what, char *err,
			 size_t errlen)
{
	pthread_attr_t attr;
	int ret;

	pthread_mutex_lock(&m->ctx->lock);
	m->refs++; /* the session thread's */
	pthread_mutex_unlock(&m->ctx->lock);
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	ret = -pthread_create(&m->loop_thread, &attr, session_main, m);
	pthread_attr_destroy(&attr);
	if (ret) {
		mount_put(m);
		snprintf(err, errlen, "%s: cannot start the session thread: %s", what,
			 strerror(-ret));
		session_close(m, ret);
	}
	return ret;
}

static void prefetch_start(struct fmount *m)
{
	if (!(m->req.nr_prefetch_files + m->img->nr_prefetch + m->req.prefetch_all))
		return;
	atomic_store(&m->pstate, PF_RUNNING);
	if (pthread_create(&m->prefetch_thread, NULL, prefetch_main, m)) {
		ferry_warn("mount %s on %s: cannot start the prefetch thread",
			   m->req.image, m->mountpoint);
		atomic_store(&m->pstate, PF_FAILED);
	} else {
		m->prefetch_started = true;
	}
}

/*
 * Wait until the mode says the kernel serves the mount, then its live
 * hook and prefetch: 0, -ETIMEDOUT, or -EIO when the loop ended.
 */
static int wait_ready(struct fmount *m)
{
	struct timespec ts;
	int ret;

	ferry_deadline_ts(&ts, READY_TIMEOUT_MS);
	pthread_mutex_lock(&m->lock);
	while (!m->ready && !m->loop_ended)
		if (pthread_cond_timedwait(&m->cond, &m->lock, &ts) == ETIMEDOUT)
			break;
	ret = m->loop_ended ? -EIO : m->ready ? 0 : -ETIMEDOUT;
	if (!ret) {
		if (m->mode->live)
			m->mode->live(m->mode_state);
		prefetch_start(m);
	}
	pthread_mutex_unlock(&m->lock);
	return ret;
}

int serve_probe(const struct ctl_mount_req *req, char *err, size_t errlen,
		int (*answer)(const struct ctl_probe_reply *rep, void *arg), void *arg)
{
	struct image_opts opts = { .fetch = &req->fetch, .cache_dir = req->cache_dir };
	uint8_t pin[BLOB_DIGEST_SIZE], index_pin[BLOB_DIGEST_SIZE];
	struct ctl_probe_reply rep = { 0 };
	struct ferry_log_capture cap;
	struct image *img = NULL;
	char what[512];
	int ret;

	snprintf(what, sizeof(what), "probe %s", req->image);
	if (req->image_digest && !digest_parse(req->image_digest, pin))
		opts.digest = pin;
	if (req->index_digest && !digest_parse(req->index_digest, index_pin))
		opts.index_digest = index_pin;
	ferry_log_capture_begin(&cap);
	ret = image_open(req->image, &opts, &img);
	if (ret) {
		set_err(err, errlen, &cap, ret, what);
		goto out;
	}
	digest_format(img->image_digest, rep.image_digest);
	digest_format(img->bootstrap_digest, rep.bootstrap_digest);
	if (img->nr_index_layers) {
		digest_format(img->index_digest, rep.index_digest);
		rep.nr_layers = img->nr_index_layers;
		rep.layers = (const uint8_t (*)[32])img->index_layers;
		rep.diff_ids = (const uint8_t (*)[32])img->index_diff_ids;
	}
	ret = answer(&rep, arg);
out:
	ferry_log_capture_end(&cap);
	image_close(img);
	return ret;
}

int serve_mount(struct serve_ctx *ctx, struct ctl_mount_req *req, struct ctl_mount_reply *rep,
		char *err, size_t errlen)
{
	struct fmount *m;
	char what[512];
	uint64_t bytes;
	uint32_t blobs;
	int ret;

	ret = mount_new(ctx, req, &m, err, errlen);
	if (ret)
		return ret;
	snprintf(what, sizeof(what), "mount %s on %s", m->req.image, m->mountpoint);
	ferry_info("mounting %s on %s (cache %s)", m->req.image, m->mountpoint,
		   m->req.cache_dir);
	ret = mount_setup(m, what, err, errlen);
	if (!ret) {
		/* For the log line: the image is the session thread's soon. */
		bytes = mount_bytes(m);
		blobs = m->img->blobs.nr_blobs;
		if (rep) {
			snprintf(rep->image_digest, sizeof(rep->image_digest), "%s",
				 m->image_digest);
			if (!m->img->erofs_layers)
				digest_format(m->img->bootstrap_digest, rep->bootstrap_digest);
		}
		ret = session_start(m, what, err, errlen);
	}
	if (ret) {
		ferry_err("%s", err);
		image_cache_close(m->ic);
		image_close(m->img);
		m->ic = NULL;
		m->img = NULL;
		pthread_mutex_lock(&ctx->lock);
		m->closed = true;
		unlink_locked(m);
		mount_put_locked_n(m, 2); /* the table's and the handler's */
		pthread_mutex_unlock(&ctx->lock);
		return ret;
	}

	/* Answer once the mount is live; from now on the session thread
	 * tears it down. */
	ret = wait_ready(m);
	pthread_mutex_lock(&ctx->lock);
	if (!ret && ctx->shutting_down)
		ret = -ESHUTDOWN;
	m->state = ret ? MS_STOPPING : MS_LIVE;
	pthread_mutex_unlock(&ctx->lock);
	if (ret) {
		snprintf(err, errlen, "%s: %s", what,
			 ret == -ETIMEDOUT ? "the kernel did not start the session" :
			 ret == -ESHUTDOWN ? "ferryd is shutting down" :
					     "the session ended at once");
		if (!m->loop_ended)
			mount_detach(m);
		ferry_err("%s", err);
		force_end(m, FORCE_WAIT_MS);
	} else {
		ferry_info("mounted %s on %s (%s, %u blobs, %llu bytes; %s)", m->req.image,
			   m->mountpoint, m->mode->name, blobs, (unsigned long long)bytes,
			   atomic_load(&m->pstate) == PF_RUNNING ? "prefetching" :
								  "no prefetch");
		if (m->req.takeover)
			atomic_fetch_add(&ctx->takeovers[serve_mode_slot(m->mode)], 1);
	}
	mount_put(m);
	if (!ret)
		notify_change(ctx);
	return ret;
}

/* Whether our mount's device is still mounted anywhere (maybe covered). */
static bool dev_mounted(const struct fmount *m)
{
	char *line = NULL, dev[32];
	size_t cap = 0;
	bool found = false;
	FILE *fp = fopen("/proc/self/mountinfo", "re");

	if (!fp)
		return false;
	snprintf(dev, sizeof(dev), " %u:%u ", m->dev_major, m->dev_minor);
	while (!found && getline(&line, &cap, fp) > 0) {
		char *p = strchr(line, ' ');

		/* Field 3 follows the mount id and the parent id. */
		p = p ? strchr(p + 1, ' ') : NULL;
		found = p && !strncmp(p, dev, strlen(dev));
	}
	free(line);
	fclose(fp);
	return found;
}

static void set_state(struct fmount *m, enum mount_state s)
{
	pthread_mutex_lock(&m->ctx->lock);
	m->state = s;
	pthread_mutex_unlock(&m->ctx->lock);
}

/*
 * umount2 found @m busy. Readers blocked in a fetch (a trickling registry)
 * keep it so until the fetch deadline: cancel the mount's fetches so they
 * get EIO and leave, and try again for a while. Other users (an open
 * file, a working directory) keep it busy: then EBUSY as before, and the
 * mount serves on, its cancelled reads having failed.
 */
static int umount_busy(struct fmount *m)
{
	unsigned int waited;
	int e = EBUSY;

	atomic_store(&m->fetch_cancel, true);
	for (waited = 0; e == EBUSY && waited < BUSY_CANCEL_MS; waited += 50) {
		usleep(50 * 1000);
		e = umount_nofollow(m->mountpoint, 0) ? errno : 0;
	}
	if (e)
		atomic_store(&m->fetch_cancel, false);
	return e;
}

/*
 * umount's "release": forget @m's image record in its cache unless
 * another live mount serves that image from there (gc then may reclaim
 * its blobs, documents and bootstrap).
 */
static void release_image(struct fmount *m)
{
	uint8_t digest[BLOB_DIGEST_SIZE];
	struct fmount *o;
	bool used = false;
	int ret;

	if (digest_parse(m->image_digest, digest))
		return;
	pthread_mutex_lock(&m->ctx->lock);
	for (o = m->ctx->mounts; o && !used; o = o->next)
		used = o != m && o->state != MS_STOPPING &&
		       !strcmp(o->image_digest, m->image_digest) &&
		       !strcmp(o->req.cache_dir, m->req.cache_dir);
	pthread_mutex_unlock(&m->ctx->lock);
	if (used)
		return;
	ret = blob_cache_forget_image(m->req.cache_dir, digest);
	if (ret && ret != -ENOENT)
		ferry_warn("%s: cannot forget the record of %s in %s: %s", m->mountpoint,
			   m->image_digest, m->req.cache_dir, ferry_strerror(ret));
	else if (!ret)
		ferry_info("%s: released %s in %s (gc may reclaim it)", m->mountpoint,
			   m->image_digest, m->req.cache_dir);
}

int serve_umount(struct serve_ctx *ctx, const struct ctl_umount_req *req, char *err,
		 size_t errlen)
{
	const char *mountpoint = req->mountpoint;
	bool lazy = req->lazy;
	enum mount_state state;
	struct mount_entry mi;
	struct fmount *m;
	char *canon = NULL;
	int ret = 0, e;

	pthread_mutex_lock(&ctx->lock);
	m = find_locked(ctx, mountpoint, true);
	if (!m) {
		/* The client's path may not be canonical; ours is. */
		pthread_mutex_unlock(&ctx->lock);
		canon = realpath(mountpoint, NULL);
		pthread_mutex_lock(&ctx->lock);
		m = canon ? find_locked(ctx, canon, true) : NULL;
	}
	free(canon);
	if (!m) {
		pthread_mutex_unlock(&ctx->lock);
		snprintf(err, errlen, "%s: not mounted by this ferryd", mountpoint);
		return -ENOENT;
	}
	state = m->state;
	if (state == MS_MOUNTING) {
		pthread_mutex_unlock(&ctx->lock);
		snprintf(err, errlen, "%s: still being mounted (%s)", m->mountpoint,
			 m->req.image);
		return -EBUSY;
	}
	m->refs++;
	pthread_mutex_unlock(&ctx->lock);

	if (state == MS_DETACHED) {
		if (!lazy) {
			snprintf(err, errlen, "%s: already detached (ferry umount --lazy) and still in use",
				 m->mountpoint);
			ret = -EBUSY;
		}
		goto out;
	}
	if (on_top(m)) {
		/* Stopping first, so its session thread does not report an
		 * unmount "from outside". */
		set_state(m, MS_STOPPING);
		ferry_info("unmounting %s from %s%s", m->req.image, m->mountpoint,
			   lazy ? " (lazily if busy)" : "");
		e = umount_nofollow(m->mountpoint, 0) ? errno : 0;
		if (e == EBUSY)
			e = umount_busy(m);
		if (!e || (e == EINVAL && !dev_mounted(m))) {
			/* Its session loop ends with ENODEV (EINVAL: a racing
			 * umount was first). */
		} else if (e == EBUSY && lazy) {
			if (umount_nofollow(m->mountpoint, MNT_DETACH)) {
				e = errno;
				set_state(m, state);
				ret = -e;
				snprintf(err, errlen, "%s: lazy unmount: %s", m->mountpoint,
					 strerror(e));
				goto out;
			}
			ferry_info("detached %s from %s; served until its last user is gone",
				   m->req.image, m->mountpoint);
			set_state(m, MS_DETACHED);
			goto out;
		} else {
			set_state(m, state);
			ret = -e;
			snprintf(err, errlen, "%s: %s%s", m->mountpoint, strerror(e),
				 e == EBUSY ? " (files are open or a process works inside it; "
					      "close them or use ferry umount --lazy)" : "");
			goto out;
		}
	} else if (dev_mounted(m)) {
		ret = -EBUSY;
		snprintf(err, errlen, "%s: another file system (%s) is mounted over it; unmount that first",
			 m->mountpoint,
			 mountinfo_find(m->mountpoint, &mi) ? "?" : mi.fstype);
		goto out;
	}
	/* Unmounted: the session loop ends (ENODEV) and tears it down once
	 * its workers return; fetches in flight (a prefetch) are no longer
	 * wanted. */
	atomic_store(&m->fetch_cancel, true);
	pthread_mutex_lock(&ctx->lock);
	if (!wait_session_locked(m, UMOUNT_WAIT_MS))
		ferry_info("%s: unmounted; its session ends once a fetch in flight does",
			   m->mountpoint);
	pthread_mutex_unlock(&ctx->lock);
	if (req->release)
		release_image(m);
out:
	mount_put(m);
	return ret;
}

static const char *state_name(enum mount_state s)
{
	switch (s) {
	case MS_MOUNTING: return "mounting";
	case MS_LIVE: return "mounted";
	case MS_DETACHED: return "detached";
	default: return "unmounting";
	}
}

static const char *prefetch_name(int s)
{
	switch (s) {
	case PF_RUNNING: return "running";
	case PF_DONE: return "done";
	case PF_STOPPED: return "stopped";
	case PF_FAILED: return "failed";
	default: return "none";
	}
}

int serve_list(struct serve_ctx *ctx, struct ctl_mount_stats **out, size_t *nr)
{
	struct ctl_mount_stats *list = NULL, *e;
	struct image_cache_stats s;
	struct fmount *m;
	size_t n = 0, cap = 0;
	int ret = 0;

	pthread_mutex_lock(&ctx->lock);
	for (m = ctx->mounts; m && !ret; m = m->next) {
		if (array_reserve(&list, &cap, n + 1, sizeof(*list), 8)) {
			ret = -ENOMEM;
			break;
		}
		e = &list[n++];
		memset(e, 0, sizeof(*e));
		memset(&s, 0, sizeof(s));
		/* A mount being set up has its cache assigned (and maybe
		 * closed again) outside the table lock: no stats yet. */
		if (m->closed)
			s = m->final;
		else if (m->state != MS_MOUNTING && m->ic)
			image_cache_get_stats(m->ic, &s);
		e->mountpoint = strdup(m->mountpoint);
		e->image = strdup(m->req.image);
		e->cache_dir = strdup(m->req.cache_dir);
		if (!e->mountpoint || !e->image || !e->cache_dir)
			ret = -ENOMEM;
		snprintf(e->mode, sizeof(e->mode), "%s", m->mode->name);
		snprintf(e->domain, sizeof(e->domain), "%s", m->req.domain ? m->req.domain : "");
		snprintf(e->mode_reason, sizeof(e->mode_reason), "%s", m->mode_why);
		snprintf(e->state, sizeof(e->state), "%s", state_name(m->state));
		e->suid = m->req.suid;
		e->dev = m->req.dev;
		e->mounted_at = m->mounted_at;
		e->bytes_read = s.bytes_read;
		e->bytes_fetched = s.bytes_fetched;
		e->bytes_prefetched = s.bytes_prefetched;
		e->chunks_present = s.chunks_present;
		e->chunks_total = s.chunks_total;
		e->bytes_present = s.bytes_present;
		e->hits = s.hits;
		e->misses = s.misses;
		e->fetch_errors = s.fetch_errors;
		e->inflight = s.inflight;
		e->miss_ns_total = s.miss_ns_total;
		memcpy(e->miss_ms, s.miss_ms, sizeof(e->miss_ms));
		e->requests = s.requests;
		e->retries = s.retries;
		e->bytes_evicted = s.bytes_evicted;
		e->fetches = s.fetches;
		e->fetches_ahead = s.fetches_ahead;
		e->programs_recorded = s.programs_recorded;
		e->programs_read = s.programs_read;
		e->modules_read = s.modules_read;
		e->bytes_ahead = s.bytes_ahead;
		snprintf(e->prefetch, sizeof(e->prefetch), "%s",
			 prefetch_name(atomic_load(&m->pstate)));
		e->prefetch_files = atomic_load(&m->prefetch_files);
		e->prefetch_ms = (atomic_load(&m->prefetch_ns) + 500000) / 1000000;
		/* Its state exists from setup until the session closes. */
		if (m->state != MS_MOUNTING && m->mode_state && m->mode->stats)
			m->mode->stats(m->mode_state, e);
	}
	pthread_mutex_unlock(&ctx->lock);
	/* Freed with a list answer's mounts, also on failure. */
	*out = list;
	*nr = n;
	return ret;
}

int mounts_evicting(struct serve_ctx *ctx, const char *cache_dir)
{
	struct fmount *m;
	int ret = 0, err;

	pthread_mutex_lock(&ctx->lock);
	for (m = ctx->mounts; m; m = m->next)
		if (m->state != MS_MOUNTING && m->mode_state && m->mode->evicting &&
		    !strcmp(m->req.cache_dir, cache_dir) &&
		    (err = m->mode->evicting(m->mode_state)))
			ret = err;
	pthread_mutex_unlock(&ctx->lock);
	return ret;
}

size_t serve_count(struct serve_ctx *ctx)
{
	struct fmount *m;
	size_t n = 0;

	pthread_mutex_lock(&ctx->lock);
	for (m = ctx->mounts; m; m = m->next)
		n++;
	pthread_mutex_unlock(&ctx->lock);
	return n;
}

bool serve_keeper_succeeds(struct serve_ctx *ctx)
{
	struct fmount *m;
	bool found = false;

	pthread_mutex_lock(&ctx->lock);
	for (m = ctx->mounts; m; m = m->next)
		found |= m->mode->keeper_succeeds;
	pthread_mutex_unlock(&ctx->lock);
	return found;
}

void serve_quiesce(struct serve_ctx *ctx, bool early, unsigned int wait_ms)
{
	struct fmount *m, **list = NULL;
	size_t nr = 0, cap = 0, i, busy = 0;
	uint64_t t0 = ferry_now_ns();
	struct timespec ts;

	pthread_mutex_lock(&ctx->lock);
	for (m = ctx->mounts; m; m = m->next) {
		if (m->state != MS_LIVE || m->session_closed || !m->mode->quiesce ||
		    atomic_load(&m->quiesced) || (early && !m->mode->quiesce_early) ||
		    array_reserve(&list, &cap, nr + 1, sizeof(*list), 8))
			continue;
		/* A quiesced mount is never unlinked or freed: no reference. */
		atomic_store(&m->quiesced, true);
		m->mode->quiesce(m->mode_state);
		list[nr++] = m;
	}
	pthread_mutex_unlock(&ctx->lock);
	ferry_deadline_ts(&ts, wait_ms);
	for (i = 0; i < nr; i++) {
		pthread_mutex_lock(&list[i]->lock);
		while (!list[i]->loop_ended &&
		       pthread_cond_timedwait(&list[i]->cond, &list[i]->lock, &ts) != ETIMEDOUT)
			;
		busy += !list[i]->loop_ended;
		pthread_mutex_unlock(&list[i]->lock);
	}
	if (early && nr)
		ferry_info("%zu mounts stopped reading requests before the new ferryd starts (%llu ms)",
			   nr - busy, (unsigned long long)((ferry_now_ns() - t0) / 1000000));
	else if (!early)
		ferry_info("%zu mounts stopped taking requests in %llu ms%s", nr - busy,
			   (unsigned long long)((ferry_now_ns() - t0) / 1000000),
			   busy ? "; the others still answer one (their successor resends it)" : "");
	free(list);
}

size_t serve_shutdown(struct serve_ctx *ctx)
{
	struct fmount *m, **list = NULL;
	size_t nr = 0, cap = 0, i, left = 0;
	bool *force = NULL, pending;
	uint64_t deadline = ferry_now_ns() + SHUTDOWN_WAIT_MS * 1000000ull;
	struct timespec ts;

	pthread_mutex_lock(&ctx->lock);
	ctx->shutting_down = true;
	for (m = ctx->mounts; m; m = m->next) {
		/* Mounts being set up: their handler sees shutting_down.
		 * Closed sessions only wait for a prefetch step to stop. */
		if (m->state == MS_MOUNTING || m->session_closed)
			continue;
		if (array_reserve(&list, &cap, nr + 1, sizeof(*list), 8))
			break;
		m->refs++;
		m->state = MS_STOPPING;
		list[nr++] = m;
	}
	pthread_mutex_unlock(&ctx->lock);
	force = calloc(nr + 1, sizeof(*force));

	for (i = 0; i < nr; i++) {
		m = list[i];
		ferry_info("unmounting %s from %s", m->req.image, m->mountpoint);
		if (on_top(m)) {
			if (!umount_nofollow(m->mountpoint, 0))
				continue; /* its loop ends with ENODEV */
			ferry_warn("%s: %s; detaching it and ending its session",
				   m->mountpoint, strerror(errno));
			if (umount_nofollow(m->mountpoint, MNT_DETACH))
				ferry_warn("%s: detach: %s", m->mountpoint, strerror(errno));
		}
		/* Detached (busy, or by ferry umount --lazy): its users get
		 * what the mode's end leaves them (FUSE: ENOTCONN). */
		if (force)
			force[i] = true;
		else
			force_end(m, 20);
	}
	/* Every session at once, within one deadline. */
	for (;;) {
		pending = false;
		for (i = 0; i < nr; i++) {
			/* A closed session may still wait for a prefetch
			 * step: nothing left for the kernel, no need to wait. */
			pthread_mutex_lock(&ctx->lock);
			m = list[i]->removed || list[i]->session_closed ? NULL : list[i];
			pthread_mutex_unlock(&ctx->lock);
			if (m && force && force[i])
				poke(m);
			pending |= m != NULL;
		}
		pthread_mutex_lock(&ctx->lock);
		/* Mounts still being set up stop on their own (shutting_down). */
		for (m = ctx->mounts; m; m = m->next)
			pending |= m->state == MS_MOUNTING;
		if (pending && ferry_now_ns() < deadline) {
			ferry_deadline_ts(&ts, 20);
			pthread_cond_timedwait(&ctx->cond, &ctx->lock, &ts);
		}
		pthread_mutex_unlock(&ctx->lock);
		if (!pending || ferry_now_ns() >= deadline)
			break;
	}
	pthread_mutex_lock(&ctx->lock);
	for (m = ctx->mounts; m; m = m->next, left++)
		if (!m->session_closed)
			ferry_warn("%s: its session is still busy (%s; a fetch in flight?); exiting anyway",
				   m->mountpoint, state_name(m->state));
	for (i = 0; i < nr; i++)
		mount_put_locked(list[i]);
	pthread_mutex_unlock(&ctx->lock);
	free(force);
	free(list);
	return left;
}
