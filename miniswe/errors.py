"""The miniswe error tree. The CLI turns each into one line on stderr and an exit code.

    MinisweError
    ├── UsageError        bad input: CLI usage, config, task file, trajectory file   → exit 2
    │   ├── ConfigError
    │   ├── TaskFileError
    │   └── TrajectoryError
    ├── ModelError        endpoint unreachable, refused, or broken after retries      → exit 3
    └── SandboxError      the environment could not run a command                     → exit 3

Expected outcomes (limits, format errors, timeouts) are exit statuses, never exceptions.
"""


class MinisweError(Exception):
    exit_code = 3


class UsageError(MinisweError):
    exit_code = 2


class ConfigError(UsageError):
    pass


class TaskFileError(UsageError):
    pass


class TrajectoryError(UsageError):
    pass


class ModelError(MinisweError):
    pass


class SandboxError(MinisweError):
    pass
