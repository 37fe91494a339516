"""The miniswe error tree. The CLI turns each into one line on stderr and the exit code status.error_exit_code gives.

    MinisweError
    ├── UsageError        bad input: CLI usage, config, task file, trajectory file   → exit 2
    │   ├── ConfigError
    │   ├── TaskFileError
    │   └── TrajectoryError
    ├── ModelError        endpoint unreachable, refused, or broken after retries      → exit 3
    ├── SandboxError      the environment could not run a command                     → exit 3
    │   └── PullError     its image could not be pulled, after the retries it deserves (→ PullError)
    ├── RecordError       a run's files could not be written (read-only, disk full)   → exit 3
    ├── DeadlineReached   agent.time_limit passed during a model call or a wait        (→ TimeExceeded)
    └── Cancelled         a stop request cut a model call or a wait short              (→ the stop's outcome)

Expected outcomes (limits, format errors, timeouts) are exit statuses, never exceptions; the last two
only carry such an outcome out of a model call, and status.outcome_of turns them back into one.
"""



class MinisweError(Exception):
    pass


class UsageError(MinisweError):
    pass


class ConfigError(UsageError):
    pass


class TaskFileError(UsageError):
    pass


class TrajectoryError(UsageError):
    pass


class ModelError(MinisweError):
    pass


class ContextLengthError(ModelError):
    """The endpoint refused a prompt longer than the model's context window. `window` and `prompt_tokens` are
    what its message said, when it said them; the agent compacts the conversation and asks again."""

    def __init__(self, message: str, *, window: int | None = None, prompt_tokens: int | None = None):
        super().__init__(message)
        self.window = window
        self.prompt_tokens = prompt_tokens


class SandboxError(MinisweError):
    pass


class PullError(SandboxError):
    """An image that could not be pulled (environments/images.py). `kind`: rate_limit, disk (the engine's disk is
    full), permanent, transient (retries used up), or failed (an earlier pull of it in this batch failed)."""

    def __init__(self, message: str, kind: str = "transient"):
        super().__init__(message)
        self.kind = kind


class RecordError(MinisweError):
    pass


class DeadlineReached(MinisweError):
    pass


class Cancelled(MinisweError):
    pass
