"""The worker pool: N threads, each taking the next planned task and running it as one `run_task`.

Threads are enough: the time goes to waiting on the model and on commands. Whatever a task does
(setup error, model error, a bug), it ends as one ledger record and the pool goes on.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from miniswe.batch.files import now, read_json, write_atomic
from miniswe.batch.ledger import Ledger
from miniswe.batch.plan import Plan
from miniswe.batch.progress import BatchState
from miniswe.batch.stop import StopControl, kill_command_groups
from miniswe.models.gate import CallGate
from miniswe.runner import new_run_id, run_task
from miniswe.status import AGENT_OUTCOMES, ExitStatus
from miniswe.templates import Renderer

# After a second Ctrl-C, how long running tasks get to record themselves before the batch records them.
ABORT_GRACE_S = 3.0
DETAIL_CHARS = 4000


class Pool:
    def __init__(
        self,
        plans: list[Plan],
        *,
        workers: int,
        control: StopControl,
        ledger: Ledger,
        state: BatchState,
        progress: Any,
        renderers: dict[str, Renderer],
        max_concurrent_calls: int = 0,
        after_record: Callable[[dict[str, Any]], None] | None = None,
    ):
        self.plans = plans
        self.workers = max(1, min(workers, len(plans)))
        self.control = control
        self.ledger = ledger
        self.state = state
        self.progress = progress
        self.renderers = renderers
        self.max_concurrent_calls = max_concurrent_calls
        self.after_record = after_record
        self.record_failures = 0
        self._queue: queue.SimpleQueue[Plan] = queue.SimpleQueue()
        self._gates: dict[str, CallGate] = {}
        self._in_flight: dict[str, tuple[Plan, int, str, float]] = {}
        self._lock = threading.Lock()
        self._live = 0  # workers still running

    def run(self) -> None:
        """Run every plan (unless stopped); returns when all workers are done or an abort's grace is over."""
        if not self.plans:
            return
        for plan in self.plans:
            self._queue.put(plan)
        self._live = self.workers
        for i in range(self.workers):
            threading.Thread(target=self._work, name=f"miniswe-worker-{i + 1}", daemon=True).start()
        announced, deadline = None, None
        while self._live:
            self.control.changed.wait(0.1)
            self.control.changed.clear()
            if self.control.signal_name and announced is None:
                announced = self.control.signal_name
                self.progress.notice(
                    f"miniswe: {announced}: starting no new task; running tasks stop at their next step "
                    "(send it again to stop at once)"
                )
            if self.control.aborted:
                if deadline is None:
                    deadline = time.monotonic() + ABORT_GRACE_S
                    self.progress.notice("miniswe: stopping at once")
                kill_command_groups()  # also commands a task started after the first kill
                if time.monotonic() > deadline:
                    self._record_stuck()
                    return

    def _work(self) -> None:
        try:
            while self.control.accepting():
                try:
                    plan = self._queue.get_nowait()
                except queue.Empty:
                    return
                record = self._execute(plan)
                self._record(record)
        finally:
            with self._lock:
                self._live -= 1
            self.control.changed.set()  # wake the main thread to notice this worker is done

    def _execute(self, plan: Plan) -> dict[str, Any]:
        started, clock = now(), time.monotonic()
        attempt = 1
        try:
            attempt = _fresh_start(plan)
            self._repoint_earlier(plan, attempt)
            with self._lock:
                self._in_flight[plan.id] = (plan, attempt, started, clock)
            self.state.task_started(plan.id)
            result = run_task(
                plan.config, plan.task.text, plan.trajectory,
                run_id=f"{new_run_id()}-{plan.id}", instance=plan.task.fields,
                metadata={"task_id": plan.id, "attempt": attempt, **plan.task.metadata},
                setup=plan.task.setup, evaluate=plan.task.evaluate,
                renderer=self.renderers.get(plan.config.agent.templates_dir), gate=self._gate(plan),
                on_step=lambda step, reply: self._step(plan.id, step, reply), should_stop=self.control.task_outcome,
            )
            trajectory = result.trajectory
            status = ExitStatus(trajectory.data["exit_status"])
            if self.control.signal_name and status not in AGENT_OUTCOMES and status is not ExitStatus.INTERRUPTED:
                # cut short by the signal (a cancelled backoff, a killed command): that is an interruption
                how = "twice: stopped at once" if self.control.aborted else "while waiting to retry"
                trajectory.finish(ExitStatus.INTERRUPTED, f"{self.control.signal_name} {how} ({status}: {trajectory.data['exit_detail']})")
                trajectory.save()
            return make_record(plan, trajectory.data, len(trajectory.steps), attempt, started, time.monotonic() - clock)
        except Exception:  # a bug outside run_task's own guard: the task still ends with a record
            detail = traceback.format_exc()
            with self._lock:
                ran = plan.id in self._in_flight
            data, steps = _finish_on_disk(plan.trajectory, ExitStatus.ERROR, detail) if ran else ({}, 0)
            data = data or {"exit_status": str(ExitStatus.ERROR), "exit_detail": detail, "usage": {}}
            return make_record(plan, data, steps, attempt, started, time.monotonic() - clock)

    def _repoint_earlier(self, plan: Plan, attempt: int) -> None:
        """The earlier attempt's trajectory was just set aside: its ledger line must follow it, or a crash
        during this attempt would leave the kept result pointing at this attempt's unfinished file."""
        earlier = self.ledger.records.get(plan.id)
        moved = os.path.join(plan.id, f"{plan.id}.attempt{attempt - 1}.traj.json")
        if earlier and attempt > 1 and earlier.get("trajectory") != moved:
            self.ledger.amend({**earlier, "trajectory": moved})

    def _record(self, record: dict[str, Any]) -> None:
        with self._lock:
            self._in_flight.pop(record["id"], None)
        try:
            if not self.ledger.append(record):
                return  # the main thread already recorded it after a second signal
            if self.after_record:
                self.after_record(record)
        except OSError as error:
            self.record_failures += 1
            self.progress.notice(f"miniswe: cannot record task {record['id']} in {self.ledger.path}: {error.strerror}")
            return
        self.state.task_finished(record)
        self.progress.finished(record, self.state)

    def _step(self, task_id: str, step: dict[str, Any], reply: Any) -> None:
        usage = reply.usage
        self.control.add_usage(usage.total_tokens, usage.cost)
        self.state.task_step(task_id, step["step"], usage.total_tokens, usage.cost)

    def _gate(self, plan: Plan) -> CallGate:
        """One gate per endpoint, shared by every task calling it: a 429 pauses them all."""
        key = plan.config.model.base_url
        with self._lock:
            gate = self._gates.get(key)
            if gate is None:
                gate = self._gates[key] = CallGate(self.max_concurrent_calls)
                self.control.gates.append(gate)
                if self.control.signal_name:
                    gate.cancelled.set()
            return gate

    def _record_stuck(self) -> None:
        """Tasks still blocked (say, in a model call) after the grace: mark their trajectories and record them."""
        with self._lock:
            stuck = list(self._in_flight.values())
        for plan, attempt, started, clock in stuck:
            detail = f"{self.control.signal_name} twice: stopped at once while the task was busy"
            data, steps = _finish_on_disk(plan.trajectory, ExitStatus.INTERRUPTED, detail)
            self._record(make_record(plan, data, steps, attempt, started, time.monotonic() - clock))


def _finish_on_disk(path: str, status: ExitStatus, detail: str) -> tuple[dict[str, Any], int]:
    """Give a trajectory its worker could not finish an exit status; returns its data and step count."""
    try:
        data = read_json(path)
    except (OSError, ValueError):
        return {"exit_status": str(status), "exit_detail": detail, "usage": {}}, 0
    if data.get("exit_status") is None:
        data.update(exit_status=str(status), exit_detail=detail)
        data.setdefault("timing", {})["ended"] = now()
        write_atomic(path, json.dumps(data, ensure_ascii=False) + "\n")
    return data, len(data.get("steps") or [])


def _fresh_start(plan: Plan) -> int:
    """Empty the task's own workspace and set aside an earlier attempt's trajectory; returns the attempt number."""
    if plan.workspace:
        shutil.rmtree(plan.workspace, ignore_errors=True)
        os.makedirs(plan.workspace, exist_ok=True)
    base = plan.trajectory[: -len(".traj.json")]
    attempt = 1
    while os.path.exists(f"{base}.attempt{attempt}.traj.json"):
        attempt += 1
    if os.path.exists(plan.trajectory):
        os.replace(plan.trajectory, f"{base}.attempt{attempt}.traj.json")
        attempt += 1
    return attempt


def make_record(plan: Plan, data: dict[str, Any], steps: int, attempt: int, started: str, wall_s: float) -> dict[str, Any]:
    """One ledger line, from a finished trajectory's data."""
    usage = data.get("usage") or {}
    detail = data.get("exit_detail")
    return {
        "id": plan.id,
        "exit_status": data["exit_status"],
        "exit_detail": detail[-DETAIL_CHARS:] if isinstance(detail, str) else detail,
        "resolved": data.get("resolved"),
        "has_eval": bool(plan.task.evaluate),
        "steps": steps,
        "model_calls": usage.get("model_calls", 0),
        "tokens": usage.get("total_tokens", 0),
        "prompt_tokens": usage.get("prompt_tokens", 0),
        "completion_tokens": usage.get("completion_tokens", 0),
        "cost": usage.get("cost", 0.0),
        "wall_s": round(wall_s, 3),
        "trajectory": os.path.join(plan.id, os.path.basename(plan.trajectory)),
        "submission": data.get("submission"),
        "model": plan.config.model.name or plan.config.model.kind,
        "attempt": attempt,
        "started": started,
        "ended": now(),
    }
