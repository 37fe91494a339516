"""Resuming and forking recorded runs: which runs may go on, with which config, in which environment.

`miniswe run --resume TRAJ` goes on in the same file with a run that ended without a verdict; `--fork TRAJ
--from-step N -o NEW` goes on from step N in a new file, the parent untouched. Settings not given again
come from the recorded config (masked secrets from the environment, by name); what changed is recorded.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from miniswe.config import Config, config_from_record
from miniswe.context import RunContext
from miniswe.environments import Environment, environment_class
from miniswe.errors import TrajectoryError, UsageError
from miniswe.redaction import Secrets, masked_config, restore_secrets
from miniswe.replay import Checked, Divergence, rerun
from miniswe.runner import RunResult, check_ready, drive
from miniswe.status import Outcome, is_agent_outcome
from miniswe.tools.files import read_limit
from miniswe.trajectory import Trajectory, fork, load, new_run_id

# Builds a resumed run's config from the recorded one (secrets restored), with what was given now (-c, flags).
Configure = Callable[[dict[str, Any]], Config]


class Diverged(Exception):
    """The fresh environment did not give the recorded outputs: the continued run would not start where the
    recording left off."""

    def __init__(self, divergence: Divergence, previous: Outcome | None):
        super().__init__(str(divergence))
        self.divergence = divergence
        self.previous = previous


def continue_run(
    config: Config,
    trajectory: Trajectory,
    *,
    rebuild: bool,
    force: bool = False,
    record: dict[str, Any] | None = None,
    evaluate: Sequence[str] = (),
    on_check: Callable[[Checked], None] = lambda checked: None,
    known_secrets: Secrets | None = None,
    fork: bool = False,
    **services: Any,
) -> RunResult:
    """Go on with a recorded run, in its own file (a resume) or in a `fork`'s: from its last finished step, with
    no model call made again. With `rebuild`, the recorded setup and commands run first in the fresh
    environment, their outputs checked as `miniswe replay` checks them; a divergence stops here (the
    trajectory keeps its previous end, `RunResult.diverged` says where) unless `force`. The run's clock goes on
    from the time it had used."""
    previous = trajectory.outcome
    parts = {key: services.pop(key) for key in ("model", "gate", "environment", "spawn_from") if key in services}
    ctx = RunContext.open(config, trajectory, known_secrets=known_secrets, elapsed=trajectory.wall_s_so_far(),
                          **services)
    trajectory.reopen(**(record or {}))
    trajectory.save()

    def start(env: Environment, agent: Any) -> Outcome:
        if rebuild:
            _, divergence = rerun(env, trajectory, masks=config.replay.masks, stop=ctx.stop,
                                  timeout=config.environment.timeout, scrub=ctx.secrets.scrub, on_check=on_check,
                                  read_limit=read_limit(config))
            if ctx.stop.outcome:
                return ctx.stop.outcome
            if divergence:
                trajectory.resumes[-1]["diverged"] = str(divergence)
                if not force:
                    raise Diverged(divergence, previous)
        return agent.resume(fork=fork)

    return drive(ctx, start, run_id=trajectory.metadata.get("run_id") or new_run_id(), evaluate=evaluate, **parts)


def recorded_config(trajectory: Trajectory, configure: Configure) -> Config:
    """The recorded config, then what was given now, checked as a new run's is (bad settings stop here, before
    the trajectory is touched)."""
    recorded = restore_secrets(trajectory.config)
    environment = recorded.get("environment") or {}
    where = trajectory.environment.get("cwd")
    cwd = environment.get("cwd")
    if cwd and isinstance(cwd, str) and not os.path.isabs(cwd) and where and os.path.isabs(where):
        environment["cwd"] = where  # an older record's relative directory, as the run resolved it, not this shell
    config = configure(recorded)
    try:
        check_ready(config, trajectory.task)
    except UsageError as error:
        raise blamed(error, trajectory, recorded) from None
    return config


def blamed(error: UsageError, trajectory: Trajectory, recorded: dict[str, Any]) -> UsageError:
    """`error`, naming the trajectory when its recorded config alone is refused the same way (a hook or a
    templates folder it names that is not there now), rather than as if the command line had said it."""
    try:
        check_ready(config_from_record(recorded), trajectory.task)
    except UsageError as own:
        if str(own) == str(error):
            return TrajectoryError(f"{trajectory.path}: the recorded config: {error} (-c KEY=VALUE replaces a "
                                   "recorded setting)")
    except Exception:  # the record alone fails otherwise (it needs what the command line gave): not its fault
        pass
    return error


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


def resume(path: str, configure: Configure, *, force: bool, **services: Any) -> RunResult:
    # claimed before it is read: a run still going, or another resume of it, is refused here, before any call
    # or command, and what is read is what this process goes on from
    trajectory = load(path, lock=True)
    if is_agent_outcome(trajectory.exit_status):
        raise UsageError(f"--resume {path}: the run ended as {trajectory.exit_status}, a verdict; nothing to resume "
                         "(--fork TRAJ --from-step N -o NEW tries another way from one of its steps)")
    if not trajectory.messages:
        raise UsageError(f"--resume {path}: the run never reached its first model call; run the task again")
    config = recorded_config(trajectory, configure)
    record = {"changes": changes(trajectory.config, masked_config(config.to_dict()))}
    return continue_run(config, trajectory, rebuild=not keeps_state(config), force=force, record=record, **services)


def fork_run(path: str, from_step: int | None, output: str | None, configure: Configure, *, force: bool,
             **services: Any) -> RunResult:
    if from_step is None or not output:
        raise UsageError("--fork TRAJ needs --from-step N (the steps kept) and -o NEW (the fork's trajectory)")
    parent = load(path)
    if os.path.abspath(output) == os.path.abspath(path):
        raise UsageError(f"-o {output}: a fork goes to a new file; the parent is never touched")
    if os.path.exists(output) and not force:
        raise UsageError(f"-o {output}: already exists; pass another path, or --force to replace it")
    config = recorded_config(parent, configure)
    if keeps_state(config) and not force:
        here = os.path.abspath(config.environment.cwd or os.getcwd())
        if here == parent.environment.get("cwd"):
            raise UsageError(
                f"{here} holds the parent run's final state, not its state at step {from_step}: pass --cwd with a "
                "fresh copy (the setup and the first steps' commands run there again), or --force to fork there anyway"
            )
    child = fork(parent, from_step, output, config=masked_config(config.to_dict()), run_id=new_run_id())
    record = {"changes": changes(parent.config, masked_config(config.to_dict()))}
    return continue_run(config, child, rebuild=True, force=force, record=record, fork=True, **services)
