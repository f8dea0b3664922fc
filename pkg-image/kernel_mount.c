// SPDX-License-Identifier: MIT
/*
 * The kernel mount of an image from the chunk cache: local mode (every
 * chunk made present first, the blobs pinned while mounted) and the
 * fanotify mode's mount of the same files; ferry's own mounts recognised
 * in the mount table.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache.h"

bool image_mount_is_ferry(const struct mount_entry *mi)
{
	return !strcmp(mi->fstype, "erofs") || !strcmp(mi->fstype, IMAGE_FUSE_FSTYPE) ||
	       (!strcmp(mi->fstype, "overlay") && !strcmp(mi->source, IMAGE_LAYERS_SOURCE));
}

/* Refuse to stack a mount on a ferry mount: the one below would be hidden. */
int image_check_not_mounted(const char *target)
{
	struct mount_entry mi;

	if (mountinfo_find(target, &mi) || !image_mount_is_ferry(&mi))
		return 0;
	ferry_err("mount point %s already holds a ferry mount (%s): ferry umount it first",
		  target, mi.fstype);
	return -EBUSY;
}

/* Keep the blobs the kernel now holds from gc while it does. */
static void pin_blobs(const struct image *img, const char *cache_dir, const char *target)
{
	uint8_t (*digests)[BLOB_DIGEST_SIZE] = calloc(img->blobs.nr_blobs + 1, sizeof(*digests));
	struct statx stx;
	uint32_t i;

	if (!digests || statx(AT_FDCWD, target, AT_SYMLINK_NOFOLLOW, STATX_MNT_ID, &stx) ||
	    !(stx.stx_mask & STATX_MNT_ID)) {
		ferry_warn("%s: cannot record the mount in the chunk cache: gc may remove its blobs while it is mounted",
			   target);
	} else {
		for (i = 0; i < img->blobs.nr_blobs; i++)
			memcpy(digests[i], img->blobs.blobs[i].digest, BLOB_DIGEST_SIZE);
		blob_cache_pin_mount(cache_dir, target, stx.stx_mnt_id,
				     (const uint8_t (*)[BLOB_DIGEST_SIZE])digests,
				     img->blobs.nr_blobs);
	}
	free(digests);
}

unsigned long image_mount_flags(bool suid, bool dev)
{
	return (suid ? 0 : MS_NOSUID) | (dev ? 0 : MS_NODEV);
}

int image_cache_kernel_mount(struct image_cache *ic, const char *cache_dir,
			     const char *target, unsigned long flags)
{
	struct image *img = ic->img;
	char (*devs)[32] = NULL, boot[32];
	const char **devp = NULL;
	uint32_t i;
	int ret;

	if (img->erofs_layers)
		return image_layers_kernel_mount(ic, target, flags);
	devs = calloc(ic->nr_blobs + 1, sizeof(*devs));
	devp = calloc(ic->nr_blobs + 1, sizeof(*devp));
	ret = devs && devp ? image_bootstrap_file(img, cache_dir) : -ENOMEM;
	if (ret)
		goto out;
	/*
	 * The kernel opens exactly the files verified and filled here: the
	 * descriptors we hold, through /proc/self/fd, not a path that
	 * could have been replaced meanwhile.
	 */
	snprintf(boot, sizeof(boot), IMAGE_FD_SOURCE "%d", img->bootstrap_fd);
	for (i = 0; i < ic->nr_blobs; i++) {
		snprintf(devs[i], sizeof(devs[i]), IMAGE_FD_SOURCE "%d",
			 blob_cache_data_fd(ic->blobs[i]));
		devp[i] = devs[i];
	}
	ret = meta_kernel_mount(boot, devp, ic->nr_blobs, target, flags);
out:
	free(devp);
	free(devs);
	return ret;
}

int image_mount_local(struct image *img, const char *cache_dir,
		      const char *mountpoint, unsigned long flags)
{
	struct ferry_progress progress = { 0 };
	struct image_cache *ic = NULL;
	char *target = realpath(mountpoint, NULL);
	struct stat st;
	int ret;

	if (!target || stat(target, &st) || !S_ISDIR(st.st_mode)) {
		ferry_err("mount point %s: %s", mountpoint,
			  target ? "not a directory" : strerror(errno));
		free(target);
		return -ENOTDIR;
	}
	ret = image_check_not_mounted(target);
	/* The kernel parses what ferry walked, never more (image.h). */
	if (!ret)
		ret = image_validate_metadata(img);
	if (!ret)
		ret = image_cache_open(img, cache_dir, &ic);
	if (!ret) {
		ferry_progress_begin(&progress, img->ref, 0);
		ret = image_cache_prefetch_blobs(ic, &progress, NULL);
		ferry_progress_end(&progress);
	}
	if (!ret)
		ret = image_cache_kernel_mount(ic, cache_dir, target, flags);
	if (!ret)
		pin_blobs(img, cache_dir, target);
	image_cache_close(ic);
	free(target);
	return ret;
}
