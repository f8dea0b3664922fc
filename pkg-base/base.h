/* SPDX-License-Identifier: MIT */
/*
 * pkg-base: the helpers every ferry module shares, each written once —
 * little-endian accessors for on-disk structs, leveled logging, full-length
 * I/O, whole small files, mkdir -p and atomic file writes, lexical path
 * normalisation, sha256, base64, hex and digest strings, bounded JSON
 * reads and builders, unix sockets carrying JSON lines, and a TTY progress
 * line. Nothing here knows about EROFS, blobs, tar or registries.
 *
 * Thread-safety: logging and the I/O helpers are safe from any thread;
 * a struct ferry_progress belongs to one thread.
 */
#ifndef FERRY_BASE_H
#define FERRY_BASE_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>

/* Corrupt on-disk or on-wire data, distinct from an I/O error (as in fs/erofs). */
#define EFSCORRUPTED EUCLEAN

#include <limits.h>

/*
 * ferry's release, for --version and the registry User-Agent: the Makefile
 * passes it from the top-level VERSION file, its one source.
 */
#ifndef FERRY_VERSION
#error "FERRY_VERSION is passed by the Makefile (-DFERRY_VERSION from VERSION)"
#endif

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define DIV_ROUND_UP(n, d) (((n) + (d) - 1) / (d))
#define ROUND_UP(x, a) (DIV_ROUND_UP(x, a) * (a))
#define ROUND_DOWN(x, a) ((x) / (a) * (a))
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))

/* Little-endian field access on byte buffers: no alignment assumptions. */
static inline uint16_t get_le16(const void *p)
{
	const uint8_t *b = p;
	return (uint16_t)(b[0] | b[1] << 8);
}

static inline uint32_t get_le32(const void *p)
{
	const uint8_t *b = p;
	return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
	       (uint32_t)b[3] << 24;
}

static inline uint64_t get_le64(const void *p)
{
	const uint8_t *b = p;
	return (uint64_t)get_le32(b) | (uint64_t)get_le32(b + 4) << 32;
}

static inline void put_le16(void *p, uint16_t v)
{
	uint8_t *b = p;
	b[0] = (uint8_t)v;
	b[1] = (uint8_t)(v >> 8);
}

static inline void put_le32(void *p, uint32_t v)
{
	uint8_t *b = p;
	b[0] = (uint8_t)v;
	b[1] = (uint8_t)(v >> 8);
	b[2] = (uint8_t)(v >> 16);
	b[3] = (uint8_t)(v >> 24);
}

static inline void put_le64(void *p, uint64_t v)
{
	put_le32(p, (uint32_t)v);
	put_le32((uint8_t *)p + 4, (uint32_t)(v >> 32));
}

/* Logging: messages go to stderr as "ferry: <level>: <text>". */
enum ferry_log_level {
	FERRY_LOG_ERR = 0,
	FERRY_LOG_WARN = 1,
	FERRY_LOG_INFO = 2,
	FERRY_LOG_DEBUG = 3,
};

extern int ferry_log_level; /* messages above this level are dropped */

void ferry_log(int level, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

#define ferry_err(...) ferry_log(FERRY_LOG_ERR, __VA_ARGS__)
#define ferry_warn(...) ferry_log(FERRY_LOG_WARN, __VA_ARGS__)
#define ferry_info(...) ferry_log(FERRY_LOG_INFO, __VA_ARGS__)
#define ferry_dbg(...) ferry_log(FERRY_LOG_DEBUG, __VA_ARGS__)

/*
 * The daemons' log (log.c: ferryd, its keepers): stderr becomes a line
 * buffered stream that writes to descriptor 2, each line stamped with the
 * time and pid when @timestamps (a log file), and prefixed with its syslog
 * priority when descriptor 2 is systemd's journal (JOURNAL_STREAM). A
 * thread may capture the error lines it logs meanwhile (without their
 * "ferry: error: "), so that a failed request answers with the reason that
 * was logged. 0 or -errno.
 */
int ferry_log_stream(bool timestamps);
struct ferry_log_capture {
	struct ferry_log_capture *prev;
	char text[4096]; /* "; "-joined */
	size_t len;
	bool partial;    /* inside an error line */
	bool skipping;   /* inside another line */
};
void ferry_log_capture_begin(struct ferry_log_capture *c);
void ferry_log_capture_end(struct ferry_log_capture *c);

/* strerror() for negative errnos, with EFSCORRUPTED spelled out. */
const char *ferry_strerror(int negative_errno);

/*
 * Full-length I/O. Each returns 0 when all @len bytes moved, -EIO on a
 * short read (unexpected end of file), or a negative errno.
 */
int read_full(int fd, void *buf, size_t len);
int pread_full(int fd, void *buf, size_t len, uint64_t off);
/*
 * Read the whole regular file @path, at most @max bytes (else -EFBIG; not a
 * regular file, a FIFO or a device included: -EINVAL, without waiting or
 * reading), into a malloc'ed buffer with a NUL after the last byte. 0 or
 * -errno; no log. read_file_nofollow also refuses a symbolic link as
 * @path's last component (-ELOOP): for files inside images, layouts and
 * caches, which must not lead elsewhere.
 */
int read_file_max(const char *path, size_t max, char **data, size_t *len);
int read_file_nofollow(const char *path, size_t max, char **data, size_t *len);

/* OCI digests: "sha256:<64 lowercase hex>" and its 32 bytes. */
#define DIGEST_STRING_SIZE 72 /* with the NUL */
void digest_format(const uint8_t d[32], char out[DIGEST_STRING_SIZE]);
/* -EINVAL unless @s is exactly that form. */
int digest_parse(const char *s, uint8_t out[32]);

/* ------------------------------------------------------------------ */
/* JSON (json.c, json-c)                                               */
/* ------------------------------------------------------------------ */

struct json_object;
/*
 * @len bytes of untrusted @text as one JSON object, nested 32 deep at most,
 * blanks after it and nothing else: 0 and *@out, -ENOMEM or -EPROTO.
 */
int json_parse_object(const char *text, size_t len, struct json_object **out);
/*
 * The JSON object in the file @path (read_file_nofollow, at most @max
 * bytes, then json_parse_object): 0 and *@out, or its -errno (-ENOENT,
 * -ELOOP, -EINVAL, -EFBIG, -EPROTO, ...); no log.
 */
int json_read_file(const char *path, size_t max, struct json_object **out);
/* What json_read_file's error @ret says of a file, for a message. */
const char *json_read_file_error(int ret);

/* The string member @key of the JSON object @o, or NULL. */
const char *json_get_string(struct json_object *o, const char *key);

/*
 * Bounded, typed reads of untrusted JSON. Each returns 0, or -EINVAL with
 * a message naming @key in @err (@errlen bytes); an absent (or null)
 * optional member leaves *@out as it is. Strings are at most @max bytes
 * and hold no NUL; they are borrowed from @o.
 */
__attribute__((format(printf, 3, 4)))
int json_bad(char *err, size_t errlen, const char *fmt, ...); /* -EINVAL */
/* The member @key, or NULL when absent or null. */
struct json_object *json_field(struct json_object *o, const char *key);
/* @v as a string of at most @max bytes without NULs, or NULL. */
const char *json_str_val(struct json_object *v, size_t max);
int json_read_str(struct json_object *o, const char *key, size_t max,
		  bool required, const char **out, char *err, size_t errlen);
/* A required absolute path of at most PATH_MAX - 1 bytes. */
int json_read_abspath(struct json_object *o, const char *key, const char **out,
		      char *err, size_t errlen);
/* A required string copied into @buf of @size bytes. */
int json_read_copy(struct json_object *o, const char *key, char *buf,
		   size_t size, char *err, size_t errlen);
/* A required string, malloc'ed (-ENOMEM possible). */
int json_read_strdup(struct json_object *o, const char *key, size_t max,
		     char **out, char *err, size_t errlen);
int json_read_s64(struct json_object *o, const char *key, int64_t min,
		  int64_t max, int64_t *out, char *err, size_t errlen);
int json_read_u64(struct json_object *o, const char *key, uint64_t max,
		  uint64_t *out, char *err, size_t errlen);
int json_read_bool(struct json_object *o, const char *key, bool *out,
		   char *err, size_t errlen);
/*
 * An array of at most @max_items non-empty strings of at most @max_len
 * bytes: *@out is malloc'ed and NULL-terminated, also when @key is absent
 * (then *@nr is left alone); free it on error too.
 */
int json_read_strs(struct json_object *o, const char *key, size_t max_items,
		   size_t max_len, const char ***out, size_t *nr, char *err,
		   size_t errlen);
/* An object member, or NULL when absent. */
int json_read_object(struct json_object *o, const char *key,
		     struct json_object **out, char *err, size_t errlen);

/*
 * Building: json_add puts @v (NULL after a failed allocation) under @key
 * and is false when it could not (then @v is put); json_add_str adds
 * nothing for a NULL @s; json_str_array makes an array of @n strings (n
 * SIZE_MAX: up to the NULL ending @list) or NULL; json_digest_array one
 * of @n sha256 digests as "sha256:<hex>" strings, or NULL; json_done
 * returns @o, or puts it and returns NULL when !@ok.
 */
bool json_add(struct json_object *o, const char *key, struct json_object *v);
bool json_add_str(struct json_object *o, const char *key, const char *s);
struct json_object *json_str_array(const char *const *list, size_t n);
struct json_object *json_digest_array(const uint8_t (*d)[32], size_t n);
struct json_object *json_done(struct json_object *o, bool ok);
int write_full(int fd, const void *buf, size_t len);
int pwrite_full(int fd, const void *buf, size_t len, uint64_t off);

/*
 * Make room for at least @need elements of @elem_size bytes in the array
 * *@arr of capacity *@cap, doubling (from @min_cap). 0 or -ENOMEM (the
 * array is unchanged then).
 */
int array_reserve(void *arr, size_t *cap, size_t need, size_t elem_size,
		  size_t min_cap);

/* Lowercase hex of @len bytes into @out (2 * len + 1 bytes, NUL-terminated). */
void hex_encode(const uint8_t *in, size_t len, char *out);
/* Parse exactly 2 * len hex digits; returns 0 or -EINVAL. */
int hex_decode(const char *in, uint8_t *out, size_t len);
/* The value of hex digit @c (either case), or -1. */
int hex_digit(char c);
/* The @len characters at @s are lowercase hex digits (as hex_encode writes). */
bool hex_is_lower(const char *s, size_t len);

/* Parse "123", "4K", "1M", "1G" (binary units); -EINVAL on junk or overflow. */
int parse_size(const char *s, uint64_t *out);

/*
 * Progress line on stderr, redrawn at most ~10 times a second, only when
 * stderr is a TTY and ferry_progress_enabled is set: what, bytes done (of
 * the total, with a percentage), the rate and the time left, in sizes of
 * human units and digests cut to 12 hex digits, narrower than the
 * terminal and than 80 columns.
 */
extern bool ferry_progress_enabled;

struct ferry_progress {
	const char *what;
	uint64_t total; /* 0 when unknown */
	uint64_t done;
	uint64_t start_ns;
	uint64_t last_draw_ns;
	bool drawn;
};

void ferry_progress_begin(struct ferry_progress *p, const char *what,
			  uint64_t total);
void ferry_progress_add(struct ferry_progress *p, uint64_t n);
void ferry_progress_end(struct ferry_progress *p);

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t ferry_now_ns(void);
struct timespec;
/* @ts = @ms from now on CLOCK_REALTIME, as pthread_cond_timedwait wants. */
void ferry_deadline_ts(struct timespec *ts, unsigned int ms);
/* Online CPUs, between 1 and @max: the default count of worker threads. */
unsigned int online_cpus(unsigned int max);

/* True when all @len bytes at @p are zero. */
bool mem_is_zero(const void *p, size_t len);

/* ------------------------------------------------------------------ */
/* sha256 (sha256.c, OpenSSL EVP; aborts only if OpenSSL is broken)    */
/* ------------------------------------------------------------------ */

#define SHA256_SIZE 32u

void sha256_buf(const void *data, size_t len, uint8_t out[SHA256_SIZE]);

struct sha256_hasher;
int sha256_hasher_new(struct sha256_hasher **out); /* 0 or -ENOMEM */
void sha256_hasher_update(struct sha256_hasher *h, const void *data, size_t len);
void sha256_hasher_final(struct sha256_hasher *h, uint8_t out[SHA256_SIZE]);
void sha256_hasher_free(struct sha256_hasher *h);

/* ------------------------------------------------------------------ */
/* base64 (base64.c, RFC 4648 standard alphabet)                       */
/* ------------------------------------------------------------------ */

/*
 * Decode @len characters into @out (at most @cap bytes; len / 4 * 3 + 2
 * always suffice). '=' padding is optional but, when present, must
 * complete the last quad. 0 and *@out_len, -EINVAL on any other
 * character or a length no encoder writes, -ENOSPC when @cap is short.
 * Scratch buffers are wiped (the text may be a credential).
 */
int base64_decode(const char *in, size_t len, uint8_t *out, size_t cap,
		  size_t *out_len);
/* The padded encoding of @len bytes, malloc'ed and NUL-terminated. */
int base64_encode(const void *in, size_t len, char **out);

/* ------------------------------------------------------------------ */
/* Directories and atomic files (fs.c)                                 */
/* ------------------------------------------------------------------ */

/* mkdir -p with @mode for what it creates: 0 or -errno, logged. */
int mkdir_p(const char *path, mode_t mode);
/* fsync the directory @path (a rename or unlink in it made durable): 0 or -errno, logged. */
int fsync_dir(const char *path);

/*
 * A file that appears whole or not at all. atomic_file_create makes
 * @dir/.tmp-@name.PID.N with O_EXCL (never following or reusing an
 * existing name) and opens it read-write in af->fd; atomic_file_commit
 * fsyncs it, renames it to @dir/@name (which may differ from the name
 * given at creation, e.g. a digest known only at the end) and fsyncs the
 * directory; atomic_file_discard removes it (nothing after a commit;
 * safe to call twice). Temporary names start with ATOMIC_TMP_PREFIX so
 * that leftovers of a crash can be recognised and reclaimed. Errors are
 * 0 or -errno, logged naming the file. A caller that checks the file
 * whenever it reads it (a copy lost or torn by a crash is made again)
 * sets af->unsynced after the create: the commit then only renames.
 */
#define ATOMIC_TMP_PREFIX ".tmp-"
struct atomic_file {
	int fd;
	int dir_fd;
	bool unsynced;
	const char *dir; /* borrowed, for messages */
	char tmp[NAME_MAX + 1];
};
int atomic_file_create(struct atomic_file *af, const char *dir,
		       const char *name, mode_t mode);
int atomic_file_commit(struct atomic_file *af, const char *name);
void atomic_file_discard(struct atomic_file *af);
/* @dir/@name := @data, atomically as above. */
int write_file_atomic(const char *dir, const char *name, const void *data,
		      size_t len, mode_t mode);

/*
 * A process holding @path open (its /proc/PID/fd links): its pid, its
 * command name in @comm ("?" if none), or 0 when none is seen (processes
 * of other users need root to be seen).
 */
int proc_holder(const char *path, char *comm, size_t len);

/* ------------------------------------------------------------------ */
/* Path strings (path.c): lexical, no file system access               */
/* ------------------------------------------------------------------ */

/*
 * Normalise a relative path in place to "a/b/c": a leading '/', "." and
 * empty components are dropped ("" is the root). -EINVAL if it has "..",
 * which a path inside an image or archive may never climb out through.
 */
int path_normalize(char *path);
/*
 * @path made absolute against the working directory, "." and ".." and
 * repeated '/' resolved without following symlinks (malloc'ed into *@out).
 * -EINVAL for "", else 0 or -errno.
 */
int path_absolute(const char *path, char **out);
/*
 * A mount point's canonical path: realpath, or for a path that cannot be
 * resolved (a dead FUSE mount answers ENOTCONN) the realpath of its
 * directory plus its last component.
 */
int path_mountpoint(const char *path, char **out);

/*
 * Mount points named by their canonical path (mountpoint.c), resolved
 * again without following any symbolic link (openat2 RESOLVE_NO_SYMLINKS):
 * a component swapped for a link since the path was checked fails with
 * ELOOP instead of leading the mount elsewhere. open_dir_nofollow gives
 * an O_PATH descriptor of the directory (or -errno); mount_nofollow and
 * umount_nofollow are mount(2) and umount2(2) through it (umount: through
 * the parent's, the last component not followed), returning as they do
 * (0, or -1 and errno).
 */
int open_dir_nofollow(const char *path);
int mount_nofollow(const char *source, const char *target, const char *fstype,
		   unsigned long flags, const void *data);
int umount_nofollow(const char *target, int flags);

/*
 * The file system mounted on top of the absolute path @mountpoint, from
 * /proc/self/mountinfo (mountinfo.c; no access to the mount itself, so a
 * dead FUSE mount cannot block): 0, or -ENOENT when nothing is mounted there.
 */
struct mount_entry {
	unsigned int major, minor;
	char fstype[64];
	char source[1024];
};
int mountinfo_find(const char *mountpoint, struct mount_entry *out);
/* 1 when the mount @mount_id (statx's stx_mnt_id) is on @mountpoint, 0 when not, or -errno. */
int mountinfo_has(uint64_t mount_id, const char *mountpoint);

/* ------------------------------------------------------------------ */
/* Local sockets and JSON lines (jsonl.c)                              */
/* ------------------------------------------------------------------ */

/*
 * A stream socket at @path: connected (-ENOENT / -ECONNREFUSED when no one
 * listens there), or bound mode 0600 and listening (non-blocking; a file
 * left at @path is replaced, so hold a lock first) with the socket file's
 * inode in *@ino. Both CLOEXEC; 0 or -errno.
 */
int unix_connect(const char *path, int *fd);
int unix_listen(const char *path, int *fd, ino_t *ino);

/* Write @msg as one line of at most @max bytes (-EMSGSIZE), no SIGPIPE. */
int jsonl_send(int fd, struct json_object *msg, size_t max);
/* The same, passing the descriptor @pass along (SCM_RIGHTS) unless < 0. */
int jsonl_send_fd(int fd, struct json_object *msg, size_t max, int pass);

/* Buffered reader of lines of at most @max bytes from a socket. */
struct jsonl_reader {
	int fd;
	int passed; /* a descriptor the peer passed (SCM_RIGHTS), or -1 */
	char *buf;
	size_t len, cap, max;
};
void jsonl_reader_init(struct jsonl_reader *r, int fd, size_t max);
void jsonl_reader_free(struct jsonl_reader *r);
/*
 * The next line as a JSON object (json_parse_object): 0 and *@out, 1 at a
 * clean EOF, or -ETIMEDOUT (nothing for @timeout_ms; < 0 waits forever),
 * -EMSGSIZE (line too long), -EPROTO (not one JSON object), -errno. A last
 * line without its newline counts.
 */
int jsonl_recv(struct jsonl_reader *r, int timeout_ms, struct json_object **out);
/*
 * The descriptor the peer passed with what was read so far (the caller's
 * now, CLOEXEC), or -1. One not taken is closed by jsonl_reader_free.
 */
int jsonl_take_fd(struct jsonl_reader *r);

#endif
