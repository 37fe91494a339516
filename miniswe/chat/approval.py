"""Approval modes as a before_command hook: in `confirm` each command is shown and the person says y (run it),
n (a reason, which the model is told), or e (edit it: the edited command runs, and the step records the
model's as `proposed`); `yolo` runs everything; in `human` the person types the commands. A command that
`policy.confirm` matches is asked about in every mode."""

from __future__ import annotations

from typing import Any

from miniswe.signals import Stop
from miniswe.status import interrupted

MODES = ("confirm", "yolo", "human")


class Approval:
    def __init__(self, editor: Any, console: Any, stop: Stop, mode: str = "confirm"):
        self.editor = editor
        self.console = console
        self.stop = stop
        self.mode = mode
        self._flagged: str | None = None  # the policy.confirm pattern the command being decided matches

    def policy_ask(self, command: str, pattern: str) -> bool:
        """The command policy's question (policy.confirm matched): deferred to `before_command`, which runs next
        in the same hook chain and always asks about a flagged command."""
        self._flagged = pattern
        return True

    def before_command(self, event: Any) -> None:
        flagged, self._flagged = self._flagged, None
        if event.veto or not (flagged or self.mode == "confirm"):
            return
        if flagged:
            self.console.line(f"policy.confirm matches this command ({flagged}): it runs only if you say yes", "error")
        try:
            self._ask(event)
        except (KeyboardInterrupt, EOFError):
            event.veto = "the person stopped before this command ran"
            self.stop.request(interrupted("SIGINT"))

    def _ask(self, event: Any) -> None:
        while True:
            answer = self.editor.read("Run it? [y]es / [n]o / [e]dit: ").strip().lower()
            if answer in ("y", "yes"):
                return
            if answer in ("n", "no"):
                reason = " ".join(self.editor.read("Why not? (the model is told): ").split())
                event.veto = f"the person said no: {reason}" if reason else "the person said no"
                return
            if answer in ("e", "edit"):
                edited = self.editor.read("edit (Ctrl+J: new line, Enter: run)> ", default=event.command).strip()
                if edited:
                    event.command = edited
                    return
                self.console.line("an empty command runs nothing: y, n or e", "error")
                continue
            self.console.line("answer y, n or e", "error")
