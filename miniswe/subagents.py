"""Sub-agents: a run hands a self-contained piece of work to a child run, which works in the same place with what
is left of the parent's budget, and whose trajectory is linked from the parent's step and whose usage is
counted in the parent's.

Two ways in, one way to run: with protocol.kind: tools the `subagent` tool runs the child at once, in the
parent's own environment (the parent waits: nothing else runs there meanwhile); with the text protocol, the
model runs `miniswe run --sub "TASK"` in its shell, a thin client that asks the parent over a Unix socket
(`MINISWE_SUBAGENT`, in a private folder) and prints what the parent answers. Either way the child is run by
the parent miniswe process itself (for the socket, on a thread of it), so:

- the model's key never enters a command's environment: the child's model calls are made by this process,
  which has the key, exactly as the parent's are;
- the budget is the parent's to give: a request carries only the task (and, at most, smaller limits), so no
  command can ask for more than is left. The child's limits are what the parent has left of each
  (model calls, tokens, cost, time; a text-protocol child also has the time its command has left);
  a child whose parent has nothing left ends at once as LimitsExceeded;
- depth is the parent's plus one, and a run at agent.max_depth offers no delegation at all.

Children run one at a time. The child's trajectory is written beside the parent's (`X.step3.sub1.traj.json`),
and linked from the parent's step (`children`); its usage is added to the parent's when the step ends.
"""

from __future__ import annotations

import functools
import json
import os
import select
import shlex
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from miniswe.errors import UsageError
from miniswe.signals import Stop
from miniswe.status import ExitStatus, Outcome
from miniswe.usage import Usage

SOCKET_VAR = "MINISWE_SUBAGENT"
DEPTH_VAR = "MINISWE_DEPTH"
LIMIT_KEYS = ("step_limit", "token_limit", "cost_limit", "time_limit")
MARGIN_S = 2.0  # a text-protocol child ends this long before its command's timeout, to answer in time
SETTLE_S = 30.0  # how long a step's end waits for a child whose command was cut short to finish
MESSAGE_LIMIT = 1 << 20


class Delegation:
    """A run's sub-agents: the budget they get, the children of the current step, and (text protocol, local
    environment) the socket its commands ask through."""

    def __init__(self, ctx: Any, *, spawn: Callable[..., Any], serve: bool, folder: str | None = None):
        self.ctx = ctx  # the parent run's context: its config, budget, secrets (a batch's every one), stop
        self.spawn = spawn  # runs a child: runner.run_task, handed down so that this module needs no runner
        self.config = ctx.config
        self.folder = folder  # where children's trajectories go, when not beside the parent's (a chat session's)
        self.depth = ctx.depth
        self.stop = ctx.stop
        self.notify = ctx.notify
        self.agent: Any = None
        self._links: list[dict[str, Any]] = []  # the current step's children
        self._spent = Usage()  # their usage, not yet added to the parent's
        self._step: int | None = None
        self._deadline: float | None = None  # when the current command's timeout ends
        self._lock = threading.Lock()  # one child at a time
        self._server: _Server | None = _Server(self) if serve else None

    def bind(self, agent: Any) -> None:
        """The run's agent: its model, limits, environment and trajectory (a chat session's change as it loads)."""
        self.agent = agent

    def env_vars(self) -> dict[str, str]:
        """What the run's local commands are given to ask for a sub-agent."""
        return {SOCKET_VAR: self._server.path} if self._server else {}

    # -- a step's children ---------------------------------------------------------------------------------
    def begin(self, step: int, timeout: float | None = None) -> None:
        """A step starts (its command may ask for sub-agents until `end`); `timeout`: the command's."""
        self._links, self._spent = [], Usage()
        self._step = step
        self._deadline = time.monotonic() + timeout if timeout else None

    def end(self) -> list[dict[str, Any]]:
        """The step's end: its children (waiting for one still finishing after its command was cut short)."""
        acquired = self._lock.acquire(timeout=SETTLE_S)
        try:
            links, self._links = self._links, []
            self._step = self._deadline = None
            if not acquired:
                self.agent.trajectory.warn("a sub-agent was still running when its command's step ended; "
                                           "its usage is not counted in this run's")
            return links
        finally:
            if acquired:
                self._lock.release()

    # -- running one ---------------------------------------------------------------------------------------
    def run(self, task: str, *, env: Any = None, stop: Stop | None = None, wanted: dict[str, Any] | None = None,
            time_cap: float | None = None) -> dict[str, Any]:
        """Run a child on `task` and return its link (what the parent's step records). `env`: the parent's own
        environment, borrowed (tools); otherwise the child opens its own in the same working directory.
        `wanted`: smaller limits asked for; `time_cap`: seconds the child must end within."""
        from miniswe.config import override
        from miniswe.redaction import masked_config
        from miniswe.trajectory import Trajectory, new_run_id

        with self._lock:
            agent = self.agent
            own_stop = stop is None
            stop = stop or self.stop.linked()
            try:
                limits, short = self._budget(wanted or {}, time_cap)
                step = self._step or len(agent.trajectory.steps) + 1
                parent_path = agent.trajectory.path
                if self.folder:
                    parent_path = os.path.join(self.folder, f"{agent.trajectory.metadata.get('run_id') or 'run'}.traj.json")
                path = _child_path(parent_path, step, len(self._links) + 1)
                run_id = new_run_id()
                cwd = agent.env.describe().get("cwd") or self.config.environment.cwd
                config = override(self.config, agent=limits, environment={"cwd": cwd} if cwd else {})
                metadata = {"depth": self.depth + 1, "parent": {"trajectory": os.path.abspath(agent.trajectory.path),
                                                                "run_id": agent.trajectory.metadata.get("run_id"),
                                                                "step": step}}
                self.notify(f"sub-agent (depth {self.depth + 1}) started: {_first_line(task)} → {path}")
                if short:
                    trajectory = Trajectory(path, task=task, config=masked_config(config.to_dict()),
                                            environment={"kind": config.environment.kind},
                                            metadata={"run_id": run_id, **metadata})
                    trajectory.finish(Outcome(ExitStatus.LIMITS_EXCEEDED, short))
                    trajectory.save()
                else:
                    trajectory = self.spawn(config, task, path, run_id=run_id, metadata=metadata, stop=stop,
                                            renderer=self.ctx.renderer, environment=env, depth=self.depth + 1,
                                            spawn_from=agent.model, notify=self._child_notice,
                                            known_secrets=self.ctx.secrets).trajectory
            finally:
                if own_stop:
                    self.stop.unlink(stop)
            link = {"trajectory": os.path.abspath(path), "run_id": run_id, "depth": self.depth + 1, "task": task,
                    "exit_status": trajectory.exit_status, "exit_detail": trajectory.outcome.detail if trajectory.outcome else None,
                    "steps": len(trajectory.steps), "usage": trajectory.usage.to_dict(),
                    "submission": trajectory.outcome.submission if trajectory.outcome else None}
            self._links.append(link)
            self._spent.add(trajectory.usage)
            self.notify(f"sub-agent (depth {self.depth + 1}) ended: {link['exit_status']} · {link['steps']} steps")
            return link

    def _budget(self, wanted: dict[str, Any], time_cap: float | None) -> tuple[dict[str, Any], str | None]:
        """The child's limits: for each, the least of what the parent has left, what was asked for, and (time)
        `time_cap`; and why the child cannot start at all, if the parent has nothing left of one."""
        used = self.ctx.trajectory.usage.copy()
        used.add(self._spent)
        left = self.ctx.limits.remaining(used)
        if time_cap is not None:
            left["time_limit"] = time_cap if left["time_limit"] is None else min(left["time_limit"], time_cap)
        limits: dict[str, Any] = {}
        for key in LIMIT_KEYS:
            asked = wanted.get(key)
            asked = asked if isinstance(asked, (int, float)) and not isinstance(asked, bool) and asked > 0 else None
            candidates = [value for value in (left[key], asked) if value is not None]
            if not candidates:
                continue
            value = min(candidates)
            if value <= 0 or (key == "time_limit" and value < 1):
                what = {"step_limit": "model calls", "token_limit": "tokens", "cost_limit": "cost",
                        "time_limit": "time"}[key]
                return {}, f"{key}: the parent run has no {what} left for a sub-agent"
            limits[key] = int(value) if key in ("step_limit", "token_limit") else round(float(value), 8 if key == "cost_limit" else 3)
        return limits, None

    def _child_notice(self, message: str) -> None:
        # a grandchild's start and end already say which sub-agent they are
        self.notify(message if message.startswith("sub-agent") else f"sub-agent: {message}")

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None


def summary(link: dict[str, Any]) -> tuple[str, int]:
    """What the parent's model is told of a child, and the return code of its command (0: it submitted)."""
    usage = Usage.from_dict(link.get("usage"))
    head = (f"sub-agent {link['exit_status']} after {usage.model_calls} model calls ({usage.total_tokens:,} tokens, "
            f"${usage.cost:.4f})")
    if link.get("exit_status") != str(ExitStatus.SUBMITTED) and link.get("exit_detail"):
        head += f": {_first_line(link['exit_detail'])}"
    text = f"{head}\ntrajectory: {link['trajectory']}\n"
    if link.get("exit_status") == str(ExitStatus.SUBMITTED):
        text += f"submission:\n{link.get('submission') or ''}"
    return text, 0 if link.get("exit_status") == str(ExitStatus.SUBMITTED) else 1


def _first_line(text: str) -> str:
    lines = (text or "").strip().splitlines()
    return lines[0][:160] if lines else ""


def _child_path(parent: str, step: int, index: int) -> str:
    base = parent
    for suffix in (".traj.json", ".json"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
            break
    while True:
        path = f"{base}.step{step}.sub{index}.traj.json"
        if not os.path.exists(path):
            return path
        index += 1


class _Server:
    """The socket the run's commands ask through (`miniswe run --sub`): one request at a time, on a thread."""

    def __init__(self, delegation: Delegation):
        self.delegation = delegation
        self.folder = tempfile.mkdtemp(prefix="miniswe-sub-")  # 0700: only this user reaches the socket
        self.path = os.path.join(self.folder, "socket")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        self.listener.listen(8)
        self.wake_read, self.wake_write = os.pipe()
        self.thread = threading.Thread(target=self._serve, name="miniswe-subagents", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                ready, _, _ = select.select([self.listener, self.wake_read], [], [])
                if self.wake_read in ready:
                    return
                connection, _ = self.listener.accept()
            except (OSError, ValueError):  # closed under us: the run is over
                return
            with connection:
                try:
                    self._handle(connection)
                except Exception as error:  # a broken request must not end the server, nor the run
                    _send(connection, {"error": f"{type(error).__name__}: {error}"})

    def _handle(self, connection: socket.socket) -> None:
        delegation = self.delegation
        request = _receive(connection)
        if not isinstance(request, dict) or not isinstance(request.get("task"), str) or not request["task"].strip():
            _send(connection, {"error": "the request holds no task"})
            return
        if delegation._step is None:
            _send(connection, {"error": "no command of this run is running: ask from a command the run started"})
            return
        wanted = request.get("limits") if isinstance(request.get("limits"), dict) else {}
        cap = None
        if delegation._deadline is not None:
            cap = delegation._deadline - time.monotonic() - MARGIN_S
        stop = delegation.stop.linked()
        watcher = _Watcher(connection, stop)
        try:
            link = delegation.run(request["task"], stop=stop, wanted=wanted, time_cap=cap)
        finally:
            watcher.close()
            delegation.stop.unlink(stop)
        text, code = summary(link)
        _send(connection, {"output": text, "returncode": code})

    def close(self) -> None:
        try:
            os.write(self.wake_write, b"!")
        except OSError:
            pass
        self.thread.join(timeout=5)
        for fd in (self.wake_read, self.wake_write):
            os.close(fd)
        self.listener.close()
        shutil.rmtree(self.folder, ignore_errors=True)


class _Watcher:
    """Stops a child whose asking command went away (killed at its timeout, or by a stop)."""

    def __init__(self, connection: socket.socket, stop: Stop):
        self.connection, self.stop = connection, stop
        self.wake_read, self.wake_write = os.pipe()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        ready, _, _ = select.select([self.connection, self.wake_read], [], [])
        if self.connection in ready:
            try:
                gone = self.connection.recv(1, socket.MSG_PEEK) == b""
            except OSError:
                gone = True
            if gone:
                from miniswe.status import interrupted

                self.stop.request(interrupted("the command that asked for this sub-agent ended"), urgent=True)

    def close(self) -> None:
        os.write(self.wake_write, b"!")
        self.thread.join(timeout=5)
        os.close(self.wake_read)
        os.close(self.wake_write)


def _send(connection: socket.socket, data: dict[str, Any]) -> None:
    try:
        connection.sendall(json.dumps(data).encode() + b"\n")
    except OSError:
        pass  # the asking command is gone: the child's link is recorded all the same


def _receive(connection: socket.socket, timeout: float | None = 10.0) -> Any:
    connection.settimeout(timeout)
    data = b""
    try:
        while not data.endswith(b"\n") and len(data) < MESSAGE_LIMIT:
            chunk = connection.recv(65536)
            if not chunk:
                break
            data += chunk
    finally:
        connection.settimeout(None)
    try:
        return json.loads(data.decode("utf-8", "replace"))
    except ValueError:
        return None


# -- the client: `miniswe run --sub` --------------------------------------------------------------------------

def request(task: str, limits: dict[str, Any]) -> tuple[str, int]:
    """Ask the run whose command this is for a sub-agent on `task`; what to print and the exit code."""
    path = os.environ.get(SOCKET_VAR)
    if not path:
        depth = os.environ.get(DEPTH_VAR)
        where = (f"this run is at depth {depth}, as deep as agent.max_depth lets sub-agents go" if depth
                 else "this is not a command a miniswe run started")
        raise UsageError(f"--sub: no run to ask for a sub-agent ({where}); do the work yourself")
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(path)
        connection.sendall(json.dumps({"task": task, "limits": limits}).encode() + b"\n")
        answer = _receive(connection, timeout=None)
    except OSError as error:
        raise UsageError(f"--sub: cannot reach the run at {path}: {error.strerror or error}") from None
    finally:
        connection.close()
    if not isinstance(answer, dict):
        raise UsageError("--sub: the run gave no answer (it stopped?)")
    if answer.get("error"):
        raise UsageError(f"--sub: {answer['error']}")
    return str(answer.get("output") or ""), int(answer.get("returncode") or 0)


# -- `miniswe` on the PATH of local commands -----------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def shim_dir() -> str:
    """A private folder holding only a `miniswe` script that runs this miniswe with this interpreter (the
    interpreter's own bin folder would put its python and pip first on the commands' PATH too)."""
    import atexit

    folder = tempfile.mkdtemp(prefix="miniswe-bin-")
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # -I: the commands' PYTHONPATH (a repository's own packages) must not shadow miniswe's; this process's
    # import path is given instead, so the script finds what this miniswe found
    path = [package_parent, *(entry for entry in sys.path if entry and entry != package_parent)]
    code = f"import sys; sys.argv[0] = 'miniswe'; sys.path[:0] = {path!r}; from miniswe.cli import main; main()"
    script = os.path.join(folder, "miniswe")
    with open(script, "w", encoding="utf-8") as handle:
        handle.write(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -I -c {shlex.quote(code)} \"$@\"\n")
    os.chmod(script, 0o755)
    atexit.register(shutil.rmtree, folder, True)
    return folder


def command_env(config: Any, *, depth: int, delegation: Delegation | None, skills_dirs: list[str]) -> dict[str, str]:
    """The variables miniswe adds to its local commands: `miniswe` on PATH when there is something to ask it
    (a sub-agent, a skill), where to ask, and how deep the run is. Nothing when there is neither."""
    added: dict[str, str] = {}
    if delegation is not None:
        added.update(delegation.env_vars())
    if skills_dirs:
        from miniswe.skills import ENV_VAR

        added[ENV_VAR] = os.pathsep.join(skills_dirs)
    if not added and not depth:
        return {}
    added[DEPTH_VAR] = str(depth)
    added["PATH"] = shim_dir()  # put first on the PATH by the environment
    return added
