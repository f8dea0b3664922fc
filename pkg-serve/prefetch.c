// SPDX-License-Identifier: MIT
/*
 * The prefetch thread of one mount: first the files listed by the image
 * and by the mount request (a directory stands for every file below it),
 * planned as blob ranges and fetched several at once, the first listed
 * first; then with prefetchAll every blob front to back, after demand
 * reads. The bandwidth limit holds throughout. A missing path is logged
 * and skipped; unmounting sets the stop flag.
 */
#include "internal.h"

void *prefetch_main(void *arg)
{
	struct fmount *m = arg;
	const struct ctl_mount_req *r = &m->req;
	uint64_t t0 = ferry_now_ns(), files = 0;
	struct image_prefetch_plan *plan = NULL;
	struct image_cache_stats s;
	bool failed = false, stopped;
	size_t i;
	int ret;

	if (r->prefetch_bwlimit)
		image_cache_set_bwlimit(m->ic, r->prefetch_bwlimit);
	ferry_info("%s on %s: prefetch started (%u paths listed in the image, %zu given%s%s)",
		   m->img->ref, m->mountpoint, m->img->nr_prefetch,
		   r->nr_prefetch_files, r->prefetch_all ? ", then every blob" : "",
		   r->prefetch_bwlimit ? ", bandwidth limited" : "");
	/* The image's own list (ferry convert --prefetch-files) goes first. */
	for (i = 0; i < m->img->nr_prefetch + r->nr_prefetch_files && !atomic_load(&m->stop); i++) {
		const char *path = i < m->img->nr_prefetch ? m->img->prefetch[i] :
				   r->prefetch_files[i - m->img->nr_prefetch];

		ret = image_prefetch_plan_add(m->ic, &plan, path);
		if (ret == -ENOENT) {
			ferry_warn("%s: prefetch: %s: no such file in the image",
				   m->img->ref, path);
			continue;
		}
		if (ret < 0) {
			ferry_warn("%s: prefetch of %s failed: %s", m->img->ref, path,
				   ferry_strerror(ret));
			failed = true;
			continue;
		}
		files += (uint64_t)ret;
	}
	ret = image_cache_prefetch_plan(m->ic, plan, &m->stop);
	image_prefetch_plan_free(plan);
	if (ret) {
		ferry_warn("%s: prefetch of the listed files failed: %s", m->img->ref,
			   ferry_strerror(ret));
		failed = true;
	}
	atomic_store(&m->prefetch_files, files);
	if (r->prefetch_all && !atomic_load(&m->stop)) {
		ret = image_cache_prefetch_blobs(m->ic, NULL, &m->stop);
		if (ret) {
			ferry_warn("%s: prefetch of every blob failed: %s", m->img->ref,
				   ferry_strerror(ret));
			failed = true;
		}
	}
	atomic_store(&m->prefetch_ns, ferry_now_ns() - t0);
	image_cache_get_stats(m->ic, &s);
	stopped = atomic_load(&m->stop);
	ferry_info("%s on %s: prefetch %s after %.2f s: %llu files, %llu bytes made present, %llu bytes fetched in all; %llu of %llu chunks present",
		   m->img->ref, m->mountpoint,
		   stopped ? "stopped" : failed ? "finished with errors" : "done",
		   (double)(ferry_now_ns() - t0) / 1e9, (unsigned long long)files,
		   (unsigned long long)s.bytes_prefetched,
		   (unsigned long long)s.bytes_fetched,
		   (unsigned long long)s.chunks_present,
		   (unsigned long long)s.chunks_total);
	atomic_store(&m->pstate, stopped ? PF_STOPPED : failed ? PF_FAILED : PF_DONE);
	return NULL;
}
