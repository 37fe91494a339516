"""Scripted OpenAI-compatible chat completions server for tests and benchmarks (stdlib only).

Use ScriptedServer in-process, or run `python tests/openai_server.py --script replies.json --port-file F`.
"""

from __future__ import annotations

import argparse
import json
import select
import socket
import threading
import time
from pathlib import Path

from loopback import Handler, Headers, Scripted

__all__ = ["CHAT_PATHS", "MODELS_PATHS", "EXHAUSTED", "ITEM_HELP", "Headers", "load_replies", "prompt_tokens", "overflow",
           "completion", "tool_calls", "ScriptedServer", "serve", "main"]

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


class _Handler(Handler):
    def do_GET(self):
        self._handle()

    def do_POST(self):
        self._handle()

    def _handle(self):
        # wall-clock times (received, answered), so a benchmark can measure the client's gap between an answer and
        # its next request
        body, entry, path = self.receive()
        scripted = self.server.scripted
        if self.command == "POST" and path in CHAT_PATHS:
            if scripted.slots:
                self._generate(scripted, body, entry)
            else:
                self._chat(scripted, body)
            entry["answered"] = time.time()
        elif self.command == "GET" and path in MODELS_PATHS:
            scripted._sleep(scripted.latency)
            self.send_json(200, {"object": "list", "data": [{"id": "scripted-model", "object": "model", "owned_by": "scripted"}]})
        else:
            self.send_json(404, _error(404, f"no route for {self.command} {path}"))

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
            self.send_json(400, overflow(style, scripted.context_window, prompt_tokens(request)))
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
            self.send_trickle(status, data.encode(), spec["trickle"], unread=bool(scripted.slots))
        elif spec.get("cut_at") is not None:
            self.send_cut(status, data.encode(), spec["cut_at"])
        else:
            self.send_json(status, data, headers)

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
        if self.send_events(lines, spec, unread=bool(scripted.slots)):  # with slots, the generation went on, unread
            self._generated(gone=True)


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


class ScriptedServer(Scripted):
    """Serves queued reply items in FIFO order; item formats are listed in ITEM_HELP."""

    handler = _Handler
    exhausted = EXHAUSTED

    def __init__(self, replies=None, latency=0.0, default=None, host="127.0.0.1", port=0, requests_log=None,
                 context_window=0, overflow_style="openai", rules=(), stream_usage=True, slots=0):
        super().__init__(replies, default=default, rules=rules, host=host, port=port, requests_log=requests_log)
        self.latency = latency
        self.slots = slots  # N: at most N requests generated at a time, as a local server (see ITEM_HELP); 0: no limit
        self._slots = _Slots(slots)
        self.stream_usage = stream_usage  # False: streams never carry usage, whatever the request asks
        self.context_window = context_window
        self.overflow_style = overflow_style
        self.overflows = 0  # requests refused for their length

    @property
    def base_url(self):
        return f"http://{self.host}:{self.port}/v1"


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
    server.run(args.port_file)


if __name__ == "__main__":
    main()
