"""Context compaction against a server that enforces a context window: runs long enough to outgrow it go on
(older observations elided, then a summary standing in for the middle), the record keeps everything, the
prompt grows only at its end between compactions, and a refusal for length is compacted and asked again."""

from __future__ import annotations

import json

import pytest

from conftest import SUBMIT, act
from replies import TOOL_SUBMIT, call, calls
from openai_server import ScriptedServer

SUMMARY_REQUEST = "outgrow your context window"
WINDOW = 8000  # tokens; the scripted server counts 4 characters a token
SUMMARY = "SUMMARY: printed blocks of o's; nothing else matters."


def printer(n: int, size: int = 2000) -> str:
    """A step whose output is `size` characters, different per step (so loop detection stays quiet)."""
    return act(f"echo step-{n}; head -c {size} /dev/zero | tr '\\0' o; echo")


def contents(request) -> list[str]:
    return [m["content"] for m in request["body"]["messages"]]


def chat_requests(server) -> list[dict]:
    return [r for r in server.requests if r["path"].endswith("/chat/completions")]


def run(cli, server, *extra: str):
    result = cli("run", "print blocks", "--base-url", server.base_url, "-m", "m", "-o", "t.json", "--step-limit", "40",
                 *extra)
    return result


def test_a_long_run_elides_old_observations_keeps_everything_on_record_and_the_prefix_stable(cli, tmp_path):
    with ScriptedServer([printer(n) for n in range(1, 13)] + [SUBMIT], context_window=WINDOW) as server:
        result = run(cli, server, "-c", f"agent.context_window={WINDOW}", "-c", "agent.keep_turns=2")
        assert result.returncode == 0, result.stderr
        assert server.overflows == 0, "compaction kept every prompt within the window"
        requests = chat_requests(server)
    data = json.loads((tmp_path / "t.json").read_text())
    assert data["exit_status"] == "Submitted"
    compactions = data["compactions"]
    assert compactions and all(c["kind"] == "elide" and c["window"] == WINDOW for c in compactions)
    assert all(c["tokens_after"] < c["tokens_before"] for c in compactions)
    assert "context compacted" in result.stderr
    # the record keeps every output whole
    assert sum("o" * 2000 in m["content"] for m in data["messages"] if m["role"] == "user") == 12
    last = contents(requests[-1])
    assert sum("elided to keep the conversation within the context window" in c for c in last) >= 5
    assert all("o" * 2000 in c for c in last[-4:] if c.startswith("<")), "the newest turns are never cut"
    assert last[0] == data["messages"][0]["content"] and last[1] == data["messages"][1]["content"]
    # between compactions each prompt is the previous one plus what happened since: a prefix cache keeps working
    grown = sum(contents(b)[:len(contents(a))] == contents(a) for a, b in zip(requests, requests[1:]))
    assert grown == len(requests) - 1 - len(compactions)


def test_when_eliding_is_not_enough_a_frozen_summary_stands_in_for_the_middle(cli, tmp_path):
    # ~3,800 characters a reply; elided, each reply and observation still leaves a line and a note, and on a
    # 4000-token window fourteen turns of those no longer fit beside the default prompt and the newest turns
    long_thought = "THOUGHT: " + "thinking hard about the blocks. " * 120
    replies = [printer(n) if n % 2 else act(f"echo step-{n}", long_thought) for n in range(1, 15)] + [SUBMIT]
    with ScriptedServer(replies, context_window=4000, rules=[(SUMMARY_REQUEST, SUMMARY)]) as server:
        result = run(cli, server, "-c", "agent.context_window=4000", "-c", "agent.keep_turns=2")
        assert result.returncode == 0, result.stderr
        assert server.overflows == 0
        requests = chat_requests(server)
    data = json.loads((tmp_path / "t.json").read_text())
    summaries = [c for c in data["compactions"] if c["kind"] == "summary"]
    assert summaries and summaries[0]["summary"] == SUMMARY and summaries[0]["usage"]["model_calls"] == 1
    asked = [r for r in requests if SUMMARY_REQUEST in contents(r)[-1]]
    assert len(asked) == len(summaries), "one summary call per summary checkpoint"
    last = contents(requests[-1])
    assert SUMMARY in last[1] and last[1].startswith(data["messages"][1]["content"]), "the summary rides on the task"
    assert sum(long_thought in c for c in last) <= 2, "the summarised middle is not sent again"
    assert sum(m["content"].startswith(long_thought) for m in data["messages"]) == 7, "the record keeps it all"
    assert data["usage"]["model_calls"] == len(requests), "the summary calls are paid for in the run's usage"


@pytest.mark.parametrize("style", ["openai", "llamacpp", "plain"])
def test_a_refusal_for_length_teaches_the_window_and_the_call_is_made_again(cli, tmp_path, style):
    with ScriptedServer([printer(n, 3000) for n in range(1, 13)] + [SUBMIT], context_window=WINDOW,
                        overflow_style=style, rules=[(SUMMARY_REQUEST, SUMMARY)]) as server:
        result = run(cli, server, "-c", "agent.keep_turns=2")  # no window configured
        assert result.returncode == 0, result.stderr
        assert server.overflows >= 1
    data = json.loads((tmp_path / "t.json").read_text())
    first = data["compactions"][0]
    assert first["why"] == "the endpoint refused the prompt's length"
    if style == "plain":  # no numbers in the refusal: taken to be a little under the refused prompt
        assert WINDOW * 0.9 <= first["window"] < first["tokens_before"]
    else:
        assert first["window"] == WINDOW
    assert data["exit_status"] == "Submitted" and len(data["steps"]) == 13


def test_a_conversation_that_cannot_fit_ends_with_a_clear_model_error(cli, tmp_path):
    # 900 tokens: the default prompt (~700) and one turn, even with its output clipped, leave no room
    with ScriptedServer([printer(n, 6000) for n in range(1, 6)] + [SUBMIT], context_window=900) as server:
        result = run(cli, server, "-c", "agent.keep_turns=4")
    data = json.loads((tmp_path / "t.json").read_text())
    assert result.returncode == 3 and data["exit_status"] == "ModelError"
    assert "does not fit even compacted: the system prompt and the task (about" in data["exit_detail"]
    assert "lower agent.output_limit" in data["exit_detail"], "what would make it fit"
    assert len(data["steps"]) >= 1, "the finished steps stay on record"


def test_a_forked_run_goes_on_from_the_same_checkpoint(cli, tmp_path):
    replies = [printer(n, 4000) for n in range(1, 13)] + [SUBMIT]
    flags = ("-c", f"agent.context_window={WINDOW}", "-c", "agent.keep_turns=2")
    with ScriptedServer(replies, context_window=WINDOW) as server:
        first = cli("run", "print blocks", "--base-url", server.base_url, "-m", "m", "-o", "t.json",
                    "--step-limit", "9", *flags)
        assert first.returncode == 1, first.stderr  # LimitsExceeded, after compacting
        before = json.loads((tmp_path / "t.json").read_text())
        assert before["compactions"]
        last_sent = contents(chat_requests(server)[-1])
        again = cli("run", "--fork", "t.json", "--from-step", "9", "-o", "f.json", "--force", "--base-url", server.base_url,
                    "-m", "m", "--step-limit", "40", *flags)
        assert again.returncode == 0, again.stderr
        resumed = contents(chat_requests(server)[9])
    assert resumed[:len(last_sent)] == last_sent, "the first prompt of the fork extends the last one before"
    assert json.loads((tmp_path / "f.json").read_text())["compactions"][:len(before["compactions"])] == before["compactions"]


def test_a_task_longer_than_the_window_ends_at_once_saying_so(cli, tmp_path):
    with ScriptedServer([SUBMIT], context_window=1000, overflow_style="llamacpp") as server:
        result = cli("run", "x" * 8000, "--base-url", server.base_url, "-m", "m", "-o", "t.json")
    assert result.returncode == 3
    assert "the system prompt and the task alone exceed the model's context window (1000 tokens)" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


# The refusals of real servers, as they word them (llama.cpp's recorded from build 11434).
REFUSALS = [
    ({"code": 400, "message": "request (1618 tokens) exceeds the available context size (512 tokens), try increasing it",
      "type": "exceed_context_size_error", "n_prompt_tokens": 1618, "n_ctx": 512}, (512, 1618)),
    ({"code": 400, "message": "request (1618 tokens) exceeds the available context size (512 tokens), try increasing it",
      "type": "exceed_context_size_error"}, (512, 1618)),
    ({"message": "input (3000 tokens) is larger than the max context size (2048 tokens). skipping"}, (2048, 3000)),
    ({"message": "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (4000 in the "
                 "messages, 1000 in the completion).", "code": "context_length_exceeded"}, (4096, 5000)),
    ({"message": "prompt is too long: 210000 tokens > 200000 maximum"}, (200000, 210000)),
    ({"message": "Input is too long for the model's context window."}, (None, None)),
    ({"message": "Failed to initialize samplers: failed to parse grammar", "type": "invalid_request_error"}, None),
]


@pytest.mark.parametrize(("error", "expected"), REFUSALS)
def test_refusals_for_length_are_told_from_other_refusals_with_their_numbers(cli, tmp_path, error, expected):
    with ScriptedServer([{"status": 400, "body": {"error": error}}]) as server:
        result = cli("run", "x", "--base-url", server.base_url, "-m", "m", "-o", "t.json", "-c", "agent.keep_turns=1")
    assert result.returncode == 3
    if expected is None:
        assert "check model.params" in result.stderr, "an ordinary 400 names its usual fix"
    else:
        # refused on the first call, nothing to compact: the window it learned is the one named
        assert "the system prompt and the task alone exceed" in result.stderr, result.stderr
        if expected[0]:
            assert f"context window ({expected[0]} tokens)" in result.stderr


def test_with_tool_calling_compaction_never_separates_a_call_from_its_answer(cli, tmp_path):
    long_thought = "thinking hard about the blocks. " * 120  # ~3,800 characters of content beside each call
    replies = [calls(call("bash", command=f"echo step-{n}; head -c 2000 /dev/zero | tr '\\0' o; echo"),
                     content=long_thought if n % 2 == 0 else "") for n in range(1, 15)] + [TOOL_SUBMIT]
    with ScriptedServer(replies, context_window=WINDOW, rules=[(SUMMARY_REQUEST, SUMMARY)]) as server:
        result = run(cli, server, "-c", "protocol.kind=tools", "-c", f"agent.context_window={WINDOW}",
                     "-c", "agent.keep_turns=2")
        assert result.returncode == 0, result.stderr
        assert server.overflows == 0, "compaction kept every prompt, tool calls and definitions included, in the window"
        requests = chat_requests(server)
    data = json.loads((tmp_path / "t.json").read_text())
    assert data["exit_status"] == "Submitted" and data["submission"] == "the patch"
    assert any(c["kind"] == "summary" for c in data["compactions"]), "eliding alone was not enough here"
    for request in requests:
        messages = request["body"]["messages"]
        assert request["body"]["tools"], "every call, the summary's too, offers the tools"
        called = {c["id"] for m in messages if m["role"] == "assistant" for c in m.get("tool_calls") or ()}
        answered = {m["tool_call_id"] for m in messages if m["role"] == "tool"}
        assert called == answered, "no call without its answer, no answer without its call"
    last = requests[-1]["body"]["messages"]
    assert SUMMARY in last[1]["content"]
    assert any("elided to keep the conversation within the context window" in (m["content"] or "")
               for r in requests for m in r["body"]["messages"] if m["role"] == "tool"), "tool answers are elided too"
    assert last[-1]["role"] == "tool" and "o" * 2000 in last[-1]["content"], "the newest turn is whole"
    # the record keeps every call and every answer
    assert sum(m["role"] == "tool" and "o" * 2000 in m["content"] for m in data["messages"]) == 14


def test_when_the_newest_turns_alone_fill_the_goal_a_summary_is_not_asked_for_at_every_compaction(cli, tmp_path):
    # window 6000: the trigger is 3000 tokens and the goal 1800; two kept turns of 2 KB outputs are ~1,100
    replies = [printer(n) for n in range(1, 26)] + [SUBMIT]
    with ScriptedServer(replies, context_window=6000, rules=[(SUMMARY_REQUEST, SUMMARY)]) as server:
        result = run(cli, server, "-c", "agent.context_window=6000", "-c", "agent.keep_turns=2")
        assert result.returncode == 0, result.stderr
        assert server.overflows == 0
        requests = chat_requests(server)
    data = json.loads((tmp_path / "t.json").read_text())
    summaries = [c for c in data["compactions"] if c["kind"] == "summary"]
    assert 1 <= len(summaries) <= 3, "a summary only once the middle it replaces is worth a model call"
    assert len(requests) <= 26 + len(summaries)


@pytest.mark.parametrize("window", [2048, 4096])
@pytest.mark.parametrize("learned", [False, True], ids=["configured", "learned"])
def test_on_a_small_window_with_the_real_default_prompt_a_run_goes_on_to_its_step_limit(cli, tmp_path, window, learned):
    # a local server's default window (llama-cpp-python: 2048): the shipped system prompt and the task fit, so
    # compaction keeps every prompt within it, summarising and eliding replies as well as observations, however
    # long the run; the newest output of ~5k characters is cut to what the window holds, not a run's end
    replies = [act(f"echo step-{n}; head -c {5000 if n == 3 else 600} /dev/zero | tr '\\0' o; echo") for n in range(1, 25)]
    with ScriptedServer(replies, context_window=window, rules=[(SUMMARY_REQUEST, SUMMARY)]) as server:
        extra = () if learned else ("-c", f"agent.context_window={window}")
        result = run(cli, server, "--step-limit", "20", *extra)
        requests = chat_requests(server)
    data = json.loads((tmp_path / "t.json").read_text())
    assert data["exit_status"] == "LimitsExceeded", (data["exit_status"], data["exit_detail"], result.stderr[-500:])
    summaries = [c for c in data["compactions"] if c["kind"] == "summary"]
    assert data["compactions"] and (summaries or window > 2048), "on 2048 tokens, a summary was asked for, and it fit"
    assert len(data["steps"]) + len(summaries) >= 20, "every call the step limit allows was made: no call was lost"
    assert server.overflows <= (1 if learned else 0), "only learning the window may cost a refusal"
    assert all(sum(len(m["content"] or "") for m in r["body"]["messages"]) // 4 <= window for r in requests[-5:])
