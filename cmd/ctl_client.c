// SPDX-License-Identifier: MIT
/*
 * The client side of the control protocol (ctl.h), in ferry only: typed
 * calls to ferryd, starting one when none answers a mount request.
 */
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../pkg-base/base.h"
#include "ctl.h"

#define MOUNT_TIMEOUT_MS 600000 /* ferryd bounds its own fetches */
#define CTL_TIMEOUT_MS 60000
#define START_WAIT_MS 10000     /* a spawned ferryd's socket to answer */

bool ctl_no_daemon(int err)
{
	return err == -ENOENT || err == -ECONNREFUSED;
}

/*
 * The ferryd installed next to this ferry, never one found in PATH: a
 * root ferry must not run whatever a user's PATH names. NULL after a
 * message.
 */
static char *ferryd_path(void)
{
	char self[PATH_MAX], *p = NULL;
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);

	if (n <= 0) {
		ferry_err("cannot find this program (/proc/self/exe): %s",
			  n < 0 ? strerror(errno) : "empty");
		return NULL;
	}
	self[n] = '\0';
	if (asprintf(&p, "%s/ferryd", dirname(self)) < 0)
		return NULL;
	if (access(p, X_OK)) {
		ferry_err("%s: %s; ferryd is installed next to ferry (make install)",
			  p, strerror(errno));
		free(p);
		return NULL;
	}
	return p;
}

/*
 * argv for ferryd: PATH [-v...|-q] --socket S, NULL-terminated. Only a
 * foreground ferryd takes this command's verbosity: a background one is
 * shared by later mounts and logs at its default level.
 */
static void ferryd_argv(const char **argv, const char *path, const char *socket_path,
			bool foreground)
{
	int n = 0, lvl;

	argv[n++] = path;
	for (lvl = FERRY_LOG_INFO; foreground && lvl < ferry_log_level && n < 3; lvl++)
		argv[n++] = "-v";
	if (foreground && ferry_log_level == FERRY_LOG_ERR)
		argv[n++] = "-q";
	if (!foreground)
		argv[n++] = "--exist-ok"; /* a racing ferry may start one too */
	argv[n++] = "--socket";
	argv[n++] = socket_path;
	argv[n] = NULL;
}

/* ferryd starts with no signal blocked, whatever its parent blocked. */
static void exec_ferryd(const char *path, const char **argv)
{
	sigset_t none;

	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	execv(path, (char **)argv);
}

/* Start a daemonizing ferryd on @socket_path; it exits once listening. */
static int start_ferryd(const char *socket_path)
{
	const char *argv[10];
	char *path = ferryd_path();
	int status;
	pid_t pid;

	if (!path)
		return -ENOEXEC; /* said why */
	ferryd_argv(argv, path, socket_path, false);
	ferry_dbg("starting %s on %s", path, socket_path);
	fflush(NULL);
	pid = fork();
	if (pid < 0) {
		free(path);
		return -errno;
	}
	if (!pid) {
		exec_ferryd(path, argv);
		fprintf(stderr, "ferry: cannot run %s: %s\n", path, strerror(errno));
		_exit(127);
	}
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	free(path);
	/* A failure may be a racing ferryd that got the socket: callers
	 * retry connecting either way. */
	if (!WIFEXITED(status) || WEXITSTATUS(status) == 127)
		return -ENOEXEC;
	return WEXITSTATUS(status) ? -EADDRINUSE : 0;
}

/* @req to the ferryd on @socket_path, starting one if none answers. */
static int call_or_start(const char *socket_path, struct json_object *req,
			 int timeout_ms, struct json_object **resp)
{
	unsigned int waited;
	int ret = ctl_call(socket_path, req, timeout_ms, resp), st;

	if (!ctl_no_daemon(ret))
		return ret;
	st = start_ferryd(socket_path);
	if (st == -ENOEXEC || st == -ENOMEM) {
		ferry_err("cannot start ferryd for %s", socket_path);
		return st;
	}
	for (waited = 0; waited < START_WAIT_MS; waited += 50) {
		ret = ctl_call(socket_path, req, timeout_ms, resp);
		if (!ctl_no_daemon(ret))
			return ret;
		/* The ferryd that held the socket's lock may have been
		 * exiting (idle timeout): then nobody listens yet. */
		if (waited && waited % 1000 == 0)
			start_ferryd(socket_path);
		nanosleep(&(struct timespec){ 0, 50000000 }, NULL);
	}
	ferry_err("no ferryd answers on %s (see its log, ferryd.log next to the socket)",
		  socket_path);
	return ret;
}

/*
 * Send @req (put here; NULL: out of memory) and check the answer's
 * status: 0 and *@resp for an ok answer (the caller puts it), else -errno
 * and @msg as ctl.h says.
 */
static int call(const char *socket_path, bool start, struct json_object *req,
		int timeout_ms, struct json_object **resp, char *msg, size_t msglen)
{
	struct ctl_reply st;
	char why[256];
	int ret;

	msg[0] = '\0';
	*resp = NULL;
	if (!req)
		return -ENOMEM;
	ret = start ? call_or_start(socket_path, req, timeout_ms, resp) :
		      ctl_call(socket_path, req, timeout_ms, resp);
	json_object_put(req);
	if (ret)
		return ret;
	ret = ctl_reply_parse(*resp, &st, why, sizeof(why));
	if (ret)
		snprintf(msg, msglen, "malformed answer from ferryd: %s", why);
	else if (st.err)
		snprintf(msg, msglen, "%s", st.error);
	if (!ret)
		ret = st.err;
	if (ret) {
		json_object_put(*resp);
		*resp = NULL;
	}
	return ret;
}

/* After an ok answer: its typed parser's verdict, with @msg set on failure. */
static int parsed(int ret, const char *why, char *msg, size_t msglen)
{
	if (ret == -EPROTO)
		snprintf(msg, msglen, "malformed answer from ferryd: %s", why);
	else if (ret)
		snprintf(msg, msglen, "%s", strerror(-ret));
	return ret;
}

int ctl_client_mount(const char *socket_path, const struct ctl_mount_req *req,
		     struct ctl_mount_reply *rep, char *msg, size_t msglen)
{
	struct json_object *resp;
	char why[256];
	int ret;

	ret = call(socket_path, true, ctl_mount_req_to_json(req), MOUNT_TIMEOUT_MS, &resp,
		   msg, msglen);
	if (ret)
		return ret;
	ret = ctl_mount_reply_parse(resp, rep, why, sizeof(why));
	json_object_put(resp);
	return parsed(ret, why, msg, msglen);
}

int ctl_client_umount(const char *socket_path, const struct ctl_umount_req *req,
		      char *msg, size_t msglen)
{
	struct json_object *resp;
	int ret;

	ret = call(socket_path, false, ctl_umount_req_to_json(req), CTL_TIMEOUT_MS, &resp,
		   msg, msglen);
	json_object_put(resp);
	return ret;
}

int ctl_client_list(const char *socket_path, struct ctl_list_reply *rep,
		    char *msg, size_t msglen)
{
	struct json_object *resp;
	char why[256];
	int ret;

	memset(rep, 0, sizeof(*rep));
	ret = call(socket_path, false, ctl_op_req_to_json(CTL_OP_LIST), CTL_TIMEOUT_MS,
		   &resp, msg, msglen);
	if (ret)
		return ret;
	ret = ctl_list_reply_parse(resp, rep, why, sizeof(why));
	json_object_put(resp);
	if (ret)
		ctl_list_reply_free(rep);
	return parsed(ret, why, msg, msglen);
}

/* A request that is only its op, answered with ok or an error. */
static int call_op(const char *socket_path, enum ctl_op op, char *msg, size_t msglen)
{
	struct json_object *resp;
	int ret;

	ret = call(socket_path, false, ctl_op_req_to_json(op), CTL_TIMEOUT_MS,
		   &resp, msg, msglen);
	json_object_put(resp);
	return ret;
}

int ctl_client_shutdown(const char *socket_path, char *msg, size_t msglen)
{
	return call_op(socket_path, CTL_OP_SHUTDOWN, msg, msglen);
}

int ctl_client_upgrade(const char *socket_path, char *msg, size_t msglen)
{
	return call_op(socket_path, CTL_OP_UPGRADE, msg, msglen);
}

int ctl_client_metrics(const char *socket_path, char **text, char *msg,
		       size_t msglen)
{
	struct json_object *resp;
	const char *t;
	char why[256];
	int ret;

	*text = NULL;
	ret = call(socket_path, false, ctl_op_req_to_json(CTL_OP_METRICS), CTL_TIMEOUT_MS,
		   &resp, msg, msglen);
	if (ret)
		return ret;
	ret = ctl_metrics_reply_parse(resp, &t, why, sizeof(why));
	if (!ret && !(*text = strdup(t)))
		ret = -ENOMEM;
	json_object_put(resp);
	return parsed(ret, why, msg, msglen);
}

int ctl_client_exec_mount(const char *socket_path, const struct ctl_mount_req *req)
{
	struct json_object *o = ctl_mount_req_to_json(req);
	const char *argv[12], *text;
	char *path = ferryd_path(), fdarg[16];
	int i, fd = -1, ret = -ENOMEM;

	if (!path) {
		ret = -ENOEXEC; /* said why */
		goto out;
	}
	if (!o) {
		ferry_err("mount %s: out of memory", req->image);
		goto out;
	}
	/* Through a descriptor: credentials must not show in ferryd's
	 * command line (ps). */
	text = json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN |
					      JSON_C_TO_STRING_NOSLASHESCAPE);
	fd = memfd_create("ferry-mount-request", 0);
	ret = fd < 0 ? -errno : write_full(fd, text, strlen(text));
	if (!ret && lseek(fd, 0, SEEK_SET) != 0)
		ret = -errno;
	if (ret) {
		ferry_err("mount %s: cannot pass the request to ferryd: %s", req->image,
			  ferry_strerror(ret));
		goto out;
	}
	snprintf(fdarg, sizeof(fdarg), "%d", fd);
	ferryd_argv(argv, path, socket_path, true);
	for (i = 0; argv[i]; i++)
		;
	argv[i++] = "-f";
	argv[i++] = "--mount-fd";
	argv[i++] = fdarg;
	argv[i] = NULL;
	fflush(NULL);
	exec_ferryd(path, argv);
	ret = -errno;
	ferry_err("mount %s: cannot run %s: %s", req->image, path, strerror(-ret));
out:
	if (fd >= 0)
		close(fd);
	free(path);
	json_object_put(o);
	return ret;
}
