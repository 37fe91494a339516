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
        step = event.step
        if not self.limit or step.command is None:
            return
        key = (step.command, step.returncode, step.timed_out, step.output)
        self.count = self.count + 1 if key == self.last else 1
        self.last = key
        if self.count > self.limit:
            event.stop = Outcome(ExitStatus.REPEATED_ACTION, f"the same command gave the same output {self.count} times "
                                 f"in a row (agent.max_repeats is {self.limit}): {step.command[:120]}")
        elif self.count == self.limit:
            event.warnings.append(f"You ran this exact command {self.count} times in a row and got the same output "
                                  "each time. Running it once more ends the run: try something different.")
