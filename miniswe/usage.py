"""What model calls cost: tokens, money, calls and retries, for one call or summed over a run."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

# A reported figure above these is a broken or hostile endpoint, not a real call: it would make limits useless.
MAX_TOKENS_PER_CALL = 100_000_000
MAX_COST_PER_CALL = 10_000.0


@dataclass
class Usage:
    model_calls: int = 0
    retries: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cached_tokens: int = 0
    cost: float = 0.0
    estimated_tokens: int = 0  # of total_tokens, those counted here because the endpoint reported none

    def add(self, other: Usage) -> None:
        for key in _KEYS:
            setattr(self, key, getattr(self, key) + getattr(other, key))
        self.cost = round(self.cost, 8)

    def since(self, earlier: Usage) -> Usage:
        """What was used after `earlier` was this usage's value (a chat turn's share of the session's totals)."""
        used = Usage(**{key: getattr(self, key) - getattr(earlier, key) for key in _KEYS})
        used.cost = round(used.cost, 8)
        return used

    def copy(self) -> Usage:
        return Usage(**self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in _KEYS}  # asdict's deep copy costs more, at every save

    @classmethod
    def from_dict(cls, data: Any) -> Usage:
        """From a recorded mapping; missing or unreadable figures count as 0."""
        data = data if isinstance(data, dict) else {}
        usage = cls()
        for key in _KEYS:
            value = figure(data.get(key))
            if value is not None:
                setattr(usage, key, float(value) if key == "cost" else int(value))
        return usage


_KEYS = tuple(f.name for f in fields(Usage))
CHARS_PER_TOKEN = 3  # for counting what an endpoint did not: a little over, as a token limit should err


def estimated_usage(sent_chars: int, written_chars: int) -> Usage:
    """One call's usage counted from its characters, for an endpoint that sends none (a stream that ignores
    stream_options): limits still apply, and the record says the figures are estimates."""
    prompt, completion = -(-sent_chars // CHARS_PER_TOKEN), -(-written_chars // CHARS_PER_TOKEN)
    return Usage(model_calls=1, prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
                 estimated_tokens=prompt + completion)


def figure(value: Any) -> float | None:
    """A reported number as a float; None for anything that is not a finite number."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def call_usage(prompt: Any, completion: Any, total: Any = None, cached: Any = None, cost: Any = None,
               *, price: Any = None) -> tuple[Usage, list[str]]:
    """One call's usage from what an endpoint reported, and the figures refused (negative, absurd, not numbers).

    A refused figure counts as 0 (or as the sum of its parts, for the total): summing it as given would make
    token and cost limits useless. `price(usage)` gives the cost when none was reported.
    """
    refused: list[str] = []

    def sane(name: str, value: Any, ceiling: float) -> float | None:
        if value is None:
            return None
        number = figure(value)
        if number is None or number < 0 or number > ceiling:
            refused.append(f"{name}={value!r:.40}")
            return None
        return number

    usage = Usage(model_calls=1)
    usage.prompt_tokens = int(sane("prompt_tokens", prompt, MAX_TOKENS_PER_CALL) or 0)
    usage.completion_tokens = int(sane("completion_tokens", completion, MAX_TOKENS_PER_CALL) or 0)
    usage.cached_tokens = int(sane("cached_tokens", cached, MAX_TOKENS_PER_CALL) or 0)
    reported_total = sane("total_tokens", total, MAX_TOKENS_PER_CALL)
    usage.total_tokens = int(reported_total or usage.prompt_tokens + usage.completion_tokens)
    reported_cost = sane("cost", cost, MAX_COST_PER_CALL)
    usage.cost = reported_cost if reported_cost is not None else (price(usage) if price else 0.0)
    return usage, refused
