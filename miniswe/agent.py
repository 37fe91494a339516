"""The step loop: query the model, parse its one command, execute it, show the observation, repeat."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from miniswe.config import Config
from miniswe.environments import CommandResult, Environment
from miniswe.environments.capture import elision_notice
from miniswe.errors import SandboxError
from miniswe.limits import Limits
from miniswe.models import Model
from miniswe.protocol import FormatError, parse_command, submission, thought_of
from miniswe.signals import Stop
from miniswe.status import ExitStatus, Outcome, interrupted
from miniswe.templates import Renderer, number, prompt_variables
from miniswe.trajectory import Step, Trajectory

StepObserver = Callable[[Step], None]


def bounded_view(output: str, limit: int, capture_elided: int = 0) -> tuple[str, int]:
    """What the model sees of an output (all of it, or head + tail of `limit` characters), and how many of the
    output's characters it does not see, counting those the capture already left out (`capture_elided`)."""
    notice = elision_notice(capture_elided) if capture_elided else ""
    head, found, tail = output.partition(notice) if notice else (output, "", "")
    if not found:
        head, tail, notice = output, "", ""
    if limit <= 0 or len(head) + len(tail) <= limit:
        return head + notice + tail, capture_elided
    if not notice:
        half = limit // 2
        return output[:half] + "\n...\n" + output[len(output) - (limit - half) :], len(output) - limit
    # the capture kept a head and a tail already: share the view between them, one marker for both cuts
    shown_head = min(limit // 2 + max(limit - limit // 2 - len(tail), 0), len(head))
    shown_tail = limit - shown_head
    view = head[:shown_head] + "\n...\n" + tail[len(tail) - shown_tail :]
    return view, len(head) + len(tail) - limit + capture_elided


class Agent:
    """Runs one task's conversation. `run` returns the outcome the loop decided (submission, a limit, a stop)
    and lets failures it cannot decide on (model, sandbox, bugs) escape for the caller's status.outcome_of."""

    def __init__(
        self,
        config: Config,
        model: Model,
        env: Environment,
        trajectory: Trajectory,
        *,
        renderer: Renderer,
        stop: Stop,
        observers: Sequence[StepObserver] = (),
        scrub: Callable[[str], str] = lambda text: text,
        notify: Callable[[str], None] = lambda message: None,
    ):
        self.config = config
        self.model = model
        self.env = env
        self.trajectory = trajectory
        self.renderer = renderer
        self.stop = stop
        self.observers = list(observers)
        self.scrub = scrub
        self.notify = notify
        self.messages: list[dict[str, str]] = []
        self.format_errors = 0
        self.limits = Limits(config.agent)
        self.variables = prompt_variables(config, env.describe().get("cwd", ""))

    def run(self, task: str, instance: dict[str, Any] | None = None) -> Outcome:
        """Run until submission, a limit or a stop; the trajectory is on disk after every step."""
        self._begin()
        self._add("system", self.renderer.render("system.j2", **self.variables))
        self._add("user", self.renderer.render("instance.j2", task=task, instance=instance or {}, **self.variables))
        self.trajectory.save()
        return self._loop()

    def resume(self) -> Outcome:
        """Go on with the conversation the trajectory holds, from its last finished step: the model sees exactly
        what it saw, and no call is made again. A command cut short (the run's end, or miniswe's death while it
        ran) is reported to the model as such, not run again behind its back."""
        self._begin()
        trajectory = self.trajectory
        self.messages = [{"role": m.role, "content": m.content} for m in trajectory.messages]
        self.format_errors = 0
        for step in reversed(trajectory.steps):
            if not step.format_error:
                break
            self.format_errors += 1
        if trajectory.pending is not None:  # miniswe died while its command ran: what it did is unknown
            self._record(dataclasses.replace(trajectory.pending, aborted="miniswe stopped", returncode=None))
        last = trajectory.steps[-1] if trajectory.steps else None
        if last and last.aborted and not any(m.step == last.step and m.role == "user" for m in trajectory.messages):
            self._observe_step(last, self.config.environment.timeout)
        trajectory.save()
        return self._loop()

    def _begin(self) -> None:
        self.limits = Limits(self.config.agent)
        self.trajectory.describe(model=self.model.describe())

    def _loop(self) -> Outcome:
        while True:
            outcome = self.stop.outcome or self.limits.reached(self.trajectory.usage) or self.step()
            self.trajectory.save()
            if outcome is not None:
                return outcome

    def step(self) -> Outcome | None:
        number_ = len(self.trajectory.steps) + 1
        reply = self.model.complete(self.messages, deadline=self.limits.deadline)
        self.trajectory.add_usage(reply.usage)
        for warning in reply.warnings:
            self._warn(warning)
        self._add("assistant", reply.content, number_)
        call = {"thought": thought_of(reply.content), "reasoning": reply.reasoning, "finish_reason": reply.finish_reason,
                "usage": reply.usage, "latency_s": round(reply.latency_s, 4)}
        try:
            if reply.finish_reason == "length":
                raise FormatError("truncated", "the reply was cut off at the token limit (finish_reason=length)")
            command = parse_command(reply.content, self.config.protocol.action_tags)
        except FormatError as error:
            return self._reject(number_, call, error)
        self.format_errors = 0
        self.trajectory.set_pending(Step(number_, command=command, **call))
        self.trajectory.save()  # the reply is paid for: on disk before its command runs
        timeout = self.limits.command_timeout(self.config.environment.timeout)
        with self.stop.cancelling(self.env.interrupt):
            result = self.env.execute(command, timeout=timeout)
        output = self.scrub(result.output)  # a command that found a secret (a .env file) must not record it
        aborted = self._aborted(result)
        step = Step(number_, command=command, returncode=result.returncode, timed_out=result.timed_out,
                    output=output, output_chars=result.output_chars, elided_chars=result.elided_chars,
                    duration_s=round(result.duration_s, 4), aborted=aborted, **call)
        self._record(step)
        if result.sandbox_error:
            raise SandboxError(result.sandbox_error)
        if result.interrupted:
            return self.stop.outcome or interrupted("SIGINT")
        self._observe_step(step, timeout)
        submitted = submission(output, result.returncode, self.config.protocol.submit_marker)
        if submitted is not None and result.elided_chars:
            # never a damaged submission: the middle of this one was not kept
            limit = self.config.environment.capture_limit
            return Outcome(ExitStatus.LIMITS_EXCEEDED, f"capture_limit: the submission's output is {result.output_chars} "
                           f"bytes and environment.capture_limit keeps {limit} whole; it was not taken. Raise "
                           "environment.capture_limit (0 = no limit) and run the task again")
        if submitted is not None:
            return Outcome(ExitStatus.SUBMITTED, None, submitted)
        if result.timed_out and self.limits.time_left() <= 0:
            return self.limits.out_of_time("a command")
        return None

    def _aborted(self, result: CommandResult) -> str | None:
        if result.sandbox_error:
            return str(ExitStatus.SANDBOX_ERROR)
        if not result.interrupted:
            return None
        stop = self.stop.outcome
        return stop.detail if stop and stop.status is ExitStatus.INTERRUPTED and stop.detail else "stopped"

    def _reject(self, number_: int, call: dict[str, Any], error: FormatError) -> Outcome | None:
        self.format_errors += 1
        limit = self.config.agent.max_format_errors
        self._record(Step(number_, format_error=error.kind, **call))
        if limit and self.format_errors >= limit:
            return Outcome(ExitStatus.REPEATED_FORMAT_ERROR, f"{self.format_errors} malformed replies in a row; last: {error}")
        guidance = self.renderer.render(
            "format_error.j2", reason=error.kind, error=str(error),
            errors_left=(limit - self.format_errors) if limit else "Further",
            action_tag=self.variables["action_tag"], submit_marker=self.variables["submit_marker"],
        )
        self._add("user", guidance, number_)
        return None

    def _observe_step(self, step: Step, timeout: float) -> None:
        view, not_shown = bounded_view(step.output, self.config.agent.output_limit, step.elided_chars)
        observation = self.renderer.render(
            "observation.j2", output=view, returncode=step.returncode, timed_out=step.timed_out,
            command_timeout=number(round(timeout, 1)), elided_chars=not_shown, output_chars=step.output_chars,
            duration_s=round(step.duration_s, 3), aborted=step.aborted,
        )
        self._add("user", observation, step.step)

    def _record(self, step: Step) -> None:
        self.trajectory.record_step(step)
        for observer in self.observers:
            observer(step)

    def _add(self, role: str, content: str, step: int | None = None) -> None:
        self.messages.append({"role": role, "content": content})
        self.trajectory.add_message(role, content, step)

    def _warn(self, message: str) -> None:
        if message not in self.trajectory.warnings:
            self.trajectory.warn(message)
            self.notify(f"warning: {message}")
