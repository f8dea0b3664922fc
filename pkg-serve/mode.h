/* SPDX-License-Identifier: MIT */
/*
 * Serving modes. A mode is how the kernel reaches a mount's data: "fuse"
 * (fuse.c: ferryd answers FUSE requests), "fanotify" (fanotify.c:
 * kernel EROFS over the chunk cache's files, filled on fanotify events)
 * or "cachefiles" (cachefiles.c: kernel EROFS over fscache, its cache
 * files filled on /dev/cachefiles requests).
 * mounts.c drives every mode through this table alike and never looks
 * inside a mode's state, nor asks which mode it holds: what differs is a
 * capability below. A new mode implements these ops, sets its
 * capabilities and adds itself to the table in mode.c.
 *
 * The life of a mount (m: image and chunk cache open):
 *
 *   start  the mounting thread (a control request): set up, mount(2) on
 *          m->mountpoint and make *state. Calls mount_ready(m) once the
 *          kernel serves the mount (before returning, or later from the
 *          loop, as FUSE's INIT); the request waits for it, and a mount
 *          not ready within seconds is stopped. On failure nothing is
 *          left mounted, nothing allocated, and the reason is in @why
 *          (or, when @why is empty, in the error lines logged). With
 *          m->req.takeover (a keeper handed the mount over, or
 *          a cachefiles successor) the mount is on m->mountpoint already:
 *          take it over, no mount(2).
 *   serve  the mount's loop thread, which mounts.c starts after start:
 *          serve until the mount is gone (0), stop, or a fatal error
 *          (-errno, logged).
 *   stop   any thread, while serve runs: make it return soon. It may
 *          come before serve began and is repeated until serve returned
 *          (a wake-up may be lost).
 *   live   (optional) the mounting thread, once ready and while serve
 *          runs: what has to wait until the kernel serves the mount.
 *   close  the loop thread, after serve returned @ret: end the session
 *          and free @state. A mount still on m->mountpoint is the
 *          mode's to detach (mount_detach) or to leave to a keeper.
 *   quiesce (optional) ferryd exits for an upgrade: make serve return
 *          soon without ending the mount or its keeper, no request left
 *          half taken.
 *   stats  (optional) a list request, while serve runs: the mode's own
 *          fields of the mount's list entry.
 *   evicting (optional) the eviction thread, while serve runs: the chunk
 *          cache is about to punch data out of this mount's blobs; make
 *          the kernel's reads of punched ranges reach the mode again;
 *          -errno when it cannot (then nothing is evicted).
 *   probe  a request for "auto" (any thread, before start): can the mode
 *          serve @req on this host? 0, or -errno; @why says what was
 *          found either way ("fanotify pre-content events on ext4").
 *
 * Not of a mount (optional): init and fini, the mode's own state in a
 * serving context (mode_ctx: mode_state() finds it); startup, once ferryd
 * listens and before it serves a request: what a successor must take
 * before its takeovers open descriptors; takeover_device, a successor
 * started with a device its keeper held (serve_takeover_device).
 *
 * mounts.c calls stop, live, stats and evicting only while @state exists (it
 * serialises them with close); the prefetch thread needs no mode.
 */
#ifndef FERRY_SERVE_MODE_H
#define FERRY_SERVE_MODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct fmount;
struct serve_ctx;
struct ctl_mount_req;
struct ctl_mount_stats;

struct serve_mode {
	const char *name;   /* the request's and the list's "mode" */
	const char *fstype; /* our mount in /proc/self/mountinfo */
	/* Capabilities. */
	bool records_reads;     /* its reads name files: --record */
	bool serves_layers;     /* native EROFS layers, lazily */
	const char *layers_needs; /* what that takes of the host, for messages */
	bool walks_on_takeover; /* native layers are walked again when taken over */
	bool quiesce_early;     /* an upgrade quiesces it before the successor starts,
				 * whose startup then finds what the mount left */
	bool keeper_succeeds;   /* its keeper becomes the successor ferryd itself */
	/* Of the serving context. */
	int (*init)(struct serve_ctx *ctx, void **mode_ctx);
	void (*fini)(void *mode_ctx);
	void (*startup)(struct serve_ctx *ctx, void *mode_ctx);
	void (*takeover_device)(struct serve_ctx *ctx, void *mode_ctx, int fd);
	int (*probe)(void *mode_ctx, const struct ctl_mount_req *req, char *why, size_t len);
	/* Of a mount. */
	int (*start)(struct fmount *m, void **state, char *why, size_t whylen);
	int (*serve)(void *state);
	void (*stop)(void *state);
	void (*live)(void *state);
	void (*close)(void *state, int ret);
	void (*quiesce)(void *state);
	void (*stats)(void *state, struct ctl_mount_stats *s);
	int (*evicting)(void *state);
};

/* The table (mode.c, which also says auto's order of preference). */
#define SERVE_NR_MODES 3
extern const struct serve_mode *const serve_modes[SERVE_NR_MODES];
/* @mode's place in the table: its slot for per-mode state and counters. */
unsigned int serve_mode_slot(const struct serve_mode *mode);
/* @mode's own state in @ctx (its init made it), or NULL. */
void *mode_state(const struct serve_ctx *ctx, const struct serve_mode *mode);

/*
 * The mode @req names, or NULL. "auto" is the first, in its order, that
 * can serve it (probe); @why (len bytes) then says which was chosen and why
 * the ones before were not.
 */
const struct serve_mode *serve_mode_pick(const struct serve_ctx *ctx,
					 const struct ctl_mount_req *req, char *why,
					 size_t len);
/* The modes' names, ", "-separated, "auto" last, for error messages. */
void serve_mode_names(char *buf, size_t len);

/*
 * mounts.c, for the modes. mount_ready: the kernel serves @m now.
 * mount_detach: detach (MNT_DETACH) our mount if it is still what sits on
 * its mount point, never whatever else is mounted there by now.
 * mount_bytes: the image's size, bootstrap plus uncompressed blobs.
 */
void mount_ready(struct fmount *m);
void mount_detach(const struct fmount *m);
uint64_t mount_bytes(const struct fmount *m);

#endif
