// SPDX-License-Identifier: MIT
/*
 * Tests for opening images (image.c), ferry check (check.c) and prefetch
 * lists (prefetch.c): dir: and oci: images converted here through the
 * library, opened and checked, then copies with a corrupted bootstrap,
 * blob index or index file, each refused with the right errno; an image
 * pinned by digest, and the local copies a registry image's documents and
 * bootstrap are kept as (CACHE/meta, CACHE/bootstraps).
 */
#include "../test.h"

#include <stdbool.h>
#include <sys/stat.h>

#include "fixture.h"
#include "../../pkg-image/internal.h"

static char dir_img[128], oci_img[160], oci_dir[128];

static int open_img(const char *ref, struct image **img)
{
	return image_open(ref, NULL, img);
}

static void test_open_dir(void)
{
	struct image_check_report report;
	struct image *img = NULL;
	struct meta_stat st;
	char ref[160], name[256];
	uint64_t nid;

	CHECK_EQ(open_img(dir_img, &img), 0);
	if (!img)
		return;
	CHECK_EQ(img->blobs.nr_blobs, 1);
	CHECK_EQ(img->chunk_size, FIXTURE_CHUNK);
	CHECK(!strcmp(img->compression, "none"));
	CHECK(!img->remote && img->dir && img->bootstrap_path);
	CHECK(!memcmp(img->image_digest, img->bootstrap_digest, 32));
	CHECK_EQ(img->nr_prefetch, 0);
	CHECK_EQ(meta_resolve(img->meta, "/big", &nid), 0);
	CHECK_EQ(meta_getattr(img->meta, nid, &st), 0);
	CHECK_EQ(st.size, FIXTURE_BIG_SIZE);
	CHECK_EQ(st.nr_chunks, 4);
	image_blob_name(img, 0, name, sizeof(name));
	CHECK(!strcmp(name, img->blob_paths[0]));
	CHECK_EQ(image_check(img, &report), 0);
	CHECK_EQ(report.error, 0);
	CHECK(report.inodes >= 6);
	CHECK_EQ(report.chunks, 4);
	CHECK_EQ(report.bytes_verified, img->blobs.blobs[0].uncompressed_size);
	/* The bare path means the same image. */
	image_close(img);
	CHECK_EQ(open_img(dir_img + 4, &img), 0);
	image_close(img);
	snprintf(ref, sizeof(ref), "%s/nosuch", dir_img);
	CHECK_EQ(open_img(ref, &img), -ENOENT);
	CHECK_EQ(open_img("zip:x", &img), -EINVAL);
	CHECK_EQ(open_img("tar:x", &img), -EINVAL);
	CHECK_EQ(open_img("host:5000/x", &img), -EINVAL);
}

static void test_open_oci(void)
{
	struct image_check_report report;
	struct image *img = NULL, *copy = NULL;
	char ref[160], path[256], hex[65];
	uint8_t digest[32];
	char *data = NULL;
	size_t len = 0;

	CHECK_EQ(open_img(oci_img, &img), 0);
	if (!img)
		return;
	CHECK_EQ(img->blobs.nr_blobs, 1);
	CHECK(!img->bootstrap_path); /* stored compressed: none until asked */
	CHECK(memcmp(img->image_digest, img->bootstrap_digest, 32));
	CHECK_EQ(image_check(img, &report), 0);
	/* A raw bootstrap for the kernel, content-addressed in the cache. */
	snprintf(path, sizeof(path), "%s/cache", tmpdir);
	CHECK_EQ(image_bootstrap_file(img, path), 0);
	hex_encode(img->bootstrap_digest, 32, hex);
	snprintf(path, sizeof(path), "%s/cache/bootstraps/%s", tmpdir, hex);
	CHECK(img->bootstrap_path && !strcmp(img->bootstrap_path, path));
	CHECK_EQ(read_file_max(path, 1 << 30, &data, &len), 0);
	sha256_buf(data, len, digest);
	CHECK(!memcmp(digest, img->bootstrap_digest, 32));
	CHECK(img->bootstrap_fd >= 0);
	CHECK_EQ(image_validate_metadata(img), 0);
	/*
	 * A cached copy of the same size with other bytes (planted, or
	 * damaged) is never used: the next image opened replaces it.
	 */
	data[len / 2] ^= 0x55;
	CHECK_EQ(sh("chmod 600 %s", path), 0);
	{
		FILE *f = fopen(path, "we");

		CHECK(f && fwrite(data, 1, len, f) == len);
		if (f)
			fclose(f);
	}
	free(data);
	data = NULL;
	CHECK_EQ(open_img(oci_img, &copy), 0);
	snprintf(ref, sizeof(ref), "%s/cache", tmpdir);
	fprintf(stderr, "  (a warning about a replaced bootstrap is expected)\n");
	CHECK(copy && !image_bootstrap_file(copy, ref) && copy->bootstrap_fd >= 0);
	image_close(copy);
	copy = NULL;
	CHECK_EQ(read_file_max(path, 1 << 30, &data, &len), 0);
	sha256_buf(data, len, digest);
	CHECK(!memcmp(digest, img->bootstrap_digest, 32));
	free(data);
	/* Copying a blob into another directory: hardlinked or copied. */
	snprintf(path, sizeof(path), "%s/copy/blobs/sha256", tmpdir);
	CHECK_EQ(mkdir_p(path, 0755), 0);
	snprintf(path, sizeof(path), "%s/copy", tmpdir);
	CHECK_EQ(image_copy_blob(img, 0, path), 0);
	CHECK_EQ(image_copy_blob(img, 0, path), 0);
	hex_encode(img->blobs.blobs[0].digest, 32, hex);
	CHECK_EQ(sh("cmp -s %s/copy/blobs/sha256/%s %s", tmpdir, hex,
		    img->blob_paths[0]), 0);
	/* The same image under its only tag, or under none. */
	snprintf(ref, sizeof(ref), "oci:%s/oci", tmpdir);
	CHECK_EQ(open_img(ref, &copy), 0);
	CHECK(copy && !memcmp(copy->image_digest, img->image_digest, 32));
	image_close(copy);
	snprintf(ref, sizeof(ref), "oci:%s/oci:nosuch", tmpdir);
	CHECK_EQ(open_img(ref, &copy), -ENOENT);
	image_close(img);
}

/* A fresh copy of image directory @src (dir: or oci: layout) at TMP/c. */
static const char *scratch(const char *src)
{
	static char path[128];

	snprintf(path, sizeof(path), "%s/c", tmpdir);
	if (sh("rm -rf %s && cp -a %s %s", path, src, path))
		abort();
	return path;
}

/* Rewrite TMP/c/ferry.json with the Python expression @edit of j. */
static int edit_index(const char *edit)
{
	return sh("python3 -c 'import json,sys; p=\"%s/c/ferry.json\"; "
		  "j=json.load(open(p)); %s; json.dump(j, open(p, \"w\"))'",
		  tmpdir, edit);
}

static int open_scratch(void)
{
	struct image *img = NULL;
	char ref[160];
	int ret;

	snprintf(ref, sizeof(ref), "dir:%s/c", tmpdir);
	ret = open_img(ref, &img);
	image_close(img);
	return ret;
}

static void test_corrupt_dir(void)
{
	struct image_check_report report;
	struct image *img = NULL;
	char path[256], ref[160];
	const char *c;

	c = scratch(dir_img + 4);
	CHECK_EQ(sh("rm %s/ferry.json", c), 0);
	CHECK_EQ(open_scratch(), -ENOENT);
	c = scratch(dir_img + 4);
	CHECK_EQ(sh("echo '{' > %s/ferry.json", c), 0);
	CHECK_EQ(open_scratch(), -EFSCORRUPTED);
	c = scratch(dir_img + 4);
	CHECK_EQ(edit_index("j[\"schemaVersion\"] = 2"), 0);
	CHECK_EQ(open_scratch(), -EFSCORRUPTED);
	c = scratch(dir_img + 4);
	CHECK_EQ(edit_index("j[\"bootstrap\"][\"digest\"] = \"sha256:\" + \"0\" * 64"), 0);
	CHECK_EQ(open_scratch(), -EFSCORRUPTED);

	/* The bootstrap no longer matches its digest... */
	c = scratch(dir_img + 4);
	snprintf(path, sizeof(path), "%s/bootstrap", c);
	CHECK_EQ(flip_byte(path, 1024), 0);
	CHECK_EQ(open_scratch(), -EFSCORRUPTED);
	/* ...and with the digest updated, pkg-meta refuses it. */
	CHECK_EQ(edit_index("import hashlib; j[\"bootstrap\"][\"digest\"] = \"sha256:\" + "
			    "hashlib.sha256(open(p[:-10] + \"bootstrap\", \"rb\").read()).hexdigest()"), 0);
	CHECK_EQ(open_scratch(), -EFSCORRUPTED);
	c = scratch(dir_img + 4);
	CHECK_EQ(sh("truncate -s 1000 %s/bootstrap", c), 0);
	CHECK_EQ(open_scratch(), -EFSCORRUPTED);
	c = scratch(dir_img + 4);
	CHECK_EQ(sh("rm %s/bootstrap", c), 0);
	CHECK(open_scratch() < 0);

	/* The image index and the bootstrap's blob index must agree. */
	c = scratch(dir_img + 4);
	CHECK_EQ(edit_index("j[\"blobs\"] = []"), 0);
	CHECK_EQ(open_scratch(), -EFSCORRUPTED);
	c = scratch(dir_img + 4);
	CHECK_EQ(edit_index("j[\"blobs\"][0][\"digest\"] = \"sha256:\" + \"1\" * 64"), 0);
	CHECK_EQ(open_scratch(), -EFSCORRUPTED);
	c = scratch(dir_img + 4);
	CHECK_EQ(edit_index("j[\"blobs\"][0][\"digest\"] = \"md5:1\""), 0);
	CHECK_EQ(open_scratch(), -EFSCORRUPTED);

	/* A damaged blob opens (blobs are read lazily) but fails check. */
	c = scratch(dir_img + 4);
	snprintf(ref, sizeof(ref), "dir:%s", c);
	CHECK_EQ(open_img(ref, &img), 0);
	if (img) {
		CHECK_EQ(flip_byte(img->blob_paths[0], 100), 0);
		CHECK(image_check(img, &report) < 0);
		CHECK(report.error < 0);
		image_close(img);
	}
}

static void test_corrupt_oci(void)
{
	struct image *img = NULL;
	char ref[160], path[256], hex[65];
	const char *c;
	uint8_t boot[32];

	CHECK_EQ(open_img(oci_img, &img), 0);
	if (!img)
		return;
	/* The compressed bootstrap is the manifest's last layer. */
	CHECK_EQ(sh("python3 -c 'import json; p=\"%s/oci\"; i=json.load(open(p+\"/index.json\")); "
		    "m=json.load(open(p+\"/blobs/sha256/\"+i[\"manifests\"][0][\"digest\"][7:])); "
		    "print(m[\"layers\"][-1][\"digest\"][7:])' > %s/boot", tmpdir, tmpdir), 0);
	snprintf(path, sizeof(path), "%s/boot", tmpdir);
	{
		char *text = NULL;
		size_t len;

		CHECK_EQ(read_file_max(path, 100, &text, &len), 0);
		if (text && len >= 64)
			text[64] = '\0';
		CHECK(text && len >= 64 && !hex_decode(text, boot, 32));
		free(text);
	}
	image_close(img);
	hex_encode(boot, 32, hex);
	c = scratch(oci_dir);
	snprintf(ref, sizeof(ref), "oci:%s:v1", c);
	snprintf(path, sizeof(path), "%s/blobs/sha256/%s", c, hex);
	CHECK_EQ(flip_byte(path, 20), 0);
	CHECK_EQ(open_img(ref, &img), -EFSCORRUPTED);
	c = scratch(oci_dir);
	CHECK_EQ(sh("truncate -s -5 %s", path), 0);
	CHECK_EQ(open_img(ref, &img), -EFSCORRUPTED);
	c = scratch(oci_dir);
	CHECK_EQ(sh("rm %s", path), 0);
	CHECK(open_img(ref, &img) < 0);
	c = scratch(oci_dir);
	CHECK_EQ(sh("rm %s/index.json", c), 0);
	CHECK_EQ(open_img(ref, &img), -EFSCORRUPTED);
}

/*
 * Bootstraps that are not ferry's one frame with its size in the header
 * still open, through the streaming decoder: a frame without a content
 * size (a streaming compressor), and two frames (a concatenation).
 */
static void test_bootstrap_frames(void)
{
	static const char *const modes[] = { "nosize", "frames" };
	struct image *img = NULL, *other = NULL;
	char ref[160];
	const char *c;
	size_t i;

	CHECK_EQ(open_img(oci_img, &img), 0);
	if (!img)
		return;
	for (i = 0; i < ARRAY_SIZE(modes); i++) {
		c = scratch(oci_dir);
		CHECK_EQ(sh("/usr/bin/python3 -c '\n"
			    "import hashlib, json, subprocess, sys\n"
			    "p, mode = sys.argv[1], sys.argv[2]\n"
			    "b = p + \"/blobs/sha256/\"\n"
			    "def put(d):\n"
			    "    h = hashlib.sha256(d).hexdigest(); open(b + h, \"wb\").write(d); return h\n"
			    "def z(d, *o):\n"
			    "    return subprocess.run([\"zstd\", \"-qc\", *o], input=d, capture_output=True, check=True).stdout\n"
			    "i = json.load(open(p + \"/index.json\"))\n"
			    "m = json.load(open(b + i[\"manifests\"][0][\"digest\"][7:]))\n"
			    "l = m[\"layers\"][-1]\n"
			    "raw = subprocess.run([\"zstd\", \"-dc\", b + l[\"digest\"][7:]], capture_output=True, check=True).stdout\n"
			    "h = len(raw) // 2\n"
			    "new = z(raw) if mode == \"nosize\" else z(raw[:h], \"--stream-size=%%d\" %% h) + z(raw[h:])\n"
			    "l[\"digest\"] = \"sha256:\" + put(new); l[\"size\"] = len(new)\n"
			    "mb = json.dumps(m).encode()\n"
			    "i[\"manifests\"][0][\"digest\"] = \"sha256:\" + put(mb); i[\"manifests\"][0][\"size\"] = len(mb)\n"
			    "json.dump(i, open(p + \"/index.json\", \"w\"))' %s %s",
			    c, modes[i]), 0);
		snprintf(ref, sizeof(ref), "oci:%s:v1", c);
		CHECK_EQ(open_img(ref, &other), 0);
		CHECK(other && !memcmp(other->bootstrap_digest, img->bootstrap_digest, 32));
		image_close(other);
		other = NULL;
	}
	image_close(img);
}

static void test_prefetch_lists(void)
{
	char file[128], dest[160], *bad[] = {
		"../etc\n", "a/../../b\n", "/\n", "./\n",
	};
	struct image *img = NULL;
	char **paths = NULL;
	uint32_t nr = 0, i;
	FILE *f;

	snprintf(file, sizeof(file), "%s/list", tmpdir);
	f = fopen(file, "w");
	fprintf(f, "# comment\n\n/big \t\r\nsub//./deep\n   \n#/small\nlink\n");
	fclose(f);
	CHECK_EQ(image_prefetch_list_load(file, &paths, &nr), 0);
	CHECK_EQ(nr, 3);
	if (nr == 3) {
		CHECK(!strcmp(paths[0], "/big"));
		CHECK(!strcmp(paths[1], "/sub/deep"));
		CHECK(!strcmp(paths[2], "/link"));
	}
	image_prefetch_list_free(paths, nr);

	/* Embedded by a conversion, read back by image_open. */
	snprintf(dest, sizeof(dest), "dir:%s/withlist", tmpdir);
	CHECK_EQ(fixture_convert(dest, file), 0);
	CHECK_EQ(open_img(dest, &img), 0);
	CHECK(img && img->nr_prefetch == 3 && !strcmp(img->prefetch[1], "/sub/deep"));
	image_close(img);
	/* A path the image does not have fails the conversion. */
	f = fopen(file, "a");
	fprintf(f, "/nosuch\n");
	fclose(f);
	snprintf(dest, sizeof(dest), "dir:%s/badlist", tmpdir);
	CHECK_EQ(fixture_convert(dest, file), -ENOENT);
	CHECK_EQ(sh("test ! -e %s/badlist", tmpdir), 0);

	for (i = 0; i < ARRAY_SIZE(bad); i++) {
		f = fopen(file, "w");
		fprintf(f, "/ok\n%s", bad[i]);
		fclose(f);
		CHECK_EQ(image_prefetch_list_load(file, &paths, &nr), -EINVAL);
		CHECK(!paths && !nr);
	}
	f = fopen(file, "w");
	for (i = 0; i <= IMAGE_PREFETCH_MAX_PATHS; i++)
		fprintf(f, "/f%u\n", i);
	fclose(f);
	CHECK_EQ(image_prefetch_list_load(file, &paths, &nr), -E2BIG);
	CHECK_EQ(sh("sed -i 1d %s", file), 0);
	CHECK_EQ(image_prefetch_list_load(file, &paths, &nr), 0);
	CHECK_EQ(nr, IMAGE_PREFETCH_MAX_PATHS);
	image_prefetch_list_free(paths, nr);
	CHECK_EQ(image_prefetch_list_load("/nonexistent/list", &paths, &nr), -ENOENT);
}

/*
 * The section area (FORMAT.md 2.7): a reader decodes the sections it
 * knows and skips the others, the way ferry 0.5 will skip a section a
 * later ferry adds; one marked required it refuses instead.
 */
static struct image *decode_area(const struct image_section *extra, uint32_t nr,
				 size_t cut, int *ret)
{
	struct image_ext in = { .sections = extra, .nr_sections = nr };
	struct image *img = calloc(1, sizeof(*img));
	void *payload = NULL, *area = NULL;
	size_t payload_len = 0, area_len = 0;

	*ret = -ENOMEM;
	if (!img)
		return NULL;
	img->ref = strdup("test");
	*ret = image_ext_encode(&in, &payload, &payload_len, &area, &area_len);
	if (!*ret)
		*ret = image_sections_decode(img, area, area_len - cut);
	free(payload);
	free(area);
	return img;
}

static void free_decoded(struct image *img)
{
	if (!img)
		return;
	free(img->ref);
	free(img->writer);
	free(img->sections);
	blob_streams_free(&img->streams);
	free(img);
}

static void test_sections(void)
{
	struct image_section later[] = {
		{ "FERRYZZ9", 3, 0, "from a later ferry", 18 },
		{ "FERRYWR1", 2, 0, "a writer section of another version", 35 },
	};
	struct image_section required = { "FERRYZZ9", 1, IMAGE_SECTION_REQUIRED, "x", 1 };
	struct image_section writer_again = { "FERRYWR1", 1, 0, "ferry 9", 7 };
	struct image_section bad_writer = { "FERRYWR1", 1, 0, "ferry\n", 6 };
	uint8_t *rp = NULL, *longer;
	size_t rp_len = 0;
	struct image *img;
	int ret;

	/* What every conversion writes: who wrote the image. */
	img = decode_area(NULL, 0, 0, &ret);
	CHECK_EQ(ret, 0);
	CHECK(img && img->writer && !strcmp(img->writer, "ferry " FERRY_VERSION));
	CHECK(img && img->nr_sections == 1 && img->sections[0].known);
	free_decoded(img);

	/* Sections this ferry does not read are skipped, and listed. */
	img = decode_area(later, ARRAY_SIZE(later), 0, &ret);
	CHECK_EQ(ret, 0);
	CHECK(img && img->writer && !strcmp(img->writer, "ferry " FERRY_VERSION));
	CHECK(img && img->nr_sections == 3);
	if (img && img->nr_sections == 3) {
		CHECK(!strcmp(img->sections[1].magic, "FERRYZZ9"));
		CHECK(!img->sections[1].known && img->sections[1].version == 3);
		CHECK_EQ(img->sections[1].len, 18);
		CHECK(!img->sections[2].known && img->sections[2].version == 2);
	}
	free_decoded(img);

	/* Unless the image says it needs them. */
	img = decode_area(&required, 1, 0, &ret);
	CHECK_EQ(ret, -ENOTSUP);
	free_decoded(img);

	/* A frame that overruns the area, a known section twice, a bad body. */
	img = decode_area(later, ARRAY_SIZE(later), 1, &ret);
	CHECK_EQ(ret, -EFSCORRUPTED);
	free_decoded(img);
	img = decode_area(later, ARRAY_SIZE(later), 36, &ret);
	CHECK_EQ(ret, -EFSCORRUPTED);
	free_decoded(img);
	img = decode_area(&writer_again, 1, 0, &ret);
	CHECK_EQ(ret, -EFSCORRUPTED);
	free_decoded(img);
	img = decode_area(&bad_writer, 1, 0, &ret);
	CHECK_EQ(ret, -EFSCORRUPTED);
	free_decoded(img);

	/* The resume points (FERRYRP1, 2.8) are read, exactly their body. */
	CHECK_EQ(blob_streams_encode(NULL, 0, (void **)&rp, &rp_len), 0);
	longer = calloc(1, rp_len + 1);
	if (rp && longer) {
		struct image_section streams = { BLOB_STREAMS_MAGIC, BLOB_STREAMS_VERSION,
						 IMAGE_SECTION_REQUIRED, rp, rp_len };
		struct image_section trailing = { BLOB_STREAMS_MAGIC, BLOB_STREAMS_VERSION,
						  IMAGE_SECTION_REQUIRED, longer, rp_len + 1 };

		memcpy(longer, rp, rp_len);
		img = decode_area(&streams, 1, 0, &ret);
		CHECK_EQ(ret, 0);
		CHECK(img && img->nr_sections == 2 && img->sections[1].known);
		free_decoded(img);
		img = decode_area(&trailing, 1, 0, &ret);
		CHECK_EQ(ret, -EFSCORRUPTED);
		free_decoded(img);
	}
	free(rp);
	free(longer);

	/* A converted image says which ferry wrote it. */
	CHECK_EQ(open_img(dir_img, &img), 0);
	CHECK(img && img->writer && !strcmp(img->writer, "ferry " FERRY_VERSION));
	image_close(img);
}

/* image_opts.digest: the image must be that one (a takeover's pin). */
static void test_pinned(void)
{
	struct image *img = NULL;
	uint8_t right[32], wrong[32];
	const char *refs[] = { dir_img, oci_img };
	size_t i;

	for (i = 0; i < ARRAY_SIZE(refs); i++) {
		CHECK_EQ(open_img(refs[i], &img), 0);
		if (!img)
			return;
		memcpy(right, img->image_digest, 32);
		image_close(img);
		memcpy(wrong, right, 32);
		wrong[7] ^= 1;
		img = NULL;
		CHECK_EQ(image_open(refs[i], &(struct image_opts){ .digest = right }, &img), 0);
		CHECK(img && !memcmp(img->image_digest, right, 32));
		image_close(img);
		img = NULL;
		CHECK_EQ(image_open(refs[i], &(struct image_opts){ .digest = wrong }, &img),
			 -ESTALE);
		CHECK(!img);
	}
}

/* Is @fd the file at @path? */
static bool same_file(int fd, const char *path)
{
	struct stat a, b;

	return !fstat(fd, &a) && !stat(path, &b) && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

/* CACHE/SUB/<hex>: used only when the bytes hash to the name. */
static void test_cached_copies(void)
{
	static const char doc[] = "{\"schemaVersion\":2}";
	char cache[160], path[256], hex[65];
	uint8_t digest[32], *data = NULL;
	size_t len = 0;
	int fd = -1;

	snprintf(cache, sizeof(cache), "%s/cc", tmpdir);
	sha256_buf(doc, strlen(doc), digest);
	hex_encode(digest, 32, hex);
	snprintf(path, sizeof(path), "%s/meta/%s", cache, hex);
	CHECK_EQ(image_cached_read(cache, IMAGE_META_DIR, digest, 1 << 20, &data, &len, NULL),
		 -ENOENT);
	image_cached_keep(cache, IMAGE_META_DIR, digest, doc, strlen(doc), NULL);
	CHECK_EQ(image_cached_read(cache, IMAGE_META_DIR, digest, 1 << 20, &data, &len, NULL), 0);
	CHECK(data && len == strlen(doc) && !memcmp(data, doc, len) && !data[len]);
	free(data);
	data = NULL;
	/* Larger than the caller takes: not read. */
	CHECK(image_cached_read(cache, IMAGE_META_DIR, digest, 4, &data, &len, NULL) < 0);
	/* Other bytes under the name: refused and removed, then kept anew. */
	CHECK_EQ(sh("printf '{\"schemaVersion\":3}' >%s", path), 0);
	CHECK_EQ(image_cached_read(cache, IMAGE_META_DIR, digest, 1 << 20, &data, &len, NULL),
		 -EFSCORRUPTED);
	CHECK(access(path, F_OK) && errno == ENOENT);
	image_cached_keep(cache, IMAGE_META_DIR, digest, doc, strlen(doc), NULL);
	CHECK_EQ(image_cached_read(cache, IMAGE_META_DIR, digest, 1 << 20, &data, &len, NULL), 0);
	free(data);
	data = NULL;
	/* With a descriptor: the very file written, or read and checked, read-only. */
	CHECK_EQ(sh("rm %s", path), 0);
	image_cached_keep(cache, IMAGE_META_DIR, digest, doc, strlen(doc), &fd);
	CHECK(fd >= 0 && same_file(fd, path) && (fcntl(fd, F_GETFL) & O_ACCMODE) == O_RDONLY);
	if (fd >= 0)
		close(fd);
	fd = -1;
	CHECK_EQ(image_cached_read(cache, IMAGE_META_DIR, digest, 1 << 20, &data, &len, &fd), 0);
	CHECK(fd >= 0 && same_file(fd, path) && (fcntl(fd, F_GETFL) & O_ACCMODE) == O_RDONLY);
	if (fd >= 0)
		close(fd);
	free(data);
	data = NULL;
	/* A link or a FIFO in its place is never followed or read from. */
	CHECK_EQ(sh("rm -f %s && ln -s /etc/passwd %s", path, path), 0);
	CHECK_EQ(image_cached_read(cache, IMAGE_META_DIR, digest, 1 << 20, &data, &len, NULL),
		 -ENOENT);
	CHECK_EQ(sh("rm -f %s && mkfifo %s", path, path), 0);
	CHECK(image_cached_read(cache, IMAGE_META_DIR, digest, 1 << 20, &data, &len, NULL) < 0);
	CHECK(!data);
	/* A directory others may write is not trusted at all. */
	CHECK_EQ(sh("rm -f %s && chmod 777 %s/meta", path, cache), 0);
	image_cached_keep(cache, IMAGE_META_DIR, digest, doc, strlen(doc), &fd);
	CHECK(access(path, F_OK) && fd == -1);
	CHECK_EQ(image_cached_read(cache, IMAGE_META_DIR, digest, 1 << 20, &data, &len, NULL),
		 -ENOENT);
}

/*
 * image_meta_gc: documents and bootstraps no image record keeps go once a
 * minute old, leftovers and planted links too (never followed); what a
 * record keeps, and anything written just now, stays.
 */
static void test_meta_gc(void)
{
	static const char *const docs[3] = { "{\"a\":1}", "{\"b\":2}", "{\"c\":3}" };
	char cache[160], hex[3][65];
	uint8_t d[3][32], img[32];
	uint64_t freed = 0;
	uint32_t removed = 0;
	int i;

	snprintf(cache, sizeof(cache), "%s/mg", tmpdir);
	for (i = 0; i < 3; i++) {
		sha256_buf(docs[i], strlen(docs[i]), d[i]);
		hex_encode(d[i], 32, hex[i]);
		image_cached_keep(cache, IMAGE_META_DIR, d[i], docs[i], strlen(docs[i]), NULL);
	}
	image_cached_keep(cache, IMAGE_BOOTSTRAPS_DIR, d[0], docs[0], strlen(docs[0]), NULL);
	sha256_buf("img", 3, img);
	CHECK_EQ(blob_cache_add_image(cache, "r", img, NULL, 0,
				      (const uint8_t (*)[32])d[0], 1), 0);
	CHECK_EQ(sh("cd %s && echo x >meta/.tmp-left && ln -s /etc/hostname meta/%064x && "
		    "touch -h -d '-2 min' meta/* meta/.tmp-left bootstraps/* && touch meta/%s",
		    cache, 0, hex[2]), 0);
	CHECK_EQ(image_meta_gc(cache, &freed, &removed), 0);
	CHECK_EQ(removed, 3); /* doc 1, the leftover, the link */
	CHECK(freed > 0);
	CHECK_EQ(sh("cd %s && test -f meta/%s && test -f bootstraps/%s && ! test -e meta/%s && "
		    "test -f meta/%s && ! test -e meta/.tmp-left && ! test -L meta/%064x && "
		    "test -s /etc/hostname", cache, hex[0], hex[0], hex[1], hex[2], 0), 0);
	/* Forgotten: the rest goes once old. */
	CHECK_EQ(blob_cache_forget_image(cache, NULL), 0);
	CHECK_EQ(sh("touch -d '-2 min' %s/meta/* %s/bootstraps/*", cache, cache), 0);
	CHECK_EQ(image_meta_gc(cache, &freed, &removed), 0);
	CHECK_EQ(removed, 3);
	CHECK_EQ(sh("test -z \"$(find %s/meta %s/bootstraps -mindepth 1)\"", cache, cache), 0);
}

int main(void)
{
	ferry_log_level = getenv("TEST_LOG") ? FERRY_LOG_DEBUG : -1;
	if (fixture_init("image"))
		return 1;
	snprintf(dir_img, sizeof(dir_img), "dir:%s/dir", tmpdir);
	snprintf(oci_dir, sizeof(oci_dir), "%s/oci", tmpdir);
	snprintf(oci_img, sizeof(oci_img), "oci:%s:v1", oci_dir);
	if (fixture_convert(dir_img, NULL) || fixture_convert(oci_img, NULL)) {
		printf("not ok - fixture conversions\n");
		return 1;
	}
	RUN_TEST(test_open_dir);
	RUN_TEST(test_open_oci);
	RUN_TEST(test_corrupt_dir);
	RUN_TEST(test_corrupt_oci);
	RUN_TEST(test_bootstrap_frames);
	RUN_TEST(test_prefetch_lists);
	RUN_TEST(test_sections);
	RUN_TEST(test_pinned);
	RUN_TEST(test_cached_copies);
	RUN_TEST(test_meta_gc);
	sh("rm -rf %s", tmpdir);
	TEST_MAIN_END();
}
