"""Scripted OpenAI-compatible chat completions server for tests and benchmarks (stdlib only).

Use ScriptedServer in-process, or run `python tests/openai_server.py --script replies.json --port-file F`.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import select
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

CHAT_PATHS = ("/v1/chat/completions", "/chat/completions")
MODELS_PATHS = ("/v1/models", "/models")
EXHAUSTED = {"status": 500, "body": {"error": {"message": "script exhausted", "type": "server_error"}}}
ITEM_HELP = """\
Script: a JSON (or .yaml/.yml) list of items, served one per chat completion request.
  "text"                          normal 200 reply with that content
  {"content", "reasoning_content", "reasoning", "finish_reason", "usage", "cost", "cached_tokens"}
  {"tool_calls": [{"name", "arguments", "id"}]}  native tool calls (arguments: an object, or raw text sent as
                                  is); ids default to call_<request>_<n>, finish_reason to "tool_calls"
  {"status": 429, "retry_after": 2}   error with Retry-After; {"status": N, "body": {...}} custom body
  {"headers": {"Set-Cookie": "..."}}   more response headers (not for streamed replies)
  {"broken_json": true}  truncated 200 body    {"close": true}  drop the connection
  {"stall": S} / {"latency": S}  sleep S seconds before answering
  {"trickle": S}  send the body one byte every S seconds   {"cut_at": N}  send N bytes of the body, hang up
A request with "stream": true gets the reply as server-sent events (chunked): reasoning deltas, then content
deltas of "piece" characters (default 3), the finish reason, a last chunk with usage when the request asked
(stream_options.include_usage) or "stream_usage" says so, then [DONE]. Stream options of an item:
  {"piece": N}  {"event_delay": S}  sleep S seconds between events
  {"stall_after": N, "stall": S}  send N events, then nothing for S seconds (default: until the server stops)
  {"stream_cut_after": N}  send N events and hang up    {"no_stream": true}  answer with plain JSON anyway
A JSON object {"replies": [...], "default": item} is accepted too.
With a context window (--context-window N) a request whose messages come to more than N tokens (4 characters
a token, as in the usage reported) is refused with HTTP 400 the way --overflow-style says (openai, llamacpp,
or plain: no numbers; empty_stream: a streamed request gets a 200 event stream closed without an event, as
llama-cpp-python answers, a plain one llamacpp's 400), and no scripted item is used up. stream_usage=False:
streams never carry usage (servers that ignore stream_options).
Slots (ScriptedServer(slots=N), --slots N) make it a local server such as llama.cpp (`--parallel N`): at most N
requests are generated at a time (an item's latency, stall, trickle or stream is its generation), the others wait
their turn in arrival order, and a request whose client gave up (a timeout) still takes its slot for its whole
generation when its turn comes, as llama.cpp goes on generating an answer nobody will read. Each request's
record then has "started" and "finished" (its generation) and "abandoned" (its client was gone when the answer
was ready). Without slots (the default) every request is answered at once in its own thread.
Rules (ScriptedServer(rules=[(text, item)])) answer a request whose last message contains `text` with `item`,
whatever the script's position, also without using up an item: a reply to a request that comes at a point
the test cannot foresee (a compaction's summary request).
"""


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


def load_replies(path):
    """Read a list of items from JSON, or from YAML when the file ends in .yaml/.yml."""
    text = Path(path).read_text(encoding="utf-8")
    if str(path).endswith((".yaml", ".yml")):
        import yaml  # optional: only YAML scripts need it

        return yaml.safe_load(text) or []
    return json.loads(text)


def _text_len(content):
    if content is None:
        return 0
    return len(content) if isinstance(content, str) else len(json.dumps(content))


def _error(status, message):
    return {"error": {"message": message, "type": "scripted_error", "code": status}}


def prompt_tokens(request):
    messages = request.get("messages") if isinstance(request, dict) else None
    messages = messages if isinstance(messages, list) else []
    # tool calls and tool definitions take room in the window as a real server counts it
    chars = sum(_text_len(m.get("content")) + (len(json.dumps(m["tool_calls"])) if m.get("tool_calls") else 0)
                for m in messages if isinstance(m, dict))
    tools = request.get("tools") if isinstance(request, dict) else None
    return (chars + (len(json.dumps(tools)) if tools else 0)) // 4


def overflow(style, window, tokens):
    """The refusal of a prompt longer than the window, as each kind of server words it."""
    if style == "llamacpp":
        return {"error": {"code": 400, "message": "the request exceeds the available context size, try increasing it",
                          "type": "exceed_context_size_error", "n_prompt_tokens": tokens, "n_ctx": window}}
    if style == "plain":
        return {"error": {"message": "Input is too long for the model's context window.", "type": "invalid_request_error"}}
    return {"error": {"message": f"This model's maximum context length is {window} tokens. However, your messages "
                                 f"resulted in {tokens} tokens. Please reduce the length of the messages.",
                      "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}


def completion(item, request, seq):
    """Build a chat.completion object for a reply item (a string or a dict with "content")."""
    if isinstance(item, str):
        item = {"content": item}
    request = request if isinstance(request, dict) else {}
    calls = tool_calls(item, seq)
    content = item.get("content", None if calls else "")
    message = {"role": "assistant", "content": content}
    for key in ("reasoning_content", "reasoning"):
        if key in item:
            message[key] = item[key]
    if calls:
        message["tool_calls"] = calls
    written = _text_len(content) + sum(len(c["function"]["arguments"]) + len(c["function"]["name"]) for c in calls)
    usage = {"prompt_tokens": prompt_tokens(request), "completion_tokens": written // 4 + 1}
    if "cached_tokens" in item:
        usage["prompt_tokens_details"] = {"cached_tokens": item["cached_tokens"]}
    if "cost" in item:
        usage["cost"] = item["cost"]  # OpenRouter reports spend here
    usage.update(item.get("usage") or {})
    usage.setdefault("total_tokens", usage["prompt_tokens"] + usage["completion_tokens"])
    return {
        "id": f"chatcmpl-scripted-{seq}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request.get("model") or "scripted-model",
        "choices": [{"index": 0, "message": message, "finish_reason": item.get("finish_reason", "tool_calls" if calls else "stop")}],
        "usage": usage,
    }


def tool_calls(item, seq):
    """An item's tool calls as OpenAI sends them: each with an id, type function, name and JSON text arguments."""
    calls = []
    for index, call in enumerate(item.get("tool_calls") or ()):
        arguments = call.get("arguments", {})
        calls.append({"id": call.get("id") or f"call_{seq}_{index + 1}", "type": "function",
                      "function": {"name": call.get("name", ""),
                                   "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)}})
    return calls


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, like a real API behind requests.Session
    disable_nagle_algorithm = True  # otherwise delayed ACKs add ~40 ms to keep-alive round trips

    def log_message(self, format, *args):
        pass

    def do_GET(self):
        self._handle()

    def do_POST(self):
        self._handle()

    def _handle(self):
        # Always drain the body so the next request on this connection parses cleanly.
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length).decode("utf-8", "replace") if length else ""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw
        scripted = self.server.scripted
        # wall-clock times, so a benchmark can measure the client's gap between an answer and its next request
        entry = {"method": self.command, "path": self.path, "headers": Headers(self.headers.items()), "body": body,
                 "received": time.time()}
        scripted._record(entry)
        path = urlsplit(self.path).path.rstrip("/")
        if self.command == "POST" and path in CHAT_PATHS:
            if scripted.slots:
                self._generate(scripted, body, entry)
            else:
                self._chat(scripted, body)
            entry["answered"] = time.time()
        elif self.command == "GET" and path in MODELS_PATHS:
            scripted._sleep(scripted.latency)
            self._send(200, {"object": "list", "data": [{"id": "scripted-model", "object": "model", "owned_by": "scripted"}]})
        else:
            self._send(404, _error(404, f"no route for {self.command} {path}"))

    def _generate(self, scripted, request, entry):
        """A chat request on a server with slots: it waits for one, then keeps it for its whole generation, whether
        or not anyone is still there to read the answer."""
        if not scripted._slots.acquire(scripted._stopping):
            self.close_connection = True  # the server stops: queued requests are dropped
            return
        entry["started"] = time.time()
        try:
            self._gone = lambda gone=None: entry.__setitem__("abandoned", _hung_up(self.connection) if gone is None else gone)
            self._chat(scripted, request)
        finally:
            self._gone = None
            entry["finished"] = time.time()
            scripted._slots.release()

    def _generated(self, gone=None):
        """The answer is ready, before it is written (or `gone`: writing it failed): on a server with slots, the
        request's record says whether its client had hung up."""
        note = getattr(self, "_gone", None)
        if note is not None:
            note(gone)

    def _chat(self, scripted, request):
        if scripted.context_window and prompt_tokens(request) > scripted.context_window:
            scripted._sleep(scripted.latency)
            self._generated()
            with scripted._lock:
                scripted.overflows += 1
            if scripted.overflow_style == "empty_stream" and request.get("stream"):
                # llama-cpp-python: a streamed request over the window gets a 200 event stream with no events
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            style = "llamacpp" if scripted.overflow_style == "empty_stream" else scripted.overflow_style
            self._send(400, overflow(style, scripted.context_window, prompt_tokens(request)))
            return
        item, seq = scripted._next(request)
        spec = item if isinstance(item, dict) else {}
        streaming = isinstance(request, dict) and request.get("stream") and not spec.get("no_stream")
        if streaming and spec.get("status", 200) == 200 and not spec.get("close") and "body" not in spec:
            scripted._sleep(scripted.latency + spec.get("latency", 0))
            self._stream(scripted, item, request, seq)
            return
        scripted._sleep(scripted.latency + spec.get("latency", 0) + spec.get("stall", 0))
        self._generated()
        if spec.get("close"):
            self.close_connection = True  # drop the socket without writing a response
            return
        status = spec.get("status", 200)
        headers = dict(spec.get("headers") or {})
        if "retry_after" in spec:
            headers["Retry-After"] = str(spec["retry_after"])
        if "body" in spec:
            payload = spec["body"]
        elif status >= 400:
            payload = _error(status, f"scripted HTTP {status}")
        else:
            payload = completion(item, request, seq)
        data = payload if isinstance(payload, str) else json.dumps(payload)
        if spec.get("broken_json"):
            data = data[: len(data) // 2]
        if spec.get("trickle"):
            self._trickle(status, data.encode(), spec["trickle"])
        elif spec.get("cut_at") is not None:
            self._cut(status, data.encode(), spec["cut_at"])
        else:
            self._send(status, data, headers)

    def _stream(self, scripted, item, request, seq):
        """The reply as server-sent events, one HTTP chunk each."""
        spec = item if isinstance(item, dict) else {}
        whole = completion(item, request, seq)
        message, choice = whole["choices"][0]["message"], whole["choices"][0]
        base = {"id": whole["id"], "object": "chat.completion.chunk", "created": whole["created"], "model": whole["model"]}
        piece = max(1, int(spec.get("piece", 3)))

        def delta(**fields):
            return {**base, "choices": [{"index": 0, "delta": fields, "finish_reason": None}]}

        events = [delta(role="assistant", content="")]
        for key in ("reasoning_content", "reasoning"):
            text = message.get(key)
            if isinstance(text, str):
                events += [delta(**{key: text[i:i + piece]}) for i in range(0, len(text), piece)]
        content = message.get("content")
        if isinstance(content, str):
            events += [delta(content=content[i:i + piece]) for i in range(0, len(content), piece)]
        elif content is not None:
            events.append(delta(content=content))
        for index, call in enumerate(message.get("tool_calls") or ()):  # id and name first, then the arguments in pieces
            events.append(delta(tool_calls=[{"index": index, "id": call["id"], "type": "function",
                                             "function": {"name": call["function"]["name"], "arguments": ""}}]))
            arguments = call["function"]["arguments"]
            events += [delta(tool_calls=[{"index": index, "function": {"arguments": arguments[i:i + piece]}}])
                       for i in range(0, len(arguments), piece)]
        events.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]})
        options = request.get("stream_options") if isinstance(request.get("stream_options"), dict) else {}
        if spec.get("stream_usage", scripted.stream_usage and bool(options.get("include_usage"))):
            events.append({**base, "choices": [], "usage": whole["usage"]})
        lines = [f"data: {json.dumps(event)}\n\n".encode() for event in events] + [b"data: [DONE]\n\n"]
        self._generated()  # its first token: the rest is generated as it is sent
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        gone = False  # the client hung up: with slots, the generation goes on all the same, unread
        for index, line in enumerate(lines):
            try:
                if index and index == spec.get("stream_cut_after"):
                    self.wfile.flush()
                    self.close_connection = True
                    return
                if index and index == spec.get("stall_after"):
                    if not gone:
                        self.wfile.flush()
                    scripted._sleep(spec.get("stall", 3600))
                    if scripted._stopping.is_set():
                        self.close_connection = True
                        return
                if index and spec.get("event_delay"):
                    scripted._sleep(spec["event_delay"])
                if not gone:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                    self.wfile.flush()
            except OSError:
                self.close_connection = True
                if not scripted.slots:
                    return
                gone = True
        if gone:
            self._generated(gone=True)
            return
        try:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            self.close_connection = True

    def _trickle(self, status, data, interval):
        """Headers at once, then the body one byte every `interval` seconds: each read is quick, the answer never ends."""
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.flush()
        for sent, byte in enumerate(data):
            try:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(interval)
            except OSError:
                if self.server.scripted.slots:  # the rest of the generation goes on, unread
                    self.server.scripted._sleep(interval * (len(data) - sent - 1))
                return

    def _cut(self, status, data, at):
        """Announce the whole body, send its first `at` bytes, and hang up."""
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data[:at])
        self.wfile.flush()
        self.close_connection = True

    def _send(self, status, payload, headers=None):
        data = (payload if isinstance(payload, str) else json.dumps(payload)).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)


def _hung_up(sock):
    """Whether the client at the other end of `sock` has closed it (without sending anything more)."""
    try:
        if not select.select([sock], [], [], 0)[0]:
            return False  # nothing to read: still connected, waiting for its answer
        return sock.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


class _Slots:
    """At most `count` requests generating at a time; the others wait their turn in arrival order."""

    def __init__(self, count):
        self.count = count
        self.busy = 0
        self.issued = 0  # tickets handed out, in arrival order
        self.admitted = 0  # tickets that have had their turn
        self.changed = threading.Condition()

    def acquire(self, stopping):
        with self.changed:
            ticket = self.issued
            self.issued += 1
            while ticket != self.admitted or self.busy >= self.count:
                if stopping.is_set():
                    return False
                self.changed.wait(0.05)
            self.admitted += 1
            self.busy += 1
            self.changed.notify_all()
            return True

    def release(self):
        with self.changed:
            self.busy -= 1
            self.changed.notify_all()


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
        # Clients hanging up (timeouts, stop()) are expected; only real bugs deserve a traceback.
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


class ScriptedServer:
    """Serves queued reply items in FIFO order; item formats are listed in ITEM_HELP."""

    def __init__(self, replies=None, latency=0.0, default=None, host="127.0.0.1", port=0, requests_log=None,
                 context_window=0, overflow_style="openai", rules=(), stream_usage=True, slots=0):
        self.latency = latency
        self.slots = slots  # N: at most N requests generated at a time, as a local server (see ITEM_HELP); 0: no limit
        self._slots = _Slots(slots)
        self.stream_usage = stream_usage  # False: streams never carry usage, whatever the request asks
        self.rules = list(rules)
        self.context_window = context_window
        self.overflow_style = overflow_style
        self.overflows = 0  # requests refused for their length
        self.default = default
        self.host = host
        self.requests_log = requests_log
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
    def base_url(self):
        return f"http://{self.host}:{self.port}/v1"

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

    def _sleep(self, seconds):
        if seconds > 0:
            self._stopping.wait(seconds)

    def _next(self, request=None):
        messages = request.get("messages") if isinstance(request, dict) else None
        last = str(messages[-1].get("content")) if isinstance(messages, list) and messages and isinstance(messages[-1], dict) else ""
        with self._lock:
            self._seq += 1
            for text, item in self.rules:
                if text in last:
                    return item, self._seq
            if self._queue:
                return self._queue.popleft(), self._seq
            return (EXHAUSTED if self.default is None else self.default), self._seq

    def _record(self, entry):
        with self._lock:
            self._requests.append(entry)
            if self.requests_log:
                with open(self.requests_log, "a", encoding="utf-8") as f:
                    f.write(json.dumps(entry) + "\n")


def serve(replies=None, **kw):
    """Return a started ScriptedServer; call .stop() (or use it as a context manager) when done."""
    return ScriptedServer(replies, **kw).start()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, epilog=ITEM_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--script", help="JSON/YAML file with the list of reply items")
    parser.add_argument("--port-file", help="write the chosen port here once listening")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds added to every answer")
    parser.add_argument("--default", help="reply content once the script is exhausted (default: HTTP 500)")
    parser.add_argument("--requests-log", help="append each received request as a JSON line")
    parser.add_argument("--context-window", type=int, default=0, help="refuse prompts over this many tokens")
    parser.add_argument("--overflow-style", choices=("openai", "llamacpp", "plain", "empty_stream"), default="openai")
    parser.add_argument("--slots", type=int, default=0, help="generate at most this many requests at a time (0: no limit)")
    args = parser.parse_args(argv)

    script = load_replies(args.script) if args.script else []
    default = args.default
    if isinstance(script, dict):
        default = script.get("default", default)
        script = script.get("replies", [])
    server = ScriptedServer(script, latency=args.latency, default=default, port=args.port, requests_log=args.requests_log,
                            context_window=args.context_window, overflow_style=args.overflow_style, slots=args.slots)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    server.start()
    try:
        if args.port_file:
            # Write then rename so a polling reader never sees a half-written port.
            tmp = f"{args.port_file}.tmp"
            Path(tmp).write_text(str(server.port))
            os.replace(tmp, args.port_file)
        print(server.port, flush=True)
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


if __name__ == "__main__":
    main()
