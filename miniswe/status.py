"""Exit statuses of a run, as written in trajectories, and the process exit codes they map to."""

from enum import Enum


class ExitStatus(str, Enum):
    SUBMITTED = "Submitted"
    LIMITS_EXCEEDED = "LimitsExceeded"
    TIME_EXCEEDED = "TimeExceeded"
    REPEATED_FORMAT_ERROR = "RepeatedFormatError"
    INTERRUPTED = "Interrupted"
    MODEL_ERROR = "ModelError"
    SANDBOX_ERROR = "SandboxError"
    SETUP_ERROR = "SetupError"
    ERROR = "Error"

    def __str__(self) -> str:
        return self.value


# The agent decided how the run ended: a rerun would not be expected to go differently.
AGENT_OUTCOMES = frozenset(
    {
        ExitStatus.SUBMITTED,
        ExitStatus.LIMITS_EXCEEDED,
        ExitStatus.TIME_EXCEEDED,
        ExitStatus.REPEATED_FORMAT_ERROR,
    }
)
INFRA_FAILURES = frozenset(
    {ExitStatus.MODEL_ERROR, ExitStatus.SANDBOX_ERROR, ExitStatus.SETUP_ERROR, ExitStatus.ERROR}
)

EXIT_SUBMITTED = 0
EXIT_NOT_SUBMITTED = 1
EXIT_BAD_INPUT = 2
EXIT_INFRA = 3
EXIT_SIGINT = 130
EXIT_SIGTERM = 143


def exit_code(status: ExitStatus, signal_name: str | None = None) -> int:
    """Process exit code of `miniswe run` for a finished run."""
    if status is ExitStatus.SUBMITTED:
        return EXIT_SUBMITTED
    if status is ExitStatus.INTERRUPTED:
        return EXIT_SIGTERM if signal_name == "SIGTERM" else EXIT_SIGINT
    if status in INFRA_FAILURES:
        return EXIT_INFRA
    return EXIT_NOT_SUBMITTED
