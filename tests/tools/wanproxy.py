#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""wanproxy: a TCP proxy that makes 127.0.0.1 look like a wide-area link
(tests and `make bench`; the kernel here has no netem).

  wanproxy.py --upstream HOST:PORT [--port N] [--port-file F]
              [--delay-ms D] [--rate-mbit R] [--stats-port-file F]
  wanproxy.py --query STATS_PORT [--reset] KEY
              (prints one counter of a running proxy; --reset zeroes
              them after reading)

Each direction of every connection is a delay line: bytes are read as
soon as they arrive, queued with the time they will have crossed the
link, and written when it comes, so a long transfer keeps its throughput
and only gains D ms (one way). Both directions share one link each of R
Mbit/s (0: unlimited): a chunk leaves after the ones queued before it,
from any connection, so parallel connections split the bandwidth as a
real link does. The round trip gains 2 x D.

The proxy also reads the HTTP/1.1 framing (request lines and
Content-Length, response status and Content-Length or chunked ends) to
count requests and how many are in flight at once: a request is in flight
from its first byte reaching the proxy to the last byte of its response
leaving it. The statistics port answers one JSON line per connection:
send "stats\\n" (or nothing) for the counters, "reset\\n" to zero them first
(the maxima restart from what is open now):

  {"connections": total accepted, "open": now, "max_open": most at once,
   "requests": total, "inflight": now, "max_inflight": most at once,
   "bytes_up": client to upstream, "bytes_down": upstream to client}

Bounds: at most 64 MiB queued per direction and connection (the reader
waits while more is), 1024 connections, headers of 64 KiB.
"""
import argparse
import asyncio
import json
import os
import re
import socket
import time

QUEUE_MAX = 64 << 20
CHUNK = 64 << 10
HDR_MAX = 64 << 10
CONN_MAX = 1024


class Stats:
    def __init__(self):
        self.reset()
        self.open = 0
        self.inflight = 0

    def reset(self):
        self.connections = self.requests = 0
        self.bytes_up = self.bytes_down = 0
        self.max_open = getattr(self, "open", 0)
        self.max_inflight = getattr(self, "inflight", 0)

    def dict(self):
        return {"connections": self.connections, "open": self.open,
                "max_open": self.max_open, "requests": self.requests,
                "inflight": self.inflight, "max_inflight": self.max_inflight,
                "bytes_up": self.bytes_up, "bytes_down": self.bytes_down}

    def req_start(self):
        self.requests += 1
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)

    def req_end(self):
        self.inflight -= 1


class Link:
    """One direction of the shared link: serialisation at the rate, FIFO."""

    def __init__(self, rate):
        self.rate = rate  # bytes per second, 0 = unlimited
        self.free_at = 0.0

    def departs(self, now, n):
        if not self.rate:
            return now
        start = max(now, self.free_at)
        self.free_at = start + n / self.rate
        return self.free_at


class Framing:
    """HTTP/1.1 message boundaries of one direction (no pipelining)."""
    CL = re.compile(rb"^content-length:\s*(\d+)\s*$", re.I | re.M)
    CHUNKED = re.compile(rb"^transfer-encoding:.*chunked", re.I | re.M)

    def __init__(self, requests, conn):
        self.requests = requests  # True: client to upstream
        self.conn = conn
        self.hdr = b""
        self.body = 0          # body bytes still to come, -1 chunked
        self.tail = b""        # last bytes of a chunked body

    def feed(self, data):
        while data:
            if self.body > 0:
                n = min(self.body, len(data))
                self.body -= n
                data = data[n:]
                if not self.body:
                    self.message_end()
                continue
            if self.body < 0:
                self.tail = (self.tail + data)[-7:]
                data = b""
                if self.tail.endswith(b"0\r\n\r\n"):
                    self.body = 0
                    self.message_end()
                continue
            i = (self.hdr + data).find(b"\r\n\r\n")
            if i < 0:
                self.hdr += data
                if len(self.hdr) > HDR_MAX:
                    self.hdr = b""  # not HTTP: stop counting this stream
                return
            whole = self.hdr + data
            head, data = whole[:i], whole[i + 4:]
            self.hdr = b""
            self.message_start(head)

    def message_start(self, head):
        first = head.split(b"\r\n", 1)[0]
        if self.requests:
            st.req_start()
            self.conn.methods.append(first.split(b" ", 1)[0])
            m = self.CL.search(head)
            self.body = int(m.group(1)) if m else 0
            return
        parts = first.split(b" ")
        status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
        if 100 <= status < 200:
            return
        method = self.conn.methods.pop(0) if self.conn.methods else b""
        m = self.CL.search(head)
        if method == b"HEAD" or status in (204, 304):
            self.body = 0
        elif self.CHUNKED.search(head):
            self.body, self.tail = -1, b""
            return
        else:
            self.body = int(m.group(1)) if m else 0
        if not self.body:
            self.message_end()

    def message_end(self):
        if not self.requests:
            self.conn.end_request()


class Conn:
    def __init__(self):
        self.methods = []
        self.open_requests = 0

    def end_request(self):
        if self.open_requests:
            self.open_requests -= 1
            st.req_end()


async def pipe(reader, writer, link, framing, conn, up):
    """Delay line: read at once, deliver each chunk when it has crossed."""
    q = asyncio.Queue()
    queued = [0]
    room = asyncio.Event()
    room.set()

    async def deliver():
        try:
            while True:
                t, data = await q.get()
                if data is None:
                    break
                wait = t - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()
                if not up:
                    st.bytes_down += len(data)
                    framing.feed(data)
                queued[0] -= len(data)
                if queued[0] < QUEUE_MAX:
                    room.set()
            if writer.can_write_eof():
                writer.write_eof()
        finally:
            room.set()  # a reader waiting for room sees the writer gone

    task = asyncio.ensure_future(deliver())
    try:
        while not task.done():
            await room.wait()
            if task.done():
                break
            data = await reader.read(CHUNK)
            now = time.monotonic()
            if not data:
                break
            if up:
                st.bytes_up += len(data)
                before = st.requests
                framing.feed(data)
                conn.open_requests += st.requests - before
            queued[0] += len(data)
            if queued[0] >= QUEUE_MAX:
                room.clear()
            q.put_nowait((link.departs(now, len(data)) + delay, data))
    except (ConnectionError, OSError):
        pass
    q.put_nowait((0, None))
    try:
        await task
    except (ConnectionError, OSError):
        pass


async def handle(creader, cwriter):
    if st.open >= CONN_MAX:
        cwriter.close()
        return
    try:
        ureader, uwriter = await asyncio.open_connection(up_host, up_port)
    except OSError:
        cwriter.close()
        return
    st.connections += 1
    st.open += 1
    st.max_open = max(st.max_open, st.open)
    conn = Conn()
    try:
        await asyncio.gather(
            pipe(creader, uwriter, link_up, Framing(True, conn), conn, True),
            pipe(ureader, cwriter, link_down, Framing(False, conn), conn, False))
    finally:
        while conn.open_requests:
            conn.end_request()
        st.open -= 1
        for w in (cwriter, uwriter):
            try:
                w.close()
            except OSError:
                pass


async def control(reader, writer):
    try:
        line = await asyncio.wait_for(reader.readline(), 5)
    except (asyncio.TimeoutError, ConnectionError):
        line = b""
    if line.strip() == b"reset":
        st.reset()
    writer.write(json.dumps(st.dict()).encode() + b"\n")
    await writer.drain()
    writer.close()


def write_port(path, port):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write("%d\n" % port)
    os.rename(tmp, path)


def query(port, key, reset):
    """One counter from the statistics port of a running proxy."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"reset\n" if reset else b"stats\n")
    buf = b""
    while not buf.endswith(b"\n"):
        d = s.recv(4096)
        if not d:
            break
        buf += d
    print(json.loads(buf)[key])


async def main():
    global up_host, up_port, delay, link_up, link_down
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--query", type=int, metavar="STATS_PORT")
    p.add_argument("--reset", action="store_true")
    p.add_argument("key", nargs="?")
    p.add_argument("--upstream")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--port-file")
    p.add_argument("--stats-port-file")
    p.add_argument("--delay-ms", type=float, default=0.0)
    p.add_argument("--rate-mbit", type=float, default=0.0)
    a = p.parse_args()
    if a.query:
        if not a.key:
            p.error("--query needs a KEY")
        query(a.query, a.key, a.reset)
        return
    if not a.upstream:
        p.error("--upstream is required")
    if not 0 <= a.delay_ms <= 10000 or a.rate_mbit < 0:
        p.error("--delay-ms must be 0..10000, --rate-mbit >= 0")
    up_host, _, port = a.upstream.rpartition(":")
    up_port = int(port)
    delay = a.delay_ms / 1000.0
    link_up = Link(a.rate_mbit * 1e6 / 8)
    link_down = Link(a.rate_mbit * 1e6 / 8)
    srv = await asyncio.start_server(handle, "127.0.0.1", a.port)
    ctl = await asyncio.start_server(control, "127.0.0.1", 0)
    if a.stats_port_file:
        write_port(a.stats_port_file, ctl.sockets[0].getsockname()[1])
    if a.port_file:
        write_port(a.port_file, srv.sockets[0].getsockname()[1])
    await srv.serve_forever()


st = Stats()
up_host = up_port = None
delay = 0.0
link_up = link_down = None
if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
