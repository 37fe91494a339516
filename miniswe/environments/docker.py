"""Commands in one Docker (or Podman) container per environment: a fresh `bash -c` per `exec`, timed out inside."""

from __future__ import annotations

import atexit
import dataclasses
import os
import re
import resource
import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

from miniswe.environments import CommandResult, EnvironmentConfig
from miniswe.environments.capture import run_captured
from miniswe.environments.containers import (
    engine_call,
    engine_problem,
    first_line,
    owner_labels,
    remove,
    says_no_such_image,
)
from miniswe.environments.local import QUIET_ENV
from miniswe.errors import ConfigError, SandboxError
from miniswe.redaction import mask_run_args
from miniswe.signals import Stop

PULL_POLICIES = ("never", "missing", "always")
# Past the command's own timeout, how long the host waits for the in-container watchdog before giving up on it.
HOST_GRACE_S = 5.0
STDERR_LIMIT = 1 << 16

# Runs inside the container as `bash -c WRAPPER miniswe TIMEOUT COMMAND`. Job control gives the command its
# own process group, so the watchdog (on timeout) and the wrapper (after a normal exit) can kill everything
# it started; killing the `docker exec` client on the host would not stop anything inside the container.
# Then a sweep kills whatever escaped the group (setsid, double forks): in a run's own container, nothing
# but init, the keeper and its sleep may outlive a step. It reads /proc with builtins only, forking nothing.
# Markers go to the exec's stderr, which carries nothing else: the command's stderr is merged into stdout.
WRAPPER = r"""set -m
bash -c "$2" 2>&1 &
cmd=$!
echo "miniswe:pgid $cmd" >&2
(sleep "$1"; echo miniswe:timeout >&2; kill -KILL -- -"$cmd" 2>/dev/null) &
dog=$!
wait "$cmd"
rc=$?
kill -KILL -- -"$dog" -"$cmd" 2>/dev/null
keeper=
for d in /proc/[0-9]*; do
  { mapfile -d '' args < "$d/cmdline"; } 2>/dev/null || continue
  [[ ${args[0]} == bash && ${args[3]} == miniswe-keeper ]] && { keeper=${d#/proc/}; break; }
done
for d in /proc/[0-9]*; do
  p=${d#/proc/}
  [[ $p == 1 || $p == $$ || $p == "$keeper" ]] && continue
  ppid=
  { while read -r key value; do [[ $key == PPid: ]] && { ppid=$value; break; }; done < "$d/status"; } 2>/dev/null
  [[ -n $keeper && $ppid == "$keeper" ]] || kill -KILL "$p" 2>/dev/null
done
echo "miniswe:exit $rc" >&2
exit $rc
"""

# The container's main process: it lives out the lifetime ceiling, and a command's `pkill sleep` or
# `pkill bash` (ignored signals) does not end the container under the run.
KEEPER = (
    'trap "" TERM INT HUP; '
    'while [ "$SECONDS" -lt "$1" ]; do r=$(( $1 - SECONDS )); sleep $(( r < 10 ? r : 10 )) & wait $!; done'
)


@dataclass(frozen=True)
class DockerConfig(EnvironmentConfig):
    kind: str = "docker"
    image: str = ""  # image to start
    forward_env: list[str] = field(default_factory=list)  # host variables passed through by name (values never recorded)
    run_args: list[str] = field(default_factory=list)  # extra `docker run` arguments, e.g. [--network, none, --memory, 4g]
    executable: str = "docker"  # docker or podman
    pull: str = field(default="missing", metadata={"choices": PULL_POLICIES})  # never, missing or always
    start_timeout: float = field(default=120.0, metadata={"seconds": True})  # seconds allowed for pulling and starting the container
    container_lifetime: float = field(default=14_400.0, metadata={"seconds": True})  # seconds after which the container removes itself even if miniswe died


# Containers not yet closed, removed at interpreter exit: name -> (executable, creating pid). The pid keeps
# a forked child's exit from removing its parent's containers.
_LIVE: dict[str, tuple[str, int]] = {}


class DockerEnvironment:
    config_class = DockerConfig

    @staticmethod
    def check(config: DockerConfig) -> DockerConfig:
        """Settings problems found without touching the engine (ConfigError); the settings as used."""
        if not config.cwd:
            config = dataclasses.replace(config, cwd="/")  # the shared config's "" means the image's root here
        if not config.image:
            raise ConfigError("environment.image: no image given; set environment.image or pass --image")
        if config.container_lifetime <= 0:
            raise ConfigError("environment.container_lifetime: must be a positive number of seconds")
        if not config.cwd.startswith("/"):
            raise ConfigError(f"environment.cwd: {config.cwd!r} must be an absolute path inside the container")
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
        self._gone: str | None = None
        self._running: subprocess.Popen | None = None
        self._interrupted = False
        env = {**QUIET_ENV, **{k: str(v) for k, v in config.env.items()}}
        # Forwarded variables go by name only: the client fills in the value, so it never appears in argv.
        self._env_args = [a for name in config.forward_env for a in ("-e", name)]
        self._env_args += [a for k, v in env.items() for a in ("-e", f"{k}={v}")]
        _LIVE[self.name] = (self.exe, os.getpid())
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _engine(self, *args: str, timeout: float = 30.0) -> subprocess.CompletedProcess:
        return engine_call(self.exe, *args, timeout=timeout, stop=self.stop)

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
        labels = owner_labels(self.run_id)
        run = [
            "run", "-d", "--init", "--rm", "--pull", "never", "--name", self.container,
            *[a for k, v in labels.items() for a in ("--label", f"{k}={v}")],
            # the main process is the lifetime ceiling: when it ends, --rm removes the container
            "--entrypoint", "bash",
            *cfg.run_args,
            cfg.image, "-c", KEEPER, "miniswe-keeper", str(int(cfg.container_lifetime + 0.999)),
        ]  # fmt: skip
        started = self._engine(*run, timeout=cfg.start_timeout)
        if "is already in use" in started.stderr:
            # that container belongs to another run: forget it, so close() does not remove it
            _LIVE.pop(self.name, None)
            self.container = None
            raise SandboxError(
                f"container name {self.name} is already in use: run id {self.run_id!r} is taken; give each "
                "run its own run id, or remove the old container (miniswe cleanup)"
            )
        if started.returncode:
            raise SandboxError(self._run_problem(started.stderr))
        # One exec checks what every later step relies on: bash, sleep (the watchdog) and the cwd.
        check = self._engine(
            "exec", self.container, "bash", "-c",
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
                "miniswe needs bash in the image"
            )

    def _run_problem(self, stderr: str) -> str:
        line = first_line(stderr)
        if "rlimit" in line:
            hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
            return (
                f"environment.run_args: requested ulimits exceed the host's hard limits (nofile hard limit here: "
                f"{hard}); lower the --ulimit values ({line})"
            )
        if "No such image" in line:
            return f"environment.run_args: a stray argument was taken as the image name ({line})"
        problem = engine_problem(self.tool, stderr)
        if problem != line:
            return problem
        return f"{self.tool} run failed: {line}; check environment.run_args {self.config.run_args}"

    def execute(self, command: str, *, timeout: float) -> CommandResult:
        if self.container is None:
            raise SandboxError("the docker environment is closed")
        if self._gone:
            raise SandboxError(self._gone)
        started = time.monotonic()
        argv = [
            self.exe, "exec", "-w", self.config.cwd, *self._env_args, self.container,
            "bash", "-c", WRAPPER, "miniswe", f"{max(timeout, 0):.3f}", command,
        ]  # fmt: skip
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                # Ctrl-C at the terminal is for miniswe to handle, not for the exec client
                start_new_session=True,
            )
        except OSError as error:
            raise SandboxError(f"cannot start {self.exe}: {error.strerror}") from error
        self._interrupted = False
        self._running = proc
        try:
            result = run_captured(
                proc,
                timeout=max(timeout, 0) + HOST_GRACE_S,
                limit=self.config.capture_limit,
                kill=proc.kill,
                started=started,
            )
            stderr = proc.stderr.read(STDERR_LIMIT).decode("utf-8", errors="replace")
        finally:
            self._running = None
            proc.stderr.close()
        # whole lines only: bash's job notices on the same stream quote the wrapper's source
        markers = {line.partition(" ")[0]: line.partition(" ")[2] for line in stderr.splitlines()}
        if self._interrupted:
            # the exec client was killed; the container goes with the run, or its next step's sweep
            self._kill_group(markers.get("miniswe:pgid", ""))
            return dataclasses.replace(result, returncode=None, timed_out=False, interrupted=True)
        if result.timed_out:
            # The engine did not end the step in time; the watchdog inside may still be waiting to fire.
            self._kill_group(markers.get("miniswe:pgid", ""))
            return result
        if "miniswe:timeout" in markers:
            return dataclasses.replace(result, returncode=None, timed_out=True)
        if "miniswe:exit" not in markers:
            # The wrapper never ran or was killed: the exec failed, or the container went away under it.
            gone = self._gone_reason()
            if gone and "miniswe:pgid" in markers:  # it died under the command: keep what the step printed
                return dataclasses.replace(result, returncode=None, sandbox_error=gone)
            if gone:
                raise SandboxError(gone)
            if "miniswe:pgid" not in markers:
                raise SandboxError(f"{self.tool} exec failed: {first_line(stderr) or f'exit {proc.returncode}'}")
        return result

    def interrupt(self) -> None:
        proc = self._running
        if proc is not None:
            self._interrupted = True
            proc.kill()

    def _kill_group(self, pgid: str) -> None:
        if pgid.isdigit() and self.container:
            try:
                subprocess.run(
                    [self.exe, "exec", self.container, "bash", "-c", f"kill -KILL -- -{pgid}"],
                    stdin=subprocess.DEVNULL, capture_output=True, timeout=10,
                )  # fmt: skip
            except subprocess.TimeoutExpired:
                pass

    def _gone_reason(self) -> str | None:
        """Why the container can no longer run commands, or None while it is running."""
        # The engine notices a dead main process a moment after the exec ends: look a few times.
        for attempt in range(4):
            time.sleep(0.1 * attempt)
            state = self._engine("inspect", "--format", "{{.State.Status}} {{.State.OOMKilled}}", self.name)
            status = state.stdout.split()
            if state.returncode or not status or status[0] != "running":
                break
        else:
            return None
        if state.returncode:
            how = "engine not reachable" if "cannot connect" in state.stderr.lower() else "removed"
        else:
            how = "killed for lack of memory" if status[1:] == ["true"] else status[0]
        self._gone = (
            f"container {self.name} is gone ({how}): it was removed, stopped or paused, or its engine "
            "restarted, while the run was using it; the run cannot continue"
        )
        return self._gone

    def close(self) -> None:
        # No locks: this may run from a signal handler that interrupted execute().
        name, self.container = self.container, None
        if name is None:
            return
        _LIVE.pop(name, None)
        remove(self.exe, [name])

    def describe(self) -> dict[str, Any]:
        cfg = self.config
        return {
            "kind": "docker",
            "executable": self.tool,
            "image": cfg.image,
            "cwd": cfg.cwd,
            "container": self.name,
            "env": sorted(cfg.env),
            "forward_env": list(cfg.forward_env),
            "run_args": mask_run_args(cfg.run_args),
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
