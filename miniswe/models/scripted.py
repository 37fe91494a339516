"""A model that answers from a list of replies: for tests and the offline demo, chosen by config."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from miniswe.errors import ConfigError, ModelError
from miniswe.models import ModelConfig, Reply
from miniswe.usage import call_usage


@dataclass(frozen=True)
class ScriptedConfig(ModelConfig):
    kind: str = "scripted"
    script: str = ""  # YAML/JSON list of replies: strings, or {content, reasoning, finish_reason, usage, cost}


def load_script(path: str) -> list[Any]:
    """Replies from a JSON or YAML list: each a string, or a mapping with at least `content`."""
    import yaml

    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as error:
        raise ConfigError(f"model.script: cannot read {path}: {error.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"model.script: {path} is not UTF-8 text") from None
    try:
        replies = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as error:
        raise ConfigError(f"model.script: {path} is not valid {'JSON' if path.endswith('.json') else 'YAML'}: "
                          f"{' '.join(str(error).split())[:160]}") from None
    if not isinstance(replies, list):
        raise ConfigError(f"model.script: {path} must hold a list of replies")
    for index, item in enumerate(replies):
        if not isinstance(item, (str, dict)):
            raise ConfigError(f"model.script: {path}: reply {index + 1} is {type(item).__name__}; "
                              "write a string or a mapping with `content`")
    return replies


class ScriptedModel:
    config_class = ScriptedConfig

    def __init__(self, config: ScriptedConfig, *, replies: Sequence[Any] | None = None, calls_made: int = 0, **_: Any):
        if replies is None:
            if not config.script:
                raise ConfigError("model.script: the scripted model needs a file of replies (model.script=FILE)")
            replies = load_script(config.script)
        self.source = config.script or "the given replies"
        self.replies = list(replies)
        self.calls = calls_made  # a continued run goes on with the reply after the last one it used

    def describe(self) -> dict[str, Any]:
        return {"kind": "scripted", "script": self.source, "replies": len(self.replies)}

    def complete(self, messages: Sequence[dict[str, str]], *, deadline: float | None = None) -> Reply:
        if self.calls >= len(self.replies):
            raise ModelError(f"scripted model: no reply left for call {self.calls + 1}; add replies to {self.source}")
        item = self.replies[self.calls]
        self.calls += 1
        if isinstance(item, str):
            item = {"content": item}
        content = str(item.get("content") or "")
        given = item.get("usage") if isinstance(item.get("usage"), dict) else {}
        usage, refused = call_usage(
            given.get("prompt_tokens", sum(len(m["content"]) for m in messages) // 4),
            given.get("completion_tokens", len(content) // 4 + 1),
            given.get("total_tokens"), given.get("cached_tokens"), item.get("cost", given.get("cost")),
        )
        return Reply(
            content=content,
            reasoning=item.get("reasoning"),
            finish_reason=item.get("finish_reason", "stop"),
            usage=usage,
            warnings=[f"the script's usage figures were refused, counted as 0: {', '.join(refused)}"] if refused else [],
        )
