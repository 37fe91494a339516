"""`miniswe batch --executor ray` on a real two-node Ray cluster (a head and a second `ray start --address` node),
inside a network namespace that holds nothing but loopback: spread over both nodes, the same ledger and report
as threads, a node killed mid-batch, the driver killed and resumed, a shared 429, budgets, two-signal stop, and
a private cluster that miniswe starts itself.

Skipped (with the reason) where Ray or an unprivileged network namespace is missing; CI sets
MINISWE_REQUIRE_RAY=1, which turns that skip into a failure.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from conftest import miniswe_cmd, read_line, read_until
from raycluster import ROOT, LoopbackNamespace, TwoNodeCluster, descendants, unavailable
from replies import act
import waiting

from miniswe.batch.ray_cluster import MEMBERS

_problem = None if importlib.util.find_spec("ray") else "ray is not installed (pip install -e '.[test,ray]')"
_problem = _problem or unavailable()
if _problem:
    if os.environ.get("MINISWE_REQUIRE_RAY") == "1":
        raise RuntimeError(f"MINISWE_REQUIRE_RAY=1 but the Ray tests cannot run: {_problem}")
    pytest.skip(_problem, allow_module_level=True)

# The tests on the module's two-node cluster run on one xdist worker, one after another; those that start
# a private cluster, on another: two more clusters at once would overload a small machine.
pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray-cluster")]
PRIVATE = pytest.mark.xdist_group("ray-private")

# A counter in the task's workspace submits at step $STEPS; each step also notes the node it ran on. The count
# is replaced, not rewritten in place: a kill mid-command leaves the old count or the new one, never an empty file.
COUNTER = act(
    'n=$(( $(cat .n 2>/dev/null || echo 0) + 1 )); echo $n > .n.new; mv .n.new .n; echo "$NODE" >> nodes; sleep "${SLEEP:-0}"; '
    'if [ "$n" -ge "${STEPS:-3}" ]; then echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; echo "patch of $(basename "$(dirname "$PWD")")"; else echo "step $n"; fi'
)
TIMING = ("wall_s", "started", "ended", "model_s")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ray")
    ns = LoopbackNamespace(tmp / "home")
    try:
        yield TwoNodeCluster(ns, tmp)
    finally:
        ns.close()


@pytest.fixture
def work(cluster, tmp_path):
    """A task folder; restores the second node if a test killed it."""
    if "worker" not in cluster.nodes:
        cluster.start_worker()
    return tmp_path


class Server:
    """tests/openai_server.py inside the namespace; what it received is read from its log."""

    def __init__(self, ns: LoopbackNamespace, folder: Path, script: list = (), default: str = COUNTER, latency: float = 0.01):
        name = f"server-{time.monotonic_ns()}"
        self.log = folder / f"{name}.requests.jsonl"
        port_file = folder / f"{name}.port"
        (folder / f"{name}.json").write_text(json.dumps({"replies": list(script), "default": default}))
        args = ["--script", str(folder / f"{name}.json"), "--port-file", str(port_file), "--latency", str(latency),
                "--requests-log", str(self.log)]
        self.proc = ns.popen(sys.executable, str(ROOT / "tests" / "openai_server.py"), *args, stdout=subprocess.DEVNULL)
        wait_for(port_file.exists)
        self.base_url = f"http://127.0.0.1:{port_file.read_text()}/v1"

    @property
    def requests(self) -> list[dict]:
        try:
            return [json.loads(line) for line in self.log.read_text().splitlines()]
        except FileNotFoundError:
            return []

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def server(cluster, work):
    srv = Server(cluster.ns, work)
    yield srv
    srv.stop()


def task(task_id, steps=3, sleep=0.0, **extra):
    return {"id": task_id, "task": f"count to {steps}", "env": {"env": {"STEPS": str(steps), "SLEEP": str(sleep)}}, **extra}


def write_tasks(folder: Path, tasks: list[dict]) -> None:
    (folder / "tasks.yaml").write_text(yaml.safe_dump(tasks, sort_keys=False))


def batch_argv(server, run_dir, *args):
    # with SIGINT's default action back: a suite run from a background job would have the driver ignore the tests' Ctrl-C
    return miniswe_cmd("batch", "tasks.yaml", "-o", run_dir, "--base-url", server.base_url, "-m", "test-model", *args)


def start_batch(cluster, work, server, *args, run_dir="run", address=True):
    where = ("--executor", "ray", "--ray-address", cluster.address) if address else ("--executor", "ray")
    return cluster.ns.popen(*batch_argv(server, run_dir, *where, *args), cwd=work, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(proc, timeout=120):
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def stop(proc: subprocess.Popen | None) -> None:
    """A batch a failed test left running: killed, so that it holds none of the cluster's workers in later tests."""
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.communicate()


def wait_for(predicate, timeout=60.0):
    return waiting.wait_for(predicate, timeout=timeout)  # a cluster takes longer than one machine


def ledger(run_dir: Path) -> dict[str, dict]:
    try:
        lines = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    except FileNotFoundError:
        return {}
    records = {r["id"]: r for r in lines}
    assert len(records) == len(lines), "one ledger line per task"
    return records


def trajectory(run_dir: Path, record: dict) -> dict:
    return json.loads((run_dir / record["trajectory"]).read_text())


def orphaned_scratch(tmp: Path) -> list[Path]:
    """Task scratch folders in `tmp` (a namespace's TMPDIR) whose worker process is gone."""
    from miniswe.environments.processes import running

    found = []
    for owner in tmp.glob("miniswe-tasks-*/*/.owner"):
        with contextlib.suppress(OSError, ValueError):
            pid, _, start = owner.read_text().strip().partition(" ")
            if not running(int(pid), start):
                found.append(owner.parent)
    return found


def running_in(cluster: TwoNodeCluster, pids: list[int]) -> set[str]:
    """The tasks running in these processes: whose scratch folder (in the namespace's TMPDIR) one of them owns."""
    found = set()
    for owner in cluster.ns.tmp.glob("miniswe-tasks-*/*/.owner"):
        with contextlib.suppress(OSError, ValueError):
            if int(owner.read_text().partition(" ")[0]) in pids:  # "" while being written: ValueError
                found.add(owner.parent.name)
    return found


def copied_steps(run_dir: Path, task_id: str) -> int:
    """The steps in the driver's copy of a running task's trajectory."""
    try:
        return len(json.loads((run_dir / task_id / f"{task_id}.traj.json").read_text())["steps"])
    except (OSError, ValueError, KeyError):
        return 0


def nodes_of(run_dir: Path, task_id: str) -> set[str]:
    return set((run_dir / task_id / "workspace" / "nodes").read_text().split())


def test_spread_over_both_nodes_with_the_same_ledger_and_report_as_threads(cluster, work, server):
    steps = {f"t{i:02d}": 2 + i % 3 for i in range(12)}
    write_tasks(work, [task(i, s, sleep=0.1) for i, s in steps.items()])
    # run directories named alike: their paths are in the prompts, and so in the token counts
    scratch = set(cluster.ns.tmp.glob("miniswe-tasks-*/*"))
    threads = cluster.ns.run(*batch_argv(server, "run-t", "-w", "4", "-q"), cwd=work)
    assert threads.returncode == 0, threads.stderr
    code, out, err = finish(start_batch(cluster, work, server, "-w", "4", run_dir="run-r"))
    assert code == 0, err
    assert "**12 tasks**" in out
    ray_run, thread_run = work / "run-r", work / "run-t"
    ours, theirs = ledger(ray_run), ledger(thread_run)
    assert sorted(ours) == sorted(steps)
    for task_id, record in ours.items():
        other = theirs[task_id]
        assert {k: v for k, v in record.items() if k not in TIMING} == {k: v for k, v in other.items() if k not in TIMING}
        assert record["steps"] == steps[task_id] and record["submission"] == f"patch of {task_id}\n"
        data, same = trajectory(ray_run, record), trajectory(thread_run, other)
        assert [s["command"] for s in data["steps"]] == [s["command"] for s in same["steps"]]
        assert [s["output"] for s in data["steps"]] == [s["output"] for s in same["steps"]]
        assert data["environment"]["cwd"] == str(ray_run / task_id / "workspace")
    # on both nodes: each Ray node named in the trajectories, and each node's NODE seen by the commands
    assert len({trajectory(ray_run, r)["metadata"]["ray_node"] for r in ours.values()}) == 2
    assert set().union(*(nodes_of(ray_run, i) for i in steps)) == {"head", "worker"}
    assert json.loads((ray_run / "preds.json").read_text()) == json.loads((thread_run / "preds.json").read_text())
    reports = [json.loads(cluster.ns.run(sys.executable, "-m", "miniswe", "report", str(run), "--json").stdout)
               for run in (ray_run, thread_run)]
    for report in reports:
        report.pop("wall_s"), report.pop("time")  # timings
    assert reports[0] == reports[1]
    run_json = json.loads((ray_run / "run.json").read_text())
    assert run_json["status"] == "finished" and run_json["options"]["executor"] == "ray"
    assert len(server.requests) == 2 * sum(steps.values())
    assert set(cluster.ns.tmp.glob("miniswe-tasks-*/*")) <= scratch, "scratch folders left on the nodes"


def test_a_node_killed_mid_batch_loses_only_its_running_tasks_and_a_rerun_finishes(cluster, work, server):
    write_tasks(work, [task(f"t{i}", 8, sleep=0.5) for i in range(8)])
    run = work / "run"
    proc = start_batch(cluster, work, server, "-w", "4")
    # a task resumes from the latest copy of its trajectory the driver holds: kill once the second node runs two
    # tasks, each with a copy that has a step (how soon one arrives depends on the machine's load)
    on_worker = lambda: running_in(cluster, descendants(cluster.nodes["worker"].pid))  # noqa: E731
    wait_for(lambda: len(running := on_worker()) >= 2 and all(copied_steps(run, i) for i in running))
    lost = running_in(cluster, cluster.kill_node("worker"))  # what it ran when it died
    code, out, err = finish(proc)
    assert code == 3, err  # infrastructure failures
    records = ledger(run)
    assert len(records) == 8
    failed = {i for i, r in records.items() if r["exit_status"] != "Submitted"}
    assert failed == lost
    for task_id in failed:
        record = records[task_id]
        assert record["exit_status"] == "SandboxError" and "lost with its Ray worker or node" in record["exit_detail"]
        data = trajectory(run, record)
        assert data["exit_status"] == "SandboxError" and data["metadata"]["task_id"] == task_id

    cluster.start_worker()
    code, out, err = finish(start_batch(cluster, work, server, "-w", "4"))
    assert code == 0, err
    assert f"{8 - len(lost)} already done, {len(lost)} to run" in err
    records = ledger(run)
    assert {r["exit_status"] for r in records.values()} == {"Submitted"}
    # the lost tasks went on from their last trajectory copies (no verdict: resumed, not started over)
    assert all(records[i]["attempt"] == 1 and trajectory(run, records[i])["resumes"] for i in lost)
    assert not orphaned_scratch(cluster.ns.tmp), "the dead node's scratch folders were not swept by the next batch"


def test_driver_killed_then_resumed_loses_and_repeats_nothing(cluster, work, server):
    write_tasks(work, [task(f"t{i:02d}", 4, sleep=0.05) for i in range(16)])
    run = work / "run"
    proc = start_batch(cluster, work, server, "-w", "4")
    wait_for(lambda: len(ledger(run)) >= 3)
    proc.kill()
    proc.wait()
    before = (run / "results.jsonl").read_text().splitlines()
    finished = [json.loads(line)["id"] for line in before]
    assert 3 <= len(finished) < 16
    kept = {i: (run / i / f"{i}.traj.json").read_bytes() for i in finished}
    # the driver's latest copies of the tasks in flight (copied as their steps completed)
    in_flight = {path.parent.name: json.loads(path.read_text())["steps"] for path in run.glob("*/*.traj.json")
                 if path.parent.name not in finished}
    # the dead driver's tasks stop with it (Ray ends its job's workers; they also see the hub gone)
    counts = []
    wait_for(lambda: counts.append(len(server.requests)) or (len(counts) > 20 and counts[-1] == counts[-20]), timeout=30)
    served = counts[-1]

    code, out, err = finish(start_batch(cluster, work, server, "-w", "4"))
    assert code == 0, err
    after = (run / "results.jsonl").read_text().splitlines()
    assert after[: len(before)] == before
    records = ledger(run)
    assert sorted(records) == [f"t{i:02d}" for i in range(16)]
    assert all(r["exit_status"] == "Submitted" for r in records.values())
    # tasks in flight went on from their copies, every copied step kept (their workspaces went on past the
    # copies: steps may be more or fewer than 4); no task made more calls than running it afresh would
    for task_id, steps in in_flight.items():
        assert trajectory(run, records[task_id])["steps"][: len(steps)] == steps
    assert all(r["steps"] == 4 for i, r in records.items() if i not in in_flight)
    assert len(server.requests) - served <= 4 * (16 - len(finished))
    assert all((run / i / f"{i}.traj.json").read_bytes() == data for i, data in kept.items())
    assert not orphaned_scratch(cluster.ns.tmp)


def test_a_429_on_one_node_pauses_every_task_on_both(cluster, work):
    server = Server(cluster.ns, work, [COUNTER] * 8 + [{"status": 429, "retry_after": 1.5}])
    try:
        write_tasks(work, [task(f"t{i}", 12) for i in range(4)])
        code, out, err = finish(start_batch(cluster, work, server, "-w", "4"))
        assert code == 0, err
        times = sorted(r["received"] for r in server.requests)
        assert len(times) == 4 * 12 + 1
        # unpaused, the three other tasks would go on calling every few ms; paused, a quiet stretch of about
        # Retry-After holds at most the calls already on their way (and none of those four can be the next)
        quiet = max(times[i + 4] - times[i] for i in range(len(times) - 4))
        assert quiet >= 1.2, quiet
        records = ledger(work / "run")
        assert {r["exit_status"] for r in records.values()} == {"Submitted"}
        retries = sorted(trajectory(work / "run", r)["usage"]["retries"] for r in records.values())
        assert retries == [0, 0, 0, 1]
        assert len({trajectory(work / "run", r)["metadata"]["ray_node"] for r in records.values()}) == 2
    finally:
        server.stop()


def test_max_concurrent_calls_caps_calls_in_flight_across_nodes(cluster, work):
    server = Server(cluster.ns, work, latency=0.1)
    try:
        write_tasks(work, [task(f"t{i}", 3) for i in range(4)])
        code, out, err = finish(start_batch(cluster, work, server, "-w", "4", "--max-concurrent-calls", "1"))
        assert code == 0, err
        received = sorted(r["received"] for r in server.requests)
        assert len(received) == 12
        # one call at a time: each is sent after the one before was answered (0.1 s); uncapped, four go at once
        assert min(b - a for a, b in zip(received, received[1:])) >= 0.09
        assert len({trajectory(work / "run", r)["metadata"]["ray_node"] for r in ledger(work / "run").values()}) == 2
    finally:
        server.stop()


def test_batch_budget_stops_tasks_on_every_node(cluster, work, server):
    write_tasks(work, [task(f"t{i}", 8, sleep=0.2) for i in range(8)])
    code, out, err = finish(start_batch(cluster, work, server, "-w", "4", "--batch-token-limit", "6000"))
    assert code == 1, err  # a budget left the batch unfinished
    records = ledger(work / "run")
    assert 4 <= len(records) < 8
    for record in records.values():
        assert record["exit_status"] == "LimitsExceeded" and record["steps"] < 8
        assert record["exit_detail"].startswith("batch_token_limit:")
    assert "task(s) not run (batch_token_limit" in err
    assert json.loads((work / "run" / "run.json").read_text())["status"] == "incomplete"
    assert set().union(*(nodes_of(work / "run", i) for i in records)) == {"head", "worker"}


def test_sigint_twice_stops_every_node_at_once_and_kills_running_commands(cluster, work):
    sleeper = act('echo "$NODE" >> nodes; echo $$ > pid; sleep 60')
    server, proc = Server(cluster.ns, work, default=sleeper), None
    try:
        write_tasks(work, [task(f"t{i}") for i in range(6)])
        run = work / "run"
        proc = start_batch(cluster, work, server, "-w", "4")
        wait_for(lambda: len(list(run.glob("*/workspace/pid"))) == 4)
        assert set().union(*(nodes_of(run, p.parent.parent.name) for p in run.glob("*/workspace/pid"))) == {"head", "worker"}
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        read_until(proc.stderr, "starting no new task")  # the first is taken before the second is sent
        proc.send_signal(signal.SIGINT)
        code, out, err = finish(proc, timeout=60)
        assert code == 130, err
        assert time.monotonic() - started < 10
        records = ledger(run)
        assert len(records) == 4 and {r["exit_status"] for r in records.values()} == {"Interrupted"}
        for record in records.values():
            assert trajectory(run, record)["exit_status"] == "Interrupted"
        for pid_file in run.glob("*/workspace/pid"):
            with pytest.raises(ProcessLookupError):
                os.kill(int(pid_file.read_text()), 0)
    finally:
        stop(proc)
        server.stop()


def test_resources_no_node_offers_or_an_address_that_does_not_answer_run_nothing(cluster, work, server):
    write_tasks(work, [task("a")])
    code, out, err = finish(start_batch(cluster, work, server, "--ray-resources", "dokcer=1"))
    assert code == 3, err
    assert f"miniswe: no node of the Ray cluster at {cluster.address} offers dokcer=1 (they offer CPU," in err
    assert "start nodes with e.g. `ray start --resources" in err
    started = time.monotonic()
    proc = cluster.ns.popen(*batch_argv(server, "run", "--executor", "ray", "--ray-address", "127.0.0.1:1"), cwd=work,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    code, out, err = finish(proc)
    assert code == 3 and time.monotonic() - started < 15
    assert err == ("miniswe: cannot connect to the Ray cluster at 127.0.0.1:1: connection refused; check --ray-address "
                   "(no task was run)\n")
    assert not (work / "run").exists() and not server.requests


def docker_problem() -> str | None:
    if not shutil.which("docker"):
        return "no `docker` on PATH"
    try:
        found = subprocess.run(["docker", "image", "inspect", "miniswe-test:latest"], capture_output=True, timeout=20)
    except subprocess.TimeoutExpired:
        return "`docker image inspect` hung"
    return None if found.returncode == 0 else "no Docker engine with image miniswe-test:latest (.ci/docker-engine start)"


def test_sigint_twice_leaves_no_container_on_any_node(cluster, work):
    """Docker tasks on both nodes, stopped at once: every container is gone when the driver exits."""
    problem = docker_problem()
    if problem:
        if os.environ.get("MINISWE_REQUIRE_DOCKER"):
            raise AssertionError(f"MINISWE_REQUIRE_DOCKER is set: {problem}")
        pytest.skip(problem)
    tag = f"raystop{time.monotonic_ns()}"
    server = Server(cluster.ns, work, default=act("echo started > /tmp/started; sleep 60"))

    def started(container: str) -> bool:
        return subprocess.run(["docker", "exec", container, "test", "-f", "/tmp/started"], capture_output=True,
                              timeout=30).returncode == 0

    proc = None
    try:
        write_tasks(work, [task(f"{tag}-{i}", env={"image": "miniswe-test:latest"}) for i in range(4)])
        run = work / "run"
        proc = start_batch(cluster, work, server, "-w", "4")

        def ours() -> list[str]:
            listing = subprocess.run(["docker", "ps", "-a", "--filter", "label=miniswe.run", "--format",
                                      '{{.ID}} {{.Label "miniswe.run"}}'], capture_output=True, text=True, timeout=30)
            return [line.split()[0] for line in listing.stdout.splitlines() if tag in line]

        wait_for(lambda: len(server.requests) >= 4 and len(ours()) == 4, timeout=90)
        wait_for(lambda: all(started(container) for container in ours()))  # each container's command runs
        proc.send_signal(signal.SIGINT)
        read_until(proc.stderr, "starting no new task")
        proc.send_signal(signal.SIGINT)
        code, out, err = finish(proc, timeout=60)
        assert code == 130, err
        records = ledger(run)
        assert len(records) == 4 and {r["exit_status"] for r in records.values()} == {"Interrupted"}
        assert len({trajectory(run, r)["metadata"]["ray_node"] for r in records.values()}) == 2
        assert ours() == [], "a container outlived the stop"
    finally:
        stop(proc)
        server.stop()


def test_each_node_pulls_its_tasks_images_through_its_own_pool(cluster, work):
    """Docker tasks whose images come from a loopback registry (tests/registry.py): each node's tasks take their
    image from that node's pool (an actor pinned there), which pulls it and records what each task waited."""
    import registry as reg

    problem = docker_problem() or reg.problem()
    if problem:
        if os.environ.get("MINISWE_REQUIRE_DOCKER"):
            raise AssertionError(f"MINISWE_REQUIRE_DOCKER is set: {problem}")
        pytest.skip(problem)
    registry = reg.Registry(reg.seeded_data())
    proxy = reg.Proxy(registry.port)
    proxy.blob_delay = 0.5
    server = Server(cluster.ns, work)
    proc = None
    try:
        tags = ["img0", "img1", "img0", "img1"]
        write_tasks(work, [{"id": f"pull-{i}", "task": "count to 2",
                            "env": {"image": proxy.image(tag), "env": {"STEPS": "2", "SLEEP": "0.5"}}}
                           for i, tag in enumerate(tags)])
        proc = start_batch(cluster, work, server, "-w", "4")
        code, out, err = finish(proc, timeout=240)
        assert code == 0, err
        run = work / "run"
        records = ledger(run)
        assert {r["exit_status"] for r in records.values()} == {"Submitted"} and len(records) == 4
        assert {r["id"]: r["image"]["name"] for r in records.values()} == {f"pull-{i}": proxy.image(t) for i, t in enumerate(tags)}
        assert {r["image"]["wait"] for r in records.values()} <= {"pull", "none"}
        assert any(r["image"]["wait"] == "pull" and r["image"]["pull_s"] >= 0.4 for r in records.values())
        assert len({trajectory(run, r)["metadata"]["ray_node"] for r in records.values()}) == 2
        # the nodes share this machine's engine: an image one node pulled is there for the other
        summary = json.loads((run / "run.json").read_text())["invocations"][-1]["images"]
        assert 2 <= summary["pulls"] <= 4 and summary["failed"] == 0
        pulled = [json.loads(line) for line in (run / "images.jsonl").read_text().splitlines()]
        assert {e["image"] for e in pulled if e["event"] == "pulled"} == {proxy.image("img0"), proxy.image("img1")}
        assert sorted(proxy.present()) == sorted({proxy.image(t) for t in tags}), "no budget: the images stay"
    finally:
        stop(proc)
        server.stop()
        proxy.close()
        registry.close()


LOOPBACK = re.compile(r"^(127\.\d+\.\d+\.\d+|\[?::1\]?|\[?::ffff:127\.\d+\.\d+\.\d+\]?)$")


@PRIVATE
def test_a_private_cluster_stays_on_loopback_and_leaves_nothing_behind(tmp_path):
    """No --ray-address: miniswe starts a cluster of its own. Beside a non-loopback interface that holds the default
    route, it listens on loopback only, sends not one packet through that interface, and removes its temp dir."""
    ns = LoopbackNamespace(tmp_path / "home", second_interface=True)
    server = None
    try:
        server = Server(ns, tmp_path, default=act('echo "$HOME" > home; sleep 1; echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT'))
        write_tasks(tmp_path, [task(f"t{i}") for i in range(3)])
        before = set(Path("/tmp").glob("miniswe-ray-*"))
        assert ns.sent_outside() == 0
        proc = ns.popen(*batch_argv(server, "run", "--executor", "ray", "-w", "3"), cwd=tmp_path, stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, text=True)
        listening: list[str] = []
        temp_dirs: list[Path] = []

        def tasks_running() -> bool:
            if len(list((tmp_path / "run").glob("*/workspace/home"))) < 3:
                return False
            listening.extend(ns.run("ss", "-ltnH").stdout.splitlines())
            temp_dirs.append(private_temp_dir(ns, before))
            return True

        wait_for(tasks_running)
        code, out, err = finish(proc)
        assert code == 0, err
        assert "private Ray cluster on this machine" in err
        assert {r["exit_status"] for r in ledger(tmp_path / "run").values()} == {"Submitted"}
        # the tasks' commands see the user's HOME, not the one the cluster's processes got
        homes = {(tmp_path / "run" / f"t{i}" / "workspace" / "home").read_text().strip() for i in range(3)}
        assert homes == {str(tmp_path / "home")}
        addresses = {line.split()[3].rpartition(":")[0] for line in listening}
        assert len(listening) > 3 and all(LOOPBACK.match(address) for address in addresses), listening
        assert ns.sent_outside() == 0, "a packet left through the non-loopback interface"
        assert not temp_dirs[0].exists(), "the private cluster's temp dir is left"
        assert not (tmp_path / "home" / ".ray").exists(), "Ray wrote into the user's ~/.ray"
    finally:
        if server:
            server.stop()
        ns.close()


@PRIVATE
def test_a_private_cluster_left_by_a_killed_driver_is_cleared_by_the_next_run(tmp_path):
    """kill -9 of the driver takes its private cluster's core processes with it; what outlives it (Ray's agents,
    the temp dir) is removed when the batch is run again, which finishes it."""
    ns = LoopbackNamespace(tmp_path / "home")
    server = None
    try:
        server = Server(ns, tmp_path)
        write_tasks(tmp_path, [task(f"t{i}", 8, sleep=0.3) for i in range(3)])
        before = set(Path("/tmp").glob("miniswe-ray-*"))
        argv = batch_argv(server, "run", "--executor", "ray", "-w", "3", "-q")
        proc = ns.popen(*argv, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: len(list((tmp_path / "run").glob("*/workspace/.n"))) == 3)
        temp_dirs = {private_temp_dir(ns, before)}
        proc.kill()
        proc.wait()
        outlived = [pid for pid in ns.pids() if pid not in (ns.holder.pid, server.proc.pid)]
        # the cluster's watchdog kills what outlived the driver, and removes the temp dir, without waiting for a rerun
        wait_for(lambda: not any(alive(pid) for pid in outlived) and not any(d.exists() for d in temp_dirs), timeout=30)
        code, out, err = finish(ns.popen(*argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        assert code == 0, err
        records = ledger(tmp_path / "run")
        assert len(records) == 3 and {r["exit_status"] for r in records.values()} == {"Submitted"}
        assert not temp_dirs.pop().exists()
        for pid in outlived:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
    finally:
        if server:
            server.stop()
        ns.close()


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def private_temp_dir(ns: LoopbackNamespace, before: set[Path]) -> Path:
    """The temp dir (always in /tmp) of the private cluster running in `ns`: made since `before`, and named by its
    processes, as another test run on this machine may be making its own."""
    cmdlines = b""
    for pid in ns.pids():
        with contextlib.suppress(OSError):
            cmdlines += Path(f"/proc/{pid}/cmdline").read_bytes()
    (found,) = [path for path in set(Path("/tmp").glob("miniswe-ray-*")) - before if str(path).encode() in cmdlines]
    return found


def cluster_processes(ns: LoopbackNamespace, temp_dir: Path, exclude: set[int]) -> dict[int, bytes]:
    """The namespace's processes but `exclude`: the private cluster's, its agents too (Ray retitles them
    `ray::...`: their command lines name nothing) and its watchdog."""
    found = {}
    for pid in ns.pids():
        if pid not in exclude:
            with contextlib.suppress(OSError):
                found[pid] = Path(f"/proc/{pid}/cmdline").read_bytes()
    assert any(str(temp_dir).encode() in cmdline for cmdline in found.values()), found
    return found


def watchdog_notes(temp_dir: Path) -> set[int]:
    """The pids in the notes a private cluster's watchdog keeps of its processes (none before its first scan)."""
    try:
        lines = (temp_dir / MEMBERS).read_text().splitlines()
    except FileNotFoundError:
        return set()
    return {int(line.split()[0]) for line in lines if not line.startswith("scanned ")}


# Runs argv as its child and reaps it alone; orphans below it (PR_SET_CHILD_SUBREAPER) stay zombies.
NEVER_REAPS = """
import ctypes, os, sys, time
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)
pid = os.fork()
if pid == 0:
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # the pipe below is read for the pid alone
    os.execvp(sys.argv[1], sys.argv[1:])
print(pid, flush=True)
os.waitpid(pid, 0)
time.sleep(3600)
"""


@PRIVATE
def test_a_private_cluster_whose_driver_and_watchdog_were_killed_is_cleared_from_another_namespace(tmp_path):
    """kill -9 of the driver and of its watchdog in one user namespace: the next batch, run in another (where
    /proc/PID/fd of the first one's processes cannot be read), kills every process of the first cluster from
    the watchdog's notes and only then removes the temp dir. The first batch runs below a reaper that never
    reaps orphans (as a container's PID 1 may not): a killed watchdog stays a zombie, and is no less dead."""
    first, second = LoopbackNamespace(tmp_path / "home"), LoopbackNamespace(tmp_path / "home")
    servers, reaper = [], None
    try:
        servers.append(Server(first, tmp_path))
        write_tasks(tmp_path, [task(f"t{i}", 8, sleep=0.3) for i in range(2)])
        before = set(Path("/tmp").glob("miniswe-ray-*"))
        reaper = first.popen(sys.executable, "-c", NEVER_REAPS, *batch_argv(servers[0], "run", "--executor", "ray", "-w", "2", "-q"),
                             cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        driver = int(read_line(reaper.stdout, 30))
        wait_for(lambda: len(list((tmp_path / "run").glob("*/workspace/.n"))) == 2)
        temp_dir = private_temp_dir(first, before)
        watchdog = int((temp_dir / "watchdog").read_text().split()[0])
        exclude = {first.holder.pid, servers[0].proc.pid, watchdog, reaper.pid, driver}

        def noted() -> dict[int, bytes] | None:
            """The cluster's processes, once its agent runs and the watchdog's notes hold each one still running."""
            found, notes = cluster_processes(first, temp_dir, exclude), watchdog_notes(temp_dir)
            agent = any(cmdline.startswith(b"ray::DashboardAgent") for cmdline in found.values())
            return found if agent and all(pid in notes or not alive(pid) for pid in found) else None

        ours = waiting.wait_for(noted, "the cluster's DashboardAgent and every process of it in the watchdog's notes", 60)
        os.kill(watchdog, signal.SIGKILL)
        os.kill(driver, signal.SIGKILL)
        # the reaper reaps its own child, the driver: by then it has had its chance to reap the watchdog too
        wait_for(lambda: not Path(f"/proc/{driver}").exists() and not alive(watchdog))
        assert not alive(watchdog) and Path(f"/proc/{watchdog}").exists(), "the watchdog should be an unreaped zombie"
        assert any(alive(pid) for pid in ours), "nothing outlived the driver: the test shows nothing"
        servers.append(Server(second, tmp_path))
        code, out, err = finish(second.popen(*batch_argv(servers[1], "run", "--executor", "ray", "-w", "2"), cwd=tmp_path,
                                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        assert code == 0, err
        assert {r["exit_status"] for r in ledger(tmp_path / "run").values()} == {"Submitted"}
        assert not [(pid, cmdline) for pid, cmdline in ours.items() if alive(pid)], "a process of the first cluster is left"
        assert not temp_dir.exists()
    finally:
        for server in servers:
            server.stop()
        first.close()
        second.close()
        if reaper is not None:
            reaper.stdout.close()
            reaper.wait(10)


def test_a_scratch_folder_goes_when_ownerless_and_old_or_its_owner_is_gone(tmp_path, monkeypatch):
    """Kept: a young ownerless folder (being made), one whose owner lives (an older miniswe wrote the pid alone).
    Removed: an old ownerless one, one whose owner is a zombie, one whose owner's pid is now another process's."""
    from miniswe.batch import ray_worker
    from miniswe.environments.processes import process_start

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    root = tmp_path / "miniswe-tasks-abc"
    for name in ("old", "new", "owned", "owned-pid-only", "zombie", "reused"):
        (root / name).mkdir(parents=True)
    zombie = subprocess.Popen(["true"])
    waiting.wait_for(lambda: process_start(zombie.pid) is None)
    (root / "owned" / ".owner").write_text(f"{os.getpid()} {process_start(os.getpid())}")
    (root / "owned-pid-only" / ".owner").write_text(str(os.getpid()))
    (root / "zombie" / ".owner").write_text(str(zombie.pid))
    (root / "reused" / ".owner").write_text(f"{os.getpid()} 1")
    long_ago = time.time() - ray_worker.OWNERLESS_S - 10
    for name in ("old", "owned"):
        os.utime(root / name, (long_ago, long_ago))
    try:
        ray_worker._sweep_scratch()
    finally:
        zombie.wait()
    assert sorted(p.name for p in root.iterdir()) == ["new", "owned", "owned-pid-only"]
