"""Waiting in tests for something another process does, with a deadline and a message that says what never came."""

import time


def wait_for(predicate, what: str = "the condition", timeout: float = 20):
    """The first truthy value of `predicate()`, polled until `timeout` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(0.02)
