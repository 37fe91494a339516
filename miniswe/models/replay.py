"""A model that gives back a recorded run's replies, in order, through the real loop: the same parser, limits
and templates, so a run can be reproduced offline to test a change to miniswe itself."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from miniswe.config import ModelConfig, Text
from miniswe.errors import ConfigError, ModelError, TrajectoryError
from miniswe.models import Reply, ToolCall
from miniswe.usage import Usage


class ReplayConfig(ModelConfig):
    kind: str = "replay"
    trajectory: Text = ""  # the trajectory whose replies are given back, one per call


class ReplayModel:
    config_class = ReplayConfig

    def __init__(self, config: ReplayConfig, *, calls_made: int = 0, **_: Any):
        from miniswe.trajectory import load

        if not config.trajectory:
            raise ConfigError("model.trajectory: the replay model needs a trajectory to replay (model.trajectory=FILE)")
        try:
            recording = load(config.trajectory)
        except TrajectoryError as error:
            raise ConfigError(f"model.trajectory: {error}") from None
        steps = {step.step: step for step in recording.steps}
        self.replies = []
        for message in recording.messages:
            if message.role == "assistant":
                step = steps.get(message.step)
                self.replies.append(Reply(
                    content=message.content,
                    reasoning=step.reasoning if step else None,
                    finish_reason=step.finish_reason if step else "stop",
                    usage=step.usage if step else Reply(content="").usage,
                    latency_s=0.0,
                    tool_calls=[ToolCall.from_wire(call, index) for index, call in enumerate(message.tool_calls or ())],
                ))
        self.summaries = [Reply(content=entry["summary"], usage=Usage.from_dict(entry.get("usage")), latency_s=0.0)
                          for entry in recording.compactions if entry.get("summary")]
        self.summaries_given = 0
        self.source = config.trajectory
        self.calls = calls_made  # a continued run goes on with the reply after the last one it used

    def for_child(self, **_: Any) -> ReplayModel:
        """A sub-agent's model: the recording holds only its own run's replies, so a sub-agent gets none (its run
        ends as ModelError, which the replayed run's step shows)."""
        child = ReplayModel.__new__(ReplayModel)
        child.replies, child.source, child.calls = [], f"{self.source} (a sub-agent's replies are not in it)", 0
        child.summaries, child.summaries_given = [], 0
        return child

    def describe(self) -> dict[str, Any]:
        return {"kind": "replay", "trajectory": self.source, "replies": len(self.replies)}

    def complete(self, messages: Sequence[dict[str, Any]], *, deadline: float | None = None,
                 tools: Sequence[dict[str, Any]] | None = None) -> Reply:
        if self.calls >= len(self.replies):
            raise ModelError(f"replay model: {self.source} has no reply for call {self.calls + 1} "
                             f"(it recorded {len(self.replies)}); the replayed run went further than the recording")
        reply = self.replies[self.calls]
        self.calls += 1
        return reply

    def summarize(self, messages: Sequence[dict[str, str]], *, deadline: float | None = None) -> Reply:
        """A context compaction's summary: the recorded one, so replaying a compacted run compacts the same way."""
        if self.summaries_given >= len(self.summaries):
            raise ModelError(f"replay model: {self.source} recorded {len(self.summaries)} compaction summaries and the "
                             "replayed run asked for another; it compacted differently (see agent.context_window)")
        self.summaries_given += 1
        return self.summaries[self.summaries_given - 1]
