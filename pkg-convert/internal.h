/* SPDX-License-Identifier: MIT */
/* Internal to pkg-convert. */
#ifndef FERRY_CONVERT_INTERNAL_H
#define FERRY_CONVERT_INTERNAL_H

/*
 * Normalise an archive path in place to "a/b/c" (leading '/', "." and
 * empty components dropped; "" is the root). -EINVAL if it has "..".
 */
int convert_normalize_path(char *path);

#endif
