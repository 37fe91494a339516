"""One run from config to finished trajectory: its context, environment, model and agent, then set up, loop,
evaluate, clean up.

`miniswe run`, every task of `miniswe batch` and every sub-agent go through `run_task`; a resumed or forked run
through resume.continue_run; all through `drive`, the one place where whatever escapes a run (a model or sandbox
failure, a bug, a stop) becomes its outcome. `assemble` builds a run's parts, for `drive` and for a chat session.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from miniswe import debuglog
from miniswe.agent import Agent
from miniswe.config import Config
from miniswe.context import RunContext
from miniswe.environments import Environment, build_environment, check_environment
from miniswe.environments.capture import elision_notice
from miniswe.errors import ConfigError, UsageError
from miniswe.hooks import load_hooks
from miniswe.limits import NO_TIMEOUT
from miniswe.models import Model, calls_tools, model_class
from miniswe.models.gate import CallGate
from miniswe.redaction import MASK, Secrets, check_forwarded_keys, masked_config, masked_left, secret_env
from miniswe.status import ExitStatus, Outcome, is_agent_outcome, outcome_of
from miniswe.templates import Renderer, prompt_variables
from miniswe.trajectory import COMMAND_TAIL, CommandRecord, Trajectory, new_run_id
from miniswe.usage import Usage


@dataclass
class RunResult:
    outcome: Outcome
    trajectory: Trajectory
    resolved: bool | None = None
    diverged: Any = None  # a continued run stopped because its environment did not replay the same (replay.Divergence)


def build_model(config: Config, **context: Any) -> Model:
    """A model of `config.model.kind`; `context` holds what a run adds (gate, stop, on_retry)."""
    return model_class(config.model.kind)(config.model, **context)


def agent_class(config: Config) -> type[Agent]:
    """The agent class `agent.kind` names: a built-in kind, or a subclass of miniswe.agent.Agent as module:Class."""
    from miniswe.plugins import KINDS, load_kind

    kind = config.agent.kind
    cls = load_kind(kind, KINDS["agent"], key="agent.kind", what="agent")
    if not issubclass(cls, Agent):
        raise ConfigError(f"agent.kind: {kind} is not a subclass of miniswe.agent.Agent (subclass it, and override "
                          "run, step, query or execute_actions)")
    return cls


def check_ready(config: Config, task: str = "", instance: dict[str, Any] | None = None,
                notify: Callable[[str], None] | None = None) -> Renderer:
    """Fail on bad input before anything runs: templates (rendered once for `task`), environment and model settings,
    the protocol. Skills that cannot be used are told to `notify` (stderr by default), one line each."""
    renderer = Renderer(config.agent.templates_dir)
    renderer.check_instance(task, instance or {}, prompt_variables(config, config.environment.cwd))
    load_hooks(config.agent.hooks)  # a hook that cannot be loaded is bad input, found before anything runs
    agent_class(config)
    check_environment(config.environment)
    container_key_notice(config)
    check_protocol(config)
    check_unmasked(config)
    build_model(config)  # the model refuses bad settings when built (no endpoint, no name, an unreadable script)
    report_skills(config, notify)
    return renderer


def container_key_notice(config: Config) -> str | None:
    """A container handed the model's key (`-e OPENAI_API_KEY`, forward_env) lets every command read and spend it:
    refused (ConfigError), unless allow_unsafe_run_args, when this is the notice to record and print."""
    env = config.environment
    if not hasattr(env, "forward_env"):
        return None
    return check_forwarded_keys(secret_env(config.model), env.forward_env, getattr(env, "run_args", ()),
                                allow=getattr(env, "allow_unsafe_run_args", False))


def check_protocol(config: Config) -> None:
    """protocol.kind: tools needs a model kind that can be sent tools."""
    if config.protocol.kind == "tools" and not calls_tools(model_class(config.model.kind)):
        raise ConfigError(f"protocol.kind: tools: model kind {config.model.kind!r} cannot call tools (its complete() "
                          "takes no `tools`); use protocol.kind: text")


def check_unmasked(config: Config) -> None:
    """A setting still masked (a resumed, forked or replayed run whose secret's variable is not set) would send
    the mask itself to the endpoint, or run commands with it as the secret's value: refused, naming the variable
    to set."""
    found = masked_left(config.to_dict(), ("model", "environment"))
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
    model: Model | None = None,
    gate: CallGate | None = None,
    environment: Environment | None = None,
    spawn_from: Model | None = None,
    **context: Any,
) -> RunResult:
    """Run one task; whatever happens, the trajectory on disk ends with an exit status. `known_secrets`: more
    secrets to mask than the run's own (a batch's: every task's). `context`: what RunContext takes besides (stop,
    renderer, notify, ask, hooks, on_delta, depth); the rest: see `assemble`."""
    check_output_path(trajectory_path)
    run_id = run_id or new_run_id()
    trajectory = Trajectory(
        trajectory_path, task=task, config=masked_config(config.to_dict()), environment={"kind": config.environment.kind},
        metadata={"run_id": run_id, **(metadata or {})},
    )
    # the clock starts here: one agent.time_limit for setup, the agent and evaluation
    ctx = RunContext.open(config, trajectory, known_secrets=known_secrets, **context)
    trajectory.save()

    def start(env: Environment, agent: Agent) -> Outcome:
        return run_commands(ctx, env, setup, "setup") or agent.run(task, instance)

    return drive(ctx, start, run_id=run_id, evaluate=evaluate, model=model, gate=gate, environment=environment,
                 spawn_from=spawn_from)


def check_output_path(path: str) -> None:
    """A trajectory path must be a regular file, or not be there yet: saving renames a new file over it, which
    would replace a FIFO, a socket or a device node."""
    if os.path.lexists(path) and not os.path.isfile(path):
        what = "a directory" if os.path.isdir(path) else "not a regular file"
        raise UsageError(f"-o {path}: exists and is {what}; a trajectory goes to a regular file or a new path")


def drive(ctx: RunContext, start: Callable[[Environment, Agent], Outcome], *, run_id: str,
          evaluate: Sequence[str] = (), **parts: Any) -> RunResult:
    """Assemble the run, `start` the loop, evaluate, clean up: the one place where whatever escapes a run becomes
    its outcome. `parts`: see `assemble` (an `environment` given is borrowed: neither opened nor closed here).
    A `Diverged` escaping `start` (a continued run whose environment did not replay the recording) keeps the
    run's previous end."""
    trajectory = ctx.trajectory
    with debuglog.task(str(trajectory.metadata.get("task_id") or "")):  # a batch's log says whose call it is
        borrowed = parts.get("environment") is not None
        env: Environment | None = None
        resolved = diverged = None
        try:
            env, agent = assemble(ctx, run_id=run_id, **parts)
            outcome = start(env, agent)
            if evaluate and outcome.status is not ExitStatus.SUBMITTED and is_agent_outcome(outcome.status):
                resolved = False  # nothing was submitted: whatever the working tree holds is not the agent's answer
                trajectory.set_resolved(resolved)
            elif evaluate and outcome.status is ExitStatus.SUBMITTED:
                failed = run_commands(ctx, env, evaluate, "evaluation")
                if failed is None or failed.status is ExitStatus.SETUP_ERROR:
                    resolved = failed is None
                    trajectory.set_resolved(resolved)
                elif failed.status is ExitStatus.TIME_EXCEEDED:  # the time limit cut evaluation: no verdict
                    outcome = Outcome(failed.status, failed.detail, outcome.submission)
                else:  # stopped mid-evaluation: no verdict, so the run counts as interrupted
                    outcome = failed
        except BaseException as error:
            divergence = getattr(error, "divergence", None)
            if divergence is not None:  # the run keeps the end it had; one that had none stays without a verdict
                diverged = divergence
                outcome = error.previous or Outcome(ExitStatus.INTERRUPTED, f"resume stopped: {divergence}")
            else:
                outcome = outcome_of(error, ctx.stop.outcome)
        finally:
            if env is not None and not borrowed:
                close_environment(env, trajectory)
            if ctx.delegation is not None:
                ctx.delegation.close()
        trajectory.finish(outcome)
        trajectory.save()
        return RunResult(outcome, trajectory, resolved, diverged)


def assemble(ctx: RunContext, *, run_id: str, environment: Environment | None = None, model: Model | None = None,
             gate: CallGate | None = None, spawn_from: Model | None = None, cls: type[Agent] | None = None,
             folder: str | None = None) -> tuple[Environment, Agent]:
    """A run's parts, in order: its sub-agents (when it may start them), its environment (or `environment`,
    borrowed: a sub-agent's parent's), its model (or `model`; a sub-agent's from its parent's, `spawn_from`: the
    same endpoint and gate, or script), and the agent of `agent.kind` (or `cls`) that drives them. Whatever was
    opened is closed again if a later part fails. `folder`: where sub-agents' trajectories go, if not beside the
    run's."""
    ctx.delegation = open_delegation(ctx, borrowed=environment is not None, folder=folder)
    env = environment
    try:
        env = env or open_environment(ctx, run_id=run_id)
        model = model or run_model(ctx, gate=gate, spawn_from=spawn_from)
        return env, (cls or agent_class(ctx.config))(ctx, model, env)
    except BaseException:
        if env is not None and environment is None:
            close_environment(env, ctx.trajectory)
        if ctx.delegation is not None:
            ctx.delegation.close()
            ctx.delegation = None
        raise


def run_model(ctx: RunContext, *, gate: CallGate | None = None, spawn_from: Model | None = None) -> Model:
    """The run's model: each retry counted in the record as it happens (a run stopped mid-wait keeps its count)
    and told; a sub-agent's from its parent's (`spawn_from`), when that kind can make one."""

    def on_retry(message: str) -> None:
        ctx.trajectory.add_usage(Usage(retries=1))
        ctx.notify(message)

    if spawn_from is not None and hasattr(spawn_from, "for_child"):
        return spawn_from.for_child(stop=ctx.stop, on_retry=on_retry)
    return build_model(ctx.config, gate=gate, stop=ctx.stop, on_retry=on_retry,
                       calls_made=ctx.trajectory.usage.model_calls, on_delta=ctx.on_delta)


def open_delegation(ctx: RunContext, *, borrowed: bool = False, folder: str | None = None) -> Any:
    """The run's sub-agents (subagents.Delegation), when it may start them: it is shallower than agent.max_depth,
    and it can reach them: through the `subagent` tool, or (text protocol) a socket its local commands reach.
    `folder`: where their trajectories go, if not beside the run's. A child is run by `run_task`, handed down."""
    config = ctx.config
    if ctx.depth >= config.agent.max_depth:
        return None
    tools = config.protocol.kind == "tools"
    if not tools and (config.environment.kind != "local" or borrowed):
        return None
    from miniswe.subagents import Delegation

    return Delegation(ctx, spawn=run_task, serve=not tools, folder=folder)


def open_environment(ctx: RunContext, *, run_id: str) -> Environment:
    """The run's environment, described in its trajectory (with its notices: a docker image that falls back
    to exec-per-step, unsafe run_args allowed). Local commands get `miniswe` on their PATH when there is a
    sub-agent or a skill to ask it for (see subagents.command_env)."""
    config, trajectory = ctx.config, ctx.trajectory
    extra_env = {}
    if config.environment.kind == "local":
        from miniswe.skills import load_skills
        from miniswe.subagents import command_env

        skills, _ = load_skills(config.agent.skills_dirs)
        roots = list(dict.fromkeys(os.path.abspath(root) for root in config.agent.skills_dirs)) if skills else []
        extra_env = command_env(config, depth=ctx.depth, delegation=ctx.delegation, skills_dirs=roots)
    env = build_environment(config.environment, run_id=run_id, stop=ctx.stop, confine=config.policy.confine,
                            hidden_env=secret_env(config.model),
                            **({"extra_env": extra_env} if extra_env else {}))
    described = env.describe()
    trajectory.describe(environment=described)
    key_notice = container_key_notice(config)
    for notice in [*described.get("notices", ()), *([key_notice] if key_notice else [])]:
        trajectory.warn(notice)
        ctx.notify(f"notice: {notice}")
    return env


def close_environment(env: Environment, trajectory: Trajectory) -> None:
    try:
        env.close()
    except Exception as error:  # a failed cleanup must not hide the run's own outcome
        trajectory.warn(f"environment cleanup failed: {error}")


def run_commands(ctx: RunContext, env: Environment, commands: Sequence[str], phase: str) -> Outcome | None:
    """Run setup or evaluation commands in order; the first failure is returned as a SetupError outcome. Each
    command's timeout is environment.timeout or the run's time left, if sooner: a command the time limit cuts,
    or one not started since the time is up, ends the run as TimeExceeded. Outputs are masked before their
    tail is kept (a cut leaves no piece of a secret)."""
    limits, trajectory, stop = ctx.limits, ctx.trajectory, ctx.stop
    for command in commands:
        if stop.outcome:
            return stop.outcome
        timeout = ctx.config.environment.timeout or NO_TIMEOUT
        left = limits.time_left()
        if left <= 0:
            return limits.out_of_time(f"{phase} ({phase} command {command!r} not run)")
        cut_by_deadline = left < timeout
        with stop.cancelling(env.interrupt):
            result = env.execute(command, timeout=min(timeout, left))
        notice = elision_notice(result.elided_chars) if result.elided_chars else ""
        tail = ctx.secrets.scrub_cut(result.output, notice)[-COMMAND_TAIL:]
        trajectory.record_command(phase, CommandRecord(command, result.returncode, result.timed_out, tail,
                                                       round(result.duration_s, 4)))
        trajectory.save()
        if result.interrupted:
            return stop.outcome
        if result.timed_out and cut_by_deadline:
            return limits.out_of_time(f"{phase} ({phase} command {command!r} killed)")
        if result.returncode != 0:
            why = "timed out" if result.timed_out else f"exited {result.returncode}"
            last = tail.strip().splitlines()[-1:] or [""]
            return Outcome(ExitStatus.SETUP_ERROR, f"{phase} command {command!r} {why}: {last[0][:200]}")
    return None
