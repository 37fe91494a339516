"""One run from config to finished trajectory: build the environment and model, set up, loop, evaluate, clean up.

`miniswe run` and every task of `miniswe batch` go through `run_task`, a resumed or forked run through
`continue_run`; both through `_drive`, the one place where whatever escapes a run (a model or sandbox
failure, a bug, a stop) becomes its outcome.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from miniswe.agent import Agent
from miniswe.hooks import load_hooks
from miniswe.config import Config
from miniswe.environments import Environment, build_environment, check_environment
from miniswe.environments.capture import elision_notice
from miniswe.limits import NO_TIMEOUT
from miniswe.errors import ConfigError, UsageError
from miniswe.models import Model, calls_tools, model_class
from miniswe.models.gate import CallGate
from miniswe.redaction import MASK, Secrets, masked_config, masked_left, run_secrets
from miniswe.replay import Checked, Divergence, rerun
from miniswe.signals import Stop
from miniswe.status import ExitStatus, Outcome, is_agent_outcome, outcome_of
from miniswe.templates import Renderer, number, prompt_variables
from miniswe.tools.files import read_limit
from miniswe.trajectory import COMMAND_TAIL, CommandRecord, Trajectory, new_run_id
from miniswe.usage import Usage


@dataclass
class RunResult:
    outcome: Outcome
    trajectory: Trajectory
    resolved: bool | None = None
    diverged: Divergence | None = None  # a continued run stopped because its environment did not replay the same


def build_model(config: Config, **context: Any) -> Model:
    """A model of `config.model.kind`; `context` holds what a run adds (gate, stop, on_retry)."""
    return model_class(config.model.kind)(config.model, **context)


def check_ready(config: Config, task: str = "", instance: dict[str, Any] | None = None,
                notify: Callable[[str], None] | None = None) -> Renderer:
    """Fail on bad input before anything runs: templates (rendered once for `task`), environment and model settings,
    the protocol. Skills that cannot be used are told to `notify` (stderr by default), one line each."""
    renderer = Renderer(config.agent.templates_dir)
    renderer.check_instance(task, instance or {}, prompt_variables(config, config.environment.cwd))
    load_hooks(config.agent.hooks)  # a hook that cannot be loaded is bad input, found before anything runs
    check_environment(config.environment)
    check_protocol(config)
    check_unmasked(config)
    build_model(config)  # the model refuses bad settings when built (no endpoint, no name, an unreadable script)
    report_skills(config, notify)
    return renderer


def check_protocol(config: Config) -> None:
    """protocol.kind: tools needs a model kind that can be sent tools."""
    if config.protocol.kind == "tools" and not calls_tools(model_class(config.model.kind)):
        raise ConfigError(f"protocol.kind: tools: model kind {config.model.kind!r} cannot call tools (its complete() "
                          "takes no `tools`); use protocol.kind: text")


def check_unmasked(config: Config) -> None:
    """A model setting still masked (a resumed or forked run whose secret's variable is not set) would send the
    mask itself to the endpoint: refused, naming the variable to set."""
    found = masked_left(config.to_dict())
    if found:
        key, variable = found
        raise ConfigError(f"{key}: the recording masked this secret ({MASK}) and ${variable} is not set; set "
                          f"{variable} to its value (or pass -c {key}=...) and run again")


def report_skills(config: Config, notify: Callable[[str], None] | None = None) -> None:
    """Each skill left out, one line (at start: the run goes on without them)."""
    from miniswe.skills import load_skills

    _, problems = load_skills(config.agent.skills_dirs)
    for problem in problems:
        (notify or (lambda message: print(f"miniswe: {message}", file=sys.stderr, flush=True)))(problem)


class Diverged(Exception):
    """The fresh environment did not give the recorded outputs: the continued run would not start where the
    recording left off."""

    def __init__(self, divergence: Divergence, previous: Outcome | None):
        super().__init__(str(divergence))
        self.divergence = divergence
        self.previous = previous


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
    known_secrets: Secrets | None = None,
    **services: Any,
) -> RunResult:
    """Run one task; whatever happens, the trajectory on disk ends with an exit status. `known_secrets`: more
    secrets to mask than the run's own (a batch's: every task's). `services`: renderer, model, gate, stop,
    hooks, notify (see `_drive`)."""
    check_output_path(trajectory_path)
    run_id = run_id or new_run_id()
    secrets = _secrets(config, known_secrets)
    trajectory = Trajectory(
        trajectory_path, task=task, config=masked_config(config.to_dict()), environment={"kind": config.environment.kind},
        metadata={"run_id": run_id, **(metadata or {})}, redact=secrets.scrub,
    )
    trajectory.save()

    def start(env: Environment, agent: Agent, stop: Stop) -> Outcome:
        # one agent.time_limit for setup, the agent and evaluation: the agent's clock starts before setup
        started = time.monotonic()
        deadline = started + config.agent.time_limit if config.agent.time_limit else None
        return (_run_commands(env, setup, config, trajectory, stop, "setup", scrub=secrets.scrub_cut, deadline=deadline)
                or agent.run(task, instance, started=started))

    return _drive(config, trajectory, start, run_id=run_id, evaluate=evaluate, secrets=secrets, **services)


def _secrets(config: Config, known: Secrets | None) -> Secrets:
    """The run's own secrets, and those `known` besides."""
    secrets = run_secrets(config)
    if known:
        secrets.update(known)
    return secrets


def check_output_path(path: str) -> None:
    """A trajectory path must be a regular file, or not be there yet: saving renames a new file over it, which
    would replace a FIFO, a socket or a device node."""
    if os.path.lexists(path) and not os.path.isfile(path):
        what = "a directory" if os.path.isdir(path) else "not a regular file"
        raise UsageError(f"-o {path}: exists and is {what}; a trajectory goes to a regular file or a new path")


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
    trajectory keeps its previous end, `RunResult.diverged` says where) unless `force`."""
    secrets = _secrets(config, known_secrets)
    trajectory.set_redaction(secrets.scrub)
    previous = trajectory.outcome
    trajectory.reopen(**(record or {}))
    trajectory.save()

    def start(env: Environment, agent: Agent, stop: Stop) -> Outcome:
        if rebuild:
            _, divergence = rerun(env, trajectory, masks=config.replay.masks, stop=stop,
                                  timeout=config.environment.timeout, scrub=secrets.scrub, on_check=on_check,
                                  read_limit=read_limit(config))
            if stop.outcome:
                return stop.outcome
            if divergence:
                trajectory.resumes[-1]["diverged"] = str(divergence)
                if not force:
                    raise Diverged(divergence, previous)
        return agent.resume(fork=fork)

    return _drive(config, trajectory, start, run_id=trajectory.metadata.get("run_id") or new_run_id(),
                  evaluate=evaluate, secrets=secrets, **services)


def _drive(
    config: Config,
    trajectory: Trajectory,
    start: Callable[[Environment, Agent, Stop], Outcome],
    *,
    run_id: str,
    evaluate: Sequence[str],
    secrets: Secrets,
    stop: Stop | None = None,
    environment: Environment | None = None,
    depth: int = 0,
    **services: Any,
) -> RunResult:
    """Build the environment and the model, `start` the loop, evaluate, clean up: the one place where whatever
    escapes a run becomes its outcome. `environment`: one to borrow (a sub-agent's parent's), neither opened nor
    closed here; `depth`: how deep a sub-agent this run is. `services`: see `make_agent`."""
    stop = stop or Stop()
    env: Environment | None = None
    delegation = None
    resolved = diverged = None
    try:
        notify = services.get("notify", lambda m: None)
        delegation = open_delegation(config, depth=depth, stop=stop, borrowed=environment is not None,
                                     renderer=services.get("renderer"), notify=notify, secrets=secrets)
        env = environment or open_environment(config, trajectory, run_id=run_id, stop=stop, notify=notify,
                                              delegation=delegation, depth=depth)
        agent = make_agent(config, trajectory, env, secrets=secrets, stop=stop, delegation=delegation, depth=depth,
                           **services)
        outcome = start(env, agent, stop)
        if evaluate and outcome.status is not ExitStatus.SUBMITTED and is_agent_outcome(outcome.status):
            resolved = False  # nothing was submitted: whatever the working tree holds is not the agent's answer
            trajectory.set_resolved(resolved)
        elif evaluate and outcome.status is ExitStatus.SUBMITTED:
            failed = _run_commands(env, evaluate, config, trajectory, stop, "evaluation", scrub=secrets.scrub_cut,
                                   deadline=agent.limits.deadline)
            if failed is None or failed.status is ExitStatus.SETUP_ERROR:
                resolved = failed is None
                trajectory.set_resolved(resolved)
            elif failed.status is ExitStatus.TIME_EXCEEDED:  # the time limit cut evaluation: no verdict
                outcome = Outcome(failed.status, failed.detail, outcome.submission)
            else:  # stopped mid-evaluation: no verdict, so the run counts as interrupted
                outcome = failed
    except Diverged as error:  # the run keeps the end it had; one that had none stays without a verdict
        diverged = error.divergence
        outcome = error.previous or Outcome(ExitStatus.INTERRUPTED, f"resume stopped: {diverged}")
    except BaseException as error:
        outcome = outcome_of(error, stop.outcome)
    finally:
        if env is not None and environment is None:
            close_environment(env, trajectory)
        if delegation is not None:
            delegation.close()
    trajectory.finish(outcome)
    trajectory.save()
    return RunResult(outcome, trajectory, resolved, diverged)


def open_delegation(config: Config, *, depth: int, stop: Stop, borrowed: bool = False, renderer: Renderer | None = None,
                    notify: Callable[[str], None] = lambda message: None, folder: str | None = None,
                    secrets: Secrets | None = None) -> Any:
    """The run's sub-agents (subagents.Delegation), when it may start them: it is shallower than agent.max_depth,
    and it can reach them: through the `subagent` tool, or (text protocol) a socket its local commands reach.
    `folder`: where their trajectories go, if not beside the run's."""
    if depth >= config.agent.max_depth:
        return None
    tools = config.protocol.kind == "tools"
    if not tools and (config.environment.kind != "local" or borrowed):
        return None
    from miniswe.subagents import Delegation

    return Delegation(config, depth=depth, stop=stop, serve=not tools, renderer=renderer, notify=notify, folder=folder,
                      secrets=secrets)


def open_environment(config: Config, trajectory: Trajectory, *, run_id: str, stop: Stop,
                     notify: Callable[[str], None] = lambda message: None, delegation: Any = None,
                     depth: int = 0) -> Environment:
    """The run's environment, described in its trajectory (with its notices: a docker image that falls back
    to exec-per-step, unsafe run_args allowed). Local commands get `miniswe` on their PATH when there is a
    sub-agent or a skill to ask it for (see subagents.command_env)."""
    extra_env = {}
    if config.environment.kind == "local":
        from miniswe.skills import load_skills
        from miniswe.subagents import command_env

        skills, _ = load_skills(config.agent.skills_dirs)
        roots = list(dict.fromkeys(os.path.abspath(root) for root in config.agent.skills_dirs)) if skills else []
        extra_env = command_env(config, depth=depth, delegation=delegation, skills_dirs=roots)
    env = build_environment(config.environment, run_id=run_id, stop=stop, confine=config.policy.confine,
                            hidden_env=[getattr(config.model, "api_key_env", "")],
                            **({"extra_env": extra_env} if extra_env else {}))
    described = env.describe()
    trajectory.describe(environment=described)
    for notice in described.get("notices", ()):
        trajectory.warn(notice)
        notify(f"notice: {notice}")
    return env


def close_environment(env: Environment, trajectory: Trajectory) -> None:
    try:
        env.close()
    except Exception as error:  # a failed cleanup must not hide the run's own outcome
        trajectory.warn(f"environment cleanup failed: {error}")


def make_agent(
    config: Config,
    trajectory: Trajectory,
    env: Environment,
    *,
    secrets: Secrets,
    stop: Stop,
    renderer: Renderer | None = None,
    model: Model | None = None,
    gate: CallGate | None = None,
    hooks: Sequence[Any] = (),
    notify: Callable[[str], None] = lambda message: None,
    on_delta: Callable[[str, str], None] | None = None,
    ask: Callable[[str, str], bool] | None = None,
    delegation: Any = None,
    depth: int = 0,
    spawn_from: Model | None = None,
) -> Agent:
    """The model (unless given) and the agent that drives it in `env`. `on_delta(kind, text)` is told each piece
    of a streamed reply as it arrives; `ask(command, pattern)` is asked for commands policy.confirm matches.
    A sub-agent's model comes from its parent's (`spawn_from`): the same endpoint and gate, or script."""

    def on_retry(message: str) -> None:
        trajectory.add_usage(Usage(retries=1))  # counted as it happens: a run stopped mid-wait keeps its count
        notify(message)

    if model is None and spawn_from is not None and hasattr(spawn_from, "for_child"):
        model = spawn_from.for_child(stop=stop, on_retry=on_retry)
    model = model or build_model(config, gate=gate, stop=stop, on_retry=on_retry,
                                 calls_made=trajectory.usage.model_calls, on_delta=on_delta)
    return Agent(config, model, env, trajectory, renderer=renderer or Renderer(config.agent.templates_dir),
                 stop=stop, hooks=hooks, scrub=secrets.scrub, scrub_cut=secrets.scrub_cut, notify=notify, ask=ask,
                 delegation=delegation, depth=depth)


def _run_commands(env: Environment, commands: Sequence[str], config: Config, trajectory: Trajectory, stop: Stop,
                  phase: str, *, scrub: Callable[[str, str], str] = lambda text, notice: text,
                  deadline: float | None = None) -> Outcome | None:
    """Run setup or evaluation commands in order; the first failure is returned as a SetupError outcome. Each
    command's timeout is environment.timeout or what is left until `deadline` (agent.time_limit's), if sooner:
    a command the deadline cuts, or one not started since the time is up, ends the run as TimeExceeded.
    `scrub(output, elision notice)` masks secrets in an output before its tail is kept (a cut leaves no piece)."""
    for command in commands:
        if stop.outcome:
            return stop.outcome
        timeout = config.environment.timeout or NO_TIMEOUT
        left = deadline - time.monotonic() if deadline is not None else NO_TIMEOUT
        if left <= 0:
            return _out_of_time(config, phase, command, ran=False)
        cut_by_deadline = left < timeout
        with stop.cancelling(env.interrupt):
            result = env.execute(command, timeout=min(timeout, left))
        notice = elision_notice(result.elided_chars) if result.elided_chars else ""
        tail = scrub(result.output, notice)[-COMMAND_TAIL:]
        trajectory.record_command(phase, CommandRecord(command, result.returncode, result.timed_out, tail,
                                                       round(result.duration_s, 4)))
        trajectory.save()
        if result.interrupted:
            return stop.outcome
        if result.timed_out and cut_by_deadline:
            return _out_of_time(config, phase, command, ran=True)
        if result.returncode != 0:
            why = "timed out" if result.timed_out else f"exited {result.returncode}"
            last = tail.strip().splitlines()[-1:] or [""]
            return Outcome(ExitStatus.SETUP_ERROR, f"{phase} command {command!r} {why}: {last[0][:200]}")
    return None


def _out_of_time(config: Config, phase: str, command: str, *, ran: bool) -> Outcome:
    how = "killed" if ran else "not run"
    return Outcome(ExitStatus.TIME_EXCEEDED, f"time_limit of {number(config.agent.time_limit)}s reached during "
                                             f"{phase} ({phase} command {command!r} {how})")
