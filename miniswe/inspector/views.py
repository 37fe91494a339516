"""What `inspect` shows, as plain data: a run (header and steps) and a batch (totals and one row per task).

The terminal text, `--json` and the HTML page are all made from these, so they always agree. The shapes are
documented in docs/replay-and-inspect.md and versioned by VIEW_VERSION.
"""

from __future__ import annotations

import os
from typing import Any

from miniswe.display import step_status
from miniswe.mini_swe_agent import NOT_RECORDED
from miniswe.trajectory import Step, Trajectory

VIEW_VERSION = 1
# The settings the header shows, as the dotted keys `-c` takes.
CONFIG_KEYS = ("agent.step_limit", "agent.token_limit", "agent.cost_limit", "agent.time_limit", "environment.kind",
               "environment.image", "environment.cwd", "environment.timeout", "model.kind", "model.name", "model.base_url")
# `--sort` names, each the row key it sorts by; numbers sort largest first.
COLUMNS = {"id": "id", "status": "exit_status", "resolved": "resolved", "steps": "steps", "tokens": "tokens",
           "cost": "cost", "wall": "wall_s"}


def is_error(step: Step) -> bool:
    """What `--errors` keeps: format errors, timeouts, aborted commands and non-zero exits."""
    return bool(step.format_error or step.timed_out or step.aborted or (step.returncode not in (0, None)))


def observations(trajectory: Trajectory) -> dict[int, str]:
    """What the model was shown after each step: the user (or tool) messages of that step, by step number."""
    seen: dict[int, str] = {}
    for message in trajectory.messages:
        if message.step is not None and message.role != "assistant":
            seen[message.step] = seen[message.step] + "\n" + message.content if message.step in seen else message.content
    return seen


def step_view(step: Step, observation: str | None, missing: frozenset[str] = frozenset()) -> dict[str, Any]:
    """One step; a figure its format did not record (see `mini_swe_agent.NOT_RECORDED`) is None."""
    usage = step.usage
    tokens = "tokens" not in missing
    view = {
        "step": step.step,
        "thought": step.thought,
        "reasoning": step.reasoning,
        "command": step.command,
        "format_error": step.format_error,
        "returncode": step.returncode,
        "timed_out": step.timed_out,
        "aborted": step.aborted,
        "status": step_status(step),
        "error": is_error(step),
        "duration_s": None if "duration_s" in missing else step.duration_s,
        "observation": observation,  # None when the model was shown nothing after it (the run ended)
        "output": step.output,
        "output_chars": step.output_chars,
        "elided_chars": step.elided_chars,
        "tokens": usage.total_tokens if tokens else None,
        "prompt_tokens": usage.prompt_tokens if tokens else None,
        "completion_tokens": usage.completion_tokens if tokens else None,
        "cost": None if "step_usage" in missing else usage.cost,
        "latency_s": step.latency_s,
        "finish_reason": step.finish_reason,
    }
    if step.proposed is not None:  # a hook or a person changed the model's command before it ran
        view["proposed"] = step.proposed
    if step.refused:
        view["refused"] = step.refused
    if step.tool_call:  # only where there is one: a text-protocol run's view is as it was
        view["tool"] = step.tool_call.get("name")
    if step.children:
        view["children"] = [{key: link.get(key) for key in ("trajectory", "depth", "task", "exit_status", "steps")}
                            for link in step.children]
    return view


PENDING_STATUS = "cut short / never finished"


def pending_view(trajectory: Trajectory, missing: frozenset[str] = frozenset()) -> dict[str, Any] | None:
    """The command a killed run was running when it died (recorded before it ran, never finished): a step of
    its own, marked so; None when there is none."""
    if trajectory.pending is None:
        return None
    view = step_view(trajectory.pending, None, missing)
    view.update(status=PENDING_STATUS, error=True, pending=True, returncode=None, duration_s=None, output=None)
    return view


def resume_view(entry: dict[str, Any]) -> dict[str, Any]:
    changes = entry.get("changes") if isinstance(entry.get("changes"), dict) else {}
    return {"at": entry.get("at"), "from_step": entry.get("from_step"), "changes": changes,
            "diverged": entry.get("diverged"), "miniswe_version": entry.get("miniswe_version")}


def header_view(trajectory: Trajectory) -> dict[str, Any]:
    """The run as a whole: task, model, how it ended, counts, usage, timing, settings, and for a run converted
    from another format, what that format did not record."""
    outcome = trajectory.outcome
    steps = trajectory.steps
    missing = not_recorded(trajectory)
    converted = trajectory.metadata.get("converted_from")
    converted = converted if isinstance(converted, dict) else {}
    usage = trajectory.usage.to_dict()
    if "tokens" in missing:
        usage.update(prompt_tokens=None, completion_tokens=None, total_tokens=None, cached_tokens=None)
    if "cost" in missing:
        usage["cost"] = None
    return {
        "path": trajectory.path,
        "source": converted.get("format") or "miniswe-trajectory",
        "task": trajectory.task,
        "task_id": trajectory.metadata.get("task_id"),
        "model": model_name(trajectory),
        "exit_status": str(outcome.status) if outcome else None,
        "exit_detail": outcome.detail if outcome else None,
        "submission": outcome.submission if outcome else None,
        "resolved": trajectory.resolved,
        "grade": grade_beside(trajectory),
        "steps": len(steps),
        "format_errors": sum(1 for s in steps if s.format_error),
        "timeouts": sum(1 for s in steps if s.timed_out),
        "nonzero_exits": sum(1 for s in steps if s.returncode not in (0, None)),
        "aborted": sum(1 for s in steps if s.aborted),
        "usage": usage,
        "started": trajectory.started,
        "ended": trajectory.ended,
        "wall_s": trajectory.wall_s,
        "config": config_summary(trajectory.config),
        "not_recorded": [NOT_RECORDED.get(key, key) for key in sorted(missing)],
        "notes": list(converted.get("notes") or []),
        "compactions": [{key: entry.get(key) for key in ("step", "kind", "why", "window", "tokens_before", "tokens_after")}
                        for entry in trajectory.compactions],
        "pending": trajectory.pending.step if trajectory.pending is not None else None,
        "resumes": [resume_view(entry) for entry in trajectory.resumes if isinstance(entry, dict)],
        "parent": ({key: trajectory.parent.get(key) for key in ("trajectory", "run_id", "from_step")}
                   if trajectory.parent else None),
    }


def grade_beside(trajectory: Trajectory) -> dict[str, Any] | None:
    """The SWE-bench grade of a batch task's current trajectory (RUN_DIR/<id>/grade/grade.json); None for any other."""
    import json

    from miniswe.swebench.grading import GRADE_DIR

    task_id = trajectory.metadata.get("task_id")
    path = trajectory.path or ""
    if not task_id or os.path.basename(path) != f"{task_id}.traj.json":
        return None
    try:
        with open(os.path.join(os.path.dirname(path), GRADE_DIR, "grade.json"), encoding="utf-8") as handle:
            grade = json.load(handle)
    except (OSError, ValueError):
        return None
    return grade if isinstance(grade, dict) else None


def test_counts(grade: dict[str, Any] | None) -> str:
    """`FAIL_TO_PASS 1/1 · PASS_TO_PASS 12/12`: a grade's tests passed of those run; "" without test results."""
    tests = (grade or {}).get("tests") or {}
    parts = []
    for key in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        if key in tests:
            passed, failed = len(tests[key].get("success") or []), len(tests[key].get("failure") or [])
            parts.append(f"{key} {passed}/{passed + failed}")
    return " · ".join(parts)


def trajectory_view(trajectory: Trajectory, *, select=None) -> dict[str, Any]:
    """`--json` of a trajectory: its header and the steps `select(step)` keeps (all by default)."""
    seen = observations(trajectory)
    missing = not_recorded(trajectory)
    steps = [step_view(s, seen.get(s.step), missing) for s in trajectory.steps if select is None or select(s)]
    pending = pending_view(trajectory, missing)
    if pending is not None and (select is None or select(trajectory.pending, pending=True)):
        steps.append(pending)
    return {"inspect": "trajectory", "version": VIEW_VERSION, "header": header_view(trajectory), "steps": steps}


def not_recorded(trajectory: Trajectory) -> frozenset[str]:
    """The keys of `mini_swe_agent.NOT_RECORDED` that a converted trajectory's format lacked; empty for miniswe's own."""
    converted = trajectory.metadata.get("converted_from")
    return frozenset(converted.get("not_recorded") or []) if isinstance(converted, dict) else frozenset()


def model_name(trajectory: Trajectory) -> str:
    model = trajectory.model or {}
    recorded = trajectory.config.get("model") if isinstance(trajectory.config.get("model"), dict) else {}
    name = model.get("name") or recorded.get("name")
    kind = model.get("kind") or recorded.get("kind") or ""
    if name:
        return str(name)
    if kind == "scripted" and model.get("script"):
        return f"scripted ({os.path.basename(str(model['script']))})"
    return str(kind) or "unknown"


def config_summary(config: dict[str, Any]) -> dict[str, Any]:
    """The settings that shape a run, by dotted key; empty values left out."""
    summary = {}
    for key in CONFIG_KEYS:
        section, _, name = key.partition(".")
        values = config.get(section) if isinstance(config.get(section), dict) else {}
        value = values.get(name)
        if value not in (None, "", [], {}) and not (section == "agent" and value == 0):  # a 0 limit is no limit
            summary[key] = value
    return summary


def select_steps(step: int | None = None, steps: str | None = None, errors: bool = False):
    """The predicate of `--step N`, `--steps A:B` (inclusive, either end may be left out) and `--errors`."""
    from miniswe.errors import UsageError

    if step is not None and steps is not None:
        raise UsageError("give --step N or --steps A:B, not both")
    low, high = 1, None
    if step is not None:
        low = high = step
    if steps is not None:
        first, colon, last = steps.partition(":")
        try:
            low = int(first) if first.strip() else 1
            high = int(last) if last.strip() else None
        except ValueError:
            raise UsageError(f"--steps {steps}: expected A:B with step numbers (3:7, :10, 5:)") from None
        if not colon:
            high = low
        if high is not None and high < low:
            raise UsageError(f"--steps {steps}: the first step comes after the last; give A:B with A <= B")

    def keep(s: Step, pending: bool = False) -> bool:
        return low <= s.step and (high is None or s.step <= high) and (not errors or pending or is_error(s))

    return keep


# -- a batch -------------------------------------------------------------------------------------------------
def run_view(run_dir: str, *, sort: str | None = None, status: str | None = None) -> dict[str, Any]:
    """`--json` of a run directory: what the batch is, its totals, and one row per task (the ledger's latest)."""
    from miniswe.batch.report import build_report, load_run

    records, run = load_run(run_dir)
    numbers = build_report(records, run)
    rows = [row_view(r) for r in records]
    run = run or {}
    rows += unfinished_rows(run_dir, run, {r.id for r in records})
    totals = {
        "tasks": numbers["tasks"], "by_status": numbers["by_status"], "resolved": numbers["resolved"],
        "evaluated": numbers["evaluated"], "resolved_rate": numbers["resolved_rate"],
        "unfinished": sum(1 for r in rows if r["exit_status"] == UNFINISHED),
        "not_run": sum(1 for r in rows if r["exit_status"] == NOT_RUN),
        "tokens": sum(r["tokens"] for r in rows), "cost": round(sum(r["cost"] for r in rows), 8),
        "wall_s": round(sum(r["wall_s"] for r in rows), 3),
        "graded": (numbers["grading"] or {}).get("graded", 0),
        "grade_wall_s": (numbers["grading"] or {}).get("total_wall_s", 0.0),
        # where the time went, apart (batch/report.py time_split), and what the image pools did (None: nothing pulled)
        "model_s": numbers["time"]["model_s"], "image_wait_s": numbers["time"]["image_wait_s"],
        "pull_wait_s": numbers["time"]["pull_wait_s"], "budget_wait_s": numbers["time"]["budget_wait_s"],
        "image_waits": numbers["time"]["image_waits"], "images": numbers["images"],
    }
    return {
        "inspect": "run",
        "version": VIEW_VERSION,
        "path": os.path.abspath(run_dir),
        "model": (run.get("model") or {}).get("name") or (run.get("model") or {}).get("kind"),
        "task_file": (run.get("task_file") or {}).get("path"),
        "selected": run.get("selected"),
        "status": run.get("status"),
        "totals": totals,
        "rows": sort_rows(filter_rows(rows, status), sort),
    }


def row_view(record: Any) -> dict[str, Any]:
    detail = (record.exit_detail or "").strip().splitlines()
    return {
        "id": record.id, "exit_status": record.exit_status, "resolved": record.resolved, "steps": record.steps,
        "tokens": record.tokens, "cost": record.cost or 0.0, "wall_s": record.wall_s or 0.0,
        "exit_detail": detail[-1][:300] if detail else None, "trajectory": record.trajectory,
        "attempt": record.attempt, "grade": record.grade, "image": record.image,
    }


# The rows of selected tasks the ledger has no line for: started but not finished (the batch was stopped or
# killed while they ran), or never started.
UNFINISHED, NOT_RUN = "unfinished", "not run"


def selected_ids(run: dict[str, Any]) -> list[str] | None:
    """The ids of the tasks the batch selected, from its task file and options as run.json records them; None
    when that cannot be known (no task file there any more, or a changed one)."""
    from miniswe.batch.selection import select_tasks
    from miniswe.batch.tasks import load_tasks

    task_file, options = run.get("task_file") or {}, run.get("options") or {}
    if task_file.get("dataset"):
        return None  # loading a dataset by name may reach the network: `inspect` shows the task folders instead
    try:
        tasks = load_tasks(task_file["path"])
        if task_file.get("sha256") and tasks.sha256 != task_file["sha256"]:
            return None
        chosen = select_tasks(tasks.tasks, **{key: options.get(key) for key in ("filter", "slice", "shard", "seed")},
                              shuffle=bool(options.get("shuffle")))
    except Exception:  # noqa: BLE001 - only a fuller view is lost: the task folders are still listed
        return None
    return [task.id for task in chosen]


def unfinished_rows(run_dir: str, run: dict[str, Any], finished: set[str]) -> list[dict[str, Any]]:
    """A row for each selected task without a ledger line: `unfinished` where its trajectory was begun (the
    numbers so far), `not run` where it never started. The tasks are the batch's selection, and the task folders
    in the run directory (which also show what a batch whose task file is gone had begun)."""
    from miniswe.batch.plan import trajectory_name
    from miniswe.mini_swe_agent import load_any

    wanted = selected_ids(run) or []
    try:
        folders = sorted(name for name in os.listdir(run_dir)
                         if os.path.isfile(os.path.join(run_dir, trajectory_name(name))))
    except OSError:
        folders = []
    rows = []
    for task_id in dict.fromkeys([*wanted, *folders]):
        if task_id in finished:
            continue
        relative = trajectory_name(task_id)
        row = {"id": task_id, "exit_status": NOT_RUN, "resolved": None, "steps": 0, "tokens": 0, "cost": 0.0,
               "wall_s": 0.0, "exit_detail": "never started", "trajectory": None, "attempt": None, "grade": None,
               "image": None}
        if os.path.isfile(os.path.join(run_dir, relative)):
            row.update(exit_status=UNFINISHED, trajectory=relative,
                       exit_detail="began but did not finish (the batch was stopped or killed while it ran)")
            try:
                trajectory = load_any(os.path.join(run_dir, relative))
                row.update(steps=len(trajectory.steps), tokens=trajectory.usage.total_tokens,
                           cost=trajectory.usage.cost, wall_s=trajectory.wall_s or 0.0)
            except Exception:  # noqa: BLE001 - a half-written file still gets its row
                pass
        rows.append(row)
    return rows


def filter_rows(rows: list[dict[str, Any]], status: str | None) -> list[dict[str, Any]]:
    if not status:
        return rows
    from miniswe.errors import UsageError
    from miniswe.status import ExitStatus

    known = {str(s).lower(): str(s) for s in ExitStatus}
    known.update({UNFINISHED: UNFINISHED, NOT_RUN: NOT_RUN, "not-run": NOT_RUN, "not_run": NOT_RUN})
    wanted = set()
    for name in status.split(","):
        if name.strip().lower() not in known:
            raise UsageError(f"--status {name.strip()}: not an exit status (one of {', '.join(dict.fromkeys(known.values()))}; "
                             "several with commas)")
        wanted.add(known[name.strip().lower()])
    return [row for row in rows if row["exit_status"] in wanted]


def sort_rows(rows: list[dict[str, Any]], column: str | None) -> list[dict[str, Any]]:
    if not column:
        return rows
    from miniswe.errors import UsageError

    key = COLUMNS.get(column) or (column if column in COLUMNS.values() else None)
    if key is None:
        raise UsageError(f"--sort {column}: no such column (one of {', '.join(COLUMNS)})")
    if key in ("id", "exit_status"):
        return sorted(rows, key=lambda row: (row[key], row["id"]))
    # largest first; for resolved: True, then False, then not evaluated
    rank = {True: 2, False: 1, None: 0}
    return sorted(rows, key=lambda row: (-(rank[row[key]] if key == "resolved" else row[key] or 0), row["id"]))
