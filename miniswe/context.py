"""A run's context: built once per run, the one owner of what every part of the run must agree on.

- the clock and the budget (`limits`): when agent.time_limit runs out, and what is left of steps, tokens and
  cost as counted so far. Setup, evaluation, model calls, retry waits, the call gate, compaction, sub-agents
  and tools read time and budget here, and nowhere else.
- the run's secrets: computed here and nowhere else for a run, masked at three boundaries only: what the
  model sees (command outputs), what is written (the record), what is printed (the guarded streams).
- the stop, the record (the trajectory: the one writer of the run's file), and the people: notify and ask.

The runner builds it (runner.py); the agent, its tools and its sub-agents are handed it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from miniswe.limits import Limits
from miniswe.redaction import Secrets, run_secrets
from miniswe.signals import Stop
from miniswe.templates import Renderer
from miniswe.trajectory import Trajectory


@dataclass
class RunContext:
    config: Any
    trajectory: Trajectory
    secrets: Secrets
    stop: Stop
    limits: Limits
    renderer: Renderer
    notify: Callable[[str], None] = lambda message: None
    ask: Callable[[str, str], bool] | None = None  # ask(command, pattern): a person's yes for policy.confirm
    hooks: Sequence[Any] = ()  # the caller's observers (display, batch progress, approval)
    on_delta: Callable[[str, str], None] | None = None  # each piece of a streamed reply, as it arrives
    depth: int = 0  # how deep a sub-agent this run is
    delegation: Any = None  # the run's sub-agents (subagents.Delegation), when it may start them
    extra: dict[str, Any] = field(default_factory=dict)  # what a caller's own agent kind needs besides

    @classmethod
    def open(cls, config: Any, trajectory: Trajectory, *, known_secrets: Secrets | None = None, stop: Stop | None = None,
             renderer: Renderer | None = None, elapsed: float = 0.0, **others: Any) -> RunContext:
        """The context of a run recorded in `trajectory`: its secrets (the run's own and `known_secrets`, a batch's)
        masked in the record and on the console from now on; its clock started `elapsed` seconds ago (a resumed
        run's earlier time counts)."""
        from miniswe.output import add_secrets

        secrets = run_secrets(config)
        if known_secrets:
            secrets.update(known_secrets)
        trajectory.set_redaction(secrets.scrub)
        add_secrets(secrets)
        return cls(config, trajectory, secrets, stop or Stop(),
                   Limits(config.agent, started=time.monotonic() - elapsed),
                   renderer or Renderer(config.agent.templates_dir), **others)

    def warn(self, message: str) -> None:
        """A warning the record keeps and the person is told."""
        self.trajectory.warn(message)
        self.notify(f"warning: {message}")
