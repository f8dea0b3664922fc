// SPDX-License-Identifier: MIT
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>

#include "../../pkg-base/base.h"
#include "../../pkg-convert/convert.h"
#include "cmd.h"

static void mount_help(void)
{
	printf("Usage: ferry mount --mode local [--cache-dir DIR] IMAGE MOUNTPOINT\n\n"
	       "Mount a ferry image read-only.\n\n"
	       "IMAGE  dir:OUT or oci:PATH[:TAG], an image written by ferry convert\n\n"
	       "Modes:\n"
	       "  local   verify and materialise every blob into an uncompressed\n"
	       "          device file under DIR/devices/, then mount the bootstrap\n"
	       "          with the kernel (file-backed EROFS, one device= per blob).\n"
	       "          No daemon stays running.\n\n"
	       "Options:\n"
	       "  --mode MODE       required; 'local'\n"
	       "  --cache-dir DIR   where device files live (default $FERRY_CACHE_DIR\n"
	       "                    or %s)\n"
	       "  -h, --help        this help\n\n" EXIT_CODES_HELP,
	       FERRY_DEFAULT_CACHE_DIR);
}

int cmd_mount(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "mode", required_argument, NULL, 'm' },
		{ "cache-dir", required_argument, NULL, 'C' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	const char *mode = NULL, *cache_dir = default_cache_dir();
	struct image *img;
	int c, ret;

	while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		switch (c) {
		case 'm':
			mode = optarg;
			break;
		case 'C':
			cache_dir = optarg;
			break;
		case 'h':
			mount_help();
			return EXIT_OK;
		default:
			return usage_error("mount", "unknown option");
		}
	}
	if (argc - optind != 2)
		return usage_error("mount", "expected IMAGE and MOUNTPOINT");
	if (!mode)
		return usage_error("mount", "--mode is required (local)");
	if (strcmp(mode, "local"))
		return usage_error("mount", "unknown mode \"%s\" (this build supports: local)",
				   mode);
	ret = image_open(argv[optind], &img);
	if (ret)
		return ret == -EINVAL ? EXIT_USAGE : EXIT_FAIL;
	ret = image_mount_local(img, cache_dir, argv[optind + 1]);
	image_close(img);
	if (ret) {
		ferry_err("mount %s on %s failed: %s", argv[optind], argv[optind + 1],
			  ferry_strerror(ret));
		return EXIT_FAIL;
	}
	return EXIT_OK;
}

int cmd_umount(int argc, char **argv)
{
	if (argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
		printf("Usage: ferry umount MOUNTPOINT\n\nUnmount a ferry mount.\n\n"
		       EXIT_CODES_HELP);
		return EXIT_OK;
	}
	if (argc != 2)
		return usage_error("umount", "expected MOUNTPOINT");
	if (umount2(argv[1], 0)) {
		ferry_err("umount %s: %s", argv[1], strerror(errno));
		return EXIT_FAIL;
	}
	return EXIT_OK;
}
