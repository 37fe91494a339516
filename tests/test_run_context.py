"""What a run's context owns, seen from outside: where a resumed run works, and secrets a recording masked."""

import json

from replies import SUBMIT, act


def script(path, replies) -> str:
    path.write_text(json.dumps(replies))
    return str(path)


def test_a_relative_working_directory_is_the_same_when_the_run_is_resumed_from_elsewhere(cli, tmp_path):
    (tmp_path / "work").mkdir()
    (tmp_path / "elsewhere").mkdir()
    replies = tmp_path / "replies.json"
    # the script runs out after the first step: a ModelError, which a resume goes on from
    first = cli("run", "t", "--script", script(replies, [act("pwd")]), "--cwd", "work", "-o", "t.json", "-q")
    assert first.returncode == 3, first.stderr
    recorded = json.loads((tmp_path / "t.json").read_text())
    assert recorded["config"]["environment"]["cwd"] == str(tmp_path / "work")
    script(replies, [act("pwd"), act("pwd"), SUBMIT])
    resumed = cli("run", "--resume", "../t.json", "-q", cwd=tmp_path / "elsewhere")
    assert resumed.returncode == 0, resumed.stderr
    steps = json.loads((tmp_path / "t.json").read_text())["steps"]
    assert [step["output"] for step in steps[:2]] == [f"{tmp_path / 'work'}\n"] * 2


def test_replay_refuses_to_run_commands_with_a_masked_secret_as_its_value(cli, tmp_path):
    (tmp_path / "work").mkdir()
    done = cli("run", "t", "--script", script(tmp_path / "replies.json", [act("echo ${#API_TOKEN}"), SUBMIT]),
               "--cwd", "work", "-o", "t.json", "-q", "-c", "environment.env.API_TOKEN=s3cret-value-123")
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "t.json").read_text()
    assert "s3cret-value-123" not in text and json.loads(text)["steps"][0]["output"] == "16\n"
    refused = cli("replay", "t.json")
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines()[-1] == (
        "miniswe: environment.env.API_TOKEN: the recording masked this secret (***) and $API_TOKEN is not set; set "
        "API_TOKEN to its value (or pass -c environment.env.API_TOKEN=...) and run again")
    matched = cli("replay", "t.json", env={"API_TOKEN": "s3cret-value-123"})
    assert matched.returncode == 0, matched.stdout + matched.stderr
    assert "s3cret-value-123" not in matched.stdout + matched.stderr


def test_resume_refuses_a_masked_secret_before_anything_runs(cli, tmp_path):
    (tmp_path / "work").mkdir()
    replies = script(tmp_path / "replies.json", [act("echo ${#API_TOKEN} >> lengths")])
    first = cli("run", "t", "--script", replies, "--cwd", "work", "-o", "t.json", "-q",
                "-c", "environment.env.API_TOKEN=s3cret-value-123")
    assert first.returncode == 3, first.stderr  # the script ran out: a ModelError, which a resume goes on from
    before = (tmp_path / "t.json").read_bytes()
    script(tmp_path / "replies.json", [act("echo ${#API_TOKEN} >> lengths"), act("echo ${#API_TOKEN} >> lengths"), SUBMIT])
    refused = cli("run", "--resume", "t.json", "-q")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "environment.env.API_TOKEN: the recording masked this secret (***) and $API_TOKEN is not set" in refused.stderr
    assert (tmp_path / "t.json").read_bytes() == before and (tmp_path / "work" / "lengths").read_text() == "16\n"
    resumed = cli("run", "--resume", "t.json", "-q", env={"API_TOKEN": "s3cret-value-123"})
    assert resumed.returncode == 0, resumed.stderr
    assert (tmp_path / "work" / "lengths").read_text() == "16\n16\n", "the secret's value, not its mask"


def test_a_chat_sessions_replay_refuses_a_masked_secret_too(cli, tmp_path, monkeypatch):
    """A session records its config masked like a run; its replay once ran the commands with *** and matched."""
    from miniswe.chat import store
    from miniswe.chat.session import ChatSession
    from miniswe.config import load_config
    from miniswe.signals import Stop

    monkeypatch.setenv("MINISWE_HOME", str(tmp_path / "home"))
    (tmp_path / "work").mkdir()
    replies = script(tmp_path / "replies.json", [act("echo ${#API_TOKEN}"), SUBMIT])
    config = load_config("model.kind=scripted", f"model.script={replies}", f"environment.cwd={tmp_path / 'work'}",
                         "environment.env.API_TOKEN=s3cret-value-123")
    chat = ChatSession(config, stop=Stop(), mode="yolo")
    try:
        assert str(chat.turn("t").status) == "Submitted"
    finally:
        chat.close()
    session = store.autosave_path()
    assert json.loads(open(session).read())["config"]["environment"]["env"] == {"API_TOKEN": "***"}
    refused = cli("replay", session)
    assert (refused.returncode, refused.stdout) == (2, "")
    assert "environment.env.API_TOKEN: the recording masked this secret" in refused.stderr
    matched = cli("replay", session, "-q", env={"API_TOKEN": "s3cret-value-123"})
    assert matched.returncode == 0 and matched.stdout.startswith("matched: 2 command(s)"), matched.stdout
