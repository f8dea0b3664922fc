/* SPDX-License-Identifier: MIT */
/*
 * treelist [-n] ROOT: print a canonical listing of the tree at ROOT, one
 * line per entry, for comparing trees where tests/tools/treecmp.py cannot
 * run (the VM guests have no python): make the listing of the reference
 * on the host, the listing of the mount in the guest, and diff them.
 *
 * The fields are treecmp's, so the two tools judge alike:
 *   PATH|TYPE|MODE|UID|GID|MTIME_NS|SIZE|CONTENT|RDEV|NLINK|LINKS|XATTRS
 * SIZE for regular files and symlinks; CONTENT the sha256 of a regular
 * file (with -n: not read, "-") or a symlink's target; RDEV for devices;
 * NLINK and LINKS (the first path of its hardlink group, in walk order)
 * for non-directories; XATTRS every xattr as NAME=VALUE (hex up to 32
 * bytes, else LENGTH:sha256), sorted by name. Directory sizes, nlink,
 * atime and ctime are left out (the file system's, not the image's).
 * Entries are walked depth first, names sorted bytewise; bytes outside
 * printable ASCII, '|', '=', ',' and '\' are written as \xHH.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "../../pkg-base/base.h"

struct link {
	dev_t dev;
	ino_t ino;
	char *path;
};

static struct link *links;
static size_t nr_links, cap_links;
static bool no_content;
static int failed;

static void put_escaped(const char *s, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];

		if (c < 0x21 || c > 0x7e || c == '|' || c == '=' || c == ',' || c == '\\')
			printf("\\x%02x", c);
		else
			putchar(c);
	}
}

static void put_hex_or_digest(const uint8_t *v, size_t n)
{
	char hex[2 * SHA256_SIZE + 1];
	uint8_t d[SHA256_SIZE];

	if (n <= 32) {
		hex_encode(v, n, hex);
		printf("%s", n ? hex : "\"\"");
		return;
	}
	sha256_buf(v, n, d);
	hex_encode(d, sizeof(d), hex);
	printf("%zu:%s", n, hex);
}

static void fail(const char *path, const char *what)
{
	fprintf(stderr, "treelist: %s: %s: %s\n", path, what, strerror(errno));
	failed = 1;
}

static int by_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static void put_xattrs(const char *path)
{
	char *names = NULL, **sorted = NULL, *p;
	ssize_t len = llistxattr(path, NULL, 0), vlen;
	size_t n = 0, i;
	uint8_t *v;

	if (len <= 0) {
		if (len < 0)
			fail(path, "llistxattr");
		return;
	}
	names = malloc((size_t)len);
	sorted = calloc((size_t)len, sizeof(*sorted));
	if (!names || !sorted || (len = llistxattr(path, names, (size_t)len)) < 0) {
		fail(path, "llistxattr");
		goto out;
	}
	for (p = names; p < names + len; p += strlen(p) + 1)
		sorted[n++] = p;
	qsort(sorted, n, sizeof(*sorted), by_name);
	for (i = 0; i < n; i++) {
		vlen = lgetxattr(path, sorted[i], NULL, 0);
		v = vlen >= 0 ? malloc((size_t)vlen + 1) : NULL;
		if (!v || (vlen = lgetxattr(path, sorted[i], v, (size_t)vlen)) < 0) {
			fail(path, sorted[i]);
			free(v);
			continue;
		}
		printf("%s", i ? "," : "");
		put_escaped(sorted[i], strlen(sorted[i]));
		putchar('=');
		put_hex_or_digest(v, (size_t)vlen);
		free(v);
	}
out:
	free(sorted);
	free(names);
}

static void put_content(const char *path)
{
	struct sha256_hasher *h = NULL;
	static uint8_t buf[1 << 20];
	uint8_t d[SHA256_SIZE];
	char hex[2 * SHA256_SIZE + 1];
	ssize_t n;
	int fd;

	if (no_content) {
		putchar('-');
		return;
	}
	fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0 || sha256_hasher_new(&h)) {
		fail(path, "open");
		printf("ERROR");
		if (fd >= 0)
			close(fd);
		return;
	}
	while ((n = read(fd, buf, sizeof(buf))) > 0)
		sha256_hasher_update(h, buf, (size_t)n);
	if (n < 0) {
		fail(path, "read");
		printf("ERROR");
	} else {
		sha256_hasher_final(h, d);
		hex_encode(d, sizeof(d), hex);
		printf("%s", hex);
	}
	sha256_hasher_free(h);
	close(fd);
}

/* The first path of @st's hardlink group, @rel when it is the first. */
static const char *link_group(const struct stat *st, const char *rel)
{
	size_t i;

	for (i = 0; i < nr_links; i++)
		if (links[i].dev == st->st_dev && links[i].ino == st->st_ino)
			return links[i].path;
	if (array_reserve(&links, &cap_links, nr_links + 1, sizeof(*links), 64) ||
	    !(links[nr_links].path = strdup(rel))) {
		fprintf(stderr, "treelist: out of memory\n");
		exit(2);
	}
	links[nr_links].dev = st->st_dev;
	links[nr_links].ino = st->st_ino;
	return links[nr_links++].path;
}

static const char *type_name(mode_t m)
{
	switch (m & S_IFMT) {
	case S_IFREG: return "file";
	case S_IFDIR: return "dir";
	case S_IFLNK: return "symlink";
	case S_IFCHR: return "chardev";
	case S_IFBLK: return "blockdev";
	case S_IFIFO: return "fifo";
	case S_IFSOCK: return "socket";
	default: return "unknown";
	}
}

static void put_entry(const char *path, const char *rel, const struct stat *st)
{
	char target[8192];
	ssize_t n;

	put_escaped(rel, strlen(rel));
	printf("|%s|%o|%u|%u|%lld|", type_name(st->st_mode), (unsigned int)st->st_mode,
	       (unsigned int)st->st_uid, (unsigned int)st->st_gid,
	       (long long)st->st_mtim.tv_sec * 1000000000LL + st->st_mtim.tv_nsec);
	if (S_ISREG(st->st_mode) || S_ISLNK(st->st_mode))
		printf("%lld", (long long)st->st_size);
	putchar('|');
	if (S_ISREG(st->st_mode)) {
		put_content(path);
	} else if (S_ISLNK(st->st_mode)) {
		n = readlink(path, target, sizeof(target));
		if (n < 0)
			fail(path, "readlink");
		else
			put_escaped(target, (size_t)n);
	}
	putchar('|');
	if (S_ISCHR(st->st_mode) || S_ISBLK(st->st_mode))
		printf("%u:%u", major(st->st_rdev), minor(st->st_rdev));
	putchar('|');
	if (!S_ISDIR(st->st_mode)) {
		const char *first = link_group(st, rel);

		printf("%lu|", (unsigned long)st->st_nlink);
		put_escaped(first, strlen(first));
	} else {
		putchar('|');
	}
	putchar('|');
	put_xattrs(path);
	putchar('\n');
}

static int dirent_cmp(const struct dirent **a, const struct dirent **b)
{
	return strcmp((*a)->d_name, (*b)->d_name);
}

static void walk(const char *path, const char *rel)
{
	struct dirent **names = NULL;
	struct stat st;
	int n, i;

	if (lstat(path, &st)) {
		fail(path, "lstat");
		return;
	}
	put_entry(path, rel, &st);
	if (!S_ISDIR(st.st_mode))
		return;
	n = scandir(path, &names, NULL, dirent_cmp);
	if (n < 0) {
		fail(path, "scandir");
		return;
	}
	for (i = 0; i < n; i++) {
		const char *name = names[i]->d_name;
		char *cpath = NULL, *crel = NULL;

		if (strcmp(name, ".") && strcmp(name, "..")) {
			if (asprintf(&cpath, "%s/%s", path, name) < 0 ||
			    asprintf(&crel, "%s%s%s", strcmp(rel, ".") ? rel : "",
				     strcmp(rel, ".") ? "/" : "", name) < 0) {
				fprintf(stderr, "treelist: out of memory\n");
				exit(2);
			}
			walk(cpath, crel);
		}
		free(cpath);
		free(crel);
		free(names[i]);
	}
	free(names);
}

int main(int argc, char **argv)
{
	int i = 1;

	if (argc > 1 && !strcmp(argv[1], "-n")) {
		no_content = true;
		i++;
	}
	if (argc - i != 1) {
		fprintf(stderr, "usage: treelist [-n] ROOT\n");
		return 2;
	}
	walk(argv[i], ".");
	return failed ? 1 : 0;
}
