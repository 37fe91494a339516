"""Prompt rendering: one jinja2 environment over the user's templates dir, then the shipped templates/.

Every template is checked when the renderer is built, so an unknown variable fails at start-up.
"""

from __future__ import annotations

import os
import platform
from typing import Any

from miniswe.errors import ConfigError
from miniswe.resources import templates_dir

VARIABLES = {
    "system.j2": {"action_tag", "submit_marker", "command_timeout", "output_limit", "cwd", "system", "release", "machine", "shell"},
    "instance.j2": {"task", "instance", "action_tag", "submit_marker", "command_timeout", "output_limit", "cwd", "system", "release", "machine", "shell"},
    "observation.j2": {"output", "returncode", "timed_out", "command_timeout", "elided_chars", "output_chars", "duration_s"},
    "format_error.j2": {"reason", "error", "action_tag", "submit_marker", "errors_left"},
}


def system_info() -> dict[str, str]:
    uname = platform.uname()
    return {"system": uname.system, "release": uname.release, "machine": uname.machine, "shell": "bash"}


class Renderer:
    def __init__(self, user_dir: str = ""):
        import jinja2
        import jinja2.meta

        search = [user_dir, templates_dir()] if user_dir else [templates_dir()]
        if user_dir and not os.path.isdir(user_dir):
            raise ConfigError(f"agent.templates_dir: {user_dir} is not a directory")
        self._env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(search),
            undefined=jinja2.StrictUndefined,
            keep_trailing_newline=False,
            autoescape=False,
        )
        self._templates = {}
        for name, allowed in VARIABLES.items():
            try:
                source, filename, _ = self._env.loader.get_source(self._env, name)
                used = jinja2.meta.find_undeclared_variables(self._env.parse(source))
                self._templates[name] = self._env.get_template(name)
            except jinja2.TemplateNotFound:
                raise ConfigError(f"template {name} not found in {' or '.join(search)}") from None
            except jinja2.TemplateSyntaxError as error:
                raise ConfigError(f"{error.filename or name}:{error.lineno}: template syntax error: {error.message}") from None
            unknown = sorted(used - allowed)
            if unknown:
                raise ConfigError(
                    f"{filename}: unknown template variable {unknown[0]!r} (available: {', '.join(sorted(allowed))})"
                )

    def render(self, name: str, **variables: Any) -> str:
        return self._templates[name].render(**variables).strip("\n")
