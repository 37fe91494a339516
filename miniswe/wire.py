"""How the loop and the model talk (`protocol.kind`): what a request carries, how a reply becomes actions, how an
observation answers. The Agent asks its wire and is otherwise the same loop for both.

- text (the default): the reply holds one fenced command (protocol.py); the observation is a user message.
- tools: each request offers the tools (bash, submit, and those the run enables); each call of a reply is an
  action and a step of its own; each observation is a `tool` message answering its call by `tool_call_id`,
  and a reply that called nothing is answered by a user message.
"""

from __future__ import annotations

import json
from typing import Any

from miniswe.models import Reply, ToolCall
from miniswe.protocol import FormatError, parse_command
from miniswe.tools import BASH, EDIT_FILE, READ_FILE, SKILL, SUBAGENT, SUBMIT, TOOLS, WRITE_FILE, Action, read_calls
from miniswe.trajectory import Step

# What the model sees before a command the person typed in chat's human mode, in place of its own thought.
HUMAN_THOUGHT = "THOUGHT: (the person typed this command and ran it themselves)"


def _longest_run(text: str, char: str) -> int:
    longest = run = 0
    for c in text:
        run = run + 1 if c == char else 0
        longest = max(longest, run)
    return longest


class TextWire:
    kind = "text"
    tools: tuple[str, ...] = ()

    def __init__(self, config: Any):
        self.action_tags = config.protocol.action_tags

    def request(self) -> dict[str, Any]:
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


class ToolWire(TextWire):
    kind = "tools"

    def __init__(self, config: Any, tools: tuple[str, ...]):
        super().__init__(config)
        self.tools = tools
        self.offered = {name: TOOLS[name] for name in tools}
        self.submit_marker = config.protocol.submit_marker
        self._definitions = [tool.definition() for tool in self.offered.values()]

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


def make_wire(config: Any, *, skills: bool = False, subagents: bool = False) -> TextWire:
    if config.protocol.kind != "tools":
        return TextWire(config)
    tools = [BASH, SUBMIT]
    if config.protocol.file_tools:
        tools += [READ_FILE, WRITE_FILE, EDIT_FILE]
    if skills:
        tools.append(SKILL)
    if subagents:
        tools.append(SUBAGENT)
    return ToolWire(config, tuple(tools))


def answer(step: Step, text: str) -> dict[str, Any]:
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
