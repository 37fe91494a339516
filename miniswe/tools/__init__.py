"""Native tool calls (protocol.kind: tools): the tools a run offers, their JSON schemas, and a reply's calls
read into actions, each a command to run or a format error with guidance.

Every call becomes a step. `bash` and `submit` are shell commands (`submit` is `echo MARKER`, followed by its
optional command, so a submission is taken exactly as the text protocol takes it); the file tools
(tools/files.py), `skill` and `subagent` are recorded with a readable rendering as their command and their
call's arguments in the step's `tool_call`.
"""

from __future__ import annotations

import difflib
import json
import shlex
from dataclasses import dataclass, field
from typing import Any

from miniswe.models import Reply, ToolCall
from miniswe.protocol import FormatError

BASH, SUBMIT, READ_FILE, WRITE_FILE, EDIT_FILE, SUBAGENT, SKILL = (
    "bash", "submit", "read_file", "write_file", "edit_file", "subagent", "skill")
FILE_TOOLS = (READ_FILE, WRITE_FILE, EDIT_FILE)
SHELL_TOOLS = (BASH, SUBMIT)  # whose command is shell: the command policy reads it, a submission may come of it


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


TOOLS = {tool.name: tool for tool in (
    Tool(BASH, "Run one shell command with bash -c in the working directory; you get its return code and output. "
               "Each call is a fresh shell: cd and export do not carry over.",
         {"command": Param("string", "The command to run.", required=True)}, {"command": "ls -la"}),
    Tool(SUBMIT, "Finish the task: call it alone, once the work is done and checked. The optional command's output "
                 "is what you submit (for example `git diff` for a patch).",
         {"command": Param("string", "A command whose output is the submission, e.g. git diff.")}, {"command": "git diff"}),
    Tool(READ_FILE, "Read a UTF-8 text file of the working directory, whole or a range of lines, up to max_chars "
                    "characters; a note at the end says how to read on.",
         {"path": Param("string", "File path, relative to the working directory.", required=True),
          "start_line": Param("integer", "First line to show (from 1; default 1)."),
          "end_line": Param("integer", "Last line to show (default: the end)."),
          "max_chars": Param("integer", "Characters to show at most (default and ceiling: the output limit)."),
          "numbered": Param("boolean", "Put each line's number before it (default false).")},
         {"path": "src/app.py", "start_line": 1, "end_line": 80}),
    Tool(WRITE_FILE, "Create or replace a text file of the working directory (its folders are created), or append to "
                     "it; at most 64 KiB per call (append the rest in further calls).",
         {"path": Param("string", "File path, relative to the working directory.", required=True),
          "content": Param("string", "The text to write.", required=True),
          "mode": Param("string", "overwrite (default) or append.", choices=("overwrite", "append"))},
         {"path": "notes.md", "content": "# Notes\n", "mode": "overwrite"}),
    Tool(EDIT_FILE, "Change a text file of the working directory: replace a unique piece of text (old -> new; all: "
                    "every occurrence), insert text after a line (0 = at the top), or delete a range of lines.",
         {"path": Param("string", "File path, relative to the working directory.", required=True),
          "action": Param("string", "replace, insert or delete.", required=True, choices=("replace", "insert", "delete")),
          "old": Param("string", "replace: the exact text to replace; it must occur once unless all is true."),
          "new": Param("string", "replace: the text to put in its place."),
          "all": Param("boolean", "replace: every occurrence (default false)."),
          "after_line": Param("integer", "insert: the line after which the text goes; 0 puts it at the top."),
          "text": Param("string", "insert: the lines to insert."),
          "start_line": Param("integer", "delete: the first line to delete (from 1)."),
          "end_line": Param("integer", "delete: the last line to delete (inclusive).")},
         {"path": "src/app.py", "action": "replace", "old": "retries = 1", "new": "retries = 3"}),
    Tool(SUBAGENT, "Delegate a self-contained piece of work to a sub-agent: it works in the same directory with what "
                   "is left of your budget, sees nothing of this conversation, and you get how it ended and what it "
                   "submitted. Describe the task fully.",
         {"task": Param("string", "The whole task, as you would give it to a colleague.", required=True)},
         {"task": "Make the tests in tests/test_parse.py pass without changing the tests."}),
    Tool(SKILL, "Read a skill listed in the system prompt (its SKILL.md), or one file of its folder.",
         {"name": Param("string", "The skill's name.", required=True),
          "file": Param("string", "A file of the skill's folder, relative to it (default: SKILL.md).")},
         {"name": "release-notes"}),
)}
# What each edit_file action needs besides path and action.
EDIT_NEEDS = {"replace": ("old", "new"), "insert": ("after_line", "text"), "delete": ("start_line", "end_line")}
_TYPES = {"string": str, "integer": int, "boolean": bool}


@dataclass(frozen=True)
class Action:
    """One thing a reply asked for: a call to run (or the text protocol's command), or a format error."""

    tool: str  # bash for the text protocol's command
    command: str | None  # the shell command, or a readable rendering of the call; None for a format error
    arguments: dict[str, Any] = field(default_factory=dict)
    call: ToolCall | None = None  # the tool call it answers (tools only)
    index: int = 0  # its place among the reply's calls
    error: FormatError | None = None

    def record(self) -> dict[str, Any] | None:
        """The step's `tool_call`."""
        if self.call is None:
            return None
        return {"id": self.call.id, "name": self.call.name, "arguments": self.call.arguments, "index": self.index}

    def as_bash(self, command: str) -> Action:
        """The same call running another command (a hook or a person rewrote it): a shell command now."""
        return Action(BASH, command, {"command": command}, self.call, self.index)


def read_calls(reply: Reply, offered: dict[str, Tool], submit_marker: str) -> list[Action]:
    """The actions of a tool-calling reply: one per call (each a command, or a format error), or one format error
    for a reply that called nothing."""
    if not reply.tool_calls:
        if reply.finish_reason == "length":
            return [Action(BASH, None, error=FormatError("truncated", "the reply was cut off at the token limit "
                                                                     "(finish_reason=length) before it called a tool"))]
        return [Action(BASH, None, error=FormatError("no_tool_call", "the reply called no tool"))]
    actions = []
    for index, call in enumerate(reply.tool_calls):
        try:
            if reply.finish_reason == "length":
                raise FormatError("truncated", "the reply was cut off at the token limit (finish_reason=length), "
                                               "so this call may be incomplete")
            arguments = parse_arguments(call, offered)
            actions.append(Action(call.name, render(call.name, arguments, submit_marker), arguments, call, index))
        except FormatError as error:
            actions.append(Action(call.name, None, call=call, index=index, error=error))
    return actions


def parse_arguments(call: ToolCall, offered: dict[str, Tool]) -> dict[str, Any]:
    """The call's arguments, checked against its tool's schema; FormatError naming what is wrong and showing
    well-formed arguments."""
    tool = offered.get(call.name)
    if tool is None:
        close = difflib.get_close_matches(call.name, list(offered), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise FormatError("unknown_tool", f"there is no tool {call.name!r} ({hint}the tools are {', '.join(offered)})")
    example = json.dumps(tool.example)
    text = call.arguments.strip()
    try:
        arguments = json.loads(text) if text else {}
    except ValueError as error:
        where = f" at character {error.pos}" if hasattr(error, "pos") else ""
        raise FormatError("bad_arguments", f"{tool.name}: its arguments are not valid JSON ({getattr(error, 'msg', error)}"
                                           f"{where}); send one JSON object, e.g. {example}") from None
    if not isinstance(arguments, dict):
        raise FormatError("bad_arguments", f"{tool.name}: its arguments must be a JSON object, not "
                                           f"{type(arguments).__name__}; e.g. {example}")
    for name, param in tool.params.items():
        value = arguments.get(name)
        if value is None:
            if param.required:
                raise FormatError("bad_arguments", f"{tool.name}: `{name}` is missing ({param.description}); e.g. {example}")
            continue
        expected = _TYPES[param.type]
        if param.type == "integer" and isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = arguments[name] = int(value)  # models often quote numbers: the intent is plain
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            raise FormatError("bad_arguments", f"{tool.name}: `{name}` must be {'an' if param.type == 'integer' else 'a'} "
                                               f"{param.type}, not {json.dumps(value)[:60]}; e.g. {example}")
        if param.choices and value not in param.choices:
            raise FormatError("bad_arguments", f"{tool.name}: `{name}` must be one of {', '.join(param.choices)}, "
                                               f"not {json.dumps(value)[:60]}")
    if tool.name == BASH and not arguments["command"].strip():
        raise FormatError("bad_arguments", f"bash: `command` is empty; e.g. {example}")
    if tool.name == EDIT_FILE:
        missing = [name for name in EDIT_NEEDS[arguments["action"]] if arguments.get(name) is None]
        if missing:
            raise FormatError("bad_arguments", f"edit_file: action {arguments['action']} needs "
                                               f"{' and '.join(f'`{name}`' for name in missing)}")
    if tool.name == SUBAGENT and not arguments["task"].strip():
        raise FormatError("bad_arguments", f"subagent: `task` is empty; e.g. {example}")
    return arguments


def render(tool: str, arguments: dict[str, Any], submit_marker: str) -> str:
    """What a step records as its command: the shell command itself for bash and submit, a readable line for the rest."""
    if tool == BASH:
        return arguments["command"]
    if tool == SUBMIT:
        command = (arguments.get("command") or "").strip()
        return f"echo {submit_marker} && {command}" if command else f"echo {submit_marker}"
    path = shlex.quote(str(arguments.get("path", "")))
    if tool == READ_FILE:
        start, end = arguments.get("start_line"), arguments.get("end_line")
        lines = f" (lines {start or 1}-{end if end is not None else 'end'})" if start or end is not None else ""
        return f"read_file {path}{lines}"
    if tool == WRITE_FILE:
        size = len(arguments["content"].encode("utf-8", "surrogatepass"))
        return f"write_file {path} ({size} bytes{', append' if arguments.get('mode') == 'append' else ''})"
    if tool == EDIT_FILE:
        action = arguments["action"]
        if action == "replace":
            what = f"replace {len(arguments['old'])} chars with {len(arguments['new'])}{' (all)' if arguments.get('all') else ''}"
        elif action == "insert":
            what = f"insert {len(arguments['text'])} chars after line {arguments['after_line']}"
        else:
            what = f"delete lines {arguments['start_line']}-{arguments['end_line']}"
        return f"edit_file {path}: {what}"
    if tool == SKILL:
        return " ".join(["skill", shlex.quote(arguments["name"]), *([shlex.quote(arguments["file"])] if arguments.get("file") else [])])
    if tool == SUBAGENT:
        lines = arguments["task"].strip().splitlines()
        more = "..." if len(lines[0]) > 200 or len(lines) > 1 else ""
        return f"subagent: {lines[0][:200]}{more}"
    return f"{tool} {json.dumps(arguments)[:200]}"
