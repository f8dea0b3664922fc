// SPDX-License-Identifier: MIT
/*
 * FUSE mode (fuse_mode, mode.h): the FUSE low-level operations of one
 * mount, its session and its mount(2). Metadata comes from the bootstrap
 * (pkg-meta, immutable and thread-safe), file data through the image's
 * chunk cache (image_cache_read fetches what is missing). Nothing is kept
 * per inode: inode numbers are EROFS nids (plus 2; the root is
 * FUSE_ROOT_ID), so forget has nothing to drop and hard links share one
 * number. The image never changes, so the kernel may cache everything
 * forever: entries, negative entries, attributes, pages, directories,
 * symlinks.
 *
 * Failover: a keeper (ferryd-keeper fuse, keeper.h) holds the mount's
 * /dev/fuse descriptor, so the connection outlives ferryd. When ferryd
 * dies it hands descriptor and request to a successor (keeper_handover),
 * whose fuse_start takes the mount over (fs_takeover) instead of mounting.
 */
#include <float.h>
#include <stdarg.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <sys/sysmacros.h>
#include <fuse_log.h>

#include "fusefs.h"

#define FS_TIMEOUT DBL_MAX
#define FS_BLKSIZE 4096u
#define FS_MAX_READ (512u << 10) /* READ size; see fs_init */
#define FS_XATTR_MAX 65536u    /* the kernel's XATTR_SIZE_MAX / LIST_MAX */
/* Long enough for the kernel's page-by-page retries after a failed read, short
 * enough that a program trying again a moment later fetches again. */
#define FS_FAIL_MEMO_NS (500ull * 1000000)

fuse_ino_t fs_ino(const struct fs *fs, uint64_t nid)
{
	return nid == fs->root_nid ? FUSE_ROOT_ID : (fuse_ino_t)(nid + 2);
}

/* 0 and *@nid, or -EINVAL for a number we never handed out. */
static int ino_to_nid(const struct fs *fs, fuse_ino_t ino, uint64_t *nid)
{
	if (ino == FUSE_ROOT_ID) {
		*nid = fs->root_nid;
		return 0;
	}
	if (ino < 2)
		return -EINVAL;
	*nid = (uint64_t)ino - 2;
	return 0;
}

static void fill_stat(const struct fs *fs, const struct meta_stat *ms,
		      struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = fs_ino(fs, ms->nid);
	st->st_mode = ms->mode;
	st->st_nlink = ms->nlink;
	st->st_uid = ms->uid;
	st->st_gid = ms->gid;
	st->st_size = (off_t)ms->size;
	st->st_rdev = makedev(ms->rdev_major, ms->rdev_minor);
	st->st_blksize = FS_BLKSIZE;
	st->st_blocks = (blkcnt_t)DIV_ROUND_UP(ms->size, 512);
	st->st_mtim.tv_sec = ms->mtime;
	st->st_mtim.tv_nsec = ms->mtime_nsec;
	st->st_atim = st->st_mtim;
	st->st_ctim = st->st_mtim;
}

static struct fs *req_fs(fuse_req_t req)
{
	return fuse_req_userdata(req);
}

/*
 * Answer a failed operation. Expected outcomes (absent names and xattrs,
 * short buffers) are silent; anything else is logged with the image and
 * inode, since the caller only sees an errno.
 */
static void reply_err(fuse_req_t req, const char *op, uint64_t nid, int err)
{
	struct fs *fs = req_fs(req);

	switch (err) {
	case -ENOENT:
	case -ENODATA:
	case -ERANGE:
	case -ENOTDIR:
	case -EISDIR:
	case -ENAMETOOLONG:
	case -EROFS:
		break;
	default:
		ferry_err("%s: %s of inode %llu failed: %s", fs->img->ref, op,
			  (unsigned long long)nid, ferry_strerror(err));
	}
	fuse_reply_err(req, err < 0 && err > -4096 ? -err : EIO);
}

static int get_stat(fuse_req_t req, fuse_ino_t ino, const char *op,
		    struct meta_stat *ms)
{
	struct fs *fs = req_fs(req);
	uint64_t nid = 0;
	int ret = ino_to_nid(fs, ino, &nid);

	if (!ret)
		ret = meta_getattr(fs->img->meta, nid, ms);
	if (ret)
		reply_err(req, op, nid, ret);
	return ret;
}

static void fill_entry(const struct fs *fs, const struct meta_stat *ms,
		       struct fuse_entry_param *e)
{
	memset(e, 0, sizeof(*e));
	e->ino = fs_ino(fs, ms->nid);
	e->generation = 1;
	fill_stat(fs, ms, &e->attr);
	e->attr_timeout = FS_TIMEOUT;
	e->entry_timeout = FS_TIMEOUT;
}

/*
 * With FUSE_CAP_POSIX_ACL the kernel enforces ACLs, and to do so it asks
 * for system.posix_acl_access (one GETXATTR round trip) before the first
 * permission check of every inode the caller does not own: a tree walk by
 * a non-root user pays one per directory. Without an ACL in the image the
 * mode bits alone decide (default_permissions), so only images with one
 * ask for the capability (image_validate_metadata, which every mount
 * runs, notes whether there is one).
 */
static void fs_init(void *userdata, struct fuse_conn_info *conn)
{
	struct fs *fs = userdata;
	unsigned int want = FUSE_CAP_ASYNC_READ | FUSE_CAP_CACHE_SYMLINKS |
			    FUSE_CAP_PARALLEL_DIROPS | FUSE_CAP_READDIRPLUS;

	if (fs->img->has_posix_acls)
		want |= FUSE_CAP_POSIX_ACL;
	conn->want |= want & conn->capable;
	fs->no_open = conn->capable & FUSE_CAP_NO_OPEN_SUPPORT;
	fs->no_opendir = conn->capable & FUSE_CAP_NO_OPENDIR_SUPPORT;
	/* Nothing changes under the kernel's page cache. */
	conn->want &= ~FUSE_CAP_AUTO_INVAL_DATA;
	/*
	 * Always READDIRPLUS: one answer brings every entry's attributes, so
	 * a tree walk (readdir, then stat of each entry) needs no LOOKUPs.
	 */
	conn->want &= ~FUSE_CAP_READDIRPLUS_AUTO;
	/*
	 * Data replies splice from the cache files (fs_read), after
	 * image_cache_map has verified and accounted the chunks. Kernel
	 * readahead: the kernel's offer is the ceiling; keep it (ferryd raises the bdi's
	 * read_ahead_kb after mounting).
	 */
	conn->want |= (FUSE_CAP_SPLICE_WRITE | FUSE_CAP_SPLICE_MOVE) & conn->capable;
	conn->max_background = 64;
	conn->congestion_threshold = 48;
	conn->time_gran = 1;
	/*
	 * The kernel's largest READ is max_write rounded to pages. libfuse
	 * splices a reply only if it fits its pipe with a few pages to
	 * spare, and the pipe cannot grow past pipe-max-size (1 MiB by
	 * default): a 1 MiB reply was copied through a 1 MiB buffer
	 * allocated for it, which grew ferryd's heap by tens of MiB.
	 * The mount is read-only, so nothing else depends on max_write.
	 */
	conn->max_write = FS_MAX_READ;
	mount_ready(fs->m);
}

static void fs_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct fs *fs = req_fs(req);
	struct fuse_entry_param e;
	struct meta_stat ms;
	uint64_t pnid = 0, nid;
	size_t len = strlen(name);
	int ret;

	if (len > META_NAME_MAX) {
		fuse_reply_err(req, ENAMETOOLONG);
		return;
	}
	ret = ino_to_nid(fs, parent, &pnid);
	if (!ret)
		ret = meta_lookup(fs->img->meta, pnid, name, len, &nid);
	if (ret == -ENOENT) {
		/* A negative entry, cached as long as positive ones. */
		memset(&e, 0, sizeof(e));
		e.entry_timeout = FS_TIMEOUT;
		fuse_reply_entry(req, &e);
		return;
	}
	if (!ret)
		ret = meta_getattr(fs->img->meta, nid, &ms);
	if (ret) {
		reply_err(req, "lookup", pnid, ret);
		return;
	}
	fill_entry(fs, &ms, &e);
	fuse_reply_entry(req, &e);
}

static void fs_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
	fuse_reply_none(req);
}

static void fs_forget_multi(fuse_req_t req, size_t count,
			    struct fuse_forget_data *forgets)
{
	fuse_reply_none(req);
}

static void fs_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct meta_stat ms;
	struct stat st;

	if (get_stat(req, ino, "getattr", &ms))
		return;
	fill_stat(req_fs(req), &ms, &st);
	fuse_reply_attr(req, &st, FS_TIMEOUT);
}

static void fs_readlink(fuse_req_t req, fuse_ino_t ino)
{
	struct meta_stat ms;
	char *buf;
	ssize_t n;

	if (get_stat(req, ino, "readlink", &ms))
		return;
	if (!S_ISLNK(ms.mode) || ms.size > META_SYMLINK_MAX) {
		reply_err(req, "readlink", ms.nid, S_ISLNK(ms.mode) ? -EFSCORRUPTED : -EINVAL);
		return;
	}
	buf = malloc(ms.size + 1);
	if (!buf) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	n = meta_readlink(req_fs(req)->img->meta, ms.nid, buf, ms.size + 1);
	if (n < 0)
		reply_err(req, "readlink", ms.nid, (int)n);
	else
		fuse_reply_readlink(req, buf);
	free(buf);
}

static void fs_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct meta_stat ms;

	/* As fs_open: the kernel then caches directories (FOPEN_CACHE_DIR)
	 * and sends no OPENDIR/RELEASEDIR. */
	if (req_fs(req)->no_opendir) {
		fuse_reply_err(req, ENOSYS);
		return;
	}
	if (get_stat(req, ino, "opendir", &ms))
		return;
	if (!S_ISDIR(ms.mode)) {
		fuse_reply_err(req, ENOTDIR);
		return;
	}
	fi->cache_readdir = 1;
	fi->keep_cache = 1;
	fuse_reply_open(req, fi);
}

struct readdir_ctx {
	fuse_req_t req;
	struct fs *fs;
	char *buf;
	size_t size, len;
	bool plus;
	bool from_start;   /* the answer starts the directory */
	uint64_t dir;
	uint64_t prev_reg; /* the last regular file packed, for dra_listed */
	int err;
};

static int readdir_fill(void *arg, const char *name, size_t len, uint64_t nid,
			unsigned int file_type, uint64_t next_pos)
{
	struct readdir_ctx *c = arg;
	char nm[META_NAME_MAX + 1];
	size_t need;

	if (!len || len > META_NAME_MAX) {
		c->err = -EFSCORRUPTED;
		return 1;
	}
	memcpy(nm, name, len);
	nm[len] = '\0';
	if (c->plus) {
		struct fuse_entry_param e;
		struct meta_stat ms;
		int ret = meta_getattr(c->fs->img->meta, nid, &ms);

		if (ret) {
			c->err = ret;
			return 1;
		}
		fill_entry(c->fs, &ms, &e);
		need = fuse_add_direntry_plus(c->req, c->buf + c->len, c->size - c->len,
					      nm, &e, (off_t)next_pos);
		if (need <= c->size - c->len && S_ISREG(ms.mode)) {
			dra_listed(c->fs, c->dir, nid, next_pos, c->prev_reg,
				   c->from_start);
			c->prev_reg = nid;
		}
	} else {
		struct stat st = { .st_ino = fs_ino(c->fs, nid),
				   .st_mode = meta_ftype_mode(file_type) };

		need = fuse_add_direntry(c->req, c->buf + c->len, c->size - c->len, nm,
					 &st, (off_t)next_pos);
	}
	if (need > c->size - c->len)
		return 1; /* full: this entry comes first next time */
	c->len += need;
	return 0;
}

static void do_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		       bool plus)
{
	struct readdir_ctx c = { .req = req, .fs = req_fs(req), .plus = plus };
	uint64_t nid = 0;
	int ret;

	c.size = MIN(size, (size_t)1 << 20);
	c.buf = malloc(c.size);
	if (!c.buf) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	ret = ino_to_nid(c.fs, ino, &nid);
	c.dir = nid;
	c.from_start = off == 0;
	if (!ret && off >= 0)
		ret = meta_readdir(c.fs->img->meta, nid, (uint64_t)off, readdir_fill, &c);
	if (ret > 0)
		ret = c.err;
	/* Entries already packed are answered; the error comes next call. */
	if (ret < 0 && !c.len)
		reply_err(req, plus ? "readdirplus" : "readdir", nid, ret);
	else
		fuse_reply_buf(req, c.buf, c.len);
	free(c.buf);
}

static void fs_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		       struct fuse_file_info *fi)
{
	do_readdir(req, ino, size, off, false);
}

static void fs_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size,
			   off_t off, struct fuse_file_info *fi)
{
	do_readdir(req, ino, size, off, true);
}

static void fs_releasedir(fuse_req_t req, fuse_ino_t ino,
			  struct fuse_file_info *fi)
{
	fuse_reply_err(req, 0);
}

/*
 * Files need no per-open state: the image never changes. With
 * FUSE_CAP_NO_OPEN_SUPPORT, ENOSYS tells the kernel to stop sending OPEN
 * and RELEASE at all (it then keeps the page cache, as keep_cache does),
 * which saves two round trips per file. The mount is read-only, so the
 * kernel refuses writes before they get here.
 */
static void fs_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct meta_stat ms;

	if ((fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC)) {
		fuse_reply_err(req, EROFS);
		return;
	}
	if (req_fs(req)->no_open) {
		fuse_reply_err(req, ENOSYS);
		return;
	}
	if (get_stat(req, ino, "open", &ms))
		return;
	if (!S_ISREG(ms.mode)) {
		fuse_reply_err(req, S_ISDIR(ms.mode) ? EISDIR : EINVAL);
		return;
	}
	fi->keep_cache = 1;
	fi->noflush = 1;
	fuse_reply_open(req, fi);
}

/* One read buffer per worker thread, freed when the thread ends. */
static pthread_key_t buf_key;
static pthread_once_t buf_once = PTHREAD_ONCE_INIT;

struct rbuf {
	size_t cap;
	uint8_t data[];
};

static void buf_key_init(void)
{
	pthread_key_create(&buf_key, free);
}

static uint8_t *read_buf(size_t size)
{
	struct rbuf *b;

	pthread_once(&buf_once, buf_key_init);
	b = pthread_getspecific(buf_key);
	if (b && b->cap >= size)
		return b->data;
	free(b);
	b = malloc(sizeof(*b) + size);
	pthread_setspecific(buf_key, b);
	if (!b)
		return NULL;
	b->cap = size;
	return b->data;
}

/*
 * When a read fails the kernel asks again at once, page by page; each of
 * those would sit through the fetch's timeouts and retries again, so for
 * FS_FAIL_MEMO_NS reads in the chunk that just failed fail at once. The
 * memo holds the last failure of the mount.
 */
static bool failed_recently(struct fs *fs, const struct meta_stat *ms,
			    uint64_t off)
{
	bool ret;

	if (!ms->nr_chunks || !ms->chunk_size)
		return false;
	pthread_mutex_lock(&fs->fail_lock);
	ret = fs->failed_until && fs->failed_nid == ms->nid &&
	      off / ms->chunk_size == fs->failed_chunk &&
	      ferry_now_ns() < fs->failed_until;
	pthread_mutex_unlock(&fs->fail_lock);
	return ret;
}

/*
 * Remember a failed read that lay in one chunk, so its chunk is known.
 * (image_cache_read stops at the first chunk that fails, so a later read
 * starting in that chunk would fail there too.)
 */
static void note_failure(struct fs *fs, const struct meta_stat *ms,
			 uint64_t off, size_t size)
{
	uint64_t cs = ms->chunk_size;

	if (!ms->nr_chunks || !cs || !size || off / cs != (off + size - 1) / cs)
		return;
	pthread_mutex_lock(&fs->fail_lock);
	fs->failed_nid = ms->nid;
	fs->failed_chunk = off / cs;
	fs->failed_until = ferry_now_ns() + FS_FAIL_MEMO_NS;
	pthread_mutex_unlock(&fs->fail_lock);
}

#define FS_MAP_EXTENTS 8

/*
 * Reply with the cache file pieces behind the read: 0 when replied,
 * -E2BIG when it needs the copying path, or -errno (not replied).
 */
static ssize_t reply_mapped(fuse_req_t req, struct fs *fs,
			    const struct meta_stat *ms, uint64_t off, size_t size)
{
	struct image_extent ext[FS_MAP_EXTENTS];
	/* fuse_bufvec ends in buf[1]: room for the other extents after it. */
	struct {
		struct fuse_bufvec v;
		struct fuse_buf more[FS_MAP_EXTENTS - 1];
	} bv;
	struct fuse_buf *b = bv.v.buf;
	ssize_t nr = image_cache_map(fs->ic, ms, off, size, ext, FS_MAP_EXTENTS);
	size_t i;

	if (nr < 0)
		return nr;
	for (i = 0; i < (size_t)nr; i++)
		if (ext[i].fd < 0) {
			image_cache_map_end(fs->ic);
			return -E2BIG; /* a hole: zeros come from memory */
		}
	bv.v = (struct fuse_bufvec){ .count = (size_t)nr };
	for (i = 0; i < (size_t)nr; i++)
		b[i] = (struct fuse_buf){
			.size = ext[i].len,
			.flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK |
				 FUSE_BUF_FD_RETRY,
			.fd = ext[i].fd,
			.pos = (off_t)ext[i].off,
		};
	/* The splice takes the pages: eviction may punch them after this. */
	fuse_reply_data(req, &bv.v, FUSE_BUF_SPLICE_MOVE);
	image_cache_map_end(fs->ic);
	return 0;
}

static void fs_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		    struct fuse_file_info *fi)
{
	struct fs *fs = req_fs(req);
	struct meta_stat st;
	const struct meta_stat *ms = &st;
	uint8_t *buf;
	ssize_t n;

	if (off < 0) {
		fuse_reply_err(req, EINVAL);
		return;
	}
	if (get_stat(req, ino, "read", &st))
		return;
	if (!S_ISREG(st.mode)) {
		fuse_reply_err(req, EINVAL);
		return;
	}
	size = MIN(size, (size_t)16 << 20);
	if (!off)
		dra_read(fs, ms->nid);
	if (fs->rec)
		record_read(fs->rec, ms->nid);
	ferry_dbg("%s: read inode %llu: %zu bytes at %lld", fs->img->ref,
		  (unsigned long long)ms->nid, size, (long long)off);
	if (failed_recently(fs, ms, (uint64_t)off)) {
		ferry_dbg("%s: inode %llu: chunk %llu failed moments ago",
			  fs->img->ref, (unsigned long long)ms->nid,
			  (unsigned long long)((uint64_t)off / ms->chunk_size));
		fuse_reply_err(req, EIO);
		return;
	}
	/*
	 * Chunked data is verified and in the cache files once mapped: the
	 * reply points at them, and libfuse splices the pages to the kernel
	 * without copying them through ferryd. Inline files, holes and reads
	 * spanning many chunks take the copying path.
	 */
	if (ms->nr_chunks && (uint64_t)off < ms->size) {
		n = reply_mapped(req, fs, ms, (uint64_t)off, size);
		if (n != -E2BIG)
			goto done;
	}
	buf = read_buf(MAX(size, (size_t)1));
	if (!buf) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	n = image_cache_read(fs->ic, ms, (uint64_t)off, buf, size);
	if (n >= 0)
		fuse_reply_buf(req, (const char *)buf, (size_t)n);
done:
	if (n < 0) {
		/* image_cache has named the blob and chunk. */
		ferry_err("%s: read of inode %llu (%zu bytes at %lld) failed: %s",
			  fs->img->ref, (unsigned long long)ms->nid, size,
			  (long long)off, ferry_strerror((int)n));
		note_failure(fs, ms, (uint64_t)off,
			     MIN(size, (size_t)(ms->size > (uint64_t)off ?
						ms->size - (uint64_t)off : 0)));
		fuse_reply_err(req, EIO);
	}
}

static void fs_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	fuse_reply_err(req, 0);
}

static void fs_statfs(fuse_req_t req, fuse_ino_t ino)
{
	struct fs *fs = req_fs(req);
	struct statvfs sv = {
		.f_bsize = FS_BLKSIZE,
		.f_frsize = FS_BLKSIZE,
		.f_blocks = DIV_ROUND_UP(fs->total_bytes, FS_BLKSIZE),
		.f_files = fs->inos,
		.f_namemax = META_NAME_MAX,
		.f_flag = ST_RDONLY,
	};

	fuse_reply_statfs(req, &sv);
}

/* getxattr / listxattr: @size 0 asks for the length. */
static void xattr_reply(fuse_req_t req, fuse_ino_t ino, const char *name,
			size_t size)
{
	struct fs *fs = req_fs(req);
	uint64_t nid = 0;
	char *buf = NULL;
	ssize_t n;
	int ret = ino_to_nid(fs, ino, &nid);

	if (ret) {
		reply_err(req, name ? "getxattr" : "listxattr", nid, ret);
		return;
	}
	size = MIN(size, (size_t)FS_XATTR_MAX);
	if (size && !(buf = malloc(size))) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	n = name ? meta_getxattr(fs->img->meta, nid, name, buf, size) :
		   meta_listxattr(fs->img->meta, nid, buf, size);
	if (n < 0)
		reply_err(req, name ? "getxattr" : "listxattr", nid, (int)n);
	else if (!size)
		fuse_reply_xattr(req, (size_t)n);
	else
		fuse_reply_buf(req, buf, (size_t)n);
	free(buf);
}

static void fs_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name,
			size_t size)
{
	xattr_reply(req, ino, name, size);
}

static void fs_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
	xattr_reply(req, ino, NULL, size);
}

static const struct fuse_lowlevel_ops fs_ops = {
	.init = fs_init,
	.lookup = fs_lookup,
	.forget = fs_forget,
	.forget_multi = fs_forget_multi,
	.getattr = fs_getattr,
	.readlink = fs_readlink,
	.open = fs_open,
	.read = fs_read,
	.release = fs_release,
	.opendir = fs_opendir,
	.readdir = fs_readdir,
	.readdirplus = fs_readdirplus,
	.releasedir = fs_releasedir,
	.statfs = fs_statfs,
	.getxattr = fs_getxattr,
	.listxattr = fs_listxattr,
};


/* ------------------------------------------------------------------ */
/* Session and mount                                                   */
/* ------------------------------------------------------------------ */

/* libfuse's messages as ferryd's log lines. */
static void fuse_log_fn(enum fuse_log_level level, const char *fmt, va_list ap)
{
	char line[1024];
	size_t n;
	int lvl = level <= FUSE_LOG_ERR ? FERRY_LOG_ERR :
		  level == FUSE_LOG_WARNING ? FERRY_LOG_WARN :
		  level <= FUSE_LOG_INFO ? FERRY_LOG_INFO : FERRY_LOG_DEBUG;

	vsnprintf(line, sizeof(line), fmt, ap);
	n = strlen(line);
	while (n && line[n - 1] == '\n')
		line[--n] = '\0';
	if (n)
		ferry_log(lvl, "libfuse: %s", line);
}

/*
 * A session serving @fs (not mounted yet), with directory readahead when
 * fs->dra_window_max is set; -EIO after a log line.
 */
static int fs_session_new(struct fs *fs)
{
	char *argv[] = { "ferryd", NULL };
	struct fuse_args args = FUSE_ARGS_INIT(1, argv);
	int ret;

	fuse_set_log_func(fuse_log_fn);
	fs->se = fuse_session_new(&args, &fs_ops, sizeof(fs_ops), fs);
	fuse_opt_free_args(&args);
	if (!fs->se) {
		ferry_err("%s: cannot create a FUSE session", fs->img->ref);
		return -EIO;
	}
	ret = dra_start(fs, fs->se, fs->dra_window_max);
	if (ret)
		ferry_warn("%s: no directory readahead: %s", fs->img->ref,
			   ferry_strerror(ret));
	return 0;
}

/*
 * After its loop has ended: end the connection (requests still pending
 * fail), stop directory readahead, free the session.
 */
static void fs_session_destroy(struct fs *fs)
{
	int fd = fuse_session_fd(fs->se), null = -1;

	/*
	 * A directory readahead store may wait on a page the kernel locked
	 * for a READ that no worker will answer now: ending the connection
	 * fails that READ and releases the page. /dev/null takes the
	 * descriptor's number rather than closing it, since libfuse closes
	 * it again.
	 */
	if (fs->dra && fd >= 0) {
		null = open("/dev/null", O_RDWR | O_CLOEXEC);
		if (null < 0 || dup3(null, fd, O_CLOEXEC) < 0)
			ferry_warn("%s: ending the FUSE connection early: %s",
				   fs->img->ref, strerror(errno));
		if (null >= 0)
			close(null);
	}
	dra_stop(fs);
	fuse_session_destroy(fs->se);
	fs->se = NULL;
}

/*
 * mount(2) ourselves and hand libfuse the /dev/fuse descriptor as
 * "/dev/fd/N": libfuse then never unmounts by path (fuse_session_unmount
 * would lazily unmount whatever is on the mount point by then), and
 * ferryd decides when and what to unmount. Type fuse.ferry, source
 * ferry:<image>, options ro, default_permissions, allow_other, and
 * nosuid,nodev unless the request trusts the image (allow_other lets
 * every user run its files).
 */
static int fs_mount(struct fs *fs, const struct ctl_mount_req *req,
		    const char *mountpoint)
{
	char *opts = NULL, *source = NULL, devfd[32];
	int fd, ret = 0;

	fd = open("/dev/fuse", O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		ret = -errno;
		ferry_err("%s: cannot open /dev/fuse: %s", fs->img->ref, strerror(errno));
		return ret;
	}
	if (asprintf(&opts, "fd=%d,rootmode=%o,user_id=%u,group_id=%u,"
		     "default_permissions,allow_other", fd, (unsigned int)S_IFDIR,
		     (unsigned int)getuid(), (unsigned int)getgid()) < 0 ||
	    asprintf(&source, "ferry:%s", fs->img->ref) < 0) {
		ret = -ENOMEM;
		goto out;
	}
	if (mount_nofollow(source, mountpoint, CTL_FUSE_FSTYPE,
		  MS_RDONLY | image_mount_flags(req->suid, req->dev), opts)) {
		ret = -errno;
		ferry_err("%s: mount(2) of FUSE on %s: %s", fs->img->ref, mountpoint,
			  strerror(errno));
		goto out;
	}
	snprintf(devfd, sizeof(devfd), "/dev/fd/%d", fd);
	if (fuse_session_mount(fs->se, devfd)) {
		ret = -EIO;
		if (umount_nofollow(mountpoint, MNT_DETACH))
			ferry_warn("%s: detaching %s: %s", fs->img->ref, mountpoint,
				   strerror(errno));
		goto out;
	}
	fd = -1; /* the session's now */
out:
	if (fd >= 0)
		close(fd);
	free(opts);
	free(source);
	return ret;
}

/*
 * Take over the live connection @fd (a keeper's, now ours) of the mount
 * on fs->m->mountpoint: a session on it, the INIT it missed, and the
 * requests the dead ferryd had read sent again (fuse_shim.c).
 */
static int fs_takeover(struct fs *fs, int fd)
{
	struct fuse_buf buf = { 0 };
	char devfd[32], init[256];
	struct stat st;
	int ret;

	if (fstat(fd, &st) || !S_ISCHR(st.st_mode) || st.st_rdev != makedev(10, 229)) {
		ferry_err("%s: the descriptor handed over is not /dev/fuse", fs->m->mountpoint);
		close(fd);
		return -EINVAL;
	}
	snprintf(devfd, sizeof(devfd), "/dev/fd/%d", fd);
	if (fuse_session_mount(fs->se, devfd)) {
		close(fd);
		return -EIO;
	}
	buf.mem = init;
	buf.size = fuse_shim_init(init, sizeof(init));
	fuse_session_process_buf(fs->se, &buf);
	ret = fuse_shim_resend(fd);
	if (ret)
		ferry_warn("%s: FUSE_NOTIFY_RESEND: %s; requests the dead ferryd had read stay unanswered (Linux 6.9+ sends them again); later ones are served",
			   fs->m->mountpoint, ferry_strerror(ret));
	ferry_info("%s: FUSE mount taken over%s", fs->m->mountpoint,
		   ret ? "" : "; its requests in flight are sent again");
	return 0;
}

/* ------------------------------------------------------------------ */
/* The mode                                                            */
/* ------------------------------------------------------------------ */

/* Wakes a session loop blocked in sem_wait (fuse_stop). */
static void wake_handler(int sig)
{
	(void)sig;
}

static void wake_init(void)
{
	struct sigaction sa = { .sa_handler = wake_handler };

	/* No SA_RESTART: the loop's sem_wait must return EINTR. */
	sigemptyset(&sa.sa_mask);
	sigaction(SIGUSR2, &sa, NULL);
}

static void fs_free(struct fs *fs)
{
	if (fs->rec)
		ferry_info("%s: recorded %llu files to %s", fs->m->mountpoint,
			   (unsigned long long)record_count(fs->rec), fs->m->req.record);
	record_free(fs->rec);
	pthread_mutex_destroy(&fs->fail_lock);
	free(fs);
}

static int fuse_start(struct fmount *m, void **state, char *why, size_t whylen)
{
	static pthread_once_t wake_once = PTHREAD_ONCE_INIT;
	const struct serve_fuse_opts *o = &m->ctx->opts.fuse;
	struct fs *fs = calloc(1, sizeof(*fs));
	struct meta_super sb;
	int ret;

	if (!fs)
		return -ENOMEM;
	pthread_once(&wake_once, wake_init);
	meta_get_super(m->img->meta, &sb);
	fs->m = m;
	fs->img = m->img;
	fs->ic = m->ic;
	fs->root_nid = sb.root_nid;
	fs->inos = sb.inos;
	fs->total_bytes = mount_bytes(m);
	fs->threads = o->threads;
	fs->readahead_kb = o->readahead_kb;
	/*
	 * A recording mount stores no files ahead: a file that directory
	 * readahead put in the page cache is read without a READ, and would
	 * be missing from the list (20 of the 85 files of a Python import).
	 */
	fs->dra_window_max = m->req.record ? 0 : o->dir_readahead_kb << 10;
	pthread_mutex_init(&fs->fail_lock, NULL);
	ret = m->req.record ? record_start(fs, m->req.record, &fs->rec) : 0;
	if (ret) {
		snprintf(why, whylen, "--record %s: %s", m->req.record, ferry_strerror(ret));
		fs_free(fs);
		return ret;
	}
	if (m->req.takeover && m->req.takeover_fd < 0) {
		snprintf(why, whylen, "a FUSE mount is taken over with its /dev/fuse descriptor");
		fs_free(fs);
		return -EINVAL;
	}
	ret = fs_session_new(fs);
	if (!ret && m->req.takeover) {
		ret = fs_takeover(fs, m->req.takeover_fd);
		m->req.takeover_fd = -1;
	} else if (!ret) {
		ret = fs_mount(fs, &m->req, m->mountpoint);
	}
	if (ret && fs->se)
		fs_session_destroy(fs);
	if (ret) {
		fs_free(fs);
		return ret;
	}
	ret = keeper_guard_start(&fs->keeper, KEEPER_FUSE, fuse_session_fd(fs->se), m);
	if (ret)
		ferry_warn("%s: no FUSE keeper (%s): if ferryd dies, the mount is dead (ENOTCONN)",
			   m->mountpoint, ferry_strerror(ret));
	*state = fs;
	return 0;
}

/* The session loop, multithreaded. */
static int fuse_serve(void *state)
{
	struct fs *fs = state;
	struct fuse_loop_config *cfg = fuse_loop_cfg_create();
	sigset_t set;
	int ret;

	if (!cfg) {
		ferry_err("%s on %s: out of memory", fs->img->ref, fs->m->mountpoint);
		return -ENOMEM;
	}
	fuse_loop_cfg_set_max_threads(cfg, fs->threads);
	/* One descriptor, the keeper's too: a clone's requests die with it. */
	fuse_loop_cfg_set_clone_fd(cfg, 0);
	/* Only this thread (and its workers) takes SIGUSR2, fuse_stop's. */
	sigemptyset(&set);
	sigaddset(&set, SIGUSR2);
	pthread_sigmask(SIG_UNBLOCK, &set, NULL);
	ret = fuse_session_loop_mt(fs->se, cfg);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	fuse_loop_cfg_destroy(cfg);
	return ret;
}

/* Flag the session as exited and interrupt the loop's sem_wait. */
static void fuse_stop(void *state)
{
	struct fs *fs = state;

	fuse_session_exit(fs->se);
	pthread_kill(fs->m->loop_thread, SIGUSR2);
	/* Ending on purpose: should a worker keep ferryd from a clean exit,
	 * no successor must take the mount over. */
	keeper_guard_stop(&fs->keeper);
}

/*
 * ferryd exits for an upgrade: the loop cancels its workers where they
 * wait for a request, so none is killed while the kernel copies one to
 * it (that request would fail with EIO); what is pending or half
 * answered the successor gets (FUSE_NOTIFY_RESEND). Mount and keeper stay.
 */
static void fuse_quiesce(void *state)
{
	struct fs *fs = state;

	fuse_session_exit(fs->se);
	pthread_kill(fs->m->loop_thread, SIGUSR2);
}

/*
 * Make the FUSE bdi's readahead match the largest READ (the kernel offers
 * 128 KiB): fewer, larger FUSE requests. Not more: a page fault in a
 * mapped file reads the whole window around it (mmap read-around), and at
 * 1 MiB a loader mapping liblapack read into its code, whose miss queued
 * the rest of it (`import numpy`: 23.8 MB fetched against fanotify's
 * 20.8). After INIT, whose answer would lower it again.
 */
static void fuse_live(void *state)
{
	struct fs *fs = state;
	char path[64], val[16];
	int fd, n;

	if (!fs->readahead_kb)
		return;
	snprintf(path, sizeof(path), "/sys/class/bdi/%u:%u/read_ahead_kb",
		 fs->m->dev_major, fs->m->dev_minor);
	n = snprintf(val, sizeof(val), "%u", fs->readahead_kb);
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0 || write_full(fd, val, (size_t)n))
		ferry_dbg("%s: cannot set %s: %s", fs->m->mountpoint, path,
			  strerror(errno));
	if (fd >= 0)
		close(fd);
}

/* The connection to the kernel is gone (unmounted, or aborted). */
static bool conn_dead(struct fuse_session *se)
{
	struct pollfd pfd = { .fd = fuse_session_fd(se), .events = 0 };

	return pfd.fd < 0 || (poll(&pfd, 1, 0) == 1 && (pfd.revents & POLLERR));
}

/*
 * Detach our mount if the connection still lives, then closing /dev/fuse
 * ends it: programs with files open get ENOTCONN.
 */
static void fuse_close(void *state, int ret)
{
	struct fs *fs = state;

	if (!conn_dead(fs->se))
		mount_detach(fs->m);
	/* The keeper's descriptor would keep the connection alive. */
	keeper_guard_stop(&fs->keeper);
	fs_session_destroy(fs);
	fs_free(fs);
}

static void fuse_stats(void *state, struct ctl_mount_stats *s)
{
	struct fs *fs = state;

	s->keeper_pid = atomic_load(&fs->keeper.pid);
	s->readahead_files = atomic_load(&fs->ra_files);
	s->readahead_bytes = atomic_load(&fs->ra_bytes);
}

static int fs_probe(void *mode_ctx, const struct ctl_mount_req *req, char *why, size_t len)
{
	int ret = access("/dev/fuse", R_OK | W_OK) ? -errno : 0;

	snprintf(why, len, "/dev/fuse: %s", ret ? strerror(-ret) : "FUSE, any kernel");
	return ret;
}

const struct serve_mode fuse_mode = {
	.name = "fuse",
	.fstype = CTL_FUSE_FSTYPE,
	.records_reads = true,
	.probe = fs_probe,
	.start = fuse_start,
	.serve = fuse_serve,
	.stop = fuse_stop,
	.live = fuse_live,
	.close = fuse_close,
	.quiesce = fuse_quiesce,
	.stats = fuse_stats,
};
