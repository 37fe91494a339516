"""A model that answers from a list of replies: for tests and the offline demo, chosen by config."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from miniswe.config import ModelConfig
from miniswe.errors import ConfigError, ModelError
from miniswe.models import Reply, Usage


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
    def __init__(self, config: ModelConfig, replies: Sequence[Any] | None = None, **_: Any):
        if replies is None:
            if not config.script:
                raise ConfigError("model.script: the scripted model needs a file of replies (model.script=FILE)")
            replies = load_script(config.script)
        self.source = config.script or "the given replies"
        self.replies = list(replies)
        self.calls = 0

    def describe(self) -> dict[str, Any]:
        return {"kind": "scripted", "script": self.source, "replies": len(self.replies)}

    def complete(self, messages: Sequence[dict[str, str]]) -> Reply:
        if self.calls >= len(self.replies):
            raise ModelError(f"scripted model: no reply left for call {self.calls + 1}; add replies to {self.source}")
        item = self.replies[self.calls]
        self.calls += 1
        if isinstance(item, str):
            item = {"content": item}
        content = str(item.get("content") or "")
        prompt = sum(len(m["content"]) for m in messages) // 4
        usage = Usage(prompt_tokens=prompt, completion_tokens=len(content) // 4 + 1)
        for key, value in (item.get("usage") or {}).items():
            setattr(usage, key, value)
        usage.total_tokens = usage.total_tokens or usage.prompt_tokens + usage.completion_tokens
        usage.cost = float(item.get("cost", usage.cost))
        return Reply(
            content=content,
            reasoning=item.get("reasoning"),
            finish_reason=item.get("finish_reason", "stop"),
            usage=usage,
        )
