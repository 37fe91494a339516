"""Configuration: frozen dataclasses, merged left to right from YAML files and key=value overrides.

Unknown keys, wrong types and bad values fail before anything runs, naming the source, the dotted
key and a close match. Secrets are never values here: `model.api_key_env` names a variable.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import typing
from dataclasses import dataclass, field
from typing import Any

from miniswe.errors import ConfigError


@dataclass(frozen=True)
class AgentConfig:
    step_limit: int = 100
    token_limit: int = 0
    cost_limit: float = 0.0
    time_limit: float = 0.0
    max_format_errors: int = 3
    output_limit: int = 10_000
    templates_dir: str = ""


@dataclass(frozen=True)
class ProtocolConfig:
    action_tags: list[str] = field(default_factory=lambda: ["mswea_bash_command", "bash"])
    submit_marker: str = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


@dataclass(frozen=True)
class EnvironmentConfig:
    kind: str = "local"
    cwd: str = ""
    env: dict[str, str] = field(default_factory=dict)
    timeout: float = 60.0
    capture_limit: int = 1_000_000
    image: str = ""
    forward_env: list[str] = field(default_factory=list)
    run_args: list[str] = field(default_factory=list)
    executable: str = "docker"
    pull: str = "missing"
    start_timeout: float = 120.0
    container_lifetime: float = 14_400.0


@dataclass(frozen=True)
class ModelConfig:
    kind: str = "openai"
    name: str = ""
    base_url: str = ""
    api_key_env: str = "OPENAI_API_KEY"
    temperature: float = 0.0
    params: dict[str, Any] = field(default_factory=dict)
    retries: int = 10
    timeout: float = 600.0
    connect_timeout: float = 10.0
    max_backoff: float = 60.0
    prices: dict[str, float] = field(default_factory=dict)
    script: str = ""


@dataclass(frozen=True)
class Config:
    agent: AgentConfig = field(default_factory=AgentConfig)
    protocol: ProtocolConfig = field(default_factory=ProtocolConfig)
    environment: EnvironmentConfig = field(default_factory=EnvironmentConfig)
    model: ModelConfig = field(default_factory=ModelConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


CHOICES = {
    "environment.kind": ("local", "docker"),
    "environment.pull": ("never", "missing", "always"),
    "model.kind": ("openai", "scripted"),
}
PRICE_KEYS = ("prompt", "completion", "cached")
NON_NEGATIVE = (int, float)


def default_config_path() -> str:
    from miniswe.resources import config_dir

    return os.path.join(config_dir(), "default.yaml")


def load_config(*sources: str | dict[str, Any], defaults: bool = True) -> Config:
    """Merge the shipped defaults, then each source (a YAML path, `key.path=value`, or a dict)."""
    import yaml

    merged: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for source in ([default_config_path()] if defaults else []) + list(sources):
        name, data = _read_source(source, yaml)
        _merge(merged, data, name, origin, prefix="")
    return _checked(_build(Config, merged, origin, prefix=""))


def override(config: Config, **changes: dict[str, Any]) -> Config:
    """A copy of `config` with sections updated, checked like any other source."""
    data = config.to_dict()
    origin: dict[str, str] = {}
    for section, values in changes.items():
        _merge(data, {section: values}, "override", origin, prefix="")
    return _checked(_build(Config, data, origin, prefix=""))


def _checked(config: Config) -> Config:
    """Settings that are fine alone but wrong together."""
    env = config.environment
    if env.kind == "local" and env.image:
        # running an image's untrusted commands on the host by mistake is the one thing not to do quietly
        raise ConfigError(
            f"environment.image is {env.image!r} but environment.kind is local: set environment.kind=docker "
            "(or pass --env docker / --image) to run in the image, or remove environment.image"
        )
    return config


def _read_source(source: str | dict[str, Any], yaml: Any) -> tuple[str, dict[str, Any]]:
    if isinstance(source, dict):
        return "command line", source
    if "=" in source and not os.path.exists(source):
        key, _, raw = source.partition("=")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        data: dict[str, Any] = {}
        node = data
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
        return f"-c {source}", data
    try:
        with open(source, encoding="utf-8") as handle:
            data = yaml.safe_load(handle)
    except FileNotFoundError:
        raise ConfigError(f"{source}: config file not found (pass a YAML file or key.path=value)") from None
    except OSError as error:
        raise ConfigError(f"{source}: cannot read config file: {error.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{source}: not UTF-8 text; a config file is YAML") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{source}: not valid YAML{where}: {getattr(error, 'problem', error)}") from None
    if data is None:
        return source, {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a config file must be a mapping of sections (agent:, model:, ...)")
    return source, data


def _merge(into: dict, data: dict, name: str, origin: dict[str, str], prefix: str) -> None:
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            # sections, and the user's own mappings (env, params, prices) alike: a later source sets keys, one by one
            _merge(into[key], value, name, origin, prefix=dotted + ".")
        else:
            into[key] = value
            origin[dotted] = name


def _build(cls: type, data: Any, origin: dict[str, str], prefix: str) -> Any:
    where = origin.get(prefix.rstrip("."), _nearest_origin(origin, prefix))
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: {prefix.rstrip('.')}: expected a mapping, got {_kind(data)}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    values = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(names)})"
            raise ConfigError(f"{origin.get(dotted, where)}: {dotted}: unknown key{hint}")
        hint = hints[key]
        if dataclasses.is_dataclass(hint):
            values[key] = _build(hint, value, origin, dotted + ".")
        else:
            values[key] = _check(hint, value, dotted, origin.get(dotted, where))
    return cls(**values)


def _check(hint: Any, value: Any, dotted: str, where: str) -> Any:
    expected = typing.get_origin(hint) or hint
    args = typing.get_args(hint)
    fail = lambda what: ConfigError(f"{where}: {dotted}: expected {what}, got {_kind(value)} {value!r:.60}")  # noqa: E731
    if expected is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise fail("a finite number")
        value = float(value)
    elif expected is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise fail("a whole number")
    elif expected is str:
        if value is None:
            value = ""
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise fail("a string")
        value = str(value)
    elif expected is list:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise fail("a list of strings")
        value = list(value)
    elif expected is dict:
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise fail("a mapping")
        value_type = args[1] if args else Any
        if value_type is str:
            value = {str(k): "" if v is None else str(v) for k, v in value.items()}
        elif value_type is float:
            for k, v in value.items():
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    raise ConfigError(f"{where}: {dotted}.{k}: expected a number, got {_kind(v)}")
            value = {str(k): float(v) for k, v in value.items()}
        else:
            value = dict(value)
    if isinstance(value, NON_NEGATIVE) and not isinstance(value, bool) and value < 0:
        raise ConfigError(f"{where}: {dotted}: must be 0 or more (0 means unlimited), got {value}")
    if dotted in CHOICES and value not in CHOICES[dotted]:
        close = difflib.get_close_matches(value, CHOICES[dotted], n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"one of: {', '.join(CHOICES[dotted])}"
        raise ConfigError(f"{where}: {dotted}: unknown value {value!r} ({hint})")
    if dotted == "model.prices":
        unknown = sorted(set(value) - set(PRICE_KEYS))
        if unknown:
            raise ConfigError(f"{where}: model.prices.{unknown[0]}: unknown key (known: {', '.join(PRICE_KEYS)})")
    if dotted == "protocol.action_tags" and not value:
        raise ConfigError(f"{where}: protocol.action_tags: needs at least one tag, e.g. [bash]")
    return value


def _nearest_origin(origin: dict[str, str], prefix: str) -> str:
    for dotted, name in origin.items():
        if dotted.startswith(prefix):
            return name
    return "config"


def _kind(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", type(None): "nothing"}.get(
        type(value), type(value).__name__
    )
