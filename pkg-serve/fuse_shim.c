// SPDX-License-Identifier: MIT
/*
 * The two steps of a FUSE takeover that libfuse 3.14 has no API for
 * (fuse.c, fs_takeover). A successor ferryd gets a live /dev/fuse descriptor
 * from the mount's keeper and builds a libfuse session on it
 * (fuse_session_mount with "/dev/fd/N": libfuse uses the descriptor and
 * mounts nothing). Then:
 *
 * 1. The kernel sent FUSE_INIT once, to the dead ferryd, and never again,
 *    but libfuse answers every request with EIO until it has seen one. So
 *    the session is fed an INIT built here (fuse_session_process_buf):
 *    protocol 7.FUSE_KERNEL_MINOR_VERSION of the uapi header we build
 *    with and the init flags of the capabilities fuse.c's fs_init asks
 *    for, which every kernel with FUSE_NOTIFY_RESEND (6.9+) offers, so
 *    the session's state (capabilities, max_write) comes out as it did
 *    for the kernel's INIT. libfuse writes its reply to the kernel, which
 *    finds no request with that unique and fails the write with ENOENT;
 *    libfuse ignores ENOENT on replies (an interrupted request). The
 *    unique is one the kernel never hands out (even, below the resend bit,
 *    above any counter).
 *
 * 2. Requests the dead ferryd had read but not answered sit in the
 *    connection's processing queue (the keeper's descriptor is the same
 *    open file, so nothing was aborted; clone_fd descriptors are not used
 *    because closing one fails its requests with ECONNABORTED).
 *    FUSE_NOTIFY_RESEND (Linux 6.9+, notify code 7: a notification with
 *    no payload) moves them back to the pending queue, their unique with
 *    bit 63 set, and the new session answers them. Older kernels refuse
 *    the code (EINVAL): those requests stay unanswered and their callers
 *    wait until killed or the mount is gone; requests made after the
 *    takeover are served.
 */
#include <errno.h>
#include <string.h>
#include <unistd.h>
#include <linux/fuse.h>

#include "fusefs.h"

#ifndef FUSE_NOTIFY_RESEND
#define FUSE_NOTIFY_RESEND 7 /* Linux 6.9; the uapi header may be older */
#endif
#define SHIM_INIT_UNIQUE (1ull << 62)

size_t fuse_shim_init(void *buf, size_t len)
{
	struct {
		struct fuse_in_header h;
		struct fuse_init_in in;
	} msg;

	_Static_assert(sizeof(msg) == 40 + 64, "FUSE_INIT request layout");
	if (len < sizeof(msg))
		return 0;
	memset(&msg, 0, sizeof(msg));
	msg.h.len = sizeof(msg);
	msg.h.opcode = FUSE_INIT;
	msg.h.unique = SHIM_INIT_UNIQUE;
	msg.in.major = FUSE_KERNEL_VERSION;
	msg.in.minor = FUSE_KERNEL_MINOR_VERSION;
	msg.in.max_readahead = 128u << 10;
	msg.in.flags = FUSE_ASYNC_READ | FUSE_BIG_WRITES | FUSE_SPLICE_WRITE |
		       FUSE_SPLICE_MOVE | FUSE_SPLICE_READ | FUSE_DO_READDIRPLUS |
		       FUSE_READDIRPLUS_AUTO | FUSE_PARALLEL_DIROPS | FUSE_POSIX_ACL |
		       FUSE_NO_OPEN_SUPPORT | FUSE_NO_OPENDIR_SUPPORT |
		       FUSE_CACHE_SYMLINKS | FUSE_MAX_PAGES;
	memcpy(buf, &msg, sizeof(msg));
	return sizeof(msg);
}

int fuse_shim_resend(int fd)
{
	struct fuse_out_header h = {
		.len = sizeof(h),
		.error = FUSE_NOTIFY_RESEND,
		.unique = 0, /* a notification */
	};

	return write(fd, &h, sizeof(h)) == (ssize_t)sizeof(h) ? 0 : -errno;
}
