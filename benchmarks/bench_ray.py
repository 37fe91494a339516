"""Benchmark of the Ray executor against the thread executor, on one machine.

200 tasks x 10 steps against the loopback scripted server answering each call after 200 ms, run as a real
`miniswe batch` with 16 workers: threads, then Ray on a two-node cluster (a head and a second `ray start
--address` node, 8 CPUs' worth of tasks each). Everything runs inside a network namespace holding only
loopback (tests/raycluster.py), so it needs `unshare -rn`. Reports tasks per second (overall, and once
every worker runs a task), the start-up until then, the driver's peak memory, the Ray workers' memory,
and the Ray path's overhead per task beyond the thread executor's.

Run: .venv/bin/python benchmarks/bench_ray.py [--tasks 200 --steps 10 --latency 0.2 --workers 16]
"""

from __future__ import annotations

import argparse
import calendar
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from raycluster import LoopbackNamespace, TwoNodeCluster, unavailable  # noqa: E402

COUNTER = (
    "THOUGHT: next.\n\n```bash\n"
    'n=$(( $(cat .n 2>/dev/null || echo 0) + 1 )); echo $n > .n; '
    'if [ "$n" -ge "$STEPS" ]; then echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; else echo "step $n"; fi\n```\n'
)
# The driver in-process, so its own peak RSS can be read at the end (the thread executor's commands are children).
DRIVER = """
import resource, runpy, sys
sys.argv = ["miniswe", *sys.argv[1:]]
code = 0
try:
    runpy.run_module("miniswe", run_name="__main__")
except SystemExit as exit:
    code = exit.code or 0
print("MAXRSS_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
sys.exit(code)
"""


def stamp(iso: str) -> float:
    """Seconds since the epoch of a trajectory's timestamp (2026-01-02T03:04:05.678Z)."""
    whole, _, millis = iso.rstrip("Z").partition(".")
    return calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S")) + int(millis or 0) / 1000


def rss_of_ray_workers(ns: LoopbackNamespace) -> int:
    """Bytes resident in the namespace's Ray worker processes (their command lines start with ray::)."""
    total = 0
    for pid in ns.pids():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                if not handle.read().startswith(b"ray::"):
                    continue
            with open(f"/proc/{pid}/statm") as handle:
                total += int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:
            pass
    return total


def run(ns: LoopbackNamespace, work: Path, base_url: str, name: str, workers: int, extra: list[str]) -> dict:
    run_dir = work / name
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.5):
            peak[0] = max(peak[0], rss_of_ray_workers(ns))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started, launched = time.perf_counter(), time.time()
    proc = ns.run(sys.executable, "-c", DRIVER, "batch", "tasks.yaml", "-o", str(run_dir), "-w", str(workers),
                  "--base-url", base_url, "-m", "bench", "-q", *extra, cwd=work, timeout=3600)
    wall = time.perf_counter() - started
    done.set()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"{name}: batch failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    maxrss = int(next(line.split()[1] for line in proc.stderr.splitlines() if line.startswith("MAXRSS_KB")))
    records = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    model_s = command_s = 0.0
    spans = []
    for record in records:
        trajectory = json.loads((run_dir / record["trajectory"]).read_text())
        model_s += sum(step.get("latency_s", 0.0) for step in trajectory["steps"])
        command_s += sum(step["duration_s"] for step in trajectory["steps"])
        spans.append((stamp(trajectory["timing"]["started"]), stamp(trajectory["timing"]["ended"])))
    tasks = len(records)
    spans.sort()
    # start-up: until `workers` tasks run at once (process, cluster connection, Ray worker processes);
    # warm: the rate of the tasks started after that
    ready = spans[min(workers, tasks) - 1][0]
    warm = [span for span in spans if span[0] > ready]
    warm_rate = len(warm) / (max(end for _, end in warm) - ready) if warm else float("nan")
    assert all(r["exit_status"] == "Submitted" for r in records), f"{name}: not every task submitted"
    return {
        "name": name, "wall_s": wall, "tasks_per_s": tasks / wall, "startup_s": ready - launched, "warm_per_s": warm_rate,
        "driver_mb": maxrss / 1024,
        "workers_mb": peak[0] / 2**20,
        # worker-seconds not spent on the model or a command, per task: start-up, planning, scheduling, files
        "overhead_ms": (wall * workers - model_s - command_s) / tasks * 1000,
        # the same inside each task only (run_plan to its record, as the task's own wall time counts it)
        "task_overhead_ms": (sum(r["wall_s"] for r in records) - model_s - command_s) / tasks * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--workers", type=int, default=16)
    args = parser.parse_args()
    problem = unavailable()
    if problem:
        raise SystemExit(f"bench_ray: {problem}")
    ideal = args.tasks * args.steps * args.latency / args.workers
    print(f"{args.tasks} tasks x {args.steps} steps, {args.latency * 1000:.0f} ms per model call, {args.workers} workers "
          f"(model time alone: {ideal:.1f} s)")
    with tempfile.TemporaryDirectory(prefix="miniswe-bench-ray-") as folder:
        work = Path(folder)
        (work / "tasks.yaml").write_text("".join(
            f'- {{id: t{i:03d}, task: count, env: {{env: {{STEPS: "{args.steps}"}}}}}}\n' for i in range(args.tasks)))
        ns = LoopbackNamespace(work / "home")
        try:
            started = time.perf_counter()
            cluster = TwoNodeCluster(ns, work, cpus=(args.workers + 1) // 2)
            print(f"two-node cluster up in {time.perf_counter() - started:.1f} s")
            port_file = work / "port"
            server = ns.popen(sys.executable, str(ROOT / "tests" / "openai_server.py"), "--port-file", str(port_file),
                              "--latency", str(args.latency), "--default", COUNTER, stdout=subprocess.DEVNULL)
            while not port_file.exists():
                time.sleep(0.05)
            base_url = f"http://127.0.0.1:{port_file.read_text()}/v1"
            results = [run(ns, work, base_url, "threads", args.workers, []),
                       run(ns, work, base_url, "ray", args.workers, ["--executor", "ray", "--ray-address", cluster.address])]
            server.kill()
        finally:
            ns.close()
    print(f"{'executor':>8}  {'wall s':>7}  {'tasks/s':>7}  {'start-up s':>10}  {'warm tasks/s':>12}  {'driver MB':>9}  "
          f"{'Ray workers MB':>14}  {'overhead/task ms':>16}  {'in-task ms':>10}")
    for r in results:
        workers_mb = f"{r['workers_mb']:.0f}" if r["name"] == "ray" else "-"
        print(f"{r['name']:>8}  {r['wall_s']:>7.2f}  {r['tasks_per_s']:>7.2f}  {r['startup_s']:>10.2f}  {r['warm_per_s']:>12.2f}  "
              f"{r['driver_mb']:>9.0f}  {workers_mb:>14}  {r['overhead_ms']:>16.1f}  {r['task_overhead_ms']:>10.1f}")
    threads, ray = results
    print(f"Ray path: {ray['overhead_ms'] - threads['overhead_ms']:.0f} ms more worker time per task than threads "
          f"({ray['task_overhead_ms'] - threads['task_overhead_ms']:.1f} ms of it inside the task)")


if __name__ == "__main__":
    main()
