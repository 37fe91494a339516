"""The text protocol: find the one action block in a model reply, and recognise a submission.

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

import re
from collections.abc import Sequence
from dataclasses import dataclass

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
