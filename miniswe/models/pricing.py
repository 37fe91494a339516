"""What a call costs when the endpoint does not say: prices per million tokens, for any backend."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field

from miniswe.config import Settings, as_mapping
from miniswe.usage import Usage

Prices = Annotated[dict[Literal["prompt", "completion", "cached"], Annotated[float, Field(ge=0, allow_inf_nan=False)]],
                   BeforeValidator(as_mapping)]


class PriceSettings(Settings):
    prices: Prices = {}  # USD per million tokens when the endpoint reports no cost: {prompt: 3, completion: 15, cached: 0.3}


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
