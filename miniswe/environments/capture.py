"""Bounded capture of a subprocess's merged output: keeps a head and a tail, counts the rest.

Shared by every environment that runs a child process, so memory stays flat whatever a command prints.
"""

from __future__ import annotations

import os
import select
import subprocess
import time
from collections.abc import Callable
from typing import Protocol

from miniswe.environments import CommandResult

CHUNK = 1 << 16
# After the shell has exited: how long a pause in output ends the step, and how long reading may go on at
# most, so a process that escaped the group (setsid) and keeps printing cannot hold the step open.
DRAIN_QUIET_S = 0.05
DRAIN_MAX_S = 0.5
KILLED_WAIT_S = 5.0  # a SIGKILLed process ends at once; this only bounds a kernel that holds it (D state)


class BoundedBuffer:
    """Keeps the first and last `limit // 2` bytes of a stream and the total size; all of it for limit 0.

    The tail is a ring of fixed size, filled in place: memory does not depend on how much a command prints,
    nor on how the allocator copes with a buffer that grows and shrinks (it never does here).
    """

    def __init__(self, limit: int):
        self.unlimited = limit <= 0  # 0 means unlimited, as everywhere else in the config
        self.head_limit = limit // 2
        self.tail_limit = limit - self.head_limit
        self.head = bytearray()
        self.ring: bytearray | None = None  # allocated once the head is full
        self.ring_end = 0  # where the next byte goes
        self.ring_full = False
        self.total = 0

    def feed(self, data: bytes | memoryview) -> None:
        self.total += len(data)
        if self.unlimited:
            self.head += data
            return
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if not data:
            return
        if self.ring is None:
            self.ring = bytearray(self.tail_limit)
        size = self.tail_limit
        if len(data) >= size:
            self.ring[:] = data[len(data) - size :]
            self.ring_end, self.ring_full = 0, True
            return
        first = min(len(data), size - self.ring_end)
        self.ring[self.ring_end : self.ring_end + first] = data[:first]
        self.ring[: len(data) - first] = data[first:]
        if self.ring_end + len(data) >= size:
            self.ring_full = True
        self.ring_end = (self.ring_end + len(data)) % size

    def _tail(self) -> bytes:
        if self.ring is None:
            return b""
        if not self.ring_full:
            return bytes(self.ring[: self.ring_end])
        return bytes(self.ring[self.ring_end :] + self.ring[: self.ring_end])

    def skip(self, count: int) -> None:
        """`count` bytes were dropped upstream (the container's executor keeps a tail too). It drops only
        once its own tail holds a full tail's worth of newer bytes, all sent after this, so what came
        before cannot be in the final tail."""
        self.total += count
        self.ring_end, self.ring_full = 0, False

    def text(self) -> tuple[str, int, int]:
        """(kept text, full size, elided size). Undecodable bytes become U+FFFD."""
        tail = self._tail()
        elided = self.total - len(self.head) - len(tail)
        if not elided:
            whole = (bytes(self.head) + tail).decode("utf-8", errors="replace")
            return whole, len(whole), 0
        head = self.head.decode("utf-8", errors="replace")
        tail_text = tail.decode("utf-8", errors="replace")
        return head + elision_notice(elided) + tail_text, len(head) + elided + len(tail_text), elided


def elision_notice(elided: int) -> str:
    """What stands in an output, between its head and tail, for the bytes the capture did not keep."""
    return f"\n[... {elided} bytes of output elided by miniswe ...]\n"


class ExitWatch(Protocol):
    """How the capture learns that the command ended: an fd that turns readable then, and its return code."""

    def fileno(self) -> int: ...

    def poll(self) -> int | None:
        """The return code once the command has ended (negative: killed by that signal), else None."""
        ...


def capture(
    fd: int,
    ended: ExitWatch,
    *,
    timeout: float,
    limit: int,
    kill: Callable[[], None],
    started: float | None = None,
) -> CommandResult:
    """Read the pipe `fd` until the command ends or `timeout` passes, then call `kill` for leftovers.

    The step ends when the command itself exits, whatever holds the pipe: waiting for EOF would hang on
    `server &`. And output ending early (`exec >log`) does not end it either: the wait for the exit keeps
    its deadline. `kill` is called on timeout and after a normal exit, so nothing the command started
    outlives the step. Every wait here has a deadline.
    """
    started = time.monotonic() if started is None else started
    deadline = started + timeout
    buffer = BoundedBuffer(limit)
    chunk = bytearray(CHUNK)  # every read lands here: no allocation per read
    os.set_blocking(fd, False)
    timed_out = eof = False
    code = None
    try:
        while (code := ended.poll()) is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            # checked even while output flows: an escaped process may keep the pipe busy after the shell exits
            ready, _, _ = select.select([ended] if eof else [fd, ended], [], [],
                                        min(remaining, getattr(ended, "poll_interval", remaining)))
            if fd in ready:
                eof = _read_available(fd, buffer, chunk)
        kill()
        if timed_out:
            _await(ended, KILLED_WAIT_S)
        if not eof:
            _drain(fd, buffer, chunk)
    except BaseException:
        kill()  # whatever ends the wait early must not leave the command running
        _await(ended, KILLED_WAIT_S)
        raise
    finally:
        os.close(fd)
    return _result(buffer, None if timed_out else code, timed_out, started)


def run_captured(
    proc: subprocess.Popen,
    *,
    timeout: float,
    limit: int,
    kill: Callable[[], None],
    started: float | None = None,
) -> CommandResult:
    """`capture` for a child process started with `stdout=PIPE` (stderr merged into it)."""
    watch = _PopenExit(proc)
    try:
        return capture(os.dup(proc.stdout.fileno()), watch, timeout=timeout, limit=limit, kill=kill, started=started)
    finally:
        watch.close()
        proc.stdout.close()


class _PopenExit:
    """A Popen's end, through a pidfd (readable when the process exits), or a pipe that never turns
    readable plus polling where pidfds are missing."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        try:
            self._fd = os.pidfd_open(proc.pid)
            self._spare = None
        except (AttributeError, OSError):
            self._spare = os.pipe()
            self._fd = self._spare[0]
            self.poll_interval = 0.05  # no pidfd: nothing wakes select at the exit, so look often

    def fileno(self) -> int:
        return self._fd

    def poll(self) -> int | None:
        return self.proc.poll()

    def close(self) -> None:
        for fd in self._spare or (self._fd,):
            os.close(fd)


def wait_for(proc: subprocess.Popen, seconds: float) -> int | None:
    """`proc`'s exit code if it ends within `seconds`, else None; woken by its end, where Popen.wait polls
    with growing sleeps (up to 8 ms late at a 10 ms exit)."""
    watch = _PopenExit(proc)
    try:
        _await(watch, seconds)
    finally:
        watch.close()
    return proc.poll()


def _await(ended: ExitWatch, seconds: float) -> None:
    """Wait up to `seconds` for a process to end (a killed one does at once, unless the kernel holds it)."""
    deadline = time.monotonic() + seconds
    while ended.poll() is None and (left := deadline - time.monotonic()) > 0:
        select.select([ended], [], [], min(left, getattr(ended, "poll_interval", left)))


def _result(buffer: BoundedBuffer, returncode: int | None, timed_out: bool, started: float) -> CommandResult:
    text, chars, elided = buffer.text()
    return CommandResult(
        output=text,
        returncode=returncode,
        timed_out=timed_out,
        duration_s=time.monotonic() - started,
        output_chars=chars,
        elided_chars=elided,
    )


def _read_available(fd: int, buffer: BoundedBuffer, chunk: bytearray) -> bool:
    """Read what the pipe holds now into `chunk` (at most 16 times, so deadlines are checked during a flood);
    True at EOF."""
    view = memoryview(chunk)
    for _ in range(16):
        try:
            count = os.readv(fd, [chunk])
        except BlockingIOError:
            return False
        if not count:
            return True
        buffer.feed(view[:count])
    return False


def _drain(fd: int, buffer: BoundedBuffer, chunk: bytearray) -> None:
    """Collect output already written by the finished command, without waiting on a holder that escaped."""
    deadline = time.monotonic() + DRAIN_MAX_S
    while time.monotonic() < deadline and select.select([fd], [], [], DRAIN_QUIET_S)[0]:
        if _read_available(fd, buffer, chunk):
            return


