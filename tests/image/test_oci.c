// SPDX-License-Identifier: MIT
/*
 * Tests for OCI image layouts (oci.c): layouts written with the same
 * primitives ferry convert uses (blobs, oci-layout, tags in index.json),
 * then resolved through index.json: tags, image indexes with platforms,
 * nested indexes, and every digest, size and type the resolver must
 * refuse. Also the reference parser the resolver is reached through.
 */
#include "../test.h"

#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../pkg-base/base.h"
#include "../../pkg-image/image.h"
#include "../../pkg-image/internal.h"

static char tmpdir[64];

/* Store @text as a blob of @layout: its descriptor (type @type) in @d. */
static void put(const char *layout, const char *type, const char *text,
		struct oci_descriptor *d)
{
	memset(d, 0, sizeof(*d));
	d->size = strlen(text);
	snprintf(d->media_type, sizeof(d->media_type), "%s", type);
	if (oci_put_blob(layout, text, d->size, d->digest))
		abort();
}

/* {"mediaType":..,"digest":..,"size":..} plus @extra members. */
static void desc_json(char *out, size_t len, const struct oci_descriptor *d,
		      const char *extra)
{
	char dstr[DIGEST_STRING_SIZE];

	digest_format(d->digest, dstr);
	snprintf(out, len, "{\"mediaType\":\"%s\",\"digest\":\"%s\",\"size\":%llu%s}",
		 d->media_type, dstr, (unsigned long long)d->size, extra);
}

/* A manifest with one layer holding @layer_text, stored; its descriptor. */
static void put_manifest(const char *layout, const char *layer_text,
			 struct oci_descriptor *m)
{
	struct oci_descriptor config, layer;
	char cj[512], lj[512], text[1536];

	put(layout, OCI_CONFIG_TYPE, "{\"os\":\"linux\"}", &config);
	put(layout, "application/vnd.oci.image.layer.v1.tar", layer_text, &layer);
	desc_json(cj, sizeof(cj), &config, "");
	desc_json(lj, sizeof(lj), &layer, "");
	snprintf(text, sizeof(text),
		 "{\"schemaVersion\":2,\"mediaType\":\"%s\",\"config\":%s,\"layers\":[%s]}",
		 FETCH_OCI_MANIFEST, cj, lj);
	put(layout, FETCH_OCI_MANIFEST, text, m);
}

static int open_ref(const char *ref, const char *platform, struct oci_image *img)
{
	struct image_ref r;
	int ret = image_ref_parse(ref, IMAGE_ACCEPT(IMAGE_OCI), "test", &r);

	if (!ret)
		ret = oci_image_open(&r, platform, NULL, img);
	image_ref_free(&r);
	return ret;
}

/* The layer the image at @ref resolves to has the bytes @want. */
static bool resolves_to(const char *ref, const char *platform, const char *want)
{
	struct oci_image img;
	uint8_t d[32];
	bool ok;

	if (open_ref(ref, platform, &img))
		return false;
	sha256_buf(want, strlen(want), d);
	ok = img.nr_layers == 1 && !memcmp(img.layers[0].digest, d, 32) &&
	     img.layers[0].size == strlen(want) && img.config_len == 14 &&
	     !memcmp(img.config_data, "{\"os\":\"linux\"}", 14);
	oci_image_free(&img);
	return ok;
}

static void test_ref_parse(void)
{
	static const struct {
		const char *s;
		unsigned int accept;
		int ret;
		enum image_transport t;
		const char *path, *tag;
	} cases[] = {
		{ "dir:/a/b", IMAGE_ACCEPT_IMAGE, 0, IMAGE_DIR, "/a/b", NULL },
		{ "/a/b", IMAGE_ACCEPT_IMAGE, 0, IMAGE_DIR, "/a/b", NULL },
		{ "./x:y", IMAGE_ACCEPT_IMAGE, 0, IMAGE_DIR, "./x:y", NULL },
		{ "rel", IMAGE_ACCEPT_IMAGE, 0, IMAGE_DIR, "rel", NULL },
		{ "host:5000/x", IMAGE_ACCEPT_IMAGE, -EINVAL, 0, NULL, NULL },
		{ "rel", IMAGE_ACCEPT(IMAGE_DIR), -EINVAL, 0, NULL, NULL },
		{ "tar:l.tar", IMAGE_ACCEPT(IMAGE_TAR), 0, IMAGE_TAR, "l.tar", NULL },
		{ "tar:l.tar", IMAGE_ACCEPT_IMAGE, -EINVAL, 0, NULL, NULL },
		{ "oci:/l", IMAGE_ACCEPT_IMAGE, 0, IMAGE_OCI, "/l", NULL },
		{ "oci:/l:v1", IMAGE_ACCEPT_IMAGE, 0, IMAGE_OCI, "/l", "v1" },
		{ "oci:/l:v1/x", IMAGE_ACCEPT_IMAGE, 0, IMAGE_OCI, "/l:v1/x", NULL },
		{ "oci:a:b:c", IMAGE_ACCEPT_IMAGE, 0, IMAGE_OCI, "a:b", "c" },
		{ "oci:/l:", IMAGE_ACCEPT_IMAGE, 0, IMAGE_OCI, "/l:", NULL },
		{ "oci:", IMAGE_ACCEPT_IMAGE, -EINVAL, 0, NULL, NULL },
		{ "dir:", IMAGE_ACCEPT_IMAGE, -EINVAL, 0, NULL, NULL },
		{ "docker://r.io/a/b:1", IMAGE_ACCEPT_IMAGE, 0, IMAGE_DOCKER, "r.io/a/b:1", NULL },
		{ "docker://debian", IMAGE_ACCEPT_IMAGE, 0, IMAGE_DOCKER,
		  "docker.io/library/debian:latest", NULL },
		{ "docker://index.docker.io/a/b@sha256:0123456789abcdef0123456789abcdef"
		  "0123456789abcdef0123456789abcdef", IMAGE_ACCEPT_IMAGE, 0, IMAGE_DOCKER,
		  "docker.io/a/b@sha256:0123456789abcdef0123456789abcdef"
		  "0123456789abcdef0123456789abcdef", NULL },
		{ "docker://r.io/A", IMAGE_ACCEPT_IMAGE, -EINVAL, 0, NULL, NULL },
		{ "docker:r.io/a", IMAGE_ACCEPT_IMAGE, -EINVAL, 0, NULL, NULL },
		{ "docker://", IMAGE_ACCEPT_IMAGE, -EINVAL, 0, NULL, NULL },
		{ "zip:x", IMAGE_ACCEPT_IMAGE, -EINVAL, 0, NULL, NULL },
	};
	struct image_ref r;
	size_t i;

	for (i = 0; i < ARRAY_SIZE(cases); i++) {
		int ret = image_ref_parse(cases[i].s, cases[i].accept, NULL, &r);

		if (ret != cases[i].ret)
			fprintf(stderr, "  case %s\n", cases[i].s);
		CHECK_EQ(ret, cases[i].ret);
		if (ret)
			continue;
		CHECK_EQ(r.transport, cases[i].t);
		CHECK(!strcmp(r.path, cases[i].path));
		CHECK(cases[i].tag ? r.tag && !strcmp(r.tag, cases[i].tag) : !r.tag);
		image_ref_free(&r);
	}
}

static void test_platform_names(void)
{
	CHECK(oci_platform_names("linux/arm64", "linux/arm64"));
	CHECK(oci_platform_names("linux/arm64", "linux/arm64/v8"));
	CHECK(oci_platform_names("linux/arm64/v8", "linux/arm64/v8"));
	CHECK(!oci_platform_names("linux/arm64/v8", "linux/arm64"));
	CHECK(!oci_platform_names("linux/arm", "linux/arm64"));
	CHECK(!oci_platform_names("linux/arm/v7", "linux/arm/v6"));
	CHECK(!oci_platform_names("linux/amd64", "windows/amd64"));
}

static void test_ref_absolute(void)
{
	char cwd[4096], want[4200], *out = NULL;

	CHECK(getcwd(cwd, sizeof(cwd)));
	CHECK_EQ(image_ref_absolute("dir:a/./b/../c", &out), 0);
	snprintf(want, sizeof(want), "dir:%s/a/c", cwd);
	CHECK(out && !strcmp(out, want));
	free(out);
	CHECK_EQ(image_ref_absolute("img", &out), 0);
	snprintf(want, sizeof(want), "dir:%s/img", cwd);
	CHECK(out && !strcmp(out, want));
	free(out);
	CHECK_EQ(image_ref_absolute("oci:lay:v2", &out), 0);
	snprintf(want, sizeof(want), "oci:%s/lay:v2", cwd);
	CHECK(out && !strcmp(out, want));
	free(out);
	CHECK_EQ(image_ref_absolute("oci:/x/../lay", &out), 0);
	CHECK(out && !strcmp(out, "oci:/lay"));
	free(out);
	/* Registry references and what image_open refuses stay as they are. */
	CHECK_EQ(image_ref_absolute("docker://r.io/a:b", &out), 0);
	CHECK(out && !strcmp(out, "docker://r.io/a:b"));
	free(out);
	CHECK_EQ(image_ref_absolute("tar:x", &out), 0);
	CHECK(out && !strcmp(out, "tar:x"));
	free(out);
}

static void test_tags(void)
{
	char L[128], ref[160];
	struct oci_descriptor m1, m2;
	struct oci_image img;

	snprintf(L, sizeof(L), "%s/tags", tmpdir);
	CHECK_EQ(oci_layout_init(L), 0);
	put_manifest(L, "one", &m1);
	CHECK_EQ(oci_tag_manifest(L, "v1", m1.digest, m1.size, m1.media_type), 0);
	/* The only image: found with or without its tag. */
	snprintf(ref, sizeof(ref), "oci:%s:v1", L);
	CHECK(resolves_to(ref, NULL, "one"));
	snprintf(ref, sizeof(ref), "oci:%s", L);
	CHECK(resolves_to(ref, NULL, "one"));
	snprintf(ref, sizeof(ref), "oci:%s:nosuch", L);
	CHECK_EQ(open_ref(ref, NULL, &img), -ENOENT);

	/* A second tag: a bare layout is ambiguous now. */
	put_manifest(L, "two", &m2);
	CHECK_EQ(oci_tag_manifest(L, "v2", m2.digest, m2.size, m2.media_type), 0);
	snprintf(ref, sizeof(ref), "oci:%s", L);
	CHECK_EQ(open_ref(ref, NULL, &img), -ENOENT);
	snprintf(ref, sizeof(ref), "oci:%s:v2", L);
	CHECK(resolves_to(ref, NULL, "two"));
	snprintf(ref, sizeof(ref), "oci:%s:v1", L);
	CHECK(resolves_to(ref, NULL, "one"));

	/* Retagging moves the tag; the other entries stay. */
	CHECK_EQ(oci_tag_manifest(L, "v1", m2.digest, m2.size, m2.media_type), 0);
	CHECK(resolves_to(ref, NULL, "two"));
	CHECK_EQ(test_run("test $(grep -o ref.name %s/index.json | wc -l) = 2", L), 0);
	CHECK_EQ(test_run("test -f %s/oci-layout", L), 0);

	/* Not a layout, or an unreadable index.json. */
	snprintf(ref, sizeof(ref), "oci:%s/none", tmpdir);
	CHECK_EQ(open_ref(ref, NULL, &img), -ENOENT);
	CHECK_EQ(test_run("echo '[' > %s/index.json", L), 0);
	snprintf(ref, sizeof(ref), "oci:%s:v1", L);
	CHECK_EQ(open_ref(ref, NULL, &img), -EFSCORRUPTED);
	CHECK_EQ(oci_tag_manifest(L, "v3", m2.digest, m2.size, m2.media_type),
		 -EFSCORRUPTED);
}

static void test_platforms(void)
{
	char L[128], ref[160], a[512], b[512], v7[512], text[2048], host[64];
	struct oci_descriptor ma, mb, mv7, index, outer;
	struct oci_image img;
	int depth;

	snprintf(L, sizeof(L), "%s/multi", tmpdir);
	CHECK_EQ(oci_layout_init(L), 0);
	put_manifest(L, "amd64", &ma);
	put_manifest(L, "arm64", &mb);
	put_manifest(L, "armv7", &mv7);
	desc_json(a, sizeof(a), &ma,
		  ",\"platform\":{\"os\":\"linux\",\"architecture\":\"amd64\"}");
	desc_json(b, sizeof(b), &mb,
		  ",\"platform\":{\"os\":\"linux\",\"architecture\":\"arm64\",\"variant\":\"v8\"}");
	desc_json(v7, sizeof(v7), &mv7,
		  ",\"platform\":{\"os\":\"linux\",\"architecture\":\"arm\",\"variant\":\"v7\"}");
	snprintf(text, sizeof(text),
		 "{\"schemaVersion\":2,\"mediaType\":\"%s\",\"manifests\":[%s,%s,%s]}",
		 FETCH_OCI_INDEX, a, b, v7);
	put(L, FETCH_OCI_INDEX, text, &index);
	CHECK_EQ(oci_tag_manifest(L, "multi", index.digest, index.size,
				  index.media_type), 0);
	snprintf(ref, sizeof(ref), "oci:%s:multi", L);
	CHECK(resolves_to(ref, "linux/amd64", "amd64"));
	/* Without a variant any variant matches; with one, it must. */
	CHECK(resolves_to(ref, "linux/arm64", "arm64"));
	CHECK(resolves_to(ref, "linux/arm64/v8", "arm64"));
	CHECK(resolves_to(ref, "linux/arm/v7", "armv7"));
	CHECK_EQ(open_ref(ref, "linux/arm64/v9", &img), -ENOENT);
	CHECK_EQ(open_ref(ref, "linux/s390x", &img), -ENOENT);
	/* No platform given: the host's. */
	CHECK_EQ(oci_host_platform(host, sizeof(host)), 0);
	if (!strcmp(host, "linux/amd64"))
		CHECK(resolves_to(ref, NULL, "amd64"));
	else if (!strcmp(host, "linux/arm64"))
		CHECK(resolves_to(ref, NULL, "arm64"));

	/* Indexes of indexes are followed, to a bounded depth. */
	for (depth = 1; depth <= 5; depth++) {
		desc_json(a, sizeof(a), &index,
			  ",\"platform\":{\"os\":\"linux\",\"architecture\":\"amd64\"}");
		snprintf(text, sizeof(text),
			 "{\"schemaVersion\":2,\"mediaType\":\"%s\",\"manifests\":[%s]}",
			 FETCH_OCI_INDEX, a);
		put(L, FETCH_OCI_INDEX, text, &outer);
		CHECK_EQ(oci_tag_manifest(L, "nested", outer.digest, outer.size,
					  outer.media_type), 0);
		snprintf(ref, sizeof(ref), "oci:%s:nested", L);
		if (depth < 4)
			CHECK(resolves_to(ref, "linux/amd64", "amd64"));
		else
			CHECK_EQ(open_ref(ref, "linux/amd64", &img), -EFSCORRUPTED);
		index = outer;
	}
}

/* Tag @tag of @L at a manifest descriptor that lies about @d. */
static int open_tagged(const char *L, const char *tag,
		       const struct oci_descriptor *d)
{
	char ref[160];
	struct oci_image img;
	int ret;

	if (oci_tag_manifest(L, tag, d->digest, d->size, d->media_type))
		return -EIO;
	snprintf(ref, sizeof(ref), "oci:%s:%s", L, tag);
	ret = open_ref(ref, NULL, &img);
	if (!ret)
		oci_image_free(&img);
	return ret;
}

static void test_mismatches_refused(void)
{
	char L[128], path[256], hex[65], text[1536], cj[512];
	struct oci_descriptor m, bad, config;

	snprintf(L, sizeof(L), "%s/bad", tmpdir);
	CHECK_EQ(oci_layout_init(L), 0);
	put_manifest(L, "layer", &m);

	/* The descriptor's size, larger or smaller than the blob. */
	bad = m;
	bad.size++;
	CHECK_EQ(open_tagged(L, "long", &bad), -EFSCORRUPTED);
	bad.size -= 2;
	CHECK_EQ(open_tagged(L, "short", &bad), -EFSCORRUPTED);
	/* A manifest larger than OCI_JSON_MAX is not even read. */
	bad.size = OCI_JSON_MAX + 1ull;
	CHECK_EQ(open_tagged(L, "huge", &bad), -EFBIG);
	/* A blob whose bytes do not hash to its name. */
	bad = m;
	bad.digest[0] ^= 1;
	hex_encode(bad.digest, 32, hex);
	snprintf(path, sizeof(path), "%s/blobs/sha256/%s", L, hex);
	CHECK_EQ(open_tagged(L, "missing", &bad), -ENOENT);
	hex_encode(m.digest, 32, hex);
	snprintf(text, sizeof(text), "cp %s/blobs/sha256/%s %s", L, hex, path);
	CHECK_EQ(system(text), 0);
	CHECK_EQ(open_tagged(L, "renamed", &bad), -EFSCORRUPTED);

	/* A config that does not match its descriptor. */
	put(L, OCI_CONFIG_TYPE, "{\"os\":\"linux\"}", &config);
	config.size--;
	desc_json(cj, sizeof(cj), &config, "");
	snprintf(text, sizeof(text),
		 "{\"schemaVersion\":2,\"mediaType\":\"%s\",\"config\":%s,\"layers\":[]}",
		 FETCH_OCI_MANIFEST, cj);
	put(L, FETCH_OCI_MANIFEST, text, &bad);
	CHECK_EQ(open_tagged(L, "badconfig", &bad), -EFSCORRUPTED);

	/* Documents that are no manifest, or malformed ones. */
	put(L, "application/json", "{\"hello\":1}", &bad);
	CHECK_EQ(open_tagged(L, "neither", &bad), -EFSCORRUPTED);
	put(L, FETCH_OCI_MANIFEST, "[1,2]", &bad);
	CHECK_EQ(open_tagged(L, "array", &bad), -EFSCORRUPTED);
	snprintf(text, sizeof(text),
		 "{\"schemaVersion\":2,\"mediaType\":\"%s\",\"config\":%s,\"layers\":[{\"digest\":\"sha256:12\",\"size\":1}]}",
		 FETCH_OCI_MANIFEST, cj);
	put(L, FETCH_OCI_MANIFEST, text, &bad);
	CHECK_EQ(open_tagged(L, "baddigest", &bad), -EFSCORRUPTED);
	put(L, FETCH_OCI_INDEX, "{\"manifests\":{}}", &bad);
	CHECK_EQ(open_tagged(L, "badindex", &bad), -EFSCORRUPTED);
	/* The intact image still resolves. */
	CHECK_EQ(open_tagged(L, "good", &m), 0);
	snprintf(text, sizeof(text), "oci:%s:good", L);
	CHECK(resolves_to(text, NULL, "layer"));
}

int main(void)
{
	ferry_log_level = -1;
	strcpy(tmpdir, "/tmp/ferry-test-oci-XXXXXX");
	if (!mkdtemp(tmpdir))
		return 1;
	RUN_TEST(test_ref_parse);
	RUN_TEST(test_platform_names);
	RUN_TEST(test_ref_absolute);
	RUN_TEST(test_tags);
	RUN_TEST(test_platforms);
	RUN_TEST(test_mismatches_refused);
	test_run("rm -rf %s", tmpdir);
	TEST_MAIN_END();
}
