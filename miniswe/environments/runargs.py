"""Reading `environment.run_args` before the engine does, the way it does (pflag: `-Pv/:/h` is `-P -v /:/h`):
arguments that would let a run reach outside its container (refused unless `allow_unsafe_run_args`),
options miniswe does not know (it cannot tell what they reach), arguments miniswe sets itself, flags missing
their value, and `-e NAME=value` (taken out of argv, where every local user could read the value in `ps`)."""

from __future__ import annotations

import csv
import glob
import json
import os
import re
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from miniswe.errors import ConfigError
from miniswe.redaction import MASK, mask_run_args, secret_name

# The short options of `docker run` and `podman run` (the same letters in both), by the long name they stand for.
SHORT = {"a": "--attach", "c": "--cpu-shares", "d": "--detach", "e": "--env", "h": "--hostname", "i": "--interactive",
         "l": "--label", "m": "--memory", "p": "--publish", "P": "--publish-all", "q": "--quiet", "t": "--tty",
         "u": "--user", "v": "--volume", "w": "--workdir"}  # fmt: skip
# Other names the engines accept for an option (docker's hidden ones, podman's normalised ones).
ALIASES = {"--net": "--network", "--net-alias": "--network-alias", "--dns-opt": "--dns-option", "--purge": "--rm",
           "--healthcheck-command": "--health-cmd", "--healthcheck-interval": "--health-interval",
           "--healthcheck-retries": "--health-retries", "--healthcheck-start-period": "--health-start-period",
           "--healthcheck-timeout": "--health-timeout", "--override-arch": "--arch", "--override-os": "--os",
           "--override-variant": "--variant", "--namespace": "--ns"}  # fmt: skip
# Options without a value (`--flag=false` gives one): the next argument is the engine's next option.
# Docker 28 and podman 4-5 `run`, podman's global options included (they apply to `podman run` too).
FLAGS = frozenset(
    """--detach --disable-content-trust --env-host --help --http-proxy --init --interactive --no-healthcheck
    --no-hostname --no-hosts --oom-kill-disable --passwd --privileged --publish-all --quiet --read-only
    --read-only-tmpfs --replace --rm --rmi --rootfs --sig-proxy --syslog --tls-verify --trace --tty
    --unsetenv-all --use-api-socket""".split()
)
# Options that take a value: the next argument, unless written --opt=value (-ovalue, -o=value for short ones).
TAKES_VALUE = frozenset(
    """--add-host --annotation --arch --attach --authfile --blkio-weight --blkio-weight-device --cap-add
    --cap-drop --cgroup-conf --cgroup-manager --cgroup-parent --cgroupns --cgroups --chrootdirs --cidfile --conmon
    --conmon-pidfile --cpu-count --cpu-percent --cpu-period --cpu-quota --cpu-rt-period --cpu-rt-runtime
    --cpu-shares --cpus --cpuset-cpus --cpuset-mems --decryption-key --detach-keys --device --device-cgroup-rule
    --device-read-bps --device-read-iops --device-write-bps --device-write-iops --dns --dns-option --dns-search
    --domainname --entrypoint --env --env-file --env-merge --events-backend --expose --gidmap --gpus --group-add
    --group-entry --health-cmd --health-interval --health-log-destination --health-max-log-count
    --health-max-log-size --health-on-failure --health-retries --health-start-interval --health-start-period
    --health-startup-cmd --health-startup-interval --health-startup-retries --health-startup-success
    --health-startup-timeout --health-timeout --hooks-dir --hostname --hosts-file --hostuser --image-volume
    --init-path --io-maxbandwidth --io-maxiops --ip --ip6 --ipc --isolation --kernel-memory --label --label-file
    --link --link-local-ip --log-driver --log-level --log-opt --mac-address --memory --memory-reservation
    --memory-swap --memory-swappiness --mount --name --network --network-alias --network-cmd-path
    --network-config-dir --ns --oom-score-adj --os --passwd-entry --personality --pid --pidfile --pids-limit
    --platform --pod --pod-id-file --preserve-fd --preserve-fds --publish --pull --rdt-class --requires --restart
    --retry --retry-delay --root --runroot --runtime --runtime-flag --sdnotify --seccomp-policy --secret
    --security-opt --shm-size --shm-size-systemd --signature-policy --stop-signal --stop-timeout --storage-driver
    --storage-opt --subgidname --subuidname --sysctl --systemd --timeout --tmpdir --tmpfs --tz --uidmap --ulimit
    --umask --unsetenv --user --userns --uts --variant --volume --volume-driver --volumepath --volumes-from
    --workdir""".split()
)
FALSE = ("0", "f", "F", "false", "FALSE", "False")  # what the engine's flag parser reads as false

# Set by miniswe to run its executor; given again they would break the stream or the cleanup.
OWNED = {
    "--detach": "the container runs attached to miniswe",
    "--interactive": "miniswe attaches stdin itself",
    "--tty": "a terminal would garble the executor's binary stream",
    "--attach": "miniswe attaches the streams itself",
    "--entrypoint": "the container's main process is miniswe's executor",
    "--init": "miniswe's executor is the container's init",
    "--name": "miniswe names the container after the run", "--rm": "miniswe removes the container itself",
}  # fmt: skip

ENGINE_SOCKETS = ("docker.sock", "podman.sock", "containerd.sock")
# Where engines listen by default; DOCKER_HOST / CONTAINER_HOST / XDG_RUNTIME_DIR add the one in use.
DEFAULT_SOCKETS = ("/var/run/docker.sock", "/run/docker.sock", "/run/podman/podman.sock",
                   "/run/containerd/containerd.sock")
SOCKET_DIRS = ("/var/run", "/run")  # the usual home of every daemon's socket
KERNEL_DIRS = ("/proc", "/sys")  # the host's: /proc/1/root is its root, core_pattern runs a program on it

# --cap-add values that undo what keeps commands inside (names without CAP_, lower case).
CAPABILITIES = {
    "all": "gives commands every capability, nearly the powers of --privileged",
    "sys_admin": "gives commands nearly the powers of --privileged (mount, namespaces, ...)",
    "sys_ptrace": "lets commands ptrace miniswe's executor (PID 1) and read its memory and descriptors",
    "dac_read_search": "lets commands open files of the host by handle (open_by_handle_at), outside the container",
    "sys_module": "lets commands load modules into the host's kernel",
    "sys_rawio": "gives commands raw access to the host's devices and memory",
    "sys_boot": "lets commands load a new kernel into the host (kexec_load)",
    "sys_time": "lets commands set the host's clock",
    "mac_admin": "lets commands change the host's AppArmor or SELinux policy",
    "mac_override": "lets commands override the host's AppArmor or SELinux policy",
    "bpf": "lets commands load BPF programs into the host's kernel",
    "perfmon": "lets commands trace the host's kernel and every process on it",
    "syslog": "lets commands read the host kernel's log and addresses",
}
# --security-opt NAME=unconfined (or label=disable): the kernel-side confinement the executor relies on.
SECURITY_OPTS = {
    "seccomp": "turns off the seccomp filter that blocks the kernel calls a command could escape with",
    "apparmor": "turns off the AppArmor profile that confines the commands",
    "systempaths": "unmasks /proc and /sys paths of the host's kernel to the commands",
    "unmask": "unmasks /proc and /sys paths of the host's kernel to the commands",
    "label": "turns off the SELinux labels that confine the commands",
}
# seccomp default actions that stop a call; any other lets every call not listed through.
SECCOMP_STOPS = ("SCMP_ACT_KILL", "SCMP_ACT_KILL_PROCESS", "SCMP_ACT_KILL_THREAD", "SCMP_ACT_TRAP", "SCMP_ACT_ERRNO")
# --NAME=host (or podman's ns:PATH): the host's namespace shared with the commands.
HOST_NAMESPACES = {
    "--ipc": "shares the host's IPC namespace: commands could read and change other processes' shared memory",
    "--userns": "turns off user-namespace remapping: root in the container is root on this machine",
    "--uts": "shares the host's UTS namespace (hostname) with the commands",
    "--cgroupns": "shares the host's cgroup namespace: commands see and address the host's cgroup tree",
    "--network": "shares the host's network namespace: commands could reach every service listening on this machine",
}
LOOPBACK_RISK = "lets commands reach every service listening on this machine's loopback"
# Options that reach outside whatever their value (unless a flag's value is false).
ALWAYS = {
    "--privileged": "gives commands full access to the host's devices and kernel settings",
    "--use-api-socket": ("binds the engine's API socket (and its credentials) into the container: commands could "
                         "drive the engine and start anything on this machine"),
    "--env-host": "copies miniswe's whole environment, API keys included, into the container",
    "--rootfs": "makes a directory of this machine the container's root: commands change it in place",
    "--volumes-from": ("mounts another container's volumes, which miniswe cannot check: they may hold the host's root "
                       "or its engine socket"),
    "--pod": "joins a pod whose namespaces miniswe cannot check: they may be the host's",
    "--pod-id-file": "joins a pod whose namespaces miniswe cannot check: they may be the host's",
}  # fmt: skip
PID_RISK = ("shares the PID namespace of the host or another container: commands and miniswe's cleanup after each "
            "step could signal processes outside this run")
ROOT_RISK = "binds the host's root directory into the container: commands could read and change anything on this machine"
KERNEL_RISK = ("binds the host's /proc or /sys into the container: through them commands could reach the host's root "
               "and run programs on it")
SOCKET_RISK = ("binds the host's container engine socket (or a folder holding it) into the container: commands could "
               "drive the engine and start anything on this machine")
DISK_RISK = "gives commands raw access to the host's disks, beneath every file permission"


@dataclass(frozen=True)
class RunArgs:
    args: list[str]  # what goes to `docker run` (assignments taken out)
    env: dict[str, str] = field(default_factory=dict)  # -e NAME=value: set for every command instead
    forward: list[str] = field(default_factory=list)  # -e NAME: passed by name, like forward_env
    unsafe: list[str] = field(default_factory=list)  # arguments that reach outside the container
    shares_pids: bool = False  # --pid (or a pod): the container's processes are not its own


@dataclass(frozen=True)
class Option:
    name: str  # the engine's long name (--volume for -v, --network for --net); as written if unknown
    value: str | None  # None: a flag written without one
    letter: str = ""  # its short letter, when written in a group (-Pv)


@dataclass(frozen=True)
class Argument:
    """One argument of run_args as the engine reads it, with the next one when that is its value."""

    start: int  # its index in run_args
    tokens: list[str]
    options: list[Option]  # none: a positional argument

    @property
    def shown(self) -> str:
        """As written, the value of a secret-looking -e NAME=value masked."""
        shown = " ".join(self.tokens)
        for option in self.options:
            key, has_value, val = (option.value or "").partition("=")
            if option.name == "--env" and has_value and val and secret_name(key):
                shown = shown.replace(f"{key}={val}", f"{key}={MASK}")
        return shown


def parse(run_args: list[str]) -> Iterator[Argument]:
    """`run_args` read as pflag reads `docker run`'s: `--opt=value`, `--opt value`, `-ovalue`, `-o value`, `-o=value`,
    and a group of short flags without value (`-Pq`) that may end in one with a value (`-Pv/:/h`, `-Pv /:/h`)."""
    i = 0
    while i < len(run_args):
        start, arg = i, str(run_args[i])
        i += 1
        if not arg.startswith("-") or arg in ("-", "--"):
            yield Argument(start, [arg], [])  # a stray positional: the engine says what it took it for
            continue
        options: list[Option] = []
        if arg.startswith("--"):
            name, eq, value = arg.partition("=")
            name = ALIASES.get(name, name)
            rests = [(name, "", eq + value)]
        else:
            rests = []
            for k, letter in enumerate(arg[1:], 1):
                rests.append((SHORT.get(letter, f"-{letter}"), letter, arg[k + 1:]))
                if letter not in SHORT or SHORT[letter] in TAKES_VALUE or arg[k + 1:].startswith("="):
                    break  # an unknown letter ends the engine's reading; a value takes the rest of the argument
        tokens = [arg]
        for name, letter, rest in rests:
            if letter and len(rest) > 1 and rest[0] == "=" or not letter and rest:
                value: str | None = rest[1:]  # -o=value, --opt=value
            elif name not in TAKES_VALUE:
                value = None
            elif letter and rest:
                value = rest  # -ovalue
            elif i < len(run_args) and not (str(run_args[i]).startswith("--") and name != "--health-cmd"):
                value = str(run_args[i])
                tokens.append(value)
                i += 1
            else:
                shown = f"-{letter}" if letter else name
                raise ConfigError(f"environment.run_args: {shown} needs a value (write [{shown}, VALUE] or {shown}=VALUE)")
            options.append(Option(name, value, letter))
        yield Argument(start, tokens, options)


def read_run_args(run_args: list[str], *, allow_unsafe: bool = False) -> RunArgs:
    """Check `run_args` (ConfigError naming the argument and the fix) and split off environment values."""
    args: list[str] = []
    env: dict[str, str] = {}
    forward: list[str] = []
    unsafe: list[str] = []
    shares_pids = False
    recorded = mask_run_args([str(arg) for arg in run_args])  # as the trajectory records them
    for argument in parse(run_args):
        kept = []  # the options that stay in argv
        for option in argument.options:
            if option.name in OWNED and not (option.name == "--rm" and option.value in FALSE):
                raise ConfigError(f"environment.run_args: {argument.shown} is set by miniswe ({OWNED[option.name]}); remove it")
            if option.name == "--env":
                key, has_value, val = (option.value or "").partition("=")
                last = argument.start + len(argument.tokens) - 1
                if has_value and val and secret_name(key) and recorded[last] == str(run_args[last]):
                    raise ConfigError(f"environment.run_args: {argument.shown} would be recorded with its value unmasked; "
                                      f"write it as [-e, {key}=...]")  # fmt: skip
                if has_value:
                    env[key] = val
                else:
                    forward.append(key)
                continue
            risk = _judge(option)
            if risk:
                unsafe.append(argument.shown)
                if not allow_unsafe:
                    raise ConfigError(f"environment.run_args: {argument.shown} {risk}; "
                                      "set environment.allow_unsafe_run_args: true if you mean it")  # fmt: skip
            shares_pids = shares_pids or option.name in ("--pod", "--pod-id-file") or (
                option.name == "--pid" and (option.value or "").lower() != "private")
            kept.append(option)
        if len(kept) == len(argument.options):
            args += argument.tokens
        elif kept:  # flags grouped before an -e (-Pe NAME=value): only flags without value come before it
            args.append("-" + "".join(option.letter for option in kept))
    return RunArgs(args, env, forward, list(dict.fromkeys(unsafe)), shares_pids)


def _judge(option: Option) -> str | None:
    """Why `option` reaches outside the container; every OSError met on the way is a refusal too."""
    try:
        return _risk(option.name, option.value)
    except OSError as error:
        where = f"{error.filename}: " if error.filename else ""
        return f"cannot be checked ({where}{error.strerror or error})"


def _risk(name: str, value: str | None) -> str | None:
    if name not in FLAGS and name not in TAKES_VALUE:
        return ("is not an option of `docker run` or `podman run` miniswe knows, so it cannot tell what it reaches "
                "(check its spelling)")
    if name in FLAGS:
        return ALWAYS.get(name) if value not in FALSE else None
    value = value or ""
    lowered = value.lower()
    if name in ALWAYS:
        return ALWAYS[name]
    if name == "--pid":
        return PID_RISK if lowered != "private" else None
    if name in HOST_NAMESPACES and (lowered == "host" or lowered.startswith("ns:")):
        return HOST_NAMESPACES[name]  # ns:PATH: podman joins the namespace at that path, the host's if /proc/1/ns/...
    if name == "--network" and ({"allow_host_loopback=true", "--map-gw"} & set(re.split(r"[:,]", lowered))):
        return LOOPBACK_RISK  # slirp4netns:allow_host_loopback=true, pasta:--map-gw
    if name == "--cap-add":
        caps = [cap.removeprefix("cap_") for cap in lowered.replace(" ", "").split(",")]
        return next((CAPABILITIES[cap] for cap in caps if cap in CAPABILITIES), None)
    if name == "--security-opt":
        return _security_opt_risk(value)
    if name == "--seccomp-policy" and lowered == "image":
        return "takes the seccomp profile from the image, which may confine nothing"
    if name == "--log-opt" and lowered.startswith("path="):
        return "writes the commands' output to that file of this machine, whatever it is"
    if name == "--volume":
        source, bound, _ = value.partition(":")  # -v /path alone is an anonymous volume at that container path
        return _host_path_risk(source) if bound and source.startswith((".", "/", "~")) else None  # else a named volume
    if name == "--mount":
        return _mount_risk(value)
    if name == "--device":
        return _device_risk(value.partition(":")[0])
    if name == "--device-cgroup-rule":
        return _cgroup_rule_risk(value)
    return None


def _security_opt_risk(value: str) -> str | None:
    """As the engine's client reads it: KEY=VALUE, or the older KEY:VALUE."""
    key, eq, setting = value.partition("=")
    if not eq:
        key, _, setting = value.partition(":")
    key, lowered = key.lower(), setting.lower()
    if key in SECURITY_OPTS and lowered in ("unconfined", "disable") or key == "unmask" and setting:
        return SECURITY_OPTS[key]
    if key == "label" and lowered.replace(" ", "") in ("type:spc_t", "type:unconfined_t"):
        return "runs the commands under an SELinux type that confines nothing"
    if key == "seccomp" and setting and lowered != "builtin":
        return _seccomp_risk(value, setting)
    return None


def _seccomp_risk(value: str, path: str) -> str | None:
    """--security-opt seccomp=FILE: a profile that lets every call through is as open as seccomp=unconfined."""
    try:
        with open(path, encoding="utf-8") as file:
            profile = json.load(file)
    except OSError as error:
        raise ConfigError(f"environment.run_args: --security-opt {value}: cannot read the seccomp profile "
                          f"({error.strerror or error}); give the path of a readable profile") from None
    except ValueError as error:
        raise ConfigError(f"environment.run_args: --security-opt {value}: the seccomp profile is not valid JSON "
                          f"({error}); give the path of a seccomp profile") from None
    if not isinstance(profile, dict):
        raise ConfigError(f"environment.run_args: --security-opt {value}: not a seccomp profile (a JSON object with "
                          "a defaultAction); give the path of a seccomp profile")
    action = profile.get("defaultAction")
    if action not in SECCOMP_STOPS:
        return f"names a seccomp profile whose defaultAction {action} lets every unlisted call through, as unconfined does"
    return None


# Character devices (major, minors; None: any) of the host's memory and I/O ports, its virtual consoles and
# their screens, and its keyboards and mice.
RAW_CHARACTERS = {1: {1, 2, 4}, 4: set(range(64)), 7: None, 13: None}
RAW_DEVICES = ("/dev/mem", "/dev/kmem", "/dev/port")  # by name too: 1:1, 1:2, 1:4
RAW_RISK = "gives commands raw access to the host's memory, consoles or input devices, beneath every file permission"


def _numbers_risk(kind: str, major: int | None, minor: int | None) -> str | None:
    """Devices of `kind` (a, b or c) and numbers (None: any): a container may make device nodes (mknod is a
    default capability), so a rule is as good as the device."""
    if kind in ("a", "b"):
        return DISK_RISK if kind == "b" else "lets commands use every device of the host, its disks and memory included"
    if major is None:
        return "lets commands use character devices of every driver, the host's memory and consoles among them"
    minors = RAW_CHARACTERS.get(major, set())
    return RAW_RISK if minors is None or (minors and (minor is None or minor in minors)) else None


def _cgroup_rule_risk(rule: str) -> str | None:
    """--device-cgroup-rule 'TYPE MAJOR:MINOR ACCESS', numbers as the engine reads them: 01 is 1, * any."""
    words = rule.strip().strip("'\"").split()
    numbers = re.fullmatch(r"(\d+|\*):(\d+|\*)", words[1], re.ASCII) if len(words) > 1 else None
    if not words or words[0] not in ("a", "b", "c") or (words[0] != "a" and not numbers):
        return "cannot be read as 'TYPE MAJOR:MINOR ACCESS', so miniswe cannot tell which devices it opens"
    major, minor = (None if n == "*" else int(n) for n in numbers.groups()) if numbers else (None, None)
    return _numbers_risk(words[0], major, minor)


def _device_risk(path: str) -> str | None:
    """--device PATH (every device under it, for a folder) of the host's disks (any block device), memory,
    consoles or input devices. Devices such as /dev/fuse or a GPU are fine."""
    resolved = _resolve(path)
    if resolved in RAW_DEVICES:
        return RAW_RISK
    if "/dev".startswith(resolved.rstrip("/") + "/"):
        return DISK_RISK  # a folder holding /dev (/): every device of the host
    nodes: Iterable[str] = [resolved]
    if os.path.isdir(resolved):
        nodes = (os.path.join(folder, name) for folder, _, names in os.walk(resolved, onerror=_raise) for name in names)
    for node in nodes:
        try:
            mode = os.stat(node)
        except FileNotFoundError:
            continue  # the engine says it does not exist
        kind = "b" if stat.S_ISBLK(mode.st_mode) else "c" if stat.S_ISCHR(mode.st_mode) else ""
        risk = kind and _numbers_risk(kind, os.major(mode.st_rdev), os.minor(mode.st_rdev))
        if risk:
            return risk
    return None


def _mount_risk(value: str) -> str | None:
    """--mount as both engines read it: csv fields, keys in any case; docker takes the last type=, podman the first,
    so a bind (or podman's glob) in either is judged. Every source that names a host path is judged, and a local
    volume's device=PATH."""
    try:
        fields = next(csv.reader([value]))
    except (csv.Error, StopIteration):
        fields = value.split(",")
    options = [(key.lower(), val) for key, _, val in (part.partition("=") for part in fields)]
    binds = any(key == "type" and val.lower() in ("bind", "glob") for key, val in options)
    for key, val in options:
        path = val.partition("=")[2] if key == "volume-opt" and val.partition("=")[0] == "device" else None
        if key in ("source", "src") and (binds or val.startswith((".", "/", "~"))):
            path = val
        risk = path is not None and _glob_risk(path)
        if risk:
            return risk
    return None


def _glob_risk(pattern: str) -> str | None:
    """A source, and for podman's type=glob every path of this machine it matches."""
    magic = re.search(r"[*?[]", pattern)
    matches = sorted(glob.glob(os.path.expanduser(pattern), include_hidden=True)) if magic else []
    return next(filter(None, map(_host_path_risk, [pattern, *matches])), None)


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
    """Why binding the host path `source` hands the machine to the commands: the root, /proc or /sys, or a
    folder that holds an engine's socket (or the socket itself). Relative paths as the engine's client reads them."""
    if source.startswith("~"):
        source = os.path.expanduser(source)
    literal = "/" + os.path.normpath(os.path.join(os.getcwd(), source)).lstrip("/")  # //x is /x
    # the name as given first: resolving it may fail (/proc/1/root), and what it names is refused anyway
    risk = _top_risk(literal) or _top_risk(resolved := _resolve(literal))
    if risk:
        return risk
    paths = {literal, resolved}
    sockets = engine_sockets()
    homes = {os.path.dirname(sock) for sock in sockets} | set(SOCKET_DIRS)
    homes |= {os.path.realpath(home) for home in homes}
    sockets_resolved = set(sockets) | {os.path.realpath(sock) for sock in sockets}
    for path in paths:
        inside = path + "/"
        if (path in sockets_resolved or any(sock in os.path.basename(path) for sock in ENGINE_SOCKETS)
                or any(home == path or home.startswith(inside) for home in homes)):
            return SOCKET_RISK
    return None


def _top_risk(path: str) -> str | None:
    if path == "/":
        return ROOT_RISK
    return KERNEL_RISK if any(path == top or path.startswith(top + "/") for top in KERNEL_DIRS) else None


def _resolve(path: str) -> str:
    """The path the engine binds: links followed, each OSError raised (realpath would hide one, say a folder
    miniswe may not read, leaving a link to / in it unresolved), except missing parts, which -v creates."""
    try:
        return os.path.realpath(path, strict=True)
    except FileNotFoundError:
        if os.path.islink(path):  # dangling: where it points
            return _resolve(os.path.join(os.path.dirname(path), os.readlink(path)))
        head, tail = os.path.split(path)
        return path if head == path else os.path.join(_resolve(head), tail)


def _raise(error: OSError) -> None:
    raise error
