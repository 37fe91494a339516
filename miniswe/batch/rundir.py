"""The run directory: run.json (what this batch is), preds.json (SWE-bench predictions), and a lock.

A rerun must be the same batch: a different task file or model is refused unless forced.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
from collections.abc import Callable, Iterable
from typing import Any

from miniswe import __version__
from miniswe.batch.files import now, read_json, write_atomic
from miniswe.batch.ledger import LedgerRecord
from miniswe.errors import UsageError
from miniswe.status import is_agent_outcome

RUN_JSON = "run.json"
PREDS_JSON = "preds.json"
REPORT_MD = "report.md"
FORMAT = "miniswe-batch"


def model_identity(config: Any) -> dict[str, str]:
    """What makes two runs the same model: its kind and name (not the endpoint, which may move)."""
    return {"kind": config.model.kind, "name": config.model.name}


class RunDir:
    def __init__(self, path: str, redact: Callable[[str], str] = lambda text: text):
        self.path = os.path.abspath(path)
        self.redact = redact  # the batch's secrets, masked in every file written here
        self._lock_fd: int | None = None
        self._preds_lock = threading.Lock()  # workers finish concurrently: an older snapshot must not land last

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def lock(self) -> None:
        """Hold the directory for this process; the kernel drops the lock if the process dies."""
        try:
            os.makedirs(self.path, exist_ok=True)
        except OSError as error:
            raise UsageError(f"-o {self.path}: cannot create the run directory: {error.strerror}") from None
        fd = os.open(self.file(".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise UsageError(f"{self.path} is in use by another miniswe batch; wait for it or pass another -o RUN_DIR") from None
        self._lock_fd = fd

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def read_run(self) -> dict[str, Any] | None:
        try:
            data = read_json(self.file(RUN_JSON))
        except FileNotFoundError:
            return None
        except ValueError as error:
            raise UsageError(f"{self.file(RUN_JSON)}: not valid JSON ({error}); is this a miniswe run directory?") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise UsageError(f"{self.file(RUN_JSON)}: not a miniswe batch run.json; pass another -o RUN_DIR")
        return data

    def check_same(self, previous: dict[str, Any], sha256: str, task_path: str, model: dict[str, str]) -> None:
        """Refuse to mix two different batches in one directory."""
        before = previous.get("task_file", {})
        if before.get("sha256") != sha256:
            raise UsageError(
                f"{self.path} holds a batch of another task file ({before.get('path')}, sha256 {str(before.get('sha256'))[:12]}; "
                f"now {task_path}, sha256 {sha256[:12]}): pass another -o RUN_DIR, or --force to continue into this one"
            )
        if previous.get("model") != model:
            old = previous.get("model") or {}
            raise UsageError(
                f"{self.path} holds a batch run with model {old.get('name') or old.get('kind')!r}, not "
                f"{model['name'] or model['kind']!r}: pass another -o RUN_DIR, or --force to continue into this one"
            )

    def start_run(self, previous: dict[str, Any] | None, info: dict[str, Any]) -> dict[str, Any]:
        run = dict(previous or {"format": FORMAT, "version": 1, "started": now(), "invocations": []})
        run.update(info, miniswe_version=__version__, ended=None, status="running")
        run["invocations"] = list(run.get("invocations", [])) + [{"started": now(), "ended": None, "command": info.get("command")}]
        self.write_json(RUN_JSON, run)
        return run

    def end_run(self, run: dict[str, Any], status: str, summary: dict[str, Any]) -> None:
        run.update(ended=now(), status=status)
        run["invocations"][-1].update(ended=now(), status=status, **summary)
        self.write_json(RUN_JSON, run)

    def write_preds(self, records: Iterable[LedgerRecord] | Callable[[], Iterable[LedgerRecord]]) -> None:
        with self._preds_lock:
            self.write_json(PREDS_JSON, predictions(records() if callable(records) else records))

    def write_json(self, name: str, data: Any) -> None:
        self.write_text(name, json.dumps(data, indent=2, ensure_ascii=False) + "\n")

    def write_text(self, name: str, text: str) -> None:
        write_atomic(self.file(name), self.redact(text))


def predictions(records: Iterable[LedgerRecord]) -> dict[str, dict[str, Any]]:
    """SWE-bench predictions: every task that ended with an agent outcome; no submission is an empty patch."""
    return {
        r.id: {"instance_id": r.id, "model_name_or_path": r.model or "miniswe", "model_patch": r.submission or ""}
        for r in records
        if is_agent_outcome(r.exit_status)
    }
