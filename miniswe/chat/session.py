"""A chat session: one trajectory, one environment and one model for a whole conversation, driven turn by turn
by the same Agent as `miniswe run`.

Each turn is the person's message followed by the step loop until an outcome (limits count per turn, the
trajectory keeps the session's totals), or, in human mode, one command the person typed. Whatever escapes a
turn becomes its outcome here, as `runner.drive` does for a run, and the session goes on. /compact and /clear
change what the model is sent next (the context) while the trajectory keeps the whole history: the context is
`messages[context_from:]`, after the latest system message before it.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Sequence
from typing import Any

from miniswe import __version__
from miniswe.chat import store
from miniswe.chat.agent import ChatAgent
from miniswe.config import Config
from miniswe.context import RunContext
from miniswe.errors import ContextLengthError, UsageError
from miniswe.redaction import masked_config
from miniswe.runner import agent_class, assemble, close_environment, open_environment
from miniswe.signals import Stop
from miniswe.status import Outcome, outcome_of
from miniswe.templates import Renderer
from miniswe.trajectory import Trajectory, load, new_run_id, now_iso
from miniswe.usage import Usage


class ChatSession:
    def __init__(
        self,
        config: Config,
        *,
        stop: Stop,
        renderer: Renderer | None = None,
        hooks: Sequence[Any] = (),
        notify: Callable[[str], None] = lambda message: None,
        on_delta: Callable[[str, str], None] | None = None,
        ask: Callable[[str, str], bool] | None = None,
        mode: str = "confirm",
    ):
        self.config = config
        self.stop = stop
        self.mode = mode
        self._last_turn: Usage | None = None
        self.notify = notify
        self.trajectory = self._new_trajectory()
        self.claimed = False  # whether this session has taken the autosave file yet (at its first turn)
        self.saved: tuple[int, int] | None = None  # messages and steps at the last /save
        self.ctx = RunContext.open(config, self.trajectory, stop=stop, renderer=renderer, notify=notify, ask=ask,
                                   hooks=hooks, on_delta=on_delta)
        self.renderer = self.ctx.renderer
        # the configured agent kind, when it is chat's own or a subclass of it
        configured = agent_class(config)
        self.cls = configured if issubclass(configured, ChatAgent) else ChatAgent
        # sub-agents' trajectories go to MINISWE_HOME/subagents, named after the session's run id: not among sessions
        self.env, self.agent = assemble(self.ctx, run_id=self.trajectory.metadata["run_id"], cls=self.cls,
                                        folder=os.path.join(store.home(), "subagents"))
        self.model = self.agent.model

    # -- turns ---------------------------------------------------------------------------------------------
    def turn(self, text: str) -> Outcome:
        """The person's message, then the loop until the agent submits, a limit, a stop or a failure."""
        self._begin("task", text)
        self.trajectory.begin_turn()
        return self._guarded(self.agent.turn, text)

    def act(self, command: str) -> Outcome | None:
        """A command the person typed (human mode): one step, recorded like the model's; no model call."""
        self._begin("command", command)
        return self._guarded(self.agent.act, command)

    def _guarded(self, work, text: str) -> Outcome:
        """`work(text)` ended as an outcome, whatever ends it; a forced stop leaves a fresh environment."""
        try:
            outcome = work(text)
        except KeyboardInterrupt as error:
            outcome = outcome_of(error, self.stop.outcome)
            self._renew_environment()
        except BaseException as error:
            outcome = outcome_of(error, self.stop.outcome)
        self._end(outcome)
        return outcome

    def compact(self) -> Outcome | None:
        """The model summarises the conversation; the context becomes the system message, the request and the
        summary. The trajectory keeps everything. A failure (or a stop) is returned and nothing changes."""
        agent, trajectory = self.agent, self.trajectory
        if not any(m["role"] == "assistant" for m in agent.messages):
            raise UsageError("nothing to compact yet")
        request = self.renderer.render("compact.j2", submit_marker=self.config.protocol.submit_marker)
        agent.close_calls()
        asked = {"role": "user", "content": request}
        try:
            # /compact is wanted most when the conversation no longer fits: what is sent is compacted first, and
            # a refusal for length compacts it further, as a step's call would be
            sent = agent.compactor.prepare(agent.messages, None)
            for attempt in itertools.count():
                try:
                    reply = self.model.complete([*sent, asked], **agent.protocol.request())
                    break
                except ContextLengthError as error:
                    sent = agent.compactor.refused(agent.messages, [*sent, asked], error, attempt, None)
        except ContextLengthError as error:
            return outcome_of(ContextLengthError(f"{error}; /clear starts the model afresh (the session keeps the "
                                                 "history)", window=error.window), self.stop.outcome)
        except BaseException as error:
            return outcome_of(error, self.stop.outcome)
        self._claim()
        trajectory.add_usage(reply.usage)
        index = len(trajectory.messages)
        trajectory.add_message("user", request)
        trajectory.add_message("assistant", reply.content)
        agent.messages = [*agent.messages[:1], {"role": "user", "content": request},
                          {"role": "assistant", "content": reply.content}]
        self._record({"kind": "compact", "message": index, "at": now_iso(), "usage": reply.usage.to_dict()},
                     context_from=index)
        return None

    def clear(self) -> None:
        """The model starts afresh (the next turn begins with the system message); the trajectory keeps the history."""
        if self.agent.messages:
            self.agent.settle()
        index = len(self.trajectory.messages)
        self.agent.messages = []
        if index:
            self._record({"kind": "clear", "message": index, "at": now_iso()}, context_from=index)

    def context_size(self) -> int:
        return len(self.agent.messages)

    def turn_usage(self) -> Usage:
        """What the last turn used (the one running, during a turn)."""
        return self._last_turn or self.trajectory.usage.since(self.agent.limits.baseline)

    # -- files ---------------------------------------------------------------------------------------------
    def save(self) -> str:
        """Keep the session under its id (given at its first /save): the autosave goes on as well."""
        trajectory = self.trajectory
        if not trajectory.messages:
            raise UsageError("nothing to save yet: the session has no turn")
        session_id = (trajectory.session or {}).get("id") or store.new_id()
        self._claim()
        trajectory.set_session(id=session_id)
        self._summarise()
        trajectory.save()
        trajectory.copy_to(store.session_path(session_id))
        self.saved = (len(trajectory.messages), len(trajectory.steps))
        return session_id

    def unsaved(self) -> bool:
        trajectory = self.trajectory
        return bool(trajectory.messages) and self.saved != (len(trajectory.messages), len(trajectory.steps))

    def load(self, given: str) -> tuple[str, str | None]:
        """Go on with a saved session (an id, a unique prefix, or `autosave`): its conversation is taken up as it
        was, in this process's environment and model. The current session, if it has unsaved turns, is kept
        under its id first. The loaded session's id, and the id the current one was kept under (if it was)."""
        found = store.resolve(given)
        live = os.path.abspath(store.autosave_path())
        if os.path.abspath(found.path) == live and self.claimed:
            raise UsageError("that is this session (its autosave): nothing to load")
        recorded = load(found.path, redact=self.ctx.secrets.scrub)
        kept = self.save() if self.unsaved() else None
        if os.path.abspath(found.path) != live and os.path.exists(live) and not self.claimed:
            store.file_away(live)  # the last process's session, which this one would otherwise overwrite
        recorded.relocate(store.autosave_path())
        before = recorded.config
        recorded.set_config(masked_config(self.config.to_dict()))
        recorded.describe(environment=self.env.describe())
        recorded.resumes.append({"at": now_iso(), "from_step": len(recorded.steps), "miniswe_version": __version__,
                                 "loaded_from": found.id, "changes": _changes(before, recorded.config)})
        self.trajectory = self.ctx.trajectory = recorded
        self.claimed = True
        self.agent = self.cls(self.ctx, self.model, self.env)
        self.agent.load_context(self._context())
        recorded.save()
        self.saved = (len(recorded.messages), len(recorded.steps)) if found.id != store.AUTOSAVE else None
        return found.id, kept

    def close(self) -> None:
        """The session's end: its autosave written (when it had a turn), its environment closed."""
        try:
            if self.claimed:
                self._summarise()
                self.trajectory.save()
        finally:
            close_environment(self.env, self.trajectory)
            self._close_delegation()

    # -- inside --------------------------------------------------------------------------------------------
    def _new_trajectory(self) -> Trajectory:
        trajectory = Trajectory(store.autosave_path(), task="", config=masked_config(self.config.to_dict()),
                                environment={"kind": self.config.environment.kind},
                                metadata={"run_id": new_run_id(), "chat": True})
        trajectory.set_session(id=None, mode=self.mode, context_from=0, turns=[])
        return trajectory

    def _claim(self) -> None:
        """Before this session first writes the autosave, the last process's session there is kept under its id."""
        if not self.claimed:
            kept = store.file_away(store.autosave_path())
            if kept:
                self.notify(f"the previous session was kept as {kept} (/load {kept} goes on with it)")
            self.claimed = True

    def _begin(self, kind: str, text: str) -> None:
        self._last_turn = None
        self._claim()
        trajectory = self.trajectory
        if not trajectory.task:
            trajectory.task = text
        self._record({"kind": kind, "text": text, "message": len(trajectory.messages), "step": len(trajectory.steps) + 1,
                      "mode": self.mode, "started": now_iso()})

    def _end(self, outcome: Outcome | None) -> None:
        trajectory = self.trajectory
        turns = (trajectory.session or {}).get("turns") or []
        if turns:
            turns[-1].update(ended=now_iso(), exit_status=str(outcome.status) if outcome else None,
                             exit_detail=outcome.detail if outcome else None)
        if outcome is not None:
            trajectory.finish(outcome)
        self._last_turn = trajectory.usage.since(self.agent.limits.baseline)  # a later /compact is not the turn's
        self._summarise()
        trajectory.save()

    def _record(self, turn: dict[str, Any], **fields: Any) -> None:
        turns = [*((self.trajectory.session or {}).get("turns") or []), turn]
        self.trajectory.set_session(turns=turns, mode=self.mode, **fields)
        self.trajectory.save()

    def _summarise(self) -> None:
        trajectory = self.trajectory
        trajectory.set_session(summary=store.summary(trajectory.task, trajectory.exit_status), mode=self.mode)

    def _context(self) -> list[dict[str, str]]:
        """What the model is sent next, from the recorded messages: those since the last /compact or /clear,
        after the latest system message before them."""
        messages = self.trajectory.messages
        start = int((self.trajectory.session or {}).get("context_from") or 0)
        context = [m.wire() for m in messages[start:]]
        if not context or context[0]["role"] != "system":
            system = next((m for m in reversed(messages[:start]) if m.role == "system"), None)
            if system is not None:
                context.insert(0, {"role": "system", "content": system.content})
        return context

    def _renew_environment(self) -> None:
        """A third Ctrl-C (the escape hatch for a turn stuck where no canceller reaches) is raised wherever the turn
        was, perhaps inside the environment: a new one is started rather than trust its state. A local one
        keeps its working directory; a container starts afresh."""
        close_environment(self.env, self.trajectory)
        self.env = self._open_environment()
        self.agent.env = self.agent.tools.env = self.env
        self.notify("the environment was restarted after a forced stop")

    def _open_environment(self) -> Any:
        return open_environment(self.ctx, run_id=self.trajectory.metadata["run_id"])

    def _close_delegation(self) -> None:
        if self.ctx.delegation is not None:
            self.ctx.delegation.close()


def _changes(before: dict[str, Any], after: dict[str, Any]) -> dict[str, list[Any]]:
    from miniswe.resume import changes

    return changes(before, after)
