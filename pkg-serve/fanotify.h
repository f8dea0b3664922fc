/* SPDX-License-Identifier: MIT */
/*
 * Fanotify mode of ferryd (fanotify.c, the serving side: fanotify_mode,
 * mode.h; ferryd-keeper, the process that keeps the group open; fanfill.c,
 * what both need of an event) and the kernel
 * constants that Debian 12's <linux/fanotify.h> predates (pre-content
 * events, Linux 6.14; values from the kernel's uapi header).
 */
#ifndef FERRY_SERVE_FANOTIFY_H
#define FERRY_SERVE_FANOTIFY_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/fanotify.h>
#include <sys/types.h>

#ifndef FAN_PRE_ACCESS
#define FAN_PRE_ACCESS 0x00100000
#endif
#ifndef FAN_EVENT_INFO_TYPE_RANGE
#define FAN_EVENT_INFO_TYPE_RANGE 6
/* The range an event covers: offset and count in bytes of the file. */
struct fanotify_event_info_range {
	struct fanotify_event_info_header hdr;
	uint32_t pad;
	uint64_t offset;
	uint64_t count;
};
#endif
#ifndef FAN_DENY_ERRNO
/* Deny with an errno for the reader (pre-content groups only). */
#define FAN_DENY_ERRNO(err) (FAN_DENY | ((((uint32_t)(err)) & 0xff) << 24))
#endif
_Static_assert(sizeof(struct fanotify_event_info_range) == 24,
	       "fanotify range record is 24 bytes");

/*
 * ferry's binaries: this process's own and the ferryd and ferry next to
 * it (fanfill.c). A fill — a write
 * into a data file by another ferry process, through a descriptor that
 * sees events because a mount marked the file before it was opened —
 * holds the chunks' map lock that our own fill of the range would wait
 * for, so it is allowed at once. Readers are never exempt: a read of a
 * hole allowed through the mount would leave zeros in the page cache.
 */
#define FERRY_EXES 3
struct ferry_exes {
	dev_t dev[FERRY_EXES];
	ino_t ino[FERRY_EXES];
};
void ferry_exes_find(struct ferry_exes *e);
/*
 * Process @pid is one of ferry's fill processes for the data file of
 * event descriptor @fd: it runs a binary of @e, every uid is root, and it
 * holds that very file open for writing (only root can: the token a plain
 * reader lacks, whatever binary it runs; a read through the mount holds
 * no descriptor of the data file).
 */
bool fan_fill_process(const struct ferry_exes *e, pid_t pid, int fd);

/* The RANGE record of event @meta: 0 and the range, or -ENOENT. */
int fan_event_range(const struct fanotify_event_metadata *meta, uint64_t *off,
		    uint64_t *count);
/*
 * The bytes of a file of @size that event @meta asks for: its RANGE
 * record, or without one the whole file (a truncate, say); within @size.
 */
void fan_event_span(const struct fanotify_event_metadata *meta, uint64_t size,
		    uint64_t *off, uint64_t *len);

#endif
