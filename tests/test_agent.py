"""The step loop through run_task with the scripted model and the real local environment: every exit status."""

import json

import pytest

from miniswe.config import load_config
from miniswe.runner import run_task
from miniswe.status import ExitStatus

from replies import SUBMIT, SUBMIT_MARKER, F, act


def run(tmp_path, replies, *overrides, **kwargs):
    script = tmp_path / "replies.json"
    script.write_text(json.dumps(replies))
    config = load_config("model.kind=scripted", f"model.script={script}", f"environment.cwd={tmp_path}", *overrides)
    path = tmp_path / "t.traj.json"
    result = run_task(config, "fix it", str(path), **kwargs)
    return result, json.loads(path.read_text())


def test_submitted_with_submission_and_full_record(tmp_path):
    result, data = run(tmp_path, [act("echo hello > f.txt && cat f.txt"), SUBMIT])
    assert result.outcome.status is ExitStatus.SUBMITTED
    assert data["exit_status"] == "Submitted" and data["submission"] == "the patch"
    assert [m["role"] for m in data["messages"]] == ["system", "user", "assistant", "user", "assistant", "user"]
    first = data["steps"][0]
    assert first == {"step": 1, "thought": "THOUGHT: next.", "command": "echo hello > f.txt && cat f.txt",
                     "format_error": None, "returncode": 0, "timed_out": False, "output": "hello\n", "output_chars": 6,
                     "elided_chars": 0, "duration_s": first["duration_s"], "aborted": None, "refused": None,
                     "proposed": None, "reasoning": None,
                     "finish_reason": "stop", "usage": first["usage"], "latency_s": first["latency_s"]}
    assert first["usage"]["total_tokens"] > 0
    assert "<returncode>0</returncode>" in data["messages"][3]["content"] and "hello" in data["messages"][3]["content"]
    assert data["usage"]["model_calls"] == 2 and data["usage"]["total_tokens"] == sum(s["usage"]["total_tokens"] for s in data["steps"])
    assert data["messages"][2] == {"role": "assistant", "content": act("echo hello > f.txt && cat f.txt"), "step": 1,
                                   "timestamp": data["messages"][2]["timestamp"]}
    assert (tmp_path / "f.txt").exists()


def test_step_limit(tmp_path):
    result, data = run(tmp_path, [act("true")] * 5, "agent.step_limit=3")
    assert data["exit_status"] == "LimitsExceeded" and "step_limit" in data["exit_detail"]
    assert len(data["steps"]) == 3


def test_token_limit(tmp_path):
    replies = [{"content": act("true"), "usage": {"total_tokens": 600}}] * 5
    result, data = run(tmp_path, replies, "agent.token_limit=1000")
    assert data["exit_status"] == "LimitsExceeded" and "token_limit" in data["exit_detail"]
    assert data["usage"]["model_calls"] == 2


def test_cost_limit(tmp_path):
    replies = [{"content": act(f"echo {i}"), "cost": 0.3} for i in range(10)]
    result, data = run(tmp_path, replies, "agent.cost_limit=1")
    assert data["exit_status"] == "LimitsExceeded" and "cost_limit" in data["exit_detail"]
    assert data["usage"]["model_calls"] == 4 and data["usage"]["cost"] == pytest.approx(1.2)


def test_time_limit_interrupts_a_running_command(tmp_path):
    import time

    started = time.monotonic()
    result, data = run(tmp_path, [act("sleep 30")], "agent.time_limit=1", "environment.timeout=20")
    assert time.monotonic() - started < 5
    assert data["exit_status"] == "TimeExceeded"
    assert data["steps"][0]["timed_out"] is True


def test_command_timeout_is_reported_and_the_run_goes_on(tmp_path):
    result, data = run(tmp_path, [act("echo partial; sleep 30"), SUBMIT], "environment.timeout=0.5")
    assert data["exit_status"] == "Submitted"
    assert data["steps"][0]["timed_out"] and data["steps"][0]["output"] == "partial\n"
    observation = data["messages"][3]["content"]
    assert "killed after 0.5 seconds" in observation and "partial" in observation


def test_format_errors_get_guidance_and_reset_on_a_valid_reply(tmp_path):
    replies = ["no block here", act("true"), f"{F}bash\nls\n{F}\n{F}bash\npwd\n{F}", SUBMIT]
    result, data = run(tmp_path, replies)
    assert data["exit_status"] == "Submitted"
    assert [s["format_error"] for s in data["steps"]] == ["no_action", None, "several_actions", None]
    assert data["steps"][0]["command"] is None
    guidance = data["messages"][3]["content"]
    assert "no ```bash block" in guidance and "2 more malformed replies" in guidance
    assert "Put only ONE" in data["messages"][7]["content"]


def test_repeated_format_errors_end_the_run(tmp_path):
    replies = ["nothing", {"content": f"{F}bash\nls", "finish_reason": "length"}, f"{F}bash\n\n{F}", SUBMIT]
    result, data = run(tmp_path, replies)
    assert data["exit_status"] == "RepeatedFormatError"
    assert [s["format_error"] for s in data["steps"]] == ["no_action", "truncated", "empty_action"]


def test_truncated_reply_is_a_format_error_even_with_a_closed_block(tmp_path):
    replies = [{"content": act("rm -rf important"), "finish_reason": "length"}, SUBMIT]
    (tmp_path / "important").mkdir()
    result, data = run(tmp_path, replies)
    assert data["steps"][0]["format_error"] == "truncated"
    assert (tmp_path / "important").exists()


def test_model_error_is_recorded(tmp_path):
    result, data = run(tmp_path, [act("true")])
    assert data["exit_status"] == "ModelError" and "no reply left for call 2" in data["exit_detail"]
    assert len(data["steps"]) == 1


def test_sandbox_error_when_the_environment_cannot_start(tmp_path):
    result, data = run(tmp_path, [SUBMIT], f"environment.cwd={tmp_path}/missing")
    assert data["exit_status"] == "SandboxError" and "not a directory" in data["exit_detail"]


def test_a_hook_that_raises_ends_the_run_naming_the_hook(tmp_path):
    class Exploding:
        def after_command(self, event):
            raise RuntimeError("observer bug")

    result, data = run(tmp_path, [act("true"), SUBMIT], hooks=[Exploding()])
    assert data["exit_status"] == "Error" and "Traceback" in data["exit_detail"], "the plugin's author sees where"
    last = data["exit_detail"].rstrip().splitlines()[-1]
    assert last.startswith("hook test_agent.") and last.endswith("Exploding.after_command raised RuntimeError: observer bug")
    assert [step["command"] for step in data["steps"]] == ["true"], "the command ran: its step is on record"


@pytest.mark.parametrize("event", ["before_model_call", "after_command"])
def test_a_hook_that_sets_stop_to_a_string_ends_the_run_naming_the_mistake(tmp_path, event):
    class Stopping:
        pass

    setattr(Stopping, event, lambda self, e: setattr(e, "stop", "done"))
    result, data = run(tmp_path, [act("true"), SUBMIT], hooks=[Stopping()])
    assert data["exit_status"] == "Error", "the run ends, recorded, instead of crashing with exit_status null"
    assert data["exit_detail"].rstrip().splitlines()[-1].endswith(
        f"Stopping.{event} set stop to str 'done'; set it to an Outcome, e.g. Outcome(ExitStatus.SUBMITTED, 'why')")


def test_a_bug_keeps_its_traceback(tmp_path):
    result, data = run(tmp_path, [act("true"), SUBMIT], "environment.kind=test_agent:BrokenEnvironment")
    assert data["exit_status"] == "Error" and "RuntimeError: environment bug" in data["exit_detail"]
    assert "Traceback" in data["exit_detail"]


def test_output_view_is_bounded_but_trajectory_keeps_more(tmp_path):
    result, data = run(tmp_path, [act("seq 1 20000"), SUBMIT], "agent.output_limit=1000")
    step = data["steps"][0]
    full = "".join(f"{i}\n" for i in range(1, 20001))
    assert step["output"] == full and step["output_chars"] == len(full)
    observation = data["messages"][3]["content"]
    assert len(observation) < 1600
    assert observation.count("\n") < 500 and "20000" in observation and "\n1\n" in observation
    assert f"{len(full) - 1000} in the middle are not shown" in observation


def test_reasoning_is_kept_not_sent_back(tmp_path):
    replies = [{"content": "<think>hidden plan</think>THOUGHT: go\n" + f"{F}bash\ntrue\n{F}", "reasoning": "chain"}, SUBMIT]
    result, data = run(tmp_path, replies)
    assert data["steps"][0]["reasoning"] == "chain" and data["steps"][0]["thought"] == "THOUGHT: go"
    assert "<think>hidden plan</think>" in data["messages"][2]["content"]
    assert data["exit_status"] == "Submitted"


def test_setup_failure_is_setup_error_and_eval_marks_resolved(tmp_path):
    result, data = run(tmp_path, [SUBMIT], setup=["exit 4"])
    assert data["exit_status"] == "SetupError" and "exited 4" in data["exit_detail"]
    result, data = run(tmp_path, [act("touch fixed"), SUBMIT], setup=["rm -f fixed"], evaluate=["test -f fixed"])
    assert data["exit_status"] == "Submitted" and result.resolved is True and data["resolved"] is True


def test_secret_looking_env_values_are_masked(tmp_path):
    result, data = run(tmp_path, [SUBMIT], "environment.env={GITHUB_TOKEN: s3cr3t, MODE: fast}")
    assert data["config"]["environment"]["env"] == {"GITHUB_TOKEN": "***", "MODE": "fast"}
    assert "s3cr3t" not in json.dumps(data)


class FakeEnvironment:
    """Answers commands from a table; an `interrupt` arriving mid-command is honoured like a real one."""

    def __init__(self, outputs: dict[str, tuple[str, int]], during=None):
        self.outputs, self.during, self.ran, self.interrupted = outputs, during, [], False

    def execute(self, command, *, timeout):
        from miniswe.environments import CommandResult

        self.ran.append(command)
        if self.during:
            self.during(command)  # what happens while the command runs (a signal, say)
        output, code = self.outputs.get(command, (f"bash: {command}: command not found\n", 127))
        if self.interrupted:
            return CommandResult(output[: len(output) // 2], None, False, 0.5, len(output) // 2, interrupted=True)
        return CommandResult(output, code, False, 0.01, len(output))

    def interrupt(self):
        self.interrupted = True

    def close(self):
        pass

    def describe(self):
        return {"kind": "fake", "cwd": "/fake"}


def drive(tmp_path, replies, env, stop=None):
    from miniswe.agent import Agent
    from miniswe.context import RunContext
    from miniswe.models.scripted import ScriptedModel
    from miniswe.trajectory import Trajectory

    config = load_config("model.kind=scripted")
    trajectory = Trajectory(str(tmp_path / "t.json"), task="t", config={})
    ctx = RunContext.open(config, trajectory, stop=stop)
    agent = Agent(ctx, ScriptedModel(config.model, replies=replies), env)
    return agent.run("fix the parser"), trajectory


def test_the_loop_over_a_fake_environment(tmp_path):
    env = FakeEnvironment({"ls": ("parse.py\n", 0), "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && printf 'the patch'":
                           ("COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\nthe patch", 0)})
    outcome, trajectory = drive(tmp_path, [act("ls"), act("make"), "no block", SUBMIT], env)
    assert outcome.status is ExitStatus.SUBMITTED and outcome.submission == "the patch"
    assert env.ran == ["ls", "make", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && printf 'the patch'"]
    assert [(s.command, s.returncode, s.format_error) for s in trajectory.steps] == [
        ("ls", 0, None), ("make", 127, None), (None, None, "no_action"), (env.ran[-1], 0, None)]
    observations = [m.content for m in trajectory.messages if m.role == "user"][1:]
    assert "<returncode>127</returncode>" in observations[1] and "command not found" in observations[1]
    assert "You are in /fake." in trajectory.messages[1].content, "the environment's cwd reaches the prompt"
    assert trajectory.usage.model_calls == 4 and json.loads((tmp_path / "t.json").read_text())["steps"]


def test_a_stop_mid_command_records_the_step_with_its_partial_output(tmp_path):
    from miniswe.signals import Stop
    from miniswe.status import interrupted

    stop = Stop()
    env = FakeEnvironment({"make": ("compiling a\ncompiling b\n", 0)},
                          during=lambda command: stop.request(interrupted("SIGTERM"), urgent=True))
    outcome, trajectory = drive(tmp_path, [act("make"), SUBMIT], env, stop)
    assert outcome == interrupted("SIGTERM")
    step, = trajectory.steps
    assert step.aborted == "SIGTERM" and step.returncode is None and step.output == "compiling a\n"
    assert env.ran == ["make"], "no step after the stop"


class BrokenEnvironment:
    """An environment plugin with a bug: its commands raise."""

    def __init__(self, config, **context):
        pass

    def execute(self, command, *, timeout):
        raise RuntimeError("environment bug")

    def interrupt(self):
        pass

    def close(self):
        pass

    def describe(self):
        return {"kind": "broken", "cwd": "/"}


def test_the_same_command_and_output_again_and_again_warns_then_ends_the_run(tmp_path):
    result, data = run(tmp_path, [act("cat missing.txt")] * 6)
    assert data["exit_status"] == "RepeatedAction" and "4 times in a row" in data["exit_detail"]
    assert len(data["steps"]) == 4
    assert "Running it once more ends the run" in data["messages"][7]["content"], "the third identical step warns"
    assert "Running it once more" not in data["messages"][5]["content"]


def test_polling_with_a_changing_output_is_progress(tmp_path):
    (tmp_path / "n").write_text("0")
    poll = act("n=$(( $(cat n) + 1 )); echo $n > n; cat n")
    result, data = run(tmp_path, [poll] * 6 + [SUBMIT])
    assert data["exit_status"] == "Submitted" and len(data["steps"]) == 7


def test_the_command_policy_refuses_and_the_run_goes_on(tmp_path):
    result, data = run(tmp_path, [act("rm -rf ~"), act("echo 'rm -rf /' is just text"), SUBMIT])
    assert data["exit_status"] == "Submitted"
    refused, quoted, _ = data["steps"]
    assert refused["refused"].startswith("refused by the command policy: it deletes the whole file system or the home folder")
    assert refused["returncode"] is None and refused["output"] == ""
    assert "The command did not run" in data["messages"][3]["content"]
    assert quoted["refused"] is None and quoted["output"] == "rm -rf / is just text\n"


def test_budget_warnings_when_little_is_left(tmp_path):
    result, data = run(tmp_path, [act(f"echo {i}") for i in range(10)], "agent.step_limit=10", "agent.budget_warning=0.2")
    observations = [m["content"] for m in data["messages"] if m["role"] == "user"][1:]
    warned = [i for i, text in enumerate(observations, 1) if "left for this task" in text]
    assert warned == [8, 9, 10] and "Only 2 of 10 model calls left" in observations[7]


OWN_AGENT = '''
from miniswe.agent import Agent
from miniswe.protocol import Reply


class Careful(Agent):
    """Overrides query only: every reply the model gives is run with `set -e` in front."""

    def query(self):
        reply = super().query()
        return Reply(content=reply.content.replace("```bash\\n", "```bash\\nset -e; "), usage=reply.usage)


class NotAnAgent:
    pass
'''


def test_an_agent_of_ones_own_overriding_only_query_runs_through_agent_kind(cli, server, tmp_path):
    (tmp_path / "my_agents.py").write_text(OWN_AGENT)
    server.push(act("echo hello"), SUBMIT)
    result = cli("run", "say hello", "--base-url", server.base_url, "-m", "m", "-o", "t.json",
                 "-c", "agent.kind=my_agents:Careful", env={"PYTHONPATH": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    steps = json.loads((tmp_path / "t.json").read_text())["steps"]
    assert steps[0]["command"] == "set -e; echo hello" and steps[1]["command"].startswith(f"set -e; echo {SUBMIT_MARKER}")
    assert steps[0]["output"] == "hello\n"


def test_an_agent_kind_that_is_no_agent_is_refused_before_anything_runs(cli, server, tmp_path):
    (tmp_path / "my_agents.py").write_text(OWN_AGENT)
    result = cli("run", "x", "--base-url", server.base_url, "-m", "m", "-o", "t.json",
                 "-c", "agent.kind=my_agents:NotAnAgent", env={"PYTHONPATH": str(tmp_path)})
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "miniswe: agent.kind: my_agents:NotAnAgent is not a subclass of miniswe.agent.Agent (subclass it, and override "
        "run, step, query or execute_actions)"]
    assert not server.requests and not (tmp_path / "t.json").exists()
