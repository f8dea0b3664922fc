// SPDX-License-Identifier: MIT
/*
 * The chunk cache's files, shared by the fill path (cache.c) and by
 * records, gc, verify and the size limit: the checks of the cache's
 * directories, the map file's header, and the locks on the map.
 */
#include "internal.h"
#include "../pkg-base/base.h"

#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

/*
 * Refuse a directory of the cache that someone other than us could change:
 * whoever can write into it can plant links or other bytes for root to
 * follow and trust. A safe one that others can read (made by an older
 * ferry, 0755) is narrowed to 0700, as cached files may be private.
 */
static int check_dir(int fd, const char *path)
{
	struct stat st;

	if (fstat(fd, &st))
		return -errno;
	if (st.st_uid != geteuid() || (st.st_mode & 022)) {
		ferry_err("chunk cache: %s is owned by uid %u with mode %04o: the cache must be owned by uid %u and writable by nobody else; chown %u and chmod 0700 it (or remove it)",
			  path, (unsigned int)st.st_uid,
			  (unsigned int)(st.st_mode & 07777),
			  (unsigned int)geteuid(), (unsigned int)geteuid());
		return -EPERM;
	}
	if ((st.st_mode & 077) && fchmod(fd, st.st_mode & 07700))
		return -errno;
	return 0;
}

/*
 * The cache root's ancestors: one that another user could write to (and
 * is not sticky, like /tmp) lets them swap the whole cache for theirs.
 */
static int check_ancestors(const char *cache_dir)
{
	char *real = realpath(cache_dir, NULL), *slash;
	struct stat st;
	int ret = 0;

	if (!real)
		return -errno;
	while ((slash = strrchr(real, '/'))) {
		slash[slash == real] = '\0';
		if (stat(real, &st)) {
			ret = -errno;
			break;
		}
		if ((st.st_uid && st.st_uid != geteuid()) ||
		    ((st.st_mode & 022) && !(st.st_mode & S_ISVTX))) {
			ferry_err("chunk cache: %s is inside %s, which uid %u owns with mode %04o: another user could replace the cache; move the cache or chmod go-w that directory",
				  cache_dir, real, (unsigned int)st.st_uid,
				  (unsigned int)(st.st_mode & 07777));
			ret = -EPERM;
			break;
		}
		if (slash == real)
			break;
	}
	free(real);
	return ret;
}

int blob_cache_dir(const char *cache_dir, const char *sub, bool create,
		   int *dir_fd)
{
	char path[PATH_MAX], name[NAME_MAX + 1];
	const char *p = sub ? sub : "";
	size_t len;
	int fd, next, ret;

	/* Only what we create is narrowed: parents made here are 0700 too. */
	ret = create ? mkdir_p(cache_dir, 0700) : 0;
	if (ret)
		return ret;
	fd = open(cache_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0) {
		ret = -errno;
		if (ret != -ENOENT || create)
			ferry_err("chunk cache: cannot open %s: %s", cache_dir,
				  ferry_strerror(ret));
		return ret;
	}
	snprintf(path, sizeof(path), "%s", cache_dir);
	ret = check_dir(fd, path);
	if (!ret)
		ret = check_ancestors(cache_dir);
	/* Each level below the root: never through a symlink. */
	while (!ret && *p) {
		len = strcspn(p, "/");
		if (len > NAME_MAX ||
		    strlen(path) + 1 + len >= sizeof(path)) {
			ret = -ENAMETOOLONG;
			break;
		}
		memcpy(name, p, len);
		name[len] = '\0';
		p += len + (p[len] == '/');
		snprintf(path + strlen(path), sizeof(path) - strlen(path),
			 "/%s", name);
		if (create && mkdirat(fd, name, 0700) && errno != EEXIST) {
			ret = -errno;
			ferry_err("chunk cache: cannot create %s: %s", path,
				  ferry_strerror(ret));
			break;
		}
		next = openat(fd, name,
			      O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (next < 0) {
			ret = -errno;
			if (ret != -ENOENT || create)
				ferry_err("chunk cache: cannot open %s: %s%s",
					  path, ferry_strerror(ret),
					  ret == -ELOOP || ret == -ENOTDIR ?
					  " (not a directory: remove it)" : "");
			break;
		}
		close(fd);
		fd = next;
		ret = check_dir(fd, path);
	}
	if (ret || !dir_fd)
		close(fd);
	else
		*dir_fd = fd;
	return ret;
}

void cache_map_header_encode(const struct blob_info *info,
			     uint8_t h[CACHE_MAP_HEADER_SIZE])
{
	memset(h, 0, CACHE_MAP_HEADER_SIZE);
	memcpy(h, CACHE_MAP_MAGIC, 8);
	put_le32(h + 8, CACHE_MAP_VERSION);
	put_le32(h + 12, CACHE_MAP_HEADER_SIZE);
	put_le32(h + 16, info->nr_chunks);
	put_le64(h + 24, info->uncompressed_size);
	memcpy(h + 32, info->digest, BLOB_DIGEST_SIZE);
	memcpy(h + 64, info->table_sha256, BLOB_DIGEST_SIZE);
	sha256_buf(h, CACHE_MAP_CHECK_OFF, h + CACHE_MAP_CHECK_OFF);
}

int cache_map_header_decode(const uint8_t h[CACHE_MAP_HEADER_SIZE],
			    struct cache_map_header *mh, const char **why)
{
	uint8_t check[BLOB_DIGEST_SIZE];

	if (memcmp(h, CACHE_MAP_MAGIC, 8)) {
		*why = "bad magic";
		return -EFSCORRUPTED;
	}
	sha256_buf(h, CACHE_MAP_CHECK_OFF, check);
	if (memcmp(check, h + CACHE_MAP_CHECK_OFF, BLOB_DIGEST_SIZE)) {
		*why = "header checksum mismatch";
		return -EFSCORRUPTED;
	}
	if (get_le32(h + 8) != CACHE_MAP_VERSION ||
	    get_le32(h + 12) != CACHE_MAP_HEADER_SIZE || get_le32(h + 20)) {
		*why = "unknown version or header size";
		return -EFSCORRUPTED;
	}
	mh->nr_chunks = get_le32(h + 16);
	mh->uncompressed_size = get_le64(h + 24);
	memcpy(mh->digest, h + 32, BLOB_DIGEST_SIZE);
	memcpy(mh->table_sha256, h + 64, BLOB_DIGEST_SIZE);
	return 0;
}

int cache_flock(int fd, int op)
{
	while (flock(fd, op)) {
		if (errno != EINTR)
			return -errno;
	}
	return 0;
}

int cache_users_lock(int map_fd, short type, bool wait)
{
	struct flock fl = { .l_type = type, .l_whence = SEEK_SET,
			    .l_start = CACHE_MAP_USERS_BYTE, .l_len = 1 };

	while (fcntl(map_fd, wait ? F_OFD_SETLKW : F_OFD_SETLK, &fl)) {
		if (errno != EINTR)
			return -errno;
	}
	return 0;
}
