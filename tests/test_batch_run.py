"""Real batches: local environment, real commands, the loopback scripted server, real files; signals and kill -9 on real processes."""

import io
import json
import re
import os
import signal
import shlex
import subprocess
import time

import pytest
import yaml
from conftest import act, clean_env, miniswe_cmd, read_until
from openai_server import ScriptedServer
from waiting import wait_for

from miniswe.batch.run import BatchOptions, run_batch
from miniswe.config import load_config
from miniswe.errors import UsageError
from miniswe.trajectory import load


def recorded(path: str) -> dict:
    return load(path).to_dict()

# Every task gets the same reply; a counter in the task's workspace makes it submit at step $STEPS,
# so the replies of a shared server can interleave between workers in any order. The counter is replaced,
# not rewritten in place: a kill -9 mid-command leaves the old count or the new one, never an empty file.
COUNTER = act(
    'n=$(( $(cat .n 2>/dev/null || echo 0) + 1 )); echo $n > .n.new; mv .n.new .n; sleep "${SLEEP:-0}"; '
    'if [ "$n" -ge "${STEPS:-3}" ]; then echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; echo "patch of $(basename "$(dirname "$PWD")")"; else echo "step $n"; fi'
)


def task(task_id, steps=3, sleep=0, **extra):
    return {"id": task_id, "task": f"count to {steps}", "env": {"env": {"STEPS": str(steps), "SLEEP": str(sleep)}}, **extra}


def write_tasks(path, tasks):
    path.write_text(yaml.safe_dump(tasks, sort_keys=False))
    return path


def config(server, **model):
    return load_config({
        "model": {"base_url": server.base_url, "name": "test-model", "retries": 2, "max_backoff": 0.01, **model},
        "agent": {"step_limit": 20}, "environment": {"timeout": 20},
    })


def batch(server, tasks_path, run_dir, **options):
    stream = io.StringIO()
    result = run_batch(config(server), BatchOptions(str(tasks_path), str(run_dir), **options), stream=stream)
    result.log = stream.getvalue()
    return result


def ledger(run_dir):
    return [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]


def by_id(run_dir):
    lines = ledger(run_dir)
    records = {r["id"]: r for r in lines}
    assert len(records) == len(lines), "one ledger line per task"
    return records


@pytest.fixture
def counting_server():
    with ScriptedServer(default=COUNTER, latency=0.005) as srv:
        yield srv


def test_many_tasks_on_several_workers(tmp_path, counting_server):
    steps = {f"t{i:02d}": 2 + i % 3 for i in range(12)}
    tasks = write_tasks(tmp_path / "tasks.yaml", [task(i, s) for i, s in steps.items()])
    result = batch(counting_server, tasks, tmp_path / "run", workers=4)
    run = tmp_path / "run"
    assert result.exit_code == 0 and result.ran == 12 and not result.not_started
    records = by_id(run)
    assert sorted(records) == sorted(steps)
    for task_id, record in records.items():
        assert record["exit_status"] == "Submitted" and record["steps"] == steps[task_id]
        assert record["submission"] == f"patch of {task_id}\n" and record["resolved"] is None
        data = recorded(str(run / record["trajectory"]))
        assert data["exit_status"] == "Submitted" and data["metadata"]["task_id"] == task_id
        assert data["environment"]["cwd"] == str(run / task_id / "workspace")
    assert len(counting_server.requests) == sum(steps.values())
    preds = json.loads((run / "preds.json").read_text())
    assert preds["t05"] == {"instance_id": "t05", "model_name_or_path": "test-model", "model_patch": "patch of t05\n"}
    assert len(preds) == 12
    run_json = json.loads((run / "run.json").read_text())
    assert run_json["status"] == "finished" and run_json["selected"] == 12 and run_json["model"]["name"] == "test-model"
    assert (run / "report.md").read_text() == result.markdown and "**12 tasks**" in result.markdown
    assert result.log.count(" Submitted ") == 12 and "[12/12]" in result.log


def test_the_debug_log_of_a_batch_names_each_entrys_task(tmp_path, counting_server, monkeypatch):
    log = tmp_path / "debug.log"
    monkeypatch.setenv("MINISWE_DEBUG", str(log))
    tasks = write_tasks(tmp_path / "tasks.yaml", [task("alpha", 2), task("beta", 2)])
    assert batch(counting_server, tasks, tmp_path / "run", workers=2).exit_code == 0
    headers = [line for line in log.read_text().splitlines() if line.startswith("--- miniswe debug")]
    assert len(headers) == 8, "a request and a response for each of the four calls"
    assert sum(" task alpha call " in h for h in headers) == 4 and sum(" task beta call " in h for h in headers) == 4


BROKEN_PLUGIN = """
from miniswe.environments.local import LocalEnvironment


class BrokenEnvironment(LocalEnvironment):
    def execute(self, command, *, timeout):
        raise RuntimeError("a bug in this environment plugin: no_such_field")
"""


def test_failing_tasks_are_recorded_and_the_batch_goes_on_then_rerun_retries_only_them(tmp_path, counting_server, monkeypatch):
    (tmp_path / "broken_plugin.py").write_text(BROKEN_PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    with ScriptedServer(default={"status": 500}) as failing:
        tasks = write_tasks(tmp_path / "tasks.yaml", [
            task("ok-1"), task("ok-2", 2),
            task("setup-fails", setup=["echo preparing", "echo broken >&2; exit 3"]),
            task("model-500", config={"model": {"base_url": failing.base_url}}),
            task("raises", env={"kind": "broken_plugin:BrokenEnvironment"}),
            task("eval-fails", eval="exit 1"),
            task("eval-passes", eval=["test -f .n", "grep -q 3 .n"]),
        ])
        first = batch(counting_server, tasks, tmp_path / "run", workers=3)
        records = by_id(tmp_path / "run")
        status = {i: r["exit_status"] for i, r in records.items()}
        assert status == {"ok-1": "Submitted", "ok-2": "Submitted", "setup-fails": "SetupError", "model-500": "ModelError",
                          "raises": "Error", "eval-fails": "Submitted", "eval-passes": "Submitted"}
        assert first.exit_code == 3
        assert records["setup-fails"]["exit_detail"] == "setup command 'echo broken >&2; exit 3' exited 3: broken"
        assert "answered 500" in records["model-500"]["exit_detail"] and "gave up after 3 attempts" in records["model-500"]["exit_detail"]
        assert "Traceback" in records["raises"]["exit_detail"] and "no_such_field" in records["raises"]["exit_detail"]
        assert (records["eval-fails"]["resolved"], records["eval-passes"]["resolved"], records["ok-1"]["resolved"]) == (False, True, None)
        assert len(failing.requests) == 3
        assert {f["id"] for f in first.report["infra_failures"]} == {"setup-fails", "model-500", "raises"}
        assert (first.report["resolved"], first.report["evaluated"]) == (1, 2)
        assert "Rerun only the 3 failed tasks" in first.markdown
        assert set(json.loads((tmp_path / "run" / "preds.json").read_text())) == {"ok-1", "ok-2", "eval-fails", "eval-passes"}

        served = len(counting_server.requests)
        again = batch(counting_server, tasks, tmp_path / "run", workers=3)
        assert again.exit_code == 3 and (again.ran, again.kept) == (3, 4)
        # only the rerun failures call the model again: "raises" gets as far as its first command
        assert len(counting_server.requests) == served + 1 and len(failing.requests) == 6
        records = by_id(tmp_path / "run")
        # a setup that failed and a bug start over; a run the endpoint broke goes on where it stopped
        assert {i for i, r in records.items() if r["attempt"] == 2} == {"setup-fails", "raises"}
        assert (tmp_path / "run" / "raises" / "raises.attempt1.traj.json").exists()
        resumed = recorded(str(tmp_path / "run" / records["model-500"]["trajectory"]))
        assert records["model-500"]["attempt"] == 1 and len(resumed["resumes"]) == 1
        assert not (tmp_path / "run" / "model-500" / "model-500.attempt1.traj.json").exists()
        history = (tmp_path / "run" / "results.history.jsonl").read_text().splitlines()
        assert sorted(json.loads(line)["id"] for line in history) == ["model-500", "raises", "setup-fails"]

        # --redo failed also reruns the agent's own failure (submitted, not resolved), in a fresh workspace
        redo = batch(counting_server, tasks, tmp_path / "run", workers=3, redo="failed")
        assert redo.ran == 4 and len(counting_server.requests) == served + 1 + 4
        assert by_id(tmp_path / "run")["eval-fails"]["steps"] == 3


def test_a_rerun_must_be_the_same_batch(tmp_path, counting_server):
    tasks = write_tasks(tmp_path / "tasks.yaml", [task("a", 1), task("b", 1)])
    assert batch(counting_server, tasks, tmp_path / "run").exit_code == 0
    again = batch(counting_server, tasks, tmp_path / "run")
    assert (again.ran, again.kept) == (0, 2) and "2 already done, 0 to run" in again.log
    write_tasks(tasks, [task("a", 1), task("b", 1), task("c", 1)])
    with pytest.raises(UsageError, match="holds a batch of another task file .*--force to continue"):
        batch(counting_server, tasks, tmp_path / "run")
    forced = batch(counting_server, tasks, tmp_path / "run", force=True)
    assert (forced.ran, forced.kept) == (1, 2)
    other_model = load_config({"model": {"base_url": counting_server.base_url, "name": "other-model"}})
    with pytest.raises(UsageError, match="with model 'test-model', not 'other-model'"):
        run_batch(other_model, BatchOptions(str(tasks), str(tmp_path / "run")), stream=io.StringIO())


def test_redo_by_id_and_all(tmp_path, counting_server):
    tasks = write_tasks(tmp_path / "tasks.yaml", [task("alpha", 1), task("beta", 1), task("gamma", 1)])
    batch(counting_server, tasks, tmp_path / "run")
    assert batch(counting_server, tasks, tmp_path / "run", redo="beta").ran == 1
    assert by_id(tmp_path / "run")["beta"]["attempt"] == 2
    assert batch(counting_server, tasks, tmp_path / "run", redo="all").ran == 3
    with pytest.raises(UsageError, match="--redo: no selected task has id 'betta' \\(did you mean 'beta'\\?\\)"):
        batch(counting_server, tasks, tmp_path / "run", redo="betta")
    # a redo that stops early (here: the batch budget, after the first task's first step) keeps the
    # earlier results of the tasks it did not get to
    before = by_id(tmp_path / "run")
    stopped = batch(counting_server, tasks, tmp_path / "run", redo="all", batch_token_limit=1)
    after = by_id(tmp_path / "run")
    assert stopped.ran == 1 and after["alpha"]["attempt"] == before["alpha"]["attempt"] + 1
    assert (after["beta"], after["gamma"]) == (before["beta"], before["gamma"])
    assert json.loads((tmp_path / "run" / "preds.json").read_text()).keys() == {"alpha", "beta", "gamma"}


def test_batch_budget_stops_running_tasks_and_starts_no_new_one(tmp_path, counting_server):
    tasks = write_tasks(tmp_path / "tasks.yaml", [task(f"t{i}", 6) for i in range(6)])
    result = batch(counting_server, tasks, tmp_path / "run", workers=2, batch_token_limit=3000)
    records = by_id(tmp_path / "run")
    # the batch is not done: exit 1, and the report says so
    assert result.exit_code == 1 and len(records) == 2 and len(result.not_started) == 4
    assert "**Incomplete:** 4 task(s) not run (batch_token_limit" in result.markdown
    for record in records.values():
        assert record["exit_status"] == "LimitsExceeded" and record["steps"] < 6
        assert record["exit_detail"].startswith("batch_token_limit:")
    assert "4 task(s) not run (batch_token_limit" in result.log
    assert json.loads((tmp_path / "run" / "run.json").read_text())["status"] == "incomplete"
    # a task the budget cut off never had its chance: the next run gives it one, with the untouched ones
    finish = batch(counting_server, tasks, tmp_path / "run", workers=2)
    assert (finish.ran, finish.kept) == (6, 0) and len(by_id(tmp_path / "run")) == 6


def test_swebench_instances_run_as_they_are_and_give_predictions_by_instance_id(tmp_path, counting_server):
    instances = [{"instance_id": f"org__repo-{i}", "repo": "org/repo", "base_commit": "abc", "problem_statement": f"Bug number {i}",
                  "patch": "gold", "FAIL_TO_PASS": "[]"} for i in range(3)]
    path = tmp_path / "lite.jsonl"
    path.write_text("".join(json.dumps(i) + "\n" for i in instances))
    result = batch(counting_server, path, tmp_path / "run", workers=3)
    assert result.exit_code == 0
    prompts = [r["body"]["messages"][1]["content"] for r in counting_server.requests if len(r["body"]["messages"]) == 2]
    assert sorted(p.split("</task>")[0].split("<task>")[1].strip() for p in prompts) == ["Bug number 0", "Bug number 1", "Bug number 2"]
    preds = json.loads((tmp_path / "run" / "preds.json").read_text())
    assert preds["org__repo-1"] == {"instance_id": "org__repo-1", "model_name_or_path": "test-model", "model_patch": "patch of org__repo-1\n"}
    meta = recorded(str(tmp_path / "run" / "org__repo-1" / "org__repo-1.traj.json"))["metadata"]
    assert meta["swebench"] == {"repo": "org/repo", "base_commit": "abc"}


def test_one_run_directory_serves_one_batch_at_a_time(tmp_path, counting_server):
    from miniswe.batch.rundir import RunDir

    tasks = write_tasks(tmp_path / "tasks.yaml", [task("a", 1)])
    holder = RunDir(str(tmp_path / "run"))
    holder.lock()
    try:
        with pytest.raises(UsageError, match="is in use by another miniswe batch"):
            batch(counting_server, tasks, tmp_path / "run")
    finally:
        holder.unlock()
    assert batch(counting_server, tasks, tmp_path / "run").exit_code == 0


def test_max_concurrent_calls_caps_calls_in_flight(tmp_path):
    with ScriptedServer(default=COUNTER, latency=0.1) as slow:
        tasks = write_tasks(tmp_path / "tasks.yaml", [task(f"t{i}", 2) for i in range(4)])
        started = time.monotonic()
        result = batch(slow, tasks, tmp_path / "run", workers=4, max_concurrent_calls=1)
        assert result.exit_code == 0
        assert time.monotonic() - started >= 8 * 0.1  # 8 calls, one at a time


# ---- real `miniswe batch` processes ----

def start_batch(tmp_path, server, *args):
    return subprocess.Popen(
        miniswe_cmd("batch", "tasks.yaml", "-o", "run", "--base-url", server.base_url, "-m", "test-model", *args),
        cwd=tmp_path, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
    )


def finish(proc, timeout=60):
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def ledger_lines(run_dir):
    try:
        return (run_dir / "results.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return []


@pytest.mark.parametrize("kill_after", [1, 7])
def test_kill_9_mid_run_then_rerun_loses_and_repeats_nothing(tmp_path, kill_after):
    run = tmp_path / "run"
    write_tasks(tmp_path / "tasks.yaml", [task(f"t{i:02d}", 4) for i in range(16)])
    with ScriptedServer(default=COUNTER, latency=0.02) as server:
        proc = start_batch(tmp_path, server, "-w", "4")
        wait_for(lambda: len(ledger_lines(run)) >= kill_after)
        proc.kill()
        proc.wait()
        before = ledger_lines(run)
        finished = [json.loads(line)["id"] for line in before]
        assert len(set(finished)) == len(finished) and 1 <= len(finished) < 16
        kept = {i: (run / i / f"{i}.traj.json").read_bytes() for i in finished}
        json.loads((run / "preds.json").read_text())  # valid JSON at any moment
        in_flight = {}
        for path in run.glob("*/*.traj.json"):
            data = json.loads(path.read_text())  # every trajectory too, in flight ones included
            if path.parent.name not in finished:
                in_flight[path.parent.name] = data["steps"]

        code, out, err = finish(start_batch(tmp_path, server, "-w", "4"))
        assert code == 0, err
        after = ledger_lines(run)
        assert after[: len(before)] == before
        records = [json.loads(line) for line in after]
        assert sorted(r["id"] for r in records) == [f"t{i:02d}" for i in range(16)]
        assert all(r["exit_status"] == "Submitted" for r in records)
        # tasks in flight went on where they were: every step kept, and no paid call made again but the one
        # each had in flight at the kill
        for task_id, steps in in_flight.items():
            assert recorded(str(run / task_id / f"{task_id}.traj.json"))["steps"][: len(steps)] == steps
        assert len(server.requests) <= 16 * 4 + len(in_flight)
        assert all((run / i / f"{i}.traj.json").read_bytes() == data for i, data in kept.items())
        assert len(json.loads((run / "preds.json").read_text())) == 16
        # done: the ledger's lines, and any finished run whose line the kill tore (taken from its trajectory)
        done = int(re.search(r"(\d+) already done", err)[1])
        assert len(finished) <= done and f"{done} already done, {16 - done} to run" in err


def test_a_429_pauses_every_worker_together(tmp_path):
    run = tmp_path / "run"
    write_tasks(tmp_path / "tasks.yaml", [task(f"t{i}", 12) for i in range(4)])
    with ScriptedServer([COUNTER] * 8 + [{"status": 429, "retry_after": 1}], default=COUNTER, latency=0.01) as server:
        proc = start_batch(tmp_path, server, "-w", "4")
        wait_for(lambda: server.pending == 0)  # the 429 has been served
        served = time.time()  # the server's clock: it stamps each request with time.time()
        code, out, err = finish(proc)
        assert code == 0, err
        # only calls already on their way when the 429 came back; unpaused, the others would make ~30
        during_pause = [r for r in server.requests if served < r["received"] <= served + 0.7]
        assert len(during_pause) <= 3, len(during_pause)
        assert len(server.requests) == 4 * 12 + 1
        records = by_id(run)
        assert {r["exit_status"] for r in records.values()} == {"Submitted"}
        retries = [recorded(str(run / r["trajectory"]))["usage"]["retries"] for r in records.values()]
        assert sorted(retries) == [0, 0, 0, 1]


def test_sigterm_once_stops_gracefully_and_a_rerun_finishes(tmp_path):
    run = tmp_path / "run"
    write_tasks(tmp_path / "tasks.yaml", [task(f"t{i}", 3, sleep=0.2) for i in range(8)])
    with ScriptedServer(default=COUNTER) as server:
        proc = start_batch(tmp_path, server, "-w", "3")
        wait_for(lambda: len(server.requests) >= 4)
        proc.send_signal(signal.SIGTERM)
        code, out, err = finish(proc)
        assert code == 143, err
        assert "SIGTERM: starting no new task" in err
        records = by_id(run)
        assert "Interrupted" in {r["exit_status"] for r in records.values()}
        assert len(records) < 8
        for record in records.values():
            data = recorded(str(run / record["trajectory"]))
            assert data["exit_status"] == record["exit_status"]
            if record["exit_status"] == "Interrupted":
                assert data["exit_detail"] == "SIGTERM"
        assert json.loads((run / "run.json").read_text())["status"] == "interrupted"
        assert "Interrupted" in out  # the report is still printed

        code, out, err = finish(start_batch(tmp_path, server, "-w", "3"))
        assert code == 0, err
        records = by_id(run)
        assert len(records) == 8 and {r["exit_status"] for r in records.values()} == {"Submitted"}


def test_sigint_twice_stops_at_once_and_kills_running_commands(tmp_path):
    run = tmp_path / "run"
    sleeper = act("echo $$ > pid; sleep 30")
    write_tasks(tmp_path / "tasks.yaml", [task(f"t{i}") for i in range(4)])
    with ScriptedServer(default=sleeper) as server:
        proc = start_batch(tmp_path, server, "-w", "2")
        wait_for(lambda: len(list(run.glob("*/workspace/pid"))) == 2)
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        read_until(proc.stderr, "starting no new task")  # the first is taken before the second is sent
        proc.send_signal(signal.SIGINT)
        code, out, err = finish(proc, timeout=20)
        assert code == 130, err
        assert time.monotonic() - started < 5
        records = by_id(run)
        assert len(records) == 2 and {r["exit_status"] for r in records.values()} == {"Interrupted"}
        for record in records.values():
            data = recorded(str(run / record["trajectory"]))
            assert data["exit_status"] == "Interrupted"
            killed = data["steps"][-1]  # recorded as cut short, with what it had printed: not as an ordinary step
            assert killed["aborted"] == "SIGINT" and killed["returncode"] is None
        for pid_file in run.glob("*/workspace/pid"):
            pid = int(pid_file.read_text())
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)


def test_one_sigint_stops_tasks_waiting_out_a_rate_limit(tmp_path):
    run = tmp_path / "run"
    write_tasks(tmp_path / "tasks.yaml", [task(f"t{i}") for i in range(2)])
    with ScriptedServer(default={"status": 429, "retry_after": 30}) as server:
        proc = start_batch(tmp_path, server, "-w", "2")
        # a 429 answered: the shared pause then holds the other worker back too
        wait_for(lambda: any("answered" in r for r in server.requests))
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        code, out, err = finish(proc, timeout=20)
        assert code == 130, err
        assert time.monotonic() - started < 5, "waited out the Retry-After instead of stopping"
        assert {r["exit_status"] for r in by_id(run).values()} == {"Interrupted"}


def test_shards_are_disjoint_and_merge_into_one_run(tmp_path, cli, counting_server):
    write_tasks(tmp_path / "tasks.yaml", [task(f"t{i:02d}", 1) for i in range(12)])
    endpoint = ["--base-url", counting_server.base_url, "-m", "test-model"]
    shards = []
    for i in (1, 2, 3):
        result = cli("batch", "tasks.yaml", "--shard", f"{i}/3", "-o", f"shard{i}", *endpoint, "-q")
        assert result.returncode == 0, result.stderr
        shards.append({r["id"] for r in ledger(tmp_path / f"shard{i}")})
    assert set.union(*shards) == {f"t{i:02d}" for i in range(12)}
    assert sum(len(s) for s in shards) == 12

    merged = cli("merge", "shard1", "shard2", "shard3", "-o", "all", "--json")
    assert merged.returncode == 0, merged.stderr
    assert json.loads(merged.stdout)["tasks"] == 12
    assert len(by_id(tmp_path / "all")) == 12 and len(json.loads((tmp_path / "all" / "preds.json").read_text())) == 12
    assert all((tmp_path / "all" / r["trajectory"]).exists() for r in ledger(tmp_path / "all"))
    assert json.loads((tmp_path / "all" / "run.json").read_text())["merged_from"][0].endswith("shard1")
    assert "**12 tasks**" in (tmp_path / "all" / "report.md").read_text()

    again = cli("merge", "shard1", "shard2", "-o", "all")
    assert again.returncode == 2 and "already holds a run" in again.stderr
    conflicting = tmp_path / "conflict"
    conflicting.mkdir()
    line = json.loads(ledger_lines(tmp_path / "shard1")[0])
    (conflicting / "results.jsonl").write_text(json.dumps(dict(line, exit_status="LimitsExceeded")) + "\n")
    refused = cli("merge", "shard1", "conflict", "-o", "bad")
    assert refused.returncode == 2
    assert f"task {line['id']!r} has different results in" in refused.stderr and not (tmp_path / "bad").exists()


def test_cli_bad_input_runs_nothing(tmp_path, cli, counting_server):
    (tmp_path / "tasks.yaml").write_text("- {id: a, task: x}\n- {id: a, task: y}\n")
    result = cli("batch", "tasks.yaml", "-o", "run", "--base-url", counting_server.base_url, "-m", "m")
    assert result.returncode == 2
    assert result.stderr == "miniswe: tasks.yaml: line 2: id 'a' is already used at line 1; ids must be unique\n"
    assert not (tmp_path / "run").exists() and not counting_server.requests
    write_tasks(tmp_path / "tasks.yaml", [task("a")])
    no_model = cli("batch", "tasks.yaml", "-o", "run")
    assert no_model.returncode == 2 and "no model endpoint configured" in no_model.stderr
    assert cli("batch", "tasks.yaml", "--shard", "4/3").returncode == 2
    unreachable = cli("batch", "tasks.yaml", "-o", "run", "--base-url", "http://127.0.0.1:9/v1", "-m", "m")
    assert unreachable.returncode == 3 and not (tmp_path / "run").exists()
    assert unreachable.stderr == "miniswe: cannot reach http://127.0.0.1:9/v1: connection refused; check --base-url (no task was run)\n"


def test_cli_plain_progress_and_report(tmp_path, cli, counting_server):
    write_tasks(tmp_path / "tasks.yaml", [task("a", 1), task("b", 2, setup="exit 4")])
    result = cli("batch", "tasks.yaml", "--base-url", counting_server.base_url, "-m", "test-model", "-w", "2")
    assert result.returncode == 3
    assert (tmp_path / "trajectories" / "tasks" / "results.jsonl").exists()
    assert "] a Submitted · 1 steps" in result.stderr and "] b SetupError · 0 steps" in result.stderr
    assert "**2 tasks**" in result.stdout and "| `b` | SetupError | setup command 'exit 4' exited 4: |" in result.stdout
    assert "`miniswe batch tasks.yaml --base-url" in result.stdout and "-o trajectories/tasks`" in result.stdout


def test_a_pause_holds_back_callers_already_queued_for_a_slot():
    """With a cap on calls in flight, a Retry-After that arrives while others wait for a slot still applies."""
    import threading

    from miniswe.models.gate import CallGate
    from miniswe.signals import Stop

    gate, stop = CallGate(1), Stop()
    started: list[float] = []
    t0 = time.monotonic()

    def call(pause: float = 0.0):
        with gate.slot(stop):
            started.append(time.monotonic() - t0)
            if pause:
                time.sleep(0.1)
                gate.pause(pause)

    first = threading.Thread(target=call, args=(1.0,))
    first.start()
    wait_for(lambda: started)  # the first caller holds the one slot
    waiting = [threading.Thread(target=call) for _ in range(3)]
    for thread in waiting:
        thread.start()
    for thread in [first, *waiting]:
        thread.join(5)
    assert len(started) == 4
    assert min(started[1:]) >= 1.0, f"queued callers went ahead during the pause: {started}"


def test_merge_of_some_shards_says_which_are_missing(tmp_path, cli, counting_server):
    write_tasks(tmp_path / "tasks.yaml", [task(f"t{i:02d}", 1) for i in range(6)])
    endpoint = ["--base-url", counting_server.base_url, "-m", "test-model"]
    for i in (1, 3):
        assert cli("batch", "tasks.yaml", "--shard", f"{i}/3", "-o", f"shard{i}", *endpoint, "-q").returncode == 0
    merged = cli("merge", "shard1", "shard3", "-o", "part")
    assert merged.returncode == 0, merged.stderr
    assert "**Not merged:** shard(s) 2/3" in merged.stdout
    assert json.loads((tmp_path / "part" / "run.json").read_text())["missing_shards"] == ["2/3"]


def test_a_batch_whose_reader_went_away_still_finishes_and_records_its_end(tmp_path):
    """`miniswe batch ... 2>&1 >/dev/null | head -2`: the progress has nowhere to go after two lines."""
    write_tasks(tmp_path / "tasks.yaml", [task(f"t{i}", 2) for i in range(6)])
    with ScriptedServer(default=COUNTER) as server:
        command = shlex.join(miniswe_cmd("batch", "tasks.yaml", "-o", "run", "--base-url", server.base_url, "-m", "m"))
        done = subprocess.run(["bash", "-c", f"set -o pipefail; {command} 2>&1 >/dev/null | head -2"], cwd=tmp_path,
                              env=clean_env(), capture_output=True, text=True, timeout=120)
        assert len(done.stdout.splitlines()) == 2
        assert done.returncode == 0, done.stderr  # pipefail: miniswe's own exit code
    assert json.loads((tmp_path / "run" / "run.json").read_text())["status"] == "finished"
    assert len(by_id(tmp_path / "run")) == 6


def test_the_time_limit_bounds_setup_and_evaluation_too(server, tmp_path):
    """agent.time_limit is one deadline for setup, the agent and evaluation: a setup it cuts ends the run as
    TimeExceeded before the model is asked; an evaluation it cuts ends it as TimeExceeded, the submission kept
    and no verdict given."""
    tasks = write_tasks(tmp_path / "tasks.yaml", [
        task("slow-setup", steps=1, setup="sleep 30", eval="true"),
        task("slow-eval", steps=1, eval="sleep 30"),
    ])
    cfg = load_config({"model": {"base_url": server.base_url, "name": "test-model", "retries": 2, "max_backoff": 0.01},
                       "agent": {"step_limit": 20, "time_limit": 3}, "environment": {"timeout": 60}})
    server.push(COUNTER)
    started = time.monotonic()
    result = run_batch(cfg, BatchOptions(str(tasks), str(tmp_path / "run"), workers=2), stream=io.StringIO())
    assert time.monotonic() - started < 20, "neither sleep ran its 30 s"
    records = {r["id"]: r for r in ledger(tmp_path / "run")}
    setup = records["slow-setup"]
    assert setup["exit_status"] == "TimeExceeded" and "during setup" in setup["exit_detail"], setup
    assert setup["model_calls"] == 0, "the model was never asked: the time was up"
    evaluated = records["slow-eval"]
    assert evaluated["exit_status"] == "TimeExceeded" and "during evaluation" in evaluated["exit_detail"], evaluated
    assert evaluated["resolved"] is None and "patch of slow-eval" in evaluated["submission"]
    traj = recorded(str(tmp_path / "run" / "slow-eval" / "slow-eval.traj.json"))
    assert traj["evaluation"][0]["command"] == "sleep 30" and traj["evaluation"][0]["timed_out"]
    assert recorded(str(tmp_path / "run" / "slow-setup" / "slow-setup.traj.json"))["setup"][0]["timed_out"]
    assert len(server.requests) == 1 and result.exit_code == 0, "agent outcomes both"


def test_a_task_killed_mid_run_and_resumed_counts_its_whole_wall_time(tmp_path):
    """The ledger's and the report's wall time of a task whose trajectory went on after a kill -9 is the
    trajectory's: both attempts, as its tokens are; not only the resumed attempt's."""
    run = tmp_path / "run"
    write_tasks(tmp_path / "tasks.yaml", [task("slow", 6, sleep=0.4)])
    path = run / "slow" / "slow.traj.json"
    with ScriptedServer(default=COUNTER) as server:
        proc = start_batch(tmp_path, server)
        wait_for(lambda: path.exists() and len(recorded(str(path))["steps"]) >= 4, "four steps recorded")
        proc.kill()
        proc.wait()
        first = recorded(str(path))
        assert first["exit_status"] is None and not ledger_lines(run)
        first_wall = first["timing"]["wall_s"]  # as of the last save before the kill
        assert first_wall >= 4 * 0.4

        code, out, err = finish(start_batch(tmp_path, server))
        assert code == 0, err
        data = recorded(str(path))
        record = by_id(run)["slow"]
        assert record["exit_status"] == data["exit_status"] == "Submitted"
        assert len(data["resumes"]) == 1
        # the resumed attempt alone ran two or three steps (~1 s); the task as a whole took more
        assert record["wall_s"] == data["timing"]["wall_s"] >= first_wall + 0.4
        assert record["tokens"] == data["usage"]["total_tokens"] and record["model_s"] <= record["wall_s"]
        report = re.search(r"`slow` ([\d.]+)s", (run / "report.md").read_text())
        assert report and float(report[1]) == round(record["wall_s"], 1)
