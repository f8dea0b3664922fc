// SPDX-License-Identifier: MIT
/*
 * The mount table. Each mount has a session thread running its loop:
 * fuse_session_loop_mt (FUSE mode) or fan_run (fanotify mode). When the
 * loop ends — unmounted from outside (FUSE workers read ENODEV; the
 * fanotify superblock is gone), by ferry umount (ferryd's own umount2,
 * same path), or forced at shutdown — that thread tears the mount down:
 * stops prefetch, closes the session, the chunk cache and the image, and
 * takes the mount out of the table. Other mounts keep running.
 *
 * Locking: tbl_lock guards the list, refs and state; m->lock guards the
 * session thread's progress flags. A mount is freed at its last ref
 * (the table's, the session thread's, and any request handling it).
 */
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fanotify.h"
#include "ferryd.h"

#define INIT_TIMEOUT_MS 10000     /* mount(2) to the INIT request */
#define UMOUNT_WAIT_MS 5000       /* umount until the mount is torn down */
#define FORCE_WAIT_MS 10000       /* forced stop of a session that never ran */
#define SHUTDOWN_WAIT_MS 5000     /* every session ended at shutdown */

static pthread_mutex_t tbl_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t tbl_cond = PTHREAD_COND_INITIALIZER;
static struct fmount *mounts;
static bool shutting_down;
static unsigned int loop_threads = FERRYD_DEFAULT_THREADS;
static unsigned int readahead_kb = FERRYD_DEFAULT_READAHEAD_KB;
static unsigned int dir_readahead_kb = FERRYD_DEFAULT_DIR_READAHEAD_KB;
static void (*changed_cb)(void);

/* Wakes a session loop blocked in sem_wait (see force_end). */
static void wake_handler(int sig)
{
	(void)sig;
}

void mounts_init(unsigned int threads, unsigned int ra_kb, unsigned int dir_ra_kb,
		 void (*on_change)(void))
{
	struct sigaction sa = { .sa_handler = wake_handler };

	loop_threads = threads;
	readahead_kb = ra_kb;
	dir_readahead_kb = dir_ra_kb;
	changed_cb = on_change;
	/* No SA_RESTART: the loop's sem_wait must return EINTR. */
	sigemptyset(&sa.sa_mask);
	sigaction(SIGUSR2, &sa, NULL);
}

static void deadline_ts(struct timespec *ts, unsigned int ms)
{
	clock_gettime(CLOCK_REALTIME, ts);
	ts->tv_sec += ms / 1000;
	ts->tv_nsec += (long)(ms % 1000) * 1000000;
	if (ts->tv_nsec >= 1000000000) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000;
	}
}

/* Drop @n references; the last one frees. */
static void mount_put_locked_n(struct fmount *m, unsigned int n)
{
	m->refs -= n;
	if (m->refs)
		return;
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
	pthread_mutex_lock(&tbl_lock);
	mount_put_locked(m);
	pthread_mutex_unlock(&tbl_lock);
}

/*
 * The mount on @mountpoint. One being torn down (unmounted already, its
 * session finishing a fetch) only when there is no other: a new mount
 * may take the mount point meanwhile.
 */
static struct fmount *find_locked(const char *mountpoint, bool stopping_too)
{
	struct fmount *m, *stopping = NULL;

	for (m = mounts; m; m = m->next) {
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

	for (pp = &mounts; *pp; pp = &(*pp)->next) {
		if (*pp == m) {
			*pp = m->next;
			break;
		}
	}
	m->removed = true;
	pthread_cond_broadcast(&tbl_cond);
}

static void notify_change(void)
{
	if (changed_cb)
		changed_cb();
}

/* Whether our mount is what sits on top of its mount point. */
static bool on_top(const struct fmount *m)
{
	struct ctl_mnt mi;

	return !ctl_mountinfo(m->mountpoint, &mi) && mi.major == m->dev_major &&
	       mi.minor == m->dev_minor &&
	       !strcmp(mi.fstype, m->req.fanotify ? "erofs" : CTL_FUSE_FSTYPE);
}

/* The connection to the kernel is gone (unmounted, or aborted). */
static bool conn_dead(struct fuse_session *se)
{
	struct pollfd pfd = { .fd = fuse_session_fd(se), .events = 0 };

	return pfd.fd < 0 || (poll(&pfd, 1, 0) == 1 && (pfd.revents & POLLERR));
}

/*
 * Close the session: detach our mount if it is still where we put it
 * (never whatever else is mounted there by now), then closing /dev/fuse
 * ends the connection: programs with files open get ENOTCONN. A fanotify
 * loop ends once its superblock is gone; if it ended for an error or a
 * forced stop, a mount still in use is left to its keeper (EIO).
 */
static void session_close(struct fmount *m, int loop_ret)
{
	struct fan *f;

	if (m->req.fanotify) {
		if (loop_ret && on_top(m) && umount2(m->mountpoint, MNT_DETACH))
			ferry_warn("%s: detaching %s: %s", m->img->ref, m->mountpoint,
				   strerror(errno));
		pthread_mutex_lock(&tbl_lock);
		f = m->fan;
		m->fan = NULL;
		pthread_mutex_unlock(&tbl_lock);
		fan_close(f);
		return;
	}
	if (!conn_dead(m->se) && on_top(m) && umount2(m->mountpoint, MNT_DETACH))
		ferry_warn("%s: detaching %s: %s", m->img->ref, m->mountpoint,
			   strerror(errno));
	fs_session_destroy(&m->fs, m->se);
	m->se = NULL;
}

static void on_init(void *arg)
{
	struct fmount *m = arg;

	pthread_mutex_lock(&m->lock);
	m->init_done = true;
	pthread_cond_broadcast(&m->cond);
	pthread_mutex_unlock(&m->lock);
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

/* The FUSE session loop, multithreaded. */
static int fuse_loop(struct fmount *m)
{
	struct fuse_loop_config *cfg = fuse_loop_cfg_create();
	int ret;

	if (!cfg) {
		ferry_err("%s on %s: out of memory", m->req.image, m->mountpoint);
		return -ENOMEM;
	}
	fuse_loop_cfg_set_max_threads(cfg, loop_threads);
	fuse_loop_cfg_set_clone_fd(cfg, 1);
	ret = fuse_session_loop_mt(m->se, cfg);
	fuse_loop_cfg_destroy(cfg);
	return ret;
}

static void *session_main(void *arg)
{
	struct fmount *m = arg;
	struct image_cache_stats s;
	sigset_t set;
	int ret;

	/* Only this thread takes SIGUSR2, the wake-up of force_end. */
	sigemptyset(&set);
	sigaddset(&set, SIGUSR2);
	pthread_sigmask(SIG_UNBLOCK, &set, NULL);
	ret = m->fan ? fan_run(m->fan) : fuse_loop(m);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	pthread_mutex_lock(&m->lock);
	m->loop_ended = true;
	pthread_cond_broadcast(&m->cond);
	pthread_mutex_unlock(&m->lock);
	if (ret)
		ferry_warn("%s on %s: %s loop: %s", m->req.image, m->mountpoint,
			   m->req.fanotify ? "fanotify" : "FUSE session",
			   ret < 0 ? ferry_strerror(ret) : "stopped");

	/* The prefetch thread may sleep in its bandwidth pacing: the
	 * session (and the umount waiting for it) ends first. */
	m->stop = true;
	session_close(m, ret);
	pthread_mutex_lock(&tbl_lock);
	m->session_closed = true;
	pthread_cond_broadcast(&tbl_cond);
	pthread_mutex_unlock(&tbl_lock);
	if (m->prefetch_started)
		pthread_join(m->prefetch_thread, NULL);
	fs_teardown(&m->fs);

	pthread_mutex_lock(&tbl_lock);
	if (m->state != MS_STOPPING && !shutting_down)
		ferry_info("%s was unmounted from outside ferryd", m->mountpoint);
	image_cache_get_stats(m->ic, &m->final);
	m->closed = true;
	s = m->final;
	pthread_mutex_unlock(&tbl_lock);

	image_cache_close(m->ic);
	image_close(m->img);
	m->ic = NULL;
	m->img = NULL;
	log_final(m, &s);

	pthread_mutex_lock(&tbl_lock);
	unlink_locked(m);
	mount_put_locked_n(m, 2); /* the table's and ours */
	pthread_mutex_unlock(&tbl_lock);
	notify_change();
	return NULL;
}

/*
 * Ask a session loop that no unmount will end (busy mount at shutdown,
 * INIT never came) to stop: flag the session as exited and interrupt the
 * loop's sem_wait. Repeated by the callers, since a signal that lands
 * before the loop waits is lost. True once the loop has ended. A worker
 * inside a fetch finishes it first (bounded by the fetch timeouts).
 */
static bool poke(struct fmount *m)
{
	bool ended;

	pthread_mutex_lock(&m->lock);
	/* Until loop_ended is set (under this lock) the session exists. */
	if (!m->loop_ended && m->fan) {
		fan_stop(m->fan);
	} else if (!m->loop_ended) {
		fuse_session_exit(m->se);
		pthread_kill(m->loop_thread, SIGUSR2);
	}
	ended = m->loop_ended;
	pthread_mutex_unlock(&m->lock);
	return ended;
}

static void force_end(struct fmount *m, unsigned int ms)
{
	struct timespec ts;
	unsigned int waited;

	for (waited = 0; !poke(m) && waited < ms; waited += 20) {
		pthread_mutex_lock(&m->lock);
		deadline_ts(&ts, 20);
		if (!m->loop_ended)
			pthread_cond_timedwait(&m->cond, &m->lock, &ts);
		pthread_mutex_unlock(&m->lock);
	}
}

/* Wait (bounded) until @m's FUSE session has ended; tbl_lock held. */
static bool wait_session_locked(struct fmount *m, unsigned int ms)
{
	struct timespec ts;

	deadline_ts(&ts, ms);
	while (!m->session_closed && !m->removed)
		if (pthread_cond_timedwait(&tbl_cond, &tbl_lock, &ts) == ETIMEDOUT)
			break;
	return m->session_closed || m->removed;
}

/*
 * Make the FUSE bdi's readahead match chunk-sized reads (the kernel offers
 * 128 KiB): fewer, larger FUSE requests. Fanotify mounts are the kernel's
 * EROFS reading local files, like local mounts: they keep its default.
 */
static void set_readahead(const struct fmount *m)
{
	char path[64], val[16];
	int fd, n;

	if (!readahead_kb)
		return;
	snprintf(path, sizeof(path), "/sys/class/bdi/%u:%u/read_ahead_kb",
		 m->dev_major, m->dev_minor);
	n = snprintf(val, sizeof(val), "%u", readahead_kb);
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0 || write_full(fd, val, (size_t)n))
		ferry_dbg("%s: cannot set %s: %s", m->mountpoint, path, strerror(errno));
	if (fd >= 0)
		close(fd);
}

static int check_mountpoint(const char *path, char **canon, char *err,
			    size_t errlen)
{
	struct ctl_mnt mi;
	struct stat st;

	*canon = realpath(path, NULL);
	if (!*canon) {
		int e = errno;

		if (e == ENOTCONN)
			snprintf(err, errlen, "mount point %s: %s (a dead FUSE mount: run ferry umount %s first)",
				 path, strerror(e), path);
		else
			snprintf(err, errlen, "mount point %s: %s", path, strerror(e));
		return -e;
	}
	if (stat(*canon, &st) || !S_ISDIR(st.st_mode)) {
		snprintf(err, errlen, "mount point %s: not a directory", path);
		return -ENOTDIR;
	}
	if (!ctl_mountinfo(*canon, &mi) && !strcmp(mi.fstype, CTL_FUSE_FSTYPE)) {
		snprintf(err, errlen, "%s is already a ferry mount (%s); ferry umount it first",
			 *canon, mi.source);
		return -EBUSY;
	}
	return 0;
}

/* The captured error lines, else @fallback with the errno. */
static void set_err(char *err, size_t errlen, const struct log_capture *c,
		    int ret, const char *fallback)
{
	if (c->len)
		snprintf(err, errlen, "%s: %s", fallback, c->text);
	else
		snprintf(err, errlen, "%s: %s", fallback, ferry_strerror(ret));
}

int mounts_mount(struct ctl_mount_req *req, char *err, size_t errlen)
{
	struct fmount *m = calloc(1, sizeof(*m));
	struct log_capture cap;
	struct ctl_mnt mi;
	char what[512];
	pthread_attr_t attr;
	int ret;

	if (!m) {
		ctl_mount_req_free(req);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	m->req = *req;
	memset(req, 0, sizeof(*req));
	pthread_mutex_init(&m->lock, NULL);
	pthread_cond_init(&m->cond, NULL);
	m->refs = 1;
	ret = check_mountpoint(m->req.mountpoint, &m->mountpoint, err, errlen);
	if (ret) {
		ferry_err("mount %s: %s", m->req.image, err);
		mount_put(m);
		return ret;
	}
	snprintf(what, sizeof(what), "mount %s on %s", m->req.image, m->mountpoint);

	pthread_mutex_lock(&tbl_lock);
	if (shutting_down) {
		ret = -ESHUTDOWN;
		snprintf(err, errlen, "%s: ferryd is shutting down", what);
	} else if (find_locked(m->mountpoint, false)) {
		ret = -EBUSY;
		snprintf(err, errlen, "%s: %s is already mounted by this ferryd (%s)",
			 what, m->mountpoint, find_locked(m->mountpoint, false)->req.image);
	} else {
		m->state = MS_MOUNTING;
		m->next = mounts;
		mounts = m;
		m->refs++;
	}
	pthread_mutex_unlock(&tbl_lock);
	if (ret) {
		ferry_err("%s", err);
		mount_put(m);
		return ret;
	}
	ferry_info("mounting %s on %s (cache %s)", m->req.image, m->mountpoint,
		   m->req.cache_dir);

	log_capture_begin(&cap);
	ret = image_open(m->req.image, &(struct image_opts){ .fetch = &m->req.fetch },
			 &m->img);
	if (ret) {
		set_err(err, errlen, &cap, ret, what);
		goto fail;
	}
	ret = image_cache_open(m->img, m->req.cache_dir, &m->ic);
	if (ret) {
		snprintf(what, sizeof(what), "%s: chunk cache %s", m->req.image,
			 m->req.cache_dir);
		set_err(err, errlen, &cap, ret, what);
		goto fail;
	}
	fs_setup(&m->fs, m->img, m->ic);
	if (m->req.fanotify) {
		char why[1024];

		ret = fan_start(m, why, sizeof(why));
		if (ret) {
			snprintf(err, errlen, "%s: %s", what, why);
			goto fail;
		}
		m->init_done = true; /* the kernel mount is live already */
		goto mounted;
	}
	m->fs.on_init = on_init;
	m->fs.arg = m;
	m->fs.dra_window_max = dir_readahead_kb << 10;
	m->se = fs_session_new(&m->fs);
	if (!m->se) {
		ret = -EIO;
		set_err(err, errlen, &cap, ret, what);
		goto fail;
	}
	ret = fs_mount(&m->fs, m->se, m->mountpoint);
	if (ret) {
		snprintf(what, sizeof(what), "%s: FUSE mount on %s failed", m->req.image,
			 m->mountpoint);
		set_err(err, errlen, &cap, ret, what);
		fs_session_destroy(&m->fs, m->se);
		m->se = NULL;
		goto fail;
	}
mounted:
	log_capture_end(&cap);
	/* Our mount's device, to recognise it later without touching it. */
	if (!ctl_mountinfo(m->mountpoint, &mi)) {
		m->dev_major = mi.major;
		m->dev_minor = mi.minor;
	}
	m->mounted_at = (int64_t)time(NULL);

	pthread_mutex_lock(&tbl_lock);
	m->refs++; /* the session thread's */
	pthread_mutex_unlock(&tbl_lock);
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	ret = -pthread_create(&m->loop_thread, &attr, session_main, m);
	pthread_attr_destroy(&attr);
	if (ret) {
		mount_put(m);
		snprintf(err, errlen, "%s: cannot start the session thread: %s", what,
			 strerror(-ret));
		session_close(m, ret);
		goto fail_nocap;
	}

	/* Answer only once the kernel has sent INIT: the mount is live. */
	pthread_mutex_lock(&m->lock);
	{
		struct timespec ts;

		deadline_ts(&ts, INIT_TIMEOUT_MS);
		while (!m->init_done && !m->loop_ended)
			if (pthread_cond_timedwait(&m->cond, &m->lock, &ts) == ETIMEDOUT)
				break;
	}
	if (m->init_done && !m->loop_ended && m->req.nr_prefetch_files +
	    m->img->nr_prefetch + m->req.prefetch_all) {
		atomic_store(&m->pstate, PF_RUNNING);
		if (pthread_create(&m->prefetch_thread, NULL, prefetch_main, m)) {
			ferry_warn("%s: cannot start the prefetch thread", what);
			atomic_store(&m->pstate, PF_FAILED);
		} else {
			m->prefetch_started = true;
		}
	}
	ret = m->init_done ? 0 : -ETIMEDOUT;
	if (m->loop_ended)
		ret = -EIO;
	pthread_mutex_unlock(&m->lock);

	pthread_mutex_lock(&tbl_lock);
	if (!ret && shutting_down)
		ret = -ESHUTDOWN;
	if (!ret)
		m->state = MS_LIVE;
	else
		m->state = MS_STOPPING;
	pthread_mutex_unlock(&tbl_lock);
	if (ret) {
		snprintf(err, errlen, "%s: %s", what,
			 ret == -ETIMEDOUT ? "the kernel did not start the FUSE session" :
			 ret == -ESHUTDOWN ? "ferryd is shutting down" :
					     "the FUSE session ended at once");
		if (!m->loop_ended && on_top(m) && umount2(m->mountpoint, MNT_DETACH))
			ferry_warn("%s: detaching %s: %s", m->req.image, m->mountpoint,
				   strerror(errno));
		ferry_err("%s", err);
		force_end(m, FORCE_WAIT_MS);
		mount_put(m);
		return ret;
	}
	if (!m->req.fanotify)
		set_readahead(m);
	ferry_info("mounted %s on %s (%s, %u blobs, %llu bytes; %s)", m->req.image,
		   m->mountpoint, m->req.fanotify ? "fanotify" : "FUSE",
		   m->img->blobs.nr_blobs, (unsigned long long)m->fs.total_bytes,
		   atomic_load(&m->pstate) == PF_RUNNING ? "prefetching" : "no prefetch");
	mount_put(m);
	notify_change();
	return 0;

fail:
	log_capture_end(&cap);
fail_nocap:
	ferry_err("%s", err);
	if (m->fs.img)
		fs_teardown(&m->fs);
	image_cache_close(m->ic);
	image_close(m->img);
	m->ic = NULL;
	m->img = NULL;
	pthread_mutex_lock(&tbl_lock);
	m->closed = true;
	unlink_locked(m);
	mount_put_locked_n(m, 2); /* the table's and the handler's */
	pthread_mutex_unlock(&tbl_lock);
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
	pthread_mutex_lock(&tbl_lock);
	m->state = s;
	pthread_mutex_unlock(&tbl_lock);
}

int mounts_umount(const char *mountpoint, bool lazy, char *err, size_t errlen)
{
	enum mount_state state;
	struct ctl_mnt mi;
	struct fmount *m;
	char *canon = NULL;
	int ret = 0, e;

	pthread_mutex_lock(&tbl_lock);
	m = find_locked(mountpoint, true);
	if (!m) {
		/* The client's path may not be canonical; ours is. */
		pthread_mutex_unlock(&tbl_lock);
		canon = realpath(mountpoint, NULL);
		pthread_mutex_lock(&tbl_lock);
		m = canon ? find_locked(canon, true) : NULL;
	}
	free(canon);
	if (!m) {
		pthread_mutex_unlock(&tbl_lock);
		snprintf(err, errlen, "%s: not mounted by this ferryd", mountpoint);
		return -ENOENT;
	}
	state = m->state;
	if (state == MS_MOUNTING) {
		pthread_mutex_unlock(&tbl_lock);
		snprintf(err, errlen, "%s: still being mounted (%s)", m->mountpoint,
			 m->req.image);
		return -EBUSY;
	}
	m->refs++;
	pthread_mutex_unlock(&tbl_lock);

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
		e = umount2(m->mountpoint, 0) ? errno : 0;
		if (!e || (e == EINVAL && !dev_mounted(m))) {
			/* Its session loop ends with ENODEV (EINVAL: a racing
			 * umount was first). */
		} else if (e == EBUSY && lazy) {
			if (umount2(m->mountpoint, MNT_DETACH)) {
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
			 ctl_mountinfo(m->mountpoint, &mi) ? "?" : mi.fstype);
		goto out;
	}
	/* Unmounted: the session loop ends (ENODEV) and tears it down. A
	 * worker in a stalled fetch delays that, not the answer: the mount
	 * is gone already. */
	pthread_mutex_lock(&tbl_lock);
	if (!wait_session_locked(m, UMOUNT_WAIT_MS))
		ferry_info("%s: unmounted; its session ends once a fetch in flight does",
			   m->mountpoint);
	pthread_mutex_unlock(&tbl_lock);
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

static void add_u64(struct json_object *o, const char *key, uint64_t v)
{
	json_object_object_add(o, key, json_object_new_uint64(v));
}

struct json_object *mounts_list(void)
{
	struct json_object *arr = json_object_new_array(), *o;
	struct image_cache_stats s;
	struct fmount *m;
	char secs[32];

	if (!arr)
		return NULL;
	pthread_mutex_lock(&tbl_lock);
	for (m = mounts; m; m = m->next) {
		o = json_object_new_object();
		if (!o)
			break;
		memset(&s, 0, sizeof(s));
		/* A mount being set up has its cache assigned (and maybe
		 * closed again) outside the table lock: no stats yet. */
		if (m->closed)
			s = m->final;
		else if (m->state != MS_MOUNTING && m->ic)
			image_cache_get_stats(m->ic, &s);
		json_object_object_add(o, "mountpoint", json_object_new_string(m->mountpoint));
		json_object_object_add(o, "image", json_object_new_string(m->req.image));
		json_object_object_add(o, "cacheDir", json_object_new_string(m->req.cache_dir));
		json_object_object_add(o, "mode", json_object_new_string(m->req.fanotify ?
								      "fanotify" : "fuse"));
		if (m->fan)
			json_object_object_add(o, "keeperPid",
					       json_object_new_int(fan_keeper_pid(m->fan)));
		json_object_object_add(o, "state", json_object_new_string(state_name(m->state)));
		json_object_object_add(o, "mountedAt", json_object_new_int64(m->mounted_at));
		add_u64(o, "bytesRead", s.bytes_read);
		add_u64(o, "bytesFetched", s.bytes_fetched);
		add_u64(o, "bytesPrefetched", s.bytes_prefetched);
		add_u64(o, "chunksPresent", s.chunks_present);
		add_u64(o, "chunksTotal", s.chunks_total);
		add_u64(o, "bytesPresent", s.bytes_present);
		json_object_object_add(o, "prefetch",
				       json_object_new_string(prefetch_name(atomic_load(&m->pstate))));
		add_u64(o, "prefetchFiles", atomic_load(&m->prefetch_files));
		add_u64(o, "readaheadFiles", atomic_load(&m->fs.ra_files));
		add_u64(o, "readaheadBytes", atomic_load(&m->fs.ra_bytes));
		snprintf(secs, sizeof(secs), "%.3f",
			 (double)atomic_load(&m->prefetch_ns) / 1e9);
		json_object_object_add(o, "prefetchSeconds",
				       json_object_new_double_s(strtod(secs, NULL), secs));
		json_object_array_add(arr, o);
	}
	pthread_mutex_unlock(&tbl_lock);
	return arr;
}

size_t mounts_count(void)
{
	struct fmount *m;
	size_t n = 0;

	pthread_mutex_lock(&tbl_lock);
	for (m = mounts; m; m = m->next)
		n++;
	pthread_mutex_unlock(&tbl_lock);
	return n;
}

size_t mounts_shutdown(void)
{
	struct fmount *m, **list = NULL;
	size_t nr = 0, cap = 0, i, left = 0;
	bool *force = NULL, pending;
	uint64_t deadline = ferry_now_ns() + SHUTDOWN_WAIT_MS * 1000000ull;
	struct timespec ts;

	pthread_mutex_lock(&tbl_lock);
	shutting_down = true;
	for (m = mounts; m; m = m->next) {
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
	pthread_mutex_unlock(&tbl_lock);
	force = calloc(nr + 1, sizeof(*force));

	for (i = 0; i < nr; i++) {
		m = list[i];
		ferry_info("unmounting %s from %s", m->req.image, m->mountpoint);
		if (on_top(m)) {
			if (!umount2(m->mountpoint, 0))
				continue; /* its loop ends with ENODEV */
			ferry_warn("%s: %s; detaching it and ending its FUSE connection",
				   m->mountpoint, strerror(errno));
			if (umount2(m->mountpoint, MNT_DETACH))
				ferry_warn("%s: detach: %s", m->mountpoint, strerror(errno));
		}
		/* Detached (busy, or by ferry umount --lazy): users of open
		 * files get ENOTCONN once the connection closes. */
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
			pthread_mutex_lock(&tbl_lock);
			m = list[i]->removed || list[i]->session_closed ? NULL : list[i];
			pthread_mutex_unlock(&tbl_lock);
			if (m && force && force[i])
				poke(m);
			pending |= m != NULL;
		}
		pthread_mutex_lock(&tbl_lock);
		/* Mounts still being set up stop on their own (shutting_down). */
		for (m = mounts; m; m = m->next)
			pending |= m->state == MS_MOUNTING;
		if (pending && ferry_now_ns() < deadline) {
			deadline_ts(&ts, 20);
			pthread_cond_timedwait(&tbl_cond, &tbl_lock, &ts);
		}
		pthread_mutex_unlock(&tbl_lock);
		if (!pending || ferry_now_ns() >= deadline)
			break;
	}
	pthread_mutex_lock(&tbl_lock);
	for (m = mounts; m; m = m->next, left++)
		if (!m->session_closed)
			ferry_warn("%s: its session is still busy (%s; a fetch in flight?); exiting anyway",
				   m->mountpoint, state_name(m->state));
	for (i = 0; i < nr; i++)
		mount_put_locked(list[i]);
	pthread_mutex_unlock(&tbl_lock);
	free(force);
	free(list);
	return left;
}
