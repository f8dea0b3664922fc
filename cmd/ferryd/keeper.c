// SPDX-License-Identifier: MIT
/*
 * The fanotify keeper: ferryd --keeper GROUP_FD SOCK_FD MOUNTPOINT
 * SOURCE SWEEP_MAX, started by fanotify.c for one mount (SOURCE: the
 * mount's source in mountinfo).
 *
 * It holds a descriptor of the mount's fanotify group so that the group
 * outlives ferryd: were the last descriptor closed, the kernel would
 * allow every pending read and later ones would see the sparse cache
 * files' holes as zeros. While ferryd lives the keeper only listens on
 * its socket: "sysfs PATH" names the superblock's sysfs directory, "bye"
 * (the superblock is gone) ends it. When the socket closes without "bye",
 * ferryd is gone: the keeper denies with EIO every event ferryd had read
 * but not answered (the kernel matches answers by descriptor number, so
 * it answers every number below ferryd's descriptor limit). From then on
 * until the superblock is gone — unmounting it (ferry umount) ends the
 * keeper — it allows ferry's fills (another ferryd writing the same cache
 * files: fan_fill_process) and reads of ranges without holes, and denies every
 * other read with EIO. A range without holes holds verified bytes only:
 * the cache writes a chunk after verifying it, and an interrupted write
 * stops at a page boundary, leaving the rest a hole. The marks stay on the
 * cache files meanwhile, so a new mount of the same blobs from the same
 * cache may get EIO for data not yet cached until the dead mount is
 * unmounted. Single-threaded and small on purpose.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ferryd.h"
#include "fanotify.h"

#define KEEPER_CHECK_MS 1000 /* how often a serving keeper checks the superblock */
#define KEEPER_START_MS 30000 /* a new keeper to say hello */

int keeper_spawn(const char *how, int fd, const char *const *args, int *sock,
		 int *pid)
{
	char exe[PATH_MAX], sfd[16], fds[16], hello[64];
	const char *argv[KEEPER_ARGS_MAX + 5] = { exe, how, fds, sfd };
	struct pollfd p;
	int sv[2], status, n_args = 4;
	ssize_t n;
	pid_t child;

	while (*args && n_args < (int)ARRAY_SIZE(argv) - 1)
		argv[n_args++] = *args++;
	/* argv[0] for ps; the binary itself through /proc/self/exe, which
	 * works even after ferryd was replaced on disk. */
	n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (n <= 0)
		return -errno;
	exe[n] = '\0';
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv))
		return -errno;
	snprintf(fds, sizeof(fds), "%d", fd);
	snprintf(sfd, sizeof(sfd), "%d", sv[1]);
	child = fork();
	if (child < 0) {
		close(sv[0]);
		close(sv[1]);
		return -errno;
	}
	if (!child) {
		sigset_t none;

		/* Only async-signal-safe calls until exec. ferryd's threads
		 * block signals the keeper must still receive. */
		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		setsid();
		if (fork())
			_exit(0);
		close_range(3, ~0u, CLOSE_RANGE_CLOEXEC);
		fcntl(fd, F_SETFD, 0);
		fcntl(sv[1], F_SETFD, 0);
		execv("/proc/self/exe", (char *const *)argv);
		_exit(127);
	}
	close(sv[1]);
	waitpid(child, &status, 0);
	p = (struct pollfd){ .fd = sv[0], .events = POLLIN };
	n = poll(&p, 1, KEEPER_START_MS) == 1 ? recv(sv[0], hello, sizeof(hello) - 1, 0) : -1;
	if (n <= 0 || (hello[n] = '\0', sscanf(hello, "pid %d", pid) != 1)) {
		ferry_err("the keeper (%s %s) did not start", exe, how);
		close(sv[0]);
		return -ECHILD;
	}
	*sock = sv[0];
	return 0;
}

int keeper_hello(int sock)
{
	char hello[32];

	fcntl(sock, F_SETFD, FD_CLOEXEC);
	signal(SIGPIPE, SIG_IGN);
	signal(SIGINT, SIG_IGN);
	log_init(!isatty(2));
	snprintf(hello, sizeof(hello), "pid %d", (int)getpid());
	return send(sock, hello, strlen(hello), MSG_NOSIGNAL) < 0 ? -errno : 0;
}

int keeper_wait(int sock, char *msg, size_t len)
{
	ssize_t n;

	for (;;) {
		n = recv(sock, msg, len - 1, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return 1;
		msg[n] = '\0';
		if (!strcmp(msg, "bye"))
			return 0;
		return 2;
	}
}

struct keeper {
	int group, sock;
	const char *mountpoint, *source;
	unsigned int sweep_max;
	char sysfs[160];
	struct ferry_exes exes;
};

static int parse_uint(const char *s, unsigned int *out)
{
	char *end;
	unsigned long v;

	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno || end == s || *end || v > 1u << 20)
		return -EINVAL;
	*out = (unsigned int)v;
	return 0;
}

static void respond(int group, int fd, bool allow)
{
	struct fanotify_response r = {
		.fd = fd,
		.response = allow ? FAN_ALLOW : FAN_DENY_ERRNO(EIO),
	};

	/* ENOENT (sweeping: a number with no pending event) is expected. */
	(void)!write(group, &r, sizeof(r));
}

/* No hole in [@off, @end) of the data file @fd (see above). */
static bool range_written(int fd, uint64_t off, uint64_t end)
{
	off_t hole;

	if (off >= end)
		return true;
	hole = lseek(fd, (off_t)off, SEEK_HOLE);
	return hole >= 0 && (uint64_t)hole >= end;
}

static void handle_event(struct keeper *k, const struct fanotify_event_metadata *meta)
{
	uint64_t off = 0, count = UINT64_MAX;
	struct stat st;
	bool allow;

	if (meta->fd < 0)
		return;
	if (meta->mask & FAN_PRE_ACCESS) {
		fan_event_range(meta, &off, &count);
		allow = fan_fill_process(&k->exes, meta->pid, meta->fd) ||
			(!fstat(meta->fd, &st) && off <= (uint64_t)st.st_size &&
			 range_written(meta->fd, off,
				       off + MIN(count, (uint64_t)st.st_size - off)));
		respond(k->group, meta->fd, allow);
	}
	close(meta->fd);
}

/* Listen to ferryd until "bye" (0) or until it is gone (1). */
static int listen_to_ferryd(struct keeper *k)
{
	char msg[sizeof(k->sysfs) + 6];
	int ret;

	while ((ret = keeper_wait(k->sock, msg, sizeof(msg))) == 2)
		if (!strncmp(msg, "sysfs ", 6))
			snprintf(k->sysfs, sizeof(k->sysfs), "%s", msg + 6);
	return ret;
}

/* Our superblock, if ferryd died before it could name it. */
static void find_sb(struct keeper *k)
{
	struct mount_entry mi;

	if (k->sysfs[0] || mountinfo_find(k->mountpoint, &mi) ||
	    strcmp(mi.fstype, "erofs") || strcmp(mi.source, k->source))
		return;
	fan_sysfs_path(k->mountpoint, k->sysfs, sizeof(k->sysfs));
}

static void serve_alone(struct keeper *k)
{
	uint64_t buf[4096], next_check = 0;
	unsigned int fd;

	ferry_warn("keeper of %s: ferryd is gone; reads of data not yet cached fail with EIO until it is unmounted (ferry umount %s)",
		   k->mountpoint, k->mountpoint);
	for (fd = 0; fd < k->sweep_max; fd++)
		respond(k->group, (int)fd, false);
	find_sb(k);
	ferry_exes_find(&k->exes);
	for (;;) {
		struct pollfd p = { .fd = k->group, .events = POLLIN };
		const struct fanotify_event_metadata *meta;
		uint64_t now = ferry_now_ns();
		ssize_t n;

		if (now >= next_check) {
			if (!k->sysfs[0] || access(k->sysfs, F_OK))
				break;
			next_check = now + KEEPER_CHECK_MS * 1000000ull;
		}
		if (poll(&p, 1, KEEPER_CHECK_MS) <= 0)
			continue;
		n = read(k->group, buf, sizeof(buf));
		for (meta = (const void *)buf; n > 0 && FAN_EVENT_OK(meta, n);
		     meta = FAN_EVENT_NEXT(meta, n))
			handle_event(k, meta);
	}
	ferry_info("keeper of %s: unmounted; exiting", k->mountpoint);
}

int keeper_main(int argc, char **argv)
{
	struct keeper k = { 0 };
	unsigned int gfd, sfd;

	if (argc != 7 || parse_uint(argv[2], &gfd) || parse_uint(argv[3], &sfd) ||
	    parse_uint(argv[6], &k.sweep_max)) {
		fprintf(stderr, "ferryd --keeper: started by ferryd only\n");
		return 2;
	}
	k.group = (int)gfd;
	k.sock = (int)sfd;
	k.mountpoint = argv[4];
	k.source = argv[5];
	fcntl(k.group, F_SETFD, FD_CLOEXEC);
	if (keeper_hello(k.sock))
		return 1;
	if (listen_to_ferryd(&k))
		serve_alone(&k);
	return 0;
}
