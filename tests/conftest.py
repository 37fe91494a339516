"""Shared fixtures: a scripted OpenAI-compatible server on 127.0.0.1, and a real `miniswe` subprocess runner."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from openai_server import ScriptedServer  # noqa: E402
from replies import SUBMIT, F, act  # noqa: E402,F401  (the tests import these from here)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def server():
    with ScriptedServer() as srv:
        yield srv


def clean_env(**extra: str) -> dict[str, str]:
    """The environment for a miniswe subprocess: no endpoint or key leaking in from the developer's shell."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "MINISWE_"))}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def miniswe_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "miniswe", *args]


@pytest.fixture
def cli(tmp_path):
    """Run `miniswe ARGS` in a real subprocess inside tmp_path; returns CompletedProcess (text)."""

    def invoke(*args: str, env: dict[str, str] | None = None, timeout: float = 60, cwd: Path | None = None):
        return subprocess.run(
            miniswe_cmd(*args), cwd=cwd or tmp_path, env=clean_env(**(env or {})), capture_output=True,
            text=True, timeout=timeout, stdin=subprocess.DEVNULL,
        )

    return invoke
