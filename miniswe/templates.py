"""Prompts: the Jinja2 templates, the variables each may use, and rendering them.

One jinja2 environment searches the user's templates dir, then the shipped templates/. Every template is
checked when the Renderer is built, so an unknown variable or a syntax error fails at start-up.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Sequence
from typing import Any

from miniswe.errors import ConfigError
from miniswe.resources import cache_dir, templates_dir, write_quietly, writable_dir

PROMPT_VARIABLES = ("action_tag", "submit_marker", "command_timeout", "output_limit", "cwd", "system", "release", "machine",
                    "shell", "protocol", "tools", "skills", "subagents", "depth")
VARIABLES = {
    "system.j2": set(PROMPT_VARIABLES),
    "instance.j2": {"task", "instance", *PROMPT_VARIABLES},
    "observation.j2": {"output", "returncode", "timed_out", "command_timeout", "elided_chars", "output_chars", "duration_s",
                       "aborted"},
    "format_error.j2": {"reason", "error", "action_tag", "submit_marker", "errors_left", "protocol"},
    "compact.j2": {"submit_marker"},
    "summarize.j2": set(),
    "summary.j2": {"summary"},
    "elided.j2": {"head", "chars", "role"},
}


def prompt_variables(config: Any, cwd: str, *, skills: Sequence[dict[str, str]] = (), subagents: bool = False,
                     depth: int = 0, tools: Sequence[str] = ()) -> dict[str, Any]:
    """What the system and instance prompts may say about the run: its protocol (and the tools it offers), limits,
    machine, skills (name and description of each) and whether it may start sub-agents (and at what depth it is)."""
    uname = os.uname()  # not platform.uname(): importing platform costs a run more than it tells
    return {
        "action_tag": config.protocol.action_tags[0],
        "submit_marker": config.protocol.submit_marker,
        "command_timeout": number(config.environment.timeout),
        "output_limit": config.agent.output_limit,
        "cwd": cwd,
        "system": uname.sysname,
        "release": uname.release,
        "machine": uname.machine,
        "shell": "bash",
        "protocol": config.protocol.kind,
        "tools": list(tools),
        "skills": list(skills),
        "subagents": subagents,
        "depth": depth,
    }


def number(value: float) -> int | float:
    """A number as a person writes it: 60, not 60.0."""
    return int(value) if float(value).is_integer() else value


class Renderer:
    def __init__(self, user_dir: str = ""):
        import jinja2

        search = [user_dir, templates_dir()] if user_dir else [templates_dir()]
        if user_dir and not os.path.isdir(user_dir):
            raise ConfigError(f"agent.templates_dir: {user_dir} is not a directory")
        options = {"undefined": jinja2.StrictUndefined, "keep_trailing_newline": False, "autoescape": False}
        # compiling the templates costs a run's start more than everything else of its own: the code is kept,
        # checked against each template's text, in a folder of this jinja2's and these options' own
        self._cache = writable_dir(os.path.join(cache_dir("templates"), f"jinja2-{jinja2.__version__}-"
                                                f"{zlib.crc32(repr(sorted(options.items())).encode()):08x}"))
        self._env = jinja2.Environment(loader=jinja2.FileSystemLoader(search),
                                       bytecode_cache=_quiet_cache(self._cache) if self._cache else None, **options)
        self._templates = {}
        for name, allowed in VARIABLES.items():
            try:
                source, filename, _ = self._env.loader.get_source(self._env, name)
                used = self._variables(source)
                self._templates[name] = self._env.get_template(name)
            except jinja2.TemplateNotFound:
                raise ConfigError(f"template {name} not found in {' or '.join(search)}") from None
            except jinja2.TemplateSyntaxError as error:
                raise ConfigError(f"{error.filename or name}:{error.lineno}: template syntax error: {error.message}") from None
            except UnicodeDecodeError:
                raise ConfigError(f"template {name} in {' or '.join(search)} is not UTF-8 text; save it as UTF-8") from None
            unknown = sorted(used - allowed)
            if unknown:
                raise ConfigError(
                    f"{filename}: unknown template variable {unknown[0]!r} (available: {', '.join(sorted(allowed))})"
                )

    def _variables(self, source: str) -> set[str]:
        """The variables a template's text uses, kept in the cache by the text's hash (finding them parses it)."""
        import hashlib

        import jinja2.meta

        path = os.path.join(self._cache, hashlib.sha256(source.encode()).hexdigest() + ".vars") if self._cache else ""
        try:
            with open(path, encoding="utf-8") as handle:
                return set(handle.read().split())
        except (OSError, UnicodeDecodeError):
            pass
        used = jinja2.meta.find_undeclared_variables(self._env.parse(source))
        if path:
            write_quietly(path, "\n".join(sorted(used)))
        return used

    def render(self, name: str, **variables: Any) -> str:
        import jinja2

        try:
            return self._templates[name].render(**variables).strip("\n")
        except jinja2.TemplateError as error:
            raise ConfigError(f"template {name}: {error}; fix the template (see the variables it may use)") from None

    def check_instance(self, task: str, instance: dict[str, Any], variables: dict[str, Any]) -> None:
        """Render the instance prompt once now, so a field a task lacks fails before anything runs."""
        self.render("instance.j2", task=task, instance=instance, **variables)


def _quiet_cache(directory: str) -> Any:
    """jinja2's bytecode cache in `directory`, where a file that cannot be read or written (a full disk) only
    means compiling again."""
    import jinja2

    class QuietCache(jinja2.FileSystemBytecodeCache):
        def load_bytecode(self, bucket: Any) -> None:
            try:
                super().load_bytecode(bucket)
            except (OSError, ValueError, EOFError):
                bucket.reset()

        def dump_bytecode(self, bucket: Any) -> None:
            try:
                super().dump_bytecode(bucket)
            except OSError:
                pass

    return QuietCache(directory)
