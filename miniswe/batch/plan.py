"""What one task of a batch runs with: its config (batch config + the task's overrides), cwd, image and paths.

Every task is planned before the first one starts, so a bad override fails the batch as bad input.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

from miniswe.batch.ledger import LedgerRecord
from miniswe.batch.tasks import Task, TaskFile, problem_list
from miniswe.config import Config, override
from miniswe.errors import ConfigError, TaskFileError
from miniswe.redaction import Secrets

# Per-task config values that are paths, resolved against the task file's folder.
PATH_KEYS = {("model", "script"), ("agent", "templates_dir")}
SWEBENCH_CWD = "/testbed"


@dataclass(frozen=True)
class Plan:
    task: Task
    config: Config
    trajectory: str  # absolute path of RUN_DIR/<id>/<id>.traj.json
    workspace: str | None  # the default per-task folder miniswe owns (wiped before each attempt); None for a given cwd
    resume: bool = False  # go on with the task's recorded run (it ended without a verdict) instead of starting over
    grade_timeout: float | None = None  # grade the submitted patch by the SWE-bench harness, its eval this long; None: no
    regrade: LedgerRecord | None = None  # only grade this kept result: the agent does not run again
    # every secret the batch knows (all tasks'): each trajectory masks them all, not only its own task's
    secrets: Secrets | None = field(default=None, repr=False, compare=False)

    @property
    def id(self) -> str:
        return self.task.id


def trajectory_name(task_id: str) -> str:
    """Where a task's trajectory sits, relative to the run directory."""
    return os.path.join(task_id, f"{task_id}.traj.json")


def plan_tasks(task_file: TaskFile, tasks: list[Task], base: Config, run_dir: str) -> list[Plan]:
    """Plan every task; TaskFileError lists the tasks whose overrides are invalid."""
    plans, problems = [], []
    for task in tasks:
        try:
            plans.append(plan_task(task, base, run_dir, task_file.directory))
        except ConfigError as error:
            message = re.sub(r"^override: ", "", str(error))
            problems.append(f"{task.where} (id {task.id}): {message}")
    if problems:
        raise TaskFileError(problem_list(task_file.path, "tasks with invalid settings", problems))
    return plans


def plan_task(task: Task, base: Config, run_dir: str, task_dir: str) -> Plan:
    sections = _sections(task.config, task_dir)
    environment = sections.setdefault("environment", {})
    if task.env:
        upper = [key for key in task.env if str(key).isupper()]
        if upper:
            raise ConfigError(
                f"env.{upper[0]}: unknown environment setting; a task's `env` holds settings such as image or "
                f"timeout, variables go under `env: {{env: {{{upper[0]}: ...}}}}`"
            )
        environment.update(task.env)
        if "image" in task.env and "kind" not in task.env:
            environment["kind"] = "docker"  # like --image: an image means the task runs in it, never on the host
    kind = environment.get("kind", base.environment.kind)
    run_dir = os.path.abspath(run_dir)
    workspace = None
    cwd = task.cwd or environment.get("cwd") or ""
    if cwd and kind == "local":
        environment["cwd"] = os.path.join(task_dir, cwd)
    elif cwd:
        environment["cwd"] = cwd
    elif kind == "local" and not base.environment.cwd:
        workspace = os.path.join(run_dir, task.id, "workspace")
        environment["cwd"] = workspace
    elif task.swebench and not base.environment.cwd:
        environment["cwd"] = SWEBENCH_CWD
    given = environment.get("cwd", base.environment.cwd)
    if kind == "local" and workspace is None and given and not os.path.isdir(given):
        raise ConfigError(f"cwd: {given} is not a directory; create it, or fix the task's cwd or environment.cwd")
    image = environment.get("image", getattr(base.environment, "image", ""))
    if "{" in image:
        environment["image"] = image_name(image, task)
    script = sections.get("model", {}).get("script", getattr(base.model, "script", ""))
    if "{" in script:  # a replies file per task: model.script=replies/{id}.yaml
        sections.setdefault("model", {})["script"] = _fill(script, task, "model.script")
    sections = {name: values for name, values in sections.items() if values}
    config = override(base, **sections) if sections else base
    return Plan(task, config, os.path.join(run_dir, trajectory_name(task.id)), workspace)


def image_name(template: str, task: Task) -> str:
    """Fill `{field}` from the task as SWE-bench names its images: '__' becomes '_1776_', all lower case."""
    return _fill(template, task, "environment.image", lambda value: value.replace("__", "_1776_").lower())


def _fill(template: str, task: Task, key: str, spell=lambda value: value) -> str:
    """`template` with each `{field}` replaced by the task's field (`{id}`: its id), spelled by `spell`."""
    values = {k: spell(str(v)) for k, v in task.fields.items() if isinstance(v, (str, int))}
    values["id"] = spell(task.id)
    try:
        return template.format_map(values)
    except KeyError as error:
        raise ConfigError(
            f"{key}: the template {template!r} uses {{{error.args[0]}}}, which the task lacks "
            f"(fields: {', '.join(sorted(values))})"
        ) from None
    except (ValueError, IndexError) as error:
        raise ConfigError(f"{key}: bad template {template!r}: {error}") from None


def _sections(overrides: dict[str, Any], task_dir: str) -> dict[str, dict[str, Any]]:
    """The task's `config`, nested or dotted (`agent.step_limit: 5`), with path values made absolute."""
    sections: dict[str, dict[str, Any]] = {}
    for key, value in overrides.items():
        section, _, rest = str(key).partition(".")
        if rest:
            value = _nest(rest.split("."), value)
        elif not isinstance(value, dict):
            raise ConfigError(f"config.{section}: expected a section mapping, e.g. `config: {{agent: {{step_limit: 5}}}}`")
        _deep_merge(sections.setdefault(section, {}), value)
    for section, name in PATH_KEYS:
        value = sections.get(section, {}).get(name)
        if isinstance(value, str) and value and not os.path.isabs(value):
            sections[section][name] = os.path.join(task_dir, value)
    return sections


def _nest(parts: list[str], value: Any) -> dict[str, Any]:
    for part in reversed(parts):
        value = {part: value}
    return value


def _deep_merge(into: dict[str, Any], data: dict[str, Any]) -> None:
    for key, value in data.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _deep_merge(into[key], value)
        else:
            into[key] = value
