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

from miniswe.status import EXIT_BAD_INPUT, EXIT_INFRA


class MinisweError(Exception):
    exit_code = EXIT_INFRA


class UsageError(MinisweError):
    exit_code = EXIT_BAD_INPUT


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
