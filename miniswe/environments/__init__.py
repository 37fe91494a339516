"""Where commands run: the Environment protocol, the result of one command, and the registry by short name."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Protocol

from miniswe.errors import ConfigError


@dataclass(frozen=True)
class CommandResult:
    """One command's outcome. `output` is what was kept: all of it, or head + elision notice + tail."""

    output: str
    returncode: int | None  # None when the command was killed by its timeout
    timed_out: bool
    duration_s: float
    output_chars: int  # size of the full output (bytes stand in for chars in the part not kept)
    elided_chars: int = 0  # how much of the middle was dropped to keep memory bounded


class Environment(Protocol):
    def execute(self, command: str, *, timeout: float) -> CommandResult:
        """Run one command in a fresh shell; never raise for a failing or hanging command."""
        ...

    def close(self) -> None: ...

    def describe(self) -> dict[str, Any]:
        """Kind and settings for the trajectory (no secret values)."""
        ...


REGISTRY = {
    "local": "miniswe.environments.local:LocalEnvironment",
    "docker": "miniswe.environments.docker:DockerEnvironment",
}


def build_environment(config: Any, **settings: Any) -> Environment:
    """An environment of `config.kind`, given the settings its own config class declares."""
    import dataclasses

    cls = environment_class(config.kind)
    names = {f.name for f in dataclasses.fields(cls.config_class)}
    values = {name: getattr(config, name) for name in names if hasattr(config, name)}
    values.update({k: v for k, v in settings.items() if k in names})
    return cls(cls.config_class(**values))


def environment_class(kind: str) -> type:
    try:
        target = REGISTRY[kind]
    except KeyError:
        raise ConfigError(
            f"environment.kind: unknown environment {kind!r} (available: {', '.join(REGISTRY)})"
        ) from None
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)
