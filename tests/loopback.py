"""The HTTP plumbing the scripted test servers share (openai_server.py, anthropic_server.py; stdlib only).

Scripted: a threaded HTTP/1.1 server on 127.0.0.1, started and stopped in-process (or run until SIGTERM), serving
queued items in order and keeping a record of each request. Handler: the base of its request handlers, which
reads JSON bodies and writes JSON answers (whole, trickled or cut short) and chunked event streams.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit


class Headers(dict):
    """Header dict with lower-cased keys and case-insensitive lookups."""

    def __init__(self, items=()):
        super().__init__((k.lower(), v) for k, v in items)

    def __getitem__(self, key):
        return super().__getitem__(key.lower())

    def __contains__(self, key):
        return super().__contains__(key.lower())

    def get(self, key, default=None):
        return super().get(key.lower(), default)


class Handler(BaseHTTPRequestHandler):
    """A request to a Scripted server (self.server.scripted)."""

    protocol_version = "HTTP/1.1"  # keep-alive, like a real API behind requests.Session
    disable_nagle_algorithm = True  # otherwise delayed ACKs add ~40 ms to keep-alive round trips

    def log_message(self, format, *args):
        pass

    def receive(self, otherwise=lambda raw: raw or None):
        """Read the body as JSON (`otherwise(raw text)` when it is empty or not JSON) and record the request; returns
        the body, the record, and the path without its query or a trailing slash."""
        # Always drain the body so the next request on this connection parses cleanly.
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length).decode("utf-8", "replace") if length else ""
        try:
            body = json.loads(raw)
        except ValueError:
            body = otherwise(raw)
        scripted = self.server.scripted
        entry = {"method": self.command, "path": self.path, "headers": Headers(self.headers.items()), "body": body,
                 "received": scripted.clock()}
        scripted._record(entry)
        return body, entry, urlsplit(self.path).path.rstrip("/")

    def send_head(self, status, length, headers=None):
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(length))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()

    def send_json(self, status, payload, headers=None):
        """`payload` as JSON (text is sent as it is)."""
        data = (payload if isinstance(payload, str) else json.dumps(payload)).encode()
        self.send_head(status, len(data), headers)
        self.wfile.write(data)

    def send_trickle(self, status, data, interval, unread=False):
        """Headers at once, then the body one byte every `interval` seconds: each read is quick, the answer never ends.
        With `unread` (a server with slots), the rest of the generation goes on, unread, once the client hangs up."""
        self.send_head(status, len(data))
        self.wfile.flush()
        for sent, byte in enumerate(data):
            try:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(interval)
            except OSError:
                if unread:
                    self.server.scripted._sleep(interval * (len(data) - sent - 1))
                return

    def send_cut(self, status, data, at):
        """Announce the whole body, send its first `at` bytes, and hang up."""
        self.send_head(status, len(data))
        self.wfile.write(data[:at])
        self.wfile.flush()
        self.close_connection = True

    def send_events(self, events, spec, unread=False):
        """`events` (bytes) as a 200 event stream, one HTTP chunk each, paced as `spec` says: {"stall_after": N,
        "stall": S} send N events, then nothing for S seconds (default: until the server stops); {"event_delay": S}
        sleep S seconds between events; {"stream_cut_after": N} send N events and hang up. A client hanging up ends
        it, or with `unread` (a server with slots) the generation goes on all the same: then it returns True."""
        scripted = self.server.scripted
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        gone = False
        for index, event in enumerate(events):
            try:
                if index and index == spec.get("stream_cut_after"):
                    self.wfile.flush()
                    self.close_connection = True
                    return False
                if index and index == spec.get("stall_after"):
                    if not gone:
                        self.wfile.flush()
                    scripted._sleep(spec.get("stall", 3600))
                    if scripted._stopping.is_set():
                        self.close_connection = True
                        return False
                if index and spec.get("event_delay"):
                    scripted._sleep(spec["event_delay"])
                if not gone:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                    self.wfile.flush()
            except OSError:
                self.close_connection = True
                if not unread:
                    return False
                gone = True
        if gone:
            return True
        try:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            self.close_connection = True
        return False


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address, scripted):
        self.scripted = scripted
        self.connections = set()
        self.connections_lock = threading.Lock()
        super().__init__(address, scripted.handler)

    def process_request(self, request, client_address):
        with self.connections_lock:
            self.connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request):
        with self.connections_lock:
            self.connections.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request, client_address):
        # Clients hanging up (timeouts, stop()) are expected; only real bugs deserve a traceback.
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


class Scripted:
    """Serves queued items in FIFO order with a subclass's `handler`: a rule's item when the request's last message
    holds its text, the default (or `exhausted`) once the queue is empty. `requests` holds the record of each request
    (method, path, headers with lower-case names, body, and when it was received, by `clock`)."""

    handler = Handler
    clock = staticmethod(time.time)
    exhausted = None

    def __init__(self, replies=None, default=None, rules=(), host="127.0.0.1", port=0, requests_log=None):
        self.default = default
        self.rules = list(rules)
        self.host = host
        self.requests_log = requests_log  # each record appended here as a JSON line
        self._port = port
        self._queue = collections.deque(replies or ())
        self._requests = []
        self._lock = threading.Lock()
        self._seq = 0
        self._stopping = threading.Event()
        self._httpd = None
        self._thread = None

    @property
    def port(self):
        if self._httpd is None:
            raise RuntimeError("server not started")
        return self._httpd.server_address[1]

    @property
    def requests(self):
        with self._lock:
            return list(self._requests)

    @property
    def pending(self):
        with self._lock:
            return len(self._queue)

    def push(self, *items):
        with self._lock:
            self._queue.extend(items)

    def start(self):
        self._stopping.clear()
        self._httpd = _HTTPServer((self.host, self._port), self)
        # A short poll interval keeps stop() fast; the idle wakeups cost nothing measurable.
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self):
        if self._httpd is None:
            return
        self._stopping.set()  # wakes handlers sleeping on latency/stall
        self._httpd.shutdown()
        # Idle keep-alive connections would otherwise keep being served after stop().
        with self._httpd.connections_lock:
            connections = list(self._httpd.connections)
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._httpd.server_close()
        self._thread.join()
        self._port = self._httpd.server_address[1]  # a restart reuses the same port
        self._httpd = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def run(self, port_file=None):
        """Serve until SIGTERM or Ctrl-C, the port printed and (when given) written to `port_file`."""
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        self.start()
        try:
            if port_file:
                # Write then rename so a polling reader never sees a half-written port.
                tmp = f"{port_file}.tmp"
                Path(tmp).write_text(str(self.port))
                os.replace(tmp, port_file)
            print(self.port, flush=True)
            threading.Event().wait()
        except KeyboardInterrupt:
            pass
        finally:
            self.stop()

    def _sleep(self, seconds):
        if seconds > 0:
            self._stopping.wait(seconds)

    def _next(self, request=None):
        """The item for `request` and its sequence number."""
        messages = request.get("messages") if isinstance(request, dict) else None
        last = str(messages[-1].get("content")) if isinstance(messages, list) and messages and isinstance(messages[-1], dict) else ""
        with self._lock:
            self._seq += 1
            for text, item in self.rules:
                if text in last:
                    return item, self._seq
            if self._queue:
                return self._queue.popleft(), self._seq
            return (self.exhausted if self.default is None else self.default), self._seq

    def _record(self, entry):
        with self._lock:
            self._requests.append(entry)
            if self.requests_log:
                with open(self.requests_log, "a", encoding="utf-8") as f:
                    f.write(json.dumps(entry) + "\n")
