#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Run a command on a pseudo-terminal of a given width; report its lines.

ptyrun.py COLS OUT CMD...: runs CMD with stdin, stdout and stderr on a new
pty whose window is COLS columns wide, copies everything CMD writes to OUT
(raw), and exits with CMD's exit status. The "lines" of a terminal are
what lies between carriage returns and newlines once escape sequences are
removed: ptyrun.py --lines OUT prints them, one per line, each prefixed
with its length in columns and a tab.
"""
import fcntl
import os
import re
import struct
import sys
import termios

ESCAPE = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")


def lines(raw):
    text = ESCAPE.sub(b"", raw)
    return [seg.decode("utf-8", "replace")
            for seg in re.split(rb"[\r\n]", text) if seg]


def run(cols, out, cmd):
    pid, fd = os.forkpty()
    if pid == 0:  # the window's size is set before CMD can ask for it
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 24, cols, 0, 0))
        os.execvp(cmd[0], cmd)
    raw = b""
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:  # EIO: the child closed the pty
            break
        if not data:
            break
        raw += data
    _, status = os.waitpid(pid, 0)
    with open(out, "wb") as f:
        f.write(raw)
    return os.waitstatus_to_exitcode(status)


def main():
    if sys.argv[1] == "--lines":
        for line in lines(open(sys.argv[2], "rb").read()):
            print("%d\t%s" % (len(line), line))
        return 0
    return run(int(sys.argv[1]), sys.argv[2], sys.argv[3:])


if __name__ == "__main__":
    sys.exit(main())
