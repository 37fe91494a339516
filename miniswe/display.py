"""Showing a run as it happens: rich on a terminal, plain lines otherwise, or only the final line."""

from __future__ import annotations

import sys
from typing import Any

from miniswe.models import Reply

PREVIEW_LINES = 8


def thought_of(reply: str) -> str:
    """The prose before the first fence: what the model said it would do."""
    before, _, _ = reply.partition("```")
    return before.strip()


def trimmed(text: str, lines: int = PREVIEW_LINES) -> str:
    rows = text.rstrip("\n").splitlines()
    if len(rows) <= lines:
        return "\n".join(rows)
    half = lines // 2
    return "\n".join(rows[:half] + [f"... ({len(rows) - lines} more lines)"] + rows[-half:])


def summary_line(result: Any) -> str:
    data = result.trajectory.data
    usage = data["usage"]
    parts = [
        str(result.outcome.status),
        f"{len(result.trajectory.steps)} steps",
        f"{usage['total_tokens']:,} tokens",
        f"${usage['cost']:.4f}",
        f"{data['timing']['wall_s']:.1f}s",
        result.trajectory.path,
    ]
    if result.resolved is not None:
        parts.insert(1, "resolved" if result.resolved else "not resolved")
    return " · ".join(parts)


class PlainDisplay:
    def __init__(self, stream=None):
        self.stream = stream or sys.stdout

    def step(self, step: dict[str, Any], reply: Reply) -> None:
        out = self.stream
        thought = thought_of(reply.content)
        out.write(f"--- step {step['step']}\n")
        if thought:
            out.write(trimmed(thought, 4) + "\n")
        if step["format_error"]:
            out.write(f"! format error: {step['format_error']}\n")
        else:
            status = "timed out" if step["timed_out"] else f"rc={step['returncode']}"
            out.write(f"$ {step['command']}\n{trimmed(step['output'])}\n[{status} · {step['duration_s']:.2f}s]\n")
        out.flush()

    def final(self, line: str) -> None:
        print(line, file=self.stream, flush=True)


class RichDisplay:
    def __init__(self):
        from rich.console import Console

        self.console = Console(highlight=False)

    def step(self, step: dict[str, Any], reply: Reply) -> None:
        from rich.markup import escape

        console = self.console
        console.rule(f"step {step['step']}", style="dim")
        thought = thought_of(reply.content)
        if thought:
            console.print(escape(trimmed(thought, 6)), style="italic dim")
        if step["format_error"]:
            console.print(f"format error: {step['format_error']}", style="bold red")
            return
        console.print("$ " + escape(step["command"]), style="bold yellow")
        if step["output"].strip():
            console.print(escape(trimmed(step["output"])))
        ok = step["returncode"] == 0
        status = "timed out" if step["timed_out"] else f"rc={step['returncode']}"
        console.print(f"[{'green' if ok else 'red'}]{status}[/] [dim]· {step['duration_s']:.2f}s[/]")

    def final(self, line: str) -> None:
        self.console.print(line, style="bold", soft_wrap=True)


class QuietDisplay:
    step = None

    def final(self, line: str) -> None:
        print(line, flush=True)


def make_display(quiet: bool) -> Any:
    if quiet:
        return QuietDisplay()
    if sys.stdout.isatty():
        return RichDisplay()
    return PlainDisplay()
