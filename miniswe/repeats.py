"""Loop detection: the same command giving the same output again and again is a model going in circles.

At `agent.max_repeats` identical steps in a row the model is warned; one more ends the run as
RepeatedAction. A changed output resets the count (polling is progress), and so does any other command.
Commands are compared as the shell reads them: `ls`, ` ls ` and `ls  # try 2` are the same command.
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
        last, seen = self.last, (step.command, step.returncode, step.timed_out, step.output)
        # the command is read as the shell would only when the rest is the same (most steps' outputs differ)
        same = last is not None and last[1:] == seen[1:] and (
            last[0] == step.command or shell_words(last[0]) == shell_words(step.command))
        self.count = self.count + 1 if same else 1
        self.last = seen
        if self.count > self.limit:
            return Outcome(ExitStatus.REPEATED_ACTION, f"the same command gave the same output {self.count} times "
                           f"in a row (agent.max_repeats is {self.limit}): {step.command[:120]}")
        if self.count == self.limit:
            return (f"You ran this command {self.count} times in a row and got the same output "
                    "each time. Running it once more ends the run: try something different.")
        return None


def shell_words(command: str) -> str:
    """`command` without what the shell ignores: comments, and runs of blanks between words (a model varies
    these to get past an exact-text comparison, and a changing `# try 2` changes nothing that runs). Quoted
    text, `$#`, `${#x}` and a here-document's body are kept as they are."""
    out: list[str] = []
    word_start = True  # a `#` starts a comment only where a word could start
    heredoc = False
    i, n = 0, len(command)
    while i < n:
        c = command[i]
        if c in " \t" or command.startswith("\\\n", i):  # a line continuation is a blank too
            while i < n and (command[i] in " \t" or command.startswith("\\\n", i)):
                i += 2 if command[i] == "\\" else 1
            if out and out[-1] != "\n":
                out.append(" ")
            word_start = True
            continue
        if c == "\n":
            if out and out[-1] == " ":
                out.pop()
            if out and out[-1] != "\n":
                out.append("\n")
            word_start = True
            i += 1
            if heredoc:
                out.append(command[i:])  # a here-document's body is data, not shell: kept whole
                break
            continue
        if c == "#" and word_start:
            while i < n and command[i] != "\n":
                i += 1
            continue
        start = i
        if c == "\\":
            i += 2
        elif c == "'":
            end = command.find("'", i + 1)
            i = n if end < 0 else end + 1
        elif c == '"' or command.startswith("$'", i):
            quote = command[i + 1] if c == "$" else c
            i += 2 if c == "$" else 1
            while i < n and command[i] != quote:
                i += 2 if command[i] == "\\" else 1
            i = min(i + 1, n)
        else:
            heredoc = heredoc or command.startswith("<<", i)
            i += 1
        out.append(command[start:i])
        word_start = c in ";&|()<>"
    while out and out[-1] in (" ", "\n"):
        out.pop()
    return "".join(out)

