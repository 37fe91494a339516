"""Retrying a model call, for any backend: Fibonacci backoff with jitter, Retry-After honoured through the
endpoint's shared gate, every wait bounded by the run's deadline and cut short by its Stop."""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from miniswe.config import Count, Seconds, Settings
from miniswe.errors import Cancelled, DeadlineReached, ModelError
from miniswe.models.gate import CallGate
from miniswe.signals import Stop

T = TypeVar("T")
MAX_RETRY_AFTER = 3600.0


class RetrySettings(Settings):
    retries: Count = 10  # retries after the first attempt on connection errors, timeouts, 408/409/425/429, 5xx, malformed replies
    max_backoff: Seconds = 60.0  # ceiling in seconds of the Fibonacci backoff between retries


class Transient(Exception):
    """A failed attempt worth another: the endpoint may answer next time."""

    def __init__(self, message: str, retry_after: float | None = None, busy_for: float = 0.0):
        super().__init__(message)
        self.retry_after = retry_after
        # a call given up on after this many seconds: the server may go on generating its answer for as long
        # (llama.cpp does), so the retry waits at least that long rather than queue behind it
        self.busy_for = busy_for


def fibonacci_delays(cap: float) -> Iterator[float]:
    a, b = 1.0, 1.0
    while True:
        yield min(a, cap)
        a, b = b, a + b


def call_with_retries(
    attempt: Callable[[], T],
    *,
    settings: RetrySettings,
    gate: CallGate,
    stop: Stop,
    deadline: float | None,
    on_retry: Callable[[str], None],
    scrub: Callable[[str], str] = lambda text: text,
) -> T:
    """`attempt()` until it returns; Transient failures are retried, each retry told to `on_retry`.

    Raises ModelError when retries run out, DeadlineReached as soon as the deadline would pass before the
    next attempt (waiting it out would only end the run later), Cancelled when a stop is requested.
    """
    delays = fibonacci_delays(settings.max_backoff)
    retries = 0
    while True:
        with gate.slot(stop, deadline):
            try:
                return attempt()
            except Transient as error:
                failure = error
        if retries >= settings.retries:
            raise ModelError(scrub(f"{failure} (gave up after {retries + 1} attempts)"))
        # the backoff, jitter included, stays under max_backoff; a call given up on is waited out in full, whatever
        # the cap (a local server still generating its answer would only queue the retry behind it), unless that
        # wait would pass the run's deadline: then the backoff's retry is its last chance
        delay = min(next(delays) * random.uniform(1.0, 1.25), settings.max_backoff)
        if failure.busy_for > delay and (deadline is None or time.monotonic() + failure.busy_for < deadline):
            delay = failure.busy_for
        if failure.retry_after is not None:
            gate.pause(failure.retry_after)
            delay = max(delay, failure.retry_after)
        if deadline is not None and time.monotonic() + delay >= deadline:
            raise DeadlineReached(scrub(f"time_limit reached: {failure}; the next retry would start after the run's time is up"))
        retries += 1
        on_retry(scrub(f"{failure}; retry {retries} of {settings.retries} in {delay:.1f}s"))
        if stop.wait(delay):
            raise Cancelled("model call cancelled while waiting to retry")


def parse_retry_after(value: str | None) -> float | None:
    """Seconds to wait from a Retry-After header (seconds or an HTTP date); None when absent or unreadable."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError, OverflowError, IndexError):
            return None
    # a server asking for more than an hour (or for inf) is not taken literally
    return min(max(0.0, seconds), MAX_RETRY_AFTER) if seconds == seconds else None
