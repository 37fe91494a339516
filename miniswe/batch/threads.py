"""The thread executor: N worker threads in this process, each running one plan at a time.

Threads are enough: the time goes to waiting on the model and on commands. Workers share the batch's
state directly; their events reach the scheduler through one queue.
"""

from __future__ import annotations

import queue
import threading
import traceback

from miniswe.batch.files import now
from miniswe.batch.ledger import LedgerRecord
from miniswe.batch.plan import Plan
from miniswe.batch.scheduler import Shared
from miniswe.batch.worker import Event, TaskFinished, WorkerServices, run_plan
from miniswe.status import ExitStatus


class ThreadExecutor:
    def __init__(self, workers: int):
        self.capacity = max(1, workers)
        self._plans: queue.SimpleQueue[tuple[Plan, int] | None] = queue.SimpleQueue()
        self._events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._services: WorkerServices | None = None

    def start(self, shared: Shared) -> None:
        self._services = WorkerServices(stop=shared.stop, gate_for=shared.gates.for_url,
                                        renderer_for=shared.renderers.__getitem__, emit=self._events.put,
                                        images=shared.images)

    def submit(self, plan: Plan, attempt: int) -> None:
        self._plans.put((plan, attempt))
        if len(self._threads) < self.capacity:
            thread = threading.Thread(target=self._work, name=f"miniswe-worker-{len(self._threads) + 1}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def events(self, timeout: float) -> list[Event]:
        try:
            found = [self._events.get(timeout=timeout)]
        except queue.Empty:
            return []
        while True:
            try:
                found.append(self._events.get_nowait())
            except queue.Empty:
                return found

    def close(self) -> None:
        for _ in self._threads:
            self._plans.put(None)  # idle workers end; busy ones are daemons, cut off with the process

    def _work(self) -> None:
        while (item := self._plans.get()) is not None:
            plan, attempt = item
            try:
                record = run_plan(plan, attempt, self._services)
            except BaseException:  # run_plan keeps its own guard; this one keeps the scheduler from waiting forever
                record = LedgerRecord(plan.id, str(ExitStatus.ERROR), traceback.format_exc()[-4000:], attempt=attempt,
                                      ended=now())
            self._events.put(TaskFinished(record))
