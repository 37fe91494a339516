"""The agent kind `mini-swe-agent`: the default loop, saying what mini-swe-agent says. A mini-swe-agent config file
(read by mini_config.py into `agent.kind: mini-swe-agent` and `agent.mini`, the file as written) brings its
templates; they are rendered here as mini-swe-agent renders them (its agents/default.py,
models/utils/actions_*.py): each with jinja2.Template(source, undefined=StrictUndefined), nothing stripped, over
the same variables merged the same way, so the model is sent what mini-swe-agent would send it. Replies are read
as it reads them (its action regex; its one bash tool).
"""

from __future__ import annotations

import json
import os
import re
import time
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator

from miniswe.agent import Agent
from miniswe.config import AgentConfig, as_mapping
from miniswe.errors import ConfigError
from miniswe.mini_config import (MINI_AGENT_KIND, MINI_BASH_TOOL, MINI_TEXT_REGEX, mini_version, template_problem,
                                  translate)
from miniswe.protocol import BASH, Action, FormatError, TextProtocol, ToolProtocol
from miniswe.templates import number

MINI_V1_TIMEOUT = (  # mini-swe-agent 1.x's defaults (agents/default.py, 1.17)
    "The last command <command>{{action['action']}}</command> timed out and has been killed.\n"
    "The output of the command was:\n"
    "{% if output | length < 10000 -%}\n"
    "<output>\n{{output}}\n</output>\n"
    "{%- else -%}\n"
    "<warning>Output was too long and has been truncated.</warning>\n"
    "<output_head>\n{{ output[:5000] }}\n</output_head>\n"
    "<elided_chars>{{ output | length - 10000 }} characters elided</elided_chars>\n"
    "<output_tail>\n{{ output[-5000:] }}\n</output_tail>\n"
    "{%- endif %}\n"
    "Please try another command and make sure to avoid those requiring interactive input."
)
MINI_DEFAULTS = {
    1: {"agent": {"system_template": "You are a helpful assistant that can do anything.",
                  "instance_template": "Your task: {{task}}. Please reply with a single shell command in triple backticks. "
                                       "To finish, the first line of the output of the shell command must be "
                                       "'COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT'.",
                  "timeout_template": MINI_V1_TIMEOUT,
                  "format_error_template": "Please always provide EXACTLY ONE action in triple backticks.",
                  "action_observation_template": "Observation: {{output}}",
                  "action_regex": r"```bash\s*\n(.*?)\n```",
                  "step_limit": 0, "cost_limit": 3.0}},
    2: {"agent": {"step_limit": 0, "cost_limit": 3.0, "wall_time_limit_seconds": 0, "max_consecutive_format_errors": 3,
                  "output_path": None}},
}
MINI_INTERACTIVE = {"mode": "confirm", "whitelist_actions": [], "confirm_exit": True}
MINI_OBSERVATION = ("{% if output.exception_info %}<exception>{{output.exception_info}}</exception>\n{% endif %}"
                    "<returncode>{{output.returncode}}</returncode>\n<output>\n{{output.output}}</output>")
MINI_TEXT_FORMAT_ERROR = "Please always provide EXACTLY ONE action in triple backticks, found {{actions|length}} actions."
# The settings each of its environment and model classes declares (their model_dump is what templates see).
MINI_ENVIRONMENT_FIELDS = {
    "local": {"cwd": "", "env": {}, "timeout": 30},
    "docker": {"image": "", "cwd": "/", "env": {}, "forward_env": [], "timeout": 30, "executable": "docker",
               "run_args": ["--rm"], "container_timeout": "2h", "pull_timeout": 120, "interpreter": ["bash", "-lc"]},
}
MINI_V1_DOCKER = ("image", "cwd", "env", "forward_env", "timeout", "executable", "run_args", "container_timeout",
                  "pull_timeout")


def recursive_merge(*dictionaries: dict[str, Any] | None) -> dict[str, Any]:
    """mini-swe-agent's merge (utils/serialize.py): later mappings win, nested mappings are merged key by key."""
    result: dict[str, Any] = {}
    for mapping in dictionaries:
        for key, value in (mapping or {}).items():
            if key in result and isinstance(result[key], dict) and isinstance(value, dict):
                result[key] = recursive_merge(result[key], value)
            elif isinstance(value, dict):
                result[key] = recursive_merge(value)
            else:
                result[key] = value
    return result


def mini_render(source: str, variables: dict[str, Any], what: str) -> str:
    """A mini-swe-agent template rendered as it renders one; ConfigError naming the template otherwise."""
    import jinja2

    try:
        return jinja2.Template(source, undefined=jinja2.StrictUndefined).render(**variables)
    except jinja2.TemplateError as error:
        raise ConfigError(f"mini-swe-agent template {what}: {error}; fix the template (mini-swe-agent would "
                          "fail on it too)") from None


class MiniTemplates:
    """The templates of a mini-swe-agent config (its agent, environment and model sections as written, merged),
    with the variables mini-swe-agent gives each. Version 1 (1.x: every template under `agent:`, an action
    observation and a timeout template) or 2 (2.x: the observation and format error templates under `model:`)."""

    def __init__(self, mini: dict[str, Any], *, version: int, textbased: bool, environment: str, interactive: bool):
        self.version, self.textbased, self.environment, self.interactive = version, textbased, environment, interactive
        sections = {name: dict(mini.get(name) or {}) for name in ("agent", "environment", "model")}
        self.agent, self.env_section, self.model = sections["agent"], sections["environment"], sections["model"]
        defaults = MINI_DEFAULTS[version]["agent"]
        if version == 1:
            self.templates = {name: self.agent.get(name, defaults[name]) for name in (
                "system_template", "instance_template", "timeout_template", "format_error_template",
                "action_observation_template")}
            self.action_regex = self.agent.get("action_regex", defaults["action_regex"])
        else:
            self.templates = {
                "system_template": self.agent.get("system_template", ""),
                "instance_template": self.agent.get("instance_template", ""),
                "observation_template": self.model.get("observation_template", MINI_OBSERVATION),
                "format_error_template": self.model.get(
                    "format_error_template", MINI_TEXT_FORMAT_ERROR if textbased else "{{ error }}"),
            }
            self.action_regex = self.model.get("action_regex", MINI_TEXT_REGEX)

    # -- the variables --------------------------------------------------------------------------------------
    def variables(self, live: dict[str, Any], *, n_model_calls: int, model_cost: float, elapsed_seconds: int,
                  extra: dict[str, Any]) -> dict[str, Any]:
        """What mini-swe-agent's agent gives a template: its agent config, the environment's (its config, the
        machine's uname, and for a local one this process's environment variables), the model's config, its
        counters, then the task and the task's other fields (`extra`). `live`: the settings miniswe runs with, by
        mini-swe-agent's names (step_limit, cwd, timeout, model_name, ...), over what the config file says."""
        import platform

        agent = self._agent_fields(live)
        environment = self._environment_fields(live)
        uname = platform.uname()._asdict()
        model = self._model_fields(live)
        local = self.environment == "local"
        if self.version == 1:  # 1.x: dict union, the model's counters among its variables
            env_vars = {**environment, **uname, **os.environ} if local else {**environment, **uname}
            return {**agent, **env_vars, **model, "n_model_calls": n_model_calls, "model_cost": model_cost, **extra}
        env_vars = recursive_merge(environment, uname, dict(os.environ) if local else None)
        counters = {"n_model_calls": n_model_calls, "model_cost": model_cost, "elapsed_seconds": elapsed_seconds}
        return recursive_merge(agent, env_vars, model, counters, extra)

    def _agent_fields(self, live: dict[str, Any]) -> dict[str, Any]:
        defaults = MINI_DEFAULTS[self.version]["agent"]
        fields = dict(defaults) if self.version == 1 else {"system_template": "", "instance_template": "", **defaults}
        if self.interactive:
            fields.update(MINI_INTERACTIVE)
        fields.update({key: value for key, value in self.agent.items() if key in fields})
        fields.update({key: value for key, value in live.items() if key in fields})
        return fields

    def _environment_fields(self, live: dict[str, Any]) -> dict[str, Any]:
        fields = dict(MINI_ENVIRONMENT_FIELDS[self.environment])
        if self.version == 1 and self.environment == "docker":
            fields = {key: fields[key] for key in MINI_V1_DOCKER}
        fields.update({key: value for key, value in self.env_section.items() if key in fields})
        fields.update({key: value for key, value in live.items() if key in fields and key != "model_name"})
        return fields

    def _model_fields(self, live: dict[str, Any]) -> dict[str, Any]:
        name = live.get("model_name", self.model.get("model_name", ""))
        cache = self.model.get("set_cache_control")
        if cache is None and any(word in name.lower() for word in ("anthropic", "sonnet", "opus", "claude")):
            cache = "default_end"  # get_model picks it for Anthropic's models
        fields = {"model_name": name, "model_kwargs": self.model.get("model_kwargs") or {},
                  "litellm_model_registry": self.model.get("litellm_model_registry",
                                                           os.environ.get("LITELLM_MODEL_REGISTRY_PATH")),
                  "set_cache_control": cache,
                  "cost_tracking": self.model.get("cost_tracking", os.environ.get("MSWEA_COST_TRACKING", "default"))}
        if self.version == 2:
            fields.update(format_error_template=self.templates["format_error_template"],
                          observation_template=self.templates["observation_template"],
                          multimodal_regex=self.model.get("multimodal_regex", ""))
            if self.textbased:
                fields["action_regex"] = self.action_regex
        return fields

    # -- the messages ---------------------------------------------------------------------------------------
    def system(self, variables: dict[str, Any]) -> str:
        return mini_render(self.templates["system_template"], variables, "agent.system_template")

    def instance(self, variables: dict[str, Any]) -> str:
        return mini_render(self.templates["instance_template"], variables, "agent.instance_template")

    def observation(self, variables: dict[str, Any], *, command: str, output: str, returncode: int | None,
                    timed_out: bool, timeout: float, reply: str = "") -> str:
        """A command's result as the model is told it. 2.x: the observation template, over the output mapping
        its environments return (a timeout is an exception: returncode -1, the exception's text). 1.x: the
        action observation template, or its timeout template."""
        if self.version == 1:
            if timed_out:
                action = {"action": command, "content": reply}
                return mini_render(self.templates["timeout_template"], {**variables, "action": action, "output": output},
                                   "agent.timeout_template")
            result = {"output": output, "returncode": returncode, "action": command}
            return mini_render(self.templates["action_observation_template"], {**variables, "output": result},
                               "agent.action_observation_template")
        if timed_out:
            reason = f"Command '{command}' timed out after {number(timeout)} seconds"
            result = {"output": output, "returncode": -1,
                      "exception_info": f"An error occurred while executing the command: {reason}",
                      "extra": {"exception_type": "TimeoutExpired", "exception": reason}}
        else:
            result = {"output": output, "returncode": returncode, "exception_info": ""}
        return mini_render(self.templates["observation_template"], {**variables, "output": result},
                           "model.observation_template")

    def format_error(self, variables: dict[str, Any], *, error: str, actions: list[str], finish_reason: str | None,
                     has_tool_calls: bool | None = None) -> str:
        """A reply mini-swe-agent would refuse, answered as it answers one. 2.x renders the format error template
        with the error's own variables only (actions, error, finish_reason; has_tool_calls for tool calls); 1.x
        with every variable and the actions found."""
        if self.version == 1:
            return mini_render(self.templates["format_error_template"], {**variables, "actions": actions},
                               "agent.format_error_template")
        own: dict[str, Any] = {"actions": actions, "error": error, "finish_reason": finish_reason}
        if has_tool_calls is not None:
            own["has_tool_calls"] = has_tool_calls
        return mini_render(self.templates["format_error_template"], own, "model.format_error_template")


class MiniAgentConfig(AgentConfig):
    kind: str = MINI_AGENT_KIND
    # the mini-swe-agent config as written (its agent, environment and model sections): its templates, and the
    # settings its templates see as variables
    mini: Annotated[dict[str, Any], BeforeValidator(as_mapping), AfterValidator(_checked)] = {}


def _checked(mini: dict[str, Any]) -> dict[str, Any]:
    problem = template_problem(mini)
    if problem:
        raise ValueError(problem)
    agent = mini.get("agent") if isinstance(mini.get("agent"), dict) else {}
    missing = [key for key in ("system_template", "instance_template") if key not in agent]
    if mini_version(mini) == 2 and missing:  # 1.x had defaults for them; 2.x requires both
        raise ValueError(f"agent.{missing[0]} is missing: a mini-swe-agent config's prompts come from a file that has "
                         "them (-c its config before files that only change its model or environment)")
    return mini


def _interactive(mini: dict[str, Any]) -> bool:
    agent = mini.get("agent") if isinstance(mini.get("agent"), dict) else {}
    return "interactive" in str(agent.get("agent_class") or "").lower() or "mode" in agent


class MiniFormatError(FormatError):
    """A reply mini-swe-agent refuses, with what its format error template is given."""

    def __init__(self, kind: str, message: str, actions: list[str], finish_reason: str | None,
                 has_tool_calls: bool | None = None):
        super().__init__(kind, message)
        self.actions, self.finish_reason, self.has_tool_calls = actions, finish_reason, has_tool_calls

class MiniTextProtocol(TextProtocol):
    """A text reply read with the config's action regex, as mini-swe-agent reads one: exactly one match runs."""

    def __init__(self, config: Any, regex: str, version: int):
        super().__init__(config)
        self.regex, self.version = regex, version

    def actions(self, reply: Any) -> list[Any]:
        found = re.findall(self.regex, reply.content or "", re.DOTALL)
        if len(found) == 1:
            return [Action(BASH, str(found[0]).strip())]
        kind = "truncated" if reply.finish_reason == "length" else "several_actions" if found else "no_action"
        shown = [str(a) for a in found] if self.version == 1 else [str(a).strip() for a in found]
        error = MiniFormatError(kind, f"Expected exactly 1 action, found {len(found)}.", shown, reply.finish_reason)
        return [Action(BASH, None, error=error)]

class MiniToolProtocol(ToolProtocol):
    """mini-swe-agent's tool calling: its one bash tool offered; a reply with no call, or any call that is not
    bash with a command, is refused whole (nothing of it runs), as its parse_toolcall_actions refuses it."""

    def request(self) -> dict[str, Any]:
        return {"tools": [MINI_BASH_TOOL]}

    def actions(self, reply: Any) -> list[Any]:
        calls, finish = reply.tool_calls, reply.finish_reason
        if not calls:
            error = MiniFormatError("truncated" if finish == "length" else "no_tool_call",
                                    "No tool calls found in the response. Every response MUST include at least one "
                                    "tool call.", [], finish, False)
            return [Action(BASH, None, error=error)]
        actions = []
        for index, call in enumerate(calls):
            problem, kind, arguments = "", "bad_arguments", {}
            try:
                arguments = json.loads(call.arguments)
            except Exception as error:  # noqa: BLE001 - mini-swe-agent catches any, and shows its text
                problem = f"Error parsing tool call arguments: {error}."
            if call.name != "bash":
                problem += f"Unknown tool '{call.name}'."
                kind = "unknown_tool"
            if not isinstance(arguments, dict) or "command" not in arguments:
                problem += "Missing 'command' argument in bash tool call."
            if problem:
                return [Action(BASH, None, error=MiniFormatError(kind, problem.strip(), [], finish, True))]
            command = arguments["command"] if isinstance(arguments["command"], str) else json.dumps(arguments["command"])
            actions.append(Action(BASH, command, {"command": command}, call, index))
        return actions

class MiniAgent(Agent):
    """The default loop, saying what mini-swe-agent says: its system and instance prompts, observations and
    format errors rendered from the config's own templates over mini-swe-agent's variables; replies read as
    it reads them (its action regex; its one bash tool). 2.x keeps a refused reply out of the conversation,
    as mini-swe-agent does (the trajectory keeps it)."""

    config_class = MiniAgentConfig

    def __init__(self, ctx: Any, model: Any, env: Any):
        super().__init__(ctx, model, env)
        config = self.config
        mini = config.agent.mini
        self.mini = MiniTemplates(
            mini, version=mini_version(mini), textbased=config.protocol.kind != "tools",
            environment="docker" if config.environment.kind == "docker" else "local",
            interactive=_interactive(mini))
        if config.protocol.kind == "tools":
            self.protocol = MiniToolProtocol(config, self.tools.offered)
        else:
            self.protocol = MiniTextProtocol(config, self.mini.action_regex, self.mini.version)
        self.compactor.request = self.protocol.request
        self.task_variables: dict[str, Any] = {}
        _, unused = translate(mini, "agent.mini") if mini else ({}, [])
        for item in unused:
            self.trajectory.warn(f"mini-swe-agent config: not used: {item}", once=True)

    def run(self, task: str, instance: dict[str, Any] | None = None) -> Any:
        fields = {key: value for key, value in (instance or {}).items() if isinstance(key, str)}
        self.task_variables = {**fields, "task": task}
        return super().run(task, instance)

    def mini_variables(self) -> dict[str, Any]:
        config, usage = self.config, self.trajectory.usage
        env = config.environment
        live = {"step_limit": config.agent.step_limit, "cost_limit": config.agent.cost_limit,
                "wall_time_limit_seconds": int(config.agent.time_limit),
                "max_consecutive_format_errors": config.agent.max_format_errors,
                "cwd": env.cwd, "env": dict(env.env), "timeout": number(env.timeout), "model_name": config.model.name}
        for key in ("image", "forward_env", "executable"):
            if hasattr(env, key):
                live[key] = list(getattr(env, key)) if key == "forward_env" else getattr(env, key)
        return self.mini.variables(live, n_model_calls=usage.model_calls, model_cost=usage.cost,
                                   elapsed_seconds=int(time.monotonic() - self.limits.started),
                                   extra=self.task_variables)

    def render(self, template: str, **variables: Any) -> str:
        if template == "system.j2":
            return self.mini.system(self.mini_variables())
        if template == "instance.j2":
            return self.mini.instance(self.mini_variables())
        return super().render(template, **variables)

    def _result(self, step: Any, timeout: float) -> str:
        if step.refused or step.aborted:  # miniswe's own: mini-swe-agent has no word for these
            return super()._result(step, timeout)
        reply = next((m.get("content") or "" for m in reversed(self.messages) if m.get("role") == "assistant"), "")
        return self.mini.observation(self.mini_variables(), command=step.command or "", output=step.output,
                                     returncode=step.returncode, timed_out=step.timed_out, timeout=timeout,
                                     reply=reply)

    def _reject(self, step: Any, error: Any) -> Any:
        limit = self.config.agent.max_format_errors
        if (limit and self.format_errors >= limit) or not isinstance(error, MiniFormatError):
            return super()._reject(step, error)
        text = self.mini.format_error(self.mini_variables(), error=str(error), actions=error.actions,
                                      finish_reason=error.finish_reason, has_tool_calls=error.has_tool_calls)
        if self.mini.version == 2 and self.messages and self.messages[-1].get("role") == "assistant":
            self.messages.pop()  # 2.x raises before the reply joins the conversation
        return self._after(step, lambda: text)
