"""Benchmark of `miniswe batch`: parallel speedup and miniswe's own overhead per task.

40 tasks x 10 steps against the loopback scripted server answering each call after 200 ms, run as a
real `miniswe batch` process with 1, 4 and 8 workers. Run: .venv/bin/python benchmarks/bench_batch.py
Targets: 8 workers at least 6.5x faster than 1; overhead under 50 ms per task beyond the steps.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from openai_server import ScriptedServer  # noqa: E402

# One reply for every call: a counter in the task's workspace submits at step $STEPS.
COUNTER = (
    "THOUGHT: next.\n\n```bash\n"
    'n=$(( $(cat .n 2>/dev/null || echo 0) + 1 )); echo $n > .n; '
    'if [ "$n" -ge "$STEPS" ]; then echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; else echo "step $n"; fi\n```\n'
)


def run_batch(workers: int, tasks: int, steps: int, latency: float, workdir: str) -> dict:
    import yaml

    tasks_path = os.path.join(workdir, "tasks.yaml")
    with open(tasks_path, "w") as handle:
        yaml.safe_dump([{"id": f"t{i:03d}", "task": "count", "env": {"env": {"STEPS": str(steps)}}} for i in range(tasks)], handle)
    run_dir = os.path.join(workdir, f"run-w{workers}")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "MINISWE_"))}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    with ScriptedServer(default=COUNTER, latency=latency) as server:
        started = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "miniswe", "batch", tasks_path, "-o", run_dir, "-w", str(workers),
             "--base-url", server.base_url, "-m", "bench", "-q"],
            env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL,
        )
        wall = time.perf_counter() - started
        calls = len(server.requests)
    if proc.returncode != 0:
        raise SystemExit(f"batch with {workers} workers failed ({proc.returncode}):\n{proc.stderr}")
    with open(os.path.join(run_dir, "results.jsonl")) as handle:
        records = [json.loads(line) for line in handle]
    assert len(records) == tasks and all(r["exit_status"] == "Submitted" and r["steps"] == steps for r in records)
    assert calls == tasks * steps
    # the steps themselves: each model call (as the client measured it) and each command
    model_s = command_s = 0.0
    for record in records:
        with open(os.path.join(run_dir, record["trajectory"])) as handle:
            trajectory = json.load(handle)
        model_s += sum(step["latency_s"] for step in trajectory["steps"])  # each call's, on its (first) step
        command_s += sum(step["duration_s"] for step in trajectory["steps"])
    if model_s < calls * latency:
        raise SystemExit(f"the trajectories account for {model_s:.1f} s of model time, less than the server's "
                         f"{calls * latency:.1f} s: where they record latency has changed")
    task_wall = sum(r["wall_s"] for r in records)
    return {
        "workers": workers, "wall_s": wall, "model_s": model_s, "command_s": command_s,
        # worker-seconds not spent waiting on the model or a command, per task: the whole process,
        # its start-up, planning, trajectories, ledger, preds.json and report included
        "overhead_ms": (wall * workers - model_s - command_s) / tasks * 1000,
        # the same, counted inside each task only (run_task set-up, per-step work, ledger line)
        "task_overhead_ms": (task_wall - model_s - command_s) / tasks * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=40)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--latency", type=float, default=0.2, help="seconds the server waits before each answer")
    parser.add_argument("--workers", default="1,4,8", help="comma-separated worker counts")
    args = parser.parse_args()
    counts = [int(w) for w in args.workers.split(",")]
    ideal_one = args.tasks * args.steps * args.latency
    print(f"{args.tasks} tasks x {args.steps} steps, {args.latency * 1000:.0f} ms per model call "
          f"(model time alone: {ideal_one:.1f} s on one worker)")
    print(f"{'workers':>7}  {'wall s':>7}  {'ideal s':>7}  {'speedup':>7}  {'overhead/task ms':>16}  {'in-task ms':>10}")
    results = []
    with tempfile.TemporaryDirectory(prefix="miniswe-bench-batch-") as workdir:
        for workers in counts:
            result = run_batch(workers, args.tasks, args.steps, args.latency, workdir)
            results.append(result)
            speedup = results[0]["wall_s"] / result["wall_s"]
            ideal = ideal_one / workers
            print(f"{workers:>7}  {result['wall_s']:>7.2f}  {ideal:>7.2f}  {speedup:>6.2f}x  "
                  f"{result['overhead_ms']:>16.1f}  {result['task_overhead_ms']:>10.1f}", flush=True)
    if counts[0] == 1 and 8 in counts:
        speedup = results[0]["wall_s"] / results[counts.index(8)]["wall_s"]
        print(f"8 workers vs 1: {speedup:.2f}x (target >= 6.5x); overhead with 1 worker: "
              f"{results[0]['overhead_ms']:.1f} ms per task (target < 50 ms)")


if __name__ == "__main__":
    main()
