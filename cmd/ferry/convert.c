// SPDX-License-Identifier: MIT
#include <getopt.h>
#include <json-c/json.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../pkg-base/base.h"
#include "../../pkg-convert/convert.h"
#include "cmd.h"

static void convert_help(void)
{
	printf("Usage: ferry convert [OPTIONS] SOURCE DEST\n\n"
	       "Convert a directory tree or a tar archive into a ferry image: an\n"
	       "EROFS bootstrap plus chunk-deduplicated, compressed data blobs.\n\n"
	       "SOURCE  dir:PATH        a directory (not following symlinks)\n"
	       "        tar:PATH        a tar archive, plain or gzip/zstd/xz compressed\n"
	       "                        (detected by content)\n"
	       "        oci:PATH[:TAG]  an OCI image layout; its layers are merged with\n"
	       "                        OCI whiteout semantics, each layer's new chunks\n"
	       "                        going to a blob of its own\n"
	       "        docker://[HOST[:PORT]/]REPO[:TAG|@DIGEST]\n"
	       "                        the same from a registry; layers are streamed\n"
	       "                        (never staged on disk) and digest-checked\n"
	       "        oci-archive:PATH[:TAG]\n"
	       "                        an OCI layout in a tar file (skopeo's\n"
	       "                        oci-archive:)\n"
	       "        docker-archive:PATH\n"
	       "                        what docker save writes (one image), or\n"
	       "                        skopeo's docker-archive:; both archives are read\n"
	       "                        in place, never extracted: a plain tar file, not\n"
	       "                        a pipe or a compressed one\n"
	       "        An image given as dir: or tar: (skopeo's dir: layout, an OCI\n"
	       "        layout, an archive) is refused, naming its transport\n"
	       "DEST    dir:OUT         writes OUT/bootstrap, OUT/blobs/sha256/<hex> and\n"
	       "                        OUT/ferry.json (see docs/FORMAT.md)\n"
	       "        oci:PATH[:TAG]  adds a ferry image to an OCI layout (default tag\n"
	       "                        latest): data blobs, bootstrap, config, manifest\n"
	       "        docker://[HOST[:PORT]/]REPO[:TAG]\n"
	       "                        pushes that image to a registry (staged in\n"
	       "                        $TMPDIR, default /var/tmp, then removed)\n"
	       "A ferry image of format 1 or 2 (written by ferry 0.1.0 to 0.4.0) as an\n"
	       "oci: or docker:// SOURCE is upgraded into an oci: or docker:// DEST:\n"
	       "the same blobs with containerd's layer types and the current diff_ids\n"
	       "(docs/FORMAT.md).\n\n"
	       "Options:\n"
	       "  --format F         ferry (default): the image above; erofs-layers:\n"
	       "                     every layer of a tar:, oci:, docker:// or archive\n"
	       "                     SOURCE becomes one standalone EROFS image\n"
	       "                     (whiteouts in overlayfs form) in an oci: or\n"
	       "                     docker:// DEST, media type application/vnd.erofs.layer.v1\n"
	       "                     (containerd's native EROFS layers), files\n"
	       "                     EROFS-compressed (zstd by default: Linux 6.10;\n"
	       "                     --compress lz4: 5.13; 1 MiB extents in big\n"
	       "                     pclusters, raw where that saves no block, files\n"
	       "                     up to 64 KiB packed together as fragments: 6.1)\n"
	       "                     or not (--compress none); --jobs threads\n"
	       "                     compress; the chunk and prefetch options do\n"
	       "                     not apply\n"
	       "  --chunk-size N     chunk size, power of two, 4K..64M (default 1M)\n"
	       "  --compress SPEC    none | lz4[:1-12] | zstd[:1-22] | lzma[:1-9]\n"
	       "                     (default zstd: level 5 with a 4-byte minimum\n"
	       "                     match, tuned for executables); erofs-layers\n"
	       "                     also deflate[:1-9] (Linux 6.6), and its lzma is\n"
	       "                     EROFS's MicroLZMA (Linux 5.16)\n"
	       "  --inline-max N     keep regular files up to N bytes inside the\n"
	       "                     bootstrap (default %u, at most 3072)\n"
	       "  --jobs N           compression threads (default: CPU count); the\n"
	       "                     output does not depend on it\n"
	       "  --platform P       os/arch[/variant] of an image index: one converts\n"
	       "                     that platform into one image; several (repeated)\n"
	       "                     make an index of those. Default: every platform\n"
	       "                     into an index of ferry images for an oci: or\n"
	       "                     docker:// DEST, the host's for dir:\n"
	       "  --chunk-dict IMAGE reuse chunks already stored in IMAGE (dir:, oci:\n"
	       "                     or docker://); its blobs become devices of the\n"
	       "                     new image\n"
	       "  --prefetch-files LIST\n"
	       "                     a file of paths in the image (one per line)\n"
	       "                     that lazy mounts fetch first, in that order;\n"
	       "                     kept in the bootstrap; their data gets frames\n"
	       "                     of its own\n"
	       "  --no-loader-deps   leave out what each program's dynamic loader\n"
	       "                     opens (kept in the bootstrap by default, so that\n"
	       "                     lazy mounts fetch a program's libraries with it);\n"
	       "                     ferryd before 0.3.0 refuses images that have it\n"
	       "  --no-fragments     erofs-layers: every file in blocks of its own\n"
	       "                     (larger; for readers older than erofs-utils 1.6)\n"
	       "  --force            replace an existing dir: image or oci: tag (the\n"
	       "                     old one stays intact until the new one is complete)\n"
	       "  --json             print a JSON summary on stdout\n"
	       "  -q, --quiet        no progress or summary on stderr\n"
	       "  -h, --help         this help\n\n"
	       "Output is deterministic: the same input, options and ferry release\n"
	       "give identical bytes (the bootstrap names the release that wrote\n"
	       "it). DEST must be new, an empty directory, or (with --force) an\n"
	       "image; one inside a dir: SOURCE is refused. SIGINT, SIGTERM or\n"
	       "SIGHUP stop the conversion and leave DEST as it was.\n\n%s\n" EXIT_CODES_HELP,
	       CONVERT_DEFAULT_INLINE_MAX, REGISTRY_OPTIONS_HELP);
}

static void print_json(const struct convert_stats *s, const struct convert_opts *o)
{
	struct json_object *root = json_object_new_object();
	struct json_object *blobs = json_object_new_array();
	uint32_t i;

#define ADD_U64(obj, key, v) json_object_object_add(obj, key, json_object_new_int64((int64_t)(v)))
	ADD_U64(root, "entries", s->entries);
	ADD_U64(root, "files", s->files);
	ADD_U64(root, "directories", s->dirs);
	ADD_U64(root, "symlinks", s->symlinks);
	ADD_U64(root, "specials", s->specials);
	ADD_U64(root, "hardlinks", s->hardlinks);
	ADD_U64(root, "bytesIn", s->bytes_in);
	ADD_U64(root, "bytesInline", s->bytes_inline);
	ADD_U64(root, "bytesZero", s->bytes_zero);
	ADD_U64(root, "bytesUnique", s->bytes_unique);
	ADD_U64(root, "chunksTotal", s->chunks_total);
	ADD_U64(root, "chunksUnique", s->chunks_unique);
	ADD_U64(root, "bootstrapSize", s->bootstrap_bytes);
	ADD_U64(root, "chunkSize", o->chunk_size);
	for (i = 0; i < s->nr_blobs; i++) {
		struct json_object *b = json_object_new_object();

		json_object_object_add(b, "digest", json_object_new_string(s->blobs[i].digest));
		ADD_U64(b, "size", s->blobs[i].size);
		ADD_U64(b, "uncompressedSize", s->blobs[i].uncompressed_size);
		ADD_U64(b, "chunks", s->blobs[i].nr_chunks);
		json_object_object_add(b, "fromChunkDict",
				       json_object_new_boolean(s->blobs[i].from_dict));
		json_object_array_add(blobs, b);
	}
	json_object_object_add(root, "upgraded", json_object_new_boolean(s->upgraded));
	if (s->nr_platforms) {
		struct json_object *ps = json_object_new_array();

		for (i = 0; i < s->nr_platforms; i++) {
			struct json_object *p = json_object_new_object();

			json_object_object_add(p, "platform",
					       json_object_new_string(s->platforms[i].platform));
			json_object_object_add(p, "manifestDigest",
					       json_object_new_string(s->platforms[i].manifest_digest));
			json_object_array_add(ps, p);
		}
		json_object_object_add(root, "platforms", ps);
	}
	if (s->manifest_digest[0])
		json_object_object_add(root, "manifestDigest",
				       json_object_new_string(s->manifest_digest));
#undef ADD_U64
	json_object_object_add(root, "blobs", blobs);
	json_object_object_add(root, "dedupRatio",
			       json_object_new_double(s->bytes_unique ?
				       (double)(s->bytes_in - s->bytes_inline - s->bytes_zero) /
				       (double)s->bytes_unique : 1.0));
	json_object_object_add(root, "seconds", json_object_new_double(s->seconds));
	printf("%s\n", json_object_to_json_string_ext(root, JSON_C_TO_STRING_PRETTY |
						      JSON_C_TO_STRING_NOSLASHESCAPE));
	json_object_put(root);
}

#define CONVERT_PLATFORMS_MAX 32

static _Atomic bool interrupted;
static volatile sig_atomic_t interrupt_signal;

static void on_interrupt(int sig)
{
	interrupt_signal = sig;
	interrupted = true;
}

/* The summary on stderr, in lines of at most 80 columns (--json has it all). */
static void print_summary(const struct convert_stats *s)
{
	uint32_t i;

	if (s->upgraded) {
		fprintf(stderr, "upgraded a ferry image of an earlier format (same blobs)\n"
			"  manifest\n    %s\n", s->manifest_digest);
		return;
	}
	fprintf(stderr,
		"converted %llu entries (%llu files, %llu dirs, %llu symlinks) in %.2f s\n"
		"  file data %llu bytes: %llu inline, %llu zero\n"
		"  new unique data %llu bytes in %llu chunks\n"
		"  bootstrap %llu bytes\n",
		(unsigned long long)s->entries, (unsigned long long)s->files,
		(unsigned long long)s->dirs, (unsigned long long)s->symlinks, s->seconds,
		(unsigned long long)s->bytes_in, (unsigned long long)s->bytes_inline,
		(unsigned long long)s->bytes_zero, (unsigned long long)s->bytes_unique,
		(unsigned long long)s->chunks_unique,
		(unsigned long long)s->bootstrap_bytes);
	for (i = 0; i < s->nr_blobs; i++)
		fprintf(stderr, "  blob %u: %llu bytes, %u chunks%s\n    %s\n", i + 1,
			(unsigned long long)s->blobs[i].size, s->blobs[i].nr_chunks,
			s->blobs[i].from_dict ? " (chunk dict)" : "", s->blobs[i].digest);
	for (i = 0; i < s->nr_platforms; i++)
		fprintf(stderr, "  %s: manifest\n    %s\n", s->platforms[i].platform,
			s->platforms[i].manifest_digest);
	if (s->manifest_digest[0])
		fprintf(stderr, "  %s\n    %s\n", s->nr_platforms ? "index" : "manifest",
			s->manifest_digest);
}

int cmd_convert(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "format", required_argument, NULL, 'F' },
		{ "chunk-size", required_argument, NULL, 'c' },
		{ "compress", required_argument, NULL, 'z' },
		{ "inline-max", required_argument, NULL, 'i' },
		{ "jobs", required_argument, NULL, 'J' },
		{ "platform", required_argument, NULL, 'p' },
		{ "chunk-dict", required_argument, NULL, 'D' },
		{ "prefetch-files", required_argument, NULL, 'P' },
		{ "no-loader-deps", no_argument, NULL, 'L' },
		{ "no-fragments", no_argument, NULL, 'G' },
		{ "force", no_argument, NULL, 'f' },
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
		.compress = { .codec = BLOB_CODEC_ZSTD },
		.fetch = &ro.fetch,
		.cancel = &interrupted,
	};
	struct sigaction sa = { .sa_handler = on_interrupt, .sa_flags = SA_RESTART };
	struct convert_stats stats;
	const char *platforms[CONVERT_PLATFORMS_MAX + 1] = { 0 };
	size_t nr_platforms = 0;
	bool json = false, quiet = false;
	uint64_t v;
	int c, ret;

	regopts_init(&ro);
	while ((c = getopt_long(argc, argv, "qh", longopts, NULL)) != -1) {
		ret = regopts_parse(&ro, c, optarg);
		if (ret < 0)
			return usage_error("convert", "bad registry option");
		if (ret)
			continue;
		switch (c) {
		case 'F':
			if (!strcmp(optarg, "erofs-layers"))
				opts.format = CONVERT_FORMAT_EROFS_LAYERS;
			else if (strcmp(optarg, "ferry"))
				return usage_error("convert", "bad --format \"%s\" (ferry or erofs-layers)",
						   optarg);
			break;
		case 'c':
			if (parse_size(optarg, &v) || v > UINT32_MAX)
				return usage_error("convert", "bad --chunk-size \"%s\"", optarg);
			opts.chunk_size = (uint32_t)v;
			break;
		case 'z':
			/* Raw deflate is for native layers: EROFS decodes it. */
			opts.deflate_level = 0;
			if (!strncmp(optarg, "deflate", 7)) {
				opts.deflate_level = 6;
				if (optarg[7] && (optarg[7] != ':' || parse_size(optarg + 8, &v) ||
						  v < 1 || v > 9))
					return usage_error("convert", "bad --compress \"%s\" (deflate[:1-9])",
							   optarg);
				if (optarg[7])
					opts.deflate_level = (int)v;
			} else if (blob_compress_parse(optarg, &opts.compress)) {
				return usage_error("convert", "bad --compress \"%s\"", optarg);
			}
			break;
		case 'i':
			if (parse_size(optarg, &v) || v > UINT32_MAX)
				return usage_error("convert", "bad --inline-max \"%s\"", optarg);
			opts.inline_max = (uint32_t)v;
			break;
		case 'J':
			if (parse_size(optarg, &v) || v < 1 || v > 256)
				return usage_error("convert", "bad --jobs \"%s\" (1..256)", optarg);
			opts.jobs = (unsigned int)v;
			break;
		case 'p':
			if (!strchr(optarg, '/'))
				return usage_error("convert", "bad --platform \"%s\" (os/arch[/variant])",
						   optarg);
			if (nr_platforms == CONVERT_PLATFORMS_MAX)
				return usage_error("convert", "at most %d --platform options",
						   CONVERT_PLATFORMS_MAX);
			platforms[nr_platforms++] = optarg;
			break;
		case 'D':
			opts.chunk_dict = optarg;
			break;
		case 'P':
			opts.prefetch_files = optarg;
			break;
		case 'L':
			opts.no_loader_deps = true;
			break;
		case 'G':
			opts.no_fragments = true;
			break;
		case 'f':
			opts.replace = true;
			break;
		case 'j':
			json = true;
			break;
		case 'q':
			quiet = true;
			break;
		case 'h':
			convert_help();
			return EXIT_OK;
		default:
			return usage_error("convert", "unknown option");
		}
	}
	if (argc - optind != 2)
		return usage_error("convert", "expected SOURCE and DEST");
	if (nr_platforms == 1)
		opts.platform = platforms[0];
	else if (nr_platforms)
		opts.platforms = platforms;
	if (opts.no_fragments && opts.format != CONVERT_FORMAT_EROFS_LAYERS)
		return usage_error("convert", "--no-fragments is for --format erofs-layers");
	if (opts.deflate_level && opts.format != CONVERT_FORMAT_EROFS_LAYERS)
		return usage_error("convert", "--compress deflate is for --format erofs-layers");
	ret = regopts_finish(&ro);
	if (ret)
		return ret;
	if (quiet || json)
		ferry_progress_enabled = false;
	if (convert_check_args(argv[optind], argv[optind + 1], &opts))
		return usage_error("convert", "invalid arguments");
	/* Stopped at the next entry or chunk; the destination is unwound. */
	ro.fetch.cancel = &interrupted;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	ret = convert_run(argv[optind], argv[optind + 1], &opts, &stats);
	if (ret && interrupted) {
		ferry_err("convert %s: interrupted (%s): %s is left as it was",
			  argv[optind], strsignal(interrupt_signal), argv[optind + 1]);
		signal(interrupt_signal, SIG_DFL);
		raise(interrupt_signal);
		return EXIT_FAIL;
	}
	if (ret) {
		ferry_err("convert %s: failed: %s", argv[optind], ferry_strerror(ret));
		return EXIT_FAIL;
	}
	if (json)
		print_json(&stats, &opts);
	else if (!quiet && ferry_log_level >= FERRY_LOG_INFO)
		print_summary(&stats);
	convert_stats_free(&stats);
	return EXIT_OK;
}
