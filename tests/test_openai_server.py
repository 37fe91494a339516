"""Checks for the scripted OpenAI-compatible test server in tests/openai_server.py."""

import http.client
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

sys.path.insert(0, str(Path(__file__).parent))
from openai_server import ScriptedServer, load_replies, serve  # noqa: E402

SERVER_SCRIPT = Path(__file__).parent / "openai_server.py"
MESSAGES = [{"role": "system", "content": "x" * 40}, {"role": "user", "content": "y" * 40}]


def chat(base_url, timeout=5, session=requests, **kw):
    body = {"model": "test-model", "messages": MESSAGES}
    return session.post(f"{base_url}/chat/completions", json=body, timeout=timeout, **kw)


def test_normal_reply_shape():
    with ScriptedServer(["hello there"]) as server:
        data = chat(server.base_url).json()
    assert data["object"] == "chat.completion" and data["id"] and isinstance(data["created"], int)
    assert data["model"] == "test-model"
    assert data["choices"][0]["message"] == {"role": "assistant", "content": "hello there"}
    assert data["choices"][0]["finish_reason"] == "stop"
    assert data["usage"] == {"prompt_tokens": 20, "completion_tokens": 3, "total_tokens": 23}


def test_dict_item_extras():
    item = {"content": "c", "reasoning_content": "think", "finish_reason": "length", "cost": 0.25, "cached_tokens": 7, "usage": {"completion_tokens": 100}}
    with ScriptedServer([item]) as server:
        data = chat(server.base_url).json()
    choice = data["choices"][0]
    assert choice["message"]["reasoning_content"] == "think" and choice["finish_reason"] == "length"
    assert data["usage"] == {"prompt_tokens": 20, "completion_tokens": 100, "total_tokens": 120, "cost": 0.25, "prompt_tokens_details": {"cached_tokens": 7}}


def test_error_statuses():
    items = [{"status": 429, "retry_after": 2}, {"status": 401, "body": {"error": {"message": "Incorrect API key provided"}}}, {"status": 500}]
    with ScriptedServer(items) as server:
        r429, r401, r500 = (chat(server.base_url) for _ in items)
        assert r429.status_code == 429 and r429.headers["Retry-After"] == "2"
        assert r401.status_code == 401 and r401.json()["error"]["message"] == "Incorrect API key provided"
        assert r500.status_code == 500 and "message" in r500.json()["error"]


def test_exhausted_and_default():
    with ScriptedServer() as server:
        r = chat(server.base_url)
        assert r.status_code == 500 and r.json()["error"]["message"] == "script exhausted"
    with ScriptedServer(default="again") as server:
        assert [chat(server.base_url).json()["choices"][0]["message"]["content"] for _ in range(2)] == ["again"] * 2


def test_broken_json():
    with ScriptedServer([{"broken_json": True}, "fine"]) as server, requests.Session() as session:
        r = chat(server.base_url, session=session)
        assert r.status_code == 200
        with pytest.raises(ValueError):
            r.json()
        # The truncated body has a correct Content-Length, so the connection stays usable.
        assert chat(server.base_url, session=session).json()["choices"][0]["message"]["content"] == "fine"


def test_stall_triggers_client_timeout_and_stop_is_fast():
    server = serve([{"stall": 30}, "after"])
    try:
        with pytest.raises(requests.ReadTimeout):
            chat(server.base_url, timeout=0.2)
        assert chat(server.base_url).json()["choices"][0]["message"]["content"] == "after"
    finally:
        started = time.monotonic()
        server.stop()
    assert time.monotonic() - started < 2


def test_close_drops_connection():
    with ScriptedServer([{"close": True}]) as server:
        with pytest.raises(requests.ConnectionError):
            chat(server.base_url)


def test_latency():
    with ScriptedServer(["a", {"content": "b", "latency": 0.2}], latency=0.1) as server:
        started = time.monotonic()
        chat(server.base_url)
        assert time.monotonic() - started >= 0.1
        started = time.monotonic()
        chat(server.base_url)
        assert time.monotonic() - started >= 0.3


def test_records_requests_with_headers_and_body():
    with ScriptedServer(["ok"]) as server:
        chat(server.base_url, headers={"Authorization": "Bearer sk-test"})
        requests.get(f"{server.base_url}/models", timeout=5)
        first, second = server.requests
    assert first["method"] == "POST" and first["path"] == "/v1/chat/completions"
    assert first["headers"]["Authorization"] == "Bearer sk-test" and first["headers"]["authorization"] == "Bearer sk-test"
    assert first["body"] == {"model": "test-model", "messages": MESSAGES}
    assert second["method"] == "GET" and second["path"] == "/v1/models" and second["body"] is None


def test_models_and_paths_without_v1():
    with ScriptedServer(["root"]) as server:
        models = requests.get(f"{server.base_url}/models", timeout=5).json()
        assert models["object"] == "list" and models["data"][0]["id"]
        root = server.base_url.removesuffix("/v1")
        assert chat(root).json()["choices"][0]["message"]["content"] == "root"
        assert requests.get(f"{root}/nope", timeout=5).status_code == 404


def test_keep_alive_reuses_connection():
    with ScriptedServer(["a", "b", "c"]) as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        conn.connect()
        sock = conn.sock
        for expected in "abc":
            conn.request("POST", "/v1/chat/completions", body=json.dumps({"model": "m", "messages": []}), headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            assert json.loads(response.read())["choices"][0]["message"]["content"] == expected
            assert not response.will_close
        assert conn.sock is sock
        conn.close()


def test_push_and_pending():
    with ScriptedServer(["a"]) as server:
        server.push("b", {"content": "c"})
        assert server.pending == 3
        assert [chat(server.base_url).json()["choices"][0]["message"]["content"] for _ in range(3)] == ["a", "b", "c"]
        assert server.pending == 0


def test_load_replies_yaml(tmp_path):
    path = tmp_path / "replies.yaml"
    path.write_text("- hello\n- status: 429\n  retry_after: 1\n")
    assert load_replies(path) == ["hello", {"status": 429, "retry_after": 1}]


def test_standalone_process(tmp_path):
    script = tmp_path / "replies.json"
    script.write_text(json.dumps(["from a subprocess", {"status": 429, "retry_after": 3}]))
    port_file = tmp_path / "port"
    log = tmp_path / "requests.jsonl"
    cmd = [sys.executable, str(SERVER_SCRIPT), "--script", str(script), "--port-file", str(port_file), "--requests-log", str(log)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 10
        while not port_file.exists():
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "server did not write its port file"
            time.sleep(0.02)
        base_url = f"http://127.0.0.1:{int(port_file.read_text())}/v1"
        assert chat(base_url).json()["choices"][0]["message"]["content"] == "from a subprocess"
        assert chat(base_url).headers["Retry-After"] == "3"
        assert json.loads(log.read_text().splitlines()[0])["body"]["model"] == "test-model"
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=10)
    assert out.strip() == port_file.read_text()
    assert err == ""  # request logging is suppressed
