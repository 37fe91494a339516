"""Shared fixtures: a scripted OpenAI-compatible server on 127.0.0.1, and a real `miniswe` subprocess runner."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from openai_server import ScriptedServer  # noqa: E402
from replies import SUBMIT, F, act  # noqa: E402,F401  (the tests import these from here)

ROOT = Path(__file__).resolve().parent.parent


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: absent with -p no:xdist
def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto` (what ./dev test asks for): two workers a core, since most tests wait on their subprocesses."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return 2 * cores


@pytest.hookimpl(tryfirst=True)  # before its fixtures are set up
def pytest_runtest_setup(item) -> None:
    """A test kept apart by an xdist_group mark fails rather than run beside the others unsafely, where pytest-xdist
    ignored the mark (it adds "@GROUP" to the ids of the tests it groups)."""
    if getattr(item.config.option, "loadgroup", False) and item.get_closest_marker("xdist_group") and "@" not in item.nodeid:
        pytest.fail("pytest-xdist ignored this test's xdist_group mark (as with pytest 9.2: pytest-dev/pytest-xdist#1386); "
                    "pip install 'pytest<9.2', or run with -n 0", pytrace=False)


@pytest.fixture
def server():
    with ScriptedServer() as srv:
        yield srv


def missing(module: str, required_by: str) -> bool:
    """Whether the tests that need `module` should skip: it is not installed, and the variable CI sets to say it
    is (`required_by`, e.g. MINISWE_REQUIRE_RAY) is not 1, where they must run, and fail without it."""
    return importlib.util.find_spec(module) is None and os.environ.get(required_by) != "1"


def clean_env(**extra: str) -> dict[str, str]:
    """The environment for a miniswe subprocess: no endpoint or key leaking in from the developer's shell."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "MINISWE_"))}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


# A child started from a shell that ignores SIGINT (`cmd &` in a script, nohup, some CI runners) would
# inherit the ignored disposition; tests that signal their children give them the default back first.
DEFAULT_SIGINT = [sys.executable, "-c", "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                  "os.execv(sys.argv[1], sys.argv[1:])"]


def miniswe_cmd(*args: str) -> list[str]:
    return [*DEFAULT_SIGINT, sys.executable, "-m", "miniswe", *args]


def python_cmd(code: str) -> list[str]:
    return [*DEFAULT_SIGINT, sys.executable, "-c", code]


def read_line(stream, timeout: float = 20) -> str:
    """The next line of a child's pipe, or an AssertionError after `timeout`: no test waits without a deadline."""
    import select

    deadline = time.monotonic() + timeout
    line = b""
    fd = stream.fileno()
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise AssertionError(f"no line from the child within {timeout}s (got {line!r})")
        byte = os.read(fd, 1)
        if not byte:
            break
        line += byte
    return line.decode()


def read_until(stream, text: str, timeout: float = 20) -> str:
    """A child's pipe read line by line up to the first line holding `text` (what a test waits for instead of
    sleeping); the lines read, or an AssertionError after `timeout`."""
    deadline = time.monotonic() + timeout
    lines: list[str] = []
    while not lines or text not in lines[-1]:
        line = read_line(stream, max(deadline - time.monotonic(), 0.01))
        if not line:
            raise AssertionError(f"the child closed its pipe before printing {text!r}; it printed: {''.join(lines)[-2000:]!r}")
        lines.append(line)
    return "".join(lines)


def pids_alive(pids) -> list[int]:
    """Those of `pids` still running (a zombie counts as dead)."""
    alive = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as handle:
                if handle.read().rpartition(")")[2].split()[0] != "Z":
                    alive.append(pid)
        except OSError:
            pass
    return alive


@pytest.fixture
def cli(tmp_path):
    """Run `miniswe ARGS` in a real subprocess inside tmp_path; returns CompletedProcess (text)."""

    def invoke(*args: str, env: dict[str, str] | None = None, timeout: float = 60, cwd: Path | None = None):
        return subprocess.run(
            miniswe_cmd(*args), cwd=cwd or tmp_path, env=clean_env(**(env or {})), capture_output=True,
            text=True, timeout=timeout, stdin=subprocess.DEVNULL,
        )

    return invoke
