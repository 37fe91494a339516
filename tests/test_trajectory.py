"""Trajectory files: valid JSON after every save, versioned, and loaded with clear errors."""

import json
import os

import pytest

from miniswe.config import config_from_record
from miniswe.errors import TrajectoryError
from miniswe.status import ExitStatus, Outcome
from miniswe.trajectory import FORMAT, VERSION, Step, Trajectory, load
from miniswe.usage import Usage

DATA = os.path.join(os.path.dirname(__file__), "data", "trajectories")


def test_every_save_is_a_complete_document(tmp_path):
    path = tmp_path / "run" / "t.traj.json"
    traj = Trajectory(str(path), task="t", config={"a": 1}, environment={"kind": "local"})
    traj.save()
    assert json.loads(path.read_text())["exit_status"] is None
    traj.add_message("user", "hello \u2603")
    traj.record_step(Step(1, command="ls", usage=Usage(model_calls=1, total_tokens=7)))
    traj.add_usage(Usage(model_calls=1, total_tokens=7))
    traj.save()
    data = json.loads(path.read_text())
    assert data["messages"][0]["content"] == "hello \u2603"
    assert [(s["step"], s["command"], s["usage"]["total_tokens"]) for s in data["steps"]] == [(1, "ls", 7)]
    traj.finish(Outcome(ExitStatus.SUBMITTED, None, "patch"))
    traj.save()
    loaded = load(str(path))
    assert loaded.outcome == Outcome(ExitStatus.SUBMITTED, None, "patch") and loaded.wall_s is not None
    assert loaded.steps == traj.steps and loaded.messages == traj.messages and loaded.usage == traj.usage
    assert loaded.to_dict() == traj.to_dict() == json.loads(path.read_text()), "load gives back what was saved"
    assert [p.name for p in path.parent.iterdir()] == ["t.traj.json"], "temp files left behind"


@pytest.mark.parametrize("name", sorted(os.listdir(DATA)))
def test_each_kept_version_loads(name):
    trajectory = load(os.path.join(DATA, name))
    data = trajectory.to_dict()
    assert data["format"] == FORMAT and data["version"] == VERSION
    assert trajectory.steps and trajectory.messages and trajectory.outcome is not None
    assert config_from_record(trajectory.config).agent.step_limit > 0, "the recorded config rebuilds"


def test_version_1_is_upgraded_with_each_call_moved_to_its_step():
    trajectory = load(os.path.join(DATA, "v1.json"))
    first = trajectory.steps[0]
    assert first.usage.total_tokens > 0 and first.finish_reason == "stop" and first.thought
    assert first.usage.total_tokens == json.load(open(os.path.join(DATA, "v1.json")))["messages"][2]["usage"]["total_tokens"]
    assert all(set(m.to_dict()) <= {"role", "content", "timestamp", "step"} for m in trajectory.messages)
    assert "image" not in trajectory.config["environment"], "only the recorded kind's settings are kept"


def test_a_recorded_config_gets_its_masked_secrets_back_from_the_environment(monkeypatch):
    recorded = {"environment": {"env": {"API_TOKEN": "***", "MODE": "fast"}}, "model": {"kind": "scripted", "script": "r.yaml"}}
    monkeypatch.setenv("API_TOKEN", "tok-from-the-environment")
    config = config_from_record(recorded)
    assert config.environment.env == {"API_TOKEN": "tok-from-the-environment", "MODE": "fast"}
    assert recorded["environment"]["env"]["API_TOKEN"] == "***", "the record itself is untouched"


def test_newer_version_is_refused(tmp_path):
    path = tmp_path / "new.json"
    path.write_text(json.dumps({"format": FORMAT, "version": VERSION + 1}))
    with pytest.raises(TrajectoryError, match="newer miniswe"):
        load(str(path))


def test_foreign_and_broken_files_are_refused(tmp_path):
    foreign = tmp_path / "mini.json"
    foreign.write_text(json.dumps({"trajectory_format": "mini-swe-agent-1", "messages": []}))
    with pytest.raises(TrajectoryError, match="not a miniswe trajectory .*mini-swe-agent-1"):
        load(str(foreign))
    broken = tmp_path / "broken.json"
    broken.write_text('{"format": "miniswe-traj')
    with pytest.raises(TrajectoryError, match="not valid JSON"):
        load(str(broken))


def test_saves_replace_the_file_whole_and_leave_nothing_beside_it(tmp_path):
    path = tmp_path / "t.traj.json"
    traj = Trajectory(str(path), task="t", config={}, environment={})
    seen = []
    for i in range(5):
        traj.record_step(Step(i + 1, output="x" * (1000 - 100 * i)))  # versions shrink and grow
        traj.save()
        seen.append(len(json.loads(path.read_text())["steps"]))
    assert seen == [1, 2, 3, 4, 5]
    assert (path.stat().st_mode & 0o777) == 0o666 & ~_umask()
    # while the run goes on, its claim on the file (see test_record_lock.py); nothing once it has ended
    assert sorted(p.name for p in tmp_path.iterdir()) == [".t.traj.json.lock", "t.traj.json"]
    traj.finish(Outcome(ExitStatus.SUBMITTED))
    traj.save()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.traj.json"]
    assert len(load(str(path)).steps) == 5


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_file_replaced_by_someone_else_is_not_clobbered_later(tmp_path):
    """Another writer (the batch marking a stuck task Interrupted) may replace the file between saves."""
    path = tmp_path / "t.traj.json"
    traj = Trajectory(str(path), task="t", config={}, environment={})
    traj.save()
    traj.save()
    other = tmp_path / "other.json"
    other.write_text('{"format": "miniswe-trajectory", "version": 2, "by": "other"}')
    os.replace(other, path)
    traj.record_step(Step(1))
    traj.save()
    assert load(str(path)).steps == [Step(1)]
    traj.record_step(Step(2))
    traj.save()
    assert len(load(str(path)).steps) == 2


def test_a_reader_holding_the_file_keeps_a_whole_version(tmp_path):
    path = tmp_path / "t.traj.json"
    traj = Trajectory(str(path), task="t", config={}, environment={})
    traj.save()
    with open(path) as reader:
        for i in range(3):
            traj.record_step(Step(i + 1, output="z" * 5000))
            traj.save()
        assert json.loads(reader.read())["exit_status"] is None  # the version it opened, complete
    assert len(load(str(path)).steps) == 3
