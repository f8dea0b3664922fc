// SPDX-License-Identifier: MIT
/*
 * dir: sources: a directory tree walked through descriptors, entries
 * sorted by name so the image does not depend on readdir order. Every
 * entry is opened relative to its directory's descriptor without following
 * a link (O_PATH | O_NOFOLLOW, then reopened through it), and what is
 * stored is what fstat says of that descriptor: a directory another user
 * swaps for a link while root converts cannot lead the walk out of the
 * tree (a path walked again would follow it), and no FIFO or device is
 * ever opened for reading. Xattrs are copied, hardlinks are found by
 * (dev, ino), and SEEK_DATA lets holes of sparse files skip reading.
 */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "internal.h"

struct fd_reader {
	int fd;
};

static int fd_read_exact(void *ctx, void *buf, size_t len)
{
	struct fd_reader *r = ctx;
	int ret = read_full(r->fd, buf, len);

	/* A file that shrank while we read it would silently lose data. */
	return ret == -EIO ? -ESTALE : ret;
}

/* Sparse files: SEEK_DATA tells whether the next bytes hold any data. */
static bool fd_skip_hole(void *ctx, uint64_t len)
{
	struct fd_reader *r = ctx;
	off_t pos = lseek(r->fd, 0, SEEK_CUR), data;

	if (pos < 0)
		return false;
	data = lseek(r->fd, pos, SEEK_DATA);
	if (data < 0 && errno != ENXIO) {
		lseek(r->fd, pos, SEEK_SET);
		return false;
	}
	if (data >= 0 && (uint64_t)data < (uint64_t)pos + len) {
		lseek(r->fd, pos, SEEK_SET);
		return false;
	}
	return lseek(r->fd, pos + (off_t)len, SEEK_SET) >= 0;
}

/*
 * The xattrs of the entry open at @fd (O_PATH), named @path in messages.
 * The f*xattr calls take no O_PATH descriptor: its /proc/self/fd link
 * names exactly that inode (a symlink entry itself, not what it points
 * to: a magic link is not resolved any further).
 */
static int copy_xattrs(struct meta_inode *inode, int fd, const char *path)
{
	char *names = NULL, *value = NULL, *name, fdpath[32];
	ssize_t len, vlen;
	int ret = 0;

	snprintf(fdpath, sizeof(fdpath), "/proc/self/fd/%d", fd);
	len = listxattr(fdpath, NULL, 0);
	if (len <= 0) {
		if (len < 0 && errno != ENOTSUP)
			ret = -errno;
		goto out;
	}
	names = malloc((size_t)len);
	value = malloc(META_XATTR_VALUE_MAX + 1);
	if (!names || !value) {
		ret = -ENOMEM;
		goto out;
	}
	len = listxattr(fdpath, names, (size_t)len);
	if (len < 0) {
		ret = -errno;
		goto out;
	}
	for (name = names; name < names + len; name += strlen(name) + 1) {
		vlen = getxattr(fdpath, name, value, META_XATTR_VALUE_MAX + 1);
		if (vlen < 0) {
			ret = -errno;
			ferry_err("%s: xattr %s: %s", path, name, strerror(errno));
			goto out;
		}
		ret = meta_inode_set_xattr(inode, name, value, (uint32_t)vlen);
		if (ret)
			goto out;
	}
out:
	if (ret && ret != -ENOMEM)
		ferry_err("%s: cannot read xattrs: %s", path, ferry_strerror(ret));
	free(names);
	free(value);
	return ret;
}

static void set_attrs(struct meta_inode *inode, const struct stat *st)
{
	inode->mode = st->st_mode;
	inode->uid = st->st_uid;
	inode->gid = st->st_gid;
	inode->mtime = st->st_mtim.tv_sec;
	inode->mtime_nsec = (uint32_t)st->st_mtim.tv_nsec;
	if (S_ISCHR(st->st_mode) || S_ISBLK(st->st_mode)) {
		inode->rdev_major = major(st->st_rdev);
		inode->rdev_minor = minor(st->st_rdev);
	}
}

static struct meta_inode *find_hardlink(struct converter *c,
					const struct stat *st)
{
	size_t i;

	for (i = c->nr_links; i-- > 0;)
		if (c->links[i].dev == st->st_dev && c->links[i].ino == st->st_ino)
			return c->links[i].inode;
	return NULL;
}

static int remember_hardlink(struct converter *c, const struct stat *st,
			     struct meta_inode *inode)
{
	if (array_reserve(&c->links, &c->links_cap, c->nr_links + 1,
			  sizeof(*c->links), 64))
		return -ENOMEM;
	c->links[c->nr_links++] = (struct hardlink){ st->st_dev, st->st_ino, inode };
	return 0;
}

static int cmp_names(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/*
 * Sorted names of the directory open at @fd (O_PATH), named @path in
 * messages (without "." and "..").
 */
static int list_dir(int fd, const char *path, char ***names_out, size_t *nr_out)
{
	char **names = NULL;
	size_t nr = 0, cap = 0;
	struct dirent *de;
	int dfd = openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d = dfd < 0 ? NULL : fdopendir(dfd);
	int ret = 0;

	if (!d) {
		ret = -errno;
		ferry_err("%s: cannot open directory: %s", path, strerror(errno));
		if (dfd >= 0)
			close(dfd);
		return ret;
	}
	while ((errno = 0, de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (array_reserve(&names, &cap, nr + 1, sizeof(*names), 64)) {
			ret = -ENOMEM;
			goto out;
		}
		names[nr] = strdup(de->d_name);
		if (!names[nr]) {
			ret = -ENOMEM;
			goto out;
		}
		nr++;
	}
	if (errno) {
		ret = -errno;
		ferry_err("%s: readdir: %s", path, strerror(errno));
		goto out;
	}
	if (nr) /* qsort(NULL, 0) is undefined */
		qsort(names, nr, sizeof(*names), cmp_names);
out:
	closedir(d);
	if (ret) {
		while (nr)
			free(names[--nr]);
		free(names);
		return ret;
	}
	*names_out = names;
	*nr_out = nr;
	return 0;
}

static int add_dir_tree(struct converter *c, struct meta_inode *dir, int fd,
			const char *path, unsigned int depth);

/* A regular file's or a symlink's content, read through @fd (O_PATH). */
static int add_content(struct converter *c, struct meta_inode *inode, int fd,
		       const struct stat *st, const char *path)
{
	struct fd_reader reader = { .fd = -1 };
	struct file_source src = { fd_read_exact, fd_skip_hole, &reader };
	char fdpath[32], *target;
	ssize_t n;
	int ret;

	if (S_ISLNK(st->st_mode)) {
		target = malloc((size_t)st->st_size + 1);
		if (!target)
			return -ENOMEM;
		n = readlinkat(fd, "", target, (size_t)st->st_size + 1);
		if (n < 0 || n != st->st_size) {
			free(target);
			ferry_err("%s: cannot read symlink (changed while reading?)", path);
			return n < 0 ? -errno : -ESTALE;
		}
		inode->data = (uint8_t *)target;
		inode->size = (uint64_t)n;
		return 0;
	}
	/* The very inode fstat described, opened for reading. */
	snprintf(fdpath, sizeof(fdpath), "/proc/self/fd/%d", fd);
	reader.fd = open(fdpath, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
	if (reader.fd < 0) {
		ret = -errno;
		ferry_err("%s: %s", path, strerror(errno));
		return ret;
	}
	ret = convert_ingest_file(c, inode, (uint64_t)st->st_size, &src, path,
				  path + c->dir_root_len + 1);
	close(reader.fd);
	return ret;
}

/* Convert entry @name of @dir (open at @dirfd), found at @path. */
static int add_dir_entry(struct converter *c, struct meta_inode *dir, int dirfd,
			 const char *path, const char *name, unsigned int depth)
{
	struct meta_inode *inode = NULL;
	struct stat st;
	int fd, ret = convert_cancelled(c);

	if (ret)
		return ret;
	fd = openat(dirfd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st)) {
		ret = -errno;
		ferry_err("%s: %s", path, strerror(errno));
		goto out;
	}
	c->stats->entries++;
	if (!S_ISDIR(st.st_mode) && st.st_nlink > 1) {
		inode = find_hardlink(c, &st);
		if (inode) {
			c->stats->hardlinks++;
			ret = meta_dir_link(c->tree, dir, name, strlen(name), inode);
			goto out;
		}
	}
	ret = meta_inode_new(c->tree, st.st_mode, &inode);
	if (ret)
		goto out;
	set_attrs(inode, &st);
	ret = copy_xattrs(inode, fd, path);
	if (ret)
		goto out;

	switch (st.st_mode & S_IFMT) {
	case S_IFREG:
		c->stats->files++;
		ret = add_content(c, inode, fd, &st, path);
		break;
	case S_IFLNK:
		c->stats->symlinks++;
		ret = add_content(c, inode, fd, &st, path);
		break;
	case S_IFDIR:
		c->stats->dirs++;
		break;
	default:
		c->stats->specials++;
		break;
	}
	if (ret)
		goto out;
	if (!S_ISDIR(st.st_mode) && st.st_nlink > 1) {
		ret = remember_hardlink(c, &st, inode);
		if (ret)
			goto out;
	}
	ret = meta_dir_link(c->tree, dir, name, strlen(name), inode);
	if (ret) {
		ferry_err("%s: cannot add to the image: %s", path, ferry_strerror(ret));
		goto out;
	}
	if (S_ISDIR(st.st_mode))
		ret = add_dir_tree(c, inode, fd, path, depth + 1);
out:
	if (fd >= 0)
		close(fd);
	return ret;
}

static int add_dir_tree(struct converter *c, struct meta_inode *dir, int fd,
			const char *path, unsigned int depth)
{
	char **names = NULL;
	size_t nr = 0, i;
	char *child = NULL;
	int ret;

	if (depth > 4096) {
		ferry_err("%s: directory tree deeper than 4096 levels", path);
		return -ELOOP;
	}
	ret = list_dir(fd, path, &names, &nr);
	if (ret)
		return ret;
	for (i = 0; i < nr && !ret; i++) {
		if (asprintf(&child, "%s/%s", path, names[i]) < 0) {
			ret = -ENOMEM;
			break;
		}
		ret = add_dir_entry(c, dir, fd, child, names[i], depth);
		free(child);
	}
	for (i = 0; i < nr; i++)
		free(names[i]);
	free(names);
	return ret;
}

int convert_dir(struct converter *c, const char *path)
{
	struct rlimit rl;
	struct stat st;
	int fd, ret;

	/* The root as the operator named it (links followed), then only below it. */
	fd = open(path, O_PATH | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st)) {
		ret = -errno;
		ferry_err("%s: %s", path, strerror(errno));
		goto out;
	}
	if (!S_ISDIR(st.st_mode)) {
		ferry_err("%s: not a directory", path);
		ret = -ENOTDIR;
		goto out;
	}
	/* The walk holds a descriptor per level (at most 4096). */
	if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	c->dir_root_len = strlen(path);
	set_attrs(c->tree->root, &st);
	ret = copy_xattrs(c->tree->root, fd, path);
	if (ret)
		goto out;
	ferry_progress_begin(&c->progress, "converting", 0);
	ret = add_dir_tree(c, c->tree->root, fd, path, 0);
	ferry_progress_end(&c->progress);
out:
	if (fd >= 0)
		close(fd);
	return ret;
}
