"""Providers with a wire of their own (Anthropic, Gemini, Bedrock, Vertex AI, ...) through litellm, an optional
extra (`pip install -e '.[litellm]'` in the miniswe checkout), imported only when this kind is configured.

litellm speaks the provider's protocol; everything else is miniswe's, as for the openai kind: litellm's own
retries are off and failures are retried by models/retry.py (Retry-After honoured through the shared call
gate), a call is bounded as a whole by its own timeout and the run's deadline and cut at once by an urgent
stop, a stream that goes quiet for `stream_idle_timeout` is cut and retried, refusals for length become
ContextLengthError, and every message is masked before it is raised, logged or recorded.

The call runs on a worker thread while the caller waits on its events: litellm's clients (httpx, the provider
SDKs) cannot be cut from outside, so a cut call is abandoned, its thread left to end at its own timeout (the
time the call had left) with its answer dropped; an abandoned stream is hung up on at once. litellm never reaches the network on its own: its cost map
and its other catalogues are the copies it ships (LITELLM_OFFLINE_MODE, LITELLM_LOCAL_MODEL_COST_MAP), its
callbacks and telemetry stay off, and its log lines are silenced (miniswe's errors say what failed).
"""

from __future__ import annotations

import copy
import functools
import json
import os
import queue
import re
import socket
import threading
import time
import types
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, model_validator

from miniswe.config import Mapping, ModelConfig, Number, Seconds, Text
from miniswe.errors import Cancelled, ConfigError, ContextLengthError, DeadlineReached, ModelError
from miniswe.models import Reply
from miniswe.models.common import RETRY_STATUSES, ChatModel, EmptyStream, fix, overflow
from miniswe.models.gate import CallGate
from miniswe.models.pricing import PriceSettings, price
from miniswe.models.retry import RetrySettings, Transient, parse_retry_after
from miniswe.signals import Stop

INSTALL = "pip install -e '.[litellm]' in the miniswe checkout"
POLL_S = 0.05  # how often a caller waiting on its call looks at its Stop and deadlines
# Credentials of routes that litellm's own check (validate_environment) does not name, beside those it does
UNLISTED = {"vertex_ai": ("VERTEXAI_CREDENTIALS", "GOOGLE_APPLICATION_CREDENTIALS"),
            "bedrock": ("AWS_SESSION_TOKEN", "AWS_BEARER_TOKEN_BEDROCK"), "sagemaker": ("AWS_SESSION_TOKEN",)}
# Keys of litellm.completion that miniswe sets itself; model.params may not set them.
OWN_PARAMS = {"model": "model.name", "messages": "the conversation", "stream": "model.stream", "tools": "protocol.kind",
              "timeout": "model.timeout", "num_retries": "model.retries", "max_retries": "model.retries",
              "api_base": "model.api_base", "base_url": "model.api_base", "api_key": "model.api_key_env"}
NOT_FOUND = "check model.name (provider/model, e.g. anthropic/claude-sonnet-4-5) and model.api_base"


def _cache_mode(value: Any) -> Any:
    return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value


# YAML reads on/off as booleans: `-c model.cache_control=on` is true, taken as "on"
CacheMode = Annotated[Literal["auto", "on", "off"], BeforeValidator(_cache_mode)]


class LitellmConfig(PriceSettings, RetrySettings, ModelConfig):
    kind: str = "litellm"
    name: Text = ""  # provider/model as litellm routes it: anthropic/claude-sonnet-4-5, gemini/gemini-2.5-pro, bedrock/..., vertex_ai/..., openrouter/..., openai/...
    api_base: Text = ""  # the provider's endpoint, when not its usual one (a proxy, a local server); empty: litellm's default for the route
    api_key_env: Text = ""  # name of the variable holding the key; empty: the route's own as litellm names it (ANTHROPIC_API_KEY for anthropic/...), else litellm finds its credentials itself
    temperature: Number = 0.0  # sampling temperature
    params: Mapping = {}  # extra arguments for litellm.completion, e.g. {max_tokens: 4096, vertex_project: p, aws_region_name: us-east-1}
    timeout: Seconds = 600.0  # seconds one call may take as a whole, answer included; 0 = no limit
    stream: bool = False  # read replies as they are generated (chat shows them live)
    stream_idle_timeout: Seconds = 120.0  # seconds a stream may send nothing (the wait for its first token too) before it is cut and retried; 0 = no limit
    cache_control: CacheMode = "auto"  # prompt-caching marks on the last two user/tool messages: auto (Anthropic's Claude routes), on or off

    @model_validator(mode="before")
    @classmethod
    def _route_key(cls, data: Any) -> Any:
        """An empty api_key_env is the route's own key variable, so the run hides and masks it."""
        if isinstance(data, dict) and not data.get("api_key_env") and isinstance(data.get("name"), str) and data["name"]:
            variable = route_variables(data["name"])[0]
            if variable:
                data = {**data, "api_key_env": variable}
        return data

    def secret_env(self) -> list[str]:
        """The variables holding the model's credentials: model.api_key_env and every one the route's credentials
        may come from (redaction.secret_env)."""
        return [self.api_key_env, *route_variables(self.name)[1]] if self.name else [self.api_key_env]


@functools.lru_cache(maxsize=64)
def route_variables(name: str) -> tuple[str, tuple[str, ...]]:
    """The variable a route's API key is read from ('' when its credentials are no one key: bedrock/, vertex_ai/),
    and every secret-looking variable its credentials may come from, as litellm names them: its check of a
    route's environment (validate_environment) asked as if none were set, so that every alternative is asked
    for; `{PROVIDER}_API_KEY` for a route it does not check (azure_ai/, hosted_vllm/). Empty without litellm."""
    from miniswe.redaction import secret_name

    try:
        litellm = load_litellm()
        provider = litellm.get_llm_provider(model=name)[1]
    except Exception:  # no litellm (the model says how to install it), or no route: the model says so
        return "", ()
    asked: list[str] = []

    class Unset(dict):  # an environment without a variable, noting each one looked for
        def __contains__(self, key: object) -> bool:
            asked.append(str(key))
            return False

        def get(self, key: str, default: Any = None) -> Any:
            asked.append(key)
            return default

    check = litellm.validate_environment
    environ = Unset()
    fake_os = types.SimpleNamespace(environ=environ, getenv=environ.get)
    probe = types.FunctionType(check.__code__, {**check.__globals__, "os": fake_os}, check.__name__, check.__defaults__,
                               check.__closure__)
    try:
        missing = [str(key) for key in probe(model=name)["missing_keys"]]
    except Exception:
        missing = []
    own = f"{provider.upper()}_API_KEY"
    named = list(dict.fromkeys([*asked, *missing]))
    keys = [variable for variable in missing if variable.endswith("_API_KEY")]
    key = own if own in named or not named else keys[0] if len(keys) == 1 else ""
    found = [*named, key, *UNLISTED.get(provider, ())]
    return key, tuple(dict.fromkeys(variable for variable in found if variable and secret_name(variable)))


def route_provider(name: str) -> str:
    """The provider a litellm model name names by its prefix (anthropic/claude-... is anthropic); '' without one."""
    provider, slash, _ = name.partition("/")
    return provider.lower() if slash else ""


def caches_prompts(name: str) -> bool:
    """Whether `cache_control: auto` marks the messages for this route: Anthropic's Claude, directly or on Bedrock
    or Vertex AI (other providers cache by themselves, or refuse the marks)."""
    provider = route_provider(name)
    return provider == "anthropic" or (provider in ("bedrock", "vertex_ai") and "claude" in name.lower())


def set_cache_control(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """A copy of `messages` with the last two user or tool messages marked as cache breakpoints ({"type":
    "ephemeral"} on their content; a tool result carries the mark itself, as litellm reads it), as mini-swe-agent
    marks them: the previous call's mark is read from the cache, the new one written."""
    marked = copy.deepcopy(list(messages))
    count = 0
    for message in reversed(marked):
        if count == 2:
            break
        if message.get("role") not in ("user", "tool"):
            continue
        content = message.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        if not isinstance(content, list) or not content or not isinstance(content[-1], dict):
            continue
        content = [dict(part) for part in content]
        if message["role"] == "tool":
            message["cache_control"] = {"type": "ephemeral"}
        else:
            content[-1]["cache_control"] = {"type": "ephemeral"}
        message["content"] = content
        count += 1
    return marked


_lock = threading.Lock()
_frozen = False


def load_litellm() -> Any:
    """litellm, imported on first use and set up to stay off the network and quiet; ConfigError when missing."""
    with _lock:
        # before the import: litellm fetches its cost map (and other catalogues) at import or first use otherwise
        os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
        os.environ["LITELLM_OFFLINE_MODE"] = "true"
        os.environ["LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS"] = "True"
        try:
            import litellm
        except ImportError as error:
            missing = "" if error.name == "litellm" else f" (its dependency {error.name or error} is missing)"
            raise ConfigError(f"model.kind litellm needs the litellm package{missing}: {INSTALL}") from None
        import gc
        import logging

        global _frozen
        if not _frozen:  # once, just after the import: what is alive at a later call may be garbage soon
            # litellm's tables (its cost map, its providers' settings) are millions of objects alive to the end:
            # moved out of the cyclic collector's sight, every full collection and the interpreter's exit skip
            # them (an exit took seconds longer without); what was garbage already is collected first
            _frozen = True
            gc.collect()
            gc.freeze()
        litellm.suppress_debug_info = True  # no "Give Feedback / Get Help" lines printed on failures
        litellm.telemetry = False
        litellm.drop_params = False
        for name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy"):
            logging.getLogger(name).setLevel(logging.CRITICAL + 1)  # our errors say what failed, masked
        return litellm


class LitellmModel(ChatModel):
    config_class = LitellmConfig

    def __init__(self, config: LitellmConfig, *, gate: CallGate | None = None, stop: Stop | None = None,
                 on_retry: Callable[[str], None] | None = None, on_delta: Callable[[str, str], None] | None = None,
                 **_: Any):
        if not config.name:
            raise ConfigError("no model name: pass -m PROVIDER/MODEL (e.g. anthropic/claude-sonnet-4-5; or set model.name)")
        if config.api_base and not config.api_base.startswith(("http://", "https://")):
            raise ConfigError(f"model.api_base: {config.api_base!r} is not an http(s) URL")
        for key in config.params:
            if key in OWN_PARAMS:
                raise ConfigError(f"model.params.{key}: miniswe sets it (use {OWN_PARAMS[key]})")
        self.litellm = load_litellm()
        try:
            self.provider = self.litellm.get_llm_provider(model=config.name, api_base=config.api_base or None)[1]
        except Exception:
            raise ConfigError(f"model.name: litellm cannot tell the provider of {config.name!r}; write it as "
                              "provider/model, e.g. anthropic/claude-sonnet-4-5 or openai/NAME with model.api_base") from None
        self.config = config
        self.gate = gate or CallGate()
        self.stop = stop or Stop()
        self.on_retry = on_retry or (lambda message: None)
        self.on_delta = on_delta or (lambda kind, text: None)  # kind: "reasoning" or "content"
        self.where = f"{config.name} at {config.api_base}" if config.api_base else config.name
        self.cache = config.cache_control == "on" or (config.cache_control == "auto" and caches_prompts(config.name))
        self._priced = True  # until litellm's cost map turns out to have no price for the model (said once)

    def describe(self) -> dict[str, Any]:
        return {"kind": "litellm", "name": self.config.name, "provider": self.provider, "api_base": self.config.api_base}

    def for_child(self, *, stop: Stop, on_retry: Callable[[str], None] | None = None, **_: Any) -> LitellmModel:
        """The model a sub-agent calls: the same provider and call gate, cancelled by the sub-agent's own stop."""
        return LitellmModel(self.config, gate=self.gate, stop=stop, on_retry=on_retry)

    def complete(self, messages: Sequence[dict[str, Any]], *, deadline: float | None = None,
                 tools: Sequence[dict[str, Any]] | None = None) -> Reply:
        request: dict[str, Any] = {
            "model": self.config.name,
            "messages": set_cache_control(messages) if self.cache else list(messages),
            "temperature": self.config.temperature,
        }
        if tools:
            request["tools"] = list(tools)
        if self.config.api_base:
            request["api_base"] = self.config.api_base
        if self.config.stream:
            request.update(stream=True, stream_options={"include_usage": True})
        request.update(self.config.params)
        request.update(num_retries=0, max_retries=0)  # ours retry (models/retry.py): litellm's and its SDKs' are off
        return self._ask(request, deadline)

    def _fetch(self, request: dict[str, Any], deadline: float | None, own_deadline: bool) -> tuple[dict[str, Any], Any]:
        response = self._call(request, deadline, own_deadline)
        data = _as_dict(response)
        try:
            if not isinstance(data["choices"][0]["message"], dict):
                raise TypeError("message")
        except (KeyError, IndexError, TypeError):
            raise Transient(f"{self.where} sent a malformed reply") from None
        return data, response

    def _call(self, request: dict[str, Any], deadline: float | None, own_deadline: bool) -> Any:
        """litellm.completion on a worker thread, waited for here: its deltas handed to `on_delta`, its answer or
        failure taken back; given up (the thread abandoned) at the deadline, at an urgent stop, or when a stream
        sends nothing for stream_idle_timeout."""
        stream = bool(request.get("stream"))
        idle = self.config.stream_idle_timeout if stream else 0
        left = None if deadline is None else max(deadline - time.monotonic(), 0.001)
        kwargs = dict(request)
        timeout = left if not idle else idle if left is None else min(idle, left)
        if timeout is not None:
            kwargs["timeout"] = timeout  # the worker gives up by itself soon after it is abandoned
        key = os.environ.get(self.config.api_key_env, "") if self.config.api_key_env else ""
        if key:
            kwargs["api_key"] = key
        events: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        abandoned = threading.Event()
        opened: list[Any] = []  # the stream the worker reads, hung up on when the call is abandoned
        worker = threading.Thread(target=self._work, args=(kwargs, events, abandoned, opened), name="miniswe-litellm-call",
                                  daemon=True)
        worker.start()
        heard = time.monotonic()
        answered = False
        try:
            while True:
                try:
                    event = events.get(timeout=POLL_S)
                except queue.Empty:
                    event = None
                if self.stop.urgent:
                    raise Cancelled("model call cancelled")
                now = time.monotonic()
                if event is None:
                    if deadline is not None and now >= deadline:
                        if not own_deadline:
                            raise DeadlineReached("time_limit reached during a model call")
                        # the provider may go on generating for as long: the retry waits that long (busy_for)
                        raise Transient(f"{self.where}: no complete answer within {self.config.timeout:g}s",
                                        busy_for=self.config.timeout)
                    if idle and now - heard >= idle:
                        raise Transient(f"{self.where}: the stream sent nothing for {idle:g}s", busy_for=idle)
                    continue
                heard = now
                if event[0] == "delta":
                    self.on_delta(event[1], event[2])
                elif event[0] == "done":
                    answered = True
                    return event[1]
                elif event[0] == "error":
                    answered = True
                    raise self._failure(event[1], deadline, own_deadline)
        finally:
            abandoned.set()
            for stream in [] if answered else opened[:]:
                _hang_up(stream)  # else its worker reads on, without an end when nothing bounds the call

    def _work(self, kwargs: dict[str, Any], events: queue.SimpleQueue, abandoned: threading.Event,
              opened: list[Any]) -> None:
        try:
            response = self.litellm.completion(**kwargs)
            if kwargs.get("stream"):
                chunks = []
                opened.append(response)
                try:
                    for chunk in () if abandoned.is_set() else response:  # abandoned already: not one read
                        if abandoned.is_set():
                            break
                        chunks.append(chunk)
                        events.put(("chunk",))  # the stream is alive, whatever the chunk holds
                        for kind, text in _deltas(chunk):
                            events.put(("delta", kind, text))
                finally:
                    opened.clear()
                if abandoned.is_set():
                    _hang_up(response)
                    return
                if not chunks:
                    raise EmptyStream()
                response = self.litellm.stream_chunk_builder(chunks, messages=kwargs["messages"])
                finish = _as_dict(response)["choices"][0].get("finish_reason") if response is not None else None
                if finish is None:
                    raise Transient(f"{self.where}: the stream ended before the reply was complete")
            events.put(("done", response))
        except BaseException as error:  # handed to the caller, who maps it (or has gone)
            events.put(("error", error))

    def _failure(self, error: BaseException, deadline: float | None, own_deadline: bool) -> Exception:
        """What a failed litellm call becomes: Transient (retried), ContextLengthError, ModelError, DeadlineReached."""
        if isinstance(error, (Transient, EmptyStream, Cancelled, DeadlineReached, ModelError)):
            return error
        litellm = self.litellm
        status = getattr(error, "status_code", None)
        status = status if isinstance(status, int) else None
        message = _provider_message(error)
        if isinstance(error, litellm.Timeout) or isinstance(error, TimeoutError):
            if deadline is not None and not own_deadline and time.monotonic() >= deadline - 0.01:
                return DeadlineReached("time_limit reached during a model call")
            return Transient(f"{self.where}: no answer in time ({self._scrub(message)})")
        if isinstance(error, litellm.APIConnectionError) and status in (None, 500):
            return Transient(self._scrub(f"cannot reach {self.where}: {message}"))
        known = isinstance(error, litellm.ContextWindowExceededError)
        if (known or status in (400, 413)) and (found := overflow(message, known=known)):
            return ContextLengthError(self._scrub(f"{self.where} answered {status or 400}: {message}"),
                                      window=found[0], prompt_tokens=found[1])
        if status is not None and (status in RETRY_STATUSES or status >= 500):
            return Transient(self._scrub(f"{self.where} answered {status}: {message}"), _retry_after(error))
        if status is not None and status >= 400:
            refused = fix(status, self.config.api_key_env or "the provider's key variable", NOT_FOUND)
            return ModelError(self._scrub(f"{self.where} answered {status}: {message}; {refused}"))
        if isinstance(error, Exception) and type(error).__module__.startswith(("litellm", "openai", "httpx", "httpcore")):
            return Transient(self._scrub(f"{self.where}: {type(error).__name__}: {message}"))
        return ModelError(self._scrub(f"{self.where}: litellm failed: {type(error).__name__}: {message}"))

    def _pricing(self, raw: dict[str, Any], response: Any, warnings: list[str]) -> tuple[Any, Any]:
        if self.config.prices:  # the configured prices win over any reported or mapped cost
            return None, (lambda usage: price(usage, self.config.prices))
        # the provider's (OpenRouter) or litellm's own, else litellm's cost map
        return raw.get("cost"), (lambda usage: self._mapped_cost(response, warnings))

    def _mapped_cost(self, response: Any, warnings: list[str]) -> float:
        """USD for a call by litellm's cost map (the copy it ships); 0 with one warning when it has no price."""
        try:
            cost = float(self.litellm.completion_cost(completion_response=response))
        except Exception:
            cost = None
        if cost is None or cost != cost or cost < 0:
            if self._priced:
                self._priced = False
                warnings.append(f"litellm's cost map has no price for {self.config.name}: its calls cost 0; set "
                                "model.prices ({prompt: N, completion: N, cached: N} USD per million tokens)")
            return 0.0
        return cost

def _deltas(chunk: Any) -> list[tuple[str, str]]:
    """The reasoning and text pieces of a streamed chunk, in order."""
    try:
        delta = chunk.choices[0].delta
    except (AttributeError, IndexError, TypeError):
        return []
    found = []
    reasoning = getattr(delta, "reasoning_content", None)
    if isinstance(reasoning, str) and reasoning:
        found.append(("reasoning", reasoning))
    content = getattr(delta, "content", None)
    if isinstance(content, str) and content:
        found.append(("content", content))
    return found


def _hang_up(stream: Any) -> None:
    """End a litellm stream at once, from any thread: the socket of the HTTP response behind it (httpx's, for
    litellm's own handlers and the OpenAI SDK's) shut down, so a read waiting on it returns, then the stream closed."""
    inner = getattr(stream, "completion_stream", None)
    for http in (getattr(inner, "_response", None), getattr(inner, "response", None)):
        extensions = getattr(http, "extensions", None)
        network = extensions.get("network_stream") if isinstance(extensions, dict) else None
        try:
            sock = network.get_extra_info("socket") if network is not None else None
            if sock is not None:
                sock.shutdown(socket.SHUT_RDWR)
        except Exception:
            pass
    try:
        stream.close()
    except Exception:
        pass


def _as_dict(response: Any) -> dict[str, Any]:
    if isinstance(response, dict):
        return response
    try:
        return response.model_dump(warnings=False)
    except TypeError:
        return response.model_dump()


def _provider_message(error: BaseException) -> str:
    """The provider's own words from a litellm exception, on one line: the error message of its JSON body
    when it has one, else litellm's text without its prefixes."""
    text = str(getattr(error, "message", None) or error)
    body = getattr(error, "body", None)
    found = _error_text(body)
    if found is None:
        _, dash, rest = text.partition("Exception - ") if "Exception - " in text else text.partition("Error - ")
        if dash:
            try:
                found = _error_text(json.loads(rest))
            except ValueError:
                found = rest
    if found is None:
        response = getattr(error, "response", None)
        try:
            found = _error_text(response.json()) if response is not None and response.content else None
        except Exception:
            found = None
    if found is None:
        found = re.sub(r"^(?:litellm\.\w+: )+(?:\w+: )?", "", text)
    found = " ".join(str(found).split())
    return found[:200] + ("..." if len(found) > 200 else "")


def _error_text(body: Any) -> str | None:
    if not isinstance(body, dict):
        return None
    error = body.get("error", body)
    if isinstance(error, dict):
        text = error.get("message")
        return text if isinstance(text, str) and text else None
    return error if isinstance(error, str) and error else None


def _retry_after(error: BaseException) -> float | None:
    response = getattr(error, "response", None)
    for headers in (getattr(error, "litellm_response_headers", None), getattr(response, "headers", None),
                    getattr(error, "headers", None)):
        try:
            value = headers.get("retry-after") if headers is not None else None
        except Exception:
            value = None
        if value:
            return parse_retry_after(str(value))
    return None
