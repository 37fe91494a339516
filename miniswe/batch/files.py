"""The run directory's file helpers: durable atomic writes (fsynced: a batch runs for hours), JSON, timestamps."""

from __future__ import annotations

import functools
import json
import time
from typing import Any

from miniswe import atomic

write_atomic = functools.partial(atomic.write_atomic, fsync=True)


def read_json(path: str) -> Any:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
