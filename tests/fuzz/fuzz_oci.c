// SPDX-License-Identifier: MIT
/*
 * libFuzzer target for pkg-image's parsers of OCI and ferry JSON, which
 * registries and image authors write: an OCI layout's index.json (the tag
 * lookup), manifests and image indexes (nested indexes, platforms) with
 * their config, the checks that make a manifest a ferry image (bootstrap
 * layer, its digest annotation, blob layers, annotations), and a dir:
 * image's ferry.json.
 *
 * The input is a list of documents separated by "\n--\n". The first is
 * read as index.json and as ferry.json; all of them feed
 * oci_image_resolve as the answers to its loads, in order, starting from
 * the first as the top manifest or index. The loaders check sizes and
 * digests before resolve sees a byte (tests/image covers that), so this
 * loader ignores them and the fuzzer need not forge sha256s. Accepted
 * results are checked for consistency. An ordinary image (no ferry
 * bootstrap) is looked up in the next document as a list of referrers
 * (index.json, a referrers API answer or tag), the documents after it its
 * ferry index manifests: what makes an index this image's (FORMAT.md 1e).
 */
#include <json-c/json.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../pkg-base/base.h"
#include "../../pkg-image/internal.h"

#define DOCS_MAX 8
#define SEPARATOR "\n--\n"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct docs {
	const char *doc[DOCS_MAX];
	size_t len[DOCS_MAX];
	unsigned int n, next;
};

/* The next document, whatever @d names. */
static int fuzz_load(void *ctx, const struct oci_descriptor *d, bool manifest,
		     uint8_t **out, size_t *len)
{
	struct docs *docs = ctx;
	unsigned int i = docs->next++;

	(void)d;
	(void)manifest;
	if (i >= docs->n)
		return -ENOENT;
	*out = malloc(docs->len[i] + 1);
	if (!*out)
		return -ENOMEM;
	memcpy(*out, docs->doc[i], docs->len[i]);
	*len = docs->len[i];
	return 0;
}

static struct json_object *parse(const char *text, size_t len)
{
	struct json_tokener *tok = json_tokener_new();
	struct json_object *o = tok ? json_tokener_parse_ex(tok, text, (int)len) : NULL;

	if (tok)
		json_tokener_free(tok);
	return o;
}

static void check_str(const char *s, size_t cap)
{
	if (strnlen(s, cap) >= cap)
		abort();
}

/* The descriptors an OCI image is made of are complete. */
static void check_oci(const struct oci_image *oci)
{
	struct json_object *layers;
	uint32_t i;

	if (!oci->manifest || !json_object_is_type(oci->manifest, json_type_object) ||
	    !json_object_object_get_ex(oci->manifest, "layers", &layers) ||
	    json_object_array_length(layers) != oci->nr_layers ||
	    (oci->nr_layers && !oci->layers) || (oci->config_len && !oci->config_data))
		abort();
	check_str(oci->config.media_type, sizeof(oci->config.media_type));
	for (i = 0; i < oci->nr_layers; i++)
		check_str(oci->layers[i].media_type, sizeof(oci->layers[i].media_type));
}

static void check_image(const struct image *img, const struct image_expect *e,
			uint32_t nr_blobs)
{
	check_str(img->compression, sizeof(img->compression));
	if (e->nr_blobs != nr_blobs || (nr_blobs && !e->blobs))
		abort();
}

static void fuzz_index(const char *text, size_t len)
{
	struct json_object *o = parse(text, len);
	struct image_expect e = { 0 };
	char ref[] = "fuzz";
	struct image img = { .ref = ref };
	struct oci_descriptor d;
	struct json_object *blobs;

	if (!o)
		return;
	if (json_object_is_type(o, json_type_object)) {
		if (!oci_index_pick(o, "fuzz", NULL, &d) ||
		    !oci_index_pick(o, "fuzz", "v1", &d))
			check_str(d.media_type, sizeof(d.media_type));
		if (!image_expect_dir(&img, o, "fuzz/ferry.json", &e) &&
		    json_object_object_get_ex(o, "blobs", &blobs))
			check_image(&img, &e, (uint32_t)json_object_array_length(blobs));
		image_expect_free(&e);
	}
	json_object_put(o);
}

static int fuzz_load_manifest(void *ctx, const struct oci_descriptor *d,
			      uint8_t **out, size_t *len)
{
	return fuzz_load(ctx, d, true, out, len);
}

/* The ferry index of the ordinary image @oci, its list the next document. */
static void fuzz_index_of(struct docs *docs, const struct oci_image *oci)
{
	struct image_expect e = { 0 };
	char ref[] = "fuzz";
	struct image img = { .ref = ref };
	struct json_object *list;
	unsigned int i = docs->next++;
	uint32_t k;

	if (i >= docs->n || !(list = parse(docs->doc[i], docs->len[i])))
		return;
	if (!image_index_from_list(&img, oci, list, fuzz_load_manifest, docs, &e)) {
		if (!e.index || e.nr_layers != oci->nr_layers || !e.compressed_bootstrap)
			abort();
		for (k = 0; k < e.nr_layers; k++)
			if (memcmp(e.layers[k].digest, oci->layers[k].digest, 32))
				abort();
	}
	image_expect_free(&e);
	free(img.dir);
	free(img.index_layers);
	free(img.index_diff_ids);
	json_object_put(list);
}

static void fuzz_resolve(struct docs *docs)
{
	struct oci_descriptor top = { .size = docs->len[0] };
	struct oci_image oci = { .where = strdup("fuzz") };
	struct image_expect e = { 0 };
	char ref[] = "fuzz";
	struct image img = { .ref = ref };

	if (!oci.where)
		return;
	if (!oci_image_resolve(&oci, &top, "linux/amd64",
			       &(struct oci_loader){ .load = fuzz_load, .ctx = docs })) {
		check_oci(&oci);
		if (oci.nr_layers && !oci_is_ferry_bootstrap(oci.layers[oci.nr_layers - 1].media_type))
			fuzz_index_of(docs, &oci);
		else if (!image_expect_manifest(&img, &oci, &e))
			check_image(&img, &e, oci.nr_layers - 1);
		image_expect_free(&e);
		free(img.dir);
	}
	oci_image_free(&oci);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct docs docs = { 0 };
	const char *p = (const char *)data, *end = p + size, *sep;

	ferry_log_level = -1;
	if (size > OCI_JSON_MAX)
		return 0;
	while (docs.n < DOCS_MAX) {
		sep = memmem(p, (size_t)(end - p), SEPARATOR, strlen(SEPARATOR));
		docs.doc[docs.n] = p;
		docs.len[docs.n++] = (size_t)((sep ? sep : end) - p);
		if (!sep)
			break;
		p = sep + strlen(SEPARATOR);
	}
	fuzz_index(docs.doc[0], docs.len[0]);
	fuzz_resolve(&docs);
	return 0;
}
