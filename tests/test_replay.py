"""Replay, the replay model, resume and fork, through real `miniswe` processes and real files."""

from __future__ import annotations

import json
import re
import subprocess
import time

from conftest import act, clean_env, miniswe_cmd, read_line
from replies import SUBMIT, SUBMIT_MARKER


def script(path, replies) -> str:
    path.write_text(json.dumps(replies))
    return str(path)


def record_run(cli, tmp_path, replies, *extra):
    """A finished local run in tmp_path/work; its trajectory's path."""
    (tmp_path / "work").mkdir(exist_ok=True)
    result = cli("run", "t", "--script", script(tmp_path / "replies.json", replies), "--cwd", "work", "-o", "t.json",
                 "-q", *extra)
    assert result.returncode in (0, 1), result.stderr
    return tmp_path / "t.json"


def test_replay_of_an_unchanged_run_matches_and_a_changed_file_diverges_at_its_step(cli, tmp_path):
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "input.txt").write_text("original\n")
    record_run(cli, tmp_path, [act("ls; date; echo pid $$; mktemp"), act("cat input.txt"), act("printf 'no newline'"),
                               act(f"echo {SUBMIT_MARKER}")])
    same = cli("replay", "t.json")
    assert same.returncode == 0, same.stderr
    assert same.stdout.strip() == "matched: 4 command(s) gave their recorded output"
    assert f"replaying in {tmp_path / 'work'}" in same.stderr and "replayed step 2: matches" in same.stderr

    (tmp_path / "work" / "input.txt").write_text("changed\n")
    changed = cli("replay", "t.json", "-q")
    assert changed.returncode == 1
    verdict, *diff = changed.stdout.strip().splitlines()
    assert verdict == "diverged at step 2: output differs"
    assert "-original" in diff and "+changed" in diff
    assert cli("replay", "t.json", "--until", "1", "-q").returncode == 0, "--until stops before the change"


def test_replay_elsewhere_and_with_extra_masks(cli, tmp_path):
    record_run(cli, tmp_path, [act("echo made at $RANDOM > f.txt; cat f.txt"), act(f"echo {SUBMIT_MARKER}")])
    (tmp_path / "fresh").mkdir()
    varies = cli("replay", "t.json", "--cwd", "fresh", "-q")
    assert varies.returncode == 1 and "step 1: output differs" in varies.stdout
    masked = cli("replay", "t.json", "--cwd", "fresh", "--mask", r"made at \d+", "-q")
    assert masked.returncode == 0, masked.stdout
    assert (tmp_path / "fresh" / "f.txt").exists() and not (tmp_path / "work" / "f.txt").read_text() == ""


def test_a_cut_output_is_compared_by_what_was_kept(cli, tmp_path):
    record_run(cli, tmp_path, [act("seq 1 200000"), act(f"echo {SUBMIT_MARKER}")], "-c", "environment.capture_limit=1000")
    replayed = cli("replay", "t.json")
    assert replayed.returncode == 0, replayed.stdout
    assert "output cut by the capture bound" in replayed.stderr and "head and tail match" in replayed.stderr


def test_the_replay_model_reproduces_a_run_offline(cli, tmp_path):
    record_run(cli, tmp_path, [act("echo one > a.txt"), "no block here", act("cat a.txt"),
                               act(f"echo {SUBMIT_MARKER}; cat a.txt")])
    (tmp_path / "again").mkdir()
    again = cli("run", "t", "-c", "model.kind=replay", "-c", "model.trajectory=t.json", "--cwd", "again", "-o", "b.json", "-q")
    assert again.returncode == 0, again.stderr
    first, second = (json.loads((tmp_path / name).read_text()) for name in ("t.json", "b.json"))
    assert [(s["command"], s["format_error"], s["output"]) for s in first["steps"]] == \
           [(s["command"], s["format_error"], s["output"]) for s in second["steps"]]
    assert second["submission"] == first["submission"] == "one\n"
    assert second["model"] == {"kind": "replay", "trajectory": "t.json", "replies": 4}


def test_resume_after_kill_9_repeats_no_call_and_loses_no_step(server, tmp_path):
    (tmp_path / "work").mkdir()
    server.push(act("echo one >> log"), act("echo two >> log"), act("echo three >> log; echo started; sleep 60"),
                act("echo four >> log"), act(f"echo {SUBMIT_MARKER}; cat log"))
    endpoint = ["--base-url", server.base_url, "-m", "m"]
    proc = subprocess.Popen(miniswe_cmd("run", "t", *endpoint, "--cwd", "work", "-o", "t.json"), cwd=tmp_path,
                            env=clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 20
    while not (tmp_path / "work" / "log").exists() or "three" not in (tmp_path / "work" / "log").read_text():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.02)
    proc.kill()
    proc.wait(10)
    before = json.loads((tmp_path / "t.json").read_text())
    assert before["exit_status"] is None and len(server.requests) == 3 and before["pending"]["step"] == 3
    killed_wall = before["timing"]["wall_s"]
    assert killed_wall is not None and killed_wall > 0, "the wall time so far is saved with each save"
    # as if the killed run had gone on for a minute and a half before its last save
    before["timing"]["wall_s"] = 90.0
    (tmp_path / "t.json").write_text(json.dumps(before))

    resumed = subprocess.run(miniswe_cmd("run", "--resume", "t.json", *endpoint), cwd=tmp_path, env=clean_env(),
                             capture_output=True, text=True, timeout=60)
    assert resumed.returncode == 0, resumed.stderr
    after = json.loads((tmp_path / "t.json").read_text())
    assert len(server.requests) == 5, "no call made again: the third reply was on disk before its command ran"
    assert after["exit_status"] == "Submitted" and after["submission"] == "one\ntwo\nthree\nfour\n"
    assert [s["step"] for s in after["steps"]] == [1, 2, 3, 4, 5]
    assert after["steps"][:2] == before["steps"] and after["steps"][2]["aborted"] == "miniswe stopped"
    assert "cut short (miniswe stopped)" in server.requests[3]["body"]["messages"][-1]["content"]
    assert server.requests[3]["body"]["messages"][:-1] == [{"role": m["role"], "content": m["content"]}
                                                           for m in before["messages"]]
    assert after["resumes"][0]["from_step"] == 2 and "pending" not in after
    assert after["usage"]["model_calls"] == 5
    assert 90.0 < after["timing"]["wall_s"] < 90.0 + 60, "the killed run's wall time counts in the resumed run's"

    # the replay goes past the step cut short by the kill: steps 4 and 5 run and are compared too
    (tmp_path / "fresh").mkdir()
    replayed = subprocess.run(miniswe_cmd("replay", "t.json", "--cwd", "fresh"), cwd=tmp_path, env=clean_env(),
                              capture_output=True, text=True, timeout=60)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert "replayed step 3: matches (cut short in the recording (miniswe stopped)" in replayed.stderr
    assert "replayed step 5: matches" in replayed.stderr
    assert replayed.stdout.strip() == ("matched: 4 command(s) gave their recorded output; step 3 cut short in the "
                                       "recording: ran again, output not compared")
    assert (tmp_path / "fresh" / "log").read_text() == "one\ntwo\nthree\nfour\n"


DIES_AT_END = """
import os, signal

class DiesAtEnd:  # a kill -9 after the run's last step was saved, before its end was
    def on_run_end(self, event):
        os.kill(os.getpid(), signal.SIGKILL)

class DiesBeforeCall3:
    def before_model_call(self, event):
        if event.step == 3:
            os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_run_killed_after_its_last_step_was_saved_resumes_to_that_steps_end_without_a_call(cli, server, tmp_path):
    (tmp_path / "dies.py").write_text(DIES_AT_END)
    env = {"PYTHONPATH": str(tmp_path)}
    endpoint = ["--base-url", server.base_url, "-m", "m"]
    for name, replies, flags, status, code in (
        ("sub", [act("echo one"), act(f"echo {SUBMIT_MARKER}; echo the answer")], [], "Submitted", 0),
        ("fmt", ["no block", "still none"], ["-c", "agent.max_format_errors=2"], "RepeatedFormatError", 1),
        ("rep", [act("cat missing")] * 2, ["-c", "agent.max_repeats=1"], "RepeatedAction", 1),
    ):
        server.push(*replies)
        calls = len(server.requests)
        killed = cli("run", "t", *endpoint, *flags, "-c", "agent.hooks=[dies:DiesAtEnd]", "-o", f"{name}.json", "-q", env=env)
        assert killed.returncode == -9, killed.stderr
        before = json.loads((tmp_path / f"{name}.json").read_text())
        assert before["exit_status"] is None and len(before["steps"]) == 2 and "pending" not in before
        assert len(server.requests) == calls + 2

        resumed = cli("run", "--resume", f"{name}.json", "-c", "agent.hooks=[]", "-q", env=env)
        assert resumed.returncode == code, resumed.stderr
        after = json.loads((tmp_path / f"{name}.json").read_text())
        assert after["exit_status"] == status, after["exit_detail"]
        assert len(server.requests) == calls + 2, "the model was asked again after the run had ended"
        assert after["steps"] == before["steps"]
    assert json.loads((tmp_path / "fmt.json").read_text())["exit_detail"] == "2 malformed replies in a row; last: no_action"
    assert json.loads((tmp_path / "sub.json").read_text())["submission"] == "the answer\n"


def test_a_resumed_run_counts_repeats_on_from_its_recorded_steps(cli, server, tmp_path):
    """agent.max_repeats=3: two identical steps, a kill, then two more after the resume end the run at the
    fourth, as without the kill."""
    (tmp_path / "dies.py").write_text(DIES_AT_END)
    env = {"PYTHONPATH": str(tmp_path)}
    server.push(*[act("cat missing")] * 2)
    killed = cli("run", "t", "--base-url", server.base_url, "-m", "m", "-c", "agent.hooks=[dies:DiesBeforeCall3]",
                 "-o", "t.json", "-q", env=env)
    assert killed.returncode == -9 and len(json.loads((tmp_path / "t.json").read_text())["steps"]) == 2
    server.push(*[act("cat missing")] * 2)
    resumed = cli("run", "--resume", "t.json", "-c", "agent.hooks=[]", "-q", env=env, timeout=30)
    data = json.loads((tmp_path / "t.json").read_text())
    assert (resumed.returncode, data["exit_status"], len(data["steps"])) == (1, "RepeatedAction", 4), resumed.stderr
    assert "4 times in a row" in data["exit_detail"] and len(server.requests) == 4
    assert "Running it once more ends the run" in server.requests[3]["body"]["messages"][-1]["content"]


def test_replay_checks_the_steps_after_one_cut_short(cli, tmp_path):
    path = record_run(cli, tmp_path, [act("echo one"), act("echo two"), act("echo three"), act(f"echo {SUBMIT_MARKER}")])
    data = json.loads(path.read_text())
    data["steps"][1].update(aborted="SIGINT", returncode=None, output="tw")  # a Ctrl-C in a chat, say; the run went on
    data["steps"][2]["output"] = "not three\n"
    path.write_text(json.dumps(data))
    replayed = cli("replay", "t.json")
    assert replayed.returncode == 1, replayed.stdout
    assert replayed.stdout.splitlines()[0] == "diverged at step 3: output differs"
    assert "replayed step 2: matches (cut short in the recording (SIGINT): ran again" in replayed.stderr


def test_resume_refuses_a_run_with_a_verdict_and_an_interrupted_run_goes_on(cli, server, tmp_path):
    done = record_run(cli, tmp_path, [act(f"echo {SUBMIT_MARKER}")])
    refused = cli("run", "--resume", str(done))
    assert refused.returncode == 2 and "ended as Submitted, a verdict; nothing to resume" in refused.stderr

    (tmp_path / "work2").mkdir()
    endpoint = ["--base-url", server.base_url, "-m", "m"]
    server.push(act("echo one"), act(": > started; sleep 30"), act(f"echo {SUBMIT_MARKER}"))
    proc = subprocess.Popen(miniswe_cmd("run", "t", *endpoint, "--cwd", "work2", "-o", "i.json"), cwd=tmp_path,
                            env=clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert "--- step 1" in read_line(proc.stderr)
    deadline = time.monotonic() + 20
    while not (tmp_path / "work2" / "started").exists():  # the second command runs
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.02)
    proc.send_signal(2)
    proc.communicate(timeout=20)
    assert json.loads((tmp_path / "i.json").read_text())["exit_status"] == "Interrupted"
    again = cli("run", "--resume", "i.json", *endpoint)
    assert again.returncode == 0, again.stderr
    data = json.loads((tmp_path / "i.json").read_text())
    assert data["exit_status"] == "Submitted" and [s["aborted"] for s in data["steps"]] == [None, "SIGINT", None]
    assert len(server.requests) == 3


def test_fork_keeps_the_first_steps_replays_them_elsewhere_and_leaves_the_parent_alone(cli, tmp_path):
    parent = record_run(cli, tmp_path, [act("echo one >> log"), act("echo two >> log"), act(f"echo {SUBMIT_MARKER}; cat log")])
    original = parent.read_bytes()
    same_place = cli("run", "--fork", "t.json", "--from-step", "1", "-o", "f.json")
    assert same_place.returncode == 2 and "holds the parent run's final state" in same_place.stderr
    (tmp_path / "fresh").mkdir()
    other = script(tmp_path / "other.json", ["unused: the fork made 1 call already", act("echo other >> log"),
                                             act(f"echo {SUBMIT_MARKER}; cat log")])
    fork = cli("run", "--fork", "t.json", "--from-step", "1", "-o", "f.json", "--cwd", "fresh", "--script", other)
    assert fork.returncode == 0, fork.stderr
    assert "replayed step 1: matches" in fork.stderr
    child = json.loads((tmp_path / "f.json").read_text())
    assert child["submission"] == "one\nother\n" and [s["command"] for s in child["steps"]][1] == "echo other >> log"
    assert child["parent"]["from_step"] == 1 and child["parent"]["trajectory"] == str(parent)
    assert child["resumes"][0]["changes"]["model.script"][1] == other
    assert parent.read_bytes() == original, "the parent is never touched"


def test_a_fork_goes_on_live_from_a_last_kept_step_that_ended_its_parent(cli, tmp_path):
    """Unlike a resume, a fork does not end as the parent ended: another model or other limits may go on."""
    record_run(cli, tmp_path, [act("echo one"), act("echo one"), act("echo one")], "-c", "agent.max_repeats=2")
    assert json.loads((tmp_path / "t.json").read_text())["exit_status"] == "RepeatedAction"
    (tmp_path / "fresh").mkdir()
    other = script(tmp_path / "other.json", ["unused"] * 3 + [act(f"echo {SUBMIT_MARKER}; echo done")])
    fork = cli("run", "--fork", "t.json", "--from-step", "3", "-o", "f.json", "--cwd", "fresh", "--script", other)
    child = json.loads((tmp_path / "f.json").read_text())
    assert (fork.returncode, child["exit_status"], child["submission"]) == (0, "Submitted", "done\n"), fork.stderr


def test_a_foreign_recording_with_no_working_directory_replays_only_where_told(cli, tmp_path):
    from conftest import ROOT

    source = str(ROOT / "tests" / "data" / "reference" / "mini-swe-agent-list-format.traj.json")
    (tmp_path / "keep.txt").write_text("mine\n")
    refused = cli("replay", source)
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.count("\n") == 1 and "names no working directory" in refused.stderr
    assert "--cwd DIR" in refused.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"], "nothing ran here"

    (tmp_path / "fresh").mkdir()
    told = cli("replay", source, "--cwd", "fresh")
    assert told.returncode in (0, 1), told.stderr
    assert f"replaying in {tmp_path / 'fresh'}: empty" in told.stderr
    assert "whatever the original run left" not in told.stderr


def test_the_replay_notice_says_what_the_directory_holds(cli, tmp_path):
    record_run(cli, tmp_path, [act("echo hi > f"), act(f"echo {SUBMIT_MARKER}")])
    same = cli("replay", "t.json")
    assert "the recorded directory, with whatever the original run left there" in same.stderr
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "a").write_text("")
    elsewhere = cli("replay", "t.json", "--cwd", "full")
    assert "1 entry there already: the replay starts from them" in elsewhere.stderr


def test_default_masks_cover_ls_times_and_unix_time_but_not_ordinary_numbers(cli, tmp_path):
    path = record_run(cli, tmp_path, [act("touch f && ls -l"), act("date +%s; date +%s%3N"), act("echo 4242 1234567"),
                                      act(f"echo {SUBMIT_MARKER}")])
    data = json.loads(path.read_text())
    listing, clock = data["steps"][0]["output"], data["steps"][1]["output"].split()
    assert " f" in listing and re.search(r"\d:\d\d f", listing), listing
    # as if recorded at another time: another minute and day in the listing, the clock a second or two behind
    data["steps"][0]["output"] = re.sub(r"\w{3} [ \d]\d \d\d:\d\d", "Jan  9 23:59", listing)
    data["steps"][1]["output"] = f"{int(clock[0]) - 2}\n{int(clock[1]) - 1500}\n"
    path.write_text(json.dumps(data))
    (tmp_path / "fresh").mkdir()
    replayed = cli("replay", "t.json", "--cwd", "fresh", "-q")
    assert replayed.returncode == 0, replayed.stdout

    data["steps"][2]["output"] = "4243 1234567\n"  # an ordinary number that changed is a divergence
    path.write_text(json.dumps(data))
    (tmp_path / "fresh2").mkdir()
    changed = cli("replay", "t.json", "--cwd", "fresh2", "-q")
    assert changed.returncode == 1 and "diverged at step 3" in changed.stdout
    assert "+4242 1234567" in changed.stdout


def test_resume_refuses_inputs_it_would_ignore_and_replay_an_until_below_1(cli, tmp_path):
    (tmp_path / "work").mkdir()
    cli("run", "t", "--script", script(tmp_path / "r.json", [act("echo one")]), "--cwd", "work", "-o", "t.json", "-q")
    before = (tmp_path / "t.json").read_bytes()
    for args, message in (
        (["-o", "other.json"], "miniswe: --resume t.json goes on in that file from its last step: give no -o (--fork "
                               "TRAJ --from-step N -o NEW goes on in a copy)\n"),
        (["--from-step", "1"], "miniswe: --resume t.json goes on in that file from its last step: give no --from-step "
                               "(--fork TRAJ --from-step N -o NEW goes on in a copy)\n"),
        (["--fork", "t.json"], "miniswe: --resume TRAJ goes on in TRAJ, --fork TRAJ in a copy: give one of them\n"),
    ):
        refused = cli("run", "--resume", "t.json", *args)
        assert (refused.returncode, refused.stderr) == (2, message), args
    assert (tmp_path / "t.json").read_bytes() == before and not (tmp_path / "other.json").exists()
    for until in ("0", "-1"):
        refused = cli("replay", "t.json", "--until", until)
        assert (refused.returncode, refused.stdout) == (2, "")
        assert refused.stderr == (f"miniswe: --until {until}: steps are numbered from 1; give 1 or more (without "
                                  "--until every step is checked)\n")


def test_a_kind_given_now_replaces_the_recorded_kinds_settings(cli, server, tmp_path):
    from conftest import ROOT

    # mini-swe-agent's run in a python:3.11 container, replayed here as the docs say
    source = str(ROOT / "tests" / "data" / "reference" / "mini-swe-agent-1.1-from-docs.traj.json")
    (tmp_path / "fresh").mkdir()
    local = cli("replay", source, "-c", "environment.kind=local", "--cwd", "fresh", "--until", "1")
    assert local.returncode in (0, 1), local.stderr
    assert f"replaying in {tmp_path / 'fresh'}" in local.stderr and "unknown key" not in local.stderr
    nowhere = cli("replay", source, "-c", "environment.kind=local")  # /testbed was the container's directory
    assert nowhere.returncode == 2 and nowhere.stderr.count("\n") == 1
    assert "ran elsewhere (minisweagent.environments.docker.DockerEnvironment)" in nowhere.stderr

    # a run of the scripted model resumed with an endpoint: model.script is the scripted kind's, not openai's
    (tmp_path / "work").mkdir()
    cli("run", "t", "--script", script(tmp_path / "r.json", [act("echo one")]), "--cwd", "work", "-o", "t.json", "-q")
    server.push(act("echo two"), SUBMIT)
    resumed = cli("run", "--resume", "t.json", "-c", "model.kind=openai", "--base-url", server.base_url, "-m", "m", "-q")
    assert resumed.returncode == 0, resumed.stderr
    data = json.loads((tmp_path / "t.json").read_text())
    changes = data["resumes"][0]["changes"]
    assert changes["model.kind"] == ["scripted", "openai"] and changes["model.script"][1] is None
    assert changes["model.base_url"] == [None, server.base_url] and data["exit_status"] == "Submitted"

    # and the other way: an endpoint's run forked onto the scripted model, its endpoint settings dropped
    (tmp_path / "fresh2").mkdir()
    other = script(tmp_path / "other.json", ["unused", "unused", act(f"echo {SUBMIT_MARKER}; echo forked")])
    fork = cli("run", "--fork", "t.json", "--from-step", "2", "-o", "f.json", "--cwd", "fresh2", "--script", other, "-q")
    assert fork.returncode == 0, fork.stderr
    child = json.loads((tmp_path / "f.json").read_text())
    assert child["config"]["model"] == {"kind": "scripted", "name": "", "script": other}
    assert child["submission"] == "forked\n"


def test_a_kind_given_again_keeps_the_recorded_settings_and_another_drops_them():
    from miniswe.flags import resolve_config

    base = {"agent": {"kind": "default", "step_limit": 7},
            "environment": {"kind": "docker", "image": "img:1", "timeout": 5.0},
            "model": {"kind": "scripted", "script": "r.json"}}
    same = resolve_config(["environment.kind=docker"], {"script": "s.json"}, base=base)
    assert (same.environment.image, same.environment.timeout, same.model.script) == ("img:1", 5.0, "s.json")
    other = resolve_config(["environment.kind=local", "agent.kind=chat"], {}, base=base)
    assert other.environment.kind == "local" and other.environment.timeout == 60.0 and other.agent.step_limit == 100
    assert other.model.script == "r.json", "a section whose kind is not given keeps its recorded settings"
    # the kind a flag implies counts as given: --image means docker
    imaged = resolve_config([], {"image": "img:2"}, base={"environment": {"kind": "local", "cwd": "/x"}})
    assert (imaged.environment.kind, imaged.environment.image, imaged.environment.cwd) == ("docker", "img:2", "")
