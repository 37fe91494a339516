"""The command policy: commands refused before they run (and the model told why), commands that need a person's
yes, and whether local commands are confined to the working directory.

A pattern list is not a sandbox: it matches the command's text, with quoted strings and comments taken out,
so `bash -c "rm -rf /"` or a script file gets past it. It stops the obvious accident; a container stops the
rest. Confinement (`policy.confine`) is enforced by the kernel (Linux Landlock), not by patterns.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

# Each pattern with what it would do, for the model's refusal message.
DENY = {
    r"(?:^|[;&|({]\s*|\bsudo\s+|\bxargs\s+)rm\s+(?:[^;&|\n]*\s)?(?:/|/\*|~|~/|~/\*|\$HOME|\$\{HOME\}|\$HOME/\*)(?=\s|$|[;&|)])":
        "deletes the whole file system or the home folder",
    r"\bmkfs(?:\.\w+)?\b": "formats a disk",
    r"(?:>|\bof=)\s*/dev/(?:sd[a-z]|nvme\d|hd[a-z]|vd[a-z]|xvd[a-z]|mmcblk\d|disk\d|mapper/)": "writes to a raw disk",
    r"(\w+|:)\s*\(\)\s*\{\s*\1\s*\|\s*\1\s*&\s*\}\s*;?\s*\1": "is a fork bomb",
    r"(?:^|[;&|({]\s*|\bsudo\s+)(?:shutdown|reboot|halt|poweroff|init\s+[06]|systemctl\s+(?:reboot|poweroff|halt|kexec))\b":
        "stops or restarts the machine",
    r"\bkill\s+(?:-\S+\s+)*-1(?=\s|$|[;&|)])": "signals every process the user may signal",
    r"\bch(?:mod|own|grp)\s+(?:-\S*\s+)*-\S*R\S*\s+(?:\S+\s+)?/(?=\s|$|[;&|)])": "changes permissions of the whole file system",
}


@dataclass(frozen=True)
class PolicyConfig:
    deny: list[str] = field(default_factory=lambda: list(DENY), metadata={"regexes": True})  # regexes: a matching command is refused, the model is told why, and the run goes on
    confirm: list[str] = field(default_factory=list, metadata={"regexes": True})  # regexes: a matching command runs only when a person says yes (chat); refused where nobody is asked
    containers: bool = False  # apply deny and confirm in containers too (there the container is the sandbox)
    confine: bool = False  # local: commands may write only in the working directory and /tmp (Linux Landlock)


def _unquoted(command: str) -> str:
    """The command with quoted strings and comments taken out: `echo "rm -rf /"` prints, it does not delete."""
    text = re.sub(r"'[^']*'|\"(?:\\.|[^\"\\])*\"", "''", command)
    return re.sub(r"(?:^|(?<=\s))#[^\n]*", "", text)


class CommandPolicy:
    """A hook: refuses denied commands, and those that need a yes when `ask` gives none (or is missing)."""

    def __init__(self, config: PolicyConfig, *, environment_kind: str,
                 ask: Callable[[str, str], bool] | None = None):
        self.applies = environment_kind == "local" or config.containers
        self.deny = [(re.compile(pattern, re.M), DENY.get(pattern, "matches policy.deny")) for pattern in config.deny]
        self.confirm = [re.compile(pattern, re.M) for pattern in config.confirm]
        self.ask = ask

    def needs_confirmation(self, command: str) -> str | None:
        """The confirm pattern `command` matches, if any (chat asks for these even in yolo mode)."""
        text = _unquoted(command)
        return next((p.pattern for p in self.confirm if p.search(text)), None) if self.applies else None

    def before_command(self, event) -> None:
        if not self.applies or event.veto or getattr(event, "tool", "bash") not in ("bash", "submit"):
            return  # the file tools are confined to the working directory; their rendering is not shell
        text = _unquoted(event.command)
        for pattern, why in self.deny:
            if pattern.search(text):
                event.veto = (f"refused by the command policy: it {why} (policy.deny: {pattern.pattern}). "
                              "Do the task another way.")
                return
        pattern = self.needs_confirmation(event.command)
        if pattern and not (self.ask and self.ask(event.command, pattern)):
            event.veto = (f"refused: the command policy wants a person's yes for this command (policy.confirm: "
                          f"{pattern}), and {'the person said no' if self.ask else 'nobody is here to say it'}.")
