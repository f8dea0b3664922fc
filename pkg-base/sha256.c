// SPDX-License-Identifier: MIT
/*
 * sha256 through OpenSSL EVP. The digest algorithm is fetched once: an
 * implicit fetch per call (EVP_sha256()) costs a provider lookup per
 * chunk. OpenSSL only fails here on allocation failure or a broken
 * provider setup; with no error return in the API, that aborts rather
 * than hand out a wrong digest.
 */
#include "base.h"

#include <openssl/evp.h>
#include <pthread.h>
#include <stdlib.h>

struct sha256_hasher {
	EVP_MD_CTX *ctx;
};

static EVP_MD *sha256_md;
static pthread_once_t sha256_once = PTHREAD_ONCE_INIT;

static void sha256_fetch(void)
{
	sha256_md = EVP_MD_fetch(NULL, "SHA256", NULL);
}

static const EVP_MD *sha256_get(void)
{
	pthread_once(&sha256_once, sha256_fetch);
	if (!sha256_md) {
		ferry_err("OpenSSL: cannot fetch SHA256");
		abort();
	}
	return sha256_md;
}

static void sha256_fail(const char *what)
{
	ferry_err("OpenSSL: %s failed", what);
	abort();
}

void sha256_buf(const void *data, size_t len, uint8_t out[SHA256_SIZE])
{
	if (!EVP_Digest(data, len, out, NULL, sha256_get(), NULL))
		sha256_fail("sha256");
}

int sha256_hasher_new(struct sha256_hasher **out)
{
	struct sha256_hasher *h = malloc(sizeof(*h));

	if (!h)
		return -ENOMEM;
	h->ctx = EVP_MD_CTX_new();
	if (!h->ctx) {
		free(h);
		return -ENOMEM;
	}
	if (!EVP_DigestInit_ex(h->ctx, sha256_get(), NULL)) {
		sha256_hasher_free(h);
		return -ENOMEM;
	}
	*out = h;
	return 0;
}

void sha256_hasher_update(struct sha256_hasher *h, const void *data, size_t len)
{
	if (!EVP_DigestUpdate(h->ctx, data, len))
		sha256_fail("sha256 update");
}

void sha256_hasher_final(struct sha256_hasher *h, uint8_t out[SHA256_SIZE])
{
	if (!EVP_DigestFinal_ex(h->ctx, out, NULL))
		sha256_fail("sha256 final");
}

void sha256_hasher_free(struct sha256_hasher *h)
{
	if (!h)
		return;
	EVP_MD_CTX_free(h->ctx);
	free(h);
}
