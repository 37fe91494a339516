"""The Ray executor: each task of a batch runs as one Ray task on some node of a cluster, while this process
(the driver) keeps the scheduler, the ledger and the run directory, exactly as with threads.

How the batch's shared state crosses processes and nodes:
- events (task started, step finished) go from the worker to the hub actor as they happen, and the driver
  takes them from the hub every poll (ray_hub.py); the finished record comes back as the Ray task's result;
- the stop: the driver pushes its Stop to the hub; a thread in each worker process follows the hub (a
  long poll) and mirrors it into a local Stop, whose cancellers kill the running command;
- call gates: a 429's pause goes to the hub and from there to every worker process the same way, within
  milliseconds; with --max-concurrent-calls, a task asks the hub for a slot before every model call;
- budgets are counted here, from the step events, as with threads;
- trajectories: written on the worker's node, copied to the hub while the task runs and returned with the
  record; this process writes them into the run directory.

A task whose worker or node dies comes back as a Ray error: it is recorded as a SandboxError (an
infrastructure failure, so a resumed batch runs it again) from the latest copy of its trajectory.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

from miniswe import __version__
from miniswe.batch.ledger import LedgerRecord
from miniswe.batch.plan import Plan
from miniswe.batch.ray_cluster import RayCluster
from miniswe.batch.ray_hub import Hub
from miniswe.batch.ray_worker import Job, NodeImages, images_actor, run_remote
from miniswe.batch.scheduler import Shared
from miniswe.batch.worker import Event, TaskFinished, unfinished_record
from miniswe.environments.images import combined
from miniswe.errors import SandboxError
from miniswe.status import ExitStatus, Outcome
from miniswe.trajectory import store_copy

CANCEL_GRACE_S = 2.0  # at close, how long cancelled tasks get to record themselves and remove their containers
# Ray's own resource names; anything else in --ray-resources is a custom resource
RAY_NAMED = {"CPU": "num_cpus", "GPU": "num_gpus", "memory": "memory"}


class RayExecutor:
    def __init__(self, cluster: RayCluster, workers: int, plans: list[Plan], *, images: Any = None,
                 image_ledger: str = ""):
        self.capacity = max(1, workers)
        self._image_policy, self._image_ledger = images, image_ledger  # an ImagePolicy: each node's pools
        self._node_images: list[Any] = []
        self.images_summary: dict[str, Any] | None = None  # what every node's pools did, once closed
        self.cluster = cluster
        self.ray = cluster.ray
        self._env = {**cluster.worker_env, **handed_variables(plans)}
        self._running: dict[Any, tuple[Plan, int]] = {}  # by the Ray task's result ref
        self._pushed: tuple[Outcome | None, bool] = (None, False)
        self._hub: Any = None
        self._shared: Shared | None = None

    def start(self, shared: Shared) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        ray = self.ray
        self._shared = shared
        here = ray.get_runtime_context().get_node_id()
        # beside the driver: it lives and dies with this batch. An asyncio actor: each busy worker process keeps
        # one watch waiting in it.
        self._hub = ray.remote(Hub).options(
            num_cpus=0, max_concurrency=2 * self.capacity + 100,
            scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False),
        ).remote(shared.gates.max_concurrent)
        token = uuid.uuid4().hex[:12]
        if self._image_policy is not None:
            # one per node, pinned there and living with this batch: that node's tasks pull through it
            for node in self.cluster.nodes:
                self._node_images.append(ray.remote(NodeImages).options(
                    name=images_actor(token, node["NodeID"]), num_cpus=0, max_concurrency=1000,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False),
                ).remote(self._image_policy, self._image_ledger))
        self._job = ray.put(Job(__version__, self._env, token, capped=shared.gates.max_concurrent > 0,
                                images=bool(self._node_images)))
        options = {RAY_NAMED[name]: amount for name, amount in self.cluster.resources.items() if name in RAY_NAMED}
        options.setdefault("num_cpus", 0)
        custom = {name: amount for name, amount in self.cluster.resources.items() if name not in RAY_NAMED}
        # no retries: a task lost with its node is recorded, and a resumed batch reruns it
        self._remote = ray.remote(run_remote).options(
            resources=custom or None, max_retries=0, retry_exceptions=False, scheduling_strategy="SPREAD", **options,
        )

    def submit(self, plan: Plan, attempt: int) -> None:
        # a resumed task goes on from its recorded trajectory, which the node may not reach: it travels along
        recorded = _read_file(plan.trajectory) if plan.resume else None
        ref = self._remote.remote(plan, attempt, self._hub, self._job, recorded)
        self._running[ref] = (plan, attempt)

    def events(self, timeout: float) -> list[Event]:
        ray = self.ray
        self._push_stop()
        refs = list(self._running)
        ready: list[Any] = []
        if refs:
            ready, _ = ray.wait(refs, num_returns=1, timeout=timeout, fetch_local=False)
            if ready and len(refs) > 1:
                ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
        # taken after the finished ones were seen: a worker's reports reach the hub before its result is ready
        try:
            reported, copies = ray.get(self._hub.take.remote())
        except ray.exceptions.RayActorError as error:
            raise SandboxError(f"the batch's hub actor died ({error}); rerun the batch to continue") from None
        attempts = {plan.id: (plan, attempt) for plan, attempt in self._running.values()}
        for task_id, (attempt, data) in copies.items():
            if task_id in attempts and attempts[task_id][1] == attempt:  # a late copy of a finished task is stale
                store_copy(attempts[task_id][0].trajectory, data)
        return [*reported, *(TaskFinished(self._finish(ref)) for ref in ready)]

    def close(self) -> None:
        ray = self.ray
        if self._running and ray.is_initialized():
            refs = list(self._running)
            for ref in refs:  # KeyboardInterrupt in each task: it records itself and removes its container
                _quietly(ray.cancel, ref)
            _, left = ray.wait(refs, num_returns=len(refs), timeout=CANCEL_GRACE_S, fetch_local=False)
            for ref in left:
                _quietly(ray.cancel, ref, force=True)
            self._running.clear()
        if self._hub is not None and ray.is_initialized():
            _quietly(ray.kill, self._hub)
            self._hub = None
        if self._node_images and ray.is_initialized():
            try:  # each node removes what it pulled (with a budget) and says what it did
                summaries = ray.get([actor.close.remote() for actor in self._node_images], timeout=120)
            except Exception:  # noqa: BLE001 - a node gone with its images: its numbers are lost, not the batch
                summaries = []
            self.images_summary = combined(summaries)
            for actor in self._node_images:
                _quietly(ray.kill, actor)
            self._node_images = []

    def _push_stop(self) -> None:
        stop = self._shared.stop
        state = (stop.outcome, stop.urgent)
        if stop.outcome is not None and state != self._pushed:
            self._hub.set_stop.remote(stop.outcome, stop.urgent)
            self._pushed = state

    def _finish(self, ref: Any) -> LedgerRecord:
        ray = self.ray
        plan, attempt = self._running.pop(ref)
        try:
            result = ray.get(ref)
        except ray.exceptions.TaskCancelledError:
            return unfinished_record(plan, attempt, self._shared.stop.outcome or Outcome(ExitStatus.INTERRUPTED, "cancelled"))
        except ray.exceptions.RayTaskError as error:  # raised by miniswe on the node, e.g. another version there
            cause = getattr(error, "cause", None) or error
            return unfinished_record(plan, attempt, Outcome(ExitStatus.ERROR, f"the task failed on its Ray node: {cause}"))
        except ray.exceptions.RayError as error:  # its worker process or its whole node died
            self._hub.forget.remote(plan.id)
            why = (str(error).strip().splitlines() or [type(error).__name__])[0]
            return unfinished_record(plan, attempt, Outcome(
                ExitStatus.SANDBOX_ERROR, f"lost with its Ray worker or node ({type(error).__name__}: {why}); "
                                          "rerun the batch to run it again"))
        if result.trajectory is not None:
            store_copy(plan.trajectory, result.trajectory)
        return result.record


def handed_variables(plans: list[Plan]) -> dict[str, str]:
    """The variables miniswe reads by name on the worker side (the model's key, docker's forward_env), with this
    process's values: they travel with the tasks, not through Ray's job config."""
    names: set[str] = set()
    for plan in plans:
        names.add(getattr(plan.config.model, "api_key_env", "") or "")
        names.update(getattr(plan.config.environment, "forward_env", None) or ())
    return {name: os.environ[name] for name in sorted(names) if name and name in os.environ}


def _quietly(call, *args, **kwargs) -> None:
    try:
        call(*args, **kwargs)
    except Exception:
        pass


def _read_file(path: str) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return None
