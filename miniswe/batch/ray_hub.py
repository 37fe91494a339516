"""The hub of a batch on a Ray cluster: one actor, beside the driver, that holds what every node's tasks share.

It mirrors the driver's Stop for the workers to poll, keeps one call gate per endpoint (the pause a 429 asks
for, the cap on calls in flight), and buffers what workers report (events, trajectory copies) until the
driver takes it. Every method returns at once: waits happen in the callers, which watch their own Stop and
deadline meanwhile. The class is plain Python; the Ray executor makes it an actor, so Ray is not imported here.
"""

from __future__ import annotations

import time
from typing import Any

NO_SLOT = -1.0  # `enter`: no free slot under the cap; ask again shortly


class Hub:
    def __init__(self, max_concurrent: int = 0):
        self.max_concurrent = max_concurrent
        self.stop: tuple[Any, bool] = (None, False)  # (Outcome or None, urgent)
        self.resume_at: dict[str, float] = {}  # by endpoint: when its pause ends (this process's clock)
        self.holders: dict[str, set[str]] = {}  # by endpoint: the tasks holding a slot
        self.events: list[Any] = []
        self.copies: dict[str, tuple[int, bytes]] = {}  # by task id: (attempt, latest trajectory bytes)

    # -- the stop -------------------------------------------------------------------------------------------
    def set_stop(self, outcome: Any, urgent: bool) -> None:
        self.stop = (self.stop[0] or outcome, self.stop[1] or urgent)

    def report(self, events: list[Any], copies: dict[str, tuple[int, bytes]] | None = None) -> tuple[Any, bool]:
        """A worker's events and trajectory copies, kept in order; the stop it must mirror."""
        self.events.extend(events)
        if copies:
            self.copies.update(copies)
        return self.stop

    def take(self) -> tuple[list[Any], dict[str, tuple[int, bytes]]]:
        """Everything reported since the last call (the driver's side)."""
        events, copies = self.events, self.copies
        self.events, self.copies = [], {}
        return events, copies

    # -- call gates -----------------------------------------------------------------------------------------
    def enter(self, url: str, holder: str) -> float:
        """0 when `holder` may call `url` now (holding a slot if calls are capped); the seconds left of a pause
        to wait out first; or NO_SLOT."""
        paused_for = self.resume_at.get(url, 0.0) - time.monotonic()
        if paused_for > 0:
            return paused_for
        if self.max_concurrent > 0:
            holders = self.holders.setdefault(url, set())
            if len(holders) >= self.max_concurrent and holder not in holders:
                return NO_SLOT
            holders.add(holder)
        return 0.0

    def leave(self, url: str, holder: str) -> None:
        self.holders.get(url, set()).discard(holder)

    def pause(self, url: str, seconds: float) -> None:
        self.resume_at[url] = max(self.resume_at.get(url, 0.0), time.monotonic() + seconds)

    def forget(self, holder: str) -> None:
        """A task whose worker is gone (its node died) gives back the slots it held."""
        for holders in self.holders.values():
            holders.discard(holder)
