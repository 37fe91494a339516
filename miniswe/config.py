"""Configuration: frozen dataclasses built from YAML files and key=value overrides, merged left to right.

`agent` and `protocol` are declared here. `environment` and `model` belong to their kind: the section is
checked against the settings dataclass the chosen kind declares (see environments/ and models/), so a
third party's kind brings its own keys. Unknown keys, wrong types and bad values fail before anything
runs, naming the source, the dotted key and a close match. Secrets are never values here:
`model.api_key_env` names a variable.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import typing
from dataclasses import dataclass, field
from typing import Any

from miniswe.environments import KINDS as ENVIRONMENT_KINDS
from miniswe.environments import EnvironmentConfig, environment_config_class
from miniswe.errors import ConfigError
from miniswe.models import KINDS as MODEL_KINDS
from miniswe.models import ModelConfig, model_config_class
from miniswe.policy import PolicyConfig


@dataclass(frozen=True)
class AgentConfig:
    step_limit: int = 100  # model calls per run, format errors included; 0 = unlimited
    token_limit: int = 0  # cumulative total tokens (prompt + completion) per run; 0 = unlimited
    cost_limit: float = 0.0  # cumulative cost in USD per run; 0 = unlimited
    time_limit: float = field(default=0.0, metadata={"seconds": True})  # wall seconds for the whole run: model calls, waits and commands; 0 = unlimited
    max_format_errors: int = 3  # consecutive replies without exactly one action block before RepeatedFormatError
    output_limit: int = 10_000  # characters of command output the model sees (head + tail); the trajectory keeps more
    templates_dir: str = ""  # a folder searched before the shipped templates/ (override any .j2 by name)
    max_repeats: int = 3  # the same command with the same output this many times in a row: a warning; once more: RepeatedAction; 0 = off
    budget_warning: float = 0.1  # observations warn once this share of a limit (steps, tokens, cost, time) is left; 0 = never
    hooks: list[str] = field(default_factory=list)  # hooks loaded by package.module:Class, called at every step (see README)
    context_window: int = 0  # the model's context window in tokens, for compaction; 0 = learned from the endpoint's first context-length refusal
    keep_turns: int = 4  # the newest turns compaction never cuts
    skills_dirs: list[str] = field(default_factory=list)  # folders whose sub-folders are skills (SKILL.md each), listed in the system prompt and read on demand
    max_depth: int = 0  # how deep sub-agents may nest: a run at this depth cannot delegate; 0 = no sub-agents


PROTOCOL_KINDS = ("text", "tools")


@dataclass(frozen=True)
class ProtocolConfig:
    kind: str = field(default="text", metadata={"choices": PROTOCOL_KINDS})  # text (one fenced command per reply) or tools (the endpoint's native tool calls)
    file_tools: bool = False  # tools: also offer read_file, write_file and edit_file, confined to the working directory
    action_tags: list[str] = field(default_factory=lambda: ["mswea_bash_command", "bash"],
                                   metadata={"nonempty": True})  # fenced-block info strings that mark the one action
    submit_marker: str = field(default="COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT",
                               metadata={"nonempty": True})  # first output line that ends the run as Submitted


# What legitimately differs between two runs of the same command: timestamps, clock times, durations,
# temporary paths, addresses, process ids.
REPLAY_MASKS = [
    r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?",
    r"\b(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) [ \d]\d \d{2}:\d{2}:\d{2}(?: [A-Z]{2,5})? \d{4}",
    # `ls -l`'s modification time: month, day, then the time (this year) or the year (older)
    r"\b(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) [ \d]\d (?:[ \d]\d:\d{2}| \d{4})\b",
    # Unix time in seconds (`date +%s`) or milliseconds, 2011 to 2036 (1.3e9 to 2.1e9 s): a 10- or 13-digit number
    # starting 13..20, not a shorter or longer one
    r"(?<![\d.])(?:1[3-9]|20)\d{8}(?:\d{3})?(?:\.\d+)?(?![\d.])",
    r"\b\d{1,2}:\d{2}:\d{2}(?:\.\d+)?\b",
    r"\b\d+(?:\.\d+)? ?(?:ms|s|sec|secs|seconds)\b",
    r"/tmp/[\w.-]+",
    r"\b0x[0-9a-fA-F]{6,}\b",
    r"(?i)\bpid\W{0,3}\d+",
]


@dataclass(frozen=True)
class ReplayConfig:
    masks: list[str] = field(default_factory=lambda: list(REPLAY_MASKS), metadata={"regexes": True})  # regexes for output that varies between runs; masked before outputs are compared


@dataclass(frozen=True)
class Config:
    agent: AgentConfig = field(default_factory=AgentConfig)
    protocol: ProtocolConfig = field(default_factory=ProtocolConfig)
    environment: EnvironmentConfig = field(default_factory=lambda: environment_config_class("local")())
    model: ModelConfig = field(default_factory=lambda: model_config_class("openai")())
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# The sections whose keys depend on their `kind`: base class, kind -> settings class, built-in kinds.
PLUGGABLE = {
    "environment": (EnvironmentConfig, environment_config_class, ENVIRONMENT_KINDS),
    "model": (ModelConfig, model_config_class, MODEL_KINDS),
}
FIXED = {"agent": AgentConfig, "protocol": ProtocolConfig, "replay": ReplayConfig, "policy": PolicyConfig}
SECTIONS = ("agent", "protocol", "environment", "model", "replay", "policy")
MAX_SECONDS = 366 * 86400.0  # a longer wait is a typo (and overflows the system's timers); 0 means none
MAX_NUMBER = 1e15


def default_config_path() -> str:
    from miniswe.resources import config_dir

    return os.path.join(config_dir(), "default.yaml")


def load_config(*sources: str | dict[str, Any]) -> Config:
    """The defaults, then each source in order: a YAML path, `key.path=value`, or a dict."""
    merged: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for source in sources:
        name, data = _read_source(source)
        _merge(merged, data, name, origin, prefix="")
    return _build_config(merged, origin)


def override(config: Config, **changes: dict[str, Any]) -> Config:
    """A copy of `config` with sections updated, checked like any other source. Switching a section's kind
    drops the old kind's settings that were left at their defaults."""
    data = config.to_dict()
    origin: dict[str, str] = {}
    for section, values in changes.items():
        current = getattr(config, section, None)
        if section in PLUGGABLE and "kind" in values and values["kind"] != getattr(current, "kind", None):
            data[section] = _explicit(current)
        _merge(data, {section: values}, "override", origin, prefix="")
    return _build_config(data, origin)


def config_from_record(recorded: dict[str, Any]) -> Config:
    """The Config a trajectory recorded, rebuilt. Masked values come back from this process's environment,
    by the variable's name (see redaction.restore_secrets), since no secret is ever recorded."""
    from miniswe.redaction import restore_secrets

    data = restore_secrets(recorded)
    return _build_config(data, {key: "the recorded config" for key in _dotted_keys(data)})


def _explicit(section: Any) -> dict[str, Any]:
    """A kind's settings that differ from that kind's defaults."""
    defaults = type(section)()
    return {f.name: getattr(section, f.name) for f in dataclasses.fields(section)
            if getattr(section, f.name) != getattr(defaults, f.name) and f.name != "kind"}


def _build_config(data: dict[str, Any], origin: dict[str, str]) -> Config:
    unknown = [key for key in data if key not in SECTIONS]
    if unknown:
        raise ConfigError(f"{origin.get(unknown[0], 'config')}: {unknown[0]}: unknown section{_suggest(unknown[0], SECTIONS)}")
    sections = {}
    for name in SECTIONS:
        values = data.get(name, {})
        if values is None:
            values = {}
        if not isinstance(values, dict):
            raise ConfigError(f"{origin.get(name, _nearest_origin(origin, name))}: {name}: expected a mapping, got {_kind(values)}")
        if name in FIXED:
            sections[name] = _build(FIXED[name], values, origin, prefix=f"{name}.")
        else:
            base, settings_class, builtins = PLUGGABLE[name]
            kind = values.get("kind") or _implied_kind(values, base, settings_class, builtins)
            where = origin.get(f"{name}.kind", "config")
            try:
                cls = settings_class(kind)
            except ConfigError as error:
                raise ConfigError(f"{where}: {error}") from None
            sections[name] = _build(cls, values, origin, prefix=f"{name}.", other_kinds=(builtins, settings_class))
    return Config(**sections)


def _implied_kind(values: dict[str, Any], base: type, settings_class: Any, builtins: dict[str, str]) -> str:
    """With no kind given, the one built-in kind that has every key given (`environment.image` implies docker,
    as `--image` and a task's `env.image` do); the default kind when the keys fit it or fit no single kind."""
    keys = set(values) - {"kind"}
    if keys <= {f.name for f in dataclasses.fields(settings_class(base.kind))}:
        return base.kind
    fitting = [kind for kind in builtins if keys <= {f.name for f in dataclasses.fields(settings_class(kind))}]
    return fitting[0] if len(fitting) == 1 else base.kind


def _read_source(source: str | dict[str, Any]) -> tuple[str, dict[str, Any]]:
    import yaml

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
    except IsADirectoryError:
        raise ConfigError(f"{source}: is a directory; pass a YAML config file or key.path=value") from None
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
            into[key] = value if not isinstance(value, dict) else dict(value)
            origin[dotted] = name
            for sub in _dotted_keys(value, dotted + "."):
                origin[sub] = name


def _dotted_keys(data: Any, prefix: str = "") -> list[str]:
    if not isinstance(data, dict):
        return []
    keys = []
    for key, value in data.items():
        keys.append(f"{prefix}{key}")
        keys += _dotted_keys(value, f"{prefix}{key}.")
    return keys


def _build(cls: type, data: dict[str, Any], origin: dict[str, str], prefix: str, other_kinds: tuple | None = None) -> Any:
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls)}
    values = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        where = origin.get(dotted, _nearest_origin(origin, dotted))
        if key not in known:
            raise ConfigError(f"{where}: {dotted}: unknown key{_unknown_hint(str(key), cls, list(known), other_kinds, prefix)}")
        values[key] = _check(hints[key], known[key], value, dotted, where, origin)
    return cls(**values)


def _unknown_hint(key: str, cls: type, names: list[str], other_kinds: tuple | None, prefix: str) -> str:
    """Did-you-mean over this kind's keys, and over other built-in kinds' (naming the kind that has it)."""
    owners: dict[str, str] = {}
    if other_kinds:
        builtins, settings_class = other_kinds
        for kind in builtins:
            other = settings_class(kind)
            for spec in dataclasses.fields(other) if other is not cls else ():
                if spec.name not in names:
                    owners.setdefault(spec.name, kind)
    close = difflib.get_close_matches(key, names + list(owners), n=1)
    if close and close[0] in owners:
        kind = owners[close[0]]
        guess = "" if close[0] == key else f"did you mean {close[0]!r}? "
        return f" for kind {cls().kind!r} ({guess}{close[0]} is a {kind} setting: set {prefix}kind={kind} to use it, or remove it)"
    return _suggest(key, names)


def _suggest(key: str, names: Any) -> str:
    close = difflib.get_close_matches(key, list(names), n=1)
    return f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(names)})"


def _check(hint: Any, spec: dataclasses.Field, value: Any, dotted: str, where: str, origin: dict[str, str]) -> Any:
    expected = typing.get_origin(hint) or hint
    args = typing.get_args(hint)
    rules = spec.metadata

    def fail(what: str) -> ConfigError:
        return ConfigError(f"{where}: {dotted}: expected {what}, got {_kind(value)} {value!r:.60}")

    if expected is bool:
        if not isinstance(value, bool):
            raise fail("true or false")
    elif expected is float:
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
            value = [value] if value else []
        if value is None:
            value = []
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
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                    raise ConfigError(f"{origin.get(f'{dotted}.{k}', where)}: {dotted}.{k}: expected a number of 0 or more, got {_kind(v)} {v!r:.40}")
            value = {str(k): float(v) for k, v in value.items()}
        else:
            value = dict(value)
        allowed = rules.get("keys")
        unknown = sorted(set(value) - set(allowed or value))
        if unknown:
            key = f"{dotted}.{unknown[0]}"
            raise ConfigError(f"{origin.get(key, where)}: {key}: unknown key (known: {', '.join(allowed)})")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value < 0:
            raise ConfigError(f"{where}: {dotted}: must be 0 or more (0 means unlimited), got {value}")
        ceiling = MAX_SECONDS if rules.get("seconds") else MAX_NUMBER
        if value > ceiling:
            raise ConfigError(f"{where}: {dotted}: {value:g} is too large (at most {ceiling:g}); use 0 for no limit")
    if rules.get("nonempty") and (not value or (isinstance(value, list) and not all(item.strip() for item in value))
                                  or (isinstance(value, str) and not value.strip())):
        raise ConfigError(f"{where}: {dotted}: must not be empty (default: {_default(spec)!r})")
    if rules.get("regexes"):
        import re

        for index, pattern in enumerate(value):
            try:
                re.compile(pattern)
            except re.error as error:
                raise ConfigError(f"{where}: {dotted}[{index}]: not a valid regular expression ({error})") from None
    choices = rules.get("choices")
    if choices and value not in choices:
        close = difflib.get_close_matches(str(value), choices, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"one of: {', '.join(choices)}"
        raise ConfigError(f"{where}: {dotted}: unknown value {value!r} ({hint})")
    return value


def _default(spec: dataclasses.Field) -> Any:
    return spec.default_factory() if spec.default_factory is not dataclasses.MISSING else spec.default


def _nearest_origin(origin: dict[str, str], dotted: str) -> str:
    """Who set `dotted` or the closest key around it: a parent section, else a key inside it."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        name = origin.get(".".join(parts[:end]))
        if name:
            return name
    for key, name in origin.items():
        if key.startswith(dotted + "."):
            return name
    return "config"


def _kind(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", type(None): "nothing"}.get(
        type(value), type(value).__name__
    )
