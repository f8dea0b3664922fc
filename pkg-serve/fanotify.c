// SPDX-License-Identifier: MIT
/*
 * Fanotify mode: the kernel mounts the bootstrap (file-backed EROFS) with
 * one device= per blob naming its sparse chunk-cache data file, both
 * through the descriptors ferryd verified and holds (image_cache_kernel_mount,
 * nosuid,nodev unless the request trusts the image), and every
 * read of a missing range of a data file raises a FAN_PRE_ACCESS event
 * that waits until ferryd has filled the range (fetch, decode, verify,
 * write: image_cache_ensure, the same path as FUSE mode) and answered.
 *
 * The kernel only reads metadata from the bootstrap (without events), so
 * the bootstrap is a complete local file and only data files are marked.
 *
 * Fail-open is the danger: when the last descriptor of the group closes,
 * the kernel allows every pending event and later reads see holes as
 * zeros. So each mount has a keeper process (keeper.c) that holds a second
 * descriptor of the group and does nothing while ferryd lives. If ferryd
 * dies, the keeper hands the group to a new ferryd (keeper_handover),
 * whose fan_start takes the mount over (no mount(2)); only if none takes
 * it does the keeper answer EIO to every event still pending and to every
 * later one until the superblock is gone. If the keeper dies, this side
 * starts a new one. Either way no reader is ever allowed onto a hole.
 *
 * The kernel matches an answer to an event by the descriptor number the
 * reader got, and keeps events a dead ferryd had read (and not answered)
 * until the group closes: nothing else identifies them. So every
 * pre-content event read is journaled, by descriptor number, in a shared
 * file next to the control socket (struct fan_slot: blob and range) until
 * it is answered. A successor holds each journaled number, so that no
 * event of its own gets it (taken at its start, fan_startup, before the
 * takeovers of other mounts open files that would get it; an upgrade
 * stops reading events before it starts the successor, so the journal
 * found then is the last), fills the range and answers the number; an
 * entry of an event already answered gets ENOENT (a number is reused only
 * after its answer, and a new event overwrites the entry). Numbers
 * without an entry (an event read in the instant before its entry was
 * written) are answered EIO before the successor reads any event
 * (journal_replay).
 *
 * Threads of a mount: the loop thread (fan_serve) reads events, answers
 * present ranges at once and queues the rest to worker threads.
 */
#include <dirent.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/fanotify.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>
#include <linux/magic.h>

#include "fanotify.h"
#include "internal.h"

#define FAN_WORKERS 8u           /* fills in flight per mount */
#define FAN_NOFILE_WANT 65536u   /* every pending event holds a descriptor */
#define SB_CHECK_MS 200          /* how often the loop looks for the superblock */
#define FAN_RESERVE_S 30         /* a successor's reserved numbers, unclaimed */

extern const struct serve_mode fanotify_mode;

/*
 * The mode's own state in a serving context: the numbers of the dead
 * ferryd's pending reads (every fanotify journal next to the socket),
 * taken at our start (fan_startup), before the takeovers of other mounts
 * open files that would get them; journal_replay claims them and the
 * expiry thread closes the rest. A number we use by then already could
 * only be denied (see journal_replay).
 */
struct fan_ctx {
	pthread_mutex_t lock;
	pthread_cond_t cond;   /* quit */
	uint8_t *reserved;     /* FAN_JOURNAL_SLOTS, non-zero: ours; lock */
	bool quit;             /* lock: fini */
	pthread_t expire;
	bool expire_started;
};

/*
 * The journal's entry for descriptor number N (see the top): written when
 * the event is read, cleared once answered. Little-endian, host-local,
 * read by successors of other releases (docs/FORMAT.md, section 6): its
 * blob is the EROFS device id, converted only in journal_put and
 * journal_get.
 */
struct fan_slot {
	_Atomic uint32_t used;
	uint32_t device_id; /* blob index + 1; 0: an event allowed at once */
	uint64_t off, len;
};
_Static_assert(sizeof(struct fan_slot) == 24 && offsetof(struct fan_slot, device_id) == 4 &&
	       offsetof(struct fan_slot, off) == 8 && offsetof(struct fan_slot, len) == 16,
	       "journal entry layout (docs/FORMAT.md, section 6)");
#define FAN_JOURNAL_SLOTS 65536u

/* A read to fill: an event's range of a blob, or a journal entry's. */
struct fan_job {
	struct fan_job *next;
	int fd;            /* the event's descriptor: the answer names it */
	uint32_t blob;     /* blob index */
	uint64_t off, len;
};

struct fan_blob {
	dev_t dev;
	ino_t ino;
	uint64_t size;
	_Atomic bool marked;
};

struct fan {
	struct fmount *m;
	int group;                  /* the fanotify group */
	int keeper_sock;            /* SOCK_SEQPACKET to the keeper */
	_Atomic int keeper_pid;
	int wake[2];                /* fan_stop wakes the loop */
	char sysfs[160];            /* /sys/fs/erofs/<name> while mounted */
	char source[32];            /* the mount's source: our bootstrap descriptor */
	unsigned int sweep_max;     /* our descriptor limit, for the keeper */
	uint32_t nr_blobs;
	struct fan_blob *blobs;
	struct ferry_exes exes;     /* fills, never readers */
	struct fan_slot *journal;   /* FAN_JOURNAL_SLOTS, shared with successors */
	char *journal_path;         /* removed with the superblock */
	struct fan_ctx *fc;
	_Atomic bool stop;
	bool mounted;
	uint64_t evbuf[4096];       /* read(): aligned for the metadata */

	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct fan_job *head, **tail;  /* lock */
	bool quit;                     /* lock */
	pthread_t workers[FAN_WORKERS];
	unsigned int nr_workers;
};

/* ------------------------------------------------------------------ */
/* Answers                                                             */
/* ------------------------------------------------------------------ */

/* Journal event @fd: the read @j (its fd), or NULL for one allowed at once. */
static void journal_put(struct fan *f, int fd, const struct fan_job *j)
{
	struct fan_slot *s;

	if (!f->journal || fd < 0 || (unsigned int)fd >= FAN_JOURNAL_SLOTS)
		return;
	s = &f->journal[fd];
	s->device_id = j ? j->blob + 1 : 0;
	s->off = j ? j->off : 0;
	s->len = j ? j->len : 0;
	atomic_store_explicit(&s->used, 1, memory_order_release);
}

static void respond(struct fan *f, int fd, bool allow)
{
	struct fanotify_response r = {
		.fd = fd,
		.response = allow ? FAN_ALLOW : FAN_DENY_ERRNO(EIO),
	};

	/* ENOENT: the event is no longer pending; nothing to answer. */
	if (write(f->group, &r, sizeof(r)) != sizeof(r) && errno != ENOENT)
		ferry_warn("%s: answering a fanotify event: %s", f->m->mountpoint,
			   strerror(errno));
}

/* Answer, forget the entry, then free the number (see the top). */
static void answer(struct fan *f, int fd, bool allow)
{
	respond(f, fd, allow);
	if (f->journal && (unsigned int)fd < FAN_JOURNAL_SLOTS)
		atomic_store_explicit(&f->journal[fd].used, 0, memory_order_release);
	close(fd);
}

/* Remove the mark of a complete blob: its reads need no events now. */
static void unmark_if_complete(struct fan *f, uint32_t blob)
{
	struct fan_blob *b = &f->blobs[blob];
	const char *path = image_cache_data_path(f->m->ic, blob);

	if (!atomic_load(&b->marked))
		return;
	/* Not while eviction may punch it (fan_evicting marked it for that). */
	evict_marks_lock(f->m->ctx);
	if (!image_cache_blob_complete(f->m->ic, blob) ||
	    !atomic_exchange(&b->marked, false)) {
		evict_marks_unlock(f->m->ctx);
		return;
	}
	if (fanotify_mark(f->group, FAN_MARK_REMOVE, FAN_PRE_ACCESS, AT_FDCWD, path))
		ferry_warn("%s: unmarking complete blob %s: %s", f->m->mountpoint, path,
			   strerror(errno));
	else
		ferry_info("%s: blob %u is complete (%s): no more events for it",
			   f->m->mountpoint, blob, path);
	evict_marks_unlock(f->m->ctx);
}

/*
 * Eviction may punch any blob: watch the complete ones again, so a read of
 * a punched range raises an event (the eviction thread holds
 * evict_marks_lock, so none is unmarked until it is done).
 */
static int fan_evicting(void *state)
{
	struct fan *f = state;
	uint32_t i;
	int ret = 0;

	for (i = 0; i < f->nr_blobs; i++) {
		const char *path = image_cache_data_path(f->m->ic, i);

		if (atomic_load(&f->blobs[i].marked))
			continue;
		if (fanotify_mark(f->group, FAN_MARK_ADD, FAN_PRE_ACCESS, AT_FDCWD, path)) {
			ret = -errno;
			ferry_err("%s: watching blob %s again before eviction: %s; the cache is not evicted",
				  f->m->mountpoint, path, strerror(errno));
			continue;
		}
		atomic_store(&f->blobs[i].marked, true);
	}
	return ret;
}

static void *worker_main(void *arg)
{
	struct fan *f = arg;
	struct fan_job *j;
	int ret;

	for (;;) {
		pthread_mutex_lock(&f->lock);
		while (!f->head && !f->quit)
			pthread_cond_wait(&f->cond, &f->lock);
		j = f->head;
		if (j) {
			f->head = j->next;
			if (!f->head)
				f->tail = &f->head;
		}
		pthread_mutex_unlock(&f->lock);
		if (!j)
			return NULL; /* quit, and the queue is drained */
		ret = image_cache_ensure(f->m->ic, j->blob, j->off, j->len);
		if (ret)
			ferry_err("%s: reading blob %u bytes %llu+%llu for the kernel: %s",
				  f->m->req.image, j->blob, (unsigned long long)j->off,
				  (unsigned long long)j->len, ferry_strerror(ret));
		answer(f, j->fd, !ret);
		if (!ret)
			unmark_if_complete(f, j->blob);
		free(j);
	}
}

static int queue_job(struct fan *f, const struct fan_job *read)
{
	struct fan_job *j = malloc(sizeof(*j));

	if (!j)
		return -ENOMEM;
	*j = *read;
	pthread_mutex_lock(&f->lock);
	*f->tail = j;
	f->tail = &j->next;
	pthread_cond_signal(&f->cond);
	pthread_mutex_unlock(&f->lock);
	return 0;
}

/* ------------------------------------------------------------------ */
/* Events                                                              */
/* ------------------------------------------------------------------ */

/* Is @fd one of our blobs' data files? Then its index in *@blob. */
static bool blob_of(const struct fan *f, int fd, uint32_t *blob)
{
	struct stat st;
	uint32_t i;

	if (fstat(fd, &st))
		return false;
	for (i = 0; i < f->nr_blobs; i++) {
		if (f->blobs[i].ino == st.st_ino && f->blobs[i].dev == st.st_dev) {
			*blob = i;
			return true;
		}
	}
	return false;
}

/* One event: answered here when no fill is needed, else queued. */
static int handle_event(struct fan *f, const struct fanotify_event_metadata *meta)
{
	struct fan_job j = { .fd = meta->fd };

	if (meta->mask & FAN_Q_OVERFLOW) {
		/* With an unlimited queue this cannot happen; events lost
		 * in an overflow are allowed by the kernel. */
		ferry_err("%s: the fanotify queue overflowed: reads may have missed their data; unmounting",
			  f->m->mountpoint);
		return -EOVERFLOW;
	}
	if (meta->fd < 0)
		return 0;
	if (!(meta->mask & FAN_PRE_ACCESS)) {
		close(meta->fd);
		return 0;
	}
	if (!blob_of(f, meta->fd, &j.blob) || meta->pid == getpid()) {
		journal_put(f, meta->fd, NULL);
		answer(f, meta->fd, true);
		return 0;
	}
	fan_event_span(meta, f->blobs[j.blob].size, &j.off, &j.len);
	journal_put(f, meta->fd, &j);
	if (image_cache_present(f->m->ic, j.blob, j.off, j.len) ||
	    fan_fill_process(&f->exes, meta->pid, meta->fd)) {
		answer(f, meta->fd, true);
		return 0;
	}
	if (queue_job(f, &j)) {
		answer(f, meta->fd, false);
		return -ENOMEM;
	}
	return 0;
}

static int read_events(struct fan *f)
{
	const struct fanotify_event_metadata *meta;
	ssize_t n;
	int ret = 0;

	n = read(f->group, f->evbuf, sizeof(f->evbuf));
	if (n < 0)
		return errno == EAGAIN || errno == EINTR ? 0 : -errno;
	for (meta = (const void *)f->evbuf; FAN_EVENT_OK(meta, n);
	     meta = FAN_EVENT_NEXT(meta, n)) {
		if (meta->vers != FANOTIFY_METADATA_VERSION) {
			ferry_err("%s: fanotify metadata version %u, expected %u",
				  f->m->mountpoint, meta->vers, FANOTIFY_METADATA_VERSION);
			return -EPROTO;
		}
		/* After a fatal event the rest are still answered. */
		if (ret && meta->fd >= 0) {
			if (meta->mask & FAN_PRE_ACCESS)
				answer(f, meta->fd, false);
			else
				close(meta->fd);
			continue;
		}
		ret = handle_event(f, meta);
	}
	return ret;
}

/* ------------------------------------------------------------------ */
/* The keeper                                                          */
/* ------------------------------------------------------------------ */

static int keeper_send(struct fan *f, const char *msg)
{
	return send(f->keeper_sock, msg, strlen(msg), MSG_NOSIGNAL) < 0 ? -errno : 0;
}

/* Start a keeper holding a descriptor of the group (keeper.c). */
static int fan_keeper_start(struct fan *f)
{
	char sweep[16], hello[200];
	const char *args[] = { f->m->mountpoint, f->source, sweep, NULL };
	int keeper_pid, ret;

	snprintf(sweep, sizeof(sweep), "%u", f->sweep_max);
	ret = keeper_start_mount(KEEPER_FANOTIFY, f->group, f->m, args, &f->keeper_sock,
				 &keeper_pid);
	if (ret)
		return ret;
	atomic_store(&f->keeper_pid, keeper_pid);
	if (f->sysfs[0]) {
		snprintf(hello, sizeof(hello), "sysfs %s", f->sysfs);
		return keeper_send(f, hello);
	}
	return 0;
}

/* ------------------------------------------------------------------ */
/* Setup and teardown                                                  */
/* ------------------------------------------------------------------ */

/* Every pending event holds a descriptor in this process: our limit. */
static unsigned int nofile_raise(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl))
		return 0;
	if (rl.rlim_cur < FAN_NOFILE_WANT && rl.rlim_max > rl.rlim_cur) {
		rl.rlim_cur = MIN(rl.rlim_max, (rlim_t)FAN_NOFILE_WANT);
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	return (unsigned int)MIN(rl.rlim_cur, (rlim_t)1 << 20);
}

/* Only these file systems take pre-content marks (SB_I_ALLOW_HSM). */
static bool fs_allows_hsm(unsigned long type)
{
	return type == EXT4_SUPER_MAGIC || type == XFS_SUPER_MAGIC ||
	       type == BTRFS_SUPER_MAGIC;
}

static const char *fs_name(unsigned long type)
{
	switch (type) {
	case TMPFS_MAGIC: return "tmpfs";
	case FUSE_SUPER_MAGIC: return "fuse";
	case OVERLAYFS_SUPER_MAGIC: return "overlayfs";
	case NFS_SUPER_MAGIC: return "nfs";
	case EXT4_SUPER_MAGIC: return "ext4";
	case XFS_SUPER_MAGIC: return "xfs";
	case BTRFS_SUPER_MAGIC: return "btrfs";
	default: return "a file system";
	}
}

/* Mark each incomplete data file; the write descriptors are open already. */
static int mark_blobs(struct fan *f, char *err, size_t errlen)
{
	struct statfs sfs;
	struct stat st;
	uint32_t i;

	for (i = 0; i < f->nr_blobs; i++) {
		const char *path = image_cache_data_path(f->m->ic, i);
		struct fan_blob *b = &f->blobs[i];

		if (stat(path, &st)) {
			int e = errno;

			snprintf(err, errlen, "chunk cache file %s: %s", path, strerror(e));
			return -e;
		}
		b->dev = st.st_dev;
		b->ino = st.st_ino;
		b->size = (uint64_t)st.st_size;
		if (image_cache_blob_complete(f->m->ic, i))
			continue;
		if (fanotify_mark(f->group, FAN_MARK_ADD, FAN_PRE_ACCESS, AT_FDCWD, path)) {
			int e = errno;

			if (!statfs(path, &sfs) && !fs_allows_hsm((unsigned long)sfs.f_type))
				snprintf(err, errlen, "cache directory %s is on %s (type 0x%lx), which has no fanotify pre-content events (%s); use a cache directory on ext4, xfs or btrfs (--cache-dir)",
					 f->m->req.cache_dir, fs_name((unsigned long)sfs.f_type),
					 (unsigned long)sfs.f_type, strerror(e));
			else
				snprintf(err, errlen, "marking %s for fanotify: %s", path,
					 strerror(e));
			return -e;
		}
		atomic_store(&b->marked, true);
	}
	return 0;
}

static int find_sysfs(struct fan *f, char *err, size_t errlen)
{
	int ret = meta_sysfs_path(f->m->mountpoint, f->sysfs, sizeof(f->sysfs));

	if (ret)
		snprintf(err, errlen, "%s: cannot identify the mounted EROFS superblock (FS_IOC_GETFSSYSFSPATH): %s",
			 f->m->mountpoint, ferry_strerror(ret));
	return ret;
}

/* Native layers: the bottom layer's superblock, told the keeper before
 * any reader can reach the stack (image_cache_set_sb_note). */
static void note_layers_sb(void *ctx, const char *sysfs)
{
	struct fan *f = ctx;
	char msg[sizeof(f->sysfs) + 8];

	snprintf(f->sysfs, sizeof(f->sysfs), "%s", sysfs);
	snprintf(msg, sizeof(msg), "sysfs %s", f->sysfs);
	if (keeper_send(f, msg))
		ferry_warn("%s: the fanotify keeper is gone before the mount was attached",
			   f->m->mountpoint);
}

/* A takeover of native layers: the superblock the keeper was told (the
 * new keeper hears it in its hello). */
static int layers_sysfs_takeover(struct fan *f, char *err, size_t errlen)
{
	const char *s = f->m->req.sysfs;

	if (!s || strncmp(s, "/sys/fs/erofs/", 14) || strstr(s, "/..") ||
	    strlen(s) >= sizeof(f->sysfs)) {
		snprintf(err, errlen, "%s: taking over native layers needs the superblock their keeper was told",
			 f->m->mountpoint);
		return -EINVAL;
	}
	snprintf(f->sysfs, sizeof(f->sysfs), "%s", s);
	return 0;
}

static bool sb_alive(const struct fan *f)
{
	return f->sysfs[0] && !access(f->sysfs, F_OK);
}

/* ------------------------------------------------------------------ */
/* A successor's reserved numbers                                      */
/* ------------------------------------------------------------------ */

/* Mark in @want the pending numbers of journal @name in directory @dir. */
static unsigned int journal_numbers(int dir, const char *name, uint8_t *want,
				    unsigned int limit)
{
	size_t size = FAN_JOURNAL_SLOTS * sizeof(struct fan_slot);
	int fd = openat(dir, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
	const struct fan_slot *s = MAP_FAILED;
	unsigned int n, found = 0;
	struct stat st;

	/* Ours only: a journal is ferryd's file, 0600. */
	if (fd >= 0 && !fstat(fd, &st) && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
	    (uint64_t)st.st_size == size)
		s = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
	if (fd >= 0)
		close(fd);
	if (s == MAP_FAILED)
		return 0;
	for (n = STDERR_FILENO + 1; n < MIN(limit, FAN_JOURNAL_SLOTS); n++) {
		if (atomic_load_explicit(&s[n].used, memory_order_acquire) && s[n].device_id) {
			want[n] = 1;
			found++;
		}
	}
	munmap((void *)s, size);
	return found;
}

static void reserve_release(struct fan_ctx *fc)
{
	unsigned int fd, n = 0;

	pthread_mutex_lock(&fc->lock);
	for (fd = 0; fc->reserved && fd < FAN_JOURNAL_SLOTS; fd++) {
		if (fc->reserved[fd]) {
			close((int)fd);
			n++;
		}
	}
	free(fc->reserved);
	fc->reserved = NULL;
	pthread_mutex_unlock(&fc->lock);
	if (n)
		ferry_info("%u descriptor numbers kept for the reads of a dead ferryd were not needed: released",
			   n);
}

static void *reserve_expire(void *arg)
{
	struct fan_ctx *fc = arg;
	struct timespec ts;

	ferry_deadline_ts(&ts, FAN_RESERVE_S * 1000);
	pthread_mutex_lock(&fc->lock);
	while (!fc->quit && pthread_cond_timedwait(&fc->cond, &fc->lock, &ts) != ETIMEDOUT)
		;
	pthread_mutex_unlock(&fc->lock);
	reserve_release(fc);
	return NULL;
}

static int fan_init(struct serve_ctx *ctx, void **mode_ctx)
{
	struct fan_ctx *fc = calloc(1, sizeof(*fc));

	if (!fc)
		return -ENOMEM;
	pthread_mutex_init(&fc->lock, NULL);
	pthread_cond_init(&fc->cond, NULL);
	*mode_ctx = fc;
	return 0;
}

static void fan_fini(void *mode_ctx)
{
	struct fan_ctx *fc = mode_ctx;

	pthread_mutex_lock(&fc->lock);
	fc->quit = true;
	pthread_cond_broadcast(&fc->cond);
	pthread_mutex_unlock(&fc->lock);
	if (fc->expire_started)
		pthread_join(fc->expire, NULL);
	reserve_release(fc);
	pthread_mutex_destroy(&fc->lock);
	pthread_cond_destroy(&fc->cond);
	free(fc);
}

static void fan_startup(struct serve_ctx *ctx, void *mode_ctx)
{
	struct fan_ctx *fc = mode_ctx;
	char *copy = strdup(ctx->opts.socket_path);
	unsigned int limit = nofile_raise(), fd, wanted = 0, held = 0, busy = 0;
	uint8_t *want = calloc(FAN_JOURNAL_SLOTS, 1);
	DIR *dir = copy ? opendir(dirname(copy)) : NULL;
	struct dirent *e;
	int null;

	while (dir && want && (e = readdir(dir))) {
		size_t len = strlen(e->d_name);

		if (!strncmp(e->d_name, "fanotify-", 9) && len > 8 &&
		    !strcmp(e->d_name + len - 8, ".journal"))
			wanted += journal_numbers(dirfd(dir), e->d_name, want, limit);
	}
	if (dir)
		closedir(dir);
	free(copy);
	if (!wanted) {
		free(want);
		return;
	}
	/* A /dev/null on each number (2: held; a 1 left is 0, in use); one
	 * opened onto a wanted number is its reservation already. */
	while ((null = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0 &&
	       (unsigned int)null < FAN_JOURNAL_SLOTS && want[null]) {
		want[null] = 2;
		held++;
	}
	for (fd = 0; fd < FAN_JOURNAL_SLOTS; fd++) {
		if (want[fd] != 1)
			continue;
		if (null < 0 || fcntl((int)fd, F_GETFD) >= 0 ||
		    dup3(null, (int)fd, O_CLOEXEC) != (int)fd) {
			want[fd] = 0;
			busy++;
			continue;
		}
		want[fd] = 2;
		held++;
	}
	if (null >= 0)
		close(null);
	pthread_mutex_lock(&fc->lock);
	fc->reserved = want;
	pthread_mutex_unlock(&fc->lock);
	ferry_info("kept %u descriptor numbers for the fanotify reads a dead ferryd had taken%s",
		   held, busy ? " (some were in use: see the takeovers)" : "");
	fc->expire_started = !pthread_create(&fc->expire, NULL, reserve_expire, fc);
	if (!fc->expire_started)
		reserve_release(fc); /* no thread to wait: give them up now */
}

/* @fd is one of fan_startup's numbers: ours now (a /dev/null). */
static bool reserved_claim(struct fan_ctx *fc, unsigned int fd)
{
	bool ours;

	pthread_mutex_lock(&fc->lock);
	ours = fc->reserved && fd < FAN_JOURNAL_SLOTS && fc->reserved[fd];
	if (ours)
		fc->reserved[fd] = 0;
	pthread_mutex_unlock(&fc->lock);
	return ours;
}

/*
 * The mount's journal (see the top), next to the control socket, named by
 * the mount point: cleared for a new mount, kept for a takeover.
 */
static int journal_open(struct fan *f, bool keep)
{
	uint8_t d[SHA256_SIZE];
	char hex[2 * SHA256_SIZE + 1], *dir = strdup(f->m->ctx->opts.socket_path), *path = NULL;
	size_t size = FAN_JOURNAL_SLOTS * sizeof(struct fan_slot);
	void *p = MAP_FAILED;
	int fd = -1, ret = 0;

	sha256_buf(f->m->mountpoint, strlen(f->m->mountpoint), d);
	hex_encode(d, 8, hex);
	if (!dir || asprintf(&path, "%s/fanotify-%s.journal", dirname(dir), hex) < 0) {
		ret = -ENOMEM;
		goto out;
	}
	fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0 || (!keep && ftruncate(fd, 0)) || ftruncate(fd, (off_t)size))
		ret = -errno;
	if (!ret)
		p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (!ret && p == MAP_FAILED)
		ret = -errno;
	if (!ret) {
		f->journal = p;
		f->journal_path = path;
		path = NULL;
	} else
		ferry_warn("%s: the journal of pending reads %s: %s; if ferryd dies, reads in flight then fail with EIO",
			   f->m->mountpoint, path ? path : "", ferry_strerror(ret));
out:
	if (fd >= 0)
		close(fd);
	free(path);
	free(dir);
	return ret;
}

/*
 * Journal entry @fd as the read *@j: 1, 0 for an event allowed at once
 * (nothing to answer but the allow), -EINVAL when it names no range of
 * this image.
 */
static int journal_get(const struct fan *f, unsigned int fd, struct fan_job *j)
{
	const struct fan_slot *s = &f->journal[fd];
	uint64_t size;

	if (!s->device_id)
		return 0;
	*j = (struct fan_job){ .fd = (int)fd, .blob = s->device_id - 1, .off = s->off,
			       .len = s->len };
	if (j->blob >= f->nr_blobs)
		return -EINVAL;
	size = f->blobs[j->blob].size;
	return j->off <= size && j->len <= size - j->off ? 1 : -EINVAL;
}

/*
 * A takeover, before the loop reads any event: the dead ferryd's
 * journaled events go to the fill threads, each under its own number,
 * which we hold (a /dev/null descriptor) until it is answered, so that no
 * event of ours gets it meanwhile; the loop runs at once (our own fills
 * raise events too). Every other number below the descriptor limit is
 * denied first: only an event read in the instant before its entry was
 * written can still be pending under one.
 */
static void journal_replay(struct fan *f)
{
	uint8_t *held = calloc(FAN_JOURNAL_SLOTS, 1);
	int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
	unsigned int fd, n = 0, denied = 0;

	for (fd = 0; f->journal && fd < FAN_JOURNAL_SLOTS; fd++) {
		struct fan_slot *s = &f->journal[fd];
		struct fan_job j;
		const char *why;
		int read;

		/* The entry stays until answered: should we die first, our
		 * successor replays it again. */
		if (!atomic_load_explicit(&s->used, memory_order_acquire))
			continue;
		n++;
		read = journal_get(f, fd, &j);
		if (read > 0 && held && reserved_claim(f->fc, fd)) {
			held[fd] = 1;
			continue;
		}
		/* A number we use already cannot be held: deny it. */
		why = read <= 0 ? "not a range of this image" : !held || null < 0 ? "out of memory" :
		      fcntl((int)fd, F_GETFD) >= 0 ? "its number is in use here" : NULL;
		if (!why && dup3(null, (int)fd, O_CLOEXEC) != (int)fd)
			why = strerror(errno);
		if (why) {
			respond(f, (int)fd, !read);
			atomic_store_explicit(&s->used, 0, memory_order_release);
			if (read)
				ferry_warn("%s: a read the dead ferryd had taken (descriptor %u, blob %u bytes %llu+%llu) is answered EIO: %s",
					   f->m->mountpoint, fd, j.blob,
					   (unsigned long long)j.off, (unsigned long long)j.len, why);
			denied += !!read;
			continue;
		}
		held[fd] = 1;
	}
	for (fd = 0; fd < f->sweep_max; fd++)
		if (fd >= FAN_JOURNAL_SLOTS || !held || !held[fd])
			respond(f, (int)fd, false);
	for (fd = 0; held && fd < FAN_JOURNAL_SLOTS; fd++) {
		struct fan_job j;

		if (held[fd] && (journal_get(f, fd, &j) <= 0 || queue_job(f, &j)))
			answer(f, (int)fd, false);
	}
	ferry_info("%s: fanotify group taken over; answering %u reads the dead ferryd had taken%s%s",
		   f->m->mountpoint, n - denied, denied ? " (some denied: see above)" : "",
		   f->journal ? "" : " (no journal: its reads get EIO)");
	if (null >= 0)
		close(null);
	free(held);
}

static void fan_free(struct fan *f)
{
	unsigned int i;

	pthread_mutex_lock(&f->lock);
	f->quit = true;
	pthread_cond_broadcast(&f->cond);
	pthread_mutex_unlock(&f->lock);
	for (i = 0; i < f->nr_workers; i++)
		pthread_join(f->workers[i], NULL);
	if (f->keeper_sock >= 0)
		close(f->keeper_sock);
	if (f->group >= 0)
		close(f->group);
	if (f->wake[0] >= 0) {
		close(f->wake[0]);
		close(f->wake[1]);
	}
	if (f->journal)
		munmap(f->journal, FAN_JOURNAL_SLOTS * sizeof(struct fan_slot));
	free(f->journal_path);
	pthread_mutex_destroy(&f->lock);
	pthread_cond_destroy(&f->cond);
	free(f->blobs);
	free(f);
}

/* The descriptor handed over is a fanotify group: ours now. */
static int fan_takeover_group(struct fan *f, char *err, size_t errlen)
{
	char path[64], link[64] = "";
	int fd = f->m->req.takeover_fd;
	ssize_t n;

	f->m->req.takeover_fd = -1;
	f->group = fd;
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	n = readlink(path, link, sizeof(link) - 1);
	if (fd < 0 || n <= 0 || strncmp(link, "anon_inode:[fanotify]", (size_t)n)) {
		snprintf(err, errlen, "%s: a fanotify mount is taken over with its group's descriptor",
			 f->m->mountpoint);
		return -EINVAL;
	}
	return fcntl(fd, F_SETFL, O_NONBLOCK) ? -errno : 0;
}

/*
 * Write the bootstrap file, create the group, mark every incomplete data
 * file, start the keeper, mount(2) and start the fill threads. The mount
 * is live at once.
 */
static int fan_start(struct fmount *m, void **state, char *err, size_t errlen)
{
	bool takeover = m->req.takeover;
	struct fan *f = calloc(1, sizeof(*f));
	unsigned int i;
	uint32_t n = m->img->blobs.nr_blobs;
	int ret;

	if (!f || !(f->blobs = calloc(n + 1, sizeof(*f->blobs)))) {
		free(f);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	f->m = m;
	f->fc = mode_state(m->ctx, &fanotify_mode);
	f->nr_blobs = n;
	f->group = f->keeper_sock = f->wake[0] = f->wake[1] = -1;
	f->tail = &f->head;
	pthread_mutex_init(&f->lock, NULL);
	pthread_cond_init(&f->cond, NULL);
	ferry_exes_find(&f->exes);
	f->sweep_max = nofile_raise();

	/* Native layers have no bootstrap: their files hold the metadata. */
	ret = m->img->erofs_layers ? 0 : image_bootstrap_file(m->img, m->req.cache_dir);
	if (ret) {
		snprintf(err, errlen, "writing the bootstrap into %s/bootstraps: %s",
			 m->req.cache_dir, ferry_strerror(ret));
		goto fail;
	}
	/* What image_cache_kernel_mount names it: the keeper looks for it. */
	if (m->img->erofs_layers)
		snprintf(f->source, sizeof(f->source), "%s", IMAGE_LAYERS_SOURCE);
	else
		snprintf(f->source, sizeof(f->source), IMAGE_FD_SOURCE "%d",
			 m->img->bootstrap_fd);
	if (pipe2(f->wake, O_CLOEXEC | O_NONBLOCK)) {
		ret = -errno;
		snprintf(err, errlen, "pipe: %s", strerror(-ret));
		goto fail;
	}
	if (takeover) {
		ret = fan_takeover_group(f, err, errlen);
		if (!ret && m->img->erofs_layers)
			ret = layers_sysfs_takeover(f, err, errlen);
		if (ret)
			goto fail;
	} else {
		f->group = fanotify_init(FAN_CLASS_PRE_CONTENT | FAN_CLOEXEC | FAN_NONBLOCK |
					 FAN_UNLIMITED_QUEUE, O_RDONLY | O_LARGEFILE | O_CLOEXEC);
	}
	if (f->group < 0) {
		ret = -errno;
		snprintf(err, errlen, "fanotify_init (pre-content class): %s%s", strerror(-ret),
			 ret == -EINVAL ? " (fanotify mode needs Linux 6.14 or later)" :
			 ret == -EPERM ? " (needs CAP_SYS_ADMIN)" : "");
		goto fail;
	}
	ret = mark_blobs(f, err, errlen);
	if (ret)
		goto fail;
	journal_open(f, takeover);
	/* Before the mount: from now on a descriptor of the group outlives us. */
	ret = fan_keeper_start(f);
	if (ret) {
		snprintf(err, errlen, "cannot start the fanotify keeper: %s", ferry_strerror(ret));
		goto fail;
	}
	image_cache_kernel_reads(m->ic);
	if (m->img->erofs_layers)
		image_cache_set_sb_note(m->ic, note_layers_sb, f);
	/* A takeover finds the dead ferryd's mount there. */
	ret = takeover ? 0 : image_cache_kernel_mount(m->ic, m->req.cache_dir, m->mountpoint,
						   image_mount_flags(m->req.suid, m->req.dev));
	if (ret) {
		snprintf(err, errlen, "kernel mount of %s on %s failed (see above)",
			 m->img->erofs_layers ? m->req.image : m->img->bootstrap_path,
			 m->mountpoint);
		goto fail;
	}
	f->mounted = !takeover;
	image_cache_set_sb_note(m->ic, NULL, NULL);
	/* An overlay has no sysfs directory: the bottom layer's superblock,
	 * which lives exactly as long as the stack, was noted before the
	 * stack was attached (or, taken over, named by the keeper). */
	if (!m->img->erofs_layers)
		ret = find_sysfs(f, err, errlen);
	if (!ret && !m->img->erofs_layers) {
		char msg[sizeof(f->sysfs) + 8];

		snprintf(msg, sizeof(msg), "sysfs %s", f->sysfs);
		ret = keeper_send(f, msg);
		if (ret)
			snprintf(err, errlen, "the fanotify keeper is gone: %s", ferry_strerror(ret));
	}
	for (i = 0; !ret && i < FAN_WORKERS; i++) {
		ret = -pthread_create(&f->workers[i], NULL, worker_main, f);
		if (ret)
			snprintf(err, errlen, "cannot start fill threads: %s", strerror(-ret));
		else
			f->nr_workers++;
	}
	if (ret)
		goto fail;
	if (takeover)
		journal_replay(f);
	*state = f;
	mount_ready(m);
	return 0;

fail:
	/* Unmounted before the group closes, so nothing is let onto a hole;
	 * a superblock someone holds already stays with the keeper. */
	if (f->mounted && umount_nofollow(m->mountpoint, MNT_DETACH))
		ferry_warn("%s: detaching: %s", m->mountpoint, strerror(errno));
	if (f->keeper_sock >= 0 && !sb_alive(f))
		keeper_send(f, "bye");
	fan_free(f);
	return ret;
}

/*
 * Serve events until the mounted superblock is gone (0), fan_stop, or a
 * fatal error (-errno, logged: fan_close detaches the mount).
 */
static int fan_serve(void *state)
{
	struct fan *f = state;
	uint64_t next_check = 0;
	int ret = 0;


	while (!atomic_load(&f->stop)) {
		struct pollfd p[3] = {
			{ .fd = f->group, .events = POLLIN },
			{ .fd = f->keeper_sock, .events = POLLIN },
			{ .fd = f->wake[0], .events = POLLIN },
		};
		int n = poll(p, 3, SB_CHECK_MS);
		uint64_t now = ferry_now_ns();

		if (n < 0 && errno != EINTR)
			return -errno;
		if (now >= next_check) {
			uint32_t i;

			if (!sb_alive(f))
				return 0; /* unmounted and released: done */
			/* Prefetch completes blobs too. */
			for (i = 0; i < f->nr_blobs; i++)
				unmark_if_complete(f, i);
			next_check = now + SB_CHECK_MS * 1000000ull;
		}
		if (n <= 0)
			continue;
		if (p[1].revents) {
			/* The keeper says nothing after hello: it died. */
			ferry_warn("%s: the fanotify keeper (pid %d) is gone; starting a new one",
				   f->m->mountpoint, atomic_load(&f->keeper_pid));
			close(f->keeper_sock);
			f->keeper_sock = -1;
			atomic_fetch_add(&f->m->ctx->keeper_restarts, 1);
			ret = fan_keeper_start(f);
			if (ret) {
				ferry_err("%s: no fanotify keeper: unmounting", f->m->mountpoint);
				return ret;
			}
		}
		if (p[0].revents & POLLIN) {
			ret = read_events(f);
			if (ret)
				return ret;
		}
	}
	return 0;
}

static void fan_stop(void *state)
{
	struct fan *f = state;

	atomic_store(&f->stop, true);
	if (write(f->wake[1], "", 1) < 0) {
		/* full: the loop wakes anyway */
	}
}

/*
 * After fan_serve: answer what is queued, then release. A superblock still
 * alive is left to the keeper (EIO for missing data, never zeros); after a
 * fatal error the mount is detached first, so that only its users keep it.
 */
static void fan_close(void *state, int ret)
{
	struct fan *f = state;
	bool gone;

	if (ret)
		mount_detach(f->m);
	/* Events already queued are answered before we go. */
	pthread_mutex_lock(&f->lock);
	f->quit = true;
	pthread_cond_broadcast(&f->cond);
	pthread_mutex_unlock(&f->lock);
	while (f->nr_workers)
		pthread_join(f->workers[--f->nr_workers], NULL);
	gone = !sb_alive(f);
	if (gone) {
		if (f->keeper_sock >= 0)
			keeper_send(f, "bye");
		/* No successor can need it: they accumulated, one per mount point. */
		if (f->journal_path)
			unlink(f->journal_path);
	} else {
		/* Still in use (a busy mount at shutdown, a fatal error):
		 * the keeper answers EIO from now on, never zeros. */
		if (f->keeper_sock >= 0)
			keeper_send(f, "alone");
		ferry_warn("%s: still mounted and in use; its fanotify keeper (pid %d) answers EIO to reads of missing data until it is unmounted",
			   f->m->mountpoint, atomic_load(&f->keeper_pid));
	}
	fan_free(f);
}

static void fan_stats(void *state, struct ctl_mount_stats *s)
{
	struct fan *f = state;

	s->keeper_pid = atomic_load(&f->keeper_pid);
}

/*
 * Pre-content events exist (Linux 6.14+) and the cache directory's file
 * system takes them: a mark of it (or of its nearest existing ancestor)
 * in a group closed at once.
 */
static int fan_probe(void *mode_ctx, const struct ctl_mount_req *req, char *why, size_t len)
{
	char dir[PATH_MAX], *slash;
	struct statfs sfs;
	int group, ret = 0;

	snprintf(dir, sizeof(dir), "%s", req->cache_dir);
	while (statfs(dir, &sfs) && (slash = strrchr(dir, '/')) && slash != dir)
		*slash = '\0';
	group = fanotify_init(FAN_CLASS_PRE_CONTENT | FAN_CLOEXEC, O_RDONLY | O_CLOEXEC);
	if (group < 0 || fanotify_mark(group, FAN_MARK_ADD, FAN_PRE_ACCESS, AT_FDCWD, dir))
		ret = -errno;
	if (group >= 0)
		close(group);
	if (!ret)
		snprintf(why, len, "pre-content events on the cache's %s", fs_name((unsigned long)sfs.f_type));
	else if (group >= 0 && ret == -EOPNOTSUPP)
		snprintf(why, len, "the cache directory is on %s, which has no pre-content events (ext4, xfs, btrfs have)",
			 fs_name((unsigned long)sfs.f_type));
	else
		snprintf(why, len, "no fanotify pre-content events (Linux 6.14+): %s", strerror(-ret));
	return ret;
}

const struct serve_mode fanotify_mode = {
	.name = "fanotify",
	.fstype = "erofs",
	.serves_layers = true,
	.layers_needs = "Linux 6.14+, cache on ext4, xfs or btrfs",
	.quiesce_early = true,
	.init = fan_init,
	.fini = fan_fini,
	.start = fan_start,
	.serve = fan_serve,
	.stop = fan_stop,
	.close = fan_close,
	.stats = fan_stats,
	.quiesce = fan_stop,
	.evicting = fan_evicting,
	.probe = fan_probe,
	.startup = fan_startup,
};
