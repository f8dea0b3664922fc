// SPDX-License-Identifier: MIT
/*
 * The in-memory tree the converter builds and the writer serialises.
 *
 * Every inode is registered in the tree's inode list and freed only by
 * meta_tree_free(), so callers may keep inode pointers across unlink and
 * relink. Dropping the last link of a directory unlinks its entries, and
 * so on down the subtree (with an explicit stack, not C recursion).
 *
 * Directories keep their children in insertion order, except that unlink
 * moves the last child into the hole (see meta.h). Once a directory grows
 * past CHILD_INDEX_MIN entries, a private open-addressing hash index
 * (linear probing, backward-shift deletion) maps names to positions, so
 * lookup, link and unlink stay O(1) in 100k-entry directories.
 */
#include "meta.h"

#include <stdlib.h>
#include <sys/stat.h>

#include "../pkg-base/base.h"
#include "internal.h"

/* Below this many children a linear scan beats hashing. */
#define CHILD_INDEX_MIN 16u

struct tree_priv {
	struct meta_inode **inodes;
	size_t nr_inodes, cap_inodes;
};

struct child_index {
	uint32_t mask;   /* slots - 1; slots is a power of two */
	uint32_t slot[]; /* position in children[] + 1; 0 = empty */
};

static uint32_t name_hash(const char *name, size_t len)
{
	uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a 64 */

	for (size_t i = 0; i < len; i++) {
		h ^= (uint8_t)name[i];
		h *= 0x100000001b3ull;
	}
	return (uint32_t)(h ^ (h >> 32));
}

static bool dentry_is(const struct meta_dentry *d, const char *name,
		      size_t len)
{
	return d->name_len == len && !memcmp(d->name, name, len);
}

static uint32_t slot_home(const struct child_index *ix,
			  const struct meta_inode *dir, uint32_t pos)
{
	const struct meta_dentry *d = dir->children[pos];

	return name_hash(d->name, d->name_len) & ix->mask;
}

static void index_insert(struct child_index *ix, const struct meta_inode *dir,
			 uint32_t pos)
{
	uint32_t i = slot_home(ix, dir, pos);

	while (ix->slot[i])
		i = (i + 1) & ix->mask;
	ix->slot[i] = pos + 1;
}

/* Slot holding @name, or the empty slot where the probe ended. */
static uint32_t index_find(const struct child_index *ix,
			   const struct meta_inode *dir, const char *name,
			   size_t len)
{
	uint32_t i = name_hash(name, len) & ix->mask;

	while (ix->slot[i] &&
	       !dentry_is(dir->children[ix->slot[i] - 1], name, len))
		i = (i + 1) & ix->mask;
	return i;
}

/* Backward-shift deletion keeps every probe chain unbroken without tombstones. */
static void index_remove(struct child_index *ix, const struct meta_inode *dir,
			 uint32_t i)
{
	uint32_t j = i;

	ix->slot[i] = 0;
	for (;;) {
		uint32_t home;

		j = (j + 1) & ix->mask;
		if (!ix->slot[j])
			break;
		home = slot_home(ix, dir, ix->slot[j] - 1);
		/* Leave it if its home lies cyclically in (i, j]. */
		if (i <= j ? (home > i && home <= j) : (home > i || home <= j))
			continue;
		ix->slot[i] = ix->slot[j];
		ix->slot[j] = 0;
		i = j;
	}
}

/* (Re)build @dir's index for at least @want children at load <= 1/2. */
static int index_rebuild(struct meta_inode *dir, uint32_t want)
{
	struct child_index *ix;
	size_t slots = 64;

	while (slots < (size_t)want * 2)
		slots *= 2;
	ix = calloc(1, sizeof(*ix) + slots * sizeof(ix->slot[0]));
	if (!ix)
		return -ENOMEM;
	ix->mask = (uint32_t)(slots - 1);
	for (uint32_t k = 0; k < dir->nr_children; k++)
		index_insert(ix, dir, k);
	free(dir->child_index);
	dir->child_index = ix;
	return 0;
}

/* Position of @name in dir->children, or UINT32_MAX. */
static uint32_t dir_find(const struct meta_inode *dir, const char *name,
			 size_t len)
{
	const struct child_index *ix = dir->child_index;

	if (ix) {
		uint32_t slot = ix->slot[index_find(ix, dir, name, len)];

		return slot ? slot - 1 : UINT32_MAX;
	}
	for (uint32_t k = 0; k < dir->nr_children; k++)
		if (dentry_is(dir->children[k], name, len))
			return k;
	return UINT32_MAX;
}

static bool name_valid(const char *name, size_t len)
{
	if (!name || len == 0 || len > META_NAME_MAX)
		return false;
	if ((len == 1 && name[0] == '.') ||
	    (len == 2 && name[0] == '.' && name[1] == '.'))
		return false;
	return !memchr(name, '/', len) && !memchr(name, '\0', len);
}

static void inode_free(struct meta_inode *inode)
{
	meta_inode_clear_xattrs(inode);
	for (uint32_t k = 0; k < inode->nr_children; k++)
		free(inode->children[k]);
	free(inode->children);
	free(inode->child_index);
	free(inode->data);
	free(inode->chunks);
	free(inode->zextents);
	free(inode);
}

/*
 * Drop one link of @inode. A directory losing its last link loses all its
 * entries, and so on down: @wpriv threads an explicit stack through the
 * dropped directories (it is NULL outside meta_write()), so hostile
 * nesting depth cannot overflow the C stack.
 */
static void inode_put(struct meta_inode *inode)
{
	struct meta_inode *stack;

	if (--inode->links || !S_ISDIR(inode->mode) || !inode->nr_children)
		return;
	free(inode->child_index);
	inode->child_index = NULL;
	inode->wpriv = NULL;
	stack = inode;
	while (stack) {
		struct meta_inode *dir = stack;
		struct meta_dentry *d;
		struct meta_inode *child;

		if (!dir->nr_children) {
			stack = dir->wpriv;
			dir->wpriv = NULL;
			free(dir->children);
			dir->children = NULL;
			dir->children_cap = 0;
			continue;
		}
		d = dir->children[--dir->nr_children];
		child = d->inode;
		free(d);
		if (--child->links || !S_ISDIR(child->mode) ||
		    !child->nr_children)
			continue;
		free(child->child_index);
		child->child_index = NULL;
		child->wpriv = stack;
		stack = child;
	}
}

int meta_tree_new(struct meta_tree **out)
{
	struct meta_tree *t = calloc(1, sizeof(*t));
	int ret = -ENOMEM;

	if (!t)
		return -ENOMEM;
	t->priv = calloc(1, sizeof(struct tree_priv));
	if (!t->priv)
		goto err;
	ret = meta_inode_new(t, S_IFDIR | 0755, &t->root);
	if (ret)
		goto err;
	/* A link nobody can drop: the root can never be unlinked or linked. */
	t->root->links = 1;
	*out = t;
	return 0;
err:
	meta_tree_free(t);
	return ret;
}

void meta_tree_free(struct meta_tree *t)
{
	struct tree_priv *tp;

	if (!t)
		return;
	tp = t->priv;
	if (tp) {
		for (size_t i = 0; i < tp->nr_inodes; i++)
			inode_free(tp->inodes[i]);
		free(tp->inodes);
		free(tp);
	}
	free(t);
}

int meta_inode_new(struct meta_tree *t, uint32_t mode, struct meta_inode **out)
{
	struct tree_priv *tp = t->priv;
	struct meta_inode *inode;

	if (erofs_ftype_of_mode(mode) == EROFS_FT_UNKNOWN ||
	    (mode & ~(uint32_t)(S_IFMT | 07777)))
		return -EINVAL;
	if (tp->nr_inodes == tp->cap_inodes) {
		size_t cap = tp->cap_inodes ? tp->cap_inodes * 2 : 256;
		struct meta_inode **n = realloc(tp->inodes, cap * sizeof(*n));

		if (!n)
			return -ENOMEM;
		tp->inodes = n;
		tp->cap_inodes = cap;
	}
	inode = calloc(1, sizeof(*inode));
	if (!inode)
		return -ENOMEM;
	inode->mode = mode;
	tp->inodes[tp->nr_inodes++] = inode;
	*out = inode;
	return 0;
}

int meta_inode_set_xattr(struct meta_inode *inode, const char *name,
			 const void *value, uint32_t value_len)
{
	struct meta_xattr *x = NULL;
	uint8_t *copy;
	char *name_copy = NULL;

	if (!name || !*name || (value_len && !value))
		return -EINVAL;
	for (uint32_t i = 0; i < inode->nr_xattrs; i++)
		if (!strcmp(inode->xattrs[i].name, name))
			x = &inode->xattrs[i];
	copy = malloc(value_len ? value_len : 1);
	if (!copy)
		return -ENOMEM;
	if (value_len)
		memcpy(copy, value, value_len);
	if (!x) {
		struct meta_xattr *n;

		name_copy = strdup(name);
		n = name_copy ? realloc(inode->xattrs,
					(inode->nr_xattrs + 1) * sizeof(*n))
			      : NULL;
		if (!n) {
			free(name_copy);
			free(copy);
			return -ENOMEM;
		}
		inode->xattrs = n;
		x = &n[inode->nr_xattrs++];
		x->name = name_copy;
		x->value = NULL;
	}
	free(x->value);
	x->value = copy;
	x->value_len = value_len;
	return 0;
}

void meta_inode_clear_xattrs(struct meta_inode *inode)
{
	for (uint32_t i = 0; i < inode->nr_xattrs; i++) {
		free(inode->xattrs[i].name);
		free(inode->xattrs[i].value);
	}
	free(inode->xattrs);
	inode->xattrs = NULL;
	inode->nr_xattrs = 0;
}

struct meta_inode *meta_dir_lookup(const struct meta_inode *dir,
				   const char *name, size_t len)
{
	uint32_t k;

	if (!S_ISDIR(dir->mode) || !name_valid(name, len))
		return NULL;
	k = dir_find(dir, name, len);
	return k == UINT32_MAX ? NULL : dir->children[k]->inode;
}

/* Append a new dentry to @dir, growing the array and the index. */
static int dir_append(struct meta_inode *dir, const char *name, size_t len,
		      struct meta_inode *inode)
{
	struct child_index *ix = dir->child_index;
	struct meta_dentry *d;
	int ret;

	if (dir->nr_children == UINT32_MAX - 2) /* "." and ".." must fit too */
		return -ENOSPC;
	if (dir->nr_children == dir->children_cap) {
		uint32_t cap = dir->children_cap ? dir->children_cap : 4;
		struct meta_dentry **n;

		cap = cap > UINT32_MAX / 2 ? UINT32_MAX : cap * 2;
		n = realloc(dir->children, (size_t)cap * sizeof(*n));
		if (!n)
			return -ENOMEM;
		dir->children = n;
		dir->children_cap = cap;
	}
	if (dir->nr_children + 1 >= CHILD_INDEX_MIN &&
	    (!ix || (size_t)(dir->nr_children + 1) * 2 > (size_t)ix->mask + 1)) {
		ret = index_rebuild(dir, dir->nr_children + 1);
		if (ret)
			return ret;
		ix = dir->child_index;
	}
	d = malloc(sizeof(*d) + len + 1);
	if (!d)
		return -ENOMEM;
	d->inode = inode;
	d->name_len = (uint16_t)len;
	memcpy(d->name, name, len);
	d->name[len] = '\0';
	dir->children[dir->nr_children] = d;
	if (ix)
		index_insert(ix, dir, dir->nr_children);
	dir->nr_children++;
	return 0;
}

int meta_dir_link(struct meta_tree *t, struct meta_inode *dir, const char *name,
		  size_t len, struct meta_inode *inode)
{
	struct meta_dentry *d;
	struct meta_inode *old;
	uint32_t k;
	int ret;

	if (!name_valid(name, len))
		return -EINVAL;
	if (!S_ISDIR(dir->mode))
		return -ENOTDIR;
	if ((S_ISDIR(inode->mode) && inode->links) || inode->links == UINT32_MAX)
		return -EMLINK;
	k = dir_find(dir, name, len);
	d = k == UINT32_MAX ? NULL : dir->children[k];
	if (d && d->inode == inode)
		return 0;
	if (!d) {
		ret = dir_append(dir, name, len, inode);
		if (ret)
			return ret;
		inode->links++;
		return 0;
	}
	/* Take the new link before dropping the old: @inode may live below it. */
	old = d->inode;
	d->inode = inode;
	inode->links++;
	inode_put(old);
	return 0;
}

int meta_dir_unlink(struct meta_tree *t, struct meta_inode *dir,
		    const char *name, size_t len)
{
	struct child_index *ix = dir->child_index;
	uint32_t k, last = dir->nr_children - 1;
	struct meta_dentry *d;
	struct meta_inode *inode;

	if (!S_ISDIR(dir->mode))
		return -ENOTDIR;
	if (!name_valid(name, len))
		return -ENOENT;
	k = dir_find(dir, name, len);
	if (k == UINT32_MAX)
		return -ENOENT;
	d = dir->children[k];
	if (ix)
		index_remove(ix, dir, index_find(ix, dir, name, len));
	/* O(1) removal: the last child takes the freed slot. */
	if (k != last) {
		const struct meta_dentry *moved = dir->children[last];

		dir->children[k] = dir->children[last];
		if (ix)
			ix->slot[index_find(ix, dir, moved->name,
					    moved->name_len)] = k + 1;
	}
	dir->nr_children--;
	inode = d->inode;
	free(d);
	inode_put(inode);
	return 0;
}

void meta_dir_clear(struct meta_tree *t, struct meta_inode *dir)
{
	struct meta_dentry **children = dir->children;
	uint32_t nr = dir->nr_children;

	if (!S_ISDIR(dir->mode))
		return;
	/* Detach first: dropping a child may come back to @dir through a cycle. */
	dir->children = NULL;
	dir->nr_children = dir->children_cap = 0;
	free(dir->child_index);
	dir->child_index = NULL;
	for (uint32_t k = 0; k < nr; k++) {
		struct meta_inode *inode = children[k]->inode;

		free(children[k]);
		inode_put(inode);
	}
	free(children);
}
