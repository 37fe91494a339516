"""A chat session underneath the REPL: turns of the same Agent loop with the scripted model and the real local
environment; per-turn limits, the approval hook, stops, /clear, loading a session cut short."""

from __future__ import annotations

import json
import threading

import pytest

from miniswe.chat import store
from miniswe.chat.approval import Approval
from miniswe.chat.session import ChatSession
from miniswe.config import load_config
from miniswe.signals import Stop
from miniswe.status import ExitStatus, interrupted

from replies import SUBMIT, act


class Answers:
    """The person at the keyboard, answering from a list; KeyboardInterrupt for Ctrl-C."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.asked = []

    def read(self, prompt, *, default="", main=False):
        self.asked.append(prompt)
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer


class Lines:
    def line(self, text, kind=None):
        pass


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("MINISWE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def session(tmp_path, replies, *overrides, answers=(), mode="yolo"):
    script = tmp_path / "replies.json"
    script.write_text(json.dumps(replies))
    config = load_config("model.kind=scripted", f"model.script={script}", f"environment.cwd={tmp_path}", *overrides)
    stop = Stop()
    approval = Approval(Answers(*answers), Lines(), stop, mode)
    chat = ChatSession(config, stop=stop, hooks=[approval], ask=approval.policy_ask, mode=mode)
    chat.approval = approval
    return chat


def test_limits_count_per_turn_and_the_session_keeps_the_totals(tmp_path):
    chat = session(tmp_path, [act("echo 1"), act("echo 2"), act("echo 3"), act("echo 4"), SUBMIT], "agent.step_limit=2")
    try:
        first = chat.turn("count")
        assert first.status is ExitStatus.LIMITS_EXCEEDED and "step_limit" in first.detail
        second = chat.turn("count on")
        assert second.status is ExitStatus.LIMITS_EXCEEDED
        third = chat.turn("and submit")
        assert third.status is ExitStatus.SUBMITTED
        assert chat.trajectory.usage.model_calls == 5 and chat.turn_usage().model_calls == 1
        # the conversation goes on across turns: the third turn's model saw the first two
        assert sum("<task>" in m["content"] for m in chat.agent.messages) == 3
    finally:
        chat.close()
    with open(store.autosave_path()) as handle:
        data = json.load(handle)
    assert [t["exit_status"] for t in data["session"]["turns"]] == ["LimitsExceeded", "LimitsExceeded", "Submitted"]
    assert data["exit_status"] == "Submitted" and data["task"] == "count" and len(data["steps"]) == 5


def test_malformed_replies_in_a_row_count_within_a_turn(tmp_path):
    # a turn that ended on format errors does not leave the next one a single reply before it ends
    chat = session(tmp_path, ["no block", "no block", "none", "none yet", act("echo fixed"), SUBMIT],
                   "agent.max_format_errors=3")
    try:
        assert chat.turn("try").status is ExitStatus.REPEATED_FORMAT_ERROR
        second = chat.turn("try again")
        assert second.status is ExitStatus.SUBMITTED, second.detail
        told = [m["content"] for m in chat.agent.messages if m["role"] == "user"]
        assert "2 more malformed replies" in told[-3], "the model was given the format guidance in the new turn"
    finally:
        chat.close()


def test_compact_works_when_the_conversation_no_longer_fits_with_its_request(tmp_path):
    # the conversation fills most of the server's window: /compact's request on top of it is refused for its
    # length, so what /compact sends is compacted first, and the summary is made
    from openai_server import ScriptedServer

    replies = [act("head -c 3900 /dev/zero | tr '\\0' o"), SUBMIT, "SUMMARY: printed o's, submitted."]
    with ScriptedServer(replies, context_window=1800) as server:
        config = load_config(f"model.base_url={server.base_url}", "model.name=m", "model.max_backoff=0.01",
                             f"environment.cwd={tmp_path}")
        stop = Stop()
        chat = ChatSession(config, stop=stop, hooks=[], mode="yolo")
        try:
            assert chat.turn("print").status is ExitStatus.SUBMITTED
            assert server.overflows == 0, "the turn itself fit"
            turn = chat.turn_usage()
            assert chat.compact() is None, "compacted, not ended with a context-length error"
            assert chat.turn_usage() == turn, "/cost's last turn is the task's, not the compaction's"
            assert chat.trajectory.usage.model_calls == turn.model_calls + 1, "the session's totals have it"
            assert server.overflows >= 1, "its request on the whole conversation did not fit"
            assert chat.agent.messages[-1]["content"] == "SUMMARY: printed o's, submitted."
        finally:
            chat.close()


def test_policy_confirm_asks_even_in_yolo_and_a_no_is_told_to_the_model(tmp_path):
    chat = session(tmp_path, [act("echo fine"), act("git push --force"), act("git push"), SUBMIT],
                   "policy.confirm=['\\bgit\\s+push\\b']", answers=["n", "not on Fridays", "y"])
    try:
        assert chat.turn("ship it").status is ExitStatus.SUBMITTED
    finally:
        chat.close()
    steps = chat.trajectory.steps
    assert steps[0].refused is None and steps[0].output == "fine\n"  # yolo: not asked
    assert steps[1].refused == "the person said no: not on Fridays"
    assert steps[2].refused is None and steps[2].returncode is not None  # said yes: it ran
    assert len(chat.approval.editor.asked) == 3


def test_ctrl_c_at_the_approval_prompt_stops_the_turn_before_the_command(tmp_path):
    chat = session(tmp_path, [act("touch never"), act("echo next"), SUBMIT], mode="confirm",
                   answers=[KeyboardInterrupt(), "y", "y"])
    try:
        outcome = chat.turn("try")
        assert outcome.status is ExitStatus.INTERRUPTED
        chat.stop.rearm()
        assert chat.turn("again").status is ExitStatus.SUBMITTED
    finally:
        chat.close()
    assert not (tmp_path / "never").exists()
    assert chat.trajectory.steps[0].refused == "the person stopped before this command ran"


def test_an_urgent_stop_kills_the_command_and_the_next_turn_is_told(tmp_path):
    chat = session(tmp_path, [act("echo begun; sleep 30"), act("echo still here"), SUBMIT])
    try:
        threading.Timer(1.0, lambda: chat.stop.request(interrupted("SIGINT"), urgent=True)).start()
        assert chat.turn("long job").status is ExitStatus.INTERRUPTED
        chat.stop.rearm()
        assert chat.turn("go on").status is ExitStatus.SUBMITTED
    finally:
        chat.close()
    first, second = chat.trajectory.steps[:2]
    assert first.aborted == "SIGINT" and first.output == "begun\n" and second.output == "still here\n"
    told = [m.content for m in chat.trajectory.messages if m.role == "user" and m.step == 1]
    assert told and "cut short (SIGINT)" in told[0]


def test_clear_starts_the_model_afresh_and_keeps_the_history(tmp_path):
    chat = session(tmp_path, [SUBMIT, SUBMIT])
    try:
        chat.turn("one")
        chat.clear()
        chat.turn("two")
        assert [m["role"] for m in chat.agent.messages] == ["system", "user", "assistant", "user"]
        assert "two" in chat.agent.messages[1]["content"]
        assert len(chat.trajectory.messages) == 8
        assert chat._context() == chat.agent.messages  # what a /load would give the model
    finally:
        chat.close()


def test_loading_a_session_killed_mid_command_tells_the_model(tmp_path):
    from miniswe.trajectory import load

    chat = session(tmp_path, [act("echo a"), SUBMIT])
    chat.turn("first session")
    chat.close()
    # the autosave of a session whose process died while its command ran: a pending step
    recorded = load(store.autosave_path())
    from miniswe.trajectory import Step

    recorded.set_pending(Step(3, command="sleep 100", thought="THOUGHT: wait."))
    recorded.save()
    other = session(tmp_path, [act("echo later"), SUBMIT])
    try:
        loaded, kept = other.load("auto")
        assert loaded == "autosave" and kept is None
        assert "miniswe stopped" in other.agent.messages[-1]["content"]
        assert other.turn("go on").status is ExitStatus.SUBMITTED
    finally:
        other.close()
    assert [s.id for s in store.list_sessions()] == ["autosave"]  # the same session went on in its autosave
    data = load(store.autosave_path())
    assert [s.command for s in data.steps] == [act("echo a").split("\n")[3], data.steps[1].command, "sleep 100",
                                               "echo later", data.steps[4].command]
    assert data.steps[2].aborted == "miniswe stopped"


def test_a_new_session_keeps_the_last_autosave_under_an_id(tmp_path):
    chat = session(tmp_path, [SUBMIT])
    chat.turn("the old one")
    chat.close()
    notes = []
    other = session(tmp_path, [SUBMIT])
    other.notify = notes.append
    try:
        other.turn("the new one")
    finally:
        other.close()
    listed = store.list_sessions()
    assert sorted(s.summary for s in listed) == ["the new one · Submitted", "the old one · Submitted"]
    assert notes and "the previous session was kept as" in notes[0]


def test_a_command_the_person_edited_is_told_to_the_model_as_what_ran(tmp_path):
    chat = session(tmp_path, [act("echo original"), SUBMIT], mode="confirm", answers=["e", "echo edited", "y"])
    try:
        assert chat.turn("go").status is ExitStatus.SUBMITTED
    finally:
        chat.close()
    step = chat.trajectory.steps[0]
    assert step.command == "echo edited" and step.proposed == "echo original" and step.output == "edited\n"
    told = [m["content"] for m in chat.agent.messages if m["role"] in ("user", "tool") and "edited\n" in m["content"]]
    assert len(told) == 1 and "this ran instead of yours:\necho edited" in told[0], told
    assert "echo original" not in told[0]
    recorded = [m.content for m in chat.trajectory.messages if m.step == 1 and m.role in ("user", "tool")]
    assert any("this ran instead of yours" in text for text in recorded), "the record holds what the model was told"


def test_loading_a_damaged_session_says_which_field_and_keeps_the_current_one(tmp_path, home):
    from miniswe.errors import TrajectoryError

    chat = session(tmp_path, [SUBMIT])
    try:
        chat.turn("the current one")
        folder = home / "sessions"
        data = json.loads((folder / "autosave.traj.json").read_text())
        (folder / "typed.traj.json").write_text(json.dumps({**data, "steps": "x"}))
        (folder / "cut.traj.json").write_text(json.dumps(data)[:100])
        with pytest.raises(TrajectoryError) as typed:
            chat.load("typed")
        assert str(typed.value) == (f"{folder / 'typed.traj.json'}: steps: expected a list, got a string; the file "
                                    "is damaged or not a miniswe trajectory")
        with pytest.raises(TrajectoryError, match="cut.traj.json: not valid JSON"):
            chat.load("cut")
        assert chat.trajectory.task == "the current one" and len(chat.trajectory.steps) == 1
        assert {s.id: bool(s.damaged) for s in store.list_sessions()} == {"autosave": False, "typed": True, "cut": True}
    finally:
        chat.close()
