"""The file tools on the host side: each call becomes one command that runs the stdlib worker
(tools/filetool.py) where commands run, so a container's files are edited inside the container, a local run's
under policy.confine when it is set, and every call is a step with a return code, an output and a duration.

The worker is sent whole in the command (no file to install), with the call's arguments as base64 JSON. A
command is one argument of `bash -c`, which Linux caps at 128 KiB: hence a write of at most 64 KiB per call.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import shlex
import sys
from typing import Any

WRITE_LIMIT = 64 * 1024  # bytes of content (or replacement text) per call
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "filetool.py")


@functools.lru_cache(maxsize=1)
def _worker_source() -> str:
    with open(WORKER, encoding="utf-8") as handle:
        return handle.read()


def too_large(tool: str, arguments: dict[str, Any]) -> str | None:
    """Why the call cannot be sent, if its text is over the per-call limit."""
    for name in ("content", "new", "text", "old"):
        value = arguments.get(name)
        if isinstance(value, str) and len(value.encode("utf-8", "surrogatepass")) > WRITE_LIMIT:
            fix = ("write the first part, then append the rest with mode: append" if tool == "write_file"
                   else "edit a smaller piece at a time, or write the file anew with write_file in parts")
            return f"error: `{name}` is {len(value.encode('utf-8', 'surrogatepass'))} bytes; {tool} takes at most {WRITE_LIMIT} per call: {fix}"
    return None


def worker_command(tool: str, arguments: dict[str, Any], *, max_chars: int, python: str) -> str:
    """The shell command that runs one file tool call with `python` where the environment runs commands."""
    payload = base64.b64encode(json.dumps({"tool": tool, "args": arguments, "max_chars": max_chars},
                                          ensure_ascii=True).encode()).decode()
    return f"{python} -I -S -c {shlex.quote(_worker_source())} {payload}"


def read_limit(config: Any) -> int:
    """read_file's ceiling (and default) of characters: what the model is shown of an output at most."""
    return config.agent.output_limit or config.environment.capture_limit or 1 << 30


def python_for(environment_kind: str) -> str:
    """The interpreter that runs the worker: this one on this machine; the image's python3 elsewhere."""
    return shlex.quote(sys.executable) if environment_kind == "local" else "python3"


def explain_failure(output: str, returncode: int | None) -> str:
    """The worker's output, or what went wrong when it could not run at all."""
    if returncode in (126, 127) and "error:" not in output:
        return (f"error: the file tools could not start python3 where commands run (return code {returncode}): "
                f"{output.strip()[:200]}; use bash instead")
    return output
