// SPDX-License-Identifier: MIT
/*
 * Cachefiles mode: EROFS over fscache (cachefiles on-demand reads, Linux
 * 5.19 to 7.1, CONFIG_CACHEFILES_ONDEMAND and CONFIG_EROFS_FS_ONDEMAND).
 * The kernel mounts EROFS with fsid=<bootstrap sha256> and finds every
 * blob by its device table tag (the blob's sha256); both live as cache
 * files under <cache>/fscache/cache/, which the kernel owns. On a miss the
 * kernel asks the daemon holding /dev/cachefiles:
 *
 *   OPEN  (volume "erofs,<fsid or domain>", cookie <fsid or tag>, an anon
 *         fd of the cache file): "copen ID,SIZE" with the bootstrap's or
 *         the blob's uncompressed size, or a negative errno;
 *   READ  (object, offset, length: page-aligned): the bytes written
 *         through the anon fd (O_DIRECT: 4 KiB-aligned buffers), then
 *         CACHEFILES_IOC_READ_COMPLETE — always: completing without the
 *         bytes fails the reader with EIO instead of leaving it hanging;
 *   CLOSE the object is released.
 *
 * Blob bytes come whole frames at a time from image_cache_read_frames:
 * the chunk cache's copy where it has one (another mode filled it), else
 * fetched, verified and decompressed in memory and kept only in the
 * kernel's cache file; the bootstrap from the verified copy in memory.
 * Metadata and data both arrive on demand; prefetch writes into the cache
 * files too (image_cache_set_prefetch_sink).
 *
 * The device is one per host and only one process may hold it: every
 * cachefiles mount of this ferryd shares it. The first mount opens and
 * binds it (dir <its cache>/fscache, tag ferry, bind ondemand), the last
 * one closes it. One thread reads the device: it answers OPEN at once
 * (mount(2) waits for it) and queues READs to worker threads. An object
 * is resolved to a mount at each READ by its volume and cookie, so a blob
 * shared in a domain is served as long as any mount of that domain has it.
 *
 * Failover: a keeper process (ferryd-keeper cachefiles) holds a second
 * descriptor of the device, so the cache stays bound when ferryd dies,
 * and ferryd records its cachefiles mounts (their requests) next to the
 * control socket. When ferryd dies, the kernel closes the objects whose
 * anon fds it held and keeps the READs it had handed out; the keeper
 * becomes the successor (exec ferryd --cachefiles-takeover), which opens the
 * recorded images again, takes over their mounts without mounting, and
 * writes "restore": the kernel hands out again every pending request and,
 * before a READ of a closed object, OPENs it anew. Readers wait meanwhile
 * and get their bytes. Without a successor (the keeper killed too, or the
 * takeover failed) the last descriptor closes: pending and later reads of
 * data not yet in the cache files fail with EIO, and the mount stays
 * unmountable.
 */
#include <dirent.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <linux/cachefiles.h>

#include "cachefiles.h"
#include "internal.h"

#define CF_TAG "ferry"
#define CF_WORKERS 8u              /* READs in flight */
#define CF_BUF (1u << 20)          /* a worker's write buffer */
#define CF_ALIGN 4096u             /* O_DIRECT writes into the cache files */
#define SB_CHECK_MS 200            /* how often a mount looks for its superblock */

/* A cache file the kernel opened for us: the anon fd and what it holds. */
struct cf_object {
	struct cf_object *next;
	uint32_t id;
	int fd;
	unsigned int refs;          /* the table's and READs in flight (dev lock) */
	char volume[CF_VOLUME_MAX];
	cf_name cookie;
};

struct cf_job {
	struct cf_job *next;
	struct cf_object *obj;      /* referenced */
	uint32_t msg_id;
	uint64_t off, len;
};

struct cf_dev;

struct cf_mount {
	struct cf_mount *next;
	struct cf_dev *d;
	struct fmount *m;
	struct cf_names names;      /* its objects (layer_fsids: dev lock) */
	unsigned int busy;          /* READs using it (dev lock) */
	bool registered;
	bool live;                  /* mounted: recorded for a successor (dev lock) */
	char sysfs[160];
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool stop;                  /* lock */
};

extern const struct serve_mode cachefiles_mode;

/* A READ worker: its device and its write buffer (CF_BUF, aligned). */
struct cf_worker {
	struct cf_dev *d;
	uint8_t *buf;
};

/* The device, shared by every cachefiles mount: the mode's own state. */
struct cf_dev {
	struct serve_ctx *ctx;
	pthread_mutex_t life;       /* opening and closing, in order */
	pthread_mutex_t lock;       /* everything below */
	pthread_cond_t cond;        /* a READ queued, or quit */
	pthread_cond_t idle;        /* a mount's last READ done */
	int fd;
	char cache_dir[PATH_MAX];   /* the chunk cache of the mount that bound it */
	char dir[PATH_MAX];         /* the kernel's: cache_dir/fscache */
	unsigned int users;
	struct cf_mount *mounts;
	struct cf_object *objects;
	struct cf_job *head, **tail;
	bool quit;
	int wake[2];
	pthread_t reader, workers[CF_WORKERS];
	struct cf_worker worker_args[CF_WORKERS];
	unsigned int nr_workers;
	bool reader_started;
	char state_dir[PATH_MAX];   /* where CF_STATE lives */
	struct keeper_guard keeper; /* the device's keeper, restarted when it dies */
	int takeover_fd;            /* cf_takeover_device: the dead ferryd's device */
	bool taking_over;           /* cf_takeover_device runs: keep the device */
};

static int cf_init(struct serve_ctx *ctx, void **mode_ctx)
{
	struct cf_dev *d = calloc(1, sizeof(*d));

	if (!d)
		return -ENOMEM;
	d->ctx = ctx;
	pthread_mutex_init(&d->life, NULL);
	pthread_mutex_init(&d->lock, NULL);
	pthread_cond_init(&d->cond, NULL);
	pthread_cond_init(&d->idle, NULL);
	d->fd = d->takeover_fd = -1;
	d->wake[0] = d->wake[1] = -1;
	d->tail = &d->head;
	*mode_ctx = d;
	return 0;
}

/* With no mount left (the last one closed the device). */
static void cf_fini(void *mode_ctx)
{
	struct cf_dev *d = mode_ctx;

	if (d->takeover_fd >= 0)
		close(d->takeover_fd);
	pthread_mutex_destroy(&d->life);
	pthread_mutex_destroy(&d->lock);
	pthread_cond_destroy(&d->cond);
	pthread_cond_destroy(&d->idle);
	free(d);
}

/* ------------------------------------------------------------------ */
/* Objects and mounts (d->lock)                                       */
/* ------------------------------------------------------------------ */

static void object_put_locked(struct cf_object *o)
{
	if (--o->refs)
		return;
	close(o->fd);
	free(o);
}

static struct cf_object *object_find_locked(struct cf_dev *d, uint32_t id)
{
	struct cf_object *o;

	for (o = d->objects; o && o->id != id; o = o->next)
		;
	return o;
}

static void object_unlink_locked(struct cf_dev *d, struct cf_object *o)
{
	struct cf_object **pp;

	for (pp = &d->objects; *pp != o; pp = &(*pp)->next)
		;
	*pp = o->next;
	object_put_locked(o);
}

/*
 * The mount serving @cookie in @volume and the device it names there (0:
 * the bootstrap), or NULL. In a domain several mounts may have the blob:
 * any of them serves it, as any mount of a native layer serves its copies.
 */
static struct cf_mount *resolve_locked(struct cf_dev *d, const char *volume,
				       const char *cookie, uint32_t *device)
{
	struct cf_mount *cm;

	for (cm = d->mounts; cm; cm = cm->next)
		if (cf_names_resolve(&cm->names, volume, cookie, device))
			return cm;
	return NULL;
}

static uint64_t object_size(const struct cf_mount *cm, uint32_t device)
{
	return device ? cm->m->img->blobs.blobs[device - 1].uncompressed_size :
			cm->m->img->bootstrap_len;
}

/* ------------------------------------------------------------------ */
/* Requests                                                            */
/* ------------------------------------------------------------------ */

/* One command, one write(2). */
static int dev_cmd(struct cf_dev *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int dev_cmd(struct cf_dev *d, const char *fmt, ...)
{
	char buf[PATH_MAX + 32];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= sizeof(buf))
		return -ENAMETOOLONG;
	return write(d->fd, buf, (size_t)n) == n ? 0 : -errno;
}

/* A printable copy of untrusted key bytes, for comparisons and messages. */
static bool key_copy(const uint8_t *p, size_t n, char *out, size_t size)
{
	size_t i;

	if (n >= size)
		return false;
	for (i = 0; i < n; i++) {
		if (p[i] < 0x21 || p[i] > 0x7e)
			return false;
		out[i] = (char)p[i];
	}
	out[n] = '\0';
	return true;
}

static void handle_open(struct cf_dev *d, const struct cachefiles_msg *msg, size_t len)
{
	const struct cachefiles_open *op = (const void *)msg->data;
	char volume[CF_VOLUME_MAX] = "?";
	cf_name cookie = "?";
	struct cf_object *o = NULL;
	struct cf_mount *cm;
	uint32_t device = 0;
	int64_t size = -ENOENT;
	int fd, ret;

	if (len < sizeof(*msg) + sizeof(*op)) {
		ferry_err("cachefiles: OPEN message %u of %zu bytes: too short", msg->msg_id,
			  len);
		return; /* no descriptor to close, nothing the kernel can use */
	}
	fd = (int)op->fd;
	/* The volume key is NUL-terminated and counted with its NUL. */
	if ((uint64_t)op->volume_key_size + op->cookie_key_size > len - sizeof(*msg) - sizeof(*op) ||
	    !op->volume_key_size || op->data[op->volume_key_size - 1] ||
	    !key_copy(op->data, op->volume_key_size - 1, volume, sizeof(volume)) ||
	    !key_copy(op->data + op->volume_key_size, op->cookie_key_size, cookie,
		      sizeof(cookie))) {
		ferry_err("cachefiles: OPEN %u: malformed or unknown keys; refused", msg->msg_id);
		size = -EINVAL;
		goto answer;
	}
	o = calloc(1, sizeof(*o));
	if (!o) {
		size = -ENOMEM;
		goto answer;
	}
	pthread_mutex_lock(&d->lock);
	cm = resolve_locked(d, volume, cookie, &device);
	if (cm) {
		size = (int64_t)object_size(cm, device);
		*o = (struct cf_object){ .next = d->objects, .id = msg->object_id, .fd = fd,
					 .refs = 1 };
		memcpy(o->volume, volume, sizeof(volume));
		memcpy(o->cookie, cookie, sizeof(cookie));
		d->objects = o;
		o = NULL;
	}
	pthread_mutex_unlock(&d->lock);
	if (cm)
		ferry_dbg("cachefiles: OPEN %s %s: object %u, %lld bytes", volume, cookie,
			  msg->object_id, (long long)size);
	else
		ferry_warn("cachefiles: OPEN of %s in volume %s: no mount of this ferryd has it; refused",
			   cookie, volume);
answer:
	free(o);
	if (size < 0)
		close(fd);
	ret = dev_cmd(d, "copen %u,%lld", msg->msg_id, (long long)size);
	if (ret)
		ferry_err("cachefiles: answering OPEN %u (%s %s): %s", msg->msg_id, volume,
			  cookie, ferry_strerror(ret));
}

static void handle_read(struct cf_dev *d, const struct cachefiles_msg *msg, size_t len)
{
	const struct cachefiles_read *rd = (const void *)msg->data;
	struct cf_object *o;
	struct cf_job *j;

	if (len < sizeof(*msg) + sizeof(*rd)) {
		ferry_err("cachefiles: READ message %u of %zu bytes: too short", msg->msg_id, len);
		return;
	}
	j = malloc(sizeof(*j));
	pthread_mutex_lock(&d->lock);
	o = object_find_locked(d, msg->object_id);
	if (o && j) {
		o->refs++;
		*j = (struct cf_job){ .obj = o, .msg_id = msg->msg_id, .off = rd->off,
				      .len = rd->len };
		*d->tail = j;
		d->tail = &j->next;
		pthread_cond_signal(&d->cond);
		j = NULL;
	} else if (o) {
		/* Out of memory: the reader gets EIO rather than a hang. */
		ioctl(o->fd, CACHEFILES_IOC_READ_COMPLETE, (unsigned long)msg->msg_id);
	}
	pthread_mutex_unlock(&d->lock);
	if (!o)
		ferry_err("cachefiles: READ %u for unknown object %u", msg->msg_id,
			  msg->object_id);
	free(j);
}

static void handle_close(struct cf_dev *d, const struct cachefiles_msg *msg)
{
	struct cf_object *o;

	pthread_mutex_lock(&d->lock);
	o = object_find_locked(d, msg->object_id);
	if (o)
		object_unlink_locked(d, o);
	pthread_mutex_unlock(&d->lock);
}

static void *reader_main(void *arg)
{
	struct cf_dev *d = arg;
	uint64_t buf[CACHEFILES_MSG_MAX_SIZE / sizeof(uint64_t)];
	const struct cachefiles_msg *msg = (const void *)buf;

	for (;;) {
		struct pollfd p[2] = {
			{ .fd = d->fd, .events = POLLIN },
			{ .fd = d->wake[0], .events = POLLIN },
		};
		ssize_t n;

		if (poll(p, 2, -1) < 0 && errno != EINTR) {
			ferry_err("cachefiles: poll: %s", strerror(errno));
			return NULL;
		}
		if (p[1].revents)
			return NULL; /* cf_dev_put: no mount left */
		if (!(p[0].revents & POLLIN))
			continue;
		n = read(d->fd, buf, sizeof(buf));
		if (n < 0 && errno != EINTR && errno != EAGAIN)
			ferry_err("cachefiles: reading %s: %s", CF_DEVICE, strerror(errno));
		/* 0: nothing pending after all (another request was first). */
		if (n <= 0)
			continue;
		if ((size_t)n < sizeof(*msg) || msg->len != (uint32_t)n) {
			ferry_err("cachefiles: a message of %zd bytes says %u; ignored", n,
				  (size_t)n < sizeof(*msg) ? 0 : msg->len);
			continue;
		}
		switch (msg->opcode) {
		case CACHEFILES_OP_OPEN:
			handle_open(d, msg, (size_t)n);
			break;
		case CACHEFILES_OP_READ:
			handle_read(d, msg, (size_t)n);
			break;
		case CACHEFILES_OP_CLOSE:
			handle_close(d, msg);
			break;
		default:
			ferry_warn("cachefiles: unknown request %u (opcode %u); ignored",
				   msg->msg_id, msg->opcode);
		}
	}
}

/*
 * Native layers with compressed files: EROFS over fscache reads a
 * pcluster with one bio, and Linux 6.12 completes that bio when its first
 * part comes from the cache file (erofs_fscache_bio_endio runs for every
 * fscache_read, one per stretch present or fetched), decompressing the
 * pcluster before the rest is read: zstd and lz4 errors and readers
 * stuck in D state in the VM test. A bio stays inside one file's
 * pclusters, so each compressed file's span (a "unit",
 * image_cache_walk_layers) must be in the cache file wholly or not at
 * all: a READ inside a unit writes the whole unit, from its end
 * backwards, each piece whole in memory before it is written (a failure
 * leaves a missing head and a present tail: a bio starting in the head
 * asks for the rest, one starting in the tail finds it all), and every
 * other write (frames around metadata, prefetch) leaves units out.
 */
static const struct image_span *units_of(const struct image *img, uint32_t blob,
					 uint32_t *nr)
{
	*nr = img->nr_layer_units ? img->nr_layer_units[blob] : 0;
	return *nr ? img->layer_units[blob] : NULL;
}

/* The first unit ending after @off. */
static uint32_t unit_after(const struct image_span *u, uint32_t nr, uint64_t off)
{
	uint32_t lo = 0, hi = nr;

	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;

		if (u[mid].off + u[mid].len <= off)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* Write @len bytes at @off into @fd, leaving out every unit. */
static int write_outside_units(int fd, const struct image_span *u, uint32_t nr,
			       uint64_t off, const uint8_t *buf, size_t len)
{
	uint64_t end = off + len, pos = off;
	uint32_t i = unit_after(u, nr, off);
	int ret = 0;

	while (!ret && pos < end) {
		uint64_t stop = i < nr ? MIN(end, MAX(pos, u[i].off)) : end;

		if (stop > pos)
			ret = pwrite_full(fd, buf + (pos - off), stop - pos, pos);
		pos = i < nr ? MAX(stop, u[i].off + u[i].len) : end;
		i++;
	}
	return ret;
}

/* Where a READ's bytes go: the object's cache file, and how far they got. */
struct cf_sink {
	const struct cf_job *j;
	const char *image;
	uint64_t pos;       /* written (or skipped past) up to here */
	const uint8_t *zeros; /* CF_BUF zero bytes, aligned */
	const struct image_span *units; /* left out (written whole elsewhere) */
	uint32_t nr_units;
};

static int sink_write(struct cf_sink *s, uint64_t off, const void *buf, size_t len)
{
	int ret = write_outside_units(s->j->obj->fd, s->units, s->nr_units, off, buf, len);

	if (ret)
		ferry_err("%s: writing %zu bytes at %llu into the cache file of %s: %s",
			  s->image, len, (unsigned long long)off, s->j->obj->cookie,
			  ferry_strerror(ret));
	return ret;
}

/* A unit being filled: the piece [from, to) gathered in memory. */
struct cf_piece {
	uint8_t *buf;
	uint64_t from, to;
	uint64_t got; /* bytes of it the frames brought */
};

static int piece_frame(void *ctx, uint64_t off, const void *buf, size_t len)
{
	struct cf_piece *p = ctx;
	uint64_t a = MAX(off, p->from), b = MIN(off + len, p->to);

	if (a < b) {
		memcpy(p->buf + (a - p->from), (const uint8_t *)buf + (a - off), b - a);
		p->got += b - a;
	}
	return 0;
}

/* The whole unit @u into the cache file, unless it is there already. */
static int fill_unit(struct cf_mount *cm, uint32_t blob, const struct cf_job *j,
		     const struct image_span *u)
{
	struct cf_piece p = { .to = u->off + u->len };
	off_t hole = lseek(j->obj->fd, (off_t)u->off, SEEK_HOLE);
	int ret = 0;

	if (hole >= 0 && (uint64_t)hole >= u->off + u->len)
		return 0;
	p.buf = aligned_alloc(CF_ALIGN, CF_BUF);
	if (!p.buf)
		return -ENOMEM;
	while (!ret && p.to > u->off) {
		p.from = MAX(u->off, (p.to - 1) / CF_BUF * CF_BUF);
		p.got = 0;
		ret = image_cache_read_frames(cm->m->ic, blob, p.from, p.to - p.from,
					      piece_frame, &p);
		/* Frames are disjoint: anything short is a piece not covered. */
		if (!ret && p.got != p.to - p.from)
			ret = -EIO;
		if (!ret)
			ret = pwrite_full(j->obj->fd, p.buf, p.to - p.from, p.from);
		if (ret)
			ferry_err("%s: layer %u bytes %llu+%llu (a compressed file's pclusters) for the kernel: %s",
				  cm->m->req.image, blob, (unsigned long long)p.from,
				  (unsigned long long)(p.to - p.from), ferry_strerror(ret));
		p.to = p.from;
	}
	free(p.buf);
	return ret;
}

/* Zeros from s->pos up to @to (alignment padding outside every chunk). */
static int sink_zeros(struct cf_sink *s, uint64_t to)
{
	int ret = 0;

	while (!ret && s->pos < to) {
		size_t n = (size_t)MIN(to - s->pos, (uint64_t)CF_BUF);

		ret = sink_write(s, s->pos, s->zeros, n);
		s->pos += n;
	}
	return ret;
}

/* image_cache_read_frames' emit: a whole frame, asked for or not. */
static int sink_frame(void *ctx, uint64_t off, const void *buf, size_t len)
{
	struct cf_sink *s = ctx;
	int ret = sink_zeros(s, off);

	if (!ret)
		ret = sink_write(s, off, buf, len);
	s->pos = MAX(s->pos, off + len);
	return ret;
}

/*
 * A blob's READ (fill's): the whole frames it touches (the kernel never
 * asks for the rest of a frame fetched once), into the kernel's cache
 * file only, not into the chunk cache (docs/ARCHITECTURE.md).
 */
static int fill_blob(struct cf_mount *cm, uint32_t blob, struct cf_sink *s, uint8_t *buf)
{
	const struct cf_job *j = s->j;
	uint64_t size = cm->m->img->blobs.blobs[blob].uncompressed_size;
	uint64_t have = j->off < size ? MIN(j->len, size - j->off) : 0;
	uint32_t first, i;
	int ret = 0;

	s->units = units_of(cm->m->img, blob, &s->nr_units);
	first = unit_after(s->units, s->nr_units, j->off);
	for (i = first; !ret && i < s->nr_units && s->units[i].off < j->off + have; i++)
		ret = fill_unit(cm, blob, j, &s->units[i]);
	if (ret)
		return ret;
	memset(buf, 0, CF_BUF);
	/* A bio's READ lies inside one unit: nothing more to fetch. */
	if (first < s->nr_units && s->units[first].off <= j->off &&
	    s->units[first].off + s->units[first].len >= j->off + have) {
		s->pos = j->off + have;
		return sink_zeros(s, j->off + j->len);
	}
	ret = image_cache_read_frames(cm->m->ic, blob, j->off, have, sink_frame, s);
	if (ret)
		ferry_err("%s: reading blob %u bytes %llu+%llu for the kernel: %s",
			  cm->m->req.image, blob, (unsigned long long)j->off,
			  (unsigned long long)have, ferry_strerror(ret));
	else
		ret = sink_zeros(s, j->off + j->len);
	return ret;
}

/*
 * Write [off, off + len) of the bytes of object @device (as cf_names
 * number them: 0 the bootstrap, blob index + 1) through its anon fd: 0,
 * or -errno (logged) with what was written so far verified.
 */
static int fill(struct cf_mount *cm, uint32_t device, const struct cf_job *j,
		uint8_t *buf)
{
	uint64_t size = object_size(cm, device), pos, end = j->off + j->len;
	struct cf_sink s = { .j = j, .image = cm->m->req.image, .pos = j->off, .zeros = buf };
	int ret = 0;

	/* The cache file is the size rounded up to a page; READs stay inside. */
	if (end < j->off || end > ROUND_UP(size, (uint64_t)CF_ALIGN) || j->off % CF_ALIGN) {
		ferry_err("%s: cachefiles READ %llu+%llu beyond the %s's %llu bytes",
			  cm->m->req.image, (unsigned long long)j->off,
			  (unsigned long long)j->len, device ? "blob" : "bootstrap",
			  (unsigned long long)size);
		return -EINVAL;
	}
	if (device)
		return fill_blob(cm, device - 1, &s, buf);
	/*
	 * The bootstrap is in memory and verified: its first READ gets all
	 * of it, so the metadata of every later lookup, readdir and stat is
	 * in the cache file and costs the kernel no more round trips.
	 */
	end = ROUND_UP(size, (uint64_t)CF_ALIGN);
	for (pos = 0; !ret && pos < end;) {
		size_t n = (size_t)MIN(end - pos, (uint64_t)CF_BUF);
		size_t have = pos < size ? (size_t)MIN((uint64_t)n, size - pos) : 0;

		memcpy(buf, cm->m->img->bootstrap + pos, have);
		/* The page past the end of the bytes. */
		memset(buf + have, 0, n - have);
		ret = sink_write(&s, pos, buf, n);
		pos += n;
	}
	return ret;
}

/* ------------------------------------------------------------------ */
/* Prefetch into the kernel's cache files                              */
/* ------------------------------------------------------------------ */

#define CF_OPEN_WAIT_MS 5000 /* for the kernel to OPEN a blob after mount */

/*
 * The object of blob @blob of @m's image, referenced, or NULL when
 * the kernel has not opened it (in @CF_OPEN_WAIT_MS) or the mount is
 * gone. By @m, its cf_mount looked up under the lock each time: the
 * prefetch thread outlives the mode's state.
 */
static struct cf_object *prefetch_object(struct fmount *m, uint32_t blob)
{
	struct cf_dev *d = mode_state(m->ctx, &cachefiles_mode);
	struct cf_object *o = NULL;
	struct cf_mount *cm;
	unsigned int waited;

	for (waited = 0; !o && waited < CF_OPEN_WAIT_MS && !atomic_load(&m->stop); waited += 10) {
		pthread_mutex_lock(&d->lock);
		for (cm = d->mounts; cm && cm->m != m; cm = cm->next)
			;
		for (o = cm ? d->objects : NULL; o; o = o->next)
			if (cf_names_object_is(&cm->names, blob + 1, o->volume, o->cookie))
				break;
		if (o)
			o->refs++;
		pthread_mutex_unlock(&d->lock);
		if (!cm)
			break;
		if (!o)
			usleep(10000);
	}
	return o;
}

static void prefetch_object_put(struct fmount *m, struct cf_object *o)
{
	struct cf_dev *d = mode_state(m->ctx, &cachefiles_mode);

	pthread_mutex_lock(&d->lock);
	object_put_locked(o);
	pthread_mutex_unlock(&d->lock);
}

/*
 * Does the kernel's cache file hold [uoff, uoff + len) (no hole there)?
 * Units do not count: prefetch leaves them to fill_unit, so a range of
 * units only is not fetched for nothing.
 */
static bool prefetch_has(void *ctx, uint32_t blob, uint64_t uoff, uint64_t len)
{
	struct fmount *m = ctx;
	struct cf_object *o = prefetch_object(m, blob);
	const struct image_span *u;
	uint64_t pos = uoff, end = uoff + len, stop;
	uint32_t nr, i;
	bool has = true;
	off_t hole;

	if (!o)
		return false;
	u = units_of(m->img, blob, &nr);
	for (i = unit_after(u, nr, uoff); has && pos < end; i++) {
		stop = i < nr ? MIN(end, MAX(pos, u[i].off)) : end;
		hole = stop > pos ? lseek(o->fd, (off_t)pos, SEEK_HOLE) : (off_t)stop;
		has = hole >= 0 && (uint64_t)hole >= stop;
		pos = i < nr ? MAX(stop, u[i].off + u[i].len) : end;
	}
	prefetch_object_put(m, o);
	return has;
}

static int prefetch_put(void *ctx, uint32_t blob, uint64_t uoff, const void *buf,
			size_t len)
{
	struct fmount *m = ctx;
	struct cf_object *o = prefetch_object(m, blob);
	const struct image_span *units;
	uint32_t nr_units;
	int ret;

	if (!o) {
		ferry_warn("%s: prefetch: the kernel has not opened blob %u's cache file; nothing prefetched into it",
			   m->req.image, blob);
		return -ENOENT;
	}
	/* Compressed files' units only on demand (fill_unit): whole or not at all. */
	units = units_of(m->img, blob, &nr_units);
	ret = write_outside_units(o->fd, units, nr_units, uoff, buf, len);
	if (ret)
		ferry_err("%s: prefetch: writing %zu bytes at %llu into the cache file of %s: %s",
			  m->req.image, len, (unsigned long long)uoff, o->cookie,
			  ferry_strerror(ret));
	prefetch_object_put(m, o);
	return ret;
}

static void serve_read(struct cf_dev *d, struct cf_job *j, uint8_t *buf)
{
	uint64_t t0 = ferry_now_ns();
	struct cf_mount *cm;
	uint32_t device = 0;
	int ret = -ENOENT;

	pthread_mutex_lock(&d->lock);
	cm = resolve_locked(d, j->obj->volume, j->obj->cookie, &device);
	if (cm)
		cm->busy++;
	pthread_mutex_unlock(&d->lock);
	if (cm) {
		ret = fill(cm, device, j, buf);
		pthread_mutex_lock(&d->lock);
		if (!--cm->busy)
			pthread_cond_broadcast(&d->idle);
		pthread_mutex_unlock(&d->lock);
	} else {
		ferry_err("cachefiles: READ of %s in volume %s: its mount is gone; the reader gets EIO",
			  j->obj->cookie, j->obj->volume);
	}
	/* Always: without the bytes the kernel fails the read with EIO. */
	if (ioctl(j->obj->fd, CACHEFILES_IOC_READ_COMPLETE, (unsigned long)j->msg_id))
		ferry_warn("cachefiles: completing READ %u of %s: %s", j->msg_id,
			   j->obj->cookie, strerror(errno));
	ferry_dbg("cachefiles: READ %u of %.12s %llu+%llu: %s in %llu ms", j->msg_id,
		  j->obj->cookie, (unsigned long long)j->off, (unsigned long long)j->len,
		  ret ? ferry_strerror(ret) : "written",
		  (unsigned long long)((ferry_now_ns() - t0) / 1000000));
}

static void *worker_main(void *arg)
{
	struct cf_worker *w = arg;
	struct cf_dev *d = w->d;
	struct cf_job *j;

	pthread_mutex_lock(&d->lock);
	for (;;) {
		while (!d->head && !d->quit)
			pthread_cond_wait(&d->cond, &d->lock);
		j = d->head;
		if (!j)
			break; /* quit, and the queue is drained */
		d->head = j->next;
		if (!d->head)
			d->tail = &d->head;
		pthread_mutex_unlock(&d->lock);
		serve_read(d, j, w->buf);
		pthread_mutex_lock(&d->lock);
		object_put_locked(j->obj);
		free(j);
	}
	pthread_mutex_unlock(&d->lock);
	free(w->buf);
	w->buf = NULL;
	return NULL;
}

/* ------------------------------------------------------------------ */
/* The device                                                          */
/* ------------------------------------------------------------------ */

/*
 * Record the live mounts' requests for a successor (0600: they may carry
 * registry credentials, as the control socket's requests do). d->life.
 */
static void state_save(struct cf_dev *d)
{
	struct json_object *top = json_object_new_object(), *a = json_object_new_array(), *o;
	const char *text;
	struct cf_mount *cm;
	int ret = top && a && !json_object_object_add(top, "mounts", json_object_get(a)) ?
		  0 : -ENOMEM;

	pthread_mutex_lock(&d->lock);
	for (cm = d->mounts; cm && !ret; cm = cm->next) {
		struct ctl_mount_req req = cm->m->req;

		if (!cm->live)
			continue;
		/* What it is now, whatever "auto" chose. */
		req.mountpoint = cm->m->mountpoint;
		req.mode = cachefiles_mode.name;
		/* The bottom layer's superblock: an overlay has no sysfs name. */
		if (cm->names.layers)
			req.sysfs = cm->sysfs;
		o = ctl_mount_req_to_json(&req);
		if (!o || json_object_array_add(a, o)) {
			json_object_put(o);
			ret = -ENOMEM;
		}
	}
	pthread_mutex_unlock(&d->lock);
	text = ret ? NULL : json_object_to_json_string_ext(top, JSON_C_TO_STRING_PLAIN);
	if (!ret)
		ret = text ? write_file_atomic(d->state_dir, CF_STATE, text, strlen(text), 0600) :
			     -ENOMEM;
	if (ret)
		ferry_warn("cachefiles: recording the mounts in %s/%s for a successor: %s; if ferryd dies they fail with EIO",
			   d->state_dir, CF_STATE, ferry_strerror(ret));
	json_object_put(a);
	json_object_put(top);
}

/*
 * The keeper holding a second descriptor of the device (failover); it
 * passes our options on to the successor it may start. Its guard starts
 * it beside the first mount, not before it: spawning it (an exec, if a
 * small one) costs a cold cachefiles mount's time on a slow machine, and
 * the mount does not need it; failover does, from the moment it said
 * hello. Not at a lower priority: on a busy host that would leave the
 * mounts without failover for as long as the keeper waits for a CPU. A
 * keeper killed is replaced: without one, ferryd's death would leave the
 * mounts failing reads.
 */
static int keeper_start(void *arg, int *sock, int *pid)
{
	struct cf_dev *d = arg;
	const char *const *succ = serve_successor_args(d->ctx);
	const char *args[KEEPER_ARGS_MAX + 1] = { d->ctx->opts.socket_path };
	unsigned int n = 1;

	while (succ[n - 1] && n < KEEPER_ARGS_MAX) {
		args[n] = succ[n - 1];
		n++;
	}
	return keeper_spawn(d->ctx, KEEPER_CACHEFILES, d->fd, args, sock, pid);
}

static int reader_start(struct cf_dev *d)
{
	int ret = -pthread_create(&d->reader, NULL, reader_main, d);

	d->reader_started = !ret;
	return ret;
}

/* Why @CF_DEVICE cannot be had; with @advice, what to do instead. */
static void explain_open(int e, bool advice, char *err, size_t errlen)
{
	const char *other = advice ? "; use --mode fanotify or --mode fuse" : "";
	char comm[64], who[96] = "";
	int pid;

	switch (e) {
	case ENOENT:
	case ENODEV:
	case ENXIO:
		snprintf(err, errlen, "%s: %s: this kernel has no cachefiles on-demand reads (it needs CONFIG_CACHEFILES_ONDEMAND and CONFIG_EROFS_FS_ONDEMAND, Linux 5.19 to 7.1)%s",
			 CF_DEVICE, strerror(e),
			 advice ? "; use --mode fanotify (Linux 6.14+, cache on ext4, xfs or btrfs) or --mode fuse" : "");
		break;
	case EBUSY:
		pid = proc_holder(CF_DEVICE, comm, sizeof(comm));
		if (pid)
			snprintf(who, sizeof(who), " (pid %d, %s)", pid, comm);
		snprintf(err, errlen, "%s is held by another process%s; only one daemon per host may own it (cachefilesd, nydusd or another ferryd)%s",
			 CF_DEVICE, who, advice ? ": stop it, or use --mode fanotify or --mode fuse" : "");
		break;
	case EACCES:
	case EPERM:
		snprintf(err, errlen, "%s: %s (needs root: CAP_SYS_ADMIN)", CF_DEVICE, strerror(e));
		break;
	default:
		snprintf(err, errlen, "%s: %s%s", CF_DEVICE, strerror(e), other);
	}
}

/* Stop the threads and close the device; d->life held. */
static void dev_close(struct cf_dev *d)
{
	struct cf_object *o;
	unsigned int i;

	pthread_mutex_lock(&d->lock);
	d->quit = true;
	pthread_cond_broadcast(&d->cond);
	pthread_mutex_unlock(&d->lock);
	if (d->reader_started) {
		if (write(d->wake[1], "", 1) < 0) {
			/* full: the reader wakes anyway */
		}
		pthread_join(d->reader, NULL);
	}
	for (i = 0; i < d->nr_workers; i++)
		pthread_join(d->workers[i], NULL);
	while ((o = d->objects)) {
		d->objects = o->next;
		close(o->fd);
		free(o);
	}
	if (d->wake[0] >= 0) {
		close(d->wake[0]);
		close(d->wake[1]);
	}
	/* Closing on purpose: the keeper lets go too (the cache unbinds). */
	keeper_guard_stop(&d->keeper);
	if (d->fd >= 0)
		close(d->fd);
	d->fd = d->wake[0] = d->wake[1] = -1;
	d->nr_workers = 0;
	d->reader_started = false;
	d->quit = false;
	d->head = NULL;
	d->tail = &d->head;
}

/*
 * Open and bind the device on the first mount, or take over a dead
 * ferryd's (d->takeover_fd: bound already; the reader starts once its
 * mounts are back, cf_takeover_device); d->life held.
 */
static int dev_open(struct cf_dev *d, const char *cache_dir, char *err, size_t errlen)
{
	char *dir = NULL, *copy = strdup(d->ctx->opts.socket_path);
	bool restoring = d->takeover_fd >= 0;
	unsigned int i;
	int ret;

	if (!copy) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	snprintf(d->state_dir, sizeof(d->state_dir), "%s", dirname(copy));
	free(copy);
	d->tail = &d->head;
	ret = blob_cache_dir(cache_dir, IMAGE_FSCACHE_DIR, true, NULL);
	if (ret) {
		snprintf(err, errlen, "cache directory %s/%s: %s", cache_dir, IMAGE_FSCACHE_DIR,
			 ferry_strerror(ret));
		return ret;
	}
	if (asprintf(&dir, "%s/%s", cache_dir, IMAGE_FSCACHE_DIR) < 0) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	if (d->takeover_fd >= 0) {
		d->fd = d->takeover_fd;
		d->takeover_fd = -1;
		goto bound;
	}
	d->fd = open(CF_DEVICE, O_RDWR | O_CLOEXEC);
	if (d->fd < 0) {
		ret = -errno;
		explain_open(-ret, true, err, errlen);
		goto fail;
	}
	ret = dev_cmd(d, "dir %s", dir);
	if (ret) {
		snprintf(err, errlen, "%s: \"dir %s\": %s", CF_DEVICE, dir, ferry_strerror(ret));
		goto fail;
	}
	ret = dev_cmd(d, "tag %s", CF_TAG);
	if (!ret)
		ret = dev_cmd(d, "bind ondemand");
	if (ret) {
		snprintf(err, errlen, "%s: binding the cache in %s on demand: %s%s", CF_DEVICE, dir,
			 ferry_strerror(ret),
			 ret == -EINVAL ? " (a kernel without CONFIG_CACHEFILES_ONDEMAND; use --mode fanotify or --mode fuse)" :
			 ret == -EOPNOTSUPP ? " (cachefiles cannot keep a cache on that file system, e.g. tmpfs: use a cache directory on ext4 or xfs, --cache-dir)" :
			 ret == -EBUSY ? " (a cache is bound already)" : "");
		goto fail;
	}
bound:
	if (pipe2(d->wake, O_CLOEXEC | O_NONBLOCK)) {
		ret = -errno;
		snprintf(err, errlen, "pipe: %s", strerror(-ret));
		goto fail;
	}
	for (i = 0; i < CF_WORKERS; i++) {
		struct cf_worker *w = &d->worker_args[i];
		void *buf = NULL;

		ret = -posix_memalign(&buf, CF_ALIGN, CF_BUF);
		if (!ret) {
			*w = (struct cf_worker){ .d = d, .buf = buf };
			ret = -pthread_create(&d->workers[i], NULL, worker_main, w);
			if (ret) {
				free(buf);
				w->buf = NULL;
			}
		}
		if (ret)
			break;
		d->nr_workers++;
	}
	if (!ret && !restoring)
		ret = reader_start(d);
	if (ret) {
		snprintf(err, errlen, "cannot start the cachefiles threads: %s", strerror(-ret));
		goto fail;
	}
	snprintf(d->dir, sizeof(d->dir), "%s", dir);
	snprintf(d->cache_dir, sizeof(d->cache_dir), "%s", cache_dir);
	ret = keeper_guard_start_dev(&d->keeper, d->ctx, CF_DEVICE, keeper_start, d);
	if (ret)
		ferry_warn("cachefiles: no keeper for %s (%s): if ferryd dies, its mounts fail reads of missing data with EIO",
			   CF_DEVICE, ferry_strerror(ret));
	if (restoring)
		ferry_info("cachefiles: took over %s from the ferryd that died", CF_DEVICE);
	else
		ferry_info("cachefiles: %s bound on demand, cache in %s", CF_DEVICE, dir);
	free(dir);
	return 0;
fail:
	free(dir);
	dev_close(d);
	return ret;
}

/* ------------------------------------------------------------------ */
/* The mode                                                            */
/* ------------------------------------------------------------------ */

static void cf_free(struct cf_mount *cm)
{
	pthread_mutex_destroy(&cm->lock);
	pthread_cond_destroy(&cm->cond);
	cf_names_free(&cm->names);
	free(cm);
}

/* Out of the table, once no READ uses it; the device closes with the last. */
static void cf_unregister(struct cf_mount *cm)
{
	struct cf_dev *d = cm->d;
	struct cf_mount **pp;
	bool last;

	pthread_mutex_lock(&d->life);
	pthread_mutex_lock(&d->lock);
	for (pp = &d->mounts; *pp != cm; pp = &(*pp)->next)
		;
	*pp = cm->next;
	while (cm->busy)
		pthread_cond_wait(&d->idle, &d->lock);
	/* A takeover keeps the device until it has tried every mount. */
	last = !--d->users && !d->taking_over;
	pthread_mutex_unlock(&d->lock);
	if (cm->live)
		state_save(d);
	if (last) {
		dev_close(d);
		ferry_info("cachefiles: no mount left; %s closed", CF_DEVICE);
	}
	pthread_mutex_unlock(&d->life);
}

static int cf_register(struct cf_mount *cm, char *err, size_t errlen)
{
	struct cf_dev *d = cm->d;
	int ret = 0;

	pthread_mutex_lock(&d->life);
	if (d->fd < 0)
		ret = dev_open(d, cm->m->req.cache_dir, err, errlen);
	else if (strcmp(d->cache_dir, cm->m->req.cache_dir))
		ferry_info("%s: the kernel's cache files go to %s (bound by an earlier mount), the chunk cache to %s",
			   cm->m->mountpoint, d->dir, cm->m->req.cache_dir);
	if (!ret) {
		pthread_mutex_lock(&d->lock);
		d->users++;
		cm->next = d->mounts;
		d->mounts = cm;
		cm->registered = true;
		pthread_mutex_unlock(&d->lock);
	}
	pthread_mutex_unlock(&d->life);
	return ret;
}

static bool sb_alive(const struct cf_mount *cm)
{
	return cm->sysfs[0] && !access(cm->sysfs, F_OK);
}

/*
 * mount(2) the bootstrap (fsid) with the blobs (tags): the kernel OPENs
 * them and READs the superblock before mount(2) returns. A takeover
 * finds the dead ferryd's mount there instead.
 */
static int bootstrap_mount(struct cf_mount *cm, char *err, size_t errlen)
{
	struct fmount *m = cm->m;
	const char *domain = m->req.domain;
	int ret;

	ret = m->req.takeover ? 0 :
			     meta_kernel_mount_fscache(cm->names.fsid, domain, m->mountpoint,
						       image_mount_flags(m->req.suid, m->req.dev));
	if (ret) {
		snprintf(err, errlen, "kernel mount (EROFS over fscache, fsid %s%s%s) on %s failed (see above)",
			 cm->names.fsid, domain ? ", domain " : "", domain ? domain : "",
			 m->mountpoint);
		return ret;
	}
	ret = meta_sysfs_path(m->mountpoint, cm->sysfs, sizeof(cm->sysfs));
	if (!ret && m->req.takeover && !cf_names_sysfs_is(&cm->names, cm->sysfs))
		ret = -ENOENT;
	if (ret && m->req.takeover) {
		snprintf(err, errlen, "%s: the dead ferryd's mount of fsid %s is not there any more (%s)",
			 m->mountpoint, cm->names.fsid, ferry_strerror(ret));
	} else if (ret) {
		snprintf(err, errlen, "%s: cannot identify the mounted EROFS superblock (FS_IOC_GETFSSYSFSPATH): %s",
			 m->mountpoint, ferry_strerror(ret));
		if (umount_nofollow(m->mountpoint, MNT_DETACH))
			ferry_warn("%s: detaching: %s", m->mountpoint, strerror(errno));
	}
	return ret;
}

/*
 * Native layers: each layer an EROFS over fscache of its own (its fsid
 * the layer, or a copy of it when another mount has that one), detached,
 * stacked with overlayfs as in the other modes (image_layers_attach).
 * The bottom layer's superblock lives exactly as long as the stack: its
 * sysfs directory says when the stack is gone, and is recorded for a
 * successor (an overlay has none). A takeover finds the stack mounted.
 */
static int layers_mount(struct cf_mount *cm, char *err, size_t errlen)
{
	struct cf_dev *d = cm->d;
	struct fmount *m = cm->m;
	unsigned long flags = image_mount_flags(m->req.suid, m->req.dev);
	uint32_t n = m->img->blobs.nr_blobs, nr = 0;
	cf_name fsid;
	char fdpath[32];
	int *mfds, ret;
	unsigned int k;

	if (m->req.takeover) {
		snprintf(cm->sysfs, sizeof(cm->sysfs), "%s", m->req.sysfs ? m->req.sysfs : "");
		if (cf_names_sysfs_is(&cm->names, cm->sysfs) && sb_alive(cm))
			return 0;
		snprintf(err, errlen, "%s: the dead ferryd's native layers are not mounted any more (bottom layer's superblock \"%s\")",
			 m->mountpoint, cm->sysfs);
		return -ENOENT;
	}
	mfds = calloc(n, sizeof(*mfds));
	ret = mfds ? 0 : -ENOMEM;
	for (; !ret && nr < n; nr++) {
		ret = -EBUSY;
		for (k = 0; ret == -EBUSY && k < CF_LAYER_COPIES; k++) {
			cf_layer_fsid(cm->names.digests[nr], k, fsid);
			pthread_mutex_lock(&d->lock);
			memcpy(cm->names.layer_fsids[nr], fsid, sizeof(fsid));
			pthread_mutex_unlock(&d->lock);
			ret = meta_kernel_mount_fscache_detached(fsid, flags, &mfds[nr]);
		}
		if (ret == -EBUSY)
			snprintf(err, errlen, "layer sha256:%s is mounted under all its %u fsids already; unmount an image that has it",
				 cm->names.digests[nr], CF_LAYER_COPIES);
		else if (ret)
			snprintf(err, errlen, "kernel mount of layer %u of %u (EROFS over fscache, fsid %s) failed (see above)",
				 nr + 1, n, fsid);
	}
	if (!ret) {
		snprintf(fdpath, sizeof(fdpath), "/proc/self/fd/%d", mfds[0]);
		ret = meta_sysfs_path(fdpath, cm->sysfs, sizeof(cm->sysfs));
		if (ret)
			snprintf(err, errlen, "cannot identify the bottom layer's EROFS superblock (FS_IOC_GETFSSYSFSPATH): %s",
				 ferry_strerror(ret));
	}
	if (!ret) {
		ret = image_layers_attach(mfds, n, m->mountpoint, flags);
		if (ret)
			snprintf(err, errlen, "stacking %u layers on %s failed (see above)", n,
				 m->mountpoint);
	}
	/* The stack holds its own references; ours go (and, failed, the layers). */
	for (uint32_t i = 0; mfds && i < nr; i++)
		if (mfds[i] >= 0)
			close(mfds[i]);
	free(mfds);
	return ret;
}

/*
 * Register the image with the device (opened and bound by the first
 * mount), then mount: live at once.
 */
static int cf_start(struct fmount *m, void **state, char *err, size_t errlen)
{
	struct cf_dev *d = mode_state(m->ctx, &cachefiles_mode);
	struct cf_mount *cm = calloc(1, sizeof(*cm));
	const char *domain = m->req.domain;
	uint32_t i, n = m->img->blobs.nr_blobs;
	int ret;

	ret = cm ? cf_names_init(&cm->names, n, m->img->erofs_layers ? NULL :
					       m->img->bootstrap_digest, domain) : -ENOMEM;
	if (ret) {
		free(cm);
		snprintf(err, errlen, "%s", ferry_strerror(ret));
		return ret;
	}
	/* Native layers' fsids are chosen as they are mounted. */
	for (i = 0; i < n; i++)
		hex_encode(m->img->blobs.blobs[i].digest, BLOB_DIGEST_SIZE, cm->names.digests[i]);
	cm->d = d;
	cm->m = m;
	pthread_mutex_init(&cm->lock, NULL);
	pthread_cond_init(&cm->cond, NULL);

	ret = cf_register(cm, err, errlen);
	if (!ret)
		ret = cm->names.layers ? layers_mount(cm, err, errlen) :
					 bootstrap_mount(cm, err, errlen);
	if (ret)
		goto fail;
	pthread_mutex_lock(&d->lock);
	cm->live = true;
	pthread_mutex_unlock(&d->lock);
	/* Prefetch fills the kernel's cache files, not the chunk cache. */
	image_cache_set_prefetch_sink(m->ic, &(struct image_prefetch_sink){
		.has = prefetch_has, .put = prefetch_put, .ctx = m });
	pthread_mutex_lock(&d->life);
	state_save(d);
	pthread_mutex_unlock(&d->life);
	*state = cm;
	mount_ready(m);
	return 0;
fail:
	if (cm->registered)
		cf_unregister(cm);
	cf_free(cm);
	return ret;
}

/* Until the superblock is gone (0) or cf_stop. */
static int cf_serve(void *state)
{
	struct cf_mount *cm = state;
	struct timespec ts;

	pthread_mutex_lock(&cm->lock);
	while (!cm->stop && sb_alive(cm)) {
		ferry_deadline_ts(&ts, SB_CHECK_MS);
		pthread_cond_timedwait(&cm->cond, &cm->lock, &ts);
	}
	pthread_mutex_unlock(&cm->lock);
	return 0;
}

static void cf_stop(void *state)
{
	struct cf_mount *cm = state;

	pthread_mutex_lock(&cm->lock);
	cm->stop = true;
	pthread_cond_broadcast(&cm->cond);
	pthread_mutex_unlock(&cm->lock);
}

/*
 * After cf_serve. A superblock still alive (busy at shutdown, a fatal
 * error) is served no more: its reads of data not in the cache files
 * fail with EIO.
 */
static void cf_close(void *state, int ret)
{
	struct cf_mount *cm = state;

	if (ret)
		mount_detach(cm->m);
	if (sb_alive(cm))
		ferry_warn("%s: still mounted and in use; reads of data not yet in its cache files fail with EIO until it is unmounted",
			   cm->m->mountpoint);
	cf_unregister(cm);
	cf_free(cm);
}

/* /dev/cachefiles is ours, or could be: opened and closed at once. */
static int cf_probe(void *mode_ctx, const struct ctl_mount_req *req, char *why, size_t len)
{
	struct cf_dev *d = mode_ctx;
	int fd, ret = 0;

	pthread_mutex_lock(&d->life);
	if (d->fd < 0 && d->takeover_fd < 0) {
		fd = open(CF_DEVICE, O_RDWR | O_CLOEXEC);
		if (fd < 0)
			ret = -errno;
		else
			close(fd);
	}
	pthread_mutex_unlock(&d->life);
	if (ret)
		explain_open(-ret, false, why, len);
	else
		snprintf(why, len, "EROFS over fscache (%s)", CF_DEVICE);
	return ret;
}

static void cf_stats(void *state, struct ctl_mount_stats *s)
{
	struct cf_mount *cm = state;

	s->keeper_pid = atomic_load(&cm->d->keeper.pid);
}

/* ------------------------------------------------------------------ */
/* Failover                                                            */
/* ------------------------------------------------------------------ */

/*
 * The successor: take over /dev/cachefiles (@devfd) and the cachefiles
 * mounts the dead ferryd recorded next to the socket, then have the
 * kernel send again what was pending ("restore"). Mounts that cannot be
 * taken over, and all when none can, fail their reads with EIO.
 */
static void cf_takeover_device(struct serve_ctx *ctx, void *mode_ctx, int devfd)
{
	struct cf_dev *d = mode_ctx;
	struct json_object *top = NULL, *a = NULL;
	char path[PATH_MAX], err[4096];
	size_t i, nr = 0, ok = 0;
	int ret;

	ret = cf_recorded_mounts(ctx->opts.socket_path, path, sizeof(path), &top, &a);
	if (ret)
		ferry_err("cachefiles: the dead ferryd's mounts (%s): %s", path, ferry_strerror(ret));
	else
		nr = json_object_array_length(a);
	pthread_mutex_lock(&d->life);
	d->takeover_fd = devfd;
	d->taking_over = true;
	pthread_mutex_unlock(&d->life);
	for (i = 0; i < nr; i++) {
		struct ctl_mount_req req;

		ret = ctl_mount_req_parse(json_object_array_get_idx(a, i), &req, err, sizeof(err));
		if (ret) {
			ferry_err("cachefiles: %s, entry %zu: %s", path, i, err);
			ctl_mount_req_free(&req);
			continue;
		}
		req.takeover = true;
		ferry_info("cachefiles: taking over %s on %s", req.image, req.mountpoint);
		if (!serve_mount(ctx, &req, NULL, err, sizeof(err)))
			ok++;
	}
	pthread_mutex_lock(&d->life);
	d->taking_over = false;
	if (d->takeover_fd >= 0 || !d->users) {
		/* Nothing taken over: the kernel fails what waits with EIO. */
		if (d->takeover_fd >= 0)
			close(d->takeover_fd);
		d->takeover_fd = -1;
		if (d->fd >= 0)
			dev_close(d);
		ferry_err("cachefiles: no mount of the dead ferryd taken over; its readers get EIO");
	} else {
		ret = dev_cmd(d, "restore");
		if (!ret)
			ret = reader_start(d);
		if (ret)
			ferry_err("cachefiles: restoring the requests of the dead ferryd: %s",
				  ferry_strerror(ret));
		else
			ferry_info("cachefiles: took over %zu of %zu mounts; the kernel sends their requests again",
				   ok, nr);
	}
	pthread_mutex_unlock(&d->life);
	json_object_put(top);
}

const struct serve_mode cachefiles_mode = {
	.name = "cachefiles",
	.fstype = "erofs",
	.serves_layers = true,
	.walks_on_takeover = true, /* it reads no file the kernel watches, and needs the units */
	.keeper_succeeds = true,
	.init = cf_init,
	.fini = cf_fini,
	.takeover_device = cf_takeover_device,
	.start = cf_start,
	.serve = cf_serve,
	.stop = cf_stop,
	.close = cf_close,
	.stats = cf_stats,
	.probe = cf_probe,
};
