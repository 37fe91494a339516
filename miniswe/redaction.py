"""Keeping secrets out of what miniswe records: variable values by name, `-e NAME=value` arguments, the API key."""

from __future__ import annotations

import re
from collections.abc import Iterable

SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH", re.IGNORECASE)
MASK = "***"
# shorter values would mask innocent text (a key of "x" would blank every x in an output)
MIN_SECRET_LEN = 8


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


def _mask_assignment(assignment: str) -> str:
    name, eq, _ = assignment.partition("=")
    return f"{name}={MASK}" if eq and SECRET_NAME.search(name) else assignment


def scrub(text: str, secrets: Iterable[str]) -> str:
    """`text` with every secret value replaced by the mask."""
    for secret in secrets:
        if len(secret) >= MIN_SECRET_LEN and secret in text:
            text = text.replace(secret, MASK)
    return text


_ASSIGNMENT = re.compile(r"([A-Za-z_][\w.]*)=([^\s,\]\}'\"]+)")


def mask_assignments(text: str) -> str:
    """`NAME=value` pairs in a command line (`-c environment.env.TOKEN=...`, `-e API_KEY=...`) with
    secret-looking names masked."""
    return _ASSIGNMENT.sub(lambda m: f"{m[1]}={MASK}" if SECRET_NAME.search(m[1].rsplit(".", 1)[-1]) else m[0], text)
