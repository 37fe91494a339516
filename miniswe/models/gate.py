"""One gate per endpoint, shared by every client of a batch: a cap on calls in flight and a common pause.

When any client is told to slow down (429, Retry-After), all of them wait out the same pause instead
of each hammering the endpoint on its own schedule. Every wait here ends early when the caller's run
is stopped, and gives up as soon as the caller's deadline would pass first.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

from miniswe.errors import Cancelled, DeadlineReached
from miniswe.signals import Stop

POLL_S = 0.25  # how often a caller queued for a slot looks at its Stop and deadline


class CallGate:
    def __init__(self, max_concurrent: int = 0):
        self._slots = threading.BoundedSemaphore(max_concurrent) if max_concurrent > 0 else None
        self._lock = threading.Lock()
        self._resume_at = 0.0

    def pause(self, seconds: float) -> None:
        """Hold every caller back for at least `seconds` from now."""
        with self._lock:
            self._resume_at = max(self._resume_at, time.monotonic() + seconds)

    @contextlib.contextmanager
    def slot(self, stop: Stop, deadline: float | None = None) -> Iterator[None]:
        while True:
            self._wait_out_pause(stop, deadline)
            if self._slots is not None:
                self._acquire(stop, deadline)
            # a pause may have begun while this caller queued for a slot: honour it before calling
            if self._paused_for() <= 0:
                break
            if self._slots is not None:
                self._slots.release()
        try:
            yield
        finally:
            if self._slots is not None:
                self._slots.release()

    def _paused_for(self) -> float:
        with self._lock:
            return self._resume_at - time.monotonic()

    def _wait_out_pause(self, stop: Stop, deadline: float | None) -> None:
        while (delay := self._paused_for()) > 0:
            wait_out_pause(delay, stop, deadline)

    def _acquire(self, stop: Stop, deadline: float | None) -> None:
        while not self._slots.acquire(timeout=POLL_S):
            still_queued(stop, deadline)


def wait_out_pause(delay: float, stop: Stop, deadline: float | None) -> None:
    """Wait the `delay` seconds the endpoint asked every caller for: cut short by a stop, given up at once when
    the caller's deadline would pass first. Every gate's pause is waited here (the Ray hub's too)."""
    if deadline is not None and time.monotonic() + delay >= deadline:
        raise DeadlineReached(f"time_limit reached: the endpoint asked every caller to wait {delay:.0f}s more")
    if stop.wait(delay):
        raise Cancelled("model call cancelled while the endpoint asked to wait")


def still_queued(stop: Stop, deadline: float | None) -> None:
    """A caller queued for a free slot gives up when its run is stopped or its deadline has passed."""
    if stop.outcome is not None:
        raise Cancelled("model call cancelled while waiting for a free slot")
    if deadline is not None and time.monotonic() >= deadline:
        raise DeadlineReached("time_limit reached while waiting for a free model-call slot")
