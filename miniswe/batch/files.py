"""Atomic file writes for the run directory: a temp file in the same folder, fsync, then rename over."""

from __future__ import annotations

import json
import os
import tempfile
import time
from typing import Any

# mkstemp creates 0600 files; the run's files get the usual permissions, as open() would give them
_UMASK = os.umask(0)
os.umask(_UMASK)


def write_atomic(path: str, text: str) -> None:
    """Replace `path` with `text` so that readers (and a `kill -9`) only ever see the old or the new file."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + "-", suffix=".tmp", dir=directory)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_json(path: str, data: Any) -> None:
    write_atomic(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def read_json(path: str) -> Any:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
