"""`miniswe batch`: load and check everything, decide what to (re)run, run the pool, write the run's files.

Resume: tasks whose latest record is an agent outcome are kept; the rest (never run, interrupted,
crashed, infrastructure failures) run again. `--redo failed|all|ID,...` widens that. A batch that grades
SWE-bench tasks also grades kept results that have no grade yet (or whose grading could not happen).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import socket
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, TextIO

import requests

from miniswe.batch.ledger import LEDGER, Ledger, LedgerRecord, read_records
from miniswe.batch.plan import Plan, plan_tasks
from miniswe.batch.progress import BatchState, make_progress
from miniswe.batch.report import build_report, render_markdown
from miniswe.batch.rundir import REPORT_MD, RunDir, model_identity
from miniswe.batch.scheduler import Budget, Gates, Scheduler, Shared
from miniswe.batch.selection import select_tasks
from miniswe.batch.tasks import TaskFile, load_task_list
from miniswe.batch.threads import ThreadExecutor
from miniswe.batch.worker import recovered
from miniswe.config import Config
from miniswe.environments.images import LEDGER as IMAGE_LEDGER
from miniswe.environments.images import BatchImages, ImagePolicy, need_of, parse_size, reuse_order
from miniswe.environments import check_environment
from miniswe.errors import ConfigError, ModelError, TaskFileError, UsageError
from miniswe.hooks import load_hooks
from miniswe.output import add_secrets
from miniswe.redaction import Secrets, masked_config, run_secrets
from miniswe.runner import build_model, check_protocol, report_skills
from miniswe.signals import Stop
from miniswe.status import ExitStatus, batch_exit_code
from miniswe.templates import Renderer, prompt_variables


@dataclass
class BatchOptions:
    tasks: str
    run_dir: str | None = None
    workers: int = 1
    filter: str | None = None
    slice: str | None = None
    shuffle: bool = False
    seed: int | None = None
    shard: str | None = None
    redo: str | None = None
    force: bool = False
    max_concurrent_calls: int = 0
    batch_cost_limit: float = 0.0
    batch_token_limit: int = 0
    quiet: bool = False
    executor: str = "threads"  # or "ray"
    ray_address: str | None = None  # None: a private local cluster
    ray_resources: str | None = None  # what each task asks of a node, e.g. docker=1
    command: str = ""  # the command line that reruns this batch, for the report
    split: str = "test"  # the split of a dataset given by name
    grade: bool | None = None  # grade SWE-bench submissions by the official harness; None: when it is installed
    grade_timeout: float = 1800.0  # seconds for one instance's eval script (the harness's default)
    # images (environments/images.py): each machine keeps the images this batch pulled within image_budget
    # (e.g. 50G; None: no budget), pulls those of the next `prefetch` images of the queue ahead of their tasks
    # (None: one per worker, at least 2), at most `max_pulls` at once; a failed pull is tried `pull_tries` times,
    # `pull_backoff` seconds apart at first, doubling
    image_budget: str | None = None
    prefetch: int | None = None
    max_pulls: int = 2
    pull_tries: int = 5
    pull_backoff: float = 5.0


@dataclass
class BatchResult:
    exit_code: int
    run_dir: str
    report: dict[str, Any]
    markdown: str
    ran: int = 0
    kept: int = 0
    not_started: list[str] = field(default_factory=list)


def default_run_dir(tasks_path: str, shard: str | None = None, split: str = "test") -> str:
    stem = re.sub(r"\.(jsonl|json|ya?ml|parquet)$", "", os.path.basename(tasks_path.rstrip("/")), flags=re.IGNORECASE)
    suffix = "-shard" + shard.replace("/", "of") if shard else ""  # shards on one host must not share a directory
    if split != "test":  # a dataset's other split is another batch
        suffix = f"-{split}{suffix}"
    return os.path.join("trajectories", (stem or "batch") + suffix)


def run_batch(config: Config, options: BatchOptions, *, stream: TextIO | None = None) -> BatchResult:
    """Run a batch to the end (or until stopped); bad input raises UsageError before anything runs."""
    if options.workers < 1:
        raise UsageError(f"--workers {options.workers}: must be 1 or more")
    image_policy(options)  # bad image options are bad input, before anything runs
    resources = check_executor(options)
    task_file = load_task_list(options.tasks, options.split)
    selected = select_tasks(task_file.tasks, filter=options.filter, slice=options.slice, shuffle=options.shuffle,
                            seed=options.seed, shard=options.shard)
    if not selected:
        raise UsageError(f"{options.tasks}: no task selected by --filter/--slice/--shard (the file has {len(task_file.tasks)})")
    notices: list[str] = []
    if all(task.swebench for task in selected):
        from miniswe.swebench.datasets import with_benchmark

        config = with_benchmark(config)  # each instance in its own image at /testbed, unless configured otherwise
        if config.environment.kind == "local":
            notices.append("SWE-bench instances run on this machine (environment.kind local), not in their images; "
                           "-c the shipped config/swebench.yaml to run each in its own image at /testbed")
    grade_timeout = grading(options, selected, notices)
    run_dir = RunDir(options.run_dir or default_run_dir(options.tasks, options.shard, options.split))
    plans = [dataclasses.replace(plan, grade_timeout=grade_timeout)
             for plan in plan_tasks(task_file, selected, config, run_dir.path)]
    secrets = Secrets()
    for plan in plans:
        secrets.update(run_secrets(plan.config))
    add_secrets(secrets)
    run_dir.redact = secrets.scrub
    plans = [dataclasses.replace(plan, secrets=secrets) for plan in plans]  # every trajectory masks them all
    renderers = check_plans(task_file, plans)
    check_endpoints(plans)
    docker = [p.config.environment.executable for p in plans if p.config.environment.kind == "docker"]
    if docker:  # per task: a task's own env.image runs it in a container too
        from miniswe.environments.containers import warn_orphans

        warn_orphans(docker)

    cluster = None
    if options.executor == "ray" and _work_left(run_dir, plans, options.redo):
        # before the run directory is made or changed: a cluster out of reach leaves no trace
        from miniswe.batch.ray_cluster import RayCluster

        cluster = RayCluster(options.ray_address, resources, options.workers)
    try:
        run_dir.lock()
    except BaseException:
        if cluster is not None:
            cluster.close()
        raise
    try:
        previous = run_dir.read_run()
        identity = model_identity(config)
        if previous and not options.force:
            run_dir.check_same(previous, task_file.sha256, task_file.source, identity)
        ledger = Ledger(run_dir.path, redact=secrets.scrub)
        redo = redo_ids(options.redo, [p.id for p in plans], ledger.records)
        for plan in plans:  # a verdict whose ledger line a kill -9 lost is taken back from its trajectory
            if plan.id not in ledger.records and plan.id not in redo and (record := recovered(plan)):
                ledger.append(record)
        todo = [p for p in plans if p.id in redo or not _kept(ledger.records.get(p.id))]
        if grade_timeout is not None:  # kept results without a grade: only graded, the agent does not run again
            from miniswe.swebench.grading import needs_grade

            running = {p.id for p in todo}
            todo += [dataclasses.replace(p, regrade=ledger.records[p.id]) for p in plans
                     if p.id not in running and needs_grade(ledger.records[p.id])]
        if not (options.shuffle or options.seed is not None):  # tasks sharing an image run together: pulled once
            todo = reuse_order(todo, lambda p: (need_of(p.config.environment) or (None, None))[1],
                               lambda p: p.task.fields.get("repo") if p.task.swebench else None)
        todo_ids = {p.id for p in todo}
        kept = [ledger.records[p.id] for p in plans if p.id not in todo_ids]
        if options.executor == "ray" and cluster is None and todo:  # the ledger changed since the look above
            from miniswe.batch.ray_cluster import RayCluster

            cluster = RayCluster(options.ray_address, resources, options.workers)
        run = run_dir.start_run(previous, _run_info(task_file, options, config, identity, len(selected)))
        ledger.compact()
        run_dir.write_preds(ledger.snapshot())
        return execute_plans(options, run_dir, run, ledger, todo, kept, plans, renderers, stream, redo, cluster, notices)
    finally:
        if cluster is not None:
            cluster.close()
        run_dir.unlock()


def _work_left(run_dir: RunDir, plans: list[Plan], redo: str | None) -> bool:
    """Whether a batch into `run_dir` would run anything: a read-only look at its ledger, before taking it."""
    if redo:
        return True
    records = read_records(os.path.join(run_dir.path, LEDGER), warn=lambda message: None)
    return any(not _kept(records.get(plan.id)) for plan in plans)


def image_policy(options: BatchOptions) -> ImagePolicy:
    """The image options as one policy; UsageError for a bad one."""
    for flag, value in (("--max-pulls", options.max_pulls), ("--pull-tries", options.pull_tries)):
        if value < 1:
            raise UsageError(f"{flag} {value}: must be 1 or more")
    if options.prefetch is not None and options.prefetch < 0:
        raise UsageError(f"--prefetch {options.prefetch}: must be 0 (no pulls ahead) or more")
    if options.pull_backoff < 0:
        raise UsageError(f"--pull-backoff {options.pull_backoff:g}: must be 0 or more seconds")
    budget = parse_size(options.image_budget) if options.image_budget not in (None, "", "0") else 0
    prefetch = max(2, options.workers) if options.prefetch is None else options.prefetch
    return ImagePolicy(budget=budget, prefetch=prefetch, max_pulls=options.max_pulls, tries=options.pull_tries,
                       backoff_s=options.pull_backoff)


def check_executor(options: BatchOptions) -> dict[str, float]:
    """The executor's options; for Ray, what each task asks of a node."""
    if options.executor not in ("threads", "ray"):
        raise UsageError(f"--executor {options.executor!r}: expected threads or ray")
    if options.executor != "ray":
        given = [flag for flag, value in (("--ray-address", options.ray_address), ("--ray-resources", options.ray_resources)) if value]
        if given:
            raise UsageError(f"{given[0]} needs --executor ray")
        return {}
    from miniswe.batch.ray_cluster import parse_resources, require_ray

    require_ray()
    return parse_resources(options.ray_resources)


def grading(options: BatchOptions, tasks: list, notices: list[str]) -> float | None:
    """The eval timeout when this batch grades its submissions, else None. Asked for (--grade), it must be possible;
    by default SWE-bench lists are graded when the harness is installed, with a notice saying why not otherwise."""
    if options.grade is False or (options.grade is None and not all(task.swebench for task in tasks)):
        return None
    if options.grade_timeout <= 0:
        raise UsageError(f"--grade-timeout {options.grade_timeout:g}: must be a positive number of seconds")
    from miniswe.swebench.grading import check_grading

    try:
        problem = check_grading(tasks)
    except UsageError as error:  # the harness is not installed
        problem = str(error)
    if problem and options.grade:
        raise UsageError(f"--grade: {problem}")
    if problem:
        notices.append(f"not grading: {problem}")
        return None
    return options.grade_timeout


def execute_plans(options, run_dir, run, ledger, todo, kept, plans, renderers, stream, redo, cluster, notices=()) -> BatchResult:
    """Run the scheduler over the executor, then write preds.json, report.md and run.json's end."""
    state = BatchState(len(plans), kept)
    progress = make_progress(options.quiet, stream)
    workers = min(options.workers, max(len(todo), 1))
    if cluster is not None:
        from miniswe.batch.ray_executor import RayExecutor

        needs_images = any(need_of(p.config.environment) for p in todo)
        executor = RayExecutor(cluster, workers, todo, images=image_policy(options) if needs_images else None,
                               image_ledger=run_dir.file(IMAGE_LEDGER))
        where = f" on {cluster.label} ({len(cluster.nodes)} node(s))"
    else:
        executor, where = ThreadExecutor(workers), ""
    if not options.quiet:
        regrades = sum(1 for plan in todo if plan.regrade is not None)
        grading_only = f" ({regrades} only to grade)" if regrades else ""
        progress.notice(
            f"miniswe batch: {len(plans)} tasks, {len(kept)} already done, {len(todo)} to run{grading_only} with "
            f"{workers} worker(s){where} → {run_dir.path}"
        )
    for notice in notices:
        progress.notice(f"miniswe: {notice}")
    budget = Budget(options.batch_cost_limit, options.batch_token_limit)
    shared = Shared(Stop(), Gates(options.max_concurrent_calls), renderers)
    if cluster is None and any(need_of(p.config.environment) for p in todo):
        shared.images = BatchImages(image_policy(options), ledger_path=run_dir.file(IMAGE_LEDGER), stop=shared.stop,
                                    notice=progress.notice)
    scheduler = Scheduler(ledger=ledger, state=state, progress=progress, budget=budget, shared=shared,
                          after_record=lambda record: run_dir.write_preds(ledger.snapshot), redo=redo)
    progress.begin(state)
    images = None
    try:
        scheduler.run(todo, executor)
    finally:
        progress.end()
        if shared.images is not None:
            images = shared.images.close()
        images = images or getattr(executor, "images_summary", None)  # a Ray batch's: each node's pools
    ledger.compact()
    records = ledger.snapshot()
    run_dir.write_preds(records)
    finished = {r.id: r for r in records}
    not_started = [p.id for p in plans if p.id not in finished]
    why = budget.reached() or (shared.images.fatal if shared.images is not None else None) or "stopped early"
    unrun = (f"{len(not_started)} task(s) not run ({why}); rerun the same command to run them"
             if not_started and not scheduler.signal_name else "")
    if images:  # this invocation's pulls, removals and peak image disk, for run.json and the report
        run["invocations"][-1]["images"] = images
    report = build_report(records, run)
    markdown = render_markdown(report, records, run, run_dir.path, unrun)
    run_dir.write_text(REPORT_MD, markdown)
    code = batch_exit_code((finished[p.id].exit_status for p in plans if p.id in finished),
                           signal_name=scheduler.signal_name, record_failures=scheduler.record_failures,
                           not_started=len(not_started))
    status = "interrupted" if scheduler.signal_name else "incomplete" if not_started else "finished"
    if unrun:
        progress.notice(f"miniswe: {unrun}")
    run_dir.end_run(run, status, {"ran": state.finished, "kept": len(kept), "exit_code": code})
    return BatchResult(code, run_dir.path, report, markdown, state.finished, len(kept), not_started)


def check_plans(task_file: TaskFile, plans: list[Plan]) -> dict[str, Renderer]:
    """Every task's templates, environment and model settings; renderers by templates dir.

    Templates and models are checked once per distinct setting: building a renderer costs milliseconds,
    which a SWE-bench-sized list would pay thousands of times over.
    """
    renderers: dict[str, Renderer] = {}
    models: set[str] = set()
    skills: set[str] = set()  # skills folders already checked: each problem is told once
    for plan in plans:
        model, agent = plan.config.model, plan.config.agent
        try:
            if agent.templates_dir not in renderers:
                renderers[agent.templates_dir] = Renderer(agent.templates_dir)
            # a field the instance prompt uses but this task lacks must fail now, not when the task starts
            renderers[agent.templates_dir].check_instance(plan.task.text, plan.task.fields,
                                                          prompt_variables(plan.config, plan.config.environment.cwd))
            check_environment(plan.config.environment)
            check_protocol(plan.config)
            if plan.config.agent.hooks:
                load_hooks(plan.config.agent.hooks)
            if plan.config.agent.skills_dirs and repr(plan.config.agent.skills_dirs) not in skills:
                skills.add(repr(plan.config.agent.skills_dirs))
                report_skills(plan.config)
            key = repr(model)
            if key not in models:
                build_model(plan.config)  # refuses bad settings when built (no endpoint, no name, an unreadable script)
                models.add(key)
        except ConfigError as error:
            if not (plan.task.config or plan.task.env) and not str(error).startswith("template instance.j2"):
                raise
            raise TaskFileError(f"{task_file.path}: {plan.task.where} (id {plan.id}): {error}") from None
    return renderers


def _kept(record: LedgerRecord | None) -> bool:
    return record is not None and record.kept_on_resume


def check_endpoints(plans: list[Plan]) -> None:
    """Fail in one line before anything runs when an endpoint cannot be reached at all, rather than
    letting every task spend its retries on it. A reachable but failing endpoint is each task's ModelError."""
    models = {plan.config.model.base_url: plan.config.model for plan in plans if getattr(plan.config.model, "base_url", "")}
    for model in models.values():
        parts = urllib.parse.urlsplit(model.base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"model.base_url: {model.base_url!r} is not an http(s) URL; pass e.g. --base-url http://127.0.0.1:8000/v1")
        if requests.utils.get_environ_proxies(model.base_url):
            continue  # through a proxy, a direct connection says nothing about reachability
        try:
            socket.create_connection((parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)),
                                     timeout=model.connect_timeout or None).close()
        except OSError as error:
            reason = error.strerror or str(error) or type(error).__name__
            raise ModelError(f"cannot reach {model.base_url}: {reason.lower()}; check --base-url (no task was run)") from None


def redo_ids(redo: str | None, ids: list[str], records: dict[str, LedgerRecord]) -> set[str]:
    """Tasks to run again even though they ended with an agent outcome."""
    if not redo:
        return set()
    if redo == "all":
        return set(ids)
    if redo == "failed":  # the agent's own failures: not submitted, or submitted but not resolved
        return {i for i in ids if i in records and not (records[i].exit_status == ExitStatus.SUBMITTED and records[i].resolved is not False)}
    wanted = [i.strip() for i in redo.split(",") if i.strip()]
    for task_id in wanted:
        if task_id not in ids:
            close = difflib.get_close_matches(task_id, ids, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else " (use failed, all, or ids of selected tasks)"
            raise UsageError(f"--redo: no selected task has id {task_id!r}{hint}")
    return set(wanted)


def _run_info(task_file: TaskFile, options: BatchOptions, config: Config, identity: dict[str, str], selected: int) -> dict[str, Any]:
    return {
        "task_file": {"path": task_file.source, "sha256": task_file.sha256, "tasks": len(task_file.tasks),
                      **({"dataset": task_file.dataset, "split": task_file.split} if task_file.dataset else {})},
        "model": identity,
        "config": masked_config(config.to_dict()),
        "command": options.command,
        "selected": selected,
        "options": {
            "workers": options.workers, "filter": options.filter, "slice": options.slice, "shuffle": options.shuffle,
            "seed": options.seed, "shard": options.shard, "redo": options.redo, "force": options.force,
            "max_concurrent_calls": options.max_concurrent_calls, "batch_cost_limit": options.batch_cost_limit,
            "batch_token_limit": options.batch_token_limit, "executor": options.executor,
            "ray_address": options.ray_address, "ray_resources": options.ray_resources, "split": options.split,
            "grade": options.grade, "grade_timeout": options.grade_timeout, "image_budget": options.image_budget,
            "prefetch": options.prefetch, "max_pulls": options.max_pulls,
        },
    }
