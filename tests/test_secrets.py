"""No secret value reaches a recorded file or the output: planted secrets, found by commands in every way a
command can find them, are grepped for in everything a run or a batch leaves behind."""

from __future__ import annotations

import json
import pathlib

import yaml

from conftest import SUBMIT, act
from replies import SUBMIT_MARKER

KEY = "sk-planted-model-key-0001"
TOKEN = "ghp_planted_env_token_0002"
PARAM = "planted-param-secret-0003"
RUNARG = "planted-run-arg-secret-0004"
PLANTED = (KEY, TOKEN, PARAM, RUNARG)
# what a command that goes looking finds: every environment on the machine it can read, and its own
FIND_ALL = "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep -a planted | sort -u; env | grep -a planted"


def leaks(tmp_path: pathlib.Path, *texts: str) -> list[str]:
    """Where any planted value shows up: files under tmp_path (tests' own inputs aside) and the given texts."""
    found = []
    for path in tmp_path.rglob("*"):
        if path.is_file() and path.name not in ("replies.json", "tasks.yaml"):
            content = path.read_bytes().decode("utf-8", "replace")
            found += [f"{path.relative_to(tmp_path)}: {secret}" for secret in PLANTED if secret in content]
    for index, text in enumerate(texts):
        found += [f"output {index}: {secret}" for secret in PLANTED if secret in text]
    return found


SECRET_FLAGS = [
    "-c", f"environment.env={{GITHUB_TOKEN: {TOKEN}, MODE: fast}}",
    "-c", 'environment.env.API_KEY="a b"',
    "-c", f"model.params.api_key={PARAM}",
    "-c", f"model.params.extra={{authToken: {RUNARG}}}",
]


def test_a_run_records_and_prints_no_secret(cli, server, tmp_path):
    server.push(act(FIND_ALL), act(f"echo {SUBMIT_MARKER}; {FIND_ALL}; echo $GITHUB_TOKEN"))
    result = cli("run", "x", "--base-url", server.base_url, "-m", "m", "-o", "t.json", *SECRET_FLAGS,
                 env={"OPENAI_API_KEY": KEY})
    assert result.returncode == 0, result.stderr
    data = json.loads((tmp_path / "t.json").read_text())
    found = data["steps"][0]["output"]
    assert "GITHUB_TOKEN=***" in found and "***" in data["submission"], "the commands did find the secrets"
    assert server.requests[1]["headers"]["authorization"] == f"Bearer {KEY}", "the key itself is still sent"
    assert all(secret not in json.dumps(request["body"]) for request in server.requests for secret in PLANTED[:2])
    assert leaks(tmp_path, result.stdout, result.stderr) == []
    assert "API_KEY is shorter than 8 characters" in result.stderr, "a secret too short to mask is named at start"
    assert data["config"]["environment"]["env"] == {"GITHUB_TOKEN": "***", "MODE": "fast", "API_KEY": "***"}


def test_a_batch_records_and_prints_no_secret(cli, server, tmp_path):
    tasks = [
        {"id": "finds", "task": "t", "setup": "echo setting up with $GITHUB_TOKEN", "eval": "true",
         "env": {"env": {"DEPLOY_PASSWORD": TOKEN}}},
        {"id": "setup-fails", "task": "t", "setup": "echo failing with $GITHUB_TOKEN >&2; exit 3"},
    ]
    (tmp_path / "tasks.yaml").write_text(yaml.safe_dump(tasks))
    server.push(act(FIND_ALL), act(f"echo {SUBMIT_MARKER}; {FIND_ALL}"))
    result = cli("batch", "tasks.yaml", "-o", "run", "--base-url", server.base_url, "-m", "m", *SECRET_FLAGS,
                 "-c", f"environment.env.TOKEN_TWO={RUNARG}", env={"OPENAI_API_KEY": KEY})
    assert result.returncode == 3, result.stderr
    records = {json.loads(line)["id"]: json.loads(line) for line in (tmp_path / "run" / "results.jsonl").read_text().splitlines()}
    assert records["setup-fails"]["exit_status"] == "SetupError" and "***" in records["setup-fails"]["exit_detail"]
    assert "***" in records["finds"]["submission"]
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert "GITHUB_TOKEN: " in run["command"] and "TOKEN_TWO=***" in run["command"] and TOKEN not in run["command"]
    assert leaks(tmp_path, result.stdout, result.stderr) == []


def test_a_key_found_by_a_command_never_reaches_the_model(cli, server, tmp_path):
    (tmp_path / ".env").write_text(f"OPENAI_API_KEY={KEY}\n")
    server.push(act("cat .env"), SUBMIT)
    result = cli("run", "x", "--base-url", server.base_url, "-m", "m", "-o", "t.json", env={"OPENAI_API_KEY": KEY})
    assert result.returncode == 0, result.stderr
    assert KEY not in json.dumps(server.requests[1]["body"]) and "OPENAI_API_KEY=***" in json.dumps(server.requests[1]["body"])
    assert leaks(tmp_path, result.stdout, result.stderr) == [".env: " + KEY]


def test_the_debug_log_shows_each_exchange_with_secrets_masked_and_stays_out_of_the_record(cli, server, tmp_path):
    server.push(act(FIND_ALL), act(f"echo {SUBMIT_MARKER}"))
    result = cli("run", "fix the bug", "--base-url", server.base_url, "-m", "m", "-o", "t.json", "--debug",
                 *SECRET_FLAGS, env={"OPENAI_API_KEY": KEY})
    assert result.returncode == 0, result.stderr
    log = result.stderr
    for call in (1, 2):
        assert f"call {call} request {server.base_url}/chat/completions" in log
        assert f"call {call} response {server.base_url}/chat/completions after" in log
    assert '"content": "fix the bug"' in log or "fix the bug" in log, "the request's messages are shown"
    assert '"finish_reason"' in log, "the response is shown whole"
    assert '"api_key": "***"' in log, "a secret sent in the body is masked in the log"
    assert leaks(tmp_path, result.stdout, result.stderr) == []
    assert "miniswe debug" not in (tmp_path / "t.json").read_text()


def test_the_debug_log_goes_to_a_file_for_a_batch_and_names_failures(cli, server, tmp_path):
    (tmp_path / "tasks.yaml").write_text(yaml.safe_dump([{"id": "a", "task": "t"}]))
    server.push({"status": 401})
    result = cli("batch", "tasks.yaml", "-o", "run", "--base-url", server.base_url, "-m", "m",
                 env={"OPENAI_API_KEY": KEY, "MINISWE_DEBUG": str(tmp_path / "debug.log")})
    assert result.returncode == 3, result.stderr
    log = (tmp_path / "debug.log").read_text()
    assert f"call 1 request {server.base_url}/chat/completions" in log
    assert "call 1 failure" in log and "401" in log
    assert "miniswe debug" not in result.stderr, "the log went to the file, not the terminal"
    assert leaks(tmp_path, result.stdout, result.stderr) == []
