// SPDX-License-Identifier: MIT
/*
 * ferryd's control side: the lock that makes one daemon own a socket, the
 * listening socket, one thread per client connection (a mount may take a
 * while: the bootstrap comes from a registry), and the main loop that
 * waits for connections, signals (SIGTERM/SIGINT: unmount all and exit;
 * SIGHUP: reopen the log file), internal wake-ups and the idle deadline.
 * The listening socket is ferryd's own, or systemd's (socket activation:
 * LISTEN_FDS, read without libsystemd).
 */
#include <fcntl.h>
#include <libgen.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ferryd.h"

#define MAX_CONNS 64
#define CONN_IDLE_MS 60000  /* a client that sends nothing is dropped */
#define DRAIN_WAIT_MS 2000  /* connections still busy at exit */
#define UPGRADE_QUIESCE_MS 500 /* requests being answered, before exiting */

static int wake_fd = -1;
static atomic_bool stop_requested;
static atomic_bool upgrade_requested;
static atomic_uint nr_conns;
static const struct daemon_opts *opts;
static struct serve_ctx *serve;
static int64_t started_at;
static bool socket_activated;

static void wake(void)
{
	uint64_t one = 1;

	if (write(wake_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		ferry_warn("wake-up: %s", strerror(errno));
}

static struct json_object *reply(int ret, const char *err)
{
	return ctl_reply_to_json(&(struct ctl_reply){ .err = ret, .error = err });
}

void daemon_info(struct ctl_ping_reply *r)
{
	*r = (struct ctl_ping_reply){ .pid = getpid(), .version = FERRYD_VERSION,
				      .started_at = started_at,
				      .idle_timeout = opts->serve.idle_timeout,
				      .socket_activated = socket_activated };
	snprintf(r->socket, sizeof(r->socket), "%s", opts->serve.socket_path);
	daemon_memory(&r->rss_bytes, &r->peak_rss_bytes);
}

int daemon_metrics_text(char **out)
{
	struct ctl_ping_reply ping;

	daemon_info(&ping);
	return serve_metrics_text(serve, &ping, atomic_load(&nr_conns), out);
}

/*
 * Whether an upgrade can go ahead: the installed binary is there, and
 * every mount has a keeper to hand it over (else it would die with us).
 */
static int upgrade_check(char *err, size_t errlen)
{
	struct ctl_list_reply list = { 0 };
	char exe[PATH_MAX];
	size_t i;
	int ret = serve_ferryd_exe(exe, sizeof(exe));

	if (!ret && access(exe, X_OK))
		ret = -errno;
	if (ret) {
		snprintf(err, errlen, "the installed ferryd (%.1024s): %s; nothing was changed",
			 exe, ferry_strerror(ret));
		return ret;
	}
	ret = serve_list(serve, &list.mounts, &list.nr_mounts);
	for (i = 0; !ret && i < list.nr_mounts; i++) {
		if (!list.mounts[i].keeper_pid) {
			snprintf(err, errlen, "%s (%s) has no keeper to hand it over (see the log); unmount it first or try again",
				 list.mounts[i].mountpoint, list.mounts[i].mode);
			ret = -EBUSY;
		}
	}
	ctl_list_reply_free(&list);
	return ret;
}

static int probe_answer(const struct ctl_probe_reply *rep, void *arg)
{
	struct json_object **resp = arg;

	*resp = ctl_probe_reply_to_json(rep);
	return *resp ? 0 : -ENOMEM;
}

/*
 * @passed: a descriptor the client passed with @o (ours to close), or -1:
 * a keeper handing its mount over (keeper_handover), as a mount request.
 */
static struct json_object *handle(struct json_object *o, int passed, bool *shutdown)
{
	struct ctl_ping_reply ping;
	struct ctl_list_reply list = { 0 };
	struct ctl_mount_reply mrep;
	struct ctl_request req;
	char err[4096] = "", *text = NULL;
	struct json_object *resp = NULL;
	int ret;

	daemon_info(&ping);
	ret = ctl_request_parse(o, &req, err, sizeof(err));
	if (ret) {
		ferry_err("%s", err);
		resp = reply(ret, err);
		goto out;
	}
	if (passed >= 0 && req.op != CTL_OP_MOUNT) {
		ret = -EINVAL;
		resp = reply(ret, "a descriptor comes with a keeper's mount request only");
		goto out;
	}
	switch (req.op) {
	case CTL_OP_MOUNT:
		if (passed >= 0) {
			ferry_info("a keeper hands over %s on %s", req.mount.image,
				   req.mount.mountpoint);
			req.mount.takeover = true;
			req.mount.takeover_fd = passed;
			passed = -1;
		}
		mrep = (struct ctl_mount_reply){ .pid = getpid() };
		ret = serve_mount(serve, &req.mount, &mrep, err, sizeof(err));
		resp = ret ? reply(ret, err) : ctl_mount_reply_to_json(&mrep);
		break;
	case CTL_OP_PROBE:
		ret = serve_probe(&req.mount, err, sizeof(err), probe_answer, &resp);
		/* No index is an answer, not a failure. */
		if (ret == -EMEDIUMTYPE)
			ferry_info("%s", err);
		else if (ret)
			ferry_err("%s", err);
		if (ret)
			resp = reply(ret, err);
		break;
	case CTL_OP_UMOUNT:
		ret = serve_umount(serve, &req.umount, err, sizeof(err));
		if (ret && ret != -ENOENT)
			ferry_err("umount %s: %s", req.umount.mountpoint, err);
		resp = reply(ret, err);
		break;
	case CTL_OP_LIST:
		list.daemon = ping;
		ret = serve_list(serve, &list.mounts, &list.nr_mounts);
		resp = ret ? reply(ret, "cannot list the mounts") : ctl_list_reply_to_json(&list);
		ctl_list_reply_free(&list);
		break;
	case CTL_OP_PING:
		resp = ctl_ping_reply_to_json(&ping);
		break;
	case CTL_OP_SHUTDOWN:
		ferry_info("shutdown requested over the control socket");
		*shutdown = true;
		resp = reply(0, NULL);
		break;
	case CTL_OP_UPGRADE:
		ret = upgrade_check(err, sizeof(err));
		if (!ret) {
			ferry_info("upgrade requested over the control socket");
			atomic_store(&upgrade_requested, true);
			*shutdown = true;
		}
		resp = reply(ret, err);
		break;
	case CTL_OP_METRICS:
		ret = daemon_metrics_text(&text);
		resp = ret ? reply(ret, "cannot gather the metrics") :
			     ctl_metrics_reply_to_json(text);
		free(text);
		break;
	}
out:
	if (passed >= 0)
		close(passed);
	ctl_request_free(&req);
	return resp;
}

static bool peer_allowed(int fd)
{
	struct ucred cred;
	socklen_t len = sizeof(cred);

	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len))
		return false;
	return cred.uid == 0 || cred.uid == geteuid();
}

static void *conn_main(void *arg)
{
	int fd = (int)(intptr_t)arg, ret;
	struct json_object *req, *resp;
	struct jsonl_reader rd;
	bool shutdown = false;

	jsonl_reader_init(&rd, fd, CTL_LINE_MAX);
	if (!peer_allowed(fd)) {
		resp = reply(-EACCES, "permission denied: ferryd serves root (and its own user) only");
		jsonl_send(fd, resp, CTL_LINE_MAX);
		json_object_put(resp);
		goto out;
	}
	while (!shutdown && !(ret = jsonl_recv(&rd, CONN_IDLE_MS, &req))) {
		resp = handle(req, jsonl_take_fd(&rd), &shutdown);
		json_object_put(req);
		if (!resp)
			resp = reply(-ENOMEM, "out of memory");
		ret = resp ? jsonl_send(fd, resp, CTL_LINE_MAX) : -ENOMEM;
		json_object_put(resp);
		if (ret)
			break;
	}
	if (ret < 0 && ret != -ETIMEDOUT && ret != -ECONNRESET && ret != -EPIPE) {
		resp = reply(ret, ret == -EPROTO ? "expected one JSON object per line" :
				  ret == -EMSGSIZE ? "request line too long" :
						     ferry_strerror(ret));
		jsonl_send(fd, resp, CTL_LINE_MAX);
		json_object_put(resp);
	}
out:
	jsonl_reader_free(&rd);
	close(fd);
	if (shutdown) {
		atomic_store(&stop_requested, true);
		wake();
	}
	atomic_fetch_sub(&nr_conns, 1);
	return NULL;
}

static void accept_one(int lfd)
{
	pthread_attr_t attr;
	pthread_t t;
	int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);

	if (fd < 0) {
		if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
			ferry_warn("accept on %s: %s", opts->serve.socket_path, strerror(errno));
		return;
	}
	if (atomic_fetch_add(&nr_conns, 1) >= MAX_CONNS) {
		struct json_object *resp = reply(-EAGAIN, "ferryd is busy: too many connections");

		jsonl_send(fd, resp, CTL_LINE_MAX);
		json_object_put(resp);
		close(fd);
		atomic_fetch_sub(&nr_conns, 1);
		return;
	}
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	if (pthread_create(&t, &attr, conn_main, (void *)(intptr_t)fd)) {
		ferry_warn("cannot start a connection thread");
		close(fd);
		atomic_fetch_sub(&nr_conns, 1);
	}
	pthread_attr_destroy(&attr);
}

/* Take @socket_path's lock file: one ferryd per socket (-EADDRINUSE). */
static int take_lock(const char *socket_path, bool quiet_busy, int *out)
{
	char *path = NULL, pid[32] = "";
	int fd, ret, n;

	if (asprintf(&path, "%s.lock", socket_path) < 0)
		return -ENOMEM;
	/* A planted link must not make root truncate its target. */
	fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0) {
		ret = -errno;
		ferry_err("cannot open the lock file %s: %s", path, strerror(errno));
		goto out;
	}
	if (flock(fd, LOCK_EX | LOCK_NB)) {
		ret = errno == EWOULDBLOCK ? -EADDRINUSE : -errno;
		n = (int)pread(fd, pid, sizeof(pid) - 1, 0);
		pid[n > 0 ? n : 0] = '\0';
		pid[strcspn(pid, "\n")] = '\0';
		if (ret == -EADDRINUSE && quiet_busy)
			ferry_dbg("ferryd %s already serves %s", pid[0] ? pid : "?",
				  socket_path);
		else if (ret == -EADDRINUSE)
			ferry_err("another ferryd (pid %s) already serves %s (stop it, or use another --socket)",
				  pid[0] ? pid : "?", socket_path);
		else
			ferry_err("cannot lock %s: %s", path, ferry_strerror(ret));
		close(fd);
		goto out;
	}
	n = snprintf(pid, sizeof(pid), "%d\n", (int)getpid());
	if (ftruncate(fd, 0) == 0)
		pwrite_full(fd, pid, (size_t)n, 0);
	*out = fd;
	ret = 0;
out:
	free(path);
	return ret;
}

static int open_log(const char *path)
{
	int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC,
		      0640);

	if (fd < 0)
		return -errno;
	if (dup2(fd, STDERR_FILENO) < 0) {
		close(fd);
		return -errno;
	}
	close(fd);
	return 0;
}

static void on_change(void *arg)
{
	wake();
}

/*
 * The listening socket systemd passed (socket activation: LISTEN_PID is
 * ours, LISTEN_FDS=1, descriptor 3): 1 and *@fd; 0 when there is none;
 * -errno after a message when it is not one ferryd can serve.
 */
static int activated_socket(const char *socket_path, int *fd)
{
	const char *pid = getenv("LISTEN_PID"), *fds = getenv("LISTEN_FDS");
	struct sockaddr_un sa = { 0 };
	socklen_t len = sizeof(sa), olen = sizeof(int);
	int type = 0, listening = 0;
	uint64_t v;

	if (!pid || !fds || parse_size(pid, &v) || v != (uint64_t)getpid())
		return 0;
	/* Not for our children (keepers). */
	unsetenv("LISTEN_PID");
	unsetenv("LISTEN_FDS");
	unsetenv("LISTEN_FDNAMES");
	if (strcmp(fds, "1")) {
		ferry_err("systemd passed LISTEN_FDS=%s sockets; ferryd serves exactly one (one ListenStream= in its .socket unit)",
			  fds);
		return -EINVAL;
	}
	if (getsockopt(3, SOL_SOCKET, SO_TYPE, &type, &olen) ||
	    getsockopt(3, SOL_SOCKET, SO_ACCEPTCONN, &listening, &olen) ||
	    getsockname(3, (struct sockaddr *)&sa, &len) || sa.sun_family != AF_UNIX ||
	    type != SOCK_STREAM || !listening) {
		ferry_err("the socket systemd passed (descriptor 3) is not a listening unix stream socket (ListenStream=%s in the .socket unit)",
			  socket_path);
		return -EINVAL;
	}
	if (strncmp(sa.sun_path, socket_path, sizeof(sa.sun_path))) {
		ferry_err("the socket systemd passed listens on %.*s, not on %s (make ListenStream= and ferryd --socket agree)",
			  (int)sizeof(sa.sun_path), sa.sun_path, socket_path);
		return -EINVAL;
	}
	if (fcntl(3, F_SETFD, FD_CLOEXEC) || fcntl(3, F_SETFL, O_NONBLOCK)) {
		ferry_err("socket from systemd: %s", strerror(errno));
		return -errno;
	}
	*fd = 3;
	return 1;
}

/*
 * The idle deadline passed: 0 to exit, or 1 when a client came after all.
 * Our own socket file goes first (a client arriving later finds none and
 * starts a new ferryd, which gets the lock once we exit); a client that
 * connected before that is served, and we listen again. systemd's socket
 * stays with systemd: what is queued on it starts the next ferryd.
 */
static int idle_exit(int *lfd, ino_t *sock_ino)
{
	struct pollfd pfd = { .fd = *lfd, .events = POLLIN };
	struct stat st;
	int ret;

	if (socket_activated)
		return 0;
	if (!stat(opts->serve.socket_path, &st) && st.st_ino == *sock_ino)
		unlink(opts->serve.socket_path);
	if (poll(&pfd, 1, 0) <= 0)
		return 0;
	while (poll(&pfd, 1, 0) > 0)
		accept_one(*lfd);
	close(*lfd);
	ret = unix_listen(opts->serve.socket_path, lfd, sock_ino);
	if (ret) {
		ferry_err("cannot listen on %s again: %s", opts->serve.socket_path, ferry_strerror(ret));
		*lfd = -1;
		return 0;
	}
	return 1;
}

/*
 * Whether the idle deadline has passed: no mounts and no control client
 * for idle_timeout seconds (*@since: when that began, 0 while busy).
 */
static bool idle_expired(uint64_t *since)
{
	uint64_t now = ferry_now_ns();

	if (!opts->serve.idle_timeout || opts->mount || serve_count(serve) ||
	    atomic_load(&nr_conns)) {
		*since = 0;
		return false;
	}
	if (!*since)
		*since = now;
	return now - *since >= opts->serve.idle_timeout * 1000000000ull;
}

/*
 * ferry daemon upgrade: the installed binary takes over. We start it
 * (daemonized, as ferry would) once our lock and socket are let go, and
 * exit as if killed, unmounting nothing: each mount's keeper hands its
 * mount to the new ferryd (keeper_handover). When a keeper becomes the
 * successor itself (cachefiles: it must hold the device), we only exit. Returns only if the new ferryd could not be started (then
 * the keepers start one).
 */
static void upgrade(const struct daemon_opts *o, int *lock_fd, int *lfd)
{
	const char *const *succ = serve_successor_args(serve);
	const char *argv[64] = { NULL, "--socket", o->serve.socket_path };
	char exe[PATH_MAX];
	unsigned int n = 3;
	int status;
	pid_t child;

	if (serve_keeper_succeeds(serve)) {
		ferry_info("upgrade: a keeper becomes the new ferryd; exiting");
		fflush(stderr);
		_exit(EXIT_SUCCESS);
	}
	if (serve_ferryd_exe(exe, sizeof(exe)))
		return;
	argv[0] = exe;
	while (*succ && n < ARRAY_SIZE(argv) - 1)
		argv[n++] = *succ++;
	argv[n] = NULL;
	ferry_info("upgrade: starting %s; the mounts' keepers hand them over", exe);
	/* Whatever happens next we exit: the keepers carry the mounts on. */
	serve_quiesce(serve, true, UPGRADE_QUIESCE_MS);
	metrics_stop(); /* its ports, for the new ferryd to bind */
	fflush(stderr);
	close(*lfd);
	close(*lock_fd);
	*lfd = *lock_fd = -1;
	child = fork();
	if (!child) {
		setsid();
		execv(exe, (char *const *)argv);
		_exit(127);
	}
	/* Its first process exits once the new daemon listens. */
	if (child > 0 && waitpid(child, &status, 0) == child && WIFEXITED(status) &&
	    !WEXITSTATUS(status)) {
		serve_quiesce(serve, false, UPGRADE_QUIESCE_MS);
		fflush(stderr);
		_exit(EXIT_SUCCESS);
	}
	ferry_err("upgrade: starting %s failed; the mounts' keepers start one when we exit",
		  exe);
	fflush(stderr);
}

int daemon_run(const struct daemon_opts *o)
{
	struct pollfd pfd[3];
	sigset_t set;
	ino_t sock_ino = 0;
	int lock_fd = -1, lfd = -1, sfd = -1, ret, devnull;
	char *copy;
	bool exit_when_empty = false;
	uint64_t idle_since = 0;
	unsigned int i;
	struct stat st;
	unsigned int waited;
	size_t busy;

	opts = o;
	/* Every thread inherits this mask; signals arrive on the signalfd. */
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGHUP);
	sigaddset(&set, SIGUSR2);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	signal(SIGPIPE, SIG_IGN);
	sigdelset(&set, SIGUSR2);
	sfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
	wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (sfd < 0 || wake_fd < 0) {
		ferry_err("signalfd/eventfd: %s", strerror(errno));
		return EXIT_FAILURE;
	}
	ret = serve_ctx_new(&o->serve, on_change, NULL, &serve);
	if (ret) {
		ferry_err("cannot set up serving: %s", ferry_strerror(ret));
		return EXIT_FAILURE;
	}

	copy = strdup(o->serve.socket_path);
	ret = copy ? mkdir_p(dirname(copy), 0755) : -ENOMEM;
	free(copy);
	if (ret) {
		ferry_err("cannot create the directory of %s: %s", o->serve.socket_path,
			  ferry_strerror(ret));
		return EXIT_FAILURE;
	}
	ret = take_lock(o->serve.socket_path, o->exist_ok, &lock_fd);
	if (ret == -EADDRINUSE && o->exist_ok) {
		/* Started by ferry racing another ferry: the other one won. */
		if (o->ready_fd >= 0)
			write_full(o->ready_fd, "OK\n", 3);
		return EXIT_SUCCESS;
	}
	if (ret)
		return EXIT_FAILURE;
	ret = activated_socket(o->serve.socket_path, &lfd);
	socket_activated = ret > 0;
	/* We hold the lock: a socket file left there is stale. */
	if (!ret)
		ret = unix_listen(o->serve.socket_path, &lfd, &sock_ino);
	else if (ret > 0)
		ret = 0;
	if (ret) {
		ferry_err("cannot listen on %s: %s", o->serve.socket_path, ferry_strerror(ret));
		return EXIT_FAILURE;
	}
	/* Before the log takes stderr: a bad address is the caller's to see. */
	for (i = 0; i < o->serve.nr_metrics_listen; i++) {
		if (metrics_start(o->serve.metrics_listen[i])) {
			ret = EXIT_FAILURE;
			goto close_listener;
		}
	}
	if (!o->foreground) {
		ret = open_log(o->serve.log_path);
		if (ret) {
			ferry_err("cannot open the log file %s: %s", o->serve.log_path,
				  ferry_strerror(ret));
			unlink(o->serve.socket_path);
			return EXIT_FAILURE;
		}
		devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
		if (devnull >= 0) {
			dup2(devnull, STDIN_FILENO);
			dup2(devnull, STDOUT_FILENO);
			close(devnull);
		}
	}
	if (ferry_log_stream(!o->foreground))
		ferry_warn("log setup: %s", strerror(errno));
	started_at = time(NULL);
	ferry_info("ferryd %s (pid %d) listening on %s%s", FERRYD_VERSION, (int)getpid(),
		   o->serve.socket_path, socket_activated ? " (socket from systemd)" : "");
	for (i = 0; i < o->serve.nr_metrics_listen; i++)
		ferry_info("metrics on %s (GET /metrics)", o->serve.metrics_listen[i]);

	if (o->ready_fd >= 0) {
		write_full(o->ready_fd, "OK\n", 3);
		close(o->ready_fd);
	}
	/*
	 * A successor's, before its first takeover: what we hold now, the
	 * dead ferryd held too (daemons number their own alike: main.c).
	 */
	serve_startup(serve);

	ret = EXIT_SUCCESS;
	if (o->takeover_fd >= 0)
		serve_takeover_device(serve, o->takeover_fd);
	if (o->mount) {
		char err[4096] = "";

		if (serve_mount(serve, o->mount, NULL, err, sizeof(err))) {
			ret = EXIT_FAILURE;
			atomic_store(&stop_requested, true);
		}
		exit_when_empty = true;
	}

	pfd[0] = (struct pollfd){ .fd = lfd, .events = POLLIN };
	pfd[1] = (struct pollfd){ .fd = sfd, .events = POLLIN };
	pfd[2] = (struct pollfd){ .fd = wake_fd, .events = POLLIN };
	while (!atomic_load(&stop_requested)) {
		if (idle_expired(&idle_since)) {
			if (!idle_exit(&lfd, &sock_ino)) {
				ferry_info("idle for %u s without mounts: exiting", o->serve.idle_timeout);
				break;
			}
			pfd[0].fd = lfd;
			idle_since = 0;
		}
		if (poll(pfd, 3, o->serve.idle_timeout ? 1000 : -1) < 0) {
			if (errno == EINTR)
				continue;
			ferry_err("poll: %s", strerror(errno));
			ret = EXIT_FAILURE;
			break;
		}
		if (pfd[0].revents & POLLIN)
			accept_one(lfd);
		if (pfd[1].revents & POLLIN) {
			struct signalfd_siginfo si;

			while (read(sfd, &si, sizeof(si)) == sizeof(si)) {
				if (si.ssi_signo == SIGHUP && !o->foreground) {
					ret = open_log(o->serve.log_path);
					ferry_info("SIGHUP: log file %s reopened%s", o->serve.log_path,
						   ret ? " (failed)" : "");
					ret = EXIT_SUCCESS;
					continue;
				}
				if (si.ssi_signo == SIGHUP)
					continue;
				ferry_info("%s: unmounting everything and exiting",
					   strsignal((int)si.ssi_signo));
				atomic_store(&stop_requested, true);
			}
		}
		if (pfd[2].revents & POLLIN) {
			uint64_t v;

			if (read(wake_fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
				ferry_warn("wake-up: %s", strerror(errno));
			if (exit_when_empty && !serve_count(serve)) {
				ferry_info("no mounts left: exiting");
				break;
			}
		}
	}

	if (atomic_load(&upgrade_requested)) {
		upgrade(o, &lock_fd, &lfd);
		_exit(EXIT_FAILURE); /* never unmount: the keepers carry on */
	}
close_listener:
	/* No new clients; remove the socket only if it is still ours. */
	if (lfd >= 0)
		close(lfd);
	if (!socket_activated && !stat(o->serve.socket_path, &st) && st.st_ino == sock_ino)
		unlink(o->serve.socket_path);
	busy = serve_shutdown(serve);
	for (waited = 0; atomic_load(&nr_conns) && waited < DRAIN_WAIT_MS; waited += 10)
		nanosleep(&(struct timespec){ 0, 10000000 }, NULL);
	ferry_info("ferryd exiting");
	fflush(stderr);
	if (busy || atomic_load(&nr_conns)) {
		/* Threads still inside a request or a fetch must not race
		 * exit's cleanup; the kernel ends their FUSE connections. */
		_exit(ret);
	}
	serve_ctx_free(serve);
	close(lock_fd);
	close(sfd);
	close(wake_fd);
	return ret;
}
