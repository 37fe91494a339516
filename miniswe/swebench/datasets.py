"""SWE-bench task lists by name, and what a SWE-bench batch runs in.

A task list is a file (YAML, JSON, JSONL, or Parquet), a dataset folder, or a dataset name: one of ALIASES or a
Hugging Face id (`owner/name`). Names are loaded with the `datasets` library (an optional extra), which caches
them; a name never silently falls back to a file or back.

SWE-bench instances run in their own image at /testbed: config/swebench.yaml holds that environment, and a batch
of SWE-bench instances uses it unless the user configured an environment of their own.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import re
from typing import Any

from miniswe.errors import UsageError

ALIASES = {
    "verified": "SWE-bench/SWE-bench_Verified",
    "lite": "SWE-bench/SWE-bench_Lite",
    "full": "SWE-bench/SWE-bench",
    "multimodal": "SWE-bench/SWE-bench_Multimodal",
    "multilingual": "SWE-bench/SWE-bench_Multilingual",
}
HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
FILE_SUFFIXES = (".json", ".jsonl", ".yaml", ".yml", ".parquet")
BENCHMARK_CONFIG = "swebench.yaml"
# The harness's image name for an instance whose dataset row names none (SWE-bench before its `image` column).
IMAGE_CONVENTION = "docker.io/swebench/sweb.eval.x86_64.{instance_id}:latest"


def dataset_name(spec: str) -> str | None:
    """The dataset `spec` names (a Hugging Face id, or a local dataset folder), or None when it is a task file."""
    if os.path.isdir(spec):
        return spec
    if os.path.exists(spec):
        return None
    if spec.strip().lower() in ALIASES:
        return ALIASES[spec.strip().lower()]
    if HF_ID.match(spec) and not spec.lower().endswith(FILE_SUFFIXES):
        return spec
    return None


def load_dataset_rows(spec: str, split: str) -> tuple[str, list[dict[str, Any]], str]:
    """(dataset id, its rows as plain dicts, a fingerprint of them) for a dataset name or folder."""
    name = dataset_name(spec) or spec
    from miniswe.swebench import require

    datasets = require("datasets", f"loading the dataset {spec!r}")
    try:
        dataset = datasets.load_dataset(name, split=split)
    except Exception as error:  # noqa: BLE001 - the hub, the cache and the files each raise their own kinds
        reason = str(error).strip().splitlines()[0][:300] if str(error).strip() else type(error).__name__
        raise UsageError(
            f"{spec}: cannot load dataset {name} (split {split}): {reason}; check the name and split, and the network "
            "(or pass an exported JSONL file instead)"
        ) from None
    rows = [plain(dict(row)) for row in dataset]
    fingerprint = getattr(dataset, "_fingerprint", None) or _digest(rows)
    return name, rows, hashlib.sha256(f"{name}@{split}:{fingerprint}".encode()).hexdigest()


def read_parquet(path: str) -> list[dict[str, Any]]:
    """A Parquet file's rows (an exported dataset) as plain dicts."""
    from miniswe.swebench import require

    parquet = require("pyarrow.parquet", f"reading the Parquet task file {path}")
    try:
        table = parquet.read_table(path)
    except Exception as error:  # noqa: BLE001 - pyarrow's errors name the problem
        raise UsageError(f"{path}: not a readable Parquet file ({error}); export the dataset again") from None
    return [plain(row) for row in table.to_pylist()]


def plain(row: dict[str, Any]) -> dict[str, Any]:
    """A row whose values JSON can hold: dates and other objects a Parquet file may carry become text."""
    def value(item: Any) -> Any:
        if isinstance(item, (str, int, float, bool)) or item is None:
            return item
        if isinstance(item, (list, tuple)):
            return [value(x) for x in item]
        if isinstance(item, dict):
            return {str(k): value(v) for k, v in item.items()}
        if isinstance(item, (datetime.datetime, datetime.date)):
            return item.isoformat()
        return str(item)

    return {str(key): value(item) for key, item in row.items()}


def _digest(rows: list[dict[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(rows, sort_keys=True, default=str).encode()).hexdigest()


def default_image(instance_id: str) -> str:
    """The harness's image for an instance, as SWE-bench names them on Docker Hub ('__' spelled '_1776_')."""
    return IMAGE_CONVENTION.format(instance_id=instance_id).replace("__", "_1776_").lower()


def benchmark_environment() -> dict[str, Any]:
    """The shipped benchmark config's environment section (config/swebench.yaml)."""
    import yaml

    from miniswe.resources import config_dir

    path = os.path.join(config_dir(), BENCHMARK_CONFIG)
    with open(path, encoding="utf-8") as handle:
        return dict((yaml.safe_load(handle) or {}).get("environment") or {})


def benchmark_path() -> str:
    from miniswe.resources import config_dir

    return os.path.join(config_dir(), BENCHMARK_CONFIG)


def with_benchmark(config: Any) -> Any:
    """`config` for a SWE-bench task list: the shipped environment when no environment setting was given at all
    (SWE-bench cannot run on the host: /testbed is in the image). The CLI layers the file under -c and flags
    instead (evaluate.batch_sources), so a setting given there merges with it; this covers a config built in code."""
    from miniswe.config import override

    environment = config.environment
    if environment.model_dump() != type(environment)(kind=environment.kind).model_dump() or environment.kind != "local":
        return config
    return override(config, environment=benchmark_environment())

