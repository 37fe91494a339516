"""How a run ends: exit statuses, the Outcome record, turning an exception into an outcome, and exit codes.

The one place that knows which statuses are the agent's own outcomes, which are infrastructure failures,
which a resumed batch runs again, and which process exit code each maps to, for `run` and for `batch`.
"""

from __future__ import annotations

import signal
import traceback
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from miniswe import errors


class ExitStatus(str, Enum):
    SUBMITTED = "Submitted"
    LIMITS_EXCEEDED = "LimitsExceeded"
    TIME_EXCEEDED = "TimeExceeded"
    REPEATED_FORMAT_ERROR = "RepeatedFormatError"
    REPEATED_ACTION = "RepeatedAction"
    INTERRUPTED = "Interrupted"
    MODEL_ERROR = "ModelError"
    SANDBOX_ERROR = "SandboxError"
    SANDBOX_DESTROYED = "SandboxDestroyed"  # the agent's own command broke its container
    PULL_ERROR = "PullError"  # the task's image could not be pulled: the agent never ran
    SETUP_ERROR = "SetupError"
    ERROR = "Error"

    def __str__(self) -> str:
        return self.value


# The agent decided how the run ended: a rerun would not be expected to go differently.
AGENT_OUTCOMES = frozenset(
    {ExitStatus.SUBMITTED, ExitStatus.LIMITS_EXCEEDED, ExitStatus.TIME_EXCEEDED, ExitStatus.REPEATED_FORMAT_ERROR,
     ExitStatus.REPEATED_ACTION, ExitStatus.SANDBOX_DESTROYED}
)
INFRA_FAILURES = frozenset(
    {ExitStatus.MODEL_ERROR, ExitStatus.SANDBOX_ERROR, ExitStatus.SETUP_ERROR, ExitStatus.ERROR, ExitStatus.PULL_ERROR}
)

EXIT_SUBMITTED = 0
EXIT_NOT_SUBMITTED = 1
EXIT_BAD_INPUT = 2
EXIT_INFRA = 3
EXIT_DIVERGED = 1  # replay: a command did not give its recorded output, or not every step could be checked

# Signals that stop a run, by name; each exits 128 + its number, as a shell reports a death by that signal.
STOP_SIGNALS = {"SIGINT": signal.SIGINT, "SIGTERM": signal.SIGTERM, "SIGHUP": signal.SIGHUP}


@dataclass(frozen=True)
class Outcome:
    status: ExitStatus
    detail: str | None = None
    submission: str | None = None


def is_agent_outcome(status: str | ExitStatus | None) -> bool:
    """The agent decided how the run ended; anything else ended without a verdict, and a resumed batch reruns it.
    (A status read from JSON is a plain string; a str Enum member hashes and compares like its value.)"""
    return status in AGENT_OUTCOMES


def is_infra_failure(status: str | ExitStatus | None) -> bool:
    return status in INFRA_FAILURES


def interrupted(signal_name: str) -> Outcome:
    return Outcome(ExitStatus.INTERRUPTED, signal_name)


def outcome_of(error: BaseException, stop: Outcome | None = None) -> Outcome:
    """How a run ends when `error` escapes it; `stop` is the outcome a stop request asked for, if any.

    An error raised while a stop was requested (a killed command's sandbox, a cancelled call) is a
    consequence of the stop, so the stop's outcome wins and the error is kept in the detail.
    """
    if isinstance(error, KeyboardInterrupt):
        return stop or interrupted("SIGINT")
    if isinstance(error, errors.DeadlineReached):
        return Outcome(ExitStatus.TIME_EXCEEDED, str(error))
    if isinstance(error, errors.Cancelled):
        return stop or interrupted("SIGINT")
    if isinstance(error, errors.ModelError):
        own = Outcome(ExitStatus.MODEL_ERROR, str(error))
    elif isinstance(error, errors.PullError):
        own = Outcome(ExitStatus.PULL_ERROR, str(error))
    elif isinstance(error, errors.SandboxError):
        # a sandbox the agent's own command broke would be broken again by a rerun: the agent's outcome
        wrecked = getattr(error, "by_agent_command", None)
        own = Outcome(ExitStatus.SANDBOX_DESTROYED if wrecked else ExitStatus.SANDBOX_ERROR, str(error))
    elif isinstance(error, errors.MinisweError):
        cause = error.__cause__  # foreign code that failed under miniswe's message (a hook): its traceback too
        where = "" if cause is None or isinstance(cause, errors.MinisweError) else "".join(traceback.format_exception(cause))
        own = Outcome(ExitStatus.ERROR, where + str(error))
    elif isinstance(error, Exception):
        own = Outcome(ExitStatus.ERROR, "".join(traceback.format_exception(error)))
    else:
        raise error  # SystemExit and the like are not a run's business
    if stop is not None:
        return Outcome(stop.status, f"{stop.detail} ({own.status}: {_last_line(own.detail)})")
    return own


def error_exit_code(error: BaseException) -> int:
    """Process exit code for an error that ends a command before or outside a run: bad input, or infrastructure."""
    return EXIT_BAD_INPUT if isinstance(error, errors.UsageError) else EXIT_INFRA


def signal_exit_code(signal_name: str | None) -> int:
    return 128 + int(STOP_SIGNALS.get(signal_name or "SIGINT", signal.SIGINT))


def run_exit_code(outcome: Outcome) -> int:
    """Process exit code of `miniswe run` for a finished run."""
    if outcome.status is ExitStatus.SUBMITTED:
        return EXIT_SUBMITTED
    if outcome.status is ExitStatus.INTERRUPTED:
        return signal_exit_code((outcome.detail or "").split(" ", 1)[0])
    if outcome.status in INFRA_FAILURES:
        return EXIT_INFRA
    return EXIT_NOT_SUBMITTED


def batch_exit_code(statuses: Iterable[str], *, signal_name: str | None, record_failures: int = 0,
                    not_started: int = 0) -> int:
    """Process exit code of `miniswe batch`: a signal; then any infrastructure failure (3); then tasks a batch
    budget left unstarted (1: the batch is not done, rerun it); else 0."""
    if signal_name:
        return signal_exit_code(signal_name)
    if record_failures or any(is_infra_failure(status) for status in statuses):
        return EXIT_INFRA
    if not_started:
        return EXIT_NOT_SUBMITTED
    return EXIT_SUBMITTED


def _last_line(text: str | None) -> str:
    lines = (text or "").strip().splitlines()
    return lines[-1] if lines else ""
