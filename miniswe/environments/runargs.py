"""Reading `environment.run_args` before the engine does: arguments that would let a run reach outside its
container (refused unless `allow_unsafe_run_args`), arguments miniswe sets itself, flags missing their
value, and `-e NAME=value` (taken out of argv, where every local user could read the value in `ps`)."""

from __future__ import annotations

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
        if arg.startswith("-e") and not arg.startswith("--") and len(arg) > 2:
            arg = "-e=" + arg[2:]  # -eNAME=value: a short option with its value attached
        name, eq, value = arg.partition("=")
        if name.startswith("-") and not name.startswith("--") and len(name) > 2 and not eq:
            shorts = [f"-{c}" for c in name[1:]]  # -it: flags written together
            if all(s in OWNED for s in shorts):
                _owned(shorts[0], arg)
        if name in OWNED and not (name == "--rm" and value.lower() == "false"):
            _owned(name, arg)
        shown = arg
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
        args.append(arg)
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
    if name in ("--ipc", "--userns") and lowered == "host":
        return f"shares the host's {name[2:]} namespace with the container's commands"
    if name == "--cap-add" and lowered.removeprefix("cap_") in ("all", "sys_admin"):
        return "gives commands nearly the powers of --privileged"
    if name in ("-v", "--volume", "--mount") and any(sock in value for sock in ENGINE_SOCKETS):
        return "hands the container engine to the commands, which could then start anything on this machine"
    return None


def _owned(name: str, arg: str) -> None:
    raise ConfigError(f"environment.run_args: {arg} is set by miniswe ({OWNED[name]}); remove it")
