"""Context compaction: what the model is sent once the conversation outgrows its context window.

The agent keeps every message, and so does the trajectory; the model is sent a projection of them. Before a
call, the prompt's size is estimated from the last call's prompt tokens, scaled by the characters sent since.
When it would pass the trigger (the window less a reserve: room for the longest reply yet plus a tenth of the
window, and never more than max(15% of it, 16k tokens) or half of it), the projection is compacted to 60% of
the trigger:

1. older turns are elided, oldest first, observations and replies alike: each keeps its first line and a note
   of what was left out;
2. if that is not enough, the model summarises the middle of the conversation, and the summary stands in for
   it from then on: a frozen checkpoint (a later one summarises the earlier summary with what followed);
3. if the newest turns still do not fit (a window learned only after a long output came), observations are
   clipped to a quarter of the window, head and tail.

The system message, the task and the newest turn are never cut, nor the newest `agent.keep_turns` turns while
they fit under the goal; once the window is known, each new observation is sized to a quarter of it, so one
long output never ends a run. The projection is a
function of the messages and one checkpoint (an index up to which observations are elided, one up to which
the summary stands in), so between compactions the prompt only grows at its end and an endpoint's prefix cache
keeps working; a resumed run goes on from the recorded checkpoint. Each compaction is recorded in the
trajectory's `compactions`, with the summary and what it cost.

A context-length refusal teaches the window (from the refusal's message, or the refused prompt's size) and the
call is made again on a compacted projection rather than ending the run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from miniswe.errors import ContextLengthError
from miniswe.models import Model, Reply
from miniswe.templates import Renderer
from miniswe.trajectory import Trajectory, now_iso

RESERVE_SHARE, RESERVE_MIN = 0.15, 16_000  # the most a reserve needs to be, on a large window
REPLY_ROOM = 256  # tokens kept for a reply before any reply was seen
MARGIN = 0.1  # of the window, kept past the reply for estimates that run short
OBSERVATION_SHARE = 0.25  # of a known window, the most one observation takes
GOAL = 0.6  # compaction goes down to this share of the trigger, so it happens seldom
FIRST_RATE = 1 / 3  # tokens per character until an answer reports its prompt tokens (code runs ~3-4)
OVERFLOW_RETRIES = 3
OBSERVATIONS = ("user", "tool")
ELIDED = (*OBSERVATIONS, "assistant")


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """Indices are the trajectory's message indices, so a resumed run and a chat session map them back."""

    elided_through: int = -1  # observations and replies up to this message are elided
    summary_through: int = -1  # the messages after the task up to this one are replaced by the summary
    summary: str = ""
    clip: int = 0  # characters: observations longer than this are shown head and tail (0: none are)


NOTHING = Checkpoint()


class Compactor:
    def __init__(self, agent_config: Any, trajectory: Trajectory, model: Model, renderer: Renderer,
                 notify: Callable[[str], None] = lambda message: None,
                 request: Callable[[], dict[str, Any]] = dict):
        self.trajectory = trajectory
        self.request = request  # what every call carries besides the messages (the tools, with tool calling)
        self.model = model
        self.renderer = renderer
        self.notify = notify
        self.keep_turns = max(1, agent_config.keep_turns)
        self.window = agent_config.context_window
        self._rate = 0.0  # tokens per character sent; calibrated by each answer's prompt tokens
        self._calibration: tuple[int, Sequence[dict[str, Any]]] | None = None  # the last answer's, not counted yet
        self.longest_reply = 0  # completion tokens of the longest reply yet: room the next one may need
        self.measured = False  # whether the rate comes from an answer's figures, not from a guess
        self.checkpoint = NOTHING
        self._elided: dict[int, str] = {}  # message index → its elided form, rendered once
        summary = ""
        for entry in trajectory.compactions:  # a resumed run, a loaded session: the same projection as before
            summary = entry.get("summary", summary)
            self.checkpoint = Checkpoint(int(entry.get("elided_through", -1)), int(entry.get("summary_through", -1)),
                                         summary, int(entry.get("clip") or 0))
            if entry.get("window"):
                self.window = min(self.window or entry["window"], entry["window"])

    @property
    def rate(self) -> float:
        # counted when asked for: without a window, nothing asks, and a long run does not weigh its whole
        # conversation after every reply
        if self._calibration is not None:
            tokens, projected = self._calibration
            self._calibration = None
            self._rate = tokens / max(1, _chars(projected))
        return self._rate

    @rate.setter
    def rate(self, value: float) -> None:
        self._calibration = None
        self._rate = value

    # -- what the agent calls ------------------------------------------------------------------------------
    def prepare(self, messages: Sequence[dict[str, Any]], deadline: float | None) -> list[dict[str, Any]]:
        """What the model is sent next: the projection, compacted first when it would not fit."""
        if not self._rate and self._calibration is None:  # (not `self.rate`: reading it counts the conversation)
            self.rate = self._recorded_rate(messages) or FIRST_RATE
        projected = self.project(messages)
        if self.window and self.estimate(projected) > self.trigger():
            self.compact(messages, deadline, why="the conversation neared the context window")
            projected = self.project(messages)
            if self.measured and self.estimate(projected) > self.window:
                # sent anyway it would only be refused (or, by llama.cpp's servers, answered with an empty stream)
                raise self._no_fit(messages, ContextLengthError(
                    f"the prompt would come to about {self.estimate(projected)} tokens, more than the model's "
                    f"context window ({self.window})", window=self.window))
        return projected

    def refused(self, messages: Sequence[dict[str, Any]], projected: list[dict[str, Any]], error: ContextLengthError,
                attempt: int, deadline: float | None) -> list[dict[str, Any]]:
        """What to send instead of `projected` after the endpoint refused its length (the `attempt`-th refusal of
        this call): learn the window from the refusal, compact further; raised on when nothing more can be cut."""
        if attempt >= OVERFLOW_RETRIES:
            raise error
        self._learn(projected, error)
        if not self.compact(messages, deadline, why="the endpoint refused the prompt's length"):
            raise self._no_fit(messages, error) from None
        return self.project(messages)

    def answered(self, projected: list[dict[str, Any]], reply: Reply) -> None:
        """A reply to `projected` came: its prompt tokens tell the tokenizer's rate, its length the reply room."""
        if reply.usage.prompt_tokens > 0:
            self._calibration = (reply.usage.prompt_tokens, projected)
            self.measured = True
        self.longest_reply = max(self.longest_reply, reply.usage.completion_tokens)

    def view_limit(self, output_limit: int) -> int:
        """How many characters of a command's output the model is shown: agent.output_limit, and no more than a
        quarter of a known window."""
        if not self.window:
            return output_limit
        fits = max(200, int(self.window * OBSERVATION_SHARE / (self.rate or FIRST_RATE)))
        return min(output_limit, fits) if output_limit > 0 else fits

    # -- the projection ------------------------------------------------------------------------------------
    def project(self, messages: Sequence[dict[str, Any]], end: int | None = None) -> list[dict[str, Any]]:
        """What the model is sent of messages[:end] (all of them by default)."""
        if not messages:
            return []
        if self.checkpoint == NOTHING:  # nothing compacted yet: the conversation as it is
            return list(messages[:end])
        start = self._start(messages)
        checkpoint = self.checkpoint
        summarised = checkpoint.summary and checkpoint.summary_through > start  # after this context's task
        projected = [dict(messages[0])]
        for i in range(1, len(messages) if end is None else end):
            index, message = start + i - 1, messages[i]
            if i == 1 and summarised:
                summary = self.renderer.render("summary.j2", summary=checkpoint.summary)
                projected.append({**message, "content": f"{message['content']}\n\n{summary}"})
            elif i >= 2 and summarised and index <= checkpoint.summary_through:
                continue
            elif i >= 2 and index <= checkpoint.elided_through and message.get("role") in ELIDED:
                projected.append({**message, "content": self._elide(index, message)})
            elif checkpoint.clip and message.get("role") in OBSERVATIONS and len(message.get("content") or "") > checkpoint.clip:
                projected.append({**message, "content": _clip(message["content"], checkpoint.clip)})
            else:
                projected.append(dict(message))
        return projected

    def estimate(self, projected: Sequence[dict[str, Any]]) -> int:
        return int(_chars(projected) * self.rate)

    def trigger(self) -> int:
        """The prompt size past which the conversation is compacted: the window less room for the reply."""
        return self.window - self.reserve()

    def reserve(self) -> int:
        needed = max(self.longest_reply, REPLY_ROOM) + int(self.window * MARGIN)
        return min(needed, max(int(self.window * RESERVE_SHARE), RESERVE_MIN), self.window // 2)

    # -- compacting ------------------------------------------------------------------------------------------
    def compact(self, messages: Sequence[dict[str, Any]], deadline: float | None, *, why: str) -> bool:
        """Elide, then summarise if need be, down to the goal; recorded. False when nothing could be cut."""
        goal = int(self.trigger() * GOAL)
        before, start, protected = self.estimate(self.project(messages)), self._start(messages), self._protected(messages)
        entry: dict[str, Any] = {}
        old = self.checkpoint
        for i in range(2, protected):
            index = start + i - 1
            if index <= max(old.elided_through, old.summary_through) or messages[i].get("role") not in ELIDED:
                continue
            self.checkpoint = dataclasses.replace(self.checkpoint, elided_through=index)
            if self.estimate(self.project(messages)) <= goal:
                break
        if protected > 2 and self._summary_pays(messages, protected, goal):
            entry = self._summarise(messages, protected, deadline)
        if self.estimate(self.project(messages)) > self.trigger():
            clip = int(self.window * OBSERVATION_SHARE / self.rate)
            if any(m.get("role") in OBSERVATIONS and len(m.get("content") or "") > clip for m in messages[2:]):
                self.checkpoint = dataclasses.replace(self.checkpoint, clip=min(clip, self.checkpoint.clip or clip))
        after = self.estimate(self.project(messages))
        if self.checkpoint == old:
            return False
        self.trajectory.add_compaction({
            "step": len(self.trajectory.steps), "at": now_iso(), "why": why,
            "kind": "summary" if entry else "elide", "window": self.window,
            "tokens_before": before, "tokens_after": after,
            "elided_through": self.checkpoint.elided_through, "summary_through": self.checkpoint.summary_through,
            **({"clip": self.checkpoint.clip} if self.checkpoint.clip else {}),
            **entry,
        })
        self.trajectory.save()
        what = "summarised the middle of the conversation" if entry else "elided older observations"
        self.notify(f"context compacted ({why}): {what}; about {before} → {after} tokens of a {self.window}-token window")
        return True

    def _summary_pays(self, messages: Sequence[dict[str, Any]], protected: int, goal: int) -> bool:
        """Whether to ask for a summary once eliding is done: when the projection is still over the goal and the
        middle it would replace weighs enough (a quarter of the goal), or nothing less would fit. When the newest
        turns alone are near the goal, a summary of a thin middle would be asked for at every compaction: a
        model call each time, and a changed prefix for the cache."""
        now = self.estimate(self.project(messages))
        if now <= goal:
            return False
        middle = now - self.estimate([messages[0], messages[1], *messages[protected:]])
        return middle >= goal // 4 or now > self.trigger()

    def _summarise(self, messages: Sequence[dict[str, Any]], protected: int, deadline: float | None) -> dict[str, Any]:
        """A frozen summary of messages[2:protected], made by the model from what it sees of them now."""
        request = self.renderer.render("summarize.j2")
        asked = [*self.project(messages, protected), {"role": "user", "content": request}]
        if self.estimate(asked) > self.window - self.reserve():
            return {}  # the request itself would not fit: what was elided is all there is to do
        summarize = getattr(self.model, "summarize", None)  # the replay model gives back the recorded summary
        try:
            reply = (summarize(asked, deadline=deadline) if summarize
                     else self.model.complete(asked, deadline=deadline, **self.request()))
        except ContextLengthError as error:
            self._learn(asked, error)
            return {}
        self.trajectory.add_usage(reply.usage)
        summary = (reply.content or "").strip()
        if not summary:  # a tool call instead of a summary: nothing to stand in for the middle
            return {}
        self.checkpoint = Checkpoint(self.checkpoint.elided_through, self._start(messages) + protected - 2, summary)
        return {"summary": summary, "usage": reply.usage.to_dict()}

    def _no_fit(self, messages: Sequence[dict[str, Any]], error: ContextLengthError) -> ContextLengthError:
        fixed, room = self.estimate(messages[:2]), self.window - self.reserve()
        if not any(m.get("role") == "assistant" for m in messages[2:]):
            fix = (f"the system prompt and the task alone exceed the model's context window ({self.window} tokens): "
                   f"they come to about {fixed} tokens, and {room} fit with room for the reply; shorten the task or "
                   "use a model (or server setting) with a larger window")
        else:
            newest = self.estimate(self.project(messages)[self._protected(messages):])
            fix = (f"the conversation does not fit even compacted: the system prompt and the task (about {fixed} "
                   f"tokens) and the newest turn (about {newest}) are more than the {room} tokens of the model's "
                   f"context window ({self.window} tokens) left with room for the reply; lower agent.output_limit, "
                   "shorten the task or use a larger window")
        return ContextLengthError(f"{error}; {fix}", window=error.window)

    def _learn(self, projected: Sequence[dict[str, Any]], error: ContextLengthError) -> None:
        """What a refusal says about the window and the tokenizer; without numbers, the window is taken to be
        a little under the refused prompt."""
        if error.prompt_tokens:
            self.rate = error.prompt_tokens / max(1, _chars(projected))
        refused = self.estimate(projected)
        window = error.window or int(refused * 0.95)
        self.window = min(self.window, window) if self.window else window

    def _recorded_rate(self, messages: Sequence[dict[str, Any]]) -> float:
        """The rate the last recorded call showed (a resumed run, a fork, a loaded session), when what it was sent
        can be told: the projection under the same checkpoint of the messages before its reply."""
        steps, records = self.trajectory.steps, self.trajectory.messages
        if not steps or not steps[-1].usage.prompt_tokens:
            return 0.0
        last = steps[-1].step
        if self.trajectory.compactions and self.trajectory.compactions[-1].get("step", 0) >= last:
            return 0.0  # compacted after that call: it was sent something else
        reply = next((index for index in range(len(records) - 1, -1, -1)
                      if records[index].role == "assistant" and records[index].step == last), None)
        end = None if reply is None else reply - self._start(messages) + 1
        if end is None or not 2 <= end <= len(messages):
            return 0.0
        return steps[-1].usage.prompt_tokens / max(1, _chars(self.project(messages, end)))

    def _protected(self, messages: Sequence[dict[str, Any]]) -> int:
        """Where the kept turns begin (an assistant message): nothing from there on is elided or summarised. The
        newest turn always, and the ones before it up to `keep_turns` while they fit under the goal (on a small
        window, four turns can outweigh the whole prompt)."""
        turns = [i for i in range(2, len(messages)) if messages[i].get("role") == "assistant"]
        if not turns:
            return 2
        budget = self.trigger() * GOAL - self.estimate(messages[:2]) if self.window else float("inf")
        kept = turns[-1]
        for start in reversed(turns[-self.keep_turns:-1]):
            if self.estimate(messages[start:]) > budget:
                break
            kept = start
        return 2 if kept == turns[0] and len(turns) < self.keep_turns else kept

    def _start(self, messages: Sequence[dict[str, Any]]) -> int:
        """The trajectory index of messages[1]: the agent's messages after the first are the trajectory's last
        ones (a chat session's context begins with a system message from before it)."""
        return len(self.trajectory.messages) - len(messages) + 1

    def _elide(self, index: int, message: dict[str, Any]) -> str:
        content = message.get("content") or ""
        if index not in self._elided:
            head = content.split("\n", 1)[0][:200]
            elided = self.renderer.render("elided.j2", head=head, chars=len(content), role=message["role"])
            self._elided[index] = elided if len(elided) < len(content) else content
        return self._elided[index]


def _chars(messages: Sequence[dict[str, Any]]) -> int:
    """What the messages weigh: their texts, and a reply's tool calls."""
    total = 0
    for m in messages:
        content = m.get("content")
        total += len(content) if isinstance(content, str) else len(str(content)) if content is not None else 0
        if m.get("tool_calls"):
            total += len(str(m["tool_calls"]))
    return total


def _clip(content: str, chars: int) -> str:
    half = chars // 2
    return f"{content[:half]}\n[... {len(content) - chars} characters clipped to fit the context window ...]\n{content[-half:]}"
