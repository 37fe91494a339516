"""Local model servers (llama.cpp and the like) behind a real `miniswe run`: a server with one slot goes on
generating an answer its client gave up on, so a retry queues behind it. The scripted server plays such a server
(`slots=1`); the client under test is the miniswe CLI in a subprocess, with a short `model.timeout`."""

from __future__ import annotations

import json
import time

import pytest
import requests
from conftest import SUBMIT
from openai_server import ScriptedServer

TIMEOUT = 1.0  # model.timeout of the runs below: every generation the server is scripted with is measured in it


def ask(server, timeout):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    return requests.post(f"{server.base_url}/chat/completions", json=body, timeout=timeout)


def run(cli, server, *settings):
    started = time.monotonic()
    result = cli("run", "x", "--base-url", server.base_url, "-m", "m", "-o", "t.json", "-c", f"model.timeout={TIMEOUT}",
                 *(arg for setting in settings for arg in ("-c", setting)), timeout=120)
    result.wall_s = time.monotonic() - started
    result.ended = time.time()  # the server stamps its records with time.time()
    return result


def drained(server):
    """The server's records once it has generated every answer it was asked for, read or not."""
    deadline = time.monotonic() + 30
    while True:
        records = server.requests
        if all("finished" in r for r in records):
            return records
        assert time.monotonic() < deadline, "the server never finished its queue"
        time.sleep(0.05)


def test_a_single_slot_server_goes_on_generating_an_answer_nobody_reads():
    with ScriptedServer([{"latency": 1.5, "content": "long"}, "quick"], slots=1) as server:
        started = time.monotonic()
        with pytest.raises(requests.ReadTimeout):
            ask(server, timeout=0.3)
        answer = ask(server, timeout=10)  # queued behind the abandoned generation
        waited = time.monotonic() - started
        first, second = drained(server)
    assert answer.json()["choices"][0]["message"]["content"] == "quick" and waited >= 1.5
    assert first["abandoned"] is True and second["abandoned"] is False
    assert second["started"] >= first["finished"] >= first["received"] + 1.5
    # without slots (every other test's server) the second request is answered at once, as before
    with ScriptedServer([{"latency": 1.5, "content": "long"}, "quick"]) as server:
        with pytest.raises(requests.ReadTimeout):
            ask(server, timeout=0.3)
        started = time.monotonic()
        assert ask(server, timeout=10).json()["choices"][0]["message"]["content"] == "quick"
        assert time.monotonic() - started < 1.0 and "abandoned" not in server.requests[0]


@pytest.mark.parametrize("max_backoff", [10, 0.05])  # the backoff's cap does not shorten the wait after a timeout
def test_after_a_runaway_generation_the_run_goes_on_once_the_server_is_free(cli, tmp_path, max_backoff):
    # one answer takes 3.5 model timeouts to generate; the others take less than one
    runaway = {"latency": 3.5 * TIMEOUT, "content": SUBMIT}
    with ScriptedServer([runaway], default={"latency": 0.3 * TIMEOUT, "content": SUBMIT}, slots=1) as server:
        result = run(cli, server, "model.retries=5", f"model.max_backoff={max_backoff}")
        records = drained(server)
    assert result.returncode == 0, result.stderr
    data = json.loads((tmp_path / "t.json").read_text())
    assert data["exit_status"] == "Submitted" and data["usage"]["retries"] == len(records) - 1
    # each retry waited as long as the call it followed was given, so while the runaway answer was generated
    # the server got the call that started it and at most one retry, not one per timeout
    busy_until = records[0]["finished"]
    assert len([r for r in records if r["received"] < busy_until]) <= 2, [r["received"] - records[0]["received"] for r in records]
    assert records[-1]["abandoned"] is False and len(records) <= 4
    assert "no complete answer within 1s; retry 1 of 5" in result.stderr
    assert result.wall_s < 20


def test_a_server_too_slow_for_the_timeout_ends_the_run_with_one_line_and_no_backlog(cli, tmp_path):
    # every answer takes twice the timeout: no call can succeed; the retries must not pile up in the server's queue
    slow = {"latency": 2 * TIMEOUT, "content": SUBMIT}
    with ScriptedServer(default=slow, slots=1) as server:
        result = run(cli, server, "model.retries=2", "model.max_backoff=10")
        records = drained(server)
    assert result.returncode == 3, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("miniswe: ModelError: ") and "no complete answer within 1s (gave up after 3 attempts)" in last
    assert json.loads((tmp_path / "t.json").read_text())["exit_status"] == "ModelError"
    assert len(records) == 3 and all(r["abandoned"] for r in records)
    # each retry came the timeout and as long again after the call before it (less what the server's clock
    # sees of the client's own start-up), where retrying at once would send one a timeout apart: the queue never
    # grew, and the server is free within one generation of miniswe giving up
    gaps = [b["received"] - a["received"] for a, b in zip(records, records[1:])]
    assert all(gap >= 1.6 * TIMEOUT for gap in gaps), gaps
    assert records[-1]["finished"] - result.ended <= 2 * TIMEOUT + 0.5
    assert result.wall_s < 20
