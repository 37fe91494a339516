"""Two runs side by side: two trajectories of one task (where they first diverge, and what each cost), or two
batch run directories (per task: newly resolved, newly failed, other status changes, tasks in only one)."""

from __future__ import annotations

from typing import Any

from miniswe.output import visible
from miniswe.inspector.text import count, money, plain_table, seconds
from miniswe.inspector.views import VIEW_VERSION, header_view, run_view
from miniswe.trajectory import Step, Trajectory

EXCERPT = 400  # characters of each side's output shown at the divergence


def divergence(a: list[Step], b: list[Step]) -> dict[str, Any] | None:
    """The first step where two runs differ: its command (or format error), then its result; or where one
    ended while the other went on. None when they did the same things."""
    for left, right in zip(a, b):
        if (left.command, left.format_error) != (right.command, right.format_error):
            reason = "the commands differ" if left.command is not None and right.command is not None else "the replies differ"
        elif (left.returncode, left.timed_out, left.aborted) != (right.returncode, right.timed_out, right.aborted):
            reason = "the same command ended differently"
        elif left.output != right.output:
            reason = "the same command printed different output"
        else:
            continue
        return {"step": left.step, "reason": reason, "a": _side(left), "b": _side(right)}
    if len(a) != len(b):
        shorter, which = (a, "a") if len(a) < len(b) else (b, "b")
        step = len(shorter) + 1
        longer = b if which == "a" else a
        return {"step": step, "reason": f"{which.upper()} ended after step {len(shorter)}",
                which: None, ("b" if which == "a" else "a"): _side(longer[step - 1])}
    return None


def _side(step: Step) -> dict[str, Any]:
    return {"command": step.command, "format_error": step.format_error, "returncode": step.returncode,
            "timed_out": step.timed_out, "output": step.output[:EXCERPT]}


def compare_trajectories(a: Trajectory, b: Trajectory) -> dict[str, Any]:
    heads = [header_view(t) for t in (a, b)]
    return {
        "inspect": "compare-trajectories",
        "version": VIEW_VERSION,
        "same_task": a.task.strip() == b.task.strip(),
        "a": _facts(heads[0]),
        "b": _facts(heads[1]),
        "divergence": divergence(a.steps, b.steps),
    }


def _facts(header: dict[str, Any]) -> dict[str, Any]:
    usage = header["usage"]
    return {"path": header["path"], "task": header["task"], "model": header["model"], "exit_status": header["exit_status"],
            "resolved": header["resolved"], "steps": header["steps"], "format_errors": header["format_errors"],
            "tokens": usage["total_tokens"], "cost": usage["cost"], "wall_s": header["wall_s"],
            "submitted": header["submission"] is not None}


def compare_runs(dir_a: str, dir_b: str) -> dict[str, Any]:
    a, b = run_view(dir_a), run_view(dir_b)
    rows_a = {r["id"]: r for r in a["rows"]}
    rows_b = {r["id"]: r for r in b["rows"]}
    both = [task for task in rows_a if task in rows_b]
    changes = []
    for task in both:
        left, right = rows_a[task], rows_b[task]
        if left["resolved"] is not True and right["resolved"] is True:
            change = "newly resolved"
        elif left["resolved"] is True and right["resolved"] is not True:
            change = "newly failed"
        elif left["exit_status"] != right["exit_status"]:
            change = "status changed"
        else:
            continue
        changes.append({"id": task, "change": change, "a": _brief(left), "b": _brief(right)})
    return {
        "inspect": "compare-runs",
        "version": VIEW_VERSION,
        "a": {"path": a["path"], "model": a["model"], "totals": a["totals"]},
        "b": {"path": b["path"], "model": b["model"], "totals": b["totals"]},
        "newly_resolved": [c["id"] for c in changes if c["change"] == "newly resolved"],
        "newly_failed": [c["id"] for c in changes if c["change"] == "newly failed"],
        "changes": changes,
        "unchanged": len(both) - len(changes),
        "only_in_a": sorted(set(rows_a) - set(rows_b)),
        "only_in_b": sorted(set(rows_b) - set(rows_a)),
    }


def _brief(row: dict[str, Any]) -> dict[str, Any]:
    return {"exit_status": row["exit_status"], "resolved": row["resolved"], "steps": row["steps"], "cost": row["cost"]}


# -- as text ----------------------------------------------------------------------------------------------------------
def trajectories_text(view: dict[str, Any]) -> str:
    a, b = view["a"], view["b"]
    lines = [f"A  {a['path']}", f"B  {b['path']}"]
    if not view["same_task"]:
        lines.append("warning: the two runs are of different tasks; the comparison may mean little")
    resolved = {True: "yes", False: "no", None: "—"}
    rows = [["", "A", "B"]] + [
        [label, fmt(a[key]), fmt(b[key])]
        for label, key, fmt in (
            ("exit status", "exit_status", lambda v: v or "unfinished"), ("resolved", "resolved", lambda v: resolved[v]),
            ("model", "model", str), ("steps", "steps", str), ("format errors", "format_errors", str),
            ("tokens", "tokens", count), ("cost", "cost", money), ("wall time", "wall_s", seconds),
        )
    ]
    lines += ["", plain_table(rows, right=set()), ""]
    found = view["divergence"]
    if found is None:
        lines.append("no divergence: the same commands with the same results, step by step")
    else:
        lines.append(f"first divergence at step {found['step']}: {found['reason']}")
        for side in ("a", "b"):
            step = found[side]
            if step is None:
                lines.append(f"  {side.upper()}  (no step {found['step']}: the run had ended)")
                continue
            what = f"format error ({step['format_error']})" if step["format_error"] else "$ " + (step["command"] or "").split("\n")[0][:200]
            result = "timed out" if step["timed_out"] else f"rc={step['returncode']}" if step["command"] is not None else ""
            lines.append(f"  {side.upper()}  {what}" + (f"   [{result}]" if result else ""))
            if step["output"].strip() and found["reason"] != "the commands differ":
                lines += [f"     │ {line}" for line in step["output"].rstrip("\n").split("\n")[:8]]
    return visible("\n".join(lines) + "\n")


def runs_text(view: dict[str, Any]) -> str:
    a, b = view["a"], view["b"]
    lines = []
    for name, side in (("A", a), ("B", b)):
        totals = side["totals"]
        resolved = f" · resolved {totals['resolved']}/{totals['evaluated']}" if totals["evaluated"] else ""
        statuses = ", ".join(f"{s} {n}" for s, n in totals["by_status"].items())
        lines.append(f"{name}  {side['path']} · {totals['tasks']} tasks ({statuses}){resolved} · {money(totals['cost'])}")
    lines.append("")
    for key, label in (("newly_resolved", "newly resolved"), ("newly_failed", "newly failed")):
        ids = view[key]
        lines.append(f"{label} ({len(ids)})" + (": " + ", ".join(ids) if ids else ""))
    others = [c for c in view["changes"] if c["change"] == "status changed"]
    lines.append(f"status changed ({len(others)})" + (":" if others else ""))
    if view["changes"]:
        table = [["id", "change", "A", "B"]] + [
            [c["id"], c["change"], _status(c["a"]), _status(c["b"])] for c in view["changes"]]
        lines += ["", plain_table(table, right=set())]
    lines.append("")
    lines.append(f"unchanged {view['unchanged']} · only in A {len(view['only_in_a'])} · only in B {len(view['only_in_b'])}")
    for key, label in (("only_in_a", "only in A"), ("only_in_b", "only in B")):
        if view[key]:
            lines.append(f"{label}: " + ", ".join(view[key]))
    return visible("\n".join(lines) + "\n")


def _status(side: dict[str, Any]) -> str:
    resolved = {True: " (resolved)", False: " (not resolved)", None: ""}[side["resolved"]]
    return side["exit_status"] + resolved
