// SPDX-License-Identifier: MIT
/*
 * The EROFS writer's extended attributes (writer.c): each inode's xattrs
 * parsed into EROFS name indexes, the ones several inodes share moved into
 * the shared xattr area, the rest inline after the inode.
 */
#include <stdlib.h>
#include <string.h>

#include "../pkg-base/base.h"
#include "internal.h"
#include "writer.h"

static int xattr_cmp(const struct wr_xattr *a, const struct wr_xattr *b)
{
	int c;

	if (a->index != b->index)
		return a->index < b->index ? -1 : 1;
	c = memcmp(a->suffix, b->suffix, MIN(a->suffix_len, b->suffix_len));
	if (c || a->suffix_len != b->suffix_len)
		return c ? c : (a->suffix_len < b->suffix_len ? -1 : 1);
	c = memcmp(a->value, b->value, MIN(a->value_len, b->value_len));
	if (c || a->value_len != b->value_len)
		return c ? c : (a->value_len < b->value_len ? -1 : 1);
	return 0;
}

static int xattr_cmp_val(const void *a, const void *b)
{
	return xattr_cmp(a, b);
}

static int xattr_cmp_ptr(const void *a, const void *b)
{
	return xattr_cmp(*(struct wr_xattr *const *)a,
			 *(struct wr_xattr *const *)b);
}

static uint32_t xattr_entry_size(const struct wr_xattr *x)
{
	return EROFS_XATTR_ALIGN(EROFS_XATTR_ENTRY_SIZE + x->suffix_len +
				 x->value_len);
}

uint32_t xattr_put_entry(uint8_t *p, const struct wr_xattr *x)
{
	p[0] = x->suffix_len;
	p[1] = x->index;
	put_le16(p + 2, (uint16_t)x->value_len);
	memcpy(p + EROFS_XATTR_ENTRY_SIZE, x->suffix, x->suffix_len);
	if (x->value_len)
		memcpy(p + EROFS_XATTR_ENTRY_SIZE + x->suffix_len, x->value,
		       x->value_len);
	return xattr_entry_size(x);
}

/* Map a full xattr name to an EROFS name index and suffix. */
static int xattr_parse(struct writer *w, const struct wr_inode *wi,
		       const struct meta_xattr *mx, struct wr_xattr *x)
{
	for (size_t i = 0; i < ARRAY_SIZE(erofs_xattr_prefixes); i++) {
		const struct erofs_xattr_prefix *p = &erofs_xattr_prefixes[i];
		size_t len;

		if (strncmp(mx->name, p->prefix, p->len))
			continue;
		len = strlen(mx->name + p->len);
		/* ACL names are whole; the others need a suffix. */
		if ((p->index == EROFS_XATTR_INDEX_POSIX_ACL_ACCESS ||
		     p->index == EROFS_XATTR_INDEX_POSIX_ACL_DEFAULT) != !len)
			break;
		if (len > EROFS_NAME_LEN)
			return wr_fail(w, wi, -EINVAL,
				       "xattr name \"%.40s...\" longer than %u after its prefix",
				       mx->name, EROFS_NAME_LEN);
		if (mx->value_len > META_XATTR_VALUE_MAX)
			return wr_fail(w, wi, -EINVAL,
				       "xattr \"%s\" value of %u bytes exceeds %u",
				       mx->name, mx->value_len,
				       META_XATTR_VALUE_MAX);
		x->index = p->index;
		x->suffix = mx->name + p->len;
		x->suffix_len = (uint8_t)len;
		x->value = mx->value;
		x->value_len = mx->value_len;
		return 0;
	}
	return wr_fail(w, wi, -EINVAL,
		       "xattr \"%.64s\" is not user./trusted./security.<name> "
		       "or system.posix_acl_{access,default}", mx->name);
}

/* Mark runs of >= 2 equal pairs shared, capped per inode, and number them. */
static int xattr_share(struct writer *w, struct wr_xattr **sorted, size_t n)
{
	uint64_t off = 0;

	for (size_t a = 0, b; a < n; a = b) {
		for (b = a + 1; b < n && !xattr_cmp(sorted[a], sorted[b]); b++)
			;
		for (size_t k = a; b - a >= 2 && k < b; k++)
			sorted[k]->shared = true;
	}
	for (uint32_t i = 0; i < w->nr_inodes; i++) {
		struct wr_inode *wi = &w->inodes[i];

		for (uint32_t k = 0; k < wi->inode->nr_xattrs; k++) {
			struct wr_xattr *x = &w->xattrs[wi->xattrs + k];

			if (!x->shared)
				continue;
			if (wi->nr_shared == MAX_SHARED_PER_INODE)
				x->shared = false;
			else
				wi->nr_shared++;
		}
	}
	for (size_t a = 0, b; a < n; a = b) {
		bool used = false;

		for (b = a; b < n && !xattr_cmp(sorted[a], sorted[b]); b++)
			used |= sorted[b]->shared;
		if (!used)
			continue;
		if (off / 4 > UINT32_MAX) {
			ferry_err("meta: shared xattr area over 16 GiB");
			return -EFBIG;
		}
		for (size_t k = a; k < b; k++)
			sorted[k]->shared_id = (uint32_t)(off / 4);
		w->shared[w->nr_shared++] = sorted[a];
		off += xattr_entry_size(sorted[a]);
	}
	w->shared_bytes = off;
	return 0;
}

int wr_xattrs(struct writer *w)
{
	struct wr_xattr **sorted = NULL;
	size_t total = 0, k = 0;
	int ret = 0;

	for (uint32_t i = 0; i < w->nr_inodes; i++)
		total += w->inodes[i].inode->nr_xattrs;
	if (!total)
		return 0;
	w->xattrs = calloc(total, sizeof(*w->xattrs));
	sorted = malloc(total * sizeof(*sorted));
	w->shared = malloc(total * sizeof(*w->shared));
	if (!w->xattrs || !sorted || !w->shared) {
		ret = -ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < w->nr_inodes; i++) {
		struct wr_inode *wi = &w->inodes[i];
		const struct meta_inode *in = wi->inode;

		wi->xattrs = (uint32_t)k;
		for (uint32_t j = 0; j < in->nr_xattrs; j++, k++) {
			ret = xattr_parse(w, wi, &in->xattrs[j], &w->xattrs[k]);
			if (ret)
				goto out;
			sorted[k] = &w->xattrs[k];
		}
		qsort(&w->xattrs[wi->xattrs], in->nr_xattrs,
		      sizeof(w->xattrs[0]), xattr_cmp_val);
	}
	/* Only now are the per-inode slices in place for @sorted to point at. */
	qsort(sorted, total, sizeof(sorted[0]), xattr_cmp_ptr);
	ret = xattr_share(w, sorted, total);
	if (ret)
		goto out;
	for (uint32_t i = 0; i < w->nr_inodes; i++) {
		struct wr_inode *wi = &w->inodes[i];
		uint64_t size = EROFS_XATTR_IBODY_HEADER_SIZE + 4u * wi->nr_shared;

		if (!wi->inode->nr_xattrs)
			continue;
		for (uint32_t j = 0; j < wi->inode->nr_xattrs; j++) {
			const struct wr_xattr *x = &w->xattrs[wi->xattrs + j];

			if (!x->shared)
				size += xattr_entry_size(x);
		}
		if (size > XATTR_IBODY_MAX) {
			ret = wr_fail(w, wi, -EINVAL,
				      "xattrs need %llu bytes, an inode holds %u",
				      (unsigned long long)size, XATTR_IBODY_MAX);
			goto out;
		}
		wi->xattr_size = (uint32_t)size;
	}
out:
	free(sorted);
	return ret;
}
