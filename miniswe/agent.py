"""The step loop: query the model, parse its one command, execute it, show the observation, repeat."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from miniswe.compaction import Compactor
from miniswe.config import Config
from miniswe.environments import CommandResult, Environment
from miniswe.environments.capture import elision_notice
from miniswe.errors import SandboxError
from miniswe.hooks import CommandEvent, Hooks, ModelCall, ReplyEvent, RunEnd, RunStart, StepEvent, load_hooks
from miniswe.limits import BudgetWarnings, Limits
from miniswe.models import Model, Reply
from miniswe.policy import CommandPolicy
from miniswe.protocol import FormatError, parse_command, submission, thought_of
from miniswe.repeats import RepeatDetector
from miniswe.signals import Stop
from miniswe.status import ExitStatus, Outcome, interrupted
from miniswe.templates import Renderer, number, prompt_variables
from miniswe.trajectory import Step, Trajectory, TrajectoryWriter
from miniswe.usage import Usage

# What the model sees before a command the person typed in chat's human mode, in place of its own thought.
HUMAN_THOUGHT = "THOUGHT: (the person typed this command and ran it themselves)"


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


def _longest_run(text: str, char: str) -> int:
    longest = run = 0
    for c in text:
        run = run + 1 if c == char else 0
        longest = max(longest, run)
    return longest


class Agent:
    """Runs one task's conversation. `run` returns the outcome the loop decided (submission, a limit, a stop, a
    hook) and lets failures it cannot decide on (model, sandbox, bugs) escape for the caller's outcome_of.

    Everything that observes or steers the loop is a hook (miniswe/hooks.py), called in this order: the
    command policy, loop detection, budget warnings, the config's hooks, the caller's (display, batch
    progress, approval), and last the trajectory writer, so the record holds what the others decided.
    """

    def __init__(
        self,
        config: Config,
        model: Model,
        env: Environment,
        trajectory: Trajectory,
        *,
        renderer: Renderer,
        stop: Stop,
        hooks: Sequence[Any] = (),
        scrub: Callable[[str], str] = lambda text: text,
        notify: Callable[[str], None] = lambda message: None,
        ask: Callable[[str, str], bool] | None = None,
    ):
        self.config = config
        self.model = model
        self.env = env
        self.trajectory = trajectory
        self.renderer = renderer
        self.stop = stop
        self.scrub = scrub
        self.notify = notify
        self.messages: list[dict[str, str]] = []
        self.format_errors = 0
        self.limits = Limits(config.agent)
        self.context = Compactor(config.agent, trajectory, model, renderer, notify)
        self.variables = prompt_variables(config, env.describe().get("cwd", ""))
        kind = config.environment.kind
        self.hooks = Hooks([
            CommandPolicy(config.policy, environment_kind=kind, ask=ask),
            RepeatDetector(config.agent.max_repeats),
            BudgetWarnings(self.limits, trajectory.usage),
            *load_hooks(config.agent.hooks),
            *hooks,
            TrajectoryWriter(trajectory, notify),
        ])

    def run(self, task: str, instance: dict[str, Any] | None = None) -> Outcome:
        """Run until submission, a limit, a stop or a hook's end; the trajectory is on disk after every step."""
        self._begin()
        first = [{"role": "system", "content": self.renderer.render("system.j2", **self.variables)},
                 {"role": "user", "content": self.renderer.render("instance.j2", task=task, instance=instance or {},
                                                                   **self.variables)}]
        self.messages += [{"role": m["role"], "content": m["content"]} for m in first]
        self.hooks("on_run_start", RunStart(task, first))
        return self._loop()

    def resume(self) -> Outcome:
        """Go on with the conversation the trajectory holds, from its last finished step: the model sees exactly
        what it saw, and no call is made again. A command cut short (the run's end, or miniswe's death while it
        ran) is reported to the model as such, not run again behind its back."""
        self._begin()
        self.load_context([{"role": m.role, "content": m.content} for m in self.trajectory.messages])
        self.trajectory.save()
        return self._loop()

    def load_context(self, messages: Sequence[dict[str, str]]) -> None:
        """Take up a recorded conversation (`messages`: what the model will be sent): a resumed run, a loaded chat
        session. The format error count is rebuilt, and a command cut short is reported to the model."""
        trajectory = self.trajectory
        self.messages = [{"role": m["role"], "content": m["content"]} for m in messages]
        self.format_errors = 0
        for step in reversed(trajectory.steps):
            if not step.format_error:
                break
            self.format_errors += 1
        self.settle()

    def settle(self) -> None:
        """Tell the model about the last command if it was cut short and the model has not been told yet (a
        resumed run, a chat turn after one Ctrl-C stopped, a session cleared)."""
        trajectory = self.trajectory
        last = trajectory.steps[-1] if trajectory.steps else None
        if trajectory.pending is not None:  # miniswe died while its command ran: what it did is unknown
            last = dataclasses.replace(trajectory.pending, aborted="miniswe stopped", returncode=None)
            self._after(last, lambda: self._observation(last, self.config.environment.timeout))
        elif last and last.aborted and not any(m.step == last.step and m.role == "user" for m in trajectory.messages):
            self._tell(last.step, self._observation(last, self.config.environment.timeout), written=False)

    def turn(self, task: str) -> Outcome:
        """A chat turn: the person's message (rendered like a run's task), then the loop until an outcome. Limits
        count this turn only; the trajectory keeps the session's totals. Hooks see the turn as a run: it starts
        (with its new messages) and ends (with its outcome)."""
        self._begin(turn=True)
        if self.messages:
            self.settle()
        first = self._opening()
        first.append({"role": "user", "content": self.renderer.render("instance.j2", task=task, instance={},
                                                                      **self.variables)})
        self.messages += first
        self.hooks("on_run_start", RunStart(task, first))
        return self._loop()

    def act(self, command: str) -> Outcome | None:
        """A step whose command the person typed (chat's human mode): run and recorded like the model's, through
        the same hooks, and shown to the model in the conversation as typed by the person; no model call is
        made. The step's outcome: a submission, a stop, or None."""
        self._begin(turn=True)
        if self.messages:
            self.settle()
        first = self._opening()
        self.messages += first
        self.hooks("on_run_start", RunStart(command, first))
        fence = "`" * max(3, _longest_run(command, "`") + 1)
        reply = Reply(content=f"{HUMAN_THOUGHT}\n\n{fence}{self.config.protocol.action_tags[0]}\n{command}\n{fence}",
                      usage=Usage())
        outcome = None
        try:
            outcome = self.stop.outcome or self._answer(len(self.trajectory.steps) + 1, reply, command)
        finally:
            if outcome is not None:
                self.hooks("on_run_end", RunEnd(outcome))
        return outcome

    def _opening(self) -> list[dict[str, str]]:
        """The system message, when the conversation has none yet (a chat session's first turn, or after /clear)."""
        if self.messages:
            return []
        return [{"role": "system", "content": self.renderer.render("system.j2", **self.variables)}]

    def _begin(self, *, turn: bool = False) -> None:
        self.limits.begin(self.trajectory.usage if turn else None)
        self.trajectory.describe(model=self.model.describe())

    def _loop(self) -> Outcome:
        outcome = None
        try:
            while outcome is None:
                outcome = self.stop.outcome or self.limits.reached(self.trajectory.usage) or self.step()
        finally:
            if outcome is not None:
                self.hooks("on_run_end", RunEnd(outcome))
        return outcome

    def step(self) -> Outcome | None:
        number_ = len(self.trajectory.steps) + 1
        sent = self.context.prepare(self.messages, self.limits.deadline)
        call = self.hooks("before_model_call", ModelCall(number_, sent))
        if call.stop:
            return call.stop
        reply = self.context.complete(self.messages, sent, self.limits.deadline)
        return self._answer(number_, reply)

    def _answer(self, number_: int, reply: Reply, command: str | None = None) -> Outcome | None:
        """The rest of a step, once its reply is in: parse it (unless the person gave the `command`), ask the
        hooks, run the command, observe."""
        self.messages.append({"role": "assistant", "content": reply.content})
        self.hooks("after_reply", ReplyEvent(number_, reply))
        made = {"thought": thought_of(reply.content), "reasoning": reply.reasoning, "finish_reason": reply.finish_reason,
                "usage": reply.usage, "latency_s": round(reply.latency_s, 4)}
        try:
            if reply.finish_reason == "length":
                raise FormatError("truncated", "the reply was cut off at the token limit (finish_reason=length)")
            if command is None:
                command = parse_command(reply.content, self.config.protocol.action_tags)
        except FormatError as error:
            return self._reject(Step(number_, format_error=error.kind, **made), error)
        self.format_errors = 0
        ask = self.hooks("before_command", CommandEvent(number_, command, made["thought"], proposed=command))
        proposed = command if ask.command != command else None
        if ask.veto:
            step = Step(number_, command=ask.command, refused=ask.veto, proposed=proposed, **made)
            return self._after(step, lambda: self._observation(step, 0))
        timeout = self.limits.command_timeout(self.config.environment.timeout)
        with self.stop.cancelling(self.env.interrupt):
            result = self.env.execute(ask.command, timeout=timeout)
        output = self.scrub(result.output)  # a command that found a secret (a .env file) must not record it
        step = Step(number_, command=ask.command, returncode=result.returncode, timed_out=result.timed_out,
                    output=output, output_chars=result.output_chars, elided_chars=result.elided_chars,
                    duration_s=round(result.duration_s, 4), aborted=self._aborted(result), proposed=proposed, **made)
        if result.sandbox_error or result.interrupted:
            self.hooks("after_command", StepEvent(step, ""))  # recorded; the run ends without telling the model
            if result.sandbox_error:
                raise SandboxError(result.sandbox_error)
            return self.stop.outcome or interrupted("SIGINT")
        stopped = self._after(step, lambda: self._observation(step, timeout))
        submitted = submission(output, result.returncode, self.config.protocol.submit_marker)
        if submitted is not None and result.elided_chars:
            # never a damaged submission: the middle of this one was not kept
            limit = self.config.environment.capture_limit
            return Outcome(ExitStatus.LIMITS_EXCEEDED, f"capture_limit: the submission's output is {result.output_chars} "
                           f"bytes and environment.capture_limit keeps {limit} whole; it was not taken. Raise "
                           "environment.capture_limit (0 = no limit) and run the task again")
        if submitted is not None:
            return Outcome(ExitStatus.SUBMITTED, None, submitted)
        if stopped:
            return stopped
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

    def _reject(self, step: Step, error: FormatError) -> Outcome | None:
        self.format_errors += 1
        limit = self.config.agent.max_format_errors
        if limit and self.format_errors >= limit:
            self.hooks("after_command", StepEvent(step, ""))
            return Outcome(ExitStatus.REPEATED_FORMAT_ERROR, f"{self.format_errors} malformed replies in a row; last: {error}")
        guidance = self.renderer.render(
            "format_error.j2", reason=error.kind, error=str(error),
            errors_left=(limit - self.format_errors) if limit else "Further",
            action_tag=self.variables["action_tag"], submit_marker=self.variables["submit_marker"],
        )
        return self._after(step, lambda: guidance)

    def _observation(self, step: Step, timeout: float) -> str:
        if step.refused:
            return f"<returncode>refused</returncode>\n<warning>The command did not run: {step.refused}</warning>"
        view, not_shown = bounded_view(step.output, self.config.agent.output_limit, step.elided_chars)
        return self.renderer.render(
            "observation.j2", output=view, returncode=step.returncode, timed_out=step.timed_out,
            command_timeout=number(round(timeout, 1)), elided_chars=not_shown, output_chars=step.output_chars,
            duration_s=round(step.duration_s, 3), aborted=step.aborted,
        )

    def _after(self, step: Step, observe: Callable[[], str]) -> Outcome | None:
        """The step's hooks; then the model is told the observation with their warnings. Their stop, if any."""
        try:
            observation = observe()
        except Exception:
            self.hooks("after_command", StepEvent(step, ""))  # the step stays on record, whatever its template does
            raise
        event = self.hooks("after_command", StepEvent(step, observation))
        self.messages.append({"role": "user", "content": event.message()})
        return event.stop

    def _tell(self, number_: int, text: str, *, written: bool) -> None:
        """A message to the model outside a step's hooks (a resumed run's note on its cut step)."""
        self.messages.append({"role": "user", "content": text})
        if not written:
            self.trajectory.add_message("user", text, number_)
