"""Seeing a batch as it runs: live rich panel on a terminal, one plain line per finished task otherwise.

Workers update one BatchState under its lock; displays only read it. Everything goes to stderr.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from typing import Any, TextIO

from miniswe.batch.ledger import LedgerRecord
from miniswe.output import visible
from miniswe.status import ExitStatus, is_infra_failure

MAX_RUNNING_ROWS = 12


class BatchState:
    def __init__(self, total: int, done_before: list[LedgerRecord]):
        self.total = total
        self.done_before = len(done_before)
        self.finished = 0
        self.by_status: Counter[str] = Counter(r.exit_status for r in done_before)
        self.resolved = sum(1 for r in done_before if r.resolved)
        self.evaluated = sum(1 for r in done_before if r.has_eval)
        self.running: dict[str, dict[str, Any]] = {}
        self.tokens = 0
        self.cost = 0.0
        self.started = time.monotonic()
        self.lock = threading.Lock()

    @property
    def done(self) -> int:
        return self.done_before + self.finished

    def task_started(self, task_id: str) -> None:
        with self.lock:
            self.running[task_id] = {"started": time.monotonic(), "step": 0}

    def task_grading(self, task_id: str) -> None:
        with self.lock:
            if task_id in self.running:
                self.running[task_id]["grading"] = True

    def task_pulling(self, task_id: str, image: str) -> None:
        with self.lock:
            self.running[task_id] = {"started": time.monotonic(), "step": 0, "pulling": image}

    def task_step(self, task_id: str, step: int, tokens: int, cost: float) -> None:
        with self.lock:
            if task_id in self.running:
                self.running[task_id]["step"] = step
            self.tokens += tokens
            self.cost += cost

    def task_finished(self, record: LedgerRecord) -> None:
        with self.lock:
            self.running.pop(record.id, None)
            self.finished += 1
            self.by_status[record.exit_status] += 1
            self.resolved += bool(record.resolved)
            self.evaluated += bool(record.has_eval)

    def rate(self) -> float:
        """Tasks finished per second by this invocation."""
        elapsed = time.monotonic() - self.started
        return self.finished / elapsed if elapsed > 0 else 0.0

    def eta(self) -> float | None:
        rate = self.rate()
        return (self.total - self.done) / rate if rate > 0 else None


def task_line(record: LedgerRecord, state: BatchState) -> str:
    width = len(str(state.total))
    resolved = {True: " resolved", False: " unresolved"}.get(record.resolved, "")
    grade = record.grade or {}
    if grade.get("status") not in (None, "resolved", "unresolved"):
        resolved += f" ({grade['status']})"  # why it is not resolved, or why it was not graded
    graded = f" · graded in {grade.get('wall_s') or 0:.1f}s" if grade else ""
    image = record.image or {}
    if image.get("wait") in ("pull", "budget"):  # what the task waited for before it started, apart from its time
        graded = f" · waited {image.get('wait_s') or 0:.1f}s for its image" + (" (budget)" if image["wait"] == "budget" else "") + graded
    return (
        f"[{state.done:>{width}}/{state.total}] {record.id} {record.exit_status}{resolved} · "
        f"{record.steps} steps · {record.tokens:,} tokens · ${record.cost:.4f} · {record.wall_s:.1f}s{graded}"
    )


class PlainProgress:
    def __init__(self, stream: TextIO | None = None):
        self.stream = stream or sys.stderr

    def begin(self, state: BatchState) -> None:
        pass

    def finished(self, record: LedgerRecord, state: BatchState) -> None:
        self.notice(task_line(record, state))

    def notice(self, text: str) -> None:
        print(visible(text), file=self.stream, flush=True)

    def end(self) -> None:
        pass


class QuietProgress(PlainProgress):
    def finished(self, record: LedgerRecord, state: BatchState) -> None:
        pass


class RichProgress:
    def __init__(self):
        from rich.console import Console

        self.console = Console(stderr=True, highlight=False)
        self.live = None
        self.state: BatchState | None = None

    def begin(self, state: BatchState) -> None:
        from rich.live import Live

        self.state = state
        self.live = Live(get_renderable=self._render, console=self.console, refresh_per_second=4, transient=True)
        self.live.start()

    def finished(self, record: LedgerRecord, state: BatchState) -> None:
        from rich.markup import escape

        status = record.exit_status
        style = "green" if status == ExitStatus.SUBMITTED else "red" if is_infra_failure(status) else "yellow"

        self.console.print(f"[{style}]{escape(task_line(record, state))}[/]")

    def notice(self, text: str) -> None:
        from rich.markup import escape

        self.console.print(escape(visible(text)), style="bold")

    def end(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None

    def _render(self):
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        state = self.state
        with state.lock:
            running = sorted(state.running.items(), key=lambda item: item[1]["started"])
            counts = " · ".join(f"{status} {count}" for status, count in state.by_status.most_common())
            head = f"{state.done}/{state.total} done · {len(running)} running"
            if state.evaluated:
                head += f" · resolved {state.resolved}/{state.evaluated}"
            usage = f"{state.tokens:,} tokens · ${state.cost:.4f} this run"
        eta = state.eta()
        speed = f"{state.rate() * 60:.1f} tasks/min" + (f" · ETA {_duration(eta)}" if eta is not None else "")
        table = Table(box=None, padding=(0, 2), show_header=bool(running))
        table.add_column("running", overflow="ellipsis", max_width=48)
        table.add_column("step", justify="right")
        table.add_column("elapsed", justify="right")
        now = time.monotonic()
        for task_id, info in running[:MAX_RUNNING_ROWS]:
            what = "grading" if info.get("grading") else "image" if info.get("pulling") else str(info["step"])
            table.add_row(task_id, what, _duration(now - info["started"]))
        if len(running) > MAX_RUNNING_ROWS:
            table.add_row(f"... {len(running) - MAX_RUNNING_ROWS} more", "", "")
        lines = [Text(head, style="bold"), Text(counts or "no task finished yet", style="dim"), Text(f"{usage} · {speed}", style="dim")]
        return Group(*lines, table)


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def make_progress(quiet: bool, stream: TextIO | None = None) -> Any:
    stream = stream or sys.stderr
    if quiet:
        return QuietProgress(stream)
    if stream.isatty():
        return RichProgress()
    return PlainProgress(stream)
