"""Which tasks of a file a batch runs: --filter, --shuffle/--seed, --slice, then --shard; all deterministic.

Shards hash the task id, so a task stays in its shard however the file is reordered or grown.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Sequence

from miniswe.batch.tasks import Task
from miniswe.errors import UsageError


def select_tasks(
    tasks: Sequence[Task],
    *,
    filter: str | None = None,
    slice: str | None = None,
    shuffle: bool = False,
    seed: int | None = None,
    shard: str | None = None,
) -> list[Task]:
    chosen = list(tasks)
    if filter:
        try:
            pattern = re.compile(filter)
        except re.error as error:
            raise UsageError(f"--filter {filter!r}: not a valid regular expression ({error})") from None
        chosen = [task for task in chosen if pattern.search(task.id)]
    if shuffle or seed is not None:  # a seed says a shuffle is wanted
        random.Random(0 if seed is None else seed).shuffle(chosen)
    if slice:
        start, stop = parse_slice(slice)
        chosen = chosen[start:stop]
    if shard:
        index, count = parse_shard(shard)
        chosen = [task for task in chosen if shard_of(task.id, count) == index]
    return chosen


def parse_slice(text: str) -> tuple[int | None, int | None]:
    """'START:STOP' with either side optional (Python slice semantics), or 'N' for the first N."""
    parts = text.split(":")
    try:
        if len(parts) == 1:
            return None, int(parts[0])
        if len(parts) == 2:
            return tuple(int(p) if p.strip() else None for p in parts)  # type: ignore[return-value]
    except ValueError:
        pass
    raise UsageError(f"--slice {text!r}: expected START:STOP (e.g. 0:50, 10:, :5) or a count N")


def parse_shard(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not match or not 1 <= int(match[1]) <= int(match[2]):
        raise UsageError(f"--shard {text!r}: expected I/N with 1 <= I <= N, e.g. --shard 2/8")
    return int(match[1]), int(match[2])


def shard_of(task_id: str, count: int) -> int:
    """The shard (1..count) a task id belongs to."""
    digest = hashlib.sha256(task_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % count + 1
