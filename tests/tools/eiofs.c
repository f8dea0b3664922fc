/* SPDX-License-Identifier: MIT */
/*
 * eiofs BACKING MOUNTPOINT [FUSE OPTIONS]: a FUSE file system holding one
 * file, MOUNTPOINT/disk, whose bytes are BACKING's, that fails reads with
 * EIO on demand: SIGUSR1 turns the failures on, SIGUSR2 off. A loop device
 * over MOUNTPOINT/disk then gives a file system (ext4) read errors from
 * its block device, as a failing disk would: the node fault matrix's
 * stand-in for device-mapper's error and flakey targets, which the
 * development kernel does not have (tests/lib/node.sh). Writes always
 * pass, so that the file system's journal stays intact. Runs in the
 * foreground; on exit it prints how many reads it failed.
 */
#define FUSE_USE_VERSION 312
#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *backing_path;
static int backing_fd = -1;
static volatile sig_atomic_t failing;
static atomic_ulong failed_reads;

static void on_signal(int sig)
{
	failing = sig == SIGUSR1;
}

static int eio_getattr(const char *path, struct stat *st, struct fuse_file_info *fi)
{
	memset(st, 0, sizeof(*st));
	if (!strcmp(path, "/")) {
		st->st_mode = S_IFDIR | 0755;
		st->st_nlink = 2;
		return 0;
	}
	if (strcmp(path, "/disk"))
		return -ENOENT;
	if (fstat(backing_fd, st))
		return -errno;
	st->st_mode = S_IFREG | 0600;
	st->st_nlink = 1;
	return 0;
}

static int eio_readdir(const char *path, void *buf, fuse_fill_dir_t fill, off_t off,
		       struct fuse_file_info *fi, enum fuse_readdir_flags flags)
{
	if (strcmp(path, "/"))
		return -ENOTDIR;
	fill(buf, ".", NULL, 0, 0);
	fill(buf, "..", NULL, 0, 0);
	fill(buf, "disk", NULL, 0, 0);
	return 0;
}

static int eio_open(const char *path, struct fuse_file_info *fi)
{
	if (strcmp(path, "/disk"))
		return -ENOENT;
	/* No page cache in between: every read reaches us. */
	fi->direct_io = 1;
	return 0;
}

static int eio_read(const char *path, char *buf, size_t len, off_t off,
		    struct fuse_file_info *fi)
{
	ssize_t n;

	if (failing) {
		atomic_fetch_add(&failed_reads, 1);
		return -EIO;
	}
	n = pread(backing_fd, buf, len, off);
	return n < 0 ? -errno : (int)n;
}

static int eio_write(const char *path, const char *buf, size_t len, off_t off,
		     struct fuse_file_info *fi)
{
	ssize_t n = pwrite(backing_fd, buf, len, off);

	return n < 0 ? -errno : (int)n;
}

static int eio_fsync(const char *path, int datasync, struct fuse_file_info *fi)
{
	return fdatasync(backing_fd) ? -errno : 0;
}

static const struct fuse_operations eio_ops = {
	.getattr = eio_getattr,
	.readdir = eio_readdir,
	.open = eio_open,
	.read = eio_read,
	.write = eio_write,
	.fsync = eio_fsync,
};

int main(int argc, char **argv)
{
	struct sigaction sa = { .sa_handler = on_signal };
	char *fargs[16] = { argv[0], "-f" };
	int nr = 2, i, ret;

	if (argc < 3 || argc > 14) {
		fprintf(stderr, "usage: eiofs BACKING MOUNTPOINT [FUSE OPTIONS]\n");
		return 2;
	}
	backing_path = argv[1];
	backing_fd = open(backing_path, O_RDWR | O_CLOEXEC);
	if (backing_fd < 0) {
		fprintf(stderr, "eiofs: %s: %s\n", backing_path, strerror(errno));
		return 1;
	}
	for (i = 2; i < argc; i++)
		fargs[nr++] = argv[i];
	sigemptyset(&sa.sa_mask);
	sigaction(SIGUSR1, &sa, NULL);
	sigaction(SIGUSR2, &sa, NULL);
	ret = fuse_main(nr, fargs, &eio_ops, NULL);
	fprintf(stderr, "eiofs: failed %lu reads\n", atomic_load(&failed_reads));
	close(backing_fd);
	return ret;
}
