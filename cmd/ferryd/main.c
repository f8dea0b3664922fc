// SPDX-License-Identifier: MIT
/* ferryd: options, then daemonize (unless -f) and run. */
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <libgen.h>
#include <malloc.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ferryd.h"

#define READY_WAIT_MS 60000
#define DEFAULT_IDLE_TIMEOUT 300 /* seconds */

static void help(void)
{
	printf("Usage: ferryd [-f] [--socket PATH] [--log-file PATH] [-v|-q] [OPTIONS]\n\n"
	       "ferry's lazy-mount daemon. It serves ferry images through FUSE, or\n"
	       "through kernel EROFS mounts whose cache files it fills on fanotify\n"
	       "pre-content events or on /dev/cachefiles requests (EROFS over\n"
	       "fscache): the tree is there as soon as the bootstrap is fetched,\n"
	       "file data is fetched chunk by chunk when first read and kept in the\n"
	       "chunk cache. One ferryd hosts any number of mounts of any mode;\n"
	       "'ferry mount' talks to it over its control socket and starts it when\n"
	       "needed. Each FUSE and fanotify mount has a keeper process\n"
	       "(ferryd-keeper, a small program installed next to ferryd) that\n"
	       "holds its /dev/fuse connection or fanotify group: if ferryd dies (or\n"
	       "'ferry daemon upgrade' replaces it) the keeper hands the mount to a\n"
	       "new ferryd on the same socket, starting one with the same options\n"
	       "(log file and level, serving, cache and metrics options) when none\n"
	       "answers; readers only wait. A fanotify mount no ferryd takes fails\n"
	       "reads of data not yet cached with EIO, never zeros, until it is\n"
	       "unmounted. The cachefiles mounts share one keeper (ferryd-keeper\n"
	       "cachefiles) that holds /dev/cachefiles: if ferryd dies it becomes a\n"
	       "new ferryd on the same socket (--cachefiles-takeover FD), which takes\n"
	       "those mounts over.\n\n"
	       "Options:\n"
	       "  -f, --foreground   stay in the foreground, log to stderr\n"
	       "  --socket PATH      control socket (default $%s or\n"
	       "                     %s; mode 0600, one ferryd\n"
	       "                     per socket: PATH.lock)\n"
	       "  --log-file PATH    log file without -f (default ferryd.log next to\n"
	       "                     the socket); SIGHUP reopens it\n"
	       "  --mount REQUEST    mount REQUEST (a JSON mount request, see\n"
	       "                     ferryd(8)) at start; exit with status 1 if that\n"
	       "                     fails, and once no mount is left\n"
	       "  --mount-fd FD      the same, the request read from descriptor FD\n"
	       "                     ('ferry mount -f' passes it so: credentials stay\n"
	       "                     out of the command line)\n"
	       "  --exist-ok         exit with status 0 if a ferryd already serves the\n"
	       "                     socket (how 'ferry mount' starts ferryd)\n"
	       "  --threads N        FUSE worker threads per mount (default %u)\n"
	       "  --readahead KB     kernel readahead of each FUSE mount (default %u;\n"
	       "                     0 keeps the kernel's 128)\n"
	       "  --dir-readahead KB  FUSE mounts: when a directory's files are read\n"
	       "                     in order, store the files that follow (cached\n"
	       "                     chunks only) in the page cache ahead of the\n"
	       "                     reader, in windows of up to KB (default %u; 0 off)\n"
	       "  --idle-timeout S   exit once no mount and no client has been there\n"
	       "                     for S seconds (default %u; 0: never)\n"
	       "  --persistent       the same as --idle-timeout 0\n"
	       "  --metrics-listen ADDR  serve Prometheus metrics at GET /metrics on\n"
	       "                     ADDR: unix:/PATH (mode 0600) or HOST:PORT (TCP;\n"
	       "                     the metrics name mount points and images: bind\n"
	       "                     to 127.0.0.1 unless the network may see them).\n"
	       "                     'ferry metrics' reads them over the control socket;\n"
	       "                     repeat for up to 4 addresses\n"
	       "  --cache-max-size SIZE  keep each chunk cache ferryd serves from within\n"
	       "                     SIZE bytes (K, M, G suffixes) of blob files:\n"
	       "                     least recently used data is evicted, fetched\n"
	       "                     again when read; --mode local mounts' blobs\n"
	       "                     never (default 0: no limit; a mount request's\n"
	       "                     own limit, ferry mount --cache-max-size, wins)\n"
	       "  --cache-min-free PCT  also evict while the cache's file system has\n"
	       "                     less than PCT %% free (default %u; 0 off)\n"
	       "  -v, --verbose      more log output (repeat for debug)\n"
	       "  -q, --quiet        errors only\n"
	       "  -h, --help         this help\n"
	       "  --version          print the release and the image formats it reads\n\n"
	       "Without -f, ferryd forks; the parent exits once the socket listens\n"
	       "(status 0) or the daemon failed to start (status 1, reason on stderr).\n"
	       "Under systemd, ferryd -f takes the control socket from socket\n"
	       "activation (LISTEN_FDS; see contrib/systemd); it must listen on --socket.\n"
	       "SIGTERM or SIGINT unmounts every mount (busy ones are detached; a\n"
	       "FUSE one has its connection closed, a fanotify one is left to its\n"
	       "keeper) and exits. A mount unmounted from\n"
	       "outside (umount) is cleaned up; the others keep running.\n\n"
	       "Exit status: 0 success, 1 failure, 2 usage error.\n",
	       CTL_SOCKET_ENV, CTL_DEFAULT_SOCKET, SERVE_DEFAULT_THREADS,
	       SERVE_DEFAULT_READAHEAD_KB, SERVE_DEFAULT_DIR_READAHEAD_KB,
	       DEFAULT_IDLE_TIMEOUT, SERVE_DEFAULT_CACHE_MIN_FREE);
}

static int usage(const char *fmt, const char *arg)
{
	fprintf(stderr, "ferryd: ");
	fprintf(stderr, fmt, arg);
	fprintf(stderr, "\nTry 'ferryd --help'.\n");
	return 2;
}

/* The parent of a daemonizing ferryd: exit once the child is ready. */
static int wait_ready(int fd)
{
	struct pollfd pfd = { .fd = fd, .events = POLLIN };
	char buf[8];
	size_t got = 0;
	ssize_t n;

	while (got < 3) {
		if (poll(&pfd, 1, READY_WAIT_MS) <= 0) {
			fprintf(stderr, "ferryd: the daemon did not report readiness within %d s\n",
				READY_WAIT_MS / 1000);
			return EXIT_FAILURE;
		}
		n = read(fd, buf + got, sizeof(buf) - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return EXIT_FAILURE; /* it failed and said why on stderr */
		got += (size_t)n;
	}
	return memcmp(buf, "OK\n", 3) ? EXIT_FAILURE : EXIT_SUCCESS;
}

/* The --mount-fd request (a memfd): all of it, NUL-terminated; @fd is closed. */
static int read_request(int fd, char **out)
{
	char path[32];
	size_t len;
	int ret;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	ret = read_file_max(path, CTL_LINE_MAX, out, &len);
	if (ret)
		fprintf(stderr, "ferryd: --mount-fd %d: %s\n", fd,
			ret == -EFBIG ? "request too long" : strerror(-ret));
	close(fd);
	return ret;
}

/* The --mount request: 0 and *@r, or -errno after a message. */
static int parse_mount(const char *text, struct ctl_mount_req *r)
{
	struct json_object *o;
	char err[1024] = "";
	int ret = json_parse_object(text, strlen(text), &o);

	if (ret) {
		ferry_err("--mount: not a JSON object");
		return ret;
	}
	ret = ctl_mount_req_parse(o, r, err, sizeof(err));
	json_object_put(o);
	if (ret)
		ferry_err("--mount: invalid mount request: %s", err);
	return ret;
}

int main(int argc, char **argv)
{
	/*
	 * Memory (bench/memory.sh: peak 45.8 MiB -> 23.1 MiB for three mounts
	 * of the big image). Each FUSE worker and fill thread would get a
	 * malloc arena of its own, and glibc's sliding mmap threshold would
	 * move the 4 MiB fetch buffers into those arenas, which keep what is
	 * freed: two arenas, and buffers from 256 KiB up mapped and unmapped.
	 */
	mallopt(M_ARENA_MAX, 2);
	mallopt(M_MMAP_THRESHOLD, 256 << 10);

	static const struct option longopts[] = {
		{ "foreground", no_argument, NULL, 'f' },
		{ "socket", required_argument, NULL, 'S' },
		{ "log-file", required_argument, NULL, 'L' },
		{ "mount", required_argument, NULL, 'M' },
		{ "mount-fd", required_argument, NULL, 'F' },
		{ "exist-ok", no_argument, NULL, 'E' },
		{ "cachefiles-takeover", required_argument, NULL, 'A' },
		/* Its name before 0.5.0: keepers of those releases start
		 * their successors (the installed, newer ferryd) with it. */
		{ "cachefiles-adopt", required_argument, NULL, 'A' },
		{ "threads", required_argument, NULL, 'T' },
		{ "readahead", required_argument, NULL, 'R' },
		{ "dir-readahead", required_argument, NULL, 'D' },
		{ "idle-timeout", required_argument, NULL, 'I' },
		{ "persistent", no_argument, NULL, 'P' },
		{ "metrics-listen", required_argument, NULL, 'm' },
		{ "cache-max-size", required_argument, NULL, 'X' },
		{ "cache-min-free", required_argument, NULL, 'N' },
		{ "verbose", no_argument, NULL, 'v' },
		{ "quiet", no_argument, NULL, 'q' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ 0 },
	};
	struct daemon_opts o = {
		.serve = {
			.socket_path = ctl_default_socket(),
			.fuse = {
				.threads = SERVE_DEFAULT_THREADS,
				.readahead_kb = SERVE_DEFAULT_READAHEAD_KB,
				.dir_readahead_kb = SERVE_DEFAULT_DIR_READAHEAD_KB,
			},
			.cache_min_free = SERVE_DEFAULT_CACHE_MIN_FREE,
			.idle_timeout = DEFAULT_IDLE_TIMEOUT,
		},
		.ready_fd = -1,
		.takeover_fd = -1,
	};
	char *log_default = NULL, *copy, *request = NULL;
	const char *mount_text = NULL;
	struct ctl_mount_req mreq;
	uint64_t v;
	int c, p[2];
	pid_t pid;

	while ((c = getopt_long(argc, argv, "fvqh", longopts, NULL)) != -1) {
		switch (c) {
		case 'f':
			o.foreground = true;
			break;
		case 'S':
			o.serve.socket_path = optarg;
			break;
		case 'L':
			o.serve.log_path = optarg;
			break;
		case 'M':
			mount_text = optarg;
			break;
		case 'E':
			o.exist_ok = true;
			break;
		case 'A':
			if (parse_size(optarg, &v) || v > INT_MAX || fcntl((int)v, F_GETFD) < 0)
				return usage("--cachefiles-takeover %s: expected an open descriptor", optarg);
			o.takeover_fd = (int)v;
			fcntl(o.takeover_fd, F_SETFD, FD_CLOEXEC);
			break;
		case 'F':
			if (parse_size(optarg, &v) || v > INT_MAX)
				return usage("--mount-fd %s: expected a descriptor", optarg);
			free(request);
			if (read_request((int)v, &request))
				return EXIT_FAILURE;
			mount_text = request;
			break;
		case 'T':
			if (parse_size(optarg, &v) || v < 1 || v > SERVE_MAX_THREADS)
				return usage("--threads %s: expected 1..256", optarg);
			o.serve.fuse.threads = (unsigned int)v;
			break;
		case 'R':
			if (parse_size(optarg, &v) || v > 65536)
				return usage("--readahead %s: expected 0..65536 (KiB)", optarg);
			o.serve.fuse.readahead_kb = (unsigned int)v;
			break;
		case 'D':
			if (parse_size(optarg, &v) || v > 65536)
				return usage("--dir-readahead %s: expected 0..65536 (KiB)", optarg);
			o.serve.fuse.dir_readahead_kb = (unsigned int)v;
			break;
		case 'I':
			if (parse_size(optarg, &v) || v > 30 * 86400)
				return usage("--idle-timeout %s: expected 0..2592000 (seconds)", optarg);
			o.serve.idle_timeout = (unsigned int)v;
			break;
		case 'P':
			o.serve.idle_timeout = 0;
			break;
		case 'm':
			if (o.serve.nr_metrics_listen == SERVE_METRICS_LISTEN_MAX)
				return usage("--metrics-listen %s: at most 4 addresses", optarg);
			o.serve.metrics_listen[o.serve.nr_metrics_listen++] = optarg;
			break;
		case 'X':
			if (parse_size(optarg, &o.serve.cache_max_size))
				return usage("--cache-max-size %s: expected a size (e.g. 10G)", optarg);
			break;
		case 'N':
			if (parse_size(optarg, &v) || v > 99)
				return usage("--cache-min-free %s: expected 0..99 (%% of the file system)", optarg);
			o.serve.cache_min_free = (unsigned int)v;
			break;
		case 'v':
			if (ferry_log_level < FERRY_LOG_DEBUG)
				ferry_log_level++;
			break;
		case 'q':
			ferry_log_level = FERRY_LOG_ERR;
			break;
		case 'h':
			help();
			return EXIT_SUCCESS;
		case 'V':
			printf("ferryd %s\n", FERRYD_VERSION);
			image_print_formats(stdout);
			return EXIT_SUCCESS;
		default:
			return usage("%s", "unknown option");
		}
	}
	if (optind != argc)
		return usage("unexpected argument \"%s\"", argv[optind]);
	if (o.serve.socket_path[0] != '/')
		return usage("--socket %s: expected an absolute path", o.serve.socket_path);
	if (!o.serve.log_path) {
		copy = strdup(o.serve.socket_path);
		if (!copy || asprintf(&log_default, "%s/ferryd.log", dirname(copy)) < 0) {
			fprintf(stderr, "ferryd: out of memory\n");
			return EXIT_FAILURE;
		}
		free(copy);
		o.serve.log_path = log_default;
	}
	if (o.serve.log_path[0] != '/')
		return usage("--log-file %s: expected an absolute path", o.serve.log_path);
	ctl_mount_req_init(&mreq);
	c = mount_text ? parse_mount(mount_text, &mreq) : 0;
	free(request);
	if (c) {
		c = EXIT_FAILURE;
		goto out;
	}
	if (mount_text)
		o.mount = &mreq;
	/* Descriptors 0-2 must exist, or the log would land on a socket. */
	while ((c = open("/dev/null", O_RDWR | O_CLOEXEC)) >= 0 && c <= 2)
		fcntl(c, F_SETFD, 0);
	if (c > 2)
		close(c);
	c = EXIT_FAILURE;
	/* Hold no directory busy (mount points may be under it). */
	if (chdir("/")) {
		perror("ferryd: chdir /");
		goto out;
	}

	/* A successor (--cachefiles-takeover) is detached already: its keeper
	 * started it in a session of its own. */
	if (!o.foreground && o.takeover_fd < 0) {
		if (pipe2(p, O_CLOEXEC)) {
			perror("ferryd: pipe");
			goto out;
		}
		fflush(NULL);
		pid = fork();
		if (pid < 0) {
			perror("ferryd: fork");
			goto out;
		}
		if (pid > 0) {
			close(p[1]);
			c = wait_ready(p[0]);
			goto out;
		}
		close(p[0]);
		setsid();
		/* Keep no descriptor of whoever started us (pipes of a shell
		 * or test harness would never see EOF), and the ready pipe on
		 * 3: every daemon then numbers its own descriptors alike, which
		 * a fanotify takeover relies on (fan_startup). */
		if (p[1] > 3)
			close_range(3, (unsigned int)p[1] - 1, 0);
		close_range((unsigned int)p[1] + 1, ~0u, 0);
		if (p[1] > 3 && dup3(p[1], 3, O_CLOEXEC) == 3) {
			close(p[1]);
			p[1] = 3;
		}
		o.ready_fd = p[1];
	}
	c = daemon_run(&o);
out:
	ctl_mount_req_free(&mreq); /* unless daemon_run took it over */
	free(log_default);
	return c;
}
