"""OpenAI-compatible chat completions over requests: vLLM, llama.cpp, Ollama, OpenRouter and most vendors.

Transient failures (connection errors, timeouts, 408/409/425/429, 5xx, malformed JSON) are retried
with Fibonacci backoff and jitter, honouring Retry-After; requests the server refuses fail at once.
"""

from __future__ import annotations

import email.utils
import math
import os
import random
import time
from collections.abc import Sequence
from typing import Any

import requests

from miniswe import __version__
from miniswe.config import ModelConfig
from miniswe.errors import ConfigError, ModelError
from miniswe.models import Reply, Usage
from miniswe.models.gate import CallGate

RETRY_STATUSES = {408, 409, 425, 429}
MAX_RETRY_AFTER = 3600.0
FIXES = {
    400: "check model.params and the model's context length",
    401: "set {key} to a valid API key",
    403: "check that {key} may use this model",
    404: "check --base-url (it usually ends in /v1) and --model",
}


def fibonacci_delays(cap: float):
    a, b = 1.0, 1.0
    while True:
        yield min(a, cap)
        a, b = b, a + b


class _Transient(Exception):
    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


class OpenAIModel:
    def __init__(self, config: ModelConfig, gate: CallGate | None = None):
        if not config.base_url:
            raise ConfigError(
                "no model endpoint configured: pass --base-url URL (or set OPENAI_BASE_URL) and -m MODEL; "
                "or try the offline demo: miniswe demo"
            )
        if not config.name:
            raise ConfigError("no model name: pass -m MODEL (or set model.name / MINISWE_MODEL)")
        self.config = config
        self.url = config.base_url.rstrip("/") + "/chat/completions"
        self.gate = gate or CallGate()
        self.session = requests.Session()
        self.session.headers["User-Agent"] = f"miniswe/{__version__}"
        # Read proxy settings once: with trust_env, requests re-reads the environment and ~/.netrc on every call.
        self.proxies = requests.utils.get_environ_proxies(self.url)
        self.session.trust_env = False
        # ...and so the CA bundle that trust_env would have found, for endpoints behind a corporate CA
        self.session.verify = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE") or True
        self.timeouts = (config.connect_timeout or None, config.timeout or None)  # 0 = wait as long as it takes

    def describe(self) -> dict[str, Any]:
        return {"kind": "openai", "name": self.config.name, "base_url": self.config.base_url}

    def complete(self, messages: Sequence[dict[str, str]]) -> Reply:
        body = {
            "model": self.config.name,
            "messages": list(messages),  # role and content only: reasoning is never sent back
            "temperature": self.config.temperature,
            **self.config.params,
        }
        delays = fibonacci_delays(self.config.max_backoff)
        retries = 0
        while True:
            started = time.monotonic()
            try:
                with self.gate.slot():
                    data = self._post(body)
                reply = self._reply(data)
                reply.latency_s = time.monotonic() - started
                reply.retries = retries
                return reply
            except _Transient as error:
                if retries >= self.config.retries:
                    raise self._error(f"{error} (gave up after {retries + 1} attempts)", retries) from None
                delay = next(delays) * random.uniform(1.0, 1.25)
                if error.retry_after is not None:
                    self.gate.pause(error.retry_after)
                    delay = max(delay, error.retry_after)
                retries += 1
                if self.gate.on_retry:
                    self.gate.on_retry(f"{self._scrub(str(error))}; retry {retries} of {self.config.retries} in {delay:.1f}s")
                if self.gate.wait(delay):
                    raise self._error("model call cancelled", retries) from None

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        headers = {}
        key = os.environ.get(self.config.api_key_env, "") if self.config.api_key_env else ""
        if key:
            headers["Authorization"] = f"Bearer {key}"
        try:
            response = self.session.post(
                self.url, json=body, headers=headers, proxies=self.proxies, timeout=self.timeouts
            )
        except requests.exceptions.SSLError as error:
            if "certificate verify failed" not in str(error).lower():
                raise _Transient(f"TLS with {self.url} failed: {_reason(error)}") from None
            raise self._error(f"{self.url}: the server's certificate is not trusted; if the endpoint uses a "
                              "private CA, point REQUESTS_CA_BUNDLE at its certificate", 0) from None
        except requests.Timeout:
            raise _Transient(f"{self.url}: no answer within {self.config.timeout:g}s") from None
        except requests.ConnectionError as error:
            raise _Transient(f"cannot reach {self.url}: {_reason(error)}") from None
        if response.status_code in RETRY_STATUSES or response.status_code >= 500:
            raise _Transient(
                f"{self.url} answered {response.status_code}: {_server_message(response)}",
                _retry_after(response.headers.get("Retry-After")),
            )
        if response.status_code >= 400:
            fix = FIXES.get(response.status_code, "check the request settings").format(key=self.config.api_key_env)
            raise self._error(f"{self.url} answered {response.status_code}: {_server_message(response)}; {fix}", 0)
        try:
            data = response.json()
            message = data["choices"][0]["message"]
            if not isinstance(message, dict) or not isinstance(message.get("content"), (str, list, type(None))):
                raise TypeError("message")
        except (ValueError, KeyError, IndexError, TypeError):
            raise _Transient(f"{self.url} sent a malformed reply: {response.text[:120]!r}") from None
        return data

    def _reply(self, data: dict[str, Any]) -> Reply:
        choice = data["choices"][0]
        message = choice["message"]
        content = message.get("content") or ""
        if isinstance(content, list):  # content parts, as some providers send them: keep the text
            content = "".join(part.get("text") or "" for part in content if isinstance(part, dict))
        raw = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        details = raw.get("prompt_tokens_details") if isinstance(raw.get("prompt_tokens_details"), dict) else {}
        usage = Usage(
            prompt_tokens=int(_number(raw.get("prompt_tokens"))),
            completion_tokens=int(_number(raw.get("completion_tokens"))),
            cached_tokens=int(_number(details.get("cached_tokens") or raw.get("cached_tokens"))),
        )
        usage.total_tokens = int(_number(raw.get("total_tokens")) or usage.prompt_tokens + usage.completion_tokens)
        cost = _number(raw.get("cost"), None)
        usage.cost = cost if cost is not None else self._price(usage)
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        return Reply(
            content=content,
            reasoning=reasoning if isinstance(reasoning, str) else None,
            finish_reason=choice.get("finish_reason") if isinstance(choice.get("finish_reason"), str) else None,
            usage=usage,
        )

    def _price(self, usage: Usage) -> float:
        prices = self.config.prices
        if not prices:
            return 0.0
        uncached = usage.prompt_tokens - usage.cached_tokens
        cached_price = prices.get("cached", prices.get("prompt", 0.0))
        return (
            uncached * prices.get("prompt", 0.0)
            + usage.cached_tokens * cached_price
            + usage.completion_tokens * prices.get("completion", 0.0)
        ) / 1e6

    def _scrub(self, message: str) -> str:
        """Servers sometimes echo the key back in their error messages."""
        key = os.environ.get(self.config.api_key_env, "") if self.config.api_key_env else ""
        return message.replace(key, "***") if key else message

    def _error(self, message: str, retries: int) -> ModelError:
        error = ModelError(self._scrub(message))
        error.retries = retries
        return error


def _number(value: Any, default: float | None = 0.0) -> float | None:
    """A usage figure as a number; whatever else a server put there counts as unknown."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return default
    try:
        number = float(value)
    except ValueError:
        return default
    return number if math.isfinite(number) else default


def _server_message(response: requests.Response) -> str:
    try:
        error = response.json().get("error")
        text = error.get("message") if isinstance(error, dict) else error
    except (ValueError, AttributeError):
        text = None
    text = " ".join(str(text or response.text or response.reason or "").split())
    return text[:200] + ("..." if len(text) > 200 else "")


def _reason(error: requests.ConnectionError) -> str:
    text = str(error.args[0] if error.args else error)
    for hint in ("Connection refused", "Name or service not known", "timed out", "Connection reset", "Remote end closed"):
        if hint in text:
            return hint.lower()
    return text[:160]


def _retry_after(value: str | None) -> float | None:
    """Seconds to wait from a Retry-After header (seconds or an HTTP date); None when absent or unreadable."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError, OverflowError):
            return None
    # a server asking for more than an hour (or for inf) is not taken literally
    return min(max(0.0, seconds), MAX_RETRY_AFTER) if seconds == seconds else None
