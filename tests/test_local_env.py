"""The local environment with real processes: isolation per command, timeouts, floods, odd bytes."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import pids_alive, python_cmd, read_line
from waiting import wait_for
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
    wait_for(lambda: not alive(pid), "the leftover background process killed", timeout=0.1)


def test_flood_is_bounded_in_memory_and_counted(tmp_path):
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {os.getcwd()!r})
        from miniswe.environments.local import LocalConfig, LocalEnvironment
        env = LocalEnvironment(LocalConfig(cwd={str(tmp_path)!r}, capture_limit=1_000_000))
        result = env.execute("yes", timeout=3)
        print(result.timed_out, result.output_chars, result.elided_chars, len(result.output))
        # VmHWM, not ru_maxrss: exec does not reset ru_maxrss, which still counts the forking test process
        print([int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM")][0] // 1024)
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
    proc = subprocess.Popen(python_cmd(script), stdout=subprocess.PIPE)
    assert read_line(proc.stdout) == "ready\n"
    deadline = time.monotonic() + 5
    while not pidfile.exists() or not pidfile.read_text().strip():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    assert read_line(proc.stdout) == "interrupted\n"
    proc.wait(timeout=5)
    wait_for(lambda: not alive(int(pidfile.read_text())), "the interrupted command killed", timeout=0.1)


def test_an_escaped_process_that_keeps_printing_does_not_hold_the_step(env):
    started = time.monotonic()
    result = env.execute("setsid bash -c 'for i in $(seq 1 500); do echo tick; sleep 0.01; done' & sleep 0.2; echo started", timeout=30)
    assert time.monotonic() - started < 2
    assert result.returncode == 0 and "started" in result.output


@pytest.mark.parametrize("detach", ["exec >/dev/null 2>&1", "exec 1>&- 2>&-"], ids=["redirected", "closed"])
def test_output_ending_early_does_not_end_the_wait_for_the_exit(env, detach):
    started = time.monotonic()
    result = env.execute(f"echo before; {detach}; sleep 20", timeout=1)
    assert time.monotonic() - started < 4, "the timeout still bounds a command whose output ended"
    assert result.timed_out and result.returncode is None and result.output == "before\n"


ESCAPES = {
    "job control": "set -m; sleep 300 & echo $! >> {pids}",
    "new session": "setsid sleep 300 & echo $! >> {pids}",
    "double fork": "(sleep 300 & echo $! >> {pids}) ",
    "nohup and disown": "nohup sleep 300 >/dev/null 2>&1 & echo $! >> {pids}; disown",
    # the pids file's path in its argv: pgrep finds this test's python, not another's on the machine
    "own group from python": "python3 -c 'import os, time; os.setpgid(0, 0); os.fork() or time.sleep(300)' {pids} & "
                             "sleep 0.3; pgrep -f 'time.sleep.300. {pids}' >> {pids}",
}


@pytest.mark.parametrize("escape", list(ESCAPES), ids=list(ESCAPES))
def test_nothing_a_command_started_outlives_its_step(env, tmp_path, escape):
    pids = tmp_path / "pids"
    result = env.execute(ESCAPES[escape].format(pids=pids) + "; echo started", timeout=10)
    assert result.returncode == 0 and "started" in result.output
    started = [int(pid) for pid in pids.read_text().split()]
    assert started, "the test's command recorded no pid"
    deadline = time.monotonic() + 2
    while pids_alive(started) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert pids_alive(started) == [], f"{escape}: still running after the step"


def test_kill_9_of_miniswe_leaves_no_command_running(tmp_path):
    pids = tmp_path / "pids"
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {os.getcwd()!r})
        from miniswe.environments.local import LocalConfig, LocalEnvironment
        env = LocalEnvironment(LocalConfig(cwd={str(tmp_path)!r}))
        print("ready", flush=True)
        env.execute("setsid sleep 301 & echo $! >> {pids}; set -m; sleep 302 & echo $! >> {pids}; "
                    "echo $$ >> {pids}; sleep 303", timeout=600)
        """
    )
    proc = subprocess.Popen(python_cmd(script), stdout=subprocess.PIPE)
    assert read_line(proc.stdout) == "ready\n"
    deadline = time.monotonic() + 10
    while len(pids.read_text().split() if pids.exists() else []) < 3:
        assert time.monotonic() < deadline, "the command did not start"
        time.sleep(0.02)
    started = [int(pid) for pid in pids.read_text().split()]
    assert len(pids_alive(started)) == 3
    proc.kill()
    proc.wait(timeout=10)
    deadline = time.monotonic() + 3
    while pids_alive(started) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert pids_alive(started) == [], "miniswe's death left its command's processes running"


def test_a_spawner_killed_from_outside_ends_the_step_as_a_sandbox_failure(env, tmp_path):
    import threading

    from miniswe.environments.spawner import children

    def kill_the_spawner():
        wait_for(lambda: (tmp_path / "started").exists(), "the command started")
        spawners = [pid for pid in children(os.getpid())
                    if "spawner.py" in open(f"/proc/{pid}/cmdline").read()]
        os.kill(spawners[-1], signal.SIGKILL)

    threading.Thread(target=kill_the_spawner).start()
    started = time.monotonic()
    result = env.execute("echo working; : > started; sleep 30", timeout=60)
    assert time.monotonic() - started < 5
    assert "spawner" in result.sandbox_error and "killed from outside" in result.sandbox_error
    assert result.output == "working\n" and result.returncode is None
    assert env.execute("echo fresh", timeout=10).output == "fresh\n", "a new spawner serves the next command"


def test_interrupt_from_another_thread_returns_the_partial_output(env, tmp_path):
    import threading

    def interrupt_once_started():
        wait_for(lambda: (tmp_path / "started").exists(), "the command started")
        env.interrupt()

    threading.Thread(target=interrupt_once_started).start()
    started = time.monotonic()
    result = env.execute("echo half; : > started; sleep 30; echo never", timeout=60)
    assert time.monotonic() - started < 5
    assert result.interrupted and result.returncode is None and result.output == "half\n"
    assert env.execute("echo next", timeout=10).output == "next\n", "an interrupt ends only the command it hit"


def test_capture_limit_0_keeps_everything(tmp_path):
    env = LocalEnvironment(LocalConfig(cwd=str(tmp_path), capture_limit=0))
    result = env.execute("head -c 3000000 /dev/zero | tr '\\0' x", timeout=30)
    assert result.output_chars == 3_000_000 and len(result.output) == 3_000_000 and result.elided_chars == 0


@pytest.mark.skipif(sys.platform != "linux", reason="Landlock is Linux's")
def test_confined_commands_write_only_in_their_folder_and_signal_nothing_outside(tmp_path):
    import uuid

    from miniswe.environments.spawner import landlock_abi

    if landlock_abi() < 1:
        pytest.skip("this kernel has no Landlock")
    outside = f"/var/tmp/miniswe-confine-{uuid.uuid4().hex[:8]}"
    os.makedirs(outside)
    try:
        env = LocalEnvironment(LocalConfig(cwd=str(tmp_path)), confine=True)
        assert env.execute("echo inside > in.txt && cat in.txt", timeout=10).output == "inside\n"
        refused = env.execute(f"echo escape > {outside}/out.txt; echo rc=$?", timeout=10)
        assert ("Permission denied" in refused.output or "Read-only file system" in refused.output) and "rc=1" in refused.output
        assert not os.path.exists(f"{outside}/out.txt")
        if landlock_abi() >= 6:
            assert "Operation not permitted" in env.execute(f"kill -0 {os.getpid()}", timeout=10).output
        env.close()
    finally:
        import shutil

        shutil.rmtree(outside, ignore_errors=True)


@pytest.mark.parametrize("proc_fs", [True, False], ids=["/proc", "no /proc (macOS)"])
def test_a_process_is_running_until_it_exits_a_zombie_or_a_reused_pid_is_not(monkeypatch, proc_fs):
    """What says whether a container's or a scratch folder's owner is still there: with /proc, a zombie has
    exited and a pid with another start time is another process; without, kill(pid, 0) is all there is."""
    from miniswe.environments import processes

    start = processes.process_start(os.getpid())
    if not proc_fs:
        real = os.path.exists
        monkeypatch.setattr(processes.os.path, "exists", lambda path: False if path.startswith("/proc") else real(path))
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert processes.running(child.pid)
        child.kill()
        wait_for(lambda: processes.process_start(child.pid) is None)  # a zombie now: not reaped until wait()
        assert processes.running(child.pid) is not proc_fs, "a zombie has exited (only /proc can tell)"
    finally:
        child.wait()
    assert not processes.running(child.pid)
    assert processes.running(os.getpid(), start)
    assert processes.running(os.getpid(), "1") is not proc_fs, "another start time: another process"
