"""Docker environment overhead on this machine, against a bare `docker exec C true` loop.

    python benchmarks/bench_docker.py [--steps 100] [--image miniswe-test:latest] [--executable docker]

Reports: container start (DockerEnvironment() until ready) and removal (close()); per-step wall time of
execute("true") against bare `docker exec C true` and `docker exec C bash -c true` in the same container,
and a local `bash -c true`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from miniswe.environments.docker import DockerConfig, DockerEnvironment  # noqa: E402


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--image", default="miniswe-test:latest")
    parser.add_argument("--executable", default="docker")
    args = parser.parse_args()
    cfg = DockerConfig(image=args.image, executable=args.executable, pull="never")
    rows = []

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

    env = DockerEnvironment(cfg)
    try:
        env.execute("true", timeout=30)  # warm-up
        steps, bare, shell, local = interleaved(
            [
                lambda: env.execute("true", timeout=30),
                lambda: subprocess.run([args.executable, "exec", env.name, "true"], check=True),
                lambda: subprocess.run([args.executable, "exec", env.name, "bash", "-c", "true"], check=True),
                lambda: subprocess.run(["bash", "-c", "true"], check=True),
            ],
            args.steps,
        )
    finally:
        env.close()
    rows.append((f"execute('true'), {args.steps} steps", ms(steps)))
    rows.append((f"bare `{args.executable} exec C true`, {args.steps} steps", ms(bare)))
    rows.append((f"bare `{args.executable} exec C bash -c true`, {args.steps} steps", ms(shell)))
    overhead = (statistics.median(steps) - statistics.median(bare)) * 1000
    rows.append(("overhead per step vs bare exec", f"{overhead:+7.1f} ms"))
    rows.append((f"local `bash -c true`, {args.steps} steps", ms(local)))

    width = max(len(r[0]) for r in rows)
    print(f"miniswe docker benchmark ({args.executable}, {args.image}; {os.cpu_count()} cores)")
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")


if __name__ == "__main__":
    main()
