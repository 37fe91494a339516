"""The hub of a batch on a Ray cluster: one actor, beside the driver, that holds what every node's tasks share.

It holds the driver's stop and each endpoint's pause (a 429's Retry-After) for the workers, who follow
them with `watch`, a long poll that answers as soon as either changes; it keeps the cap on model calls in
flight (`enter`/`leave`); and it buffers what workers report (events, trajectory copies) until the driver
takes them. No method blocks the actor: `watch` awaits, every other one returns at once, and callers wait
on their own side, watching their own Stop and deadline meanwhile. The class is plain Python (asyncio);
the Ray executor makes it an actor, so Ray is not imported here.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

NO_SLOT = -1.0  # `enter`: no free slot under the cap; ask again shortly


class Hub:
    def __init__(self, max_concurrent: int = 0):
        self.max_concurrent = max_concurrent
        self.version = 0  # bumped when the stop or a pause changes
        self.stop: tuple[Any, bool] = (None, False)  # (Outcome or None, urgent)
        self.resume_at: dict[str, float] = {}  # by endpoint: when its pause ends (this process's clock)
        self.holders: dict[str, set[str]] = {}  # by endpoint: the tasks holding a slot
        self.events: list[Any] = []
        self.counts: dict[str, int] = {}  # by task id: events received (see `settle`)
        self._arrived: asyncio.Event | None = None
        self.copies: dict[str, tuple[int, bytes]] = {}  # by task id: (attempt, latest trajectory bytes)
        self._changed: asyncio.Event | None = None

    def _bump(self) -> None:
        self.version += 1
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    # -- what workers follow ---------------------------------------------------------------------------------
    async def watch(self, seen: int, timeout: float) -> tuple[int, Any, bool, dict[str, float]]:
        """(version, stop outcome, urgent, seconds left of each endpoint's pause), as soon as the version differs
        from `seen`, or after `timeout`."""
        if seen == self.version:
            if self._changed is None:
                self._changed = asyncio.Event()
            try:
                await asyncio.wait_for(self._changed.wait(), timeout)
            except asyncio.TimeoutError:
                pass
        now = time.monotonic()
        pauses = {url: at - now for url, at in self.resume_at.items() if at > now}
        return self.version, self.stop[0], self.stop[1], pauses

    async def set_stop(self, outcome: Any, urgent: bool) -> None:
        self.stop = (self.stop[0] or outcome, self.stop[1] or urgent)
        self._bump()

    async def pause(self, url: str, seconds: float) -> None:
        """Hold every caller of `url` back for at least `seconds` from now."""
        self.resume_at[url] = max(self.resume_at.get(url, 0.0), time.monotonic() + seconds)
        self._bump()

    # -- what workers report ---------------------------------------------------------------------------------
    async def report(self, events: list[Any], copies: dict[str, tuple[int, bytes]] | None = None,
                     task_id: str = "") -> None:
        self.events.extend(events)
        if copies:
            self.copies.update(copies)
        if events and task_id:
            self.counts[task_id] = self.counts.get(task_id, 0) + len(events)
            if self._arrived is not None:
                self._arrived.set()
                self._arrived = None

    async def settle(self, task_id: str, sent: int, timeout: float) -> bool:
        """Once the `sent` events a task reported have all arrived (Ray does not keep an asyncio actor's calls
        in order), or after `timeout`; the worker returns its result only then."""
        deadline = time.monotonic() + timeout
        while self.counts.get(task_id, 0) < sent and (left := deadline - time.monotonic()) > 0:
            if self._arrived is None:
                self._arrived = asyncio.Event()
            try:
                await asyncio.wait_for(self._arrived.wait(), left)
            except asyncio.TimeoutError:
                pass
        return self.counts.pop(task_id, 0) >= sent

    async def take(self) -> tuple[list[Any], dict[str, tuple[int, bytes]]]:
        """Everything reported since the last call (the driver's side)."""
        events, copies = self.events, self.copies
        self.events, self.copies = [], {}
        return events, copies

    # -- the cap on calls in flight ----------------------------------------------------------------------------
    async def enter(self, url: str, holder: str) -> float:
        """0 when `holder` may call `url` now (holding one of its slots); the seconds left of a pause to wait
        out first; or NO_SLOT."""
        paused_for = self.resume_at.get(url, 0.0) - time.monotonic()
        if paused_for > 0:
            return paused_for
        holders = self.holders.setdefault(url, set())
        if self.max_concurrent > 0 and len(holders) >= self.max_concurrent and holder not in holders:
            return NO_SLOT
        holders.add(holder)
        return 0.0

    async def leave(self, url: str, holder: str) -> None:
        self.holders.get(url, set()).discard(holder)

    async def forget(self, holder: str) -> None:
        """A task whose worker is gone (its node died) gives back the slots it held."""
        for holders in self.holders.values():
            holders.discard(holder)
