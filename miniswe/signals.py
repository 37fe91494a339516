"""One way to stop: a Stop request shared by everything a run or a batch must stop, and the signal handlers
that raise it (SIGINT, SIGTERM and SIGHUP alike).

A stop is noticed three ways: at step boundaries (`outcome`), by waits (`wait`, used for backoffs and
rate-limit pauses), and, when urgent, by whatever registered a canceller (`cancelling`): the running
command's environment kills it, a model call in flight is cut off. Handlers never raise into the code
they interrupt, so a killed command's partial output comes back as a value and is recorded like any step.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import select
import signal
import threading
from collections.abc import Callable, Iterator

from miniswe.status import STOP_SIGNALS, Outcome, interrupted


class Stop:
    """Why a run (or every run of a batch) must stop, and whether at once.

    `request` is safe in a signal handler: it takes no lock, only sets attributes, writes to a pipe and
    calls the registered cancellers (which must be signal-safe too: a kill, a socket shutdown).
    """

    def __init__(self) -> None:
        self.outcome: Outcome | None = None
        self.urgent = False
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_write, False)
        self._cancellers: dict[int, Callable[[], None]] = {}
        self._keys = itertools.count()
        self._children: list[Stop] = []

    def request(self, outcome: Outcome, *, urgent: bool = False) -> None:
        """Ask everyone to stop with `outcome` (the first request's outcome wins); `urgent` cuts work short now."""
        if self.outcome is None:
            self.outcome = outcome
            _poke(self._wake_write)
        if urgent and not self.urgent:
            self.urgent = True
            for cancel in list(self._cancellers.values()):
                _quietly(cancel)
        for child in list(self._children):
            child.request(outcome, urgent=urgent)

    def linked(self) -> Stop:
        """A Stop for work started under this one (a sub-agent): stopping this stops it too, but it may be stopped
        alone (its command ended). `unlink` it when the work is done."""
        child = Stop()
        self._children.append(child)
        if self.outcome is not None:
            child.request(self.outcome, urgent=self.urgent)
        return child

    def unlink(self, child: Stop) -> None:
        if child in self._children:
            self._children.remove(child)
        child.close()

    def rearm(self) -> None:
        """Ready for the next piece of work after a stop (a chat session's next turn): the request is forgotten.
        Call it only when nothing is running (no canceller registered, no signal handler that may request)."""
        self.outcome = None
        self.urgent = False
        os.set_blocking(self._wake_read, False)
        try:
            while os.read(self._wake_read, 4096):
                pass
        except OSError:  # BlockingIOError: drained
            pass
        finally:
            os.set_blocking(self._wake_read, True)

    def wait(self, seconds: float) -> bool:
        """Sleep up to `seconds`, waking as soon as a stop is requested; True when one was."""
        if self.outcome is None and seconds > 0:
            poller = select.poll()
            poller.register(self._wake_read, select.POLLIN)
            poller.poll(min(seconds, 86_400.0) * 1000)
        return self.outcome is not None

    @contextlib.contextmanager
    def cancelling(self, cancel: Callable[[], None]) -> Iterator[None]:
        """Within this block, an urgent stop calls `cancel` (at once if one was already requested)."""
        key = next(self._keys)
        self._cancellers[key] = cancel
        try:
            if self.urgent:
                _quietly(cancel)
            yield
        finally:
            self._cancellers.pop(key, None)

    def close(self) -> None:
        for fd in (self._wake_read, self._wake_write):
            try:
                os.close(fd)
            except OSError:
                pass
        self._wake_read = self._wake_write = -1

    def __del__(self) -> None:
        if getattr(self, "_wake_read", -1) >= 0:
            self.close()


def _poke(fd: int) -> None:
    try:
        os.write(fd, b"!")
    except OSError:  # full (already poked) or closed: either way nobody needs another wake-up
        pass


def _quietly(cancel: Callable[[], None]) -> None:
    try:
        cancel()
    except Exception:  # a canceller that fails must not keep the others from running
        pass


class SignalHandlers:
    """SIGINT, SIGTERM and SIGHUP become stop requests while this context is active (main thread only),
    unless the process was started with one ignored (`nohup` ignores SIGHUP, a background job SIGINT).

    `run` stops at once on the first signal (`first_urgent`); a batch stops gracefully on the first and at
    once on the second. A third signal, for a process stuck somewhere no canceller reaches, raises
    KeyboardInterrupt: the escape hatch, at the cost of an orderly end.
    """

    def __init__(self, stop: Stop, *, first_urgent: bool, on_signal: Callable[[str], None] | None = None):
        self.stop = stop
        self.first_urgent = first_urgent
        self.on_signal = on_signal
        self.received: list[str] = []
        self._previous: dict[int, object] = {}

    @property
    def signal_name(self) -> str | None:
        return self.received[0] if self.received else None

    def __enter__(self) -> SignalHandlers:
        if threading.current_thread() is threading.main_thread():
            for number in STOP_SIGNALS.values():
                previous = signal.getsignal(number)
                if previous is signal.SIG_IGN:
                    continue  # ignored by whoever started us (nohup, a background job): that is their choice
                self._previous[number] = previous
                signal.signal(number, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for number, previous in self._previous.items():
            signal.signal(number, previous)
        self._previous.clear()

    def _handle(self, signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        self.received.append(name)
        if len(self.received) > 2:
            raise KeyboardInterrupt
        self.stop.request(interrupted(self.received[0]), urgent=self.first_urgent or len(self.received) > 1)
        if self.on_signal:
            self.on_signal(name)
