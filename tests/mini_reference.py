"""Run mini-swe-agent's own agent on a config, with a scripted model, and write the messages it built: the reference
the mini-swe-agent config tests compare miniswe's requests with (tests/test_mini_config.py).

    python tests/mini_reference.py --package DIR --config YAML --task TEXT --replies JSON --mode text|tools
                                   --cwd DIR --out MESSAGES.json [--trajectory OUT.traj.json]

DIR holds an unpacked mini-swe-agent wheel (tests/mini_release.py). Its DefaultAgent runs with its LocalEnvironment
(the config's environment section) and a model that answers from the replies, the items the scripted OpenAI
server serves (a string, or {content, tool_calls: [{id, name, arguments}], finish_reason}); the model reads each
reply with mini-swe-agent's own parse_regex_actions / parse_toolcall_actions and formats observations with its
own format_observation_messages, so every message is mini-swe-agent's rendering. Only the model's settings as
template variables are written out here (its config classes import litellm).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

V2_OBSERVATION = ("{% if output.exception_info %}<exception>{{output.exception_info}}</exception>\n{% endif %}"
                  "<returncode>{{output.returncode}}</returncode>\n<output>\n{{output.output}}</output>")
V2_TEXT_REGEX = r"```mswea_bash_command\s*\n(.*?)\n```"
V2_TEXT_FORMAT_ERROR = "Please always provide EXACTLY ONE action in triple backticks, found {{actions|length}} actions."


def _stub(name: str, **attributes: Any) -> None:
    """A module mini-swe-agent imports at start-up but these runs never use (its .env file, its config folder)."""
    try:
        __import__(name)
    except ImportError:
        module = types.ModuleType(name)
        module.__dict__.update(attributes)
        sys.modules[name] = module


def _items(path: str) -> list[dict[str, Any]]:
    return [item if isinstance(item, dict) else {"content": item} for item in json.loads(Path(path).read_text())]


def _calls(item: dict[str, Any], number: int) -> list[dict[str, Any]]:
    """The tool calls of a reply as the scripted server sends them (ids call_<request>_<n> unless given)."""
    calls = []
    for index, call in enumerate(item.get("tool_calls") or [], 1):
        arguments = call.get("arguments", {})
        calls.append({"id": call.get("id") or f"call_{number}_{index}", "type": "function",
                      "function": {"name": call["name"],
                                   "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)}})
    return calls


def run_v2(config: dict[str, Any], replies: list[dict[str, Any]], task: str, textbased: bool, cwd: str,
           trajectory: str | None) -> list[dict[str, Any]]:
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.environments.local import LocalEnvironment
    from minisweagent.exceptions import FormatError
    from minisweagent.models.utils.actions_text import format_observation_messages, parse_regex_actions
    from minisweagent.models.utils.actions_toolcall import format_toolcall_observation_messages, parse_toolcall_actions
    from minisweagent.models.utils.openai_multimodal import expand_multimodal_content

    section = config.get("model") or {}
    settings = {  # LitellmModelConfig's (and LitellmTextbasedModelConfig's) fields, as model_dump gives them
        "model_name": section["model_name"], "model_kwargs": section.get("model_kwargs") or {},
        "litellm_model_registry": section.get("litellm_model_registry", os.getenv("LITELLM_MODEL_REGISTRY_PATH")),
        "set_cache_control": section.get("set_cache_control"),
        "cost_tracking": section.get("cost_tracking", os.getenv("MSWEA_COST_TRACKING", "default")),
        "format_error_template": section.get("format_error_template",
                                             V2_TEXT_FORMAT_ERROR if textbased else "{{ error }}"),
        "observation_template": section.get("observation_template", V2_OBSERVATION),
        "multimodal_regex": section.get("multimodal_regex", ""),
    }
    if textbased:
        settings["action_regex"] = section.get("action_regex", V2_TEXT_REGEX)
    if settings["set_cache_control"] is None and any(w in settings["model_name"].lower() for w in ("anthropic", "sonnet", "opus", "claude")):
        settings["set_cache_control"] = "default_end"  # as get_model picks it

    class ScriptedModel:
        def __init__(self) -> None:
            self.replies, self.calls = list(replies), 0
            self.config = types.SimpleNamespace(**settings)

        def query(self, messages: list[dict[str, Any]], **kwargs: Any) -> dict[str, Any]:
            self.calls += 1
            item = self.replies.pop(0)
            content, calls = item.get("content"), _calls(item, self.calls)
            finish = item.get("finish_reason", "tool_calls" if calls else "stop")
            try:
                if textbased:
                    actions = parse_regex_actions(content or "", action_regex=settings["action_regex"],
                                                  format_error_template=settings["format_error_template"],
                                                  template_kwargs={"finish_reason": finish})
                else:
                    objects = [types.SimpleNamespace(id=c["id"], function=types.SimpleNamespace(**c["function"])) for c in calls]
                    actions = parse_toolcall_actions(objects, format_error_template=settings["format_error_template"],
                                                     template_kwargs={"finish_reason": finish})
            except FormatError as error:
                error.messages[0]["extra"].update({"cost": 0.0})
                raise
            message = {"role": "assistant", "content": content}
            if calls:
                message["tool_calls"] = calls
            message["extra"] = {"actions": actions, "cost": 0.0, "timestamp": time.time()}
            return message

        def format_message(self, **kwargs: Any) -> dict[str, Any]:
            return expand_multimodal_content(kwargs, pattern=settings["multimodal_regex"])

        def format_observation_messages(self, message: dict[str, Any], outputs: list[dict[str, Any]],
                                        template_vars: dict[str, Any] | None = None) -> list[dict[str, Any]]:
            if textbased:
                return format_observation_messages(outputs, observation_template=settings["observation_template"],
                                                   template_vars=template_vars)
            return format_toolcall_observation_messages(actions=message.get("extra", {}).get("actions", []),
                                                        outputs=outputs,
                                                        observation_template=settings["observation_template"],
                                                        template_vars=template_vars)

        def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
            return dict(settings)

        def serialize(self) -> dict[str, Any]:
            model_type = ("minisweagent.models.litellm_textbased_model.LitellmTextbasedModel" if textbased
                          else "minisweagent.models.litellm_model.LitellmModel")
            return {"info": {"config": {"model": dict(settings), "model_type": model_type}}}

    environment = config.get("environment") or {}
    env = LocalEnvironment(cwd=cwd, env=environment.get("env") or {}, timeout=environment.get("timeout", 30))
    agent_settings = {k: v for k, v in (config.get("agent") or {}).items() if k != "agent_class"}
    if trajectory:
        agent_settings["output_path"] = Path(trajectory)
    agent = DefaultAgent(ScriptedModel(), env, **agent_settings)
    agent.run(task)
    return agent.messages


def run_v1(config: dict[str, Any], replies: list[dict[str, Any]], task: str, cwd: str) -> list[dict[str, Any]]:
    from minisweagent.agents.default import AgentConfig, DefaultAgent
    from minisweagent.environments.local import LocalEnvironment

    section = config.get("model") or {}
    settings = {"model_name": section["model_name"], "model_kwargs": section.get("model_kwargs") or {},
                "litellm_model_registry": section.get("litellm_model_registry", os.getenv("LITELLM_MODEL_REGISTRY_PATH")),
                "set_cache_control": section.get("set_cache_control"),
                "cost_tracking": section.get("cost_tracking", os.getenv("MSWEA_COST_TRACKING", "default"))}
    if settings["set_cache_control"] is None and any(w in settings["model_name"].lower() for w in ("anthropic", "sonnet", "opus", "claude")):
        settings["set_cache_control"] = "default_end"

    class ScriptedModel:
        def __init__(self) -> None:
            self.replies, self.n_calls, self.cost = list(replies), 0, 0.0

        def query(self, messages: list[dict[str, Any]], **kwargs: Any) -> dict[str, Any]:
            self.n_calls += 1
            return {"content": self.replies.pop(0).get("content") or ""}

        def get_template_vars(self) -> dict[str, Any]:
            return settings | {"n_model_calls": self.n_calls, "model_cost": self.cost}

    environment = config.get("environment") or {}
    env = LocalEnvironment(cwd=cwd, env=environment.get("env") or {}, timeout=environment.get("timeout", 30))
    fields = {field.name for field in dataclasses.fields(AgentConfig)}
    agent = DefaultAgent(ScriptedModel(), env, **{k: v for k, v in (config.get("agent") or {}).items() if k in fields})
    agent.run(task)
    return agent.messages


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--package", "--config", "--task", "--replies", "--mode", "--cwd", "--out"):
        parser.add_argument(name, required=True)
    parser.add_argument("--trajectory")
    args = parser.parse_args()
    home = tempfile.mkdtemp(prefix="mini-reference-")
    os.environ["MSWEA_SILENT_STARTUP"] = "1"
    os.environ["MSWEA_GLOBAL_CONFIG_DIR"] = home
    _stub("dotenv", load_dotenv=lambda *a, **k: False)
    _stub("platformdirs", user_config_dir=lambda *a, **k: home)
    sys.path.insert(0, args.package)
    import minisweagent
    import yaml

    config = yaml.safe_load(Path(args.config).read_text(encoding="utf-8")) or {}
    replies = _items(args.replies)
    result: dict[str, Any] = {"version": minisweagent.__version__}
    if int(minisweagent.__version__.split(".")[0]) >= 2:
        from minisweagent.models.utils.actions_toolcall import BASH_TOOL

        result["messages"] = run_v2(config, replies, args.task, args.mode == "text", args.cwd, args.trajectory)
        result["tools"] = [BASH_TOOL]
    else:
        result["messages"] = run_v1(config, replies, args.task, args.cwd)
    Path(args.out).write_text(json.dumps(result, default=str))


if __name__ == "__main__":
    main()
