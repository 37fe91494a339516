"""Where commands run: the Environment protocol, the settings every kind shares, one command's result, and
the kinds by name.

A kind is a class with `config_class` (a dataclass extending EnvironmentConfig: its own settings beside the
shared ones), built as `cls(config, run_id=..., hidden_env=...)`. Built-in kinds are named here; any other
is given as `package.module:Class`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from miniswe.plugins import config_class, load_kind

KINDS = {
    "local": "miniswe.environments.local:LocalEnvironment",
    "docker": "miniswe.environments.docker:DockerEnvironment",
}


@dataclass(frozen=True)
class EnvironmentConfig:
    kind: str = "local"  # local (bash -c on this machine), docker (one container per run), or package.module:Class
    cwd: str = ""  # working directory of every command; "" = where miniswe was started (docker: /)
    env: dict[str, str] = field(default_factory=dict)  # variables set for every command, over the inherited ones
    timeout: float = field(default=60.0, metadata={"seconds": True})  # seconds per command, then everything it started is killed; 0 = none
    capture_limit: int = 1_000_000  # bytes of each command's output kept (head + tail); 0 = all of it


@dataclass(frozen=True)
class CommandResult:
    """One command's outcome. `output` is what was kept: all of it, or head + elision notice + tail."""

    output: str
    returncode: int | None  # None when the command was killed (timeout, interrupt)
    timed_out: bool
    duration_s: float
    output_chars: int  # size of the full output (bytes stand in for chars in the part not kept)
    elided_chars: int = 0  # how much of the middle was dropped to keep memory bounded
    interrupted: bool = False  # cut short by interrupt() (a stop request), not by its timeout
    sandbox_error: str | None = None  # the sandbox died under the command: why (the run cannot go on)


class Environment(Protocol):
    def execute(self, command: str, *, timeout: float) -> CommandResult:
        """Run one command in a fresh shell; never raise for a failing or hanging command."""
        ...

    def interrupt(self) -> None:
        """Kill the running command now, from any thread or a signal handler; execute() then returns
        what it had printed, marked `interrupted`."""
        ...

    def close(self) -> None: ...

    def describe(self) -> dict[str, Any]:
        """Kind and settings for the trajectory (no secret values)."""
        ...


def environment_class(kind: str) -> type:
    return load_kind(kind, KINDS, key="environment.kind", what="environment")


def environment_config_class(kind: str) -> type:
    return config_class(environment_class(kind), EnvironmentConfig, key="environment.kind")


def build_environment(config: EnvironmentConfig, **context: Any) -> Environment:
    """An environment of `config.kind`; `context` holds what a run adds (run_id, hidden_env)."""
    return environment_class(config.kind)(config, **context)


def check_environment(config: EnvironmentConfig) -> None:
    """Raise ConfigError for settings the environment would refuse, before anything starts."""
    check = getattr(environment_class(config.kind), "check", None)
    if check:
        check(config)
