"""The trajectory file: one JSON document per run, rewritten atomically after every step.

Each message and step is serialised once, when it is added, and the file is swapped in by an atomic
exchange of names (miniswe.atomic.SwapFile), so saving step 300 costs little more than saving step 3. `load` validates the format and upgrades older versions in order.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from miniswe import __version__
from miniswe.atomic import SwapFile
from miniswe.errors import TrajectoryError

FORMAT = "miniswe-trajectory"
VERSION = 1
# UPGRADES[n] turns a version-n document into version n+1.
UPGRADES: dict[int, Any] = {}

USAGE_KEYS = ("model_calls", "retries", "prompt_tokens", "completion_tokens", "total_tokens", "cached_tokens", "cost")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + f".{int(time.time() * 1000) % 1000:03d}Z"


class Trajectory:
    def __init__(self, path: str, *, task: str, config: dict[str, Any], environment: dict[str, Any], metadata: dict[str, Any] | None = None):
        self.path = path
        self.data: dict[str, Any] = {
            "format": FORMAT,
            "version": VERSION,
            "miniswe_version": __version__,
            "task": task,
            "exit_status": None,
            "exit_detail": None,
            "submission": None,
            "usage": dict.fromkeys(USAGE_KEYS, 0) | {"cost": 0.0},
            "timing": {"started": _now(), "ended": None, "wall_s": None},
            "config": config,
            "environment": environment,
            "model": {},
            "metadata": metadata or {},
        }
        self.messages: list[dict[str, Any]] = []
        self.steps: list[dict[str, Any]] = []
        self._messages_json: list[bytes] = []  # encoded once, joined at every save
        self._steps_json: list[bytes] = []
        self._started = time.monotonic()
        self._file = SwapFile(path)
        directory = os.path.dirname(os.path.abspath(path))
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as error:
            raise TrajectoryError(f"cannot create {directory} for the trajectory: {error.strerror}") from None

    def add_message(self, role: str, content: str, **extras: Any) -> None:
        message = {"role": role, "content": content, "timestamp": _now(), **{k: v for k, v in extras.items() if v is not None}}
        self.messages.append(message)
        self._messages_json.append(json.dumps(message, ensure_ascii=False).encode())

    def add_step(self, step: dict[str, Any]) -> None:
        self.steps.append(step)
        self._steps_json.append(json.dumps(step, ensure_ascii=False).encode())

    def finish(self, status: str, detail: str | None = None, submission: str | None = None) -> None:
        self.data.update(exit_status=str(status), exit_detail=detail, submission=submission)
        self.data["timing"].update(ended=_now(), wall_s=round(time.monotonic() - self._started, 3))

    def save(self) -> None:
        """Replace the file with the whole document, atomically: never half a file on disk."""
        head = json.dumps(self.data, ensure_ascii=False)[:-1].encode()
        self._file.write(b"".join(
            (head, b', "messages": [', b",\n".join(self._messages_json), b'], "steps": [', b",\n".join(self._steps_json), b"]}\n")
        ))


def load(path: str) -> dict[str, Any]:
    """Read a trajectory, validating its format and upgrading an older version to the current one."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except OSError as error:
        raise TrajectoryError(f"{path}: cannot read trajectory: {error.strerror}") from None
    except ValueError as error:
        raise TrajectoryError(f"{path}: not valid JSON ({error}); is it a trajectory file?") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("trajectory_format") if isinstance(data, dict) else type(data).__name__
        raise TrajectoryError(f"{path}: not a miniswe trajectory (found format {found!r})")
    version = data.get("version")
    if not isinstance(version, int) or version < 1:
        raise TrajectoryError(f"{path}: bad trajectory version {version!r}")
    if version > VERSION:
        raise TrajectoryError(f"{path} was written by a newer miniswe (format {version} > {VERSION}); upgrade miniswe")
    while data["version"] < VERSION:
        data = UPGRADES[data["version"]](data)
    return data
