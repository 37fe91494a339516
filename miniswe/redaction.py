"""Keeping secrets out of everything miniswe records or prints.

A run's secrets are the model's key, every `environment.forward_env` value, and every value of a
secret-looking name anywhere in the config (`environment.env.GITHUB_TOKEN`, `model.params.api_key`,
`-e API_KEY=...` run arguments). `Secrets` masks their values in free text (outputs, submissions, error
messages); configs and command lines are masked by structure, whatever the value's length. A rebuilt
config gets masked values back from the environment, by the variable's name (`restore_secrets`).
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Iterable, Iterator
from typing import Any

# Parts of a name (split at non-letters and camelCase) that make its value a secret: GITHUB_TOKEN, apiKey,
# DB_PASSWORD; not max_tokens or token_limit (their values are counts).
SECRET_PARTS = {"key", "apikey", "token", "secret", "password", "passwd", "pass", "pwd", "credential",
                "credentials", "auth", "authorization", "cookie", "session"}
MASK = "***"
# Shorter values cannot be masked in free text: a key of "x" would blank every x of every output. They are
# still masked wherever miniswe knows where they stand (configs, command lines); `Secrets.short` names them.
MIN_SECRET_LEN = 8


def secret_name(name: str) -> bool:
    """A name whose value is a secret. `api_key_env` and the like name a variable, so they are not."""
    parts = [part.lower() for part in re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+", name)]
    return bool(parts) and parts[-1] != "env" and bool(SECRET_PARTS.intersection(parts))


class Secrets:
    """The secret values of a run (or of every run of a batch), masked wherever text is recorded or shown.

    A value is also masked in its JSON-escaped form, so encoded text can be scrubbed too.
    """

    def __init__(self) -> None:
        self.values: list[str] = []
        self.short: list[str] = []  # where the values too short to mask in free text come from

    def add(self, value: Any, where: str = "") -> None:
        if value is None or isinstance(value, bool):
            return
        value = str(value)
        if not value:
            return
        if len(value) < MIN_SECRET_LEN:
            if where and where not in self.short:
                self.short.append(where)
            return
        for form in (value, json.dumps(value, ensure_ascii=False)[1:-1], shlex.quote(value)):
            if form not in self.values:
                self.values.append(form)
        self.values.sort(key=len, reverse=True)  # a longer secret that contains a shorter one goes first

    def update(self, other: Secrets) -> None:
        for value in other.values:
            if value not in self.values:
                self.values.append(value)
        self.values.sort(key=len, reverse=True)
        self.short += [where for where in other.short if where not in self.short]

    def scrub(self, text: str) -> str:
        for secret in self.values:
            if secret in text:
                text = text.replace(secret, MASK)
        return text

    def __bool__(self) -> bool:
        return bool(self.values)


def run_secrets(config: Any) -> Secrets:
    """Every secret value a run with `config` must never record or print."""
    secrets = Secrets()
    key_env = getattr(config.model, "api_key_env", "")
    if key_env:
        secrets.add(os.environ.get(key_env), f"${key_env} (model.api_key_env)")
    for name in getattr(config.environment, "forward_env", ()):
        secrets.add(os.environ.get(name), f"${name} (environment.forward_env)")
    data = config.to_dict()
    for dotted, value in secret_entries(data):
        secrets.add(value, dotted)
    for arg in _env_assignments(data.get("environment", {}).get("run_args") or []):
        name, _, value = arg.partition("=")
        if secret_name(name):
            secrets.add(value, f"environment.run_args -e {name}")
    return secrets


def secret_entries(config: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every secret-looking entry inside a config's mapping settings (env, params, ...).
    The settings' own names are never secrets: `token_limit` is a number."""
    for section, values in config.items():
        for name, value in (values or {}).items() if isinstance(values, dict) else ():
            if isinstance(value, dict):
                yield from _secret_items(value, f"{section}.{name}.")


def _secret_items(data: dict[str, Any], prefix: str) -> Iterator[tuple[str, Any]]:
    for key, value in data.items():
        if isinstance(value, dict):
            yield from _secret_items(value, f"{prefix}{key}.")
        elif secret_name(str(key)) and not isinstance(value, list):
            yield f"{prefix}{key}", value


def masked_config(config: dict[str, Any]) -> dict[str, Any]:
    """A config as recorded: secret-looking entries of its mapping settings and `-e NAME=value` arguments masked."""
    masked = {}
    for section, values in config.items():
        if not isinstance(values, dict):
            masked[section] = values
            continue
        masked[section] = {
            name: _masked_mapping(value) if isinstance(value, dict)
            else mask_run_args(value) if name == "run_args" and isinstance(value, list) else value
            for name, value in values.items()
        }
    return masked


def _masked_mapping(data: dict[str, Any]) -> dict[str, Any]:
    return {key: _masked_mapping(value) if isinstance(value, dict)
            else MASK if secret_name(str(key)) and value not in (None, "") and not isinstance(value, list) else value
            for key, value in data.items()}


def mask_run_args(args: Iterable[str]) -> list[str]:
    """`docker run` arguments with the values of secret-looking `-e/--env NAME=value` masked."""
    masked, after_env = [], False
    for arg in args:
        flag, eq, value = arg.partition("=")
        if after_env:
            masked.append(_mask_assignment(arg))
        elif flag in ("-e", "--env") and eq:
            masked.append(f"{flag}={_mask_assignment(value)}")
        else:
            masked.append(arg)
        after_env = arg in ("-e", "--env")
    return masked


def _env_assignments(args: list[str]) -> Iterator[str]:
    after_env = False
    for arg in args:
        flag, eq, value = arg.partition("=")
        if after_env:
            yield arg
        elif flag in ("-e", "--env") and eq:
            yield value
        after_env = arg in ("-e", "--env")


def _mask_assignment(assignment: str) -> str:
    name, eq, _ = assignment.partition("=")
    return f"{name}={MASK}" if eq and secret_name(name) else assignment


def mask_command_line(argv: list[str]) -> list[str]:
    """A miniswe command line as recorded: every `-c KEY=VALUE` whose key, or a key inside whose YAML value,
    looks secret is masked, however it is written (`-c environment.env.API_KEY="a b"`,
    `-c 'environment.env={GITHUB_TOKEN: x}'`, `-c environment.run_args=[-e, TOKEN=x]`)."""
    masked, after_config = [], False
    for arg in argv:
        if after_config:
            masked.append(_mask_config_arg(arg))
        elif arg.startswith("--config="):
            masked.append("--config=" + _mask_config_arg(arg[len("--config="):]))
        else:
            masked.append(arg)
        after_config = arg in ("-c", "--config")
    return masked


def _mask_config_arg(arg: str) -> str:
    import yaml

    key, eq, raw = arg.partition("=")
    if not eq or os.path.exists(arg):
        return arg
    path = key.strip().split(".")
    if len(path) >= 3 and secret_name(path[-1]):  # section.mapping.NAME=value
        return f"{key}={MASK}"
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        return arg
    if isinstance(value, dict) and len(path) >= 2:
        masked = _masked_mapping(value)
    elif isinstance(value, list) and path[-1] == "run_args":
        masked = mask_run_args([str(item) for item in value])
    else:
        return arg
    if masked == value:
        return arg
    return f"{key}={yaml.safe_dump(masked, default_flow_style=True, width=1 << 30).strip()}"


def restore_secrets(recorded: dict[str, Any]) -> dict[str, Any]:
    """A recorded config with each masked value taken again from this process's environment, by the same
    variable name (`environment.env.API_TOKEN` from $API_TOKEN); a variable that is not set stays masked,
    which the run then sees as the literal mask."""
    data = json.loads(json.dumps(recorded))
    environment = data.get("environment") or {}
    env = environment.get("env")
    if isinstance(env, dict):
        environment["env"] = {k: os.environ.get(k, v) if v == MASK else v for k, v in env.items()}
    args = environment.get("run_args")
    if isinstance(args, list):
        environment["run_args"] = [_restore_assignment(arg) for arg in args]
    return data


def _restore_assignment(arg: str) -> str:
    prefix, name_value = ("", arg)
    for flag in ("-e=", "--env="):
        if arg.startswith(flag):
            prefix, name_value = flag, arg[len(flag):]
    name, eq, value = name_value.partition("=")
    if eq and value == MASK and name in os.environ:
        return f"{prefix}{name}={os.environ[name]}"
    return arg
