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
import select
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

from miniswe.environments.processes import process_start, running
from miniswe.errors import SandboxError, UsageError

INSTALL = "pip install -e '.[ray]' in the miniswe checkout"
DEFAULT_RESOURCES = {"CPU": 1.0}
TEMP_PREFIX = "miniswe-ray-"
CONNECT_TIMEOUT_S = 10.0
# A private cluster's temp dir holds files that say whose it is, readable from any user namespace (each
# `unshare -r` makes one, and /proc/PID/fd cannot be read across them, while /proc/PID/stat can):
OWNER = "owner"  # "PID STARTTIME" of the driver
WATCHDOG = "watchdog"  # "PID STARTTIME" of the watchdog (see _watch)
MEMBERS = "members"  # "scanned TICKS", then "PID STARTTIME" of each process of the cluster the watchdog has seen
SCAN_S = 1.0  # how often the watchdog notes the cluster's processes
CLOSE_GRACE_S = 1.0  # at close, how long what outlived ray.shutdown gets after SIGTERM
STALE_GRACE_S = 2.0  # the same for what a killed driver left
# What a private cluster's processes run with; docs/batch-and-ray.md lists the same.
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
        self._watchdog: subprocess.Popen | None = None
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
        with open(os.path.join(self.temp_dir, OWNER), "w") as handle:
            handle.write(f"{os.getpid()} {_start_time(os.getpid())}")
        self._watchdog = _start_watchdog(self.temp_dir)
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
            # what outlived ray.shutdown is killed; the dir goes once nothing of the cluster is left
            _clear(self.temp_dir, CLOSE_GRACE_S, careful=False)
            self.temp_dir = None
        if self._watchdog is not None:  # it sees its pipe closed and the dir gone, and exits
            with contextlib.suppress(Exception):
                self._watchdog.stdin.close()
                self._watchdog.wait(timeout=5)
            self._watchdog = None


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




# -- a private cluster's processes, found and killed whatever happened to its driver -------------------------------
#
# Killed with SIGKILL, a driver takes Ray's core processes with it (Ray starts them with PR_SET_PDEATHSIG), but
# not the raylet's agents (ray::DashboardAgent, ray::RuntimeEnvAgent), which ignore SIGTERM and, retitled,
# name nothing in their command line. So a watchdog beside the driver (its own session, reading a pipe the
# driver holds) notes every process below the driver, with its start time, into the temp dir; once the pipe
# closes with the dir still there (the driver died), it kills them all and removes the dir. Should the watchdog
# die too, the next private cluster's start (_sweep_stale, maybe in another user namespace) does the same from
# the notes; it removes the dir only once nothing that may be the cluster's is left.

def _start_watchdog(temp_dir: str) -> subprocess.Popen | None:
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
    try:
        proc = subprocess.Popen([sys.executable, "-c", "from miniswe.batch.ray_cluster import _watch; _watch()",
                                 temp_dir, str(os.getpid())], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    except OSError:
        return None  # _sweep_stale still clears up after a killed driver, by the driver's descendants it can see
    with open(os.path.join(temp_dir, WATCHDOG), "w") as handle:
        handle.write(f"{proc.pid} {_start_time(proc.pid)}")
    return proc


def _watch() -> None:
    """The watchdog's process: `python -c ... TEMP_DIR DRIVER_PID`, stdin a pipe from the driver."""
    temp_dir, driver = sys.argv[1], int(sys.argv[2])
    for name in ("SIGINT", "SIGHUP", "SIGTERM"):  # a Ctrl-C, a closed terminal: the driver's to handle
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    members: dict[int, int] = {}
    while True:
        ready, _, _ = select.select([0], [], [], SCAN_S)
        if ready and not os.read(0, 4096):
            break  # the driver is gone, or done
        if not os.path.isdir(temp_dir):
            return
        members = {pid: start for pid, start in members.items() if _start_time(pid) == start}
        members.update((pid, start) for pid in _descendants(driver) if pid != os.getpid() and (start := _start_time(pid)))
        _note_members(temp_dir, members)
    if os.path.isdir(temp_dir):
        members.update((pid, start) for pid in _descendants(driver) if pid != os.getpid() and (start := _start_time(pid)))
        _note_members(temp_dir, members)
        _clear(temp_dir, STALE_GRACE_S, careful=False)


def _note_members(temp_dir: str, members: dict[int, int]) -> None:
    lines = [f"scanned {_now_ticks()}", *(f"{pid} {start}" for pid, start in members.items())]
    path = os.path.join(temp_dir, MEMBERS)
    with contextlib.suppress(OSError):
        with open(path + ".new", "w") as handle:
            handle.write("\n".join(lines) + "\n")
        os.replace(path + ".new", path)


def _sweep_stale() -> None:
    """Clear what private clusters whose driver was killed (kill -9) left behind: their processes, then their
    temp dir (see above)."""
    base = "/tmp" if os.path.isdir("/tmp") else tempfile.gettempdir()
    with contextlib.suppress(OSError):
        for name in os.listdir(base):
            path = os.path.join(base, name)
            if not name.startswith(TEMP_PREFIX):
                continue
            try:
                if os.stat(path).st_uid != os.getuid():
                    continue
                owner = _read_pid(os.path.join(path, OWNER))
            except (OSError, ValueError):
                continue  # being made, or not a private cluster's
            watchdog = _read_pid(os.path.join(path, WATCHDOG), missing_ok=True)
            if _alive(*owner) or (watchdog and _alive(*watchdog)):
                continue  # running, or its watchdog is clearing it
            _clear(path, STALE_GRACE_S, careful=True)


def _clear(temp_dir: str, grace: float, careful: bool) -> bool:
    """Kill the processes of the private cluster of `temp_dir` (SIGTERM, SIGKILL after `grace`) and remove the dir.
    `careful`: keep the dir (False) while a process that may be the cluster's cannot be told apart (a Ray process
    of ours in another user namespace, started after the cluster's processes were last noted)."""
    for _ in range(3):
        members, unsure = _members_of(temp_dir)
        if not members:
            break
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 2.0)):
            for pid, start in members.items():
                if _start_time(pid) == start:
                    with contextlib.suppress(OSError):
                        os.kill(pid, sig)
            deadline = time.monotonic() + wait
            while (members := {p: s for p, s in members.items() if _start_time(p) == s}) and time.monotonic() < deadline:
                time.sleep(0.05)
            if not members:
                break
    members, unsure = _members_of(temp_dir)
    if members or (careful and unsure):
        return False
    shutil.rmtree(temp_dir, ignore_errors=True)
    return True


def _members_of(temp_dir: str) -> tuple[dict[int, int], bool]:
    """({pid: start time} of the live processes of the cluster, whether some process may be one unseen)."""
    noted: dict[int, int] = {}
    scanned = 0
    with contextlib.suppress(OSError, ValueError):
        with open(os.path.join(temp_dir, MEMBERS)) as handle:
            for line in handle:
                fields = line.split()
                if len(fields) == 2 and fields[0] == "scanned":
                    scanned = int(fields[1])
                elif len(fields) == 2:
                    noted[int(fields[0])] = int(fields[1])
    born = 0  # the driver's start: the cluster's processes are younger
    with contextlib.suppress(OSError, ValueError):
        born = _read_pid(os.path.join(temp_dir, OWNER))[1]
    scanned = scanned or born
    skip = {os.getpid()}  # and the watchdog, which kills what it finds and removes the dir itself
    with contextlib.suppress(OSError, ValueError, TypeError):
        skip.add(_read_pid(os.path.join(temp_dir, WATCHDOG), missing_ok=True)[0])
    marks = ((temp_dir + os.sep).encode(), (temp_dir + "\0").encode())
    found: dict[int, int] = {}
    unsure = False
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in skip:
            continue
        pid = int(entry)
        try:
            if os.stat(f"/proc/{pid}").st_uid != os.getuid():
                continue
            start = _start_time(pid)
            if not start or start < born:
                continue
            if noted.get(pid) == start:
                found[pid] = start
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                cmdline = handle.read()
            if any(mark in cmdline for mark in marks):
                found[pid] = start
                continue
            try:
                fds = os.listdir(f"/proc/{pid}/fd")
            except PermissionError:  # in another user namespace: nothing says whose it is
                unsure = unsure or (cmdline.startswith(b"ray::") and start >= scanned)
                continue
            for fd in fds:
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/fd/{fd}").encode().startswith(marks[0]):
                        found[pid] = start
                        break
        except OSError:
            continue
    return found, unsure


def _descendants(root: int) -> list[int]:
    """The processes below `root` (not itself)."""
    children: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as handle:
                        ppid = int(handle.read().rsplit(")", 1)[1].split()[1])
                except (OSError, ValueError, IndexError):
                    continue
                children.setdefault(ppid, []).append(int(entry))
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def _start_time(pid: int) -> int:
    """The process's start time (clock ticks since boot; 0 when it is gone): with its pid, it names one process.
    /proc/PID/stat is readable from any user namespace. A zombie is gone: where PID 1 is slow to reap (or never
    reaps, as in some containers), a killed driver's watchdog would otherwise look alive and clearing forever."""
    return int(process_start(pid) or 0)


def _now_ticks() -> int:
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))


def _alive(pid: int, start: int) -> bool:
    return running(pid, str(start) if start else "")


def _read_pid(path: str, missing_ok: bool = False) -> tuple[int, int] | None:
    """(pid, start time) from an OWNER or WATCHDOG file (an older miniswe wrote the pid alone: start time 0)."""
    try:
        with open(path) as handle:
            fields = handle.read().split()
    except FileNotFoundError:
        if missing_ok:
            return None
        raise
    return int(fields[0]), int(fields[1]) if len(fields) > 1 else 0
