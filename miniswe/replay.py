"""Replay: a recorded run's commands executed again, in order, in a fresh environment, each output compared
with the recorded one; the first divergence is reported. Used by `miniswe replay`, and to rebuild an
environment's state before a resumed or forked run goes on (a container does not outlive its run)."""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from miniswe.environments import CommandResult, Environment
from miniswe.environments.capture import elision_notice
from miniswe.limits import NO_TIMEOUT
from miniswe.signals import Stop
from miniswe.trajectory import Step, Trajectory, new_run_id

DIFF_LINES = 20
MASK = "<varies>"
# A step the recording cut short runs again for as long as it ran then; this long when that is unknown (a
# command miniswe was killed during records no duration).
CUT_SHORT_UNKNOWN_S = 2.0


@dataclass(frozen=True)
class Divergence:
    where: str  # "step 4", "setup command 1"
    what: str  # what differs, in a few words
    diff: str = ""  # a short unified diff of the outputs

    def __str__(self) -> str:
        return f"{self.where}: {self.what}"


@dataclass(frozen=True)
class Checked:
    """One re-executed command and how it compared."""

    where: str
    command: str
    divergence: Divergence | None
    note: str = ""  # e.g. the recording kept only head and tail of the output
    compared: bool = True  # False: ran (or not) without its output compared (a step the recording cut short)
    ends: bool = False  # the replay ends here, before the recording does (a step that ran a sub-agent)


def rerun(
    env: Environment,
    trajectory: Trajectory,
    *,
    masks: Sequence[str],
    stop: Stop,
    timeout: float,
    until: int | None = None,
    scrub: Callable[[str], str] = lambda text: text,
    on_check: Callable[[Checked], None] = lambda checked: None,
    read_limit: int = 10_000,
) -> tuple[int, Divergence | None]:
    """Run the recorded setup commands and steps' commands in `env`, up to step `until`; (commands checked,
    the first divergence or None). Format errors and refused commands ran nothing and are skipped; a step the recording cut short
    (aborted) ends the replay there, since the original run ended there too. A file tool's call runs again as
    the same worker command; a skill read changes nothing and is skipped; a step that ran a sub-agent ends the
    replay (its model calls are not made again). `read_limit`: read_file's ceiling in the recorded run."""
    patterns = [re.compile(mask) for mask in masks]
    checked = 0
    for index, record in enumerate(trajectory.setup, 1):
        result = _execute(env, record.command, timeout, stop)
        where = f"setup command {index}"
        divergence = None
        if result.returncode != record.returncode:
            divergence = Divergence(where, f"return code {record.returncode} in the recording, {result.returncode} now",
                                    _diff(record.output, scrub(result.output)[-len(record.output or "x"):], patterns))
        checked += 1
        on_check(Checked(where, record.command, divergence))
        if divergence:
            return checked, divergence
    for step in trajectory.steps:
        if until is not None and step.step > until:
            break
        if step.command is None or step.refused:
            continue  # a format error, or a command refused before it ran: nothing ran
        if step.children:
            on_check(Checked(f"step {step.step}", step.command, None, "ran a sub-agent, whose model calls are not made "
                                                                     "again: the replay stops here", compared=False,
                             ends=True))
            break
        command = _command_of(step, env, read_limit)
        if command is None:
            continue
        if step.aborted:
            bound = step.duration_s if step.duration_s > 0 else CUT_SHORT_UNKNOWN_S
            bound = min(bound, timeout) if timeout else bound
            result = _execute(env, command, bound, stop)
            if result.interrupted:
                divergence = Divergence(f"step {step.step}", "stopped before it finished")
                on_check(Checked(f"step {step.step}", step.command, divergence))
                return checked, divergence
            on_check(Checked(f"step {step.step}", step.command, None,
                             f"cut short in the recording ({step.aborted}): ran again for at most {bound:g}s, "
                             "its output not compared", compared=False))
            continue
        result = _execute(env, command, timeout, stop)
        divergence, note = compare(step, result, patterns, scrub)
        checked += 1
        on_check(Checked(f"step {step.step}", step.command, divergence, note))
        if divergence:
            return checked, divergence
    return checked, None


def _command_of(step: Step, env: Environment, read_limit: int) -> str | None:
    """What to run again for a step: its command, or for a file tool's call its worker command; None for what
    ran nothing in the environment (a skill read)."""
    import json

    from miniswe.tools import FILE_TOOLS, SKILL, files

    call = step.tool_call or {}
    if step.proposed is not None or call.get("name") not in (*FILE_TOOLS, SKILL):
        return step.command  # a rewritten call ran as the shell command recorded
    if call["name"] == SKILL:
        return None
    arguments = json.loads(call.get("arguments") or "{}")
    return files.worker_command(call["name"], arguments, max_chars=read_limit,
                                python=files.python_for(env.describe().get("kind", "local")))


def _execute(env: Environment, command: str, timeout: float, stop: Stop) -> CommandResult:
    with stop.cancelling(env.interrupt):
        return env.execute(command, timeout=timeout or NO_TIMEOUT)


def compare(step: Step, result: CommandResult, patterns: Sequence[re.Pattern], scrub=lambda text: text
            ) -> tuple[Divergence | None, str]:
    """How a command's new result compares with its recorded step: (divergence or None, a note)."""
    where = f"step {step.step}"
    if result.interrupted:
        return Divergence(where, "stopped before it finished"), ""
    if step.timed_out or result.timed_out:
        if step.timed_out != result.timed_out:
            return Divergence(where, "timed out in the recording" if step.timed_out else "timed out now"), ""
        return None, "timed out in both: output not compared"
    if step.returncode != result.returncode:
        return Divergence(where, f"return code {step.returncode} in the recording, {result.returncode} now",
                          _diff(step.output, scrub(result.output), patterns)), ""
    recorded, new = step.output, scrub(result.output)
    if step.elided_chars or result.elided_chars:
        # the recording kept head and tail only: compare what both kept, and say so ("cut", not "different")
        old_parts, new_parts = _kept_parts(recorded, step.elided_chars), _kept_parts(new, result.elided_chars)
        if [_normal(p, patterns) for p in old_parts] == [_normal(p, patterns) for p in new_parts]:
            return None, f"output cut by the capture bound ({step.elided_chars} bytes not kept): head and tail match"
        return Divergence(where, "output differs (the recording kept only its head and tail)",
                          _diff(recorded, new, patterns)), ""
    if _normal(recorded, patterns) != _normal(new, patterns):
        return Divergence(where, "output differs", _diff(recorded, new, patterns)), ""
    return None, ""


def _kept_parts(output: str, elided: int) -> list[str]:
    if not elided:
        return [output]
    head, found, tail = output.partition(elision_notice(elided))
    return [head, tail] if found else [output]


def _normal(text: str, patterns: Sequence[re.Pattern]) -> str:
    for pattern in patterns:
        text = pattern.sub(MASK, text)
    return text


def _diff(old: str, new: str, patterns: Sequence[re.Pattern]) -> str:
    lines = list(difflib.unified_diff(_normal(old, patterns).splitlines(), _normal(new, patterns).splitlines(),
                                      "recorded", "now", n=1, lineterm=""))
    more = f"\n... {len(lines) - DIFF_LINES} more diff lines" if len(lines) > DIFF_LINES else ""
    return "\n".join(lines[:DIFF_LINES]) + more


def replay_recording(trajectory: Trajectory, config: Any, *, until: int | None, stop: Stop,
                     on_check: Callable[[Checked], None], scrub: Callable[[str], str]) -> tuple[int, Divergence | None]:
    """`rerun` in a fresh environment of the recorded kind, built from `config`, closed afterwards; `scrub` masks
    the run's secrets in the new outputs."""
    from miniswe.environments import build_environment
    from miniswe.redaction import secret_env
    from miniswe.tools.files import read_limit

    env = build_environment(config.environment, run_id=new_run_id(), stop=stop,
                            hidden_env=secret_env(config.model))
    try:
        return rerun(env, trajectory, masks=config.replay.masks, stop=stop, timeout=config.environment.timeout,
                     until=until, scrub=scrub, on_check=on_check, read_limit=read_limit(config))
    finally:
        env.close()
