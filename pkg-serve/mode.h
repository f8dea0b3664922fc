/* SPDX-License-Identifier: MIT */
/*
 * Serving modes. A mode is how the kernel reaches a mount's data: "fuse"
 * (fuse.c: ferryd answers FUSE requests), "fanotify" (fanotify.c:
 * kernel EROFS over the chunk cache's files, filled on fanotify events)
 * or "cachefiles" (cachefiles.c: kernel EROFS over fscache, its cache
 * files filled on /dev/cachefiles requests).
 * mounts.c drives every mode through this table alike and never looks
 * inside a mode's state; a new mode implements these ops and adds itself
 * to the table in mode.c.
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
 *          m->req.adopt (cachefiles failover: ferryd's successor) the
 *          mount is on m->mountpoint already: take it over, no mount(2).
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
 * Not of a mount (optional): startup, once ferryd listens and before it
 * serves a request: what a successor must take before its takeovers
 * open descriptors. quiesce_early: on ferryd's exit for an upgrade,
 * quiesce before the successor starts, so that its startup finds what
 * the mount left (fanotify: the journal of reads in flight).
 *
 * mounts.c calls stop, live, stats and evicting only while @state exists (it
 * serialises them with close); the prefetch thread needs no mode.
 */
#ifndef FERRYD_MODE_H
#define FERRYD_MODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct fmount;
struct ctl_mount_req;
struct ctl_mount_stats;

/* ferryd's options that modes apply. */
struct serve_opts {
	unsigned int threads;          /* FUSE worker threads per mount */
	unsigned int readahead_kb;     /* a FUSE mount's bdi; 0: the kernel's */
	unsigned int dir_readahead_kb; /* FUSE directory readahead; 0: off */
	const char *socket_path;       /* ferryd's control socket */
	const char *const *successor_args; /* a cachefiles successor's options */
};

struct serve_mode {
	const char *name;   /* the request's and the list's "mode" */
	const char *fstype; /* our mount in /proc/self/mountinfo */
	int (*start)(struct fmount *m, const struct serve_opts *o, void **state,
		     char *why, size_t whylen);
	int (*serve)(void *state);
	void (*stop)(void *state);
	void (*live)(void *state);
	void (*close)(void *state, int ret);
	/* Optional: make serve return soon without ending the mount or its
	 * keeper (mounts_quiesce), no request left half taken. */
	void (*quiesce)(void *state);
	bool quiesce_early;
	void (*stats)(void *state, struct ctl_mount_stats *s);
	int (*evicting)(void *state);
	int (*probe)(const struct ctl_mount_req *req, char *why, size_t len);
	void (*startup)(const struct serve_opts *o);
};

extern const struct serve_mode fuse_mode, fanotify_mode, cachefiles_mode;

/*
 * The mode @req names, or NULL. "auto" is the first that can serve it
 * (probe) of fanotify, cachefiles and fuse; @why (len bytes) then says
 * which was chosen and why the ones before were not.
 */
const struct serve_mode *serve_mode_pick(const struct ctl_mount_req *req, char *why,
					 size_t len);
/* The modes' names, ", "-separated, for error messages. */
void serve_mode_names(char *buf, size_t len);
/* Every mode's startup op (see the top). */
void serve_modes_startup(const struct serve_opts *o);

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
