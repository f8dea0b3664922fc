/* SPDX-License-Identifier: MIT */
/*
 * What ferryd and its keepers share. A keeper is a small program of its
 * own, ferryd-keeper (keeper_main.c), installed next to ferryd: it links
 * neither libcurl, OpenSSL, libfuse nor the codecs, so starting one —
 * on every FUSE and fanotify mount's path, and beside the first
 * cachefiles mount — costs a sixth of an exec of ferryd's CPU, and each
 * keeper holds ~120 KiB of memory of its own (docs/performance-log.md).
 *
 *   ferryd-keeper fuse FD SOCK SOCKET [OPTION...]
 *   ferryd-keeper fanotify GROUP_FD SOCK MOUNTPOINT SOURCE SWEEP_MAX SOCKET [OPTION...]
 *   ferryd-keeper cachefiles DEVFD SOCK SOCKET [OPTION...]
 *
 * FD/GROUP_FD/DEVFD: the descriptor it keeps; SOCK: its end of a
 * SOCK_SEQPACKET pair with ferryd; SOCKET: ferryd's control socket;
 * OPTION: a successor ferryd's options. It forks, its first process
 * exits (ferryd waits for that one), and the second answers "pid N"; then
 * ferryd sends "req JSON" (the mount's request, for a successor), "sysfs
 * PATH" (fanotify), "bye" (let go), "alone" (fanotify: ferryd shut down,
 * the mount in use). A FUSE keeper's one word, KEEPER_ENDED, says the
 * connection ended. The socket closing without "bye" means ferryd died.
 */
#ifndef FERRY_SERVE_KEEPER_H
#define FERRY_SERVE_KEEPER_H

#include <json-c/json.h>
#include <stddef.h>

#include "../pkg-image/image.h"

#define CF_DEVICE IMAGE_CACHEFILES_DEVICE

#define KEEPER_BINARY "ferryd-keeper"
#define KEEPER_ARGS_MAX 32
#define KEEPER_MSG_MAX (192u << 10) /* a message from ferryd: the mount request */
#define KEEPER_ENDED "ended"        /* a FUSE keeper's last word */
/* What a keeper keeps: its first argument. */
#define KEEPER_FUSE "fuse"
#define KEEPER_FANOTIFY "fanotify"
#define KEEPER_CACHEFILES "cachefiles"


/* The cachefiles mounts a ferryd records for its successor, next to its
 * socket: {"mounts":[REQUEST...]}, each as the control socket takes it. */
#define CF_STATE "ferryd.cachefiles.json"
#define CF_STATE_MAX (16u << 20)

/*
 * The path of the ferry binary @name in this program's directory (ferryd
 * and ferryd-keeper live side by side); with @name NULL, this program's
 * own. The installed path, also once replaced on disk (an upgrade: the
 * path names the new binary). 0 or -errno.
 */
int sibling_exe(const char *name, char *buf, size_t len);
/*
 * The cachefiles mounts recorded next to @socket_path: *@top the parsed
 * file (put it), *@mounts its array; @path gets the file's name. 0 or
 * -errno (-ENOENT: none recorded).
 */
int cf_recorded_mounts(const char *socket_path, char *path, size_t path_len,
		       struct json_object **top, struct json_object **mounts);

#endif
