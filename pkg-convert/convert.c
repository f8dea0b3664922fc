// SPDX-License-Identifier: MIT
/*
 * The conversion driver: parse the references (pkg-image), open the
 * source, feed it layer by layer into the tree and the dedup table
 * (dirsrc.c for dir:, layer.c for tar: and each OCI layer, dedup.c for
 * file data), then give the blobs their device ids, write the bootstrap
 * (EROFS metadata + blob index + prefetch list) and hand it with the
 * blobs to pkg-image's writer for the destination's layout.
 *
 * Traversal order is fixed (sorted directory entries, archive order for
 * tar, manifest order for layers) so that the output is a deterministic
 * function of the input and options.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "tar.h"

/* "zstd:3", as blob_compress_parse reads it back. */
static void compression_name(const struct convert_opts *o, char *buf, size_t len)
{
	if (o->compress.level)
		snprintf(buf, len, "%s:%d", blob_codec_name(o->compress.codec),
			 o->compress.level);
	else
		snprintf(buf, len, "%s", blob_codec_name(o->compress.codec));
}

/* ------------------------------------------------------------------ */
/* Sources                                                             */
/* ------------------------------------------------------------------ */

static ssize_t stream_read(void *ctx, void *buf, size_t len)
{
	return fetch_stream_read(ctx, buf, len);
}

/* A registry layer, streamed: the stream checks size and digest. */
static int apply_remote_layer(struct converter *c, const struct oci_image *img,
			      const struct oci_descriptor *d, const char *name)
{
	struct fetch_stream *fs = NULL;
	struct input_stream *in = NULL;
	int ret;

	ret = registry_open_stream(img->remote, d->digest, d->size, &fs);
	if (ret)
		return ret;
	ret = input_open_source((struct byte_source){ .read = stream_read, .ctx = fs },
				NULL, name, &in);
	if (!ret)
		ret = convert_apply_input(c, in, d->size, name);
	input_close(in);
	fetch_stream_close(fs);
	return ret;
}

int convert_apply_oci_layer(struct converter *c, const struct oci_image *img,
			    const struct oci_descriptor *d, const char *name)
{
	char *path = NULL;
	int ret;

	if (img->archive)
		return archive_apply_layer(c, img, d, name);
	if (img->remote)
		return apply_remote_layer(c, img, d, name);
	ret = oci_blob_path(img->layout, d->digest, &path);
	if (!ret)
		ret = convert_apply_tar(c, path, d->digest, name);
	free(path);
	return ret;
}

int convert_open_image(const struct image_ref *src, const char *platform,
		       const struct fetch_opts *fopts, struct oci_image *img)
{
	if (src->transport == IMAGE_OCI_ARCHIVE ||
	    src->transport == IMAGE_DOCKER_ARCHIVE)
		return archive_image_open(src, platform, img);
	return oci_image_open(src, platform, fopts, img);
}

void convert_close_image(struct oci_image *img)
{
	archive_close(img->archive);
	oci_image_free(img);
}

static int convert_oci_layers(struct converter *c, const struct oci_image *img)
{
	uint32_t i;
	int ret = 0;

	c->layered = true;
	for (i = 0; i < img->nr_layers && !ret; i++) {
		const struct oci_descriptor *d = &img->layers[i];
		char name[96];

		digest_format(d->digest, name + 6);
		memcpy(name, "layer ", 6);
		ret = convert_layer_begin(c, name + 6);
		if (ret)
			break;
		ret = convert_apply_oci_layer(c, img, d, name);
		if (!ret)
			ret = convert_layer_end(c);
	}
	return ret;
}

/* ------------------------------------------------------------------ */
/* Devices and the bootstrap                                           */
/* ------------------------------------------------------------------ */

/*
 * Give every blob the tree references a device id (written blobs first,
 * in layer order, then chunk-dict blobs), and rewrite the provisional ids
 * (and hot-run addresses) in the chunk indexes. Hardlinked inodes are
 * reached more than once, so the rewrite only touches provisional ids.
 */
int convert_assign_devices(struct converter *c)
{
	struct meta_inode **stack = NULL;
	size_t depth = 0, cap = 0;
	uint16_t next_id = 1;
	uint32_t i;
	int pass, ret = 0;

	for (pass = 0; pass < 2 && !ret; pass++) {
		if (pass == 1) {
			for (i = 0; i < c->nr_blobs; i++)
				if (!c->blobs[i].from_dict)
					c->blobs[i].device_id = next_id++;
			for (i = 0; i < c->nr_blobs; i++)
				if (c->blobs[i].from_dict && c->blobs[i].refs)
					c->blobs[i].device_id = next_id++;
		}
		depth = 0;
		if (array_reserve(&stack, &cap, 1, sizeof(*stack), 256)) {
			ret = -ENOMEM;
			break;
		}
		stack[depth++] = c->tree->root;
		while (depth) {
			struct meta_inode *inode = stack[--depth];
			uint64_t n, k;

			if (inode->chunks) {
				n = DIV_ROUND_UP(inode->size,
						 (uint64_t)META_BLOCK_SIZE << inode->chunk_bits);
				for (k = 0; k < n; k++) {
					struct meta_chunk *mc = &inode->chunks[k];
					struct out_blob *b;

					if (!(mc->device_id & PROVISIONAL_DEVICE))
						continue;
					b = &c->blobs[mc->device_id & PROVISIONAL_BLOB_MASK];
					if (pass == 0) {
						b->refs++;
						continue;
					}
					if (mc->device_id & PROVISIONAL_HOT)
						mc->blkaddr += b->hot_blkaddr;
					mc->device_id = b->device_id;
				}
			}
			if (array_reserve(&stack, &cap, depth + inode->nr_children,
					  sizeof(*stack), 256)) {
				ret = -ENOMEM;
				break;
			}
			for (k = 0; k < inode->nr_children; k++)
				stack[depth++] = inode->children[k]->inode;
		}
	}
	free(stack);
	return ret;
}

/* The used blobs in device order. */
int convert_used_blobs(struct converter *c, struct out_blob ***out, uint32_t *nr)
{
	struct out_blob **list = calloc(c->nr_blobs + 1, sizeof(*list));
	uint32_t i;

	if (!list)
		return -ENOMEM;
	*nr = 0;
	for (i = 0; i < c->nr_blobs; i++)
		if (c->blobs[i].device_id)
			list[c->blobs[i].device_id - 1] = &c->blobs[i];
	while (*nr < c->nr_blobs && list[*nr])
		(*nr)++;
	*out = list;
	return 0;
}

/* Every prefetch path must name an entry of the written image. */
static int check_prefetch(struct converter *c, const uint8_t *data, size_t len)
{
	struct meta_image *img;
	uint64_t nid;
	uint32_t i;
	int ret;

	if (!c->nr_prefetch)
		return 0;
	ret = meta_image_open_mem(data, len, &img);
	if (ret)
		return ret;
	for (i = 0; i < c->nr_prefetch && !ret; i++) {
		ret = meta_resolve(img, c->prefetch[i], &nid);
		if (ret)
			ferry_err("prefetch list %s: %s is not in the image",
				  c->opts->prefetch_files, c->prefetch[i]);
	}
	meta_image_close(img);
	return ret;
}

/*
 * The bootstrap, written through a scratch file in the destination's blob
 * directory (meta_write wants a descriptor) and returned in *@data.
 */
int convert_write_bootstrap(struct converter *c, struct out_blob **blobs,
			    uint32_t nr, const struct blob_stream *streams,
			    uint32_t nr_streams, uint8_t **data)
{
	struct atomic_file scratch = { .fd = -1, .dir_fd = -1 };
	struct meta_device *devices = calloc(nr + 1, sizeof(*devices));
	struct blob_info *infos = calloc(nr + 1, sizeof(*infos));
	struct meta_write_opts wopts = { 0 };
	struct meta_write_stats wstats;
	void *ext = NULL, *area = NULL;
	size_t ext_len = 0, area_len = 0;
	uint32_t i;
	int ret;

	*data = NULL;
	if (!devices || !infos) {
		ret = -ENOMEM;
		goto out;
	}
	for (i = 0; i < nr; i++) {
		char hex[2 * BLOB_DIGEST_SIZE + 1];

		hex_encode(blobs[i]->info.digest, BLOB_DIGEST_SIZE, hex);
		memcpy(devices[i].tag, hex, sizeof(devices[i].tag));
		devices[i].blocks = (uint32_t)(blobs[i]->info.uncompressed_size /
					       META_BLOCK_SIZE);
		infos[i] = blobs[i]->info;
	}
	ret = convert_elf_collect(c);
	if (!ret)
		ret = image_ext_encode(&(struct image_ext){
						.blobs = infos, .nr_blobs = nr,
						.prefetch = c->prefetch,
						.nr_prefetch = c->nr_prefetch,
						.elf = c->elf, .nr_elf = c->nr_elf,
						.streams = streams,
						.nr_streams = nr_streams },
				       &ext, &ext_len, &area, &area_len);
	if (ret)
		goto out;
	wopts.devices = devices;
	wopts.nr_devices = nr;
	wopts.ext = ext;
	wopts.ext_len = ext_len;
	wopts.sections = area;
	wopts.sections_len = area_len;
	ret = atomic_file_create(&scratch, c->blobs_dir, "bootstrap", 0644);
	if (!ret)
		ret = meta_write(c->tree, &wopts, scratch.fd, &wstats);
	if (ret)
		goto out;
	c->stats->bootstrap_bytes = wstats.bytes;
	*data = malloc(wstats.bytes);
	if (!*data) {
		ret = -ENOMEM;
		goto out;
	}
	ret = pread_full(scratch.fd, *data, wstats.bytes, 0);
	if (!ret)
		ret = check_prefetch(c, *data, wstats.bytes);
out:
	if (ret) {
		free(*data);
		*data = NULL;
	}
	atomic_file_discard(&scratch);
	free(ext);
	free(area);
	free(devices);
	free(infos);
	return ret;
}

int convert_fill_stats(struct convert_stats *s, struct out_blob **blobs, uint32_t nr)
{
	uint32_t i;

	s->blobs = calloc(nr + 1, sizeof(*s->blobs));
	if (!s->blobs)
		return -ENOMEM;
	s->nr_blobs = nr;
	for (i = 0; i < nr; i++) {
		digest_format(blobs[i]->info.digest, s->blobs[i].digest);
		s->blobs[i].size = blobs[i]->info.size;
		s->blobs[i].uncompressed_size = blobs[i]->info.uncompressed_size;
		s->blobs[i].nr_chunks = blobs[i]->info.nr_chunks;
		s->blobs[i].from_dict = blobs[i]->from_dict;
	}
	return 0;
}

static int validate_opts(const struct convert_opts *o)
{
	if (o->chunk_size < 4096 || o->chunk_size > BLOB_CHUNK_MAX ||
	    (o->chunk_size & (o->chunk_size - 1))) {
		ferry_err("chunk size %u: must be a power of two from 4 KiB to %u MiB",
			  o->chunk_size, BLOB_CHUNK_MAX >> 20);
		return -EINVAL;
	}
	if (o->inline_max > 3072) {
		ferry_err("inline limit %u: must be at most 3072 bytes", o->inline_max);
		return -EINVAL;
	}
	if (o->jobs > 256) {
		ferry_err("--jobs %u: at most 256", o->jobs);
		return -EINVAL;
	}
	return 0;
}

#define SOURCE_TRANSPORTS (IMAGE_ACCEPT(IMAGE_DIR) | IMAGE_ACCEPT(IMAGE_TAR) | \
			   IMAGE_ACCEPT(IMAGE_OCI) | IMAGE_ACCEPT(IMAGE_DOCKER) | \
			   IMAGE_ACCEPT(IMAGE_OCI_ARCHIVE) | \
			   IMAGE_ACCEPT(IMAGE_DOCKER_ARCHIVE))
#define DEST_TRANSPORTS (IMAGE_ACCEPT(IMAGE_DIR) | IMAGE_ACCEPT(IMAGE_OCI) | \
			 IMAGE_ACCEPT(IMAGE_DOCKER))

static int parse_refs(const char *source, const char *dest,
		      struct image_ref *src, struct image_ref *dst)
{
	int ret = image_ref_parse(source, SOURCE_TRANSPORTS, "source", src);

	if (!ret) {
		ret = image_ref_parse(dest, DEST_TRANSPORTS, "destination", dst);
		if (ret)
			image_ref_free(src);
	}
	return ret;
}

int convert_check_platforms(const struct image_ref *dst,
			    const struct convert_opts *opts)
{
	if (!opts->platforms || dst->transport != IMAGE_DIR)
		return 0;
	ferry_err("destination dir:%s holds one image: name one --platform, or "
		  "write an index of several to oci: or docker://", dst->path);
	return -EINVAL;
}

int convert_check_args(const char *source, const char *dest,
		       const struct convert_opts *opts)
{
	struct image_ref src, dst;
	int ret = parse_refs(source, dest, &src, &dst);

	if (ret)
		return ret;
	if (opts->format == CONVERT_FORMAT_EROFS_LAYERS)
		ret = native_check_refs(&src, &dst);
	if (!ret)
		ret = convert_check_platforms(&dst, opts);
	image_ref_free(&src);
	image_ref_free(&dst);
	return ret ? ret : validate_opts(opts);
}

void convert_stats_free(struct convert_stats *stats)
{
	free(stats->blobs);
	stats->blobs = NULL;
	stats->nr_blobs = 0;
	free(stats->platforms);
	stats->platforms = NULL;
	stats->nr_platforms = 0;
}

/*
 * Does @dir/@name start with @prefix? Read without following a link or
 * waiting on a FIFO, at most the prefix's length.
 */
static bool file_starts_with(const char *dir, const char *name, const char *prefix)
{
	char path[PATH_MAX], buf[64];
	size_t len = strlen(prefix);
	struct stat st;
	bool match = false;
	int fd;

	if (snprintf(path, sizeof(path), "%s/%s", dir, name) >= (int)sizeof(path))
		return false;
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	if (fd < 0)
		return false;
	if (!fstat(fd, &st) && S_ISREG(st.st_mode) && len <= sizeof(buf))
		match = !pread_full(fd, buf, len, 0) && !memcmp(buf, prefix, len);
	close(fd);
	return match;
}

/*
 * A dir: source is a root file system; an image in a directory is given
 * through its own transport, named in the message.
 */
static int check_dir_is_tree(const struct image_ref *src)
{
	if (file_starts_with(src->path, "version", "Directory Transport Version:")) {
		ferry_err("source dir:%s is an image in skopeo's dir: layout (manifest.json, version, blobs), not a root file system: copy it to an OCI layout (skopeo copy dir:%s oci:LAYOUT:TAG) and convert oci:LAYOUT:TAG, or convert the image it was copied from",
			  src->path, src->path);
		return -EINVAL;
	}
	if (file_starts_with(src->path, "oci-layout", "{")) {
		ferry_err("source dir:%s is an OCI image layout (it has oci-layout), not a root file system: convert oci:%s[:TAG]",
			  src->path, src->path);
		return -EINVAL;
	}
	return 0;
}

/* A ferry image is converted already: say so, rather than fail on its bytes. */
static int check_source_not_ferry(const char *source, const struct image_ref *src,
				  const struct oci_image *img)
{
	char path[PATH_MAX];
	uint32_t i;

	if (src->transport == IMAGE_DIR &&
	    snprintf(path, sizeof(path), "%s/ferry.json", src->path) < (int)sizeof(path) &&
	    !access(path, F_OK)) {
		ferry_err("source dir:%s is a ferry image (it has ferry.json), converted already: mount or copy it, or convert the container image it came from",
			  src->path);
		return -EINVAL;
	}
	if (src->transport == IMAGE_DIR && check_dir_is_tree(src))
		return -EINVAL;
	for (i = 0; i < img->nr_layers; i++)
		if (oci_is_ferry_blob(img->layers[i].media_type) ||
		    oci_is_ferry_bootstrap(img->layers[i].media_type)) {
			ferry_err("source %s is a ferry image (layer %u is %s), converted already: mount or copy it, or convert the container image it came from",
				  source, i + 1, img->layers[i].media_type);
			return -EINVAL;
		}
	return 0;
}

/* An image written inside a dir: source would contain its own output. */
static int check_dest_outside_source(const struct image_ref *src,
				     const struct image_ref *dst)
{
	char *s = NULL, *d = NULL;
	size_t n;
	int ret = 0;

	if (src->transport != IMAGE_DIR || dst->transport == IMAGE_DOCKER)
		return 0;
	s = realpath(src->path, NULL);
	if (!s)
		return 0; /* convert_dir names the missing source */
	if (path_mountpoint(dst->path, &d) && path_absolute(dst->path, &d)) {
		ret = -ENOMEM;
		goto out;
	}
	n = strlen(s);
	if (!strncmp(d, s, n) && (!d[n] || d[n] == '/' || n == 1)) {
		ferry_err("destination %s is %sthe source directory %s: the image would contain its own output; choose a destination outside it",
			  dst->path, d[n] ? "inside " : "", src->path);
		ret = -EINVAL;
	}
out:
	free(s);
	free(d);
	return ret;
}

/* A regular file @name at the top of the tree converted so far. */
static bool top_file(const struct converter *c, const char *name)
{
	const struct meta_inode *i = meta_dir_lookup(c->tree->root, name,
						     strlen(name));

	return i && S_ISREG(i->mode);
}

/*
 * A tar: source is a root file system: an image archive (docker save's,
 * skopeo's oci-archive:) converts through its own transport, named here.
 */
static int check_tar_is_tree(const struct converter *c, const char *path)
{
	const char *transport = NULL;

	if (top_file(c, "manifest.json") && top_file(c, "repositories"))
		transport = "docker-archive";
	else if (top_file(c, "oci-layout") && top_file(c, "index.json"))
		transport = "oci-archive";
	if (!transport)
		return 0;
	ferry_err("source tar:%s is an image archive (%s), not a root file system: convert %s:%s",
		  path, transport[0] == 'd' ? "docker save's manifest.json and repositories" :
		  "an OCI layout: oci-layout and index.json", transport, path);
	return -EINVAL;
}

/* Feed the source into the tree: one layer, or one per OCI layer. */
static int convert_source(struct converter *c, const struct image_ref *src,
			  const struct oci_image *oci)
{
	int ret;

	if (oci->manifest)
		return convert_oci_layers(c, oci);
	ret = convert_layer_begin(c, NULL);
	if (ret)
		return ret;
	if (src->transport == IMAGE_DIR) {
		ret = convert_dir(c, src->path);
	} else {
		ret = convert_apply_tar(c, src->path, NULL, src->path);
		if (!ret)
			ret = check_tar_is_tree(c, src->path);
	}
	return ret ? ret : convert_layer_end(c);
}

/* Bootstrap and index into the destination (chunk-dict blobs copied in). */
static int finish(struct converter *c, struct image_out *out,
		  const struct oci_image *src, struct out_blob **used,
		  uint32_t nr, bool index_member)
{
	struct image_out_blob *blobs = calloc(nr + 1, sizeof(*blobs));
	struct image_out_desc d = {
		.blobs = blobs, .nr_blobs = nr, .chunk_size = c->opts->chunk_size,
		.source = src, .fetch = c->opts->fetch, .progress = &c->progress,
		.index_member = index_member,
	};
	uint8_t *data = NULL;
	char comp[32];
	uint32_t i;
	int ret;

	if (!blobs)
		return -ENOMEM;
	for (i = 0; i < nr; i++)
		blobs[i] = (struct image_out_blob){ &used[i]->info,
						    used[i]->source_layer,
						    used[i]->from_dict };
	compression_name(c->opts, comp, sizeof(comp));
	d.compression = comp;
	ret = convert_copy_dict_blobs(c, image_out_dir(out), used, nr);
	if (!ret)
		ret = convert_write_bootstrap(c, used, nr, NULL, 0, &data);
	if (!ret) {
		d.bootstrap = data;
		d.bootstrap_len = c->stats->bootstrap_bytes;
		ret = image_out_finish(out, &d, c->stats->manifest_digest,
				       &c->stats->manifest_size);
	}
	free(data);
	free(blobs);
	return ret;
}

/*
 * Convert one image, @src (@src_img for oci: and docker:), into @out:
 * stored and tagged, or with @index_member stored for an index only.
 */
static const struct oci_image no_oci_image; /* dir: and tar: sources */

static int convert_into(const struct image_ref *src, const struct oci_image *img,
			struct image_out *out, bool index_member,
			const struct convert_opts *opts, struct convert_stats *stats)
{
	const struct oci_image *src_img = img ? img : &no_oci_image;
	struct converter c = {
		.opts = opts,
		.stats = stats,
		.writer_file = { .fd = -1, .dir_fd = -1 },
		.hot_file = { .fd = -1, .dir_fd = -1 },
	};
	struct out_blob **used = NULL;
	uint32_t nr_used = 0, i;
	uint64_t start = ferry_now_ns();
	int ret;

	/* One image was checked before DEST was opened (convert_run). */
	ret = index_member ? check_source_not_ferry(src_img->where, src, src_img) : 0;
	if (ret)
		return ret;
	c.blobs_dir = image_out_blobs_dir(out);
	c.buf = malloc(opts->chunk_size);
	if (!c.buf) {
		ret = -ENOMEM;
		goto out;
	}
	ret = meta_tree_new(&c.tree);
	if (!ret)
		ret = convert_elf_init(&c);
	if (!ret && opts->chunk_dict)
		ret = convert_load_chunk_dict(&c, opts->chunk_dict);
	if (!ret && opts->prefetch_files)
		ret = image_prefetch_list_load(opts->prefetch_files, &c.prefetch,
					       &c.nr_prefetch);
	if (!ret)
		ret = convert_prefetch_index(&c);
	if (!ret)
		ret = convert_source(&c, src, src_img);
	if (!ret)
		ret = convert_assign_devices(&c);
	if (!ret)
		ret = convert_used_blobs(&c, &used, &nr_used);
	if (!ret)
		ret = convert_fill_stats(stats, used, nr_used);
	if (!ret)
		ret = finish(&c, out, src_img->manifest ? src_img : NULL, used,
			     nr_used, index_member);
	stats->seconds = (double)(ferry_now_ns() - start) / 1e9;
out:
	convert_layer_discard(&c);
	for (i = 0; i < c.nr_blobs; i++) {
		blob_info_free_chunks(&c.blobs[i].info);
		free(c.blobs[i].source_layer);
	}
	free(c.blobs);
	free(used);
	image_close(c.dict);
	image_prefetch_list_free(c.prefetch, c.nr_prefetch);
	free(c.prefetch_sorted);
	convert_elf_free(&c);
	meta_tree_free(c.tree);
	free(c.chunks.slots);
	free(c.links);
	free(c.buf);
	return ret;
}

/* @platform is named by opts->platforms, or there are none (every one). */
static bool platform_wanted(const struct convert_opts *opts, const char *platform)
{
	const char *const *p;

	for (p = opts->platforms; p && *p; p++)
		if (oci_platform_names(*p, platform))
			return true;
	return !opts->platforms;
}

/* Add @one's numbers and blobs to @all, and its manifest as a platform. */
static int add_platform_stats(struct convert_stats *all,
			      const struct convert_stats *one, const char *platform)
{
	struct convert_blob_stat *blobs;
	struct convert_platform_stat *ps;

	blobs = realloc(all->blobs, (all->nr_blobs + one->nr_blobs + 1) * sizeof(*blobs));
	if (!blobs)
		return -ENOMEM;
	all->blobs = blobs;
	memcpy(blobs + all->nr_blobs, one->blobs, one->nr_blobs * sizeof(*blobs));
	all->nr_blobs += one->nr_blobs;
	ps = realloc(all->platforms, (all->nr_platforms + 1) * sizeof(*ps));
	if (!ps)
		return -ENOMEM;
	all->platforms = ps;
	ps += all->nr_platforms++;
	snprintf(ps->platform, sizeof(ps->platform), "%s", platform);
	memcpy(ps->manifest_digest, one->manifest_digest, sizeof(ps->manifest_digest));
	ps->manifest_size = one->manifest_size;
	all->entries += one->entries;
	all->files += one->files;
	all->dirs += one->dirs;
	all->symlinks += one->symlinks;
	all->specials += one->specials;
	all->hardlinks += one->hardlinks;
	all->bytes_in += one->bytes_in;
	all->bytes_inline += one->bytes_inline;
	all->bytes_zero += one->bytes_zero;
	all->chunks_total += one->chunks_total;
	all->chunks_unique += one->chunks_unique;
	all->bytes_unique += one->bytes_unique;
	all->bootstrap_bytes += one->bootstrap_bytes;
	return 0;
}

/*
 * An image index @src (its platforms in @index) into @out: each wanted
 * platform converted as an index member, then an index of the ferry
 * images with the same platforms under DEST's tag.
 */
int convert_index(const struct image_ref *src, const struct oci_image *index,
		  struct image_out *out, convert_image_fn one,
		  const struct convert_opts *opts, struct convert_stats *stats)
{
	struct image_out_index_entry *entries;
	uint64_t start = ferry_now_ns();
	uint32_t i, n = 0;
	int ret = 0;

	for (i = 0; opts->platforms && opts->platforms[i]; i++) {
		uint32_t k;

		for (k = 0; k < index->nr_platforms; k++)
			if (oci_platform_names(opts->platforms[i], index->platforms[k]))
				break;
		if (k == index->nr_platforms) {
			ferry_err("%s: no manifest for platform %s in the image index",
				  index->where, opts->platforms[i]);
			return -ENOENT;
		}
	}
	if (!index->nr_platforms) {
		ferry_err("%s: the image index lists no image platform", index->where);
		return -ENOENT;
	}
	entries = calloc(index->nr_platforms, sizeof(*entries));
	if (!entries)
		return -ENOMEM;
	for (i = 0; !ret && i < index->nr_platforms; i++) {
		struct convert_stats member = { 0 };
		struct oci_image img = { 0 };
		const char *platform = index->platforms[i];

		if (!platform_wanted(opts, platform))
			continue;
		ferry_dbg("%s: converting platform %s", index->where, platform);
		ret = convert_open_image(src, platform, opts->fetch, &img);
		if (!ret && oci_is_old_ferry(&img)) {
			ferry_err("%s: %s is a ferry image of format 1: upgrade it "
				  "with one --platform at a time", index->where, platform);
			ret = -EINVAL;
		}
		if (!ret)
			ret = one(src, &img, out, true, opts, &member);
		if (!ret)
			ret = add_platform_stats(stats, &member, platform);
		if (!ret) {
			snprintf(entries[n].platform, sizeof(entries[n].platform), "%s",
				 platform);
			ret = digest_parse(member.manifest_digest, entries[n].digest);
			entries[n++].size = member.manifest_size;
		}
		convert_stats_free(&member);
		convert_close_image(&img);
	}
	if (!ret)
		ret = image_out_finish_index(out, entries, n, opts->fetch,
					     stats->manifest_digest, &stats->manifest_size);
	stats->seconds = (double)(ferry_now_ns() - start) / 1e9;
	free(entries);
	return ret;
}

int convert_run(const char *source, const char *dest,
		const struct convert_opts *opts, struct convert_stats *stats)
{
	struct image_ref src = { 0 }, dst = { 0 };
	struct oci_image src_img = { 0 };
	struct image_out *out = NULL;
	struct ferry_progress progress = { 0 };
	const char *platform = opts->platform;
	bool image_src, index_dest;
	int ret;

	if (opts->format == CONVERT_FORMAT_EROFS_LAYERS)
		return convert_run_erofs_layers(source, dest, opts, stats);
	memset(stats, 0, sizeof(*stats));
	ret = parse_refs(source, dest, &src, &dst);
	if (ret)
		return ret;
	ret = validate_opts(opts);
	if (ret)
		goto out;
	image_src = src.transport != IMAGE_DIR && src.transport != IMAGE_TAR;
	ret = convert_check_platforms(&dst, opts);
	if (ret)
		goto out;
	/* An index becomes an index, unless one platform is named (or DEST
	 * is a dir:, which holds one image). */
	index_dest = dst.transport != IMAGE_DIR && !platform;
	if (image_src) {
		ret = convert_open_image(&src, index_dest ? OCI_PLATFORMS : platform,
					 opts->fetch, &src_img);
		if (ret)
			goto out;
	}
	if (oci_is_old_ferry(&src_img)) {
		/* Converted already, in the format before containerd's layer types. */
		stats->upgraded = true;
		ret = image_out_open(&dst, opts->replace, &out);
		if (!ret)
			ret = image_out_upgrade(out, &src_img, opts->fetch, &progress,
						stats->manifest_digest,
						&stats->manifest_size);
		goto out;
	}
	ret = src_img.nr_platforms ? 0 :
	      check_source_not_ferry(source, &src, image_src ? &src_img : &no_oci_image);
	if (!ret)
		ret = check_dest_outside_source(&src, &dst);
	if (!ret)
		ret = image_out_open(&dst, opts->replace, &out);
	if (ret)
		goto out;
	if (src_img.nr_platforms)
		ret = convert_index(&src, &src_img, out, convert_into, opts, stats);
	else
		ret = convert_into(&src, image_src ? &src_img : NULL, out, false,
				   opts, stats);
out:
	image_out_close(out, ret != 0);
	if (ret)
		convert_stats_free(stats);
	convert_close_image(&src_img);
	image_ref_free(&src);
	image_ref_free(&dst);
	return ret;
}
