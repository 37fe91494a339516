"""The step loop: query the model, parse its one command, execute it, show the observation, repeat."""

from __future__ import annotations

import dataclasses
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from miniswe.config import Config
from miniswe.environments import CommandResult, Environment
from miniswe.errors import ModelError, SandboxError
from miniswe.models import Model, Reply
from miniswe.protocol import FormatError, parse_command, submission
from miniswe.redaction import scrub
from miniswe.status import ExitStatus
from miniswe.templates import Renderer, system_info
from miniswe.trajectory import Trajectory


class Interrupt(BaseException):
    """Raised in the main thread by the SIGTERM handler, like KeyboardInterrupt is for Ctrl-C."""

    def __init__(self, signal_name: str = "SIGINT"):
        super().__init__(signal_name)
        self.signal_name = signal_name


@dataclass
class Outcome:
    status: ExitStatus
    detail: str | None = None
    submission: str | None = None


def bounded_view(output: str, limit: int) -> tuple[str, int]:
    """What the model sees of an output: all of it, or head + tail of `limit` chars; and the elided count."""
    if limit <= 0 or len(output) <= limit:
        return output, 0
    half = limit // 2
    return output[:half] + "\n...\n" + output[len(output) - (limit - half) :], len(output) - limit


NO_TIMEOUT = 365 * 86400.0
StopCheck = Callable[[], "Outcome | None"]
StepObserver = Callable[[dict[str, Any], Reply], None]


class Agent:
    def __init__(
        self,
        config: Config,
        model: Model,
        env: Environment,
        trajectory: Trajectory,
        *,
        renderer: Renderer | None = None,
        on_step: StepObserver | None = None,
        should_stop: StopCheck | None = None,
    ):
        self.config = config
        self.model = model
        self.env = env
        self.trajectory = trajectory
        self.renderer = renderer or Renderer(config.agent.templates_dir)
        self.on_step = on_step
        self.should_stop = should_stop
        self.messages: list[dict[str, str]] = []
        self.usage = trajectory.data["usage"]
        self.format_errors = 0
        self.started = 0.0
        key = os.environ.get(config.model.api_key_env, "") if config.model.api_key_env else ""
        self._secrets = [key] if key else []
        self.variables = {
            **system_info(),
            "action_tag": config.protocol.action_tags[0],
            "submit_marker": config.protocol.submit_marker,
            "command_timeout": _number(config.environment.timeout),
            "output_limit": config.agent.output_limit,
            "cwd": env.describe().get("cwd", ""),
        }

    def run(self, task: str, instance: dict[str, Any] | None = None) -> Outcome:
        """Run until submission, a limit or a failure; the trajectory is on disk after every step."""
        self.started = time.monotonic()
        self.trajectory.data["model"] = self.model.describe()
        outcome = None
        try:
            self._add("system", self.renderer.render("system.j2", **self.variables))
            self._add("user", self.renderer.render("instance.j2", task=task, instance=instance or {}, **self.variables))
            self.trajectory.save()
            while outcome is None:
                outcome = self._limit_reached() or self.step()
                self.trajectory.save()
        except (KeyboardInterrupt, Interrupt) as error:
            outcome = Outcome(ExitStatus.INTERRUPTED, getattr(error, "signal_name", "SIGINT"))
        except ModelError as error:
            self.usage["retries"] += getattr(error, "retries", 0)
            outcome = Outcome(ExitStatus.MODEL_ERROR, str(error))
        except SandboxError as error:
            outcome = Outcome(ExitStatus.SANDBOX_ERROR, str(error))
        except Exception:
            outcome = Outcome(ExitStatus.ERROR, traceback.format_exc())
        self.trajectory.finish(outcome.status, outcome.detail, outcome.submission)
        self.trajectory.save()
        return outcome

    def step(self) -> Outcome | None:
        step_no = len(self.trajectory.steps) + 1
        reply = self.model.complete(self.messages)
        self._count(reply)
        self._add("assistant", reply.content, step=step_no, reasoning=reply.reasoning,
                  finish_reason=reply.finish_reason, usage=vars(reply.usage), latency_s=round(reply.latency_s, 4))
        try:
            if reply.finish_reason == "length":
                raise FormatError("truncated", "the reply was cut off at the token limit (finish_reason=length)")
            command = parse_command(reply.content, self.config.protocol.action_tags)
        except FormatError as error:
            return self._reject(step_no, reply, error)
        self.format_errors = 0
        timeout = self._command_timeout()
        try:
            result = self.env.execute(command, timeout=timeout)
        except (KeyboardInterrupt, Interrupt, SandboxError) as error:
            self._record_aborted(step_no, reply, command, error)
            raise
        self._observe(step_no, reply, command, result, timeout)
        submitted = submission(result.output, result.returncode, self.config.protocol.submit_marker)
        if submitted is not None:
            return Outcome(ExitStatus.SUBMITTED, None, submitted)
        if result.timed_out and self._time_left() <= 0:
            limit = _number(self.config.agent.time_limit)
            return Outcome(ExitStatus.TIME_EXCEEDED, f"time_limit of {limit}s reached during a command")
        return None

    def _reject(self, step_no: int, reply: Reply, error: FormatError) -> Outcome | None:
        self.format_errors += 1
        limit = self.config.agent.max_format_errors
        self._record(step_no, reply, command=None, format_error=error.kind, returncode=None, timed_out=False,
                     output="", output_chars=0, duration_s=0.0)
        if limit and self.format_errors >= limit:
            detail = f"{self.format_errors} malformed replies in a row; last: {error}"
            return Outcome(ExitStatus.REPEATED_FORMAT_ERROR, detail)
        guidance = self.renderer.render(
            "format_error.j2", reason=error.kind, error=str(error),
            errors_left=(limit - self.format_errors) if limit else "Further",
            action_tag=self.variables["action_tag"], submit_marker=self.variables["submit_marker"],
        )
        self._add("user", guidance, step=step_no)
        return None

    def _observe(self, step_no: int, reply: Reply, command: str, result: CommandResult, timeout: float) -> None:
        if self._secrets:  # a command that found the key (a .env file, another variable) must not record it
            result = dataclasses.replace(result, output=scrub(result.output, self._secrets))
        view, elided = bounded_view(result.output, self.config.agent.output_limit)
        self._record(step_no, reply, command=command, format_error=None, returncode=result.returncode,
                     timed_out=result.timed_out, output=result.output, output_chars=result.output_chars,
                     duration_s=round(result.duration_s, 4))
        observation = self.renderer.render(
            "observation.j2", output=view, returncode=result.returncode, timed_out=result.timed_out,
            command_timeout=_number(round(timeout, 1)), elided_chars=elided + result.elided_chars,
            output_chars=result.output_chars, duration_s=round(result.duration_s, 3),
        )
        self._add("user", observation, step=step_no)

    def _record_aborted(self, step_no: int, reply: Reply, command: str, error: BaseException) -> None:
        """The step whose command was cut short by a signal or a dead sandbox, with what it had printed."""
        partial = getattr(error, "partial_result", None)
        output = scrub(partial.output, self._secrets) if partial else ""
        self._record(step_no, reply, command=command, format_error=None, returncode=None, timed_out=False,
                     output=output, output_chars=partial.output_chars if partial else 0,
                     duration_s=round(partial.duration_s, 4) if partial else 0.0,
                     aborted="SIGINT" if isinstance(error, KeyboardInterrupt) else getattr(error, "signal_name", "SandboxError"))

    def _record(self, step_no: int, reply: Reply, **fields: Any) -> None:
        step = {"step": step_no, **fields}
        self.trajectory.add_step(step)
        if self.on_step:
            self.on_step(step, reply)

    def _add(self, role: str, content: str, **extras: Any) -> None:
        self.messages.append({"role": role, "content": content})
        self.trajectory.add_message(role, content, **extras)

    def _count(self, reply: Reply) -> None:
        usage = self.usage
        usage["model_calls"] += 1
        usage["retries"] += reply.retries
        for key in ("prompt_tokens", "completion_tokens", "total_tokens", "cached_tokens"):
            usage[key] += getattr(reply.usage, key)
        usage["cost"] = round(usage["cost"] + reply.usage.cost, 8)

    def _time_left(self) -> float:
        limit = self.config.agent.time_limit
        return limit - (time.monotonic() - self.started) if limit else float("inf")

    def _command_timeout(self) -> float:
        """The command's own timeout, or the run's time left if that is shorter (0 = no timeout: a year)."""
        return min(self.config.environment.timeout or NO_TIMEOUT, self._time_left())

    def _limit_reached(self) -> Outcome | None:
        agent, usage = self.config.agent, self.usage
        if agent.step_limit and usage["model_calls"] >= agent.step_limit:
            return Outcome(ExitStatus.LIMITS_EXCEEDED, f"step_limit: {agent.step_limit} model calls")
        if agent.token_limit and usage["total_tokens"] >= agent.token_limit:
            detail = f"token_limit: {usage['total_tokens']} >= {agent.token_limit} tokens"
            return Outcome(ExitStatus.LIMITS_EXCEEDED, detail)
        if agent.cost_limit and usage["cost"] >= agent.cost_limit:
            return Outcome(ExitStatus.LIMITS_EXCEEDED, f"cost_limit: ${usage['cost']:.4f} >= ${agent.cost_limit:g}")
        if self._time_left() <= 0:
            return Outcome(ExitStatus.TIME_EXCEEDED, f"time_limit of {_number(agent.time_limit)}s reached")
        return self.should_stop() if self.should_stop else None


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value
