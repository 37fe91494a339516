"""The run record: a Trajectory of Messages and Steps, its only write API, and `load`, which upgrades old files.

One JSON document per run, rewritten atomically after every step. Each message and step is encoded once,
when it is added (and passed through the run's redaction then), so saving step 300 costs little more
than saving step 3. Nothing else writes a trajectory file.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from miniswe import __version__
from miniswe.atomic import SwapFile, write_atomic
from miniswe.errors import RecordError, TrajectoryError
from miniswe.status import ExitStatus, Outcome
from miniswe.usage import Usage

FORMAT = "miniswe-trajectory"
VERSION = 2
# A setup or eval command's output is kept as its tail: enough to see why it failed.
COMMAND_TAIL = 2000


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + os.urandom(3).hex()


def default_trajectory_path(task: str, run_id: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", task.lower())[:40].strip("-") or "task"
    return os.path.join("trajectories", f"{run_id}-{slug}.traj.json")


def iso_time(seconds: float) -> str:
    """A Unix time as the UTC ISO 8601 text trajectories record, to the millisecond."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{int(seconds * 1000) % 1000:03d}Z"


def now_iso() -> str:
    return iso_time(time.time())


@dataclass(frozen=True)
class Message:
    role: str
    content: str
    timestamp: str
    step: int | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an assistant message's native tool calls (protocol.kind: tools)
    tool_call_id: str | None = None  # a tool message: the call it answers

    def to_dict(self) -> dict[str, Any]:
        data = {"role": self.role, "content": self.content, "timestamp": self.timestamp}
        if self.step is not None:
            data["step"] = self.step
        if self.tool_calls:
            data["tool_calls"] = self.tool_calls
        if self.tool_call_id is not None:
            data["tool_call_id"] = self.tool_call_id
        return data

    def wire(self) -> dict[str, Any]:
        """The message as the model is sent it."""
        data: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            data["tool_calls"] = self.tool_calls
        if self.tool_call_id is not None:
            data["tool_call_id"] = self.tool_call_id
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Message:
        calls = data.get("tool_calls")
        call_id = data.get("tool_call_id")
        return cls(data.get("role") or "", data.get("content") or "", data.get("timestamp") or "", data.get("step"),
                   calls if isinstance(calls, list) and calls else None, call_id if isinstance(call_id, str) else None)


@dataclass(frozen=True)
class Step:
    """One model call and what came of it: a command run, or a format error."""

    step: int  # from 1
    thought: str = ""  # the prose before the action block, reasoning left out
    command: str | None = None  # None for a format error
    format_error: str | None = None
    returncode: int | None = None  # None when killed (timeout, stop, dead sandbox)
    timed_out: bool = False
    output: str = ""  # as kept: whole, or head + elision notice + tail
    output_chars: int = 0  # size of the whole output
    elided_chars: int = 0  # how much of output_chars the trajectory did not keep (the capture bound)
    duration_s: float = 0.0
    aborted: str | None = None  # SIGINT, SIGTERM, SIGHUP, SandboxError: the command was cut short
    refused: str | None = None  # why the command did not run (the command policy, or a person's no)
    proposed: str | None = None  # the model's own command, when a hook or a person changed it before it ran
    reasoning: str | None = None
    finish_reason: str | None = None
    usage: Usage = field(default_factory=lambda: Usage(model_calls=1))  # this call's tokens and cost
    latency_s: float = 0.0
    # protocol.kind: tools: the call this step ran ({id, name, arguments, index}: its place in the reply); a reply
    # with several calls makes a step of each, and the first carries the model call's usage, reasoning and latency
    tool_call: dict[str, Any] | None = None
    # the sub-agents this step ran: each {trajectory, run_id, depth, task, exit_status, exit_detail, usage}
    children: list[dict[str, Any]] | None = None

    @property
    def first_of_call(self) -> bool:
        """Whether this step carries its model call (not a second tool call of the same reply)."""
        return not self.tool_call or not self.tool_call.get("index")

    def to_dict(self) -> dict[str, Any]:
        data = {name: getattr(self, name) for name in _STEP_FIELDS}
        usage = self.usage
        data["usage"] = {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
                         "total_tokens": usage.total_tokens, "cached_tokens": usage.cached_tokens, "cost": usage.cost}
        for name in _OPTIONAL_FIELDS:  # written only when set: a text-protocol run's steps stay as they were
            if getattr(self, name):
                data[name] = getattr(self, name)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Step:
        # null where a value is expected (a foreign or hand-edited file): the field's default
        known = {name: data[name] for name in _STEP_FIELDS
                 if name in data and (data[name] is not None or name in _NULLABLE)}
        optional = {name: data[name] for name in _OPTIONAL_FIELDS if data.get(name)}
        usage = Usage.from_dict(data.get("usage"))
        step = cls(**known, **optional, usage=usage)
        usage.model_calls = 1 if step.first_of_call else 0  # a step is one call (or its first), so its record leaves the count out
        return step


_OPTIONAL_FIELDS = ("tool_call", "children")
_STEP_FIELDS = tuple(f.name for f in fields(Step) if f.name != "usage" and f.name not in _OPTIONAL_FIELDS)
_NULLABLE = frozenset(f.name for f in fields(Step) if f.default is None)


@dataclass(frozen=True)
class CommandRecord:
    """A setup or evaluation command: its return code and the tail of its output."""

    command: str
    returncode: int | None
    timed_out: bool
    output: str
    duration_s: float

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in ("command", "returncode", "timed_out", "output", "duration_s")}


class Trajectory:
    """A run's record. The agent and the runner write it through these methods only; `save` puts it on disk."""

    def __init__(
        self,
        path: str,
        *,
        task: str,
        config: dict[str, Any],
        environment: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
        redact: Callable[[str], str] | None = None,
    ):
        self.path = path
        self.task = task
        self.config = config
        self.environment = environment or {}
        self.model: dict[str, Any] = {}
        self.metadata = metadata or {}
        self.messages: list[Message] = []
        self.steps: list[Step] = []
        self.usage = Usage()
        self.outcome: Outcome | None = None
        self.started = now_iso()
        self.ended: str | None = None
        self.wall_s: float | None = None  # the whole run's wall time once ended; while not, as of the last save
        self.setup: list[CommandRecord] = []
        self.evaluation: list[CommandRecord] = []
        self.resolved: bool | None = None
        self.warnings: list[str] = []
        self.pending: Step | None = None  # a reply whose command has not finished: on disk, so resuming repeats no call
        self.resumes: list[dict[str, Any]] = []  # each time the run was continued: when, from which step, what changed
        self.parent: dict[str, Any] | None = None  # the run this one was forked from, and at which step
        self.session: dict[str, Any] | None = None  # a chat session's id, summary, turns and context (chat only)
        self.compactions: list[dict[str, Any]] = []  # each time the model's context was compacted (compaction.py)
        self.extra: dict[str, Any] = {}  # top-level keys this version does not know, kept as they were
        self._redact = redact or (lambda text: text)
        self._messages_json: list[bytes] = []
        self._steps_json: list[bytes] = []
        self._clock = time.monotonic()
        self._wall_before = 0.0  # wall time of the sessions before this one (a resumed run, a killed one's last save)
        self._file = SwapFile(path)
        self._lock: RecordLock | None = None  # this process's claim on the file, from the first save to the run's end

    # -- the write API -------------------------------------------------------------------------------------
    def add_message(self, role: str, content: str, step: int | None = None, *,
                    tool_calls: list[dict[str, Any]] | None = None, tool_call_id: str | None = None) -> Message:
        message = Message(role, content, now_iso(), step, tool_calls or None, tool_call_id)
        self._append_message(message)
        return message

    def _append_message(self, message: Message) -> None:
        self.messages.append(message)
        self._messages_json.append(self._encode(message.to_dict()))

    def record_step(self, step: Step) -> None:
        self.steps.append(step)
        self._steps_json.append(self._encode(step.to_dict()))
        self.pending = None

    def set_pending(self, step: Step) -> None:
        """The step a reply asked for, before its command runs; `record_step` replaces it."""
        self.pending = step

    def add_compaction(self, entry: dict[str, Any]) -> None:
        self.compactions.append(entry)

    def set_redaction(self, redact: Callable[[str], str]) -> None:
        """Mask these secrets in what is recorded from now on (a loaded trajectory that goes on)."""
        self._redact = redact

    def add_usage(self, usage: Usage) -> None:
        self.usage.add(usage)

    def describe(self, *, environment: dict[str, Any] | None = None, model: dict[str, Any] | None = None) -> None:
        if environment is not None:
            self.environment = environment
        if model is not None:
            self.model = model

    def record_command(self, phase: str, record: CommandRecord) -> None:
        record = CommandRecord(self._redact(record.command), record.returncode, record.timed_out,
                               self._redact(record.output), record.duration_s)
        {"setup": self.setup, "evaluation": self.evaluation}[phase].append(record)

    def set_resolved(self, resolved: bool) -> None:
        self.resolved = resolved

    def warn(self, message: str, *, once: bool = False) -> None:
        """A warning for the record; with `once`, unless the same one is recorded already."""
        message = self._redact(message)
        if not (once and message in self.warnings):
            self.warnings.append(message)

    def begin_turn(self) -> None:
        """A chat session's next turn: the run is in flight again (no exit status) until `finish`."""
        self.outcome = None
        self.ended = None

    def set_session(self, **fields: Any) -> None:
        """Chat session fields (id, summary, mode, context_from, turns), kept under the top-level `session` key."""
        self.session = {**(self.session or {}), **fields}

    def set_config(self, config: dict[str, Any]) -> None:
        """The config the run goes on with (a chat session loaded by another process); recorded masked."""
        self.config = config

    def relocate(self, path: str) -> None:
        """Save to `path` from now on (a chat session loaded from its file goes on in the autosave)."""
        self.release()
        self.path = path
        self._file = SwapFile(path)

    def hold(self, lock: RecordLock) -> None:
        """Take over a claim on this trajectory's file made before it was read (`load(lock=True)`)."""
        self.release()
        self._lock = lock

    def release(self) -> None:
        """Let go of the file: another process may write it now (the run ended, or never started)."""
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.release()

    def copy_to(self, path: str) -> None:
        """Write the whole document to another file too, atomically (a chat session's /save)."""
        try:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            write_atomic(path, self._document())
        except OSError as error:
            raise RecordError(f"cannot save {path}: {error.strerror or error}; free some space or make its folder "
                              "writable") from None

    def reopen(self, **record: Any) -> None:
        """Continue a run that ended without a verdict (or never ended): its end is cleared, and the resume is
        recorded with `record` (when, from which step, what changed)."""
        self.outcome = None
        self.ended = None
        self.resumes.append({"at": now_iso(), "from_step": len(self.steps), "miniswe_version": __version__, **record})

    def finish(self, outcome: Outcome) -> None:
        """The run's end; its detail and submission are redacted here, so all that derives from them is clean."""
        redact = self._redact
        self.outcome = Outcome(outcome.status, redact(outcome.detail) if outcome.detail else outcome.detail,
                               redact(outcome.submission) if outcome.submission else outcome.submission)
        self.ended = now_iso()
        self.wall_s = round(self.wall_s_so_far(), 3)

    # -- reading ---------------------------------------------------------------------------------------------
    @property
    def exit_status(self) -> str | None:
        return str(self.outcome.status) if self.outcome else None

    def wall_s_so_far(self) -> float:
        return self._wall_before + time.monotonic() - self._clock

    def header(self) -> dict[str, Any]:
        """Every top-level key but the messages and steps."""
        outcome = self.outcome
        data: dict[str, Any] = {
            "format": FORMAT,
            "version": VERSION,
            "miniswe_version": __version__,
            "task": self.task,
            "exit_status": str(outcome.status) if outcome else None,
            "exit_detail": outcome.detail if outcome else None,
            "submission": outcome.submission if outcome else None,
            "usage": self.usage.to_dict(),
            "timing": {"started": self.started, "ended": self.ended, "wall_s": self.wall_s},
            "config": self.config,
            "environment": self.environment,
            "model": self.model,
            "metadata": self.metadata,
        }
        if self.setup:
            data["setup"] = [r.to_dict() for r in self.setup]
        if self.evaluation:
            data["evaluation"] = [r.to_dict() for r in self.evaluation]
        if self.resolved is not None:
            data["resolved"] = self.resolved
        if self.warnings:
            data["warnings"] = list(self.warnings)
        if self.pending is not None:
            data["pending"] = self.pending.to_dict()
        if self.resumes:
            data["resumes"] = self.resumes
        if self.parent is not None:
            data["parent"] = self.parent
        if self.session is not None:
            data["session"] = self.session
        if self.compactions:
            data["compactions"] = self.compactions
        return {**self.extra, **data}

    def to_dict(self) -> dict[str, Any]:
        return {**self.header(), "messages": [m.to_dict() for m in self.messages], "steps": [s.to_dict() for s in self.steps]}

    # -- saving ----------------------------------------------------------------------------------------------
    def save(self, *, claim: bool = True) -> None:
        """Replace the file with the whole document, atomically: never half a file on disk. A run not ended yet
        records its wall time so far, so a run killed (kill -9, a lost machine) and resumed keeps it.

        The first save claims the file for this process (`claim_file`): another process's save, resume or replay
        of it is refused until the run ends, which lets go of it. InUse when another process holds it already.
        `claim=False`: write over whoever holds it (a batch closing the record of a worker it gave up on)."""
        if self.ended is None:
            self.wall_s = round(self.wall_s_so_far(), 3)
        document = self._document()
        try:
            if self._lock is None and claim:
                os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
                self._lock = claim_file(self.path)
            try:
                self._file.write(document)
            except FileNotFoundError:  # its folder was removed under the run: made again, not checked every save
                os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
                self._file.write(document)
        except OSError as error:
            raise RecordError(f"cannot save the trajectory {self.path}: {error.strerror or error}; "
                              "free some space or make its folder writable") from None
        if self.ended is not None:
            self.release()  # the run is over: nothing more is written until it goes on (a chat's next turn)

    def _document(self) -> list[bytes]:
        """The file's pieces, in order (written with writev: never joined into one copy of the file)."""
        return [self._encode(self.header())[:-1], b', "messages": [', *_separated(self._messages_json),
                b'], "steps": [', *_separated(self._steps_json), b"]}\n"]

    def _encode(self, data: dict[str, Any]) -> bytes:
        return self._redact(json.dumps(data, ensure_ascii=False)).encode()

    @classmethod
    def from_dict(cls, data: dict[str, Any], path: str, *, redact: Callable[[str], str] | None = None) -> Trajectory:
        """A trajectory of the current version, as recorded (see `load` for reading and upgrading a file)."""
        trajectory = cls(path, task=data.get("task") or "", config=data.get("config") or {},
                         environment=data.get("environment") or {}, metadata=data.get("metadata") or {}, redact=redact)
        trajectory.model = data.get("model") or {}
        for message in data.get("messages") or []:
            trajectory._append_message(Message.from_dict(message))
        for step in data.get("steps") or []:
            trajectory.record_step(Step.from_dict(step))
        trajectory.usage = Usage.from_dict(data.get("usage"))
        if data.get("exit_status"):
            try:
                status = ExitStatus(data["exit_status"])
            except ValueError:
                raise TrajectoryError(f"{path}: unknown exit_status {data['exit_status']!r}") from None
            trajectory.outcome = Outcome(status, data.get("exit_detail"), data.get("submission"))
        timing = data.get("timing") or {}
        trajectory.started = timing.get("started") or trajectory.started
        trajectory.ended = timing.get("ended")
        trajectory.wall_s = timing.get("wall_s")
        trajectory._wall_before = float(timing.get("wall_s") or 0.0)
        for phase in ("setup", "evaluation"):
            for record in data.get(phase) or []:
                trajectory.record_command(phase, CommandRecord(record["command"], record.get("returncode"),
                                                               bool(record.get("timed_out")), record.get("output") or "",
                                                               record.get("duration_s") or 0.0))
        trajectory.resolved = data.get("resolved")
        trajectory.warnings = list(data.get("warnings") or [])
        trajectory.pending = Step.from_dict(data["pending"]) if isinstance(data.get("pending"), dict) else None
        trajectory.resumes = list(data.get("resumes") or [])
        trajectory.parent = data.get("parent") if isinstance(data.get("parent"), dict) else None
        trajectory.session = data.get("session") if isinstance(data.get("session"), dict) else None
        trajectory.compactions = [entry for entry in data.get("compactions") or [] if isinstance(entry, dict)]
        known = set(trajectory.header()) | {"messages", "steps", "setup", "evaluation", "resolved", "warnings",
                                            "pending", "resumes", "parent", "session", "compactions"}
        trajectory.extra = {k: v for k, v in data.items() if k not in known}
        return trajectory


def _separated(items: list[bytes]) -> list[bytes]:
    """A JSON array's encoded items with the separator between each two, not joined."""
    pieces = [b",\n"] * (2 * len(items) - 1) if items else []
    pieces[::2] = items
    return pieces


class TrajectoryWriter:
    """The run record as a hook (miniswe/hooks.py): each event of the loop written into the Trajectory, which
    is saved when a step is complete, and when a reply is in but its command not yet run (a reply is paid
    for). It runs after every other hook, so the record holds what they decided."""

    records = True  # told what happened even after another hook raised (miniswe/hooks.py)

    def __init__(self, trajectory: Trajectory, notify: Callable[[str], None] = lambda message: None):
        self.trajectory = trajectory
        self.notify = notify
        self._made: dict[str, Any] = {}  # the latest reply's record, for the step its command becomes

    def on_run_start(self, event: Any) -> None:
        for message in event.messages:
            self.trajectory.add_message(message["role"], message["content"], message.get("step"))
        self.trajectory.save()

    def after_reply(self, event: Any) -> None:
        reply, trajectory = event.reply, self.trajectory
        trajectory.add_message("assistant", reply.content, event.step,
                               tool_calls=[call.to_wire() for call in reply.tool_calls])
        for warning in reply.warnings:
            if trajectory._redact(warning) not in trajectory.warnings:
                trajectory.warn(warning)
                self.notify(f"warning: {warning}")
        self._made = made_by(reply)

    def before_command(self, event: Any) -> None:
        if not event.veto:
            call = getattr(event, "tool_call", None)
            made = self._made if not call or not call.get("index") else following(self._made)
            self.trajectory.set_pending(Step(event.step, command=event.command, tool_call=call, **made))
            self.trajectory.save()

    def after_command(self, event: Any) -> None:
        step = event.step
        self.trajectory.record_step(step)
        if event.observation:
            if step.tool_call:
                self.trajectory.add_message("tool", event.message(), step.step, tool_call_id=step.tool_call["id"])
            else:
                self.trajectory.add_message("user", event.message(), step.step)
        self.trajectory.save()


def made_by(reply: Any) -> dict[str, Any]:
    """What a step records of the model call that asked for it."""
    from miniswe.protocol import strip_reasoning, thought_of

    thought = strip_reasoning(reply.content or "").strip() if reply.tool_calls else thought_of(reply.content)
    return {"thought": thought, "reasoning": reply.reasoning, "finish_reason": reply.finish_reason,
            "usage": reply.usage, "latency_s": round(reply.latency_s, 4)}


def following(made: dict[str, Any]) -> dict[str, Any]:
    """What the second and later tool calls of a reply record: the call's usage, reasoning and latency are on
    its first step only, so that summing steps counts each call once."""
    return {"thought": "", "reasoning": None, "finish_reason": made.get("finish_reason"), "usage": Usage(),
            "latency_s": 0.0}


def read_document(path: str) -> Any:
    """The parsed JSON of a trajectory file, with one-line errors."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except OSError as error:
        raise TrajectoryError(f"{path}: cannot read trajectory: {error.strerror}") from None
    except UnicodeDecodeError:
        raise TrajectoryError(f"{path}: not UTF-8 text; is it a trajectory file?") from None
    except ValueError as error:
        raise TrajectoryError(f"{path}: not valid JSON ({error}); is it a trajectory file?") from None
    except RecursionError:
        raise TrajectoryError(f"{path}: JSON nested too deeply to read; is it a trajectory file?") from None


# -- what a trajectory's fields hold -------------------------------------------------------------------------
# A document that is JSON but holds a wrong type somewhere ("steps": "x") is refused when it is read, in one
# line naming the field, rather than crashing whichever command reads that field first. Missing keys take
# their defaults (older and foreign writers leave some out); keys not named here are kept unchecked.

@dataclass(frozen=True)
class Shape:
    types: tuple[str, ...]  # JSON types accepted: string, integer, number, boolean, mapping, list, null
    keys: dict[str, Shape] | None = None  # a mapping's known keys
    items: Shape | None = None  # a list's items
    required: tuple[str, ...] = ()  # keys a mapping must have


def _shape(*types: str, keys: dict[str, Shape] | None = None, items: Shape | None = None,
           required: tuple[str, ...] = ()) -> Shape:
    return Shape(types, keys, items, required)


TEXT, TEXT_OR_NULL = _shape("string"), _shape("string", "null")
WHOLE, WHOLE_OR_NULL = _shape("integer"), _shape("integer", "null")
NUMBER, NUMBER_OR_NULL = _shape("number"), _shape("number", "null")
FLAG, FLAG_OR_NULL = _shape("boolean"), _shape("boolean", "null")
MAPPING_OR_NULL = _shape("mapping", "null")  # a usage's figures: one that cannot be read counts as 0 (Usage.from_dict)
TOOL_CALL = _shape("mapping", "null", keys={"id": TEXT_OR_NULL, "name": TEXT_OR_NULL, "arguments": TEXT_OR_NULL,
                                            "index": WHOLE_OR_NULL})
CHILD = _shape("mapping", keys={"trajectory": TEXT, "run_id": TEXT_OR_NULL, "depth": WHOLE_OR_NULL,
                                "task": TEXT_OR_NULL, "exit_status": TEXT_OR_NULL, "exit_detail": TEXT_OR_NULL,
                                "usage": MAPPING_OR_NULL})
STEP = _shape("mapping", required=("step",), keys={
    "step": WHOLE, "thought": TEXT_OR_NULL, "command": TEXT_OR_NULL, "format_error": TEXT_OR_NULL,
    "returncode": WHOLE_OR_NULL, "timed_out": FLAG_OR_NULL, "output": TEXT_OR_NULL, "output_chars": WHOLE_OR_NULL,
    "elided_chars": WHOLE_OR_NULL, "duration_s": NUMBER_OR_NULL, "aborted": TEXT_OR_NULL, "refused": TEXT_OR_NULL,
    "proposed": TEXT_OR_NULL, "reasoning": TEXT_OR_NULL, "finish_reason": TEXT_OR_NULL, "usage": MAPPING_OR_NULL,
    "latency_s": NUMBER_OR_NULL, "tool_call": TOOL_CALL, "children": _shape("list", "null", items=CHILD)})
MESSAGE = _shape("mapping", keys={
    "role": TEXT, "content": TEXT_OR_NULL, "timestamp": TEXT_OR_NULL, "step": WHOLE_OR_NULL,
    "tool_calls": _shape("list", "null", items=_shape("mapping")), "tool_call_id": TEXT_OR_NULL})
COMMAND = _shape("mapping", required=("command",), keys={
    "command": TEXT, "returncode": WHOLE_OR_NULL, "timed_out": FLAG_OR_NULL, "output": TEXT_OR_NULL,
    "duration_s": NUMBER_OR_NULL})
# a recorded config's sections, each a mapping; their settings are checked where the config is rebuilt
# (config.py), and a kind must be a name to be looked up at all
SECTION = _shape("mapping", "null", keys={"kind": TEXT_OR_NULL})
DOCUMENT = _shape("mapping", keys={
    "format": TEXT, "version": WHOLE, "miniswe_version": TEXT_OR_NULL, "task": TEXT_OR_NULL,
    "exit_status": TEXT_OR_NULL, "exit_detail": TEXT_OR_NULL, "submission": TEXT_OR_NULL, "usage": MAPPING_OR_NULL,
    "timing": _shape("mapping", "null", keys={"started": TEXT_OR_NULL, "ended": TEXT_OR_NULL, "wall_s": NUMBER_OR_NULL}),
    "config": _shape("mapping", "null", keys={name: SECTION for name in
                                              ("agent", "protocol", "environment", "model", "replay", "policy")}),
    "environment": _shape("mapping", "null", keys={"kind": TEXT_OR_NULL, "cwd": TEXT_OR_NULL}),
    "model": MAPPING_OR_NULL,
    "metadata": _shape("mapping", "null", keys={"run_id": TEXT_OR_NULL, "task_id": TEXT_OR_NULL}),
    "setup": _shape("list", "null", items=COMMAND), "evaluation": _shape("list", "null", items=COMMAND),
    "resolved": FLAG_OR_NULL, "warnings": _shape("list", "null", items=TEXT),
    "pending": _shape("mapping", "null", keys=STEP.keys, required=STEP.required),
    "resumes": _shape("list", "null", items=_shape("mapping", keys={
        "at": TEXT_OR_NULL, "from_step": WHOLE_OR_NULL, "changes": MAPPING_OR_NULL, "diverged": TEXT_OR_NULL})),
    "parent": _shape("mapping", "null", keys={"trajectory": TEXT_OR_NULL, "run_id": TEXT_OR_NULL,
                                              "from_step": WHOLE_OR_NULL}),
    "session": _shape("mapping", "null", keys={
        "id": TEXT_OR_NULL, "summary": TEXT_OR_NULL, "mode": TEXT_OR_NULL, "context_from": WHOLE_OR_NULL,
        "turns": _shape("list", "null", items=_shape("mapping"))}),
    # each as compaction.py writes it: what inspect shows and a resumed run's projection needs
    "compactions": _shape("list", "null", items=_shape("mapping", required=(
        "step", "kind", "tokens_before", "tokens_after"), keys={
        "step": WHOLE, "kind": TEXT, "why": TEXT_OR_NULL, "window": WHOLE_OR_NULL, "tokens_before": WHOLE,
        "tokens_after": WHOLE, "elided_through": WHOLE, "summary_through": WHOLE, "summary": TEXT_OR_NULL,
        "usage": MAPPING_OR_NULL})),
    "messages": _shape("list", "null", items=MESSAGE), "steps": _shape("list", "null", items=STEP),
})
# what the upgrade from version 1 reads, checked before it runs
DOCUMENT_V1 = _shape("mapping", keys={key: DOCUMENT.keys[key] for key in ("messages", "steps", "config")})
_NAMES = {"string": "a string", "integer": "a whole number", "number": "a number", "boolean": "true or false",
          "mapping": "a mapping", "list": "a list", "null": "null"}


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "list" if isinstance(value, list) else "mapping" if isinstance(value, dict) else type(value).__name__


def problem(value: Any, shape: Shape, where: str = "") -> str | None:
    """The first place `value` does not fit `shape`: "steps[2].output: expected a string, got a number"."""
    found = json_type(value)
    if found not in shape.types and not (found == "integer" and "number" in shape.types):
        expected = " or ".join(_NAMES[name] for name in shape.types if name != "null")
        got = "a whole number" if found == "integer" else _NAMES.get(found, found)
        return f"{where or 'the document'}: expected {expected}, got {got}"
    if isinstance(value, dict):
        for key in shape.required:
            if key not in value:
                return f"{where}{'.' if where else ''}{key}: missing"
        for key, inner in (shape.keys or {}).items():
            if key in value:
                found_problem = problem(value[key], inner, f"{where}{'.' if where else ''}{key}")
                if found_problem:
                    return found_problem
    elif isinstance(value, list) and shape.items is not None:
        for index, item in enumerate(value):
            found_problem = problem(item, shape.items, f"{where}[{index}]")
            if found_problem:
                return found_problem
    return None


def check_fields(data: Any, path: str, shape: Shape = DOCUMENT) -> None:
    """TrajectoryError, in one line naming the file, the field and what it should hold, for a document a field
    of which holds the wrong type."""
    found = problem(data, shape)
    if found:
        raise TrajectoryError(f"{path}: {found}; the file is damaged or not a miniswe trajectory")


def upgrade(data: Any, path: str) -> dict[str, Any]:
    """A miniswe trajectory document brought to the current version, each field checked (`check_fields`);
    TrajectoryError for anything else."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        if isinstance(data, dict):
            found = f"trajectory_format {data['trajectory_format']!r}" if "trajectory_format" in data else (
                f"format {data.get('format')!r}" if "format" in data else "a mapping without `format`")
        else:
            found = f"a JSON {type(data).__name__}"
        raise TrajectoryError(f"{path}: not a miniswe trajectory (found {found})")
    version = data.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise TrajectoryError(f"{path}: bad trajectory version {version!r}")
    if version > VERSION:
        raise TrajectoryError(f"{path} was written by a newer miniswe (format {version} > {VERSION}); upgrade miniswe")
    while data["version"] < VERSION:
        check_fields(data, path, DOCUMENT_V1)
        data = UPGRADES[data["version"]](data)
    check_fields(data, path)
    return data


def load(path: str, *, redact: Callable[[str], str] | None = None, lock: bool = False) -> Trajectory:
    """Read a trajectory, validating its format and upgrading an older version to the current one. With `lock`,
    the file is claimed for this process first (InUse if another holds it), so what is read is what the run
    goes on from; the trajectory holds the claim until its run ends."""
    held = claim_file(path) if lock else None
    try:
        trajectory = Trajectory.from_dict(upgrade(read_document(path), path), path, redact=redact)
    except BaseException:
        if held is not None:
            held.release()
        raise
    if held is not None:
        trajectory.hold(held)
    return trajectory


# -- one writer at a time ---------------------------------------------------------------------------------
# A run's file is written by one process: the run that records it, from its first save to its end, or the
# resume that goes on with it. Two writers would each make their own paid calls and overwrite the other's
# record; a resume of a run still going would mark its live command aborted. The claim is an flock(2) on a
# lock file beside the trajectory (the trajectory itself cannot carry it: each save puts a new file in its
# place). The kernel drops an flock when its process ends, however it ends, so a kill -9 leaves nothing held;
# the descriptor is close-on-exec, so no command a run starts inherits it.

class InUse(TrajectoryError):
    """Another process holds the trajectory: its run is still going, or another resume or replay of it is."""


def lock_path(path: str) -> str:
    directory, name = os.path.split(os.path.abspath(path))
    return os.path.join(directory, f".{name}.lock")


class _Flock:
    """This process's flock on one lock file, shared by its holders (a chat session loaded over its own autosave
    holds the same file twice): released, and its file removed, when the last one lets go."""

    def __init__(self, fd: int | None, key: str):
        self.fd, self.key, self.holders = fd, key, 0

    @classmethod
    def take(cls, key: str, path: str) -> _Flock:
        while True:
            try:
                fd = os.open(key, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)  # the umask applies
            except OSError:
                # no lock file can be made here (a read-only folder): a save fails on its own, with its own
                # message; a replay of a file it only reads goes on unclaimed
                return cls(None, key)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(fd)
                os.close(fd)
                raise InUse(f"{path}: in use by another miniswe process{holder}: its run is still going, or another "
                            "resume or replay of it is; wait for that to end (or stop it), then run this again") from None
            except OSError:  # a file system without flock: unclaimed, as before there were claims
                os.close(fd)
                return cls(None, key)
            try:  # the last holder removed the file between our open and our flock: claim the one there now
                current = os.stat(key)
            except OSError:
                current = None
            if current is not None and os.path.samestat(os.fstat(fd), current):
                break
            os.close(fd)
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
        except OSError:
            pass  # who holds it is only for the message of whoever is refused
        return cls(fd, key)

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            os.unlink(self.key)  # while still holding it: whoever opened it before then finds it gone, and retries
        except OSError:
            pass
        os.close(self.fd)
        self.fd = None


def _holder(fd: int) -> str:
    """ " (pid N)" or " (pid N on HOST)" from a lock file, as its holder wrote it; "" when not written yet."""
    try:
        pid, _, host = os.pread(fd, 200, 0).decode("utf-8", "replace").strip().partition(" ")
    except OSError:
        return ""
    if not pid.isdigit():
        return ""
    return f" (pid {pid})" if not host or host == socket.gethostname() else f" (pid {pid} on {host})"


_HELD: dict[str, _Flock] = {}
_HELD_GUARD = threading.Lock()


class RecordLock:
    """One holder's claim on a trajectory's file (see `claim_file`), until `release` (idempotent) or the process's
    end. (Not released when collected: a finalizer run by the collector inside `claim_file` would deadlock.)"""

    def __init__(self, key: str):
        self._key: str | None = key

    def release(self) -> None:
        key, self._key = self._key, None
        if key is None:
            return
        with _HELD_GUARD:
            flock = _HELD.get(key)
            if flock is None:
                return
            flock.holders -= 1
            if flock.holders <= 0:
                del _HELD[key]
                flock.release()


def claim_file(path: str) -> RecordLock:
    """Claim the trajectory at `path` for this process; InUse, naming the holder's pid, when another process
    has it. Claims within one process are shared: one writer per process is the batch's and the chat's own
    business."""
    key = lock_path(path)
    with _HELD_GUARD:
        flock = _HELD.get(key)
        if flock is None:
            flock = _HELD[key] = _Flock.take(key, path)
        flock.holders += 1
    return RecordLock(key)


def store_copy(path: str, data: bytes) -> None:
    """A trajectory's bytes as another process recorded them (a Ray worker's run), stored whole at `path`."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    write_atomic(path, data)


def fork(parent: Trajectory, from_step: int, path: str, *, config: dict[str, Any], run_id: str,
         redact: Callable[[str], str] | None = None) -> Trajectory:
    """A new trajectory holding `parent`'s conversation up to the end of step `from_step` (its setup, messages,
    steps and their usage), and recording which run and step it came from. The parent is not touched."""
    if not 0 <= from_step <= len(parent.steps):
        raise TrajectoryError(f"--from-step {from_step}: {parent.path} has steps 1 to {len(parent.steps)} (0 keeps none)")
    child = Trajectory(path, task=parent.task, config=config, environment=parent.environment,
                       metadata={**parent.metadata, "run_id": run_id}, redact=redact)
    for message in parent.messages:
        if message.step is None or message.step <= from_step:
            child._append_message(message)
    for step in parent.steps[:from_step]:
        child.record_step(step)
        child.add_usage(step.usage)
        for link in step.children or ():  # a sub-agent's usage counts in the run that started it
            child.add_usage(Usage.from_dict(link.get("usage")))
    child.setup = list(parent.setup)
    child.compactions = [entry for entry in parent.compactions if entry.get("step", 0) <= from_step]
    child.parent = {"trajectory": os.path.abspath(parent.path), "run_id": parent.metadata.get("run_id"), "from_step": from_step}
    return child


def close_unfinished(path: str, outcome: Outcome) -> Trajectory | None:
    """Give a trajectory its run could not finish (its worker is stuck or gone) an exit status; None if unreadable."""
    try:
        trajectory = load(path)
    except TrajectoryError:
        return None
    if trajectory.outcome is None:
        trajectory.finish(outcome)
        trajectory.save(claim=False)  # the batch gave up on the worker that holds it
    return trajectory


# -- upgrades: UPGRADES[n] turns a version-n document into version n+1 ---------------------------------------

_ELIDED = re.compile(r"\[\.\.\. (\d+) bytes of output elided by miniswe \.\.\.\]")  # capture.elision_notice, as v1 wrote it
# Version 1 recorded every kind's settings in one flat section; these belong to one kind only.
_V1_KIND_KEYS = {
    ("environment", "docker"): ("image", "forward_env", "run_args", "executable", "pull", "start_timeout", "container_lifetime"),
    ("model", "openai"): ("base_url", "api_key_env", "temperature", "params", "retries", "timeout", "connect_timeout",
                          "max_backoff", "prices"),
    ("model", "scripted"): ("script",),
}


def _v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    """Version 2 moved each call's reasoning, finish_reason, usage and latency from its assistant message to its
    step, added each step's thought and elided_chars, and keeps only the chosen kind's settings in the config."""
    from miniswe.protocol import thought_of

    replies = {m.get("step"): m for m in data.get("messages") or [] if m.get("role") == "assistant"}
    steps = []
    for step in data.get("steps") or []:
        reply = replies.get(step.get("step"), {})
        elided = _ELIDED.search(step.get("output") or "")
        steps.append({**step, "thought": thought_of(reply.get("content") or ""), "elided_chars": int(elided[1]) if elided else 0,
                      "reasoning": reply.get("reasoning"), "finish_reason": reply.get("finish_reason"),
                      "usage": reply.get("usage") or {}, "latency_s": reply.get("latency_s") or 0.0})
    messages = [{k: m[k] for k in ("role", "content", "timestamp", "step") if k in m} for m in data.get("messages") or []]
    config = {section: dict(values) if isinstance(values, dict) else values for section, values in (data.get("config") or {}).items()}
    for (section, kind), keys in _V1_KIND_KEYS.items():
        values = config.get(section)
        if isinstance(values, dict) and values.get("kind") != kind:
            for key in keys:
                values.pop(key, None)
    return {**data, "version": 2, "messages": messages, "steps": steps, "config": config}


UPGRADES: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _v1_to_v2}
