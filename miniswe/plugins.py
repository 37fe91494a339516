"""Kinds of agent, environment and model (and later executor) by name: a built-in short name, or
`package.module:Class` naming a third party's own class, imported on first use so `miniswe --help` stays light."""

from __future__ import annotations

import difflib
import importlib
from typing import Any

from miniswe.errors import ConfigError

# The built-in kinds of each pluggable config section, by short name. Strings, not classes: naming a kind
# imports nothing.
KINDS = {
    "agent": {"default": "miniswe.agent:Agent", "chat": "miniswe.chat.agent:ChatAgent",
              "mini-swe-agent": "miniswe.mini_agent:MiniAgent"},
    "environment": {
        "local": "miniswe.environments.local:LocalEnvironment",
        "docker": "miniswe.environments.docker:DockerEnvironment",
    },
    "model": {
        "openai": "miniswe.models.openai:OpenAIModel",
        "litellm": "miniswe.models.litellm:LitellmModel",
        "scripted": "miniswe.models.scripted:ScriptedModel",
        "replay": "miniswe.models.replay:ReplayModel",
    },
}


def load_kind(kind: str, builtins: dict[str, str], *, key: str, what: str) -> type:
    """The class for `kind`; ConfigError naming `key` and the fix when it cannot be found or imported."""
    if not isinstance(kind, str) or not kind:
        raise ConfigError(f"{key}: expected a kind name, got {kind!r}")
    target = builtins.get(kind) or (kind if ":" in kind else None)
    if target is None:
        close = difflib.get_close_matches(kind, list(builtins), n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"available: {', '.join(builtins)}, or package.module:Class"
        raise ConfigError(f"{key}: unknown {what} {kind!r} ({hint})")
    module_name, _, name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ConfigError(f"{key}: cannot import {module_name} for {what} {kind!r} ({error}); install it or add "
                          "its folder to PYTHONPATH") from None
    cls = getattr(module, name, None)
    if not isinstance(cls, type):
        raise ConfigError(f"{key}: {module_name} has no class {name!r} (write {what} kinds as package.module:Class)")
    return cls


def config_class(cls: type, base: type, *, key: str) -> Any:
    """The settings model a kind declares as `config_class` (the shared `base` when it declares none)."""
    declared = getattr(cls, "config_class", base)
    if not (isinstance(declared, type) and issubclass(declared, base)):
        raise ConfigError(f"{key}: {cls.__module__}.{cls.__name__}.config_class must be a pydantic model "
                          f"that extends {base.__module__}.{base.__name__}")
    return declared
