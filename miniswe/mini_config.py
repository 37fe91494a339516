"""mini-swe-agent's config files, run unchanged: `-c mini.yaml` (a file of mini-swe-agent 1.x or 2.x) is recognised
by its shape and read into miniswe's sections.

What it maps (docs/configuration.md, "mini-swe-agent configs"):
- its templates, rendered as mini-swe-agent renders them by the agent kind `mini-swe-agent` (mini_agent.py): the
  default loop, whose system, instance, observation and format error messages are mini-swe-agent's, over
  mini-swe-agent's variables; the config as written is kept whole in `agent.mini`;
- its limits, its environment (local or docker; cwd, env, timeout, image, ...), its model (name, kwargs; the
  class decides text or tool calls: `protocol.kind`), its action regex (text replies are read with it, as
  mini-swe-agent reads them) and its submit marker;
- miniswe's own additions that would change what the model is sent are turned off (output_limit, max_repeats,
  budget_warning: 0; capture_limit: 0 keeps whole outputs as mini-swe-agent does); later `-c` values set them again.

Whatever it cannot map is named in one line on stderr at start (and in the trajectory's warnings), never dropped
silently. A later `-c` (file or key=value) overrides what it set, as for any config file.
"""

from __future__ import annotations

import re
import sys
from typing import Any

from miniswe.errors import ConfigError

MINI_AGENT_KIND = "mini-swe-agent"  # the agent kind (mini_agent.MiniAgent) a translated config runs with
SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
V1_MARKER = "MINI_SWE_AGENT_FINAL_OUTPUT"  # 1.x accepted this one too
# Keys only mini-swe-agent's configs have (miniswe's sections have none of them): a file with one is its config.
MINI_KEYS = {
    "agent": {"system_template", "instance_template", "timeout_template", "format_error_template",
              "action_observation_template", "action_regex", "agent_class", "mode", "whitelist_actions",
              "confirm_exit", "wall_time_limit_seconds", "max_consecutive_format_errors", "output_path"},
    "environment": {"environment_class", "container_timeout", "pull_timeout", "interpreter", "startup_timeout",
                    "runtime_timeout", "deployment_timeout", "install_pipx", "modal_sandbox_kwargs"},
    "model": {"model_name", "model_class", "model_kwargs", "observation_template", "format_error_template",
              "action_regex", "litellm_model_registry", "set_cache_control", "cost_tracking", "multimodal_regex"},
}
V1_AGENT_KEYS = ("action_observation_template", "timeout_template", "format_error_template", "action_regex")
TEMPLATE_SPOTS = (("agent", "system_template"), ("agent", "instance_template"), ("agent", "timeout_template"),
                  ("agent", "format_error_template"), ("agent", "action_observation_template"),
                  ("model", "observation_template"), ("model", "format_error_template"))
# Its environment classes, by the name or path it gives them, as miniswe's kinds. The sandboxes miniswe has no
# kind for run in a docker container (they run an image too), bubblewrap locally confined.
ENVIRONMENTS = {"local": "local", "docker": "docker", "swerex_docker": "docker", "singularity": "docker",
                "swerex_modal": "docker", "contree": "docker", "bubblewrap": "local"}
ENVIRONMENT_PATHS = {
    "minisweagent.environments.local.LocalEnvironment": "local",
    "minisweagent.environments.docker.DockerEnvironment": "docker",
    "minisweagent.environments.singularity.SingularityEnvironment": "singularity",
    "minisweagent.environments.extra.swerex_docker.SwerexDockerEnvironment": "swerex_docker",
    "minisweagent.environments.extra.swerex_modal.SwerexModalEnvironment": "swerex_modal",
    "minisweagent.environments.extra.bubblewrap.BubblewrapEnvironment": "bubblewrap",
    "minisweagent.environments.extra.contree.ContreeEnvironment": "contree",
}
AGENTS = {"default", "interactive", "minisweagent.agents.default.DefaultAgent",
          "minisweagent.agents.interactive.InteractiveAgent"}
# OpenAI-compatible routers mini-swe-agent has a class for: their endpoint and key variable.
ROUTERS = {"openrouter": ("https://openrouter.ai/api/v1", "OPENROUTER_API_KEY"),
           "requesty": ("https://router.requesty.ai/v1", "REQUESTY_API_KEY")}
# mini-swe-agent's BASH_TOOL (models/utils/actions_toolcall.py): the one tool its tool-calling models offer.
MINI_BASH_TOOL = {"type": "function", "function": {
    "name": "bash", "description": "Execute a bash command",
    "parameters": {"type": "object", "properties": {"command": {"type": "string", "description": "The bash command to execute"}},
                   "required": ["command"]}}}
MINI_TEXT_REGEX = r"```mswea_bash_command\s*\n(.*?)\n```"  # what 2.x's text-based models look for
# What of a mini-swe-agent model's settings the model kind it becomes has (this module sits below config.py, so
# it names them rather than asking the kinds' settings classes; tests/test_mini_config.py keeps them equal).
MODEL_FIELDS = {"openai": {"base_url", "api_key_env", "temperature", "params", "timeout"},
                "litellm": {"api_base", "api_key_env", "temperature", "params", "timeout", "cache_control"}}
_told: set[str] = set()  # the notices printed by this process


def is_mini_config(data: Any) -> bool:
    """Whether a config file's data is mini-swe-agent's: a key only its configs have, and none only miniswe's."""
    if not isinstance(data, dict) or any(name in data for name in ("protocol", "replay", "policy")):
        return False
    sections = {name: data.get(name) for name in MINI_KEYS}
    if any(isinstance(values, dict) and "kind" in values for values in sections.values()):
        return False
    return isinstance(data.get("run"), dict) or any(
        isinstance(values, dict) and set(values) & MINI_KEYS[name] for name, values in sections.items())


def mini_version(mini: dict[str, Any]) -> int:
    """1 for a 1.x config (its observation, timeout and format error templates under `agent:`), else 2."""
    agent = mini.get("agent") if isinstance(mini.get("agent"), dict) else {}
    return 1 if any(key in agent for key in V1_AGENT_KEYS) else 2


def from_mini_config(data: Any, source: str) -> Any:
    """A config file's data as miniswe's sections when it is a mini-swe-agent config (what it cannot map named on
    stderr, once); any other data as it is."""
    if not is_mini_config(data):
        return data
    config, unused = translate(data, source)
    line = notice(source, unused)
    if line and line not in _told:
        _told.add(line)
        print(line, file=sys.stderr, flush=True)
    return config


def notice(source: str, unused: list[str]) -> str:
    return f"miniswe: {source}: mini-swe-agent config: not used: {'; '.join(unused)}" if unused else ""


def translate(data: dict[str, Any], source: str = "config") -> tuple[dict[str, Any], list[str]]:
    """(miniswe's sections, what is not used) of a mini-swe-agent config's data."""
    return _Translation(data, source).result()


def _number(value: Any, key: str, source: str, *, whole: bool = False) -> Any:
    """A limit as miniswe's settings take it (YAML's `0.` is a float; mini-swe-agent's pydantic takes it as 0)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value  # miniswe's check says what is wrong with it, naming the key
    if whole:
        if float(value).is_integer():
            return int(value)
        raise ConfigError(f"{source}: {key}: expected a whole number, got {value!r}")
    return float(value)


def _seconds(text: Any) -> float | None:
    """`sleep`'s duration (2h, 30m, 90s, 1d, 45) in seconds."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", str(text))
    if not found:
        return None
    return float(found[1]) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[found[2]]


class _Translation:
    def __init__(self, data: dict[str, Any], source: str):
        self.data, self.source = data, source
        self.sections = {name: dict(data.get(name) or {}) if isinstance(data.get(name), dict) else {}
                         for name in MINI_KEYS}
        self.version = mini_version(self.sections)
        self.unused: list[str] = []
        self.config: dict[str, Any] = {}

    def result(self) -> tuple[dict[str, Any], list[str]]:
        for key, value in self.data.items():
            if key not in MINI_KEYS:
                what = "give the task on the command line" if key == "run" else "not a section miniswe reads"
                self.unused.append(f"{key} ({what})")
            elif value is not None and not isinstance(value, dict):
                raise ConfigError(f"{self.source}: {key}: expected a mapping, got {type(value).__name__}")
        self._check_templates()
        protocol = self._protocol()
        self._agent()
        self._environment()
        self._model(protocol)
        if protocol:
            self.config["protocol"] = {"kind": protocol}
        if self.version == 1 or protocol == "text" or self.sections["agent"]:
            self.config.setdefault("protocol", {})["submit_marker"] = self._marker()
        return self.config, self.unused

    def _check_templates(self) -> None:
        problem = template_problem(self.sections)
        if problem:
            raise ConfigError(f"{self.source}: {problem}")

    # -- which protocol: the model class mini-swe-agent would use ----------------------------------------------
    def _protocol(self) -> str | None:
        model = self.sections["model"]
        if self.version == 1:
            return "text"  # 1.x read every reply with its action regex
        named = str(model.get("model_class") or "")
        short = named.rsplit(".", 1)[-1].lower()
        if named:
            if "textbased" in short or short in ("deterministic", "deterministicmodel"):
                return "text"
            if "response" in short:
                self.unused.append(f"model.model_class {named} (the Responses API: miniswe calls tools through chat "
                                   "completions)")
            if "action_regex" in model:
                self.unused.append(f"model.action_regex (model_class {named} calls tools, as in mini-swe-agent)")
            return "tools"
        prompts = {"system_template", "instance_template"} & set(self.sections["agent"])
        if not prompts and not {"action_regex", "observation_template", "format_error_template"} & set(model):
            return None  # nothing here says (a file that sets the model only): the config before it decides
        # mini-swe-agent 2 calls tools unless a text-based model class is named; a config whose prompts ask for
        # mswea_bash_command blocks is meant for one (`--model-class litellm_textbased`)
        texts = [str(value) for section in ("agent", "model") for value in self.sections[section].values()
                 if isinstance(value, str)]
        if "action_regex" in model or any("mswea_bash_command" in text for text in texts):
            self.unused.append("model.model_class not set (mini-swe-agent 2 would call tools; this config's prompts "
                               "ask for mswea_bash_command blocks, so it runs as with model_class litellm_textbased)")
            return "text"
        return "tools"

    def _marker(self) -> str:
        """2.x submits with one marker; 1.x took two: the one its prompts ask for (the first it accepted otherwise)."""
        if self.version == 1:
            texts = " ".join(str(v) for v in self.sections["agent"].values() if isinstance(v, str))
            if V1_MARKER in texts and SUBMIT_MARKER not in texts:
                return V1_MARKER
        return SUBMIT_MARKER

    # -- agent --------------------------------------------------------------------------------------------------
    def _agent(self) -> None:
        agent, version = self.sections["agent"], self.version
        ours: dict[str, Any] = {"kind": MINI_AGENT_KIND,
                                "mini": {name: values for name, values in self.sections.items() if values}}
        if "system_template" in agent or "instance_template" in agent:
            # the file that holds the prompts is the config; mini-swe-agent's defaults for what it leaves out
            ours.update(step_limit=0, cost_limit=3.0, max_format_errors=3 if version == 2 else 0, time_limit=0.0,
                        output_limit=0, max_repeats=0, budget_warning=0.0)
        for theirs, mine, whole in (("step_limit", "step_limit", True), ("cost_limit", "cost_limit", False),
                                    ("wall_time_limit_seconds", "time_limit", False),
                                    ("max_consecutive_format_errors", "max_format_errors", True)):
            if theirs in agent:
                ours[mine] = _number(agent[theirs], f"agent.{theirs}", self.source, whole=whole)
        if version == 1 and "max_consecutive_format_errors" in agent:
            self.unused.append("agent.max_consecutive_format_errors (a 2.x setting; 1.x had no such limit)")
        named = agent.get("agent_class")
        if named and str(named) not in AGENTS:
            self.unused.append(f"agent.agent_class {named} (a Python class miniswe cannot run: the default loop runs)")
        mode = agent.get("mode")
        if mode not in (None, "yolo"):
            self.unused.append(f"agent.mode {mode} (interactive {mode} mode: use miniswe chat)")
        for key in ("whitelist_actions", "confirm_exit"):
            if key in agent:
                self.unused.append(f"agent.{key} (interactive mode: use miniswe chat)")
        if agent.get("output_path"):
            self.unused.append("agent.output_path (miniswe writes the trajectory where -o says)")
        known = {"system_template", "instance_template", "step_limit", "cost_limit", "wall_time_limit_seconds",
                 "max_consecutive_format_errors", "output_path", "agent_class", "mode", "whitelist_actions",
                 "confirm_exit", *(V1_AGENT_KEYS if version == 1 else ())}
        for key in agent:
            if key not in known:
                self.unused.append(f"agent.{key} ({'a 1.x setting in a 2.x config' if key in V1_AGENT_KEYS else 'unknown to mini-swe-agent'})")
        self.config["agent"] = ours

    # -- environment --------------------------------------------------------------------------------------------
    def _environment(self) -> None:
        env = self.sections["environment"]
        if not env:
            return
        named = str(env.get("environment_class") or ("docker" if env.get("image") else "local"))
        short = ENVIRONMENT_PATHS.get(named, named)
        kind = ENVIRONMENTS.get(short)
        if kind is None:
            raise ConfigError(f"{self.source}: environment.environment_class: {named} is a class miniswe cannot run "
                              f"(it runs {', '.join(sorted(ENVIRONMENTS))}); set one of those in the file")
        if short not in ("local", "docker"):
            self.unused.append(f"environment.environment_class {named} (runs in miniswe's {kind} environment"
                               f"{', confined to the working directory' if short == 'bubblewrap' else ''})")
        ours: dict[str, Any] = {"kind": kind, "timeout": 30.0, "capture_limit": 0}
        if short == "bubblewrap":
            self.config["policy"] = {"confine": True}
        if "timeout" in env:
            ours["timeout"] = _number(env["timeout"], "environment.timeout", self.source)
        for key in ("cwd", "env"):
            if key in env:
                ours[key] = env[key]
        docker = kind == "docker"
        handled = {"environment_class", "timeout", "cwd", "env"}
        if docker:
            handled |= {"image", "forward_env", "executable", "run_args", "container_timeout", "pull_timeout",
                        "interpreter"}
            for key in ("image", "forward_env", "executable"):
                if key in env:
                    ours[key] = env[key]
            if isinstance(env.get("run_args"), list):  # miniswe removes its containers itself
                ours["run_args"] = [str(arg) for arg in env["run_args"] if str(arg) not in ("--rm", "--rm=true")]
            elif "run_args" in env:
                ours["run_args"] = env["run_args"]
            if "container_timeout" in env:
                seconds = _seconds(env["container_timeout"])
                if seconds is None:
                    self.unused.append(f"environment.container_timeout {env['container_timeout']!r} (not a duration)")
                else:
                    ours["container_lifetime"] = seconds
            if "pull_timeout" in env:
                ours["start_timeout"] = _number(env["pull_timeout"], "environment.pull_timeout", self.source)
            interpreter = env.get("interpreter", ["bash", "-lc"])
            if interpreter != ["bash", "-c"]:
                shown = " ".join(map(str, interpreter)) if isinstance(interpreter, list) else interpreter
                self.unused.append(f"environment.interpreter {shown} ({'the default; ' if 'interpreter' not in env else ''}"
                                   "miniswe runs commands with bash -c)")
        docker_only = [key for key in env if key not in handled and key in ("forward_env", "image", "run_args")]
        others = [key for key in env if key not in handled and key not in docker_only]
        if docker_only:
            self.unused.append(f"{', '.join('environment.' + key for key in docker_only)} (docker settings)")
        if others:
            self.unused.append(f"{', '.join('environment.' + key for key in others)} (no such setting in miniswe's "
                               f"{kind} environment)")
        self.config["environment"] = ours

    # -- model --------------------------------------------------------------------------------------------------
    def _model(self, protocol: str | None) -> None:
        model = self.sections["model"]
        if not model:
            return
        named = str(model.get("model_class") or "litellm")
        short = named.rsplit(".", 1)[-1].lower()
        family = short.split("_")[0].removesuffix("model").removesuffix("textbased").removesuffix("response")
        ours: dict[str, Any] = {}
        kind = "openai"
        if family in ("litellm", "anthropic"):  # 1.x's anthropic class called litellm too
            kind = "litellm"
        elif family in ROUTERS:
            ours["base_url"], ours["api_key_env"] = ROUTERS[family]
        elif family == "portkey":
            self.unused.append(f"model.model_class {named} (miniswe calls an OpenAI-compatible endpoint: --base-url)")
        else:
            self.unused.append(f"model.model_class {named} (a Python class miniswe cannot run: it calls an "
                               "OpenAI-compatible endpoint, --base-url)")
        ours["kind"] = kind
        fields = MODEL_FIELDS[kind]
        if model.get("model_name"):
            ours["name"] = str(model["model_name"])
        kwargs = model.get("model_kwargs") or {}
        if not isinstance(kwargs, dict):
            self.unused.append(f"model.model_kwargs (a {type(kwargs).__name__}; miniswe takes a mapping of request fields)")
            kwargs = {}
        params = {}
        for key, value in kwargs.items():
            endpoint = "api_base" if "api_base" in fields else "base_url"
            if key == "temperature" and "temperature" in fields and isinstance(value, (int, float)):
                ours["temperature"] = float(value)
            elif key in ("api_base", "base_url") and endpoint in fields:
                ours[endpoint] = str(value)
            elif key == "timeout" and "timeout" in fields and isinstance(value, (int, float)):
                ours["timeout"] = float(value)
            elif key == "api_key":
                self.unused.append(f"model.model_kwargs.{key} (miniswe reads the key from a variable: model.api_key_env)")
            elif kind != "litellm" and key in ("drop_params", "api_version", "custom_llm_provider"):
                self.unused.append(f"model.model_kwargs.{key} (a litellm setting; model kind {kind} sends only what it "
                                   "is given)")
            else:
                params[key] = value
        if params and "params" in fields:
            ours["params"] = params
        elif params:
            self.unused.append(f"model.model_kwargs {', '.join(params)} (model kind {kind} takes no request fields)")
        if model.get("set_cache_control") and "cache_control" in fields:
            ours["cache_control"] = "on"
        for key in ("litellm_model_registry", "set_cache_control", "cost_tracking", "multimodal_regex", "provider"):
            if model.get(key) and not (key == "set_cache_control" and "cache_control" in fields):
                self.unused.append(f"model.{key} ({'a portkey setting' if key == 'provider' else 'a litellm setting'})")
        handled = {"model_name", "model_class", "model_kwargs", "observation_template", "format_error_template",
                   "action_regex", "litellm_model_registry", "set_cache_control", "cost_tracking", "multimodal_regex",
                   "provider"}
        for key in model:
            if key not in handled:
                self.unused.append(f"model.{key} (unknown to mini-swe-agent's model classes)")
        if protocol == "text" and self.version == 2 and "action_regex" in model:
            try:
                re.compile(str(model["action_regex"]))
            except re.error as error:
                raise ConfigError(f"{self.source}: model.action_regex: not a valid regular expression ({error})") from None
        self.config["model"] = ours


def template_problem(mini: dict[str, Any]) -> str | None:
    """The first of a mini-swe-agent config's templates that is not text or not a Jinja2 template, said in a line."""
    import jinja2

    for section, key in TEMPLATE_SPOTS:
        values = mini.get(section) if isinstance(mini.get(section), dict) else {}
        if key not in values:
            continue
        source = values[key]
        if not isinstance(source, str):
            return f"{section}.{key}: expected a template (text), got {type(source).__name__}"
        try:
            jinja2.Environment().parse(source)
        except jinja2.TemplateSyntaxError as error:
            return f"{section}.{key}: template syntax error at line {error.lineno}: {error.message}"
    if mini_version(mini) == 1 and isinstance(mini.get("agent"), dict) and "action_regex" in mini["agent"]:
        try:
            re.compile(str(mini["agent"]["action_regex"]))
        except re.error as error:
            return f"agent.action_regex: not a valid regular expression ({error})"
    return None
