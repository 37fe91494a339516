"""Processes on this host, read from /proc: a process's start time (is the owner of a container still the
same process?), without forking anything."""

from __future__ import annotations

import os


def running(pid: int, start: str = "") -> bool:
    """Whether process `pid`, started at `start` (from process_start; "" when not known), still runs. Read from
    /proc where there is one: a zombie has exited, and a pid with another start time is another process's.
    Elsewhere (macOS), kill(pid, 0) is all there is."""
    if os.path.exists("/proc/self/stat"):
        now = process_start(pid)
        return now is not None and (not start or now == start)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: it runs
        pass
    return True


def process_start(pid: int) -> str | None:
    """The process's start time in clock ticks after boot (/proc/PID/stat field 22), or None if it is gone.

    A zombie (killed, not yet reaped by its parent) is gone: it has exited and can clean up nothing.
    """
    fields = _stat_fields(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return None
    return fields[19]


def stopped(pid: int) -> bool:
    """Whether the process is stopped (SIGSTOP, or a tracer's stop): it runs nothing until continued."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] in ("T", "t")


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (which may hold spaces and parentheses), from field 3."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            raw = stat.read()
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2 :].decode("ascii", "replace").split()
    return fields if len(fields) > 19 else None
