"""protocol.kind: tools: the same loop over native tool calls, against the scripted server (real subprocesses, real
HTTP) and the scripted model: steps per call, tool messages, format errors with guidance, the command policy, the
file tools and their confinement, streamed calls, replay."""

import json
import os

import pytest

from miniswe.config import load_config
from miniswe.runner import run_task
from miniswe.status import ExitStatus

from replies import TOOL_SUBMIT, act, call, calls

TOOLS = ["-c", "protocol.kind=tools"]


def endpoint(server):
    return ["--base-url", server.base_url, "-m", "test-model"]


def traj(path):
    return json.loads(path.read_text())


def run(tmp_path, replies, *overrides, cwd=None):
    """A tools run in-process with the scripted model and the real local environment."""
    script = tmp_path / "replies.json"
    script.write_text(json.dumps(replies))
    work = cwd or tmp_path / "work"
    work.mkdir(exist_ok=True)
    config = load_config("model.kind=scripted", f"model.script={script}", f"environment.cwd={work}",
                         "protocol.kind=tools", *overrides)
    path = tmp_path / "t.traj.json"
    result = run_task(config, "fix it", str(path))
    return result, traj(path)


def test_a_tool_calling_run_against_the_server_submits(cli, server, tmp_path):
    server.push(calls(call("bash", command="echo hello > f.txt && cat f.txt"), content="Writing the file."),
                calls(call("submit", command="cat f.txt")))
    result = cli("run", "Say hello", *endpoint(server), *TOOLS, "-o", "t.json")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Submitted · 2 steps")
    data = traj(tmp_path / "t.json")
    assert data["exit_status"] == "Submitted" and data["submission"] == "hello\n"
    first = server.requests[0]["body"]
    assert [tool["function"]["name"] for tool in first["tools"]] == ["bash", "submit"]
    assert first["tools"][0]["function"]["parameters"]["required"] == ["command"]
    # the conversation as the model saw it: its calls on the assistant message, each answered by a tool message
    second = server.requests[1]["body"]["messages"]
    assert [m["role"] for m in second] == ["system", "user", "assistant", "tool"]
    assert second[2]["tool_calls"][0]["function"] == {"name": "bash", "arguments": json.dumps({"command": "echo hello > f.txt && cat f.txt"})}
    assert second[3]["tool_call_id"] == second[2]["tool_calls"][0]["id"] == "call_1_1"
    assert "<returncode>0</returncode>" in second[3]["content"] and "hello" in second[3]["content"]
    # the same in the trajectory, and each step names its call
    assert [m["role"] for m in data["messages"]] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert data["messages"][3]["tool_call_id"] == "call_1_1" and data["messages"][5]["tool_call_id"] == "call_2_1"
    step = data["steps"][0]
    assert step["command"] == "echo hello > f.txt && cat f.txt" and step["output"] == "hello\n"
    assert step["thought"] == "Writing the file."
    assert step["tool_call"] == {"id": "call_1_1", "name": "bash", "arguments": json.dumps({"command": "echo hello > f.txt && cat f.txt"}),
                                 "index": 0}
    assert data["steps"][1]["command"] == "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat f.txt"
    assert "$ echo hello > f.txt && cat f.txt" in result.stderr  # the display shows tool steps like any step
    system = first["messages"][0]["content"]
    assert "`bash` runs one shell command" in system and "```" not in system


def test_the_text_protocol_sends_no_tools_and_its_messages_are_as_before(cli, server, tmp_path):
    server.push(act("echo hi"), act("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"))
    assert cli("run", "x", *endpoint(server), "-o", "t.json").returncode == 0
    assert "tools" not in server.requests[0]["body"]
    assert all(set(m) <= {"role", "content", "timestamp", "step"} for m in traj(tmp_path / "t.json")["messages"])
    assert all("tool_call" not in step and "children" not in step for step in traj(tmp_path / "t.json")["steps"])


def test_each_call_of_a_reply_is_a_step_and_the_call_is_counted_once(tmp_path):
    replies = [{**calls(call("bash", command="echo one"), call("bash", command="echo two")), "usage": {"total_tokens": 500}},
               TOOL_SUBMIT]
    result, data = run(tmp_path, replies)
    assert result.outcome.status is ExitStatus.SUBMITTED and data["submission"] == "the patch"
    one, two, submit = data["steps"]
    assert (one["step"], two["step"], submit["step"]) == (1, 2, 3)
    assert one["output"] == "one\n" and two["output"] == "two\n"
    assert one["usage"]["total_tokens"] == 500 and two["usage"]["total_tokens"] == 0
    assert (one["tool_call"]["index"], two["tool_call"]["index"]) == (0, 1)
    assert data["usage"]["model_calls"] == 2 and data["usage"]["total_tokens"] == 500 + submit["usage"]["total_tokens"]
    tool_messages = [m for m in data["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == ["call_1", "call_2", "call_1"]
    assert [m["step"] for m in tool_messages] == [1, 2, 3]
    # reloading counts each model call once
    from miniswe.trajectory import load

    loaded = load(str(tmp_path / "t.traj.json"))
    assert [s.usage.model_calls for s in loaded.steps] == [1, 0, 1]


def test_calls_after_a_submission_are_answered_as_not_run(tmp_path):
    replies = [calls(call("submit"), call("bash", command="touch late"))]
    result, data = run(tmp_path, replies)
    assert result.outcome.status is ExitStatus.SUBMITTED
    assert len(data["steps"]) == 1 and not (tmp_path / "work" / "late").exists()
    last = data["messages"][-1]
    assert last["role"] == "tool" and last["tool_call_id"] == "call_2" and "Not run: the run ended (Submitted)" in last["content"]


@pytest.mark.parametrize(("bad", "kind", "says"), [
    (call("bash", '{"command": "ls"'), "bad_arguments", "bash: its arguments are not valid JSON"),
    (call("bash", '["ls"]'), "bad_arguments", "its arguments must be a JSON object, not list"),
    (call("bash", {"cmd": "ls"}), "bad_arguments", "bash: `command` is missing"),
    (call("bash", {"command": 7}), "bad_arguments", "bash: `command` must be a string"),
    (call("bahs", {"command": "ls"}), "unknown_tool", "there is no tool 'bahs' (did you mean 'bash'?"),
], ids=["broken-json", "not-an-object", "missing", "wrong-type", "unknown-tool"])
def test_malformed_arguments_are_a_format_error_with_guidance(tmp_path, bad, kind, says):
    result, data = run(tmp_path, [calls(bad), TOOL_SUBMIT])
    assert result.outcome.status is ExitStatus.SUBMITTED
    step = data["steps"][0]
    assert step["format_error"] == kind and step["command"] is None and step["tool_call"]["name"] == bad["name"]
    guidance = data["messages"][3]
    assert guidance["role"] == "tool" and guidance["tool_call_id"] == "call_1"
    assert says in guidance["content"] and "2 more malformed replies will end the run" in guidance["content"]
    if kind == "bad_arguments":
        assert 'e.g. {"command": "ls -la"}' in guidance["content"] or "JSON object" in guidance["content"]


def test_a_reply_without_a_call_gets_guidance_and_three_in_a_row_end_the_run(tmp_path):
    replies = [{"content": "I think the bug is in parse()."}, calls(call("bash", "{oops")),
               {**calls(call("bash", command="ls")), "finish_reason": "length"}, TOOL_SUBMIT]
    result, data = run(tmp_path, replies)
    assert result.outcome.status is ExitStatus.REPEATED_FORMAT_ERROR
    assert [s["format_error"] for s in data["steps"]] == ["no_tool_call", "bad_arguments", "truncated"]
    assert data["messages"][3]["role"] == "user" and "Every reply must call at least one tool" in data["messages"][3]["content"]
    assert "3 malformed replies in a row" in data["exit_detail"]


def test_one_good_call_in_a_reply_resets_the_format_error_count(tmp_path):
    replies = [{"content": "no call"}, {"content": "still none"},
               calls(call("bash", "{bad"), call("bash", command="echo fine")), {"content": "none"}, TOOL_SUBMIT]
    result, data = run(tmp_path, replies)
    assert result.outcome.status is ExitStatus.SUBMITTED
    assert [s["format_error"] for s in data["steps"]] == ["no_tool_call", "no_tool_call", "bad_arguments", None,
                                                          "no_tool_call", None]


def test_the_command_policy_refuses_a_bash_tool_call(cli, server, tmp_path):
    home = tmp_path / "home"
    (home / "keep").mkdir(parents=True)
    server.push(calls(call("bash", command="rm -rf ~")), calls(call("submit")))
    result = cli("run", "x", *endpoint(server), *TOOLS, "-o", "t.json", env={"HOME": str(home)})
    assert result.returncode == 0, result.stderr
    step = traj(tmp_path / "t.json")["steps"][0]
    assert step["refused"].startswith("refused by the command policy: it deletes the whole file system or the home folder")
    assert step["tool_call"]["name"] == "bash" and step["returncode"] is None
    answer = server.requests[1]["body"]["messages"][-1]
    assert answer["role"] == "tool" and "<returncode>refused</returncode>" in answer["content"]
    assert (home / "keep").is_dir()


def test_the_submit_tool_is_a_shell_command_the_policy_reads_too(tmp_path):
    result, data = run(tmp_path, [calls(call("submit", command="rm -rf /")), TOOL_SUBMIT])
    assert data["steps"][0]["refused"] and result.outcome.status is ExitStatus.SUBMITTED


# -- the file tools ------------------------------------------------------------------------------------------

FILES = ("protocol.file_tools=true",)


def test_file_tools_write_read_and_edit(tmp_path):
    replies = [
        calls(call("write_file", path="pkg/app.py", content="a = 1\nb = 2\nc = 3\n"),
              call("write_file", path="pkg/app.py", content="d = 4\n", mode="append"),
              call("read_file", path="pkg/app.py", start_line=2, end_line=3, numbered=True)),
        calls(call("edit_file", path="pkg/app.py", action="replace", old="b = 2", new="b = 20"),
              call("edit_file", path="pkg/app.py", action="insert", after_line=0, text="# header"),
              call("edit_file", path="pkg/app.py", action="delete", start_line=4, end_line=4),
              call("read_file", path="pkg/app.py")),
        TOOL_SUBMIT,
    ]
    result, data = run(tmp_path, replies, *FILES)
    assert result.outcome.status is ExitStatus.SUBMITTED, data["exit_detail"]
    outputs = [s["output"] for s in data["steps"]]
    assert outputs[0] == "wrote 18 bytes to pkg/app.py" and outputs[1] == "appended 6 bytes to pkg/app.py"
    assert outputs[2] == "     2\tb = 2\n     3\tc = 3\n"
    assert outputs[3] == "edited pkg/app.py: replaced 1 occurrence (the first at line 2)"
    assert outputs[5] == "edited pkg/app.py: deleted lines 4-4"
    assert outputs[6] == "# header\na = 1\nb = 20\nd = 4\n" == (tmp_path / "work" / "pkg" / "app.py").read_text()
    commands = [s["command"] for s in data["steps"][:4]]
    assert commands == ["write_file pkg/app.py (18 bytes)", "write_file pkg/app.py (6 bytes, append)",
                        "read_file pkg/app.py (lines 2-3)", "edit_file pkg/app.py: replace 5 chars with 6"]
    assert all(s["returncode"] == 0 for s in data["steps"])
    system = data["messages"][0]["content"]
    assert "`read_file`, `write_file` and `edit_file`" in system


def test_read_file_stops_at_its_size_cap_and_says_how_to_read_on(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "big.txt").write_text("".join(f"line {n:04d}\n" for n in range(1, 1001)))
    replies = [calls(call("read_file", path="big.txt", max_chars=50), call("read_file", path="big.txt", start_line=999)),
               TOOL_SUBMIT]
    result, data = run(tmp_path, replies, *FILES, "agent.output_limit=100")
    first, second = data["steps"][0]["output"], data["steps"][1]["output"]
    assert first.startswith("line 0001\nline 0002\n") and first.count("\n") == 5
    assert first.endswith("[read_file: lines 1-5 of 1000 shown (max_chars 50); read on with start_line=6]")
    assert second == "line 0999\nline 1000\n"
    # asking for more than the output limit gets the output limit
    replies = [calls(call("read_file", path="big.txt", max_chars=100000)), TOOL_SUBMIT]
    result, data = run(tmp_path, replies, *FILES, "agent.output_limit=100", cwd=work)
    assert "(max_chars 100)" in data["steps"][0]["output"]


def test_file_tools_are_confined_to_the_working_directory(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("top secret\n")
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    (work / "inside.txt").write_text("fine\n")
    os.symlink(outside, work / "door")  # a link inside leading out
    os.symlink(outside / "secret.txt", work / "sub" / "note.txt")
    os.symlink(work / "inside.txt", work / "alias.txt")  # a link that stays inside is fine
    replies = [calls(
        call("read_file", path="../outside/secret.txt"),
        call("read_file", path=str(outside / "secret.txt")),
        call("read_file", path="door/secret.txt"),
        call("read_file", path="sub/note.txt"),
        call("write_file", path="door/planted.txt", content="x"),
        call("write_file", path="sub/../../outside/planted.txt", content="x"),
        call("edit_file", path="sub/note.txt", action="replace", old="top", new="no"),
        call("write_file", path="~/planted.txt", content="x"),
        call("read_file", path="alias.txt"),
        call("read_file", path=str(work / "inside.txt")),
    ), TOOL_SUBMIT]
    result, data = run(tmp_path, replies, *FILES, cwd=work)
    steps = data["steps"][:10]
    for step in steps[:8]:
        assert step["returncode"] == 1 and step["output"].startswith("error: "), step
        assert "secret" not in step["output"].replace("secret.txt", "")
    for step in steps[:7]:
        assert "outside the working directory" in step["output"]
    assert "through a symbolic link" in steps[2]["output"] and "through a symbolic link" in steps[3]["output"]
    assert "relative to the working directory" in steps[7]["output"]
    assert steps[8]["output"] == steps[9]["output"] == "fine\n"
    assert sorted(os.listdir(outside)) == ["secret.txt"] and (outside / "secret.txt").read_text() == "top secret\n"
    assert not (tmp_path / "work" / "~").exists()


def test_a_write_over_the_per_call_cap_is_refused_before_it_runs(tmp_path):
    replies = [calls(call("write_file", path="big.txt", content="x" * (64 * 1024 + 1))), TOOL_SUBMIT]
    result, data = run(tmp_path, replies, *FILES)
    step = data["steps"][0]
    assert step["returncode"] == 1 and "takes at most 65536 per call" in step["output"] and "mode: append" in step["output"]
    assert not (tmp_path / "work" / "big.txt").exists()


def test_edit_file_explains_what_it_cannot_do(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "a.py").write_text("x = 1\nx = 1\n")
    (work / "bin.dat").write_bytes(b"\0\1\2")
    replies = [calls(call("edit_file", path="a.py", action="replace", old="x = 1", new="x = 2"),
                     call("edit_file", path="a.py", action="replace", old="y", new="z"),
                     call("edit_file", path="a.py", action="delete", start_line=2, end_line=9),
                     call("edit_file", path="a.py", action="insert", after_line=1),
                     call("read_file", path="bin.dat"),
                     call("edit_file", path="missing.py", action="delete", start_line=1, end_line=1)),
               TOOL_SUBMIT]
    result, data = run(tmp_path, replies, *FILES, cwd=work)
    out = [s["output"] or s["format_error"] for s in data["steps"]]
    assert "occurs 2 times" in out[0] and "was not found" in out[1] and "has 2 lines" in out[2]
    assert out[3] == "bad_arguments" and "action insert needs `text`" in data["messages"][6]["content"]
    assert "binary file" in out[4] and "no such file" in out[5]
    assert (work / "a.py").read_text() == "x = 1\nx = 1\n"


def test_file_tools_are_not_offered_unless_enabled_and_a_call_to_one_is_a_format_error(tmp_path):
    result, data = run(tmp_path, [calls(call("write_file", path="a", content="b")), TOOL_SUBMIT])
    assert data["steps"][0]["format_error"] == "unknown_tool"
    assert "the tools are bash, submit" in data["messages"][3]["content"]


def test_a_tools_run_replays_with_its_file_tools(cli, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    script = tmp_path / "replies.json"
    script.write_text(json.dumps([calls(call("write_file", path="a.txt", content="one\n"),
                                        call("edit_file", path="a.txt", action="replace", old="one", new="two"),
                                        call("read_file", path="a.txt"), call("bash", command="cat a.txt")),
                                  TOOL_SUBMIT]))
    ran = cli("run", "x", "--script", str(script), "--cwd", str(work), *TOOLS, "-c", "protocol.file_tools=true", "-o", "t.json")
    assert ran.returncode == 0, ran.stderr
    (work / "a.txt").unlink()
    replayed = cli("replay", "t.json", "--cwd", str(work))
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert "matched: 5 command(s)" in replayed.stdout
    assert (work / "a.txt").read_text() == "two\n"


# -- streaming -----------------------------------------------------------------------------------------------

def test_streamed_tool_calls_are_assembled_into_the_same_reply(server):
    from miniswe.models.openai import OpenAIModel

    item = calls({**call("bash", command="grep -rn 'def parse' src/ | head -20"), "id": "c1"}, {**call("submit"), "id": "c2"},
                 content="Looking.")
    server.push(item, {**item, "piece": 2})
    config = load_config(f"model.base_url={server.base_url}", "model.name=m").model
    plain = OpenAIModel(config).complete([{"role": "user", "content": "x"}], tools=[{"type": "function"}])
    streamed = OpenAIModel(load_config(f"model.base_url={server.base_url}", "model.name=m", "model.stream=true").model
                           ).complete([{"role": "user", "content": "x"}], tools=[{"type": "function"}])
    plain.latency_s = streamed.latency_s = 0
    assert streamed == plain
    assert [c.name for c in streamed.tool_calls] == ["bash", "submit"] and streamed.finish_reason == "tool_calls"
    assert json.loads(streamed.tool_calls[0].arguments) == {"command": "grep -rn 'def parse' src/ | head -20"}
    assert all(request["body"]["tools"] == [{"type": "function"}] for request in server.requests)


def test_a_streamed_tools_run_submits(cli, server, tmp_path):
    server.push(calls(call("bash", command="echo streamed")), calls(call("submit", command="echo done")))
    result = cli("run", "x", *endpoint(server), *TOOLS, "-c", "model.stream=true", "-o", "t.json")
    assert result.returncode == 0, result.stderr
    data = traj(tmp_path / "t.json")
    assert data["steps"][0]["output"] == "streamed\n" and data["submission"] == "done\n"


def test_a_model_kind_that_cannot_call_tools_is_refused_at_start(cli, tmp_path):
    plugin = tmp_path / "plain_model.py"
    plugin.write_text("from miniswe.models import Reply\n\nclass Plain:\n    def __init__(self, config, **_):\n        pass\n"
                      "    def describe(self):\n        return {}\n"
                      "    def complete(self, messages, *, deadline=None):\n        return Reply('')\n")
    result = cli("run", "x", "-c", "model.kind=plain_model:Plain", *TOOLS, env={"PYTHONPATH": f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}"})
    assert result.returncode == 2
    assert "protocol.kind: tools: model kind 'plain_model:Plain' cannot call tools" in result.stderr


def test_chat_human_mode_commands_are_tool_calls_answered_in_order(tmp_path, monkeypatch):
    from miniswe.chat.session import ChatSession
    from miniswe.signals import Stop

    script = tmp_path / "replies.json"
    script.write_text(json.dumps([calls(call("bash", command="cat typed.txt")), TOOL_SUBMIT]))
    config = load_config("model.kind=scripted", f"model.script={script}", f"environment.cwd={tmp_path}", "protocol.kind=tools")
    monkeypatch.setenv("MINISWE_HOME", str(tmp_path / "home"))
    session = ChatSession(config, stop=Stop(), mode="human")
    try:
        session.act("echo typed > typed.txt")
        session.turn("show it")
    finally:
        session.close()
    data = session.trajectory.to_dict()
    assert data["exit_status"] == "Submitted"
    assert [s["output"] for s in data["steps"]][:2] == ["", "typed\n"]
    messages = [m for m in data["messages"] if m["role"] in ("assistant", "tool")]
    assert messages[0]["tool_calls"][0]["id"] == messages[1]["tool_call_id"] == "typed_1"


def test_a_tools_run_killed_mid_reply_resumes_with_every_call_answered(server, tmp_path):
    import subprocess
    import time

    from conftest import clean_env, miniswe_cmd

    (tmp_path / "work").mkdir()
    server.push(calls(call("bash", command="echo one >> log"), call("bash", command="echo two >> log; sleep 60"),
                      call("bash", command="echo three >> log")),
                TOOL_SUBMIT)
    endpoint_args = ["--base-url", server.base_url, "-m", "m", *TOOLS]
    proc = subprocess.Popen(miniswe_cmd("run", "t", *endpoint_args, "--cwd", "work", "-o", "t.json"), cwd=tmp_path,
                            env=clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    log = tmp_path / "work" / "log"
    deadline = time.monotonic() + 20
    while not log.exists() or "two" not in log.read_text():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.02)
    proc.kill()
    proc.wait(10)
    before = traj(tmp_path / "t.json")
    assert before["pending"]["step"] == 2 and before["pending"]["tool_call"]["index"] == 1
    resumed = subprocess.run(miniswe_cmd("run", "--resume", "t.json", *endpoint_args), cwd=tmp_path, env=clean_env(),
                             capture_output=True, text=True, timeout=60)
    assert resumed.returncode == 0, resumed.stderr
    sent = server.requests[1]["body"]["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool", "tool", "tool"]
    assert [m["tool_call_id"] for m in sent[3:]] == ["call_1_1", "call_1_2", "call_1_3"]
    assert "cut short (miniswe stopped)" in sent[4]["content"] and "Not run: the run stopped before this call" in sent[5]["content"]
    assert log.read_text() == "one\ntwo\n"  # the third call was never run behind the model's back
    after = traj(tmp_path / "t.json")
    assert after["exit_status"] == "Submitted" and after["usage"]["model_calls"] == 2
    assert [s["step"] for s in after["steps"]] == [1, 2, 3] and after["steps"][1]["aborted"] == "miniswe stopped"
