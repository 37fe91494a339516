"""The chat console: what the person sees of a turn, in a quiet palette. A hook (miniswe/hooks.py) plus the
stream's `delta` callback; it writes to the terminal only, so none of it reaches the model or the trajectory.
No colour when stdout is not a terminal or NO_COLOR is set."""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO

from miniswe.protocol import HUMAN_THOUGHT
from miniswe.display import step_status, trimmed
from miniswe.output import PieceMasker, visible
from miniswe.status import ExitStatus, Outcome

# ANSI SGR codes of each kind of line
PALETTE = {
    "pending": "1;2",  # the request in flight: darkened bold
    "marker": "36",  # reasoning markers: cyan
    "reasoning": "2",  # reasoning text: dim
    "command": "33",  # command traces: yellow
    "result": "32",  # a result's header: green
    "body": "2",  # a result's output: dim
    "error": "31",  # errors, failed results, retries: red
    "note": "2",  # notices
    "ok": "1;32",
}
PENDING = "...requesting..."
REASONING_START = "--- reasoning ---"
REASONING_END = "--- end of reasoning ---"
OUTPUT_LINES = 12


def use_color(stream: TextIO) -> bool:
    try:
        return stream.isatty() and not os.environ.get("NO_COLOR")
    except ValueError:
        return False


class Console:
    def __init__(self, out: TextIO | None = None, color: bool | None = None):
        self.out = out or sys.stdout
        self.color = use_color(self.out) if color is None else color
        self.tty = _isatty(self.out)
        self._pending = False  # the pending status is on screen (and the cursor after it)
        self._streamed = False  # this reply came as deltas
        self._mid_stream = False  # deltas came and the reply (or a cut) has not yet
        self._in_reasoning = False
        self._column = 0  # where the cursor is on the line the stream writes (0: at the start)
        # a streamed reply is masked across its pieces: the end of a piece that may begin a secret waits for the
        # next piece (or the end of the stream), shown in the palette it came in
        self._masker = PieceMasker()
        self._held_kind: str | None = None

    # -- painting --------------------------------------------------------------------------------------------
    def paint(self, kind: str, text: str) -> str:
        if not self.color or not text:
            return text
        return f"\033[{PALETTE[kind]}m{text}\033[0m"

    def write(self, text: str, kind: str | None = None) -> None:
        """Every text chat shows (replies, streamed deltas, commands, outputs, notices) passes here, made
        `visible` before miniswe's own colours are added."""
        self._release()
        self._put(text, kind)

    def _put(self, text: str, kind: str | None = None) -> None:
        self._clear_pending()
        text = visible(text)
        self.out.write(self.paint(kind, text) if kind else text)
        if text:
            self._column = 0 if text.endswith("\n") else self._column + len(text)
        self.out.flush()

    def line(self, text: str, kind: str | None = None) -> None:
        self._newline()
        self.write(text + "\n", kind)

    def notice(self, message: str) -> None:
        self._cut()  # a retry starts the stream over
        self._in_reasoning = False
        kind = "error" if ("retry" in message or "warning" in message or "error" in message) else "note"
        self.line(f"miniswe: {message}", kind)

    def _cut(self) -> None:
        """A stream that ends without its reply (cut off, to be retried, or stopped): its partial line says so."""
        if self._mid_stream:
            self._mid_stream = self._in_reasoning = False
            self._masker.held = ""  # what may begin a secret is not shown half: a retry shows it whole
            self._put(" [cut off]" if self._column else "[cut off]", "error")

    def _newline(self) -> None:
        self._release()
        if self._column:
            self.write("\n")

    def _clear_pending(self) -> None:
        if self._pending:
            self._pending = False
            self.out.write("\r\033[K")

    # -- the stream ------------------------------------------------------------------------------------------
    def delta(self, kind: str, text: str) -> None:
        self._streamed = self._mid_stream = True
        if kind == "reasoning":
            if not self._in_reasoning:
                self.line(REASONING_START, "marker")
                self._in_reasoning = True
            shown = "reasoning"
        else:
            self._end_reasoning()
            shown = None
        self._held_kind = shown
        self._put(self._masker.feed(text), shown)

    def _release(self) -> None:
        """Show what the masker held back of the stream (its end: whatever comes next is no part of it)."""
        if self._masker.held:
            self._put(self._masker.flush(), self._held_kind)

    def _end_reasoning(self) -> None:
        if self._in_reasoning:
            self._in_reasoning = False
            self.line(REASONING_END, "marker")

    # -- hooks -----------------------------------------------------------------------------------------------
    def before_model_call(self, event: Any) -> None:
        self._release()
        self._streamed = self._mid_stream = False
        if self.tty:
            self._newline()
            self.out.write(self.paint("pending", PENDING))
            self.out.flush()
            self._pending = True

    def after_reply(self, event: Any) -> None:
        reply = event.reply
        self._mid_stream = False
        self._release()
        self._clear_pending()
        if reply.content.startswith(HUMAN_THOUGHT):
            return  # the person typed it: nothing to show
        if self._streamed:
            self._end_reasoning()
            self._newline()
            return
        if reply.reasoning:
            self.line(REASONING_START, "marker")
            self.line(reply.reasoning.strip("\n"), "reasoning")
            self.line(REASONING_END, "marker")
        from miniswe.protocol import thought_of

        thought = thought_of(reply.content) if reply.finish_reason != "length" else reply.content
        if thought.strip():
            self.line(thought.strip("\n"))

    def before_command(self, event: Any) -> None:
        if event.thought != HUMAN_THOUGHT:
            self.line("$ " + event.command, "command")

    def after_command(self, event: Any) -> None:
        step = event.step
        if step.format_error:
            self.line(f"format error ({step.format_error}): the model is told how to answer", "error")
            return
        if step.refused:
            self.line(f"refused: {step.refused}", "error")
            return
        if step.proposed:
            self.line("ran instead: $ " + (step.command or ""), "command")
        ok = step.returncode == 0 and not step.aborted
        self.line(f"[{step_status(step)} · {step.duration_s:.2f}s]", "result" if ok else "error")
        if step.output.strip():
            self.line(trimmed(step.output, OUTPUT_LINES), "body")

    def outcome(self, outcome: Outcome | None, usage: Any, steps: int) -> None:
        """The end of a turn: how it ended and what it cost."""
        self._cut()
        if outcome is None:
            return
        cost = f"{steps} step{'s' if steps != 1 else ''} · {usage.total_tokens:,} tokens · ${usage.cost:.4f}"
        if outcome.status is ExitStatus.SUBMITTED:
            text = "done (submitted)" + (f": {trimmed(outcome.submission, 4)}" if (outcome.submission or "").strip() else "")
            self.line(f"{text}  [{cost}]", "ok")
        else:
            detail = (outcome.detail or "").strip().splitlines()[-1:] or [""]
            self.line(f"{outcome.status}{': ' + detail[0] if detail[0] else ''}  [{cost}]", "error")


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except ValueError:
        return False
