"""A trajectory that is JSON but holds a wrong type somewhere: every reader (inspect, replay, run --resume, chat's
/load) refuses it in one line naming the file and the field, or reads it where the field is optional, and none
of them crashes. Every field of a real recorded run is mutated to each JSON type it does not hold."""

from __future__ import annotations

import json
import subprocess

import pytest

from conftest import clean_env, python_cmd
from replies import SUBMIT, act

WRONG = {"string": "x", "number": 7, "list": ["x"], "mapping": {"x": 1}, "null": None}

# Runs in one child process: each mutation through the CLI's own entry (typer's command, in-process), so an
# exception escaping a command is seen as the traceback it would be, and 1,000 commands take a minute, not ten.
DRIVER = r"""
import contextlib, copy, io, json, os, shutil, sys, traceback
import typer
from miniswe.cli import app

base, script, out = sys.argv[1:4]
mutations = json.loads(sys.argv[4])
document = json.load(open(base))
command = typer.main.get_command(app)
folder = os.path.join(os.path.dirname(base), "mutated")
results = []
for path, name, value in mutations:
    mutated = copy.deepcopy(document)
    node = mutated
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    for what in ("inspect", "replay", "resume"):
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(os.path.join(folder, "work"))
        target = os.path.join(folder, "t.json")
        with open(target, "w") as handle:
            json.dump(mutated, handle)
        args = {"inspect": ["inspect", target, "--no-pager"],
                "replay": ["replay", target, "--cwd", os.path.join(folder, "work"), "-q"],
                "resume": ["run", "--resume", target, "--script", script, "-q"]}[what]
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            try:
                code = command.main(args, prog_name="miniswe", standalone_mode=False)
                code = code if isinstance(code, int) else 0
            except SystemExit as exit:
                code = exit.code
            except BaseException:
                code = "crash"
                stderr.write(traceback.format_exc())
        results.append({"field": path, "type": name, "command": what, "code": code, "stderr": stderr.getvalue(),
                        "file": target})
with open(out, "w") as handle:
    json.dump(results, handle)
"""


def json_type(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "list", dict: "mapping"}[type(value)]


def fields(node, path=()):
    """Every field's path: each key of each mapping, and the first item of each list (the rest are alike)."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield [*path, key], value
            yield from fields(value, [*path, key])
    elif isinstance(node, list) and node:
        yield [*path, 0], node[0]
        yield from fields(node[0], [*path, 0])


@pytest.fixture
def recorded(cli, tmp_path):
    """A real run that ended without a verdict (its script ran out), resumed once and cut off again: steps, a
    format error, a resume; with the optional sections a run may have besides (setup, warnings, a parent, a
    compaction), as miniswe writes them."""
    (tmp_path / "work").mkdir()
    first = tmp_path / "first.json"
    first.write_text(json.dumps([act("echo one"), "no block here"]))
    assert cli("run", "t", "--script", str(first), "--cwd", "work", "-o", "t.json", "-q").returncode == 3
    second = tmp_path / "second.json"
    second.write_text(json.dumps(["", "", act("echo two")]))  # the resumed run's model is asked for its third reply
    resumed = cli("run", "--resume", "t.json", "--script", str(second), "-q")
    assert resumed.returncode == 3, resumed.stderr
    path = tmp_path / "t.json"
    data = json.loads(path.read_text())
    assert data["exit_status"] == "ModelError" and len(data["steps"]) == 3 and data["resumes"]
    data.update(setup=[{"command": "true", "returncode": 0, "timed_out": False, "output": "", "duration_s": 0.01}],
                warnings=["a warning"], parent={"trajectory": str(tmp_path / "p.json"), "run_id": "r", "from_step": 0},
                compactions=[{"step": 1, "at": data["timing"]["started"], "why": "test", "kind": "elide",
                              "window": 100000, "tokens_before": 10, "tokens_after": 5, "elided_through": -1,
                              "summary_through": -1}])
    path.write_text(json.dumps(data))
    return path


def test_a_damaged_field_is_one_line_naming_the_file_and_the_field(cli, recorded):
    data = json.loads(recorded.read_text())
    data["steps"] = "x"
    recorded.write_text(json.dumps(data))
    line = (f"miniswe: {recorded}: steps: expected a list, got a string; the file is damaged or not a miniswe "
            "trajectory\n")
    for args in (["inspect", str(recorded)], ["replay", str(recorded)], ["run", "--resume", str(recorded)]):
        result = cli(*args)
        assert (result.returncode, result.stderr, result.stdout) == (2, line, ""), args

    data["steps"] = [{"step": 1, "output": {"text": "x"}}]
    recorded.write_text(json.dumps(data))
    result = cli("inspect", str(recorded))
    assert result.returncode == 2 and result.stderr == (
        f"miniswe: {recorded}: steps[0].output: expected a string, got a mapping; the file is damaged or not a "
        "miniswe trajectory\n")


def test_a_recorded_setting_this_miniswe_refuses_is_blamed_on_the_file_and_can_be_replaced(cli, recorded, tmp_path):
    data = json.loads(recorded.read_text())
    data["config"]["agent"]["step_limit"] = "many"
    recorded.write_text(json.dumps(data))
    script = tmp_path / "more.json"
    script.write_text(json.dumps([SUBMIT] * 5))
    result = cli("run", "--resume", str(recorded), "--script", str(script), "-q")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"miniswe: {recorded}: agent.step_limit: ")
    assert "-c KEY=VALUE replaces a recorded setting" in result.stderr
    # a bad value given now is the command line's, not the file's
    mine = cli("run", "--resume", str(recorded), "--script", str(script), "-q", "-c", "agent.step_limit=lots")
    assert mine.returncode == 2 and mine.stderr.startswith("miniswe: -c agent.step_limit=lots: agent.step_limit: ")
    # the fix the line gives works: the setting given now replaces the recorded one
    fixed = cli("run", "--resume", str(recorded), "--script", str(script), "-q", "-c", "agent.step_limit=50")
    assert fixed.returncode == 0, fixed.stderr


@pytest.mark.slow
def test_every_field_mutated_to_every_wrong_type_is_refused_in_one_line_or_read(recorded, tmp_path):
    document = json.loads(recorded.read_text())
    mutations = [(path, name, wrong) for path, value in fields(document) for name, wrong in WRONG.items()
                 if json_type(value) != name]
    assert len({tuple(path) for path, _, _ in mutations}) > 100, "the run records fewer fields than it should"
    script = tmp_path / "submit.json"
    script.write_text(json.dumps([SUBMIT] * 20))  # whichever reply a resumed run's model is asked for: a submission
    out = tmp_path / "results.json"
    done = subprocess.run([*python_cmd(DRIVER), str(recorded), str(script), str(out), json.dumps(mutations)],
                          cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    assert len(results) == 3 * len(mutations)
    works = {"inspect": {0}, "replay": {0, 1}, "resume": {0, 1, 3}}
    bad = []
    for result in results:
        what = f"{'.'.join(map(str, result['field']))} <- {result['type']}: {result['command']} exits {result['code']}"
        lines = result["stderr"].splitlines()
        if result["code"] == 2:  # refused: one line, naming the file
            if len(lines) != 1 or not lines[0].startswith("miniswe: ") or result["file"] not in lines[0]:
                bad.append(f"{what}: {result['stderr'][-500:]}")
        elif result["code"] not in works[result["command"]] or "Traceback" in result["stderr"] \
                or "internal error" in result["stderr"]:
            bad.append(f"{what}: {result['stderr'][-500:]}")
    assert not bad, f"{len(bad)} of {len(results)}:\n" + "\n".join(bad[:20])
    refused = {(tuple(r["field"]), r["type"]) for r in results if r["code"] == 2}
    assert (("steps",), "string") in refused and (("messages", 0, "content"), "mapping") in refused
    # an optional field left empty is read as missing
    assert all(r["code"] == 0 for r in results if r["field"] == ["warnings"] and r["type"] == "null")


def test_the_truncated_autosave_of_a_chat_is_listed_as_damaged_and_load_says_why(tmp_path, monkeypatch):
    from miniswe.chat import store

    monkeypatch.setenv("MINISWE_HOME", str(tmp_path / "home"))
    folder = tmp_path / "home" / "sessions"
    folder.mkdir(parents=True)
    whole = {"format": "miniswe-trajectory", "version": 2, "task": "fine", "messages": [], "steps": [],
             "session": {"id": "good", "summary": "fine · Submitted"}}
    (folder / "good.traj.json").write_text(json.dumps(whole))
    (folder / "cut.traj.json").write_text(json.dumps(whole)[:40])
    (folder / "typed.traj.json").write_text(json.dumps({**whole, "messages": "x"}))
    listed = {s.id: s for s in store.list_sessions()}
    assert set(listed) == {"good", "cut", "typed"}
    assert listed["good"].damaged is None and listed["good"].summary == "fine · Submitted"
    assert listed["cut"].damaged.startswith("not valid JSON") and listed["cut"].summary.startswith("[damaged] ")
    assert listed["typed"].damaged == ("messages: expected a list, got a string; the file is damaged or not a miniswe "
                                       "trajectory")
