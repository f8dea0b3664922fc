// SPDX-License-Identifier: MIT
/*
 * ferry mount / ferry umount. --mode local mounts with the kernel after
 * fetching everything; the lazy modes (fuse, fanotify, cachefiles) hand
 * the mount to ferryd (starting one when none answers on the control
 * socket, see cmd/ctl.h), which knows its modes.
 */
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "../../pkg-base/base.h"
#include "../../pkg-image/image.h"
#include "../ctl.h"
#include "cmd.h"

static void mount_help(void)
{
	printf("Usage: ferry mount --mode local [OPTIONS] IMAGE MOUNTPOINT\n"
	       "       ferry mount [--mode auto|fuse|fanotify|cachefiles] [OPTIONS] IMAGE MOUNTPOINT\n"
	       "       ferry mount --list [--json] [--socket PATH] [MOUNTPOINT]\n\n"
	       "Mount a ferry image read-only.\n\n"
	       "IMAGE  dir:OUT, oci:PATH[:TAG] or docker://[HOST[:PORT]/]REPO[:TAG|@DIGEST],\n"
	       "       an image written by ferry convert\n\n"
	       "Modes:\n"
	       "  local   fetch every missing chunk of every blob into the chunk\n"
	       "          cache (verified against its sha256), then mount the\n"
	       "          bootstrap with the kernel (file-backed EROFS, one device=\n"
	       "          per blob's cache file). No daemon stays running.\n"
	       "  fuse    lazy: fetch and verify the bootstrap only, and serve the\n"
	       "          tree through FUSE from ferryd right away; file data is\n"
	       "          fetched chunk by chunk when first read (verified, kept in\n"
	       "          the chunk cache, so a later mount reuses it). ferry talks\n"
	       "          to ferryd over its control socket and starts one (daemon,\n"
	       "          the ferryd installed next to ferry) if none answers.\n"
	       "          ferry mount returns once the mount is live. If ferryd\n"
	       "          dies or is upgraded, the mount's keeper hands it to a\n"
	       "          new ferryd; readers wait and get their bytes.\n"
	       "  fanotify  lazy, served by the kernel: ferryd writes the bootstrap\n"
	       "          into the cache and mounts it with the kernel (file-backed\n"
	       "          EROFS), one device= per blob naming its sparse cache file;\n"
	       "          a read of a range not yet present waits while ferryd\n"
	       "          fetches and verifies it (fanotify pre-content events,\n"
	       "          Linux 6.14+; the cache directory must be on ext4, xfs or\n"
	       "          btrfs). Cached data is read at kernel speed. If ferryd\n"
	       "          dies, the keeper hands the mount to a new ferryd; if\n"
	       "          none can take it, reads of missing data fail with EIO\n"
	       "          (never zeros) until the mount is unmounted. Also serves\n"
	       "          images of native EROFS layers (convert --format\n"
	       "          erofs-layers): each layer a kernel EROFS over its sparse\n"
	       "          cache file, stacked with overlayfs, its 128 KiB ranges\n"
	       "          fetched and checked against the layer's range table.\n"
	       "  cachefiles  lazy, served by the kernel on the kernels before\n"
	       "          fanotify's pre-content events (5.19 to 7.1 with\n"
	       "          CONFIG_CACHEFILES_ONDEMAND and CONFIG_EROFS_FS_ONDEMAND):\n"
	       "          EROFS over fscache. ferryd owns /dev/cachefiles (one\n"
	       "          daemon per host) and fills the kernel's cache files in\n"
	       "          CACHE/fscache on demand, bootstrap and data, whole\n"
	       "          frames fetched and verified as in the other modes and\n"
	       "          kept only there (prefetch options fill them too), or\n"
	       "          read from the chunk cache where another mode has them.\n"
	       "          If ferryd dies, the keeper holding /dev/cachefiles\n"
	       "          starts a new ferryd that takes the mount over; without\n"
	       "          one, reads of data not yet in those files fail with EIO\n"
	       "          (ENOBUFS where an inode or directory must be read)\n"
	       "          until the mount is unmounted. Images of native EROFS\n"
	       "          layers: each layer an EROFS over fscache of its own,\n"
	       "          stacked with overlayfs (no --domain); a layer another\n"
	       "          mount has is mounted again as a copy with its own\n"
	       "          cache file; a compressed file's bytes are fetched\n"
	       "          whole at its first read (the kernel misreads partly\n"
	       "          cached compressed extents).\n\n"
	       "Options:\n"
	       "  --mode MODE       local, fuse, fanotify, cachefiles or auto (the\n"
	       "                    default: fanotify where the kernel has pre-content\n"
	       "                    events and the cache is on ext4, xfs or btrfs, else\n"
	       "                    cachefiles where /dev/cachefiles is there, else\n"
	       "                    fuse; --list says which and why; native EROFS\n"
	       "                    layers that mode cannot serve: local, saying so)\n"
	       "  --cache-dir DIR   the chunk cache (default $FERRY_CACHE_DIR or\n"
	       "                    %s); see ferry cache\n"
	       "  --suid, --dev     honour the image's setuid/setgid bits, its device\n"
	       "                    nodes (default: nosuid,nodev in every mode); only\n"
	       "                    for images you trust as much as root\n"
	       "  --domain NAME     cachefiles: mount in the EROFS domain NAME\n"
	       "                    (A-Z a-z 0-9 . _ -): the mounts of a domain share\n"
	       "                    the blobs they have in common, one cache file and\n"
	       "                    one copy in the page cache per blob\n"
	       "  --record LIST     fuse (implied): write to LIST each file whose data\n"
	       "                    is read through the mount, once, in first-access\n"
	       "                    order, while it happens: run the workload, unmount,\n"
	       "                    then 'ferry convert --prefetch-files LIST' embeds it\n"
	       "                    and every lazy mount of the result fetches those\n"
	       "                    files first\n"
	       "lazy modes (fuse, fanotify, cachefiles):\n"
	       "  --prefetch-files LIST  after mounting, fetch the files named in\n"
	       "                    LIST (one path inside the image per line, in\n"
	       "                    order; symlinks followed, a directory means\n"
	       "                    every file below it; empty lines and lines\n"
	       "                    starting with # are skipped) in the background\n"
	       "  --prefetch-all    then fetch every blob in the background\n"
	       "  --prefetch-bwlimit RATE  prefetch bytes per second, e.g. 10M\n"
	       "                    (K/M/G are binary units; default unlimited).\n"
	       "                    Reads by programs always go first\n"
	       "  --cache-max-size SIZE  keep the cache directory's blobs within SIZE\n"
	       "                    (e.g. 10G): ferryd evicts the least recently used\n"
	       "                    data and fetches it again when read; --mode local\n"
	       "                    mounts' blobs are never evicted (default: ferryd's\n"
	       "                    --cache-max-size; holds for the directory's later\n"
	       "                    mounts too)\n"
	       "  --cache-min-free PCT  also evict while the cache's file system has\n"
	       "                    less than PCT %% free (default: ferryd's, 10)\n"
	       "  -f, --foreground  run a ferryd in the foreground hosting this mount,\n"
	       "                    logging to stderr, until it is unmounted or gets\n"
	       "                    SIGINT/SIGTERM (fails if a ferryd already serves\n"
	       "                    the socket)\n"
	       "  --socket PATH     ferryd's control socket (default $%s or\n"
	       "                    %s)\n"
	       "  --list            show the mounts of the ferryd on the socket (or\n"
	       "                    only MOUNTPOINT's) with their statistics\n"
	       "  --json            --list: JSON on stdout: {\"pid\",\"socket\",\"mounts\":\n"
	       "                    [{\"mountpoint\",\"image\",\"cacheDir\",\"mode\",\n"
	       "                    \"keeperPid\" (fanotify, cachefiles),\"domain\",\n"
	       "                    \"modeReason\" (auto),\n"
	       "                    \"suid\",\"dev\",\"state\",\n"
	       "                    \"mountedAt\",\"bytesRead\",\"bytesFetched\",\n"
	       "                    \"bytesPrefetched\",\"chunksPresent\",\"chunksTotal\",\n"
	       "                    \"bytesPresent\",\"bytesEvicted\",\"prefetch\",\"prefetchFiles\",\n"
	       "                    \"prefetchSeconds\",\"readaheadFiles\",\"readaheadBytes\",\n"
	       "                    \"fetches\",\"fetchesAhead\",\"bytesAhead\",\n"
	       "                    \"programsRecorded\",\"programsRead\",\"modulesRead\"}]};\n"
	       "                    no ferryd running: no mounts\n"
	       "  -h, --help        this help\n\n"
	       "Unmount any mode with 'ferry umount MOUNTPOINT'.\n\n%s\n" EXIT_CODES_HELP,
	       FERRY_DEFAULT_CACHE_DIR, CTL_SOCKET_ENV, CTL_DEFAULT_SOCKET,
	       REGISTRY_OPTIONS_HELP);
}

/*
 * Whether the FUSE mount on @mp has lost its daemon. statfs always asks
 * the daemon; stat may be answered from cached attributes.
 */
static bool fuse_dead(const char *mp)
{
	struct statvfs sv;

	return statvfs(mp, &sv) && (errno == ENOTCONN || errno == ECONNABORTED);
}

/* ------------------------------------------------------------------ */
/* ferry mount --mode fuse, fanotify, cachefiles: through ferryd      */
/* ------------------------------------------------------------------ */

/* "10M", "10M/s", "0": bytes per second. */
static int parse_rate(const char *s, uint64_t *out)
{
	char buf[64];
	size_t n = strlen(s);

	if (n >= sizeof(buf))
		return -EINVAL;
	memcpy(buf, s, n + 1);
	if (n > 2 && !strcmp(buf + n - 2, "/s"))
		buf[n - 2] = '\0';
	return parse_size(buf, out);
}

struct lazy_args {
	const char *image, *mountpoint, *cache_dir, *prefetch_list, *socket_path, *mode;
	const char *domain, *record;
	bool prefetch_all, foreground, suid, dev;
	uint64_t bwlimit;
	uint64_t max_size; /* 0: ferryd's */
	int64_t min_free;  /* -1: ferryd's */
	bool local_fallback; /* --mode auto, no lazy-only option */
	struct regopts *ro;
};

/* mount_lazy's answer when no lazy mode serves the image: mount it locally. */
#define MOUNT_LOCAL_INSTEAD (-1)

static int mount_lazy(const struct lazy_args *a)
{
	char *image = NULL, *mp = NULL, *cache = NULL, *authfile = NULL,
	     *ca = NULL, *record = NULL, **files = NULL, msg[CTL_MSG_MAX + 64];
	struct ctl_mount_reply rep;
	struct ctl_mount_req r;
	uint32_t nr_files = 0;
	bool named;
	int ret, rc = EXIT_FAIL;

	ctl_mount_req_init(&r);
	ret = image_ref_absolute(a->image, &image);
	if (!ret)
		ret = path_mountpoint(a->mountpoint, &mp);
	if (!ret)
		ret = path_absolute(a->cache_dir, &cache);
	if (!ret && a->record)
		ret = path_absolute(a->record, &record);
	if (ret) {
		ferry_err("mount %s on %s: %s", a->image, a->mountpoint, ferry_strerror(ret));
		goto out;
	}
	/* ferryd checks the mount point (a directory, not a dead mount). */
	if (a->prefetch_list &&
	    image_prefetch_list_load(a->prefetch_list, &files, &nr_files))
		goto out;

	r.image = image;
	r.mountpoint = mp;
	r.cache_dir = cache;
	r.prefetch_files = (const char **)files;
	r.nr_prefetch_files = nr_files;
	r.prefetch_all = a->prefetch_all;
	r.mode = a->mode;
	r.domain = a->domain;
	r.record = record;
	r.prefetch_bwlimit = a->bwlimit;
	r.cache_max_size = a->max_size;
	r.cache_min_free = a->min_free;
	r.suid = a->suid;
	r.dev = a->dev;
	r.fetch = a->ro->fetch;
	/*
	 * ferryd has its own environment: send the docker config this
	 * client would read as an explicit path (a default one only when it
	 * exists, as pkg-fetch ignores a missing default).
	 */
	authfile = fetch_authfile_path(&r.fetch, &named);
	if (authfile && (named || !access(authfile, R_OK))) {
		char *abs = NULL;

		if (path_absolute(authfile, &abs))
			goto oom;
		free(authfile);
		authfile = abs;
		r.fetch.authfile = authfile;
	}
	if (r.fetch.ca_file && path_absolute(r.fetch.ca_file, &ca))
		goto oom;
	if (ca)
		r.fetch.ca_file = ca;

	if (a->foreground) {
		ctl_client_exec_mount(a->socket_path, &r);
		goto out;
	}
	ret = ctl_client_mount(a->socket_path, &r, &rep, msg, sizeof(msg));
	/* ferryd's modes cannot serve it (native layers on a host whose lazy
	 * mode refuses them): auto means a mount, so a local one. */
	if (ret == -EMEDIUMTYPE && a->local_fallback) {
		ferry_info("%s", msg);
		ferry_info("mounting %s fully fetched instead (--mode local)", a->image);
		rc = MOUNT_LOCAL_INSTEAD;
		goto out;
	}
	if (ret && msg[0]) {
		ferry_err("%s", msg);
		goto out;
	}
	if (ret) {
		ferry_err("mount %s on %s: ferryd (%s): %s", a->image, mp, a->socket_path,
			  ferry_strerror(ret));
		goto out;
	}
	ferry_info("mounted %s on %s (ferryd pid %d, socket %s)", image, mp, rep.pid,
		   a->socket_path);
	rc = EXIT_OK;
	goto out;
oom:
	ferry_err("mount %s: out of memory", a->image);
out:
	image_prefetch_list_free(files, nr_files);
	free(image);
	free(mp);
	free(cache);
	free(record);
	free(authfile);
	free(ca);
	return rc;
}

/* ------------------------------------------------------------------ */
/* ferry mount --list                                                  */
/* ------------------------------------------------------------------ */

static void print_mounts(const struct ctl_mount_stats *mounts, size_t n)
{
	const struct ctl_mount_stats *m;
	char chunks[48], read[24], opts[16];

	printf("%-30s %-8s %-12s %-10s %-9s %13s %13s %13s %15s  %s\n", "MOUNTPOINT",
	       "MODE", "OPTIONS", "STATE", "PREFETCH", "READ", "FETCHED", "PREFETCHED",
	       "CHUNKS", "IMAGE");
	for (m = mounts; m < mounts + n; m++) {
		snprintf(chunks, sizeof(chunks), "%llu/%llu",
			 (unsigned long long)m->chunks_present,
			 (unsigned long long)m->chunks_total);
		/* The kernel reads a fanotify mount's files without us. */
		if (!strcmp(m->mode, "fanotify"))
			snprintf(read, sizeof(read), "-");
		else
			snprintf(read, sizeof(read), "%llu", (unsigned long long)m->bytes_read);
		snprintf(opts, sizeof(opts), "%ssuid,%sdev", m->suid ? "" : "no",
			 m->dev ? "" : "no");
		printf("%-30s %-8s %-12s %-10s %-9s %13s %13llu %13llu %15s  %s\n",
		       m->mountpoint, m->mode, opts, m->state, m->prefetch, read,
		       (unsigned long long)m->bytes_fetched,
		       (unsigned long long)m->bytes_prefetched, chunks, m->image);
		if (m->mode_reason[0])
			printf("  mode auto: %s\n", m->mode_reason);
		if (m->bytes_evicted)
			printf("  evicted by the cache size limit: %llu bytes of its blobs\n",
			       (unsigned long long)m->bytes_evicted);
	}
}

/* {"pid" (when a ferryd answered),"socket","mounts"} on stdout. */
static int print_json(int pid, const char *socket_path, const struct ctl_mount_stats *mounts,
		      size_t n)
{
	struct json_object *out = json_object_new_object(), *a = json_object_new_array(), *m;
	size_t i;
	int ret = out && a ? 0 : -ENOMEM;

	for (i = 0; !ret && i < n; i++) {
		m = ctl_mount_stats_to_json(&mounts[i]);
		if (!m || json_object_array_add(a, m)) {
			json_object_put(m);
			ret = -ENOMEM;
		}
	}
	if (!ret && pid)
		ret = json_object_object_add(out, "pid", json_object_new_int(pid)) ? -ENOMEM : 0;
	if (!ret)
		ret = json_object_object_add(out, "socket", json_object_new_string(socket_path)) ?
			      -ENOMEM : 0;
	if (!ret) {
		ret = json_object_object_add(out, "mounts", a) ? -ENOMEM : 0;
		a = NULL;
	}
	if (!ret)
		printf("%s\n", json_object_to_json_string_ext(out, JSON_C_TO_STRING_PRETTY |
							       JSON_C_TO_STRING_NOSLASHESCAPE));
	json_object_put(a);
	json_object_put(out);
	return ret;
}

static int mount_list(const char *socket_path, bool json, const char *only)
{
	struct ctl_list_reply lr;
	struct ctl_mount_stats *m = NULL;
	char *mp = NULL, msg[CTL_MSG_MAX + 64];
	size_t n;
	int ret, rc = EXIT_FAIL;

	ret = ctl_client_list(socket_path, &lr, msg, sizeof(msg));
	if (ret && !(ctl_no_daemon(ret) && !msg[0])) {
		ferry_err("ferryd (%s): %s", socket_path, msg[0] ? msg : ferry_strerror(ret));
		return EXIT_FAIL;
	}
	/* No ferryd running: no mounts. */
	m = lr.mounts;
	n = lr.nr_mounts;
	if (only) {
		if (path_mountpoint(only, &mp))
			goto out;
		for (; n && strcmp(m->mountpoint, mp); m++, n--)
			;
		if (!n) {
			ferry_err("%s: not a mount of the ferryd on %s", only, socket_path);
			goto out;
		}
		n = 1;
	}
	if (json) {
		if (print_json(lr.daemon.pid, socket_path, m, n))
			goto out;
	} else if (!n) {
		printf("no ferry lazy mounts (%s)\n", socket_path);
	} else {
		print_mounts(m, n);
	}
	rc = EXIT_OK;
out:
	ctl_list_reply_free(&lr);
	free(mp);
	return rc;
}

/* ------------------------------------------------------------------ */
/* ferry mount                                                         */
/* ------------------------------------------------------------------ */

enum {
	OPT_PREFETCH_FILES = 0x2000,
	OPT_PREFETCH_ALL,
	OPT_BWLIMIT,
	OPT_SOCKET,
	OPT_LIST,
	OPT_JSON,
	OPT_SUID,
	OPT_DEV,
	OPT_DOMAIN,
	OPT_RECORD,
	OPT_CACHE_MAX,
	OPT_CACHE_MIN_FREE,
};

static int mount_local(const char *ref, const char *mountpoint, const char *cache_dir,
		       unsigned long flags, struct regopts *ro)
{
	struct image *img;
	char *target;
	int ret;

	/* Resolved once, before the image is fetched (pkg-image mounts it as is). */
	ret = image_mountpoint_check(mountpoint, &target);
	if (ret)
		return EXIT_FAIL;
	ret = image_mount_erofs_layers(ref, &ro->fetch, cache_dir, target, flags);
	if (ret <= 0) {
		if (ret)
			ferry_err("mount %s on %s failed: %s", ref, target,
				  ferry_strerror(ret));
		free(target);
		return ret ? EXIT_FAIL : EXIT_OK;
	}
	ret = image_open(ref, &(struct image_opts){ .fetch = &ro->fetch, .no_config = true },
			 &img);
	if (ret) {
		free(target);
		return ret == -EINVAL ? EXIT_USAGE : EXIT_FAIL;
	}
	ret = image_mount_local(img, cache_dir, target, flags);
	image_close(img);
	if (ret)
		ferry_err("mount %s on %s failed: %s", ref, target, ferry_strerror(ret));
	free(target);
	return ret ? EXIT_FAIL : EXIT_OK;
}

int cmd_mount(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "mode", required_argument, NULL, 'm' },
		{ "cache-dir", required_argument, NULL, 'C' },
		{ "prefetch-files", required_argument, NULL, OPT_PREFETCH_FILES },
		{ "prefetch-all", no_argument, NULL, OPT_PREFETCH_ALL },
		{ "prefetch-bwlimit", required_argument, NULL, OPT_BWLIMIT },
		{ "foreground", no_argument, NULL, 'f' },
		{ "socket", required_argument, NULL, OPT_SOCKET },
		{ "list", no_argument, NULL, OPT_LIST },
		{ "json", no_argument, NULL, OPT_JSON },
		{ "suid", no_argument, NULL, OPT_SUID },
		{ "dev", no_argument, NULL, OPT_DEV },
		{ "domain", required_argument, NULL, OPT_DOMAIN },
		{ "record", required_argument, NULL, OPT_RECORD },
		{ "cache-max-size", required_argument, NULL, OPT_CACHE_MAX },
		{ "cache-min-free", required_argument, NULL, OPT_CACHE_MIN_FREE },
		{ "help", no_argument, NULL, 'h' },
		REGISTRY_LONGOPTS,
		{ 0 },
	};
	struct lazy_args a = { .socket_path = ctl_default_socket(), .min_free = -1 };
	uint64_t v;
	struct regopts ro;
	const char *mode = NULL;
	bool list = false, json = false, lazy_only = false;
	int c, ret;

	regopts_init(&ro);
	a.ro = &ro;
	a.cache_dir = default_cache_dir();
	while ((c = getopt_long(argc, argv, "hf", longopts, NULL)) != -1) {
		ret = regopts_parse(&ro, c, optarg);
		if (ret < 0)
			return usage_error("mount", "bad registry option");
		if (ret)
			continue;
		switch (c) {
		case 'm':
			mode = optarg;
			break;
		case 'C':
			a.cache_dir = optarg;
			break;
		case OPT_PREFETCH_FILES:
			a.prefetch_list = optarg;
			lazy_only = true;
			break;
		case OPT_PREFETCH_ALL:
			a.prefetch_all = true;
			lazy_only = true;
			break;
		case OPT_BWLIMIT:
			if (parse_rate(optarg, &a.bwlimit))
				return usage_error("mount", "--prefetch-bwlimit %s: expected bytes per second, e.g. 10M",
						   optarg);
			lazy_only = true;
			break;
		case OPT_CACHE_MAX:
			if (parse_size(optarg, &a.max_size) || !a.max_size)
				return usage_error("mount", "--cache-max-size %s: expected a size, e.g. 10G",
						   optarg);
			lazy_only = true;
			break;
		case OPT_CACHE_MIN_FREE:
			if (parse_size(optarg, &v) || v > 99)
				return usage_error("mount", "--cache-min-free %s: expected 0..99 (%% of the file system)",
						   optarg);
			a.min_free = (int64_t)v;
			lazy_only = true;
			break;
		case 'f':
			a.foreground = true;
			lazy_only = true;
			break;
		case OPT_SOCKET:
			if (optarg[0] != '/')
				return usage_error("mount", "--socket %s: expected an absolute path",
						   optarg);
			a.socket_path = optarg;
			break;
		case OPT_LIST:
			list = true;
			break;
		case OPT_JSON:
			json = true;
			break;
		case OPT_SUID:
			a.suid = true;
			break;
		case OPT_DEV:
			a.dev = true;
			break;
		case OPT_DOMAIN:
			a.domain = optarg;
			lazy_only = true;
			break;
		case OPT_RECORD:
			a.record = optarg;
			lazy_only = true;
			break;
		case 'h':
			mount_help();
			return EXIT_OK;
		default:
			return usage_error("mount", "unknown option");
		}
	}
	if (list) {
		if (argc - optind > 1)
			return usage_error("mount", "--list takes at most one MOUNTPOINT");
		return mount_list(a.socket_path, json, argc - optind ? argv[optind] : NULL);
	}
	if (json)
		return usage_error("mount", "--json goes with --list");
	if (argc - optind != 2)
		return usage_error("mount", "expected IMAGE and MOUNTPOINT");
	/* Only FUSE sees which files are read. */
	if (!mode)
		mode = a.record ? "fuse" : "auto";
	if (a.record && strcmp(mode, "fuse"))
		return usage_error("mount", "--record needs --mode fuse (the kernel reads %s mounts without ferryd seeing the files)",
				   mode);
	ret = regopts_finish(&ro);
	if (ret)
		return ret;
	a.image = argv[optind];
	a.mountpoint = argv[optind + 1];
	a.mode = mode;
	a.local_fallback = !strcmp(mode, "auto") && !lazy_only;
	if (!strcmp(mode, "fuse") || !strcmp(mode, "fanotify") || !strcmp(mode, "cachefiles") ||
	    !strcmp(mode, "auto")) {
		ret = mount_lazy(&a);
		if (ret != MOUNT_LOCAL_INSTEAD)
			return ret;
		mode = "local";
	}
	if (strcmp(mode, "local"))
		return usage_error("mount", "unknown mode \"%s\" (local, fuse, fanotify, cachefiles or auto)",
				   mode);
	if (lazy_only)
		return usage_error("mount", "--prefetch-*, --domain, --record, -f: only with a lazy mode (fuse, fanotify, cachefiles)");
	return mount_local(a.image, a.mountpoint, a.cache_dir,
			   image_mount_flags(a.suid, a.dev), &ro);
}

/* ------------------------------------------------------------------ */
/* ferry umount                                                        */
/* ------------------------------------------------------------------ */

static void umount_help(void)
{
	printf("Usage: ferry umount [--lazy] [--socket PATH] MOUNTPOINT\n\n"
	       "Unmount a ferry mount (any mode).\n\n"
	       "A FUSE, fanotify or cachefiles mount is unmounted through the ferryd\n"
	       "serving it, which answers once the mount is torn down; a local mount,\n"
	       "or a kernel mount whose ferryd is gone, with umount2. A FUSE mount whose ferryd is\n"
	       "gone (killed: \"Transport endpoint is not connected\") or is not the\n"
	       "one on the socket is unmounted directly; a dead one that is still\n"
	       "in use is detached (MNT_DETACH), since it cannot serve anything.\n\n"
	       "Options:\n"
	       "  -l, --lazy      if the mount is busy, detach it now; ferryd serves\n"
	       "                  its open files until the last one is closed\n"
	       "  --socket PATH   ferryd's control socket (default $%s or\n"
	       "                  %s)\n"
	       "  -h, --help      this help\n\n" EXIT_CODES_HELP,
	       CTL_SOCKET_ENV, CTL_DEFAULT_SOCKET);
}

/* Unmount @mp without ferryd's help; a dead FUSE mount may be detached. */
static int umount_direct(const char *mp, bool lazy, bool fuse)
{
	int e;

	if (!umount_nofollow(mp, 0))
		return EXIT_OK;
	e = errno;
	if (fuse && (e == ENOTCONN || (e == EBUSY && (lazy || fuse_dead(mp))))) {
		if (!umount_nofollow(mp, MNT_DETACH)) {
			ferry_info("%s: %s; detached it", mp, strerror(e));
			return EXIT_OK;
		}
		e = errno;
	} else if (e == EBUSY && lazy) {
		if (!umount_nofollow(mp, MNT_DETACH))
			return EXIT_OK;
		e = errno;
	}
	ferry_err("umount %s: %s", mp, strerror(e));
	return EXIT_FAIL;
}

int cmd_umount(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "lazy", no_argument, NULL, 'l' },
		{ "socket", required_argument, NULL, OPT_SOCKET },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	const char *socket_path = ctl_default_socket();
	struct ctl_umount_req req = { 0 };
	struct mount_entry mi;
	bool fuse, layers;
	char *mp = NULL, msg[CTL_MSG_MAX + 64];
	int c, ret, rc = EXIT_FAIL;

	while ((c = getopt_long(argc, argv, "hl", longopts, NULL)) != -1) {
		switch (c) {
		case 'l':
			req.lazy = true;
			break;
		case OPT_SOCKET:
			if (optarg[0] != '/')
				return usage_error("umount", "--socket %s: expected an absolute path",
						   optarg);
			socket_path = optarg;
			break;
		case 'h':
			umount_help();
			return EXIT_OK;
		default:
			return usage_error("umount", "unknown option");
		}
	}
	if (argc - optind != 1)
		return usage_error("umount", "expected MOUNTPOINT");
	ret = path_mountpoint(argv[optind], &mp);
	if (ret) {
		ferry_err("umount %s: %s", argv[optind], ferry_strerror(ret));
		return EXIT_FAIL;
	}
	ret = mountinfo_find(mp, &mi);
	if (ret) {
		ferry_err("umount %s: %s", argv[optind],
			  ret == -ENOENT ? "not mounted" : ferry_strerror(ret));
		goto out;
	}
	fuse = !strcmp(mi.fstype, CTL_FUSE_FSTYPE);
	layers = !strcmp(mi.fstype, "overlay") && !strcmp(mi.source, IMAGE_LAYERS_SOURCE);
	if (!fuse && !layers && strcmp(mi.fstype, "erofs")) {
		ferry_err("umount %s: not a ferry mount (%s %s)", argv[optind], mi.fstype,
			  mi.source);
		goto out;
	}
	req.mountpoint = mp;
	ret = ctl_client_umount(socket_path, &req, msg, sizeof(msg));
	if (!ret) {
		rc = EXIT_OK;
	} else if (ctl_no_daemon(ret)) {
		/* No ferryd here, or another one's mount, or a kernel mount
		 * (local mode, native layers' too, or fanotify of a dead
		 * ferryd): the kernel's turn. */
		rc = umount_direct(mp, req.lazy, fuse);
	} else if (msg[0]) {
		ferry_err("umount %s: %s", argv[optind], msg);
	} else {
		ferry_err("umount %s: ferryd (%s): %s", argv[optind], socket_path,
			  ferry_strerror(ret));
	}
out:
	free(mp);
	return rc;
}
