"""The batch scheduler: it alone holds what tasks share (the ledger, the budgets, the stop, the call gates,
progress), hands plans to an executor, and is fed by the events the executor's workers send back.

An Executor is where tasks run: threads here (batch/threads.py); a process pool or a cluster plugs in
behind the same four methods without touching this loop.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from miniswe.batch.ledger import BUDGET_PREFIX, Ledger, LedgerRecord
from miniswe.batch.plan import Plan
from miniswe.batch.progress import BatchState
from miniswe.batch.worker import (
    Event,
    StepFinished,
    TaskFinished,
    TaskGrading,
    TaskPulling,
    TaskStarted,
    unfinished_record,
)
from miniswe.environments.images import need_of
from miniswe.errors import TrajectoryError
from miniswe.models.gate import CallGate
from miniswe.signals import SignalHandlers, Stop
from miniswe.status import ExitStatus, Outcome, interrupted, is_agent_outcome
from miniswe.templates import Renderer
from miniswe.trajectory import load

# After a stop at once, how long running tasks get to record themselves before the scheduler records them.
ABORT_GRACE_S = 3.0
POLL_S = 0.1
LOOK_AHEAD = 16  # queued tasks the scheduler looks through for one whose image is there, to start it first


class Gates:
    """One call gate per endpoint, shared by every task calling it: a 429 pauses them all."""

    def __init__(self, max_concurrent: int = 0):
        self.max_concurrent = max_concurrent
        self._gates: dict[str, CallGate] = {}
        self._lock = threading.Lock()

    def for_url(self, url: str) -> CallGate:
        with self._lock:
            gate = self._gates.get(url)
            if gate is None:
                gate = self._gates[url] = CallGate(self.max_concurrent)
            return gate


@dataclass
class Shared:
    """What every task of a batch shares; an executor makes it reachable from wherever its workers run."""

    stop: Stop
    gates: Gates
    renderers: dict[str, Renderer]
    images: Any = None  # BatchImages (environments/images.py) when tasks run in images this process pulls ahead


class Executor(Protocol):
    capacity: int  # tasks it runs at once

    def start(self, shared: Shared) -> None: ...

    def submit(self, plan: Plan, attempt: int) -> None:
        """Run `run_plan(plan, attempt, ...)` on a free worker; its events come back through `events`."""
        ...

    def events(self, timeout: float) -> list[Event]:
        """The events workers sent since the last call, waiting up to `timeout` for the first."""
        ...

    def close(self) -> None: ...


def resumable(path: str) -> bool:
    """A task's recorded run can go on (no paid call lost): it asked the model at least once and ended without
    a verdict (killed, interrupted, a model or sandbox failure) or was cut off by a batch budget."""
    try:
        trajectory = load(path)
    except TrajectoryError:
        return False
    outcome = trajectory.outcome
    if not trajectory.messages or (outcome and outcome.status in (ExitStatus.ERROR, ExitStatus.SETUP_ERROR)):
        return False
    return outcome is None or not is_agent_outcome(outcome.status) or str(outcome.detail).startswith(BUDGET_PREFIX)


class Budget:
    """The batch-wide cost and token limits, counted from every task's steps."""

    def __init__(self, cost_limit: float = 0.0, token_limit: int = 0):
        self.cost_limit, self.token_limit = cost_limit, token_limit
        self.cost, self.tokens = 0.0, 0

    def add(self, tokens: int, cost: float) -> None:
        self.tokens += tokens
        self.cost += cost

    def reached(self) -> str | None:
        if self.cost_limit and self.cost >= self.cost_limit:
            return f"batch_cost_limit: ${self.cost:.4f} >= ${self.cost_limit:g} spent by this batch"
        if self.token_limit and self.tokens >= self.token_limit:
            return f"batch_token_limit: {self.tokens} >= {self.token_limit} tokens used by this batch"
        return None


class Scheduler:
    def __init__(self, *, ledger: Ledger, state: BatchState, progress: Any, budget: Budget, shared: Shared,
                 after_record: Callable[[LedgerRecord], None] = lambda record: None, redo: set[str] = frozenset()):
        self.ledger = ledger
        self.redo = redo  # tasks to start over even if their recorded run could go on
        self.state = state
        self.progress = progress
        self.budget = budget
        self.shared = shared
        self.after_record = after_record
        self.record_failures = 0
        self.signals: SignalHandlers | None = None

    @property
    def stop(self) -> Stop:
        return self.shared.stop

    def run(self, plans: list[Plan], executor: Executor) -> None:
        """Run every plan unless stopped; returns when all have a record, or when a stop at once has waited long enough."""
        pending = collections.deque(plans)
        in_flight: dict[str, tuple[Plan, int]] = {}
        announced = 0
        abort_by: float | None = None
        images = self.shared.images
        told = None  # (pending, in flight) when the image pools were last told what the tasks need
        with SignalHandlers(self.stop, first_urgent=False) as self.signals:
            executor.start(self.shared)
            try:
                while pending or in_flight:
                    if images is not None and told != (len(pending), len(in_flight)):
                        told = (len(pending), len(in_flight))
                        # what unfinished tasks need, in the order they start: pulled ahead, and kept until done
                        images.expect([need_of(p.config.environment) for p, _ in in_flight.values()],
                                      [need_of(p.config.environment) for p in pending])
                    while pending and len(in_flight) < executor.capacity and self.stop.outcome is None:
                        if images is not None and images.fatal:
                            break  # the engine's disk is full: running tasks finish, no new one starts
                        plan = self._next(pending, images)
                        if plan.regrade is not None:  # only grading: the recorded run and its attempt stay
                            attempt = plan.regrade.attempt
                        elif plan.id not in self.redo and resumable(plan.trajectory):
                            plan, attempt = dataclasses.replace(plan, resume=True), self._attempt_of(plan)
                        else:
                            attempt = self._set_aside(plan)
                        in_flight[plan.id] = (plan, attempt)
                        executor.submit(plan, attempt)
                    if not in_flight:
                        break
                    for event in executor.events(POLL_S):
                        self._handle(event, in_flight)
                    announced = self._announce(announced)
                    if self.stop.urgent:
                        abort_by = abort_by or time.monotonic() + ABORT_GRACE_S
                        if time.monotonic() > abort_by:
                            self._record_stuck(in_flight)
                            break
            finally:
                executor.close()
                if images is not None:  # what tasks left unfinished still need: kept for the rerun, the rest may go
                    images.expect([need_of(p.config.environment) for p, _ in in_flight.values()],
                                  [need_of(p.config.environment) for p in pending])

    @staticmethod
    def _next(pending: collections.deque, images: Any) -> Plan:
        """The next plan to start: the first whose image is already there, among the next few, or else the first
        (whose worker waits for its image): a task never waits on a pull while one behind it could run."""
        if images is not None:
            for index in range(min(len(pending), LOOK_AHEAD)):
                if images.ready(need_of(pending[index].config.environment)):
                    plan = pending[index]
                    del pending[index]
                    return plan
        return pending.popleft()

    @property
    def signal_name(self) -> str | None:
        return self.signals.signal_name if self.signals else None

    def _handle(self, event: Event, in_flight: dict[str, tuple[Plan, int]]) -> None:
        if isinstance(event, TaskStarted):
            self.state.task_started(event.task_id)
        elif isinstance(event, StepFinished):
            self.budget.add(event.tokens, event.cost)
            self.state.task_step(event.task_id, event.step, event.tokens, event.cost)
            reason = self.budget.reached()
            if reason and self.stop.outcome is None:
                self.stop.request(Outcome(ExitStatus.LIMITS_EXCEEDED, reason))
        elif isinstance(event, TaskGrading):
            self.state.task_grading(event.task_id)
        elif isinstance(event, TaskPulling):
            self.state.task_pulling(event.task_id, event.image)
        elif isinstance(event, TaskFinished):
            in_flight.pop(event.record.id, None)
            self._record(event.record)

    def _record(self, record: LedgerRecord) -> None:
        try:
            if not self.ledger.append(record):
                return  # already recorded after a stop at once
            self.after_record(record)
        except OSError as error:
            self.record_failures += 1
            self.progress.notice(f"miniswe: cannot record task {record.id} in {self.ledger.path}: {error.strerror}")
            return
        self.state.task_finished(record)
        self.progress.finished(record, self.state)

    def _announce(self, announced: int) -> int:
        received = self.signals.received if self.signals else []
        for index in range(announced, min(len(received), 2)):
            if index == 0:
                self.progress.notice(f"miniswe: {received[0]}: starting no new task; running tasks stop at their next step "
                                     "(send it again to stop at once)")
            else:
                self.progress.notice("miniswe: stopping at once")
        return len(received)

    def _attempt_of(self, plan: Plan) -> int:
        earlier = self.ledger.records.get(plan.id)
        return earlier.attempt if earlier else 1

    def _set_aside(self, plan: Plan) -> int:
        """Move an earlier attempt's trajectory aside (its ledger line follows it); this attempt's number."""
        base = plan.trajectory[: -len(".traj.json")]
        attempt = 1
        while os.path.exists(f"{base}.attempt{attempt}.traj.json"):
            attempt += 1
        if os.path.exists(plan.trajectory):
            os.replace(plan.trajectory, f"{base}.attempt{attempt}.traj.json")
            attempt += 1
        # the kept result must point at the moved file, or a crash during this attempt would leave it
        # pointing at this attempt's unfinished one
        earlier = self.ledger.records.get(plan.id)
        moved = os.path.join(plan.id, f"{plan.id}.attempt{attempt - 1}.traj.json")
        if earlier and attempt > 1 and earlier.trajectory != moved:
            self.ledger.amend(earlier.replace(trajectory=moved))
        return attempt

    def _record_stuck(self, in_flight: dict[str, tuple[Plan, int]]) -> None:
        """Tasks still busy (say, in a model call no canceller reached) after the grace: finish their
        trajectories and record them."""
        name = self.signal_name or "SIGINT"
        for plan, attempt in list(in_flight.values()):
            record = unfinished_record(plan, attempt, interrupted(f"{name} twice: stopped at once while the task was busy"))
            self._record(record)
        in_flight.clear()
