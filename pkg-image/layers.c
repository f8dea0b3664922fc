// SPDX-License-Identifier: MIT
/*
 * Mounting native EROFS layer images (application/vnd.erofs.layer.v1):
 * every layer is a standalone EROFS image, mounted file-backed through a
 * descriptor of the file whose sha256 was just checked, so the kernel
 * reads exactly the verified bytes; pkg-meta walks it before the kernel
 * sees it (images.h: the kernel parses what ferry walked). The layers are
 * detached mounts (fsmount) handed to overlayfs as /proc/self/fd/N
 * lowerdirs, top layer first; overlayfs keeps private clones of them, so
 * nothing but the overlay is left in the mount table and `ferry umount`
 * has one mount to remove.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

#define LAYERS_DIR "erofs-layers"
#define READ_BUF (1u << 20)

static int verify_fd(int fd, const struct oci_descriptor *d, const char *name)
{
	struct sha256_hasher *h = NULL;
	uint8_t digest[32], *buf = malloc(READ_BUF);
	struct stat st;
	uint64_t off = 0;
	int ret = buf ? sha256_hasher_new(&h) : -ENOMEM;

	if (!ret && (fstat(fd, &st) || !S_ISREG(st.st_mode) ||
		     (uint64_t)st.st_size != d->size)) {
		ferry_err("layer %s: not a regular file of the %llu bytes the manifest says: the layout or cache is corrupt; pull or convert the image again",
			  name, (unsigned long long)d->size);
		ret = -EFSCORRUPTED;
	}
	while (!ret && off < d->size) {
		size_t k = (size_t)MIN(d->size - off, (uint64_t)READ_BUF);

		ret = pread_full(fd, buf, k, off);
		if (!ret)
			sha256_hasher_update(h, buf, k);
		off += k;
	}
	if (!ret) {
		sha256_hasher_final(h, digest);
		if (memcmp(digest, d->digest, 32)) {
			ferry_err("layer %s: its bytes do not match the digest: the layout or cache is corrupt; pull or convert the image again",
				  name);
			ret = -EFSCORRUPTED;
		}
	}
	sha256_hasher_free(h);
	free(buf);
	return ret;
}

/* A registry layer into @cache_dir/erofs-layers/<hex> (kept for later mounts). */
static int download(struct oci_image *img, const struct oci_descriptor *d,
		    const char *cache_dir, const char *hex, char **path)
{
	struct atomic_file af = { .fd = -1, .dir_fd = -1 };
	struct fetch_stream *fs = NULL;
	uint8_t *buf = NULL;
	char *dir = NULL;
	uint64_t off = 0;
	int ret;

	if (asprintf(&dir, "%s/%s", cache_dir, LAYERS_DIR) < 0 ||
	    asprintf(path, "%s/%s", dir, hex) < 0) {
		free(dir);
		return -ENOMEM;
	}
	ret = access(*path, F_OK) ? 0 : 1; /* present: verified when opened */
	if (!ret)
		ret = mkdir_p(dir, 0700);
	if (!ret)
		ret = atomic_file_create(&af, dir, hex, 0600);
	if (!ret)
		ret = registry_open_stream(img->remote, d->digest, d->size, &fs);
	if (!ret && !(buf = malloc(READ_BUF)))
		ret = -ENOMEM;
	while (!ret) {
		ssize_t n = fetch_stream_read(fs, buf, READ_BUF);

		if (n <= 0) {
			ret = (int)n;
			break;
		}
		ret = pwrite_full(af.fd, buf, (size_t)n, off);
		off += (uint64_t)n;
	}
	if (!ret)
		ret = atomic_file_commit(&af, hex);
	atomic_file_discard(&af);
	fetch_stream_close(fs);
	free(buf);
	free(dir);
	return ret > 0 ? 0 : ret;
}

static int walk_nothing(void *ctx, const char *path, const struct meta_stat *st)
{
	(void)ctx;
	(void)path;
	(void)st;
	return 0;
}

/* Layer @i opened, verified, walked and mounted detached into *@mfd. */
static int mount_layer(struct oci_image *img, uint32_t i, const char *cache_dir,
		       unsigned long flags, int *mfd)
{
	const struct oci_descriptor *d = &img->layers[i];
	char name[DIGEST_STRING_SIZE], fdpath[32], *path = NULL;
	struct meta_image *mi = NULL;
	int fd = -1, ret;

	digest_format(d->digest, name);
	ret = img->remote ? download(img, d, cache_dir, name + 7, &path) :
			    oci_blob_path(img->layout, d->digest, &path);
	if (!ret) {
		fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
		if (fd < 0) {
			ret = -errno;
			ferry_err("layer %s: %s: %s", name, path, ferry_strerror(ret));
		}
	}
	if (!ret)
		ret = verify_fd(fd, d, name);
	snprintf(fdpath, sizeof(fdpath), "/proc/self/fd/%d", fd);
	if (!ret) {
		ret = meta_image_open(fdpath, &mi);
		if (!ret)
			ret = meta_walk(mi, walk_nothing, NULL);
		if (ret)
			ferry_err("layer %s: refused before the kernel sees it: ferry mounts the EROFS layouts it reads (plain, or LZ4 / zstd as ferry writes them)",
				  name);
	}
	if (!ret)
		ret = meta_kernel_mount_detached(fdpath, flags, mfd);
	meta_image_close(mi);
	if (fd >= 0)
		close(fd);
	free(path);
	return ret;
}

static bool is_layers_image(const struct oci_image *img)
{
	if (!img->nr_layers)
		return false;
	for (uint32_t i = 0; i < img->nr_layers; i++)
		if (strcmp(img->layers[i].media_type, EROFS_LAYER_MEDIA_TYPE))
			return false;
	return true;
}

/* lowerdir=top:…:bottom of the detached mounts, by descriptor. */
static int overlay_mount(const int *mfds, uint32_t nr, const char *target,
			 unsigned long flags)
{
	char *opts = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&opts, &len);
	int ret = 0;

	if (!f)
		return -ENOMEM;
	fputs("lowerdir=", f);
	for (uint32_t i = nr; i-- > 0;)
		fprintf(f, "/proc/self/fd/%d%s", mfds[i], i ? ":" : "");
	if (fclose(f) || !opts) {
		free(opts);
		return -ENOMEM;
	}
	if (mount(IMAGE_LAYERS_SOURCE, target, "overlay",
		  MS_RDONLY | (flags & (MS_NOSUID | MS_NODEV)), opts) < 0) {
		ret = -errno;
		ferry_err("mount: overlay of %u EROFS layers on %s: %s", nr,
			  target, ferry_strerror(ret));
	}
	free(opts);
	return ret;
}

int image_mount_erofs_layers(const char *ref, const struct fetch_opts *fopts,
			     const char *cache_dir, const char *mountpoint,
			     unsigned long flags)
{
	struct image_ref r = { 0 };
	struct oci_image img = { 0 };
	char *target = NULL;
	int *mfds = NULL, ret;
	uint32_t nr = 0;

	if (image_ref_parse(ref, IMAGE_ACCEPT(IMAGE_OCI) | IMAGE_ACCEPT(IMAGE_DOCKER),
			    NULL, &r))
		return 1;
	ret = oci_image_open(&r, NULL, fopts, &img);
	if (ret || !is_layers_image(&img)) {
		/* Not ours: image_open names whatever is wrong with it. */
		ret = 1;
		goto out;
	}
	target = realpath(mountpoint, NULL);
	if (!target) {
		ret = -errno;
		ferry_err("mount point %s: %s", mountpoint, ferry_strerror(ret));
		goto out;
	}
	ret = image_check_not_mounted(target);
	if (!ret && !(mfds = calloc(img.nr_layers, sizeof(*mfds))))
		ret = -ENOMEM;
	for (; !ret && nr < img.nr_layers; nr++)
		ret = mount_layer(&img, nr, cache_dir, flags, &mfds[nr]);
	if (!ret)
		ret = nr == 1 ? meta_mount_attach(mfds[0], target) :
				overlay_mount(mfds, nr, target, flags);
	for (uint32_t i = 0; i < nr; i++)
		if (mfds[i] >= 0)
			close(mfds[i]);
out:
	free(mfds);
	free(target);
	oci_image_free(&img);
	image_ref_free(&r);
	return ret;
}
