"""One task of a batch, as a worker runs it wherever its executor put it: a plan in, a ledger record out.

What a worker shares with the rest of the batch (the stop, the call gates, the events it reports) comes in
WorkerServices from its executor; nothing else of the batch is reachable from here.
"""

from __future__ import annotations

import os
import shutil
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from miniswe.batch.files import now
from miniswe.batch.ledger import LedgerRecord
from miniswe.batch.plan import Plan, trajectory_name
from miniswe.models.gate import CallGate
from miniswe.runner import new_run_id, run_task
from miniswe.signals import Stop
from miniswe.status import ExitStatus, Outcome
from miniswe.templates import Renderer
from miniswe.trajectory import Step, close_unfinished


@dataclass(frozen=True)
class TaskStarted:
    task_id: str


@dataclass(frozen=True)
class StepFinished:
    task_id: str
    step: int
    tokens: int
    cost: float


@dataclass(frozen=True)
class TaskFinished:
    record: LedgerRecord


Event = TaskStarted | StepFinished | TaskFinished


@dataclass
class WorkerServices:
    stop: Stop
    gate_for: Callable[[str], CallGate]  # the endpoint's gate, shared by every task calling it
    renderer_for: Callable[[str], Renderer]  # by templates dir, built once per batch
    emit: Callable[[Event], None]


def unfinished_record(plan: Plan, attempt: int, outcome: Outcome) -> LedgerRecord:
    """The record of a task whose worker is stuck or gone: its trajectory closed with `outcome`, if there is one."""
    trajectory = close_unfinished(plan.trajectory, outcome)
    if trajectory is None:
        return LedgerRecord(plan.id, str(outcome.status), outcome.detail, attempt=attempt, ended=now())
    return LedgerRecord.from_trajectory(
        trajectory, task_id=plan.id, relative_path=trajectory_name(plan.id), has_eval=bool(plan.task.evaluate),
        model=plan.config.model.name or plan.config.model.kind, attempt=attempt, started=trajectory.started,
        wall_s=trajectory.wall_s or 0.0)


def run_plan(plan: Plan, attempt: int, services: WorkerServices) -> LedgerRecord:
    """Run one planned task to its ledger record; whatever goes wrong, a record comes back."""
    started, clock = now(), time.monotonic()

    def record(trajectory) -> LedgerRecord:
        return LedgerRecord.from_trajectory(
            trajectory, task_id=plan.id, relative_path=trajectory_name(plan.id), has_eval=bool(plan.task.evaluate),
            model=plan.config.model.name or plan.config.model.kind, attempt=attempt, started=started,
            wall_s=time.monotonic() - clock,
        )

    def on_step(step: Step) -> None:
        services.emit(StepFinished(plan.id, step.step, step.usage.total_tokens, step.usage.cost))

    ran = False
    try:
        if plan.workspace:
            shutil.rmtree(plan.workspace, ignore_errors=True)
            os.makedirs(plan.workspace, exist_ok=True)
        services.emit(TaskStarted(plan.id))
        ran = True
        result = run_task(
            plan.config, plan.task.text, plan.trajectory,
            run_id=f"{new_run_id()}-{plan.id}", instance=plan.task.fields,
            metadata={"task_id": plan.id, "attempt": attempt, **plan.task.metadata},
            setup=plan.task.setup, evaluate=plan.task.evaluate,
            renderer=services.renderer_for(plan.config.agent.templates_dir),
            gate=services.gate_for(getattr(plan.config.model, "base_url", "")), stop=services.stop, observers=[on_step],
        )
        return record(result.trajectory)
    except Exception:  # a bug outside run_task's own guard, or a trajectory that cannot be written
        detail = traceback.format_exc()
        trajectory = close_unfinished(plan.trajectory, Outcome(ExitStatus.ERROR, detail)) if ran else None
        if trajectory is not None:
            return record(trajectory)
        return LedgerRecord(plan.id, str(ExitStatus.ERROR), detail[-4000:], has_eval=bool(plan.task.evaluate),
                            trajectory=trajectory_name(plan.id), model=plan.config.model.name or plan.config.model.kind,
                            attempt=attempt, started=started, ended=now(), wall_s=round(time.monotonic() - clock, 3))
