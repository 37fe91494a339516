"""Reaching the Ray cluster of `miniswe batch --executor ray`: the user's (`--ray-address`), or a private one
that miniswe starts on this machine and removes at the end.

A private cluster stays on this machine: its servers bind 127.0.0.1 only (Ray's single-machine mode), usage statistics are off and
their report URL points at a closed loopback port, its processes get a HOME of their own (holding a stub
`ray_bootstrap_config.yaml`, without which Ray's dashboard process probes cloud metadata addresses, and
keeping `~/.ray` untouched), a token guards it, and everything lives in a temp dir removed afterwards.
Tasks get the user's HOME back (see ray_worker.Job.env).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import math
import os
import secrets
import shutil
import signal
import socket
import sys
import tempfile
from typing import Any

from miniswe.errors import SandboxError, UsageError

INSTALL = "pip install 'miniswe[ray]'"
DEFAULT_RESOURCES = {"CPU": 1.0}
TEMP_PREFIX = "miniswe-ray-"
CONNECT_TIMEOUT_S = 10.0
# What a private cluster's processes run with; the README's "Batches on a Ray cluster" lists the same.
PRIVATE_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_USAGE_STATS_PROMPT_ENABLED": "0",
    "RAY_USAGE_STATS_REPORT_URL": "http://127.0.0.1:9/",  # nowhere: a closed port on loopback
    "RAY_enable_metrics_collection": "0",
    "RAY_DISABLE_DOCKER_CPU_WARNING": "1",
    "RAY_AUTH_MODE": "token",
    # Ray's single-machine mode (its default on macOS): the node's address is 127.0.0.1 and every server binds it.
    # Without it, a machine with any non-loopback interface gets servers on all interfaces, even with
    # _node_ip_address="127.0.0.1", which ray.init replaces with a "remotely reachable" address.
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
}


def require_ray() -> None:
    """Fail at once, naming the install command, when Ray is missing (without importing it)."""
    if importlib.util.find_spec("ray") is None:
        raise UsageError(f"--executor ray needs Ray, which is not installed here: {INSTALL}")


def parse_resources(spec: str | None) -> dict[str, float]:
    """`docker=1,CPU=0.5` → what each task asks of a node; default one CPU."""
    if not spec:
        return dict(DEFAULT_RESOURCES)
    resources: dict[str, float] = {}
    for item in spec.split(","):
        name, sep, amount = item.strip().partition("=")
        try:
            value = float(amount)
        except ValueError:
            value = math.nan
        if not sep or not name.strip() or not value >= 0 or math.isinf(value):
            raise UsageError(f"--ray-resources {spec!r}: expected NAME=AMOUNT[,NAME=AMOUNT...], e.g. docker=1 or CPU=0.5,docker=1")
        resources[name.strip()] = value
    return resources


class RayCluster:
    """A connection to a Ray cluster for one batch; `close` disconnects (and removes a private cluster)."""

    def __init__(self, address: str | None, resources: dict[str, float], workers: int):
        self.ray: Any = None
        self.address = address
        self.resources = resources
        self.temp_dir: str | None = None
        self.worker_env: dict[str, str] = {}
        self._saved_env: dict[str, str | None] = {}
        try:
            if address:
                self._connect(address)
            else:
                self._start_private(workers)
            self.nodes = self._check_feasible()
        except BaseException:
            self.close()
            raise

    @property
    def label(self) -> str:
        return f"the Ray cluster at {self.address}" if self.address else "a private Ray cluster on this machine"

    def _connect(self, address: str) -> None:
        _check_reachable(address)
        import ray

        self.ray = ray
        try:
            self.ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
        except Exception as error:
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise SandboxError(f"cannot connect to the Ray cluster at {address}: {reason}; check --ray-address "
                               "(no task was run)") from None

    def _start_private(self, workers: int) -> None:
        _sweep_stale()
        # short: Ray's unix sockets live below it, and a socket path may not exceed 107 bytes
        base = "/tmp" if os.path.isdir("/tmp") else tempfile.gettempdir()
        self.temp_dir = tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=base)
        with open(os.path.join(self.temp_dir, "owner"), "w") as handle:
            handle.write(str(os.getpid()))
        home = os.path.join(self.temp_dir, "home")
        os.makedirs(home)
        with open(os.path.join(home, "ray_bootstrap_config.yaml"), "w") as handle:
            handle.write("provider: {type: local}\n")
        token = os.path.join(self.temp_dir, "auth_token")
        fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, secrets.token_hex(32).encode())
        os.close(fd)
        if os.environ.get("HOME"):
            self.worker_env["HOME"] = os.environ["HOME"]
        self._set_env({**PRIVATE_ENV, "RAY_AUTH_TOKEN_PATH": token, "HOME": home})
        already = "ray" in sys.modules
        import ray

        self.ray = ray
        if already:  # Ray reads these settings when imported: have it read them again
            with contextlib.suppress(Exception):
                ray._raylet.Config.initialize("")
                ray._private.ray_constants.ENABLE_RAY_CLUSTER = False
        # room for every worker's task: the node offers what `workers` tasks ask for
        custom = {name: amount * workers for name, amount in self.resources.items() if name not in ("CPU", "GPU", "memory")}
        cpus = max(os.cpu_count() or 1, math.ceil(self.resources.get("CPU", 0) * workers))
        try:
            self.ray.init(num_cpus=cpus, resources=custom or None, include_dashboard=False, _node_ip_address="127.0.0.1",
                          _temp_dir=self.temp_dir, logging_level=logging.WARNING, log_to_driver=False)
        except Exception as error:
            raise SandboxError(f"cannot start a private Ray cluster: {error}") from None

    def _set_env(self, values: dict[str, str]) -> None:
        for name, value in values.items():
            self._saved_env.setdefault(name, os.environ.get(name))
            os.environ[name] = value

    def _check_feasible(self) -> list[dict[str, Any]]:
        """The live nodes; SandboxError when none could ever run a task (a typo in --ray-resources waits forever otherwise)."""
        nodes = [node for node in self.ray.nodes() if node.get("Alive")]
        if not any(all(node.get("Resources", {}).get(name, 0) >= amount for name, amount in self.resources.items())
                   for node in nodes):
            offered = sorted({name for node in nodes for name in node.get("Resources", {}) if not name.startswith("node:")})
            wanted = ",".join(f"{name}={amount:g}" for name, amount in self.resources.items())
            raise SandboxError(f"no node of {self.label} offers {wanted} (they offer {', '.join(offered) or 'nothing'}); "
                               "start nodes with e.g. `ray start --resources '{\"docker\": 8}'`, or change --ray-resources")
        return nodes

    def close(self) -> None:
        with contextlib.suppress(Exception):
            if self.ray is not None and self.ray.is_initialized():
                self.ray.shutdown()
        for name, value in self._saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._saved_env.clear()
        if self.temp_dir:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            self.temp_dir = None


def _check_reachable(address: str) -> None:
    """A host:port that accepts no connection fails in one line now: Ray would retry for minutes."""
    host, sep, port = address.rpartition(":")
    if "://" in address or not sep or not port.isdigit():
        return  # `auto`, or a Ray Client address: Ray finds or checks it itself
    try:
        socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as error:
        reason = (error.strerror or str(error) or type(error).__name__).lower()
        raise SandboxError(f"cannot connect to the Ray cluster at {address}: {reason}; check --ray-address "
                           "(no task was run)") from None


def _sweep_stale() -> None:
    """Remove what private clusters whose driver was killed (kill -9) left behind: their temp dir, and the Ray
    processes that outlive the driver (the raylet's agents), found by the files they hold open in it."""
    base = "/tmp" if os.path.isdir("/tmp") else tempfile.gettempdir()
    with contextlib.suppress(OSError):
        for name in os.listdir(base):
            path = os.path.join(base, name)
            if not name.startswith(TEMP_PREFIX):
                continue
            try:
                with open(os.path.join(path, "owner")) as handle:
                    pid = int(handle.read().strip())
                if os.stat(path).st_uid != os.getuid():
                    continue
            except (OSError, ValueError):
                continue
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                _kill_processes_of(path)
                shutil.rmtree(path, ignore_errors=True)
            except OSError:
                pass  # alive, someone else's


def _kill_processes_of(temp_dir: str) -> None:
    # a private cluster's processes hold files open below its temp dir (their logs): Ray renames its
    # processes, and overwrites their environment with the new name, so nothing else says whose they are
    prefix = temp_dir + os.sep
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                if os.stat(f"/proc/{entry}").st_uid != os.getuid():
                    continue
                if not any(os.readlink(f"/proc/{entry}/fd/{fd}").startswith(prefix) for fd in os.listdir(f"/proc/{entry}/fd")):
                    continue
                os.kill(int(entry), signal.SIGKILL)
            except OSError:
                pass
