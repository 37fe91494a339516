"""Commands on this machine: a fresh `bash -c` per command, in its own session and process group."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from miniswe.environments import CommandResult, EnvironmentConfig
from miniswe.environments.capture import run_captured
from miniswe.errors import SandboxError

# Tools that page, draw progress bars or prompt would stall or flood a non-interactive step.
QUIET_ENV = {
    "PAGER": "cat",
    "MANPAGER": "cat",
    "GIT_PAGER": "cat",
    "PIP_PROGRESS_BAR": "off",
    "TQDM_DISABLE": "1",
}


@dataclass(frozen=True)
class LocalConfig(EnvironmentConfig):
    kind: str = "local"


class LocalEnvironment:
    config_class = LocalConfig

    def __init__(self, config: LocalConfig, *, hidden_env: Sequence[str] = (), **_: Any):
        self.config = config
        self.cwd = os.path.abspath(config.cwd or os.getcwd())
        if not os.path.isdir(self.cwd):
            raise SandboxError(f"environment.cwd: {self.cwd} is not a directory; create it or pass --cwd")
        # variables commands must not inherit (the API key): they are miniswe's, not the task's
        inherited = {k: v for k, v in os.environ.items() if k not in hidden_env}
        self.env = {**inherited, **QUIET_ENV, **{k: str(v) for k, v in config.env.items()}}
        self._running: subprocess.Popen | None = None
        self._executing = False
        self._interrupt_pending = False

    def execute(self, command: str, *, timeout: float) -> CommandResult:
        started = time.monotonic()
        self._interrupt_pending = False
        self._executing = True
        try:
            try:
                proc = subprocess.Popen(
                    ["bash", "-c", command],
                    cwd=self.cwd,
                    env=self.env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as error:
                raise SandboxError(f"cannot start bash in {self.cwd}: {error.strerror}") from error
            self._running = proc
            if self._interrupt_pending:  # asked to stop before the command had a pid to kill
                _kill_group(proc.pid)
            result = run_captured(
                proc, timeout=timeout, limit=self.config.capture_limit, kill=lambda: _kill_group(proc.pid), started=started
            )
        finally:
            self._running = None
            self._executing = False
        if self._interrupt_pending:
            return dataclasses.replace(result, returncode=None, timed_out=False, interrupted=True)
        return result

    def interrupt(self) -> None:
        if self._executing:
            self._interrupt_pending = True
            proc = self._running
            if proc is not None:
                _kill_group(proc.pid)

    def close(self) -> None:
        pass

    def describe(self) -> dict[str, Any]:
        return {"kind": "local", "cwd": self.cwd, "env": sorted(self.config.env)}


def _kill_group(pgid: int) -> None:
    # the whole group: a shell's children (and theirs) outlive the shell otherwise
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
