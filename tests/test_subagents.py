"""Sub-agents: `miniswe run --sub` from a text-protocol command, the `subagent` tool, their budget, depth, links and
usage; and the key, which no command sees. Real subprocesses against the scripted server."""

import json
import os

from miniswe.config import load_config
from miniswe.runner import run_task
from miniswe.status import ExitStatus

from replies import SUBMIT, TOOL_SUBMIT, act, call, calls

SENTINEL = "sk-sentinel-subagent-7d6c5b4a"


def endpoint(server):
    return ["--base-url", server.base_url, "-m", "test-model"]


def traj(path):
    return json.loads(open(path).read())


def submit(text):
    return act(f"echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && printf {text}")


def test_a_text_protocol_run_delegates_with_miniswe_run_sub(cli, server, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    server.push(
        act("miniswe run --sub 'Write hello into sub.txt'"),  # the parent asks
        act("echo hello > sub.txt; echo key=${#OPENAI_API_KEY}; env | grep -c sk-sentinel; "
            "echo depth=$MINISWE_DEPTH sub=${MINISWE_SUBAGENT:-none}"),  # the child, in the same directory
        submit("child-patch"),
        act("cat sub.txt"),  # the parent again
        submit("parent-patch"),
    )
    result = cli("run", "delegate", *endpoint(server), "--cwd", str(work), "-c", "agent.max_depth=1", "-o", "t.traj.json",
                 env={"OPENAI_API_KEY": SENTINEL})
    assert result.returncode == 0, result.stderr
    parent = traj(tmp_path / "t.traj.json")
    assert parent["exit_status"] == "Submitted" and parent["submission"] == "parent-patch"
    first = parent["steps"][0]
    assert first["returncode"] == 0 and first["output"].startswith("sub-agent Submitted after 2 model calls")
    assert first["output"].endswith("submission:\nchild-patch\n")
    link, = first["children"]
    assert link["trajectory"] == str(tmp_path / "t.step1.sub1.traj.json") and link["depth"] == 1
    assert link["task"] == "Write hello into sub.txt" and link["exit_status"] == "Submitted" and link["steps"] == 2
    child = traj(link["trajectory"])
    assert child["exit_status"] == "Submitted" and child["submission"] == "child-patch"
    assert child["metadata"]["depth"] == 1 and child["metadata"]["parent"]["step"] == 1
    assert child["metadata"]["parent"]["trajectory"] == str(tmp_path / "t.traj.json")
    # the child's usage is counted in the parent's: 5 calls in all
    assert link["usage"] == child["usage"] and parent["usage"]["model_calls"] == 5
    own = sum(step["usage"]["total_tokens"] for step in parent["steps"])
    assert parent["usage"]["total_tokens"] == own + child["usage"]["total_tokens"]
    # the child's calls carry the key (made by miniswe), its commands never see it; at max depth, no socket
    assert all(r["headers"]["authorization"] == f"Bearer {SENTINEL}" for r in server.requests)
    assert child["steps"][0]["output"] == "key=0\n0\ndepth=1 sub=none\n"
    assert parent["steps"][1]["output"] == "hello\n"
    assert (work / "sub.txt").read_text() == "hello\n"
    assert SENTINEL not in (tmp_path / "t.traj.json").read_text() + open(link["trajectory"]).read()
    # the child was told its task only, and no more delegation
    child_request = server.requests[1]["body"]["messages"]
    assert "Write hello into sub.txt" in child_request[1]["content"] and "miniswe run --sub" not in child_request[0]["content"]
    assert "miniswe run --sub" in server.requests[0]["body"]["messages"][0]["content"]
    assert "sub-agent (depth 1) started" in result.stderr
    shown = cli("inspect", "t.traj.json", "--no-pager")
    assert f"↳ sub-agent (depth 1): Submitted, 2 steps: {link['trajectory']}" in shown.stdout
    as_json = json.loads(cli("inspect", "t.traj.json", "--json").stdout)
    assert as_json["steps"][0]["children"][0]["exit_status"] == "Submitted" and "tool" not in as_json["steps"][0]


def test_a_chain_that_would_exceed_its_budget_stops_as_limits_exceeded_at_every_level(cli, server, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    server.push(
        act("miniswe run --sub 'level one'"),  # parent: call 1 of 3
        act("miniswe run --sub 'level two'"),  # child: call 1 of the 2 left
        act("echo still working"),  # grandchild: call 1 of the 1 left
        act("echo never asked"),
    )
    result = cli("run", "deep", *endpoint(server), "--cwd", str(work), "--step-limit", "3", "-c", "agent.max_depth=3",
                 "-o", "t.traj.json")
    assert result.returncode == 1, result.stderr
    parent = traj(tmp_path / "t.traj.json")
    child = traj(parent["steps"][0]["children"][0]["trajectory"])
    grandchild = traj(child["steps"][0]["children"][0]["trajectory"])
    assert [t["config"]["agent"]["step_limit"] for t in (parent, child, grandchild)] == [3, 2, 1]
    assert [t["exit_status"] for t in (grandchild, child, parent)] == ["LimitsExceeded"] * 3
    assert grandchild["exit_detail"] == "step_limit: 1 model calls" and child["exit_detail"] == "step_limit: 2 model calls"
    assert [t["usage"]["model_calls"] for t in (grandchild, child, parent)] == [1, 2, 3]
    assert len(server.requests) == 3  # nobody asked the model past the parent's budget
    # each level saw its child end, in its own step's output
    assert child["steps"][0]["output"].startswith("sub-agent LimitsExceeded after 1 model calls")
    assert child["steps"][0]["returncode"] == 1
    assert parent["steps"][0]["output"].startswith("sub-agent LimitsExceeded after 2 model calls")
    assert "step_limit" in result.stderr


def test_a_child_whose_parent_has_nothing_left_ends_at_once(tmp_path):
    script = tmp_path / "replies.json"
    script.write_text(json.dumps([{"content": act("miniswe run --sub 'more work'"), "usage": {"total_tokens": 1000}}]))
    config = load_config("model.kind=scripted", f"model.script={script}", f"environment.cwd={tmp_path}",
                         "agent.token_limit=1000", "agent.max_depth=1")
    result = run_task(config, "x", str(tmp_path / "t.traj.json"))
    assert result.outcome.status is ExitStatus.LIMITS_EXCEEDED and "token_limit" in result.outcome.detail
    link, = result.trajectory.steps[0].children
    assert link["exit_status"] == "LimitsExceeded" and link["steps"] == 0
    assert link["exit_detail"] == "token_limit: the parent run has no tokens left for a sub-agent"
    assert result.trajectory.steps[0].output.startswith("sub-agent LimitsExceeded after 0 model calls")


def test_the_subagent_tool_runs_a_child_in_the_same_environment(tmp_path):
    script = tmp_path / "replies.json"
    work = tmp_path / "work"
    work.mkdir()
    script.write_text(json.dumps([
        {**calls(call("subagent", task="Create notes.txt holding 'child'")), "usage": {"total_tokens": 100}},
        {**calls(call("bash", command="echo child > notes.txt")), "usage": {"total_tokens": 10}},
        {**calls(call("submit", command="cat notes.txt")), "usage": {"total_tokens": 10}},
        {**calls(call("bash", command="cat notes.txt")), "usage": {"total_tokens": 100}},
        {**TOOL_SUBMIT, "usage": {"total_tokens": 100}},
    ]))
    config = load_config("model.kind=scripted", f"model.script={script}", f"environment.cwd={work}",
                         "protocol.kind=tools", "agent.max_depth=1", "agent.token_limit=1000")
    result = run_task(config, "x", str(tmp_path / "t.traj.json"))
    assert result.outcome.status is ExitStatus.SUBMITTED, result.outcome.detail
    data = traj(tmp_path / "t.traj.json")
    first = data["steps"][0]
    assert first["command"] == "subagent: Create notes.txt holding 'child'"
    assert first["output"].startswith("sub-agent Submitted after 2 model calls (20 tokens") and first["returncode"] == 0
    assert first["output"].endswith("submission:\nchild\n")
    link, = first["children"]
    child = traj(link["trajectory"])
    assert child["config"]["agent"]["token_limit"] == 900 and child["config"]["protocol"]["kind"] == "tools"
    assert data["usage"]["total_tokens"] == 320 and data["usage"]["model_calls"] == 5
    assert data["steps"][1]["output"] == "child\n"
    offered = [t["function"]["name"] for t in json.loads(json.dumps(data["messages"][2]["tool_calls"]))]
    assert offered == ["subagent"]
    assert "call `subagent` with the task" in data["messages"][0]["content"]
    assert "`subagent`" not in child["messages"][0]["content"]  # depth 1 = max_depth: no further delegation


def test_a_tools_chain_that_would_exceed_its_token_budget(tmp_path):
    script = tmp_path / "replies.json"
    script.write_text(json.dumps([
        {**calls(call("subagent", task="one")), "usage": {"total_tokens": 400}},  # parent: 400 of 1000
        {**calls(call("subagent", task="two")), "usage": {"total_tokens": 400}},  # child: 400 of 600
        {**calls(call("bash", command="true")), "usage": {"total_tokens": 300}},  # grandchild: 300 of 200
        {**calls(call("bash", command="true")), "usage": {"total_tokens": 1}},
    ]))
    config = load_config("model.kind=scripted", f"model.script={script}", f"environment.cwd={tmp_path}",
                         "protocol.kind=tools", "agent.max_depth=5", "agent.token_limit=1000")
    result = run_task(config, "x", str(tmp_path / "t.traj.json"))
    parent = result.trajectory
    child = traj(parent.steps[0].children[0]["trajectory"])
    grandchild = traj(child["steps"][0]["children"][0]["trajectory"])
    assert [t["config"]["agent"]["token_limit"] for t in (child, grandchild)] == [600, 200]
    assert grandchild["exit_status"] == child["exit_status"] == "LimitsExceeded"
    assert result.outcome.status is ExitStatus.LIMITS_EXCEEDED and "token_limit: 1100 >= 1000" in result.outcome.detail
    assert parent.usage.total_tokens == 1100 and parent.usage.model_calls == 3


def test_at_max_depth_miniswe_run_sub_says_so_and_the_tool_is_not_offered(cli, server, tmp_path):
    server.push(act("miniswe run --sub 'x'; echo rc=$?"), SUBMIT)
    result = cli("run", "x", *endpoint(server), "--cwd", str(tmp_path), "-o", "t.traj.json")  # max_depth 0: no sub-agents
    assert result.returncode == 0
    output = traj(tmp_path / "t.traj.json")["steps"][0]["output"]
    assert "command not found" in output  # nothing to ask for: miniswe is not even put on the PATH
    direct = cli("run", "--sub", "x", env={"MINISWE_DEPTH": "2"})
    assert direct.returncode == 2
    assert "--sub: no run to ask for a sub-agent (this run is at depth 2, as deep as agent.max_depth" in direct.stderr
    refused = cli("run", "--sub", "x", "-m", "other", env={"MINISWE_SUBAGENT": str(tmp_path / "nowhere")})
    assert refused.returncode == 2 and "give it only the task (and smaller limits), not --model" in refused.stderr


def test_a_sub_agent_cut_short_by_its_command_timeout_is_stopped_and_counted(cli, server, tmp_path):
    server.push(act("miniswe run --sub 'slow work'"), act("sleep 30"), act("echo the parent goes on"), SUBMIT)
    result = cli("run", "x", *endpoint(server), "--cwd", str(tmp_path), "-c", "agent.max_depth=1",
                 "-c", "environment.timeout=4", "-o", "t.traj.json", timeout=60)
    assert result.returncode == 0, result.stderr
    parent = traj(tmp_path / "t.traj.json")
    link, = parent["steps"][0]["children"]
    child = traj(link["trajectory"])
    assert child["config"]["agent"]["time_limit"] <= 2.0
    assert child["exit_status"] == "TimeExceeded" and link["exit_status"] == "TimeExceeded"
    assert not parent["steps"][0]["timed_out"] and parent["steps"][0]["returncode"] == 1
    assert parent["steps"][1]["output"] == "the parent goes on\n"
    assert parent["usage"]["model_calls"] == 4  # the parent's 3 and the child's 1


def test_miniswe_on_path_is_this_miniswe_and_not_the_commands_python(cli, server, tmp_path):
    work = tmp_path / "work"
    (work / "typer").mkdir(parents=True)  # a repository's own package named like one of miniswe's must not shadow it
    (work / "typer" / "__init__.py").write_text("raise ImportError('shadowed')\n")
    server.push(act("PYTHONPATH=. miniswe run --sub 'nothing'"), SUBMIT, act("which python3; which miniswe"), SUBMIT)
    result = cli("run", "x", *endpoint(server), "--cwd", str(work), "-c", "agent.max_depth=1", "-o", "t.traj.json")
    assert result.returncode == 0, result.stderr
    steps = traj(tmp_path / "t.traj.json")["steps"]
    assert steps[0]["output"].startswith("sub-agent Submitted"), steps[0]["output"]
    python, miniswe = steps[1]["output"].split()
    assert os.path.basename(os.path.dirname(miniswe)).startswith("miniswe-bin-")
    assert os.path.dirname(python) != os.path.dirname(miniswe)


def test_a_sub_agent_whose_command_is_killed_is_stopped_and_the_step_waits_for_it(cli, server, tmp_path):
    server.push(act("timeout 2 miniswe run --sub 'slow work'; echo rc=$?"), act("sleep 30"), SUBMIT)
    result = cli("run", "x", *endpoint(server), "--cwd", str(tmp_path), "-c", "agent.max_depth=1", "-o", "t.traj.json",
                 timeout=60)
    assert result.returncode == 0, result.stderr
    parent = traj(tmp_path / "t.traj.json")
    first = parent["steps"][0]
    assert first["output"] == "rc=124\n" and first["duration_s"] < 20
    link, = first["children"]
    child = traj(link["trajectory"])
    assert child["exit_status"] == "Interrupted" and "the command that asked for this sub-agent ended" in child["exit_detail"]
    assert child["steps"][0]["aborted"] and parent["usage"]["model_calls"] == 3


def test_a_chat_session_delegates_and_keeps_sub_agents_out_of_its_sessions(tmp_path, monkeypatch):
    from miniswe.chat import store
    from miniswe.chat.session import ChatSession
    from miniswe.signals import Stop

    monkeypatch.setenv("MINISWE_HOME", str(tmp_path / "home"))
    script = tmp_path / "replies.json"
    script.write_text(json.dumps([act("miniswe run --sub 'say hi'"), act("echo hi from the child"), submit("hi"),
                                  submit("done")]))
    config = load_config("model.kind=scripted", f"model.script={script}", f"environment.cwd={tmp_path}", "agent.max_depth=1")
    session = ChatSession(config, stop=Stop(), mode="yolo")
    try:
        assert session.turn("delegate").status is ExitStatus.SUBMITTED
        session.save()
    finally:
        session.close()
    link, = session.trajectory.steps[0].children
    assert link["trajectory"].startswith(str(tmp_path / "home" / "subagents")) and link["exit_status"] == "Submitted"
    assert sorted(s.id for s in store.list_sessions()) == sorted(["autosave", session.trajectory.session["id"]])
    assert session.trajectory.usage.model_calls == 4


def test_miniswe_run_sub_may_ask_for_smaller_limits_never_larger(tmp_path):
    script = tmp_path / "replies.json"
    script.write_text(json.dumps([act("miniswe run --sub --step-limit 1 'small'"), act("true"),
                                  act("miniswe run --sub --step-limit 50 --cost-limit 2 'large'"), act("true"), act("true"),
                                  SUBMIT]))
    config = load_config("model.kind=scripted", f"model.script={script}", f"environment.cwd={tmp_path}",
                         "agent.max_depth=1", "agent.step_limit=5")
    result = run_task(config, "x", str(tmp_path / "t.traj.json"))
    small, = result.trajectory.steps[0].children
    large, = result.trajectory.steps[1].children
    assert traj(small["trajectory"])["config"]["agent"]["step_limit"] == 1 and small["exit_status"] == "LimitsExceeded"
    limits = traj(large["trajectory"])["config"]["agent"]
    assert limits["step_limit"] == 2 and limits["cost_limit"] == 2.0  # 5 - 1 - 1 - 1 left; no cost limit above it
    assert result.outcome.status is ExitStatus.LIMITS_EXCEEDED and result.trajectory.usage.model_calls == 5
