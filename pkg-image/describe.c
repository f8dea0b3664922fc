// SPDX-License-Identifier: MIT
/* What ferry inspect shows: an image's layout and one entry's chunk map, as JSON. */
#include <json-c/json.h>
#include <string.h>
#include <sys/stat.h>

#include "internal.h"

#define U64(v) json_object_new_int64((int64_t)(v))

struct tree_summary {
	uint64_t files, dirs, symlinks, specials, bytes, chunked, inline_files;
};

static int count_visit(void *ctx, const char *path, const struct meta_stat *st)
{
	struct tree_summary *t = ctx;

	switch (st->mode & S_IFMT) {
	case S_IFREG:
		t->files++;
		t->bytes += st->size;
		if (st->nr_chunks)
			t->chunked++;
		else
			t->inline_files++;
		break;
	case S_IFDIR:
		t->dirs++;
		break;
	case S_IFLNK:
		t->symlinks++;
		break;
	default:
		t->specials++;
	}
	return 0;
}

static struct json_object *image_json(struct image *img,
				      const struct tree_summary *t)
{
	struct json_object *o = json_object_new_object(), *sbo = json_object_new_object();
	struct json_object *blobs = json_object_new_array(), *tree = json_object_new_object();
	struct json_object *prefetch, *sections;
	char hex[2 * BLOB_DIGEST_SIZE + 8];
	struct meta_super sb;
	uint32_t i;

	meta_get_super(img->meta, &sb);
	hex_encode(sb.uuid, sizeof(sb.uuid), hex);
	json_object_object_add(sbo, "blocks", U64(sb.blocks));
	json_object_object_add(sbo, "bytes", U64(sb.image_bytes));
	json_object_object_add(sbo, "inodes", U64(sb.inos));
	json_object_object_add(sbo, "rootNid", U64(sb.root_nid));
	json_object_object_add(sbo, "epoch", U64(sb.epoch));
	json_object_object_add(sbo, "featureCompat", U64(sb.feature_compat));
	json_object_object_add(sbo, "featureIncompat", U64(sb.feature_incompat));
	json_object_object_add(sbo, "uuid", json_object_new_string(hex));
	json_object_object_add(sbo, "volumeName", json_object_new_string(sb.volume_name));
	json_object_object_add(sbo, "devices", U64(sb.nr_devices));
	json_object_object_add(o, "superblock", sbo);
	json_object_object_add(o, "chunkSize", U64(img->chunk_size));
	json_object_object_add(o, "compression", json_object_new_string(img->compression));
	if (!mem_is_zero(img->index_digest, BLOB_DIGEST_SIZE)) {
		char idx[DIGEST_STRING_SIZE];

		/* An ordinary image read through its ferry index. */
		digest_format(img->index_digest, idx);
		json_object_object_add(o, "index", json_object_new_string(idx));
	}
	for (i = 0; i < img->blobs.nr_blobs; i++) {
		const struct blob_info *b = &img->blobs.blobs[i];
		struct json_object *bo = json_object_new_object();

		memcpy(hex, "sha256:", 7);
		hex_encode(b->digest, BLOB_DIGEST_SIZE, hex + 7);
		json_object_object_add(bo, "deviceId", U64(i + 1));
		json_object_object_add(bo, "digest", json_object_new_string(hex));
		json_object_object_add(bo, "size", U64(b->size));
		json_object_object_add(bo, "uncompressedSize", U64(b->uncompressed_size));
		json_object_object_add(bo, "chunks", U64(b->nr_chunks));
		if (b->flags & BLOB_INFO_STREAM) {
			const struct blob_stream *st = blob_streams_find(&img->streams, i);
			static const char *const formats[] = { "tar", "gzip", "zstd" };

			/* A layer read in place: its resume points. */
			json_object_object_add(bo, "layer", json_object_new_string(
				formats[st ? st->format : 0]));
			json_object_object_add(bo, "resumePoints", U64(st ? st->nr_points : 0));
		}
		json_object_array_add(blobs, bo);
	}
	json_object_object_add(o, "blobs", blobs);
	prefetch = json_object_new_array();
	for (i = 0; i < img->nr_prefetch; i++)
		json_object_array_add(prefetch, json_object_new_string(img->prefetch[i]));
	json_object_object_add(o, "prefetch", prefetch);
	json_object_object_add(o, "loaderDeps", U64(img->nr_elf));
	if (img->writer)
		json_object_object_add(o, "writer", json_object_new_string(img->writer));
	sections = json_object_new_array();
	for (i = 0; i < img->nr_sections; i++) {
		const struct image_section_seen *s = &img->sections[i];
		struct json_object *so = json_object_new_object();

		json_object_object_add(so, "magic", json_object_new_string_len(s->magic, 8));
		json_object_object_add(so, "version", U64(s->version));
		json_object_object_add(so, "flags", U64(s->flags));
		json_object_object_add(so, "bytes", U64(s->len));
		json_object_object_add(so, "known", json_object_new_boolean(s->known));
		json_object_array_add(sections, so);
	}
	json_object_object_add(o, "sections", sections);
	json_object_object_add(tree, "files", U64(t->files));
	json_object_object_add(tree, "directories", U64(t->dirs));
	json_object_object_add(tree, "symlinks", U64(t->symlinks));
	json_object_object_add(tree, "specials", U64(t->specials));
	json_object_object_add(tree, "fileBytes", U64(t->bytes));
	json_object_object_add(tree, "chunkedFiles", U64(t->chunked));
	json_object_object_add(tree, "inlineFiles", U64(t->inline_files));
	json_object_object_add(o, "tree", tree);
	return o;
}

static const char *type_name(uint32_t mode)
{
	switch (mode & S_IFMT) {
	case S_IFREG: return "file";
	case S_IFDIR: return "directory";
	case S_IFLNK: return "symlink";
	case S_IFCHR: return "char-device";
	case S_IFBLK: return "block-device";
	case S_IFIFO: return "fifo";
	case S_IFSOCK: return "socket";
	default: return "unknown";
	}
}

/* What the image records of @path's loader dependencies, if anything. */
static void loader_deps(const struct image *img, const char *path,
			struct json_object *o)
{
	const struct image_elf_entry *e;
	struct json_object *d, *needed;
	char *norm;
	uint32_t i;

	if (!img->nr_elf || image_path_normalize(path, strlen(path), &norm))
		return;
	e = image_elf_find(img, norm);
	free(norm);
	if (!e)
		return;
	d = json_object_new_object();
	if (e->deps.interp)
		json_object_object_add(d, "interpreter", json_object_new_string(e->deps.interp));
	needed = json_object_new_array();
	for (i = 0; i < e->deps.nr_needed; i++)
		json_object_array_add(needed, json_object_new_string(e->deps.needed[i]));
	json_object_object_add(d, "needed", needed);
	if (e->deps.runpath)
		json_object_object_add(d, "runpath", json_object_new_string(e->deps.runpath));
	json_object_object_add(d, "machine", U64(e->deps.machine));
	json_object_object_add(o, "loaderDeps", d);
}

int image_describe_file(struct image *img, const char *path,
			struct json_object **out)
{
	struct json_object *o = json_object_new_object(), *chunks, *xattrs;
	char names[65536], target[4096], *name;
	struct meta_stat st;
	uint64_t nid, i;
	ssize_t n;
	int ret;

	ret = meta_resolve(img->meta, path, &nid);
	if (!ret)
		ret = meta_getattr(img->meta, nid, &st);
	if (ret) {
		ferry_err("%s: %s: %s", img->ref, path, ferry_strerror(ret));
		json_object_put(o);
		return ret;
	}
	json_object_object_add(o, "path", json_object_new_string(path));
	json_object_object_add(o, "nid", U64(nid));
	json_object_object_add(o, "type", json_object_new_string(type_name(st.mode)));
	json_object_object_add(o, "mode", U64(st.mode & 07777));
	json_object_object_add(o, "uid", U64(st.uid));
	json_object_object_add(o, "gid", U64(st.gid));
	json_object_object_add(o, "nlink", U64(st.nlink));
	json_object_object_add(o, "size", U64(st.size));
	json_object_object_add(o, "mtime", U64(st.mtime));
	json_object_object_add(o, "mtimeNsec", U64(st.mtime_nsec));
	json_object_object_add(o, "inodeFormat",
			       json_object_new_string(st.extended ? "extended" : "compact"));
	if (S_ISCHR(st.mode) || S_ISBLK(st.mode)) {
		json_object_object_add(o, "rdevMajor", U64(st.rdev_major));
		json_object_object_add(o, "rdevMinor", U64(st.rdev_minor));
	}
	if (S_ISLNK(st.mode)) {
		n = meta_readlink(img->meta, nid, target, sizeof(target));
		if (n >= 0)
			json_object_object_add(o, "target", json_object_new_string(target));
	}
	xattrs = json_object_new_array();
	n = meta_listxattr(img->meta, nid, names, sizeof(names));
	for (name = names; n > 0 && name < names + n; name += strlen(name) + 1)
		json_object_array_add(xattrs, json_object_new_string(name));
	json_object_object_add(o, "xattrs", xattrs);
	loader_deps(img, path, o);
	if (!st.nr_chunks) {
		json_object_object_add(o, "data", json_object_new_string(
			S_ISREG(st.mode) || S_ISLNK(st.mode) || S_ISDIR(st.mode) ?
			"bootstrap" : "none"));
		*out = o;
		return 0;
	}
	json_object_object_add(o, "chunkSize", U64(st.chunk_size));
	chunks = json_object_new_array();
	for (i = 0; i < st.nr_chunks; i++) {
		struct json_object *c = json_object_new_object();
		const struct blob_chunk *bc = NULL;
		struct meta_chunk mc;
		char hex[2 * BLOB_DIGEST_SIZE + 8];

		ret = meta_get_chunk(img->meta, nid, i, &mc);
		if (ret) {
			json_object_put(c);
			json_object_put(chunks);
			json_object_put(o);
			return ret;
		}
		json_object_object_add(c, "index", U64(i));
		json_object_object_add(c, "fileOffset", U64(i * st.chunk_size));
		json_object_object_add(c, "length",
				       U64(MIN((uint64_t)st.chunk_size, st.size - i * st.chunk_size)));
		if (mc.blkaddr == META_CHUNK_HOLE) {
			json_object_object_add(c, "hole", json_object_new_boolean(1));
			json_object_array_add(chunks, c);
			continue;
		}
		json_object_object_add(c, "deviceId", U64(mc.device_id));
		json_object_object_add(c, "uncompressedOffset",
				       U64((uint64_t)mc.blkaddr * META_BLOCK_SIZE));
		if (mc.device_id >= 1 && mc.device_id <= img->blobs.nr_blobs)
			bc = blob_find_chunk(&img->blobs.blobs[mc.device_id - 1],
					     (uint64_t)mc.blkaddr * META_BLOCK_SIZE);
		if (bc) {
			json_object_object_add(c, "compressedOffset", U64(bc->coff));
			json_object_object_add(c, "compressedSize", U64(bc->csize));
			json_object_object_add(c, "codec",
					       json_object_new_string(blob_codec_name(bc->codec)));
			memcpy(hex, "sha256:", 7);
			hex_encode(bc->sha256, BLOB_DIGEST_SIZE, hex + 7);
			json_object_object_add(c, "sha256", json_object_new_string(hex));
		}
		json_object_array_add(chunks, c);
	}
	json_object_object_add(o, "chunks", chunks);
	*out = o;
	return 0;
}

int image_describe(struct image *img, struct json_object **out)
{
	struct tree_summary tree = { 0 };
	int ret = meta_walk(img->meta, count_visit, &tree);

	if (ret)
		return ret;
	*out = image_json(img, &tree);
	return *out ? 0 : -ENOMEM;
}
