# SPDX-License-Identifier: MIT
"""EROFS superblock checksum for tests that patch a bootstrap in place.

fix_checksum(d): recompute the superblock's crc32c (bytes 1024..4095 with
the checksum field zeroed; seed ~0, no final inversion, as fs/erofs does)
in the bytearray d when its SB_CHKSUM compat feature is set.
"""
import struct

_TAB = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    _TAB.append(_c)


def crc32c(data, crc=0xFFFFFFFF):
    for b in data:
        crc = _TAB[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc


def fix_checksum(d, sb=1024):
    if struct.unpack_from("<I", d, sb + 8)[0] & 1:  # compat SB_CHKSUM
        struct.pack_into("<I", d, sb + 4, 0)
        struct.pack_into("<I", d, sb + 4, crc32c(bytes(d[sb:4096])))
