"""How the loop and the model talk (`protocol.kind`): what a reply is, how it becomes actions, what a request
carries, how an observation answers. The agent asks its protocol and is otherwise the same loop for both kinds:

- text (the default): the reply holds one fenced command; the observation is a user message.
- tools: each request offers the run's tools; each call of a reply is an action and a step of its own; each
  observation is a `tool` message answering its call by `tool_call_id`, and a reply that called nothing is
  answered by a user message.

Reading the one action block of a text reply, and recognising a submission:

Decisions on what real replies contain (each covered in tests/test_protocol.py):
- Fences follow CommonMark: up to 3 spaces of indent, ``` or ~~~ (3 or more), info string's first
  word names the language (case-insensitive); a closing fence uses the same character, at least as
  many of them, and nothing but spaces after. CRLF and trailing spaces are fine.
- Only blocks tagged with an action tag are actions; python/diff/untagged blocks are quotes and ignored.
- A fence in the middle of a sentence is not a fence (it does not start the line).
- Inside an action block, lines of a heredoc body are content even when they look like a closing
  fence, so a model can write Markdown with ``` through `cat <<'EOF'`. If the heredoc never ends,
  the block is read again strictly by CommonMark.
- A closing fence glued to the end of the last command line (`ls```) closes the block when no
  proper closing fence follows; the backticks are removed from the command.
- Text after the closing fence is ignored (it may not hold a second action).
- A block left open at the end of the reply (cut off) is an error: running half a command is worse
  than asking again.
- Non-ASCII characters are kept as written; zero-width spaces, word joiners and BOMs are removed
  from the command, since they only ever break it invisibly.
- Leading reasoning (`<think>...</think>` at the start, or text up to the first `</think>` outside a
  code block) is kept in the trajectory but not parsed; `<think>` inside a command is left alone.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from miniswe.usage import Usage

DEFAULT_ACTION_TAGS = ("mswea_bash_command", "bash")
DEFAULT_SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"

_FENCE_LINE = re.compile(r"^ {0,3}((`{3,}|~{3,}))")
_HEREDOC = re.compile(r"(?<!<)<<(-?)[ \t]*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\2")
_INVISIBLE = dict.fromkeys(map(ord, "\u200b\u2060\ufeff"))


class FormatError(Exception):
    """A reply that does not hold exactly one runnable action. `kind` names the case for templates."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class _Block:
    tag: str
    lines: list[str]
    closed: bool


def strip_reasoning(text: str) -> str:
    """The reply without its leading reasoning: `<think>...</think>` at the start, or everything up to the
    first `</think>` outside a code block (servers that drop the opening tag). `<think>` inside a command
    (`grep '<think>' src/`) is the command's business and stays."""
    stripped = text.lstrip()
    if stripped.startswith("<think>"):
        end = stripped.find("</think>")
        return "" if end < 0 else stripped[end + len("</think>") :]
    end = _find_outside_fences(text, "</think>")
    return text if end < 0 else text[end + len("</think>") :]


def _find_outside_fences(text: str, token: str) -> int:
    fence = None
    offset = 0
    for line in text.split("\n"):
        marker = _FENCE_LINE.match(line)
        if fence is None:
            if token in line:
                return offset + line.index(token)
            if marker:
                fence = marker[2]
        elif marker and marker[2].startswith(fence) and not line.strip().lstrip(fence[0]):
            fence = None
        offset += len(line) + 1
    return -1


def parse_command(text: str, action_tags: Sequence[str] = DEFAULT_ACTION_TAGS) -> str:
    """The command of the single action block in `text`; FormatError otherwise."""
    text = strip_reasoning(text or "").replace("\r\n", "\n").replace("\r", "\n").translate(_INVISIBLE)
    if not text.strip():
        raise FormatError("empty_reply", "the reply was empty")
    tags = {tag.lower() for tag in action_tags}
    lines = text.split("\n")
    actions = [block for block in _blocks(lines, heredocs=True) if block.tag in tags]
    if any(not block.closed for block in actions):
        strict = [block for block in _blocks(lines, heredocs=False) if block.tag in tags]
        if all(block.closed for block in strict):
            actions = strict
    if not actions:
        raise FormatError("no_action", "the reply has no ```bash block")
    if len(actions) > 1:
        raise FormatError("several_actions", f"the reply has {len(actions)} ```bash blocks; exactly one is allowed")
    block = actions[0]
    if not block.closed:
        block = _glued_close(block)
    if not block.closed:
        raise FormatError("unclosed", "the ```bash block is never closed (was the reply cut off?)")
    command = "\n".join(block.lines).strip("\n")
    if not command.strip():
        raise FormatError("empty_action", "the ```bash block is empty")
    return command


def _blocks(lines: list[str], *, heredocs: bool) -> list[_Block]:
    blocks = []
    i = 0
    while i < len(lines):
        opening = _opening(lines[i])
        i += 1
        if not opening:
            continue
        indent, fence, tag = opening
        closing = re.compile(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        body: list[str] = []
        pending: list[tuple[str, bool]] = []  # heredoc delimiters still open, with their <<- flag
        closed = False
        while i < len(lines):
            line = lines[i]
            i += 1
            if pending:
                delimiter, dash = pending[0]
                if (line.lstrip("\t") if dash else line) == delimiter:
                    pending.pop(0)
            elif closing.match(line):
                closed = True
                break
            elif heredocs:
                pending = [(m[3], m[1] == "-") for m in _HEREDOC.finditer(line)]
            body.append(_dedent(line, indent) if indent else line)
        blocks.append(_Block(tag, body, closed))
    return blocks


def _opening(line: str) -> tuple[int, str, str] | None:
    """(indent, fence, tag) of an opening fence line, else None. Plain string scans, no regex: every line of
    a reply passes here, and a backtracking pattern makes a long line of backticks and letters quadratic."""
    stripped = line.lstrip(" ")
    indent = len(line) - len(stripped)
    if indent > 3 or not stripped.startswith(("```", "~~~")):
        return None
    char = stripped[0]
    info = stripped.lstrip(char)
    if "`" in info:
        return None  # CommonMark: a backtick fence's info string may not contain backticks (nor may ours)
    words = info.split()
    return indent, stripped[: len(stripped) - len(info)], words[0].lower() if words else ""


def _dedent(line: str, indent: int) -> str:
    stripped = len(line) - len(line.lstrip(" "))
    return line[min(indent, stripped) :]


def _glued_close(block: _Block) -> _Block:
    lines = list(block.lines)
    while lines and not lines[-1].strip():
        lines.pop()
    if lines:
        last = lines[-1].rstrip(" \t")
        command = last.rstrip("`")
        if len(last) - len(command) >= 3 and command and not command[-1].isspace():
            return _Block(block.tag, lines[:-1] + [command], True)
    return block


def thought_of(reply: str) -> str:
    """The prose of a reply before its first fence, reasoning left out: what the model said it would do."""
    text = strip_reasoning(reply or "").replace("\r\n", "\n")
    lines = text.split("\n")
    for index, line in enumerate(lines):
        if _FENCE_LINE.match(line):
            lines = lines[:index]
            break
    return "\n".join(lines).strip()


def submission(output: str, returncode: int | None, marker: str = DEFAULT_SUBMIT_MARKER) -> str | None:
    """The submitted text when a command's output starts with the submit marker and it exited 0."""
    if returncode != 0:
        return None
    first, _, rest = output.partition("\n")
    if first.strip() != marker:
        return None
    return rest


# -- what a model call returns --------------------------------------------------------------------------------
@dataclass(frozen=True)
class ToolCall:
    """One native tool call of a reply (protocol.kind: tools): `arguments` is the JSON text the model wrote,
    unparsed, so a malformed one can be shown back to it."""

    id: str
    name: str
    arguments: str

    def to_wire(self) -> dict[str, Any]:
        """The call as an assistant message carries it (OpenAI's shape)."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}

    @classmethod
    def from_wire(cls, data: Any, index: int = 0) -> ToolCall:
        """A call as an endpoint or a trajectory gives it; missing parts become empty text (the parser says so)."""
        data = data if isinstance(data, dict) else {}
        function = data.get("function") if isinstance(data.get("function"), dict) else {}
        arguments = function.get("arguments")
        if not isinstance(arguments, str):  # some servers send the object itself
            arguments = "" if arguments is None else json.dumps(arguments)
        return cls(str(data.get("id") or f"call_{index + 1}"), str(function.get("name") or ""), arguments)


@dataclass
class Reply:
    content: str
    reasoning: str | None = None
    finish_reason: str | None = None
    usage: Usage = field(default_factory=lambda: Usage(model_calls=1))
    latency_s: float = 0.0
    warnings: list[str] = field(default_factory=list)  # what was wrong with the answer but not fatal (odd usage figures)
    tool_calls: list[ToolCall] = field(default_factory=list)  # native tool calls (protocol.kind: tools)


# -- a reply as actions -----------------------------------------------------------------------------------------
BASH, SUBMIT = "bash", "submit"  # the shell tools: their command is shell, a submission may come of it
SHELL_TOOLS = (BASH, SUBMIT)
# What the model sees before a command the person typed in chat's human mode, in place of its own thought.
HUMAN_THOUGHT = "THOUGHT: (the person typed this command and ran it themselves)"
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


class TextProtocol:
    kind = "text"

    def __init__(self, config: Any, offered: dict[str, Any] | None = None):
        self.action_tags = config.protocol.action_tags
        self.submit_marker = config.protocol.submit_marker
        self.offered = offered or {}  # the tools a tools protocol offers, by name (see miniswe/tools)

    @property
    def tools(self) -> tuple[str, ...]:
        return tuple(self.offered) if self.kind == "tools" else ()

    def request(self) -> dict[str, Any]:
        """What every model call carries besides the messages."""
        return {}

    def assistant(self, reply: Reply) -> dict[str, Any]:
        return {"role": "assistant", "content": reply.content}

    def actions(self, reply: Reply) -> list[Action]:
        try:
            if reply.finish_reason == "length":
                raise FormatError("truncated", "the reply was cut off at the token limit (finish_reason=length)")
            return [Action(BASH, parse_command(reply.content, self.action_tags))]
        except FormatError as error:
            return [Action(BASH, None, error=error)]

    def typed(self, command: str, number: int) -> tuple[Reply, Action]:
        """A command the person typed, as the model's reply it stands for, and its action."""
        fence = "`" * max(3, _longest_run(command, "`") + 1)
        reply = Reply(content=f"{HUMAN_THOUGHT}\n\n{fence}{self.action_tags[0]}\n{command}\n{fence}")
        reply.usage.model_calls = 0
        return reply, Action(BASH, command)


class ToolProtocol(TextProtocol):
    kind = "tools"

    def __init__(self, config: Any, offered: dict[str, Any]):
        super().__init__(config, offered)
        self._definitions = [tool.definition() for tool in offered.values()]

    def request(self) -> dict[str, Any]:
        return {"tools": self._definitions}

    def assistant(self, reply: Reply) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if reply.tool_calls:
            message["tool_calls"] = [call.to_wire() for call in reply.tool_calls]
        return message

    def actions(self, reply: Reply) -> list[Action]:
        return read_calls(reply, self.offered, self.submit_marker)

    def typed(self, command: str, number: int) -> tuple[Reply, Action]:
        call = ToolCall(f"typed_{number}", BASH, json.dumps({"command": command}))
        reply = Reply(content=HUMAN_THOUGHT, tool_calls=[call])
        reply.usage.model_calls = 0
        return reply, Action(BASH, command, {"command": command}, call, 0)


def make_protocol(config: Any, offered: dict[str, Any]) -> TextProtocol:
    """The run's protocol; `offered`: the tools a tools protocol offers, by name (miniswe.tools.Tool each)."""
    return ToolProtocol(config, offered) if config.protocol.kind == "tools" else TextProtocol(config)


def _longest_run(text: str, char: str) -> int:
    longest = run = 0
    for c in text:
        run = run + 1 if c == char else 0
        longest = max(longest, run)
    return longest


def read_calls(reply: Reply, offered: dict[str, Any], submit_marker: str) -> list[Action]:
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
            command = offered[call.name].render(arguments, submit_marker)
            actions.append(Action(call.name, command, arguments, call, index))
        except FormatError as error:
            actions.append(Action(call.name, None, call=call, index=index, error=error))
    return actions


def parse_arguments(call: ToolCall, offered: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments, checked against its tool's schema (and the tool's own `check`); FormatError naming
    what is wrong and showing well-formed arguments."""
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
    problem = tool.check(arguments)
    if problem:
        raise FormatError("bad_arguments", problem)
    return arguments


def answer(step: Any, text: str) -> dict[str, Any]:
    """The message that tells the model how a step went: a tool message answering its call, or a user message."""
    if step.tool_call:
        return {"role": "tool", "tool_call_id": step.tool_call["id"], "content": text}
    return {"role": "user", "content": text}


def unanswered(messages: list[dict[str, Any]]) -> list[str]:
    """The ids of the last reply's tool calls that no tool message answers yet (the run ended, or stopped, before
    them): every call must be answered before the model is asked again."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.get("role") == "assistant":
            answered = {m.get("tool_call_id") for m in messages[index + 1:] if m.get("role") == "tool"}
            return [call["id"] for call in message.get("tool_calls") or () if call.get("id") not in answered]
    return []
