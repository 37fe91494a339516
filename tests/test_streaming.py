"""Streamed replies (server-sent events) against the scripted server: the same record as a plain call, deltas
handed out as they arrive, usage from the last chunk, a stalled stream cut and retried, deadlines and stops."""

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


def test_reasoning_under_the_other_key_and_usage_counted_without_a_last_chunk(server):
    item = {"content": "plain words", "reasoning": "hmm", "stream_usage": False}
    server.push(item)
    reply = model(server, "model.stream=true", "model.prices={prompt: 1000000, completion: 1000000}").complete(MESSAGES)
    assert reply.reasoning == "hmm" and reply.content == "plain words" and reply.finish_reason == "stop"
    assert reply.usage.total_tokens == 0 and reply.usage.cost == 0  # as a plain reply without usage counts it


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
