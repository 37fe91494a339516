"""The host side of a container's resident executor (executor.py): the attached `docker run -i` client,
frames both ways over its stdin and stdout, one command at a time, and noticing fast when the container
stops answering (its stream ends, or its heartbeats stop while it is paused)."""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import time
from collections.abc import Callable
from functools import cache

from miniswe.environments import CommandResult
from miniswe.environments.capture import CHUNK, BoundedBuffer, wait_for
from miniswe.environments.processes import stopped
from miniswe.environments.executor import (
    BEAT,
    CONFIG,
    DROPPED,
    ERROR,
    EXIT,
    HELLO,
    KILL,
    OUTPUT,
    RUN,
    STARTED,
    boot_payload,
    frame,
    parse_frames,
)
from miniswe.errors import Cancelled, SandboxError
from miniswe.signals import Stop

HEARTBEAT_S = 0.5  # the executor's beat while a command runs
SILENCE_S = 1.5  # no frame for this long during a command: ask the engine whether the container still runs
KILL_WAIT_S = 5.0  # after a kill request, how long the executor may take to report the command's end
HOST_GRACE_S = 5.0  # past the command's timeout, how long before the host asks for the kill itself
STDERR_KEPT = 4096


class StartFailed(Exception):
    """The client ended before the executor said hello: the engine refused the container, or the image
    cannot run the executor (no python3). Carries the client's exit code and stderr; `exposed`: the executor
    started, but said a command could reach its stream (so it must not be used)."""

    def __init__(self, returncode: int | None, stderr: str, *, exposed: bool = False):
        super().__init__(stderr)
        self.returncode = returncode
        self.stderr = stderr
        self.exposed = exposed


@cache
def executor_source() -> bytes:
    with open(os.path.join(os.path.dirname(__file__), "executor.py"), encoding="utf-8") as handle:
        return boot_payload(handle.read())


class Resident:
    """Talks to the executor through `proc`, the attached client. `gone(settle)` says why the container can
    no longer run commands (None while it runs); it is asked when the stream ends (`settle`: give the engine
    a moment to notice) or falls silent."""

    def __init__(self, proc: subprocess.Popen, *, name: str, gone: Callable[[bool], str | None], capture_limit: int):
        self.proc = proc
        self.name = name
        self.gone = gone
        self.capture_limit = capture_limit
        self.inbox = bytearray()
        self.stderr = b""
        self.closed = False
        self.broken: str | None = None  # why no further command can run
        self._out = proc.stdout.fileno()
        self._err: int | None = proc.stderr.fileno()
        for fd in (self._out, self._err):
            os.set_blocking(fd, False)
        self._wake_r, self._wake_w = os.pipe()
        self._wake_fds: tuple[int, ...] = (self._wake_r, self._wake_w)
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._executing = False
        self._interrupted = False

    # -- start ---------------------------------------------------------------------------------------------
    def handshake(self, settings: dict, *, timeout: float, stop: Stop | None) -> dict:
        """Send the executor's source and settings; its hello. StartFailed when the client ends first."""
        try:
            self._send(executor_source() + frame(CONFIG, json.dumps(settings).encode()))
        except OSError:
            pass  # the client already ended: its exit code and stderr say why
        deadline = time.monotonic() + timeout
        with stop.cancelling(self._cancel_start) if stop else contextlib.nullcontext():
            while True:
                if stop is not None and stop.urgent:
                    raise Cancelled("the container's start was cancelled")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise SandboxError(f"the container did not start within {timeout:g}s (environment.start_timeout)")
                frames, eof = self._receive(min(remaining, 1.0))
                for kind, payload in frames:
                    if kind == HELLO:
                        return json.loads(payload)
                if eof:
                    if stop is not None and stop.urgent:
                        raise Cancelled("the container's start was cancelled")
                    try:
                        code = self.proc.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        code = None
                    self._read_stderr(final=True)
                    raise StartFailed(code, self.stderr.decode("utf-8", "replace"))

    def _cancel_start(self) -> None:
        self.proc.kill()
        self._poke()

    # -- commands ------------------------------------------------------------------------------------------
    def execute(self, command: str, timeout: float) -> CommandResult:
        started = time.monotonic()
        if self.broken:
            raise SandboxError(self.broken)
        buffer = BoundedBuffer(self.capture_limit)
        self._drain_wake()
        self._interrupted = False
        self._executing = True
        try:
            try:
                header = json.dumps({"timeout": max(timeout, 0.0)}).encode()
                self._send(frame(RUN, header + b"\n" + command.encode("utf-8", "surrogateescape")))
            except OSError:
                pass  # the stream has ended: the loop below finds out why
            return self._follow(buffer, started, timeout)
        finally:
            self._executing = False
            if self.closed:  # close() ran from a signal handler meanwhile, and left the descriptors to us
                self.release()

    def _follow(self, buffer: BoundedBuffer, started: float, timeout: float) -> CommandResult:
        ran = False
        late = False
        kill_sent: float | None = None
        host_deadline = started + max(timeout, 0.0) + HOST_GRACE_S
        heard = time.monotonic()
        while True:
            now = time.monotonic()
            if self.closed:  # close() ran (from a signal handler) while we waited
                return self._result(buffer, started, None, interrupted=True)
            if kill_sent is None and (self._interrupted or now >= host_deadline):
                kill_sent = now
                late = not self._interrupted  # the executor's own timer should have fired by now
                try:
                    self._send(frame(KILL))
                except OSError:
                    pass
            if kill_sent is not None and now - kill_sent >= KILL_WAIT_S:
                self.broken = f"miniswe's executor in container {self.name} did not end a command when asked; the run cannot continue"
                return self._result(buffer, started, None, interrupted=self._interrupted, timed_out=not self._interrupted,
                                    sandbox_error=None if self._interrupted else self.broken)
            if now - heard >= SILENCE_S:
                why = self._client_stopped() or self.gone(False)
                if why:
                    return self._lost(buffer, started, ran, why)
                heard = now  # running, only slow: look again after another silence
            waits = [heard + SILENCE_S, kill_sent + KILL_WAIT_S if kill_sent is not None else host_deadline]
            frames, eof = self._receive(max(min(waits) - now, 0.0))
            for kind, payload in frames:
                heard = time.monotonic()
                if kind == OUTPUT:
                    buffer.feed(payload)
                elif kind == DROPPED:
                    buffer.skip(int.from_bytes(payload, "big"))
                elif kind == STARTED:
                    ran = True
                elif kind == EXIT:
                    end = json.loads(payload)
                    if self._interrupted:
                        return self._result(buffer, started, None, interrupted=True)
                    return self._result(buffer, started, None if late else end["rc"], timed_out=late or end["timed_out"])
                elif kind == ERROR:
                    problem = json.loads(payload)
                    error = SandboxError(self._start_problem(problem))
                    error.problem = problem  # type: ignore[attr-defined]  (see DockerEnvironment._wrecked)
                    raise error
                elif kind != BEAT:
                    self.broken = f"unexpected frame {kind!r} from miniswe's executor in container {self.name}"
                    raise SandboxError(self.broken)
            if eof:
                if self.closed:
                    return self._result(buffer, started, None, interrupted=True)
                return self._lost(buffer, started, ran, self._why_ended())

    def _lost(self, buffer: BoundedBuffer, started: float, ran: bool, why: str) -> CommandResult:
        """The container stopped answering: keep what the command printed, unless nothing ran."""
        self.broken = why
        if not ran:
            raise SandboxError(why)
        return self._result(buffer, started, None, sandbox_error=why)

    def _client_stopped(self) -> str | None:
        """Our own client stopped (SIGSTOP by someone on this host) forwards nothing: say so instead of waiting."""
        if not stopped(self.proc.pid):
            return None
        self.broken = (f"the attached client of container {self.name} (pid {self.proc.pid}) was stopped from outside "
                       "(SIGSTOP); the run cannot continue")
        return self.broken

    def _why_ended(self) -> str:
        why = self.gone(True)
        self._read_stderr(final=True)
        stderr = self.stderr.decode("utf-8", "replace")
        last = (stderr.strip().splitlines() or [""])[-1].strip()
        if "Traceback" in stderr and not (why and "restarted" in why):  # miniswe's own program failed: say what
            # (after a restart, the traceback is from the image's own start reading miniswe's frames)
            return f"miniswe's executor in container {self.name} failed ({last}); the run cannot continue; please report it"
        if why:
            return why
        # the container runs, but this client is gone: its stream cannot be attached again
        try:
            code = self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            code = None
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit {code}"
        return (
            f"lost the connection to container {self.name}: its attached client ended ({how}{'; ' + last if last else ''}); "
            "the run cannot continue"
        )

    def _start_problem(self, problem: dict) -> str:
        what, message = problem.get("what"), problem.get("message", "")
        if what == "cwd":
            return (f"cannot start bash in the working directory {problem.get('path', '')}: {message} "
                    "(a command removed or replaced it); the run cannot continue")
        if what == "exec":
            return f"cannot start bash in container {self.name}: {message} (a command removed it?); the run cannot continue"
        return f"cannot start a command in container {self.name}: {what}: {message}"

    @staticmethod
    def _result(buffer: BoundedBuffer, started: float, rc: int | None, *, timed_out: bool = False,
                interrupted: bool = False, sandbox_error: str | None = None) -> CommandResult:
        text, chars, elided = buffer.text()
        return CommandResult(
            output=text, returncode=rc, timed_out=timed_out, duration_s=time.monotonic() - started,
            output_chars=chars, elided_chars=elided, interrupted=interrupted, sandbox_error=sandbox_error,
        )  # fmt: skip

    def interrupt(self) -> None:
        """Signal-safe: a flag and a byte on a pipe; the waiting execute() sends the kill request."""
        if self._executing:
            self._interrupted = True
            self._poke()

    def _poke(self) -> None:
        try:
            os.write(self._wake_w, b"!")
        except OSError:  # full (already poked) or closed
            pass

    # -- the stream ----------------------------------------------------------------------------------------
    def _send(self, data: bytes) -> None:
        view = memoryview(data)
        fd = self.proc.stdin.fileno()
        while view:
            view = view[os.write(fd, view) :]

    def _receive(self, timeout: float) -> tuple[list[tuple[bytes, bytes]], bool]:
        """Frames that arrive within `timeout` (returns early on any), and whether the stream ended."""
        fds = [self._out, self._wake_r] + ([self._err] if self._err is not None else [])
        try:
            ready = select.select(fds, [], [], timeout)[0]
        except (OSError, ValueError):  # closed under us
            return [], True
        if self._wake_r in ready:
            self._drain_wake()
        if self._err in ready:
            self._read_stderr()
        if self._out not in ready:
            return [], False
        eof = False
        for _ in range(16):  # a bounded batch, so deadlines are checked during a flood
            try:
                data = os.read(self._out, CHUNK * 4)
            except BlockingIOError:
                break
            except OSError:
                eof = True
                break
            if not data:
                eof = True
                break
            self.inbox += data
        return parse_frames(self.inbox), eof

    def _read_stderr(self, final: bool = False) -> None:
        while self._err is not None:
            try:
                data = os.read(self._err, CHUNK)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._err = None
                return
            self.stderr = (self.stderr + data)[-STDERR_KEPT:]
            if not final:
                return

    def _drain_wake(self) -> None:
        try:
            while os.read(self._wake_r, 64):
                pass
        except OSError:
            pass

    def close(self) -> None:
        """After the container is removed: reap the client. From a signal handler during execute(), the
        descriptors it reads are left for it to release."""
        self.closed = True
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        if stopped(self.proc.pid):  # a stopped client (SIGSTOP) would never end by itself
            self.proc.kill()
        if wait_for(self.proc, 5) is None:
            self.proc.kill()
            self.proc.wait()
        if not self._executing:
            self.release()

    def release(self) -> None:
        for stream in (self.proc.stdout, self.proc.stderr):
            try:
                stream.close()
            except OSError:
                pass
        fds, self._wake_fds = self._wake_fds, ()
        for fd in fds:  # once only: a closed number may already belong to another file
            os.close(fd)
