"""A task of a batch as a Ray worker process runs it: `run_remote` is the remote function the Ray executor
submits, once per task.

Each worker process keeps one WorkerSide per batch: a local Stop and local call gates that a thread keeps in
step with the hub's (a long poll: a stop or a 429's pause reaches every process within milliseconds, and an
urgent stop reaches this process's cancellers: the running command, the model call in flight), and
renderers built here from the templates dir (a Renderer does not travel). Events go to the hub without
waiting; a task's result is returned once the hub has all its events. The trajectory is
written on this node, under a scratch folder, and copied to the hub while the task runs (within COPY_POLL_S
of each change, such as a completed step, but no sooner than COPY_S after the last copy, longer for a large
file) and returned whole with the record at the end; the driver writes it into the run directory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from miniswe import __version__
from miniswe.batch.ledger import LedgerRecord
from miniswe.batch.plan import Plan
from miniswe.batch.ray_hub import NO_SLOT
from miniswe.batch.worker import Event, TaskStarted, WorkerServices, run_plan
from miniswe.config import override
from miniswe.environments.processes import process_start, running
from miniswe.models.gate import CallGate, still_queued, wait_out_pause
from miniswe.signals import Stop
from miniswe.status import ExitStatus, Outcome
from miniswe.templates import Renderer

WATCH_S = 0.5  # the longest a busy worker process's watch on the hub waits (it answers at once on a change)
COPY_S = 0.5  # at most this often, a running task's trajectory is copied to the driver...
COPY_BYTES_S = 1_000_000  # ...and at most this many bytes a second of it (a large trajectory goes less often)
COPY_POLL_S = 0.1  # how often a busy worker process looks for a changed trajectory
OWNERLESS_S = 300.0  # a task's scratch folder with no owner this long after it was made is a leftover
SLOT_POLL_S = 0.25  # a caller waiting for a free model-call slot asks again this often
SETTLE_S = 30.0  # the longest a finished task waits for the hub to have all its events
SCRATCH_PREFIX = "miniswe-tasks-"  # $TMPDIR/miniswe-tasks-<batch>/<task id>/: a running task's files on its node
OWNER = ".owner"  # in a task's scratch folder: "PID STARTTIME" of the worker process


@dataclass(frozen=True)
class Job:
    """What every task of one batch gets besides its plan: set once, shared by reference."""

    version: str  # the driver's miniswe version: every node must run the same
    env: dict[str, str]  # variables the driver hands to the workers (keys named by the config; HOME for a private cluster)
    token: str  # names this batch's scratch folders
    capped: bool = False  # --max-concurrent-calls: a model call holds one of the hub's slots
    images: bool = False  # each node's image pools are an actor of the executor's (NodeImages): tasks pull through it


@dataclass(frozen=True)
class Result:
    record: LedgerRecord
    trajectory: bytes | None  # the finished trajectory file, for the driver to write into the run directory


_sides: dict[str, WorkerSide] = {}
_sides_lock = threading.Lock()


def run_remote(plan: Plan, attempt: int, hub: Any, job: Job, recorded: bytes | None = None) -> Result:
    """Run one plan on this node; the Ray executor's remote function."""
    if job.version != __version__:
        raise RuntimeError(f"this node runs miniswe {__version__}, the driver {job.version}: install the same version on every node")
    with _sides_lock:
        side = _sides.get(job.token)
        if side is None:
            side = _sides[job.token] = WorkerSide(hub, job)
    return side.run(plan, attempt, recorded)


class WorkerSide:
    def __init__(self, hub: Any, job: Job):
        import ray

        self.ray = ray
        self.hub = hub
        self.capped = job.capped
        self.node = ray.get_runtime_context().get_node_id()
        os.environ.update(job.env)
        _sweep_scratch()
        self.scratch = os.path.join(tempfile.gettempdir(), f"{SCRATCH_PREFIX}{job.token}")
        self.stop = Stop()
        self.renderers: dict[str, Renderer] = {}
        self.gates: dict[str, GateProxy] = {}
        self.lock = threading.Lock()
        self.current: _Running | None = None
        self.busy = threading.Event()
        self.images = node_images(ray, job.token, self.node) if job.images else None
        threading.Thread(target=self._follow, name="miniswe-hub-watch", daemon=True).start()

    def run(self, plan: Plan, attempt: int, recorded: bytes | None = None) -> Result:
        _claim(os.path.join(self.scratch, plan.id))
        local = localize(plan, os.path.join(self.scratch, plan.id), self.node)
        if local.resume and recorded is not None:
            with open(local.trajectory, "wb") as handle:
                handle.write(recorded)
        elif local.resume:
            local = dataclasses.replace(local, resume=False)
        with self.lock:
            self.current = _Running(plan.id, attempt, local.trajectory)
        self.busy.set()
        sent = 0

        def emit(event: Event) -> None:
            nonlocal sent
            sent += 1
            call = self.hub.report.remote([event], None, plan.id)
            if isinstance(event, TaskStarted):  # ahead of the steps' events, which go without waiting
                self.ray.get(call)

        try:
            services = WorkerServices(stop=self.stop, gate_for=lambda url: self._gate(url, plan.id),
                                      renderer_for=self._renderer, emit=emit, images=self.images)
            record = run_plan(local, attempt, services)
            with self.lock:
                self.current = None  # no copy of it is sent after this
            # the result must not overtake the task's events: the driver counts its budgets from them
            self.ray.get(self.hub.settle.remote(plan.id, sent, SETTLE_S))
            return Result(record, _read(local.trajectory))
        finally:
            self.busy.clear()
            with self.lock:
                self.current = None
            folder = os.path.dirname(local.trajectory)
            shutil.rmtree(folder, ignore_errors=True)
            with contextlib.suppress(OSError):
                os.rmdir(os.path.dirname(folder))  # the batch's scratch folder, once no task of it runs here

    def _follow(self) -> None:
        """While a task runs here: take the hub's stop and pauses as they change, and send trajectory copies."""
        seen = -1
        while True:
            self.busy.wait()
            call = self.hub.watch.remote(seen, WATCH_S)
            try:
                while not self.ray.wait([call], timeout=COPY_POLL_S)[0]:
                    self._send_copy()
                seen, outcome, urgent, pauses = self.ray.get(call)
            except self.ray.exceptions.RayActorError:  # the hub is gone with its driver: nobody takes results now
                self.stop.request(Outcome(ExitStatus.INTERRUPTED, "the batch's driver is gone"), urgent=True)
                time.sleep(1.0)
                continue
            if outcome is not None:
                self.stop.request(outcome, urgent=urgent)
            for url, seconds in pauses.items():
                self._gate(url, "").local.pause(seconds)
            self._send_copy()

    def _send_copy(self) -> None:
        with self.lock:
            copies = self.current.copy_due() if self.current else {}
        if copies:
            self.hub.report.remote([], copies)

    def _gate(self, url: str, task_id: str) -> GateProxy:
        gate = self.gates.get(url)
        if gate is None:
            gate = self.gates.setdefault(url, GateProxy(self.ray, self.hub, url, self.capped))
        if task_id:
            gate.holder = task_id
        return gate

    def _renderer(self, templates_dir: str) -> Renderer:
        renderer = self.renderers.get(templates_dir)
        if renderer is None:
            renderer = self.renderers[templates_dir] = Renderer(templates_dir)
        return renderer


@dataclass
class _Running:
    task_id: str
    attempt: int
    trajectory: str
    sent_at: float = 0.0
    sent_mtime: int = 0
    gap: float = COPY_S  # the least time between two copies

    def copy_due(self) -> dict[str, tuple[int, bytes]]:
        """The trajectory's current bytes when it changed and the last copy is old enough (the first at once)."""
        if self.sent_at and time.monotonic() - self.sent_at < self.gap:
            return {}
        try:
            info = os.stat(self.trajectory)
        except OSError:
            return {}
        mtime = info.st_mtime_ns
        if mtime == self.sent_mtime:
            return {}
        self.gap = max(COPY_S, info.st_size / COPY_BYTES_S)
        data = _read(self.trajectory)
        if data is None:
            return {}
        self.sent_at, self.sent_mtime = time.monotonic(), mtime
        return {self.task_id: (self.attempt, data)}


class GateProxy:
    """The endpoint's gate with CallGate's interface, across the cluster: a pause is kept in a local CallGate,
    told to the hub at once and learnt from it (WorkerSide._follow); a cap on calls in flight is the hub's."""

    def __init__(self, ray: Any, hub: Any, url: str, capped: bool):
        self.ray, self.hub, self.url, self.capped = ray, hub, url, capped
        self.local = CallGate()
        self.holder = ""

    def pause(self, seconds: float) -> None:
        self.local.pause(seconds)
        self.hub.pause.remote(self.url, seconds)

    @contextlib.contextmanager
    def slot(self, stop: Stop, deadline: float | None = None) -> Iterator[None]:
        with self.local.slot(stop, deadline):
            if not self.capped:
                yield
                return
            holder = self.holder
            while (wait := self.ray.get(self.hub.enter.remote(self.url, holder))) != 0:
                if wait == NO_SLOT:
                    stop.wait(SLOT_POLL_S)
                    still_queued(stop, deadline)
                else:
                    wait_out_pause(wait, stop, deadline)
            try:
                yield
            finally:
                self.hub.leave.remote(self.url, holder)


# -- each node's images ------------------------------------------------------------------------------------------
def images_actor(token: str, node: str) -> str:
    return f"miniswe-images-{token}-{node}"


class NodeImages:
    """The image pools of one node of a batch: an actor the executor pins to that node, so every task there pulls
    through one place. The node pulls each image once, backs off from a registry once, keeps the images it pulled
    within the budget (its own disk) and keeps its own ledger: the run directory's images.jsonl where the node
    reaches it (lines name their host), else one of its own. Tasks are not pulled ahead here: which node runs which
    task is Ray's choice, made as each starts."""

    def __init__(self, policy: Any, ledger: str):
        from miniswe.environments.images import BatchImages
        from miniswe.resources import cache_dir

        if not os.path.isdir(os.path.dirname(ledger)):
            digest = hashlib.sha256(ledger.encode()).hexdigest()[:12]
            ledger = cache_dir(f"images-{digest}.jsonl")
            os.makedirs(os.path.dirname(ledger), exist_ok=True)
        self.pools = BatchImages(policy, ledger_path=ledger)
        self.stops: dict[str, Stop] = {}

    def acquire(self, key: str, need: Any) -> tuple[str, Any]:
        """("ok", the wait), ("pull_error", (message, kind)) or ("cancelled", message): errors cross as values."""
        from miniswe.errors import Cancelled, PullError

        stop = self.stops[key] = Stop()
        try:
            return "ok", self.pools.acquire(need, stop)
        except PullError as error:
            return "pull_error", (str(error), error.kind)
        except Cancelled as error:
            return "cancelled", str(error)
        finally:
            self.stops.pop(key, None)

    def cancel(self, key: str) -> None:
        stop = self.stops.get(key)
        if stop is not None:
            stop.request(Outcome(ExitStatus.INTERRUPTED, "stopped while waiting for its image"))

    def release(self, need: Any) -> None:
        self.pools.release(need)

    def close(self) -> dict[str, Any] | None:
        return self.pools.close()


class NodeImagesClient:
    """A worker process's side of its node's NodeImages, with BatchImages' acquire and release."""

    def __init__(self, ray: Any, actor: Any):
        self.ray, self.actor = ray, actor

    def acquire(self, need: Any, stop: Stop, on_wait: Any = None) -> dict[str, Any] | None:
        from miniswe.errors import Cancelled, PullError

        key = uuid.uuid4().hex
        call = self.actor.acquire.remote(key, need)
        told = cancelled = False
        while not self.ray.wait([call], timeout=SLOT_POLL_S)[0]:
            if not told and on_wait is not None:
                told = True
                on_wait()
            if stop.outcome is not None and not cancelled:
                cancelled = True
                self.actor.cancel.remote(key)
        kind, value = self.ray.get(call)
        if kind == "pull_error":
            raise PullError(*value)
        if kind == "cancelled":
            raise Cancelled(value)
        return value

    def release(self, need: Any) -> None:
        self.actor.release.remote(need)


def node_images(ray: Any, token: str, node: str) -> NodeImagesClient | None:
    """This node's image pools; None when the executor made none here (a node that joined later): its tasks pull
    for themselves."""
    try:
        return NodeImagesClient(ray, ray.get_actor(images_actor(token, node)))
    except ValueError:
        return None


def localize(plan: Plan, folder: str, node: str) -> Plan:
    """The plan with its trajectory in a scratch folder of this node (the driver writes the run directory's copy),
    and its default workspace there too unless the run directory is reachable from here (the driver's
    machine, a shared file system), where it stays as with threads."""
    trajectory = os.path.join(folder, os.path.basename(plan.trajectory))
    task = dataclasses.replace(plan.task, metadata={**plan.task.metadata, "ray_node": node})
    if not plan.workspace or os.path.isdir(os.path.dirname(os.path.dirname(plan.workspace))):
        return dataclasses.replace(plan, task=task, trajectory=trajectory)
    workspace = os.path.join(folder, "workspace")
    config = override(plan.config, environment={"cwd": workspace})
    # the recorded run's working directory is not reachable from this node: its state is gone, so start over
    return dataclasses.replace(plan, task=task, config=config, trajectory=trajectory, workspace=workspace, resume=False)


def _claim(folder: str) -> None:
    """Make a task's scratch folder, marked as this process's (another process's sweep may remove an empty parent)."""
    for _ in range(3):
        try:
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, OWNER), "w") as handle:
                handle.write(f"{os.getpid()} {process_start(os.getpid()) or ''}".strip())
            return
        except FileNotFoundError:
            continue


def _sweep_scratch() -> None:
    """Remove the scratch folders of tasks whose worker process is gone (killed with its node or its driver)."""
    base = tempfile.gettempdir()
    with contextlib.suppress(OSError):
        for name in os.listdir(base):
            root = os.path.join(base, name)
            if not name.startswith(SCRATCH_PREFIX) or os.stat(root).st_uid != os.getuid():
                continue
            for folder in os.listdir(root):
                path = os.path.join(root, folder)
                try:
                    with open(os.path.join(path, OWNER)) as handle:
                        pid, _, start = handle.read().strip().partition(" ")
                    gone = not running(int(pid), start)
                except (FileNotFoundError, ValueError):  # no owner (yet): a leftover once old enough
                    gone = _age(path) > OWNERLESS_S
                except OSError:
                    continue
                if gone:
                    shutil.rmtree(path, ignore_errors=True)
            with contextlib.suppress(OSError):
                os.rmdir(root)  # only when empty


def _age(folder: str) -> float:
    """Seconds since the folder or its owner file last changed (0 when unknown)."""
    times = []
    for path in (folder, os.path.join(folder, OWNER)):
        with contextlib.suppress(OSError):
            times.append(os.stat(path).st_mtime)
    return time.time() - max(times) if times else 0.0


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return None
