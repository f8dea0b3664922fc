#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Add a framed section to a dir: image's bootstrap, as a later ferry would.

bootstrap_section.py DIR MAGIC VERSION FLAGS BODY: appends the section
(docs/FORMAT.md 2.7: MAGIC, u32 VERSION, u32 FLAGS, u64 length, BODY) to
the section area of DIR/bootstrap, in the zero padding of its last block
(the image keeps its size, so its device addresses stay), fixes the
preamble's area length and crcs, and the bootstrap's digest in
DIR/ferry.json. Exits 1 when the section does not fit in the padding.
"""
import hashlib
import json
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from erofs_sb import crc32c  # noqa: E402

PRE_EXT_OFF, PRE_EXT_LEN, PRE_SEC_LEN, PRE_SEC_CRC, PRE_CRC = 0x10, 0x18, 0x24, 0x2C, 0x3C


def main():
    out, magic, version, flags, body = sys.argv[1:6]
    magic, body = magic.encode(), body.encode()
    assert len(magic) == 8
    path = out + "/bootstrap"
    d = bytearray(open(path, "rb").read())
    assert d[:8] == b"FERRYBS1", "no ferry preamble"
    ext_off, ext_len = struct.unpack_from("<QQ", d, PRE_EXT_OFF)
    (sec_len,) = struct.unpack_from("<Q", d, PRE_SEC_LEN)
    start = ext_off + ext_len
    frame = magic + struct.pack("<IIQ", int(version), int(flags), len(body)) + body
    end = start + sec_len
    if end + len(frame) > len(d) or any(d[end:end + len(frame)]):
        print("the section does not fit in the bootstrap's padding", file=sys.stderr)
        return 1
    d[end:end + len(frame)] = frame
    sec_len += len(frame)
    struct.pack_into("<Q", d, PRE_SEC_LEN, sec_len)
    struct.pack_into("<I", d, PRE_SEC_CRC, crc32c(bytes(d[start:start + sec_len])))
    struct.pack_into("<I", d, PRE_CRC, crc32c(bytes(d[:PRE_CRC])))
    open(path, "wb").write(d)
    index = json.load(open(out + "/ferry.json"))
    index["bootstrap"]["digest"] = "sha256:" + hashlib.sha256(d).hexdigest()
    json.dump(index, open(out + "/ferry.json", "w"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
