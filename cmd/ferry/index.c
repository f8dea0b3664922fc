// SPDX-License-Identifier: MIT
#include <getopt.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../pkg-base/base.h"
#include "../../pkg-convert/convert.h"
#include "cmd.h"

static void index_help(void)
{
	printf("Usage: ferry index [OPTIONS] IMAGE\n\n"
	       "Attach a ferry index to an ordinary image, so that ferry mount serves\n"
	       "it lazily from its own layers, unconverted (docs/FORMAT.md 1e). Every\n"
	       "layer is read once, streaming, and checked against its digest and the\n"
	       "config's diff_ids; the index (the merged tree's metadata, a sha256 per\n"
	       "piece of file data, and places to resume decoding each gzip or zstd\n"
	       "layer) is stored beside the image as an OCI artifact whose subject is\n"
	       "the image's manifest. The image, its digest and its signatures stay\n"
	       "as they are, and no layer is written or uploaded.\n\n"
	       "IMAGE   oci:PATH[:TAG]  the index goes into the layout (an untagged\n"
	       "                        index.json entry)\n"
	       "        docker://HOST[:PORT]/REPO[:TAG|@DIGEST]\n"
	       "                        pushed to the repository; listed by the\n"
	       "                        registry's referrers API, or in the tag\n"
	       "                        sha256-<hex of the manifest digest> where the\n"
	       "                        registry has none\n"
	       "An index of the same image attached before is replaced. Layers in xz,\n"
	       "or zstd layers of one frame (no place to resume decoding), are\n"
	       "refused: convert such images (ferry convert).\n\n"
	       "Options:\n"
	       "  --span N           compressed bytes between resume points of gzip\n"
	       "                     layers (default 128K; the next deflate block\n"
	       "                     boundary; zstd layers resume at frames): the\n"
	       "                     index grows ~2 KiB per point, a cold read\n"
	       "                     fetches up to N more\n"
	       "  --chunk-size N     chunk size, power of two, 4K..64M (default 1M)\n"
	       "  --inline-max N     keep regular files up to N bytes inside the\n"
	       "                     index (default %u, at most 3072)\n"
	       "  --platform P       os/arch[/variant] to pick from an image index\n"
	       "                     (default: the host's)\n"
	       "  --no-loader-deps   leave out what each program's dynamic loader opens\n"
	       "  --prefetch-files LIST\n"
	       "                     a file of paths in the image (one per line)\n"
	       "                     that lazy mounts fetch first, in that order\n"
	       "  --json             print a JSON summary on stdout\n"
	       "  -q, --quiet        no progress or summary on stderr\n"
	       "  -h, --help         this help\n\n%s\n" EXIT_CODES_HELP,
	       CONVERT_DEFAULT_INLINE_MAX, REGISTRY_OPTIONS_HELP);
}

static void print_json(const struct convert_stats *s)
{
	struct json_object *root = json_object_new_object();

#define ADD_U64(key, v) json_object_object_add(root, key, json_object_new_int64((int64_t)(v)))
	ADD_U64("entries", s->entries);
	ADD_U64("files", s->files);
	ADD_U64("bytesIn", s->bytes_in);
	ADD_U64("bytesInline", s->bytes_inline);
	ADD_U64("chunksTotal", s->chunks_total);
	ADD_U64("chunksUnique", s->chunks_unique);
	ADD_U64("bootstrapSize", s->bootstrap_bytes);
	ADD_U64("layerBytes", s->layer_bytes);
	ADD_U64("points", s->points);
	ADD_U64("indexBytes", s->index_bytes);
	ADD_U64("devices", s->nr_blobs);
#undef ADD_U64
	json_object_object_add(root, "indexDigest", json_object_new_string(s->manifest_digest));
	json_object_object_add(root, "seconds", json_object_new_double(s->seconds));
	printf("%s\n", json_object_to_json_string_ext(root, JSON_C_TO_STRING_PRETTY |
						      JSON_C_TO_STRING_NOSLASHESCAPE));
	json_object_put(root);
}

int cmd_index(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "span", required_argument, NULL, 's' },
		{ "chunk-size", required_argument, NULL, 'c' },
		{ "inline-max", required_argument, NULL, 'i' },
		{ "platform", required_argument, NULL, 'p' },
		{ "no-loader-deps", no_argument, NULL, 'L' },
		{ "prefetch-files", required_argument, NULL, 'P' },
		{ "json", no_argument, NULL, 'j' },
		{ "quiet", no_argument, NULL, 'q' },
		{ "help", no_argument, NULL, 'h' },
		REGISTRY_LONGOPTS,
		{ 0 },
	};
	struct regopts ro;
	struct convert_opts opts = {
		.chunk_size = CONVERT_DEFAULT_CHUNK_SIZE,
		.inline_max = CONVERT_DEFAULT_INLINE_MAX,
		.span = CONVERT_DEFAULT_SPAN,
		.fetch = &ro.fetch,
	};
	struct convert_stats stats;
	bool json = false, quiet = false;
	uint64_t v;
	int c, ret;

	regopts_init(&ro);
	while ((c = getopt_long(argc, argv, "qh", longopts, NULL)) != -1) {
		ret = regopts_parse(&ro, c, optarg);
		if (ret < 0)
			return usage_error("index", "bad registry option");
		if (ret)
			continue;
		switch (c) {
		case 's':
			if (parse_size(optarg, &v) || v < 64 * 1024 || v > 64u << 20)
				return usage_error("index", "bad --span \"%s\" (64K..64M)", optarg);
			opts.span = v;
			break;
		case 'c':
			if (parse_size(optarg, &v) || v < 4096 || v > BLOB_CHUNK_MAX || (v & (v - 1)))
				return usage_error("index", "bad --chunk-size \"%s\" (a power of two, 4K..64M)",
						   optarg);
			opts.chunk_size = (uint32_t)v;
			break;
		case 'i':
			if (parse_size(optarg, &v) || v > 3072)
				return usage_error("index", "bad --inline-max \"%s\" (at most 3072)", optarg);
			opts.inline_max = (uint32_t)v;
			break;
		case 'p':
			if (!strchr(optarg, '/'))
				return usage_error("index", "bad --platform \"%s\" (os/arch[/variant])",
						   optarg);
			opts.platform = optarg;
			break;
		case 'L':
			opts.no_loader_deps = true;
			break;
		case 'P':
			opts.prefetch_files = optarg;
			break;
		case 'j':
			json = true;
			break;
		case 'q':
			quiet = true;
			break;
		case 'h':
			index_help();
			return EXIT_OK;
		default:
			return usage_error("index", "unknown option");
		}
	}
	if (argc - optind != 1)
		return usage_error("index", "expected IMAGE");
	ret = regopts_finish(&ro);
	if (ret)
		return ret;
	if (quiet || json)
		ferry_progress_enabled = false;
	ret = convert_ferry_index(argv[optind], &opts, &stats);
	if (ret) {
		ferry_err("index %s: failed: %s", argv[optind], ferry_strerror(ret));
		return EXIT_FAIL;
	}
	if (json)
		print_json(&stats);
	else if (!quiet && ferry_log_level >= FERRY_LOG_INFO)
		fprintf(stderr,
			"indexed %llu entries (%llu files) of %llu layer bytes in %.2f s\n"
			"  %u layers read lazily, %llu resume points\n"
			"  index %s: %llu bytes (%.2f%% of the layers)\n",
			(unsigned long long)stats.entries, (unsigned long long)stats.files,
			(unsigned long long)stats.layer_bytes, stats.seconds, stats.nr_blobs,
			(unsigned long long)stats.points, stats.manifest_digest,
			(unsigned long long)stats.index_bytes,
			stats.layer_bytes ? 100.0 * (double)stats.index_bytes /
					    (double)stats.layer_bytes : 0.0);
	convert_stats_free(&stats);
	return EXIT_OK;
}
