"""Reading `environment.run_args` before the engine does: arguments that would let a run reach outside its
container (refused unless `allow_unsafe_run_args`), arguments miniswe sets itself, flags missing their
value, and `-e NAME=value` (taken out of argv, where every local user could read the value in `ps`)."""

from __future__ import annotations

import csv
import os
import stat
from dataclasses import dataclass, field

from miniswe.errors import ConfigError

# `docker run` / `podman run` options that take a value (as the next argument unless written --opt=value).
# Unknown options are read as flags without a value: at worst a value is looked at as an argument.
TAKES_VALUE = frozenset(
    """-a --attach --add-host --annotation --blkio-weight --blkio-weight-device --cap-add --cap-drop
    --cgroup-parent --cgroupns --cgroups --cidfile --cpu-period --cpu-quota --cpu-rt-period --cpu-rt-runtime
    -c --cpu-shares --cpus --cpuset-cpus --cpuset-mems --detach-keys --device --device-cgroup-rule
    --device-read-bps --device-read-iops --device-write-bps --device-write-iops --dns --dns-option
    --dns-search --domainname -e --env --entrypoint --env-file --expose --gpus --group-add --health-cmd
    --health-interval --health-retries --health-start-period --health-timeout -h --hostname --init-path
    --ip --ip6 --ipc --isolation --kernel-memory -l --label --label-file --link --link-local-ip
    --log-driver --log-opt --mac-address -m --memory --memory-reservation --memory-swap --memory-swappiness
    --mount --name --network --net --network-alias --net-alias --oom-score-adj --pid --pids-limit
    --platform -p --publish --pull --restart --runtime --security-opt --shm-size --stop-signal
    --stop-timeout --storage-opt --sysctl --tmpfs --ulimit -u --user --userns --uts -v --volume
    --volume-driver --volumes-from -w --workdir --arch --os --variant --secret --systemd --umask""".split()
)

# Set by miniswe to run its executor; given again they would break the stream or the cleanup.
OWNED = {
    "-d": "the container runs attached to miniswe", "--detach": "the container runs attached to miniswe",
    "-i": "miniswe attaches stdin itself", "--interactive": "miniswe attaches stdin itself",
    "-t": "a terminal would garble the executor's binary stream", "--tty": "a terminal would garble the executor's binary stream",
    "-a": "miniswe attaches the streams itself", "--attach": "miniswe attaches the streams itself",
    "--entrypoint": "the container's main process is miniswe's executor",
    "--init": "miniswe's executor is the container's init",
    "--name": "miniswe names the container after the run", "--rm": "miniswe removes the container itself",
}  # fmt: skip

ENGINE_SOCKETS = ("docker.sock", "podman.sock", "containerd.sock")
# Where engines listen by default; DOCKER_HOST / CONTAINER_HOST / XDG_RUNTIME_DIR add the one in use.
DEFAULT_SOCKETS = ("/var/run/docker.sock", "/run/docker.sock", "/run/podman/podman.sock",
                   "/run/containerd/containerd.sock")
SOCKET_DIRS = ("/var/run", "/run")  # the usual home of every daemon's socket

# --cap-add values that undo what keeps commands inside (names without CAP_, lower case).
CAPABILITIES = {
    "all": "gives commands every capability, nearly the powers of --privileged",
    "sys_admin": "gives commands nearly the powers of --privileged (mount, namespaces, ...)",
    "sys_ptrace": "lets commands ptrace miniswe's executor (PID 1) and read its memory and descriptors",
    "dac_read_search": "lets commands open files of the host by handle (open_by_handle_at), outside the container",
    "sys_module": "lets commands load modules into the host's kernel",
    "sys_rawio": "gives commands raw access to the host's devices and memory",
}
# --security-opt NAME=unconfined (or label=disable): the kernel-side confinement the executor relies on.
SECURITY_OPTS = {
    "seccomp": "turns off the seccomp filter that blocks the kernel calls a command could escape with",
    "apparmor": "turns off the AppArmor profile that confines the commands",
    "systempaths": "unmasks /proc and /sys paths of the host's kernel to the commands",
    "label": "turns off the SELinux labels that confine the commands",
}
# --NAME=host: the host's namespace shared with the commands.
HOST_NAMESPACES = {
    "--ipc": "shares the host's IPC namespace: commands could read and change other processes' shared memory",
    "--userns": "turns off user-namespace remapping: root in the container is root on this machine",
    "--uts": "shares the host's UTS namespace (hostname) with the commands",
    "--cgroupns": "shares the host's cgroup namespace: commands see and address the host's cgroup tree",
}


@dataclass(frozen=True)
class RunArgs:
    args: list[str]  # what goes to `docker run` (assignments taken out)
    env: dict[str, str] = field(default_factory=dict)  # -e NAME=value: set for every command instead
    forward: list[str] = field(default_factory=list)  # -e NAME: passed by name, like forward_env
    unsafe: list[str] = field(default_factory=list)  # arguments that reach outside the container
    shares_pids: bool = False  # --pid: the container's processes are not its own


def read_run_args(run_args: list[str], *, allow_unsafe: bool = False) -> RunArgs:
    """Check `run_args` (ConfigError naming the argument and the fix) and split off environment values."""
    args: list[str] = []
    env: dict[str, str] = {}
    forward: list[str] = []
    unsafe: list[str] = []
    shares_pids = False
    i = 0
    while i < len(run_args):
        arg = str(run_args[i])
        i += 1
        if not arg.startswith("-") or arg == "-":
            args.append(arg)  # a stray positional: the engine says what it took it for
            continue
        raw = arg
        if arg[:2] in ("-e", "-v") and not arg.startswith("--") and len(arg) > 2 and arg[2] != "=":
            arg = arg[:2] + "=" + arg[2:]  # -eNAME=value, -v/src:/dst: a short option with its value attached
        name, eq, value = arg.partition("=")
        if name.startswith("-") and not name.startswith("--") and len(name) > 2 and not eq:
            shorts = [f"-{c}" for c in name[1:]]  # -it: flags written together
            if all(s in OWNED for s in shorts):
                _owned(shorts[0], arg)
        if name in OWNED and not (name == "--rm" and value.lower() == "false"):
            _owned(name, arg)
        shown = raw
        if name in TAKES_VALUE and not eq:
            if i >= len(run_args) or (str(run_args[i]).startswith("--") and name not in ("--health-cmd",)):
                raise ConfigError(f"environment.run_args: {name} needs a value (write [{name}, VALUE] or {name}=VALUE)")
            value = str(run_args[i])
            i += 1
            shown = f"{name} {value}"
        if name in ("-e", "--env"):
            key, has_value, val = value.partition("=")
            if has_value:
                env[key] = val
            else:
                forward.append(key)
            continue
        risk = _risk(name, value, eq or name in TAKES_VALUE)
        if risk:
            unsafe.append(shown)
            if not allow_unsafe:
                raise ConfigError(
                    f"environment.run_args: {shown} {risk}; set environment.allow_unsafe_run_args: true if you mean it"
                )
        shares_pids = shares_pids or (name == "--pid" and value.lower() != "private")
        args.append(raw)
        if name in TAKES_VALUE and not eq:
            args.append(value)
    return RunArgs(args, env, forward, unsafe, shares_pids)


def _risk(name: str, value: str, has_value: bool) -> str | None:
    lowered = value.lower()
    if name == "--pid" and lowered != "private":
        return ("shares the PID namespace of the host or another container: commands and miniswe's cleanup "
                "after each step could signal processes outside this run")
    if name in ("--network", "--net") and lowered == "host":
        return "shares the host's network namespace: commands could reach every service listening on this machine"
    if name == "--privileged" and (not has_value or lowered not in ("false", "0")):
        return "gives commands full access to the host's devices and kernel settings"
    if name in HOST_NAMESPACES and lowered == "host":
        return HOST_NAMESPACES[name]
    if name == "--cap-add":
        for cap in lowered.replace(" ", "").split(","):
            why = CAPABILITIES.get(cap.removeprefix("cap_"))
            if why:
                return why
    if name == "--security-opt":
        key, _, setting = lowered.replace(":", "=", 1).partition("=")
        if key in SECURITY_OPTS and setting in ("unconfined", "disable"):
            return SECURITY_OPTS[key]
    if name in ("-v", "--volume"):
        source, bound, _ = value.partition(":")  # -v /path alone is an anonymous volume at that container path
        if bound and source.startswith((".", "/", "~")):  # else a named volume
            return _host_path_risk(source)
        return None
    if name == "--mount":
        return _mount_risk(value)
    if name == "--device":
        return _device_risk(value.partition(":")[0])
    if name == "--device-cgroup-rule":
        return _cgroup_rule_risk(lowered)
    if name == "--volumes-from":
        return ("mounts another container's volumes, which miniswe cannot check: they may hold the host's root or "
                "its engine socket")
    return None


RAW_DEVICES = ("/dev/mem", "/dev/kmem", "/dev/port")  # the host's memory and I/O ports: character devices 1:1, 1:2, 1:4
RAW_NUMBERS = ("*:*", "1:*", "1:1", "1:2", "1:4")


def _cgroup_rule_risk(rule: str) -> str | None:
    """--device-cgroup-rule 'TYPE MAJOR:MINOR ACCESS': a container may make device nodes (mknod is a default
    capability), so a rule is as good as the device: any (a) or block (b) device, or the memory ones."""
    kind, _, rest = rule.strip().strip("'\"").partition(" ")
    numbers = rest.split()[0] if rest.split() else "*:*"
    if kind in ("a", "b") or (kind == "c" and numbers in RAW_NUMBERS):
        return "lets commands create and use the host's disks or memory as devices, beneath every file permission"
    return None


def _device_risk(path: str) -> str | None:
    """--device PATH of the host's disks (any block device) or memory: commands could read and write the host
    beneath every file permission. Devices such as /dev/fuse or a GPU are fine."""
    resolved = os.path.realpath(path)
    try:
        block = stat.S_ISBLK(os.stat(resolved).st_mode)
    except OSError:
        block = False  # the engine says it does not exist
    if block or resolved in RAW_DEVICES:
        return "gives commands raw access to the host's disks or memory, beneath every file permission"
    return None


def _mount_risk(value: str) -> str | None:
    """--mount type=bind,source=PATH,... (src=, or a local volume bound to a device=PATH)."""
    try:
        fields = next(csv.reader([value]))
    except (csv.Error, StopIteration):
        fields = value.split(",")
    options = [field.partition("=") for field in fields]
    kind = next((v.strip().lower() for k, _, v in options if k.strip().lower() == "type"), "volume")
    for key, _, path in options:
        key = key.strip().lower()
        if (kind == "bind" and key in ("source", "src")) or (key == "volume-opt" and path.startswith("device=")):
            risk = _host_path_risk(path.removeprefix("device=") if key == "volume-opt" else path)
            if risk:
                return risk
    return None


def engine_sockets() -> list[str]:
    """Paths of the engine sockets on this machine: the defaults, and the ones the environment points to."""
    found = list(DEFAULT_SOCKETS)
    for variable in ("DOCKER_HOST", "CONTAINER_HOST"):
        address = os.environ.get(variable, "")
        if address.startswith("unix://"):
            found.append(address.removeprefix("unix://"))
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        found += [os.path.join(runtime, "docker.sock"), os.path.join(runtime, "podman", "podman.sock")]
    return found


def _host_path_risk(source: str) -> str | None:
    """Why binding the host path `source` hands the machine to the commands: the root, or a folder that
    holds an engine's socket (or the socket itself). Relative paths as the engine's client reads them."""
    if source.startswith("~"):
        source = os.path.expanduser(source)
    literal = os.path.normpath(os.path.join(os.getcwd(), source))
    paths = {literal, os.path.realpath(literal)}
    if "/" in paths:
        return "binds the host's root directory into the container: commands could read and change anything on this machine"
    sockets = engine_sockets()
    homes = {os.path.dirname(sock) for sock in sockets} | set(SOCKET_DIRS)
    homes |= {os.path.realpath(home) for home in homes}
    sockets_resolved = set(sockets) | {os.path.realpath(sock) for sock in sockets}
    for path in paths:
        inside = path + "/"
        if (path in sockets_resolved or any(sock in os.path.basename(path) for sock in ENGINE_SOCKETS)
                or any(home == path or home.startswith(inside) for home in homes)):
            return ("binds the host's container engine socket (or a folder holding it) into the container: commands "
                    "could drive the engine and start anything on this machine")
    return None


def _owned(name: str, arg: str) -> None:
    raise ConfigError(f"environment.run_args: {arg} is set by miniswe ({OWNED[name]}); remove it")
