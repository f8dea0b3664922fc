// SPDX-License-Identifier: MIT
/*
 * ferryd-keeper: the keepers of ferryd's mounts (keeper.h). Each holds a
 * mount's kernel descriptor so that it outlives ferryd, and hands it to a
 * successor ferryd (keeper_handover: the mount's request and the
 * descriptor over the control socket, SCM_RIGHTS; a ferryd started when
 * none answers). A program of its own, linked against neither libcurl,
 * OpenSSL, libfuse nor the codecs, because one starts on every FUSE and
 * fanotify mount's path: an exec of ferryd loads ~35 shared libraries.
 *
 * The fanotify keeper:
 *
 * It holds a descriptor of the mount's fanotify group so that the group
 * outlives ferryd: were the last descriptor closed, the kernel would
 * allow every pending read and later ones would see the sparse cache
 * files' holes as zeros. While ferryd lives the keeper only listens on
 * its socket: "sysfs PATH" names the superblock's sysfs directory, "bye"
 * (the superblock is gone) ends it. When the socket closes without "bye",
 * ferryd is gone: the keeper hands the group over; only when no ferryd
 * takes it does it deny with EIO every event ferryd had read
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
#include <time.h>
#include <unistd.h>

#include "../pkg-base/base.h"
#include "../pkg-meta/meta.h"
#include "fanotify.h"
#include "keeper.h"
#include "serve.h"

#define KEEPER_CHECK_MS 1000  /* how often a serving keeper checks the superblock */
#define HANDOVER_MS 60000     /* to find a successor and hand a mount over */
#define HANDOVER_SPAWN_MS 300 /* before starting one beside a cachefiles keeper */
#define HANDOVER_RESPAWN_MS 5000 /* between starts */
#define HANDOVER_POLL_MS 50

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

/*
 * Leave ferryd (it waits for the process it started, then reaps nothing
 * more), then signals, log, and hello on @sock. 0 or -errno.
 */
static int keeper_hello(int sock)
{
	char hello[32];
	pid_t child = fork();

	if (child < 0)
		return -errno;
	if (child)
		_exit(0);
	fcntl(sock, F_SETFD, FD_CLOEXEC);
	signal(SIGPIPE, SIG_IGN);
	signal(SIGINT, SIG_IGN);
	ferry_log_stream(!isatty(2));
	snprintf(hello, sizeof(hello), "pid %d", (int)getpid());
	return send(sock, hello, strlen(hello), MSG_NOSIGNAL) < 0 ? -errno : 0;
}

/*
 * The next message from ferryd into @msg: 2 (a message), 0 ("bye": ferryd
 * let go on purpose) or 1 (the socket closed: ferryd is gone).
 */
static int keeper_wait(int sock, char *msg, size_t len)
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

/* @fd reports an error or hang-up now (a poll that does not wait). */
static bool descriptor_failed(int fd)
{
	struct pollfd w = { .fd = fd };

	return poll(&w, 1, 0) == 1 && (w.revents & (POLLERR | POLLHUP));
}

/*
 * A mount's keeper: listen to ferryd until "bye" (0), until ferryd is
 * gone (1), "alone" (2: ferryd shut down leaving the mount in use), or
 * until @watch (>= 0) reports an error (3: the kernel ended the mount's
 * connection; seen within KEEPER_CHECK_MS). The request goes into *@req;
 * other messages to @note.
 */
static int keeper_listen(int sock, int watch, char **req,
			 void (*note)(void *ctx, const char *msg), void *ctx)
{
	char *msg = malloc(KEEPER_MSG_MAX);
	struct pollfd p = { .fd = sock, .events = POLLIN };
	int ret = -1, ready;
	ssize_t n;

	if (!msg)
		return 1;
	while (ret < 0) {
		/*
		 * @watch is looked at, never waited on: a poll waiting on
		 * /dev/fuse would wake this process at every request the
		 * mount gets (the kernel wakes the device's pollers as it
		 * queues one), a context switch more per request.
		 */
		ready = poll(&p, 1, watch >= 0 ? KEEPER_CHECK_MS : -1);
		if (ready < 0) {
			if (errno != EINTR)
				ret = 1;
			continue;
		}
		if (watch >= 0 && descriptor_failed(watch)) {
			ret = 3;
			continue;
		}
		if (!ready)
			continue;
		n = recv(sock, msg, KEEPER_MSG_MAX - 1, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			ret = 1;
			continue;
		}
		msg[n] = '\0';
		if (!strcmp(msg, "bye"))
			ret = 0;
		else if (!strcmp(msg, "alone"))
			ret = 2;
		else if (!strncmp(msg, "req ", 4) && req) {
			free(*req);
			*req = strdup(msg + 4);
		} else if (note) {
			note(ctx, msg);
		}
	}
	free(msg);
	return ret;
}

/*
 * Whether a ferryd on @socket_path recorded cachefiles mounts: then its
 * cachefiles keeper starts the successor, and other keepers leave it time.
 */
static bool cachefiles_recorded(const char *socket_path)
{
	struct json_object *top, *a;
	char path[PATH_MAX];
	bool any = !cf_recorded_mounts(socket_path, path, sizeof(path), &top, &a) &&
		   json_object_array_length(a);

	json_object_put(top);
	return any;
}

/* Start a ferryd on @socket_path (it daemonizes; a second one exits). */
static void spawn_successor(const char *socket_path, const char *const *opts)
{
	char exe[PATH_MAX];
	const char *argv[KEEPER_ARGS_MAX + 6] = { exe, "--socket", socket_path };
	int n = 3, status;
	pid_t child;

	if (serve_ferryd_exe(exe, sizeof(exe)))
		return;
	while (opts && *opts && n < (int)ARRAY_SIZE(argv) - 2)
		argv[n++] = *opts++;
	argv[n++] = "--exist-ok";
	argv[n] = NULL;
	ferry_info("keeper: starting %s on %s", exe, socket_path);
	child = fork();
	if (!child) {
		setsid();
		close_range(3, ~0u, CLOSE_RANGE_CLOEXEC);
		execv(exe, (char *const *)argv);
		_exit(127);
	}
	/* ferryd's first process exits once the daemon listens. */
	if (child > 0)
		waitpid(child, &status, 0);
}

/*
 * One attempt: 0, 1 (ferryd refused the mount: logged), or -errno
 * (-ENOENT, -ECONNREFUSED: no ferryd there).
 */
static int handover_once(const char *socket_path, struct json_object *req, int fd)
{
	struct json_object *resp = NULL;
	struct jsonl_reader rd;
	struct ctl_reply r;
	char err[256];
	int c, ret = unix_connect(socket_path, &c);

	if (ret)
		return ret;
	jsonl_reader_init(&rd, c, CTL_LINE_MAX);
	ret = jsonl_send_fd(c, req, CTL_LINE_MAX, fd);
	if (!ret)
		ret = jsonl_recv(&rd, HANDOVER_MS, &resp);
	if (ret == 1)
		ret = -ECONNREFUSED; /* it went away: try again */
	if (!ret && !(ret = ctl_reply_parse(resp, &r, err, sizeof(err))) && r.err) {
		ret = 1;
		ferry_err("keeper: the new ferryd refused the mount: %s", r.error);
	}
	json_object_put(resp);
	jsonl_reader_free(&rd);
	close(c);
	return ret;
}

/*
 * ferryd gone: hand @req_text and descriptor @fd to the ferryd on
 * @socket_path, starting one (with @opts) when none answers (a ferryd's
 * lock decides between racing keepers); @sysfs (or NULL): the superblock
 * ferryd named, added to the request (native layers' overlay has none a
 * successor could find). 0 once it serves the mount, or -errno.
 */
static int keeper_handover(const char *socket_path, const char *req_text, int fd,
			   const char *sysfs, const char *const *opts)
{
	uint64_t start = ferry_now_ns(), spawned = 0, now;
	/* A cachefiles keeper starts the successor itself: it must win the
	 * socket, as only it holds /dev/cachefiles. Else no need to wait. */
	uint64_t spawn_after = cachefiles_recorded(socket_path) ?
			       HANDOVER_SPAWN_MS * 1000000ull : 0;
	struct json_object *req = NULL;
	int ret;

	if (!req_text || json_parse_object(req_text, strlen(req_text), &req)) {
		ferry_err("keeper: ferryd never sent the mount's request: no successor");
		return -EINVAL;
	}
	if (sysfs && sysfs[0] && !json_add_str(req, "sysfs", sysfs)) {
		json_object_put(req);
		return -ENOMEM;
	}
	for (;;) {
		ret = handover_once(socket_path, req, fd);
		if (ret == 1)
			ret = -EPERM;
		/* No ferryd yet, or one that went away under us (a successor
		 * that lost the race for the socket to another keeper's). */
		if (ret != -ENOENT && ret != -ECONNREFUSED && ret != -ECONNRESET &&
		    ret != -EPIPE)
			break;
		now = ferry_now_ns();
		if (now - start >= HANDOVER_MS * 1000000ull) {
			ret = -ETIMEDOUT;
			break;
		}
		if (now - start >= spawn_after &&
		    (!spawned || now - spawned >= HANDOVER_RESPAWN_MS * 1000000ull)) {
			spawn_successor(socket_path, opts);
			spawned = ferry_now_ns();
			continue;
		}
		nanosleep(&(struct timespec){ 0, HANDOVER_POLL_MS * 1000000L }, NULL);
	}
	json_object_put(req);
	return ret;
}

/*
 * ferryd-keeper fuse FD SOCK SOCKET [OPTION...]: holds the mount's
 * /dev/fuse descriptor (fuse.c). The kernel keeps the connection while a
 * descriptor of it is open, and what ferryd had read stays in the
 * connection's processing queue for a successor to have resent.
 */
static int fuse_keeper(int argc, char **argv)
{
	unsigned int fd, sock;
	char *req = NULL;
	int ret;

	if (argc < 5 || parse_uint(argv[2], &fd) || parse_uint(argv[3], &sock) ||
	    argv[4][0] != '/') {
		fprintf(stderr, "ferryd-keeper fuse: started by ferryd only (see --help)\n");
		return 2;
	}
	fcntl((int)fd, F_SETFD, FD_CLOEXEC);
	if (keeper_hello((int)sock))
		return 1;
	ret = keeper_listen((int)sock, (int)fd, &req, NULL, NULL);
	/* Unmounted: say so, or the guard would start another keeper. */
	if (ret == 3)
		(void)!send((int)sock, KEEPER_ENDED, strlen(KEEPER_ENDED), MSG_NOSIGNAL);
	if (ret == 1) {
		ferry_warn("FUSE keeper: ferryd is gone; handing the mount over to a new ferryd on %s",
			   argv[4]);
		ret = keeper_handover(argv[4], req, (int)fd, NULL, (const char *const *)argv + 5);
		if (ret)
			ferry_err("FUSE keeper: no ferryd took the mount over (%s); its readers get ENOTCONN",
				  ferry_strerror(ret));
		else
			ferry_info("FUSE keeper: the mount is served again");
		free(req);
		return ret ? 1 : 0;
	}
	free(req);
	return 0;
}

struct keeper {
	int group, sock;
	const char *mountpoint, *source;
	unsigned int sweep_max;
	char sysfs[160];
	struct ferry_exes exes;
};

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

/* "sysfs PATH": the superblock's sysfs directory. */
static void note_sysfs(void *ctx, const char *msg)
{
	struct keeper *k = ctx;

	if (!strncmp(msg, "sysfs ", 6))
		snprintf(k->sysfs, sizeof(k->sysfs), "%s", msg + 6);
}

/* Our superblock, if ferryd died before it could name it. */
static void find_sb(struct keeper *k)
{
	struct mount_entry mi;

	if (k->sysfs[0] || mountinfo_find(k->mountpoint, &mi) ||
	    strcmp(mi.fstype, "erofs") || strcmp(mi.source, k->source))
		return;
	meta_sysfs_path(k->mountpoint, k->sysfs, sizeof(k->sysfs));
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

/*
 * ferryd-keeper fanotify GROUP_FD SOCK MOUNTPOINT SOURCE SWEEP_MAX SOCKET
 * [OPTION...] (SOURCE: the mount's source in mountinfo): see the top.
 */
static int fanotify_keeper(int argc, char **argv)
{
	struct keeper k = { 0 };
	unsigned int gfd, sfd;
	char *req = NULL;
	int ret;

	if (argc < 8 || parse_uint(argv[2], &gfd) || parse_uint(argv[3], &sfd) ||
	    parse_uint(argv[6], &k.sweep_max) || argv[7][0] != '/') {
		fprintf(stderr, "ferryd-keeper fanotify: started by ferryd only (see --help)\n");
		return 2;
	}
	k.group = (int)gfd;
	k.sock = (int)sfd;
	k.mountpoint = argv[4];
	k.source = argv[5];
	fcntl(k.group, F_SETFD, FD_CLOEXEC);
	if (keeper_hello(k.sock))
		return 1;
	ret = keeper_listen(k.sock, -1, &req, note_sysfs, &k);
	if (ret == 2) {
		/* ferryd shut down, the mount still in use: no successor. */
		k.sweep_max = 0; /* ferryd answered what it had read */
		serve_alone(&k);
	} else if (ret == 1) {
		ferry_warn("fanotify keeper of %s: ferryd is gone; handing the mount over to a new ferryd on %s",
			   k.mountpoint, argv[7]);
		ret = keeper_handover(argv[7], req, k.group, k.sysfs,
				      (const char *const *)argv + 8);
		if (ret) {
			ferry_err("fanotify keeper of %s: no ferryd took the mount over (%s)",
				  k.mountpoint, ferry_strerror(ret));
			serve_alone(&k);
		} else {
			ferry_info("fanotify keeper of %s: the mount is served again", k.mountpoint);
		}
	}
	free(req);
	return 0;
}

/*
 * ferryd-keeper cachefiles DEVFD SOCK SOCKET [OPTION...]: holds
 * /dev/cachefiles; when ferryd dies, becomes "ferryd --socket SOCKET
 * OPTION... --cachefiles-takeover DEVFD" (the dead one's options: its log
 * file and level, serving and cache options), the device in hand.
 */
static int cachefiles_keeper(int argc, char **argv)
{
	char exe[PATH_MAX], msg[64];
	const char *succ[KEEPER_ARGS_MAX + 8] = { exe, "--socket", argv[4] };
	unsigned long devfd, sock;
	char *end1, *end2;
	int ret, i, n_args = 3;

	if (argc < 5 || argc > KEEPER_ARGS_MAX + 4 ||
	    (devfd = strtoul(argv[2], &end1, 10)) > INT_MAX || *end1 ||
	    (sock = strtoul(argv[3], &end2, 10)) > INT_MAX || *end2 || argv[4][0] != '/') {
		fprintf(stderr, "ferryd-keeper cachefiles: started by ferryd only (see --help)\n");
		return 2;
	}
	fcntl((int)devfd, F_SETFD, FD_CLOEXEC);
	if (keeper_hello((int)sock))
		return 1;
	while ((ret = keeper_wait((int)sock, msg, sizeof(msg))) == 2)
		;
	if (!ret)
		return 0; /* ferryd let the device go */
	/* ferryd is gone: become its successor, the device in hand. */
	ferry_warn("cachefiles keeper: ferryd is gone; starting a new ferryd on %s to take over %s and its mounts",
		   argv[4], CF_DEVICE);
	/* The installed binary: after ferry daemon upgrade, the new one. */
	if (serve_ferryd_exe(exe, sizeof(exe))) {
		ferry_err("cachefiles keeper: no ferryd binary to start: reads of missing data on its mounts fail with EIO");
		return 1;
	}
	fcntl((int)devfd, F_SETFD, 0);
	close((int)sock);
	/* The dead ferryd's options (successor_args in daemon.c). */
	for (i = 5; i < argc; i++)
		succ[n_args++] = argv[i];
	succ[n_args++] = "--cachefiles-takeover";
	succ[n_args++] = argv[2];
	succ[n_args] = NULL;
	execv(exe, (char *const *)succ);
	ferry_err("cachefiles keeper: starting %s: %s; reads of missing data on its mounts fail with EIO",
		  exe, strerror(errno));
	return 1;
}

static void usage(FILE *out)
{
	fprintf(out,
		"Usage: ferryd-keeper fuse FD SOCK SOCKET [OPTION...]\n"
		"       ferryd-keeper fanotify GROUP_FD SOCK MOUNTPOINT SOURCE SWEEP_MAX SOCKET [OPTION...]\n"
		"       ferryd-keeper cachefiles DEVFD SOCK SOCKET [OPTION...]\n\n"
		"The keeper of a ferryd mount, started by ferryd only: it holds the\n"
		"mount's /dev/fuse connection, fanotify group or /dev/cachefiles\n"
		"descriptor (FD) so that the mount outlives ferryd, and hands it to a\n"
		"new ferryd on the control socket SOCKET (started with OPTION... when\n"
		"none answers) if ferryd dies. SOCK: its end of a socket pair with\n"
		"ferryd. Installed next to ferryd; see ferryd(8). --version prints its\n"
		"release (a running keeper may be older than ferryd: it outlives\n"
		"ferryd's upgrades).\n");
}

int serve_keeper_main(int argc, char **argv)
{
	if (argc > 1 && !strcmp(argv[1], KEEPER_FUSE))
		return fuse_keeper(argc, argv);
	if (argc > 1 && !strcmp(argv[1], KEEPER_FANOTIFY))
		return fanotify_keeper(argc, argv);
	if (argc > 1 && !strcmp(argv[1], KEEPER_CACHEFILES))
		return cachefiles_keeper(argc, argv);
	if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
		usage(stdout);
		return 0;
	}
	if (argc == 2 && !strcmp(argv[1], "--version")) {
		printf("ferryd-keeper %s\n", FERRY_VERSION);
		return 0;
	}
	usage(stderr);
	return 2;
}
