// SPDX-License-Identifier: MIT
/*
 * ferry daemon status|stop|upgrade, and ferry metrics: the operator's view of the
 * ferryd on a control socket (cmd/ctl.h).
 */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../../pkg-base/base.h"
#include "../ctl.h"
#include "cmd.h"

#define STOP_WAIT_DEFAULT_S 30

static void daemon_help(void)
{
	printf("Usage: ferry daemon status [--json] [--socket PATH]\n"
	       "       ferry daemon stop [--force] [--timeout S] [--socket PATH]\n"
	       "       ferry daemon upgrade [--timeout S] [--socket PATH]\n\n"
	       "status  says whether a ferryd serves the control socket: its pid,\n"
	       "        version, uptime, memory, idle timeout and mounts by mode.\n"
	       "        Exit status 0 when one runs, 3 when none does.\n"
	       "stop    asks it to exit and waits until it has. A ferryd with lazy\n"
	       "        mounts is not stopped without --force: stopping it unmounts\n"
	       "        them (busy ones are detached and fail their reads).\n"
	       "upgrade replaces it with the ferryd binary installed now, keeping\n"
	       "        every mount: their keepers hand them to the new ferryd, and\n"
	       "        readers only wait. Waits until the new one serves them all.\n\n"
	       "Options:\n"
	       "  --socket PATH  ferryd's control socket (default $%s or %s)\n"
	       "  --json         status: the daemon and its mounts as JSON on stdout\n"
	       "  --force        stop: even with mounts\n"
	       "  --timeout S    stop, upgrade: wait at most S seconds (default %d)\n"
	       "  -h, --help     this help\n\n" EXIT_CODES_HELP,
	       CTL_SOCKET_ENV, CTL_DEFAULT_SOCKET, STOP_WAIT_DEFAULT_S);
}

static void count_modes(const struct ctl_list_reply *lr, char *out, size_t len)
{
	static const char *const modes[] = { "fuse", "fanotify", "cachefiles" };
	size_t i, j, n, used = 0;

	out[0] = '\0';
	for (j = 0; j < ARRAY_SIZE(modes); j++) {
		for (n = 0, i = 0; i < lr->nr_mounts; i++)
			n += !strcmp(lr->mounts[i].mode, modes[j]);
		if (n && used < len)
			used += (size_t)snprintf(out + used, len - used, "%s%zu %s",
						 used ? ", " : " (", n, modes[j]);
	}
	if (used && used < len)
		snprintf(out + used, len - used, ")");
}

static int status(const char *socket_path, bool json)
{
	struct ctl_list_reply lr;
	struct json_object *o;
	char msg[CTL_MSG_MAX + 64], modes[128], idle[32];
	int64_t up;
	int ret = ctl_client_list(socket_path, &lr, msg, sizeof(msg));

	if (ret && ctl_no_daemon(ret) && !msg[0]) {
		if (json) {
			o = json_object_new_object();
			if (!o || json_object_object_add(o, "running", json_object_new_boolean(0)) ||
			    json_object_object_add(o, "socket", json_object_new_string(socket_path))) {
				json_object_put(o);
				return EXIT_FAIL;
			}
			printf("%s\n", json_object_to_json_string_ext(o, JSON_C_TO_STRING_NOSLASHESCAPE));
			json_object_put(o);
		} else {
			printf("no ferryd on %s\n", socket_path);
		}
		return 3;
	}
	if (ret) {
		ferry_err("ferryd (%s): %s", socket_path, msg[0] ? msg : ferry_strerror(ret));
		return EXIT_FAIL;
	}
	if (json) {
		o = ctl_list_reply_to_json(&lr);
		ret = o && !json_object_object_add(o, "running", json_object_new_boolean(1)) ?
			      0 : -ENOMEM;
		if (!ret)
			printf("%s\n", json_object_to_json_string_ext(
					       o, JSON_C_TO_STRING_PRETTY |
							  JSON_C_TO_STRING_NOSLASHESCAPE));
		json_object_put(o);
		ctl_list_reply_free(&lr);
		return ret ? EXIT_FAIL : EXIT_OK;
	}
	up = time(NULL) - lr.daemon.started_at;
	count_modes(&lr, modes, sizeof(modes));
	if (lr.daemon.idle_timeout)
		snprintf(idle, sizeof(idle), "%u s", lr.daemon.idle_timeout);
	else
		snprintf(idle, sizeof(idle), "never (persistent)");
	printf("ferryd %s, pid %d, on %s%s\n"
	       "  up:          %lldh%02lldm%02llds\n"
	       "  memory:      %.1f MiB resident, %.1f MiB peak\n"
	       "  idle exit:   %s\n"
	       "  mounts:      %zu%s\n",
	       lr.daemon.version, lr.daemon.pid, lr.daemon.socket,
	       lr.daemon.socket_activated ? " (socket-activated)" : "",
	       (long long)(up / 3600), (long long)(up / 60 % 60), (long long)(up % 60),
	       (double)lr.daemon.rss_bytes / 1048576, (double)lr.daemon.peak_rss_bytes / 1048576,
	       idle, lr.nr_mounts, modes);
	ctl_list_reply_free(&lr);
	return EXIT_OK;
}

static int stop(const char *socket_path, bool force, unsigned int timeout_s)
{
	struct ctl_list_reply lr;
	char msg[CTL_MSG_MAX + 64];
	unsigned int waited_ms;
	int ret = ctl_client_list(socket_path, &lr, msg, sizeof(msg)), pid;

	if (ret && ctl_no_daemon(ret) && !msg[0]) {
		printf("no ferryd on %s\n", socket_path);
		return EXIT_OK;
	}
	if (ret) {
		ferry_err("ferryd (%s): %s", socket_path, msg[0] ? msg : ferry_strerror(ret));
		return EXIT_FAIL;
	}
	pid = lr.daemon.pid;
	if (lr.nr_mounts && !force) {
		ferry_err("ferryd %d (%s) serves %zu mount%s (%s%s): unmount them ('ferry umount'), or stop with --force to unmount them all",
			  pid, socket_path, lr.nr_mounts, lr.nr_mounts == 1 ? "" : "s",
			  lr.mounts[0].mountpoint, lr.nr_mounts > 1 ? ", ..." : "");
		ctl_list_reply_free(&lr);
		return EXIT_FAIL;
	}
	ctl_list_reply_free(&lr);
	ret = ctl_client_shutdown(socket_path, msg, sizeof(msg));
	if (ret && !(ctl_no_daemon(ret) && !msg[0])) {
		ferry_err("ferryd %d (%s): %s", pid, socket_path, msg[0] ? msg : ferry_strerror(ret));
		return EXIT_FAIL;
	}
	/* Stopped once the pid is gone (or was reused by a process that is
	 * not ferryd's: the socket no longer answers then either). */
	for (waited_ms = 0; waited_ms < timeout_s * 1000u; waited_ms += 50) {
		if (kill(pid, 0) && errno == ESRCH) {
			printf("ferryd %d stopped\n", pid);
			return EXIT_OK;
		}
		nanosleep(&(struct timespec){ 0, 50000000 }, NULL);
	}
	ferry_err("ferryd %d (%s) has not exited after %u s (see its log); it may still be unmounting",
		  pid, socket_path, timeout_s);
	return EXIT_FAIL;
}

/*
 * Whether the ferryd answering on @socket_path is not @old_pid and lists
 * @nr mounts, each with its keeper again (ready for the next upgrade):
 * 1, 0 (not yet), -errno.
 */
static int upgraded(const char *socket_path, int old_pid, size_t nr, int *pid)
{
	struct ctl_list_reply lr = { 0 };
	char msg[CTL_MSG_MAX];
	int ret = ctl_client_list(socket_path, &lr, msg, sizeof(msg));
	size_t i;

	if (ret)
		return ctl_no_daemon(ret) || ret == -ECONNRESET ? 0 : ret;
	*pid = lr.daemon.pid;
	ret = lr.daemon.pid != old_pid && lr.nr_mounts >= nr;
	for (i = 0; i < lr.nr_mounts; i++)
		ret &= lr.mounts[i].keeper_pid > 0;
	ctl_list_reply_free(&lr);
	return ret;
}

static int upgrade(const char *socket_path, unsigned int timeout_s)
{
	struct ctl_list_reply lr = { 0 };
	char msg[CTL_MSG_MAX] = "";
	unsigned int waited_ms;
	int ret = ctl_client_list(socket_path, &lr, msg, sizeof(msg)), pid, new_pid = 0;
	size_t nr;

	if (ret) {
		ferry_err("ferryd (%s): %s", socket_path, msg[0] ? msg : ferry_strerror(ret));
		return EXIT_FAIL;
	}
	pid = lr.daemon.pid;
	nr = lr.nr_mounts;
	ctl_list_reply_free(&lr);
	ret = ctl_client_upgrade(socket_path, msg, sizeof(msg));
	if (ret) {
		ferry_err("ferryd %d (%s): upgrade refused: %s", pid, socket_path,
			  msg[0] ? msg : ferry_strerror(ret));
		return EXIT_FAIL;
	}
	for (waited_ms = 0; waited_ms < timeout_s * 1000u; waited_ms += 50) {
		ret = upgraded(socket_path, pid, nr, &new_pid);
		if (ret > 0) {
			printf("ferryd %d replaced by ferryd %d, serving %zu mount%s\n", pid,
			       new_pid, nr, nr == 1 ? "" : "s");
			return EXIT_OK;
		}
		nanosleep(&(struct timespec){ 0, 50000000 }, NULL);
	}
	ferry_err("ferryd on %s: no new ferryd serves the %zu mount%s of ferryd %d after %u s (see its log)",
		  socket_path, nr, nr == 1 ? "" : "s", pid, timeout_s);
	return EXIT_FAIL;
}

int cmd_daemon(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "socket", required_argument, NULL, 'S' },
		{ "json", no_argument, NULL, 'j' },
		{ "force", no_argument, NULL, 'F' },
		{ "timeout", required_argument, NULL, 'T' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	const char *socket_path = ctl_default_socket(), *what;
	bool json = false, force = false;
	unsigned int timeout_s = STOP_WAIT_DEFAULT_S;
	uint64_t v;
	int c;

	while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		switch (c) {
		case 'S':
			socket_path = optarg;
			break;
		case 'j':
			json = true;
			break;
		case 'F':
			force = true;
			break;
		case 'T':
			if (parse_size(optarg, &v) || v < 1 || v > 3600)
				return usage_error("daemon", "--timeout %s: expected 1..3600 (seconds)",
						   optarg);
			timeout_s = (unsigned int)v;
			break;
		case 'h':
			daemon_help();
			return EXIT_OK;
		default:
			return usage_error("daemon", "unknown option");
		}
	}
	if (optind + 1 != argc)
		return usage_error("daemon", "expected one of status, stop, upgrade");
	what = argv[optind];
	if (socket_path[0] != '/')
		return usage_error("daemon", "--socket %s: expected an absolute path", socket_path);
	if (!strcmp(what, "status")) {
		if (force || timeout_s != STOP_WAIT_DEFAULT_S)
			return usage_error("daemon", "--force and --timeout are for stop");
		return status(socket_path, json);
	}
	if (!strcmp(what, "stop")) {
		if (json)
			return usage_error("daemon", "--json is for status");
		return stop(socket_path, force, timeout_s);
	}
	if (!strcmp(what, "upgrade")) {
		if (json || force)
			return usage_error("daemon", "--json is for status, --force for stop");
		return upgrade(socket_path, timeout_s);
	}
	return usage_error("daemon", "unknown action \"%s\": expected status, stop or upgrade", what);
}

int cmd_metrics(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "socket", required_argument, NULL, 'S' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	const char *socket_path = ctl_default_socket();
	char msg[CTL_MSG_MAX + 64], *text = NULL;
	int c, ret;

	while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		switch (c) {
		case 'S':
			socket_path = optarg;
			break;
		case 'h':
			printf("Usage: ferry metrics [--socket PATH]\n\n"
			       "Print the metrics of the ferryd on the control socket in the\n"
			       "Prometheus text format: per mount bytes read, fetched and\n"
			       "prefetched, chunk cache hits and misses, a histogram of the time\n"
			       "demand reads waited for fetches, registry requests and retries;\n"
			       "ferryd's memory. ferryd --metrics-listen serves the same text\n"
			       "over HTTP for a scraper.\n\n"
			       "Options:\n"
			       "  --socket PATH  ferryd's control socket (default $%s or %s)\n"
			       "  -h, --help     this help\n\n" EXIT_CODES_HELP,
			       CTL_SOCKET_ENV, CTL_DEFAULT_SOCKET);
			return EXIT_OK;
		default:
			return usage_error("metrics", "unknown option");
		}
	}
	if (optind != argc)
		return usage_error("metrics", "unexpected argument \"%s\"", argv[optind]);
	ret = ctl_client_metrics(socket_path, &text, msg, sizeof(msg));
	if (ret) {
		if (ctl_no_daemon(ret) && !msg[0])
			ferry_err("no ferryd on %s (it starts with the first lazy mount)",
				  socket_path);
		else
			ferry_err("ferryd (%s): %s", socket_path, msg[0] ? msg : ferry_strerror(ret));
		return EXIT_FAIL;
	}
	fputs(text, stdout);
	free(text);
	return EXIT_OK;
}
