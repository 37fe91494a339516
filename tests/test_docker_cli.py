"""`miniswe run`, `batch` and `cleanup` in containers, as a user runs them: real processes, a real engine, signals.

Each test looks at the engine afterwards: no container labelled with the run's id may remain.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import yaml
from conftest import SUBMIT, act, clean_env, miniswe_cmd
from openai_server import ScriptedServer
from waiting import wait_for

# test_docker.py holds the gate: importing it skips this module when no engine (or no test image) is reachable,
# and fails it instead when CI says it started one (MINISWE_REQUIRE_DOCKER=1).
try:
    from test_docker import IMAGE, ORPHANS, _engine_problem, no_python_image  # noqa: F401  (a fixture)
except pytest.skip.Exception as no_engine:
    pytest.skip(no_engine.msg, allow_module_level=True)  # reported as this module's skip

pytestmark = pytest.mark.docker

ORPHAN_WARNING = "container(s) left by dead miniswe runs"


def endpoint(server) -> list[str]:
    return ["--base-url", server.base_url, "-m", "test-model"]


def engine(*args: str, exe: str = "docker") -> subprocess.CompletedProcess:
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=60)


def containers_of(run_id: str, exe: str = "docker") -> list[str]:
    """Every container, in any state, labelled with this run's id."""
    listed = engine("ps", "-a", "--format", "{{.Names}}", "--filter", f"label=miniswe.run={run_id}", exe=exe)
    assert listed.returncode == 0, listed.stderr
    return listed.stdout.split()


def running_inside(container: str) -> list[str]:
    """Command lines of the processes in the container ([] once it is gone)."""
    return [line.strip() for line in engine("exec", container, "ps", "-eo", "args=").stdout.splitlines()]


def host_processes_naming(container: str) -> list[str]:
    """Processes on this host whose command line names the container (a `docker exec` client left behind)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if container in cmdline:
                found.append(f"{entry} {cmdline.strip()}")
    return found


def stderr_lines(stderr: str) -> list[str]:
    """stderr without the orphan warning, which another test's dead run may legitimately cause."""
    return [line for line in stderr.strip().splitlines() if ORPHAN_WARNING not in line]


class Runs:
    """Starts `miniswe run` processes; at teardown kills (by pid) those still running and removes their containers."""

    def __init__(self, tmp_path: Path):
        self.tmp_path = tmp_path
        self.procs: list[tuple[subprocess.Popen, Path]] = []

    def start(self, server, *extra: str, name: str = "t.json", group: bool = False, image: str = IMAGE) -> subprocess.Popen:
        """`group`: in its own process group, so that a signal can go to the whole group as Ctrl-C at a terminal does."""
        path = self.tmp_path / name
        # -q: stderr then holds only diagnostics (the steps are progress, shown there otherwise)
        args = ["run", "x", *endpoint(server), "-o", str(path), "--image", image, "-q", *extra]
        proc = subprocess.Popen(
            miniswe_cmd(*args), cwd=self.tmp_path, env=clean_env(), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, process_group=0 if group else None,
        )  # fmt: skip
        proc.traj_path = path
        self.procs.append((proc, path))
        return proc

    def run(self, server, *extra: str, name: str = "t.json", timeout: float = 60) -> subprocess.Popen:
        proc = self.start(server, *extra, name=name)
        proc.out, proc.err = proc.communicate(timeout=timeout)
        return proc

    @staticmethod
    def traj(proc: subprocess.Popen) -> dict:
        return json.loads(proc.traj_path.read_text())

    def container_when_busy(self, proc: subprocess.Popen, command: str | None = None) -> tuple[str, str]:
        """Wait until the run's container is up (and runs a process whose command line is exactly `command`);
        returns (run id, container)."""
        data = wait_for(lambda: self._traj_with_container(proc), "the run's container in its trajectory")
        run_id, container = data["metadata"]["run_id"], data["environment"]["container"]
        assert container == f"miniswe-{run_id}" and containers_of(run_id) == [container]
        if command:
            wait_for(lambda: command in running_inside(container) or proc.poll() is not None, f"`{command}` running inside")
            assert proc.poll() is None, proc.communicate()
        return run_id, container

    def _traj_with_container(self, proc: subprocess.Popen) -> dict | None:
        if proc.poll() is not None:
            raise AssertionError(f"the run ended early: {proc.communicate()}")
        try:
            data = self.traj(proc)
        except (FileNotFoundError, ValueError):
            return None
        return data if "container" in data.get("environment", {}) else None

    def cleanup(self) -> None:
        for proc, path in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()
            try:
                run_id = json.loads(path.read_text())["metadata"]["run_id"]
            except (OSError, ValueError, KeyError):
                continue
            for exe in ("docker", "podman"):
                if shutil.which(exe):
                    names = engine("ps", "-aq", "--filter", f"label=miniswe.run={run_id}", exe=exe).stdout.split()
                    if names:
                        engine("rm", "-f", *names, exe=exe)


@pytest.fixture
def runs(tmp_path):
    r = Runs(tmp_path)
    yield r
    r.cleanup()


def assert_gone(proc: subprocess.Popen, exe: str = "docker") -> str:
    """The run's container is removed (and no exec client of it lingers on the host); returns the container name."""
    data = Runs.traj(proc)
    run_id, container = data["metadata"]["run_id"], data["environment"]["container"]
    assert container == f"miniswe-{run_id}"
    assert containers_of(run_id, exe) == [], f"{container} outlived its run"
    assert host_processes_naming(container) == []
    return container


# ---------------------------------------------------------------- cleanup when the run ends by any path


@pytest.mark.parametrize(
    ("replies", "extra", "code", "status"),
    [
        ([act("test -f /.dockerenv && echo in-a-container"), SUBMIT], [], 0, "Submitted"),
        ([act("test -f /.dockerenv && echo in-a-container"), act("true")], ["--step-limit", "2"], 1, "LimitsExceeded"),
    ],
    ids=["submitted", "step-limit"],
)
def test_container_removed_after_normal_end(runs, server, replies, extra, code, status):
    server.push(*replies)
    proc = runs.run(server, *extra)
    assert proc.returncode == code, proc.err
    data = runs.traj(proc)
    assert data["exit_status"] == status
    assert data["steps"][0]["output"] == "in-a-container\n"
    assert data["environment"]["kind"] == "docker" and data["environment"]["image"] == IMAGE
    assert_gone(proc)


def test_container_removed_after_an_exception_inside_miniswe(runs, server, tmp_path):
    # an observation template that passes the start-up check but raises when a command exits 7
    templates = tmp_path / "templates"
    templates.mkdir()
    shipped = (Path(__file__).resolve().parents[1] / "templates" / "observation.j2").read_text()
    (templates / "observation.j2").write_text(
        shipped + "{% if returncode == 7 %}{{ output.no_such_field.value }}{% endif %}\n"
    )
    server.push(act("echo one"), act("echo two; exit 7"), SUBMIT)
    proc = runs.run(server, "-c", f"agent.templates_dir={templates}")
    assert proc.returncode == 3, proc.err
    data = runs.traj(proc)
    assert data["exit_status"] == "Error" and "no_such_field" in data["exit_detail"]
    assert [s["returncode"] for s in data["steps"]] == [0, 7]
    lines = stderr_lines(proc.err)
    assert len(lines) == 1 and lines[0].startswith("miniswe: internal error (traceback saved in"), proc.err
    assert_gone(proc)


SIGNALS = [
    pytest.param(signal.SIGINT, 130, False, id="SIGINT"),
    pytest.param(signal.SIGINT, 130, True, id="ctrl-c-to-the-group"),
    pytest.param(signal.SIGTERM, 143, False, id="SIGTERM"),
]


def interrupt(proc: subprocess.Popen, sig: signal.Signals, group: bool, code: int) -> str:
    """Send the signal (to the run's whole process group, as a terminal's Ctrl-C does, if `group`); its stderr."""
    signalled = time.monotonic()
    if group:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == code, err
    assert time.monotonic() - signalled < 10
    data = Runs.traj(proc)
    assert data["exit_status"] == "Interrupted" and data["exit_detail"] == sig.name
    assert stderr_lines(err) == [f"miniswe: Interrupted: {sig.name}"], err
    return err


@pytest.mark.parametrize(("sig", "code", "group"), SIGNALS)
def test_container_removed_after_a_signal_mid_command(runs, server, sig, code, group):
    server.push(act("echo first"), act("echo started; sleep 31"), SUBMIT)
    proc = runs.start(server, group=group)
    run_id, container = runs.container_when_busy(proc, "sleep 31")
    interrupt(proc, sig, group, code)
    assert Runs.traj(proc)["metadata"]["run_id"] == run_id
    assert assert_gone(proc) == container
    assert len(server.requests) == 2  # stopped in the second command: the third reply was never asked for


@pytest.mark.parametrize(("sig", "code", "group"), SIGNALS)
def test_container_removed_after_a_signal_while_waiting_for_the_model(runs, server, sig, code, group):
    server.push(act("echo first"), {"stall": 30, "content": SUBMIT})
    proc = runs.start(server, group=group)
    runs.container_when_busy(proc)
    wait_for(lambda: len(server.requests) == 2, "the second model call")
    interrupt(proc, sig, group, code)
    assert len(Runs.traj(proc)["steps"]) == 1
    assert_gone(proc)


@pytest.mark.parametrize(("sig", "code", "group"), SIGNALS)
def test_container_removed_after_a_signal_while_it_starts(runs, server, sig, code, group, tmp_path):
    # an engine client whose container is up, but whose first frame (the executor's hello) never reaches
    # miniswe: the container exists, miniswe is still starting it
    started = tmp_path / "started"
    slow = tmp_path / "slow-docker"
    slow.write_text(
        '#!/bin/bash\n[ "$1" = run ] || exec docker "$@"\n'
        f'docker "$@" | (head -c 1 >/dev/null; touch {started}; exec sleep 15)\n'
    )
    slow.chmod(0o755)
    server.push(SUBMIT)
    proc = runs.start(server, "-c", f"environment.executable={slow}", group=group)
    wait_for(lambda: started.exists() or proc.poll() is not None, "the container to start")
    run_id = Runs.traj(proc)["metadata"]["run_id"]
    assert containers_of(run_id) == [f"miniswe-{run_id}"]
    interrupt(proc, sig, group, code)
    assert Runs.traj(proc)["steps"] == [] and server.requests == []
    assert containers_of(run_id) == []
    # the client ends with its container (the wrapper's `sleep 15` names neither)
    wait_for(lambda: not host_processes_naming(f"miniswe-{run_id}"), "the attached client to end", timeout=10)


# ---------------------------------------------------------------- timeouts inside the container


def test_hanging_forking_command_is_killed_inside_before_the_next_step(runs, server):
    hang = (
        "echo before; trap '' TERM INT HUP; "
        "(sleep 1001 &); nohup sleep 1002 >/dev/null 2>&1 & "
        "bash -c 'sleep 1003 & sleep 1004 & wait' & "
        "sleep 1005; echo never"
    )
    server.push(act(hang), act("ps -eo pid,pgid,args"), SUBMIT)
    started = time.monotonic()
    proc = runs.run(server, "-c", "environment.timeout=1")
    assert proc.returncode == 0, proc.err
    data = runs.traj(proc)
    hung, listing = data["steps"][0], data["steps"][1]
    assert hung["timed_out"] and hung["returncode"] is None and hung["output"] == "before\n"
    assert 1 <= hung["duration_s"] < 4
    assert listing["returncode"] == 0 and "PGID" in listing["output"]
    survivors = [line for line in listing["output"].splitlines() if "sleep 100" in line]
    assert survivors == [], listing["output"]
    assert "killed after 1 seconds" in server.requests[1]["body"]["messages"][-1]["content"]
    assert time.monotonic() - started < 20
    assert_gone(proc)


# ---------------------------------------------------------------- kill -9, orphans and `miniswe cleanup`


def test_kill_9_of_a_run_removes_its_executor_container(runs, server):
    server.push(act("echo first"), act("sleep 35"))
    doomed = runs.start(server)
    doomed_run, doomed_container = runs.container_when_busy(doomed, "sleep 35")
    doomed.kill()
    doomed.communicate(timeout=10)
    # the attached client's stdin ends with its owner; the executor then ends the container, and --rm removes it
    wait_for(lambda: not containers_of(doomed_run), "the container to remove itself", timeout=20)
    wait_for(lambda: not host_processes_naming(doomed_container), "the attached client to end", timeout=10)


@ORPHANS
def test_kill_9_leaves_an_orphan_that_cleanup_removes_but_live_runs_are_kept(runs, server, cli, tmp_path, no_python_image):
    # in exec-per-step mode (an image without python3) the container is detached, so kill -9 leaves it behind
    server.push(act("echo first"), act("sleep 32"))
    doomed = runs.start(server, name="doomed.json", image=no_python_image)
    doomed_run, doomed_container = runs.container_when_busy(doomed, "sleep 32")
    doomed.kill()
    # not reaped yet, as by a supervisor that has not waited: a zombie owns nothing, it counts as gone
    wait_for(lambda: Path(f"/proc/{doomed.pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z", "a zombie")
    assert containers_of(doomed_run) == [doomed_container], "kill -9: nothing could have removed it"
    assert Runs.traj(doomed)["exit_status"] is None

    # another run warns at start, and runs normally
    server.push(SUBMIT)
    warned = runs.run(server, name="warned.json")
    assert warned.returncode == 0, warned.err
    assert ORPHAN_WARNING in warned.err and "miniswe cleanup" in warned.err
    assert_gone(warned)
    # so does a batch whose task names its own image (no --env on the command line)
    server.push(SUBMIT)
    (tmp_path / "image-task.yaml").write_text(f"- id: boxed\n  task: t\n  env: {{image: {IMAGE}}}\n")
    batch = cli("batch", "image-task.yaml", "-o", "image-run", "--base-url", server.base_url, "-m", "m", "-q")
    assert batch.returncode == 0, batch.stderr
    assert ORPHAN_WARNING in batch.stderr

    listed = cli("cleanup", "--dry-run")
    assert listed.returncode == 0, listed.stderr
    line = next(line for line in listed.stdout.splitlines() if line.startswith(doomed_container))
    assert f"run {doomed_run}" in line and f"owner pid {doomed.pid}" in line
    assert "would remove" in listed.stderr
    assert containers_of(doomed_run) == [doomed_container], "--dry-run removed it"
    doomed.communicate(timeout=10)

    server.push(act("sleep 33"))
    live = runs.start(server, name="live.json")
    live_run, live_container = runs.container_when_busy(live, "sleep 33")
    removed = cli("cleanup")
    assert removed.returncode == 0, removed.stderr
    assert doomed_container in removed.stdout and live_container not in removed.stdout
    assert containers_of(doomed_run) == []
    # the dead run's `docker exec` client (its own session, so kill -9 did not reach it) ends with the container
    wait_for(lambda: not host_processes_naming(doomed_container), "the orphaned exec client to end", timeout=10)
    assert containers_of(live_run) == [live_container] and "sleep 33" in running_inside(live_container)
    assert live_container not in cli("cleanup", "--dry-run").stdout
    # --all would take it; only listed here, since --all would also take other live runs on this engine
    assert live_container in cli("cleanup", "--all", "--dry-run").stdout
    assert containers_of(live_run) == [live_container]

    live.send_signal(signal.SIGTERM)
    live.communicate(timeout=30)
    assert live.returncode == 143
    assert_gone(live)


# ---------------------------------------------------------------- the container dies under the run


@pytest.mark.parametrize(
    ("run_args", "shown"),
    [("[-v, /var/run:/hostrun]", "-v /var/run:/hostrun"), ("[--mount, 'type=bind,src=/,dst=/host']", "--mount type=bind"),
     ("[--cap-add, SYS_PTRACE]", "--cap-add SYS_PTRACE"), ("[--security-opt, seccomp=unconfined]", "seccomp=unconfined")],
)
def test_unsafe_run_args_are_refused_at_start_before_any_container(runs, server, run_args, shown):
    proc = runs.run(server, "-c", f"environment.run_args={run_args}")
    assert proc.returncode == 2, proc.err
    lines = stderr_lines(proc.err)
    assert len(lines) == 1 and shown in lines[0] and "allow_unsafe_run_args" in lines[0], proc.err
    assert server.requests == []
    listed = engine("ps", "-a", "--format", "{{.Names}}", "--filter", f"label=miniswe.pid={proc.pid}")
    assert listed.returncode == 0 and listed.stdout.split() == []


def test_a_command_that_destroys_its_own_container_is_named_in_the_outcome(runs, server):
    server.push(act("echo one"), act("rm -rf --no-preserve-root / 2>/dev/null; echo done-rm"), act("echo three"), SUBMIT)
    proc = runs.run(server, timeout=180)
    assert proc.returncode == 1, proc.err  # the agent's outcome, not an infrastructure failure: no rerun on resume
    lines = stderr_lines(proc.err)
    assert len(lines) == 1 and "the run's own command broke container" in lines[0], proc.err
    assert "command 2 (the previous one, `rm -rf" in lines[0]
    data = runs.traj(proc)
    assert data["exit_status"] == "SandboxDestroyed" and "the run's own command broke" in data["exit_detail"]
    assert_gone(proc)


def test_container_removed_from_outside_ends_the_run_with_sandbox_error(runs, server):
    server.push(act("echo running; sleep 34"), SUBMIT)
    proc = runs.start(server)
    run_id, container = runs.container_when_busy(proc, "sleep 34")
    assert engine("rm", "-f", container).returncode == 0
    removed = time.monotonic()
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 3, err
    assert time.monotonic() - removed < 10
    lines = stderr_lines(err)
    assert len(lines) == 1, err
    assert lines[0].startswith("miniswe: SandboxError: container ") and "is gone" in lines[0]
    assert "Traceback" not in err
    data = runs.traj(proc)
    assert data["exit_status"] == "SandboxError" and "is gone" in data["exit_detail"]
    assert len(server.requests) == 1  # no loop of steps against a dead container
    assert containers_of(run_id) == []


# ---------------------------------------------------------------- a batch, one container per task

# Every task gets the same reply (the workers share the server): count in the task's own container, submit at 3.
COUNTER = act(
    'n=$(( $(cat .n) + 1 )); echo $n > .n; '
    'if [ "$n" -ge 3 ]; then echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; cat host.txt; else echo "step $n"; fi'
)


def test_batch_runs_each_task_in_its_own_container_and_removes_it(tmp_path):
    tag = uuid.uuid4().hex[:8]
    ids = [f"dk-{tag}-{i}" for i in range(4)]
    tasks = [
        {
            "id": task_id,
            "task": "count to 3",
            "cwd": "/tmp",
            "env": {"image": IMAGE, "env": {"TASK": task_id}},
            "setup": ["echo 0 > .n", 'echo "$TASK on $(hostname)" > host.txt'],
            "eval": ['test "$(cat .n)" -eq 3', 'grep -qx "$TASK on $(hostname)" host.txt'],
        }
        for task_id in ids
    ]
    (tmp_path / "tasks.yaml").write_text(yaml.safe_dump(tasks, sort_keys=False))
    with ScriptedServer(default=COUNTER, latency=0.02) as server:
        proc = subprocess.Popen(
            miniswe_cmd("batch", "tasks.yaml", "-o", "run", "-w", "2", "--env", "docker", *endpoint(server), "-q"),
            cwd=tmp_path, env=clean_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        try:
            seen: set[str] = set()
            most = 0
            while proc.poll() is None:
                listed = engine("ps", "-a", "--format", "{{.Names}}", "--filter", "label=miniswe.run").stdout.split()
                mine = [name for name in listed if f"-dk-{tag}-" in name]
                seen.update(mine)
                most = max(most, len(mine))
                time.sleep(0.02)
            out, err = proc.communicate(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 0, err
    assert out.startswith("4 tasks · Submitted 4 · resolved 4/4"), out
    records = {r["id"]: r for r in map(json.loads, (tmp_path / "run" / "results.jsonl").read_text().splitlines())}
    assert sorted(records) == ids
    hosts = set()
    for task_id, record in records.items():
        assert (record["exit_status"], record["resolved"], record["steps"]) == ("Submitted", True, 3), record
        data = json.loads((tmp_path / "run" / record["trajectory"]).read_text())
        assert [s["returncode"] for s in data["setup"]] == [0, 0]
        assert [e["returncode"] for e in data["evaluation"]] == [0, 0]
        container = data["environment"]["container"]
        assert container.endswith(f"-{task_id}") and container in seen
        assert containers_of(data["metadata"]["run_id"]) == []
        submitted_by, _, host = record["submission"].strip().partition(" on ")
        assert submitted_by == task_id
        hosts.add(host)
    assert len(hosts) == 4, "each task in its own container"
    # 4 tasks, 2 workers: had a finished task's container waited for the batch's end, 3 or 4 would have coexisted
    assert most == 2, f"at most {most} of this batch's containers alive at once"
    assert not [n for n in engine("ps", "-a", "--format", "{{.Names}}").stdout.split() if f"-dk-{tag}-" in n]


# ---------------------------------------------------------------- podman


_podman_problem = _engine_problem("podman")


@pytest.mark.skipif(bool(_podman_problem), reason=f"podman: {_podman_problem}")
def test_run_with_podman(runs, server):
    server.push(act('test -f /run/.containerenv && echo "in $container"'), SUBMIT)
    proc = runs.run(server, "-c", "environment.executable=podman")
    assert proc.returncode == 0, proc.err
    data = runs.traj(proc)
    assert data["exit_status"] == "Submitted" and data["steps"][0]["output"] == "in podman\n"
    assert data["environment"]["executable"] == "podman"
    assert containers_of(data["metadata"]["run_id"]) == []  # not on the docker engine, either
    assert_gone(proc, "podman")


# ---------------------------------------------------------------- chat in a container


def test_chat_in_a_container_survives_ctrl_c_and_leaves_nothing_behind(server, tmp_path):
    pytest.importorskip("pyte")
    pytest.importorskip("prompt_toolkit")
    from terminal import Terminal

    server.push(act("echo started; sleep 30"), act("test -f /.dockerenv && echo in-a-container"), SUBMIT,
                act("cat /tmp/kept || echo gone"), SUBMIT)
    home = tmp_path / "home"
    home.mkdir()
    term = Terminal(miniswe_cmd("chat", *endpoint(server), "--image", IMAGE, "--mode", "yolo"),
                    env=clean_env(MINISWE_HOME=str(home), TERM="xterm-256color"), cwd=str(tmp_path))
    try:
        prompt = r"\[yolo\]>"
        term.wait_prompt(prompt, timeout=60)
        term.type("wait a while")
        term.send("\r")
        term.wait_for(r"\$ echo started; sleep 30")
        term.pump(1.0)
        term.send(b"\x03")  # stops the command inside the container, not the session
        term.wait_for(r"aborted \(SIGINT\)", timeout=15)
        term.wait_prompt(prompt)
        term.type("go on")
        term.send("\r")
        term.wait_for("in-a-container")
        term.wait_for(r"done \(submitted\)")
        term.wait_prompt(prompt)
        term.type("one more")
        term.send("\r")
        term.wait_for(r"done \(submitted\)", count=2)
        term.wait_prompt(prompt)
        term.send(b"\x04")
        assert term.wait_exit(timeout=60) == 0
    finally:
        term.close()
    data = json.loads((home / "sessions" / "autosave.traj.json").read_text())
    assert data["steps"][0]["aborted"] == "SIGINT" and data["steps"][0]["output"] == "started\n"
    assert data["steps"][1]["output"] == "in-a-container\n", "the same container ran the next turn"
    container = data["environment"]["container"]
    assert containers_of(data["metadata"]["run_id"]) == [], f"{container} outlived the chat"
    assert host_processes_naming(container) == []
