"""No secret value reaches a recorded file or the output: planted secrets, found by commands in every way a
command can find them, are grepped for in everything a run or a batch leaves behind."""

from __future__ import annotations

import json
import pathlib
import shlex

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


def test_every_trajectory_of_a_batch_masks_every_secret_the_batch_knows(cli, server, tmp_path):
    token_a, token_b = "npm_TASKSECRET_aaaa_0005", "npm_TASKSECRET_bbbb_0006"
    tasks = [{"id": "a", "task": "t", "env": {"env": {"NPM_TOKEN": token_a}}},
             {"id": "b", "task": "t", "env": {"env": {"NPM_TOKEN": token_b}}},
             {"id": "c", "task": "t"}]
    (tmp_path / "tasks.yaml").write_text(yaml.safe_dump(tasks))
    # every task's command finds both tokens (here in the task file; in the audit, in /proc/*/environ)
    finds = f"echo {SUBMIT_MARKER}; grep -a TASKSECRET {tmp_path / 'tasks.yaml'}; {FIND_ALL.replace('planted', 'TASKSECRET')}; true"
    server.push(act(finds), act(finds), act(finds))
    result = cli("batch", "tasks.yaml", "-o", "run", "-w", "2", "--base-url", server.base_url, "-m", "m",
                 env={"OPENAI_API_KEY": KEY})
    assert result.returncode == 0, result.stderr
    for task_id in "abc":
        text = (tmp_path / "run" / task_id / f"{task_id}.traj.json").read_text()
        data = json.loads(text)
        assert data["exit_status"] == "Submitted" and data["submission"].count("NPM_TOKEN: ***") == 2, task_id
        assert token_a not in text and token_b not in text, f"{task_id}'s trajectory holds another task's token"
    everything = "".join(p.read_text(errors="replace") for p in (tmp_path / "run").rglob("*") if p.is_file())
    assert token_a not in everything + result.stdout + result.stderr
    assert token_b not in everything + result.stdout + result.stderr


def test_secret_names_are_recognised_however_they_are_written_and_harmless_ones_are_not():
    from miniswe.redaction import secret_name

    secret = ["PGPASSWORD", "GITHUBTOKEN", "GH_PAT", "GITHUB_PAT", "OPENAIKEY", "SSH_PASSPHRASE", "SECRET_ENV",
              "GITLAB_TOKEN_ENV", "GITHUB_TOKEN", "apiKey", "api_key", "DB_PASSWORD", "DB_PASS", "authToken",
              "AUTHORIZATION", "OAUTH_TOKEN", "AWS_SECRET_ACCESS_KEY", "PRIVATE_KEY", "clientSecret",
              "GOOGLE_APPLICATION_CREDENTIALS", "HTTP_AUTH", "MYSQL_PWD", "SESSION_COOKIE", "npmAuth"]
    harmless = ["PATH", "PYTHONPATH", "KEYBOARD", "KEYBOARD_LAYOUT", "MONKEY", "max_tokens", "TOKENIZERS_PARALLELISM",
                "GIT_AUTHOR_NAME", "AUTHOR", "PWD", "OLDPWD", "HOME", "MODE", "temperature", "COMPAT", "BYPASS", "LANG"]
    assert [name for name in secret if not secret_name(name)] == []
    assert [name for name in harmless if secret_name(name)] == []


STRADDLING = "ghp_STRADDLINGxTHExCUTx0007"


def test_a_secret_the_capture_cut_goes_through_leaves_no_piece(cli, server, tmp_path):
    a, b = "head -c 995 /dev/zero | tr '\\0' a", "head -c 3000 /dev/zero | tr '\\0' b"
    # the head keeps 1000 bytes (995 a's and 5 of the token); the tail the last 1000 (10 of the token, then b's)
    server.push(act(f'{a}; printf %s "$GITHUB_TOKEN"; {b}; printf %s "$GITHUB_TOKEN"; head -c 990 /dev/zero | tr "\\0" c'),
                act(f"echo {SUBMIT_MARKER}"))
    result = cli("run", "x", "--base-url", server.base_url, "-m", "m", "-o", "t.json",
                 "-c", f"environment.env.GITHUB_TOKEN={STRADDLING}", "-c", "environment.capture_limit=2000",
                 env={"OPENAI_API_KEY": KEY})
    assert result.returncode == 0, result.stderr
    text = (tmp_path / "t.json").read_text()
    output = json.loads(text)["steps"][0]["output"]
    assert json.loads(text)["steps"][0]["elided_chars"] > 0, "the capture did cut the output"
    head, _, tail = output.partition("\n[...")
    assert head == "a" * 995 + "***", head[-20:]
    assert tail.split("]\n", 1)[1].startswith("***" + "c" * 990), tail[:80]
    pieces = [STRADDLING[i:i + 4] for i in range(len(STRADDLING) - 3)]  # none of the audit's 10 characters, or 4
    sent = json.dumps([request["body"] for request in server.requests])
    assert [piece for piece in pieces if piece in text or piece in sent] == []


def test_scrub_cut_masks_the_pieces_on_both_sides_of_a_cut():
    from miniswe.redaction import Secrets

    secrets = Secrets()
    secrets.add(STRADDLING)
    notice = "\n[... 7 bytes elided ...]\n"
    assert secrets.scrub_cut("xx" + STRADDLING[:6] + notice + STRADDLING[-9:] + "yy", notice) == "xx***" + notice + "***yy"
    assert secrets.scrub_cut("xx" + notice + "yy", notice) == "xx" + notice + "yy", "no piece: nothing changes"
    assert secrets.scrub_cut(STRADDLING + "zz", "") == "***zz"


SHORT_FLAGS = ["-cenvironment.env.API_KEY=xyz12", "-c", "environment={env: {PASSWORD: pw1}}",
               "--config=environment.env.DB_TOKEN=tk9", "--config", "model={params: {api_key: k2}}"]


def test_short_secrets_in_every_form_of_config_flag_are_masked_in_the_recorded_command_lines(cli, server, tmp_path):
    (tmp_path / "tasks.yaml").write_text(yaml.safe_dump([{"id": "a", "task": "t"}]))
    server.push(act(f"echo {SUBMIT_MARKER}"))
    result = cli("batch", "tasks.yaml", "-o", "run", "--base-url", server.base_url, "-m", "m", *SHORT_FLAGS,
                 env={"OPENAI_API_KEY": KEY})
    assert result.returncode == 0, result.stderr
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    report = (tmp_path / "run" / "report.md").read_text()
    commands = [run["command"], *(i["command"] for i in run.get("invocations", [])), report]
    for text in commands:
        for short in ("xyz12", "pw1", "tk9", "k2"):
            assert short not in text, (short, text)
    argv = shlex.split(run["command"])
    assert "-cenvironment.env.API_KEY=***" in argv and "--config=environment.env.DB_TOKEN=***" in argv
    assert "environment={env: {PASSWORD: '***'}}" in argv and "model={params: {api_key: '***'}}" in argv


def test_mask_command_line_knows_every_way_a_config_flag_is_written():
    from miniswe.redaction import mask_command_line

    assert mask_command_line(["-cenvironment.env.API_KEY=abc12", "-cagent.step_limit=3", "--config=model.params.api_key=x",
                              "-c", "environment={env: {PASSWORD: pw1, MODE: fast}, run_args: [-e, TOKEN=t1]}",
                              "-c", "model={name: gpt, api_key_env: MY_KEY}"]) == [
        "-cenvironment.env.API_KEY=***", "-cagent.step_limit=3", "--config=model.params.api_key=***",
        "-c", "environment={env: {MODE: fast, PASSWORD: '***'}, run_args: [-e, TOKEN=***]}",
        "-c", "model={name: gpt, api_key_env: MY_KEY}"]


def test_a_forked_run_takes_a_masked_model_param_back_from_the_environment_or_refuses(cli, server, tmp_path):
    server.push(act("echo one"), act(f"echo {SUBMIT_MARKER}"))
    first = cli("run", "x", "--base-url", server.base_url, "-m", "m", "-o", "t.json",
                "-c", f"model.params={{api_key: {PARAM}}}", env={"OPENAI_API_KEY": KEY})
    assert first.returncode == 0, first.stderr
    assert json.loads((tmp_path / "t.json").read_text())["config"]["model"]["params"] == {"api_key": "***"}
    refused = cli("run", "--fork", "t.json", "--from-step", "1", "-o", "f.json", "--force", env={"OPENAI_API_KEY": KEY})
    assert refused.returncode == 2, refused.stderr
    line = [text for text in refused.stderr.splitlines() if "API_KEY" in text]
    assert len(line) == 1 and "model.params.api_key" in line[0] and "set API_KEY" in line[0], refused.stderr
    assert not (tmp_path / "f.json").exists()
    calls = len(server.requests)
    server.push(act(f"echo {SUBMIT_MARKER}"))
    forked = cli("run", "--fork", "t.json", "--from-step", "1", "-o", "f.json", "--force",
                 env={"OPENAI_API_KEY": KEY, "API_KEY": PARAM})
    assert forked.returncode == 0, forked.stderr
    sent = server.requests[calls]["body"]
    assert sent.get("api_key") == PARAM and "***" not in json.dumps(sent.get("api_key")), "the real value is sent again"
    assert leaks(tmp_path, forked.stdout, forked.stderr) == []


def test_restore_secrets_takes_masked_values_back_in_every_mapping(monkeypatch):
    from miniswe.redaction import masked_left, restore_secrets

    monkeypatch.setenv("API_KEY", "from-env-1234")
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_from_env_5678")
    monkeypatch.delenv("ORG_SECRET", raising=False)
    data = restore_secrets({"model": {"params": {"api_key": "***", "extra": {"ORG_SECRET": "***"}}},
                            "environment": {"env": {"GITHUB_TOKEN": "***"}, "run_args": ["-e", "GITHUB_TOKEN=***"]}})
    assert data["model"]["params"]["api_key"] == "from-env-1234"
    assert data["environment"] == {"env": {"GITHUB_TOKEN": "ghp_from_env_5678"}, "run_args": ["-e", "GITHUB_TOKEN=ghp_from_env_5678"]}
    assert masked_left(data) == ("model.params.extra.ORG_SECRET", "ORG_SECRET")


# every way `docker run` reads an -e: the value each sets, as miniswe records it, and as restored from the environment
RUN_ARG_FORMS = [(["-e", "TOKEN=t1"], ["-e", "TOKEN=***"]), (["--env", "TOKEN=t1"], ["--env", "TOKEN=***"]),
                 (["-e=TOKEN=t1"], ["-e=TOKEN=***"]), (["--env=TOKEN=t1"], ["--env=TOKEN=***"]),
                 (["-eTOKEN=t1"], ["-eTOKEN=***"]), (["-Pe", "TOKEN=t1"], ["-Pe", "TOKEN=***"]),
                 (["-PeTOKEN=t1"], ["-PeTOKEN=***"]), (["-Pe=TOKEN=t1"], ["-Pe=TOKEN=***"]),
                 (["-Pqe", "TOKEN=t1"], ["-Pqe", "TOKEN=***"])]


def test_every_form_of_an_env_run_arg_is_masked_restored_and_accepted(monkeypatch):
    from miniswe.environments.runargs import read_run_args
    from miniswe.redaction import config_secrets, mask_run_args, restore_secrets

    monkeypatch.setenv("TOKEN", "from-env-1234")
    for written, recorded in RUN_ARG_FORMS:
        assert mask_run_args(written) == recorded
        assert restore_secrets({"environment": {"run_args": recorded}})["environment"]["run_args"] == [
            arg.replace("***", "from-env-1234") for arg in recorded]
        assert config_secrets({"environment": {"run_args": written}}).short == ["environment.run_args -e TOKEN"]
        assert read_run_args(written).env == {"TOKEN": "t1"}, "recorded masked, so runargs no longer refuses it"
    # a letter that takes a value takes the rest of the argument: no -e there
    assert mask_run_args(["-ve", "TOKEN=t1", "-we=TOKEN=t1"]) == ["-ve", "TOKEN=t1", "-we=TOKEN=t1"]


def test_a_variable_forwarded_by_an_env_run_arg_without_a_value_is_masked_as_forward_env_is(monkeypatch):
    from miniswe.config import load_config
    from miniswe.redaction import run_secrets

    monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
    monkeypatch.setenv("PLAIN_NAME", RUNARG)  # forwarded by name: a secret, whatever the name says
    for args in (["-e", "GITHUB_TOKEN", "--env=PLAIN_NAME"], ["--env", "GITHUB_TOKEN", "-ePLAIN_NAME"],
                 ["-Pe", "GITHUB_TOKEN", "-Pe=PLAIN_NAME"]):
        config = load_config({"environment": {"kind": "docker", "image": "x", "run_args": args}})
        secrets = run_secrets(config)
        assert secrets.scrub(f"GITHUB_TOKEN={TOKEN} PLAIN_NAME={RUNARG}") == "GITHUB_TOKEN=*** PLAIN_NAME=***", args


def test_a_docker_run_masks_what_an_env_run_arg_forwards(cli, server, tmp_path):
    from test_docker import IMAGE  # skips this test when no engine (or no test image) is reachable

    server.push(act("env | grep -a planted"), act(f"echo {SUBMIT_MARKER}"))
    result = cli("run", "x", "--base-url", server.base_url, "-m", "m", "-o", "t.json", "--image", IMAGE,
                 "-c", "environment.run_args=[-e, GITHUB_TOKEN, -ePARAM_HOLDER]",
                 env={"OPENAI_API_KEY": KEY, "GITHUB_TOKEN": TOKEN, "PARAM_HOLDER": PARAM})
    assert result.returncode == 0, result.stderr
    data = json.loads((tmp_path / "t.json").read_text())
    assert "GITHUB_TOKEN=***" in data["steps"][0]["output"] and "PARAM_HOLDER=***" in data["steps"][0]["output"]
    assert all(secret not in json.dumps(request["body"]) for request in server.requests for secret in PLANTED)
    assert leaks(tmp_path, result.stdout, result.stderr) == []


def test_the_models_key_forwarded_into_a_container_is_refused_unless_allowed(monkeypatch):
    import pytest

    from miniswe.errors import ConfigError
    from miniswe.redaction import check_forwarded_keys, forwarded_keys

    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.delenv("UNSET_KEY", raising=False)
    assert forwarded_keys(["OPENAI_API_KEY"], ["OPENAI_API_KEY"], ["-Pe", "OPENAI_API_KEY", "-e", "OPENAI_API_KEY=x"]) == [
        "environment.forward_env OPENAI_API_KEY", "environment.run_args -e OPENAI_API_KEY"]
    assert forwarded_keys(["UNSET_KEY"], ["UNSET_KEY"], ["-e", "UNSET_KEY"]) == [], "nothing to hand on"
    with pytest.raises(ConfigError) as refused:
        check_forwarded_keys(["OPENAI_API_KEY"], [], ["--env=OPENAI_API_KEY"], allow=False)
    assert "\n" not in str(refused.value) and "allow_unsafe_run_args" in str(refused.value)
    notice = check_forwarded_keys(["OPENAI_API_KEY"], ["OPENAI_API_KEY"], [], allow=True)
    assert notice and "\n" not in notice and KEY not in notice
    assert check_forwarded_keys(["OPENAI_API_KEY"], ["GITHUB_TOKEN"], ["-e", "A=b"], allow=False) is None


def test_a_run_that_would_hand_the_models_key_to_its_container_is_refused_before_anything_runs(cli, server, tmp_path):
    # every command in the container could read the key (and spend it outside any cost limit): refused at start
    result = cli("run", "x", "--base-url", server.base_url, "-m", "m", "-o", "t.json", "--image", "alpine",
                 "-c", "environment.run_args=[-e, OPENAI_API_KEY]", env={"OPENAI_API_KEY": KEY})
    assert result.returncode == 2 and not server.requests and not (tmp_path / "t.json").exists()
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "hands the model's key to the container" in lines[0] and KEY not in result.stderr
    assert "allow_unsafe_run_args" in lines[0], "the line says how to do it anyway"
