"""Commands in one Docker (or Podman) container per run.

The container's main process (PID 1) is miniswe's executor (executor.py), run by the image's own python3
and attached to miniswe through one `docker run -i` client: each command is a frame on its stdin, run as
a fresh `bash -c` in its own session, its output streamed back (executor_client.py). Nothing in the container
names a command in its argv, and nothing a command does to processes there can end the executor.
Images without python3 fall back to one `docker exec` per command (docker_exec.py), with a notice.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import re
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Literal

from miniswe.config import Count, EnvironmentConfig, Number, Seconds, Strings, Text
from miniswe.environments import CommandResult
from miniswe.environments import images
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
# Images found unable to run the executor, so a batch does not try each time: (executable, image id, run_args)
# -> why. Only on evidence (no python3, one too old or that fails on the executor's source, hardening that a
# command could undo): a start killed from outside is tried again instead, never cached.
_NO_EXECUTOR: dict[tuple[str, str, tuple[str, ...]], str] = {}
START_TRIES = 3  # starts of the executor's container before a run gives up (each killed from outside)


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
        self._gone_by: int | None = None  # the number of the run's command that broke the container, if one did
        self._death: str | None = None  # how the main process died, when nothing from outside killed it
        self._last: tuple[int, str] | None = None  # the latest command sent: its number and text
        self._started_at: str | None = None  # the container's start time, as the engine gives it
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
            if not (cfg.pull == "always" and images.held_by_batch(self.exe, cfg.image)):  # a batch pulls it once
                # retried with backoff; a registry's rate limit pauses every pull of this process (PullError at last)
                images.pull(self.exe, cfg.image, stop=self.stop, policy=images.PullPolicy(timeout_s=cfg.start_timeout))
        elif present.returncode:
            raise SandboxError(
                f"image {cfg.image} is not present and environment.pull is 'never'; build or load it "
                "(docker build / docker load) or set environment.pull: missing"
            )
        key = (self.exe, present.stdout.strip() or cfg.image, tuple(self.run_args.args))
        why = _NO_EXECUTOR.get(key)
        if why is None:
            why = self._start_executor()
            if why is None:
                return
            _NO_EXECUTOR[key] = why
        notice = (f"image {cfg.image} {why}: each command runs through its own `{self.tool} exec` instead of miniswe's "
                  "executor (about 80 ms more per step, and commands can see and signal miniswe's wrapper)")
        self.notices.append(notice)
        # never a silent downgrade: stderr hears of it even in a batch or with -q (the trajectory keeps it too)
        print(f"miniswe: warning: {notice}", file=sys.stderr, flush=True)
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
        """Start the container with the executor as its main process; why it cannot (to fall back), or None.
        A start that fails without saying why (the container killed while it started) is tried again."""
        for _ in range(START_TRIES):
            failed = self._try_executor()
            if failed is None:
                return None
            why = self._refused(failed)
            if why is not None:
                return why
            remove(self.exe, [self.name])  # its --rm may still be at work: the name is needed again
        code = failed.returncode
        how = f"killed by signal {code - 128}" if code is not None and code > 128 else f"exit {code}"
        raise SandboxError(f"container {self.name} ended while it started, {START_TRIES} times ({how}: killed from "
                           f"outside?); the run cannot start")

    def _try_executor(self) -> StartFailed | None:
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
            return failed
        except BaseException:
            resident.close()
            self._runner = None
            raise
        if hello.get("exposed"):
            # a command could read and write the executor's stream (forge a command's end, its exit code): its
            # python3 could not be hardened (no ctypes, not root, ...). Never run commands that way.
            self._drop_runner()
            return StartFailed(None, "", exposed=True)
        if not hello.get("bash"):
            raise SandboxError(f"image {cfg.image} has no bash; miniswe runs every command with `bash -c`: use an image with bash")
        if hello.get("cwd"):
            raise SandboxError(
                f"environment.cwd: {cfg.cwd} {hello['cwd']} in image {cfg.image}; create it in the image "
                "or set environment.cwd"
            )
        # when it started: a `docker restart` keeps the name and the attached client, not the executor
        try:
            self._started_at = self._state().get("started")
        except SandboxError:  # the engine is slow to answer: the restart goes unnoticed by its start time only
            pass
        self.mode = "executor"
        return None

    def _drop_runner(self) -> None:
        runner, self._runner = self._runner, None
        remove(self.exe, [self.name])
        if runner is not None:
            runner.close()

    def _refused(self, failed: StartFailed) -> str | None:
        """Why the executor cannot run in this image (to fall back), on evidence; None when the start should be
        tried again; SandboxError when the container itself was refused."""
        stderr, code = failed.stderr, failed.returncode
        if failed.exposed:
            return ("has a python3 under which miniswe's executor cannot keep commands away from its stream "
                    "(a command could forge its results)")
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
        if code == 4 and "miniswe-executor:" in stderr:
            return f"has a python3 too old for miniswe's executor ({last.removeprefix('miniswe-executor: ')})"
        if "Traceback" in stderr:  # its python3 failed on the executor's source
            return f"has a python3 that cannot run miniswe's executor ({last[:120]})"
        return None  # killed by a signal or ended without a word: not the image's fault, try again

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
            raise self._error(self._gone)
        previous, self._last = self._last, ((self._last[0] if self._last else 0) + 1, command)
        try:
            result = self._runner.execute(command, timeout)
        except SandboxError as error:  # nothing ran: the previous command may have broken the container
            raise self._wrecked(error, previous) from None
        if result.sandbox_error and self._death:
            # the main process died under this command, and nothing from outside killed it: the command did
            result = dataclasses.replace(result, sandbox_error=self._blame(self._last, f"was running when {self._death}"),
                                         by_agent_command=self._last[0])
        if result.sandbox_error:
            self._gone = result.sandbox_error
        return result

    def _error(self, message: str) -> SandboxError:
        error = SandboxError(message)
        if self._gone_by:
            error.by_agent_command = self._gone_by  # type: ignore[attr-defined]  (see status.outcome_of)
        return error

    def _blame(self, culprit: tuple[int, str], what: str, *, previous: bool = False) -> str:
        """The message of a container the run's own command broke; from now on every step raises it."""
        number, command = culprit
        lines = command.strip().splitlines() or [""]
        shown = lines[0][:80] + (" …" if len(lines) > 1 or len(lines[0]) > 80 else "")
        self._gone_by = number
        which = f"the previous one, `{shown}`" if previous else f"`{shown}`"
        self._gone = (f"the run's own command broke container {self.name}: command {number} ({which}) {what}; "
                      "the run cannot continue, and running the task again would only repeat it")
        return self._gone

    def _wrecked(self, error: SandboxError, previous: tuple[int, str] | None) -> SandboxError:
        """Nothing could start in a container that was fine before `previous`, a command of this run, ran there:
        its main process died after it with nothing from outside to blame, or it still runs but cannot start
        bash (a removed cwd or bash, a lowered limit: nothing a command starts outlives its step). That command
        broke the container, not the machinery: the error says so and carries `by_agent_command`."""
        if previous is None:
            return error
        if self._death:
            return self._error(self._blame(previous, f"ran, then {self._death}", previous=True))
        if self._gone:
            return error
        problem = getattr(error, "problem", None) or {}
        if self.mode == "executor":
            broken = bool(problem)  # any start problem: bash, the cwd, descriptors, memory, fork
        else:
            broken = str(error).startswith((f"{self.tool} exec failed", "cannot start bash in the working directory"))
        if not broken:
            return error
        if problem.get("what") == "cwd":
            why = (f"cannot start bash in the working directory {problem.get('path', '')} "
                   f"({problem.get('message', '')}: a command removed or replaced it)")
        elif problem:
            why = f"bash cannot start there ({problem.get('what')}: {problem.get('message', '')})"
        else:
            why = f"bash cannot start there ({str(error).removesuffix('; the run cannot continue')})"
        return self._error(self._blame(previous, f"ran, and since then {why}", previous=True))

    def interrupt(self) -> None:
        runner = self._runner
        if runner is not None:
            runner.interrupt()

    def _state(self) -> dict[str, str]:
        """The container as the engine sees it: status, oom, code, pid, started; {"missing": ...} once removed;
        {"error": ...} when the engine answers with an error. SandboxError when it does not answer at all."""
        state = engine_call(self.exe, "inspect", "--format",
                            "{{.State.Status}} {{.State.OOMKilled}} {{.State.ExitCode}} {{.State.Pid}} {{.State.StartedAt}}",
                            self.name, timeout=15)
        if state.returncode:
            lowered = state.stderr.lower()
            if "no such" in lowered or "no container with" in lowered:
                return {"missing": "yes"}
            return {"error": first_line(state.stderr)}
        fields = state.stdout.strip().split(" ", 4)
        return dict(zip(("status", "oom", "code", "pid", "started"), fields))

    def _gone_reason(self, settle: bool = True) -> str | None:
        """Why the container can no longer run commands, or None while it is running. `settle`: the engine
        notices a dead main process a moment after its stream ends, so look a few times before saying "running"."""
        if self._gone:
            return self._gone
        for attempt in range(4 if settle else 1):
            time.sleep(0.1 * attempt)
            try:
                state = self._state()
            except SandboxError as error:  # the engine did not answer at all
                self._gone = self._engine_lost(str(error))
                return self._gone
            if state.get("status") != "running":
                break
        else:
            if self._started_at and state.get("started") != self._started_at:
                # the attached client survives a restart, but the executor it talked to does not
                self._gone = self._restarted()
                return self._gone
            stopped = self._executor_stopped(state.get("pid", ""))
            if stopped:
                self._gone = stopped
            return stopped
        client = None if state.get("status") == "paused" else self._client_killed()
        if client:
            self._gone = client
        elif "error" in state:
            self._gone = self._engine_lost(state["error"])
        elif state.get("status") == "paused":
            self._gone = f"container {self.name} was paused (`{self.tool} pause`) under the run; the run cannot continue"
        else:
            self._gone = self._ended(state)
        return self._gone

    def _restarted(self) -> str:
        return (f"container {self.name} was restarted from outside (`{self.tool} restart`) while the run was using it: "
                "miniswe's executor and everything the run started there are gone; the run cannot continue")

    def _ended(self, state: dict[str, str]) -> str:
        """The container's main process ended (it may be removed already): why, as the engine tells. With no
        kill, stop or restart from outside on record, a death by a signal (the kernel's OOM killer, a CPU limit)
        is the run's own doing: recorded in `_death`, for execute() to name the command."""
        name = self.name
        signals, actions, died = self._events()
        code = state.get("code") or died
        if "restart" in actions:
            return self._restarted()
        if "kill" in actions or "stop" in actions:
            which = " then ".join(dict.fromkeys(signals))
            by = f" by signal {which}" if which else ""
            return (f"container {name} was killed from outside{by} (`{self.tool} kill`, `{self.tool} stop`, or "
                    f"`{self.tool} rm -f` which kills first; the engine records them alike) while the run was using it, "
                    "and is gone; the run cannot continue")
        if "missing" in state and time.monotonic() - self._started >= self.config.container_lifetime - 1:
            return (f"container {name} is gone (it reached environment.container_lifetime "
                    f"({self.config.container_lifetime:g}s) and removed itself); the run cannot continue")
        oom = state.get("oom") == "true" or "oom" in actions
        signal_number = int(code) - 128 if code and code.isdigit() and int(code) > 128 else None
        if (oom or signal_number) and self._last is not None:
            how = "for lack of memory" if oom else f"by signal {signal_number}"
            if self.mode == "executor":
                self._death = (f"the container died: the kernel killed miniswe's executor, its main process, {how} "
                               f"(the engine recorded no kill, stop or restart from outside)")
            else:
                self._death = (f"the container died: its main process was killed {how} (`kill -9 -1` ends it in "
                               "exec-per-step mode; the engine recorded no kill, stop or restart from outside)")
        if oom:
            return f"container {name} is gone (killed for lack of memory; raise environment.memory); the run cannot continue"
        if "missing" in state:
            if code is not None:
                return f"container {name} is gone (its main process ended, exit code {code}, and it was removed); the run cannot continue"
            return f"container {name} is gone (removed from outside while the run was using it); the run cannot continue"
        return (f"container {name} is gone ({state.get('status')}, exit code {code}: its main process ended); "
                "the run cannot continue")

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

    def _events(self) -> tuple[list[str], set[str], str | None]:
        """What the engine recorded for this container since the run started: the signals of its kill events,
        every action (kill, stop, restart, oom, die...), and the exit code of its death, if any. Docker records
        a kill for `docker kill`, `stop`, `restart` and `rm -f`; podman records `kill` and `restart`, but for
        `podman stop` or `rm -f` only the death."""
        try:
            if self.tool == "podman":  # reads no fractional timestamps; a duration and no stream instead
                span = ["--since", f"{int(time.time() - self._started_wall) + 2}s", "--stream=false"]
            else:  # absolute times: a duration's `--until 0s` leaves out the last second
                span = ["--since", f"{self._started_wall - 1:.3f}", "--until", f"{time.time():.3f}"]
            found = engine_call(self.exe, "events", *span, "--filter", f"container={self.name}",
                                "--format", "{{json .}}", timeout=5)
        except SandboxError:
            found = None
        signals, actions, code = [], set(), None
        for line in (found.stdout.splitlines() if found is not None and not found.returncode else []):
            try:
                event = json.loads(line)
            except ValueError:
                continue
            action = str(event.get("Action") or event.get("Status") or event.get("status") or "").lower()
            attributes = (event.get("Actor") or {}).get("Attributes") or event.get("Attributes") or {}
            actions.add(action)
            if action == "kill" and attributes.get("signal"):  # podman names no signal
                signals.append(str(attributes["signal"]))
            elif action in ("die", "died"):
                code = attributes.get("exitCode", event.get("ContainerExitCode"))
                code = None if code is None else str(code)
        return signals, actions, code

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
