"""What the openai and litellm kinds share: retries (and the one plain retry of an empty stream), a call's
deadline, refusals for length, the reply record with its usage (estimated when the endpoint reports none), the
HTTP statuses' fixes, and the masking of the model's credentials in every message."""

from __future__ import annotations

import json
import os
import re
import time
from typing import Any

from miniswe import debuglog
from miniswe.models import Reply, ToolCall
from miniswe.models.pricing import price
from miniswe.models.retry import call_with_retries
from miniswe.redaction import secret_env
from miniswe.usage import Usage, call_usage, estimated_usage

RETRY_STATUSES = {408, 409, 425, 429}
FIXES = {
    400: "check model.params and the model's context length",
    401: "set {key} to a valid API key",
    403: "check that {key} may use this model",
}

# How servers say a prompt is longer than the context window: OpenAI and vLLM ("maximum context length is N
# tokens ... resulted in M tokens"), llama.cpp (exceed_context_size_error with n_ctx and n_prompt_tokens, and
# "request (M tokens) exceeds the available context size (N tokens)" or "input (M tokens) is larger than the
# max context size (N tokens)" in words), and proxies in front of other APIs and Anthropic itself ("prompt is
# too long: M tokens > N maximum").
OVERFLOW = re.compile(r"context[ _](?:length|window|size)|maximum context|prompt is too long|too many (?:input )?tokens", re.I)
WINDOW = re.compile(r"(?:maximum context length is|context (?:length|window|size) (?:is|of)) (\d+)|> (\d+) maximum"
                    r"|context size \((\d+) tokens\)", re.I)
PROMPT = re.compile(r"(?:resulted in|requested|prompt is too long:) (\d+) tokens|(?:request|input) \((\d+) tokens\)", re.I)


class EmptyStream(Exception):
    """A 200 event stream that closed without one event: how llama.cpp's servers answer a prompt over their
    window. Not a passing fault: the call is asked once more without streaming, to learn what the server says."""


def fix(status: int, key: str, not_found: str) -> str:
    """The likely fix of a refused request; `not_found` is the kind's own for 404."""
    return not_found if status == 404 else FIXES.get(status, "check the request settings").format(key=key)


def overflow(text: str, n_ctx: Any = None, n_prompt: Any = None, *, known: bool = False) -> tuple[int | None, int | None] | None:
    """(window, prompt tokens) as far as a refusal says them (`n_ctx`, `n_prompt`: figures sent apart from its
    words, as llama.cpp does), when it refuses a prompt for its length (or is `known` to); else None."""
    if not known and not OVERFLOW.search(text):
        return None

    def number(value: Any) -> int | None:
        return int(value) if isinstance(value, (int, str)) and str(value).isdigit() and int(value) > 0 else None

    def said(pattern: re.Pattern[str]) -> int | None:
        match = pattern.search(text)
        return number(next(filter(None, match.groups()), None)) if match else None

    return number(n_ctx) or said(WINDOW), number(n_prompt) or said(PROMPT)


def call_deadline(timeout: float, run_deadline: float | None) -> tuple[float | None, bool]:
    """When a call starting now must end, and whether that is its own timeout (else the run's deadline)."""
    deadline = time.monotonic() + timeout if timeout else None
    own = deadline is not None and (run_deadline is None or deadline < run_deadline)
    return (deadline if own or run_deadline is None else run_deadline), own


def scrub(message: str, names: list[str]) -> str:
    """`message` with the values of the variables `names` masked whatever their length (a key too short to mask
    in free text is still known to stand in a server's message), every secret-looking variable's value too (the
    providers' SDKs read credentials miniswe never named), then the run's secrets, as every printed text is."""
    from miniswe.output import SECRETS
    from miniswe.redaction import MASK, MIN_SECRET_LEN, secret_name

    for name, value in os.environ.items():
        if value and (name in names or len(value) >= MIN_SECRET_LEN and secret_name(name)) and value in message:
            message = message.replace(value, MASK)
    return SECRETS.scrub(message)


def text_of(content: Any) -> str:
    """A message's text: content parts, as some providers send them, joined."""
    if isinstance(content, list):
        return "".join(part["text"] for part in content if isinstance(part, dict) and isinstance(part.get("text"), str))
    return content if isinstance(content, str) else ""


class ChatModel:
    """The call of a chat model as both kinds make it: `_fetch` (the kind's own) sends one attempt and returns
    the body as an OpenAI chat completion (and what `_usage` needs besides); the rest is here."""

    config: Any
    where: str

    def _ask(self, body: dict[str, Any], deadline: float | None) -> Reply:
        def retried(body: dict[str, Any]) -> Reply:
            return call_with_retries(lambda: self._attempt(body, deadline), settings=self.config, gate=self.gate,
                                     stop=self.stop, deadline=deadline, on_retry=self.on_retry, scrub=self._scrub)

        try:
            return retried(body)
        except EmptyStream:
            self.on_retry(f"{self.where} closed the stream without a word; asking once without streaming")
            return retried({key: value for key, value in body.items() if key not in ("stream", "stream_options")})

    def _attempt(self, body: dict[str, Any], run_deadline: float | None) -> Reply:
        started = time.monotonic()
        deadline, own = call_deadline(self.config.timeout, run_deadline)
        call = debuglog.log("request", self.where, body)
        try:
            data, extra = self._fetch(body, deadline, own)
        except Exception as error:
            debuglog.log("failure", self.where, f"{type(error).__name__}: {self._scrub(str(error))}", call=call)
            raise
        debuglog.log("response", self.where, data, call=call, note=f"after {time.monotonic() - started:.2f}s")
        reply = self._reply(data, body, extra)
        reply.latency_s = time.monotonic() - started
        return reply

    def _reply(self, data: dict[str, Any], body: dict[str, Any], extra: Any) -> Reply:
        choice = data["choices"][0]
        message = choice["message"]
        content = text_of(message.get("content"))
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        reasoning = reasoning if isinstance(reasoning, str) else None
        calls = message.get("tool_calls") if isinstance(message.get("tool_calls"), list) else []
        raw = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        details = raw.get("prompt_tokens_details") if isinstance(raw.get("prompt_tokens_details"), dict) else {}
        cached = details.get("cached_tokens") or raw.get("cached_tokens") or raw.get("cache_read_input_tokens")
        warnings: list[str] = []
        cost, pricing = self._pricing(raw, extra, warnings)
        usage, refused = call_usage(raw.get("prompt_tokens"), raw.get("completion_tokens"), raw.get("total_tokens"),
                                    cached, cost, price=pricing)
        if refused:
            warnings.append(f"the endpoint reported unusable usage figures, counted as 0: {', '.join(refused)}")
        if not any(raw.get(key) for key in ("prompt_tokens", "completion_tokens", "total_tokens")):
            usage = self._estimate(body, len(content) + len(reasoning or "") + (len(json.dumps(calls)) if calls else 0))
        return Reply(
            content=content,
            reasoning=reasoning,
            finish_reason=choice.get("finish_reason") if isinstance(choice.get("finish_reason"), str) else None,
            usage=usage,
            warnings=warnings,
            tool_calls=[ToolCall.from_wire(call, index) for index, call in enumerate(calls)],
        )

    def _pricing(self, raw: dict[str, Any], extra: Any, warnings: list[str]) -> tuple[Any, Any]:
        """The cost the endpoint reported, and how to price a call without one."""
        return raw.get("cost"), (lambda usage: price(usage, self.config.prices))

    def _estimate(self, body: dict[str, Any], written: int) -> Usage:
        """A call whose endpoint counted nothing (no usage, or all zeros: a stream that ignored stream_options)
        counted from its characters, so token limits still hold, and priced like reported tokens."""
        sent = json.dumps(body.get("messages", []), ensure_ascii=False) + json.dumps(body.get("tools") or [])
        usage = estimated_usage(len(sent), written)
        usage.cost = price(usage, self.config.prices)
        return usage

    def _scrub(self, message: str) -> str:
        return scrub(message, secret_env(self.config))
