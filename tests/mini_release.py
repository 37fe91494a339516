"""mini-swe-agent's released packages, for the tests that compare miniswe with it: each wheel downloaded from PyPI
once (pip download, checked against its pinned sha256) into a cache, unpacked, and used from there. Nothing here
is imported by miniswe; the tests run mini-swe-agent's own code in a subprocess (tests/mini_reference.py).

The cache is MINISWE_MINI_CACHE, else ~/.cache/miniswe-tests/mini-swe-agent. Without PyPI the tests that need a
wheel skip, saying why, unless MINISWE_REQUIRE_MINI=1 (CI sets it), where they fail instead.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
# The releases compared with: the last 1.x (its configs keep every template under `agent:`) and the 2.x the
# mapping was written against. The hashes are PyPI's.
WHEELS = {
    "2.4.6": "a35463c553ac825c7773b03cfa69cd44958e3af20155dcc5711fdf9e4c67cd54",
    "1.17.5": "6aff069f6c7fa250a1c2f7852ec13b3b51391368d15be4335b8c192e874b2f92",
}


def cache_dir() -> Path:
    return Path(os.environ.get("MINISWE_MINI_CACHE") or Path.home() / ".cache" / "miniswe-tests" / "mini-swe-agent")


def unavailable(why: str) -> None:
    if os.environ.get("MINISWE_REQUIRE_MINI") == "1":
        pytest.fail(f"{why} (MINISWE_REQUIRE_MINI=1)", pytrace=False)
    pytest.skip(why)


def mini_release(version: str) -> Path:
    """The folder holding the unpacked wheel of mini-swe-agent `version` (its `minisweagent` package)."""
    target = cache_dir() / version
    if (target / "minisweagent" / "__init__.py").is_file():
        return target
    cache_dir().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        try:
            done = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
                 "-q", f"mini-swe-agent=={version}", "-d", tmp], capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as error:
            unavailable(f"cannot download mini-swe-agent {version} from PyPI: {error}")
        wheels = glob.glob(os.path.join(tmp, "mini_swe_agent-*.whl"))
        if done.returncode or not wheels:
            lines = (done.stderr or done.stdout).strip().splitlines()
            unavailable(f"cannot download mini-swe-agent {version} from PyPI: {lines[-1] if lines else done.returncode}")
        digest = hashlib.sha256(Path(wheels[0]).read_bytes()).hexdigest()
        assert digest == WHEELS[version], f"mini-swe-agent {version}'s wheel is not the one PyPI published ({digest})"
        unpacked = os.path.join(tmp, "unpacked")
        with zipfile.ZipFile(wheels[0]) as wheel:
            wheel.extractall(unpacked)
        try:
            os.rename(unpacked, target)
        except OSError:  # another worker unpacked it first
            if not (target / "minisweagent" / "__init__.py").is_file():
                raise
    return target


def shipped_configs(version: str) -> list[Path]:
    """Every config file the release ships (2.x: config/ and config/benchmarks/; 1.x: config/ and config/extra/)."""
    root = mini_release(version) / "minisweagent" / "config"
    return sorted(root.glob("*.yaml")) + sorted(root.glob("*/*.yaml"))


def run_reference(version: str, config: Path, task: str, replies: list, *, mode: str, cwd: Path, out: Path,
                  env: dict[str, str], trajectory: Path | None = None) -> dict:
    """mini-swe-agent `version`'s own DefaultAgent and LocalEnvironment on `config`, given `replies` by a scripted
    model (`mode`: text or tools): {messages: the messages it built, tools: what it offers (2.x)}; its trajectory
    saved to `trajectory`."""
    script = out.with_suffix(".replies.json")
    script.write_text(json.dumps(replies))
    args = [sys.executable, str(HERE / "mini_reference.py"), "--package", str(mini_release(version)), "--config", str(config),
            "--task", task, "--replies", str(script), "--mode", mode, "--cwd", str(cwd), "--out", str(out)]
    if trajectory:
        args += ["--trajectory", str(trajectory)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env, cwd=cwd)
    assert done.returncode == 0, f"mini-swe-agent {version} failed on {config.name}:\n{done.stderr[-3000:]}"
    return json.loads(out.read_text())
