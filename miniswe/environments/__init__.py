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
    cls = environment_class(config.kind)
    return cls(_settings(cls, config, settings))


def check_environment(config: Any) -> None:
    """Raise ConfigError for settings the environment would refuse, before anything starts."""
    cls = environment_class(config.kind)
    check = getattr(cls, "check", None)
    if check:
        check(_settings(cls, config, {}))


def _settings(cls: type, config: Any, extra: dict[str, Any]) -> Any:
    import dataclasses

    names = {f.name for f in dataclasses.fields(cls.config_class)}
    values = {name: getattr(config, name) for name in names if hasattr(config, name)}
    values.update({k: v for k, v in extra.items() if k in names})
    return cls.config_class(**values)


def environment_class(kind: str) -> type:
    try:
        target = REGISTRY[kind]
    except KeyError:
        raise ConfigError(
            f"environment.kind: unknown environment {kind!r} (available: {', '.join(REGISTRY)})"
        ) from None
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)
