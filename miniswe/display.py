"""Showing a run's steps: rich on a terminal, plain lines otherwise, or nothing but the final line.

A display takes recorded Steps, so it shows a live run and a finished trajectory alike. Steps and notices
are progress (stderr); the final line is the run's data (stdout).
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from miniswe.output import visible
from miniswe.trajectory import Step, Trajectory

PREVIEW_LINES = 8


def trimmed(text: str, lines: int = PREVIEW_LINES) -> str:
    rows = text.rstrip("\n").splitlines()
    if len(rows) <= lines:
        return "\n".join(rows)
    half = lines // 2
    return "\n".join(rows[:half] + [f"... ({len(rows) - lines} more lines)"] + rows[-half:])


def summary_line(trajectory: Trajectory, resolved: bool | None = None) -> str:
    usage = trajectory.usage
    parts = [
        trajectory.exit_status or "unfinished",
        f"{len(trajectory.steps)} steps",
        f"{usage.total_tokens:,} tokens",
        f"${usage.cost:.4f}",
        f"{trajectory.wall_s or 0:.1f}s",
        trajectory.path,
    ]
    if resolved is not None:
        parts.insert(1, "resolved" if resolved else "not resolved")
    return " · ".join(parts)


def step_status(step: Step) -> str:
    """How a step ended, in a few words: a format error, a refused or cut-short command, a timeout, or its return code."""
    if step.format_error:
        return f"format error ({step.format_error})"
    if step.refused:
        return "refused"
    if step.aborted:
        return f"aborted ({step.aborted})"
    if step.timed_out:
        return "timed out"
    return "rc=?" if step.returncode is None else f"rc={step.returncode}"  # ? : a format that did not record it


class PlainDisplay:
    """Shows each step as it is recorded: a hook (miniswe/hooks.py), or called with a recorded Step."""

    def __init__(self, progress: TextIO | None = None, data: TextIO | None = None):
        self.progress = progress or sys.stderr
        self.data = data or sys.stdout

    def after_command(self, event: Any) -> None:
        self.step(event.step)

    def step(self, step: Step) -> None:
        out = self.progress
        out.write(f"--- step {step.step}\n")
        if step.thought:
            out.write(visible(trimmed(step.thought, 4)) + "\n")
        if step.format_error:
            out.write(f"! format error: {step.format_error}\n")
        else:
            out.write(f"$ {visible(step.command or '')}\n{visible(trimmed(step.output))}\n"
                      f"[{step_status(step)} · {step.duration_s:.2f}s]\n")
        out.flush()

    def notice(self, message: str) -> None:
        print(f"miniswe: {visible(message)}", file=self.progress, flush=True)

    def final(self, line: str) -> None:
        print(visible(line), file=self.data, flush=True)


class RichDisplay(PlainDisplay):
    def __init__(self) -> None:
        super().__init__()
        from rich.console import Console

        self.console = Console(stderr=True, highlight=False)

    def step(self, step: Step) -> None:
        from rich.markup import escape

        console = self.console
        console.rule(f"step {step.step}", style="dim")
        if step.thought:
            console.print(escape(visible(trimmed(step.thought, 6))), style="italic dim")
        if step.format_error:
            console.print(f"format error: {step.format_error}", style="bold red")
            return
        console.print("$ " + escape(visible(step.command or "")), style="bold yellow")
        if step.output.strip():
            console.print(escape(visible(trimmed(step.output))))
        ok = step.returncode == 0
        console.print(f"[{'green' if ok else 'red'}]{escape(step_status(step))}[/] [dim]· {step.duration_s:.2f}s[/]")


class QuietDisplay(PlainDisplay):
    def step(self, step: Step) -> None:
        pass

    def notice(self, message: str) -> None:
        pass


def make_display(quiet: bool) -> Any:
    if quiet:
        return QuietDisplay()
    if sys.stderr.isatty():
        return RichDisplay()
    return PlainDisplay()
