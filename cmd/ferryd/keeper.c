// SPDX-License-Identifier: MIT
/*
 * The keepers of mounts: processes that hold a mount's kernel descriptor
 * so that it outlives ferryd, and hand it to a successor ferryd
 * (keeper_handover: the mount's request and the descriptor over the
 * control socket, SCM_RIGHTS; a ferryd started when none answers).
 * ferryd --fuse-keeper FD SOCK SOCKET [OPTION...] holds a /dev/fuse
 * connection (fuse.c); ferryd --keeper GROUP_FD SOCK_FD MOUNTPOINT
 * SOURCE SWEEP_MAX SOCKET [OPTION...] a fanotify group (fanotify.c;
 * SOURCE: the mount's source in mountinfo). The cachefiles keeper is in
 * cachefiles.c.
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
#include <unistd.h>

#include "ferryd.h"
#include "fanotify.h"

#define KEEPER_CHECK_MS 1000 /* how often a serving keeper checks the superblock */
#define KEEPER_START_MS 30000 /* a new keeper to say hello */
#define KEEPER_MSG_MAX (192u << 10) /* a message from ferryd: the mount request */
#define HANDOVER_MS 60000     /* to find a successor and hand a mount over */
#define HANDOVER_SPAWN_MS 300 /* before starting one beside a cachefiles keeper */
#define HANDOVER_RESPAWN_MS 5000 /* between starts */
#define HANDOVER_POLL_MS 50
#define KEEPER_ENDED "ended" /* a FUSE keeper's last word: the connection ended */

_Atomic unsigned int keeper_restarts;

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

int ferryd_exe(char *buf, size_t len)
{
	static const char deleted[] = " (deleted)";
	ssize_t n = readlink("/proc/self/exe", buf, len - 1);
	size_t l;

	if (n <= 0)
		return -errno;
	buf[n] = '\0';
	/* Replaced on disk (an upgrade): the path names the new binary. */
	l = (size_t)n;
	if (l > sizeof(deleted) - 1 && !strcmp(buf + l - (sizeof(deleted) - 1), deleted))
		buf[l - (sizeof(deleted) - 1)] = '\0';
	return 0;
}

int keeper_start_mount(const char *how, int fd, const struct fmount *m,
		       const struct serve_opts *o, const char *const *args, int *sock,
		       int *pid)
{
	const char *all[KEEPER_ARGS_MAX + 1];
	struct ctl_mount_req req = m->req;
	struct json_object *j;
	const char *text;
	unsigned int n = 0;
	char *msg = NULL;
	int ret;

	while (args && *args && n < KEEPER_ARGS_MAX - 1)
		all[n++] = *args++;
	all[n++] = o->socket_path;
	for (args = o->successor_args; args && *args && n < KEEPER_ARGS_MAX; args++)
		all[n++] = *args;
	all[n] = NULL;
	ret = keeper_spawn(how, fd, all, sock, pid);
	if (ret)
		return ret;
	/* What it is now, whatever "auto" chose; a successor records nothing. */
	req.mountpoint = m->mountpoint;
	req.mode = m->mode->name;
	req.record = NULL;
	j = ctl_mount_req_to_json(&req);
	text = j ? json_object_to_json_string_ext(j, JSON_C_TO_STRING_PLAIN) : NULL;
	ret = text && asprintf(&msg, "req %s", text) > 0 ? 0 : -ENOMEM;
	if (!ret && strlen(msg) >= KEEPER_MSG_MAX)
		ret = -EMSGSIZE;
	if (!ret && send(*sock, msg, strlen(msg), MSG_NOSIGNAL) < 0)
		ret = -errno;
	free(msg);
	json_object_put(j);
	if (ret) {
		/* Without a request it finds no successor: it lets go (a
		 * fanotify keeper serves alone while the mount lives). */
		close(*sock);
		*sock = -1;
	}
	return ret;
}

int keeper_bye(int *sock)
{
	struct pollfd p = { .fd = *sock, .events = POLLIN };
	char c;
	int ret = 0;

	if (*sock < 0)
		return 0;
	if (send(*sock, "bye", 3, MSG_NOSIGNAL) < 0)
		ret = -errno;
	/* Its end closes when it has let the descriptor go. */
	while (!ret && poll(&p, 1, KEEPER_START_MS) == 1 && recv(*sock, &c, 1, 0) > 0)
		;
	close(*sock);
	*sock = -1;
	return ret;
}

/*
 * The guard's thread: a keeper for the mount, another whenever one dies,
 * until told to stop. A keeper speaks once after hello, KEEPER_ENDED,
 * when the connection it holds ended (the mount is going away): then
 * there is nothing left to keep. Readable without that means gone.
 */
static void *guard_main(void *arg)
{
	struct keeper_guard *g = arg;
	struct pollfd p[2] = { { .fd = g->stop[0], .events = POLLIN },
			       { .fd = -1, .events = POLLIN } };
	int sock = g->sock, pid = atomic_load(&g->pid), ret;
	bool ended = false;

	for (;;) {
		if (sock < 0 && !ended) {
			ret = keeper_start_mount(g->how, g->fd, g->m, g->o, NULL, &sock, &pid);
			if (ret)
				ferry_warn("%s: no keeper (%s): if ferryd dies, the mount is not taken over; trying again",
					   g->m->mountpoint, ferry_strerror(ret));
			atomic_store(&g->pid, ret ? 0 : pid);
		}
		p[1].fd = sock;
		if (poll(p, 2, sock < 0 && !ended ? KEEPER_CHECK_MS : -1) < 0 &&
		    errno != EINTR)
			break;
		if (p[0].revents)
			break;
		if (sock >= 0 && p[1].revents) {
			char msg[sizeof(KEEPER_ENDED)];
			ssize_t n = recv(sock, msg, sizeof(msg), MSG_DONTWAIT);

			ended = n == (ssize_t)strlen(KEEPER_ENDED) &&
				!memcmp(msg, KEEPER_ENDED, (size_t)n);
			if (ended) {
				ferry_dbg("%s: the mount's connection ended; its keeper (pid %d) let go",
					    g->m->mountpoint, pid);
			} else {
				ferry_warn("%s: its keeper (pid %d) is gone; starting a new one",
					   g->m->mountpoint, pid);
				atomic_fetch_add(&keeper_restarts, 1);
			}
			close(sock);
			sock = -1;
		}
	}
	if (keeper_bye(&sock))
		ferry_warn("%s: telling the keeper to let go: %s", g->m->mountpoint,
			   strerror(errno));
	atomic_store(&g->pid, 0);
	return NULL;
}

int keeper_guard_start(struct keeper_guard *g, const char *how, int fd,
		       const struct fmount *m, const struct serve_opts *o)
{
	int ret;

	int pid = 0;

	*g = (struct keeper_guard){ .how = how, .fd = fd, .m = m, .o = o, .sock = -1 };
	if (pipe2(g->stop, O_CLOEXEC))
		return -errno;
	/*
	 * The first keeper before the mount is answered: a kill -9 right
	 * after `ferry mount` returns must find the descriptor held.
	 */
	ret = keeper_start_mount(how, fd, m, o, NULL, &g->sock, &pid);
	if (ret) /* the guard's thread tries again */
		ferry_warn("%s: no keeper yet (%s): until one starts, if ferryd dies the mount is not taken over",
			   m->mountpoint, ferry_strerror(ret));
	else
		atomic_store(&g->pid, pid);
	ret = -pthread_create(&g->thread, NULL, guard_main, g);
	if (ret) {
		if (g->sock >= 0 && keeper_bye(&g->sock))
			ferry_warn("%s: telling the keeper to let go: %s", m->mountpoint,
				   strerror(errno));
		close(g->stop[0]);
		close(g->stop[1]);
		return ret;
	}
	g->started = true;
	return 0;
}

void keeper_guard_stop(struct keeper_guard *g)
{
	if (!atomic_exchange(&g->started, false))
		return;
	if (write(g->stop[1], "x", 1) != 1)
		ferry_warn("%s: stopping the keeper's guard: %s", g->m->mountpoint,
			   strerror(errno));
	pthread_join(g->thread, NULL);
	close(g->stop[0]);
	close(g->stop[1]);
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

int keeper_listen(int sock, int watch, char **req,
		  void (*note)(void *ctx, const char *msg), void *ctx)
{
	char *msg = malloc(KEEPER_MSG_MAX);
	struct pollfd p[2] = { { .fd = sock, .events = POLLIN },
			       { .fd = watch, .events = 0 } };
	int ret = -1;
	ssize_t n;

	if (!msg)
		return 1;
	while (ret < 0) {
		if (poll(p, watch >= 0 ? 2 : 1, -1) < 0) {
			if (errno != EINTR)
				ret = 1;
			continue;
		}
		if (p[1].revents & (POLLERR | POLLHUP)) {
			ret = 3;
			continue;
		}
		if (!(p[0].revents & (POLLIN | POLLHUP | POLLERR)))
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

/* Start a ferryd on @socket_path (it daemonizes; a second one exits). */
static void spawn_successor(const char *socket_path, const char *const *opts)
{
	char exe[PATH_MAX];
	const char *argv[KEEPER_ARGS_MAX + 6] = { exe, "--socket", socket_path };
	int n = 3, status;
	pid_t child;

	if (ferryd_exe(exe, sizeof(exe)))
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

int keeper_handover(const char *socket_path, const char *req_text, int fd,
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
 * ferryd --fuse-keeper FD SOCK SOCKET [OPTION...]: holds the mount's
 * /dev/fuse descriptor (fuse.c). The kernel keeps the connection while a
 * descriptor of it is open, and what ferryd had read stays in the
 * connection's processing queue for a successor to have resent.
 */
int fuse_keeper_main(int argc, char **argv)
{
	unsigned int fd, sock;
	char *req = NULL;
	int ret;

	if (argc < 5 || parse_uint(argv[2], &fd) || parse_uint(argv[3], &sock) ||
	    argv[4][0] != '/') {
		fprintf(stderr, "ferryd --fuse-keeper: started by ferryd only\n");
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

int keeper_main(int argc, char **argv)
{
	struct keeper k = { 0 };
	unsigned int gfd, sfd;
	char *req = NULL;
	int ret;

	if (argc < 8 || parse_uint(argv[2], &gfd) || parse_uint(argv[3], &sfd) ||
	    parse_uint(argv[6], &k.sweep_max) || argv[7][0] != '/') {
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
