"""environment.run_args read as the engine reads them (pflag), and nothing that reaches the host let through
without allow_unsafe_run_args: each refusal is one line naming the argument and the fix (exit 2)."""

from __future__ import annotations

import ctypes
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import clean_env, miniswe_cmd

from miniswe.environments.docker import DockerConfig, DockerEnvironment
from miniswe.environments.runargs import read_run_args
from miniswe.errors import ConfigError
from miniswe.redaction import mask_run_args
from miniswe.status import error_exit_code

SECRET = "sk-live-0123456789abcdef"
FIX = "; set environment.allow_unsafe_run_args: true if you mean it"
ROOT_BIND = "binds the host's root directory into the container: commands could read and change anything on this machine"
KERNEL = "binds the host's /proc or /sys into the container"
MEMORY = "gives commands raw access to the host's memory, consoles or input devices, beneath every file permission"
HOST_NET = "shares the host's network namespace: commands could reach every service listening on this machine"


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative paths are read from the working directory, as the engine's client does
    (tmp_path / "allow.json").write_text(json.dumps({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": []}))
    (tmp_path / "log.json").write_text(json.dumps({"defaultAction": "SCMP_ACT_LOG"}))
    (tmp_path / "strict.json").write_text(json.dumps({"defaultAction": "SCMP_ACT_ERRNO", "syscalls": []}))
    (tmp_path / "broken.json").write_text('{"defaultAction": ')
    (tmp_path / "rooted").symlink_to("/")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")


def refusal(run_args: list[str], **settings) -> str:
    with pytest.raises(ConfigError) as caught:
        DockerEnvironment.check(DockerConfig(image="any:1", run_args=run_args, **settings))
    message = str(caught.value)
    assert error_exit_code(caught.value) == 2 and "\n" not in message
    return message


# (run_args, what the user reads after "environment.run_args: ")
ATTACKS = [
    # grouped short flags: single-letter flags without value, ending in one with a value, attached or next
    (["-Pv/:/h"], f"-Pv/:/h {ROOT_BIND}{FIX}"),
    (["-Pv", "/:/h"], f"-Pv /:/h {ROOT_BIND}{FIX}"),
    (["-qv/:/h"], f"-qv/:/h {ROOT_BIND}{FIX}"),
    (["-Pqv=/:/h"], f"-Pqv=/:/h {ROOT_BIND}{FIX}"),
    (["-iv/:/h"], "-iv/:/h is set by miniswe (miniswe attaches stdin itself); remove it"),
    (["--volume=/:/h"], f"--volume=/:/h {ROOT_BIND}{FIX}"),
    (["-v", "./rooted:/h"], f"-v ./rooted:/h {ROOT_BIND}{FIX}"),  # a link to / in the working directory
    (["-v", "./loop:/h"], "-v ./loop:/h cannot be checked ("),  # every OSError: a refusal, never a traceback
    # --mount as the engines read it: docker takes the last type=, podman the first; csv quoting; keys in any case
    (["--mount", "type=volume,type=bind,src=/,dst=/h"], f"--mount type=volume,type=bind,src=/,dst=/h {ROOT_BIND}{FIX}"),
    (["--mount", "type=bind,src=/,type=volume,dst=/h"], f"--mount type=bind,src=/,type=volume,dst=/h {ROOT_BIND}{FIX}"),
    (["--mount", '"type=bind","source=/",dst=/h'], f'--mount "type=bind","source=/",dst=/h {ROOT_BIND}{FIX}'),
    (["--mount=Type=BIND,Src=/,dst=/h"], f"--mount=Type=BIND,Src=/,dst=/h {ROOT_BIND}{FIX}"),
    (["--mount", "type=glob,src=/*,dst=/h"], f"--mount type=glob,src=/*,dst=/h {KERNEL}"),
    # what exposes the engine, the host's namespaces, or the host through /proc and /sys
    (["--use-api-socket"], "--use-api-socket binds the engine's API socket (and its credentials) into the container: "
                           f"commands could drive the engine and start anything on this machine{FIX}"),
    (["-v", "/proc/1/root:/h"], f"-v /proc/1/root:/h {KERNEL}"),
    (["-v", "/sys:/s"], f"-v /sys:/s {KERNEL}"),
    (["--net", "host"], f"--net host {HOST_NET}{FIX}"),
    (["--network=ns:/proc/1/ns/net"], f"--network=ns:/proc/1/ns/net {HOST_NET}{FIX}"),
    (["--network", "slirp4netns:allow_host_loopback=true"], "--network slirp4netns:allow_host_loopback=true lets commands "
                                                            f"reach every service listening on this machine's loopback{FIX}"),
    (["--userns", "ns:/proc/1/ns/user"], "--userns ns:/proc/1/ns/user turns off user-namespace remapping"),
    (["--privileged=true"], "--privileged=true gives commands full access to the host's devices and kernel settings"),
    (["--env-host"], "--env-host copies miniswe's whole environment, API keys included, into the container"),
    (["--rootfs"], "--rootfs makes a directory of this machine the container's root"),
    (["--pod", "other"], "--pod other joins a pod whose namespaces miniswe cannot check"),
    (["--cap-add", "SYS_BOOT"], "--cap-add SYS_BOOT lets commands load a new kernel into the host (kexec_load)"),
    (["--security-opt", "unmask=ALL"], "--security-opt unmask=ALL unmasks /proc and /sys paths of the host's kernel"),
    (["--security-opt", "label=type:spc_t"], "--security-opt label=type:spc_t runs the commands under an SELinux type"),
    (["--seccomp-policy=image"], "--seccomp-policy=image takes the seccomp profile from the image"),
    (["--log-opt", "path=/root/.bashrc"], "--log-opt path=/root/.bashrc writes the commands' output to that file"),
    # seccomp profiles that let everything through, and ones that cannot be read
    (["--security-opt", "seccomp=allow.json"], "--security-opt seccomp=allow.json names a seccomp profile whose "
                                               f"defaultAction SCMP_ACT_ALLOW lets every unlisted call through, as unconfined does{FIX}"),
    (["--security-opt=seccomp:log.json"], "--security-opt=seccomp:log.json names a seccomp profile whose defaultAction SCMP_ACT_LOG"),
    (["--security-opt", "seccomp=missing.json"], "--security-opt seccomp=missing.json: cannot read the seccomp profile "
                                                 "(No such file or directory); give the path of a readable profile"),
    (["--security-opt", "seccomp=broken.json"], "--security-opt seccomp=broken.json: the seccomp profile is not valid JSON"),
    (["--security-opt", "seccomp=."], "--security-opt seccomp=.: cannot read the seccomp profile (Is a directory)"),
    # device cgroup rules, numbers as the engine reads them
    (["--device-cgroup-rule", "c 1:01 rwm"], f"--device-cgroup-rule c 1:01 rwm {MEMORY}{FIX}"),
    (["--device-cgroup-rule", "c 001:* rw"], f"--device-cgroup-rule c 001:* rw {MEMORY}{FIX}"),
    (["--device-cgroup-rule", "c *:1 rwm"], "--device-cgroup-rule c *:1 rwm lets commands use character devices of every "
                                            f"driver, the host's memory and consoles among them{FIX}"),
    (["--device-cgroup-rule", "a *:* rwm"], "--device-cgroup-rule a *:* rwm lets commands use every device of the host"),
    (["--device-cgroup-rule=b 8:0 r"], "--device-cgroup-rule=b 8:0 r gives commands raw access to the host's disks"),
    (["--device-cgroup-rule", "c one:1 rwm"], "--device-cgroup-rule c one:1 rwm cannot be read as 'TYPE MAJOR:MINOR ACCESS'"),
    (["--device", "/"], "--device / gives commands raw access to the host's disks"),
    # options miniswe does not know: it cannot tell what they reach, nor whether the next argument is their value
    (["--bogus-flag"], "--bogus-flag is not an option of `docker run` or `podman run` miniswe knows, so it cannot tell "
                       f"what it reaches (check its spelling){FIX}"),
    (["-Pz"], "-Pz is not an option of `docker run` or `podman run` miniswe knows"),
    (["--purge"], "--purge is set by miniswe (miniswe removes the container itself); remove it"),  # podman's --rm
    (["-Pv"], "-v needs a value (write [-v, VALUE] or -v=VALUE)"),
]


@pytest.mark.parametrize(("run_args", "line"), ATTACKS, ids=[" ".join(args) for args, _ in ATTACKS])
def test_what_reaches_the_host_is_refused_in_one_line(run_args, line):
    message = refusal(run_args)
    assert message.startswith(f"environment.run_args: {line}"), message
    assert SECRET not in message


@pytest.fixture
def shared():
    """A folder every user may enter (pytest's own are its owner's only)."""
    folder = Path(tempfile.mkdtemp(prefix="miniswe-runargs-"))
    folder.chmod(0o755)
    yield folder
    for path in folder.rglob("*"):
        path.chmod(0o755) if path.is_dir() and not path.is_symlink() else None
    shutil.rmtree(folder)


def without_root_reads() -> None:
    """In the child, before exec: root loses the capabilities that let it read every folder (as any user has none)."""
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        libc.prctl(24, capability, 0, 0, 0)  # PR_CAPBSET_DROP: gone at exec


def test_a_path_miniswe_cannot_resolve_is_refused_not_a_traceback(shared):
    """A folder miniswe may not read holds a link to /: the engine (root) would follow it; realpath would not."""
    (shared / "locked").mkdir()
    (shared / "locked" / "link").symlink_to("/")
    (shared / "locked").chmod(0o000)
    code = ("import sys\nfrom miniswe.environments.runargs import read_run_args\nfrom miniswe.errors import ConfigError\n"
            "try:\n    read_run_args(['-v', sys.argv[1]])\nexcept ConfigError as error:\n    print(error)\n    sys.exit(2)")
    checked = subprocess.run([sys.executable, "-c", code, f"{shared}/locked/link:/h"], capture_output=True, text=True,
                             cwd=shared, env=clean_env(), timeout=60, preexec_fn=without_root_reads)
    assert checked.returncode == 2, checked.stderr
    assert checked.stdout == (f"environment.run_args: -v {shared}/locked/link:/h cannot be checked ({shared}/locked/link: "
                              f"Permission denied){FIX}\n")


HARMLESS = [
    # grouped and attached -e forms: read by redaction.env_options, so recorded masked (tests/test_secrets.py)
    (["-Pe", f"API_TOKEN={SECRET}"], ["-P"], {"API_TOKEN": SECRET}),
    ([f"-PeAPI_TOKEN={SECRET}"], ["-P"], {"API_TOKEN": SECRET}),
    ([f"-eGITHUB_TOKEN={SECRET}"], [], {"GITHUB_TOKEN": SECRET}),
    (["-e", "FOO=bar"], [], {"FOO": "bar"}),
    (["-Pe", "FOO=bar"], ["-P"], {"FOO": "bar"}),  # the value leaves argv (and `ps`); the flag before it stays
    (["-qPe=FOO=bar", "-eBAZ=1"], ["-qP"], {"FOO": "bar", "BAZ": "1"}),
    (["-e", f"API_TOKEN={SECRET}"], [], {"API_TOKEN": SECRET}),  # recorded masked
    ([f"--env=API_TOKEN={SECRET}"], [], {"API_TOKEN": SECRET}),
    ([f"-e=API_TOKEN={SECRET}"], [], {"API_TOKEN": SECRET}),
    (["--cpus", "2"], ["--cpus", "2"], {}),
    (["-m1g", "-w/work", "-u", "1000", "--memory-swap", "-1"], ["-m1g", "-w/work", "-u", "1000", "--memory-swap", "-1"], {}),
    (["-Pq"], ["-Pq"], {}),
    (["-v", "./data:/data"], ["-v", "./data:/data"], {}),
    (["-v", "cache:/root/.cache"], ["-v", "cache:/root/.cache"], {}),
    (["--mount", "type=tmpfs,dst=/x"], ["--mount", "type=tmpfs,dst=/x"], {}),
    (["--mount", "type=volume,src=cache,dst=/c"], ["--mount", "type=volume,src=cache,dst=/c"], {}),
    (["--mount", "type=bind,src=./data,dst=/d,ro"], ["--mount", "type=bind,src=./data,dst=/d,ro"], {}),
    (["--privileged=false", "--rm=false"], ["--privileged=false", "--rm=false"], {}),
    (["--net=none"], ["--net=none"], {}),
    (["--network", "slirp4netns:allow_host_loopback=false"], ["--network", "slirp4netns:allow_host_loopback=false"], {}),
    (["--userns", "keep-id"], ["--userns", "keep-id"], {}),
    (["--security-opt", "seccomp=strict.json"], ["--security-opt", "seccomp=strict.json"], {}),
    (["--security-opt", "no-new-privileges"], ["--security-opt", "no-new-privileges"], {}),
    (["--cap-add", "NET_ADMIN"], ["--cap-add", "NET_ADMIN"], {}),
    (["--device-cgroup-rule", "c 10:229 rwm"], ["--device-cgroup-rule", "c 10:229 rwm"], {}),
    (["--device-cgroup-rule", "c 1:03 rwm"], ["--device-cgroup-rule", "c 1:03 rwm"], {}),  # /dev/null
    (["--device", "/dev/null:/dev/x"], ["--device", "/dev/null:/dev/x"], {}),
    (["--health-cmd", "--version"], ["--health-cmd", "--version"], {}),
]


@pytest.mark.parametrize(("run_args", "argv", "env"), HARMLESS, ids=[" ".join(args) for args, _, _ in HARMLESS])
def test_harmless_run_args_are_accepted(run_args, argv, env):
    read = read_run_args(run_args)
    assert (read.args, read.env, read.unsafe) == (argv, env, [])
    assert SECRET not in " ".join(read.args) and SECRET not in " ".join(mask_run_args(run_args))


def test_every_way_of_writing_a_secret_env_value_is_masked_in_the_record_or_refused():
    forms = [["-e", f"API_KEY={SECRET}"], ["--env", f"API_KEY={SECRET}"], [f"--env=API_KEY={SECRET}"],
             [f"-e=API_KEY={SECRET}"], [f"-eAPI_KEY={SECRET}"], ["-Pe", f"API_KEY={SECRET}"], [f"-Pe=API_KEY={SECRET}"],
             [f"-qPeAPI_KEY={SECRET}"], ["-qPe", f"API_KEY={SECRET}"]]  # fmt: skip
    for form in forms:
        try:
            read = read_run_args(form)
        except ConfigError as refused:
            assert SECRET not in str(refused) and "write it as [-e, API_KEY=...]" in str(refused)
            continue
        assert read.env == {"API_KEY": SECRET} and SECRET not in " ".join(read.args + mask_run_args(form)), form


def test_allowed_unsafe_arguments_pass_as_written_and_are_named():
    run_args = ["-Pv/:/h", "--mount", "type=volume,type=bind,src=/,dst=/h", "--use-api-socket", "--future-flag"]
    read = read_run_args(run_args, allow_unsafe=True)
    assert read.args == run_args
    assert read.unsafe == ["-Pv/:/h", "--mount type=volume,type=bind,src=/,dst=/h", "--use-api-socket", "--future-flag"]
    # what never runs, allowed or not: options miniswe sets itself, and a seccomp profile nobody can read
    assert "set by miniswe" in refusal(["-Pit"], allow_unsafe_run_args=True)
    assert "cannot read the seccomp profile" in refusal(["--security-opt", "seccomp=missing.json"], allow_unsafe_run_args=True)


def test_a_pod_shares_its_processes_so_the_sweep_is_off():
    assert read_run_args(["--pod", "p"], allow_unsafe=True).shares_pids
    assert not read_run_args(["--pid", "private"]).shares_pids


@pytest.mark.parametrize("exe", ["docker", "podman"])
def test_the_flag_tables_match_the_engine_client(exe, tmp_path):
    """Each engine's own parser (no engine needed): an option taking a value swallows the --help after it, one
    without a value leaves it to print the usage. Where the two would read an argument differently, a value could
    hide a flag from miniswe."""
    from miniswe.environments.runargs import FLAGS, SHORT, TAKES_VALUE

    if shutil.which(exe) is None:
        pytest.skip(f"no {exe} client")
    samples = [*sorted(FLAGS), *(f"-{letter}" for letter in SHORT), "--volume", "--mount", "--security-opt", "--device",
               "--device-cgroup-rule", "--network", "--pull", "--systemd", "--runtime", "--log-opt", "--pod", "--userns"]
    for option in samples:
        name = SHORT.get(option[1:], option)
        out = subprocess.run([exe, "run", option, "--help"], capture_output=True, text=True, cwd=tmp_path, timeout=60)
        said = out.stdout + out.stderr
        if "unknown flag" in said or "unknown shorthand flag" in said:
            continue  # the other engine's option
        printed_usage = "Options:" in out.stdout and "Error" not in said and "invalid" not in said
        assert (name in FLAGS) == printed_usage and (name in TAKES_VALUE) != printed_usage, (option, said[:300])


def test_a_grouped_flag_is_refused_by_miniswe_run_before_any_container(server, tmp_path):
    proc = subprocess.Popen(
        miniswe_cmd("run", "x", "--base-url", server.base_url, "-m", "test-model", "-o", str(tmp_path / "t.json"),
                    "--env", "docker", "--image", "miniswe-test:latest", "-q", "-c", "environment.run_args=[-Pv/:/h]"),
        cwd=tmp_path, env=clean_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    _, stderr = proc.communicate(timeout=60)
    lines = [line for line in stderr.strip().splitlines() if "left by dead miniswe runs" not in line]
    assert proc.returncode == 2, stderr
    assert lines == [f"miniswe: environment.run_args: -Pv/:/h {ROOT_BIND}{FIX}"], stderr
    assert server.requests == [] and not Path(tmp_path / "h").exists()
    if shutil.which("docker") and subprocess.run(["docker", "info"], capture_output=True, timeout=20).returncode == 0:
        listed = subprocess.run(["docker", "ps", "-a", "-q", "--filter", f"label=miniswe.pid={proc.pid}"],
                                capture_output=True, text=True, timeout=60)  # fmt: skip
        assert listed.returncode == 0 and listed.stdout.split() == []
