/* SPDX-License-Identifier: MIT */
/*
 * The control protocol between ferry (the CLI) and ferryd (the lazy-mount
 * daemon), compiled into both binaries; the client side (connecting,
 * starting ferryd) is ctl_client.c, in ferry only.
 *
 * Transport: a unix stream socket (default /run/ferry/ferryd.sock, mode
 * 0600). Each request is one JSON object on one line; ferryd answers each
 * with one JSON object on one line, then reads the next request of the
 * same connection until EOF. Requests ("op"), each a struct below with
 * one encoder (*_to_json) and one parser (*_parse):
 *
 *   {"op":"mount","image":REF,"mountpoint":ABS,"cacheDir":ABS,
 *    "mode":MODE (a short lowercase token, default "fuse"; ferryd knows
 *                 fuse, fanotify, cachefiles and auto: the first of
 *                 fanotify, cachefiles, fuse this host supports),
 *    "domain":S (cachefiles: the EROFS domain whose mounts share blobs,
 *                at most 64 bytes, checked by the kernel mount; absent:
 *                none),
 *    "prefetchFiles":[PATH...],"prefetchAll":BOOL,"prefetchBwlimit":N,
 *    "cacheMaxSize":N (bytes; absent or 0: ferryd's --cache-max-size),
 *    "cacheMinFree":N (0..99 %; absent: ferryd's --cache-min-free)
 *                (the limits of cacheDir from then on, for every mount),
 *    "suid":BOOL,"dev":BOOL (honour setuid bits / device nodes; default
 *                 false: mounted nosuid,nodev),
 *    "record":ABS (fuse: append each file read for the first time to
 *                 this prefetch list; absent: none),
 *    "fetch":{"creds":S,"authfile":S,"tlsVerify":BOOL,"caFile":S,
 *             "insecure":[S...],"hosts":[HOST...] (ctl_hosts_parse),
 *             "resolve":[S...],
 *             "retries":N,"stallTimeoutMs":N,
 *             "requestTimeoutMs":N}}                (ctl_fetch_opts[])
 *    "imageDigest":D (serve this manifest only), "indexDigest":D (an
 *                 ordinary image: through this ferry index, read by
 *                 digest, the cache's copy first),
 *       answered once the mount is live
 *       → {"ok":true,"pid":N,"imageDigest":D,"bootstrapDigest":D}
 *         (ctl_mount_reply: the digests of what is mounted, each checked:
 *         the manifest's (the bootstrap's for dir:), the raw bootstrap's,
 *         absent for native EROFS layers)
 *   {"op":"probe", and the fields of a mount but "mountpoint"}: open the
 *       image as a mount would, its config too, and mount nothing
 *       → {"ok":true,"imageDigest":D,"bootstrapDigest":D,
 *          "indexDigest":D,"layers":[D...],"diffIds":[D...]}
 *         (ctl_probe_reply; the last three for an indexed image only,
 *         its diff_ids checked against its config's; an ordinary image
 *         without an index: EMEDIUMTYPE)
 *   {"op":"umount","mountpoint":ABS,"lazy":BOOL,
 *    "release":BOOL (then forget the image's record in its cache, so
 *                    that gc may reclaim its blobs, unless another mount
 *                    of this ferryd serves that image from that cache)}
 *       answered once the mount is torn down (a few seconds at most)
 *       → {"ok":true}
 *   {"op":"list"}  → {"ok":true,"pid":N,"version":S,"socket":S,"mounts":
 *       [{"mountpoint","image","cacheDir","mode","keeperPid" (fanotify,
 *         cachefiles),
 *         "suid","dev","domain" (when mounted in one), "modeReason" (mode
 *         auto: the mode chosen and why the ones before it were not),
 *         "state","mountedAt","bytesRead",
 *         "bytesFetched","bytesPrefetched","chunksPresent","chunksTotal",
 *         "bytesPresent","bytesEvicted","prefetch","prefetchFiles",
 *         "readaheadFiles","readaheadBytes","prefetchSeconds","cacheHits",
 *         "cacheMisses",
 *         "fetchErrors","inFlight","missNanoseconds","missLatencyMs":[N x 12] (per
 *         bucket of IMAGE_LATENCY_BOUNDS_MS, the last one unbounded),
 *         "registryRequests","registryRetries","fetches","fetchesAhead",
 *         "bytesAhead","programsRecorded","programsRead","modulesRead"}],
 *       and the ping fields}                      (ctl_list_reply)
 *   {"op":"ping"}  → {"ok":true,"pid":N,"version":S,"socket":S,
 *       "startedAt":UNIX,"rssBytes":N,"peakRssBytes":N,
 *       "idleTimeout":SECONDS (0: persistent),"socketActivated":BOOL}
 *   {"op":"shutdown"} (as SIGTERM) → {"ok":true}
 *   {"op":"metrics"} → {"ok":true,"text":S}  (Prometheus text format 0.0.4)
 *
 * Answers: {"ok":true,...} or {"ok":false,"error":MESSAGE,"errno":N} where
 * MESSAGE names the image / mount point and the reason and N is the
 * positive errno (ENOENT from umount: that mount point is not ferryd's)
 * (struct ctl_reply). Unknown fields are ignored; a field of the wrong
 * type, out of range or too long fails the request (-EINVAL, saying
 * which), as does a missing required one.
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
#include "../pkg-image/image.h"

#define CTL_DEFAULT_SOCKET "/run/ferry/ferryd.sock"
#define CTL_SOCKET_ENV "FERRYD_SOCKET"
#define CTL_LINE_MAX (16u << 20)      /* longest request or answer line */
#define CTL_PREFETCH_FILES_MAX IMAGE_PREFETCH_MAX_PATHS
#define CTL_HOSTS_MAX 64u             /* entries of a fetch string list */
#define CTL_TOKEN_MAX 16u             /* mode, state, prefetch names */
#define CTL_MSG_MAX 4096u             /* an error answer's message */
#define CTL_REASON_MAX 1024u          /* why "auto" chose a mode */
#define CTL_MOUNTS_MAX 65536u         /* entries of a list answer */

/* $FERRYD_SOCKET, else CTL_DEFAULT_SOCKET. */
const char *ctl_default_socket(void);

/*
 * One request on a new connection to @socket_path; *@resp is the answer
 * (the caller puts it). Transport errors as for unix_connect / jsonl_recv.
 */
int ctl_call(const char *socket_path, struct json_object *req, int timeout_ms,
	     struct json_object **resp);

/* ------------------------------------------------------------------ */
/* Registry options                                                    */
/* ------------------------------------------------------------------ */

enum ctl_opt_type {
	CTL_OPT_STR,  /* const char *, NULL when unset */
	CTL_OPT_BOOL, /* bool */
	CTL_OPT_UINT, /* unsigned int */
	CTL_OPT_STRS, /* const char *const *, NULL-terminated */
	CTL_OPT_HOSTS, /* const struct fetch_host *const *, NULL-terminated */
};

/*
 * One field of struct fetch_opts that a mount request carries: the
 * encoder and the parser of "fetch" know nothing else, and the unit test
 * checks this table against ferry's REGISTRY_LONGOPTS, so an option is
 * carried as soon as it has a row. Not carried: connect_timeout_ms (no
 * option sets it) and user_agent (ferryd's own).
 */
struct ctl_fetch_opt {
	const char *key;        /* in the request's "fetch" object */
	const char *option;     /* ferry's long option that sets it */
	enum ctl_opt_type type;
	size_t offset;          /* of the field in struct fetch_opts */
	unsigned int max;       /* UINT: largest value; else longest string */
	unsigned int max_items; /* STRS: most entries */
};
#define CTL_NR_FETCH_OPTS 10
extern const struct ctl_fetch_opt ctl_fetch_opts[CTL_NR_FETCH_OPTS];

/*
 * fetch_opts.hosts as JSON (the "hosts" of a request's "fetch", and the
 * file of ferry's --registry-hosts): an array of at most CTL_HOSTS_MAX
 *   {"registry":"docker.io","url":"https://mirror.example:5000",
 *    "capabilities":["pull","resolve"] (absent: all),"server":BOOL,
 *    "skipVerify":BOOL,"overridePath":BOOL,"ca":[ABS...],
 *    "clientCert":ABS,"clientKey":ABS,"headers":["Name: value"...]}
 * — containerd's hosts.toml, one object per [host."URL"] table (and one
 * with "server":true for its "server"), in the file's order. Parsed hosts
 * borrow their strings from @arr and are checked (fetch_check_host);
 * ctl_hosts_free releases what the parser allocated.
 */
struct json_object *ctl_hosts_to_json(const struct fetch_host *const *hosts);
int ctl_hosts_parse(struct json_object *arr, const struct fetch_host *const **out,
		    char *err, size_t errlen);
void ctl_hosts_free(const struct fetch_host *const *hosts);

/* ------------------------------------------------------------------ */
/* Requests                                                            */
/* ------------------------------------------------------------------ */

enum ctl_op {
	CTL_OP_MOUNT = 1, CTL_OP_UMOUNT, CTL_OP_LIST, CTL_OP_PING, CTL_OP_SHUTDOWN,
	CTL_OP_METRICS, CTL_OP_UPGRADE, CTL_OP_PROBE,
};

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
	const char *mode;          /* serving mode's name; parsed: never NULL */
	const char *domain;        /* cachefiles: EROFS domain_id, or NULL */
	const char *record;        /* fuse: write the files read here, or NULL */
	const char *image_digest;  /* "sha256:<hex>": serve this image only (a
				    * takeover pins the one it was served;
				    * image_open's digest), or NULL */
	const char *index_digest;  /* "sha256:<hex>": image_opts.index_digest */
	bool takeover;             /* ferryd only, never sent: take over the
				    * mount already there (failover) */
	const char *sysfs;         /* a keeper's handover of native layers
				    * (fanotify): the superblock it was told */
	int takeover_fd;           /* with takeover: the mount's kernel descriptor
				    * a keeper passed (fuse: /dev/fuse,
				    * fanotify: the group), the mount's to
				    * close; -1 (cachefiles: the device) */
	uint64_t prefetch_bwlimit; /* bytes per second, 0 = unlimited */
	uint64_t cache_max_size;   /* the cache's limit, 0 = ferryd's */
	int64_t cache_min_free;    /* % of the file system kept free, -1 = ferryd's */
	bool suid, dev;            /* trusted image: no nosuid / nodev */
	struct fetch_opts fetch;   /* parsed: every list non-NULL */
	struct json_object *root;  /* parsed requests only */
};
void ctl_mount_req_init(struct ctl_mount_req *r);
struct json_object *ctl_mount_req_to_json(const struct ctl_mount_req *r);
/* Validate @o: 0, or -EINVAL with a reason in @err. Takes a reference. */
int ctl_mount_req_parse(struct json_object *o, struct ctl_mount_req *r,
			char *err, size_t errlen);
/* Parsed requests (also after a failed parse). */
void ctl_mount_req_free(struct ctl_mount_req *r);

/* An umount request (strings borrowed from the caller / the parsed JSON). */
struct ctl_umount_req {
	const char *mountpoint; /* absolute */
	bool lazy;
	bool release; /* forget the image's record once no mount serves it */
};
struct json_object *ctl_umount_req_to_json(const struct ctl_umount_req *r);
int ctl_umount_req_parse(struct json_object *o, struct ctl_umount_req *r,
			 char *err, size_t errlen);

/* list, ping, shutdown, metrics and upgrade carry nothing but their op. */
struct json_object *ctl_op_req_to_json(enum ctl_op op);

/* Any request, as ferryd receives it. */
struct ctl_request {
	enum ctl_op op;
	struct ctl_mount_req mount;   /* CTL_OP_MOUNT, CTL_OP_PROBE */
	struct ctl_umount_req umount; /* CTL_OP_UMOUNT: borrows from @o */
};
/*
 * Validate @o per its "op": 0, or -EINVAL with a reason in @err (-ENOMEM).
 * ctl_request_free afterwards in either case.
 */
int ctl_request_parse(struct json_object *o, struct ctl_request *req,
		      char *err, size_t errlen);
void ctl_request_free(struct ctl_request *req);

/* ------------------------------------------------------------------ */
/* Answers                                                             */
/* ------------------------------------------------------------------ */

/* Every answer: ok (err 0), or an error with its message. */
struct ctl_reply {
	int err;           /* 0 or -errno */
	const char *error; /* the message when err; borrowed */
};
struct json_object *ctl_reply_to_json(const struct ctl_reply *r);
/*
 * 0 and *@r for a well-formed answer (ok or error), else -EPROTO with the
 * reason in @err; so for the answers below.
 */
int ctl_reply_parse(struct json_object *o, struct ctl_reply *r,
		    char *err, size_t errlen);

/* The ok answers that say more (their parsers want "ok":true). */
struct ctl_mount_reply {
	int pid; /* ferryd's */
	/* "sha256:<hex>" of what is mounted (checked), or "" (not known) */
	char image_digest[DIGEST_STRING_SIZE];
	char bootstrap_digest[DIGEST_STRING_SIZE];
};
struct json_object *ctl_mount_reply_to_json(const struct ctl_mount_reply *r);
int ctl_mount_reply_parse(struct json_object *o, struct ctl_mount_reply *r,
			  char *err, size_t errlen);

/* What a probe found (strings "sha256:<hex>", "" when not known). */
struct ctl_probe_reply {
	char image_digest[DIGEST_STRING_SIZE];
	char bootstrap_digest[DIGEST_STRING_SIZE];
	char index_digest[DIGEST_STRING_SIZE]; /* an indexed image's */
	uint32_t nr_layers;                    /* an indexed image's, else 0 */
	const uint8_t (*layers)[32];           /* borrowed */
	const uint8_t (*diff_ids)[32];         /* borrowed */
};
struct json_object *ctl_probe_reply_to_json(const struct ctl_probe_reply *r);

struct ctl_ping_reply {
	int pid;
	char version[64];
	char socket[108]; /* sun_path */
	int64_t started_at;          /* unix seconds */
	uint64_t rss_bytes, peak_rss_bytes; /* VmRSS, VmHWM */
	unsigned int idle_timeout;   /* seconds; 0: persistent */
	bool socket_activated;       /* the listening socket came from systemd */
};
struct json_object *ctl_ping_reply_to_json(const struct ctl_ping_reply *r);
int ctl_ping_reply_parse(struct json_object *o, struct ctl_ping_reply *r,
			 char *err, size_t errlen);

/* One mount of a list answer. */
struct ctl_mount_stats {
	char *mountpoint, *image, *cache_dir; /* malloc'ed */
	char mode[CTL_TOKEN_MAX + 1];
	char state[CTL_TOKEN_MAX + 1];    /* mounting, mounted, detached, unmounting */
	char prefetch[CTL_TOKEN_MAX + 1]; /* none, running, done, stopped, failed */
	int keeper_pid;                   /* fanotify, cachefiles; 0: none */
	bool suid, dev;                   /* as requested */
	char domain[META_FSCACHE_ID_MAX + 1]; /* cachefiles; "": none */
	char mode_reason[CTL_REASON_MAX]; /* mode auto: why this mode; "": none */
	int64_t mounted_at;               /* unix seconds */
	uint64_t bytes_read, bytes_fetched, bytes_prefetched;
	uint64_t chunks_present, chunks_total, bytes_present;
	uint64_t bytes_evicted;           /* of its blobs, by eviction */
	uint64_t prefetch_files, readahead_files, readahead_bytes;
	uint64_t fetches, fetches_ahead, bytes_ahead;
	uint64_t programs_recorded, programs_read; /* ELF prediction's sources */
	uint64_t modules_read;            /* Python prediction's .pyc files read */
	uint64_t prefetch_ms;             /* prefetch's duration when finished */
	/* Demand reads (image_cache_stats): */
	uint64_t hits, misses, fetch_errors, inflight, miss_ns_total;
	uint64_t miss_ms[IMAGE_LATENCY_BUCKETS];
	uint64_t requests, retries;       /* registry requests, retried ones */
};
struct json_object *ctl_mount_stats_to_json(const struct ctl_mount_stats *m);

struct ctl_list_reply {
	struct ctl_ping_reply daemon;
	struct ctl_mount_stats *mounts; /* malloc'ed */
	size_t nr_mounts;
};
struct json_object *ctl_list_reply_to_json(const struct ctl_list_reply *r);
int ctl_list_reply_parse(struct json_object *o, struct ctl_list_reply *r,
			 char *err, size_t errlen);

struct json_object *ctl_metrics_reply_to_json(const char *text);
/* The metrics answer's text (borrowed from @o). */
int ctl_metrics_reply_parse(struct json_object *o, const char **text,
			    char *err, size_t errlen);
/* Parsed or built: frees the mounts (also after a failed parse). */
void ctl_list_reply_free(struct ctl_list_reply *r);

/* ------------------------------------------------------------------ */
/* Client (ctl_client.c, ferry only)                                   */
/* ------------------------------------------------------------------ */

/*
 * Each call sends one typed request to the ferryd on @socket_path and
 * parses its typed answer: 0, or -errno with @msg set to ferryd's error
 * message (also for a malformed answer, -EPROTO), or to "" for a
 * transport error (-ENOENT / -ECONNREFUSED: no ferryd there, see
 * ctl_no_daemon). ctl_client_mount starts a ferryd (the one installed
 * next to ferry, never one from PATH) when none answers.
 */
int ctl_client_mount(const char *socket_path, const struct ctl_mount_req *req,
		     struct ctl_mount_reply *rep, char *msg, size_t msglen);
int ctl_client_umount(const char *socket_path, const struct ctl_umount_req *req,
		      char *msg, size_t msglen);
int ctl_client_list(const char *socket_path, struct ctl_list_reply *rep,
		    char *msg, size_t msglen);
/* Shutdown (as SIGTERM): ferryd unmounts everything and exits. */
int ctl_client_shutdown(const char *socket_path, char *msg, size_t msglen);
/* Upgrade: ferryd leaves its mounts to a new ferryd of the installed binary. */
int ctl_client_upgrade(const char *socket_path, char *msg, size_t msglen);
/* *@text: the Prometheus text, malloc'ed. */
int ctl_client_metrics(const char *socket_path, char **text, char *msg,
		       size_t msglen);
/* No ferryd listens on the socket (or, from umount, the mount is not its). */
bool ctl_no_daemon(int err);
/*
 * Become a foreground ferryd on @socket_path hosting @req's mount (the
 * request passed through a descriptor: credentials stay out of ps);
 * returns only on failure, after a message.
 */
int ctl_client_exec_mount(const char *socket_path, const struct ctl_mount_req *req);

/* The fstype of a ferry FUSE mount (fuse.<subtype>). */
#define CTL_FUSE_FSTYPE IMAGE_FUSE_FSTYPE

#endif
