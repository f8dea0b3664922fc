// SPDX-License-Identifier: MIT
/*
 * ferry cache ls|gc|prune|verify: the chunk cache shared by every image
 * and mount.
 */
#include <getopt.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../pkg-base/base.h"
#include "../../pkg-blob/blob.h"
#include "../../pkg-image/image.h"
#include "cmd.h"

static void cache_help(void)
{
	printf("Usage: ferry cache [--cache-dir DIR] [--json] ls\n"
	       "       ferry cache [--cache-dir DIR] gc\n"
	       "       ferry cache [--cache-dir DIR] prune (--all | IMAGE...)\n"
	       "       ferry cache [--cache-dir DIR] [--json] verify\n\n"
	       "The chunk cache holds each blob's uncompressed bytes as fetched\n"
	       "(a sparse file) with a record of which chunks are present, plus a\n"
	       "record of every image mounted through it.\n\n"
	       "  ls      blobs (size, chunks present, disk usage, images using\n"
	       "          them, in use), image records, and the cachefiles\n"
	       "          mode's kernel cache (DIR/fscache: files, disk usage,\n"
	       "          the process holding /dev/cachefiles)\n"
	       "  gc      remove blobs that no image record names and no process\n"
	       "          has open; registry documents and bootstraps kept for\n"
	       "          images (DIR/meta, DIR/bootstraps) that no record names,\n"
	       "          once a minute old; in DIR/fscache, unless\n"
	       "          /dev/cachefiles is held (the kernel culls a bound cache\n"
	       "          itself), the cache files of blobs no record names\n"
	       "  prune   forget the image records named (by reference as listed\n"
	       "          or by sha256:DIGEST), or all with --all, then gc\n"
	       "  verify  re-hash every chunk marked present; one that does not\n"
	       "          match is cleared (fetched again when next read) and\n"
	       "          the exit status is 1\n\n"
	       "Options:\n"
	       "  --cache-dir DIR   default $FERRY_CACHE_DIR or %s\n"
	       "  --all             prune: every image record\n"
	       "  --json            ls, verify: JSON on stdout\n"
	       "  -h, --help        this help\n\n" EXIT_CODES_HELP,
	       FERRY_DEFAULT_CACHE_DIR);
}

static void print_list(const struct blob_cache_list *l,
		       const struct image_fscache_usage *fu, const char *dir, bool json)
{
	struct json_object *root, *blobs, *images, *o;
	char d[72];
	uint64_t disk = 0;
	uint32_t i;

	if (!json) {
		printf("%-71s %14s %9s %14s %6s %s\n", "BLOB", "SIZE", "PRESENT",
		       "DISK", "IMAGES", "IN USE");
		for (i = 0; i < l->nr_blobs; i++) {
			const struct blob_cache_entry *b = &l->blobs[i];

			digest_format(b->digest, d);
			printf("%-71s %14llu %4u/%-4u %14llu %6u %s\n", d,
			       (unsigned long long)b->uncompressed_size,
			       b->chunks_present, b->nr_chunks,
			       (unsigned long long)b->disk_bytes, b->nr_images,
			       b->in_use ? "yes" : "no");
			disk += b->disk_bytes;
		}
		printf("%u blobs, %llu bytes on disk\n", l->nr_blobs,
		       (unsigned long long)disk);
		if (l->limited)
			printf("usage %llu bytes, limit %llu (0: none), keeping %u%% of the file system free; ferryd evicted %llu bytes\n",
			       (unsigned long long)l->usage,
			       (unsigned long long)l->max_size, l->min_free_pct,
			       (unsigned long long)l->evicted);
		printf("\nIMAGE%67s BLOBS\n", "");
		for (i = 0; i < l->nr_images; i++) {
			digest_format(l->images[i].digest, d);
			printf("%-71s %5u  %s\n", d, l->images[i].nr_blobs,
			       l->images[i].ref);
		}
		printf("\nfscache (cachefiles mode, the kernel's): %llu files, %llu bytes on disk in %s/%s",
		       (unsigned long long)fu->files, (unsigned long long)fu->disk_bytes,
		       dir, IMAGE_FSCACHE_DIR);
		if (fu->holder)
			printf("; bound: /dev/cachefiles held by pid %d (%s)", fu->holder,
			       fu->holder_comm);
		printf("\n");
		return;
	}
	root = json_object_new_object();
	blobs = json_object_new_array();
	images = json_object_new_array();
	for (i = 0; i < l->nr_blobs; i++) {
		const struct blob_cache_entry *b = &l->blobs[i];

		o = json_object_new_object();
		digest_format(b->digest, d);
		json_object_object_add(o, "digest", json_object_new_string(d));
		json_object_object_add(o, "uncompressedSize",
				       json_object_new_int64((int64_t)b->uncompressed_size));
		json_object_object_add(o, "chunks", json_object_new_int64(b->nr_chunks));
		json_object_object_add(o, "chunksPresent",
				       json_object_new_int64(b->chunks_present));
		json_object_object_add(o, "diskBytes",
				       json_object_new_int64((int64_t)b->disk_bytes));
		json_object_object_add(o, "images", json_object_new_int64(b->nr_images));
		json_object_object_add(o, "inUse", json_object_new_boolean(b->in_use));
		json_object_array_add(blobs, o);
	}
	for (i = 0; i < l->nr_images; i++) {
		o = json_object_new_object();
		digest_format(l->images[i].digest, d);
		json_object_object_add(o, "digest", json_object_new_string(d));
		json_object_object_add(o, "ref", json_object_new_string(l->images[i].ref));
		json_object_object_add(o, "blobs", json_object_new_int64(l->images[i].nr_blobs));
		json_object_array_add(images, o);
	}
	json_object_object_add(root, "usage", json_object_new_int64((int64_t)l->usage));
	if (l->limited) {
		json_object_object_add(root, "maxSize",
				       json_object_new_int64((int64_t)l->max_size));
		json_object_object_add(root, "minFreePct",
				       json_object_new_int64(l->min_free_pct));
		json_object_object_add(root, "evictedBytes",
				       json_object_new_int64((int64_t)l->evicted));
	}
	json_object_object_add(root, "blobs", blobs);
	json_object_object_add(root, "images", images);
	o = json_object_new_object();
	json_object_object_add(o, "files", json_object_new_int64((int64_t)fu->files));
	json_object_object_add(o, "diskBytes", json_object_new_int64((int64_t)fu->disk_bytes));
	json_object_object_add(o, "devicePid", fu->holder ? json_object_new_int(fu->holder) : NULL);
	json_object_object_add(root, "fscache", o);
	printf("%s\n", json_object_to_json_string_ext(root, JSON_C_TO_STRING_PRETTY |
						      JSON_C_TO_STRING_NOSLASHESCAPE));
	json_object_put(root);
}

static void print_verify(const struct blob_cache_verify_report *r, bool json)
{
	struct json_object *root, *bad, *o;
	char d[72];
	uint32_t i;

	if (!json) {
		for (i = 0; i < r->nr_bad; i++) {
			digest_format(r->bad[i].blob, d);
			printf("BAD %s chunk %u (uncompressed offset %llu): cleared\n",
			       d, r->bad[i].chunk, (unsigned long long)r->bad[i].uoff);
		}
		printf("%u blobs verified (%u skipped), %llu chunks, %llu bytes; %u bad chunks cleared\n",
		       r->blobs, r->blobs_skipped, (unsigned long long)r->chunks,
		       (unsigned long long)r->bytes, r->nr_bad);
		return;
	}
	root = json_object_new_object();
	bad = json_object_new_array();
	for (i = 0; i < r->nr_bad; i++) {
		o = json_object_new_object();
		digest_format(r->bad[i].blob, d);
		json_object_object_add(o, "blob", json_object_new_string(d));
		json_object_object_add(o, "chunk", json_object_new_int64(r->bad[i].chunk));
		json_object_object_add(o, "uncompressedOffset",
				       json_object_new_int64((int64_t)r->bad[i].uoff));
		json_object_array_add(bad, o);
	}
	json_object_object_add(root, "blobs", json_object_new_int64(r->blobs));
	json_object_object_add(root, "blobsSkipped", json_object_new_int64(r->blobs_skipped));
	json_object_object_add(root, "chunksVerified", json_object_new_int64((int64_t)r->chunks));
	json_object_object_add(root, "bytesVerified", json_object_new_int64((int64_t)r->bytes));
	json_object_object_add(root, "badChunks", bad);
	printf("%s\n", json_object_to_json_string_ext(root, JSON_C_TO_STRING_PRETTY |
						      JSON_C_TO_STRING_NOSLASHESCAPE));
	json_object_put(root);
}

/* Forget the image records @names select (a reference or sha256:DIGEST). */
static int prune(const char *dir, char **names, int nr, bool all)
{
	struct blob_cache_list l;
	char d[72];
	uint32_t i;
	int k, ret;

	if (all)
		return blob_cache_forget_image(dir, NULL);
	ret = blob_cache_list(dir, &l);
	if (ret)
		return ret;
	for (k = 0; k < nr && !ret; k++) {
		bool found = false;

		for (i = 0; i < l.nr_images && !ret; i++) {
			digest_format(l.images[i].digest, d);
			if (strcmp(names[k], d) && strcmp(names[k], l.images[i].ref))
				continue;
			found = true;
			ret = blob_cache_forget_image(dir, l.images[i].digest);
		}
		if (!found && !ret) {
			ferry_err("%s: no image record for \"%s\" (see ferry cache ls)",
				  dir, names[k]);
			ret = -ENOENT;
		}
	}
	blob_cache_list_free(&l);
	return ret;
}

int cmd_cache(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "cache-dir", required_argument, NULL, 'C' },
		{ "json", no_argument, NULL, 'j' },
		{ "all", no_argument, NULL, 'a' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	const char *dir = default_cache_dir(), *sub;
	struct blob_cache_verify_report vr;
	struct image_fscache_usage fu;
	struct blob_cache_list l;
	bool json = false, all = false;
	uint64_t freed = 0;
	uint32_t removed = 0, bad = 0;
	int c, ret;

	while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		switch (c) {
		case 'C':
			dir = optarg;
			break;
		case 'j':
			json = true;
			break;
		case 'a':
			all = true;
			break;
		case 'h':
			cache_help();
			return EXIT_OK;
		default:
			return usage_error("cache", "unknown option");
		}
	}
	if (optind >= argc)
		return usage_error("cache", "expected ls, gc, prune or verify");
	sub = argv[optind++];
	if (!strcmp(sub, "ls")) {
		if (optind != argc)
			return usage_error("cache", "ls takes no arguments");
		ret = blob_cache_list(dir, &l);
		if (!ret) {
			ret = image_fscache_usage(dir, &fu);
			if (!ret)
				print_list(&l, &fu, dir, json);
			blob_cache_list_free(&l);
		}
	} else if (!strcmp(sub, "gc") || !strcmp(sub, "prune")) {
		if (!strcmp(sub, "gc") && optind != argc)
			return usage_error("cache", "gc takes no arguments");
		if (!strcmp(sub, "prune") && all == (optind != argc))
			return usage_error("cache", "prune takes --all or IMAGE names");
		ret = !strcmp(sub, "prune") ?
			prune(dir, argv + optind, argc - optind, all) : 0;
		if (!ret)
			ret = blob_cache_gc(dir, &freed, &removed);
		if (!ret)
			printf("removed %u blobs, freed %llu bytes\n", removed,
			       (unsigned long long)freed);
		if (!ret)
			ret = image_meta_gc(dir, &freed, &removed);
		if (!ret)
			printf("removed %u image documents and bootstraps, freed %llu bytes\n",
			       removed, (unsigned long long)freed);
		if (!ret)
			ret = image_fscache_gc(dir, &freed, &removed, &fu);
		if (!ret && fu.holder)
			printf("fscache: left alone: /dev/cachefiles is held by pid %d (%s); the kernel culls a bound cache itself\n",
			       fu.holder, fu.holder_comm);
		else if (!ret)
			printf("fscache: removed %u cache files, freed %llu bytes\n", removed,
			       (unsigned long long)freed);
	} else if (!strcmp(sub, "verify")) {
		if (optind != argc)
			return usage_error("cache", "verify takes no arguments");
		ret = blob_cache_verify(dir, &vr);
		if (!ret)
			print_verify(&vr, json);
		bad = vr.nr_bad;
		blob_cache_verify_report_free(&vr);
	} else {
		return usage_error("cache", "unknown subcommand \"%s\"", sub);
	}
	if (ret) {
		ferry_err("cache %s %s: %s", sub, dir, ferry_strerror(ret));
		return EXIT_FAIL;
	}
	/* Each bad chunk was logged; the status says some were found. */
	return bad ? EXIT_FAIL : EXIT_OK;
}
