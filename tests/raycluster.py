"""A real Ray cluster for tests, inside a network namespace that holds nothing but loopback.

LoopbackNamespace starts `unshare -rn` (a new user and network namespace: root in it maps to whoever ran the
tests) with `lo` up; every process of a test that may touch a network (Ray's nodes, the scripted model server,
`miniswe batch`) is started inside it through `nsenter`, so nothing can leave the machine. Their TMPDIR is a
folder of the namespace's own (beside its HOME, reached through a short link in /tmp, as Ray's unix sockets live
below it and a socket's path may not exceed 107 bytes): the tasks' scratch folders there are this test's alone,
whatever else runs on the machine, and Ray's logs stay with the test's other files. At the end, every process in
that namespace is killed: they are all this test's.

TwoNodeCluster is a head and a second node joined with `ray start --address`, each with its own resources and
a NODE variable that the tasks' commands can echo, so a test can tell where each task ran.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import read_line

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

# What every Ray process of a test runs with: no usage report, a token of its own (never ~/.ray), and a
# node's death noticed within ~2 s instead of Ray's default ~30 s.
RAY_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_USAGE_STATS_PROMPT_ENABLED": "0",
    "RAY_USAGE_STATS_REPORT_URL": "http://127.0.0.1:9/",
    "RAY_enable_metrics_collection": "0",
    "RAY_AUTH_MODE": "token",
    "RAY_health_check_initial_delay_ms": "1000",
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_timeout_ms": "500",
    "RAY_health_check_failure_threshold": "3",
}


def unavailable() -> str | None:
    """Why a loopback-only namespace cannot be made here (None when it can)."""
    if not shutil.which("unshare") or not shutil.which("nsenter"):
        return "unshare/nsenter (util-linux) not found"
    probe = subprocess.run(["unshare", "-rn", "sh", "-c", "ip link set lo up || exit 7"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot create a loopback-only network namespace: {probe.stderr.strip() or probe.returncode}"
    return None


class LoopbackNamespace:
    def __init__(self, home: Path, *, second_interface: bool = False):
        """With `second_interface`, a veth pair (both ends inside) with a TEST-NET address and the default route
        through it: servers that bind all interfaces would listen there, and anything sent off this machine would
        go out there, counted in `sent_outside` (an ARP for the gateway at least), and reach nothing."""
        self.home = home
        home.mkdir(parents=True, exist_ok=True)
        self.tmp = short_link(home.parent / "tmp")  # TMPDIR inside
        script = "ip link set lo up"
        if second_interface:
            script += (" && ip link add mv0 type veth peer name mv1"
                       " && for i in mv0 mv1; do echo 1 > /proc/sys/net/ipv6/conf/$i/disable_ipv6; done"  # no router solicitations
                       " && ip addr add 192.0.2.1/24 dev mv0 && ip link set mv0 up && ip link set mv1 up"
                       " && ip route add default via 192.0.2.2")
        self.holder = subprocess.Popen(["unshare", "-rn", "sh", "-c", f"{script} && echo up && exec sleep 86400"],
                                       stdout=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
        assert read_line(self.holder.stdout, 60).strip() == "up", "the namespace did not come up"
        self.netns = os.readlink(f"/proc/{self.holder.pid}/ns/net")
        token = home / "ray_token"
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "MINISWE_", "RAY_"))}
        self.env.update(RAY_ENV, HOME=str(home), TMPDIR=str(self.tmp), RAY_AUTH_TOKEN_PATH=str(token),
                        PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))

    def argv(self, *args: str) -> list[str]:
        enter = ["-n"] if os.geteuid() == 0 else ["-U", "-n", "--preserve-credentials"]
        return ["nsenter", "-t", str(self.holder.pid), *enter, "--", *args]

    def popen(self, *args: str, env: dict[str, str] | None = None, **kwargs) -> subprocess.Popen:
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        return subprocess.Popen(self.argv(*args), env={**self.env, **(env or {})}, **kwargs)

    def run(self, *args: str, env: dict[str, str] | None = None, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        return subprocess.run(self.argv(*args), env={**self.env, **(env or {})}, timeout=timeout, capture_output=True,
                              text=True, **kwargs)

    def sent_outside(self) -> int:
        """Packets sent through the second interface so far."""
        for line in self.run("cat", "/proc/net/dev").stdout.splitlines():
            name, _, counters = line.partition(":")
            if name.strip() == "mv0":
                return int(counters.split()[9])
        raise AssertionError("no second interface in this namespace")

    def pids(self) -> list[int]:
        """Every process in the namespace (all of them this test's), the holder included."""
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if os.readlink(f"/proc/{entry}/ns/net") == self.netns:
                        found.append(int(entry))
                except OSError:
                    pass
        return found

    def close(self) -> None:
        for _ in range(3):
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.2)
        self.holder.wait(timeout=10)
        self.tmp.unlink()


def short_link(folder: Path) -> Path:
    """A new link /tmp/mr-XXXXXXXX to `folder` (made if missing)."""
    folder.mkdir(exist_ok=True)
    while True:
        link = Path("/tmp") / f"mr-{secrets.token_hex(4)}"
        try:
            link.symlink_to(folder)
            return link
        except FileExistsError:
            continue


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    ppid = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


class TwoNodeCluster:
    """`ray start --head` and one more node, in `ns`; each node's processes stay below its `ray start --block`."""

    def __init__(self, ns: LoopbackNamespace, tmp: Path, *, cpus: int = 2, port: int = 6380):
        self.ns, self.tmp, self.cpus = ns, tmp, cpus
        self.address = f"127.0.0.1:{port}"
        self.nodes: dict[str, subprocess.Popen] = {}
        # in the namespace's TMPDIR, by its short link: Ray's socket paths live below them
        self.start_node("head", "--head", f"--port={port}", "--include-dashboard=false", "--disable-usage-stats",
                        f"--temp-dir={ns.tmp / 'ray'}")
        self.start_worker()

    def start_worker(self) -> None:
        self.start_node("worker", f"--address={self.address}", f"--temp-dir={self.ns.tmp / 'ray-w'}")

    def start_node(self, name: str, *args: str) -> None:
        log = open(self.tmp / f"node-{name}.log", "w")
        self.nodes[name] = self.ns.popen(
            str(BIN / "ray"), "start", "--block", "--node-ip-address=127.0.0.1", f"--num-cpus={self.cpus}",
            f'--resources={{"node_{name}": 100}}', *args, env={"NODE": name}, stdout=log, stderr=subprocess.STDOUT)
        self.wait_for_nodes(len(self.nodes))

    def wait_for_nodes(self, count: int, timeout: float = 60) -> None:
        """Until `count` nodes are alive (`ray status` inside the namespace)."""
        deadline = time.monotonic() + timeout
        while True:
            probe = self.ns.run(str(BIN / "python"), "-c", ALIVE_NODES, self.address, timeout=60)
            if probe.returncode == 0 and probe.stdout.strip() == str(count):
                return
            assert time.monotonic() < deadline, f"{count} Ray node(s) not up: {probe.stdout} {probe.stderr[-2000:]}"
            time.sleep(0.5)

    def kill_node(self, name: str) -> list[int]:
        """SIGKILL the node's every process at once, as if its machine died; their pids."""
        pids = descendants(self.nodes[name].pid)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.nodes.pop(name).wait(timeout=10)
        return pids


ALIVE_NODES = """
import sys, logging, ray
ray.init(address=sys.argv[1], logging_level=logging.ERROR, log_to_driver=False)
print(sum(1 for n in ray.nodes() if n["Alive"]))
"""
