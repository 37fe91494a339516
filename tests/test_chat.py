"""`miniswe chat`, driven in a real pseudo-terminal against the scripted server (the screen read through a
terminal emulator), and its session underneath, turn by turn."""

from __future__ import annotations

import json
import os
import re

import pytest

from conftest import SUBMIT, act, clean_env, miniswe_cmd

pytest.importorskip("pyte")  # the test extra installs both
pytest.importorskip("prompt_toolkit")
from terminal import Terminal  # noqa: E402

PROMPT = r"\[(confirm|yolo|human)\]>"


@pytest.fixture
def home(tmp_path):
    path = tmp_path / "home"
    path.mkdir()
    return path


@pytest.fixture
def work(tmp_path):
    path = tmp_path / "work"
    path.mkdir()
    return path


@pytest.fixture
def terminals():
    opened = []
    yield opened
    for term in opened:
        term.close()


def start(terminals, server, home, work, *args, rows=30, cols=100, **env):
    term = Terminal(miniswe_cmd("chat", "--base-url", server.base_url, "-m", "m", "--cwd", str(work), *args),
                    env=clean_env(MINISWE_HOME=str(home), TERM="xterm-256color", **env), cwd=str(work),
                    rows=rows, cols=cols)
    terminals.append(term)
    term.wait_prompt(PROMPT)
    return term


def say(term, text, *, prompts_before=None):
    term.wait_reading()  # typed earlier, the keys would meet the terminal's line discipline
    term.type(text)
    term.send("\r")


def autosave(home):
    return json.loads((home / "sessions" / "autosave.traj.json").read_text())


def test_confirm_yes_no_with_a_reason_and_edit(terminals, server, home, work):
    server.push(act("echo one > one.txt"), act("rm -rf precious"), act("echo three"), SUBMIT)
    (work / "precious").mkdir()
    term = start(terminals, server, home, work)
    say(term, "make some files")
    term.wait_for(r"\$ echo one > one.txt")
    term.wait_for("Run it")
    say(term, "y")
    term.wait_for(r"\$ rm -rf precious")
    term.wait_for("Run it", count=2)
    say(term, "n")
    term.wait_for("Why not")
    say(term, "keep that folder")
    term.wait_for(r"\$ echo three")
    term.wait_for("Run it", count=3)
    say(term, "e")
    term.wait_for(r"edit \(Ctrl\+J: new line, Enter: run\)> echo three")  # not "[e]dit" of the question before
    term.type(" && echo edited")  # the command is there to edit, the cursor at its end
    term.send("\r")
    term.wait_for("edited\n")
    term.wait_for("Run it", count=4)
    say(term, "y")
    term.wait_for("done \\(submitted\\)")
    term.wait_prompt(PROMPT)
    term.send(b"\x04")
    assert term.wait_exit() == 0
    assert (work / "one.txt").exists() and (work / "precious").exists()
    steps = autosave(home)["steps"]
    assert steps[1]["refused"] == "the person said no: keep that folder" and steps[1]["returncode"] is None
    assert steps[2]["proposed"] == "echo three" and steps[2]["command"] == "echo three && echo edited"
    assert steps[2]["output"] == "three\nedited\n"
    told = server.requests[2]["body"]["messages"][-1]["content"]
    assert "The command did not run: the person said no: keep that folder" in told


def test_ctrl_c_stops_the_running_step_and_the_session_goes_on(terminals, server, home, work):
    server.push(act("echo started; sleep 30"), act("echo again"), SUBMIT)
    term = start(terminals, server, home, work, "--mode", "yolo")
    say(term, "wait a while")
    term.wait_for(r"\$ echo started; sleep 30")
    term.pump(1.0)  # the command is running
    term.send(b"\x03")
    term.wait_for(r"aborted \(SIGINT\)", timeout=10)
    term.wait_for("Interrupted: SIGINT")
    term.wait_prompt(PROMPT)
    say(term, "go on")
    term.wait_for("again")
    term.wait_for(r"done \(submitted\)")
    term.wait_prompt(PROMPT)
    term.type("half a thought")
    term.send(b"\x03")  # a line with text: cleared, the prompt stays
    term.pump(0.5)
    assert re.fullmatch(PROMPT + r"\s*", term.cursor_line())
    term.send(b"\x03")  # an empty line: leave, after saving
    assert term.wait_exit() == 0
    data = autosave(home)
    first = data["steps"][0]
    assert first["aborted"] == "SIGINT" and first["output"] == "started\n" and first["returncode"] is None
    assert data["steps"][1]["output"] == "again\n"  # the environment still runs commands
    sent = server.requests[1]["body"]["messages"]
    assert "cut short (SIGINT)" in sent[-2]["content"] and "go on" in sent[-1]["content"]
    turns = data["session"]["turns"]
    assert [t["exit_status"] for t in turns] == ["Interrupted", "Submitted"]


def test_a_line_longer_than_the_terminal_wraps_without_overwriting_the_prompt(terminals, server, home, work):
    server.push(act("true"), SUBMIT)
    term = start(terminals, server, home, work, "--mode", "yolo", rows=12, cols=40)
    words = " ".join(f"w{i:02d}" for i in range(36))  # 143 characters: four rows of 40
    term.type(words)
    term.pump(0.5)
    full = "[yolo]> " + words
    rows = [full[i:i + 40].rstrip() for i in range(0, len(full), 40)]
    display = term.display()
    top = next(i for i, line in enumerate(display) if line.startswith("[yolo]> "))
    assert display[top:top + len(rows)] == rows
    term.resize(12, 60)  # a resized terminal redraws the line at the new width
    term.pump(0.5)
    display = term.display()
    rows = [full[i:i + 60].rstrip() for i in range(0, len(full), 60)]
    top = max(i for i, line in enumerate(display) if line.startswith("[yolo]> "))
    assert display[top:top + len(rows)] == rows
    term.send(b"\x0a")  # Ctrl+J: a second line in the same message
    term.type("and more")
    term.pump(0.3)
    assert term.cursor_line().endswith("and more") and term.cursor_line().startswith(".")
    term.send("\r")
    term.wait_for(r"done \(submitted\)")
    task = autosave(home)["task"]
    assert task == words + "\nand more"
    history = (home / "history").read_text()
    assert "w35" in history and "and more" in history


def test_save_then_load_in_a_new_process_and_replay_the_session(terminals, server, home, work, cli):
    server.push(act("echo hello > note.txt"), SUBMIT)
    term = start(terminals, server, home, work, "--mode", "yolo")
    say(term, "write a note")
    term.wait_for(r"done \(submitted\)")
    term.wait_prompt(PROMPT)
    say(term, "/save")
    term.wait_for(r"saved as (\d{8}-\d{6}\S*)")
    session_id = re.search(r"saved as (\d{8}-\d{6}\S*)", term.text())[1]
    term.wait_prompt(PROMPT)
    term.send(b"\x04")
    assert term.wait_exit() == 0

    server.push(act("cat note.txt"), SUBMIT)
    term = start(terminals, server, home, work, "--mode", "yolo")
    term.wait_for("/load autosave goes on with it")
    say(term, "/list")
    term.wait_for(session_id + r" .*messages .*write a note · Submitted")
    say(term, "/load " + session_id[:11])
    term.wait_for("loaded " + session_id)
    term.wait_prompt(PROMPT)
    say(term, "/cost")
    term.wait_for("last turn: none yet since /load")  # the loaded usage is the whole session's, no turn of this one
    say(term, "read it back")
    term.wait_for("hello")
    term.wait_for(r"done \(submitted\)")
    term.wait_prompt(PROMPT)
    term.send(b"\x04")
    assert term.wait_exit() == 0
    sent = server.requests[-2]["body"]["messages"]
    assert "write a note" in sent[1]["content"] and "read it back" in sent[-1]["content"] and len(sent) == 7
    data = autosave(home)
    assert data["session"]["id"] == session_id and data["resumes"][-1]["loaded_from"] == session_id
    assert [s["command"] for s in data["steps"]][-2] == "cat note.txt"
    (work / "note.txt").unlink()
    replayed = cli("replay", str(home / "sessions" / "autosave.traj.json"), "--cwd", str(work))
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr


def test_compact_then_go_on_from_the_summary(terminals, server, home, work):
    server.push(act("echo a"), SUBMIT, "We echoed a; nothing else is pending.", act("echo b"), SUBMIT)
    term = start(terminals, server, home, work, "--mode", "yolo")
    say(term, "first task")
    term.wait_for(r"done \(submitted\)")
    term.wait_prompt(PROMPT)
    say(term, "/compact")
    term.wait_for("compacted: the model now sees 3 messages instead of 6")
    say(term, "second task")
    term.wait_for(r"done \(submitted\)", count=2)
    sent = server.requests[3]["body"]["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "user"]
    assert sent[2]["content"] == "We echoed a; nothing else is pending." and "second task" in sent[3]["content"]
    term.wait_prompt(PROMPT)
    term.send(b"\x04")
    assert term.wait_exit() == 0
    data = autosave(home)
    assert len(data["messages"]) == 6 + 2 + 5  # the whole history stays in the file: turn, compaction, turn
    assert [t["kind"] for t in data["session"]["turns"]] == ["task", "compact", "task"]


def test_streamed_reasoning_and_text_appear_as_they_arrive_in_the_palette(terminals, server, home, work):
    server.push({"content": act("echo streamed"), "reasoning_content": "thinking it over", "piece": 2,
                 "event_delay": 0.01}, SUBMIT)
    term = start(terminals, server, home, work, "--mode", "yolo", "-c", "model.stream=true")
    say(term, "stream please")
    term.wait_for(r"done \(submitted\)")
    printed = term.text()
    assert re.search(r"--- reasoning ---\nthinking it over\n--- end of reasoning ---\nTHOUGHT: next\.", printed)
    assert "\x1b[36m--- reasoning ---" in term.raw.decode()  # cyan markers, dim reasoning
    assert "\x1b[2mth" in term.raw.decode()
    display = term.display()
    row = next(i for i, line in enumerate(display) if line.startswith("--- reasoning ---"))
    assert term.screen.buffer[row][0].fg == "cyan"
    assert autosave(home)["steps"][0]["reasoning"] == "thinking it over"


def test_no_colour_with_no_color_set(terminals, server, home, work):
    server.push(act("echo plain"), SUBMIT)
    term = start(terminals, server, home, work, "--mode", "yolo", NO_COLOR="1")
    say(term, "go")
    term.wait_for(r"done \(submitted\)")
    assert "\x1b[3" not in term.raw.decode() and "\x1b[2m" not in term.raw.decode()


def test_a_stalled_stream_is_retried_and_the_turn_goes_on(terminals, server, home, work):
    server.push({"content": act("echo x"), "reasoning_content": "hmm, let me see", "stall_after": 4},
                {"content": act("echo x"), "reasoning_content": "hmm, let me see"}, SUBMIT)
    term = start(terminals, server, home, work, "--mode", "yolo", "-c", "model.stream=true",
                 "-c", "model.stream_idle_timeout=1")
    say(term, "go")
    term.wait_for("the stream sent nothing for 1s; retry 1")
    term.wait_for(r"done \(submitted\)")
    assert re.search(r"--- reasoning ---\nhmm,[^\n]* \[cut off\]\nminiswe: .*retry 1", term.text())
    data = autosave(home)
    assert data["usage"]["retries"] == 1 and data["steps"][0]["reasoning"] == "hmm, let me see"


def test_human_mode_runs_what_the_person_types_and_the_model_sees_it(terminals, server, home, work):
    server.push(SUBMIT)
    term = start(terminals, server, home, work, "--mode", "human")
    say(term, "echo typed by me > mine.txt && echo ok")
    term.wait_for(r"rc=0")
    say(term, "/mode yolo")
    say(term, "submit now")
    term.wait_for(r"done \(submitted\)")
    assert (work / "mine.txt").exists() and len(server.requests) == 1
    sent = server.requests[0]["body"]["messages"]
    assert [m["role"] for m in sent] == ["system", "assistant", "user", "user"]
    assert "the person typed this command" in sent[1]["content"] and "ok" in sent[2]["content"]
    step = autosave(home)["steps"][0]
    assert step["command"] == "echo typed by me > mine.txt && echo ok" and step["usage"]["total_tokens"] == 0


def test_without_prompt_toolkit_readline_edits_and_says_how_to_get_it(terminals, server, home, work, tmp_path):
    hidden = tmp_path / "hidden" / "prompt_toolkit"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError('not installed here')\n")
    server.push(act("true"), SUBMIT)
    term = start(terminals, server, home, work, "--mode", "yolo", rows=12, cols=40,
                 PYTHONPATH=f"{hidden.parent}{os.pathsep}{clean_env()['PYTHONPATH']}")
    assert "pip install -e '.[chat]' in the miniswe checkout" in term.text()
    words = " ".join(f"w{i:02d}" for i in range(36))
    term.type(words)
    term.pump(0.5)
    full = "[yolo]> " + words
    rows = [full[i:i + 40].rstrip() for i in range(0, len(full), 40)]
    display = term.display()
    top = max(i for i, line in enumerate(display) if line.startswith("[yolo]> "))
    assert display[top:top + len(rows)] == rows  # the prompt's colour codes are not counted as columns
    term.send(b"\x0a")
    term.type("and more")
    term.send("\r")
    term.wait_for(r"done \(submitted\)")
    assert autosave(home)["task"] == words + "\nand more"
    term.wait_prompt(PROMPT)
    term.send(b"\x04")
    assert term.wait_exit() == 0


def test_sigterm_at_the_prompt_or_during_a_turn_leaves_after_saving(terminals, server, home, work):
    import signal
    import time

    term = start(terminals, server, home, work)
    os.write(term.fd, b"x")  # a key just before the signal: prompt_toolkit is redrawing when it comes
    os.kill(term.pid, signal.SIGHUP)
    assert term.wait_exit() == 129
    server.push(SUBMIT)
    term = start(terminals, server, home, work, "--mode", "yolo")
    say(term, "a turn to save")
    term.wait_for(r"done \(submitted\)")
    term.wait_prompt(PROMPT)
    os.write(term.fd, b"half")
    os.kill(term.pid, signal.SIGTERM)
    assert term.wait_exit() == 143
    assert "session autosaved" in term.text() and "Press ENTER" not in term.text()
    assert autosave(home)["session"]["turns"][0]["exit_status"] == "Submitted"
    server.push(act("echo working; sleep 30"))
    term = start(terminals, server, home, work, "--mode", "yolo")
    say(term, "work")
    term.wait_for(r"\$ echo working")
    term.pump(1.0)
    started = time.monotonic()
    os.kill(term.pid, signal.SIGTERM)
    assert term.wait_exit() == 143 and time.monotonic() - started < 10
    step = autosave(home)["steps"][0]
    assert step["aborted"] == "SIGTERM" and step["output"] == "working\n"


def test_ctrl_c_while_the_model_streams_or_thinks_cuts_the_call_and_the_session_goes_on(terminals, server, home, work):
    import time

    server.push({"content": act("echo never"), "reasoning_content": "let me think about this for a long while",
                 "stall_after": 6}, {"content": act("echo x"), "latency": 60}, SUBMIT)
    term = start(terminals, server, home, work, "--mode", "yolo", "-c", "model.stream=true")
    say(term, "think")
    term.wait_for("--- reasoning ---")
    term.pump(0.5)
    started = time.monotonic()
    term.send(b"\x03")  # mid-stream
    term.wait_for("Interrupted")
    term.wait_prompt(PROMPT)
    say(term, "think again")
    term.wait_for(r"\.\.\.requesting\.\.\.", count=2)
    term.pump(0.5)
    term.send(b"\x03")  # waiting for an answer that is slow to come
    term.wait_for("Interrupted", count=2)
    assert time.monotonic() - started < 15
    term.wait_prompt(PROMPT)
    say(term, "now submit")
    term.wait_for(r"done \(submitted\)")
    data = autosave(home)
    assert [t["exit_status"] for t in data["session"]["turns"]] == ["Interrupted", "Interrupted", "Submitted"]
    assert len(data["steps"]) == 1  # the cut calls left no step; the conversation went on


def test_escape_sequences_in_replies_and_outputs_are_shown_not_obeyed(terminals, server, home, work):
    server.push({"content": "THOUGHT: \x1b]0;retitled\x07 look.\n\n```bash\nprintf 'x\\033]52;c;Y2xpcA==\\007y\\n'\n```"},
                SUBMIT)
    term = start(terminals, server, home, work, "--mode", "yolo")
    say(term, "print something odd")
    term.wait_for(r"done \(submitted\)")
    assert b"\x1b]0;retitled" not in term.raw and b"\x1b]52;" not in term.raw, "no OSC sequence reached the terminal"
    assert "␛]0;retitled␇ look." in term.text() and "x␛]52;c;Y2xpcA==␇y" in term.text()
    term.wait_prompt(PROMPT)
    term.send(b"\x04")
    assert term.wait_exit() == 0


def test_a_streamed_secret_is_masked_across_the_pieces_it_arrives_in(terminals, server, home, work):
    key = "sk-live-MODELKEY-123456"
    server.push({"content": f"THOUGHT: your key is {key}, as asked.\n\n```bash\ntrue\n```",
                 "reasoning_content": f"they want {key} back", "piece": 3}, SUBMIT)
    term = start(terminals, server, home, work, "--mode", "yolo", "-c", "model.stream=true", OPENAI_API_KEY=key)
    say(term, "show me the key")
    term.wait_for(r"done \(submitted\)")
    term.wait_prompt(PROMPT)
    term.send(b"\x04")
    assert term.wait_exit() == 0
    assert key.encode() not in term.raw and key not in "\n".join(term.display())
    for part in (key[:9], key[9:17], key[17:]):  # no piece of it got through between colour codes either
        assert part.encode() not in term.raw
    printed = term.text()
    assert "they want *** back" in printed and "THOUGHT: your key is ***, as asked." in printed


def test_the_piece_masker_masks_a_secret_split_anywhere_and_holds_back_only_what_may_begin_one():
    from miniswe.output import PieceMasker
    from miniswe.redaction import Secrets

    secrets = Secrets()
    secrets.add("sk-live-MODELKEY-123456")
    text = "a key: sk-live-MODELKEY-123456; not one: sk-live-; ends with s"
    for size in range(1, len(text) + 1):
        masker = PieceMasker(secrets)
        shown = "".join(masker.feed(text[i:i + size]) for i in range(0, len(text), size)) + masker.flush()
        assert shown == "a key: ***; not one: sk-live-; ends with s", size
    masker = PieceMasker(secrets)
    assert masker.feed("plain words ") == "plain words " and masker.feed("and sk-l") == "and " and masker.held == "sk-l"


def test_lines_typed_during_a_turn_are_taken_one_at_a_time_after_it(terminals, server, home, work):
    # Enter pressed while a turn runs: /cost and /quit are two inputs, not newlines of one message to the model
    server.push({"content": act("echo done"), "latency": 1.5}, SUBMIT)
    term = start(terminals, server, home, work, "--mode", "yolo")
    say(term, "do it")
    term.wait_for(r"do it")
    term.send("/cost\r")
    term.send("/quit\r")
    term.wait_for(r"\$ echo done")
    term.wait_for(r"/cost  \(typed during the turn\)")
    term.wait_for(r"this session: 2 model calls")
    term.wait_for(r"/quit  \(typed during the turn\)")
    assert term.wait_exit() == 0, "a typed-ahead /quit leaves without another Enter"
    assert len(server.requests) == 2, "nothing typed ahead was sent to the model"
