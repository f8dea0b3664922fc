// SPDX-License-Identifier: MIT
/*
 * The prefetch thread of one mount: first the files named by the mount
 * request, in list order (a directory stands for every file below it),
 * then with prefetchAll every blob front to back. image_cache paces it:
 * demand reads go first and the bandwidth limit holds. A missing path or
 * a failed fetch is logged and skipped; unmounting sets the stop flag.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ferryd.h"

#define PREFETCH_DIR_DEPTH 64u

struct dir_walk {
	struct fmount *m;
	uint64_t *nids;
	size_t nr, cap;
	int err;
};

static int collect(void *arg, const char *name, size_t len, uint64_t nid,
		   unsigned int file_type, uint64_t next_pos)
{
	struct dir_walk *w = arg;

	if ((len == 1 && name[0] == '.') || (len == 2 && !memcmp(name, "..", 2)))
		return 0;
	if (array_reserve(&w->nids, &w->cap, w->nr + 1, sizeof(*w->nids), 16)) {
		w->err = -ENOMEM;
		return 1;
	}
	w->nids[w->nr++] = nid;
	return 0;
}

/*
 * Prefetch the regular file or directory tree @nid: files done, or -errno.
 * mount_setup validated the image (image_validate_metadata): its
 * directories form a tree, so this recursion ends and visits each once.
 */
static int prefetch_nid(struct fmount *m, uint64_t nid, unsigned int depth,
			const char *path)
{
	struct dir_walk w = { .m = m };
	struct meta_stat st;
	size_t i;
	int ret, files = 0;

	ret = meta_getattr(m->img->meta, nid, &st);
	if (ret)
		return ret;
	if (S_ISREG(st.mode)) {
		ret = image_cache_prefetch_file(m->ic, &st, &m->stop);
		return ret ? ret : 1;
	}
	if (!S_ISDIR(st.mode))
		return 0;
	if (depth >= PREFETCH_DIR_DEPTH) {
		ferry_warn("%s: prefetch: %s: directories nested deeper than %u skipped",
			   m->img->ref, path, PREFETCH_DIR_DEPTH);
		return 0;
	}
	ret = meta_readdir(m->img->meta, nid, 0, collect, &w);
	if (ret > 0)
		ret = w.err;
	for (i = 0; !ret && i < w.nr && !m->stop; i++) {
		int n = prefetch_nid(m, w.nids[i], depth + 1, path);

		if (n < 0)
			ret = n;
		else
			files += n;
	}
	free(w.nids);
	return ret ? ret : files;
}

void *prefetch_main(void *arg)
{
	struct fmount *m = arg;
	const struct ctl_mount_req *r = &m->req;
	uint64_t t0 = ferry_now_ns(), nid, files = 0;
	struct image_cache_stats s;
	bool failed = false;
	size_t i;
	int ret;

	if (r->prefetch_bwlimit)
		image_cache_set_bwlimit(m->ic, r->prefetch_bwlimit);
	ferry_info("%s on %s: prefetch started (%u paths listed in the image, %zu given%s%s)",
		   m->img->ref, m->mountpoint, m->img->nr_prefetch,
		   r->nr_prefetch_files, r->prefetch_all ? ", then every blob" : "",
		   r->prefetch_bwlimit ? ", bandwidth limited" : "");
	/* The image's own list (ferry convert --prefetch-files) goes first. */
	for (i = 0; i < m->img->nr_prefetch + r->nr_prefetch_files && !m->stop; i++) {
		const char *path = i < m->img->nr_prefetch ? m->img->prefetch[i] :
				   r->prefetch_files[i - m->img->nr_prefetch];

		ret = meta_resolve_follow(m->img->meta, path, &nid);
		if (ret) {
			ferry_warn("%s: prefetch: %s: %s", m->img->ref, path,
				   ret == -ENOENT ? "no such file in the image" :
						    ferry_strerror(ret));
			continue;
		}
		ret = prefetch_nid(m, nid, 0, path);
		if (ret < 0) {
			ferry_warn("%s: prefetch of %s failed: %s", m->img->ref, path,
				   ferry_strerror(ret));
			failed = true;
			continue;
		}
		files += (uint64_t)ret;
		atomic_store(&m->prefetch_files, files);
	}
	if (r->prefetch_all && !m->stop) {
		ret = image_cache_prefetch_blobs(m->ic, NULL, &m->stop);
		if (ret) {
			ferry_warn("%s: prefetch of every blob failed: %s", m->img->ref,
				   ferry_strerror(ret));
			failed = true;
		}
	}
	atomic_store(&m->prefetch_ns, ferry_now_ns() - t0);
	image_cache_get_stats(m->ic, &s);
	ferry_info("%s on %s: prefetch %s after %.2f s: %llu files, %llu bytes made present, %llu bytes fetched in all; %llu of %llu chunks present",
		   m->img->ref, m->mountpoint,
		   m->stop ? "stopped" : failed ? "finished with errors" : "done",
		   (double)(ferry_now_ns() - t0) / 1e9, (unsigned long long)files,
		   (unsigned long long)s.bytes_prefetched,
		   (unsigned long long)s.bytes_fetched,
		   (unsigned long long)s.chunks_present,
		   (unsigned long long)s.chunks_total);
	atomic_store(&m->pstate, m->stop ? PF_STOPPED : failed ? PF_FAILED : PF_DONE);
	return NULL;
}
