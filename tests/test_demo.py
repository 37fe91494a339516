"""`miniswe demo`: the bundled task list, fixed for real through the batch runner, offline or against an endpoint."""

import json

import yaml
from conftest import ROOT
from openai_server import ScriptedServer

from miniswe.trajectory import load


def recorded(path: str) -> dict:
    return load(path).to_dict()

DEMO = ROOT / "config" / "demo"
TASKS = yaml.safe_load((DEMO / "tasks.yaml").read_text())


def check_run(run_dir, model_name):
    records = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in records) == sorted(t["id"] for t in TASKS)
    preds = json.loads((run_dir / "preds.json").read_text())
    for record in records:
        assert record["exit_status"] == "Submitted" and record["resolved"] is True, record
        assert preds[record["id"]]["model_patch"].startswith("diff --git a/")
        assert preds[record["id"]]["model_name_or_path"] == model_name
        data = recorded(str(run_dir / record["trajectory"]))
        assert [r["returncode"] for r in data["evaluation"]] == [0] * len(data["evaluation"])
    return records


def test_demo_fixes_every_bug_offline(cli, tmp_path):
    result = cli("demo", "-o", "run")
    assert result.returncode == 0, result.stderr
    assert "**4 tasks** · **resolved 4 of 4** with eval (100.0%)" in result.stdout
    assert "| Submitted | agent outcome | 4 | 100.0% |" in result.stdout
    check_run(tmp_path / "run", "scripted")
    # the bug really was there before: the first command of the leap-year task shows 1900 as a leap year
    steps = recorded(str(tmp_path / "run" / "leap-year" / "leap-year.traj.json"))["steps"]
    assert "[1900, 2000, 2024]" in steps[0]["output"] and "[2000, 2024]" in steps[1]["output"]


def test_demo_stays_offline_with_only_a_base_url_in_the_environment(cli, tmp_path):
    """The README has users export OPENAI_BASE_URL; without a model name the demo must still run offline."""
    result = cli("demo", "-o", "run", "-q", env={"OPENAI_BASE_URL": "http://127.0.0.1:9/v1"})
    assert result.returncode == 0, result.stderr
    check_run(tmp_path / "run", "scripted")


def test_demo_runs_again_into_a_fresh_directory(cli, tmp_path):
    first, second = cli("demo", "-q"), cli("demo", "-q")
    assert first.returncode == second.returncode == 0, second.stderr
    runs = sorted((tmp_path / "trajectories" / "demo").iterdir())
    assert len(runs) == 2
    assert first.stdout.strip() == f"4 tasks · Submitted 4 · resolved 4/4 · {runs[0]}"
    for run in runs:
        check_run(run, "scripted")


def test_demo_against_an_endpoint_uses_the_real_model_client(cli, tmp_path):
    replies = [reply for t in TASKS for reply in yaml.safe_load((DEMO / "replies" / f"{t['id']}.yaml").read_text())]
    with ScriptedServer(replies) as server:
        result = cli("demo", "--base-url", server.base_url, "-m", "demo-model", "-w", "1", "-o", "run")
        assert result.returncode == 0, result.stderr
        assert len(server.requests) == len(replies) and server.requests[0]["body"]["model"] == "demo-model"
    check_run(tmp_path / "run", "demo-model")
