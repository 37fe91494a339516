"""The batch report: numbers from the ledger (latest record per task), as JSON and as Markdown (report.md).

p90 and median interpolate linearly between ranks (numpy's default percentile method).
"""

from __future__ import annotations

import math
import os
import statistics
from collections import Counter
from typing import Any

from miniswe.batch.ledger import LEDGER, LedgerRecord, read_records
from miniswe.batch.rundir import RunDir
from miniswe.environments.images import human
from miniswe.errors import UsageError
from miniswe.status import ExitStatus, is_agent_outcome, is_infra_failure
METRICS = ("steps", "tokens", "cost", "wall_s")
TOP = 5


def load_run(run_dir: str) -> tuple[list[LedgerRecord], dict[str, Any] | None]:
    """The ledger's records and run.json of a run directory (run.json may be missing)."""
    ledger = os.path.join(run_dir, LEDGER)
    if not os.path.isdir(run_dir):
        raise UsageError(f"{run_dir}: no such run directory")
    run = RunDir(run_dir).read_run()
    if run is None and not os.path.exists(ledger):
        raise UsageError(f"{run_dir}: not a miniswe batch run directory (no {LEDGER} or run.json)")
    return list(read_records(ledger).values()), run


def build_report(records: list[LedgerRecord], run: dict[str, Any] | None = None) -> dict[str, Any]:
    """The report's numbers; keys are documented in docs/batch-and-ray.md and stable. `run` (run.json) adds what
    the batch's image pools did."""
    evaluated = [r for r in records if r.has_eval or r.resolved is not None]
    resolved = sum(1 for r in records if r.resolved is True)
    return {
        "tasks": len(records),
        "by_status": dict(Counter(r.exit_status for r in records).most_common()),
        "resolved": resolved,
        "evaluated": len(evaluated),
        "resolved_rate": resolved / len(evaluated) if evaluated else None,
        **{metric: summary([float(getattr(r, metric) or 0) for r in records]) for metric in METRICS},
        "infra_failures": [
            {"id": r.id, "exit_status": r.exit_status, "detail": _last_line(r.exit_detail), "trajectory": r.trajectory}
            for r in records
            if is_infra_failure(r.exit_status)
        ],
        "grading": grading_summary(records),
        "time": time_split(records),
        "images": images_summary(run),
    }


def time_split(records: list[LedgerRecord]) -> dict[str, Any]:
    """Where the tasks' time went, summed over tasks: the agent's runs (model calls apart), the waits for images
    before them (for a pull, for room under the image budget) and grading; and how many tasks waited for what."""
    images = [r.image for r in records if r.image]
    agent = sum(float(r.wall_s or 0) for r in records)
    model = sum(float(r.model_s or 0) for r in records)
    return {
        "agent_s": round(agent, 3), "model_s": round(model, 3),
        "image_wait_s": round(sum(float(i.get("wait_s") or 0) for i in images), 3),
        "pull_wait_s": round(sum(float(i.get("pull_s") or 0) for i in images), 3),
        "budget_wait_s": round(sum(float(i.get("budget_s") or 0) for i in images), 3),
        "grading_s": round(sum(float(r.grade.get("wall_s") or 0) for r in records if r.grade), 3),
        "image_waits": dict(Counter(str(i.get("wait")) for i in images).most_common()),
    }


def images_summary(run: dict[str, Any] | None) -> dict[str, Any] | None:
    """What the batch's image pools did over every invocation (run.json): pulls, bytes pulled, time spent pulling
    (ahead of the tasks or not), removals, the peak disk the batch's images took against the budget."""
    found = [i["images"] for i in (run or {}).get("invocations") or [] if isinstance(i.get("images"), dict)]
    if not found:
        return None
    total = {key: sum(int(f.get(key) or 0) for f in found) for key in ("pulls", "failed", "bytes_pulled", "removed", "rate_limited")}
    return {**total, "pull_s": round(sum(float(f.get("pull_s") or 0) for f in found), 3),
            "peak_disk": max(int(f.get("peak_disk") or 0) for f in found), "budget": int(found[-1].get("budget") or 0)}


def grading_summary(records: list[LedgerRecord]) -> dict[str, Any] | None:
    """SWE-bench grading apart from the agent's work: outcomes, the time it took, and every task not resolved
    for a reason other than its tests (or not graded at all), with that reason. None when nothing was graded."""
    graded = [r for r in records if r.grade]
    if not graded:
        return None
    return {
        "graded": len(graded),
        "by_status": dict(Counter(str(r.grade.get("status")) for r in graded).most_common()),
        "wall_s": summary([float(r.grade.get("wall_s") or 0) for r in graded]),
        "total_wall_s": round(sum(float(r.grade.get("wall_s") or 0) for r in graded), 3),
        "not_by_tests": [{"id": r.id, "status": r.grade.get("status"), "resolved": r.grade.get("resolved"),
                          "detail": _last_line(r.grade.get("detail"))}
                         for r in graded if r.grade.get("status") not in ("resolved", "unresolved")],
        "harness": next((r.grade.get("harness") for r in graded if r.grade.get("harness")), None),
    }


def summary(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "median": None, "p90": None, "max": None}
    return {"mean": statistics.fmean(values), "median": percentile(values, 0.5), "p90": percentile(values, 0.9), "max": max(values)}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def render_markdown(report: dict[str, Any], records: list[LedgerRecord], run: dict[str, Any] | None, run_dir: str,
                    unrun: str = "") -> str:
    lines = ["# miniswe batch report", ""]
    facts = [f"run directory `{run_dir}`"]
    if run:
        model = run.get("model") or {}
        facts.append(f"model `{model.get('name') or model.get('kind')}`")
        if run.get("task_file", {}).get("path"):
            facts.append(f"task file `{run['task_file']['path']}`")
    lines += [" · ".join(facts), ""]
    total = report["tasks"]
    if not total:
        return "\n".join(lines + ["No task has finished yet.", ""])
    head = f"**{total} tasks**"
    if report["evaluated"]:
        how = "graded" if report.get("grading") else "with eval"
        head += f" · **resolved {report['resolved']} of {report['evaluated']}** {how} ({report['resolved_rate']:.1%})"
    lines += [head, ""]
    if unrun:
        lines += [f"**Incomplete:** {unrun}.", ""]
    lines += ["| exit status | kind | tasks | share |", "| --- | --- | ---: | ---: |"]
    for status, count in report["by_status"].items():
        kind = "agent outcome" if is_agent_outcome(status) else "infrastructure" if is_infra_failure(status) else "interrupted"
        lines.append(f"| {status} | {kind} | {count} | {count / total:.1%} |")
    lines += ["", "| per task | mean | median | p90 | max |", "| --- | ---: | ---: | ---: | ---: |"]
    for metric, label, fmt in (("steps", "steps", "{:.1f}"), ("tokens", "tokens", "{:,.0f}"), ("cost", "cost ($)", "{:.4f}"), ("wall_s", "wall time (s)", "{:.1f}")):
        values = report[metric]
        lines.append(f"| {label} | " + " | ".join(fmt.format(values[k]) for k in ("mean", "median", "p90", "max")) + " |")
    slowest = sorted(records, key=lambda r: -(r.wall_s or 0))[:TOP]
    lines += ["", "Slowest: " + ", ".join(f"`{r.id}` {r.wall_s or 0:.1f}s" for r in slowest)]
    if any(r.cost for r in records):
        priciest = sorted(records, key=lambda r: -(r.cost or 0))[:TOP]
        lines.append("Most expensive: " + ", ".join(f"`{r.id}` ${r.cost or 0:.4f}" for r in priciest))
    lines += time_lines(report.get("time"), report.get("images") or images_summary(run))
    failures = report["infra_failures"]
    interrupted = report["by_status"].get(str(ExitStatus.INTERRUPTED), 0)
    if failures:
        lines += ["", f"## Infrastructure failures ({len(failures)})", "", "| task | status | detail |", "| --- | --- | --- |"]
        for failure in failures:
            detail = (failure["detail"] or "").replace("|", "\\|")[:160]
            lines.append(f"| `{failure['id']}` | {failure['exit_status']} | {detail} |")
    grading = report.get("grading")
    if grading:
        counts = " · ".join(f"{status} {count}" for status, count in grading["by_status"].items())
        wall = grading["wall_s"]
        lines += ["", f"## Grading ({grading['graded']} graded by {grading['harness'] or 'the SWE-bench harness'})", "",
                  f"{counts}. Grading time (apart from the agent's): {grading['total_wall_s']:.1f}s in all, "
                  f"{wall['mean']:.1f}s mean, {wall['max']:.1f}s max."]
        if grading["not_by_tests"]:
            lines += ["", "| task | grade | resolved | reason |", "| --- | --- | --- | --- |"]
            for item in grading["not_by_tests"]:
                resolved = {True: "yes", False: "no"}.get(item["resolved"], "not graded")
                detail = (item["detail"] or "").replace("|", "\\|")[:160]
                lines.append(f"| `{item['id']}` | {item['status']} | {resolved} | {detail} |")
        if any(item["resolved"] is None for item in grading["not_by_tests"]):
            lines += ["", f"Grade the tasks not graded again (their agent results are kept): `miniswe evaluate {run_dir}`"]
    lines.append("")
    if failures or interrupted:
        what = " and ".join(x for x in (f"{len(failures)} failed" if failures else "", f"{interrupted} interrupted" if interrupted else "") if x)
        if run and run.get("status") == "merged":
            commands = "; ".join(f"`{command}`" for command in run.get("shard_commands") or []) or "each shard's own command"
            lines += [f"Rerun only the {what} tasks in their shards (finished ones are kept): {commands}; then merge again.", ""]
        else:
            command = (run or {}).get("command") or f"miniswe batch TASKS -o {run_dir}"
            lines += [f"Rerun only the {what} tasks (finished ones are kept): `{command}`", ""]
    if run and run.get("missing_shards"):
        lines += [f"**Not merged:** shard(s) {', '.join(run['missing_shards'])}; this report covers part of the task list.", ""]
    return "\n".join(lines)


def time_lines(split: dict[str, Any] | None, images: dict[str, Any] | None) -> list[str]:
    """The report's "Where the time went": the tasks' time apart, then what the image pools did."""
    if not split:
        return []
    rows = [("model calls", split["model_s"]), ("commands and the rest of the agent's runs", split["agent_s"] - split["model_s"]),
            ("waiting for image pulls", split["pull_wait_s"]), ("queued behind the image budget", split["budget_wait_s"]),
            ("grading", split["grading_s"])]
    total = sum(max(0.0, seconds) for _, seconds in rows)
    if not total:
        return []
    lines = ["", "## Where the time went", "", "| summed over tasks | seconds | share |", "| --- | ---: | ---: |"]
    for label, seconds in rows:
        if seconds > 0 or label == "model calls":
            lines.append(f"| {label} | {seconds:.1f} | {max(0.0, seconds) / total:.1%} |")
    waits = split.get("image_waits") or {}
    if waits:
        said = {"none": "started at once", "pull": "waited for a pull", "budget": "queued behind the budget",
                "failed": "could not get their image"}
        lines += ["", "Tasks by image wait: " + ", ".join(f"{count} {said.get(wait, wait)}" for wait, count in waits.items()) + "."]
    if images:
        budget = f" of a {human(images['budget'])} budget" if images.get("budget") else " (no budget)"
        line = (f"Images: {images['pulls']} pulled ({human(images['bytes_pulled'])}, {images['pull_s']:.1f}s of pulling, "
                f"much of it while tasks ran), {images['removed']} removed; peak image disk {human(images['peak_disk'])}{budget}.")
        if images.get("failed"):
            line += f" {images['failed']} could not be pulled."
        if images.get("rate_limited"):
            line += f" Registries rate-limited pulls {images['rate_limited']} time(s)."
        lines += ["", line]
    return lines


def _last_line(text: Any) -> str:
    if not isinstance(text, str) or not text.strip():
        return ""
    return text.strip().splitlines()[-1][:300]
