"""The tools a run's model may call, and the toolbox the agent runs every action through.

Each tool owns its definition (the JSON schema the tools protocol offers), its own argument checks, the readable
line a step records as its command, and what running it does. `bash` and `submit` are shell commands (`submit`
is `echo MARKER`, then its optional command, so a submission is taken as the text protocol takes it); the file
tools run a stdlib worker where commands run (tools/files.py); `skill` reads a skill here; `subagent` hands a task
to a child run (miniswe/subagents.py). The agent calls `Toolbox.run` and names no tool: a new tool is a class
here and a line in `Toolbox.__init__`.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import time
from dataclasses import dataclass
from typing import Any

from miniswe.environments import CommandResult
from miniswe.protocol import BASH, SUBMIT, Action
from miniswe.tools import files

READ_FILE, WRITE_FILE, EDIT_FILE, SUBAGENT, SKILL = "read_file", "write_file", "edit_file", "subagent", "skill"
FILE_TOOLS = (READ_FILE, WRITE_FILE, EDIT_FILE)
# What each edit_file action needs besides path and action.
EDIT_NEEDS = {"replace": ("old", "new"), "insert": ("after_line", "text"), "delete": ("start_line", "end_line")}


@dataclass(frozen=True)
class Param:
    type: str  # a JSON schema type: string, integer, boolean
    description: str
    required: bool = False
    choices: tuple[str, ...] = ()


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    params: dict[str, Param]
    example: dict[str, Any]  # well-formed arguments, shown when the model's are not

    def definition(self) -> dict[str, Any]:
        """The OpenAI function definition sent with every request."""
        properties = {}
        for name, param in self.params.items():
            properties[name] = {"type": param.type, "description": param.description}
            if param.choices:
                properties[name]["enum"] = list(param.choices)
        return {"type": "function", "function": {
            "name": self.name, "description": self.description,
            "parameters": {"type": "object", "properties": properties,
                           "required": [name for name, param in self.params.items() if param.required]}}}

    def check(self, arguments: dict[str, Any]) -> str | None:
        """What is wrong with well-typed arguments, if anything (told to the model as a format error)."""
        return None

    def render(self, arguments: dict[str, Any], submit_marker: str) -> str:
        """What a step records as its command."""
        return f"{self.name} {json.dumps(arguments)[:200]}"

    def run(self, action: Action, timeout: float, box: Toolbox) -> CommandResult:
        return box.shell(action.command or "", timeout)


class Bash(Tool):
    def check(self, arguments: dict[str, Any]) -> str | None:
        return None if arguments["command"].strip() else f"bash: `command` is empty; e.g. {json.dumps(self.example)}"

    def render(self, arguments: dict[str, Any], submit_marker: str) -> str:
        return arguments["command"]


class Submit(Tool):
    def render(self, arguments: dict[str, Any], submit_marker: str) -> str:
        command = (arguments.get("command") or "").strip()
        return f"echo {submit_marker} && {command}" if command else f"echo {submit_marker}"


class FileTool(Tool):
    def check(self, arguments: dict[str, Any]) -> str | None:
        if self.name != EDIT_FILE:
            return None
        missing = [name for name in EDIT_NEEDS[arguments["action"]] if arguments.get(name) is None]
        return (f"edit_file: action {arguments['action']} needs {' and '.join(f'`{name}`' for name in missing)}"
                if missing else None)

    def render(self, arguments: dict[str, Any], submit_marker: str) -> str:
        path = shlex.quote(str(arguments.get("path", "")))
        if self.name == READ_FILE:
            start, end = arguments.get("start_line"), arguments.get("end_line")
            lines = f" (lines {start or 1}-{end if end is not None else 'end'})" if start or end is not None else ""
            return f"read_file {path}{lines}"
        if self.name == WRITE_FILE:
            size = len(arguments["content"].encode("utf-8", "surrogatepass"))
            return f"write_file {path} ({size} bytes{', append' if arguments.get('mode') == 'append' else ''})"
        action = arguments["action"]
        if action == "replace":
            what = f"replace {len(arguments['old'])} chars with {len(arguments['new'])}{' (all)' if arguments.get('all') else ''}"
        elif action == "insert":
            what = f"insert {len(arguments['text'])} chars after line {arguments['after_line']}"
        else:
            what = f"delete lines {arguments['start_line']}-{arguments['end_line']}"
        return f"edit_file {path}: {what}"

    def run(self, action: Action, timeout: float, box: Toolbox) -> CommandResult:
        refused = files.too_large(self.name, action.arguments)
        if refused:
            return CommandResult(refused, 1, False, 0.0, len(refused))
        config = box.config
        command = files.worker_command(self.name, action.arguments, max_chars=files.read_limit(config),
                                       python=files.python_for(config.environment.kind))
        result = box.shell(command, timeout)
        return dataclasses.replace(result, output=files.explain_failure(result.output, result.returncode))


class SkillTool(Tool):
    def render(self, arguments: dict[str, Any], submit_marker: str) -> str:
        file = [shlex.quote(arguments["file"])] if arguments.get("file") else []
        return " ".join(["skill", shlex.quote(arguments["name"]), *file])

    def run(self, action: Action, timeout: float, box: Toolbox) -> CommandResult:
        from miniswe.skills import SkillError, read_skill

        started = time.monotonic()
        try:
            text, code = read_skill(box.skills, action.arguments["name"], action.arguments.get("file") or ""), 0
        except SkillError as error:
            text, code = f"error: {error}", 1
        return CommandResult(text, code, False, time.monotonic() - started, len(text))


class SubagentTool(Tool):
    def check(self, arguments: dict[str, Any]) -> str | None:
        return None if arguments["task"].strip() else f"subagent: `task` is empty; e.g. {json.dumps(self.example)}"

    def render(self, arguments: dict[str, Any], submit_marker: str) -> str:
        lines = arguments["task"].strip().splitlines()
        more = "..." if len(lines[0]) > 200 or len(lines) > 1 else ""
        return f"subagent: {lines[0][:200]}{more}"

    def run(self, action: Action, timeout: float, box: Toolbox) -> CommandResult:
        from miniswe.subagents import summary

        started = time.monotonic()
        text, code = summary(box.delegation.run(action.arguments["task"], env=box.env))
        return CommandResult(text, code, False, time.monotonic() - started, len(text))


_PATH = Param("string", "File path, relative to the working directory.", required=True)
TOOLS: dict[str, Tool] = {tool.name: tool for tool in (
    Bash(BASH, "Run one shell command with bash -c in the working directory; you get its return code and output. "
               "Each call is a fresh shell: cd and export do not carry over.",
         {"command": Param("string", "The command to run.", required=True)}, {"command": "ls -la"}),
    Submit(SUBMIT, "Finish the task: call it alone, once the work is done and checked. The optional command's output "
                   "is what you submit (for example `git diff` for a patch).",
           {"command": Param("string", "A command whose output is the submission, e.g. git diff.")}, {"command": "git diff"}),
    FileTool(READ_FILE, "Read a UTF-8 text file of the working directory, whole or a range of lines, up to max_chars "
                        "characters; a note at the end says how to read on.",
             {"path": _PATH,
              "start_line": Param("integer", "First line to show (from 1; default 1)."),
              "end_line": Param("integer", "Last line to show (default: the end)."),
              "max_chars": Param("integer", "Characters to show at most (default and ceiling: the output limit)."),
              "numbered": Param("boolean", "Put each line's number before it (default false).")},
             {"path": "src/app.py", "start_line": 1, "end_line": 80}),
    FileTool(WRITE_FILE, "Create or replace a text file of the working directory (its folders are created), or append "
                         "to it; at most 64 KiB per call (append the rest in further calls).",
             {"path": _PATH,
              "content": Param("string", "The text to write.", required=True),
              "mode": Param("string", "overwrite (default) or append.", choices=("overwrite", "append"))},
             {"path": "notes.md", "content": "# Notes\n", "mode": "overwrite"}),
    FileTool(EDIT_FILE, "Change a text file of the working directory: replace a unique piece of text (old -> new; all: "
                        "every occurrence), insert text after a line (0 = at the top), or delete a range of lines.",
             {"path": _PATH,
              "action": Param("string", "replace, insert or delete.", required=True, choices=("replace", "insert", "delete")),
              "old": Param("string", "replace: the exact text to replace; it must occur once unless all is true."),
              "new": Param("string", "replace: the text to put in its place."),
              "all": Param("boolean", "replace: every occurrence (default false)."),
              "after_line": Param("integer", "insert: the line after which the text goes; 0 puts it at the top."),
              "text": Param("string", "insert: the lines to insert."),
              "start_line": Param("integer", "delete: the first line to delete (from 1)."),
              "end_line": Param("integer", "delete: the last line to delete (inclusive).")},
             {"path": "src/app.py", "action": "replace", "old": "retries = 1", "new": "retries = 3"}),
    SubagentTool(SUBAGENT, "Delegate a self-contained piece of work to a sub-agent: it works in the same directory with "
                           "what is left of your budget, sees nothing of this conversation, and you get how it ended and "
                           "what it submitted. Describe the task fully.",
                 {"task": Param("string", "The whole task, as you would give it to a colleague.", required=True)},
                 {"task": "Make the tests in tests/test_parse.py pass without changing the tests."}),
    SkillTool(SKILL, "Read a skill listed in the system prompt (its SKILL.md), or one file of its folder.",
              {"name": Param("string", "The skill's name.", required=True),
               "file": Param("string", "A file of the skill's folder, relative to it (default: SKILL.md).")},
              {"name": "release-notes"}),
)}


class Toolbox:
    """A run's tools: which it offers (bash and submit always; the file tools with protocol.file_tools; skill when
    there are skills to read; subagent when the run may delegate) and how an action runs. Every shell command
    runs in the run's environment, cancelled by its stop; with sub-agents, a step's children are collected
    around each action (a text-protocol command may ask for them through `miniswe run --sub`)."""

    def __init__(self, config: Any, env: Any, stop: Any, *, skills: list[Any] = (), delegation: Any = None):
        self.config, self.env, self.stop = config, env, stop
        self.skills = list(skills)
        self.delegation = delegation
        names = [BASH, SUBMIT]
        if config.protocol.file_tools:
            names += FILE_TOOLS
        if self.skills:
            names.append(SKILL)
        if delegation is not None:
            names.append(SUBAGENT)
        self.offered = {name: TOOLS[name] for name in names}

    def run(self, number: int, action: Action, timeout: float) -> tuple[CommandResult, list[dict[str, Any]]]:
        """Run one action (a command or a tool call); its result and the sub-agents it ran."""
        tool = self.offered.get(action.tool) or TOOLS[BASH]
        delegation = self.delegation
        if delegation is None:
            return tool.run(action, timeout, self), []
        delegation.begin(number, timeout)
        try:
            result = tool.run(action, timeout, self)
        except BaseException:
            delegation.end()
            raise
        return result, delegation.end()

    def shell(self, command: str, timeout: float) -> CommandResult:
        with self.stop.cancelling(self.env.interrupt):
            return self.env.execute(command, timeout=timeout)
