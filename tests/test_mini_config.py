"""mini-swe-agent's config files run unchanged (`-c mini.yaml`): recognised by their shape, mapped to miniswe's
settings, what cannot be mapped named in one line; and the model is sent what mini-swe-agent sends it.

The comparison runs every config the released packages ship (2.4.6, and 1.17.5 for 1.x's shape) twice on the same
scripted replies: miniswe against the scripted OpenAI server, and mini-swe-agent's own DefaultAgent and
LocalEnvironment (tests/mini_reference.py); the conversations must be equal, message by message. The wheels come
from PyPI once (tests/mini_release.py); without PyPI those tests skip unless MINISWE_REQUIRE_MINI=1.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import clean_env, miniswe_cmd
from miniswe.config import load_config
from miniswe.errors import ConfigError
from miniswe.mini_config import MINI_AGENT_KIND, MINI_BASH_TOOL, is_mini_config, translate
from mini_release import WHEELS, mini_release, run_reference, shipped_configs
from openai_server import ScriptedServer

ROOT = Path(__file__).resolve().parent.parent
V2, V1 = "2.4.6", "1.17.5"
# What each release ships (checked against the wheel below), with the overlay a config is meant to go on top of.
SHIPPED = {
    V2: ["default.yaml", "mini.yaml", "mini_textbased.yaml", "benchmarks/programbench.yaml", "benchmarks/swebench.yaml",
         "benchmarks/swebench_backticks.yaml", "benchmarks/swebench_modal.yaml", "benchmarks/swebench_xml.yaml"],
    V1: ["default.yaml", "github_issue.yaml", "mini.yaml", "extra/swebench.yaml", "extra/swebench_roulette.yaml",
         "extra/swebench_xml.yaml"],
}
OVERLAYS = {"benchmarks/swebench_modal.yaml": "benchmarks/swebench.yaml"}  # `-c swebench -c swebench_modal`
TASK = "Fix the bug in calc.py"
MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def release_file(version: str, name: str) -> Path:
    return mini_release(version) / "minisweagent" / "config" / name


def write_yaml(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    return path


# -- recognising and mapping (no download) -----------------------------------------------------------------------
MINI_V2 = {
    "agent": {"system_template": "You run on {{system}}.", "instance_template": "Task: {{task}}", "step_limit": 40,
              "cost_limit": 2.5, "wall_time_limit_seconds": 600, "max_consecutive_format_errors": 5, "mode": "confirm"},
    "environment": {"environment_class": "docker", "image": "python:3.12", "cwd": "/testbed", "timeout": 45,
                    "env": {"PAGER": "cat"}, "interpreter": ["bash", "-c"], "container_timeout": "2h",
                    "run_args": ["--rm", "--network", "none"]},
    "model": {"model_name": "openrouter/some-model", "model_class": "openrouter",
              "model_kwargs": {"temperature": 0.3, "max_tokens": 900, "drop_params": True},
              "observation_template": "<returncode>{{output.returncode}}</returncode>"},
}


def test_a_mini_swe_agent_config_is_recognised_by_its_shape_and_miniswes_are_not():
    assert is_mini_config(MINI_V2)
    assert is_mini_config({"model": {"model_name": "x"}}) and is_mini_config({"environment": {"environment_class": "local"}})
    assert is_mini_config({"agent": {"action_observation_template": "Observation: {{output}}"}})  # 1.x
    ours = yaml.safe_load((ROOT / "config" / "default.yaml").read_text())
    assert not is_mini_config(ours)
    assert not is_mini_config({"agent": {"step_limit": 3}, "model": {"name": "m"}})
    # a miniswe file that names a kind is miniswe's, whatever else it holds
    assert not is_mini_config({"agent": {"kind": MINI_AGENT_KIND, "mini": {}}})


def test_its_settings_map_to_miniswes_and_what_cannot_is_named():
    config, unused = translate(MINI_V2, "m.yaml")
    agent, env, model = config["agent"], config["environment"], config["model"]
    assert agent["kind"] == MINI_AGENT_KIND and agent["mini"]["agent"]["system_template"] == "You run on {{system}}."
    assert (agent["step_limit"], agent["cost_limit"], agent["time_limit"], agent["max_format_errors"]) == (40, 2.5, 600.0, 5)
    # miniswe's own additions to what the model sees are off: it sees what mini-swe-agent would show
    assert (agent["output_limit"], agent["max_repeats"], agent["budget_warning"]) == (0, 0, 0.0)
    assert env == {"kind": "docker", "timeout": 45.0, "capture_limit": 0, "cwd": "/testbed", "env": {"PAGER": "cat"},
                   "image": "python:3.12", "run_args": ["--network", "none"], "container_lifetime": 7200.0}
    assert model == {"kind": "openai", "base_url": "https://openrouter.ai/api/v1", "api_key_env": "OPENROUTER_API_KEY",
                     "name": "openrouter/some-model", "temperature": 0.3, "params": {"max_tokens": 900}}
    assert config["protocol"] == {"kind": "tools", "submit_marker": MARKER}
    assert "agent.mode confirm (interactive confirm mode: use miniswe chat)" in unused
    assert any(item.startswith("model.model_kwargs.drop_params") for item in unused)


def test_the_protocol_follows_the_model_class_mini_swe_agent_would_use():
    text = {"agent": {"system_template": "s", "instance_template": "i"}, "model": {"model_class": "litellm_textbased"}}
    assert translate(text)[0]["protocol"]["kind"] == "text"
    tools = {"agent": {"system_template": "s", "instance_template": "i"}, "model": {"model_name": "m"}}
    assert translate(tools)[0]["protocol"]["kind"] == "tools"
    # 2.x calls tools without a text-based class; a config whose prompts ask for blocks is read as text, and says so
    asks = {"agent": {"system_template": "```mswea_bash_command\nls\n```", "instance_template": "i"}, "model": {"model_name": "m"}}
    config, unused = translate(asks)
    assert config["protocol"]["kind"] == "text" and any("model_class not set" in item for item in unused)
    # a file that names only a model leaves the protocol to the config before it
    assert "protocol" not in translate({"model": {"model_name": "gpt-4o"}})[0]
    v1 = {"agent": {"action_observation_template": "Observation: {{output}}", "action_regex": "<b>(.*?)</b>"}}
    assert translate(v1)[0]["protocol"] == {"kind": "text", "submit_marker": MARKER}
    assert translate({"agent": {"timeout_template": "t", "instance_template": "echo MINI_SWE_AGENT_FINAL_OUTPUT"}})[0][
        "protocol"]["submit_marker"] == "MINI_SWE_AGENT_FINAL_OUTPUT"


def test_later_sources_override_it_and_its_notice_is_one_line(tmp_path, capfd):
    path = write_yaml(tmp_path / "mini-config.yaml", MINI_V2)
    config = load_config(str(path), "agent.step_limit=7", "environment.timeout=5")
    assert (config.agent.kind, config.agent.step_limit, config.environment.timeout) == (MINI_AGENT_KIND, 7, 5.0)
    assert config.agent.cost_limit == 2.5 and config.protocol.kind == "tools"
    err = capfd.readouterr().err
    lines = [line for line in err.splitlines() if "mini-config.yaml" in line]
    assert len(lines) == 1 and lines[0].startswith(f"miniswe: {path}: mini-swe-agent config: not used: agent.mode confirm")


def test_a_date_in_a_section_miniswe_does_not_use_is_no_error(tmp_path):
    # mini-swe-agent configs carry sections miniswe leaves out; what YAML reads in them is not miniswe's concern
    import datetime

    path = write_yaml(tmp_path / "dated.yaml", {**MINI_V2, "run": {"created": datetime.date(2024, 5, 1)}})
    assert "created: 2024-05-01" in path.read_text()
    assert load_config(str(path)).agent.kind == MINI_AGENT_KIND


@pytest.mark.parametrize(("data", "message"), [
    ({"agent": {"system_template": "{% if x %}", "instance_template": "i"}},
     "m.yaml: agent.system_template: template syntax error at line 1: Unexpected end of template"),
    ({"model": {"observation_template": 5, "model_name": "m"}}, "m.yaml: model.observation_template: expected a template"),
    ({"environment": {"environment_class": "my.pkg.FancyEnvironment"}},
     "m.yaml: environment.environment_class: my.pkg.FancyEnvironment is a class miniswe cannot run"),
    ({"agent": {"system_template": "s", "instance_template": "i", "step_limit": 2.5}},
     "m.yaml: agent.step_limit: expected a whole number, got 2.5"),
    ({"environment": {"environment_class": "local", "timeout": 5}},
     "m.yaml: agent.mini: agent.system_template is missing: a mini-swe-agent config's prompts come from a file"),
], ids=["syntax", "not-text", "environment", "step-limit", "no-prompts"])
def test_what_it_cannot_run_is_refused_in_one_line(tmp_path, data, message):
    path = write_yaml(tmp_path / "m.yaml", data)
    with pytest.raises(ConfigError) as error:
        load_config(str(path))
    text = str(error.value)
    assert text.startswith(message.replace("m.yaml", str(path))) and "\n" not in text


def test_the_recorded_config_keeps_the_mini_config_with_its_secrets_masked(tmp_path):
    from miniswe.redaction import masked_config

    data = copy.deepcopy(MINI_V2)
    data["model"]["model_kwargs"]["api_key"] = "sk-mini-secret-0123456789"
    data["environment"]["env"]["GITHUB_TOKEN"] = "ghp_" + "y" * 30
    config, unused = translate(data, "m.yaml")
    assert "sk-mini-secret" not in json.dumps(config["model"]) and any("model_kwargs.api_key" in item for item in unused)
    recorded = json.dumps(masked_config(load_config(str(write_yaml(tmp_path / "m.yaml", data))).to_dict()))
    assert "sk-mini-secret" not in recorded and "ghp_" + "y" * 30 not in recorded


# -- the shipped configs against mini-swe-agent's own rendering ----------------------------------------------------
@pytest.mark.parametrize("version", [V2, V1])
def test_the_list_of_shipped_configs_is_the_releases(version):
    root = mini_release(version) / "minisweagent" / "config"
    assert [str(path.relative_to(root)) for path in shipped_configs(version)] == sorted(SHIPPED[version], key=lambda n: ("/" in n, n))


@pytest.mark.parametrize(("version", "name"), [(v, n) for v in (V2, V1) for n in SHIPPED[v]])
def test_every_shipped_config_loads_with_one_line_of_what_is_not_used(tmp_path, version, name, capfd):
    sources = [str(release_file(version, OVERLAYS[name]))] if name in OVERLAYS else []
    config = load_config(*sources, str(release_file(version, name)))
    assert config.agent.kind == MINI_AGENT_KIND and config.agent.mini["agent"]["instance_template"]
    lines = [line for line in capfd.readouterr().err.splitlines() if line.startswith(f"miniswe: {release_file(version, name)}:")]
    assert len(lines) <= 1


def action_block(regex: str, command: str) -> str:
    """A block the config's action regex reads as one action: ```tag fences, or <tag>...</tag>."""
    if regex.startswith("```"):
        tag = re.match(r"```(\w+)", regex)[1]
        return f"```{tag}\n{command}\n```"
    tag = re.match(r"<(\w+)>", regex)[1]
    return f"<{tag}>{command}</{tag}>"


def script(mode: str, regex: str) -> list:
    """One conversation for every config: a command with stdout, stderr and a return code; a malformed reply; an
    output over mini-swe-agent's 10,000 characters; another malformed reply; a command that times out; the
    submission. Tool calls: two calls in one reply, a reply with no call, a call to an unknown tool."""
    if mode == "text":
        return [
            f"THOUGHT: look first.\n\n{action_block(regex, 'printf hello; echo err >&2; exit 3')}",
            f"Two at once.\n\n{action_block(regex, 'ls')}\n\n{action_block(regex, 'pwd')}",
            f"THOUGHT: long.\n\n{action_block(regex, 'seq 1 3000')}",
            "I forgot the command.",
            f"THOUGHT: slow.\n\n{action_block(regex, 'sleep 3')}",
            f"THOUGHT: done.\n\n{action_block(regex, f'echo {MARKER} && printf the-patch')}",
        ]
    call = lambda id_, command, name="bash", **arguments: {"id": id_, "name": name, "arguments": arguments or {"command": command}}  # noqa: E731
    return [
        {"content": "Look first.", "tool_calls": [call("call_a", "printf hello; echo err >&2; exit 3")]},
        {"content": "Nothing to call."},
        {"content": "Two.", "tool_calls": [call("call_b", "seq 1 3000"), call("call_c", "echo second")]},
        {"content": "Wrong tool.", "tool_calls": [call("call_d", None, name="python", code="1")]},
        {"content": "Slow.", "tool_calls": [call("call_e", "sleep 3")]},
        {"content": "Done.", "tool_calls": [call("call_f", f"echo {MARKER} && printf the-patch")]},
    ]


def local_copy(data: dict, cwd: Path, **agent: int) -> dict:
    """The config to run here: its environment made local in `cwd` with a 1 s timeout (the rest unchanged; BASH_ENV,
    which names the image's own bashrc, left out), and a model name where it gives none (mini-swe-agent needs one)."""
    data = copy.deepcopy(data)
    env = {k: v for k, v in ((data.get("environment") or {}).get("env") or {}).items() if k != "BASH_ENV"}
    data["environment"] = {"environment_class": "local", "cwd": str(cwd), "env": env, "timeout": 1}
    data.setdefault("model", {}).setdefault("model_name", "test-model")
    data.setdefault("agent", {}).update(agent)
    return data


def merged(*files: Path) -> dict:
    from miniswe.mini_agent import recursive_merge

    return recursive_merge(*(yaml.safe_load(path.read_text()) for path in files))


def comparable(message: dict) -> dict:
    found = {"role": message["role"], "content": message.get("content") or ""}
    if message.get("tool_call_id"):
        found["tool_call_id"] = message["tool_call_id"]
    if message.get("tool_calls"):
        found["tool_calls"] = [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]]
    return found


CASES = [(v, n, {}) for v in (V2, V1) for n in SHIPPED[v]] + [
    # programbench's observation template counts the steps left when fewer than 20 remain: with 24, from the fifth call
    (V2, "benchmarks/programbench.yaml", {"step_limit": 24}),
]


@pytest.mark.parametrize(("version", "name", "agent"), CASES,
                         ids=[f"{v}-{n}{'-' + '-'.join(f'{k}{x}' for k, x in a.items()) if a else ''}" for v, n, a in CASES])
def test_the_model_is_sent_what_mini_swe_agent_sends(tmp_path, version, name, agent):
    files = [release_file(version, OVERLAYS[name])] if name in OVERLAYS else []
    files.append(release_file(version, name))
    work = tmp_path / "work"
    work.mkdir()
    data = local_copy(merged(*files), work, **agent)
    path = write_yaml(tmp_path / Path(name).name, data)
    config = load_config(str(path), "model.kind=openai")
    mode = config.protocol.kind
    regex = config.agent.mini.get("model", {}).get("action_regex") if version == V2 else config.agent.mini["agent"].get("action_regex")
    replies = script(mode, regex or (r"```mswea_bash_command\s*\n(.*?)\n```" if version == V2 else r"```bash\s*\n(.*?)\n```"))

    reference = run_reference(version, path, TASK, replies, mode=mode, cwd=work, out=tmp_path / "mini.json", env=clean_env())
    with ScriptedServer(replies) as server:
        done = subprocess.run(miniswe_cmd("run", TASK, "-c", str(path), "-c", "model.kind=openai", "-c", "model.retries=0",
                                          "--base-url", server.base_url, "-o", str(tmp_path / "t.json")),
                              cwd=work, env=clean_env(), capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        requests = server.requests
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(requests) == len(replies)
    sent = [comparable(m) for m in requests[-1]["body"]["messages"]]
    expected = [comparable(m) for m in reference["messages"]]
    assert expected[len(sent)]["role"] == "assistant" and MARKER in json.dumps(expected[len(sent)]), "then the submission"
    for index, (ours, theirs) in enumerate(zip(sent, expected, strict=False)):
        assert ours == theirs, f"message {index} ({theirs['role']}) differs"
    assert len(sent) == len(expected) - 2  # mini-swe-agent's last two: the submitting reply, and its exit (1.x: the submission)
    roles = [m["role"] for m in sent]
    assert roles[:2] == ["system", "user"] and roles.count("assistant") == len(replies) - 1 - 2 * (version == V2)
    if mode == "tools":
        assert all(r["body"]["tools"] == reference["tools"] == [MINI_BASH_TOOL] for r in requests)
    else:
        assert all("tools" not in r["body"] for r in requests)
    contents = [m["content"] for m in sent]
    assert any("elided" in c for c in contents), "the long output took the template's elided branch"
    assert any("timed out" in c for c in contents), "the timeout was told as mini-swe-agent tells it"
    if agent:
        assert any("steps away from reaching your limit" in c for c in contents)


def test_wheels_are_pinned():
    assert set(WHEELS) == {V2, V1}


SHARED_EXTRA = ("actions", "cost", "raw_output", "returncode", "exception_info", "exception_type", "exception",
                "interrupt_type", "model_response", "n_actions", "exit_status", "submission")


@pytest.mark.parametrize(("name", "mode"), [("mini_textbased.yaml", "text"), ("mini.yaml", "tools")])
def test_a_run_of_its_config_exports_as_mini_swe_agent_writes_its_own(tmp_path, name, mode):
    """The same replies through miniswe (then `export`) and through mini-swe-agent 2.4.6 (its own trajectory file):
    the same messages, with the same `extra` fields, and the same end."""
    from miniswe.mini_swe_agent import export

    work = tmp_path / "work"
    work.mkdir()
    data = local_copy(yaml.safe_load(release_file(V2, name).read_text()), work)
    if mode == "text":
        data["model"]["model_class"] = "litellm_textbased"
    path = write_yaml(tmp_path / name, data)
    replies = script(mode, r"```mswea_bash_command\s*\n(.*?)\n```")
    theirs_path = tmp_path / "theirs.traj.json"
    run_reference(V2, path, TASK, replies, mode=mode, cwd=work, out=tmp_path / "mini.json", env=clean_env(),
                  trajectory=theirs_path)
    with ScriptedServer(replies) as server:
        done = subprocess.run(miniswe_cmd("run", TASK, "-c", str(path), "-c", "model.kind=openai", "-c", "model.retries=0",
                                          "--base-url", server.base_url, "-o", str(tmp_path / "ours.traj.json")),
                              cwd=work, env=clean_env(), capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = json.loads(theirs_path.read_text())
    ours = json.loads(Path(export(str(tmp_path / "ours.traj.json"))).read_text())
    assert ours["trajectory_format"] == theirs["trajectory_format"]
    for key in ("exit_status", "submission"):
        assert ours["info"][key] == theirs["info"][key]
    assert ours["info"]["model_stats"]["api_calls"] == theirs["info"]["model_stats"]["api_calls"] == len(replies)
    assert [m["role"] for m in ours["messages"]] == [m["role"] for m in theirs["messages"]]
    for index, (mine, reference) in enumerate(zip(ours["messages"], theirs["messages"])):
        where = f"message {index} ({reference['role']})"
        assert comparable(mine) == comparable(reference), where
        extra, expected = mine.get("extra") or {}, reference.get("extra") or {}
        assert {key: extra.get(key) for key in SHARED_EXTRA if key in expected} == \
               {key: expected[key] for key in SHARED_EXTRA if key in expected}, where
        assert set(expected) - {"response"} <= set(extra), f"{where}: {sorted(set(expected) - set(extra))} missing"


def test_the_model_settings_a_mini_config_may_set_are_the_kinds_own():
    # mini_config sits below config.py and names them; each must be a setting of that model kind
    from miniswe.config import settings_class
    from miniswe.mini_config import MODEL_FIELDS

    for kind, names in MODEL_FIELDS.items():
        assert names <= set(settings_class("model", kind).model_fields), kind
