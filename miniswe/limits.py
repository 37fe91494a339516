"""A run's limits: which one (if any) ends the run now, and how long the next wait may last."""

from __future__ import annotations

import time

from miniswe.status import ExitStatus, Outcome
from miniswe.templates import number
from miniswe.usage import Usage

NO_TIMEOUT = 365 * 86400.0  # a command timeout of 0 means none: a year stands in for it


class BudgetWarnings:
    """A hook: each observation says what little is left of a limit, once `agent.budget_warning` of it remains."""

    def __init__(self, limits: Limits, usage: Usage):
        self.limits, self.usage = limits, usage

    def after_command(self, event) -> None:
        left = self.limits.left(self.usage)
        if left:
            event.warnings.append(f"Only {', '.join(left)} left for this task: finish soon, and submit what you have "
                                  "before they run out.")


class Limits:
    """A run's limits. They count from `begin`: the whole run's usage, or (a chat turn) what was used since."""

    def __init__(self, agent: object, started: float | None = None):
        self.agent = agent
        self.started = time.monotonic() if started is None else started
        self.baseline = Usage()  # the usage before this run (or turn) began: not counted against its limits

    def begin(self, baseline: Usage | None = None) -> None:
        """Start counting now; `baseline` is the usage that does not count (a chat session's earlier turns)."""
        self.started = time.monotonic()
        self.baseline = baseline.copy() if baseline is not None else Usage()

    @property
    def deadline(self) -> float | None:
        """When agent.time_limit runs out (time.monotonic), or None."""
        return self.started + self.agent.time_limit if self.agent.time_limit else None

    def time_left(self) -> float:
        deadline = self.deadline
        return deadline - time.monotonic() if deadline is not None else float("inf")

    def command_timeout(self, timeout: float) -> float:
        """The command's own timeout, or the run's time left if that is shorter."""
        return min(timeout or NO_TIMEOUT, self.time_left())

    def reached(self, usage: Usage) -> Outcome | None:
        """The limit that ends the run before its next model call, if any."""
        agent, usage = self.agent, usage.since(self.baseline)
        if agent.step_limit and usage.model_calls >= agent.step_limit:
            return Outcome(ExitStatus.LIMITS_EXCEEDED, f"step_limit: {agent.step_limit} model calls")
        if agent.token_limit and usage.total_tokens >= agent.token_limit:
            return Outcome(ExitStatus.LIMITS_EXCEEDED, f"token_limit: {usage.total_tokens} >= {agent.token_limit} tokens")
        if agent.cost_limit and usage.cost >= agent.cost_limit:
            return Outcome(ExitStatus.LIMITS_EXCEEDED, f"cost_limit: ${usage.cost:.4f} >= ${agent.cost_limit:g}")
        if self.time_left() <= 0:
            return self.out_of_time()
        return None

    def remaining(self, usage: Usage) -> dict[str, float | None]:
        """What is left of each limit (None: no limit): what a sub-agent may use at most."""
        agent, usage = self.agent, usage.since(self.baseline)
        return {
            "step_limit": agent.step_limit - usage.model_calls if agent.step_limit else None,
            "token_limit": agent.token_limit - usage.total_tokens if agent.token_limit else None,
            "cost_limit": round(agent.cost_limit - usage.cost, 8) if agent.cost_limit else None,
            "time_limit": self.time_left() if agent.time_limit else None,
        }

    def left(self, usage: Usage) -> list[str]:
        """What is nearly used up: each limit with no more than `agent.budget_warning` of it left."""
        agent, share = self.agent, self.agent.budget_warning
        if not share:
            return []
        usage = usage.since(self.baseline)
        found = []
        if agent.step_limit and agent.step_limit - usage.model_calls <= share * agent.step_limit:
            found.append(f"{agent.step_limit - usage.model_calls} of {agent.step_limit} model calls")
        if agent.token_limit and agent.token_limit - usage.total_tokens <= share * agent.token_limit:
            found.append(f"{max(agent.token_limit - usage.total_tokens, 0):,} of {agent.token_limit:,} tokens")
        if agent.cost_limit and agent.cost_limit - usage.cost <= share * agent.cost_limit:
            found.append(f"${max(agent.cost_limit - usage.cost, 0):.2f} of ${agent.cost_limit:g}")
        if agent.time_limit and self.time_left() <= share * agent.time_limit:
            found.append(f"{max(self.time_left(), 0):.0f} of {number(agent.time_limit)} seconds")
        return found

    def out_of_time(self, during: str = "") -> Outcome:
        where = f" during {during}" if during else ""
        return Outcome(ExitStatus.TIME_EXCEEDED, f"time_limit of {number(self.agent.time_limit)}s reached{where}")
