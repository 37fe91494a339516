"""Language models: the Model protocol, what one call returns, and the registry by short name."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from miniswe.errors import ConfigError


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cached_tokens: int = 0
    cost: float = 0.0

    def add(self, other: Usage) -> None:
        for key, value in asdict(other).items():
            setattr(self, key, getattr(self, key) + value)


@dataclass
class Reply:
    content: str
    reasoning: str | None = None
    finish_reason: str | None = None
    usage: Usage = field(default_factory=Usage)
    latency_s: float = 0.0
    retries: int = 0


class Model(Protocol):
    def complete(self, messages: Sequence[dict[str, str]]) -> Reply:
        """One chat completion; raises ModelError when the endpoint fails for good."""
        ...

    def describe(self) -> dict[str, Any]: ...


REGISTRY = {
    "openai": "miniswe.models.openai:OpenAIModel",
    "scripted": "miniswe.models.scripted:ScriptedModel",
}


def model_class(kind: str) -> type:
    try:
        target = REGISTRY[kind]
    except KeyError:
        raise ConfigError(f"model.kind: unknown model {kind!r} (available: {', '.join(REGISTRY)})") from None
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)
