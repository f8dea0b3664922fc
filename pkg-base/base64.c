// SPDX-License-Identifier: MIT
/*
 * Standard base64 (RFC 4648 section 4) over OpenSSL's EVP block coder.
 * EVP_DecodeBlock wants whole quads, counts '=' padding as decoded zero
 * bytes and accepts '=' anywhere and surrounding blanks; writers such as
 * libarchive drop the padding. So the text is checked here first and
 * decoded in slices of whole quads, the last one padded by us.
 */
#include "base.h"

#include <limits.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdlib.h>

#define B64_SLICE 4096u /* characters per EVP call, a multiple of 4 */

static bool b64_char(char c)
{
	return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
	       (c >= '0' && c <= '9') || c == '+' || c == '/';
}

int base64_decode(const char *in, size_t len, uint8_t *out, size_t cap,
		  size_t *out_len)
{
	unsigned char quads[B64_SLICE], bytes[B64_SLICE / 4 * 3];
	size_t pad = 0, i, done = 0, n;
	int ret = 0;

	while (pad < 2 && len && in[len - 1] == '=') {
		len--;
		pad++;
	}
	for (i = 0; i < len; i++)
		if (!b64_char(in[i]))
			return -EINVAL;
	/* Padding, when given, completes the last quad exactly. */
	if (len % 4 == 1 || (pad && (len + pad) % 4))
		return -EINVAL;
	n = len / 4 * 3 + (len % 4 ? len % 4 - 1 : 0);
	if (n > cap)
		return -ENOSPC;
	for (i = 0; i < len; i += B64_SLICE) {
		size_t take = MIN(len - i, (size_t)B64_SLICE);
		size_t whole = ROUND_UP(take, 4);
		int got;

		memcpy(quads, in + i, take);
		memset(quads + take, '=', whole - take);
		got = EVP_DecodeBlock(bytes, quads, (int)whole);
		if (got < 0 || (size_t)got < whole - take) {
			ret = -EINVAL;
			break;
		}
		got -= (int)(whole - take);
		memcpy(out + done, bytes, (size_t)got);
		done += (size_t)got;
	}
	/* The text may be a credential. */
	OPENSSL_cleanse(quads, sizeof(quads));
	OPENSSL_cleanse(bytes, sizeof(bytes));
	if (!ret)
		*out_len = done;
	return ret;
}

int base64_encode(const void *in, size_t len, char **out)
{
	const unsigned char *src = in;
	size_t slice = B64_SLICE / 4 * 3, i, pos = 0;
	char *buf;

	if (len > SIZE_MAX / 4 - 2)
		return -EOVERFLOW;
	buf = malloc(DIV_ROUND_UP(len, 3) * 4 + 1);
	if (!buf)
		return -ENOMEM;
	buf[0] = '\0';
	/* Slices of whole triples, so only the last one is padded. */
	for (i = 0; i < len; i += slice)
		pos += (size_t)EVP_EncodeBlock((unsigned char *)buf + pos,
					       src + i, (int)MIN(len - i, slice));
	*out = buf;
	return 0;
}
