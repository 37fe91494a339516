"""Keeping secrets out of what miniswe records and prints: the Secrets of a run, masked configs and command
lines, and how a rebuilt config gets its masked values back (from the environment, by name)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from typing import Any

SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH", re.IGNORECASE)
MASK = "***"
# shorter values would mask innocent text (a key of "x" would blank every x in an output)
MIN_SECRET_LEN = 8


class Secrets:
    """The secret values of one run, masked wherever text is recorded or shown.

    A value is also masked in its JSON-escaped form, so text can be scrubbed after encoding.
    """

    def __init__(self, values: Iterable[str] = ()):
        self.values: list[str] = []
        for value in values:
            self.add(value)

    def add(self, value: str | None) -> None:
        if not value or len(value) < MIN_SECRET_LEN:
            return
        for form in (value, json.dumps(value, ensure_ascii=False)[1:-1]):
            if form not in self.values:
                self.values.append(form)
        self.values.sort(key=len, reverse=True)  # a longer secret that contains a shorter one goes first

    def scrub(self, text: str) -> str:
        for secret in self.values:
            if secret in text:
                text = text.replace(secret, MASK)
        return text

    def __bool__(self) -> bool:
        return bool(self.values)


def run_secrets(config: Any) -> Secrets:
    """The values a run must never record: the model's API key."""
    name = getattr(config.model, "api_key_env", "")
    return Secrets([os.environ.get(name, "")] if name else [])


def mask_env(env: dict[str, str]) -> dict[str, str]:
    """Values of secret-looking variable names masked."""
    return {name: MASK if SECRET_NAME.search(name) else value for name, value in env.items()}


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


def masked_config(data: dict[str, Any]) -> dict[str, Any]:
    """A config as recorded: values of secret-looking variables and `-e NAME=value` arguments masked."""
    environment = dict(data.get("environment") or {})
    if isinstance(environment.get("env"), dict):
        environment["env"] = mask_env(environment["env"])
    if isinstance(environment.get("run_args"), list):
        environment["run_args"] = mask_run_args(environment["run_args"])
    return {**data, "environment": environment}


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


def _mask_assignment(assignment: str) -> str:
    name, eq, _ = assignment.partition("=")
    return f"{name}={MASK}" if eq and SECRET_NAME.search(name) else assignment


_ASSIGNMENT = re.compile(r"([A-Za-z_][\w.]*)=([^\s,\]\}'\"]+)")


def mask_assignments(text: str) -> str:
    """`NAME=value` pairs in a command line (`-c environment.env.TOKEN=...`, `-e API_KEY=...`) with
    secret-looking names masked."""
    return _ASSIGNMENT.sub(lambda m: f"{m[1]}={MASK}" if SECRET_NAME.search(m[1].rsplit(".", 1)[-1]) else m[0], text)
