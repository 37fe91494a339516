"""One task of a batch, as a worker runs it wherever its executor put it: a plan in, a ledger record out.

What a worker shares with the rest of the batch (the stop, the call gates, the events it reports) comes in
WorkerServices from its executor; nothing else of the batch is reachable from here.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from miniswe.batch.files import now
from miniswe.batch.ledger import DETAIL_CHARS, LedgerRecord
from miniswe.batch.plan import Plan, trajectory_name
from miniswe.environments.images import need_of
from miniswe.errors import Cancelled, PullError, TrajectoryError
from miniswe.models.gate import CallGate
from miniswe.redaction import masked_config
from miniswe.resume import changes, keeps_state
from miniswe.resume import continue_run
from miniswe.runner import run_task
from miniswe.signals import Stop
from miniswe.status import ExitStatus, Outcome, interrupted, outcome_of
from miniswe.templates import Renderer
from miniswe.trajectory import Trajectory, close_unfinished, load, new_run_id


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
class TaskGrading:
    task_id: str


@dataclass(frozen=True)
class TaskPulling:
    """The task waits for its image (a pull, or room under the image budget) before it starts."""

    task_id: str
    image: str


@dataclass(frozen=True)
class TaskFinished:
    record: LedgerRecord


Event = TaskStarted | StepFinished | TaskGrading | TaskPulling | TaskFinished


@dataclass
class WorkerServices:
    stop: Stop
    gate_for: Callable[[str], CallGate]  # the endpoint's gate, shared by every task calling it
    renderer_for: Callable[[str], Renderer]  # by templates dir, built once per batch
    emit: Callable[[Event], None]
    images: Any = None  # the batch's image pools here (environments/images.py BatchImages), or None: each run pulls


def record_of(plan: Plan, trajectory: Trajectory, attempt: int, started: str) -> LedgerRecord:
    """The ledger record of a plan's finished trajectory. Its wall time is the trajectory's, as its tokens are: a
    run that went on after a kill or a stop counts the time of every attempt, not only the last one's."""
    return LedgerRecord.from_trajectory(
        trajectory, task_id=plan.id, relative_path=trajectory_name(plan.id), has_eval=bool(plan.task.evaluate),
        model=plan.config.model.name or plan.config.model.kind, attempt=attempt, started=started,
        wall_s=trajectory.wall_s or 0.0,
    )


def recovered(plan: Plan) -> LedgerRecord | None:
    """The record of a task whose run ended with a verdict but whose ledger line was lost (`kill -9` as it was
    written): its trajectory says how it ended, so it need not run again."""
    try:
        trajectory = load(plan.trajectory)
    except TrajectoryError:
        return None
    record = record_of(plan, trajectory, int(trajectory.metadata.get("attempt") or 1), trajectory.started)
    return record if trajectory.outcome and record.kept_on_resume else None


def unfinished_record(plan: Plan, attempt: int, outcome: Outcome) -> LedgerRecord:
    """The record of a task whose worker is stuck or gone: its trajectory closed with `outcome`, if there is one."""
    trajectory = close_unfinished(plan.trajectory, outcome)
    if trajectory is None:
        return LedgerRecord(plan.id, str(outcome.status), outcome.detail, attempt=attempt, ended=now())
    return record_of(plan, trajectory, attempt, trajectory.started)


def run_plan(plan: Plan, attempt: int, services: WorkerServices) -> LedgerRecord:
    """Run one planned task to its ledger record, then grade it when the plan says so; whatever goes wrong, a
    record comes back. Grading takes this worker's slot, so its container counts against the batch's limits.
    The task's image is held from before it starts until it is graded: the batch removes no image in use."""
    need = need_of(plan.config.environment) if services.images is not None else None
    if need is None:
        return _run_plan(plan, attempt, services)
    started = now()
    try:
        wait = services.images.acquire(need, services.stop, on_wait=lambda: services.emit(TaskPulling(plan.id, need[1])))
    except PullError as error:  # its own outcome: an infrastructure failure a rerun retries, never the agent's
        if plan.regrade is not None:  # only grading: the agent's result stays, ungraded for want of its image
            return plan.regrade.replace(grade={"status": "image_unavailable", "resolved": None, "tests": None,
                                               "detail": str(error)[-DETAIL_CHARS:], "wall_s": 0.0})
        return LedgerRecord(plan.id, str(ExitStatus.PULL_ERROR), str(error)[-DETAIL_CHARS:], has_eval=bool(plan.task.evaluate),
                            trajectory=trajectory_name(plan.id) if os.path.exists(plan.trajectory) else None,
                            model=plan.config.model.name or plan.config.model.kind, attempt=attempt, started=started,
                            ended=now(), image={"name": need[1], "wait": "failed"})
    except Cancelled:  # stopped while it waited: it never started, and runs in the next batch
        if plan.regrade is not None:
            return plan.regrade
        outcome = services.stop.outcome or interrupted("SIGINT")
        return LedgerRecord(plan.id, str(outcome.status), f"{outcome.detail} (while waiting for image {need[1]})",
                            trajectory=trajectory_name(plan.id) if os.path.exists(plan.trajectory) else None,
                            attempt=attempt, started=started, ended=now())
    try:
        record = _run_plan(plan, attempt, services)
    finally:
        services.images.release(need)
    return record.replace(image=wait) if wait and plan.regrade is None else record


def _run_plan(plan: Plan, attempt: int, services: WorkerServices) -> LedgerRecord:
    if plan.regrade is not None:
        services.emit(TaskStarted(plan.id))
        return graded(plan, plan.regrade, services)
    record = _run_agent(plan, attempt, services)
    return graded(plan, record, services) if plan.grade_timeout is not None else record


def graded(plan: Plan, record: LedgerRecord, services: WorkerServices) -> LedgerRecord:
    """`record` with the SWE-bench grade of its submission (tasks that ended without an agent outcome are not
    graded: they run again). A grading bug becomes the grade's `error` status, never a lost record."""
    from miniswe.status import is_agent_outcome

    if not is_agent_outcome(record.exit_status):
        return record
    services.emit(TaskGrading(plan.id))
    from miniswe.swebench.grading import GRADE_DIR, grade_patch

    folder = os.path.join(os.path.dirname(plan.trajectory), GRADE_DIR)
    try:
        grade = grade_patch(plan.task.fields, record.submission, plan.config.environment, folder=folder,
                            run_id=f"{new_run_id()}-{plan.id}-grade", timeout=plan.grade_timeout or 0,
                            model=record.model or "miniswe", stop=services.stop)
    except Exception as error:  # noqa: BLE001 - the agent's result must still be recorded
        grade = {"status": "error", "resolved": None, "detail": f"grading failed: {type(error).__name__}: {error}"[-DETAIL_CHARS:],
                 "tests": None, "wall_s": 0.0}
    return record.replace(resolved=grade["resolved"], has_eval=True, grade=grade)


def _run_agent(plan: Plan, attempt: int, services: WorkerServices) -> LedgerRecord:
    started, clock = now(), time.monotonic()

    def record(trajectory) -> LedgerRecord:
        return record_of(plan, trajectory, attempt, started)

    class Progress:  # the batch's view of this task's steps: budgets and the progress display
        @staticmethod
        def after_command(event) -> None:
            step = event.step
            services.emit(StepFinished(plan.id, step.step, step.usage.total_tokens, step.usage.cost))

    ran = False
    common = {"evaluate": plan.task.evaluate, "renderer": services.renderer_for(plan.config.agent.templates_dir),
              "gate": services.gate_for(getattr(plan.config.model, "base_url", "")), "stop": services.stop,
              "hooks": [Progress], "known_secrets": plan.secrets}
    try:
        services.emit(TaskStarted(plan.id))
        ran = True
        if plan.resume:  # the task's recorded run goes on: no model call made again, its workspace kept
            trajectory = load(plan.trajectory)
            change = {"changes": changes(trajectory.config, masked_config(plan.config.to_dict())), "by": "batch"}
            result = continue_run(plan.config, trajectory, rebuild=not keeps_state(plan.config), record=change, **common)
            return record(result.trajectory)
        if plan.workspace:
            shutil.rmtree(plan.workspace, ignore_errors=True)
            os.makedirs(plan.workspace, exist_ok=True)
        result = run_task(
            plan.config, plan.task.text, plan.trajectory,
            run_id=f"{new_run_id()}-{plan.id}", instance=plan.task.fields,
            metadata={"task_id": plan.id, "attempt": attempt, **plan.task.metadata}, setup=plan.task.setup, **common,
        )
        return record(result.trajectory)
    except Exception as error:  # a bug outside run_task's own guard, or a trajectory that cannot be written
        outcome = outcome_of(error)
        trajectory = close_unfinished(plan.trajectory, outcome) if ran else None
        if trajectory is not None:
            return record(trajectory)
        return LedgerRecord(plan.id, str(outcome.status), (outcome.detail or "")[-DETAIL_CHARS:], has_eval=bool(plan.task.evaluate),
                            trajectory=trajectory_name(plan.id), model=plan.config.model.name or plan.config.model.kind,
                            attempt=attempt, started=started, ended=now(), wall_s=round(time.monotonic() - clock, 3))
