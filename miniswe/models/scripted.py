"""A model that answers from a list of replies: for tests and the offline demo, chosen by config."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from miniswe.config import TOO_DEEP, ModelConfig, Text
from miniswe.errors import ConfigError, ModelError
from miniswe.models import Reply, ToolCall
from miniswe.usage import call_usage


class ScriptedConfig(ModelConfig):
    kind: str = "scripted"
    script: Text = ""  # YAML/JSON list of replies: strings, or {content, reasoning, finish_reason, usage, cost, tool_calls}


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
    except RecursionError:
        raise ConfigError(f"model.script: {path}: {TOO_DEEP}") from None
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
        self._position = [calls_made]  # a continued run goes on with the reply after the last one it used

    @property
    def calls(self) -> int:
        return self._position[0]

    def for_child(self, **_: Any) -> ScriptedModel:
        """A sub-agent's model: it answers from the same list, going on where the parent is (the parent waits
        while its sub-agent runs), so one script holds a whole chain's replies in the order they are asked for."""
        child = ScriptedModel.__new__(ScriptedModel)
        child.source, child.replies, child._position = self.source, self.replies, self._position
        return child

    def describe(self) -> dict[str, Any]:
        return {"kind": "scripted", "script": self.source, "replies": len(self.replies)}

    def complete(self, messages: Sequence[dict[str, Any]], *, deadline: float | None = None,
                 tools: Sequence[dict[str, Any]] | None = None) -> Reply:
        if self.calls >= len(self.replies):
            raise ModelError(f"scripted model: no reply left for call {self.calls + 1}; add replies to {self.source}")
        item = self.replies[self.calls]
        self._position[0] += 1
        if isinstance(item, str):
            item = {"content": item}
        content = str(item.get("content") or "")
        calls = [_tool_call(call, index) for index, call in enumerate(item.get("tool_calls") or [])]
        given = item.get("usage") if isinstance(item.get("usage"), dict) else {}
        usage, refused = call_usage(
            given.get("prompt_tokens", sum(len(m.get("content") or "") for m in messages) // 4),
            given.get("completion_tokens", len(content) // 4 + 1),
            given.get("total_tokens"), given.get("cached_tokens"), item.get("cost", given.get("cost")),
        )
        return Reply(
            content=content,
            reasoning=item.get("reasoning"),
            finish_reason=item.get("finish_reason", "tool_calls" if calls else "stop"),
            usage=usage,
            warnings=[f"the script's usage figures were refused, counted as 0: {', '.join(refused)}"] if refused else [],
            tool_calls=calls,
        )


def _tool_call(item: Any, index: int) -> ToolCall:
    """A scripted tool call: {name, arguments (a mapping, or the raw text a model might send), id}."""
    item = item if isinstance(item, dict) else {}
    arguments = item.get("arguments", {})
    return ToolCall(str(item.get("id") or f"call_{index + 1}"), str(item.get("name") or ""),
                    arguments if isinstance(arguments, str) else json.dumps(arguments))
