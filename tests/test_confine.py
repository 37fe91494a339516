"""policy.confine, run for real: a confined command writes, chmods, chowns and touches only its working
directory, /tmp and /dev/shm; /dev/null and multiprocessing's semaphores still work; nothing it runs makes the
read-only mounts writable again. Everything outside is a folder this test makes and removes."""

import os
import shutil
import subprocess
import sys
import uuid

import pytest

from miniswe.environments.local import SPAWNER, LocalConfig, LocalEnvironment
from miniswe.environments.spawner import landlock_abi

pytestmark = pytest.mark.skipif(sys.platform != "linux" or landlock_abi() < 1, reason="needs Linux Landlock")


def guard_works(cwd) -> bool:
    return subprocess.run([sys.executable, "-I", "-S", SPAWNER, "--probe"], cwd=cwd).returncode == 0


@pytest.fixture
def outside():
    """A folder outside the working directory, /tmp and /dev/shm, holding one file with a known mode and time."""
    folder = f"/var/tmp/miniswe-confine-{uuid.uuid4().hex[:8]}"
    os.makedirs(folder)
    target = os.path.join(folder, "f")
    with open(target, "w") as handle:
        handle.write("x")
    os.chmod(target, 0o644)
    os.utime(target, (1_000_000_000, 1_000_000_000))
    yield target
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def confined(tmp_path):
    env = LocalEnvironment(LocalConfig(cwd=str(tmp_path)), confine=True)
    yield env
    env.close()


def run(env, command: str) -> str:
    return env.execute(command, timeout=20).output


def test_metadata_outside_the_working_directory_is_not_changed(confined, outside, tmp_path):
    if not guard_works(tmp_path):
        pytest.skip("this kernel refuses unprivileged user namespaces: only writes are confined (docs/security.md)")
    before = os.stat(outside)
    for command in (f"chmod 777 {outside}", f"chmod -R a+w {os.path.dirname(outside)}", f"touch -d 2001-01-01 {outside}",
                    f"touch -m {outside}", f"chown $(id -u):$(id -g) {outside}", f"chgrp $(id -g) {outside}",
                    f"python3 -c 'import os; os.utime(\"{outside}\")'", f"python3 -c 'import os; os.chmod(\"{outside}\", 0o600)'",
                    f"echo y > {outside}", f"mkdir {outside}.d", f"ln -s x {outside}.l", f"mv {outside} {outside}.moved"):
        output = run(confined, f"{command}; echo rc=$?")
        assert "rc=0" not in output, f"{command!r} went through: {output}"
    after = os.stat(outside)
    assert (after.st_mode, after.st_mtime, after.st_uid, after.st_gid) == \
        (before.st_mode, before.st_mtime, before.st_uid, before.st_gid)
    assert sorted(os.listdir(os.path.dirname(outside))) == ["f"]
    assert open(outside).read() == "x"


def test_inside_the_working_directory_tmp_and_dev_shm_everything_works(confined, tmp_path):
    name = f"miniswe-confine-{uuid.uuid4().hex[:8]}"
    script = (f"echo hi > a && chmod 755 a && touch -d 2001-01-01 a && chown $(id -u) a && mkdir -p d/e && ln -s a l"
              f" && stat -c '%a %Y' a"
              f" && echo t > /tmp/{name} && chmod 600 /tmp/{name} && rm /tmp/{name}"
              f" && echo s > /dev/shm/{name} && chmod 600 /dev/shm/{name} && rm /dev/shm/{name}"
              f" && echo gone > /dev/null && echo ok")
    assert run(confined, script) == "755 978307200\nok\n"
    assert (tmp_path / "a").read_text() == "hi\n" and (tmp_path / "d" / "e").is_dir()
    lock = "import multiprocessing as m; l = m.Lock(); l.acquire(); l.release(); print('locked')"
    assert run(confined, f"python3 -c \"{lock}\"") == "locked\n"


def test_nothing_a_command_runs_makes_the_outside_writable_again(confined, outside, tmp_path):
    if not guard_works(tmp_path):
        pytest.skip("this kernel refuses unprivileged user namespaces")
    folder = os.path.dirname(outside)
    attempts = [
        "mount -o remount,rw /", f"mount -o remount,rw,bind {folder}", f"mount --bind {tmp_path} {folder}",
        f"umount -l {tmp_path}", f"unshare -Urm sh -c 'mount -o remount,rw / && chmod 777 {outside}'",
        f"unshare -Urm sh -c 'mount -o remount,rw,bind {folder} && chmod 777 {outside}'",
        f"unshare -Urm sh -c 'mount --bind {tmp_path} {folder}' && chmod 777 {outside}",
        f"nsenter -t 1 -m -U chmod 777 {outside}", f"nsenter -t 1 -m chmod 777 {outside}",
    ]
    for command in attempts:
        run(confined, command)
    assert os.stat(outside).st_mode & 0o777 == 0o644
    assert run(confined, "touch still-writable && echo ok") == "ok\n", "the working directory stays writable"


def confined_by_hand(cwd, command: str, setup: str) -> subprocess.CompletedProcess:
    """`command` started as the spawner starts it, after `setup` (Python) changed the spawner module."""
    script = (f"import subprocess, sys; sys.path.insert(0, {os.path.dirname(SPAWNER)!r}); import spawner; {setup}; "
              f"r = subprocess.run(['bash', '-c', {command!r}], preexec_fn=spawner.confine); sys.exit(r.returncode)")
    return subprocess.run([sys.executable, "-I", "-S", "-c", script], cwd=cwd, capture_output=True, text=True)


def test_without_user_namespaces_writes_are_still_confined(tmp_path, outside):
    """Where the kernel refuses the namespaces, Landlock alone runs: writes outside are refused, metadata is
    not (docs/security.md says so)."""
    result = confined_by_hand(tmp_path, f"echo y > {outside}; echo rc=$? >&2; echo in > inside", "spawner._GUARD = False")
    assert "Permission denied" in result.stderr and "rc=1" in result.stderr
    assert open(outside).read() == "x" and (tmp_path / "inside").read_text() == "in\n"


def test_a_command_whose_namespace_cannot_be_made_does_not_run(tmp_path):
    """The probe said it works, then it failed for one command: that command must not run unconfined."""
    setup = ("spawner._GUARD = True; "
             "spawner.read_only_outside = lambda cwd: (_ for _ in ()).throw(OSError(1, 'unshare: refused'))")
    result = confined_by_hand(tmp_path, "echo ran > ran", setup)
    assert result.returncode == 126 and not (tmp_path / "ran").exists()
