"""The local environment with real processes: isolation per command, timeouts, floods, odd bytes."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from miniswe.environments.local import LocalConfig, LocalEnvironment
from miniswe.errors import SandboxError


@pytest.fixture
def env(tmp_path):
    return LocalEnvironment(LocalConfig(cwd=str(tmp_path), env={"GREETING": "hi there"}))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as handle:  # a zombie is dead for our purposes
        return handle.read().split(")")[-1].split()[0] != "Z"


def test_output_merged_in_order_with_returncode(env):
    result = env.execute("echo one; echo two >&2; echo three; exit 7", timeout=10)
    assert result.output == "one\ntwo\nthree\n"
    assert result.returncode == 7
    assert not result.timed_out


def test_bash_features_cwd_env_and_quiet_defaults(env, tmp_path):
    result = env.execute('echo $BASH_VERSION | cut -c1; pwd; echo "$GREETING"; echo $PAGER $GIT_PAGER; [[ -n x ]] && echo bash', timeout=10)
    lines = result.output.splitlines()
    assert lines[1] == str(tmp_path)
    assert lines[2:] == ["hi there", "cat cat", "bash"]


def test_each_command_gets_a_fresh_shell(env, tmp_path):
    (tmp_path / "sub").mkdir()
    env.execute("cd sub && export FOO=1", timeout=10)
    assert env.execute("pwd; echo ${FOO:-unset}", timeout=10).output == f"{tmp_path}\nunset\n"


def test_stdin_is_empty(env):
    result = env.execute("cat; echo done", timeout=5)
    assert result.output == "done\n" and not result.timed_out


def test_timeout_kills_the_whole_group_and_keeps_partial_output(env, tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    started = time.monotonic()
    result = env.execute(f"echo before; (sleep 300 & echo $! > {pidfile}; wait) ; sleep 300", timeout=1)
    assert time.monotonic() - started < 5
    assert result.timed_out and result.returncode is None
    assert result.output == "before\n"
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 2
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid), "grandchild survived the timeout"


def test_step_ends_when_shell_exits_even_if_a_background_child_holds_the_pipe(env, tmp_path):
    pidfile = tmp_path / "bg.pid"
    started = time.monotonic()
    result = env.execute(f"sleep 300 & echo $! > {pidfile}; echo started", timeout=30)
    assert time.monotonic() - started < 3
    assert result.output == "started\n" and result.returncode == 0 and not result.timed_out
    pid = int(pidfile.read_text())
    time.sleep(0.1)
    assert not alive(pid), "leftover background process was not killed"


def test_flood_is_bounded_in_memory_and_counted(tmp_path):
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {os.getcwd()!r})
        from miniswe.environments.local import LocalConfig, LocalEnvironment
        env = LocalEnvironment(LocalConfig(cwd={str(tmp_path)!r}, capture_limit=1_000_000))
        result = env.execute("yes", timeout=3)
        print(result.timed_out, result.output_chars, result.elided_chars, len(result.output))
        # VmHWM, not ru_maxrss: the latter keeps the parent's peak across vfork and exec
        print(next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")) // 1024)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=os.getcwd())
    flags, rss_mb = out.stdout.splitlines()
    timed_out, total, elided, kept = flags.split()
    assert timed_out == "True"
    assert int(total) > 50_000_000, "yes should have printed far more than the cap"
    assert int(elided) == int(total) - 1_000_000
    assert int(kept) < 1_001_000
    assert int(rss_mb) < 60, f"capture grew the process to {rss_mb} MB"


def test_non_utf8_bytes_are_replaced(env):
    result = env.execute(r"printf 'ok \xff\xfe end\n'", timeout=5)
    assert result.output == "ok \ufffd\ufffd end\n"


def test_missing_cwd_is_a_sandbox_error(tmp_path):
    with pytest.raises(SandboxError, match="not a directory"):
        LocalEnvironment(LocalConfig(cwd=str(tmp_path / "nope")))


def test_interrupt_during_a_command_kills_it(tmp_path):
    """Ctrl-C while a command runs must not leave the command behind."""
    pidfile = tmp_path / "child.pid"
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {os.getcwd()!r})
        from miniswe.environments.local import LocalConfig, LocalEnvironment
        env = LocalEnvironment(LocalConfig(cwd={str(tmp_path)!r}))
        print("ready", flush=True)
        try:
            env.execute("sleep 300 & echo $! > {pidfile}; wait", timeout=600)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"
    deadline = time.monotonic() + 5
    while not pidfile.exists() or not pidfile.read_text().strip():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    assert proc.stdout.readline() == "interrupted\n"
    proc.wait(timeout=5)
    time.sleep(0.1)
    assert not alive(int(pidfile.read_text()))


def test_an_escaped_process_that_keeps_printing_does_not_hold_the_step(env):
    started = time.monotonic()
    result = env.execute("setsid bash -c 'for i in $(seq 1 500); do echo tick; sleep 0.01; done' & sleep 0.2; echo started", timeout=30)
    assert time.monotonic() - started < 2
    assert result.returncode == 0 and "started" in result.output
