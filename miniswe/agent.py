"""The step loop, in mini-swe-agent's shape: `run` -> `step` -> `query` -> `execute_actions`, each a method a
subclass may override. `agent.kind` picks the class (a short name, or `package.module:Class`)."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from typing import Any

from miniswe.compaction import Compactor
from miniswe.context import RunContext
from miniswe.environments import Environment
from miniswe.environments.capture import elision_notice
from miniswe.errors import ContextLengthError, SandboxError
from miniswe.hooks import CommandEvent, HookError, Hooks, ModelCall, ReplyEvent, RunEnd, RunStart, StepEvent, load_hooks
from miniswe.limits import BudgetWarnings
from miniswe.models import Model
from miniswe.policy import CommandPolicy
from miniswe.protocol import SHELL_TOOLS, Action, FormatError, Reply, answer, make_protocol, submission, unanswered
from miniswe.repeats import RepeatDetector
from miniswe.skills import catalog, load_skills
from miniswe.status import ExitStatus, Outcome, interrupted, outcome_of
from miniswe.templates import number, prompt_variables
from miniswe.tools import Toolbox
from miniswe.trajectory import Step, TrajectoryWriter, following, made_by
from miniswe.usage import Usage


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


class RunEnded(Exception):
    """Raised by a step to end the run with `outcome` (a hook that stops the run before a model call)."""

    def __init__(self, outcome: Outcome):
        super().__init__(outcome.detail or str(outcome.status))
        self.outcome = outcome


class Agent:
    """Runs one task's conversation. `run` returns the outcome the loop decided (submission, a limit, a stop, a
    hook) and lets failures it cannot decide on (model, sandbox, bugs) escape for the runner's outcome_of.

    Everything that observes or steers the loop is a hook (miniswe/hooks.py), called in this order: the
    command policy, loop detection, budget warnings, the config's hooks, the caller's (display, batch
    progress, approval), and last the trajectory writer, so the record holds what the others decided.

    The protocol (miniswe/protocol.py) says what a request carries and how a reply becomes actions: one fenced
    command (text), or each native tool call (tools). Each action is a step: asked about (before_command), run
    through the toolbox (miniswe/tools), recorded and observed the same way, whatever protocol brought it.
    """

    def __init__(self, ctx: RunContext, model: Model, env: Environment):
        self.ctx = ctx
        self.config = config = ctx.config
        self.model, self.env = model, env
        self.trajectory = trajectory = ctx.trajectory
        self.limits = ctx.limits
        self.messages: list[dict[str, Any]] = []
        self.format_errors = 0
        if ctx.delegation is not None:
            ctx.delegation.bind(self)
        skills, problems = load_skills(config.agent.skills_dirs)
        for problem in problems:
            trajectory.warn(problem, once=True)
        # skills are read with `miniswe skill` (local commands) or the skill tool; elsewhere they cannot be read
        tools = config.protocol.kind == "tools"
        readable = skills if tools or config.environment.kind == "local" else []
        self.tools = Toolbox(config, env, ctx.stop, skills=readable, delegation=ctx.delegation)
        self.protocol = make_protocol(config, self.tools.offered)
        self.variables = prompt_variables(config, env.describe().get("cwd", ""), skills=catalog(readable),
                                          subagents=ctx.delegation is not None, depth=ctx.depth,
                                          tools=self.protocol.tools)
        self.compactor = Compactor(config.agent, trajectory, model, ctx.renderer, ctx.notify,
                                   request=self.protocol.request)
        policy = CommandPolicy(config.policy, environment_kind=config.environment.kind, ask=ctx.ask)
        self.repeats = RepeatDetector(config.agent.max_repeats)
        self.hooks = Hooks([
            policy,
            self.repeats,
            BudgetWarnings(self.limits, trajectory.usage),
            *load_hooks(config.agent.hooks),
            *ctx.hooks,
            policy.rewritten(),
            TrajectoryWriter(trajectory, ctx.notify),
        ])

    # -- the loop ----------------------------------------------------------------------------------------------
    def run(self, task: str, instance: dict[str, Any] | None = None) -> Outcome:
        """Run until submission, a limit, a stop or a hook's end; the trajectory is on disk after every step."""
        self.trajectory.describe(model=self.model.describe())
        first = [{"role": "system", "content": self.render("system.j2")},
                 {"role": "user", "content": self.render("instance.j2", task=task, instance=instance or {})}]
        self.messages += [dict(m) for m in first]
        self.hooks("on_run_start", RunStart(task, first))
        return self._loop()

    def step(self) -> Outcome | None:
        """One model call, and the steps its actions make; the outcome that ends the run, if one does."""
        return self.execute_actions(self.query())

    def query(self) -> Reply:
        """The model's reply to the conversation as it is sent (compacted when it would not fit the window)."""
        sent = self.compactor.prepare(self.messages, self.limits.deadline)
        call = self.hooks("before_model_call", ModelCall(len(self.trajectory.steps) + 1, sent))
        if call.stop:
            raise RunEnded(call.stop)
        for attempt in itertools.count():
            try:
                reply = self.model.complete(sent, deadline=self.limits.deadline, **self.protocol.request())
            except ContextLengthError as error:
                sent = self.compactor.refused(self.messages, sent, error, attempt, self.limits.deadline)
                continue
            self.compactor.answered(sent, reply)
            return reply
        raise AssertionError("unreachable")

    def execute_actions(self, reply: Reply, typed: Action | None = None) -> Outcome | None:
        """The rest of a model call, once its reply is in: read its actions (the one command, or each tool call;
        `typed`: a person's command instead), then for each in turn a step: ask the hooks, run it, observe. The
        first outcome ends the reply's steps; calls left are answered as not run."""
        first = len(self.trajectory.steps) + 1
        self.trajectory.add_usage(reply.usage)  # the budget counts the call before any hook hears of it
        self.messages.append(self.protocol.assistant(reply))
        self.hooks("after_reply", ReplyEvent(first, reply))
        made = made_by(reply)
        actions = [typed] if typed is not None else self.protocol.actions(reply)
        # a reply that ran nothing counts once against max_format_errors, however many calls it botched
        self.format_errors = 0 if any(action.error is None for action in actions) else self.format_errors + 1
        outcome = None
        for action in actions:
            number_ = first + action.index
            record = made if action.index == 0 else following(made)
            if action.index and self.ctx.stop.outcome:  # a stop is noticed between steps, the calls of a reply too
                outcome = self.ctx.stop.outcome
            elif action.error is not None:
                outcome = self._reject(Step(number_, format_error=action.error.kind, tool_call=action.record(),
                                            **record), action.error)
            else:
                outcome = self.execute(action, number_, record)
            if outcome is not None:
                self._close_calls(f"the run ended ({outcome.status}) before this call")
                break
        return outcome

    def execute(self, action: Action, number_: int, made: dict[str, Any]) -> Outcome | None:
        """One action's step: ask the hooks, run it through the toolbox, record and observe it."""
        call = action.record()
        ask = self.hooks("before_command", CommandEvent(number_, action.command, made["thought"], proposed=action.command,
                                                        tool=action.tool, tool_call=call))
        proposed = action.command if ask.command != action.command else None
        if ask.veto:
            step = Step(number_, command=ask.command, refused=ask.veto, proposed=proposed, tool_call=call, **made)
            return self._after(step, lambda: self._observation(step, 0))
        if proposed is not None:
            action = action.as_bash(ask.command)
        timeout = self.limits.command_timeout(self.config.environment.timeout)
        result, children = self.tools.run(number_, action, timeout)
        for link in children:  # a sub-agent's usage is the run's: counted before the hooks look at the budget
            self.trajectory.add_usage(Usage.from_dict(link.get("usage")))
        # a command that found a secret (a .env file) must not record it, nor a piece of it where the capture cut
        notice = elision_notice(result.elided_chars) if result.elided_chars else ""
        output = self.ctx.secrets.scrub_cut(result.output, notice)
        step = Step(number_, command=ask.command, returncode=result.returncode, timed_out=result.timed_out,
                    output=output, output_chars=result.output_chars, elided_chars=result.elided_chars,
                    duration_s=round(result.duration_s, 4), aborted=self._aborted(result), proposed=proposed,
                    tool_call=call, children=[self._scrubbed(link) for link in children] or None, **made)
        if result.sandbox_error or result.interrupted:
            self.hooks("after_command", StepEvent(step, ""))  # recorded; the run ends without telling the model
            if result.sandbox_error:
                error = SandboxError(result.sandbox_error)
                error.by_agent_command = result.by_agent_command  # type: ignore[attr-defined]  (SandboxDestroyed)
                raise error
            return self.ctx.stop.outcome or interrupted("SIGINT")
        stopped = self._after(step, lambda: self._observation(step, timeout))
        submitted = self._submitted(step, shell=action.tool in SHELL_TOOLS)
        if submitted or stopped:
            return submitted or stopped
        if result.timed_out and self.limits.time_left() <= 0:
            return self.limits.out_of_time("a command")
        return None

    def render(self, template: str, **variables: Any) -> str:
        """A prompt template, with what every prompt may say about the run."""
        return self.ctx.renderer.render(template, **{**self.variables, **variables})

    # -- going on with a recorded conversation ----------------------------------------------------------------
    def resume(self, *, fork: bool = False) -> Outcome:
        """Go on with the conversation the trajectory holds, from its last finished step: the model sees exactly
        what it saw, and no call is made again. A command cut short (the run's end, or miniswe's death while it
        ran) is reported to the model as such, not run again behind its back. A run whose last recorded step
        ended it ends so; a `fork` goes on from its last kept step whatever it did (another model or other
        limits may take it further). The run's clock counts the recorded time (see RunContext.open)."""
        self.trajectory.describe(model=self.model.describe())
        repeated = self.repeats.recall(self.trajectory.steps)  # before a command cut short is recorded, seen live
        self.load_context([m.wire() for m in self.trajectory.messages])
        self.trajectory.save()
        ended = None if fork else self._recorded_end(repeated)
        return self._until_end(lambda: ended) if ended else self._loop()

    def _recorded_end(self, repeated: Outcome | None) -> Outcome | None:
        """The end the recorded steps already brought, when miniswe died after recording the last step and before
        its end (a submission, the last malformed reply allowed, or `repeated`: a repeat past the limit): the
        model must not be asked again."""
        trajectory = self.trajectory
        if not trajectory.steps or trajectory.steps[-1].aborted:
            return None
        last = trajectory.steps[-1]
        if last.format_error:
            limit = self.config.agent.max_format_errors
            if limit and self.format_errors >= limit:
                return Outcome(ExitStatus.REPEATED_FORMAT_ERROR,
                               f"{self.format_errors} malformed replies in a row; last: {last.format_error}")
            return None
        tool = (last.tool_call or {}).get("name")
        return self._submitted(last, shell=tool is None or tool in SHELL_TOOLS or last.proposed is not None) or repeated

    def load_context(self, messages: Sequence[dict[str, Any]]) -> None:
        """Take up a recorded conversation (`messages`: what the model will be sent): a resumed run, a loaded chat
        session. The format error count is rebuilt, and a command cut short is reported to the model."""
        trajectory = self.trajectory
        self.messages = [dict(m) for m in messages]
        self.format_errors = 0
        for step in reversed(trajectory.steps):
            if not step.format_error:
                break
            if step.first_of_call:
                self.format_errors += 1
        self.settle()

    def settle(self) -> None:
        """Tell the model about the last command if it was cut short and the model has not been told yet (a
        resumed run, a chat turn after one Ctrl-C stopped, a session cleared); and answer the tool calls the run
        stopped before, since every call must be answered before the model is asked again."""
        trajectory = self.trajectory
        last = trajectory.steps[-1] if trajectory.steps else None
        if trajectory.pending is not None:  # miniswe died while its command ran: what it did is unknown
            last = dataclasses.replace(trajectory.pending, aborted="miniswe stopped", returncode=None)
            self._after(last, lambda: self._observation(last, self.config.environment.timeout))
        elif last and last.aborted and not any(m.step == last.step and m.role in ("user", "tool")
                                               for m in trajectory.messages):
            self._tell(last, self._observation(last, self.config.environment.timeout))
        self._close_calls("the run stopped before this call")

    def close_calls(self) -> None:
        """Answer the tool calls the run stopped before (chat's /compact asks the model outside the loop)."""
        self._close_calls("the run stopped before this call")

    # -- inside ------------------------------------------------------------------------------------------------
    def _loop(self) -> Outcome:
        def steps() -> Outcome:
            outcome = None
            while outcome is None:
                try:
                    outcome = self.ctx.stop.outcome or self.limits.reached(self.trajectory.usage) or self.step()
                except RunEnded as ended:
                    outcome = ended.outcome
            return outcome

        return self._until_end(steps)

    def _until_end(self, work: Callable[[], Outcome | None]) -> Outcome | None:
        """`work()`, then on_run_end with how it ended: its outcome, or the one what escaped it becomes (raised
        on after the hooks heard of it). A hook failing there adds a warning; the outcome stands."""
        try:
            outcome = work()
        except (Exception, KeyboardInterrupt) as error:  # SystemExit and the like are not a run's end
            self._run_end(outcome_of(error, self.ctx.stop.outcome))
            raise
        if outcome is not None:
            self._run_end(outcome)
        return outcome

    def _run_end(self, outcome: Outcome) -> None:
        try:
            self.hooks("on_run_end", RunEnd(outcome))
        except HookError as error:
            self.ctx.warn(str(error))

    def _submitted(self, step: Step, *, shell: bool) -> Outcome | None:
        """The end a step's output brings: a submission (only a shell command's: a file whose first line is the
        marker, read by read_file, submits nothing), never a damaged one."""
        if not shell or step.refused:
            return None
        submitted = submission(step.output, step.returncode, self.config.protocol.submit_marker)
        if submitted is None:
            return None
        if step.elided_chars:  # the middle of this one was not kept
            limit = self.config.environment.capture_limit
            return Outcome(ExitStatus.LIMITS_EXCEEDED, f"capture_limit: the submission's output is {step.output_chars} "
                           f"bytes and environment.capture_limit keeps {limit} whole; it was not taken. Raise "
                           "environment.capture_limit (0 = no limit) and run the task again")
        return Outcome(ExitStatus.SUBMITTED, None, submitted)

    def _scrubbed(self, link: dict[str, Any]) -> dict[str, Any]:
        """A sub-agent's link as the step records it (its submission is in its own trajectory, and in the output)."""
        scrub = self.ctx.secrets.scrub
        return {key: scrub(value) if isinstance(value, str) else value for key, value in link.items()
                if key != "submission"}

    def _aborted(self, result: Any) -> str | None:
        if result.sandbox_error:
            return str(ExitStatus.SANDBOX_ERROR)
        if not result.interrupted:
            return None
        stop = self.ctx.stop.outcome
        return stop.detail if stop and stop.status is ExitStatus.INTERRUPTED and stop.detail else "stopped"

    def _reject(self, step: Step, error: FormatError) -> Outcome | None:
        limit = self.config.agent.max_format_errors
        if limit and self.format_errors >= limit:
            self.hooks("after_command", StepEvent(step, ""))
            return Outcome(ExitStatus.REPEATED_FORMAT_ERROR, f"{self.format_errors} malformed replies in a row; last: {error}")
        guidance = self.render("format_error.j2", reason=error.kind, error=str(error),
                               errors_left=(limit - self.format_errors) if limit else "Further",
                               protocol=self.protocol.kind)
        return self._after(step, lambda: guidance)

    def _observation(self, step: Step, timeout: float) -> str:
        return self._edited(step) + self._result(step, timeout)

    @staticmethod
    def _edited(step: Step) -> str:
        """What the model must know when its command was changed before it ran (the person edited it at the
        approval prompt, or a hook rewrote it): otherwise it believes its own command ran."""
        if step.proposed is None or step.proposed == step.command:
            return ""
        what = "the edited command below was refused" if step.refused else "this ran instead of yours"
        return (f"<warning>Your command was edited before it ran (by the person, or a hook); {what}:\n"
                f"{step.command}</warning>\n")

    def _result(self, step: Step, timeout: float) -> str:
        if step.refused:
            return f"<returncode>refused</returncode>\n<warning>The command did not run: {step.refused}</warning>"
        view, not_shown = bounded_view(step.output, self.compactor.view_limit(self.config.agent.output_limit),
                                         step.elided_chars)
        return self.ctx.renderer.render(
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
        self.messages.append(answer(step, event.message()))
        return event.stop

    def _tell(self, step: Step, text: str) -> None:
        """A message to the model outside a step's hooks (a resumed run's note on its cut step)."""
        message = answer(step, text)
        self.messages.append(message)
        self.trajectory.add_message(message["role"], text, step.step, tool_call_id=message.get("tool_call_id"))

    def _close_calls(self, why: str) -> None:
        for call_id in unanswered(self.messages):
            text = f"Not run: {why}."
            self.messages.append({"role": "tool", "tool_call_id": call_id, "content": text})
            self.trajectory.add_message("tool", text, len(self.trajectory.steps) or None, tool_call_id=call_id)
