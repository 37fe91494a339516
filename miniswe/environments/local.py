"""Commands on this machine: a fresh `bash -c` per command, in its own process group."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

from miniswe.environments import CommandResult
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
class LocalConfig:
    cwd: str = ""
    env: dict[str, str] = field(default_factory=dict)
    capture_limit: int = 1_000_000
    hidden_env: list[str] = field(default_factory=list)  # inherited variables commands must not see (the API key)


class LocalEnvironment:
    config_class = LocalConfig

    def __init__(self, config: LocalConfig):
        self.config = config
        self.cwd = os.path.abspath(config.cwd or os.getcwd())
        if not os.path.isdir(self.cwd):
            raise SandboxError(f"environment.cwd: {self.cwd} is not a directory; create it or pass --cwd")
        inherited = {k: v for k, v in os.environ.items() if k not in config.hidden_env}
        self.env = {**inherited, **QUIET_ENV, **{k: str(v) for k, v in config.env.items()}}

    def execute(self, command: str, *, timeout: float) -> CommandResult:
        started = time.monotonic()
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

        def kill_group() -> None:
            # the whole group: a shell's children (and theirs) outlive the shell otherwise
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

        return run_captured(
            proc, timeout=timeout, limit=self.config.capture_limit, kill=kill_group, started=started
        )

    def close(self) -> None:
        pass

    def describe(self) -> dict[str, Any]:
        return {"kind": "local", "cwd": self.cwd, "env": sorted(self.config.env)}
