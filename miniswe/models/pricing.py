"""What a call costs when the endpoint does not say: prices per million tokens, for any backend."""

from __future__ import annotations

from dataclasses import dataclass, field

from miniswe.usage import Usage

PRICE_KEYS = ("prompt", "completion", "cached")


@dataclass(frozen=True)
class PriceSettings:
    prices: dict[str, float] = field(default_factory=dict, metadata={"keys": PRICE_KEYS})  # USD per million tokens when the endpoint reports no cost: {prompt: 3, completion: 15, cached: 0.3}


def price(usage: Usage, prices: dict[str, float]) -> float:
    """USD for a call's tokens; cached prompt tokens at the cached price (the prompt price if none is given)."""
    if not prices:
        return 0.0
    uncached = max(usage.prompt_tokens - usage.cached_tokens, 0)
    cached_price = prices.get("cached", prices.get("prompt", 0.0))
    return (
        uncached * prices.get("prompt", 0.0)
        + usage.cached_tokens * cached_price
        + usage.completion_tokens * prices.get("completion", 0.0)
    ) / 1e6
