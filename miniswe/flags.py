"""The flags `run`, `batch`, `demo` and `chat` share, each declared once with the config keys it sets, and the
config they resolve to: defaults, then -c sources, then flags; $OPENAI_BASE_URL and $MINISWE_MODEL fill
what is left empty."""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Optional

import typer


@dataclass(frozen=True)
class Flag:
    name: str  # the command's parameter
    decls: tuple[str, ...]
    type: type
    help: str
    key: str  # the dotted config key the value sets
    implies: dict[str, Any] = field(default_factory=dict)  # other keys the flag sets with it


FLAGS = {
    flag.name: flag
    for flag in (
        Flag("model", ("-m", "--model"), str, "Model name (default: model.name, or $MINISWE_MODEL).", "model.name"),
        Flag("base_url", ("--base-url",), str,
             "OpenAI-compatible endpoint (overrides model.base_url; $OPENAI_BASE_URL when neither is set).", "model.base_url"),
        Flag("step_limit", ("--step-limit",), int, "Model calls per run (0 = unlimited).", "agent.step_limit"),
        Flag("token_limit", ("--token-limit",), int, "Total tokens per run (0 = unlimited).", "agent.token_limit"),
        Flag("cost_limit", ("--cost-limit",), float, "USD per run (0 = unlimited).", "agent.cost_limit"),
        Flag("time_limit", ("--time-limit",), float, "Wall seconds per run (0 = unlimited).", "agent.time_limit"),
        Flag("image", ("--image",), str, "Docker image (implies --env docker).", "environment.image",
             {"environment.kind": "docker"}),
        Flag("env", ("--env",), str, "Environment kind: local, docker, or package.module:Class.", "environment.kind"),
        Flag("cwd", ("--cwd",), str, "Working directory of the commands.", "environment.cwd"),
        Flag("script", ("--script",), str, "Use the scripted model with replies from this YAML/JSON file.",
             "model.script", {"model.kind": "scripted"}),
        # not a config key: it turns on the debug log, which lives outside the run record (see debuglog.py)
        Flag("debug", ("--debug",), bool, "Log every model request and response to stderr, secrets masked "
             "($MINISWE_DEBUG=FILE to append to a file instead).", ""),
    )
}
RUN_FLAGS = tuple(FLAGS)
BATCH_FLAGS = tuple(name for name in FLAGS if name not in ("cwd", "script"))

ConfigOpt = Annotated[list[str], typer.Option("-c", "--config", metavar="FILE|KEY=VALUE",
                                              help="YAML file or key.path=value; repeatable, merged left to right.")]


def with_flags(*names: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Add the named shared flags to a typer command; the command receives their values as `flags`."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(command, eval_str=True)  # the annotations, resolved in the command's module
        own = [p for p in signature.parameters.values() if p.name != "flags"]
        added = [_parameter(FLAGS[name]) for name in names]

        @functools.wraps(command)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            given = {name: kwargs.pop(name, None) for name in names}
            return command(*args, flags=given, **kwargs)

        wrapper.__signature__ = signature.replace(parameters=own + added)
        wrapper.__annotations__ = {p.name: p.annotation for p in own + added}
        del wrapper.__wrapped__  # typer must see the new signature, not the command's own
        return wrapper

    return decorate


def _parameter(flag: Flag) -> inspect.Parameter:
    option = typer.Option(*flag.decls, help=flag.help)
    if flag.type is bool:  # a switch, never a value
        return inspect.Parameter(flag.name, inspect.Parameter.KEYWORD_ONLY, default=False,
                                 annotation=Annotated[bool, option])
    return inspect.Parameter(flag.name, inspect.Parameter.KEYWORD_ONLY, default=None,
                             annotation=Annotated[Optional[flag.type], option])


def flag_overrides(flags: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The config sections the given flags set, applied after every -c source."""
    sections: dict[str, dict[str, Any]] = {}
    for name, value in flags.items():
        flag = FLAGS[name]
        if value is None or value == "" or not flag.key:
            continue
        for key, setting in {**flag.implies, flag.key: value}.items():
            section, _, option = key.partition(".")
            sections.setdefault(section, {})[option] = setting
    return sections


def resolve_config(sources: list[str], flags: dict[str, Any], base: dict[str, Any] | None = None, *,
                   recorded_in: str = "") -> Any:
    """Defaults (or `base`, a recorded config), then -c sources, then flags. $OPENAI_BASE_URL and
    $MINISWE_MODEL fill what config leaves empty, for a model kind that has those settings. A local working
    directory given relative is made absolute here, against the shell it was typed in: a resumed run reads it
    from the record, wherever it is resumed from.

    Over a recorded config (resume, fork, replay), an agent, environment or model kind given now that is not the
    recorded one replaces that whole section: the recorded kind's settings (a Docker image, an endpoint) mean
    nothing to another kind, so only what is given now and the new kind's defaults apply. A setting the record
    holds that this miniswe refuses is blamed on the record, `recorded_in` (its file)."""
    from miniswe.config import load_config, override
    from miniswe.errors import ConfigError, TrajectoryError

    if flags.get("debug") and not os.environ.get("MINISWE_DEBUG"):
        os.environ["MINISWE_DEBUG"] = "1"  # in the environment, so batch workers and sub-processes log too
    given = flag_overrides(flags)
    if base:
        base = replaced_kinds(base, sources, given)
    record = recorded_in or "the recorded config"
    try:
        config = load_config(*([(record, base)] if base else []), *sources, given)
    except ConfigError as error:
        if base and str(error).startswith(f"{record}: "):  # a setting the record holds: blame the record
            raise TrajectoryError(f"{error} (the file is damaged, or was written by another miniswe version: "
                                  "-c KEY=VALUE replaces a recorded setting)") from None
        raise
    from_env = {}
    for key, variable in (("base_url", "OPENAI_BASE_URL"), ("name", "MINISWE_MODEL")):
        if hasattr(config.model, key) and not getattr(config.model, key) and os.environ.get(variable):
            from_env[key] = os.environ[variable]
    changes: dict[str, Any] = {"model": from_env} if from_env else {}
    cwd = config.environment.cwd
    if config.environment.kind == "local" and cwd and not os.path.isabs(cwd):
        changes["environment"] = {"cwd": os.path.abspath(cwd)}
    return override(config, **changes) if changes else config


PLUGGABLE = ("agent", "environment", "model")


def replaced_kinds(base: dict[str, Any], sources: list[str], given: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """`base` without the sections whose kind the command line changes (see `resolve_config`)."""
    from miniswe.config import PLUGGABLE as BASES, read_source

    kinds: dict[str, Any] = {}
    for source in [*sources, given]:  # later sources win, as when they are merged
        _, data = read_source(source)
        for section in PLUGGABLE:
            values = data.get(section)
            if isinstance(values, dict) and values.get("kind"):
                kinds[section] = values["kind"]
    def recorded(section: str) -> Any:
        values = base.get(section)
        return (values.get("kind") if isinstance(values, dict) else None) or BASES[section].model_fields["kind"].default

    dropped = [section for section, kind in kinds.items() if kind != recorded(section)]
    return {key: value for key, value in base.items() if key not in dropped} if dropped else base
