"""One process at a time writes a run's trajectory: the run itself, from its first save to its end, or a resume
of it. A second one (a resume of a run still going, two resumes at once, a replay beside them) is refused at
once, before any model call or command, naming the holder's pid; the claim dies with its process (kill -9)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from conftest import SUBMIT, act, clean_env, miniswe_cmd, python_cmd
from waiting import wait_for

from miniswe.errors import UsageError
from miniswe.trajectory import InUse, Trajectory, claim_file, load, lock_path


def in_use_line(path, pid) -> str:
    return (f"miniswe: {path}: in use by another miniswe process (pid {pid}): its run is still going, or another "
            "resume or replay of it is; wait for that to end (or stop it), then run this again\n")


def start(tmp_path, *args):
    return subprocess.Popen(miniswe_cmd(*args), cwd=tmp_path, env=clean_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def test_a_run_still_going_is_neither_resumed_nor_replayed_nor_written_by_another(cli, server, tmp_path):
    (tmp_path / "work").mkdir()
    endpoint = ["--base-url", server.base_url, "-m", "m"]
    # the first command lists its own shell's open files: the claim is not among them (close-on-exec), so no
    # command a run starts can keep it after the run is gone
    server.push(act("ls -l /proc/$$/fd"), {"content": act("echo two"), "stall": 60})
    live = start(tmp_path, "run", "t", *endpoint, "--cwd", "work", "-o", "t.json")
    try:
        wait_for(lambda: len(server.requests) == 2 or live.poll() is not None, "the run's second model call")
        assert live.poll() is None, live.stderr.read()
        before = (tmp_path / "t.json").read_bytes()
        started = time.monotonic()
        for args in (["run", "--resume", "t.json", *endpoint], ["replay", "t.json"],
                     ["run", "another", *endpoint, "-o", "t.json"]):
            refused = cli(*args)
            assert (refused.returncode, refused.stderr) == (2, in_use_line("t.json", live.pid)), args
        assert time.monotonic() - started < 30
        assert len(server.requests) == 2, "a refused process made a model call"
        assert (tmp_path / "t.json").read_bytes() == before, "a refused process wrote the trajectory"
        assert ".lock" not in json.loads(before)["steps"][0]["output"]
    finally:
        live.send_signal(signal.SIGTERM)
        live.communicate(timeout=30)
    data = json.loads((tmp_path / "t.json").read_text())
    assert data["exit_status"] == "Interrupted" and all(step["aborted"] is None for step in data["steps"])
    assert not os.path.exists(lock_path(str(tmp_path / "t.json"))), "the run let go of its file at its end"

    server.push(act("echo two"), SUBMIT)  # the run ended: now it goes on
    resumed = cli("run", "--resume", "t.json", *endpoint)
    assert resumed.returncode == 0, resumed.stderr


def test_two_resumes_at_once_and_a_resume_after_kill_9(cli, server, tmp_path):
    (tmp_path / "work").mkdir()
    endpoint = ["--base-url", server.base_url, "-m", "m"]
    server.push(act("echo one"), {"status": 400})  # a ModelError: the run ends without a verdict
    assert cli("run", "t", *endpoint, "--cwd", "work", "-o", "t.json").returncode == 3
    server.push({"content": act("echo two"), "stall": 60})
    first = start(tmp_path, "run", "--resume", "t.json", *endpoint)
    try:
        wait_for(lambda: len(server.requests) == 3 or first.poll() is not None, "the first resume's model call")
        assert first.poll() is None, first.stderr.read()
        second = cli("run", "--resume", "t.json", *endpoint)
        assert (second.returncode, second.stderr) == (2, in_use_line("t.json", first.pid))
        assert len(server.requests) == 3
    finally:
        first.kill()  # kill -9: no chance to let go of anything
        first.wait(10)
    assert os.path.exists(lock_path(str(tmp_path / "t.json"))), "a killed process leaves its lock file"
    server.push(act("echo two"), SUBMIT)
    third = cli("run", "--resume", "t.json", *endpoint)
    assert third.returncode == 0, third.stderr
    data = json.loads((tmp_path / "t.json").read_text())
    assert [s["command"] for s in data["steps"]][:2] == ["echo one", "echo two"] and data["exit_status"] == "Submitted"
    assert len(data["resumes"]) == 2, "the killed resume and the one that finished"
    assert not os.path.exists(lock_path(str(tmp_path / "t.json")))


HOLDER = """
import sys, time
from miniswe.trajectory import claim_file
claim = claim_file(sys.argv[1])
print("held", flush=True)
time.sleep(60)
"""


def test_a_claim_is_shared_within_a_process_and_refused_to_another(tmp_path):
    path = str(tmp_path / "t.json")
    run = Trajectory(path, task="t", config={})
    run.save()
    again = claim_file(path)  # this process's own second holder (a chat session loaded over its autosave)
    again.release()
    assert os.path.exists(lock_path(path)), "the run still holds it"
    run.release()
    assert not os.path.exists(lock_path(path))

    holder = subprocess.Popen([*python_cmd(HOLDER), path], env=clean_env(), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(InUse, match=rf"in use by another miniswe process \(pid {holder.pid}\)") as refused:
            load(path, lock=True)
        assert isinstance(refused.value, UsageError), "exit 2, as bad input"
        with pytest.raises(InUse):
            Trajectory(path, task="t", config={}).save()
        assert len(load(path).steps) == 0, "reading without a claim is always allowed (inspect)"
    finally:
        holder.kill()
        holder.wait(10)
    load(path, lock=True).release()  # free again once its holder is gone
