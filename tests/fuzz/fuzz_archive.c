// SPDX-License-Identifier: MIT
/*
 * libFuzzer target for the oci-archive: and docker-archive: readers
 * (pkg-convert/archive.c): the input is the archive file, opened as each
 * kind. Member names, symlink and hardlink members, docker save's
 * manifest.json and config, an OCI layout's index.json and manifests
 * must be refused cleanly or resolve to layers inside the archive.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "../../pkg-base/base.h"
#include "../../pkg-convert/internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static char path[64];
	static const enum image_transport kinds[] = {
		IMAGE_OCI_ARCHIVE, IMAGE_DOCKER_ARCHIVE,
	};
	int fd;

	ferry_log_level = -1;
	if (!path[0])
		snprintf(path, sizeof(path), "/dev/shm/ferry-fuzz-archive.%d", (int)getpid());
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0 || write_full(fd, data, size))
		abort();
	close(fd);
	for (size_t k = 0; k < ARRAY_SIZE(kinds); k++) {
		struct image_ref ref = { .transport = kinds[k], .path = path };
		struct oci_image img;
		int ret = archive_image_open(&ref, k ? "linux/amd64" : OCI_PLATFORMS, &img);

		if (ret && ret != -EFSCORRUPTED && ret != -ENOENT && ret != -EFBIG &&
		    ret != -EINVAL && ret != -ENOMEM)
			abort();
		if (!ret && (!img.archive || (img.nr_layers && !img.manifest)))
			abort();
		if (!ret)
			convert_close_image(&img);
	}
	unlink(path);
	return 0;
}
