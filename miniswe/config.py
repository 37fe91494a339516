"""Configuration: frozen pydantic models built from YAML files and key=value overrides, merged left to right.

`protocol`, `replay` and `policy` are declared here. `agent`, `environment` and `model` belong to their kind:
the section is checked against the settings model the chosen kind's class declares as `config_class` (a
subclass of the section's base here; the kinds are named in plugins.py and imported on first use), so a
third party's kind brings its own keys. Unknown keys, wrong types and bad values fail before anything runs,
in one line naming the source, the dotted key and a close match; pydantic's own text never reaches the user.
Secrets are never values here: `model.api_key_env` names a variable.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import typing
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from miniswe.errors import ConfigError
from miniswe.plugins import KINDS, config_class, load_kind

MAX_SECONDS = 366 * 86400.0  # a longer wait is a typo (and overflows the system's timers); 0 means none
MAX_NUMBER = 1e15
NONBLANK = r"\S"  # the pattern of a value that must not be empty (its error says so)


def _text(value: Any) -> Any:
    """Nothing is empty text; a number is its text (YAML reads `name: 4` as a number). Anything else is left
    for the type to refuse."""
    if value is None:
        return ""
    return str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


def _strings(value: Any) -> Any:
    """One string is a list of one ("" a list of none); nothing is an empty list."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value] if value else []
    return value


def as_mapping(value: Any) -> Any:
    """Nothing is an empty mapping; keys are text."""
    if value is None:
        return {}
    return {str(key): item for key, item in value.items()} if isinstance(value, dict) else value


def _variables(value: Any) -> Any:
    """Environment variables hold text: every value becomes its text, nothing the empty one."""
    value = as_mapping(value)
    return {key: "" if item is None else str(item) for key, item in value.items()} if isinstance(value, dict) else value


def _regex(pattern: str) -> str:
    try:
        re.compile(pattern)
    except re.error as error:
        raise ValueError(f"not a valid regular expression ({error})") from None
    return pattern


# The value types of settings, for the built-in kinds' and third parties' alike. Counts and numbers are 0 or more,
# up to a ceiling past which a value is a typo.
Count = Annotated[int, Field(ge=0, le=MAX_NUMBER)]
# What 0 means where it means more than none, for the line that refuses a negative value.
ZERO_MEANS = {"agent.step_limit": "unlimited", "agent.token_limit": "unlimited", "agent.cost_limit": "unlimited",
              "agent.time_limit": "unlimited", "agent.max_repeats": "off", "agent.budget_warning": "never",
              "agent.context_window": "learned from the endpoint's first refusal", "agent.max_depth": "no sub-agents",
              "environment.timeout": "none", "environment.capture_limit": "keep all of it"}
Number = Annotated[float, Field(ge=0, le=MAX_NUMBER, allow_inf_nan=False)]
Seconds = Annotated[float, Field(ge=0, le=MAX_SECONDS, allow_inf_nan=False)]
Text = Annotated[str, BeforeValidator(_text)]
NonEmptyText = Annotated[str, BeforeValidator(_text), Field(pattern=NONBLANK)]
Strings = Annotated[list[str], BeforeValidator(_strings)]
NonEmptyStrings = Annotated[list[Annotated[str, Field(pattern=NONBLANK)]], BeforeValidator(_strings),
                            Field(min_length=1)]
Regexes = Annotated[list[Annotated[str, AfterValidator(_regex)]], BeforeValidator(_strings)]
Mapping = Annotated[dict[str, Any], BeforeValidator(as_mapping)]
Variables = Annotated[dict[str, str], BeforeValidator(_variables)]


class Settings(BaseModel):
    """One section's keys, or one kind's. Strict: 1 is not true and "5" is not a number (a Text takes numbers)."""

    # deferred: a kind's model (and a mixin's, never validated alone) is built on first use
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, defer_build=True)


class AgentConfig(Settings):
    kind: str = "default"  # default (the built-in loop), chat, mini-swe-agent (a mini-swe-agent config's prompts), or package.module:Class
    step_limit: Count = 100  # model calls per run, format errors included; 0 = unlimited
    token_limit: Count = 0  # cumulative total tokens (prompt + completion) per run; 0 = unlimited
    cost_limit: Number = 0.0  # cumulative cost in USD per run; 0 = unlimited
    time_limit: Seconds = 0.0  # wall seconds for the whole run: model calls, waits and commands; 0 = unlimited
    max_format_errors: Count = 3  # consecutive replies without exactly one action block before RepeatedFormatError
    output_limit: Count = 10_000  # characters of command output the model sees (head + tail); the trajectory keeps more
    templates_dir: Text = ""  # a folder searched before the shipped templates/ (override any .j2 by name)
    max_repeats: Count = 3  # the same command with the same output this many times in a row: a warning; once more: RepeatedAction; 0 = off
    budget_warning: Number = 0.1  # observations warn once this share of a limit (steps, tokens, cost, time) is left; 0 = never
    hooks: Strings = []  # hooks loaded by package.module:Class, called at every step (see README)
    context_window: Count = 0  # the model's context window in tokens, for compaction; 0 = learned from the endpoint's first context-length refusal
    keep_turns: Count = 4  # the newest turns compaction does not cut while they fit (the newest one always)
    skills_dirs: Strings = []  # folders whose sub-folders are skills (SKILL.md each), listed in the system prompt and read on demand
    max_depth: Count = 0  # how deep sub-agents may nest: a run at this depth cannot delegate; 0 = no sub-agents


class ProtocolConfig(Settings):
    kind: Literal["text", "tools"] = "text"  # text (one fenced command per reply) or tools (the endpoint's native tool calls)
    file_tools: bool = False  # tools: also offer read_file, write_file and edit_file, confined to the working directory
    action_tags: NonEmptyStrings = ["mswea_bash_command", "bash"]  # fenced-block info strings that mark the one action
    submit_marker: NonEmptyText = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"  # first output line that ends the run as Submitted


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


class ReplayConfig(Settings):
    masks: Regexes = REPLAY_MASKS  # regexes for output that varies between runs; masked before outputs are compared


# The names of policy.DENY's rules, its default: policy.py holds the rules, and config.py may not import it
# (tests/test_policy.py keeps the two equal).
DENY_RULES = ["delete-root-or-home", "mkfs", "raw-disk-write", "fork-bomb", "shutdown", "kill-all", "chmod-root"]


def _not_null(value: Any) -> Any:
    if value is None:  # a damaged record, or a bare `deny:`, must not quietly turn every rule off
        raise ValueError("null is not a list of rules; give a list ([] turns the built-in rules off)")
    return value


class PolicyConfig(Settings):
    deny: Annotated[Regexes, BeforeValidator(_not_null)] = DENY_RULES  # built-in rule names and regexes: a matching command is refused, the model is told why, and the run goes on
    confirm: Regexes = []  # regexes: a matching command runs only when a person says yes (chat); refused where nobody is asked
    containers: bool = False  # apply deny and confirm in containers too (there the container is the sandbox)
    confine: bool = False  # local: commands may write (and change metadata) only in the working directory, /tmp and /dev/shm (Linux)


class EnvironmentConfig(Settings):
    kind: str = "local"  # local (bash -c on this machine), docker (one container per run), or package.module:Class
    cwd: Text = ""  # working directory of every command; "" = where miniswe was started (docker: /)
    env: Variables = {}  # variables set for every command, over the inherited ones
    timeout: Seconds = 60.0  # seconds per command, then everything it started is killed; 0 = none
    capture_limit: Count = 1_000_000  # bytes of each command's output kept (head + tail); 0 = all of it


class ModelConfig(Settings):
    kind: str = "openai"  # openai (any OpenAI-compatible endpoint), scripted (replies from a file), or package.module:Class
    name: Text = ""  # model name sent to the endpoint; also -m / MINISWE_MODEL


# The sections whose keys depend on their `kind`, by the base every kind's settings extend; the built-in
# kinds are plugins.KINDS[section].
PLUGGABLE = {"agent": AgentConfig, "environment": EnvironmentConfig, "model": ModelConfig}
FIXED = {"protocol": ProtocolConfig, "replay": ReplayConfig, "policy": PolicyConfig}
SECTIONS = ("agent", "protocol", "environment", "model", "replay", "policy")


def settings_class(section: str, kind: str) -> type:
    """The settings model of a pluggable section's `kind`: its class's `config_class`, else the section's base."""
    key = f"{section}.kind"
    return config_class(load_kind(kind, KINDS[section], key=key, what=section), PLUGGABLE[section], key=key)


def _default(section: str) -> Settings:
    return settings_class(section, PLUGGABLE[section].model_fields["kind"].default)()


@dataclass(frozen=True)
class Config:
    agent: AgentConfig = field(default_factory=lambda: _default("agent"))
    protocol: ProtocolConfig = field(default_factory=ProtocolConfig)
    environment: EnvironmentConfig = field(default_factory=lambda: _default("environment"))
    model: ModelConfig = field(default_factory=lambda: _default("model"))
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name).model_dump() for name in SECTIONS}


def default_config_path() -> str:
    from miniswe.resources import config_dir

    return os.path.join(config_dir(), "default.yaml")


def load_config(*sources: Source) -> Config:
    """The defaults, then each source in order (see `read_source`)."""
    merged: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for source in sources:
        name, data = read_source(source)
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


def _explicit(section: Settings) -> dict[str, Any]:
    """A kind's settings that differ from that kind's defaults."""
    return section.model_dump(exclude={"kind"}, exclude_defaults=True)


def _build_config(data: dict[str, Any], origin: dict[str, str]) -> Config:
    # pydantic looks for plugins among every installed distribution when it first builds a model's validator
    # (20-40 ms of a run's start-up here), for settings no plugin should see; typer turns them off the same way
    if os.environ.get("PYDANTIC_DISABLE_PLUGINS") is not None:
        return _build_sections(data, origin)
    os.environ["PYDANTIC_DISABLE_PLUGINS"] = "1"
    try:
        return _build_sections(data, origin)
    finally:
        del os.environ["PYDANTIC_DISABLE_PLUGINS"]


def _build_sections(data: dict[str, Any], origin: dict[str, str]) -> Config:
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
        kind = None
        if name in FIXED:
            cls = FIXED[name]
        else:
            kind = values.get("kind") or _implied_kind(name, values)
            try:
                cls = settings_class(name, kind)
            except ConfigError as error:
                raise ConfigError(f"{origin.get(f'{name}.kind', 'config')}: {error}") from None
        sections[name] = _build(cls, name, kind, values, origin)
    return Config(**sections)


def _implied_kind(section: str, values: dict[str, Any]) -> str:
    """With no kind given, the one built-in kind that has every key given (`environment.image` implies docker,
    as `--image` and a task's `env.image` do); the default kind when the keys fit it or fit no single kind."""
    default = PLUGGABLE[section].model_fields["kind"].default
    keys = set(values) - {"kind"}

    def fits(kind: str) -> bool:
        return keys <= settings_class(section, kind).model_fields.keys()

    if fits(default):
        return default
    fitting = [kind for kind in KINDS[section] if fits(kind)]
    return fitting[0] if len(fitting) == 1 else default


Source = str | dict[str, Any] | tuple[str, dict[str, Any]]


def read_source(source: Source) -> tuple[str, dict[str, Any]]:
    """One source of settings as (its name in error messages, its sections): a YAML file (miniswe's or
    mini-swe-agent's), `section.key=value`, a dict (the command line's flags), or (name, dict): a recorded
    config, named for where it was read."""
    if isinstance(source, tuple):
        return source
    if isinstance(source, dict):  # flags: no YAML to read, and no yaml import for a run given only flags
        return "command line", source
    import yaml

    if "=" in source and not os.path.exists(source):
        key, _, raw = source.partition("=")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        except RecursionError:
            raise ConfigError(f"-c {source}: {TOO_DEEP}") from None
        data: dict[str, Any] = {}
        node = data
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
        _checked(data, f"-c {source}")
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
    except RecursionError:  # YAML's reader recurses once per level
        raise ConfigError(f"{source}: {TOO_DEEP}") from None
    if data is None:
        return source, {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a config file must be a mapping of sections (agent:, model:, ...)")
    from miniswe.mini_config import from_mini_config  # a mini-swe-agent config file becomes miniswe's sections

    data = from_mini_config(data, source)
    _checked(data, source)  # what is used of it (a mini-swe-agent config's other sections are not)
    return source, data


EXPANDED_MAX = 100_000  # values a config (or one task of a task file) may hold once its YAML aliases are written out
TOO_DEEP = "nested too deeply to read (lists or mappings hundreds of levels down); write it flatter"


class NotJson(ValueError):
    """A value JSON cannot hold, or too many of them; the message starts with the key."""


def json_values(data: Any) -> None:
    """What YAML reads but JSON cannot hold (a date, a set, binary, NaN, a list that holds itself through an
    alias) would break the request body and the trajectory much later: refused here, naming the key; so is data
    whose aliases grow past EXPANDED_MAX values (every later reader would write them all out)."""
    try:
        total = _json_only(data, "", {}, frozenset())
    except RecursionError:  # past what the trajectory's JSON encoder would take, too
        raise NotJson(TOO_DEEP) from None
    if total > EXPANDED_MAX:
        raise NotJson(f"its YAML aliases write out to {total:,} values, more than {EXPANDED_MAX:,}; write it out "
                      "without them")


def _json_only(data: Any, key: str, sizes: dict[int, int], within: frozenset[int]) -> int:
    """How many values `data` holds, written out; `sizes`: those of the mappings and lists counted already."""
    if not isinstance(data, (dict, list)):
        if isinstance(data, float) and not math.isfinite(data):
            raise NotJson(f"{key}: expected a finite number, not {data} (JSON has no form for it)")
        if data is not None and not isinstance(data, (str, int, float, bool)):
            raise NotJson(f"{key}: YAML read {data!r} as a {type(data).__name__}; quote it to give text (miniswe "
                          "keeps text, numbers, true/false, lists and mappings)")
        return 1
    if id(data) in within:
        raise NotJson(f"{key}: holds itself (a YAML alias inside what it names); write it out")
    if id(data) not in sizes:
        within |= {id(data)}
        total = 1
        for name, value in data.items() if isinstance(data, dict) else enumerate(data):
            dotted = (f"{key}.{name}" if key else str(name)) if isinstance(data, dict) else f"{key}[{name}]"
            if isinstance(data, dict) and not isinstance(name, (str, int, float, bool)) and name is not None:
                raise NotJson(f"{dotted}: YAML read the key {name!r} as a {type(name).__name__}; quote it to give text")
            total += _json_only(value, dotted, sizes, within)
        sizes[id(data)] = total
    return sizes[id(data)]


def _checked(data: dict[str, Any], source: str) -> None:
    try:
        json_values(data)
    except NotJson as error:
        raise ConfigError(f"{source}: {error}") from None


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


def _build(cls: type[Settings], section: str, kind: str | None, values: dict[str, Any],
           origin: dict[str, str]) -> Settings:
    try:
        return cls.model_validate(values)
    except ValidationError as error:
        # one problem, the first in the order the keys were given (an entry's own problem before its key's)
        order = list(values)
        first = min(error.errors(include_url=False), key=lambda problem: (
            order.index(problem["loc"][0]) if problem["loc"] and problem["loc"][0] in order else len(order),
            problem["loc"][-1] == "[key]"))
        raise ConfigError(_explain(first, cls, section, kind, values, origin)) from None


def _explain(problem: dict[str, Any], cls: type[Settings], section: str, kind: str | None, values: dict[str, Any],
             origin: dict[str, str]) -> str:
    """One of pydantic's problems as the line miniswe prints: who set the key, the key, what is wrong."""
    key, *inner = problem["loc"]
    subject = f"{section}.{key}"
    where = origin.get(subject, _nearest_origin(origin, subject))
    error, context, value = problem["type"], problem.get("ctx", {}), problem["input"]
    if error in ("extra_forbidden", "invalid_key"):
        return f"{where}: {subject}: unknown key{_unknown_hint(str(key), cls, section, kind)}"
    spec = cls.model_fields[key]
    if error == "missing":
        return f"{where}: {subject}: required (kind {kind!r} has no default for it)"
    annotation, shown = spec.annotation, values[key]
    if inner and isinstance(shown, dict):  # an entry of a mapping, blamed on whoever set that entry
        subject, shown = f"{subject}.{inner[0]}", value
        where = origin.get(subject, where)
        keys, annotation = typing.get_args(annotation)
        if inner[-1] == "[key]":
            return f"{where}: {subject}: unknown key (known: {', '.join(typing.get_args(keys))})"
        if _bare(annotation) is float and error in ("float_type", "finite_number", "greater_than_equal"):
            return f"{where}: {subject}: expected a number of 0 or more, got {_kind(value)} {value!r:.40}"
    elif inner and error == "value_error":  # an item of a list
        subject = f"{subject}[{inner[0]}]"
    if error.endswith("_type") or error == "finite_number":
        return f"{where}: {subject}: expected {_expected(annotation)}, got {_kind(shown)} {shown!r:.60}"
    if error == "greater_than_equal":
        value = float(value) if _bare(annotation) is float else value
        zero = ZERO_MEANS.get(subject)
        return f"{where}: {subject}: must be 0 or more{f' (0 = {zero})' if zero else ''}, got {value}"
    if error == "less_than_equal":
        return f"{where}: {subject}: {value:g} is too large (at most {context['le']:g}); use 0 for no limit"
    if context.get("pattern") == NONBLANK and inner:  # an item of a list is blank, not the list empty
        return f"{where}: {subject}[{inner[0]}]: must not be blank, got {value!r:.40}"
    if error == "too_short" or context.get("pattern") == NONBLANK:
        return f"{where}: {subject}: must not be empty (default: {spec.get_default(call_default_factory=True)!r})"
    if error == "literal_error":
        if not isinstance(_text(value), str):
            return f"{where}: {subject}: expected a string, got {_kind(value)} {value!r:.60}"
        value = _text(value)  # as a text key would read it: 5 is '5'
        choices = [str(choice) for choice in typing.get_args(annotation)]
        close = difflib.get_close_matches(str(value), choices, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"one of: {', '.join(choices)}"
        return f"{where}: {subject}: unknown value {value!r} ({hint})"
    if error in ("value_error", "assertion_error"):  # a validator's own words: ours (_regex), or a kind's
        return f"{where}: {subject}: {context['error']}"
    return f"{where}: {subject}: not a valid value, got {_kind(shown)} {shown!r:.60}"


EXPECTED = {bool: "true or false", int: "a whole number", float: "a finite number", str: "a string", dict: "a mapping"}


def _expected(annotation: Any) -> str:
    bare = _bare(annotation)
    if bare is list:
        items = typing.get_args(annotation)
        return "a list of strings" if items and _bare(items[0]) is str else "a list"
    return EXPECTED.get(bare, f"a {getattr(bare, '__name__', bare)}")


def _bare(annotation: Any) -> Any:
    """The plain type under an annotation: str for Annotated[str, ...], list for list[str]."""
    if typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    return typing.get_origin(annotation) or annotation


def _unknown_hint(key: str, cls: type[Settings], section: str, kind: str | None) -> str:
    """Did-you-mean over this kind's keys, and over other built-in kinds' (naming the kind that has it)."""
    names = list(cls.model_fields)
    owners: dict[str, str] = {}
    for other in KINDS.get(section, ()):
        for name in settings_class(section, other).model_fields:
            if name not in names:
                owners.setdefault(name, other)
    close = difflib.get_close_matches(key, names + list(owners), n=1)
    if close and close[0] in owners:
        owner = owners[close[0]]
        guess = "" if close[0] == key else f"did you mean {close[0]!r}? "
        return f" for kind {kind!r} ({guess}{close[0]} is a {owner} setting: set {section}.kind={owner} to use it, or remove it)"
    return _suggest(key, names)


def _suggest(key: str, names: Any) -> str:
    close = difflib.get_close_matches(key, list(names), n=1)
    return f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(names)})"


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
