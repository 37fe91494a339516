"""A whole-call deadline for a blocking call that only something outside it can cut short (an HTTP request
whose reads each have their own timeout, so a server trickling one byte at a time would never trip them)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

IDLE_EXIT_S = 30.0  # a watchdog with nothing armed for this long ends its thread (a finished run's model)


class Watchdog:
    """Calls `cut()` when an armed deadline passes before `disarm()`.

    One thread, asleep until the earliest deadline armed: arming one later than that (the usual case: each
    call's deadline is later than the last) wakes nobody, so a call pays for a lock, not for a thread.
    """

    def __init__(self, cut: Callable[[], None]):
        self._cut = cut
        self._cond = threading.Condition()
        self._deadline: float | None = None
        self._waking_at = float("inf")
        self._thread: threading.Thread | None = None

    def arm(self, deadline: float) -> None:
        with self._cond:
            self._deadline = deadline
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="miniswe-call-watchdog", daemon=True)
                self._thread.start()
            elif deadline < self._waking_at:
                self._cond.notify()

    def disarm(self) -> None:
        with self._cond:
            self._deadline = None

    def _watch(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                if self._deadline is None:
                    self._waking_at = now + IDLE_EXIT_S
                    if not self._cond.wait(IDLE_EXIT_S) and self._deadline is None:
                        self._thread = None
                        return
                elif now >= self._deadline:
                    self._deadline = None
                    self._cut()  # signal-safe by contract: a flag and a socket shutdown, no locks
                else:
                    self._waking_at = self._deadline
                    self._cond.wait(self._deadline - now)
