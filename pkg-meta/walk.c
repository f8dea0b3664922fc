// SPDX-License-Identifier: MIT
/*
 * Whole-tree walk and path resolution over the public reader API, safe on
 * hostile images.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../pkg-base/base.h"
#include "meta.h"

#define WALK_PATH_MAX 65536u
#define RESOLVE_PATH_MAX 4096u /* PATH_MAX */
#define RESOLVE_SYMLOOP_MAX 40 /* Linux's MAXSYMLINKS */

struct walker {
	const struct meta_image *img;
	meta_walk_fn visit;
	void *ctx;
	char *path;
	size_t path_len;
	uint64_t *dirs_seen; /* open-addressing set of directory nid + 1 */
	size_t dirs_cap, dirs_used;
};

static size_t nid_hash(uint64_t key, size_t cap)
{
	return (size_t)(key * 0x9E3779B97F4A7C15ull >> 17) & (cap - 1);
}

/* 1 if @nid was entered before, 0 after recording it, or -ENOMEM. */
static int mark_dir(struct walker *w, uint64_t nid)
{
	size_t h, i;

	if (w->dirs_used * 2 >= w->dirs_cap) {
		size_t cap = w->dirs_cap ? w->dirs_cap * 2 : 256;
		uint64_t *set = calloc(cap, sizeof(*set));

		if (!set)
			return -ENOMEM;
		for (i = 0; i < w->dirs_cap; i++) {
			if (!w->dirs_seen[i])
				continue;
			for (h = nid_hash(w->dirs_seen[i], cap); set[h];)
				h = (h + 1) & (cap - 1);
			set[h] = w->dirs_seen[i];
		}
		free(w->dirs_seen);
		w->dirs_seen = set;
		w->dirs_cap = cap;
	}
	for (h = nid_hash(nid + 1, w->dirs_cap); w->dirs_seen[h];
	     h = (h + 1) & (w->dirs_cap - 1))
		if (w->dirs_seen[h] == nid + 1)
			return 1;
	w->dirs_seen[h] = nid + 1;
	w->dirs_used++;
	return 0;
}

static int walk_inode(struct walker *w, uint64_t nid, unsigned int depth);

struct walk_dir {
	struct walker *w;
	unsigned int depth;
};

static int walk_dirent(void *ctx, const char *name, size_t len, uint64_t nid,
		       unsigned int file_type, uint64_t next_pos)
{
	struct walk_dir *d = ctx;
	struct walker *w = d->w;
	size_t saved = w->path_len;
	int ret;

	if ((len == 1 && name[0] == '.') || (len == 2 && !memcmp(name, "..", 2)))
		return 0;
	if (saved + 1 + len >= WALK_PATH_MAX) {
		ferry_err("bootstrap: path %s/%.*s is too long", w->path, (int)len, name);
		return -EFSCORRUPTED;
	}
	if (saved > 1)
		w->path[w->path_len++] = '/';
	memcpy(w->path + w->path_len, name, len);
	w->path_len += len;
	w->path[w->path_len] = '\0';
	ret = walk_inode(w, nid, d->depth + 1);
	w->path_len = saved;
	w->path[saved] = '\0';
	return ret;
}

static int walk_inode(struct walker *w, uint64_t nid, unsigned int depth)
{
	struct walk_dir d = { w, depth };
	struct meta_stat st;
	int ret;

	ret = meta_getattr(w->img, nid, &st);
	if (ret)
		return ret;
	ret = w->visit(w->ctx, w->path, &st);
	if (ret || !S_ISDIR(st.mode))
		return ret;
	if (depth >= META_WALK_MAX_DEPTH) {
		ferry_err("bootstrap: %s: directories nested deeper than %u",
			  w->path, META_WALK_MAX_DEPTH);
		return -EFSCORRUPTED;
	}
	ret = mark_dir(w, nid);
	if (ret) {
		if (ret > 0)
			ferry_err("bootstrap: %s: directory nid %llu reached twice (loop)",
				  w->path, (unsigned long long)nid);
		return ret > 0 ? -EFSCORRUPTED : ret;
	}
	return meta_readdir(w->img, nid, 0, walk_dirent, &d);
}

int meta_walk(const struct meta_image *img, meta_walk_fn visit, void *ctx)
{
	struct walker w = { .img = img, .visit = visit, .ctx = ctx };
	struct meta_super sb;
	int ret;

	w.path = malloc(WALK_PATH_MAX);
	if (!w.path)
		return -ENOMEM;
	strcpy(w.path, "/");
	w.path_len = 1;
	meta_get_super(img, &sb);
	ret = walk_inode(&w, sb.root_nid, 0);
	free(w.dirs_seen);
	free(w.path);
	return ret;
}

/*
 * Continue the walk with symlink @st's target followed by @rest (empty or
 * starting with '/'), in a new *@buf that replaces the old one (@rest may
 * point into it).
 */
static int follow_link(const struct meta_image *img, const struct meta_stat *st,
		       const char *rest, char **buf)
{
	size_t len = strlen(rest);
	char *s = malloc(st->size + len + 1);
	ssize_t n;

	if (!s)
		return -ENOMEM;
	n = meta_readlink(img, st->nid, s, st->size + 1);
	if (n < 0) {
		free(s);
		return (int)n;
	}
	memcpy(s + n, rest, len + 1);
	free(*buf);
	*buf = s;
	return 0;
}

/*
 * ".." goes up through the directory's own entry (the root's is the root);
 * a component followed by '/' must be a directory.
 */
static int resolve(const struct meta_image *img, const char *path, bool follow,
		   uint64_t *out)
{
	const char *p = path, *end;
	char *buf = NULL;
	unsigned int links = 0;
	struct meta_super sb;
	struct meta_stat st;
	uint64_t dir, nid;
	int ret = 0;

	if (strnlen(path, RESOLVE_PATH_MAX) >= RESOLVE_PATH_MAX)
		return -ENAMETOOLONG;
	meta_get_super(img, &sb);
	dir = sb.root_nid;
	for (;;) {
		while (*p == '/')
			p++;
		if (!*p)
			break;
		end = strchrnul(p, '/');
		if (end - p == 1 && *p == '.') {
			p = end;
			continue;
		}
		ret = meta_lookup(img, dir, p, (size_t)(end - p), &nid);
		p = end;
		/* Without following, the last inode is named, not read. */
		if (!ret && !follow && !*p) {
			dir = nid;
			break;
		}
		if (!ret)
			ret = meta_getattr(img, nid, &st);
		if (ret)
			break;
		if (follow && S_ISLNK(st.mode)) {
			if (++links > RESOLVE_SYMLOOP_MAX) {
				ret = -ELOOP;
				break;
			}
			ret = follow_link(img, &st, p, &buf);
			if (ret)
				break;
			p = buf;
			if (*p == '/')
				dir = sb.root_nid;
			continue;
		}
		if (*p && !S_ISDIR(st.mode)) {
			ret = -ENOTDIR;
			break;
		}
		dir = nid;
	}
	if (!ret)
		*out = dir;
	free(buf);
	return ret;
}

int meta_resolve(const struct meta_image *img, const char *path, uint64_t *nid)
{
	return resolve(img, path, false, nid);
}

int meta_resolve_follow(const struct meta_image *img, const char *path,
			uint64_t *nid)
{
	return resolve(img, path, true, nid);
}
