"""Trajectories written by the reference implementation (mini-swe-agent), read into miniswe's Trajectory, and
`load_any`, which reads a trajectory file of any format miniswe knows.

Three shapes: `trajectory_format: mini-swe-agent-1` (`info` and `messages`), `mini-swe-agent-1.1` (the same,
each message with an `extra` mapping, the run's end an `exit` message) and the oldest, a bare list of messages.
Each assistant message is paired with the observation that follows it; what a shape does not record (durations,
tokens, whole outputs) is listed in `metadata["converted_from"]["not_recorded"]`, and the converted trajectory
refuses to be saved over its source.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from miniswe.errors import RecordError, TrajectoryError
from miniswe.protocol import FormatError, parse_command, thought_of
from miniswe.redaction import Secrets, masked_config, secret_entries
from miniswe.status import ExitStatus, Outcome
from miniswe.trajectory import FORMAT, VERSION, Message, Step, Trajectory, iso_time, read_document, upgrade
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


class ConvertedTrajectory(Trajectory):
    """A trajectory read from another agent's format: the same record, which never writes over its source file."""

    def save(self) -> None:
        source = self.metadata.get("converted_from", {}).get("format")
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
    """A mini-swe-agent trajectory (either dict format, or a bare message list) as a miniswe Trajectory."""
    if not is_mini_swe_agent(data):
        raise TrajectoryError(f"{path}: not a mini-swe-agent trajectory")
    data = _without_secrets(data)
    listed = isinstance(data, list)
    source = MESSAGE_LIST if listed else data["trajectory_format"]
    info = {} if listed else _mapping(data, "info")
    raw = data if listed else data["messages"]
    return _Converter(path, source, info, [m for m in raw if isinstance(m, dict)]).convert()


def _without_secrets(data: Any) -> Any:
    """The reference masked nothing: the values of secret-looking settings in its config (an `api_key` in
    `model_kwargs`, a `GITHUB_TOKEN` in the environment) are masked wherever they appear, as miniswe records them."""
    config = _mapping(_mapping(data, "info"), "config")
    if not config:
        return data
    secrets = Secrets()
    for dotted, value in secret_entries(config):
        secrets.add(value, dotted)
    return json.loads(secrets.scrub(json.dumps(data, ensure_ascii=False))) if secrets else data


class _Converter:
    def __init__(self, path: str, source: str, info: dict[str, Any], raw: list[dict[str, Any]]):
        self.path, self.source, self.info, self.raw = path, source, info, raw
        self.config = _mapping(info, "config")
        self.missing: set[str] = set()
        self.notes: list[str] = []
        self.markers: list[str] = []  # submit markers the commands printed, in order
        self.usage_seen = {"tokens": 0, "cost": 0, "calls": 0}
        exits = [_extra(m) for m in raw if m.get("role") == "exit"]
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
            role = str(message.get("role") or "")
            if role == "user" and _extra(message).get("interrupt_type") == "FormatError":
                # 1.1 keeps a malformed reply only inside its error message (the model never saw it again)
                number = len(steps) + 1
                messages.append(Message(role, _text(message.get("content")), _timestamp(message), number))
                reply = str(_extra(message).get("model_response") or "")
                steps.append(Step(number, thought=thought_of(reply), format_error=_reference_error_kind(reply),
                                  usage=self.step_usage(_extra(message))))
                i += 1
                continue
            if role != "assistant":
                messages.append(Message(role, _text(message.get("content")), _timestamp(message)))
                i += 1
                continue
            number = len(steps) + 1
            messages.append(Message(role, _text(message.get("content")), _timestamp(message), number))
            observations = []
            i += 1
            while i < len(self.raw) and self.raw[i].get("role") in ("user", "tool") and (
                    not observations or self.raw[i].get("role") == "tool" or _is_observation_of_many(self.raw, i)):
                observations.append(self.raw[i])
                messages.append(Message(str(self.raw[i]["role"]), _text(self.raw[i].get("content")), _timestamp(self.raw[i]), number))
                i += 1
            last_reply = not any(m.get("role") == "assistant" for m in self.raw[i:])
            steps.append(self.step(number, message, observations, last=i >= len(self.raw), last_reply=last_reply))
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
        commands = [a["command"] for a in extra.get("actions") or [] if isinstance(a, dict) and isinstance(a.get("command"), str)]
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
            output = (exception + "\n" if exception else "") + output
            return {"output": output, "returncode": returncode, "chars": len(output), "elided": 0,
                    "timed_out": "timed out" in exception.lower() or "timeout" in exception.lower()}
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
        name = _mapping(self.config, "model").get("model_name") or self.info.get("model_name")
        if not name:
            self.missing.add("model")
        return {"kind": self.config.get("model_type") or "", "name": name or ""}

    def environment(self) -> dict[str, Any]:
        settings = _mapping(self.config, "environment")
        described = {"kind": self.config.get("environment_type") or "unknown"}
        described.update({k: settings[k] for k in ("image", "cwd") if settings.get(k)})
        return described

    def miniswe_config(self) -> dict[str, Any]:
        """The reference's settings that miniswe has too, under miniswe's keys (config_from_record rebuilds it)."""
        protocol: dict[str, Any] = {"action_tags": _action_tags(_mapping(self.config, "model"))}
        if self.markers:  # the marker of the last command that printed one: what this run submitted with
            protocol["submit_marker"] = self.markers[-1]
        if not self.config:
            self.missing.add("config")
            return {"protocol": protocol}
        agent, env, model = (_mapping(self.config, section) for section in ("agent", "environment", "model"))
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
        if isinstance(env.get("env"), dict):
            config["environment"]["env"] = {str(k): str(v) for k, v in env["env"].items()}
        timeout = figure(env.get("timeout"))
        if timeout is not None and timeout >= 0:
            config["environment"]["timeout"] = timeout
        if model.get("model_name"):
            config["model"]["name"] = str(model["model_name"])
        return config

def _action_tags(model: dict[str, Any]) -> list[str]:
    regex = model.get("action_regex")
    if isinstance(regex, str) and "mswea_bash_command" in regex:
        return ["mswea_bash_command"]
    return list(ACTION_TAGS)


def _is_observation_of_many(raw: list[dict[str, Any]], i: int) -> bool:
    """A second user message after a reply belongs to it only when 1.1 marks it as another action's output."""
    return "raw_output" in _extra(raw[i])


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
    return _mapping(message, "extra")


def _timestamp(message: dict[str, Any]) -> str:
    stamp = figure(_extra(message).get("timestamp"))
    return "" if stamp is None else iso_time(stamp)


def _seconds_between(raw: list[dict[str, Any]]) -> float | None:
    stamps = [figure(_extra(m).get("timestamp")) for m in raw]
    stamps = [s for s in stamps if s is not None]
    return round(stamps[-1] - stamps[0], 3) if len(stamps) > 1 else None
