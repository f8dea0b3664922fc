/* SPDX-License-Identifier: MIT */
/*
 * erofs_mount IMAGE TARGET [OPTIONS]: mount an EROFS image file read-only
 * with mount(2), file-backed. util-linux mount(8) would set up a loop
 * device instead, which cannot be combined with device= regular files.
 * OPTIONS is passed as the mount data, e.g. "device=/b1,device=/b2".
 * Test helper for images made by other tools (mkfs.erofs).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>

int main(int argc, char **argv)
{
	const char *opts = argc > 3 ? argv[3] : NULL;

	if (argc < 3 || argc > 4) {
		fprintf(stderr,
			"usage: erofs_mount IMAGE TARGET [device=PATH,...]\n");
		return 2;
	}
	if (mount(argv[1], argv[2], "erofs", MS_RDONLY, opts) < 0) {
		fprintf(stderr, "erofs_mount: mount %s on %s (%s): %s\n",
			argv[1], argv[2], opts ? opts : "no options",
			strerror(errno));
		return 1;
	}
	return 0;
}
