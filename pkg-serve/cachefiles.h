/* SPDX-License-Identifier: MIT */
/*
 * Cachefiles mode (cachefiles.c): the names fscache knows a mount's
 * objects by, and which mount an object the kernel names belongs to
 * (cachefiles_names.c). Private to those files; pure, so that the unit
 * tests can check them without a device.
 *
 * A ferry image is volume "erofs,<fsid or domain>" with cookies <fsid>
 * (the bootstrap: its sha256) and each blob's tag (its sha256). A native
 * layer is its own primary blob: volume "erofs,FSID", cookie FSID, where
 * FSID names the layer (see cf_layer_fsid).
 */
#ifndef FERRY_SERVE_CACHEFILES_H
#define FERRY_SERVE_CACHEFILES_H

#include <stdbool.h>
#include <stdint.h>

#include "../pkg-meta/meta.h"
#include "../pkg-blob/blob.h"

#define CF_VOLUME_MAX (6 + META_FSCACHE_ID_MAX + 1) /* "erofs," + id + NUL */
#define CF_FSID_LEN (2 * BLOB_DIGEST_SIZE)
#define CF_LAYER_COPIES 100u /* fsids one native layer can be mounted under */

typedef char cf_name[CF_FSID_LEN + 1];

/* What fscache calls a mount's objects. */
struct cf_names {
	bool layers;               /* native EROFS layers: no bootstrap */
	char domain[META_FSCACHE_ID_MAX + 1]; /* --domain, or "" */
	char volume[CF_VOLUME_MAX];  /* layers: none, each layer is its own */
	cf_name fsid;              /* the bootstrap's digest; layers: none */
	uint32_t nr;               /* blobs: device i + 1 is blob i */
	cf_name *digests;          /* blob i's sha256, hex */
	cf_name *layer_fsids;      /* layers: the fsid layer i is mounted
				    * under; "" (taken over): any copy */
};

/*
 * @n for an image of @nr blobs whose bootstrap has digest @bootstrap
 * (NULL: native layers), in @domain (NULL: none); the caller then puts
 * each blob's digest into n->digests. 0, -ENOMEM or -ENAMETOOLONG (a
 * domain too long).
 */
int cf_names_init(struct cf_names *n, uint32_t nr, const uint8_t *bootstrap,
		  const char *domain);
void cf_names_free(struct cf_names *n);

/*
 * Copy @k of the native layer whose digest is @hex: fscache allows one
 * live superblock per fsid (volume "erofs,FSID"), so a layer that two
 * mounted images share is mounted a second time under another fsid: copy
 * 0 is @hex itself, copy k "kk-" and @hex's first 61 digits. The copy
 * number leads because the kernel names the superblock's sysfs directory
 * after the fsid's first 36 bytes, which must differ too.
 */
void cf_layer_fsid(const char *hex, unsigned int k, cf_name out);

/*
 * Is @cookie in @volume one of @n's objects? Then *@device, its EROFS
 * device id (fscache has an object per device, named here; the callers
 * convert to the blob index): 0 for the bootstrap (the primary device),
 * i + 1 for blob (or layer) i. A layer's object is any copy of it: its
 * bytes are the layer's whichever mount serves them, and a successor
 * knows the layers of the mounts it takes over, not which copies they
 * were.
 */
bool cf_names_resolve(const struct cf_names *n, const char *volume, const char *cookie,
		      uint32_t *device);
/*
 * Is @cookie in @volume the cache file of @n's device id @device (> 0)? A
 * native layer's is the copy this mount made; taken over, any copy.
 */
bool cf_names_object_is(const struct cf_names *n, uint32_t device, const char *volume,
			const char *cookie);
/*
 * Is @sysfs (/sys/fs/erofs/NAME) a superblock of @n? The kernel names it
 * "[DOMAIN,]FSID" cut to 36 bytes (s_sysfs_name); for native layers, the
 * bottom layer's (any copy).
 */
bool cf_names_sysfs_is(const struct cf_names *n, const char *sysfs);

#endif
