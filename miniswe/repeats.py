"""Loop detection: the same command giving the same output again and again is a model going in circles.

At `agent.max_repeats` identical steps in a row the model is warned; one more ends the run as
RepeatedAction. A changed output resets the count (polling is progress), and so does any other command.
"""

from __future__ import annotations

from miniswe.status import ExitStatus, Outcome


class RepeatDetector:
    def __init__(self, limit: int):
        self.limit = limit
        self.last: tuple | None = None
        self.count = 0

    def on_run_start(self, event) -> None:
        """A new run, or a chat turn: the person spoke, so repeating an earlier command is not going in circles."""
        self.last, self.count = None, 0

    def after_command(self, event) -> None:
        verdict = self._see(event.step)
        if isinstance(verdict, Outcome):
            event.stop = verdict
        elif verdict:
            event.warnings.append(verdict)

    def recall(self, steps) -> Outcome | None:
        """Take up a recorded run's steps (a resume): the count goes on from them, and the end their last one
        brought, if it did, is returned."""
        self.last, self.count = None, 0
        verdict = None
        for step in steps:
            verdict = self._see(step)
        return verdict if isinstance(verdict, Outcome) else None

    def _see(self, step) -> Outcome | str | None:
        """Count a step: the end it brings, the warning it earns, or nothing."""
        if not self.limit or step.command is None:
            return None
        key = (step.command, step.returncode, step.timed_out, step.output)
        self.count = self.count + 1 if key == self.last else 1
        self.last = key
        if self.count > self.limit:
            return Outcome(ExitStatus.REPEATED_ACTION, f"the same command gave the same output {self.count} times "
                           f"in a row (agent.max_repeats is {self.limit}): {step.command[:120]}")
        if self.count == self.limit:
            return (f"You ran this exact command {self.count} times in a row and got the same output "
                    "each time. Running it once more ends the run: try something different.")
        return None
