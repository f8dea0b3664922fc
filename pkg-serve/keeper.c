// SPDX-License-Identifier: MIT
/*
 * ferryd's side of the keepers of mounts (keeper.h; the keepers are
 * ferryd-keeper, keeper_main.c): processes that hold a mount's
 * kernel descriptor so that it outlives ferryd, and hand it to a
 * successor ferryd. Here: starting one (keeper_spawn), giving it the
 * mount's request, keeping one alive for each FUSE mount and for the
 * cachefiles device (the guard), telling it to let go.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal.h"

#define KEEPER_RETRY_MS 1000  /* between attempts to start a mount's keeper, */
#define KEEPER_RETRY_MAX_MS 60000 /* doubling up to this while they fail */
#define KEEPER_START_MS 30000 /* a new keeper to say hello */


/*
 * The descriptors a keeper starts with: the one it keeps and its socket.
 * Fixed numbers, so that spawning can place them without one clobbering
 * the other and close everything above.
 */
#define KEEPER_FD 3
#define KEEPER_SOCK_FD 4

/*
 * Start a keeper: posix_spawn, which shares ferryd's memory until the exec
 * (a fork of ferryd copied its page tables and made each of its pages
 * fault on its next write: 7-8 ms on a mount's path). The keeper then
 * forks once itself (keeper_main.c), so that ferryd reaps only that first
 * process and the keeper is nobody's child.
 */
int keeper_spawn(struct serve_ctx *ctx, const char *how, int fd, const char *const *args,
		 int *sock, int *pid)
{
	char exe[PATH_MAX] = KEEPER_BINARY, kfd_arg[16], ksock_arg[16], hello[64];
	const char *argv[KEEPER_ARGS_MAX + 5] = { exe, how, kfd_arg, ksock_arg };
	posix_spawn_file_actions_t actions;
	posix_spawnattr_t attr;
	sigset_t none;
	struct pollfd p;
	int sv[2] = { -1, -1 }, kfd = -1, ksock = -1, status, n_args = 4, ret;
	ssize_t n;
	pid_t child;

	while (*args && n_args < (int)ARRAY_SIZE(argv) - 1)
		argv[n_args++] = *args++;
	ret = sibling_exe(KEEPER_BINARY, exe, sizeof(exe));
	if (!ret && access(exe, X_OK))
		ret = -errno;
	if (ret) {
		/* Once: every mount's keeper would say the same. */
		if (!atomic_exchange(&ctx->keeper_missing_told, true))
			ferry_err("the keeper program %s: %s (install it next to ferryd): mounts have no failover",
				  exe, ferry_strerror(ret));
		return ret;
	}
	snprintf(kfd_arg, sizeof(kfd_arg), "%d", KEEPER_FD);
	snprintf(ksock_arg, sizeof(ksock_arg), "%d", KEEPER_SOCK_FD);
	/* Copies above KEEPER_SOCK_FD: placing one cannot clobber the other. */
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) ||
	    (kfd = fcntl(fd, F_DUPFD_CLOEXEC, KEEPER_SOCK_FD + 1)) < 0 ||
	    (ksock = fcntl(sv[1], F_DUPFD_CLOEXEC, KEEPER_SOCK_FD + 1)) < 0) {
		ret = -errno;
		goto out;
	}
	/* ferryd's threads block signals the keeper must still receive. */
	sigemptyset(&none);
	posix_spawnattr_init(&attr);
	posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSID);
	posix_spawnattr_setsigmask(&attr, &none);
	posix_spawn_file_actions_init(&actions);
	posix_spawn_file_actions_adddup2(&actions, kfd, KEEPER_FD);
	posix_spawn_file_actions_adddup2(&actions, ksock, KEEPER_SOCK_FD);
	posix_spawn_file_actions_addclosefrom_np(&actions, KEEPER_SOCK_FD + 1);
	ret = -posix_spawn(&child, exe, &actions, &attr, (char *const *)argv, environ);
	posix_spawn_file_actions_destroy(&actions);
	posix_spawnattr_destroy(&attr);
	/* Only the keeper's copies stay: its dying before the hello ends the poll. */
	close(kfd);
	close(ksock);
	close(sv[1]);
	kfd = ksock = sv[1] = -1;
	if (ret) {
		ferry_err("cannot start the keeper %s: %s", exe, ferry_strerror(ret));
		goto out;
	}
	waitpid(child, &status, 0);
	p = (struct pollfd){ .fd = sv[0], .events = POLLIN };
	n = poll(&p, 1, KEEPER_START_MS) == 1 ? recv(sv[0], hello, sizeof(hello) - 1, 0) : -1;
	if (n <= 0 || (hello[n] = '\0', sscanf(hello, "pid %d", pid) != 1)) {
		ferry_err("the keeper (%s %s) did not start", exe, how);
		ret = -ECHILD;
		goto out;
	}
	*sock = sv[0];
	sv[0] = -1;
out:
	if (sv[0] >= 0)
		close(sv[0]);
	if (sv[1] >= 0)
		close(sv[1]);
	if (kfd >= 0)
		close(kfd);
	if (ksock >= 0)
		close(ksock);
	return ret;
}

int keeper_start_mount(const char *how, int fd, const struct fmount *m,
		       const char *const *args, int *sock, int *pid)
{
	const struct serve_ctx *ctx = m->ctx;
	const char *all[KEEPER_ARGS_MAX + 1];
	struct ctl_mount_req req = m->req;
	struct json_object *j;
	const char *text;
	unsigned int n = 0;
	char *msg = NULL;
	int ret;

	while (args && *args && n < KEEPER_ARGS_MAX - 1)
		all[n++] = *args++;
	all[n++] = ctx->opts.socket_path;
	for (args = serve_successor_args(ctx); *args && n < KEEPER_ARGS_MAX; args++)
		all[n++] = *args;
	all[n] = NULL;
	ret = keeper_spawn(m->ctx, how, fd, all, sock, pid);
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

/* One keeper for the guard: the mount's, or the device's. */
static int guard_spawn(struct keeper_guard *g, int *sock, int *pid)
{
	if (g->m)
		return keeper_start_mount(g->how, g->fd, g->m, NULL, sock, pid);
	return g->spawn(g->arg, sock, pid);
}

/*
 * The guard's thread: a keeper, another whenever one dies, until told to
 * stop. A mount's keeper speaks once after hello, KEEPER_ENDED, when the
 * connection it holds ended (the mount is going away): then there is
 * nothing left to keep. Readable without that means gone.
 */
static void *guard_main(void *arg)
{
	struct keeper_guard *g = arg;
	struct pollfd p[2] = { { .fd = g->stop[0], .events = POLLIN },
			       { .fd = -1, .events = POLLIN } };
	int sock = g->sock, pid = atomic_load(&g->pid), ret;
	/* A mount's first keeper failed before the thread: already said. */
	int retry_ms = sock < 0 && g->m ? 2 * KEEPER_RETRY_MS : KEEPER_RETRY_MS;
	bool ended = false;

	for (;;) {
		if (sock < 0 && !ended) {
			ret = guard_spawn(g, &sock, &pid);
			/* Said at the first failure in a row; tried less often. */
			if (ret && retry_ms == KEEPER_RETRY_MS)
				ferry_warn("%s: no keeper (%s): if ferryd dies, %s not taken over; trying again",
					   g->name, ferry_strerror(ret),
					   g->m ? "the mount is" : "its mounts are");
			retry_ms = ret ? MIN(2 * retry_ms, KEEPER_RETRY_MAX_MS) : KEEPER_RETRY_MS;
			atomic_store(&g->pid, ret ? 0 : pid);
		}
		p[1].fd = sock;
		if (poll(p, 2, sock < 0 && !ended ? retry_ms : -1) < 0 &&
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
					  g->name, pid);
			} else {
				ferry_warn("%s: its keeper (pid %d) is gone; starting a new one",
					   g->name, pid);
				atomic_fetch_add(&g->ctx->keeper_restarts, 1);
			}
			close(sock);
			sock = -1;
		}
	}
	if (keeper_bye(&sock))
		ferry_warn("%s: telling the keeper to let go: %s", g->name, strerror(errno));
	atomic_store(&g->pid, 0);
	return NULL;
}

/* The guard's thread, from g->sock (-1: no keeper yet). */
static int guard_thread_start(struct keeper_guard *g)
{
	int ret;

	if (pipe2(g->stop, O_CLOEXEC))
		return -errno;
	ret = -pthread_create(&g->thread, NULL, guard_main, g);
	if (ret) {
		close(g->stop[0]);
		close(g->stop[1]);
		return ret;
	}
	g->started = true;
	return 0;
}

int keeper_guard_start(struct keeper_guard *g, const char *how, int fd,
		       const struct fmount *m)
{
	int pid = 0, ret;

	*g = (struct keeper_guard){ .how = how, .fd = fd, .m = m, .ctx = m->ctx,
				    .name = m->mountpoint, .sock = -1 };
	/*
	 * The first keeper before the mount is answered: a kill -9 right
	 * after `ferry mount` returns must find the descriptor held.
	 */
	ret = keeper_start_mount(how, fd, m, NULL, &g->sock, &pid);
	if (ret) /* the guard's thread tries again */
		ferry_warn("%s: no keeper yet (%s): until one starts, if ferryd dies the mount is not taken over",
			   m->mountpoint, ferry_strerror(ret));
	else
		atomic_store(&g->pid, pid);
	ret = guard_thread_start(g);
	if (ret && g->sock >= 0 && keeper_bye(&g->sock))
		ferry_warn("%s: telling the keeper to let go: %s", m->mountpoint,
			   strerror(errno));
	return ret;
}

int keeper_guard_start_dev(struct keeper_guard *g, struct serve_ctx *ctx, const char *name,
			   int (*spawn)(void *arg, int *sock, int *pid), void *arg)
{
	*g = (struct keeper_guard){ .spawn = spawn, .arg = arg, .ctx = ctx, .name = name,
				    .sock = -1 };
	return guard_thread_start(g);
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

