"""Language models: the Model protocol, the settings every kind shares, what one call returns, and the kinds by name.

A kind is a class with `config_class` (a dataclass extending ModelConfig), built as
`cls(config, gate=..., stop=..., on_retry=..., calls_made=...)`: the call gate it shares with other runs,
the Stop that may cancel a call, a callback told of each retry, and how many calls the run already made
(a resumed run; a model answering from a list goes on from there). Built-in kinds are named here; any other is
given as `package.module:Class`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from miniswe.plugins import config_class, load_kind
from miniswe.usage import Usage

KINDS = {
    "openai": "miniswe.models.openai:OpenAIModel",
    "scripted": "miniswe.models.scripted:ScriptedModel",
    "replay": "miniswe.models.replay:ReplayModel",
}


@dataclass(frozen=True)
class ModelConfig:
    kind: str = "openai"  # openai (any OpenAI-compatible endpoint), scripted (replies from a file), or package.module:Class
    name: str = ""  # model name sent to the endpoint; also -m / MINISWE_MODEL


@dataclass
class Reply:
    content: str
    reasoning: str | None = None
    finish_reason: str | None = None
    usage: Usage = field(default_factory=lambda: Usage(model_calls=1))
    latency_s: float = 0.0
    warnings: list[str] = field(default_factory=list)  # what was wrong with the answer but not fatal (odd usage figures)


class Model(Protocol):
    def complete(self, messages: Sequence[dict[str, str]], *, deadline: float | None = None) -> Reply:
        """One chat completion. Raises ModelError when the endpoint fails for good, DeadlineReached when
        `deadline` (time.monotonic) passes first, Cancelled when the run's Stop cuts the call short."""
        ...

    def describe(self) -> dict[str, Any]:
        """Kind, name and endpoint for the trajectory (no secret values)."""
        ...


def model_class(kind: str) -> type:
    return load_kind(kind, KINDS, key="model.kind", what="model")


def model_config_class(kind: str) -> type:
    return config_class(model_class(kind), ModelConfig, key="model.kind")
