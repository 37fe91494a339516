"""The litellm model kind (an optional extra): real HTTP on 127.0.0.1, against a server speaking Anthropic's Messages
API (tests/anthropic_server.py) and the scripted OpenAI-compatible one, through `miniswe run` as a user runs it and
through the model itself. Every promise of the openai kind holds: miniswe's retries with Retry-After, whole-call
deadlines, stops, a quiet stream cut, refusals for length, errors and secrets masked. Without litellm the kind says
how to install it in one line, and nothing else ever imports it."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from anthropic_server import AnthropicServer, marked_blocks
from conftest import ROOT, SUBMIT, act, clean_env, miniswe_cmd, missing
from replies import TOOL_SUBMIT, call, calls
from waiting import wait_for

NO_LITELLM = missing("litellm", "MINISWE_REQUIRE_LITELLM")
needs_litellm = pytest.mark.skipif(NO_LITELLM, reason="litellm is not installed (pip install -e '.[litellm]'); "
                                                      "MINISWE_REQUIRE_LITELLM=1 makes these tests fail instead")
KEY = "sk-ant-planted-litellm-key-0007"
ROUTE = "anthropic/claude-sonnet-4-5"
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "list the files"}]


@pytest.fixture
def anthropic():
    with AnthropicServer() as server:
        yield server


def litellm_args(server: AnthropicServer, *extra: str) -> list[str]:
    return ["-c", "model.kind=litellm", "-c", f"model.name={ROUTE}", "-c", f"model.api_base={server.api_base}", *extra]


def traj(tmp_path) -> dict:
    return json.loads((tmp_path / "t.json").read_text())


def model(server: AnthropicServer, **settings):
    from miniswe.models.litellm import LitellmConfig, LitellmModel

    context = {key: settings.pop(key) for key in ("stop", "on_retry", "on_delta") if key in settings}
    config = LitellmConfig(name=ROUTE, api_base=server.api_base, max_backoff=0.01, **settings)
    return LitellmModel(config, **context)


# -- nothing imports litellm but this kind, which says how to install it ----------------------------------------

def test_help_and_an_openai_run_never_import_litellm(server, tmp_path):
    server.push(SUBMIT)
    code = (
        "import sys\nfrom miniswe.cli import main\n"
        "for argv in (['--help'], ['run', 'x', '--base-url', sys.argv[1], '-m', 'm', '-o', 't.json', '-q']):\n"
        "    sys.argv = ['miniswe', *argv]\n"
        "    try:\n        main()\n    except SystemExit as exit:\n        print('EXIT', exit.code)\n"
        "print('LITELLM', sorted(m for m in sys.modules if m.split('.')[0] in ('litellm', 'openai', 'httpx')))\n"
    )
    result = subprocess.run([sys.executable, "-c", code, server.base_url], capture_output=True, text=True,
                            env=clean_env(), cwd=tmp_path, timeout=60)
    assert result.stdout.count("EXIT 0") == 2 and "LITELLM []" in result.stdout, result.stdout + result.stderr
    assert traj(tmp_path)["exit_status"] == "Submitted"


def test_without_litellm_the_kind_is_one_line_saying_how_to_install_it(tmp_path):
    code = ("import sys\nsys.modules['litellm'] = None  # as if not installed\n"
            f"sys.argv = ['miniswe', 'run', 'x', '-c', 'model.kind=litellm', '-c', 'model.name={ROUTE}', '-o', 't.json']\n"
            "from miniswe.cli import main\nmain()\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(), cwd=tmp_path,
                            timeout=60)
    assert result.returncode == 2, result.stderr
    line, = result.stderr.strip().splitlines()
    assert "litellm" in line and "pip install -e '.[litellm]' in the miniswe checkout" in line


def test_the_settings_are_checked_and_the_key_variable_follows_the_route():
    from pydantic import ValidationError

    from miniswe.config import load_config
    from miniswe.errors import ConfigError
    from miniswe.models.litellm import LitellmConfig, LitellmModel, caches_prompts, set_cache_control

    config = load_config("model.kind=litellm", f"model.name={ROUTE}", "model.cache_control=on").model
    assert config.cache_control == "on"  # YAML's `on` is true
    assert load_config("model.kind=litellm", "model.name=openrouter/x", "model.api_key_env=MY_KEY").model.api_key_env == "MY_KEY"
    assert load_config("model.kind=litellm", "model.cache_control=false").model.cache_control == "off"
    with pytest.raises(ConfigError, match="base_url"):  # the openai kind's keys are refused, not ignored
        load_config("model.kind=litellm", "model.base_url=http://x")
    with pytest.raises(ValidationError):
        LitellmConfig(cache_control="sometimes")
    with pytest.raises(ConfigError, match=r"model.params.num_retries: miniswe sets it \(use model.retries\)"):
        LitellmModel(LitellmConfig(name=ROUTE, params={"num_retries": 3}))
    with pytest.raises(ConfigError, match="no model name"):
        LitellmModel(LitellmConfig())
    assert caches_prompts(ROUTE) and caches_prompts("bedrock/us.anthropic.claude-sonnet-4-5-v1:0")
    assert caches_prompts("vertex_ai/claude-sonnet-4-5") and not caches_prompts("gemini/gemini-2.5-pro")
    assert not caches_prompts("openai/gpt-4.1") and not caches_prompts("openrouter/anthropic/claude-sonnet-4")
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "task"},
                {"role": "assistant", "content": "a"}, {"role": "user", "content": "out 1"},
                {"role": "assistant", "content": None, "tool_calls": []}, {"role": "tool", "tool_call_id": "c", "content": "out 2"}]
    marked = set_cache_control(messages)
    assert messages[3]["content"] == "out 1", "the caller's messages are left alone"
    assert marked[3]["content"] == [{"type": "text", "text": "out 1", "cache_control": {"type": "ephemeral"}}]
    assert marked[5]["cache_control"] == {"type": "ephemeral"} and marked[5]["content"] == [{"type": "text", "text": "out 2"}]
    assert marked[:3] == messages[:3], "only the last two user or tool messages are marked"


# -- Anthropic's Messages API, end to end through `miniswe run` ------------------------------------------------

def docs_example() -> str:
    """The config example of docs/models-and-streaming.md's litellm section."""
    text = (ROOT / "docs" / "models-and-streaming.md").read_text()
    section = text.split("\n## litellm\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```yaml\n(.*?)```", section, re.S)[1]


@needs_litellm
def test_the_documented_config_runs_against_anthropic_with_prompt_caching_and_a_mapped_cost(cli, anthropic, tmp_path):
    from miniswe.models.litellm import load_litellm

    (tmp_path / "claude.yaml").write_text(docs_example())
    anthropic.push({"content": act("echo hello-from-claude"), "reasoning": "look first"}, act("echo again"), SUBMIT)
    result = cli("run", "say hello", "-c", "claude.yaml", "-c", f"model.api_base={anthropic.api_base}", "-o", "t.json",
                 env={"ANTHROPIC_API_KEY": KEY}, timeout=180)
    assert result.returncode == 0, result.stderr
    data = traj(tmp_path)
    assert data["exit_status"] == "Submitted" and data["steps"][0]["output"] == "hello-from-claude\n"
    assert data["steps"][0]["reasoning"] == "look first"
    assert data["config"]["model"]["api_key_env"] == "ANTHROPIC_API_KEY"
    requests = anthropic.requests
    assert len(requests) == 3 and all(r["headers"]["x-api-key"] == KEY for r in requests)
    assert all(r["body"]["stream"] is True for r in requests), "the example streams"
    # the last two user messages carry the marks: the task, then the newest observation as well
    assert [index for index, _ in marked_blocks(requests[0]["body"])] == [0]
    assert [index for index, _ in marked_blocks(requests[2]["body"])] == [2, 4]
    assert "hello-from-claude" in json.dumps(marked_blocks(requests[1]["body"])[-1][1])
    # what the server read from its cache is counted, and priced by litellm's cost map
    prices = load_litellm().model_cost["claude-sonnet-4-5"]
    total = 0.0
    for step, sent in zip(data["steps"], anthropic.usages):
        usage = step["usage"]
        assert usage["cached_tokens"] == sent["cache_read_input_tokens"]
        assert usage["prompt_tokens"] == sent["input_tokens"] + sent["cache_read_input_tokens"] + sent["cache_creation_input_tokens"]
        expected = (sent["input_tokens"] * prices["input_cost_per_token"]
                    + sent["cache_read_input_tokens"] * prices["cache_read_input_token_cost"]
                    + sent["cache_creation_input_tokens"] * prices["cache_creation_input_token_cost"]
                    + sent["output_tokens"] * prices["output_cost_per_token"])
        assert usage["cost"] == pytest.approx(expected, rel=1e-6)
        total += expected
    assert anthropic.usages[1]["cache_read_input_tokens"] > 0 and anthropic.usages[2]["cache_read_input_tokens"] > 0
    assert data["usage"]["cached_tokens"] > 0 and data["usage"]["cost"] == pytest.approx(total, rel=1e-6)
    assert "warning" not in result.stderr.lower(), result.stderr


@needs_litellm
def test_retry_after_a_key_echoed_back_and_the_debug_log_never_show_the_key(cli, anthropic, tmp_path):
    log = tmp_path / "debug.log"
    anthropic.push({"status": 429, "retry_after": 1.5, "message": f"slow down, {KEY}"},
                   act("echo key-is-${#ANTHROPIC_API_KEY}-chars"),
                   {"status": 401, "message": f"invalid x-api-key: {KEY}"})
    result = cli("run", "x", *litellm_args(anthropic), "-o", "t.json", "-c", "model.max_backoff=0.05",
                 env={"ANTHROPIC_API_KEY": KEY, "MINISWE_DEBUG": str(log)}, timeout=180)
    assert result.returncode == 3, result.stderr
    first, second, third = anthropic.requests
    assert second["received"] - first["received"] >= 1.5, "retried before Retry-After elapsed"
    assert "429" in result.stderr and "retry 1 of 10 in 1.5s" in result.stderr
    data = traj(tmp_path)
    assert data["usage"]["retries"] == 1 and data["exit_status"] == "ModelError"
    assert data["steps"][0]["output"] == "key-is-0-chars\n", "commands never see the key"
    assert "answered 401" in result.stderr and "set ANTHROPIC_API_KEY to a valid API key" in result.stderr
    assert third["headers"]["x-api-key"] == KEY, "the key itself is still sent"
    debug = log.read_text()
    assert f"call 1 request {ROUTE} at {anthropic.api_base}" in debug and "call 1 failure" in debug
    assert "call 2 response" in debug and "429" in debug and "401" in debug
    for text in (result.stdout, result.stderr, (tmp_path / "t.json").read_text(), debug):
        assert KEY not in text


@needs_litellm
def test_tool_calls_stream_and_tool_results_carry_the_cache_marks(cli, anthropic, tmp_path):
    anthropic.push(calls(call("bash", command="echo from-a-tool"), content="let me look"), {**TOOL_SUBMIT, "reasoning": "done"})
    result = cli("run", "x", *litellm_args(anthropic, "-c", "protocol.kind=tools", "-c", "model.stream=true"),
                 "-o", "t.json", env={"ANTHROPIC_API_KEY": KEY}, timeout=180)
    assert result.returncode == 0, result.stderr
    data = traj(tmp_path)
    assert data["submission"] == "the patch" and data["steps"][0]["output"].endswith("from-a-tool\n")
    assert data["steps"][1]["reasoning"] == "done"
    marks = marked_blocks(anthropic.requests[1]["body"])
    assert [block["type"] for _, block in marks] == ["text", "tool_result"]


@needs_litellm
def test_ctrl_c_cuts_a_call_in_flight(anthropic, tmp_path):
    anthropic.push(act("echo first"), {"content": SUBMIT, "stall": 60})
    proc = subprocess.Popen(miniswe_cmd("run", "x", *litellm_args(anthropic), "-o", "t.json"), cwd=tmp_path,
                            env=clean_env(ANTHROPIC_API_KEY=KEY), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: len(anthropic.requests) == 2, "the second call", timeout=120)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 130 and time.monotonic() - signalled < 5, err
    data = traj(tmp_path)
    assert data["exit_status"] == "Interrupted" and len(data["steps"]) == 1


# -- any OpenAI-compatible server through litellm's openai/ route ------------------------------------------------

@needs_litellm
def test_the_openai_route_runs_against_the_scripted_server_with_configured_prices(cli, server, tmp_path):
    server.push(act("echo via-openai-route"), SUBMIT)
    result = cli("run", "x", "-c", "model.kind=litellm", "-c", "model.name=openai/test-model",
                 "-c", f"model.api_base={server.base_url}", "-c", "model.prices={prompt: 2, completion: 10}",
                 "-o", "t.json", env={"OPENAI_API_KEY": KEY}, timeout=180)
    assert result.returncode == 0, result.stderr
    data = traj(tmp_path)
    assert data["exit_status"] == "Submitted" and data["steps"][0]["output"] == "via-openai-route\n"
    body = server.requests[0]["body"]
    assert body["model"] == "test-model" and server.requests[0]["headers"]["authorization"] == f"Bearer {KEY}"
    assert all(isinstance(m["content"], str) for m in body["messages"]), "no cache marks for an openai route (auto)"
    assert len(server.requests) == 2, "litellm's and the OpenAI SDK's own retries are off"
    for step in data["steps"]:
        usage = step["usage"]
        assert usage["cost"] == pytest.approx((usage["prompt_tokens"] * 2 + usage["completion_tokens"] * 10) / 1e6)


# -- the model itself: errors, deadlines, stops, streams ---------------------------------------------------------

@needs_litellm
def test_a_prompt_too_long_is_a_context_length_refusal(anthropic, monkeypatch):
    from miniswe.errors import ContextLengthError

    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    anthropic.push({"status": 400, "message": f"prompt is too long: 208000 tokens > 200000 maximum ({KEY})"})
    with pytest.raises(ContextLengthError) as refused:
        model(anthropic).complete(MESSAGES)
    assert refused.value.window == 200000 and refused.value.prompt_tokens == 208000
    assert "prompt is too long" in str(refused.value) and KEY not in str(refused.value)
    assert len(anthropic.requests) == 1, "a refusal for length is not retried"


@needs_litellm
def test_http_errors_are_retried_or_refused_as_the_openai_kind_does(anthropic, monkeypatch):
    from miniswe.errors import ModelError

    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    retries = []
    anthropic.push({"status": 529}, {"status": 500}, "fine")
    reply = model(anthropic, on_retry=retries.append).complete(MESSAGES)
    assert reply.content == "fine" and len(retries) == 2 and "answered 500" in retries[0]
    anthropic.push({"status": 404, "message": "model: claude-nope"})
    with pytest.raises(ModelError, match=r"answered 404: model: claude-nope; check model.name"):
        model(anthropic).complete(MESSAGES)
    anthropic.push(*[{"status": 503}] * 3)
    with pytest.raises(ModelError, match=r"gave up after 3 attempts"):
        model(anthropic, retries=2).complete(MESSAGES)


@needs_litellm
def test_the_run_deadline_and_the_call_timeout_bound_a_call_as_a_whole(anthropic, monkeypatch):
    from miniswe.errors import DeadlineReached

    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    anthropic.push({"content": "late", "stall": 30})
    slow = model(anthropic)  # built first: the first one imports litellm, which takes seconds
    started = time.monotonic()
    with pytest.raises(DeadlineReached):
        slow.complete(MESSAGES, deadline=started + 1)
    assert time.monotonic() - started < 3
    retries = []
    anthropic.push({"content": "late", "stall": 30}, "in time")
    reply = model(anthropic, timeout=2, retries=1, on_retry=retries.append).complete(MESSAGES)
    assert reply.content == "in time" and len(retries) == 1 and "no complete answer within 2s" in retries[0]


@needs_litellm
def test_an_urgent_stop_cuts_a_call_at_once(anthropic, monkeypatch):
    from miniswe.errors import Cancelled
    from miniswe.signals import Stop
    from miniswe.status import interrupted

    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    anthropic.push({"content": "never", "stall": 30})
    stop = Stop()
    stopped = model(anthropic, stop=stop)
    threading.Timer(0.5, lambda: stop.request(interrupted("SIGINT"), urgent=True)).start()
    started = time.monotonic()
    with pytest.raises(Cancelled):
        stopped.complete(MESSAGES)
    assert 0.4 < time.monotonic() - started < 2.5 and len(anthropic.requests) == 1


@needs_litellm
def test_a_stream_is_handed_out_piece_by_piece_and_a_quiet_one_is_cut_and_retried(anthropic, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    text = act("ls -la")
    deltas, retries = [], []
    streaming = model(anthropic, stream=True, stream_idle_timeout=1, on_retry=retries.append,
                      on_delta=lambda kind, piece: deltas.append((kind, piece)))
    anthropic.push({"content": text, "reasoning": "the files"})
    whole = streaming.complete(MESSAGES)
    assert whole.content == text and whole.reasoning == "the files" and whole.finish_reason == "stop"
    assert deltas[0] == ("reasoning", "the f") and len(deltas) > 5, "handed out piece by piece, reasoning first"
    assert "".join(piece for kind, piece in deltas if kind == "content") == text and not retries
    assert anthropic.requests[0]["body"]["stream"] is True
    assert whole.usage.prompt_tokens > 0 and whole.usage.cost > 0
    deltas.clear()
    anthropic.push({"content": text, "reasoning": "the files", "stall_after": 4, "stall": 30},
                   {"content": text, "reasoning": "the files"})
    reply = streaming.complete(MESSAGES)
    assert len(retries) == 1 and "the stream sent nothing for 1s" in retries[0]
    assert (reply.content, reply.reasoning, reply.finish_reason) == (whole.content, whole.reasoning, whole.finish_reason)
    assert reply.usage.cached_tokens > 0 and len(anthropic.requests) == 3  # the same prompt: read from the cache
    # the cut stream's pieces came first; the retried one's follow, whole
    assert "".join(piece for kind, piece in deltas if kind == "content").endswith(text)


# -- the route's credentials, the garbage collector, abandoned streams -------------------------------------------

@needs_litellm
def test_every_route_names_its_credentials_as_litellm_does(monkeypatch):
    from miniswe.config import load_config
    from miniswe.models.common import secret_env
    from miniswe.models.litellm import route_variables

    def configured(name: str, *extra: str):
        return load_config("model.kind=litellm", f"model.name={name}", *extra).model

    keys = {ROUTE: "ANTHROPIC_API_KEY", "gemini/gemini-2.5-pro": "GEMINI_API_KEY", "azure_ai/x": "AZURE_AI_API_KEY",
            "hosted_vllm/x": "HOSTED_VLLM_API_KEY", "huggingface/x": "HUGGINGFACE_API_KEY", "cerebras/x": "CEREBRAS_API_KEY",
            "perplexity/x": "PERPLEXITYAI_API_KEY", "nvidia_nim/x": "NVIDIA_NIM_API_KEY", "azure/x": "AZURE_API_KEY",
            "together_ai/x": "TOGETHERAI_API_KEY", "openai/x": "OPENAI_API_KEY",
            "bedrock/anthropic.claude-v2": "", "vertex_ai/gemini-2.5-pro": ""}  # no one key: several variables
    assert {name: configured(name).api_key_env for name in keys} == keys
    assert {"ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"} <= set(secret_env(configured(ROUTE)))
    assert {"GEMINI_API_KEY", "GOOGLE_API_KEY"} <= set(secret_env(configured("gemini/gemini-2.5-pro")))
    bedrock = secret_env(configured("bedrock/anthropic.claude-v2"))
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"} <= set(bedrock)
    assert "AWS_PROFILE" not in bedrock and "AWS_ROLE_ARN" not in bedrock, "names, not secrets"
    vertex = secret_env(configured("vertex_ai/gemini-2.5-pro"))
    assert "GOOGLE_APPLICATION_CREDENTIALS" in vertex and "VERTEXAI_PROJECT" not in vertex
    assert secret_env(configured("openrouter/x", "model.api_key_env=MY_KEY"))[:2] == ["MY_KEY", "OPENROUTER_API_KEY"]
    # whichever are set: litellm's check is asked as if none were
    before = route_variables("bedrock/anthropic.claude-v2")
    route_variables.cache_clear()
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "ANTHROPIC_API_KEY"):
        monkeypatch.setenv(name, "planted-value-123")
    assert route_variables("bedrock/anthropic.claude-v2") == before and route_variables(ROUTE)[0] == "ANTHROPIC_API_KEY"


@needs_litellm
def test_a_route_litellm_does_not_check_still_keeps_its_key_from_commands_and_records(cli, server, tmp_path):
    # hosted_vllm/ (an OpenAI-compatible server) is one of the routes litellm's check names nothing for
    server.push(act("echo key-is-${#HOSTED_VLLM_API_KEY}-chars"), {"status": 401, "body": {"error": {"message": f"bad key {KEY}"}}})
    result = cli("run", "x", "-c", "model.kind=litellm", "-c", "model.name=hosted_vllm/test-model",
                 "-c", f"model.api_base={server.base_url}", "-o", "t.json", env={"HOSTED_VLLM_API_KEY": KEY}, timeout=180)
    assert result.returncode == 3, result.stderr
    data = traj(tmp_path)
    assert data["config"]["model"]["api_key_env"] == "HOSTED_VLLM_API_KEY"
    assert data["steps"][0]["output"] == "key-is-0-chars\n", "commands never see the key"
    assert server.requests[0]["headers"]["authorization"] == f"Bearer {KEY}", "the key itself is still sent"
    assert "set HOSTED_VLLM_API_KEY to a valid API key" in result.stderr
    for text in (result.stdout, result.stderr, (tmp_path / "t.json").read_text()):
        assert KEY not in text


@needs_litellm
def test_building_models_again_leaves_the_garbage_collector_alone(anthropic):
    import gc
    import weakref

    from miniswe.signals import Stop

    model(anthropic)  # the first imports litellm, whose tables are frozen once
    cycle: dict = {}
    cycle["self"] = cycle
    holder = type("Holder", (), {})()
    holder.cycle = cycle
    alive = weakref.ref(holder)
    cycle["holder"] = holder
    model(anthropic).for_child(stop=Stop())  # each sub-agent's and each batch task's model is built so
    del cycle, holder
    gc.collect()
    assert alive() is None, "a cycle alive while a model was built was frozen for good"


@needs_litellm
def test_an_abandoned_stream_is_hung_up_on_at_once(anthropic, monkeypatch):
    from miniswe.errors import Cancelled
    from miniswe.signals import Stop
    from miniswe.status import interrupted

    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    anthropic.push({"content": act("ls -la"), "stall_after": 4, "stall": 60})
    stop = Stop()
    unbounded = model(anthropic, stream=True, timeout=0, stream_idle_timeout=0, stop=stop)  # nothing bounds its reads
    before, workers = set(threading.enumerate()), []

    def interrupt() -> None:  # the call's worker, reading the stream now, noted first
        workers.extend(t for t in threading.enumerate() if t.name == "miniswe-litellm-call" and t not in before)
        stop.request(interrupted("SIGINT"), urgent=True)

    threading.Timer(1.5, interrupt).start()
    with pytest.raises(Cancelled):
        unbounded.complete(MESSAGES)
    assert len(workers) == 1 and len(anthropic.requests) == 1
    wait_for(lambda: not workers[0].is_alive(), "the abandoned worker to end", timeout=5)
