// SPDX-License-Identifier: MIT
/* Unit tests for pkg-base: sha256, base64, mkdir -p, atomic files, bounded reads, zero test, JSON lines. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../pkg-base/base.h"
#include "../test.h"

static void test_sha256(void)
{
	static const char abc_hex[] =
		"ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
	uint8_t one[SHA256_SIZE], streamed[SHA256_SIZE];
	struct sha256_hasher *h;
	char hex[2 * SHA256_SIZE + 1];

	sha256_buf("abc", 3, one);
	hex_encode(one, SHA256_SIZE, hex);
	CHECK(!strcmp(hex, abc_hex));
	CHECK_EQ(sha256_hasher_new(&h), 0);
	sha256_hasher_update(h, "a", 1);
	sha256_hasher_update(h, "", 0);
	sha256_hasher_update(h, "bc", 2);
	sha256_hasher_final(h, streamed);
	sha256_hasher_free(h);
	CHECK(!memcmp(one, streamed, SHA256_SIZE));
}

static void test_base64_vectors(void)
{
	uint8_t out[64];
	size_t n;
	char *enc;

	CHECK_EQ(base64_decode("YWxpY2U6czNjcmV0", 16, out, sizeof(out), &n), 0);
	CHECK(n == 12 && !memcmp(out, "alice:s3cret", 12));
	CHECK_EQ(base64_decode("YWI=", 4, out, sizeof(out), &n), 0);
	CHECK(n == 2 && !memcmp(out, "ab", 2));
	/* Writers such as libarchive drop the padding. */
	CHECK_EQ(base64_decode("YWI", 3, out, sizeof(out), &n), 0);
	CHECK(n == 2 && !memcmp(out, "ab", 2));
	CHECK_EQ(base64_decode("YQ==", 4, out, sizeof(out), &n), 0);
	CHECK(n == 1 && out[0] == 'a');
	CHECK_EQ(base64_decode("YQ", 2, out, sizeof(out), &n), 0);
	CHECK(n == 1 && out[0] == 'a');
	CHECK_EQ(base64_decode("", 0, out, sizeof(out), &n), 0);
	CHECK_EQ(n, 0);
	/* No encoder writes these. */
	CHECK_EQ(base64_decode("Y", 1, out, sizeof(out), &n), -EINVAL);
	CHECK_EQ(base64_decode("YQ=", 3, out, sizeof(out), &n), -EINVAL);
	CHECK_EQ(base64_decode("YQ===", 5, out, sizeof(out), &n), -EINVAL);
	CHECK_EQ(base64_decode("YW=I", 4, out, sizeof(out), &n), -EINVAL);
	CHECK_EQ(base64_decode("YW I", 4, out, sizeof(out), &n), -EINVAL);
	CHECK_EQ(base64_decode(" YWI", 4, out, sizeof(out), &n), -EINVAL);
	CHECK_EQ(base64_decode("YW-_", 4, out, sizeof(out), &n), -EINVAL);
	CHECK_EQ(base64_decode("YWxpY2U6czNjcmV0", 16, out, 5, &n), -ENOSPC);
	CHECK_EQ(base64_decode("YWxpY2U6czNjcmV0", 16, out, 12, &n), 0);

	CHECK_EQ(base64_encode("alice:s3cret", 12, &enc), 0);
	CHECK(!strcmp(enc, "YWxpY2U6czNjcmV0"));
	free(enc);
	CHECK_EQ(base64_encode("a", 1, &enc), 0);
	CHECK(!strcmp(enc, "YQ=="));
	free(enc);
	CHECK_EQ(base64_encode("", 0, &enc), 0);
	CHECK(!strcmp(enc, ""));
	free(enc);
}

/* Lengths around the decoder's and encoder's slice sizes. */
static void test_base64_round_trip(void)
{
	static const size_t lens[] = { 1, 2, 3, 4, 3071, 3072, 3073, 6144, 10000 };
	size_t i, j;

	for (i = 0; i < ARRAY_SIZE(lens); i++) {
		size_t len = lens[i], n, elen;
		uint8_t *in = malloc(len), *out = malloc(len + 3);
		char *enc = NULL;

		CHECK(in && out);
		if (!in || !out)
			goto next;
		for (j = 0; j < len; j++)
			in[j] = (uint8_t)(j * 131 + len);
		CHECK_EQ(base64_encode(in, len, &enc), 0);
		elen = strlen(enc);
		CHECK_EQ(elen, DIV_ROUND_UP(len, 3) * 4);
		CHECK_EQ(base64_decode(enc, elen, out, len + 3, &n), 0);
		CHECK(n == len && !memcmp(in, out, len));
		/* Unpadded, as libarchive writes it. */
		while (elen && enc[elen - 1] == '=')
			elen--;
		CHECK_EQ(base64_decode(enc, elen, out, len, &n), 0);
		CHECK(n == len && !memcmp(in, out, len));
		CHECK_EQ(base64_decode(enc, elen, out, len - 1, &n), -ENOSPC);
next:
		free(enc);
		free(in);
		free(out);
	}
}

static void test_mem_is_zero(void)
{
	static uint8_t buf[9000];

	CHECK(mem_is_zero(buf, 0));
	CHECK(mem_is_zero(buf, sizeof(buf)));
	buf[8999] = 1;
	CHECK(!mem_is_zero(buf, sizeof(buf)));
	CHECK(mem_is_zero(buf, 8999));
	buf[4096] = 1;
	CHECK(!mem_is_zero(buf, 4097));
	CHECK(mem_is_zero(buf, 4096));
	buf[0] = 1;
	CHECK(!mem_is_zero(buf, 1));
	memset(buf, 0, sizeof(buf));
}

/* How many names @dir holds besides "." and "..". */
static int count_entries(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	int n = 0;

	if (!d)
		return -1;
	while ((de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
			n++;
	closedir(d);
	return n;
}

static void test_mkdir_and_atomic_files(void)
{
	char root[] = "/tmp/ferry-test-base.XXXXXX", path[256], target[512];
	struct atomic_file af;
	char *data = NULL;
	size_t len;
	struct stat st;

	CHECK(mkdtemp(root) != NULL);
	snprintf(path, sizeof(path), "%s/a/b/c", root);
	CHECK_EQ(mkdir_p(path, 0700), 0);
	CHECK_EQ(mkdir_p(path, 0700), 0); /* exists: fine */
	CHECK(!stat(path, &st) && S_ISDIR(st.st_mode) && (st.st_mode & 0777) == 0700);
	snprintf(target, sizeof(target), "%s/a/b/c/file", root);
	CHECK_EQ(close(open(target, O_WRONLY | O_CREAT, 0600)), 0);
	snprintf(path, sizeof(path), "%s/a/b/c/file/d", root);
	CHECK_EQ(mkdir_p(path, 0755), -ENOTDIR);

	snprintf(path, sizeof(path), "%s/a", root);
	CHECK_EQ(write_file_atomic(path, "x.json", "{}", 2, 0644), 0);
	snprintf(target, sizeof(target), "%s/x.json", path);
	CHECK_EQ(read_file_max(target, 16, &data, &len), 0);
	CHECK(len == 2 && data && !memcmp(data, "{}", 2));
	free(data);
	data = NULL;
	/* Replaced whole, and no temporary file stays behind. */
	CHECK_EQ(write_file_atomic(path, "x.json", "[1]", 3, 0644), 0);
	CHECK_EQ(read_file_max(target, 16, &data, &len), 0);
	CHECK(len == 3 && data && !memcmp(data, "[1]", 3));
	free(data);
	CHECK_EQ(count_entries(path), 2); /* b/ and x.json */

	/* Named at the end (a digest known only then), or discarded. */
	CHECK_EQ(atomic_file_create(&af, path, "blob", 0644), 0);
	CHECK(!strncmp(af.tmp, ATOMIC_TMP_PREFIX, strlen(ATOMIC_TMP_PREFIX)));
	CHECK_EQ(write_full(af.fd, "abc", 3), 0);
	CHECK_EQ(count_entries(path), 3);
	CHECK_EQ(atomic_file_commit(&af, "final"), 0);
	CHECK_EQ(count_entries(path), 3); /* b/, x.json, final */
	atomic_file_discard(&af); /* after commit: nothing */
	CHECK_EQ(count_entries(path), 3);
	CHECK_EQ(atomic_file_create(&af, path, "gone", 0644), 0);
	atomic_file_discard(&af);
	atomic_file_discard(&af);
	CHECK_EQ(count_entries(path), 3);

	/* A planted symlink at a temp name is never followed. */
	CHECK_EQ(atomic_file_create(&af, path, "blob", 0644), 0);
	{
		char next[NAME_MAX + 1], link_path[512], victim[256];
		unsigned int pid_counter;
		long pid;

		CHECK_EQ(sscanf(af.tmp, ATOMIC_TMP_PREFIX "blob.%ld.%u", &pid,
				&pid_counter), 2);
		snprintf(next, sizeof(next), ATOMIC_TMP_PREFIX "blob.%ld.%u",
			 pid, pid_counter + 1);
		snprintf(victim, sizeof(victim), "%s/victim", root);
		CHECK_EQ(close(open(victim, O_WRONLY | O_CREAT, 0600)), 0);
		snprintf(link_path, sizeof(link_path), "%s/%s", path, next);
		CHECK_EQ(symlink(victim, link_path), 0);
		atomic_file_discard(&af);
		CHECK_EQ(write_file_atomic(path, "blob", "data", 4, 0644), 0);
		CHECK(!stat(victim, &st) && st.st_size == 0);
		unlink(link_path);
	}

	snprintf(path, sizeof(path), "%s/missing", root);
	CHECK(atomic_file_create(&af, path, "x", 0644) == -ENOENT);
	snprintf(path, sizeof(path), "rm -rf '%s'", root);
	CHECK_EQ(system(path), 0);
}

/*
 * What a file to parse may be: a small regular file. A link (nofollow), a
 * FIFO, /dev/zero and an oversized file are refused without reading or
 * waiting; the mount helpers' opener refuses a link anywhere in the path.
 */
static void test_bounded_reads(void)
{
	char root[] = "/tmp/ferry-test-base.XXXXXX", path[256], link[256], sub[256];
	struct json_object *o = NULL;
	char *data = NULL;
	size_t len;
	int fd;

	CHECK(mkdtemp(root) != NULL);
	snprintf(path, sizeof(path), "%s/index.json", root);
	fd = open(path, O_WRONLY | O_CREAT, 0600);
	CHECK_EQ(write_full(fd, "{\"a\": 1}", 8), 0);
	close(fd);
	CHECK_EQ(json_read_file(path, 64, &o), 0);
	CHECK(o && json_object_object_get_ex(o, "a", NULL));
	json_object_put(o);
	CHECK_EQ(json_read_file(path, 4, &o), -EFBIG);
	snprintf(link, sizeof(link), "%s/zero.json", root);
	CHECK_EQ(symlink("/dev/zero", link), 0);
	CHECK_EQ(read_file_nofollow(link, 64, &data, &len), -ELOOP);
	CHECK_EQ(json_read_file(link, 64, &o), -ELOOP);
	CHECK_EQ(read_file_max(link, 64, &data, &len), -EINVAL); /* a device */
	snprintf(link, sizeof(link), "%s/fifo", root);
	CHECK_EQ(mkfifo(link, 0600), 0);
	CHECK_EQ(read_file_max(link, 64, &data, &len), -EINVAL); /* no wait for a writer */
	CHECK_EQ(read_file_nofollow(link, 64, &data, &len), -EINVAL);
	CHECK(!strcmp(json_read_file_error(-ELOOP), "a symbolic link (not followed)"));

	snprintf(sub, sizeof(sub), "%s/real", root);
	CHECK_EQ(mkdir(sub, 0700), 0);
	fd = open_dir_nofollow(sub);
	CHECK(fd >= 0);
	if (fd >= 0)
		close(fd);
	snprintf(link, sizeof(link), "%s/swapped", root);
	CHECK_EQ(symlink(sub, link), 0);
	CHECK_EQ(open_dir_nofollow(link), -ELOOP);
	snprintf(path, sizeof(path), "%s/swapped/below", root);
	CHECK_EQ(open_dir_nofollow(path), -ELOOP); /* a link above, too */
	CHECK_EQ(umount_nofollow(path, 0), -1);
	CHECK_EQ(errno, ELOOP);
	/* mount(2) by path would put the tmpfs on real/ through the link. */
	CHECK_EQ(mount_nofollow("ferry-test", link, "tmpfs", 0, NULL), -1);
	CHECK_EQ(errno, ELOOP);
	snprintf(path, sizeof(path), "rm -rf '%s'", root);
	CHECK_EQ(system(path), 0);
}

/* One object per line: blanks may follow it on its line, nothing else. */
static void test_json_lines(void)
{
	struct json_object *o = NULL, *msg;
	struct jsonl_reader rd;
	int sv[2], i;

	CHECK_EQ(json_parse_object("{\"op\":\"ping\"} \t\r", 16, &o), 0);
	json_object_put(o);
	CHECK_EQ(json_parse_object("{} x", 4, &o), -EPROTO);
	CHECK_EQ(json_parse_object("{}{}", 4, &o), -EPROTO);
	CHECK_EQ(json_parse_object("[1]", 3, &o), -EPROTO);
	CHECK_EQ(json_parse_object("{\"a\":", 5, &o), -EPROTO);
	CHECK_EQ(json_parse_object("{}\0{}", 5, &o), -EPROTO);
	CHECK_EQ(json_parse_object("{} \0", 4, &o), -EPROTO);

	CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	msg = json_object_new_object();
	json_object_object_add(msg, "op", json_object_new_string("a\nb"));
	for (i = 0; i < 3; i++)
		CHECK_EQ(jsonl_send(sv[0], msg, 64), 0);
	CHECK_EQ(jsonl_send(sv[0], msg, 8), -EMSGSIZE);
	json_object_put(msg);
	CHECK(write(sv[0], "junk\n{}", 7) == 7);
	close(sv[0]);
	jsonl_reader_init(&rd, sv[1], 64);
	for (i = 0; i < 3; i++) {
		CHECK_EQ(jsonl_recv(&rd, 1000, &o), 0);
		CHECK(!strcmp(json_get_string(o, "op") ?: "", "a\nb"));
		json_object_put(o);
	}
	CHECK_EQ(jsonl_recv(&rd, 1000, &o), -EPROTO);
	CHECK_EQ(jsonl_recv(&rd, 1000, &o), 0); /* a last line without its newline */
	json_object_put(o);
	CHECK_EQ(jsonl_recv(&rd, 1000, &o), 1);
	jsonl_reader_free(&rd);
	close(sv[1]);

	/* A line longer than the limit, and a peer that says nothing. */
	CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	CHECK(write(sv[0], "{\"k\":\"0123456789\"}\n", 19) == 19);
	jsonl_reader_init(&rd, sv[1], 8);
	CHECK_EQ(jsonl_recv(&rd, 1000, &o), -EMSGSIZE);
	jsonl_reader_free(&rd);
	close(sv[0]);
	close(sv[1]);
	CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	jsonl_reader_init(&rd, sv[1], 64);
	CHECK_EQ(jsonl_recv(&rd, 50, &o), -ETIMEDOUT);
	jsonl_reader_free(&rd);
	close(sv[0]);
	close(sv[1]);
}

/*
 * A descriptor passed with a line (SCM_RIGHTS) is the receiver's, CLOEXEC,
 * the same open file; one not taken is closed with the reader.
 */
static void test_json_lines_fd(void)
{
	struct json_object *msg = json_object_new_object(), *o = NULL;
	struct jsonl_reader rd;
	struct stat a, b;
	int sv[2], p[2], fd;

	CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	CHECK_EQ(pipe(p), 0);
	json_object_object_add(msg, "k", json_object_new_int(1));
	CHECK_EQ(jsonl_send_fd(sv[0], msg, 64, p[0]), 0);
	CHECK_EQ(jsonl_send(sv[0], msg, 64), 0);
	jsonl_reader_init(&rd, sv[1], 64);
	CHECK_EQ(jsonl_take_fd(&rd), -1);
	CHECK_EQ(jsonl_recv(&rd, 1000, &o), 0);
	json_object_put(o);
	fd = jsonl_take_fd(&rd);
	CHECK(fd >= 0 && fd != p[0]);
	CHECK(!fstat(fd, &a) && !fstat(p[0], &b) && a.st_ino == b.st_ino);
	CHECK(fcntl(fd, F_GETFD) == FD_CLOEXEC);
	CHECK_EQ(jsonl_take_fd(&rd), -1);
	CHECK_EQ(jsonl_recv(&rd, 1000, &o), 0); /* the second line passed none */
	json_object_put(o);
	CHECK_EQ(jsonl_take_fd(&rd), -1);
	close(fd);
	/* Not taken: closed by jsonl_reader_free. */
	CHECK_EQ(jsonl_send_fd(sv[0], msg, 64, p[0]), 0);
	CHECK_EQ(jsonl_recv(&rd, 1000, &o), 0);
	json_object_put(o);
	fd = rd.passed;
	CHECK(fd >= 0);
	jsonl_reader_free(&rd);
	CHECK(fcntl(fd, F_GETFD) == -1 && errno == EBADF);
	json_object_put(msg);
	close(p[0]);
	close(p[1]);
	close(sv[0]);
	close(sv[1]);
}

/* A listening socket is 0600 from the start; connecting to none fails cleanly. */
static void test_unix_sockets(void)
{
	char dir[] = "/tmp/ferry-test-sock-XXXXXX", path[128], cmd[160];
	struct stat st;
	ino_t ino = 0;
	int lfd = -1, fd = -1, cfd;

	CHECK(mkdtemp(dir) != NULL);
	snprintf(path, sizeof(path), "%s/s", dir);
	CHECK_EQ(unix_connect(path, &fd), -ENOENT);
	CHECK_EQ(unix_listen(path, &lfd, &ino), 0);
	CHECK(!stat(path, &st) && (st.st_mode & 0777) == 0600 && st.st_ino == ino);
	CHECK_EQ(unix_connect(path, &fd), 0);
	cfd = accept(lfd, NULL, NULL);
	CHECK(cfd >= 0);
	close(cfd);
	close(fd);
	/* A stale socket file is replaced (the caller holds the lock). */
	close(lfd);
	CHECK_EQ(unix_listen(path, &lfd, &ino), 0);
	close(lfd);
	memset(path, 'x', sizeof(path) - 1);
	path[sizeof(path) - 1] = '\0';
	CHECK_EQ(unix_listen(path, &lfd, &ino), -ENAMETOOLONG);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	CHECK_EQ(system(cmd), 0);
}

int main(void)
{
	RUN_TEST(test_sha256);
	RUN_TEST(test_json_lines_fd);
	RUN_TEST(test_base64_vectors);
	RUN_TEST(test_base64_round_trip);
	RUN_TEST(test_mem_is_zero);
	RUN_TEST(test_mkdir_and_atomic_files);
	RUN_TEST(test_bounded_reads);
	RUN_TEST(test_json_lines);
	RUN_TEST(test_unix_sockets);
	TEST_MAIN_END();
}
