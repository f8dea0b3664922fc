// SPDX-License-Identifier: MIT
#include <getopt.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "../../pkg-base/base.h"
#include "../../pkg-image/image.h"
#include "cmd.h"

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
	struct json_object *prefetch;
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
		json_object_array_add(blobs, bo);
	}
	json_object_object_add(o, "blobs", blobs);
	prefetch = json_object_new_array();
	for (i = 0; i < img->nr_prefetch; i++)
		json_object_array_add(prefetch, json_object_new_string(img->prefetch[i]));
	json_object_object_add(o, "prefetch", prefetch);
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

static int file_json(struct image *img, const char *path, struct json_object **out)
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

static const char *jstr(struct json_object *o, const char *key)
{
	struct json_object *v;

	return json_object_object_get_ex(o, key, &v) ? json_object_get_string(v) : "";
}

static int64_t jint(struct json_object *o, const char *key)
{
	struct json_object *v;

	return json_object_object_get_ex(o, key, &v) ? json_object_get_int64(v) : 0;
}

static void print_image_text(struct json_object *o)
{
	struct json_object *sb, *blobs, *tree, *prefetch;
	size_t i;

	json_object_object_get_ex(o, "superblock", &sb);
	json_object_object_get_ex(o, "blobs", &blobs);
	json_object_object_get_ex(o, "tree", &tree);
	printf("bootstrap:    %" PRId64 " bytes, %" PRId64 " blocks of 4096, %" PRId64
	       " inodes, root nid %" PRId64 "\n", jint(sb, "bytes"), jint(sb, "blocks"),
	       jint(sb, "inodes"), jint(sb, "rootNid"));
	printf("features:     compat 0x%" PRIx64 " incompat 0x%" PRIx64 "\n",
	       jint(sb, "featureCompat"), jint(sb, "featureIncompat"));
	printf("uuid:         %s\nvolume name:  %s\n", jstr(sb, "uuid"), jstr(sb, "volumeName"));
	printf("chunk size:   %" PRId64 "\ncompression:  %s\n", jint(o, "chunkSize"),
	       jstr(o, "compression"));
	printf("blobs:        %zu\n", json_object_array_length(blobs));
	for (i = 0; i < json_object_array_length(blobs); i++) {
		struct json_object *b = json_object_array_get_idx(blobs, i);

		printf("  device %" PRId64 ": %s\n            %" PRId64 " bytes, %" PRId64
		       " uncompressed, %" PRId64 " chunks\n", jint(b, "deviceId"),
		       jstr(b, "digest"), jint(b, "size"), jint(b, "uncompressedSize"),
		       jint(b, "chunks"));
	}
	json_object_object_get_ex(o, "prefetch", &prefetch);
	if (json_object_array_length(prefetch))
		printf("prefetch:     %zu paths, first %s\n", json_object_array_length(prefetch),
		       json_object_get_string(json_object_array_get_idx(prefetch, 0)));
	printf("tree:         %" PRId64 " files (%" PRId64 " bytes; %" PRId64 " chunked, %"
	       PRId64 " inline), %" PRId64 " directories, %" PRId64 " symlinks, %"
	       PRId64 " other\n", jint(tree, "files"), jint(tree, "fileBytes"),
	       jint(tree, "chunkedFiles"), jint(tree, "inlineFiles"),
	       jint(tree, "directories"), jint(tree, "symlinks"), jint(tree, "specials"));
}

static void print_file_text(struct json_object *o)
{
	struct json_object *chunks, *xattrs;
	size_t i;

	printf("%s: %s, nid %" PRId64 " (%s inode)\n", jstr(o, "path"), jstr(o, "type"),
	       jint(o, "nid"), jstr(o, "inodeFormat"));
	printf("  mode %04" PRIo64 " uid %" PRId64 " gid %" PRId64 " nlink %" PRId64
	       " size %" PRId64 " mtime %" PRId64 ".%09" PRId64 "\n", jint(o, "mode"),
	       jint(o, "uid"), jint(o, "gid"), jint(o, "nlink"), jint(o, "size"),
	       jint(o, "mtime"), jint(o, "mtimeNsec"));
	if (*jstr(o, "target"))
		printf("  target %s\n", jstr(o, "target"));
	if (json_object_object_get_ex(o, "xattrs", &xattrs))
		for (i = 0; i < json_object_array_length(xattrs); i++)
			printf("  xattr %s\n",
			       json_object_get_string(json_object_array_get_idx(xattrs, i)));
	if (!json_object_object_get_ex(o, "chunks", &chunks)) {
		printf("  data: %s\n", jstr(o, "data"));
		return;
	}
	printf("  %zu chunks of %" PRId64 " bytes:\n", json_object_array_length(chunks),
	       jint(o, "chunkSize"));
	for (i = 0; i < json_object_array_length(chunks); i++) {
		struct json_object *c = json_object_array_get_idx(chunks, i);

		if (*jstr(c, "hole")) {
			printf("  %6zu  file %12" PRId64 " +%-8" PRId64 " hole\n", i,
			       jint(c, "fileOffset"), jint(c, "length"));
			continue;
		}
		printf("  %6zu  file %12" PRId64 " +%-8" PRId64 " device %" PRId64
		       " uoff %" PRId64 " coff %" PRId64 " +%" PRId64 " %s %s\n", i,
		       jint(c, "fileOffset"), jint(c, "length"), jint(c, "deviceId"),
		       jint(c, "uncompressedOffset"), jint(c, "compressedOffset"),
		       jint(c, "compressedSize"), jstr(c, "codec"), jstr(c, "sha256"));
	}
}

int cmd_inspect(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		REGISTRY_LONGOPTS,
		{ 0 },
	};
	struct regopts ro;
	struct tree_summary tree = { 0 };
	struct json_object *o = NULL;
	struct image *img;
	bool json = false;
	int c, ret;

	regopts_init(&ro);
	while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		ret = regopts_parse(&ro, c, optarg);
		if (ret < 0)
			return usage_error("inspect", "bad registry option");
		if (ret)
			continue;
		switch (c) {
		case 'j':
			json = true;
			break;
		case 'h':
			printf("Usage: ferry inspect [--json] IMAGE [PATH]\n\n"
			       "Without PATH: the superblock, the blobs (devices) and a tree\n"
			       "summary. With PATH: that entry's attributes, xattr names and,\n"
			       "for chunked files, the chunk map (file range -> device, blob\n"
			       "offsets, codec, sha256).\n\n"
			       "IMAGE  dir:OUT, oci:PATH[:TAG] or\n"
			       "       docker://HOST[:PORT]/REPO[:TAG|@DIGEST]\n\n%s\n"
			       EXIT_CODES_HELP, REGISTRY_OPTIONS_HELP);
			return EXIT_OK;
		default:
			return usage_error("inspect", "unknown option");
		}
	}
	if (argc - optind < 1 || argc - optind > 2)
		return usage_error("inspect", "expected IMAGE [PATH]");
	ret = image_open(argv[optind], &(struct image_opts){ .fetch = &ro.fetch },
			 &img);
	if (ret)
		return ret == -EINVAL ? EXIT_USAGE : EXIT_FAIL;
	if (argc - optind == 2) {
		ret = file_json(img, argv[optind + 1], &o);
	} else {
		ret = meta_walk(img->meta, count_visit, &tree);
		if (!ret)
			o = image_json(img, &tree);
	}
	if (!ret) {
		if (json)
			printf("%s\n", json_object_to_json_string_ext(o,
				JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_NOSLASHESCAPE));
		else if (argc - optind == 2)
			print_file_text(o);
		else
			print_image_text(o);
	}
	json_object_put(o);
	image_close(img);
	return ret ? EXIT_FAIL : EXIT_OK;
}
