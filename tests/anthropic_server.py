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

import copy
import json
import time

from loopback import Handler, Scripted

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


class _Handler(Handler):
    def do_POST(self):
        body, _, path = self.receive(otherwise=lambda raw: {})
        server = self.server.scripted
        if path != "/v1/messages":
            self.send_json(404, {"type": "error", "error": {"type": "not_found_error", "message": f"no route {self.path}"}})
            return
        item, seq = server._next(body)
        spec = item if isinstance(item, dict) else {"content": item}
        if not spec.get("stall_after"):
            server._sleep(spec.get("stall", 0))
        status = spec.get("status", 200)
        if status != 200:
            headers = {"retry-after": str(spec["retry_after"])} if "retry_after" in spec else {}
            payload = spec.get("body") or {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"),
                                                                        "message": spec.get("message", f"scripted HTTP {status}")}}
            self.send_json(status, payload, headers)
            return
        message = server._message(spec, body, seq)
        if body.get("stream"):
            self._stream(spec, message)
        else:
            self.send_json(200, message)

    def _stream(self, spec, message):
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
        self.send_events([f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events], spec)


class AnthropicServer(Scripted):
    """Serves queued items in order (see the module's docstring); `requests` holds what it was sent
(method, path, headers with lower-case names, body, and when it was received, time.monotonic)."""

    handler = _Handler
    clock = staticmethod(time.monotonic)
    exhausted = {"status": 500, "message": "script exhausted"}

    def __init__(self, replies=(), *, default=None, host="127.0.0.1"):
        super().__init__(replies, default=default, host=host)
        self.usages: list[dict] = []  # the usage of each reply sent, in order
        self._cache: set[str] = set()

    @property
    def api_base(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _message(self, spec: dict, request: dict, seq: int) -> dict:
        """The Messages API reply to `request` for a scripted item, its usage as a cache would have it."""
        with self._lock:
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
