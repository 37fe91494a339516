"""Trajectory files: valid JSON after every save, versioned, and loaded with clear errors."""

import json
import os

import pytest

from miniswe.errors import TrajectoryError
from miniswe.trajectory import FORMAT, VERSION, Trajectory, load

DATA = os.path.join(os.path.dirname(__file__), "data", "trajectories")


def test_every_save_is_a_complete_document(tmp_path):
    path = tmp_path / "run" / "t.traj.json"
    traj = Trajectory(str(path), task="t", config={"a": 1}, environment={"kind": "local"})
    traj.save()
    assert json.loads(path.read_text())["exit_status"] is None
    traj.add_message("user", "hello \u2603")
    traj.add_step({"step": 1, "command": "ls"})
    traj.save()
    data = json.loads(path.read_text())
    assert data["messages"][0]["content"] == "hello \u2603"
    assert data["steps"] == [{"step": 1, "command": "ls"}]
    traj.finish("Submitted", None, "patch")
    traj.save()
    data = load(str(path))
    assert data["exit_status"] == "Submitted" and data["submission"] == "patch"
    assert data["timing"]["wall_s"] is not None
    assert [p.name for p in path.parent.iterdir()] == ["t.traj.json"], "temp files left behind"


@pytest.mark.parametrize("name", sorted(os.listdir(DATA)))
def test_each_kept_version_loads(name):
    data = load(os.path.join(DATA, name))
    assert data["format"] == FORMAT and data["version"] == VERSION
    assert data["steps"] and data["messages"]


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
        traj.add_step({"step": i + 1, "output": "x" * (1000 - 100 * i)})  # versions shrink and grow
        traj.save()
        seen.append(len(json.loads(path.read_text())["steps"]))
    assert seen == [1, 2, 3, 4, 5]
    assert (path.stat().st_mode & 0o777) == 0o666 & ~_umask()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.traj.json"]
    assert len(load(str(path))["steps"]) == 5


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
    other.write_text('{"format": "miniswe-trajectory", "version": 1, "by": "other"}')
    os.replace(other, path)
    traj.add_step({"step": 1})
    traj.save()
    assert load(str(path))["steps"] == [{"step": 1}]
    traj.add_step({"step": 2})
    traj.save()
    assert len(load(str(path))["steps"]) == 2


def test_a_reader_holding_the_file_keeps_a_whole_version(tmp_path):
    path = tmp_path / "t.traj.json"
    traj = Trajectory(str(path), task="t", config={}, environment={})
    traj.save()
    with open(path) as reader:
        for i in range(3):
            traj.add_step({"step": i + 1, "output": "z" * 5000})
            traj.save()
        assert json.loads(reader.read())["exit_status"] is None  # the version it opened, complete
    assert len(load(str(path))["steps"]) == 3
