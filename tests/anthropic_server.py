"""A scripted server speaking Anthropic's Messages API on 127.0.0.1, for tests (stdlib only).

POST /v1/messages answers one queued item per request, as JSON or, when the request asks for `stream`, as
server-sent events (message_start, content_block_start/delta/stop, message_delta, message_stop). Items:
  "text"                                  a reply with that text
  {"content", "reasoning", "tool_calls": [{"name", "arguments", "id"}], "stop_reason", "usage": {...}}
                                          reasoning comes as a thinking block; tool calls as tool_use blocks
  {"status": 429, "retry_after": 2}       an error with Retry-After; {"status": N, "message": "..."} says that
  {"status": N, "body": {...}}            a custom error body     {"stall": S}  sleep S seconds before answering
  {"stall_after": N, "stall": S}          (streamed) send N events, then nothing for S seconds

Prompt caching is played as Anthropic plays it: each content block (or tool result, or system block) marked
with `cache_control` is a breakpoint; the prompt up to a breakpoint seen before is read from the cache
(`cache_read_input_tokens`), the rest up to the last breakpoint is written to it (`cache_creation_input_tokens`),
and `input_tokens` counts what is left (4 characters a token). A request without a marked block reads and
writes nothing.
"""

from __future__ import annotations

import collections
import copy
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
               413: "request_too_large", 429: "rate_limit_error", 500: "api_error", 529: "overloaded_error"}


def tokens(value) -> int:
    return len(json.dumps(value, sort_keys=True)) // 4


def _unmarked(value):
    """`value` without its cache_control marks: the text a cache entry is keyed on."""
    if isinstance(value, dict):
        return {k: _unmarked(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_unmarked(v) for v in value]
    return value


def breakpoints(request) -> list[str]:
    """The prompt up to each cache_control mark, in order: tools, then system, then messages (as Anthropic orders
    the prefix), each rendered as the text a cache would be keyed on."""
    prefix: list = []
    found: list[str] = []
    tools = request.get("tools") or []
    for tool in tools:
        prefix.append(_unmarked(tool))
        if isinstance(tool, dict) and tool.get("cache_control"):
            found.append(json.dumps(prefix, sort_keys=True))
    system = request.get("system")
    for block in system if isinstance(system, list) else [system] if system else []:
        prefix.append(_unmarked(block))
        if isinstance(block, dict) and block.get("cache_control"):
            found.append(json.dumps(prefix, sort_keys=True))
    for message in request.get("messages") or []:
        content = message.get("content")
        if isinstance(content, str):
            prefix.append({"role": message.get("role"), "text": content})
            continue
        for block in content or []:
            prefix.append({"role": message.get("role"), "block": _unmarked(block)})
            if isinstance(block, dict) and block.get("cache_control"):
                found.append(json.dumps(prefix, sort_keys=True))
    return found


def marked_blocks(request) -> list[tuple[int, dict]]:
    """(message index, block) of every content block of the messages marked with cache_control."""
    return [(index, block) for index, message in enumerate(request.get("messages") or [])
            if isinstance(message.get("content"), list)
            for block in message["content"] if isinstance(block, dict) and block.get("cache_control")]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, format, *args):
        pass

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length).decode("utf-8", "replace") if length else ""
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = {}
        server = self.server.scripted
        server._record({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body})
        if urlsplit(self.path).path.rstrip("/") != "/v1/messages":
            self._send(404, {"type": "error", "error": {"type": "not_found_error", "message": f"no route {self.path}"}})
            return
        item = server._next()
        spec = item if isinstance(item, dict) else {"content": item}
        if not spec.get("stall_after"):
            server._sleep(spec.get("stall", 0))
        status = spec.get("status", 200)
        if status != 200:
            headers = {"retry-after": str(spec["retry_after"])} if "retry_after" in spec else {}
            payload = spec.get("body") or {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"),
                                                                        "message": spec.get("message", f"scripted HTTP {status}")}}
            self._send(status, payload, headers)
            return
        message = server._message(spec, body)
        if body.get("stream"):
            self._stream(server, spec, message)
        else:
            self._send(200, message)

    def _stream(self, server, spec, message):
        start = copy.deepcopy(message)
        start.update(content=[], stop_reason=None, stop_sequence=None)
        start["usage"] = {**message["usage"], "output_tokens": 1}
        events = [("message_start", {"type": "message_start", "message": start}), ("ping", {"type": "ping"})]
        for index, block in enumerate(message["content"]):
            if block["type"] == "text":
                events.append(("content_block_start", {"type": "content_block_start", "index": index,
                                                       "content_block": {"type": "text", "text": ""}}))
                text = block["text"]
                events += [("content_block_delta", {"type": "content_block_delta", "index": index,
                                                    "delta": {"type": "text_delta", "text": text[i:i + 5]}})
                           for i in range(0, len(text), 5)]
            elif block["type"] == "thinking":
                events.append(("content_block_start", {"type": "content_block_start", "index": index,
                                                       "content_block": {"type": "thinking", "thinking": "", "signature": ""}}))
                text = block["thinking"]
                events += [("content_block_delta", {"type": "content_block_delta", "index": index,
                                                    "delta": {"type": "thinking_delta", "thinking": text[i:i + 5]}})
                           for i in range(0, len(text), 5)]
                events.append(("content_block_delta", {"type": "content_block_delta", "index": index,
                                                       "delta": {"type": "signature_delta", "signature": block["signature"]}}))
            else:  # tool_use: its input as JSON text in pieces
                events.append(("content_block_start", {"type": "content_block_start", "index": index, "content_block":
                                                       {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}}))
                text = json.dumps(block["input"])
                events += [("content_block_delta", {"type": "content_block_delta", "index": index,
                                                    "delta": {"type": "input_json_delta", "partial_json": text[i:i + 7]}})
                           for i in range(0, len(text), 7)]
            events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
        events.append(("message_delta", {"type": "message_delta", "delta": {"stop_reason": message["stop_reason"],
                                                                           "stop_sequence": None},
                                         "usage": {"output_tokens": message["usage"]["output_tokens"]}}))
        events.append(("message_stop", {"type": "message_stop"}))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for index, (name, data) in enumerate(events):
                if index and index == spec.get("stall_after"):
                    self.wfile.flush()
                    server._sleep(spec.get("stall", 3600))
                    if server._stopping.is_set():
                        self.close_connection = True
                        return
                line = f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            self.close_connection = True

    def _send(self, status, payload, headers=None):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address, scripted):
        self.scripted = scripted
        self.connections = set()
        self.connections_lock = threading.Lock()
        super().__init__(address, _Handler)

    def process_request(self, request, client_address):
        with self.connections_lock:
            self.connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request):
        with self.connections_lock:
            self.connections.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request, client_address):
        import sys

        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


class AnthropicServer:
    """Serves queued items in order (see the module's docstring); `requests` holds what it was sent
(path, headers with lower-case names, body, and when it was received, time.monotonic)."""

    def __init__(self, replies=(), *, default=None, host="127.0.0.1"):
        self.default = default
        self.host = host
        self._queue = collections.deque(replies)
        self._requests: list[dict] = []
        self.usages: list[dict] = []  # the usage of each reply sent, in order
        self._cache: set[str] = set()
        self._lock = threading.Lock()
        self._seq = 0
        self._stopping = threading.Event()
        self._httpd = None
        self._thread = None

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def api_base(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def requests(self) -> list[dict]:
        with self._lock:
            return list(self._requests)

    def push(self, *items):
        with self._lock:
            self._queue.extend(items)

    def start(self) -> AnthropicServer:
        self._stopping.clear()
        self._httpd = _HTTPServer((self.host, 0), self)
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is None:
            return
        self._stopping.set()
        self._httpd.shutdown()
        with self._httpd.connections_lock:
            connections = list(self._httpd.connections)
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._httpd.server_close()
        self._thread.join()
        self._httpd = None

    def __enter__(self) -> AnthropicServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _sleep(self, seconds: float) -> None:
        if seconds > 0:
            self._stopping.wait(seconds)

    def _record(self, entry: dict) -> None:
        entry["received"] = time.monotonic()
        with self._lock:
            self._requests.append(entry)

    def _next(self):
        with self._lock:
            self._seq += 1
            if self._queue:
                return self._queue.popleft()
        return self.default if self.default is not None else {"status": 500, "message": "script exhausted"}

    def _message(self, spec: dict, request: dict) -> dict:
        """The Messages API reply to `request` for a scripted item, its usage as a cache would have it."""
        with self._lock:
            seq = self._seq
            marks = breakpoints(request)
            read = max((len(mark) // 4 for mark in marks if mark in self._cache), default=0)
            written = max(len(marks[-1]) // 4 - read, 0) if marks and marks[-1] not in self._cache else 0
            self._cache.update(marks)
        content = []
        if spec.get("reasoning"):
            content.append({"type": "thinking", "thinking": spec["reasoning"], "signature": f"sig-{seq}"})
        if spec.get("content"):
            content.append({"type": "text", "text": spec["content"]})
        for index, call in enumerate(spec.get("tool_calls") or ()):
            arguments = call.get("arguments", {})
            content.append({"type": "tool_use", "id": call.get("id") or f"toolu_{seq}_{index + 1}",
                            "name": call.get("name", ""),
                            "input": json.loads(arguments) if isinstance(arguments, str) else arguments})
        whole = tokens({"system": request.get("system"), "messages": request.get("messages"), "tools": request.get("tools")})
        usage = {"input_tokens": max(whole - read - written, 1), "output_tokens": tokens(content) + 1,
                 "cache_creation_input_tokens": written, "cache_read_input_tokens": read}
        usage.update(spec.get("usage") or {})
        with self._lock:
            self.usages.append(dict(usage))
        return {"id": f"msg_scripted_{seq}", "type": "message", "role": "assistant",
                "model": request.get("model") or "claude-scripted", "content": content,
                "stop_reason": spec.get("stop_reason", "tool_use" if spec.get("tool_calls") else "end_turn"),
                "stop_sequence": None, "usage": usage}
