// SPDX-License-Identifier: MIT
#include <getopt.h>
#include <json-c/json.h>
#include <stdio.h>
#include <string.h>

#include "../../pkg-base/base.h"
#include "../../pkg-image/image.h"
#include "cmd.h"

int cmd_check(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		REGISTRY_LONGOPTS,
		{ 0 },
	};
	struct regopts ro;
	struct image_check_report report;
	struct image *img;
	bool json = false;
	int c, ret;

	regopts_init(&ro);
	while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		ret = regopts_parse(&ro, c, optarg);
		if (ret < 0)
			return usage_error("check", "bad registry option");
		if (ret)
			continue;
		switch (c) {
		case 'j':
			json = true;
			break;
		case 'h':
			printf("Usage: ferry check [--json] IMAGE\n\n"
			       "Verify an image: the bootstrap's digest and metadata (every\n"
			       "inode, directory, xattr and chunk index), and every chunk of\n"
			       "every blob (decompressed and compared with its sha256).\n"
			       "The first problem is reported naming the inode path or the\n"
			       "blob and chunk.\n\n"
			       "IMAGE  dir:OUT, oci:PATH[:TAG] or\n"
			       "       docker://[HOST[:PORT]/]REPO[:TAG|@DIGEST] (blobs are\n"
			       "       read from the registry)\n\n"
			       "Options:\n"
			       "  --json      the result as JSON on stdout: ok, inodes,\n"
			       "              chunks, bytesVerified, and error (the reason)\n"
			       "              when the image fails\n"
			       "  -h, --help  this help\n\n%s\n"
			       EXIT_CODES_HELP, REGISTRY_OPTIONS_HELP);
			return EXIT_OK;
		default:
			return usage_error("check", "unknown option");
		}
	}
	if (argc - optind != 1)
		return usage_error("check", "expected IMAGE");
	ret = regopts_finish(&ro);
	if (ret)
		return ret;
	ret = image_open(argv[optind], &(struct image_opts){ .fetch = &ro.fetch },
			 &img);
	if (ret)
		return ret == -EINVAL ? EXIT_USAGE : EXIT_FAIL;
	ret = image_check(img, &report);
	image_close(img);
	if (json) {
		struct json_object *o = json_object_new_object();

		json_object_object_add(o, "ok", json_object_new_boolean(!ret));
		json_object_object_add(o, "inodes", json_object_new_int64((int64_t)report.inodes));
		json_object_object_add(o, "chunks", json_object_new_int64((int64_t)report.chunks));
		json_object_object_add(o, "bytesVerified",
				       json_object_new_int64((int64_t)report.bytes_verified));
		if (ret)
			json_object_object_add(o, "error",
					       json_object_new_string(ferry_strerror(ret)));
		printf("%s\n", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PRETTY));
		json_object_put(o);
	} else if (!ret) {
		printf("%s: ok (%llu inodes, %llu chunk references, %llu bytes verified)\n",
		       argv[optind], (unsigned long long)report.inodes,
		       (unsigned long long)report.chunks,
		       (unsigned long long)report.bytes_verified);
	}
	if (ret) {
		ferry_err("check %s: FAILED: %s", argv[optind], ferry_strerror(ret));
		return EXIT_FAIL;
	}
	return EXIT_OK;
}
