"""Recorded runs for the inspect tests, made with the typed API: long trajectories and large batch run directories,
with every kind of step (format errors, timeouts, non-zero exits, aborted commands, outputs the capture cut)."""

from __future__ import annotations

import json
import os

from miniswe.batch.ledger import LEDGER, LedgerRecord, record_line
from miniswe.batch.rundir import RUN_JSON, FORMAT as RUN_FORMAT
from miniswe.status import ExitStatus, Outcome
from miniswe.trajectory import Step, Trajectory
from miniswe.usage import Usage

# An output a page must show as text: it would end the data element, run script, or load something if interpreted.
HOSTILE = ("</script><script>window.__pwned = 1</script><!-- <img src=x onerror=\"window.__pwned = 2\"> <b>bold</b> "
           "&amp; \u2028 <script src=\"https://example.invalid/x.js\"></script>")
STATUSES = [ExitStatus.SUBMITTED] * 6 + [ExitStatus.LIMITS_EXCEEDED, ExitStatus.TIME_EXCEEDED,
                                          ExitStatus.REPEATED_FORMAT_ERROR, ExitStatus.MODEL_ERROR]


def make_step(number: int, *, output_lines: int = 6) -> tuple[Step, str]:
    """Step `number` of a made-up run and the observation the model saw after it; the kind of step cycles."""
    usage = Usage(model_calls=1, prompt_tokens=1000 + number, completion_tokens=50, total_tokens=1050 + number, cost=0.001)
    kind = number % 50
    if kind == 7:
        return Step(number, thought=f"THOUGHT: step {number}, no block.", format_error="no_action", usage=usage), \
            "Your reply was not run: the reply has no ```bash block."
    output = "".join(f"line {i} of step {number}: {'x' * (i % 40)}\n" for i in range(output_lines))
    fields = {"returncode": 0}
    if kind == 11:
        fields = {"returncode": None, "timed_out": True}
    elif kind == 13:
        fields = {"returncode": 2}
    elif kind == 17:
        fields = {"returncode": None, "aborted": "SIGTERM"}
    elif kind == 19:
        output = output[:60] + "\n[... 99000 bytes of output elided by miniswe ...]\n" + output[-60:]
        fields = {"returncode": 0, "elided_chars": 99000}
    elif kind == 23:
        output = HOSTILE + "\n"
    step = Step(number, thought=f"THOUGHT: look at part {number} of the code.", command=f"grep -n 'part_{number}' src/*.py",
                output=output, output_chars=len(output) + fields.get("elided_chars", 0), duration_s=0.01 * (number % 7),
                usage=usage, finish_reason="stop", latency_s=0.5, **fields)
    rc = "killed" if step.returncode is None else step.returncode
    return step, f"<returncode>{rc}</returncode>\n<output>\n{output}</output>"


def write_trajectory(path: str, steps: int, *, task: str = "Fix the parser", status: ExitStatus = ExitStatus.SUBMITTED,
                     output_lines: int = 6, metadata: dict | None = None) -> Trajectory:
    trajectory = Trajectory(path, task=task, config={"agent": {"step_limit": steps + 10}, "environment": {"kind": "local"},
                                                     "model": {"kind": "openai", "name": "test-model"}},
                            environment={"kind": "local", "cwd": "/tmp"}, metadata=metadata or {})
    trajectory.describe(model={"kind": "openai", "name": "test-model"})
    trajectory.add_message("system", "You are a careful engineer.")
    trajectory.add_message("user", task)
    for number in range(1, steps + 1):
        step, observation = make_step(number, output_lines=output_lines)
        trajectory.add_message("assistant", f"{step.thought}\n\n```bash\n{step.command}\n```", number)
        trajectory.record_step(step)
        trajectory.add_usage(step.usage)
        trajectory.add_message("user", observation, number)
    submission = "diff --git a/src/p.py b/src/p.py\n+fixed\n" if status is ExitStatus.SUBMITTED else None
    trajectory.finish(Outcome(status, None if submission else f"{status} after {steps} steps", submission))
    trajectory.save()
    return trajectory


def write_run_dir(run_dir: str, tasks: int, *, steps: int = 8, statuses=None) -> list[LedgerRecord]:
    """A finished batch run directory of `tasks` tasks: trajectories, results.jsonl and run.json."""
    os.makedirs(run_dir, exist_ok=True)
    records = []
    for index in range(tasks):
        task_id = f"task-{index:04d}"
        status = (statuses or STATUSES)[index % len(statuses or STATUSES)]
        relative = f"{task_id}/{task_id}.traj.json"
        trajectory = write_trajectory(os.path.join(run_dir, relative), steps + index % 5, task=f"Task {index}: fix it",
                                      status=status, metadata={"task_id": task_id})
        if status is ExitStatus.SUBMITTED:
            trajectory.set_resolved(index % 3 != 0)
            trajectory.save()
        records.append(LedgerRecord.from_trajectory(trajectory, task_id=task_id, relative_path=relative, has_eval=True,
                                                    model="test-model", attempt=1, started=trajectory.started,
                                                    wall_s=1.0 + index % 9))
    with open(os.path.join(run_dir, LEDGER), "w", encoding="utf-8") as handle:
        handle.write("".join(record_line(r) for r in records))
    with open(os.path.join(run_dir, RUN_JSON), "w", encoding="utf-8") as handle:
        json.dump({"format": RUN_FORMAT, "version": 1, "model": {"kind": "openai", "name": "test-model"},
                   "task_file": {"path": "tasks.yaml"}, "selected": tasks, "status": "finished"}, handle)
    return records
