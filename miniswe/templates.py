"""Prompts: the Jinja2 templates, the variables each may use, and rendering them.

One jinja2 environment searches the user's templates dir, then the shipped templates/. Every template is
checked when the Renderer is built, so an unknown variable or a syntax error fails at start-up.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from miniswe.errors import ConfigError
from miniswe.resources import templates_dir

PROMPT_VARIABLES = ("action_tag", "submit_marker", "command_timeout", "output_limit", "cwd", "system", "release", "machine",
                    "shell", "protocol", "tools", "skills", "subagents", "depth")
VARIABLES = {
    "system.j2": set(PROMPT_VARIABLES),
    "instance.j2": {"task", "instance", *PROMPT_VARIABLES},
    "observation.j2": {"output", "returncode", "timed_out", "command_timeout", "elided_chars", "output_chars", "duration_s",
                       "aborted"},
    "format_error.j2": {"reason", "error", "action_tag", "submit_marker", "errors_left", "protocol"},
    "compact.j2": {"submit_marker"},
    "summarize.j2": set(),
    "summary.j2": {"summary"},
    "elided.j2": {"head", "chars", "role"},
}


def prompt_variables(config: Any, cwd: str, *, skills: Sequence[dict[str, str]] = (), subagents: bool = False,
                     depth: int = 0, tools: Sequence[str] = ()) -> dict[str, Any]:
    """What the system and instance prompts may say about the run: its protocol (and the tools it offers), limits,
    machine, skills (name and description of each) and whether it may start sub-agents (and at what depth it is)."""
    uname = os.uname()  # not platform.uname(): importing platform costs a run more than it tells
    return {
        "action_tag": config.protocol.action_tags[0],
        "submit_marker": config.protocol.submit_marker,
        "command_timeout": number(config.environment.timeout),
        "output_limit": config.agent.output_limit,
        "cwd": cwd,
        "system": uname.sysname,
        "release": uname.release,
        "machine": uname.machine,
        "shell": "bash",
        "protocol": config.protocol.kind,
        "tools": list(tools),
        "skills": list(skills),
        "subagents": subagents,
        "depth": depth,
    }


def number(value: float) -> int | float:
    """A number as a person writes it: 60, not 60.0."""
    return int(value) if float(value).is_integer() else value


class Renderer:
    def __init__(self, user_dir: str = ""):
        import jinja2
        import jinja2.meta

        search = [user_dir, templates_dir()] if user_dir else [templates_dir()]
        if user_dir and not os.path.isdir(user_dir):
            raise ConfigError(f"agent.templates_dir: {user_dir} is not a directory")
        self._env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(search),
            undefined=jinja2.StrictUndefined,
            keep_trailing_newline=False,
            autoescape=False,
        )
        self._templates = {}
        for name, allowed in VARIABLES.items():
            try:
                source, filename, _ = self._env.loader.get_source(self._env, name)
                used = jinja2.meta.find_undeclared_variables(self._env.parse(source))
                self._templates[name] = self._env.get_template(name)
            except jinja2.TemplateNotFound:
                raise ConfigError(f"template {name} not found in {' or '.join(search)}") from None
            except jinja2.TemplateSyntaxError as error:
                raise ConfigError(f"{error.filename or name}:{error.lineno}: template syntax error: {error.message}") from None
            except UnicodeDecodeError:
                raise ConfigError(f"template {name} in {' or '.join(search)} is not UTF-8 text; save it as UTF-8") from None
            unknown = sorted(used - allowed)
            if unknown:
                raise ConfigError(
                    f"{filename}: unknown template variable {unknown[0]!r} (available: {', '.join(sorted(allowed))})"
                )

    def render(self, name: str, **variables: Any) -> str:
        import jinja2

        try:
            return self._templates[name].render(**variables).strip("\n")
        except jinja2.TemplateError as error:
            raise ConfigError(f"template {name}: {error}; fix the template (see the variables it may use)") from None

    def check_instance(self, task: str, instance: dict[str, Any], variables: dict[str, Any]) -> None:
        """Render the instance prompt once now, so a field a task lacks fails before anything runs."""
        self.render("instance.j2", task=task, instance=instance, **variables)


# -- mini-swe-agent's own templates ------------------------------------------------------------------------------
# A mini-swe-agent config (miniswe/mini_config.py) brings its templates and the variables they see. They are
# rendered here as mini-swe-agent renders them (its agents/default.py, models/utils/actions_*.py): each with
# jinja2.Template(source, undefined=StrictUndefined), nothing stripped, over the same variables merged the same
# way, so the model is sent what mini-swe-agent would send it.

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
MINI_TEXT_REGEX = r"```mswea_bash_command\s*\n(.*?)\n```"
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
