"""DockerEnvironment against a real engine and image miniswe-test:latest (CI starts both with .ci/docker-engine)."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from conftest import read_line
from miniswe.environments.containers import find_orphans, remove_containers
from miniswe.environments.docker import DockerConfig, DockerEnvironment
from miniswe.errors import SandboxError

pytestmark = pytest.mark.docker

IMAGE = "miniswe-test:latest"
ROOT = Path(__file__).resolve().parents[1]
# Tests that need an orphan to stay until they remove it, and the one that runs `miniswe cleanup` (which removes
# every orphan on the engine): one xdist worker runs them one at a time.
ORPHANS = pytest.mark.xdist_group("docker-orphans")


def _engine_problem(exe: str) -> str | None:
    if shutil.which(exe) is None:
        return f"no `{exe}` on PATH"
    try:
        info = subprocess.run([exe, "info"], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return f"`{exe} info` hung"
    if info.returncode:
        return f"`{exe} info` failed: {(info.stderr.strip().splitlines() or ['?'])[-1]}"
    if subprocess.run([exe, "image", "inspect", IMAGE], capture_output=True).returncode:
        return f"image {IMAGE} missing in {exe}"
    return None


_problem = _engine_problem("docker")
if _problem and os.environ.get("MINISWE_REQUIRE_DOCKER"):
    # set by CI once .ci/docker-engine start succeeded: a skip there would hide a broken engine
    raise RuntimeError(f"MINISWE_REQUIRE_DOCKER is set but there is no Docker engine: {_problem}")
if _problem:
    pytest.skip(f"no Docker engine ({_problem}); run `.ci/docker-engine start`", allow_module_level=True)


def config(**overrides) -> DockerConfig:
    return DockerConfig(image=IMAGE, **overrides)


def new_id() -> str:
    return f"test-{uuid.uuid4().hex[:10]}"


def start(run_id: str | None = None, **overrides) -> DockerEnvironment:
    return DockerEnvironment(config(**overrides), run_id=run_id or new_id())


def docker(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=60)


def exists(name: str, exe: str = "docker") -> bool:
    return subprocess.run([exe, "inspect", name], capture_output=True).returncode == 0


def processes(env: DockerEnvironment) -> str:
    """What runs in the container, minus its init and main sleep, and this listing itself."""
    listing = docker("exec", env.name, "ps", "-eo", "pid=,args=").stdout
    return "\n".join(line for line in listing.splitlines() if "14400" not in line and "ps -eo" not in line)


def in_subprocess(code: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def derived_image(name: str, command: str, exe: str = "docker") -> str:
    """IMAGE changed by `command` and committed as `name`, tagged with IMAGE's id (offline: nothing to pull),
    once per engine and base image, whichever test process (an xdist worker, another session) asks first."""
    base = subprocess.run([exe, "image", "inspect", "--format", "{{.Id}}", IMAGE], capture_output=True, text=True)
    name = f"{name}:{base.stdout.strip().removeprefix('sha256:')[:12]}"
    with open(os.path.join(tempfile.gettempdir(), "miniswe-test-images.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if subprocess.run([exe, "image", "inspect", name], capture_output=True).returncode:
            build_image(name, command, exe)
    return name


def build_image(name: str, command: str, exe: str) -> None:
    scratch = f"miniswe-derive-{uuid.uuid4().hex[:8]}"
    made = subprocess.run([exe, "run", "--name", scratch, "--entrypoint", "bash", IMAGE, "-c", command],
                          capture_output=True, text=True, timeout=120)
    try:
        assert made.returncode == 0, made.stderr
        committed = subprocess.run([exe, "commit", "--change", 'CMD ["/bin/sh"]', scratch, name],
                                   capture_output=True, text=True, timeout=120)
        assert committed.returncode == 0, committed.stderr
    finally:
        subprocess.run([exe, "rm", "-f", scratch], capture_output=True, timeout=60)


NO_PYTHON = "rm -f /usr/bin/python3*"  # bash stays: the exec-per-step fallback
NO_BASH = "rm -f /usr/bin/bash /bin/bash"  # python3 stays, sh (dash) stays


@pytest.fixture(scope="session")
def no_python_image() -> str:
    return derived_image("miniswe-test-nopython", NO_PYTHON)


@pytest.fixture(scope="module")
def shared():
    env = start(cwd="/tmp", env={"GREETING": "hello world"})
    yield env
    env.close()


@pytest.fixture
def fresh():
    envs = []

    def make(**overrides) -> DockerEnvironment:
        envs.append(start(**overrides))
        return envs[-1]

    yield make
    for env in envs:
        env.close()


def test_exit_codes_and_merged_output(shared):
    assert shared.execute("true", timeout=10).returncode == 0
    result = shared.execute("echo out; echo err >&2; exit 3", timeout=10)
    assert (result.returncode, result.output, result.timed_out) == (3, "out\nerr\n", False)
    missing = shared.execute("no-such-command-xyz", timeout=10)
    assert missing.returncode == 127 and "not found" in missing.output


def test_fresh_shell_per_command(shared):
    shared.execute("export LEAK=1; cd /; X=2", timeout=10)
    assert shared.execute('echo "[$LEAK][$X]"; pwd', timeout=10).output == "[][]\n/tmp\n"


def test_stdin_is_empty(shared):
    result = shared.execute("cat; echo done", timeout=10)
    assert (result.returncode, result.output) == (0, "done\n")


def test_cwd_defaults_to_root(fresh):
    env = fresh()
    assert env.execute("pwd", timeout=10).output == "/\n"


def test_env_and_forward_env(fresh, monkeypatch):
    monkeypatch.setenv("MINISWE_TEST_SECRET", "s3cr3t-value")
    env = fresh(env={"GREETING": "hello world"}, forward_env=["MINISWE_TEST_SECRET", "MINISWE_TEST_UNSET"])
    out = env.execute('echo "$GREETING|$MINISWE_TEST_SECRET|${MINISWE_TEST_UNSET-unset}|$PAGER"', timeout=10)
    assert out.output == "hello world|s3cr3t-value|unset|cat\n"
    described = env.describe()
    assert described["forward_env"] == ["MINISWE_TEST_SECRET", "MINISWE_TEST_UNSET"]
    assert described["env"] == ["GREETING"]
    assert "s3cr3t-value" not in json.dumps(described)
    # nor in the container's own settings, visible to anyone with `docker inspect`
    assert "s3cr3t-value" not in docker("inspect", env.name).stdout


def test_describe(shared):
    described = shared.describe()
    assert described["kind"] == "docker" and described["image"] == IMAGE and described["cwd"] == "/tmp"
    assert described["container"] == shared.name and described["run_args"] == []


def test_container_is_labelled(shared):
    labels = json.loads(docker("inspect", "--format", "{{json .Config.Labels}}", shared.name).stdout)
    assert labels["miniswe.pid"] == str(os.getpid())
    assert labels["miniswe.run"] == shared.run_id and shared.name == f"miniswe-{shared.run_id}"
    assert labels["miniswe.pid_start"] == open(f"/proc/{os.getpid()}/stat").read().rpartition(")")[2].split()[19]
    # where that pid means this process: this boot, this PID namespace (cleanup judges no other)
    boot = open("/proc/sys/kernel/random/boot_id").read().strip()
    assert labels["miniswe.pidns"] == f"{boot}:{os.stat('/proc/self/ns/pid').st_ino}"


def test_timeout_kills_everything_inside(shared):
    started = time.monotonic()
    result = shared.execute(
        "echo before; bash -c 'sleep 1001 & sleep 1002; echo never' & sleep 1003; echo never", timeout=1.5
    )
    assert result.timed_out and result.returncode is None
    assert result.output == "before\n"
    assert 1.5 <= time.monotonic() - started < 4
    assert "sleep 100" not in processes(shared)
    assert shared.execute("echo still usable", timeout=10).output == "still usable\n"


def test_background_child_does_not_outlive_its_step(shared):
    started = time.monotonic()
    result = shared.execute("sleep 1004 & echo started", timeout=30)
    assert (result.returncode, result.output) == (0, "started\n")
    assert time.monotonic() - started < 2
    assert "sleep 1004" not in processes(shared)


def test_timeout_zero_returns_at_once(shared):
    result = shared.execute("sleep 5", timeout=0)
    assert result.timed_out and result.duration_s < 2


def test_output_flood_stays_bounded_in_memory():
    # in a child process, so its peak memory is the flood's alone
    child = in_subprocess(
        f"""
from miniswe.environments.docker import DockerConfig, DockerEnvironment
env = DockerEnvironment(DockerConfig(image={IMAGE!r}, capture_limit=100_000))
r = env.execute("head -c 300000000 /dev/zero | tr '\\\\0' x; echo; echo END", timeout=120)
env.close()
# VmHWM, not ru_maxrss: the latter keeps the parent's peak across vfork and exec
print(r.returncode, r.output_chars, r.elided_chars, len(r.output), r.output.endswith("END\\n"),
      next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")) // 1024)
"""
    )
    out, err = child.communicate(timeout=180)
    assert child.returncode == 0, err
    code, chars, elided, kept, ends, peak_mb = out.split()
    assert (code, ends) == ("0", "True")
    assert int(chars) == 300_000_005 and int(elided) > 299_000_000
    assert int(kept) < 100_200
    assert int(peak_mb) < 100, f"peak RSS {peak_mb} MB while flooding 300 MB"


def test_container_removed_from_outside_mid_step(fresh):
    env = fresh()
    threading.Timer(1.0, docker, args=("rm", "-f", env.name)).start()
    started = time.monotonic()
    result = env.execute("echo running; sleep 30", timeout=60)
    assert time.monotonic() - started < 10
    # the step comes back as a value: what it printed, how long it ran, and why the sandbox is gone
    assert "is gone" in result.sandbox_error and "\n" not in result.sandbox_error
    assert result.output == "running\n" and result.duration_s >= 0.9 and result.returncode is None
    # the run ends there: no loop of errors, each step says the same thing at once
    with pytest.raises(SandboxError, match="is gone"):
        env.execute("true", timeout=10)


def test_container_killed_from_outside_mid_step_says_killed(fresh):
    env = fresh()
    threading.Timer(1.0, docker, args=("kill", env.name)).start()
    result = env.execute("echo running; sleep 30", timeout=60)
    assert result.output == "running\n" and result.returncode is None
    assert "killed from outside by signal 9" in result.sandbox_error and "is gone" in result.sandbox_error
    assert "removed from outside" not in result.sandbox_error and "\n" not in result.sandbox_error


def test_the_runs_own_client_killed_mid_step_says_so(fresh):
    env = fresh()
    client = env._runner.proc.pid  # our own child: found by pid, never by name
    threading.Timer(1.0, os.kill, args=(client, signal.SIGKILL)).start()
    started = time.monotonic()
    result = env.execute("echo running; sleep 30", timeout=60)
    assert time.monotonic() - started < 10
    assert result.output == "running\n" and result.returncode is None
    assert f"client of container {env.name} (pid {client}) was killed from outside (SIGKILL)" in result.sandbox_error
    assert "removed" not in result.sandbox_error
    with pytest.raises(SandboxError, match="was killed from outside"):
        env.execute("true", timeout=10)


def test_container_removed_between_steps(fresh):
    env = fresh()
    docker("rm", "-f", env.name)
    with pytest.raises(SandboxError, match="is gone"):
        env.execute("true", timeout=10)


def test_killing_every_process_from_inside_does_not_end_the_container(fresh):
    env = fresh()
    # the executor is the namespace's init: the kernel drops these signals unless it handles them
    result = env.execute(
        "sleep 100 & kill -9 -1; kill -9 1; kill -STOP 1; kill -INT 1; pkill -9 python3; pkill -f miniswe; echo survived",
        timeout=20,
    )
    assert "Killed" in result.output and result.output.endswith("survived\n"), result  # the sleep, not the machinery
    assert (result.returncode, result.sandbox_error) == (0, None), result
    assert env.execute("echo still-here", timeout=10).output == "still-here\n"
    assert exists(env.name)


@pytest.mark.parametrize("removal", ["rmdir /srv", "rm -rf /srv && touch /srv"])
def test_cwd_removed_by_a_command(fresh, removal):
    env = fresh(cwd="/srv")
    assert env.execute(removal, timeout=10).returncode == 0
    # as locally: the next command cannot start there, and the message says why
    with pytest.raises(SandboxError, match="cannot start bash in the working directory") as caught:
        env.execute("true", timeout=10)
    assert "a command removed" in str(caught.value) and "\n" not in str(caught.value)


def test_container_removes_itself_after_its_lifetime(fresh):
    env = fresh(container_lifetime=1)
    deadline = time.monotonic() + 15
    while exists(env.name) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not exists(env.name)
    with pytest.raises(SandboxError, match="is gone"):
        env.execute("true", timeout=10)


def test_close_removes_container_and_is_idempotent(fresh):
    env = fresh()
    assert exists(env.name)
    started = time.monotonic()
    env.close()
    assert time.monotonic() - started < 5
    assert not exists(env.name)
    env.close()
    with pytest.raises(SandboxError, match="closed"):
        env.execute("true", timeout=10)


def wait_gone(name: str, exe: str = "docker", timeout: float = 20) -> bool:
    deadline = time.monotonic() + timeout
    while exists(name, exe) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not exists(name, exe)


@pytest.mark.parametrize("ending", ["pass", "raise RuntimeError('boom')", "raise KeyboardInterrupt"])
def test_container_removed_at_interpreter_exit(ending):
    child = in_subprocess(
        f"""
from miniswe.environments.docker import DockerConfig, DockerEnvironment
env = DockerEnvironment(DockerConfig(image={IMAGE!r}))
print(env.name, flush=True)
{ending}
"""
    )
    out, _ = child.communicate(timeout=60)
    name = out.split()[0]
    assert not exists(name)


def owner_process(image: str, run_id: str = "") -> subprocess.Popen:
    """A Python process that starts an environment, prints its container's name, and waits to be killed."""
    return in_subprocess(
        f"""
import time
from miniswe.environments.docker import DockerConfig, DockerEnvironment
env = DockerEnvironment(DockerConfig(image={image!r}), run_id={run_id!r})
print(env.name, flush=True)
time.sleep(60)
"""
    )


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_executor_container_removes_itself_when_its_owner_dies_without_cleanup(sig):
    """SIGTERM without a handler, or kill -9, ends Python without atexit: the attached client's stdin then
    ends, and the executor ends the container (no orphan for `miniswe cleanup`)."""
    child = owner_process(IMAGE)
    name = read_line(child.stdout).strip()
    child.send_signal(sig)
    child.communicate(timeout=30)
    try:
        assert wait_gone(name), f"{name} outlived its owner"
    finally:
        remove_containers([name])


@ORPHANS
def test_sigterm_default_handler_leaves_orphan_that_cleanup_finds(no_python_image):
    """In exec-per-step mode the container is detached: without atexit it stays, and cleanup finds it."""
    child = owner_process(no_python_image)
    name = read_line(child.stdout).strip()
    child.send_signal(signal.SIGTERM)
    child.communicate(timeout=30)
    try:
        assert name in {c["name"] for c in find_orphans()}
    finally:
        remove_containers([name])


@ORPHANS
def test_orphan_after_kill_9_is_found_and_removed(fresh, no_python_image):
    mine = fresh()
    child = owner_process(no_python_image, run_id=f"orphan-{uuid.uuid4().hex[:8]}")
    name = read_line(child.stdout).strip()
    assert name.startswith("miniswe-orphan-")
    assert name not in {c["name"] for c in find_orphans()}  # owner still alive
    child.kill()
    child.communicate(timeout=30)
    assert exists(name)
    orphans = {c["name"]: c for c in find_orphans()}
    assert name in orphans and orphans[name]["pid"] == str(child.pid)
    assert mine.name not in orphans  # this process still owns it
    assert mine.name in {c["name"] for c in find_orphans(all=True)}
    assert remove_containers([orphans[name]["id"]]) == [orphans[name]["id"]]
    assert not exists(name)
    assert remove_containers([orphans[name]["id"]]) == []


@ORPHANS
def test_reused_pid_is_not_mistaken_for_the_owner():
    name = f"miniswe-test-reused-{uuid.uuid4().hex[:8]}"
    labels = {"run": name, "host": os.uname().nodename, "pid": str(os.getpid()), "pid_start": "1"}
    args = [a for k, v in labels.items() for a in ("--label", f"miniswe.{k}={v}")]
    assert docker("run", "-d", "--rm", "--name", name, *args, IMAGE, "sleep", "60").returncode == 0
    try:
        assert name in {c["name"] for c in find_orphans()}
    finally:
        remove_containers([name])


def assert_clean_failure(run_id: str, caught: pytest.ExceptionInfo, *words: str) -> None:
    message = str(caught.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message
    assert not docker("ps", "-aq", "--filter", f"label=miniswe.run={run_id}").stdout.strip()


def test_run_id_in_use_leaves_the_other_container_alone(shared):
    with pytest.raises(SandboxError, match="already in use") as caught:
        DockerEnvironment(config(), run_id=shared.run_id)
    assert "\n" not in str(caught.value)
    assert shared.execute("echo alive", timeout=10).output == "alive\n"


def test_missing_image_with_pull_never():
    cfg, run_id = DockerConfig(image="miniswe-no-such-image:1", pull="never"), new_id()
    with pytest.raises(SandboxError) as caught:
        DockerEnvironment(cfg, run_id=run_id)
    assert_clean_failure(run_id, caught, "miniswe-no-such-image:1", "pull")


def test_missing_image_that_cannot_be_pulled():
    cfg, run_id = DockerConfig(image="miniswe-no-such-image:1", start_timeout=60), new_id()
    with pytest.raises(SandboxError) as caught:
        DockerEnvironment(cfg, run_id=run_id)
    assert_clean_failure(run_id, caught, "cannot pull image miniswe-no-such-image:1")


def test_cwd_missing_in_image():
    cfg, run_id = config(cwd="/no/such/dir"), new_id()
    with pytest.raises(SandboxError) as caught:
        DockerEnvironment(cfg, run_id=run_id)
    assert_clean_failure(run_id, caught, "environment.cwd", "/no/such/dir")


@pytest.mark.parametrize(
    "run_args, words",
    [
        (["--memory", "lots"], ["lots", "run_args"]),
        (["stray-positional"], ["stray", "run_args"]),
        (["--ulimit", "nofile=10000000:10000000"], ["ulimit", "hard limit"]),
    ],
)
def test_bad_run_args(run_args, words):
    cfg, run_id = config(run_args=run_args), new_id()
    with pytest.raises(SandboxError) as caught:
        DockerEnvironment(cfg, run_id=run_id)
    assert_clean_failure(run_id, caught, *words)


def test_good_run_args_apply(fresh):
    env = fresh(run_args=["--network", "none", "--memory", "256m", "--pids-limit", "200"])
    limit = env.execute("cat /sys/fs/cgroup/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids/pids.max", timeout=10)
    assert limit.output == "200\n"
    connect = "python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 53), 2)'"
    assert env.execute(connect, timeout=10).returncode != 0


def test_no_docker_binary():
    with pytest.raises(SandboxError) as caught:
        start(executable="no-such-docker-binary")
    assert "\n" not in str(caught.value) and "not found on PATH" in str(caught.value)


def test_engine_not_running(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    with pytest.raises(SandboxError) as caught:
        start()
    assert "\n" not in str(caught.value) and "not running" in str(caught.value)


@pytest.mark.skipif(
    os.getuid() != 0 or not shutil.which("runuser") or not os.path.exists("/usr/bin/python3"),
    reason="needs root, runuser and /usr/bin/python3 to act as nobody",
)
def test_no_permission_on_socket():
    import tempfile

    # a copy nobody can read, wherever the checkout lives (a home folder is often closed to other users)
    readable = tempfile.mkdtemp(prefix="miniswe-nobody-")
    try:
        shutil.copytree(ROOT / "miniswe", os.path.join(readable, "miniswe"), ignore=shutil.ignore_patterns("__pycache__"))
        # the settings models need pydantic, which /usr/bin/python3 may lack: this interpreter's copy goes along
        import pydantic
        import pydantic_core
        import typing_extensions

        for module in (pydantic, pydantic_core):
            shutil.copytree(os.path.dirname(module.__file__), os.path.join(readable, module.__name__),
                            ignore=shutil.ignore_patterns("__pycache__"))
        for name in ("annotated_types", "typing_inspection"):
            found = __import__(name)
            shutil.copytree(os.path.dirname(found.__file__), os.path.join(readable, name),
                            ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy(typing_extensions.__file__, readable)
        os.chmod(readable, 0o755)
        for folder, dirs, files in os.walk(readable):
            for name in dirs:
                os.chmod(os.path.join(folder, name), 0o755)
            for name in files:
                os.chmod(os.path.join(folder, name), 0o644)
        code = f"from miniswe.environments.docker import *\nDockerEnvironment(DockerConfig(image={IMAGE!r}))"
        done = subprocess.run(
            ["runuser", "-u", "nobody", "--", "env", f"PATH={os.environ['PATH']}", f"PYTHONPATH={readable}", "HOME=/tmp",
             "/usr/bin/python3", "-c", code],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    finally:
        shutil.rmtree(readable, ignore_errors=True)
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("miniswe.errors.SandboxError: no permission on the docker socket"), done.stderr


_podman_problem = _engine_problem("podman")
podman = pytest.mark.skipif(bool(_podman_problem), reason=f"podman: {_podman_problem}")


@podman
def test_podman_runs_commands_and_kills_on_timeout():
    env = start(executable="podman", cwd="/tmp")
    try:
        assert env.execute("pwd; exit 4", timeout=10).output == "/tmp\n"
        result = env.execute("echo before; sleep 1005 & sleep 1006", timeout=1)
        assert result.timed_out and result.output == "before\n"
        listing = subprocess.run(["podman", "exec", env.name, "ps", "-eo", "args="], capture_output=True, text=True)
        assert "sleep 100" not in listing.stdout
        assert env.execute("echo ok", timeout=10).returncode == 0
    finally:
        env.close()
    assert not exists(env.name, "podman")


def test_a_command_killing_sleep_and_bash_does_not_end_the_container(fresh):
    env = fresh()
    env.execute("sleep 100 & sleep 0.2; pkill sleep; pkill bash; true", timeout=10)
    assert env.execute("echo still-here", timeout=10).output == "still-here\n"
    assert exists(env.name)


def test_processes_that_escape_the_group_do_not_outlive_the_step(fresh):
    env = fresh()
    result = env.execute("setsid bash -c 'while :; do sleep 0.1; done' & nohup setsid sleep 300 >/dev/null & echo bg", timeout=10)
    assert result.output.startswith("bg")
    listing = processes(env)
    assert "sleep 300" not in listing and "while :" not in listing, listing
    assert env.execute("echo fine", timeout=10).output == "fine\n"


def test_setsid_cannot_outlive_a_timeout_either(fresh):
    env = fresh()
    result = env.execute("setsid bash -c 'while :; do :; done' & sleep 1000", timeout=1)
    assert result.timed_out
    assert "while :" not in processes(env)
