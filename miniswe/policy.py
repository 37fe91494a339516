"""The command policy: commands refused before they run (and the model told why), commands that need a person's
yes, and whether local commands are confined to the working directory.

A pattern list is not a sandbox: it matches the command's text, with quoted strings and comments taken out,
so `bash -c "rm -rf /"` or a script file gets past it. It stops the obvious accident; a container stops the
rest. Confinement (`policy.confine`) is enforced by the kernel (Linux Landlock), not by patterns.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from miniswe.config import PolicyConfig

# Where a command word can stand: a line's start or after a separator, then any keywords, variable assignments
# and wrappers that run their arguments as a command (sudo, env, nohup, timeout, ...); the word may be a path
# (/bin/rm) or escaped (\rm). A word elsewhere (`grep mkfs`, `man reboot`) is an argument, not a command.
# Each part can match in one way only, so a long command is read in linear time (a wrapper's arguments, and any
# wrappers after it, are one run of words).
AT_COMMAND = (r"(?:^|[;&|({`]|\$\()\s*"
              r"(?:(?:then|do|else|elif|if|while|until|time|!)\s+|\w+=\S*\s+)*"
              r"(?:(?:sudo|doas|nohup|exec|command|builtin|env|nice|ionice|setsid|stdbuf|timeout|xargs)\s+"
              r"(?:[^;&|\n]*\s)?)?"
              r"\\?(?:[\w.-]*/)*")
_END = r"(?=\s|$|[;&|)`])"
_ROOT_OR_HOME = r"(?:/\*?|(?:~|\$HOME|\$\{HOME\})(?:/\*?)?)"

# The built-in rules, by name (policy.deny lists names and regexes; its default, config.DENY_RULES, names these):
# each pattern with what it would do, for the model's refusal message.
DENY = {
    "delete-root-or-home": (AT_COMMAND + r"rm\s+(?:[^;&|\n]*\s)?" + _ROOT_OR_HOME + _END,
                            "deletes the whole file system or the home folder"),
    "mkfs": (AT_COMMAND + r"mkfs(?:\.\w+)?" + _END, "formats a disk"),
    "raw-disk-write": (r"(?:>|\bof=)\s*/dev/(?:sd[a-z]|nvme\d|hd[a-z]|vd[a-z]|xvd[a-z]|mmcblk\d|disk\d|mapper/)",
                       "writes to a raw disk"),
    "fork-bomb": (r"(\w+|:)\s*\(\)\s*\{\s*\1\s*\|\s*\1\s*&\s*\}\s*;?\s*\1", "is a fork bomb"),
    "shutdown": (AT_COMMAND + r"(?:shutdown|reboot|halt|poweroff|init\s+[06]|systemctl\s+(?:reboot|poweroff|halt|kexec))"
                 + _END, "stops or restarts the machine"),
    # -1 as a process id, not as the signal: after a signal option, `--` or a first process id (`kill -1 PID`
    # is a hang-up for one process)
    "kill-all": (AT_COMMAND + r"kill\s+(?:\S+\s+)+-1" + _END, "signals every process the user may signal"),
    "chmod-root": (AT_COMMAND + r"ch(?:mod|own|grp)\s+(?:-\S+\s+)*-\S*R\S*\s+(?:\S+\s+)?/" + _END,
                   "changes permissions of the whole file system"),
}


# A quoted word that still names the root or the home folder: "/" and '/' are `/`; "$HOME" expands in double
# quotes (in single quotes, or as "~", it is a name in the working directory)
_QUOTED_TARGET = re.compile(r"\"(/|\$HOME/?|\$\{HOME\}/?)\"|'(/)'")


def _unquoted(command: str) -> str:
    """The command with quoted strings and comments taken out (`echo "rm -rf /"` prints, it does not delete),
    except quoted words that are the root or the home folder (`rm -rf "$HOME"` deletes it)."""
    text = re.sub(r"'[^']*'|\"(?:\\.|[^\"\\])*\"",
                  lambda m: next((g for g in _QUOTED_TARGET.fullmatch(m.group()).groups() if g), "")
                  if _QUOTED_TARGET.fullmatch(m.group()) else "''", command)
    return re.sub(r"(?:^|(?<=\s))#[^\n]*", "", text)


class CommandPolicy:
    """A hook: refuses denied commands, and those that need a yes when `ask` gives none (or is missing)."""

    def __init__(self, config: PolicyConfig, *, environment_kind: str,
                 ask: Callable[[str, str], bool] | None = None):
        self.applies = environment_kind == "local" or config.containers
        self.deny = [(entry, re.compile(DENY[entry][0] if entry in DENY else entry, re.M),
                      DENY[entry][1] if entry in DENY else "matches policy.deny") for entry in config.deny]
        self.confirm = [re.compile(pattern, re.M) for pattern in config.confirm]
        self.ask = ask

    def needs_confirmation(self, command: str) -> str | None:
        """The confirm pattern `command` matches, if any (chat asks for these even in yolo mode)."""
        text = _unquoted(command)
        return next((p.pattern for p in self.confirm if p.search(text)), None) if self.applies else None

    def before_command(self, event) -> None:
        if not self.applies or event.veto or getattr(event, "tool", "bash") not in ("bash", "submit"):
            return  # the file tools are confined to the working directory; their rendering is not shell
        event.veto = self._denied(event.command)
        if event.veto:
            return
        pattern = self.needs_confirmation(event.command)
        if pattern and not (self.ask and self.ask(event.command, pattern)):
            event.veto = (f"refused: the command policy wants a person's yes for this command (policy.confirm: "
                          f"{pattern}), and {'the person said no' if self.ask else 'nobody is here to say it'}.")

    def rewritten(self) -> RewrittenCommands:
        """The hook that reads a command again after the hooks between (a plugin, a person's edit) rewrote it."""
        return RewrittenCommands(self)

    def _denied(self, command: str) -> str | None:
        text = _unquoted(command)
        for entry, pattern, why in self.deny:
            if pattern.search(text):
                return f"refused by the command policy: it {why} (policy.deny: {entry}). Do the task another way."
        return None


class RewrittenCommands:
    """Last before a command runs: what a hook or a person rewrote is read by policy.deny too, so no rewrite runs
    a denied command. (A person's own edit is their yes: policy.confirm is not asked again.)"""

    def __init__(self, policy: CommandPolicy):
        self.policy = policy

    def before_command(self, event) -> None:
        if self.policy.applies and not event.veto and event.command != event.proposed:
            event.veto = self.policy._denied(event.command)
