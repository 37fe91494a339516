"""The debug log: every model request and response as pretty JSON, for people diagnosing an endpoint.

Turned on by `--debug` or `MINISWE_DEBUG` (`1` for stderr, or a file path to append to). Secrets are masked
as everywhere else, long texts are cut, and nothing of it reaches the trajectory.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import json
import os
import sys
import threading
import time
from typing import Any, TextIO

LONG = 2000  # a text longer than this is shown as its head and tail
_lock = threading.Lock()
_numbers = itertools.count(1)
_files: dict[str, TextIO] = {}
_task: contextvars.ContextVar[str] = contextvars.ContextVar("task", default="")  # which task's calls, in a batch


@contextlib.contextmanager
def task(name: str) -> Any:
    """Entries written inside name the task (each worker thread runs its own, so each has its own label)."""
    token = _task.set(name)
    try:
        yield
    finally:
        _task.reset(token)


def enabled() -> bool:
    return os.environ.get("MINISWE_DEBUG", "") not in ("", "0")


def log(kind: str, url: str, data: Any, *, call: int = 0, note: str = "") -> int:
    """Write one entry (`request`, `response`, `failure`); returns the call's number, for its response."""
    if not enabled():
        return 0
    from miniswe.output import SECRETS

    call = call or next(_numbers)
    stamp = time.strftime("%H:%M:%S", time.localtime()) + f".{int(time.time() * 1000) % 1000:03d}"
    # masked before cut: a cut through a secret would leave most of it unrecognisable, and so unmasked
    body = SECRETS.scrub(data) if isinstance(data, str) else json.dumps(_cut(data, SECRETS.scrub), indent=2,
                                                                         ensure_ascii=False, default=str)
    label = f" task {_task.get()}" if _task.get() else ""
    text = SECRETS.scrub(f"--- miniswe debug {stamp}{label} call {call} {kind} {url}{' ' + note if note else ''}\n{body}\n")
    with _lock:
        target = _target()
        try:
            target.write(text)
            target.flush()
        except (OSError, ValueError):
            pass
    return call


def _target() -> TextIO:
    where = os.environ.get("MINISWE_DEBUG", "")
    if where.lower() in ("1", "true", "yes", "stderr", "-"):
        return sys.stderr
    if where not in _files:
        try:
            _files[where] = open(where, "a", encoding="utf-8")
        except OSError as error:
            print(f"miniswe: warning: MINISWE_DEBUG={where}: cannot open ({error.strerror}); the debug log goes to stderr",
                  file=sys.stderr)
            _files[where] = sys.stderr
    return _files[where]


def _cut(data: Any, scrub: Any) -> Any:
    """`data` with every text masked, then cut to its head and tail when long."""
    if isinstance(data, str):
        data = scrub(data)
        if len(data) > LONG:
            return f"{data[:LONG // 2]}\n[... {len(data) - LONG // 2 - LONG // 4} characters cut ...]\n{data[-LONG // 4:]}"
        return data
    if isinstance(data, dict):
        return {key: _cut(value, scrub) for key, value in data.items()}
    if isinstance(data, list):
        return [_cut(item, scrub) for item in data]
    return data
