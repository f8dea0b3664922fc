/* SPDX-License-Identifier: MIT */
/* ferry CLI: one function per subcommand; each returns an exit code. */
#ifndef FERRY_CMD_H
#define FERRY_CMD_H

#define EXIT_OK 0
#define EXIT_FAIL 1
#define EXIT_USAGE 2

#define FERRY_VERSION "0.1.0"
#define FERRY_DEFAULT_CACHE_DIR "/var/lib/ferry/cache"

#define EXIT_CODES_HELP                                                        \
	"Exit status: 0 success, 1 failure (I/O error, corrupt or invalid "     \
	"input, failed check), 2 usage error.\n"

int cmd_convert(int argc, char **argv);
int cmd_mount(int argc, char **argv);
int cmd_umount(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_check(int argc, char **argv);

/* Print "ferry CMD: MSG" and a hint to --help; returns EXIT_USAGE. */
int usage_error(const char *cmd, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* Default cache dir: $FERRY_CACHE_DIR or FERRY_DEFAULT_CACHE_DIR. */
const char *default_cache_dir(void);

#endif
