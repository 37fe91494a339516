"""miniswe's containers as the engine sees them: calling the engine with one-line errors, removing containers
for sure, and finding those whose owning miniswe process is gone (`miniswe cleanup`)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from typing import Any

from miniswe.environments.processes import process_start, running
from miniswe.errors import Cancelled, SandboxError
from miniswe.signals import Stop

LABEL = "miniswe"
ENGINE_CALL_S = 30.0


def owner_labels(run_id: str) -> dict[str, str]:
    """Labels naming a container's run and owner, so anyone can tell whether the owner is still alive."""
    return {
        f"{LABEL}.run": run_id,
        f"{LABEL}.host": socket.gethostname(),
        f"{LABEL}.pid": str(os.getpid()),
        f"{LABEL}.pid_start": process_start(os.getpid()) or "",
        f"{LABEL}.pidns": pid_namespace(),
    }


def pid_namespace() -> str:
    """Where a pid means this process: the machine's boot and this PID namespace ("" where unknown). A pid from
    another namespace (a run under `unshare --pid`, in another container sharing the engine) names some other
    process here, so only owners in the same one can be judged alive or dead."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as boot:
            return f"{boot.read().strip()}:{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return ""


def engine_call(exe: str, *args: str, timeout: float = ENGINE_CALL_S, stop: Stop | None = None) -> subprocess.CompletedProcess:
    """One engine command, its output as text. SandboxError when it does not finish in time; Cancelled when
    `stop` asks for an urgent stop while it runs (the client is killed: a pull or a start is not waited out)."""
    try:
        proc = subprocess.Popen([exe, *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
    except OSError as error:
        raise SandboxError(f"cannot run {exe}: {error.strerror}") from None
    with stop.cancelling(proc.kill) if stop else contextlib.nullcontext():
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise SandboxError(
                f"`{os.path.basename(exe)} {args[0]}` did not finish within {timeout:g}s; check that the engine is healthy"
            ) from None
    if stop is not None and stop.urgent:
        raise Cancelled(f"`{os.path.basename(exe)} {args[0]}` cancelled")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def engine_problem(tool: str, stderr: str) -> str:
    line = first_line(stderr)
    lowered = stderr.lower()
    if "cannot connect to the docker daemon" in lowered or "cannot connect to podman" in lowered:
        return f"the {tool} engine is not running ({line}); start it (e.g. .ci/docker-engine start, or dockerd)"
    if "permission denied" in lowered and ".sock" in lowered:
        return f"no permission on the {tool} socket ({line}); add your user to the docker group or run as root"
    return line or f"{tool} failed without a message"


def says_no_such_image(stderr: str) -> bool:
    lowered = stderr.lower()
    return "no such image" in lowered or "image not known" in lowered


def first_line(text: str) -> str:
    for line in text.splitlines():
        line = line.strip()
        if line:
            return line.removeprefix("docker: ").removeprefix("Error: ")
    return ""


def remove(exe: str, names: list[str]) -> list[str]:
    """`rm -f`, then wait until the containers are really gone: when `rm -f` races the container's own
    `--rm` it reports "removal already in progress" and returns before the engine has finished."""
    # podman stops with SIGTERM first, and waits 10 s for a main process that ignores it (the executor does)
    now = ["--time", "0"] if "podman" in os.path.basename(exe) else []
    try:
        done = subprocess.run(
            [exe, "rm", "-f", *now, *names], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60
        )
        removed = done.stdout.split()
        pending = [name for name in names if name not in removed]
        deadline = time.monotonic() + 15
        while pending and time.monotonic() < deadline:
            listed = subprocess.run(
                [exe, "inspect", "--format", "{{.Id}}", *pending],
                stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            if not listed.stdout.strip():
                break
            time.sleep(0.1)
    except (OSError, subprocess.SubprocessError):
        return []
    return removed


def find_orphans(executable: str = "docker", all: bool = False) -> list[dict[str, Any]]:
    """miniswe's containers whose owner process is gone (every one with `all`), oldest first.

    Owner alive means: same host label, and a process with that pid whose start time matches `miniswe.pid_start`.
    Containers from another host, or from another PID namespace or boot of this one (`miniswe.pidns`), are only
    listed with `all`, since their owner cannot be checked from here.
    """
    exe = shutil.which(executable)
    if exe is None:
        raise SandboxError(f"{executable}: executable not found on PATH; install it or pass the right executable")
    listed = _listing(exe, "ps", "-a", "-q", "--no-trunc", "--filter", f"label={LABEL}.run")
    ids = listed.stdout.split()
    if not ids:
        return []
    # a container removed between ps and inspect just drops out of the list
    inspected = _listing(exe, "inspect", *ids)
    host, namespace = socket.gethostname(), pid_namespace()
    found = []
    for item in json.loads(inspected.stdout or "[]"):
        labels = item.get("Config", {}).get("Labels") or {}
        owner = {k.removeprefix(f"{LABEL}."): v for k, v in labels.items() if k.startswith(f"{LABEL}.")}
        elsewhere = owner.get("host") != host or owner.get("pidns", namespace) != namespace  # no label: an older miniswe's
        if not all and (elsewhere or _owner_alive(owner.get("pid", ""), owner.get("pid_start", ""))):
            continue
        found.append(
            {
                "id": item["Id"],
                "name": item.get("Name", "").lstrip("/"),
                "run": owner.get("run", ""),
                "host": owner.get("host", ""),
                "pid": owner.get("pid", ""),
                "state": item.get("State", {}).get("Status", ""),
                "created": item.get("Created", ""),
            }
        )
    return sorted(found, key=lambda c: c["created"])


def warn_orphans(executables: list[str]) -> None:
    """One line on stderr when dead runs left containers behind; never a reason to stop this run."""
    found = 0
    for executable in dict.fromkeys(executables):
        try:
            found += len(find_orphans(executable))
        except SandboxError:
            continue
    if found:
        print(f"miniswe: warning: {found} container(s) left by dead miniswe runs; remove them with `miniswe cleanup`",
              file=sys.stderr)


def remove_containers(ids: list[str], executable: str = "docker") -> list[str]:
    """Remove containers by id or name (`rm -f`); returns those removed. Already-gone ones are not an error."""
    exe = shutil.which(executable)
    if exe is None or not ids:
        return []
    if "podman" in os.path.basename(exe):
        # podman records no event for `rm -f`: a kill first tells a live run's miniswe it was killed from outside,
        # not by its own command (see DockerEnvironment._ended)
        subprocess.run([exe, "kill", *ids], stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
    return remove(exe, ids)


def _owner_alive(pid: str, start: str) -> bool:
    return pid.isdigit() and running(int(pid), start)


def _listing(exe: str, *args: str) -> subprocess.CompletedProcess:
    done = engine_call(exe, *args)
    if done.returncode and not done.stdout.strip():
        raise SandboxError(engine_problem(os.path.basename(exe), done.stderr))
    return done
