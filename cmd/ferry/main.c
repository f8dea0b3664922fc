// SPDX-License-Identifier: MIT
/* ferry: convert container images to EROFS + chunk blobs, and mount them. */
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../pkg-base/base.h"
#include "../../pkg-convert/convert.h"
#include "cmd.h"

static const struct {
	const char *name;
	int (*run)(int argc, char **argv);
	const char *summary;
} commands[] = {
	{ "convert", cmd_convert, "convert a directory, tar, OCI layout or registry image" },
	{ "index", cmd_index, "attach a ferry index to an image, to mount it lazily as it is" },
	{ "mount", cmd_mount, "mount a ferry image (kernel, or lazily through FUSE)" },
	{ "umount", cmd_umount, "unmount a ferry mount" },
	{ "inspect", cmd_inspect, "show an image's superblock, blobs, tree or a file's chunks" },
	{ "check", cmd_check, "verify an image's metadata and every chunk digest" },
	{ "cache", cmd_cache, "list, garbage-collect or prune the chunk cache" },
	{ "daemon", cmd_daemon, "show or stop the ferryd serving lazy mounts" },
	{ "metrics", cmd_metrics, "print ferryd's metrics (Prometheus text format)" },
};

static void print_help(void)
{
	size_t i;

	printf("Usage: ferry [-v|-q] COMMAND [OPTIONS] ARGS...\n\n"
	       "ferry turns container images into an EROFS metadata image (the\n"
	       "bootstrap) plus chunk-deduplicated data blobs, pushes and pulls\n"
	       "them through OCI registries, and mounts them.\n\n"
	       "Commands:\n");
	for (i = 0; i < ARRAY_SIZE(commands); i++)
		printf("  %-9s %s\n", commands[i].name, commands[i].summary);
	printf("\nGlobal options:\n"
	       "  -v, --verbose   more log output (repeat for debug)\n"
	       "  -q, --quiet     errors only, no progress\n"
	       "  -h, --help      this help; 'ferry COMMAND --help' for a command\n"
	       "  --version       print the release and the image formats it writes\n"
	       "                  and reads\n\n" EXIT_CODES_HELP
	       "'ferry daemon status' exits 3 when no ferryd runs.\n");
}

int usage_error(const char *cmd, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "ferry %s: ", cmd);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\nTry 'ferry %s --help'.\n", cmd);
	return EXIT_USAGE;
}

const char *default_cache_dir(void)
{
	const char *dir = getenv("FERRY_CACHE_DIR");

	return dir && *dir ? dir : FERRY_DEFAULT_CACHE_DIR;
}

int main(int argc, char **argv)
{
	int i;
	size_t c;

	ferry_progress_enabled = true;
	for (i = 1; i < argc && argv[i][0] == '-'; i++) {
		if (!strcmp(argv[i], "-v") || !strcmp(argv[i], "--verbose")) {
			ferry_log_level++;
		} else if (!strcmp(argv[i], "-q") || !strcmp(argv[i], "--quiet")) {
			ferry_log_level = FERRY_LOG_ERR;
			ferry_progress_enabled = false;
		} else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			print_help();
			return EXIT_OK;
		} else if (!strcmp(argv[i], "--version")) {
			const char *inflater = input_inflater();

			if (!inflater)
				return EXIT_USAGE;
			printf("ferry %s\n", FERRY_VERSION);
			image_print_formats(stdout);
			printf("gzip inflater: %s\n", inflater);
			return EXIT_OK;
		} else {
			fprintf(stderr, "ferry: unknown option %s\nTry 'ferry --help'.\n",
				argv[i]);
			return EXIT_USAGE;
		}
	}
	if (i == argc) {
		print_help();
		return EXIT_USAGE;
	}
	if (ferry_log_level > FERRY_LOG_DEBUG)
		ferry_log_level = FERRY_LOG_DEBUG;
	for (c = 0; c < ARRAY_SIZE(commands); c++)
		if (!strcmp(argv[i], commands[c].name))
			return commands[c].run(argc - i, argv + i);
	fprintf(stderr, "ferry: unknown command \"%s\"\nTry 'ferry --help'.\n",
		argv[i]);
	return EXIT_USAGE;
}
