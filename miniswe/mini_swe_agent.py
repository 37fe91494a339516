"""Trajectories written by the reference implementation (mini-swe-agent), read into miniswe's Trajectory;
`load_any`, which reads a trajectory file of any format miniswe knows; and `export`, which writes any of them in
mini-swe-agent's format (one file, or a whole batch run directory), for its inspector and its users' scripts.

Three shapes: `trajectory_format: mini-swe-agent-1` (`info` and `messages`), `mini-swe-agent-1.1` (the same,
each message with an `extra` mapping, the run's end an `exit` message) and the oldest, a bare list of messages.
Each assistant message is paired with the observation that follows it; what a shape does not record (durations,
tokens, whole outputs) is listed in `metadata["converted_from"]["not_recorded"]`, and the converted trajectory
refuses to be saved over its source.

The export writes `mini-swe-agent-1.1` as mini-swe-agent 2.x writes it (`info` with model_stats, config, exit_status
and submission; messages with `extra`: an assistant message's actions, usage and cost, an observation's raw_output,
returncode and exception_info, a refused reply as the user message that refused it, an `exit` message last), and
keeps what only miniswe records under `extra.miniswe` and `info.miniswe`, so reading the file back loses nothing.
A file first read from mini-swe-agent's format keeps its original `info`. Secrets stay masked.
"""

from __future__ import annotations

import ast
import calendar
import json
import os
import re
import time
from typing import Any

from miniswe.errors import RecordError, TrajectoryError, UsageError
from miniswe.mini_config import MINI_AGENT_KIND, MINI_TEXT_REGEX, mini_version
from miniswe.protocol import FormatError, parse_command, thought_of
from miniswe.redaction import Secrets, config_secrets, masked_config
from miniswe.status import ExitStatus, Outcome
from miniswe.trajectory import (FORMAT, MAPPING_OR_NULL, TEXT, TEXT_OR_NULL, VERSION, Message, Step, Trajectory, _shape,
                                iso_time, problem, read_document, upgrade)
from miniswe.usage import Usage, figure

REFERENCE_FORMATS = ("mini-swe-agent-1", "mini-swe-agent-1.1")
MESSAGE_LIST = "mini-swe-agent message list"
ACTION_TAGS = ["bash", "mswea_bash_command"]
SUBMIT_MARKERS = ("COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT", "MINI_SWE_AGENT_FINAL_OUTPUT", "NANO_SWE_AGENT_FINAL_OUTPUT")
# What a converted trajectory may lack, by key; `not_recorded` lists the keys, these say what they mean.
NOT_RECORDED = {
    "duration_s": "how long each command ran",
    "timing": "when the run started and ended",
    "tokens": "token counts (only the cost and the number of model calls)",
    "step_usage": "each call's tokens and cost",
    "cost": "the run's cost",
    "whole_output": "outputs beyond what the model was shown (observations over 10,000 characters kept head and tail only)",
    "output_order": "the order of stdout and stderr lines (kept apart: stdout is shown first)",
    "submission_output": "the submitting command's own output and return code (only the submission)",
    "exit_status": "how the run ended (inferred from its last message where possible)",
    "config": "the configuration",
    "model": "the model's name",
}
_DEFAULT_FORMAT_ERROR = "Please always provide EXACTLY ONE action in triple backticks"
_REFERENCE_ACTION = r"```bash\s*\n(.*?)\n```"  # the regex mini-swe-agent 1.x found actions with
# What the converter reads of a mini-swe-agent file, checked once where it is read (as trajectory.check_fields
# checks miniswe's own): a damaged file is refused in one line naming the field, and the converter relies on these
# shapes. Keys not named here are read defensively or kept as they are.
_TEXT_OUTCOME = {"exit_status": TEXT_OR_NULL, "submission": TEXT_OR_NULL, "traceback": TEXT_OR_NULL}
_MESSAGE = _shape("mapping", required=("role",), keys={
    "role": TEXT, "tool_call_id": TEXT_OR_NULL,
    "tool_calls": _shape("list", "null", items=_shape("mapping", keys={"id": TEXT_OR_NULL, "function": MAPPING_OR_NULL})),
    "extra": _shape("mapping", "null", keys={
        **_TEXT_OUTCOME, "response": MAPPING_OR_NULL, "miniswe": MAPPING_OR_NULL,
        "actions": _shape("list", "null", items=_shape("mapping", required=("command",),
                                                      keys={"command": TEXT, "tool_call_id": TEXT_OR_NULL}))})})
_CONFIG = _shape("mapping", "null", keys={
    "agent": MAPPING_OR_NULL, "model": _shape("mapping", "null", keys={"model_name": TEXT_OR_NULL}),
    "environment": _shape("mapping", "null", keys={"env": MAPPING_OR_NULL, "forward_env": _shape("list", "null", items=TEXT),
                                                   "run_args": _shape("list", "null", items=TEXT)}),
    "model_type": TEXT_OR_NULL, "environment_type": TEXT_OR_NULL})
_DOCUMENT = _shape("mapping", keys={"messages": _shape("list", items=_MESSAGE), "info": _shape("mapping", "null", keys={
    **_TEXT_OUTCOME, "config": _CONFIG, "model_stats": MAPPING_OR_NULL, "miniswe": MAPPING_OR_NULL,
    "model_name": TEXT_OR_NULL})})
_MESSAGE_LIST = _shape("list", items=_MESSAGE)


class ConvertedTrajectory(Trajectory):
    """A trajectory read from another agent's format: the same record, which never writes over its source file."""

    source_format: str | None = None

    def save(self) -> None:
        source = self.source_format or self.metadata.get("converted_from", {}).get("format")
        raise RecordError(f"{self.path}: converted from {source}; it is not saved over its source file")


def load_any(path: str) -> Trajectory:
    """A miniswe trajectory of any version, or a mini-swe-agent one converted; TrajectoryError for anything else."""
    data = read_document(path)
    if isinstance(data, dict) and data.get("format") == FORMAT:
        return Trajectory.from_dict(upgrade(data, path), path)
    if is_mini_swe_agent(data):
        return from_mini_swe_agent(data, path)
    if isinstance(data, dict) and "trajectory_format" in data:
        found = f"trajectory_format {data['trajectory_format']!r}"
    elif isinstance(data, dict):
        found = f"format {data['format']!r}" if "format" in data else "a mapping without `format` or `trajectory_format`"
    else:
        found = f"a JSON {type(data).__name__} that is not a list of chat messages"
    raise TrajectoryError(f"{path}: not a trajectory miniswe can read (found {found}; it reads miniswe-trajectory, "
                          f"{', '.join(REFERENCE_FORMATS)} and mini-swe-agent's message lists)")


def is_mini_swe_agent(data: Any) -> bool:
    if isinstance(data, dict):
        return data.get("trajectory_format") in REFERENCE_FORMATS and isinstance(data.get("messages"), list)
    return isinstance(data, list) and bool(data) and all(isinstance(m, dict) and "role" in m for m in data)


def from_mini_swe_agent(data: Any, path: str) -> ConvertedTrajectory:
    """A mini-swe-agent trajectory (either dict format, or a bare message list) as a miniswe Trajectory;
    TrajectoryError, one line naming the field, for a damaged one."""
    if not is_mini_swe_agent(data):
        raise TrajectoryError(f"{path}: not a mini-swe-agent trajectory")
    found = problem(data, _MESSAGE_LIST if isinstance(data, list) else _DOCUMENT)
    if found:
        raise TrajectoryError(f"{path}: {found}; the file is damaged or not a mini-swe-agent trajectory")
    if isinstance(data, list):
        return _Converter(path, MESSAGE_LIST, {}, data).convert()
    info = data.get("info") or {}
    if info.get("config"):
        data = _without_secrets(data, info)
        info = data["info"]
    if info.get("miniswe"):
        return _restored(data, path)  # written by miniswe's export: everything it recorded is in it
    return _Converter(path, data["trajectory_format"], info, data["messages"]).convert()


def _without_secrets(data: dict[str, Any], info: dict[str, Any]) -> dict[str, Any]:
    """The reference masked nothing: its config is masked as miniswe records one (secret-looking settings and
    `-e NAME=value` run arguments, whatever their length), and the values of its secrets wherever else they appear
    (an `api_key` in `model_kwargs`, a `GITHUB_TOKEN` in the environment, a variable it forwards, as set here)."""
    secrets = config_secrets(info["config"])
    data = {**data, "info": {**info, "config": masked_config(info["config"])}}
    return json.loads(secrets.scrub(json.dumps(data, ensure_ascii=False))) if secrets else data


class _Converter:
    def __init__(self, path: str, source: str, info: dict[str, Any], raw: list[dict[str, Any]]):
        self.path, self.source, self.info, self.raw = path, source, info, raw
        self.config = info.get("config") or {}
        self.missing: set[str] = set()
        self.notes: list[str] = []
        self.markers: list[str] = []  # submit markers the commands printed, in order
        self.usage_seen = {"tokens": 0, "cost": 0, "calls": 0}
        self.calls_tools = False  # whether its replies called tools (2.x's tool-calling models)
        exits = [_extra(m) for m in raw if m["role"] == "exit"]
        self.ending = exits[-1] if exits else info  # where the run's end is: 1.1's exit message, or `info`
        submission = self.ending.get("submission")
        self.submitted_with = submission if self.ending.get("exit_status") == "Submitted" and isinstance(submission, str) else None

    def convert(self) -> ConvertedTrajectory:
        messages: list[Message] = []
        steps: list[Step] = []
        task = next((_text(m.get("content")) for m in self.raw if m.get("role") == "user"), "")
        i = 0
        while i < len(self.raw):
            message = self.raw[i]
            role = message["role"]
            if role == "user" and _extra(message).get("interrupt_type") == "FormatError":
                # 1.1 keeps a malformed reply only inside its error message (the model never saw it again); the
                # record keeps it as the reply it was, before the message that refused it
                number = len(steps) + 1
                reply = str(_extra(message).get("model_response") or "")
                if reply:
                    messages.append(Message("assistant", reply, _timestamp(message), number))
                messages.append(Message(role, _text(message.get("content")), _timestamp(message), number))
                kind = _reference_error_kind(reply) if reply else _tool_error_kind(_text(message.get("content")))
                steps.append(Step(number, thought=thought_of(reply), format_error=kind,
                                  usage=self.step_usage(_extra(message))))
                i += 1
                continue
            if role != "assistant":
                messages.append(Message(role, _text(message.get("content")), _timestamp(message)))
                i += 1
                continue
            number = len(steps) + 1
            observations = []
            i += 1
            while i < len(self.raw) and self.raw[i].get("role") in ("user", "tool") and (
                    not observations or self.raw[i].get("role") == "tool" or _is_observation_of_many(self.raw, i)):
                observations.append(self.raw[i])
                i += 1
            last_reply = not any(m.get("role") == "assistant" for m in self.raw[i:])
            if _tool_actions(message):  # 2.x's tool calls: a step each, as miniswe's own tool-calling runs record them
                made = self.tool_steps(number, message, observations, last_reply=last_reply)
                self.calls_tools = True
            else:
                made = [self.step(number, message, observations, last=i >= len(self.raw), last_reply=last_reply)]
            by_call = {step.tool_call["id"]: step.step for step in made if step.tool_call}
            messages.append(_message(message, number))
            messages += [_message(o, by_call.get(o.get("tool_call_id"), number)) for o in observations]
            steps += made
        outcome = self.outcome(steps)
        self.note_usage()
        config, environment, model = masked_config(self.miniswe_config()), self.environment(), self.model()
        stamps = [m.timestamp for m in messages if m.timestamp]
        if not stamps:
            self.missing.add("timing")
        document = {  # everything that adds to self.missing has run: metadata lists it whole
            "format": FORMAT, "version": VERSION, "task": task,
            "exit_status": str(outcome.status) if outcome else None,
            "exit_detail": outcome.detail if outcome else None,
            "submission": outcome.submission if outcome else None,
            "usage": self.usage(steps).to_dict(),
            "timing": {"started": stamps[0] if stamps else None, "ended": stamps[-1] if stamps else None,
                       "wall_s": _seconds_between(self.raw)},
            "config": config, "environment": environment, "model": model,
            "metadata": {"converted_from": {"format": self.source, "mini_version": self.info.get("mini_version"),
                                            "not_recorded": sorted(self.missing), "notes": self.notes}},
            "messages": [m.to_dict() for m in messages], "steps": [s.to_dict() for s in steps],
        }
        if self.info:
            document["source_info"] = self.info  # everything the reference recorded, for whoever needs more
        trajectory = ConvertedTrajectory.from_dict(document, self.path)
        trajectory.started = document["timing"]["started"]  # unknown stays unknown, not "now"
        return trajectory

    # -- one step: an assistant message and the observation(s) after it ---------------------------------------
    def step(self, number: int, reply: dict[str, Any], observations: list[dict[str, Any]], *, last: bool,
             last_reply: bool = False) -> Step:
        """`last`: nothing was recorded after these observations; `last_reply`: no reply came after this one."""
        content = _text(reply.get("content"))
        extra = _extra(reply)
        call = {"thought": thought_of(content), "usage": self.step_usage(extra),
                "reasoning": reply.get("reasoning_content") or reply.get("reasoning") or None}
        seen = _text(observations[0].get("content")) if observations else ""
        refused = observations and _extra(observations[0]).get("interrupt_type") == "FormatError"
        if refused or self._rejected(seen):
            return Step(number, format_error=_reference_error_kind(content), **call)
        commands = [action["command"] for action in extra.get("actions") or []]
        if not commands:
            try:
                commands = [parse_command(content, ACTION_TAGS)]
            except FormatError as error:
                found = re.findall(_REFERENCE_ACTION, content, re.DOTALL)
                if len(found) != 1 or not observations:  # what the reference's own regex ran, if anything
                    return Step(number, format_error=error.kind, **call)
                commands = [found[0].strip()]
        command = "\n".join(commands)
        self.markers += [m for m in SUBMIT_MARKERS if m in command]
        if len(commands) > 1:
            self.notes.append(f"step {number}: {len(commands)} tool calls in one reply, shown as one step")
        if not observations:  # the run ended before an observation: 1.1 puts a submission in its exit message
            if last_reply and self.submitted_with:
                self.missing.add("submission_output")
                return Step(number, command=command, output=self.submitted_with, output_chars=len(self.submitted_with), **call)
            self.notes.append(f"step {number}: the run ended before the command's result was recorded")
            return Step(number, command=command, **call)
        if last and len(observations) == 1 and "raw_output" not in _extra(observations[0]) and self.is_submission(seen, command):
            self.missing.add("submission_output")
            return Step(number, command=command, output=seen, output_chars=len(seen), **call)
        results = [self.observed(o) for o in observations]
        output = "".join(r["output"] for r in results)
        returncode = next((r["returncode"] for r in reversed(results) if r["returncode"] is not None), None)
        return Step(number, command=command, returncode=returncode, timed_out=any(r["timed_out"] for r in results),
                    output=output, output_chars=sum(r["chars"] for r in results),
                    elided_chars=sum(r["elided"] for r in results), duration_s=self.duration(extra, observations[-1]), **call)

    def tool_steps(self, number: int, reply: dict[str, Any], observations: list[dict[str, Any]], *,
                   last_reply: bool) -> list[Step]:
        """A tool-calling reply: a step for each of its actions, answered by the tool message of its call; the first
        carries the model call (its usage, thought and reasoning)."""
        content, extra = _text(reply.get("content")), _extra(reply)
        calls = {call.get("id"): call for call in reply["tool_calls"]}
        answers = {o.get("tool_call_id"): o for o in observations if o.get("tool_call_id") is not None}
        first = {"thought": content.strip(), "usage": self.step_usage(extra),
                 "reasoning": reply.get("reasoning_content") or reply.get("reasoning") or None}
        steps = []
        for index, action in enumerate(_tool_actions(reply)):
            call_id = action.get("tool_call_id")
            function = (calls.get(call_id) or {}).get("function") or {}
            arguments = function.get("arguments")
            call = {"id": call_id, "name": str(function.get("name") or "bash"), "index": index,
                    "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments or {"command": action["command"]})}
            made = first if index == 0 else {"thought": "", "usage": Usage(model_calls=0), "reasoning": None}
            command = action["command"]
            self.markers += [m for m in SUBMIT_MARKERS if m in command]
            answer = answers.get(call_id)
            if answer is None:
                if last_reply and self.submitted_with is not None and any(m in command for m in SUBMIT_MARKERS):
                    self.missing.add("submission_output")
                    steps.append(Step(number + index, command=command, output=self.submitted_with,
                                      output_chars=len(self.submitted_with), tool_call=call, **made))
                else:
                    self.notes.append(f"step {number + index}: the run ended before the command's result was recorded")
                    steps.append(Step(number + index, command=command, tool_call=call, **made))
                continue
            result = self.observed(answer)
            steps.append(Step(number + index, command=command, returncode=result["returncode"], timed_out=result["timed_out"],
                              output=result["output"], output_chars=result["chars"], elided_chars=result["elided"],
                              duration_s=self.duration(extra, answer), tool_call=call, **made))
        return steps

    def is_submission(self, seen: str, command: str) -> bool:
        """1.x recorded a submission as the last user message, in place of the submitting command's observation."""
        if self.submitted_with is not None:
            return seen == self.submitted_with or parse_observation(seen) is None
        return self.source == MESSAGE_LIST and any(m in command for m in SUBMIT_MARKERS) and parse_observation(seen) is None

    def _rejected(self, seen: str) -> bool:
        template = (self.config.get("agent") or {}).get("format_error_template") or (self.config.get("model") or {}).get("format_error_template")
        prefix = template.split("{", 1)[0].strip() if isinstance(template, str) else ""
        return seen.strip().startswith(prefix or _DEFAULT_FORMAT_ERROR) if seen.strip() else False

    def observed(self, message: dict[str, Any]) -> dict[str, Any]:
        """returncode, output, timed_out, chars, elided of one observation message."""
        extra = _extra(message)
        text = _text(message.get("content"))
        if "raw_output" in extra:  # 1.1 keeps the whole output beside what the model saw
            output = str(extra.get("raw_output") or "")
            exception = str(extra.get("exception_info") or "")
            returncode = extra.get("returncode") if isinstance(extra.get("returncode"), int) else None
            timed_out = "timed out" in exception.lower() or "timeout" in exception.lower()
            if timed_out:  # killed: no return code (mini-swe-agent writes -1); the step says it timed out
                returncode = None
            elif exception:  # another failure to run it: what went wrong, then what it printed
                output = exception + "\n" + output
            return {"output": output, "returncode": returncode, "chars": len(output), "elided": 0, "timed_out": timed_out}
        parsed = parse_observation(text)
        if parsed is None:
            self.notes.append(f"an observation in an unknown shape is kept as the output: {text[:60]!r}")
            self.missing.add("whole_output")
            return {"output": text, "returncode": None, "timed_out": False, "chars": len(text), "elided": 0}
        if parsed["elided"]:
            self.missing.add("whole_output")
        if parsed.pop("split"):
            self.missing.add("output_order")
        return parsed

    def duration(self, reply_extra: dict[str, Any], observation: dict[str, Any]) -> float:
        start, end = figure(reply_extra.get("timestamp")), figure(_extra(observation).get("timestamp"))
        if start is None or end is None or end < start:
            self.missing.add("duration_s")
            return 0.0
        return round(end - start, 4)

    def step_usage(self, extra: dict[str, Any]) -> Usage:
        usage = Usage(model_calls=1)
        reported = _mapping(_mapping(extra, "response"), "usage")
        prompt = figure(reported.get("prompt_tokens", reported.get("input_tokens")))
        completion = figure(reported.get("completion_tokens", reported.get("output_tokens")))
        cost = figure(extra.get("cost"))
        self.usage_seen["calls"] += 1
        self.usage_seen["tokens"] += prompt is not None or completion is not None
        self.usage_seen["cost"] += cost is not None
        usage.prompt_tokens, usage.completion_tokens = int(prompt or 0), int(completion or 0)
        usage.total_tokens = int(figure(reported.get("total_tokens")) or usage.prompt_tokens + usage.completion_tokens)
        usage.cost = cost or 0.0
        return usage

    def note_usage(self) -> None:
        """Tokens or costs no call recorded are not recorded; those only some calls recorded are noted. With no
        call's cost and no total either, the run's cost is not recorded (0.0 would say it was free)."""
        if not self.usage_seen["cost"] and figure(_mapping(self.info, "model_stats").get("instance_cost")) is None:
            self.missing.add("cost")
        for key, missing in (("tokens", "tokens"), ("cost", "step_usage")):
            seen, calls = self.usage_seen[key], self.usage_seen["calls"]
            if not seen and calls:
                self.missing.add(missing)
            elif seen < calls:
                self.notes.append(f"{calls - seen} of {calls} model calls recorded no {'token counts' if key == 'tokens' else 'cost'}")

    # -- the run as a whole ---------------------------------------------------------------------------------
    def outcome(self, steps: list[Step]) -> Outcome | None:
        status = self.ending.get("exit_status")
        text = self.ending.get("submission") if isinstance(self.ending.get("submission"), str) else None
        if not status and self.source == MESSAGE_LIST:
            return self.inferred_outcome(steps)
        if not status:
            return None  # still running when it was saved
        try:
            known = ExitStatus(status)
        except ValueError:
            return Outcome(ExitStatus.ERROR, f"{status} (mini-swe-agent's exit status)" + (f": {text}" if text else ""))
        if known is ExitStatus.SUBMITTED:
            return Outcome(known, None, text or "")
        return Outcome(known, self.ending.get("traceback") or text or None)  # 1.x kept str(exception) as the submission

    def inferred_outcome(self, steps: list[Step]) -> Outcome | None:
        """The message list recorded no exit status: a last command with a submit marker, answered by plain
        text, was a submission."""
        self.missing.update(("exit_status", "config", "model"))
        last = steps[-1] if steps else None
        if last and last.command and any(m in last.command for m in SUBMIT_MARKERS) and self.raw[-1].get("role") == "user":
            final = _text(self.raw[-1].get("content"))
            if parse_observation(final) is None:
                self.missing.add("submission_output")
                self.notes.append("exit status inferred: the last command printed a submit marker and its answer was the submission")
                return Outcome(ExitStatus.SUBMITTED, None, final)
        return None

    def usage(self, steps: list[Step]) -> Usage:
        total = Usage()
        for step in steps:
            total.add(step.usage)
        stats = _mapping(self.info, "model_stats")
        calls, cost = figure(stats.get("api_calls")), figure(stats.get("instance_cost"))
        if calls is not None:
            total.model_calls = int(calls)
        if cost is not None:
            total.cost = round(cost, 8)
        return total

    def model(self) -> dict[str, Any]:
        name = (self.config.get("model") or {}).get("model_name") or self.info.get("model_name")
        if not name:
            self.missing.add("model")
        return {"kind": self.config.get("model_type") or "", "name": name or ""}

    def environment(self) -> dict[str, Any]:
        settings = self.config.get("environment") or {}
        described = {"kind": self.config.get("environment_type") or "unknown"}
        described.update({k: settings[k] for k in ("image", "cwd") if settings.get(k)})
        return described

    def miniswe_config(self) -> dict[str, Any]:
        """The reference's settings that miniswe has too, under miniswe's keys (config_from_record rebuilds it)."""
        agent, env, model = (self.config.get(section) or {} for section in ("agent", "environment", "model"))
        protocol: dict[str, Any] = {"action_tags": _action_tags(model)}
        if self.calls_tools:
            protocol["kind"] = "tools"
        if self.markers:  # the marker of the last command that printed one: what this run submitted with
            protocol["submit_marker"] = self.markers[-1]
        if not self.config:
            self.missing.add("config")
            return {"protocol": protocol}
        config: dict[str, Any] = {"agent": {}, "protocol": protocol, "environment": {}, "model": {"kind": "openai"}}
        for ours, theirs in (("step_limit", "step_limit"), ("cost_limit", "cost_limit"), ("time_limit", "wall_time_limit_seconds")):
            value = figure(agent.get(theirs))
            if value is not None and value >= 0:
                config["agent"][ours] = int(value) if ours == "step_limit" else value
        kind = str(self.config.get("environment_type") or "")
        config["environment"]["kind"] = "docker" if "docker" in kind.lower() or env.get("image") else "local"
        if config["environment"]["kind"] == "docker" and env.get("image"):
            config["environment"]["image"] = str(env["image"])
        if isinstance(env.get("cwd"), str) and env["cwd"]:
            config["environment"]["cwd"] = env["cwd"]
        if env.get("env"):
            config["environment"]["env"] = {str(k): str(v) for k, v in env["env"].items()}
        timeout = figure(env.get("timeout"))
        if timeout is not None and timeout >= 0:
            config["environment"]["timeout"] = timeout
        if model.get("model_name"):
            config["model"]["name"] = model["model_name"]
        return config

def _action_tags(model: dict[str, Any]) -> list[str]:
    regex = model.get("action_regex")
    if isinstance(regex, str) and "mswea_bash_command" in regex:
        return ["mswea_bash_command"]
    return list(ACTION_TAGS)


def _is_observation_of_many(raw: list[dict[str, Any]], i: int) -> bool:
    """A second user message after a reply belongs to it only when 1.1 marks it as another action's output."""
    return "raw_output" in _extra(raw[i])


def _tool_error_kind(refusal: str) -> str:
    """Our name for why 2.x refused a reply it kept no text of (a tool-calling one), by what its refusal says."""
    if "No tool calls found" in refusal:
        return "no_tool_call"
    if "Unknown tool" in refusal:
        return "unknown_tool"
    return "bad_arguments" if "tool call" in refusal.lower() else "no_action"


def _reference_error_kind(content: str) -> str:
    """Our name for why the reference refused a reply, by counting actions as its regex did."""
    if not content.strip():
        return "empty_reply"
    found = len(re.findall(_REFERENCE_ACTION, content, re.DOTALL))
    try:
        parse_command(content, ACTION_TAGS)
    except FormatError as error:
        return error.kind
    return "several_actions" if found > 1 else "no_action"


# -- observations, as the reference's templates wrote them ------------------------------------------------------
_RETURNCODE = re.compile(r"<returncode>\s*(-?\d+|None)?\s*</returncode>")
_OUTPUT = re.compile(r"<output>\n?(.*)</output>", re.S)
_HEAD_TAIL = re.compile(r"<output_head>\n?(.*?)\n?</output_head>\s*<elided_chars>\s*(\d+) characters elided\s*</elided_chars>"
                        r"\s*<output_tail>\n?(.*)</output_tail>", re.S)
_STREAMS = re.compile(r"<stdout>\n?(.*?)\n?</stdout>\s*<stderr>\n?(.*?)\n?</stderr>", re.S)
_TIMED_OUT = "timed out and has been killed"


def parse_observation(text: str) -> dict[str, Any] | None:
    """returncode, output, timed_out, chars, elided (and split: stdout and stderr were kept apart) of an
    observation in one of the shapes the reference wrote; None for any other text."""
    found = {"returncode": None, "timed_out": False, "elided": 0, "split": False}
    if _TIMED_OUT in text:
        match = _OUTPUT.search(text)
        output = match[1] if match else ""
        return {**found, "output": output, "timed_out": True, "chars": len(output)}
    code = _RETURNCODE.search(text)
    if code:
        found["returncode"] = int(code[1]) if code[1] and code[1] != "None" else None
        if head_tail := _HEAD_TAIL.search(text):
            head, elided, tail = head_tail[1], int(head_tail[2]), head_tail[3].removesuffix("\n")  # the template's newline
            output = f"{head}\n[... {elided} characters elided by mini-swe-agent ...]\n{tail}"
            return {**found, "output": output, "chars": len(head) + len(tail) + elided, "elided": elided}
        if streams := _STREAMS.search(text):
            output = streams[1] + streams[2]
            return {**found, "output": output, "chars": len(output), "split": bool(streams[1].strip() and streams[2].strip())}
        match = _OUTPUT.search(text)
        output = match[1] if match else ""
        return {**found, "output": output, "chars": len(output)}
    # a template that printed the output mapping itself: "Observation: {'output': '...', 'returncode': 0}"
    start = text.find("{")
    if start >= 0 and text.rstrip().endswith("}") and "'returncode'" in text:
        try:
            value = ast.literal_eval(text[start:].strip())
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return None
        if isinstance(value, dict) and isinstance(value.get("output", ""), str):
            returncode = value.get("returncode")
            output = value.get("output", "")
            return {**found, "output": output, "returncode": returncode if isinstance(returncode, int) else None,
                    "chars": len(output)}
    return None


def _text(content: Any) -> str:
    """A message's content as text: a string, or the text parts of a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text") or "") for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


def _mapping(data: Any, key: str) -> dict[str, Any]:
    """data[key] when it is a mapping, else an empty one: the reference's files vary in what they hold."""
    value = data.get(key) if isinstance(data, dict) else None
    return value if isinstance(value, dict) else {}


def _extra(message: dict[str, Any]) -> dict[str, Any]:
    """1.1's per-message `extra` mapping; empty in the older shapes."""
    return message.get("extra") or {}


def _tool_actions(reply: dict[str, Any]) -> list[dict[str, Any]]:
    """The actions of a tool-calling reply (2.x: each with the id of its call); none for a text reply."""
    actions = _extra(reply).get("actions") or [] if reply.get("tool_calls") else []
    return actions if all(action.get("tool_call_id") is not None for action in actions) else []


def _message(message: dict[str, Any], step: int | None) -> Message:
    """A reply or an observation as recorded, its tool calls and the call it answers kept."""
    return Message(message["role"], _text(message.get("content")), _timestamp(message), step,
                   message.get("tool_calls") or None, message.get("tool_call_id"))


def _timestamp(message: dict[str, Any]) -> str:
    stamp = _stamp(message)
    return "" if stamp is None else iso_time(stamp)


def _stamp(message: dict[str, Any]) -> float | None:
    """When a message was added: 1.1 keeps it in `extra`, 1.x beside the content."""
    stamp = figure(_extra(message).get("timestamp"))
    return figure(message.get("timestamp")) if stamp is None else stamp


def _seconds_between(raw: list[dict[str, Any]]) -> float | None:
    stamps = [_stamp(m) for m in raw]
    stamps = [s for s in stamps if s is not None]
    return round(stamps[-1] - stamps[0], 3) if len(stamps) > 1 else None


# -- export: miniswe's record in mini-swe-agent's format ------------------------------------------------------------
EXPORT_FORMAT = "mini-swe-agent-1.1"
EXPORT_NAMES = ("mini-swe-agent", "mini-swe-agent-1.1")
_STEP_CALL = ("thought", "reasoning", "finish_reason", "usage", "latency_s")  # a step's model call, on its reply


def export(path_in: str, path_out: str | None = None, format: str = "mini-swe-agent") -> str:
    """Write the trajectory `path_in` (miniswe's, any version, or mini-swe-agent's) in `format` to `path_out`
    (default: beside it, X.traj.json as X.mini.traj.json); the path written."""
    _export_format(format)
    trajectory = load_any(path_in)
    path_out = path_out or default_export_path(path_in)
    _refuse_same(path_in, path_out)
    _write(path_out, to_mini_swe_agent(trajectory))
    return path_out


def export_batch(run_dir: str, out_dir: str | None = None, format: str = "mini-swe-agent") -> list[str]:
    """Write every task's trajectory of a batch run directory (`<id>/<id>.traj.json`) in `format`, laid out as
    mini-swe-agent's batch runs are: `OUT/<id>/<id>.traj.json` (with `instance_id`) and `OUT/preds.json`. `out_dir`
    defaults to RUN_DIR.mini-swe-agent beside it. The paths written, trajectories first."""
    _export_format(format)
    if not os.path.isdir(run_dir):
        raise UsageError(f"{run_dir}: not a directory; give a batch run directory (it holds <id>/<id>.traj.json)")
    out_dir = out_dir or os.path.normpath(run_dir) + ".mini-swe-agent"
    if os.path.abspath(out_dir) == os.path.abspath(run_dir):
        raise UsageError(f"{out_dir}: the export would write into the run directory itself; give another -o")
    tasks = sorted(name for name in os.listdir(run_dir)
                   if os.path.isfile(os.path.join(run_dir, name, f"{name}.traj.json")))
    if not tasks:
        raise UsageError(f"{run_dir}: no task trajectories (<id>/<id>.traj.json) in it; is it a batch run directory?")
    written, preds = [], {}
    for task_id in tasks:
        trajectory = load_any(os.path.join(run_dir, task_id, f"{task_id}.traj.json"))
        document = to_mini_swe_agent(trajectory, instance_id=task_id)
        path = os.path.join(out_dir, task_id, f"{task_id}.traj.json")
        _write(path, document)
        written.append(path)
        info = document["info"]
        if info["exit_status"]:
            name = (info.get("config") or {}).get("model", {}).get("model_name") or trajectory.model.get("name") or ""
            preds[task_id] = {"model_name_or_path": name, "instance_id": task_id, "model_patch": info["submission"]}
    recorded = os.path.join(run_dir, "preds.json")
    if os.path.isfile(recorded):  # the batch's own predictions (tasks that ended with an agent outcome): the same format
        try:
            with open(recorded, encoding="utf-8") as handle:
                preds = json.load(handle)
        except (OSError, ValueError):
            pass
    path = os.path.join(out_dir, "preds.json")
    _write(path, preds)
    return [*written, path]


def default_export_path(path_in: str) -> str:
    base = path_in[: -len(".traj.json")] if path_in.endswith(".traj.json") else os.path.splitext(path_in)[0]
    return f"{base}.mini.traj.json"


def _export_format(format: str) -> None:
    if format not in EXPORT_NAMES:
        raise UsageError(f"--format {format}: unknown export format (known: {', '.join(EXPORT_NAMES[:1])})")


def _refuse_same(path_in: str, path_out: str) -> None:
    if os.path.exists(path_out) and os.path.samefile(path_in, path_out):
        raise UsageError(f"{path_out}: the export would replace the trajectory it reads; give another -o")


def _write(path: str, document: Any) -> None:
    from miniswe.atomic import write_atomic

    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        write_atomic(path, json.dumps(document, indent=2, ensure_ascii=False) + "\n")
    except OSError as error:
        raise RecordError(f"cannot write {path}: {error.strerror or error}") from None


def _unix(stamp: str) -> float | None:
    """An ISO time as recorded (2025-01-02T03:04:05.678Z) as Unix seconds."""
    try:
        whole, _, rest = stamp.rstrip("Z").partition(".")
        seconds = calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S"))
    except (ValueError, AttributeError):
        return None
    return seconds + (int(rest[:3].ljust(3, "0")) / 1000 if rest[:3].isdigit() else 0.0)


def _usage(usage: Usage) -> dict[str, Any]:
    found = {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
             "total_tokens": usage.total_tokens}
    if usage.cached_tokens:
        found["prompt_tokens_details"] = {"cached_tokens": usage.cached_tokens}
    return found


def to_mini_swe_agent(trajectory: Trajectory, *, instance_id: str | None = None) -> dict[str, Any]:
    """A trajectory as mini-swe-agent writes one (`mini-swe-agent-1.1`), secrets masked."""
    header = trajectory.header()
    source = header.get("source_info") if isinstance(header.get("source_info"), dict) else {}
    config = masked_config(trajectory.config or {})
    status, submission = trajectory.exit_status, trajectory.outcome.submission if trajectory.outcome else None
    info = dict(source)  # a file read from mini-swe-agent's format keeps what it held
    if isinstance(source.get("config"), dict):
        info["config"] = masked_config(source["config"])  # masked when read, unless the record was edited since
    stats = dict(_mapping(source, "model_stats"))
    if figure(stats.get("instance_cost")) is None or round(figure(stats["instance_cost"]), 8) != round(trajectory.usage.cost, 8):
        stats["instance_cost"] = trajectory.usage.cost
    stats["api_calls"] = trajectory.usage.model_calls
    info["model_stats"] = stats
    if not source:
        info["config"] = _mini_config(config, trajectory)
    info.update({"exit_status": status or "", "submission": submission or ""})
    miniswe = {key: value for key, value in header.items() if key not in ("source_info", "config")}
    miniswe["config"] = config
    if source:
        miniswe["source_info"] = True  # `info` is the source's, brought up to date
    info["miniswe"] = miniswe
    document: dict[str, Any] = {"info": info, "messages": _Exporter(trajectory, config).messages(),
                                "trajectory_format": EXPORT_FORMAT}
    if instance_id is not None:
        document["instance_id"] = instance_id
    return json.loads(_secrets_of(trajectory, source).scrub(json.dumps(document, ensure_ascii=False)))


def _secrets_of(trajectory: Trajectory, source: dict[str, Any]) -> Secrets:
    """What must not be written: the secrets of the recorded config (recorded masked, but a hand-edited or foreign
    file may hold them) and of the source's, and the values set here of the variables they hand on or hold the
    model's key in (openai's default: OPENAI_API_KEY)."""
    model = _mapping(trajectory.config, "model")
    key = model.get("api_key_env", "OPENAI_API_KEY" if model.get("kind") == "openai" else None)
    secrets = config_secrets(trajectory.config or {}, [key])
    secrets.update(config_secrets(_mapping(source, "config")))
    return secrets


def _mini_config(config: dict[str, Any], trajectory: Trajectory) -> dict[str, Any]:
    """The run's settings under mini-swe-agent's keys: a run of a mini-swe-agent config gives back that config as
    written; another miniswe run its own sections, with the keys mini-swe-agent's readers look for."""
    agent, environment, model = (_mapping(config, name) for name in ("agent", "environment", "model"))
    mini = _mapping(agent, "mini")
    if mini:
        sections = {name: dict(_mapping(mini, name)) for name in ("agent", "environment", "model")}
    else:
        sections = {"agent": dict(agent), "environment": dict(environment), "model": dict(model)}
    sections["agent"].update({"step_limit": agent.get("step_limit", 0), "cost_limit": agent.get("cost_limit", 0.0)})
    sections["model"]["model_name"] = model.get("name") or trajectory.model.get("name") or sections["model"].get("model_name", "")
    return {**sections, "agent_type": f"miniswe:{agent.get('kind', 'default')}",
            "model_type": f"miniswe:{model.get('kind') or trajectory.model.get('kind', '')}",
            "environment_type": f"miniswe:{environment.get('kind') or trajectory.environment.get('kind', '')}"}


class _Exporter:
    """The messages of a trajectory, each with the `extra` mini-swe-agent gives it, and under `extra.miniswe` what
    only miniswe records: the message's own time and step, its reply's model call, its step's result."""

    def __init__(self, trajectory: Trajectory, config: dict[str, Any]):
        self.trajectory = trajectory
        self.steps = {step.step: step for step in trajectory.steps}
        self.by_call = {step.tool_call["id"]: step for step in trajectory.steps if step.tool_call and step.tool_call.get("id")}
        self.timeout = figure(_mapping(config, "environment").get("timeout"))
        # mini-swe-agent tells the model nothing after a submission: a miniswe run's record of what the submitting
        # command printed is not written as a message (it stays in the reply's extra.miniswe, and in the exit message)
        outcome = trajectory.outcome
        last = trajectory.steps[-1] if trajectory.steps else None
        native = not _mapping(trajectory.metadata, "converted_from")
        self.unsent = [m for m in trajectory.messages if native and outcome and str(outcome.status) == "Submitted" and last
                       and m.role in ("user", "tool") and self._answered(m) is last and not last.format_error]
        # the steps some observation reports (the rest, a submission the run ended on, are written with their reply)
        self.observed = {self._answered(m).step for m in trajectory.messages
                         if m.role in ("user", "tool") and m.step in self.steps and m not in self.unsent}
        regex = _mapping(_mapping(_mapping(trajectory.extra.get("source_info") or {}, "config"), "model"), "action_regex") \
            or _mapping(_mapping(_mapping(config, "agent"), "mini"), "model").get("action_regex")
        self.action_regex = regex if isinstance(regex, str) and regex else MINI_TEXT_REGEX
        # a refused reply the model never saw again (mini-swe-agent 2's runs, and miniswe's runs of its configs) is
        # written as 2.x writes it, inside the message that refused it; one it saw stays a message of its own
        agent = _mapping(config, "agent")
        converted = _mapping(trajectory.metadata, "converted_from").get("format")
        self.fold = converted == "mini-swe-agent-1.1" or (
            converted is None and agent.get("kind") == MINI_AGENT_KIND and mini_version(_mapping(agent, "mini")) == 2)

    def _answered(self, message: Message) -> Step | None:
        """The step an observation reports: its call's (by tool_call_id), else its own."""
        return self.by_call.get(message.tool_call_id or "") or self.steps.get(message.step)

    def messages(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        folded: Message | None = None  # a reply that ran nothing, written inside the message that refused it
        for message in self.trajectory.messages:
            step = self.steps.get(message.step) if message.step is not None else None
            if message.role == "exit":
                continue  # the run's end is written last, from its outcome
            if message.role == "assistant" and step is not None:
                if self.fold and all(s.format_error for s in self.call(step)):
                    folded = message  # 2.x keeps a refused reply inside the message that refused it
                else:
                    out.append(self.reply(message, step))
            elif message in self.unsent:
                continue
            elif message.role in ("user", "tool") and step is not None:
                answered = self._answered(message) or step
                out.append(self.observation(message, answered, folded if answered.format_error else None))
                folded = None if answered.format_error else folded
            else:
                out.append(self.plain(message))
        ending = self.ending()
        return out + [ending] if ending else out

    def call(self, first: Step) -> list[Step]:
        """The steps of one model call: its first, and the further tool calls of the same reply."""
        steps = self.trajectory.steps
        index = next(i for i, step in enumerate(steps) if step is first)
        group = [first]
        for step in steps[index + 1:]:
            if step.first_of_call:
                break
            group.append(step)
        return group

    @staticmethod
    def own(message: Message) -> dict[str, Any]:
        return {"timestamp": message.timestamp, "step": message.step}

    def stamped(self, message: Message, extra: dict[str, Any]) -> dict[str, Any]:
        stamp = _unix(message.timestamp) if message.timestamp else None
        if stamp is not None:
            extra["timestamp"] = stamp
        return extra

    def plain(self, message: Message) -> dict[str, Any]:
        data: dict[str, Any] = {"role": message.role, "content": message.content}
        if message.tool_calls:
            data["tool_calls"] = message.tool_calls
        if message.tool_call_id is not None:
            data["tool_call_id"] = message.tool_call_id
        data["extra"] = self.stamped(message, {"miniswe": self.own(message)})
        return data

    @staticmethod
    def model_call(step: Step) -> dict[str, Any]:
        record = step.to_dict()
        return {key: record[key] for key in _STEP_CALL}

    def call_extra(self, step: Step) -> dict[str, Any]:
        return {"response": {"usage": _usage(step.usage), "choices": [{"finish_reason": step.finish_reason}]},
                "cost": step.usage.cost}

    def reply(self, message: Message, step: Step) -> dict[str, Any]:
        data: dict[str, Any] = {"role": "assistant", "content": message.content}
        if message.tool_calls:
            data["tool_calls"] = message.tool_calls
        if step.reasoning:
            data["reasoning_content"] = step.reasoning
        actions = []
        for each in self.call(step):
            if each.command is not None:
                action: dict[str, Any] = {"command": each.command}
                if each.tool_call and each.tool_call.get("id"):
                    action["tool_call_id"] = each.tool_call["id"]
                actions.append(action)
        extra = {"actions": actions, **self.call_extra(step)}
        own = {**self.own(message), "call": self.model_call(step)}
        unreported = [each.to_dict() for each in self.call(step) if each.step not in self.observed]
        if unreported:
            own["results"] = unreported
        numbers = {each.step for each in self.call(step)}
        unsent = [m.to_dict() for m in self.unsent if self._answered(m).step in numbers]
        if unsent:
            own["unsent"] = unsent
        data["extra"] = self.stamped(message, {**extra, "miniswe": own})
        return data

    def observation(self, message: Message, step: Step, reply: Message | None) -> dict[str, Any]:
        data: dict[str, Any] = {"role": message.role, "content": message.content}
        if message.tool_call_id is not None:
            data["tool_call_id"] = message.tool_call_id
        result = {key: value for key, value in step.to_dict().items() if key != "output"}
        own: dict[str, Any] = {**self.own(message), "result": result}
        if step.format_error:
            extra: dict[str, Any] = {"interrupt_type": "FormatError"}
            if reply is not None:
                extra["model_response"] = reply.content
                if not reply.tool_calls:
                    extra["n_actions"] = len(re.findall(self.action_regex, reply.content, re.DOTALL))
                own["reply"] = {"timestamp": reply.timestamp, "tool_calls": reply.tool_calls}
            if reply is not None or (self.fold and step.first_of_call and message.role == "user"):
                extra.update(self.call_extra(step))  # the call that was refused, billed all the same
                own["call"] = self.model_call(step)
            data["extra"] = {**extra, "miniswe": own}
            return data
        exception = ""
        if step.timed_out:
            after = f" after {number_text(self.timeout)} seconds" if self.timeout else ""
            exception = f"An error occurred while executing the command: Command '{step.command}' timed out{after}"
        elif step.refused:
            exception = f"The command was refused: {step.refused}"
        elif step.aborted:
            exception = f"The command was cut short ({step.aborted})"
        extra = {"raw_output": step.output, "returncode": -1 if step.timed_out else step.returncode,
                 "exception_info": exception}
        if step.timed_out:  # what mini-swe-agent's environments add to the output of a command that raised
            extra.update(exception_type="TimeoutExpired", exception=exception.split(": ", 1)[1])
        data["extra"] = self.stamped(message, {**extra, "miniswe": own})
        return data

    def ending(self) -> dict[str, Any] | None:
        outcome = self.trajectory.outcome
        if outcome is None:
            return None
        recorded = [m for m in self.trajectory.messages if m.role == "exit"]
        status = str(outcome.status)
        content = recorded[-1].content if recorded else (outcome.submission or "") if status == "Submitted" else status
        extra: dict[str, Any] = {"exit_status": status, "submission": outcome.submission or ""}
        if outcome.detail:
            extra["exception_str"] = outcome.detail
        if recorded:  # the record holds the reference's own exit message (read from its format): kept as a message
            extra = self.stamped(recorded[-1], {**extra, "miniswe": self.own(recorded[-1])})
        return {"role": "exit", "content": content, "extra": extra}


def number_text(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _restored(data: dict[str, Any], path: str) -> ConvertedTrajectory:
    """A trajectory miniswe exported, read back whole: its header from `info.miniswe`, each message's time and step
    and each step from the messages' `extra.miniswe`, a refused reply brought back before the message that refused it."""
    info = data["info"]
    document = dict(info["miniswe"])
    document["format"], document["version"] = FORMAT, VERSION
    if document.get("source_info") is True:
        document["source_info"] = {key: value for key, value in info.items() if key != "miniswe"}
    messages: list[dict[str, Any]] = []
    steps: dict[int, dict[str, Any]] = {}
    for raw in data["messages"]:
        extra = _extra(raw)
        own = extra.get("miniswe") or {}
        if raw["role"] == "exit" and not own:
            continue  # the run's end, written from its outcome
        number = own.get("step") if isinstance(own.get("step"), int) else None
        reply = _mapping(own, "reply")
        if reply and number is not None:  # a refused reply, written inside the message that refused it
            messages.append({"role": "assistant", "content": str(extra.get("model_response") or ""),
                             "timestamp": reply.get("timestamp") or "", "step": number,
                             **({"tool_calls": reply["tool_calls"]} if reply.get("tool_calls") else {})})
        if number is not None and isinstance(own.get("call"), dict):
            steps.setdefault(number, {}).update(own["call"])
        for record in own.get("results") or []:
            if isinstance(record, dict) and isinstance(record.get("step"), int):
                steps.setdefault(record["step"], {}).update(record)
        unsent = [m for m in own.get("unsent") or [] if isinstance(m, dict)]
        result = _mapping(own, "result")
        if result and isinstance(result.get("step"), int):
            record = steps.setdefault(result["step"], {})
            record.update(result)
            if "raw_output" in extra:
                record["output"] = str(extra.get("raw_output") or "")
        message = {"role": raw["role"], "content": _text(raw.get("content")), "timestamp": own.get("timestamp") or ""}
        if number is not None:
            message["step"] = number
        if raw.get("tool_calls"):
            message["tool_calls"] = raw["tool_calls"]
        if raw.get("tool_call_id") is not None:
            message["tool_call_id"] = raw["tool_call_id"]
        messages.append(message)
        messages += unsent  # the record of a submission, which the model was never told
    document["messages"] = messages
    document["steps"] = [{**record, "step": number} for number, record in sorted(steps.items())]
    trajectory = ConvertedTrajectory.from_dict(upgrade(document, path), path)
    trajectory.started = _mapping(document, "timing").get("started")  # unknown stays unknown, not "now"
    trajectory.source_format = f"{data.get('trajectory_format')} (miniswe's export)"
    return trajectory
