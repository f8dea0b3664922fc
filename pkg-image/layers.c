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
#include <json-c/json.h>
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

	*mfd = -1;
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

bool oci_is_layers_image(const struct oci_image *img)
{
	if (!img->nr_layers)
		return false;
	for (uint32_t i = 0; i < img->nr_layers; i++)
		if (strcmp(img->layers[i].media_type, EROFS_LAYER_MEDIA_TYPE))
			return false;
	return true;
}

/* ------------------------------------------------------------------ */
/* Range tables (image.h, docs/FORMAT.md 1d)                           */
/* ------------------------------------------------------------------ */

int image_layer_ranges_encode(uint64_t image_bytes, uint64_t meta_bytes,
			      const uint8_t (*range_sha256)[32], uint8_t **buf,
			      size_t *len)
{
	uint64_t nr = DIV_ROUND_UP(image_bytes, LAYER_RANGE_SIZE);
	uint8_t *p;

	if (nr > (LAYER_RANGES_MAX - LAYER_RANGES_HEADER) / 32)
		return -EFBIG;
	*len = LAYER_RANGES_HEADER + (size_t)nr * 32;
	p = *buf = calloc(1, *len);
	if (!p)
		return -ENOMEM;
	memcpy(p, LAYER_RANGES_MAGIC, 8);
	put_le32(p + 8, LAYER_RANGE_SIZE);
	put_le32(p + 12, (uint32_t)nr);
	put_le64(p + 16, image_bytes);
	put_le64(p + 24, meta_bytes);
	memcpy(p + LAYER_RANGES_HEADER, range_sha256, (size_t)nr * 32);
	return 0;
}

int image_layer_ranges_decode(const void *table, size_t len, uint64_t offset,
			      const uint8_t digest[32], struct blob_info *b,
			      uint64_t *meta_bytes)
{
	const uint8_t *buf = table;
	char name[DIGEST_STRING_SIZE];
	uint32_t range = len >= LAYER_RANGES_HEADER ? get_le32(buf + 8) : 0;
	uint32_t nr = len >= LAYER_RANGES_HEADER ? get_le32(buf + 12) : 0;
	uint64_t image_bytes = len >= LAYER_RANGES_HEADER ? get_le64(buf + 16) : 0;

	*meta_bytes = len >= LAYER_RANGES_HEADER ? get_le64(buf + 24) : 0;
	digest_format(digest, name);
	if (len < LAYER_RANGES_HEADER || memcmp(buf, LAYER_RANGES_MAGIC, 8) ||
	    range < META_BLOCK_SIZE || range > BLOB_CHUNK_MAX || (range & (range - 1)) ||
	    image_bytes != offset || !image_bytes || image_bytes % META_BLOCK_SIZE ||
	    nr != DIV_ROUND_UP(image_bytes, range) ||
	    len != LAYER_RANGES_HEADER + (size_t)nr * 32 ||
	    *meta_bytes < META_BLOCK_SIZE || *meta_bytes > image_bytes ||
	    *meta_bytes % META_BLOCK_SIZE || *meta_bytes > FERRY_BOOTSTRAP_MAX) {
		ferry_err("layer %s: its range table is malformed: the image is corrupt; convert it again",
			  name);
		return -EFSCORRUPTED;
	}
	b->chunks = calloc(nr, sizeof(*b->chunks));
	if (!b->chunks)
		return -ENOMEM;
	memcpy(b->digest, digest, 32);
	b->uncompressed_size = image_bytes;
	b->table_offset = image_bytes;
	b->nr_chunks = nr;
	for (uint32_t i = 0; i < nr; i++) {
		struct blob_chunk *c = &b->chunks[i];

		c->uoff = c->coff = (uint64_t)i * range;
		c->usize = c->csize = c->frame_usize =
			(uint32_t)MIN((uint64_t)range, image_bytes - c->uoff);
		c->codec = BLOB_CODEC_NONE;
		memcpy(c->sha256, buf + LAYER_RANGES_HEADER + (size_t)i * 32, 32);
	}
	/* Recorded in the chunk cache as ferry's blob index records blobs:
	 * its size there is not the layer's (the descriptor has that). */
	return blob_info_as_table(b);
}

static int parse_offset(const char *s, uint64_t *out)
{
	char *end;

	if (!s || *s < '0' || *s > '9')
		return -EINVAL;
	errno = 0;
	*out = strtoull(s, &end, 10);
	return errno || *end ? -EINVAL : 0;
}

/* Layer @i's range table: read where the layer is, checked, decoded into blob @i. */
static int load_ranges(struct image *img, const struct oci_image *oci,
		       struct json_object *desc, uint32_t i)
{
	const struct oci_descriptor *d = &oci->layers[i];
	const char *off_s = oci_annotation(desc, LAYER_RANGES_OFFSET_ANNOTATION);
	const char *dig_s = oci_annotation(desc, LAYER_RANGES_DIGEST_ANNOTATION);
	char name[DIGEST_STRING_SIZE];
	uint8_t want[32], got[32], *buf = NULL;
	struct blob_source src;
	uint64_t off = 0;
	size_t len = 0;
	int ret;

	digest_format(d->digest, name);
	if (!off_s && !dig_s) {
		ferry_err("%s: layer %u (%s) has no range table (written by another tool or an older ferry), so it cannot be verified piece by piece: mount it with --mode local, or convert the image again with ferry",
			  img->ref, i, name);
		return -EOPNOTSUPP;
	}
	if (parse_offset(off_s, &off) || !dig_s || digest_parse(dig_s, want) ||
	    off >= d->size || d->size - off > LAYER_RANGES_MAX) {
		ferry_err("%s: layer %u (%s): malformed range table annotations", img->ref,
			  i, name);
		return -EFSCORRUPTED;
	}
	len = (size_t)(d->size - off);
	buf = malloc(len);
	ret = buf ? image_blob_source(img, i, &src) : -ENOMEM;
	if (!ret) {
		ret = src.read(src.ctx, off, buf, len);
		if (ret)
			ferry_err("layer %s: cannot read its range table: %s", name,
				  ferry_strerror(ret));
	}
	if (!ret) {
		sha256_buf(buf, len, got);
		if (memcmp(got, want, 32)) {
			ferry_err("layer %s: its range table does not match the manifest's digest: the layer is corrupt",
				  name);
			ret = -EFSCORRUPTED;
		}
	}
	if (!ret)
		ret = image_layer_ranges_decode(buf, len, off, d->digest,
						&img->blobs.blobs[i], &img->layer_meta[i]);
	free(buf);
	return ret;
}

int image_open_layers(struct image *img, struct oci_image *oci)
{
	uint32_t n = oci->nr_layers;
	struct json_object *layers = NULL;
	int ret = 0;

	img->erofs_layers = true;
	memcpy(img->image_digest, oci->manifest_desc.digest, BLOB_DIGEST_SIZE);
	memcpy(img->config_digest, oci->config.digest, BLOB_DIGEST_SIZE);
	snprintf(img->compression, sizeof(img->compression), "erofs-layers");
	img->remote = oci->remote;
	oci->remote = NULL;
	img->blobs.blobs = calloc(n + 1, sizeof(*img->blobs.blobs));
	img->layer_meta = calloc(n + 1, sizeof(*img->layer_meta));
	img->blob_paths = calloc(n + 1, sizeof(char *));
	if (!img->blobs.blobs || !img->layer_meta || !img->blob_paths ||
	    (oci->layout && !(img->dir = strdup(oci->layout))))
		return -ENOMEM;
	img->blobs.nr_blobs = n;
	/* Each blob is read where its layer is, by digest and path. */
	for (uint32_t i = 0; !ret && i < n; i++) {
		memcpy(img->blobs.blobs[i].digest, oci->layers[i].digest, 32);
		if (oci->layout)
			ret = oci_blob_path(oci->layout, oci->layers[i].digest,
					    &img->blob_paths[i]);
	}
	if (!ret)
		ret = image_blob_sources_init(img);
	json_object_object_get_ex(oci->manifest, "layers", &layers);
	for (uint32_t i = 0; !ret && i < n; i++)
		ret = load_ranges(img, oci, json_object_array_get_idx(layers, i), i);
	return ret;
}

struct units {
	struct image_span *v;
	uint32_t n, cap;
};

/* Notes the span of the pclusters of a file the kernel decompresses. */
static int note_unit(void *ctx, const char *path, const struct meta_stat *st)
{
	struct units *u = ctx;
	struct image_span *v;

	(void)path;
	if (!st->compressed || st->zblk_end <= st->zblk_first)
		return 0; /* (a fragment: the packed inode's span holds it) */
	if (u->n == u->cap) {
		v = reallocarray(u->v, u->cap ? 2 * u->cap : 64, sizeof(*v));
		if (!v)
			return -ENOMEM;
		u->v = v;
		u->cap = u->cap ? 2 * u->cap : 64;
	}
	u->v[u->n++] = (struct image_span){ (uint64_t)st->zblk_first * META_BLOCK_SIZE,
					    (uint64_t)(st->zblk_end - st->zblk_first) *
						    META_BLOCK_SIZE };
	return 0;
}

static int span_cmp(const void *a, const void *b)
{
	const struct image_span *x = a, *y = b;

	return x->off < y->off ? -1 : x->off > y->off;
}

/* Sorted, overlapping spans merged (a file with full indexes may
 * interleave its pclusters with another's: then they are one unit). */
static uint32_t units_merge(struct image_span *v, uint32_t n)
{
	uint32_t k = 0;

	if (!n)
		return 0; /* v is NULL: qsort must not see it */
	qsort(v, n, sizeof(*v), span_cmp);
	for (uint32_t i = 0; i < n; i++) {
		if (k && v[i].off < v[k - 1].off + v[k - 1].len)
			v[k - 1].len = MAX(v[k - 1].off + v[k - 1].len,
					   v[i].off + v[i].len) - v[k - 1].off;
		else
			v[k++] = v[i];
	}
	return k;
}

int image_cache_walk_layers(struct image_cache *ic)
{
	struct image *img = image_cache_img(ic);
	uint32_t n = img->blobs.nr_blobs;
	int ret = 0;

	if (!img->layer_units) {
		img->layer_units = calloc(n + 1, sizeof(*img->layer_units));
		img->nr_layer_units = calloc(n + 1, sizeof(*img->nr_layer_units));
		if (!img->layer_units || !img->nr_layer_units)
			return -ENOMEM;
	}
	for (uint32_t i = 0; !ret && i < img->blobs.nr_blobs; i++) {
		const struct blob_info *b = &img->blobs.blobs[i];
		size_t head = (size_t)img->layer_meta[i];
		struct meta_image *mi = NULL;
		uint8_t *buf = malloc(head);
		char name[DIGEST_STRING_SIZE];
		struct units u = { 0 };
		struct meta_super sb;
		struct meta_stat st;

		digest_format(b->digest, name);
		ret = buf ? image_cache_fill(ic, i, 0, head) : -ENOMEM;
		if (!ret)
			ret = pread_full(image_cache_data_fd(ic, i), buf, head, 0);
		if (!ret) {
			ret = meta_image_open_head(buf, head, b->uncompressed_size, &mi);
			if (!ret)
				ret = meta_walk(mi, note_unit, &u);
			/* Fragments are read through the packed inode's pclusters. */
			if (!ret)
				meta_get_super(mi, &sb);
			if (!ret && sb.packed_nid)
				ret = meta_getattr(mi, sb.packed_nid, &st);
			if (!ret && sb.packed_nid)
				ret = note_unit(&u, NULL, &st);
			if (ret)
				ferry_err("layer %s: refused before the kernel sees it: its metadata is invalid or not in the first %zu bytes its range table names",
					  name, head);
		}
		meta_image_close(mi);
		free(buf);
		free(img->layer_units[i]);
		img->layer_units[i] = u.v;
		img->nr_layer_units[i] = ret ? 0 : units_merge(u.v, u.n);
	}
	return ret;
}

/*
 * overlayfs over the @nr layers, lowerdir=top:…:bottom: each the detached
 * mount by descriptor, or (@dir) attached at @dir/I. -errno, not logged.
 */
static int overlay_mount(const char *dir, const int *mfds, uint32_t nr,
			 const char *target, unsigned long flags)
{
	char *opts = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&opts, &len);
	int ret = 0;

	if (!f)
		return -ENOMEM;
	fputs("lowerdir=", f);
	for (uint32_t i = nr; i-- > 0;) {
		if (dir)
			fprintf(f, "%s/%u%s", dir, i, i ? ":" : "");
		else
			fprintf(f, "/proc/self/fd/%d%s", mfds[i], i ? ":" : "");
	}
	if (fclose(f) || !opts) {
		free(opts);
		return -ENOMEM;
	}
	if (mount_nofollow(IMAGE_LAYERS_SOURCE, target, "overlay",
		  MS_RDONLY | (flags & (MS_NOSUID | MS_NODEV)), opts) < 0)
		ret = -errno;
	free(opts);
	return ret;
}

/*
 * overlayfs takes a private clone of each layer's mount. Linux 6.18
 * clones a detached mount; 6.12 (the VM tests' kernel) clones only mounts
 * of the caller's namespace and fails the overlay with EINVAL ("failed to
 * clone lowerpath" in dmesg). There the layers are attached under a
 * fresh 0700 directory (mkdtemp: nothing planted there can be followed)
 * just for the overlay's mount(2), and detached again at once: the
 * overlay keeps its clones.
 */
static int overlay_mount_staged(const int *mfds, uint32_t nr, const char *target,
				unsigned long flags)
{
	char dir[] = "/run/ferry-layers.XXXXXX", path[sizeof(dir) + 12];
	uint32_t i, attached = 0;
	int ret = 0;

	if (!mkdtemp(dir))
		return -errno;
	for (i = 0; !ret && i < nr; i++) {
		snprintf(path, sizeof(path), "%s/%u", dir, i);
		ret = mkdir(path, 0700) ? -errno : meta_mount_attach(mfds[i], path);
		if (!ret)
			attached++;
	}
	if (!ret)
		ret = overlay_mount(dir, mfds, nr, target, flags);
	for (i = 0; i < nr; i++) {
		snprintf(path, sizeof(path), "%s/%u", dir, i);
		if (i < attached && umount2(path, MNT_DETACH))
			ferry_warn("%s: detaching the staged layer: %s", path, strerror(errno));
		rmdir(path);
	}
	if (rmdir(dir))
		ferry_warn("%s: %s", dir, strerror(errno));
	return ret;
}

int image_layers_attach(const int *mfds, uint32_t nr, const char *target,
			unsigned long flags)
{
	int ret;

	if (nr == 1)
		return meta_mount_attach(mfds[0], target);
	ret = overlay_mount(NULL, mfds, nr, target, flags);
	if (ret == -EINVAL)
		ret = overlay_mount_staged(mfds, nr, target, flags);
	if (ret)
		ferry_err("mount: overlay of %u EROFS layers on %s: %s", nr, target,
			  ferry_strerror(ret));
	return ret;
}

/*
 * With @ret 0 (all @nr layer mounts made), put them on @target. Then
 * close our descriptors (the overlay holds its own clones): @ret, or the
 * attach's.
 */
static int attach_layers(const int *mfds, uint32_t nr, int ret, const char *target,
			 unsigned long flags)
{
	if (!ret)
		ret = image_layers_attach(mfds, nr, target, flags);
	for (uint32_t i = 0; i < nr; i++)
		if (mfds[i] >= 0)
			close(mfds[i]);
	return ret;
}

int image_mount_erofs_layers(const char *ref, const struct fetch_opts *fopts,
			     const char *cache_dir, const char *mountpoint,
			     unsigned long flags)
{
	struct image_ref r = { 0 };
	struct oci_image img = { 0 };
	int *mfds = NULL, ret;
	uint32_t nr = 0;

	if (image_ref_parse(ref, IMAGE_ACCEPT(IMAGE_OCI) | IMAGE_ACCEPT(IMAGE_DOCKER),
			    NULL, &r))
		return 1;
	ret = oci_image_open(&r, NULL, fopts, &img);
	if (ret || !oci_is_layers_image(&img)) {
		/* Not ours: image_open names whatever is wrong with it. */
		ret = 1;
		goto out;
	}
	ret = image_mountpoint_unchanged(mountpoint);
	if (!ret)
		ret = image_check_not_mounted(mountpoint);
	if (!ret && !(mfds = calloc(img.nr_layers, sizeof(*mfds))))
		ret = -ENOMEM;
	for (; !ret && nr < img.nr_layers; nr++)
		ret = mount_layer(&img, nr, cache_dir, flags, &mfds[nr]);
	ret = attach_layers(mfds, nr, ret, mountpoint, flags);
out:
	free(mfds);
	oci_image_free(&img);
	image_ref_free(&r);
	return ret;
}

int image_layers_kernel_mount(struct image_cache *ic, const char *target,
			      unsigned long flags)
{
	struct image *img = image_cache_img(ic);
	uint32_t n = img->blobs.nr_blobs, nr = 0;
	int *mfds = calloc(n + 1, sizeof(*mfds)), ret = mfds ? 0 : -ENOMEM;
	char fdpath[32], sysfs[160];

	/* The kernel reads exactly the files filled here, through our
	 * descriptors; the metadata it parses is what walk_layers walked. */
	for (; !ret && nr < n; nr++) {
		snprintf(fdpath, sizeof(fdpath), "/proc/self/fd/%d",
			 image_cache_data_fd(ic, nr));
		ret = meta_kernel_mount_detached(fdpath, flags, &mfds[nr]);
	}
	if (!ret) {
		snprintf(fdpath, sizeof(fdpath), "/proc/self/fd/%d", mfds[0]);
		ret = meta_sysfs_path(fdpath, sysfs, sizeof(sysfs));
		if (ret)
			ferry_err("layer mount: cannot identify its EROFS superblock (FS_IOC_GETFSSYSFSPATH): %s",
				  ferry_strerror(ret));
		else
			image_cache_note_sb(ic, sysfs);
	}
	ret = attach_layers(mfds, nr, ret, target, flags);
	free(mfds);
	return ret;
}
