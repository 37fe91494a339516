"""The reference implementation's trajectories (mini-swe-agent-1, mini-swe-agent-1.1, the bare message list) read
into miniswe's Trajectory, and `load_any`'s one-line refusals of everything else."""

import json
import os

import pytest

from miniswe.config import config_from_record
from miniswe.errors import RecordError, TrajectoryError
from miniswe.mini_swe_agent import ConvertedTrajectory, load_any, parse_observation
from miniswe.status import ExitStatus
from miniswe.trajectory import Trajectory

REFERENCE = os.path.join(os.path.dirname(__file__), "data", "reference")
SUBMITTED = os.path.join(REFERENCE, "mini-swe-agent-1-submitted.traj.json")
LIMITS = os.path.join(REFERENCE, "mini-swe-agent-1-limits-exceeded.traj.json")
LISTED = os.path.join(REFERENCE, "mini-swe-agent-list-format.traj.json")
V11 = os.path.join(REFERENCE, "mini-swe-agent-1.1-from-docs.traj.json")
REAL_TEXT = os.path.join(REFERENCE, "mini-swe-agent-2.4.6-text.traj.json")
REAL_TOOLS = os.path.join(REFERENCE, "mini-swe-agent-2.4.6-tools.traj.json")


def raw(path):
    with open(path) as handle:
        return json.load(handle)


@pytest.mark.parametrize("path", [SUBMITTED, LIMITS, LISTED, V11, REAL_TEXT, REAL_TOOLS], ids=os.path.basename)
def test_each_reference_format_becomes_a_trajectory_with_one_step_per_reply(path):
    trajectory = load_any(path)
    data = raw(path)
    messages = data if isinstance(data, list) else data["messages"]
    # a step per reply; a tool-calling reply's calls a step each, as miniswe's own tool-calling runs record them
    replies = sum(max(1, len((m.get("extra") or {}).get("actions") or []) if m.get("tool_calls") else 1)
                  for m in messages if m["role"] == "assistant")
    format_errors_outside_replies = sum(1 for m in messages if (m.get("extra") or {}).get("interrupt_type") == "FormatError")
    assert isinstance(trajectory, Trajectory) and isinstance(trajectory, ConvertedTrajectory)
    assert len(trajectory.steps) == replies + format_errors_outside_replies
    assert [s.step for s in trajectory.steps] == list(range(1, len(trajectory.steps) + 1))
    assert trajectory.metadata["converted_from"]["format"] in ("mini-swe-agent-1", "mini-swe-agent-1.1", "mini-swe-agent message list")
    # every reply is in the conversation, numbered with its step, followed by what the model was shown
    numbered = [m for m in trajectory.messages if m.role == "assistant"]
    assert [m.step for m in numbered] == [s.step for s in trajectory.steps if s.step in {m.step for m in numbered}]
    config_from_record(trajectory.config)  # what replay would rebuild from it
    assert trajectory.to_dict()["format"] == "miniswe-trajectory"


def test_version_1_submitted_run():
    trajectory = load_any(SUBMITTED)
    info = raw(SUBMITTED)["info"]
    assert trajectory.outcome.status is ExitStatus.SUBMITTED and trajectory.outcome.submission == info["submission"]
    first, last = trajectory.steps[0], trajectory.steps[-1]
    assert first.command.startswith("cat /Users/fuchur/") and first.returncode == 1
    assert first.output == "cat: /Users/fuchur/Documents/24/git_sync/swe-agent-test-repo/tests/./missing_colon.py: No such file or directory\n"
    assert [s.returncode for s in trajectory.steps[:9]] == [1, 0, 0, 0, 0, 0, 0, 1, 0]
    # the submission took the place of the last command's observation: its return code was never recorded
    assert last.command.startswith("echo MINI_SWE_AGENT_FINAL_OUTPUT") and last.returncode is None
    assert last.output == info["submission"]
    assert trajectory.usage.model_calls == 10 and trajectory.usage.cost == pytest.approx(1.0)
    assert trajectory.config["protocol"]["submit_marker"] == "MINI_SWE_AGENT_FINAL_OUTPUT"
    missing = trajectory.metadata["converted_from"]["not_recorded"]
    assert {"duration_s", "tokens", "timing", "submission_output", "config", "model"} <= set(missing)
    assert trajectory.started is None and trajectory.wall_s is None


def test_version_1_limits_exceeded_run_with_its_own_observation_template():
    trajectory = load_any(LIMITS)
    assert trajectory.outcome.status is ExitStatus.LIMITS_EXCEEDED and trajectory.outcome.submission is None
    first = trajectory.steps[0]
    # "Observation: {'output': ..., 'returncode': 0}": a template that printed the output mapping itself
    assert first.returncode == 0 and first.output.startswith("Cloning into 'express'...\n")
    assert "1235 passing" in first.output and first.output_chars == len(first.output)
    refused = trajectory.steps[1]
    assert refused.format_error == "no_action" and refused.command is None
    assert trajectory.model == {"kind": "minisweagent.models.anthropic.AnthropicModel", "name": "claude-sonnet-4-20250514"}
    config = config_from_record(trajectory.config)
    assert (config.agent.step_limit, config.environment.kind, config.environment.image, config.environment.cwd) == (100, "docker", "node:18", "/workspace")
    assert config.environment.timeout == 600 and config.model.name == "claude-sonnet-4-20250514"
    assert trajectory.usage.model_calls == 100 and trajectory.usage.cost == pytest.approx(0.96214065)
    # the trailing empty user message (str(LimitsExceeded())) is kept, but is no step's observation
    assert trajectory.messages[-1].content == "" and trajectory.messages[-1].step is None


def test_the_bare_message_list_gets_an_inferred_submission_and_its_streams_joined():
    trajectory = load_any(LISTED)
    first, last = trajectory.steps[0], trajectory.steps[-1]
    assert first.returncode == 1 and "No such file or directory" in first.output
    assert trajectory.outcome.status is ExitStatus.SUBMITTED and trajectory.outcome.submission.startswith("diff --git")
    assert last.command.startswith("echo NANO_SWE_AGENT_FINAL_OUTPUT")
    assert trajectory.config["protocol"]["submit_marker"] == "NANO_SWE_AGENT_FINAL_OUTPUT"
    converted = trajectory.metadata["converted_from"]
    assert "exit_status" in converted["not_recorded"] and any("inferred" in note for note in converted["notes"])


def test_version_1_1_keeps_whole_outputs_durations_and_usage():
    trajectory = load_any(V11)
    steps = trajectory.steps
    assert [s.command is not None for s in steps] == [True, True, False, True, True]
    listing, long, refused, slow, submit = steps
    assert listing.output == "csvread.py\ntests\n" and listing.returncode == 0 and listing.duration_s == 0.5
    # the model saw head and tail; 1.1 kept the whole output in extra.raw_output
    assert long.output == "".join(f"row {i}\n" for i in range(3000)) and long.elided_chars == 0
    assert refused.format_error == "several_actions" and refused.thought == "THOUGHT: two at once."
    # killed at its timeout: timed out with no return code (mini-swe-agent wrote -1), its output as it was
    assert slow.timed_out and slow.returncode is None and slow.duration_s == 60.0 and slow.output == ""
    assert submit.output == trajectory.outcome.submission and trajectory.outcome.status is ExitStatus.SUBMITTED
    assert listing.usage.prompt_tokens == 1200 and listing.usage.total_tokens == 1240 and listing.usage.cost == 0.0021
    assert trajectory.usage.total_tokens == 5775 and trajectory.usage.model_calls == 5
    assert trajectory.config["protocol"]["action_tags"] == ["mswea_bash_command"]
    assert trajectory.started == "2025-12-02T18:26:42.000Z" and trajectory.wall_s == 70.0
    assert trajectory.model["name"] == "openai/gpt-5-mini"


def test_a_converted_trajectory_is_never_saved_over_its_source(tmp_path):
    copy = tmp_path / "ref.traj.json"
    copy.write_bytes(open(SUBMITTED, "rb").read())
    trajectory = load_any(str(copy))
    with pytest.raises(RecordError, match="converted from mini-swe-agent-1"):
        trajectory.save()
    assert copy.read_bytes() == open(SUBMITTED, "rb").read()


@pytest.mark.parametrize(("text", "expected"), [
    ("<returncode>2</returncode>\n<output>\nboom\n</output>", {"returncode": 2, "output": "boom\n", "elided": 0}),
    ("<returncode>\n0\n</returncode>\n<stdout>\nout\n</stdout>\n<stderr>\nerr\n</stderr>", {"returncode": 0, "output": "outerr", "elided": 0}),
    ("<returncode>0</returncode>\n<warning>too long</warning><output_head>\nHEAD\n</output_head>\n<elided_chars>\n1234 characters elided\n"
     "</elided_chars>\n<output_tail>\nTAIL\n</output_tail>", {"returncode": 0, "elided": 1234}),
    ("The last command <command>sleep 9</command> timed out and has been killed.\nThe output of the command was:\n <output>\npartial\n</output>\n"
     "Please try another command", {"returncode": None, "timed_out": True, "output": "partial\n"}),
    ("Observation: {'output': 'a\\nb\\n', 'returncode': 3}", {"returncode": 3, "output": "a\nb\n"}),
    ("Please always provide EXACTLY ONE action in triple backticks.", None),
    ("Observation: {'output': " + "[" * 5000 + "}", None),  # nested too deep for literal_eval: not an observation
    ("Observation: {'returncode': __import__('os').system('false')}", None),  # never evaluated as code
], ids=["tags", "streams", "head-tail", "timeout", "mapping", "format-error", "deep", "code"])
def test_observation_shapes(text, expected):
    found = parse_observation(text)
    if expected is None:
        assert found is None
    else:
        assert {k: found[k] for k in expected} == expected
    if expected and "elided" in expected and expected["elided"]:
        assert found["output"].startswith("HEAD\n") and found["output"].endswith("TAIL") and found["chars"] == 1234 + 8


@pytest.mark.parametrize(("content", "found"), [
    ("42", "a JSON int"),
    ('{"trajectory_format": "mini-swe-agent-9", "messages": []}', "trajectory_format 'mini-swe-agent-9'"),
    ('{"format": "other-agent"}', "format 'other-agent'"),
    ('{"steps": []}', "a mapping without `format` or `trajectory_format`"),
    ('[1, 2]', "a JSON list that is not a list of chat messages"),
    ('{"format": "miniswe-trajectory", "version": 99}', "newer miniswe"),
    ("not json", "not valid JSON"),
    ("[" * 100_000, "nested too deeply"),
])
def test_anything_else_is_refused_in_one_line(tmp_path, content, found):
    path = tmp_path / "x.json"
    path.write_text(content)
    with pytest.raises(TrajectoryError) as error:
        load_any(str(path))
    assert found in str(error.value) and "\n" not in str(error.value) and str(path) in str(error.value)


def test_old_miniswe_versions_load_through_load_any_too():
    data = os.path.join(os.path.dirname(__file__), "data", "trajectories")
    for name in sorted(os.listdir(data)):
        trajectory = load_any(os.path.join(data, name))
        assert type(trajectory) is Trajectory and trajectory.steps and trajectory.outcome


def test_secrets_in_the_reference_config_are_masked_everywhere(tmp_path):
    data = raw(LIMITS)
    secret = "sk-reference-secret-0123456789"
    data["info"]["config"]["model"]["model_kwargs"] = {"api_key": secret}
    data["info"]["config"]["environment"]["env"]["GITHUB_TOKEN"] = "ghp_" + "x" * 30
    data["messages"][3]["content"][0]["text"] = data["messages"][3]["content"][0]["text"].replace("Cloning", f"{secret} Cloning")
    path = tmp_path / "leaky.traj.json"
    path.write_text(json.dumps(data))
    trajectory = load_any(str(path))
    document = json.dumps(trajectory.to_dict())
    assert secret not in document and "ghp_" + "x" * 30 not in document
    assert trajectory.steps[0].output.startswith("*** Cloning")
    assert trajectory.config["environment"]["env"]["GITHUB_TOKEN"] == "***"


def test_a_reference_run_replays_with_miniswe(cli, tmp_path):
    fence = "```"
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Say hello."},
        {"role": "assistant", "content": f"THOUGHT: greet.\n\n{fence}bash\necho hello; echo world >&2\n{fence}"},
        {"role": "user", "content": "<returncode>0</returncode>\n<output>\nhello\nworld\n</output>"},
        {"role": "assistant", "content": f"THOUGHT: count.\n\n{fence}bash\nls | wc -l\n{fence}"},
        {"role": "user", "content": "<returncode>0</returncode>\n<output>\n7\n</output>"},
    ]
    (tmp_path / "reference.traj.json").write_text(json.dumps(messages))
    (tmp_path / "work").mkdir()
    result = cli("replay", "reference.traj.json", "--cwd", "work", "-c", "environment.kind=local")
    assert result.returncode == 1, result.stderr
    assert result.stdout.startswith("diverged at step 2"), "step 1 matched; step 2's folder differs"
    assert "+0" in result.stdout and "-7" in result.stdout


def test_real_2x_runs_text_and_tool_calls():
    """Trajectories mini-swe-agent 2.4.6's own DefaultAgent wrote (tests/data/reference/README.md)."""
    text = load_any(REAL_TEXT)
    assert [s.format_error for s in text.steps] == [None, "several_actions", None, "no_action", None, None]
    first, refused = text.steps[0], text.steps[1]
    assert (first.command, first.returncode, first.output) == ("printf hello; echo err >&2; exit 3", 3, "helloerr\n")
    # the refused reply is kept before the message that refused it (the model never saw it again)
    numbered = [m for m in text.messages if m.step == refused.step]
    assert [m.role for m in numbered] == ["assistant", "user"] and numbered[0].content.startswith("Two at once.")
    assert text.steps[4].timed_out and text.outcome.submission == "the-patch"
    tools = load_any(REAL_TOOLS)
    assert tools.config["protocol"]["kind"] == "tools"
    calls = [(s.step, s.command, (s.tool_call or {}).get("id"), s.usage.model_calls) for s in tools.steps if s.tool_call]
    assert calls[1:3] == [(3, "seq 1 3000", "call_b", 1), (4, "echo second", "call_c", 0)]
    assert [s.format_error for s in tools.steps if s.format_error] == ["no_tool_call", "unknown_tool"]
    answered = {m.tool_call_id: m.step for m in tools.messages if m.role == "tool"}
    assert answered["call_b"] == 3 and answered["call_c"] == 4
    assert tools.usage.model_calls == 6 and tools.outcome.submission == "the-patch"
    config_from_record(tools.config)


def _mutations(document, rng, count):
    """`count` copies of `document`, each with one value replaced by another type's or one key deleted."""
    def places(node, at=()):
        yield at
        children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, child in children:
            yield from places(child, (*at, key))

    every = [at for at in places(document) if at]
    for _ in range(count):
        at = rng.choice(every)
        mutated = json.loads(json.dumps(document))
        parent = mutated
        for key in at[:-1]:
            parent = parent[key]
        if isinstance(parent, dict) and rng.random() < 0.3:
            del parent[at[-1]]
        else:
            parent[at[-1]] = rng.choice([None, True, 0, 2.5, "", "x", [], ["x"], {}, {"a": 1}])
        yield at, mutated


@pytest.mark.parametrize("path", [SUBMITTED, LIMITS, LISTED, V11, REAL_TEXT, REAL_TOOLS], ids=os.path.basename)
def test_a_damaged_reference_file_loads_or_is_refused_in_one_line(tmp_path, path):
    import random

    from miniswe.mini_swe_agent import to_mini_swe_agent

    target = tmp_path / "damaged.traj.json"
    for at, mutated in _mutations(raw(path), random.Random(os.path.basename(path)), 150):
        target.write_text(json.dumps(mutated))
        try:
            to_mini_swe_agent(load_any(str(target)))  # what export and inspect do first
        except TrajectoryError as error:
            assert "\n" not in str(error) and str(target) in str(error), at
        except Exception as error:  # a traceback for the user: name the field that caused it
            pytest.fail(f"{'.'.join(map(str, at))}: {type(error).__name__}: {error}")


def test_a_damaged_field_is_named(tmp_path):
    data = raw(REAL_TOOLS)
    data["messages"][3]["tool_call_id"] = ["x"]
    path = tmp_path / "damaged.traj.json"
    path.write_text(json.dumps(data))
    with pytest.raises(TrajectoryError, match=r"messages\[3\]\.tool_call_id: expected a string, got a list"):
        load_any(str(path))
    data = raw(V11)
    data["info"]["config"]["agent"] = ["x"]
    path.write_text(json.dumps(data))
    with pytest.raises(TrajectoryError, match=r"info\.config\.agent: expected a mapping, got a list"):
        load_any(str(path))
