/* SPDX-License-Identifier: MIT */
/*
 * regclient: a small command-line client over pkg-fetch for the e2e
 * scripts (and for poking at a registry by hand).
 *
 *   regclient [OPTIONS] COMMAND ARGS      (REF is HOST[:PORT]/REPO[:TAG|@DIGEST])
 *     manifest REF              manifest bytes to stdout; "MEDIATYPE DIGEST" on stderr
 *     exists REF DIGEST         print the size (exit 0), or exit 3 when absent
 *     blob REF DIGEST SIZE      stream the blob to stdout (fetch_stream)
 *     getblob REF DIGEST SIZE   read it into memory (registry_get_blob), then write
 *     range REF DIGEST OFF LEN  exactly LEN bytes at OFF to stdout
 *     push-blob REF FILE [MOUNT_FROM_REPO]   prints "DIGEST uploaded|exists"
 *     push-manifest REF MEDIATYPE FILE       PUT under REF's tag (or digest); prints its digest
 *     tags REF                  one tag per line
 *
 * Exit status: 0 ok, 1 error (logged), 2 usage, 3 blob absent (exists).
 */
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../pkg-base/base.h"
#include "../../pkg-blob/blob.h"
#include "../../pkg-fetch/fetch.h"

#define MAX_LIST 64

static void usage(void)
{
	fprintf(stderr,
		"usage: regclient [OPTIONS] COMMAND ARGS\n"
		"options: --creds USER:PASS  --authfile FILE  --insecure HOST[:PORT]\n"
		"         --tls-verify=false  --ca-file FILE  --mirror HOST[:PORT]=URL\n"
		"         --resolve HOST:PORT:ADDR  --retries N  --connect-ms N\n"
		"         --stall-ms N  --request-ms N  --stats  --debug\n"
		"         --parallel N (range: N threads at once, 1..32)\n"
		"commands: manifest REF | exists REF DIGEST | blob REF DIGEST SIZE\n"
		"          getblob REF DIGEST SIZE | range REF DIGEST OFF LEN\n"
		"          push-blob REF FILE [MOUNT_FROM_REPO]\n"
		"          push-manifest REF MEDIATYPE FILE | tags REF\n");
}

static int parse_u64_arg(const char *s, uint64_t *v)
{
	char *end;

	if (!*s || *s == '-')
		return -1;
	errno = 0;
	*v = strtoull(s, &end, 10);
	return errno || *end ? -1 : 0;
}

static int parse_uint_arg(const char *s, unsigned int *v)
{
	uint64_t x;

	if (parse_u64_arg(s, &x) || x > UINT32_MAX)
		return -1;
	*v = (unsigned int)x;
	return 0;
}

static int out_write(const void *p, size_t n)
{
	int err = write_full(STDOUT_FILENO, p, n);

	if (err)
		ferry_err("writing to stdout: %s", ferry_strerror(err));
	return err;
}

static int cmd_manifest(struct registry *r, const struct fetch_ref *ref)
{
	const char *reference = ref->digest ? ref->digest :
				ref->tag ? ref->tag : "latest";
	struct fetch_buf body;
	uint8_t d[FETCH_DIGEST_SIZE];
	char type[256], ds[80];
	int err;

	err = registry_get_manifest(r, reference, &body, type, sizeof(type), d);
	if (err)
		return err;
	digest_format(d, ds);
	err = out_write(body.data, body.len);
	fprintf(stderr, "%s %s\n", type, ds);
	fetch_buf_free(&body);
	return err;
}

static int get_digest(const char *s, uint8_t d[FETCH_DIGEST_SIZE])
{
	if (digest_parse(s, d)) {
		ferry_err("invalid digest \"%s\" (expected sha256:<64 hex>)", s);
		return -EINVAL;
	}
	return 0;
}

static int cmd_blob(struct registry *r, const uint8_t d[FETCH_DIGEST_SIZE],
		    uint64_t size)
{
	static uint8_t buf[128 << 10];
	struct fetch_stream *s;
	ssize_t n;
	int err;

	err = registry_open_stream(r, d, size, &s);
	if (err)
		return err;
	while ((n = fetch_stream_read(s, buf, sizeof(buf))) > 0) {
		err = out_write(buf, (size_t)n);
		if (err)
			break;
	}
	if (!err && n < 0)
		err = (int)n;
	fetch_stream_close(s);
	return err;
}

static int cmd_getblob(struct registry *r, const uint8_t d[FETCH_DIGEST_SIZE],
		       uint64_t size)
{
	struct fetch_buf b;
	int err;

	if (size >= SIZE_MAX)
		return -EFBIG;
	err = registry_get_blob(r, d, size, (size_t)size, &b);
	if (err)
		return err;
	err = out_write(b.data, b.len);
	fetch_buf_free(&b);
	return err;
}

#define PARALLEL_MAX 32

struct range_get {
	struct registry *r;
	const uint8_t *d;
	uint64_t off, len;
	uint8_t *buf;
	int err;
};

static void *range_get(void *arg)
{
	struct range_get *g = arg;

	g->err = registry_get_range(g->r, g->d, g->off, g->len, g->buf);
	return NULL;
}

/*
 * The range @parallel times at once through the one client (its first
 * requests race each other: authentication must hold for all); every
 * copy must be the same bytes.
 */
static int cmd_range(struct registry *r, const uint8_t d[FETCH_DIGEST_SIZE],
		     uint64_t off, uint64_t len, unsigned int parallel)
{
	struct range_get g[PARALLEL_MAX] = { 0 };
	pthread_t th[PARALLEL_MAX];
	unsigned int i, started = 0;
	int err = 0;

	if (len > (1ull << 32)) {
		ferry_err("range of %" PRIu64 " bytes is too large for this tool",
			  len);
		return -EFBIG;
	}
	for (i = 0; i < parallel; i++) {
		g[i] = (struct range_get){ r, d, off, len, malloc(len ? (size_t)len : 1), 0 };
		if (!g[i].buf) {
			err = -ENOMEM;
			goto out;
		}
	}
	for (; started < parallel; started++)
		if (pthread_create(&th[started], NULL, range_get, &g[started])) {
			err = -EAGAIN;
			break;
		}
	for (i = 0; i < started; i++)
		pthread_join(th[i], NULL);
	for (i = 0; !err && i < parallel; i++) {
		err = g[i].err;
		if (!err && memcmp(g[i].buf, g[0].buf, (size_t)len)) {
			ferry_err("parallel range read %u got other bytes", i);
			err = -EIO;
		}
	}
	if (!err)
		err = out_write(g[0].buf, (size_t)len);
out:
	for (i = 0; i < parallel; i++)
		free(g[i].buf);
	return err;
}

/* sha256 of a whole file. */
static int file_digest(int fd, const char *path, uint64_t size,
		       uint8_t d[FETCH_DIGEST_SIZE])
{
	static uint8_t buf[1 << 20];
	struct sha256_hasher *h;
	uint64_t off = 0;
	int err;

	err = sha256_hasher_new(&h);
	if (err)
		return err;
	while (off < size) {
		size_t n = (size_t)MIN((uint64_t)sizeof(buf), size - off);

		err = pread_full(fd, buf, n, off);
		if (err) {
			ferry_err("reading %s: %s", path, ferry_strerror(err));
			sha256_hasher_free(h);
			return err;
		}
		sha256_hasher_update(h, buf, n);
		off += n;
	}
	sha256_hasher_final(h, d);
	sha256_hasher_free(h);
	return 0;
}

static int cmd_push_blob(struct registry *r, const char *path,
			 const char *mount_from)
{
	uint8_t d[FETCH_DIGEST_SIZE];
	struct stat st;
	char ds[80];
	int fd, err;

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st) < 0) {
		err = -errno;
		ferry_err("%s: %s", path, ferry_strerror(err));
		if (fd >= 0)
			close(fd);
		return err;
	}
	err = file_digest(fd, path, (uint64_t)st.st_size, d);
	if (!err)
		err = registry_put_blob_fd(r, fd, (uint64_t)st.st_size, d,
					   mount_from);
	close(fd);
	if (err < 0)
		return err;
	digest_format(d, ds);
	printf("%s %s\n", ds, err ? "exists" : "uploaded");
	return 0;
}

static int read_small_file(const char *path, uint8_t **data, size_t *len)
{
	struct stat st;
	int fd, err;

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st) < 0) {
		err = -errno;
		goto fail;
	}
	err = -EFBIG;
	if (st.st_size > FETCH_MANIFEST_MAX)
		goto fail;
	err = -ENOMEM;
	*data = malloc((size_t)st.st_size + 1);
	if (!*data)
		goto fail;
	err = read_full(fd, *data, (size_t)st.st_size);
	if (err) {
		free(*data);
		goto fail;
	}
	*len = (size_t)st.st_size;
	close(fd);
	return 0;
fail:
	ferry_err("%s: %s", path, ferry_strerror(err));
	if (fd >= 0)
		close(fd);
	return err;
}

static int cmd_push_manifest(struct registry *r, const struct fetch_ref *ref,
			     const char *type, const char *path)
{
	const char *reference = ref->digest ? ref->digest :
				ref->tag ? ref->tag : "latest";
	uint8_t *data = NULL, d[FETCH_DIGEST_SIZE];
	char ds[80];
	size_t len = 0;
	int err;

	err = read_small_file(path, &data, &len);
	if (err)
		return err;
	err = registry_put_manifest(r, reference, type, data, len);
	if (!err) {
		sha256_buf(data, len, d);
		digest_format(d, ds);
		printf("%s\n", ds);
	}
	free(data);
	return err;
}

static int cmd_tags(struct registry *r)
{
	char **tags;
	size_t n, i;
	int err;

	err = registry_list_tags(r, &tags, &n);
	if (err)
		return err;
	for (i = 0; i < n; i++)
		printf("%s\n", tags[i]);
	fetch_free_tags(tags, n);
	return 0;
}

int main(int argc, char **argv)
{
	const char *insecure[MAX_LIST + 1] = { 0 };
	const struct fetch_host *mirrors[MAX_LIST + 1] = { 0 };
	struct fetch_host mirror_hosts[MAX_LIST];
	char mirror_names[MAX_LIST][256] = { { 0 } };
	const char *resolve[MAX_LIST + 1] = { 0 };
	size_t nr_insecure = 0, nr_mirrors = 0, nr_resolve = 0;
	struct fetch_opts opts;
	struct fetch_ref ref;
	struct registry *r = NULL;
	enum fetch_access access = FETCH_PULL;
	bool stats = false;
	unsigned int parallel = 1;
	const char *cmd;
	uint8_t d[FETCH_DIGEST_SIZE];
	uint64_t a = 0, b = 0;
	int i, nargs, err, rc;

	fetch_opts_init(&opts);
	for (i = 1; i < argc && !strncmp(argv[i], "--", 2); i++) {
		const char *o = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (!strcmp(o, "--stats")) {
			stats = true;
		} else if (!strcmp(o, "--debug")) {
			ferry_log_level = FERRY_LOG_DEBUG;
		} else if (!strcmp(o, "--tls-verify=false")) {
			opts.tls_verify = false;
		} else if (!strcmp(o, "--tls-verify=true")) {
			opts.tls_verify = true;
		} else if (!v) {
			usage();
			return 2;
		} else if (!strcmp(o, "--creds")) {
			opts.creds = v;
			i++;
		} else if (!strcmp(o, "--authfile")) {
			opts.authfile = v;
			i++;
		} else if (!strcmp(o, "--ca-file")) {
			opts.ca_file = v;
			i++;
		} else if (!strcmp(o, "--insecure") && nr_insecure < MAX_LIST) {
			insecure[nr_insecure++] = v;
			i++;
		} else if (!strcmp(o, "--mirror") && nr_mirrors < MAX_LIST) {
			const char *eq = strchr(v, '=');

			if (!eq || eq - v >= (long)sizeof(mirror_names[0]))
				goto bad_usage;
			memcpy(mirror_names[nr_mirrors], v, (size_t)(eq - v));
			mirror_hosts[nr_mirrors] = (struct fetch_host){
				.registry = mirror_names[nr_mirrors],
				.url = eq + 1,
				.capabilities = FETCH_HOST_PULL,
			};
			mirrors[nr_mirrors] = &mirror_hosts[nr_mirrors];
			nr_mirrors++;
			i++;
		} else if (!strcmp(o, "--resolve") && nr_resolve < MAX_LIST) {
			if (fetch_check_resolve(v))
				return 2;
			resolve[nr_resolve++] = v;
			i++;
		} else if (!strcmp(o, "--parallel")) {
			if (parse_uint_arg(v, &parallel) || !parallel ||
			    parallel > PARALLEL_MAX)
				goto bad_usage;
			i++;
		} else if (!strcmp(o, "--retries")) {
			if (parse_uint_arg(v, &opts.retries))
				goto bad_usage;
			i++;
		} else if (!strcmp(o, "--connect-ms")) {
			if (parse_uint_arg(v, &opts.connect_timeout_ms))
				goto bad_usage;
			i++;
		} else if (!strcmp(o, "--stall-ms")) {
			if (parse_uint_arg(v, &opts.stall_timeout_ms))
				goto bad_usage;
			i++;
		} else if (!strcmp(o, "--request-ms")) {
			if (parse_uint_arg(v, &opts.request_timeout_ms))
				goto bad_usage;
			i++;
		} else {
			goto bad_usage;
		}
	}
	opts.insecure = insecure;
	opts.hosts = mirrors;
	opts.resolve = resolve;
	if (argc - i < 2)
		goto bad_usage;
	cmd = argv[i];
	nargs = argc - i - 2; /* after COMMAND REF */
	if ((!strcmp(cmd, "manifest") && nargs != 0) ||
	    (!strcmp(cmd, "tags") && nargs != 0) ||
	    (!strcmp(cmd, "exists") && nargs != 1) ||
	    ((!strcmp(cmd, "blob") || !strcmp(cmd, "getblob") ||
	      !strcmp(cmd, "push-manifest")) && nargs != 2) ||
	    (!strcmp(cmd, "range") && nargs != 3) ||
	    (!strcmp(cmd, "push-blob") && nargs != 1 && nargs != 2))
		goto bad_usage;
	if (strcmp(cmd, "manifest") && strcmp(cmd, "tags") &&
	    strcmp(cmd, "exists") && strcmp(cmd, "blob") &&
	    strcmp(cmd, "getblob") && strcmp(cmd, "range") &&
	    strcmp(cmd, "push-blob") && strcmp(cmd, "push-manifest"))
		goto bad_usage;
	if (fetch_parse_ref(argv[i + 1], &ref))
		return 2;
	if (!strcmp(cmd, "exists") || !strcmp(cmd, "blob") ||
	    !strcmp(cmd, "getblob") || !strcmp(cmd, "range")) {
		if (get_digest(argv[i + 2], d)) {
			fetch_ref_free(&ref);
			return 2;
		}
		if ((nargs >= 2 && parse_u64_arg(argv[i + 3], &a)) ||
		    (nargs >= 3 && parse_u64_arg(argv[i + 4], &b))) {
			fetch_ref_free(&ref);
			goto bad_usage;
		}
	}
	if (!strncmp(cmd, "push-", 5))
		access = FETCH_PUSH;
	err = registry_open(&ref, &opts, access, &r);
	if (err) {
		fetch_ref_free(&ref);
		return 1;
	}
	rc = 0;
	if (!strcmp(cmd, "manifest")) {
		err = cmd_manifest(r, &ref);
	} else if (!strcmp(cmd, "exists")) {
		err = registry_blob_exists(r, d, &a);
		if (err == 1)
			printf("%" PRIu64 "\n", a);
		else if (err == 0)
			rc = 3;
		err = err < 0 ? err : 0;
	} else if (!strcmp(cmd, "blob")) {
		err = cmd_blob(r, d, a);
	} else if (!strcmp(cmd, "getblob")) {
		err = cmd_getblob(r, d, a);
	} else if (!strcmp(cmd, "range")) {
		err = cmd_range(r, d, a, b, parallel);
	} else if (!strcmp(cmd, "push-blob")) {
		err = cmd_push_blob(r, argv[i + 2], nargs == 2 ? argv[i + 3] : NULL);
	} else if (!strcmp(cmd, "push-manifest")) {
		err = cmd_push_manifest(r, &ref, argv[i + 2], argv[i + 3]);
	} else {
		err = cmd_tags(r);
	}
	if (fflush(stdout) && !err) {
		ferry_err("writing to stdout: %s", strerror(errno));
		err = -EIO;
	}
	if (err)
		rc = 1;
	if (stats) {
		struct fetch_stats st;

		registry_get_stats(r, &st);
		fprintf(stderr,
			"requests=%" PRIu64 " retries=%" PRIu64
			" bytes_down=%" PRIu64 " bytes_up=%" PRIu64 "\n",
			st.requests, st.retries, st.bytes_down, st.bytes_up);
	}
	registry_close(r);
	fetch_ref_free(&ref);
	return rc;
bad_usage:
	usage();
	return 2;
}
