"""Trajectories both ways: miniswe's runs exported in mini-swe-agent's format (`mini-swe-agent-1.1`), one file or a
whole batch run directory, for its inspector and its users' scripts; and mini-swe-agent's real trajectories read
into miniswe and written back losing nothing both formats hold."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from conftest import SUBMIT, F, act
from miniswe.errors import RecordError, TrajectoryError, UsageError
from miniswe.mini_swe_agent import (
    default_export_path,
    export,
    export_batch,
    from_mini_swe_agent,
    load_any,
    to_mini_swe_agent,
)
from miniswe.trajectory import load

REFERENCE = Path(__file__).resolve().parent / "data" / "reference"
# Real runs of mini-swe-agent (1.x, the first prototype's message list, and 2.4.6's own DefaultAgent writing 1.1,
# text and tool calls), and the 1.1 sample written from its documentation.
REAL = ["mini-swe-agent-1-submitted.traj.json", "mini-swe-agent-1-limits-exceeded.traj.json",
        "mini-swe-agent-list-format.traj.json", "mini-swe-agent-2.4.6-text.traj.json",
        "mini-swe-agent-2.4.6-tools.traj.json", "mini-swe-agent-1.1-from-docs.traj.json"]
# The fields of a message's `extra` that miniswe's record holds too (the API's whole response it does not: only
# its usage, compared apart).
SHARED_EXTRA = ("actions", "cost", "raw_output", "returncode", "exception_info", "interrupt_type", "model_response",
                "n_actions", "exit_status", "submission", "exception_type", "exception")


def text(content) -> str:
    if isinstance(content, list):
        return "".join(part.get("text") or "" for part in content if isinstance(part, dict))
    return content or ""


def usage(extra: dict) -> dict:
    found = ((extra.get("response") or {}).get("usage") or {})
    return {key: found.get(key, found.get(alias)) for key, alias in
            (("prompt_tokens", "input_tokens"), ("completion_tokens", "output_tokens"))}


@pytest.mark.parametrize("name", REAL)
def test_a_mini_swe_agent_trajectory_read_and_written_back_loses_nothing_both_formats_hold(tmp_path, name):
    source = REFERENCE / name
    original = json.loads(source.read_text())
    written = json.loads(Path(export(str(source), str(tmp_path / "back.traj.json"))).read_text())
    assert written["trajectory_format"] == "mini-swe-agent-1.1"
    if isinstance(original, dict):
        for key, value in original["info"].items():  # every field of `info`, as it was
            assert written["info"][key] == value, f"info.{key}"
        messages = original["messages"]
    else:
        messages = original
    out = written["messages"]
    if messages[-1]["role"] != "exit":  # 1.x kept the run's end in `info` only: 1.1 adds the exit message
        assert out[-1]["role"] == "exit" and out[-1]["extra"]["exit_status"] == written["info"]["exit_status"]
        out = out[:-1]
    assert len(out) == len(messages)
    for index, (theirs, ours) in enumerate(zip(messages, out)):
        where = f"message {index} ({theirs['role']})"
        assert ours["role"] == theirs["role"] and ours["content"] == text(theirs.get("content")), where
        assert ours.get("tool_calls") == theirs.get("tool_calls") and ours.get("tool_call_id") == theirs.get("tool_call_id"), where
        before, after = theirs.get("extra") or {}, ours.get("extra") or {}
        for key in SHARED_EXTRA:
            if key in before:
                assert after.get(key) == before[key], f"{where}: extra.{key}"
        if "timestamp" in before:
            assert after["timestamp"] == pytest.approx(before["timestamp"], abs=0.001), f"{where}: extra.timestamp"
        if "timestamp" in theirs:  # 1.x kept it beside the content
            assert after["timestamp"] == pytest.approx(theirs["timestamp"], abs=0.001), where
        if (before.get("response") or {}).get("usage"):
            assert usage(after) == usage(before), f"{where}: usage"
    # and read back once more, the same record
    again = load_any(str(tmp_path / "back.traj.json"))
    assert again.to_dict() == load_any(str(source)).to_dict()


def test_the_1x_timestamps_are_read_too(tmp_path):
    data = json.loads((REFERENCE / "mini-swe-agent-1-submitted.traj.json").read_text())
    for number, message in enumerate(data["messages"]):
        message["timestamp"] = 1_750_000_000.25 + number
    path = tmp_path / "stamped.traj.json"
    path.write_text(json.dumps(data))
    trajectory = load_any(str(path))
    assert trajectory.messages[0].timestamp == "2025-06-15T15:06:40.250Z" and trajectory.started == trajectory.messages[0].timestamp


def native_runs(cli, server, tmp_path) -> list[Path]:
    """Two miniswe runs: text (a command, a malformed reply, a long output, a timeout, a submission) and tool calls
    (two calls in one reply, a reply with no call, a submission)."""
    server.push(act("printf hello; echo err >&2; exit 3"), f"two\n{F}bash\nls\n{F}\n{F}bash\npwd\n{F}",
                act("seq 1 30000"), act("sleep 5"), SUBMIT)
    text_run = tmp_path / "text.traj.json"
    result = cli("run", "Say hello", "--base-url", server.base_url, "-m", "test-model", "-o", str(text_run),
                 "-c", "environment.timeout=1", env={"OPENAI_API_KEY": "sk-test-key-0123456789"})
    assert result.returncode == 0, result.stderr
    call = lambda id_, command: {"id": id_, "name": "bash", "arguments": {"command": command}}  # noqa: E731
    server.push({"content": "two", "tool_calls": [call("c1", "echo one"), call("c2", "echo two")]}, "no call",
                {"content": "done", "tool_calls": [{"id": "c3", "name": "submit", "arguments": {"command": "printf patch"}}]})
    tools_run = tmp_path / "tools.traj.json"
    result = cli("run", "Count", "--base-url", server.base_url, "-m", "test-model", "-o", str(tools_run),
                 "-c", "protocol.kind=tools")
    assert result.returncode == 0, result.stderr
    return [text_run, tools_run]


def test_miniswe_to_mini_swe_agent_and_back_keeps_everything(cli, server, tmp_path):
    for path in native_runs(cli, server, tmp_path):
        recorded = load(str(path))
        done = cli("export", str(path))  # as a user types it; the path written is what it prints
        assert done.returncode == 0, done.stderr
        written = done.stdout.strip()
        assert written == default_export_path(str(path)) and written.endswith(".mini.traj.json")
        document = json.loads(Path(written).read_text())
        info = document["info"]
        assert (info["exit_status"], info["submission"]) == (recorded.exit_status, recorded.outcome.submission)
        assert info["model_stats"] == {"instance_cost": recorded.usage.cost, "api_calls": recorded.usage.model_calls}
        assert info["config"]["model"]["model_name"] == "test-model" and document["messages"][-1]["role"] == "exit"
        back = load_any(written)
        assert back.to_dict() == recorded.to_dict()


def test_without_miniswes_own_fields_steps_commands_outputs_end_and_cost_are_kept(cli, server, tmp_path):
    for path in native_runs(cli, server, tmp_path):
        recorded = load(str(path))
        document = to_mini_swe_agent(recorded)
        document["info"].pop("miniswe")
        for message in document["messages"]:
            message.get("extra", {}).pop("miniswe", None)
        back = from_mini_swe_agent(document, "plain.traj.json")
        assert len(back.steps) == len(recorded.steps)
        for ours, theirs in zip(back.steps[:-1], recorded.steps[:-1]):
            assert (ours.command, ours.output, ours.returncode, ours.timed_out, bool(ours.format_error)) == \
                   (theirs.command, theirs.output, theirs.returncode, theirs.timed_out, bool(theirs.format_error))
        # as in mini-swe-agent's own files, the submitting command's output is the submission (nothing was shown)
        submitted = back.steps[-1]
        assert submitted.command == recorded.steps[-1].command and submitted.output == recorded.outcome.submission
        assert "submission_output" in back.metadata["converted_from"]["not_recorded"]
        assert (back.exit_status, back.outcome.submission) == (recorded.exit_status, recorded.outcome.submission)
        assert back.usage.cost == recorded.usage.cost and back.usage.model_calls == recorded.usage.model_calls


def test_the_export_is_shaped_as_mini_swe_agent_writes_it(cli, server, tmp_path):
    text_run, tools_run = native_runs(cli, server, tmp_path)
    messages = to_mini_swe_agent(load(str(text_run)))["messages"]
    roles = [m["role"] for m in messages]
    assert roles[:2] == ["system", "user"] and roles[-1] == "exit"
    first, observation = messages[2], messages[3]
    assert first["extra"]["actions"] == [{"command": "printf hello; echo err >&2; exit 3"}]
    assert set(first["extra"]) >= {"actions", "response", "cost", "timestamp"}
    assert (observation["extra"]["raw_output"], observation["extra"]["returncode"]) == ("helloerr\n", 3)
    refused = next(m for m in messages if (m.get("extra") or {}).get("interrupt_type") == "FormatError")
    assert refused["role"] == "user" and messages[messages.index(refused) - 1]["role"] == "assistant"  # it saw its reply
    slow = next(m for m in messages if (m.get("extra") or {}).get("exception_type"))
    assert slow["extra"]["returncode"] == -1 and "timed out after 1 seconds" in slow["extra"]["exception_info"]
    tools = to_mini_swe_agent(load(str(tools_run)))["messages"]
    two = tools[2]
    assert [a["tool_call_id"] for a in two["extra"]["actions"]] == ["c1", "c2"] and len(two["tool_calls"]) == 2
    assert [m.get("tool_call_id") for m in tools[3:5]] == ["c1", "c2"]
    assert tools[-1]["extra"] == {"exit_status": "Submitted", "submission": "patch"}


def test_a_whole_batch_run_directory(tmp_path):
    run = tmp_path / "run"
    for task_id, name in (("task-a", "mini-swe-agent-2.4.6-text.traj.json"), ("task-b", "mini-swe-agent-2.4.6-tools.traj.json")):
        (run / task_id).mkdir(parents=True)
        shutil.copy(REFERENCE / name, run / task_id / f"{task_id}.traj.json")
    (run / "task-a" / "task-a.attempt1.traj.json").write_text("{}")  # an earlier attempt: not a task
    (run / "results.jsonl").write_text("")
    written = export_batch(str(run))
    out = tmp_path / "run.mini-swe-agent"
    assert written == [str(out / "task-a" / "task-a.traj.json"), str(out / "task-b" / "task-b.traj.json"),
                       str(out / "preds.json")]
    # what mini-swe-agent's inspector opens: every *.traj.json under the folder, each with its messages
    found = sorted(out.rglob("*.traj.json"))
    assert [p.name for p in found] == ["task-a.traj.json", "task-b.traj.json"]
    for path in found:
        document = json.loads(path.read_text())
        assert document["instance_id"] == path.parent.name and document["messages"][0]["role"] == "system"
    preds = json.loads((out / "preds.json").read_text())
    assert preds["task-a"] == {"model_name_or_path": "test-model", "instance_id": "task-a", "model_patch": "the-patch"}
    with pytest.raises(UsageError, match="no task trajectories"):
        export_batch(str(tmp_path / "run" / "task-a"), str(tmp_path / "elsewhere"))


def test_secrets_stay_masked(tmp_path, monkeypatch):
    data = json.loads((REFERENCE / "mini-swe-agent-1.1-from-docs.traj.json").read_text())
    secret, token = "sk-export-secret-0123456789", "ghp_" + "z" * 30
    data["info"]["config"]["model"]["model_kwargs"]["api_key"] = secret
    data["info"]["config"]["environment"]["env"] = {"GITHUB_TOKEN": token}
    data["messages"][3]["extra"]["raw_output"] = f"{secret} and {token}\n"
    source = tmp_path / "leaky.traj.json"
    source.write_text(json.dumps(data))
    written = Path(export(str(source), str(tmp_path / "out.traj.json"))).read_text()
    assert secret not in written and token not in written and "***" in written
    # a miniswe record whose key variable is set where it is exported: the key's value is masked wherever it shows
    recorded = json.loads((Path(__file__).parent / "data" / "trajectories" / "v2.json").read_text())
    monkeypatch.setenv("OPENAI_API_KEY", "sk-live-key-abcdefghijkl")
    recorded["config"]["model"] = {"kind": "openai", "name": "test-model"}  # its key: $OPENAI_API_KEY, by default
    recorded["steps"][0]["output"] = "sk-live-key-abcdefghijkl\n"
    path = tmp_path / "record.traj.json"
    path.write_text(json.dumps(recorded))
    assert "sk-live-key-abcdefghijkl" not in Path(export(str(path))).read_text()


def test_bad_input_is_refused_in_one_line(tmp_path):
    source = REFERENCE / "mini-swe-agent-1.1-from-docs.traj.json"
    with pytest.raises(UsageError, match="unknown export format"):
        export(str(source), str(tmp_path / "x.json"), format="swe-agent")
    copy = tmp_path / "same.traj.json"
    shutil.copy(source, copy)
    with pytest.raises(UsageError, match="would replace the trajectory it reads"):
        export(str(copy), str(copy))
    (tmp_path / "junk.json").write_text('{"steps": []}')
    with pytest.raises(TrajectoryError):
        export(str(tmp_path / "junk.json"))
    with pytest.raises(UsageError, match="not a directory"):
        export_batch(str(tmp_path / "missing"))


def test_an_exported_file_read_back_is_not_saved_over(tmp_path):
    written = export(str(REFERENCE / "mini-swe-agent-2.4.6-text.traj.json"), str(tmp_path / "x.traj.json"))
    with pytest.raises(RecordError, match="miniswe's export"):
        load_any(written).save()
    assert os.path.exists(written)


def test_short_secrets_and_run_args_of_a_mini_swe_agent_config_are_masked_by_structure(tmp_path, monkeypatch):
    data = json.loads((REFERENCE / "mini-swe-agent-2.4.6-tools.traj.json").read_text())
    config = data["info"]["config"]
    config["model"]["model_kwargs"] = {"api_key": "short1"}
    config["environment"]["run_args"] = ["-e", "HF_TOKEN=hf-short", "-Pe", "GITHUB_TOKEN", "--env=MODE=fast"]
    forwarded = "ghp_forwarded_by_name_0123456789"
    monkeypatch.setenv("GITHUB_TOKEN", forwarded)
    data["messages"][3]["content"] = f"GITHUB_TOKEN={forwarded}"
    source = tmp_path / "short.traj.json"
    source.write_text(json.dumps(data))
    text = Path(export(str(source), str(tmp_path / "out.traj.json"))).read_text()
    info = json.loads(text)["info"]
    assert info["config"]["model"]["model_kwargs"] == {"api_key": "***"}
    assert info["config"]["environment"]["run_args"] == ["-e", "HF_TOKEN=***", "-Pe", "GITHUB_TOKEN", "--env=MODE=fast"]
    assert "short1" not in text and "hf-short" not in text and forwarded not in text
