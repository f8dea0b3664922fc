// SPDX-License-Identifier: MIT
/* Registry options shared by every command that takes a docker:// image. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../pkg-base/base.h"
#include "../ctl.h"
#include "cmd.h"

const char REGISTRY_OPTIONS_HELP[] =
	"Registry options (docker://[HOST[:PORT]/]REPO[:TAG|@DIGEST] images):\n"
	"  --creds USER:PASS        credentials for every registry; every local\n"
	"                           user sees them in ps: prefer one of the next\n"
	"                           two, or --authfile\n"
	"  --creds-file FILE        read USER:PASS from FILE (one line; refused\n"
	"                           unless only its owner may access it: chmod 600)\n"
	"  --username USER --password-stdin\n"
	"                           read USER's password from standard input\n"
	"                           (as docker login; --creds USER works too)\n"
	"  --authfile FILE          docker config.json with auths / credHelpers\n"
	"                           (default $REGISTRY_AUTH_FILE, then\n"
	"                           $DOCKER_CONFIG/config.json or ~/.docker/config.json)\n"
	"  --tls-verify=BOOL        verify TLS certificates (default true); false\n"
	"                           also allows plain http when TLS fails, for\n"
	"                           anonymous requests only (credentials go over\n"
	"                           plain http to --insecure-registry hosts and\n"
	"                           loopback only)\n"
	"  --ca-file FILE           verify registries against this CA bundle (PEM)\n"
	"  --insecure-registry H    talk plain http to H (HOST[:PORT]); repeatable.\n"
	"                           Loopback registries always use http\n"
	"  --registry-mirror H=URL  read blobs and manifests by digest of H from\n"
	"                           URL first (e.g. a P2P distributor); repeatable.\n"
	"                           The same as a host with capabilities [\"pull\"]\n"
	"  --registry-hosts FILE    mirrors, capabilities and TLS settings per\n"
	"                           registry: containerd's hosts.toml as JSON\n"
	"                           (docs/registries.md); tried in order, then the\n"
	"                           registry itself\n"
	"  --resolve HOST:PORT:ADDR connect to ADDR for HOST:PORT (TLS and the\n"
	"                           Host header still use HOST); repeatable\n"
	"  --retries N              attempts per request (default 5)\n"
	"  --stall-timeout SEC      fail a request after SEC seconds without\n"
	"                           progress (default 30)\n"
	"  --request-timeout SEC    fail a request after SEC seconds plus 1 s per\n"
	"                           MiB it moves (default 60; not whole-blob\n"
	"                           downloads and uploads: the stall timeout\n"
	"                           bounds those)\n"
	"HTTP(S) proxies come from https_proxy / http_proxy / no_proxy.\n";

void regopts_init(struct regopts *r)
{
	memset(r, 0, sizeof(*r));
	fetch_opts_init(&r->fetch);
	r->fetch.insecure = r->insecure;
	r->fetch.hosts = r->hosts;
	r->fetch.resolve = r->resolve;
}

static int add_host(const char **list, size_t *nr, const char *what,
		    const char *arg)
{
	if (*nr + 1 >= REGOPTS_MAX) {
		ferry_err("too many %s options (at most %d)", what, REGOPTS_MAX - 1);
		return -EINVAL;
	}
	list[(*nr)++] = arg;
	return 0;
}

/* A timeout option's @arg (1..3600 seconds) into @ms: 1, or -EINVAL. */
static int parse_timeout(const char *option, const char *arg, unsigned int *ms)
{
	uint64_t v;

	if (parse_size(arg, &v) || v < 1 || v > 3600) {
		ferry_err("%s %s: expected 1..3600 seconds", option, arg);
		return -EINVAL;
	}
	*ms = (unsigned int)v * 1000;
	return 1;
}

/* --registry-mirror H=URL: a host of H that serves digests (pull). */
static int mirror_host(struct regopts *r, const char *arg)
{
	const char *eq = strchr(arg, '=');
	struct fetch_host *h = &r->mirror_hosts[r->nr_mirrors];
	char why[800];
	size_t n = eq ? (size_t)(eq - arg) : 0;

	if (!eq || n >= sizeof(r->mirror_registry[0])) {
		ferry_err("--registry-mirror %s: expected HOST[:PORT]=URL", arg);
		return -EINVAL;
	}
	if (r->nr_mirrors + 1 >= REGOPTS_MAX) {
		ferry_err("too many --registry-mirror options (at most %d)",
			  REGOPTS_MAX - 1);
		return -EINVAL;
	}
	memcpy(r->mirror_registry[r->nr_mirrors], arg, n);
	r->mirror_registry[r->nr_mirrors][n] = '\0';
	*h = (struct fetch_host){
		.registry = r->mirror_registry[r->nr_mirrors],
		.url = eq + 1,
		.capabilities = FETCH_HOST_PULL,
	};
	if (fetch_check_host(h, why, sizeof(why))) {
		ferry_err("--registry-mirror %s: %s", arg, why);
		return -EINVAL;
	}
	r->hosts[r->nr_mirrors++] = h;
	return 1;
}

/* The --registry-hosts file as parsed: a command reads it until it exits. */
static struct {
	struct json_object *json;
	const struct fetch_host *const *hosts;
} hosts_file;

#define HOSTS_FILE_MAX (1u << 20)
_Static_assert(REGOPTS_HOSTS_MAX >= CTL_HOSTS_MAX, "regopts.hosts holds a whole file");

/* --registry-hosts FILE after the --registry-mirror hosts: an exit code. */
static int load_hosts_file(struct regopts *r)
{
	const struct fetch_host *const *p;
	char *text = NULL, err[1024];
	size_t len = 0, n = r->nr_mirrors;
	int ret;

	json_object_put(hosts_file.json);
	ctl_hosts_free(hosts_file.hosts);
	hosts_file.json = NULL;
	hosts_file.hosts = NULL;
	ret = read_file_max(r->hosts_file, HOSTS_FILE_MAX, &text, &len);
	if (ret) {
		ferry_err("--registry-hosts %s: %s", r->hosts_file,
			  ret == -EFBIG || ret == -EINVAL ?
				  "not a regular file of at most 1 MiB" :
				  ferry_strerror(ret));
		return EXIT_FAIL;
	}
	/* One object {"hosts":[…]}, as a mount request's "fetch" carries it. */
	ret = json_parse_object(text, len, &hosts_file.json);
	free(text);
	if (ret) {
		ferry_err("--registry-hosts %s: not a JSON object", r->hosts_file);
		return EXIT_USAGE;
	}
	ret = ctl_hosts_parse(json_field(hosts_file.json, "hosts"),
			      &hosts_file.hosts, err, sizeof(err));
	if (ret) {
		ferry_err("--registry-hosts %s: %s", r->hosts_file,
			  ret == -EINVAL ? err : ferry_strerror(ret));
		return ret == -EINVAL ? EXIT_USAGE : EXIT_FAIL;
	}
	for (p = hosts_file.hosts; *p; p++)
		r->hosts[n++] = *p;
	r->hosts[n] = NULL;
	return EXIT_OK;
}

int regopts_parse(struct regopts *r, int opt, const char *arg)
{
	uint64_t v;

	switch (opt) {
	case REGOPT_CREDS:
		r->fetch.creds = arg;
		return 1;
	case REGOPT_CREDS_FILE:
		r->creds_file = arg;
		return 1;
	case REGOPT_USERNAME:
		r->username = arg;
		return 1;
	case REGOPT_PASSWORD_STDIN:
		r->password_stdin = true;
		return 1;
	case REGOPT_AUTHFILE:
		r->fetch.authfile = arg;
		return 1;
	case REGOPT_TLS_VERIFY:
		if (!arg || !strcmp(arg, "true"))
			r->fetch.tls_verify = true;
		else if (!strcmp(arg, "false"))
			r->fetch.tls_verify = false;
		else {
			ferry_err("--tls-verify=%s: expected true or false", arg);
			return -EINVAL;
		}
		return 1;
	case REGOPT_CA_FILE:
		r->fetch.ca_file = arg;
		return 1;
	case REGOPT_INSECURE:
		if (add_host(r->insecure, &r->nr_insecure, "--insecure-registry", arg))
			return -EINVAL;
		return 1;
	case REGOPT_MIRROR:
		return mirror_host(r, arg);
	case REGOPT_HOSTS:
		r->hosts_file = arg;
		return 1;
	case REGOPT_RESOLVE:
		if (fetch_check_resolve(arg) ||
		    add_host(r->resolve, &r->nr_resolve, "--resolve", arg))
			return -EINVAL;
		return 1;
	case REGOPT_RETRIES:
		if (parse_size(arg, &v) || v < 1 || v > 100) {
			ferry_err("--retries %s: expected 1..100", arg);
			return -EINVAL;
		}
		r->fetch.retries = (unsigned int)v;
		return 1;
	case REGOPT_STALL:
		return parse_timeout("--stall-timeout", arg, &r->fetch.stall_timeout_ms);
	case REGOPT_REQUEST_TIMEOUT:
		return parse_timeout("--request-timeout", arg,
				     &r->fetch.request_timeout_ms);
	default:
		return 0;
	}
}

int regopts_finish(struct regopts *r)
{
	int ret = fetch_creds_from_options(r->fetch.creds, r->creds_file, r->username,
					   r->password_stdin, r->creds, &r->fetch.creds);

	if (ret)
		return ret == -EINVAL ? EXIT_USAGE : EXIT_FAIL;
	return r->hosts_file ? load_hosts_file(r) : EXIT_OK;
}
