"""One run from config to finished trajectory: build the environment and model, set up, loop, evaluate, clean up.

`miniswe run` and every task of `miniswe batch` go through `run_task`, the one place where whatever
escapes a run (a model or sandbox failure, a bug, a stop) becomes its outcome.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from miniswe.agent import Agent, StepObserver
from miniswe.config import Config
from miniswe.environments import Environment, build_environment, check_environment
from miniswe.limits import NO_TIMEOUT
from miniswe.models import Model, model_class
from miniswe.models.gate import CallGate
from miniswe.redaction import masked_config, run_secrets
from miniswe.signals import Stop
from miniswe.status import ExitStatus, Outcome, is_agent_outcome, outcome_of
from miniswe.templates import Renderer, prompt_variables
from miniswe.trajectory import COMMAND_TAIL, CommandRecord, Trajectory
from miniswe.usage import Usage


@dataclass
class RunResult:
    outcome: Outcome
    trajectory: Trajectory
    resolved: bool | None = None


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]


def default_trajectory_path(task: str, run_id: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", task.lower())[:40].strip("-") or "task"
    return os.path.join("trajectories", f"{run_id}-{slug}.traj.json")


def build_model(config: Config, **context: Any) -> Model:
    """A model of `config.model.kind`; `context` holds what a run adds (gate, stop, on_retry)."""
    return model_class(config.model.kind)(config.model, **context)


def check_ready(config: Config, task: str = "", instance: dict[str, Any] | None = None) -> Renderer:
    """Fail on bad input before anything runs: templates (rendered once for `task`), environment and model settings."""
    renderer = Renderer(config.agent.templates_dir)
    renderer.check_instance(task, instance or {}, prompt_variables(config, config.environment.cwd))
    check_environment(config.environment)
    build_model(config)  # the model refuses bad settings when built (no endpoint, no name, an unreadable script)
    return renderer


def run_task(
    config: Config,
    task: str,
    trajectory_path: str,
    *,
    run_id: str | None = None,
    instance: dict[str, Any] | None = None,
    metadata: dict[str, Any] | None = None,
    setup: Sequence[str] = (),
    evaluate: Sequence[str] = (),
    renderer: Renderer | None = None,
    model: Model | None = None,
    gate: CallGate | None = None,
    stop: Stop | None = None,
    observers: Sequence[StepObserver] = (),
    notify: Callable[[str], None] = lambda message: None,
) -> RunResult:
    """Run one task; whatever happens, the trajectory on disk ends with an exit status."""
    run_id = run_id or new_run_id()
    stop = stop or Stop()
    secrets = run_secrets(config)
    trajectory = Trajectory(
        trajectory_path, task=task, config=masked_config(config.to_dict()), environment={"kind": config.environment.kind},
        metadata={"run_id": run_id, **(metadata or {})}, redact=secrets.scrub,
    )
    trajectory.save()
    env: Environment | None = None
    resolved = None

    def on_retry(message: str) -> None:
        trajectory.add_usage(Usage(retries=1))  # counted as it happens: a run stopped mid-wait keeps its count
        notify(message)

    try:
        env = build_environment(config.environment, run_id=run_id, stop=stop,
                                hidden_env=[getattr(config.model, "api_key_env", "")])
        described = env.describe()
        trajectory.describe(environment=described)
        for notice in described.get("notices", ()):  # e.g. a docker image that falls back to exec-per-step
            trajectory.warn(notice)
            notify(f"notice: {notice}")
        outcome = _run_commands(env, setup, config, trajectory, stop, "setup")
        if outcome is None:
            model = model or build_model(config, gate=gate, stop=stop, on_retry=on_retry)
            agent = Agent(config, model, env, trajectory, renderer=renderer or Renderer(config.agent.templates_dir),
                          stop=stop, observers=observers, scrub=secrets.scrub, notify=notify)
            outcome = agent.run(task, instance)
            if evaluate and is_agent_outcome(outcome.status):
                failed = _run_commands(env, evaluate, config, trajectory, stop, "evaluation")
                if failed is None or failed.status is ExitStatus.SETUP_ERROR:
                    resolved = failed is None
                    trajectory.set_resolved(resolved)
                else:  # stopped mid-evaluation: no verdict, so the run counts as interrupted
                    outcome = failed
    except BaseException as error:
        outcome = outcome_of(error, stop.outcome)
    finally:
        if env is not None:
            try:
                env.close()
            except Exception as error:  # a failed cleanup must not hide the run's own outcome
                trajectory.warn(f"environment cleanup failed: {error}")
    trajectory.finish(outcome)
    trajectory.save()
    return RunResult(outcome, trajectory, resolved)


def _run_commands(env: Environment, commands: Sequence[str], config: Config, trajectory: Trajectory, stop: Stop,
                  phase: str) -> Outcome | None:
    """Run setup or evaluation commands in order; the first failure is returned as a SetupError outcome."""
    for command in commands:
        if stop.outcome:
            return stop.outcome
        with stop.cancelling(env.interrupt):
            result = env.execute(command, timeout=config.environment.timeout or NO_TIMEOUT)
        tail = result.output[-COMMAND_TAIL:]
        trajectory.record_command(phase, CommandRecord(command, result.returncode, result.timed_out, tail,
                                                       round(result.duration_s, 4)))
        trajectory.save()
        if result.interrupted:
            return stop.outcome
        if result.returncode != 0:
            why = "timed out" if result.timed_out else f"exited {result.returncode}"
            last = tail.strip().splitlines()[-1:] or [""]
            return Outcome(ExitStatus.SETUP_ERROR, f"{phase} command {command!r} {why}: {last[0][:200]}")
    return None
