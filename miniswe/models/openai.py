"""OpenAI-compatible chat completions over requests: vLLM, llama.cpp, Ollama, OpenRouter and most vendors.

Transient failures (connection errors, cut or stalled answers, 408/409/425/429, 5xx, malformed JSON) are
retried (models/retry.py); requests the server refuses fail at once with the likely fix. A call is bounded
as a whole, not per read: at its deadline, or when the run is stopped at once, its socket is shut down.

With `stream`, the reply is read as server-sent events and each piece of reasoning and text is handed to
`on_delta` as it arrives; the pieces (tool calls' too) are assembled into the same reply a non-streamed call gives. A stream
that sends nothing for `stream_idle_timeout` seconds is cut and retried like any failed call.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

from miniswe import __version__
from miniswe.config import Mapping, ModelConfig, Number, Seconds, Text
from miniswe.errors import Cancelled, ConfigError, ContextLengthError, DeadlineReached, ModelError
from miniswe.models import Reply
from miniswe.models.common import RETRY_STATUSES, ChatModel, EmptyStream, fix, overflow
from miniswe.models.deadline import Watchdog
from miniswe.models.gate import CallGate
from miniswe.models.pricing import PriceSettings
from miniswe.models.retry import RetrySettings, Transient, parse_retry_after
from miniswe.signals import Stop

NOT_FOUND = "check --base-url (it usually ends in /v1) and --model"

class OpenAIConfig(PriceSettings, RetrySettings, ModelConfig):
    kind: str = "openai"
    base_url: Text = ""  # e.g. http://127.0.0.1:8000/v1; also --base-url / OPENAI_BASE_URL
    api_key_env: Text = "OPENAI_API_KEY"  # name of the variable holding the key; no Authorization header when unset
    temperature: Number = 0.0  # sampling temperature
    params: Mapping = {}  # extra request body fields, e.g. {max_tokens: 4096, top_p: 0.95}
    timeout: Seconds = 600.0  # seconds one call may take as a whole, answer included; 0 = no limit
    connect_timeout: Seconds = 10.0  # seconds to connect; 0 = no limit
    stream: bool = False  # read replies as server-sent events as they are generated (chat shows them live)
    stream_idle_timeout: Seconds = 120.0  # seconds a stream may send nothing (the wait for its first token too) before it is cut and retried; 0 = no limit

    def secret_env(self) -> list[str]:
        """The variables holding the model's credentials (redaction.secret_env)."""
        return [self.api_key_env]


class OpenAIModel(ChatModel):
    config_class = OpenAIConfig

    def __init__(self, config: OpenAIConfig, *, gate: CallGate | None = None, stop: Stop | None = None,
                 on_retry: Callable[[str], None] | None = None, on_delta: Callable[[str, str], None] | None = None,
                 **_: Any):
        if not config.base_url:
            raise ConfigError(
                "no model endpoint configured: pass --base-url URL (or set OPENAI_BASE_URL) and -m MODEL; "
                "or try the offline demo: miniswe demo"
            )
        if not config.name:
            raise ConfigError("no model name: pass -m MODEL (or set model.name / MINISWE_MODEL)")
        if not config.base_url.startswith(("http://", "https://")):
            raise ConfigError(f"model.base_url: {config.base_url!r} is not an http(s) URL; pass e.g. --base-url http://127.0.0.1:8000/v1")
        self.config = config
        self.url = self.where = config.base_url.rstrip("/") + "/chat/completions"
        self.gate = gate or CallGate()
        self.stop = stop or Stop()
        self.on_retry = on_retry or (lambda message: None)
        self.on_delta = on_delta or (lambda kind, text: None)  # kind: "reasoning" or "content"
        # made at the first call, not here: importing requests then overlaps the environment's start
        self._session: Any = None
        self._template: Any = None  # the request every call copies (see _requests)
        self._proxies: dict[str, str] = {}
        self._connection: Any = None  # the connection of the request in flight, so it can be cut off
        self._sent: tuple[list[dict[str, Any]], list[bytes]] = ([], [])  # the last call's messages, encoded (_encode)
        self._cut_reason: str | None = None
        self._watchdog = Watchdog(self._cut)

    def _requests(self) -> Any:
        """The requests Session every call of this model goes through."""
        if self._session is None:
            import requests

            session = _session(self._track)
            session.headers["User-Agent"] = f"miniswe/{__version__}"
            # Read proxy settings once: with trust_env, requests re-reads the environment and ~/.netrc on every call.
            self._proxies = requests.utils.get_environ_proxies(self.url)
            session.trust_env = False
            # ...and so the CA bundle that trust_env would have found, for endpoints behind a corporate CA
            session.verify = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE") or True
            # What Session.request would prepare anew for every call (URL checks, merged headers, hooks): once
            try:
                self._template = session.prepare_request(
                    requests.Request("POST", self.url, headers={"Content-Type": "application/json"}))
            except _unusable_url() as error:
                raise self._unusable(error) from None
            self._session = session
        return self._session

    def _post(self, body: dict[str, Any], headers: dict[str, str], **send: Any) -> Any:
        """POST `body` as JSON: the prepared template with this call's headers, body and the session's cookies."""
        try:
            data = self._encode(body)
        except (TypeError, ValueError) as error:
            raise ModelError(f"cannot send the request as JSON ({error}); check model.params and model.temperature "
                             "for values JSON has no form for (NaN, infinity, dates)") from None
        session = self._requests()
        request = self._template.copy()
        request.headers.update(headers)
        request.prepare_body(data, None)
        if session.cookies:  # a gateway's (a sticky load balancer's) cookies go back as requests would send them
            request.prepare_cookies(session.cookies)
        return session.send(request, verify=session.verify, proxies=self._proxies, **send)

    def _encode(self, body: dict[str, Any]) -> bytes:
        """`body` as JSON, each message of the conversation encoded once: it all goes with every call, and encoding
        it anew was a call's largest cost of its own (0.5 ms at 300 steps). The last call's messages are kept (as
        copies) with their encodings; a call that begins with them, compared by value in C, encodes only the rest."""
        messages = body["messages"]
        sent, parts = self._sent
        if messages[:len(sent)] != sent:  # compacted, or another conversation: all of it again
            sent, parts = [], []
        new = messages[len(sent):]
        parts = parts + [json.dumps(message, allow_nan=False).encode() for message in new]
        self._sent = (sent + [dict(message) for message in new], parts)
        rest = json.dumps({key: value for key, value in body.items() if key != "messages"}, allow_nan=False).encode()
        # one join, one copy of the conversation: the brackets and the other keys go on its first and last pieces
        pieces = [b'{"messages": [' + (parts[0] if parts else b""), *parts[1:]]
        pieces[-1] += b"]" + (b", " + rest[1:] if len(rest) > 2 else b"}")
        return b", ".join(pieces)

    def _unusable(self, error: Exception) -> ModelError:
        return ModelError(self._scrub(f"{self.url}: not a usable URL ({error}); check --base-url"))

    def describe(self) -> dict[str, Any]:
        return {"kind": "openai", "name": self.config.name, "base_url": self.config.base_url}

    def for_child(self, *, stop: Stop, on_retry: Callable[[str], None] | None = None, **_: Any) -> OpenAIModel:
        """The model a sub-agent calls: the same endpoint and call gate, cancelled by the sub-agent's own stop."""
        return OpenAIModel(self.config, gate=self.gate, stop=stop, on_retry=on_retry)

    def complete(self, messages: Sequence[dict[str, Any]], *, deadline: float | None = None,
                 tools: Sequence[dict[str, Any]] | None = None) -> Reply:
        body = {
            "model": self.config.name,
            "messages": list(messages),  # role and content (and tool calls): reasoning is never sent back
            "temperature": self.config.temperature,
        }
        if tools:
            body["tools"] = list(tools)
        if self.config.stream:  # usage comes in a last chunk only when asked for (OpenAI, vLLM)
            body.update(stream=True, stream_options={"include_usage": True})
        body.update(self.config.params)
        self._requests()  # made (requests imported) before the call's own time starts
        return self._ask(body, deadline)

    def _fetch(self, body: dict[str, Any], deadline: float | None, own_deadline: bool) -> tuple[dict[str, Any], None]:
        import requests

        headers = {}
        key = os.environ.get(self.config.api_key_env, "").strip() if self.config.api_key_env else ""
        if key:
            if not key.isprintable():
                raise ModelError(f"${self.config.api_key_env} holds a line break or another control character; "
                                 "set it to the key alone")
            headers["Authorization"] = f"Bearer {key}"
        left = None if deadline is None else max(deadline - time.monotonic(), 0.001)
        stream = bool(body.get("stream"))
        idle = self.config.stream_idle_timeout if stream else 0
        timeouts = (_least(self.config.connect_timeout or None, left), _least(idle or None, left))
        self._cut_reason = None
        try:
            with self.stop.cancelling(self._cancel):
                if deadline is not None:
                    self._watchdog.arm(deadline)
                response = self._post(body, headers, timeout=timeouts, stream=stream)
                if stream:
                    try:
                        if response.status_code == 200 and "text/event-stream" in response.headers.get("Content-Type", ""):
                            return self._read_stream(response), None
                        _ = response.content  # not a stream after all (an error, or a server that ignores `stream`)
                    finally:
                        response.close()
        except requests.exceptions.SSLError as error:
            if "certificate verify failed" not in str(error).lower():
                raise Transient(f"TLS with {self.url} failed: {_reason(error)}") from None
            raise ModelError(self._scrub(f"{self.url}: the server's certificate is not trusted; if the endpoint uses a "
                                         "private CA, point REQUESTS_CA_BUNDLE at its certificate")) from None
        except _unusable_url() as error:
            raise self._unusable(error) from None
        except (requests.RequestException, Transient) as error:
            if self._cut_reason == "stop":
                raise Cancelled("model call cancelled") from None
            timed_out = isinstance(error, requests.Timeout)
            past_deadline = deadline is not None and time.monotonic() >= deadline - 0.01
            if isinstance(error, requests.ConnectTimeout) and not past_deadline and self._cut_reason != "deadline":
                # the server never had the request: nothing of it to wait out before the retry
                raise Transient(f"cannot reach {self.url}: no connection within {self.config.connect_timeout:g}s") from None
            if self._cut_reason == "deadline" or (timed_out and (not stream or past_deadline
                                                                   or isinstance(error, requests.ConnectTimeout))):
                if not own_deadline and deadline is not None:
                    raise DeadlineReached("time_limit reached during a model call") from None
                raise Transient(f"{self.url}: no complete answer within {self.config.timeout:g}s",
                                busy_for=self.config.timeout) from None
            if isinstance(error, Transient):
                raise
            if timed_out:
                raise Transient(f"{self.url}: the stream sent nothing for {idle:g}s", busy_for=idle) from None
            if isinstance(error, requests.ConnectionError):
                raise Transient(f"cannot reach {self.url}: {_reason(error)}") from None
            raise Transient(f"{self.url}: the answer was cut off ({type(error).__name__})") from None
        finally:
            self._watchdog.disarm()
            self._connection = None
        if response.status_code in RETRY_STATUSES or response.status_code >= 500:
            raise Transient(
                f"{self.url} answered {response.status_code}: {_server_message(response)}",
                parse_retry_after(response.headers.get("Retry-After")),
            )
        if response.status_code in (400, 413) and (found := _context_overflow(response)):
            raise ContextLengthError(self._scrub(f"{self.url} answered {response.status_code}: {_server_message(response)}"),
                                     window=found[0], prompt_tokens=found[1])
        if response.status_code >= 400:
            refused = fix(response.status_code, self.config.api_key_env, NOT_FOUND)
            raise ModelError(self._scrub(f"{self.url} answered {response.status_code}: {_server_message(response)}; {refused}"))
        try:
            data = response.json()
            message = data["choices"][0]["message"]
            if not isinstance(message, dict) or not isinstance(message.get("content"), (str, list, type(None))):
                raise TypeError("message")
        except (ValueError, KeyError, IndexError, TypeError):
            raise Transient(f"{self.url} sent a malformed reply: {response.text[:120]!r}") from None
        return data, None

    def _read_stream(self, response: Any) -> dict[str, Any]:
        """The events of a streamed reply, each delta handed to `on_delta` as it arrives, assembled into the
        body a non-streamed call would have had (content, reasoning, finish_reason, and usage if sent)."""
        content: list[str] = []
        reasoning: list[str] = []
        calls: dict[int, dict[str, Any]] = {}  # tool calls by their index, assembled from their pieces
        state: dict[str, Any] = {"finish": None, "usage": None, "done": False, "events": 0}
        pending: list[str] = []  # the data lines of an event not complete yet

        def event(payload: str) -> None:
            state["events"] += 1
            if payload.strip() == "[DONE]":
                state["done"] = True
                return
            try:
                data = json.loads(payload)
            except ValueError:
                raise Transient(f"{self.url} sent a malformed stream event: {payload[:120]!r}") from None
            if not isinstance(data, dict):
                raise Transient(f"{self.url} sent a malformed stream event: {payload[:120]!r}")
            if data.get("error"):
                error = data["error"]
                message = error.get("message") if isinstance(error, dict) else error
                raise Transient(f"{self.url} sent an error in the stream: {' '.join(str(message).split())[:200]}")
            if isinstance(data.get("usage"), dict):
                state["usage"] = data["usage"]
            choices = data.get("choices") if isinstance(data.get("choices"), list) else []
            for choice in choices:
                if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                    continue
                delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
                for key in ("reasoning_content", "reasoning"):
                    if isinstance(delta.get(key), str):
                        if delta[key]:
                            reasoning.append(delta[key])
                            self.on_delta("reasoning", delta[key])
                        break
                text = delta.get("content")
                if isinstance(text, list):
                    text = "".join(p["text"] for p in text if isinstance(p, dict) and isinstance(p.get("text"), str))
                if isinstance(text, str) and text:
                    content.append(text)
                    self.on_delta("content", text)
                for piece in delta.get("tool_calls") if isinstance(delta.get("tool_calls"), list) else ():
                    _add_call_piece(calls, piece)
                if isinstance(choice.get("finish_reason"), str):
                    state["finish"] = choice["finish_reason"]

        buffer = b""
        for chunk in _body_chunks(response):
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for raw in lines:
                line = raw.rstrip(b"\r").decode("utf-8", "replace")
                if not line:  # the end of an event
                    if pending:
                        event("\n".join(pending))
                        pending.clear()
                    continue
                name, _, value = line.partition(":")
                if name != "data":  # comments (keep-alives), event names, ids
                    continue
                pending.append(value[1:] if value.startswith(" ") else value)
                joined = "\n".join(pending)
                if joined.strip() == "[DONE]" or _is_json(joined):  # servers that leave out the blank line
                    event(joined)
                    pending.clear()
            if state["done"]:
                break
        if pending:
            event("\n".join(pending))
        if self._cut_reason is not None:  # cut off while reading: the watchdog or a stop shut the socket
            raise _cut_off()
        if not state["done"] and state["finish"] is None:
            if not state["events"]:
                raise EmptyStream()
            raise Transient(f"{self.url}: the stream ended before the reply was complete")
        message: dict[str, Any] = {"role": "assistant", "content": "".join(content)}
        if reasoning:
            message["reasoning_content"] = "".join(reasoning)
        if calls:
            message["tool_calls"] = [calls[index] for index in sorted(calls)]
        data: dict[str, Any] = {"choices": [{"index": 0, "message": message, "finish_reason": state["finish"]}]}
        if state["usage"] is not None:
            data["usage"] = state["usage"]
        return data

    def _track(self, connection: Any) -> None:
        self._connection = connection

    def _cancel(self) -> None:
        self._cut("stop")

    def _cut(self, reason: str = "deadline") -> None:
        """End the request in flight now (signal-safe: a flag and a socket shutdown)."""
        self._cut_reason = reason
        sock = getattr(self._connection, "sock", None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _session(track: Callable[[Any], None]) -> Any:
    """A requests Session whose connections are handed to `track` as each request takes one."""
    import requests
    from requests.adapters import HTTPAdapter
    from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

    def tracking(pool_class: type) -> type:
        class Pool(pool_class):
            def _get_conn(self, timeout: float | None = None) -> Any:
                connection = super()._get_conn(timeout)
                track(connection)
                return connection

        return Pool

    pools = {"http": tracking(HTTPConnectionPool), "https": tracking(HTTPSConnectionPool)}

    class Adapter(HTTPAdapter):
        def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
            super().init_poolmanager(*args, **kwargs)
            self.poolmanager.pool_classes_by_scheme = pools

        def proxy_manager_for(self, proxy: str, **kwargs: Any) -> Any:
            manager = super().proxy_manager_for(proxy, **kwargs)
            manager.pool_classes_by_scheme = pools
            return manager

    session = requests.Session()
    session.mount("http://", Adapter())
    session.mount("https://", Adapter())
    return session


def _body_chunks(response: Any) -> Any:
    """The body as it arrives (one read at a time, chunked or not), with urllib3's errors as requests' own."""
    import requests
    from urllib3 import exceptions

    raw = response.raw
    try:
        while True:
            data = raw.read1(65536)
            if not data:
                return
            yield data
    except exceptions.ReadTimeoutError as error:
        raise requests.exceptions.ReadTimeout(error) from None
    except exceptions.SSLError as error:
        raise requests.exceptions.SSLError(error) from None
    except (exceptions.HTTPError, OSError) as error:
        raise requests.exceptions.ChunkedEncodingError(error) from None


def _add_call_piece(calls: dict[int, dict[str, Any]], piece: Any) -> None:
    """One streamed piece of a tool call: its id and name come once, its arguments in pieces, all by `index`."""
    if not isinstance(piece, dict):
        return
    index = piece.get("index") if isinstance(piece.get("index"), int) else len(calls)
    call = calls.setdefault(index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
    if isinstance(piece.get("id"), str) and piece["id"]:
        call["id"] = piece["id"]
    function = piece.get("function") if isinstance(piece.get("function"), dict) else {}
    if isinstance(function.get("name"), str) and not call["function"]["name"]:  # sent once, in the call's first piece
        call["function"]["name"] = function["name"]
    if isinstance(function.get("arguments"), str):
        call["function"]["arguments"] += function["arguments"]


def _unusable_url() -> tuple[type[Exception], ...]:
    """What requests raises for a URL it cannot use (the endpoint's, or a proxy's)."""
    import requests

    return requests.exceptions.InvalidURL, requests.exceptions.MissingSchema, requests.exceptions.InvalidSchema


def _cut_off() -> Exception:
    import requests

    return requests.exceptions.ConnectionError("the stream was cut off")


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _least(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


def _server_message(response: Any) -> str:
    try:
        error = response.json().get("error")
        text = error.get("message") if isinstance(error, dict) else error
    except (ValueError, AttributeError):
        text = None
    text = " ".join(str(text or response.text or response.reason or "").split())
    return text[:200] + ("..." if len(text) > 200 else "")


def _context_overflow(response: Any) -> tuple[int | None, int | None] | None:
    """(window, prompt tokens) as far as the refusal says, when it refuses a prompt for its length; else None."""
    try:
        error = response.json().get("error")
    except (ValueError, AttributeError):
        error = None
    error = error if isinstance(error, dict) else {"message": error or response.text}
    text = " ".join(str(error.get(key) or "") for key in ("message", "type", "code"))
    return overflow(text, error.get("n_ctx"), error.get("n_prompt_tokens"))


def _reason(error: Exception) -> str:
    text = str(error.args[0] if error.args else error)
    for hint in ("Connection refused", "Name or service not known", "timed out", "Connection reset", "Remote end closed"):
        if hint in text:
            return hint.lower()
    return text[:160]
