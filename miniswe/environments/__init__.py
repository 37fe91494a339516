"""Where commands run: the Environment protocol, one command's result, and the kinds by name.

A kind is a class with `config_class` (a pydantic model extending EnvironmentConfig, which config.py declares
with the settings every kind shares: its own settings beside those), built as
`cls(config, run_id=..., hidden_env=...)`. Built-in kinds are named in plugins.py; any other is given as
`package.module:Class`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from miniswe.plugins import KINDS as _KINDS
from miniswe.plugins import load_kind

if TYPE_CHECKING:
    from miniswe.config import EnvironmentConfig

KINDS = _KINDS["environment"]


def __getattr__(name: str) -> Any:
    # EnvironmentConfig, for a kind's settings to extend, comes from config.py on first use, so what needs only
    # CommandResult or a submodule (replay, `miniswe cleanup`, the Ray cluster's helpers) does not load pydantic
    if name == "EnvironmentConfig":
        from miniswe.config import EnvironmentConfig

        return EnvironmentConfig
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    by_agent_command: int | None = None  # with sandbox_error: the run's own command (this one, by number) broke it


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


def build_environment(config: EnvironmentConfig, **context: Any) -> Environment:
    """An environment of `config.kind`; `context` holds what a run adds (run_id, hidden_env)."""
    return environment_class(config.kind)(config, **context)


def check_environment(config: EnvironmentConfig) -> None:
    """Raise ConfigError for settings the environment would refuse, before anything starts."""
    check = getattr(environment_class(config.kind), "check", None)
    if check:
        check(config)
