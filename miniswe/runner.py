"""One run from config to finished trajectory: build the environment and model, set up, loop, evaluate, clean up.

`miniswe run` and every task of `miniswe batch` go through `run_task`.
"""

from __future__ import annotations

import os
import re
import time
import traceback
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from miniswe.agent import NO_TIMEOUT, Agent, Interrupt, Outcome, StepObserver, StopCheck
from miniswe.config import Config
from miniswe.environments import Environment, build_environment, check_environment
from miniswe.errors import MinisweError, ModelError, SandboxError
from miniswe.models import Model, model_class
from miniswe.models.gate import CallGate
from miniswe.redaction import mask_env, mask_run_args
from miniswe.status import AGENT_OUTCOMES, ExitStatus
from miniswe.templates import Renderer
from miniswe.trajectory import Trajectory


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


def redacted(config: Config) -> dict[str, Any]:
    """The config as recorded: values of secret-looking variables and `-e NAME=value` arguments masked."""
    data = config.to_dict()
    data["environment"]["env"] = mask_env(data["environment"]["env"])
    data["environment"]["run_args"] = mask_run_args(data["environment"]["run_args"])
    return data


def build_model(config: Config, gate: CallGate | None = None) -> Model:
    cls = model_class(config.model.kind)
    return cls(config.model, gate=gate)


def check_ready(config: Config) -> Renderer:
    """Fail on bad input before anything runs: templates, environment and model settings."""
    renderer = Renderer(config.agent.templates_dir)
    check_environment(config.environment)
    check_model(config)
    return renderer


def check_model(config: Config) -> None:
    """The model refuses bad settings when built (no endpoint, no name, an unreadable script)."""
    build_model(config)


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
    on_step: StepObserver | None = None,
    should_stop: StopCheck | None = None,
) -> RunResult:
    """Run one task; whatever happens, the trajectory on disk ends with an exit status."""
    run_id = run_id or new_run_id()
    trajectory = Trajectory(
        trajectory_path, task=task, config=redacted(config), environment={"kind": config.environment.kind},
        metadata={"run_id": run_id, **(metadata or {})},
    )
    trajectory.save()
    env: Environment | None = None
    resolved = None
    try:
        env = build_environment(config.environment, run_id=run_id, hidden_env=[config.model.api_key_env])
        trajectory.data["environment"] = env.describe()
        outcome = _run_commands(env, setup, config, trajectory, "setup")
        if outcome is None:
            agent = Agent(config, model or build_model(config, gate), env, trajectory, renderer=renderer,
                          on_step=on_step, should_stop=should_stop)
            outcome = agent.run(task, instance)
            if evaluate and outcome.status in AGENT_OUTCOMES:
                resolved = _run_commands(env, evaluate, config, trajectory, "evaluation") is None
                trajectory.data["resolved"] = resolved
        else:
            trajectory.finish(outcome.status, outcome.detail)
    except (KeyboardInterrupt, Interrupt) as error:
        outcome = Outcome(ExitStatus.INTERRUPTED, getattr(error, "signal_name", "SIGINT"))
        trajectory.finish(outcome.status, outcome.detail)
    except SandboxError as error:
        outcome = Outcome(ExitStatus.SANDBOX_ERROR, str(error))
        trajectory.finish(outcome.status, outcome.detail)
    except MinisweError as error:
        outcome = Outcome(ExitStatus.MODEL_ERROR if isinstance(error, ModelError) else ExitStatus.ERROR, str(error))
        trajectory.finish(outcome.status, outcome.detail)
    except Exception:
        outcome = Outcome(ExitStatus.ERROR, traceback.format_exc())
        trajectory.finish(outcome.status, outcome.detail)
    finally:
        if env is not None:
            try:
                env.close()
            except Exception as error:  # a failed cleanup must not hide the run's own outcome
                trajectory.data.setdefault("warnings", []).append(f"environment cleanup failed: {error}")
        trajectory.save()
    return RunResult(outcome, trajectory, resolved)


def _run_commands(env: Environment, commands: Sequence[str], config: Config, trajectory: Trajectory, key: str) -> Outcome | None:
    """Run setup or evaluation commands in order; the first failure is returned as a SetupError outcome."""
    records = trajectory.data.setdefault(key, [])
    for command in commands:
        result = env.execute(command, timeout=config.environment.timeout or NO_TIMEOUT)
        tail = result.output[-2000:]
        records.append({"command": command, "returncode": result.returncode, "timed_out": result.timed_out,
                        "output": tail, "duration_s": round(result.duration_s, 4)})
        trajectory.save()
        if result.returncode != 0:
            why = "timed out" if result.timed_out else f"exited {result.returncode}"
            last = tail.strip().splitlines()[-1:] or [""]
            return Outcome(ExitStatus.SETUP_ERROR, f"{key} command {command!r} {why}: {last[0][:200]}")
    return None
