"""Task files: YAML, JSON or JSONL lists of tasks (or SWE-bench instances, also as Parquet or a dataset name),
validated whole before anything runs.

Every problem is reported with its place (line for YAML/JSONL, index for JSON and Parquet, row for a dataset),
the field and the fix.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

from miniswe.config import TOO_DEEP, NotJson, json_values
from miniswe.errors import TaskFileError

FIELDS = ("id", "task", "cwd", "setup", "eval", "env", "config", "metadata")
MAPPINGS = ("env", "config", "metadata")
SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
# a task's folder sits beside these in the run directory
RESERVED_IDS = {"results.jsonl", "results.history.jsonl", "preds.json", "run.json", "report.md", "images.jsonl"}
# SWE-bench fields worth keeping in the trajectory's metadata (the large texts stay in `fields` only).
SWEBENCH_METADATA = ("repo", "base_commit", "version", "environment_setup_commit", "created_at")
MAX_PROBLEMS = 10


@dataclass(frozen=True)
class Task:
    id: str
    text: str
    where: str  # "line 7" / "index 3": where the entry sits in its file, for messages
    cwd: str = ""
    setup: tuple[str, ...] = ()
    evaluate: tuple[str, ...] = ()
    env: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    fields: dict[str, Any] = field(default_factory=dict)  # the whole entry: template variables
    swebench: bool = False


@dataclass(frozen=True)
class TaskFile:
    path: str  # the file, or the dataset name as given
    sha256: str
    tasks: list[Task]
    dataset: str = ""  # the dataset's id when the list was loaded by name (or from a dataset folder)
    split: str = ""

    @property
    def directory(self) -> str:
        return os.path.dirname(os.path.abspath(self.path))

    @property
    def source(self) -> str:
        """What run.json records to load the list again: the file's absolute path, or the dataset name."""
        return self.path if self.dataset else os.path.abspath(self.path)


def load_task_list(spec: str, split: str = "test") -> TaskFile:
    """A task file, or a dataset by name (`verified`, a Hugging Face id) or folder, with `split` for datasets."""
    from miniswe.swebench.datasets import dataset_name

    if dataset_name(spec) is None:
        return load_tasks(spec)
    from miniswe.swebench.datasets import load_dataset_rows

    name, rows, digest = load_dataset_rows(spec, split)
    task_file = tasks_of(spec, [(f"row {i}", row) for i, row in enumerate(rows)], digest)
    return TaskFile(task_file.path, task_file.sha256, task_file.tasks, dataset=name, split=split)


def load_tasks(path: str) -> TaskFile:
    """Read and validate a task file; TaskFileError lists every problem found (up to ten)."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except OSError as error:
        raise TaskFileError(f"{path}: cannot read task file: {error.strerror}") from None
    if path.lower().endswith(".parquet"):
        from miniswe.swebench.datasets import read_parquet

        entries = [(f"index {i}", row) for i, row in enumerate(read_parquet(path))]
    else:
        text = raw.decode("utf-8", errors="replace").removeprefix("\ufeff")  # editors on Windows add a BOM
        try:
            entries = _parse(path, text)
        except RecursionError:  # the JSON and YAML readers recurse once per level
            raise TaskFileError(f"{path}: {TOO_DEEP}") from None
    return tasks_of(path, entries, hashlib.sha256(raw).hexdigest())


def tasks_of(path: str, entries: list[tuple[str, Any]], sha256: str) -> TaskFile:
    """Validate parsed entries, each with where it sits; TaskFileError lists every problem found (up to ten)."""
    tasks: list[Task] = []
    problems: list[str] = []
    seen: dict[str, str] = {}
    for where, entry in entries:
        try:
            task = _task(where, entry)
        except _Problem as problem:
            problems.append(f"{where}: {problem}")
            continue
        if task.id in seen:
            problems.append(f"{where}: id {task.id!r} is already used at {seen[task.id]}; ids must be unique")
            continue
        seen[task.id] = where
        tasks.append(task)
    if not entries:
        problems.append("no tasks: the file holds an empty list")
    if problems:
        raise TaskFileError(problem_list(path, "problems in the task file", problems))
    return TaskFile(path, sha256, tasks)


def problem_list(path: str, what: str, problems: list[str]) -> str:
    """One line for one problem; a count and one indented line each (up to ten) for several."""
    if len(problems) == 1:
        return f"{path}: {problems[0]}"
    more = f"\n  ... and {len(problems) - MAX_PROBLEMS} more" if len(problems) > MAX_PROBLEMS else ""
    return f"{path}: {len(problems)} {what}" + "".join(f"\n  {p}" for p in problems[:MAX_PROBLEMS]) + more


class _Problem(Exception):
    pass


def _parse(path: str, text: str) -> list[tuple[str, Any]]:
    """The file's entries, each with where it sits."""
    lowered = path.lower()
    stripped = text.lstrip()
    if lowered.endswith(".jsonl") or (not lowered.endswith((".json", ".yaml", ".yml")) and stripped.startswith("{")):
        return _parse_jsonl(path, text)
    if lowered.endswith(".json") or stripped.startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            if error.msg == "Extra data" and stripped.startswith("{"):
                return _parse_jsonl(path, text)  # JSON Lines saved as .json (a dataset's to_json() does that)
            raise TaskFileError(f"{path}: not valid JSON: {error}; a task file is a list of tasks") from None
        return [(f"index {i}", entry) for i, entry in enumerate(_as_list(path, data))]
    return _parse_yaml(path, text)


def _parse_jsonl(path: str, text: str) -> list[tuple[str, Any]]:
    entries = []
    lines = text.split("\n")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            entries.append((f"line {number}", json.loads(line)))
        except ValueError as error:
            torn = number == len(lines) and not text.endswith("\n")
            hint = " (the last line looks cut off)" if torn else ""
            raise TaskFileError(f"{path}: line {number}: not valid JSON{hint}: {error.msg}; JSONL holds one task object per line") from None
    return entries


def _parse_yaml(path: str, text: str) -> list[tuple[str, Any]]:
    import yaml

    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise TaskFileError(f"{path}: not valid YAML{where}: {getattr(error, 'problem', None) or error}") from None
    items = _as_list(path, data)
    lines = [item.start_mark.line + 1 for item in node.value] if isinstance(node, yaml.SequenceNode) else []
    if len(lines) != len(items):  # a {tasks: [...]} wrapper: fall back to entry numbers
        return [(f"entry {i + 1}", entry) for i, entry in enumerate(items)]
    return [(f"line {line}", entry) for line, entry in zip(lines, items)]


def _as_list(path: str, data: Any) -> list[Any]:
    if isinstance(data, dict) and isinstance(data.get("tasks"), list):
        return data["tasks"]
    if data is None:
        return []
    if not isinstance(data, list):
        raise TaskFileError(f"{path}: a task file is a list of tasks (or JSONL, one per line), not {type(data).__name__}")
    return data


def _task(where: str, entry: Any) -> Task:
    if not isinstance(entry, dict):
        raise _Problem(f"expected a mapping with `id` and `task`, got {type(entry).__name__} {str(entry)[:40]!r}")
    try:  # each task is written out on its own (its trajectory, its line of results.jsonl): bounded on its own
        json_values(entry)
    except NotJson as error:
        raise _Problem(str(error)) from None
    swebench = "instance_id" in entry
    if not swebench:
        unknown = [key for key in entry if key not in FIELDS]
        if unknown:
            close = difflib.get_close_matches(str(unknown[0]), FIELDS, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"known fields: {', '.join(FIELDS)}; free-form data goes in `metadata`"
            raise _Problem(f"{unknown[0]}: unknown field ({hint})")
    task_id = entry.get("id", entry.get("instance_id"))
    name = "id" if "id" in entry or not swebench else "instance_id"
    if task_id is None:
        raise _Problem("id: missing; add `id: <unique name>` (it names the task's folder and files)")
    if isinstance(task_id, int) and not isinstance(task_id, bool):
        task_id = str(task_id)
    if not isinstance(task_id, str) or not SAFE_ID.match(task_id):
        raise _Problem(
            f"{name}: {task_id!r} is not safe as a file name; use letters, digits, '.', '_' and '-' "
            "(starting with a letter or digit, at most 200 characters)"
        )
    if task_id.lower() in RESERVED_IDS:
        raise _Problem(f"{name}: {task_id!r} is the name of one of the run directory's own files; rename the task")
    text = entry.get("task", entry.get("problem_statement"))
    text_name = "task" if "task" in entry or not swebench else "problem_statement"
    if not isinstance(text, str) or not text.strip():
        raise _Problem(f"{text_name}: missing or empty; add `task: <what the agent should do>`")
    for key in MAPPINGS:
        if key in entry and entry[key] is not None and not isinstance(entry[key], dict):
            raise _Problem(f"{key}: expected a mapping (key: value), got {type(entry[key]).__name__}")
    cwd = entry.get("cwd") or ""
    if not isinstance(cwd, str):
        raise _Problem(f"cwd: expected a path, got {type(cwd).__name__}")
    metadata = dict(entry.get("metadata") or {})
    fields = dict(entry)
    if swebench:
        metadata.setdefault("swebench", {k: entry[k] for k in SWEBENCH_METADATA if k in entry})
        if not fields.get("image"):  # rows from before the datasets named their image: the harness's own name
            from miniswe.swebench.datasets import default_image

            fields["image"] = default_image(task_id)
    return Task(
        id=task_id, text=text, where=where, cwd=cwd,
        setup=_commands("setup", entry.get("setup")), evaluate=_commands("eval", entry.get("eval")),
        env=dict(entry.get("env") or {}), config=dict(entry.get("config") or {}), metadata=metadata,
        fields=fields, swebench=swebench,
    )


def _commands(key: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(c, str) and c.strip() for c in value):
        raise _Problem(f"{key}: expected a command or a list of commands (non-empty strings)")
    return tuple(value)
