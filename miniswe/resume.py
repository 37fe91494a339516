"""Resuming and forking recorded runs: which runs may go on, with which config, in which environment.

`miniswe run --resume TRAJ` goes on in the same file with a run that ended without a verdict; `--fork TRAJ
--from-step N -o NEW` goes on from step N in a new file, the parent untouched. Settings not given again
come from the recorded config (masked secrets from the environment, by name); what changed is recorded.
"""

from __future__ import annotations

import os
from typing import Any

from miniswe.config import Config
from miniswe.environments import environment_class
from miniswe.errors import UsageError
from miniswe.redaction import masked_config, restore_secrets, run_secrets
from miniswe.runner import RunResult, check_ready, continue_run
from miniswe.status import is_agent_outcome
from miniswe.trajectory import Trajectory, fork, load, new_run_id


def recorded_config(trajectory: Trajectory, sources: list[str], flags: dict[str, Any]) -> Config:
    """The recorded config, then `-c` sources and flags given now, checked as a new run's is (bad settings
    stop here, before the trajectory is touched)."""
    from miniswe.flags import resolve_config
    from miniswe.output import add_secrets

    config = resolve_config(sources, flags, base=restore_secrets(trajectory.config))
    add_secrets(run_secrets(config))
    check_ready(config, trajectory.task)
    return config


def changes(before: dict[str, Any], after: dict[str, Any], prefix: str = "") -> dict[str, list[Any]]:
    """Dotted keys whose recorded values differ, with [before, after] (both as recorded: masked)."""
    found: dict[str, list[Any]] = {}
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key), after.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            found.update(changes(old, new, f"{prefix}{key}."))
        elif old != new:
            found[f"{prefix}{key}"] = [old, new]
    return found


def keeps_state(config: Config) -> bool:
    """Whether the environment's state outlives a run (a local working directory does; a container does not)."""
    return bool(getattr(environment_class(config.environment.kind), "keeps_state", False))


def resume(path: str, sources: list[str], flags: dict[str, Any], *, force: bool, **services: Any) -> RunResult:
    trajectory = load(path)
    if is_agent_outcome(trajectory.exit_status):
        raise UsageError(f"--resume {path}: the run ended as {trajectory.exit_status}, a verdict; nothing to resume "
                         "(--fork TRAJ --from-step N -o NEW tries another way from one of its steps)")
    if not trajectory.messages:
        raise UsageError(f"--resume {path}: the run never reached its first model call; run the task again")
    config = recorded_config(trajectory, sources, flags)
    record = {"changes": changes(trajectory.config, masked_config(config.to_dict()))}
    return continue_run(config, trajectory, rebuild=not keeps_state(config), force=force, record=record, **services)


def fork_run(path: str, from_step: int | None, output: str | None, sources: list[str], flags: dict[str, Any], *,
             force: bool, **services: Any) -> RunResult:
    if from_step is None or not output:
        raise UsageError("--fork TRAJ needs --from-step N (the steps kept) and -o NEW (the fork's trajectory)")
    parent = load(path)
    if os.path.abspath(output) == os.path.abspath(path):
        raise UsageError(f"-o {output}: a fork goes to a new file; the parent is never touched")
    if os.path.exists(output) and not force:
        raise UsageError(f"-o {output}: already exists; pass another path, or --force to replace it")
    config = recorded_config(parent, sources, flags)
    if keeps_state(config) and not force:
        here = os.path.abspath(config.environment.cwd or os.getcwd())
        if here == parent.environment.get("cwd"):
            raise UsageError(
                f"{here} holds the parent run's final state, not its state at step {from_step}: pass --cwd with a "
                "fresh copy (the setup and the first steps' commands run there again), or --force to fork there anyway"
            )
    child = fork(parent, from_step, output, config=masked_config(config.to_dict()), run_id=new_run_id(),
                 redact=run_secrets(config).scrub)
    record = {"changes": changes(parent.config, masked_config(config.to_dict()))}
    return continue_run(config, child, rebuild=True, force=force, record=record, fork=True, **services)
