"""`miniswe images TASKS`: every image a task list needs, pulled once, with the batch's shared backoff
(environments/images.py), for users who pull before many runs."""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from miniswe.batch.plan import plan_tasks
from miniswe.batch.selection import select_tasks
from miniswe.batch.tasks import load_task_list
from miniswe.environments.images import Need, PullPolicy, is_present, need_of, pull
from miniswe.errors import Cancelled, PullError, SandboxError, UsageError


def prepull(tasks: str, config: Any, *, split: str = "test", filter: str | None = None, slice: str | None = None,
            shard: str | None = None, max_pulls: int = 2, policy: PullPolicy | None = None,
            stream: Any = None) -> int:
    """Pull every image the (selected) tasks of a task list need, `max_pulls` at a time, with the shared backoff:
    one line per image, then a total. 0 when all are there, 3 when some could not be pulled (rerun to retry)."""
    stream = stream or sys.stderr
    task_file = load_task_list(tasks, split)
    selected = select_tasks(task_file.tasks, filter=filter, slice=slice, shard=shard)
    if not selected:
        raise UsageError(f"{tasks}: no task selected by --filter/--slice/--shard (the file has {len(task_file.tasks)})")
    if all(task.swebench for task in selected):
        from miniswe.swebench.datasets import with_benchmark

        config = with_benchmark(config)
    plans = plan_tasks(task_file, selected, config, os.path.join(os.getcwd(), ".miniswe-images"))
    needs = list(dict.fromkeys(n for n in (need_of(p.config.environment) for p in plans) if n is not None))
    if not needs:
        print(f"miniswe images: the {len(plans)} task(s) of {tasks} run in no container image", file=stream)
        return 0
    policy = policy or PullPolicy()
    lock = threading.Lock()
    counts = {"present": 0, "pulled": 0, "failed": 0}

    def one(need: Need) -> None:
        exe, name, how = need
        exe = shutil.which(exe) or exe
        try:
            there = is_present(exe, name)
        except SandboxError as error:
            there, line = False, str(error)
        if there and how != "always":
            outcome, line = "present", f"present  {name}"
        elif how == "never" and not there:
            outcome, line = "failed", f"missing  {name}: environment.pull is never; build or load it"
        else:
            try:
                seconds = pull(exe, name, policy=policy, notice=lambda text: print(text, file=stream, flush=True))
                outcome, line = "pulled", f"pulled   {name} in {seconds:.1f}s"
            except (PullError, Cancelled) as error:
                outcome, line = "failed", f"failed   {error}"
        with lock:
            counts[outcome] += 1
            print(f"miniswe images: {line}", file=stream, flush=True)

    started = time.monotonic()
    with ThreadPoolExecutor(max(1, max_pulls)) as threads:
        list(threads.map(one, needs))
    print(f"miniswe images: {len(needs)} image(s): {counts['pulled']} pulled, {counts['present']} already present, "
          f"{counts['failed']} failed ({time.monotonic() - started:.1f}s)", file=stream, flush=True)
    return 3 if counts["failed"] else 0
