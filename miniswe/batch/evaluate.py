"""The CLI's SWE-bench entry points: `miniswe evaluate RUN_DIR` (grade, or regrade, a finished batch's
submissions), and the config sources `miniswe batch` puts first for a SWE-bench task list (batch_sources).

The grading is the batch's own (swebench/grading.py, through the batch's scheduler, workers and ledger): each
graded task gets a new ledger line with its grade, and preds.json, report.md and run.json are written again.
The instances come from the task list run.json names (a file, or a dataset by name and split), or `tasks`.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TextIO

from miniswe.batch.ledger import LEDGER, Ledger, read_records
from miniswe.batch.plan import plan_tasks
from miniswe.batch.run import BatchOptions, BatchResult, execute_plans
from miniswe.batch.rundir import RunDir
from miniswe.batch.tasks import load_task_list, load_tasks
from miniswe.errors import UsageError
from miniswe.status import EXIT_INFRA, is_agent_outcome
from miniswe.swebench.datasets import benchmark_path, dataset_name
from miniswe.swebench.grading import NOT_GRADED, TIMEOUT_S, check_grading, needs_grade


def evaluate(run_dir: str, *, tasks: str | None = None, split: str | None = None, workers: int = 1,
             regrade: bool = False, timeout: float = TIMEOUT_S, quiet: bool = False, stream: TextIO | None = None,
             command: str = "") -> BatchResult:
    """Grade the run's submitted tasks that have no grade yet (or whose grading could not happen); with `regrade`,
    every one. Exit code: the batch's, or 3 when some grading could not happen (an image, the engine)."""
    if workers < 1:
        raise UsageError(f"--workers {workers}: must be 1 or more")
    if timeout <= 0:
        raise UsageError(f"--timeout {timeout:g}: must be a positive number of seconds")
    folder = RunDir(run_dir)
    run = folder.read_run()
    if run is None:
        raise UsageError(f"{run_dir}: not a miniswe batch run directory (no run.json); pass the -o RUN_DIR of a batch")
    recorded = run.get("task_file") or {}
    source = tasks or recorded.get("path")
    if not source:
        raise UsageError(f"{run_dir}/run.json names no task list; pass the instances the batch ran with --tasks FILE")
    task_file = load_task_list(source, split or recorded.get("split") or "test")
    records = read_records(os.path.join(folder.path, LEDGER))
    if not records:
        raise UsageError(f"{run_dir}: no task has finished yet, nothing to grade; run the batch first")
    by_id = {task.id: task for task in task_file.tasks}
    unknown = [task_id for task_id in records if task_id not in by_id]
    if unknown:
        raise UsageError(f"{len(unknown)} task(s) of {run_dir} are not in {source} (e.g. {unknown[0]}); pass the "
                         "instances the batch ran with --tasks FILE")
    chosen = [by_id[task_id] for task_id in records]
    problem = check_grading(chosen)
    if problem:
        raise UsageError(problem)
    from miniswe.config import config_from_record

    config = config_from_record(run.get("config") or {})  # the batch's own environment: image, engine, limits
    plans = plan_tasks(task_file, chosen, config, folder.path)
    options = BatchOptions(source, folder.path, workers=workers, quiet=quiet, split=task_file.split or "test",
                           grade=True, grade_timeout=timeout, command=command)
    folder.lock()
    try:
        ledger = Ledger(folder.path)
        wanted = {task_id for task_id, record in ledger.records.items()
                  if is_agent_outcome(record.exit_status) and (regrade or needs_grade(record))}
        todo = [dataclasses.replace(plan, grade_timeout=timeout, regrade=ledger.records[plan.id])
                for plan in plans if plan.id in wanted]
        kept = [ledger.records[plan.id] for plan in plans if plan.id not in wanted]
        started = folder.start_run(run, {})  # run.json's `command` stays the batch's own, which reruns it
        started["invocations"][-1]["command"] = command or f"miniswe evaluate {run_dir}"
        result = execute_plans(options, folder, started, ledger, todo, kept, plans, {}, stream, set(), None)
    finally:
        folder.unlock()
    failed = [r for r in ledger.snapshot() if (r.grade or {}).get("status") in NOT_GRADED]
    return dataclasses.replace(result, exit_code=EXIT_INFRA) if failed and result.exit_code != EXIT_INFRA else result


def batch_sources(spec: str) -> list[str]:
    """The config sources a `miniswe batch SPEC` puts before its -c sources: the shipped benchmark config for a
    dataset name or a file of SWE-bench instances, nothing for other task lists."""
    from miniswe.errors import MinisweError

    if dataset_name(spec) is not None:
        return [benchmark_path()]
    try:
        tasks = load_tasks(spec).tasks
    except MinisweError:
        return []  # the batch itself reports what is wrong with the file
    return [benchmark_path()] if tasks and all(task.swebench for task in tasks) else []
