/* SPDX-License-Identifier: MIT */
/*
 * The control protocol between ferry (the CLI) and ferryd (the lazy-mount
 * daemon), compiled into both binaries.
 *
 * Transport: a unix stream socket (default /run/ferry/ferryd.sock, mode
 * 0600). Each request is one JSON object on one line; ferryd answers each
 * with one JSON object on one line, then reads the next request of the
 * same connection until EOF. Requests ("op"):
 *
 *   {"op":"mount","image":REF,"mountpoint":ABS,"cacheDir":ABS,
 *    "mode":"fuse"|"fanotify" (default fuse; ferryd names the modes it has),
 *    "prefetchFiles":[PATH...],"prefetchAll":BOOL,"prefetchBwlimit":N,
 *    "fetch":{"creds":S,"authfile":S,"tlsVerify":BOOL,"caFile":S,
 *             "insecure":[S...],"mirrors":[S...],"retries":N,
 *             "stallTimeoutMs":N}}
 *       answered once the mount is live
 *       → {"ok":true,"pid":N}
 *   {"op":"umount","mountpoint":ABS,"lazy":BOOL}
 *       answered once the mount is torn down (a few seconds at most)
 *   {"op":"list"}  → {"ok":true,"pid":N,"version":S,"socket":S,"mounts":
 *       [{"mountpoint","image","cacheDir","mode","keeperPid" (fanotify),
 *         "state","mountedAt","bytesRead",
 *         "bytesFetched","bytesPrefetched","chunksPresent","chunksTotal",
 *         "bytesPresent","prefetch","prefetchFiles","prefetchSeconds"}]}
 *   {"op":"ping"}  → {"ok":true,"pid":N,"version":S,"socket":S}
 *   {"op":"shutdown"} (as SIGTERM)
 *
 * Answers: {"ok":true,...} or {"ok":false,"error":MESSAGE,"errno":N} where
 * MESSAGE names the image / mount point and the reason and N is the
 * positive errno (ENOENT from umount: that mount point is not ferryd's).
 *
 * Paths in requests are absolute: ferryd runs in "/" with its own
 * environment, so the client resolves relative paths and defaults.
 */
#ifndef FERRY_CTL_H
#define FERRY_CTL_H

#include <json-c/json.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../pkg-fetch/fetch.h"

#define CTL_DEFAULT_SOCKET "/run/ferry/ferryd.sock"
#define CTL_SOCKET_ENV "FERRYD_SOCKET"
#define CTL_LINE_MAX (16u << 20)      /* longest request or answer line */
#define CTL_PREFETCH_FILES_MAX 1000000u
#define CTL_HOSTS_MAX 64u             /* insecure / mirrors entries */
#define CTL_MODE_MAX 16u              /* a mode name: lowercase letters */

/* $FERRYD_SOCKET, else CTL_DEFAULT_SOCKET. */
const char *ctl_default_socket(void);

/*
 * Connect to the daemon's socket: 0 and a CLOEXEC fd, -ENOENT or
 * -ECONNREFUSED when no daemon listens there, another -errno otherwise.
 */
int ctl_connect(const char *path, int *fd);

/* Write @msg as one line (no SIGPIPE). */
int ctl_send(int fd, struct json_object *msg);

/* Buffered line reader over a socket. */
struct ctl_reader {
	int fd;
	char *buf;
	size_t len, cap;
};
void ctl_reader_init(struct ctl_reader *r, int fd);
void ctl_reader_free(struct ctl_reader *r);
/*
 * The next line as a JSON object: 0 and *@out, 1 at a clean EOF, or
 * -ETIMEDOUT (nothing for @timeout_ms; < 0 waits forever), -EMSGSIZE
 * (line over CTL_LINE_MAX), -EPROTO (not a JSON object), -errno.
 */
int ctl_recv(struct ctl_reader *r, int timeout_ms, struct json_object **out);

/*
 * One request on a new connection to @socket_path; *@resp is the answer
 * (the caller puts it). Transport errors as for ctl_connect / ctl_recv.
 */
int ctl_call(const char *socket_path, struct json_object *req, int timeout_ms,
	     struct json_object **resp);

/* {"ok":true} / {"ok":false,"error":@msg,"errno":-@err}. */
struct json_object *ctl_ok(void);
struct json_object *ctl_error(int err, const char *msg);
/* 0 for an ok answer; else -errno (-EPROTO if none) and *@msg. */
int ctl_status(struct json_object *resp, const char **msg);

/* Typed field access (strings: json_get_string); @def when absent or mistyped. */
bool ctl_get_bool(struct json_object *o, const char *key, bool def);
uint64_t ctl_get_u64(struct json_object *o, const char *key, uint64_t def);

/*
 * A mount request. Built by the client (strings borrowed from it) or
 * parsed by the daemon (strings borrowed from the parsed JSON, which the
 * request holds until ctl_mount_req_free).
 */
struct ctl_mount_req {
	const char *image, *mountpoint, *cache_dir;
	const char **prefetch_files;
	size_t nr_prefetch_files;
	bool prefetch_all;
	const char *mode;          /* "fuse", "fanotify"; parsed: never NULL */
	uint64_t prefetch_bwlimit; /* bytes per second, 0 = unlimited */
	struct fetch_opts fetch;   /* insecure / mirrors NULL-terminated */
	/* Parsed requests only. */
	struct json_object *root;
	const char **insecure, **mirrors;
};
void ctl_mount_req_init(struct ctl_mount_req *r);
struct json_object *ctl_mount_req_to_json(const struct ctl_mount_req *r);
/* Validate @req: 0, or -EINVAL with a reason in @err. Takes a reference. */
int ctl_mount_req_parse(struct json_object *req, struct ctl_mount_req *r,
			char *err, size_t errlen);
void ctl_mount_req_free(struct ctl_mount_req *r);

/*
 * The file system mounted on top of the absolute path @mountpoint, from
 * /proc/self/mountinfo (no access to the mount itself, so a dead or our
 * own FUSE mount cannot block): 0, or -ENOENT when nothing is mounted there.
 */
struct ctl_mnt {
	unsigned int major, minor;
	char fstype[64];
	char source[1024];
};
int ctl_mountinfo(const char *mountpoint, struct ctl_mnt *out);

/* The fstype of a ferry FUSE mount (fuse.<subtype>). */
#define CTL_FUSE_FSTYPE "fuse.ferry"

/*
 * A mount point's canonical path: realpath, or for a path that cannot be
 * resolved (a dead FUSE mount answers ENOTCONN) the realpath of its
 * directory plus its last component.
 */
int ctl_mountpoint_path(const char *path, char **out);

#endif
