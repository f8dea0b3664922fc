// SPDX-License-Identifier: MIT
/*
 * CRC32C (Castagnoli), reflected, without the final inversion: the variant
 * EROFS stores in its superblock and ferry uses for its preamble. One
 * 256-entry table per byte lane ("slicing by 4") keeps multi-megabyte
 * extension payloads cheap without architecture-specific code.
 */
#include "internal.h"

#include <pthread.h>

#define CRC32C_POLY 0x82F63B78u

static uint32_t crc32c_table[4][256];
static pthread_once_t crc32c_once = PTHREAD_ONCE_INIT;

static void crc32c_init_tables(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;

		for (int k = 0; k < 8; k++)
			c = (c >> 1) ^ (CRC32C_POLY & (0u - (c & 1)));
		crc32c_table[0][i] = c;
	}
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = crc32c_table[0][i];

		for (int lane = 1; lane < 4; lane++) {
			c = (c >> 8) ^ crc32c_table[0][c & 0xff];
			crc32c_table[lane][i] = c;
		}
	}
}

uint32_t erofs_crc32c(uint32_t crc, const void *buf, size_t len)
{
	const uint8_t *p = buf;

	pthread_once(&crc32c_once, crc32c_init_tables);
	while (len >= 4) {
		crc ^= (uint32_t)p[0] | (uint32_t)p[1] << 8 |
		       (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
		crc = crc32c_table[3][crc & 0xff] ^
		      crc32c_table[2][(crc >> 8) & 0xff] ^
		      crc32c_table[1][(crc >> 16) & 0xff] ^
		      crc32c_table[0][crc >> 24];
		p += 4;
		len -= 4;
	}
	while (len--)
		crc = (crc >> 8) ^ crc32c_table[0][(crc ^ *p++) & 0xff];
	return crc;
}
