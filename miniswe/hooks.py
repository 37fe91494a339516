"""Hooks: what the step loop tells its observers, and what they may change.

Six moments, each an event object passed to every hook that has the method (all are optional):

    on_run_start(RunStart)          the run begins; its first messages (system, task). In chat, each turn
                                    begins so: the person's message (a command, in human mode)
    before_model_call(ModelCall)    may set `stop` to end the run instead of calling the model
    after_reply(ReplyEvent)         the model's reply, before it is parsed
    before_command(CommandEvent)    may rewrite `command`, or set `veto` to a reason: the approval gate (with
                                    native tool calls, every call is a command: see CommandEvent.tool)
    after_command(StepEvent)        the step as recorded (a format error too); may add `warnings` to what the
                                    model is told, or set `stop`
    on_run_end(RunEnd)              the run's outcome (in chat, the turn's)

The trajectory writer, the console display, batch progress, loop detection, the command policy and the
interactive approval modes are all hooks: nothing else observes or steers the loop. Third-party hooks are
loaded from config by `package.module:Class` (`agent.hooks`). A hook that raises ends the run as `Error`
with one line naming the hook, never a traceback on the console (the traceback is in `exit_detail`); what
happened before it stays on record (the step whose command ran, the reply that was paid for). A hook that
raises in on_run_end, once the run has its outcome, changes nothing but a warning.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from miniswe.errors import ConfigError, MinisweError
from miniswe.models import Reply
from miniswe.status import Outcome
from miniswe.trajectory import Step

EVENTS = ("on_run_start", "before_model_call", "after_reply", "before_command", "after_command", "on_run_end")


@dataclass
class RunStart:
    task: str  # the task; in chat, the turn's message (or the command a person typed)
    messages: list[dict[str, Any]]  # role, content, step: the messages the run (or turn) adds before its first step


@dataclass
class ModelCall:
    step: int
    messages: Sequence[dict[str, str]]  # what the model is about to be sent
    stop: Outcome | None = None  # set it to end the run here, without this call


@dataclass
class ReplyEvent:
    step: int
    reply: Reply


@dataclass
class CommandEvent:
    step: int
    command: str  # may be rewritten; the step records what ran and, when rewritten, what the model asked for
    thought: str
    veto: str | None = None  # set it to refuse the command: the model is told this reason and the run goes on
    proposed: str = ""  # the model's own command (filled in by the loop)
    # protocol.kind: tools: which tool, and the call ({id, name, arguments, index}). For the file tools, skill and
    # subagent, `command` is a readable rendering of the call; a hook that rewrites it makes it a bash command
    tool: str = "bash"
    tool_call: dict[str, Any] | None = None


@dataclass
class StepEvent:
    step: Step
    observation: str  # what the model will be told (the guidance, for a format error)
    warnings: list[str] = field(default_factory=list)  # added to the observation
    stop: Outcome | None = None  # set it to end the run after this step

    def message(self) -> str:
        """What the model is told: the observation, then each warning."""
        return "\n".join([self.observation, *(f"<warning>{warning}</warning>" for warning in self.warnings)])


@dataclass
class RunEnd:
    outcome: Outcome


class Hook(Protocol):
    """Implement any of the six methods; each takes its event."""


class HookError(MinisweError):
    """A hook raised: the run ends, naming the hook and what it raised."""


class Hooks:
    """Calls each hook that has the event's method, in order."""

    def __init__(self, hooks: Sequence[Any] = ()):
        self.hooks = list(hooks)

    def __call__(self, name: str, event: Any) -> Any:
        failure: HookError | None = None
        for hook in self.hooks:
            method = getattr(hook, name, None)
            # after a hook failed, only the record is still told what happened (not what was about to: a
            # decision the chain did not finish is not recorded as made)
            if method is None or failure is not None and not (getattr(hook, "records", False)
                                                              and not name.startswith("before_")):
                continue
            where = f"{type(hook).__module__}.{type(hook).__qualname__}.{name}"
            try:
                method(event)
            except HookError as error:
                failure = failure or error
            except Exception as error:
                failure = failure or HookError(f"hook {where} raised {type(error).__name__}: {error}")
                failure.__cause__ = failure.__cause__ or error
            stop = getattr(event, "stop", None)
            if stop is not None and not isinstance(stop, Outcome):
                # checked here, once for every event: the loop can only end on an Outcome
                event.stop = None
                failure = failure or HookError(f"hook {where} set stop to {type(stop).__name__} {stop!r:.40}; set it to "
                                               "an Outcome, e.g. Outcome(ExitStatus.SUBMITTED, 'why')")
        if failure is not None:
            raise failure
        return event


def load_hooks(names: Sequence[str]) -> list[Any]:
    """Hooks named `package.module:Class` in config, each built with no arguments."""
    from miniswe.plugins import load_kind

    hooks = []
    for index, name in enumerate(names):
        cls = load_kind(name, {}, key=f"agent.hooks[{index}]", what="hook")
        try:
            hooks.append(cls())
        except Exception as error:
            raise ConfigError(f"agent.hooks[{index}]: {name}() failed: {type(error).__name__}: {error}") from None
        if not any(callable(getattr(hooks[-1], event, None)) for event in EVENTS):
            raise ConfigError(f"agent.hooks[{index}]: {name} has none of the hook methods ({', '.join(EVENTS)})")
    return hooks
