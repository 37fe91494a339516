"""`miniswe inspect` in the terminal and as JSON: golden trajectories rendered and their structure asserted, step
selection, batch rows, comparisons, the pager and colours on a terminal, and the time a 5,000-step run takes."""

import fcntl
import json
import os
import pty
import re
import resource
import select
import shutil
import struct
import termios
import time

import pytest
from conftest import ROOT, clean_env, miniswe_cmd
from inspect_data import write_run_dir, write_trajectory

from miniswe.status import ExitStatus
from miniswe.trajectory import Step, Trajectory, load

DATA = ROOT / "tests" / "data"
V2 = str(DATA / "trajectories" / "v2.json")
REFERENCE = DATA / "reference"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def test_a_golden_trajectory_in_plain_text(cli):
    result = cli("inspect", V2)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert not ANSI.search(out), "no styles when stdout is not a terminal"
    labels = [line.split()[0] for line in out.split("\n\n")[0].splitlines() if not line.startswith(" ")]
    assert labels == ["task", "model", "exit", "steps", "tokens", "cost", "wall", "config", "file"]
    assert "exit       Submitted" in out and "steps      7 · 1 format error · 1 timeout · 1 non-zero exit" in out
    assert "tokens     7,780 (prompt 7,658 · completion 122) · 7 model calls" in out
    titles = re.findall(r"^━━ (step .*?) ━+$", out, re.M)
    assert titles == [
        "step 1 · rc=0 · 0.03s · 639 tokens",
        "step 2 · format error (no_action) · 663 tokens",
        "step 3 · rc=1 · 0.00s · 782 tokens",
        "step 4 · timed out · 1.01s · 817 tokens",
        "step 5 · rc=0 · 104,894 bytes not kept · 0.00s · 886 tokens",
        "step 6 · rc=0 · 0.00s · 1,970 tokens",
        "step 7 · rc=0 · 0.00s · 2,023 tokens",
    ]
    step3 = out.split("━━ step 3")[1].split("━━ step 4")[0]
    # thought, reasoning, command, and the observation exactly as the model saw it
    assert "~ The file may not exist.\nTHOUGHT: Read the config.\n$ cat missing-file.txt\n│ <returncode>1</returncode>\n" in step3
    assert "│ cat: missing-file.txt: No such file or directory\n│ </output>" in step3
    step2 = out.split("━━ step 2")[1].split("━━ step 3")[0]
    assert "│ Your reply was not run: the reply has no ```bash block." in step2 and "$ " not in step2
    step5 = out.split("━━ step 5")[1].split("━━ step 6")[0]
    assert "│ <warning>The output had 108894 characters; 104894 in the middle are not shown." in step5, "the model's view"
    assert out.rstrip().endswith("submission:\n│ diff --git a/x b/x\n│ +fixed")


def test_full_shows_outputs_as_stored(cli):
    out = cli("inspect", V2, "--full", "--step", "5").stdout
    assert "(output as stored)" in out and "[... 104894 bytes of output elided by miniswe ...]" in out
    assert "<returncode>" not in out.split("━━ step 5")[1]


@pytest.mark.parametrize(("args", "steps"), [
    (["--step", "3"], [3]), (["--steps", "3:5"], [3, 4, 5]), (["--steps", ":2"], [1, 2]), (["--steps", "6:"], [6, 7]),
    (["--errors"], [2, 3, 4]), (["--errors", "--steps", "3:"], [3, 4]),
])
def test_step_selection(cli, args, steps):
    result = cli("inspect", V2, *args)
    assert [int(n) for n in re.findall(r"^━━ step (\d+)", result.stdout, re.M)] == steps
    data = json.loads(cli("inspect", V2, "--json", *args).stdout)
    assert [s["step"] for s in data["steps"]] == steps and data["header"]["steps"] == 7


@pytest.mark.parametrize(("args", "message"), [
    (["--step", "9"], "--step 9: the run has steps 1 to 7"),
    (["--steps", "a:b"], "--steps a:b: expected A:B"),
    (["--steps", "5:3"], "--steps 5:3: the first step comes after the last"),
    (["--step", "2", "--steps", "1:3"], "give --step N or --steps A:B, not both"),
    (["--sort", "cost"], "--sort applies to a run directory"),
    (["--json", "--html", "x.html"], "give --json or --html, not both"),
])
def test_bad_selections_fail_in_one_line(cli, args, message):
    result = cli("inspect", V2, *args)
    assert result.returncode == 2 and message in result.stderr and result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1


def test_json_is_the_only_thing_on_stdout_and_keeps_both_outputs(cli):
    result = cli("inspect", V2, "--json")
    data = json.loads(result.stdout)
    assert data["inspect"] == "trajectory" and data["version"] == 1
    header = data["header"]
    assert (header["exit_status"], header["steps"], header["format_errors"], header["timeouts"], header["nonzero_exits"]) == ("Submitted", 7, 1, 1, 1)
    assert header["usage"]["total_tokens"] == 7780 and header["config"]["environment.timeout"] == 1.0
    step5 = data["steps"][4]
    assert step5["elided_chars"] == 104894 and step5["output_chars"] == 108894
    assert step5["observation"].startswith("<returncode>0</returncode>") and "elided by miniswe" in step5["output"]
    assert data["steps"][3]["timed_out"] and data["steps"][3]["error"] and data["steps"][1]["format_error"] == "no_action"
    assert set(data["steps"][0]) == {"step", "thought", "reasoning", "command", "format_error", "returncode", "timed_out",
                                     "aborted", "status", "error", "duration_s", "observation", "output", "output_chars",
                                     "elided_chars", "tokens", "prompt_tokens", "completion_tokens", "cost", "latency_s",
                                     "finish_reason"}


def test_aborted_steps_and_unfinished_runs_are_marked(cli, tmp_path):
    path = tmp_path / "t.json"
    trajectory = Trajectory(str(path), task="stop me", config={}, environment={})
    trajectory.record_step(Step(1, command="sleep 100", output="partial\n", output_chars=8, aborted="SIGTERM", duration_s=2.5))
    trajectory.save()
    out = cli("inspect", str(path)).stdout
    assert "exit       unfinished (no exit status yet)" in out
    assert "━━ step 1 · aborted (SIGTERM) · 2.50s" in out
    assert "(no observation (the run ended here); output as stored)\n│ partial" in out


def test_control_characters_in_outputs_reach_no_terminal(cli, tmp_path):
    path = tmp_path / "t.json"
    trajectory = Trajectory(str(path), task="colours\x1b]0;title\x07", config={}, environment={})
    nasty = "\x1b[2J\x1b]52;c;Y2xpcGJvYXJk\x07red\x1b[31m\r\n\x9b1m\x7f"
    trajectory.record_step(Step(1, command="printf '\\033[2J'", output=nasty, output_chars=len(nasty), returncode=0))
    trajectory.save()
    for out in (cli("inspect", str(path), "--full").stdout,
                in_terminal(["inspect", str(path), "--full"], env={"PAGER": "cat"}, rows=100)[0]):
        shown = ANSI.sub("", out)
        assert "\x1b]" not in out and "\x07" not in out and "\x9b" not in out and "\x1b[2J" not in out
        assert "␛[2J␛]52;c;Y2xpcGJvYXJk␇red␛[31m\n" in shown.replace("\r\n", "\n") and "\\x9b1m␡" in shown
    assert json.loads(cli("inspect", str(path), "--json").stdout)["steps"][0]["output"] == nasty, "--json keeps the data as it is"


def test_reference_formats_say_what_they_did_not_record(cli):
    out = cli("inspect", str(REFERENCE / "mini-swe-agent-1-submitted.traj.json")).stdout
    assert "file       " in out and "(mini-swe-agent-1)" in out
    assert "tokens     not recorded · 10 model calls" in out and "wall time  —" in out
    assert re.search(r"^missing    .*how long each command ran", out, re.M)
    assert "━━ step 1 · rc=1 · — · — tokens" in out and "━━ step 10 · rc=? · — · — tokens" in out
    data = json.loads(cli("inspect", str(REFERENCE / "mini-swe-agent-1-limits-exceeded.traj.json"), "--json", "--errors").stdout)
    assert data["header"]["source"] == "mini-swe-agent-1" and data["header"]["model"] == "claude-sonnet-4-20250514"
    assert [s["step"] for s in data["steps"]] == [2] and data["steps"][0]["duration_s"] is None
    assert data["header"]["usage"]["total_tokens"] is None and data["header"]["usage"]["cost"] == pytest.approx(0.96214065)


def test_a_run_directory_is_one_row_per_task(cli, tmp_path):
    run = tmp_path / "run"
    records = write_run_dir(str(run), 20)
    out = cli("inspect", str(run)).stdout
    rows = [line for line in out.splitlines() if line.startswith("task-")]
    assert len(rows) == 20 and out.splitlines()[0].startswith("run directory ")
    assert "20 tasks · Submitted 12 · LimitsExceeded 2" in out and "resolved 8 of 20 (40.0%)" in out
    data = json.loads(cli("inspect", str(run), "--json", "--sort", "cost").stdout)
    assert data["inspect"] == "run" and len(data["rows"]) == 20
    costs = [row["cost"] for row in data["rows"]]
    assert costs == sorted(costs, reverse=True), "numbers sort largest first"
    assert data["totals"]["cost"] == pytest.approx(sum(r.cost for r in records))
    picked = json.loads(cli("inspect", str(run), "--json", "--status", "modelerror,TimeExceeded", "--sort", "id").stdout)
    assert [row["id"] for row in picked["rows"]] == ["task-0007", "task-0009", "task-0017", "task-0019"]
    bad = cli("inspect", str(run), "--status", "Done")
    assert bad.returncode == 2 and "--status Done: not an exit status (one of Submitted" in bad.stderr
    bad = cli("inspect", str(run), "--sort", "speed")
    assert bad.returncode == 2 and "--sort speed: no such column (one of id, status, resolved" in bad.stderr
    bad = cli("inspect", str(run), "--errors")
    assert bad.returncode == 2 and "--errors applies to a trajectory" in bad.stderr


def test_not_a_run_directory_or_no_such_path(cli, tmp_path):
    result = cli("inspect", str(tmp_path))
    assert result.returncode == 2 and "not a miniswe batch run directory" in result.stderr
    result = cli("inspect", str(tmp_path / "nope.json"))
    assert result.returncode == 2 and "nope.json: no such file or directory" in result.stderr
    (tmp_path / "x.json").write_text('{"trajectory_format": "other"}')
    result = cli("inspect", str(tmp_path / "x.json"))
    assert result.returncode == 2 and "not a trajectory miniswe can read (found trajectory_format 'other'" in result.stderr


# -- comparisons ----------------------------------------------------------------------------------------------------
def _variant(tmp_path, name, change):
    data = json.loads(open(V2).read())
    change(data)
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def test_two_trajectories_of_one_task_diverge_where_their_commands_do(cli, tmp_path):
    def other_command(data):
        data["steps"][2]["command"] = "cat notes.txt"
        data["steps"][2]["returncode"] = 0
        data["usage"]["total_tokens"] = 9000
    b = _variant(tmp_path, "b.json", other_command)
    result = cli("inspect", V2, b)
    assert result.returncode == 0 and result.stderr == ""
    out = result.stdout
    assert "first divergence at step 3: the commands differ" in out
    assert "  A  $ cat missing-file.txt   [rc=1]" in out and "  B  $ cat notes.txt   [rc=0]" in out
    assert re.search(r"^tokens\s+7,780\s+9,000$", out, re.M) and re.search(r"^steps\s+7\s+7$", out, re.M)
    data = json.loads(cli("inspect", V2, b, "--json").stdout)
    assert data["inspect"] == "compare-trajectories" and data["same_task"]
    assert data["divergence"]["step"] == 3 and data["divergence"]["a"]["command"] == "cat missing-file.txt"
    same = json.loads(cli("inspect", V2, V2, "--json").stdout)
    assert same["divergence"] is None


def test_divergence_by_output_and_by_an_early_end_and_a_different_task(cli, tmp_path):
    def other_output(data):
        data["steps"][0]["output"] = "other\n"
    out = cli("inspect", V2, _variant(tmp_path, "b.json", other_output)).stdout
    assert "first divergence at step 1: the same command printed different output" in out

    def shorter(data):
        data["steps"] = data["steps"][:4]
        data["task"] = "Another task"
    result = cli("inspect", _variant(tmp_path, "c.json", shorter), V2)
    assert "first divergence at step 5: A ended after step 4" in result.stdout
    assert "  A  (no step 5: the run had ended)" in result.stdout
    assert "warning: the two runs are of different tasks" in result.stdout and result.stderr == ""
    as_json = cli("inspect", _variant(tmp_path, "c.json", shorter), V2, "--json")
    assert "warning: the two trajectories are of different tasks" in as_json.stderr


def test_reference_runs_compare_too(cli):
    a, b = (str(REFERENCE / name) for name in ("mini-swe-agent-1-submitted.traj.json", "mini-swe-agent-list-format.traj.json"))
    result = cli("inspect", a, b)
    assert result.returncode == 0, result.stderr
    assert "first divergence at step 2: the same command printed different output" in result.stdout
    assert re.search(r"^tokens\s+—\s+—$", result.stdout, re.M), "tokens not recorded, not 0"


def test_two_run_directories_per_task_changes(cli, tmp_path):
    write_run_dir(str(tmp_path / "a"), 12)
    statuses = [ExitStatus.SUBMITTED] * 5 + [ExitStatus.LIMITS_EXCEEDED]  # another mix: some tasks change
    write_run_dir(str(tmp_path / "b"), 14, statuses=statuses)
    data = json.loads(cli("inspect", str(tmp_path / "a"), str(tmp_path / "b"), "--json").stdout)
    assert data["inspect"] == "compare-runs"
    changes = {c["id"]: c["change"] for c in data["changes"]}
    # a: task i is Submitted for i%10<6, resolved when also i%3!=0; b: Submitted for i%6<5, resolved likewise
    assert data["newly_resolved"] == sorted(i for i, c in changes.items() if c == "newly resolved")
    assert "task-0007" in data["newly_resolved"] and "task-0005" in data["newly_failed"]
    assert changes["task-0006"] == "status changed" and data["only_in_b"] == ["task-0012", "task-0013"]
    assert data["only_in_a"] == [] and data["unchanged"] == 12 - len(changes)
    out = cli("inspect", str(tmp_path / "a"), str(tmp_path / "b")).stdout
    assert f"newly resolved ({len(data['newly_resolved'])}): task-0007" in out and "only in B: task-0012, task-0013" in out
    mixed = cli("inspect", str(tmp_path / "a"), V2)
    assert mixed.returncode == 2 and "not one of each" in mixed.stderr


# -- on a terminal --------------------------------------------------------------------------------------------------
def in_terminal(args, env=None, rows=30, cols=120, timeout=60):
    """Run miniswe with a pty as stdin/stdout/stderr; (output, exit code, the CPU seconds it used)."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: its terminal has the given size
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        os.chdir(ROOT)
        os.execvpe(miniswe_cmd()[0], [*miniswe_cmd(*args)], clean_env(**(env or {})))
    out = b""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            os.kill(pid, 9)
            raise AssertionError(f"miniswe inspect did not finish within {timeout}s")
        if select.select([fd], [], [], min(left, 1))[0]:
            try:
                chunk = os.read(fd, 1 << 16)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
    _, status, usage = os.wait4(pid, 0)
    os.close(fd)
    return out.decode("utf-8", "replace"), os.waitstatus_to_exitcode(status), usage.ru_utime + usage.ru_stime


def test_on_a_terminal_colours_unless_no_color(tmp_path):
    out, code, _ = in_terminal(["inspect", V2, "--steps", "3:3"], env={"PAGER": "cat"}, rows=200)
    assert code == 0 and ANSI.search(out) and "cat missing-file.txt" in ANSI.sub("", out)
    plain, code, _ = in_terminal(["inspect", V2, "--steps", "3:3"], env={"NO_COLOR": "1", "PAGER": "cat"}, rows=200)
    assert code == 0 and not ANSI.search(plain) and "━━ step 3 · rc=1" in plain


def test_the_pager_is_used_only_when_the_text_is_longer_than_the_terminal(tmp_path):
    marker = tmp_path / "paged"
    script = tmp_path / "pager"
    script.write_text(f"#!/bin/sh\ncat > /dev/null\necho paged >> {marker}\n")  # a pager that records it was used
    script.chmod(0o755)
    pager = f"{script} -R"
    _, code, _ = in_terminal(["inspect", V2], env={"PAGER": pager}, rows=20)
    assert code == 0 and marker.read_text() == "paged\n"
    _, code, _ = in_terminal(["inspect", V2, "--step", "1"], env={"PAGER": pager}, rows=200)
    assert code == 0 and marker.read_text() == "paged\n", "a short text is not paged"
    out, code, _ = in_terminal(["inspect", V2, "--no-pager"], env={"PAGER": pager}, rows=20)
    assert code == 0 and marker.read_text() == "paged\n" and "submission:" in ANSI.sub("", out)
    _, code, _ = in_terminal(["inspect", V2, "--json"], env={"PAGER": pager}, rows=20)
    assert code == 0 and marker.read_text() == "paged\n", "--json is never paged"
    out, code, _ = in_terminal(["inspect", V2], env={"PAGER": "no-such-pager -R"}, rows=20)
    assert code == 0 and "submission:" in ANSI.sub("", out), "a pager that is not installed must not eat the text"


def test_a_5000_step_trajectory_renders_quickly(tmp_path, cli):
    path = str(tmp_path / "long.traj.json")
    write_trajectory(path, 5000)
    # CPU seconds, not wall time: the tests running beside this one (pytest-xdist) do not count
    out, code, seconds = in_terminal(["inspect", path, "--no-pager"], rows=50, timeout=60)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    plain = cli("inspect", path)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    plain_seconds = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    print(f"\n5,000 steps: {seconds:.2f}s CPU on a terminal (rich), {plain_seconds:.2f}s plain")
    assert code == 0 and ANSI.sub("", out).count("━━ step ") == 5000
    assert plain.stdout.count("\n━━ step ") == 5000
    assert seconds < 15 and plain_seconds < 10, "generous bounds: the machine is shared; measured ~1-2 s"


@pytest.mark.skipif(not shutil.which("less"), reason="less is not installed")
def test_default_pager_is_less_with_colours(tmp_path):
    env = {k: v for k, v in clean_env().items() if k not in ("PAGER", "LESS")}
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "less").write_text(f"#!/bin/sh\necho \"$@ LESS=$LESS\" > {tmp_path / 'args'}\ncat > /dev/null\n")
    (fake / "less").chmod(0o755)
    env["PATH"] = f"{fake}:{env['PATH']}"
    _, code, _ = in_terminal(["inspect", V2], env=env, rows=10)
    assert code == 0 and (tmp_path / "args").read_text() == "-R LESS=FRX\n"


def test_old_trajectories_inspect_like_new_ones(cli):
    for name in sorted(os.listdir(DATA / "trajectories")):
        result = cli("inspect", str(DATA / "trajectories" / name), "--json")
        data = json.loads(result.stdout)
        assert data["header"]["source"] == "miniswe-trajectory" and len(data["steps"]) == len(load(str(DATA / "trajectories" / name)).steps)


def test_a_killed_resumed_and_forked_run_shows_its_history(cli, server, tmp_path):
    import subprocess

    from conftest import act
    from replies import SUBMIT_MARKER

    (tmp_path / "work").mkdir()
    server.push(act("echo one"), act("echo started; sleep 60"), act(f"echo {SUBMIT_MARKER}"))
    endpoint = ["--base-url", server.base_url, "-m", "m"]
    proc = subprocess.Popen(miniswe_cmd("run", "t", *endpoint, "--cwd", "work", "-o", "t.json"), cwd=tmp_path,
                            env=clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while '"pending": {"step": 2' not in ((tmp_path / "t.json").read_text() if (tmp_path / "t.json").exists() else ""):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.02)
    proc.kill()
    proc.wait(10)

    killed = json.loads(cli("inspect", "t.json", "--json").stdout)
    assert killed["header"]["pending"] == 2 and killed["header"]["steps"] == 1
    last = killed["steps"][-1]
    assert last["step"] == 2 and last["pending"] and last["status"] == "cut short / never finished"
    assert last["command"] == "echo started; sleep 60" and last["error"]
    text = cli("inspect", "t.json").stdout
    assert "━━ step 2 · cut short / never finished" in text and "$ echo started; sleep 60" in text
    assert "in flight  step 2: its command never finished (the run was killed)" in text
    assert [s["step"] for s in json.loads(cli("inspect", "t.json", "--json", "--errors").stdout)["steps"]] == [2]

    resumed = cli("run", "--resume", "t.json", *endpoint, "-c", "agent.step_limit=9")
    assert resumed.returncode == 0, resumed.stderr
    header = json.loads(cli("inspect", "t.json", "--json").stdout)["header"]
    assert header["pending"] is None and len(header["resumes"]) == 1
    assert header["resumes"][0]["from_step"] == 1 and "agent.step_limit" in header["resumes"][0]["changes"]
    assert "resumed    at " in cli("inspect", "t.json").stdout and "after step 1 · changed agent.step_limit" in \
        cli("inspect", "t.json").stdout

    (tmp_path / "fresh").mkdir()
    server.push(act(f"echo {SUBMIT_MARKER}"))
    fork = cli("run", "--fork", "t.json", "--from-step", "1", "-o", "f.json", "--cwd", "fresh", *endpoint)
    assert fork.returncode == 0, fork.stderr
    forked = json.loads(cli("inspect", "f.json", "--json").stdout)["header"]["parent"]
    assert forked["from_step"] == 1 and forked["trajectory"] == str(tmp_path / "t.json")
    assert f"forked     from {tmp_path / 't.json'} at step 1" in cli("inspect", "f.json").stdout


def test_a_changed_command_shows_what_the_model_proposed_and_what_ran(cli, tmp_path):
    path = tmp_path / "t.json"
    trajectory = Trajectory(str(path), task="t", config={}, environment={})
    trajectory.record_step(Step(1, command="rm -i build.log", proposed="rm -rf build", returncode=0, output=""))
    trajectory.save()
    out = cli("inspect", str(path)).stdout
    assert "━━ step 1 · rc=0 · command changed" in out
    assert "proposed $ rm -rf build\n(changed before it ran; what ran:)\n$ rm -i build.log" in out
    step = json.loads(cli("inspect", str(path), "--json").stdout)["steps"][0]
    assert step["proposed"] == "rm -rf build" and step["command"] == "rm -i build.log"


def test_an_interrupted_batch_lists_every_selected_task(cli, tmp_path):
    import subprocess

    import yaml
    from conftest import act
    from openai_server import ScriptedServer
    from waiting import wait_for

    counter = act('n=$(( $(cat .n 2>/dev/null || echo 0) + 1 )); echo $n > .n; sleep "${SLEEP:-0}"; '
                  'if [ "$n" -ge "${STEPS:-3}" ]; then echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; else echo "step $n"; fi')
    tasks = [{"id": f"t{i}", "task": "count", "env": {"env": {"STEPS": "1" if i < 2 else "3", "SLEEP": "0" if i < 2 else "20"}}}
             for i in range(6)]
    (tmp_path / "tasks.yaml").write_text(yaml.safe_dump(tasks, sort_keys=False))
    run = tmp_path / "run"
    with ScriptedServer(default=counter) as server:
        proc = subprocess.Popen(miniswe_cmd("batch", "tasks.yaml", "-o", "run", "--base-url", server.base_url, "-m", "m",
                                            "-w", "2", "-c", "environment.timeout=30"),
                                cwd=tmp_path, env=clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                stdin=subprocess.DEVNULL)
        try:
            wait_for(lambda: (run / "results.jsonl").exists() and len((run / "results.jsonl").read_text().splitlines()) == 2
                     and all((run / t / f"{t}.traj.json").exists() for t in ("t2", "t3")), "two done, two in flight")
        finally:
            proc.kill()
            proc.wait(10)
    view = json.loads(cli("inspect", str(run), "--json", "--sort", "id").stdout)
    assert [(r["id"], r["exit_status"]) for r in view["rows"]] == [
        ("t0", "Submitted"), ("t1", "Submitted"), ("t2", "unfinished"), ("t3", "unfinished"), ("t4", "not run"),
        ("t5", "not run")]
    assert view["totals"]["unfinished"] == 2 and view["totals"]["not_run"] == 2 and view["totals"]["tasks"] == 2
    picked = json.loads(cli("inspect", str(run), "--json", "--status", "unfinished", "--sort", "id").stdout)
    assert [r["id"] for r in picked["rows"]] == ["t2", "t3"]
    assert [r["id"] for r in json.loads(cli("inspect", str(run), "--json", "--status", "not run").stdout)["rows"]] == ["t4", "t5"]
    text = cli("inspect", str(run)).stdout
    assert "unfinished 2 · not run 2" in text and re.search(r"^t4\s+not run", text, re.M)


def test_a_cost_no_format_recorded_is_not_shown_as_free(cli):
    listed = str(REFERENCE / "mini-swe-agent-list-format.traj.json")
    assert re.search(r"^cost\s+not recorded$", cli("inspect", listed).stdout, re.M)
    header = json.loads(cli("inspect", listed, "--json").stdout)["header"]
    assert header["usage"]["cost"] is None and "the run's cost" in header["not_recorded"]
    recorded = json.loads(cli("inspect", str(REFERENCE / "mini-swe-agent-1-submitted.traj.json"), "--json").stdout)
    assert recorded["header"]["usage"]["cost"] == 1.0, "a total with no per-call costs is still the cost"
