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

from miniswe.errors import ConfigError

# Parts of a name (split at non-letters and camelCase) that make its value a secret: GITHUB_TOKEN, apiKey,
# DB_PASSWORD, GH_PAT; also run together (PGPASSWORD, GITHUBTOKEN, OPENAIKEY). Not max_tokens, TOKENIZERS_...,
# PATH, KEYBOARD, MONKEY or GIT_AUTHOR_NAME. A name ending in _ENV (GITLAB_TOKEN_ENV) is masked too: its value
# may be the variable's name, or the secret itself, and masking a name costs nothing.
SECRET_PARTS = {"key", "keys", "apikey", "token", "pat", "pass", "pwd", "auth", "cookie", "session"}
SECRET_INSIDE = ("secret", "password", "passwd", "passphrase", "credential")
# words ending in "key" or "auth" that are no secrets
NOT_KEYS = {"monkey", "donkey", "turkey", "hockey", "jockey", "whiskey", "hotkey"}
NOT_SECRET_NAMES = {"pwd", "oldpwd"}  # the shell's working directories
MASK = "***"
# Shorter values cannot be masked in free text: a key of "x" would blank every x of every output. They are
# still masked wherever miniswe knows where they stand (configs, command lines); `Secrets.short` names them.
MIN_SECRET_LEN = 8


def secret_name(name: str) -> bool:
    """A name whose value is a secret (see SECRET_PARTS)."""
    if name.lower() in NOT_SECRET_NAMES:
        return False
    parts = [part.lower() for part in re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+", name)]
    return any(_secret_part(part) for part in parts)


def _secret_part(part: str) -> bool:
    if part in SECRET_PARTS or any(word in part for word in SECRET_INSIDE):
        return True
    if part.endswith("token") or part.endswith("auth"):  # githubtoken, authtoken, oauth; not tokens, tokenizers
        return True
    if part.startswith("auth") and not part.startswith("author") or part.startswith("authoriz"):
        return True  # authentication, authorization; not author
    return part.endswith("key") and part not in NOT_KEYS  # openaikey, privatekey; not keyboard, monkey


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
        forms = [value, json.dumps(value, ensure_ascii=False)[1:-1], shlex.quote(value)]
        if value.strip() != value and len(value.strip()) >= MIN_SECRET_LEN:
            forms.append(value.strip())  # a key read with its line break is sent without it
        for form in forms:
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

    def scrub_cut(self, text: str, notice: str) -> str:
        """`text` masked, where `notice` marks a cut (the capture kept a head and a tail): a secret the cut went
        through leaves a piece at the end of the head and at the start of the tail; both pieces are masked too,
        however short (a coincidence there costs a few characters next to the cut)."""
        head, found, tail = text.partition(notice) if notice else (text, "", "")
        if not found:
            return self.scrub(text)
        return self.scrub_edges(head, end=True) + notice + self.scrub_edges(tail, start=True)

    def scrub_edges(self, text: str, *, start: bool = False, end: bool = False) -> str:
        """`text` masked, and a piece of a secret it starts with (`start`: what comes after a cut) or ends with
        (`end`: what comes before one) masked too."""
        text = self.scrub(text)
        if start:
            piece = max((k for secret in self.values for k in range(len(secret) - 1, 0, -1)
                         if text.startswith(secret[-k:])), default=0)
            text = MASK + text[piece:] if piece else text
        if end:
            piece = max((k for secret in self.values for k in range(len(secret) - 1, 0, -1)
                         if text.endswith(secret[:k])), default=0)
            text = text[: len(text) - piece] + MASK if piece else text
        return text

    def __bool__(self) -> bool:
        return bool(self.values)


def run_secrets(config: Any) -> Secrets:
    """Every secret value a run with `config` must never record or print."""
    return config_secrets(config.to_dict(), secret_env(config.model))


def secret_env(model: Any) -> list[str]:
    """The variables holding a model's credentials: hidden from the run's commands and masked in its records. The
    model kind's own list when it has one (litellm: every variable its route reads); duck-typed, since the model
    kinds sit above this module."""
    names = model.secret_env() if hasattr(model, "secret_env") else [getattr(model, "api_key_env", "")]
    return [name for name in dict.fromkeys(names) if name]


def config_secrets(config: dict[str, Any], env_names: Iterable[Any] = ()) -> Secrets:
    """The secret values of a config as a mapping (a run's, a recorded one, mini-swe-agent's): every secret-looking
    entry of its mapping settings, every secret-looking `-e NAME=value` of environment.run_args, and the values set
    in this process's environment of the variables it hands a container (environment.forward_env, `-e NAME` run
    arguments) and of `env_names` (the model's key variable)."""
    secrets = Secrets()
    for dotted, value in secret_entries(config):
        secrets.add(value, dotted)
    environment = config.get("environment") if isinstance(config.get("environment"), dict) else {}
    forwarded = environment.get("forward_env") if isinstance(environment.get("forward_env"), list) else []
    names = [(name, "") for name in env_names]
    names += [(name, " (environment.forward_env)") for name in forwarded]
    for where, args in _run_args(config):
        for _, _, assignment in env_options([str(arg) for arg in args]):
            name, eq, value = assignment.partition("=")
            if eq and secret_name(name):
                secrets.add(value, f"{where} -e {name}")
            elif not eq:  # -e NAME hands the container this process's value, as forward_env does
                names.append((name, f" ({where} -e)"))
    for name, where in names:
        if isinstance(name, str) and name:
            secrets.add(os.environ.get(name), f"${name}{where}")
    return secrets


def _run_args(data: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, list[Any]]]:
    """(dotted key, list) of every `run_args` of a config: environment.run_args, and any inside a mapping
    (agent.mini.environment.run_args: a mini-swe-agent config's own section)."""
    for key, value in data.items():
        if isinstance(value, dict):
            yield from _run_args(value, f"{prefix}{key}.")
        elif key == "run_args" and isinstance(value, list):
            yield f"{prefix}{key}", value


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
    # run_args inside a mapping too: agent.mini keeps a mini-swe-agent config's own environment section
    return {key: _masked_mapping(value) if isinstance(value, dict)
            else mask_run_args(value) if key == "run_args" and isinstance(value, list)
            else MASK if secret_name(str(key)) and value not in (None, "") and not isinstance(value, list) else value
            for key, value in data.items()}


def mask_run_args(args: Iterable[str]) -> list[str]:
    """`docker run` arguments with the values of secret-looking `-e/--env NAME=value` masked, however written."""
    masked = [str(arg) for arg in args]
    for index, prefix, assignment in env_options(masked):
        masked[index] = prefix + _mask_assignment(assignment)
    return masked


# `docker run`'s one-letter options that take no value, so more letters may follow them in one argument (-Pe,
# -dit); any other letter takes the rest of the argument (or the next one) as its value, as environments/runargs.py
# reads them
_FLAG_LETTERS = "dPiqt"


def env_options(args: list[str]) -> Iterator[tuple[int, str, str]]:
    """(index, prefix, assignment) of each environment variable that `args` (docker run arguments) set or forward,
    however written: [-e, N=v], [--env, N], -e=N=v, --env=N, -eN=v, -Pe N=v, -PeN=v, -Pe=N=v. The assignment
    (NAME=value, or NAME alone: forwarded) is args[index] with `prefix` removed."""
    index = 0
    while index < len(args):
        arg, index = args[index], index + 1
        if arg.startswith("--env="):
            yield index - 1, "--env=", arg[len("--env="):]
            continue
        if arg == "--env":
            rest = ""
        elif arg.startswith("-") and not arg.startswith("--") and "e" in arg:
            letters = arg[1:].split("e", 1)[0]
            if any(letter not in _FLAG_LETTERS for letter in letters):
                continue  # a letter that takes a value took the rest, the e with it
            rest = arg[len(letters) + 2:]
        else:
            continue
        if rest:
            prefix = arg[: len(arg) - len(rest)] + ("=" if rest.startswith("=") else "")
            yield index - 1, prefix, arg[len(prefix):]
        elif index < len(args):
            yield index, "", args[index]
            index += 1


def _mask_assignment(assignment: str) -> str:
    name, eq, _ = assignment.partition("=")
    return f"{name}={MASK}" if eq and secret_name(name) else assignment


def mask_command_line(argv: list[str]) -> list[str]:
    """A miniswe command line as recorded: every `-c KEY=VALUE` whose key, or a key inside whose YAML value,
    looks secret is masked, however it is written (`-c environment.env.API_KEY="a b"`, `-cenvironment.env.X=y`,
    `--config=...`, `-c 'environment.env={GITHUB_TOKEN: x}'`, `-c 'environment={env: {PASSWORD: x}}'`,
    `-c environment.run_args=[-e, TOKEN=x]`), whatever the value's length."""
    masked, after_config = [], False
    for arg in argv:
        if after_config:
            masked.append(_mask_config_arg(arg))
        elif arg.startswith("--config="):
            masked.append("--config=" + _mask_config_arg(arg[len("--config="):]))
        elif arg.startswith("-c") and len(arg) > 2 and not arg.startswith("--"):
            masked.append("-c" + _mask_config_arg(arg[2:]))
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
        return f"{key}={MASK}" if any(secret_name(part) for part in path[1:]) else arg
    if isinstance(value, dict) and len(path) == 1:  # a whole section: section={env: {...}, run_args: [...]}
        masked = masked_config({path[0]: value})[path[0]]
    elif isinstance(value, dict):
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
    variable name (`environment.env.API_TOKEN` from $API_TOKEN, `model.params.api_key` from $api_key or
    $API_KEY), in every mapping setting; a variable that is not set stays masked (`masked_left` names those
    a model would be sent: a run refuses to start with them, see runner.check_ready)."""
    data = json.loads(json.dumps(recorded))
    for section, values in data.items():
        for name, value in (values or {}).items() if isinstance(values, dict) else ():
            if isinstance(value, dict):
                values[name] = _restored_mapping(value)
    environment = data.get("environment") or {}
    args = environment.get("run_args") if isinstance(environment, dict) else None
    if isinstance(args, list):
        args = [str(arg) for arg in args]
        for index, prefix, assignment in env_options(args):
            name, eq, value = assignment.partition("=")
            if eq and value == MASK and name in os.environ:
                args[index] = f"{prefix}{name}={os.environ[name]}"
        environment["run_args"] = args
    return data


def _restored_mapping(data: dict[str, Any]) -> dict[str, Any]:
    restored = {}
    for key, value in data.items():
        if isinstance(value, dict):
            value = _restored_mapping(value)
        elif value == MASK:
            value = next((os.environ[name] for name in _variables(str(key)) if name in os.environ), value)
        restored[key] = value
    return restored


def _variables(key: str) -> list[str]:
    """The environment variables a masked `key` is taken back from, in order."""
    return list(dict.fromkeys((key, key.upper())))


def masked_left(config: dict[str, Any], sections: Iterable[str] = ("model",)) -> tuple[str, str] | None:
    """(dotted key, variable) of the first value of `sections` still masked: a restored config whose variable
    was not set. A model would be sent the mask itself."""

    def walk(data: dict[str, Any], prefix: str) -> tuple[str, str] | None:
        for key, value in data.items():
            found = walk(value, f"{prefix}{key}.") if isinstance(value, dict) else (
                (f"{prefix}{key}", _variables(str(key))[-1]) if value == MASK else None)
            if found:
                return found
        return None

    for section in sections:
        values = config.get(section)
        if isinstance(values, dict):
            found = walk(values, f"{section}.")
            if found:
                return found
    return None



def forwarded_keys(key_env: Iterable[str], forward_env: Iterable[str], run_args: Iterable[str]) -> list[str]:
    """Where a container's settings hand it one of `key_env` (the model's key variables), set in this process:
    `environment.forward_env NAME` or `environment.run_args -e NAME`. A local run hides that variable from its
    commands; in a container any command could read it, and spend or send it."""
    keys = {name for name in key_env if name and os.environ.get(name)}
    found = [f"environment.forward_env {name}" for name in forward_env if name in keys]
    found += [f"environment.run_args -e {assignment}" for _, _, assignment in env_options([str(a) for a in run_args])
              if assignment in keys]
    return found


def check_forwarded_keys(key_env: Iterable[str], forward_env: Iterable[str], run_args: Iterable[str], *,
                         allow: bool) -> str | None:
    """ConfigError when the container would be handed the model's key (see forwarded_keys), unless `allow`
    (environment.allow_unsafe_run_args): then the notice to record and print, one line."""
    found = forwarded_keys(key_env, forward_env, run_args)
    if not found:
        return None
    if not allow:
        raise ConfigError(f"{found[0]}: hands the model's key to the container, where every command can read it; "
                          "remove it, or set environment.allow_unsafe_run_args: true if you mean it")
    return f"{'; '.join(found)}: the model's key is in the container (environment.allow_unsafe_run_args is set)"
