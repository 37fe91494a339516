"""Streamed replies (server-sent events) against the scripted server: the same record as a plain call, deltas
handed out as they arrive, usage from the last chunk, a stalled stream cut and retried, deadlines and stops."""

import re
import threading
import time

import pytest

from miniswe.config import load_config
from miniswe.errors import Cancelled, DeadlineReached, ModelError
from miniswe.models.openai import OpenAIModel
from miniswe.signals import Stop
from miniswe.status import interrupted

from replies import act

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "list the files"}]
ITEM = {"content": act("ls -la"), "reasoning_content": "The person wants the files.\nls shows them.",
        "finish_reason": "stop", "cached_tokens": 3}


def model(server, *overrides, **context):
    config = load_config(f"model.base_url={server.base_url}", "model.name=m", "model.max_backoff=0.01", *overrides).model
    return OpenAIModel(config, **context)


def test_a_streamed_reply_is_the_same_record_as_a_plain_one(server):
    server.push(ITEM, ITEM)
    plain = model(server).complete(MESSAGES)
    deltas = []
    streamed = model(server, "model.stream=true", on_delta=lambda kind, text: deltas.append((kind, text))).complete(MESSAGES)
    plain.latency_s = streamed.latency_s = 0
    assert streamed == plain
    assert streamed.reasoning == ITEM["reasoning_content"] and streamed.content == ITEM["content"]
    assert streamed.usage.total_tokens > 0 and streamed.usage.cached_tokens == 3
    request = server.requests[1]["body"]
    assert request["stream"] is True and request["stream_options"] == {"include_usage": True}
    assert "".join(t for k, t in deltas if k == "reasoning") == ITEM["reasoning_content"]
    assert "".join(t for k, t in deltas if k == "content") == ITEM["content"]
    assert len(deltas) > 10 and deltas[0][0] == "reasoning"  # piece by piece, reasoning first


def test_reasoning_under_the_other_key_and_usage_estimated_without_a_last_chunk(server):
    # a server that ignores stream_options sends no usage: the call is counted from its characters and says so
    item = {"content": "plain words", "reasoning": "hmm", "stream_usage": False}
    server.push(item)
    reply = model(server, "model.stream=true", "model.prices={prompt: 1000000, completion: 1000000}").complete(MESSAGES)
    assert reply.reasoning == "hmm" and reply.content == "plain words" and reply.finish_reason == "stop"
    assert reply.usage.completion_tokens == 5  # 14 characters, 3 a token, rounded up
    assert reply.usage.prompt_tokens > 10 and reply.usage.estimated_tokens == reply.usage.total_tokens
    assert reply.usage.cost == reply.usage.total_tokens  # priced like reported tokens: $1 a token here


def test_a_token_limit_holds_against_a_server_whose_streams_carry_no_usage(tmp_path):
    from miniswe.runner import run_task

    from openai_server import ScriptedServer

    with ScriptedServer([act(f"echo {n}") for n in range(30)], stream_usage=False) as server:
        config = load_config(f"model.base_url={server.base_url}", "model.name=m", "model.stream=true",
                             "agent.token_limit=3000", f"environment.cwd={tmp_path}")
        result = run_task(config, "count", str(tmp_path / "t.traj.json"))
    assert result.outcome.status.value == "LimitsExceeded" and "token_limit" in result.outcome.detail
    assert 3000 <= result.trajectory.usage.total_tokens == result.trajectory.usage.estimated_tokens
    assert len(result.trajectory.steps) < 30, "the run stopped at its token limit, not at the end of the script"


def test_an_empty_stream_is_asked_again_without_streaming_and_learns_the_window(server):
    # llama-cpp-python answers a streamed prompt over its window with a 200 stream and no events: asked once
    # without streaming, the server's real refusal is what the caller gets, at once, not after ten retries
    from miniswe.errors import ContextLengthError
    from openai_server import ScriptedServer

    with ScriptedServer([ITEM], context_window=3, overflow_style="empty_stream") as small:
        retries = []
        started = time.monotonic()
        with pytest.raises(ContextLengthError) as refused:
            model(small, "model.stream=true", on_retry=retries.append).complete(MESSAGES)
        assert time.monotonic() - started < 5
        assert refused.value.window == 3 and small.overflows == 2
        assert [r["body"].get("stream") for r in small.requests] == [True, None]
        assert len(retries) == 1 and "without streaming" in retries[0]


def test_a_server_that_ignores_stream_answers_plain_json(server):
    server.push({"content": "hello", "no_stream": True})
    reply = model(server, "model.stream=true").complete(MESSAGES)
    assert reply.content == "hello" and reply.usage.total_tokens > 0


def test_a_stalled_stream_is_cut_after_the_idle_timeout_and_retried(server):
    retries = []
    server.push({**ITEM, "stall_after": 4}, ITEM)
    started = time.monotonic()
    deltas = []
    reply = model(server, "model.stream=true", "model.stream_idle_timeout=0.5", on_retry=retries.append,
                  on_delta=lambda kind, text: deltas.append(text)).complete(MESSAGES)
    assert reply.content == ITEM["content"]
    assert len(retries) == 1 and "the stream sent nothing for 0.5s" in retries[0]
    assert 0.4 < time.monotonic() - started < 10
    assert len(server.requests) == 2


def test_the_retry_after_a_call_given_up_on_waits_as_long_as_it_was_given(server):
    # a local server goes on generating the answer it was cut off from: a retry at once would queue behind it
    retries = []
    server.push({**ITEM, "stall_after": 4}, ITEM)
    model(server, "model.stream=true", "model.stream_idle_timeout=1.5", "model.max_backoff=5",
          on_retry=retries.append).complete(MESSAGES)
    waited = float(re.search(r"in ([\d.]+)s", retries[0]).group(1))
    assert 1.5 <= waited <= 5, retries


def test_a_stream_that_hangs_up_midway_is_retried_and_a_final_failure_is_a_model_error(server):
    server.push({**ITEM, "stream_cut_after": 3}, ITEM)
    assert model(server, "model.stream=true").complete(MESSAGES).content == ITEM["content"]
    server.push(*[{**ITEM, "stream_cut_after": 3}] * 2)
    with pytest.raises(ModelError, match="stream ended before the reply was complete|cut off"):
        model(server, "model.stream=true", "model.retries=1").complete(MESSAGES)


def test_the_whole_call_deadline_holds_while_a_stream_trickles(server):
    # each event comes within the idle timeout, but the call as a whole takes too long
    server.push({**ITEM, "event_delay": 0.2}, ITEM)
    retries = []
    started = time.monotonic()
    reply = model(server, "model.stream=true", "model.timeout=1", "model.stream_idle_timeout=5",
                  on_retry=retries.append).complete(MESSAGES)
    assert reply.content == ITEM["content"] and retries and "no complete answer within 1s" in retries[0]
    assert time.monotonic() - started < 10
    server.push({**ITEM, "event_delay": 0.2})
    with pytest.raises(DeadlineReached):
        model(server, "model.stream=true", "model.stream_idle_timeout=5").complete(MESSAGES, deadline=time.monotonic() + 1)


def test_an_urgent_stop_cuts_a_stream_at_once_and_keeps_what_it_showed(server):
    server.push({**ITEM, "stall_after": 5})
    stop = Stop()
    deltas = []
    client = model(server, "model.stream=true", stop=stop, on_delta=lambda kind, text: deltas.append(text))
    threading.Timer(0.5, lambda: stop.request(interrupted("SIGINT"), urgent=True)).start()
    started = time.monotonic()
    with pytest.raises(Cancelled):
        client.complete(MESSAGES)
    assert time.monotonic() - started < 5 and len(deltas) == 4  # the four events before the stall


def test_run_streams_into_the_same_trajectory(server, tmp_path):
    from miniswe.runner import run_task

    from replies import SUBMIT

    records = []
    item = {**ITEM, "content": act("echo listed")}
    for stream in ("false", "true"):
        server.push(item, SUBMIT)
        config = load_config(f"model.base_url={server.base_url}", "model.name=m", f"model.stream={stream}",
                             f"environment.cwd={tmp_path}")
        result = run_task(config, "list", str(tmp_path / f"{stream}.traj.json"))
        assert result.outcome.status.value == "Submitted"
        records.append([{k: v for k, v in s.to_dict().items() if k not in ("latency_s", "duration_s")}
                        for s in result.trajectory.steps])
    assert records[0] == records[1] and records[1][0]["reasoning"] == ITEM["reasoning_content"]


def test_usage_reported_as_all_zeros_is_estimated_as_when_none_is_reported(server):
    # a server that counts nothing but says 0 (not: leaves usage out) is estimated too, so token_limit holds;
    # the one rule of both kinds (models/common.py)
    zeros = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    server.push({"content": "plain words", "usage": zeros}, {"content": "plain words", "stream_usage": False})
    counted = model(server).complete(MESSAGES)
    missing = model(server, "model.stream=true").complete(MESSAGES)
    assert counted.usage.completion_tokens == 4 and counted.usage.prompt_tokens > 10  # 11 characters, 3 a token
    assert counted.usage.estimated_tokens == counted.usage.total_tokens == missing.usage.total_tokens


def test_a_refusal_echoing_any_secret_looking_variable_is_masked(server, monkeypatch):
    # as the litellm kind masks them (models/common.py: scrub): SDKs and proxies read credentials miniswe never named
    token = "ghp-planted-token-value-0042"
    monkeypatch.setenv("SOME_SERVICE_TOKEN", token)
    server.push({"status": 403, "body": {"error": {"message": f"token {token} may not use m"}}})
    with pytest.raises(ModelError) as refused:
        model(server).complete(MESSAGES)
    assert token not in str(refused.value) and "token *** may not use m" in str(refused.value)
    assert "check that OPENAI_API_KEY may use this model" in str(refused.value)


def test_the_overflow_reading_is_one_for_both_kinds():
    from miniswe.models.common import overflow

    assert overflow("This model's maximum context length is 8192 tokens. However, your messages resulted in "
                    "9000 tokens.") == (8192, 9000)
    assert overflow("the request exceeds the available context size, try increasing it exceed_context_size_error",
                    n_ctx=4096, n_prompt="5000") == (4096, 5000)
    assert overflow("prompt is too long: 208000 tokens > 200000 maximum") == (200000, 208000)
    assert overflow("request (12 tokens) exceeds the available context size (8 tokens)") == (8, 12)
    assert overflow("Input is too long for the model's context window.") == (None, None)
    assert overflow("invalid temperature") is None and overflow("window too small", known=True) == (None, None)
