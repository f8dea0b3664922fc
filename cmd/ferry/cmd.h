/* SPDX-License-Identifier: MIT */
/* ferry CLI: one function per subcommand; each returns an exit code. */
#ifndef FERRY_CMD_H
#define FERRY_CMD_H

#include "../../pkg-fetch/fetch.h"

#define EXIT_OK 0
#define EXIT_FAIL 1
#define EXIT_USAGE 2

#define FERRY_DEFAULT_CACHE_DIR "/var/lib/ferry/cache"

#define EXIT_CODES_HELP                                                        \
	"Exit status: 0 success, 1 failure (I/O error, corrupt or invalid\n"   \
	"input, failed check), 2 usage error.\n"

int cmd_convert(int argc, char **argv);
int cmd_index(int argc, char **argv);
int cmd_mount(int argc, char **argv);
int cmd_umount(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_check(int argc, char **argv);
int cmd_cache(int argc, char **argv);
int cmd_daemon(int argc, char **argv);
int cmd_metrics(int argc, char **argv);

/*
 * Registry options (regopts.c): REGISTRY_LONGOPTS goes into a command's
 * option table; regopts_parse returns 1 for one of its options, 0 for
 * another option, or -EINVAL after a message. After the options,
 * regopts_finish reads --creds-file or --password-stdin into fetch.creds,
 * checks how the credential options combine, and reads --registry-hosts
 * (kept until the process exits) into fetch.hosts after the
 * --registry-mirror hosts: an exit code.
 */
enum {
	REGOPT_CREDS = 0x1000,
	REGOPT_AUTHFILE,
	REGOPT_TLS_VERIFY,
	REGOPT_CA_FILE,
	REGOPT_INSECURE,
	REGOPT_MIRROR,
	REGOPT_RETRIES,
	REGOPT_STALL,
	REGOPT_RESOLVE,
	REGOPT_REQUEST_TIMEOUT,
	REGOPT_CREDS_FILE,
	REGOPT_USERNAME,
	REGOPT_PASSWORD_STDIN,
	REGOPT_HOSTS,
};
#define REGISTRY_LONGOPTS                                                       \
	{ "creds", required_argument, NULL, REGOPT_CREDS },                     \
	{ "authfile", required_argument, NULL, REGOPT_AUTHFILE },               \
	{ "tls-verify", optional_argument, NULL, REGOPT_TLS_VERIFY },           \
	{ "ca-file", required_argument, NULL, REGOPT_CA_FILE },                 \
	{ "insecure-registry", required_argument, NULL, REGOPT_INSECURE },      \
	{ "registry-mirror", required_argument, NULL, REGOPT_MIRROR },          \
	{ "retries", required_argument, NULL, REGOPT_RETRIES },                 \
	{ "stall-timeout", required_argument, NULL, REGOPT_STALL },             \
	{ "resolve", required_argument, NULL, REGOPT_RESOLVE },                 \
	{ "request-timeout", required_argument, NULL, REGOPT_REQUEST_TIMEOUT }, \
	{ "creds-file", required_argument, NULL, REGOPT_CREDS_FILE },           \
	{ "username", required_argument, NULL, REGOPT_USERNAME },               \
	{ "password-stdin", no_argument, NULL, REGOPT_PASSWORD_STDIN },         \
	{ "registry-hosts", required_argument, NULL, REGOPT_HOSTS }
#define REGOPTS_MAX 17
#define REGOPTS_HOSTS_MAX 64 /* --registry-hosts entries (CTL_HOSTS_MAX) */

struct regopts {
	struct fetch_opts fetch;
	const char *insecure[REGOPTS_MAX]; /* NULL-terminated */
	const char *resolve[REGOPTS_MAX];
	size_t nr_insecure, nr_mirrors, nr_resolve; /* nr_mirrors: --registry-mirror */
	const char *hosts_file;           /* --registry-hosts */
	/* fetch.hosts: the --registry-mirror hosts, then the file's. */
	struct fetch_host mirror_hosts[REGOPTS_MAX];
	char mirror_registry[REGOPTS_MAX][256];
	const struct fetch_host *hosts[REGOPTS_MAX + REGOPTS_HOSTS_MAX + 1];
	const char *creds_file, *username;
	bool password_stdin;
	char creds[FETCH_CREDS_MAX + 1]; /* read by regopts_finish */
};
extern const char REGISTRY_OPTIONS_HELP[];
void regopts_init(struct regopts *r);
int regopts_parse(struct regopts *r, int opt, const char *arg);
int regopts_finish(struct regopts *r);

/* Print "ferry CMD: MSG" and a hint to --help; returns EXIT_USAGE. */
int usage_error(const char *cmd, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* Default cache dir: $FERRY_CACHE_DIR or FERRY_DEFAULT_CACHE_DIR. */
const char *default_cache_dir(void);

#endif
