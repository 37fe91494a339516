"""Chat's agent: the same loop, driven a turn at a time. Each turn is the person's message, then the loop until
an outcome (its limits count the turn only: the trajectory keeps the session's totals); in human mode a turn is
one command the person typed, run and recorded as the model's would be, with no model call."""

from __future__ import annotations

from miniswe.agent import Agent
from miniswe.hooks import RunStart
from miniswe.status import Outcome


class ChatAgent(Agent):
    def turn(self, task: str) -> Outcome:
        """A chat turn: the person's message (rendered like a run's task), then the loop until an outcome. Hooks
        see the turn as a run: it starts (with its new messages) and ends (with its outcome)."""
        first = self._open_turn()
        first.append({"role": "user", "content": self.render("instance.j2", task=task, instance={})})
        self.messages += first
        self.hooks("on_run_start", RunStart(task, first))
        return self._loop()

    def act(self, command: str) -> Outcome | None:
        """A step whose command the person typed (chat's human mode), shown to the model in the conversation as
        typed by the person. The step's outcome: a submission, a stop, or None."""
        first = self._open_turn()
        self.messages += first
        self.hooks("on_run_start", RunStart(command, first))
        reply, action = self.protocol.typed(command, len(self.trajectory.steps) + 1)
        return self._until_end(lambda: self.ctx.stop.outcome or self.execute_actions(reply, action))

    def _open_turn(self) -> list[dict[str, str]]:
        """The turn's limits start counting; a step the last turn left cut short is told; the system message,
        when the conversation has none yet (a session's first turn, or after /clear)."""
        self.limits.begin(self.trajectory.usage)
        self.format_errors = 0  # malformed replies in a row count within a turn, as the other limits do
        self.trajectory.describe(model=self.model.describe())
        if self.messages:
            self.settle()
            return []
        return [{"role": "system", "content": self.render("system.j2")}]
