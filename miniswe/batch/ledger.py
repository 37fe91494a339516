"""results.jsonl: the append-only ledger of finished tasks, one JSON line each, fsynced as it is written.

A `kill -9` can only tear the last line; reading drops it (and cuts it off before appending). The
last line for an id wins; at the start and end of every batch, superseded lines move to
results.history.jsonl, so a finished run holds exactly one line per task.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from typing import Any

from miniswe.batch.files import write_atomic

LEDGER = "results.jsonl"
HISTORY = "results.history.jsonl"


def read_lines(path: str, *, repair: bool = False, warn=None) -> list[dict[str, Any]]:
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
        records.append(record)
    if repair and good < len(raw):
        with open(path, "r+b") as handle:
            handle.truncate(good)
            os.fsync(handle.fileno())
    elif repair and raw and not raw.endswith(b"\n"):
        _append_bytes(path, b"\n")  # a whole record cut before its newline: keep it, end the line
    return records


def latest(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The last record per task id, in the order those last records were written."""
    by_id: dict[str, dict[str, Any]] = {}
    for record in records:
        by_id.pop(record["id"], None)
        by_id[record["id"]] = record
    return by_id


def read_records(path: str, *, warn=None) -> dict[str, dict[str, Any]]:
    return latest(read_lines(path, warn=warn))


def _warn(message: str) -> None:
    print(f"miniswe: warning: {message}", file=sys.stderr)


class Ledger:
    """The run directory's results.jsonl, shared by every worker thread."""

    def __init__(self, run_dir: str):
        self.path = os.path.join(run_dir, LEDGER)
        self.history = os.path.join(run_dir, HISTORY)
        self._lines = read_lines(self.path, repair=True)
        self.records = latest(self._lines)
        self._lock = threading.Lock()
        self._written: set[str] = set()

    def append(self, record: dict[str, Any]) -> bool:
        """Record a finished task once per batch invocation; False when it was already recorded."""
        with self._lock:
            if record["id"] in self._written:
                return False
            self._written.add(record["id"])
            _append_bytes(self.path, record_line(record).encode("utf-8"))
            self._lines.append(record)
            self.records.pop(record["id"], None)
            self.records[record["id"]] = record
            return True

    def amend(self, record: dict[str, Any]) -> None:
        """Append a corrected line for a task's kept result (the last line per id wins)."""
        with self._lock:
            _append_bytes(self.path, record_line(record).encode("utf-8"))
            self._lines.append(record)
            self.records[record["id"]] = record

    def compact(self) -> None:
        """Move superseded lines (earlier attempts) to the history file, keeping one line per task."""
        with self._lock:
            if len(self._lines) == len(self.records):
                return
            keep = {id(record) for record in self.records.values()}
            # one line per attempt: an amended line (see `amend`) replaces the attempt's first one
            superseded = {(r["id"], r.get("attempt")): r for r in self._lines if id(r) not in keep}
            # history first: a crash between the two writes duplicates a line there, never loses one
            _append_bytes(self.history, "".join(record_line(r) for r in superseded.values()).encode("utf-8"))
            write_atomic(self.path, "".join(record_line(r) for r in self.records.values()))
            self._lines = list(self.records.values())

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.records.values())


def record_line(record: dict[str, Any]) -> str:
    return json.dumps(record, ensure_ascii=False) + "\n"


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
