"""Docker environment overhead on this machine, side by side with a bare `docker exec C true` loop.

    python benchmarks/bench_docker.py [--steps 100] [--image miniswe-test:latest] [--executable docker]
                                      [--fallback-image IMAGE]
                                      [--batch-tasks 8] [--batch-steps 3] [--batch-workers 4]

Reports: container start (DockerEnvironment() until ready) and removal (close()); per-step wall time of
execute("true") through the resident executor, interleaved in the same run with a bare `docker exec C true`,
`docker exec C bash -c true`, the local environment's execute("true") and a bare local `bash -c true`;
the executor's overhead over the local environment (target: within 10 ms); the same for the exec-per-step
fallback (on --fallback-image, by default --image with python3 removed, committed once); and how many containers a `miniswe batch --image IMAGE -w 4` keeps
alive at once (polling `docker ps -a` while it runs: at most one per worker), how many are left when it
ends (0), and its wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))
from miniswe.environments.docker import DockerConfig, DockerEnvironment  # noqa: E402
from miniswe.environments.local import LocalConfig, LocalEnvironment  # noqa: E402
from openai_server import ScriptedServer  # noqa: E402

# One reply for every call (the workers share the server): a counter in the task's container submits at $STEPS.
COUNTER = (
    "THOUGHT: next.\n\n```bash\n"
    'n=$(( $(cat .n) + 1 )); echo $n > .n; '
    'if [ "$n" -ge "$STEPS" ]; then echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; else echo "step $n"; fi\n```\n'
)


def ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:7.1f} ms median, {statistics.mean(values) * 1000:7.1f} mean"


def interleaved(fns: list, n: int) -> list[list[float]]:
    """n timings of each function, taken in turn so that drift in the engine's speed hits all alike."""
    out: list[list[float]] = [[] for _ in fns]
    for _ in range(n):
        for fn, times in zip(fns, out):
            started = time.perf_counter()
            fn()
            times.append(time.perf_counter() - started)
    return out


def batch_containers(args: argparse.Namespace) -> tuple[list[tuple[str, str]], list[str]]:
    """Run a real `miniswe batch --image` and count this batch's containers on the engine while it runs."""
    import yaml

    tag = uuid.uuid4().hex[:8]
    tasks = [
        {"id": f"bench-{tag}-{i:02d}", "task": "count", "cwd": "/tmp", "env": {"env": {"STEPS": str(args.batch_steps)}},
         "setup": ["echo 0 > .n"], "eval": [f'test "$(cat .n)" -eq {args.batch_steps}']}
        for i in range(args.batch_tasks)
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "MINISWE_"))}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")

    def mine() -> list[str]:
        listed = subprocess.run(
            [args.executable, "ps", "-a", "--format", "{{.Names}}", "--filter", "label=miniswe.run"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        return [name for name in listed.stdout.split() if f"-bench-{tag}-" in name]

    with tempfile.TemporaryDirectory() as workdir, ScriptedServer(default=COUNTER, latency=0.02) as server:
        with open(os.path.join(workdir, "tasks.yaml"), "w") as handle:
            yaml.safe_dump(tasks, handle)
        started = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "miniswe", "batch", "tasks.yaml", "-o", "run", "-w", str(args.batch_workers),
             "--image", args.image, "-c", f"environment.executable={args.executable}", "--base-url", server.base_url,
             "-m", "bench", "-q"],
            cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        counts, seen = [], set()
        while proc.poll() is None:
            alive = mine()
            counts.append(len(alive))
            seen.update(alive)
            time.sleep(0.02)
        wall = time.perf_counter() - started
        out, err = proc.communicate()
        left = mine()
        if proc.returncode != 0:
            raise SystemExit(f"batch failed ({proc.returncode}):\n{out}{err}")
        with open(os.path.join(workdir, "run", "results.jsonl")) as handle:
            records = [json.loads(line) for line in handle]
    assert len(records) == args.batch_tasks and all(r["resolved"] and r["steps"] == args.batch_steps for r in records)
    busy = [c for c in counts if c]
    most = max(counts, default=0)
    label = f"{args.batch_workers}-worker batch, {args.batch_tasks} tasks x {args.batch_steps} steps"
    rows = [
        (f"{label}: containers alive at once", f"max {most} (target <= {args.batch_workers}), median "
                                              f"{statistics.median(busy or [0]):g} while any ({len(counts)} polls of `ps -a`)"),
        (f"{label}: containers seen / left at the end", f"{len(seen)} / {len(left)} (target: 0 left)"),
        (f"{label}: wall time (all resolved)", f"{wall:7.2f} s"),
    ]
    problems = [f"{most} containers alive at once with {args.batch_workers} workers"] if most > args.batch_workers else []
    problems += [f"{len(left)} container(s) left after the batch: {' '.join(left)}"] if left else []
    return rows, problems


def without_python(args: argparse.Namespace) -> str:
    """--image with python3 removed (committed once, tagged with the base's id): the fallback's image."""
    exe = args.executable
    base = subprocess.run([exe, "image", "inspect", "--format", "{{.Id}}", args.image], capture_output=True, text=True)
    name = f"miniswe-bench-nopython:{base.stdout.strip().removeprefix('sha256:')[:12]}"
    if subprocess.run([exe, "image", "inspect", name], capture_output=True).returncode:
        scratch = f"miniswe-bench-derive-{uuid.uuid4().hex[:8]}"
        subprocess.run([exe, "run", "--name", scratch, "--entrypoint", "bash", args.image, "-c", "rm -f /usr/bin/python3*"],
                       capture_output=True)
        subprocess.run([exe, "commit", scratch, name], capture_output=True)
        subprocess.run([exe, "rm", "-f", scratch], capture_output=True)
    return name


def step_rows(env: DockerEnvironment, local: LocalEnvironment, args: argparse.Namespace, label: str) -> tuple[list, float]:
    """Per-step timings of `env`, interleaved with the bare loops; (rows, overhead over local in ms)."""
    env.execute("true", timeout=30)  # warm-up
    local.execute("true", timeout=30)
    steps, bare, shell, local_steps, local_bash = interleaved(
        [
            lambda: env.execute("true", timeout=30),
            lambda: subprocess.run([args.executable, "exec", env.name, "true"], check=True),
            lambda: subprocess.run([args.executable, "exec", env.name, "bash", "-c", "true"], check=True),
            lambda: local.execute("true", timeout=30),
            lambda: subprocess.run(["bash", "-c", "true"], check=True),
        ],
        args.steps,
    )
    overhead = (statistics.median(steps) - statistics.median(local_steps)) * 1000
    rows = [
        (f"{label}: execute('true'), {args.steps} steps", ms(steps)),
        (f"{label}: bare `{args.executable} exec C true`", ms(bare)),
        (f"{label}: bare `{args.executable} exec C bash -c true`", ms(shell)),
        (f"{label}: local environment execute('true')", ms(local_steps)),
        (f"{label}: bare local `bash -c true`", ms(local_bash)),
        (f"{label}: overhead over the local environment", f"{overhead:+7.1f} ms (target: <= +10 ms)"),
        (f"{label}: saved per step vs bare exec", f"{(statistics.median(bare) - statistics.median(steps)) * 1000:+7.1f} ms"),
    ]
    return rows, overhead


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--image", default="miniswe-test:latest")
    parser.add_argument("--fallback-image", default="",
                        help="an image without python3, for the exec-per-step fallback (default: --image without python3)")
    parser.add_argument("--executable", default="docker")
    parser.add_argument("--batch-tasks", type=int, default=8)
    parser.add_argument("--batch-steps", type=int, default=3)
    parser.add_argument("--batch-workers", type=int, default=4)
    args = parser.parse_args()
    cfg = DockerConfig(image=args.image, executable=args.executable, pull="never")
    rows = []
    problems = []

    starts, removals = [], []
    for _ in range(5):
        started = time.perf_counter()
        env = DockerEnvironment(cfg)
        starts.append(time.perf_counter() - started)
        started = time.perf_counter()
        env.close()
        removals.append(time.perf_counter() - started)
    rows.append(("container start (DockerEnvironment(), 5 runs)", ms(starts)))
    rows.append(("container removal (close(), 5 runs)", ms(removals)))

    with tempfile.TemporaryDirectory() as cwd:
        local = LocalEnvironment(LocalConfig(cwd=cwd))
        env = DockerEnvironment(cfg)
        try:
            assert env.describe()["executor"] == "resident", env.describe()
            resident_rows, overhead = step_rows(env, local, args, "executor")
        finally:
            env.close()
        rows += resident_rows
        if overhead > 10:
            problems.append(f"executor overhead {overhead:.1f} ms over the local environment (target 10 ms)")
        fallback = args.fallback_image or without_python(args)
        present = subprocess.run([args.executable, "image", "inspect", fallback], capture_output=True)
        if present.returncode == 0:
            env = DockerEnvironment(cfg.model_copy(update={"image": fallback}))
            try:
                fallback_rows, _ = step_rows(env, local, args, "exec-per-step fallback")
            finally:
                env.close()
            name, value = fallback_rows[5]
            rows += fallback_rows[:1] + [(name, value.split(" (target")[0])]
        else:
            rows.append(("exec-per-step fallback", f"skipped: no image {fallback}"))
    batch_rows, batch_problems = batch_containers(args)
    rows.extend(batch_rows)
    problems += batch_problems

    width = max(len(r[0]) for r in rows)
    print(f"miniswe docker benchmark ({args.executable}, {args.image}; {os.cpu_count()} cores)")
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
    for problem in problems:
        print(f"FAIL: {problem}")
    if problems:
        sys.exit(1)


if __name__ == "__main__":
    main()
