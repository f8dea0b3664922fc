// SPDX-License-Identifier: MIT
#include <getopt.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <stdio.h>
#include <string.h>

#include "../../pkg-base/base.h"
#include "../../pkg-image/image.h"
#include "cmd.h"

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
	struct json_object *sb, *blobs, *tree, *prefetch, *sections;
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
	if (jstr(o, "index")[0])
		printf("ferry index:  %s (the image's layers are its devices)\n", jstr(o, "index"));
	printf("blobs:        %zu\n", json_object_array_length(blobs));
	for (i = 0; i < json_object_array_length(blobs); i++) {
		struct json_object *b = json_object_array_get_idx(blobs, i);

		printf("  device %" PRId64 ": %s\n            %" PRId64 " bytes, %" PRId64
		       " uncompressed, %" PRId64 " chunks\n", jint(b, "deviceId"),
		       jstr(b, "digest"), jint(b, "size"), jint(b, "uncompressedSize"),
		       jint(b, "chunks"));
		if (jstr(b, "layer")[0])
			printf("            a %s layer read in place, %" PRId64 " resume points\n",
			       jstr(b, "layer"), jint(b, "resumePoints"));
	}
	json_object_object_get_ex(o, "prefetch", &prefetch);
	if (json_object_array_length(prefetch))
		printf("prefetch:     %zu paths, first %s\n", json_object_array_length(prefetch),
		       json_object_get_string(json_object_array_get_idx(prefetch, 0)));
	if (jint(o, "loaderDeps"))
		printf("loader deps:  %" PRId64 " ELF files (interpreter, libraries)\n",
		       jint(o, "loaderDeps"));
	if (*jstr(o, "writer"))
		printf("written by:   %s\n", jstr(o, "writer"));
	json_object_object_get_ex(o, "sections", &sections);
	for (i = 0; i < json_object_array_length(sections); i++) {
		struct json_object *s = json_object_array_get_idx(sections, i);

		printf("section:      %.8s v%" PRId64 ", %" PRId64 " bytes%s\n",
		       jstr(s, "magic"), jint(s, "version"), jint(s, "bytes"),
		       json_object_get_boolean(json_object_object_get(s, "known")) ?
		       "" : " (not read by this ferry: skipped)");
	}
	printf("tree:         %" PRId64 " files (%" PRId64 " bytes; %" PRId64 " chunked, %"
	       PRId64 " inline), %" PRId64 " directories, %" PRId64 " symlinks, %"
	       PRId64 " other\n", jint(tree, "files"), jint(tree, "fileBytes"),
	       jint(tree, "chunkedFiles"), jint(tree, "inlineFiles"),
	       jint(tree, "directories"), jint(tree, "symlinks"), jint(tree, "specials"));
}

static void print_file_text(struct json_object *o)
{
	struct json_object *chunks, *xattrs, *deps, *needed;
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
	if (json_object_object_get_ex(o, "loaderDeps", &deps)) {
		json_object_object_get_ex(deps, "needed", &needed);
		printf("  loader deps: interpreter %s, runpath %s, needs",
		       *jstr(deps, "interpreter") ? jstr(deps, "interpreter") : "none",
		       *jstr(deps, "runpath") ? jstr(deps, "runpath") : "none");
		for (i = 0; i < json_object_array_length(needed); i++)
			printf(" %s", json_object_get_string(json_object_array_get_idx(needed, i)));
		printf("%s\n", json_object_array_length(needed) ? "" : " nothing");
	}
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
			       "       docker://[HOST[:PORT]/]REPO[:TAG|@DIGEST]\n\n"
			       "Options:\n"
			       "  --json      the same as JSON on stdout (the image: superblock,\n"
			       "              chunkSize, compression, blobs, prefetch,\n"
			       "              loaderDeps, writer, sections, tree; a PATH: its\n"
			       "              attributes, xattrs, chunks, loaderDeps)\n"
			       "  -h, --help  this help\n\n%s\n"
			       EXIT_CODES_HELP, REGISTRY_OPTIONS_HELP);
			return EXIT_OK;
		default:
			return usage_error("inspect", "unknown option");
		}
	}
	if (argc - optind < 1 || argc - optind > 2)
		return usage_error("inspect", "expected IMAGE [PATH]");
	ret = regopts_finish(&ro);
	if (ret)
		return ret;
	ret = image_open(argv[optind], &(struct image_opts){ .fetch = &ro.fetch },
			 &img);
	if (ret)
		return ret == -EINVAL ? EXIT_USAGE : EXIT_FAIL;
	if (argc - optind == 2)
		ret = image_describe_file(img, argv[optind + 1], &o);
	else
		ret = image_describe(img, &o);
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
