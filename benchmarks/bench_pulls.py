"""Image pulls in a batch: pulled as each task starts, against pulled ahead while tasks run; and peak image disk
against a budget. A real registry on loopback (Debian's docker-registry, tests/registry.py) behind a proxy that
delays every blob (a slow link); a scripted model that answers each call after a delay.

    python benchmarks/bench_pulls.py [--tasks 6] [--pull-delay 2.0] [--model-latency 0.2] [--calls 10]
                                     [--workers 1] [--budget-images 2]

Each task runs in its own image (a 3 MB layer of its own over the local base image miniswe-test) and makes
--calls model calls. The batch runs twice, one worker each: `--prefetch 0` (each image pulled when its task
starts: the pull sits on the task's critical path) and `--prefetch 2` (the next images pulled while tasks run).
For each it prints the wall time, the pull total (the pulls' own durations, summed), the agent total (the tasks'
run times, summed; model calls within) and the wall time against the larger of the two totals (target: within
1.25x with pulls ahead) and against their sum. Then a batch of `--workers 3` over every image with
--image-budget room for --budget-images of them, `docker system df` sampled every 0.1 s: its peak image disk
above the start (target: within the budget) and what run.json reports.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))
import registry as reg  # noqa: E402
from openai_server import ScriptedServer  # noqa: E402
from replies import act  # noqa: E402

from miniswe.batch.run import BatchOptions, run_batch  # noqa: E402
from miniswe.config import load_config  # noqa: E402
from miniswe.environments.images import human, image_disk  # noqa: E402

# each task counts its calls in its container and submits at $CALLS
STEP = act('n=$(( $(cat /tmp/.n 2>/dev/null || echo 0) + 1 )); echo $n > /tmp/.n; '
           'if [ "$n" -ge "$CALLS" ]; then echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; else echo "call $n"; fi')


def run(server, proxy, tags, calls, folder, **options):
    import yaml

    tasks = os.path.join(folder, "tasks.yaml")
    with open(tasks, "w") as handle:
        yaml.safe_dump([{"id": f"t{i}-{tag}", "task": "count", "env": {"image": proxy.image(tag), "env": {"CALLS": str(calls)}}}
                        for i, tag in enumerate(tags)], handle)
    config = load_config({"model": {"base_url": server.base_url, "name": "bench"}, "agent": {"step_limit": calls + 5},
                          "environment": {"timeout": 60}})
    started = time.monotonic()
    result = run_batch(config, BatchOptions(tasks, os.path.join(folder, "run"), quiet=True, **options), stream=io.StringIO())
    wall = time.monotonic() - started
    records = [json.loads(line) for line in open(os.path.join(folder, "run", "results.jsonl"))]
    assert result.exit_code == 0 and {r["exit_status"] for r in records} == {"Submitted"}, result.markdown
    run_json = json.load(open(os.path.join(folder, "run", "run.json")))
    return wall, records, run_json["invocations"][-1].get("images") or {}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=6)
    parser.add_argument("--pull-delay", type=float, default=2.0, help="seconds the proxy holds every blob")
    parser.add_argument("--model-latency", type=float, default=0.2, help="seconds per model call")
    parser.add_argument("--calls", type=int, default=10, help="model calls per task")
    parser.add_argument("--workers", type=int, default=3, help="workers of the budget run")
    parser.add_argument("--budget-images", type=int, default=2, help="images the budget run has room for")
    args = parser.parse_args()
    problem = reg.problem()
    if problem:
        print(f"bench_pulls: cannot run: {problem}")
        return 1
    tags = [reg.TAGS[i % len(reg.TAGS)] for i in range(min(args.tasks, len(reg.TAGS)))]
    registry = reg.Registry(reg.seeded_data())
    status = 0
    try:
        with ScriptedServer(default=STEP, latency=args.model_latency) as server:
            print(f"{len(tags)} tasks, one image each (a {reg.PAD_BYTES / 1e6:.0f} MB layer of its own), every blob held "
                  f"{args.pull_delay:g}s; {args.calls} model calls a task, {args.model_latency * 1000:.0f} ms each; 1 worker")
            walls = {}
            for label, prefetch in (("pulled as each task starts (--prefetch 0)", 0), ("pulled ahead (--prefetch 2)", 2)):
                proxy = reg.Proxy(registry.port)
                proxy.blob_delay = args.pull_delay
                try:
                    with tempfile.TemporaryDirectory() as folder:
                        wall, records, images = run(server, proxy, tags, args.calls, folder, workers=1, prefetch=prefetch,
                                                    max_pulls=1)
                finally:
                    proxy.close()
                pulls = images.get("pull_s", 0.0)
                agent = sum(r["wall_s"] for r in records)
                model = sum(r.get("model_s") or 0 for r in records)
                waited = sum((r.get("image") or {}).get("wait_s") or 0 for r in records)
                larger, total = max(pulls, agent), pulls + agent
                walls[prefetch] = wall
                print(f"  {label}:\n    wall {wall:.1f}s · pulls {pulls:.1f}s · agent {agent:.1f}s (model {model:.1f}s) · "
                      f"tasks waited {waited:.1f}s for images\n    wall / larger total {wall / larger:.2f}x · "
                      f"wall / sum {wall / total:.2f}x")
                if prefetch and wall / larger > 1.25:
                    print("    MISSED: pulled ahead, the wall time should come within 1.25x of the larger total")
                    status = 1
            print(f"  pulling ahead saved {walls[0] - walls[2]:.1f}s of {walls[0]:.1f}s")

            budget = int((args.budget_images + 0.5) * reg.PAD_BYTES)
            proxy = reg.Proxy(registry.port)
            proxy.blob_delay = args.pull_delay / 4
            samples, done = [], threading.Event()

            def sample():
                while not done.is_set():
                    samples.append(image_disk("docker"))
                    time.sleep(0.1)

            base = image_disk("docker") or 0
            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            try:
                with tempfile.TemporaryDirectory() as folder:
                    wall, records, images = run(server, proxy, tags, 3, folder, workers=args.workers,
                                                image_budget=str(budget), prefetch=2)
            finally:
                done.set()
                sampler.join(5)
                proxy.close()
            peak = max((s for s in samples if s is not None), default=base) - base
            waits = {}
            for r in records:
                waits[(r.get("image") or {}).get("wait")] = waits.get((r.get("image") or {}).get("wait"), 0) + 1
            print(f"budget run: {len(tags)} images, --image-budget {human(budget)} (room for {args.budget_images}), "
                  f"{args.workers} workers: wall {wall:.1f}s\n    peak image disk above the start, from `docker system df` "
                  f"({len(samples)} samples): {human(peak)}; run.json: peak {human(images.get('peak_disk', 0))}, "
                  f"{images.get('pulls')} pulled, {images.get('removed')} removed\n    tasks by image wait: {waits}")
            if peak > budget * 1.05:
                print("    MISSED: the peak image disk should stay within the budget (other images built meanwhile "
                      "on a shared engine count too)")
                status = 1
    finally:
        registry.close()
    return status


if __name__ == "__main__":
    sys.exit(main())
