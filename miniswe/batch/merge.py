"""`miniswe merge`: combine the run directories of shards into one ledger, preds.json, report and trajectories.

Shards must come from the same task file and model; a task found in two shards with different
results is a conflict and nothing is written.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

from miniswe import __version__
from miniswe.batch.files import now, write_atomic
from miniswe.batch.ledger import LEDGER, LedgerRecord, record_line
from miniswe.batch.report import build_report, load_run, render_markdown
from miniswe.batch.rundir import FORMAT, REPORT_MD, RUN_JSON, RunDir
from miniswe.errors import UsageError
from miniswe.status import is_agent_outcome


def merge_runs(run_dirs: list[str], out: str, *, force: bool = False) -> tuple[dict[str, Any], str]:
    """Write the merged run into `out`; returns the report and its Markdown."""
    out = os.path.abspath(out)
    sources = [os.path.abspath(d) for d in run_dirs]
    if out in sources:
        raise UsageError(f"-o {out}: the output must be a new directory, not one of the runs being merged")
    if len(set(sources)) != len(sources):
        raise UsageError("merge: the same run directory is given twice")
    if not force and any(os.path.exists(os.path.join(out, name)) for name in (LEDGER, RUN_JSON)):
        raise UsageError(f"-o {out} already holds a run; pass another directory, or --force to overwrite it")
    runs = [(path, *load_run(path)) for path in sources]
    _check_same_batch(runs, force)
    merged: dict[str, LedgerRecord] = {}
    origin: dict[str, str] = {}
    for path, records, _ in runs:
        for record in records:
            seen = merged.get(record.id)
            if seen is not None and _outcome(seen) != _outcome(record):
                raise UsageError(
                    f"merge: task {record.id!r} has different results in {origin[record.id]} and {path}; "
                    "shards must be disjoint (rerun one of them, or leave one out)"
                )
            if seen is None:
                merged[record.id] = record
                origin[record.id] = path
    os.makedirs(out, exist_ok=True)
    for task_id, record in merged.items():
        _copy_trajectory(origin[task_id], out, record)
    records = list(merged.values())
    write_atomic(os.path.join(out, LEDGER), "".join(record_line(r) for r in records))
    target = RunDir(out)
    target.write_preds(records)
    first = next((run for _, _, run in runs if run), None) or {}
    # a failed task is rerun in its own shard, by that shard's command, then the shards are merged again
    needing_rerun = {origin[r.id] for r in records if not is_agent_outcome(r.exit_status)}
    shard_commands = [run.get("command") for path, _, run in runs if run and path in needing_rerun and run.get("command")]
    run = {
        "format": FORMAT, "version": 1, "miniswe_version": __version__,
        "task_file": first.get("task_file", {}), "model": first.get("model"), "config": first.get("config"),
        "merged_from": sources, "started": min((r.get("started") or "" for _, _, r in runs if r), default=now()),
        "ended": now(), "status": "merged", "selected": sum((r or {}).get("selected", 0) for _, _, r in runs),
        "command": None, "shard_commands": shard_commands, "invocations": [],
        "missing_shards": _missing_shards(runs),
    }
    target.write_json(RUN_JSON, run)
    report = build_report(records)
    markdown = render_markdown(report, records, run, out)
    target.write_text(REPORT_MD, markdown)
    return report, markdown


def _check_same_batch(runs: list[tuple[str, list, dict | None]], force: bool) -> None:
    known = [(path, run) for path, _, run in runs if run]
    for path, run in known[1:]:
        first_path, first = known[0]
        if force:
            break
        if run.get("task_file", {}).get("sha256") != first.get("task_file", {}).get("sha256"):
            raise UsageError(f"merge: {path} ran another task file than {first_path}; pass --force to merge anyway")
        if run.get("model") != first.get("model"):
            raise UsageError(f"merge: {path} ran another model than {first_path}; pass --force to merge anyway")


def _missing_shards(runs: list[tuple[str, list, dict | None]]) -> list[str]:
    """Shards of the same split (I/N) that were not given, so a partial merge does not pass for a whole one."""
    given: dict[int, set[int]] = {}
    for _, _, run in runs:
        shard = ((run or {}).get("options") or {}).get("shard") or ""
        index, _, count = shard.partition("/")
        if index.isdigit() and count.isdigit():
            given.setdefault(int(count), set()).add(int(index))
    return [f"{i}/{n}" for n, indexes in sorted(given.items()) for i in range(1, n + 1) if i not in indexes]


def _outcome(record: LedgerRecord) -> tuple:
    return (record.exit_status, record.resolved, record.submission, record.steps, record.tokens, record.cost)


def _copy_trajectory(source_dir: str, out: str, record: LedgerRecord) -> None:
    relative = record.trajectory
    if not relative:
        return
    source, target = os.path.join(source_dir, relative), os.path.join(out, relative)
    if not os.path.exists(source):
        return  # the ledger stays the source of truth; report shows the path it had
    os.makedirs(os.path.dirname(target), exist_ok=True)
    shutil.copy2(source, target)
