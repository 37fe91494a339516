"""The ledger (results.jsonl), preds.json and the report, from known files."""

import json

import pytest

from miniswe.batch.ledger import Ledger, LedgerRecord, read_records
from miniswe.batch.report import build_report, render_markdown
from miniswe.batch.rundir import predictions


def record(task_id, status, *, resolved=None, has_eval=True, steps=1, tokens=0, cost=0.0, wall_s=0.0, submission=None, detail=None):
    return LedgerRecord(task_id, status, detail, resolved=resolved, has_eval=has_eval, steps=steps, tokens=tokens, cost=cost,
                        wall_s=wall_s, trajectory=f"{task_id}/{task_id}.traj.json", submission=submission, model="m")


KNOWN = [
    record("a", "Submitted", resolved=True, steps=4, tokens=1000, cost=0.01, wall_s=10, submission="diff a"),
    record("b", "Submitted", resolved=False, steps=6, tokens=3000, cost=0.03, wall_s=20, submission="diff b"),
    record("c", "LimitsExceeded", resolved=False, steps=10, tokens=5000, cost=0.05, wall_s=30),
    record("d", "ModelError", steps=2, tokens=200, cost=0.002, wall_s=5, detail="Traceback (most recent call last):\n  ...\nendpoint answered 500"),
    record("e", "Submitted", has_eval=False, steps=3, tokens=800, cost=0.0, wall_s=1, submission="diff e"),
]


def write_ledger(path, records, tail=""):
    path.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in records) + tail)


def test_report_numbers_from_a_known_ledger(tmp_path):
    older_b = record("b", "Interrupted", steps=99, tokens=99999, wall_s=999)
    write_ledger(tmp_path / "results.jsonl", [older_b] + KNOWN, tail='{"id": "f", "exit_st')
    records = list(read_records(str(tmp_path / "results.jsonl")).values())
    report = build_report(records)
    assert list(report) == ["tasks", "by_status", "resolved", "evaluated", "resolved_rate", "steps", "tokens", "cost", "wall_s",
                            "infra_failures", "grading", "time", "images"]
    assert report["images"] is None  # no image was pulled by the batch's pools
    assert report["grading"] is None  # nothing was graded by the SWE-bench harness
    assert report["tasks"] == 5
    assert report["by_status"] == {"Submitted": 3, "LimitsExceeded": 1, "ModelError": 1}
    assert (report["resolved"], report["evaluated"], report["resolved_rate"]) == (1, 4, 0.25)
    assert report["steps"] == {"mean": 5.0, "median": 4.0, "p90": pytest.approx(8.4), "max": 10.0}
    assert report["tokens"] == {"mean": 2000.0, "median": 1000.0, "p90": pytest.approx(4200.0), "max": 5000.0}
    assert report["cost"] == {"mean": pytest.approx(0.0184), "median": 0.01, "p90": pytest.approx(0.042), "max": 0.05}
    assert report["wall_s"] == {"mean": pytest.approx(13.2), "median": 10.0, "p90": pytest.approx(26.0), "max": 30.0}
    assert report["infra_failures"] == [{"id": "d", "exit_status": "ModelError", "detail": "endpoint answered 500", "trajectory": "d/d.traj.json"}]


def test_markdown_report(tmp_path):
    report = build_report(KNOWN)
    text = render_markdown(report, KNOWN, {"command": "miniswe batch t.yaml -o run", "model": {"name": "m"}}, "run")
    assert "**5 tasks** · **resolved 1 of 4** with eval (25.0%)" in text
    assert "| Submitted | agent outcome | 3 | 60.0% |" in text and "| ModelError | infrastructure | 1 | 20.0% |" in text
    assert "| steps | 5.0 | 4.0 | 8.4 | 10.0 |" in text
    assert "Slowest: `c` 30.0s, `b` 20.0s" in text and "Most expensive: `c` $0.0500" in text
    assert "## Infrastructure failures (1)" in text and "| `d` | ModelError | endpoint answered 500 |" in text
    assert "Rerun only the 1 failed tasks (finished ones are kept): `miniswe batch t.yaml -o run`" in text


def test_empty_report():
    report = build_report([])
    assert report["tasks"] == 0 and report["resolved_rate"] is None and report["steps"]["mean"] is None
    assert "No task has finished yet." in render_markdown(report, [], None, "run")


def test_a_torn_last_line_is_dropped_and_cut_off_before_appending(tmp_path):
    path = tmp_path / "results.jsonl"
    write_ledger(path, KNOWN[:2], tail='{"id": "c", "exit_status": "Subm')
    ledger = Ledger(str(tmp_path))
    assert list(ledger.records) == ["a", "b"]
    assert ledger.append(KNOWN[2]) and not ledger.append(KNOWN[2])  # once per invocation
    lines = path.read_text().splitlines()
    assert [json.loads(line)["id"] for line in lines] == ["a", "b", "c"]


def test_a_whole_record_without_its_newline_is_kept(tmp_path):
    path = tmp_path / "results.jsonl"
    write_ledger(path, KNOWN[:1], tail=json.dumps(KNOWN[1].to_dict()))
    ledger = Ledger(str(tmp_path))
    ledger.append(KNOWN[2])
    assert [json.loads(line)["id"] for line in path.read_text().splitlines()] == ["a", "b", "c"]


def test_garbage_in_the_middle_is_skipped_with_a_warning(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(KNOWN[0].to_dict()) + "\nnot json\n" + json.dumps(KNOWN[1].to_dict()) + "\n")
    warnings = []
    assert list(read_records(str(path), warn=warnings.append)) == ["a", "b"]
    assert warnings == [f"{path}: line 2 is not a task record; ignored"]


def test_compaction_moves_superseded_lines_to_history_and_keeps_one_line_per_task(tmp_path):
    write_ledger(tmp_path / "results.jsonl", [record("b", "Interrupted"), record("d", "Error")] + KNOWN)
    ledger = Ledger(str(tmp_path))
    assert list(ledger.records) == ["a", "b", "c", "d", "e"]
    ledger.append(record("a", "Submitted", steps=7))
    ledger.compact()
    lines = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [r["id"] for r in lines] == ["b", "c", "d", "e", "a"] and lines[-1]["steps"] == 7
    history = [json.loads(line) for line in (tmp_path / "results.history.jsonl").read_text().splitlines()]
    assert [(r["id"], r["exit_status"]) for r in history] == [("b", "Interrupted"), ("d", "Error"), ("a", "Submitted")]
    ledger.compact()  # nothing superseded: nothing moves
    assert len((tmp_path / "results.history.jsonl").read_text().splitlines()) == 3


def test_predictions_cover_agent_outcomes_with_empty_patches_when_not_submitted():
    preds = predictions(KNOWN + [record("g", "Interrupted"), record("h", "TimeExceeded")])
    assert list(preds) == ["a", "b", "c", "e", "h"]
    assert preds["a"] == {"instance_id": "a", "model_name_or_path": "m", "model_patch": "diff a"}
    assert preds["c"]["model_patch"] == "" and preds["h"]["model_patch"] == ""


def swebench_load(path):
    """What swebench.harness.utils.get_predictions_from_file does with a .json file (swebench 5.x)."""
    with open(path) as handle:
        predictions = json.load(handle)
    if isinstance(predictions, dict):
        predictions = list(predictions.values())
    assert isinstance(predictions, list)
    for pred in predictions:
        assert isinstance(pred, dict) and "instance_id" in pred
    return predictions


def test_preds_json_loads_like_swebench_does(tmp_path):
    path = tmp_path / "preds.json"
    path.write_text(json.dumps(predictions(KNOWN)))
    loaded = swebench_load(path)
    by_id = {p["instance_id"]: p for p in loaded}
    assert {k for k, v in by_id.items() if v["model_patch"] == ""} == {"c"}  # the harness skips empty patches
    assert all(isinstance(p["model_name_or_path"], str) for p in loaded)
    try:
        from swebench.harness.utils import get_predictions_from_file
    except Exception:
        return  # the real package is optional; the loop above mirrors its checks
    assert get_predictions_from_file(str(path), "SWE-bench/SWE-bench_Lite", "test") == loaded


def test_report_command_json_and_markdown(tmp_path, cli):
    run = tmp_path / "run"
    run.mkdir()
    write_ledger(run / "results.jsonl", KNOWN)
    result = cli("report", "run", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == json.loads(json.dumps(build_report(KNOWN)))
    text = cli("report", "run")
    assert text.returncode == 0 and "resolved 1 of 4" in text.stdout
    missing = cli("report", "nope")
    assert missing.returncode == 2 and missing.stderr.strip() == "miniswe: nope: no such run directory"
    (tmp_path / "empty").mkdir()
    empty = cli("report", "empty")
    assert empty.returncode == 2 and "not a miniswe batch run directory" in empty.stderr
