"""One gate per endpoint, shared by every client of a batch: a cap on calls in flight and a common pause.

When any client is told to slow down (429, Retry-After), all of them wait out the same pause instead
of each hammering the endpoint on its own schedule.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator


class CallGate:
    def __init__(self, max_concurrent: int = 0, on_retry: Callable[[str], None] | None = None):
        self.on_retry = on_retry  # told of each retry, so a person watching knows why nothing happens
        self._slots = threading.BoundedSemaphore(max_concurrent) if max_concurrent > 0 else None
        self._lock = threading.Lock()
        self._resume_at = 0.0
        self.cancelled = threading.Event()

    def pause(self, seconds: float) -> None:
        """Hold every caller back for at least `seconds` from now."""
        with self._lock:
            self._resume_at = max(self._resume_at, time.monotonic() + seconds)

    def wait(self, seconds: float) -> bool:
        """Sleep unless cancelled first; True when cancelled."""
        return self.cancelled.wait(seconds)

    @contextlib.contextmanager
    def slot(self) -> Iterator[None]:
        while True:
            self._wait_out_pause()
            if self._slots is not None:
                self._slots.acquire()
            # a pause may have begun while this caller queued for a slot: honour it before calling
            if self._paused_for() <= 0 or self.cancelled.is_set():
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

    def _wait_out_pause(self) -> None:
        while (delay := self._paused_for()) > 0:
            if self.wait(delay):
                return
