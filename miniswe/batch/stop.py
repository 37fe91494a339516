"""When a batch stops early: Ctrl-C/SIGTERM (once: gracefully; twice: at once) and the batch-wide budgets.

Running tasks learn it at their next step boundary through `should_stop`, so each ends with a
recorded status (`Interrupted`, `LimitsExceeded`) and a valid trajectory.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable

from miniswe.agent import Outcome
from miniswe.models.gate import CallGate
from miniswe.status import ExitStatus

SIGNAL_NAMES = {signal.SIGINT: "SIGINT", signal.SIGTERM: "SIGTERM"}


class StopControl:
    def __init__(self, *, cost_limit: float = 0.0, token_limit: int = 0):
        self.cost_limit = cost_limit
        self.token_limit = token_limit
        self.signal_name: str | None = None
        self.aborted = False
        self.gates: list[CallGate] = []
        self.cost = 0.0
        self.tokens = 0
        self.changed = threading.Event()  # wakes the main thread: a signal came, or a worker is done
        self._lock = threading.Lock()

    def on_signal(self, name: str) -> None:
        """First signal: graceful stop. Second: stop at once."""
        if self.signal_name is None:
            self.signal_name = name
            for gate in self.gates:
                gate.cancelled.set()  # a task waiting out a backoff has reached a boundary of its own: stop it
        else:
            self.abort()
        self.changed.set()

    def abort(self) -> None:
        self.aborted = True
        for gate in self.gates:
            gate.cancelled.set()  # model calls waiting out a backoff give up now
        kill_command_groups()

    def add_usage(self, tokens: int, cost: float) -> None:
        with self._lock:
            self.tokens += tokens
            self.cost += cost

    def budget_reached(self) -> str | None:
        if self.cost_limit and self.cost >= self.cost_limit:
            return f"batch_cost_limit: ${self.cost:.4f} >= ${self.cost_limit:g} spent by this batch"
        if self.token_limit and self.tokens >= self.token_limit:
            return f"batch_token_limit: {self.tokens} >= {self.token_limit} tokens used by this batch"
        return None

    def accepting(self) -> bool:
        """May a new task start?"""
        return self.signal_name is None and self.budget_reached() is None

    def task_outcome(self) -> Outcome | None:
        """The `should_stop` hook of every running task."""
        if self.signal_name:
            return Outcome(ExitStatus.INTERRUPTED, self.signal_name)
        reason = self.budget_reached()
        return Outcome(ExitStatus.LIMITS_EXCEEDED, reason) if reason else None


def install_signal_handlers(control: StopControl) -> Callable[[], None]:
    """Route SIGINT/SIGTERM to `control`; returns a function restoring the previous handlers."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = {sig: signal.getsignal(sig) for sig in SIGNAL_NAMES}

    def handler(signum, frame):
        control.on_signal(SIGNAL_NAMES[signum])

    for sig in SIGNAL_NAMES:
        signal.signal(sig, handler)

    def restore() -> None:
        for sig, old in previous.items():
            signal.signal(sig, old)

    return restore


def kill_command_groups() -> int:
    """Kill every command this process runs in a group of its own (how environments start commands).

    Found through /proc: a child whose process group id is its own pid. Killing the group ends the
    command and everything it started; the step then returns and the task stops at its boundary.
    """
    me = os.getpid()
    killed = 0
    try:
        names = os.listdir("/proc")
    except OSError:
        return 0
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        # the command name may hold spaces or parentheses: the fixed fields start after the last ')'
        fields = stat[stat.rfind(b")") + 2 :].split()
        pid = int(name)
        if len(fields) > 2 and int(fields[1]) == me and int(fields[2]) == pid:
            try:
                os.killpg(pid, signal.SIGKILL)
                killed += 1
            except OSError:
                pass
    return killed
