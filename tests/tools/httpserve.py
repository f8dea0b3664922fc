# SPDX-License-Identifier: MIT
"""The test servers' HTTP loop (faultproxy.py, tokenserver.py).

serve(handler, port, port_file): a ThreadingHTTPServer on 127.0.0.1:port
(0: a free port) whose port goes to port_file once it listens, renamed
into place so that a reader sees it whole; serves until interrupted.
"""
import os
from http.server import ThreadingHTTPServer


def serve(handler, port, port_file):
    srv = ThreadingHTTPServer(("127.0.0.1", port), handler)
    srv.daemon_threads = True
    if port_file:
        tmp = port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write("%d\n" % srv.server_address[1])
        os.rename(tmp, port_file)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
