"""Commands in one Docker (or Podman) container per run.

The container's main process (PID 1) is miniswe's executor (executor.py), run by the image's own python3
and attached to miniswe through one `docker run -i` client: each command is a frame on its stdin, run as
a fresh `bash -c` in its own session, its output streamed back (executor_client.py). Nothing in the container
names a command in its argv, and nothing a command does to processes there can end the executor.
Images without python3 fall back to one `docker exec` per command (docker_exec.py), with a notice.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import resource
import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Literal

from miniswe.config import Count, EnvironmentConfig, Number, Seconds, Strings, Text
from miniswe.environments import CommandResult
from miniswe.environments.containers import (
    engine_call,
    engine_problem,
    first_line,
    owner_labels,
    remove,
    says_no_such_image,
)
from miniswe.environments.docker_exec import KEEPER, ExecPerStep
from miniswe.environments.executor import BOOT, NAME
from miniswe.environments.local import QUIET_ENV
from miniswe.environments.processes import stopped
from miniswe.environments.executor_client import HEARTBEAT_S, Resident, StartFailed
from miniswe.environments.runargs import read_run_args
from miniswe.errors import ConfigError, SandboxError
from miniswe.redaction import mask_run_args
from miniswe.signals import Stop

MEMORY = re.compile(r"^\d+(\.\d+)?[bkmgBKMG]?$")


class DockerConfig(EnvironmentConfig):
    kind: str = "docker"
    image: Text = ""  # image to start
    forward_env: Strings = []  # host variables passed through by name (values never recorded)
    run_args: Strings = []  # extra `docker run` arguments, e.g. [--network, none]
    executable: Text = "docker"  # docker or podman
    pull: Literal["never", "missing", "always"] = "missing"  # never, missing or always
    start_timeout: Seconds = 120.0  # seconds allowed for pulling and starting the container
    container_lifetime: Seconds = 14_400.0  # seconds after which the container removes itself even if miniswe died
    pids_limit: Count = 2048  # processes and threads the container may hold, so a fork bomb stays inside; 0 = the engine's default
    memory: Text = ""  # memory limit, e.g. 4g; past it the kernel kills the largest command; "" = none
    cpus: Number = 0.0  # CPUs the container may use, e.g. 2 or 0.5; 0 = no limit
    allow_unsafe_run_args: bool = False  # allow run_args that reach outside the container (--pid, --network host, --privileged, ...)


# Containers not yet closed, removed at interpreter exit: name -> (executable, creating pid). The pid keeps
# a forked child's exit from removing its parent's containers.
_LIVE: dict[str, tuple[str, int]] = {}
# Images found unable to run the executor, so a batch does not try each time: (executable, image id) -> why.
_NO_EXECUTOR: dict[tuple[str, str], str] = {}


class DockerEnvironment:
    config_class = DockerConfig

    @staticmethod
    def check(config: DockerConfig) -> DockerConfig:
        """Settings problems found without touching the engine (ConfigError); the settings as used."""
        if not config.cwd:
            config = config.model_copy(update={"cwd": "/"})  # the shared config's "" means the image's root here
        if not config.image:
            raise ConfigError("environment.image: no image given; set environment.image or pass --image")
        if config.container_lifetime <= 0:
            raise ConfigError("environment.container_lifetime: must be a positive number of seconds")
        if not config.cwd.startswith("/"):
            raise ConfigError(f"environment.cwd: {config.cwd!r} must be an absolute path inside the container")
        if config.memory and not MEMORY.match(config.memory):
            raise ConfigError(f"environment.memory: {config.memory!r} is not a size; write e.g. 4g or 512m")
        read_run_args(config.run_args, allow_unsafe=config.allow_unsafe_run_args)
        return config

    def __init__(self, config: DockerConfig, *, run_id: str = "", stop: Stop | None = None, **_: Any):
        config = self.check(config)
        self.stop = stop  # an urgent stop cuts a slow pull or start short
        self.config = config
        exe = shutil.which(config.executable)
        if exe is None:
            raise SandboxError(
                f"{config.executable}: executable not found on PATH; install it (e.g. .ci/docker-engine start) "
                "or set environment.executable"
            )
        self.exe = exe
        self.tool = os.path.basename(config.executable)
        self.run_id = run_id or f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
        self.name = "miniswe-" + re.sub(r"[^a-zA-Z0-9_.-]", "-", self.run_id)
        self.container: str | None = self.name  # None once closed
        self.run_args = read_run_args(config.run_args, allow_unsafe=config.allow_unsafe_run_args)
        self.notices: list[str] = []  # one line each, for the user and the trajectory
        if self.run_args.unsafe:
            self.notices.append(f"environment.run_args: running with {' '.join(self.run_args.unsafe)} "
                                "(environment.allow_unsafe_run_args is set)")
        # Every value travels on the executor's (or the exec's) stdin: argv is readable by every local user.
        env = {**QUIET_ENV, **self.run_args.env, **{k: str(v) for k, v in config.env.items()}}
        for name in [*config.forward_env, *self.run_args.forward]:
            if name in os.environ:
                env[name] = os.environ[name]
        self.env = env
        self.mode = ""  # "executor" or "exec" once started
        self._runner: Resident | ExecPerStep | None = None
        self._gone: str | None = None
        self._commands = 0  # commands that ran to an end (a result without a sandbox error)
        self._started = time.monotonic()
        self._started_wall = time.time()
        _LIVE[self.name] = (self.exe, os.getpid())
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _engine(self, *args: str, timeout: float = 30.0) -> subprocess.CompletedProcess:
        return engine_call(self.exe, *args, timeout=timeout, stop=self.stop)

    # -- start ---------------------------------------------------------------------------------------------
    def _start(self) -> None:
        cfg = self.config
        present = self._engine("image", "inspect", "--format", "{{.Id}}", cfg.image)
        if present.returncode and not says_no_such_image(present.stderr):
            raise SandboxError(engine_problem(self.tool, present.stderr))
        if cfg.pull == "always" or (present.returncode and cfg.pull == "missing"):
            pulled = self._engine("pull", cfg.image, timeout=cfg.start_timeout)
            if pulled.returncode:
                raise SandboxError(
                    f"cannot pull image {cfg.image}: {first_line(pulled.stderr)}; build or load it locally "
                    "(docker build / docker load) and set environment.pull: never"
                )
        elif present.returncode:
            raise SandboxError(
                f"image {cfg.image} is not present and environment.pull is 'never'; build or load it "
                "(docker build / docker load) or set environment.pull: missing"
            )
        key = (self.exe, present.stdout.strip() or cfg.image)
        why = _NO_EXECUTOR.get(key)
        if why is None:
            why = self._start_executor()
            if why is None:
                return
            _NO_EXECUTOR[key] = why
        self.notices.append(
            f"image {cfg.image} {why}: each command runs through its own `{self.tool} exec` instead of miniswe's "
            "executor (about 80 ms more per step, and commands can see and signal miniswe's wrapper)"
        )
        self._start_exec(why)

    def _container_args(self) -> list[str]:
        """`run` options every mode shares: name, labels, resource bounds, then the user's run_args."""
        cfg = self.config
        labels = owner_labels(self.run_id)
        limits = ["--pids-limit", str(cfg.pids_limit)] if cfg.pids_limit else []
        limits += ["--memory", cfg.memory] if cfg.memory else []
        limits += ["--cpus", f"{cfg.cpus:g}"] if cfg.cpus else []
        return [
            "--rm", "--pull", "never", "--name", self.name,
            *[a for k, v in labels.items() for a in ("--label", f"{k}={v}")],
            *limits,
        ]  # fmt: skip

    def _start_executor(self) -> str | None:
        """Start the container with the executor as its main process; why it cannot (to fall back), or None."""
        cfg = self.config
        argv = [
            self.exe, "run", "-i", "--sig-proxy=false", "--log-driver", "none", *self._container_args(),
            # the executor's stdout is its stream to miniswe: no log driver copies it
            "--entrypoint", "python3", *self.run_args.args, cfg.image, "-I", "-S", "-c", BOOT,
        ]  # fmt: skip
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True)
        except OSError as error:
            raise SandboxError(f"cannot run {self.exe}: {error.strerror}") from None
        resident = Resident(proc, name=self.name, gone=self._gone_reason, capture_limit=cfg.capture_limit)
        self._runner = resident
        settings = {"env": self.env, "cwd": cfg.cwd, "capture_limit": cfg.capture_limit,
                    "lifetime": cfg.container_lifetime, "heartbeat": HEARTBEAT_S}
        try:
            hello = resident.handshake(settings, timeout=cfg.start_timeout, stop=self.stop)
        except StartFailed as failed:
            resident.close()
            self._runner = None
            return self._refused(failed)
        except BaseException:
            resident.close()
            self._runner = None
            raise
        if not hello.get("bash"):
            raise SandboxError(f"image {cfg.image} has no bash; miniswe runs every command with `bash -c`: use an image with bash")
        if hello.get("cwd"):
            raise SandboxError(
                f"environment.cwd: {cfg.cwd} {hello['cwd']} in image {cfg.image}; create it in the image "
                "or set environment.cwd"
            )
        self.mode = "executor"
        return None

    def _refused(self, failed: StartFailed) -> str:
        """Why the executor did not start, as a fallback reason; SandboxError when the container itself was refused."""
        stderr, code = failed.stderr, failed.returncode
        if "is already in use" in stderr:
            # that container belongs to another run: forget it, so close() does not remove it
            _LIVE.pop(self.name, None)
            self.container = None
            raise SandboxError(
                f"container name {self.name} is already in use: run id {self.run_id!r} is taken; give each "
                "run its own run id, or remove the old container (miniswe cleanup)"
            )
        lowered = stderr.lower()
        if code in (126, 127) and "python3" in lowered:
            remove(self.exe, [self.name])  # created, never started
            return "has no python3"
        if code is None or code == 125 or code < 0:
            raise SandboxError(self._run_problem(stderr))
        remove(self.exe, [self.name])
        last = (stderr.strip().splitlines() or [f"exit {code}"])[-1].strip()
        return f"has a python3 that cannot run miniswe's executor ({last[:120]})"

    def _start_exec(self, why: str) -> None:
        """The fallback: a bash loop as main process (with --init to reap), one `exec` per command."""
        cfg = self.config
        run = [
            "run", "-d", "--init", *self._container_args(),
            # the main process is the lifetime ceiling: when it ends, --rm removes the container
            "--entrypoint", "bash", *self.run_args.args,
            cfg.image, "-c", KEEPER, "miniswe-keeper", str(int(cfg.container_lifetime + 0.999)),
        ]  # fmt: skip
        started = self._engine(*run, timeout=cfg.start_timeout)
        if started.returncode:
            raise SandboxError(self._run_problem(started.stderr))
        # One exec checks what every later step relies on: bash, sleep (the watchdog) and the cwd.
        check = self._engine(
            "exec", self.name, "bash", "-c",
            'command -v sleep >/dev/null || exit 3; cd -- "$1" 2>/dev/null || exit 4', "miniswe", cfg.cwd,
        )  # fmt: skip
        if check.returncode == 3:
            raise SandboxError(f"image {cfg.image} has no `sleep`; use an image with coreutils")
        if check.returncode == 4:
            raise SandboxError(
                f"environment.cwd: {cfg.cwd} does not exist in image {cfg.image}; create it in the image "
                "or set environment.cwd"
            )
        if check.returncode:
            raise SandboxError(
                f"cannot run bash in image {cfg.image} ({first_line(check.stderr) or f'exit {check.returncode}'}); "
                f"miniswe needs bash in the image (and python3 for its executor: the image {why})"
            )
        self._runner = ExecPerStep(self.exe, self.name, cwd=cfg.cwd, env=self.env, capture_limit=cfg.capture_limit,
                                   sweep=not self.run_args.shares_pids, gone=self._gone_reason)
        self.mode = "exec"

    def _run_problem(self, stderr: str) -> str:
        line = first_line(stderr)
        if "rlimit" in line:
            hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
            return (
                f"environment.run_args: requested ulimits exceed the host's hard limits (nofile hard limit here: "
                f"{hard}); lower the --ulimit values ({line})"
            )
        if "No such image" in line or "Unable to find image" in line:
            return f"environment.run_args: a stray argument was taken as the image name ({line})"
        problem = engine_problem(self.tool, stderr)
        if problem != line:
            return problem
        return f"{self.tool} run failed: {line}; check environment.run_args {mask_run_args(self.config.run_args)}"

    # -- commands ------------------------------------------------------------------------------------------
    def execute(self, command: str, *, timeout: float) -> CommandResult:
        if self.container is None or self._runner is None:
            raise SandboxError("the docker environment is closed")
        if self._gone:
            raise SandboxError(self._gone)
        try:
            result = self._runner.execute(command, timeout)
        except SandboxError as error:
            raise self._wrecked(error) from None
        if result.sandbox_error:
            self._gone = result.sandbox_error
        elif not result.interrupted:
            self._commands += 1
        return result

    def _wrecked(self, error: SandboxError) -> SandboxError:
        """bash cannot start in a container that still runs, after a command of this run ran there: that
        command (the previous one; nothing it started outlives a step) broke the container, not the machinery.
        The error then says so and carries `by_agent_command` (its number among this environment's commands)."""
        if not self._commands or self._gone:
            return error
        if self.mode == "executor":
            broken = (getattr(error, "problem", None) or {}).get("what") in ("exec", "cwd")
        else:
            text = str(error)
            broken = text.startswith((f"{self.tool} exec failed", "cannot start bash in the working directory"))
        if not broken:
            return error
        n = self._commands
        problem = getattr(error, "problem", None) or {}
        since = f"since command {n} (the previous one) ran"
        if problem.get("what") == "cwd":
            what = (f"cannot start bash in the working directory {problem.get('path', '')} {since} "
                    f"({problem.get('message', '')}: a command removed or replaced it)")
        elif problem:
            what = f"bash cannot start there {since} ({problem.get('message', '')}: a command removed or broke it)"
        else:
            what = f"bash cannot start there {since} ({str(error).removesuffix('; the run cannot continue')})"
        wrecked = SandboxError(f"the run's own command broke container {self.name}: {what}; the run cannot continue, "
                               "and running the task again would only repeat it")
        wrecked.by_agent_command = n  # type: ignore[attr-defined]
        self._gone = str(wrecked)
        return wrecked

    def interrupt(self) -> None:
        runner = self._runner
        if runner is not None:
            runner.interrupt()

    def _gone_reason(self, settle: bool = True) -> str | None:
        """Why the container can no longer run commands, or None while it is running. `settle`: the engine
        notices a dead main process a moment after its stream ends, so look a few times before saying "running"."""
        if self._gone:
            return self._gone
        for attempt in range(4 if settle else 1):
            time.sleep(0.1 * attempt)
            try:
                state = engine_call(self.exe, "inspect", "--format",
                                    "{{.State.Status}} {{.State.OOMKilled}} {{.State.ExitCode}} {{.State.Pid}}",
                                    self.name, timeout=15)
            except SandboxError as error:  # the engine did not answer at all
                self._gone = self._engine_lost(str(error))
                return self._gone
            status = state.stdout.split()
            if state.returncode or not status or status[0] != "running":
                break
        else:
            stopped = self._executor_stopped(status[3] if len(status) > 3 else "")
            if stopped:
                self._gone = stopped
            return stopped
        name = self.name
        client = None if status[:1] == ["paused"] else self._client_killed()
        if client:
            self._gone = client
        elif state.returncode and ("no such" in state.stderr.lower() or "no container with" in state.stderr.lower()):
            lived = time.monotonic() - self._started
            if lived >= self.config.container_lifetime - 1:
                how = f"it reached environment.container_lifetime ({self.config.container_lifetime:g}s) and removed itself"
            else:
                how = self._how_removed()
            self._gone = (f"container {name} {how}; the run cannot continue" if how.startswith("was ")
                          else f"container {name} is gone ({how}); the run cannot continue")
        elif state.returncode:
            self._gone = self._engine_lost(first_line(state.stderr))
        elif status[0] == "paused":
            self._gone = f"container {name} was paused (`{self.tool} pause`) under the run; the run cannot continue"
        elif status[1:2] == ["true"]:
            self._gone = (f"container {name} is gone (killed for lack of memory; raise environment.memory); "
                          "the run cannot continue")
        else:
            code = status[2] if len(status) > 2 else "?"
            also = " or by a command (`kill -9 -1` ends it in exec-per-step mode)" if self.mode == "exec" else ""
            self._gone = (f"container {name} is gone ({status[0]}, exit code {code}: stopped or killed from outside{also}); "
                          "the run cannot continue")
        return self._gone

    def _client_killed(self) -> str | None:
        """miniswe's own `run -i` client ended by a signal (SIGKILL from someone on this host): the executor
        saw its stdin end and ended the container, which --rm then removed."""
        runner = self._runner
        if self.mode != "executor" or not isinstance(runner, Resident):
            return None
        try:
            code = runner.proc.wait(timeout=1)  # its stream ended: it is ending or ended
        except subprocess.TimeoutExpired:
            return None
        if code >= 0:
            return None
        try:
            sig = signal.Signals(-code).name
        except ValueError:
            sig = f"signal {-code}"
        return (f"miniswe's attached `{self.tool} run -i` client of container {self.name} (pid {runner.proc.pid}) was "
                f"killed from outside ({sig}); the container ended with it; the run cannot continue")

    def _how_removed(self) -> str:
        """Removed under the run: the engine's recent events tell a kill (`docker kill`, or `docker rm -f`,
        which kills first: the engine records both alike) from a main process that ended on its own."""
        try:
            if self.tool == "podman":  # reads no fractional timestamps; a duration and no stream instead
                span = ["--since", f"{int(time.time() - self._started_wall) + 2}s", "--stream=false"]
            else:  # absolute times: a duration's `--until 0s` leaves out the last second
                span = ["--since", f"{self._started_wall - 1:.3f}", "--until", f"{time.time():.3f}"]
            found = engine_call(self.exe, "events", *span, "--filter", f"container={self.name}",
                                "--format", "{{json .}}", timeout=5)
        except SandboxError:
            found = None
        signals, code = [], None
        for line in (found.stdout.splitlines() if found is not None and not found.returncode else []):
            try:
                event = json.loads(line)
            except ValueError:
                continue
            action = str(event.get("Action") or event.get("Status") or event.get("status") or "").lower()
            attributes = (event.get("Actor") or {}).get("Attributes") or event.get("Attributes") or {}
            if action == "kill":
                signals.append(str(attributes.get("signal") or "?"))
            elif action in ("die", "died"):
                code = attributes.get("exitCode", event.get("ContainerExitCode"))
        killed = bool(signals)
        signals = [number for number in signals if number != "?"]  # podman names no signal
        if not signals and code is not None and str(code).isdigit() and int(code) > 128:
            signals = [str(int(code) - 128)]  # died of a signal, not sent by itself (podman's rm -f records no kill)
        if killed or signals:
            which = " then ".join(dict.fromkeys(signals))
            by = f" by signal {which}" if which else ""
            return (f"was killed from outside{by} (`{self.tool} kill`, or `{self.tool} rm -f` which kills first; "
                    "the engine records both alike) while the run was using it, and is gone")
        if code is not None:
            return f"its main process ended (exit code {code}) and it was removed"
        return "removed from outside while the run was using it"

    def _executor_stopped(self, pid: str) -> str | None:
        """The engine says "running", but the executor may be stopped (SIGSTOP from this host): its heartbeats
        would never come back. Only looked at when that pid on this host is the executor (a remote engine's is not)."""
        if self.mode != "executor" or not pid.isdigit():
            return None
        try:
            if NAME not in Path(f"/proc/{pid}/cmdline").read_bytes():
                return None
        except OSError:
            return None
        if not stopped(int(pid)):
            return None
        return (f"miniswe's executor in container {self.name} (pid {pid} on this host) was stopped from outside "
                "(SIGSTOP); the run cannot continue")

    def _engine_lost(self, detail: str) -> str:
        return (
            f"the {self.tool} engine stopped answering while the run was using container {self.name} ({detail}); "
            "the run cannot continue; once the engine is back, run `miniswe cleanup` to remove what it left"
        )

    def close(self) -> None:
        # No locks: this may run from a signal handler that interrupted execute().
        name, self.container = self.container, None
        if name is not None:
            _LIVE.pop(name, None)
            remove(self.exe, [name])
        runner = self._runner
        if runner is not None:
            runner.close()

    def describe(self) -> dict[str, Any]:
        cfg = self.config
        return {
            "kind": "docker",
            "executable": self.tool,
            "image": cfg.image,
            "cwd": cfg.cwd,
            "container": self.name,
            "executor": {"executor": "resident", "exec": "exec-per-step"}.get(self.mode, ""),
            "env": sorted(cfg.env),
            "forward_env": list(cfg.forward_env),
            "run_args": mask_run_args(cfg.run_args),
            "notices": list(self.notices),
        }


@atexit.register
def _remove_live() -> None:
    by_exe: dict[str, list[str]] = {}
    for name, (exe, pid) in list(_LIVE.items()):
        if pid == os.getpid():
            by_exe.setdefault(exe, []).append(name)
    _LIVE.clear()
    for exe, names in by_exe.items():
        remove(exe, names)
