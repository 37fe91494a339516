"""Bounded capture of a subprocess's merged output: keeps a head and a tail, counts the rest.

Shared by every environment that runs a child process, so memory stays flat whatever a command prints.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from collections.abc import Callable

from miniswe.environments import CommandResult

CHUNK = 1 << 16
# After the shell has exited: how long a pause in output ends the step, and how long reading may go on at
# most, so a process that escaped the group (setsid) and keeps printing cannot hold the step open.
DRAIN_QUIET_S = 0.05
DRAIN_MAX_S = 0.5


class BoundedBuffer:
    """Keeps the first and last `limit // 2` bytes of a stream and the total size; all of it when `limit` is 0."""

    def __init__(self, limit: int):
        self.head_limit = limit // 2 if limit > 0 else sys.maxsize
        self.tail_limit = limit - limit // 2 if limit > 0 else 0
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            # trim lazily so a flood costs one memmove per tail_limit bytes, not per chunk
            if len(self.tail) > 2 * self.tail_limit:
                del self.tail[: len(self.tail) - self.tail_limit]

    def skip(self, count: int) -> None:
        """`count` bytes were dropped upstream (the container's executor keeps a tail too). It drops only
        once its own tail holds a full tail's worth of newer bytes, all sent after this, so what came
        before cannot be in the final tail."""
        self.total += count
        self.tail.clear()

    def text(self) -> tuple[str, int, int]:
        """(kept text, full size, elided size). Undecodable bytes become U+FFFD."""
        if len(self.tail) > self.tail_limit:
            del self.tail[: len(self.tail) - self.tail_limit]
        elided = self.total - len(self.head) - len(self.tail)
        if not elided:
            whole = (self.head + self.tail).decode("utf-8", errors="replace")
            return whole, len(whole), 0
        head = self.head.decode("utf-8", errors="replace")
        tail = self.tail.decode("utf-8", errors="replace")
        notice = f"\n[... {elided} bytes of output elided by miniswe ...]\n"
        return head + notice + tail, len(head) + elided + len(tail), elided


def run_captured(
    proc: subprocess.Popen,
    *,
    timeout: float,
    limit: int,
    kill: Callable[[], None],
    started: float | None = None,
) -> CommandResult:
    """Read `proc.stdout` until the process exits or `timeout` passes, then call `kill` for leftovers.

    The step ends when the process itself exits, even if a background child still holds the pipe:
    waiting for EOF would hang on `server &`. `kill` is called on timeout and after a normal exit,
    so nothing the command started outlives the step.
    """
    started = time.monotonic() if started is None else started
    deadline = started + timeout
    buffer = BoundedBuffer(limit)
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    watch = _exit_watcher(proc.pid)
    timed_out = False
    eof = False
    try:
        while not eof:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            waiting = [fd] if watch is None else [fd, watch]
            ready, _, _ = select.select(waiting, [], [], min(remaining, 0.05 if watch is None else remaining))
            if fd in ready:
                eof = _read_available(fd, buffer)
            # checked even while output flows: an escaped process may keep the pipe busy after the shell exits
            exited = watch in ready if watch is not None else proc.poll() is not None
            if exited and not eof:
                break
        if timed_out:
            kill()
            proc.wait()
        else:
            proc.wait()
            kill()
        if not eof:
            _drain(fd, buffer)
    except BaseException:
        kill()  # whatever ends the wait early must not leave the command running
        proc.wait()
        raise
    finally:
        if watch is not None:
            os.close(watch)
        proc.stdout.close()
    return _result(buffer, None if timed_out else proc.returncode, timed_out, started)


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


def _read_available(fd: int, buffer: BoundedBuffer) -> bool:
    """Read what the pipe holds now (at most 16 chunks, so deadlines are checked during a flood); True at EOF."""
    for _ in range(16):
        try:
            data = os.read(fd, CHUNK)
        except BlockingIOError:
            return False
        if not data:
            return True
        buffer.feed(data)
    return False


def _drain(fd: int, buffer: BoundedBuffer) -> None:
    """Collect output already written by the finished command, without waiting on a holder that escaped."""
    deadline = time.monotonic() + DRAIN_MAX_S
    while time.monotonic() < deadline and select.select([fd], [], [], DRAIN_QUIET_S)[0]:
        if _read_available(fd, buffer):
            return


def _exit_watcher(pid: int) -> int | None:
    """A pidfd that turns readable when the process exits, so select wakes without polling."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None
