"""results.jsonl: the append-only ledger of finished tasks, one LedgerRecord per JSON line, fsynced as written.

A `kill -9` can only tear the last line; reading drops it (and cuts it off before appending). The
last line for an id wins; at the start and end of every batch, superseded lines move to
results.history.jsonl, so a finished run holds exactly one line per task.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from miniswe.batch.files import now, write_atomic
from miniswe.status import ExitStatus, is_agent_outcome
from miniswe.trajectory import Trajectory

LEDGER = "results.jsonl"
HISTORY = "results.history.jsonl"
DETAIL_CHARS = 4000
BUDGET_PREFIX = "batch_"  # exit details of tasks a batch budget cut off: batch_cost_limit, batch_token_limit


@dataclass(frozen=True)
class LedgerRecord:
    """One finished task: its line in results.jsonl (field names are documented in docs/batch-and-ray.md)."""

    id: str
    exit_status: str
    exit_detail: str | None = None
    resolved: bool | None = None  # None without eval
    has_eval: bool = False
    steps: int = 0
    model_calls: int = 0
    tokens: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    wall_s: float = 0.0
    trajectory: str | None = None  # relative to the run directory
    submission: str | None = None
    model: str | None = None
    attempt: int = 1
    started: str | None = None
    ended: str | None = None
    # SWE-bench grading (swebench/grading.py): status, resolved, detail, per-test results, wall_s apart from the
    # agent's, harness version, log path; None when not graded
    grade: dict[str, Any] | None = None
    model_s: float = 0.0  # of wall_s, the time spent in model calls
    # the task's image: name, wait (none, pull, budget, or failed), wait_s (before the run, apart from wall_s),
    # pull_s and budget_s (of wait_s: waiting for a pull, and for room under the image budget), bytes its pull added
    image: dict[str, Any] | None = None

    @classmethod
    def from_trajectory(cls, trajectory: Trajectory, *, task_id: str, relative_path: str, has_eval: bool, model: str,
                        attempt: int, started: str, wall_s: float) -> LedgerRecord:
        outcome = trajectory.outcome
        usage = trajectory.usage
        detail = outcome.detail if outcome else None
        return cls(
            id=task_id, exit_status=str(outcome.status if outcome else ExitStatus.ERROR),
            exit_detail=detail[-DETAIL_CHARS:] if isinstance(detail, str) else detail,
            resolved=trajectory.resolved, has_eval=has_eval, steps=len(trajectory.steps), model_calls=usage.model_calls,
            tokens=usage.total_tokens, prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens,
            cost=usage.cost, wall_s=round(wall_s, 3), trajectory=relative_path,
            model_s=round(sum(step.latency_s or 0.0 for step in trajectory.steps), 3),
            submission=outcome.submission if outcome else None, model=model, attempt=attempt, started=started, ended=now(),
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LedgerRecord:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> LedgerRecord:
        return dataclasses.replace(self, **changes)

    @property
    def kept_on_resume(self) -> bool:
        """Ended with an agent outcome, and not merely cut off by a batch budget (that task never had its chance)."""
        return is_agent_outcome(self.exit_status) and not str(self.exit_detail or "").startswith(BUDGET_PREFIX)


def read_lines(path: str, *, repair: bool = False, warn=None) -> list[LedgerRecord]:
    """Every record in file order. With `repair`, a torn last line is cut off the file."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except FileNotFoundError:
        return []
    records = []
    good = len(raw)
    lines = raw.split(b"\n")
    offset = 0
    for number, line in enumerate(lines, 1):
        start = offset
        offset += len(line) + 1
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict) or not all(isinstance(record.get(k), str) for k in ("id", "exit_status")):
                raise ValueError("not a task record")
        except ValueError:
            if number == len(lines):  # no newline after it: torn by a crash mid-write
                good = start  # the task simply counts as not finished
                continue
            (warn or _warn)(f"{path}: line {number} is not a task record; ignored")
            continue
        records.append(LedgerRecord.from_dict(record))
    if repair and good < len(raw):
        with open(path, "r+b") as handle:
            handle.truncate(good)
            os.fsync(handle.fileno())
    elif repair and raw and not raw.endswith(b"\n"):
        _append_bytes(path, b"\n")  # a whole record cut before its newline: keep it, end the line
    return records


def latest(records: list[LedgerRecord]) -> dict[str, LedgerRecord]:
    """The last record per task id, in the order those last records were written."""
    by_id: dict[str, LedgerRecord] = {}
    for record in records:
        by_id.pop(record.id, None)
        by_id[record.id] = record
    return by_id


def read_records(path: str, *, warn=None) -> dict[str, LedgerRecord]:
    return latest(read_lines(path, warn=warn))


def _warn(message: str) -> None:
    print(f"miniswe: warning: {message}", file=sys.stderr)


class Ledger:
    """The run directory's results.jsonl, shared by every worker thread."""

    def __init__(self, run_dir: str, redact: Callable[[str], str] = lambda text: text):
        self.path = os.path.join(run_dir, LEDGER)
        self.redact = redact  # the batch's secrets, masked in every line written
        self.history = os.path.join(run_dir, HISTORY)
        self._lines = read_lines(self.path, repair=True)
        self.records = latest(self._lines)
        self._lock = threading.Lock()
        self._written: set[str] = set()

    def append(self, record: LedgerRecord) -> bool:
        """Record a finished task once per batch invocation; False when it was already recorded."""
        with self._lock:
            if record.id in self._written:
                return False
            self._written.add(record.id)
            _append_bytes(self.path, self.redact(record_line(record)).encode("utf-8"))
            self._lines.append(record)
            self.records.pop(record.id, None)
            self.records[record.id] = record
            return True

    def amend(self, record: LedgerRecord) -> None:
        """Append a corrected line for a task's kept result (the last line per id wins)."""
        with self._lock:
            _append_bytes(self.path, self.redact(record_line(record)).encode("utf-8"))
            self._lines.append(record)
            self.records[record.id] = record

    def compact(self) -> None:
        """Move superseded lines (earlier attempts) to the history file, keeping one line per task."""
        with self._lock:
            if len(self._lines) == len(self.records):
                return
            keep = {id(record) for record in self.records.values()}
            # one line per attempt: an amended line (see `amend`) replaces the attempt's first one
            superseded = {(r.id, r.attempt): r for r in self._lines if id(r) not in keep}
            # history first: a crash between the two writes duplicates a line there, never loses one
            _append_bytes(self.history, "".join(record_line(r) for r in superseded.values()).encode("utf-8"))
            write_atomic(self.path, self.redact("".join(record_line(r) for r in self.records.values())))
            self._lines = list(self.records.values())

    def snapshot(self) -> list[LedgerRecord]:
        with self._lock:
            return list(self.records.values())


def record_line(record: LedgerRecord) -> str:
    return json.dumps(record.to_dict(), ensure_ascii=False) + "\n"


def _append_bytes(path: str, data: bytes) -> None:
    # one write on an O_APPEND fd, then fsync: a crash tears at most the last line
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
