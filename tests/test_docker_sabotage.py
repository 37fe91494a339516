"""Issue 18: the agent's own commands attack miniswe's executor (PID 1) from inside its container, and faults
from outside during a run: as a user runs miniswe (`run`, `batch`, `cleanup`), a real engine, real containers,
commands from the scripted model server.

What must hold: no command can speak the executor's protocol (a forged result); a command that cripples or kills
PID 1 ends the run as SandboxDestroyed naming it (the task's outcome: a batch does not run it again), never as
"killed from outside"; a container killed while it starts is started again, never taken for an image that cannot
run the executor; a restart is noticed at once; `cleanup` leaves alone runs it cannot judge.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from conftest import SUBMIT, act, clean_env, miniswe_cmd
from openai_server import ScriptedServer
from waiting import wait_for

try:
    from test_docker import IMAGE, derived_image
    from test_docker_cli import Runs, assert_gone, containers_of, endpoint, engine, running_inside, stderr_lines
except pytest.skip.Exception as no_engine:
    pytest.skip(no_engine.msg, allow_module_level=True)

pytestmark = pytest.mark.docker

# A python3 built without libffi: no ctypes, so no prctl for the executor's hardening.
NO_CTYPES = "rm -rf /usr/lib/python3*/ctypes /usr/lib/python3*/lib-dynload/_ctypes*"
USER = "[--user, '1000:1000']"  # commands as the executor's own (non-root) user: PID 1's limits are theirs to change

# Writes five "the command exited 0" frames into PID 1's stream to the host, the way a command would forge the
# result of the next ones (a task's eval), then tries the other ways in: its input, its memory, its limits.
FORGE = r"""python3 - <<'EOF'
import json, os, struct
end = json.dumps({"rc": 0, "timed_out": False, "killed": False}).encode()
for path, mode in (("/proc/1/fd/1", os.O_WRONLY), ("/proc/1/fd/0", os.O_RDONLY), ("/proc/1/mem", os.O_RDONLY)):
    try:
        fd = os.open(path, mode | os.O_NONBLOCK)
    except OSError as error:
        print(path, "refused:", error.strerror)
        continue
    if mode == os.O_WRONLY:
        os.write(fd, (b"X" + struct.pack(">I", len(end)) + end) * 5)
    print(path, "OPEN")
EOF
prlimit --pid 1 --nofile=4:4 || echo prlimit refused"""


@pytest.fixture
def runs(tmp_path):
    r = Runs(tmp_path)
    yield r
    r.cleanup()


@pytest.fixture(scope="module")
def no_ctypes_image() -> str:
    return derived_image("miniswe-test-noctypes", NO_CTYPES)


def batch(tmp_path: Path, tasks: list[dict], server, *extra: str, out: str = "run", timeout: float = 240):
    (tmp_path / "tasks.yaml").write_text(yaml.safe_dump(tasks, sort_keys=False))
    started = time.monotonic()
    proc = subprocess.run(miniswe_cmd("batch", "tasks.yaml", "-o", out, *endpoint(server), "-q", *extra), cwd=tmp_path,
                          env=clean_env(), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
    proc.seconds = time.monotonic() - started
    proc.records = {r["id"]: r for r in map(json.loads, (tmp_path / out / "results.jsonl").read_text().splitlines())}
    return proc


def trajectory(tmp_path: Path, record: dict, out: str = "run") -> dict:
    return json.loads((tmp_path / out / record["trajectory"]).read_text())


def task(task_id: str, **env) -> dict:
    """A task whose first reply (a rule on its text) is its attack; every later reply submits. Its eval fails."""
    return {"id": task_id, "task": f"task {task_id}", "env": {"image": IMAGE, **env}, "eval": ["false"]}


def rules(attacks: dict[str, str]) -> list[tuple[str, str]]:
    return [(f"task {task_id}", act(command)) for task_id, command in attacks.items()]


# ---------------------------------------------------------------- forged frames


@pytest.mark.parametrize("image", ["stock", "no-ctypes"])
def test_a_command_cannot_forge_the_executors_results(tmp_path, image, no_ctypes_image):
    image = IMAGE if image == "stock" else no_ctypes_image
    attack = {"forger": FORGE + "\ncat /proc/1/comm; echo false-ran-$(false; echo $?)"}
    with ScriptedServer(default=SUBMIT, rules=rules(attack)) as server:
        proc = batch(tmp_path, [{**task("forger"), "env": {"image": image}}], server)
    assert proc.returncode == 0, proc.stderr
    record = proc.records["forger"]
    assert (record["exit_status"], record["resolved"]) == ("Submitted", False), record  # its eval is `false`
    data = trajectory(tmp_path, record)
    assert data["environment"]["executor"] == "resident" and data["environment"]["notices"] == []
    output = data["steps"][0]["output"]
    for way in ("/proc/1/fd/1 refused", "/proc/1/fd/0 refused", "/proc/1/mem refused", "prlimit refused"):
        assert way in output, output
    assert "OPEN" not in output and "miniswe-executo\n" in output and "false-ran-1" in output
    assert [e["returncode"] for e in data["evaluation"]] == [1]


def test_an_executor_that_cannot_be_hardened_is_never_used_and_the_fallback_is_loud(runs, server, no_ctypes_image):
    # no ctypes and not root: nothing keeps a command (the same user) out of PID 1's descriptors, so the run must
    # not use the executor, and says so on stderr even with -q
    server.push(act(FORGE), act("false"), SUBMIT)
    proc = runs.start(server, "-c", f"environment.run_args={USER}", image=no_ctypes_image)
    proc.out, proc.err = proc.communicate(timeout=120)
    assert proc.returncode == 0, proc.err
    [warning] = [line for line in stderr_lines(proc.err) if "warning" in line]
    assert warning.startswith("miniswe: warning: image ") and "docker exec" in warning and "forge" in warning
    data = runs.traj(proc)
    assert data["environment"]["executor"] == "exec-per-step" and data["environment"]["notices"]
    # PID 1 there is the engine's init, whose output is the container's log, not miniswe's: a forged frame lands
    # nowhere, and each command's end is its own `docker exec`'s
    assert data["steps"][1]["returncode"] == 1
    assert_gone(proc)  # the refused executor's container too: the fallback's has its name


# ---------------------------------------------------------------- commands against PID 1's limits


def test_prlimit_on_pid_1_is_refused_and_the_run_goes_on(runs, server):
    server.push(act("prlimit --pid 1 --nofile=4:4; echo nofile=$?"),
                act("prlimit --pid 1 --cpu=1:1; echo cpu=$?; seq 1 3000000 | tail -n 1"),
                act("python3 -c 'import resource; resource.prlimit(1, resource.RLIMIT_NPROC, (1, 1))' 2>&1 | tail -n 1"),
                act("echo still-here"), SUBMIT)
    proc = runs.run(server, timeout=120)
    assert proc.returncode == 0, proc.err
    outputs = [step["output"] for step in runs.traj(proc)["steps"]]
    assert "Operation not permitted" in outputs[0] and "nofile=1" in outputs[0]
    assert "cpu=1" in outputs[1] and outputs[1].endswith("3000000\n")
    assert "PermissionError" in outputs[2] and outputs[3] == "still-here\n"


@pytest.mark.parametrize("memory_attack", ["as-reported", "command-spares-itself"])
def test_oom_score_adj_on_pid_1_under_a_memory_limit(runs, server, memory_attack):
    spare = "echo 0 > /proc/self/oom_score_adj; " if memory_attack == "command-spares-itself" else ""
    attack = f"echo 1000 > /proc/1/oom_score_adj; {spare}python3 -c 'b = bytearray(400 << 20)'; echo rc=$?"
    server.push(act("echo first"), act(attack), act("echo still-here"), SUBMIT)
    proc = runs.run(server, "-c", "environment.memory=256m", timeout=120)
    data = runs.traj(proc)
    lines = stderr_lines(proc.err)
    if memory_attack == "as-reported":
        # commands run at the highest score themselves: the biggest process dies, the command's, not PID 1
        assert proc.returncode == 0, proc.err
        assert data["steps"][1]["output"].endswith("rc=137\n") and data["steps"][2]["output"] == "still-here\n"
        return
    assert proc.returncode == 1, proc.err  # the agent's outcome, not an infrastructure failure (3)
    assert data["exit_status"] == "SandboxDestroyed", data["exit_detail"]
    assert len(lines) == 1 and "the run's own command broke container" in lines[0], proc.err
    assert "command 2 (`echo 1000 > /proc/1/oom_score_adj" in lines[0] and "lack of memory" in lines[0]
    assert "from outside" not in lines[0].replace("no kill, stop or restart from outside", "")
    assert len(data["steps"]) == 2 and len(server.requests) == 2


def test_limits_a_non_root_command_can_change_end_the_run_as_its_own_doing(runs, server):
    # as the executor's own user a command may lower PID 1's limits: the kernel then kills it (CPU) or it cannot
    # start the next command (open files); either way the command is named, and the run is not retried
    server.push(act("echo first"), act("prlimit --pid 1 --cpu=1:1; echo set=$?; seq 1 100000000"))
    cpu = runs.run(server, "-c", f"environment.run_args={USER}", name="cpu.json", timeout=120)
    server.push(act("prlimit --pid 1 --nofile=4:4; echo set=$?"), act("echo next"))
    nofile = runs.run(server, "-c", f"environment.run_args={USER}", name="nofile.json", timeout=120)
    for proc, culprit in ((cpu, "command 2 (`prlimit --pid 1 --cpu=1:1"),
                          (nofile, "command 1 (the previous one, `prlimit --pid 1 --nofile=4:4")):
        assert proc.returncode == 1, proc.err
        data = runs.traj(proc)
        assert data["exit_status"] == "SandboxDestroyed", data["exit_detail"]
        lines = stderr_lines(proc.err)
        assert len(lines) == 1 and culprit in lines[0], proc.err
        assert "killed from outside" not in lines[0]
    assert "set=0" in runs.traj(cpu)["steps"][1]["output"] and "the kernel killed" in runs.traj(cpu)["exit_detail"]
    assert "Too many open files" in runs.traj(nofile)["exit_detail"]


def test_in_a_batch_a_destroyed_sandbox_is_the_tasks_outcome_and_is_not_run_again(tmp_path):
    attacks = {
        "oom": "echo 1000 > /proc/1/oom_score_adj; echo 0 > /proc/self/oom_score_adj; python3 -c 'b = bytearray(400 << 20)'",
        "cpu": "prlimit --pid 1 --cpu=1:1; seq 1 100000000",
        "nofile": "prlimit --pid 1 --nofile=4:4",
    }
    tasks = [task("oom", memory="256m"), task("cpu", run_args=["--user", "1000:1000"]),
             task("nofile", run_args=["--user", "1000:1000"])]
    with ScriptedServer(default=SUBMIT, rules=rules(attacks)) as server:
        first = batch(tmp_path, tasks, server, "-w", "2")
        asked = len(server.requests)
        again = batch(tmp_path, tasks, server, "-w", "2")
        assert len(server.requests) == asked, "the rerun ran a task again"
    assert first.returncode == 0, first.stderr  # no infrastructure failure: 3 would say there was
    assert {i: r["exit_status"] for i, r in first.records.items()} == dict.fromkeys(attacks, "SandboxDestroyed")
    for task_id, command in attacks.items():
        assert command.split(";")[0] in trajectory(tmp_path, first.records[task_id])["exit_detail"]
    report = (tmp_path / "run" / "report.md").read_text()
    assert "| SandboxDestroyed | agent outcome | 3 |" in report and "infrastructure" not in report, report
    assert again.returncode == 0, again.stderr


# ---------------------------------------------------------------- a kill while the container starts


def killing_engine(tmp_path: Path, every: bool) -> Path:
    """A docker client that kills the executor's container (`docker kill`) after the engine started it and before
    the executor heard anything: its stdin is held back until the kill. Only the first start, unless `every`."""
    script = tmp_path / "killing-docker"
    once = "" if every else f'mkdir {tmp_path}/killed-once 2>/dev/null &&'
    script.write_text(f"""#!/bin/bash
if [ "$1 $2" = "run -i" ] && {once} true; then
    name=$(printf '%s\\n' "$@" | grep -A1 -x -- --name | tail -n 1)
    mark={tmp_path}/killed-$RANDOM$RANDOM
    (until [ "$(docker inspect -f '{{{{.State.Running}}}}' "$name" 2>/dev/null)" = true ]; do sleep 0.05; done
     docker kill "$name"; echo "$name" >> {tmp_path}/kills; touch $mark) >/dev/null 2>&1 &
    # not a pipeline: bash would wait for the `cat`, which holds miniswe's stdout, until miniswe closes its stdin
    exec docker "$@" < <(until [ -e $mark ]; do sleep 0.05; done; exec cat 2>/dev/null)
fi
exec docker "$@"
""")
    script.chmod(0o755)
    return script


def test_a_container_killed_while_it_starts_is_started_again_not_downgraded(tmp_path):
    engine_client = killing_engine(tmp_path, every=False)
    tasks = [{"id": f"t{i}", "task": "say done", "env": {"image": IMAGE, "executable": str(engine_client)}} for i in (1, 2)]
    with ScriptedServer(default=SUBMIT) as server:
        proc = batch(tmp_path, tasks, server, "-w", "1")
    assert proc.returncode == 0, proc.stderr
    assert len((tmp_path / "kills").read_text().split()) == 1, "the first start was killed"
    for record in proc.records.values():
        assert record["exit_status"] == "Submitted", record
        environment = trajectory(tmp_path, record)["environment"]
        assert environment["executor"] == "resident" and environment["notices"] == [], environment
    assert "warning" not in proc.stderr


def test_a_container_killed_at_every_start_is_an_infrastructure_failure_not_a_fallback(runs, server, tmp_path):
    engine_client = killing_engine(tmp_path, every=True)
    server.push(SUBMIT)
    proc = runs.run(server, "-c", f"environment.executable={engine_client}", timeout=120)
    assert proc.returncode == 3, proc.err
    lines = stderr_lines(proc.err)
    assert len(lines) == 1 and "ended while it started, 3 times" in lines[0], proc.err
    assert "exec" not in lines[0] and server.requests == []
    assert len((tmp_path / "kills").read_text().split()) == 3
    assert containers_of(Runs.traj(proc)["metadata"]["run_id"]) == []


# ---------------------------------------------------------------- a restart from outside


def test_a_restart_mid_step_ends_the_run_at_once_with_an_infrastructure_error(runs, server):
    server.push(act("echo started; sleep 36"), SUBMIT)
    proc = runs.start(server, "-c", "environment.timeout=0")  # no timeout: nothing but noticing can end the step
    _, container = runs.container_when_busy(proc, "sleep 36")
    started = time.monotonic()
    assert engine("restart", "-t", "1", container).returncode == 0
    _, err = proc.communicate(timeout=60)
    assert time.monotonic() - started < 15, "the restart must be noticed within seconds"
    assert proc.returncode == 3, err
    lines = stderr_lines(err)
    assert len(lines) == 1 and "was restarted from outside (`docker restart`)" in lines[0], err
    data = Runs.traj(proc)
    assert data["exit_status"] == "SandboxError" and data["steps"][0]["output"] == "started\n"


# ---------------------------------------------------------------- cleanup and runs in other PID namespaces


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")
def test_cleanup_leaves_alone_a_live_run_from_another_pid_namespace(server, tmp_path, cli):
    server.push(act("echo started; sleep 37"), SUBMIT)
    path = tmp_path / "ns.json"
    # the run's pid means nothing in this namespace (it may well be some live process's here, or nobody's)
    proc = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child",
         *miniswe_cmd("run", "x", *endpoint(server), "-o", str(path), "--image", IMAGE, "-q")],
        cwd=tmp_path, env=clean_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        data = wait_for(lambda: _with_container(path, proc), "the run's container", timeout=60)
        container = data["environment"]["container"]
        wait_for(lambda: "sleep 37" in running_inside(container), "the command running")
        labels = json.loads(engine("inspect", "--format", "{{json .Config.Labels}}", container).stdout)
        assert labels["miniswe.pidns"].rpartition(":")[2] != str(os.stat("/proc/self/ns/pid").st_ino)
        listed = cli("cleanup", "--dry-run")
        assert listed.returncode == 0, listed.stderr
        assert container not in listed.stdout, "a live run in another PID namespace was taken for dead"
        assert container in cli("cleanup", "--all", "--dry-run").stdout  # --all still reaches it
        assert "sleep 37" in running_inside(container)
    finally:
        proc.kill()  # unshare ends, and takes the run with it (--kill-child): its container ends with them
        proc.communicate(timeout=30)
    run_id = json.loads(path.read_text())["metadata"]["run_id"]
    wait_for(lambda: not containers_of(run_id), "the run's container to end with it", timeout=30)


def _with_container(path: Path, proc: subprocess.Popen) -> dict | None:
    if proc.poll() is not None:
        raise AssertionError(f"the run ended early: {proc.communicate()}")
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return data if "container" in data.get("environment", {}) else None

