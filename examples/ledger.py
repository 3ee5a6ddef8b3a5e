#!/usr/bin/env python3
"""A demo upstream for the README walk-through: an in-memory ledger that knows nothing about
fencing. It keeps the last body written to each path and echoes the X-Fence header it was sent,
so you can watch what fencegate forwards, and see that stale writes never arrive.

    python3 examples/ledger.py [ADDR]        (default 127.0.0.1:9000; Python's standard library only)

POST/PUT/PATCH store the body, GET returns it, DELETE removes it. Every write and delete is
printed as one line. No build step: the walk-through's first curl needs only the gateway's build.
"""

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DEFAULT_ADDR = "127.0.0.1:9000"
# Largest body the ledger keeps: everything lives in memory.
MAX_BODY = 64 * 1024
# Most paths the ledger remembers, so that a runaway client cannot exhaust memory.
MAX_ENTRIES = 10_000

entries = {}
entries_lock = threading.Lock()


class Ledger(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def reply(self, status, body, content_type="text/plain", extra=()):
        data = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(data)))
        for name, value in extra:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def path_only(self):
        return self.path.split("?", 1)[0]

    def fence(self):
        return self.headers.get("x-fence")

    def write(self):
        length = int(self.headers.get("content-length") or 0)
        if length > MAX_BODY:
            self.close_connection = True
            return self.reply(413, "body too large\n")
        body = self.rfile.read(length)
        path = self.path_only()
        with entries_lock:
            if len(entries) >= MAX_ENTRIES and path not in entries:
                return self.reply(507, "ledger is full\n")
            entries[path] = body
        stored = body.decode("utf-8", "replace")
        line = stored.replace("\r", " ").replace("\n", " ")
        print(f"write {path} fence={self.fence() or '-'} body={line}", flush=True)
        answer = {"path": path, "stored": stored, "fence": self.fence()}
        self.reply(200, json.dumps(answer), "application/json")

    do_POST = do_PUT = do_PATCH = write

    def do_GET(self):
        with entries_lock:
            body = entries.get(self.path_only())
        if body is None:
            return self.reply(404, "no such entry\n")
        self.reply(200, body)

    def do_DELETE(self):
        path = self.path_only()
        with entries_lock:
            removed = entries.pop(path, None)
        print(f"delete {path} fence={self.fence() or '-'}", flush=True)
        if removed is None:
            return self.reply(404, "no such entry\n")
        self.reply(204, b"")

    def do_other(self):
        self.reply(405, "method not allowed\n", extra=[("allow", "GET, POST, PUT, PATCH, DELETE")])

    do_HEAD = do_OPTIONS = do_TRACE = do_other

    def log_message(self, *args):
        pass  # one line per write or delete is printed above; nothing per request


def main():
    addr = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_ADDR
    host, _, port = addr.rpartition(":")
    try:
        server = ThreadingHTTPServer((host.strip("[]"), int(port)), Ledger)
    except OSError as e:
        print(f"ledger: cannot listen on {addr}: {e}", file=sys.stderr)
        sys.exit(1)
    print(f"ledger listening on http://{addr}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
