"""Commands on this machine: a fresh `bash -c` per command, in its own session, started by this environment's
spawner (environments/spawner.py), so that nothing a command starts outlives its step or miniswe."""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from miniswe.config import EnvironmentConfig
from miniswe.environments import CommandResult
from miniswe.environments.capture import capture, wait_for
from miniswe.environments.spawner import kill_descendants, landlock_abi
from miniswe.errors import SandboxError

# Tools that page, draw progress bars or prompt would stall or flood a non-interactive step.
QUIET_ENV = {
    "PAGER": "cat",
    "MANPAGER": "cat",
    "GIT_PAGER": "cat",
    "PIP_PROGRESS_BAR": "off",
    "TQDM_DISABLE": "1",
}
SPAWNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "spawner.py")
ANSWER_S = 10.0  # how long the spawner may take to start a command or to end


class LocalConfig(EnvironmentConfig):
    kind: str = "local"


class LocalEnvironment:
    config_class = LocalConfig
    keeps_state = True  # the working directory holds what earlier commands did: a resumed run goes on there

    def __init__(self, config: LocalConfig, *, hidden_env: Sequence[str] = (), confine: bool = False,
                 extra_env: dict[str, str] | None = None, **_: Any):
        self.config = config
        if confine and landlock_abi() < 1:
            raise SandboxError("policy.confine: this kernel has no Landlock (Linux 5.13+ with Landlock enabled "
                               "confines commands); run in Docker instead, or set policy.confine: false")
        self.confine = confine
        self.notices: list[str] = []
        if confine and not metadata_confined():
            self.notices.append("policy.confine: this kernel refuses unprivileged user namespaces, so chmod, chown "
                                "and touch outside the working directory are not refused (writes are); run in "
                                "Docker to confine those too")
        self.cwd = os.path.abspath(config.cwd or os.getcwd())
        if not os.path.isdir(self.cwd):
            raise SandboxError(f"environment.cwd: {self.cwd} is not a directory; create it or pass --cwd")
        # variables commands must not inherit (the API key): they are miniswe's, not the task's
        inherited = {k: v for k, v in os.environ.items() if k not in hidden_env}
        self.env = {**inherited, **QUIET_ENV, **{k: str(v) for k, v in config.env.items()}}
        # what miniswe itself gives its commands (subagents.command_env): `miniswe` first on the PATH, and where to
        # ask it for a sub-agent or a skill
        extra = dict(extra_env or {})
        if "PATH" in extra:
            self.env["PATH"] = os.pathsep.join(filter(None, (extra.pop("PATH"), self.env.get("PATH", os.defpath))))
        self.env.update(extra)
        # started now, not at the first command: its start-up (a Python interpreter's) overlaps the first model call
        self._spawner: Spawner | None = Spawner(self.env, self.cwd, confine=self.confine)
        self._pid: int | None = None  # the running command (its session's leader)
        self._executing = False
        self._interrupt_pending = False

    def execute(self, command: str, *, timeout: float) -> CommandResult:
        started = time.monotonic()
        self._interrupt_pending = False
        self._executing = True
        try:
            if not os.path.isdir(self.cwd):
                raise SandboxError(f"the working directory {self.cwd} is gone (a command removed it?); "
                                   "the run cannot go on there")
            if self._spawner is None or not self._spawner.alive():
                self._spawner = Spawner(self.env, self.cwd, confine=self.confine)
            spawner = self._spawner
            output, self._pid = spawner.start(command)
            if self._interrupt_pending:  # asked to stop before the command had a pid to kill
                self._kill_group()
            result = capture(output, spawner, timeout=timeout, limit=self.config.capture_limit, kill=self._kill_all,
                             started=started)
        finally:
            self._pid = None
            self._executing = False
        if spawner.lost:
            return dataclasses.replace(result, returncode=None, sandbox_error=spawner.lost)
        if self._interrupt_pending:
            return dataclasses.replace(result, returncode=None, timed_out=False, interrupted=True)
        return result

    def interrupt(self) -> None:
        """The running command's group, at once (signal-safe, any thread); the step's own thread then sweeps
        up the rest, as after any command: a sweep from here could outlast the command and hit the next one."""
        if self._executing:
            self._interrupt_pending = True
            self._kill_group()

    def _kill_group(self) -> None:
        pid = self._pid
        if pid is not None:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def _kill_all(self) -> None:
        """The command's group, then everything else under the spawner: what escaped the group (`set -m`), the
        session (`setsid`), or its parents (double forks) was adopted by the spawner."""
        self._kill_group()
        if self._spawner is not None:
            kill_descendants(self._spawner.pid)

    def close(self) -> None:
        if self._spawner is not None:
            self._spawner.close()
            self._spawner = None

    def describe(self) -> dict[str, Any]:
        return {"kind": "local", "cwd": self.cwd, "env": sorted(self.config.env),
                **({"notices": self.notices} if self.notices else {})}


_metadata_confined: list[bool] = []


def metadata_confined() -> bool:
    """Whether a confined command also cannot change metadata outside its folder (the spawner's namespace
    works here): asked of the spawner once per process, since its own stderr goes nowhere."""
    if not _metadata_confined:
        probe = subprocess.run([sys.executable, "-I", "-S", SPAWNER, "--probe"], stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _metadata_confined.append(probe.returncode == 0)
    return _metadata_confined[0]


class Spawner:
    """miniswe's end of a spawner process: starts commands through it and learns how they ended.

    Its socket is the spawner's lifeline: when this process dies, however it dies, the socket closes and
    the spawner kills everything it started.
    """

    def __init__(self, env: dict[str, str], cwd: str, *, confine: bool = False):
        self.channel, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            # its own session: a signal to miniswe's process group (Ctrl-C, kill -9 -PGID) does not reach it
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", SPAWNER, str(theirs.fileno()), *(["--confine"] if confine else [])],
                cwd=cwd, env=env,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),), start_new_session=True,
            )
        except OSError as error:
            self.channel.close()
            raise SandboxError(f"cannot start the local spawner ({sys.executable}): {error.strerror}") from error
        finally:
            theirs.close()
        self.pid = self.proc.pid
        self.lost: str | None = None
        self._command: int | None = None
        self._status: int | None = None

    def alive(self) -> bool:
        return self.lost is None and self.proc.poll() is None

    def start(self, command: str) -> tuple[int, int]:
        """Start `command`; the read end of its output pipe and its pid."""
        read_end, write_end = os.pipe()
        try:
            socket.send_fds(self.channel, [b"run" + command.encode("utf-8", "surrogateescape")], [write_end])
        except OSError as error:
            os.close(read_end)
            raise SandboxError(f"the local spawner is gone ({error.strerror}); the run cannot start commands") from None
        finally:
            os.close(write_end)
        answer = self._receive(ANSWER_S)
        if not answer.startswith(b"pid "):
            os.close(read_end)
            raise SandboxError(f"the local spawner did not start the command ({answer[:60]!r})")
        self._command, self._status = int(answer.split()[1]), None
        return read_end, self._command

    # -- capture.ExitWatch: the command's end, as the spawner reports it ------------------------------------
    def fileno(self) -> int:
        return self.channel.fileno()

    def poll(self) -> int | None:
        if self._status is None:
            try:
                message = self.channel.recv(64, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return None
            except OSError:
                message = b""
            if not message:
                self._lost()
                return -signal.SIGKILL
            _, pid, status = message.split()
            if int(pid) == self._command:
                self._status = os.waitstatus_to_exitcode(int(status))
        return self._status

    def _receive(self, seconds: float) -> bytes:
        self.channel.settimeout(seconds)
        try:
            return self.channel.recv(64)
        except OSError:
            return b""
        finally:
            self.channel.settimeout(None)

    def _lost(self) -> None:
        """The spawner died under a command (killed from outside): its commands lost their keeper."""
        if self._command is not None:
            try:
                os.killpg(self._command, signal.SIGKILL)
            except OSError:
                pass
        self.lost = (f"the local spawner (pid {self.pid}) was killed from outside during a command; "
                     "the command was killed, and the run stops rather than leave processes unaccounted for")

    def close(self) -> None:
        """Close the lifeline: the spawner kills what is left and exits."""
        self.channel.close()
        if wait_for(self.proc, ANSWER_S) is None:
            self.proc.kill()
            self.proc.wait(ANSWER_S)
