/* SPDX-License-Identifier: MIT */
/*
 * ferryd: the lazy-mount daemon. One process hosts any number of lazy
 * mounts of ferry images, served by pkg-serve (serve.h) in its modes;
 * ferry (the CLI) talks to it over the control socket (cmd/ctl.h). Here
 * is only the daemon around the serving core:
 *
 *   main.c     options, daemonizing, readiness pipe
 *   daemon.c   control socket, connections, signals, the log file,
 *              upgrade, shutdown
 *   metrics.c  the metrics' HTTP endpoint, the process's memory
 *
 * The keepers' program is cmd/ferryd-keeper (pkg-serve's keeper_main.c).
 */
#ifndef FERRYD_H
#define FERRYD_H

#include <stdbool.h>
#include <stdint.h>

#include "../../pkg-base/base.h"
#include "../../pkg-serve/serve.h"
#include "../ctl.h"

#define FERRYD_VERSION FERRY_VERSION

struct daemon_opts {
	struct serve_opts serve;     /* socket, log file, serving options */
	struct ctl_mount_req *mount; /* --mount: mount this at start (taken over),
				      * exit when none is left */
	bool foreground;
	bool exist_ok;          /* another ferryd on the socket is success */
	int ready_fd;           /* daemon mode: "OK\n" once listening, then closed */
	int takeover_fd;        /* --cachefiles-takeover: a device a keeper held for
				 * the dead ferryd, whose mounts to take over; -1 */
};
int daemon_run(const struct daemon_opts *o);
/* What a ping answers: pid, version, socket, start, memory, lifecycle. */
void daemon_info(struct ctl_ping_reply *r);
/* The metrics text of ferryd now (serve_metrics_text), malloc'ed. */
int daemon_metrics_text(char **out);
/* The process's resident memory now and at its peak, in bytes. */
void daemon_memory(uint64_t *rss, uint64_t *peak);

/*
 * metrics.c: serve the metrics over HTTP on @addr ("unix:/PATH" or
 * "HOST:PORT"): 0, or -errno for a malformed address; one that cannot be
 * bound is tried again every second. metrics_stop closes every endpoint
 * (before a successor starts).
 */
int metrics_start(const char *addr);
void metrics_stop(void);

#endif
