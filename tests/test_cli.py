"""`miniswe run` as a user runs it: a real subprocess against a scripted server on 127.0.0.1."""

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT, SUBMIT, act, clean_env, miniswe_cmd, missing, pids_alive, python_cmd
from waiting import wait_for

SENTINEL = "sk-sentinel-9f8e7d6c5b4a"


def endpoint(server):
    return ["--base-url", server.base_url, "-m", "test-model"]


def traj(tmp_path):
    return json.loads((tmp_path / "t.json").read_text())


def test_submitted_run_exits_0_and_shows_each_step(cli, server, tmp_path):
    server.push(act("echo hello-from-step-one", "THOUGHT: say hello"), SUBMIT)
    result = cli("run", "Say hello", *endpoint(server), "-o", "t.json")
    assert result.returncode == 0, result.stderr
    # the steps are progress (stderr); the final line is the run's data (stdout)
    assert "say hello" in result.stderr and "hello-from-step-one" in result.stderr and "rc=0" in result.stderr
    final, = result.stdout.strip().splitlines()
    assert final.startswith("Submitted · 2 steps") and final.endswith("t.json")
    data = traj(tmp_path)
    assert data["exit_status"] == "Submitted" and data["submission"] == "the patch"
    body = server.requests[0]["body"]
    assert body["model"] == "test-model" and body["temperature"] == 0.0
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert "Say hello" in body["messages"][1]["content"]
    assert server.requests[0]["headers"]["user-agent"].startswith("miniswe/")


def test_quiet_prints_only_the_final_line(cli, server):
    server.push(SUBMIT)
    result = cli("run", "x", *endpoint(server), "-q", "-o", "t.json")
    assert result.returncode == 0
    assert result.stdout.count("\n") == 1 and result.stdout.startswith("Submitted")


def test_not_submitted_exits_1(cli, server, tmp_path):
    server.push(act("true"), act("true"))
    result = cli("run", "x", *endpoint(server), "--step-limit", "2", "-o", "t.json")
    assert result.returncode == 1
    assert traj(tmp_path)["exit_status"] == "LimitsExceeded"
    assert "step_limit" in result.stderr


def test_api_key_is_sent_but_never_recorded_or_printed(cli, server, tmp_path):
    (tmp_path / ".env").write_text(f"OPENAI_API_KEY={SENTINEL}\n")
    server.push(act("echo key-is-${#OPENAI_API_KEY}-chars"), act("cat .env"),
                {"status": 401, "body": {"error": {"message": f"Incorrect API key provided: {SENTINEL}"}}})
    result = cli("run", "x", *endpoint(server), "-o", "t.json", env={"OPENAI_API_KEY": SENTINEL})
    assert server.requests[0]["headers"]["authorization"] == f"Bearer {SENTINEL}"
    steps = traj(tmp_path)["steps"]
    assert steps[0]["output"] == "key-is-0-chars\n", "commands must not inherit the API key"
    assert steps[1]["output"] == "OPENAI_API_KEY=***\n", "a key found on disk is masked before the model sees it"
    assert all(SENTINEL not in json.dumps(r["body"]) for r in server.requests)
    assert result.returncode == 3
    assert "401" in result.stderr and "set OPENAI_API_KEY" in result.stderr
    for text in (result.stdout, result.stderr, (tmp_path / "t.json").read_text()):
        assert SENTINEL not in text
    assert traj(tmp_path)["exit_status"] == "ModelError"


def test_a_connection_never_made_is_retried_after_the_backoff_not_the_call_timeout(cli, tmp_path):
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    held = socket.create_connection(listener.getsockname())  # fills the backlog: later connections hang
    try:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
        started = time.monotonic()
        result = cli("run", "x", "--base-url", url, "-m", "m", "-o", "t.json", "-c", "model.connect_timeout=0.3",
                     "-c", "model.timeout=30", "-c", "model.retries=1", "-c", "model.max_backoff=0.1")
        took = time.monotonic() - started
    finally:
        held.close()
        listener.close()
    assert result.returncode == 3, result.stderr
    assert "no connection within 0.3s; retry 1 of 1 in 0.1s" in result.stderr
    assert took < 15  # not a wait of the call's 30 s: the server never had the request


@pytest.mark.parametrize(("url", "fix"), [("http:///v1", "check --base-url")])
def test_an_unusable_url_is_one_line(cli, url, fix):
    result = cli("run", "x", "--base-url", url, "-m", "m", "-o", "t.json")
    assert result.returncode == 3 and result.stderr.count("\n") == 1 and fix in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr


def test_a_key_read_with_its_line_break_is_sent_without_it_and_a_broken_key_is_named(cli, server, tmp_path):
    key = "sk-test-0123456789abcdef"
    server.push(SUBMIT)
    assert cli("run", "x", *endpoint(server), "-o", "t.json", env={"OPENAI_API_KEY": key + "\n"}).returncode == 0
    assert server.requests[0]["headers"]["authorization"] == f"Bearer {key}"
    broken = cli("run", "x", *endpoint(server), "-o", "t.json", env={"OPENAI_API_KEY": key + "\nsk-other-key"})
    assert broken.returncode == 3 and len(server.requests) == 1
    assert broken.stderr.strip().endswith("$OPENAI_API_KEY holds a line break or another control character; set it "
                                          "to the key alone") and key not in broken.stderr


def test_a_gateways_cookie_goes_back_with_every_later_call(cli, server):
    # a sticky load balancer pins a conversation to one backend with a cookie, as a requests Session keeps it
    server.push({"content": act("true"), "headers": {"Set-Cookie": "backend=b7; Path=/"}}, act("true"), SUBMIT)
    assert cli("run", "x", *endpoint(server), "-o", "t.json").returncode == 0
    assert "cookie" not in server.requests[0]["headers"]
    assert [r["headers"]["cookie"] for r in server.requests[1:]] == ["backend=b7", "backend=b7"]
    assert all(r["headers"]["content-type"] == "application/json" for r in server.requests)


def test_a_model_param_json_cannot_hold_is_one_line_before_any_call(cli, server):
    result = cli("run", "x", *endpoint(server), "-o", "t.json", "-c", "model.params={seed: .nan}")
    assert result.returncode == 2 and server.requests == []
    assert result.stderr.strip() == ("miniswe: -c model.params={seed: .nan}: model.params.seed: expected a finite "
                                     "number, not nan (JSON has no form for it)")


def test_no_authorization_header_without_a_key(cli, server):
    server.push(SUBMIT)
    cli("run", "x", *endpoint(server), "-o", "t.json")
    assert "authorization" not in server.requests[0]["headers"]


def test_retries_transient_failures_then_succeeds(cli, server, tmp_path):
    server.push({"status": 500}, {"broken_json": True}, {"status": 429, "retry_after": 0}, SUBMIT)
    result = cli("run", "x", *endpoint(server), "-o", "t.json", "-c", "model.max_backoff=0.05")
    assert result.returncode == 0, result.stderr
    assert len(server.requests) == 4
    usage = traj(tmp_path)["usage"]
    assert usage["model_calls"] == 1 and usage["retries"] == 3


def test_unreadable_retry_after_is_still_a_retry(cli, server):
    server.push({"status": 429, "retry_after": "soon"}, {"status": 503, "retry_after": "Wed, 21 Oct 2015 07:28:00 GMT"}, SUBMIT)
    result = cli("run", "x", *endpoint(server), "-o", "t.json", "-c", "model.max_backoff=0.01", timeout=20)
    assert result.returncode == 0, result.stderr
    assert len(server.requests) == 3


def test_retry_after_is_honoured(cli, server):
    server.push({"status": 429, "retry_after": 1.5}, SUBMIT)
    started = time.monotonic()
    result = cli("run", "x", *endpoint(server), "-o", "t.json", "-c", "model.max_backoff=0.05")
    assert result.returncode == 0
    assert len(server.requests) == 2
    assert time.monotonic() - started >= 1.5, "retried before Retry-After elapsed"


def test_backoff_with_its_jitter_never_waits_past_max_backoff(cli, server):
    server.push(*[{"status": 503}] * 5, SUBMIT)
    result = cli("run", "x", *endpoint(server), "-o", "t.json", "-c", "model.max_backoff=0.3")
    assert result.returncode == 0, result.stderr
    waits = [float(w) for w in re.findall(r"retry \d+ of \d+ in ([\d.]+)s", result.stdout + result.stderr)]
    assert len(waits) == 5 and max(waits) <= 0.3, waits


def test_gives_up_after_the_configured_retries(cli, server, tmp_path):
    server.push(*[{"status": 503}] * 3)
    result = cli("run", "x", *endpoint(server), "-o", "t.json", "-c", "model.retries=2", "-c", "model.max_backoff=0.01")
    assert result.returncode == 3
    assert len(server.requests) == 3
    assert "503" in result.stderr and "gave up after 3 attempts" in result.stderr
    data = traj(tmp_path)
    assert data["exit_status"] == "ModelError" and data["usage"]["retries"] == 2 and data["messages"]


def test_read_timeout_is_retried(cli, server):
    server.push({"stall": 2, "content": "late"}, SUBMIT)
    result = cli("run", "x", *endpoint(server), "-o", "t.json", "-c", "model.timeout=0.5", "-c", "model.max_backoff=0.01")
    assert result.returncode == 0, result.stderr


def test_unreachable_endpoint_is_one_line_exit_3(cli, tmp_path):
    result = cli("run", "x", "--base-url", "http://127.0.0.1:9/v1", "-m", "m", "-o", "t.json",
                 "-c", "model.retries=1", "-c", "model.max_backoff=0.01")
    assert result.returncode == 3
    retry, final = result.stderr.strip().splitlines()
    assert "connection refused; retry 1 of 1 in" in retry, "the user is told why nothing happens"
    assert final.startswith("miniswe: ModelError: cannot reach http://127.0.0.1:9/v1/chat/completions")
    assert traj(tmp_path)["exit_status"] == "ModelError"


def test_reasoning_content_is_recorded(cli, server, tmp_path):
    server.push({"content": SUBMIT, "reasoning_content": "let me think"})
    cli("run", "x", *endpoint(server), "-o", "t.json")
    assert traj(tmp_path)["steps"][0]["reasoning"] == "let me think"
    assert all("reasoning" not in m for m in server.requests[0]["body"]["messages"])


def test_cost_from_endpoint_and_from_prices(cli, server, tmp_path):
    server.push({"content": act("true"), "cost": 0.25}, {"content": SUBMIT, "usage": {"prompt_tokens": 1000, "completion_tokens": 100, "total_tokens": 1100}})
    cli("run", "x", *endpoint(server), "-o", "t.json", "-c", "model.prices={prompt: 2, completion: 10}")
    assert traj(tmp_path)["usage"]["cost"] == pytest.approx(0.25 + (1000 * 2 + 100 * 10) / 1e6)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "x"], "no model endpoint configured: pass --base-url URL"),
        (["run", "x", "--base-url", "http://127.0.0.1:9/v1"], "no model name: pass -m MODEL"),
        (["run", "--base-url", "http://h/v1", "-m", "m"], "no task given"),
        (["run", "x", "-c", "agent.step_limt=3"], "agent.step_limt: unknown key (did you mean 'step_limit'?)"),
        (["run", "x", "-c", "missing.yaml"], "missing.yaml: config file not found"),
        (["run", "--task-file", "nope.txt"], "--task-file nope.txt: No such file or directory"),
    ],
    ids=["no endpoint", "no model", "no task", "config typo", "missing config file", "missing task file"],
)
def test_bad_input_is_one_line_exit_2(cli, args, message):
    result = cli(*args)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert "Traceback" not in result.stderr


def test_endpoint_from_environment_variables(cli, server):
    server.push(SUBMIT)
    result = cli("run", "x", "-o", "t.json", env={"OPENAI_BASE_URL": server.base_url, "MINISWE_MODEL": "env-model"})
    assert result.returncode == 0, result.stderr
    assert server.requests[0]["body"]["model"] == "env-model"


def test_task_file_and_cwd(cli, server, tmp_path):
    (tmp_path / "task.md").write_text("Task from a file")
    (tmp_path / "work").mkdir()
    server.push(act("pwd"), SUBMIT)
    result = cli("run", "--task-file", "task.md", "--cwd", "work", *endpoint(server), "-o", "t.json")
    assert result.returncode == 0
    data = traj(tmp_path)
    assert data["task"] == "Task from a file" and data["steps"][0]["output"] == f"{tmp_path / 'work'}\n"


def start_run_args(server, tmp_path, *extra):
    return miniswe_cmd("run", "x", *endpoint(server), "-o", "t.json", *extra)


def start_run(server, tmp_path, *extra):
    return subprocess.Popen(start_run_args(server, tmp_path, *extra), cwd=tmp_path, env=clean_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_steps(tmp_path, count, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if len(traj(tmp_path)["steps"]) >= count:
                return
        except (FileNotFoundError, ValueError):
            pass
        time.sleep(0.02)
    raise AssertionError(f"no {count} steps within {timeout}s")


def test_kill_9_mid_run_leaves_a_valid_trajectory(server, tmp_path):
    server.latency = 0.05
    server.push(*[act(f"echo step {i}") for i in range(200)])
    proc = start_run(server, tmp_path)
    wait_for_steps(tmp_path, 5)
    proc.kill()
    proc.wait()
    data = traj(tmp_path)  # must parse
    assert data["exit_status"] is None
    assert len(data["steps"]) >= 5
    assert [s["step"] for s in data["steps"]] == list(range(1, len(data["steps"]) + 1))
    assert data["steps"][4]["output"] == "echo step 4\n".removeprefix("echo ")


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_signals_end_the_run_as_interrupted(server, tmp_path, sig, code):
    pids = tmp_path / "pids"
    server.push(act("echo first"), act(f"echo partial; setsid sleep 60 & echo $! > {pids}; wait"), SUBMIT)
    proc = start_run(server, tmp_path)
    wait_for_steps(tmp_path, 1)
    wait_for(lambda: pids.exists() and pids.read_text().strip())
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == code, err
    data = traj(tmp_path)
    assert data["exit_status"] == "Interrupted" and data["exit_detail"] == sig.name
    cut = data["steps"][-1]
    assert cut["aborted"] == sig.name and cut["returncode"] is None and cut["output"] == "partial\n"
    assert pids_alive([int(pids.read_text())]) == [], "the command's processes outlived the run"


def test_a_signal_while_the_model_thinks_ends_the_run_at_once(server, tmp_path):
    server.push(act("echo first"), {"stall": 30, "content": SUBMIT})
    proc = start_run(server, tmp_path)
    wait_for_steps(tmp_path, 1)
    wait_for(lambda: len(server.requests) == 2)
    signalled = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == 130 and time.monotonic() - signalled < 3, err
    data = traj(tmp_path)
    assert data["exit_status"] == "Interrupted" and data["exit_detail"] == "SIGINT" and len(data["steps"]) == 1


def test_kill_9_of_a_run_leaves_no_command_running(server, tmp_path):
    pids = tmp_path / "pids"
    server.push(act(f"setsid sleep 61 & echo $! >> {pids}; echo $$ >> {pids}; sleep 62"))
    proc = start_run(server, tmp_path)
    wait_for(lambda: pids.exists() and len(pids.read_text().split()) == 2)
    started = [int(pid) for pid in pids.read_text().split()]
    proc.kill()
    proc.communicate(timeout=10)
    wait_for(lambda: not pids_alive(started), timeout=3)
    assert traj(tmp_path)["exit_status"] is None, "kill -9: nothing could record an end"


def test_nohup_keeps_a_run_going_when_its_terminal_hangs_up(server, tmp_path):
    server.push(act("sleep 1"), SUBMIT)
    proc = subprocess.Popen(["nohup", *start_run_args(server, tmp_path)], cwd=tmp_path, env=clean_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: len(server.requests) == 1)
    proc.send_signal(signal.SIGHUP)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert traj(tmp_path)["exit_status"] == "Submitted"


def test_python_dash_m_help():
    result = subprocess.run(miniswe_cmd("--help"), capture_output=True, text=True, env=clean_env(), cwd=ROOT)
    assert result.returncode == 0 and "run" in result.stdout


def test_help_imports_no_heavy_module():
    code = (
        "import sys\nsys.argv = ['miniswe', '--help']\nfrom miniswe.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print('LOADED', sorted(m for m in ('requests', 'jinja2', 'yaml', 'ray', 'pydantic') if m in sys.modules))\n"
    )
    result = subprocess.run([*miniswe_cmd()[:1], "-c", code], capture_output=True, text=True, env=clean_env(), cwd=ROOT)
    assert "LOADED []" in result.stdout, result.stdout[-300:]


def _help(cache, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(miniswe_cmd(*args, "--help"), capture_output=True, text=True, cwd=ROOT,
                          env=clean_env(XDG_CACHE_HOME=str(cache), **env))


def test_help_is_answered_from_the_cache_without_importing_typer(tmp_path):
    first = _help(tmp_path, "run")
    assert first.returncode == 0 and "--resume" in first.stdout, first.stderr
    main = os.path.join(ROOT, "miniswe", "__main__.py")  # what `python -m miniswe` has as argv[0]
    code = (f"import sys\nsys.argv = [{main!r}, 'run', '--help']\nfrom miniswe.__main__ import main\nmain()\n"
            "print('TYPER', 'typer' in sys.modules, file=sys.stderr)\n")
    again = subprocess.run(python_cmd(code), capture_output=True, text=True, cwd=ROOT,
                           env=clean_env(XDG_CACHE_HOME=str(tmp_path)))
    assert "TYPER False" in again.stderr, again.stderr
    assert again.stdout == first.stdout
    assert _help(tmp_path, "run").stdout == first.stdout


def test_help_cache_follows_the_terminal_width_and_the_code(tmp_path):
    narrow, wide = _help(tmp_path / "a", "batch", COLUMNS="60"), _help(tmp_path / "a", "batch", COLUMNS="100")
    assert narrow.stdout != wide.stdout
    assert _help(tmp_path / "a", "batch", COLUMNS="60").stdout == narrow.stdout == _help(tmp_path / "b", "batch", COLUMNS="60").stdout
    # a cached text made under another key (other code, another width) is never printed, and is replaced
    [path] = (tmp_path / "a" / "miniswe" / "help").iterdir()  # one file per command asked: the newest key wins
    key = path.read_text().split("\n", 1)[0]
    path.write_text("('another version of the code', " + key[1:] + "\nSTALE HELP\n")
    again = _help(tmp_path / "a", "batch", COLUMNS="60")
    assert "STALE" not in again.stdout and again.stdout == narrow.stdout
    assert "STALE" not in path.read_text()


def test_help_with_stdout_closed_or_a_dangling_link_in_the_package_is_still_help(tmp_path):
    closed = subprocess.run(f"{shlex.join(miniswe_cmd('run', '--help'))} >&-", shell=True, capture_output=True,
                            text=True, cwd=ROOT, env=clean_env(XDG_CACHE_HOME=str(tmp_path)))
    assert closed.returncode == 0 and "Traceback" not in closed.stderr, closed.stderr
    # an editor's lock file (a link to nothing) inside the package: help is typer's, uncached, not a traceback
    copy = tmp_path / "copy"
    shutil.copytree(ROOT / "miniswe", copy / "miniswe", ignore=shutil.ignore_patterns("__pycache__"))
    for folder in ("config", "templates"):
        shutil.copytree(ROOT / folder, copy / folder)
    (copy / "miniswe" / ".#cli.py").symlink_to("root@host.1234")
    result = subprocess.run([sys.executable, "-m", "miniswe", "--help"], capture_output=True, text=True,
                            cwd=copy, env={**clean_env(XDG_CACHE_HOME=str(tmp_path / "c")), "PYTHONPATH": str(copy)})
    assert result.returncode == 0 and result.stdout.startswith("Usage:"), result.stderr


def test_the_template_cache_is_used_only_when_private_and_a_full_disk_only_costs_a_compile(tmp_path):
    run = ("import resource, sys\nif sys.argv[1] == 'full': resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))\n"
           "from miniswe.templates import Renderer\nRenderer()\nprint('ready')\n")
    def renderer(cache, how: str = "") -> None:
        result = subprocess.run([sys.executable, "-c", run, how], capture_output=True, text=True, cwd=ROOT,
                                env=clean_env(XDG_CACHE_HOME=str(cache)))
        assert result.stdout == "ready\n", result.stderr

    shared = tmp_path / "shared"
    renderer(shared)
    [folder] = (shared / "miniswe" / "templates").iterdir()
    assert folder.stat().st_mode & 0o777 == 0o700 and any(folder.iterdir())
    for cached in folder.iterdir():
        cached.unlink()
    folder.chmod(0o777)  # anyone may write here now: nothing is read from it, or written
    renderer(shared)
    assert not any(folder.iterdir())
    renderer(tmp_path / "full", "full")  # every write fails: the templates are compiled, not cached
    assert not [p for p in (tmp_path / "full").rglob("*") if p.is_file() and p.stat().st_size]


def test_help_after_a_task_is_not_kept_and_a_fifo_in_the_cache_does_not_block(tmp_path):
    assert _help(tmp_path, "run", "my-task-sk-0123456789abcdef").returncode == 0
    assert not (tmp_path / "miniswe" / "help").exists()  # a word that may be a task's text stays off the disk
    assert _help(tmp_path, "batch").returncode == 0
    [cached] = (tmp_path / "miniswe" / "help").iterdir()
    cached.unlink()
    os.mkfifo(cached)  # nothing writes it: reading it would wait for ever
    result = subprocess.run(miniswe_cmd("batch", "--help"), capture_output=True, text=True, cwd=ROOT, timeout=30,
                            env=clean_env(XDG_CACHE_HOME=str(tmp_path)))
    assert result.returncode == 0 and result.stdout.startswith("Usage:"), result.stderr


def test_cached_help_into_a_closed_pipe_is_quiet(tmp_path):
    _help(tmp_path)
    result = subprocess.run(f"{shlex.join(miniswe_cmd('--help'))} | head -1", shell=True, capture_output=True, text=True,
                            cwd=ROOT, env=clean_env(XDG_CACHE_HOME=str(tmp_path)))
    assert result.returncode == 0 and result.stdout.startswith("Usage:") and not result.stderr


def _batch_in_process(args: list[str], prelude: str = "") -> str:
    """`miniswe batch ARGS` in a fresh interpreter; what it printed, then whether it imported ray."""
    return (
        f"import sys\n{prelude}sys.argv = ['miniswe', 'batch', *{args!r}]\nfrom miniswe.cli import main\n"
        "try:\n    main()\nexcept SystemExit as exit:\n    print('EXIT', exit.code)\n"
        "print('RAY', 'ray' in sys.modules)\n"
    )


def test_the_thread_executor_never_imports_ray(tmp_path, server):
    server.push(SUBMIT)
    (tmp_path / "tasks.yaml").write_text("- {id: a, task: x}\n")
    code = _batch_in_process(["tasks.yaml", "-o", "run", "-q", *endpoint(server)])
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(), cwd=tmp_path)
    assert "EXIT 0" in result.stdout and "RAY False" in result.stdout, result.stdout + result.stderr


def test_executor_ray_without_ray_says_how_to_install_it(tmp_path, server):
    (tmp_path / "tasks.yaml").write_text("- {id: a, task: x}\n")
    code = _batch_in_process(["tasks.yaml", "-o", "run", "--executor", "ray", *endpoint(server)],
                             prelude="sys.modules['ray'] = None  # as if it were not installed\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(), cwd=tmp_path)
    assert "EXIT 2" in result.stdout, result.stdout + result.stderr
    assert result.stderr == "miniswe: --executor ray needs Ray, which is not installed here: pip install -e '.[ray]' in the miniswe checkout\n"
    assert not (tmp_path / "run").exists() and not server.requests


# --executor ray asks for Ray before it reads the rest
NEEDS_RAY = pytest.mark.skipif(missing("ray", "MINISWE_REQUIRE_RAY"), reason="ray is not installed (pip install -e '.[ray]')")


@pytest.mark.parametrize(("args", "message"), [
    (["--executor", "dask"], "--executor 'dask': expected threads or ray"),
    (["--ray-address", "127.0.0.1:6379"], "--ray-address needs --executor ray"),
    pytest.param(["--executor", "ray", "--ray-resources", "docker"], "--ray-resources 'docker': expected NAME=AMOUNT",
                 marks=NEEDS_RAY),
    pytest.param(["--executor", "ray", "--ray-resources", "CPU=-1"], "--ray-resources 'CPU=-1': expected NAME=AMOUNT",
                 marks=NEEDS_RAY),
], ids=["unknown-executor", "address-without-ray", "resource-without-amount", "negative-amount"])
def test_bad_executor_options_run_nothing(cli, tmp_path, server, args, message):
    (tmp_path / "tasks.yaml").write_text("- {id: a, task: x}\n")
    result = cli("batch", "tasks.yaml", "-o", "run", *endpoint(server), *args)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert not (tmp_path / "run").exists()


def test_404_names_the_base_url_fix(cli, server):
    server.push({"status": 404, "body": {"error": {"message": "The model `nope` does not exist"}}})
    result = cli("run", "x", *endpoint(server), "-o", "t.json")
    assert result.returncode == 3 and len(server.requests) == 1, "a 404 must not be retried"
    assert "does not exist" in result.stderr and "check --base-url" in result.stderr


def test_template_with_an_unknown_variable_fails_before_anything_runs(cli, server, tmp_path):
    (tmp_path / "tpl").mkdir()
    (tmp_path / "tpl" / "observation.j2").write_text("{{ output }} {{ exit_code }}")
    server.push(SUBMIT)
    result = cli("run", "x", *endpoint(server), "-o", "t.json", "-c", f"agent.templates_dir={tmp_path / 'tpl'}")
    assert result.returncode == 2
    assert "observation.j2: unknown template variable 'exit_code'" in result.stderr
    assert server.requests == [] and not (tmp_path / "t.json").exists()


def test_a_user_template_overrides_the_shipped_one(cli, server, tmp_path):
    (tmp_path / "tpl").mkdir()
    (tmp_path / "tpl" / "observation.j2").write_text("RC={{ returncode }} OUT={{ output }}")
    server.push(act("echo hi"), SUBMIT)
    cli("run", "x", *endpoint(server), "-o", "t.json", "-c", f"agent.templates_dir={tmp_path / 'tpl'}")
    assert server.requests[1]["body"]["messages"][-1]["content"] == "RC=0 OUT=hi"


def test_an_edited_template_is_used_not_its_compiled_copy(cli, server, tmp_path):
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}  # compiled templates are kept here between runs
    template = tmp_path / "tpl" / "observation.j2"
    template.parent.mkdir()
    args = ("run", "x", *endpoint(server), "-o", "t.json", "-c", f"agent.templates_dir={template.parent}")
    for text, shown in (("RC={{ returncode }}", "RC=0"), ("OUT={{ output }}", "OUT=hi")):
        template.write_text(text)
        server.push(act("echo hi"), SUBMIT)
        assert cli(*args, env=env).returncode == 0
        assert server.requests[-1]["body"]["messages"][-1]["content"] == shown
    template.write_text("{{ output }} {{ exit_code }}")
    result = cli(*args, env=env)
    assert result.returncode == 2 and "unknown template variable 'exit_code'" in result.stderr
    assert any((tmp_path / "cache" / "miniswe" / "templates").iterdir())


def test_zero_timeouts_mean_no_timeout(cli, server, tmp_path):
    server.push(act("sleep 0.2; echo done"), SUBMIT)
    result = cli("run", "x", *endpoint(server), "-o", "t.json", "-c", "environment.timeout=0", "-c", "model.timeout=0")
    assert result.returncode == 0, result.stderr
    assert traj(tmp_path)["steps"][0]["output"] == "done\n"


def test_docker_settings_are_checked_before_anything_runs(cli, server, tmp_path):
    result = cli("run", "x", *endpoint(server), "--env", "docker", "-o", "t.json")
    assert result.returncode == 2 and "environment.image: no image given" in result.stderr
    assert server.requests == [] and not (tmp_path / "t.json").exists()


def test_output_path_that_is_a_directory(cli, server, tmp_path):
    (tmp_path / "out").mkdir()
    result = cli("run", "x", *endpoint(server), "-o", "out")
    assert result.returncode == 2 and "-o out: is a directory" in result.stderr


def test_odd_reply_shapes_are_retried_or_read_not_crashed_on(cli, server, tmp_path):
    bad_message = {"body": {"choices": [{"message": "just a string", "finish_reason": "stop"}]}}
    odd_usage = {"body": {"choices": [{"message": {"role": "assistant", "content": [{"type": "text", "text": act("echo parts")}]},
                                       "finish_reason": "stop"}], "usage": {"total_tokens": "lots", "cost": "free"}}}
    server.push(bad_message, odd_usage, SUBMIT)
    result = cli("run", "x", *endpoint(server), "-o", "t.json", "-c", "model.max_backoff=0.01")
    assert result.returncode == 0, result.stderr
    data = traj(tmp_path)
    assert data["steps"][0]["output"] == "parts\n" and data["usage"]["retries"] == 1


# ---------------------------------------------------------------- every wait is bounded


def test_a_stalled_endpoint_is_bounded_by_the_time_limit(cli, server, tmp_path):
    server.push({"stall": 30, "content": SUBMIT})
    started = time.monotonic()
    result = cli("run", "x", *endpoint(server), "-o", "t.json", "--time-limit", "2")
    assert time.monotonic() - started < 6
    assert result.returncode == 1, result.stderr
    data = traj(tmp_path)
    assert data["exit_status"] == "TimeExceeded" and "during a model call" in data["exit_detail"]


def test_a_retry_after_beyond_the_time_limit_ends_the_run_at_once(cli, server, tmp_path):
    server.push({"status": 429, "retry_after": 100000}, SUBMIT)
    started = time.monotonic()
    result = cli("run", "x", *endpoint(server), "-o", "t.json", "--time-limit", "3")
    assert time.monotonic() - started < 3
    assert result.returncode == 1, result.stderr
    data = traj(tmp_path)
    assert data["exit_status"] == "TimeExceeded" and "429" in data["exit_detail"] and len(server.requests) == 1


def test_an_answer_trickling_in_is_bounded_as_a_whole(cli, server, tmp_path):
    server.push({"trickle": 0.2, "content": SUBMIT}, SUBMIT)
    started = time.monotonic()
    result = cli("run", "x", *endpoint(server), "-o", "t.json", "-c", "model.timeout=2", "-c", "model.max_backoff=0.01")
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started < 8, "each byte came in time, the whole answer did not"
    assert traj(tmp_path)["usage"]["retries"] == 1 and "no complete answer within 2s" in result.stderr


def test_an_answer_cut_mid_body_is_retried(cli, server, tmp_path):
    server.push({"cut_at": 13, "content": SUBMIT}, SUBMIT)
    result = cli("run", "x", *endpoint(server), "-o", "t.json", "-c", "model.max_backoff=0.01")
    assert result.returncode == 0, result.stderr
    assert traj(tmp_path)["usage"]["retries"] == 1


def test_absurd_usage_figures_count_as_zero_with_one_warning(cli, server, tmp_path):
    absurd = {"usage": {"total_tokens": -1e6, "prompt_tokens": 1e300, "completion_tokens": 5}, "cost": -5}
    server.push({"content": act("true"), **absurd}, {"content": act("true"), **absurd},
                {"content": act("true"), "usage": {"total_tokens": 600}}, SUBMIT)
    result = cli("run", "x", *endpoint(server), "-o", "t.json", "--token-limit", "500")
    data = traj(tmp_path)
    assert data["exit_status"] == "LimitsExceeded" and data["usage"]["cost"] == 0 and data["usage"]["model_calls"] == 3
    assert data["usage"]["total_tokens"] == 5 + 5 + 600, "refused figures count as 0; a total falls back to its parts"
    assert len(data["warnings"]) == 1 and "total_tokens=-1000000.0" in data["warnings"][0]
    assert result.stderr.count("unusable usage figures") == 1


# ---------------------------------------------------------------- failures are one line with the documented code


@pytest.mark.skipif(os.getuid() != 0 or not shutil.which("unshare"), reason="needs root to mount a tiny file system")
@pytest.mark.parametrize("mount", ["size=64k", "ro"], ids=["disk-full-mid-run", "read-only"])
def test_a_trajectory_that_cannot_be_saved_is_one_line_and_exit_3(server, tmp_path, mount):
    server.push(act("echo one"), act("seq 1 100000"), *[act("true")] * 5)
    disk = tmp_path / "disk"
    disk.mkdir()
    script = (f"mount -t tmpfs -o {mount} tmpfs {disk} && cd {tmp_path} && "
              f"exec {shlex.join(miniswe_cmd('run', 'x', *endpoint(server), '-q', '-o', str(disk / 't.json')))}")
    result = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, env=clean_env(),
                            timeout=60)
    assert result.returncode == 3, result.stderr
    assert result.stderr.startswith("miniswe: cannot save the trajectory") and len(result.stderr.splitlines()) == 1
    assert "free some space or make its folder writable" in result.stderr


def test_a_trajectory_path_through_a_file_is_one_line_and_exit_3(cli, server, tmp_path):
    (tmp_path / "notes.txt").write_text("a file, not a folder\n")
    server.push(SUBMIT)
    result = cli("run", "x", *endpoint(server), "-o", "notes.txt/t.json")
    assert result.returncode == 3 and result.stderr.startswith("miniswe: cannot save the trajectory"), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and server.requests == []


@pytest.mark.parametrize(("args", "message"), [
    (["-c", "model.prices.prompt=x"], "-c model.prices.prompt=x: model.prices.prompt: expected a number"),
    (["-c", "protocol.submit_marker="], "protocol.submit_marker: must not be empty"),
    (["-c", "protocol.action_tags="], "protocol.action_tags: must not be empty"),
    (["-c", "environment.timeout=1.0e+10"], "environment.timeout: 1e+10 is too large"),
    (["--cwd", "/nonexistent/dir"], "--cwd /nonexistent/dir: no such directory"),
], ids=["price-not-a-number", "empty-marker", "no-action-tags", "huge-timeout", "missing-cwd"])
def test_dangerous_or_broken_settings_are_refused_before_anything_runs(cli, server, tmp_path, args, message):
    result = cli("run", "x", *endpoint(server), "-o", "t.json", *args)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().startswith("miniswe: ") and message in result.stderr and len(result.stderr.splitlines()) == 1
    assert server.requests == [] and not (tmp_path / "t.json").exists()


def test_template_problems_are_refused_before_anything_runs(cli, server, tmp_path):
    templates = tmp_path / "templates"
    templates.mkdir()
    (templates / "instance.j2").write_text("{{ task }} in {{ instance.repo }}\n")
    missing = cli("run", "x", *endpoint(server), "-o", "t.json", "-c", f"agent.templates_dir={templates}")
    assert missing.returncode == 2 and "instance.j2" in missing.stderr and "repo" in missing.stderr
    (templates / "instance.j2").write_bytes(b"{{ task }} \xff\xfe\n")
    latin = cli("run", "x", *endpoint(server), "-o", "t.json", "-c", f"agent.templates_dir={templates}")
    assert latin.returncode == 2 and "not UTF-8" in latin.stderr and len(latin.stderr.splitlines()) == 1
    assert server.requests == []


def test_odd_content_parts_are_read_not_crashed_on(cli, server, tmp_path):
    parts = {"body": {"choices": [{"message": {"role": "assistant", "content": [{"text": 5}, {"text": act("echo ok")}, "x"]},
                                   "finish_reason": "stop"}]}}
    server.push(parts, SUBMIT)
    result = cli("run", "x", *endpoint(server), "-o", "t.json")
    assert result.returncode == 0, result.stderr
    assert traj(tmp_path)["steps"][0]["output"] == "ok\n"


def test_a_submission_larger_than_the_capture_is_refused_not_cut(cli, server, tmp_path):
    server.push(act("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; seq 1 300000"))
    result = cli("run", "x", *endpoint(server), "-o", "t.json", "-c", "environment.capture_limit=100000")
    assert result.returncode == 1, result.stderr
    data = traj(tmp_path)
    assert data["exit_status"] == "LimitsExceeded" and data["submission"] is None
    assert "environment.capture_limit" in data["exit_detail"]
    server.push(act("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; seq 1 300000"))
    whole = cli("run", "x", *endpoint(server), "-o", "t2.json", "-c", "environment.capture_limit=0")
    assert whole.returncode == 0, whole.stderr
    assert json.loads((tmp_path / "t2.json").read_text())["submission"] == "".join(f"{i}\n" for i in range(1, 300001))


def test_escape_sequences_from_the_model_a_command_or_the_server_never_reach_the_terminal(cli, server, tmp_path):
    """A reply, an output or an error message may hold ESC sequences (clear the screen, retitle the window, write
    the clipboard): shown as visible symbols, recorded as they were."""
    server.push(act("printf 'a\\033[2Jb\\033]0;pwned\\007c\\n'", thought="THOUGHT: \x1b[31mred\x1b[0m"),
                {"status": 400, "body": {"error": {"message": "bad \x1b]52;c;Y2xpcA==\x07 request"}}})
    result = cli("run", "x", "--base-url", server.base_url, "-m", "m", "-o", "t.json")
    assert result.returncode == 3, result.stderr
    assert "\x1b" not in result.stderr + result.stdout and "\x07" not in result.stderr + result.stdout
    assert "a␛[2Jb␛]0;pwned␇c" in result.stderr and "␛[31mred" in result.stderr and "bad ␛]52;c;" in result.stderr
    data = json.loads((tmp_path / "t.json").read_text())
    assert data["steps"][0]["output"] == "a\x1b[2Jb\x1b]0;pwned\x07c\n", "the record keeps the bytes"


def test_an_output_path_that_is_not_a_regular_file_is_refused_and_left_alone(cli, server, tmp_path):
    import stat

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    result = cli("run", "x", "--base-url", server.base_url, "-m", "m", "-o", str(fifo), timeout=30)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if str(fifo) in line]
    assert len(lines) == 1 and "not a regular file" in lines[0], result.stderr
    assert stat.S_ISFIFO(os.stat(fifo).st_mode), "the FIFO is still there"
    assert server.requests == [], "nothing ran"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".pipe")] == [], "no temporary file left"


def test_atomic_writes_never_replace_what_is_not_a_regular_file(tmp_path):
    import stat

    from miniswe.atomic import SwapFile, write_atomic

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for write in (lambda: write_atomic(str(fifo), "x"), lambda: SwapFile(str(fifo)).write("x")):
        with pytest.raises(OSError, match="not a regular file"):
            write()
        assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    write_atomic(str(tmp_path / "plain"), "ok")
    write_atomic(str(tmp_path / "plain"), "again")
    assert (tmp_path / "plain").read_text() == "again"
