"""Language models: the Model protocol, what one call returns, and the kinds by name.

A kind is a class with `config_class` (a pydantic model extending config.py's ModelConfig), built as
`cls(config, gate=..., stop=..., on_retry=..., calls_made=...)`: the call gate it shares with other runs,
the Stop that may cancel a call, a callback told of each retry, and how many calls the run already made
(a resumed run; a model answering from a list goes on from there). Built-in kinds are named in plugins.py;
any other is given as `package.module:Class`. A kind may also have `for_child(stop=..., on_retry=...)`, the
model a sub-agent uses (the built-in kinds share their gate, or their script's position); without it a
sub-agent builds its own.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any, Protocol

from miniswe.plugins import KINDS as _KINDS
from miniswe.plugins import load_kind
from miniswe.protocol import Reply, ToolCall  # noqa: F401  (what a model returns: the protocol reads it)

KINDS = _KINDS["model"]


def __getattr__(name: str) -> Any:
    # ModelConfig, for a kind's settings to extend, comes from config.py on first use, so what needs only Reply
    # or ToolCall (the trajectory's and the inspector's readers) does not load pydantic
    if name == "ModelConfig":
        from miniswe.config import ModelConfig

        return ModelConfig
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class Model(Protocol):
    def complete(self, messages: Sequence[dict[str, Any]], *, deadline: float | None = None,
                 tools: Sequence[dict[str, Any]] | None = None) -> Reply:
        """One chat completion. Raises ModelError when the endpoint fails for good, DeadlineReached when
        `deadline` (time.monotonic) passes first, Cancelled when the run's Stop cuts the call short. `tools`
        (the OpenAI function definitions) is passed only with protocol.kind: tools; a kind that cannot call
        tools may leave the parameter out, and such a run is refused at start."""
        ...

    def describe(self) -> dict[str, Any]:
        """Kind, name and endpoint for the trajectory (no secret values)."""
        ...


def calls_tools(cls: type) -> bool:
    """Whether a model kind's `complete` takes `tools` (protocol.kind: tools needs it)."""
    try:
        parameters = inspect.signature(cls.complete).parameters
    except (TypeError, ValueError, AttributeError):
        return False
    return "tools" in parameters or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())


def model_class(kind: str) -> type:
    return load_kind(kind, KINDS, key="model.kind", what="model")
